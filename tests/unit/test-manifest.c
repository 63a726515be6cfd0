/* SPDX-License-Identifier: MIT */
/* test-manifest.c: the unit-of-work manifest (proto/manifest.c): format strings, the
 * codec round trip (nested types, dictionaries, several batches), refusals of malformed
 * bytes, 10,000 columns (time and size printed), and every check manifest_validate makes
 * against a buffer, each with the message it must give. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <msgpack.h>

#include "manifest.h"

static char err[MANIFEST_ERR_MAX];

static struct manifest_field *fld(struct manifest *m, const char *name, const char *format, uint32_t nch, ...)
{
    struct manifest_field *f = manifest_alloc(m, sizeof(*f));
    cr_assert_not_null(f);
    f->name = manifest_strndup(m, name, strlen(name));
    f->format = manifest_strndup(m, format, strlen(format));
    cr_assert_eq(manifest_type_parse(format, &f->type), 0, "format %s", format);
    f->flags = 2;
    f->n_children = nch;
    f->children = manifest_alloc(m, (nch ? nch : 1) * sizeof(*f->children));
    va_list ap;
    va_start(ap, nch);
    for (uint32_t i = 0; i < nch; i++)
        f->children[i] = va_arg(ap, struct manifest_field *);
    va_end(ap);
    return f;
}

static struct manifest_array *arr(struct manifest *m, int64_t length, int64_t nulls, int64_t offset, uint32_t nch)
{
    struct manifest_array *a = manifest_alloc(m, sizeof(*a));
    a->length = length;
    a->null_count = nulls;
    a->offset = offset;
    a->children = manifest_alloc(m, (nch ? nch : 1) * sizeof(*a->children));
    return a;
}

static void buf(struct manifest_array *a, unsigned i, uint64_t off, uint64_t len)
{
    a->buffers[i] = (struct manifest_range){ off, len };
}

Test(manifest, parses_every_supported_format)
{
    static const struct { const char *f; enum manifest_layout l; unsigned nb; uint64_t w; } ok[] = {
        { "n", MANIFEST_NULL, 0, 0 }, { "b", MANIFEST_BOOL, 2, 0 },
        { "c", MANIFEST_FIXED, 2, 1 }, { "C", MANIFEST_FIXED, 2, 1 }, { "s", MANIFEST_FIXED, 2, 2 },
        { "S", MANIFEST_FIXED, 2, 2 }, { "i", MANIFEST_FIXED, 2, 4 }, { "I", MANIFEST_FIXED, 2, 4 },
        { "l", MANIFEST_FIXED, 2, 8 }, { "L", MANIFEST_FIXED, 2, 8 }, { "e", MANIFEST_FIXED, 2, 2 },
        { "f", MANIFEST_FIXED, 2, 4 }, { "g", MANIFEST_FIXED, 2, 8 },
        { "z", MANIFEST_BINARY, 3, 0 }, { "u", MANIFEST_BINARY, 3, 0 },
        { "Z", MANIFEST_LARGE_BINARY, 3, 0 }, { "U", MANIFEST_LARGE_BINARY, 3, 0 },
        { "w:16", MANIFEST_FIXED, 2, 16 }, { "d:38,10", MANIFEST_FIXED, 2, 16 },
        { "d:76,-3,256", MANIFEST_FIXED, 2, 32 }, { "d:9,2,32", MANIFEST_FIXED, 2, 4 },
        { "tdD", MANIFEST_FIXED, 2, 4 }, { "tdm", MANIFEST_FIXED, 2, 8 }, { "tts", MANIFEST_FIXED, 2, 4 },
        { "ttm", MANIFEST_FIXED, 2, 4 }, { "ttu", MANIFEST_FIXED, 2, 8 }, { "ttn", MANIFEST_FIXED, 2, 8 },
        { "tss:", MANIFEST_FIXED, 2, 8 }, { "tsn:Europe/Paris", MANIFEST_FIXED, 2, 8 },
        { "tsu:UTC", MANIFEST_FIXED, 2, 8 }, { "tsm:+01:00", MANIFEST_FIXED, 2, 8 },
        { "tDs", MANIFEST_FIXED, 2, 8 }, { "tDn", MANIFEST_FIXED, 2, 8 }, { "tiM", MANIFEST_FIXED, 2, 4 },
        { "tiD", MANIFEST_FIXED, 2, 8 }, { "tin", MANIFEST_FIXED, 2, 16 },
        { "+l", MANIFEST_LIST, 2, 0 }, { "+L", MANIFEST_LARGE_LIST, 2, 0 }, { "+m", MANIFEST_LIST, 2, 0 },
        { "+w:3", MANIFEST_FIXED_LIST, 1, 3 }, { "+s", MANIFEST_STRUCT, 1, 0 },
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        struct manifest_type t;
        cr_assert_eq(manifest_type_parse(ok[i].f, &t), 0, "%s", ok[i].f);
        cr_expect_eq(t.layout, ok[i].l, "%s", ok[i].f);
        cr_expect_eq(t.n_buffers, ok[i].nb, "%s", ok[i].f);
        cr_expect_eq(t.width, ok[i].w, "%s", ok[i].f);
    }
    static const char *bad[] = { "", "x", "gg", "w:", "w:0", "w:-1", "d:", "d:0,1", "d:10", "d:10,2,100",
                                 "tdX", "ts", "tsx:", "tD", "+", "+w:0", "+ud:0,1", "+us:0", "+r", "vu", "vz",
                                 "+vl", "iii" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct manifest_type t;
        cr_expect_eq(manifest_type_parse(bad[i], &t), -EINVAL, "%s", bad[i]);
    }
    struct manifest_type t;
    cr_assert_eq(manifest_type_parse("c", &t), 0);
    cr_expect(t.integer && t.is_signed);
    cr_assert_eq(manifest_type_parse("L", &t), 0);
    cr_expect(t.integer && !t.is_signed);
    cr_assert_eq(manifest_type_parse("g", &t), 0);
    cr_expect(!t.integer);
}

/* A schema with every kind of node: a primitive, a utf8 with metadata, a list of a
 * struct, a map, a dictionary of strings, a fixed-size list; two batches. */
static struct manifest *sample(void)
{
    struct manifest *m = manifest_new();
    cr_assert_not_null(m);
    static const uint8_t md[] = { 1, 0, 0, 0, 1, 0, 0, 0, 'k', 2, 0, 0, 0, 'v', 'v' };
    struct manifest_field *cols[6];
    cols[0] = fld(m, "id", "l", 0);
    cols[1] = fld(m, "name", "u", 0);
    cols[1]->metadata = md;
    cols[1]->metadata_len = sizeof(md);
    cols[2] = fld(m, "points", "+l", 1, fld(m, "item", "+s", 2, fld(m, "x", "f", 0), fld(m, "y", "f", 0)));
    cols[3] = fld(m, "tags", "+m", 1, fld(m, "entries", "+s", 2, fld(m, "key", "u", 0), fld(m, "value", "i", 0)));
    cols[4] = fld(m, "city", "s", 0);
    cols[4]->dictionary = fld(m, "", "u", 0);
    cols[5] = fld(m, "rgb", "+w:3", 1, fld(m, "c", "C", 0));
    m->n_columns = 6;
    m->columns = manifest_alloc(m, sizeof(cols));
    memcpy(m->columns, cols, sizeof(cols));
    m->metadata = md;
    m->metadata_len = sizeof(md);
    for (int b = 0; b < 2; b++) {
        struct manifest_batch *mb = manifest_add_batch(m, 10 + b);
        int64_t n = 10 + b;
        mb->columns[0] = arr(m, n, 0, 0, 0);
        buf(mb->columns[0], 1, 0, 8 * (uint64_t)n);
        mb->columns[1] = arr(m, n, 1, 0, 0);
        buf(mb->columns[1], 0, 128, 2);
        buf(mb->columns[1], 1, 192, 4 * (uint64_t)(n + 1));
        buf(mb->columns[1], 2, 320, 0);
        struct manifest_array *l = mb->columns[2] = arr(m, n, -1, 3, 1);
        buf(l, 1, 384, 4 * (uint64_t)(n + 4));
        l->children[0] = arr(m, 0, 0, 0, 2);
        l->children[0]->children[0] = arr(m, 0, 0, 0, 0);
        l->children[0]->children[1] = arr(m, 0, 0, 0, 0);
        struct manifest_array *mp = mb->columns[3] = arr(m, n, 0, 0, 1);
        mp->children[0] = arr(m, 0, 0, 0, 2);
        mp->children[0]->children[0] = arr(m, 0, 0, 0, 0);
        mp->children[0]->children[1] = arr(m, 0, 0, 0, 0);
        mb->columns[4] = arr(m, n, 0, 0, 0);
        mb->columns[4]->dictionary = arr(m, 2, 0, 0, 0);
        mb->columns[5] = arr(m, n, 0, 0, 1);
        mb->columns[5]->children[0] = arr(m, 3 * n, 0, 0, 0);
    }
    return m;
}

static void expect_same_field(const struct manifest_field *a, const struct manifest_field *b)
{
    cr_expect_str_eq(a->name, b->name);
    cr_expect_str_eq(a->format, b->format);
    cr_expect_eq(a->flags, b->flags);
    cr_expect_eq(a->metadata_len, b->metadata_len);
    if (a->metadata)
        cr_expect_eq(memcmp(a->metadata, b->metadata, a->metadata_len), 0);
    cr_assert_eq(a->n_children, b->n_children);
    for (uint32_t i = 0; i < a->n_children; i++)
        expect_same_field(a->children[i], b->children[i]);
    cr_assert_eq(!a->dictionary, !b->dictionary);
    if (a->dictionary)
        expect_same_field(a->dictionary, b->dictionary);
}

static void expect_same_array(const struct manifest_field *f, const struct manifest_array *a, const struct manifest_array *b)
{
    cr_expect_eq(a->length, b->length);
    cr_expect_eq(a->null_count, b->null_count);
    cr_expect_eq(a->offset, b->offset);
    for (unsigned i = 0; i < f->type.n_buffers; i++) {
        cr_expect_eq(a->buffers[i].off, b->buffers[i].off);
        cr_expect_eq(a->buffers[i].len, b->buffers[i].len);
    }
    for (uint32_t i = 0; i < f->n_children; i++)
        expect_same_array(f->children[i], a->children[i], b->children[i]);
    if (f->dictionary)
        expect_same_array(f->dictionary, a->dictionary, b->dictionary);
}

Test(manifest, round_trips_nested_types_dictionaries_and_batches)
{
    struct manifest *m = sample(), *back;
    uint8_t *bytes;
    size_t len;
    cr_assert_eq(manifest_encode(m, &bytes, &len), 0);
    cr_assert_eq(manifest_decode(bytes, len, &back, err), 0, "%s", err);
    cr_assert_eq(back->n_columns, m->n_columns);
    cr_assert_eq(back->n_batches, 2);
    cr_expect_eq(back->metadata_len, m->metadata_len);
    for (uint32_t i = 0; i < m->n_columns; i++)
        expect_same_field(m->columns[i], back->columns[i]);
    for (uint32_t b = 0; b < 2; b++) {
        cr_expect_eq(back->batches[b].length, m->batches[b].length);
        for (uint32_t i = 0; i < m->n_columns; i++)
            expect_same_array(m->columns[i], m->batches[b].columns[i], back->batches[b].columns[i]);
    }
    /* inline envelope, and manifest_at */
    uint8_t *env;
    size_t elen;
    struct manifest *in;
    uint64_t at, n;
    cr_assert_eq(manifest_envelope_inline(bytes, len, &env, &elen), 0);
    cr_assert_eq(manifest_envelope_decode(env, elen, &in, &at, &n, err), 0, "%s", err);
    cr_assert_not_null(in);
    cr_expect_eq(in->n_columns, 6);
    manifest_free(in);
    free(env);
    cr_assert_eq(manifest_envelope_at(4096, len, &env, &elen), 0);
    cr_assert_eq(manifest_envelope_decode(env, elen, &in, &at, &n, err), 0, "%s", err);
    cr_expect_null(in);
    cr_expect_eq(at, 4096);
    cr_expect_eq(n, len);
    free(env);
    /* every cut of the bytes is refused, never a crash */
    for (size_t cut = 0; cut < len; cut++) {
        struct manifest *x = NULL;
        cr_assert_eq(manifest_decode(bytes, cut, &x, err), -EBADMSG, "cut at %zu", cut);
        cr_assert_null(x);
    }
    free(bytes);
    manifest_free(back);
    manifest_free(m);
}

/* hand-packed manifests */
struct pk {
    msgpack_sbuffer sb;
    msgpack_packer p;
};

static void pk_init(struct pk *k)
{
    msgpack_sbuffer_init(&k->sb);
    msgpack_packer_init(&k->p, &k->sb, msgpack_sbuffer_write);
}

static void pk_str(struct pk *k, const char *s)
{
    msgpack_pack_str(&k->p, strlen(s));
    msgpack_pack_str_body(&k->p, s, strlen(s));
}

/* top: {"v": v, "columns": ncol, "fields": [nf nodes follow], "batches": ...}: the
 * caller packs the fields' nodes, then calls pk_batches and packs the batches. */
static void pk_top(struct pk *k, unsigned v, unsigned ncol, unsigned nfields)
{
    msgpack_pack_map(&k->p, 4);
    pk_str(k, "v");
    msgpack_pack_uint32(&k->p, v);
    pk_str(k, "columns");
    msgpack_pack_uint32(&k->p, ncol);
    pk_str(k, "fields");
    msgpack_pack_array(&k->p, nfields);
}

static void pk_field(struct pk *k, const char *name, const char *format, unsigned nch, bool dict)
{
    msgpack_pack_array(&k->p, 6);
    pk_str(k, name);
    pk_str(k, format);
    msgpack_pack_uint32(&k->p, 2);
    msgpack_pack_uint32(&k->p, nch);
    if (dict) msgpack_pack_true(&k->p); else msgpack_pack_false(&k->p);
    msgpack_pack_nil(&k->p);
}

static int decode_pk(struct pk *k)
{
    struct manifest *m = NULL;
    int r = manifest_decode((const uint8_t *)k->sb.data, k->sb.size, &m, err);
    manifest_free(m);
    msgpack_sbuffer_destroy(&k->sb);
    return r;
}

Test(manifest, refuses_malformed_manifests_naming_the_field)
{
    struct pk k;
    /* version */
    pk_init(&k);
    pk_top(&k, 2, 0, 0);
    pk_str(&k, "batches");
    msgpack_pack_array(&k.p, 0);
    cr_expect_eq(decode_pk(&k), -EBADMSG);
    cr_expect(strstr(err, "version 2"), "%s", err);
    /* a buffer too few for the format */
    pk_init(&k);
    pk_top(&k, 1, 1, 1);
    pk_field(&k, "a", "u", 0, false);
    pk_str(&k, "batches");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 7);
    for (int i = 0; i < 7; i++)
        msgpack_pack_uint32(&k.p, 0);
    cr_expect_eq(decode_pk(&k), -EBADMSG);
    cr_expect(strstr(err, "2 buffers, format \"u\" has 3"), "%s", err);
    /* n_children beyond the nodes */
    pk_init(&k);
    pk_top(&k, 1, 1, 1);
    pk_field(&k, "s", "+s", 1000000, false);
    pk_str(&k, "batches");
    msgpack_pack_array(&k.p, 0);
    cr_expect_eq(decode_pk(&k), -EBADMSG);
    cr_expect(strstr(err, "n_children"), "%s", err);
    /* a list without its child */
    pk_init(&k);
    pk_top(&k, 1, 1, 2);
    pk_field(&k, "l", "+l", 0, false);
    pk_field(&k, "x", "i", 0, false);
    pk_str(&k, "batches");
    msgpack_pack_array(&k.p, 0);
    cr_expect_eq(decode_pk(&k), -EBADMSG);
    cr_expect(strstr(err, "needs 1 child"), "%s", err);
    /* dictionary of a non-integer index */
    pk_init(&k);
    pk_top(&k, 1, 1, 2);
    pk_field(&k, "d", "g", 0, true);
    pk_field(&k, "", "u", 0, false);
    pk_str(&k, "batches");
    msgpack_pack_array(&k.p, 0);
    cr_expect_eq(decode_pk(&k), -EBADMSG);
    cr_expect(strstr(err, "not an integer type"), "%s", err);
    /* unsupported format */
    pk_init(&k);
    pk_top(&k, 1, 1, 1);
    pk_field(&k, "u", "+ud:0,1", 0, false);
    pk_str(&k, "batches");
    msgpack_pack_array(&k.p, 0);
    cr_expect_eq(decode_pk(&k), -EBADMSG);
    cr_expect(strstr(err, "unsupported or malformed format \"+ud:0,1\""), "%s", err);
    /* types nested deeper than the limit: a chain of structs */
    pk_init(&k);
    pk_top(&k, 1, 1, MANIFEST_MAX_DEPTH + 1);
    for (int i = 0; i < MANIFEST_MAX_DEPTH; i++)
        pk_field(&k, "s", "+s", 1, false);
    pk_field(&k, "x", "i", 0, false);
    pk_str(&k, "batches");
    msgpack_pack_array(&k.p, 0);
    cr_expect_eq(decode_pk(&k), -EBADMSG);
    cr_expect(strstr(err, "deeper"), "%s", err);
    /* null_count above length */
    pk_init(&k);
    pk_top(&k, 1, 1, 1);
    pk_field(&k, "a", "i", 0, false);
    pk_str(&k, "batches");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 7);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_uint32(&k.p, 2);
    for (int i = 0; i < 5; i++)
        msgpack_pack_uint32(&k.p, 0);
    cr_expect_eq(decode_pk(&k), -EBADMSG);
    cr_expect(strstr(err, "null_count"), "%s", err);
    /* the raw-bytes check: a count that lies */
    static const uint8_t lie[] = { 0xdd, 0x7f, 0xff, 0xff, 0xff };
    struct manifest *m = NULL;
    cr_expect_eq(manifest_decode(lie, sizeof(lie), &m, err), -EBADMSG);
    cr_expect(strstr(err, "element count exceeds"), "%s", err);
    /* not a unit envelope */
    static const uint8_t array_env[] = { 0x82, 0xa6, 's', 'h', 'm', 'r', 'e', 'f', 0x01, 0xa4, 'k', 'i', 'n', 'd',
                                         0xa5, 'a', 'r', 'r', 'a', 'y' };
    uint64_t at, n;
    cr_expect_eq(manifest_envelope_decode(array_env, sizeof(array_env), &m, &at, &n, err), -EBADMSG);
    cr_expect(strstr(err, "\"kind\" is not \"unit\""), "%s", err);
}

static double secs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

Test(manifest, scales_to_10000_columns)
{
    enum { N = 10000, ROWS = 1000 };
    struct manifest *m = manifest_new(), *back;
    m->n_columns = N;
    m->columns = manifest_alloc(m, N * sizeof(*m->columns));
    struct manifest_batch *mb = manifest_add_batch(m, ROWS);
    uint64_t off = 0;
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof(name), "col%d", i);
        m->columns[i] = fld(m, name, i % 2 ? "g" : "u", 0);
        struct manifest_array *a = mb->columns[i] = arr(m, ROWS, i % 3 ? 0 : 7, 0, 0);
        if (i % 3 == 0) {
            buf(a, 0, off, 128);
            off += 128;
        }
        buf(a, 1, off, 8 * ROWS);
        off += 8 * ROWS;
        if (i % 2 == 0) {
            buf(a, 2, off, 4 * ROWS);
            off += 4 * ROWS;
        }
    }
    uint8_t *bytes;
    size_t len;
    double t0 = secs();
    cr_assert_eq(manifest_encode(m, &bytes, &len), 0);
    double t1 = secs();
    cr_assert_eq(manifest_decode(bytes, len, &back, err), 0, "%s", err);
    double t2 = secs();
    cr_assert_eq(back->n_columns, N);
    cr_expect_str_eq(back->columns[9999]->name, "col9999");
    fprintf(stderr, "manifest of %d columns: %zu bytes (%.1f per column), encode %.2f ms, decode %.2f ms\n",
            N, len, (double)len / N, (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    cr_expect_gt(len, 16384, "10,000 columns do not fit in the metadata: manifest_at is needed");
    cr_expect_lt(len, 40 * N, "about 30 bytes per column");
    cr_expect_lt(t2 - t0, 2.0, "encode + decode of 10,000 columns took %.3f s", t2 - t0);
    free(bytes);
    manifest_free(back);
    manifest_free(m);
}

/* ---- validation against a buffer ---- */

static _Alignas(64) uint8_t mem[8192];

struct single {
    struct manifest *m;
    struct manifest_field *f;
    struct manifest_array *a;
};

static struct single single(const char *format, int64_t len)
{
    struct single s;
    s.m = manifest_new();
    s.f = fld(s.m, "c", format, 0);
    s.m->n_columns = 1;
    s.m->columns = manifest_alloc(s.m, sizeof(*s.m->columns));
    s.m->columns[0] = s.f;
    struct manifest_batch *mb = manifest_add_batch(s.m, len);
    s.a = mb->columns[0] = arr(s.m, len, 0, 0, 0);
    return s;
}

static void put32(size_t at, const int32_t *v, size_t n)
{
    memcpy(mem + at, v, n * 4);
}

static int validate(struct manifest *m)
{
    return manifest_validate(m, mem, sizeof(mem), err);
}

#define EXPECT_REFUSED(m, text) do { \
        cr_expect_eq(validate(m), -EBADMSG, "accepted; wanted: %s", text); \
        cr_expect(strstr(err, text), "message \"%s\" lacks \"%s\"", err, text); \
    } while (0)

Test(manifest, validate_accepts_a_good_unit)
{
    struct single s = single("u", 4);
    static const int32_t offs[] = { 0, 1, 3, 3, 6 };
    put32(64, offs, 5);
    buf(s.a, 0, 0, 1);
    s.a->null_count = 1;
    mem[0] = 0x0b; /* slot 2 null */
    buf(s.a, 1, 64, sizeof(offs));
    buf(s.a, 2, 128, 6);
    cr_expect_eq(validate(s.m), 0, "%s", err);
    manifest_free(s.m);
}

Test(manifest, validate_refuses_buffer_ranges)
{
    struct single s = single("g", 10);
    buf(s.a, 1, 8192 - 64, 80);
    EXPECT_REFUSED(s.m, "batch 0 col0 (\"c\", format \"g\"): data buffer [8128, +80) lies outside the 8192 published bytes");
    buf(s.a, 1, UINT64_MAX - 10, 80);
    EXPECT_REFUSED(s.m, "lies outside");
    buf(s.a, 1, 32, 80);
    EXPECT_REFUSED(s.m, "data buffer offset 32 is not a multiple of 64");
    buf(s.a, 1, 64, 72);
    EXPECT_REFUSED(s.m, "data buffer holds 72 bytes, offset + length need 80");
    s.a->offset = 1;
    buf(s.a, 1, 64, 80);
    EXPECT_REFUSED(s.m, "holds 80 bytes, offset + length need 88");
    manifest_free(s.m);
}

Test(manifest, validate_refuses_validity_bitmaps)
{
    struct single s = single("i", 100);
    buf(s.a, 1, 64, 400);
    s.a->null_count = 3;
    EXPECT_REFUSED(s.m, "null_count 3 without a validity bitmap");
    buf(s.a, 0, 512, 12);
    EXPECT_REFUSED(s.m, "validity bitmap holds 12 bytes, offset + length need 13");
    buf(s.a, 0, 512, 13);
    cr_expect_eq(validate(s.m), 0, "%s", err);
    struct single b = single("b", 100);
    buf(b.a, 1, 64, 12);
    EXPECT_REFUSED(b.m, "data bitmap holds 12 bytes");
    manifest_free(b.m);
    manifest_free(s.m);
}

Test(manifest, validate_refuses_bad_offsets)
{
    struct single s = single("u", 3);
    buf(s.a, 2, 256, 10);
    static const int32_t neg[] = { -1, 2, 4, 6 }, down[] = { 0, 5, 4, 6 }, over[] = { 0, 2, 4, 11 };
    buf(s.a, 1, 64, 12);
    EXPECT_REFUSED(s.m, "offsets buffer holds 12 bytes, offset + length need 16");
    buf(s.a, 1, 64, 16);
    put32(64, neg, 4);
    EXPECT_REFUSED(s.m, "offsets buffer: first value -1 (at index 0) is negative");
    put32(64, down, 4);
    EXPECT_REFUSED(s.m, "offsets buffer: value 4 at index 2 is below the previous 5 (not monotonic)");
    put32(64, over, 4);
    EXPECT_REFUSED(s.m, "offsets buffer: last value 11 exceeds the data buffer's length (10)");
    /* only the slots in use are checked: a slice past a bad prefix is fine */
    s.a->offset = 1;
    s.a->length = 2;
    s.m->batches[0].length = 0;
    static const int32_t sliced[] = { 99, 2, 4, 6 };
    put32(64, sliced, 4);
    cr_expect_eq(validate(s.m), 0, "%s", err);
    s.a->length = 0;
    s.a->offset = 5;
    buf(s.a, 1, 0, 0);
    EXPECT_REFUSED(s.m, "offsets buffer is empty and offset 5 is not 0");
    /* large offsets */
    struct single l = single("U", 2);
    static const int64_t big[] = { 0, 4, INT64_C(1) << 40 };
    memcpy(mem + 1024, big, sizeof(big));
    buf(l.a, 1, 1024, sizeof(big));
    buf(l.a, 2, 2048, 100);
    EXPECT_REFUSED(l.m, "last value 1099511627776 exceeds the data buffer's length (100)");
    manifest_free(l.m);
    manifest_free(s.m);
}

Test(manifest, validate_refuses_short_children)
{
    struct manifest *m = manifest_new();
    /* struct: children must cover offset + length */
    struct manifest_field *sf = fld(m, "s", "+s", 2, fld(m, "a", "i", 0), fld(m, "b", "i", 0));
    m->n_columns = 1;
    m->columns = manifest_alloc(m, sizeof(*m->columns));
    m->columns[0] = sf;
    struct manifest_batch *mb = manifest_add_batch(m, 4);
    struct manifest_array *sa = mb->columns[0] = arr(m, 4, 0, 1, 2);
    sa->children[0] = arr(m, 5, 0, 0, 0);
    buf(sa->children[0], 1, 0, 20);
    sa->children[1] = arr(m, 4, 0, 0, 0);
    buf(sa->children[1], 1, 64, 16);
    EXPECT_REFUSED(m, "batch 0 col0 (\"s\", format \"+s\"): child 1's length 4 is below offset + length (5)");
    sa->children[1]->length = 5;
    buf(sa->children[1], 1, 64, 20);
    cr_expect_eq(validate(m), 0, "%s", err);
    /* the child's own buffers are checked under its path */
    buf(sa->children[1], 1, 64, 16);
    EXPECT_REFUSED(m, "batch 0 col0.child1 (\"b\", format \"i\"): data buffer holds 16 bytes");
    manifest_free(m);
}

Test(manifest, validate_refuses_lists_beyond_their_child)
{
    struct manifest *m = manifest_new();
    struct manifest_field *lf = fld(m, "l", "+l", 1, fld(m, "item", "s", 0));
    m->n_columns = 1;
    m->columns = manifest_alloc(m, sizeof(*m->columns));
    m->columns[0] = lf;
    struct manifest_batch *mb = manifest_add_batch(m, 3);
    struct manifest_array *la = mb->columns[0] = arr(m, 3, 0, 0, 1);
    static const int32_t offs[] = { 0, 2, 2, 7 };
    put32(0, offs, 4);
    buf(la, 1, 0, 16);
    la->children[0] = arr(m, 6, 0, 0, 0);
    buf(la->children[0], 1, 64, 12);
    EXPECT_REFUSED(m, "offsets buffer: last value 7 exceeds the child's length (6)");
    la->children[0]->length = 7;
    EXPECT_REFUSED(m, "col0.child0 (\"item\", format \"s\"): data buffer holds 12 bytes, offset + length need 14");
    buf(la->children[0], 1, 64, 14);
    cr_expect_eq(validate(m), 0, "%s", err);
    manifest_free(m);

    /* fixed-size list: child of (offset + length) * N */
    m = manifest_new();
    struct manifest_field *ff = fld(m, "v", "+w:3", 1, fld(m, "x", "f", 0));
    m->n_columns = 1;
    m->columns = manifest_alloc(m, sizeof(*m->columns));
    m->columns[0] = ff;
    mb = manifest_add_batch(m, 4);
    struct manifest_array *fa = mb->columns[0] = arr(m, 4, 0, 0, 1);
    fa->children[0] = arr(m, 11, 0, 0, 0);
    buf(fa->children[0], 1, 0, 44);
    EXPECT_REFUSED(m, "child length 11 is below (offset + length) * 3");
    manifest_free(m);
}

Test(manifest, validate_refuses_dictionary_indices_out_of_range)
{
    struct manifest *m = manifest_new();
    struct manifest_field *df = fld(m, "city", "c", 0);
    df->dictionary = fld(m, "", "u", 0);
    m->n_columns = 1;
    m->columns = manifest_alloc(m, sizeof(*m->columns));
    m->columns[0] = df;
    struct manifest_batch *mb = manifest_add_batch(m, 4);
    struct manifest_array *da = mb->columns[0] = arr(m, 4, 1, 0, 0);
    static const int8_t idx[] = { 0, 1, 100, 2 };
    memcpy(mem + 0, idx, 4);
    buf(da, 1, 0, 4);
    mem[64] = 0x0b; /* slot 2 null: its index is not looked at */
    buf(da, 0, 64, 1);
    da->dictionary = arr(m, 3, 0, 0, 0);
    static const int32_t offs[] = { 0, 5, 10, 15 };
    put32(128, offs, 4);
    buf(da->dictionary, 1, 128, 16);
    buf(da->dictionary, 2, 192, 15);
    cr_expect_eq(validate(m), 0, "%s", err);
    mem[64] = 0x0f;
    da->null_count = 0;
    EXPECT_REFUSED(m, "dictionary index 100 at slot 2 is outside the dictionary's 3 values");
    static const int8_t negative[] = { 0, -1, 1, 2 };
    memcpy(mem + 0, negative, 4);
    EXPECT_REFUSED(m, "dictionary index -1 at slot 1");
    memcpy(mem + 0, idx, 4);
    mem[64] = 0x0b;
    da->null_count = 1;
    buf(da->dictionary, 2, 192, 14);
    EXPECT_REFUSED(m, "col0.dictionary (\"\", format \"u\"): offsets buffer: last value 15 exceeds the data buffer's length (14)");
    manifest_free(m);
}

Test(manifest, validate_refuses_columns_shorter_than_the_batch)
{
    struct single s = single("C", 10);
    buf(s.a, 1, 0, 10);
    s.m->batches[0].length = 11;
    EXPECT_REFUSED(s.m, "length 10 is below the batch's 11");
    manifest_free(s.m);
}
