/* SPDX-License-Identifier: MIT */
/* test-desc.c: descriptor text and binary forms (proto/desc.c). The text form has one
 * accepted spelling per descriptor, so every near miss must be refused; the binary form
 * round-trips and desc_unpack is bounded like the other decoders. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "desc.h"

#define KNOWN_TEXT "shmref1:000102030405060708090a0b0c0d0e0f:83886080"
#define KNOWN_HEX "000102030405060708090a0b0c0d0e0f"

static void known_desc(struct desc *d)
{
    for (unsigned i = 0; i < PROTO_TOKEN_LEN; i++)
        d->token[i] = (uint8_t)i;
    d->size = 83886080;
}

static int parse(const char *text, struct desc *ret)
{
    return desc_from_text(text, strlen(text), ret);
}

/* Text form ------------------------------------------------------------------------ */

Test(desc, text_of_known_token)
{
    struct desc d, back;
    char buf[DESC_TEXT_MAX];
    known_desc(&d);
    int n = desc_to_text(&d, buf, sizeof(buf));
    cr_assert_eq(n, (int)strlen(KNOWN_TEXT));
    cr_assert_str_eq(buf, KNOWN_TEXT);

    memset(&back, 0xee, sizeof(back));
    cr_assert_eq(parse(KNOWN_TEXT, &back), 0);
    cr_assert_arr_eq(back.token, d.token, PROTO_TOKEN_LEN);
    cr_assert_eq(back.size, 83886080);
}

Test(desc, text_round_trip)
{
    static const uint64_t sizes[] = { 0, 1, 9, 10, 4096, UINT32_MAX, UINT64_MAX - 1, UINT64_MAX };
    static const char *const size_text[] = {
        "0", "1", "9", "10", "4096", "4294967295", "18446744073709551614", "18446744073709551615",
    };
    for (unsigned t = 0; t < 4; t++) {
        for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            struct desc d, back;
            for (unsigned i = 0; i < PROTO_TOKEN_LEN; i++)
                d.token[i] = t == 0 ? 0x00 : t == 1 ? 0xff : t == 2 ? (uint8_t)(0xa0 + i) : (uint8_t)(i * 37 + s);
            d.size = sizes[s];
            char buf[DESC_TEXT_MAX];
            int n = desc_to_text(&d, buf, sizeof(buf));

            cr_assert_gt(n, 0);
            cr_assert_eq((size_t)n, strlen(buf));
            cr_assert_lt(n, DESC_TEXT_MAX);
            cr_assert_eq(strncmp(buf, DESC_TEXT_PREFIX, 8), 0, "%s", buf);
            for (unsigned i = 0; i < 2 * PROTO_TOKEN_LEN; i++) {
                char c = buf[8 + i];
                cr_assert((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'), "%s: char %u", buf, 8 + i);
            }
            char hex[3];
            snprintf(hex, sizeof(hex), "%02x", d.token[5]);
            cr_assert_eq(memcmp(buf + 8 + 10, hex, 2), 0, "%s: token byte 5", buf);
            cr_assert_eq(buf[40], ':');
            cr_assert_str_eq(buf + 41, size_text[s]);

            memset(&back, 0, sizeof(back));
            cr_assert_eq(desc_from_text(buf, (size_t)n, &back), 0, "%s", buf);
            cr_assert_arr_eq(back.token, d.token, PROTO_TOKEN_LEN);
            cr_assert_eq(back.size, sizes[s]);
        }
    }
}

Test(desc, longest_text_fits)
{
    struct desc d;
    memset(d.token, 0xff, sizeof(d.token));
    d.size = UINT64_MAX;
    char buf[DESC_TEXT_MAX];
    cr_assert_eq(desc_to_text(&d, buf, sizeof(buf)), DESC_TEXT_MAX - 1);
    cr_assert_str_eq(buf, "shmref1:ffffffffffffffffffffffffffffffff:18446744073709551615");
}

Test(desc, to_text_small_cap)
{
    struct desc d;
    known_desc(&d);
    size_t need = strlen(KNOWN_TEXT) + 1;
    char buf[DESC_TEXT_MAX + 8];
    for (size_t cap = 0; cap < need; cap++) {
        memset(buf, '#', sizeof(buf));
        cr_assert_eq(desc_to_text(&d, buf, cap), -ENOBUFS, "cap %zu", cap);
        for (size_t k = cap; k < sizeof(buf); k++)
            cr_assert_eq(buf[k], '#', "cap %zu: wrote byte %zu", cap, k);
    }
    cr_assert_eq(desc_to_text(&d, buf, need), (int)need - 1);
    cr_assert_str_eq(buf, KNOWN_TEXT);
}

Test(desc, from_text_accepts_zero_and_max)
{
    struct desc d;
    cr_assert_eq(parse("shmref1:" KNOWN_HEX ":0", &d), 0);
    cr_assert_eq(d.size, 0);
    cr_assert_eq(parse("shmref1:" KNOWN_HEX ":18446744073709551615", &d), 0);
    cr_assert_eq(d.size, UINT64_MAX);
    cr_assert_eq(d.token[15], 0x0f);
}

Test(desc, from_text_parses_exactly_len_bytes)
{
    struct desc d;
    /* the caller's length, not the NUL, ends the text */
    cr_assert_eq(desc_from_text(KNOWN_TEXT, strlen(KNOWN_TEXT) - 1, &d), 0);
    cr_assert_eq(d.size, 8388608);
    cr_assert_eq(desc_from_text(KNOWN_TEXT "  junk", strlen(KNOWN_TEXT), &d), 0);
    cr_assert_eq(d.size, 83886080);
    /* a NUL inside the length is not a digit */
    static const char with_nul[] = KNOWN_TEXT "\0";
    cr_assert_eq(desc_from_text(with_nul, sizeof(with_nul) - 1, &d), -EINVAL);
}

Test(desc, from_text_rejects)
{
    static const char *const bad[] = {
        "",
        "shmref1:",
        "shmref1:" KNOWN_HEX,
        "shmref1:" KNOWN_HEX ":",                                    /* empty size */
        "shmref:" KNOWN_HEX ":5",                                    /* wrong prefix */
        "SHMREF1:" KNOWN_HEX ":5",
        "xhmref1:" KNOWN_HEX ":5",
        " shmref1:" KNOWN_HEX ":5",
        "shmref2:" KNOWN_HEX ":5",
        "shmref1:000102030405060708090A0B0C0D0E0F:5",               /* uppercase hex */
        "shmref1:000102030405060708090a0b0c0d0e0F:5",
        "shmref1:000102030405060708090a0b0c0d0e0:5",                /* 31 hex digits */
        "shmref1:000102030405060708090a0b0c0d0e0:55",
        "shmref1:000102030405060708090a0b0c0d0e0f0:5",              /* 33 hex digits */
        "shmref1:000102030405060708090a0b0c0d0e0g:5",               /* not hex */
        "shmref1:000102030405060708090a0b0c0d0e 0:5",
        "shmref1:" KNOWN_HEX "83886080",                             /* missing ':' */
        "shmref1:" KNOWN_HEX ";5",
        "shmref1:" KNOWN_HEX "::5",
        "shmref1:" KNOWN_HEX ":0123",                                /* leading zero */
        "shmref1:" KNOWN_HEX ":00",
        "shmref1:" KNOWN_HEX ":12a",                                 /* non-digits */
        "shmref1:" KNOWN_HEX ":+5",
        "shmref1:" KNOWN_HEX ":-5",
        "shmref1:" KNOWN_HEX ": 5",
        "shmref1:" KNOWN_HEX ":0x10",
        "shmref1:" KNOWN_HEX ":5.0",
        "shmref1:" KNOWN_HEX ":18446744073709551616",                /* UINT64_MAX + 1 */
        "shmref1:" KNOWN_HEX ":18446744073709551620",
        "shmref1:" KNOWN_HEX ":99999999999999999999",
        "shmref1:" KNOWN_HEX ":184467440737095516150",               /* 21 digits */
        "shmref1:" KNOWN_HEX ":000000000000000000001",
        "shmref1:" KNOWN_HEX ":5 ",                                  /* trailing garbage */
        "shmref1:" KNOWN_HEX ":5\n",
        "shmref1:" KNOWN_HEX ":5x",
        "shmref1:" KNOWN_HEX ":5:6",
        KNOWN_HEX ":5",
    };
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct desc d;
        memset(&d, 0x5a, sizeof(d));
        /* exact-size heap copy without a NUL: ASan sees any read past len */
        size_t len = strlen(bad[i]);
        char *copy = malloc(len ? len : 1);
        cr_assert_not_null(copy);
        memcpy(copy, bad[i], len);
        cr_assert_eq(desc_from_text(copy, len, &d), -EINVAL, "accepted \"%s\"", bad[i]);
        free(copy);
        /* ret is written only on success */
        for (unsigned k = 0; k < sizeof(d); k++)
            cr_assert_eq(((const uint8_t *)&d)[k], 0x5a, "\"%s\" wrote *ret", bad[i]);
    }
    struct desc d;
    cr_assert_eq(desc_from_text(NULL, 50, &d), -EINVAL);
}

/* Binary form ---------------------------------------------------------------------- */

Test(desc, binary_has_expected_bytes)
{
    struct desc d;
    known_desc(&d);
    uint8_t buf[DESC_BINARY_MAX];
    static const uint8_t expected[] = {
        0x93, 0x01, 0xc4, 0x10,
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
        0xce, 0x05, 0x00, 0x00, 0x00,
    };
    cr_assert_eq(desc_pack(&d, buf, sizeof(buf)), (int)sizeof(expected));
    cr_assert_arr_eq(buf, expected, sizeof(expected));
}

Test(desc, binary_round_trip)
{
    static const uint64_t sizes[] = { 0, 1, 127, 128, 255, 256, 65535, 65536, UINT32_MAX,
                                      UINT64_C(1) << 32, 83886080, UINT64_MAX };
    for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        struct desc d, back;
        for (unsigned i = 0; i < PROTO_TOKEN_LEN; i++)
            d.token[i] = (uint8_t)(0xc0 + i + s);   /* looks like msgpack type bytes */
        d.size = sizes[s];
        uint8_t buf[DESC_BINARY_MAX];
        int n = desc_pack(&d, buf, sizeof(buf));
        cr_assert_gt(n, 0);
        cr_assert_leq(n, DESC_BINARY_MAX);

        uint8_t *copy = malloc((size_t)n);
        cr_assert_not_null(copy);
        memcpy(copy, buf, (size_t)n);
        memset(&back, 0, sizeof(back));
        cr_assert_eq(desc_unpack(copy, (size_t)n, &back), 0, "size %llu", (unsigned long long)sizes[s]);
        cr_assert_arr_eq(back.token, d.token, PROTO_TOKEN_LEN);
        cr_assert_eq(back.size, sizes[s]);
        free(copy);
    }
}

Test(desc, pack_small_cap)
{
    struct desc d;
    known_desc(&d);
    d.size = UINT64_MAX;
    uint8_t full[DESC_BINARY_MAX], buf[DESC_BINARY_MAX + 8];
    int n = desc_pack(&d, full, sizeof(full));
    cr_assert_eq(n, 1 + 1 + 2 + PROTO_TOKEN_LEN + 9);
    for (size_t cap = 0; cap < (size_t)n; cap++) {
        memset(buf, 0xee, sizeof(buf));
        cr_assert_eq(desc_pack(&d, buf, cap), -EMSGSIZE, "cap %zu", cap);
        for (size_t k = cap; k < sizeof(buf); k++)
            cr_assert_eq(buf[k], 0xee, "cap %zu: wrote byte %zu", cap, k);
    }
    cr_assert_eq(desc_pack(&d, buf, (size_t)n), n);
    cr_assert_arr_eq(buf, full, (size_t)n);
}

static int unpack_copy(const uint8_t *bytes, size_t len, struct desc *ret)
{
    uint8_t *copy = malloc(len ? len : 1);
    cr_assert_not_null(copy);
    memcpy(copy, bytes, len);
    int r = desc_unpack(copy, len, ret);
    free(copy);
    return r;
}

/* [version, bin(token_len), size] with the given header bytes */
static size_t build_binary(uint8_t *buf, uint8_t array_hdr, uint8_t version, uint8_t token_hdr,
                           size_t token_len, uint8_t size_byte)
{
    size_t pos = 0;
    buf[pos++] = array_hdr;
    buf[pos++] = version;
    buf[pos++] = token_hdr;
    if (token_hdr == 0xc4)
        buf[pos++] = (uint8_t)token_len;
    for (size_t i = 0; i < token_len; i++)
        buf[pos++] = (uint8_t)i;
    buf[pos++] = size_byte;
    return pos;
}

Test(desc, unpack_rejects_truncated)
{
    struct desc d;
    known_desc(&d);
    uint8_t buf[DESC_BINARY_MAX];
    int n = desc_pack(&d, buf, sizeof(buf));
    cr_assert_gt(n, 0);
    for (size_t len = 0; len < (size_t)n; len++) {
        struct desc out;
        cr_assert_eq(unpack_copy(buf, len, &out), -EINVAL, "prefix %zu of %d", len, n);
    }
    cr_assert_eq(desc_unpack(NULL, 5, &d), -EINVAL);
}

Test(desc, unpack_rejects_wrong_shape)
{
    uint8_t buf[64];
    struct desc d;
    size_t len;

    len = build_binary(buf, 0x93, 0x01, 0xc4, 16, 0x05);
    cr_assert_eq(unpack_copy(buf, len, &d), 0);                   /* the baseline is valid */
    cr_assert_eq(d.size, 5);
    cr_assert_eq(d.token[15], 15);

    len = build_binary(buf, 0x93, 0x02, 0xc4, 16, 0x05);            /* version 2 */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0x00, 0xc4, 16, 0x05);            /* version 0 */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0xff, 0xc4, 16, 0x05);            /* version -1 */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0xc0, 0xc4, 16, 0x05);            /* version nil */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0x01, 0xc4, 15, 0x05);            /* 15-byte token */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0x01, 0xc4, 17, 0x05);            /* 17-byte token */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0x01, 0xc4, 0, 0x05);             /* empty token */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0x01, 0xb0, 16, 0x05);            /* token as str */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0x01, 0xc4, 16, 0xff);            /* size -1 */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0x01, 0xc4, 16, 0xc0);            /* size nil */
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x92, 0x01, 0xc4, 16, 0x05);            /* array of 2 */
    cr_assert_eq(unpack_copy(buf, len - 1, &d), -EINVAL);
    len = build_binary(buf, 0x81, 0x01, 0xc4, 16, 0x05);            /* {1: token} */
    cr_assert_eq(unpack_copy(buf, len - 1, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0x01, 0xc4, 16, 0x05);            /* trailing byte */
    buf[len++] = 0x00;
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    len = build_binary(buf, 0x93, 0x91, 0x01, 0, 0xc4);             /* [[1], ...: depth 2 */
    buf[len++] = 0x10;
    for (unsigned i = 0; i < PROTO_TOKEN_LEN; i++)
        buf[len++] = (uint8_t)i;
    buf[len++] = 0x05;
    cr_assert_eq(len, 22);
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
}

Test(desc, unpack_rejects_oversize_and_garbage)
{
    uint8_t buf[64];
    struct desc d;
    /* [1, token, size, bin(n)]: a valid prefix padded past DESC_BINARY_MAX */
    size_t len = build_binary(buf, 0x94, 0x01, 0xc4, 16, 0x05);
    buf[len++] = 0xc4;
    size_t pad = DESC_BINARY_MAX + 1 - len - 1;
    buf[len++] = (uint8_t)pad;
    memset(buf + len, 0, pad);
    len += pad;
    cr_assert_eq(len, DESC_BINARY_MAX + 1);
    cr_assert_eq(unpack_copy(buf, len, &d), -EINVAL);
    /* a valid descriptor followed by padding up to 64 bytes */
    len = build_binary(buf, 0x93, 0x01, 0xc4, 16, 0x05);
    memset(buf + len, 0, sizeof(buf) - len);
    cr_assert_eq(unpack_copy(buf, sizeof(buf), &d), -EINVAL);

    static const uint8_t garbage[][8] = {
        { 0xc1 }, { 0x00 }, { 0xc0 }, { 0xdd, 0xff, 0xff, 0xff, 0xff }, { 0xdf, 0xff, 0xff, 0xff, 0xff },
        { 0xd4, 0x01, 0x00 }, { 0xc6, 0xff, 0xff, 0xff, 0xff }, { 0xa7, 's', 'h', 'm', 'r', 'e', 'f', '1' },
    };
    static const size_t garbage_len[] = { 1, 1, 1, 5, 5, 3, 5, 8 };
    for (unsigned i = 0; i < sizeof(garbage_len) / sizeof(garbage_len[0]); i++)
        cr_assert_eq(unpack_copy(garbage[i], garbage_len[i], &d), -EINVAL, "garbage %u", i);
}

Test(desc, unpack_random_bytes)
{
    /* bounded on anything: only 0 or -EINVAL, never a crash (ASan in CI) */
    uint64_t s = 0x853c49e6748fea9bull;
    unsigned ok = 0;
    struct desc base;
    known_desc(&base);
    uint8_t valid[DESC_BINARY_MAX];
    int n = desc_pack(&base, valid, sizeof(valid));
    cr_assert_gt(n, 0);
    for (unsigned iter = 0; iter < 20000; iter++) {
        uint8_t buf[DESC_BINARY_MAX + 4];
        size_t len;
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        if (iter & 1) {
            len = (size_t)n;
            memcpy(buf, valid, len);
            buf[s % len] = (uint8_t)(s >> 32);
            if ((s >> 40) % 4 == 0)
                len = (size_t)((s >> 48) % (uint64_t)n);
        } else {
            len = (size_t)(s % sizeof(buf));
            for (size_t i = 0; i < len; i++)
                buf[i] = (uint8_t)(s >> (8 * (i % 8))) ^ (uint8_t)i;
        }
        struct desc d;
        int r = unpack_copy(buf, len, &d);
        cr_assert(r == 0 || r == -EINVAL, "iter %u: desc_unpack = %d", iter, r);
        if (r == 0)
            ok++;
    }
    cr_assert_gt(ok, 0);
}

/* desc_token_equal: equal tokens, and a difference in any byte, in any bit. */
Test(desc, token_equal_finds_every_difference)
{
    uint8_t a[PROTO_TOKEN_LEN], b[PROTO_TOKEN_LEN];
    for (int i = 0; i < PROTO_TOKEN_LEN; i++)
        a[i] = (uint8_t)(i * 37 + 5);
    memcpy(b, a, sizeof(a));
    cr_assert_eq(desc_token_equal(a, b), 1);
    for (int i = 0; i < PROTO_TOKEN_LEN; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1u << bit);
            cr_assert_eq(desc_token_equal(a, b), 0, "byte %d bit %d", i, bit);
            b[i] ^= (uint8_t)(1u << bit);
        }
    }
    cr_assert_eq(desc_token_equal(a, b), 1);
}
