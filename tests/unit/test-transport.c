/* SPDX-License-Identifier: MIT */
/* test-transport.c: one client socket (daemon/transport.c) over a real SOCK_SEQPACKET
 * socketpair and a real libuv loop: whole messages in, replies (with fds) out, framing
 * faults, the output queue's backpressure and its bound, and closing that is always
 * deferred to the loop (on_close never runs inside another call). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "proto.h"
#include "rawclient.h"
#include "transport.h"

struct fx {
    uv_loop_t loop;
    int fd;                      /* the transport's end */
    int peer;                    /* the client's end */
    struct transport *t;
    unsigned messages, closes;
    uint8_t last[PROTO_MAX_REQUEST];
    size_t last_len;
    enum transport_end end;
    char why[PROTO_MAX_ERRMSG + 1];
    bool in_callback;            /* set while on_message runs */
    const char *close_in_message; /* on_message closes with this reason */
    unsigned spin_us;            /* on_message busy-waits this long (an expensive request) */
    unsigned out_of_order;       /* messages whose first 4 bytes were not f->messages - 1 */
};

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void on_message(void *ctx, const uint8_t *data, size_t len)
{
    struct fx *f = ctx;
    f->in_callback = true;
    f->messages++;
    memcpy(f->last, data, len);
    f->last_len = len;
    if (f->spin_us) {
        unsigned k;
        memcpy(&k, data, sizeof(k));
        f->out_of_order += k != f->messages - 1;
        for (uint64_t end = mono_us() + f->spin_us; mono_us() < end;)
            ;
    }
    if (f->close_in_message) {
        transport_close(f->t, f->close_in_message);
        cr_assert_eq(f->closes, 0, "on_close ran inside transport_close");
    }
    f->in_callback = false;
}

static void on_close(void *ctx, enum transport_end end, const char *why)
{
    struct fx *f = ctx;
    cr_assert_not(f->in_callback, "on_close ran inside on_message");
    f->closes++;
    f->end = end;
    snprintf(f->why, sizeof(f->why), "%s", why ? why : "");
    f->t = NULL;
}

static const struct transport_ops ops = { on_message, on_close };

static void fx_open(struct fx *f, size_t max_message)
{
    int sv[2];
    memset(f, 0, sizeof(*f));
    cr_assert_eq(uv_loop_init(&f->loop), 0);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    f->fd = sv[0];
    f->peer = sv[1];
    signal(SIGPIPE, SIG_IGN);
    cr_assert_eq(transport_new(&f->loop, sv[0], max_message, &ops, f, &f->t), 0);
}

/* run: a few loop turns (non-blocking), enough for what is already on the socket. */
static void run(struct fx *f)
{
    for (int i = 0; i < 20; i++) {
        uv_run(&f->loop, UV_RUN_NOWAIT);
        usleep(500);
    }
}

static void fx_close(struct fx *f)
{
    if (f->t)
        transport_close(f->t, NULL);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    cr_assert_eq(f->closes, 1, "on_close ran %u times", f->closes);
    cr_assert_eq(uv_loop_close(&f->loop), 0, "a handle leaked");
    close(f->peer);
}

Test(transport, delivers_whole_messages)
{
    struct fx f;
    fx_open(&f, PROTO_MAX_REQUEST);
    cr_assert_eq(rawclient_send(f.peer, "one", 3), 0);
    cr_assert_eq(rawclient_send(f.peer, "three", 5), 0);
    run(&f);
    cr_assert_eq(f.messages, 2);
    cr_assert_eq(f.last_len, 5);
    cr_assert_eq(memcmp(f.last, "three", 5), 0);
    cr_assert_eq(f.closes, 0);
    fx_close(&f);
    cr_assert_eq(f.end, TRANSPORT_END_LOCAL);
}

Test(transport, peer_eof_ends_it_as_peer)
{
    struct fx f;
    fx_open(&f, PROTO_MAX_REQUEST);
    shutdown(f.peer, SHUT_WR);
    run(&f);
    cr_assert_eq(f.closes, 1);
    cr_assert_eq(f.end, TRANSPORT_END_PEER);
    cr_assert_str_empty(f.why, "a plain EOF has no reason");
    fx_close(&f);
}

Test(transport, sends_replies_with_an_fd)
{
    struct fx f;
    fx_open(&f, PROTO_MAX_REQUEST);
    int mfd = memfd_create("t", MFD_CLOEXEC);
    cr_assert_geq(mfd, 0);
    cr_assert_eq(transport_send(f.t, (const uint8_t *)"rep", 3, mfd), 0);
    uint8_t buf[16];
    int got = -1;
    cr_assert_eq(rawclient_recv(f.peer, buf, sizeof(buf), &got), 3);
    cr_assert_geq(got, 0, "no fd came with the reply");
    struct stat a, b;
    fstat(mfd, &a);
    fstat(got, &b);
    cr_assert(a.st_ino == b.st_ino && a.st_dev == b.st_dev, "another file came");
    close(got);
    close(mfd); /* the fd stays the caller's: the transport kept none */
    fx_close(&f);
}

Test(transport, fds_from_the_peer_are_a_framing_fault)
{
    struct fx f;
    fx_open(&f, PROTO_MAX_REQUEST);
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl = { 0 };
    struct iovec iov = { .iov_base = "x", .iov_len = 1 };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b) };
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fds[0], sizeof(int));
    cr_assert_eq(sendmsg(f.peer, &mh, 0), 1);
    close(fds[0]);
    run(&f);
    cr_assert_eq(f.messages, 0, "a message with fds was delivered");
    cr_assert_eq(f.end, TRANSPORT_END_FRAMING);
    uint8_t rep[1024];
    ssize_t n = rawclient_recv(f.peer, rep, sizeof(rep), NULL);
    struct proto_msg m;
    const char *why;
    cr_assert_gt(n, 0, "no error reply");
    cr_assert_eq(proto_decode(rep, (size_t)n, sizeof(rep), &m, &why), 0);
    cr_assert_eq(m.op, PROTO_OP_ERROR);
    cr_assert_eq(m.u.error.code, EPROTO);
    /* the daemon's copy of the fd is closed: our write end sees no reader */
    char c = 0;
    cr_assert_eq(write(fds[1], &c, 1), -1);
    cr_assert_eq(errno, EPIPE);
    close(fds[1]);
    fx_close(&f);
}

Test(transport, oversized_message_is_a_framing_fault)
{
    struct fx f;
    uint8_t big[101] = { 0 };
    fx_open(&f, 100);
    cr_assert_eq(rawclient_send(f.peer, big, 100), 0);
    cr_assert_eq(rawclient_send(f.peer, big, 101), 0);
    run(&f);
    cr_assert_eq(f.messages, 1, "the 100-byte message is fine, the 101-byte one is not");
    cr_assert_eq(f.end, TRANSPORT_END_FRAMING);
    cr_assert(strstr(f.why, "100-byte limit"), "reason: %s", f.why);
    fx_close(&f);
}

/* A close inside on_message only marks: the rest of the batch is not delivered, and
 * on_close comes from the loop with the reason given. */
Test(transport, close_is_deferred_to_the_loop)
{
    struct fx f;
    fx_open(&f, PROTO_MAX_REQUEST);
    f.close_in_message = "enough";
    for (int i = 0; i < 3; i++)
        cr_assert_eq(rawclient_send(f.peer, "m", 1), 0);
    run(&f);
    cr_assert_eq(f.messages, 1);
    cr_assert_eq(f.closes, 1);
    cr_assert_eq(f.end, TRANSPORT_END_LOCAL);
    cr_assert_str_eq(f.why, "enough");
    fx_close(&f);
}

/* A send to a peer that is gone fails and frees nothing under the caller: it can still
 * ask, and send again (refused); what the peer sent is still read, and the transport ends
 * at its EOF, when the loop runs on_close. */
Test(transport, failed_send_frees_nothing_under_the_caller)
{
    struct fx f;
    fx_open(&f, PROTO_MAX_REQUEST);
    close(f.peer);
    f.peer = -1;
    int r = transport_send(f.t, (const uint8_t *)"x", 1, -1);
    cr_assert_lt(r, 0);
    cr_assert_eq(transport_send(f.t, (const uint8_t *)"y", 1, -1), -EPIPE);
    cr_assert_eq(f.closes, 0, "on_close ran inside transport_send");
    run(&f);
    cr_assert_eq(f.closes, 1);
    cr_assert_eq(f.end, TRANSPORT_END_PEER);
    fx_close(&f);
}

/* A peer that does not read: replies queue, and while any are queued nothing new is
 * read; once the peer reads, the queue drains in order and reading resumes. */
Test(transport, queued_replies_hold_back_reading)
{
    struct fx f;
    uint8_t msg[1024] = { 0 }, buf[2048];
    fx_open(&f, PROTO_MAX_REQUEST);
    int small = 1; /* the kernel's minimum: a few replies fill the socket */
    cr_assert_eq(setsockopt(f.fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
    const unsigned n = 40;
    for (unsigned i = 0; i < n; i++) {
        memcpy(msg, &i, sizeof(i));
        cr_assert_eq(transport_send(f.t, msg, sizeof(msg), -1), 0, "reply %u", i);
    }
    cr_assert_eq(rawclient_send(f.peer, "m", 1), 0);
    run(&f);
    cr_assert_eq(f.messages, 0, "read a request while replies were queued");
    for (unsigned i = 0; i < n;) {
        ssize_t r = rawclient_recv(f.peer, buf, sizeof(buf), NULL);
        if (r == -EAGAIN) {
            run(&f);
            continue;
        }
        cr_assert_eq(r, (ssize_t)sizeof(msg));
        unsigned k;
        memcpy(&k, buf, sizeof(k));
        cr_assert_eq(k, i, "reply %u came as number %u", k, i);
        i++;
    }
    run(&f);
    cr_assert_eq(f.messages, 1, "reading did not resume once the queue drained");
    fx_close(&f);
}

/* Requests that cost 50 us each: one wake-up handles TRANSPORT_TURN_NS of them (and the
 * one that passes it), not 4 batches; the rest are handled on the next turns, every one,
 * in order, also when the peer closed right after sending them. */
Test(transport, one_wake_up_handles_a_bounded_time_of_requests)
{
    struct fx f;
    fx_open(&f, PROTO_MAX_REQUEST);
    f.spin_us = 50;
    const unsigned n = 40, most = TRANSPORT_TURN_NS / 1000 / 50 + 1;
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(rawclient_send(f.peer, &i, sizeof(i)), 0);
    shutdown(f.peer, SHUT_WR);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_geq(f.messages, 1);
    cr_assert_leq(f.messages, most, "one wake-up handled %u requests of 50 us (at most %u)", f.messages, most);
    for (int i = 0; i < 200 && f.closes == 0; i++)
        uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(f.messages, n, "%u of %u requests were handled", f.messages, n);
    cr_assert_eq(f.out_of_order, 0, "%u requests were handled out of order", f.out_of_order);
    cr_assert_eq(f.closes, 1, "the peer's EOF was not seen after its requests");
    cr_assert_eq(f.end, TRANSPORT_END_PEER);
    fx_close(&f);
}

/* TRANSPORT_MAX_QUEUED queued replies: the peer counts as stuck and the transport ends
 * as slow (deferred, like every close). */
Test(transport, too_many_queued_replies_end_it_as_slow)
{
    struct fx f;
    uint8_t msg[64] = { 0 };
    fx_open(&f, PROTO_MAX_REQUEST);
    int r = 0;
    unsigned sent = 0;
    while (sent < 100000 && (r = transport_send(f.t, msg, sizeof(msg), -1)) == 0)
        sent++;
    cr_assert_eq(r, -ENOBUFS, "send %u: %d", sent, r);
    cr_assert_geq(sent, TRANSPORT_MAX_QUEUED);
    cr_assert(transport_closing(f.t));
    cr_assert_eq(f.closes, 0);
    run(&f);
    cr_assert_eq(f.end, TRANSPORT_END_SLOW);
    cr_assert(strstr(f.why, "does not read"), "reason: %s", f.why);
    fx_close(&f);
}

/* run_ms: loop turns for about ms milliseconds (timers included). */
static void run_ms(struct fx *f, int ms)
{
    for (int i = 0; i < ms; i++) {
        uv_run(&f->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
}

Test(transport, unread_fds_at_the_cap_stop_reading_until_the_peer_reads)
{
    struct fx f;
    unsigned shared = 0;
    uint8_t buf[64];
    fx_open(&f, PROTO_MAX_REQUEST);
    transport_set_fd_limits(f.t, 2, &shared, 100);
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    cr_assert_eq(transport_send(f.t, (const uint8_t *)"a", 1, fd), 0);
    cr_assert_eq(transport_send(f.t, (const uint8_t *)"b", 1, fd), 0);
    cr_assert_eq(transport_fds_unread(f.t), 2);
    cr_assert_eq(shared, 2, "the shared count");
    cr_assert_eq(rawclient_send(f.peer, "req", 3), 0);
    run_ms(&f, 30);
    cr_assert_eq(f.messages, 0, "a request was read with 2 fds unread at a cap of 2");
    int got = -1;
    cr_assert_eq(rawclient_recv(f.peer, buf, sizeof(buf), &got), 1);
    close(got);
    run_ms(&f, 30);
    cr_assert_eq(f.messages, 0, "one reply is still unread");
    cr_assert_eq(rawclient_recv(f.peer, buf, sizeof(buf), &got), 1);
    close(got);
    for (int i = 0; i < 1000 && f.messages < 1; i++) /* the recheck backs off up to 500 ms */
        run_ms(&f, 1);
    cr_assert_eq(f.messages, 1, "reading did not resume once every reply was read");
    cr_assert_eq(transport_fds_unread(f.t), 0);
    cr_assert_eq(shared, 0);
    /* the shared cap: other transports' unread fds reached it. This one, with none of
     * its own unread, is still read, one message at a time... */
    shared = 100;
    cr_assert_eq(rawclient_send(f.peer, "req2", 4), 0);
    cr_assert_eq(rawclient_send(f.peer, "req3", 4), 0);
    run_ms(&f, 30);
    cr_assert_eq(f.messages, 3, "a transport with nothing unread was not read at the shared cap");
    /* ...until it has an fd unread itself */
    cr_assert_eq(transport_send(f.t, (const uint8_t *)"c", 1, fd), 0);
    cr_assert_eq(shared, 101);
    cr_assert_eq(rawclient_send(f.peer, "req4", 4), 0);
    run_ms(&f, 30);
    cr_assert_eq(f.messages, 3, "read past the shared cap with an fd of its own unread");
    shared = 99; /* the others read theirs; ours (1) is still unread: under the cap now */
    for (int i = 0; i < 1000 && f.messages < 4; i++)
        run_ms(&f, 1);
    cr_assert_eq(f.messages, 4, "reading did not resume below the shared cap");
    cr_assert_eq(rawclient_recv(f.peer, buf, sizeof(buf), &got), 1);
    close(got);
    for (int i = 0; i < 1000 && shared != 98; i++)
        run_ms(&f, 1);
    cr_assert_eq(shared, 98, "the read fd was not taken off the shared count");
    close(fd);
    fx_close(&f);
    cr_assert_eq(shared, 98, "a closed transport left its count behind");
}

/* A lease_many reply: up to TRANSPORT_MAX_FDS fds with one message, in order, each
 * counted in flight; more is refused; and the same through the queue. */
Test(transport, sends_many_fds_in_one_message)
{
    struct fx f;
    fx_open(&f, PROTO_MAX_REQUEST);
    int fds[TRANSPORT_MAX_FDS + 1];
    for (unsigned i = 0; i <= TRANSPORT_MAX_FDS; i++) {
        fds[i] = memfd_create("t", MFD_CLOEXEC);
        cr_assert_geq(fds[i], 0);
        cr_assert_eq(ftruncate(fds[i], 4096 * (i + 1)), 0);
    }
    cr_assert_eq(transport_send_fds(f.t, (const uint8_t *)"many", 4, fds, TRANSPORT_MAX_FDS + 1), -EINVAL);
    cr_assert_eq(transport_send_fds(f.t, (const uint8_t *)"many", 4, fds, TRANSPORT_MAX_FDS), 0);
    cr_assert_eq(transport_fds_unread(f.t), TRANSPORT_MAX_FDS);
    uint8_t buf[16];
    int got[64];
    unsigned n = 0;
    cr_assert_eq(rawclient_recv_fds(f.peer, buf, sizeof(buf), got, 64, &n, 1000), 4);
    cr_assert_eq(n, TRANSPORT_MAX_FDS, "%u fds came", n);
    for (unsigned i = 0; i < n; i++) {
        struct stat st;
        cr_assert_eq(fstat(got[i], &st), 0);
        cr_assert_eq(st.st_size, 4096 * (i + 1), "fd %u out of order", i);
        close(got[i]);
    }
    /* queued: the first reply waits behind a full socket buffer, the fds with it */
    static uint8_t big[60000];
    int r;
    unsigned sent = 0;
    while ((r = transport_send(f.t, big, sizeof(big), -1)) == 0 && sent < 10000) {
        sent++;
        if (transport_closing(f.t))
            break;
        int q = 0;
        ioctl(f.fd, SIOCOUTQ, &q);
        if (q > 100000)
            break;
    }
    cr_assert_eq(transport_send_fds(f.t, (const uint8_t *)"late", 4, fds, 3), 0);
    for (unsigned i = 0; i <= TRANSPORT_MAX_FDS; i++)
        close(fds[i]); /* the queue holds its own */
    unsigned seen = 0;
    for (int tries = 0; tries < 2000; tries++) {
        run(&f);
        ssize_t k;
        while ((k = rawclient_recv_fds(f.peer, big, sizeof(big), got, 64, &n, 0)) > 0) {
            if (k == 4) {
                cr_assert_eq(memcmp(big, "late", 4), 0);
                cr_assert_eq(n, 3);
                for (unsigned i = 0; i < n; i++) {
                    struct stat st;
                    cr_assert_eq(fstat(got[i], &st), 0);
                    cr_assert_eq(st.st_size, 4096 * (i + 1));
                    close(got[i]);
                }
                seen = 1;
            }
        }
        if (seen)
            break;
    }
    cr_assert(seen, "the queued reply with 3 fds never came");
    fx_close(&f);
}
