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

static int64_t mono_ms(void)
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
    return 0;
}

/* start_exchange: the deadline for what is sent now and the replies it waits for. */
static void start_exchange(shmref_conn *conn, const char *op)
{
    conn->op = op;
    conn->deadline_ms = conn->timeout_ms > 0 ? mono_ms() + conn->timeout_ms : -1;
}

/* wait_io: poll fd for events until the exchange's deadline. */
static int wait_io(shmref_conn *conn, short events)
{
    for (;;) {
        int ms = -1;
        if (conn->deadline_ms >= 0) {
            int64_t left = conn->deadline_ms - mono_ms();
            if (left <= 0) {
                conn->abandoned = conn->op;
                return client_fail(conn, -ETIMEDOUT, "%s: no answer from shmrefd within %d ms",
                                   conn->op, conn->timeout_ms);
            }
            ms = (int)left;
        }
        struct pollfd p = { .fd = conn->fd, .events = events };
        int r = poll(&p, 1, ms);
        if (r > 0)
            return 0; /* ready, or an error/hang-up the next call reports */
        if (r < 0 && errno != EINTR)
            return client_fail(conn, -errno, "poll failed: %s", strerror(errno));
    }
}

static int send_req(shmref_conn *conn, const struct proto_msg *req)
{
    int len = proto_encode(req, conn->wbuf, sizeof(conn->wbuf));
    if (len < 0)
        return client_fail(conn, -EMSGSIZE, "request too large for one message");
    ssize_t n;
    for (;;) {
        n = send(conn->fd, conn->wbuf, (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0 || (errno != EINTR && errno != EAGAIN))
            break;
        if (errno == EAGAIN) { /* the daemon is not reading: wait, within the deadline */
            int r = wait_io(conn, POLLOUT);
            if (r < 0)
                return r;
        }
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
        return client_fail(conn, -ECONNRESET, "shmrefd closed the connection");
    if (n < 0)
        return client_fail(conn, -errno, "send to shmrefd failed: %s", strerror(errno));
    return 0;
}

/* recv_reply: one message; its fd (if any) in *ret_fd, else -1. */
static int recv_reply(shmref_conn *conn, size_t *ret_len, int *ret_fd)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct iovec iov = { .iov_base = conn->rbuf, .iov_len = sizeof(conn->rbuf) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf) };
    ssize_t n;
    for (;;) {
        n = recvmsg(conn->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n >= 0 || (errno != EINTR && errno != EAGAIN))
            break;
        if (errno == EAGAIN) {
            int r = wait_io(conn, POLLIN);
            if (r < 0)
                return r;
        }
    }
    /* When the daemon closes a connection it had not read to the end, the kernel reports
     * ECONNRESET once, ahead of replies still queued (its reason among them). */
    if (n < 0 && errno == ECONNRESET) {
        mh.msg_controllen = sizeof(ctl.buf);
        n = recvmsg(conn->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0)
            errno = ECONNRESET;
    }
    if (n < 0 && errno == ECONNRESET)
        return client_fail(conn, -ECONNRESET, "shmrefd closed the connection");
    if (n < 0)
        return client_fail(conn, -errno, "receive from shmrefd failed: %s", strerror(errno));
    int fd = -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (fd < 0)
                fd = f;
            else
                close(f); /* more than one fd: never sent by shmrefd */
        }
    }
    if (n == 0 && fd < 0 && !(mh.msg_flags & MSG_CTRUNC))
        return client_fail(conn, -ECONNRESET, "shmrefd closed the connection");
    if (mh.msg_flags & MSG_TRUNC) {
        if (fd >= 0)
            close(fd);
        return client_fail(conn, -EPROTO, "reply from shmrefd was truncated");
    }
    /* Only the control data was cut: the fd did not fit in this process (RLIMIT_NOFILE).
     * The reply itself is whole; client_recv undoes what it gave us. */
    conn->fd_lost = (mh.msg_flags & MSG_CTRUNC) != 0;
    if (conn->fd_lost && fd >= 0) {
        close(fd);
        fd = -1;
    }
    *ret_len = (size_t)n;
    *ret_fd = fd;
    return 0;
}

int client_send(shmref_conn *conn, struct proto_msg *req)
{
    int r = client_usable(conn);
    if (r < 0)
        return r;
    /* A one-way message (release, forget) gets a deadline of its own for its send and
     * leaves the exchange it may be part of (a pipelined lease) as it was. */
    bool one_way = req->op == PROTO_OP_FORGET ||
                   (req->op == PROTO_OP_RELEASE && (req->u.release.flags & PROTO_RELEASE_NOREPLY));
    const char *op = conn->op;
    int64_t deadline = conn->deadline_ms;
    start_exchange(conn, proto_op_name(req->op));
    req->id = ++conn->next_id;
    if (req->id == 0) /* id 0 is the daemon's word about the whole connection */
        req->id = ++conn->next_id;
    r = send_req(conn, req);
    if (one_way && r == 0) {
        conn->op = op;
        conn->deadline_ms = deadline;
    }
    return r;
}

/* fd_lost: a lease or acquire reply whose fd this process could not receive (it is at
 * its open-file limit). The daemon holds a handle for us and counts the fd as sent
 * (fd-once): release the handle and forget the buffer (one-way, in order, so the next
 * request sees both done), and turn the reply into an EMFILE error for its request. */
static void fd_lost(shmref_conn *conn, struct proto_msg *rep)
{
    bool writable = rep->op == PROTO_OP_LEASE + PROTO_OP_REPLY;
    uint64_t handle = rep->u.lease_reply.handle, buf_id = rep->u.lease_reply.buf_id;
    struct proto_msg rel = { .op = PROTO_OP_RELEASE };
    rel.u.release.handle = handle;
    rel.u.release.flags = PROTO_RELEASE_NOREPLY; /* without the feature: a stray reply, skipped */
    struct rlimit rl;
    unsigned long long lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (unsigned long long)rl.rlim_cur : 0;
    int n = snprintf(conn->lost_msg, sizeof(conn->lost_msg),
                     "the %s's fd could not be received: this process is at its open-file limit "
                     "(RLIMIT_NOFILE %llu); the %s was released", writable ? "lease" : "acquired buffer",
                     lim, writable ? "lease" : "buffer");
    client_send(conn, &rel);
    if (conn->features & PROTO_FEAT_FD_ONCE) {
        struct proto_msg fg = { .op = PROTO_OP_FORGET };
        fg.u.forget.buf_id = buf_id;
        fg.u.forget.writable = writable;
        client_send(conn, &fg);
    }
    conn->fd_lost = false;
    rep->op = PROTO_OP_ERROR;
    rep->u.error.code = EMFILE;
    rep->u.error.msg = conn->lost_msg;
    rep->u.error.msg_len = n > 0 ? (uint32_t)strnlen(conn->lost_msg, sizeof(conn->lost_msg)) : 0;
}

int client_recv(shmref_conn *conn, struct proto_msg *rep, int *ret_fd)
{
    const char *why;
    size_t len = 0;
    int fd = -1;
    int r = client_usable(conn);
    if (r < 0)
        return r;
    r = recv_reply(conn, &len, &fd);
    if (r < 0)
        return r;
    r = proto_decode(conn->rbuf, len, sizeof(conn->rbuf), rep, &why);
    if (r < 0) {
        if (fd >= 0)
            close(fd);
        return client_fail(conn, -EPROTO, "bad reply from shmrefd: %s", why);
    }
    if (conn->fd_lost && (rep->op == PROTO_OP_LEASE + PROTO_OP_REPLY || rep->op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY))
        fd_lost(conn, rep);
    if (rep->op == PROTO_OP_ERROR && rep->id == 0) { /* about the connection, not a request */
        if (fd >= 0)
            close(fd);
        return client_fail(conn, -rep->u.error.code, "%.*s", (int)rep->u.error.msg_len, rep->u.error.msg);
    }
    *ret_fd = fd;
    return 0;
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

static void on_unmap(void *ctx, uint64_t buf_id, bool writable)
{
    client_forget(ctx, buf_id, writable);
}

int client_reply_error(shmref_conn *conn, const struct proto_msg *rep)
{
    return client_fail(conn, -rep->u.error.code, "%.*s", (int)rep->u.error.msg_len, rep->u.error.msg);
}

int client_call(shmref_conn *conn, struct proto_msg *req, struct proto_msg *rep, int *ret_fd)
{
    conn->errmsg[0] = '\0';
    int r = client_send(conn, req);
    /* A daemon that refuses a connection (access policy, too many clients) says why
     * and closes it; our send then fails, but its reason is still there to read. */
    bool sent = r == 0;
    if (r < 0 && r != -ECONNRESET)
        return r;
    for (;;) {
        int fd;
        if ((r = client_recv(conn, rep, &fd)) < 0)
            return r;
        bool ours = sent && rep->id == req->id;
        if (!ours || (rep->op != PROTO_OP_ERROR && rep->op != req->op + PROTO_OP_REPLY)) {
            /* A late reply to an earlier request (e.g. an error for a no-reply release):
             * not ours to wait for. */
            if (fd >= 0)
                close(fd);
            if (ours)
                return client_fail(conn, -EPROTO, "shmrefd answered %s with %s",
                                   proto_op_name(req->op), proto_op_name(rep->op));
            continue;
        }
        if (rep->op == PROTO_OP_ERROR) {
            if (fd >= 0)
                close(fd);
            return client_reply_error(conn, rep);
        }
        if (ret_fd)
            *ret_fd = fd;
        else if (fd >= 0)
            close(fd);
        return 0;
    }
}

/* connect_path: a non-blocking SOCK_SEQPACKET connection to path. A listener whose
 * backlog is full answers EAGAIN: retried until the deadline. */
static int connect_path(shmref_conn *conn, const char *path)
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
        if (e == EAGAIN && (conn->deadline_ms < 0 || mono_ms() < conn->deadline_ms)) {
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

static int hello(shmref_conn *conn)
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
    struct proto_msg req = { .op = PROTO_OP_HELLO }, rep;
    req.u.hello.version = PROTO_VERSION;
    req.u.hello.features = PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE | PROTO_FEAT_SEALED;
    req.u.hello.name = name;
    req.u.hello.name_len = (uint32_t)strlen(name);
    int r = client_call(conn, &req, &rep, NULL);
    if (r < 0)
        return r;
    if (rep.u.hello_reply.version != PROTO_VERSION)
        return client_fail(conn, -EPROTONOSUPPORT, "shmrefd speaks protocol %u, this library %d",
                           (unsigned)rep.u.hello_reply.version, PROTO_VERSION);
    conn->daemon_pid = (pid_t)rep.u.hello_reply.pid;
    conn->features = rep.u.hello_reply.features;
    conn->max_lease = rep.u.hello_reply.max_lease;
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
    start_exchange(conn, "connect");
    int r = connect_path(conn, path);
    if (r == 0 && (r = hello(conn)) < 0) {
        char msg[sizeof(conn->errmsg)];
        snprintf(msg, sizeof(msg), "%s", conn->errmsg);
        client_fail(conn, r, "shmrefd at %.*s: %.*s", 200, path, (int)(sizeof(conn->errmsg) - 220), msg);
    }
    if (r < 0) {
        copy_msg(errbuf, errcap, conn->errmsg);
        if (conn->fd >= 0)
            close(conn->fd);
        free(conn);
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
    return 0;
}

int shmref_get_timeout(const shmref_conn *conn)
{
    return conn ? conn->timeout_ms : -EINVAL;
}

int shmref_conn_pid(const shmref_conn *conn)
{
    return conn ? (int)conn->pid : -EINVAL;
}

/* teardown: the last of a connection: every mapping, the socket, the memory. */
static void teardown(shmref_conn *conn)
{
    conn->cache.on_unmap = NULL; /* the daemon forgets everything with the connection */
    /* In a forked child the mappings stay: arrays it inherited may still be read there;
     * closing the child's copy of the socket leaves the parent's connection as it was. */
    if (getpid() == conn->pid)
        mapcache_clear(&conn->cache);
    if (conn->fd >= 0)
        close(conn->fd);
    free(conn->cache.v);
    free(conn);
}

void shmref_close(shmref_conn *conn)
{
    if (!conn)
        return;
    bool pinned = atomic_load(&conn->pins) > 0;
    /* Release every handle first (one-way, no round trips), so the daemon sees a clean
     * close, not a process that died holding leases. A pinned buffer (its unit's Arrow
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
    if (!pinned) {
        teardown(conn);
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
    if ((conn->features & PROTO_FEAT_NOREPLY_RELEASE) && getpid() == conn->pid) {
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
        teardown(conn);
}

const char *shmref_errmsg(const shmref_conn *conn)
{
    return conn ? conn->errmsg : connect_errmsg;
}

int shmref_ping(shmref_conn *conn)
{
    if (!conn)
        return -EINVAL;
    struct proto_msg req = { .op = PROTO_OP_PING }, rep;
    return client_call(conn, &req, &rep, NULL);
}

int shmref_daemon_pid(const shmref_conn *conn)
{
    return conn ? (int)conn->daemon_pid : -EINVAL;
}
