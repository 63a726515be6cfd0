/* SPDX-License-Identifier: MIT */
/* lease.c: buffers of libshmref: lease, publish, acquire, release and the accessors.
 * A handle owns its place in the connection's list and a use of a cached mapping; the
 * fd that arrives with a buffer is closed as soon as the mapping exists. */
#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "desc.h"


static void link_buf(shmref_conn *conn, shmref_buf *b)
{
    b->conn = conn;
    b->prev = NULL;
    b->next = conn->bufs;
    if (conn->bufs)
        conn->bufs->prev = b;
    conn->bufs = b;
}

static void unlink_buf(shmref_buf *b)
{
    if (b->prev) b->prev->next = b->next; else b->conn->bufs = b->next;
    if (b->next) b->next->prev = b->prev;
}

#define SEALS_NEEDED (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)

/* check_seals: for a buffer the daemon says is sealed (or one the caller requires
 * sealed), the seals on its fd, before anything maps it. */
static int check_seals(shmref_conn *conn, uint32_t flags, int fd, bool require)
{
    bool said = (flags & PROTO_BUF_SEALED) != 0;
    if (!said && !require)
        return 0;
    if (!said)
        return client_fail(conn, -EPERM, "the buffer is not sealed (its producer published it plainly)");
    if (fd < 0)
        return client_fail(conn, -EPROTO, "shmrefd sent a sealed buffer without its fd");
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & SEALS_NEEDED) != SEALS_NEEDED)
        return client_fail(conn, -EPERM, "the buffer is said to be sealed but its seals are %#x, not %#x",
                           seals < 0 ? 0 : (unsigned)seals, (unsigned)SEALS_NEEDED);
    return 1;
}

int lease_take(shmref_conn *conn, uint64_t handle, uint64_t buf_id, uint64_t size, uint64_t capacity,
               const uint8_t *token, const uint8_t *meta, uint32_t meta_len, uint32_t flags, int fd,
               bool writable, bool require_sealed, shmref_buf **ret_buf)
{
    shmref_buf *b = NULL;
    int r = writable ? 0 : check_seals(conn, flags, fd, require_sealed);
    if (r < 0)
        goto fail;
    bool sealed = r == 1;
    r = -ENOMEM;
    if (!(b = calloc(1, sizeof(*b))))
        goto fail;
    b->sealed = sealed;
    b->foreign = !writable && ((flags & PROTO_BUF_FOREIGN) || !(conn->features & PROTO_FEAT_FOREIGN));
    b->handle = handle;
    b->buf_id = buf_id;
    b->size = size;
    b->capacity = capacity;
    b->writable = writable;
    memcpy(b->token, token, PROTO_TOKEN_LEN);
    if (meta_len) {
        if (!(b->meta = malloc(meta_len)))
            goto fail;
        memcpy(b->meta, meta, meta_len);
        b->meta_len = meta_len;
    }
    /* A cached mapping needs no fd; a new one does. */
    b->data = mapcache_find(&conn->cache, b->buf_id, b->capacity, writable);
    if (!b->data) {
        if (fd < 0) {
            r = client_fail(conn, -EPROTO, "shmrefd sent no fd with the buffer");
            goto fail;
        }
        r = mapcache_get(&conn->cache, b->buf_id, fd, b->capacity, writable, &b->data);
        if (r < 0) {
            client_fail(conn, r, "mmap of %zu bytes failed: %s", b->capacity, strerror(-r));
            goto fail;
        }
    }
    if (fd >= 0)
        close(fd);
    link_buf(conn, b);
    *ret_buf = b;
    return 0;
fail:
    if (fd >= 0) { /* the daemon counts this fd as sent (fd-once): say it was not kept */
        close(fd);
        client_forget(conn, buf_id, writable);
    }
    if (b)
        free(b->meta);
    free(b);
    client_release_handle(conn, handle);
    return r == -ENOMEM ? client_fail(conn, -ENOMEM, "out of memory") : r;
}

uint64_t lease_forget(shmref_buf *buf)
{
    uint64_t handle = buf->handle;
    unlink_buf(buf);
    if (buf->data)
        mapcache_put(&buf->conn->cache, buf->data);
    if (buf->share) {
        if (atomic_fetch_sub(&buf->share->refs, 1) == 1)
            free(buf->share);
        else
            handle = 0; /* another local handle still holds the daemon's */
    }
    free(buf->meta);
    free(buf);
    return handle;
}

void lease_drop(shmref_buf *buf)
{
    shmref_conn *conn = buf->conn;
    uint64_t handle = lease_forget(buf);
    if (handle && client_usable(conn) == 0)
        client_release_handle(conn, handle);
}

int shmref_lease(shmref_conn *conn, size_t size, shmref_buf **ret_buf)
{
    return shmref_lease_ex(conn, size, 0, 0, ret_buf);
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

int shmref_lease_ex(shmref_conn *conn, size_t size, unsigned flags, uint32_t wait_ms, shmref_buf **ret_buf)
{
    if (!conn)
        return -EINVAL;
    if (!ret_buf || size == 0 || flags || wait_ms > PROTO_MAX_LEASE_WAIT_MS)
        return client_fail(conn, -EINVAL, "lease: size must be at least 1, ret_buf not NULL, flags 0 and "
                           "wait_ms at most %d", PROTO_MAX_LEASE_WAIT_MS);
    int r = client_enter(conn);
    if (r < 0)
        return r;
    if (stock_eligible(conn, size)) {
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
    struct pending *p = pending_new(conn, PROTO_OP_LEASE, PENDING_WAIT);
    if (!p)
        return -ENOMEM;
    p->size = p->want = size;
    p->wait_ms = wait_ms;
    if ((r = pending_submit(conn, p)) < 0) {
        pending_free(conn, p);
        return r;
    }
    return lease_wait(conn, p, wait_ms, ret_buf);
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
    if (sealed && buf->data) {
        /* F_SEAL_WRITE needs every writable mapping gone: ours goes (and the daemon is
         * told, before the publish, that this connection no longer maps it). */
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
    /* Sealed: the caller must know that the seal held. */
    p->buf = buf;
    return pending_submit_msg(conn, p, &req);
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
    struct pending *p = pending_new(conn, PROTO_OP_PUBLISH, PENDING_WAIT);
    if (!p)
        return -ENOMEM;
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

shmref_buf *lease_share(shmref_conn *conn, const shmref_desc *desc, unsigned flags)
{
    /* While any local handle holds the daemon's handle the daemon keeps its reference, so
     * the buffer cannot be recycled under a mapping: a new handle may share it. */
    for (shmref_buf *src = conn->bufs; src; src = src->next) {
        if (src->writable || src->pinned || !src->data || src->size != desc->size ||
            !desc_token_equal(src->token, desc->token) ||
            ((flags & SHMREF_ACQUIRE_SEALED) && !src->sealed))
            continue;
        shmref_buf *b = calloc(1, sizeof(*b));
        if (!b)
            return NULL;
        if (src->meta_len && !(b->meta = malloc(src->meta_len))) {
            free(b);
            return NULL;
        }
        if (!src->share) {
            if (!(src->share = malloc(sizeof(*src->share)))) {
                free(b->meta);
                free(b);
                return NULL;
            }
            atomic_init(&src->share->refs, 1);
        }
        atomic_fetch_add(&src->share->refs, 1);
        b->share = src->share;
        b->handle = src->handle;
        b->buf_id = src->buf_id;
        b->size = src->size;
        b->capacity = src->capacity;
        b->sealed = src->sealed;
        b->foreign = src->foreign;
        memcpy(b->token, src->token, SHMREF_TOKEN_LEN);
        if (src->meta_len)
            memcpy(b->meta, src->meta, src->meta_len);
        b->meta_len = src->meta_len;
        b->data = mapcache_find(&conn->cache, src->buf_id, src->capacity, false); /* one more user */
        if (!b->data) /* cannot be: src uses it */
            b->data = src->data;
        link_buf(conn, b);
        conn->counters.local_acquires++;
        return b;
    }
    return NULL;
}

int shmref_acquire_ex(shmref_conn *conn, const shmref_desc *desc, unsigned flags, shmref_buf **ret_buf)
{
    if (!conn)
        return -EINVAL;
    if (!desc || !ret_buf || (flags & ~SHMREF_ACQUIRE_SEALED))
        return client_fail(conn, -EINVAL, "acquire: desc and ret_buf must not be NULL, flags known");
    int r = client_enter(conn);
    if (r < 0)
        return r;
    shmref_buf *b = lease_share(conn, desc, flags);
    if (b) {
        *ret_buf = b;
        return 0;
    }
    struct pending *p = pending_new(conn, PROTO_OP_ACQUIRE, PENDING_WAIT);
    if (!p)
        return -ENOMEM;
    p->desc = *desc;
    p->wait_ms = (uint32_t)conn->acquire_wait_ms;
    p->require_sealed = (flags & SHMREF_ACQUIRE_SEALED) != 0;
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
    shmref_conn *conn = buf->conn;
    int r = client_enter(conn);
    uint64_t handle = lease_forget(buf);
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
        uint64_t h = lease_forget(b);
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
            struct pending *p = pending_new(conn, PROTO_OP_LEASE, PENDING_WAIT);
            if (!p)
                return -ENOMEM;
            p->size = p->want = sizes[i];
            p->refill = false;
            int r = pending_submit(conn, p);
            if (r < 0) {
                pending_free(conn, p);
                return r;
            }
            ret[i] = p;
        }
        return 0;
    }
    struct pending *p = pending_new(conn, PROTO_OP_LEASE_MANY, PENDING_WAIT);
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

void *shmref_buf_data(const shmref_buf *buf) { return buf ? buf->data : NULL; }
size_t shmref_buf_size(const shmref_buf *buf) { return buf ? buf->size : 0; }
size_t shmref_buf_capacity(const shmref_buf *buf) { return buf ? buf->capacity : 0; }
int shmref_buf_writable(const shmref_buf *buf) { return buf ? buf->writable : 0; }
int shmref_buf_sealed(const shmref_buf *buf) { return buf ? buf->sealed : 0; }

const void *shmref_buf_meta(const shmref_buf *buf, size_t *ret_len)
{
    if (ret_len)
        *ret_len = buf ? buf->meta_len : 0;
    return buf ? buf->meta : NULL;
}
