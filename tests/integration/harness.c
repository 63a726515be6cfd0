/* SPDX-License-Identifier: MIT */
/* harness.c: see harness.h. Starting daemons and raw connections are tests/support's
 * (shared with bench/); this file turns their errors into Criterion failures. */
#include "harness.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"
#include "proto.h"
#include "rawclient.h"

#ifndef SHMREFD_BIN
#error "SHMREFD_BIN must name the daemon binary under test"
#endif

long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

void daemon_start(struct daemon *d, ...)
{
    const char *argv[64];
    int argc = 0, st = 0;
    va_list ap;

    memset(d, 0, sizeof(*d));
    strcpy(d->dir, "/tmp/shmref-test-XXXXXX");
    cr_assert_not_null(mkdtemp(d->dir), "mkdtemp: %s", strerror(errno));
    chmod(d->dir, 0755); /* tests run clients as other uids too */
    snprintf(d->socket, sizeof(d->socket), "%s/shmrefd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/shmrefd.log", d->dir);
    argv[argc++] = SHMREFD_BIN;
    argv[argc++] = "--socket";
    argv[argc++] = d->socket;
    argv[argc++] = "--verbose";
    va_start(ap, d);
    const char *a;
    bool user = false;
    while ((a = va_arg(ap, const char *)) && argc < 60) {
        user = user || strcmp(a, "--user") == 0 || strcmp(a, "--config") == 0; /* the file may say */
        argv[argc++] = a;
    }
    va_end(ap);
    /* These suites count on a daemon of uid 0 (the daemon's own uid is exempt from per-uid
     * limits and sees every tenant): a root shmrefd given no --user would become an
     * unprivileged user, which tests/cli/test-cli.sh checks. A test with a config file leaves
     * the user to it. */
    if (!user && geteuid() == 0) {
        argv[argc++] = "--user";
        argv[argc++] = "root";
    }
    argv[argc] = NULL;

    /* The daemon gets nothing of the test process but stdio, and goes with it: a failed
     * assertion ends the test process without daemon_stop, which used to leave the daemon. */
    int r = launcher_spawn(SHMREFD_BIN, (char *const *)argv, d->log, LAUNCHER_CLOSE_FDS | LAUNCHER_PDEATHSIG, &d->pid);
    cr_assert_eq(r, 0, "fork: %s", strerror(-r));
    r = launcher_wait_ready(d->pid, d->socket, 10000, &st);
    if (r == -ECHILD)
        cr_assert_fail("shmrefd exited during start (status %d); see %s", st, d->log);
    cr_assert_eq(r, 0, "shmrefd did not answer within 10 s; see %s", d->log);
}

void daemon_stop(struct daemon *d)
{
    int st = 0;
    int r = launcher_stop(d->pid, 60000, &st);
    cr_assert_eq(r, 0, "stopping shmrefd: %s", strerror(-r));
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "shmrefd did not exit 0 on SIGTERM (status %#x); see %s",
              st, d->log);
    cr_assert(!daemon_log_contains(d, "handles still open"), "shmrefd leaked a libuv handle");
    unlink(d->log);
    unlink(d->socket);
    rmdir(d->dir);
}

int daemon_fds(const struct daemon *d)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)d->pid);
    DIR *dir = opendir(path);
    cr_assert_not_null(dir, "%s: %s", path, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)))
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

int daemon_log_contains(const struct daemon *d, const char *text)
{
    return launcher_log_contains(d->log, text);
}

shmref_conn *connect_ok(const struct daemon *d)
{
    shmref_conn *c = NULL;
    int r = shmref_connect(d->socket, &c);
    cr_assert_eq(r, 0, "shmref_connect(%s): %s", d->socket, strerror(-r));
    return c;
}

uint64_t status_u64(const struct daemon *d, const char *path)
{
    shmref_conn *c = connect_ok(d);
    shmref_status *st;
    uint64_t v = 0;
    cr_assert_eq(shmref_status_get(c, &st), 0, "status: %s", shmref_errmsg(c));
    int r = shmref_status_u64(st, path, &v);
    cr_assert_eq(r, 0, "status has no number at %s (%d)", path, r);
    shmref_status_free(st);
    shmref_close(c);
    return v;
}

uint64_t wait_status(const struct daemon *d, const char *path, uint64_t want, int ms)
{
    long deadline = now_ms() + ms;
    uint64_t v;
    while ((v = status_u64(d, path)) != want && now_ms() < deadline)
        usleep(2000);
    return v;
}

int raw_connect(const struct daemon *d)
{
    int fd = rawclient_connect(d->socket);
    cr_assert_geq(fd, 0, "connect: %s", strerror(-fd));
    return fd;
}

ssize_t raw_roundtrip(int fd, const void *msg, size_t len, void *reply, size_t cap, int ms)
{
    return rawclient_call(fd, msg, len, reply, cap, ms);
}

void raw_hello(int fd)
{
    uint8_t buf[256], rep[4096];
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 };
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.name = "raw";
    m.u.hello.name_len = 3;
    int n = proto_encode(&m, buf, sizeof(buf));
    cr_assert_gt(n, 0);
    ssize_t r = raw_roundtrip(fd, buf, (size_t)n, rep, sizeof(rep), 5000);
    cr_assert_gt(r, 0, "no hello reply (%zd)", r);
    struct proto_msg got;
    const char *why;
    cr_assert_eq(proto_decode(rep, (size_t)r, sizeof(rep), &got, &why), 0);
    cr_assert_eq(got.op, PROTO_OP_HELLO + PROTO_OP_REPLY);
}

int raw_closed(int fd, int ms)
{
    return rawclient_closed(fd, ms);
}

uint32_t xorshift(uint32_t *s)
{
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

void fill_pattern(void *p, size_t len, uint32_t seed)
{
    uint32_t s = seed | 1, *w = p;
    size_t n = len / 4;
    for (size_t i = 0; i < n; i++)
        w[i] = xorshift(&s);
    for (size_t i = n * 4; i < len; i++)
        ((uint8_t *)p)[i] = (uint8_t)xorshift(&s);
}

ssize_t check_pattern(const void *p, size_t len, uint32_t seed)
{
    uint32_t s = seed | 1;
    const uint32_t *w = p;
    size_t n = len / 4;
    for (size_t i = 0; i < n; i++)
        if (w[i] != xorshift(&s))
            return (ssize_t)(i * 4);
    for (size_t i = n * 4; i < len; i++)
        if (((const uint8_t *)p)[i] != (uint8_t)xorshift(&s))
            return (ssize_t)i;
    return -1;
}

pid_t child_run(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(fn(arg));
    return pid;
}

int child_wait(pid_t pid)
{
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

void reap_children(void)
{
    DIR *dir = opendir("/proc");
    if (!dir)
        return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        char path[300], buf[512];
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *rp = strrchr(buf, ')');
        int ppid;
        if (rp && sscanf(rp + 1, " %*c %d", &ppid) == 1 && ppid == getpid()) {
            pid_t pid = (pid_t)atoi(e->d_name);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
    }
    closedir(dir);
}

bool read_full(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}
