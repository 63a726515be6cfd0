/* daemon.c: the shmrefd daemons the benchmark starts (this build's binary, each on a
 * socket of its own in the run's temporary directory), the private huge-page tmpfs of
 * the huge pool, and a few readings of /proc. The daemons die with the runner
 * (PR_SET_PDEATHSIG), so a killed run leaves no daemon behind. */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char huge_dir[256];

static void exec_daemon(const struct daemon *d, const struct bench_opts *o, char *const argv[])
{
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        dup2(fd, STDERR_FILENO);
        dup2(fd, STDOUT_FILENO);
    }
    execv(o->shmrefd, argv);
    fprintf(stderr, "exec %s: %s\n", o->shmrefd, strerror(errno));
    _exit(127);
}

/* wait_ready: poll until the daemon answers a hello, it exits, or 10 s pass. */
static int wait_ready(struct daemon *d)
{
    for (int i = 0; i < 1000; i++) {
        shmref_conn *c;
        if (shmref_connect(d->socket, &c) == 0) {
            shmref_close(c);
            return 0;
        }
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = 0;
            return -ECHILD;
        }
        nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
    }
    return -ETIMEDOUT;
}

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
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0)
        exec_daemon(d, o, argv);
    d->pid = pid;
    int r = wait_ready(d);
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
    kill(d->pid, SIGTERM);
    for (int i = 0; i < 500; i++) {
        pid_t w = waitpid(d->pid, NULL, WNOHANG);
        if (w == d->pid || (w < 0 && errno == ECHILD)) {
            d->pid = 0;
            return;
        }
        nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
    }
    fprintf(stderr, "shmref-bench: shmrefd (%s) ignored SIGTERM for 5 s; killing it\n", d->name);
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
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
    char line[512];
    FILE *f = fopen(d->log, "re");
    if (!f)
        return;
    fprintf(stderr, "---- %s ----\n", d->log);
    while (fgets(line, sizeof(line), f))
        fputs(line, stderr);
    fclose(f);
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
