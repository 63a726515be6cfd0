/* log.h: shmrefd's logging. Private to the daemon. One line per event on stderr, with
 * an sd-daemon priority prefix ("<3>" error .. "<7>" debug) that journald understands. */
#ifndef SHMREFD_LOG_H
#define SHMREFD_LOG_H

#include <syslog.h>

extern int log_max_level; /* LOG_INFO by default; LOG_DEBUG with --verbose */

void log_printf(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_printf(LOG_ERR, __VA_ARGS__)
#define log_warning(...) log_printf(LOG_WARNING, __VA_ARGS__)
#define log_notice(...) log_printf(LOG_NOTICE, __VA_ARGS__)
#define log_info(...) log_printf(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_printf(LOG_DEBUG, __VA_ARGS__)

#endif
