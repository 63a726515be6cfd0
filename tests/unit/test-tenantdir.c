/* SPDX-License-Identifier: MIT */
/* test-tenantdir.c: the daemon's side of same-tenant handoffs (daemon/tenantdir.c, the
 * table of issue 28) over a real pool under /dev/shm, a real quota ledger and a real
 * registry, with the real memfds it makes. Each test maps a connection's table and journal
 * as its client would and leases, publishes, takes, gives and scribbles through them with
 * proto/handoff.c, while the test process plays the daemon (registry, lender). Every
 * assertion reads a real state: the entry's word on the client's own mapping, registry
 * stats (lent, buffers), quota_total, the pool's warm bytes and counters, tenantdir's st. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uv.h>

#include "core-fixture.h"
#include "core-hold.h"
#include "handoff.h"
#include "tenantdir.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)
#define TABLE_BYTES HANDOFF_TABLE_SIZE
#define T HANDOFF_TRIES

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
    tenantdir_check(&f->td); /* aborts on a disagreement (a test build) */
    tenantdir_free(&f->td); /* after every connection: LENT buffers end before the registry */
    cr_assert_eq(registry_stats(f->core.reg).lent, 0);
    cr_assert_eq(registry_stats(f->core.reg).buffers, 0, "a buffer outlived every holder");
    cr_assert_eq(quota_total(f->core.quota), 0, "a charge outlived every buffer");
    core_close(&f->core, &f->loop);
}

/* A connection as its session and its client see it: the module's conn, and the client's
 * read-write mappings of the uid's table and of its own journal. */
struct conn {
    uint32_t uid;
    struct tenantdir_conn c;
    int tab_fd; /* the module's own: not closed here */
    void *tab;
    _Atomic uint32_t *journal;
};

static void conn_join(struct fx *f, struct conn *k, uint32_t uid)
{
    int fds[2] = { -1, -1 };
    memset(k, 0, sizeof(*k));
    k->uid = uid;
    int r = tenantdir_join(&f->td, uid, &k->c, fds);
    cr_assert_eq(r, 0, "tenantdir_join: %s", strerror(-r));
    cr_assert_geq(fds[0], 0);
    cr_assert_geq(fds[1], 0);
    k->tab_fd = fds[0];
    k->tab = mmap(NULL, TABLE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    cr_assert_neq(k->tab, MAP_FAILED, "mapping the table: %s", strerror(errno));
    cr_assert_eq(handoff_check(k->tab, TABLE_BYTES), 0);
    k->journal = mmap(NULL, HANDOFF_JOURNAL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
    cr_assert_neq(k->journal, MAP_FAILED, "mapping the journal: %s", strerror(errno));
    close(fds[1]); /* the caller's, once sent */
}

/* conn_leave: the session ends; the client's mappings stay (unmapped by conn_unmap). */
static void conn_leave(struct fx *f, struct conn *k)
{
    tenantdir_check(&f->td);
    tenantdir_leave(&f->td, &k->c);
    tenantdir_check(&f->td);
    cr_assert_null(k->c.dir);
}

static void conn_unmap(struct conn *k)
{
    if (k->tab)
        munmap(k->tab, TABLE_BYTES);
    if (k->journal)
        munmap((void *)k->journal, HANDOFF_JOURNAL_SIZE);
    k->tab = NULL;
    k->journal = NULL;
}

static void conn_end(struct fx *f, struct conn *k)
{
    conn_leave(f, k);
    conn_unmap(k);
}

static uint64_t word(struct conn *k, uint32_t slot)
{
    return atomic_load(&handoff_entry_at(k->tab, slot)->word);
}

static struct handoff_header *hdr(struct conn *k)
{
    return k->tab;
}

#define assert_word(k, slot, state, count, flags)                                                                 \
    do {                                                                                                          \
        uint64_t w_ = word((k), (slot));                                                                          \
        cr_assert_eq(handoff_state_of(w_), (state), "slot %u state %u", (unsigned)(slot), handoff_state_of(w_)); \
        cr_assert_eq(handoff_count_of(w_), (count), "slot %u count %u", (unsigned)(slot), handoff_count_of(w_)); \
        cr_assert_eq(handoff_flags_of(w_), (flags), "slot %u flags %#x", (unsigned)(slot), handoff_flags_of(w_)); \
    } while (0)

/* lease: a buffer of uid leased for the table (PROTO_LEASE_TABLE), charged and held
 * writable by holder (core_hold). */
static struct registry_buf *lease(struct fx *f, uint32_t uid, uint64_t size, bool for_table,
                                  struct registry_holder *holder, uint64_t *ret_handle)
{
    struct registry_buf *b = core_hold(&f->core, &f->loop, uid, size, holder, ret_handle);
    cr_assert_lt(b->pb->slot, HANDOFF_MAX_SLOTS);
    b->for_table = for_table;
    return b;
}

/* granted: a buffer of uid leased for the table and released: it joined the table. */
static struct registry_buf *granted(struct fx *f, uint32_t uid, uint64_t size)
{
    struct registry_holder h = { 0 };
    uint64_t hd;
    struct registry_buf *b = lease(f, uid, size, true, &h, &hd);
    cr_assert_eq(registry_release(f->core.reg, &h, hd), 0);
    registry_release_all(f->core.reg, &h);
    cr_assert(b->lent && b->table, "not granted");
    return b;
}

/* client_publish: the client of k leases a buffer of class cls in its table, writes the
 * metadata and publishes it under a fresh token naming its slot. */
static uint32_t client_publish(struct conn *k, uint32_t cls, uint64_t size, uint8_t token[PROTO_TOKEN_LEN],
                               uint32_t *ret_seq)
{
    uint32_t slot, seq;
    cr_assert_eq(handoff_lease(k->tab, k->journal, cls, T, &slot, &seq), 0, "the client's lease");
    cr_assert_eq(getrandom(token, PROTO_TOKEN_LEN, 0), (ssize_t)PROTO_TOKEN_LEN);
    handoff_set_slot(token, slot);
    struct handoff_meta *m = handoff_meta_at(k->tab, slot);
    memcpy(m->data, "f8", 2);
    atomic_store(&m->len, 2);
    cr_assert_eq(handoff_publish(k->tab, slot, seq, handoff_siphash(hdr(k)->key, token, PROTO_TOKEN_LEN), size), 0);
    if (ret_seq)
        *ret_seq = seq;
    return slot;
}

static uint64_t tokhash(struct conn *k, const uint8_t *token)
{
    return handoff_siphash(hdr(k)->key, token, PROTO_TOKEN_LEN);
}

/* ---- 1: files ----------------------------------------------------------------------- */

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

/* A table per uid (made at its first connection, shared by its later ones, with its own
 * key) and a journal per connection, both sealed against resizing; the table is closed
 * and freed with its uid's last connection. */
Test(tenantdir, join_makes_sealed_table_per_uid_and_journal_per_conn)
{
    struct fx f;
    fx_open(&f);
    int fds[3][2];
    struct tenantdir_conn c[3];
    const uint32_t uids[3] = { 1000, 1000, 1001 };
    for (int i = 0; i < 3; i++)
        cr_assert_eq(tenantdir_join(&f.td, uids[i], &c[i], fds[i]), 0);
    cr_assert_eq(f.td.st.tables, 2);
    cr_assert_eq(f.td.st.journals, 3);
    cr_assert_eq(fds[0][0], fds[1][0], "two connections of one uid got two tables");
    cr_assert_neq(fds[0][0], fds[2][0], "two uids share a table");
    for (int i = 0; i < 3; i++) {
        assert_sealed(fds[i][0], TABLE_BYTES);
        assert_sealed(fds[i][1], HANDOFF_JOURNAL_SIZE);
        for (int j = 0; j < i; j++)
            cr_assert_neq(fds[i][1], fds[j][1]);
    }
    void *tab[2];
    tab[0] = mmap(NULL, TABLE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0][0], 0);
    tab[1] = mmap(NULL, TABLE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[2][0], 0);
    cr_assert(tab[0] != MAP_FAILED && tab[1] != MAP_FAILED);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(handoff_check(tab[i], TABLE_BYTES), 0);
        cr_assert_eq(((struct handoff_header *)tab[i])->nslots, HANDOFF_MAX_SLOTS);
        cr_assert_eq(atomic_load(&((struct handoff_header *)tab[i])->closed), 0);
    }
    cr_assert_eq(((struct handoff_header *)tab[0])->uid, 1000);
    cr_assert_eq(((struct handoff_header *)tab[1])->uid, 1001);
    cr_assert_neq(memcmp(((struct handoff_header *)tab[0])->key, ((struct handoff_header *)tab[1])->key, 16), 0,
                  "two uids' tables share a key");

    /* the daemon's mapping of a journal is the client's file */
    _Atomic uint32_t *j = mmap(NULL, HANDOFF_JOURNAL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1][1], 0);
    cr_assert_neq(j, MAP_FAILED);
    atomic_store(&j[77], 5);
    cr_assert_eq(atomic_load(&c[1].journal[77]), 5);
    cr_assert_eq(atomic_load(&c[0].journal[77]), 0, "one connection's count shows in another's journal");
    atomic_store(&j[77], 0);
    munmap((void *)j, HANDOFF_JOURNAL_SIZE);
    for (int i = 0; i < 3; i++)
        close(fds[i][1]);

    tenantdir_leave(&f.td, &c[0]);
    cr_assert_null(c[0].dir);
    cr_assert_eq(f.td.st.tables, 2, "the uid's table went with a connection it still has");
    cr_assert_eq(f.td.st.journals, 2);
    cr_assert_eq(atomic_load(&((struct handoff_header *)tab[0])->closed), 0);
    cr_assert_eq(fcntl(fds[1][0], F_GETFD), FD_CLOEXEC, "the table's fd went before its last connection");
    tenantdir_leave(&f.td, &c[1]);
    cr_assert_eq(f.td.st.tables, 1);
    cr_assert_eq(f.td.st.journals, 1);
    cr_assert_eq(atomic_load(&((struct handoff_header *)tab[0])->closed), 1, "the last leave did not close it");
    cr_assert_eq(atomic_load(&((struct handoff_header *)tab[1])->closed), 0, "another uid's table was closed");
    /* a step on the closed table refuses */
    uint32_t slot, seq;
    cr_assert_eq(handoff_lease(tab[0], c[2].journal, 0, T, &slot, &seq), -EAGAIN);
    tenantdir_leave(&f.td, &c[2]);
    cr_assert_eq(f.td.st.tables, 0);
    cr_assert_eq(f.td.st.journals, 0);
    cr_assert_eq(atomic_load(&((struct handoff_header *)tab[1])->closed), 1);
    munmap(tab[0], TABLE_BYTES);
    munmap(tab[1], TABLE_BYTES);
    fx_close(&f);
}

/* ---- 2: grants ---------------------------------------------------------------------- */

/* A for_table buffer's end grants it: FREE|LISTED on its class's list (recorded in the
 * header), still charged, LENT, not in the pool; a plain one goes to the pool. */
Test(tenantdir, end_of_for_table_buffer_grants_it)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    struct registry_holder h = { 0 };
    uint64_t hd;
    struct registry_buf *b = lease(&f, 1000, 100 * KiB, true, &h, &hd);
    uint32_t slot = b->pb->slot;
    uint64_t size = b->pb->size, id = b->pb->id;
    uint64_t warm = pool_bytes_warm(f.core.pool);
    cr_assert_eq(quota_total(f.core.quota), size);
    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    cr_assert(b->lent && b->table);
    cr_assert_eq(registry_stats(f.core.reg).lent, 1);
    cr_assert_eq(registry_stats(f.core.reg).lent_bytes, size);
    cr_assert_eq(registry_stats(f.core.reg).buffers, 1);
    cr_assert_eq(quota_total(f.core.quota), size, "a granted buffer is still charged");
    cr_assert_eq(pool_bytes_warm(f.core.pool), warm, "a granted buffer went back to the pool");
    cr_assert_null(registry_find_writing(f.core.reg, b->token), "a LENT buffer is still hashed");
    assert_word(&k, slot, HANDOFF_FREE, 0, HANDOFF_LISTED);
    struct handoff_entry *e = handoff_entry_at(k.tab, slot);
    uint32_t cls = atomic_load(&e->cls);
    cr_assert_eq(cls, 0, "the first class used");
    cr_assert_eq(atomic_load(&e->buf_id), id);
    cr_assert_eq(atomic_load(&hdr(&k)->cap[0]), size);
    cr_assert_leq(atomic_load(&hdr(&k)->lo[0]), 100 * KiB);
    cr_assert_eq(pool_class_size(f.core.pool, atomic_load(&hdr(&k)->lo[0])), size);
    cr_assert_lt(pool_class_size(f.core.pool, atomic_load(&hdr(&k)->lo[0]) - 1), size, "lo is not the smallest");
    cr_assert_eq(handoff_class(k.tab, 100 * KiB), 0);
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k)->head[0]), slot + 1, "not on its class's list");
    cr_assert_eq(f.td.st.grants, 1);
    cr_assert_eq(tenantdir_members(&f.td), 1);
    cr_assert_eq(tenantdir_member(&f.td, &k.c, id), b);

    /* a plain lease ends to the pool */
    struct registry_buf *p = lease(&f, 1000, 100 * KiB, false, &h, &hd);
    uint32_t pslot = p->pb->slot;
    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    cr_assert_eq(registry_stats(f.core.reg).lent, 1);
    cr_assert_eq(registry_stats(f.core.reg).buffers, 1);
    cr_assert_eq(pool_bytes_warm(f.core.pool), warm + size, "a plain buffer did not go back to the pool");
    cr_assert_eq(quota_total(f.core.quota), size);
    assert_word(&k, pslot, HANDOFF_FREE, 0, 0);
    cr_assert_eq(f.td.st.grants, 1);
    registry_release_all(f.core.reg, &h);
    conn_end(&f, &k);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0, "the last leave left a LENT buffer");
    cr_assert_eq(quota_total(f.core.quota), 0);
    fx_close(&f);
}

/* The daemon's records of membership (members lists, slot index, registry flags and LENT
 * count) are checked after every request in test builds: each way they can disagree
 * aborts. Each child breaks one record behind the module's back. */
static void broken_member(int how)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    tenantdir_check(&f.td); /* agrees */
    switch (how) {
    case 0: f.td.at[b->pb->slot] = NULL; break;           /* the slot index lost it */
    case 1: f.td.at[b->pb->slot ^ 1] = b; f.td.nat++; break; /* a stale slot entry */
    case 2: b->table = false; break;                       /* the registry's flag */
    case 3: b->tenant = 1001; break;                       /* another uid's list */
    default: b->lent = false; break;                       /* LENT members vs the registry's count */
    }
    /* the abort ends the process before fx_close: its pool directory goes now (its
     * buffers are nameless files, so it is empty) */
    cr_assert_eq(rmdir(f.core.dir), 0, "%s: %s", f.core.dir, strerror(errno));
    tenantdir_check(&f.td);
}
Test(tenantdir, check_catches_a_member_missing_from_the_slot_index, .signal = SIGABRT) { broken_member(0); }
Test(tenantdir, check_catches_a_stale_slot_entry, .signal = SIGABRT) { broken_member(1); }
Test(tenantdir, check_catches_a_member_without_the_table_flag, .signal = SIGABRT) { broken_member(2); }
Test(tenantdir, check_catches_a_member_of_another_uid, .signal = SIGABRT) { broken_member(3); }
Test(tenantdir, check_catches_lent_members_the_registry_does_not_count, .signal = SIGABRT) { broken_member(4); }

/* Buffers of two sizes: two classes, each recorded once, each its own list; a foreign
 * buffer whose last hold is the daemon's ends at once (OUT, not pushed). */
Test(tenantdir, classes_per_size_and_foreign_last_daemon_hold)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    struct registry_buf *s = granted(&f, 1000, 100 * KiB);
    struct registry_buf *l = granted(&f, 1000, 1 * MiB);
    struct registry_buf *s2 = granted(&f, 1000, 100 * KiB);
    cr_assert_neq(s->pb->size, l->pb->size);
    cr_assert_eq(atomic_load(&handoff_entry_at(k.tab, s->pb->slot)->cls), 0);
    cr_assert_eq(atomic_load(&handoff_entry_at(k.tab, l->pb->slot)->cls), 1);
    cr_assert_eq(atomic_load(&handoff_entry_at(k.tab, s2->pb->slot)->cls), 0);
    cr_assert_eq(atomic_load(&hdr(&k)->cap[0]), s->pb->size);
    cr_assert_eq(atomic_load(&hdr(&k)->cap[1]), l->pb->size);
    cr_assert_eq(atomic_load(&hdr(&k)->cap[2]), 0, "a class recorded twice");
    cr_assert_eq(handoff_class(k.tab, 1 * MiB), 1);
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k)->head[0]), s2->pb->slot + 1);
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k)->head[1]), l->pb->slot + 1);
    cr_assert_eq(atomic_load(&handoff_entry_at(k.tab, s2->pb->slot)->next), s->pb->slot + 1);
    cr_assert_eq(atomic_load(&handoff_entry_at(k.tab, l->pb->slot)->next), 0);
    cr_assert_eq(f.td.st.grants, 3);

    /* l: published, taken by the daemon, acquired by another uid, all local holds gone */
    uint8_t token[PROTO_TOKEN_LEN];
    uint32_t slot = client_publish(&k, 1, 1 * MiB, token, NULL);
    cr_assert_eq(slot, l->pb->slot);
    cr_assert_eq(registry_find_table(f.core.reg, token), l);
    cr_assert_eq(handoff_give(k.tab, k.journal, slot, T), HANDOFF_HELD);
    assert_word(&k, slot, HANDOFF_PUBLISHED, 1, 0);
    l->pb->foreign = true;
    uint64_t retired = pool_counters(f.core.pool).retired;
    registry_buf_drop(f.core.reg, l); /* the daemon's hold, the last */
    assert_word(&k, slot, HANDOFF_FREE, 0, HANDOFF_OUT);
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k)->head[1]), 0, "an OUT buffer was pushed");
    cr_assert_eq(pool_counters(f.core.pool).retired, retired + 1);
    cr_assert_eq(registry_stats(f.core.reg).lent, 2);
    cr_assert_eq(tenantdir_members(&f.td), 2);
    conn_end(&f, &k);
    fx_close(&f);
}

/* Foreign (another uid mapped it) or sealed buffers and uids without a table are never
 * granted: they end at once. */
Test(tenantdir, foreign_sealed_or_tableless_not_granted)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    struct registry_holder h = { 0 };
    uint64_t hd;
    struct pool_counters pc0 = pool_counters(f.core.pool);

    struct registry_buf *b = lease(&f, 1000, 100 * KiB, true, &h, &hd);
    uint32_t slot = b->pb->slot;
    b->pb->foreign = true;
    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0, "a foreign buffer was granted");
    cr_assert_eq(registry_stats(f.core.reg).buffers, 0);
    cr_assert_eq(pool_counters(f.core.pool).retired, pc0.retired + 1, "a foreign buffer was not retired");
    assert_word(&k, slot, HANDOFF_FREE, 0, 0);

    b = lease(&f, 1000, 100 * KiB, true, &h, &hd);
    slot = b->pb->slot;
    b->pb->sealed = true;
    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0, "a sealed buffer was granted");
    cr_assert_eq(registry_stats(f.core.reg).buffers, 0);
    assert_word(&k, slot, HANDOFF_FREE, 0, 0);

    uint64_t warm = pool_bytes_warm(f.core.pool);
    b = lease(&f, 1001, 100 * KiB, true, &h, &hd); /* uid 1001 has no table */
    uint64_t size = b->pb->size;
    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0, "a buffer of a uid without a table was granted");
    cr_assert_eq(pool_bytes_warm(f.core.pool), warm + size);
    cr_assert_eq(f.td.st.grants, 0);
    cr_assert_eq(quota_total(f.core.quota), 0);
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k)->head[0]), 0, "something was pushed");
    registry_release_all(f.core.reg, &h);
    conn_end(&f, &k);
    fx_close(&f);
}

/* ---- 3: client steps and the daemon's take ---------------------------------------- */

Test(tenantdir, lease_publish_take_and_daemon_hold)
{
    struct fx f;
    fx_open(&f);
    struct conn k1, k2;
    conn_join(&f, &k1, 1000);
    conn_join(&f, &k2, 1000);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    uint32_t bslot = b->pb->slot;
    uint64_t size = b->pb->size;

    uint32_t slot, seq;
    cr_assert_eq(handoff_lease(k1.tab, k1.journal, 0, T, &slot, &seq), 0);
    cr_assert_eq(slot, bslot);
    assert_word(&k1, slot, HANDOFF_LEASED, 1, 0);
    cr_assert_eq(atomic_load(&k1.journal[slot]), 1);
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k1)->head[0]), 0, "the lease did not pop it");
    /* not published yet: the daemon takes nothing */
    uint8_t token[PROTO_TOKEN_LEN];
    cr_assert_eq(getrandom(token, sizeof(token), 0), (ssize_t)sizeof(token));
    handoff_set_slot(token, slot);
    cr_assert_null(registry_find_table(f.core.reg, token), "taken before its publish");
    struct handoff_meta *m = handoff_meta_at(k1.tab, slot);
    memcpy(m->data, "f8", 2);
    atomic_store(&m->len, 2);
    cr_assert_eq(handoff_publish(k1.tab, slot, seq, tokhash(&k1, token), 60 * KiB), 0);
    assert_word(&k1, slot, HANDOFF_PUBLISHED, 1, 0);

    /* a second connection takes it */
    uint32_t tseq;
    cr_assert_eq(handoff_take(k2.tab, k2.journal, slot, tokhash(&k2, token), 60 * KiB, T, &tseq), 0);
    cr_assert_eq(tseq, seq);
    assert_word(&k1, slot, HANDOFF_PUBLISHED, 2, 0);
    cr_assert_eq(atomic_load(&k2.journal[slot]), 1);

    /* wrong token (same slot), a token of a slot without a member: nothing */
    uint8_t wrong[PROTO_TOKEN_LEN];
    memcpy(wrong, token, sizeof(wrong));
    wrong[9] ^= 1;
    cr_assert_null(registry_find_table(f.core.reg, wrong));
    handoff_set_slot(wrong, slot == 7 ? 8 : 7);
    cr_assert_null(registry_find_table(f.core.reg, wrong));
    /* a size beyond the buffer: nothing */
    struct handoff_entry *e = handoff_entry_at(k1.tab, slot);
    atomic_store(&e->size, size + 1);
    cr_assert_null(registry_find_table(f.core.reg, token), "taken with a size beyond its buffer");
    atomic_store(&e->size, 60 * KiB);
    assert_word(&k1, slot, HANDOFF_PUBLISHED, 2, 0);
    cr_assert_eq(f.td.st.takes, 0);

    /* the right token: revived, one daemon hold */
    struct registry_buf *r = registry_find_table(f.core.reg, token);
    cr_assert_eq(r, b);
    cr_assert(!b->lent && b->published && b->table);
    cr_assert_eq(b->size, 60 * KiB);
    cr_assert(b->meta_len == 2 && memcmp(b->meta, "f8", 2) == 0);
    cr_assert_eq(memcmp(b->token, token, sizeof(token)), 0);
    assert_word(&k1, slot, HANDOFF_PUBLISHED, 3, 0);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0);
    cr_assert_eq(f.td.st.takes, 1);
    struct registry_holder h = { 0 };
    uint64_t hd;
    cr_assert_eq(registry_hold(f.core.reg, &h, b, false, &hd), 0);
    cr_assert_eq(registry_find(f.core.reg, token), b, "a revived buffer is not hashed under its token");
    cr_assert_null(registry_find_table(f.core.reg, token), "a live member was taken twice");
    assert_word(&k1, slot, HANDOFF_PUBLISHED, 3, 0);

    /* the daemon's hold goes: count down, LENT again */
    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    cr_assert(b->lent && b->table);
    cr_assert_eq(registry_stats(f.core.reg).lent, 1);
    cr_assert_null(registry_find(f.core.reg, token));
    assert_word(&k1, slot, HANDOFF_PUBLISHED, 2, 0);
    cr_assert_eq(quota_total(f.core.quota), size);

    /* the local gives: the last pushes it back */
    cr_assert_eq(handoff_give(k2.tab, k2.journal, slot, T), HANDOFF_HELD);
    assert_word(&k1, slot, HANDOFF_PUBLISHED, 1, 0);
    cr_assert_eq(handoff_give(k1.tab, k1.journal, slot, T), HANDOFF_FREED);
    assert_word(&k1, slot, HANDOFF_FREE, 0, HANDOFF_LISTED);
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k1)->head[0]), slot + 1);
    cr_assert_eq(atomic_load(&k1.journal[slot]) + atomic_load(&k2.journal[slot]), 0);
    cr_assert_eq(registry_stats(f.core.reg).lent, 1);
    /* the daemon's own take of a revived-then-dropped buffer gives its hold back */
    cr_assert_null(registry_find_table(f.core.reg, token), "a FREE entry was taken");
    registry_release_all(f.core.reg, &h);
    conn_end(&f, &k1);
    conn_end(&f, &k2);
    fx_close(&f);
}

/* registry_buf_drop of a taken buffer gives the daemon's hold back too. */
Test(tenantdir, taken_then_dropped_gives_hold_back)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    uint8_t token[PROTO_TOKEN_LEN];
    uint32_t slot = client_publish(&k, 0, 10 * KiB, token, NULL);
    cr_assert_eq(registry_find_table(f.core.reg, token), b);
    assert_word(&k, slot, HANDOFF_PUBLISHED, 2, 0);
    registry_buf_drop(f.core.reg, b);
    cr_assert(b->lent);
    assert_word(&k, slot, HANDOFF_PUBLISHED, 1, 0);
    cr_assert_eq(handoff_give(k.tab, k.journal, slot, T), HANDOFF_FREED);
    conn_end(&f, &k);
    fx_close(&f);
}

/* ---- 4: foreign path and giveback --------------------------------------------------- */

Test(tenantdir, foreign_take_sets_out_and_giveback_ends_it)
{
    struct fx f;
    fx_open(&f);
    struct conn k, o;
    conn_join(&f, &k, 1000);
    conn_join(&f, &o, 1001);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    uint64_t id = b->pb->id, size = b->pb->size;
    uint8_t token[PROTO_TOKEN_LEN];
    uint32_t slot = client_publish(&k, 0, 10 * KiB, token, NULL);

    /* giveback of a buffer still held (count 1, not OUT): ignored */
    tenantdir_giveback(&f.td, &k.c, id);
    cr_assert_eq(f.td.st.ignored, 1);
    cr_assert(b->lent);

    /* another uid acquires it through the daemon */
    cr_assert_eq(registry_find_table(f.core.reg, token), b);
    struct registry_holder h = { 0 };
    uint64_t hd;
    cr_assert_eq(registry_hold(f.core.reg, &h, b, false, &hd), 0);
    b->pb->foreign = true; /* as acquire.c does for another uid */
    assert_word(&k, slot, HANDOFF_PUBLISHED, 2, 0);
    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    cr_assert(b->lent, "the producer's local hold no longer keeps it");
    assert_word(&k, slot, HANDOFF_PUBLISHED, 1, HANDOFF_OUT);

    /* a giveback while it is held, and one of another uid's connection: ignored */
    tenantdir_giveback(&f.td, &k.c, id);
    tenantdir_giveback(&f.td, &o.c, id);
    cr_assert_eq(f.td.st.ignored, 3);
    cr_assert_eq(f.td.st.givebacks, 0);
    cr_assert(b->lent);

    /* the last local give: to the daemon (not pushed) */
    cr_assert_eq(handoff_give(k.tab, k.journal, slot, T), HANDOFF_TO_DAEMON);
    assert_word(&k, slot, HANDOFF_FREE, 0, HANDOFF_OUT);
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k)->head[0]), 0, "an OUT buffer was pushed");
    cr_assert_eq(quota_total(f.core.quota), size);
    /* another uid's giveback still ignored, then its own ends it */
    tenantdir_giveback(&f.td, &o.c, id);
    cr_assert_eq(f.td.st.ignored, 4);
    cr_assert(b->lent);
    uint64_t retired = pool_counters(f.core.pool).retired, warm = pool_bytes_warm(f.core.pool);
    tenantdir_giveback(&f.td, &k.c, id);
    cr_assert_eq(f.td.st.givebacks, 1);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0);
    cr_assert_eq(registry_stats(f.core.reg).buffers, 0);
    cr_assert_eq(quota_total(f.core.quota), 0, "the giveback did not credit its tenant");
    cr_assert_eq(pool_counters(f.core.pool).retired, retired + 1, "a foreign buffer was not retired");
    cr_assert_eq(pool_bytes_warm(f.core.pool), warm, "a foreign buffer was recycled");
    cr_assert_eq(tenantdir_members(&f.td), 0);
    cr_assert_null(tenantdir_member(&f.td, &k.c, id));
    /* a second giveback of it: nothing of theirs */
    tenantdir_giveback(&f.td, &k.c, id);
    cr_assert_eq(f.td.st.ignored, 5);
    cr_assert_eq(f.td.st.givebacks, 1);
    conn_end(&f, &k);
    conn_end(&f, &o);
    fx_close(&f);
}

/* A giveback of a FREE buffer that is not OUT (on its list) is ignored. */
Test(tenantdir, giveback_of_listed_buffer_ignored)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    tenantdir_giveback(&f.td, &k.c, b->pb->id);
    cr_assert_eq(f.td.st.ignored, 1);
    cr_assert_eq(f.td.st.givebacks, 0);
    cr_assert(b->lent);
    /* OUT and LISTED (the daemon's set_out on a linked entry): still ignored */
    handoff_set_out(k.tab, b->pb->slot, T);
    tenantdir_giveback(&f.td, &k.c, b->pb->id);
    cr_assert_eq(f.td.st.ignored, 2);
    cr_assert(b->lent);
    /* FREE, count 0, unlisted but not OUT (a client's word): not the daemon's, ignored */
    uint32_t slot = b->pb->slot;
    atomic_store(&handoff_entry_at(k.tab, slot)->word, handoff_word(handoff_seq_of(word(&k, slot)), 0, 0, HANDOFF_FREE));
    tenantdir_giveback(&f.td, &k.c, b->pb->id);
    cr_assert_eq(f.td.st.ignored, 3);
    cr_assert_eq(f.td.st.givebacks, 0);
    cr_assert(b->lent);
    /* and with OUT it is: the buffer ends */
    handoff_set_out(k.tab, slot, T);
    tenantdir_giveback(&f.td, &k.c, b->pb->id);
    cr_assert_eq(f.td.st.givebacks, 1);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0);
    cr_assert_eq(quota_total(f.core.quota), 0);
    conn_end(&f, &k);
    fx_close(&f);
}

/* ---- 5: adopt ----------------------------------------------------------------------- */

Test(tenantdir, adopt_makes_a_writing_buffer)
{
    struct fx f;
    fx_open(&f);
    struct conn k, o;
    conn_join(&f, &k, 1000);
    conn_join(&f, &o, 1001);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    struct registry_buf *r = NULL;
    uint64_t id = b->pb->id;
    uint32_t bslot = b->pb->slot;

    /* FREE: nothing to adopt */
    cr_assert_eq(tenantdir_adopt(&f.td, &k.c, id, handoff_seq_of(word(&k, bslot)), &r), -ESTALE);
    cr_assert_eq(tenantdir_adopt(&f.td, &k.c, id, handoff_seq_of(word(&k, bslot)) + 1, &r), -ESTALE);
    assert_word(&k, bslot, HANDOFF_FREE, 0, HANDOFF_LISTED);

    uint32_t slot, seq;
    cr_assert_eq(handoff_lease(k.tab, k.journal, 0, T, &slot, &seq), 0);
    cr_assert_eq(slot, bslot);
    cr_assert_eq(tenantdir_adopt(&f.td, &k.c, id, seq + 1, &r), -ESTALE, "a wrong seq adopted");
    cr_assert_eq(tenantdir_adopt(&f.td, &o.c, id, seq, &r), -ESTALE, "another uid's connection adopted");
    assert_word(&k, slot, HANDOFF_LEASED, 1, 0);
    cr_assert(b->lent);
    cr_assert_eq(f.td.st.adopts, 0);

    cr_assert_eq(tenantdir_adopt(&f.td, &k.c, id, seq, &r), 0);
    cr_assert_eq(r, b);
    cr_assert(!b->lent && !b->published);
    cr_assert_eq(f.td.st.adopts, 1);
    assert_word(&k, slot, HANDOFF_LEASED, 2, 0);
    cr_assert_eq(handoff_slot_of(b->token), slot, "the fresh token does not name its slot");
    cr_assert_eq(registry_find_writing(f.core.reg, b->token), b);
    struct registry_holder h = { 0 };
    uint64_t hd;
    cr_assert_eq(registry_hold(f.core.reg, &h, b, true, &hd), 0);
    /* the daemon holds it already: a second adopt refuses */
    cr_assert_eq(tenantdir_adopt(&f.td, &k.c, id, seq, &r), -ESTALE);
    assert_word(&k, slot, HANDOFF_LEASED, 2, 0);

    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    cr_assert(b->lent);
    assert_word(&k, slot, HANDOFF_LEASED, 1, 0);
    cr_assert_eq(handoff_give(k.tab, k.journal, slot, T), HANDOFF_FREED);
    assert_word(&k, slot, HANDOFF_FREE, 0, HANDOFF_LISTED);
    registry_release_all(f.core.reg, &h);
    conn_end(&f, &k);
    conn_end(&f, &o);
    fx_close(&f);
}

/* ---- 6: leave with holds ------------------------------------------------------------ */

Test(tenantdir, leave_takes_the_journal_holds_over)
{
    struct fx f;
    fx_open(&f);
    struct conn k1, k2;
    conn_join(&f, &k1, 1000);
    conn_join(&f, &k2, 1000);
    struct registry_buf *a = granted(&f, 1000, 100 * KiB);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    (void)a;
    (void)b;
    uint8_t ta[PROTO_TOKEN_LEN], tb[PROTO_TOKEN_LEN];
    uint32_t sa = client_publish(&k2, 0, 10 * KiB, ta, NULL);
    uint32_t sb = client_publish(&k1, 0, 10 * KiB, tb, NULL);
    uint32_t seq;
    /* k1 holds a twice, b once (its lease); k2 holds a once (its lease) */
    cr_assert_eq(handoff_take(k1.tab, k1.journal, sa, tokhash(&k1, ta), 10 * KiB, T, &seq), 0);
    cr_assert_eq(handoff_take(k1.tab, k1.journal, sa, tokhash(&k1, ta), 10 * KiB, T, &seq), 0);
    assert_word(&k1, sa, HANDOFF_PUBLISHED, 3, 0);
    assert_word(&k1, sb, HANDOFF_PUBLISHED, 1, 0);

    conn_leave(&f, &k1);
    cr_assert_eq(f.td.st.crash_holds, 3);
    cr_assert_eq(f.td.st.journals, 1);
    cr_assert_eq(atomic_load(&k1.journal[sa]), 0, "the journal's count was not taken over");
    cr_assert_eq(atomic_load(&k1.journal[sb]), 0);
    cr_assert(handoff_journal_closed(k1.journal), "CLOSED not set");
    assert_word(&k2, sa, HANDOFF_PUBLISHED, 1, 0);
    assert_word(&k2, sb, HANDOFF_FREE, 0, HANDOFF_LISTED);
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k2)->head[0]), sb + 1, "not back on the free list");
    cr_assert_eq(registry_stats(f.core.reg).lent, 2);
    /* the client gives after the daemon took its count over: nothing given twice */
    cr_assert_eq(handoff_give(k1.tab, k1.journal, sa, T), HANDOFF_BAD);
    cr_assert_eq(handoff_give(k1.tab, k1.journal, sb, T), HANDOFF_BAD);
    assert_word(&k2, sa, HANDOFF_PUBLISHED, 1, 0);
    assert_word(&k2, sb, HANDOFF_FREE, 0, HANDOFF_LISTED);
    conn_unmap(&k1);

    cr_assert_eq(handoff_give(k2.tab, k2.journal, sa, T), HANDOFF_FREED);
    conn_end(&f, &k2);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0);
    cr_assert_eq(quota_total(f.core.quota), 0);
    fx_close(&f);
}

/* A leave whose journal held the last hold of an OUT buffer ends it. */
Test(tenantdir, leave_ends_out_buffer_whose_last_hold_it_had)
{
    struct fx f;
    fx_open(&f);
    struct conn k1, k2;
    conn_join(&f, &k1, 1000);
    conn_join(&f, &k2, 1000);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    uint8_t token[PROTO_TOKEN_LEN];
    uint32_t slot = client_publish(&k1, 0, 10 * KiB, token, NULL);
    cr_assert_eq(registry_find_table(f.core.reg, token), b);
    b->pb->foreign = true;
    registry_buf_drop(f.core.reg, b);
    assert_word(&k1, slot, HANDOFF_PUBLISHED, 1, HANDOFF_OUT);
    cr_assert_eq(registry_stats(f.core.reg).lent, 1);
    conn_leave(&f, &k1);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0, "the OUT buffer outlived its last hold");
    cr_assert_eq(registry_stats(f.core.reg).buffers, 0);
    cr_assert_eq(quota_total(f.core.quota), 0);
    cr_assert_eq(tenantdir_members(&f.td), 0);
    conn_unmap(&k1);
    conn_end(&f, &k2);
    fx_close(&f);
}

/* A client killed inside a push leaves a member FREE with no hold on no list (its word CAS
 * done, its link not): tenantdir_repair (a connection that ended without bye) takes it back
 * (OUT, ended); a free member on its list, a held one and one on no list but OUT are left
 * as they are. Without the repair the buffer stays charged to its uid and unusable until
 * the uid's last connection ends. */
Test(tenantdir, repair_takes_back_a_free_member_on_no_list)
{
    struct fx f;
    fx_open(&f);
    struct conn k1, k2;
    conn_join(&f, &k1, 1000);
    conn_join(&f, &k2, 1000);
    struct registry_buf *cut = granted(&f, 1000, 100 * KiB), *listed = granted(&f, 1000, 100 * KiB);
    struct registry_buf *held = granted(&f, 1000, 100 * KiB);
    uint32_t s_cut = cut->pb->slot, s_listed = listed->pb->slot, s_held = held->pb->slot;
    /* the list is LIFO: held, listed, cut. held: leased by k1 and kept; listed: leased and
     * given back (free, on its list); cut: leased, its hold given back, the push cut
     * between the FREE CAS and the link (the word as drop() leaves it there) */
    uint32_t slot, seq, seq_cut;
    cr_assert_eq(handoff_lease(k1.tab, k1.journal, 0, T, &slot, &seq), 0);
    cr_assert_eq(slot, s_held);
    cr_assert_eq(handoff_lease(k1.tab, k1.journal, 0, T, &slot, &seq), 0);
    cr_assert_eq(slot, s_listed);
    cr_assert_eq(handoff_lease(k1.tab, k1.journal, 0, T, &slot, &seq_cut), 0);
    cr_assert_eq(slot, s_cut);
    cr_assert_eq(handoff_give(k1.tab, k1.journal, s_listed, T), HANDOFF_FREED);
    atomic_fetch_sub(&k1.journal[s_cut], 1u);
    atomic_store(&handoff_entry_at(k1.tab, s_cut)->word, handoff_word(seq_cut, 0, 0, HANDOFF_FREE));
    assert_word(&k1, s_cut, HANDOFF_FREE, 0, 0);
    assert_word(&k1, s_held, HANDOFF_LEASED, 1, 0);
    assert_word(&k1, s_listed, HANDOFF_FREE, 0, HANDOFF_LISTED);
    uint64_t q0 = quota_total(f.core.quota), cut_size = cut->pb->size; /* cut is freed by the repair */
    tenantdir_repair(&f.td, &k1.c);
    cr_assert_eq(f.td.st.repaired, 1);
    cr_assert_eq(quota_total(f.core.quota), q0 - cut_size, "the cut member was not credited");
    cr_assert_eq(tenantdir_members(&f.td), 2);
    assert_word(&k1, s_cut, HANDOFF_FREE, 0, HANDOFF_OUT);
    assert_word(&k1, s_held, HANDOFF_LEASED, 1, 0);
    assert_word(&k1, s_listed, HANDOFF_FREE, 0, HANDOFF_LISTED);
    /* a pusher that was not dead after all: its link CAS sees OUT; its giveback is ignored */
    uint64_t ign = f.td.st.ignored;
    tenantdir_giveback(&f.td, &k2.c, 0); /* nothing of its: ignored */
    cr_assert_eq(f.td.st.ignored, ign + 1);
    tenantdir_repair(&f.td, &k1.c); /* nothing more to do */
    cr_assert_eq(f.td.st.repaired, 1);
    conn_end(&f, &k1); /* its journal's hold on `held` ends with it */
    assert_word(&k2, s_held, HANDOFF_FREE, 0, HANDOFF_LISTED);
    conn_end(&f, &k2);
    fx_close(&f);
}

/* The uid's last leave takes the table back: LENT members end (even held in a journal),
 * a live one (the daemon holds it) leaves the table and ends at its last reference. */
Test(tenantdir, last_leave_takes_the_table_back)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    struct registry_buf *lent = granted(&f, 1000, 100 * KiB);
    struct registry_buf *live = granted(&f, 1000, 100 * KiB);
    uint64_t size = live->pb->size;
    uint8_t token[PROTO_TOKEN_LEN];
    uint32_t slot = client_publish(&k, 0, 10 * KiB, token, NULL);
    cr_assert_eq(slot, live->pb->slot);
    cr_assert_eq(registry_find_table(f.core.reg, token), live);
    struct registry_holder h = { 0 };
    uint64_t hd;
    cr_assert_eq(registry_hold(f.core.reg, &h, live, false, &hd), 0);
    uint32_t s2, seq;
    cr_assert_eq(handoff_lease(k.tab, k.journal, 0, T, &s2, &seq), 0); /* lent, held locally */
    cr_assert_eq(s2, lent->pb->slot);
    cr_assert_eq(quota_total(f.core.quota), 2 * size);
    uint64_t warm = pool_bytes_warm(f.core.pool);
    conn_leave(&f, &k);
    cr_assert_eq(f.td.st.tables, 0);
    cr_assert_eq(atomic_load(&hdr(&k)->closed), 1);
    cr_assert_eq(tenantdir_members(&f.td), 0);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0, "a LENT member outlived its table");
    cr_assert_eq(quota_total(f.core.quota), size, "only the live member is still charged");
    cr_assert_eq(pool_bytes_warm(f.core.pool), warm + size);
    cr_assert(!live->table && !live->lent);
    cr_assert_eq(registry_find(f.core.reg, token), live, "the live member was ended with its table");
    /* steps on the closed table refuse */
    cr_assert_eq(handoff_give(k.tab, k.journal, s2, T), HANDOFF_BAD);
    conn_unmap(&k);
    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0, "granted with no table");
    cr_assert_eq(quota_total(f.core.quota), 0);
    cr_assert_eq(registry_stats(f.core.reg).buffers, 0);
    registry_release_all(f.core.reg, &h);
    fx_close(&f);
}

/* ---- 7: holds ----------------------------------------------------------------------- */

Test(tenantdir, holds_is_the_idle_check)
{
    struct fx f;
    fx_open(&f);
    struct conn k1, k2;
    conn_join(&f, &k1, 1000);
    conn_join(&f, &k2, 1000);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    uint64_t visits = 0;
    cr_assert_not(tenantdir_holds(&f.td, &k1.c, &visits));
    cr_assert(handoff_journal_closed(k1.journal), "an idle connection's journal not CLOSED");
    cr_assert_not(tenantdir_holds_buf(&f.td, &k1.c, b));
    uint32_t slot, seq;
    cr_assert_eq(handoff_lease(k1.tab, k1.journal, 0, T, &slot, &seq), 0);
    cr_assert(tenantdir_holds_buf(&f.td, &k1.c, b));
    cr_assert_not(tenantdir_holds_buf(&f.td, &k2.c, b));
    cr_assert_not(tenantdir_holds(&f.td, &k2.c, &visits), "another connection's hold counted");
    cr_assert(tenantdir_holds(&f.td, &k1.c, &visits));
    cr_assert_not(handoff_journal_closed(k1.journal), "CLOSED not cleared for a busy connection");
    cr_assert_eq(handoff_give(k1.tab, k1.journal, slot, T), HANDOFF_FREED);
    cr_assert_not(tenantdir_holds(&f.td, &k1.c, &visits));
    conn_end(&f, &k1);
    conn_end(&f, &k2);
    fx_close(&f);
}

/* The idle check of a connection that keeps holding one member costs O(1) after its
 * first walk: it looks at the member it last found held first. (Without that, a sweep
 * walked the uid's members for every connection that only hands off in its table, every
 * second once it was idle: up to 65,536 members per connection.) */
Test(tenantdir, holds_looks_at_its_last_find_first)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    enum { N = 64 };
    for (int i = 0; i < N; i++)
        (void)granted(&f, 1000, 4 * KiB);
    /* the class's list pops the last granted first; the members list walks newest first:
     * take every buffer, keep the oldest (the walk's last), give the others back */
    uint32_t slots[N], seq;
    for (int i = 0; i < N; i++)
        cr_assert_eq(handoff_lease(k.tab, k.journal, 0, T, &slots[i], &seq), 0);
    for (int i = 0; i < N - 1; i++)
        cr_assert_eq(handoff_give(k.tab, k.journal, slots[i], T), HANDOFF_FREED);
    uint64_t visits = 0;
    cr_assert(tenantdir_holds(&f.td, &k.c, &visits));
    cr_assert_eq(visits, N, "the first check walked %llu members", (unsigned long long)visits);
    for (int i = 0; i < 10; i++)
        cr_assert(tenantdir_holds(&f.td, &k.c, &visits));
    cr_assert_eq(visits, N, "later checks walked again: %llu", (unsigned long long)visits);
    cr_assert_not(handoff_journal_closed(k.journal));
    /* given back: the hint finds nothing, the walk nothing, the connection is idle */
    cr_assert_eq(handoff_give(k.tab, k.journal, slots[N - 1], T), HANDOFF_FREED);
    cr_assert_not(tenantdir_holds(&f.td, &k.c, &visits));
    cr_assert_eq(visits, N + N);
    cr_assert(handoff_journal_closed(k.journal));
    conn_end(&f, &k);
    fx_close(&f);
}

/* ---- 8: reclaim --------------------------------------------------------------------- */

Test(tenantdir, reclaim_ends_free_members_only)
{
    struct fx f;
    fx_open(&f);
    struct conn k, o;
    conn_join(&f, &k, 1000);
    conn_join(&f, &o, 1001);
    struct registry_buf *a = granted(&f, 1000, 100 * KiB);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    struct registry_buf *c = granted(&f, 1001, 100 * KiB);
    uint64_t size = a->pb->size;
    uint32_t slot, seq;
    cr_assert_eq(handoff_lease(k.tab, k.journal, 0, T, &slot, &seq), 0); /* held: b (the list's head) */
    cr_assert_eq(slot, b->pb->slot);
    cr_assert_eq(quota_total(f.core.quota), 3 * size);

    cr_assert_eq(registry_reclaim_table(f.core.reg, 1000, UINT64_MAX), size);
    cr_assert_eq(f.td.st.reclaimed, 1);
    cr_assert_eq(registry_stats(f.core.reg).lent, 2);
    cr_assert(b->lent && c->lent);
    assert_word(&k, slot, HANDOFF_LEASED, 1, 0);
    cr_assert_eq(quota_total(f.core.quota), 2 * size);
    cr_assert_eq(tenantdir_members(&f.td), 2);
    cr_assert_eq(quota_held(f.core.quota, 1001), size, "another uid's member was reclaimed");

    /* nothing free left for uid 1000 */
    cr_assert_eq(registry_reclaim_table(f.core.reg, 1000, UINT64_MAX), 0);
    /* give b back, then reclaim everything across tenants */
    cr_assert_eq(handoff_give(k.tab, k.journal, slot, T), HANDOFF_FREED);
    cr_assert_eq(registry_reclaim_table(f.core.reg, UINT32_MAX, UINT64_MAX), 2 * size);
    cr_assert_eq(f.td.st.reclaimed, 3);
    cr_assert_eq(registry_stats(f.core.reg).lent, 0);
    cr_assert_eq(quota_total(f.core.quota), 0);
    assert_word(&k, slot, HANDOFF_FREE, 0, HANDOFF_OUT);
    cr_assert_eq(tenantdir_members(&f.td), 0);
    conn_end(&f, &k);
    conn_end(&f, &o);
    fx_close(&f);
}

/* A bounded reclaim stops once it has the bytes. */
Test(tenantdir, reclaim_stops_at_the_bytes_asked)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    struct registry_buf *a = granted(&f, 1000, 100 * KiB);
    (void)granted(&f, 1000, 100 * KiB);
    uint64_t size = a->pb->size;
    cr_assert_eq(registry_reclaim_table(f.core.reg, 1000, 1), size);
    cr_assert_eq(registry_stats(f.core.reg).lent, 1);
    conn_end(&f, &k);
    fx_close(&f);
}

/* A cyclic free list (the tenant's scribble) terminates, and reclaims at most the members. */
Test(tenantdir, reclaim_on_cyclic_list_terminates)
{
    struct fx f;
    fx_open(&f);
    struct conn k;
    conn_join(&f, &k, 1000);
    struct registry_buf *m[3];
    for (int i = 0; i < 3; i++)
        m[i] = granted(&f, 1000, 100 * KiB);
    uint64_t size = m[0]->pb->size;
    uint32_t s1 = m[1]->pb->slot, s2 = m[2]->pb->slot;
    /* the list is m2 -> m1 -> m0: make m1 link back to m2 (m0 is lost from it) */
    cr_assert_eq((uint32_t)atomic_load(&hdr(&k)->head[0]), s2 + 1);
    atomic_store(&handoff_entry_at(k.tab, s1)->next, s2 + 1);
    uint64_t warm = pool_bytes_warm(f.core.pool);
    uint64_t got = registry_reclaim_table(f.core.reg, 1000, UINT64_MAX);
    cr_assert_eq(got, 2 * size);
    cr_assert_eq(pool_bytes_warm(f.core.pool), warm + 2 * size, "reclaimed bytes not back warm");
    cr_assert_eq(f.td.st.reclaimed, 2);
    cr_assert(m[0]->lent, "a member off the list was reclaimed");
    assert_word(&k, s1, HANDOFF_FREE, 0, HANDOFF_OUT);
    assert_word(&k, s2, HANDOFF_FREE, 0, HANDOFF_OUT);
    /* non-member slots FREE|LISTED in a cycle of their own, at the head */
    uint32_t x = 60000, y = 60001;
    atomic_store(&handoff_entry_at(k.tab, x)->word, handoff_word(0, 0, HANDOFF_LISTED, HANDOFF_FREE));
    atomic_store(&handoff_entry_at(k.tab, y)->word, handoff_word(0, 0, HANDOFF_LISTED, HANDOFF_FREE));
    atomic_store(&handoff_entry_at(k.tab, x)->next, y + 1);
    atomic_store(&handoff_entry_at(k.tab, y)->next, x + 1);
    atomic_store(&hdr(&k)->head[0], (uint64_t)7 << 32 | (x + 1));
    cr_assert_eq(registry_reclaim_table(f.core.reg, UINT32_MAX, UINT64_MAX), 0);
    cr_assert_eq(f.td.st.reclaimed, 2);
    /* popped at most as many times as the table has members (1) */
    assert_word(&k, x, HANDOFF_FREE, 0, HANDOFF_OUT);
    assert_word(&k, y, HANDOFF_FREE, 0, HANDOFF_LISTED);
    cr_assert(m[0]->lent);
    cr_assert_eq(registry_stats(f.core.reg).lent, 1);
    cr_assert_eq(quota_total(f.core.quota), size);
    conn_end(&f, &k);
    cr_assert_eq(quota_total(f.core.quota), 0, "the lost member did not end with the table");
    fx_close(&f);
}

/* ---- 9: a hostile table ------------------------------------------------------------- */

Test(tenantdir, hostile_table_never_hurts_the_daemon_or_another_uid)
{
    struct fx f;
    fx_open(&f);
    struct conn k1, k2, o;
    conn_join(&f, &k1, 1000);
    conn_join(&f, &k2, 1000);
    conn_join(&f, &o, 1001);
    struct registry_buf *b = granted(&f, 1000, 100 * KiB);
    struct registry_buf *a = granted(&f, 1000, 100 * KiB); /* the list's head */
    struct registry_buf *c = granted(&f, 1001, 100 * KiB);
    uint32_t sb = b->pb->slot, sc = c->pb->slot;
    uint64_t ida = a->pb->id, idb = b->pb->id, idc = c->pb->id; /* b ends on the way */
    uint8_t ta[PROTO_TOKEN_LEN];
    /* a: published by k1, then acquired by uid 1001 through the daemon (held, foreign) */
    uint32_t sa = client_publish(&k1, 0, 10 * KiB, ta, NULL);
    cr_assert_eq(sa, a->pb->slot, "the list's head was not the last granted");
    cr_assert_eq(registry_find_table(f.core.reg, ta), a);
    struct registry_holder h = { 0 };
    uint64_t hd;
    cr_assert_eq(registry_hold(f.core.reg, &h, a, false, &hd), 0);
    a->pb->foreign = true;
    struct registry_holder ph = { 0 };
    uint64_t phd;
    struct registry_buf *later = lease(&f, 1000, 100 * KiB, true, &ph, &phd); /* ends after the scribble */

#define A_ALIVE()                                                                                                 \
    do {                                                                                                          \
        cr_assert_eq(registry_find(f.core.reg, ta), a, "a buffer another uid holds was ended or hidden");       \
        cr_assert(registry_holds(&h, a) && !a->lent);                                                           \
        cr_assert(a->table, "a live member another uid holds left its table");                                  \
    } while (0)

    /* the scribble, from uid 1000's client mapping */
    struct handoff_header *H = hdr(&k1);
    H->nslots = 0xffffffffu;
    memset(H->key, 0x5a, sizeof(H->key));
    for (unsigned i = 0; i < HANDOFF_CLASSES; i++) {
        atomic_store(&H->cap[i], UINT64_MAX - i);
        atomic_store(&H->lo[i], i);
        atomic_store(&H->head[i], (uint64_t)i << 32 | (i % 2 ? sa + 1 : 0xffffffffu));
    }
    atomic_store(&H->head[0], (uint64_t)3 << 32 | (sb + 1)); /* b, then a (held), then a again */
    atomic_store(&handoff_entry_at(k1.tab, sa)->word, handoff_word(5, 0xfffff0, HANDOFF_LISTED, HANDOFF_PUBLISHED));
    atomic_store(&handoff_entry_at(k1.tab, sa)->next, sa + 1);
    atomic_store(&handoff_entry_at(k1.tab, sb)->word, handoff_word(9, 0, HANDOFF_LISTED, HANDOFF_FREE));
    atomic_store(&handoff_entry_at(k1.tab, sb)->next, sa + 1);
    atomic_store(&handoff_entry_at(k1.tab, sb)->size, UINT64_MAX);
    atomic_store(&handoff_meta_at(k1.tab, sb)->len, 0xffffffffu);
    /* uid 1000 also names uid 1001's slot */
    atomic_store(&handoff_entry_at(k1.tab, sc)->word, handoff_word(1, 0, HANDOFF_LISTED, HANDOFF_FREE));
    for (uint32_t i = 0; i < HANDOFF_MAX_SLOTS; i++)
        atomic_store(&k1.journal[i], 0xffffffffu);
    atomic_store(handoff_journal_flag(k1.journal), 0);

    /* drive every path */
    uint8_t tok[PROTO_TOKEN_LEN];
    memcpy(tok, ta, sizeof(tok));
    handoff_set_slot(tok, sb);
    cr_assert_null(registry_find_table(f.core.reg, tok));
    handoff_set_slot(tok, sc);
    cr_assert_null(registry_find_table(f.core.reg, tok));
    handoff_set_slot(tok, 0xfffffff0u);
    cr_assert_null(registry_find_table(f.core.reg, tok));
    A_ALIVE();
    cr_assert_eq(registry_reclaim_table(f.core.reg, 1000, UINT64_MAX), a->pb->size, "b, FREE|LISTED, not reclaimed");
    A_ALIVE();
    tenantdir_giveback(&f.td, &k1.c, ida);
    tenantdir_giveback(&f.td, &k1.c, idb);
    tenantdir_giveback(&f.td, &k1.c, idc);
    A_ALIVE();
    cr_assert(c->lent, "uid 1000's giveback ended uid 1001's buffer");
    uint32_t slot, seq;
    (void)handoff_lease(k1.tab, k1.journal, 0, T, &slot, &seq);
    registry_release(f.core.reg, &ph, phd); /* a grant into the scribbled table */
    (void)later;
    A_ALIVE();
    uint64_t visits = 0;
    (void)tenantdir_holds(&f.td, &k1.c, &visits);
    conn_leave(&f, &k1); /* 0xffffffff of every member */
    A_ALIVE();
    cr_assert(c->lent, "uid 1000's leave ended uid 1001's buffer");
    assert_word(&o, sc, HANDOFF_FREE, 0, HANDOFF_LISTED);
    registry_reclaim_table(f.core.reg, 1000, UINT64_MAX);
    A_ALIVE();
    /* uid 1001's table is untouched: its client still leases there */
    cr_assert_eq(handoff_lease(o.tab, o.journal, 0, T, &slot, &seq), 0);
    cr_assert_eq(slot, sc);
    cr_assert_eq(handoff_give(o.tab, o.journal, slot, T), HANDOFF_FREED);

    /* the other uid's hold goes: a ends now or with its table */
    cr_assert_eq(registry_release(f.core.reg, &h, hd), 0);
    registry_release_all(f.core.reg, &h);
    registry_release_all(f.core.reg, &ph);
    conn_end(&f, &k2); /* uid 1000's last: the table back */
    conn_unmap(&k1);
    cr_assert_eq(quota_held(f.core.quota, 1000), 0, "a charge of uid 1000 outlived its table");
    cr_assert(c->lent);
    conn_end(&f, &o);
    fx_close(&f);
#undef A_ALIVE
}
