/* SPDX-License-Identifier: MIT */
/* acqrel.c: shmref-acqrel, the C half of the Python benchmark's acquire + release
 * comparison. It acquires and releases one published buffer (given as its descriptor
 * text) ITERATIONS times on its own connection, timing each pair, and prints
 * {"median_ns": N, "p90_ns": N, "iterations": N} on stdout. Same calls, same daemon,
 * same buffer as the Python loop it is compared with. */
#include <shmref/shmref.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t acqrel_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int acqrel_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: shmref-acqrel SOCKET DESCRIPTOR ITERATIONS\n");
        return 2;
    }
    long n = strtol(argv[3], NULL, 10);
    shmref_desc desc;
    if (n <= 0 || n > 10000000 || shmref_desc_from_text(argv[2], &desc) < 0) {
        fprintf(stderr, "shmref-acqrel: bad descriptor or iteration count\n");
        return 2;
    }
    shmref_conn *conn;
    int r = shmref_connect(argv[1], &conn);
    if (r < 0) {
        fprintf(stderr, "shmref-acqrel: connect %s: %s\n", argv[1], strerror(-r));
        return 1;
    }
    uint64_t *ns = malloc((size_t)n * sizeof(*ns));
    if (!ns) {
        shmref_close(conn);
        return 1;
    }
    for (long i = 0; i < n; i++) {
        shmref_buf *buf;
        uint64_t t0 = acqrel_now_ns();
        r = shmref_acquire(conn, &desc, &buf);
        if (r < 0) {
            fprintf(stderr, "shmref-acqrel: acquire: %s\n", shmref_errmsg(conn));
            free(ns);
            shmref_close(conn);
            return 1;
        }
        /* the Python side reads the array's first element; so does this */
        volatile uint8_t first = *(const uint8_t *)shmref_buf_data(buf);
        (void)first;
        shmref_release(buf);
        ns[i] = acqrel_now_ns() - t0;
    }
    /* one round trip, so the last release is handled before we report */
    shmref_ping(conn);
    qsort(ns, (size_t)n, sizeof(*ns), acqrel_cmp);
    printf("{\"median_ns\": %llu, \"p90_ns\": %llu, \"iterations\": %ld}\n", (unsigned long long)ns[n / 2],
           (unsigned long long)ns[(size_t)(0.9 * (double)n) < (size_t)n ? (size_t)(0.9 * (double)n) : (size_t)n - 1], n);
    free(ns);
    shmref_close(conn);
    return 0;
}
