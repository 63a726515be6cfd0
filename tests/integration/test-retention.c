/* SPDX-License-Identifier: MIT */
/* test-retention.c: retention never fills its own tenant's quota, through a real shmrefd
 * on a temporary socket and real processes of two uids: a tenant that publishes with
 * retention in a loop while nobody acquires keeps leasing (its oldest retained buffers
 * that nobody holds are reclaimed first), and another tenant's retained buffers are never
 * reclaimed for it; a lease that would not fit even then reclaims nothing. */
#include <criterion/criterion.h>

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "rawv2.h"

TestSuite(retention, .fini = reap_children);

#define KiB (UINT64_C(1) << 10)
#define ROUNDS 200

static void publish_keep(int fd, uint32_t id, uint64_t handle, uint64_t size, uint32_t keep_ms)
{
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = id };
    m.u.publish.handle = handle;
    m.u.publish.size = size;
    m.u.publish.keep_ms = keep_ms;
    m.u.publish.flags = PROTO_PUBLISH_NOREPLY;
    rv_send(fd, &m);
}

struct looper {
    const char *socket;
    int out[2];                  /* the first and the last token published */
};

/* uid 65534, quota 1 MiB: ROUNDS leases of 256 KiB, each published with a 60 s
 * retention and released; nobody acquires. Every lease must be granted at once. */
static int looper(void *arg)
{
    struct looper *k = arg;
    static uint8_t buf[PROTO_MAX_REPLY];
    uint8_t first[PROTO_TOKEN_LEN], last[PROTO_TOKEN_LEN];
    close(k->out[0]);
    if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
        return 10;
    int fd = rawclient_connect(k->socket);
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
    m.u.hello.version = PROTO_VERSION;
    const char *why;
    int n = proto_encode(&m, buf, sizeof(buf));
    ssize_t got = rawclient_call(fd, buf, (size_t)n, buf, sizeof(buf), 5000);
    if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0 || r.op != PROTO_OP_HELLO + PROTO_OP_REPLY)
        return 11;
    for (uint32_t i = 0; i < ROUNDS; i++) {
        m = (struct proto_msg){ .op = PROTO_OP_LEASE, .id = 10 + 3 * i };
        m.u.lease.size = 256 * KiB;
        n = proto_encode(&m, buf, sizeof(buf));
        got = rawclient_call(fd, buf, (size_t)n, buf, sizeof(buf), 5000);
        if (got <= 0 || proto_decode(buf, (size_t)got, sizeof(buf), &r, &why) < 0)
            return 12;
        if (r.op != PROTO_OP_LEASE + PROTO_OP_REPLY) {
            fprintf(stderr, "lease %u of uid 65534: %d %.*s\n", i, r.u.error.code, (int)r.u.error.msg_len,
                    r.u.error.msg);
            return 13;
        }
        uint64_t h = r.u.lease_reply.handle;
        memcpy(i == 0 ? first : last, r.u.lease_reply.token, PROTO_TOKEN_LEN);
        m = (struct proto_msg){ .op = PROTO_OP_PUBLISH, .id = 11 + 3 * i };
        m.u.publish.handle = h;
        m.u.publish.size = 100;
        m.u.publish.keep_ms = 60000;
        m.u.publish.flags = PROTO_PUBLISH_NOREPLY;
        n = proto_encode(&m, buf, sizeof(buf));
        if (rawclient_send(fd, buf, (size_t)n) < 0)
            return 14;
        m = (struct proto_msg){ .op = PROTO_OP_RELEASE, .id = 12 + 3 * i };
        m.u.release.handle = h;
        m.u.release.flags = PROTO_RELEASE_NOREPLY;
        n = proto_encode(&m, buf, sizeof(buf));
        if (rawclient_send(fd, buf, (size_t)n) < 0)
            return 15;
    }
    if (write(k->out[1], first, sizeof(first)) != (ssize_t)sizeof(first) ||
        write(k->out[1], last, sizeof(last)) != (ssize_t)sizeof(last))
        return 16;
    close(fd);
    return 0;
}

Test(retention, never_fills_its_own_tenants_quota_nor_takes_anothers, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "1M", "--socket-mode", "0666", NULL);
    /* root retains 2 buffers of its own (half its quota) that nobody holds */
    int fd = rv_connect(&d, 0);
    uint8_t mine[2][PROTO_TOKEN_LEN];
    for (uint32_t i = 0; i < 2; i++) {
        uint64_t h = rv_lease(fd, 2 + 3 * i, 256 * KiB, mine[i]);
        publish_keep(fd, 3 + 3 * i, h, 100, 60000);
        rv_release_send(fd, 4 + 3 * i, h);
    }
    struct looper k = { .socket = d.socket };
    cr_assert_eq(pipe(k.out), 0);
    pid_t pid = child_run(looper, &k);
    close(k.out[1]);
    cr_assert_eq(child_wait(pid), 0, "uid 65534's leases failed (see its line above)");
    uint8_t first[PROTO_TOKEN_LEN], last[PROTO_TOKEN_LEN];
    cr_assert_eq(read(k.out[0], first, sizeof(first)), (ssize_t)sizeof(first));
    cr_assert_eq(read(k.out[0], last, sizeof(last)), (ssize_t)sizeof(last));
    uint64_t reclaimed = status_u64(&d, "buffers.reclaimed");
    cr_assert_geq(reclaimed, ROUNDS - 4, "only %llu retentions reclaimed", (unsigned long long)reclaimed);
    cr_assert_eq(status_u64(&d, "counters.refused_quota"), 0);
    /* the newest of 65534's retained buffers is still there, its oldest was reclaimed */
    struct proto_msg r;
    rv_acquire_send(fd, 20, last, 0);
    rv_expect(fd, 5000, PROTO_OP_ACQUIRE + PROTO_OP_REPLY, 20, &r, "the newest retained buffer of uid 65534");
    rv_release_send(fd, 21, r.u.acquire_reply.handle);
    rv_acquire_send(fd, 22, first, 0);
    rv_expect_error(fd, 5000, 22, ENOENT, NULL, 0, "the oldest retained buffer of uid 65534");
    /* a lease that cannot fit even then reclaims nothing: refused, root's retention kept */
    rv_lease_send(fd, 40, 2048 * KiB, 0); /* root holds 512 KiB retained of its 1 MiB */
    rv_expect_error(fd, 5000, 40, EDQUOT, NULL, 0, "a lease beyond what reclaiming could free");
    /* root's retained buffers were never reclaimed for uid 65534 (nor for that lease) */
    for (uint32_t i = 0; i < 2; i++) {
        rv_acquire_send(fd, 30 + 2 * i, mine[i], 0);
        rv_expect(fd, 5000, PROTO_OP_ACQUIRE + PROTO_OP_REPLY, 30 + 2 * i, &r, "root's retained buffer");
        rv_release_send(fd, 31 + 2 * i, r.u.acquire_reply.handle);
    }
    close(fd);
    daemon_stop(&d);
}

/* ---- a lease refused for quota costs its own tenant's buffers, not everyone's ---- */

#define FLOOD 20000
#define MANY 8000

/* daemon_cpu_ticks: the daemon's user + system time so far, in clock ticks. */
static long daemon_cpu_ticks(const struct daemon *d)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)d->pid);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    cr_assert(p);
    unsigned long ut = 0, st = 0;
    /* after the comm: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    cr_assert_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
    return (long)(ut + st);
}

struct flooder {
    const char *socket;
    int ready[2], go[2];
};

/* uid 65534 fills its quota with one lease, says so, then (at each byte on go) sends FLOOD
 * leases of 4 KiB that must all be refused EDQUOT, and says so again. */
static int flooder(void *arg)
{
    struct flooder *f = arg;
    close(f->ready[0]);
    close(f->go[1]);
    if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
        return 10;
    shmref_conn *c;
    shmref_buf *all, *b;
    if (shmref_connect(f->socket, &c) < 0 || shmref_set_stock(c, 0) < 0 || shmref_lease(c, 64 << 20, &all) < 0)
        return 11;
    char x = 0;
    while (write(f->ready[1], &x, 1) == 1 && read(f->go[0], &x, 1) == 1) {
        for (int i = 0; i < FLOOD; i++)
            if (shmref_lease(c, 4096, &b) != -EDQUOT)
                return 12;
    }
    shmref_close(c);
    return 0;
}

static long flood_ticks(const struct daemon *d, struct flooder *f)
{
    char x = 0;
    long t0 = daemon_cpu_ticks(d);
    cr_assert_eq(write(f->go[1], &x, 1), 1);
    cr_assert_eq(read(f->ready[0], &x, 1), 1, "the flooder failed");
    return daemon_cpu_ticks(d) - t0;
}

Test(retention, a_lease_refused_for_quota_reads_only_its_own_tenants_buffers, .timeout = 300)
{
    /* Every non-waiting lease refused for quota asks what its tenant's retentions could
     * free (registry_reclaimable). Before, that walked every live buffer of every tenant:
     * a tenant at its quota flooding leases made the daemon read all of them per lease. */
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "64M", "--pool-size", "256M", "--socket-mode", "0666", NULL);
    struct flooder f = { .socket = d.socket };
    cr_assert_eq(pipe(f.ready), 0);
    cr_assert_eq(pipe(f.go), 0);
    pid_t pid = child_run(flooder, &f);
    close(f.ready[1]);
    close(f.go[0]);
    char x;
    cr_assert_eq(read(f.ready[0], &x, 1), 1, "uid 65534 could not fill its quota");
    /* root: MANY live buffers (two connections: --max-leases 4096 each) or none, in turn,
     * three times; the least of each kind is compared (CPU time on a busy machine is
     * inflated by whatever runs beside: the least is the flood's own cost) */
    shmref_conn *c[2] = { connect_ok(&d), connect_ok(&d) };
    static shmref_buf *held[MANY];
    long few = -1, many = -1;
    for (int round = 0; round < 3; round++) {
        long t = flood_ticks(&d, &f);
        few = few < 0 || t < few ? t : few;
        for (int i = 0; i < MANY; i++)
            cr_assert_eq(shmref_lease(c[i % 2], 4096, &held[i]), 0, "lease %d: %s", i, shmref_errmsg(c[i % 2]));
        t = flood_ticks(&d, &f);
        many = many < 0 || t < many ? t : many;
        for (int i = 0; i < MANY; i++)
            shmref_release(held[i]);
    }
    printf("a flood of %d leases refused for quota: %ld daemon ticks beside 0 other buffers, %ld beside %d "
           "(the least of 3 each)\n", FLOOD, few, many, MANY);
    cr_assert_leq(many, 2 * few + 10, "%d leases refused for quota cost the daemon %ld ticks beside %d other "
                  "buffers, %ld beside none", FLOOD, many, MANY, few);
    close(f.go[1]);
    cr_assert_eq(child_wait(pid), 0);
    shmref_close(c[0]);
    shmref_close(c[1]);
    daemon_stop(&d);
}
