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
    cr_assert_lt(rss1 - rss0, 32 * 1024, "the daemon grew %ld KiB with one uid's parked acquires", rss1 - rss0);

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
