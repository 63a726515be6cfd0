/* SPDX-License-Identifier: MIT */
/* calls.c: shmref-calls, the C half of the Python benchmark's fixed-cost comparison
 * (bench/python/fixedcost.py). On two connections of its own (a producer and a consumer)
 * it times, call by call, the sequence the Python loop makes, with the same work each
 * call does in the binding:
 *   lease      shmref_lease of ELEMENTS float64 (from the connection's stock once warm)
 *   publish    shmref_meta_array_encode ("<f8", the shape) + shmref_publish (one-way)
 *   acquire    shmref_acquire on the consumer + shmref_buf_meta_array (dtype and shape)
 *   release_acquired, release_lease   shmref_release (one-way)
 * and then re-acquires: acquire + metadata and release of a buffer the consumer already
 * holds through another handle (libshmref's local re-acquire: no daemon message; what
 * every same-tenant acquire will cost once it makes no round trip).
 * Each sample has the clock's own cost (median of back-to-back reads) taken out. Prints
 * one JSON object: per call the median and p90 in ns, the per-iteration total, the
 * clock's cost. */
#include <shmref/shmref.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t calls_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int calls_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

enum { LEASE, PUBLISH, ACQUIRE, RELEASE_ACQ, RELEASE_LEASE, TOTAL, REACQUIRE, RERELEASE, NCALLS };
static const char *const calls_names[NCALLS] = { "lease", "publish", "acquire", "release_acquired",
                                                 "release_lease", "total", "reacquire", "rerelease" };

static int calls_fail(const char *what, shmref_conn *c, int r)
{
    fprintf(stderr, "shmref-calls: %s: %s (%s)\n", what, strerror(-r), c ? shmref_errmsg(c) : "");
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: shmref-calls SOCKET ELEMENTS ITERATIONS\n");
        return 2;
    }
    long elems = strtol(argv[2], NULL, 10), n = strtol(argv[3], NULL, 10);
    if (elems <= 0 || elems > 100000000 || n <= 0 || n > 10000000) {
        fprintf(stderr, "shmref-calls: bad element or iteration count\n");
        return 2;
    }
    size_t bytes = (size_t)elems * 8;
    shmref_conn *prod, *cons;
    int r = shmref_connect(argv[1], &prod);
    if (r < 0)
        return calls_fail("connect", NULL, r);
    r = shmref_connect(argv[1], &cons);
    if (r < 0)
        return calls_fail("connect", NULL, r);
    int64_t *ns[NCALLS];
    for (int k = 0; k < NCALLS; k++)
        if (!(ns[k] = calloc((size_t)n, sizeof(int64_t))))
            return 1;

    /* the clock's own cost, taken out of every sample */
    int64_t clk[1001];
    for (int i = 0; i < 1001; i++) {
        uint64_t a = calls_now_ns();
        clk[i] = (int64_t)(calls_now_ns() - a);
    }
    qsort(clk, 1001, sizeof(clk[0]), calls_cmp);
    int64_t tick = clk[500];

    long warm = n / 10 > 50 ? n / 10 : 50;
    for (long i = -warm; i < n; i++) {
        shmref_buf *lb, *ab;
        shmref_desc desc;
        shmref_meta_array m = { .dtype = "<f8", .ndim = 1, .order = 'C' }, got;
        m.shape[0] = (uint64_t)elems;
        char meta[SHMREF_META_MAX];
        uint64_t t0 = calls_now_ns();
        if ((r = shmref_lease(prod, bytes, &lb)) < 0)
            return calls_fail("lease", prod, r);
        uint64_t t1 = calls_now_ns();
        int ml = shmref_meta_array_encode(&m, meta, sizeof(meta), NULL);
        if (ml < 0 || (r = shmref_publish(lb, bytes, 0, meta, (size_t)ml, &desc)) < 0)
            return calls_fail("publish", prod, ml < 0 ? ml : r);
        uint64_t t2 = calls_now_ns();
        if ((r = shmref_acquire(cons, &desc, &ab)) < 0 || (r = shmref_buf_meta_array(ab, &got)) < 0)
            return calls_fail("acquire", cons, r);
        uint64_t t3 = calls_now_ns();
        shmref_release(ab);
        uint64_t t4 = calls_now_ns();
        shmref_release(lb);
        uint64_t t5 = calls_now_ns();
        if (got.shape[0] != (uint64_t)elems || got.ndim != 1) {
            fprintf(stderr, "shmref-calls: metadata says %u dims\n", got.ndim);
            return 1;
        }
        if (i >= 0) {
            ns[LEASE][i] = (int64_t)(t1 - t0) - tick;
            ns[PUBLISH][i] = (int64_t)(t2 - t1) - tick;
            ns[ACQUIRE][i] = (int64_t)(t3 - t2) - tick;
            ns[RELEASE_ACQ][i] = (int64_t)(t4 - t3) - tick;
            ns[RELEASE_LEASE][i] = (int64_t)(t5 - t4) - tick;
            ns[TOTAL][i] = (int64_t)(t5 - t0) - tick;
        }
    }

    /* re-acquire: the consumer holds one handle of a published buffer */
    shmref_buf *lb, *held;
    shmref_desc desc;
    shmref_meta_array m = { .dtype = "<f8", .ndim = 1, .order = 'C' }, got;
    m.shape[0] = (uint64_t)elems;
    char meta[SHMREF_META_MAX];
    int ml = shmref_meta_array_encode(&m, meta, sizeof(meta), NULL);
    if ((r = shmref_lease(prod, bytes, &lb)) < 0 || (r = shmref_publish(lb, bytes, 0, meta, (size_t)ml, &desc)) < 0)
        return calls_fail("lease + publish", prod, r);
    if ((r = shmref_acquire(cons, &desc, &held)) < 0)
        return calls_fail("acquire", cons, r);
    for (long i = -warm; i < n; i++) {
        shmref_buf *b;
        uint64_t t0 = calls_now_ns();
        if ((r = shmref_acquire(cons, &desc, &b)) < 0 || (r = shmref_buf_meta_array(b, &got)) < 0)
            return calls_fail("re-acquire", cons, r);
        uint64_t t1 = calls_now_ns();
        shmref_release(b);
        uint64_t t2 = calls_now_ns();
        if (i >= 0) {
            ns[REACQUIRE][i] = (int64_t)(t1 - t0) - tick;
            ns[RERELEASE][i] = (int64_t)(t2 - t1) - tick;
        }
    }
    uint64_t local = 0;
    shmref_conn_counter(cons, "local_acquires", &local);
    shmref_release(held);
    shmref_release(lb);
    shmref_ping(cons); /* one round trip each: the releases are handled before we report */
    shmref_ping(prod);

    printf("{\"elements\": %ld, \"iterations\": %ld, \"clock_ns\": %lld, \"local_acquires\": %llu, \"calls\": {",
           elems, n, (long long)tick, (unsigned long long)local);
    for (int k = 0; k < NCALLS; k++) {
        qsort(ns[k], (size_t)n, sizeof(int64_t), calls_cmp);
        size_t p90 = (size_t)(0.9 * (double)n);
        printf("%s\"%s\": {\"median_ns\": %lld, \"p90_ns\": %lld}", k ? ", " : "", calls_names[k],
               (long long)ns[k][n / 2], (long long)ns[k][p90 < (size_t)n ? p90 : (size_t)n - 1]);
        free(ns[k]);
    }
    printf("}}\n");
    shmref_close(cons);
    shmref_close(prod);
    return 0;
}
