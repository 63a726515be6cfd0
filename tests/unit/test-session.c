/* SPDX-License-Identifier: MIT */
/* test-session.c: one client's conversation (daemon/session.c) over a real socketpair,
 * with the real broker, pool (under /dev/shm), quota and registry on a real libuv loop:
 * hello first, features, fds sent once with FD_ONCE until forgotten, status through the
 * server's callback, and teardown at a safe point: a session being closed, or whose
 * reply could not be sent, keeps its handles until the loop releases them. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "core-fixture.h"
#include "rawclient.h"
#include "session.h"

#define MiB (UINT64_C(1) << 20)

struct fx {
    uv_loop_t loop;
    struct core core;
    struct options opt;
    struct counters counters;
    struct broker bk;
    struct session_env env;
    struct session *s;
    int peer;
    unsigned status_calls;
};

static int fake_status(void *arg, uint32_t uid, uint8_t *buf, size_t cap)
{
    struct fx *f = arg;
    (void)uid;
    f->status_calls++;
    cr_assert_geq(cap, 1);
    buf[0] = 0x80; /* an empty msgpack map */
    return 1;
}

static void fx_open(struct fx *f)
{
    int sv[2];
    memset(f, 0, sizeof(*f));
    signal(SIGPIPE, SIG_IGN);
    core_open(&f->core, &f->loop, "session", 64 * MiB, 16 * MiB);
    f->opt.max_lease_size = 32 * MiB;
    f->opt.max_leases = 4;
    f->bk = (struct broker){ .opt = &f->opt, .pool = f->core.pool, .quota = f->core.quota, .reg = f->core.reg,
                             .counters = &f->counters };
    f->env = (struct session_env){ .loop = &f->loop, .opt = &f->opt, .broker = &f->bk,
                                   .counters = &f->counters, .status = fake_status, .status_arg = f };
    cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    f->peer = sv[1];
    struct ucred cred = { .pid = getpid(), .uid = 1000, .gid = 1000 };
    cr_assert_eq(session_new(&f->env, sv[0], &cred, &f->s), 0);
    cr_assert_eq(f->env.n, 1);
}

static void run(struct fx *f)
{
    for (int i = 0; i < 20; i++) {
        uv_run(&f->loop, UV_RUN_NOWAIT);
        usleep(500);
    }
}

static void fx_close(struct fx *f)
{
    session_close_all(&f->env);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    cr_assert_eq(f->env.n, 0, "a session outlived the loop");
    cr_assert_null(f->env.head);
    cr_assert_eq(quota_total(f->bk.quota), 0);
    core_close(&f->core, &f->loop);
    if (f->peer >= 0)
        close(f->peer);
}

/* exchange: send m, run the loop until a reply comes (its fd, or -1, in *ret_fd if not
 * NULL; else closed); 0 when the session closed the connection. */
static ssize_t exchange_raw(struct fx *f, const void *msg, size_t len, uint8_t *rep, size_t cap, int *ret_fd)
{
    cr_assert_eq(rawclient_send(f->peer, msg, len), 0);
    for (int i = 0; i < 5000; i++) {
        uv_run(&f->loop, UV_RUN_NOWAIT);
        ssize_t n = rawclient_recv(f->peer, rep, cap, ret_fd);
        if (n != -EAGAIN)
            return n;
        usleep(1000);
    }
    cr_assert_fail("no reply within 5 s");
    return -ETIMEDOUT;
}

static struct proto_msg exchange(struct fx *f, const struct proto_msg *m, uint8_t *rep, size_t cap, int *ret_fd)
{
    uint8_t buf[512];
    int len = proto_encode(m, buf, sizeof(buf));
    cr_assert_gt(len, 0);
    ssize_t n = exchange_raw(f, buf, (size_t)len, rep, cap, ret_fd);
    cr_assert_gt(n, 0, "the session closed the connection");
    struct proto_msg r;
    const char *why;
    cr_assert_eq(proto_decode(rep, (size_t)n, PROTO_MAX_REPLY, &r, &why), 0, "%s", why);
    return r;
}

static void hello(struct fx *f, uint64_t features)
{
    uint8_t rep[512];
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 };
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.features = features;
    m.u.hello.name = "test\n";
    m.u.hello.name_len = 5;
    struct proto_msg r = exchange(f, &m, rep, sizeof(rep), NULL);
    cr_assert_eq(r.op, PROTO_OP_HELLO + PROTO_OP_REPLY);
    cr_assert_eq(r.u.hello_reply.max_leases, 4);
    cr_assert_eq(r.u.hello_reply.max_lease, 32 * MiB);
    cr_assert(r.u.hello_reply.features & PROTO_FEAT_NOREPLY_RELEASE);
    cr_assert_eq((r.u.hello_reply.features & PROTO_FEAT_FD_ONCE) != 0, (features & PROTO_FEAT_FD_ONCE) != 0);
    cr_assert_str_eq(f->s->name, "test", "a control character in the name stays out of log lines");
}

/* lease: returns the handle; the buffer id in *ret_id; whether an fd came in *ret_fd_came. */
static uint64_t lease(struct fx *f, uint64_t size, uint64_t *ret_id, bool *ret_fd_came)
{
    uint8_t rep[512];
    int fd = -1;
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 2 };
    m.u.lease.size = size;
    struct proto_msg r = exchange(f, &m, rep, sizeof(rep), &fd);
    cr_assert_eq(r.op, PROTO_OP_LEASE + PROTO_OP_REPLY, "lease refused: %.*s", (int)r.u.error.msg_len,
                 r.u.error.msg);
    *ret_id = r.u.lease_reply.buf_id;
    *ret_fd_came = fd >= 0;
    if (fd >= 0)
        close(fd);
    return r.u.lease_reply.handle;
}

static void release(struct fx *f, uint64_t handle)
{
    uint8_t rep[512];
    struct proto_msg m = { .op = PROTO_OP_RELEASE, .id = 3 };
    m.u.release.handle = handle;
    struct proto_msg r = exchange(f, &m, rep, sizeof(rep), NULL);
    cr_assert_eq(r.op, PROTO_OP_RELEASE + PROTO_OP_REPLY);
}

static void expect_error_then_closed(struct fx *f, const void *msg, size_t len, int code, const char *text)
{
    uint8_t rep[1024];
    ssize_t n = exchange_raw(f, msg, len, rep, sizeof(rep), NULL);
    struct proto_msg r;
    const char *why;
    cr_assert_gt(n, 0);
    cr_assert_eq(proto_decode(rep, (size_t)n, sizeof(rep), &r, &why), 0);
    cr_assert_eq(r.op, PROTO_OP_ERROR);
    cr_assert_eq(r.u.error.code, code, "code %d: %.*s", r.u.error.code, (int)r.u.error.msg_len, r.u.error.msg);
    cr_assert(memmem(r.u.error.msg, r.u.error.msg_len, text, strlen(text)), "%.*s", (int)r.u.error.msg_len,
              r.u.error.msg);
    run(f);
    cr_assert(rawclient_closed(f->peer, 1000), "the connection stayed open");
    cr_assert_eq(f->env.n, 0);
}

Test(session, hello_then_requests)
{
    struct fx f;
    uint8_t rep[512];
    fx_open(&f);
    hello(&f, PROTO_FEAT_FD_ONCE);
    struct proto_msg ping = { .op = PROTO_OP_PING, .id = 9 };
    struct proto_msg r = exchange(&f, &ping, rep, sizeof(rep), NULL);
    cr_assert_eq(r.op, PROTO_OP_PING + PROTO_OP_REPLY);
    cr_assert_eq(r.id, 9);
    struct proto_msg st = { .op = PROTO_OP_STATUS, .id = 10 };
    r = exchange(&f, &st, rep, sizeof(rep), NULL);
    cr_assert_eq(r.op, PROTO_OP_STATUS + PROTO_OP_REPLY);
    cr_assert_eq(r.u.status_reply.body_len, 1);
    cr_assert_eq(f.status_calls, 1);
    /* a well-formed request with an op nobody knows: refused, the session stays */
    const uint8_t unknown[] = { 0x92, 50, 12 }; /* [50, 12] */
    ssize_t n = exchange_raw(&f, unknown, sizeof(unknown), rep, sizeof(rep), NULL);
    const char *why;
    cr_assert_eq(proto_decode(rep, (size_t)n, sizeof(rep), &r, &why), 0);
    cr_assert_eq(r.u.error.code, EOPNOTSUPP);
    cr_assert_eq(r.id, 12);
    r = exchange(&f, &ping, rep, sizeof(rep), NULL);
    cr_assert_eq(r.op, PROTO_OP_PING + PROTO_OP_REPLY);
    cr_assert_eq(f.counters.protocol_errors, 0);
    fx_close(&f);
}

Test(session, a_second_hello_closes)
{
    struct fx f;
    uint8_t rep[512];
    fx_open(&f);
    hello(&f, 0);
    struct proto_msg again = { .op = PROTO_OP_HELLO, .id = 11 };
    again.u.hello.version = PROTO_VERSION;
    struct proto_msg r = exchange(&f, &again, rep, sizeof(rep), NULL);
    cr_assert_eq(r.op, PROTO_OP_ERROR, "a second hello is an error");
    cr_assert_eq(r.u.error.code, EPROTO);
    cr_assert_eq(r.id, 11);
    for (int i = 0; i < 50 && f.env.n; i++)
        uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(f.env.n, 0, "the connection stays after a second hello");
    cr_assert(rawclient_closed(f.peer, 1000), "the peer sees no EOF");
    cr_assert_eq(f.counters.protocol_errors, 1);
    fx_close(&f);
}

Test(session, idle_connection_holding_nothing_is_closed)
{
    struct fx f;
    uint8_t rep[512];
    fx_open(&f);
    hello(&f, 0);
    uint64_t id;
    bool came;
    uint64_t h = lease(&f, 4096, &id, &came);
    session_expire_idle(&f.env, uv_now(&f.loop) + 60000, 1000);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(f.env.n, 1, "a session holding a lease idled out");
    struct proto_msg rel = { .op = PROTO_OP_RELEASE, .id = 3 };
    rel.u.release.handle = h;
    struct proto_msg r = exchange(&f, &rel, rep, sizeof(rep), NULL);
    cr_assert_eq(r.op, PROTO_OP_RELEASE + PROTO_OP_REPLY);
    uint64_t base = f.s->last_ms;
    session_expire_idle(&f.env, base + 500, 1000);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(f.env.n, 1, "closed before the idle time");
    session_expire_idle(&f.env, base + 1000, 0);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(f.env.n, 1, "0 disables the idle limit");
    session_expire_idle(&f.env, base + 1000, 1000);
    ssize_t n = -EAGAIN;
    for (int i = 0; i < 1000 && n == -EAGAIN; i++) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        n = rawclient_recv(f.peer, rep, sizeof(rep), NULL);
    }
    const char *why;
    cr_assert_gt(n, 0);
    cr_assert_eq(proto_decode(rep, (size_t)n, sizeof(rep), &r, &why), 0);
    cr_assert_eq(r.u.error.code, ETIMEDOUT);
    cr_assert(memmem(r.u.error.msg, r.u.error.msg_len, "idle", 4));
    for (int i = 0; i < 50 && f.env.n; i++)
        uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(f.env.n, 0, "an idle session holding nothing stays");
    fx_close(&f);
}

Test(session, the_first_message_must_be_hello)
{
    struct fx f;
    uint8_t buf[64];
    fx_open(&f);
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 5 };
    m.u.lease.size = 4096;
    int len = proto_encode(&m, buf, sizeof(buf));
    expect_error_then_closed(&f, buf, (size_t)len, EPROTO, "the first message must be hello");
    cr_assert_eq(f.counters.protocol_errors, 1);
    cr_assert_eq(f.counters.leases, 0);
    fx_close(&f);
}

Test(session, another_version_is_refused)
{
    struct fx f;
    uint8_t buf[64];
    fx_open(&f);
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 };
    m.u.hello.version = PROTO_VERSION + 1;
    int len = proto_encode(&m, buf, sizeof(buf));
    expect_error_then_closed(&f, buf, (size_t)len, EPROTONOSUPPORT, "speaks version");
    cr_assert_eq(f.counters.protocol_errors, 1);
    fx_close(&f);
}

Test(session, garbage_is_a_protocol_error)
{
    struct fx f;
    fx_open(&f);
    hello(&f, 0);
    const uint8_t junk[] = { 0xc1, 0xc1, 0xc1 };
    expect_error_then_closed(&f, junk, sizeof(junk), EPROTO, "protocol error");
    cr_assert_eq(f.counters.protocol_errors, 1);
    fx_close(&f);
}

Test(session, no_hello_in_time_is_closed)
{
    struct fx f;
    uint8_t rep[512];
    fx_open(&f);
    session_expire_hello(&f.env, f.s->accepted_ms + SESSION_HELLO_MS - 1);
    cr_assert_eq(f.counters.protocol_errors, 0, "closed before its time");
    session_expire_hello(&f.env, f.s->accepted_ms + SESSION_HELLO_MS);
    cr_assert_eq(f.counters.protocol_errors, 1);
    cr_assert_eq(f.env.n, 1, "released inside session_expire_hello");
    run(&f);
    ssize_t n = rawclient_recv(f.peer, rep, sizeof(rep), NULL);
    struct proto_msg r;
    const char *why;
    cr_assert_gt(n, 0);
    cr_assert_eq(proto_decode(rep, (size_t)n, sizeof(rep), &r, &why), 0);
    cr_assert_eq(r.u.error.code, ETIMEDOUT);
    cr_assert_eq(f.env.n, 0);
    fx_close(&f);
}

/* With FD_ONCE, a buffer's fd goes once per connection until the client forgets it. */
Test(session, fd_once_until_forgotten)
{
    struct fx f;
    uint64_t id, id2;
    bool came;
    fx_open(&f);
    hello(&f, PROTO_FEAT_FD_ONCE);
    uint64_t h = lease(&f, 4096, &id, &came);
    cr_assert(came, "the first lease of a buffer carries its fd");
    release(&f, h);
    h = lease(&f, 4096, &id2, &came);
    cr_assert_eq(id2, id, "not the warm buffer");
    cr_assert_not(came, "an fd the client has was sent again");
    release(&f, h);
    struct proto_msg forget = { .op = PROTO_OP_FORGET, .id = 4 };
    forget.u.forget.buf_id = id;
    forget.u.forget.writable = 1;
    uint8_t buf[64];
    int len = proto_encode(&forget, buf, sizeof(buf));
    cr_assert_eq(rawclient_send(f.peer, buf, (size_t)len), 0);
    h = lease(&f, 4096, &id2, &came);
    cr_assert_eq(id2, id);
    cr_assert(came, "a forgotten buffer's fd was not sent again");
    release(&f, h);
    fx_close(&f);
}

Test(session, without_fd_once_every_reply_carries_the_fd)
{
    struct fx f;
    uint64_t id, id2;
    bool came;
    fx_open(&f);
    hello(&f, 0);
    uint64_t h = lease(&f, 4096, &id, &came);
    cr_assert(came);
    release(&f, h);
    h = lease(&f, 4096, &id2, &came);
    cr_assert_eq(id2, id);
    cr_assert(came);
    release(&f, h);
    fx_close(&f);
}

/* session_close only marks: the handles stay until the loop runs the disconnect. */
Test(session, close_releases_at_the_loop)
{
    struct fx f;
    uint64_t id;
    bool came;
    fx_open(&f);
    hello(&f, 0);
    lease(&f, 4096, &id, &came);
    lease(&f, 8192, &id, &came);
    session_close(f.s, "test says so");
    cr_assert_eq(f.s->peer.holder.leases, 2, "released inside session_close");
    cr_assert_eq(f.env.n, 1);
    cr_assert_neq(quota_total(f.bk.quota), 0);
    run(&f);
    cr_assert_eq(f.env.n, 0);
    cr_assert_eq(quota_total(f.bk.quota), 0);
    cr_assert_eq(f.counters.reclaimed_leases, 2);
    cr_assert_eq(f.counters.reclaimed_clients, 1);
    cr_assert(rawclient_closed(f.peer, 1000));
    fx_close(&f);
}

/* The peer leaves right after asking for a lease: the reply's send fails inside the
 * broker's call, which must not free the session under it (ASan would see it); the
 * lease is granted, then reclaimed at the loop. */
Test(session, failed_reply_send_is_safe)
{
    struct fx f;
    uint8_t buf[64];
    uint64_t id;
    bool came;
    fx_open(&f);
    hello(&f, 0);
    release(&f, lease(&f, 4096, &id, &came)); /* now warm: the next lease replies at once */
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 6 };
    m.u.lease.size = 4096;
    int len = proto_encode(&m, buf, sizeof(buf));
    cr_assert_eq(rawclient_send(f.peer, buf, (size_t)len), 0);
    cr_assert_eq(rawclient_send(f.peer, buf, (size_t)len), 0);
    close(f.peer);
    f.peer = -1;
    for (int i = 0; i < 2000 && f.env.n; i++) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    cr_assert_eq(f.env.n, 0);
    cr_assert_geq(f.counters.leases, 2, "the lease after the peer left was not granted");
    cr_assert_eq(f.counters.reclaimed_leases, f.counters.leases - 1);
    cr_assert_eq(registry_stats(f.bk.reg).buffers, 0);
    fx_close(&f);
}

Test(session, count_open_skips_closing_sessions)
{
    struct fx f;
    fx_open(&f);
    cr_assert_eq(session_count_open(&f.env), 1);
    session_close(f.s, NULL);
    cr_assert_eq(session_count_open(&f.env), 0);
    cr_assert_eq(f.env.n, 1);
    fx_close(&f);
}
