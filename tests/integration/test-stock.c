/* SPDX-License-Identifier: MIT */
/* test-stock.c: the lease stock under the daemon's control (issue 17 item 4), through a
 * real shmrefd and real processes of two uids. libshmref marks its refills
 * (PROTO_LEASE_STOCK); the daemon serves them only from its stock reserve, beyond the
 * pool cap, within a per-uid cap and for small classes, and counts them per tenant.
 * Regression: an idle program of one uid with a full stock (SHMREF_STOCK raised) held
 * quota-sized stock inside the pool, and another uid's lease up to its quota failed
 * ENOSPC, with quotas that add up to more than the pool. The stock exists only on a
 * connection without a table (a connection with one leases from its uid's free lists), so
 * every connection here is made with SHMREF_TABLE=0 (stock_only, before each test). */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define MiB (UINT64_C(1) << 20)
#define A_UID 1000
#define B_UID 65534

static struct daemon d;
static int up[2], down[2];

static void stock_only(void)
{
    setenv("SHMREF_TABLE", "0", 1);
}

TestSuite(stock, .init = stock_only);

/* tenant_u64: tenants[].key of uid (0 if not listed). */
static uint64_t tenant_u64(uint32_t uid, const char *k)
{
    uint64_t n = status_u64(&d, "tenants_total");
    char path[64];
    for (uint64_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "tenants.%llu.uid", (unsigned long long)i);
        if (status_u64(&d, path) != uid)
            continue;
        snprintf(path, sizeof(path), "tenants.%llu.%s", (unsigned long long)i, k);
        return status_u64(&d, path);
    }
    return 0;
}

/* wait_tenant: uid's status value k once it is want (5 s at most); every value read on the
 * way must stay at most `most`. Returns the last value read. */
static uint64_t wait_tenant(uint32_t uid, const char *k, uint64_t want, uint64_t most)
{
    uint64_t v = tenant_u64(uid, k);
    for (long deadline = now_ms() + 5000; v != want && now_ms() < deadline; v = tenant_u64(uid, k)) {
        cr_assert_leq(v, most, "%s of uid %u: %llu, over %llu", k, (unsigned)uid, (unsigned long long)v,
                      (unsigned long long)most);
        usleep(1000);
    }
    return v;
}

/* idle_stocker: uid A's program: SHMREF_STOCK=8, one lease of each of two sizes (its
 * stock learns each class and fills it: 8 x 4 MiB fit its quota), all released; then it
 * sits idle, holding its stock, until told to go. */
static int idle_stocker(void *arg)
{
    (void)arg;
    close(up[0]);
    close(down[1]);
    if (setgid(B_UID) < 0 || setuid(A_UID) < 0)
        return 100;
    setenv("SHMREF_STOCK", "8", 1);
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    const size_t sizes[] = { 64 << 10, 4 << 20 };
    for (int i = 0; i < 2; i++) {
        shmref_buf *b;
        if (shmref_lease(c, sizes[i], &b) < 0) {
            fprintf(stderr, "idle stocker's lease of %zu: %s\n", sizes[i], shmref_errmsg(c));
            return 102;
        }
        shmref_release(b);
    }
    if (shmref_ping(c) < 0 || shmref_ping(c) < 0) /* the refills are answered */
        return 103;
    if (write(up[1], "s", 1) != 1)
        return 104;
    char x;
    if (read(down[0], &x, 1) < 0)
        return 105;
    shmref_close(c);
    return 0;
}

/* b_leases_its_quota: uid B leases 40 MiB (its quota) in five 8 MiB leases, all held. */
static int b_leases_its_quota(void *arg)
{
    (void)arg;
    if (setgid(B_UID) < 0 || setuid(B_UID) < 0)
        return 100;
    shmref_conn *c;
    shmref_buf *b[5];
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    shmref_set_stock(c, 0);
    for (int i = 0; i < 5; i++) {
        int r = shmref_lease(c, 8 * MiB, &b[i]);
        if (r < 0) {
            fprintf(stderr, "uid B's lease %d of 5 (8 MiB): %s\n", i + 1, shmref_errmsg(c));
            return r == -ENOSPC ? 28 : r == -EDQUOT ? 122 : 102;
        }
        memset(shmref_buf_data(b[i]), 1, 8 * MiB);
    }
    shmref_close(c);
    return 0;
}

Test(stock, an_idle_programs_stock_never_fails_another_uids_lease, .timeout = 60)
{
    cr_assert_eq(geteuid(), 0, "another uid needs root, as in CI");
    /* Quotas that add up to more than the pool: 40 + 40 > 64. */
    daemon_start(&d, "--pool-size", "64M", "--tenant-quota", "40M", "--pool-hugepages", "no",
                 "--socket-mode", "0666", NULL);
    cr_assert_eq(pipe(up), 0);
    cr_assert_eq(pipe(down), 0);
    pid_t pid = child_run(idle_stocker, NULL);
    close(up[1]);
    close(down[0]);
    char x;
    cr_assert_eq(read(up[0], &x, 1), 1, "the idle stocker failed: exit %d", child_wait(pid));
    uint64_t reserve = status_u64(&d, "pool.stock_reserve"), stock = tenant_u64(A_UID, "stock");
    fprintf(stderr, "uid A idle with its stock: %llu bytes of stock (reserve %llu), %llu bytes held, "
            "stock leases %llu, refused %llu\n", (unsigned long long)stock, (unsigned long long)reserve,
            (unsigned long long)tenant_u64(A_UID, "bytes"), (unsigned long long)status_u64(&d, "counters.stock_leases"),
            (unsigned long long)status_u64(&d, "counters.stock_refused"));
    cr_expect_eq(reserve, 4 * MiB, "pool-size/16");
    cr_expect_gt(stock, 0, "the small classes are stocked");
    cr_expect_leq(stock, 1 * MiB, "at most the per-uid stock cap (a quarter of the reserve)");
    cr_expect_eq(status_u64(&d, "pool.bytes_stock"), stock);
    cr_expect_gt(status_u64(&d, "counters.stock_refused"), 0, "the large classes' refills were refused");

    int r = child_wait(child_run(b_leases_its_quota, NULL));
    cr_expect_eq(r, 0, "uid B's leases up to its quota failed (28: ENOSPC) while uid A idled with its stock");

    cr_assert_eq(write(down[1], "x", 1), 1);
    cr_assert_eq(child_wait(pid), 0);
    cr_expect_eq(wait_status(&d, "pool.bytes_stock", 0, 5000), 0, "the stock went back at close");
    cr_expect_eq(tenant_u64(A_UID, "stock"), 0);
    close(up[0]);
    close(down[1]);
    daemon_stop(&d);
}

/* A stock lease that a caller takes and publishes becomes an ordinary lease: it leaves the
 * reserve (so the reserve is never a way past the cap), and a refill takes its place. */
Test(stock, a_published_stock_lease_leaves_the_reserve, .timeout = 60)
{
    daemon_start(&d, "--pool-size", "64M", "--pool-hugepages", "no", NULL);
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(c, 2), 0);
    shmref_buf *b, *b2;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 100000, &b), 0, "%s", shmref_errmsg(c)); /* a miss: refills 2 */
    cr_assert_eq(shmref_ping(c), 0);
    uint64_t one = status_u64(&d, "pool.bytes_stock");
    cr_assert_gt(one, 0);
    cr_assert_eq(one % 2, 0);
    cr_assert_eq(shmref_lease(c, 100000, &b2), 0); /* from the stock: the daemon still counts it as stock */
    cr_assert_eq(shmref_publish(b2, 100000, 0, NULL, 0, &desc), 0);
    cr_assert_eq(shmref_ping(c), 0);
    cr_expect_eq(status_u64(&d, "pool.bytes_stock"), one, "published: out of the reserve; a refill in");
    cr_expect_eq(tenant_u64(0, "stock"), one);
    cr_assert_eq(shmref_release(b2), 0);
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);
    cr_expect_eq(wait_status(&d, "pool.bytes_stock", 0, 5000), 0);
    daemon_stop(&d);
}

/* Stock leases past the uid's stock cap are refused (EAGAIN, counted, the client leases
 * plainly); what fits is stocked. */
Test(stock, stock_leases_are_bounded_per_uid, .timeout = 60)
{
    daemon_start(&d, "--pool-size", "64M", "--pool-hugepages", "no", "--stock-per-uid", "512K", NULL);
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(c, 4), 0);
    shmref_buf *b, *b2;
    cr_assert_eq(shmref_lease(c, 64 << 10, &b), 0, "%s", shmref_errmsg(c)); /* 4 x 64 KiB refills fit */
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_lease(c, 256 << 10, &b2), 0, "%s", shmref_errmsg(c)); /* 4 x 256 KiB do not */
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_ping(c), 0);
    /* A refused batch's items being made count until they are undone: read until they are,
     * never above the cap on the way. */
    cr_expect_eq(wait_tenant(0, "stock", 256 << 10, 512 << 10), 256 << 10,
                 "the 64 KiB class only: within the 512 KiB cap");
    cr_expect_gt(status_u64(&d, "counters.stock_refused"), 0);
    cr_expect_eq(status_u64(&d, "counters.refused_other"), 0, "a stock refusal is no refusal of a caller");
    shmref_buf *b3;
    cr_assert_eq(shmref_lease(c, 256 << 10, &b3), 0, "a caller's lease of the unstocked class: %s",
                 shmref_errmsg(c));
    cr_assert_eq(shmref_release(b3), 0);
    cr_assert_eq(shmref_release(b2), 0);
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);
    daemon_stop(&d);
}
