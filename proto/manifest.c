/* SPDX-License-Identifier: MIT */
/* manifest.c: encode, decode and validate unit-of-work manifests (see manifest.h).
 * Decoding is two-pass like proto.c: proto_check() bounds the raw bytes, msgpack-c
 * unpacks, then every node's types and ranges are checked while the tree is built in an
 * arena. Validation reads the described buffer only through checked ranges. */
#include "manifest.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto.h"

#define LIMIT_LEN (INT64_C(1) << 62) /* lengths and offsets stay far from overflow */
#define ARENA_BLOCK (64 * 1024)

/* ---- the arena ---- */

struct manifest_arena {
    struct manifest_arena *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *manifest_alloc(struct manifest *m, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    struct manifest_arena *a = m->arena;
    if (!a || a->cap - a->used < size) {
        size_t cap = size > ARENA_BLOCK ? size : ARENA_BLOCK;
        struct manifest_arena *n = malloc(sizeof(*n) + cap);
        if (!n)
            return NULL;
        n->used = 0;
        n->cap = cap;
        /* a large allocation gets a block of its own behind the current one */
        if (a && size > ARENA_BLOCK) {
            n->next = a->next;
            a->next = n;
        } else {
            n->next = a;
            m->arena = n;
        }
        a = n;
    }
    void *p = a->data + a->used;
    a->used += size;
    memset(p, 0, size);
    return p;
}

char *manifest_strndup(struct manifest *m, const char *s, size_t n)
{
    char *p = manifest_alloc(m, n + 1);
    if (p && n)
        memcpy(p, s, n);
    return p;
}

struct manifest *manifest_new(void)
{
    return calloc(1, sizeof(struct manifest));
}

void manifest_free(struct manifest *m)
{
    if (!m)
        return;
    for (struct manifest_arena *a = m->arena, *n; a; a = n) {
        n = a->next;
        free(a);
    }
    free(m->batches);
    free(m);
}

struct manifest_batch *manifest_add_batch(struct manifest *m, int64_t length)
{
    if (m->n_batches == m->cap_batches) {
        uint32_t cap = m->cap_batches ? m->cap_batches * 2 : 4;
        struct manifest_batch *v = realloc(m->batches, cap * sizeof(*v));
        if (!v)
            return NULL;
        m->batches = v;
        m->cap_batches = cap;
    }
    struct manifest_array **cols = manifest_alloc(m, (m->n_columns ? m->n_columns : 1) * sizeof(*cols));
    if (!cols)
        return NULL;
    struct manifest_batch *b = &m->batches[m->n_batches++];
    b->length = length;
    b->columns = cols;
    return b;
}

/* ---- format strings ---- */

static int parse_uint(const char *s, uint64_t max, uint64_t *ret, const char **end)
{
    uint64_t v = 0;
    if (*s < '0' || *s > '9')
        return -EINVAL;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (uint64_t)(*s++ - '0');
        if (v > max)
            return -EINVAL;
    }
    *ret = v;
    *end = s;
    return 0;
}

static int fixed(struct manifest_type *t, uint64_t width)
{
    t->layout = MANIFEST_FIXED;
    t->n_buffers = 2;
    t->width = width;
    return 0;
}

static int parse_temporal(const char *f, struct manifest_type *t)
{
    /* f points after 't' */
    if (!strcmp(f, "dD") || !strcmp(f, "ts") || !strcmp(f, "tm") || !strcmp(f, "iM"))
        return fixed(t, 4);
    if (!strcmp(f, "dm") || !strcmp(f, "tu") || !strcmp(f, "tn") || !strcmp(f, "iD"))
        return fixed(t, 8);
    if (!strcmp(f, "in"))
        return fixed(t, 16);
    if (f[0] == 'D' && f[1] && strchr("smun", f[1]) && !f[2])
        return fixed(t, 8);
    if (f[0] == 's' && f[1] && strchr("smun", f[1]) && f[2] == ':')
        return fixed(t, 8); /* the time zone (possibly empty) follows the colon */
    return -EINVAL;
}

int manifest_type_parse(const char *f, struct manifest_type *ret)
{
    struct manifest_type t = {0};
    uint64_t n;
    const char *end;
    int r = -EINVAL;
    if (!f || !f[0] || strlen(f) >= MANIFEST_MAX_FORMAT)
        return -EINVAL;
    if (!f[1]) {
        static const char ints[] = "cCsSiIlL";
        const char *p = strchr(ints, f[0]);
        if (p) {
            unsigned k = (unsigned)(p - ints);
            t.integer = true;
            t.is_signed = !(k & 1);
            r = fixed(&t, 1u << (k / 2));
        } else if (f[0] == 'e') r = fixed(&t, 2);
        else if (f[0] == 'f') r = fixed(&t, 4);
        else if (f[0] == 'g') r = fixed(&t, 8);
        else if (f[0] == 'n') { t.layout = MANIFEST_NULL; r = 0; }
        else if (f[0] == 'b') { t.layout = MANIFEST_BOOL; t.n_buffers = 2; r = 0; }
        else if (f[0] == 'z' || f[0] == 'u') { t.layout = MANIFEST_BINARY; t.n_buffers = 3; r = 0; }
        else if (f[0] == 'Z' || f[0] == 'U') { t.layout = MANIFEST_LARGE_BINARY; t.n_buffers = 3; r = 0; }
    } else if (f[0] == 'w' && f[1] == ':') {
        if (parse_uint(f + 2, INT32_MAX, &n, &end) == 0 && !*end && n > 0)
            r = fixed(&t, n);
    } else if (f[0] == 'd' && f[1] == ':') {
        uint64_t p, s, w = 128;
        if (parse_uint(f + 2, 76, &p, &end) == 0 && p > 0 && *end == ',') {
            const char *q = end + 1;
            if (*q == '-')
                q++;
            if (parse_uint(q, 76, &s, &end) == 0 &&
                (!*end || (*end == ',' && parse_uint(end + 1, 256, &w, &end) == 0 && !*end)) &&
                (w == 32 || w == 64 || w == 128 || w == 256))
                r = fixed(&t, w / 8);
        }
    } else if (f[0] == 't') {
        r = parse_temporal(f + 1, &t);
    } else if (f[0] == '+') {
        if (!strcmp(f, "+l")) { t.layout = MANIFEST_LIST; t.n_buffers = 2; r = 0; }
        else if (!strcmp(f, "+L")) { t.layout = MANIFEST_LARGE_LIST; t.n_buffers = 2; r = 0; }
        else if (!strcmp(f, "+m")) { t.layout = MANIFEST_LIST; t.n_buffers = 2; t.map = true; r = 0; }
        else if (!strcmp(f, "+s")) { t.layout = MANIFEST_STRUCT; t.n_buffers = 1; r = 0; }
        else if (f[1] == 'w' && f[2] == ':' && parse_uint(f + 3, INT32_MAX, &n, &end) == 0 && !*end && n > 0) {
            t.layout = MANIFEST_FIXED_LIST;
            t.n_buffers = 1;
            t.width = n;
            r = 0;
        }
    }
    if (r == 0)
        *ret = t;
    return r;
}

/* ---- Arrow binary metadata ---- */

static int32_t rd32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

bool manifest_metadata_check(const uint8_t *p, size_t len)
{
    if (len < 4)
        return false;
    int32_t n = rd32(p);
    size_t pos = 4;
    if (n < 0 || (size_t)n > len / 8)
        return false;
    for (int32_t i = 0; i < 2 * n; i++) {
        if (len - pos < 4)
            return false;
        int32_t k = rd32(p + pos);
        pos += 4;
        if (k < 0 || (size_t)k > len - pos)
            return false;
        pos += (size_t)k;
    }
    return true;
}

/* ---- encoding ---- */

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_bin_or_nil(msgpack_packer *pk, const uint8_t *p, uint32_t n)
{
    if (!p) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, p, n);
}

static size_t count_fields(const struct manifest_field *f)
{
    size_t n = 1;
    for (uint32_t i = 0; i < f->n_children; i++)
        n += count_fields(f->children[i]);
    if (f->dictionary)
        n += count_fields(f->dictionary);
    return n;
}

static void pack_field(msgpack_packer *pk, const struct manifest_field *f)
{
    msgpack_pack_array(pk, 6);
    pack_str(pk, f->name ? f->name : "");
    pack_str(pk, f->format);
    msgpack_pack_int64(pk, f->flags);
    msgpack_pack_uint32(pk, f->n_children);
    if (f->dictionary) msgpack_pack_true(pk); else msgpack_pack_false(pk);
    pack_bin_or_nil(pk, f->metadata, f->metadata_len);
    for (uint32_t i = 0; i < f->n_children; i++)
        pack_field(pk, f->children[i]);
    if (f->dictionary)
        pack_field(pk, f->dictionary);
}

static int pack_array(msgpack_packer *pk, const struct manifest_field *f, const struct manifest_array *a)
{
    if (!a || (f->dictionary != NULL) != (a->dictionary != NULL))
        return -EINVAL;
    msgpack_pack_array(pk, 3 + 2 * f->type.n_buffers);
    msgpack_pack_int64(pk, a->length);
    msgpack_pack_int64(pk, a->null_count);
    msgpack_pack_int64(pk, a->offset);
    for (unsigned i = 0; i < f->type.n_buffers; i++) {
        msgpack_pack_uint64(pk, a->buffers[i].off);
        msgpack_pack_uint64(pk, a->buffers[i].len);
    }
    for (uint32_t i = 0; i < f->n_children; i++)
        if (pack_array(pk, f->children[i], a->children ? a->children[i] : NULL) < 0)
            return -EINVAL;
    if (f->dictionary)
        return pack_array(pk, f->dictionary, a->dictionary);
    return 0;
}

static void pack_key(msgpack_packer *pk, const char *k)
{
    pack_str(pk, k);
}

int manifest_encode(const struct manifest *m, uint8_t **ret, size_t *ret_len)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    size_t nodes = 0;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (uint32_t i = 0; i < m->n_columns; i++)
        nodes += count_fields(m->columns[i]);

    msgpack_pack_map(&pk, 5);
    pack_key(&pk, "v");
    msgpack_pack_uint32(&pk, MANIFEST_VERSION);
    pack_key(&pk, "columns");
    msgpack_pack_uint32(&pk, m->n_columns);
    pack_key(&pk, "fields");
    msgpack_pack_array(&pk, nodes);
    for (uint32_t i = 0; i < m->n_columns; i++)
        pack_field(&pk, m->columns[i]);
    pack_key(&pk, "metadata");
    pack_bin_or_nil(&pk, m->metadata, m->metadata_len);
    pack_key(&pk, "batches");
    msgpack_pack_array(&pk, m->n_batches);
    int r = 0;
    for (uint32_t b = 0; b < m->n_batches && r == 0; b++) {
        msgpack_pack_array(&pk, 2);
        msgpack_pack_int64(&pk, m->batches[b].length);
        msgpack_pack_array(&pk, nodes);
        for (uint32_t i = 0; i < m->n_columns && r == 0; i++)
            r = pack_array(&pk, m->columns[i], m->batches[b].columns[i]);
    }
    /* msgpack_sbuffer_write fails only on ENOMEM, and then the buffer is cut short */
    if (r == 0 && !sb.data)
        r = -ENOMEM;
    if (r < 0) {
        msgpack_sbuffer_destroy(&sb);
        return r;
    }
    *ret = (uint8_t *)sb.data;
    *ret_len = sb.size;
    return 0;
}

/* ---- decoding ---- */

struct dctx {
    struct manifest *m;
    const msgpack_object *nodes;
    uint32_t n, pos;
    char *err;
    int oom;
};

static int dfail(struct dctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int dfail(struct dctx *c, const char *fmt, ...)
{
    va_list ap;
    int k = snprintf(c->err, MANIFEST_ERR_MAX, "manifest: ");
    va_start(ap, fmt);
    vsnprintf(c->err + k, MANIFEST_ERR_MAX - (size_t)k, fmt, ap);
    va_end(ap);
    return -EBADMSG;
}

static int oom(struct dctx *c)
{
    snprintf(c->err, MANIFEST_ERR_MAX, "manifest: out of memory");
    return -ENOMEM;
}

static const msgpack_object *map_get(const msgpack_object *map, const char *key)
{
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl && !memcmp(k->via.str.ptr, key, kl))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

static bool as_u64(const msgpack_object *o, uint64_t max, uint64_t *ret)
{
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max)
        return false;
    *ret = o->via.u64;
    return true;
}

static bool as_bin_or_nil(const msgpack_object *o, const uint8_t **ret, uint32_t *ret_len)
{
    if (!o || o->type == MSGPACK_OBJECT_NIL) {
        *ret = NULL;
        *ret_len = 0;
        return true;
    }
    if (o->type != MSGPACK_OBJECT_BIN)
        return false;
    *ret = (const uint8_t *)o->via.bin.ptr;
    *ret_len = o->via.bin.size;
    return true;
}

static int field_shape(struct dctx *c, struct manifest_field *f, uint32_t at)
{
    const struct manifest_type *t = &f->type;
    switch (t->layout) {
    case MANIFEST_LIST: case MANIFEST_LARGE_LIST: case MANIFEST_FIXED_LIST:
        if (f->n_children != 1)
            return dfail(c, "field node %u (\"%s\"): format \"%s\" needs 1 child, has %u", at, f->name, f->format, f->n_children);
        if (t->map && (f->children[0]->type.layout != MANIFEST_STRUCT || f->children[0]->n_children != 2))
            return dfail(c, "field node %u (\"%s\"): a map's child must be a struct of 2 fields (key, value)", at, f->name);
        break;
    case MANIFEST_STRUCT:
        break;
    default:
        if (f->n_children != 0)
            return dfail(c, "field node %u (\"%s\"): format \"%s\" has no children, says %u", at, f->name, f->format, f->n_children);
    }
    if (f->dictionary && !t->integer)
        return dfail(c, "field node %u (\"%s\"): dictionary indices of format \"%s\" are not an integer type", at, f->name, f->format);
    return 0;
}

static int decode_field(struct dctx *c, unsigned depth, struct manifest_field **ret)
{
    if (depth > MANIFEST_MAX_DEPTH)
        return dfail(c, "fields nested deeper than %d", MANIFEST_MAX_DEPTH);
    if (c->pos >= c->n)
        return dfail(c, "fields: %u nodes, a child or dictionary is missing", c->n);
    uint32_t at = c->pos++;
    const msgpack_object *o = &c->nodes[at];
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 6)
        return dfail(c, "field node %u is not [name, format, flags, n_children, has_dictionary, metadata]", at);
    const msgpack_object *v = o->via.array.ptr;
    uint64_t flags, nch;
    const uint8_t *md;
    uint32_t mdl;
    if (v[0].type != MSGPACK_OBJECT_STR)
        return dfail(c, "field node %u: name is not a string", at);
    if (v[1].type != MSGPACK_OBJECT_STR || v[1].via.str.size == 0 || v[1].via.str.size >= MANIFEST_MAX_FORMAT)
        return dfail(c, "field node %u: format is not a string of 1..%d bytes", at, MANIFEST_MAX_FORMAT - 1);
    if (!as_u64(&v[2], 7, &flags))
        return dfail(c, "field node %u: flags is not an unsigned integer <= 7", at);
    if (!as_u64(&v[3], c->n - c->pos, &nch))
        return dfail(c, "field node %u: n_children is not an unsigned integer <= the nodes left", at);
    if (v[4].type != MSGPACK_OBJECT_BOOLEAN)
        return dfail(c, "field node %u: has_dictionary is not a boolean", at);
    if (!as_bin_or_nil(&v[5], &md, &mdl) || (md && !manifest_metadata_check(md, mdl)))
        return dfail(c, "field node %u: metadata is not Arrow binary metadata (or nil)", at);
    struct manifest_field *f = manifest_alloc(c->m, sizeof(*f));
    if (!f || !(f->name = manifest_strndup(c->m, v[0].via.str.ptr, v[0].via.str.size)) ||
        !(f->format = manifest_strndup(c->m, v[1].via.str.ptr, v[1].via.str.size)))
        return oom(c);
    if (memchr(v[0].via.str.ptr, 0, v[0].via.str.size) || memchr(v[1].via.str.ptr, 0, v[1].via.str.size))
        return dfail(c, "field node %u: name or format holds a NUL byte", at);
    if (manifest_type_parse(f->format, &f->type) < 0)
        return dfail(c, "field node %u (\"%s\"): unsupported or malformed format \"%s\"", at, f->name, f->format);
    f->flags = (int64_t)flags;
    if (md && !(f->metadata = (const uint8_t *)manifest_strndup(c->m, (const char *)md, mdl)))
        return oom(c);
    f->metadata_len = mdl;
    f->n_children = (uint32_t)nch;
    if (nch && !(f->children = manifest_alloc(c->m, nch * sizeof(*f->children))))
        return oom(c);
    int r;
    for (uint32_t i = 0; i < nch; i++)
        if ((r = decode_field(c, depth + 1, &f->children[i])) < 0)
            return r;
    if (v[4].via.boolean && (r = decode_field(c, depth + 1, &f->dictionary)) < 0)
        return r;
    if ((r = field_shape(c, f, at)) < 0)
        return r;
    *ret = f;
    return 0;
}

static int decode_array(struct dctx *c, uint32_t b, const struct manifest_field *f, struct manifest_array **ret)
{
    if (c->pos >= c->n)
        return dfail(c, "batch %u: fewer array nodes than field nodes", b);
    uint32_t at = c->pos++;
    const msgpack_object *o = &c->nodes[at];
    unsigned nb = f->type.n_buffers;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return dfail(c, "batch %u node %u (\"%s\"): not an array", b, at, f->name);
    if (o->via.array.size != 3 + 2 * nb)
        return dfail(c, "batch %u node %u (\"%s\"): %u buffers, format \"%s\" has %u",
                     b, at, f->name, o->via.array.size < 3 ? 0 : (o->via.array.size - 3) / 2, f->format, nb);
    const msgpack_object *v = o->via.array.ptr;
    uint64_t len, off;
    int64_t nc;
    if (!as_u64(&v[0], LIMIT_LEN, &len))
        return dfail(c, "batch %u node %u (\"%s\"): length is not an unsigned integer below 2^62", b, at, f->name);
    if (v[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER && v[1].via.u64 <= len)
        nc = (int64_t)v[1].via.u64;
    else if (v[1].type == MSGPACK_OBJECT_NEGATIVE_INTEGER && v[1].via.i64 == -1)
        nc = -1;
    else
        return dfail(c, "batch %u node %u (\"%s\"): null_count is not -1 or 0..length", b, at, f->name);
    if (!as_u64(&v[2], LIMIT_LEN - len, &off))
        return dfail(c, "batch %u node %u (\"%s\"): offset + length is not below 2^62", b, at, f->name);
    struct manifest_array *a = manifest_alloc(c->m, sizeof(*a));
    if (!a)
        return oom(c);
    a->length = (int64_t)len;
    a->null_count = nc;
    a->offset = (int64_t)off;
    for (unsigned i = 0; i < nb; i++)
        if (!as_u64(&v[3 + 2 * i], UINT64_MAX, &a->buffers[i].off) ||
            !as_u64(&v[4 + 2 * i], UINT64_MAX, &a->buffers[i].len))
            return dfail(c, "batch %u node %u (\"%s\"): buffer %u is not two unsigned integers", b, at, f->name, i);
    if (f->n_children && !(a->children = manifest_alloc(c->m, f->n_children * sizeof(*a->children))))
        return oom(c);
    int r;
    for (uint32_t i = 0; i < f->n_children; i++)
        if ((r = decode_array(c, b, f->children[i], &a->children[i])) < 0)
            return r;
    if (f->dictionary && (r = decode_array(c, b, f->dictionary, &a->dictionary)) < 0)
        return r;
    *ret = a;
    return 0;
}

static int decode_object(const msgpack_object *top, struct manifest *m, char *err)
{
    struct dctx c = { .m = m, .err = err };
    uint64_t v, ncol;
    if (top->type != MSGPACK_OBJECT_MAP)
        return dfail(&c, "not a map");
    if (!as_u64(map_get(top, "v"), UINT32_MAX, &v))
        return dfail(&c, "\"v\" (version) missing or not an unsigned integer");
    if (v != MANIFEST_VERSION)
        return dfail(&c, "version %llu, this library reads %d", (unsigned long long)v, MANIFEST_VERSION);
    const msgpack_object *fields = map_get(top, "fields"), *batches = map_get(top, "batches");
    if (!fields || fields->type != MSGPACK_OBJECT_ARRAY)
        return dfail(&c, "\"fields\" missing or not an array");
    if (!batches || batches->type != MSGPACK_OBJECT_ARRAY)
        return dfail(&c, "\"batches\" missing or not an array");
    c.nodes = fields->via.array.ptr;
    c.n = fields->via.array.size;
    if (!as_u64(map_get(top, "columns"), c.n, &ncol))
        return dfail(&c, "\"columns\" missing, or more than the %u field nodes", c.n);
    if (!as_bin_or_nil(map_get(top, "metadata"), &m->metadata, &m->metadata_len) ||
        (m->metadata && !manifest_metadata_check(m->metadata, m->metadata_len)))
        return dfail(&c, "\"metadata\" is not Arrow binary metadata (or nil)");
    if (m->metadata && !(m->metadata = (const uint8_t *)manifest_strndup(m, (const char *)m->metadata, m->metadata_len)))
        return oom(&c);
    m->n_columns = (uint32_t)ncol;
    if (ncol && !(m->columns = manifest_alloc(m, ncol * sizeof(*m->columns))))
        return oom(&c);
    int r;
    for (uint32_t i = 0; i < ncol; i++)
        if ((r = decode_field(&c, 1, &m->columns[i])) < 0)
            return r;
    if (c.pos != c.n)
        return dfail(&c, "%u field nodes, the %llu columns use %u", c.n, (unsigned long long)ncol, c.pos);
    for (uint32_t b = 0; b < batches->via.array.size; b++) {
        const msgpack_object *bo = &batches->via.array.ptr[b];
        uint64_t blen;
        if (bo->type != MSGPACK_OBJECT_ARRAY || bo->via.array.size < 2 ||
            !as_u64(&bo->via.array.ptr[0], LIMIT_LEN, &blen) ||
            bo->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY)
            return dfail(&c, "batch %u is not [length, nodes]", b);
        struct manifest_batch *mb = manifest_add_batch(m, (int64_t)blen);
        if (!mb)
            return oom(&c);
        c.nodes = bo->via.array.ptr[1].via.array.ptr;
        c.n = bo->via.array.ptr[1].via.array.size;
        c.pos = 0;
        for (uint32_t i = 0; i < ncol; i++)
            if ((r = decode_array(&c, b, m->columns[i], &mb->columns[i])) < 0)
                return r;
        if (c.pos != c.n)
            return dfail(&c, "batch %u: %u array nodes, the fields need %u", b, c.n, c.pos);
    }
    return 0;
}

/* unpack: bounded check, then msgpack-c. */
static int unpack(const uint8_t *buf, size_t len, msgpack_unpacked *up, char *err)
{
    const char *why = NULL;
    size_t off = 0;
    if (len == 0 || len > MANIFEST_MAX_BYTES) {
        snprintf(err, MANIFEST_ERR_MAX, "manifest: %zu bytes (1..%u allowed)", len, MANIFEST_MAX_BYTES);
        return -EBADMSG;
    }
    if (proto_check(buf, len, PROTO_MAX_DEPTH, &why) < 0) {
        snprintf(err, MANIFEST_ERR_MAX, "manifest: malformed msgpack: %s", why);
        return -EBADMSG;
    }
    msgpack_unpacked_init(up);
    int r = msgpack_unpack_next(up, (const char *)buf, len, &off);
    if (r != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(up);
        snprintf(err, MANIFEST_ERR_MAX, r == MSGPACK_UNPACK_NOMEM_ERROR ? "manifest: out of memory" : "manifest: msgpack unpack failed");
        return r == MSGPACK_UNPACK_NOMEM_ERROR ? -ENOMEM : -EBADMSG;
    }
    return 0;
}

static int decode_into(const msgpack_object *o, struct manifest **ret, char *err)
{
    struct manifest *m = manifest_new();
    if (!m) {
        snprintf(err, MANIFEST_ERR_MAX, "manifest: out of memory");
        return -ENOMEM;
    }
    int r = decode_object(o, m, err);
    if (r < 0) {
        manifest_free(m);
        return r;
    }
    *ret = m;
    return 0;
}

int manifest_decode(const uint8_t *buf, size_t len, struct manifest **ret, char *err)
{
    msgpack_unpacked up;
    int r = unpack(buf, len, &up, err);
    if (r < 0)
        return r;
    r = decode_into(&up.data, ret, err);
    msgpack_unpacked_destroy(&up);
    return r;
}

/* ---- envelopes ---- */

static int envelope(const uint8_t *manifest, size_t mlen, uint64_t off, uint64_t len,
                    uint8_t **ret, size_t *ret_len)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    pack_key(&pk, "shmref");
    msgpack_pack_uint32(&pk, 1);
    pack_key(&pk, "kind");
    pack_str(&pk, "unit");
    if (manifest) {
        pack_key(&pk, "manifest");
        /* msgpack concatenates: the manifest's bytes are the value */
        msgpack_sbuffer_write(&sb, (const char *)manifest, mlen);
    } else {
        pack_key(&pk, "manifest_at");
        msgpack_pack_array(&pk, 2);
        msgpack_pack_uint64(&pk, off);
        msgpack_pack_uint64(&pk, len);
    }
    if (!sb.data)
        return -ENOMEM;
    *ret = (uint8_t *)sb.data;
    *ret_len = sb.size;
    return 0;
}

int manifest_envelope_inline(const uint8_t *manifest, size_t len, uint8_t **ret, size_t *ret_len)
{
    return envelope(manifest, len, 0, 0, ret, ret_len);
}

int manifest_envelope_at(uint64_t off, uint64_t len, uint8_t **ret, size_t *ret_len)
{
    return envelope(NULL, 0, off, len, ret, ret_len);
}

int manifest_envelope_decode(const uint8_t *meta, size_t len, struct manifest **ret,
                             uint64_t *ret_at_off, uint64_t *ret_at_len, char *err)
{
    msgpack_unpacked up;
    uint64_t v, off, n;
    int r = unpack(meta, len, &up, err);
    if (r < 0)
        return r;
    const msgpack_object *top = &up.data, *kind, *in, *at;
    r = -EBADMSG;
    if (top->type != MSGPACK_OBJECT_MAP || !as_u64(map_get(top, "shmref"), UINT32_MAX, &v)) {
        snprintf(err, MANIFEST_ERR_MAX, "metadata: not the shmref convention (no \"shmref\" key)");
    } else if (v != 1) {
        snprintf(err, MANIFEST_ERR_MAX, "metadata: convention version %llu, this library reads 1", (unsigned long long)v);
    } else if (!(kind = map_get(top, "kind")) || kind->type != MSGPACK_OBJECT_STR ||
               kind->via.str.size != 4 || memcmp(kind->via.str.ptr, "unit", 4)) {
        snprintf(err, MANIFEST_ERR_MAX, "metadata: \"kind\" is not \"unit\"");
    } else if ((in = map_get(top, "manifest"))) {
        r = decode_into(in, ret, err);
    } else if ((at = map_get(top, "manifest_at")) && at->type == MSGPACK_OBJECT_ARRAY && at->via.array.size == 2 &&
               as_u64(&at->via.array.ptr[0], UINT64_MAX, &off) && as_u64(&at->via.array.ptr[1], MANIFEST_MAX_BYTES, &n)) {
        *ret = NULL;
        *ret_at_off = off;
        *ret_at_len = n;
        r = 0;
    } else {
        snprintf(err, MANIFEST_ERR_MAX, "metadata: neither \"manifest\" nor a valid \"manifest_at\": [offset, length]");
    }
    msgpack_unpacked_destroy(&up);
    return r;
}

/* ---- validation against the buffer ---- */

struct vctx {
    const uint8_t *base;
    size_t len;
    char *err;
    char path[512];
};

static int vfail(struct vctx *v, const struct manifest_field *f, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int vfail(struct vctx *v, const struct manifest_field *f, const char *fmt, ...)
{
    va_list ap;
    int k = snprintf(v->err, MANIFEST_ERR_MAX, "manifest: %s (\"%.40s\", format \"%s\"): ", v->path, f->name, f->format);
    if (k < 0 || k >= MANIFEST_ERR_MAX)
        return -EBADMSG;
    va_start(ap, fmt);
    vsnprintf(v->err + k, MANIFEST_ERR_MAX - (size_t)k, fmt, ap);
    va_end(ap);
    return -EBADMSG;
}

static const char *const buf_names[][3] = {
    [MANIFEST_NULL] = { "", "", "" },
    [MANIFEST_BOOL] = { "validity bitmap", "data bitmap", "" },
    [MANIFEST_FIXED] = { "validity bitmap", "data buffer", "" },
    [MANIFEST_BINARY] = { "validity bitmap", "offsets buffer", "data buffer" },
    [MANIFEST_LARGE_BINARY] = { "validity bitmap", "offsets buffer", "data buffer" },
    [MANIFEST_LIST] = { "validity bitmap", "offsets buffer", "" },
    [MANIFEST_LARGE_LIST] = { "validity bitmap", "offsets buffer", "" },
    [MANIFEST_FIXED_LIST] = { "validity bitmap", "", "" },
    [MANIFEST_STRUCT] = { "validity bitmap", "", "" },
};

/* range: buffer i of a lies inside the buffer, aligned, and holds at least need bytes. */
static int range(struct vctx *v, const struct manifest_field *f, const struct manifest_array *a,
                 unsigned i, uint64_t need)
{
    const struct manifest_range *r = &a->buffers[i];
    const char *name = buf_names[f->type.layout][i];
    if (r->off > v->len || r->len > v->len - r->off)
        return vfail(v, f, "%s [%llu, +%llu) lies outside the %zu published bytes", name,
                     (unsigned long long)r->off, (unsigned long long)r->len, v->len);
    if (r->len && r->off % MANIFEST_ALIGN)
        return vfail(v, f, "%s offset %llu is not a multiple of %d", name, (unsigned long long)r->off, MANIFEST_ALIGN);
    if (r->len < need)
        return vfail(v, f, "%s holds %llu bytes, offset + length need %llu", name,
                     (unsigned long long)r->len, (unsigned long long)need);
    return 0;
}

static bool bit(const uint8_t *p, uint64_t i)
{
    return p[i / 8] >> (i % 8) & 1;
}

static int64_t rd_int(const uint8_t *p, uint64_t width, bool is_signed)
{
    switch (width) {
    case 1: return is_signed ? (int64_t)(int8_t)p[0] : (int64_t)p[0];
    case 2: { uint16_t x; memcpy(&x, p, 2); return is_signed ? (int64_t)(int16_t)x : (int64_t)x; }
    case 4: { uint32_t x; memcpy(&x, p, 4); return is_signed ? (int64_t)(int32_t)x : (int64_t)x; }
    default: { int64_t x; memcpy(&x, p, 8); return x; } /* uint64 above 2^63 reads negative: refused */
    }
}

/* offsets: entries [offset, offset + length] of the offsets buffer (4 or 8 bytes each)
 * are >= 0, non-decreasing and the last is <= limit. */
static int offsets(struct vctx *v, const struct manifest_field *f, const struct manifest_array *a,
                   unsigned w, uint64_t limit, const char *limit_name, int64_t *ret_last)
{
    uint64_t n = (uint64_t)(a->offset + a->length);
    const struct manifest_range *r = &a->buffers[1];
    int rr;
    if (a->length == 0 && r->len == 0) {
        if (a->offset != 0)
            return vfail(v, f, "offsets buffer is empty and offset %lld is not 0", (long long)a->offset);
        *ret_last = 0;
        return range(v, f, a, 1, 0);
    }
    uint64_t need;
    if (__builtin_mul_overflow(n + 1, (uint64_t)w, &need))
        return vfail(v, f, "offset + length overflows the offsets buffer size");
    if ((rr = range(v, f, a, 1, need)) < 0)
        return rr;
    const uint8_t *p = v->base + r->off;
    int64_t prev = rd_int(p + (uint64_t)a->offset * w, w, true);
    if (prev < 0)
        return vfail(v, f, "offsets buffer: first value %lld (at index %lld) is negative", (long long)prev, (long long)a->offset);
    for (uint64_t i = (uint64_t)a->offset + 1; i <= n; i++) {
        int64_t x = rd_int(p + i * w, w, true);
        if (x < prev)
            return vfail(v, f, "offsets buffer: value %lld at index %llu is below the previous %lld (not monotonic)",
                         (long long)x, (unsigned long long)i, (long long)prev);
        prev = x;
    }
    if ((uint64_t)prev > limit)
        return vfail(v, f, "offsets buffer: last value %lld exceeds the %s (%llu)", (long long)prev, limit_name,
                     (unsigned long long)limit);
    *ret_last = prev;
    return 0;
}

static int validate_array(struct vctx *v, const struct manifest_field *f, const struct manifest_array *a, unsigned depth);

static int child(struct vctx *v, const struct manifest_field *f, const struct manifest_array *a, unsigned depth,
                 const char *suffix, unsigned i)
{
    size_t k = strlen(v->path);
    if (suffix)
        snprintf(v->path + k, sizeof(v->path) - k, "%s", suffix);
    else
        snprintf(v->path + k, sizeof(v->path) - k, ".child%u", i);
    int r = validate_array(v, f, a, depth + 1);
    v->path[k] = '\0';
    return r;
}

static int dictionary(struct vctx *v, const struct manifest_field *f, const struct manifest_array *a)
{
    const uint8_t *idx = v->base + a->buffers[1].off;
    const uint8_t *valid = a->buffers[0].len ? v->base + a->buffers[0].off : NULL;
    int64_t dlen = a->dictionary->length;
    uint64_t w = f->type.width;
    for (uint64_t i = (uint64_t)a->offset; i < (uint64_t)(a->offset + a->length); i++) {
        if (valid && !bit(valid, i))
            continue;
        int64_t x = rd_int(idx + i * w, w, f->type.is_signed);
        if (x < 0 || x >= dlen)
            return vfail(v, f, "dictionary index %lld at slot %llu is outside the dictionary's %lld values",
                         (long long)x, (unsigned long long)(i - (uint64_t)a->offset), (long long)dlen);
    }
    return 0;
}

static int validate_array(struct vctx *v, const struct manifest_field *f, const struct manifest_array *a, unsigned depth)
{
    const struct manifest_type *t = &f->type;
    uint64_t n = (uint64_t)(a->offset + a->length), need;
    int64_t last;
    int r;
    if (depth > MANIFEST_MAX_DEPTH)
        return vfail(v, f, "nested too deep");
    if (t->layout == MANIFEST_NULL)
        return 0;
    /* validity bitmap: absent only without nulls */
    if (a->buffers[0].len == 0) {
        if (a->null_count != 0)
            return vfail(v, f, "null_count %lld without a validity bitmap", (long long)a->null_count);
    } else if ((r = range(v, f, a, 0, (n + 7) / 8)) < 0) {
        return r;
    }
    switch (t->layout) {
    case MANIFEST_BOOL:
        if ((r = range(v, f, a, 1, (n + 7) / 8)) < 0)
            return r;
        break;
    case MANIFEST_FIXED:
        if (__builtin_mul_overflow(n, t->width, &need))
            return vfail(v, f, "offset + length overflows the data buffer size");
        if ((r = range(v, f, a, 1, need)) < 0)
            return r;
        break;
    case MANIFEST_BINARY:
    case MANIFEST_LARGE_BINARY:
        if ((r = range(v, f, a, 2, 0)) < 0 ||
            (r = offsets(v, f, a, t->layout == MANIFEST_BINARY ? 4 : 8, a->buffers[2].len, "data buffer's length", &last)) < 0)
            return r;
        break;
    case MANIFEST_LIST:
    case MANIFEST_LARGE_LIST:
        if ((r = offsets(v, f, a, t->layout == MANIFEST_LIST ? 4 : 8, (uint64_t)a->children[0]->length,
                         "child's length", &last)) < 0)
            return r;
        break;
    case MANIFEST_FIXED_LIST:
        if (__builtin_mul_overflow(n, t->width, &need) || (uint64_t)a->children[0]->length < need)
            return vfail(v, f, "child length %lld is below (offset + length) * %llu",
                         (long long)a->children[0]->length, (unsigned long long)t->width);
        break;
    case MANIFEST_STRUCT:
        for (uint32_t i = 0; i < f->n_children; i++)
            if ((uint64_t)a->children[i]->length < n)
                return vfail(v, f, "child %u's length %lld is below offset + length (%llu)",
                             i, (long long)a->children[i]->length, (unsigned long long)n);
        break;
    default:
        break;
    }
    for (uint32_t i = 0; i < f->n_children; i++)
        if ((r = child(v, f->children[i], a->children[i], depth, NULL, i)) < 0)
            return r;
    if (f->dictionary) {
        if ((r = child(v, f->dictionary, a->dictionary, depth, ".dictionary", 0)) < 0 ||
            (r = dictionary(v, f, a)) < 0)
            return r;
    }
    return 0;
}

int manifest_validate(const struct manifest *m, const uint8_t *base, size_t len, char *err)
{
    struct vctx v = { .base = base, .len = len, .err = err };
    for (uint32_t b = 0; b < m->n_batches; b++) {
        const struct manifest_batch *mb = &m->batches[b];
        for (uint32_t i = 0; i < m->n_columns; i++) {
            snprintf(v.path, sizeof(v.path), "batch %u col%u", b, i);
            if (mb->columns[i]->length < mb->length)
                return vfail(&v, m->columns[i], "length %lld is below the batch's %lld",
                             (long long)mb->columns[i]->length, (long long)mb->length);
            int r = validate_array(&v, m->columns[i], mb->columns[i], 1);
            if (r < 0)
                return r;
        }
    }
    return 0;
}
