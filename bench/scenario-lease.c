/* SPDX-License-Identifier: MIT */
/* scenario-lease.c: latency of one shmrefd operation against a bare SOCK_SEQPACKET
 * round trip of 32 bytes (to an echo process, with and without an fd attached, since a
 * lease reply carries one). A cycle is lease, publish, acquire (on a second connection,
 * as a consumer would), release of both; each step is timed on its own. 4 KiB buffers,
 * recycled warm: this is the daemon's and the library's cost, not page allocation.
 *
 * On a 2-vCPU VM a round trip costs about twice as much when the peers run on different
 * CPUs (a cross-CPU wake-up) as on the same one, and unpinned processes land either way,
 * so every kind is measured three ways: unpinned, all on one CPU, and client on one CPU
 * with the servers (echo and shmrefd alike) on the other. Blocks of each kind and
 * placement are interleaved, so drift on a noisy machine hits all of them alike. */
#include "bench.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEASE_SIZE 4096

enum { K_RT, K_RTFD, K_PING, K_LEASE, K_PUBLISH, K_ACQUIRE, K_RELEASE, K_CYCLE, K_N };
static const char *const names[K_N] = {
    "seqpacket-rt", "seqpacket-rt+fd", "ping", "lease", "publish", "acquire", "release", "lease-cycle",
};
enum { PL_FREE, PL_SAME, PL_CROSS, PL_N };
static const char *const placements[PL_N] = { "unpinned", "same cpu", "cross cpu" };

struct lease_ctx {
    int echo, echo_fd;                /* control sockets of the two echo servers */
    pid_t echo_pid[2], daemon_pid;
    shmref_conn *prod, *cons;
    bool full;
    int nplace;                       /* PL_N, or 2 on a single CPU (no cross) */
    size_t bad;
    char err[160];
    struct samples s[PL_N][K_N];
    struct samples *cur;              /* s[placement being measured] */
};

/* echo_rt: one 32-byte message there and back; an fd that comes back is closed. */
static int echo_rt(int fd)
{
    char msg[32] = "shmref-bench echo", back[64];
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = { .iov_base = back, .iov_len = sizeof(back) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                         .msg_controllen = sizeof(ctl.b) };
    if (send(fd, msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t)sizeof(msg))
        return -errno;
    ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    if (n != (ssize_t)sizeof(msg))
        return n < 0 ? -errno : -EPROTO;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    if (cm && cm->cmsg_type == SCM_RIGHTS) {
        int got;
        memcpy(&got, CMSG_DATA(cm), sizeof(got));
        close(got);
    }
    return 0;
}

static int timed_echo(struct lease_ctx *c, int fd, int kind, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        uint64_t t0 = stats_now_ns();
        int r = echo_rt(fd);
        if (r < 0)
            return r;
        samples_add(&c->cur[kind], (double)(stats_now_ns() - t0) / 1e6);
    }
    return 0;
}

static int timed_ping(struct lease_ctx *c, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        uint64_t t0 = stats_now_ns();
        int r = shmref_ping(c->prod);
        if (r < 0)
            return r;
        samples_add(&c->cur[K_PING], (double)(stats_now_ns() - t0) / 1e6);
    }
    return 0;
}

/* lap: adds the time since *t to kind's samples and restarts *t; returns the lap. */
static double lap(struct lease_ctx *c, int kind, uint64_t *t)
{
    uint64_t now = stats_now_ns();
    double ms = (double)(now - *t) / 1e6;
    samples_add(&c->cur[kind], ms);
    *t = now;
    return ms;
}

static int fail(struct lease_ctx *c, shmref_conn *conn, int r, const char *what)
{
    snprintf(c->err, sizeof(c->err), "%s: %s: %s", what, strerror(-r), shmref_errmsg(conn));
    return r;
}

/* one_cycle: lease, publish, acquire, release, release; iter marks the bytes (smoke). */
static int one_cycle(struct lease_ctx *c, uint64_t iter)
{
    shmref_buf *b, *a;
    shmref_desc d;
    uint64_t t = stats_now_ns();
    double total = 0;
    int r = shmref_lease(c->prod, LEASE_SIZE, &b);
    if (r < 0)
        return fail(c, c->prod, r, "lease");
    total += lap(c, K_LEASE, &t);
    if (c->full)
        payload_fill(shmref_buf_data(b), LEASE_SIZE, iter);
    t = stats_now_ns();
    if ((r = shmref_publish(b, LEASE_SIZE, 0, NULL, 0, &d)) < 0)
        return fail(c, c->prod, r, "publish");
    total += lap(c, K_PUBLISH, &t);
    if ((r = shmref_acquire(c->cons, &d, &a)) < 0)
        return fail(c, c->cons, r, "acquire");
    total += lap(c, K_ACQUIRE, &t);
    if (c->full) {
        c->bad += payload_check_input(shmref_buf_data(a), LEASE_SIZE, iter);
        t = stats_now_ns();
    }
    if ((r = shmref_release(a)) < 0)
        return fail(c, c->cons, r, "release");
    total += lap(c, K_RELEASE, &t);
    if ((r = shmref_release(b)) < 0)
        return fail(c, c->prod, r, "release");
    total += lap(c, K_RELEASE, &t);
    samples_add(&c->cur[K_CYCLE], total);
    return 0;
}

/* place: the runner on CPU 0, the servers on CPU 0, 1, or anywhere. */
static void place(struct lease_ctx *c, int pl)
{
    int mine = pl == PL_FREE ? -1 : 0, theirs = pl == PL_FREE ? -1 : pl == PL_SAME ? 0 : 1;
    wire_pin(0, mine);
    wire_pin(c->echo_pid[0], theirs);
    wire_pin(c->echo_pid[1], theirs);
    wire_pin(c->daemon_pid, theirs);
    c->cur = c->s[pl];
}

/* block: k of each bare round trip and ping, k/2 cycles, in placement pl. */
static int block(struct lease_ctx *c, int pl, unsigned k, uint64_t *iter)
{
    place(c, pl);
    int r = timed_echo(c, c->echo, K_RT, k);
    if (r == 0)
        r = timed_echo(c, c->echo_fd, K_RTFD, k);
    if (r == 0)
        r = timed_ping(c, k);
    for (unsigned i = 0; r == 0 && i < (k + 1) / 2; i++)
        r = one_cycle(c, ++*iter);
    if (r < 0 && !c->err[0])
        snprintf(c->err, sizeof(c->err), "%s", strerror(-r));
    return r;
}

static void record_one(struct lease_ctx *c, int pl, int k, struct result **base, int r)
{
    bool daemon = k >= K_PING;
    struct result *res = report_add("lease", names[k], daemon ? "dev-shm" : "",
                                    k < K_PING ? 32 : k == K_PING ? 0 : LEASE_SIZE, placements[pl]);
    report_fill(res, &c->s[pl][k]);
    if (r < 0)
        snprintf(res->error, sizeof(res->error), "%s", c->err);
    else if (c->bad)
        snprintf(res->error, sizeof(res->error), "%zu wrong words acquired", c->bad);
    if (k == K_RT)
        *base = res;
    else
        report_ratio(res, *base);
    if (k == K_LEASE || k == K_CYCLE || k == K_ACQUIRE) {
        double fd = samples_quantile(&c->s[pl][K_RTFD], 0.5);
        if (fd > 0)
            snprintf(res->note, sizeof(res->note), "%.2fx seqpacket-rt+fd", res->median_ms / fd);
    }
}

static int setup(struct lease_ctx *c, const struct daemons *ds)
{
    int r = wire_spawn("echo", SOCK_SEQPACKET, NULL, &c->echo, &c->echo_pid[0]);
    if (r == 0)
        r = wire_spawn("echo-fd", SOCK_SEQPACKET, NULL, &c->echo_fd, &c->echo_pid[1]);
    if (r == 0 && (r = shmref_connect(ds->d[POOL_DEVSHM].socket, &c->prod)) == 0)
        r = shmref_connect(ds->d[POOL_DEVSHM].socket, &c->cons);
    if (r < 0)
        snprintf(c->err, sizeof(c->err), "setup: %s", strerror(-r));
    c->daemon_pid = ds->d[POOL_DEVSHM].pid;
    c->nplace = sysconf(_SC_NPROCESSORS_ONLN) > 1 ? PL_N : PL_CROSS;
    return r;
}

static int measure(struct lease_ctx *c, unsigned blocks, unsigned k, unsigned warm)
{
    uint64_t iter = 1000000000;
    int r = 0;
    for (int pl = 0; r == 0 && pl < c->nplace; pl++)
        r = block(c, pl, warm, &iter);
    for (int pl = 0; pl < PL_N; pl++)
        for (int i = 0; i < K_N; i++)
            c->s[pl][i].n = 0; /* that was the warm-up */
    for (unsigned b = 0; r == 0 && b < blocks; b++)
        for (int pl = 0; r == 0 && pl < c->nplace; pl++)
            r = block(c, pl, k, &iter);
    place(c, PL_FREE);
    return r;
}

int scenario_lease(const struct bench_opts *o, const struct daemons *ds)
{
    struct lease_ctx c = { .echo = -1, .echo_fd = -1, .full = o->smoke };
    unsigned blocks = o->smoke ? 2 : 10, k = o->smoke ? 20 : 1000;
    fprintf(stderr, "shmref-bench: lease latency ...\n");
    for (int pl = 0; pl < PL_N; pl++)
        for (int i = 0; i < K_N; i++)
            samples_init(&c.s[pl][i], (size_t)blocks * k * (i == K_RELEASE ? 2 : 1));
    int r = setup(&c, ds);
    if (r == 0)
        r = measure(&c, blocks, k, o->smoke ? 5 : 200);
    shmref_close(c.prod);
    shmref_close(c.cons);
    wire_reap(c.echo, c.echo_pid[0]);
    wire_reap(c.echo_fd, c.echo_pid[1]);
    for (int pl = 0; pl < c.nplace; pl++) {
        struct result *base = NULL;
        for (int k2 = 0; k2 < K_N; k2++)
            record_one(&c, pl, k2, &base, r);
    }
    for (int pl = 0; pl < PL_N; pl++)
        for (int i = 0; i < K_N; i++)
            samples_free(&c.s[pl][i]);
    return r;
}

/* ---- lease_many at 1,024 and a SIGKILLed unread client (no timer cliffs) ----------------
 * A lease_many of 1,024 is 32 requests of 32 leases: more replies (one fd each) than the
 * daemon sends to a connection with 64 fds unread, so it pauses and must resume as soon as
 * the client has read them; 4 calls of 256 (8 requests each) are the baseline. Each call
 * is made on a quiet connection (300 ms after the last), as a user makes one, warm: the
 * 1,024 buffers of the class exist and are mapped. A client that sent 200 leases and
 * reads none (the daemon paused at its cap) is SIGKILLed: the time until its leases are
 * back, polled with status every 0.5 ms. */

#define MANY 1024

static uint64_t status_of(shmref_conn *conn, const char *path)
{
    shmref_status *st;
    uint64_t v = UINT64_MAX;
    if (shmref_status_get(conn, &st) == 0) {
        shmref_status_u64(st, path, &v);
        shmref_status_free(st);
    }
    return v;
}

static int lease_many_timed(shmref_conn *c, shmref_buf **bufs, size_t n, size_t each, double *ms)
{
    static size_t sizes[MANY];
    for (size_t i = 0; i < n; i++)
        sizes[i] = LEASE_SIZE;
    uint64_t t0 = stats_now_ns();
    for (size_t k = 0; k < n; k += each) {
        int r = shmref_lease_many(c, sizes, each, bufs + k);
        if (r < 0) {
            shmref_release_many(bufs, k);
            return r;
        }
    }
    *ms = (double)(stats_now_ns() - t0) / 1e6;
    return shmref_release_many(bufs, n);
}

/* unread_leaser: a forked client: 200 leases sent, no reply read; tells the parent, waits
 * for its SIGKILL. */
static void unread_leaser(const char *socket, int tell)
{
    shmref_conn *c;
    if (shmref_connect(socket, &c) < 0 || shmref_set_stock(c, 0) < 0)
        _exit(1);
    for (int i = 0; i < 200; i++)
        if (shmref_lease_submit(c, LEASE_SIZE, 0, 0, NULL) < 0)
            _exit(2);
    int r;
    while ((r = shmref_flush(c)) == 1) {
        struct pollfd p = { .fd = shmref_conn_fd(c), .events = POLLOUT };
        poll(&p, 1, 100);
    }
    if (r < 0 || write(tell, "s", 1) != 1)
        _exit(3);
    for (;;)
        pause();
}

/* one_kill: the time from SIGKILL until the daemon's leases are back to base, ms. */
static int one_kill(shmref_conn *c, const char *socket, double *ms, char *err, size_t cap)
{
    uint64_t base = status_of(c, "buffers.leases");
    int p[2];
    if (base == UINT64_MAX || pipe(p) < 0) {
        snprintf(err, cap, "status or pipe failed");
        return -EIO;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        unread_leaser(socket, p[1]);
    }
    close(p[1]);
    char k;
    bool sent = pid > 0 && read(p[0], &k, 1) == 1;
    close(p[0]);
    if (!sent) {
        snprintf(err, cap, "the unread client failed");
        if (pid > 0)
            waitpid(pid, NULL, 0);
        return -EIO;
    }
    /* until the daemon granted what it will before the client reads (64 or more), then
     * past any timer's back-off (the old one doubled from 5 ms to 500 ms) */
    uint64_t until = stats_now_ns() + 10000000000u, held = 0;
    while ((held = status_of(c, "buffers.leases") - base) < 64 && stats_now_ns() < until)
        usleep(2000);
    usleep(800 * 1000);
    held = status_of(c, "buffers.leases") - base;
    uint64_t t0 = stats_now_ns();
    kill(pid, SIGKILL);
    until = t0 + 5000000000u;
    uint64_t now;
    while (status_of(c, "buffers.leases") != base && (now = stats_now_ns()) < until)
        usleep(500);
    *ms = (double)(stats_now_ns() - t0) / 1e6;
    waitpid(pid, NULL, 0);
    if (held < 64 || status_of(c, "buffers.leases") != base) {
        snprintf(err, cap, "%llu leases held before the SIGKILL (want >= 64), %s after 5 s",
                 (unsigned long long)held, status_of(c, "buffers.leases") != base ? "not reclaimed" : "reclaimed");
        return -EIO;
    }
    return 0;
}

int scenario_lease_many(const struct bench_opts *o, const struct daemons *ds)
{
    static shmref_buf *bufs[MANY];
    const char *socket = ds->d[POOL_DEVSHM].socket;
    int rounds = o->smoke ? 2 : 9, kills = o->smoke ? 1 : 5, r;
    unsigned quiet_us = o->smoke ? 50000 : 300000;
    struct samples big, small, dead;
    shmref_conn *c = NULL;
    char err[160] = "";
    double ms;
    fprintf(stderr, "shmref-bench: lease_many at 1,024, SIGKILLed unread clients ...\n");
    struct result *base = report_add("lease-many", "4x lease_many(256)", "dev-shm", MANY * LEASE_SIZE, "1024 x 4 KiB");
    struct result *one = report_add("lease-many", "lease_many(1024)", "dev-shm", MANY * LEASE_SIZE, "1024 x 4 KiB");
    struct result *kill9 = report_add("lease-many", "sigkill-reclaim", "dev-shm", 200 * LEASE_SIZE, "200 unread");
    if (!base || !one || !kill9)
        return -ENOMEM;
    samples_init(&big, (size_t)rounds);
    samples_init(&small, (size_t)rounds);
    samples_init(&dead, (size_t)kills);
    if ((r = shmref_connect(socket, &c)) < 0)
        snprintf(err, sizeof(err), "connect: %s", strerror(-r));
    else if ((r = lease_many_timed(c, bufs, MANY, MANY, &ms)) < 0) /* warm: the class's buffers exist, mapped */
        snprintf(err, sizeof(err), "lease_many: %s", shmref_errmsg(c));
    for (int i = 0; r == 0 && i < rounds; i++) {
        usleep(quiet_us);
        if ((r = lease_many_timed(c, bufs, MANY, MANY, &ms)) == 0) {
            samples_add(&big, ms);
            usleep(quiet_us);
            r = lease_many_timed(c, bufs, MANY, MANY / 4, &ms);
            samples_add(&small, ms);
        }
        if (r < 0)
            snprintf(err, sizeof(err), "lease_many: %s", shmref_errmsg(c));
    }
    if (r == 0) {
        report_fill(base, &small);
        report_fill(one, &big);
        report_ratio(one, base);
        snprintf(base->note, sizeof(base->note), "4 calls of 256 (8 requests each), warm");
        snprintf(one->note, sizeof(one->note), "one call: 32 requests, paused at 64 fds unread");
    } else {
        snprintf(base->error, sizeof(base->error), "%s", err);
        snprintf(one->error, sizeof(one->error), "%s", err);
    }
    err[0] = 0;
    int rk = c ? 0 : -ENOTCONN;
    for (int i = 0; rk == 0 && i < kills; i++)
        if ((rk = one_kill(c, socket, &ms, err, sizeof(err))) == 0)
            samples_add(&dead, ms);
    if (rk == 0) {
        report_fill(kill9, &dead);
        snprintf(kill9->note, sizeof(kill9->note), "SIGKILL to all 200 leases back (status polled); p90 = worst of %d",
                 kills);
    } else {
        snprintf(kill9->error, sizeof(kill9->error), "%s", err[0] ? err : "no connection");
    }
    shmref_close(c);
    samples_free(&big);
    samples_free(&small);
    samples_free(&dead);
    return r < 0 ? r : rk;
}
