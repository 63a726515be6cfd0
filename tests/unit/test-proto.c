/* SPDX-License-Identifier: MIT */
/* test-proto.c: the shmrefd wire format (proto/proto.c). Every op round-trips field by
 * field; hand-built hostile byte strings and a deterministic fuzz loop must decode to
 * 0, -EPROTO or -EOPNOTSUPP and never read outside the message (run under ASan in CI). */
#include <criterion/criterion.h>

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#define REPLY(op) ((op) + PROTO_OP_REPLY)

static const uint32_t known_ops[] = {
    PROTO_OP_HELLO, PROTO_OP_LEASE, PROTO_OP_PUBLISH, PROTO_OP_ACQUIRE, PROTO_OP_RELEASE,
    PROTO_OP_STATUS, PROTO_OP_PING, PROTO_OP_FORGET,
    REPLY(PROTO_OP_HELLO), REPLY(PROTO_OP_LEASE), REPLY(PROTO_OP_PUBLISH),
    REPLY(PROTO_OP_ACQUIRE), REPLY(PROTO_OP_RELEASE), REPLY(PROTO_OP_STATUS),
    REPLY(PROTO_OP_PING), PROTO_OP_ERROR,
    PROTO_OP_LEASE_MANY, REPLY(PROTO_OP_LEASE_MANY), PROTO_OP_RELEASE_MANY, REPLY(PROTO_OP_RELEASE_MANY),
    PROTO_OP_BYE, PROTO_OP_RETAIN, REPLY(PROTO_OP_RETAIN),
    PROTO_OP_MAP, REPLY(PROTO_OP_MAP), PROTO_OP_GIVEBACK, PROTO_OP_ADOPT, REPLY(PROTO_OP_ADOPT),
};
#define N_KNOWN_OPS (sizeof(known_ops) / sizeof(known_ops[0]))

static const uint8_t sample_meta[] = { 'f', 'r', 'a', 'm', 'e', 0x00, 0x01, 0xff, 0xc1, 0xdd };
/* {"leases": 3}: a status body is itself msgpack */
static const uint8_t sample_body[] = { 0x81, 0xa6, 'l', 'e', 'a', 's', 'e', 's', 0x03 };

static void fill_token(uint8_t *token, uint8_t salt)
{
    for (unsigned i = 0; i < PROTO_TOKEN_LEN; i++)
        token[i] = (uint8_t)(i * 17u + salt);
}

/* A valid message for any op, with field values that differ from one field to the next
 * so a swapped field cannot go unnoticed. */
static void make_msg(uint32_t op, uint32_t id, struct proto_msg *m)
{
    memset(m, 0, sizeof(*m));
    m->op = op;
    m->id = id;
    switch (op) {
    case PROTO_OP_HELLO:
        m->u.hello.version = PROTO_VERSION;
        m->u.hello.features = PROTO_FEAT_NOREPLY_RELEASE;
        m->u.hello.name = "producer-1";
        m->u.hello.name_len = 10;
        break;
    case REPLY(PROTO_OP_HELLO):
        m->u.hello_reply.version = PROTO_VERSION;
        m->u.hello_reply.features = PROTO_FEAT_NOREPLY_RELEASE;
        m->u.hello_reply.max_request = PROTO_MAX_REQUEST;
        m->u.hello_reply.max_lease = UINT64_C(1) << 32;
        m->u.hello_reply.max_leases = 64;
        m->u.hello_reply.max_meta = PROTO_MAX_META;
        m->u.hello_reply.pid = 4242;
        break;
    case PROTO_OP_LEASE:
        m->u.lease.size = 83886080;
        m->u.lease.flags = 2;
        m->u.lease.wait_ms = 1500;
        break;
    case REPLY(PROTO_OP_LEASE):
    case REPLY(PROTO_OP_ACQUIRE):
    case REPLY(PROTO_OP_MAP):
    case REPLY(PROTO_OP_ADOPT):
        m->u.lease_reply.handle = 3;
        m->u.lease_reply.buf_id = (UINT64_C(1) << 40) | 7;
        fill_token(m->u.lease_reply.token, 3);
        m->u.lease_reply.flags = PROTO_BUF_SEALED;
        m->u.lease_reply.size = 4096;
        m->u.lease_reply.capacity = 65536;
        m->u.lease_reply.meta = sample_meta;
        m->u.lease_reply.meta_len = sizeof(sample_meta);
        break;
    case PROTO_OP_PUBLISH:
        m->u.publish.handle = 3;
        m->u.publish.size = 4000;
        m->u.publish.keep_ms = 250;
        m->u.publish.meta = sample_meta;
        m->u.publish.meta_len = sizeof(sample_meta);
        m->u.publish.flags = PROTO_PUBLISH_NOREPLY;
        m->u.publish.max_acquires = 9;
        break;
    case REPLY(PROTO_OP_PUBLISH):
        fill_token(m->u.publish_reply.token, 1);
        m->u.publish_reply.size = 4000;
        break;
    case PROTO_OP_ACQUIRE:
        fill_token(m->u.acquire.token, 2);
        m->u.acquire.flags = 6;
        m->u.acquire.wait_ms = 250;
        break;
    case PROTO_OP_LEASE_MANY:
        m->u.lease_many.n = 3;
        m->u.lease_many.sizes[0] = 4096;
        m->u.lease_many.sizes[1] = UINT64_C(1) << 33;
        m->u.lease_many.sizes[2] = 1;
        m->u.lease_many.flags = 4;
        m->u.lease_many.wait_ms = 7;
        break;
    case REPLY(PROTO_OP_LEASE_MANY):
        m->u.lease_many_reply.n = 2;
        for (uint32_t i = 0; i < 2; i++) {
            struct proto_item *it = &m->u.lease_many_reply.items[i];
            it->handle = (UINT64_C(1) << 32) + i;
            it->buf_id = 40 + i;
            it->size = 100 + i;
            it->capacity = 4096 * (i + 1);
            fill_token(it->token, (uint8_t)(9 + i));
            it->has_fd = i == 0;
        }
        break;
    case PROTO_OP_RELEASE_MANY:
        m->u.release_many.n = 2;
        m->u.release_many.handles[0] = 12;
        m->u.release_many.handles[1] = UINT64_MAX;
        m->u.release_many.flags = PROTO_RELEASE_NOREPLY;
        break;
    case PROTO_OP_RELEASE:
        m->u.release.handle = 11;
        m->u.release.flags = PROTO_RELEASE_NOREPLY;
        break;
    case PROTO_OP_FORGET:
        m->u.forget.buf_id = (UINT64_C(1) << 40) | 5;
        m->u.forget.writable = 1;
        break;
    case PROTO_OP_RETAIN:
        fill_token(m->u.retain.token, 13);
        m->u.retain.keep_ms = 60000;
        break;
    case PROTO_OP_MAP:
        m->u.map.buf_id = (UINT64_C(1) << 42) | 7;
        break;
    case PROTO_OP_GIVEBACK:
        m->u.giveback.buf_id = UINT64_MAX - 5;
        break;
    case PROTO_OP_ADOPT:
        m->u.adopt.buf_id = (UINT64_C(1) << 43) | 8;
        m->u.adopt.seq = UINT32_MAX - 1;
        break;
    case REPLY(PROTO_OP_STATUS):
        m->u.status_reply.body = sample_body;
        m->u.status_reply.body_len = sizeof(sample_body);
        break;
    case PROTO_OP_ERROR:
        m->u.error.code = ENOENT;
        m->u.error.msg = "no such token";
        m->u.error.msg_len = 13;
        break;
    default:
        break;
    }
}

static size_t encode_ok(const struct proto_msg *m, uint8_t *buf, size_t cap)
{
    int r = proto_encode(m, buf, cap);
    cr_assert_gt(r, 0, "proto_encode(op %u) = %d", m->op, r);
    return (size_t)r;
}

static void decode_ok(const uint8_t *buf, size_t len, struct proto_msg *ret)
{
    const char *why = NULL;
    int r = proto_decode(buf, len, PROTO_MAX_REPLY, ret, &why);
    cr_assert_eq(r, 0, "proto_decode = %d (%s)", r, why ? why : "?");
}

static void raw_eq(const void *a, uint32_t alen, const void *b, uint32_t blen, const char *what)
{
    cr_assert_eq(alen, blen, "%s: length %u, expected %u", what, blen, alen);
    if (alen)
        cr_assert_eq(memcmp(a, b, alen), 0, "%s: bytes differ", what);
}

/* A pointer field of a decoded message must point inside the decoded buffer. */
static void assert_inside(const void *p, uint32_t n, const uint8_t *buf, size_t len, const char *what)
{
    if (!p) {
        cr_assert_eq(n, 0, "%s: NULL with length %u", what, n);
        return;
    }
    const uint8_t *q = p;
    cr_assert(q >= buf && q <= buf + len && n <= (size_t)(buf + len - q),
              "%s: [%p, +%u) outside the buffer [%p, +%zu)", what, p, n, (const void *)buf, len);
}

/* Field-by-field equality of two messages of the same op; pointer fields by content. */
static void assert_msg_eq(const struct proto_msg *a, const struct proto_msg *b)
{
    cr_assert_eq(b->op, a->op);
    cr_assert_eq(b->id, a->id);
    switch (a->op) {
    case PROTO_OP_HELLO:
        cr_assert_eq(b->u.hello.version, a->u.hello.version);
        cr_assert_eq(b->u.hello.features, a->u.hello.features);
        raw_eq(a->u.hello.name, a->u.hello.name_len, b->u.hello.name, b->u.hello.name_len, "name");
        break;
    case REPLY(PROTO_OP_HELLO):
        cr_assert_eq(b->u.hello_reply.version, a->u.hello_reply.version);
        cr_assert_eq(b->u.hello_reply.features, a->u.hello_reply.features);
        cr_assert_eq(b->u.hello_reply.max_request, a->u.hello_reply.max_request);
        cr_assert_eq(b->u.hello_reply.max_lease, a->u.hello_reply.max_lease);
        cr_assert_eq(b->u.hello_reply.max_leases, a->u.hello_reply.max_leases);
        cr_assert_eq(b->u.hello_reply.max_meta, a->u.hello_reply.max_meta);
        cr_assert_eq(b->u.hello_reply.pid, a->u.hello_reply.pid);
        break;
    case PROTO_OP_LEASE:
        cr_assert_eq(b->u.lease.size, a->u.lease.size);
        cr_assert_eq(b->u.lease.flags, a->u.lease.flags);
        cr_assert_eq(b->u.lease.wait_ms, a->u.lease.wait_ms);
        break;
    case REPLY(PROTO_OP_LEASE):
    case REPLY(PROTO_OP_ACQUIRE):
    case REPLY(PROTO_OP_MAP):
    case REPLY(PROTO_OP_ADOPT):
        cr_assert_eq(b->u.lease_reply.handle, a->u.lease_reply.handle);
        cr_assert_eq(b->u.lease_reply.buf_id, a->u.lease_reply.buf_id);
        raw_eq(a->u.lease_reply.token, PROTO_TOKEN_LEN, b->u.lease_reply.token, PROTO_TOKEN_LEN, "token");
        cr_assert_eq(b->u.lease_reply.flags, a->u.lease_reply.flags);
        cr_assert_eq(b->u.lease_reply.size, a->u.lease_reply.size);
        cr_assert_eq(b->u.lease_reply.capacity, a->u.lease_reply.capacity);
        raw_eq(a->u.lease_reply.meta, a->u.lease_reply.meta_len,
               b->u.lease_reply.meta, b->u.lease_reply.meta_len, "meta");
        break;
    case PROTO_OP_PUBLISH:
        cr_assert_eq(b->u.publish.handle, a->u.publish.handle);
        cr_assert_eq(b->u.publish.size, a->u.publish.size);
        cr_assert_eq(b->u.publish.keep_ms, a->u.publish.keep_ms);
        raw_eq(a->u.publish.meta, a->u.publish.meta_len, b->u.publish.meta, b->u.publish.meta_len, "meta");
        cr_assert_eq(b->u.publish.flags, a->u.publish.flags);
        cr_assert_eq(b->u.publish.max_acquires, a->u.publish.max_acquires);
        break;
    case REPLY(PROTO_OP_PUBLISH):
        raw_eq(a->u.publish_reply.token, PROTO_TOKEN_LEN, b->u.publish_reply.token, PROTO_TOKEN_LEN, "token");
        cr_assert_eq(b->u.publish_reply.size, a->u.publish_reply.size);
        break;
    case PROTO_OP_ACQUIRE:
        raw_eq(a->u.acquire.token, PROTO_TOKEN_LEN, b->u.acquire.token, PROTO_TOKEN_LEN, "token");
        cr_assert_eq(b->u.acquire.flags, a->u.acquire.flags);
        cr_assert_eq(b->u.acquire.wait_ms, a->u.acquire.wait_ms);
        break;
    case PROTO_OP_LEASE_MANY:
        cr_assert_eq(b->u.lease_many.n, a->u.lease_many.n);
        for (uint32_t i = 0; i < a->u.lease_many.n; i++)
            cr_assert_eq(b->u.lease_many.sizes[i], a->u.lease_many.sizes[i], "size %u", i);
        cr_assert_eq(b->u.lease_many.flags, a->u.lease_many.flags);
        cr_assert_eq(b->u.lease_many.wait_ms, a->u.lease_many.wait_ms);
        break;
    case REPLY(PROTO_OP_LEASE_MANY):
        cr_assert_eq(b->u.lease_many_reply.n, a->u.lease_many_reply.n);
        for (uint32_t i = 0; i < a->u.lease_many_reply.n; i++) {
            const struct proto_item *x = &a->u.lease_many_reply.items[i], *y = &b->u.lease_many_reply.items[i];
            cr_assert_eq(y->handle, x->handle, "item %u", i);
            cr_assert_eq(y->buf_id, x->buf_id, "item %u", i);
            cr_assert_eq(y->size, x->size, "item %u", i);
            cr_assert_eq(y->capacity, x->capacity, "item %u", i);
            raw_eq(x->token, PROTO_TOKEN_LEN, y->token, PROTO_TOKEN_LEN, "item token");
            cr_assert_eq(y->has_fd, x->has_fd, "item %u", i);
        }
        break;
    case PROTO_OP_RELEASE_MANY:
        cr_assert_eq(b->u.release_many.n, a->u.release_many.n);
        for (uint32_t i = 0; i < a->u.release_many.n; i++)
            cr_assert_eq(b->u.release_many.handles[i], a->u.release_many.handles[i], "handle %u", i);
        cr_assert_eq(b->u.release_many.flags, a->u.release_many.flags);
        break;
    case PROTO_OP_RELEASE:
        cr_assert_eq(b->u.release.handle, a->u.release.handle);
        cr_assert_eq(b->u.release.flags, a->u.release.flags);
        break;
    case PROTO_OP_FORGET:
        cr_assert_eq(b->u.forget.buf_id, a->u.forget.buf_id);
        cr_assert_eq(b->u.forget.writable, a->u.forget.writable);
        break;
    case PROTO_OP_RETAIN:
        raw_eq(a->u.retain.token, PROTO_TOKEN_LEN, b->u.retain.token, PROTO_TOKEN_LEN, "token");
        cr_assert_eq(b->u.retain.keep_ms, a->u.retain.keep_ms);
        break;
    case PROTO_OP_MAP:
        cr_assert_eq(b->u.map.buf_id, a->u.map.buf_id);
        break;
    case PROTO_OP_GIVEBACK:
        cr_assert_eq(b->u.giveback.buf_id, a->u.giveback.buf_id);
        break;
    case PROTO_OP_ADOPT:
        cr_assert_eq(b->u.adopt.buf_id, a->u.adopt.buf_id);
        cr_assert_eq(b->u.adopt.seq, a->u.adopt.seq);
        break;
    case REPLY(PROTO_OP_STATUS):
        raw_eq(a->u.status_reply.body, a->u.status_reply.body_len,
               b->u.status_reply.body, b->u.status_reply.body_len, "body");
        break;
    case PROTO_OP_ERROR:
        cr_assert_eq(b->u.error.code, a->u.error.code);
        raw_eq(a->u.error.msg, a->u.error.msg_len, b->u.error.msg, b->u.error.msg_len, "msg");
        break;
    default:
        break;
    }
}

/* Decode from an exact-size heap copy, so ASan flags any read past the last byte. */
static int decode_copy(const uint8_t *bytes, size_t len, size_t max_len, struct proto_msg *ret,
                       const char **ret_why)
{
    static const uint8_t none[1];
    uint8_t *copy = malloc(len);
    cr_assert(copy || len == 0);
    if (len)
        memcpy(copy, bytes, len);
    int r = proto_decode(copy ? copy : none, len, max_len, ret, ret_why);
    free(copy);
    return r;
}

static void expect_decode(int expected, const uint8_t *bytes, size_t len, const char *label)
{
    struct proto_msg m;
    const char *why = NULL;
    int r = decode_copy(bytes, len, PROTO_MAX_REPLY, &m, &why);
    cr_assert_eq(r, expected, "%s: proto_decode = %d, expected %d", label, r, expected);
    if (expected < 0)
        cr_assert(why && why[0], "%s: no reason given", label);
}

#define EXPECT_EPROTO(...) do { \
        static const uint8_t bytes_[] = { __VA_ARGS__ }; \
        expect_decode(-EPROTO, bytes_, sizeof(bytes_), #__VA_ARGS__); \
    } while (0)

#define DECODE_RAW(ret, ...) do { \
        static const uint8_t bytes_[] = { __VA_ARGS__ }; \
        const char *why_ = NULL; \
        int r_ = proto_decode(bytes_, sizeof(bytes_), PROTO_MAX_REPLY, (ret), &why_); \
        cr_assert_eq(r_, 0, "%s: proto_decode = %d (%s)", #__VA_ARGS__, r_, why_ ? why_ : "?"); \
    } while (0)

/* Round trips ---------------------------------------------------------------------- */

Test(proto, lease_has_expected_wire_bytes)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 7 };
    m.u.lease.size = 4096;
    m.u.lease.flags = 1;
    m.u.lease.wait_ms = 300;
    uint8_t buf[64];
    static const uint8_t expected[] = { 0x95, 0x02, 0x07, 0xcd, 0x10, 0x00, 0x01, 0xcd, 0x01, 0x2c };

    cr_assert_eq(encode_ok(&m, buf, sizeof(buf)), sizeof(expected));
    cr_assert_arr_eq(buf, expected, sizeof(expected));

    struct proto_msg ping = { .op = PROTO_OP_PING, .id = 0x12345678 };
    static const uint8_t ping_expected[] = { 0x92, 0x07, 0xce, 0x12, 0x34, 0x56, 0x78 };
    cr_assert_eq(encode_ok(&ping, buf, sizeof(buf)), sizeof(ping_expected));
    cr_assert_arr_eq(buf, ping_expected, sizeof(ping_expected));
}

Test(proto, hello_round_trip)
{
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, d;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.features = PROTO_FEAT_NOREPLY_RELEASE | (UINT64_C(1) << 63);
    m.u.hello.name = "camera-0";
    m.u.hello.name_len = 8;
    uint8_t buf[128];
    size_t len = encode_ok(&m, buf, sizeof(buf));

    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, PROTO_OP_HELLO);
    cr_assert_eq(d.id, 1);
    cr_assert_eq(d.u.hello.version, PROTO_VERSION);
    cr_assert_eq(d.u.hello.features, PROTO_FEAT_NOREPLY_RELEASE | (UINT64_C(1) << 63));
    cr_assert_eq(d.u.hello.name_len, 8);
    /* the name is the last field: its bytes end the message */
    cr_assert_eq((const void *)d.u.hello.name, (const void *)(buf + len - 8));
    cr_assert_eq(memcmp(d.u.hello.name, "camera-0", 8), 0);
}

Test(proto, hello_nil_name_decodes_as_null)
{
    struct proto_msg d;
    memset(&d, 0xa5, sizeof(d));
    DECODE_RAW(&d, 0x95, 0x01, 0x03, 0x01, 0x00, 0xc0);
    cr_assert_eq(d.op, PROTO_OP_HELLO);
    cr_assert_eq(d.id, 3);
    cr_assert_eq(d.u.hello.version, 1);
    cr_assert_eq(d.u.hello.features, 0);
    cr_assert_null(d.u.hello.name);
    cr_assert_eq(d.u.hello.name_len, 0);
}

Test(proto, hello_reply_round_trip)
{
    struct proto_msg m = { .op = REPLY(PROTO_OP_HELLO), .id = UINT32_MAX }, d;
    m.u.hello_reply.version = 3;
    m.u.hello_reply.features = UINT64_MAX;
    m.u.hello_reply.max_request = PROTO_MAX_REQUEST;
    m.u.hello_reply.max_lease = UINT64_C(1) << 40;
    m.u.hello_reply.max_leases = UINT32_MAX;
    m.u.hello_reply.max_meta = PROTO_MAX_META;
    m.u.hello_reply.pid = 4194304;
    uint8_t buf[128];
    size_t len = encode_ok(&m, buf, sizeof(buf));

    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, REPLY(PROTO_OP_HELLO));
    cr_assert_eq(d.id, UINT32_MAX);
    cr_assert_eq(d.u.hello_reply.version, 3);
    cr_assert_eq(d.u.hello_reply.features, UINT64_MAX);
    cr_assert_eq(d.u.hello_reply.max_request, PROTO_MAX_REQUEST);
    cr_assert_eq(d.u.hello_reply.max_lease, UINT64_C(1) << 40);
    cr_assert_eq(d.u.hello_reply.max_leases, UINT32_MAX);
    cr_assert_eq(d.u.hello_reply.max_meta, PROTO_MAX_META);
    cr_assert_eq(d.u.hello_reply.pid, 4194304);
}

Test(proto, lease_round_trip)
{
    static const uint64_t sizes[] = { 0, 1, 127, 128, 65535, 65536, UINT32_MAX, UINT64_C(1) << 32, UINT64_MAX };
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 100 + i }, d;
        m.u.lease.size = sizes[i];
        m.u.lease.flags = UINT32_MAX - i;
        m.u.lease.wait_ms = i * 1000;
        uint8_t buf[64];
        size_t len = encode_ok(&m, buf, sizeof(buf));

        decode_ok(buf, len, &d);
        cr_assert_eq(d.op, PROTO_OP_LEASE);
        cr_assert_eq(d.id, 100 + i);
        cr_assert_eq(d.u.lease.size, sizes[i], "size %llu", (unsigned long long)sizes[i]);
        cr_assert_eq(d.u.lease.flags, UINT32_MAX - i);
        cr_assert_eq(d.u.lease.wait_ms, i * 1000);
    }
}

static void check_lease_reply(uint32_t op, const uint8_t *meta, uint32_t meta_len)
{
    struct proto_msg m = { .op = op, .id = 77 }, d;
    m.u.lease_reply.handle = UINT64_MAX;
    m.u.lease_reply.buf_id = (UINT64_C(1) << 40) + 5;
    fill_token(m.u.lease_reply.token, 4);
    m.u.lease_reply.size = 83886080;
    m.u.lease_reply.capacity = 83886080;  /* size == capacity is allowed */
    m.u.lease_reply.meta = meta;
    m.u.lease_reply.meta_len = meta_len;
    size_t cap = meta_len + 128;
    uint8_t *buf = malloc(cap);
    cr_assert_not_null(buf);
    size_t len = encode_ok(&m, buf, cap);

    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, op);
    cr_assert_eq(d.id, 77);
    cr_assert_eq(d.u.lease_reply.handle, UINT64_MAX);
    cr_assert_eq(d.u.lease_reply.buf_id, (UINT64_C(1) << 40) + 5);
    cr_assert_eq(memcmp(d.u.lease_reply.token, m.u.lease_reply.token, PROTO_TOKEN_LEN), 0);
    cr_assert_eq(d.u.lease_reply.size, 83886080);
    cr_assert_eq(d.u.lease_reply.capacity, 83886080);
    cr_assert_eq(d.u.lease_reply.meta_len, meta_len);
    cr_assert_eq((const void *)d.u.lease_reply.meta, (const void *)(buf + len - 1 - meta_len)); /* then the flags */
    cr_assert_eq(memcmp(d.u.lease_reply.meta, meta, meta_len), 0);
    free(buf);
}

Test(proto, lease_reply_round_trip)
{
    uint8_t meta[300];  /* bin16 on the wire */
    for (unsigned i = 0; i < sizeof(meta); i++)
        meta[i] = (uint8_t)(i * 7);
    check_lease_reply(REPLY(PROTO_OP_LEASE), meta, sizeof(meta));
    check_lease_reply(REPLY(PROTO_OP_LEASE), sample_meta, sizeof(sample_meta));
}

Test(proto, acquire_reply_round_trip_with_meta_at_limit)
{
    uint8_t *meta = malloc(PROTO_MAX_META);
    cr_assert_not_null(meta);
    for (unsigned i = 0; i < PROTO_MAX_META; i++)
        meta[i] = (uint8_t)(i ^ (i >> 8));
    check_lease_reply(REPLY(PROTO_OP_ACQUIRE), meta, PROTO_MAX_META);
    free(meta);
}

Test(proto, lease_reply_nil_meta_decodes_as_null)
{
    for (unsigned k = 0; k < 2; k++) {
        uint32_t op = k ? REPLY(PROTO_OP_ACQUIRE) : REPLY(PROTO_OP_LEASE);
        struct proto_msg m = { .op = op, .id = 5 }, d;
        m.u.lease_reply.handle = 1;
        m.u.lease_reply.buf_id = 2;
        m.u.lease_reply.size = 4;
        m.u.lease_reply.capacity = 4096;
        uint8_t buf[64];
        size_t len = encode_ok(&m, buf, sizeof(buf));
        cr_assert_eq(buf[len - 2], 0xc0, "no meta must travel as nil (before the flags)");

        memset(&d, 0xa5, sizeof(d));
        decode_ok(buf, len, &d);
        cr_assert_eq(d.op, op);
        cr_assert_eq(d.u.lease_reply.handle, 1);
        cr_assert_eq(d.u.lease_reply.buf_id, 2);
        cr_assert_eq(d.u.lease_reply.size, 4);
        cr_assert_eq(d.u.lease_reply.capacity, 4096);
        cr_assert_null(d.u.lease_reply.meta);
        cr_assert_eq(d.u.lease_reply.meta_len, 0);
    }
}

Test(proto, publish_round_trip)
{
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 12 }, d;
    m.u.publish.handle = (UINT64_C(1) << 33) + 1;
    m.u.publish.size = 1000;
    m.u.publish.keep_ms = UINT32_MAX;
    m.u.publish.meta = sample_meta;
    m.u.publish.meta_len = sizeof(sample_meta);
    uint8_t buf[128];
    size_t len = encode_ok(&m, buf, sizeof(buf));

    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, PROTO_OP_PUBLISH);
    cr_assert_eq(d.id, 12);
    cr_assert_eq(d.u.publish.handle, (UINT64_C(1) << 33) + 1);
    cr_assert_eq(d.u.publish.size, 1000);
    cr_assert_eq(d.u.publish.keep_ms, UINT32_MAX);
    cr_assert_eq(d.u.publish.meta_len, sizeof(sample_meta));
    cr_assert_eq((const void *)d.u.publish.meta, (const void *)(buf + len - 2 - sizeof(sample_meta)));
    cr_assert_eq(d.u.publish.flags, 0);
    cr_assert_eq(d.u.publish.max_acquires, 0);
    cr_assert_arr_eq(d.u.publish.meta, sample_meta, sizeof(sample_meta));
}

/* Version 2: every field is required. A publish without its flags and max_acquires, and
 * an acquire reply without its flags (what version 1 allowed), are malformed. */
Test(proto, publish_and_reply_fields_are_required)
{
    uint8_t buf[256];
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 5 }, d;
    const char *why = NULL;
    m.u.publish.handle = 7;
    m.u.publish.size = 100;
    m.u.publish.keep_ms = 1000;
    m.u.publish.flags = PROTO_PUBLISH_SEALED | PROTO_PUBLISH_NOREPLY;
    m.u.publish.max_acquires = 3;
    int n = proto_encode(&m, buf, sizeof(buf));
    cr_assert_gt(n, 0);
    cr_assert_eq(buf[0], 0x98, "a publish always carries its 6 fields");
    cr_assert_eq(proto_decode(buf, (size_t)n, sizeof(buf), &d, &why), 0, "%s", why);
    cr_assert_eq(d.u.publish.flags, PROTO_PUBLISH_SEALED | PROTO_PUBLISH_NOREPLY);
    cr_assert_eq(d.u.publish.max_acquires, 3);
    cr_assert_eq(d.u.publish.keep_ms, 1000);
    /* without max_acquires (its last byte), then without flags too */
    buf[0] = 0x97;
    expect_decode(-EPROTO, buf, (size_t)n - 1, "publish without max_acquires");
    buf[0] = 0x96;
    expect_decode(-EPROTO, buf, (size_t)n - 2, "publish without flags");

    struct proto_msg r = { .op = PROTO_OP_ACQUIRE + PROTO_OP_REPLY, .id = 6 };
    r.u.acquire_reply.size = 10;
    r.u.acquire_reply.capacity = 4096;
    r.u.acquire_reply.flags = PROTO_BUF_SEALED;
    n = proto_encode(&r, buf, sizeof(buf));
    cr_assert_gt(n, 0);
    cr_assert_eq(proto_decode(buf, (size_t)n, sizeof(buf), &d, &why), 0, "%s", why);
    cr_assert_eq(d.u.acquire_reply.flags, PROTO_BUF_SEALED);
    buf[0] = 0x98;
    expect_decode(-EPROTO, buf, (size_t)n - 1, "acquire reply without flags");

    /* a lease without wait_ms, an acquire without wait_ms */
    EXPECT_EPROTO(0x94, 0x02, 0x01, 0x05, 0x00);
    struct proto_msg a = { .op = PROTO_OP_ACQUIRE, .id = 1 };
    n = proto_encode(&a, buf, sizeof(buf));
    cr_assert_eq(buf[0], 0x95);
    buf[0] = 0x94;
    expect_decode(-EPROTO, buf, (size_t)n - 1, "acquire without wait_ms");
}

Test(proto, publish_nil_meta_decodes_as_null)
{
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 13 }, d;
    m.u.publish.handle = 4;
    m.u.publish.size = 0;
    m.u.publish.keep_ms = 10;
    uint8_t buf[64];
    size_t len = encode_ok(&m, buf, sizeof(buf));
    cr_assert_eq(buf[len - 3], 0xc0, "no meta travels as nil (before flags and max_acquires)");

    memset(&d, 0xa5, sizeof(d));
    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, PROTO_OP_PUBLISH);
    cr_assert_eq(d.id, 13);
    cr_assert_eq(d.u.publish.handle, 4);
    cr_assert_eq(d.u.publish.size, 0);
    cr_assert_eq(d.u.publish.keep_ms, 10);
    cr_assert_null(d.u.publish.meta);
    cr_assert_eq(d.u.publish.meta_len, 0);
}

Test(proto, publish_reply_round_trip)
{
    struct proto_msg m = { .op = REPLY(PROTO_OP_PUBLISH), .id = 14 }, d;
    uint8_t token[PROTO_TOKEN_LEN];
    fill_token(token, 0xf0);
    memcpy(m.u.publish_reply.token, token, PROTO_TOKEN_LEN);
    m.u.publish_reply.size = UINT64_MAX;
    uint8_t buf[64];
    size_t len = encode_ok(&m, buf, sizeof(buf));

    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, REPLY(PROTO_OP_PUBLISH));
    cr_assert_eq(d.id, 14);
    cr_assert_arr_eq(d.u.publish_reply.token, token, PROTO_TOKEN_LEN);
    cr_assert_eq(d.u.publish_reply.size, UINT64_MAX);
}

Test(proto, acquire_round_trip)
{
    struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = 15 }, d;
    uint8_t token[PROTO_TOKEN_LEN];
    fill_token(token, 0x0f);
    memcpy(m.u.acquire.token, token, PROTO_TOKEN_LEN);
    m.u.acquire.flags = 0x80000001u;
    uint8_t buf[64];
    size_t len = encode_ok(&m, buf, sizeof(buf));

    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, PROTO_OP_ACQUIRE);
    cr_assert_eq(d.id, 15);
    cr_assert_arr_eq(d.u.acquire.token, token, PROTO_TOKEN_LEN);
    cr_assert_eq(d.u.acquire.flags, 0x80000001u);
}

Test(proto, release_round_trip)
{
    struct proto_msg m = { .op = PROTO_OP_RELEASE, .id = 16 }, d;
    m.u.release.handle = UINT64_MAX - 1;
    m.u.release.flags = PROTO_RELEASE_NOREPLY;
    uint8_t buf[64];
    size_t len = encode_ok(&m, buf, sizeof(buf));

    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, PROTO_OP_RELEASE);
    cr_assert_eq(d.id, 16);
    cr_assert_eq(d.u.release.handle, UINT64_MAX - 1);
    cr_assert_eq(d.u.release.flags, PROTO_RELEASE_NOREPLY);
}

Test(proto, status_reply_round_trip)
{
    struct proto_msg m = { .op = REPLY(PROTO_OP_STATUS), .id = 17 }, d;
    m.u.status_reply.body = sample_body;
    m.u.status_reply.body_len = sizeof(sample_body);
    uint8_t buf[64];
    size_t len = encode_ok(&m, buf, sizeof(buf));

    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, REPLY(PROTO_OP_STATUS));
    cr_assert_eq(d.id, 17);
    cr_assert_eq(d.u.status_reply.body_len, sizeof(sample_body));
    cr_assert_eq((const void *)d.u.status_reply.body, (const void *)(buf + len - sizeof(sample_body)));
    cr_assert_arr_eq(d.u.status_reply.body, sample_body, sizeof(sample_body));
    const char *why = NULL;
    cr_assert_eq(proto_check(d.u.status_reply.body, d.u.status_reply.body_len, PROTO_MAX_DEPTH, &why), 0);
}

Test(proto, fieldless_ops_round_trip)
{
    static const uint32_t ops[] = {
        PROTO_OP_STATUS, PROTO_OP_PING, REPLY(PROTO_OP_RELEASE), REPLY(PROTO_OP_PING),
    };
    for (unsigned i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        struct proto_msg m = { .op = ops[i], .id = 1000 + i }, d;
        uint8_t buf[16];
        size_t len = encode_ok(&m, buf, sizeof(buf));
        cr_assert_eq(len, 5, "op %u: [op, uint16 id] is 5 bytes", ops[i]);
        cr_assert_eq(buf[0], 0x92);
        cr_assert_eq(buf[1], ops[i]);

        decode_ok(buf, len, &d);
        cr_assert_eq(d.op, ops[i]);
        cr_assert_eq(d.id, 1000 + i);
    }
}

Test(proto, error_round_trip)
{
    struct proto_msg m = { .op = PROTO_OP_ERROR, .id = 18 }, d;
    m.u.error.code = EDQUOT;
    m.u.error.msg = "tenant quota exceeded";
    m.u.error.msg_len = 21;
    uint8_t buf[64];
    size_t len = encode_ok(&m, buf, sizeof(buf));

    decode_ok(buf, len, &d);
    cr_assert_eq(d.op, PROTO_OP_ERROR);
    cr_assert_eq(d.id, 18);
    cr_assert_eq(d.u.error.code, EDQUOT);
    cr_assert_eq(d.u.error.msg_len, 21);
    cr_assert_eq((const void *)d.u.error.msg, (const void *)(buf + len - 21));
    cr_assert_eq(memcmp(d.u.error.msg, "tenant quota exceeded", 21), 0);
}

Test(proto, every_op_round_trips_with_any_id)
{
    static const uint32_t ids[] = { 0, 1, 127, 128, 0x12345678, UINT32_MAX };
    for (unsigned i = 0; i < N_KNOWN_OPS; i++) {
        for (unsigned j = 0; j < sizeof(ids) / sizeof(ids[0]); j++) {
            struct proto_msg m, d;
            uint8_t buf[128];
            make_msg(known_ops[i], ids[j], &m);
            size_t len = encode_ok(&m, buf, sizeof(buf));
            memset(&d, 0xa5, sizeof(d));
            decode_ok(buf, len, &d);
            assert_msg_eq(&m, &d);
        }
    }
}

Test(proto, encode_into_small_buffer_fails)
{
    for (unsigned i = 0; i < N_KNOWN_OPS; i++) {
        struct proto_msg m;
        uint8_t full[128], buf[128 + 16];
        make_msg(known_ops[i], 0xabcdef, &m);
        size_t len = encode_ok(&m, full, sizeof(full));
        for (size_t cap = 0; cap < len; cap++) {
            memset(buf, 0xee, sizeof(buf));
            int r = proto_encode(&m, buf, cap);
            cr_assert_eq(r, -EMSGSIZE, "op %u cap %zu of %zu: %d", m.op, cap, len, r);
            for (size_t k = cap; k < sizeof(buf); k++)
                cr_assert_eq(buf[k], 0xee, "op %u cap %zu: wrote byte %zu", m.op, cap, k);
        }
        cr_assert_eq(proto_encode(&m, buf, len), (int)len);
        cr_assert_arr_eq(buf, full, len);
    }
}

/* proto_encode_error --------------------------------------------------------------- */

static void decode_error(const uint8_t *buf, size_t len, struct proto_msg *d)
{
    decode_ok(buf, len, d);
    cr_assert_eq(d->op, PROTO_OP_ERROR);
}

Test(proto, encode_error_formats_and_makes_code_positive)
{
    uint8_t buf[256];
    struct proto_msg d;
    int r = proto_encode_error(9, -EACCES, buf, sizeof(buf), "token %s not yours (uid %d)", "ab12", 1000);
    cr_assert_gt(r, 0);
    decode_error(buf, (size_t)r, &d);
    cr_assert_eq(d.id, 9);
    cr_assert_eq(d.u.error.code, EACCES);
    cr_assert_eq(d.u.error.msg_len, strlen("token ab12 not yours (uid 1000)"));
    cr_assert_eq(memcmp(d.u.error.msg, "token ab12 not yours (uid 1000)", d.u.error.msg_len), 0);

    r = proto_encode_error(10, ENOSPC, buf, sizeof(buf), "pool full");
    cr_assert_gt(r, 0);
    decode_error(buf, (size_t)r, &d);
    cr_assert_eq(d.id, 10);
    cr_assert_eq(d.u.error.code, ENOSPC);
    cr_assert_eq(d.u.error.msg_len, 9);
    cr_assert_eq(memcmp(d.u.error.msg, "pool full", 9), 0);
}

Test(proto, encode_error_truncates_long_message)
{
    static const size_t lens[] = { PROTO_MAX_ERRMSG - 1, PROTO_MAX_ERRMSG, PROTO_MAX_ERRMSG + 1, 1000 };
    char text[1001];
    uint8_t buf[1024];
    for (unsigned i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        memset(text, 'x', lens[i]);
        text[lens[i]] = '\0';
        text[lens[i] - 1] = 'y';  /* the last character survives only without truncation */
        int r = proto_encode_error(42, -EDQUOT, buf, sizeof(buf), "%s", text);
        cr_assert_gt(r, 0);
        struct proto_msg d;
        decode_error(buf, (size_t)r, &d);
        size_t want = lens[i] > PROTO_MAX_ERRMSG ? PROTO_MAX_ERRMSG : lens[i];
        cr_assert_eq(d.id, 42);
        cr_assert_eq(d.u.error.code, EDQUOT);
        cr_assert_eq(d.u.error.msg_len, want, "input %zu: msg_len %u", lens[i], d.u.error.msg_len);
        cr_assert_eq(memcmp(d.u.error.msg, text, want), 0);
        cr_assert_eq(d.u.error.msg[want - 1], lens[i] > PROTO_MAX_ERRMSG ? 'x' : 'y');
    }
}

Test(proto, encode_error_small_buffer)
{
    uint8_t buf[64];
    cr_assert_eq(proto_encode_error(1, EIO, buf, 10, "%s", "twenty characters..."), -EMSGSIZE);
    cr_assert_eq(proto_encode_error(1, EIO, buf, 0, "x"), -EMSGSIZE);
    int r = proto_encode_error(1, EIO, buf, sizeof(buf), "%s", "twenty characters...");
    cr_assert_gt(r, 10);
    cr_assert_eq(proto_encode_error(1, EIO, buf, (size_t)r - 1, "%s", "twenty characters..."), -EMSGSIZE);
    cr_assert_eq(proto_encode_error(1, EIO, buf, (size_t)r, "%s", "twenty characters..."), r);
}

/* Regression: -INT_MIN overflowed (UBSan) and produced an undecodable reply. Codes
 * that cannot be made positive become EIO. */
Test(proto, encode_error_int_min_code_stays_decodable)
{
    uint8_t buf[64];
    int r = proto_encode_error(1, INT_MIN, buf, sizeof(buf), "x");
    cr_assert_gt(r, 0);
    struct proto_msg d;
    decode_error(buf, (size_t)r, &d);
    cr_assert_eq(d.u.error.code, EIO);
    r = proto_encode_error(1, 0, buf, sizeof(buf), "x");
    decode_error(buf, (size_t)r, &d);
    cr_assert_eq(d.u.error.code, EIO);
}

/* Malformed input ------------------------------------------------------------------ */

Test(proto, rejects_empty_message)
{
    expect_decode(-EPROTO, NULL, 0, "empty");
    static const uint8_t one[] = { 0x92 };
    struct proto_msg m;
    const char *why = NULL;
    cr_assert_eq(proto_decode(one, 0, PROTO_MAX_REPLY, &m, &why), -EPROTO);
    cr_assert_not_null(why);
}

Test(proto, rejects_every_truncation)
{
    for (unsigned i = 0; i < N_KNOWN_OPS; i++) {
        struct proto_msg m;
        uint8_t buf[128];
        make_msg(known_ops[i], 0x01020304, &m);
        size_t len = encode_ok(&m, buf, sizeof(buf));
        for (size_t n = 0; n < len; n++) {
            char label[64];
            snprintf(label, sizeof(label), "op %u prefix %zu of %zu", m.op, n, len);
            expect_decode(-EPROTO, buf, n, label);
        }
    }
}

Test(proto, rejects_every_truncation_of_lease)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 0xdeadbeef };
    m.u.lease.size = UINT64_MAX;
    m.u.lease.flags = UINT32_MAX;
    m.u.lease.wait_ms = UINT32_MAX;
    uint8_t buf[64];
    size_t len = encode_ok(&m, buf, sizeof(buf));
    cr_assert_eq(len, 1 + 1 + 5 + 9 + 5 + 5);
    for (size_t n = 0; n < len; n++) {
        char label[32];
        snprintf(label, sizeof(label), "prefix %zu", n);
        expect_decode(-EPROTO, buf, n, label);
    }
}

/* n nested containers, each announced by hdr[0..hdr_len) and holding one element, around
 * a single positive fixint. */
static size_t build_nested(uint8_t *buf, unsigned n, const uint8_t *hdr, size_t hdr_len)
{
    size_t pos = 0;
    for (unsigned i = 0; i < n; i++) {
        memcpy(buf + pos, hdr, hdr_len);
        pos += hdr_len;
    }
    buf[pos++] = 0x01;
    return pos;
}

static const uint8_t hdr_fixarray[] = { 0x91 };
static const uint8_t hdr_array16[] = { 0xdc, 0x00, 0x01 };
static const uint8_t hdr_array32[] = { 0xdd, 0x00, 0x00, 0x00, 0x01 };
static const uint8_t hdr_fixmap[] = { 0x81, 0x01 };       /* {1: next} */
static const uint8_t hdr_map16[] = { 0xde, 0x00, 0x01, 0x02 };

Test(proto, rejects_depth_bomb_fixarray)
{
    uint8_t buf[128];
    size_t len = build_nested(buf, 100, hdr_fixarray, sizeof(hdr_fixarray));
    cr_assert_eq(len, 101);
    expect_decode(-EPROTO, buf, len, "100 x 0x91");
    /* 100000 levels: no recursion, no stack to blow */
    uint8_t *big = malloc(100001);
    cr_assert_not_null(big);
    len = build_nested(big, 100000, hdr_fixarray, sizeof(hdr_fixarray));
    expect_decode(-EPROTO, big, len, "100000 x 0x91");
    free(big);
}

Test(proto, rejects_depth_bomb_array16_and_maps)
{
    uint8_t buf[512];
    size_t len = build_nested(buf, 100, hdr_array16, sizeof(hdr_array16));
    expect_decode(-EPROTO, buf, len, "100 x array16");
    len = build_nested(buf, 100, hdr_array32, sizeof(hdr_array32));
    expect_decode(-EPROTO, buf, len, "100 x array32");
    len = build_nested(buf, 100, hdr_fixmap, sizeof(hdr_fixmap));
    expect_decode(-EPROTO, buf, len, "100 x fixmap");
    len = build_nested(buf, 100, hdr_map16, sizeof(hdr_map16));
    expect_decode(-EPROTO, buf, len, "100 x map16");
}

Test(proto, rejects_lengths_beyond_message)
{
    EXPECT_EPROTO(0xdb, 0xff, 0xff, 0xff, 0xff, 'a', 'b');                  /* str32 */
    EXPECT_EPROTO(0xc6, 0xff, 0xff, 0xff, 0xff, 'a', 'b');                  /* bin32 */
    EXPECT_EPROTO(0xdb, 0x00, 0x00, 0x00, 0x03, 'a', 'b');                  /* one short */
    EXPECT_EPROTO(0xda, 0xff, 0xff, 'a');                                   /* str16 */
    EXPECT_EPROTO(0xc5, 0x01, 0x00, 'a');                                   /* bin16 */
    EXPECT_EPROTO(0xd9, 0x10, 'a', 'b', 'c');                               /* str8 */
    EXPECT_EPROTO(0xc4, 0x02, 0x00);                                        /* bin8 */
    EXPECT_EPROTO(0xa5, 'a', 'b');                                          /* fixstr */
    /* inside an otherwise valid envelope: hello name, publish meta, error msg */
    EXPECT_EPROTO(0x95, 0x01, 0x01, 0x01, 0x00, 0xdb, 0xff, 0xff, 0xff, 0xff, 'x');
    EXPECT_EPROTO(0x96, 0x03, 0x01, 0x01, 0x01, 0x00, 0xc6, 0xff, 0xff, 0xff, 0xff, 0x00);
    EXPECT_EPROTO(0x94, 0x7f, 0x01, 0x02, 0xdb, 0x80, 0x00, 0x00, 0x00, 'x');
    /* truncated length headers */
    EXPECT_EPROTO(0xdb, 0x00, 0x00);
    EXPECT_EPROTO(0xc6);
    EXPECT_EPROTO(0x92, 0x07, 0xcf, 0x00, 0x00);
}

Test(proto, rejects_huge_array_count_before_msgpack)
{
    static const uint8_t a32[] = { 0xdd, 0xff, 0xff, 0xff, 0xff };
    const char *why = NULL;
    cr_assert_eq(proto_check(a32, sizeof(a32), PROTO_MAX_DEPTH, &why), -EPROTO);
    cr_assert_not_null(why);
    expect_decode(-EPROTO, a32, sizeof(a32), "array32 0xffffffff");

    /* still a lie with some bytes behind it */
    uint8_t buf[5 + 100];
    memcpy(buf, a32, sizeof(a32));
    memset(buf + 5, 0x01, 100);
    expect_decode(-EPROTO, buf, sizeof(buf), "array32 0xffffffff + 100 elements");
    EXPECT_EPROTO(0xdc, 0xff, 0xff, 0x07, 0x01);                            /* array16 */
    EXPECT_EPROTO(0x9f, 0x07, 0x01);                                        /* fixarray 15 */
    EXPECT_EPROTO(0x94, 0x02, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00);    /* as a field */

    /* the same wide headers are fine when the count is honest */
    static const uint8_t honest[] = { 0xdd, 0x00, 0x00, 0x00, 0x02, 0x07, 0x01 };
    cr_assert_eq(proto_check(honest, sizeof(honest), PROTO_MAX_DEPTH, &why), 0);
    struct proto_msg m;
    cr_assert_eq(proto_decode(honest, sizeof(honest), PROTO_MAX_REPLY, &m, &why), 0);
    cr_assert_eq(m.op, PROTO_OP_PING);
    cr_assert_eq(m.id, 1);
}

Test(proto, rejects_huge_map_count)
{
    static const uint8_t m32[] = { 0xdf, 0xff, 0xff, 0xff, 0xff };
    const char *why = NULL;
    cr_assert_eq(proto_check(m32, sizeof(m32), PROTO_MAX_DEPTH, &why), -EPROTO);
    EXPECT_EPROTO(0xdf, 0xff, 0xff, 0xff, 0xff);
    EXPECT_EPROTO(0xdf, 0x80, 0x00, 0x00, 0x00, 0x01, 0x02);  /* pairs * 2 overflows 32 bits */
    EXPECT_EPROTO(0xde, 0xff, 0xff, 0x01, 0x02);
    /* a map counts pairs: 2 pairs need 4 elements, 3 bytes is not enough */
    EXPECT_EPROTO(0x82, 0x01, 0x02, 0x03);
    EXPECT_EPROTO(0x93, 0x07, 0x01, 0xdf, 0xff, 0xff, 0xff, 0xff);
    static const uint8_t ok[] = { 0x82, 0x01, 0x02, 0x03, 0x04 };
    cr_assert_eq(proto_check(ok, sizeof(ok), PROTO_MAX_DEPTH, &why), 0);
}

Test(proto, rejects_ext_types_and_c1)
{
    static const struct { uint8_t b[20]; size_t len; } ext[] = {
        { { 0xd4, 0x01, 0x00 }, 3 },
        { { 0xd5, 0x01, 0x00, 0x00 }, 4 },
        { { 0xd6, 0x01, 0x00, 0x00, 0x00, 0x00 }, 6 },
        { { 0xd7, 0x01, 0, 0, 0, 0, 0, 0, 0, 0 }, 10 },
        { { 0xd8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, 18 },
        { { 0xc7, 0x01, 0x01, 0x00 }, 4 },
        { { 0xc8, 0x00, 0x01, 0x01, 0x00 }, 5 },
        { { 0xc9, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00 }, 7 },
        { { 0xc1 }, 1 },
    };
    for (unsigned i = 0; i < sizeof(ext) / sizeof(ext[0]); i++) {
        const char *why = NULL;
        char label[32];
        snprintf(label, sizeof(label), "type 0x%02x", ext[i].b[0]);
        cr_assert_eq(proto_check(ext[i].b, ext[i].len, PROTO_MAX_DEPTH, &why), -EPROTO, "%s", label);
        cr_assert_not_null(why);
        expect_decode(-EPROTO, ext[i].b, ext[i].len, label);

        /* as the size field of a lease request, and as a trailing extra field */
        uint8_t buf[32] = { 0x94, 0x02, 0x01 };
        memcpy(buf + 3, ext[i].b, ext[i].len);
        buf[3 + ext[i].len] = 0x00;
        expect_decode(-EPROTO, buf, 4 + ext[i].len, label);
        uint8_t tail[32] = { 0x93, 0x07, 0x01 };
        memcpy(tail + 3, ext[i].b, ext[i].len);
        expect_decode(-EPROTO, tail, 3 + ext[i].len, label);
    }
}

Test(proto, rejects_trailing_bytes)
{
    struct proto_msg m;
    uint8_t buf[64];
    make_msg(PROTO_OP_LEASE, 1, &m);
    size_t len = encode_ok(&m, buf, sizeof(buf) - 8);
    buf[len] = 0x00;
    expect_decode(-EPROTO, buf, len + 1, "lease + 0x00");
    buf[len] = 0xc0;
    expect_decode(-EPROTO, buf, len + 1, "lease + nil");
    EXPECT_EPROTO(0x92, 0x07, 0x01, 0x92, 0x07, 0x02);   /* two pings in one datagram */
    EXPECT_EPROTO(0x92, 0x07, 0x01, 0xc1);
}

Test(proto, rejects_non_array_top_level)
{
    EXPECT_EPROTO(0x01);
    EXPECT_EPROTO(0xc0);
    EXPECT_EPROTO(0xc3);
    EXPECT_EPROTO(0xff);
    EXPECT_EPROTO(0xa3, 'a', 'b', 'c');
    EXPECT_EPROTO(0xc4, 0x02, 0x07, 0x01);
    EXPECT_EPROTO(0x82, 0x00, 0x07, 0x01, 0x01);              /* {0: 7, 1: 1} */
    EXPECT_EPROTO(0xcb, 0x40, 0x1c, 0, 0, 0, 0, 0, 0);
}

Test(proto, rejects_short_arrays)
{
    EXPECT_EPROTO(0x90);
    EXPECT_EPROTO(0x91, 0x07);
    EXPECT_EPROTO(0xdc, 0x00, 0x01, 0x07);
    EXPECT_EPROTO(0xdd, 0x00, 0x00, 0x00, 0x00);
}

Test(proto, rejects_bad_op)
{
    EXPECT_EPROTO(0x92, 0xa1, 'x', 0x01);                     /* string */
    EXPECT_EPROTO(0x92, 0xc0, 0x01);                          /* nil */
    EXPECT_EPROTO(0x92, 0xc3, 0x01);                          /* true */
    EXPECT_EPROTO(0x92, 0xff, 0x01);                          /* -1 */
    EXPECT_EPROTO(0x92, 0xd0, 0x80, 0x01);                    /* -128 */
    EXPECT_EPROTO(0x92, 0xca, 0x40, 0xe0, 0x00, 0x00, 0x01);  /* 7.0f */
    EXPECT_EPROTO(0x92, 0x91, 0x07, 0x01);                    /* [7] */
    EXPECT_EPROTO(0x92, 0xc4, 0x01, 0x07, 0x01);              /* bin */
    /* 2^32 + 7 must not be taken for ping */
    EXPECT_EPROTO(0x92, 0xcf, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x07, 0x01);
}

Test(proto, rejects_bad_id_and_accepts_uint32_max)
{
    EXPECT_EPROTO(0x92, 0x07, 0xcf, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00);  /* 2^32 */
    EXPECT_EPROTO(0x92, 0x07, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff);
    EXPECT_EPROTO(0x92, 0x07, 0xff);
    EXPECT_EPROTO(0x92, 0x07, 0xa1, '1');
    EXPECT_EPROTO(0x92, 0x07, 0xc0);
    EXPECT_EPROTO(0x92, 0x07, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0);

    struct proto_msg m;
    DECODE_RAW(&m, 0x92, 0x07, 0xce, 0xff, 0xff, 0xff, 0xff);
    cr_assert_eq(m.op, PROTO_OP_PING);
    cr_assert_eq(m.id, UINT32_MAX);
    DECODE_RAW(&m, 0x92, 0x07, 0xcf, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xfe);
    cr_assert_eq(m.id, UINT32_MAX - 1);
}

Test(proto, rejects_bad_lease_fields)
{
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0xa1, '5', 0x00, 0x00);   /* size as a string */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0xff, 0x00, 0x00);        /* size -1 */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00);  /* INT64_MIN */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0xc0, 0x00, 0x00);        /* size nil */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0xcb, 0x40, 0xb0, 0, 0, 0, 0, 0, 0, 0x00, 0x00);  /* 4096.0 */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0x05, 0xff, 0x00);        /* flags -1 */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0x05, 0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0, 0x00);  /* flags 2^32 */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0x05, 0xc2, 0x00);        /* flags false */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0x05, 0x00, 0xff);        /* wait_ms -1 */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0x05, 0x00, 0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0);  /* wait_ms 2^32 */
    EXPECT_EPROTO(0x95, 0x02, 0x01, 0x05, 0x00, 0xc0);        /* wait_ms nil */
    EXPECT_EPROTO(0x94, 0x02, 0x01, 0x05, 0x00);              /* wait_ms missing */
    EXPECT_EPROTO(0x93, 0x02, 0x01, 0x05);                    /* flags missing */
    EXPECT_EPROTO(0x92, 0x02, 0x01);                          /* all missing */

    /* the same shape with valid fields decodes */
    struct proto_msg m;
    DECODE_RAW(&m, 0x95, 0x02, 0x01, 0x05, 0xce, 0xff, 0xff, 0xff, 0xff, 0xcd, 0x01, 0xf4);
    cr_assert_eq(m.u.lease.size, 5);
    cr_assert_eq(m.u.lease.flags, UINT32_MAX);
    cr_assert_eq(m.u.lease.wait_ms, 500);
}

/* [op, 1, <token field>, 0] with the token as bin8 of n bytes (or another head); an
 * acquire gets one 0 more (flags, wait_ms). */
static size_t build_token_msg(uint8_t *buf, uint32_t op, uint8_t head, size_t n)
{
    size_t pos = 0;
    buf[pos++] = op == PROTO_OP_ACQUIRE ? 0x95 : 0x94;
    buf[pos++] = (uint8_t)op;
    buf[pos++] = 0x01;
    buf[pos++] = head;
    if (head == 0xc4)
        buf[pos++] = (uint8_t)n;
    for (size_t i = 0; i < n; i++)
        buf[pos++] = (uint8_t)(0x30 + i);
    buf[pos++] = 0x00;
    if (op == PROTO_OP_ACQUIRE)
        buf[pos++] = 0x00;
    return pos;
}

Test(proto, rejects_bad_token)
{
    static const uint32_t ops[] = { PROTO_OP_ACQUIRE, REPLY(PROTO_OP_PUBLISH) };
    for (unsigned i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        uint8_t buf[64];
        size_t len;
        char label[48];
        static const size_t bad_lens[] = { 0, 1, 15, 17, 32 };
        for (unsigned k = 0; k < sizeof(bad_lens) / sizeof(bad_lens[0]); k++) {
            len = build_token_msg(buf, ops[i], 0xc4, bad_lens[k]);
            snprintf(label, sizeof(label), "op %u token of %zu bytes", ops[i], bad_lens[k]);
            expect_decode(-EPROTO, buf, len, label);
        }
        len = build_token_msg(buf, ops[i], 0xb0, 16);          /* fixstr of 16 */
        expect_decode(-EPROTO, buf, len, "token as str");
        len = build_token_msg(buf, ops[i], 0xc0, 0);           /* nil */
        expect_decode(-EPROTO, buf, len, "token nil");

        len = build_token_msg(buf, ops[i], 0xc4, 16);
        struct proto_msg m;
        const char *why = NULL;
        cr_assert_eq(proto_decode(buf, len, PROTO_MAX_REPLY, &m, &why), 0, "%s", why ? why : "?");
        const uint8_t *token = i == 0 ? m.u.acquire.token : m.u.publish_reply.token;
        cr_assert_arr_eq(token, buf + 5, PROTO_TOKEN_LEN);
    }
}

static int decode_publish_with_meta(uint32_t meta_len)
{
    uint8_t *meta = calloc(1, meta_len);
    size_t cap = meta_len + 64;
    uint8_t *buf = malloc(cap);
    cr_assert(meta && buf);
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 1 }, d;
    m.u.publish.handle = 1;
    m.u.publish.size = 1;
    m.u.publish.meta = meta;
    m.u.publish.meta_len = meta_len;
    size_t len = encode_ok(&m, buf, cap);
    const char *why = NULL;
    int r = proto_decode(buf, len, PROTO_MAX_REQUEST, &d, &why);
    if (r == 0)
        cr_assert_eq(d.u.publish.meta_len, meta_len);
    free(buf);
    free(meta);
    return r;
}

Test(proto, rejects_meta_over_limit)
{
    cr_assert_eq(decode_publish_with_meta(PROTO_MAX_META), 0);
    cr_assert_eq(decode_publish_with_meta(PROTO_MAX_META + 1), -EPROTO);

    uint8_t *meta = calloc(1, PROTO_MAX_META + 1);
    uint8_t *buf = malloc(PROTO_MAX_META + 128);
    cr_assert(meta && buf);
    struct proto_msg m;
    make_msg(REPLY(PROTO_OP_LEASE), 1, &m);
    m.u.lease_reply.meta = meta;
    m.u.lease_reply.meta_len = PROTO_MAX_META + 1;
    size_t len = encode_ok(&m, buf, PROTO_MAX_META + 128);
    expect_decode(-EPROTO, buf, len, "lease reply meta over limit");
    /* meta as a string is a type error */
    EXPECT_EPROTO(0x96, 0x03, 0x01, 0x01, 0x01, 0x00, 0xa1, 'm');
    free(buf);
    free(meta);
}

static int decode_hello_with_name(uint32_t name_len)
{
    char name[PROTO_MAX_NAME + 2];
    memset(name, 'n', sizeof(name));
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 2 }, d;
    m.u.hello.version = 1;
    m.u.hello.name = name;
    m.u.hello.name_len = name_len;
    uint8_t buf[256];
    size_t len = encode_ok(&m, buf, sizeof(buf));
    const char *why = NULL;
    int r = proto_decode(buf, len, PROTO_MAX_REQUEST, &d, &why);
    if (r == 0)
        cr_assert_eq(d.u.hello.name_len, name_len);
    return r;
}

Test(proto, rejects_name_over_limit)
{
    cr_assert_eq(decode_hello_with_name(0), 0);
    cr_assert_eq(decode_hello_with_name(PROTO_MAX_NAME), 0);
    cr_assert_eq(decode_hello_with_name(PROTO_MAX_NAME + 1), -EPROTO);
    cr_assert_eq(decode_hello_with_name(PROTO_MAX_NAME + 2), -EPROTO);
}

Test(proto, rejects_error_msg_over_limit)
{
    char text[PROTO_MAX_ERRMSG + 1];
    memset(text, 'e', sizeof(text));
    struct proto_msg m = { .op = PROTO_OP_ERROR, .id = 3 };
    m.u.error.code = EIO;
    m.u.error.msg = text;
    m.u.error.msg_len = PROTO_MAX_ERRMSG + 1;
    uint8_t buf[1024];
    size_t len = encode_ok(&m, buf, sizeof(buf));
    expect_decode(-EPROTO, buf, len, "error msg over limit");
    m.u.error.msg_len = PROTO_MAX_ERRMSG;
    len = encode_ok(&m, buf, sizeof(buf));
    struct proto_msg d;
    decode_ok(buf, len, &d);
    cr_assert_eq(d.u.error.msg_len, PROTO_MAX_ERRMSG);
}

Test(proto, rejects_incomplete_hello)
{
    EXPECT_EPROTO(0x92, 0x01, 0x01);                          /* no fields */
    EXPECT_EPROTO(0x93, 0x01, 0x01, 0x01);                    /* version only */
    EXPECT_EPROTO(0x94, 0x01, 0x01, 0x01, 0x00);              /* no name */
    EXPECT_EPROTO(0x95, 0x01, 0x01, 0x01, 0x00, 0xc4, 0x01, 'a');   /* name as bin */
    EXPECT_EPROTO(0x95, 0x01, 0x01, 0x01, 0xff, 0xa1, 'a');         /* features -1 */
    EXPECT_EPROTO(0x95, 0x01, 0x01, 0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0, 0x00, 0xa1, 'a');  /* version 2^32 */
    EXPECT_EPROTO(0x95, 0x01, 0x01, 0xa1, '1', 0x00, 0xa1, 'a');    /* version as string */

    /* a hello reply missing its last field (pid) */
    struct proto_msg m;
    uint8_t buf[128];
    make_msg(REPLY(PROTO_OP_HELLO), 1, &m);
    size_t len = encode_ok(&m, buf, sizeof(buf));
    cr_assert_eq(buf[0], 0x99);
    cr_assert_eq(buf[len - 3], 0xcd);   /* pid 4242 is the last field: cd 10 92 */
    buf[0] = 0x98;
    expect_decode(-EPROTO, buf, len - 3, "hello reply without pid");
}

Test(proto, rejects_size_over_capacity)
{
    struct proto_msg m;
    uint8_t buf[128];
    make_msg(REPLY(PROTO_OP_LEASE), 1, &m);
    m.u.lease_reply.size = 4097;
    m.u.lease_reply.capacity = 4096;
    size_t len = encode_ok(&m, buf, sizeof(buf));
    expect_decode(-EPROTO, buf, len, "lease reply size > capacity");
    m.op = REPLY(PROTO_OP_ACQUIRE);
    len = encode_ok(&m, buf, sizeof(buf));
    expect_decode(-EPROTO, buf, len, "acquire reply size > capacity");
    m.u.lease_reply.size = 4096;
    len = encode_ok(&m, buf, sizeof(buf));
    decode_ok(buf, len, &m);
    cr_assert_eq(m.u.lease_reply.size, 4096);
}

Test(proto, rejects_non_positive_error_code)
{
    EXPECT_EPROTO(0x94, 0x7f, 0x01, 0xff, 0xa1, 'x');                     /* -1 */
    EXPECT_EPROTO(0x94, 0x7f, 0x01, 0x00, 0xa1, 'x');                     /* 0 */
    EXPECT_EPROTO(0x94, 0x7f, 0x01, 0xce, 0x80, 0x00, 0x00, 0x00, 0xa1, 'x');   /* 2^31 */
    EXPECT_EPROTO(0x94, 0x7f, 0x01, 0xa1, '2', 0xa1, 'x');                /* string */
    EXPECT_EPROTO(0x94, 0x7f, 0x01, 0x02, 0xc4, 0x01, 'x');               /* msg as bin */
    EXPECT_EPROTO(0x93, 0x7f, 0x01, 0x02);                                /* no msg */

    struct proto_msg m;
    DECODE_RAW(&m, 0x94, 0x7f, 0x01, 0xce, 0x7f, 0xff, 0xff, 0xff, 0xc0);
    cr_assert_eq(m.u.error.code, INT32_MAX);
    cr_assert_null(m.u.error.msg);
    cr_assert_eq(m.u.error.msg_len, 0);
    /* a positive code encoded as a signed int is still a code */
    DECODE_RAW(&m, 0x94, 0x7f, 0x01, 0xd0, 0x1c, 0xa1, 'x');
    cr_assert_eq(m.u.error.code, 28);
}

Test(proto, rejects_message_over_max_len)
{
    struct proto_msg m, d;
    uint8_t buf[128];
    const char *why = NULL;
    make_msg(PROTO_OP_PUBLISH, 1, &m);
    size_t len = encode_ok(&m, buf, sizeof(buf));
    cr_assert_eq(proto_decode(buf, len, len - 1, &d, &why), -EPROTO);
    cr_assert_not_null(why);
    cr_assert_eq(proto_decode(buf, len, 0, &d, &why), -EPROTO);
    cr_assert_eq(proto_decode(buf, len, len, &d, &why), 0);
    cr_assert_eq(d.u.publish.keep_ms, 250);

    /* a valid ping padded with an extra field to PROTO_MAX_REQUEST + 1 bytes */
    size_t big = PROTO_MAX_REQUEST + 1;
    uint8_t *p = malloc(big);
    cr_assert_not_null(p);
    size_t body = big - 3 - 3;        /* 93 07 01 | c5 hi lo | body */
    p[0] = 0x93; p[1] = 0x07; p[2] = 0x01;
    p[3] = 0xc5; p[4] = (uint8_t)(body >> 8); p[5] = (uint8_t)body;
    memset(p + 6, 0x00, body);
    cr_assert_eq(proto_decode(p, big, PROTO_MAX_REQUEST, &d, &why), -EPROTO);
    cr_assert_eq(proto_decode(p, big, PROTO_MAX_REPLY, &d, &why), 0);
    cr_assert_eq(d.op, PROTO_OP_PING);
    free(p);
}

/* Unknown ops and forward compatibility --------------------------------------------- */

static void expect_unsupported(const uint8_t *bytes, size_t len, uint32_t op, uint32_t id)
{
    struct proto_msg m;
    const char *why = NULL;
    int r = decode_copy(bytes, len, PROTO_MAX_REPLY, &m, &why);
    cr_assert_eq(r, -EOPNOTSUPP, "op %u: proto_decode = %d (%s)", op, r, why ? why : "?");
    cr_assert_not_null(why);
    cr_assert_eq(m.op, op);
    cr_assert_eq(m.id, id);
}

Test(proto, unknown_op_is_eopnotsupp)
{
    static const uint8_t op50[] = { 0x92, 50, 0xcd, 0x04, 0xd2 };
    expect_unsupported(op50, sizeof(op50), 50, 1234);
    static const uint8_t op99[] = { 0x94, 99, 0x07, 0xa1, 'x', 0x92, 0x01, 0x02 };
    expect_unsupported(op99, sizeof(op99), 99, 7);
    static const uint32_t ops[] = { 0, 18, 63, 64, 72, 75, 82, 126, PROTO_OP_TOOK, PROTO_OP_NUDGE, REPLY(PROTO_OP_TOOK), REPLY(PROTO_OP_NUDGE),
                                    REPLY(PROTO_OP_BYE), REPLY(PROTO_OP_GIVEBACK) };
    for (unsigned i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        uint8_t b[] = { 0x92, (uint8_t)ops[i], 0xce, 0xff, 0xff, 0xff, 0xff };
        expect_unsupported(b, sizeof(b), ops[i], UINT32_MAX);
    }

    /* what proto_encode writes for an op it does not know is [op, id] */
    struct proto_msg m = { .op = 50, .id = 9 };
    uint8_t buf[16];
    cr_assert_eq(encode_ok(&m, buf, sizeof(buf)), 3);
    expect_unsupported(buf, 3, 50, 9);

    /* an unknown op does not excuse malformed bytes */
    EXPECT_EPROTO(0x92, 50, 0x01, 0x00);                      /* trailing byte */
    EXPECT_EPROTO(0x93, 50, 0x01, 0xd4, 0x01, 0x00);          /* ext field */
    EXPECT_EPROTO(0x92, 50, 0xff);                            /* bad id */
}

Test(proto, ignores_extra_trailing_fields)
{
    struct proto_msg m;
    /* [2, 9, 4096, 1, 20, "future", [1, 2]] */
    DECODE_RAW(&m, 0x97, 0x02, 0x09, 0xcd, 0x10, 0x00, 0x01, 0x14,
               0xa6, 'f', 'u', 't', 'u', 'r', 'e', 0x92, 0x01, 0x02);
    cr_assert_eq(m.op, PROTO_OP_LEASE);
    cr_assert_eq(m.id, 9);
    cr_assert_eq(m.u.lease.size, 4096);
    cr_assert_eq(m.u.lease.flags, 1);
    cr_assert_eq(m.u.lease.wait_ms, 20);

    DECODE_RAW(&m, 0x95, 0x07, 0x03, 0x01, 0x02, 0x03);     /* [7, 3, 1, 2, 3] */
    cr_assert_eq(m.op, PROTO_OP_PING);
    cr_assert_eq(m.id, 3);

    /* [127, 5, 28, "full", nil]: msg is no longer last, so check its offset */
    static const uint8_t err[] = { 0x95, 0x7f, 0x05, 0x1c, 0xa4, 'f', 'u', 'l', 'l', 0xc0 };
    const char *why = NULL;
    cr_assert_eq(proto_decode(err, sizeof(err), PROTO_MAX_REPLY, &m, &why), 0);
    cr_assert_eq(m.op, PROTO_OP_ERROR);
    cr_assert_eq(m.id, 5);
    cr_assert_eq(m.u.error.code, 28);
    cr_assert_eq(m.u.error.msg_len, 4);
    cr_assert_eq((const void *)m.u.error.msg, (const void *)(err + 5));

    /* [3, 1, 2, 3, 4, bin "m", 1, 5, {1: 2}] */
    static const uint8_t pub[] = { 0x99, 0x03, 0x01, 0x02, 0x03, 0x04, 0xc4, 0x01, 'm', 0x01, 0x05,
                                   0x81, 0x01, 0x02 };
    cr_assert_eq(proto_decode(pub, sizeof(pub), PROTO_MAX_REPLY, &m, &why), 0);
    cr_assert_eq(m.u.publish.flags, 1);
    cr_assert_eq(m.u.publish.max_acquires, 5);
    cr_assert_eq(m.u.publish.handle, 2);
    cr_assert_eq(m.u.publish.size, 3);
    cr_assert_eq(m.u.publish.keep_ms, 4);
    cr_assert_eq(m.u.publish.meta_len, 1);
    cr_assert_eq((const void *)m.u.publish.meta, (const void *)(pub + 8));
}

/* Batches --------------------------------------------------------------------------- */

Test(proto, lease_many_round_trip_at_every_count)
{
    for (uint32_t n = 1; n <= PROTO_MAX_BATCH; n++) {
        struct proto_msg m = { .op = PROTO_OP_LEASE_MANY, .id = n }, d;
        m.u.lease_many.n = n;
        for (uint32_t i = 0; i < n; i++)
            m.u.lease_many.sizes[i] = (UINT64_C(1) << (i * 2)) + i;
        m.u.lease_many.wait_ms = n * 10;
        uint8_t buf[1024];
        size_t len = encode_ok(&m, buf, sizeof(buf));
        decode_ok(buf, len, &d);
        assert_msg_eq(&m, &d);

        struct proto_msg r = { .op = REPLY(PROTO_OP_LEASE_MANY), .id = n }, e;
        r.u.lease_many_reply.n = n;
        for (uint32_t i = 0; i < n; i++) {
            struct proto_item *it = &r.u.lease_many_reply.items[i];
            it->handle = UINT64_MAX - i;
            it->buf_id = i + 1;
            it->size = i;
            it->capacity = UINT64_MAX;
            fill_token(it->token, (uint8_t)i);
            it->has_fd = i % 2;
        }
        static uint8_t rbuf[PROTO_MAX_REPLY];
        len = encode_ok(&r, rbuf, sizeof(rbuf));
        decode_ok(rbuf, len, &e);
        assert_msg_eq(&r, &e);

        struct proto_msg q = { .op = PROTO_OP_RELEASE_MANY, .id = n }, f;
        q.u.release_many.n = n;
        for (uint32_t i = 0; i < n; i++)
            q.u.release_many.handles[i] = (UINT64_C(1) << 32 | i) + 1;
        len = encode_ok(&q, buf, sizeof(buf));
        decode_ok(buf, len, &f);
        assert_msg_eq(&q, &f);
    }
}

Test(proto, encode_refuses_batch_over_limit)
{
    uint8_t buf[4096];
    struct proto_msg m = { .op = PROTO_OP_LEASE_MANY, .id = 1 };
    m.u.lease_many.n = PROTO_MAX_BATCH + 1;
    cr_assert_eq(proto_encode(&m, buf, sizeof(buf)), -EMSGSIZE);
    m = (struct proto_msg){ .op = PROTO_OP_RELEASE_MANY, .id = 1 };
    m.u.release_many.n = PROTO_MAX_BATCH + 1;
    cr_assert_eq(proto_encode(&m, buf, sizeof(buf)), -EMSGSIZE);
    m = (struct proto_msg){ .op = REPLY(PROTO_OP_LEASE_MANY), .id = 1 };
    m.u.lease_many_reply.n = PROTO_MAX_BATCH + 1;
    cr_assert_eq(proto_encode(&m, buf, sizeof(buf)), -EMSGSIZE);
}

/* [9, 1, [n x 1], 0, 0] with n sizes */
static size_t build_lease_many(uint8_t *buf, uint32_t n)
{
    size_t pos = 0;
    buf[pos++] = 0x95;
    buf[pos++] = PROTO_OP_LEASE_MANY;
    buf[pos++] = 0x01;
    if (n < 16) {
        buf[pos++] = (uint8_t)(0x90 | n);
    } else {
        buf[pos++] = 0xdc;
        buf[pos++] = (uint8_t)(n >> 8);
        buf[pos++] = (uint8_t)n;
    }
    for (uint32_t i = 0; i < n; i++)
        buf[pos++] = 0x01;
    buf[pos++] = 0x00;
    buf[pos++] = 0x00;
    return pos;
}

Test(proto, rejects_bad_lease_many)
{
    uint8_t buf[128];
    expect_decode(-EPROTO, buf, build_lease_many(buf, 0), "lease_many of 0 items");
    expect_decode(-EPROTO, buf, build_lease_many(buf, PROTO_MAX_BATCH + 1), "lease_many of 33 items");
    struct proto_msg m;
    decode_ok(buf, build_lease_many(buf, PROTO_MAX_BATCH), &m);
    cr_assert_eq(m.u.lease_many.n, PROTO_MAX_BATCH);
    decode_ok(buf, build_lease_many(buf, 1), &m);
    cr_assert_eq(m.u.lease_many.n, 1);
    cr_assert_eq(m.u.lease_many.sizes[0], 1);

    EXPECT_EPROTO(0x95, 0x09, 0x01, 0x92, 0x01, 0xa1, '2', 0x00, 0x00);   /* a size as a string */
    EXPECT_EPROTO(0x95, 0x09, 0x01, 0x92, 0x01, 0xff, 0x00, 0x00);        /* a size -1 */
    EXPECT_EPROTO(0x95, 0x09, 0x01, 0x92, 0x01, 0xcb, 0x40, 0xb0, 0, 0, 0, 0, 0, 0, 0x00, 0x00); /* 4096.0 */
    EXPECT_EPROTO(0x95, 0x09, 0x01, 0x92, 0x01, 0x91, 0x01, 0x00, 0x00);  /* a size as an array */
    EXPECT_EPROTO(0x95, 0x09, 0x01, 0x01, 0x00, 0x00);                    /* sizes not an array */
    EXPECT_EPROTO(0x95, 0x09, 0x01, 0x81, 0x01, 0x01, 0x00, 0x00);        /* sizes a map */
    EXPECT_EPROTO(0x94, 0x09, 0x01, 0x91, 0x01, 0x00);                    /* wait_ms missing */
    EXPECT_EPROTO(0x95, 0x09, 0x01, 0x91, 0x01, 0x00, 0xff);              /* wait_ms -1 */
}

/* A lease_many reply with one item [handle, buf_id, size, capacity, token, has_fd]; the
 * bytes of the item's fields after the array header are given. */
Test(proto, rejects_bad_lease_many_reply)
{
    struct proto_msg r = { .op = REPLY(PROTO_OP_LEASE_MANY), .id = 3 }, d;
    r.u.lease_many_reply.n = 1;
    r.u.lease_many_reply.items[0] = (struct proto_item){ .handle = 1, .buf_id = 2, .size = 3, .capacity = 4 };
    uint8_t buf[128];
    size_t len = encode_ok(&r, buf, sizeof(buf));
    decode_ok(buf, len, &d);
    /* layout: 93 49 03 91 96 01 02 03 04 c4 10 <16> 00 */
    cr_assert_eq(buf[3], 0x91);
    cr_assert_eq(buf[4], 0x96);
    cr_assert_eq(len, 5 + 4 + 2 + PROTO_TOKEN_LEN + 1);

    uint8_t bad[128];
    memcpy(bad, buf, len);
    bad[len - 1] = 0x02;                          /* has_fd 2 */
    expect_decode(-EPROTO, bad, len, "has_fd 2");
    memcpy(bad, buf, len);
    bad[7] = 0x05;                                /* size 5 > capacity 4 */
    expect_decode(-EPROTO, bad, len, "size over capacity");
    memcpy(bad, buf, len);
    bad[7] = 0xa1;                                /* size as a 1-byte string "\x04"... */
    expect_decode(-EPROTO, bad, len, "size as a string");
    memcpy(bad, buf, len);
    bad[4] = 0x95;                                /* 5 fields: has_fd missing, token then trails */
    expect_decode(-EPROTO, bad, len - 1, "item without has_fd");
    memcpy(bad, buf, len);
    bad[10] = 0x0f;                               /* a 15-byte token */
    expect_decode(-EPROTO, bad, len - 1, "token of 15 bytes");

    EXPECT_EPROTO(0x93, 0x49, 0x03, 0x91, 0x01);  /* item not an array */
    EXPECT_EPROTO(0x93, 0x49, 0x03, 0x91, 0xc0);  /* item nil */
    EXPECT_EPROTO(0x93, 0x49, 0x03, 0x90);        /* no items */
    EXPECT_EPROTO(0x92, 0x49, 0x03);              /* items missing */
}

Test(proto, rejects_bad_release_many)
{
    EXPECT_EPROTO(0x94, 0x0a, 0x01, 0x90, 0x00);               /* no handles */
    EXPECT_EPROTO(0x94, 0x0a, 0x01, 0x92, 0x01, 0xa1, 'x', 0x00); /* a handle as a string */
    EXPECT_EPROTO(0x94, 0x0a, 0x01, 0x92, 0x01, 0xd0, 0xff, 0x00); /* a handle -1 */
    EXPECT_EPROTO(0x94, 0x0a, 0x01, 0x01, 0x00);               /* handles not an array */
    EXPECT_EPROTO(0x93, 0x0a, 0x01, 0x91, 0x01);               /* flags missing */
    EXPECT_EPROTO(0x94, 0x0a, 0x01, 0x91, 0x01, 0xc2);         /* flags false */
    uint8_t buf[128];
    size_t pos = 0;
    buf[pos++] = 0x94;
    buf[pos++] = PROTO_OP_RELEASE_MANY;
    buf[pos++] = 0x01;
    buf[pos++] = 0xdc;
    buf[pos++] = 0x00;
    buf[pos++] = PROTO_MAX_BATCH + 1;
    for (unsigned i = 0; i < PROTO_MAX_BATCH + 1; i++)
        buf[pos++] = 0x01;
    buf[pos++] = 0x00;
    expect_decode(-EPROTO, buf, pos, "release_many of 33 handles");
    buf[5] = PROTO_MAX_BATCH;
    struct proto_msg m;
    buf[pos - 2] = 0x00;          /* the 33rd handle's byte becomes the flags */
    decode_ok(buf, pos - 1, &m);
    cr_assert_eq(m.u.release_many.n, PROTO_MAX_BATCH);
}

/* proto_check ---------------------------------------------------------------------- */

static int check_nested(unsigned n, const uint8_t *hdr, size_t hdr_len, unsigned max_depth,
                        const char **ret_why)
{
    uint8_t buf[1024];
    cr_assert(n * hdr_len + 1 <= sizeof(buf));
    size_t len = build_nested(buf, n, hdr, hdr_len);
    return proto_check(buf, len, max_depth, ret_why);
}

Test(proto, check_accepts_depth_limit_and_refuses_deeper)
{
    static const struct { const uint8_t *hdr; size_t len; } kinds[] = {
        { hdr_fixarray, sizeof(hdr_fixarray) }, { hdr_array16, sizeof(hdr_array16) },
        { hdr_array32, sizeof(hdr_array32) }, { hdr_fixmap, sizeof(hdr_fixmap) },
        { hdr_map16, sizeof(hdr_map16) },
    };
    for (unsigned k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        const char *why = NULL;
        cr_assert_eq(check_nested(PROTO_MAX_DEPTH, kinds[k].hdr, kinds[k].len, PROTO_MAX_DEPTH, &why), 0,
                     "kind %u: %s", k, why ? why : "?");
        why = NULL;
        cr_assert_eq(check_nested(PROTO_MAX_DEPTH + 1, kinds[k].hdr, kinds[k].len, PROTO_MAX_DEPTH, &why),
                     -EPROTO, "kind %u", k);
        cr_assert(why && why[0]);
    }

    /* mixed arrays and maps, with siblings after each nested level:
     * [{1: [{1: [{1: [{1: 0}, 2]}, 2]}, 2]}, 2] is 8 levels deep */
    uint8_t buf[128];
    size_t pos = 0;
    for (unsigned i = 0; i < PROTO_MAX_DEPTH / 2; i++) {
        buf[pos++] = 0x92;          /* [ */
        buf[pos++] = 0x81;          /* {1: */
        buf[pos++] = 0x01;
    }
    buf[pos++] = 0x00;
    for (unsigned i = 0; i < PROTO_MAX_DEPTH / 2; i++)
        buf[pos++] = 0x02;          /* the array's second element */
    const char *why = NULL;
    cr_assert_eq(proto_check(buf, pos, PROTO_MAX_DEPTH, &why), 0, "%s", why ? why : "?");
    cr_assert_eq(proto_check(buf, pos - 1, PROTO_MAX_DEPTH, &why), -EPROTO);
    memmove(buf + 1, buf, pos);
    buf[0] = 0x91;
    cr_assert_eq(proto_check(buf, pos + 1, PROTO_MAX_DEPTH, &why), -EPROTO);

    /* proto_decode uses PROTO_MAX_DEPTH: a ping whose extra field nests 7 more levels
     * is 8 deep and fine, 8 more is too deep */
    pos = 0;
    buf[pos++] = 0x93; buf[pos++] = 0x07; buf[pos++] = 0x01;
    pos += build_nested(buf + pos, PROTO_MAX_DEPTH - 1, hdr_fixarray, 1);
    struct proto_msg m;
    cr_assert_eq(proto_decode(buf, pos, PROTO_MAX_REPLY, &m, &why), 0, "%s", why);
    cr_assert_eq(m.op, PROTO_OP_PING);
    pos = 3;
    pos += build_nested(buf + pos, PROTO_MAX_DEPTH, hdr_fixarray, 1);
    expect_decode(-EPROTO, buf, pos, "ping with 9 levels");
}

Test(proto, check_honours_smaller_max_depth)
{
    const char *why = NULL;
    static const uint8_t scalar[] = { 0x05 };
    static const uint8_t flat[] = { 0x92, 0x01, 0x02 };
    static const uint8_t two[] = { 0x92, 0x91, 0x01, 0x02 };
    cr_assert_eq(proto_check(scalar, sizeof(scalar), 0, &why), 0);
    cr_assert_eq(proto_check(flat, sizeof(flat), 0, &why), -EPROTO);
    cr_assert_eq(proto_check(flat, sizeof(flat), 1, &why), 0);
    cr_assert_eq(proto_check(two, sizeof(two), 1, &why), -EPROTO);
    cr_assert_eq(proto_check(two, sizeof(two), 2, &why), 0);
    for (unsigned d = 1; d <= PROTO_MAX_DEPTH; d++) {
        cr_assert_eq(check_nested(d, hdr_fixarray, 1, d, &why), 0, "depth %u", d);
        cr_assert_eq(check_nested(d, hdr_fixarray, 1, d - 1, &why), -EPROTO, "depth %u max %u", d, d - 1);
    }
}

Test(proto, check_clamps_max_depth)
{
    const char *why = NULL;
    /* a caller asking for more than PROTO_MAX_DEPTH gets PROTO_MAX_DEPTH, not a stack
     * overrun (ASan would see one) */
    cr_assert_eq(check_nested(PROTO_MAX_DEPTH, hdr_fixarray, 1, 1000, &why), 0);
    cr_assert_eq(check_nested(PROTO_MAX_DEPTH + 1, hdr_fixarray, 1, 1000, &why), -EPROTO);
    cr_assert_eq(check_nested(500, hdr_fixarray, 1, UINT32_MAX, &why), -EPROTO);
    cr_assert_eq(check_nested(100, hdr_fixmap, sizeof(hdr_fixmap), UINT32_MAX, &why), -EPROTO);
}

Test(proto, check_scalar_lengths)
{
    static const struct { uint8_t type; unsigned payload; } fixed[] = {
        { 0xca, 4 }, { 0xcb, 8 }, { 0xcc, 1 }, { 0xcd, 2 }, { 0xce, 4 }, { 0xcf, 8 },
        { 0xd0, 1 }, { 0xd1, 2 }, { 0xd2, 4 }, { 0xd3, 8 }, { 0xa0, 0 }, { 0xa5, 5 },
        { 0xbf, 31 }, { 0x00, 0 }, { 0x7f, 0 }, { 0xe0, 0 }, { 0xff, 0 }, { 0xc0, 0 },
        { 0xc2, 0 }, { 0xc3, 0 },
    };
    const char *why = NULL;
    for (unsigned i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        uint8_t buf[40] = { fixed[i].type };
        size_t len = 1 + fixed[i].payload;
        cr_assert_eq(proto_check(buf, len, 1, &why), 0, "type 0x%02x", fixed[i].type);
        cr_assert_eq(proto_check(buf, len + 1, 1, &why), -EPROTO, "type 0x%02x + 1", fixed[i].type);
        if (fixed[i].payload)
            cr_assert_eq(proto_check(buf, len - 1, 1, &why), -EPROTO, "type 0x%02x - 1", fixed[i].type);
    }

    /* str/bin 8, 16, 32 with a 3-byte payload */
    static const struct { uint8_t type; unsigned hdr; } var[] = {
        { 0xd9, 1 }, { 0xc4, 1 }, { 0xda, 2 }, { 0xc5, 2 }, { 0xdb, 4 }, { 0xc6, 4 },
    };
    for (unsigned i = 0; i < sizeof(var) / sizeof(var[0]); i++) {
        uint8_t buf[16] = { var[i].type };
        buf[var[i].hdr] = 3;
        size_t len = 1 + var[i].hdr + 3;
        cr_assert_eq(proto_check(buf, len, 1, &why), 0, "type 0x%02x", var[i].type);
        cr_assert_eq(proto_check(buf, len - 1, 1, &why), -EPROTO, "type 0x%02x short", var[i].type);
        cr_assert_eq(proto_check(buf, len + 1, 1, &why), -EPROTO, "type 0x%02x long", var[i].type);
        cr_assert_eq(proto_check(buf, 1 + var[i].hdr - 1, 1, &why), -EPROTO, "type 0x%02x no header", var[i].type);
    }
}

Test(proto, check_reports_reason)
{
    static const uint8_t truncated[] = { 0x92, 0x01 };
    static const uint8_t deep[] = { 0x91, 0x91, 0x01 };
    static const uint8_t ext[] = { 0xd4, 0x01, 0x00 };
    static const uint8_t trailing[] = { 0x01, 0x02 };
    const char *w_trunc = NULL, *w_deep = NULL, *w_ext = NULL, *w_trail = NULL;

    cr_assert_eq(proto_check(truncated, sizeof(truncated), 8, &w_trunc), -EPROTO);
    cr_assert_eq(proto_check(deep, sizeof(deep), 1, &w_deep), -EPROTO);
    cr_assert_eq(proto_check(ext, sizeof(ext), 8, &w_ext), -EPROTO);
    cr_assert_eq(proto_check(trailing, sizeof(trailing), 8, &w_trail), -EPROTO);
    cr_assert(w_trunc && w_trunc[0] && w_deep && w_deep[0] && w_ext && w_ext[0] && w_trail && w_trail[0]);
    /* the reasons tell the failures apart */
    cr_assert_str_neq(w_trunc, w_deep);
    cr_assert_str_neq(w_trunc, w_ext);
    cr_assert_str_neq(w_trunc, w_trail);
    cr_assert_str_neq(w_deep, w_ext);
    cr_assert_str_neq(w_deep, w_trail);
    cr_assert_str_neq(w_ext, w_trail);

    /* ret_why is optional */
    cr_assert_eq(proto_check(truncated, sizeof(truncated), 8, NULL), -EPROTO);
    cr_assert_eq(proto_check(deep, 0, 8, NULL), -EPROTO);

    /* proto_decode passes proto_check's reason on */
    struct proto_msg m;
    const char *why = NULL;
    cr_assert_eq(proto_decode(ext, sizeof(ext), PROTO_MAX_REPLY, &m, &why), -EPROTO);
    cr_assert_str_eq(why, w_ext);
}

/* Regression: an empty array or map counts as a nesting level, as proto.h says. */
Test(proto, check_counts_empty_containers_toward_depth)
{
    uint8_t buf[16];
    memset(buf, 0x91, PROTO_MAX_DEPTH);
    buf[PROTO_MAX_DEPTH] = 0x90;
    const char *why = NULL;
    cr_assert_eq(proto_check(buf, PROTO_MAX_DEPTH + 1, PROTO_MAX_DEPTH, &why), -EPROTO);
    static const uint8_t empty[] = { 0x90 };
    cr_assert_eq(proto_check(empty, 1, 0, &why), -EPROTO);
}

/* Fuzz ----------------------------------------------------------------------------- */

struct rng { uint64_t s; };

static uint64_t rng_next(struct rng *r)
{
    uint64_t x = r->s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return r->s = x;
}

static unsigned rng_below(struct rng *r, unsigned n)
{
    return (unsigned)(rng_next(r) % n);
}

struct outcomes { unsigned ok, eproto, eopnotsupp; };

/* The decoder's whole contract on arbitrary bytes: one of three results; on success
 * every pointer lies inside the input and the message re-encodes to itself; on
 * -EOPNOTSUPP the op really is unknown. */
static void check_any_input(const uint8_t *bytes, size_t len, uint64_t iter, struct outcomes *out)
{
    uint8_t *copy = malloc(len ? len : 1);
    cr_assert_not_null(copy);
    memcpy(copy, bytes, len);
    struct proto_msg m;
    const char *why = NULL;
    int r = proto_decode(copy, len, PROTO_MAX_REPLY, &m, &why);

    cr_assert(r == 0 || r == -EPROTO || r == -EOPNOTSUPP, "iter %llu len %zu: proto_decode = %d",
              (unsigned long long)iter, len, r);
    if (r < 0) {
        cr_assert(why && why[0], "iter %llu: no reason", (unsigned long long)iter);
        if (r == -EOPNOTSUPP) {
            cr_assert_str_eq(proto_op_name(m.op), "unknown", "iter %llu op %u", (unsigned long long)iter, m.op);
            out->eopnotsupp++;
        } else {
            out->eproto++;
        }
        free(copy);
        return;
    }
    out->ok++;
    cr_assert_str_neq(proto_op_name(m.op), "unknown", "iter %llu op %u", (unsigned long long)iter, m.op);
    switch (m.op) {
    case PROTO_OP_HELLO:
        assert_inside(m.u.hello.name, m.u.hello.name_len, copy, len, "name");
        cr_assert_leq(m.u.hello.name_len, PROTO_MAX_NAME);
        break;
    case REPLY(PROTO_OP_LEASE):
    case REPLY(PROTO_OP_ACQUIRE):
    case REPLY(PROTO_OP_MAP):
    case REPLY(PROTO_OP_ADOPT):
        assert_inside(m.u.lease_reply.meta, m.u.lease_reply.meta_len, copy, len, "meta");
        cr_assert_leq(m.u.lease_reply.size, m.u.lease_reply.capacity);
        break;
    case PROTO_OP_PUBLISH:
        assert_inside(m.u.publish.meta, m.u.publish.meta_len, copy, len, "meta");
        break;
    case REPLY(PROTO_OP_STATUS):
        assert_inside(m.u.status_reply.body, m.u.status_reply.body_len, copy, len, "body");
        break;
    case PROTO_OP_ERROR:
        assert_inside(m.u.error.msg, m.u.error.msg_len, copy, len, "msg");
        cr_assert_gt(m.u.error.code, 0);
        break;
    default:
        break;
    }
    uint8_t again[512];
    struct proto_msg d;
    int n = proto_encode(&m, again, sizeof(again));
    cr_assert_gt(n, 0, "iter %llu: re-encode = %d", (unsigned long long)iter, n);
    r = proto_decode(again, (size_t)n, PROTO_MAX_REPLY, &d, &why);
    cr_assert_eq(r, 0, "iter %llu: re-decode = %d (%s)", (unsigned long long)iter, r, why);
    assert_msg_eq(&m, &d);
    free(copy);
}

Test(proto, fuzz_mutated_messages)
{
    static const uint8_t interesting[] = {
        0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xc0, 0xc1, 0xc4, 0xc6, 0xc7, 0xcf, 0xd4, 0xd9,
        0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff,
    };
    struct rng rng = { 0x9e3779b97f4a7c15ull };
    struct outcomes out = { 0, 0, 0 };
    for (uint64_t iter = 0; iter < 150000; iter++) {
        struct proto_msg m;
        uint8_t buf[256];
        make_msg(known_ops[iter % N_KNOWN_OPS], (uint32_t)rng_next(&rng), &m);
        size_t len = encode_ok(&m, buf, 128);
        unsigned edits = 1 + rng_below(&rng, 4);
        for (unsigned e = 0; e < edits && len > 0; e++) {
            size_t at = rng_below(&rng, (unsigned)len);
            switch (rng_below(&rng, 6)) {
            case 0: buf[at] ^= (uint8_t)(1u << rng_below(&rng, 8)); break;
            case 1: buf[at] = (uint8_t)rng_next(&rng); break;
            case 2: buf[at] = interesting[rng_below(&rng, sizeof(interesting))]; break;
            case 3: len = at; break;                                 /* truncate */
            case 4: if (len < sizeof(buf)) buf[len++] = (uint8_t)rng_next(&rng); break;
            case 5: buf[at] = (uint8_t)(buf[at] + 1 - 2 * rng_below(&rng, 2)); break;
            }
        }
        check_any_input(buf, len, iter, &out);
    }
    /* the fixed seed reaches all three outcomes; if not, the loop tests too little */
    cr_assert_gt(out.ok, 1000);
    cr_assert_gt(out.eproto, 1000);
    cr_assert_gt(out.eopnotsupp, 100);
}

Test(proto, fuzz_random_bytes)
{
    struct rng rng = { 0x2545f4914f6cdd1dull };
    struct outcomes out = { 0, 0, 0 };
    for (uint64_t iter = 0; iter < 50000; iter++) {
        uint8_t buf[64];
        size_t len = rng_below(&rng, 65);
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)rng_next(&rng);
        /* half the time, start like a message so decoding gets past the envelope */
        if (len >= 2 && (iter & 1)) {
            buf[0] = (uint8_t)(0x90 | rng_below(&rng, 16));
            buf[1] = (uint8_t)rng_below(&rng, 128);
        }
        check_any_input(buf, len, iter, &out);
    }
    cr_assert_gt(out.eproto, 1000);
    cr_assert_gt(out.eopnotsupp + out.ok, 0);
}

/* proto_op_name -------------------------------------------------------------------- */

Test(proto, op_names)
{
    static const struct { uint32_t op; const char *name; } names[] = {
        { PROTO_OP_HELLO, "hello" }, { PROTO_OP_LEASE, "lease" }, { PROTO_OP_PUBLISH, "publish" },
        { PROTO_OP_ACQUIRE, "acquire" }, { PROTO_OP_RELEASE, "release" },
        { PROTO_OP_STATUS, "status" }, { PROTO_OP_PING, "ping" },
        { REPLY(PROTO_OP_HELLO), "hello" }, { REPLY(PROTO_OP_LEASE), "lease" },
        { REPLY(PROTO_OP_PUBLISH), "publish" }, { REPLY(PROTO_OP_ACQUIRE), "acquire" },
        { REPLY(PROTO_OP_RELEASE), "release" }, { REPLY(PROTO_OP_STATUS), "status" },
        { REPLY(PROTO_OP_PING), "ping" }, { PROTO_OP_ERROR, "error" },
        { PROTO_OP_FORGET, "forget" }, { PROTO_OP_LEASE_MANY, "lease_many" },
        { PROTO_OP_RELEASE_MANY, "release_many" }, { REPLY(PROTO_OP_LEASE_MANY), "lease_many" },
        { REPLY(PROTO_OP_RELEASE_MANY), "release_many" }, { PROTO_OP_TOOK, "unknown" },
        { PROTO_OP_NUDGE, "unknown" }, { REPLY(PROTO_OP_TOOK), "unknown" }, { REPLY(PROTO_OP_NUDGE), "unknown" },
        { PROTO_OP_BYE, "bye" }, { REPLY(PROTO_OP_BYE), "unknown" },
        { REPLY(PROTO_OP_FORGET), "unknown" }, { PROTO_OP_RETAIN, "retain" },
        { REPLY(PROTO_OP_RETAIN), "retain" }, { PROTO_OP_MAP, "map" }, { REPLY(PROTO_OP_MAP), "map" },
        { PROTO_OP_GIVEBACK, "giveback" }, { REPLY(PROTO_OP_GIVEBACK), "unknown" }, { PROTO_OP_ADOPT, "adopt" },
        { REPLY(PROTO_OP_ADOPT), "adopt" }, { 18, "unknown" }, { 75, "unknown" },
        { 0, "unknown" }, { 50, "unknown" }, { 63, "unknown" },
        { PROTO_OP_REPLY, "unknown" }, { 72, "unknown" }, { 99, "unknown" }, { 126, "unknown" },
        { 128, "unknown" }, { 128 + PROTO_OP_HELLO, "unknown" }, { 191, "unknown" },
        { UINT32_MAX, "unknown" },
    };
    for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        cr_assert_str_eq(proto_op_name(names[i].op), names[i].name, "op %u", names[i].op);
}

/* Version 3's flags (issue 17): a stock lease and lease_many, an acquire reply that says
 * the buffer will be retired; distinct bits, carried as they are. */
Test(proto, version_3_flags_round_trip)
{
    cr_assert_eq(PROTO_VERSION, 3);
    cr_assert_eq(PROTO_BUF_SEALED & PROTO_BUF_RETIRE, 0);
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 1 }, d;
    uint8_t buf[512];
    m.u.lease.size = 4096;
    m.u.lease.flags = PROTO_LEASE_STOCK;
    decode_ok(buf, encode_ok(&m, buf, sizeof(buf)), &d);
    cr_assert_eq(d.u.lease.flags, PROTO_LEASE_STOCK);

    m = (struct proto_msg){ .op = PROTO_OP_LEASE_MANY, .id = 2 };
    m.u.lease_many.n = 2;
    m.u.lease_many.sizes[0] = m.u.lease_many.sizes[1] = 65536;
    m.u.lease_many.flags = PROTO_LEASE_STOCK;
    decode_ok(buf, encode_ok(&m, buf, sizeof(buf)), &d);
    cr_assert_eq(d.u.lease_many.flags, PROTO_LEASE_STOCK);
    cr_assert_eq(d.u.lease_many.n, 2);

    m = (struct proto_msg){ .op = REPLY(PROTO_OP_ACQUIRE), .id = 3 };
    m.u.acquire_reply.handle = 9;
    m.u.acquire_reply.buf_id = 10;
    m.u.acquire_reply.size = m.u.acquire_reply.capacity = 4096;
    m.u.acquire_reply.flags = PROTO_BUF_SEALED | PROTO_BUF_RETIRE;
    decode_ok(buf, encode_ok(&m, buf, sizeof(buf)), &d);
    cr_assert_eq(d.u.acquire_reply.flags, PROTO_BUF_SEALED | PROTO_BUF_RETIRE);
}

/* The ledger's ops (PROTO_FEAT_LEDGER): took [buf_id, token] and nudge [buf_id], both
 * requests without a reply; every field required and checked. */
Test(proto, retired_ops_and_bye_fields_are_checked)
{
    struct proto_msg m;
    /* took [11, 1, 7, bin16] and nudge [12, 2, buf_id]: retired with the ledger, unknown now */
    uint8_t took[5 + 2 + PROTO_TOKEN_LEN] = { 0x94, 11, 0x01, 0x07, 0xc4, PROTO_TOKEN_LEN };
    expect_unsupported(took, 6 + PROTO_TOKEN_LEN, PROTO_OP_TOOK, 1);
    static const uint8_t nudge[] = { 0x93, 12, 0x02, 0x07 };
    expect_unsupported(nudge, sizeof(nudge), PROTO_OP_NUDGE, 2);

    DECODE_RAW(&m, 0x92, 13, 0x03); /* bye: no field */
    cr_assert_eq(m.op, PROTO_OP_BYE);
    cr_assert_eq(m.id, 3);
    DECODE_RAW(&m, 0x93, 13, 0x04, 0x07); /* a trailing field is ignored, as in every message */
    cr_assert_eq(m.op, PROTO_OP_BYE);
    EXPECT_EPROTO(0x91, 13);                                   /* no id */
}
