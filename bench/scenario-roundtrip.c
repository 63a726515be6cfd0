/* SPDX-License-Identifier: MIT */
/* scenario-roundtrip.c: the no-op round trip, the way users measure it: the client's
 * array is in its heap, a server process returns an array of the same size (the input
 * bytes), and the client reads every page of it. Every method runs at every size, one
 * after the other, with warm-up iterations first; shmrefd methods run once per pool
 * kind. Ratios are taken against binref-pool4 at the same size. */
#include "bench.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ROW_BUDGET_NS (40ull * 1000000000ull) /* stop a slow row early (800 MB base64) */

struct size_plan {
    uint64_t size;
    const char *label;
    unsigned iters, warmup;
};

static const struct size_plan plan_full[] = {
    { 8000, "8 kB", 2000, 3 },
    { 800000, "0.8 MB", 300, 2 },
    { 80000000, "80 MB", 15, 4 }, /* 4 warm-ups: a uid's table hands its buffers round its
                                      * processes, each maps each one once per role (lease:
                                      * writable, acquire: read-only); with 1 the first-touch
                                      * faults of that fell in the timed part (16 ms, 9.6 after) */
    { 800000000, "800 MB", 3, 1 },   /* --big only */
};
static const struct size_plan plan_smoke[] = {
    { 8000, "8 kB", 2, 1 },
    { 3000000, "3 MB", 2, 1 },
};

static const struct rt_method *const methods[] = {
    &rt_floor_memcpy2, &rt_floor_memcpy3, &rt_floor_touch,
    &rt_unix_bytes, &rt_unix_base64, &rt_binref_fresh, &rt_binref_pool4,
    &rt_shmref_1copy, &rt_shmref_0copy, &rt_shmref_1copy_nocache, &rt_shmref_0copy_nocache,
    &rt_shmref_pubsub, &rt_shmref_pubsub_notouch, &rt_iceoryx, &rt_iceoryx_notouch,
    &rt_shm_pair, &rt_table_floor,
};

static const struct bench_opts *opts; /* of the scenario running (the iceoryx rows need it) */

static uint64_t next_iter; /* unique across rows: a stale buffer never looks fresh */

int rt_fail(struct rt_ctx *ctx, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
    va_end(ap);
    return err;
}

void rt_prepare_heap(struct rt_ctx *ctx, uint64_t iter)
{
    payload_fill(ctx->in, ctx->size, iter);
}

static volatile uint64_t touch_sink;

void rt_check_output(struct rt_ctx *ctx, const void *out, uint64_t iter)
{
    touch_sink ^= payload_touch(out, ctx->size);
    uint64_t t0 = stats_now_ns();
    ctx->bad += payload_check(out, ctx->size, iter, true);
    ctx->untimed_ns += stats_now_ns() - t0;
}

void rt_check_stamps(struct rt_ctx *ctx, const void *out, uint64_t iter)
{
    ctx->bad += payload_check(out, ctx->size, iter, ctx->full);
}

/* run_loop: warm-up, then the timed iterations (each from the client's heap array to
 * its read of the output). Returns the number of calls made, or the first failure. */
static int run_loop(const struct rt_method *m, struct rt_ctx *ctx, const struct size_plan *p,
                    struct samples *s)
{
    uint64_t start = stats_now_ns();
    for (unsigned i = 0; i < p->warmup + p->iters; i++) {
        uint64_t iter = ++next_iter;
        if (m->prepare)
            m->prepare(ctx, iter);
        uint64_t u0 = ctx->untimed_ns;
        uint64_t t0 = stats_now_ns();
        int r = m->call(ctx, iter);
        uint64_t t1 = stats_now_ns();
        if (r < 0)
            return r;
        if (i >= p->warmup)
            samples_add(s, (double)(t1 - t0 - (ctx->untimed_ns - u0)) / 1e6);
        if (t1 - start > ROW_BUDGET_NS && s->n >= 3)
            return (int)i + 1;
    }
    return (int)(p->warmup + p->iters);
}

/* client_counts: the round trips this process's libshmref made to shmrefd on conn (its
 * "round_trips" counter: blocking calls that needed a reply, in already or not; a one-way
 * publish or release, a lease from the stock and a re-acquire of a handle the connection
 * holds are none; an acquire is one) and the messages it sent it ("sent": one-way ones
 * too). */
static int client_counts(shmref_conn *c, uint64_t ret[2])
{
    int r = shmref_conn_counter(c, "round_trips", &ret[0]);
    return r < 0 ? r : shmref_conn_counter(c, "sent", &ret[1]);
}

/* server_counts: the server's two counts for its whole connection (it serves exactly the
 * calls of the loop, warm-up included), from the file it leaves at exit. */
static int server_counts(const char *path, uint64_t ret[2])
{
    FILE *f = fopen(path, "r");
    unsigned long long v[2];
    int ok = f && fscanf(f, "%llu %llu", &v[0], &v[1]) == 2;
    if (f)
        fclose(f);
    unlink(path);
    if (!ok)
        return -ENOENT;
    ret[0] = v[0];
    ret[1] = v[1];
    return 0;
}

static void pmd_note(struct result *r, const struct rt_method *m)
{
    if (m->shmref && !m->nocache) /* (without the cache nothing is mapped any more) */
        snprintf(r->note, sizeof(r->note), "client PMD-mapped %llu MiB",
                 (unsigned long long)(daemon_self_pmd_kb() / 1024));
}

/* map_cache_off: for the -nocache rows, SHMREF_MAP_CACHE=0 in this process and the
 * server it spawns (libshmref reads it at connect); restored by map_cache_restore. */
static bool map_cache_off(const struct rt_method *m, char *keep, size_t cap)
{
    const char *env = getenv("SHMREF_MAP_CACHE");
    snprintf(keep, cap, "%s", env ? env : "");
    if (m->nocache)
        setenv("SHMREF_MAP_CACHE", "0", 1);
    return env != NULL;
}

static void map_cache_restore(const struct rt_method *m, bool had, const char *keep)
{
    if (m->nocache && had)
        setenv("SHMREF_MAP_CACHE", keep, 1);
    else if (m->nocache)
        unsetenv("SHMREF_MAP_CACHE");
}

/* run_measured: server, open, loop, close; returns the first failure. */
static int run_measured(const struct rt_method *m, struct rt_ctx *ctx, const struct size_plan *p,
                        struct samples *s, struct result *res)
{
    char *extra[] = { (char *)ctx->socket, ctx->full ? (char *)"full" : NULL, NULL };
    char wfile[512];
    uint64_t w0[2] = { 0, 0 }, w1[2] = { 0, 0 }, ws[2] = { 0, 0 };
    int r = 0, calls = 0;
    snprintf(wfile, sizeof(wfile), "%s/server-waits", opts->tmpdir);
    unlink(wfile);
    setenv("SHMREF_BENCH_WAITS_FILE", wfile, 1);
    if (m->role && (r = wire_spawn(m->role, SOCK_STREAM, extra, &ctx->ctl, &ctx->server)) < 0)
        rt_fail(ctx, r, "spawn server: %s", strerror(-r));
    if (r == 0 && ctx->placed) {
        wire_pin(0, ctx->pin_client);
        if (m->role)
            wire_pin(ctx->server, ctx->pin_server);
    }
    if (r == 0 && m->open)
        r = m->open(ctx);
    bool count = r == 0 && m->shmref && client_counts(ctx->conn, w0) == 0;
    if (r == 0 && (r = run_loop(m, ctx, p, s)) > 0) {
        count = count && client_counts(ctx->conn, w1) == 0;
        calls = r;
        if (!m->shmref && !m->floor)
            res->waits = res->messages = 0; /* no daemon on the path */
        r = 0;
    }
    if (r == 0)
        pmd_note(res, m);
    if (m->close)
        m->close(ctx);
    if (m->role && wire_reap(ctx->ctl, ctx->server) < 0 && r == 0)
        r = rt_fail(ctx, -ECHILD, "server exited with an error");
    /* client and server summed: the server's file exists once it has exited */
    if (r == 0 && count && calls > 0 && server_counts(wfile, ws) == 0) {
        res->waits = (double)(w1[0] - w0[0] + ws[0]) / calls;
        res->messages = (double)(w1[1] - w0[1] + ws[1]) / calls;
    }
    unsetenv("SHMREF_BENCH_WAITS_FILE");
    return r;
}

/* run_row: one method at one size (on one daemon, for shmrefd methods). */
static void run_row(const struct rt_method *m, struct rt_ctx *base, const struct size_plan *p,
                    const struct daemon *d, struct result *res)
{
    struct rt_ctx ctx = *base;
    struct samples s;
    char keep[64];
    ctx.socket = d ? d->socket : NULL;
    ctx.ctl = -1;
    if (samples_init(&s, p->iters) < 0)
        return;
    bool had = map_cache_off(m, keep, sizeof(keep));
    int r = run_measured(m, &ctx, p, &s, res);
    map_cache_restore(m, had, keep);
    report_fill(res, &s);
    if (r < 0)
        snprintf(res->error, sizeof(res->error), "%s", ctx.err[0] ? ctx.err : strerror(-r));
    else if (ctx.bad)
        snprintf(res->error, sizeof(res->error), "%zu wrong words in the output", ctx.bad);
    samples_free(&s);
}

static void run_method(const struct rt_method *m, struct rt_ctx *ctx, const struct size_plan *p,
                       const struct daemons *ds)
{
    if (m->iox) {
        iox_row(opts, p->size, p->warmup, p->iters, !m->notouch, -1, -1,
                report_add("roundtrip", m->name, "", p->size, p->label));
        return;
    }
    if (!m->shmref) {
        run_row(m, ctx, p, NULL, report_add("roundtrip", m->name, "", p->size, p->label));
        return;
    }
    for (int i = 0; i < POOL_N; i++) {
        struct result *r = report_add("roundtrip", m->name, bench_pool_names[i], p->size, p->label);
        if (ds->have[i])
            run_row(m, ctx, p, &ds->d[i], r);
        else
            snprintf(r->skipped, sizeof(r->skipped), "%s", ds->why[i]);
    }
}

static void ratios(uint64_t size)
{
    const struct result *base = report_find("roundtrip", "binref-pool4", "", size);
    for (size_t i = 0; i < report_count(); i++) {
        struct result *r = report_at(i);
        if (!strcmp(r->scenario, "roundtrip") && r->size_bytes == size && r != base)
            report_ratio(r, base);
    }
}

/* run_size: the client's warm arrays for one size, and every method on them. */
static int run_size(const struct bench_opts *o, const struct daemons *ds, const struct size_plan *p)
{
    struct rt_ctx ctx = { .size = p->size, .full = o->smoke, .ctl = -1 };
    ctx.tmp_cap = b64_encoded_len(p->size);
    ctx.in = payload_alloc_warm(p->size);
    ctx.out = payload_alloc_warm(p->size);
    ctx.tmp = payload_alloc_warm(ctx.tmp_cap);
    int r = ctx.in && ctx.out && ctx.tmp ? 0 : -ENOMEM;
    if (r == 0) {
        fprintf(stderr, "shmref-bench: round trip, %s ...\n", p->label);
        for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
            run_method(methods[i], &ctx, p, ds);
        ratios(p->size);
    } else {
        fprintf(stderr, "shmref-bench: no memory for the %s arrays\n", p->label);
    }
    payload_free(ctx.in, p->size);
    payload_free(ctx.out, p->size);
    payload_free(ctx.tmp, ctx.tmp_cap);
    return r;
}

int scenario_roundtrip(const struct bench_opts *o, const struct daemons *ds)
{
    opts = o;
    const struct size_plan *plan = o->smoke ? plan_smoke : plan_full;
    size_t n = o->smoke ? sizeof(plan_smoke) / sizeof(plan_smoke[0]) : (o->big ? 4 : 3);
    int r = 0;
    for (size_t i = 0; i < n; i++)
        if (run_size(o, ds, &plan[i]) < 0)
            r = -ENOMEM;
    return r;
}

/* ---- placement: the small round trip with the processes pinned ---- */

enum { PL_FREE, PL_SAME, PL_CROSS, PL_N };
static const char *const placements[PL_N] = { "unpinned", "same cpu", "cross cpu" };

static const struct rt_method *const placed_methods[] = {
    &rt_unix_bytes, &rt_shmref_0copy, &rt_shmref_pubsub, &rt_iceoryx, &rt_shm_pair, &rt_table_floor,
};

/* place_row: one method in one placement; client (this process) on CPU 0, the server,
 * shmrefd and RouDi on CPU 0 (same) or 1 (cross); unpinned: anywhere. */
static void place_row(const struct rt_method *m, struct rt_ctx *base, const struct size_plan *p,
                      const struct daemons *ds, int pl, struct result *res)
{
    int mine = pl == PL_FREE ? -1 : 0, theirs = pl == PL_FREE ? -1 : pl == PL_SAME ? 0 : 1;
    const struct daemon *d = m->shmref ? &ds->d[POOL_DEVSHM] : NULL;
    if (m->iox) {
        iox_row(opts, p->size, p->warmup, p->iters, !m->notouch, mine, theirs, res);
        return;
    }
    base->placed = true;
    base->pin_client = mine;
    base->pin_server = theirs;
    if (d)
        wire_pin(d->pid, theirs);
    run_row(m, base, p, d, res);
    if (d)
        wire_pin(d->pid, -1);
    wire_pin(0, -1);
    base->placed = false;
}

int scenario_placement(const struct bench_opts *o, const struct daemons *ds)
{
    static const struct size_plan smoke = { 8000, "8 kB", 2, 1 };
    const struct size_plan full = { 8000, "8 kB", o->iters ? o->iters : 1000, 20 };
    const struct size_plan *p = o->smoke ? &smoke : &full;
    struct rt_ctx ctx = { .size = p->size, .full = o->smoke, .ctl = -1 };
    int nplace = sysconf(_SC_NPROCESSORS_ONLN) > 1 ? PL_N : PL_CROSS;
    opts = o;
    ctx.tmp_cap = b64_encoded_len(p->size);
    ctx.in = payload_alloc_warm(p->size);
    ctx.out = payload_alloc_warm(p->size);
    ctx.tmp = payload_alloc_warm(ctx.tmp_cap);
    if (!ctx.in || !ctx.out || !ctx.tmp)
        return -ENOMEM;
    fprintf(stderr, "shmref-bench: placement, %s ...\n", p->label);
    for (int pl = 0; pl < PL_N; pl++) {
        char label[24];
        struct result *base = NULL;
        snprintf(label, sizeof(label), "%s %s", p->label, placements[pl]);
        for (size_t i = 0; i < sizeof(placed_methods) / sizeof(placed_methods[0]); i++) {
            const struct rt_method *m = placed_methods[i];
            struct result *res = report_add("placement", m->name, m->shmref ? "dev-shm" : "", p->size, label);
            if ((o->method && strcmp(o->method, m->name)) || (o->placement >= 0 && o->placement != pl))
                snprintf(res->skipped, sizeof(res->skipped), "not asked for (--method, --placement)");
            else if (pl >= nplace)
                snprintf(res->skipped, sizeof(res->skipped), "one CPU online: no cross-CPU placement");
            else if (m->shmref && !ds->have[POOL_DEVSHM])
                snprintf(res->skipped, sizeof(res->skipped), "%s", ds->why[POOL_DEVSHM]);
            else
                place_row(m, &ctx, p, ds, pl, res);
            if (!base)
                base = res;
            else
                report_ratio(res, base);
        }
    }
    payload_free(ctx.in, p->size);
    payload_free(ctx.out, p->size);
    payload_free(ctx.tmp, ctx.tmp_cap);
    return 0;
}
