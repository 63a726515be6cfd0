/* SPDX-License-Identifier: MIT */
/* test-hostile.c: a real shmrefd against clients that lie, flood, pass fds or send junk.
 * Invariant under test: a bad client gets an error reply or is disconnected, nothing it
 * held stays charged, and every other client keeps getting the whole lease cycle. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "proto.h"
#include "rawclient.h"

#define WAIT_MS 5000
#define ANY_ID (-1LL)
#define HANDLE(gen, slot) ((uint64_t)(gen) << 32 | (slot))



/* ---- raw messages ---------------------------------------------------------------- */

static size_t enc(const struct proto_msg *m, uint8_t *buf, size_t cap)
{
    int n = proto_encode(m, buf, cap);
    cr_assert_gt(n, 0, "proto_encode(op %u) failed: %d", (unsigned)m->op, n);
    return (size_t)n;
}

static size_t enc_simple(uint8_t *buf, size_t cap, uint32_t op, uint32_t id)
{
    struct proto_msg m = { .op = op, .id = id };
    return enc(&m, buf, cap);
}

static size_t enc_hello(uint8_t *buf, size_t cap, uint32_t id, uint32_t version)
{
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = id };
    m.u.hello.version = version;
    m.u.hello.name = "hostile";
    m.u.hello.name_len = 7;
    return enc(&m, buf, cap);
}

static size_t enc_lease(uint8_t *buf, size_t cap, uint32_t id, uint64_t size)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = id };
    m.u.lease.size = size;
    return enc(&m, buf, cap);
}

static size_t enc_publish(uint8_t *buf, size_t cap, uint32_t id, uint64_t handle, uint64_t size,
                          const void *meta, uint32_t meta_len)
{
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = id };
    m.u.publish.handle = handle;
    m.u.publish.size = size;
    m.u.publish.meta = meta;
    m.u.publish.meta_len = meta_len;
    return enc(&m, buf, cap);
}

static size_t enc_acquire(uint8_t *buf, size_t cap, uint32_t id, const uint8_t *token)
{
    struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = id };
    memcpy(m.u.acquire.token, token, PROTO_TOKEN_LEN);
    return enc(&m, buf, cap);
}

static size_t enc_release(uint8_t *buf, size_t cap, uint32_t id, uint64_t handle, uint32_t flags)
{
    struct proto_msg m = { .op = PROTO_OP_RELEASE, .id = id };
    m.u.release.handle = handle;
    m.u.release.flags = flags;
    return enc(&m, buf, cap);
}

/* enc_padded_ping: [7, id, bin32(padding)], exactly total bytes: a valid ping of any size
 * (trailing fields are ignored by the protocol). */
static size_t enc_padded_ping(uint8_t *buf, uint32_t id, size_t total)
{
    cr_assert(total >= 8 && id < 128);
    uint32_t n = (uint32_t)(total - 8);
    buf[0] = 0x93;
    buf[1] = PROTO_OP_PING;
    buf[2] = (uint8_t)id;
    buf[3] = 0xc6;
    buf[4] = (uint8_t)(n >> 24);
    buf[5] = (uint8_t)(n >> 16);
    buf[6] = (uint8_t)(n >> 8);
    buf[7] = (uint8_t)n;
    memset(buf + 8, 0xab, n);
    return total;
}

/* ---- raw I/O ---------------------------------------------------------------------- */

/* The raw I/O is tests/support's raw client; these assert what every caller here wants. */

static ssize_t recv_nb(int fd, uint8_t *buf, size_t cap, int *ret_fd)
{
    return rawclient_recv(fd, buf, cap, ret_fd);
}

/* recv_one: like recv_nb, waiting up to ms; -ETIMEDOUT if nothing came. Fds are closed. */
static ssize_t recv_one(int fd, uint8_t *buf, size_t cap, int ms)
{
    return rawclient_recv_wait(fd, buf, cap, ms);
}

static void send_all(int fd, const void *msg, size_t len)
{
    int r = rawclient_send(fd, msg, len);
    cr_assert_eq(r, 0, "send of %zu bytes: %s", len, strerror(-r));
}

/* call: send one message, return its reply as recv_one does. */
static ssize_t call(int fd, const void *msg, size_t len, uint8_t *rep, size_t cap)
{
    send_all(fd, msg, len);
    return recv_one(fd, rep, cap, WAIT_MS);
}

static struct proto_msg decode_reply(const char *what, const uint8_t *rep, ssize_t n)
{
    struct proto_msg m;
    const char *why = "";
    cr_assert_gt(n, 0, "%s: expected a reply, got %s", what,
                 n == 0 ? "a closed connection" : strerror((int)-n));
    int r = proto_decode(rep, (size_t)n, PROTO_MAX_REPLY, &m, &why);
    cr_assert_eq(r, 0, "%s: the daemon's reply does not decode: %s", what, why);
    return m;
}

/* expect_error: rep holds an error reply with code, a non-empty message and (unless
 * ANY_ID) this id. The message is copied into text (PROTO_MAX_ERRMSG + 1) if not NULL. */
static void expect_error(const char *what, const uint8_t *rep, ssize_t n, long long id, int code,
                         char *text)
{
    struct proto_msg m = decode_reply(what, rep, n);
    cr_assert_eq(m.op, PROTO_OP_ERROR, "%s: expected an error reply, got op %u (%s)", what,
                 (unsigned)m.op, proto_op_name(m.op));
    cr_assert_eq(m.u.error.code, code, "%s: error code %d (%s), expected %d (%s): %.*s", what,
                 m.u.error.code, strerror(m.u.error.code), code, strerror(code),
                 (int)m.u.error.msg_len, m.u.error.msg);
    cr_assert_gt(m.u.error.msg_len, 0, "%s: error reply without a message", what);
    if (id != ANY_ID)
        cr_assert_eq(m.id, (uint32_t)id, "%s: error reply has id %u, expected %lld", what,
                     (unsigned)m.id, id);
    if (text) {
        memcpy(text, m.u.error.msg, m.u.error.msg_len);
        text[m.u.error.msg_len] = '\0';
    }
}

static struct proto_msg expect_reply(const char *what, const uint8_t *rep, ssize_t n, uint32_t op,
                                     uint32_t id)
{
    struct proto_msg m = decode_reply(what, rep, n);
    cr_assert_neq(m.op, PROTO_OP_ERROR, "%s: refused with %d (%s): %.*s", what, m.u.error.code,
                  strerror(m.u.error.code), (int)m.u.error.msg_len, m.u.error.msg);
    cr_assert_eq(m.op, op + PROTO_OP_REPLY, "%s: reply op %u, expected %u", what, (unsigned)m.op,
                 (unsigned)(op + PROTO_OP_REPLY));
    cr_assert_eq(m.id, id, "%s: reply id %u, expected %u", what, (unsigned)m.id, (unsigned)id);
    return m;
}

static void raw_ping_ok(int fd, uint32_t id)
{
    uint8_t msg[32], rep[256];
    size_t len = enc_simple(msg, sizeof(msg), PROTO_OP_PING, id);
    expect_reply("ping", rep, call(fd, msg, len, rep, sizeof(rep)), PROTO_OP_PING, id);
}

static uint64_t raw_lease(int fd, uint32_t id, uint64_t size)
{
    uint8_t msg[64], rep[1024];
    size_t len = enc_lease(msg, sizeof(msg), id, size);
    struct proto_msg m = expect_reply("lease", rep, call(fd, msg, len, rep, sizeof(rep)), PROTO_OP_LEASE, id);
    cr_assert_eq(m.u.lease_reply.size, size);
    return m.u.lease_reply.handle;
}

/* raw_lease_fd: a lease on a raw connection that keeps the buffer's fd, as a hostile
 * producer would. */
static uint64_t raw_lease_fd(int sock, uint32_t id, uint64_t size, int *ret_fd, uint64_t *ret_capacity)
{
    uint8_t msg[64], rep[1024];
    size_t len = enc_lease(msg, sizeof(msg), id, size);
    send_all(sock, msg, len);
    struct pollfd p = { .fd = sock, .events = POLLIN };
    cr_assert_gt(poll(&p, 1, WAIT_MS), 0, "no lease reply");
    ssize_t n = recv_nb(sock, rep, sizeof(rep), ret_fd);
    struct proto_msg m = expect_reply("lease", rep, n, PROTO_OP_LEASE, id);
    cr_assert_geq(*ret_fd, 0, "lease reply without an fd");
    *ret_capacity = m.u.lease_reply.capacity;
    return m.u.lease_reply.handle;
}

static void raw_release_ok(int sock, uint32_t id, uint64_t handle)
{
    uint8_t msg[64], rep[1024];
    size_t len = enc_release(msg, sizeof(msg), id, handle, 0);
    expect_reply("release", rep, call(sock, msg, len, rep, sizeof(rep)), PROTO_OP_RELEASE, id);
}

/* connect_hello: a raw connection past a valid hello. */
static int connect_hello(const struct daemon *d)
{
    int fd = raw_connect(d);
    raw_hello(fd);
    return fd;
}

/* expect_dropped: the daemon answers msg with an EPROTO error and closes the connection. */
static void expect_dropped(const char *what, int fd, const void *msg, size_t len, long long id)
{
    uint8_t rep[1024];
    expect_error(what, rep, call(fd, msg, len, rep, sizeof(rep)), id, EPROTO, NULL);
    cr_assert(raw_closed(fd, WAIT_MS), "%s: the daemon kept the connection open", what);
}

/* ---- the daemon from outside ------------------------------------------------------- */

/* others_served: a fresh producer and consumer still get lease, publish, acquire and the
 * producer's bytes and metadata. */
static void others_served(const struct daemon *d)
{
    shmref_conn *p = connect_ok(d), *c = connect_ok(d);
    shmref_buf *b, *r;
    shmref_desc desc;
    size_t meta_len;

    cr_assert_eq(shmref_lease(p, 8192, &b), 0, "lease by a good client: %s", shmref_errmsg(p));
    fill_pattern(shmref_buf_data(b), 8192, 77);
    cr_assert_eq(shmref_publish(b, 8192, 0, "ok", 2, &desc), 0, "publish by a good client: %s",
                 shmref_errmsg(p));
    cr_assert_eq(shmref_acquire(c, &desc, &r), 0, "acquire by a good client: %s", shmref_errmsg(c));
    cr_assert_eq(check_pattern(shmref_buf_data(r), 8192, 77), -1, "consumer sees other bytes");
    const void *meta = shmref_buf_meta(r, &meta_len);
    cr_assert(meta_len == 2 && memcmp(meta, "ok", 2) == 0, "consumer sees other metadata");
    cr_assert_eq(shmref_release(r), 0, "release: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(b), 0, "release: %s", shmref_errmsg(p));
    shmref_close(c);
    shmref_close(p);
}

/* expect_clean: nothing stays leased, and exactly this many protocol errors were counted. */
static void expect_clean(const struct daemon *d, uint64_t protocol_errors)
{
    uint64_t leased = wait_status(d, "pool.bytes_leased", 0, WAIT_MS);
    cr_assert_eq(leased, 0, "%llu bytes still leased after every client left", (unsigned long long)leased);
    uint64_t pe = status_u64(d, "counters.protocol_errors");
    cr_assert_eq(pe, protocol_errors, "counters.protocol_errors is %llu, expected %llu",
                 (unsigned long long)pe, (unsigned long long)protocol_errors);
}

/* settled_fds: the daemon's fd count once two readings 20 ms apart agree. */
static int settled_fds(const struct daemon *d)
{
    int prev = daemon_fds(d);
    for (int i = 0; i < 100; i++) {
        usleep(20000);
        int n = daemon_fds(d);
        if (n == prev)
            return n;
        prev = n;
    }
    return prev;
}

static int wait_fds(const struct daemon *d, int want, int ms)
{
    long deadline = now_ms() + ms;
    int n;
    while ((n = daemon_fds(d)) != want && now_ms() < deadline)
        usleep(5000);
    return n;
}

/* daemon_holds: how many of the daemon's fds point at a file whose name contains name. */
static int daemon_holds(const struct daemon *d, const char *name)
{
    char dirpath[64], target[512];
    snprintf(dirpath, sizeof(dirpath), "/proc/%d/fd", (int)d->pid);
    DIR *dir = opendir(dirpath);
    cr_assert_not_null(dir, "%s: %s", dirpath, strerror(errno));
    int found = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.')
            continue;
        ssize_t n = readlinkat(dirfd(dir), e->d_name, target, sizeof(target) - 1);
        if (n > 0) {
            target[n] = '\0';
            found += strstr(target, name) != NULL;
        }
    }
    closedir(dir);
    return found;
}

/* daemon_pinned_bytes: storage behind the daemon's buffer fds (unlinked files in
 * /dev/shm, or memfds other than the tables') as the kernel counts it, each file once. */
static uint64_t daemon_pinned_bytes(const struct daemon *d)
{
    static ino_t seen[4096];
    unsigned nseen = 0;
    uint64_t total = 0;
    char dirpath[64], target[512];
    snprintf(dirpath, sizeof(dirpath), "/proc/%d/fd", (int)d->pid);
    DIR *dir = opendir(dirpath);
    cr_assert_not_null(dir, "%s: %s", dirpath, strerror(errno));
    struct dirent *e;
    while ((e = readdir(dir))) {
        struct stat st;
        ssize_t n = e->d_name[0] == '.' ? -1 : readlinkat(dirfd(dir), e->d_name, target, sizeof(target) - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        /* the tables' and journals' memfds (daemon/tenantdir.c) are not buffers */
        if ((strncmp(target, "/dev/shm/", 9) != 0 && strncmp(target, "/memfd:", 7) != 0) ||
            strncmp(target, "/memfd:shmrefd-table", 20) == 0 || fstatat(dirfd(dir), e->d_name, &st, 0) < 0)
            continue;
        unsigned i = 0;
        while (i < nseen && seen[i] != st.st_ino)
            i++;
        if (i < nseen || nseen == sizeof(seen) / sizeof(seen[0]))
            continue;
        seen[nseen++] = st.st_ino;
        total += (uint64_t)st.st_blocks * 512;
    }
    closedir(dir);
    return total;
}

/* mentions_number: whether text contains v as a whole decimal number. */
static int mentions_number(const char *text, unsigned long v)
{
    for (const char *p = text; *p; p++) {
        if (!isdigit((unsigned char)*p) || (p > text && isdigit((unsigned char)p[-1])))
            continue;
        if (strtoul(p, NULL, 10) == v)
            return 1;
    }
    return 0;
}

TestSuite(hostile, .fini = reap_children);

/* ---- 1. junk before anything ------------------------------------------------------- */

Test(hostile, garbage_first_message_closes, .timeout = 60)
{
    static const size_t lens[] = { 1, 3, 1000, 4096 };
    struct daemon d;
    uint8_t junk[4096], rep[1024];
    uint32_t s = 0x5eed1234;

    daemon_start(&d, NULL);
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
        for (size_t i = 0; i < lens[k]; i++)
            junk[i] = (uint8_t)xorshift(&s);
        int fd = raw_connect(&d);
        ssize_t n = call(fd, junk, lens[k], rep, sizeof(rep));
        if (n != 0) /* an explanation first is allowed, but it must be EPROTO */
            expect_error("garbage first message", rep, n, ANY_ID, EPROTO, NULL);
        cr_assert(raw_closed(fd, WAIT_MS), "%zu garbage bytes: connection not closed", lens[k]);
        close(fd);
        others_served(&d);
    }
    expect_clean(&d, 4);
    daemon_stop(&d);
}

/* ---- 2. malformed msgpack after a valid hello --------------------------------------- */

struct raw_case {
    const char *what;
    uint8_t bytes[256];
    size_t len;
};

#define RAW(w, ...) { w, { __VA_ARGS__ }, sizeof((uint8_t[]){ __VA_ARGS__ }) }

static const struct raw_case malformed[] = {
    RAW("truncated uint16 header", 0x94, PROTO_OP_LEASE, 0x02, 0xcd, 0x10),
    RAW("str32 claiming 0xffffffff bytes", 0x94, PROTO_OP_LEASE, 0x03, 0xdb, 0xff, 0xff, 0xff, 0xff),
    RAW("bin32 claiming 0xffffffff bytes", 0x96, PROTO_OP_PUBLISH, 0x04, 0x01, 0x01, 0x00, 0xc6, 0xff,
        0xff, 0xff, 0xff),
    RAW("array32 claiming 0xffffffff elements", 0xdd, 0xff, 0xff, 0xff, 0xff),
    RAW("map32 claiming 0xffffffff pairs", 0xdf, 0xff, 0xff, 0xff, 0xff),
    RAW("array16 claiming 0xffff elements", 0xdc, 0xff, 0xff, PROTO_OP_PING, 0x05),
    RAW("fixext1 field", 0x93, PROTO_OP_PING, 0x06, 0xd4, 0x01, 0x00),
    RAW("ext8 envelope", 0xc7, 0x01, 0x01, 0x00),
    RAW("0xc1 (never used)", 0x92, PROTO_OP_PING, 0xc1),
    RAW("trailing byte after a ping", 0x92, PROTO_OP_PING, 0x07, 0x00),
    RAW("not an array", PROTO_OP_PING),
    RAW("array of one", 0x91, PROTO_OP_PING),
    RAW("map envelope", 0x82, 0x00, PROTO_OP_PING, 0x01, 0x08),
    RAW("op beyond 127", 0x92, 0xcc, 0xc8, 0x09),
    RAW("negative id", 0x92, PROTO_OP_PING, 0xff),
    RAW("id beyond 32 bits", 0x92, PROTO_OP_PING, 0xcf, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00),
};

Test(hostile, malformed_msgpack_is_dropped, .timeout = 60)
{
    struct daemon d;
    uint8_t msg[256];
    unsigned errors = 0;

    daemon_start(&d, NULL);

    /* a valid lease minus its last byte */
    int fd = connect_hello(&d);
    size_t len = enc_lease(msg, sizeof(msg), 2, 4096);
    expect_dropped("truncated lease", fd, msg, len - 1, ANY_ID);
    close(fd);
    errors++;

    /* 200 nested one-element arrays around a 1 */
    fd = connect_hello(&d);
    memset(msg, 0x91, 200);
    msg[200] = 0x01;
    expect_dropped("depth bomb", fd, msg, 201, ANY_ID);
    close(fd);
    errors++;

    for (size_t i = 0; i < sizeof(malformed) / sizeof(malformed[0]); i++) {
        fd = connect_hello(&d);
        expect_dropped(malformed[i].what, fd, malformed[i].bytes, malformed[i].len, ANY_ID);
        close(fd);
        errors++;
        fd = connect_hello(&d); /* a neighbour, right after */
        raw_ping_ok(fd, 2);
        close(fd);
    }
    others_served(&d);
    expect_clean(&d, errors);

    /* A zero-length datagram reads like EOF: the connection must go (counted or not). */
    fd = connect_hello(&d);
    send_all(fd, "", 0);
    cr_assert(raw_closed(fd, WAIT_MS), "zero-length message: connection not closed");
    close(fd);
    others_served(&d);
    uint64_t pe = status_u64(&d, "counters.protocol_errors");
    cr_assert(pe == errors || pe == errors + 1, "protocol_errors %llu after %u errors and an empty message",
              (unsigned long long)pe, errors);
    daemon_stop(&d);
}

/* ---- 3. wrong field types and ranges ------------------------------------------------ */

static const struct raw_case mistyped[] = {
    RAW("lease size is a string", 0x94, PROTO_OP_LEASE, 0x05, 0xa3, 'a', 'b', 'c', 0x00),
    RAW("lease size is negative", 0x94, PROTO_OP_LEASE, 0x06, 0xff, 0x00),
    RAW("lease flags beyond 32 bits", 0x94, PROTO_OP_LEASE, 0x07, 0xcd, 0x10, 0x00, 0xcf, 0x00, 0x00,
        0x00, 0x01, 0x00, 0x00, 0x00, 0x00),
    RAW("lease without fields", 0x92, PROTO_OP_LEASE, 0x08),
    RAW("acquire token of 15 bytes", 0x94, PROTO_OP_ACQUIRE, 0x09, 0xc4, 0x0f, 1, 2, 3, 4, 5, 6, 7, 8,
        9, 10, 11, 12, 13, 14, 15, 0x00),
    RAW("acquire token as str", 0x94, PROTO_OP_ACQUIRE, 0x0a, 0xb0, 'a', 'b', 'c', 'd', 'e', 'f', 'g',
        'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o', 'p', 0x00),
    RAW("release handle is a double", 0x94, PROTO_OP_RELEASE, 0x0b, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0,
        0x00),
    RAW("publish size is nil", 0x96, PROTO_OP_PUBLISH, 0x0c, 0x01, 0xc0, 0x00, 0xc0),
    RAW("publish keep_ms is true", 0x96, PROTO_OP_PUBLISH, 0x0d, 0x01, 0x01, 0xc3, 0xc0),
};

Test(hostile, mistyped_fields_are_dropped, .timeout = 60)
{
    struct daemon d;
    uint8_t msg[PROTO_MAX_META + 256];
    static uint8_t meta[PROTO_MAX_META + 1];
    unsigned errors = 0;

    daemon_start(&d, NULL);
    for (size_t i = 0; i < sizeof(mistyped) / sizeof(mistyped[0]); i++) {
        int fd = connect_hello(&d);
        /* the id (third byte) decoded fine, so the error must name it */
        expect_dropped(mistyped[i].what, fd, mistyped[i].bytes, mistyped[i].len, mistyped[i].bytes[2]);
        close(fd);
        errors++;
    }

    /* publish whose meta is an integer, on a real lease: dropped, and the lease reclaimed */
    int fd = connect_hello(&d);
    uint64_t h = raw_lease(fd, 2, 4096);
    cr_assert_gt(status_u64(&d, "pool.bytes_leased"), 0);
    size_t len = enc_publish(msg, sizeof(msg), 3, h, 4096, NULL, 0);
    cr_assert_eq(msg[len - 3], 0xc0, "meta nil comes before flags and max_acquires");
    msg[len - 3] = 0x07;
    expect_dropped("publish meta is an integer", fd, msg, len, 3);
    close(fd);
    errors++;
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, WAIT_MS), 0, "dropped client's lease not reclaimed");

    /* publish with one byte more metadata than allowed */
    fd = connect_hello(&d);
    h = raw_lease(fd, 2, 4096);
    len = enc_publish(msg, sizeof(msg), 3, h, 4096, meta, sizeof(meta));
    expect_dropped("publish meta over PROTO_MAX_META", fd, msg, len, 3);
    close(fd);
    errors++;

    /* hello (as the first message) with a name that is an integer, and one too long */
    fd = raw_connect(&d);
    static const uint8_t hello_int_name[] = { 0x95, PROTO_OP_HELLO, 0x01, 0x01, 0x00, 0x07 };
    expect_dropped("hello name is an integer", fd, hello_int_name, sizeof(hello_int_name), 1);
    close(fd);
    errors++;
    char name[PROTO_MAX_NAME + 2];
    memset(name, 'n', sizeof(name));
    struct proto_msg hm = { .op = PROTO_OP_HELLO, .id = 1 };
    hm.u.hello.version = PROTO_VERSION;
    hm.u.hello.name = name;
    hm.u.hello.name_len = PROTO_MAX_NAME + 1;
    fd = raw_connect(&d);
    len = enc(&hm, msg, sizeof(msg));
    expect_dropped("hello name over PROTO_MAX_NAME", fd, msg, len, 1);
    close(fd);
    errors++;

    others_served(&d);
    expect_clean(&d, errors);
    daemon_stop(&d);
}

/* ---- 4. unknown ops -------------------------------------------------------------------- */

Test(hostile, unknown_op_keeps_connection, .timeout = 60)
{
    struct daemon d;
    uint8_t rep[1024];
    static const uint8_t op50[] = { 0x92, 50, 7 };
    static const uint8_t op0[] = { 0x92, 0, 9 };
    static const uint8_t reply_op[] = { 0x92, PROTO_OP_PING + PROTO_OP_REPLY, 11 };
    static const uint8_t op63_fields[] = { 0x94, 63, 13, 0xa1, 'x', 0x81, 0x01, 0x02 };

    daemon_start(&d, NULL);
    int fd = connect_hello(&d);
    expect_error("op 50", rep, call(fd, op50, sizeof(op50), rep, sizeof(rep)), 7, EOPNOTSUPP, NULL);
    raw_ping_ok(fd, 8);
    expect_error("op 0", rep, call(fd, op0, sizeof(op0), rep, sizeof(rep)), 9, EOPNOTSUPP, NULL);
    raw_ping_ok(fd, 10);
    expect_error("a reply op sent as a request", rep, call(fd, reply_op, sizeof(reply_op), rep, sizeof(rep)),
                 11, EOPNOTSUPP, NULL);
    raw_ping_ok(fd, 12);
    expect_error("op 63 with fields", rep, call(fd, op63_fields, sizeof(op63_fields), rep, sizeof(rep)), 13,
                 EOPNOTSUPP, NULL);
    uint64_t h = raw_lease(fd, 14, 4096); /* still a full client */
    uint8_t msg[64];
    size_t len = enc_release(msg, sizeof(msg), 15, h, 0);
    expect_reply("release", rep, call(fd, msg, len, rep, sizeof(rep)), PROTO_OP_RELEASE, 15);
    others_served(&d);
    close(fd);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- 5. requests before hello ------------------------------------------------------------ */

Test(hostile, request_before_hello_is_dropped, .timeout = 60)
{
    struct daemon d;
    uint8_t msg[64];

    daemon_start(&d, NULL);
    int fd = raw_connect(&d);
    size_t len = enc_lease(msg, sizeof(msg), 3, 4096);
    expect_dropped("lease before hello", fd, msg, len, 3);
    close(fd);
    fd = raw_connect(&d);
    len = enc_simple(msg, sizeof(msg), PROTO_OP_STATUS, 4);
    expect_dropped("status before hello", fd, msg, len, 4);
    close(fd);
    fd = raw_connect(&d);
    len = enc_simple(msg, sizeof(msg), PROTO_OP_PING, 5);
    expect_dropped("ping before hello", fd, msg, len, 5);
    close(fd);

    cr_assert_eq(status_u64(&d, "counters.leases"), 0, "a lease was granted before hello");
    others_served(&d);
    expect_clean(&d, 3);
    daemon_stop(&d);
}

/* ---- 6. protocol version ------------------------------------------------------------------ */

Test(hostile, hello_wrong_version_is_refused, .timeout = 60)
{
    /* 1: older than the previous version (2, which is served: test-skew); 4: a newer one */
    static const uint32_t versions[] = { 1, PROTO_VERSION + 1, 0, UINT32_MAX };
    struct daemon d;
    uint8_t msg[256], rep[1024];
    char text[PROTO_MAX_ERRMSG + 1];

    daemon_start(&d, NULL);
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        int fd = raw_connect(&d);
        size_t len = enc_hello(msg, sizeof(msg), 1, versions[i]);
        expect_error("hello with a foreign version", rep, call(fd, msg, len, rep, sizeof(rep)), 1,
                     EPROTONOSUPPORT, text);
        cr_assert(mentions_number(text, versions[i]), "refusal does not name version %u: \"%s\"",
                  (unsigned)versions[i], text);
        cr_assert(mentions_number(text, PROTO_VERSION), "refusal does not name version %d: \"%s\"",
                  PROTO_VERSION, text);
        cr_assert(raw_closed(fd, WAIT_MS), "hello version %u: connection not closed", (unsigned)versions[i]);
        close(fd);
        shmref_conn *c = connect_ok(&d);
        cr_assert_eq(shmref_ping(c), 0, "ping: %s", shmref_errmsg(c));
        shmref_close(c);
    }
    others_served(&d);
    expect_clean(&d, sizeof(versions) / sizeof(versions[0]));
    daemon_stop(&d);
}

/* ---- 7. oversized messages ---------------------------------------------------------------- */

static int big_sender(const struct daemon *d)
{
    int fd = connect_hello(d);
    int sndbuf = 512 * 1024;
    cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
    return fd;
}

Test(hostile, oversized_message_closes, .timeout = 60)
{
    struct daemon d;
    static uint8_t msg[70000];
    uint8_t rep[1024];

    daemon_start(&d, NULL);

    /* exactly the limit is a request like any other */
    int fd = big_sender(&d);
    size_t len = enc_padded_ping(msg, 9, PROTO_MAX_REQUEST);
    expect_reply("ping of exactly PROTO_MAX_REQUEST bytes", rep, call(fd, msg, len, rep, sizeof(rep)),
                 PROTO_OP_PING, 9);

    static const size_t over[] = { 70000, PROTO_MAX_REQUEST + 1 };
    for (size_t i = 0; i < 2; i++) {
        if (i > 0)
            fd = big_sender(&d);
        len = enc_padded_ping(msg, 10, over[i]);
        ssize_t n = call(fd, msg, len, rep, sizeof(rep));
        if (n != 0)
            expect_error("oversized ping", rep, n, ANY_ID, EPROTO, NULL);
        cr_assert(raw_closed(fd, WAIT_MS), "%zu-byte message: connection not closed", over[i]);
        close(fd);
        others_served(&d);
    }
    expect_clean(&d, 2);
    daemon_stop(&d);
}

/* ---- 8. fds from a client ----------------------------------------------------------------- */

struct fd_case {
    const char *what;
    bool hello;         /* say hello first */
    bool empty;         /* zero bytes of data, only the fds */
    unsigned nfds;
};

Test(hostile, fds_from_client_are_closed, .timeout = 60)
{
    static const struct fd_case cases[] = {
        { "one fd on a ping", true, false, 1 },
        { "eight fds on a ping (control data truncated)", true, false, 8 },
        { "one fd on an empty message", true, true, 1 },
        { "one fd on the hello", false, false, 1 },
    };
    struct daemon d;
    uint8_t msg[256], rep[1024];
    int fds[8];

    for (int i = 0; i < 8; i++) {
        fds[i] = memfd_create("hostile-probe", MFD_CLOEXEC);
        cr_assert_geq(fds[i], 0, "memfd_create: %s", strerror(errno));
    }
    daemon_start(&d, NULL);
    int base = settled_fds(&d);
    cr_assert_gt(daemon_holds(&d, "shmrefd.log"), 0, "the /proc scan does not see the daemon's own log");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct fd_case *k = &cases[i];
        int fd = k->hello ? connect_hello(&d) : raw_connect(&d);
        size_t len = k->hello ? enc_simple(msg, sizeof(msg), PROTO_OP_PING, 2) : enc_hello(msg, sizeof(msg), 1, 1);
        int e = rawclient_send_fds(fd, msg, k->empty ? 0 : len, fds, k->nfds);
        cr_assert_eq(e, 0, "%s: sendmsg: %s", k->what, strerror(-e));
        expect_error(k->what, rep, recv_one(fd, rep, sizeof(rep), WAIT_MS), ANY_ID, EPROTO, NULL);
        cr_assert(raw_closed(fd, WAIT_MS), "%s: connection not closed", k->what);
        close(fd);
        int now = wait_fds(&d, base, 2000);
        cr_assert_eq(now, base, "%s: daemon has %d fds, %d before the connection", k->what, now, base);
        cr_assert_eq(daemon_holds(&d, "hostile-probe"), 0, "%s: daemon kept the client's fd", k->what);
    }
    for (int i = 0; i < 8; i++)
        close(fds[i]);
    others_served(&d);
    expect_clean(&d, 4);
    daemon_stop(&d);
}

/* ---- 9. releasing what one does not hold --------------------------------------------------- */

Test(hostile, release_of_unknown_handle, .timeout = 60)
{
    struct daemon d;
    uint8_t msg[256], rep[1024];

    daemon_start(&d, NULL);
    int a = connect_hello(&d), b = connect_hello(&d);

    size_t len = enc_release(msg, sizeof(msg), 4, 12345, 0);
    expect_error("release of handle 12345", rep, call(a, msg, len, rep, sizeof(rep)), 4, ENOENT, NULL);
    raw_ping_ok(a, 5);
    len = enc_release(msg, sizeof(msg), 6, 12345, PROTO_RELEASE_NOREPLY);
    expect_error("no-reply release of handle 12345", rep, call(a, msg, len, rep, sizeof(rep)), 6, ENOENT, NULL);
    len = enc_release(msg, sizeof(msg), 7, 0, 0);
    expect_error("release of handle 0", rep, call(a, msg, len, rep, sizeof(rep)), 7, ENOENT, NULL);
    raw_ping_ok(a, 8);

    /* a released handle is stale */
    uint64_t h = raw_lease(a, 9, 4096);
    len = enc_release(msg, sizeof(msg), 10, h, 0);
    expect_reply("release", rep, call(a, msg, len, rep, sizeof(rep)), PROTO_OP_RELEASE, 10);
    len = enc_release(msg, sizeof(msg), 11, h, 0);
    expect_error("second release", rep, call(a, msg, len, rep, sizeof(rep)), 11, ENOENT, NULL);

    /* another connection's handle names nothing here, and its lease survives */
    uint64_t hb = raw_lease(b, 2, 4096);
    len = enc_release(msg, sizeof(msg), 12, hb, 0);
    expect_error("release of another client's handle", rep, call(a, msg, len, rep, sizeof(rep)), 12,
                 ENOENT, NULL);
    len = enc_publish(msg, sizeof(msg), 3, hb, 4096, NULL, 0);
    expect_reply("owner publishes after a stranger's release", rep, call(b, msg, len, rep, sizeof(rep)),
                 PROTO_OP_PUBLISH, 3);
    raw_ping_ok(a, 13);
    others_served(&d);
    close(a);
    close(b);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- 10. publishing an acquired buffer ------------------------------------------------------ */

Test(hostile, publish_of_acquired_buffer_refused, .timeout = 60)
{
    struct daemon d;
    uint8_t msg[256], rep[1024];
    shmref_buf *b, *r;
    shmref_desc desc, other;

    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    cr_assert_eq(shmref_lease(p, 4096, &b), 0, "lease: %s", shmref_errmsg(p));
    cr_assert_eq(shmref_publish(b, 4096, 0, NULL, 0, &desc), 0, "publish: %s", shmref_errmsg(p));

    /* through the library: refused before it reaches the daemon */
    cr_assert_eq(shmref_acquire(c, &desc, &r), 0, "acquire: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_publish(r, 4096, 0, NULL, 0, &other), -EPERM, "library publish of an acquired buffer");
    cr_assert_eq(shmref_ping(c), 0, "consumer connection after the refusal: %s", shmref_errmsg(c));

    /* raw: the daemon itself refuses, and keeps the consumer */
    int fd = connect_hello(&d);
    size_t len = enc_acquire(msg, sizeof(msg), 2, desc.token);
    struct proto_msg m = expect_reply("raw acquire", rep, call(fd, msg, len, rep, sizeof(rep)), PROTO_OP_ACQUIRE, 2);
    uint64_t h = m.u.acquire_reply.handle;
    len = enc_publish(msg, sizeof(msg), 3, h, 0, NULL, 0);
    expect_error("raw publish of an acquired handle", rep, call(fd, msg, len, rep, sizeof(rep)), 3, EPERM, NULL);
    len = enc_publish(msg, sizeof(msg), 4, h, 4096, "x", 1);
    expect_error("raw publish of an acquired handle, with meta", rep, call(fd, msg, len, rep, sizeof(rep)), 4,
                 EPERM, NULL);
    len = enc_release(msg, sizeof(msg), 5, h, 0);
    expect_reply("release of the acquired handle", rep, call(fd, msg, len, rep, sizeof(rep)), PROTO_OP_RELEASE, 5);
    close(fd);

    /* the producer's buffer is untouched by all this */
    shmref_buf *r2;
    cr_assert_eq(shmref_acquire(c, &desc, &r2), 0, "second acquire: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(r2), 0);
    cr_assert_eq(shmref_release(r), 0);
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);
    shmref_close(p);
    others_served(&d);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- 11. double publish and oversized publish ------------------------------------------------ */

Test(hostile, publish_twice_or_oversize_refused, .timeout = 60)
{
    struct daemon d;
    uint8_t msg[256], rep[1024];

    daemon_start(&d, NULL);
    int fd = connect_hello(&d);
    uint64_t h1 = raw_lease(fd, 2, 4096);
    size_t len = enc_publish(msg, sizeof(msg), 3, h1, 4096, "m", 1);
    struct proto_msg m = expect_reply("publish", rep, call(fd, msg, len, rep, sizeof(rep)), PROTO_OP_PUBLISH, 3);
    shmref_desc desc = { .size = m.u.publish_reply.size };
    memcpy(desc.token, m.u.publish_reply.token, PROTO_TOKEN_LEN);
    cr_assert_eq(desc.size, 4096);
    len = enc_publish(msg, sizeof(msg), 4, h1, 4096, "m", 1);
    expect_error("second publish", rep, call(fd, msg, len, rep, sizeof(rep)), 4, EALREADY, NULL);
    len = enc_publish(msg, sizeof(msg), 5, h1, 100, NULL, 0);
    expect_error("second publish, other size", rep, call(fd, msg, len, rep, sizeof(rep)), 5, EALREADY, NULL);

    uint64_t h2 = raw_lease(fd, 6, 4096);
    len = enc_publish(msg, sizeof(msg), 7, h2, 4097, NULL, 0);
    expect_error("publish beyond the leased size", rep, call(fd, msg, len, rep, sizeof(rep)), 7, EINVAL, NULL);
    len = enc_publish(msg, sizeof(msg), 8, h2, UINT64_MAX, NULL, 0);
    expect_error("publish of UINT64_MAX bytes", rep, call(fd, msg, len, rep, sizeof(rep)), 8, EINVAL, NULL);
    len = enc_publish(msg, sizeof(msg), 9, HANDLE(7, 3), 1, NULL, 0);
    expect_error("publish of an unknown handle", rep, call(fd, msg, len, rep, sizeof(rep)), 9, ENOENT, NULL);
    len = enc_publish(msg, sizeof(msg), 10, h2, 4096, NULL, 0);
    expect_reply("publish after the refusals", rep, call(fd, msg, len, rep, sizeof(rep)), PROTO_OP_PUBLISH, 10);

    /* the first publication is intact: same size, same metadata */
    shmref_conn *c = connect_ok(&d);
    shmref_buf *r;
    size_t meta_len;
    cr_assert_eq(shmref_acquire(c, &desc, &r), 0, "acquire of the first publication: %s", shmref_errmsg(c));
    const void *meta = shmref_buf_meta(r, &meta_len);
    cr_assert(meta_len == 1 && memcmp(meta, "m", 1) == 0, "metadata changed by a refused publish");
    cr_assert_eq(shmref_release(r), 0);

    /* the library passes a double publish to the daemon, which refuses it */
    shmref_buf *b;
    shmref_desc d1, d2;
    cr_assert_eq(shmref_lease(c, 4096, &b), 0, "lease: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_publish(b, 10, 0, NULL, 0, &d1), 0, "publish: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_publish(b, 10, 0, NULL, 0, &d2), -EALREADY, "library double publish");
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);

    close(fd);
    others_served(&d);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- 12. lease sizes ---------------------------------------------------------------------------- */

Test(hostile, lease_size_limits, .timeout = 60)
{
    struct daemon d;
    uint8_t msg[256], rep[1024];
    shmref_buf *b;

    daemon_start(&d, "--max-lease-size", "1M", NULL);
    int fd = connect_hello(&d);
    size_t len = enc_lease(msg, sizeof(msg), 2, 0);
    expect_error("lease of 0 bytes", rep, call(fd, msg, len, rep, sizeof(rep)), 2, EINVAL, NULL);
    raw_ping_ok(fd, 3);
    len = enc_lease(msg, sizeof(msg), 4, UINT64_MAX);
    expect_error("lease of UINT64_MAX bytes", rep, call(fd, msg, len, rep, sizeof(rep)), 4, EFBIG, NULL);
    raw_ping_ok(fd, 5);

    shmref_conn *c = connect_ok(&d);
    int r = shmref_lease(c, (1 << 20) + 1, &b);
    cr_assert_eq(r, -EFBIG, "lease of 1 MiB + 1 under --max-lease-size 1M: %d (%s)", r, shmref_errmsg(c));
    cr_assert_not_null(strstr(shmref_errmsg(c), "1.0 MiB"), "refusal does not name the limit: \"%s\"",
                       shmref_errmsg(c));
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0, "lease of exactly 1 MiB: %s", shmref_errmsg(c));
    cr_assert_geq(shmref_buf_capacity(b), 1 << 20);
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);
    close(fd);

    cr_assert_eq(status_u64(&d, "counters.refused_limit"), 2);
    others_served(&d);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- 13. leases per connection --------------------------------------------------------------------- */

Test(hostile, lease_count_limit, .timeout = 60)
{
    struct daemon d;
    shmref_buf *b[5], *extra, *acq;
    shmref_desc desc;

    daemon_start(&d, "--max-leases", "4", NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    shmref_buf *pb;
    cr_assert_eq(shmref_lease(p, 4096, &pb), 0, "lease: %s", shmref_errmsg(p));
    cr_assert_eq(shmref_publish(pb, 4096, 0, NULL, 0, &desc), 0, "publish: %s", shmref_errmsg(p));

    for (int i = 0; i < 4; i++)
        cr_assert_eq(shmref_lease(c, 4096, &b[i]), 0, "lease %d of 4: %s", i + 1, shmref_errmsg(c));
    int r = shmref_lease(c, 4096, &b[4]);
    cr_assert_eq(r, -EMFILE, "fifth lease under --max-leases 4: %d (%s)", r, shmref_errmsg(c));
    cr_assert_not_null(strstr(shmref_errmsg(c), "limit 4"), "refusal does not name the limit: \"%s\"",
                       shmref_errmsg(c));
    r = shmref_acquire(c, &desc, &acq);
    cr_assert_eq(r, -EMFILE, "acquire with 4 leases held under --max-leases 4: %d (%s)", r, shmref_errmsg(c));

    cr_assert_eq(shmref_release(b[0]), 0);
    cr_assert_eq(shmref_lease(c, 4096, &extra), 0, "lease after a release: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(b[1]), 0);
    cr_assert_eq(shmref_acquire(c, &desc, &acq), 0, "acquire after a release: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(acq), 0);
    cr_assert_eq(shmref_release(extra), 0);
    cr_assert_eq(shmref_release(b[2]), 0);
    cr_assert_eq(shmref_release(b[3]), 0);
    cr_assert_eq(shmref_release(pb), 0);
    shmref_close(c);
    shmref_close(p);

    cr_assert_eq(status_u64(&d, "counters.refused_limit"), 2);
    others_served(&d);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- 14. clients per daemon ------------------------------------------------------------------------- */

Test(hostile, client_limit, .timeout = 60)
{
    struct daemon d;
    uint8_t rep[1024];
    char text[PROTO_MAX_ERRMSG + 1];
    shmref_conn *third = NULL;

    daemon_start(&d, "--max-clients", "2", NULL);
    /* status uses a connection of its own: 1 means daemon_start's probe is gone */
    cr_assert_eq(wait_status(&d, "daemon.clients", 1, WAIT_MS), 1);
    shmref_conn *c1 = connect_ok(&d), *c2 = connect_ok(&d);
    /* The test runs as root, which has 8 slots more than --max-clients: fill them too. */
    int reserve[8];
    for (int i = 0; i < 8; i++)
        reserve[i] = connect_hello(&d);

    int r = shmref_connect(d.socket, &third);
    cr_assert_eq(r, -EUSERS, "a refused connect says why: got %d (%s)", r, strerror(-r));
    cr_assert_null(third);

    int fd = raw_connect(&d);
    expect_error("third raw connection", rep, recv_one(fd, rep, sizeof(rep), WAIT_MS), 0, EUSERS, text);
    cr_assert_not_null(strstr(text, "limit 2"), "refusal does not name the limit: \"%s\"", text);
    cr_assert(raw_closed(fd, WAIT_MS), "refused connection left open");
    close(fd);

    cr_assert_eq(shmref_ping(c1), 0, "first client after the refusals: %s", shmref_errmsg(c1));
    cr_assert_eq(shmref_ping(c2), 0, "second client after the refusals: %s", shmref_errmsg(c2));

    for (int i = 0; i < 8; i++)
        close(reserve[i]);
    usleep(100 * 1000); /* the daemon sees those closes asynchronously */
    shmref_close(c1);
    long deadline = now_ms() + 1000; /* the daemon sees the close asynchronously */
    while ((r = shmref_connect(d.socket, &third)) < 0 && now_ms() < deadline)
        usleep(5000);
    cr_assert_eq(r, 0, "no connect within 1 s after a client left: %s", strerror(-r));
    cr_assert_eq(shmref_ping(third), 0, "ping: %s", shmref_errmsg(third));
    shmref_close(third);
    shmref_close(c2);

    cr_assert_eq(wait_status(&d, "daemon.clients", 1, WAIT_MS), 1);
    cr_assert_eq(status_u64(&d, "counters.refused_limit"), 2);
    others_served(&d);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- 15. clients that never read -------------------------------------------------------------------- */

/* flood: sends copies of what enc_next builds without reading, until the socket is full
 * or n are out. Returns how many went; *ret_closed tells whether the daemon hung up. */
static unsigned flood(int fd, unsigned n, uint32_t first_id, size_t (*enc_next)(uint8_t *, size_t, uint32_t),
                      bool *ret_closed)
{
    uint8_t msg[64];
    unsigned sent = 0;
    *ret_closed = false;
    for (; sent < n; sent++) {
        size_t len = enc_next(msg, sizeof(msg), first_id + sent);
        ssize_t r = send(fd, msg, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r < 0 && errno == EAGAIN)
            break;
        if (r < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            *ret_closed = true;
            break;
        }
        cr_assert_eq(r, (ssize_t)len, "flood send: %s", strerror(errno));
    }
    return sent;
}

static size_t enc_ping_id(uint8_t *buf, size_t cap, uint32_t id)
{
    return enc_simple(buf, cap, PROTO_OP_PING, id);
}

static size_t enc_lease_id(uint8_t *buf, size_t cap, uint32_t id)
{
    return enc_lease(buf, cap, id, 4096);
}

/* responsive: a ping on a fresh connection, and the whole cycle, each within 1 s. */
static void responsive(const struct daemon *d)
{
    long t0 = now_ms();
    shmref_conn *c = connect_ok(d);
    cr_assert_eq(shmref_ping(c), 0, "ping: %s", shmref_errmsg(c));
    long dt = now_ms() - t0;
    cr_assert_lt(dt, 1000, "connect + ping took %ld ms while another client floods", dt);
    shmref_close(c);
    t0 = now_ms();
    others_served(d);
    dt = now_ms() - t0;
    cr_assert_lt(dt, 1000, "a lease cycle took %ld ms while another client floods", dt);
}

Test(hostile, pipelined_pings_never_read, .timeout = 60)
{
    struct daemon d;
    static uint8_t rep[PROTO_MAX_REPLY];
    bool closed;

    daemon_start(&d, NULL);
    shmref_conn *other = connect_ok(&d);
    int fd = connect_hello(&d);
    raw_lease(fd, 2, 4096);
    unsigned sent = flood(fd, 5000, 3, enc_ping_id, &closed);
    cr_log_info("pipelined %u pings before the socket filled%s", sent, closed ? " (daemon hung up)" : "");
    cr_assert_gt(sent, 0);
    usleep(100000);

    long t0 = now_ms();
    cr_assert_eq(shmref_ping(other), 0, "ping of a connected client: %s", shmref_errmsg(other));
    cr_assert_lt(now_ms() - t0, 1000, "ping of a connected client took over 1 s");
    responsive(&d);

    /* Either the daemon kept the flooder (then every reply comes, in order) or it hung up. */
    unsigned got = 0;
    while (got < sent) {
        ssize_t n = recv_one(fd, rep, sizeof(rep), WAIT_MS);
        if (n == 0)
            break;
        expect_reply("pipelined ping", rep, n, PROTO_OP_PING, 3 + got);
        got++;
    }
    uint64_t slow = status_u64(&d, "counters.slow_clients");
    cr_log_info("flooder got %u of %u replies; slow_clients %llu", got, sent, (unsigned long long)slow);
    if (got < sent)
        cr_assert_eq(slow, 1, "flooder lost replies (%u of %u) without being counted slow", got, sent);
    else
        cr_assert_eq(slow, 0, "flooder got every reply yet was counted slow");
    close(fd);

    cr_assert_eq(shmref_ping(other), 0, "ping: %s", shmref_errmsg(other));
    shmref_close(other);
    cr_assert_eq(wait_status(&d, "daemon.clients", 1, WAIT_MS), 1, "flooder's connection still counted");
    expect_clean(&d, 0);
    daemon_stop(&d);
}

Test(hostile, pipelined_leases_never_read, .timeout = 60)
{
    struct daemon d;
    bool closed;

    daemon_start(&d, NULL);
    int fd = connect_hello(&d);
    unsigned sent = flood(fd, 3000, 2, enc_lease_id, &closed);
    cr_log_info("pipelined %u leases before the socket filled%s", sent, closed ? " (daemon hung up)" : "");
    cr_assert_gt(sent, 0);
    usleep(200000);
    responsive(&d);
    uint64_t leases = status_u64(&d, "counters.leases"), held = status_u64(&d, "pool.bytes_leased");
    cr_log_info("the flooder was granted %llu leases (%llu bytes) so far", (unsigned long long)leases,
                (unsigned long long)held);
    cr_assert_gt(held, 0, "no lease of the flooder was served");
    close(fd); /* with replies, and their fds, unread in its queue */

    responsive(&d);
    cr_assert_eq(wait_status(&d, "daemon.clients", 1, WAIT_MS), 1, "flooder's connection still counted");
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- 15b. stopping with hostile clients still connected ----------------------------------- */

Test(hostile, stop_with_hostile_clients_connected, .timeout = 60)
{
    struct daemon d;
    bool closed;
    shmref_buf *b;

    daemon_start(&d, NULL);
    int silent = raw_connect(&d); /* never says hello */
    int leaser = connect_hello(&d), pinger = connect_hello(&d);
    cr_assert_gt(flood(leaser, 3000, 2, enc_lease_id, &closed), 0);
    cr_assert_gt(flood(pinger, 5000, 2, enc_ping_id, &closed), 0);
    static const uint8_t half[] = { 0x94, PROTO_OP_LEASE }; /* and one malformed, in flight */
    int broken = connect_hello(&d);
    send_all(broken, half, sizeof(half));
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0, "lease: %s", shmref_errmsg(c));
    usleep(100000);

    daemon_stop(&d); /* exit 0, no libuv handle left, whatever the clients hold */
    int socks[] = { silent, leaser, pinger, broken };
    for (int i = 0; i < 4; i++) {
        cr_assert(raw_closed(socks[i], WAIT_MS), "connection %d not closed by a stopped daemon", i);
        close(socks[i]);
    }
    shmref_close(c);
}

/* ---- 17. a producer resizing its buffer through its own fd --------------------------------- */

/* A lease hands the producer an O_RDWR fd; through it the producer can fallocate any
 * size. Regression: such a buffer used to stay warm in the pool, pinning storage past
 * --pool-size; now the pool checks the file on return and retires it. */
Test(hostile, grown_buffer_not_kept_after_release, .timeout = 60)
{
    struct daemon d;
    int bfd;
    uint64_t cap;

    daemon_start(&d, "--pool-size", "64M", NULL);
    int sock = connect_hello(&d);
    uint64_t h = raw_lease_fd(sock, 2, 4096, &bfd, &cap);
    /* The private tmpfs is the pool's size: the growth stops there (ENOSPC), or, on a
     * tmpfs that is not the daemon's own, goes through and is retired at release. */
    int r = posix_fallocate(bfd, 0, 128 << 20);
    cr_assert(r == 0 || r == ENOSPC, "fallocate on the leased fd: %s", strerror(r));
    close(bfd);
    raw_release_ok(sock, 3, h);
    close(sock);
    cr_assert_eq(wait_status(&d, "daemon.clients", 1, WAIT_MS), 1);

    uint64_t accounted = status_u64(&d, "pool.bytes_allocated"), pinned = daemon_pinned_bytes(&d);
    cr_assert_leq(pinned, accounted,
                  "after its producer left, the daemon pins %llu bytes of tmpfs but accounts for %llu",
                  (unsigned long long)pinned, (unsigned long long)accounted);
    others_served(&d);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* The producer truncates its buffer through its O_RDWR fd and releases it. Regression:
 * the pool used to recycle it as is, so the next lease's mapping faulted (SIGBUS) past
 * the end of the file, against DESIGN.md ("never a SIGBUS in a client"). */
Test(hostile, shrunk_buffer_not_recycled, .timeout = 60)
{
    struct daemon d;
    int bfd;
    uint64_t cap;
    struct stat st;

    daemon_start(&d, NULL);
    int a = connect_hello(&d);
    uint64_t h = raw_lease_fd(a, 2, 4096, &bfd, &cap);
    cr_assert_eq(ftruncate(bfd, 0), 0, "ftruncate on the leased fd: %s", strerror(errno));
    close(bfd);
    raw_release_ok(a, 3, h);
    close(a);

    int b = connect_hello(&d);
    raw_lease_fd(b, 2, 4096, &bfd, &cap);
    cr_assert_eq(fstat(bfd, &st), 0);
    cr_assert_geq((uint64_t)st.st_size, cap,
                  "the next lease got a %lld-byte file behind a %llu-byte buffer: touching it is SIGBUS",
                  (long long)st.st_size, (unsigned long long)cap);
    close(bfd);
    close(b);
    others_served(&d);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- 16. deterministic fuzz -------------------------------------------------------------------------- */

#define FUZZ_CONNS 300
#define FUZZ_MSGS 20
#define FUZZ_WINDOW 8
#define FUZZ_SENTINEL 0x7ffffff0u

/* fuzz_base: one valid request. Handles are those a fresh connection's first leases get;
 * the acquire token is a real publication's, the one input the seed does not fix (the
 * daemon draws tokens at random), so how many connections survive varies a little. */
static size_t fuzz_base(uint32_t *s, uint8_t *buf, size_t cap, const shmref_desc *desc)
{
    uint32_t id = xorshift(s) & 0xffff;
    uint64_t handle = HANDLE(1, xorshift(s) % 4);
    switch (xorshift(s) % 6) {
    case 0: return enc_lease(buf, cap, id, 1 + xorshift(s) % 65536);
    case 1: return enc_publish(buf, cap, id, handle, xorshift(s) % 4096, "meta", 4);
    case 2: return enc_acquire(buf, cap, id, desc->token);
    case 3: return enc_release(buf, cap, id, handle, xorshift(s) & 1);
    case 4: return enc_simple(buf, cap, PROTO_OP_STATUS, id);
    default: return enc_simple(buf, cap, PROTO_OP_PING, id);
    }
}

/* fuzz_mutate: flip 1-3 bytes; sometimes cut the tail or add a byte. */
static size_t fuzz_mutate(uint32_t *s, uint8_t *buf, size_t len, size_t cap)
{
    unsigned flips = 1 + xorshift(s) % 3;
    for (unsigned i = 0; i < flips; i++)
        buf[xorshift(s) % len] ^= (uint8_t)(1 + xorshift(s) % 255);
    uint32_t tail = xorshift(s) % 8;
    if (tail == 0 && len > 1)
        len = 1 + xorshift(s) % (len - 1);
    else if (tail == 1 && len < cap)
        buf[len++] = (uint8_t)xorshift(s);
    return len;
}

struct fuzz_tally {
    unsigned alive, dropped, errors;
};

/* fuzz_collect: read fd's replies until the sentinel ping's reply (the daemon kept the
 * client) or EOF (it dropped it). Every reply must decode; every error must carry a
 * positive code and a message; a dropped client must have been told EPROTO. */
static void fuzz_collect(int fd, struct fuzz_tally *t)
{
    static uint8_t rep[PROTO_MAX_REPLY];
    unsigned eproto = 0;
    for (;;) {
        ssize_t n = recv_one(fd, rep, sizeof(rep), WAIT_MS);
        cr_assert_neq(n, -ETIMEDOUT, "fuzz: no reply and no close within %d ms", WAIT_MS);
        if (n == 0) {
            cr_assert_gt(eproto, 0, "fuzz: dropped without an EPROTO error reply");
            t->dropped++;
            return;
        }
        struct proto_msg m = decode_reply("fuzz", rep, n);
        if (m.op == PROTO_OP_ERROR) {
            cr_assert_gt(m.u.error.msg_len, 0, "fuzz: error %d without a message", m.u.error.code);
            t->errors++;
            eproto += m.u.error.code == EPROTO;
        }
        if (m.op == PROTO_OP_PING + PROTO_OP_REPLY && m.id == FUZZ_SENTINEL) {
            t->alive++;
            return;
        }
    }
}

/* fuzz_send: FUZZ_MSGS requests, each mutated with a probability of 1, 1/4, 1/16 or 1/64
 * chosen per connection (so some connections survive to send many), then a valid ping. */
static void fuzz_send(int fd, uint32_t *s, const shmref_desc *desc)
{
    static uint8_t buf[PROTO_MAX_REQUEST];
    uint32_t rate_mask = (1u << (2 * (xorshift(s) % 4))) - 1;
    for (unsigned i = 0; i < FUZZ_MSGS; i++) {
        size_t len = fuzz_base(s, buf, sizeof(buf) - 1, desc);
        if ((xorshift(s) & rate_mask) == 0)
            len = fuzz_mutate(s, buf, len, sizeof(buf));
        if (send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            break; /* dropped already, or full: the sentinel sorts it out */
    }
    size_t len = enc_simple(buf, sizeof(buf), PROTO_OP_PING, FUZZ_SENTINEL);
    send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL); /* if lost, fuzz_collect times out */
}

Test(hostile, fuzzed_requests, .timeout = 120)
{
    struct daemon d;
    struct fuzz_tally t = { 0 };
    uint32_t s = 0xc0ffee11;
    int window[FUZZ_WINDOW];
    shmref_buf *pb;
    shmref_desc desc;

    daemon_start(&d, "--max-lease-size", "1M", NULL);
    shmref_conn *p = connect_ok(&d);
    cr_assert_eq(shmref_lease(p, 4096, &pb), 0, "lease: %s", shmref_errmsg(p));
    cr_assert_eq(shmref_publish(pb, 4096, 0, NULL, 0, &desc), 0, "publish: %s", shmref_errmsg(p));
    long t0 = now_ms();

    for (unsigned done = 0; done < FUZZ_CONNS; done += FUZZ_WINDOW) {
        unsigned n = FUZZ_CONNS - done < FUZZ_WINDOW ? FUZZ_CONNS - done : FUZZ_WINDOW;
        for (unsigned i = 0; i < n; i++) {
            window[i] = connect_hello(&d);
            fuzz_send(window[i], &s, &desc);
        }
        for (unsigned i = 0; i < n; i++) {
            fuzz_collect(window[i], &t);
            close(window[i]);
        }
    }
    long dt = now_ms() - t0;
    cr_log_info("fuzz: %u connections kept, %u dropped, %u error replies, %ld ms", t.alive, t.dropped,
                t.errors, dt);
    cr_assert_eq(t.alive + t.dropped, FUZZ_CONNS);
    cr_assert_gt(t.dropped, 0, "no mutation was malformed enough to be dropped: the fuzzer is weak");
    cr_assert_gt(t.alive, 0, "every fuzzed connection was dropped: the fuzzer is too blunt");

    uint64_t leases = status_u64(&d, "counters.leases"), publishes = status_u64(&d, "counters.publishes"),
             acquires = status_u64(&d, "counters.acquires"), releases = status_u64(&d, "counters.releases");
    cr_log_info("fuzz: daemon served %llu leases, %llu publishes, %llu acquires, %llu releases",
                (unsigned long long)leases, (unsigned long long)publishes, (unsigned long long)acquires,
                (unsigned long long)releases);
    cr_assert(leases > 1 && publishes > 1 && acquires > 0 && releases > 0,
              "the fuzzer never got past the decoder for some op");
    others_served(&d);
    cr_assert_eq(shmref_release(pb), 0);
    shmref_close(p);
    cr_assert_eq(wait_status(&d, "daemon.clients", 1, WAIT_MS), 1, "fuzz connections still counted");
    /* every drop is one protocol error, and nothing else was one */
    expect_clean(&d, t.dropped);
    daemon_stop(&d);
}

/* ---- a connection that never says hello gives its --max-clients slot back ---- */

Test(hostile, silent_connection_is_closed_after_ten_seconds, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--max-clients", "1", NULL);
    cr_assert_eq(wait_status(&d, "daemon.clients", 1, WAIT_MS), 1);
    int fd = raw_connect(&d); /* takes the only slot, says nothing */
    int reserve[8]; /* and root's 8 more (the test runs as root) */
    for (int i = 0; i < 8; i++)
        reserve[i] = raw_connect(&d);
    shmref_conn *c = NULL;
    cr_assert_eq(shmref_connect(d.socket, &c), -EUSERS, "the slot is taken");
    uint8_t rep[1024];
    char text[PROTO_MAX_ERRMSG + 1];
    expect_error("silent connection", rep, recv_one(fd, rep, sizeof(rep), 12000), 0, ETIMEDOUT, text);
    cr_assert_not_null(strstr(text, "no hello"), "%s", text);
    cr_assert(raw_closed(fd, WAIT_MS), "the silent connection stays open");
    close(fd);
    for (int i = 0; i < 8; i++) {
        cr_assert(raw_closed(reserve[i], WAIT_MS), "a silent connection stays open");
        close(reserve[i]);
    }
    long deadline = now_ms() + 2000;
    int r;
    while ((r = shmref_connect(d.socket, &c)) < 0 && now_ms() < deadline)
        usleep(5000);
    cr_assert_eq(r, 0, "the slot came back: %s", strerror(-r));
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- PROTO_FEAT_FD_ONCE: an fd crosses once per connection until forgotten ---- */

/* lease_reply_fd: a lease on sock; its fd (or -1 when none came) and buffer id. */
static uint64_t lease_reply_fd(int sock, uint32_t id, uint64_t size, int *ret_fd, uint64_t *ret_buf_id)
{
    uint8_t msg[64], rep[1024];
    size_t len = enc_lease(msg, sizeof(msg), id, size);
    send_all(sock, msg, len);
    struct pollfd p = { .fd = sock, .events = POLLIN };
    cr_assert_gt(poll(&p, 1, WAIT_MS), 0, "no lease reply");
    struct proto_msg m = expect_reply("lease", rep, recv_nb(sock, rep, sizeof(rep), ret_fd), PROTO_OP_LEASE, id);
    *ret_buf_id = m.u.lease_reply.buf_id;
    return m.u.lease_reply.handle;
}

Test(hostile, fd_once_sends_each_buffer_once)
{
    struct daemon d;
    uint8_t msg[256], rep[1024];
    int fd;
    uint64_t b1, b2, b3;
    daemon_start(&d, NULL);
    int sock = raw_connect(&d);
    struct proto_msg h = { .op = PROTO_OP_HELLO, .id = 1 };
    h.u.hello.version = PROTO_VERSION;
    h.u.hello.features = PROTO_FEAT_FD_ONCE;
    struct proto_msg hr = expect_reply("hello", rep, call(sock, msg, enc(&h, msg, sizeof(msg)), rep, sizeof(rep)),
                                       PROTO_OP_HELLO, 1);
    cr_assert(hr.u.hello_reply.features & PROTO_FEAT_FD_ONCE, "the daemon agrees to send fds once");

    uint64_t h1 = lease_reply_fd(sock, 2, 65536, &fd, &b1);
    cr_assert_geq(fd, 0, "the first lease of a buffer brings its fd");
    close(fd);
    raw_release_ok(sock, 3, h1);
    uint64_t h2 = lease_reply_fd(sock, 4, 65536, &fd, &b2);
    cr_assert_eq(b2, b1, "the warm buffer is recycled");
    cr_assert_eq(fd, -1, "a buffer this connection holds mapped comes without its fd");

    /* Acquiring it read-only: the writable mapping serves, so no fd either. */
    size_t len = enc_publish(msg, sizeof(msg), 5, h2, 100, NULL, 0);
    struct proto_msg pr = expect_reply("publish", rep, call(sock, msg, len, rep, sizeof(rep)), PROTO_OP_PUBLISH, 5);
    len = enc_acquire(msg, sizeof(msg), 6, pr.u.publish_reply.token);
    send_all(sock, msg, len);
    struct pollfd p = { .fd = sock, .events = POLLIN };
    cr_assert_gt(poll(&p, 1, WAIT_MS), 0);
    struct proto_msg ar = expect_reply("acquire", rep, recv_nb(sock, rep, sizeof(rep), &fd), PROTO_OP_ACQUIRE, 6);
    cr_assert_eq(fd, -1, "no read-only fd for a buffer mapped writable");
    raw_release_ok(sock, 7, ar.u.acquire_reply.handle);
    raw_release_ok(sock, 8, h2);

    /* After forget, the fd comes again. */
    struct proto_msg f = { .op = PROTO_OP_FORGET, .id = 9 };
    f.u.forget.buf_id = b1;
    f.u.forget.writable = 1;
    send_all(sock, msg, enc(&f, msg, sizeof(msg)));
    raw_ping_ok(sock, 10); /* forget has no reply: the ping's reply is the next message */
    uint64_t h3 = lease_reply_fd(sock, 11, 65536, &fd, &b3);
    cr_assert_eq(b3, b1);
    cr_assert_geq(fd, 0, "a forgotten buffer comes with its fd again");
    close(fd);
    raw_release_ok(sock, 12, h3);

    /* A client that did not ask for the feature gets the fd every time. */
    int plain = connect_hello(&d);
    for (uint32_t i = 0; i < 2; i++) {
        uint64_t hp = lease_reply_fd(plain, 20 + 2 * i, 65536, &fd, &b3);
        cr_assert_geq(fd, 0, "lease %u without the feature", i);
        close(fd);
        raw_release_ok(plain, 21 + 2 * i, hp);
    }
    close(plain);
    close(sock);
    expect_clean(&d, 0);
    daemon_stop(&d);
}

/* ---- bye: a label for the end of a connection, never a way to keep anything ---------------- */

/* A client that says bye while it still holds a lease loses the lease as at any end (only
 * its end is counted as a clean close); one that says anything after bye is a protocol
 * error, closed, its request not served, and counted neither as closed nor as died. */
Test(hostile, bye_is_the_last_word_and_keeps_nothing, .timeout = 60)
{
    struct daemon d;
    uint8_t msg[256];
    daemon_start(&d, NULL);
    /* (every status read is a connection that closes cleanly: clients_closed moves with
     * them, clients_died does not) */
    uint64_t died = status_u64(&d, "counters.clients_died");

    int a = connect_hello(&d);
    raw_lease(a, 2, 1 << 20);
    size_t len = enc_simple(msg, sizeof(msg), PROTO_OP_BYE, 3);
    send_all(a, msg, len);
    close(a);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, WAIT_MS), 0,
                 "the lease of a client that said bye is reclaimed");
    cr_assert_eq(status_u64(&d, "counters.clients_died"), died, "a bye, then the close: no death");

    int z = connect_hello(&d); /* the same without the bye: a death */
    raw_lease(z, 2, 1 << 20);
    close(z);
    cr_assert_eq(wait_status(&d, "counters.clients_died", died + 1, WAIT_MS), died + 1, "no bye: a death");
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, WAIT_MS), 0);

    int b = connect_hello(&d);
    len = enc_simple(msg, sizeof(msg), PROTO_OP_BYE, 4);
    send_all(b, msg, len);
    len = enc_simple(msg, sizeof(msg), PROTO_OP_PING, 5);
    expect_dropped("a ping after bye", b, msg, len, 5);
    close(b);

    int c = connect_hello(&d);
    raw_lease(c, 6, 1 << 20);
    len = enc_simple(msg, sizeof(msg), PROTO_OP_BYE, 7);
    send_all(c, msg, len);
    len = enc_lease(msg, sizeof(msg), 8, 4096);
    expect_dropped("a lease after bye", c, msg, len, 8);
    close(c);

    others_served(&d);
    expect_clean(&d, 2);
    cr_assert_eq(status_u64(&d, "counters.clients_died"), died + 1,
                 "a liar after bye, closed by the daemon, is counted as a protocol error only");
    daemon_stop(&d);
}
