/* SPDX-License-Identifier: MIT */
/* test-hostile-v2.c: protocol version 2 against hostile clients, through a real shmrefd
 * on a temporary socket, spoken raw by real processes (several uids where it matters):
 * handles of a lease_many touched before its reply, clients that park the most waiting
 * requests they may and vanish, a lease_many whose replies are never read, release_many
 * with duplicates and foreign handles, one uid's flood of waiting leases beside another
 * uid leasing freely, and an acquire parked on a token whose buffer is released and
 * leased again (ENOENT, never the new bytes). Nothing may leak: status counters, quota,
 * the daemon's own fds (/proc/<pid>/fd); the daemon's ledgers check aborts on a drift. */
#include <criterion/criterion.h>

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rawv2.h"

TestSuite(hostile_v2, .fini = reap_children);

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

static void lease_many_send(int fd, uint32_t id, uint32_t n, const uint64_t *sizes, uint32_t wait_ms)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE_MANY, .id = id };
    m.u.lease_many.n = n;
    memcpy(m.u.lease_many.sizes, sizes, n * sizeof(sizes[0]));
    m.u.lease_many.wait_ms = wait_ms;
    rv_send(fd, &m);
}

/* handle_guess: the handle a fresh connection's registry gives its k-th hold of slot i
 * (generation k, slot index i): what a hostile client can predict. */
static uint64_t handle_guess(uint32_t gen, uint32_t slot)
{
    return (uint64_t)gen << 32 | slot;
}

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

/* cpu_ms: user + system CPU time the process pid has used, in ms (/proc/<pid>/stat). */
static long cpu_ms(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    cr_assert_not_null(p);
    unsigned long ut = 0, st = 0;
    /* after ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    cr_assert_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
    return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

/* fds_other: the daemon's open fds other than its buffers' (one each, all of class size
 * csize: pool.bytes_allocated / csize of them), read when both agree twice running. */
static int fds_other(const struct daemon *d, uint64_t csize)
{
    /* status_u64's connections take no table: the daemon makes a uid's table memfd for its
     * first table connection and closes it with its last, so each status call would add a
     * transient fd to the count (CI saw base + 1 once). */
    /* Each status call is a connection (a socket and a pidfd in the daemon) that ends
     * when the daemon reads its close, a moment after status_u64 returns: the fds are
     * counted after the call, twice 50 ms apart, and only an unchanged count is taken
     * (counting first, then calling, took a connection still ending once: base + 2). */
    setenv("SHMREF_TABLE", "0", 1);
    for (int i = 0;; i++) {
        uint64_t alloc = status_u64(d, "pool.bytes_allocated");
        usleep(50000);
        int n = daemon_fds(d);
        usleep(50000);
        if ((daemon_fds(d) == n && status_u64(d, "pool.bytes_allocated") == alloc) || i == 100)
            return n - (int)(alloc / csize);
    }
}

/* fds_settle: the daemon's fds other than its buffers' reach want within ms; returns the
 * last count. */
static int fds_settle(const struct daemon *d, uint64_t csize, int want, int ms)
{
    long end = now_ms() + ms;
    int n;
    while ((n = fds_other(d, csize)) != want && now_ms() < end)
        usleep(20000);
    return n;
}

/* A lease_many whose first item is a warm buffer (held at once) and whose second must be
 * made off the loop: the client releases the first item's handle, which it guessed, before
 * the reply. The daemon must not reply with (or touch) the buffer it no longer holds: the
 * whole batch is refused and undone, the ledgers agree, the daemon lives on. */
Test(hostile_v2, lease_many_item_released_before_the_reply, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    /* a warm 64 KiB buffer of this uid (another connection leases and releases it) */
    int warm = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    uint64_t wh = rv_lease(warm, 1, 64 * KiB, NULL);
    rv_release_send(warm, 2, wh);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);

    for (int round = 0; round < 3; round++) {
        int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
        /* item 0: the warm class (slot 0, generation 1); item 1: a new 4 MiB buffer */
        uint64_t sizes[2] = { 64 * KiB, 4 * MiB + (uint64_t)round * MiB };
        lease_many_send(fd, 10, 2, sizes, 0);
        rv_release_send(fd, 11, handle_guess(1, 0));
        struct proto_msg r;
        ssize_t n = rv_recv(fd, 10000, &r);
        if (n <= 0) { usleep(300000); char c[256]; snprintf(c, sizeof c, "tail -5 %s >&2", d.log); if (system(c)) {} }
        cr_assert_gt(n, 0, "round %d: no reply to the lease_many (%zd; daemon exited? %d)", round, n, waitpid(d.pid, NULL, WNOHANG) == d.pid);
        cr_assert_eq(r.id, 10, "round %d: reply id %u op %u", round, r.id, r.op);
        if (r.op == PROTO_OP_LEASE_MANY + PROTO_OP_REPLY) {
            /* the release came too late to matter: the reply must name live handles */
            cr_assert_eq(r.u.lease_many_reply.n, 2);
        } else {
            cr_assert_eq(r.op, PROTO_OP_ERROR, "round %d: op %u", round, r.op);
        }
        close(fd);
        cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0, "round %d: bytes still leased", round);
        cr_assert_eq(wait_status(&d, "buffers.leases", 0, 5000), 0, "round %d", round);
    }
    /* the daemon still serves, and its ledgers agree (a drift aborts it) */
    uint64_t h = rv_lease(warm, 3, 64 * KiB, NULL);
    rv_release_send(warm, 4, h);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    close(warm);
    daemon_stop(&d);
}

/* A client parks every waiting request max-leases allows (leases, a waiting lease_many,
 * acquires of an unpublished token), is refused the next one, and disconnects: nothing it
 * parked is left anywhere (served later to a dead peer, charged, or an fd kept), three
 * rounds over. */
Test(hostile_v2, parking_the_most_then_vanishing_leaks_nothing, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, "--max-leases", "16", "--tenant-quota", "1M", NULL);
    int holder = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    int base = 0;
    for (uint32_t round = 0; round < 3; round++) {
        uint8_t token[PROTO_TOKEN_LEN];
        uint64_t h = rv_lease(holder, 100 + round * 10, MiB, token); /* uid 0 at its quota, unpublished */
        int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
        for (uint32_t i = 0; i < 8; i++)
            rv_lease_send(fd, 10 + i, 64 * KiB, 30000);
        uint64_t sizes[4] = { 4 * KiB, 4 * KiB, 4 * KiB, 4 * KiB };
        lease_many_send(fd, 20, 4, sizes, 30000);
        for (uint32_t i = 0; i < 4; i++)
            rv_acquire_send(fd, 30 + i, token, 30000);
        rv_acquire_send(fd, 40, token, 30000);  /* the 17th place: refused */
        rv_lease_send(fd, 41, 4 * KiB, 30000); /* and this one */
        char text[PROTO_MAX_ERRMSG + 1];
        rv_expect_error(fd, 5000, 40, EMFILE, text, sizeof(text), "a 17th parked acquire");
        cr_assert(strstr(text, "16 held (16 of them waiting)"), "%s", text);
        rv_expect_error(fd, 5000, 41, EMFILE, NULL, 0, "a 17th parked lease");
        cr_assert_eq(status_u64(&d, "counters.acquire_waits"), 4 * (round + 1));
        cr_assert_eq(status_u64(&d, "counters.lease_waits"), 9 * (round + 1));
        close(fd);
        cr_assert_eq(wait_status(&d, "clients_total", 2, 5000), 2, "the closed connection is still listed");
        /* the token's buffer goes unpublished, then the quota frees: no waiter is left */
        rv_publish_send(holder, 101 + round * 10, h, 10);
        rv_release_send(holder, 102 + round * 10, h);
        cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0, "round %u", round);
        uint64_t again = rv_lease(holder, 103 + round * 10, MiB, NULL); /* all of it: nothing charged */
        rv_release_send(holder, 104 + round * 10, again);
        cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
        /* the daemon's fds: the same after every round (the warm 1 MiB buffer is reused) */
        if (round == 0)
            base = fds_other(&d, MiB);
        else
            cr_assert_eq(fds_settle(&d, MiB, base, 5000), base, "round %u: the daemon's fds (buffers aside)", round);
    }
    cr_assert_eq(status_u64(&d, "counters.acquires"), 0);
    cr_assert_eq(status_u64(&d, "counters.lease_wait_timeouts"), 0);
    cr_assert_eq(status_u64(&d, "counters.acquire_wait_timeouts"), 0);
    cr_assert_eq(status_u64(&d, "counters.leases"), 6);
    cr_assert_eq(status_u64(&d, "buffers.leases"), 0);
    close(holder);
    daemon_stop(&d);
}

/* ---- one uid floods waiting leases, another leases freely ---------------------------- */

#define FLOOD_CONNS 4
#define FLOOD_EACH 500

struct flood {
    const char *socket;
    int go, ready;
};

/* uid 65534: at its quota, parks FLOOD_CONNS * FLOOD_EACH waiting leases, holds them
 * until told to go, then vanishes with them parked. */
static int flooder(void *arg)
{
    struct flood *k = arg;
    static uint8_t buf[PROTO_MAX_REPLY];
    if (become(65534) < 0)
        return 10;
    int fds[FLOOD_CONNS];
    for (int c = 0; c < FLOOD_CONNS; c++) {
        if ((fds[c] = rawclient_connect(k->socket)) < 0)
            return 11;
        struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
        m.u.hello.version = PROTO_VERSION;
        int n = proto_encode(&m, buf, sizeof(buf));
        const char *why;
        ssize_t got = n > 0 ? rawclient_call(fds[c], buf, (size_t)n, buf, sizeof(buf), 5000) : -1;
        if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0 || r.op != PROTO_OP_HELLO + PROTO_OP_REPLY)
            return 12;
    }
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 2 }, r;
    m.u.lease.size = MiB;
    int n = proto_encode(&m, buf, sizeof(buf));
    const char *why;
    ssize_t got = rawclient_call(fds[0], buf, (size_t)n, buf, sizeof(buf), 5000);
    if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0 || r.op != PROTO_OP_LEASE + PROTO_OP_REPLY)
        return 13;
    for (int c = 0; c < FLOOD_CONNS; c++)
        for (uint32_t i = 0; i < FLOOD_EACH; i++) {
            m = (struct proto_msg){ .op = PROTO_OP_LEASE, .id = 10 + i };
            m.u.lease.size = 64 * KiB;
            m.u.lease.wait_ms = 60000;
            n = proto_encode(&m, buf, sizeof(buf));
            if (rawclient_send(fds[c], buf, (size_t)n) < 0)
                return 14;
        }
    tell(k->ready, 'p');
    if (hear(k->go, 100000) != 'g')
        return 15;
    for (int c = 0; c < FLOOD_CONNS; c++) {
        if (rawclient_recv_wait(fds[c], buf, sizeof(buf), 0) != -ETIMEDOUT)
            return 16; /* nothing was answered: every lease still waits */
        close(fds[c]);
    }
    return 0;
}

Test(hostile_v2, a_flood_of_waiting_leases_never_slows_another_uid, .timeout = 180)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "1M", "--socket-mode", "0666", NULL);
    int ready[2], go[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(go), 0);
    struct flood k = { .socket = d.socket, .go = go[0], .ready = ready[1] };
    pid_t pid = child_run(flooder, &k);
    cr_assert_eq(hear(ready[0], 30000), 'p', "uid 65534 did not send its flood");
    uint64_t want = FLOOD_CONNS * FLOOD_EACH;
    cr_assert_eq(wait_status(&d, "counters.lease_waits", want, 20000), want);

    /* parked, the flood costs the loop nothing: no retry that spins */
    long c0 = cpu_ms(d.pid);
    usleep(1000000);
    long idle = cpu_ms(d.pid) - c0;
    cr_assert_lt(idle, 300, "the daemon used %ld ms of CPU in 1 s with %llu leases parked", idle,
                 (unsigned long long)want);

    /* root leases to its own quota and back, many times: every free kicks a retry of
     * 65534's blocked head, which must stay cheap and never delay root */
    int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    long worst = 0, t_all = now_ms();
    c0 = cpu_ms(d.pid);
    for (uint32_t i = 0; i < 300; i++) {
        long t0 = now_ms();
        uint64_t a = rv_lease(fd, 10 + 2 * i, 512 * KiB, NULL), b = rv_lease(fd, 11 + 2 * i, 512 * KiB, NULL);
        long t = now_ms() - t0;
        worst = t > worst ? t : worst;
        rv_release_send(fd, 1000 + i, a);
        rv_release_send(fd, 2000 + i, b);
    }
    t_all = now_ms() - t_all;
    long busy = cpu_ms(d.pid) - c0;
    cr_assert_lt(worst, 2000, "another tenant's leases waited %ld ms", worst);
    cr_assert_lt(t_all, 30000, "600 leases of root took %ld ms beside the flood", t_all);
    cr_assert_eq(status_u64(&d, "counters.refused_quota"), 0);
    usleep(200000);
    c0 = cpu_ms(d.pid);
    usleep(1000000);
    idle = cpu_ms(d.pid) - c0;
    cr_assert_lt(idle, 300, "after root's frees the daemon used %ld ms of CPU in 1 s (busy %ld ms for 600 leases)",
                 idle, busy);

    tell(go[1], 'g');
    int st = child_wait(pid);
    cr_assert_eq(st, 0, "uid 65534's child failed (status %d: 10-15 a step before the flood was told to go, "
                 "16 a flooding connection was answered, 128+ a signal)", st);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    cr_assert_eq(wait_status(&d, "clients_total", 2, 5000), 2); /* root's and the status query's */
    cr_assert_eq(status_u64(&d, "counters.lease_wait_timeouts"), 0);
    /* 65534's quota is whole again: nothing of the flood was charged */
    close(fd);
    daemon_stop(&d);
}

/* ---- release_many with duplicates and another connection's handles ------------------ */

static void release_many_send(int fd, uint32_t id, const uint64_t *handles, uint32_t n, uint32_t flags)
{
    struct proto_msg m = { .op = PROTO_OP_RELEASE_MANY, .id = id };
    m.u.release_many.n = n;
    memcpy(m.u.release_many.handles, handles, n * sizeof(handles[0]));
    m.u.release_many.flags = flags;
    rv_send(fd, &m);
}

Test(hostile_v2, release_many_duplicates_and_foreign_handles, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int a = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE), b = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    uint64_t ha[3];
    for (uint32_t i = 0; i < 3; i++)
        ha[i] = rv_lease(a, 10 + i, 64 * KiB, NULL);
    uint64_t hb = rv_lease(b, 20, 64 * KiB, NULL);
    cr_assert_eq(hb, ha[0], "fresh connections number their handles alike (%llx, %llx)", (unsigned long long)hb,
                 (unsigned long long)ha[0]);
    /* b: its own handle twice, then a's second and third (unknown on b) */
    uint64_t list[4] = { hb, hb, ha[1], ha[2] };
    release_many_send(b, 21, list, 4, 0);
    char text[PROTO_MAX_ERRMSG + 1];
    rv_expect_error(b, 5000, 21, ENOENT, text, sizeof(text), "release_many with a duplicate and foreign handles");
    cr_assert(strstr(text, "(item 1 of 4)") && strstr(text, "3 of the 4 handles were unknown"), "%s", text);
    cr_assert_eq(status_u64(&d, "buffers.leases"), 3, "a's leases must be untouched");
    /* a's handles all still work: publish one, then release all with a duplicate, one-way */
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 30 }, r;
    m.u.publish.handle = ha[1];
    m.u.publish.size = 10;
    rv_send(a, &m);
    rv_expect(a, 5000, PROTO_OP_PUBLISH + PROTO_OP_REPLY, 30, &r, "publish of a's second lease");
    uint64_t all[4] = { ha[0], ha[1], ha[2], ha[0] };
    release_many_send(a, 31, all, 4, PROTO_RELEASE_NOREPLY);
    rv_expect_error(a, 5000, 31, ENOENT, text, sizeof(text), "a duplicate in a one-way release_many");
    cr_assert(strstr(text, "(item 3 of 4)") && strstr(text, "1 of the 4"), "%s", text);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 5000), 0);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    cr_assert_eq(status_u64(&d, "counters.releases"), 4);
    close(a);
    close(b);
    daemon_stop(&d);
}

/* ---- an acquire parked on a token whose buffer is released and leased again -------- */

/* uid 65534 parks an acquire on root's unpublished token; root writes, releases without
 * publishing, leases the same (warm, recycled) buffer again and publishes new bytes: the
 * parked acquire is ENOENT at the release, and the old token never finds the new bytes,
 * waiting or not. The parked acquire never kept the buffer alive. */
struct token_waiter {
    const char *socket;
    uint8_t token[PROTO_TOKEN_LEN];
    int go, ready;
};

static int token_waiter_run(void *arg)
{
    struct token_waiter *k = arg;
    static uint8_t buf[PROTO_MAX_REPLY];
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
    const char *why;
    if (become(65534) < 0)
        return 10;
    int fd = rawclient_connect(k->socket);
    m.u.hello.version = PROTO_VERSION;
    int n = proto_encode(&m, buf, sizeof(buf));
    ssize_t got = fd >= 0 && n > 0 ? rawclient_call(fd, buf, (size_t)n, buf, sizeof(buf), 5000) : -1;
    if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0 || r.op != PROTO_OP_HELLO + PROTO_OP_REPLY)
        return 11;
    m = (struct proto_msg){ .op = PROTO_OP_ACQUIRE, .id = 2 };
    memcpy(m.u.acquire.token, k->token, PROTO_TOKEN_LEN);
    m.u.acquire.wait_ms = 30000;
    n = proto_encode(&m, buf, sizeof(buf));
    if (rawclient_send(fd, buf, (size_t)n) < 0)
        return 12;
    if (rawclient_recv_wait(fd, buf, sizeof(buf), 300) != -ETIMEDOUT)
        return 13; /* it must wait for the publish */
    tell(k->ready, 'p');
    got = rawclient_recv_wait(fd, buf, sizeof(buf), 20000); /* root releases: ENOENT */
    if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0)
        return 14;
    if (r.op != PROTO_OP_ERROR || r.id != 2 || r.u.error.code != ENOENT)
        return 15;
    tell(k->ready, 'e');
    if (hear(k->go, 30000) != 'g') /* root has leased the buffer again and published it */
        return 16;
    for (uint32_t id = 3; id <= 4; id++) {
        m.id = id;
        m.u.acquire.wait_ms = id == 3 ? 0 : 2000;
        n = proto_encode(&m, buf, sizeof(buf));
        if (rawclient_send(fd, buf, (size_t)n) < 0)
            return 17;
        got = rawclient_recv_wait(fd, buf, sizeof(buf), 5000);
        if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0)
            return 18;
        if (r.op != PROTO_OP_ERROR || r.id != id || r.u.error.code != ENOENT)
            return 19; /* the old token must never reach the new contents */
    }
    close(fd);
    return 0;
}

Test(hostile_v2, a_parked_acquire_never_sees_the_buffer_leased_again, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    struct proto_msg r;
    int fds[2];
    unsigned nfds = 0;
    rv_lease_send(fd, 10, 64 * KiB, 0);
    cr_assert_gt(rv_recv_fds(fd, 5000, &r, fds, 2, &nfds), 0);
    cr_assert_eq(r.op, PROTO_OP_LEASE + PROTO_OP_REPLY);
    cr_assert_eq(nfds, 1);
    uint64_t h = r.u.lease_reply.handle, buf_id = r.u.lease_reply.buf_id;
    struct token_waiter k = { .socket = d.socket };
    memcpy(k.token, r.u.lease_reply.token, PROTO_TOKEN_LEN);
    uint8_t *p = mmap(NULL, 64 * KiB, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    cr_assert_neq(p, MAP_FAILED);
    fill_pattern(p, 64 * KiB, 1);
    int ready[2], go[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(go), 0);
    k.go = go[0];
    k.ready = ready[1];
    pid_t pid = child_run(token_waiter_run, &k);
    cr_assert_eq(hear(ready[0], 20000), 'p', "uid 65534 did not park its acquire");
    cr_assert_eq(status_u64(&d, "counters.acquire_waits"), 1);
    rv_release_send(fd, 11, h); /* unpublished: the buffer goes, its waiter with it */
    cr_assert_eq(hear(ready[0], 20000), 'e', "the parked acquire was not ENOENT at the release");
    cr_assert_eq(wait_status(&d, "buffers.live", 0, 5000), 0, "a parked acquire kept the buffer alive");

    /* the same buffer again (warm, this uid's): a new token, new bytes, published */
    rv_lease_send(fd, 12, 64 * KiB, 0);
    rv_expect(fd, 5000, PROTO_OP_LEASE + PROTO_OP_REPLY, 12, &r, "the lease again");
    cr_assert_eq(r.u.lease_reply.buf_id, buf_id, "not the recycled buffer: the test proves nothing");
    cr_assert_neq(memcmp(r.u.lease_reply.token, k.token, PROTO_TOKEN_LEN), 0, "a recycled buffer kept its token");
    uint64_t h2 = r.u.lease_reply.handle;
    fill_pattern(p, 64 * KiB, 2);
    rv_publish_send(fd, 13, h2, 64 * KiB);
    tell(go[1], 'g');
    cr_assert_eq(child_wait(pid), 0, "uid 65534's old token reached something (child status)");
    cr_assert_eq(status_u64(&d, "counters.acquires"), 0);
    munmap(p, 64 * KiB);
    close(fds[0]);
    rv_release_send(fd, 14, h2);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    close(fd);
    daemon_stop(&d);
}

/* ---- a lease_many of 32, again and again, whose replies are never read -------------- */

#define NR_BATCHES 12

Test(hostile_v2, lease_many_never_read_stalls_only_its_client, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "1G", NULL);
    uint64_t sizes[PROTO_MAX_BATCH];
    for (uint32_t i = 0; i < PROTO_MAX_BATCH; i++)
        sizes[i] = 4 * KiB;
    /* warm-up: a client that reads leases as many buffers as the hostile one will, and
     * gives them back (so the daemon's fds are the same before and after) */
    int good = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE);
    static uint64_t hs[NR_BATCHES][PROTO_MAX_BATCH];
    for (uint32_t b = 0; b < NR_BATCHES; b++) {
        struct proto_msg r;
        lease_many_send(good, 100 + b, PROTO_MAX_BATCH, sizes, 0);
        rv_expect(good, 10000, PROTO_OP_LEASE_MANY + PROTO_OP_REPLY, 100 + b, &r, "warm-up lease_many");
        for (uint32_t i = 0; i < PROTO_MAX_BATCH; i++)
            hs[b][i] = r.u.lease_many_reply.items[i].handle;
    }
    for (uint32_t b = 0; b < NR_BATCHES; b++) {
        struct proto_msg m = { .op = PROTO_OP_RELEASE_MANY, .id = 200 + b };
        m.u.release_many.n = PROTO_MAX_BATCH;
        memcpy(m.u.release_many.handles, hs[b], sizeof(hs[b]));
        m.u.release_many.flags = PROTO_RELEASE_NOREPLY;
        rv_send(good, &m);
    }
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    uint64_t csize = status_u64(&d, "pool.bytes_allocated") / (NR_BATCHES * PROTO_MAX_BATCH);
    int base = fds_other(&d, csize);

    int bad = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE);
    for (uint32_t b = 0; b < NR_BATCHES; b++)
        lease_many_send(bad, 10 + b, PROTO_MAX_BATCH, sizes, 0);
    usleep(500000);
    /* the daemon serves the others meanwhile */
    long worst = 0;
    for (uint32_t i = 0; i < 50; i++) {
        long t0 = now_ms();
        uint64_t h = rv_lease(good, 300 + i, 4 * KiB, NULL);
        long t = now_ms() - t0;
        worst = t > worst ? t : worst;
        rv_release_send(good, 400 + i, h);
    }
    cr_assert_lt(worst, 2000, "a lease beside the client that reads nothing took %ld ms", worst);
    /* fds in flight to the one that reads nothing (every buffer is warm, so each reply
     * goes at once): at its cap (64 per connection) and at most one batch past it, not
     * every batch it asked for */
    uint64_t leased = status_u64(&d, "buffers.leases");
    cr_assert_leq(leased, 64 + PROTO_MAX_BATCH,
                  "%llu leases (each a fd sent) went to a client that reads nothing; its cap is 64 fds in flight",
                  (unsigned long long)leased);
    close(bad);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 5000), 0);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    cr_assert_eq(fds_settle(&d, csize, base, 5000), base, "the daemon's fds (buffers aside) after the client went");
    close(good);
    daemon_stop(&d);
}

/* ---- a waiting lease that can never fit -------------------------------------------- */

/* A lease larger than the tenant's whole quota (or the pool) cannot be cured by waiting:
 * refused at once, and it never holds up the tenant's later waiting leases. */
Test(hostile_v2, a_waiting_lease_beyond_the_whole_quota_is_refused_at_once, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "1M", NULL);
    int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    long t0 = now_ms();
    rv_lease_send(fd, 10, 2 * MiB, 20000);
    rv_lease_send(fd, 11, 64 * KiB, 20000);
    uint64_t sizes[2] = { 768 * KiB, 768 * KiB };
    lease_many_send(fd, 12, 2, sizes, 20000);
    char text[PROTO_MAX_ERRMSG + 1];
    rv_expect_error(fd, 20000, 10, EDQUOT, text, sizeof(text), "a waiting lease beyond the whole quota");
    cr_assert_lt(now_ms() - t0, 2000, "refused only after %ld ms: it waited for what can never come: %s",
                 now_ms() - t0, text);
    /* the next two in either order (the 64 KiB lease's buffer is made off the loop) */
    uint64_t h = 0;
    bool got11 = false, got12 = false;
    for (int k = 0; k < 2; k++) {
        struct proto_msg r;
        cr_assert_gt(rv_recv(fd, 5000, &r), 0, "reply %d", k);
        if (r.id == 11) {
            cr_assert_eq(r.op, PROTO_OP_LEASE + PROTO_OP_REPLY, "the tenant's next waiting lease: %.*s",
                         (int)r.u.error.msg_len, r.u.error.msg);
            h = r.u.lease_reply.handle;
            got11 = true;
        } else {
            cr_assert_eq(r.id, 12);
            cr_assert_eq(r.op, PROTO_OP_ERROR);
            cr_assert_eq(r.u.error.code, EDQUOT, "lease_many: %.*s", (int)r.u.error.msg_len, r.u.error.msg);
            got12 = true;
        }
    }
    cr_assert(got11 && got12);
    cr_assert_lt(now_ms() - t0, 2000, "served after %ld ms", now_ms() - t0);
    rv_release_send(fd, 13, h);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    close(fd);
    daemon_stop(&d);
}

/* ---- the head of a tenant's queue goes: the ones behind it are tried --------------- */

/* FIFO: a small waiting lease that would fit queues behind a big one that does not. When
 * the big one leaves the queue without anything freeing (its wait runs out, or its
 * connection closes holding nothing), the small one must be tried then, not at the next
 * free or its own timeout. */
Test(hostile_v2, a_waiter_behind_a_head_that_goes_is_tried_at_once, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "1M", NULL);
    int holder = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    uint64_t h = rv_lease(holder, 1, 512 * KiB, NULL);
    int big = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE), small = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    struct proto_msg r;

    /* the head's wait runs out */
    rv_lease_send(big, 10, MiB, 500);
    cr_assert_eq(wait_status(&d, "counters.lease_waits", 1, 5000), 1);
    rv_lease_send(small, 20, 64 * KiB, 20000);
    cr_assert_eq(wait_status(&d, "counters.lease_waits", 2, 5000), 2);
    rv_expect_error(big, 5000, 10, ETIMEDOUT, NULL, 0, "the big head's wait");
    long t0 = now_ms();
    rv_expect(small, 10000, PROTO_OP_LEASE + PROTO_OP_REPLY, 20, &r, "the small lease behind it");
    cr_assert_lt(now_ms() - t0, 1500, "served %ld ms after the head timed out", now_ms() - t0);
    rv_release_send(small, 21, r.u.lease_reply.handle);

    /* the head's connection closes, holding nothing */
    rv_lease_send(big, 11, MiB, 30000);
    cr_assert_eq(wait_status(&d, "counters.lease_waits", 3, 5000), 3);
    rv_lease_send(small, 22, 64 * KiB, 20000);
    cr_assert_eq(wait_status(&d, "counters.lease_waits", 4, 5000), 4);
    rv_nothing(small, 200, "the small lease behind a big head");
    close(big);
    t0 = now_ms();
    rv_expect(small, 10000, PROTO_OP_LEASE + PROTO_OP_REPLY, 22, &r, "the small lease once the head went");
    cr_assert_lt(now_ms() - t0, 1500, "served %ld ms after the head's connection closed", now_ms() - t0);
    rv_release_send(small, 23, r.u.lease_reply.handle);
    rv_release_send(holder, 2, h);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    close(small);
    close(holder);
    daemon_stop(&d);
}
