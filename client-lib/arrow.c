/* SPDX-License-Identifier: MIT */
/* arrow.c: the Arrow C Data Interface both ways, without an Arrow library.
 * Export: ArrowSchema / ArrowArray / ArrowArrayStream over an acquired unit, buffers
 * pointing into the read-only mapping; every exported array node (and stream) holds a
 * reference on the unit's holder, dropped by its release callback; schemas copy their
 * strings and hold nothing. Import: any producer's arrays copied once into a unit,
 * slices copied as the slice only (offsets rebased, bitmaps kept at their bit offset),
 * with the manifest built; buffers already inside the unit's claimed ranges are
 * referenced in place. */
#include "unit.h"

#include "session.h"
#include "transport.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmref/shmref.h"

#define ALIGN_UP(x) (((x) + (SHMREF_UNIT_ALIGN - 1)) & ~(size_t)(SHMREF_UNIT_ALIGN - 1))

/* What an empty (zero-length) buffer points at: never NULL, reads as zero offsets. */
static const _Alignas(64) int64_t empty_buffer[8];

/* ---- export: schemas ---- */

struct schema_priv {
    struct ArrowSchema **child_ptrs;
    struct ArrowSchema *children, *dict;
};

static void release_schema(struct ArrowSchema *s)
{
    struct schema_priv *p = s->private_data;
    for (int64_t i = 0; i < s->n_children; i++)
        if (p->children[i].release)
            p->children[i].release(&p->children[i]);
    if (p->dict && p->dict->release)
        p->dict->release(p->dict);
    free(p);
    s->release = NULL;
}

static size_t metadata_len(const char *md)
{
    if (!md)
        return 0;
    int32_t n, k;
    size_t pos = 4;
    memcpy(&n, md, 4);
    for (int32_t i = 0; i < 2 * n; i++) {
        memcpy(&k, md + pos, 4);
        pos += 4 + (size_t)(k > 0 ? k : 0);
    }
    return pos;
}

/* schema_node: one ArrowSchema with its children and dictionary; everything in one
 * allocation (strings included). */
static int schema_node(const char *format, const char *name, const uint8_t *md, uint32_t mdl, int64_t flags,
                       uint32_t nch, struct manifest_field *const *children, const struct manifest_field *dict,
                       struct ArrowSchema *out);

static int schema_of(const struct manifest_field *f, struct ArrowSchema *out)
{
    return schema_node(f->format, f->name, f->metadata, f->metadata_len, f->flags, f->n_children, f->children,
                       f->dictionary, out);
}

static int schema_node(const char *format, const char *name, const uint8_t *md, uint32_t mdl, int64_t flags,
                       uint32_t nch, struct manifest_field *const *children, const struct manifest_field *dict,
                       struct ArrowSchema *out)
{
    size_t fl = strlen(format) + 1, nl = strlen(name) + 1;
    size_t size = sizeof(struct schema_priv) + nch * (sizeof(struct ArrowSchema *) + sizeof(struct ArrowSchema)) +
                  (dict ? sizeof(struct ArrowSchema) : 0) + fl + nl + mdl;
    struct schema_priv *p = calloc(1, size);
    if (!p)
        return -ENOMEM;
    char *at = (char *)(p + 1);
    p->child_ptrs = (struct ArrowSchema **)at;
    at += nch * sizeof(struct ArrowSchema *);
    p->children = (struct ArrowSchema *)at;
    at += nch * sizeof(struct ArrowSchema);
    if (dict) {
        p->dict = (struct ArrowSchema *)at;
        at += sizeof(struct ArrowSchema);
    }
    char *fmt = memcpy(at, format, fl);
    char *nm = memcpy(at + fl, name, nl);
    char *meta = md ? memcpy(at + fl + nl, md, mdl) : NULL;
    *out = (struct ArrowSchema){ .format = fmt, .name = nm, .metadata = meta, .flags = flags,
                                 .n_children = nch, .children = nch ? p->child_ptrs : NULL,
                                 .dictionary = p->dict, .release = release_schema, .private_data = p };
    int r = 0;
    for (uint32_t i = 0; i < nch && r == 0; i++) {
        p->child_ptrs[i] = &p->children[i];
        r = schema_of(children[i], &p->children[i]);
    }
    if (r == 0 && dict)
        r = schema_of(dict, p->dict);
    if (r < 0)
        release_schema(out);
    return r;
}

static int batch_schema(const struct manifest *m, struct ArrowSchema *out)
{
    return schema_node("+s", "", m->metadata, m->metadata_len, 0, m->n_columns, m->columns, NULL, out);
}

/* ---- export: arrays ---- */

struct array_priv {
    struct unit_holder *h;
    const void *bufs[MANIFEST_MAX_BUFFERS];
    struct ArrowArray **child_ptrs;
    struct ArrowArray *children, *dict;
};

static void release_array(struct ArrowArray *a)
{
    struct array_priv *p = a->private_data;
    for (int64_t i = 0; i < a->n_children; i++)
        if (p->children[i].release)
            p->children[i].release(&p->children[i]);
    if (p->dict && p->dict->release)
        p->dict->release(p->dict);
    struct unit_holder *h = p->h;
    free(p);
    a->release = NULL;
    unit_holder_unref(h);
}

static int array_of(struct unit_holder *h, const struct manifest_field *f, const struct manifest_array *a,
                    struct ArrowArray *out);

/* array_node: one ArrowArray holding one reference on h; children and dictionary are
 * nodes of their own (a consumer may move them out and release them separately). */
static int array_node(struct unit_holder *h, int64_t length, int64_t nulls, int64_t offset, unsigned nb,
                      const void *const *bufs, uint32_t nch, struct manifest_field *const *cf,
                      struct manifest_array *const *ca, const struct manifest_field *df,
                      const struct manifest_array *da, struct ArrowArray *out)
{
    size_t size = sizeof(struct array_priv) + nch * (sizeof(struct ArrowArray *) + sizeof(struct ArrowArray)) +
                  (df ? sizeof(struct ArrowArray) : 0);
    struct array_priv *p = calloc(1, size);
    if (!p)
        return -ENOMEM;
    char *at = (char *)(p + 1);
    p->child_ptrs = (struct ArrowArray **)at;
    at += nch * sizeof(struct ArrowArray *);
    p->children = (struct ArrowArray *)at;
    at += nch * sizeof(struct ArrowArray);
    if (df)
        p->dict = (struct ArrowArray *)at;
    p->h = h;
    unit_holder_ref(h);
    memcpy(p->bufs, bufs, nb * sizeof(*bufs));
    *out = (struct ArrowArray){ .length = length, .null_count = nulls, .offset = offset, .n_buffers = nb,
                                .n_children = nch, .buffers = nb ? p->bufs : NULL,
                                .children = nch ? p->child_ptrs : NULL, .dictionary = p->dict,
                                .release = release_array, .private_data = p };
    int r = 0;
    for (uint32_t i = 0; i < nch && r == 0; i++) {
        p->child_ptrs[i] = &p->children[i];
        r = array_of(h, cf[i], ca[i], &p->children[i]);
    }
    if (r == 0 && df)
        r = array_of(h, df, da, p->dict);
    if (r < 0)
        release_array(out);
    return r;
}

static int array_of(struct unit_holder *h, const struct manifest_field *f, const struct manifest_array *a,
                    struct ArrowArray *out)
{
    const void *bufs[MANIFEST_MAX_BUFFERS];
    unsigned nb = f->type.n_buffers;
    for (unsigned i = 0; i < nb; i++) {
        const struct manifest_range *r = &a->buffers[i];
        if (r->len)
            bufs[i] = h->base + r->off;
        else
            bufs[i] = i == 0 ? NULL : (const void *)empty_buffer;
    }
    return array_node(h, a->length, a->null_count, a->offset, nb, bufs, f->n_children, f->children, a->children,
                      f->dictionary, a->dictionary, out);
}

static int batch_array(struct unit_holder *h, uint32_t b, struct ArrowArray *out)
{
    const struct manifest *m = h->m;
    const void *validity = NULL;
    return array_node(h, m->batches[b].length, 0, 0, 1, &validity, m->n_columns, m->columns,
                      m->batches[b].columns, NULL, NULL, out);
}

static int check_export(shmref_unit *u, int batch, int column)
{
    if (!u)
        return -EINVAL;
    if (u->producer)
        return client_fail(u->conn, -EINVAL, "export: only an acquired unit can be exported");
    if (batch < 0 || (uint32_t)batch >= u->h->m->n_batches)
        return client_fail(u->conn, -EINVAL, "export: batch %d of %u", batch, u->h->m->n_batches);
    if (column != -1 && (column < 0 || (uint32_t)column >= u->h->m->n_columns))
        return client_fail(u->conn, -EINVAL, "export: column %d of %u", column, u->h->m->n_columns);
    return 0;
}

int shmref_unit_export_array(shmref_unit *u, int batch, int column, struct ArrowSchema *ret_schema,
                             struct ArrowArray *ret_array)
{
    int r = check_export(u, batch, column < 0 ? -2 : column);
    if (r < 0)
        return r;
    const struct manifest *m = u->h->m;
    struct ArrowSchema s;
    if (ret_schema && (r = schema_of(m->columns[column], &s)) < 0)
        return client_fail(u->conn, r, "out of memory");
    if (ret_array && (r = array_of(u->h, m->columns[column], m->batches[batch].columns[column], ret_array)) < 0) {
        if (ret_schema)
            s.release(&s);
        return client_fail(u->conn, r, "out of memory");
    }
    if (ret_schema)
        *ret_schema = s;
    return 0;
}

int shmref_unit_export_batch(shmref_unit *u, int batch, struct ArrowSchema *ret_schema, struct ArrowArray *ret_array)
{
    int r = check_export(u, batch, -1);
    if (r < 0)
        return r;
    struct ArrowSchema s;
    if (ret_schema && (r = batch_schema(u->h->m, &s)) < 0)
        return client_fail(u->conn, r, "out of memory");
    if (ret_array && (r = batch_array(u->h, (uint32_t)batch, ret_array)) < 0) {
        if (ret_schema)
            s.release(&s);
        return client_fail(u->conn, r, "out of memory");
    }
    if (ret_schema)
        *ret_schema = s;
    return 0;
}

/* ---- export: the stream ---- */

struct stream_priv {
    struct unit_holder *h;
    uint32_t next;
    char err[64];
};

static int stream_get_schema(struct ArrowArrayStream *st, struct ArrowSchema *out)
{
    struct stream_priv *p = st->private_data;
    int r = batch_schema(p->h->m, out);
    if (r < 0)
        snprintf(p->err, sizeof(p->err), "out of memory");
    return -r;
}

static int stream_get_next(struct ArrowArrayStream *st, struct ArrowArray *out)
{
    struct stream_priv *p = st->private_data;
    if (p->next >= p->h->m->n_batches) {
        memset(out, 0, sizeof(*out)); /* the end: a released array */
        return 0;
    }
    int r = batch_array(p->h, p->next, out);
    if (r < 0) {
        snprintf(p->err, sizeof(p->err), "out of memory");
        return -r;
    }
    p->next++;
    return 0;
}

static const char *stream_last_error(struct ArrowArrayStream *st)
{
    struct stream_priv *p = st->private_data;
    return p->err[0] ? p->err : NULL;
}

static void stream_release(struct ArrowArrayStream *st)
{
    struct stream_priv *p = st->private_data;
    struct unit_holder *h = p->h;
    free(p);
    st->release = NULL;
    unit_holder_unref(h);
}

int shmref_unit_export_stream(shmref_unit *u, struct ArrowArrayStream *ret_stream)
{
    if (!u)
        return -EINVAL;
    if (u->producer)
        return client_fail(u->conn, -EINVAL, "export: only an acquired unit can be exported");
    if (!ret_stream)
        return client_fail(u->conn, -EINVAL, "export_stream: ret_stream is NULL");
    struct stream_priv *p = calloc(1, sizeof(*p));
    if (!p)
        return client_fail(u->conn, -ENOMEM, "out of memory");
    p->h = u->h;
    unit_holder_ref(u->h);
    *ret_stream = (struct ArrowArrayStream){ .get_schema = stream_get_schema, .get_next = stream_get_next,
                                             .get_last_error = stream_last_error, .release = stream_release,
                                             .private_data = p };
    return 0;
}

/* ---- import ---- */

/* An emitter walks producer arrays. Dry (u NULL): adds up the bytes a copy needs and a
 * bound on the manifest's size. Real: claims ranges in u and copies (or references
 * buffers already in u's claimed ranges), building fields and arrays in u's arena. */
struct emit {
    shmref_unit *u;
    struct manifest *m;       /* arena for fields and arrays */
    size_t need, mbound;
    int code;
    char err[200];
};

static int efail(struct emit *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int efail(struct emit *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, sizeof(e->err), fmt, ap);
    va_end(ap);
    e->code = code;
    return code;
}

static int emit_field(struct emit *e, const struct ArrowSchema *s, unsigned depth, struct manifest_field **ret)
{
    if (!s || !s->format || !s->release)
        return efail(e, -EINVAL, "a schema is NULL, released or has no format");
    if (depth > MANIFEST_MAX_DEPTH)
        return efail(e, -EINVAL, "types nested deeper than %d", MANIFEST_MAX_DEPTH);
    const char *name = s->name ? s->name : "";
    struct manifest_field *f = manifest_alloc(e->m, sizeof(*f));
    if (!f)
        return efail(e, -ENOMEM, "out of memory");
    if (manifest_type_parse(s->format, &f->type) < 0)
        return efail(e, -ENOTSUP, "field \"%s\": format \"%s\" is not supported", name, s->format);
    size_t mdl = metadata_len(s->metadata);
    if (!(f->name = manifest_strndup(e->m, name, strlen(name))) ||
        !(f->format = manifest_strndup(e->m, s->format, strlen(s->format))) ||
        (s->metadata && !(f->metadata = (const uint8_t *)manifest_strndup(e->m, s->metadata, mdl))))
        return efail(e, -ENOMEM, "out of memory");
    f->metadata_len = (uint32_t)mdl;
    f->flags = s->flags & 7;
    const struct manifest_type *t = &f->type;
    bool one = t->layout == MANIFEST_LIST || t->layout == MANIFEST_LARGE_LIST || t->layout == MANIFEST_FIXED_LIST;
    if (s->n_children < 0 || (one && s->n_children != 1) ||
        (!one && t->layout != MANIFEST_STRUCT && s->n_children != 0) || (s->n_children && !s->children))
        return efail(e, -EINVAL, "field \"%s\": format \"%s\" with %lld children", name, s->format, (long long)s->n_children);
    if (s->dictionary && !t->integer)
        return efail(e, -EINVAL, "field \"%s\": dictionary indices of format \"%s\"", name, s->format);
    f->n_children = (uint32_t)s->n_children;
    if (f->n_children && !(f->children = manifest_alloc(e->m, f->n_children * sizeof(*f->children))))
        return efail(e, -ENOMEM, "out of memory");
    int r;
    for (uint32_t i = 0; i < f->n_children; i++)
        if ((r = emit_field(e, s->children[i], depth + 1, &f->children[i])) < 0)
            return r;
    if (t->map && (f->children[0]->type.layout != MANIFEST_STRUCT || f->children[0]->n_children != 2))
        return efail(e, -EINVAL, "field \"%s\": a map's child must be a struct of 2 fields", name);
    if (s->dictionary && (r = emit_field(e, s->dictionary, depth + 1, &f->dictionary)) < 0)
        return r;
    e->mbound += 48 + strlen(name) + strlen(s->format) + mdl;
    *ret = f;
    return 0;
}

static bool bit(const uint8_t *p, int64_t i)
{
    return p[i / 8] >> (i % 8) & 1;
}

static int64_t count_nulls(const uint8_t *v, int64_t start, int64_t len)
{
    int64_t set = 0, i = start, end = start + len;
    for (; i < end && i % 8; i++)
        set += bit(v, i);
    for (; i + 64 <= end; i += 64) {
        uint64_t w;
        memcpy(&w, v + i / 8, 8);
        set += __builtin_popcountll(w);
    }
    for (; i < end; i++)
        set += bit(v, i);
    return len - set;
}

static int64_t rd_off(const void *p, unsigned w, int64_t i)
{
    if (w == 4) {
        int32_t x;
        memcpy(&x, (const uint8_t *)p + i * 4, 4);
        return x;
    }
    int64_t x;
    memcpy(&x, (const uint8_t *)p + i * 8, 8);
    return x;
}

/* inside: whether [p, p + n) lies in u's claimed ranges at an aligned offset. */
static bool inside(const shmref_unit *u, const void *p, size_t n)
{
    const uint8_t *b = p;
    return u && u->base && b >= u->base && b <= u->base + u->used && n <= (size_t)(u->base + u->used - b) &&
           (size_t)(b - u->base) % SHMREF_UNIT_ALIGN == 0;
}

/* A source range of one buffer of a node: bytes from src, offsets rebased by base. */
struct piece {
    const uint8_t *src;
    size_t len;
    unsigned rebase_w;        /* 4 or 8: an offsets buffer to rebase by base; 0: plain */
    int64_t base;
};

static int put(struct emit *e, const struct piece *pc, bool in_place, struct manifest_range *ret)
{
    if (pc->len == 0) {
        *ret = (struct manifest_range){ 0, 0 };
        return 0;
    }
    if (!e->u) {
        e->need += ALIGN_UP(pc->len);
        return 0;
    }
    if (in_place) {
        *ret = (struct manifest_range){ (uint64_t)(pc->src - e->u->base), pc->len };
        return 0;
    }
    uint64_t at;
    void *dst;
    int r = shmref_unit_claim(e->u, pc->len, &at, &dst);
    if (r < 0)
        return efail(e, r, "the unit is full (%zu bytes)", e->u->size);
    if (pc->rebase_w && pc->base) {
        size_t n = pc->len / pc->rebase_w;
        if (pc->rebase_w == 4) {
            int32_t *d = dst, b = (int32_t)pc->base;
            for (size_t i = 0; i < n; i++) {
                int32_t x;
                memcpy(&x, pc->src + i * 4, 4);
                d[i] = (int32_t)((uint32_t)x - (uint32_t)b);
            }
        } else {
            int64_t *d = dst;
            for (size_t i = 0; i < n; i++) {
                int64_t x;
                memcpy(&x, pc->src + i * 8, 8);
                d[i] = (int64_t)((uint64_t)x - (uint64_t)pc->base);
            }
        }
    } else {
        memcpy(dst, pc->src, pc->len);
    }
    *ret = (struct manifest_range){ at, pc->len };
    return 0;
}

struct window {
    int64_t o, S, N;          /* new offset; old physical start and count of the copy */
};

/* layout: the pieces of node a for window w, and its children's windows. */
struct plan {
    struct piece pc[MANIFEST_MAX_BUFFERS];
    int64_t child_start, child_len; /* lists, fixed-size lists: in the child's physical space */
};

static int plan_node(struct emit *e, const struct manifest_field *f, const struct ArrowArray *a,
                     struct window w, bool keep_validity, bool in_place, struct plan *pl)
{
    const struct manifest_type *t = &f->type;
    const uint8_t *const *b = (const uint8_t *const *)a->buffers;
    memset(pl, 0, sizeof(*pl));
    if (keep_validity)
        pl->pc[0] = (struct piece){ b[0] + w.S / 8, (size_t)((w.N + 7) / 8), 0, 0 };
    switch (t->layout) {
    case MANIFEST_BOOL:
        if (w.N)
            pl->pc[1] = (struct piece){ b[1] + w.S / 8, (size_t)((w.N + 7) / 8), 0, 0 };
        break;
    case MANIFEST_FIXED:
        if (w.N)
            pl->pc[1] = (struct piece){ b[1] + (size_t)w.S * t->width, (size_t)w.N * t->width, 0, 0 };
        break;
    case MANIFEST_BINARY: case MANIFEST_LARGE_BINARY:
    case MANIFEST_LIST: case MANIFEST_LARGE_LIST: {
        unsigned ow = t->layout == MANIFEST_BINARY || t->layout == MANIFEST_LIST ? 4 : 8;
        bool bin = t->layout == MANIFEST_BINARY || t->layout == MANIFEST_LARGE_BINARY;
        if (w.N == 0) {
            pl->child_start = 0;
            pl->child_len = 0;
            break;
        }
        int64_t first = rd_off(b[1], ow, w.S), last = rd_off(b[1], ow, w.S + w.N);
        if (first < 0 || last < first)
            return efail(e, -EINVAL, "field \"%s\": offsets %lld..%lld are not monotonic", f->name, (long long)first, (long long)last);
        int64_t base = in_place ? 0 : first;
        pl->pc[1] = (struct piece){ b[1] + (size_t)w.S * ow, (size_t)(w.N + 1) * ow, in_place ? 0 : ow, base };
        if (bin)
            pl->pc[2] = (struct piece){ b[2] + base, (size_t)(last - base), 0, 0 };
        pl->child_start = base;
        pl->child_len = last - base;
        break;
    }
    case MANIFEST_FIXED_LIST:
        pl->child_start = w.S * (int64_t)t->width;
        pl->child_len = w.N * (int64_t)t->width;
        break;
    default:
        break;
    }
    return 0;
}

static int emit_array(struct emit *e, const struct manifest_field *f, const struct ArrowArray *a,
                      int64_t start, int64_t len, struct manifest_array **ret)
{
    const struct manifest_type *t = &f->type;
    if (!a || !a->release)
        return efail(e, -EINVAL, "array \"%s\" is NULL or released", f->name);
    if (a->length < 0 || a->offset < 0 || a->n_children != (int64_t)f->n_children || !a->dictionary != !f->dictionary ||
        (a->n_buffers != (int64_t)t->n_buffers && !(t->layout == MANIFEST_NULL && a->n_buffers <= 1)) ||
        (t->n_buffers && !a->buffers) || (a->n_children && !a->children))
        return efail(e, -EINVAL, "array \"%s\" (format \"%s\"): %lld buffers, %lld children, dictionary %s do not match its type",
                      f->name, f->format, (long long)a->n_buffers, (long long)a->n_children, a->dictionary ? "yes" : "no");
    if (start < a->offset || len < 0 || start + len > a->offset + a->length)
        return efail(e, -EINVAL, "array \"%s\": elements [%lld, +%lld) are outside its offset %lld + length %lld",
                      f->name, (long long)start, (long long)len, (long long)a->offset, (long long)a->length);
    for (unsigned i = 1; i < t->n_buffers; i++)
        if (!a->buffers[i] && len > 0)
            return efail(e, -EINVAL, "array \"%s\": buffer %u is NULL", f->name, i);
    const uint8_t *validity = t->n_buffers ? a->buffers[0] : NULL;
    int64_t nulls;
    if (t->layout == MANIFEST_NULL)
        nulls = len;
    else if (!validity)
        nulls = 0;
    else if (start == a->offset && len == a->length && a->null_count >= 0)
        nulls = a->null_count;
    else
        nulls = count_nulls(validity, start, len);
    if (nulls > 0 && t->layout != MANIFEST_NULL && !validity)
        return efail(e, -EINVAL, "array \"%s\": null_count %lld without a validity bitmap", f->name, (long long)nulls);
    bool keep_validity = nulls > 0 && t->layout != MANIFEST_NULL;

    /* In place when every buffer of the node already lies in the unit; else a copy. */
    struct plan pl;
    struct window w = { start, 0, start + len };
    bool in_place = false;
    int r;
    if (e->u && len > 0) {
        if ((r = plan_node(e, f, a, w, keep_validity, true, &pl)) < 0)
            return r;
        /* Not vacuously: a node with no bytes of its own (a struct without nulls) takes
         * the copy's window, or its children would be taken from slot 0. */
        bool any = false, all = true;
        for (unsigned i = 0; i < t->n_buffers; i++)
            if (pl.pc[i].len) {
                any = true;
                all = all && inside(e->u, pl.pc[i].src, pl.pc[i].len);
            }
        in_place = any && all;
    }
    if (!in_place) {
        int64_t o = len ? start % 8 : 0;
        w = (struct window){ o, start - o, o + len };
        if ((r = plan_node(e, f, a, w, keep_validity, false, &pl)) < 0)
            return r;
    }
    struct manifest_array *na = NULL;
    struct manifest_array scratch;
    if (e->u) {
        if (!(na = manifest_alloc(e->m, sizeof(*na))) ||
            (f->n_children && !(na->children = manifest_alloc(e->m, f->n_children * sizeof(*na->children)))))
            return efail(e, -ENOMEM, "out of memory");
    } else {
        memset(&scratch, 0, sizeof(scratch));
        na = &scratch;
    }
    na->length = len;
    na->offset = w.o;
    na->null_count = nulls;
    for (unsigned i = 0; i < t->n_buffers; i++)
        if ((r = put(e, &pl.pc[i], in_place, &na->buffers[i])) < 0)
            return r;
    e->mbound += 8 + 9 * (3 + 2 * t->n_buffers);
    for (uint32_t i = 0; i < f->n_children; i++) {
        const struct ArrowArray *c = a->children[i];
        if (!c)
            return efail(e, -EINVAL, "array \"%s\": child %u is NULL", f->name, i);
        int64_t cs, cl;
        if (t->layout == MANIFEST_STRUCT) {
            cs = w.S;
            cl = w.N;
        } else {
            cs = pl.child_start;
            cl = pl.child_len;
        }
        if ((r = emit_array(e, f->children[i], c, c->offset + cs, cl, e->u ? &na->children[i] : NULL)) < 0)
            return r;
    }
    if (f->dictionary &&
        (r = emit_array(e, f->dictionary, a->dictionary, a->dictionary->offset, a->dictionary->length,
                        e->u ? &na->dictionary : NULL)) < 0)
        return r;
    if (ret)
        *ret = na;
    return 0;
}

/* emit_column: one column from (s, a) sliced to [start, +len). */
static int emit_column(struct emit *e, const struct ArrowSchema *s, const struct ArrowArray *a, int64_t start, int64_t len)
{
    struct manifest_field *f;
    struct manifest_array *na = NULL;
    int r = emit_field(e, s, 1, &f);
    if (r == 0 && !a)
        r = efail(e, -EINVAL, "array of \"%s\" is NULL", f->name);
    if (r == 0)
        r = emit_array(e, f, a, start, len, &na);
    if (r == 0 && e->u && (r = unit_add_column(e->u, f, na)) < 0)
        e->code = 0; /* message set by unit_add_column */
    return r;
}

static bool is_batch(const struct ArrowSchema *s)
{
    return s && s->format && !strcmp(s->format, "+s");
}

/* batch_metadata: the record batch schema's own metadata becomes the unit's (the first
 * batch's wins). */
static int batch_metadata(struct emit *e, const struct ArrowSchema *s)
{
    if (!s->metadata || e->m->metadata)
        return 0;
    size_t n = metadata_len(s->metadata);
    if (!(e->m->metadata = (const uint8_t *)manifest_strndup(e->m, s->metadata, n)))
        return efail(e, -ENOMEM, "out of memory");
    e->m->metadata_len = (uint32_t)n;
    e->mbound += n + 8;
    return 0;
}

/* emit_batch: a record batch's children as columns. */
static int emit_batch(struct emit *e, const struct ArrowSchema *s, const struct ArrowArray *a)
{
    if (batch_metadata(e, s) < 0)
        return e->code;
    if (!a || !a->release || a->n_children != s->n_children || (a->n_children && !a->children) || a->length < 0)
        return efail(e, -EINVAL, "record batch: the array does not match its struct schema");
    if (a->n_buffers >= 1 && a->buffers && a->buffers[0] && a->null_count != 0 &&
        count_nulls(a->buffers[0], a->offset, a->length) > 0)
        return efail(e, -EINVAL, "record batch: a struct array with nulls is not a batch (use unit_add_array)");
    for (int64_t i = 0; i < s->n_children; i++) {
        const struct ArrowArray *c = a->children[i];
        int r = emit_column(e, s->children[i], c, c ? c->offset + a->offset : 0, a->length);
        if (r < 0)
            return r;
    }
    return 0;
}

static int emit_fail(shmref_conn *conn, struct emit *e, int r)
{
    if (e->code)
        return client_fail(conn, r, "import: %s", e->err);
    return r; /* the message is in conn->errmsg already */
}

int shmref_unit_add_array(shmref_unit *u, const struct ArrowSchema *schema, const struct ArrowArray *array)
{
    if (!u || !u->producer)
        return -EINVAL;
    if (u->published)
        return client_fail(u->conn, -EPERM, "unit_add_array: the unit is published");
    if (!array)
        return client_fail(u->conn, -EINVAL, "unit_add_array: array is NULL");
    struct emit e = { .u = u, .m = u->m };
    int r = emit_column(&e, schema, array, array->offset, array->length);
    return r < 0 ? emit_fail(u->conn, &e, r) : 0;
}

int shmref_unit_add_batch(shmref_unit *u, const struct ArrowSchema *schema, const struct ArrowArray *array)
{
    if (!u || !u->producer)
        return -EINVAL;
    if (u->published)
        return client_fail(u->conn, -EPERM, "unit_add_batch: the unit is published");
    if (!is_batch(schema))
        return client_fail(u->conn, -EINVAL, "unit_add_batch: the schema is not a struct (\"+s\")");
    int r;
    if (u->n_batches && u->batches[u->n_batches - 1].n && (r = shmref_unit_next_batch(u)) < 0)
        return r;
    struct emit e = { .u = u, .m = u->m };
    r = emit_batch(&e, schema, array);
    return r < 0 ? emit_fail(u->conn, &e, r) : 0;
}

/* import: size the copy of n batches (dry run), lease once, copy. */
static int import(shmref_conn *conn, const struct ArrowSchema *s, const struct ArrowArray *const *arrays, size_t n,
                  bool batches, shmref_unit **ret_unit)
{
    struct emit e = { .m = manifest_new(), .mbound = 256 };
    int r = e.m ? 0 : efail(&e, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n && r == 0; i++) {
        if (batches)
            r = emit_batch(&e, s, arrays[i]);
        else
            r = emit_column(&e, s, arrays[i], arrays[i] ? arrays[i]->offset : 0, arrays[i] ? arrays[i]->length : 0);
        e.mbound += 32;
    }
    manifest_free(e.m);
    if (r < 0)
        return emit_fail(conn, &e, r);
    /* Room for the manifest when it may not fit in the metadata. */
    size_t size = e.need + (e.mbound + 64 > SHMREF_META_MAX ? ALIGN_UP(e.mbound) + SHMREF_UNIT_ALIGN : 0);
    shmref_unit *u;
    if ((r = shmref_unit_begin(conn, size ? size : 1, &u)) < 0)
        return r;
    e = (struct emit){ .u = u, .m = u->m };
    if (n == 0 && batches) { /* an empty stream: its schema, no batch */
        r = batch_metadata(&e, s);
        for (int64_t i = 0; i < s->n_children && r == 0; i++) {
            struct manifest_field *f;
            r = emit_field(&e, s->children[i], 1, &f);
            if (r == 0 && (r = unit_add_field(u, f)) < 0)
                e.code = 0;
        }
    }
    for (size_t i = 0; i < n && r == 0; i++) {
        if (i > 0)
            r = shmref_unit_next_batch(u);
        if (r == 0)
            r = batches ? emit_batch(&e, s, arrays[i])
                        : emit_column(&e, s, arrays[i], arrays[i]->offset, arrays[i]->length);
    }
    if (r < 0) {
        r = emit_fail(conn, &e, r);
        char keep[sizeof(conn->errmsg)];
        memcpy(keep, conn->errmsg, sizeof(keep));
        shmref_unit_release(u);
        memcpy(conn->errmsg, keep, sizeof(keep));
        return r;
    }
    *ret_unit = u;
    return 0;
}

int shmref_unit_import_array(shmref_conn *conn, const struct ArrowSchema *schema, const struct ArrowArray *array,
                             shmref_unit **ret_unit)
{
    if (!conn)
        return -EINVAL;
    if (!schema || !array || !ret_unit)
        return client_fail(conn, -EINVAL, "unit_import_array: schema, array and ret_unit must not be NULL");
    return import(conn, schema, &array, 1, is_batch(schema), ret_unit);
}

int shmref_unit_import_stream(shmref_conn *conn, struct ArrowArrayStream *stream, shmref_unit **ret_unit)
{
    if (!conn)
        return -EINVAL;
    if (!stream || !stream->release || !ret_unit)
        return client_fail(conn, -EINVAL, "unit_import_stream: stream (not released) and ret_unit must not be NULL");
    struct ArrowSchema s;
    struct ArrowArray *v = NULL;
    const struct ArrowArray **ptrs = NULL;
    size_t n = 0, cap = 0;
    int r = stream->get_schema(stream, &s);
    if (r != 0) {
        const char *why = stream->get_last_error ? stream->get_last_error(stream) : NULL;
        return client_fail(conn, -(r > 0 ? r : EIO), "unit_import_stream: get_schema: %s", why ? why : strerror(r));
    }
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            struct ArrowArray *nv = realloc(v, cap * sizeof(*nv));
            if (!nv) {
                r = client_fail(conn, -ENOMEM, "out of memory");
                goto out;
            }
            v = nv;
        }
        int g = stream->get_next(stream, &v[n]);
        if (g != 0) {
            const char *why = stream->get_last_error ? stream->get_last_error(stream) : NULL;
            r = client_fail(conn, -(g > 0 ? g : EIO), "unit_import_stream: get_next: %s", why ? why : strerror(g));
            goto out;
        }
        if (!v[n].release)
            break;
        n++;
    }
    if (!(ptrs = malloc((n ? n : 1) * sizeof(*ptrs)))) {
        r = client_fail(conn, -ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        ptrs[i] = &v[i];
    r = import(conn, &s, ptrs, n, is_batch(&s), ret_unit);
out:
    for (size_t i = 0; i < n; i++)
        v[i].release(&v[i]);
    free(v);
    free(ptrs);
    s.release(&s);
    return r;
}
