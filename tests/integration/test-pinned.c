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
 * (libshmref unmaps at close and says forget). */
Test(pinned, a_warm_buffer_still_mapped_is_pinned_until_the_last_mapping_goes)
{
    daemon_start(&d, "--pool-size", "64M", NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b, *r;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 4 * MiB, &b), 0);
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
    daemon_stop(&d);
}
