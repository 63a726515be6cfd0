/* SPDX-License-Identifier: MIT */
/* scenario-arrow.c: the producer's side of a unit of work (issue 10), per unit of work,
 * against one plain memcpy of the same bytes between warm heap buffers. Columns: one
 * float64 column of 79,478,796 rows (magmalake's measurement) and a utf8 column of 10M
 * strings. Methods: `unit-import` is shmref_unit_import_array of the heap column (lease,
 * one copy of each buffer, manifest, publish, release); `unit-claim` is the hand-made
 * unit (begin, claim, memcpy into the claim, add_buffers, publish, release). The first
 * unit of each row is acquired on a second connection and its exported buffers compared
 * byte for byte with the heap column (untimed). Target: <= 1.1x the memcpy (magmalake:
 * 1.3x). The consumer's side and the other transports are not built yet. */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F64_ROWS 79478796u
#define UTF8_ROWS 10000000u

struct column {
    const char *label, *format;
    int64_t rows;
    int nb;                           /* 2 (validity, data) or 3 (validity, offsets, data) */
    void *buf[3];                     /* buf[0] is always NULL: no nulls */
    size_t len[3];
    size_t bytes;                     /* what one copy moves */
    struct ArrowSchema s;
    struct ArrowArray a;
    const void *ptrs[3];
};

static void no_release_array(struct ArrowArray *a) { a->release = NULL; }
static void no_release_schema(struct ArrowSchema *s) { s->release = NULL; }

static int column_make(struct column *c, bool utf8, int64_t rows)
{
    memset(c, 0, sizeof(*c));
    c->rows = rows;
    c->format = utf8 ? "u" : "g";
    c->nb = utf8 ? 3 : 2;
    if (!utf8) {
        c->len[1] = (size_t)rows * 8;
        if (!(c->buf[1] = payload_alloc_warm(c->len[1])))
            return -ENOMEM;
        double *x = c->buf[1];
        for (int64_t i = 0; i < rows; i++)
            x[i] = (double)i * 0.25;
    } else {
        c->len[1] = (size_t)(rows + 1) * 4;
        if (!(c->buf[1] = payload_alloc_warm(c->len[1])))
            return -ENOMEM;
        int32_t *o = c->buf[1];
        int64_t at = 0;
        for (int64_t i = 0; i <= rows; i++) {
            o[i] = (int32_t)at;
            at += 4 + i % 9; /* 8 bytes per string on average */
        }
        at = o[rows];
        c->len[2] = (size_t)at;
        if (!(c->buf[2] = payload_alloc_warm(c->len[2] ? c->len[2] : 1)))
            return -ENOMEM;
        for (int64_t i = 0; i < at; i++)
            ((char *)c->buf[2])[i] = (char)('a' + i % 26);
    }
    c->bytes = c->len[1] + c->len[2];
    for (int i = 0; i < 3; i++)
        c->ptrs[i] = c->buf[i];
    c->s = (struct ArrowSchema){ .format = c->format, .name = "x", .release = no_release_schema };
    c->a = (struct ArrowArray){ .length = rows, .n_buffers = c->nb, .buffers = c->ptrs, .release = no_release_array };
    return 0;
}

static void column_free(struct column *c)
{
    for (int i = 1; i < 3; i++)
        if (c->buf[i])
            payload_free(c->buf[i], c->len[i] ? c->len[i] : 1);
}

static size_t align64(size_t x)
{
    return (x + 63) & ~(size_t)63;
}

/* by_claim: the hand-made unit. */
static int by_claim(shmref_conn *conn, const struct column *c, shmref_unit **ret)
{
    shmref_unit *u;
    size_t size = 0;
    for (int i = 1; i < c->nb; i++)
        size += align64(c->len[i]);
    int r = shmref_unit_begin(conn, size, &u);
    if (r < 0)
        return r;
    uint64_t offs[3] = { 0 }, lens[3] = { 0 };
    for (int i = 1; i < c->nb && r == 0; i++) {
        void *p;
        if ((r = shmref_unit_claim(u, c->len[i], &offs[i], &p)) == 0)
            memcpy(p, c->buf[i], c->len[i]);
        lens[i] = c->len[i];
    }
    if (r == 0)
        r = shmref_unit_add_buffers(u, "x", c->format, 0, c->rows, 0, c->nb, offs, lens);
    if (r < 0) {
        shmref_unit_release(u);
        return r;
    }
    *ret = u;
    return 0;
}

static int make_unit(shmref_conn *conn, const struct column *c, bool import, shmref_unit **ret)
{
    return import ? shmref_unit_import_array(conn, &c->s, &c->a, ret) : by_claim(conn, c, ret);
}

/* verify: acquire the published unit on conn2 and compare its exported buffers. */
static int verify(shmref_conn *conn2, const shmref_desc *d, const struct column *c, char *why, size_t cap)
{
    shmref_unit *v;
    struct ArrowArray a;
    int r = shmref_unit_acquire(conn2, d, &v);
    if (r < 0) {
        snprintf(why, cap, "acquire: %s", shmref_errmsg(conn2));
        return r;
    }
    if ((r = shmref_unit_export_array(v, 0, 0, NULL, &a)) == 0) {
        if (a.length != c->rows || a.n_buffers != c->nb)
            r = -EINVAL;
        for (int i = 1; i < c->nb && r == 0; i++)
            if (memcmp(a.buffers[i], c->buf[i], c->len[i]))
                r = -EINVAL;
        if (r < 0)
            snprintf(why, cap, "the exported column differs from the heap column");
        a.release(&a);
    }
    shmref_unit_release(v);
    return r;
}

/* One method on one pool: its connections and samples, run interleaved with the others
 * (the floor, the other method, the other pool) so that all see the same machine. */
struct lane {
    struct result *r;
    bool import, ok;
    shmref_conn *conn, *conn2;
    struct samples s;
    uint64_t created;
};

static void lane_open(struct lane *l, const struct daemon *dm, const char *pool, const struct column *c, bool import,
                      int iters)
{
    int e;
    memset(l, 0, sizeof(*l));
    l->import = import;
    if (!(l->r = report_add("arrow", import ? "unit-import" : "unit-claim", pool, c->bytes, c->label)))
        return;
    if (samples_init(&l->s, (size_t)iters) < 0) {
        snprintf(l->r->error, sizeof(l->r->error), "out of memory");
        return;
    }
    if ((e = shmref_connect(dm->socket, &l->conn)) < 0 || (e = shmref_connect(dm->socket, &l->conn2)) < 0) {
        snprintf(l->r->error, sizeof(l->r->error), "connect: %s", strerror(-e));
        return;
    }
    l->ok = true;
}

/* lane_step: one unit of work (timed unless warm-up; the warm-up one is verified). */
static void lane_step(struct lane *l, const struct column *c, int it)
{
    shmref_unit *u;
    shmref_desc d;
    if (!l->ok)
        return;
    if (it == 0)
        l->created = daemon_counter(l->conn, "counters.buffers_created");
    uint64_t t0 = stats_now_ns();
    if (make_unit(l->conn, c, l->import, &u) < 0 || shmref_unit_publish(u, 0, &d) < 0) {
        snprintf(l->r->error, sizeof(l->r->error), "%s", shmref_errmsg(l->conn));
        l->ok = false;
        return;
    }
    if (it < 0 && verify(l->conn2, &d, c, l->r->error, sizeof(l->r->error)) < 0) {
        shmref_unit_release(u);
        l->ok = false;
        return;
    }
    shmref_unit_release(u);
    uint64_t t1 = stats_now_ns();
    if (it >= 0)
        samples_add(&l->s, (double)(t1 - t0) / 1e6);
    shmref_ping(l->conn); /* the release is done before the next lease */
}

static void lane_close(struct lane *l, const struct result *base)
{
    if (l->ok) {
        report_fill(l->r, &l->s);
        report_ratio(l->r, base);
        snprintf(l->r->note, sizeof(l->r->note), "lease + copy + manifest + publish + release; %llu new buffers",
                 (unsigned long long)(daemon_counter(l->conn, "counters.buffers_created") - l->created));
    }
    samples_free(&l->s);
    shmref_close(l->conn2);
    shmref_close(l->conn);
}

static void floor_step(const struct column *c, void *const *dst, struct samples *s, int it)
{
    uint64_t t0 = stats_now_ns();
    for (int i = 1; i < c->nb; i++)
        memcpy(dst[i], c->buf[i], c->len[i]);
    uint64_t t1 = stats_now_ns();
    if (it >= 0)
        samples_add(s, (double)(t1 - t0) / 1e6);
}

static void run_column(const struct bench_opts *o, const struct daemons *ds, const struct column *c)
{
    static const int pools[] = { POOL_HUGE, POOL_DEVSHM };
    int iters = o->smoke ? 2 : 9;
    struct lane lanes[4];
    int nl = 0;
    struct samples fs;
    void *dst[3] = { NULL };
    struct result *base = report_add("arrow", "memcpy", "", c->bytes, c->label);
    if (!base || samples_init(&fs, (size_t)iters * 2) < 0)
        return;
    for (int i = 1; i < c->nb; i++)
        if (!(dst[i] = payload_alloc_warm(c->len[i] ? c->len[i] : 1)))
            snprintf(base->error, sizeof(base->error), "out of memory");
    for (int p = 0; p < 2; p++) {
        int pool = pools[p];
        for (int m = 0; m < 2; m++) {
            if (ds->have[pool]) {
                lane_open(&lanes[nl++], &ds->d[pool], bench_pool_names[pool], c, m == 0, iters);
                continue;
            }
            struct result *r = report_add("arrow", m ? "unit-claim" : "unit-import", bench_pool_names[pool],
                                          c->bytes, c->label);
            if (r)
                snprintf(r->skipped, sizeof(r->skipped), "%s", ds->why[pool]);
        }
    }
    for (int it = -1; it < iters && !base->error[0]; it++)
        for (int k = 0; k < nl; k++) {
            if (k % 2 == 0) /* a memcpy before each pair of lanes */
                floor_step(c, dst, &fs, it);
            lane_step(&lanes[k], c, it);
        }
    if (!base->error[0]) {
        report_fill(base, &fs);
        snprintf(base->note, sizeof(base->note), "one memcpy of the column's bytes, warm heap to warm heap");
    }
    for (int k = 0; k < nl; k++)
        lane_close(&lanes[k], base);
    for (int i = 1; i < c->nb; i++)
        if (dst[i])
            payload_free(dst[i], c->len[i] ? c->len[i] : 1);
    samples_free(&fs);
}

int scenario_arrow(const struct bench_opts *o, const struct daemons *ds)
{
    for (int k = 0; k < 2; k++) {
        struct column c;
        bool utf8 = k == 1;
        int64_t rows = o->smoke ? (utf8 ? 10000 : 100000) : (utf8 ? UTF8_ROWS : F64_ROWS);
        if (column_make(&c, utf8, rows) < 0) {
            struct result *r = report_add("arrow", "memcpy", "", 0, utf8 ? "utf8" : "f64");
            if (r)
                snprintf(r->error, sizeof(r->error), "out of memory for the column");
            column_free(&c);
            continue;
        }
        c.label = utf8 ? (o->smoke ? "10k utf8" : "10M utf8") : (o->smoke ? "100k f64" : "79.5M f64");
        run_column(o, ds, &c);
        column_free(&c);
    }
    return scenario_arrow_e2e(o, ds);
}
