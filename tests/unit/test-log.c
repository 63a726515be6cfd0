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
