/* conn.c: see conn.h. libuv's streams cannot carry arbitrary fds, so the socket is
 * driven with uv_poll_t and recvmsg/sendmsg. Received control data is always
 * inspected: any fd a client sends is closed and is a protocol error, as is a
 * truncated message or truncated control data. */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "broker.h"
#include "log.h"
#include "server.h"

struct conn_out {
    struct conn_out *next;
    int fd;                 /* a dup the queue owns, or -1 */
    size_t len;
    uint8_t data[];
};

static void on_poll(uv_poll_t *p, int status, int events);

int conn_new(struct server *s, int fd, const struct ucred *cred, struct conn **ret)
{
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->fd = fd;
    c->server = s;
    c->id = ++s->next_conn_id;
    c->pid = cred->pid;
    c->uid = cred->uid;
    c->gid = cred->gid;
    c->refs = 1;
    c->accepted_ms = uv_now(s->loop);
    int r = uv_poll_init(s->loop, &c->poll, fd);
    if (r < 0) {
        free(c);
        return r;
    }
    c->poll.data = c;
    uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, on_poll);
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    *ret = c;
    return 0;
}

void conn_ref(struct conn *c)
{
    c->refs++;
}

void conn_unref(struct conn *c)
{
    if (--c->refs > 0)
        return;
    while (c->out_head) {
        struct conn_out *o = c->out_head;
        c->out_head = o->next;
        if (o->fd >= 0)
            close(o->fd);
        free(o);
    }
    idset_free(&c->known);
    free(c);
}

static void on_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    close(c->fd);
    c->fd = -1;
    conn_unref(c);
}

void conn_close(struct conn *c, const char *why)
{
    struct server *s = c->server;
    if (c->closing)
        return;
    c->closing = true;
    uint32_t held = c->holder.leases;
    uint32_t n = registry_release_all(s->reg, &c->holder);
    if (n) {
        s->counters.reclaimed_leases += n;
        s->counters.reclaimed_clients++;
    }
    /* The peer went away (why == NULL): with nothing held it closed cleanly (libshmref
     * releases before closing); holding leases, it died, or closed without releasing.
     * The socket cannot tell which signal, if any, ended it. */
    if (!why && !n)
        s->counters.clients_closed++;
    else if (!why)
        s->counters.clients_died++;
    if (why)
        log_info("client %llu pid=%d uid=%u disconnected: %s; reclaimed %u lease%s",
                 (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid, why, held, held == 1 ? "" : "s");
    else if (n)
        log_info("client %llu pid=%d uid=%u died holding %u lease%s (or closed without releasing); reclaimed",
                 (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid, held, held == 1 ? "" : "s");
    else
        log_debug("client %llu pid=%d uid=%u closed", (unsigned long long)c->id, (int)c->pid,
                  (unsigned)c->uid);
    if (c->prev) c->prev->next = c->next; else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->nconns--;
    uv_close((uv_handle_t *)&c->poll, on_closed);
}

static void set_events(struct conn *c)
{
    if (c->closing)
        return;
    /* While replies are queued, read nothing new: backpressure, not buffering. */
    /* (Not UV_DISCONNECT while paused: a peer's half-close is level-triggered and would
     * wake the loop forever; a full close still shows as an error when flushing.) */
    int ev = c->out_head ? UV_WRITABLE : UV_READABLE | UV_DISCONNECT;
    uv_poll_start(&c->poll, ev, on_poll);
}

static ssize_t send_one(int sock, const uint8_t *data, size_t len, int fd)
{
    struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    ssize_t n;
    do
        n = sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

static int enqueue(struct conn *c, const uint8_t *data, size_t len, int fd)
{
    if (c->out_count >= CONN_MAX_QUEUED) {
        c->server->counters.slow_clients++;
        conn_close(c, "client does not read its replies");
        return -ENOBUFS;
    }
    struct conn_out *o = malloc(sizeof(*o) + len);
    if (!o) {
        conn_close(c, "out of memory queueing a reply");
        return -ENOMEM;
    }
    o->next = NULL;
    o->len = len;
    o->fd = -1;
    memcpy(o->data, data, len);
    /* The buffer may be retired before the queue drains: the queue keeps its own fd. */
    if (fd >= 0 && (o->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
        free(o);
        conn_close(c, "cannot duplicate a buffer fd for a queued reply");
        return -EMFILE;
    }
    if (c->out_tail) c->out_tail->next = o; else c->out_head = o;
    c->out_tail = o;
    c->out_count++;
    set_events(c);
    return 0;
}

static int send_bytes(struct conn *c, const uint8_t *data, size_t len, int fd)
{
    if (c->closing)
        return -EPIPE;
    if (!c->out_head) {
        ssize_t n = send_one(c->fd, data, len, fd);
        if (n >= 0)
            return 0;
        if (n != -EAGAIN) {
            conn_close(c, n == -EPIPE || n == -ECONNRESET ? NULL : "send failed");
            return (int)n;
        }
    }
    return enqueue(c, data, len, fd);
}

int conn_send(struct conn *c, const struct proto_msg *m, int fd)
{
    uint8_t *buf = c->server->wbuf;
    int len = proto_encode(m, buf, sizeof(c->server->wbuf));
    if (len < 0) {
        log_error("reply %s to client %llu does not fit in %zu bytes", proto_op_name(m->op),
                  (unsigned long long)c->id, sizeof(c->server->wbuf));
        conn_fail(c, m->id, EMSGSIZE, "reply too large");
        return len;
    }
    return send_bytes(c, buf, (size_t)len, fd);
}

void conn_fail(struct conn *c, uint32_t id, int code, const char *fmt, ...)
{
    char msg[PROTO_MAX_ERRMSG + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    uint8_t *buf = c->server->wbuf;
    int len = proto_encode_error(id, code, buf, sizeof(c->server->wbuf), "%s", msg);
    if (len > 0)
        send_bytes(c, buf, (size_t)len, -1);
}

static void flush(struct conn *c)
{
    while (c->out_head && !c->closing) {
        struct conn_out *o = c->out_head;
        ssize_t n = send_one(c->fd, o->data, o->len, o->fd);
        if (n == -EAGAIN)
            return;
        if (n < 0) {
            conn_close(c, n == -EPIPE || n == -ECONNRESET ? NULL : "send failed");
            return;
        }
        c->out_head = o->next;
        if (!c->out_head)
            c->out_tail = NULL;
        c->out_count--;
        if (o->fd >= 0)
            close(o->fd);
        free(o);
    }
    set_events(c);
}

/* close_fds: closes every fd in the control data; returns how many there were. */
static unsigned close_fds(struct msghdr *mh)
{
    unsigned n = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            close(fd);
            n++;
        }
    }
    return n;
}

static void protocol_error(struct conn *c, uint32_t id, const char *why)
{
    c->server->counters.protocol_errors++;
    conn_fail(c, id, EPROTO, "protocol error: %s", why);
    conn_close(c, why);
}

/* handle: one received message (n bytes in buf, control data in mh). */
static void handle(struct conn *c, struct msghdr *mh, const uint8_t *buf, size_t n)
{
    unsigned nfds = close_fds(mh);
    if (c->closing)
        return; /* an earlier message of the batch closed it: only the fds mattered */
    if (n == 0 && !(mh->msg_flags & MSG_CTRUNC) && nfds == 0) {
        conn_close(c, NULL); /* EOF: the peer closed or died */
        return;
    }
    if (mh->msg_flags & MSG_CTRUNC) {
        protocol_error(c, 0, "truncated control data (too many fds sent)");
        return;
    }
    if (nfds) {
        protocol_error(c, 0, "unexpected file descriptors from client");
        return;
    }
    if ((mh->msg_flags & MSG_TRUNC) || n > PROTO_MAX_REQUEST) {
        protocol_error(c, 0, "message larger than the 65536-byte limit");
        return;
    }
    struct proto_msg m;
    const char *why = NULL;
    int r = proto_decode(buf, n, PROTO_MAX_REQUEST, &m, &why);
    if (!c->hello && (r == -EOPNOTSUPP || (r == 0 && m.op != PROTO_OP_HELLO))) {
        protocol_error(c, m.id, "the first message must be hello");
        return;
    }
    if (r == -EOPNOTSUPP || (r == 0 && (m.op >= PROTO_OP_REPLY))) {
        /* Well-formed but not a request we know: refuse it, keep the client. */
        conn_fail(c, m.id, EOPNOTSUPP, "unknown op %u", (unsigned)m.op);
        return;
    }
    if (r < 0) {
        protocol_error(c, m.id, why ? why : "malformed message");
        return;
    }
    broker_handle(c, &m);
}

/* read_batch: receive up to CONN_BATCH messages with one recvmmsg and handle them all
 * (they are off the socket). Returns 1 if there may be more to read now. */
static int read_batch(struct conn *c)
{
    struct server *s = c->server;
    struct mmsghdr mm[CONN_BATCH];
    struct iovec iov[CONN_BATCH];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl[CONN_BATCH];
    for (int i = 0; i < CONN_BATCH; i++) {
        iov[i] = (struct iovec){ .iov_base = s->rbuf[i], .iov_len = sizeof(s->rbuf[i]) };
        mm[i].msg_hdr = (struct msghdr){ .msg_iov = &iov[i], .msg_iovlen = 1,
                                         .msg_control = ctl[i].buf, .msg_controllen = sizeof(ctl[i].buf) };
        mm[i].msg_len = 0;
    }
    int n;
    do
        n = recvmmsg(c->fd, mm, CONN_BATCH, MSG_DONTWAIT | MSG_CMSG_CLOEXEC, NULL);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno != EAGAIN)
            conn_close(c, errno == ECONNRESET ? NULL : "receive failed");
        return 0;
    }
    for (int i = 0; i < n; i++)
        handle(c, &mm[i].msg_hdr, s->rbuf[i], mm[i].msg_len);
    return n == CONN_BATCH && !c->closing && !c->out_head;
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    struct conn *c = p->data;
    if (c->closing)
        return;
    if (status < 0) {
        conn_close(c, NULL);
        return;
    }
    conn_ref(c);
    if (events & UV_WRITABLE)
        flush(c);
    /* A few batches per wake-up at most: other clients get their turn. */
    if (!c->closing && !c->out_head && (events & (UV_READABLE | UV_DISCONNECT))) {
        for (int i = 0; i < 4 && read_batch(c); i++)
            ;
    }
    conn_unref(c);
}
