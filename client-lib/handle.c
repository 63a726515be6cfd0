/* SPDX-License-Identifier: MIT */
/* handle.c: see handle.h. A handle owns its place in the connection's list and a use of
 * a cached mapping; the fd that arrives with a buffer is checked (fstat), mapped, and
 * closed as soon as the mapping exists. */
#include "handle.h"

#include <errno.h>
#include <fcntl.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "localhold.h"
#include "mapcache.h"
#include "requests.h"
#include "transport.h"

static void no_free(void *p)
{
    (void)p;
}

void handle_link(shmref_conn *conn, shmref_buf *b)
{
    b->conn = conn;
    b->prev = NULL;
    b->next = conn->bufs;
    if (conn->bufs)
        conn->bufs->prev = b;
    conn->bufs = b;
}

/* The acquired handles a re-acquire of the same descriptor may share, by token and size
 * (one per descriptor: the first; tsearch(3), no scan of the connection's handles). */
static int cmp_token(const void *a, const void *b)
{
    const shmref_buf *x = a, *y = b;
    int c = memcmp(x->token, y->token, PROTO_TOKEN_LEN);
    if (c)
        return c;
    return x->size == y->size ? 0 : x->size < y->size ? -1 : 1;
}

static shmref_buf *shareable(shmref_conn *conn, const uint8_t *token, size_t size)
{
    shmref_buf key;
    memcpy(key.token, token, PROTO_TOKEN_LEN);
    key.size = size;
    void *n = tfind(&key, &conn->by_token, cmp_token);
    return n ? *(shmref_buf **)n : NULL;
}

static void list_shareable(shmref_conn *conn, shmref_buf *b)
{
    if (!b->writable && !shareable(conn, b->token, b->size) && tsearch(b, &conn->by_token, cmp_token))
        b->shareable = true;
}

static void unlink_buf(shmref_buf *b)
{
    if (b->shareable) {
        tdelete(b, &b->conn->by_token, cmp_token);
        b->shareable = false;
    }
    if (b->prev) b->prev->next = b->next; else b->conn->bufs = b->next;
    if (b->next) b->next->prev = b->prev;
    b->prev = b->next = NULL;
}

/* check_fd: an fd the daemon sent is mapped only if it is a regular file (a memfd or a
 * tmpfs/hugetlbfs file) that covers the buffer: a lying daemon gets an error, never a
 * SIGBUS on a read past the end of a short file. */
static int check_fd(shmref_conn *conn, int fd, uint64_t capacity)
{
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        return client_fail(conn, -e, "fstat of the buffer's fd failed: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode))
        return client_fail(conn, -EBADF, "shmrefd sent an fd that is not a regular file (mode %#o) for a buffer "
                           "of %llu bytes: refused", (unsigned)(st.st_mode & S_IFMT), (unsigned long long)capacity);
    if (st.st_size < 0 || (uint64_t)st.st_size < capacity)
        return client_fail(conn, -EBADF, "shmrefd sent an fd of %lld bytes for a buffer of %llu bytes: refused "
                           "(mapping it would fault past the end)", (long long)st.st_size,
                           (unsigned long long)capacity);
    return 0;
}

void handle_hold(shmref_buf *buf)
{
    buf->busy++;
}

shmref_buf *handle_unhold(shmref_buf *buf)
{
    if (!buf || --buf->busy > 0 || !buf->doomed)
        return buf;
    handle_drop(buf);
    return NULL;
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

/* map_private: a private acquire's own copy-on-write mapping of fd (PROTO_ACQUIRE_PRIVATE),
 * outside the mapping cache. No fd: the daemon does not know private acquires (it treated
 * this one as plain, and this connection maps the buffer already). */
static int map_private(shmref_conn *conn, shmref_buf *b, int fd)
{
    if (fd < 0)
        return client_fail(conn, -EOPNOTSUPP, "shmrefd sent no fd with a private acquire of buffer %llu: this "
                           "shmrefd does not know private acquires (PROTO_ACQUIRE_PRIVATE)",
                           (unsigned long long)b->buf_id);
    int r = check_fd(conn, fd, b->capacity);
    if (r < 0)
        return r;
    void *data = mmap(NULL, b->capacity ? b->capacity : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
        int e = errno;
        return client_fail(conn, -e, "private mmap of %llu bytes failed: %s", (unsigned long long)b->capacity,
                           strerror(e));
    }
    b->data = data;
    b->private_map = true;
    return 0;
}

int handle_take(shmref_conn *conn, uint64_t handle, uint64_t buf_id, uint64_t size, uint64_t capacity,
                const uint8_t *token, const uint8_t *meta, uint32_t meta_len, uint32_t flags, int fd,
                bool writable, bool require_sealed, bool private_map, shmref_buf **ret_buf)
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
    if (private_map) {
        if ((r = map_private(conn, b, fd)) < 0)
            goto fail;
        close(fd);
        handle_link(conn, b); /* never shareable: its mapping is this handle's alone */
        *ret_buf = b;
        return 0;
    }
    /* A cached mapping needs no fd; a new one does. */
    b->data = mapcache_find(&conn->cache, b->buf_id, b->capacity, writable);
    if (!b->data) {
        if (fd < 0) {
            /* Our mapping of it was dropped (and its forget sent) while this reply was on
             * its way: the daemon, not knowing yet, sent no fd. -ESTALE: the request is
             * asked once more (requests.c), now with the fd. */
            r = client_fail(conn, -ESTALE, "shmrefd sent no fd with buffer %llu, whose mapping this process "
                            "dropped while the reply was on its way", (unsigned long long)buf_id);
            goto fail;
        }
        if ((r = check_fd(conn, fd, b->capacity)) < 0)
            goto fail;
        r = mapcache_get(&conn->cache, b->buf_id, fd, b->capacity, writable, &b->data);
        if (r < 0) {
            client_fail(conn, r, "mmap of %zu bytes failed: %s", b->capacity, strerror(-r));
            goto fail;
        }
    }
    if (fd >= 0)
        close(fd);
    handle_link(conn, b);
    list_shareable(conn, b);
    *ret_buf = b;
    return 0;
fail:
    if (fd >= 0) { /* the daemon counts this fd as sent (fd-once): say it was not kept */
        close(fd);
        if (!private_map) /* a private acquire's fd is not counted: nothing to forget */
            client_forget(conn, buf_id, writable);
    }
    if (b)
        free(b->meta);
    free(b);
    client_release_handle(conn, handle);
    return r == -ENOMEM ? client_fail(conn, -ENOMEM, "out of memory") : r;
}

uint64_t handle_forget(shmref_buf *buf)
{
    if (buf->pinned && atomic_load(&buf->conn->closed)) {
        handle_forget_pinned(buf); /* kept past shmref_close: off the list, its conn kept for it */
        return 0;
    }
    uint64_t handle = buf->handle;
    if (buf->table)
        localhold_give(buf); /* before its mapping's use goes (and maybe a forget is sent) */
    unlink_buf(buf);
    /* A private mapping is this handle's alone (no forget: the daemon never counted it);
     * in a forked child an inherited one stays mapped, as every inherited mapping does. */
    if (buf->data && buf->private_map) {
        if (!buf->inherited)
            munmap(buf->data, buf->capacity ? buf->capacity : 1);
    } else if (buf->data)
        mapcache_put(&buf->conn->cache, buf->data);
    if (buf->share) {
        if (atomic_fetch_sub(&buf->share->refs, 1) == 1)
            free(buf->share);
        else
            handle = 0; /* another local handle still holds the daemon's */
    }
    if (buf->inherited)
        handle = 0; /* the parent's (a forked child): not this process's to release */
    free(buf->meta);
    free(buf);
    return handle;
}

void handle_forget_pinned(shmref_buf *buf)
{
    shmref_conn *conn = buf->conn;
    bool last = !buf->share || atomic_fetch_sub(&buf->share->refs, 1) == 1;
    if (buf->share && last)
        free(buf->share);
    /* A forked child's inherited handle is its parent's: never released here (and the
     * child's own connection, if it made one, never had it). */
    if (last && !buf->inherited && (conn->features & PROTO_FEAT_NOREPLY_RELEASE) && client_pid() == conn->pid) {
        struct proto_msg req = { .op = PROTO_OP_RELEASE, .id = 1 };
        req.u.release.handle = buf->handle;
        req.u.release.flags = PROTO_RELEASE_NOREPLY;
        transport_send_direct(conn, &req); /* else: at close */
    }
    free(buf->meta);
    free(buf);
    if (atomic_fetch_sub(&conn->pins, 1) == 1) {
        transport_bye(conn);
        handle_teardown(conn);
    }
}

void handle_teardown(shmref_conn *conn)
{
    conn->cache.on_unmap = NULL; /* the daemon forgets everything with the connection */
    /* In a forked child the inherited mappings stay (adopt abandoned them): arrays it
     * inherited may still be read there; its copy of the socket closes, the parent's
     * connection stays as it was. */
    if (client_pid() == conn->pid)
        mapcache_clear(&conn->cache);
    else
        mapcache_abandon(&conn->cache);
    localhold_unmap(conn);
    if (conn->fd >= 0)
        close(conn->fd);
    pending_discard(conn);
    transport_discard(conn);
    tdestroy(conn->by_token, no_free);
    free(conn->path);
    free(conn);
}

void handle_drop(shmref_buf *buf)
{
    shmref_conn *conn = buf->conn;
    uint64_t handle = handle_forget(buf);
    if (handle)
        client_release_handle(conn, handle); /* sent only on this process's live connection */
}

void handle_release_busy(shmref_buf *buf)
{
    buf->doomed = true;
    if (buf->shareable) {
        tdelete(buf, &buf->conn->by_token, cmp_token);
        buf->shareable = false;
    }
}

void handle_uncacheable(shmref_buf *buf)
{
    if (buf->data && !buf->private_map)
        mapcache_nocache(&buf->conn->cache, buf->data);
}

void handle_inherit(shmref_conn *conn)
{
    for (shmref_buf *b = conn->bufs; b; b = b->next) {
        b->inherited = true;
        b->shareable = false;
    }
    tdestroy(conn->by_token, no_free);
    conn->by_token = NULL;
}


shmref_buf *handle_share(shmref_conn *conn, const shmref_desc *desc, unsigned flags)
{
    /* While any local handle holds the daemon's handle the daemon keeps its reference, so
     * the buffer cannot be recycled under a mapping: a new handle may share it. */
    /* While any local handle holds the daemon's handle the daemon keeps its reference, so
     * the buffer cannot be recycled under a mapping: a new handle may share it. */
    shmref_buf *src = shareable(conn, desc->token, desc->size);
    if (src) {
        if (src->pinned || src->doomed || !src->data || ((flags & SHMREF_ACQUIRE_SEALED) && !src->sealed))
            return NULL;
        shmref_buf *b = calloc(1, sizeof(*b));
        if (!b)
            return NULL;
        if (src->meta_len && !(b->meta = malloc(src->meta_len))) {
            free(b);
            return NULL;
        }
        if (src->table) { /* a table hold: one more hold in the table, no daemon handle */
            if (localhold_again(src) < 0) {
                free(b->meta);
                free(b);
                return NULL;
            }
            b->table = true;
            b->slot = src->slot;
            b->seq = src->seq;
        } else if (!src->share) {
            if (!(src->share = malloc(sizeof(*src->share)))) {
                free(b->meta);
                free(b);
                return NULL;
            }
            atomic_init(&src->share->refs, 1);
        }
        if (src->share) {
            atomic_fetch_add(&src->share->refs, 1);
            b->share = src->share;
        }
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
        b->data = mapcache_ref(&conn->cache, src->data); /* one more user */
        handle_link(conn, b);
        if (!b->table)
            conn->counters.local_acquires++;
        return b;
    }
    return NULL;
}

shmref_buf *handle_local(shmref_conn *conn, const shmref_desc *desc, unsigned flags)
{
    shmref_buf *b;
    if (localhold_acquire(conn, desc, flags, &b) < 0)
        return NULL;
    handle_link(conn, b);
    list_shareable(conn, b); /* a re-acquire while it lives shares it (handle_share) */
    return b;
}

void *shmref_buf_data(const shmref_buf *buf) { return buf ? buf->data : NULL; }
size_t shmref_buf_size(const shmref_buf *buf) { return buf ? buf->size : 0; }
size_t shmref_buf_capacity(const shmref_buf *buf) { return buf ? buf->capacity : 0; }
int shmref_buf_writable(const shmref_buf *buf) { return buf ? buf->writable : 0; }
int shmref_buf_sealed(const shmref_buf *buf) { return buf ? buf->sealed : 0; }
int shmref_buf_private(const shmref_buf *buf) { return buf ? buf->private_map : 0; }

const void *shmref_buf_meta(const shmref_buf *buf, size_t *ret_len)
{
    if (ret_len)
        *ret_len = buf ? buf->meta_len : 0;
    return buf ? buf->meta : NULL;
}

void handle_undo_reply(shmref_conn *conn, const struct proto_msg *rep, int *fds, unsigned nfds, bool lost)
{
    for (unsigned i = 0; i < nfds; i++)
        close(fds[i]);
    if (rep->op == PROTO_OP_LEASE + PROTO_OP_REPLY || rep->op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY) {
        bool writable = rep->op == PROTO_OP_LEASE + PROTO_OP_REPLY;
        client_release_handle(conn, rep->u.lease_reply.handle);
        if (nfds > 0 || lost)
            client_forget(conn, rep->u.lease_reply.buf_id, writable);
    } else if (rep->op == PROTO_OP_LEASE_MANY + PROTO_OP_REPLY) {
        for (uint32_t i = 0; i < rep->u.lease_many_reply.n; i++) {
            const struct proto_item *it = &rep->u.lease_many_reply.items[i];
            client_release_handle(conn, it->handle);
            if (it->has_fd)
                client_forget(conn, it->buf_id, true);
        }
    }
}
void handle_lost(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds)
{
    handle_undo_reply(conn, rep, fds, nfds, true);
    bool writable = p->op != PROTO_OP_ACQUIRE;
    struct rlimit rl;
    unsigned long long lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (unsigned long long)rl.rlim_cur : 0;
    char msg[192];
    snprintf(msg, sizeof(msg), "the %s's fd could not be received: this process is at its open-file limit "
             "(RLIMIT_NOFILE %llu); the %s was released", writable ? "lease" : "acquired buffer",
             lim, writable ? "lease" : "buffer");
    pending_set_error(p, -EMFILE, msg);
}
