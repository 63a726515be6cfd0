/* SPDX-License-Identifier: MIT */
/* wire.c: the runner's plumbing: whole reads and writes, length-prefixed frames on a
 * stream socket, and spawning this binary as a server process on one end of a
 * socketpair (fork + exec, so the server has its own fresh address space). */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

int wire_send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int wire_recv_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -ECONNRESET;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int wire_send_frame(int fd, const void *hdr, size_t hlen, const void *body, size_t blen)
{
    uint64_t len = hlen + blen;
    struct iovec iov[3] = {
        { .iov_base = &len, .iov_len = sizeof(len) },
        { .iov_base = (void *)hdr, .iov_len = hlen },
        { .iov_base = (void *)body, .iov_len = blen },
    };
    struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 3 };
    /* One sendmsg for small frames; the rest of a large one goes out whole. */
    ssize_t n;
    do
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    size_t done = (size_t)n;
    for (int i = 0; i < 3; i++) {
        size_t l = iov[i].iov_len;
        if (done >= l) {
            done -= l;
            continue;
        }
        int r = wire_send_all(fd, (char *)iov[i].iov_base + done, l - done);
        if (r < 0)
            return r;
        done = 0;
    }
    return 0;
}

int wire_recv_frame_len(int fd, uint64_t *ret_len)
{
    return wire_recv_all(fd, ret_len, sizeof(*ret_len));
}

int wire_recv_frame(int fd, void *buf, size_t cap, size_t *ret_len)
{
    uint64_t len;
    int r = wire_recv_frame_len(fd, &len);
    if (r < 0)
        return r;
    if (len > cap)
        return -EMSGSIZE;
    if ((r = wire_recv_all(fd, buf, len)) < 0)
        return r;
    *ret_len = len;
    return 0;
}

const char *wire_self_exe(void)
{
    static char path[4096];
    if (!path[0]) {
        ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
        if (n <= 0)
            return NULL;
        path[n] = '\0';
    }
    return path;
}

/* child: becomes `self --serve role extra...` on fd 3. Never returns. */
static void child(int fd, const char *role, char *const extra[])
{
    char *argv[16];
    int n = 0;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    /* dup2 onto itself would keep FD_CLOEXEC: clear it by hand in that case. */
    if (fd == BENCH_CTL_FD ? fcntl(fd, F_SETFD, 0) < 0 : dup2(fd, BENCH_CTL_FD) < 0)
        _exit(127);
    argv[n++] = (char *)"shmref-bench-server";
    argv[n++] = (char *)"--serve";
    argv[n++] = (char *)role;
    for (int i = 0; extra && extra[i] && n < 15; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    execv(wire_self_exe(), argv);
    fprintf(stderr, "shmref-bench: exec %s: %s\n", wire_self_exe(), strerror(errno));
    _exit(127);
}

int wire_spawn(const char *role, int type, char *const extra[], int *ret_fd, pid_t *ret_pid)
{
    int sv[2];
    if (!wire_self_exe())
        return -ENOENT;
    if (socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(sv[0]);
        close(sv[1]);
        return -e;
    }
    if (pid == 0) {
        close(sv[0]);
        child(sv[1], role, extra);
    }
    close(sv[1]);
    *ret_fd = sv[0];
    *ret_pid = pid;
    return 0;
}

int wire_reap(int fd, pid_t pid)
{
    int st;
    if (fd >= 0)
        close(fd);
    if (pid <= 0)
        return 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -ECHILD;
}

int wire_pin(pid_t pid, int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpu >= n)
        return -EINVAL;
    for (long i = 0; i < n && i < CPU_SETSIZE; i++)
        if (cpu < 0 || i == cpu)
            CPU_SET((int)i, &set);
    return sched_setaffinity(pid, sizeof(set), &set) < 0 ? -errno : 0;
}

int wire_recv_path(int fd, struct wire_path *m)
{
    size_t len;
    int r = wire_recv_frame(fd, m, sizeof(*m), &len);
    if (r < 0)
        return r;
    if (len != sizeof(*m))
        return -EPROTO;
    m->path[sizeof(m->path) - 1] = '\0';
    return 0;
}
