/* log.c: see log.h. Each line is formatted whole and written with one write(2), so lines
 * from the daemon never interleave mid-line. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

int log_max_level = LOG_INFO;

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
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
