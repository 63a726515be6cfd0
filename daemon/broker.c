/* broker.c: see broker.h. Order of a lease: limits, then the tenant's quota is charged,
 * then the pool is asked (warm buffer now, or a new one reserved off the loop); every
 * failure after the charge credits it back, so the ledger never drifts. */
#include "broker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "server.h"
#include "status.h"
#include "text.h"
#include "units.h"

#define FEATURES (PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE)

struct pending_lease {
    struct conn *conn;
    uint32_t id;
    uint64_t size;
    uint64_t csize;
};

static void refuse(struct conn *c, uint32_t id, int code, const char *what, const char *msg)
{
    struct server *s = c->server;
    switch (code) {
    case EDQUOT: s->counters.refused_quota++; break;
    case ENOSPC: s->counters.refused_space++; break;
    case EMFILE: case EFBIG: s->counters.refused_limit++; break;
    default: s->counters.refused_other++; break;
    }
    log_notice("refused %s for client %llu pid=%d uid=%u: %s", what, (unsigned long long)c->id,
               (int)c->pid, (unsigned)c->uid, msg);
    conn_fail(c, id, code, "%s", msg);
}

static void do_hello(struct conn *c, const struct proto_msg *m)
{
    struct server *s = c->server;
    if (m->u.hello.version != PROTO_VERSION) {
        s->counters.protocol_errors++;
        conn_fail(c, m->id, EPROTONOSUPPORT,
                  "protocol version %u is not supported: this shmrefd speaks version %d",
                  (unsigned)m->u.hello.version, PROTO_VERSION);
        conn_close(c, "protocol version mismatch");
        return;
    }
    /* valid UTF-8 without control or bidi characters, for status, JSON and log lines */
    text_clean(c->name, m->u.hello.name ? m->u.hello.name : "", m->u.hello.name_len);
    c->hello = true;
    c->fd_once = (m->u.hello.features & PROTO_FEAT_FD_ONCE) != 0;
    log_debug("client %llu pid=%d uid=%u said hello as '%s'", (unsigned long long)c->id, (int)c->pid,
              (unsigned)c->uid, c->name);
    struct proto_msg r = { .op = PROTO_OP_HELLO + PROTO_OP_REPLY, .id = m->id };
    r.u.hello_reply.version = PROTO_VERSION;
    r.u.hello_reply.features = FEATURES & (m->u.hello.features | PROTO_FEAT_NOREPLY_RELEASE);
    r.u.hello_reply.max_request = PROTO_MAX_REQUEST;
    r.u.hello_reply.max_lease = s->opt->max_lease_size;
    r.u.hello_reply.max_leases = s->opt->max_leases;
    r.u.hello_reply.max_meta = PROTO_MAX_META;
    r.u.hello_reply.pid = (uint64_t)getpid();
    conn_send(c, &r, -1);
}

/* fd_to_send: the fd to attach, or -1 when this client already has the buffer mapped
 * as needed (a writable mapping also serves reading). */
static int fd_to_send(struct conn *c, const struct registry_buf *b, bool writable, int fd)
{
    if (!c->fd_once)
        return fd;
    uint64_t rw = b->pb->id << 1 | 1, ro = b->pb->id << 1;
    if (idset_has(&c->known, rw) || (!writable && idset_has(&c->known, ro)))
        return -1;
    /* Bounded by what a client that forgets properly can hold mapped (its handles plus its
     * idle cache); if full, the fd is simply sent again next time. */
    uint32_t max = c->server->opt->max_leases > (UINT32_MAX - CONN_KNOWN_SLACK) / 2
                       ? UINT32_MAX : c->server->opt->max_leases * 2 + CONN_KNOWN_SLACK;
    idset_add(&c->known, writable ? rw : ro, max);
    return fd;
}

static void send_buffer(struct conn *c, uint32_t id, uint64_t handle, struct registry_buf *b, int fd)
{
    fd = fd_to_send(c, b, !b->published, fd);
    struct proto_msg r = { .op = PROTO_OP_LEASE + PROTO_OP_REPLY, .id = id };
    r.u.lease_reply.handle = handle;
    r.u.lease_reply.buf_id = b->pb->id;
    r.u.lease_reply.gen = b->pb->gen;
    r.u.lease_reply.size = b->size;
    r.u.lease_reply.capacity = b->pb->size;
    if (b->published) {
        r.op = PROTO_OP_ACQUIRE + PROTO_OP_REPLY;
        r.u.acquire_reply.meta = b->meta;
        r.u.acquire_reply.meta_len = b->meta_len;
    }
    conn_send(c, &r, fd);
}

/* lease_finish: a buffer is ready for a charged lease: register, hold, reply. */
static void lease_finish(struct conn *c, uint32_t id, struct pool_buf *pb, uint64_t size)
{
    struct server *s = c->server;
    uint64_t handle;
    struct registry_buf *b = registry_buf_new(s->reg, pb, c->uid, size);
    if (!b) {
        quota_credit(s->quota, c->uid, pb->size);
        pool_put(s->pool, pb);
        conn_fail(c, id, ENOMEM, "daemon out of memory");
        return;
    }
    if (registry_hold(s->reg, &c->holder, b, true, &handle) < 0) {
        registry_buf_drop(s->reg, b); /* credits and returns the buffer */
        conn_fail(c, id, ENOMEM, "daemon out of memory");
        return;
    }
    s->counters.leases++;
    send_buffer(c, id, handle, b, pb->fd);
}

static void lease_created(struct pool *pool, struct pool_buf *pb, int err, void *data)
{
    struct pending_lease *pl = data;
    struct conn *c = pl->conn;
    struct server *s = c->server;
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];

    c->pending--;
    if (err < 0) {
        quota_credit(s->quota, c->uid, pl->csize);
        log_error("creating a %llu-byte buffer in %s failed: %s (%llu bytes available there)",
                  (unsigned long long)pl->csize, pool_dir(pool), strerror(-err),
                  (unsigned long long)pool_fs_available(pool));
        if (!c->closing) {
            char msg[PROTO_MAX_ERRMSG];
            snprintf(msg, sizeof(msg), "cannot reserve %s (%llu bytes) in %s: %s; %s available there",
                     units_format(pl->csize, a), (unsigned long long)pl->csize, pool_dir(pool),
                     strerror(-err), units_format(pool_fs_available(pool), b));
            refuse(c, pl->id, err == -ENOSPC ? ENOSPC : -err, "lease", msg);
        }
    } else if (c->closing || s->stopping) {
        quota_credit(s->quota, c->uid, pl->csize);
        pool_put(pool, pb);
    } else {
        lease_finish(c, pl->id, pb, pl->size);
    }
    conn_unref(c);
    free(pl);
}

static bool leases_left(struct conn *c, uint32_t id, const char *what)
{
    struct server *s = c->server;
    if (c->holder.leases + c->pending < s->opt->max_leases)
        return true;
    char msg[PROTO_MAX_ERRMSG];
    snprintf(msg, sizeof(msg), "too many leases on this connection: %u held, limit %u",
             c->holder.leases + c->pending, s->opt->max_leases);
    refuse(c, id, EMFILE, what, msg);
    return false;
}

static void do_lease(struct conn *c, const struct proto_msg *m)
{
    struct server *s = c->server;
    uint64_t size = m->u.lease.size;
    char msg[PROTO_MAX_ERRMSG], a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], d[UNITS_TEXT_MAX];

    if (size == 0) {
        conn_fail(c, m->id, EINVAL, "lease size must be at least 1 byte");
        return;
    }
    if (size > s->opt->max_lease_size) {
        snprintf(msg, sizeof(msg), "lease of %s (%llu bytes) exceeds the maximum lease size %s (%llu bytes)",
                 units_format(size, a), (unsigned long long)size,
                 units_format(s->opt->max_lease_size, b), (unsigned long long)s->opt->max_lease_size);
        refuse(c, m->id, EFBIG, "lease", msg);
        return;
    }
    if (!leases_left(c, m->id, "lease"))
        return;
    uint64_t csize = pool_class_size(s->pool, size);
    if (csize == 0) {
        refuse(c, m->id, EFBIG, "lease", "lease size beyond every size class");
        return;
    }
    int r = quota_charge(s->quota, c->uid, csize, msg, sizeof(msg));
    if (r < 0) {
        refuse(c, m->id, -r, "lease", msg);
        return;
    }
    struct pending_lease *pl = malloc(sizeof(*pl));
    struct pool_buf *pb = NULL;
    if (pl)
        *pl = (struct pending_lease){ .conn = c, .id = m->id, .size = size, .csize = csize };
    r = pl ? pool_get(s->pool, size, c->uid, &pb, lease_created, pl) : -ENOMEM;
    if (r == 1) {
        conn_ref(c);
        c->pending++;
        return;
    }
    free(pl);
    if (r == 0) {
        lease_finish(c, m->id, pb, size);
        return;
    }
    quota_credit(s->quota, c->uid, csize);
    if (r == -ENOSPC) {
        struct registry_stats st = registry_stats(s->reg);
        snprintf(msg, sizeof(msg),
                 "pool full: %s (%llu bytes) held of %s (%llu bytes); a %s (%llu bytes) buffer does not fit",
                 units_format(st.bytes, a), (unsigned long long)st.bytes,
                 units_format(pool_cap(s->pool), b), (unsigned long long)pool_cap(s->pool),
                 units_format(csize, d), (unsigned long long)csize);
        refuse(c, m->id, ENOSPC, "lease", msg);
    } else if (r == -EMFILE) {
        snprintf(msg, sizeof(msg),
                 "daemon at its fd limit: its buffers hold %llu fds of the %llu it allows itself "
                 "(three quarters of RLIMIT_NOFILE); release buffers or raise LimitNOFILE",
                 (unsigned long long)pool_fds(s->pool), (unsigned long long)pool_fd_budget(s->pool));
        refuse(c, m->id, EMFILE, "lease", msg);
    } else {
        conn_fail(c, m->id, -r, "lease failed: %s", strerror(-r));
    }
}

static void do_publish(struct conn *c, const struct proto_msg *m)
{
    struct server *s = c->server;
    struct registry_lease *l = registry_lease_of(&c->holder, m->u.publish.handle);
    if (!l) {
        conn_fail(c, m->id, ENOENT, "no lease with handle %llu on this connection",
                  (unsigned long long)m->u.publish.handle);
        return;
    }
    struct registry_buf *b = l->buf;
    if (!l->writable) {
        conn_fail(c, m->id, EPERM, "handle %llu is an acquired (read-only) lease; only its producer publishes",
                  (unsigned long long)m->u.publish.handle);
        return;
    }
    if (m->u.publish.size > b->size) {
        conn_fail(c, m->id, EINVAL, "publish of %llu bytes exceeds the leased size %llu",
                  (unsigned long long)m->u.publish.size, (unsigned long long)b->size);
        return;
    }
    int r = registry_publish(s->reg, b, m->u.publish.size, m->u.publish.keep_ms, m->u.publish.meta,
                             m->u.publish.meta_len);
    if (r == -EALREADY) {
        conn_fail(c, m->id, EALREADY, "buffer of handle %llu is already published",
                  (unsigned long long)m->u.publish.handle);
        return;
    }
    if (r < 0) {
        conn_fail(c, m->id, -r, "publish failed: %s", strerror(-r));
        return;
    }
    s->counters.publishes++;
    struct proto_msg rep = { .op = PROTO_OP_PUBLISH + PROTO_OP_REPLY, .id = m->id };
    memcpy(rep.u.publish_reply.token, b->token, PROTO_TOKEN_LEN);
    rep.u.publish_reply.size = b->size;
    conn_send(c, &rep, -1);
}

static void do_acquire(struct conn *c, const struct proto_msg *m)
{
    struct server *s = c->server;
    struct registry_buf *b = registry_find(s->reg, m->u.acquire.token);
    uint64_t handle;

    if (!b) {
        conn_fail(c, m->id, ENOENT,
                  "no published buffer for this descriptor (never published, released by every "
                  "holder, or its retention ran out)");
        return;
    }
    if (!leases_left(c, m->id, "acquire"))
        return;
    int fd = pool_ro_fd(s->pool, b->pb);
    if (fd < 0) {
        log_error("cannot open a read-only fd of buffer %llu: %s", (unsigned long long)b->pb->id,
                  strerror(-fd));
        conn_fail(c, m->id, -fd, "cannot open the buffer read-only: %s", strerror(-fd));
        return;
    }
    if (registry_hold(s->reg, &c->holder, b, false, &handle) < 0) {
        conn_fail(c, m->id, ENOMEM, "daemon out of memory");
        return;
    }
    /* Another tenant will have mapped it: never hand it to its producer's next lease. */
    if (c->uid != b->tenant)
        b->pb->foreign = true;
    registry_end_retention(s->reg, b);
    s->counters.acquires++;
    send_buffer(c, m->id, handle, b, fd);
}

static void do_release(struct conn *c, const struct proto_msg *m)
{
    struct server *s = c->server;
    if (registry_release(s->reg, &c->holder, m->u.release.handle) < 0) {
        conn_fail(c, m->id, ENOENT, "no lease with handle %llu on this connection",
                  (unsigned long long)m->u.release.handle);
        return;
    }
    s->counters.releases++;
    if (m->u.release.flags & PROTO_RELEASE_NOREPLY)
        return;
    struct proto_msg r = { .op = PROTO_OP_RELEASE + PROTO_OP_REPLY, .id = m->id };
    conn_send(c, &r, -1);
}

static void do_status(struct conn *c, const struct proto_msg *m)
{
    static uint8_t body[PROTO_MAX_REPLY - 64];
    int n = status_build(c->server, body, sizeof(body));
    if (n < 0) {
        conn_fail(c, m->id, EMSGSIZE, "status does not fit in one reply");
        return;
    }
    struct proto_msg r = { .op = PROTO_OP_STATUS + PROTO_OP_REPLY, .id = m->id };
    r.u.status_reply.body = body;
    r.u.status_reply.body_len = (uint32_t)n;
    conn_send(c, &r, -1);
}

void broker_handle(struct conn *c, const struct proto_msg *m)
{
    switch (m->op) {
    case PROTO_OP_HELLO:
        if (c->hello) {
            conn_fail(c, m->id, EPROTO, "hello was already said");
            return;
        }
        do_hello(c, m);
        return;
    case PROTO_OP_LEASE: do_lease(c, m); return;
    case PROTO_OP_PUBLISH: do_publish(c, m); return;
    case PROTO_OP_ACQUIRE: do_acquire(c, m); return;
    case PROTO_OP_RELEASE: do_release(c, m); return;
    case PROTO_OP_STATUS: do_status(c, m); return;
    case PROTO_OP_FORGET:
        idset_del(&c->known, m->u.forget.buf_id << 1 | (m->u.forget.writable ? 1 : 0));
        return;
    case PROTO_OP_PING: {
        struct proto_msg r = { .op = PROTO_OP_PING + PROTO_OP_REPLY, .id = m->id };
        conn_send(c, &r, -1);
        return;
    }
    default:
        conn_fail(c, m->id, EOPNOTSUPP, "unknown op %u", (unsigned)m->op);
        return;
    }
}
