/* SPDX-License-Identifier: MIT */
/* desc.c: descriptor text and binary forms (see desc.h). Strict parsing: one accepted
 * spelling per descriptor, so a descriptor can be compared as a string. */
#include "desc.h"

#include <errno.h>
#include <string.h>

#include <msgpack.h>

static const char hexdigits[] = "0123456789abcdef";

int desc_to_text(const struct desc *d, char *buf, size_t cap)
{
    char tmp[DESC_TEXT_MAX];
    size_t n = strlen(DESC_TEXT_PREFIX);

    memcpy(tmp, DESC_TEXT_PREFIX, n);
    for (int i = 0; i < PROTO_TOKEN_LEN; i++) {
        tmp[n++] = hexdigits[d->token[i] >> 4];
        tmp[n++] = hexdigits[d->token[i] & 15];
    }
    /* The size in decimal, by hand: snprintf was most of this function's time (its
     * positional-argument path), and a descriptor is made at every publish. */
    char digits[20];
    int k = 0;
    uint64_t v = d->size;
    do
        digits[k++] = (char)('0' + v % 10);
    while ((v /= 10) && k < (int)sizeof(digits));
    tmp[n++] = ':';
    while (k)
        tmp[n++] = digits[--k];
    tmp[n] = 0;
    if (n + 1 > cap)
        return -ENOBUFS;
    memcpy(buf, tmp, n + 1);
    return (int)n;
}

/* hexval: the value of a lower-case hex digit, or -1 (a table of value + 1, 0 for none:
 * the parse runs at every acquire of a descriptor text). */
static const unsigned char hexvals[256] = {
    ['0'] = 1, ['1'] = 2, ['2'] = 3, ['3'] = 4, ['4'] = 5, ['5'] = 6, ['6'] = 7, ['7'] = 8, ['8'] = 9, ['9'] = 10,
    ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
};
static int hexval(char c)
{
    return (int)hexvals[(unsigned char)c] - 1;
}

int desc_from_text(const char *text, size_t len, struct desc *ret)
{
    size_t plen = strlen(DESC_TEXT_PREFIX);
    struct desc d;

    if (!text || len < plen + 2 * PROTO_TOKEN_LEN + 2 || memcmp(text, DESC_TEXT_PREFIX, plen) != 0)
        return -EINVAL;
    const char *p = text + plen;
    for (int i = 0; i < PROTO_TOKEN_LEN; i++) {
        int hi = hexval(p[2 * i]), lo = hexval(p[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        d.token[i] = (uint8_t)(hi << 4 | lo);
    }
    p += 2 * PROTO_TOKEN_LEN;
    if (*p++ != ':')
        return -EINVAL;
    size_t digits = len - (size_t)(p - text);
    if (digits == 0 || digits > 20 || (digits > 1 && p[0] == '0'))
        return -EINVAL;
    uint64_t v = 0;
    for (size_t i = 0; i < digits; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -EINVAL;
        uint64_t dv = (uint64_t)(p[i] - '0');
        if (v > (UINT64_MAX - dv) / 10)
            return -EINVAL;
        v = v * 10 + dv;
    }
    d.size = v;
    *ret = d;
    return 0;
}

int desc_pack(const struct desc *d, uint8_t *buf, size_t cap)
{
    struct proto_buf fb = { buf, 0, cap, 0 };
    msgpack_packer pk;

    msgpack_packer_init(&pk, &fb, proto_buf_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_uint32(&pk, DESC_VERSION);
    msgpack_pack_bin(&pk, PROTO_TOKEN_LEN);
    msgpack_pack_bin_body(&pk, d->token, PROTO_TOKEN_LEN);
    msgpack_pack_uint64(&pk, d->size);
    return fb.overflow ? -EMSGSIZE : (int)fb.len;
}

int desc_unpack(const uint8_t *buf, size_t len, struct desc *ret)
{
    const char *why;
    msgpack_unpacked up;
    size_t off = 0;
    int r = -EINVAL;

    if (!buf || len == 0 || len > DESC_BINARY_MAX || proto_check(buf, len, 1, &why) < 0)
        return -EINVAL;
    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, (const char *)buf, len, &off) != MSGPACK_UNPACK_SUCCESS)
        goto out;
    const msgpack_object *o = &up.data;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 3)
        goto out;
    const msgpack_object *v = o->via.array.ptr;
    if (v[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER || v[0].via.u64 != DESC_VERSION ||
        v[1].type != MSGPACK_OBJECT_BIN || v[1].via.bin.size != PROTO_TOKEN_LEN ||
        v[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        goto out;
    memcpy(ret->token, v[1].via.bin.ptr, PROTO_TOKEN_LEN);
    ret->size = v[2].via.u64;
    r = 0;
out:
    msgpack_unpacked_destroy(&up);
    return r;
}

int desc_token_equal(const uint8_t *a, const uint8_t *b)
{
    /* volatile: the compiler may not turn the loop into an early-exit memcmp */
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < PROTO_TOKEN_LEN; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}
