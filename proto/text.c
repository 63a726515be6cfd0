/* SPDX-License-Identifier: MIT */
/* text.c: see text.h. A small UTF-8 decoder (RFC 3629 well-formedness) rather than
 * iconv or a locale: the daemon's output must not depend on its locale, and the check is
 * a dozen lines. */
#include "text.h"

#include <stdbool.h>
#include <stdint.h>

/* decode: the length of the well-formed sequence at s (at most n bytes), and its code
 * point in *cp; 0 if s does not start one. */
static size_t decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned char c = s[0];
    size_t need;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        need = 2, v = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3, v = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    *cp = v;
    return need;
}

static bool unsafe(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x061c || cp == 0x200e ||
           cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

size_t text_clean(char *dst, const char *src, size_t len)
{
    const unsigned char *s = (const unsigned char *)src;
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp;
        size_t k = decode(s + i, len - i, &cp);
        if (k == 0) {
            dst[o++] = '?';
            i++;
            continue;
        }
        if (!unsafe(cp))
            for (size_t j = 0; j < k; j++)
                dst[o++] = (char)s[i + j];
        i += k;
    }
    dst[o] = '\0';
    return o;
}
