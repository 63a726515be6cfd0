/* SPDX-License-Identifier: MIT */
/* scenario-iox.c: the runner's side of the iceoryx rows. It starts RouDi (iox-roudi,
 * Debian's iceoryx 2.0.3) with a config of its own written to the run's temporary
 * directory (mempools sized for the bench's arrays), spawns shmref-bench-iox as server
 * and as client (iox.c), pins them for a placement, collects the client's timings, and
 * stops RouDi at the end, on failure and on a signal (main.c's handler). Whatever the
 * machine cannot do (no binding built, no iox-roudi, RouDi not starting, an array over
 * the largest mempool) is a skipped row with the reason. */
#include "bench.h"
#include "launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef BENCH_IOX_PATH
#define BENCH_IOX_PATH ""             /* built without libiceoryx-binding-c-dev */
#endif
#define ROUDI "/usr/bin/iox-roudi"
#define IOX_MAX_SIZE 83886080u        /* the largest mempool's chunk payload (80 MiB) */

static pid_t roudi_pid;
static char roudi_log[256];
static char why_not[200];             /* set once RouDi could not be had */

/* The mempools: chunk payload sizes (RouDi adds the chunk header) and counts. A round
 * trip holds at most two requests and two replies at once. */
static const char roudi_config[] =
    "[general]\nversion = 1\n\n[[segment]]\n\n"
    "[[segment.mempool]]\nsize = 16384\ncount = 64\n\n"
    "[[segment.mempool]]\nsize = 1048576\ncount = 16\n\n"
    "[[segment.mempool]]\nsize = 4194304\ncount = 8\n\n"
    "[[segment.mempool]]\nsize = 83886080\ncount = 6\n";

pid_t iox_roudi_pid(void)
{
    return roudi_pid;
}

void iox_roudi_stop(void)
{
    int st = 0;
    if (roudi_pid <= 0)
        return;
    if (launcher_stop(roudi_pid, 5000, &st) == 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
        /* Killed, so it could not remove its segments; only one RouDi runs per machine
         * and it was ours, so they are ours to remove. */
        char user[64];
        snprintf(user, sizeof(user), "/dev/shm/%s", getenv("USER") ? getenv("USER") : "root");
        unlink("/dev/shm/iceoryx_mgmt");
        unlink(user);
    }
    roudi_pid = 0;
}

/* wait_roudi: until its log says it is ready, or it exits, or 15 s pass. */
static int wait_roudi(void)
{
    for (int i = 0; i < 6000; i++) {
        int st;
        if (waitpid(roudi_pid, &st, WNOHANG) == roudi_pid) {
            roudi_pid = 0;
            return -ECHILD;
        }
        if (launcher_log_contains(roudi_log, "RouDi is ready for clients"))
            return 0;
        usleep(10000);
    }
    return -ETIMEDOUT;
}

int iox_roudi_start(const struct bench_opts *o)
{
    char conf[256];
    if (roudi_pid > 0)
        return 0;
    if (why_not[0])
        return -ENOENT; /* tried once in this run: do not wait for it again */
    if (!BENCH_IOX_PATH[0]) {
        snprintf(why_not, sizeof(why_not), "iceoryx not built: libiceoryx-binding-c-dev was not installed at configure time");
        return -ENOENT;
    }
    if (access(ROUDI, X_OK) < 0) {
        snprintf(why_not, sizeof(why_not), "%s not installed (Debian package iceoryx)", ROUDI);
        return -ENOENT;
    }
    snprintf(conf, sizeof(conf), "%s/roudi.toml", o->tmpdir);
    snprintf(roudi_log, sizeof(roudi_log), "%s/roudi.log", o->tmpdir);
    FILE *f = fopen(conf, "we");
    if (!f || fputs(roudi_config, f) < 0 || fclose(f) != 0) {
        snprintf(why_not, sizeof(why_not), "cannot write %.150s", conf);
        return -EIO;
    }
    /* Monitoring off: on a loaded 2-vCPU machine a stalled client missed its keep-alive,
     * RouDi dropped it, and the client then hung at exit waiting for an answer. */
    char *argv[] = { (char *)"iox-roudi", (char *)"-c", conf, (char *)"-l", (char *)"info",
                     (char *)"-m", (char *)"off", NULL };
    int r = launcher_spawn(ROUDI, argv, roudi_log, LAUNCHER_PDEATHSIG, &roudi_pid);
    if (r == 0)
        r = wait_roudi();
    if (r < 0) {
        snprintf(why_not, sizeof(why_not), "iox-roudi %s (another RouDi running? one per machine)",
                 r == -ECHILD ? "exited at start" : "did not start in 60 s");
        fprintf(stderr, "shmref-bench: %s\n", why_not);
        launcher_print_log(roudi_log, stderr);
        iox_roudi_stop();
    }
    return r;
}

/* spawn: shmref-bench-iox with args, its fd 3 one end of a stream socketpair. */
static int spawn(char *const argv[], int *ret_fd, pid_t *ret_pid)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(sv[0]);
        close(sv[1]);
        return -e;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (dup2(sv[1], BENCH_CTL_FD) < 0)
            _exit(127);
        execv(BENCH_IOX_PATH, argv);
        _exit(127);
    }
    close(sv[1]);
    *ret_fd = sv[0];
    *ret_pid = pid;
    return 0;
}

/* reap: closes fd (a server sees EOF) and waits for pid, 30 s at most (RouDi unregisters
 * a runtime slowly on a loaded machine: 10 s was seen to pass at load 20): then SIGKILL
 * and -ETIMEDOUT. */
static int reap(int fd, pid_t pid)
{
    int st = 0;
    if (fd >= 0)
        close(fd);
    if (pid <= 0)
        return 0;
    for (int i = 0; i < 3000; i++) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -ECHILD;
        if (r < 0 && errno != EINTR)
            return -errno;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -ETIMEDOUT;
}

/* collect: "ready", the go byte, then the samples and "end BAD". */
static int collect(int fd, pid_t client, int pin_client, struct samples *s, size_t *bad, char *err, size_t cap)
{
    struct timeval tv = { .tv_sec = 120 }; /* a stuck client: fgets fails, the row fails */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    FILE *f = fdopen(dup(fd), "r");
    char line[256] = "";
    int r = -EPROTO;
    if (!f)
        return -errno;
    if (!fgets(line, sizeof(line), f) || strncmp(line, "ready", 5)) {
        snprintf(err, cap, "iceoryx client: %.120s", strncmp(line, "error ", 6) ? "did not start" : line + 6);
        goto out;
    }
    wire_pin(client, pin_client);
    if (write(fd, "g", 1) != 1)
        goto out;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "end ", 4)) {
            *bad = strtoull(line + 4, NULL, 10);
            r = 0;
            break;
        }
        if (!strncmp(line, "error ", 6)) {
            snprintf(err, cap, "iceoryx client: %.120s", line + 6);
            break;
        }
        samples_add(s, strtod(line, NULL));
    }
    if (r < 0 && !err[0])
        snprintf(err, cap, "iceoryx client died");
out:
    err[strcspn(err, "\n")] = '\0';
    fclose(f);
    return r;
}

void iox_row(const struct bench_opts *o, size_t size, unsigned warmup, unsigned iters, bool touch,
             int pin_client, int pin_server, struct result *res)
{
    char sz[24], wu[16], it[16], tc[4], fl[4];
    char *sargv[] = { (char *)"shmref-bench-iox", (char *)"server", sz, tc, fl, NULL };
    char *cargv[] = { (char *)"shmref-bench-iox", (char *)"client", sz, wu, it, tc, fl, NULL };
    struct samples s;
    int sfd = -1, cfd = -1;
    pid_t spid = 0, cpid = 0;
    size_t bad = 0;
    char err[160] = "";
    if (roudi_pid <= 0 && iox_roudi_start(o) < 0) {
        snprintf(res->skipped, sizeof(res->skipped), "%s", why_not);
        return;
    }
    if (size > IOX_MAX_SIZE) {
        snprintf(res->skipped, sizeof(res->skipped), "%zu bytes is over the largest mempool of the bench's RouDi config (%u)",
                 size, IOX_MAX_SIZE);
        return;
    }
    snprintf(sz, sizeof(sz), "%zu", size);
    snprintf(wu, sizeof(wu), "%u", warmup);
    snprintf(it, sizeof(it), "%u", iters);
    snprintf(tc, sizeof(tc), "%d", touch);
    snprintf(fl, sizeof(fl), "%d", o->smoke);
    if (samples_init(&s, iters) < 0)
        return;
    int r = spawn(sargv, &sfd, &spid);
    if (r == 0) {
        wire_pin(spid, pin_server);
        wire_pin(roudi_pid, pin_server);
        r = spawn(cargv, &cfd, &cpid);
    }
    if (r < 0)
        snprintf(err, sizeof(err), "spawn shmref-bench-iox: %s", strerror(-r));
    else
        r = collect(cfd, cpid, pin_client, &s, &bad, err, sizeof(err));
    int rc = reap(cfd, cpid), rs = reap(sfd, spid);
    wire_pin(roudi_pid, -1);
    report_fill(res, &s);
    /* A helper that sent every sample and its check ("end 0") and then hung in iceoryx's
     * teardown (seen once, on one CPU with RouDi under a loaded machine) measured the row
     * completely: a note, not a failure. Any other exit error fails the row. */
    bool teardown_hang = (rc == -ETIMEDOUT || rc == 0) && (rs == -ETIMEDOUT || rs == 0) && (rc < 0 || rs < 0);
    if (r < 0)
        snprintf(res->error, sizeof(res->error), "%s", err);
    else if (bad)
        snprintf(res->error, sizeof(res->error), "%zu wrong words in the output", bad);
    else if ((rc < 0 || rs < 0) && !teardown_hang)
        snprintf(res->error, sizeof(res->error), "shmref-bench-iox %s exited with an error", rc < 0 ? "client" : "server");
    if (!res->error[0]) {
        res->waits = 0; /* RouDi is not on the data path: nothing waits for it per call */
        if (teardown_hang)
            snprintf(res->note, sizeof(res->note), "shmref-bench-iox %s killed after 30 s in its teardown",
                     rc < 0 ? "client" : "server");
    }
    samples_free(&s);
}

/* Described in the table like the other methods; run by iox_row, not through call. */
const struct rt_method rt_iceoryx = { .name = "iceoryx", .iox = true };
const struct rt_method rt_iceoryx_notouch = { .name = "iceoryx-notouch", .iox = true, .notouch = true };
