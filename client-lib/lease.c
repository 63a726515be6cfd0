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

/* send_release: drop a handle without waiting: the daemon processes a connection's
 * requests in order, so whatever this connection asks next sees the release done; an
 * error (impossible for a handle the library holds) would arrive as a stray reply, which
 * client_call skips. Without the feature, a plain round trip. */
static int send_release(shmref_conn *conn, uint64_t handle)
{
    struct proto_msg req = { .op = PROTO_OP_RELEASE }, rep;
    req.u.release.handle = handle;
    if (!(conn->features & PROTO_FEAT_NOREPLY_RELEASE))
        return client_call(conn, &req, &rep, NULL);
    req.u.release.flags = PROTO_RELEASE_NOREPLY;
    return client_send(conn, &req);
}

/* release_handle: tell the daemon to drop a handle we could not hand to the caller. */
static void release_handle(shmref_conn *conn, uint64_t handle)
{
    char keep[sizeof(conn->errmsg)];
    memcpy(keep, conn->errmsg, sizeof(keep));
    send_release(conn, handle);
    memcpy(conn->errmsg, keep, sizeof(keep));
}

#define SEALS_NEEDED (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)

/* check_seals: for a buffer the daemon says is sealed (or one the caller requires
 * sealed), the seals on its fd, before anything maps it. */
static int check_seals(shmref_conn *conn, const struct proto_msg *rep, int fd, bool require)
{
    bool said = (rep->u.acquire_reply.flags & PROTO_BUF_SEALED) != 0;
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

/* take_buffer: turn a lease or acquire reply (and its fd) into a handle. */
static int take_buffer(shmref_conn *conn, const struct proto_msg *rep, int fd, bool writable,
                       bool require_sealed, shmref_buf **ret_buf)
{
    uint64_t handle = rep->u.lease_reply.handle, buf_id = rep->u.lease_reply.buf_id;
    shmref_buf *b = NULL;
    int r = writable ? 0 : check_seals(conn, rep, fd, require_sealed);
    if (r < 0)
        goto fail;
    bool sealed = r == 1;
    r = -ENOMEM;
    if (!(b = calloc(1, sizeof(*b))))
        goto fail;
    b->sealed = sealed;
    b->handle = handle;
    b->buf_id = rep->u.lease_reply.buf_id;
    b->size = rep->u.lease_reply.size;
    b->capacity = rep->u.lease_reply.capacity;
    b->writable = writable;
    if (rep->u.lease_reply.meta_len) {
        if (!(b->meta = malloc(rep->u.lease_reply.meta_len)))
            goto fail;
        memcpy(b->meta, rep->u.lease_reply.meta, rep->u.lease_reply.meta_len);
        b->meta_len = rep->u.lease_reply.meta_len;
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
    release_handle(conn, handle);
    return r == -ENOMEM ? client_fail(conn, -ENOMEM, "out of memory") : r;
}

int shmref_lease(shmref_conn *conn, size_t size, shmref_buf **ret_buf)
{
    if (!conn)
        return -EINVAL;
    if (!ret_buf || size == 0)
        return client_fail(conn, -EINVAL, "lease: size must be at least 1 and ret_buf not NULL");
    struct proto_msg req = { .op = PROTO_OP_LEASE }, rep;
    int fd = -1;
    req.u.lease.size = size;
    int r = client_call(conn, &req, &rep, &fd);
    /* Idle mappings this process keeps cached pin the pages of buffers the daemon may
     * have evicted since (the daemon charges them to this client, and its private tmpfs
     * is only as large as the pool): a lease refused for space is tried once more after
     * they are dropped. */
    if ((r == -ENOSPC || r == -EDQUOT) && mapcache_drop_idle(&conn->cache) > 0)
        r = client_call(conn, &req, &rep, &fd);
    if (r < 0)
        return r;
    return take_buffer(conn, &rep, fd, true, false, ret_buf);
}

int shmref_publish(shmref_buf *buf, size_t len, uint32_t keep_ms, const void *meta, size_t meta_len,
                   shmref_desc *ret_desc)
{
    return shmref_publish_ex(buf, len, keep_ms, 0, 0, meta, meta_len, ret_desc);
}

int shmref_publish_ex(shmref_buf *buf, size_t len, uint32_t keep_ms, uint32_t max_acquires, unsigned flags,
                      const void *meta, size_t meta_len, shmref_desc *ret_desc)
{
    if (!buf || !ret_desc || (meta_len && !meta) || meta_len > SHMREF_META_MAX || (flags & ~SHMREF_PUBLISH_SEALED))
        return -EINVAL;
    shmref_conn *conn = buf->conn;
    if (!buf->writable)
        return client_fail(conn, -EPERM, "an acquired buffer cannot be published");
    if (len > buf->size)
        return client_fail(conn, -EINVAL, "publish of %zu bytes exceeds the leased %zu", len, buf->size);
    bool sealed = flags & SHMREF_PUBLISH_SEALED;
    if (sealed && !(conn->features & PROTO_FEAT_SEALED))
        return client_fail(conn, -EOPNOTSUPP, "this shmrefd does not take sealed publishes");
    if (sealed && buf->published)
        return client_fail(conn, -EALREADY, "the buffer is already published");
    if (sealed && buf->data) {
        /* F_SEAL_WRITE needs every writable mapping gone: ours goes (and the daemon is
         * told, before the publish, that this connection no longer maps it). */
        mapcache_drop(&conn->cache, buf->data);
        buf->data = NULL;
    }
    struct proto_msg req = { .op = PROTO_OP_PUBLISH }, rep;
    req.u.publish.handle = buf->handle;
    req.u.publish.size = len;
    req.u.publish.keep_ms = keep_ms;
    req.u.publish.meta = meta;
    req.u.publish.meta_len = (uint32_t)meta_len;
    req.u.publish.flags = sealed ? PROTO_PUBLISH_SEALED : 0;
    req.u.publish.max_acquires = max_acquires;
    int r = client_call(conn, &req, &rep, NULL);
    if (r < 0)
        return r;
    buf->published = true;
    memcpy(ret_desc->token, rep.u.publish_reply.token, SHMREF_TOKEN_LEN);
    ret_desc->size = rep.u.publish_reply.size;
    return 0;
}

int shmref_acquire(shmref_conn *conn, const shmref_desc *desc, shmref_buf **ret_buf)
{
    return shmref_acquire_ex(conn, desc, 0, ret_buf);
}

int shmref_acquire_ex(shmref_conn *conn, const shmref_desc *desc, unsigned flags, shmref_buf **ret_buf)
{
    if (!conn)
        return -EINVAL;
    if (!desc || !ret_buf || (flags & ~SHMREF_ACQUIRE_SEALED))
        return client_fail(conn, -EINVAL, "acquire: desc and ret_buf must not be NULL, flags known");
    struct proto_msg req = { .op = PROTO_OP_ACQUIRE }, rep;
    int fd = -1;
    memcpy(req.u.acquire.token, desc->token, SHMREF_TOKEN_LEN);
    int r = client_call(conn, &req, &rep, &fd);
    /* Over quota with pinned bytes (idle mappings of buffers no lease holds): once more
     * after dropping them, as for a lease. */
    if (r == -EDQUOT && mapcache_drop_idle(&conn->cache) > 0)
        r = client_call(conn, &req, &rep, &fd);
    if (r < 0)
        return r;
    if (rep.u.acquire_reply.size != desc->size) {
        uint64_t have = rep.u.acquire_reply.size;
        if (fd >= 0) {
            close(fd);
            client_forget(conn, rep.u.acquire_reply.buf_id, false);
        }
        release_handle(conn, rep.u.acquire_reply.handle);
        return client_fail(conn, -EINVAL, "descriptor says %llu bytes, the buffer has %llu",
                           (unsigned long long)desc->size, (unsigned long long)have);
    }
    return take_buffer(conn, &rep, fd, false, (flags & SHMREF_ACQUIRE_SEALED) != 0, ret_buf);
}

/* forget: the handle's local half: list, mapping use, memory. */
static void forget(shmref_buf *buf)
{
    unlink_buf(buf);
    mapcache_put(&buf->conn->cache, buf->data);
    free(buf->meta);
    free(buf);
}

int shmref_release(shmref_buf *buf)
{
    if (!buf)
        return 0;
    shmref_conn *conn = buf->conn;
    uint64_t handle = buf->handle;
    conn->errmsg[0] = '\0';
    forget(buf);
    return send_release(conn, handle);
}

int shmref_release_many(shmref_buf **bufs, size_t n)
{
    int first = 0;
    if (!bufs && n)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        int r = shmref_release(bufs[i]);
        bufs[i] = NULL;
        if (r < 0 && first == 0)
            first = r;
    }
    return first;
}

/* A window of pipelined leases: small enough that requests and replies always fit in
 * the socket buffers, so neither side can block on the other. */
#define LEASE_WINDOW 32

/* lease_window: k leases pipelined; replies may come back in any order (a lease that
 * needs a new buffer completes later), so they are matched by id. */
static int lease_window(shmref_conn *conn, const size_t *sizes, size_t k, shmref_buf **ret)
{
    struct proto_msg req = { .op = PROTO_OP_LEASE }, rep;
    uint32_t ids[LEASE_WINDOW];
    size_t sent = 0, got = 0;
    int err = 0;
    for (; sent < k; sent++) {
        req.u.lease.size = sizes[sent];
        if ((err = client_send(conn, &req)) < 0)
            break;
        ids[sent] = req.id; /* ids may wrap (and skip 0) inside a window: match, don't subtract */
    }
    while (got < sent) {
        int fd, r = client_recv(conn, &rep, &fd);
        if (r < 0)
            return err ? err : r; /* the connection is gone: nothing more will come */
        size_t slot = 0;
        while (slot < sent && ids[slot] != rep.id)
            slot++;
        bool mine = slot < sent && !ret[slot] &&
                    (rep.op == PROTO_OP_ERROR || rep.op == PROTO_OP_LEASE + PROTO_OP_REPLY);
        if (!mine) { /* a stray reply to an earlier request: not one of ours */
            if (fd >= 0)
                close(fd);
            continue;
        }
        got++;
        ids[slot] = 0; /* answered (0 is never an id) */
        if (rep.op == PROTO_OP_ERROR) {
            if (fd >= 0)
                close(fd);
            if (!err)
                err = client_reply_error(conn, &rep);
            continue;
        }
        char keep[sizeof(conn->errmsg)];
        memcpy(keep, conn->errmsg, sizeof(keep));
        r = take_buffer(conn, &rep, fd, true, false, &ret[slot]);
        if (r < 0 && !err)
            err = r;
        else if (r < 0)
            memcpy(conn->errmsg, keep, sizeof(keep)); /* the first error's message stays */
    }
    return err;
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
    conn->errmsg[0] = '\0';
    if (n == 0)
        return 0;
    memset(ret_bufs, 0, n * sizeof(*ret_bufs));
    int err = 0;
    for (size_t done = 0; done < n && !err; done += LEASE_WINDOW) {
        size_t k = n - done < LEASE_WINDOW ? n - done : LEASE_WINDOW;
        err = lease_window(conn, sizes + done, k, ret_bufs + done);
    }
    if (err) {
        char keep[sizeof(conn->errmsg)];
        memcpy(keep, conn->errmsg, sizeof(keep));
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
