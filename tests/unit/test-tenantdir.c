/* SPDX-License-Identifier: MIT */
/* test-tenantdir.c: the daemon's side of same-tenant handoffs (daemon/tenantdir.c) over a
 * real pool under /dev/shm, a real quota ledger and a real registry, with the real memfds
 * it makes: each test maps a connection's directory and ledger as its client would and
 * takes, gives and lies through them with proto/ledger.c. A buffer whose last daemon
 * reference goes while a ledger of its uid that was sent its fd counts a hold is LENT
 * (charged, out of the pool, its entry LENT) until a nudge, a forget, a disconnect or the
 * end finds every such count at 0; no other count keeps it. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uv.h>

#include "core-fixture.h"
#include "core-hold.h"
#include "ledger.h"
#include "tenantdir.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

struct fx {
    uv_loop_t loop;
    struct core core;
    struct counters counters;
    struct tenantdirs td;
};

static void fx_open(struct fx *f)
{
    memset(f, 0, sizeof(*f));
    core_open(&f->core, &f->loop, "tenantdir", 64 * MiB, 16 * MiB);
    tenantdir_init(&f->td, f->core.reg, f->core.pool, &f->counters);
}

static void fx_close(struct fx *f)
{
    tenantdir_free(&f->td); /* after every connection: LENT buffers end before the registry */
    cr_assert_eq(registry_stats(f->core.reg).lent, 0);
    cr_assert_eq(quota_total(f->core.quota), 0, "a charge outlived every buffer");
    core_close(&f->core, &f->loop);
}

/* A connection as its session and its client see it: the session's fd-once set, the
 * module's conn, and the client's read-write mappings of its directory and ledger. */
struct conn {
    uint32_t uid;
    struct idset known;
    struct tenantdir_conn c;
    int dir_fd;                  /* the module's own: not closed here */
    void *dir;
    _Atomic uint32_t *counts;
};

static void conn_join(struct fx *f, struct conn *k, uint32_t uid)
{
    int fds[2] = { -1, -1 };
    memset(k, 0, sizeof(*k));
    k->uid = uid;
    int r = tenantdir_join(&f->td, uid, &k->known, &k->c, fds);
    cr_assert_eq(r, 0, "tenantdir_join: %s", strerror(-r));
    cr_assert_geq(fds[0], 0);
    cr_assert_geq(fds[1], 0);
    k->dir_fd = fds[0];
    k->dir = mmap(NULL, LEDGER_DIR_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    cr_assert_neq(k->dir, MAP_FAILED, "mapping the directory: %s", strerror(errno));
    cr_assert_eq(ledger_dir_check(k->dir, LEDGER_DIR_SIZE), 0);
    k->counts = mmap(NULL, LEDGER_COUNTS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
    cr_assert_neq(k->counts, MAP_FAILED, "mapping the ledger: %s", strerror(errno));
    close(fds[1]); /* the caller's, once sent */
}

static void conn_leave(struct fx *f, struct conn *k)
{
    tenantdir_leave(&f->td, &k->c);
    cr_assert_null(k->c.dir);
    if (k->dir)
        munmap(k->dir, LEDGER_DIR_SIZE);
    if (k->counts)
        munmap((void *)k->counts, LEDGER_COUNTS_SIZE);
    k->dir = NULL;
    k->counts = NULL;
    idset_free(&k->known);
}

/* conn_sent: the session sent b's fd to this connection (fd-once), as fd_to_send. */
static void conn_sent(struct conn *k, const struct registry_buf *b, bool writable)
{
    cr_assert_eq(idset_add(&k->known, b->pb->id << 1 | (writable ? 1 : 0), 1024), 0);
}

/* conn_forget: the client said it forgot b (PROTO_OP_FORGET), as the session does it. */
static void conn_forget(struct fx *f, struct conn *k, const struct registry_buf *b, bool writable)
{
    idset_del(&k->known, b->pb->id << 1 | (writable ? 1 : 0));
    tenantdir_forgot(&f->td, &k->c, b->pb->id);
}

/* lease: a buffer of uid, its class charged, held writable by holder (core_hold); its
 * slot one a ledger has. */
static struct registry_buf *lease(struct fx *f, uint32_t uid, uint64_t size, struct registry_holder *holder,
                                  uint64_t *ret_handle)
{
    struct registry_buf *b = core_hold(&f->core, &f->loop, uid, size, holder, ret_handle);
    cr_assert_lt(b->pb->slot, LEDGER_SLOTS);
    return b;
}

/* publish: the producer on connection k publishes b at size, in the daemon and in its
 * directory (the client writes the entry before it sends the publish). */
static void publish(struct fx *f, struct conn *k, struct registry_buf *b, uint64_t size)
{
    cr_assert_eq(registry_publish(f->core.reg, b, size, 0, (const uint8_t *)"f8", 2), 0);
    cr_assert_eq(ledger_publish(k->dir, b->pb->slot, b->pb->id, b->token, size, "f8", 2), 0);
}

/* take: the consumer on connection k takes b in its ledger, without the daemon. */
static int take(struct conn *k, const struct registry_buf *b, uint64_t size)
{
    uint8_t meta[LEDGER_META_MAX];
    uint32_t meta_len = 0;
    int r = ledger_take(k->dir, k->counts, b->pb->slot, b->token, size, b->pb->id, meta, &meta_len);
    if (r == 0)
        cr_assert(meta_len == 2 && memcmp(meta, "f8", 2) == 0, "the entry's metadata");
    return r;
}

static uint32_t entry_state(struct conn *k, uint32_t slot)
{
    return atomic_load(&ledger_entry_at(k->dir, slot)->state);
}

/* ---- files -------------------------------------------------------------------------- */

static void assert_sealed(int fd, size_t size)
{
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    cr_assert_eq((size_t)st.st_size, size);
    int seals = fcntl(fd, F_GET_SEALS);
    cr_assert_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL,
                 "seals %#x", seals);
    cr_assert_eq(ftruncate(fd, (off_t)size / 2), -1, "a client could shrink it under the daemon's mapping");
    cr_assert_eq(errno, EPERM);
    cr_assert_eq(ftruncate(fd, (off_t)size * 2), -1);
    cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1, "a client could add a write seal");
}

/* A directory per uid (made at its first ledger connection, shared by its later ones,
 * with its own random key) and a ledger per connection, both sealed against resizing; the
 * daemon reads the ledger the client writes. The directory goes with its uid's last. */
Test(tenantdir, join_sends_sealed_files_a_directory_per_uid)
{
    struct fx f;
    fx_open(&f);
    int fds[3][2];
    struct idset known[3] = { { 0 } };
    struct tenantdir_conn c[3];
    const uint32_t uids[3] = { 1000, 1000, 1001 };
    for (int i = 0; i < 3; i++)
        cr_assert_eq(tenantdir_join(&f.td, uids[i], &known[i], &c[i], fds[i]), 0);
    cr_assert_eq(f.td.st.dirs, 2);
    cr_assert_eq(f.td.st.ledgers, 3);
    cr_assert_eq(fds[0][0], fds[1][0], "two connections of one uid got two directories");
    cr_assert_neq(fds[0][0], fds[2][0], "two uids share a directory");
    for (int i = 0; i < 3; i++) {
        assert_sealed(fds[i][0], LEDGER_DIR_SIZE);
        assert_sealed(fds[i][1], LEDGER_COUNTS_SIZE);
        for (int j = 0; j < i; j++)
            cr_assert_neq(fds[i][1], fds[j][1]);
    }
    const struct ledger_header *h[2];
    h[0] = mmap(NULL, LEDGER_HEADER, PROT_READ, MAP_SHARED, fds[0][0], 0);
    h[1] = mmap(NULL, LEDGER_HEADER, PROT_READ, MAP_SHARED, fds[2][0], 0);
    cr_assert(h[0] != MAP_FAILED && h[1] != MAP_FAILED);
    cr_assert_eq(h[0]->magic, LEDGER_MAGIC);
    cr_assert_eq(h[0]->uid, 1000);
    cr_assert_eq(h[1]->uid, 1001);
    cr_assert_neq(memcmp(h[0]->key, h[1]->key, 16), 0, "two uids' directories share a key");
    munmap((void *)h[0], LEDGER_HEADER);
    munmap((void *)h[1], LEDGER_HEADER);

    /* the daemon's read-only mapping of a ledger is the client's file */
    _Atomic uint32_t *counts = mmap(NULL, LEDGER_COUNTS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1][1], 0);
    cr_assert_neq(counts, MAP_FAILED);
    atomic_store(&counts[77], 5);
    cr_assert_eq(ledger_held(c[1].counts, 77), 5);
    cr_assert_eq(ledger_held(c[0].counts, 77), 0, "one connection's count shows in another's ledger");
    munmap((void *)counts, LEDGER_COUNTS_SIZE);
    for (int i = 0; i < 3; i++)
        close(fds[i][1]);

    tenantdir_leave(&f.td, &c[0]);
    cr_assert_eq(f.td.st.dirs, 2, "the directory went with one of its uid's two connections");
    cr_assert_eq(f.td.st.ledgers, 2);
    tenantdir_leave(&f.td, &c[1]);
    cr_assert_eq(f.td.st.dirs, 1);
    tenantdir_leave(&f.td, &c[2]);
    cr_assert_eq(f.td.st.dirs, 0);
    cr_assert_eq(f.td.st.ledgers, 0);
    tenantdir_leave(&f.td, &c[2]); /* a conn without a ledger: accepted */
    fx_close(&f);
}

/* ---- the recycle handshake ---------------------------------------------------------- */

struct scene {
    struct conn prod, cons;
    struct registry_holder holder;  /* the producer's daemon handles */
    uint64_t handle;
    struct registry_buf *b;         /* freed once it ends: its slot is kept */
    uint32_t slot;
    uint64_t csize;
};

/* scene_hand: the producer leases a buffer (5000 bytes, held in s->holder) and publishes
 * it; the consumer was sent its read-only fd (it maps it) and takes the publish in its
 * ledger. */
static struct registry_buf *scene_hand(struct fx *f, struct scene *s, uint64_t *ret_handle)
{
    struct registry_buf *b = lease(f, 1000, 5000, &s->holder, ret_handle);
    conn_sent(&s->prod, b, true);
    publish(f, &s->prod, b, 5000);
    conn_sent(&s->cons, b, false);
    cr_assert_eq(take(&s->cons, b, 5000), 0, "a consumer that maps it could not take the publish");
    cr_assert_eq(entry_state(&s->cons, b->pb->slot), LEDGER_PUBLISHED);
    return b;
}

/* scene_open: a producer and a consumer of uid 1000 with ledgers, and b handed from one to
 * the other (scene_hand). */
static void scene_open(struct fx *f, struct scene *s)
{
    memset(s, 0, sizeof(*s));
    conn_join(f, &s->prod, 1000);
    conn_join(f, &s->cons, 1000);
    s->b = scene_hand(f, s, &s->handle);
    s->csize = s->b->pb->size;
    s->slot = s->b->pb->slot;
}

/* scene_release: the producer's last daemon handle goes. */
static void scene_release(struct fx *f, struct scene *s)
{
    cr_assert_eq(registry_release(f->core.reg, &s->holder, s->handle), 0);
}

/* assert_lent: b is LENT: charged, out of the pool, not found, its entry LENT. */
static void assert_lent(struct fx *f, struct scene *s)
{
    cr_assert_eq(tenantdir_lent(&f->td), 1);
    cr_assert(s->b->lent);
    cr_assert_eq(entry_state(&s->cons, s->slot), LEDGER_LENT);
    cr_assert_eq(quota_total(f->core.quota), s->csize, "a LENT buffer's charge went back");
    cr_assert_eq(pool_bytes_warm(f->core.pool), 0, "a LENT buffer went back to the pool");
    cr_assert_null(registry_find(f->core.reg, s->b->token), "a LENT buffer is found");
}

/* scene_lent: scene_open, then the producer's last daemon handle goes while the
 * consumer's take holds b: LENT. */
static void scene_lent(struct fx *f, struct scene *s)
{
    scene_open(f, s);
    scene_release(f, s);
    assert_lent(f, s);
}

/* assert_ended: the buffer ended: credited, warm for its tenant, its entry FREE as k's
 * mapping of the directory reads it. */
static void assert_ended(struct fx *f, struct scene *s, struct conn *k)
{
    cr_assert_eq(tenantdir_lent(&f->td), 0, "a LENT buffer did not end");
    cr_assert_eq(registry_stats(f->core.reg).buffers, 0);
    cr_assert_eq(quota_total(f->core.quota), 0);
    cr_assert_eq(pool_bytes_warm(f->core.pool), s->csize);
    cr_assert_eq(entry_state(k, s->slot), LEDGER_FREE, "the entry stayed LENT");
}

static void scene_close(struct fx *f, struct scene *s)
{
    registry_release_all(f->core.reg, &s->holder);
    conn_leave(f, &s->cons);
    conn_leave(f, &s->prod);
}

/* A hold in a ledger keeps the buffer LENT when its last daemon reference goes; a nudge
 * while it is still held changes nothing; the give, then a nudge, ends it. */
Test(tenantdir, a_ledger_hold_keeps_it_lent_until_given)
{
    struct fx f;
    struct scene s;
    fx_open(&f);
    scene_lent(&f, &s);
    cr_assert_eq(f.td.st.recycle_waits, 1);

    tenantdir_nudge(&f.td, &s.cons.c, s.b->pb->id);
    cr_assert_eq(f.td.st.nudges, 1);
    assert_lent(&f, &s);
    cr_assert_eq(take(&s.cons, s.b, 5000), -EAGAIN, "a LENT entry was taken");

    cr_assert(ledger_give(s.cons.dir, s.cons.counts, s.b->pb->slot), "the give did not see LENT");
    tenantdir_nudge(&f.td, &s.cons.c, s.b->pb->id);
    cr_assert_eq(f.td.st.nudges, 2);
    assert_ended(&f, &s, &s.prod);
    scene_close(&f, &s);
    fx_close(&f);
}

/* No hold: the buffer ends at once, as without ledgers, and its entry is FREE again. */
Test(tenantdir, no_hold_ends_at_once)
{
    struct fx f;
    struct scene s;
    fx_open(&f);
    scene_open(&f, &s);
    cr_assert_not(ledger_give(s.cons.dir, s.cons.counts, s.b->pb->slot));
    scene_release(&f, &s);
    assert_ended(&f, &s, &s.prod);
    cr_assert_eq(f.td.st.recycle_waits, 0);
    scene_close(&f, &s);
    fx_close(&f);
}

/* Only a count of a ledger of the buffer's uid that was sent its fd, on its slot, keeps
 * it: a connection that does not map it, another uid's ledger, or a count on another
 * slot, keeps nothing. */
Test(tenantdir, counts_that_keep_nothing)
{
    struct fx f;
    struct scene s;
    struct conn liar, other;
    fx_open(&f);
    scene_open(&f, &s);
    cr_assert_not(ledger_give(s.cons.dir, s.cons.counts, s.b->pb->slot));
    uint32_t slot = s.b->pb->slot;
    conn_join(&f, &liar, 1000);            /* never sent b's fd */
    atomic_store(&liar.counts[slot], 3);
    conn_join(&f, &other, 1001);           /* another uid, sent b's fd */
    conn_sent(&other, s.b, false);
    atomic_store(&other.counts[slot], 3);
    atomic_store(&s.cons.counts[(slot + 1) % LEDGER_SLOTS], 9); /* it maps b, counts another slot */
    cr_assert_not(tenantdir_holds(&f.td, &liar.c));
    cr_assert_not(tenantdir_holds(&f.td, &other.c));
    scene_release(&f, &s);
    assert_ended(&f, &s, &s.prod);
    cr_assert_eq(f.td.st.recycle_waits, 0);
    conn_leave(&f, &liar);
    conn_leave(&f, &other);
    scene_close(&f, &s);
    fx_close(&f);
}

/* A connection that ends is read no more: a LENT buffer it held ends with it, though other
 * connections of its uid stay. One that never knew the buffer leaving changes nothing;
 * neither does the producer's (count 0) while the consumer still holds it. The directory
 * goes with the last connection. */
Test(tenantdir, leave_rechecks_what_it_knew)
{
    struct fx f;
    struct scene s;
    struct conn idle[2];
    fx_open(&f);
    scene_open(&f, &s);
    conn_join(&f, &idle[0], 1000);
    conn_join(&f, &idle[1], 1000);
    scene_release(&f, &s);
    assert_lent(&f, &s);
    conn_leave(&f, &idle[0]);
    assert_lent(&f, &s);
    conn_leave(&f, &s.prod);
    assert_lent(&f, &s);
    /* the consumer's process died holding it: its ledger goes with its connection */
    tenantdir_leave(&f.td, &s.cons.c);
    cr_assert_eq(f.td.st.dirs, 1, "idle[1] is still joined");
    assert_ended(&f, &s, &idle[1]); /* though the only ledger that held it went */
    conn_leave(&f, &idle[1]);
    cr_assert_eq(f.td.st.dirs, 0);
    conn_leave(&f, &s.cons);
    registry_release_all(f.core.reg, &s.holder);
    fx_close(&f);
}

/* The last connection of a uid leaving ends every LENT buffer of its directory, whoever
 * held it. */
Test(tenantdir, last_leave_ends_every_lent_buffer)
{
    struct fx f;
    struct scene s;
    fx_open(&f);
    scene_lent(&f, &s);
    conn_leave(&f, &s.prod);
    assert_lent(&f, &s);
    tenantdir_leave(&f.td, &s.cons.c);
    cr_assert_eq(f.td.st.dirs, 0);
    assert_ended(&f, &s, &s.cons); /* the client's mapping outlives the directory */
    conn_leave(&f, &s.cons);
    registry_release_all(f.core.reg, &s.holder);
    fx_close(&f);
}

/* A nudge reads again only the LENT buffer it names, and only for a connection of that
 * buffer's uid: another uid's nudge of its id, or a nudge of an id that is not LENT,
 * ends nothing. */
Test(tenantdir, nudge_ends_only_its_own_uids_buffer)
{
    struct fx f;
    struct scene s;
    struct conn stranger;
    fx_open(&f);
    scene_open(&f, &s);
    /* a second buffer, published and taken by the same consumer */
    uint64_t h2;
    struct registry_buf *b2 = scene_hand(&f, &s, &h2);
    uint64_t id2 = b2->pb->id;
    uint32_t slot2 = b2->pb->slot;
    conn_join(&f, &stranger, 1001);
    conn_sent(&stranger, s.b, false);

    scene_release(&f, &s);
    cr_assert_eq(registry_release(f.core.reg, &s.holder, h2), 0);
    cr_assert_eq(tenantdir_lent(&f.td), 2);
    cr_assert_eq(entry_state(&s.cons, slot2), LEDGER_LENT);

    /* both counts dropped; only the named buffer is read again */
    cr_assert(ledger_give(s.cons.dir, s.cons.counts, s.slot));
    cr_assert(ledger_give(s.cons.dir, s.cons.counts, slot2));
    tenantdir_nudge(&f.td, &stranger.c, s.b->pb->id);
    cr_assert_eq(tenantdir_lent(&f.td), 2, "another uid's nudge ended a LENT buffer");
    tenantdir_nudge(&f.td, &s.cons.c, id2 + 1000); /* no such buffer */
    cr_assert_eq(tenantdir_lent(&f.td), 2);
    tenantdir_nudge(&f.td, &s.cons.c, id2);
    cr_assert_eq(tenantdir_lent(&f.td), 1);
    cr_assert_eq(entry_state(&s.cons, slot2), LEDGER_FREE);
    cr_assert_eq(entry_state(&s.cons, s.slot), LEDGER_LENT, "a nudge of one buffer ended another");
    cr_assert(s.b->lent);
    tenantdir_nudge(&f.td, &s.prod.c, s.b->pb->id); /* any connection of the uid may nudge */
    cr_assert_eq(tenantdir_lent(&f.td), 0);
    cr_assert_eq(registry_stats(f.core.reg).buffers, 0);
    cr_assert_eq(quota_total(f.core.quota), 0);
    cr_assert_eq(pool_bytes_warm(f.core.pool), 2 * s.csize);
    cr_assert_eq(entry_state(&s.cons, s.slot), LEDGER_FREE);
    conn_leave(&f, &stranger);
    scene_close(&f, &s);
    fx_close(&f);
}

/* A forget of a LENT buffer by the connection holding it: its count is read no more. */
Test(tenantdir, forget_ends_a_lent_buffer)
{
    struct fx f;
    struct scene s;
    fx_open(&f);
    scene_lent(&f, &s);
    conn_forget(&f, &s.prod, s.b, true); /* the producer, whose count is 0: still held */
    assert_lent(&f, &s);
    conn_forget(&f, &s.cons, s.b, false);
    assert_ended(&f, &s, &s.prod);
    scene_close(&f, &s);
    fx_close(&f);
}

/* A daemon acquire of a LENT buffer revives it: off the lender's list, its entry FREE (local
 * takes fall back), findable again. The hold counted meanwhile is still read when it
 * ends again. */
Test(tenantdir, revived_then_lent_again)
{
    struct fx f;
    struct scene s;
    fx_open(&f);
    scene_lent(&f, &s);
    struct registry_buf *b = registry_revive(f.core.reg, s.b->token);
    cr_assert_eq(b, s.b);
    cr_assert_not(b->lent);
    cr_assert_eq(tenantdir_lent(&f.td), 0);
    cr_assert_eq(entry_state(&s.cons, s.slot), LEDGER_FREE);
    cr_assert_eq(registry_find(f.core.reg, b->token), b);
    tenantdir_nudge(&f.td, &s.cons.c, b->pb->id); /* not LENT: nothing to do */
    cr_assert_eq(registry_stats(f.core.reg).buffers, 1);

    /* a third connection's daemon acquire, then its release: LENT again (the count is 1) */
    struct registry_holder h = { 0 };
    uint64_t handle;
    cr_assert_eq(registry_hold(f.core.reg, &h, b, false, &handle), 0);
    cr_assert_eq(registry_release(f.core.reg, &h, handle), 0);
    assert_lent(&f, &s);
    cr_assert_eq(f.td.st.recycle_waits, 2);
    cr_assert(ledger_give(s.cons.dir, s.cons.counts, b->pb->slot));
    tenantdir_nudge(&f.td, &s.cons.c, b->pb->id);
    assert_ended(&f, &s, &s.prod);
    registry_release_all(f.core.reg, &h);
    scene_close(&f, &s);
    fx_close(&f);
}

/* The daemon's end: every LENT buffer ends, connections still joined are let go, and the
 * registry has no lender any more. */
Test(tenantdir, free_ends_every_lent_buffer)
{
    struct fx f;
    struct scene s;
    fx_open(&f);
    scene_lent(&f, &s);
    tenantdir_free(&f.td);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0);
    cr_assert_eq(registry_stats(f.core.reg).buffers, 0);
    cr_assert_eq(quota_total(f.core.quota), 0);
    cr_assert_eq(pool_bytes_warm(f.core.pool), s.csize);
    cr_assert_null(s.cons.c.dir);
    cr_assert_null(s.prod.c.dir);
    cr_assert_eq(entry_state(&s.cons, s.slot), LEDGER_FREE);

    /* no lender: the consumer's count (still 1 in its own mapping) keeps nothing now */
    struct registry_holder h = { 0 };
    uint64_t handle;
    struct registry_buf *b = lease(&f, 1000, 5000, &h, &handle);
    cr_assert_eq(b->pb->slot, s.slot, "the warm buffer, same slot");
    cr_assert_eq(registry_release(f.core.reg, &h, handle), 0);
    cr_assert_eq(registry_stats(f.core.reg).buffers, 0);
    registry_release_all(f.core.reg, &h);
    scene_close(&f, &s);
    fx_close(&f);
}

/* ---- TOOK and idleness -------------------------------------------------------------- */

/* TOOK counts an acquire only of the live buffer of the connection's uid with that id and
 * token, and only from a connection sent its fd; before the publish too (it can overtake
 * the producer's publish). Anything else is ignored, and counted as such. */
Test(tenantdir, took_counts_only_the_right_buffer)
{
    struct fx f;
    struct conn prod, cons, stranger, other, none;
    struct registry_holder h = { 0 };
    uint64_t h1, h2;
    fx_open(&f);
    conn_join(&f, &prod, 1000);
    conn_join(&f, &cons, 1000);
    conn_join(&f, &stranger, 1000);
    conn_join(&f, &other, 1001);
    memset(&none, 0, sizeof(none)); /* a connection without a ledger */
    struct registry_buf *b = lease(&f, 1000, 5000, &h, &h1);
    struct registry_buf *b2 = lease(&f, 1000, 5000, &h, &h2);
    conn_sent(&cons, b, false);
    conn_sent(&cons, b2, false);
    conn_sent(&other, b, false);

    /* before the publish: counted */
    tenantdir_took(&f.td, &cons.c, b->pb->id, b->token);
    cr_assert_eq(f.counters.acquires, 1);
    cr_assert_eq(b->acquires, 1);
    cr_assert_eq(f.td.st.took, 1);
    publish(&f, &prod, b, 5000);
    tenantdir_took(&f.td, &cons.c, b->pb->id, b->token);
    cr_assert_eq(f.counters.acquires, 2);
    cr_assert_eq(b->acquires, 2);
    cr_assert_eq(f.td.st.took, 2);
    cr_assert_eq(f.td.st.ignored, 0);

    uint8_t wrong[PROTO_TOKEN_LEN];
    memcpy(wrong, b->token, sizeof(wrong));
    wrong[PROTO_TOKEN_LEN - 1] ^= 1;
    tenantdir_took(&f.td, &cons.c, b->pb->id, wrong);         /* a wrong token */
    tenantdir_took(&f.td, &cons.c, b2->pb->id, b->token);     /* b's token, b2's id */
    tenantdir_took(&f.td, &stranger.c, b->pb->id, b->token);  /* not sent b's fd */
    tenantdir_took(&f.td, &other.c, b->pb->id, b->token);     /* another uid, sent b's fd */
    tenantdir_took(&f.td, &none.c, b->pb->id, b->token);      /* no ledger */
    cr_assert_eq(f.td.st.ignored, 5);
    cr_assert_eq(f.td.st.took, 2);
    cr_assert_eq(f.counters.acquires, 2);
    cr_assert_eq(b->acquires, 2);
    cr_assert_eq(b2->acquires, 0);

    uint64_t id = b->pb->id;
    memcpy(wrong, b->token, sizeof(wrong));
    registry_release_all(f.core.reg, &h);
    /* a buffer that is gone: ignored */
    tenantdir_took(&f.td, &cons.c, id, wrong);
    cr_assert_eq(f.td.st.ignored, 6);
    conn_leave(&f, &prod);
    conn_leave(&f, &cons);
    conn_leave(&f, &stranger);
    conn_leave(&f, &other);
    fx_close(&f);
}

/* A connection holds buffers (so is not idle) while its ledger counts a hold on a buffer
 * of its uid it maps; counts on what it does not map do not count. */
Test(tenantdir, holds_reads_the_counts_it_maps)
{
    struct fx f;
    struct scene s;
    struct tenantdir_conn none = { 0 };
    fx_open(&f);
    scene_open(&f, &s);
    cr_assert(tenantdir_holds(&f.td, &s.cons.c), "its take is not seen");
    cr_assert_not(tenantdir_holds(&f.td, &s.prod.c), "the producer holds nothing in its ledger");
    cr_assert_not(tenantdir_holds(&f.td, &none));
    cr_assert_not(ledger_give(s.cons.dir, s.cons.counts, s.b->pb->slot));
    cr_assert_not(tenantdir_holds(&f.td, &s.cons.c), "a given hold still counts");

    /* a count on a buffer it does not map */
    struct registry_holder h = { 0 };
    uint64_t handle;
    struct registry_buf *b2 = lease(&f, 1000, 5000, &h, &handle);
    atomic_store(&s.cons.counts[b2->pb->slot], 1);
    cr_assert_not(tenantdir_holds(&f.td, &s.cons.c), "a count on a buffer it was never sent");
    conn_sent(&s.cons, b2, false);
    cr_assert(tenantdir_holds(&f.td, &s.cons.c));
    atomic_store(&s.cons.counts[b2->pb->slot], 0);
    registry_release_all(f.core.reg, &h);
    scene_close(&f, &s);
    fx_close(&f);
}
