/* SPDX-License-Identifier: MIT */
/* scenario-scale.c: daemon memory and lease latency while many leases are live, held by
 * forked holder processes of at most HOLDER_MAX each (every leased buffer is a mapping
 * in its holder, and a process may have 65530). Two series, each on a fresh daemon so
 * its RSS starts clean (--max-leases 200000):
 *  - leases: distinct leased 4 KiB buffers (1k, 10k, 100k). The daemon keeps an fd per
 *    buffer, so the count is capped by RLIMIT_NOFILE; when the hard limit cannot be
 *    raised, the series stops at the largest level that fits and says why.
 *  - acquires: read-only handles on 100 published buffers (1k, 10k, 100k): the same
 *    handle tables and holder accounting, without an fd per lease.
 * Latency is taken on a separate connection holding nothing: one lease round trip of a
 * recycled 4 KiB buffer, the release untimed. */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEASE_SIZE 4096
#define HOLDER_MAX 25000
#define MAX_HOLDERS 16
#define NPUBLISHED 100

struct holders {
    pid_t pid[MAX_HOLDERS];
    int hold[MAX_HOLDERS];            /* closing it lets the holder go */
    int n;
};

struct scale_run {
    struct daemon d;
    shmref_conn *c;                   /* measures */
    shmref_conn *prod;                /* acquires series: holds the published buffers */
    shmref_desc desc[NPUBLISHED];
    bool acquires;
    struct holders h;
    uint64_t held, rss0;
    unsigned samples;
    struct result *first;             /* the first level with leases: base of the ratios */
};

/* hold: k leases (or acquires of the published buffers) on a new connection. */
static int hold(const struct scale_run *s, unsigned k, shmref_conn **ret)
{
    shmref_buf *b;
    int r = shmref_connect(s->d.socket, ret);
    for (unsigned i = 0; r == 0 && i < k; i++)
        r = s->acquires ? shmref_acquire(*ret, &s->desc[i % NPUBLISHED], &b)
                        : shmref_lease(*ret, LEASE_SIZE, &b);
    return r;
}

/* holder: runs in a forked child; reports, keeps its leases until `keep` closes. */
static void holder(const struct scale_run *s, unsigned k, int report, int keep)
{
    shmref_conn *c = NULL;
    signal(SIGINT, SIG_DFL); /* the runner's handler cleans up for everyone */
    signal(SIGTERM, SIG_DFL);
    int r = hold(s, k, &c);
    if (r < 0)
        dprintf(report, "%s: %s\n", strerror(-r), c ? shmref_errmsg(c) : "connect failed");
    else
        dprintf(report, "ok\n");
    char x;
    while (read(keep, &x, 1) > 0)
        ;
    _exit(0); /* the daemon reclaims every lease at EOF */
}

/* add_holder: one more holder of k leases; waits until it holds them. */
static int add_holder(struct scale_run *s, unsigned k, char *why, size_t cap)
{
    struct holders *h = &s->h;
    int rep[2], keep[2];
    char line[256] = "";
    if (h->n == MAX_HOLDERS || pipe2(rep, O_CLOEXEC) < 0)
        return -EMFILE;
    if (pipe2(keep, O_CLOEXEC) < 0) {
        close(rep[0]);
        close(rep[1]);
        return -errno;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(rep[0]);
        close(keep[1]);
        for (int i = 0; i < h->n; i++)
            close(h->hold[i]);
        holder(s, k, rep[1], keep[0]);
    }
    close(rep[1]);
    close(keep[0]);
    h->pid[h->n] = pid;
    h->hold[h->n++] = keep[1];
    ssize_t n = read(rep[0], line, sizeof(line) - 1);
    close(rep[0]);
    if (pid < 0 || n < 2 || strncmp(line, "ok", 2)) {
        snprintf(why, cap, "holder: %s", n > 0 ? line : "died");
        why[strcspn(why, "\n")] = '\0';
        return -EIO;
    }
    return 0;
}

static void release_holders(struct holders *h)
{
    for (int i = 0; i < h->n; i++)
        close(h->hold[i]);
    for (int i = 0; i < h->n; i++)
        waitpid(h->pid[i], NULL, 0);
    h->n = 0;
}

/* measure: n lease round trips on c (each released, untimed). */
static int measure(shmref_conn *c, unsigned n, struct samples *s)
{
    for (unsigned i = 0; i < n; i++) {
        shmref_buf *b;
        uint64_t t0 = stats_now_ns();
        int r = shmref_lease(c, LEASE_SIZE, &b);
        uint64_t t1 = stats_now_ns();
        if (r < 0)
            return r;
        samples_add(s, (double)(t1 - t0) / 1e6);
        if ((r = shmref_release(b)) < 0)
            return r;
    }
    return 0;
}

/* grow: add holders until `live` are held; the fill rate in *ret_rate. */
static int grow(struct scale_run *s, uint64_t live, struct result *res, double *ret_rate)
{
    char why[160] = "";
    uint64_t t0 = stats_now_ns(), added = live - s->held;
    int r = 0;
    while (r == 0 && s->held < live) {
        unsigned k = live - s->held > HOLDER_MAX ? HOLDER_MAX : (unsigned)(live - s->held);
        if ((r = add_holder(s, k, why, sizeof(why))) == 0)
            s->held += k;
    }
    double secs = (double)(stats_now_ns() - t0) / 1e9;
    *ret_rate = secs > 0 ? (double)added / secs : 0;
    if (r < 0)
        snprintf(res->error, sizeof(res->error), "%s", why);
    return r;
}

static void note(struct scale_run *s, struct result *res, uint64_t live, double rate)
{
    res->rss_bytes = daemon_rss(&s->d);
    if (!live) {
        s->rss0 = res->rss_bytes;
        snprintf(res->note, sizeof(res->note), "RSS %.1f MiB", (double)res->rss_bytes / 1048576);
        return;
    }
    res->bytes_per_lease = ((double)res->rss_bytes - (double)s->rss0) / (double)live;
    snprintf(res->note, sizeof(res->note), "RSS %.1f MiB, %.0f B/lease; filled at %.0f/s",
             (double)res->rss_bytes / 1048576, res->bytes_per_lease, rate);
    if (!s->first)
        s->first = res;
    else
        report_ratio(res, s->first);
}

/* level: grow to `live` held leases, then measure and record a row. */
static int level(struct scale_run *s, uint64_t live)
{
    char label[40];
    struct samples smp;
    double rate = 0;
    snprintf(label, sizeof(label), "%llu%s %s", (unsigned long long)(live >= 1000 ? live / 1000 : live),
             live >= 1000 ? "k" : "", s->acquires ? "acquired" : "leased");
    struct result *res = report_add("scale", "lease-rt", "dev-shm", LEASE_SIZE, label);
    res->live_leases = live;
    int r = grow(s, live, res, &rate);
    if (r < 0)
        return r;
    samples_init(&smp, s->samples);
    if ((r = measure(s->c, s->samples, &smp)) < 0)
        snprintf(res->error, sizeof(res->error), "lease: %s: %s", strerror(-r), shmref_errmsg(s->c));
    report_fill(res, &smp);
    samples_free(&smp);
    note(s, res, live, rate);
    return r;
}

/* publish_some: the buffers the acquires series holds handles on. */
static int publish_some(struct scale_run *s)
{
    int r = shmref_connect(s->d.socket, &s->prod);
    for (int i = 0; r == 0 && i < NPUBLISHED; i++) {
        shmref_buf *b;
        if ((r = shmref_lease(s->prod, LEASE_SIZE, &b)) == 0)
            r = shmref_publish(b, LEASE_SIZE, 0, NULL, 0, &s->desc[i]);
    }
    return r;
}

static int start(struct scale_run *s, const struct bench_opts *o)
{
    char *extra[] = { (char *)"--max-leases", (char *)"200000", NULL };
    struct samples warm;
    int r = daemon_start(&s->d, o, s->acquires ? "scale-acq" : "scale", "/dev/shm", o->smoke ? "64M" : "768M", extra);
    if (r == 0 && (r = shmref_connect(s->d.socket, &s->c)) == 0 && samples_init(&warm, 200) == 0) {
        r = measure(s->c, o->smoke ? 10 : 200, &warm);
        samples_free(&warm);
    }
    if (r == 0 && s->acquires)
        r = publish_some(s);
    return r;
}

static void skip(bool acquires, uint64_t live, uint64_t nofile)
{
    char label[40];
    snprintf(label, sizeof(label), "%lluk %s", (unsigned long long)(live / 1000), acquires ? "acquired" : "leased");
    struct result *res = report_add("scale", "lease-rt", "dev-shm", LEASE_SIZE, label);
    res->live_leases = live;
    snprintf(res->skipped, sizeof(res->skipped),
             "RLIMIT_NOFILE hard limit is %llu and cannot be raised here (no CAP_SYS_RESOURCE); "
             "the daemon keeps an fd per leased buffer and allows its buffers 3/4 of the limit",
             (unsigned long long)nofile);
}

/* fd_skip: the last level of the leased series failed; if the daemon refused for its fd
 * limit, that is this machine's limit, not a failure: the row becomes a skip with the
 * numbers, and the series stops (returns 1). Any other failure stays one (returns -EIO). */
static int fd_skip(struct scale_run *s, uint64_t nofile)
{
    struct result *res = report_at(report_count() - 1);
    if (!res || !res->error[0] || (!strstr(res->error, "open files") && !strstr(res->error, "fd limit")))
        return -EIO;
    char why[sizeof(res->error)];
    snprintf(why, sizeof(why), "%s", res->error);
    snprintf(res->skipped, sizeof(res->skipped),
             "fd limit: the daemon refused at %llu held (RLIMIT_NOFILE %llu, hard limit not raisable here): %.120s",
             (unsigned long long)s->held, (unsigned long long)nofile, why);
    res->error[0] = '\0';
    return 1;
}

/* series: one daemon, levels 0 and the given ones (leased buffers capped by nofile). */
static int series(const struct bench_opts *o, bool acquires, const uint64_t *levels, size_t n, uint64_t nofile)
{
    struct scale_run s = { .samples = o->smoke ? 20 : 2000, .acquires = acquires };
    /* The daemon allows its buffers three quarters of RLIMIT_NOFILE (the rest for clients
     * and itself); keep a margin below that. */
    uint64_t room = nofile / 4 * 3 > 1000 ? nofile / 4 * 3 - 1000 : 0;
    int r = start(&s, o);
    if (r == 0)
        r = level(&s, 0);
    for (size_t i = 0; r == 0 && i < n; i++) {
        if (acquires || levels[i] <= room) {
            r = level(&s, levels[i]);
            if (r < 0 && !acquires)
                r = fd_skip(&s, nofile);
            continue;
        }
        if (room / 1000 * 1000 > s.held && (r = level(&s, room / 1000 * 1000)) < 0)
            r = fd_skip(&s, nofile); /* the largest that fits, then the skip */
        skip(acquires, levels[i], nofile);
        break;
    }
    if (r < 0)
        daemon_print_log(&s.d);
    r = r < 0 ? r : 0;
    release_holders(&s.h);
    shmref_close(s.c);
    shmref_close(s.prod);
    daemon_stop(&s.d);
    return r;
}

int scenario_scale(const struct bench_opts *o)
{
    static const uint64_t full[] = { 1000, 10000, 100000 }, smoke[] = { 100, 300 };
    const uint64_t *levels = o->smoke ? smoke : full;
    size_t n = o->smoke ? 2 : 3;
    fprintf(stderr, "shmref-bench: scale ...\n");
    uint64_t nofile = daemon_raise_nofile(300000);
    int r = series(o, false, levels, n, nofile);
    int r2 = series(o, true, levels, n, nofile);
    return r < 0 ? r : r2;
}
