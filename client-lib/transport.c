/* SPDX-License-Identifier: MIT */
/* transport.c: see transport.h. Library code: it never logs and never aborts; failures
 * are -errno with a message in conn->errmsg. */
#include "transport.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

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

/* The pid is kept in a page the kernel zeroes in a forked child (MADV_WIPEONFORK, Linux
 * 4.14): 0 there is a new process, which reads its pid once. A child made by a raw
 * clone() that runs no fork handlers is told too, which a pthread_atfork cache would
 * miss. Where the page cannot be had, getpid() each time. */
static _Atomic pid_t *pid_page;
static pthread_once_t pid_once = PTHREAD_ONCE_INIT;

static void pid_page_init(void)
{
    long psz = sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, (size_t)psz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return;
    if (madvise(p, (size_t)psz, MADV_WIPEONFORK) < 0) {
        munmap(p, (size_t)psz);
        return;
    }
    pid_page = p;
}

pid_t client_pid(void)
{
    pthread_once(&pid_once, pid_page_init);
    if (!pid_page)
        return getpid();
    pid_t me = atomic_load_explicit(pid_page, memory_order_relaxed);
    if (me == 0) {
        me = getpid();
        atomic_store_explicit(pid_page, me, memory_order_relaxed);
    }
    return me;
}

int transport_ok(const shmref_conn *conn)
{
    if (conn->pid != client_pid())
        return -ECHILD; /* the parent's socket: never used by a forked child */
    if (conn->fd < 0)
        return -ENOTCONN;
    if (conn->abandoned)
        return -ENOTCONN;
    return conn->failed;
}

int transport_broken(shmref_conn *conn, int err, const char *msg)
{
    if (!conn->failed) {
        conn->failed = err;
        snprintf(conn->fail_msg, sizeof(conn->fail_msg), "%s", msg);
    }
    return client_fail(conn, err, "%s", msg);
}

/* broken: the socket failed under us (the request table fails what is outstanding). */
static int broken(shmref_conn *conn, int err, const char *msg)
{
    return transport_broken(conn, err, msg);
}

/* send_failed: errno of a failed send: 1 the socket is full (EAGAIN), 0 the daemon has
 * closed (its reason is still there to read: the next receive reports it), or the
 * connection is broken (-errno). */
static int send_failed(shmref_conn *conn)
{
    if (errno == EAGAIN)
        return 1;
    if (errno == EPIPE || errno == ECONNRESET)
        return 0;
    int e = errno; /* saved: snprintf may change it */
    char msg[128];
    snprintf(msg, sizeof(msg), "send to shmrefd failed: %s", strerror(e));
    return broken(conn, -e, msg);
}

/* send_now: one message without blocking: 0 sent, 1 the socket is full, -errno. */
static int send_now(shmref_conn *conn, const uint8_t *data, size_t len)
{
    ssize_t n;
    do
        n = send(conn->fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n >= 0) {
        conn->counters.sent++;
        return 0;
    }
    return send_failed(conn);
}

static struct client_out *out_new(shmref_conn *conn, uint32_t op, size_t len)
{
    struct client_out *m = malloc(sizeof(*m) + len);
    if (!m)
        return NULL;
    m->next = NULL;
    m->len = len;
    m->op = op;
    memcpy(m->data, conn->wbuf, len);
    return m;
}

static void q_append(shmref_conn *conn, struct client_out *m)
{
    conn->q_bytes += sizeof(*m) + m->len;
    if (conn->q_tail)
        conn->q_tail->next = m;
    else
        conn->q = m;
    conn->q_tail = m;
}

/* later_to_q: the messages kept for later go first in the send queue (which is empty
 * whenever some are kept: client_send sends them before anything else). */
static void later_to_q(shmref_conn *conn)
{
    while (conn->later) {
        struct client_out *m = conn->later;
        conn->later = m->next;
        m->next = NULL;
        q_append(conn, m);
    }
    conn->later_tail = NULL;
    conn->n_later = 0;
}

int client_flush(shmref_conn *conn)
{
    later_to_q(conn);
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
        conn->q_bytes -= sizeof(*m) + m->len;
        free(m);
    }
    return 0;
}

static void free_outs(struct client_out *m)
{
    while (m) {
        struct client_out *next = m->next;
        free(m);
        m = next;
    }
}

void transport_drop_later(shmref_conn *conn)
{
    free_outs(conn->later);
    conn->later = conn->later_tail = NULL;
    conn->n_later = 0;
}

void transport_discard(shmref_conn *conn)
{
    transport_drop_later(conn);
    free_outs(conn->q);
    conn->q = conn->q_tail = NULL;
    conn->q_bytes = 0;
}

bool transport_send_direct(shmref_conn *conn, const struct proto_msg *req)
{
    uint8_t msg[64];
    int len = proto_encode(req, msg, sizeof(msg));
    return len > 0 && send(conn->fd, msg, (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT) == len;
}

bool transport_bye(shmref_conn *conn)
{
    if (!(conn->features & PROTO_FEAT_BYE) || conn->q || conn->later || transport_ok(conn) < 0)
        return false;
    return transport_send_direct(conn, &(struct proto_msg){ .op = PROTO_OP_BYE, .id = 1 });
}

/* encode: checks, then req with its id in conn->wbuf: the length, or -errno with the
 * message set. */
static int encode(shmref_conn *conn, struct proto_msg *req)
{
    int r = transport_ok(conn);
    if (r < 0)
        return r == -ECHILD ? client_fail(conn, r, "connection was opened by pid %d; this is pid %d",
                                          (int)conn->pid, (int)client_pid())
                            : client_fail(conn, r, "%s", conn->failed ? conn->fail_msg : "not connected");
    /* One-way releases always pass (they end what the daemon holds for us, and there are
     * no more of them than handles); everything else is refused past the bound. */
    bool gives_back = req->op == PROTO_OP_RELEASE || req->op == PROTO_OP_RELEASE_MANY || req->op == PROTO_OP_FORGET ||
                      req->op == PROTO_OP_GIVEBACK; /* table holds: no more than handles */
    if (conn->q && !gives_back && conn->q_bytes >= conn->max_queue_bytes)
        return client_fail(conn, -ENOBUFS, "%s refused: the send queue holds %zu bytes, the limit is %zu "
                           "(shmref_set_limits, $SHMREF_MAX_QUEUE): shmrefd is not reading",
                           proto_op_name(req->op), conn->q_bytes, conn->max_queue_bytes);
    /* Ids wrap at 2^32 on the wire: one still outstanding is never reused, 0 never used
     * (it is the daemon's word about the whole connection). */
    do
        req->id = ++conn->next_id;
    while (req->id == 0 || (conn->id_taken && conn->id_taken(conn, req->id)));
    int len = proto_encode(req, conn->wbuf, sizeof(conn->wbuf));
    if (len < 0)
        return client_fail(conn, -EMSGSIZE, "request too large for one message");
    return len;
}

/* send_with_later: the kept messages and then conn->wbuf (len bytes) in one sendmmsg
 * (one system call, one wake-up of the daemon); what the socket does not take goes to
 * the send queue, in order. 0 or -errno. */
static int send_with_later(shmref_conn *conn, uint32_t op, size_t len)
{
    struct mmsghdr mm[CLIENT_LATER_MAX + 1];
    struct iovec iov[CLIENT_LATER_MAX + 1];
    unsigned k = 0;
    for (struct client_out *m = conn->later; m; m = m->next, k++)
        iov[k] = (struct iovec){ .iov_base = m->data, .iov_len = m->len };
    iov[k] = (struct iovec){ .iov_base = conn->wbuf, .iov_len = len };
    for (unsigned i = 0; i <= k; i++)
        mm[i] = (struct mmsghdr){ .msg_hdr = { .msg_iov = &iov[i], .msg_iovlen = 1 } };
    int n;
    do
        n = sendmmsg(conn->fd, mm, k + 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n >= 0) {
        conn->counters.sent += (uint64_t)n;
    } else {
        int r = send_failed(conn);
        if (r < 0)
            return r;
        n = r == 0 ? (int)k + 1 : 0; /* the daemon has closed: dropped as if sent, uncounted (send_now) */
    }
    for (int i = 0; i < n && conn->later; i++) {
        struct client_out *m = conn->later;
        conn->later = m->next;
        free(m);
        conn->n_later--;
    }
    if (!conn->later)
        conn->later_tail = NULL;
    later_to_q(conn); /* what the socket did not take, in order */
    if (n == (int)k + 1)
        return 0;
    struct client_out *m = out_new(conn, op, len);
    if (!m)
        return client_fail(conn, -ENOMEM, "out of memory");
    q_append(conn, m);
    return 0;
}

int client_send(shmref_conn *conn, struct proto_msg *req)
{
    int len = encode(conn, req);
    if (len < 0)
        return len;
    if (conn->later && !conn->q)
        return send_with_later(conn, req->op, (size_t)len);
    int r;
    if (!conn->q && (r = send_now(conn, conn->wbuf, (size_t)len)) <= 0)
        return r;
    /* The socket is full (the daemon is behind): keep it, in order, for the next flush. */
    struct client_out *m = out_new(conn, req->op, (size_t)len);
    if (!m)
        return client_fail(conn, -ENOMEM, "out of memory");
    q_append(conn, m);
    return 0;
}

int client_send_later(shmref_conn *conn, struct proto_msg *req)
{
    if (conn->q || conn->n_later >= CLIENT_LATER_MAX)
        return client_send(conn, req);
    int len = encode(conn, req);
    if (len < 0)
        return len;
    struct client_out *m = out_new(conn, req->op, (size_t)len);
    if (!m)
        return client_fail(conn, -ENOMEM, "out of memory");
    if (conn->later_tail)
        conn->later_tail->next = m;
    else
        conn->later = m;
    conn->later_tail = m;
    conn->n_later++;
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
        int e = errno; /* saved: snprintf may change it */
        char msg[128];
        snprintf(msg, sizeof(msg), "receive from shmrefd failed: %s", strerror(e));
        return broken(conn, -e, msg);
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
        /* After the hello the daemon's only ETIMEDOUT about the connection is its idle
         * close (--idle-timeout): it held nothing for us, so a new connection loses nothing
         * (session.c decides). */
        if (!conn->failed && rep->u.error.code == ETIMEDOUT && conn->daemon_pid)
            conn->idle_closed = true;
        return broken(conn, -rep->u.error.code, msg);
    }
    *ret_nfds = k;
    *ret_lost = lost;
    return 1;
}

void client_forget(shmref_conn *conn, uint64_t buf_id, bool writable)
{
    if (!(conn->features & PROTO_FEAT_FD_ONCE) || transport_ok(conn) < 0)
        return;
    struct proto_msg req = { .op = PROTO_OP_FORGET };
    req.u.forget.buf_id = buf_id;
    req.u.forget.writable = writable;
    client_send(conn, &req); /* a failure shows at the next call */
}

void client_release_handle(shmref_conn *conn, uint64_t handle)
{
    if (transport_ok(conn) < 0)
        return;
    char keep[sizeof(conn->errmsg)];
    memcpy(keep, conn->errmsg, sizeof(keep));
    struct proto_msg req = { .op = PROTO_OP_RELEASE };
    req.u.release.handle = handle;
    req.u.release.flags = PROTO_RELEASE_NOREPLY;
    client_send(conn, &req);
    memcpy(conn->errmsg, keep, sizeof(keep));
}

bool transport_holds_publish(const shmref_conn *conn)
{
    for (const struct client_out *m = conn->q; m; m = m->next)
        if (m->op == PROTO_OP_PUBLISH)
            return true;
    return false;
}

int transport_flush_wait(shmref_conn *conn, int ms)
{
    int64_t deadline = client_mono_ms() + ms;
    for (;;) {
        int r = client_flush(conn);
        if (r <= 0)
            return r;
        int left = (int)(deadline - client_mono_ms());
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = { .fd = conn->fd, .events = POLLOUT };
        if (poll(&p, 1, left) < 0 && errno != EINTR)
            return -errno;
    }
}
