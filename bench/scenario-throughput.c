/* SPDX-License-Identifier: MIT */
/* scenario-throughput.c: lease+release pairs per second with 1, 4 and 16 client
 * processes, each on its own connection, for a fixed time. The clients are forked from
 * the runner, connect, warm up, and wait at a barrier (a pipe the runner closes); each
 * times its own pairs into a shared anonymous mapping the runner reads afterwards. */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAIR_SIZE 4096
#define SAMPLE_SLOTS (4u << 20)       /* floats shared by all clients of one row */

struct shared {
    uint64_t deadline_ns;             /* written before the barrier opens */
    struct {
        uint64_t pairs, start_ns, end_ns;
        int err;
    } c[64];
    float ms[];                       /* SAMPLE_SLOTS, split evenly between the clients */
};

/* client: runs in a forked child; never returns. */
static void client(const char *socket, struct shared *sh, int idx, size_t cap, int ready, int go)
{
    shmref_conn *conn;
    shmref_buf *b;
    float *ms = sh->ms + (size_t)idx * cap;
    char c = 'r';
    signal(SIGINT, SIG_DFL); /* the runner's handler cleans up for everyone */
    signal(SIGTERM, SIG_DFL);
    int r = shmref_connect(socket, &conn);
    for (int i = 0; r == 0 && i < 50; i++)
        if ((r = shmref_lease(conn, PAIR_SIZE, &b)) == 0)
            r = shmref_release(b);
    if (write(ready, &c, 1) != 1 || read(go, &c, 1) < 0)
        r = -EPIPE;
    uint64_t start = stats_now_ns(), now = start, n = 0;
    while (r == 0 && now < sh->deadline_ns) {
        if ((r = shmref_lease(conn, PAIR_SIZE, &b)) == 0)
            r = shmref_release(b);
        uint64_t t = stats_now_ns();
        if (n < cap)
            ms[n] = (float)((double)(t - now) / 1e6);
        n++;
        now = t;
    }
    sh->c[idx].pairs = n;
    sh->c[idx].start_ns = start;
    sh->c[idx].end_ns = now;
    sh->c[idx].err = r;
    _exit(0); /* not exit(): the runner's atexit cleanup is not ours */
}

static int spawn_clients(const char *socket, struct shared *sh, int n, size_t cap, pid_t *pids,
                         int *ret_go)
{
    int ready[2], go[2];
    char c;
    if (pipe2(ready, O_CLOEXEC) < 0)
        return -errno;
    if (pipe2(go, O_CLOEXEC) < 0) {
        close(ready[0]);
        close(ready[1]);
        return -errno;
    }
    fflush(NULL);
    for (int i = 0; i < n; i++) {
        if ((pids[i] = fork()) == 0) {
            close(ready[0]);
            close(go[1]);
            client(socket, sh, i, cap, ready[1], go[0]);
        }
    }
    close(ready[1]);
    close(go[0]);
    int got = 0;
    while (got < n && read(ready[0], &c, 1) == 1)
        got++;
    close(ready[0]);
    *ret_go = go[1];
    return got == n ? 0 : -ECHILD;
}

/* run: one row with n clients for dur_ns. */
static void run(const char *socket, struct shared *sh, int n, uint64_t dur_ns, struct result *res)
{
    pid_t pids[64];
    int go = -1;
    size_t cap = SAMPLE_SLOTS / (size_t)n;
    memset(sh, 0, sizeof(*sh));
    sh->deadline_ns = UINT64_MAX;
    int r = spawn_clients(socket, sh, n, cap, pids, &go);
    uint64_t t0 = stats_now_ns();
    sh->deadline_ns = t0 + dur_ns;
    __sync_synchronize();
    if (go >= 0)
        close(go); /* opens the barrier */
    for (int i = 0; i < n; i++)
        waitpid(pids[i], NULL, 0);
    struct samples s;
    samples_init(&s, 1024);
    uint64_t pairs = 0, end = t0;
    for (int i = 0; i < n; i++) {
        pairs += sh->c[i].pairs;
        end = sh->c[i].end_ns > end ? sh->c[i].end_ns : end;
        if (sh->c[i].err < 0 && r == 0)
            r = sh->c[i].err;
        for (uint64_t j = 0; j < sh->c[i].pairs && j < cap; j++)
            samples_add(&s, sh->ms[(size_t)i * cap + j]);
    }
    report_fill(res, &s);
    res->iterations = pairs;
    res->ops_per_s = end > t0 ? (double)pairs / ((double)(end - t0) / 1e9) : 0;
    snprintf(res->note, sizeof(res->note), "%.0f pairs/s", res->ops_per_s);
    if (r < 0)
        snprintf(res->error, sizeof(res->error), "a client failed: %s", strerror(-r));
    samples_free(&s);
}

int scenario_throughput(const struct bench_opts *o, const struct daemons *ds)
{
    static const int procs[] = { 1, 4, 16 };
    size_t bytes = sizeof(struct shared) + SAMPLE_SLOTS * sizeof(float);
    struct shared *sh = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return -errno;
    fprintf(stderr, "shmref-bench: throughput ...\n");
    struct result *base = NULL;
    for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
        char label[24];
        snprintf(label, sizeof(label), "%d client%s", procs[i], procs[i] > 1 ? "s" : "");
        struct result *res = report_add("throughput", "lease+release", "dev-shm", PAIR_SIZE, label);
        res->clients = (uint32_t)procs[i];
        run(ds->d[POOL_DEVSHM].socket, sh, procs[i], o->smoke ? 200000000ull : 2000000000ull, res);
        if (!base)
            base = res;
        else
            report_ratio(res, base);
    }
    munmap(sh, bytes);
    return 0;
}
