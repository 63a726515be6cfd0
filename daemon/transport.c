/* SPDX-License-Identifier: MIT */
/* transport.c: see transport.h. libuv's streams cannot carry arbitrary fds, so the socket
 * is driven with uv_poll_t and recvmsg/sendmsg. Received control data is always
 * inspected: any fd a peer sends is closed and is a framing fault, as is a truncated
 * message or truncated control data. All receive buffers are one static batch: one loop
 * thread serves every transport. */
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "proto.h"

struct transport_out {
    struct transport_out *next;
    unsigned nfds;
    int fds[TRANSPORT_MAX_FDS]; /* dups the queue owns */
    size_t len;
    uint8_t data[];
};

/* A request received (with others, by one recvmmsg) after the transport reached a cap of
 * fds in flight: held, and handled when the cap clears, so that no reply past the cap is
 * made (a lease_many reply carries up to TRANSPORT_MAX_FDS fds: 16 of them read at once
 * would be 512 fds in flight to a peer capped at 64). Also held: the rest of a batch
 * received after the connection used its time of this wake-up (TRANSPORT_TURN_NS). */
struct transport_in {
    struct transport_in *next;
    size_t len;
    uint8_t data[];
};

struct transport {
    uv_poll_t poll;
    int fd;
    size_t max_message;
    bool closing;
    enum transport_end end; /* the first reason to close */
    char why[PROTO_MAX_ERRMSG + 1];
    bool has_why;
    const struct transport_ops *ops;
    void *ctx;
    struct transport_out *out_head, *out_tail;
    unsigned out_count;
    struct transport_in *in_head, *in_tail; /* requests held at an fd cap, in order */
    /* fds in flight: fd-carrying replies sent that the peer may not have read yet (reset
     * when SIOCOUTQ shows nothing unread), capped per transport and, through *shared,
     * per group of transports (one uid's); at a cap the transport reads no requests. */
    uv_timer_t recheck;
    unsigned recheck_ms;     /* backoff of the recheck timer */
    unsigned fd_unread, fd_cap, shared_cap;
    unsigned *shared;
    bool fd_wait;            /* a send met ETOOMANYREFS: the queue waits for the timer */
    bool room_wait;          /* the queue's head carries fds past a cap: waits for the peer to read */
    struct watch *watch;     /* in it (edge-triggered: the peer read, or hung up), or NULL */
    bool room_wanted;        /* the owner was told no room with nothing of ours unread (the
                              * daemon's budget): the timer looks again */
    bool paused;             /* not polled at all: a cap or fd_wait; the timer resumes it */
    bool hung_up;            /* the peer is gone: what it sent is still handled, replies
                              * go nowhere (hang_up) */
    int handles;             /* open libuv handles; the last close callback frees t */
};

static uint8_t rbuf[TRANSPORT_BATCH][PROTO_MAX_REQUEST + 1]; /* +1 to see truncation */

static void on_poll(uv_poll_t *p, int status, int events);

/* The daemon's fds in flight, every transport's together: the kernel counts SCM_RIGHTS
 * fds sent and not yet received per sending user against its RLIMIT_NOFILE
 * (ETOOMANYREFS past it). Past budget_soft only a transport whose peer has read all it
 * was sent may send fds (one reply at a time); nobody passes budget_hard. */
static unsigned fds_in_flight, budget_soft, budget_hard;

/* The watch: one edge-triggered epoll set, itself polled by the loop, with every
 * transport's socket for EPOLLOUT (the peer read something of ours: its unread fds may be
 * gone) and EPOLLHUP (the peer is gone). Edge-triggered, it says each time the peer
 * reads, not that the socket is writable (it almost always is), so a transport paused at
 * an fd cap resumes as soon as its peer has read, and sees its death at once, with no
 * timer. It lives while transports do: the last one closes it, and the next transport
 * makes a new one (the old one may still be closing on the loop). */
struct watch {
    int epfd;
    uv_poll_t poll;
    unsigned users;              /* transports in it */
};
static struct watch *watch;      /* the current one, or NULL */

static void on_watch(uv_poll_t *p, int status, int events);

static void watch_closed(uv_handle_t *h)
{
    struct watch *w = h->data;
    close(w->epfd);
    free(w);
}

/* watch_add: t's socket in the watch. Without it (no memory, no epoll) the transport
 * still works: a timer then looks at its unread fds (arm_recheck). */
static void watch_add(struct transport *t, uv_loop_t *loop)
{
    if (!watch) {
        struct watch *w = calloc(1, sizeof(*w));
        if (!w)
            return;
        if ((w->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
            free(w);
            return;
        }
        if (uv_poll_init(loop, &w->poll, w->epfd) < 0) {
            close(w->epfd);
            free(w);
            return;
        }
        w->poll.data = w;
        uv_poll_start(&w->poll, UV_READABLE, on_watch);
        watch = w;
    }
    struct epoll_event ev = { .events = EPOLLOUT | EPOLLHUP | EPOLLET, .data.ptr = t };
    if (epoll_ctl(watch->epfd, EPOLL_CTL_ADD, t->fd, &ev) < 0) {
        if (!watch->users) {
            uv_close((uv_handle_t *)&watch->poll, watch_closed);
            watch = NULL;
        }
        return;
    }
    t->watch = watch;
    watch->users++;
}

static void watch_del(struct transport *t)
{
    struct watch *w = t->watch;
    if (!w)
        return;
    epoll_ctl(w->epfd, EPOLL_CTL_DEL, t->fd, NULL);
    t->watch = NULL;
    if (--w->users == 0) {
        uv_close((uv_handle_t *)&w->poll, watch_closed);
        if (watch == w)
            watch = NULL;
    }
}

void transport_set_fd_budget(unsigned soft, unsigned hard)
{
    budget_soft = soft;
    budget_hard = hard;
}

unsigned transport_fds_in_flight(void)
{
    return fds_in_flight;
}

unsigned transport_fd_budget(void)
{
    return budget_soft;
}

int transport_new(uv_loop_t *loop, int fd, size_t max_message, const struct transport_ops *ops, void *ctx,
                  struct transport **ret)
{
    if (max_message > PROTO_MAX_REQUEST)
        return -EINVAL;
    struct transport *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->fd = fd;
    t->max_message = max_message;
    t->ops = ops;
    t->ctx = ctx;
    int r = uv_poll_init(loop, &t->poll, fd);
    if (r < 0) {
        free(t);
        return r;
    }
    uv_timer_init(loop, &t->recheck);
    t->handles = 2;
    t->poll.data = t;
    t->recheck.data = t;
    uv_poll_start(&t->poll, UV_READABLE | UV_DISCONNECT, on_poll);
    watch_add(t, loop);
    *ret = t;
    return 0;
}

bool transport_closing(const struct transport *t)
{
    return t->closing;
}

/* drop_replies: the queued replies (and their fds) are not sent. */
static void drop_replies(struct transport *t)
{
    while (t->out_head) {
        struct transport_out *o = t->out_head;
        t->out_head = o->next;
        for (unsigned i = 0; i < o->nfds; i++)
            close(o->fds[i]);
        free(o);
    }
    t->out_tail = NULL;
    t->out_count = 0;
}

static void on_closed(uv_handle_t *h)
{
    struct transport *t = h->data;
    if (--t->handles > 0)
        return;
    if (t->shared)
        *t->shared -= t->fd_unread;
    fds_in_flight -= t->fd_unread;
    t->fd_unread = 0;
    watch_del(t);
    close(t->fd);
    t->fd = -1;
    t->ops->on_close(t->ctx, t->end, t->has_why ? t->why : NULL);
    drop_replies(t);
    while (t->in_head) {
        struct transport_in *i = t->in_head;
        t->in_head = i->next;
        free(i);
    }
    free(t);
}

/* end: the one way a transport starts closing; the first reason is the one reported. */
static void end(struct transport *t, enum transport_end e, const char *why)
{
    if (t->closing)
        return;
    t->closing = true;
    t->end = e;
    if (why) {
        snprintf(t->why, sizeof(t->why), "%s", why);
        t->has_why = true;
    }
    uv_close((uv_handle_t *)&t->poll, on_closed);
    uv_close((uv_handle_t *)&t->recheck, on_closed);
}

void transport_close(struct transport *t, const char *why)
{
    end(t, TRANSPORT_END_LOCAL, why);
}

static void arm_recheck(struct transport *t, bool reset);

/* Waits that began with ETOOMANYREFS, daemon-wide (status: counters.fd_waits). */
static uint64_t fd_waits;

uint64_t transport_fd_waits(void)
{
    return fd_waits;
}

/* too_many_refs: a send met ETOOMANYREFS: the reply waits (logged, 10 lines a second).
 * The kernel counts SCM_RIGHTS fds in flight per sending uid, over all that uid's
 * processes, against the sender's RLIMIT_NOFILE: the cause may be another process. */
static void too_many_refs(struct transport *t)
{
    static struct log_rate rate;
    unsigned held_back;
    struct rlimit rl = { 0 };
    if (!t->fd_wait)
        fd_waits++;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (log_rate_take(&rate, &held_back))
        log_warning("a reply's fd waits (ETOOMANYREFS): the fds in flight of uid %u, over all its processes "
                    "(this daemon's unread replies and any other process of that uid sending fds), passed "
                    "this daemon's RLIMIT_NOFILE %llu; retried until they are read. Run shmrefd as a user "
                    "of its own (--user), or raise its RLIMIT_NOFILE%s",
                    (unsigned)geteuid(), (unsigned long long)rl.rlim_cur,
                    held_back ? " (more such lines suppressed)" : "");
    t->fd_wait = true;
    arm_recheck(t, false);
}

/* shared_full: the group's (uid's) unread fds are at its cap. */
static bool shared_full(const struct transport *t)
{
    return t->shared && t->shared_cap && *t->shared >= t->shared_cap;
}

/* fd_blocked: at a cap of fds in flight: read no request that could send another. At
 * the group's cap, a transport with no unread fd of its own is still read, one message
 * at a time (its peer reads what it gets: a well-behaved client of a uid whose other
 * connections hoard fds goes on, one fd at most in flight). */
static bool fd_blocked(const struct transport *t)
{
    if (t->hung_up)
        return false; /* no reply reaches it any more: nothing to cap */
    return (t->fd_cap && t->fd_unread >= t->fd_cap) || (t->fd_unread && shared_full(t)) ||
           (t->fd_unread && budget_soft && fds_in_flight >= budget_soft);
}

/* fd_room: whether a reply with n fds may go now: within this transport's cap, its
 * group's and the daemon's budget; a peer that has read everything may always have one
 * reply (up to TRANSPORT_MAX_FDS fds) in flight, short of the daemon's hard bound. */
static bool fd_room(const struct transport *t, unsigned n)
{
    if (!n)
        return true;
    if (budget_hard && fds_in_flight + n > budget_hard)
        return false;
    if (!t->fd_unread)
        return true;
    return !(t->fd_cap && t->fd_unread + n > t->fd_cap) && !shared_full(t) &&
           !(budget_soft && fds_in_flight + n > budget_soft);
}

bool transport_fd_room(struct transport *t, unsigned nfds)
{
    bool room = !t->closing && !t->out_head && fd_room(t, nfds);
    if (!room && !t->closing && !t->out_head) {
        t->room_wanted = true; /* the watch says when the peer reads; the timer looks too */
        arm_recheck(t, false);
    }
    return room;
}

/* refresh_unread: a peer that has read every reply (SIOCOUTQ 0: nothing of ours is left
 * in its receive queue) has received every fd we sent it. */
static void refresh_unread(struct transport *t)
{
    int q = 0;
    if (t->fd_unread && ioctl(t->fd, SIOCOUTQ, &q) == 0 && q == 0) {
        if (t->shared)
            *t->shared -= t->fd_unread;
        fds_in_flight -= t->fd_unread;
        t->fd_unread = 0;
    }
}

static void on_recheck(uv_timer_t *h);

/* arm_recheck: a send met ETOOMANYREFS (the kernel's count of the daemon's fds in flight
 * includes what other processes of its user send): try again later, backing off from 5
 * to 500 ms. Unread fds are the watch's: it says when the peer reads (the timer is only
 * its backstop, below). A transport without the watch (no epoll) has the timer alone. */
static void arm_recheck(struct transport *t, bool reset)
{
    if (t->closing)
        return;
    /* Waiting on other peers' reads (the group's cap, the daemon's budget) has no edge of
     * its own: the timer looks again. */
    bool waiting = t->paused || t->room_wait || t->room_wanted;
    bool budget = waiting && (shared_full(t) || (budget_soft && fds_in_flight >= budget_soft) ||
                              (budget_hard && fds_in_flight >= budget_hard));
    /* Nor is the watch's edge enough alone: the kernel wakes us for the peer's last read
     * before it takes the last byte off our count (sock_wfree calls sk_write_space, then
     * subtracts), so SIOCOUTQ can still say 1 then, and no edge comes after it. Waiting on
     * our own unread fds, the timer looks again too: that race costs a few ms, not a hang
     * (a lease_many reply held for room never went: 1 run in 300 of test-lifecycle's). */
    bool unread = waiting && t->fd_unread;
    if (!t->fd_wait && !budget && !unread && (t->watch || (!t->fd_unread && !t->paused && !fd_blocked(t)))) {
        uv_timer_stop(&t->recheck);
        t->recheck_ms = 0;
        return;
    }
    if (reset || !t->recheck_ms)
        t->recheck_ms = 5;
    else if (t->recheck_ms < 500)
        t->recheck_ms *= 2;
    if (reset || !uv_is_active((uv_handle_t *)&t->recheck))
        uv_timer_start(&t->recheck, on_recheck, t->recheck_ms, 0);
}

static void set_events(struct transport *t)
{
    if (t->closing)
        return;
    /* While replies are queued, read nothing new: backpressure, not buffering. */
    /* (Not UV_DISCONNECT while paused: a peer's half-close is level-triggered and would
     * wake the loop forever; a full close still shows as an error when flushing.) */
    int ev = t->out_head ? UV_WRITABLE : UV_READABLE | UV_DISCONNECT;
    /* Requests held at a cap that has cleared: handled on the next wake-up (a writable
     * socket wakes the loop at once) before anything new is read. */
    if (!t->out_head && t->in_head)
        ev = UV_WRITABLE;
    /* A send that met ETOOMANYREFS, or a cap of fds in flight: wait for the timer (the
     * socket itself stays writable, so polling it would spin). */
    if (t->out_head && (t->fd_wait || t->room_wait))
        ev = 0;
    else if (!t->out_head && fd_blocked(t))
        ev = 0;
    t->paused = ev == 0;
    if (ev)
        uv_poll_start(&t->poll, ev, on_poll);
    else
        uv_poll_stop(&t->poll);
}

void transport_set_fd_limits(struct transport *t, unsigned per_transport, unsigned *shared, unsigned shared_cap)
{
    t->fd_cap = per_transport;
    t->shared = shared;
    t->shared_cap = shared_cap;
}

unsigned transport_fds_unread(const struct transport *t)
{
    return t->fd_unread;
}

static ssize_t send_one(int sock, const uint8_t *data, size_t len, const int *fds, unsigned nfds)
{
    struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(TRANSPORT_MAX_FDS * sizeof(int))];
    } ctl;
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (nfds) {
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.buf;
        mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
    }
    ssize_t n;
    do
        n = sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

/* sent_fds: n more fds in flight to this peer (each counts against the caps). */
static void sent_fds(struct transport *t, unsigned n)
{
    t->fd_unread += n;
    fds_in_flight += n;
    if (t->shared)
        *t->shared += n;
    arm_recheck(t, false);
}

static void set_events(struct transport *t);

/* peer_gone: the peer closed (a send said EPIPE, or its hang-up was seen). What it sent
 * before it went is still read and handled, in order, up to its EOF: a one-way publish or
 * release written just before exit must not be lost. Its replies go nowhere: the queue
 * is dropped, later sends are no-ops, and no fd cap applies (fd_blocked). */
static void peer_gone(struct transport *t)
{
    t->hung_up = true;
    drop_replies(t);
    t->room_wait = false;
    set_events(t); /* reading again, if a cap or the queue had stopped it */
}

/* send_failed: a send error ends the transport; a peer that went away is no news. */
static void send_failed(struct transport *t, ssize_t n)
{
    if (n == -EPIPE || n == -ECONNRESET)
        peer_gone(t);
    else
        end(t, TRANSPORT_END_FAILED, "send failed");
}

static int enqueue(struct transport *t, const uint8_t *data, size_t len, const int *fds, unsigned nfds)
{
    if (t->out_count >= TRANSPORT_MAX_QUEUED) {
        end(t, TRANSPORT_END_SLOW, "client does not read its replies");
        return -ENOBUFS;
    }
    struct transport_out *o = malloc(sizeof(*o) + len);
    if (!o) {
        end(t, TRANSPORT_END_FAILED, "out of memory queueing a reply");
        return -ENOMEM;
    }
    o->next = NULL;
    o->len = len;
    o->nfds = 0;
    memcpy(o->data, data, len);
    /* The buffers may be retired before the queue drains: the queue keeps its own fds. */
    for (; o->nfds < nfds; o->nfds++) {
        if ((o->fds[o->nfds] = fcntl(fds[o->nfds], F_DUPFD_CLOEXEC, 3)) < 0) {
            while (o->nfds)
                close(o->fds[--o->nfds]);
            free(o);
            end(t, TRANSPORT_END_FAILED, "cannot duplicate a buffer fd for a queued reply");
            return -EMFILE;
        }
    }
    if (t->out_tail) t->out_tail->next = o; else t->out_head = o;
    t->out_tail = o;
    t->out_count++;
    set_events(t);
    return 0;
}

int transport_send(struct transport *t, const uint8_t *data, size_t len, int fd)
{
    return transport_send_fds(t, data, len, &fd, fd >= 0 ? 1 : 0);
}

int transport_send_fds(struct transport *t, const uint8_t *data, size_t len, const int *fds, unsigned nfds)
{
    if (t->closing)
        return -EPIPE;
    if (t->hung_up)
        return -EPIPE; /* the peer is gone: its replies go nowhere (peer_gone) */
    if (nfds > TRANSPORT_MAX_FDS)
        return -EINVAL;
    if (!t->out_head && fd_room(t, nfds)) {
        ssize_t n = send_one(t->fd, data, len, fds, nfds);
        if (n >= 0) {
            if (nfds)
                sent_fds(t, nfds);
            return 0;
        }
        /* ETOOMANYREFS: the daemon has as many fds in flight (to all its peers) as the
         * kernel allows it. That is not this peer's fault: its reply waits, queued. */
        if (n == -ETOOMANYREFS) {
            too_many_refs(t);
        } else if (n != -EAGAIN) {
            send_failed(t, n);
            return (int)n;
        }
    }
    return enqueue(t, data, len, fds, nfds);
}

int transport_send_fds_now(struct transport *t, const uint8_t *data, size_t len, const int *fds, unsigned nfds)
{
    if (t->closing || t->hung_up)
        return -EPIPE;
    if (nfds > TRANSPORT_MAX_FDS)
        return -EINVAL;
    if (t->out_head || !fd_room(t, nfds))
        return -EAGAIN;
    ssize_t n = send_one(t->fd, data, len, fds, nfds);
    if (n >= 0) {
        if (nfds)
            sent_fds(t, nfds);
        return 0;
    }
    if (n == -EAGAIN || n == -ETOOMANYREFS)
        return -EAGAIN;
    send_failed(t, n);
    return (int)n;
}

static void flush(struct transport *t)
{
    t->room_wait = false;
    while (t->out_head && !t->closing) {
        struct transport_out *o = t->out_head;
        if (!fd_room(t, o->nfds)) { /* past a cap: the watch resumes it when the peer reads */
            t->room_wait = true;
            set_events(t);
            if (!t->watch)
                arm_recheck(t, false);
            return;
        }
        ssize_t n = send_one(t->fd, o->data, o->len, o->fds, o->nfds);
        if (n == -EAGAIN) {
            if (t->paused)
                set_events(t); /* resumed by the timer: wait for the socket now */
            return;
        }
        if (n == -ETOOMANYREFS) {
            too_many_refs(t); /* backing off while the kernel keeps refusing */
            set_events(t);
            return;
        }
        if (n < 0) {
            send_failed(t, n);
            return;
        }
        t->out_head = o->next;
        if (!t->out_head)
            t->out_tail = NULL;
        t->out_count--;
        for (unsigned i = 0; i < o->nfds; i++)
            close(o->fds[i]);
        if (o->nfds)
            sent_fds(t, o->nfds);
        free(o);
    }
    set_events(t);
}

/* resume: the peer may have read (its unread fds are recounted): replies held past a cap
 * go, the owner sends what it held for room (ops->on_room), reading starts again. */
static void resume(struct transport *t)
{
    if (t->closing)
        return;
    if (t->out_head && t->room_wait && fd_room(t, t->out_head->nfds))
        flush(t);
    if (!t->closing && !t->out_head && t->ops->on_room) {
        t->room_wanted = false;
        t->ops->on_room(t->ctx);
    }
    if (t->closing)
        return;
    if (t->paused && !t->out_head && !fd_blocked(t))
        set_events(t);
    arm_recheck(t, false);
}

static void on_recheck(uv_timer_t *h)
{
    struct transport *t = h->data;
    if (t->closing)
        return;
    refresh_unread(t);
    if (t->fd_wait) {
        t->fd_wait = false;
        flush(t); /* may meet ETOOMANYREFS again and re-arm */
    }
    resume(t);
}

static int read_batch(struct transport *t, unsigned max, uint64_t deadline);
static void drain(struct transport *t, uint64_t deadline);

/* hang_up: a paused peer is gone. What it sent before it went is still handled, in
 * order (requests held at a cap, then those still in the socket: a one-way publish or
 * release written just before exit must not be lost); their replies go nowhere, so no cap
 * applies. Then the transport ends. Bounded: the socket holds what the peer sent, no more. */
static void hang_up(struct transport *t)
{
    peer_gone(t);
    drain(t, 0);
    for (int i = 0; i < 1024 && !t->closing && read_batch(t, TRANSPORT_BATCH, 0); i++)
        ;
    end(t, TRANSPORT_END_PEER, NULL);
}

/* on_watch: edges from the watch: a peer read something of ours, or hung up. A paused
 * transport is not polled by the loop, so its peer's death is seen here, at once. */
static void on_watch(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    struct watch *w = p->data;
    struct epoll_event ev[64];
    int n;
    do {
        n = epoll_wait(w->epfd, ev, 64, 0);
        for (int i = 0; i < n; i++) {
            struct transport *t = ev[i].data.ptr;
            if (t->closing)
                continue;
            if (ev[i].events & (EPOLLHUP | EPOLLERR)) {
                if (t->paused || t->room_wait)
                    hang_up(t); /* polled, the loop sees it itself */
                continue;
            }
            refresh_unread(t);
            resume(t);
        }
    } while (n == 64);
}

/* A peer's fds are closed in libuv's thread pool: a close can take long (a TCP socket
 * with SO_LINGER and unsent data waits up to its linger time), and the loop serves everyone. */
struct closing_fds {
    uv_work_t work;
    unsigned n;
    int fds[];
};

static void close_work(uv_work_t *w)
{
    struct closing_fds *c = w->data;
    for (unsigned i = 0; i < c->n; i++)
        close(c->fds[i]);
}

static void close_done(uv_work_t *w, int status)
{
    (void)status;
    free(w->data);
}

/* close_fds: closes every fd in the control data, off the loop; returns how many there were. */
static unsigned close_fds(uv_loop_t *loop, struct msghdr *mh)
{
    unsigned n = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            n += (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    if (!n)
        return 0;
    struct closing_fds *c = malloc(sizeof(*c) + n * sizeof(int));
    unsigned k = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t m = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < m; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (c)
                c->fds[k++] = fd;
            else
                close(fd); /* no memory for the work request: close here, as before */
        }
    }
    if (c) {
        c->n = k;
        c->work.data = c;
        if (uv_queue_work(loop, &c->work, close_work, close_done) < 0) {
            close_work(&c->work);
            free(c);
        }
    }
    return n;
}

/* framing_fault: an EPROTO reply (id 0: about the whole connection), then closed. */
static void framing_fault(struct transport *t, const char *why)
{
    uint8_t buf[PROTO_MAX_ERRMSG + 64];
    int len = proto_encode_error(0, EPROTO, buf, sizeof(buf), "protocol error: %s", why);
    if (len > 0)
        transport_send(t, buf, (size_t)len, -1);
    end(t, TRANSPORT_END_FRAMING, why);
}

/* eof: the peer's EOF, read after what it sent. Requests it sent before are handled
 * first, in order, held ones too (past a wake-up's time or at an fd cap): a one-way
 * publish or release written just before exit must not be lost. Those a cap or a full
 * queue still holds are handled as for a peer that is gone (their replies dropped). */
static void eof(struct transport *t)
{
    drain(t, 0);
    if (t->in_head && !t->closing) {
        peer_gone(t);
        drain(t, 0);
    }
    end(t, TRANSPORT_END_PEER, NULL);
}

/* admit: whether one received message (n bytes, control data in mh) is a request to
 * handle; framing faults close the transport. */
static bool admit(struct transport *t, struct msghdr *mh, size_t n)
{
    char why[80];
    unsigned nfds = close_fds(t->poll.loop, mh);
    if (t->closing)
        return false; /* an earlier message of the batch closed it: only the fds mattered */
    if (n == 0 && !(mh->msg_flags & MSG_CTRUNC) && nfds == 0) {
        eof(t); /* the peer closed or died */
        return false;
    }
    if (mh->msg_flags & MSG_CTRUNC) {
        framing_fault(t, "truncated control data (too many fds sent)");
        return false;
    }
    if (nfds) {
        framing_fault(t, "unexpected file descriptors from client");
        return false;
    }
    if ((mh->msg_flags & MSG_TRUNC) || n > t->max_message) {
        snprintf(why, sizeof(why), "message larger than the %zu-byte limit", t->max_message);
        framing_fault(t, why);
        return false;
    }
    return true;
}

/* hold: a request that came past an fd cap waits in t->in_head (drain handles it). */
static void hold(struct transport *t, const uint8_t *buf, size_t n)
{
    struct transport_in *i = malloc(sizeof(*i) + n);
    if (!i) {
        end(t, TRANSPORT_END_FAILED, "out of memory holding a request");
        return;
    }
    i->next = NULL;
    i->len = n;
    memcpy(i->data, buf, n);
    if (t->in_tail) t->in_tail->next = i; else t->in_head = i;
    t->in_tail = i;
}

/* past: whether this wake-up's time for the connection is used up (deadline 0: never). */
static bool past(uint64_t deadline)
{
    return deadline && uv_hrtime() >= deadline;
}

/* drain: the held requests, in order, while no cap is reached, no reply is queued and
 * (after the first) the deadline has not passed. */
static void drain(struct transport *t, uint64_t deadline)
{
    bool first = true;
    while (t->in_head && !t->closing && !t->out_head && !fd_blocked(t) && (first || !past(deadline))) {
        first = false;
        struct transport_in *i = t->in_head;
        if (!(t->in_head = i->next))
            t->in_tail = NULL;
        t->ops->on_message(t->ctx, i->data, i->len);
        free(i);
    }
}

/* handle: one received message (n bytes in buf, control data in mh): handled now, or held
 * when the transport is at an fd cap or past its deadline (or already holds requests:
 * order is kept). */
static void handle(struct transport *t, struct msghdr *mh, const uint8_t *buf, size_t n, uint64_t deadline)
{
    if (!admit(t, mh, n))
        return;
    if (t->in_head || fd_blocked(t) || past(deadline))
        hold(t, buf, n);
    else
        t->ops->on_message(t->ctx, buf, n);
}

/* read_batch: receive up to TRANSPORT_BATCH messages with one recvmmsg and handle them
 * (they are off the socket: those past the deadline, if not 0, are held for the next
 * wake-up). Returns 1 if there may be more to read now. */
static int read_batch(struct transport *t, unsigned max, uint64_t deadline)
{
    struct mmsghdr mm[TRANSPORT_BATCH];
    struct iovec iov[TRANSPORT_BATCH];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl[TRANSPORT_BATCH];
    for (int i = 0; i < TRANSPORT_BATCH; i++) {
        iov[i] = (struct iovec){ .iov_base = rbuf[i], .iov_len = t->max_message + 1 };
        mm[i].msg_hdr = (struct msghdr){ .msg_iov = &iov[i], .msg_iovlen = 1,
                                         .msg_control = ctl[i].buf, .msg_controllen = sizeof(ctl[i].buf) };
        mm[i].msg_len = 0;
    }
    int n;
    do
        n = recvmmsg(t->fd, mm, max, MSG_DONTWAIT | MSG_CMSG_CLOEXEC, NULL);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        /* ECONNRESET: the peer closed with replies of ours unread. The error comes once,
         * before what it sent last: that is still read (hang_up). */
        if (errno == ECONNRESET && !t->hung_up)
            hang_up(t);
        else if (errno == ECONNRESET)
            return 1; /* reported once (the socket's error is cleared): read on */
        else if (errno != EAGAIN)
            end(t, TRANSPORT_END_FAILED, "receive failed");
        return 0;
    }
    for (int i = 0; i < n; i++)
        handle(t, &mm[i].msg_hdr, rbuf[i], mm[i].msg_len, deadline);
    return n == (int)max && !t->closing && !t->out_head && !t->in_head;
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    struct transport *t = p->data;
    if (t->closing)
        return;
    if (status < 0) { /* EPOLLERR: the peer closed with replies of ours unread */
        hang_up(t);
        return;
    }
    /* Nothing here frees t: a close only marks it, and frees it from the loop. */
    if (events & UV_WRITABLE) {
        flush(t);
        if (!t->closing && !t->out_head && t->ops->on_room)
            t->ops->on_room(t->ctx); /* the queue drained: the owner's held replies may go */
    }
    if (t->fd_unread) {
        refresh_unread(t);
        if (!t->fd_unread)
            arm_recheck(t, false); /* stops the recheck: the peer has read everything */
    }
    /* A few batches per wake-up at most, and TRANSPORT_TURN_NS of handling (a request may
     * cost far more than another: a status walks every lease): other clients get their
     * turn. What was received past the time is held; the rest stays in the socket, which
     * (level-triggered) wakes the loop again. */
    uint64_t deadline = uv_hrtime() + TRANSPORT_TURN_NS;
    bool held = t->in_head != NULL;
    if (held)
        drain(t, deadline);
    if (!t->closing && !t->out_head && !t->in_head && !fd_blocked(t) && (events & (UV_READABLE | UV_DISCONNECT))) {
        for (int i = 0; i < 4 && !fd_blocked(t) && !past(deadline) &&
                        read_batch(t, shared_full(t) ? 1 : TRANSPORT_BATCH, deadline); i++)
            ;
    }
    if (!t->closing && !t->out_head && fd_blocked(t)) {
        set_events(t); /* stops reading until the recheck finds the replies read */
        arm_recheck(t, false);
    } else if ((held || t->in_head) && !t->closing) {
        set_events(t); /* held requests wake the next turn (writable); reading once none are */
    }
}
