/* SPDX-License-Identifier: MIT */
/* arrow-data.h: test-only Arrow arrays built by hand (C Data Interface structures, heap
 * nodes with release callbacks that free them), a deterministic record batch with
 * every supported type and nulls, and a logical comparison of two arrays element by
 * element that respects each side's offsets. Included by test-arrow.c only. */
#ifndef SHMREF_TEST_ARROW_DATA_H
#define SHMREF_TEST_ARROW_DATA_H

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "manifest.h"
#include "shmref/shmref.h"

/* ---- building ---- */

struct tpriv {
    void *bufs[3];
    int nb;
};

static void t_release_array(struct ArrowArray *a)
{
    struct tpriv *p = a->private_data;
    for (int64_t i = 0; i < a->n_children; i++) {
        if (a->children[i]->release)
            a->children[i]->release(a->children[i]);
        free(a->children[i]);
    }
    if (a->dictionary) {
        if (a->dictionary->release)
            a->dictionary->release(a->dictionary);
        free(a->dictionary);
    }
    for (int i = 0; i < p->nb; i++)
        free(p->bufs[i]);
    free(a->buffers);
    free(a->children);
    free(p);
    a->release = NULL;
}

/* t_array: takes ownership of the nb buffers (malloc'd or NULL) and of the children. */
static struct ArrowArray *t_array(int64_t len, int64_t off, int64_t nulls, int nb, void *b0, void *b1, void *b2,
                                  int nch, struct ArrowArray **ch, struct ArrowArray *dict)
{
    struct ArrowArray *a = calloc(1, sizeof(*a));
    struct tpriv *p = calloc(1, sizeof(*p));
    void *bs[3] = { b0, b1, b2 };
    p->nb = nb;
    a->buffers = calloc(3, sizeof(void *));
    for (int i = 0; i < nb; i++)
        a->buffers[i] = p->bufs[i] = bs[i];
    a->length = len;
    a->offset = off;
    a->null_count = nulls;
    a->n_buffers = nb;
    a->n_children = nch;
    a->children = nch ? calloc((size_t)nch, sizeof(*a->children)) : NULL;
    for (int i = 0; i < nch; i++)
        a->children[i] = ch[i];
    a->dictionary = dict;
    a->release = t_release_array;
    a->private_data = p;
    return a;
}

static void t_release_schema(struct ArrowSchema *s)
{
    for (int64_t i = 0; i < s->n_children; i++) {
        if (s->children[i]->release)
            s->children[i]->release(s->children[i]);
        free(s->children[i]);
    }
    if (s->dictionary) {
        if (s->dictionary->release)
            s->dictionary->release(s->dictionary);
        free(s->dictionary);
    }
    free(s->children);
    free((char *)s->format);
    free((char *)s->name);
    free((char *)s->metadata);
    s->release = NULL;
}

static struct ArrowSchema *t_schema(const char *format, const char *name, int64_t flags, int nch,
                                    struct ArrowSchema **ch, struct ArrowSchema *dict)
{
    struct ArrowSchema *s = calloc(1, sizeof(*s));
    s->format = strdup(format);
    s->name = strdup(name);
    s->flags = flags;
    s->n_children = nch;
    s->children = nch ? calloc((size_t)nch, sizeof(*s->children)) : NULL;
    for (int i = 0; i < nch; i++)
        s->children[i] = ch[i];
    s->dictionary = dict;
    s->release = t_release_schema;
    return s;
}

/* t_metadata: Arrow binary metadata of one key/value pair (malloc'd). */
static char *t_metadata(const char *k, const char *v)
{
    int32_t one = 1, kl = (int32_t)strlen(k), vl = (int32_t)strlen(v);
    char *m = malloc(12 + (size_t)kl + (size_t)vl), *p = m;
    memcpy(p, &one, 4);
    memcpy(p + 4, &kl, 4);
    memcpy(p + 8, k, (size_t)kl);
    memcpy(p + 8 + kl, &vl, 4);
    memcpy(p + 12 + kl, v, (size_t)vl);
    return m;
}

static bool t_metadata_eq(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    int32_t n, k;
    size_t pos = 4;
    memcpy(&n, a, 4);
    for (int32_t i = 0; i < 2 * n; i++) {
        memcpy(&k, a + pos, 4);
        pos += 4 + (size_t)k;
    }
    return !memcmp(a, b, pos);
}

/* A column under construction: its schema and array. */
struct tcol {
    struct ArrowSchema *s;
    struct ArrowArray *a;
};

static bool t_is_null(int64_t i, int seed)
{
    return (i * 7 + seed) % 5 == 0;
}

/* validity for n slots, nulls by t_is_null; *ret_nulls counts them in [off, n). */
static uint8_t *t_validity(int64_t n, int seed, int64_t off, int64_t *ret_nulls)
{
    uint8_t *v = calloc((size_t)(n + 7) / 8 + 8, 1);
    int64_t nulls = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!t_is_null(i, seed))
            v[i / 8] |= (uint8_t)(1u << (i % 8));
        else if (i >= off)
            nulls++;
    }
    *ret_nulls = nulls;
    return v;
}

static uint8_t *t_bytes(size_t n, int seed)
{
    uint8_t *b = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * 31 + (size_t)seed * 7 + 3);
    return b;
}

/* fixed-width column: n slots of width bytes, offset off, length n - off. Every third
 * column says null_count -1 (unknown), for the importer to count. */
static struct tcol t_fixed(const char *name, const char *format, size_t width, int64_t n, int64_t off, int seed)
{
    int64_t nulls;
    uint8_t *v = t_validity(n, seed, off, &nulls);
    struct tcol c = { t_schema(format, name, ARROW_FLAG_NULLABLE, 0, NULL, NULL), NULL };
    c.a = t_array(n - off, off, seed % 3 ? nulls : -1, 2, v, t_bytes((size_t)n * width, seed), NULL, 0, NULL, NULL);
    return c;
}

static struct tcol t_bool(const char *name, int64_t n, int64_t off, int seed)
{
    int64_t nulls;
    uint8_t *v = t_validity(n, seed, off, &nulls);
    struct tcol c = { t_schema("b", name, ARROW_FLAG_NULLABLE, 0, NULL, NULL), NULL };
    c.a = t_array(n - off, off, nulls, 2, v, t_bytes((size_t)(n + 7) / 8, seed), NULL, 0, NULL, NULL);
    return c;
}

/* offsets of n slots, slot i of (i * 3 + seed) % 7 elements (0 for nulls when nullok) */
static void *t_offsets(int64_t n, int seed, bool large, int64_t *ret_total)
{
    void *o = malloc((size_t)(n + 1) * 8);
    int64_t at = 0;
    for (int64_t i = 0; i <= n; i++) {
        if (large)
            ((int64_t *)o)[i] = at;
        else
            ((int32_t *)o)[i] = (int32_t)at;
        at += (i * 3 + seed) % 7;
    }
    /* the last slot's size was added once too many */
    at -= (n * 3 + seed) % 7;
    *ret_total = at;
    return o;
}

static struct tcol t_binary(const char *name, const char *format, int64_t n, int64_t off, int seed)
{
    bool large = format[0] == 'U' || format[0] == 'Z';
    int64_t nulls, total;
    uint8_t *v = t_validity(n, seed, off, &nulls);
    void *o = t_offsets(n, seed, large, &total);
    uint8_t *d = malloc((size_t)total + 1);
    for (int64_t i = 0; i < total; i++)
        d[i] = (uint8_t)('a' + (i + seed) % 26);
    struct tcol c = { t_schema(format, name, ARROW_FLAG_NULLABLE, 0, NULL, NULL), NULL };
    c.a = t_array(n - off, off, nulls, 3, v, o, d, 0, NULL, NULL);
    return c;
}

/* A child column for nested types: n slots, no offset. */
static struct tcol t_child_fixed(const char *name, const char *format, size_t w, int64_t n, int seed)
{
    return t_fixed(name, format, w, n, 0, seed);
}

static struct tcol t_list(const char *name, bool large, struct tcol item_of(int64_t n, int seed), int64_t n,
                          int64_t off, int seed)
{
    int64_t nulls, total;
    uint8_t *v = t_validity(n, seed, off, &nulls);
    void *o = t_offsets(n, seed, large, &total);
    struct tcol item = item_of(total, seed + 1);
    struct ArrowSchema *cs[1] = { item.s };
    struct ArrowArray *ca[1] = { item.a };
    struct tcol c = { t_schema(large ? "+L" : "+l", name, ARROW_FLAG_NULLABLE, 1, cs, NULL), NULL };
    c.a = t_array(n - off, off, nulls, 2, v, o, NULL, 1, ca, NULL);
    return c;
}

static struct tcol item_i32(int64_t n, int seed) { return t_child_fixed("item", "i", 4, n, seed); }
static struct tcol item_utf8(int64_t n, int seed) { return t_binary("item", "u", n, 0, seed); }

static struct tcol t_fixed_list(const char *name, int64_t n, int64_t off, int seed)
{
    int64_t nulls;
    uint8_t *v = t_validity(n, seed, off, &nulls);
    struct tcol item = t_child_fixed("item", "f", 4, n * 3, seed + 1);
    struct ArrowSchema *cs[1] = { item.s };
    struct ArrowArray *ca[1] = { item.a };
    struct tcol c = { t_schema("+w:3", name, ARROW_FLAG_NULLABLE, 1, cs, NULL), NULL };
    c.a = t_array(n - off, off, nulls, 1, v, NULL, NULL, 1, ca, NULL);
    return c;
}

static struct tcol t_struct(const char *name, int64_t n, int64_t off, int seed)
{
    int64_t nulls;
    uint8_t *v = t_validity(n, seed, off, &nulls);
    /* children longer than the parent, with offsets of their own */
    struct tcol a = t_fixed("a", "i", 4, n + 2, 2, seed + 1);
    struct tcol b = t_binary("b", "u", n + 1, 1, seed + 2);
    struct ArrowSchema *cs[2] = { a.s, b.s };
    struct ArrowArray *ca[2] = { a.a, b.a };
    struct tcol c = { t_schema("+s", name, ARROW_FLAG_NULLABLE, 2, cs, NULL), NULL };
    c.a = t_array(n - off, off, nulls, 1, v, NULL, NULL, 2, ca, NULL);
    return c;
}

static struct tcol t_map(const char *name, int64_t n, int64_t off, int seed)
{
    int64_t nulls, total, kn;
    uint8_t *v = t_validity(n, seed, off, &nulls);
    void *o = t_offsets(n, seed, false, &total);
    struct tcol k = t_binary("key", "u", total, 0, seed + 1);
    free((void *)k.a->buffers[0]); /* keys are never null */
    ((struct tpriv *)k.a->private_data)->bufs[0] = NULL;
    k.a->buffers[0] = NULL;
    k.a->null_count = 0;
    k.s->flags = 0;
    (void)kn;
    struct tcol val = t_fixed("value", "l", 8, total, 0, seed + 2);
    struct ArrowSchema *es[2] = { k.s, val.s };
    struct ArrowArray *ea[2] = { k.a, val.a };
    struct ArrowSchema *entries_s = t_schema("+s", "entries", 0, 2, es, NULL);
    struct ArrowArray *entries_a = t_array(total, 0, 0, 1, NULL, NULL, NULL, 2, ea, NULL);
    struct tcol c = { t_schema("+m", name, ARROW_FLAG_NULLABLE, 1, &entries_s, NULL), NULL };
    c.a = t_array(n - off, off, nulls, 2, v, o, NULL, 1, &entries_a, NULL);
    return c;
}

static struct tcol t_dictionary(const char *name, int64_t n, int64_t off, int seed)
{
    int64_t nulls;
    uint8_t *v = t_validity(n, seed, off, &nulls);
    int16_t *idx = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        idx[i] = t_is_null(i, seed) ? 999 : (int16_t)((i * 5 + seed) % 6); /* a null's index is garbage */
    struct tcol d = t_binary("", "u", 8, 2, seed + 3); /* 6 values, offset 2 */
    struct tcol c = { t_schema("s", name, ARROW_FLAG_NULLABLE, 0, NULL, d.s), NULL };
    c.a = t_array(n - off, off, nulls, 2, v, idx, NULL, 0, NULL, d.a);
    return c;
}

static struct tcol t_null(const char *name, int64_t n, int64_t off)
{
    struct tcol c = { t_schema("n", name, ARROW_FLAG_NULLABLE, 0, NULL, NULL), NULL };
    c.a = t_array(n - off, off, n - off, 0, NULL, NULL, NULL, 0, NULL, NULL);
    return c;
}

#define T_MAX_COLS 64

/* t_batch: a record batch of every supported type, rows slots (each column with an
 * offset of its own, from 0 to 5), as a struct array with offset boff and length
 * rows - boff - bcut. seed varies the values between batches of a stream. */
static int t_batch(int64_t rows, int64_t boff, int64_t bcut, int seed, struct ArrowSchema *ret_s, struct ArrowArray *ret_a)
{
    static const struct { const char *name, *format; size_t w; } fixed[] = {
        { "i8", "c", 1 }, { "u8", "C", 1 }, { "i16", "s", 2 }, { "u16", "S", 2 }, { "i32", "i", 4 },
        { "u32", "I", 4 }, { "i64", "l", 8 }, { "u64", "L", 8 }, { "f16", "e", 2 }, { "f32", "f", 4 },
        { "f64", "g", 8 }, { "fsb5", "w:5", 5 }, { "date32", "tdD", 4 }, { "date64", "tdm", 8 },
        { "time32s", "tts", 4 }, { "time32ms", "ttm", 4 }, { "time64us", "ttu", 8 }, { "time64ns", "ttn", 8 },
        { "ts_s", "tss:", 8 }, { "ts_ms_utc", "tsm:UTC", 8 }, { "ts_us_paris", "tsu:Europe/Paris", 8 },
        { "ts_ns_ny", "tsn:America/New_York", 8 }, { "dur_s", "tDs", 8 }, { "dur_ms", "tDm", 8 },
        { "dur_us", "tDu", 8 }, { "dur_ns", "tDn", 8 }, { "dec128", "d:38,10", 16 }, { "dec256", "d:76,20,256", 32 },
        { "dec32", "d:9,2,32", 4 }, { "dec64", "d:18,4,64", 8 }, { "interval_ym", "tiM", 4 },
        { "interval_dt", "tiD", 8 }, { "interval_mdn", "tin", 16 },
    };
    struct tcol cols[T_MAX_COLS];
    int n = 0;
    int64_t total = rows + 5; /* slots per column: room for each column's own offset */
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        int64_t off = (int64_t)(i % 6);
        { cols[n] = t_fixed(fixed[i].name, fixed[i].format, fixed[i].w, rows + off, off, seed + n); n++; }
    }
    (void)total;
    { cols[n] = t_bool("bool", rows + 3, 3, seed + n); n++; }
    { cols[n] = t_bool("bool0", rows, 0, seed + n); n++; }
    { cols[n] = t_binary("utf8", "u", rows + 1, 1, seed + n); n++; }
    { cols[n] = t_binary("binary", "z", rows, 0, seed + n); n++; }
    { cols[n] = t_binary("large_utf8", "U", rows + 2, 2, seed + n); n++; }
    { cols[n] = t_binary("large_binary", "Z", rows + 5, 5, seed + n); n++; }
    { cols[n] = t_list("list_i32", false, item_i32, rows + 4, 4, seed + n); n++; }
    { cols[n] = t_list("large_list_utf8", true, item_utf8, rows + 1, 1, seed + n); n++; }
    { cols[n] = t_fixed_list("fixed_list_f32", rows + 2, 2, seed + n); n++; }
    { cols[n] = t_struct("struct", rows + 3, 3, seed + n); n++; }
    { cols[n] = t_map("map", rows + 1, 1, seed + n); n++; }
    { cols[n] = t_dictionary("dict_utf8", rows + 2, 2, seed + n); n++; }
    cols[n++] = t_null("null", rows + 1, 1);
    struct ArrowSchema *cs[T_MAX_COLS];
    struct ArrowArray *ca[T_MAX_COLS];
    for (int i = 0; i < n; i++) {
        cs[i] = cols[i].s;
        ca[i] = cols[i].a;
    }
    cols[30].s->metadata = t_metadata("unit", "metres"); /* a column's own metadata */
    struct ArrowSchema *s = t_schema("+s", "", 0, n, cs, NULL);
    s->metadata = t_metadata("origin", "test-arrow");    /* the schema's */
    struct ArrowArray *a = t_array(rows - boff - bcut, boff, 0, 1, NULL, NULL, NULL, n, ca, NULL);
    *ret_s = *s;
    *ret_a = *a;
    free(s);
    free(a);
    return n;
}

/* ---- comparing ---- */

static bool t_bit(const void *p, int64_t i)
{
    return ((const uint8_t *)p)[i / 8] >> (i % 8) & 1;
}

static int64_t t_rd(const void *p, size_t w, int64_t i, bool is_signed)
{
    const uint8_t *b = (const uint8_t *)p + (size_t)i * w;
    switch (w) {
    case 1: return is_signed ? (int64_t)(int8_t)b[0] : b[0];
    case 2: { int16_t x; memcpy(&x, b, 2); return is_signed ? (int64_t)x : (int64_t)(uint16_t)x; }
    case 4: { int32_t x; memcpy(&x, b, 4); return is_signed ? (int64_t)x : (int64_t)(uint32_t)x; }
    default: { int64_t x; memcpy(&x, b, 8); return x; }
    }
}

static bool t_valid(const struct manifest_type *t, const struct ArrowArray *a, int64_t i)
{
    if (t->layout == MANIFEST_NULL)
        return false;
    return !a->buffers[0] || t_bit(a->buffers[0], a->offset + i);
}

/* t_eq: element i of a equals element j of b (same schema s); path names it on failure. */
static bool t_eq(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t i, const struct ArrowArray *b,
                 int64_t j, const char *path)
{
    struct manifest_type t;
    cr_assert_eq(manifest_type_parse(s->format, &t), 0, "%s: format %s", path, s->format);
    bool va = t_valid(&t, a, i), vb = t_valid(&t, b, j);
    if (va != vb) {
        cr_log_error("%s: slot %lld/%lld validity %d vs %d", path, (long long)i, (long long)j, va, vb);
        return false;
    }
    if (!va)
        return true;
    int64_t pa = a->offset + i, pb = b->offset + j;
    if (s->dictionary) {
        int64_t ia = t_rd(a->buffers[1], t.width, pa, t.is_signed), ib = t_rd(b->buffers[1], t.width, pb, t.is_signed);
        return t_eq(s->dictionary, a->dictionary, ia, b->dictionary, ib, path);
    }
    switch (t.layout) {
    case MANIFEST_BOOL:
        if (t_bit(a->buffers[1], pa) != t_bit(b->buffers[1], pb)) {
            cr_log_error("%s: bool slot %lld differs", path, (long long)i);
            return false;
        }
        return true;
    case MANIFEST_FIXED:
        if (memcmp((const uint8_t *)a->buffers[1] + pa * (int64_t)t.width,
                   (const uint8_t *)b->buffers[1] + pb * (int64_t)t.width, t.width)) {
            cr_log_error("%s: slot %lld differs", path, (long long)i);
            return false;
        }
        return true;
    case MANIFEST_BINARY:
    case MANIFEST_LARGE_BINARY:
    case MANIFEST_LIST:
    case MANIFEST_LARGE_LIST: {
        size_t ow = t.layout == MANIFEST_BINARY || t.layout == MANIFEST_LIST ? 4 : 8;
        int64_t sa = t_rd(a->buffers[1], ow, pa, true), ea = t_rd(a->buffers[1], ow, pa + 1, true);
        int64_t sb = t_rd(b->buffers[1], ow, pb, true), eb = t_rd(b->buffers[1], ow, pb + 1, true);
        if (ea - sa != eb - sb) {
            cr_log_error("%s: slot %lld has %lld vs %lld elements", path, (long long)i, (long long)(ea - sa), (long long)(eb - sb));
            return false;
        }
        if (t.layout == MANIFEST_BINARY || t.layout == MANIFEST_LARGE_BINARY) {
            if (ea > sa && memcmp((const uint8_t *)a->buffers[2] + sa, (const uint8_t *)b->buffers[2] + sb, (size_t)(ea - sa))) {
                cr_log_error("%s: slot %lld bytes differ", path, (long long)i);
                return false;
            }
            return true;
        }
        for (int64_t k = 0; k < ea - sa; k++)
            if (!t_eq(s->children[0], a->children[0], sa + k, b->children[0], sb + k, path))
                return false;
        return true;
    }
    case MANIFEST_FIXED_LIST:
        for (int64_t k = 0; k < (int64_t)t.width; k++)
            if (!t_eq(s->children[0], a->children[0], pa * (int64_t)t.width + k, b->children[0], pb * (int64_t)t.width + k, path))
                return false;
        return true;
    case MANIFEST_STRUCT:
        for (int64_t c = 0; c < s->n_children; c++)
            if (!t_eq(s->children[c], a->children[c], pa, b->children[c], pb, path))
                return false;
        return true;
    default:
        return true;
    }
}

static int64_t t_count_nulls(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t start, int64_t len)
{
    struct manifest_type t;
    manifest_type_parse(s->format, &t);
    int64_t n = 0;
    for (int64_t i = start; i < start + len; i++)
        n += !t_valid(&t, a, i);
    return n;
}

/* t_expect_column: b (exported) holds the values of a (the original) from its logical
 * slot start on, for b->length slots: len. */
static void t_expect_column(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t start, int64_t len,
                            const struct ArrowSchema *bs, const struct ArrowArray *b)
{
    cr_assert_str_eq(bs->format, s->format);
    cr_assert_str_eq(bs->name, s->name, "column %s", s->name);
    cr_assert_eq(bs->n_children, s->n_children, "%s", s->name);
    cr_assert_eq(!bs->dictionary, !s->dictionary, "%s", s->name);
    cr_assert(t_metadata_eq(s->metadata, bs->metadata), "%s: metadata differs", s->name);
    cr_assert_eq(bs->flags, s->flags, "%s: flags", s->name);
    cr_assert_eq(b->length, len, "%s: length %lld, want %lld", s->name, (long long)b->length, (long long)len);
    cr_assert_eq(b->n_buffers, a->n_buffers, "%s: n_buffers", s->name);
    cr_expect_eq(b->null_count, t_count_nulls(s, a, start, len), "%s: null_count %lld", s->name, (long long)b->null_count);
    for (int64_t i = 0; i < len; i++)
        cr_assert(t_eq(s, a, start + i, b, i, s->name), "%s: slot %lld differs", s->name, (long long)i);
}

/* t_inside: every buffer of b (recursively) that holds bytes lies in [base, +len). */
static int t_inside(const struct ArrowSchema *s, const struct ArrowArray *b, const void *base, size_t len)
{
    struct manifest_type t;
    int n = 0;
    manifest_type_parse(s->format, &t);
    for (int64_t i = 0; i < b->n_buffers; i++) {
        const uint8_t *p = b->buffers[i];
        if (!p || b->length == 0)
            continue;
        cr_assert(p >= (const uint8_t *)base && p < (const uint8_t *)base + len,
                  "%s: buffer %lld at %p is outside the mapping [%p, +%zu)", s->name, (long long)i, (const void *)p, base, len);
        cr_assert_eq((size_t)(p - (const uint8_t *)base) % 64, 0, "%s: buffer %lld not 64-byte aligned", s->name, (long long)i);
        n++;
    }
    for (int64_t c = 0; c < b->n_children; c++)
        n += t_inside(s->children[c], b->children[c], base, len);
    if (b->dictionary)
        n += t_inside(s->dictionary, b->dictionary, base, len);
    return n;
}

#endif
