/* SPDX-License-Identifier: MIT */
/* lease.c: see lease.h: the publish and acquire requests' handlers and the blocking
 * calls on buffers (lease, publish, acquire, release, lease_many). */
#include "lease.h"

#include <errno.h>
#include <fcntl.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "handle.h"
#include "localhold.h"
#include "mapcache.h"
#include "requests.h"
#include "session.h"
#include "stock.h"
#include "transport.h"


int shmref_lease(shmref_conn *conn, size_t size, shmref_buf **ret_buf)
{
    return shmref_lease_ex(conn, size, 0, conn ? conn->lease_wait_ms : 0, ret_buf);
}

int shmref_set_lease_wait(shmref_conn *conn, uint32_t wait_ms)
{
    if (!conn || wait_ms > PROTO_MAX_LEASE_WAIT_MS)
        return -EINVAL;
    conn->lease_wait_ms = wait_ms;
    return 0;
}

/* lease_wait: a foreground lease (or a stock refill taken over, p) and its wait. */
static int lease_wait(shmref_conn *conn, struct pending *p, uint32_t wait_ms, shmref_buf **ret_buf)
{
    int r = pending_wait(conn, p, pending_budget(conn, wait_ms));
    if (r == 0) {
        *ret_buf = p->buf; /* its size is the caller's, the stock learnt its class (pending.c) */
        p->buf = NULL;
    }
    pending_free(conn, p);
    return r;
}

/* ---- the table's round trips: the fd of a popped buffer, a lease made the daemon's ---- */

struct table_req {
    uint64_t buf_id;
    uint32_t seq;
    void *data;             /* map: the mapping made */
    size_t len;
    uint64_t handle;        /* adopt: the daemon's handle and token */
    uint8_t token[PROTO_TOKEN_LEN];
};

static int map_send(shmref_conn *conn, struct pending *p)
{
    const struct table_req *t = p->user;
    struct proto_msg req = { .op = PROTO_OP_MAP };
    req.u.map.buf_id = t->buf_id;
    return pending_submit_msg(conn, p, &req);
}

static int map_take(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds,
                    bool lost)
{
    struct table_req *t = p->user;
    const typeof(rep->u.lease_reply) *l = &rep->u.lease_reply;
    for (unsigned i = 1; i < nfds; i++)
        close(fds[i]);
    int fd = nfds > 0 ? fds[0] : -1, r;
    if (lost || fd < 0 || l->buf_id != t->buf_id) {
        if (fd >= 0)
            close(fd);
        if (lost || fd >= 0) /* the daemon counts the fd it sent: say it was not kept */
            client_forget(conn, l->buf_id, true);
        return client_fail(conn, lost ? -EMFILE : -EPROTO, "map: no fd for buffer %llu",
                           (unsigned long long)t->buf_id);
    }
    r = mapcache_get(&conn->cache, l->buf_id, fd, (size_t)l->capacity, true, &t->data);
    close(fd);
    if (r < 0) {
        client_forget(conn, l->buf_id, true);
        return client_fail(conn, r, "mmap of %llu bytes failed: %s", (unsigned long long)l->capacity, strerror(-r));
    }
    if (l->flags & PROTO_BUF_RETIRE)
        mapcache_nocache(&conn->cache, t->data);
    t->len = (size_t)l->capacity;
    return 0;
}

static const struct pending_ops map_ops = { .send = map_send, .take = map_take };

/* table_round_trip: a map or adopt request for t, waited for. 0 or -errno. */
static int table_round_trip(shmref_conn *conn, uint32_t op, const struct pending_ops *ops, struct table_req *t)
{
    struct pending *p = pending_new(conn, op, PENDING_WAIT, ops);
    if (!p)
        return pending_new_error(conn);
    p->user = t;
    int r = pending_submit(conn, p);
    if (r == 0)
        r = pending_wait(conn, p, pending_budget(conn, 0));
    pending_free(conn, p);
    return r;
}

/* lease_local: a lease popped from the table (0), or -EAGAIN: ask the daemon. */
static int lease_local(shmref_conn *conn, size_t size, shmref_buf **ret_buf)
{
    struct localhold_popped pp;
    shmref_buf *b = NULL;
    int r = localhold_lease(conn, size, &b, &pp);
    if (r == 1) { /* this process does not map it yet: its fd, once */
        struct table_req t = { .buf_id = pp.buf_id };
        char keep[sizeof(conn->errmsg)];
        memcpy(keep, conn->errmsg, sizeof(keep));
        if (table_round_trip(conn, PROTO_OP_MAP, &map_ops, &t) < 0) {
            memcpy(conn->errmsg, keep, sizeof(keep));
            localhold_lease_drop(conn, &pp);
            return client_usable(conn) < 0 ? conn->failed : -EAGAIN;
        }
        r = localhold_lease_mapped(conn, &pp, t.data, t.len, &b);
    }
    if (r == -ENOMEM)
        return client_fail(conn, -ENOMEM, "out of memory");
    if (r < 0)
        return -EAGAIN;
    handle_link(conn, b);
    *ret_buf = b;
    return 0;
}

static int lease_ex(shmref_conn *conn, size_t size, uint32_t wait_ms, bool table, shmref_buf **ret_buf)
{
    int r = client_enter(conn);
    if (r < 0)
        return r;
    /* The table first: the tenant's own free buffers, no message. Empty: a lease of the
     * daemon's that joins the table at its end (the free lists are the stock). */
    bool for_table = table && localhold_on(conn);
    if (for_table && (r = lease_local(conn, size, ret_buf)) != -EAGAIN)
        return r;
    if (!localhold_on(conn) && stock_eligible(conn, size)) {
        struct pending *refill = NULL;
        shmref_buf *b;
        if ((r = stock_take(conn, size, &b, &refill)) == 1) {
            conn->counters.stock_hits++;
            *ret_buf = b;
            return 0;
        }
        conn->counters.stock_misses++;
        if (refill) { /* a refill of this class is on its way: it is ours */
            if ((r = lease_wait(conn, refill, 0, ret_buf)) == 0 || client_usable(conn) < 0)
                return r;
            conn->errmsg[0] = '\0'; /* the refill failed: a lease of our own, below */
        }
    }
    struct pending *p = stock_lease_new(conn, PENDING_WAIT, size, size, wait_ms);
    if (!p)
        return pending_new_error(conn);
    p->for_table = for_table;
    if ((r = pending_submit(conn, p)) < 0) {
        pending_free(conn, p);
        return r;
    }
    return lease_wait(conn, p, wait_ms, ret_buf);
}

int shmref_lease_ex(shmref_conn *conn, size_t size, unsigned flags, uint32_t wait_ms, shmref_buf **ret_buf)
{
    if (!conn)
        return -EINVAL;
    if (!ret_buf || size == 0 || flags || wait_ms > PROTO_MAX_LEASE_WAIT_MS)
        return client_fail(conn, -EINVAL, "lease: size must be at least 1, ret_buf not NULL, flags 0 and "
                           "wait_ms at most %d", PROTO_MAX_LEASE_WAIT_MS);
    return lease_ex(conn, size, wait_ms, true, ret_buf);
}

int lease_plain(shmref_conn *conn, size_t size, uint32_t wait_ms, shmref_buf **ret_buf)
{
    return lease_ex(conn, size, wait_ms, false, ret_buf);
}

/* ---- a table lease that needs the daemon for its publish ---- */

static int adopt_send(shmref_conn *conn, struct pending *p)
{
    const struct table_req *t = p->user;
    struct proto_msg req = { .op = PROTO_OP_ADOPT };
    req.u.adopt.buf_id = t->buf_id;
    req.u.adopt.seq = t->seq;
    return pending_submit_msg(conn, p, &req);
}

static int adopt_take(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds,
                      bool lost)
{
    (void)lost;
    struct table_req *t = p->user;
    for (unsigned i = 0; i < nfds; i++)
        close(fds[i]);
    if (rep->u.lease_reply.buf_id != t->buf_id || !rep->u.lease_reply.handle) {
        if (rep->u.lease_reply.handle)
            client_release_handle(conn, rep->u.lease_reply.handle);
        return client_fail(conn, -EPROTO, "adopt: shmrefd answered for another buffer");
    }
    t->handle = rep->u.lease_reply.handle;
    memcpy(t->token, rep->u.lease_reply.token, PROTO_TOKEN_LEN);
    return 0;
}

static const struct pending_ops adopt_ops = { .send = adopt_send, .take = adopt_take };

/* to_daemon: buf, a table lease, becomes a lease of the daemon's: adopted (a round trip),
 * or for a sealed publish copied (len bytes) into a new daemon lease whose fields buf
 * takes over (F_SEAL_WRITE needs every writable mapping gone, and other processes of the
 * uid may map a table buffer writable). The caller's buf stays the same object. */
static int to_daemon(shmref_buf *buf, size_t len, bool sealed)
{
    shmref_conn *conn = buf->conn;
    if (!sealed) {
        struct table_req t = { .buf_id = buf->buf_id, .seq = buf->seq };
        int r = table_round_trip(conn, PROTO_OP_ADOPT, &adopt_ops, &t);
        if (r == 0) {
            localhold_adopted(buf, t.handle, t.token);
            conn->counters.table_adopts++;
        }
        return r;
    }
    shmref_buf *d;
    int r = lease_plain(conn, buf->size, 0, &d);
    if (r < 0)
        return r;
    memcpy(d->data, buf->data, len);
    shmref_buf tmp = *buf;
#define SWAP(f) (buf->f = d->f, d->f = tmp.f)
    SWAP(handle);
    SWAP(buf_id);
    SWAP(data);
    SWAP(capacity);
    SWAP(table);
    SWAP(slot);
    SWAP(seq);
#undef SWAP
    memcpy(buf->token, d->token, PROTO_TOKEN_LEN);
    memcpy(d->token, tmp.token, PROTO_TOKEN_LEN);
    handle_drop(d); /* now the table lease: given back in the table */
    return 0;
}

int shmref_publish(shmref_buf *buf, size_t len, uint32_t keep_ms, const void *meta, size_t meta_len,
                   shmref_desc *ret_desc)
{
    return shmref_publish_ex(buf, len, keep_ms, 0, 0, meta, meta_len, ret_desc);
}

int lease_publish_check(shmref_buf *buf, size_t len, unsigned flags)
{
    shmref_conn *conn = buf->conn;
    if (!buf->writable)
        return client_fail(conn, -EPERM, "an acquired buffer cannot be published");
    if (len > buf->size)
        return client_fail(conn, -EINVAL, "publish of %zu bytes exceeds the leased %zu", len, buf->size);
    bool sealed = flags & SHMREF_PUBLISH_SEALED;
    if (sealed && !(conn->features & PROTO_FEAT_SEALED))
        return client_fail(conn, -EOPNOTSUPP, "this shmrefd does not take sealed publishes");
    if (buf->published)
        return client_fail(conn, -EALREADY, "the buffer is already published");
    return 0;
}

int lease_publish_send(shmref_buf *buf, size_t len, uint32_t keep_ms, uint32_t max_acquires, unsigned flags,
                       const void *meta, size_t meta_len, struct pending *p, shmref_desc *ret_desc)
{
    shmref_conn *conn = buf->conn;
    bool sealed = flags & SHMREF_PUBLISH_SEALED;
    if (buf->table) {
        int r = -EAGAIN;
        if (!sealed && !keep_ms && !max_acquires && (r = localhold_publish(buf, len, meta, meta_len, ret_desc)) == 0)
            return 0;
        if (r == -ESTALE)
            return client_fail(conn, -ESTALE, "publish: the table no longer has this lease (its table was taken "
                               "back, or another process of this uid wrote into it)");
        if ((r = to_daemon(buf, len, sealed)) < 0)
            return r;
    }
    if (sealed && buf->data) {
        /* F_SEAL_WRITE needs every writable mapping gone: ours goes (and the daemon is
         * told, before the publish, that this connection no longer maps it). */
        mapcache_drop_view(&conn->cache, buf->buf_id);
        mapcache_drop(&conn->cache, buf->data);
        buf->data = NULL;
    }
    struct proto_msg req = { .op = PROTO_OP_PUBLISH };
    req.u.publish.handle = buf->handle;
    req.u.publish.size = len;
    req.u.publish.keep_ms = keep_ms;
    req.u.publish.meta = meta;
    req.u.publish.meta_len = (uint32_t)meta_len;
    req.u.publish.flags = sealed ? PROTO_PUBLISH_SEALED : 0;
    req.u.publish.max_acquires = max_acquires;
    if (!sealed) {
        /* The descriptor is known since the lease: nothing to wait for. The daemon
         * handles this connection's requests in order, so whatever it asks next sees the
         * buffer published, and an acquire from elsewhere that overtakes it waits for it. */
        req.u.publish.flags |= PROTO_PUBLISH_NOREPLY;
        int r = client_send(conn, &req);
        if (r < 0)
            return r;
        buf->published = true;
        memcpy(ret_desc->token, buf->token, SHMREF_TOKEN_LEN);
        ret_desc->size = len;
        return 0;
    }
    /* Sealed: the caller must know that the seal held. The request refers to the handle:
     * it stays valid (a release meanwhile is deferred) until the reply is taken in. */
    p->buf = buf;
    int r = pending_submit_msg(conn, p, &req);
    if (r == 0) {
        handle_hold(buf);
        p->holds = true;
    }
    return r;
}

int shmref_publish_ex(shmref_buf *buf, size_t len, uint32_t keep_ms, uint32_t max_acquires, unsigned flags,
                      const void *meta, size_t meta_len, shmref_desc *ret_desc)
{
    if (!buf || !ret_desc || (meta_len && !meta) || meta_len > SHMREF_META_MAX || (flags & ~SHMREF_PUBLISH_SEALED))
        return -EINVAL;
    shmref_conn *conn = buf->conn;
    int r = client_enter(conn);
    if (r < 0 || (r = lease_publish_check(buf, len, flags)) < 0)
        return r;
    struct pending *p = pending_new(conn, PROTO_OP_PUBLISH, PENDING_WAIT, &lease_publish_ops);
    if (!p)
        return pending_new_error(conn);
    r = lease_publish_send(buf, len, keep_ms, max_acquires, flags, meta, meta_len, p, ret_desc);
    if (r == 0 && p->buf) { /* a publish with a reply */
        if ((r = pending_wait(conn, p, pending_budget(conn, 0))) == 0)
            *ret_desc = p->desc;
    }
    p->buf = NULL;
    pending_free(conn, p);
    return r;
}

int shmref_acquire(shmref_conn *conn, const shmref_desc *desc, shmref_buf **ret_buf)
{
    return shmref_acquire_ex(conn, desc, 0, ret_buf);
}

int shmref_acquire_ex(shmref_conn *conn, const shmref_desc *desc, unsigned flags, shmref_buf **ret_buf)
{
    return lease_acquire(conn, desc, flags, true, ret_buf);
}

int lease_acquire(shmref_conn *conn, const shmref_desc *desc, unsigned flags, bool local, shmref_buf **ret_buf)
{
    if (!conn)
        return -EINVAL;
    if (!desc || !ret_buf || (flags & ~(SHMREF_ACQUIRE_SEALED | SHMREF_ACQUIRE_PRIVATE)))
        return client_fail(conn, -EINVAL, "acquire: desc and ret_buf must not be NULL, flags known");
    int r = client_enter(conn);
    if (r < 0)
        return r;
    /* A private acquire always asks the daemon: its mapping is its own, never shared. */
    bool priv = (flags & SHMREF_ACQUIRE_PRIVATE) != 0;
    shmref_buf *b = priv ? NULL : handle_share(conn, desc, flags);
    if (b || (local && !priv && (b = handle_local(conn, desc, flags)))) {
        *ret_buf = b;
        return 0;
    }
    struct pending *p = pending_new(conn, PROTO_OP_ACQUIRE, PENDING_WAIT, &lease_acquire_ops);
    if (!p)
        return pending_new_error(conn);
    p->desc = *desc;
    p->wait_ms = (uint32_t)conn->acquire_wait_ms;
    p->require_sealed = (flags & SHMREF_ACQUIRE_SEALED) != 0;
    p->private_map = priv;
    if ((r = pending_submit(conn, p)) == 0 &&
        (r = pending_wait(conn, p, pending_budget(conn, p->wait_ms))) == 0) {
        *ret_buf = p->buf;
        p->buf = NULL;
    }
    pending_free(conn, p);
    return r;
}

int shmref_set_acquire_wait(shmref_conn *conn, int wait_ms)
{
    if (!conn || wait_ms < -1 || wait_ms > PROTO_MAX_ACQUIRE_WAIT_MS)
        return -EINVAL;
    conn->acquire_wait_set = wait_ms >= 0;
    conn->acquire_wait_ms = wait_ms >= 0 ? wait_ms : client_acquire_wait_default(conn->timeout_ms);
    return 0;
}

int shmref_release(shmref_buf *buf)
{
    if (!buf)
        return 0;
    if (buf->doomed)
        return 0;
    shmref_conn *conn = buf->conn;
    client_adopt(conn);
    if (buf->inherited) { /* a forked child's copy: its memory only, no connection needed */
        handle_forget(buf);
        return 0;
    }
    int r = client_enter(conn);
    if (buf->busy) { /* a request in flight refers to it: released when that ends */
        handle_release_busy(buf);
        return r;
    }
    uint64_t handle = handle_forget(buf);
    if (r < 0 || handle == 0)
        return r;
    struct proto_msg req = { .op = PROTO_OP_RELEASE };
    req.u.release.handle = handle;
    req.u.release.flags = PROTO_RELEASE_NOREPLY;
    return client_send(conn, &req);
}

/* send_release_many: one one-way release_many of n handles. */
static int send_release_many(shmref_conn *conn, const uint64_t *handles, unsigned n)
{
    if (n == 0)
        return 0;
    struct proto_msg req = { .op = PROTO_OP_RELEASE_MANY };
    req.u.release_many.n = n;
    req.u.release_many.flags = PROTO_RELEASE_NOREPLY;
    memcpy(req.u.release_many.handles, handles, n * sizeof(*handles));
    return client_send(conn, &req);
}

int shmref_release_many(shmref_buf **bufs, size_t n)
{
    int first = 0;
    if (!bufs && n)
        return -EINVAL;
    shmref_conn *cur = NULL;
    uint64_t handles[PROTO_MAX_BATCH];
    unsigned k = 0;
    int ok = 0;
    for (size_t i = 0; i < n; i++) {
        shmref_buf *b = bufs[i];
        if (!b)
            continue;
        bufs[i] = NULL;
        if (b->doomed)
            continue;
        client_adopt(b->conn);
        if (b->inherited) { /* a forked child's copy: its memory only */
            handle_forget(b);
            continue;
        }
        if (b->busy) { /* a request in flight refers to it: released when that ends */
            shmref_release(b);
            continue;
        }
        if (b->conn != cur) { /* handles of another connection: its own messages */
            int r = cur && ok == 0 ? send_release_many(cur, handles, k) : 0;
            if (r < 0 && !first)
                first = r;
            k = 0;
            cur = b->conn;
            ok = client_enter(cur);
            if (ok < 0 && !first)
                first = ok;
        }
        uint64_t h = handle_forget(b);
        if (!h || ok < 0)
            continue;
        if (!CLIENT_WIRE_BATCH) {
            client_release_handle(cur, h);
            continue;
        }
        handles[k++] = h;
        if (k == PROTO_MAX_BATCH) {
            int r = send_release_many(cur, handles, k);
            if (r < 0 && !first)
                first = r;
            k = 0;
        }
    }
    if (cur && ok == 0) {
        int r = send_release_many(cur, handles, k);
        if (r < 0 && !first)
            first = r;
    }
    return first;
}

/* lease_many_chunk: one request for k leases: a lease_many (or, without it, k leases). */
static int lease_many_submit(shmref_conn *conn, const size_t *sizes, size_t k, struct pending **ret)
{
    if (!CLIENT_WIRE_BATCH) {
        for (size_t i = 0; i < k; i++) {
            struct pending *p = stock_lease_new(conn, PENDING_WAIT, sizes[i], sizes[i], 0);
            if (!p)
                return pending_new_error(conn);
            int r = pending_submit(conn, p);
            if (r < 0) {
                pending_free(conn, p);
                return r;
            }
            ret[i] = p;
        }
        return 0;
    }
    struct pending *p = pending_new(conn, PROTO_OP_LEASE_MANY, PENDING_WAIT, &stock_lease_ops);
    if (!p || !(p->sizes = malloc(k * sizeof(uint64_t)))) {
        pending_free(conn, p);
        return client_fail(conn, -ENOMEM, "out of memory");
    }
    p->n = (unsigned)k;
    for (size_t i = 0; i < k; i++)
        p->sizes[i] = sizes[i];
    int r = pending_submit(conn, p);
    if (r < 0) {
        pending_free(conn, p);
        return r;
    }
    ret[0] = p;
    return 0;
}

int shmref_lease_many(shmref_conn *conn, const size_t *sizes, size_t n, shmref_buf **ret_bufs)
{
    if (!conn)
        return -EINVAL;
    if (n && (!sizes || !ret_bufs))
        return client_fail(conn, -EINVAL, "lease_many: sizes and ret_bufs must not be NULL");
    for (size_t i = 0; i < n; i++)
        if (sizes[i] == 0)
            return client_fail(conn, -EINVAL, "lease_many: sizes[%zu] is 0", i);
    int err = client_enter(conn);
    if (err < 0 || n == 0)
        return err;
    memset(ret_bufs, 0, n * sizeof(*ret_bufs));
    /* Every chunk is sent before the first answer is waited for: one round trip per chunk
     * at most, overlapping. Records are matched to their slice of ret_bufs in order. */
    size_t nrec = CLIENT_WIRE_BATCH ? (n + PROTO_MAX_BATCH - 1) / PROTO_MAX_BATCH : n;
    struct pending **recs = calloc(nrec, sizeof(*recs));
    if (!recs)
        return client_fail(conn, -ENOMEM, "out of memory");
    size_t per = CLIENT_WIRE_BATCH ? PROTO_MAX_BATCH : 1;
    for (size_t done = 0; done < n && !err; done += per * (CLIENT_WIRE_BATCH ? 1 : PROTO_MAX_BATCH)) {
        size_t chunk = CLIENT_WIRE_BATCH ? per : PROTO_MAX_BATCH;
        size_t k = n - done < chunk ? n - done : chunk;
        err = lease_many_submit(conn, sizes + done, k, recs + done / per);
    }
    char keep[sizeof(conn->errmsg)] = "";
    if (err)
        memcpy(keep, conn->errmsg, sizeof(keep));
    for (size_t i = 0; i < nrec; i++) {
        struct pending *p = recs[i];
        if (!p)
            continue;
        int r = pending_wait(conn, p, pending_budget(conn, 0));
        if (r < 0 && !err) {
            err = r;
            memcpy(keep, conn->errmsg, sizeof(keep));
        } else if (r == 0 && p->op == PROTO_OP_LEASE) {
            ret_bufs[i] = p->buf;
            p->buf = NULL;
        } else if (r == 0) {
            memcpy(ret_bufs + i * per, p->bufs, p->n * sizeof(*p->bufs));
            memset(p->bufs, 0, p->n * sizeof(*p->bufs));
        }
        pending_free(conn, p);
    }
    free(recs);
    if (err) {
        shmref_release_many(ret_bufs, n);
        memcpy(conn->errmsg, keep, sizeof(keep));
    }
    return err;
}

/* ---- retain ---- */

static int retain_send(shmref_conn *conn, struct pending *p)
{
    struct proto_msg req = { .op = PROTO_OP_RETAIN };
    memcpy(req.u.retain.token, p->desc.token, PROTO_TOKEN_LEN);
    req.u.retain.keep_ms = p->wait_ms;
    return pending_submit_msg(conn, p, &req);
}

static const struct pending_ops retain_ops = { .send = retain_send };

int shmref_retain(shmref_conn *conn, const shmref_desc *desc, uint32_t keep_ms)
{
    if (!conn)
        return -EINVAL;
    if (!desc || keep_ms == 0)
        return client_fail(conn, -EINVAL, "retain: desc must not be NULL, keep_ms at least 1");
    int r = client_enter(conn);
    if (r < 0)
        return r;
    /* never asked of a daemon that did not agree it: it would refuse an unknown op, and
     * the caller could not tell that from a refusal of this retain */
    if (!(conn->features & PROTO_FEAT_RETAIN))
        return client_fail(conn, -EOPNOTSUPP, "retain: this shmrefd does not know retain requests: it did not "
                           "agree PROTO_FEAT_RETAIN in hello");
    struct pending *p = pending_new(conn, PROTO_OP_RETAIN, PENDING_WAIT, &retain_ops);
    if (!p)
        return pending_new_error(conn);
    p->desc = *desc;
    p->wait_ms = keep_ms; /* the record's one duration: here the retention's */
    if ((r = pending_submit(conn, p)) == 0)
        r = pending_wait(conn, p, pending_budget(conn, 0));
    pending_free(conn, p);
    return r;
}

/* ---- acquire and sealed publish requests: their handlers ---- */

int lease_acquire_send(shmref_conn *conn, struct pending *p)
{
    struct proto_msg req = { .op = PROTO_OP_ACQUIRE };
    if (p->private_map && !(conn->features & PROTO_FEAT_PRIVATE))
        return client_fail(conn, -EOPNOTSUPP, "acquire: this shmrefd does not know private acquires "
                           "(SHMREF_ACQUIRE_PRIVATE): it did not agree PROTO_FEAT_PRIVATE in hello");
    memcpy(req.u.acquire.token, p->desc.token, PROTO_TOKEN_LEN);
    req.u.acquire.wait_ms = p->wait_ms;
    req.u.acquire.flags = p->private_map ? PROTO_ACQUIRE_PRIVATE : 0;
    return pending_submit_msg(conn, p, &req);
}

static int acquire_take(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds,
                        bool lost)
{
    if (lost && p->private_map) { /* its fd was never counted: nothing to forget */
        for (unsigned i = 0; i < nfds; i++)
            close(fds[i]);
        handle_undo_reply(conn, rep, NULL, 0, false);
        return client_fail(conn, -EMFILE, "the private acquire's fd could not be received: this process is at its "
                           "open-file limit (RLIMIT_NOFILE); the buffer was released");
    }
    if (lost) {
        handle_lost(conn, p, rep, fds, nfds);
        return p->result;
    }
    for (unsigned i = 1; i < nfds; i++)
        close(fds[i]);
    int fd = nfds > 0 ? fds[0] : -1;
    const typeof(rep->u.acquire_reply) *l = &rep->u.acquire_reply;
    if (l->size != p->desc.size) {
        if (p->private_map) { /* its fd was never counted: nothing to forget */
            if (fd >= 0)
                close(fd);
            fd = -1;
        }
        handle_undo_reply(conn, rep, &fd, fd >= 0, false);
        return client_fail(conn, -EINVAL, "descriptor says %llu bytes, the buffer has %llu",
                           (unsigned long long)p->desc.size, (unsigned long long)l->size);
    }
    int r = handle_take(conn, l->handle, l->buf_id, l->size, l->capacity, l->token, l->meta, l->meta_len, l->flags, fd,
                        false, p->require_sealed, p->private_map, &p->buf);
    /* The daemon retires this buffer after its last release: a cached mapping would never
     * be used again, and would pin a sealed buffer's pages until exit. */
    if (r == 0 && (l->flags & PROTO_BUF_RETIRE) && !p->private_map)
        handle_uncacheable(p->buf);
    return r;
}

static void acquire_release(shmref_conn *conn, struct pending *p)
{
    (void)conn;
    if (p->buf)
        handle_drop(p->buf);
    p->buf = NULL;
}

const struct pending_ops lease_acquire_ops = {
    .send = lease_acquire_send,
    .take = acquire_take,
    .refused = stock_retry,
    .release = acquire_release,
};

static int publish_take(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds,
                        bool lost)
{
    (void)conn;
    (void)lost;
    for (unsigned i = 0; i < nfds; i++)
        close(fds[i]);
    memcpy(p->desc.token, rep->u.publish_reply.token, SHMREF_TOKEN_LEN);
    p->desc.size = rep->u.publish_reply.size;
    if (p->buf)
        p->buf->published = true;
    return 0;
}

static void publish_unhold(struct pending *p)
{
    p->buf = handle_unhold(p->buf);
}

const struct pending_ops lease_publish_ops = {
    .take = publish_take,
    .unhold = publish_unhold,
};
