/* SPDX-License-Identifier: MIT */
/* test-parked.c: requests that wait (wait_ms) against hostile clients of other uids,
 * through a real shmrefd on a temporary socket: one uid parks all it can on many
 * connections (capped per connection and per uid, refused with the numbers; the daemon's
 * memory bounded; closing them never stalls another client's ping), and replies to parked
 * requests obey the fd-in-flight caps (a publish serving 1,000 parked acquires on one
 * connection sends them as the client reads, never closing it; unread connections of
 * several uids never push the daemon to the kernel's limit of fds in flight). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "rawv2.h"

TestSuite(parked, .fini = reap_children);

#define KiB (UINT64_C(1) << 10)

static int become(uid_t uid)
{
    return setgroups(0, NULL) == 0 && setgid(uid) == 0 && setuid(uid) == 0 ? 0 : -1;
}

static void tell(int fd, char c)
{
    if (write(fd, &c, 1) != 1)
        _exit(90);
}

static char hear(int fd, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    char c = 0;
    if (poll(&p, 1, ms) != 1 || read(fd, &c, 1) != 1)
        return 0;
    return c;
}

/* rss_kib: the daemon's resident set (VmRSS), KiB. */
static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ping_ms: one ping's round trip on a raw connection, ms. */
static double ping_ms(int fd, uint32_t id)
{
    struct proto_msg m = { .op = PROTO_OP_PING, .id = id }, r;
    double t0 = mono_ms();
    rv_send(fd, &m);
    rv_expect(fd, 10000, PROTO_OP_PING + PROTO_OP_REPLY, id, &r, "ping");
    return mono_ms() - t0;
}

/* ---- one uid parks all it can on many connections ------------------------------------ */

#define PARK_CONNS 12

struct parker {
    const char *socket;
    uint8_t token[PROTO_TOKEN_LEN];
    uid_t uid;
    unsigned per_conn;           /* acquires sent on each connection */
    int ready[2], go[2];
};

/* take_reply: one reply that came (a refusal: EMFILE), counted. Returns 1 when one was
 * read, 0 when none came within ms, -1 on anything else. */
static int take_reply(int fd, int ms, unsigned *refused_uid, char *text, size_t cap)
{
    static uint8_t buf[PROTO_MAX_REPLY];
    struct proto_msg r;
    const char *why;
    ssize_t got = rawclient_recv_wait(fd, buf, sizeof(buf), ms);
    if (got == -ETIMEDOUT)
        return 0;
    if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0 || r.op != PROTO_OP_ERROR ||
        r.u.error.code != EMFILE)
        return -1;
    if (strstr(r.u.error.msg, "--max-parked-per-uid")) {
        if (!*refused_uid)
            snprintf(text, cap, "%.*s", (int)r.u.error.msg_len, r.u.error.msg);
        (*refused_uid)++;
    }
    return 1;
}

/* park_on: a connection's acquires, sent back to back (refusals read as they come).
 * Returns how many parked (no reply), -1 on an unexpected reply. */
static int park_on(int fd, const struct parker *k, unsigned *refused_uid, char *text, size_t cap)
{
    static uint8_t buf[PROTO_MAX_REPLY];
    unsigned replies = 0;
    int r;
    for (unsigned i = 0; i < k->per_conn; i++) {
        struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = 10 + i };
        memcpy(m.u.acquire.token, k->token, PROTO_TOKEN_LEN);
        m.u.acquire.wait_ms = 60000;
        int n = proto_encode(&m, buf, sizeof(buf));
        if (n <= 0 || rawclient_send(fd, buf, (size_t)n) < 0)
            return -1;
        while ((r = take_reply(fd, 0, refused_uid, text, cap)) == 1)
            replies++;
        if (r < 0)
            return -1;
    }
    while ((r = take_reply(fd, 300, refused_uid, text, cap)) == 1)
        replies++;
    return r < 0 ? -1 : (int)(k->per_conn - replies);
}

static int parker(void *arg)
{
    struct parker *k = arg;
    static uint8_t buf[PROTO_MAX_REPLY];
    char text[PROTO_MAX_ERRMSG + 1] = "";
    close(k->ready[0]);
    close(k->go[1]);
    if (become(k->uid) < 0)
        return 10;
    int fds[PARK_CONNS], parked = 0;
    unsigned refused_uid = 0;
    for (int c = 0; c < PARK_CONNS; c++) {
        if ((fds[c] = rawclient_connect(k->socket)) < 0)
            return 11;
        struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
        m.u.hello.version = PROTO_VERSION;
        int n = proto_encode(&m, buf, sizeof(buf));
        const char *why;
        ssize_t got = n > 0 ? rawclient_call(fds[c], buf, (size_t)n, buf, sizeof(buf), 5000) : -1;
        if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0 ||
            r.op != PROTO_OP_HELLO + PROTO_OP_REPLY)
            return 12;
        int p = park_on(fds[c], k, &refused_uid, text, sizeof(text));
        if (p < 0)
            return 13;
        parked += p;
    }
    fprintf(stderr, "uid %u parked %d acquires on %d connections; %u refused for its uid: %s\n", (unsigned)k->uid,
            parked, PARK_CONNS, refused_uid, text);
    if (!refused_uid || !strstr(text, "limit 16384"))
        return 14;
    tell(k->ready[1], 'p');
    if (hear(k->go[0], 100000) != 'g')
        return 15;
    for (int c = 0; c < PARK_CONNS; c++)
        close(fds[c]);
    return 0;
}

Test(parked, one_uid_parking_all_it_can_is_capped_and_its_teardown_never_stalls_others, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL); /* max-leases 4096, max-parked-per-uid 16384 */
    int prod = rv_connect(&d, 0);
    struct parker k = { .socket = d.socket, .uid = 65534, .per_conn = 4096 };
    uint64_t h = rv_lease(prod, 2, 4 * KiB, k.token); /* leased, never published: acquires wait */
    long rss0 = rss_kib(d.pid);
    cr_assert_eq(pipe(k.ready), 0);
    cr_assert_eq(pipe(k.go), 0);
    pid_t pid = child_run(parker, &k);
    close(k.ready[1]);
    close(k.go[0]);
    cr_assert_eq(hear(k.ready[0], 240000), 'p', "uid 65534 failed: %d", child_wait(pid));
    uint64_t waits = status_u64(&d, "counters.acquire_waits");
    cr_assert_eq(waits, 16384, "uid 65534 parked %llu acquires, its cap is 16384", (unsigned long long)waits);
    long rss1 = rss_kib(d.pid);
    fprintf(stderr, "daemon RSS %ld KiB -> %ld KiB with 16384 acquires parked (of %d sent)\n", rss0, rss1,
            PARK_CONNS * 4096);
#if !defined(__SANITIZE_ADDRESS__)
    /* (not under AddressSanitizer: its quarantine keeps what 32,768 refusals freed) */
    cr_assert_lt(rss1 - rss0, 32 * 1024, "the daemon grew %ld KiB with one uid's parked acquires", rss1 - rss0);
#endif

    /* another client pings while uid 65534's connections (4 of them with 4096 parked each)
     * close: the loop never stalls on their teardown */
    int other = rv_connect(&d, 0);
    double worst = 0;
    tell(k.go[1], 'g');
    double end = mono_ms() + 1500;
    for (uint32_t i = 0; mono_ms() < end; i++) {
        double t = ping_ms(other, 100 + i);
        worst = t > worst ? t : worst;
    }
    cr_assert_eq(child_wait(pid), 0);
    cr_assert_eq(wait_status(&d, "clients_total", 3, 10000), 3, "uid 65534's connections are still listed");
    fprintf(stderr, "worst ping while 16384 parked acquires were torn down: %.2f ms\n", worst);
    cr_assert_lt(worst, 100.0, "another client's ping waited %.1f ms while parked acquires were torn down", worst);
    cr_assert_eq(status_u64(&d, "counters.acquires"), 0);
    rv_release_send(prod, 3, h);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    close(other);
    close(prod);
    daemon_stop(&d);
}

/* ---- replies to parked requests obey the fd-in-flight caps ---------------------------- */

Test(parked, a_publish_serves_1000_parked_acquires_on_one_connection_as_it_reads, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int prod = rv_connect(&d, 0);
    uint8_t token[PROTO_TOKEN_LEN];
    uint64_t h = rv_lease(prod, 2, 4 * KiB, token);
    int cons = rv_connect(&d, 0); /* no fd-once: every acquire reply carries its fd */
    for (uint32_t i = 0; i < 1000; i++)
        rv_acquire_send(cons, 10 + i, token, 60000);
    cr_assert_eq(wait_status(&d, "counters.acquire_waits", 1000, 10000), 1000);
    rv_publish_send(prod, 3, h, 100);
    unsigned got = 0, fds = 0;
    for (uint32_t i = 0; i < 1000; i++) {
        struct proto_msg r;
        int fd[4];
        unsigned n = 0;
        ssize_t len = rv_recv_fds(cons, 10000, &r, fd, 4, &n);
        cr_assert_gt(len, 0, "reply %u of 1000 never came (%zd): the connection was closed", i, len);
        cr_assert_eq(r.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY, "reply %u: op %u %.*s", i, r.op,
                     r.op == PROTO_OP_ERROR ? (int)r.u.error.msg_len : 0, r.op == PROTO_OP_ERROR ? r.u.error.msg : "");
        got++;
        fds += n;
        for (unsigned k = 0; k < n; k++)
            close(fd[k]);
        if (i % 100 == 99)
            usleep(20000); /* a slow reader */
    }
    cr_assert_eq(got, 1000);
    cr_assert_eq(fds, 1000);
    cr_assert_lt(ping_ms(cons, 5000), 5000.0); /* the connection is kept */
    cr_assert_eq(status_u64(&d, "counters.slow_clients"), 0);
    cr_assert_eq(status_u64(&d, "counters.acquires"), 1000);
    close(cons);
    rv_release_send(prod, 4, h);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    close(prod);
    daemon_stop(&d);
}

/* start_with_nofile: daemon_start's daemon with RLIMIT_NOFILE at nofile (soft and hard). */
static void start_with_nofile(struct daemon *d, rlim_t nofile)
{
    memset(d, 0, sizeof(*d));
    strcpy(d->dir, "/tmp/shmref-test-XXXXXX");
    cr_assert_not_null(mkdtemp(d->dir));
    chmod(d->dir, 0755);
    snprintf(d->socket, sizeof(d->socket), "%s/shmrefd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/shmrefd.log", d->dir);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct rlimit rl = { nofile, nofile };
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        for (int i = 3; i < 1024; i++)
            close(i);
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            _exit(126);
        execl(SHMREFD_BIN, SHMREFD_BIN, "--socket", d->socket, "--socket-mode", "0666", "--verbose", (char *)NULL);
        _exit(127);
    }
    d->pid = pid;
    for (int i = 0; i < 500; i++) {
        int fd = rawclient_connect(d->socket);
        if (fd >= 0) {
            close(fd);
            return;
        }
        usleep(10000);
    }
    cr_assert_fail("the daemon did not start");
}

#define HOARD_UIDS 5
#define HOARD_CONNS 2
#define HOARD_EACH 120

struct hoarder {
    const char *socket;
    uint8_t token[PROTO_TOKEN_LEN];
    uid_t uid;
    int ready[2], go[2];
};

/* A uid that parks HOARD_EACH acquires on each of HOARD_CONNS connections and reads
 * nothing until told; then it reads every reply. */
static int hoarder(void *arg)
{
    struct hoarder *k = arg;
    static uint8_t buf[PROTO_MAX_REPLY];
    close(k->ready[0]);
    close(k->go[1]);
    if (become(k->uid) < 0)
        return 10;
    int fds[HOARD_CONNS];
    for (int c = 0; c < HOARD_CONNS; c++) {
        if ((fds[c] = rawclient_connect(k->socket)) < 0)
            return 11;
        struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
        m.u.hello.version = PROTO_VERSION;
        int n = proto_encode(&m, buf, sizeof(buf));
        const char *why;
        ssize_t got = rawclient_call(fds[c], buf, (size_t)n, buf, sizeof(buf), 5000);
        if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0 ||
            r.op != PROTO_OP_HELLO + PROTO_OP_REPLY)
            return 12;
        for (uint32_t i = 0; i < HOARD_EACH; i++) {
            m = (struct proto_msg){ .op = PROTO_OP_ACQUIRE, .id = 10 + i };
            memcpy(m.u.acquire.token, k->token, PROTO_TOKEN_LEN);
            m.u.acquire.wait_ms = 60000;
            n = proto_encode(&m, buf, sizeof(buf));
            if (rawclient_send(fds[c], buf, (size_t)n) < 0)
                return 13;
        }
    }
    tell(k->ready[1], 'p');
    if (hear(k->go[0], 100000) != 'g')
        return 14;
    for (int c = 0; c < HOARD_CONNS; c++) {
        for (uint32_t i = 0; i < HOARD_EACH; i++) {
            int fd[4];
            unsigned nf = 0;
            struct proto_msg r;
            const char *why;
            ssize_t got = rawclient_recv_fds(fds[c], buf, sizeof(buf), fd, 4, &nf, 20000);
            for (unsigned j = 0; j < nf; j++)
                close(fd[j]);
            if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0 ||
                r.op != PROTO_OP_ACQUIRE + PROTO_OP_REPLY) {
                fprintf(stderr, "uid %u conn %d: reply %u: %zd op %u\n", (unsigned)k->uid, c, i, got,
                        got > 0 ? r.op : 0);
                return 15;
            }
        }
        close(fds[c]);
    }
    return 0;
}

Test(parked, unread_connections_of_many_uids_never_take_the_kernels_fd_limit, .timeout = 300)
{
    struct daemon d;
    start_with_nofile(&d, 400); /* budget 200 (hard 300), 100 per uid, 64 per connection */
    int prod = rv_connect(&d, 0);
    struct hoarder k[HOARD_UIDS];
    pid_t pids[HOARD_UIDS];
    uint8_t token[PROTO_TOKEN_LEN];
    uint64_t h = rv_lease(prod, 2, 4 * KiB, token);
    for (int i = 0; i < HOARD_UIDS; i++) {
        k[i] = (struct hoarder){ .socket = d.socket, .uid = (uid_t)(65530 + i) };
        memcpy(k[i].token, token, PROTO_TOKEN_LEN);
        cr_assert_eq(pipe(k[i].ready), 0);
        cr_assert_eq(pipe(k[i].go), 0);
        pids[i] = child_run(hoarder, &k[i]);
        close(k[i].ready[1]);
        close(k[i].go[0]);
        cr_assert_eq(hear(k[i].ready[0], 30000), 'p', "uid %d failed: %d", 65530 + i, child_wait(pids[i]));
    }
    uint64_t want = HOARD_UIDS * HOARD_CONNS * HOARD_EACH;
    cr_assert_eq(wait_status(&d, "counters.acquire_waits", want, 20000), want);
    rv_publish_send(prod, 3, h, 100); /* 1,200 replies with an fd each, to unread connections */
    usleep(300 * 1000);
    uint64_t inflight = status_u64(&d, "daemon.fds_in_flight"), budget = status_u64(&d, "daemon.fds_in_flight_budget");
    fprintf(stderr, "after the publish: %llu fds in flight, budget %llu\n", (unsigned long long)inflight,
            (unsigned long long)budget);
    cr_assert_eq(budget, 200);
    cr_assert_leq(inflight, 300, "%llu fds in flight past the daemon's bound", (unsigned long long)inflight);

    /* another uid (the test, root) leases and reads: never held up by the hoarders */
    int other = rv_connect(&d, 0);
    double worst = 0;
    for (uint32_t i = 0; i < 50; i++) {
        double t0 = mono_ms();
        uint64_t lh = rv_lease(other, 100 + 2 * i, 4 * KiB, NULL);
        double t = mono_ms() - t0;
        worst = t > worst ? t : worst;
        rv_release_send(other, 101 + 2 * i, lh);
    }
    fprintf(stderr, "another uid's 50 leases beside them: worst %.2f ms\n", worst);
    cr_assert_lt(worst, 1000.0, "another uid's lease waited %.0f ms", worst);
    cr_assert(!daemon_log_contains(&d, "ETOOMANYREFS"), "the daemon reached the kernel's limit of fds in flight");

    for (int i = 0; i < HOARD_UIDS; i++) /* they read now: every reply is served */
        tell(k[i].go[1], 'g');
    for (int i = 0; i < HOARD_UIDS; i++)
        cr_assert_eq(child_wait(pids[i]), 0, "uid %d lost replies", 65530 + i);
    cr_assert_eq(status_u64(&d, "counters.slow_clients"), 0);
    cr_assert_eq(status_u64(&d, "counters.acquires"), want);
    close(other);
    rv_release_send(prod, 4, h);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    close(prod);
    daemon_stop(&d);
}

/* ---- no timer cliffs ------------------------------------------------------------------- */

/* A client with 200 leases sent and their replies unread (the daemon paused at its fd cap)
 * is SIGKILLed: the daemon sees it at once and reclaims its leases. */
static int unread_leaser(void *arg)
{
    const char *socket = arg;
    static uint8_t buf[PROTO_MAX_REPLY];
    int fd = rawclient_connect(socket);
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
    m.u.hello.version = PROTO_VERSION;
    int n = proto_encode(&m, buf, sizeof(buf));
    const char *why;
    ssize_t got = rawclient_call(fd, buf, (size_t)n, buf, sizeof(buf), 5000);
    if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0)
        return 10;
    for (uint32_t i = 0; i < 200; i++) {
        m = (struct proto_msg){ .op = PROTO_OP_LEASE, .id = 10 + i };
        m.u.lease.size = 4 * KiB;
        n = proto_encode(&m, buf, sizeof(buf));
        if (rawclient_send(fd, buf, (size_t)n) < 0)
            return 11;
    }
    pause();
    return 0;
}

Test(parked, a_paused_connections_peer_death_is_seen_at_once, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, NULL);
    double worst = 0;
    for (int round = 0; round < 5; round++) {
        pid_t pid = child_run(unread_leaser, d.socket);
        /* 64 (warm buffers: reading stops at 64 fds unread) to 200 granted (new buffers
         * are made off the loop, after every request was read; their replies wait) */
        long until = now_ms() + 10000;
        while (status_u64(&d, "buffers.leases") < 64 && now_ms() < until)
            usleep(2000);
        usleep(300 * 1000);
        uint64_t held = status_u64(&d, "buffers.leases");
        cr_assert(held >= 64 && held <= 200, "%llu leases", (unsigned long long)held);
        uint64_t inflight = status_u64(&d, "daemon.fds_in_flight");
        cr_assert_leq(inflight, 64, "%llu fds in flight to one connection", (unsigned long long)inflight);
        usleep(500 * 1000); /* past any timer's back-off (5 ms doubling to 500 ms) */
        double t0 = mono_ms();
        kill(pid, SIGKILL);
        long end = now_ms() + 5000;
        while (status_u64(&d, "buffers.leases") != 0 && now_ms() < end)
            usleep(1000);
        double t = mono_ms() - t0;
        cr_assert_eq(status_u64(&d, "buffers.leases"), 0);
        worst = t > worst ? t : worst;
        child_wait(pid);
    }
    fprintf(stderr, "a SIGKILLed client with 200 unread leases was reclaimed within %.1f ms (worst of 5)\n", worst);
#if defined(__SANITIZE_ADDRESS__)
    const double bound = 400.0; /* a loaded machine at ASan's speed; the timer it replaced took up to 595 ms */
#else
    const double bound = 100.0;
#endif
    cr_assert_lt(worst, bound, "reclaimed %.0f ms after its SIGKILL", worst);
    daemon_stop(&d);
}

/* lease_many of 1,024 warm 4 KiB buffers passes the per-connection cap of 64 fds unread
 * many times (its 32 requests are more than one read takes): each pause ends as soon as
 * the client has read (no timer), so it costs about what 4 lease_many of 256 cost (whose
 * 8 requests each are read at once, their replies sent before any pause). */
static double lease_many_ms(shmref_conn *c, shmref_buf **bufs, size_t n, size_t each)
{
    static size_t sizes[1024];
    for (size_t i = 0; i < n; i++)
        sizes[i] = 4 * KiB;
    double t0 = mono_ms();
    for (size_t k = 0; k < n; k += each)
        cr_assert_eq(shmref_lease_many(c, sizes, each, bufs + k), 0, "lease_many: %s", shmref_errmsg(c));
    double t = mono_ms() - t0;
    cr_assert_eq(shmref_release_many(bufs, n), 0);
    return t;
}

Test(parked, lease_many_of_1024_has_no_timer_cliff, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    static shmref_buf *bufs[1024];
    lease_many_ms(c, bufs, 1024, 1024); /* warm: 1,024 buffers of the class, mapped */
    /* Each call on a quiet connection (any earlier pause over), as a user makes one. The
     * baseline is 4 calls of 256 leasing the same 1,024 buffers (not one call of 256 four
     * times: libshmref keeps 256 idle mappings, so 768 of 1,024 buffers are mapped and
     * unmapped again on every round, in both forms alike; one call of 256 remaps none and
     * failed this bound at 6.2 ms against 0.42 ms on a loaded machine, no timer involved). */
    double best1024 = 1e9, best4x256 = 1e9;
    for (int r = 0; r < 5; r++) {
        usleep(600 * 1000);
        double a = lease_many_ms(c, bufs, 1024, 1024);
        usleep(600 * 1000);
        double b = lease_many_ms(c, bufs, 1024, 256);
        best1024 = a < best1024 ? a : best1024;
        best4x256 = b < best4x256 ? b : best4x256;
    }
    fprintf(stderr, "lease_many(1024) warm: %.2f ms; 4 x lease_many(256): %.2f ms (best of 5)\n", best1024,
            best4x256);
#if !defined(__SANITIZE_ADDRESS__)
    /* (not under AddressSanitizer: there each of the 16 pauses costs a few wake-ups of two
     * processes at its speed; no timer fires, but the ratio measures ASan) */
    cr_assert_lt(best1024, 2 * best4x256 + 1.0, "lease_many(1024) took %.2f ms against %.2f ms for 4 x 256", best1024,
                 best4x256);
#endif
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- many answers at once go as the client reads: release, expiry, shutdown ---- */

#define PARK_MAX 4096 /* the most acquires one connection may park: max-leases (its default) */

/* park_most: a producer's lease, and PARK_MAX acquires of its token parked (wait_ms) on
 * one raw connection *ret_cons. Returns the producer's connection; *ret_h its handle. */
static int park_most(struct daemon *d, uint32_t wait_ms, int *ret_cons, uint64_t *ret_h)
{
    int prod = rv_connect(d, 0);
    uint8_t token[PROTO_TOKEN_LEN];
    *ret_h = rv_lease(prod, 2, 4 * KiB, token);
    int cons = rv_connect(d, 0);
    for (uint32_t i = 0; i < PARK_MAX; i++)
        rv_acquire_send(cons, 10 + i, token, wait_ms);
    /* every one parked (none refused: the connection holds nothing else) */
    uint64_t parked = wait_status(d, "counters.acquire_waits", PARK_MAX, 30000);
    cr_assert_eq(parked, PARK_MAX, "%llu of %d acquires parked", (unsigned long long)parked, PARK_MAX);
    *ret_cons = cons;
    return prod;
}

/* read_refusals: n refusals with code, read slowly (a pause every 100), then a ping on the
 * same connection: it was kept, and nobody was closed as slow. */
static void read_refusals(struct daemon *d, int cons, uint32_t n, int code, const char *path)
{
    for (uint32_t i = 0; i < n; i++) {
        struct proto_msg r;
        ssize_t len = rv_recv(cons, 10000, &r);
        cr_assert_gt(len, 0, "%s: answer %u of %u never came (%zd): the connection was closed", path, i, n, len);
        cr_assert_eq(r.op, PROTO_OP_ERROR, "%s: answer %u: op %u", path, i, r.op);
        cr_assert_eq(r.u.error.code, code, "%s: answer %u: code %d %.*s", path, i, (int)r.u.error.code,
                     (int)r.u.error.msg_len, r.u.error.msg);
        if (i % 100 == 99)
            usleep(20000); /* a slow reader */
    }
    cr_assert_lt(ping_ms(cons, 50000), 10000.0, "%s: the connection was not kept", path);
    cr_assert_eq(status_u64(d, "counters.slow_clients"), 0, "%s: a client was closed as slow", path);
}

Test(parked, a_release_refuses_the_most_parked_acquires_as_the_client_reads, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int cons;
    uint64_t h;
    int prod = park_most(&d, 60000, &cons, &h);
    rv_release_send(prod, 3, h); /* never published: every waiter gets ENOENT at once */
    read_refusals(&d, cons, PARK_MAX, ENOENT, "release");
    close(cons);
    close(prod);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    daemon_stop(&d);
}

Test(parked, expired_waits_refuse_the_most_parked_acquires_as_the_client_reads, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int cons;
    uint64_t h;
    int prod = park_most(&d, 300, &cons, &h);
    /* nothing read until every wait has run out together */
    uint64_t out = wait_status(&d, "counters.acquire_wait_timeouts", PARK_MAX, 60000);
    cr_assert_eq(out, PARK_MAX, "%llu of %d waits ran out", (unsigned long long)out, PARK_MAX);
    read_refusals(&d, cons, PARK_MAX, ENOENT, "expiry");
    rv_release_send(prod, 3, h);
    close(cons);
    close(prod);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    daemon_stop(&d);
}

Test(parked, expired_lease_waits_refuse_the_most_parked_as_the_client_reads, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "64K", NULL);
    int c = rv_connect(&d, 0);
    uint8_t token[PROTO_TOKEN_LEN];
    uint64_t h = rv_lease(c, 2, 64 * KiB, token); /* the whole quota */
    for (uint32_t i = 0; i < PARK_MAX - 1; i++) /* the one held takes a place too */
        rv_lease_send(c, 10 + i, 4 * KiB, 300);
    uint64_t out = wait_status(&d, "counters.lease_wait_timeouts", PARK_MAX - 1, 60000);
    cr_assert_eq(out, PARK_MAX - 1, "%llu of %d lease waits ran out", (unsigned long long)out, PARK_MAX - 1);
    read_refusals(&d, c, PARK_MAX - 1, ETIMEDOUT, "lease expiry");
    rv_release_send(c, 3, h);
    close(c);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    daemon_stop(&d);
}

Test(parked, a_stopping_daemon_with_the_most_parked_closes_no_client_as_slow, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int cons;
    uint64_t h;
    int prod = park_most(&d, 60000, &cons, &h);
    /* a client that is reading along when the daemon stops: its connection ends as the
     * daemon's, never as a slow client's */
    cr_assert_eq(kill(d.pid, SIGTERM), 0);
    struct proto_msg r;
    ssize_t len;
    unsigned answers = 0;
    while ((len = rv_recv(cons, 10000, &r)) > 0)
        answers++;
    cr_assert_eq(len, 0, "the stopping daemon's connection did not end (%zd)", len);
    printf("stopping with %d parked: %u answers before the end\n", PARK_MAX, answers);
    cr_assert(!daemon_log_contains(&d, "does not read its replies"), "a reading client was closed as slow");
    int st = 0;
    cr_assert_eq(waitpid(d.pid, &st, 0), d.pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "shmrefd did not exit 0 on SIGTERM (status %#x)", st);
    unlink(d.log);
    unlink(d.socket);
    rmdir(d.dir);
    close(cons);
    close(prod);
}
