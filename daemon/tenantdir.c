/* SPDX-License-Identifier: MIT */
/* tenantdir.c: see tenantdir.h. The recycle handshake (proto/ledger.h): at a buffer's end
 * ledger_mark withdraws its entry (seq_cst), then the ledgers of its uid's connections
 * that were sent its fd are read; all 0: ledger_unmark, and the buffer ends as it always
 * did. Otherwise it is LENT, on its directory's list, until a nudge, a forget or a
 * disconnect finds every count at 0. Work is bounded by what triggered it: a nudge or a
 * forget reads one buffer's ledgers, a disconnect the LENT buffers that connection knew. */
#include "tenantdir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "ledger.h"
#include "log.h"

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct tenantdir {
    uint32_t uid;
    int fd;                             /* sent to each ledger connection of uid */
    void *map;                          /* read-write: ledger_mark and ledger_unmark */
    struct tenantdir_conn *conns;
    unsigned nconns;
    struct registry_buf *lent;          /* LENT buffers of uid (registry_buf.lent_next) */
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
    uint8_t key[16];
    if (getrandom(key, sizeof(key), GRND_NONBLOCK) != (ssize_t)sizeof(key))
        return errno == EAGAIN ? -EAGAIN : -EIO;
    /* The LENT buffers by slot, for every uid (a slot is one buffer's): found in O(1) by a
     * nudge or forget, whatever their number. Made with the first directory. */
    if (!t->lent_at && !(t->lent_at = calloc(LEDGER_SLOTS, sizeof(*t->lent_at))))
        return -ENOMEM;
    struct tenantdir *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    int fd = sealed_memfd("shmrefd-ledger-dir", LEDGER_DIR_SIZE, PROT_READ | PROT_WRITE, &d->map);
    if (fd < 0) {
        free(d);
        return fd;
    }
    /* the header is written before the seals' file is sent to anyone */
    ledger_dir_init(d->map, uid, key);
    memset(key, 0, sizeof(key));
    d->fd = fd;
    d->uid = uid;
    d->next = t->head;
    t->head = d;
    t->st.dirs++;
    *ret = d;
    return 0;
}

static void dir_free(struct tenantdirs *t, struct tenantdir *d)
{
    for (struct tenantdir **pp = &t->head; *pp; pp = &(*pp)->next)
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    munmap(d->map, LEDGER_DIR_SIZE);
    close(d->fd);
    t->st.dirs--;
    free(d);
}

/* ---- the handshake ----------------------------------------------------------------- */

static bool conn_knows(const struct tenantdir_conn *c, uint64_t buf_id)
{
    return buf_id && buf_id < (UINT64_C(1) << 63) &&
           (idset_has(c->known, buf_id << 1) || idset_has(c->known, buf_id << 1 | 1));
}

/* held: whether a ledger of d's uid that was sent b's fd counts a hold on b's slot. Only
 * those are read: a count for any other slot, or from a connection that does not map the
 * buffer, keeps nothing. */
static bool held(const struct tenantdir *d, const struct registry_buf *b)
{
    for (const struct tenantdir_conn *c = d->conns; c; c = c->next)
        if (conn_knows(c, b->pb->id) && ledger_held(c->counts, b->pb->slot) != 0)
            return true;
    return false;
}

static void lent_link(struct tenantdirs *t, struct tenantdir *d, struct registry_buf *b)
{
    t->lent_at[b->pb->slot] = b; /* slot < LEDGER_SLOTS: lend checked it */
    b->lent_prev = NULL;
    b->lent_next = d->lent;
    if (d->lent)
        d->lent->lent_prev = b;
    d->lent = b;
}

static void lent_unlink(struct tenantdirs *t, struct tenantdir *d, struct registry_buf *b)
{
    if (t->lent_at[b->pb->slot] == b)
        t->lent_at[b->pb->slot] = NULL;
    if (b->lent_prev) b->lent_prev->lent_next = b->lent_next; else d->lent = b->lent_next;
    if (b->lent_next) b->lent_next->lent_prev = b->lent_prev;
    b->lent_prev = b->lent_next = NULL;
}

/* lend: the registry's lender: b's last daemon reference went. */
static bool lend(void *arg, struct registry_buf *b)
{
    struct tenantdirs *t = arg;
    struct tenantdir *d = dir_find(t, b->tenant);
    uint32_t slot = b->pb->slot;
    if (!d || slot >= LEDGER_SLOTS)
        return false;
    ledger_mark(d->map, slot); /* seq_cst: before any count is read */
    if (!held(d, b)) {
        ledger_unmark(d->map, slot);
        return false;
    }
    lent_link(t, d, b);
    t->st.recycle_waits++;
    return true;
}

/* unlend: the registry's: b (LENT) was revived by a daemon acquire (registry_revive): off
 * the list, its directory entry FREE (its publish is the daemon's to answer again: local
 * takes of it fall back). A hold counted meanwhile is still read when b ends again. */
static void unlend(void *arg, struct registry_buf *b)
{
    struct tenantdirs *t = arg;
    struct tenantdir *d = dir_find(t, b->tenant);
    if (!d)
        return;
    ledger_unmark(d->map, b->pb->slot);
    lent_unlink(t, d, b);
}

/* recheck: b (LENT, on d's list) ends once no ledger holds it. */
static void recheck(struct tenantdirs *t, struct tenantdir *d, struct registry_buf *b)
{
    if (held(d, b))
        return;
    ledger_unmark(d->map, b->pb->slot);
    lent_unlink(t, d, b);
    registry_lent_end(t->reg, b);
}

/* lent_find: d's LENT buffer buf_id, or NULL; O(1) (a client's nudges and forgets choose
 * buf_id: no walk of a list whose length they could grow). */
static struct registry_buf *lent_find(const struct tenantdirs *t, const struct tenantdir *d, uint64_t buf_id)
{
    uint32_t slot = pool_slot_of(t->pool, buf_id, d->uid);
    struct registry_buf *b = slot < LEDGER_SLOTS ? t->lent_at[slot] : NULL;
    return b && b->pb->id == buf_id && b->tenant == d->uid ? b : NULL;
}

/* ---- connections ------------------------------------------------------------------- */

void tenantdir_init(struct tenantdirs *t, struct registry *reg, struct pool *pool, struct counters *counters)
{
    *t = (struct tenantdirs){ .reg = reg, .pool = pool, .counters = counters };
    registry_set_lender(reg, lend, unlend, t);
}

int tenantdir_join(struct tenantdirs *t, uint32_t uid, const struct idset *known, struct tenantdir_conn *c,
                   int ret_fds[2])
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
    int fd = sealed_memfd("shmrefd-ledger", LEDGER_COUNTS_SIZE, PROT_READ, &map);
    if (fd < 0) {
        r = fd;
        if (made)
            dir_free(t, d);
        goto fail;
    }
    *c = (struct tenantdir_conn){ .dir = d, .counts = map, .known = known, .next = d->conns };
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    d->nconns++;
    t->st.ledgers++;
    ret_fds[0] = d->fd;
    ret_fds[1] = fd;
    return 0;
fail:
    if (!t->failed_logged) {
        t->failed_logged = true;
        log_warning("cannot make a ledger for uid %u: %s; its connections (and others that fail the same way, "
                    "not logged again) get no same-tenant handoffs without the daemon",
                    (unsigned)uid, strerror(-r));
    }
    return r;
}

void tenantdir_leave(struct tenantdirs *t, struct tenantdir_conn *c)
{
    struct tenantdir *d = c->dir;
    if (!d)
        return;
    if (c->prev) c->prev->next = c->next; else d->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    d->nconns--;
    t->st.ledgers--;
    /* From here its counts are read no more (a dead connection's holds die with it). */
    for (struct registry_buf *b = d->lent, *next; b; b = next) {
        next = b->lent_next;
        if (!d->nconns || conn_knows(c, b->pb->id))
            recheck(t, d, b);
    }
    munmap((void *)c->counts, LEDGER_COUNTS_SIZE);
    *c = (struct tenantdir_conn){ 0 };
    if (!d->nconns)
        dir_free(t, d);
}

void tenantdir_took(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id,
                    const uint8_t token[PROTO_TOKEN_LEN])
{
    struct registry_buf *b = NULL;
    /* A TOOK may come before the producer's publish: the producer writes the directory,
     * then sends the publish on its own connection, which the loop may read after the
     * consumer's. Counted then, it ends a max_acquires retention at the publish instead
     * of at its keep deadline (Dask keeps frames 60 s). */
    if (t && c->dir && conn_knows(c, buf_id) && !(b = registry_find(t->reg, token)))
        b = registry_find_writing(t->reg, token);
    if (!b || b->tenant != c->dir->uid || b->pb->id != buf_id) {
        if (t)
            t->st.ignored++;
        return;
    }
    /* registry_find(_writing) compared the whole token, in constant time (desc_token_equal) */
    registry_acquired(t->reg, b);
    t->counters->acquires++;
    t->st.took++;
}

void tenantdir_nudge(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id)
{
    if (!t || !c->dir) {
        if (t)
            t->st.ignored++;
        return;
    }
    t->st.nudges++;
    struct registry_buf *b = lent_find(t, c->dir, buf_id);
    if (b)
        recheck(t, c->dir, b);
}

void tenantdir_forgot(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id)
{
    if (!t || !c->dir)
        return;
    struct registry_buf *b = lent_find(t, c->dir, buf_id);
    if (b)
        recheck(t, c->dir, b);
}

bool tenantdir_holds(const struct tenantdirs *t, const struct tenantdir_conn *c)
{
    if (!t || !c->dir)
        return false;
    for (uint32_t i = 0; i < c->known->cap; i++) {
        uint64_t key = c->known->slots[i];
        uint32_t slot = key ? pool_slot_of(t->pool, key >> 1, c->dir->uid) : LEDGER_NO_SLOT;
        if (slot != LEDGER_NO_SLOT && ledger_held(c->counts, slot))
            return true;
    }
    return false;
}

bool tenantdir_holds_buf(const struct tenantdirs *t, const struct tenantdir_conn *c, const struct registry_buf *b)
{
    return t && c->dir && b->tenant == c->dir->uid && b->pb->slot < LEDGER_SLOTS && conn_knows(c, b->pb->id) &&
           ledger_held(c->counts, b->pb->slot) != 0;
}

uint64_t tenantdir_lent(const struct tenantdirs *t)
{
    return t && t->reg ? registry_stats(t->reg).lent : 0;
}

void tenantdir_free(struct tenantdirs *t)
{
    if (!t->reg)
        return;
    while (t->head) {
        struct tenantdir *d = t->head;
        while (d->lent) {
            struct registry_buf *b = d->lent;
            ledger_unmark(d->map, b->pb->slot);
            lent_unlink(t, d, b);
            registry_lent_end(t->reg, b);
        }
        while (d->conns) { /* sessions end first; this is only a net */
            struct tenantdir_conn *c = d->conns;
            d->conns = c->next;
            munmap((void *)c->counts, LEDGER_COUNTS_SIZE);
            *c = (struct tenantdir_conn){ 0 };
        }
        dir_free(t, d);
    }
    registry_set_lender(t->reg, NULL, NULL, NULL);
    free(t->lent_at);
    t->lent_at = NULL;
    t->reg = NULL;
}
