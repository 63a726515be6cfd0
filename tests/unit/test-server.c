/* SPDX-License-Identifier: MIT */
/* test-server.c: the listener (daemon/server.c) on a real socket path and a real loop:
 * a stale socket file is replaced, a live daemon's is refused, a client is accepted and
 * served (hello, status through the sessions' callback), --max-clients refuses with the
 * numbers, and a stop closes every session with the loop closing cleanly. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <msgpack.h>
#include <uv.h>

#include "rawclient.h"
#include "server.h"

#define MiB (UINT64_C(1) << 20)

struct fx {
    uv_loop_t loop;
    char dir[64], pool[96], sock[96];
    struct options opt;
    struct server server;
};

static void fx_open(struct fx *f, uint32_t max_clients)
{
    memset(f, 0, sizeof(*f));
    cr_assert_eq(uv_loop_init(&f->loop), 0);
    strcpy(f->dir, "/dev/shm/shmref-test-server-XXXXXX");
    cr_assert_not_null(mkdtemp(f->dir));
    snprintf(f->pool, sizeof(f->pool), "%s/pool", f->dir);
    snprintf(f->sock, sizeof(f->sock), "%s/s.sock", f->dir);
    cr_assert_eq(mkdir(f->pool, 0700), 0);
    f->opt = (struct options){ .socket_path = f->sock, .socket_mode = 0660, .pool_dir = f->pool,
                               .pool_size = 16 * MiB, .tenant_quota = 8 * MiB, .max_lease_size = 16 * MiB,
                               .max_leases = 4, .max_clients = max_clients };
    cr_assert_eq(server_init(&f->server, &f->loop, &f->opt), 0);
}

static void fx_close(struct fx *f)
{
    server_stop(&f->server);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    cr_assert_eq(f->server.sessions.n, 0);
    server_free(&f->server);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&f->loop), 0, "a handle leaked");
    unlink(f->sock);
    rmdir(f->pool);
    rmdir(f->dir);
}

/* call: a request on a raw connection, the loop run until its reply. */
static struct proto_msg call(struct fx *f, int fd, const struct proto_msg *m, uint8_t *rep, size_t cap)
{
    uint8_t buf[256];
    int len = proto_encode(m, buf, sizeof(buf));
    cr_assert_eq(rawclient_send(fd, buf, (size_t)len), 0);
    for (int i = 0; i < 5000; i++) {
        uv_run(&f->loop, UV_RUN_NOWAIT);
        ssize_t n = rawclient_recv(fd, rep, cap, NULL);
        if (n > 0) {
            struct proto_msg r;
            const char *why;
            cr_assert_eq(proto_decode(rep, (size_t)n, cap, &r, &why), 0, "%s", why);
            return r;
        }
        cr_assert(n == -EAGAIN, "connection closed (%zd)", n);
        usleep(1000);
    }
    cr_assert_fail("no reply");
    return (struct proto_msg){ 0 };
}

static void hello(struct fx *f, int fd)
{
    uint8_t rep[512];
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 };
    m.u.hello.version = PROTO_VERSION;
    struct proto_msg r = call(f, fd, &m, rep, sizeof(rep));
    cr_assert_eq(r.op, PROTO_OP_HELLO + PROTO_OP_REPLY);
}

Test(server, listens_serves_and_stops)
{
    struct fx f;
    static uint8_t rep[PROTO_MAX_REPLY];
    fx_open(&f, 4);
    /* a stale socket file (nobody listening) is replaced */
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    strcpy(sa.sun_path, f.sock);
    int stale = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    cr_assert_eq(bind(stale, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(stale);
    cr_assert_eq(server_listen_path(&f.server), 0);
    struct stat st;
    cr_assert_eq(stat(f.sock, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0660);

    /* a second server on the same path finds a live one */
    struct server other;
    cr_assert_eq(server_init(&other, &f.loop, &f.opt), 0);
    cr_assert_eq(server_listen_path(&other), -EADDRINUSE);
    server_stop(&other);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    server_free(&other);

    int fd = rawclient_connect(f.sock);
    cr_assert_geq(fd, 0);
    hello(&f, fd);
    cr_assert_eq(f.server.sessions.n, 1);
    cr_assert_eq(f.server.counters.connections, 2, "the other server's liveness probe, then us");
    struct proto_msg m = { .op = PROTO_OP_STATUS, .id = 2 };
    struct proto_msg r = call(&f, fd, &m, rep, sizeof(rep));
    cr_assert_eq(r.op, PROTO_OP_STATUS + PROTO_OP_REPLY);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    cr_assert_eq(msgpack_unpack_next(&up, (const char *)r.u.status_reply.body, r.u.status_reply.body_len, NULL),
                 MSGPACK_UNPACK_SUCCESS);
    cr_assert_eq(up.data.type, MSGPACK_OBJECT_MAP);
    cr_assert_eq(up.data.via.map.size, 10);
    msgpack_unpacked_destroy(&up);

    server_stop(&f.server);
    uv_run(&f.loop, UV_RUN_DEFAULT);
    cr_assert(rawclient_closed(fd, 1000), "a session outlived the stop");
    close(fd);
    fx_close(&f);
}

Test(server, max_clients_refuses_with_the_numbers)
{
    struct fx f;
    uint8_t rep[1024];
    fx_open(&f, 1);
    cr_assert_eq(server_listen_path(&f.server), 0);
    int a = rawclient_connect(f.sock), more[SERVER_RESERVED_SLOTS];
    hello(&f, a);
    /* the test runs as root: root has SERVER_RESERVED_SLOTS more */
    for (int i = 0; i < SERVER_RESERVED_SLOTS; i++) {
        more[i] = rawclient_connect(f.sock);
        hello(&f, more[i]);
    }
    int b = rawclient_connect(f.sock);
    ssize_t n = -EAGAIN;
    for (int i = 0; i < 5000 && n == -EAGAIN; i++) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        n = rawclient_recv(b, rep, sizeof(rep), NULL);
        if (n == -EAGAIN)
            usleep(1000);
    }
    struct proto_msg r;
    const char *why;
    cr_assert_gt(n, 0);
    cr_assert_eq(proto_decode(rep, (size_t)n, sizeof(rep), &r, &why), 0);
    cr_assert_eq(r.u.error.code, EUSERS);
    cr_assert(memmem(r.u.error.msg, r.u.error.msg_len, "9 connected, limit 1", 20), "%.*s",
              (int)r.u.error.msg_len, r.u.error.msg);
    cr_assert_eq(f.server.counters.refused_limit, 1);
    close(b);
    for (int i = 0; i < SERVER_RESERVED_SLOTS; i++)
        close(more[i]);
    close(a);
    fx_close(&f);
}
