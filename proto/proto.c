/* SPDX-License-Identifier: MIT */
/* proto.c: encode and decode shmrefd messages (see proto.h for the format).
 * Decoding is two-pass: proto_check() walks the raw bytes with explicit bounds, then
 * msgpack-c unpacks, then every field's type and range is checked. No I/O, no logging. */
#include "proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

static uint64_t be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* What one msgpack header byte announces: hdr = bytes of length that follow the type
 * byte, fixed = payload bytes known from the type, count = elements (maps: pairs * 2),
 * lenhdr = true when the hdr bytes hold a payload length, container = true for arrays
 * and maps (then the hdr bytes, or the low bits, hold the count). */
struct head {
    unsigned hdr;
    uint64_t fixed;
    bool lenhdr, container, map, bad;
};

static struct head head_of(uint8_t b)
{
    struct head h = {0};
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return h;
    if (b >= 0x80 && b <= 0x9f) {
        h.container = true;
        h.map = b <= 0x8f;
        return h;
    }
    if (b >= 0xa0 && b <= 0xbf) {
        h.fixed = b & 0x1f;
        return h;
    }
    switch (b) {
    case 0xc4: case 0xd9: h.hdr = 1; h.lenhdr = true; break;
    case 0xc5: case 0xda: h.hdr = 2; h.lenhdr = true; break;
    case 0xc6: case 0xdb: h.hdr = 4; h.lenhdr = true; break;
    case 0xca: h.fixed = 4; break;
    case 0xcb: h.fixed = 8; break;
    case 0xcc: case 0xd0: h.fixed = 1; break;
    case 0xcd: case 0xd1: h.fixed = 2; break;
    case 0xce: case 0xd2: h.fixed = 4; break;
    case 0xcf: case 0xd3: h.fixed = 8; break;
    case 0xdc: h.hdr = 2; h.container = true; break;
    case 0xdd: h.hdr = 4; h.container = true; break;
    case 0xde: h.hdr = 2; h.container = true; h.map = true; break;
    case 0xdf: h.hdr = 4; h.container = true; h.map = true; break;
    default: h.bad = true; break;  /* 0xc1 (never used) and every ext type */
    }
    return h;
}

int proto_check(const uint8_t *buf, size_t len, unsigned max_depth, const char **ret_why)
{
    uint64_t left[PROTO_MAX_DEPTH + 2];
    unsigned depth = 0;
    size_t pos = 0;
    const char *why = NULL;

    if (max_depth > PROTO_MAX_DEPTH)
        max_depth = PROTO_MAX_DEPTH;
    left[0] = 1;
    for (;;) {
        while (left[depth] == 0 && depth > 0)
            depth--;
        if (left[depth] == 0)
            break;
        left[depth]--;
        if (pos >= len) { why = "truncated message"; goto fail; }
        uint8_t b = buf[pos++];
        struct head h = head_of(b);
        if (h.bad) { why = "unsupported msgpack type (ext or 0xc1)"; goto fail; }
        if (len - pos < h.hdr) { why = "truncated length header"; goto fail; }
        uint64_t n = h.hdr ? be(buf + pos, h.hdr) : 0;
        pos += h.hdr;
        if (h.container) {
            if (!h.hdr)
                n = b & 0x0f;
            if (h.map)
                n *= 2;
            /* Every element takes at least one byte: a count larger than what is left
             * is a lie, whatever msgpack-c would have allocated for it. */
            if (n > len - pos) { why = "element count exceeds message"; goto fail; }
            if (depth + 1 > max_depth) { why = "nesting too deep"; goto fail; }
            if (n == 0)
                continue;
            left[++depth] = n;
            continue;
        }
        uint64_t payload = h.lenhdr ? n : h.fixed;
        if (payload > len - pos) { why = "length exceeds message"; goto fail; }
        pos += payload;
    }
    if (pos != len) { why = "trailing bytes after message"; goto fail; }
    return 0;
fail:
    if (ret_why)
        *ret_why = why;
    return -EPROTO;
}

/* Field access: each getter fails on a missing field, a wrong type or a value out of
 * range, so a message that decodes has been checked field by field. */
struct fields {
    const msgpack_object *v;
    uint32_t n;
    const char *why;
};

static bool get_u64(struct fields *f, uint32_t i, uint64_t max, uint64_t *ret)
{
    if (i >= f->n) { f->why = "missing field"; return false; }
    if (f->v[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER) { f->why = "field is not an unsigned integer"; return false; }
    if (f->v[i].via.u64 > max) { f->why = "field out of range"; return false; }
    *ret = f->v[i].via.u64;
    return true;
}

static bool get_u32(struct fields *f, uint32_t i, uint32_t max, uint32_t *ret)
{
    uint64_t v;
    if (!get_u64(f, i, max, &v))
        return false;
    *ret = (uint32_t)v;
    return true;
}

static bool get_raw(struct fields *f, uint32_t i, msgpack_object_type type, uint32_t max,
                    const void **ret, uint32_t *ret_len)
{
    if (i >= f->n) { f->why = "missing field"; return false; }
    const msgpack_object *o = &f->v[i];
    if (o->type == MSGPACK_OBJECT_NIL) { *ret = NULL; *ret_len = 0; return true; }
    if (o->type != type) { f->why = type == MSGPACK_OBJECT_STR ? "field is not a string" : "field is not binary"; return false; }
    /* str and bin share layout in msgpack_object's union */
    uint32_t n = type == MSGPACK_OBJECT_STR ? o->via.str.size : o->via.bin.size;
    if (n > max) { f->why = "field too long"; return false; }
    *ret = type == MSGPACK_OBJECT_STR ? (const void *)o->via.str.ptr : (const void *)o->via.bin.ptr;
    *ret_len = n;
    return true;
}

static bool get_token(struct fields *f, uint32_t i, uint8_t *ret)
{
    const void *p;
    uint32_t n;
    if (!get_raw(f, i, MSGPACK_OBJECT_BIN, PROTO_TOKEN_LEN, &p, &n))
        return false;
    if (n != PROTO_TOKEN_LEN) { f->why = "token must be 16 bytes"; return false; }
    memcpy(ret, p, PROTO_TOKEN_LEN);
    return true;
}

static bool get_i32(struct fields *f, uint32_t i, int32_t *ret)
{
    if (i >= f->n) { f->why = "missing field"; return false; }
    const msgpack_object *o = &f->v[i];
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT32_MAX)
        *ret = (int32_t)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= INT32_MIN)
        *ret = (int32_t)o->via.i64;
    else { f->why = "field is not a 32-bit integer"; return false; }
    return true;
}

/* get_batch: field i is an array of 1..PROTO_MAX_BATCH elements, as fields of their own. */
static bool get_batch(struct fields *f, uint32_t i, struct fields *ret, uint32_t *ret_n)
{
    if (i >= f->n) { f->why = "missing field"; return false; }
    const msgpack_object *o = &f->v[i];
    if (o->type != MSGPACK_OBJECT_ARRAY) { f->why = "field is not an array"; return false; }
    if (o->via.array.size == 0 || o->via.array.size > PROTO_MAX_BATCH) { f->why = "batch of 0 or more than PROTO_MAX_BATCH"; return false; }
    *ret = (struct fields){ o->via.array.ptr, o->via.array.size, NULL };
    *ret_n = o->via.array.size;
    return true;
}

static bool decode_fields(struct fields *f, struct proto_msg *m)
{
    const void *p;
    struct fields arr;
    switch (m->op) {
    case PROTO_OP_HELLO:
        if (!get_u32(f, 2, UINT32_MAX, &m->u.hello.version) ||
            !get_u64(f, 3, UINT64_MAX, &m->u.hello.features) ||
            !get_raw(f, 4, MSGPACK_OBJECT_STR, PROTO_MAX_NAME, &p, &m->u.hello.name_len))
            return false;
        m->u.hello.name = p;
        return true;
    case PROTO_OP_HELLO + PROTO_OP_REPLY:
        return get_u32(f, 2, UINT32_MAX, &m->u.hello_reply.version) &&
               get_u64(f, 3, UINT64_MAX, &m->u.hello_reply.features) &&
               get_u32(f, 4, UINT32_MAX, &m->u.hello_reply.max_request) &&
               get_u64(f, 5, UINT64_MAX, &m->u.hello_reply.max_lease) &&
               get_u32(f, 6, UINT32_MAX, &m->u.hello_reply.max_leases) &&
               get_u32(f, 7, UINT32_MAX, &m->u.hello_reply.max_meta) &&
               get_u64(f, 8, UINT32_MAX, &m->u.hello_reply.pid);
    case PROTO_OP_LEASE:
        return get_u64(f, 2, UINT64_MAX, &m->u.lease.size) &&
               get_u32(f, 3, UINT32_MAX, &m->u.lease.flags) &&
               get_u32(f, 4, UINT32_MAX, &m->u.lease.wait_ms);
    case PROTO_OP_LEASE + PROTO_OP_REPLY:
    case PROTO_OP_ACQUIRE + PROTO_OP_REPLY:
    case PROTO_OP_MAP + PROTO_OP_REPLY:
    case PROTO_OP_ADOPT + PROTO_OP_REPLY:
        if (!get_u64(f, 2, UINT64_MAX, &m->u.lease_reply.handle) ||
            !get_u64(f, 3, UINT64_MAX, &m->u.lease_reply.buf_id) ||
            !get_u64(f, 4, UINT64_MAX, &m->u.lease_reply.size) ||
            !get_u64(f, 5, UINT64_MAX, &m->u.lease_reply.capacity) ||
            !get_token(f, 6, m->u.lease_reply.token) ||
            !get_raw(f, 7, MSGPACK_OBJECT_BIN, PROTO_MAX_META, &p, &m->u.lease_reply.meta_len) ||
            !get_u32(f, 8, UINT32_MAX, &m->u.lease_reply.flags))
            return false;
        m->u.lease_reply.meta = p;
        if (m->u.lease_reply.size > m->u.lease_reply.capacity) { f->why = "size exceeds capacity"; return false; }
        return true;
    case PROTO_OP_PUBLISH:
        if (!get_u64(f, 2, UINT64_MAX, &m->u.publish.handle) ||
            !get_u64(f, 3, UINT64_MAX, &m->u.publish.size) ||
            !get_u32(f, 4, UINT32_MAX, &m->u.publish.keep_ms) ||
            !get_raw(f, 5, MSGPACK_OBJECT_BIN, PROTO_MAX_META, &p, &m->u.publish.meta_len) ||
            !get_u32(f, 6, UINT32_MAX, &m->u.publish.flags) ||
            !get_u32(f, 7, UINT32_MAX, &m->u.publish.max_acquires))
            return false;
        m->u.publish.meta = p;
        return true;
    case PROTO_OP_PUBLISH + PROTO_OP_REPLY:
        return get_token(f, 2, m->u.publish_reply.token) &&
               get_u64(f, 3, UINT64_MAX, &m->u.publish_reply.size);
    case PROTO_OP_ACQUIRE:
        return get_token(f, 2, m->u.acquire.token) &&
               get_u32(f, 3, UINT32_MAX, &m->u.acquire.flags) &&
               get_u32(f, 4, UINT32_MAX, &m->u.acquire.wait_ms);
    case PROTO_OP_LEASE_MANY:
        if (!get_batch(f, 2, &arr, &m->u.lease_many.n))
            return false;
        for (uint32_t i = 0; i < m->u.lease_many.n; i++)
            if (!get_u64(&arr, i, UINT64_MAX, &m->u.lease_many.sizes[i])) { f->why = arr.why; return false; }
        return get_u32(f, 3, UINT32_MAX, &m->u.lease_many.flags) &&
               get_u32(f, 4, UINT32_MAX, &m->u.lease_many.wait_ms);
    case PROTO_OP_LEASE_MANY + PROTO_OP_REPLY:
        if (!get_batch(f, 2, &arr, &m->u.lease_many_reply.n))
            return false;
        for (uint32_t i = 0; i < m->u.lease_many_reply.n; i++) {
            struct proto_item *it = &m->u.lease_many_reply.items[i];
            struct fields e;
            if (arr.v[i].type != MSGPACK_OBJECT_ARRAY) { f->why = "batch item is not an array"; return false; }
            e = (struct fields){ arr.v[i].via.array.ptr, arr.v[i].via.array.size, NULL };
            if (!get_u64(&e, 0, UINT64_MAX, &it->handle) || !get_u64(&e, 1, UINT64_MAX, &it->buf_id) ||
                !get_u64(&e, 2, UINT64_MAX, &it->size) || !get_u64(&e, 3, UINT64_MAX, &it->capacity) ||
                !get_token(&e, 4, it->token) || !get_u32(&e, 5, 1, &it->has_fd)) {
                f->why = e.why;
                return false;
            }
            if (it->size > it->capacity) { f->why = "size exceeds capacity"; return false; }
        }
        return true;
    case PROTO_OP_RELEASE_MANY:
        if (!get_batch(f, 2, &arr, &m->u.release_many.n))
            return false;
        for (uint32_t i = 0; i < m->u.release_many.n; i++)
            if (!get_u64(&arr, i, UINT64_MAX, &m->u.release_many.handles[i])) { f->why = arr.why; return false; }
        return get_u32(f, 3, UINT32_MAX, &m->u.release_many.flags);
    case PROTO_OP_RELEASE:
        return get_u64(f, 2, UINT64_MAX, &m->u.release.handle) &&
               get_u32(f, 3, UINT32_MAX, &m->u.release.flags);
    case PROTO_OP_FORGET:
        return get_u64(f, 2, UINT64_MAX, &m->u.forget.buf_id) &&
               get_u32(f, 3, 1, &m->u.forget.writable);
    case PROTO_OP_RETAIN:
        return get_token(f, 2, m->u.retain.token) && get_u32(f, 3, UINT32_MAX, &m->u.retain.keep_ms);
    case PROTO_OP_MAP:
        return get_u64(f, 2, UINT64_MAX, &m->u.map.buf_id);
    case PROTO_OP_GIVEBACK:
        return get_u64(f, 2, UINT64_MAX, &m->u.giveback.buf_id);
    case PROTO_OP_ADOPT:
        return get_u64(f, 2, UINT64_MAX, &m->u.adopt.buf_id) && get_u32(f, 3, UINT32_MAX, &m->u.adopt.seq);
    case PROTO_OP_STATUS + PROTO_OP_REPLY:
        if (!get_raw(f, 2, MSGPACK_OBJECT_BIN, PROTO_MAX_REPLY, &p, &m->u.status_reply.body_len))
            return false;
        m->u.status_reply.body = p;
        return true;
    case PROTO_OP_ERROR:
        if (!get_i32(f, 2, &m->u.error.code) ||
            !get_raw(f, 3, MSGPACK_OBJECT_STR, PROTO_MAX_ERRMSG, &p, &m->u.error.msg_len))
            return false;
        m->u.error.msg = p;
        if (m->u.error.code <= 0) { f->why = "error code must be positive"; return false; }
        return true;
    case PROTO_OP_STATUS:
    case PROTO_OP_PING:
    case PROTO_OP_BYE:
    case PROTO_OP_RELEASE + PROTO_OP_REPLY:
    case PROTO_OP_PING + PROTO_OP_REPLY:
    case PROTO_OP_RELEASE_MANY + PROTO_OP_REPLY:
    case PROTO_OP_RETAIN + PROTO_OP_REPLY:
        return true;
    default:
        return false; /* unknown op: reported as EOPNOTSUPP by the caller */
    }
}

/* has_reply: forget, bye and giveback never have one (nor took and nudge, retired). */
static bool has_reply(uint32_t op)
{
    return (op >= PROTO_OP_HELLO && op <= PROTO_OP_RELEASE_MANY && op != PROTO_OP_FORGET) || op == PROTO_OP_RETAIN ||
           op == PROTO_OP_MAP || op == PROTO_OP_ADOPT;
}

static bool op_known(uint32_t op)
{
    if (op == PROTO_OP_TOOK || op == PROTO_OP_NUDGE) /* retired with the ledger */
        return false;
    if (op == PROTO_OP_ERROR || (op >= PROTO_OP_HELLO && op <= PROTO_OP_ADOPT))
        return true;
    return op > PROTO_OP_REPLY && has_reply(op - PROTO_OP_REPLY);
}

int proto_decode(const uint8_t *buf, size_t len, size_t max_len, struct proto_msg *ret,
                 const char **ret_why)
{
    const char *why = NULL;
    int r = -EPROTO;
    msgpack_unpacked up;
    size_t off = 0;

    memset(ret, 0, sizeof(*ret));
    if (len == 0) { *ret_why = "empty message"; return -EPROTO; }
    if (len > max_len) { *ret_why = "message too large"; return -EPROTO; }
    if (proto_check(buf, len, PROTO_MAX_DEPTH, ret_why) < 0)
        return -EPROTO;

    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, (const char *)buf, len, &off) != MSGPACK_UNPACK_SUCCESS) {
        why = "msgpack unpack failed";
        goto out;
    }
    const msgpack_object *o = &up.data;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 2) {
        why = "message is not an array [op, id, ...]";
        goto out;
    }
    struct fields f = { o->via.array.ptr, o->via.array.size, NULL };
    if (!get_u32(&f, 0, PROTO_OP_ERROR, &ret->op) || !get_u32(&f, 1, UINT32_MAX, &ret->id)) {
        why = "bad op or id";
        goto out;
    }
    if (!op_known(ret->op)) {
        why = "unknown op";
        r = -EOPNOTSUPP;
        goto out;
    }
    if (!decode_fields(&f, ret)) {
        why = f.why ? f.why : "bad fields";
        goto out;
    }
    r = 0;
out:
    msgpack_unpacked_destroy(&up);
    if (r < 0)
        *ret_why = why;
    return r;
}

int proto_buf_write(void *data, const char *buf, size_t len)
{
    struct proto_buf *pb = data;
    if (len == 0)
        return 0;
    if (len > pb->cap - pb->len) {
        pb->overflow = 1;
        return -1;
    }
    memcpy(pb->p + pb->len, buf, len);
    pb->len += len;
    return 0;
}

static void pack_raw(msgpack_packer *pk, bool str, const void *p, uint32_t n)
{
    if (!p && n == 0 && !str) {
        msgpack_pack_nil(pk);
        return;
    }
    if (str) {
        msgpack_pack_str(pk, n);
        msgpack_pack_str_body(pk, p, n);
    } else {
        msgpack_pack_bin(pk, n);
        msgpack_pack_bin_body(pk, p, n);
    }
}

static unsigned field_count(uint32_t op)
{
    switch (op) {
    case PROTO_OP_HELLO: return 3;
    case PROTO_OP_HELLO + PROTO_OP_REPLY: return 7;
    case PROTO_OP_LEASE: return 3;
    case PROTO_OP_LEASE + PROTO_OP_REPLY:
    case PROTO_OP_ACQUIRE + PROTO_OP_REPLY: return 7;
    case PROTO_OP_PUBLISH: return 6;
    case PROTO_OP_PUBLISH + PROTO_OP_REPLY: return 2;
    case PROTO_OP_ACQUIRE: return 3;
    case PROTO_OP_LEASE_MANY: return 3;
    case PROTO_OP_LEASE_MANY + PROTO_OP_REPLY: return 1;
    case PROTO_OP_RELEASE_MANY: return 2;
    case PROTO_OP_RELEASE: return 2;
    case PROTO_OP_FORGET: return 2;
    case PROTO_OP_RETAIN: return 2;
    case PROTO_OP_MAP: return 1;
    case PROTO_OP_GIVEBACK: return 1;
    case PROTO_OP_ADOPT: return 2;
    case PROTO_OP_MAP + PROTO_OP_REPLY:
    case PROTO_OP_ADOPT + PROTO_OP_REPLY: return 7;
    case PROTO_OP_STATUS + PROTO_OP_REPLY: return 1;
    case PROTO_OP_ERROR: return 2;
    default: return 0;
    }
}

int proto_encode(const struct proto_msg *m, uint8_t *buf, size_t cap)
{
    struct proto_buf fb = { buf, 0, cap, 0 };
    msgpack_packer pk;
    msgpack_packer_init(&pk, &fb, proto_buf_write);

    msgpack_pack_array(&pk, 2 + field_count(m->op));
    msgpack_pack_uint32(&pk, m->op);
    msgpack_pack_uint32(&pk, m->id);
    switch (m->op) {
    case PROTO_OP_HELLO:
        msgpack_pack_uint32(&pk, m->u.hello.version);
        msgpack_pack_uint64(&pk, m->u.hello.features);
        pack_raw(&pk, true, m->u.hello.name ? m->u.hello.name : "", m->u.hello.name_len);
        break;
    case PROTO_OP_HELLO + PROTO_OP_REPLY:
        msgpack_pack_uint32(&pk, m->u.hello_reply.version);
        msgpack_pack_uint64(&pk, m->u.hello_reply.features);
        msgpack_pack_uint32(&pk, m->u.hello_reply.max_request);
        msgpack_pack_uint64(&pk, m->u.hello_reply.max_lease);
        msgpack_pack_uint32(&pk, m->u.hello_reply.max_leases);
        msgpack_pack_uint32(&pk, m->u.hello_reply.max_meta);
        msgpack_pack_uint64(&pk, m->u.hello_reply.pid);
        break;
    case PROTO_OP_LEASE:
        msgpack_pack_uint64(&pk, m->u.lease.size);
        msgpack_pack_uint32(&pk, m->u.lease.flags);
        msgpack_pack_uint32(&pk, m->u.lease.wait_ms);
        break;
    case PROTO_OP_LEASE + PROTO_OP_REPLY:
    case PROTO_OP_ACQUIRE + PROTO_OP_REPLY:
    case PROTO_OP_MAP + PROTO_OP_REPLY:
    case PROTO_OP_ADOPT + PROTO_OP_REPLY:
        msgpack_pack_uint64(&pk, m->u.lease_reply.handle);
        msgpack_pack_uint64(&pk, m->u.lease_reply.buf_id);
        msgpack_pack_uint64(&pk, m->u.lease_reply.size);
        msgpack_pack_uint64(&pk, m->u.lease_reply.capacity);
        pack_raw(&pk, false, m->u.lease_reply.token, PROTO_TOKEN_LEN);
        pack_raw(&pk, false, m->u.lease_reply.meta, m->u.lease_reply.meta_len);
        msgpack_pack_uint32(&pk, m->u.lease_reply.flags);
        break;
    case PROTO_OP_LEASE_MANY:
        if (m->u.lease_many.n > PROTO_MAX_BATCH)
            return -EMSGSIZE;
        msgpack_pack_array(&pk, m->u.lease_many.n);
        for (uint32_t i = 0; i < m->u.lease_many.n; i++)
            msgpack_pack_uint64(&pk, m->u.lease_many.sizes[i]);
        msgpack_pack_uint32(&pk, m->u.lease_many.flags);
        msgpack_pack_uint32(&pk, m->u.lease_many.wait_ms);
        break;
    case PROTO_OP_LEASE_MANY + PROTO_OP_REPLY:
        if (m->u.lease_many_reply.n > PROTO_MAX_BATCH)
            return -EMSGSIZE;
        msgpack_pack_array(&pk, m->u.lease_many_reply.n);
        for (uint32_t i = 0; i < m->u.lease_many_reply.n; i++) {
            const struct proto_item *it = &m->u.lease_many_reply.items[i];
            msgpack_pack_array(&pk, 6);
            msgpack_pack_uint64(&pk, it->handle);
            msgpack_pack_uint64(&pk, it->buf_id);
            msgpack_pack_uint64(&pk, it->size);
            msgpack_pack_uint64(&pk, it->capacity);
            pack_raw(&pk, false, it->token, PROTO_TOKEN_LEN);
            msgpack_pack_uint32(&pk, it->has_fd ? 1 : 0);
        }
        break;
    case PROTO_OP_RELEASE_MANY:
        if (m->u.release_many.n > PROTO_MAX_BATCH)
            return -EMSGSIZE;
        msgpack_pack_array(&pk, m->u.release_many.n);
        for (uint32_t i = 0; i < m->u.release_many.n; i++)
            msgpack_pack_uint64(&pk, m->u.release_many.handles[i]);
        msgpack_pack_uint32(&pk, m->u.release_many.flags);
        break;
    case PROTO_OP_PUBLISH:
        msgpack_pack_uint64(&pk, m->u.publish.handle);
        msgpack_pack_uint64(&pk, m->u.publish.size);
        msgpack_pack_uint32(&pk, m->u.publish.keep_ms);
        pack_raw(&pk, false, m->u.publish.meta, m->u.publish.meta_len);
        msgpack_pack_uint32(&pk, m->u.publish.flags);
        msgpack_pack_uint32(&pk, m->u.publish.max_acquires);
        break;
    case PROTO_OP_PUBLISH + PROTO_OP_REPLY:
        pack_raw(&pk, false, m->u.publish_reply.token, PROTO_TOKEN_LEN);
        msgpack_pack_uint64(&pk, m->u.publish_reply.size);
        break;
    case PROTO_OP_ACQUIRE:
        pack_raw(&pk, false, m->u.acquire.token, PROTO_TOKEN_LEN);
        msgpack_pack_uint32(&pk, m->u.acquire.flags);
        msgpack_pack_uint32(&pk, m->u.acquire.wait_ms);
        break;
    case PROTO_OP_RELEASE:
        msgpack_pack_uint64(&pk, m->u.release.handle);
        msgpack_pack_uint32(&pk, m->u.release.flags);
        break;
    case PROTO_OP_FORGET:
        msgpack_pack_uint64(&pk, m->u.forget.buf_id);
        msgpack_pack_uint32(&pk, m->u.forget.writable);
        break;
    case PROTO_OP_RETAIN:
        pack_raw(&pk, false, m->u.retain.token, PROTO_TOKEN_LEN);
        msgpack_pack_uint32(&pk, m->u.retain.keep_ms);
        break;
    case PROTO_OP_MAP:
        msgpack_pack_uint64(&pk, m->u.map.buf_id);
        break;
    case PROTO_OP_GIVEBACK:
        msgpack_pack_uint64(&pk, m->u.giveback.buf_id);
        break;
    case PROTO_OP_ADOPT:
        msgpack_pack_uint64(&pk, m->u.adopt.buf_id);
        msgpack_pack_uint32(&pk, m->u.adopt.seq);
        break;
    case PROTO_OP_STATUS + PROTO_OP_REPLY:
        pack_raw(&pk, false, m->u.status_reply.body, m->u.status_reply.body_len);
        break;
    case PROTO_OP_ERROR:
        msgpack_pack_int32(&pk, m->u.error.code);
        pack_raw(&pk, true, m->u.error.msg ? m->u.error.msg : "", m->u.error.msg_len);
        break;
    default:
        break;
    }
    if (fb.overflow)
        return -EMSGSIZE;
    return (int)fb.len;
}

int proto_encode_error(uint32_t id, int code, uint8_t *buf, size_t cap, const char *fmt, ...)
{
    char text[PROTO_MAX_ERRMSG + 1];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if (n > PROTO_MAX_ERRMSG)
        n = PROTO_MAX_ERRMSG;
    struct proto_msg m = { .op = PROTO_OP_ERROR, .id = id };
    /* Codes travel as positive errno values; anything unrepresentable becomes EIO. */
    m.u.error.code = code > 0 ? code : code < 0 && code != INT32_MIN ? -code : EIO;
    m.u.error.msg = text;
    m.u.error.msg_len = (uint32_t)n;
    return proto_encode(&m, buf, cap);
}

const char *proto_op_name(uint32_t op)
{
    static const char *const names[] = {
        [PROTO_OP_HELLO] = "hello", [PROTO_OP_LEASE] = "lease", [PROTO_OP_PUBLISH] = "publish",
        [PROTO_OP_ACQUIRE] = "acquire", [PROTO_OP_RELEASE] = "release",
        [PROTO_OP_STATUS] = "status", [PROTO_OP_PING] = "ping", [PROTO_OP_FORGET] = "forget",
        [PROTO_OP_LEASE_MANY] = "lease_many", [PROTO_OP_RELEASE_MANY] = "release_many",
        [PROTO_OP_BYE] = "bye",
        [PROTO_OP_RETAIN] = "retain", [PROTO_OP_MAP] = "map", [PROTO_OP_GIVEBACK] = "giveback",
        [PROTO_OP_ADOPT] = "adopt",
    };
    if (op == PROTO_OP_ERROR)
        return "error";
    if (op > PROTO_OP_REPLY && has_reply(op - PROTO_OP_REPLY))
        op -= PROTO_OP_REPLY; /* forget, took, nudge and bye have no reply */
    else if (op > PROTO_OP_ADOPT)
        return "unknown";
    if (names[op])
        return names[op];
    return "unknown";
}
