/* SPDX-License-Identifier: MIT */
/* b64.c: a small base64 codec (RFC 4648, with padding) for the "base64 over a socket"
 * method, the way JSON APIs carry arrays. Plain table code, no SIMD: about what a
 * typical library gives. */
#include "bench.h"

#include <errno.h>

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t b64_encoded_len(size_t n)
{
    return (n + 2) / 3 * 4;
}

size_t b64_encode(const void *src, size_t n, char *dst)
{
    const unsigned char *s = src;
    char *d = dst;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        d[0] = alphabet[v >> 18];
        d[1] = alphabet[(v >> 12) & 63];
        d[2] = alphabet[(v >> 6) & 63];
        d[3] = alphabet[v & 63];
        d += 4;
    }
    if (i < n) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0);
        d[0] = alphabet[v >> 18];
        d[1] = alphabet[(v >> 12) & 63];
        d[2] = i + 1 < n ? alphabet[(v >> 6) & 63] : '=';
        d[3] = '=';
        d += 4;
    }
    return (size_t)(d - dst);
}

/* The decoding table: 0..63 for alphabet characters, 0xff for anything else. */
static const unsigned char *table(void)
{
    static unsigned char t[256];
    static bool ready;
    if (!ready) {
        for (int i = 0; i < 256; i++)
            t[i] = 0xff;
        for (int i = 0; i < 64; i++)
            t[(unsigned char)alphabet[i]] = (unsigned char)i;
        ready = true;
    }
    return t;
}

ssize_t b64_decode(const char *src, size_t len, void *dst, size_t cap)
{
    const unsigned char *t = table();
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *d = dst;
    if (len % 4)
        return -EINVAL;
    size_t pad = len && s[len - 1] == '=' ? (len > 1 && s[len - 2] == '=' ? 2 : 1) : 0;
    size_t out = len / 4 * 3 - pad;
    if (out > cap)
        return -EINVAL;
    size_t full = pad ? len - 4 : len;
    for (size_t i = 0; i < full; i += 4) {
        uint32_t a = t[s[i]], b = t[s[i + 1]], c = t[s[i + 2]], e = t[s[i + 3]];
        if ((a | b | c | e) & 0x80)
            return -EINVAL;
        uint32_t v = a << 18 | b << 12 | c << 6 | e;
        d[0] = (unsigned char)(v >> 16);
        d[1] = (unsigned char)(v >> 8);
        d[2] = (unsigned char)v;
        d += 3;
    }
    if (pad) {
        const unsigned char *q = s + full;
        uint32_t a = t[q[0]], b = t[q[1]], c = pad == 1 ? t[q[2]] : 0;
        if ((a | b | c) & 0x80)
            return -EINVAL;
        uint32_t v = a << 18 | b << 12 | c << 6;
        *d++ = (unsigned char)(v >> 16);
        if (pad == 1)
            *d++ = (unsigned char)(v >> 8);
    }
    return (ssize_t)out;
}
