/* SPDX-License-Identifier: MIT */
/* broker.c: see broker.h. Order of a lease: limits, then the size class (computed once),
 * then the tenant's quota is charged (a ticket), then the pool is asked (warm buffer now,
 * or a new one reserved off the loop). The ticket travels with the lease into the
 * registry; every failure on the way hands it to registry_abandon, the same one place
 * that credits a buffer's charge at its end. A lease refused EDQUOT/ENOSPC that asked to
 * wait, and an acquire of a leased but unpublished token that asked to, are parked in
 * bk->waiters (waiters.c) and served here when the registry says space freed or the
 * buffer is published; batches (lease_many, release_many) come last in this file. */
#include "broker.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "units.h"

struct pending_lease {
    struct broker *broker;
    struct broker_peer *peer;
    uint32_t id;
    uint64_t size;
    struct quota_ticket charge;  /* for the class size */
};

static void fail(struct broker_peer *p, uint32_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(struct broker_peer *p, uint32_t id, int code, const char *fmt, ...)
{
    char msg[PROTO_MAX_ERRMSG + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    p->ops->refuse(p, id, code, msg);
}

static void refuse(struct broker *bk, struct broker_peer *p, uint32_t id, int code, const char *what,
                   const char *msg)
{
    struct counters *k = bk->counters;
    switch (code) {
    case EDQUOT: k->refused_quota++; break;
    case ENOSPC: k->refused_space++; break;
    case EMFILE: case EFBIG: k->refused_limit++; break;
    default: k->refused_other++; break;
    }
    quota_note_refusal(bk->quota, p->uid, code);
    unsigned held_back;
    bool ok = log_rate_take(&p->log_rate, &held_back);
    if (held_back)
        log_notice("client %llu pid=%d uid=%u: suppressed %u refusal line%s in the last second",
                   (unsigned long long)p->id, (int)p->pid, (unsigned)p->uid, held_back, held_back == 1 ? "" : "s");
    if (ok)
        log_notice("refused %s for client %llu pid=%d uid=%u: %s", what, (unsigned long long)p->id,
                   (int)p->pid, (unsigned)p->uid, msg);
    p->ops->refuse(p, id, code, msg);
}

/* send_buffer: a lease or acquire reply; whether the fd really travels is the session's
 * business (fd-once). */
static void send_buffer(struct broker_peer *p, uint32_t id, uint64_t handle, struct registry_buf *b, int fd)
{
    struct proto_msg r = { .op = PROTO_OP_LEASE + PROTO_OP_REPLY, .id = id };
    r.u.lease_reply.handle = handle;
    r.u.lease_reply.buf_id = b->pb->id;
    memcpy(r.u.lease_reply.token, b->token, PROTO_TOKEN_LEN); /* given at lease, kept at publish */
    r.u.lease_reply.size = b->size;
    r.u.lease_reply.capacity = b->pb->size;
    if (b->published) {
        r.op = PROTO_OP_ACQUIRE + PROTO_OP_REPLY;
        r.u.acquire_reply.meta = b->meta;
        r.u.acquire_reply.meta_len = b->meta_len;
        r.u.acquire_reply.flags = (b->pb->sealed ? PROTO_BUF_SEALED : 0) |
                                  (p->uid != b->tenant ? PROTO_BUF_FOREIGN : 0);
    }
    p->ops->reply(p, &r, fd);
}

/* lease_finish: a buffer is ready for a charged lease: register (the registry takes the
 * charge), hold, reply. */
static void lease_finish(struct broker *bk, struct broker_peer *p, uint32_t id, struct pool_buf *pb,
                         uint64_t size, struct quota_ticket *charge)
{
    uint64_t handle;
    struct registry_buf *b = registry_buf_charged(bk->reg, pb, charge, size);
    if (!b) {
        int e = errno;
        registry_abandon(bk->reg, charge, pb);
        if (e == ENOMEM)
            fail(p, id, ENOMEM, "daemon out of memory");
        else
            fail(p, id, e, "no random token for the lease: getrandom: %s", strerror(e));
        return;
    }
    if (registry_hold(bk->reg, &p->holder, b, true, &handle) < 0) {
        registry_buf_drop(bk->reg, b); /* credits and returns the buffer */
        fail(p, id, ENOMEM, "daemon out of memory");
        return;
    }
    b->producer_pid = (int32_t)p->pid;
    bk->counters->leases++;
    send_buffer(p, id, handle, b, pb->fd);
}

static void lease_created(struct pool *pool, struct pool_buf *pb, int err, void *data)
{
    struct pending_lease *pl = data;
    struct broker *bk = pl->broker;
    struct broker_peer *p = pl->peer;
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];

    uint64_t csize = pl->charge.bytes;
    p->pending--;
    bk->pending_bytes -= csize;
    if (err < 0) {
        registry_abandon(bk->reg, &pl->charge, NULL);
        log_error("creating a %llu-byte buffer in %s failed: %s (%llu bytes available there)",
                  (unsigned long long)csize, pool_dir(pool), strerror(-err),
                  (unsigned long long)pool_fs_available(pool));
        if (!p->closing) {
            char msg[PROTO_MAX_ERRMSG];
            snprintf(msg, sizeof(msg), "cannot reserve %s (%llu bytes) in %s: %s; %s available there",
                     units_format(csize, a), (unsigned long long)csize, pool_dir(pool),
                     strerror(-err), units_format(pool_fs_available(pool), b));
            refuse(bk, p, pl->id, err == -ENOSPC ? ENOSPC : -err, "lease", msg);
        }
    } else if (p->closing || bk->stopping) {
        registry_abandon(bk->reg, &pl->charge, pb);
    } else {
        lease_finish(bk, p, pl->id, pb, pl->size, &pl->charge);
    }
    p->ops->unref(p);
    free(pl);
    broker_check(bk);
}

static bool leases_left(struct broker *bk, struct broker_peer *p, uint32_t id, const char *what)
{
    unsigned n = p->holder.leases + p->pending + p->parked;
    if (n < bk->opt->max_leases)
        return true;
    char msg[PROTO_MAX_ERRMSG], parked[64] = "";
    if (p->parked)
        snprintf(parked, sizeof(parked), " (%u of them waiting)", p->parked);
    snprintf(msg, sizeof(msg), "too many leases on this connection: %u held%s, limit %u", n, parked,
             bk->opt->max_leases);
    refuse(bk, p, id, EMFILE, what, msg);
    return false;
}

/* fd_share_left: every buffer is one of the daemon's fds, and the pool's fd budget
 * (three quarters of RLIMIT_NOFILE) is shared: one tenant may hold at most half of it, so
 * another tenant's lease never finds it taken by one uid's many small leases. Root and
 * the daemon's own uid are exempt (as from the per-uid connection limit). */
static bool fd_share_left(struct broker *bk, struct broker_peer *p, uint32_t id)
{
    if (p->uid == 0 || p->uid == geteuid())
        return true;
    uint64_t share = pool_fd_budget(bk->pool) / 2, held = quota_buffers(bk->quota, p->uid);
    if (held < share)
        return true;
    char msg[PROTO_MAX_ERRMSG];
    snprintf(msg, sizeof(msg),
             "uid %u holds %llu buffers, its share of the daemon's fd budget (half of %llu, three quarters "
             "of RLIMIT_NOFILE); release buffers or raise LimitNOFILE",
             (unsigned)p->uid, (unsigned long long)held, (unsigned long long)pool_fd_budget(bk->pool));
    refuse(bk, p, id, EMFILE, "lease", msg);
    return false;
}

/* pool_full_msg: why a buffer of csize bytes does not fit in the pool, with the numbers. */
static void pool_full_msg(struct broker *bk, uint64_t csize, char *msg, size_t cap)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], d[UNITS_TEXT_MAX], e[UNITS_TEXT_MAX], pinned[160] = "";
    struct registry_stats st = registry_stats(bk->reg);
    uint64_t pin = pool_bytes_pinned(bk->pool);
    if (pin)
        snprintf(pinned, sizeof(pinned), ", and %s (%llu bytes) pinned (retired buffers that clients still map)",
                 units_format(pin, e), (unsigned long long)pin);
    snprintf(msg, cap, "pool full: %s (%llu bytes) held%s of %s (%llu bytes); a %s (%llu bytes) buffer does not fit",
             units_format(st.bytes, a), (unsigned long long)st.bytes, pinned,
             units_format(pool_cap(bk->pool), b), (unsigned long long)pool_cap(bk->pool),
             units_format(csize, d), (unsigned long long)csize);
}

/* lease_refused: the pool said no (other than ENOSPC) to a charged lease (its charge is
 * already back). */
static void lease_refused(struct broker *bk, struct broker_peer *p, uint32_t id, int r)
{
    char msg[PROTO_MAX_ERRMSG];
    if (r == -EMFILE) {
        snprintf(msg, sizeof(msg),
                 "daemon at its fd limit: its buffers hold %llu fds of the %llu it allows itself "
                 "(three quarters of RLIMIT_NOFILE); release buffers or raise LimitNOFILE",
                 (unsigned long long)pool_fds(bk->pool), (unsigned long long)pool_fd_budget(bk->pool));
        refuse(bk, p, id, EMFILE, "lease", msg);
    } else {
        fail(p, id, -r, "lease failed: %s", strerror(-r));
    }
}

/* lease_try: one attempt at a lease that passed the request's checks (size, max-leases).
 * Returns 0 when the lease is answered: served, on its way (a new buffer is being made),
 * or refused with a reply; or -EDQUOT / -ENOSPC with nothing sent and the refusal's text
 * in msg: the caller refuses, or parks the lease until quota or space frees. */
static int lease_try(struct broker *bk, struct broker_peer *p, uint32_t id, uint64_t size, char *msg, size_t cap)
{
    struct pool_cls cls;
    if (pool_class(bk->pool, size, &cls) < 0) {
        refuse(bk, p, id, EFBIG, "lease", "lease size beyond every size class");
        return 0;
    }
    if (!fd_share_left(bk, p, id))
        return 0;
    /* A warm buffer first: if this tenant's clients still map it, its bytes are charged
     * as pinned until it is taken, and must not count twice against the quota. */
    struct pool_buf *warm = pool_take_warm(bk->pool, &cls, p->uid);
    struct quota_ticket charge;
    int r = quota_take(bk->quota, p->uid, cls.size, &charge, msg, cap);
    if (r < 0) {
        if (warm)
            pool_untake(bk->pool, warm);
        if (r == -EDQUOT)
            return r;
        refuse(bk, p, id, -r, "lease", msg);
        return 0;
    }
    if (warm) {
        lease_finish(bk, p, id, warm, size, &charge);
        return 0;
    }
    struct pending_lease *pl = malloc(sizeof(*pl));
    struct pool_buf *pb = NULL;
    if (pl)
        *pl = (struct pending_lease){ .broker = bk, .peer = p, .id = id, .size = size, .charge = charge };
    r = pl ? pool_get_class(bk->pool, &cls, p->uid, &pb, lease_created, pl) : -ENOMEM;
    if (r == 1) {
        p->ops->ref(p);
        p->pending++;
        bk->pending_bytes += cls.size;
        return 0;
    }
    free(pl);
    if (r == 0) {
        lease_finish(bk, p, id, pb, size, &charge);
        return 0;
    }
    registry_abandon(bk->reg, &charge, NULL);
    if (r == -ENOSPC) {
        pool_full_msg(bk, cls.size, msg, cap);
        return r;
    }
    lease_refused(bk, p, id, r);
    return 0;
}

/* park_lease: the lease waits (FIFO behind its tenant's earlier waiters). false: no memory. */
static bool park_lease(struct broker *bk, struct broker_peer *p, uint32_t id, uint64_t size, int blocked,
                       uint32_t wait_ms)
{
    if (!waiters_park_lease(&bk->waiters, p, id, p->uid, size, blocked, wait_ms))
        return false;
    p->parked++;
    bk->counters->lease_waits++;
    return true;
}

/* beyond_all: a waiting lease (n sizes: a batch waits as a unit) asks more than the
 * tenant's whole quota or the whole pool: waiting cannot cure that, so it is refused at
 * once (and never holds up its tenant's later waiters). Returns true after refusing. */
static bool beyond_all(struct broker *bk, struct broker_peer *p, uint32_t id, const uint64_t *sizes, uint32_t n,
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
        refuse(bk, p, id, EDQUOT, what, msg);
        return true;
    }
    if (sum > cap) {
        snprintf(msg, sizeof(msg), "%s of %s (%llu bytes, size classes included) is more than the whole pool "
                 "%s (%llu bytes): waiting cannot make it fit", what, units_format(sum, a), (unsigned long long)sum,
                 units_format(cap, b), (unsigned long long)cap);
        refuse(bk, p, id, ENOSPC, what, msg);
        return true;
    }
    return false;
}

static void do_lease(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    uint64_t size = m->u.lease.size;
    char msg[PROTO_MAX_ERRMSG], a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];

    if (size == 0) {
        fail(p, m->id, EINVAL, "lease size must be at least 1 byte");
        return;
    }
    if (size > bk->opt->max_lease_size) {
        snprintf(msg, sizeof(msg), "lease of %s (%llu bytes) exceeds the maximum lease size %s (%llu bytes)",
                 units_format(size, a), (unsigned long long)size,
                 units_format(bk->opt->max_lease_size, b), (unsigned long long)bk->opt->max_lease_size);
        refuse(bk, p, m->id, EFBIG, "lease", msg);
        return;
    }
    if (!leases_left(bk, p, m->id, "lease"))
        return;
    uint32_t wait = bk->loop ? m->u.lease.wait_ms : 0;
    if (wait > PROTO_MAX_LEASE_WAIT_MS)
        wait = PROTO_MAX_LEASE_WAIT_MS;
    if (wait && beyond_all(bk, p, m->id, &size, 1, "lease"))
        return;
    /* FIFO within a tenant: a waiting lease never overtakes its tenant's earlier waiters. */
    struct waiters_queue *q = wait ? waiters_tenant(&bk->waiters, p->uid) : NULL;
    if (q && park_lease(bk, p, m->id, size, q->tail->blocked, wait))
        return;
    int r = lease_try(bk, p, m->id, size, msg, sizeof(msg));
    if (r == 0)
        return;
    if (wait && park_lease(bk, p, m->id, size, -r, wait))
        return;
    refuse(bk, p, m->id, -r, "lease", msg);
}

static bool batch_retry(struct broker *bk, struct waiter *w);
static void batch_detach(struct waiter *w);

/* retry_leases: quota or pool space may have freed: each tenant's waiting leases are
 * tried in order until one is still blocked (FIFO: the rest stay behind it); a tenant's
 * blocked head never stops another tenant's. Tenants served go to the back, so space that
 * frees a little at a time is shared in turn. */
static void retry_leases(void *arg)
{
    struct broker *bk = arg;
    struct waiters *ws = &bk->waiters;
    char msg[PROTO_MAX_ERRMSG];
    unsigned tenants = 0;
    for (struct waiters_queue *q = ws->tenants_head; q; q = q->next)
        tenants++;
    /* An attempt that fails gives back the charge it just took: that frees nothing, and
     * must not kick another retry (which would spin while a lease waits for space). */
    bk->retrying = true;
    for (unsigned t = 0; t < tenants && ws->tenants_head; t++) {
        struct waiters_queue *q = ws->tenants_head;
        for (;;) {
            struct waiter *w = q->head;
            struct broker_peer *p = w->owner;
            bool last = w->qnext == NULL;
            if (w->busy) { /* a batch whose buffers are being made: the tenant waits for it */
                waiters_tenant_last(ws, q);
                break;
            }
            if (w->data && !p->closing) {
                if (batch_retry(bk, w)) { /* done: served or refused, and removed */
                    if (last)
                        break;
                    continue;
                }
                waiters_tenant_last(ws, q);
                break;
            }
            p->parked -= w->count; /* its place under max-leases goes to the lease, whatever comes */
            if (!p->closing) {
                int r = lease_try(bk, p, w->id, w->size, msg, sizeof(msg));
                if (r < 0) { /* still blocked: the rest of this tenant stays behind it */
                    p->parked += w->count;
                    w->blocked = -r;
                    waiters_tenant_last(ws, q);
                    break;
                }
            }
            waiters_remove(ws, w); /* frees q with its last waiter */
            if (last)
                break;
        }
    }
    bk->retrying = false;
    broker_check(bk);
}

/* lease_expired: a waiting lease's deadline passed: ETIMEDOUT with the numbers. */
static void lease_expired(struct broker *bk, struct waiter *w)
{
    struct broker_peer *p = w->owner;
    char msg[PROTO_MAX_ERRMSG], a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], c[UNITS_TEXT_MAX];
    uint64_t waited = uv_now(bk->loop) - w->since_ms;
    char what[80] = "lease";
    bk->counters->lease_wait_timeouts++;
    if (w->data) {
        batch_detach(w);
        snprintf(what, sizeof(what), "lease_many of %u leases", w->count);
    }
    if (w->blocked == ENOSPC) {
        struct registry_stats st = registry_stats(bk->reg);
        uint64_t held = st.bytes + pool_bytes_pinned(bk->pool);
        snprintf(msg, sizeof(msg),
                 "%s of %s (%llu bytes) waited %llu ms for pool space: the pool holds %s (%llu bytes) of its %s "
                 "(%llu bytes)", what, units_format(w->size, a), (unsigned long long)w->size, (unsigned long long)waited,
                 units_format(held, b), (unsigned long long)held, units_format(pool_cap(bk->pool), c),
                 (unsigned long long)pool_cap(bk->pool));
    } else {
        uint64_t held = quota_held(bk->quota, p->uid), limit = quota_limit(bk->quota, p->uid);
        snprintf(msg, sizeof(msg),
                 "%s of %s (%llu bytes) waited %llu ms for quota: uid %u holds %s (%llu bytes) of its %s quota",
                 what, units_format(w->size, a), (unsigned long long)w->size, (unsigned long long)waited,
                 (unsigned)p->uid, units_format(held, b), (unsigned long long)held, units_format(limit, c));
    }
    uint32_t id = w->id;
    p->parked -= w->count;
    waiters_remove(&bk->waiters, w);
    /* It may have been its tenant's blocked head: the ones behind it may fit now, though
     * nothing freed. */
    waiters_kick(&bk->waiters);
    if (!p->closing)
        refuse(bk, p, id, ETIMEDOUT, "lease", msg);
}

/* unpark: a parked request leaves its queue and gives back its place under max-leases;
 * its peer to answer (and *ret_id), or NULL when the peer is closing. */
static struct broker_peer *unpark(struct broker *bk, struct waiter *w, uint32_t *ret_id)
{
    struct broker_peer *p = w->owner;
    *ret_id = w->id;
    p->parked--;
    waiters_remove(&bk->waiters, w);
    return p->closing ? NULL : p;
}

static void serve_acquires(struct broker *bk, struct registry_buf *b);

/* publish_seal: a sealed publish: F_SEAL_WRITE on the buffer before it gets a token.
 * Returns false after refusing. */
static bool publish_seal(struct broker *bk, struct broker_peer *p, uint32_t id, struct registry_buf *b)
{
    if (!pool_sealable(bk->pool)) {
        fail(p, id, EOPNOTSUPP, "a sealed publish needs a memfd pool (shmrefd --memfd); this pool is %s, "
             "whose files cannot be sealed", pool_kind(bk->pool));
        return false;
    }
    int r = pool_seal(bk->pool, b->pb);
    if (r == -EBUSY) {
        fail(p, id, EBUSY, "buffer %llu is still mapped writable (by its producer, or cached by a process "
             "that leased it before): it cannot be sealed; unmap it first", (unsigned long long)b->pb->id);
        return false;
    }
    if (r < 0) {
        fail(p, id, -r, "sealing buffer %llu failed: %s", (unsigned long long)b->pb->id, strerror(-r));
        return false;
    }
    return true;
}

static void do_publish(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    struct registry_lease *l = registry_lease_of(&p->holder, m->u.publish.handle);
    if (!l) {
        fail(p, m->id, ENOENT, "no lease with handle %llu on this connection",
             (unsigned long long)m->u.publish.handle);
        return;
    }
    struct registry_buf *b = l->buf;
    if (!l->writable) {
        fail(p, m->id, EPERM, "handle %llu is an acquired (read-only) lease; only its producer publishes",
             (unsigned long long)m->u.publish.handle);
        return;
    }
    if (m->u.publish.size > b->size) {
        fail(p, m->id, EINVAL, "publish of %llu bytes exceeds the leased size %llu",
             (unsigned long long)m->u.publish.size, (unsigned long long)b->size);
        return;
    }
    if (b->published) {
        fail(p, m->id, EALREADY, "buffer of handle %llu is already published",
             (unsigned long long)m->u.publish.handle);
        return;
    }
    if ((m->u.publish.flags & PROTO_PUBLISH_SEALED) && !publish_seal(bk, p, m->id, b))
        return;
    b->max_acquires = m->u.publish.max_acquires;
    int r = registry_publish(bk->reg, b, m->u.publish.size, m->u.publish.keep_ms, m->u.publish.meta,
                             m->u.publish.meta_len);
    if (r == -EALREADY) {
        fail(p, m->id, EALREADY, "buffer of handle %llu is already published",
             (unsigned long long)m->u.publish.handle);
        return;
    }
    if (r < 0) {
        fail(p, m->id, -r, "publish failed: %s", strerror(-r));
        return;
    }
    bk->counters->publishes++;
    /* NOREPLY: the producer knows the token from the lease reply */
    if (!(m->u.publish.flags & PROTO_PUBLISH_NOREPLY)) {
        struct proto_msg rep = { .op = PROTO_OP_PUBLISH + PROTO_OP_REPLY, .id = m->id };
        memcpy(rep.u.publish_reply.token, b->token, PROTO_TOKEN_LEN);
        rep.u.publish_reply.size = b->size;
        p->ops->reply(p, &rep, -1);
    }
    serve_acquires(bk, b); /* after sealing, for a sealed publish */
}

/* acquire_buf: an acquire of published buffer b, every check made now (also for an acquire
 * that waited for the publish). */
static void acquire_buf(struct broker *bk, struct broker_peer *p, uint32_t id, struct registry_buf *b)
{
    uint64_t handle;
    if (!leases_left(bk, p, id, "acquire"))
        return;
    char msg[PROTO_MAX_ERRMSG];
    if (p->uid != b->tenant && quota_check_pinned(bk->quota, p->uid, msg, sizeof(msg)) < 0) {
        refuse(bk, p, id, EDQUOT, "acquire", msg);
        return;
    }
    int fd = pool_ro_fd(bk->pool, b->pb);
    if (fd < 0) {
        log_error("cannot open a read-only fd of buffer %llu: %s", (unsigned long long)b->pb->id,
                  strerror(-fd));
        fail(p, id, -fd, "cannot open the buffer read-only: %s", strerror(-fd));
        return;
    }
    if (registry_hold(bk->reg, &p->holder, b, false, &handle) < 0) {
        fail(p, id, ENOMEM, "daemon out of memory");
        return;
    }
    /* Another tenant will have mapped it: never hand it to its producer's next lease. */
    if (p->uid != b->tenant)
        b->pb->foreign = true;
    registry_acquired(bk->reg, b);
    bk->counters->acquires++;
    send_buffer(p, id, handle, b, fd);
}

static void do_acquire(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    struct registry_buf *b = registry_find(bk->reg, m->u.acquire.token);
    if (b) {
        acquire_buf(bk, p, m->id, b);
        return;
    }
    uint32_t wait = bk->loop ? m->u.acquire.wait_ms : 0;
    if (wait > PROTO_MAX_ACQUIRE_WAIT_MS)
        wait = PROTO_MAX_ACQUIRE_WAIT_MS;
    /* Leased under this token, not published yet: wait for its publish (the consumer may
     * have the descriptor before the producer's one-way publish reached us). */
    b = wait ? registry_find_writing(bk->reg, m->u.acquire.token) : NULL;
    if (!b) {
        fail(p, m->id, ENOENT,
             "no published buffer for this descriptor (never published, released by every "
             "holder, or its retention ran out)");
        return;
    }
    if (!leases_left(bk, p, m->id, "acquire"))
        return; /* a parked acquire takes a place under max-leases, as a lease does */
    if (!waiters_park_acquire(&bk->waiters, p, m->id, &b->waiting, wait)) {
        fail(p, m->id, ENOMEM, "daemon out of memory");
        return;
    }
    p->parked++;
    bk->counters->acquire_waits++;
}

/* serve_acquires: b was just published: its waiting acquires, in arrival order. Its
 * producer holds it throughout, so b stays alive. */
static void serve_acquires(struct broker *bk, struct registry_buf *b)
{
    uint32_t id;
    while (b->waiting) {
        struct broker_peer *p = unpark(bk, b->waiting->head, &id);
        if (p)
            acquire_buf(bk, p, id, b);
    }
}

/* acquire_expired: no publish within the wait: ENOENT, saying so. */
static void acquire_expired(struct broker *bk, struct waiter *w)
{
    uint32_t id, ms = w->wait_ms;
    bk->counters->acquire_wait_timeouts++;
    struct broker_peer *p = unpark(bk, w, &id);
    if (p)
        fail(p, id, ENOENT, "buffer leased under this descriptor was not published within %u ms", (unsigned)ms);
}

static void waiter_expired(void *arg, struct waiter *w)
{
    if (w->acquire)
        acquire_expired(arg, w);
    else
        lease_expired(arg, w);
}

/* on_gone_waited: a buffer with waiting acquires goes unpublished. */
static void on_gone_waited(void *arg, struct registry_buf *b)
{
    struct broker *bk = arg;
    uint32_t id;
    while (b->waiting) {
        struct broker_peer *p = unpark(bk, b->waiting->head, &id);
        if (p)
            fail(p, id, ENOENT, "the buffer leased under this descriptor was released before it was published "
                 "(its producer released it, or went away)");
    }
}

static void on_freed(void *arg, struct registry_buf *b)
{
    (void)b;
    struct broker *bk = arg;
    if (!bk->retrying)
        waiters_kick(&bk->waiters);
}

void broker_start(struct broker *bk, uv_loop_t *loop)
{
    bk->loop = loop;
    waiters_init(&bk->waiters, loop, waiter_expired, retry_leases, bk);
    struct registry_events ev = { .freed = on_freed, .gone_waited = on_gone_waited, .arg = bk };
    registry_set_events(bk->reg, &ev);
}

void broker_stop(struct broker *bk)
{
    if (!bk->loop)
        return;
    registry_set_events(bk->reg, NULL);
    for (struct waiter *w = bk->waiters.head; w; w = w->next)
        if (w->data)
            batch_detach(w); /* an attempt in flight finishes alone (the peer is closing) */
    waiters_close(&bk->waiters);
    bk->loop = NULL;
}

void broker_kick(struct broker *bk)
{
    if (bk->loop)
        waiters_kick(&bk->waiters);
}

static void do_release(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    if (registry_release(bk->reg, &p->holder, m->u.release.handle) < 0) {
        fail(p, m->id, ENOENT, "no lease with handle %llu on this connection",
             (unsigned long long)m->u.release.handle);
        return;
    }
    bk->counters->releases++;
    if (m->u.release.flags & PROTO_RELEASE_NOREPLY)
        return;
    struct proto_msg r = { .op = PROTO_OP_RELEASE + PROTO_OP_REPLY, .id = m->id };
    p->ops->reply(p, &r, -1);
}

/* ---- batches: lease_many (all or nothing) and release_many ------------------------ */

struct batch;
struct batch_item {
    struct batch *bt;
    uint64_t size, csize;
    uint64_t handle;             /* 0 until the lease is held */
    struct registry_buf *buf;
    struct quota_ticket charge;  /* until the registry takes it */
};

/* A lease_many in progress: its items are held (handles) as their buffers come, warm
 * ones at once, new ones when made off the loop; the reply (or the error, which undoes
 * every item) goes when the last one is in. */
struct batch {
    struct broker *broker;
    struct broker_peer *peer;
    uint32_t id, n, making;
    struct waiter *waiter;       /* a waiting batch's place in its tenant's queue, or NULL */
    bool expired;                /* its wait ran out while it was being made: undo, silently */
    bool hard;                   /* a failure that waiting would not cure (a create failed) */
    int code;                    /* the first refusal, 0 if none */
    char msg[2 * PROTO_MAX_ERRMSG]; /* room for a reason of PROTO_MAX_ERRMSG; cut when sent */
    struct batch_item items[PROTO_MAX_BATCH];
};

/* A waiting lease_many: the waiter's data. */
struct batch_wait {
    uint32_t n;
    uint64_t sizes[PROTO_MAX_BATCH];
    struct batch *bt;            /* its attempt in flight (w->busy), or NULL */
};

/* batch_detach: the waiter w goes (timeout, disconnect, stop) while its attempt may be
 * in flight: that attempt then undoes itself, silently. */
static void batch_detach(struct waiter *w)
{
    struct batch_wait *bw = w->data;
    if (bw->bt) {
        bw->bt->waiter = NULL;
        bw->bt->expired = true;
        bw->bt = NULL;
    }
}

static void batch_fail(struct batch *bt, uint32_t i, int code, const char *why)
{
    char a[UNITS_TEXT_MAX];
    if (bt->code)
        return; /* the first reason is the one told */
    bt->code = code;
    snprintf(bt->msg, sizeof(bt->msg), "lease_many item %u of %u (%s): %.*s; no lease of the batch was made", i,
             bt->n, units_format(bt->items[i].size, a), PROTO_MAX_ERRMSG, why);
}

/* batch_hold: item it's buffer is here: register (the registry takes the charge) and hold. */
static void batch_hold(struct batch *bt, struct batch_item *it, struct pool_buf *pb)
{
    struct broker *bk = bt->broker;
    struct registry_buf *b = registry_buf_charged(bk->reg, pb, &it->charge, it->size);
    if (!b) {
        int e = errno;
        registry_abandon(bk->reg, &it->charge, pb);
        batch_fail(bt, (uint32_t)(it - bt->items), e, e == ENOMEM ? "daemon out of memory" : "no random token (getrandom)");
        return;
    }
    if (registry_hold(bk->reg, &bt->peer->holder, b, true, &it->handle) < 0) {
        registry_buf_drop(bk->reg, b);
        it->handle = 0;
        batch_fail(bt, (uint32_t)(it - bt->items), ENOMEM, "daemon out of memory");
        return;
    }
    b->producer_pid = (int32_t)bt->peer->pid;
    it->buf = b;
}

/* batch_done: every item is in: one reply with all of them, or every held item released
 * and one error; a waiting batch refused EDQUOT/ENOSPC stays parked instead. Returns
 * whether its waiter (if any) is still parked. */
static bool batch_done(struct batch *bt)
{
    struct broker *bk = bt->broker;
    struct broker_peer *p = bt->peer;
    struct waiter *w = bt->waiter;
    /* The items' handles are the client's to guess (generation << 32 | slot) before the
     * reply names them: one released meanwhile (release, release_many) took its buffer
     * with it, which may be gone. Every item must still be held as it was, or the batch is
     * undone like any other failure (never a reply naming a dead buffer). */
    for (uint32_t i = 0; i < bt->n && !bt->code && !p->closing && !bt->expired; i++) {
        struct registry_lease *l = bt->items[i].handle ? registry_lease_of(&p->holder, bt->items[i].handle) : NULL;
        if (bt->items[i].handle && (!l || l->buf != bt->items[i].buf)) {
            bt->items[i].handle = 0;
            bt->hard = true; /* not a want of space: waiting would not cure it */
            batch_fail(bt, i, EINVAL, "its handle was released before the lease_many reply named it");
        }
    }
    if (bt->code || p->closing || bt->expired) {
        for (uint32_t i = 0; i < bt->n; i++)
            if (bt->items[i].handle)
                registry_release(bk->reg, &p->holder, bt->items[i].handle); /* -ENOENT once reclaimed */
        if (w && !p->closing && !bt->hard && (bt->code == EDQUOT || bt->code == ENOSPC)) {
            w->busy = false; /* waits on, at the head of its tenant's queue */
            w->blocked = bt->code;
            ((struct batch_wait *)w->data)->bt = NULL;
            free(bt);
            return true;
        }
        if (w) {
            p->parked -= w->count;
            waiters_remove(&bk->waiters, w);
            waiters_kick(&bk->waiters); /* the next of its tenant may go now */
        }
        if (!p->closing && !bt->expired)
            refuse(bk, p, bt->id, bt->code, "lease_many", bt->msg);
        free(bt);
        return false;
    }
    if (w) {
        p->parked -= w->count;
        waiters_remove(&bk->waiters, w);
        waiters_kick(&bk->waiters); /* the next of its tenant may go now */
    }
    static struct proto_msg r; /* one loop thread */
    int fds[PROTO_MAX_BATCH];
    r = (struct proto_msg){ .op = PROTO_OP_LEASE_MANY + PROTO_OP_REPLY, .id = bt->id };
    r.u.lease_many_reply.n = bt->n;
    for (uint32_t i = 0; i < bt->n; i++) {
        struct batch_item *it = &bt->items[i];
        struct proto_item *o = &r.u.lease_many_reply.items[i];
        o->handle = it->handle;
        o->buf_id = it->buf->pb->id;
        o->size = it->size;
        o->capacity = it->buf->pb->size;
        memcpy(o->token, it->buf->token, PROTO_TOKEN_LEN);
        fds[i] = it->buf->pb->fd;
    }
    bk->counters->leases += bt->n;
    p->ops->reply_many(p, &r, fds);
    free(bt);
    return false;
}

static void batch_created(struct pool *pool, struct pool_buf *pb, int err, void *data)
{
    struct batch_item *it = data;
    struct batch *bt = it->bt;
    struct broker *bk = bt->broker;
    struct broker_peer *p = bt->peer;
    (void)pool;
    p->pending--;
    bk->pending_bytes -= it->csize;
    if (err < 0) {
        registry_abandon(bk->reg, &it->charge, NULL);
        batch_fail(bt, (uint32_t)(it - bt->items), err == -ENOSPC ? ENOSPC : -err, strerror(-err));
        bt->hard = true; /* a full tmpfs: waiting would only make the files again */
    } else if (bt->code || p->closing || bk->stopping || bt->expired) {
        registry_abandon(bk->reg, &it->charge, pb);
    } else {
        batch_hold(bt, it, pb);
    }
    if (--bt->making == 0)
        batch_done(bt);
    p->ops->unref(p);
    broker_check(bk);
}

/* batch_item_start: charge item i and find its buffer (warm, or made off the loop).
 * Returns false after batch_fail. */
static bool batch_item_start(struct batch *bt, uint32_t i)
{
    struct broker *bk = bt->broker;
    struct broker_peer *p = bt->peer;
    struct batch_item *it = &bt->items[i];
    char msg[PROTO_MAX_ERRMSG];
    struct pool_cls cls;
    if (pool_class(bk->pool, it->size, &cls) < 0) {
        batch_fail(bt, i, EFBIG, "lease size beyond every size class");
        return false;
    }
    it->csize = cls.size;
    struct pool_buf *warm = pool_take_warm(bk->pool, &cls, p->uid);
    int r = quota_take(bk->quota, p->uid, cls.size, &it->charge, msg, sizeof(msg));
    if (r < 0) {
        if (warm)
            pool_untake(bk->pool, warm);
        batch_fail(bt, i, -r, msg);
        return false;
    }
    if (warm) {
        batch_hold(bt, it, warm);
        return !bt->code;
    }
    struct pool_buf *pb = NULL;
    r = pool_get_class(bk->pool, &cls, p->uid, &pb, batch_created, it);
    if (r == 1) {
        p->ops->ref(p);
        p->pending++;
        bk->pending_bytes += cls.size;
        bt->making++;
        return true;
    }
    if (r == 0) {
        batch_hold(bt, it, pb);
        return !bt->code;
    }
    registry_abandon(bk->reg, &it->charge, NULL);
    if (r == -ENOSPC)
        pool_full_msg(bk, cls.size, msg, sizeof(msg));
    else if (r == -EMFILE)
        snprintf(msg, sizeof(msg), "daemon at its fd limit: its buffers hold %llu fds of the %llu it allows itself",
                 (unsigned long long)pool_fds(bk->pool), (unsigned long long)pool_fd_budget(bk->pool));
    else
        snprintf(msg, sizeof(msg), "%s", strerror(-r));
    batch_fail(bt, i, -r, msg);
    return false;
}

/* batch_start: an attempt at n leases (checked), all or nothing. w: the batch's waiter,
 * if it waits. Returns whether w is still parked (blocked, or its buffers being made). */
static bool batch_start(struct broker *bk, struct broker_peer *p, uint32_t id, uint32_t n, const uint64_t *sizes,
                        struct waiter *w)
{
    struct batch *bt = calloc(1, sizeof(*bt));
    if (!bt) {
        if (w) {
            p->parked -= w->count;
            waiters_remove(&bk->waiters, w);
        }
        fail(p, id, ENOMEM, "daemon out of memory");
        return false;
    }
    *bt = (struct batch){ .broker = bk, .peer = p, .id = id, .n = n, .waiter = w };
    if (w) {
        w->busy = true;
        ((struct batch_wait *)w->data)->bt = bt;
    }
    for (uint32_t i = 0; i < n; i++) {
        bt->items[i] = (struct batch_item){ .bt = bt, .size = sizes[i] };
        if (!batch_item_start(bt, i))
            break;
    }
    if (bt->making == 0)
        return batch_done(bt);
    return w != NULL; /* the last buffer made finishes it */
}

static void do_lease_many(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    uint32_t n = m->u.lease_many.n;
    char msg[PROTO_MAX_ERRMSG], a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];
    for (uint32_t i = 0; i < n; i++) {
        uint64_t size = m->u.lease_many.sizes[i];
        if (size == 0) {
            fail(p, m->id, EINVAL, "lease_many item %u of %u: lease size must be at least 1 byte", i, n);
            return;
        }
        if (size > bk->opt->max_lease_size) {
            snprintf(msg, sizeof(msg), "lease_many item %u of %u: lease of %s (%llu bytes) exceeds the maximum "
                     "lease size %s (%llu bytes)", i, n, units_format(size, a), (unsigned long long)size,
                     units_format(bk->opt->max_lease_size, b), (unsigned long long)bk->opt->max_lease_size);
            refuse(bk, p, m->id, EFBIG, "lease_many", msg);
            return;
        }
    }
    unsigned held = p->holder.leases + p->pending + p->parked;
    if (held + n > bk->opt->max_leases) {
        snprintf(msg, sizeof(msg), "too many leases on this connection: %u held, %u asked, limit %u", held, n,
                 bk->opt->max_leases);
        refuse(bk, p, m->id, EMFILE, "lease_many", msg);
        return;
    }
    if (p->uid != 0 && p->uid != geteuid() &&
        quota_buffers(bk->quota, p->uid) + n > pool_fd_budget(bk->pool) / 2) {
        snprintf(msg, sizeof(msg), "uid %u holds %u buffers; %u more would pass its share of the daemon's fd "
                 "budget (half of %llu); release buffers or raise LimitNOFILE", (unsigned)p->uid,
                 quota_buffers(bk->quota, p->uid), n, (unsigned long long)pool_fd_budget(bk->pool));
        refuse(bk, p, m->id, EMFILE, "lease_many", msg);
        return;
    }
    uint32_t wait = bk->loop ? m->u.lease_many.wait_ms : 0;
    if (wait > PROTO_MAX_LEASE_WAIT_MS)
        wait = PROTO_MAX_LEASE_WAIT_MS;
    if (!wait) {
        batch_start(bk, p, m->id, n, m->u.lease_many.sizes, NULL);
        return;
    }
    if (beyond_all(bk, p, m->id, m->u.lease_many.sizes, n, "lease_many"))
        return;
    /* A waiting batch waits as a unit: parked first (FIFO behind its tenant's earlier
     * waiters), then tried; refused EDQUOT/ENOSPC, it stays parked and is tried again
     * whole when space frees. */
    struct batch_wait *bw = calloc(1, sizeof(*bw));
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += m->u.lease_many.sizes[i];
    struct waiters_queue *q = waiters_tenant(&bk->waiters, p->uid);
    struct waiter *w = bw ? waiters_park_lease(&bk->waiters, p, m->id, p->uid, sum, q ? q->tail->blocked : EDQUOT,
                                               wait)
                          : NULL;
    if (!w) {
        free(bw);
        fail(p, m->id, ENOMEM, "daemon out of memory");
        return;
    }
    bw->n = n;
    memcpy(bw->sizes, m->u.lease_many.sizes, n * sizeof(bw->sizes[0]));
    w->data = bw;
    w->count = n;
    p->parked += n;
    if (q || batch_start(bk, p, m->id, n, bw->sizes, w))
        bk->counters->lease_waits++;
}

/* batch_retry: a waiting batch at its tenant's head, tried again. Returns true when its
 * waiter is gone (served, or refused for good). */
static bool batch_retry(struct broker *bk, struct waiter *w)
{
    struct batch_wait *bw = w->data;
    return !batch_start(bk, w->owner, w->id, bw->n, bw->sizes, w);
}

static void do_release_many(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    uint32_t n = m->u.release_many.n, bad = 0, unknown = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        if (registry_release(bk->reg, &p->holder, m->u.release_many.handles[i]) == 0) {
            bk->counters->releases++;
        } else {
            bad++;
            if (unknown == UINT32_MAX)
                unknown = i;
        }
    }
    if (bad) {
        fail(p, m->id, ENOENT, "no lease with handle %llu (item %u of %u) on this connection; %u of the %u "
             "handles were unknown, the others were released",
             (unsigned long long)m->u.release_many.handles[unknown], unknown, n, bad, n);
        return;
    }
    if (m->u.release_many.flags & PROTO_RELEASE_NOREPLY)
        return;
    struct proto_msg r = { .op = PROTO_OP_RELEASE_MANY + PROTO_OP_REPLY, .id = m->id };
    p->ops->reply(p, &r, -1);
}

bool broker_handle(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    switch (m->op) {
    case PROTO_OP_LEASE: do_lease(bk, p, m); return true;
    case PROTO_OP_PUBLISH: do_publish(bk, p, m); return true;
    case PROTO_OP_ACQUIRE: do_acquire(bk, p, m); return true;
    case PROTO_OP_RELEASE: do_release(bk, p, m); return true;
    case PROTO_OP_LEASE_MANY: do_lease_many(bk, p, m); return true;
    case PROTO_OP_RELEASE_MANY: do_release_many(bk, p, m); return true;
    default: return false;
    }
}

void broker_mapped(struct broker *bk, struct broker_peer *p, uint64_t buf_id)
{
    pool_mapped(bk->pool, buf_id, p->uid);
}

void broker_unmapped(struct broker *bk, struct broker_peer *p, uint64_t buf_id)
{
    pool_unmapped(bk->pool, buf_id, p->uid);
}

uint32_t broker_disconnect(struct broker *bk, struct broker_peer *p)
{
    /* Its waiters go first, silently (nothing was charged for them). */
    bool leases = false;
    for (struct waiter *w = bk->waiters.head, *nx; w && p->parked; w = nx) {
        nx = w->next;
        if (w->owner == p) {
            if (w->data)
                batch_detach(w);
            leases = leases || !w->acquire;
            p->parked -= w->count;
            waiters_remove(&bk->waiters, w);
        }
    }
    if (leases) /* a tenant's blocked head may have gone: the ones behind it may fit */
        waiters_kick(&bk->waiters);
    uint32_t n = registry_release_all(bk->reg, &p->holder);
    if (n) {
        bk->counters->reclaimed_leases += n;
        bk->counters->reclaimed_clients++;
    }
    return n;
}

/* broker_check: the three ledgers of the same bytes agree: what the quota holds is what
 * the registry's buffers are charged plus the leases waiting for a buffer, and what the
 * pool has handed out (allocated, not warm, not being made) is the registry's buffers. A
 * drift is a bug: test builds (SHMREF_LEDGER_CHECK) abort; others log it once. */
void broker_check(struct broker *bk)
{
    struct registry_stats st = registry_stats(bk->reg);
    uint64_t quota = 0, pool = 0;
    bool ok = st.drift == 0;
#ifdef SHMREF_LEDGER_CHECK
    quota = quota_total(bk->quota);
    pool = pool_bytes_alloc(bk->pool) - pool_bytes_warm(bk->pool) - pool_bytes_creating(bk->pool);
    ok = ok && quota == st.bytes + bk->pending_bytes && pool == st.bytes;
#endif
    if (ok || bk->drift_logged)
        return;
    bk->drift_logged = true;
    if (!quota) { /* not summed above: the numbers for the log line */
        quota = quota_total(bk->quota);
        pool = pool_bytes_alloc(bk->pool) - pool_bytes_warm(bk->pool) - pool_bytes_creating(bk->pool);
    }
    log_error("ledgers disagree: quota holds %llu bytes, registry %llu (+%llu pending), pool hands out %llu; "
              "%llu credits found less charged than credited",
              (unsigned long long)quota, (unsigned long long)st.bytes, (unsigned long long)bk->pending_bytes,
              (unsigned long long)pool, (unsigned long long)st.drift);
#ifdef SHMREF_LEDGER_CHECK
    abort();
#endif
}
