/* SPDX-License-Identifier: MIT */
/* daemon.c: the shmrefd daemons the benchmark starts (this build's binary, each on a
 * socket of its own in the run's temporary directory), the private huge-page tmpfs of
 * the huge pool, and a few readings of /proc. Starting and stopping is tests/support's
 * launcher; the daemons die with the runner (PR_SET_PDEATHSIG), so a killed run leaves
 * no daemon behind. */
#include "bench.h"
#include "launcher.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char huge_dir[256];

int daemon_start(struct daemon *d, const struct bench_opts *o, const char *name,
                 const char *pool_dir, const char *pool_size, char *const extra[])
{
    char *argv[32];
    int n = 0;
    memset(d, 0, sizeof(*d));
    snprintf(d->name, sizeof(d->name), "%s", name);
    snprintf(d->socket, sizeof(d->socket), "%s/%s.sock", o->tmpdir, name);
    snprintf(d->log, sizeof(d->log), "%s/%s.log", o->tmpdir, name);
    argv[n++] = (char *)"shmrefd";
    argv[n++] = (char *)"--socket";
    argv[n++] = d->socket;
    argv[n++] = (char *)"--pool-dir";
    argv[n++] = (char *)pool_dir;
    argv[n++] = (char *)"--pool-size";
    argv[n++] = (char *)pool_size;
    argv[n++] = (char *)"--tenant-quota";
    argv[n++] = (char *)pool_size;
    for (int i = 0; extra && extra[i] && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    int r = launcher_spawn(o->shmrefd, argv, d->log, LAUNCHER_PDEATHSIG, &d->pid);
    if (r < 0)
        return r;
    r = launcher_wait_ready(d->pid, d->socket, 10000, NULL);
    if (r == -ECHILD)
        d->pid = 0; /* exited, and reaped */
    if (r < 0) {
        fprintf(stderr, "shmref-bench: shmrefd (%s) did not start: %s\n", name, strerror(-r));
        daemon_print_log(d);
        daemon_stop(d);
    }
    return r;
}

void daemon_stop(struct daemon *d)
{
    if (d->pid <= 0)
        return;
    int st = 0;
    if (launcher_stop(d->pid, 5000, &st) == 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
        fprintf(stderr, "shmref-bench: shmrefd (%s) ignored SIGTERM for 5 s; killed it\n", d->name);
    d->pid = 0;
}

bool daemon_has_option(const struct bench_opts *o, const char *opt)
{
    char cmd[4200], line[512];
    bool found = false;
    snprintf(cmd, sizeof(cmd), "'%s' --help 2>&1", o->shmrefd);
    FILE *f = popen(cmd, "re");
    if (!f)
        return false;
    while (fgets(line, sizeof(line), f))
        found = found || strstr(line, opt) != NULL;
    pclose(f);
    return found;
}

/* status_kb: the "key: N kB" line of a /proc status-like file, in kB, or 0. */
static uint64_t status_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "re");
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtoull(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

uint64_t daemon_counter(shmref_conn *conn, const char *path)
{
    shmref_status *st;
    uint64_t v = 0;
    if (shmref_status_get(conn, &st) == 0) {
        shmref_status_u64(st, path, &v);
        shmref_status_free(st);
    }
    return v;
}

uint64_t daemon_rss(const struct daemon *d)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
    return status_kb(path, "VmRSS") * 1024;
}

uint64_t daemon_self_pmd_kb(void)
{
    return status_kb("/proc/self/smaps_rollup", "ShmemPmdMapped") +
           status_kb("/proc/self/smaps_rollup", "FilePmdMapped");
}

void daemon_print_log(const struct daemon *d)
{
    launcher_print_log(d->log, stderr);
}

int daemon_huge_mount(const char *size, char *dir, size_t dir_cap, char *why, size_t why_cap)
{
    char opts[96];
    snprintf(huge_dir, sizeof(huge_dir), "/tmp/shmref-huge-XXXXXX");
    if (!mkdtemp(huge_dir)) {
        int e = errno;
        snprintf(why, why_cap, "mkdtemp: %s", strerror(e));
        huge_dir[0] = '\0';
        return -e;
    }
    snprintf(opts, sizeof(opts), "huge=within_size,size=%s,mode=1777", size);
    if (mount("shmref-bench-huge", huge_dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) {
        int e = errno;
        snprintf(why, why_cap, "mount -t tmpfs -o %s: %s", opts, strerror(e));
        rmdir(huge_dir);
        huge_dir[0] = '\0';
        return -e;
    }
    snprintf(dir, dir_cap, "%s", huge_dir);
    return 0;
}

void daemon_huge_unmount(void)
{
    if (!huge_dir[0])
        return;
    if (umount2(huge_dir, 0) < 0)
        umount2(huge_dir, MNT_DETACH);
    rmdir(huge_dir);
    huge_dir[0] = '\0';
}

uint64_t daemon_raise_nofile(uint64_t n)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    struct rlimit want = { .rlim_cur = n, .rlim_max = n > rl.rlim_max ? n : rl.rlim_max };
    if (setrlimit(RLIMIT_NOFILE, &want) < 0) {
        /* Not allowed to raise the hard limit: take what it allows. */
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    getrlimit(RLIMIT_NOFILE, &rl);
    return rl.rlim_cur;
}
