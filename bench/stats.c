/* SPDX-License-Identifier: MIT */
/* stats.c: the clock and the samples of shmref-bench. Times are CLOCK_MONOTONIC;
 * quantiles are nearest-rank on a sorted copy, so the samples keep their order. */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t stats_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int samples_init(struct samples *s, size_t cap)
{
    s->n = 0;
    s->cap = cap ? cap : 1;
    s->ms = malloc(s->cap * sizeof(*s->ms));
    return s->ms ? 0 : -ENOMEM;
}

void samples_add(struct samples *s, double ms)
{
    if (s->n == s->cap) {
        size_t cap = s->cap * 2;
        double *v = realloc(s->ms, cap * sizeof(*v));
        if (!v)
            return; /* keep what we have: a quantile of fewer samples */
        s->ms = v;
        s->cap = cap;
    }
    s->ms[s->n++] = ms;
}

void samples_free(struct samples *s)
{
    free(s->ms);
    s->ms = NULL;
    s->n = s->cap = 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double samples_quantile(const struct samples *s, double q)
{
    if (s->n == 0)
        return 0;
    double *v = malloc(s->n * sizeof(*v));
    if (!v)
        return 0;
    memcpy(v, s->ms, s->n * sizeof(*v));
    qsort(v, s->n, sizeof(*v), cmp_double);
    size_t rank = (size_t)(q * (double)s->n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > s->n)
        rank = s->n;
    double r = v[rank - 1];
    free(v);
    return r;
}
