/* SPDX-License-Identifier: MIT */
/* log.h: shmrefd's logging. Private to the daemon. One line per event on stderr, with
 * an sd-daemon priority prefix ("<3>" error .. "<7>" debug) that journald understands. */
#ifndef SHMREFD_LOG_H
#define SHMREFD_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <syslog.h>

extern int log_max_level; /* LOG_INFO by default; LOG_DEBUG with --verbose */

/* log_init: from now on a log line never blocks the caller (see log.c); call once, first
 * thing. Without it, lines are plain writes to fd 2. */
void log_init(void);

void log_printf(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* log_flush: writes what waits in the queue, as far as stderr takes it now (the
 * housekeeping timer calls it), then a line counting the lines dropped, if any. */
void log_flush(void);

/* log_dropped: lines dropped since the last "dropped" line went out. */
unsigned long long log_dropped(void);

#define LOG_RATE_LINES 10 /* lines per second one log_rate lets through */

/* log_rate: a per-source limit (one per client): LOG_RATE_LINES lines a second. */
struct log_rate {
    uint64_t start_ms;   /* the second being counted (CLOCK_MONOTONIC) */
    unsigned n, suppressed;
};

/* log_rate_take: whether one more line of this source may go out now. When a new second
 * starts, *ret_suppressed is how many were held back in the last one (for a "suppressed"
 * line), else 0. */
bool log_rate_take(struct log_rate *r, unsigned *ret_suppressed);

#define log_error(...) log_printf(LOG_ERR, __VA_ARGS__)
#define log_warning(...) log_printf(LOG_WARNING, __VA_ARGS__)
#define log_notice(...) log_printf(LOG_NOTICE, __VA_ARGS__)
#define log_info(...) log_printf(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_printf(LOG_DEBUG, __VA_ARGS__)

#endif
