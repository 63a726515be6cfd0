/* SPDX-License-Identifier: MIT */
/* units.c: see units.h. */
#include "units.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int units_parse(const char *text, uint64_t *ret)
{
    uint64_t v = 0;
    const char *p = text;

    if (!text || *p < '0' || *p > '9')
        return -EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -ERANGE;
        v = v * 10 + d;
    }
    unsigned shift = 0;
    switch (*p) {
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    case 't': case 'T': shift = 40; p++; break;
    default: break;
    }
    if (shift && strcmp(p, "iB") == 0)
        p += 2;
    else if (strcmp(p, "B") == 0)
        p += 1;
    if (*p)
        return -EINVAL;
    if (shift && v > (UINT64_MAX >> shift))
        return -ERANGE;
    *ret = v << shift;
    return 0;
}

const char *units_format(uint64_t bytes, char buf[UNITS_TEXT_MAX])
{
    static const char *const suffix[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
    if (bytes < 1024) {
        snprintf(buf, UNITS_TEXT_MAX, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes / 1024.0;
    unsigned i = 0;
    while (v >= 1023.95 && i < 5) /* what would print as 1024.0 goes up a unit */ {
        v /= 1024.0;
        i++;
    }
    snprintf(buf, UNITS_TEXT_MAX, "%.1f %s", v, suffix[i]);
    return buf;
}
