/* SPDX-License-Identifier: MIT */
/* test-log.c: shmrefd's log lines (daemon/log.c) on a real stderr: one line per call
 * with its sd-daemon priority prefix, written whole, filtered by log_max_level, cut (not
 * overflowed) when too long. */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

static char out[8192];

/* capture: runs the calls with stderr going to a file, then reads what came. */
#define CAPTURE(...)                                                                         \
    do {                                                                                     \
        char path[] = "/tmp/shmref-test-log-XXXXXX";                                         \
        int fd = mkstemp(path), saved = dup(STDERR_FILENO);                                  \
        cr_assert_geq(fd, 0);                                                                \
        dup2(fd, STDERR_FILENO);                                                             \
        __VA_ARGS__;                                                                         \
        dup2(saved, STDERR_FILENO);                                                          \
        close(saved);                                                                        \
        ssize_t n = pread(fd, out, sizeof(out) - 1, 0);                                      \
        out[n > 0 ? n : 0] = '\0';                                                           \
        close(fd);                                                                           \
        unlink(path);                                                                        \
    } while (0)

Test(log, one_prefixed_line_per_event)
{
    log_max_level = LOG_INFO;
    CAPTURE(log_error("disk %s", "full"); log_notice("n=%d", 3); log_info("hello"));
    cr_assert_str_eq(out, "<3>disk full\n<5>n=3\n<6>hello\n");
}

Test(log, debug_only_when_verbose)
{
    log_max_level = LOG_INFO;
    CAPTURE(log_debug("hidden"));
    cr_assert_str_empty(out);
    log_max_level = LOG_DEBUG;
    CAPTURE(log_debug("shown"));
    cr_assert_str_eq(out, "<7>shown\n");
    log_max_level = LOG_INFO;
}

Test(log, a_long_line_is_cut_and_still_one_line)
{
    static char big[4000];
    memset(big, 'x', sizeof(big) - 1);
    log_max_level = LOG_INFO;
    CAPTURE(log_warning("%s", big));
    size_t n = strlen(out);
    cr_assert_leq(n, 1024);
    cr_assert_eq(strncmp(out, "<4>xxx", 6), 0);
    cr_assert_eq(out[n - 1], '\n');
    cr_assert_eq(strchr(out, '\n'), out + n - 1, "more than one line");
}

Test(log, a_full_pipe_never_blocks_and_the_lines_come_later)
{
    int p[2];
    static char junk[1 << 16], pipe_out[1 << 18];
    cr_assert_eq(pipe(p), 0);
    dup2(p[1], STDERR_FILENO);
    log_init(); /* a file description of its own, non-blocking */
    cr_assert_eq(fcntl(p[1], F_GETFL) & O_NONBLOCK, 0, "the shared stderr was made non-blocking");
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", p[1]);
    int w = open(path, O_WRONLY | O_NONBLOCK);
    memset(junk, 'j', sizeof(junk));
    while (write(w, junk, sizeof(junk)) > 0 || write(w, junk, 1) > 0)
        ;
    close(w);
    log_max_level = LOG_INFO;
    for (int i = 0; i < 8000; i++) /* would block on the first one with a blocking write */
        log_notice("line %d", i);
    cr_assert_gt(log_dropped(), 0, "8000 lines fit in the queue?");
    size_t got = 0;
    for (int i = 0; i < 100 && !memmem(pipe_out, got, "dropped", 7); i++) {
        ssize_t n;
        while ((n = read(p[0], pipe_out + got, sizeof(pipe_out) - 1 - got)) > 0)
            got += (size_t)n;
        log_flush();
    }
    cr_assert(memmem(pipe_out, got, "<5>line 0\n", 10), "the first queued line never came (%zu bytes: %.40s)", got, pipe_out + 65536);
    cr_assert(memmem(pipe_out, got, "lines dropped", 13), "no line counts the dropped ones");
}

Test(log, rate_limit_lets_ten_a_second_through_and_counts_the_rest)
{
    struct log_rate r = { 0 };
    unsigned held;
    int passed = 0;
    for (int i = 0; i < 50; i++) {
        passed += log_rate_take(&r, &held);
        cr_assert_eq(held, 0);
    }
    cr_assert_eq(passed, LOG_RATE_LINES);
    usleep(1100 * 1000);
    cr_assert(log_rate_take(&r, &held), "a new second lets lines through");
    cr_assert_eq(held, 50 - LOG_RATE_LINES, "the held-back count of the last second");
}
