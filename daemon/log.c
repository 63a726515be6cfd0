/* SPDX-License-Identifier: MIT */
/* log.c: see log.h. Each line is formatted whole and written with one write(2), so lines
 * from the daemon never interleave mid-line. After log_init, a write never blocks: a pipe
 * or terminal on stderr is reopened through /proc/self/fd/2 as a file description of our
 * own with O_NONBLOCK (setting it on the shared one would surprise whoever else writes
 * there), a socket (journald's) gets MSG_DONTWAIT; lines that do not fit wait in a bounded
 * queue, flushed by the next line or log_flush, and are dropped (counted) when it is full. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define QUEUE_MAX (64 * 1024)

int log_max_level = LOG_INFO;

static int out_fd = -1;        /* after log_init: our own non-blocking fd, or 2 */
static bool out_sock;          /* stderr is a socket: send with MSG_DONTWAIT */
static char queue[QUEUE_MAX];  /* whole lines not yet written */
static size_t queued;
static unsigned long long dropped;

void log_init(void)
{
    struct stat st;
    if (out_fd >= 0 || fstat(STDERR_FILENO, &st) < 0)
        return;
    out_fd = STDERR_FILENO;
    if (S_ISSOCK(st.st_mode)) {
        out_sock = true;
    } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
        int fd = open("/proc/self/fd/2", O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | O_APPEND);
        if (fd >= 0)
            out_fd = fd;
    }
    /* A regular file (or a failed reopen): plain writes, as before. */
}

/* put: one write without waiting; the bytes written, 0 when it would block. */
static size_t put(const char *p, size_t len)
{
    int fd = out_fd >= 0 ? out_fd : STDERR_FILENO;
    ssize_t w;
    do
        w = out_sock ? send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL) : write(fd, p, len);
    while (w < 0 && errno == EINTR);
    return w > 0 ? (size_t)w : w == 0 ? 0 : errno == EAGAIN ? 0 : len; /* other errors: gone */
}

void log_flush(void)
{
    while (queued) {
        /* whole lines only: the queue holds whole lines, write up to the last newline */
        size_t n = put(queue, queued);
        if (!n)
            return;
        memmove(queue, queue + n, queued - n);
        queued -= n;
    }
    if (dropped) {
        char line[96];
        int m = snprintf(line, sizeof(line), "<4>log: %llu line%s dropped: stderr was not writable\n", dropped,
                         dropped == 1 ? "" : "s");
        if (put(line, (size_t)m) == (size_t)m)
            dropped = 0;
    }
}

/* emit: the line now, or queued behind earlier ones, or dropped and counted. */
static void emit(const char *line, size_t len)
{
    log_flush();
    if (!queued && !dropped) {
        size_t n = put(line, len);
        line += n;
        len -= n;
        if (!len)
            return;
    }
    if (queued + len > sizeof(queue)) {
        dropped++;
        return;
    }
    memcpy(queue + queued, line, len);
    queued += len;
}

void log_printf(int level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (level > log_max_level)
        return;
    int n = snprintf(line, sizeof(line), "<%d>", level);
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    emit(line, len);
}

unsigned long long log_dropped(void)
{
    return dropped;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

bool log_rate_take(struct log_rate *r, unsigned *ret_suppressed)
{
    uint64_t now = mono_ms();
    *ret_suppressed = 0;
    if (now - r->start_ms >= 1000 || !r->start_ms) {
        *ret_suppressed = r->suppressed;
        r->start_ms = now ? now : 1;
        r->n = 0;
        r->suppressed = 0;
    }
    if (r->n < LOG_RATE_LINES) {
        r->n++;
        return true;
    }
    r->suppressed++;
    return false;
}
