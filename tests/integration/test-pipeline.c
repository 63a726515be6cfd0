/* SPDX-License-Identifier: MIT */
/* test-pipeline: one round trip per handoff (issue 12), against a real shmrefd: the
 * one-way publish and the acquire that waits for it (another process, 1000 times), the
 * waits a zero-copy handoff costs (counters), the lease stock (charged, returned, LRU),
 * the local re-acquire and why it is safe, backpressure, lease_many/release_many as one
 * message per 32. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static uint64_t counter(shmref_conn *c, const char *name)
{
    uint64_t v = 0;
    cr_assert_eq(shmref_conn_counter(c, name, &v), 0, "counter %s", name);
    return v;
}

/* leases_settle: buffers.leases after a round trip on c (so c's one-way messages and
 * kept refills are in), read again until it is want (5 s at most): a lease whose buffer
 * the daemon is still making (in its thread pool) is counted when made, and the ping's
 * reply does not wait for that. Returns the last value read. */
static uint64_t leases_settle(const struct daemon *d, shmref_conn *c, uint64_t want)
{
    cr_assert_eq(shmref_ping(c), 0);
    uint64_t v = status_u64(d, "buffers.leases");
    for (long deadline = now_ms() + 5000; v != want && now_ms() < deadline; v = status_u64(d, "buffers.leases"))
        usleep(1000);
    return v;
}

/* ---- a one-way publish, a consumer in another process that never sees ENOENT ---- */

struct relay {
    const char *socket;
    int desc_rd, ack_wr;
    int n;
};

static int consumer(void *arg)
{
    struct relay *rl = arg;
    shmref_conn *c;
    if (shmref_connect(rl->socket, &c) < 0)
        return 10;
    for (int i = 0; i < rl->n; i++) {
        shmref_desc desc;
        if (read(rl->desc_rd, &desc, sizeof(desc)) != (ssize_t)sizeof(desc))
            return 11;
        shmref_buf *b;
        int r = shmref_acquire(c, &desc, &b);
        if (r < 0) {
            fprintf(stderr, "handoff %d: acquire: %d %s\n", i, r, shmref_errmsg(c));
            return 12;
        }
        if (check_pattern(shmref_buf_data(b), shmref_buf_size(b), (uint32_t)i + 1) != -1)
            return 13;
        shmref_release(b);
        char ack = 1;
        if (write(rl->ack_wr, &ack, 1) != 1)
            return 14;
    }
    shmref_close(c);
    return 0;
}

Test(pipeline, one_way_publish_is_never_enoent_for_a_fast_consumer, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int dp[2], ap[2];
    cr_assert_eq(pipe(dp), 0);
    cr_assert_eq(pipe(ap), 0);
    struct relay rl = { .socket = d.socket, .desc_rd = dp[0], .ack_wr = ap[1], .n = 1000 };
    pid_t pid = child_run(consumer, &rl);
    close(dp[0]);
    close(ap[1]);
    shmref_conn *p = connect_ok(&d);
    uint64_t sent0 = counter(p, "sent");
    for (int i = 0; i < rl.n; i++) {
        shmref_buf *b;
        size_t size = 4096 + (size_t)(i % 7) * 1000;
        cr_assert_eq(shmref_lease(p, size, &b), 0, "%s", shmref_errmsg(p));
        fill_pattern(shmref_buf_data(b), size, (uint32_t)i + 1);
        uint64_t waits = counter(p, "waits");
        shmref_desc desc;
        cr_assert_eq(shmref_publish(b, size, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(p));
        cr_assert_eq(counter(p, "waits"), waits, "publish waited for the daemon");
        cr_assert_eq(desc.size, size);
        /* The descriptor goes out before the daemon has seen the publish. */
        cr_assert_eq(write(dp[1], &desc, sizeof(desc)), (ssize_t)sizeof(desc));
        char ack;
        cr_assert_eq(read(ap[0], &ack, 1), 1, "the consumer failed at handoff %d", i);
        shmref_release(b);
    }
    cr_assert_eq(child_wait(pid), 0);
    cr_assert_gt(counter(p, "sent"), sent0);
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(status_u64(&d, "counters.acquire_wait_timeouts"), 0);
    shmref_close(p);
    close(dp[1]);
    close(ap[0]);
    daemon_stop(&d);
}

/* ---- a zero-copy handoff waits once: the consumer's acquire ---- */

Test(pipeline, a_zero_copy_handoff_waits_once_with_a_warm_stock, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    /* The daemon's path with the stock, which serves only connections without a table
     * (SHMREF_TABLE=0 here; the table's path, where nothing waits or is sent at all, is
     * a_steady_table_handoff_sends_no_message below). */
    setenv("SHMREF_TABLE", "0", 1);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    unsetenv("SHMREF_TABLE");
    cr_assert_eq(shmref_set_stock(p, 2), 0);
    shmref_buf *b, *r;
    shmref_desc desc;
    /* Warm up: the first lease is a miss (a round trip) and fills the stock. */
    cr_assert_eq(shmref_lease(p, 8192, &b), 0);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(p), 0);
    uint64_t pw = counter(p, "waits"), cw = counter(c, "waits"), hits = counter(p, "stock_hits");
    enum { N = 200 };
    for (int i = 0; i < N; i++) {
        cr_assert_eq(shmref_lease(p, 8192, &b), 0, "%s", shmref_errmsg(p));
        fill_pattern(shmref_buf_data(b), 8192, (uint32_t)i);
        cr_assert_eq(shmref_publish(b, 8192, 0, NULL, 0, &desc), 0);
        cr_assert_eq(shmref_acquire(c, &desc, &r), 0, "%s", shmref_errmsg(c));
        cr_assert_eq(check_pattern(shmref_buf_data(r), 8192, (uint32_t)i), -1);
        cr_assert_eq(shmref_release(r), 0);
        cr_assert_eq(shmref_release(b), 0);
    }
    /* Zero, but for a refill not back in time on a loaded machine (the stock was empty
     * then: the lease waits for that refill): a few in 200 at most. */
    cr_assert_leq(counter(p, "waits") - pw, N / 20, "the producer waited %llu times",
                 (unsigned long long)(counter(p, "waits") - pw));
    /* At most once: a reply that is in before the library would block costs no wait. */
    cr_assert_leq(counter(c, "waits") - cw, N, "the consumer waited %llu times in %d handoffs",
                 (unsigned long long)(counter(c, "waits") - cw), N);
    cr_assert_geq(counter(p, "stock_hits") - hits, N - N / 20);
    cr_assert_eq(counter(p, "table_leases") + counter(c, "table_acquires"), 0);
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* The default path: with the table, a steady-state handoff (the lease popped from the
 * table, the publish made in it, the acquire of a buffer the consumer maps taken in it,
 * both releases given back in it) sends no message and waits for nothing. */
Test(pipeline, a_steady_table_handoff_sends_no_message, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(p, 2), 0); /* unused with a table */
    shmref_buf *b, *r;
    shmref_desc desc;
    /* Warm up: the first lease is the daemon's; its buffer joins the table at its end,
     * and c's acquire (through the daemon) maps it. */
    cr_assert_eq(shmref_lease(p, 8192, &b), 0);
    cr_assert_eq(shmref_publish(b, 8192, 0, NULL, 0, &desc), 0);
    cr_assert_eq(shmref_acquire(c, &desc, &r), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(r), 0);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(status_u64(&d, "table.lent"), 1, "in the table, free");
    uint64_t ps = counter(p, "sent"), cs = counter(c, "sent"), pw = counter(p, "waits"), cw = counter(c, "waits");
    uint64_t acquires = status_u64(&d, "counters.acquires");
    enum { N = 200 };
    for (int i = 0; i < N; i++) {
        cr_assert_eq(shmref_lease(p, 8192, &b), 0, "%s", shmref_errmsg(p));
        fill_pattern(shmref_buf_data(b), 8192, (uint32_t)i);
        cr_assert_eq(shmref_publish(b, 8192, 0, NULL, 0, &desc), 0);
        cr_assert_eq(shmref_acquire(c, &desc, &r), 0, "%s", shmref_errmsg(c));
        cr_assert_eq(check_pattern(shmref_buf_data(r), 8192, (uint32_t)i), -1);
        cr_assert_eq(shmref_release(r), 0);
        cr_assert_eq(shmref_release(b), 0);
    }
    cr_assert_eq(counter(p, "table_leases"), N);
    cr_assert_eq(counter(p, "table_publishes"), N);
    cr_assert_eq(counter(c, "table_acquires"), N);
    cr_assert_eq(counter(p, "sent"), ps, "the producer sent %llu messages",
                 (unsigned long long)(counter(p, "sent") - ps));
    cr_assert_eq(counter(c, "sent"), cs, "the consumer sent %llu messages",
                 (unsigned long long)(counter(c, "sent") - cs));
    cr_assert_eq(counter(p, "waits"), pw);
    cr_assert_eq(counter(c, "waits"), cw);
    cr_assert_eq(counter(p, "stock_hits") + counter(p, "stock_misses"), 0, "the stock is not used with a table");
    cr_assert_eq(status_u64(&d, "counters.acquires"), acquires, "the daemon served no acquire");
    cr_assert_eq(status_u64(&d, "table.lent"), 1, "the one buffer, free again");
    /* nothing of theirs is leased (the warm-up's daemon lease still learned its class for
     * the stock: its refills are the stock's, held as pool.bytes_stock) */
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), status_u64(&d, "pool.bytes_stock"));
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- the stock: charged like any lease, returned when unused ---- */

/* The stock serves only connections without a table: p is made with SHMREF_TABLE=0. With
 * a table (the default, q at the end) free buffers wait in the table instead: charged to
 * the uid as the table's, and returned to the pool when its last connection closes. */
Test(pipeline, the_stock_is_charged_and_returned, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    setenv("SHMREF_TABLE", "0", 1);
    shmref_conn *p = connect_ok(&d);
    unsetenv("SHMREF_TABLE");
    cr_assert_eq(shmref_set_stock(p, 2), 0);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(p, 9000, &b), 0);
    cr_assert_eq(counter(p, "stock_misses"), 1);
    cr_assert_eq(leases_settle(&d, p, 3), 3, "one lease and two in stock");
    shmref_buf *b2;
    cr_assert_eq(shmref_lease(p, 10000, &b2), 0); /* the same class: from the stock */
    cr_assert_eq(counter(p, "stock_hits"), 1);
    cr_assert_eq(shmref_buf_size(b2), 10000);
    cr_assert_geq(shmref_buf_capacity(b2), 10000);
    cr_assert_eq(leases_settle(&d, p, 4), 4, "two leases and two in stock (one refilled)");
    /* A lease of the stock's class size publishes up to the caller's size only. */
    shmref_desc desc;
    cr_assert_eq(shmref_publish(b2, 10001, 0, NULL, 0, &desc), -EINVAL);
    cr_assert_eq(shmref_set_stock(p, 0), 0);
    cr_assert_eq(leases_settle(&d, p, 2), 2, "set_stock(0) returns the stock");
    cr_assert_eq(shmref_set_stock(p, 2), 0);
    /* Five size classes: the least recently used one's stock goes back. */
    size_t sizes[] = { 4096, 64 << 10, 256 << 10, 1 << 20, 4 << 20 };
    shmref_buf *v[5];
    for (int i = 0; i < 5; i++)
        cr_assert_eq(shmref_lease(p, sizes[i], &v[i]), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(leases_settle(&d, p, 2 + 5 + 4 * 2), 2 + 5 + 4 * 2, "at most four classes are stocked");
    for (int i = 0; i < 5; i++)
        shmref_release(v[i]);
    shmref_release(b);
    shmref_release(b2);
    uint64_t closed = status_u64(&d, "counters.clients_closed");
    shmref_close(p);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 2000), 0);
    cr_assert_eq(status_u64(&d, "counters.clients_died"), 0, "the close released the stock first");
    cr_assert_geq(status_u64(&d, "counters.clients_closed"), closed + 1);
    cr_assert_eq(status_u64(&d, "table.grants"), 0, "no table: nothing joined one");

    shmref_conn *q = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(q, 0), 0);
    cr_assert_eq(shmref_lease(q, 9000, &b), 0);
    size_t cap = shmref_buf_capacity(b);
    shmref_release(b);
    cr_assert_eq(leases_settle(&d, q, 0), 0, "nothing leased");
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), cap, "the free buffer is the table's, charged");
    cr_assert_eq(shmref_lease(q, 10000, &b2), 0); /* the same class: from the table */
    cr_assert_eq(counter(q, "table_leases"), 1);
    cr_assert_eq(counter(q, "stock_hits") + counter(q, "stock_misses"), 0);
    shmref_release(b2);
    shmref_close(q);
    cr_assert_eq(wait_status(&d, "pool.bytes_tables", 0, 2000), 0, "the table went back with its last connection");
    cr_assert_eq(status_u64(&d, "buffers.leases"), 0);
    daemon_stop(&d);
}

Test(pipeline, a_lease_over_quota_returns_the_stock_and_is_tried_again, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "256K", NULL);
    shmref_conn *p = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(p, 2), 0);
    shmref_buf *v[4];
    /* 64 KiB leases: four fit the quota, whatever the stock holds of it. */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(shmref_lease(p, 65536, &v[i]), 0, "lease %d: %s", i, shmref_errmsg(p));
    shmref_buf *x;
    int r = shmref_lease(p, 65536, &x);
    cr_assert_eq(r, -EDQUOT, "%d %s", r, shmref_errmsg(p));
    cr_assert_eq(leases_settle(&d, p, 4), 4, "nothing is left in stock at the quota");
    for (int i = 0; i < 4; i++)
        shmref_release(v[i]);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- a re-acquire on the same connection: no round trip, and safe ---- */

Test(pipeline, a_reacquire_shares_the_handle_and_the_buffer_cannot_be_recycled, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(p, 0), 0);
    shmref_buf *b, *r1, *r2;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(p, 65536, &b), 0);
    fill_pattern(shmref_buf_data(b), 65536, 1);
    cr_assert_eq(shmref_publish(b, 65536, 0, NULL, 0, &desc), 0);
    cr_assert_eq(shmref_acquire(c, &desc, &r1), 0);
    uint64_t waits = counter(c, "waits"), sent = counter(c, "sent");
    cr_assert_eq(shmref_acquire(c, &desc, &r2), 0);
    cr_assert_eq(counter(c, "waits"), waits, "the re-acquire waited for the daemon");
    cr_assert_eq(counter(c, "sent"), sent, "the re-acquire asked the daemon");
    cr_assert_eq(counter(c, "local_acquires"), 1);
    cr_assert_eq(shmref_buf_data(r2), shmref_buf_data(r1));
    cr_assert_eq(leases_settle(&d, c, 2), 2, "the daemon holds one handle for the two");
    /* The producer lets go; a new lease of the same size is another buffer: the consumer's
     * bytes stay as published. */
    shmref_release(b);
    cr_assert_eq(shmref_release(r1), 0);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_lease(p, 65536, &b), 0);
    fill_pattern(shmref_buf_data(b), 65536, 2);
    cr_assert_eq(check_pattern(shmref_buf_data(r2), 65536, 1), -1, "a held buffer was recycled");
    cr_assert_eq(leases_settle(&d, p, 2), 2, "r2 still holds the daemon's handle");
    shmref_release(b);
    /* The last local handle goes: the daemon's goes with it, the buffer is free for reuse:
     * in the uid's table (both leases were the daemon's, for the table), and the next
     * lease is popped from there, not recycled by the pool. */
    uint64_t recycled = status_u64(&d, "counters.buffers_recycled");
    cr_assert_eq(status_u64(&d, "table.lent"), 1, "only the second buffer is free: r2 holds the first");
    cr_assert_eq(shmref_release(r2), 0);
    cr_assert_eq(leases_settle(&d, c, 0), 0);
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    cr_assert_eq(status_u64(&d, "table.lent"), 2, "both free in the table");
    uint64_t popped = counter(p, "table_leases");
    cr_assert_eq(shmref_lease(p, 65536, &b), 0);
    cr_assert_eq(counter(p, "table_leases"), popped + 1, "reused from the table");
    cr_assert_eq(status_u64(&d, "counters.buffers_recycled"), recycled);
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 2);
    /* A re-acquire after the release goes to the daemon: the buffer is gone. */
    sent = counter(c, "sent");
    cr_assert_eq(shmref_acquire(c, &desc, &r1), -ENOENT, "%s", shmref_errmsg(c));
    cr_assert_eq(counter(c, "sent"), sent + 1, "the acquire after the release did not ask the daemon");
    cr_assert_eq(counter(c, "local_acquires"), 1);
    cr_assert_eq(counter(c, "table_acquires"), 0);
    shmref_release(b);
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- backpressure: a lease that waits for quota ---- */

static shmref_conn *releaser_conn; /* used by release_later's thread only */

struct later {
    shmref_buf *buf;
    int ms;
};

static void *release_later(void *arg)
{
    struct later *l = arg;
    usleep((useconds_t)l->ms * 1000);
    shmref_release(l->buf);
    shmref_ping(releaser_conn);
    return NULL;
}

Test(pipeline, a_waiting_lease_is_served_when_quota_frees, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "128K", NULL);
    shmref_conn *p = connect_ok(&d), *q = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(p, 0), 0);
    shmref_buf *a, *b, *x;
    /* q's leases by shmref_lease_many: their buffers go back to the pool at their release,
     * which frees the quota (a shmref_lease's would join the uid's table, still charged) */
    const size_t size = 65536;
    cr_assert_eq(shmref_lease_many(q, &size, 1, &a), 0);
    cr_assert_eq(shmref_lease_many(q, &size, 1, &b), 0);
    int r0 = shmref_lease(p, 65536, &x);
    cr_assert_eq(r0, -EDQUOT, "%d %s", r0, shmref_errmsg(p));
    long t0 = now_ms();
    cr_assert_eq(shmref_lease_ex(p, 65536, 0, 200, &x), -ETIMEDOUT);
    cr_assert_geq(now_ms() - t0, 190);
    cr_assert(strlen(shmref_errmsg(p)) > 0);
    /* Another connection (a thread here) releases in 300 ms: the lease waits for it. */
    releaser_conn = q;
    struct later l = { .buf = a, .ms = 300 };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, release_later, &l), 0);
    t0 = now_ms();
    int r = shmref_lease_ex(p, 65536, 0, 5000, &x);
    long took = now_ms() - t0;
    pthread_join(th, NULL);
    cr_assert_eq(r, 0, "%s", shmref_errmsg(p));
    cr_assert(took >= 250 && took < 4000, "took %ld ms", took);
    cr_assert_eq(status_u64(&d, "table.grants"), 0);
    shmref_release(x);
    shmref_release(b);
    shmref_close(p);
    shmref_close(q);
    daemon_stop(&d);
}

/* The default path: q's buffers join the uid's table at their release, still charged;
 * a lease of the uid waiting for quota reclaims the free one (which q's process still
 * maps: warm and pinned to the uid in the pool, so the lease takes that very buffer). */
Test(pipeline, a_waiting_lease_reclaims_a_buffer_freed_into_the_table, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "128K", NULL);
    shmref_conn *p = connect_ok(&d), *q = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(p, 0), 0);
    cr_assert_eq(shmref_set_stock(q, 0), 0);
    shmref_buf *a, *b, *x;
    cr_assert_eq(shmref_lease(q, 65536, &a), 0);
    cr_assert_eq(shmref_lease(q, 65536, &b), 0);
    int r0 = shmref_lease(p, 65536, &x);
    cr_assert_eq(r0, -EDQUOT, "%d %s", r0, shmref_errmsg(p));
    releaser_conn = q;
    struct later l = { .buf = a, .ms = 300 };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, release_later, &l), 0);
    long t0 = now_ms();
    int r = shmref_lease_ex(p, 65536, 0, 5000, &x);
    long took = now_ms() - t0;
    pthread_join(th, NULL);
    cr_assert_eq(r, 0, "%s", shmref_errmsg(p));
    cr_assert(took >= 250 && took < 4000, "took %ld ms", took);
    cr_assert_eq(status_u64(&d, "table.grants"), 1, "a joined the table");
    cr_assert_eq(status_u64(&d, "table.reclaimed"), 1, "and was reclaimed for the waiting lease");
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 2, "the lease got that buffer back");
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), 0);
    /* at the quota again, a free table buffer is reclaimed for a lease that does not wait */
    shmref_release(x);
    cr_assert_eq(shmref_ping(p), 0);
    /* the lease that waited kept its PROTO_LEASE_TABLE through its retries: its buffer joined
     * the table too (before: its retry passed no flag, and it went back to the pool) */
    cr_assert_eq(status_u64(&d, "table.grants"), 2, "the waited lease's buffer did not join the table");
    cr_assert_eq(shmref_lease(p, 65536, &x), 0, "%s", shmref_errmsg(p));
    shmref_buf *y;
    shmref_release(b);
    cr_assert_eq(shmref_ping(q), 0);
    /* x is p's lease from the table now (a member the daemon holds nothing of), b free */
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), 2 * 65536, "b is free in the table, x leased from it");
    cr_assert_eq(shmref_lease_many(q, &(size_t){ 65536 }, 1, &y), 0, "%s", shmref_errmsg(q));
    cr_assert_eq(status_u64(&d, "table.reclaimed"), 2);
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 2);
    shmref_release(y);
    shmref_release(x);
    shmref_close(p);
    shmref_close(q);
    daemon_stop(&d);
}

/* ---- lease_many and release_many: one message per 32 ---- */

Test(pipeline, lease_many_and_release_many_send_one_message_per_32, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--max-leases", "128", NULL);
    shmref_conn *p = connect_ok(&d);
    enum { N = 40 };
    size_t sizes[N];
    shmref_buf *v[N];
    for (int i = 0; i < N; i++)
        sizes[i] = 4096 + (size_t)i;
    uint64_t sent = counter(p, "sent"), got = counter(p, "received");
    cr_assert_eq(shmref_lease_many(p, sizes, N, v), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(counter(p, "sent") - sent, 2, "40 leases are two messages");
    cr_assert_eq(counter(p, "received") - got, 2);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(shmref_buf_size(v[i]), sizes[i]);
        fill_pattern(shmref_buf_data(v[i]), sizes[i], (uint32_t)i);
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(check_pattern(shmref_buf_data(v[i]), sizes[i], (uint32_t)i), -1, "lease %d shares memory", i);
    cr_assert_eq(leases_settle(&d, p, N), N);
    sent = counter(p, "sent");
    cr_assert_eq(shmref_release_many(v, N), 0);
    cr_assert_eq(counter(p, "sent") - sent, 2, "40 releases are two messages");
    for (int i = 0; i < N; i++)
        cr_assert_null(v[i]);
    cr_assert_eq(leases_settle(&d, p, 0), 0);
    shmref_close(p);
    daemon_stop(&d);
}

Test(pipeline, an_unknown_counter_is_enoent)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d);
    uint64_t v;
    cr_assert_eq(shmref_conn_counter(p, "no_such_counter", &v), -ENOENT);
    cr_assert_eq(shmref_conn_counter(p, "waits", &v), 0);
    /* the hello is the one round trip: one wait, or none when its reply was already
     * there at the first look (the daemon answered on the other core) */
    cr_assert_leq(v, 1, "the hello was the one wait");
    shmref_close(p);
    daemon_stop(&d);
}

/* A clean close right after leases whose stock refills are still kept or in flight counts
 * as a clean close, not a death: close drops the kept refills and says bye last (before
 * bye, 9 of these 20 closes counted as deaths). */
Test(pipeline, a_close_with_refills_in_flight_is_clean, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    for (int round = 0; round < 20; round++) {
        shmref_conn *p = connect_ok(&d);
        cr_assert_eq(shmref_set_stock(p, 2), 0);
        shmref_buf *b;
        cr_assert_eq(shmref_lease(p, 9000, &b), 0);
        if (round % 2)
            cr_assert_eq(shmref_ping(p), 0); /* the refills sent, maybe not answered */
        shmref_release(b);
        shmref_close(p);
    }
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 2000), 0);
    cr_assert_eq(status_u64(&d, "counters.clients_died"), 0, "died: %llu of 20 clean closes",
                 (unsigned long long)status_u64(&d, "counters.clients_died"));
    daemon_stop(&d);
}
