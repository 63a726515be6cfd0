/* SPDX-License-Identifier: MIT */
/* launcher.c: see launcher.h. */
#include "launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shmref/shmref.h"

static void sleep_ms(long ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int launcher_spawn(const char *bin, char *const argv[], const char *log, unsigned flags, pid_t *ret_pid)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        if (flags & LAUNCHER_PDEATHSIG)
            prctl(PR_SET_PDEATHSIG, SIGTERM);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        /* (Criterion's runner, for one, leaves fds of its own open.) */
        if (flags & LAUNCHER_CLOSE_FDS)
            for (int i = 3; i < 1024; i++)
                if (i != fd)
                    close(i);
        execv(bin, argv);
        dprintf(STDERR_FILENO, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    *ret_pid = pid;
    return 0;
}

int launcher_wait_ready(pid_t pid, const char *socket, int timeout_ms, int *ret_status)
{
    for (long waited = 0;; waited += 5) {
        shmref_conn *c;
        if (shmref_connect(socket, &c) == 0) {
            shmref_close(c);
            return 0;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            if (ret_status)
                *ret_status = st;
            return -ECHILD;
        }
        if (waited >= timeout_ms)
            return -ETIMEDOUT;
        sleep_ms(5);
    }
}

int launcher_stop(pid_t pid, int grace_ms, int *ret_status)
{
    int st;
    if (kill(pid, SIGTERM) < 0)
        return -errno;
    for (long waited = 0;; waited += 5) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (w < 0)
            return -errno;
        if (waited >= grace_ms) {
            kill(pid, SIGKILL);
            if (waitpid(pid, &st, 0) < 0)
                return -errno;
            break;
        }
        sleep_ms(5);
    }
    if (ret_status)
        *ret_status = st;
    return 0;
}

int launcher_run(const char *bin, const char *const args[], char *out, size_t cap)
{
    int p[2];
    if (cap == 0 || pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        return -e;
    }
    if (pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        dup2(p[1], STDERR_FILENO);
        const char *argv[32] = { bin };
        int n = 1;
        for (; args[n - 1] && n < 31; n++)
            argv[n] = args[n - 1];
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t r;
    while (len + 1 < cap && ((r = read(p[0], out + len, cap - 1 - len)) > 0 || (r < 0 && errno == EINTR)))
        if (r > 0)
            len += (size_t)r;
    out[len] = '\0';
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

bool launcher_log_contains(const char *log, const char *text)
{
    FILE *f = fopen(log, "re");
    if (!f)
        return false;
    char line[2048];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

void launcher_print_log(const char *log, FILE *to)
{
    char line[512];
    FILE *f = fopen(log, "re");
    if (!f)
        return;
    fprintf(to, "---- %s ----\n", log);
    while (fgets(line, sizeof(line), f))
        fputs(line, to);
    fclose(f);
}
