/* SPDX-License-Identifier: MIT */
/* lease.c: see lease.h. Order of an attempt: the size class, a warm buffer of the
 * tenant's (taken before the charge: if its clients still map it, its bytes are charged
 * as pinned until it is taken, and must not count twice), the charge (refused for quota,
 * the tenant's oldest retained buffers that nobody holds are reclaimed first), then the
 * pool. */
#include "lease.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "access.h"
#include "ledgers.h"
#include "units.h"

#define POOL_FULL_HINT_MAX 400

/* pool_full_msg: why a buffer of csize bytes does not fit in the pool, with the numbers. */
static void pool_full_msg(struct broker *bk, uint64_t csize, char *msg, size_t cap)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], d[UNITS_TEXT_MAX], e[UNITS_TEXT_MAX], pinned[160] = "";
    struct registry_stats st = registry_stats(bk->reg);
    uint64_t pin = pool_bytes_pinned(bk->pool);
    if (pin)
        snprintf(pinned, sizeof(pinned), ", and %s (%llu bytes) pinned (retired buffers that clients still map)",
                 units_format(pin, e), (unsigned long long)pin);
    char raise[POOL_FULL_HINT_MAX] = ""; /* a private daemon's user has no flags: the knobs it has */
    if (bk->opt->private_config)
        snprintf(raise, sizeof(raise), "; raise this private shmrefd's pool with SHMREF_POOL_SIZE=SIZE where it "
                 "is started, or pool-size = SIZE in %.200s, then kill %d (the next connect starts it anew)",
                 bk->opt->private_config, (int)getpid());
    snprintf(msg, cap, "pool full: %s (%llu bytes) held%s of %s (%llu bytes); a %s (%llu bytes) buffer does not fit%s",
             units_format(st.bytes, a), (unsigned long long)st.bytes, pinned,
             units_format(pool_cap(bk->pool), b), (unsigned long long)pool_cap(bk->pool),
             units_format(csize, d), (unsigned long long)csize, raise);
}

/* hold: the buffer pb is here for a charged attempt: register it (the registry takes the
 * charge) and hold it for the peer. Returns 0, or -errno with msg (the charge is back). */
static int hold(struct lease_attempt *a, struct pool_buf *pb, char *msg, size_t cap)
{
    struct broker *bk = a->bk;
    struct registry_buf *b = registry_buf_charged(bk->reg, pb, &a->charge, a->size);
    if (!b) {
        int e = errno;
        registry_abandon(bk->reg, &a->charge, pb);
        if (e == ENOMEM)
            snprintf(msg, cap, "daemon out of memory");
        else
            snprintf(msg, cap, "no random token for the lease: getrandom: %s", strerror(e));
        return -e;
    }
    if (registry_hold(bk->reg, &a->p->holder, b, true, &a->handle) < 0) {
        registry_buf_drop(bk->reg, b); /* credits and returns the buffer */
        a->handle = 0;
        snprintf(msg, cap, "daemon out of memory");
        return -ENOMEM;
    }
    b->producer_pid = (int32_t)a->p->pid;
    b->for_table = a->for_table;
    a->buf = b;
    return 0;
}

static void created(struct pool *pool, struct pool_buf *pb, int err, void *data)
{
    struct lease_attempt *a = data;
    struct broker *bk = a->bk;
    struct broker_peer *p = a->p;
    char msg[PROTO_MAX_ERRMSG], x[UNITS_TEXT_MAX], y[UNITS_TEXT_MAX];
    uint64_t csize = a->charge.bytes;
    int r;

    p->pending--;
    bk->pending_bytes -= csize;
    if (err < 0) {
        registry_abandon(bk->reg, &a->charge, NULL);
        log_error("creating a %llu-byte buffer in %s failed: %s (%llu bytes available there)",
                  (unsigned long long)csize, pool_dir(pool), strerror(-err),
                  (unsigned long long)pool_fs_available(pool));
        snprintf(msg, sizeof(msg), "cannot reserve %s (%llu bytes) in %s: %s; %s available there",
                 units_format(csize, x), (unsigned long long)csize, pool_dir(pool), strerror(-err),
                 units_format(pool_fs_available(pool), y));
        r = err;
    } else if (a->cancelled || p->closing || bk->stopping) {
        registry_abandon(bk->reg, &a->charge, pb);
        r = -ECANCELED;
    } else {
        r = hold(a, pb, msg, sizeof(msg));
    }
    a->done(a, r, r < 0 ? msg : NULL); /* may free a */
    p->ops->unref(p);
    ledgers_check(bk);
}

/* stock_refusal: why a stock lease of class cls does not fit (its size, the uid's stock
 * cap, the reserve), with the numbers in msg, or NULL when it fits. */
static const char *stock_refusal(struct broker *bk, struct broker_peer *p, const struct pool_cls *cls, char *msg,
                                 size_t cap)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], c[UNITS_TEXT_MAX];
    const struct options *o = bk->opt;
    uint64_t mine = quota_stock_held(bk->quota, p->uid);
    if (cls->size > o->stock_max_lease)
        snprintf(msg, cap, "a stock lease of %s (%llu bytes) exceeds the largest stock lease %s (%llu bytes)",
                 units_format(cls->size, a), (unsigned long long)cls->size, units_format(o->stock_max_lease, b),
                 (unsigned long long)o->stock_max_lease);
    else if (mine + cls->size > o->stock_per_uid)
        snprintf(msg, cap, "uid %u's stock holds %s (%llu bytes); %s (%llu bytes) more would pass its stock cap "
                 "%s (%llu bytes)", (unsigned)p->uid, units_format(mine, a), (unsigned long long)mine,
                 units_format(cls->size, b), (unsigned long long)cls->size, units_format(o->stock_per_uid, c),
                 (unsigned long long)o->stock_per_uid);
    else if (!pool_stock_room(bk->pool, cls->size))
        snprintf(msg, cap, "the stock reserve is full: %s (%llu bytes) of %s (%llu bytes) held; %s (%llu bytes) asked",
                 units_format(pool_bytes_stock(bk->pool), a), (unsigned long long)pool_bytes_stock(bk->pool),
                 units_format(pool_stock_reserve(bk->pool), b), (unsigned long long)pool_stock_reserve(bk->pool),
                 units_format(cls->size, c), (unsigned long long)cls->size);
    else
        return NULL;
    return msg;
}

void lease_stock_refuse(struct broker *bk, struct broker_peer *p, uint32_t id, const char *msg)
{
    bk->counters->stock_refused++;
    p->ops->refuse(p, id, EAGAIN, msg);
}

int lease_attempt(struct lease_attempt *a, char *msg, size_t cap)
{
    struct broker *bk = a->bk;
    struct broker_peer *p = a->p;
    struct pool_cls cls;
    a->buf = NULL;
    a->handle = 0;
    a->charge = (struct quota_ticket){ 0 };
    if (pool_class(bk->pool, a->size, &cls) < 0) {
        snprintf(msg, cap, "lease size beyond every size class");
        return -EFBIG;
    }
    a->csize = cls.size;
    if (a->stock && stock_refusal(bk, p, &cls, msg, cap))
        return -EAGAIN;
    cls.stock = a->stock;
    struct pool_buf *warm = pool_take_warm(bk->pool, &cls, p->uid);
    int r = quota_take(bk->quota, p->uid, cls.size, &a->charge, msg, cap);
    /* What the tenant retained and nobody holds goes first, oldest first: retention
     * alone never makes its own tenant's lease fail for quota. Only if that makes room
     * (a lease refused anyway takes nothing); a lease that waits for quota is slowed by
     * its consumers instead (they take what is retained). */
    if (r == -EDQUOT && !a->waits &&
        quota_held(bk->quota, p->uid) + cls.size <=
            quota_limit(bk->quota, p->uid) + registry_reclaimable(bk->reg, p->uid))
        while (r == -EDQUOT && registry_reclaim_retained(bk->reg, p->uid))
            r = quota_take(bk->quota, p->uid, cls.size, &a->charge, msg, cap);
    /* Free buffers of the tenant's own table are its to give back for its lease. */
    if (r == -EDQUOT && registry_reclaim_table(bk->reg, p->uid, cls.size)) {
        /* A reclaimed buffer the tenant still maps is warm and pinned to it (its quota):
         * this lease takes it, which unpins it, before the quota is asked again. */
        if (!warm)
            warm = pool_take_warm(bk->pool, &cls, p->uid);
        r = quota_take(bk->quota, p->uid, cls.size, &a->charge, msg, cap);
    }
    if (r < 0) {
        if (warm)
            pool_untake(bk->pool, warm);
        return r;
    }
    if (warm)
        return hold(a, warm, msg, cap);
    struct pool_buf *pb = NULL;
    r = pool_get_class(bk->pool, &cls, p->uid, &pb, created, a);
    /* The pool is full: free buffers in the tables (its own first, then every tenant's)
     * are the pool's to take back before a lease is refused for space. */
    if (r == -ENOSPC && (registry_reclaim_table(bk->reg, p->uid, cls.size) ||
                         registry_reclaim_table(bk->reg, UINT32_MAX, cls.size)))
        r = pool_get_class(bk->pool, &cls, p->uid, &pb, created, a);
    if (r == 1) {
        p->ops->ref(p);
        p->pending++;
        bk->pending_bytes += cls.size;
        return 1;
    }
    if (r == 0)
        return hold(a, pb, msg, cap);
    registry_abandon(bk->reg, &a->charge, NULL);
    if (r == -ENOSPC)
        pool_full_msg(bk, cls.size, msg, cap);
    else if (r == -EAGAIN) /* a stock lease: the reserve has no room even after evicting */
        (void)(stock_refusal(bk, p, &cls, msg, cap) || snprintf(msg, cap, "the stock reserve is full"));
    else if (r == -EMFILE)
        snprintf(msg, cap, "daemon at its fd limit: its buffers hold %llu fds of the %llu it allows itself "
                 "(three quarters of RLIMIT_NOFILE); release buffers or raise LimitNOFILE",
                 (unsigned long long)pool_fds(bk->pool), (unsigned long long)pool_fd_budget(bk->pool));
    else
        snprintf(msg, cap, "lease failed: %s", strerror(-r));
    return r;
}

/* ---- a single lease ---------------------------------------------------------------- */

struct single {
    struct lease_attempt a;
    uint32_t id;
};

/* single_answer: the attempt of a single lease ended (r as lease_attempt's). */
static void single_answer(struct single *s, int r, const char *msg)
{
    struct lease_attempt *a = &s->a;
    if (r == 0) {
        a->bk->counters->leases++;
        a->bk->counters->stock_leases += a->stock;
        peer_send_buffer(a->p, s->id, a->handle, a->buf, a->buf->pb->fd);
    } else if (r == -EAGAIN && a->stock && !a->p->closing) {
        lease_stock_refuse(a->bk, a->p, s->id, msg);
    } else if (r != -ECANCELED && !a->p->closing) {
        peer_refuse(a->bk, a->p, s->id, -r, "lease", msg);
    }
}

static void single_done(struct lease_attempt *a, int err, const char *msg)
{
    struct single *s = (struct single *)a;
    single_answer(s, err, msg);
    free(s);
}

int lease_one(struct broker *bk, struct broker_peer *p, uint32_t id, uint64_t size, bool waits, uint32_t flags,
              char *msg, size_t cap)
{
    bool stock = (flags & PROTO_LEASE_STOCK) != 0;
    struct pool_cls cls;
    if (pool_class(bk->pool, size, &cls) < 0) {
        peer_refuse(bk, p, id, EFBIG, "lease", "lease size beyond every size class");
        return 0;
    }
    if (!lease_fd_share_left(bk, p, id, 1, "lease"))
        return 0;
    struct single *s = malloc(sizeof(*s));
    if (!s) {
        peer_fail(p, id, ENOMEM, "daemon out of memory");
        return 0;
    }
    *s = (struct single){ .a = { .bk = bk, .p = p, .size = size, .waits = waits, .stock = stock,
                                 .for_table = (flags & PROTO_LEASE_TABLE) != 0, .done = single_done },
                         .id = id };
    int r = lease_attempt(&s->a, msg, cap);
    if (r == 1)
        return 0; /* single_done answers */
    if (r == -EDQUOT || r == -ENOSPC) {
        free(s);
        return r;
    }
    single_answer(s, r, msg);
    free(s);
    return 0;
}

bool lease_fd_share_left(struct broker *bk, struct broker_peer *p, uint32_t id, uint32_t n, const char *what)
{
    if (access_operator(p->uid))
        return true;
    uint64_t share = pool_fd_budget(bk->pool) / 2, held = quota_buffers(bk->quota, p->uid);
    if (held + n <= share)
        return true;
    char msg[PROTO_MAX_ERRMSG];
    if (n == 1)
        snprintf(msg, sizeof(msg),
                 "uid %u holds %llu buffers, its share of the daemon's fd budget (half of %llu, three quarters "
                 "of RLIMIT_NOFILE); release buffers or raise LimitNOFILE",
                 (unsigned)p->uid, (unsigned long long)held, (unsigned long long)pool_fd_budget(bk->pool));
    else
        snprintf(msg, sizeof(msg), "uid %u holds %llu buffers; %u more would pass its share of the daemon's fd "
                 "budget (half of %llu); release buffers or raise LimitNOFILE", (unsigned)p->uid,
                 (unsigned long long)held, (unsigned)n, (unsigned long long)pool_fd_budget(bk->pool));
    peer_refuse(bk, p, id, EMFILE, what, msg);
    return false;
}

bool lease_beyond_all(struct broker *bk, struct broker_peer *p, uint32_t id, const uint64_t *sizes, uint32_t n,
                      const char *what)
{
    char msg[PROTO_MAX_ERRMSG], a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct pool_cls cls;
        if (pool_class(bk->pool, sizes[i], &cls) < 0)
            return false; /* the attempt refuses it (EFBIG) */
        sum += cls.size;
    }
    uint64_t quota = quota_limit(bk->quota, p->uid), cap = pool_cap(bk->pool);
    if (sum > quota) {
        snprintf(msg, sizeof(msg), "%s of %s (%llu bytes, size classes included) is more than uid %u's whole quota "
                 "%s (%llu bytes): waiting cannot make it fit", what, units_format(sum, a), (unsigned long long)sum,
                 (unsigned)p->uid, units_format(quota, b), (unsigned long long)quota);
        peer_refuse(bk, p, id, EDQUOT, what, msg);
        return true;
    }
    if (sum > cap) {
        snprintf(msg, sizeof(msg), "%s of %s (%llu bytes, size classes included) is more than the whole pool "
                 "%s (%llu bytes): waiting cannot make it fit", what, units_format(sum, a), (unsigned long long)sum,
                 units_format(cap, b), (unsigned long long)cap);
        peer_refuse(bk, p, id, ENOSPC, what, msg);
        return true;
    }
    return false;
}
