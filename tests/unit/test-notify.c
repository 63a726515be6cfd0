/* SPDX-License-Identifier: MIT */
/* test-notify.c: what shmrefd tells the service manager (daemon/notify.c), received on a
 * real NOTIFY_SOCKET datagram socket from a real server (pool under /dev/shm): READY=1
 * with STATUS=, watchdog pings at half the interval, RELOADING=1 then READY=1 around a
 * reload, STOPPING=1 with the timers closed (the loop closes cleanly). */
#include <criterion/criterion.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <uv.h>

#include "notify.h"
#include "server.h"

#define MiB (UINT64_C(1) << 20)

struct fx {
    uv_loop_t loop;
    char dir[64], pool[96], sock[96];
    int listener;
    struct options opt;
    struct server server;
    struct notify n;
};

static void fx_open(struct fx *f, const char *watchdog_usec)
{
    memset(f, 0, sizeof(*f));
    cr_assert_eq(uv_loop_init(&f->loop), 0);
    strcpy(f->dir, "/dev/shm/shmref-test-notify-XXXXXX");
    cr_assert_not_null(mkdtemp(f->dir));
    snprintf(f->pool, sizeof(f->pool), "%s/pool", f->dir);
    snprintf(f->sock, sizeof(f->sock), "%s/notify", f->dir);
    cr_assert_eq(mkdir(f->pool, 0700), 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    strcpy(sa.sun_path, f->sock);
    f->listener = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(f->listener, (struct sockaddr *)&sa, sizeof(sa)), 0);
    setenv("NOTIFY_SOCKET", f->sock, 1);
    if (watchdog_usec) {
        char pid[32];
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        setenv("WATCHDOG_USEC", watchdog_usec, 1);
        setenv("WATCHDOG_PID", pid, 1);
    }
    f->opt = (struct options){ .pool_dir = f->pool, .pool_size = 16 * MiB, .tenant_quota = 8 * MiB,
                               .max_lease_size = 16 * MiB, .max_leases = 4, .max_clients = 4 };
    cr_assert_eq(server_init(&f->server, &f->loop, &f->opt), 0);
}

static void fx_close(struct fx *f)
{
    server_stop(&f->server);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    server_free(&f->server);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&f->loop), 0, "a timer was left open");
    close(f->listener);
    unlink(f->sock);
    rmdir(f->pool);
    rmdir(f->dir);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
}

/* next: the next datagram within ms, into buf ("" if none). */
static const char *next(struct fx *f, char *buf, size_t cap, int ms)
{
    struct pollfd p = { .fd = f->listener, .events = POLLIN };
    buf[0] = '\0';
    if (poll(&p, 1, ms) > 0) {
        ssize_t n = recv(f->listener, buf, cap - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
    }
    return buf;
}

Test(notify, ready_reload_stopping)
{
    struct fx f;
    char m[512];
    fx_open(&f, NULL);
    notify_ready(&f.n, &f.loop, &f.server);
    next(&f, m, sizeof(m), 1000);
    cr_assert_eq(strncmp(m, "READY=1\nSTATUS=0 clients, ", 26), 0, "got: %s", m);
    cr_assert(strstr(m, "0 buffers live"), "got: %s", m);
    notify_reloading(&f.n);
    cr_assert_eq(strncmp(next(&f, m, sizeof(m), 1000), "RELOADING=1\nMONOTONIC_USEC=", 27), 0, "got: %s", m);
    notify_reloaded(&f.n);
    cr_assert_eq(strncmp(next(&f, m, sizeof(m), 1000), "STATUS=0 clients", 16), 0, "got: %s", m);
    cr_assert_str_eq(next(&f, m, sizeof(m), 1000), "READY=1");
    notify_stopping(&f.n);
    cr_assert_str_eq(next(&f, m, sizeof(m), 1000), "STOPPING=1");
    notify_stopping(&f.n); /* again: the timers are closed once */
    fx_close(&f);
}

Test(notify, watchdog_pings_at_half_the_interval)
{
    struct fx f;
    char m[512];
    fx_open(&f, "100000"); /* 100 ms: a ping every 50 ms */
    notify_ready(&f.n, &f.loop, &f.server);
    next(&f, m, sizeof(m), 1000); /* READY=1 */
    cr_assert_str_eq(next(&f, m, sizeof(m), 1000), "WATCHDOG=1", "the first ping comes at once");
    unsigned pings = 0;
    for (int i = 0; i < 40 && pings < 2; i++) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        if (strcmp(next(&f, m, sizeof(m), 10), "WATCHDOG=1") == 0)
            pings++;
    }
    cr_assert_geq(pings, 2, "no watchdog pings from the loop");
    notify_stopping(&f.n);
    fx_close(&f);
}

Test(notify, outside_systemd_nothing_happens)
{
    struct fx f;
    fx_open(&f, NULL);
    unsetenv("NOTIFY_SOCKET");
    notify_ready(&f.n, &f.loop, &f.server);
    notify_reloading(&f.n);
    notify_reloaded(&f.n);
    notify_stopping(&f.n);
    char m[64];
    cr_assert_str_empty(next(&f, m, sizeof(m), 50));
    fx_close(&f);
}
