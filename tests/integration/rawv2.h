/* SPDX-License-Identifier: MIT */
/* rawv2.h: protocol version 2 spoken raw (rawclient + proto/), for the integration tests
 * of waits and batches: what the daemon does on the wire, independent of libshmref. Test
 * code only; every helper asserts with Criterion. */
#ifndef SHMREF_TEST_RAWV2_H
#define SHMREF_TEST_RAWV2_H

#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "proto.h"
#include "rawclient.h"

/* rv_send: encode and send m (the connection must be open). */
static inline void rv_send(int fd, const struct proto_msg *m)
{
    static uint8_t buf[PROTO_MAX_REQUEST];
    int n = proto_encode(m, buf, sizeof(buf));
    cr_assert_gt(n, 0, "encode op %u", m->op);
    cr_assert_eq(rawclient_send(fd, buf, (size_t)n), 0, "send op %u", m->op);
}

/* rv_recv: the next message within ms, decoded into *ret (pointers into a static buffer,
 * valid until the next call); its fds into fds (max of them, *ret_n). Returns its length,
 * 0 on EOF, -ETIMEDOUT when nothing came. */
static inline ssize_t rv_recv_fds(int fd, int ms, struct proto_msg *ret, int *fds, unsigned max, unsigned *ret_n)
{
    static uint8_t buf[PROTO_MAX_REPLY];
    unsigned n_ = 0;
    ssize_t n = rawclient_recv_fds(fd, buf, sizeof(buf), fds, max, ret_n ? ret_n : &n_, ms);
    if (n > 0) {
        const char *why = NULL;
        int r = proto_decode(buf, (size_t)n, sizeof(buf), ret, &why);
        cr_assert_eq(r, 0, "a reply that does not decode: %s", why ? why : "?");
    }
    if (!ret_n)
        for (unsigned i = 0; i < n_; i++)
            close(fds[i]);
    return n;
}

static inline ssize_t rv_recv(int fd, int ms, struct proto_msg *ret)
{
    int fds[64];
    return rv_recv_fds(fd, ms, ret, fds, 64, NULL);
}

/* rv_hello: a v2 hello with features; returns the features agreed. */
static inline uint64_t rv_hello(int fd, uint64_t features)
{
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.features = features;
    m.u.hello.name = "rawv2";
    m.u.hello.name_len = 5;
    rv_send(fd, &m);
    cr_assert_gt(rv_recv(fd, 5000, &r), 0, "no hello reply");
    cr_assert_eq(r.op, PROTO_OP_HELLO + PROTO_OP_REPLY, "hello: %.*s", (int)r.u.error.msg_len, r.u.error.msg);
    return r.u.hello_reply.features;
}

/* rv_connect: a raw connection that said hello (features as given). */
static inline int rv_connect(const struct daemon *d, uint64_t features)
{
    int fd = raw_connect(d);
    rv_hello(fd, features);
    return fd;
}

static inline void rv_lease_send(int fd, uint32_t id, uint64_t size, uint32_t wait_ms)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = id };
    m.u.lease.size = size;
    m.u.lease.wait_ms = wait_ms;
    rv_send(fd, &m);
}

static inline void rv_acquire_send(int fd, uint32_t id, const uint8_t *token, uint32_t wait_ms)
{
    struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = id };
    memcpy(m.u.acquire.token, token, PROTO_TOKEN_LEN);
    m.u.acquire.wait_ms = wait_ms;
    rv_send(fd, &m);
}

/* rv_publish_send: a one-way publish (NOREPLY) of size bytes. */
static inline void rv_publish_send(int fd, uint32_t id, uint64_t handle, uint64_t size)
{
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = id };
    m.u.publish.handle = handle;
    m.u.publish.size = size;
    m.u.publish.flags = PROTO_PUBLISH_NOREPLY;
    rv_send(fd, &m);
}

static inline void rv_release_send(int fd, uint32_t id, uint64_t handle)
{
    struct proto_msg m = { .op = PROTO_OP_RELEASE, .id = id };
    m.u.release.handle = handle;
    m.u.release.flags = PROTO_RELEASE_NOREPLY;
    rv_send(fd, &m);
}

/* rv_expect: the next message is op with id (an error's text in the failure). */
static inline void rv_expect(int fd, int ms, uint32_t op, uint32_t id, struct proto_msg *ret, const char *what)
{
    ssize_t n = rv_recv(fd, ms, ret);
    cr_assert_gt(n, 0, "%s: nothing came (%zd)", what, n);
    cr_assert_eq(ret->op, op, "%s: op %u (%s), expected %u: %.*s", what, ret->op, proto_op_name(ret->op), op,
                 ret->op == PROTO_OP_ERROR ? (int)ret->u.error.msg_len : 0,
                 ret->op == PROTO_OP_ERROR ? ret->u.error.msg : "");
    cr_assert_eq(ret->id, id, "%s: id %u, expected %u", what, ret->id, id);
}

/* rv_expect_error: the next message is an error with code for id; its text into text. */
static inline void rv_expect_error(int fd, int ms, uint32_t id, int code, char *text, size_t cap, const char *what)
{
    struct proto_msg r;
    rv_expect(fd, ms, PROTO_OP_ERROR, id, &r, what);
    cr_assert_eq(r.u.error.code, code, "%s: error %d (%s), expected %d: %.*s", what, r.u.error.code,
                 strerror(r.u.error.code), code, (int)r.u.error.msg_len, r.u.error.msg);
    if (text)
        snprintf(text, cap, "%.*s", (int)r.u.error.msg_len, r.u.error.msg);
}

/* rv_lease: a lease that must be granted now; its token into token (if not NULL). */
static inline uint64_t rv_lease(int fd, uint32_t id, uint64_t size, uint8_t *token)
{
    struct proto_msg r;
    rv_lease_send(fd, id, size, 0);
    rv_expect(fd, 5000, PROTO_OP_LEASE + PROTO_OP_REPLY, id, &r, "lease");
    if (token)
        memcpy(token, r.u.lease_reply.token, PROTO_TOKEN_LEN);
    return r.u.lease_reply.handle;
}

/* rv_nothing: nothing arrives within ms. */
static inline void rv_nothing(int fd, int ms, const char *what)
{
    struct proto_msg r;
    ssize_t n = rv_recv(fd, ms, &r);
    cr_assert_eq(n, -ETIMEDOUT, "%s: got op %u (%s)%s%.*s", what, n > 0 ? r.op : 0, n > 0 ? proto_op_name(r.op) : "",
                 n > 0 && r.op == PROTO_OP_ERROR ? ": " : "", n > 0 && r.op == PROTO_OP_ERROR ? (int)r.u.error.msg_len : 0,
                 n > 0 && r.op == PROTO_OP_ERROR ? r.u.error.msg : "");
}

#endif
