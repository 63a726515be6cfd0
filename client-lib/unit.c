/* SPDX-License-Identifier: MIT */
/* unit.c: units of work: a producer's lease with a bump allocator of 64-byte aligned
 * ranges and the manifest it builds, published once; a consumer's acquire, which checks
 * the whole manifest against the buffer before anything is handed out, and the holder
 * whose last reference gives the buffer back (see unit.h). Arrow structures: arrow.c. */
#include "unit.h"

#include "lease.h"
#include "session.h"
#include "transport.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmref/shmref.h"

#define ALIGN_UP(x) (((x) + (SHMREF_UNIT_ALIGN - 1)) & ~(size_t)(SHMREF_UNIT_ALIGN - 1))

/* ---- the holder ---- */

void unit_holder_ref(struct unit_holder *h)
{
    atomic_fetch_add(&h->refs, 1);
}

void unit_holder_unref(struct unit_holder *h)
{
    if (atomic_fetch_sub(&h->refs, 1) != 1)
        return;
    manifest_free(h->m);
    client_unpin(h->buf);
    free(h);
}

/* ---- the producer ---- */

int shmref_unit_begin(shmref_conn *conn, size_t size, shmref_unit **ret_unit)
{
    if (!conn)
        return -EINVAL;
    if (!ret_unit || size == 0)
        return client_fail(conn, -EINVAL, "unit_begin: size must be at least 1 and ret_unit not NULL");
    shmref_unit *u = calloc(1, sizeof(*u));
    if (!u || !(u->m = manifest_new())) {
        free(u);
        return client_fail(conn, -ENOMEM, "out of memory");
    }
    int r = lease_plain(conn, size, conn->lease_wait_ms, &u->buf);
    if (r < 0) {
        manifest_free(u->m);
        free(u);
        return r;
    }
    u->conn = conn;
    u->producer = true;
    u->base = shmref_buf_data(u->buf);
    u->size = shmref_buf_size(u->buf);
    *ret_unit = u;
    return 0;
}

int shmref_unit_claim(shmref_unit *u, size_t len, uint64_t *ret_offset, void **ret_ptr)
{
    if (!u || !u->producer)
        return -EINVAL;
    if (u->published)
        return client_fail(u->conn, -EPERM, "unit_claim: the unit is published");
    if (!u->base)
        return client_fail(u->conn, -EPERM, "unit_claim: the unit's mapping is gone (a sealed publish failed)");
    size_t at = ALIGN_UP(u->used);
    if (at > u->size || len > u->size - at)
        return client_fail(u->conn, -ENOSPC, "unit of %zu bytes is full: %zu used, %zu more asked",
                           u->size, at, len);
    u->used = at + len;
    if (ret_offset)
        *ret_offset = at;
    if (ret_ptr)
        *ret_ptr = u->base + at;
    return 0;
}

static struct unit_batch *current_batch(shmref_unit *u)
{
    if (u->n_batches == 0 && shmref_unit_next_batch(u) < 0)
        return NULL;
    return &u->batches[u->n_batches - 1];
}

static bool fields_equal(const struct manifest_field *a, const struct manifest_field *b)
{
    if (strcmp(a->name, b->name) || strcmp(a->format, b->format) || a->n_children != b->n_children ||
        !a->dictionary != !b->dictionary)
        return false;
    for (uint32_t i = 0; i < a->n_children; i++)
        if (!fields_equal(a->children[i], b->children[i]))
            return false;
    return !a->dictionary || fields_equal(a->dictionary, b->dictionary);
}

int unit_add_field(shmref_unit *u, struct manifest_field *f)
{
    if (u->n_batches > 0)
        return client_fail(u->conn, -EINVAL, "unit_add_field: only before the first batch");
    if (u->n_fields == u->cap_fields) {
        uint32_t cap = u->cap_fields ? u->cap_fields * 2 : 16;
        struct manifest_field **v = realloc(u->fields, cap * sizeof(*v));
        if (!v)
            return client_fail(u->conn, -ENOMEM, "out of memory");
        u->fields = v;
        u->cap_fields = cap;
    }
    u->fields[u->n_fields++] = f;
    return 0;
}

int unit_add_column(shmref_unit *u, struct manifest_field *f, struct manifest_array *a)
{
    struct unit_batch *b = current_batch(u);
    if (!b)
        return client_fail(u->conn, -ENOMEM, "out of memory");
    if (u->n_batches == 1) {
        if (u->n_fields == u->cap_fields) {
            uint32_t cap = u->cap_fields ? u->cap_fields * 2 : 16;
            struct manifest_field **v = realloc(u->fields, cap * sizeof(*v));
            if (!v)
                return client_fail(u->conn, -ENOMEM, "out of memory");
            u->fields = v;
            u->cap_fields = cap;
        }
        u->fields[u->n_fields++] = f;
    } else if (b->n >= u->n_fields || !fields_equal(f, u->fields[b->n])) {
        return client_fail(u->conn, -EINVAL, "batch %u column %u (\"%s\", format \"%s\") is not the first batch's",
                           u->n_batches - 1, b->n, f->name, f->format);
    }
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? b->cap * 2 : 16;
        struct manifest_array **v = realloc(b->cols, cap * sizeof(*v));
        if (!v) {
            if (u->n_batches == 1)
                u->n_fields--;
            return client_fail(u->conn, -ENOMEM, "out of memory");
        }
        b->cols = v;
        b->cap = cap;
    }
    b->cols[b->n++] = a;
    return 0;
}

int shmref_unit_next_batch(shmref_unit *u)
{
    if (!u || !u->producer)
        return -EINVAL;
    if (u->published)
        return client_fail(u->conn, -EPERM, "unit_next_batch: the unit is published");
    if (u->n_batches > 0 && u->batches[u->n_batches - 1].n != u->n_fields)
        return client_fail(u->conn, -EINVAL, "batch %u has %u columns, the first batch %u",
                           u->n_batches - 1, u->batches[u->n_batches - 1].n, u->n_fields);
    if (u->n_batches == u->cap_batches) {
        uint32_t cap = u->cap_batches ? u->cap_batches * 2 : 4;
        struct unit_batch *v = realloc(u->batches, cap * sizeof(*v));
        if (!v)
            return client_fail(u->conn, -ENOMEM, "out of memory");
        u->batches = v;
        u->cap_batches = cap;
    }
    u->batches[u->n_batches++] = (struct unit_batch){0};
    return 0;
}

int shmref_unit_add_buffers(shmref_unit *u, const char *name, const char *format, int64_t flags,
                            int64_t length, int64_t null_count, int n_buffers,
                            const uint64_t *offsets, const uint64_t *lengths)
{
    struct manifest_type t;
    if (!u || !u->producer)
        return -EINVAL;
    if (u->published)
        return client_fail(u->conn, -EPERM, "unit_add_buffers: the unit is published");
    if (!format || manifest_type_parse(format, &t) < 0)
        return client_fail(u->conn, -EINVAL, "unit_add_buffers: unsupported format \"%s\"", format ? format : "(null)");
    if (t.layout == MANIFEST_LIST || t.layout == MANIFEST_LARGE_LIST || t.layout == MANIFEST_FIXED_LIST ||
        t.layout == MANIFEST_STRUCT)
        return client_fail(u->conn, -EINVAL, "unit_add_buffers: format \"%s\" has children: use unit_add_array", format);
    if (n_buffers != (int)t.n_buffers || (n_buffers && (!offsets || !lengths)))
        return client_fail(u->conn, -EINVAL, "unit_add_buffers: format \"%s\" has %u buffers, %d given",
                           format, t.n_buffers, n_buffers);
    if (length < 0 || null_count < -1 || null_count > length || flags < 0 || flags > 7)
        return client_fail(u->conn, -EINVAL, "unit_add_buffers: bad length, null_count or flags");
    struct manifest_field *f = manifest_alloc(u->m, sizeof(*f));
    struct manifest_array *a = manifest_alloc(u->m, sizeof(*a));
    if (!f || !a || !(f->name = manifest_strndup(u->m, name ? name : "", name ? strlen(name) : 0)) ||
        !(f->format = manifest_strndup(u->m, format, strlen(format))))
        return client_fail(u->conn, -ENOMEM, "out of memory");
    f->type = t;
    f->flags = flags;
    a->length = length;
    a->null_count = null_count;
    for (int i = 0; i < n_buffers; i++) {
        if (lengths[i] && (offsets[i] % SHMREF_UNIT_ALIGN || offsets[i] > u->used || lengths[i] > u->used - offsets[i]))
            return client_fail(u->conn, -EINVAL, "unit_add_buffers: buffer %d [%llu, +%llu) is not an aligned claimed range",
                               i, (unsigned long long)offsets[i], (unsigned long long)lengths[i]);
        a->buffers[i] = (struct manifest_range){ lengths[i] ? offsets[i] : 0, lengths[i] };
    }
    return unit_add_column(u, f, a);
}

/* build: the manifest's columns and batches from what was added. */
static int build(shmref_unit *u)
{
    struct manifest *m = u->m;
    m->n_columns = u->n_fields;
    if (u->n_fields && !(m->columns = manifest_alloc(m, u->n_fields * sizeof(*m->columns))))
        return client_fail(u->conn, -ENOMEM, "out of memory");
    if (u->n_fields)
        memcpy(m->columns, u->fields, u->n_fields * sizeof(*m->columns));
    m->n_batches = 0;
    for (uint32_t b = 0; b < u->n_batches; b++) {
        struct unit_batch *ub = &u->batches[b];
        if (ub->n != u->n_fields)
            return client_fail(u->conn, -EINVAL, "batch %u has %u columns, the first batch %u", b, ub->n, u->n_fields);
        struct manifest_batch *mb = manifest_add_batch(m, ub->n ? ub->cols[0]->length : 0);
        if (!mb)
            return client_fail(u->conn, -ENOMEM, "out of memory");
        for (uint32_t i = 0; i < ub->n; i++) {
            if (ub->cols[i]->length < mb->length)
                return client_fail(u->conn, -EINVAL, "batch %u column %u has %lld rows, column 0 %lld",
                                   b, i, (long long)ub->cols[i]->length, (long long)mb->length);
            mb->columns[i] = ub->cols[i];
        }
    }
    return 0;
}

int shmref_unit_publish(shmref_unit *u, uint32_t keep_ms, shmref_desc *ret_desc)
{
    return shmref_unit_publish_ex(u, keep_ms, 0, 0, ret_desc);
}

int shmref_unit_publish_ex(shmref_unit *u, uint32_t keep_ms, uint32_t max_acquires, unsigned flags,
                           shmref_desc *ret_desc)
{
    if (!u || !u->producer || !ret_desc)
        return -EINVAL;
    if (flags & ~SHMREF_PUBLISH_SEALED)
        return client_fail(u->conn, -EINVAL, "unit_publish: unknown flags %#x", flags & ~SHMREF_PUBLISH_SEALED);
    if (u->published)
        return client_fail(u->conn, -EALREADY, "unit_publish: the unit is published already");
    if (!u->base)
        return client_fail(u->conn, -EPERM, "unit_publish: the unit's mapping is gone (a sealed publish failed)");
    bool sealed = flags & SHMREF_PUBLISH_SEALED;
    if (sealed && !(u->conn->features & PROTO_FEAT_SEALED))
        return client_fail(u->conn, -EOPNOTSUPP, "this shmrefd does not take sealed publishes");
    int r = build(u);
    if (r < 0)
        return r;
    uint8_t *mb = NULL, *env = NULL;
    size_t mlen, elen;
    if ((r = manifest_encode(u->m, &mb, &mlen)) < 0)
        return client_fail(u->conn, r, "manifest_encode: %s", r == -ENOMEM ? "out of memory" : "incomplete unit");
    if ((r = manifest_envelope_inline(mb, mlen, &env, &elen)) < 0) {
        free(mb);
        return client_fail(u->conn, r, "out of memory");
    }
    if (elen > SHMREF_META_MAX) { /* too big for the metadata: keep it in the buffer */
        free(env);
        env = NULL;
        uint64_t at;
        void *p;
        if ((r = shmref_unit_claim(u, mlen, &at, &p)) < 0) {
            free(mb);
            return client_fail(u->conn, r, "the manifest (%zu bytes, over the %d bytes of metadata) does not fit: "
                               "the unit has %zu bytes, %zu used", mlen, SHMREF_META_MAX, u->size, u->used);
        }
        memcpy(p, mb, mlen);
        if ((r = manifest_envelope_at(at, mlen, &env, &elen)) < 0) {
            free(mb);
            return client_fail(u->conn, r, "out of memory");
        }
    }
    free(mb);
    r = shmref_publish_ex(u->buf, u->used, keep_ms, max_acquires, flags, env, elen, ret_desc);
    free(env);
    if (sealed && !shmref_buf_data(u->buf))
        u->base = NULL; /* unmapped for the seal, whether it held or not */
    if (r == 0) {
        u->published = true;
        u->sealed = sealed;
    }
    return r;
}

/* ---- the consumer ---- */

/* load: the manifest of an acquired buffer, decoded and checked. */
static int load(shmref_conn *conn, shmref_buf *buf, struct manifest **ret)
{
    char err[MANIFEST_ERR_MAX] = "";
    size_t mlen;
    const uint8_t *meta = shmref_buf_meta(buf, &mlen);
    const uint8_t *base = shmref_buf_data(buf);
    size_t size = shmref_buf_size(buf);
    struct manifest *m = NULL;
    uint64_t at = 0, n = 0;
    if (!meta)
        return client_fail(conn, -EBADMSG, "not a unit of work: the buffer has no metadata");
    int r = manifest_envelope_decode(meta, mlen, &m, &at, &n, err);
    if (r == 0 && !m) {
        if (at > size || n > size - at) {
            snprintf(err, sizeof(err), "manifest_at [%llu, +%llu) lies outside the %zu published bytes",
                     (unsigned long long)at, (unsigned long long)n, size);
            r = -EBADMSG;
        } else {
            /* a private copy: the producer's uid could still change the shared bytes */
            uint8_t *copy = malloc(n ? n : 1);
            if (!copy)
                return client_fail(conn, -ENOMEM, "out of memory");
            memcpy(copy, base + at, n);
            r = manifest_decode(copy, n, &m, err);
            free(copy);
        }
    }
    if (r == 0 && (r = manifest_validate(m, base, size, err)) < 0) {
        manifest_free(m);
        m = NULL;
    }
    if (r < 0)
        return client_fail(conn, r, "%s", err);
    *ret = m;
    return 0;
}

/* refuse_unsealed: another uid's unsealed unit, unless the caller trusts its producer:
 * that producer keeps write access, so whatever load() checks now it may change later
 * (an offsets buffer rewritten after the check sends an Arrow reader outside the
 * mapping). Same-uid producers are not refused: they could ptrace the consumer anyway. */
static int refuse_unsealed(shmref_conn *conn, const shmref_buf *buf, unsigned flags)
{
    if (buf->sealed || !buf->foreign || (flags & SHMREF_ACQUIRE_TRUST_PRODUCER))
        return 0;
    if (!(conn->features & PROTO_FEAT_FOREIGN))
        return client_fail(conn, -EPERM, "the unit is not sealed and this shmrefd does not say whose it is: "
                           "an unsealed unit of another uid can be rewritten by its producer after it is checked "
                           "(publish it sealed on a memfd pool, or acquire with SHMREF_ACQUIRE_TRUST_PRODUCER)");
    return client_fail(conn, -EPERM, "the unit is another uid's and not sealed: its producer can rewrite it after "
                       "it is checked (publish it with SHMREF_PUBLISH_SEALED on a memfd pool, shmrefd --memfd; or "
                       "acquire with SHMREF_ACQUIRE_TRUST_PRODUCER if you trust that producer)");
}

int shmref_unit_acquire(shmref_conn *conn, const shmref_desc *desc, shmref_unit **ret_unit)
{
    return shmref_unit_acquire_ex(conn, desc, 0, ret_unit);
}

int shmref_unit_acquire_ex(shmref_conn *conn, const shmref_desc *desc, unsigned flags, shmref_unit **ret_unit)
{
    const unsigned known = SHMREF_ACQUIRE_SEALED | SHMREF_ACQUIRE_TRUST_PRODUCER;
    if (!conn)
        return -EINVAL;
    if (!desc || !ret_unit || (flags & ~known))
        return client_fail(conn, -EINVAL, "unit_acquire: desc and ret_unit must not be NULL, flags known");
    shmref_buf *buf;
    struct manifest *m = NULL;
    /* Through the daemon, never a table hold: the buffer may be pinned past shmref_close,
     * and the journal ends with the connection. */
    int r = lease_acquire(conn, desc, flags & SHMREF_ACQUIRE_SEALED, false, &buf);
    if (r < 0)
        return r;
    if ((r = refuse_unsealed(conn, buf, flags)) < 0 || (r = load(conn, buf, &m)) < 0) {
        char keep[sizeof(conn->errmsg)];
        memcpy(keep, conn->errmsg, sizeof(keep));
        shmref_release(buf);
        memcpy(conn->errmsg, keep, sizeof(keep));
        return r;
    }
    shmref_unit *u = calloc(1, sizeof(*u));
    struct unit_holder *h = calloc(1, sizeof(*h));
    if (!u || !h) {
        free(u);
        free(h);
        manifest_free(m);
        shmref_release(buf);
        return client_fail(conn, -ENOMEM, "out of memory");
    }
    atomic_init(&h->refs, 1);
    h->buf = buf;
    h->base = shmref_buf_data(buf);
    h->len = shmref_buf_size(buf);
    h->m = m;
    client_pin(buf);
    u->conn = conn;
    u->h = h;
    *ret_unit = u;
    return 0;
}

const struct manifest *unit_manifest_of(const shmref_unit *u)
{
    return u->producer ? NULL : u->h->m;
}

int shmref_unit_n_batches(const shmref_unit *u)
{
    if (!u)
        return -EINVAL;
    return u->producer ? (int)u->n_batches : (int)u->h->m->n_batches;
}

int shmref_unit_n_columns(const shmref_unit *u)
{
    if (!u)
        return -EINVAL;
    return u->producer ? (int)u->n_fields : (int)u->h->m->n_columns;
}

const char *shmref_unit_column_name(const shmref_unit *u, int column)
{
    if (!u || column < 0 || column >= shmref_unit_n_columns(u))
        return NULL;
    return u->producer ? u->fields[column]->name : u->h->m->columns[column]->name;
}

int shmref_unit_column_index(const shmref_unit *u, const char *name)
{
    if (!u || !name)
        return -EINVAL;
    int n = shmref_unit_n_columns(u);
    for (int i = 0; i < n; i++)
        if (!strcmp(shmref_unit_column_name(u, i), name))
            return i;
    return -ENOENT;
}

int64_t shmref_unit_batch_length(const shmref_unit *u, int batch)
{
    if (!u || batch < 0 || batch >= shmref_unit_n_batches(u))
        return -EINVAL;
    if (!u->producer)
        return u->h->m->batches[batch].length;
    const struct unit_batch *b = &u->batches[batch];
    return b->n ? b->cols[0]->length : 0;
}

const void *shmref_unit_data(const shmref_unit *u)
{
    return !u ? NULL : u->producer ? (const void *)u->base : (const void *)u->h->base;
}

size_t shmref_unit_size(const shmref_unit *u)
{
    return !u ? 0 : u->producer ? u->size : u->h->len;
}

int shmref_unit_sealed(const shmref_unit *u)
{
    if (!u)
        return -EINVAL;
    return u->producer ? u->sealed : shmref_buf_sealed(u->h->buf);
}

int shmref_unit_release(shmref_unit *u)
{
    if (!u)
        return 0;
    int r = 0;
    if (u->producer) {
        r = shmref_release(u->buf);
        for (uint32_t b = 0; b < u->n_batches; b++)
            free(u->batches[b].cols);
        free(u->batches);
        free(u->fields);
        manifest_free(u->m);
    } else {
        unit_holder_unref(u->h);
    }
    free(u);
    return r;
}
