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
        int e = errno; /* saved: snprintf may change it */
        char msg[128];
        snprintf(msg, sizeof(msg), "send to shmrefd failed: %s", strerror(e));
        return broken(conn, -e, msg);
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
        conn->q_bytes -= sizeof(*m) + m->len;
        free(m);
    }
    return 0;
}

int client_send(shmref_conn *conn, struct proto_msg *req)
{
    int r = transport_ok(conn);
    if (r < 0)
        return r == -ECHILD ? client_fail(conn, r, "connection was opened by pid %d; this is pid %d",
                                          (int)conn->pid, (int)client_pid())
                            : client_fail(conn, r, "%s", conn->failed ? conn->fail_msg : "not connected");
    /* One-way releases always pass (they end what the daemon holds for us, and there are
     * no more of them than handles); everything else is refused past the bound. */
    bool gives_back = req->op == PROTO_OP_RELEASE || req->op == PROTO_OP_RELEASE_MANY || req->op == PROTO_OP_FORGET ||
                      req->op == PROTO_OP_TOOK || req->op == PROTO_OP_NUDGE; /* ledger holds: no more than handles */
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
    if (!conn->q && (r = send_now(conn, conn->wbuf, (size_t)len)) <= 0)
        return r;
    /* The socket is full (the daemon is behind): keep it, in order, for the next flush. */
    struct client_out *m = malloc(sizeof(*m) + (size_t)len);
    if (!m)
        return client_fail(conn, -ENOMEM, "out of memory");
    conn->q_bytes += sizeof(*m) + (size_t)len;
    m->next = NULL;
    m->len = (size_t)len;
    m->op = req->op;
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
