/* SPDX-License-Identifier: MIT */
/* meta.c: the array metadata convention (proto/METADATA.md). A small msgpack reader and
 * writer of its own, over the caller's bytes: the decoder reports where the user value
 * lies in the input instead of copying it, and every read is bounds-checked (the whole
 * input has passed proto_check first, so counts and lengths are already sane). */
#include "meta.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "proto.h"

struct cur {
    const uint8_t *p;
    size_t len, pos;
};

static bool take(struct cur *c, size_t n, uint64_t *ret)
{
    if (c->len - c->pos < n)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | c->p[c->pos + i];
    c->pos += n;
    *ret = v;
    return true;
}

/* container: a map (or array) header; its count in *ret. */
static bool rd_container(struct cur *c, bool map, uint64_t *ret)
{
    if (c->pos >= c->len)
        return false;
    uint8_t b = c->p[c->pos];
    uint8_t fix = map ? 0x80 : 0x90, c16 = map ? 0xde : 0xdc, c32 = map ? 0xdf : 0xdd;
    if (b >= fix && b <= fix + 0x0f) {
        c->pos++;
        *ret = b & 0x0f;
        return true;
    }
    if (b != c16 && b != c32)
        return false;
    c->pos++;
    return take(c, b == c16 ? 2 : 4, ret);
}

static bool rd_str(struct cur *c, const char **ret, size_t *ret_len)
{
    if (c->pos >= c->len)
        return false;
    uint8_t b = c->p[c->pos];
    uint64_t n;
    if (b >= 0xa0 && b <= 0xbf) {
        c->pos++;
        n = b & 0x1f;
    } else if (b >= 0xd9 && b <= 0xdb) {
        c->pos++;
        if (!take(c, (size_t)1 << (b - 0xd9), &n))
            return false;
    } else {
        return false;
    }
    if (n > c->len - c->pos)
        return false;
    *ret = (const char *)c->p + c->pos;
    *ret_len = (size_t)n;
    c->pos += (size_t)n;
    return true;
}

static bool rd_uint(struct cur *c, uint64_t *ret)
{
    if (c->pos >= c->len)
        return false;
    uint8_t b = c->p[c->pos];
    if (b <= 0x7f) {
        c->pos++;
        *ret = b;
        return true;
    }
    uint64_t v;
    if (b >= 0xcc && b <= 0xcf) {
        c->pos++;
        if (!take(c, (size_t)1 << (b - 0xcc), &v))
            return false;
        *ret = v;
        return true;
    }
    if (b >= 0xd0 && b <= 0xd3) { /* a signed encoding of a value >= 0: some packers do that */
        unsigned n = 1u << (b - 0xd0);
        c->pos++;
        if (!take(c, n, &v))
            return false;
        if (v >> (8 * n - 1))
            return false;
        *ret = v;
        return true;
    }
    return false;
}

/* skip: step over one object whose extent proto_check has vouched for. */
static bool skip(struct cur *c)
{
    size_t start = c->pos;
    const char *why;
    /* proto_check wants exactly one object: find its end by trying the header-implied
     * structure, walking with an explicit count of what remains. */
    uint64_t left = 1;
    while (left) {
        if (c->pos >= c->len)
            return false;
        left--;
        uint8_t b = c->p[c->pos];
        uint64_t n;
        const char *s;
        size_t sl;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            c->pos++;
        } else if ((b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf) {
            if (!rd_container(c, true, &n) || n > c->len)
                return false;
            left += 2 * n;
        } else if ((b >= 0x90 && b <= 0x9f) || b == 0xdc || b == 0xdd) {
            if (!rd_container(c, false, &n) || n > c->len)
                return false;
            left += n;
        } else if ((b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb)) {
            if (!rd_str(c, &s, &sl))
                return false;
        } else if (b >= 0xc4 && b <= 0xc6) {
            c->pos++;
            if (!take(c, (size_t)1 << (b - 0xc4), &n) || n > c->len - c->pos)
                return false;
            c->pos += (size_t)n;
        } else if (b == 0xca || b == 0xcb || (b >= 0xcc && b <= 0xd3)) {
            size_t k = b == 0xca ? 4 : b == 0xcb ? 8 : (size_t)1 << ((b - 0xcc) & 3);
            c->pos++;
            if (c->len - c->pos < k)
                return false;
            c->pos += k;
        } else {
            return false; /* ext: proto_check refused it already */
        }
        if (left > c->len - c->pos)
            return false; /* every element takes at least one byte */
    }
    return proto_check(c->p + start, c->pos - start, PROTO_MAX_DEPTH, &why) == 0;
}

int meta_dtype_itemsize(const char *dtype, size_t len)
{
    if (len < 3 || len >= META_DTYPE_MAX || !strchr("<>|=", dtype[0]) || !dtype[1] ||
        !strchr("biufcmMSUV", dtype[1]))
        return -EINVAL;
    char kind = dtype[1];
    size_t i = 2;
    uint64_t size = 0;
    if (dtype[i] < '1' || dtype[i] > '9')
        return -EINVAL;
    for (; i < len && dtype[i] >= '0' && dtype[i] <= '9'; i++) {
        size = size * 10 + (uint64_t)(dtype[i] - '0');
        if (size > (1u << 20))
            return -EINVAL;
    }
    bool dt = kind == 'm' || kind == 'M';
    if (dt) { /* "[unit]", e.g. [ns], [s], [D], [10ms] */
        if (i >= len || dtype[i] != '[' || dtype[len - 1] != ']' || len - i < 3)
            return -EINVAL;
        for (size_t k = i + 1; k < len - 1; k++)
            if (!((dtype[k] >= 'a' && dtype[k] <= 'z') || (dtype[k] >= 'A' && dtype[k] <= 'Z') ||
                  (dtype[k] >= '0' && dtype[k] <= '9')))
                return -EINVAL;
        i = len;
    }
    if (i != len)
        return -EINVAL;
    if (kind == 'U') /* numpy counts UCS-4 characters there: "<U5" is 20 bytes */
        size *= 4;
    return (int)size;
}

int meta_array_nbytes(const struct meta_array *m, uint64_t *ret)
{
    int item = meta_dtype_itemsize(m->dtype, strnlen(m->dtype, META_DTYPE_MAX));
    if (item < 0 || m->ndim > META_MAX_DIMS)
        return -EINVAL;
    uint64_t n = (uint64_t)item;
    bool zero = false;
    for (uint32_t i = 0; i < m->ndim; i++)
        zero |= m->shape[i] == 0;
    if (zero)
        n = 0;
    for (uint32_t i = 0; i < m->ndim && !zero; i++) {
        if (n > UINT64_MAX / m->shape[i])
            return -EOVERFLOW;
        n *= m->shape[i];
    }
    if (n > UINT64_MAX - m->offset)
        return -EOVERFLOW;
    *ret = n + m->offset;
    return 0;
}

/* The writer: each put fails once the buffer is full, and stays failed. */
struct out {
    uint8_t *p;
    size_t len, cap;
    bool full;
};

static void put(struct out *o, const void *b, size_t n)
{
    if (o->full || o->cap - o->len < n) {
        o->full = true;
        return;
    }
    memcpy(o->p + o->len, b, n);
    o->len += n;
}

static void put_head(struct out *o, uint8_t tag, uint64_t v, unsigned n)
{
    uint8_t b[9];
    b[0] = tag;
    for (unsigned i = 0; i < n; i++)
        b[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    put(o, b, 1 + n);
}

static void put_uint(struct out *o, uint64_t v)
{
    if (v <= 0x7f) put_head(o, (uint8_t)v, 0, 0);
    else if (v <= 0xff) put_head(o, 0xcc, v, 1);
    else if (v <= 0xffff) put_head(o, 0xcd, v, 2);
    else if (v <= 0xffffffffu) put_head(o, 0xce, v, 4);
    else put_head(o, 0xcf, v, 8);
}

static void put_str(struct out *o, const char *s)
{
    size_t n = strlen(s);
    if (n <= 31) put_head(o, (uint8_t)(0xa0 | n), 0, 0);
    else if (n <= 0xff) put_head(o, 0xd9, n, 1);
    else put_head(o, 0xda, n, 2); /* every string here is short */
    put(o, s, n);
}

static void put_bin(struct out *o, const uint8_t *b, size_t n)
{
    if (n <= 0xff) put_head(o, 0xc4, n, 1);
    else if (n <= 0xffff) put_head(o, 0xc5, n, 2);
    else put_head(o, 0xc6, n, 4);
    put(o, b, n);
}

static void put_count(struct out *o, bool map, uint64_t n)
{
    if (n <= 15) put_head(o, (uint8_t)((map ? 0x80 : 0x90) | n), 0, 0);
    else put_head(o, map ? 0xde : 0xdc, n, 2);
}

int meta_array_encode(const struct meta_array *m, uint8_t *buf, size_t cap, const char **ret_why)
{
    const char *why = NULL, *w;
    uint64_t nbytes;
    if (meta_dtype_itemsize(m->dtype, strnlen(m->dtype, META_DTYPE_MAX)) < 0)
        why = "dtype: not an accepted type string";
    else if (m->ndim > META_MAX_DIMS)
        why = "shape: more than 32 dimensions";
    else if (m->order != 'C' && m->order != 'F')
        why = "order: not C or F";
    else if (meta_array_nbytes(m, &nbytes) < 0)
        why = "shape: the array's size overflows";
    else if (m->user_kind > META_USER_MSGPACK || (m->user_kind != META_USER_NONE && m->user_len && !m->user))
        why = "user: bad kind or no bytes";
    else if (m->user_kind == META_USER_MSGPACK &&
             (m->user_len == 0 || proto_check(m->user, m->user_len, PROTO_MAX_DEPTH - 1, &w) < 0))
        why = "user: not one msgpack object";
    if (why) {
        if (ret_why)
            *ret_why = why;
        return -EINVAL;
    }
    struct out o = { .p = buf, .cap = cap };
    unsigned keys = 5 + (m->offset != 0) + (m->user_kind != META_USER_NONE);
    put_count(&o, true, keys);
    put_str(&o, "shmref");
    put_uint(&o, META_VERSION);
    put_str(&o, "kind");
    put_str(&o, "array");
    put_str(&o, "dtype");
    put_str(&o, m->dtype);
    put_str(&o, "shape");
    put_count(&o, false, m->ndim);
    for (uint32_t i = 0; i < m->ndim; i++)
        put_uint(&o, m->shape[i]);
    put_str(&o, "order");
    put_str(&o, m->order == 'F' ? "F" : "C");
    if (m->offset) {
        put_str(&o, "offset");
        put_uint(&o, m->offset);
    }
    if (m->user_kind == META_USER_BIN) {
        put_str(&o, "user");
        put_bin(&o, m->user, m->user_len);
    } else if (m->user_kind == META_USER_MSGPACK) {
        put_str(&o, "user");
        put(&o, m->user, m->user_len);
    }
    if (o.full) {
        if (ret_why)
            *ret_why = "metadata does not fit";
        return -EMSGSIZE;
    }
    return (int)o.len;
}

enum { K_SHMREF, K_KIND, K_DTYPE, K_SHAPE, K_ORDER, K_OFFSET, K_USER, K_N };
static const char *const key_names[K_N] = { "shmref", "kind", "dtype", "shape", "order", "offset", "user" };

static int key_of(const char *s, size_t n)
{
    for (int k = 0; k < K_N; k++)
        if (strlen(key_names[k]) == n && memcmp(key_names[k], s, n) == 0)
            return k;
    return -1;
}

#define BAD(msg) do { why = (msg); r = -EBADMSG; goto fail; } while (0)
#define OPAQUE(msg) do { why = (msg); r = -ENOMSG; goto fail; } while (0)

int meta_array_decode(const uint8_t *buf, size_t len, struct meta_array *ret, const char **ret_why)
{
    const char *why = NULL, *w, *s;
    size_t at[K_N], sl;
    bool seen[K_N] = { false };
    uint64_t n, v;
    int r;
    struct cur c = { .p = buf, .len = len };
    struct meta_array m = { .order = 'C' };

    if (!buf || len == 0 || len > PROTO_MAX_META)
        OPAQUE("empty or larger than the metadata limit");
    if (proto_check(buf, len, PROTO_MAX_DEPTH, &w) < 0 || !rd_container(&c, true, &n))
        OPAQUE("not one msgpack map");
    for (uint64_t i = 0; i < n; i++) {
        if (!rd_str(&c, &s, &sl)) {
            if (!skip(&c) || !skip(&c)) /* a key of another type: not ours to judge */
                OPAQUE("unreadable map");
            continue;
        }
        int k = key_of(s, sl);
        if (k >= 0) {
            if (seen[k])
                BAD("duplicate key");
            seen[k] = true;
            at[k] = c.pos;
        }
        if (!skip(&c))
            OPAQUE("unreadable map");
    }
    if (!seen[K_SHMREF])
        OPAQUE("no \"shmref\" key: not this convention");
    c.pos = at[K_SHMREF];
    if (!rd_uint(&c, &v) || v == 0)
        BAD("shmref: not a version number");
    if (v > META_VERSION)
        BAD("shmref: a later version than this decoder knows");
    c.pos = at[K_KIND];
    if (!seen[K_KIND] || !rd_str(&c, &s, &sl))
        BAD("kind: missing or not a string");
    if (sl != 5 || memcmp(s, "array", 5) != 0)
        OPAQUE("kind: not \"array\"");
    c.pos = at[K_DTYPE];
    if (!seen[K_DTYPE] || !rd_str(&c, &s, &sl))
        BAD("dtype: missing or not a string");
    if (meta_dtype_itemsize(s, sl) < 0)
        BAD("dtype: not an accepted type string");
    memcpy(m.dtype, s, sl);
    m.dtype[sl] = '\0';
    c.pos = at[K_SHAPE];
    if (!seen[K_SHAPE] || !rd_container(&c, false, &n))
        BAD("shape: missing or not an array");
    if (n > META_MAX_DIMS)
        BAD("shape: more than 32 dimensions");
    m.ndim = (uint32_t)n;
    for (uint32_t i = 0; i < m.ndim; i++)
        if (!rd_uint(&c, &m.shape[i]))
            BAD("shape: an element is not an unsigned integer");
    if (seen[K_ORDER]) {
        c.pos = at[K_ORDER];
        if (!rd_str(&c, &s, &sl) || sl != 1 || (s[0] != 'C' && s[0] != 'F'))
            BAD("order: not \"C\" or \"F\"");
        m.order = s[0];
    } else {
        BAD("order: missing");
    }
    if (seen[K_OFFSET]) {
        c.pos = at[K_OFFSET];
        if (!rd_uint(&c, &m.offset))
            BAD("offset: not an unsigned integer");
    }
    if (meta_array_nbytes(&m, &v) < 0)
        BAD("shape: the array's size overflows");
    if (seen[K_USER]) {
        c.pos = at[K_USER];
        uint8_t b = buf[c.pos];
        if (b >= 0xc4 && b <= 0xc6) {
            c.pos++;
            if (!take(&c, (size_t)1 << (b - 0xc4), &n) || n > c.len - c.pos)
                BAD("user: truncated");
            m.user_kind = META_USER_BIN;
            m.user = buf + c.pos;
            m.user_len = (size_t)n;
        } else {
            size_t start = c.pos;
            if (!skip(&c))
                BAD("user: unreadable");
            m.user_kind = META_USER_MSGPACK;
            m.user = buf + start;
            m.user_len = c.pos - start;
        }
    }
    *ret = m;
    return 0;
fail:
    if (ret_why)
        *ret_why = why;
    return r;
}
