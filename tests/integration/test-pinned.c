/* SPDX-License-Identifier: MIT */
/* test-pinned.c: bytes that a client's mappings keep alive after the buffer went back to
 * the pool (warm, or retired) are charged to that client's tenant as "pinned", count
 * against the pool, and are shown in status, until its process unmaps them or exits.
 * Regression (issue 8 item 4): a client that leased buffers of changing sizes, kept each
 * mapping and released, filled the daemon's private tmpfs with bytes_leased 0, and
 * another uid's lease into the empty pool got ENOSPC. */
#include <criterion/criterion.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "proto.h"
#include "rawclient.h"

#define WAIT_MS 5000
#define MiB (UINT64_C(1) << 20)
#define HOG_UID 1000
#define OTHER_UID 65534

static struct daemon d;
static int up[2], down[2];

static int raw_request(int sock, const struct proto_msg *m, struct proto_msg *rep, uint8_t *buf, size_t cap,
                       int *ret_fd)
{
    const char *why = "";
    int len = proto_encode(m, buf, cap);
    if (len <= 0 || rawclient_send(sock, buf, (size_t)len) < 0)
        return -EIO;
    struct pollfd p = { .fd = sock, .events = POLLIN };
    if (poll(&p, 1, WAIT_MS) <= 0)
        return -ETIMEDOUT;
    ssize_t n = rawclient_recv(sock, buf, cap, ret_fd);
    if (n <= 0 || proto_decode(buf, (size_t)n, PROTO_MAX_REPLY, rep, &why) < 0)
        return -EPROTO;
    return 0;
}

/* hog: a client of HOG_UID that speaks FD_ONCE (so it says forget when it unmaps: it
 * never does), leases ten buffers of five sizes in turn, maps each, keeps every mapping,
 * releases. Reports how many leases were refused EDQUOT with "pinned" in the message,
 * then holds its mappings until told to go. */
static int hog(void *arg)
{
    (void)arg;
    static uint8_t buf[4096];
    close(up[0]);
    close(down[1]); /* a test that fails is an EOF here, not a hang */
    if (setgid(OTHER_UID) < 0 || setuid(HOG_UID) < 0)
        return 100;
    int sock = rawclient_connect(d.socket);
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, rep;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.features = PROTO_FEAT_FD_ONCE;
    m.u.hello.name = "hog";
    m.u.hello.name_len = 3;
    if (sock < 0 || raw_request(sock, &m, &rep, buf, sizeof(buf), NULL) < 0)
        return 101;
    const uint64_t sizes[] = { 16 * MiB, 20 * MiB, 24 * MiB, 28 * MiB, 32 * MiB };
    uint8_t refused = 0;
    for (int i = 0; i < 10; i++) {
        int fd = -1;
        m = (struct proto_msg){ .op = PROTO_OP_LEASE, .id = 2 };
        m.u.lease.size = sizes[i % 5];
        if (raw_request(sock, &m, &rep, buf, sizeof(buf), &fd) < 0)
            return 102;
        if (rep.op == PROTO_OP_ERROR) {
            refused += rep.u.error.code == EDQUOT && memmem(rep.u.error.msg, rep.u.error.msg_len, "pinned", 6);
            continue;
        }
        if (fd >= 0) {
            void *p = mmap(NULL, rep.u.lease_reply.capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED)
                return 103;
            memset(p, 1, 4096);
            close(fd); /* the mapping stays */
        }
        m = (struct proto_msg){ .op = PROTO_OP_RELEASE, .id = 3 };
        m.u.release.handle = rep.u.lease_reply.handle;
        if (raw_request(sock, &m, &rep, buf, sizeof(buf), NULL) < 0 || rep.op == PROTO_OP_ERROR)
            return 104;
    }
    if (write(up[1], &refused, 1) != 1)
        return 105;
    char c;
    if (read(down[0], &c, 1) != 1)
        return 106;
    return 0; /* exiting unmaps everything */
}

static int other_leases(void *arg)
{
    (void)arg;
    shmref_conn *c;
    shmref_buf *b;
    if (setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0)
        return 100;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    int r = shmref_lease(c, 32 * MiB, &b);
    if (r < 0) {
        fprintf(stderr, "other uid's lease: %s\n", shmref_errmsg(c));
        return r == -ENOSPC ? 28 : 102;
    }
    memset(shmref_buf_data(b), 2, 32 * MiB);
    shmref_close(c);
    return 0;
}

/* tenant_pinned: tenants[].pinned of uid (0 if not listed). */
static uint64_t tenant_pinned(uint32_t uid)
{
    uint64_t n = status_u64(&d, "tenants_total");
    char path[64];
    for (uint64_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "tenants.%llu.uid", (unsigned long long)i);
        if (status_u64(&d, path) != uid)
            continue;
        snprintf(path, sizeof(path), "tenants.%llu.pinned", (unsigned long long)i);
        return status_u64(&d, path);
    }
    return 0;
}

Test(pinned, mappings_kept_after_release_are_charged_to_their_tenant)
{
    cr_assert_eq(geteuid(), 0, "the private tmpfs (the kernel's cap) needs root, as in CI");
    daemon_start(&d, "--pool-size", "64M", "--tenant-quota", "32M", "--pool-hugepages", "yes",
                 "--socket-mode", "0666", NULL);
    cr_assert_eq(pipe(up), 0);
    cr_assert_eq(pipe(down), 0);
    pid_t pid = child_run(hog, NULL);
    close(up[1]); /* a hog that dies is an EOF here, not a hang */
    close(down[0]);
    uint8_t refused = 0;
    cr_assert_eq(read(up[0], &refused, 1), 1, "the hog failed: exit %d", child_wait(pid));
    cr_expect_geq(refused, 1, "the hog's pinned bytes were never charged to it");
    cr_expect_eq(status_u64(&d, "pool.bytes_leased"), 0);
    cr_expect_eq(status_u64(&d, "pool.bytes_pinned"), 16 * MiB, "its first buffer, warm and mapped");
    cr_expect_eq(tenant_pinned(HOG_UID), 16 * MiB);

    cr_expect_eq(child_wait(child_run(other_leases, NULL)), 0,
                 "another uid's lease into a pool that holds nothing was refused");

    cr_assert_eq(write(down[1], "x", 1), 1);
    cr_assert_eq(child_wait(pid), 0);
    cr_expect_eq(wait_status(&d, "pool.bytes_pinned", 0, WAIT_MS), 0, "the hog exited: nothing is pinned");
    cr_expect_eq(tenant_pinned(HOG_UID), 0);
    daemon_stop(&d);
}

/* Two connections of one tenant keep their (cached) mappings of a buffer after both
 * released it: it is warm, pinned once for the tenant, until the last mapping goes
 * (libshmref unmaps at close and says forget).
 * A buffer goes back to the pool warm at its release when it was leased by
 * shmref_lease_many (a shmref_lease's joins the uid's table instead): that is the pool's
 * pinning. With the default path, the released buffer is in the table, charged to its
 * uid as the table's (pool.bytes_tables), not pinned; when the uid's last connection
 * closes it is back in the pool, warm, and no mapping pins it. */
Test(pinned, a_warm_buffer_still_mapped_is_pinned_until_the_last_mapping_goes)
{
    daemon_start(&d, "--pool-size", "64M", NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b, *r;
    shmref_desc desc;
    const size_t size = 4 * MiB;
    cr_assert_eq(shmref_lease_many(c, &size, 1, &b), 0);
    cr_assert_eq(shmref_publish(b, 4 * MiB, 0, NULL, 0, &desc), 0);
    shmref_conn *c2 = connect_ok(&d);
    cr_assert_eq(shmref_acquire(c2, &desc, &r), 0);
    cr_assert_eq(shmref_release(r), 0); /* c2's cache keeps the read-only mapping */
    cr_assert_eq(shmref_release(b), 0); /* c's cache keeps the writable one */
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_ping(c2), 0);
    cr_expect_eq(status_u64(&d, "pool.bytes_pinned"), 4 * MiB, "warm, and mapped by two connections");
    cr_expect_eq(tenant_pinned(0), 4 * MiB, "counted once per tenant");
    shmref_close(c2);
    cr_expect_eq(wait_status(&d, "pool.bytes_pinned", 4 * MiB, WAIT_MS), 4 * MiB, "c still maps it");
    shmref_close(c);
    cr_expect_eq(wait_status(&d, "pool.bytes_pinned", 0, WAIT_MS), 0);
    cr_expect_eq(tenant_pinned(0), 0);

    /* the default path: the buffer joins the table, not the pool */
    c = connect_ok(&d);
    c2 = connect_ok(&d);
    cr_assert_eq(shmref_lease(c, 4 * MiB, &b), 0);
    cr_assert_eq(shmref_publish(b, 4 * MiB, 0, NULL, 0, &desc), 0);
    cr_assert_eq(shmref_acquire(c2, &desc, &r), 0);
    cr_assert_eq(shmref_release(r), 0);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_ping(c2), 0);
    cr_expect_eq(status_u64(&d, "pool.bytes_tables"), 4 * MiB, "free in the uid's table, charged to it");
    cr_expect_eq(status_u64(&d, "pool.bytes_leased"), 0);
    cr_expect_eq(status_u64(&d, "pool.bytes_warm"), 0);
    cr_expect_eq(status_u64(&d, "pool.bytes_pinned"), 0, "a table's buffer is not pinned: it is the table's");
    cr_expect_eq(tenant_pinned(0), 0);
    shmref_close(c2);
    shmref_close(c);
    cr_expect_eq(wait_status(&d, "pool.bytes_warm", 4 * MiB, WAIT_MS), 4 * MiB, "the table went back to the pool");
    cr_expect_eq(status_u64(&d, "pool.bytes_tables"), 0);
    cr_expect_eq(wait_status(&d, "pool.bytes_pinned", 0, WAIT_MS), 0, "the mappings went with the connections");
    cr_expect_eq(tenant_pinned(0), 0);
    daemon_stop(&d);
}

/* ---- issue 17 item 1: stale mappings of retired buffers pin nothing ---------------- */

#define ROUNDS 8
#define ROUND_SIZE (32 * MiB)

static int st_up[2], st_down[2];

/* shmem_kib: Shmem of /proc/meminfo (every tmpfs and memfd page on the machine). */
static uint64_t shmem_kib(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long v = 0;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "Shmem: %llu kB", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

/* stale_keeper: a client of HOG_UID that, each round, connects, acquires the descriptor
 * its parent sends, maps the buffer, reads every page, closes its connection and keeps
 * the mapping (as a hostile or careless process would). After the last round it reports
 * how many of its mapped pages are still resident (mincore), then waits to be told to go
 * (holding every mapping). */
static int stale_keeper(void *arg)
{
    (void)arg;
    static uint8_t buf[4096];
    static volatile uint8_t *maps[ROUNDS];
    close(st_up[0]);
    close(st_down[1]);
    if (setgid(OTHER_UID) < 0 || setuid(HOG_UID) < 0)
        return 100;
    for (int i = 0; i < ROUNDS; i++) {
        shmref_desc desc;
        if (read(st_down[0], &desc, sizeof(desc)) != sizeof(desc))
            return 101;
        int sock = rawclient_connect(d.socket), fd = -1;
        struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, rep;
        m.u.hello.version = PROTO_VERSION;
        m.u.hello.name = "keeper";
        m.u.hello.name_len = 6;
        if (sock < 0 || raw_request(sock, &m, &rep, buf, sizeof(buf), NULL) < 0)
            return 102;
        m = (struct proto_msg){ .op = PROTO_OP_ACQUIRE, .id = 2 };
        memcpy(m.u.acquire.token, desc.token, PROTO_TOKEN_LEN);
        if (raw_request(sock, &m, &rep, buf, sizeof(buf), &fd) < 0 || rep.op != PROTO_OP_ACQUIRE + PROTO_OP_REPLY ||
            fd < 0)
            return 103;
        maps[i] = mmap(NULL, ROUND_SIZE, PROT_READ, MAP_SHARED, fd, 0);
        if (maps[i] == MAP_FAILED)
            return 104;
        unsigned sum = 0;
        for (uint64_t off = 0; off < ROUND_SIZE; off += 4096)
            sum += maps[i][off];
        if (sum != (ROUND_SIZE / 4096) * 5u)
            return 105;
        close(fd);
        close(sock); /* its handle is released; its mapping stays */
        if (write(st_up[1], "r", 1) != 1)
            return 106;
    }
    /* (mincore cannot tell: for a file the caller may not write, it says every page is
     * resident.) The machine's Shmem tells. */
    uint64_t resident = 0;
    if (write(st_up[1], &resident, sizeof(resident)) != sizeof(resident))
        return 108;
    char c;
    if (read(st_down[0], &c, 1) < 0)
        return 109;
    return 0;
}

static int other_leases_48m(void *arg)
{
    (void)arg;
    shmref_conn *c;
    shmref_buf *b;
    if (setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0)
        return 100;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    int r = shmref_lease(c, 48 * MiB, &b);
    if (r < 0) {
        fprintf(stderr, "other uid's 48 MiB lease: %s\n", shmref_errmsg(c));
        return r == -ENOSPC ? 28 : 102;
    }
    memset(shmref_buf_data(b), 2, 48 * MiB);
    shmref_close(c);
    return 0;
}

/* rounds_of_stale_mappings: ROUNDS buffers of 32 MiB published by this process (root),
 * each acquired by the keeper (another uid), which keeps its mapping after closing its
 * connection; then released here: retired (another tenant mapped it). The machine's
 * Shmem must not grow by what the keeper keeps mapped (it grew 352 MiB over 8 rounds
 * before issue 17), the keeper's mappings hold no page, nothing is pinned, and another
 * uid's 48 MiB lease into the 64 MiB pool succeeds. */
static void rounds_of_stale_mappings(const char *mode, const char *a1, const char *a2)
{
    daemon_start(&d, "--pool-size", "64M", "--tenant-quota", "56M", "--socket-mode", "0666", a1, a2, NULL);
    cr_assert_eq(pipe(st_up), 0);
    cr_assert_eq(pipe(st_down), 0);
    pid_t pid = child_run(stale_keeper, NULL);
    close(st_up[1]);
    close(st_down[0]);
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(c, 0), 0);
    uint64_t before = shmem_kib();
    for (int i = 0; i < ROUNDS; i++) {
        shmref_buf *b;
        shmref_desc desc;
        cr_assert_eq(shmref_lease(c, ROUND_SIZE, &b), 0, "%s round %d: %s", mode, i, shmref_errmsg(c));
        memset(shmref_buf_data(b), 5, ROUND_SIZE);
        cr_assert_eq(shmref_publish(b, ROUND_SIZE, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(c));
        cr_assert_eq(write(st_down[1], &desc, sizeof(desc)), (ssize_t)sizeof(desc));
        char x;
        cr_assert_eq(read(st_up[0], &x, 1), 1, "%s round %d: the keeper failed: exit %d", mode, i, child_wait(pid));
        cr_assert_eq(shmref_release(b), 0);
        cr_assert_eq(shmref_ping(c), 0);
    }
    uint64_t resident = UINT64_MAX;
    cr_assert_eq(read(st_up[0], &resident, sizeof(resident)), (ssize_t)sizeof(resident), "exit %d",
                 child_wait(pid));
    uint64_t after = shmem_kib();
    int64_t grew = (int64_t)after - (int64_t)before;
    fprintf(stderr, "%s: %d rounds of %u MiB kept mapped by another uid: Shmem %+lld KiB, %llu pages resident in "
            "its mappings (unknown), pool.bytes_pinned %llu\n", mode, ROUNDS, (unsigned)(ROUND_SIZE / MiB), (long long)grew,
            (unsigned long long)resident, (unsigned long long)status_u64(&d, "pool.bytes_pinned"));
    cr_expect_eq(status_u64(&d, "counters.buffers_emptied_mapped"), ROUNDS, "%s", mode);
    cr_expect_eq(status_u64(&d, "counters.buffers_empty_failed"), 0, "%s", mode);
    cr_expect_eq(status_u64(&d, "pool.bytes_pinned"), 0, "%s", mode);
    cr_expect_eq(tenant_pinned(HOG_UID), 0, "%s", mode);
    /* 8 x 32 MiB kept would be +256 MiB; the pool itself may hold 64 MiB more (warm). The
     * machine is shared, so a margin for others' pages. */
    cr_expect_lt(grew, 128 * 1024, "%s: Shmem grew %lld KiB over %d rounds", mode, (long long)grew, ROUNDS);
    cr_expect_eq(child_wait(child_run(other_leases_48m, NULL)), 0,
                 "%s: another uid's 48 MiB lease into a pool that holds nothing was refused", mode);
    cr_assert_eq(write(st_down[1], "x", 1), 1);
    cr_assert_eq(child_wait(pid), 0);
    close(st_up[0]);
    close(st_down[1]);
    shmref_close(c);
    daemon_stop(&d);
}

Test(pinned, stale_mappings_of_retired_buffers_pin_nothing_tmpfile, .timeout = 120)
{
    cr_assert_eq(geteuid(), 0, "another uid needs root, as in CI");
    rounds_of_stale_mappings("tmpfile", "--pool-hugepages", "no");
}

Test(pinned, stale_mappings_of_retired_buffers_pin_nothing_memfd, .timeout = 120)
{
    cr_assert_eq(geteuid(), 0, "another uid needs root, as in CI");
    rounds_of_stale_mappings("memfd", "--memfd", NULL);
}

Test(pinned, stale_mappings_of_retired_buffers_pin_nothing_hugepages, .timeout = 120)
{
    cr_assert_eq(geteuid(), 0, "the private tmpfs needs root, as in CI");
    rounds_of_stale_mappings("tmpfile-hugepages", "--pool-hugepages", "yes");
}
