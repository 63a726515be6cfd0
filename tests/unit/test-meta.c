/* SPDX-License-Identifier: MIT */
/* test-meta.c: the array metadata convention (proto/meta.c). Encode and decode agree
 * field by field; type strings are validated; bytes that are not the convention are
 * opaque (-ENOMSG), bytes that claim it and break it are -EBADMSG with a reason naming
 * the field; no input is read past its end (the decoder runs under ASan here too). */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta.h"
#include "proto.h"

static struct meta_array sample(void)
{
    struct meta_array m = { .dtype = "<f8", .ndim = 2, .shape = { 3, 4 }, .order = 'C' };
    return m;
}

static int encode(const struct meta_array *m, uint8_t *buf, size_t cap)
{
    const char *why = NULL;
    int n = meta_array_encode(m, buf, cap, &why);
    if (n < 0)
        cr_assert_not_null(why);
    return n;
}

/* decode_copy: decodes from an exactly-sized heap copy, so ASan sees any overread. */
static int decode_copy(const uint8_t *buf, size_t len, struct meta_array *ret, const char **why)
{
    uint8_t *p = malloc(len ? len : 1);
    cr_assert_not_null(p);
    memcpy(p, buf, len);
    int r = meta_array_decode(p, len, ret, why);
    if (r == 0 && ret->user) /* user points into p: copy the check before freeing */
        cr_assert(ret->user >= p && ret->user + ret->user_len <= p + len);
    free(p);
    return r;
}

/* A minimal msgpack writer for hand-made inputs. */
struct mp {
    uint8_t b[1024];
    size_t n;
};
static void raw(struct mp *m, const void *p, size_t n) { memcpy(m->b + m->n, p, n); m->n += n; }
static void byte(struct mp *m, uint8_t v) { m->b[m->n++] = v; }
static void str(struct mp *m, const char *s) { byte(m, (uint8_t)(0xa0 | strlen(s))); raw(m, s, strlen(s)); }
static void map(struct mp *m, unsigned n) { byte(m, (uint8_t)(0x80 | n)); }
static void arr(struct mp *m, unsigned n) { byte(m, (uint8_t)(0x90 | n)); }

/* envelope: {shmref: 1, kind: "array", dtype, shape: [2], order: "C"} with n_extra more pairs */
static void envelope(struct mp *m, const char *dtype, unsigned extra)
{
    map(m, 5 + extra);
    str(m, "shmref"); byte(m, 1);
    str(m, "kind"); str(m, "array");
    str(m, "dtype"); str(m, dtype);
    str(m, "shape"); arr(m, 1); byte(m, 2);
    str(m, "order"); str(m, "C");
}

Test(meta, roundtrip)
{
    uint8_t buf[PROTO_MAX_META];
    struct meta_array m = sample(), back;
    m.offset = 64;
    m.user_kind = META_USER_BIN;
    m.user = (const uint8_t *)"\x00\x01user";
    m.user_len = 6;
    int n = encode(&m, buf, sizeof(buf));
    cr_assert_gt(n, 0);
    const char *why = NULL;
    cr_assert_eq(decode_copy(buf, (size_t)n, &back, &why), 0, "%s", why);
    cr_assert_str_eq(back.dtype, "<f8");
    cr_assert_eq(back.ndim, 2);
    cr_assert_eq(back.shape[0], 3);
    cr_assert_eq(back.shape[1], 4);
    cr_assert_eq(back.order, 'C');
    cr_assert_eq(back.offset, 64);
    cr_assert_eq(back.user_kind, META_USER_BIN);
    cr_assert_eq(back.user_len, 6);
    cr_assert_eq(meta_array_decode(buf, (size_t)n, &back, &why), 0);
    cr_assert_eq(memcmp(back.user, "\x00\x01user", 6), 0);
}

Test(meta, zero_d_fortran_and_large_shapes)
{
    uint8_t buf[PROTO_MAX_META];
    struct meta_array m = { .dtype = "|b1", .ndim = 0, .order = 'F' }, back;
    int n = encode(&m, buf, sizeof(buf));
    cr_assert_eq(meta_array_decode(buf, (size_t)n, &back, NULL), 0);
    cr_assert_eq(back.ndim, 0);
    cr_assert_eq(back.order, 'F');
    uint64_t nb;
    cr_assert_eq(meta_array_nbytes(&back, &nb), 0);
    cr_assert_eq(nb, 1);

    m = (struct meta_array){ .dtype = "<c16", .ndim = META_MAX_DIMS, .order = 'C' };
    for (unsigned i = 0; i < META_MAX_DIMS; i++)
        m.shape[i] = i == 5 ? 0x100000000ULL : 1;
    n = encode(&m, buf, sizeof(buf));
    cr_assert_eq(meta_array_decode(buf, (size_t)n, &back, NULL), 0);
    cr_assert_eq(back.shape[5], 0x100000000ULL);
    cr_assert_eq(meta_array_nbytes(&back, &nb), 0);
    cr_assert_eq(nb, 16 * 0x100000000ULL);

    m.shape[6] = 0; /* an empty array has 0 bytes whatever the other dimensions say */
    cr_assert_eq(meta_array_nbytes(&m, &nb), 0);
    cr_assert_eq(nb, 0);
}

Test(meta, user_msgpack_value)
{
    uint8_t buf[PROTO_MAX_META];
    const uint8_t user[] = { 0x82, 0xa1, 'a', 0x01, 0xa1, 'b', 0x92, 0xc3, 0xc0 }; /* {a:1, b:[true,nil]} */
    struct meta_array m = sample(), back;
    m.user_kind = META_USER_MSGPACK;
    m.user = user;
    m.user_len = sizeof(user);
    int n = encode(&m, buf, sizeof(buf));
    cr_assert_gt(n, 0);
    cr_assert_eq(meta_array_decode(buf, (size_t)n, &back, NULL), 0);
    cr_assert_eq(back.user_kind, META_USER_MSGPACK);
    cr_assert_eq(back.user_len, sizeof(user));
    cr_assert_eq(memcmp(back.user, user, sizeof(user)), 0);

    m.user_len = sizeof(user) - 1; /* not one whole object */
    cr_assert_eq(encode(&m, buf, sizeof(buf)), -EINVAL);
}

Test(meta, type_strings)
{
    const char *good[] = { "<f8", ">i4", "|u1", "|b1", "<c16", "<M8[ns]", ">m8[10ms]", "|S3", "<U5", "|V16", "=f4" };
    const int size[] = { 8, 4, 1, 1, 16, 8, 8, 3, 20, 16, 4 };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        cr_assert_eq(meta_dtype_itemsize(good[i], strlen(good[i])), size[i], "%s", good[i]);
    const char *bad[] = { "", "f8", "<f", "<f0", "<f08", "|O8", "<x8", "<M8", "<M8[]", "<M8[n s]", "<f8[ns]",
                          "<f8 ", "<i9999999", "<M8[ns", "?f8" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(meta_dtype_itemsize(bad[i], strlen(bad[i])), -EINVAL, "%s", bad[i]);
}

Test(meta, encode_refusals)
{
    uint8_t buf[PROTO_MAX_META];
    struct meta_array m = sample();
    m.order = 'X';
    cr_assert_eq(encode(&m, buf, sizeof(buf)), -EINVAL);
    m = sample();
    strcpy(m.dtype, "|O8");
    cr_assert_eq(encode(&m, buf, sizeof(buf)), -EINVAL);
    m = sample();
    m.ndim = META_MAX_DIMS + 1;
    cr_assert_eq(encode(&m, buf, sizeof(buf)), -EINVAL);
    m = sample();
    m.shape[0] = UINT64_MAX; /* itemsize * prod overflows */
    cr_assert_eq(encode(&m, buf, sizeof(buf)), -EINVAL);
    m = sample();
    cr_assert_eq(encode(&m, buf, 10), -EMSGSIZE);
    m.user_kind = META_USER_BIN;
    m.user = buf;
    m.user_len = PROTO_MAX_META;
    uint8_t big[2 * PROTO_MAX_META];
    cr_assert_eq(encode(&m, big, PROTO_MAX_META), -EMSGSIZE);
}

Test(meta, opaque_bytes)
{
    struct meta_array m;
    const char *why = NULL;
    cr_assert_eq(decode_copy((const uint8_t *)"f8", 2, &m, &why), -ENOMSG);   /* a plain string */
    cr_assert_eq(meta_array_decode(NULL, 0, &m, &why), -ENOMSG);
    const uint8_t nomark[] = { 0x81, 0xa4, 'k', 'i', 'n', 'd', 0xa5, 'a', 'r', 'r', 'a', 'y' };
    cr_assert_eq(decode_copy(nomark, sizeof(nomark), &m, &why), -ENOMSG);     /* no "shmref" key */
    const uint8_t truncated[] = { 0x82, 0xa6, 's', 'h', 'm', 'r', 'e', 'f', 0x01 };
    cr_assert_eq(decode_copy(truncated, sizeof(truncated), &m, &why), -ENOMSG);
    struct mp u = { .n = 0 };
    map(&u, 2);
    str(&u, "shmref"); byte(&u, 1);
    str(&u, "kind"); str(&u, "unit");
    cr_assert_eq(decode_copy(u.b, u.n, &m, &why), -ENOMSG);                   /* another kind */
    cr_assert_str_eq(why, "kind: not \"array\"");
}

Test(meta, malformed_is_ebadmsg_naming_the_field)
{
    struct { const char *dtype; const char *key; const uint8_t *val; size_t len; const char *why; } cases[] = {
        { "<f8", "order", (const uint8_t *)"\xa1Z", 2, "order" },
        { "|O8", NULL, NULL, 0, "dtype" },
        { "<f8", "offset", (const uint8_t *)"\xa1x", 2, "offset" },
        { "<f8", "offset", (const uint8_t *)"\xd0\xff", 2, "offset" },   /* -1 */
        { "<f8", "user", (const uint8_t *)"\xc4\x05", 2, NULL },          /* leaves the map unreadable */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mp m = { .n = 0 };
        if (cases[i].key && strcmp(cases[i].key, "order") == 0) {
            map(&m, 5);
            str(&m, "shmref"); byte(&m, 1);
            str(&m, "kind"); str(&m, "array");
            str(&m, "dtype"); str(&m, cases[i].dtype);
            str(&m, "shape"); arr(&m, 0);
            str(&m, "order"); raw(&m, cases[i].val, cases[i].len);
        } else {
            envelope(&m, cases[i].dtype, cases[i].key ? 1 : 0);
            if (cases[i].key) {
                str(&m, cases[i].key);
                raw(&m, cases[i].val, cases[i].len);
            }
        }
        struct meta_array out;
        const char *why = NULL;
        int r = decode_copy(m.b, m.n, &out, &why);
        if (!cases[i].why) {
            cr_assert_eq(r, -ENOMSG, "case %zu", i);
            continue;
        }
        cr_assert_eq(r, -EBADMSG, "case %zu: %d", i, r);
        cr_assert(why && strncmp(why, cases[i].why, strlen(cases[i].why)) == 0, "case %zu: %s", i, why);
    }
}

Test(meta, version_duplicates_and_shape)
{
    struct mp m = { .n = 0 };
    map(&m, 5);
    str(&m, "shmref"); byte(&m, 2);
    str(&m, "kind"); str(&m, "array");
    str(&m, "dtype"); str(&m, "<f8");
    str(&m, "shape"); arr(&m, 0);
    str(&m, "order"); str(&m, "C");
    struct meta_array out;
    const char *why = NULL;
    cr_assert_eq(decode_copy(m.b, m.n, &out, &why), -EBADMSG);
    cr_assert(strstr(why, "later version"));

    m.n = 0;
    envelope(&m, "<f8", 1);
    str(&m, "dtype"); str(&m, "<f4");
    cr_assert_eq(decode_copy(m.b, m.n, &out, &why), -EBADMSG);
    cr_assert_str_eq(why, "duplicate key");

    m.n = 0; /* 33 dimensions */
    map(&m, 5);
    str(&m, "shmref"); byte(&m, 1);
    str(&m, "kind"); str(&m, "array");
    str(&m, "dtype"); str(&m, "<f8");
    str(&m, "shape"); byte(&m, 0xdc); byte(&m, 0); byte(&m, 33);
    for (int i = 0; i < 33; i++)
        byte(&m, 1);
    str(&m, "order"); str(&m, "C");
    cr_assert_eq(decode_copy(m.b, m.n, &out, &why), -EBADMSG);
    cr_assert(strstr(why, "32 dimensions"));

    m.n = 0; /* a shape whose byte count overflows */
    map(&m, 5);
    str(&m, "shmref"); byte(&m, 1);
    str(&m, "kind"); str(&m, "array");
    str(&m, "dtype"); str(&m, "<f8");
    str(&m, "shape"); arr(&m, 1); byte(&m, 0xcf); raw(&m, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
    str(&m, "order"); str(&m, "C");
    cr_assert_eq(decode_copy(m.b, m.n, &out, &why), -EBADMSG);
    cr_assert(strstr(why, "overflows"));

    m.n = 0; /* unknown keys are ignored, keys of other types too */
    envelope(&m, "<i2", 2);
    str(&m, "later"); arr(&m, 2); byte(&m, 1); byte(&m, 2);
    byte(&m, 7); str(&m, "int key");
    cr_assert_eq(decode_copy(m.b, m.n, &out, &why), 0, "%s", why);
    cr_assert_str_eq(out.dtype, "<i2");
}

Test(meta, every_truncation_is_refused)
{
    uint8_t buf[PROTO_MAX_META];
    struct meta_array m = sample(), out;
    m.user_kind = META_USER_BIN;
    m.user = (const uint8_t *)"abcdef";
    m.user_len = 6;
    int n = encode(&m, buf, sizeof(buf));
    for (int k = 0; k < n; k++)
        cr_assert_neq(decode_copy(buf, (size_t)k, &out, NULL), 0, "prefix of %d bytes decoded", k);
    cr_assert_eq(decode_copy(buf, (size_t)n, &out, NULL), 0);
}
