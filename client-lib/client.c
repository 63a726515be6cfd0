/* SPDX-License-Identifier: MIT */
/* client.c: connecting, the hello, and the blocking request/reply transport of
 * libshmref. Library code: it never logs and never aborts; failures are -errno with a
 * message in conn->errmsg. */
#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "paths.h"

int client_fail(shmref_conn *conn, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(conn->errmsg, sizeof(conn->errmsg), fmt, ap);
    va_end(ap);
    return err;
}

int64_t client_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int client_usable(shmref_conn *conn)
{
    pid_t me = getpid();
    if (me != conn->pid)
        return client_fail(conn, -ECHILD, "connection was opened by pid %d; this is pid %d: "
                           "connect again in the child", (int)conn->pid, (int)me);
    if (conn->abandoned)
        return client_fail(conn, -ENOTCONN, "connection abandoned after %s timed out (%d ms): connect again",
                           conn->abandoned, conn->timeout_ms);
    if (conn->failed)
        return client_fail(conn, conn->failed, "%s", conn->fail_msg);
    return 0;
}

int client_enter(shmref_conn *conn)
{
    int r = client_usable(conn);
    if (r < 0)
        return r;
    conn->errmsg[0] = '\0';
    r = pending_intake(conn);
    if (r < 0)
        return client_fail(conn, r, "%s", conn->fail_msg);
    if (conn->late[0]) { /* an error reply to a one-way request: said once, at the next call */
        snprintf(conn->errmsg, sizeof(conn->errmsg), "%s", conn->late);
        conn->late[0] = '\0';
    }
    return 0;
}

/* broken: the socket failed under us: every outstanding request fails with it. */
static int broken(shmref_conn *conn, int err, const char *msg)
{
    if (!conn->failed) {
        conn->failed = err;
        snprintf(conn->fail_msg, sizeof(conn->fail_msg), "%s", msg);
        pending_fail_all(conn, err, msg);
    }
    return client_fail(conn, err, "%s", msg);
}

/* send_now: one message without blocking: 0 sent, 1 the socket is full, -errno. */
static int send_now(shmref_conn *conn, const uint8_t *data, size_t len)
{
    for (;;) {
        ssize_t n = send(conn->fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            conn->counters.sent++;
            return 0;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN)
            return 1;
        /* A daemon that refuses a connection (access policy, too many clients) says why
         * and closes it: the reason is still there to read, so this is not the failure
         * yet; the next receive reports it (or the end of the connection). */
        if (errno == EPIPE || errno == ECONNRESET)
            return 0;
        char msg[128];
        snprintf(msg, sizeof(msg), "send to shmrefd failed: %s", strerror(errno));
        return broken(conn, -errno, msg);
    }
}

int client_flush(shmref_conn *conn)
{
    while (conn->q) {
        struct client_out *m = conn->q;
        int r = send_now(conn, m->data, m->len);
        if (r < 0)
            return r;
        if (r == 1)
            return 1;
        conn->q = m->next;
        if (!conn->q)
            conn->q_tail = NULL;
        free(m);
    }
    return 0;
}

int client_flush_wait(shmref_conn *conn, int ms)
{
    int64_t deadline = ms > 0 ? client_mono_ms() + ms : -1;
    for (;;) {
        int r = client_flush(conn);
        if (r <= 0)
            return r;
        int left = -1;
        if (deadline >= 0 && (left = (int)(deadline - client_mono_ms())) <= 0)
            return -ETIMEDOUT;
        struct pollfd p = { .fd = conn->fd, .events = POLLOUT };
        if (poll(&p, 1, left) < 0 && errno != EINTR)
            return -errno;
    }
}

int client_send(shmref_conn *conn, struct proto_msg *req)
{
    int r = client_usable(conn);
    if (r < 0)
        return r;
    req->id = ++conn->next_id;
    if (req->id == 0) /* id 0 is the daemon's word about the whole connection */
        req->id = ++conn->next_id;
    int len = proto_encode(req, conn->wbuf, sizeof(conn->wbuf));
    if (len < 0)
        return client_fail(conn, -EMSGSIZE, "request too large for one message");
    if (!conn->q && (r = send_now(conn, conn->wbuf, (size_t)len)) <= 0)
        return r;
    /* The socket is full (the daemon is behind): keep it, in order, for the next flush. */
    struct client_out *m = malloc(sizeof(*m) + (size_t)len);
    if (!m)
        return client_fail(conn, -ENOMEM, "out of memory");
    m->next = NULL;
    m->len = (size_t)len;
    memcpy(m->data, conn->wbuf, (size_t)len);
    if (conn->q_tail)
        conn->q_tail->next = m;
    else
        conn->q = m;
    conn->q_tail = m;
    return 0;
}

int client_recv(shmref_conn *conn, struct proto_msg *rep, int *fds, unsigned *ret_nfds, bool *ret_lost)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(PROTO_MAX_BATCH * sizeof(int))];
    } ctl;
    struct iovec iov = { .iov_base = conn->rbuf, .iov_len = sizeof(conn->rbuf) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf) };
    ssize_t n;
    do
        n = recvmsg(conn->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN)
        return 0;
    /* When the daemon closes a connection it had not read to the end, the kernel reports
     * ECONNRESET once, ahead of replies still queued (its reason among them). */
    if (n < 0 && errno == ECONNRESET) {
        mh.msg_controllen = sizeof(ctl.buf);
        n = recvmsg(conn->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0)
            errno = ECONNRESET;
    }
    if (n < 0 && errno == ECONNRESET)
        return broken(conn, -ECONNRESET, "shmrefd closed the connection");
    if (n < 0) {
        char msg[128];
        snprintf(msg, sizeof(msg), "receive from shmrefd failed: %s", strerror(errno));
        return broken(conn, -errno, msg);
    }
    unsigned k = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t c = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < c; i++) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (k < PROTO_MAX_BATCH)
                fds[k++] = f;
            else
                close(f);
        }
    }
    bool lost = (mh.msg_flags & MSG_CTRUNC) != 0;
    if (n == 0 && k == 0 && !lost)
        return broken(conn, -ECONNRESET, "shmrefd closed the connection");
    const char *why = NULL;
    int r = 0;
    if (mh.msg_flags & MSG_TRUNC)
        why = "reply was truncated", r = -EPROTO;
    else if ((r = proto_decode(conn->rbuf, (size_t)n, sizeof(conn->rbuf), rep, &why)) < 0)
        r = -EPROTO;
    if (r < 0) {
        for (unsigned i = 0; i < k; i++)
            close(fds[i]);
        char msg[160];
        snprintf(msg, sizeof(msg), "bad reply from shmrefd: %s", why);
        return broken(conn, -EPROTO, msg);
    }
    conn->counters.received++;
    if (rep->op == PROTO_OP_ERROR && rep->id == 0) { /* about the connection, not a request */
        for (unsigned i = 0; i < k; i++)
            close(fds[i]);
        char msg[PROTO_MAX_ERRMSG + 1];
        snprintf(msg, sizeof(msg), "%.*s", (int)rep->u.error.msg_len, rep->u.error.msg);
        return broken(conn, -rep->u.error.code, msg);
    }
    *ret_nfds = k;
    *ret_lost = lost;
    return 1;
}

void client_forget(shmref_conn *conn, uint64_t buf_id, bool writable)
{
    if (!(conn->features & PROTO_FEAT_FD_ONCE))
        return;
    struct proto_msg req = { .op = PROTO_OP_FORGET };
    req.u.forget.buf_id = buf_id;
    req.u.forget.writable = writable;
    client_send(conn, &req); /* a failure shows at the next call */
}

void client_release_handle(shmref_conn *conn, uint64_t handle)
{
    char keep[sizeof(conn->errmsg)];
    memcpy(keep, conn->errmsg, sizeof(keep));
    struct proto_msg req = { .op = PROTO_OP_RELEASE };
    req.u.release.handle = handle;
    req.u.release.flags = PROTO_RELEASE_NOREPLY;
    client_send(conn, &req);
    memcpy(conn->errmsg, keep, sizeof(keep));
}

static void on_unmap(void *ctx, uint64_t buf_id, bool writable)
{
    client_forget(ctx, buf_id, writable);
}

/* connect_path: a non-blocking SOCK_SEQPACKET connection to path. A listener whose
 * backlog is full answers EAGAIN: retried until the deadline. */
static int connect_path(shmref_conn *conn, const char *path, int64_t deadline)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(sa.sun_path))
        return client_fail(conn, -ENAMETOOLONG, "socket path too long (%zu bytes, at most %zu): %s",
                           strlen(path), sizeof(sa.sun_path) - 1, path);
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return client_fail(conn, -errno, "socket: %s", strerror(errno));
    for (;;) {
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
            break;
        int e = errno;
        if (e == EINTR)
            continue;
        if (e == EAGAIN && (deadline < 0 || client_mono_ms() < deadline)) {
            struct timespec ts = { .tv_nsec = 2 * 1000 * 1000 };
            nanosleep(&ts, NULL);
            continue;
        }
        close(fd);
        if (e == EAGAIN)
            return client_fail(conn, -ETIMEDOUT, "connect: shmrefd at %s accepted no connection within %d ms",
                               path, conn->timeout_ms);
        return client_fail(conn, -e, "cannot connect to shmrefd at %s: %s%s", path, strerror(e),
                           e == ENOENT || e == ECONNREFUSED ? " (is shmrefd running?)" : "");
    }
    conn->fd = fd;
    return 0;
}

/* default_timeout: $SHMREF_TIMEOUT_MS when it is a number of milliseconds. */
static int default_timeout(void)
{
    const char *e = getenv("SHMREF_TIMEOUT_MS");
    if (!e || !*e)
        return SHMREF_TIMEOUT_DEFAULT_MS;
    char *end;
    errno = 0;
    long v = strtol(e, &end, 10);
    if (errno || *end || v < 0 || v > INT32_MAX)
        return SHMREF_TIMEOUT_DEFAULT_MS;
    return (int)v;
}

static int hello(shmref_conn *conn, int64_t deadline)
{
    char name[PROTO_MAX_NAME + 1] = "";
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, name, PROTO_MAX_NAME);
        close(fd);
        if (n > 0) {
            name[n] = '\0';
            name[strcspn(name, "\n")] = '\0';
        }
    }
    struct proto_msg req = { .op = PROTO_OP_HELLO };
    req.u.hello.version = PROTO_VERSION;
    req.u.hello.features = PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE | PROTO_FEAT_SEALED | PROTO_FEAT_FOREIGN;
    req.u.hello.name = name;
    req.u.hello.name_len = (uint32_t)strlen(name);
    struct pending *p = pending_new(conn, PROTO_OP_HELLO, PENDING_WAIT);
    if (!p)
        return -ENOMEM;
    int r = pending_submit_msg(conn, p, &req);
    if (r < 0) {
        pending_free(conn, p);
        return r;
    }
    int ms = 0;
    if (deadline >= 0 && (ms = (int)(deadline - client_mono_ms())) <= 0)
        ms = 1;
    r = pending_wait(conn, p, ms); /* the reply's fields are the connection's (pending.c) */
    pending_free(conn, p);
    if (r < 0)
        return r;
    mapcache_fit(&conn->cache, conn->max_lease);
    return 0;
}

/* Why the calling thread's last shmref_connect failed: shmref_errmsg(NULL). */
static __thread char connect_errmsg[PROTO_MAX_ERRMSG + 1];

/* copy_msg: a connect failure's message, for the caller's errbuf and for
 * shmref_errmsg(NULL) in this thread. */
static void copy_msg(char *errbuf, size_t errcap, const char *msg)
{
    snprintf(connect_errmsg, sizeof(connect_errmsg), "%s", msg);
    if (errbuf && errcap)
        snprintf(errbuf, errcap, "%s", msg);
}

int shmref_connect_timeout(const char *path, int timeout_ms, char *errbuf, size_t errcap,
                           shmref_conn **ret_conn)
{
    char def[4096];
    connect_errmsg[0] = '\0';
    if (!ret_conn || timeout_ms < -1) {
        copy_msg(errbuf, errcap, "connect: ret_conn must not be NULL and timeout_ms >= -1");
        return -EINVAL;
    }
    if (!path) {
        if (paths_default_socket(def, sizeof(def)) < 0) {
            copy_msg(errbuf, errcap, "the default socket path is too long");
            return -ENAMETOOLONG;
        }
        path = def;
    }
    shmref_conn *conn = calloc(1, sizeof(*conn));
    if (!conn) {
        copy_msg(errbuf, errcap, "out of memory");
        return -ENOMEM;
    }
    conn->fd = -1;
    conn->pid = getpid();
    conn->timeout_ms = timeout_ms < 0 ? default_timeout() : timeout_ms;
    mapcache_init(&conn->cache);
    conn->cache.on_unmap = on_unmap;
    conn->cache.ctx = conn;
    stock_init(&conn->stock);
    conn->acquire_wait_ms = client_acquire_wait_default(conn->timeout_ms);
    int64_t deadline = conn->timeout_ms > 0 ? client_mono_ms() + conn->timeout_ms : -1;
    int r = connect_path(conn, path, deadline);
    if (r == 0 && (r = hello(conn, deadline)) < 0) {
        char msg[sizeof(conn->errmsg)];
        snprintf(msg, sizeof(msg), "%s", conn->errmsg);
        client_fail(conn, r, "shmrefd at %.*s: %.*s", 200, path, (int)(sizeof(conn->errmsg) - 220), msg);
    }
    if (r < 0) {
        copy_msg(errbuf, errcap, conn->errmsg);
        conn->cache.on_unmap = NULL;
        client_teardown(conn);
        return r;
    }
    conn->errmsg[0] = '\0';
    *ret_conn = conn;
    return 0;
}

int shmref_connect(const char *path, shmref_conn **ret_conn)
{
    return shmref_connect_timeout(path, -1, NULL, 0, ret_conn);
}

int shmref_set_timeout(shmref_conn *conn, int timeout_ms)
{
    if (!conn || timeout_ms < -1)
        return -EINVAL;
    conn->timeout_ms = timeout_ms < 0 ? default_timeout() : timeout_ms;
    if (!conn->acquire_wait_set)
        conn->acquire_wait_ms = client_acquire_wait_default(conn->timeout_ms);
    return 0;
}

int client_acquire_wait_default(int timeout_ms)
{
    return timeout_ms > 0 && timeout_ms < CLIENT_ACQUIRE_WAIT_MS ? timeout_ms : CLIENT_ACQUIRE_WAIT_MS;
}

int shmref_get_timeout(const shmref_conn *conn)
{
    return conn ? conn->timeout_ms : -EINVAL;
}

int shmref_conn_pid(const shmref_conn *conn)
{
    return conn ? (int)conn->pid : -EINVAL;
}

/* client_teardown: the last of a connection: every mapping, the socket, the memory. */
void client_teardown(shmref_conn *conn)
{
    conn->cache.on_unmap = NULL; /* the daemon forgets everything with the connection */
    /* In a forked child the mappings stay: arrays it inherited may still be read there;
     * closing the child's copy of the socket leaves the parent's connection as it was. */
    if (getpid() == conn->pid)
        mapcache_clear(&conn->cache);
    if (conn->fd >= 0)
        close(conn->fd);
    pending_discard(conn);
    while (conn->q) {
        struct client_out *m = conn->q;
        conn->q = m->next;
        free(m);
    }
    free(conn->cache.v);
    free(conn);
}

/* CLOSE_DRAIN_MS: how long shmref_close waits for leases still on their way. */
#define CLOSE_DRAIN_MS 2000

void shmref_close(shmref_conn *conn)
{
    if (!conn)
        return;
    bool pinned = atomic_load(&conn->pins) > 0;
    bool live = client_usable(conn) == 0;
    int ms = conn->timeout_ms > 0 && conn->timeout_ms < CLOSE_DRAIN_MS ? conn->timeout_ms : CLOSE_DRAIN_MS;
    if (live) {
        /* Requests still out (stock refills, submits nobody collected) become nobody's:
         * a lease or handle they bring is released. A ping behind them brings every
         * answer the daemon has made so far (waits the daemon still holds, a backpressured
         * lease or an acquire of an unpublished buffer, end with the connection), so the
         * daemon sees a clean close, not a process that died holding leases. */
        pending_intake(conn);
        conn->stock.depth = 0; /* nothing is refilled from now on */
        stock_return(conn);
        pending_orphan_all(conn);
        if (conn->n_out > 0)
            pending_drain(conn, ms);
    }
    /* Release every handle (one-way, no round trips). A pinned buffer (its unit's Arrow
     * exports are alive) stays: the last export releases it. */
    conn->cache.on_unmap = NULL; /* the daemon forgets everything with the connection */
    for (shmref_buf *b = conn->bufs, *next; b; b = next) {
        next = b->next;
        if (!b->pinned)
            shmref_release(b); /* unlinks and frees b */
    }
    while (conn->bufs) {
        shmref_buf *b = conn->bufs;
        conn->bufs = b->next;
        b->prev = b->next = NULL;
    }
    if (client_usable(conn) == 0)
        client_flush_wait(conn, ms);
    if (!pinned) {
        client_teardown(conn);
        return;
    }
    atomic_store(&conn->closed, true);
}

void client_pin(shmref_buf *buf)
{
    buf->pinned = true;
    atomic_fetch_add(&buf->conn->pins, 1);
}

void client_unpin(shmref_buf *buf)
{
    shmref_conn *conn = buf->conn;
    if (!atomic_load(&conn->closed)) {
        buf->pinned = false;
        atomic_fetch_sub(&conn->pins, 1);
        shmref_release(buf);
        return;
    }
    /* Closed by its owner: only pinned buffers' holders use it now, maybe from several
     * threads, so no shared state but the atomic count (send is atomic per message). */
    /* In a forked child the socket is the parent's: its handle is not the child's to drop. */
    bool last = !buf->share || atomic_fetch_sub(&buf->share->refs, 1) == 1;
    if (buf->share && last)
        free(buf->share);
    if (last && (conn->features & PROTO_FEAT_NOREPLY_RELEASE) && getpid() == conn->pid) {
        struct proto_msg req = { .op = PROTO_OP_RELEASE, .id = 1 };
        uint8_t msg[64];
        req.u.release.handle = buf->handle;
        req.u.release.flags = PROTO_RELEASE_NOREPLY;
        int len = proto_encode(&req, msg, sizeof(msg));
        if (len > 0)
            send(conn->fd, msg, (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT); /* else: at close */
    }
    free(buf->meta);
    free(buf);
    if (atomic_fetch_sub(&conn->pins, 1) == 1)
        client_teardown(conn);
}

const char *shmref_errmsg(const shmref_conn *conn)
{
    return conn ? conn->errmsg : connect_errmsg;
}

int shmref_ping(shmref_conn *conn)
{
    if (!conn)
        return -EINVAL;
    int r = client_enter(conn);
    if (r < 0)
        return r;
    struct pending *p = pending_new(conn, PROTO_OP_PING, PENDING_WAIT);
    if (!p)
        return -ENOMEM;
    if ((r = pending_submit(conn, p)) == 0)
        r = pending_wait(conn, p, pending_budget(conn, 0));
    pending_free(conn, p);
    return r;
}

int shmref_daemon_pid(const shmref_conn *conn)
{
    return conn ? (int)conn->daemon_pid : -EINVAL;
}
