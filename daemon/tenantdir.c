/* SPDX-License-Identifier: MIT */
/* tenantdir.c: see tenantdir.h. The steps on a table are proto/handoff.c's; what is here is
 * when the daemon makes them: a grant at the end of a buffer leased for the table, one hold
 * of its own while it has references (taken by an acquire or an adopt, given at the last
 * reference's end), the journal's holds of a connection that ended, and the whole table
 * back with its uid's last connection. The daemon walks only its own list of a table's
 * members (each an O(1) step), never a list in shared memory beyond a bound it sets. */
#include "tenantdir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "handoff.h"
#include "log.h"

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct tenantdir {
    uint32_t uid;
    int fd;                             /* sent to each table connection of uid */
    void *map;                          /* read-write */
    uint8_t key[16];                    /* the token-hash key (the header's copy may be scribbled) */
    uint64_t cap[HANDOFF_CLASSES];      /* the classes as recorded (the header's may be scribbled) */
    unsigned ncls;
    struct tenantdir_conn *conns;
    unsigned nconns;
    struct registry_buf *members;       /* registry_buf.lent_prev/lent_next */
    uint64_t nmembers;
    struct tenantdir *next;
};

/* ---- files ------------------------------------------------------------------------- */

/* sealed_memfd: a memfd of size bytes, sealed against resizing; mapped with prot into
 * *ret_map. Returns the fd or -errno. */
static int sealed_memfd(const char *name, size_t size, int prot, void **ret_map)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) < 0 || fcntl(fd, F_ADD_SEALS, SEALS) < 0 ||
        (p = mmap(NULL, size, prot, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        int e = errno;
        close(fd);
        return -e;
    }
    *ret_map = p;
    return fd;
}

static struct tenantdir *dir_find(const struct tenantdirs *t, uint32_t uid)
{
    for (struct tenantdir *d = t->head; d; d = d->next)
        if (d->uid == uid)
            return d;
    return NULL;
}

static int dir_new(struct tenantdirs *t, uint32_t uid, struct tenantdir **ret)
{
    /* The members by slot, for every uid (a slot is one buffer's): found in O(1) by a
     * token or a buffer id, whatever their number. Made with the first table. */
    if (!t->at && !(t->at = calloc(HANDOFF_MAX_SLOTS, sizeof(*t->at))))
        return -ENOMEM;
    struct tenantdir *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    if (getrandom(d->key, sizeof(d->key), GRND_NONBLOCK) != (ssize_t)sizeof(d->key)) {
        int e = errno == EAGAIN ? -EAGAIN : -EIO;
        free(d);
        return e;
    }
    int fd = sealed_memfd("shmrefd-table", HANDOFF_TABLE_SIZE, PROT_READ | PROT_WRITE, &d->map);
    if (fd < 0) {
        free(d);
        return fd;
    }
    handoff_init(d->map, HANDOFF_MAX_SLOTS, uid, d->key); /* before the file is sent to anyone */
    d->fd = fd;
    d->uid = uid;
    d->next = t->head;
    t->head = d;
    t->st.tables++;
    *ret = d;
    return 0;
}

/* ---- members ----------------------------------------------------------------------- */

static void member_link(struct tenantdirs *t, struct tenantdir *d, struct registry_buf *b)
{
    t->nat += !t->at[b->pb->slot];
    t->at[b->pb->slot] = b; /* slot < HANDOFF_MAX_SLOTS: lend checked it */
    b->table = true;
    b->lent_prev = NULL;
    b->lent_next = d->members;
    if (d->members)
        d->members->lent_prev = b;
    d->members = b;
    d->nmembers++;
}

static void member_unlink(struct tenantdirs *t, struct tenantdir *d, struct registry_buf *b)
{
    if (t->at[b->pb->slot] == b) {
        t->at[b->pb->slot] = NULL;
        t->nat--;
    }
    if (b->lent_prev) b->lent_prev->lent_next = b->lent_next; else d->members = b->lent_next;
    if (b->lent_next) b->lent_next->lent_prev = b->lent_prev;
    b->lent_prev = b->lent_next = NULL;
    b->table = false;
    d->nmembers--;
}

/* member_end: b (LENT) leaves the table and ends: credited, back to the pool. */
static void member_end(struct tenantdirs *t, struct tenantdir *d, struct registry_buf *b)
{
    member_unlink(t, d, b);
    registry_lent_end(t->reg, b);
}

/* class_of: the table class of buffers of size bytes, recorded at its first use (the
 * leases it serves: every size the pool puts in that class); -1 when all are used. */
static int class_of(struct tenantdirs *t, struct tenantdir *d, uint64_t size)
{
    for (unsigned c = 0; c < d->ncls; c++)
        if (d->cap[c] == size)
            return (int)c;
    if (d->ncls == HANDOFF_CLASSES)
        return -1;
    uint64_t lo = 1, hi = size; /* the smallest lease the pool gives a buffer of this size */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (pool_class_size(t->pool, mid) >= size)
            hi = mid;
        else
            lo = mid + 1;
    }
    d->cap[d->ncls] = size;
    handoff_set_class(d->map, d->ncls, size, lo);
    return (int)d->ncls++;
}

/* daemon_give: the daemon's one hold of member b goes. True when b must end now (the
 * daemon's: OUT, or a word that had no such hold). */
static bool daemon_give(struct tenantdir *d, struct registry_buf *b)
{
    uint32_t slot = b->pb->slot;
    /* Another uid maps it: no local lease may have it again; its last hold goes to us. */
    if (b->pb->foreign)
        handoff_set_out(d->map, slot, HANDOFF_TRIES);
    switch (handoff_give(d->map, NULL, slot, HANDOFF_TRIES)) {
    case HANDOFF_HELD:
    case HANDOFF_FREED:
    case HANDOFF_BUSY: /* still counted: a hold leaked to its own tenant, repaired at its end */
        return false;
    case HANDOFF_BAD: /* scribbled: the word had no hold of ours; the buffer is ours now */
        handoff_set_out(d->map, slot, HANDOFF_TRIES);
        return true;
    case HANDOFF_TO_DAEMON:
    default:
        return true;
    }
}

/* join_class: the class b joins its uid's table d in, or -1: no table, no slot, a buffer
 * that may not be recycled (another uid mapped it, sealed), a slot still a member's, or
 * every class used. The one rule of both ways in (lend's grant, published's join). */
static int join_class(struct tenantdirs *t, struct tenantdir *d, const struct registry_buf *b)
{
    uint32_t slot = b->pb->slot;
    if (!d || slot >= HANDOFF_MAX_SLOTS || b->pb->foreign || b->pb->sealed || t->at[slot])
        return -1;
    return class_of(t, d, b->pb->size);
}

/* lend: the registry's lender: b's last daemon reference went. */
static bool lend(void *arg, struct registry_buf *b)
{
    struct tenantdirs *t = arg;
    struct tenantdir *d = dir_find(t, b->tenant);
    uint32_t slot = b->pb->slot;
    if (b->table) {
        if (!daemon_give(d, b))
            return true; /* LENT: the table's */
        member_unlink(t, d, b);
        return false;
    }
    int cls = b->for_table ? join_class(t, d, b) : -1;
    if (cls < 0 || handoff_grant(d->map, slot, (uint32_t)cls, b->pb->id, HANDOFF_TRIES) < 0)
        return false;
    member_link(t, d, b);
    t->st.grants++;
    return true;
}

/* published: the registry's: b, leased for the table (its class's free list was empty),
 * got a plain publish through the daemon. It joins its table now, published there under
 * its token with the daemon's one hold (its references), so that a consumer that maps it
 * takes it in the table, as a publish made there: a buffer published once and acquired
 * again and again (a model, a lookup table) costs the daemon nothing after each consumer's
 * first acquire. Not for a buffer that may not be recycled (another uid mapped it, sealed). */
static void published(void *arg, struct registry_buf *b)
{
    struct tenantdirs *t = arg;
    struct tenantdir *d = dir_find(t, b->tenant);
    int cls = b->meta_len <= HANDOFF_META_MAX ? join_class(t, d, b) : -1;
    if (cls < 0 || handoff_join_published(d->map, b->pb->slot, (uint32_t)cls, b->pb->id,
                                          handoff_siphash(d->key, b->token, PROTO_TOKEN_LEN), b->size, b->meta,
                                          b->meta_len) < 0)
        return;
    member_link(t, d, b);
    t->st.grants++;
}

/* take: the registry's: a daemon acquire (or retain) of a token the registry does not
 * know: a publish made in a table. The slot is in the token; the word is checked against
 * the token's hash under the daemon's copy of the key. */
static struct registry_buf *take(void *arg, const uint8_t *token)
{
    struct tenantdirs *t = arg;
    uint32_t slot = handoff_slot_of(token);
    struct registry_buf *b = t->at && slot < HANDOFF_MAX_SLOTS ? t->at[slot] : NULL;
    if (!b || !b->lent)
        return NULL; /* live members are hashed under their current token: not this one */
    struct tenantdir *d = dir_find(t, b->tenant);
    uint64_t size = atomic_load(&handoff_entry_at(d->map, slot)->size);
    uint32_t seq;
    if (size > b->pb->size ||
        handoff_take(d->map, NULL, slot, handoff_siphash(d->key, token, PROTO_TOKEN_LEN), size, HANDOFF_TRIES,
                     &seq) < 0)
        return NULL;
    /* The metadata is read under the hold: no lease can rewrite it meanwhile. */
    const struct handoff_meta *m = handoff_meta_at(d->map, slot);
    uint8_t meta[HANDOFF_META_MAX];
    uint32_t len = atomic_load(&m->len);
    if (len > HANDOFF_META_MAX)
        len = 0;
    memcpy(meta, m->data, len);
    if (registry_lent_revive(t->reg, b, token, size, meta, len) < 0) {
        if (daemon_give(d, b))
            member_end(t, d, b);
        return NULL;
    }
    t->st.takes++;
    return b;
}

/* reclaim: the registry's: free members of tenant's table (every table's for UINT32_MAX)
 * back to the pool until bytes were given back. Each class's list is popped at most as
 * many times as the table has members: a scribbled (cyclic) list cannot hold the loop. */
static uint64_t reclaim(void *arg, uint32_t tenant, uint64_t bytes)
{
    struct tenantdirs *t = arg;
    uint64_t got = 0;
    for (struct tenantdir *d = t->head; d && got < bytes; d = d->next) {
        if (tenant != UINT32_MAX && d->uid != tenant)
            continue;
        for (unsigned c = 0; c < d->ncls && got < bytes; c++) {
            uint64_t bound = d->nmembers;
            uint32_t slot;
            for (uint64_t i = 0; i < bound && got < bytes && handoff_pop(d->map, c, HANDOFF_TRIES, &slot) == 0; i++) {
                struct registry_buf *b = t->at[slot];
                if (!b || !b->lent || b->tenant != d->uid)
                    continue; /* a scribbled link: popped, OUT, and nobody's member */
                got += b->pb->size;
                t->st.reclaimed++;
                member_end(t, d, b);
            }
        }
    }
    return got;
}

/* retained: the registry's: member b got a retention. Its acquires must reach the daemon
 * (a take in the table would not end it): RETAINED makes clients' takes ask the daemon;
 * OUT: like a buffer another uid mapped, it leaves the table with its last hold. */
static void retained(void *arg, struct registry_buf *b)
{
    struct tenantdirs *t = arg;
    struct tenantdir *d = dir_find(t, b->tenant);
    if (d && b->pb->slot < HANDOFF_MAX_SLOTS)
        handoff_set_retained(d->map, b->pb->slot, HANDOFF_TRIES);
}

/* ---- connections ------------------------------------------------------------------- */

void tenantdir_init(struct tenantdirs *t, struct registry *reg, struct pool *pool, struct counters *counters)
{
    *t = (struct tenantdirs){ .reg = reg, .pool = pool, .counters = counters };
    struct registry_lender l = { .lend = lend, .take = take, .reclaim = reclaim, .retained = retained,
                                 .published = published, .arg = t };
    registry_set_lender(reg, &l);
}

int tenantdir_join(struct tenantdirs *t, uint32_t uid, struct tenantdir_conn *c, int ret_fds[2])
{
    struct tenantdir *d = dir_find(t, uid);
    bool made = false;
    int r = 0;
    if (!d) {
        if ((r = dir_new(t, uid, &d)) < 0)
            goto fail;
        made = true;
    }
    void *map;
    int fd = sealed_memfd("shmrefd-table-journal", HANDOFF_JOURNAL_SIZE, PROT_READ | PROT_WRITE, &map);
    if (fd < 0) {
        r = fd;
        if (made) {
            t->head = d->next;
            t->st.tables--;
            munmap(d->map, HANDOFF_TABLE_SIZE);
            close(d->fd);
            free(d);
        }
        goto fail;
    }
    *c = (struct tenantdir_conn){ .dir = d, .journal = map, .next = d->conns };
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    d->nconns++;
    t->st.journals++;
    ret_fds[0] = d->fd;
    ret_fds[1] = fd;
    return 0;
fail:
    if (!t->failed_logged) {
        t->failed_logged = true;
        log_warning("cannot make a handoff table for uid %u: %s; its connections (and others that fail the same "
                    "way, not logged again) get no same-tenant handoffs without the daemon",
                    (unsigned)uid, strerror(-r));
    }
    return r;
}

/* table_back: d's uid has no connection left: every member back (live ones end at their
 * last reference), the table closed for whoever still maps it, and freed. */
static void table_back(struct tenantdirs *t, struct tenantdir *d)
{
    handoff_close(d->map);
    while (d->members) {
        struct registry_buf *b = d->members;
        if (b->lent)
            member_end(t, d, b);
        else
            member_unlink(t, d, b);
    }
    for (struct tenantdir **pp = &t->head; *pp; pp = &(*pp)->next)
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    munmap(d->map, HANDOFF_TABLE_SIZE);
    close(d->fd);
    t->st.tables--;
    free(d);
}

void tenantdir_leave(struct tenantdirs *t, struct tenantdir_conn *c)
{
    struct tenantdir *d = c->dir;
    if (!d)
        return;
    if (c->prev) c->prev->next = c->next; else d->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    d->nconns--;
    t->st.journals--;
    /* Its holds end with it: what its journal says of each member, taken over (exchanged
     * with 0, so a give racing this one finds nothing to give), never more than the word
     * counts (a liar's journal can only free its own uid's buffers early). CLOSED first:
     * a hold its process takes from here is given back by that process itself. */
    atomic_store(handoff_journal_flag(c->journal), 1u);
    for (struct registry_buf *b = d->members, *next; b && d->nconns; b = next) {
        next = b->lent_next;
        uint32_t n = handoff_journal_take(c->journal, b->pb->slot);
        if (!n)
            continue;
        uint32_t counted = handoff_count_of(atomic_load(&handoff_entry_at(d->map, b->pb->slot)->word));
        t->st.crash_holds += n < counted ? n : counted; /* what a liar's journal says is not counted */
        if (handoff_reclaim(d->map, b->pb->slot, n, HANDOFF_TRIES) == HANDOFF_TO_DAEMON && b->lent)
            member_end(t, d, b);
    }
    munmap((void *)c->journal, HANDOFF_JOURNAL_SIZE);
    *c = (struct tenantdir_conn){ 0 };
    if (!d->nconns)
        table_back(t, d);
}

void tenantdir_repair(struct tenantdirs *t, struct tenantdir_conn *c)
{
    struct tenantdir *d = c->dir;
    if (!d)
        return;
    for (struct registry_buf *b = d->members, *next; b; b = next) {
        next = b->lent_next;
        if (!b->lent)
            continue; /* the daemon holds it: never FREE */
        struct handoff_entry *e = handoff_entry_at(d->map, b->pb->slot);
        uint64_t w = atomic_load(&e->word);
        if (handoff_state_of(w) != HANDOFF_FREE || handoff_count_of(w) || (w & (HANDOFF_LISTED | HANDOFF_OUT)))
            continue;
        /* FREE, no hold, on no list: a push cut short. OUT makes a live pusher's next CAS
         * fail (it then gives the buffer to us: a giveback, ignored once it has ended). */
        if (atomic_compare_exchange_strong(&e->word, &w, w | HANDOFF_OUT)) {
            t->st.repaired++;
            member_end(t, d, b);
        }
    }
}

struct registry_buf *tenantdir_member(const struct tenantdirs *t, const struct tenantdir_conn *c, uint64_t buf_id)
{
    if (!t || !c->dir || !t->at)
        return NULL;
    uint32_t slot = pool_slot_of(t->pool, buf_id, c->dir->uid);
    struct registry_buf *b = slot < HANDOFF_MAX_SLOTS ? t->at[slot] : NULL;
    return b && b->table && b->pb->id == buf_id && b->tenant == c->dir->uid ? b : NULL;
}

void tenantdir_giveback(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id)
{
    struct registry_buf *b = tenantdir_member(t, c, buf_id);
    if (!b || !b->lent) {
        if (t)
            t->st.ignored++;
        return;
    }
    uint64_t w = atomic_load(&handoff_entry_at(c->dir->map, b->pb->slot)->word);
    if (handoff_count_of(w) || handoff_state_of(w) != HANDOFF_FREE || !(w & HANDOFF_OUT) || (w & HANDOFF_LISTED)) {
        t->st.ignored++;
        return;
    }
    t->st.givebacks++;
    member_end(t, c->dir, b);
}

int tenantdir_adopt(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id, uint32_t seq,
                    struct registry_buf **ret)
{
    struct registry_buf *b = tenantdir_member(t, c, buf_id);
    if (!b || !b->lent || handoff_hold(c->dir->map, b->pb->slot, seq, HANDOFF_TRIES) < 0)
        return -ESTALE;
    int r = registry_lent_revive(t->reg, b, NULL, b->pb->size, NULL, 0);
    if (r < 0) {
        if (daemon_give(c->dir, b))
            member_end(t, c->dir, b);
        return r;
    }
    t->st.adopts++;
    *ret = b;
    return 0;
}

bool tenantdir_holds(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t *visits)
{
    if (!t || !c->dir)
        return false;
    /* CLOSED, then the counts (seq_cst both sides): a hold the client takes after this
     * read sees CLOSED and is given back by the client; one taken before is seen here,
     * and CLOSED is cleared again (the connection is not idle after all). */
    atomic_store(handoff_journal_flag(c->journal), 1u);
    const struct registry_buf *hint = c->hint ? t->at[c->hint - 1] : NULL;
    bool held = hint && hint->tenant == c->dir->uid && atomic_load(&c->journal[hint->pb->slot]);
    uint64_t n = 0;
    for (const struct registry_buf *b = c->dir->members; b && !held; b = b->lent_next, n++)
        if (atomic_load(&c->journal[b->pb->slot])) {
            c->hint = b->pb->slot + 1;
            held = true;
        }
    *visits += n;
    t->st.idle_visits += n;
    if (held)
        atomic_store(handoff_journal_flag(c->journal), 0u);
    return held;
}

bool tenantdir_holds_buf(const struct tenantdirs *t, const struct tenantdir_conn *c, const struct registry_buf *b)
{
    return t && c->dir && b->table && b->tenant == c->dir->uid && atomic_load(&c->journal[b->pb->slot]) != 0;
}

uint64_t tenantdir_members(const struct tenantdirs *t)
{
    uint64_t n = 0;
    for (const struct tenantdir *d = t ? t->head : NULL; d; d = d->next)
        n += d->nmembers;
    return n;
}

void tenantdir_check(struct tenantdirs *t)
{
    if (!t || !t->reg)
        return;
    uint64_t members = 0, lent = 0;
    const char *why = NULL;
    for (const struct tenantdir *d = t->head; d && !why; d = d->next) {
        uint64_t n = 0;
        for (const struct registry_buf *b = d->members; b && !why; b = b->lent_next, n++) {
            if (!b->table || b->tenant != d->uid)
                why = "a member of a table without the registry's table flag, or of another uid";
            else if (b->pb->slot >= HANDOFF_MAX_SLOTS || t->at[b->pb->slot] != b)
                why = "a member not in the slot index";
            lent += b->lent;
        }
        if (!why && n != d->nmembers)
            why = "a members list whose length is not its count";
        members += n;
    }
    if (!why && members != t->nat)
        why = "the slot index holds other buffers than the members";
    else if (!why && lent != registry_stats(t->reg).lent)
        why = "the LENT members are not the registry's LENT buffers";
    if (!why || t->drift_logged)
        return;
    t->drift_logged = true;
    log_error("tables disagree with themselves: %s (%llu members, %llu in the slot index, %llu LENT, registry %llu LENT)",
              why, (unsigned long long)members, (unsigned long long)t->nat, (unsigned long long)lent,
              (unsigned long long)registry_stats(t->reg).lent);
#ifdef SHMREF_LEDGER_CHECK
    abort();
#endif
}

void tenantdir_free(struct tenantdirs *t)
{
    if (!t->reg)
        return;
    while (t->head) {
        struct tenantdir *d = t->head;
        while (d->conns) { /* sessions end first; this is only a net */
            struct tenantdir_conn *c = d->conns;
            d->conns = c->next;
            munmap((void *)c->journal, HANDOFF_JOURNAL_SIZE);
            *c = (struct tenantdir_conn){ 0 };
        }
        table_back(t, d);
    }
    registry_set_lender(t->reg, NULL);
    free(t->at);
    t->at = NULL;
    t->reg = NULL;
}
