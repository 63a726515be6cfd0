/* SPDX-License-Identifier: MIT */
/* scenario-arrow-e2e.c: magmalake's measurement, the C half (issue 10): a producer makes
 * one column (79,478,796 float64 values, or 10M utf8 strings) and a consumer sums it.
 *   c-data-in-process  the floor: one process, the producer writes the column into a
 *                      warm heap buffer and hands over an ArrowArray (pointers), the
 *                      consumer sums it;
 *   shmref-unit        a producer process writes the column in place into a unit of work
 *                      (begin, claim, write, add_buffers, publish) and sends the
 *                      descriptor; the consumer (this process) acquires, exports the
 *                      ArrowArray and sums where the bytes lie;
 *   shmref-unit-heap   the same, the consumer first copies the column into its heap.
 *   c-data-scan /      the consumer's part alone (issue 18): the floor's pass and sum, and
 *   shmref-acquire     shmref-unit's runs from the descriptor's arrival (acquire, export,
 *                      sum, release).
 * Timed by the consumer from its request to the producer until the sum is done; the
 * producer releases afterwards (untimed). The sums are checked against the in-process
 * one. Arrow IPC and Flight rows: bench/python/arrow_bench.py (pyarrow). The floor runs
 * before each pair of lanes, interleaved, so all rows see the same machine. */
#include "bench.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

struct e2e_col {
    bool utf8;
    int64_t rows;
    size_t data_len, off_len;         /* f64: data_len only */
    const char *label;
};

static void e2e_sizes(struct e2e_col *c)
{
    if (!c->utf8) {
        c->data_len = (size_t)c->rows * 8;
        c->off_len = 0;
        return;
    }
    c->off_len = (size_t)(c->rows + 1) * 4;
    int64_t at = 0;
    for (int64_t i = 0; i < c->rows; i++)
        at += 4 + i % 9;
    c->data_len = (size_t)at;
}

/* produce: the column's values into off (utf8 offsets) and data. Not inlined: the producer
 * process and the in-process floor run the same machine code (inlined, GCC once made the
 * producer's copy divide with idiv and the floor's by multiplication: 2x the floor's time). */
__attribute__((noinline)) static void produce(const struct e2e_col *c, int32_t *off, void *data)
{
    if (!c->utf8) {
        double *x = data;
        for (int64_t i = 0; i < c->rows; i++)
            x[i] = (double)i * 0.25;
        return;
    }
    char *s = data;
    int32_t at = 0;
    for (int64_t i = 0; i < c->rows; i++) {
        off[i] = at;
        int32_t n = 4 + (int32_t)(i % 9);
        for (int32_t k = 0; k < n; k++)
            s[at + k] = (char)('a' + (at + k) % 26);
        at += n;
    }
    off[c->rows] = at;
}

/* consume (not inlined either): the sum of an exported column (f64: the values; utf8: every byte of every
 * string, through the offsets). */
__attribute__((noinline)) static double consume(const struct e2e_col *c, const struct ArrowArray *a)
{
    double sum = 0;
    if (!c->utf8) {
        const double *x = (const double *)a->buffers[1] + a->offset;
        for (int64_t i = 0; i < a->length; i++)
            sum += x[i];
        return sum;
    }
    const int32_t *o = (const int32_t *)a->buffers[1] + a->offset;
    const unsigned char *s = a->buffers[2];
    uint64_t t = 0;
    for (int64_t i = 0; i < a->length; i++)
        for (int32_t k = o[i]; k < o[i + 1]; k++)
            t += s[k];
    return (double)t;
}

static void no_release(struct ArrowArray *a) { a->release = NULL; }

/* ---- the producer process ---- */

static int make_unit(shmref_conn *conn, const struct e2e_col *c, shmref_unit **ret)
{
    shmref_unit *u;
    uint64_t offs[3] = { 0 }, lens[3] = { 0 };
    void *data, *off = NULL;
    size_t size = ((c->off_len + 63) & ~(size_t)63) + c->data_len;
    int r = shmref_unit_begin(conn, size, &u);
    if (r < 0)
        return r;
    if (c->utf8)
        r = shmref_unit_claim(u, c->off_len, &offs[1], &off);
    if (r == 0)
        r = shmref_unit_claim(u, c->data_len, &offs[c->utf8 ? 2 : 1], &data);
    if (r == 0) {
        produce(c, off, data);
        lens[1] = c->utf8 ? c->off_len : c->data_len;
        lens[2] = c->data_len;
        r = shmref_unit_add_buffers(u, "x", c->utf8 ? "u" : "g", 0, c->rows, 0, c->utf8 ? 3 : 2, offs, lens);
    }
    if (r < 0) {
        shmref_unit_release(u);
        return r;
    }
    *ret = u;
    return 0;
}

/* producer_main: 'g' -> make and publish a unit, send its descriptor; 'r' -> release it,
 * answer 'k'. Runs in a forked child; never returns. */
static void producer_main(int fd, const char *socket, const struct e2e_col *c)
{
    shmref_conn *conn;
    shmref_unit *u = NULL;
    char cmd;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (shmref_connect(socket, &conn) < 0)
        _exit(1);
    while (read(fd, &cmd, 1) == 1) {
        if (cmd == 'g') {
            shmref_desc d;
            uint8_t bin[SHMREF_DESC_BINARY_MAX];
            int n = -1;
            if (make_unit(conn, c, &u) == 0 && shmref_unit_publish(u, 0, &d) == 0)
                n = shmref_desc_to_binary(&d, bin, sizeof(bin));
            if (n < 0) {
                fprintf(stderr, "shmref-bench: arrow producer: %s\n", shmref_errmsg(conn));
                _exit(2);
            }
            if (write(fd, bin, (size_t)n) != n)
                _exit(3);
        } else {
            shmref_unit_release(u);
            u = NULL;
            shmref_ping(conn);
            if (write(fd, "k", 1) != 1)
                _exit(3);
        }
    }
    shmref_close(conn);
    _exit(0);
}

/* ---- rows ---- */

struct e2e_lane {
    struct result *r;
    bool heap, ok;
    uint64_t created, retired;        /* the daemon's counters after the warm-up */
    struct result *ra;                /* shmref-acquire: the consumer's part (not heap lanes) */
    struct samples sa;
    int fd;
    pid_t pid;
    shmref_conn *conn;
    struct samples s;
    void *heap_buf[2];
};

static void lane_open(struct e2e_lane *l, const struct daemon *dm, const char *pool, const struct e2e_col *c,
                      bool heap, int iters)
{
    int sv[2], e;
    memset(l, 0, sizeof(*l));
    l->fd = -1;
    l->heap = heap;
    if (!(l->r = report_add("arrow-e2e", heap ? "shmref-unit-heap" : "shmref-unit", pool,
                            c->data_len + c->off_len, c->label)))
        return;
    if (!heap && !(l->ra = report_add("arrow-e2e", "shmref-acquire", pool, c->data_len + c->off_len, c->label)))
        return;
    if (samples_init(&l->s, (size_t)iters) < 0 || samples_init(&l->sa, (size_t)iters) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        snprintf(l->r->error, sizeof(l->r->error), "out of memory or sockets");
        return;
    }
    if (heap && (!(l->heap_buf[0] = payload_alloc_warm(c->data_len)) ||
                 (c->utf8 && !(l->heap_buf[1] = payload_alloc_warm(c->off_len))))) {
        snprintf(l->r->error, sizeof(l->r->error), "out of memory");
        close(sv[0]);
        close(sv[1]);
        return;
    }
    fflush(NULL);
    if ((l->pid = fork()) == 0) {
        close(sv[0]);
        producer_main(sv[1], dm->socket, c);
    }
    close(sv[1]);
    l->fd = sv[0];
    if (l->pid < 0 || (e = shmref_connect(dm->socket, &l->conn)) < 0) {
        snprintf(l->r->error, sizeof(l->r->error), "fork or connect failed");
        return;
    }
    l->ok = true;
}

/* lane_step: one unit of work end to end; returns the consumer's sum. */
static double lane_step(struct e2e_lane *l, const struct e2e_col *c, int it)
{
    uint8_t bin[SHMREF_DESC_BINARY_MAX];
    shmref_desc d;
    shmref_unit *u;
    struct ArrowArray a;
    double sum = -1;
    char k;
    if (!l->ok)
        return -1;
    if (it == 0) {
        l->created = daemon_counter(l->conn, "counters.buffers_created");
        l->retired = daemon_counter(l->conn, "counters.buffers_retired");
    }
    uint64_t t0 = stats_now_ns();
    ssize_t n;
    if (write(l->fd, "g", 1) != 1 || (n = read(l->fd, bin, sizeof(bin))) <= 0 ||
        shmref_desc_from_binary(bin, (size_t)n, &d) < 0) {
        snprintf(l->r->error, sizeof(l->r->error), "the producer process failed");
        l->ok = false;
        return -1;
    }
    uint64_t t_desc = stats_now_ns(); /* the consumer's part starts: acquire, export, sum, release */
    if (shmref_unit_acquire(l->conn, &d, &u) < 0 || shmref_unit_export_array(u, 0, 0, NULL, &a) < 0) {
        snprintf(l->r->error, sizeof(l->r->error), "%s", shmref_errmsg(l->conn));
        l->ok = false;
        return -1;
    }
    if (l->heap) { /* the read into the heap, then the sum there */
        struct ArrowArray h = a;
        const void *bufs[3] = { NULL, NULL, NULL };
        if (c->utf8) {
            memcpy(l->heap_buf[1], a.buffers[1], c->off_len);
            memcpy(l->heap_buf[0], a.buffers[2], c->data_len);
            bufs[1] = l->heap_buf[1];
            bufs[2] = l->heap_buf[0];
        } else {
            memcpy(l->heap_buf[0], a.buffers[1], c->data_len);
            bufs[1] = l->heap_buf[0];
        }
        h.buffers = bufs;
        sum = consume(c, &h);
    } else {
        sum = consume(c, &a);
    }
    a.release(&a);
    shmref_unit_release(u);
    uint64_t t1 = stats_now_ns();
    if (it >= 0) {
        samples_add(&l->s, (double)(t1 - t0) / 1e6);
        samples_add(&l->sa, (double)(t1 - t_desc) / 1e6);
    }
    if (write(l->fd, "r", 1) != 1 || read(l->fd, &k, 1) != 1)
        l->ok = false;
    return sum;
}

static void lane_close(struct e2e_lane *l, const struct e2e_col *c, const struct result *base,
                       const struct result *scan)
{
    if (l->ok) {
        report_fill(l->r, &l->s);
        report_ratio(l->r, base);
        snprintf(l->r->note, sizeof(l->r->note), "%s; %llu buffers made, %llu retired",
                 l->heap ? "producer writes in place; consumer copies to its heap, sums"
                         : "producer writes in place; consumer sums in the mapping",
                 (unsigned long long)(daemon_counter(l->conn, "counters.buffers_created") - l->created),
                 (unsigned long long)(daemon_counter(l->conn, "counters.buffers_retired") - l->retired));
        if (l->ra) {
            report_fill(l->ra, &l->sa);
            report_ratio(l->ra, scan);
            snprintf(l->ra->note, sizeof(l->ra->note), "the same runs from the descriptor's arrival: acquire, "
                     "export, sum, release");
        }
    } else if (l->ra && l->r) {
        snprintf(l->ra->error, sizeof(l->ra->error), "%s", l->r->error[0] ? l->r->error : "the lane failed");
    }
    if (l->fd >= 0)
        close(l->fd); /* the producer sees EOF once every later producer has exited too */
    shmref_close(l->conn);
    samples_free(&l->s);
    samples_free(&l->sa);
    if (l->heap_buf[0])
        payload_free(l->heap_buf[0], c->data_len);
    if (l->heap_buf[1])
        payload_free(l->heap_buf[1], c->off_len);
}

/* floor_step: the same work in one process: produce into the heap, pass, sum (s); the pass
 * and sum alone (scan). */
static double floor_step(const struct e2e_col *c, void *data, int32_t *off, struct samples *s,
                         struct samples *scan, int it)
{
    const void *bufs[3] = { NULL, c->utf8 ? (const void *)off : data, c->utf8 ? data : NULL };
    uint64_t t0 = stats_now_ns();
    produce(c, off, data);
    uint64_t tp = stats_now_ns();
    struct ArrowArray a = { .length = c->rows, .n_buffers = c->utf8 ? 3 : 2, .buffers = bufs, .release = no_release };
    double sum = consume(c, &a);
    a.release(&a);
    uint64_t t1 = stats_now_ns();
    if (it >= 0) {
        samples_add(s, (double)(t1 - t0) / 1e6);
        samples_add(scan, (double)(t1 - tp) / 1e6);
    }
    return sum;
}

static void run_column(const struct bench_opts *o, const struct daemons *ds, struct e2e_col *c)
{
    static const int pools[] = { POOL_HUGE, POOL_DEVSHM };
    int iters = o->smoke ? 2 : 9, nl = 0;
    struct e2e_lane lanes[4];
    struct samples fs = { 0 }, ss = { 0 };
    struct result *base = report_add("arrow-e2e", "c-data-in-process", "", c->data_len + c->off_len, c->label);
    struct result *scan = report_add("arrow-e2e", "c-data-scan", "", c->data_len + c->off_len, c->label);
    void *data = payload_alloc_warm(c->data_len);
    int32_t *off = c->utf8 ? payload_alloc_warm(c->off_len) : NULL;
    if (!base || !scan || samples_init(&fs, (size_t)iters * 2) < 0 || samples_init(&ss, (size_t)iters * 2) < 0 ||
        !data || (c->utf8 && !off)) {
        if (base)
            snprintf(base->error, sizeof(base->error), "out of memory");
        goto out;
    }
    for (int p = 0; p < 2; p++)
        for (int m = 0; m < 2; m++) {
            if (ds->have[pools[p]]) {
                lane_open(&lanes[nl++], &ds->d[pools[p]], bench_pool_names[pools[p]], c, m == 1, iters);
                continue;
            }
            struct result *r = report_add("arrow-e2e", m ? "shmref-unit-heap" : "shmref-unit",
                                          bench_pool_names[pools[p]], c->data_len + c->off_len, c->label);
            if (r)
                snprintf(r->skipped, sizeof(r->skipped), "%s", ds->why[pools[p]]);
        }
    double want = 0;
    for (int it = -1; it < iters; it++)
        for (int k = 0; k < nl; k++) {
            if (k % 2 == 0)
                want = floor_step(c, data, off, &fs, &ss, it);
            double got = lane_step(&lanes[k], c, it);
            if (lanes[k].ok && got != want) {
                snprintf(lanes[k].r->error, sizeof(lanes[k].r->error), "sum %.17g, in-process %.17g", got, want);
                lanes[k].ok = false;
            }
        }
    report_fill(base, &fs);
    snprintf(base->note, sizeof(base->note), "produce into the heap, pass the ArrowArray, sum");
    report_fill(scan, &ss);
    snprintf(scan->note, sizeof(scan->note), "the same runs, pass the ArrowArray and sum only");
    for (int k = 0; k < nl; k++)
        lane_close(&lanes[k], c, base, scan);
    for (int k = nl - 1; k >= 0; k--) /* each producer inherited the earlier ones' sockets */
        if (lanes[k].pid > 0)
            waitpid(lanes[k].pid, NULL, 0);
out:
    if (data)
        payload_free(data, c->data_len);
    if (off)
        payload_free(off, c->off_len);
    samples_free(&fs);
    samples_free(&ss);
}

int scenario_arrow_e2e(const struct bench_opts *o, const struct daemons *ds)
{
    for (int k = 0; k < 2; k++) {
        struct e2e_col c = { .utf8 = k == 1 };
        c.rows = o->smoke ? (c.utf8 ? 10000 : 100000) : (c.utf8 ? 10000000 : 79478796);
        c.label = c.utf8 ? (o->smoke ? "10k utf8" : "10M utf8") : (o->smoke ? "100k f64" : "79.5M f64");
        e2e_sizes(&c);
        run_column(o, ds, &c);
    }
    return 0;
}
