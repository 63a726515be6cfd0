/* SPDX-License-Identifier: MIT */
/* broker.c: see broker.h. Order of a lease: limits, then the size class (computed once),
 * then the tenant's quota is charged (a ticket), then the pool is asked (warm buffer now,
 * or a new one reserved off the loop). The ticket travels with the lease into the
 * registry; every failure on the way hands it to registry_abandon, the same one place
 * that credits a buffer's charge at its end. */
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
        r.u.acquire_reply.flags = b->pb->sealed ? PROTO_BUF_SEALED : 0;
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
    if (p->holder.leases + p->pending < bk->opt->max_leases)
        return true;
    char msg[PROTO_MAX_ERRMSG];
    snprintf(msg, sizeof(msg), "too many leases on this connection: %u held, limit %u",
             p->holder.leases + p->pending, bk->opt->max_leases);
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

/* lease_refused: the pool said no to a charged lease (its charge is already back). */
static void lease_refused(struct broker *bk, struct broker_peer *p, uint32_t id, int r, uint64_t csize)
{
    char msg[PROTO_MAX_ERRMSG], a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], d[UNITS_TEXT_MAX];
    if (r == -ENOSPC) {
        struct registry_stats st = registry_stats(bk->reg);
        char e[UNITS_TEXT_MAX], pinned[160] = "";
        uint64_t pin = pool_bytes_pinned(bk->pool);
        if (pin)
            snprintf(pinned, sizeof(pinned), ", and %s (%llu bytes) pinned (retired buffers that clients still map)",
                     units_format(pin, e), (unsigned long long)pin);
        snprintf(msg, sizeof(msg),
                 "pool full: %s (%llu bytes) held%s of %s (%llu bytes); a %s (%llu bytes) buffer does not fit",
                 units_format(st.bytes, a), (unsigned long long)st.bytes, pinned,
                 units_format(pool_cap(bk->pool), b), (unsigned long long)pool_cap(bk->pool),
                 units_format(csize, d), (unsigned long long)csize);
        refuse(bk, p, id, ENOSPC, "lease", msg);
    } else if (r == -EMFILE) {
        snprintf(msg, sizeof(msg),
                 "daemon at its fd limit: its buffers hold %llu fds of the %llu it allows itself "
                 "(three quarters of RLIMIT_NOFILE); release buffers or raise LimitNOFILE",
                 (unsigned long long)pool_fds(bk->pool), (unsigned long long)pool_fd_budget(bk->pool));
        refuse(bk, p, id, EMFILE, "lease", msg);
    } else {
        fail(p, id, -r, "lease failed: %s", strerror(-r));
    }
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
    struct pool_cls cls;
    if (pool_class(bk->pool, size, &cls) < 0) {
        refuse(bk, p, m->id, EFBIG, "lease", "lease size beyond every size class");
        return;
    }
    if (!fd_share_left(bk, p, m->id))
        return;
    /* A warm buffer first: if this tenant's clients still map it, its bytes are charged
     * as pinned until it is taken, and must not count twice against the quota. */
    struct pool_buf *warm = pool_take_warm(bk->pool, &cls, p->uid);
    struct quota_ticket charge;
    int r = quota_take(bk->quota, p->uid, cls.size, &charge, msg, sizeof(msg));
    if (r < 0) {
        if (warm)
            pool_untake(bk->pool, warm);
        refuse(bk, p, m->id, -r, "lease", msg);
        return;
    }
    if (warm) {
        lease_finish(bk, p, m->id, warm, size, &charge);
        return;
    }
    struct pending_lease *pl = malloc(sizeof(*pl));
    struct pool_buf *pb = NULL;
    if (pl)
        *pl = (struct pending_lease){ .broker = bk, .peer = p, .id = m->id, .size = size, .charge = charge };
    r = pl ? pool_get_class(bk->pool, &cls, p->uid, &pb, lease_created, pl) : -ENOMEM;
    if (r == 1) {
        p->ops->ref(p);
        p->pending++;
        bk->pending_bytes += cls.size;
        return;
    }
    free(pl);
    if (r == 0) {
        lease_finish(bk, p, m->id, pb, size, &charge);
        return;
    }
    registry_abandon(bk->reg, &charge, NULL);
    lease_refused(bk, p, m->id, r, cls.size);
}

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
    if (m->u.publish.flags & PROTO_PUBLISH_NOREPLY)
        return; /* the producer knows the token from the lease reply */
    struct proto_msg rep = { .op = PROTO_OP_PUBLISH + PROTO_OP_REPLY, .id = m->id };
    memcpy(rep.u.publish_reply.token, b->token, PROTO_TOKEN_LEN);
    rep.u.publish_reply.size = b->size;
    p->ops->reply(p, &rep, -1);
}

static void do_acquire(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    struct registry_buf *b = registry_find(bk->reg, m->u.acquire.token);
    uint64_t handle;

    if (!b) {
        fail(p, m->id, ENOENT,
             "no published buffer for this descriptor (never published, released by every "
             "holder, or its retention ran out)");
        return;
    }
    if (!leases_left(bk, p, m->id, "acquire"))
        return;
    char msg[PROTO_MAX_ERRMSG];
    if (p->uid != b->tenant && quota_check_pinned(bk->quota, p->uid, msg, sizeof(msg)) < 0) {
        refuse(bk, p, m->id, EDQUOT, "acquire", msg);
        return;
    }
    int fd = pool_ro_fd(bk->pool, b->pb);
    if (fd < 0) {
        log_error("cannot open a read-only fd of buffer %llu: %s", (unsigned long long)b->pb->id,
                  strerror(-fd));
        fail(p, m->id, -fd, "cannot open the buffer read-only: %s", strerror(-fd));
        return;
    }
    if (registry_hold(bk->reg, &p->holder, b, false, &handle) < 0) {
        fail(p, m->id, ENOMEM, "daemon out of memory");
        return;
    }
    /* Another tenant will have mapped it: never hand it to its producer's next lease. */
    if (p->uid != b->tenant)
        b->pb->foreign = true;
    registry_acquired(bk->reg, b);
    bk->counters->acquires++;
    send_buffer(p, m->id, handle, b, fd);
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

bool broker_handle(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    switch (m->op) {
    case PROTO_OP_LEASE: do_lease(bk, p, m); return true;
    case PROTO_OP_PUBLISH: do_publish(bk, p, m); return true;
    case PROTO_OP_ACQUIRE: do_acquire(bk, p, m); return true;
    case PROTO_OP_RELEASE: do_release(bk, p, m); return true;
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
