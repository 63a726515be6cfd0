/* SPDX-License-Identifier: MIT */
/* main.c: shmref-bench, the benchmark suite of shmrefd. One run measures every scenario
 * side by side (round trip by method and size, lease latency, throughput, scale),
 * prints a table with ratios and the targets, and writes the records as JSON
 * (and a gnuplot data file). It starts its own daemons and its own huge-page tmpfs, in
 * a private mount namespace when it can, so nothing outlives the run.
 *   shmref-bench [--smoke] [--big] [--arrow] [--only LIST] [--json FILE] [--plot-data FILE]
 *                [--shmrefd PATH]
 * Exit status: 0 all measured (skips allowed), 1 a method failed or returned wrong
 * bytes, 2 usage. */
#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef BENCH_SHMREFD_PATH
#define BENCH_SHMREFD_PATH "shmrefd"
#endif

static char tmpdir[64];
static struct daemons ds;
const char *const bench_pool_names[POOL_N] = { "dev-shm", "huge", "auto" };

static const char usage[] =
    "Usage: shmref-bench [OPTION]...\n"
    "Benchmarks shmrefd against sockets, base64 and /dev/shm files, in one run.\n"
    "\n"
    "      --smoke           2 iterations per method at small sizes, every byte checked (fast)\n"
    "      --big             add the 800 MB round trip\n"
    "      --arrow           units of work (the producer's cost against one memcpy, a consumer's\n"
    "                        scan against the C Data Interface in one process) and lease_many\n"
    "                        at 1,024 with a SIGKILLed unread client: --only arrow,lease-many\n"
    "      --only LIST       scenarios to run, comma separated: roundtrip,placement,lease,\n"
    "                        lease-many,throughput,scale,arrow (arrow-e2e: its consumer rows only)\n"
    "      --json FILE       write the records as a JSON list\n"
    "      --plot-data FILE  write the round-trip medians for bench/plot.gp\n"
    "      --shmrefd PATH    the daemon binary (default: this build's)\n"
    "      --method NAME     placement: only this method (unix-bytes, shmref-0copy, ...)\n"
    "      --placement P     placement: only P (unpinned, same, cross)\n"
    "      --iters N         placement: N round trips per row (default 1000)\n";

static int parse(int argc, char **argv, struct bench_opts *o)
{
    enum { O_SMOKE = 256, O_BIG, O_ONLY, O_JSON, O_PLOT, O_SHMREFD, O_ARROW, O_METHOD, O_PLACEMENT, O_ITERS };
    static const struct option longopts[] = {
        { "smoke", no_argument, NULL, O_SMOKE }, { "big", no_argument, NULL, O_BIG },
        { "arrow", no_argument, NULL, O_ARROW },
        { "only", required_argument, NULL, O_ONLY }, { "json", required_argument, NULL, O_JSON },
        { "plot-data", required_argument, NULL, O_PLOT },
        { "shmrefd", required_argument, NULL, O_SHMREFD }, { "help", no_argument, NULL, 'h' },
        { "method", required_argument, NULL, O_METHOD }, { "placement", required_argument, NULL, O_PLACEMENT },
        { "iters", required_argument, NULL, O_ITERS },
        { 0 },
    };
    int c;
    *o = (struct bench_opts){ .shmrefd = BENCH_SHMREFD_PATH, .placement = -1 };
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_SMOKE: o->smoke = true; break;
        case O_BIG: o->big = true; break;
        case O_ARROW: o->arrow = true; o->only = "arrow,lease-many"; break;
        case O_ONLY: o->only = optarg; break;
        case O_JSON: o->json_path = optarg; break;
        case O_PLOT: o->plot_path = optarg; break;
        case O_SHMREFD: o->shmrefd = optarg; break;
        case O_METHOD: o->method = optarg; break;
        case O_PLACEMENT:
            if ((o->placement = !strcmp(optarg, "unpinned") ? 0 : !strcmp(optarg, "same") ? 1
                                : !strcmp(optarg, "cross") ? 2 : -2) == -2) {
                fprintf(stderr, "shmref-bench: --placement is unpinned, same or cross, not %s\n", optarg);
                return -EINVAL;
            }
            break;
        case O_ITERS: {
            char *end;
            unsigned long n = strtoul(optarg, &end, 10);
            if (*end || n == 0 || n > 10000000) {
                fprintf(stderr, "shmref-bench: --iters is 1 to 10,000,000, not %s\n", optarg);
                return -EINVAL;
            }
            o->iters = (unsigned)n;
            break;
        }
        case 'h': fputs(usage, stdout); return 1;
        default: fputs(usage, stderr); return -EINVAL;
        }
    }
    return optind < argc ? -EINVAL : 0;
}

static bool wanted(const struct bench_opts *o, const char *scenario)
{
    if (!o->only)
        return true;
    size_t n = strlen(scenario);
    for (const char *p = o->only; (p = strstr(p, scenario)); p += n)
        if ((p == o->only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

/* cleanup: every file this run may have left: sockets, logs, /dev/shm files, mount. */
static void cleanup(void)
{
    char prefix[64], path[512];
    snprintf(prefix, sizeof(prefix), "shmref-bench-%d-", (int)getpid());
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) {
            snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
            unlink(path);
        }
    if (d)
        closedir(d);
    daemon_huge_unmount();
    if (tmpdir[0] && (d = opendir(tmpdir))) {
        for (struct dirent *e; (e = readdir(d));)
            if (e->d_name[0] != '.') {
                snprintf(path, sizeof(path), "%s/%s", tmpdir, e->d_name);
                unlink(path);
            }
        closedir(d);
        rmdir(tmpdir);
    }
}

static void on_signal(int sig)
{
    for (int i = 0; i < POOL_N; i++)
        daemon_stop(&ds.d[i]);
    iox_roudi_stop();
    cleanup();
    _exit(128 + sig);
}

/* private_mounts: a mount namespace of our own, so the huge-page tmpfs goes away with
 * the last process of the run even if it is killed. Failing is fine: we unmount. */
static void private_mounts(void)
{
    if (unshare(CLONE_NEWNS) == 0)
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
}

static void start_huge(const struct bench_opts *o, const char *pool)
{
    const char *mount_size = o->smoke ? "320M" : o->big ? "3200M" : "2200M";
    char *why = ds.why[POOL_HUGE];
    if (daemon_huge_mount(mount_size, ds.huge_dir, sizeof(ds.huge_dir), why, sizeof(ds.why[0])) < 0) {
        fprintf(stderr, "shmref-bench: huge-page pool skipped: %s\n", why);
        return;
    }
    if (daemon_start(&ds.d[POOL_HUGE], o, "huge", ds.huge_dir, pool, NULL) == 0)
        ds.have[POOL_HUGE] = true;
    else
        snprintf(why, sizeof(ds.why[0]), "shmrefd did not start on %s", ds.huge_dir);
}

/* start_daemons: the /dev/shm daemon must run (the other scenarios use it); the huge
 * and default pools are skipped, with the reason, if they cannot be had. */
static int start_daemons(const struct bench_opts *o)
{
    const char *pool = o->smoke ? "256M" : o->big ? "3G" : "2G";
    /* A daemon that can mount its own huge-page pool is told not to, for the 4 KiB row. */
    bool own_huge = daemon_has_option(o, "--pool-hugepages");
    char *small[] = { (char *)"--pool-hugepages", (char *)"no", NULL };
    int r = daemon_start(&ds.d[POOL_DEVSHM], o, "dev-shm", "/dev/shm", pool, own_huge ? small : NULL);
    if (r < 0)
        return r;
    ds.have[POOL_DEVSHM] = true;
    start_huge(o, pool);
    if (!own_huge)
        snprintf(ds.why[POOL_AUTO], sizeof(ds.why[0]), "this shmrefd has no pool of its own but /dev/shm");
    else if (daemon_start(&ds.d[POOL_AUTO], o, "auto", "/dev/shm", pool, NULL) == 0)
        ds.have[POOL_AUTO] = true;
    else
        snprintf(ds.why[POOL_AUTO], sizeof(ds.why[0]), "shmrefd with its default pool did not start");
    return 0;
}

/* stop_daemon: stops d; -ECHILD if it had already died (its log is printed). */
static int stop_daemon(struct daemon *d)
{
    int st;
    if (d->pid > 0 && waitpid(d->pid, &st, WNOHANG) == d->pid) {
        fprintf(stderr, "shmref-bench: shmrefd (%s) died during the run\n", d->name);
        daemon_print_log(d);
        d->pid = 0;
        return -ECHILD;
    }
    daemon_stop(d);
    return 0;
}

static int run(const struct bench_opts *o)
{
    int r = start_daemons(o);
    if (r < 0)
        return r;
    if (wanted(o, "roundtrip"))
        scenario_roundtrip(o, &ds);
    if (wanted(o, "placement"))
        scenario_placement(o, &ds);
    iox_roudi_stop(); /* started by the first iceoryx row, if any */
    if (wanted(o, "lease"))
        scenario_lease(o, &ds);
    if (wanted(o, "lease-many"))
        scenario_lease_many(o, &ds);
    if (wanted(o, "throughput"))
        scenario_throughput(o, &ds);
    if (o->only ? wanted(o, "arrow") : o->smoke) /* not in a default run: its own table */
        scenario_arrow(o, &ds);
    else if (o->only && wanted(o, "arrow-e2e"))
        scenario_arrow_e2e(o, &ds);
    r = 0;
    for (int i = 0; i < POOL_N; i++)
        if (stop_daemon(&ds.d[i]) < 0)
            r = -ECHILD;
    daemon_huge_unmount();
    if (wanted(o, "scale"))
        scenario_scale(o);
    return r;
}

static void write_outputs(const struct bench_opts *o)
{
    int r;
    if (o->json_path && (r = report_write_json(o->json_path)) < 0)
        fprintf(stderr, "shmref-bench: %s: %s\n", o->json_path, strerror(-r));
    if (o->plot_path && (r = report_write_plot(o->plot_path)) < 0)
        fprintf(stderr, "shmref-bench: %s: %s\n", o->plot_path, strerror(-r));
}

int main(int argc, char **argv)
{
    struct bench_opts o;
    if (argc > 1 && !strcmp(argv[1], "--serve"))
        return server_main(argc, argv);
    int r = parse(argc, argv, &o);
    if (r != 0)
        return r > 0 ? 0 : 2;
    signal(SIGPIPE, SIG_IGN);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/shmref-bench-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("shmref-bench: mkdtemp");
        return 1;
    }
    o.tmpdir = tmpdir;
    struct sigaction sa = { .sa_handler = on_signal };
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    private_mounts();
    daemon_raise_nofile(300000); /* before any daemon starts: they inherit it */
    double load = 0;
    if (getloadavg(&load, 1) == 1 && load > 0.5)
        fprintf(stderr, "shmref-bench: load average %.2f before the run: other work is running, "
                        "expect noisy numbers\n", load);
    uint64_t t0 = stats_now_ns();
    r = run(&o);
    iox_roudi_stop();
    double secs = (double)(stats_now_ns() - t0) / 1e9;
    cleanup();
    report_print_table();
    report_print_targets();
    write_outputs(&o);
    int errors = report_errors();
    printf("\n%s: %zu rows, %d failed, in %.0f s (load average %.2f at the start)%s\n",
           o.smoke ? "smoke" : "bench", report_count(), errors, secs, load, r < 0 ? " (a daemon failed)" : "");
    return errors || r < 0 ? 1 : 0;
}
