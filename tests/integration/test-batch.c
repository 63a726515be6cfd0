/* SPDX-License-Identifier: MIT */
/* test-batch.c: protocol version 2 batches and the version check, through a real shmrefd
 * on a temporary socket, spoken raw: lease_many answers with every item and every fd in
 * ONE message (fd-once per item), all or nothing, waiting as a unit when asked;
 * release_many; a version 1 hello gets
 * EPROTONOSUPPORT naming both versions and the connection closes. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "rawv2.h"
#include "rawclient.h"

TestSuite(batch, .fini = reap_children);

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

static void lease_many_send(int fd, uint32_t id, uint32_t n, uint64_t size, uint32_t wait_ms)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE_MANY, .id = id };
    m.u.lease_many.n = n;
    for (uint32_t i = 0; i < n; i++)
        m.u.lease_many.sizes[i] = size + i;
    m.u.lease_many.wait_ms = wait_ms;
    rv_send(fd, &m);
}

static void release_many_send(int fd, uint32_t id, const uint64_t *handles, uint32_t n, uint32_t flags)
{
    struct proto_msg m = { .op = PROTO_OP_RELEASE_MANY, .id = id };
    m.u.release_many.n = n;
    memcpy(m.u.release_many.handles, handles, n * sizeof(handles[0]));
    m.u.release_many.flags = flags;
    rv_send(fd, &m);
}

/* 32 leases in one request, one reply with 32 fds; each fd is its item's buffer (write
 * through it, publish the item under its token, read it back through an acquire). */
Test(batch, lease_many_sends_every_fd_in_one_message, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--max-leases", "64", NULL);
    int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE);
    lease_many_send(fd, 7, PROTO_MAX_BATCH, 4 * KiB, 0);
    struct proto_msg r;
    int fds[64];
    unsigned nfds = 0;
    ssize_t n = rv_recv_fds(fd, 10000, &r, fds, 64, &nfds);
    cr_assert_gt(n, 0);
    cr_assert_eq(r.op, PROTO_OP_LEASE_MANY + PROTO_OP_REPLY, "%.*s", (int)r.u.error.msg_len, r.u.error.msg);
    cr_assert_eq(r.id, 7);
    cr_assert_eq(r.u.lease_many_reply.n, PROTO_MAX_BATCH);
    cr_assert_eq(nfds, PROTO_MAX_BATCH, "%u fds came with the reply", nfds);
    struct proto_item items[PROTO_MAX_BATCH];
    memcpy(items, r.u.lease_many_reply.items, sizeof(items));
    for (uint32_t i = 0; i < PROTO_MAX_BATCH; i++) {
        cr_assert_eq(items[i].has_fd, 1, "item %u", i);
        cr_assert_eq(items[i].size, 4 * KiB + i);
        struct stat st;
        cr_assert_eq(fstat(fds[i], &st), 0);
        cr_assert_geq((uint64_t)st.st_size, items[i].capacity, "item %u: fd of another buffer?", i);
    }
    cr_assert_eq(status_u64(&d, "buffers.leases"), PROTO_MAX_BATCH);

    /* item 5: write through its fd, publish one-way, a consumer reads it */
    uint8_t *p = mmap(NULL, items[5].capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fds[5], 0);
    cr_assert_neq(p, MAP_FAILED);
    fill_pattern(p, items[5].size, 55);
    munmap(p, items[5].capacity);
    rv_publish_send(fd, 8, items[5].handle, items[5].size);
    int c = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    rv_acquire_send(c, 9, items[5].token, 0);
    int afd[1];
    unsigned an = 0;
    cr_assert_gt(rv_recv_fds(c, 5000, &r, afd, 1, &an), 0);
    cr_assert_eq(r.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY, "%.*s", (int)r.u.error.msg_len, r.u.error.msg);
    cr_assert_eq(an, 1);
    cr_assert_eq(r.u.acquire_reply.buf_id, items[5].buf_id);
    const uint8_t *q = mmap(NULL, r.u.acquire_reply.capacity, PROT_READ, MAP_SHARED, afd[0], 0);
    cr_assert_neq(q, MAP_FAILED);
    cr_assert_eq(check_pattern(q, items[5].size, 55), -1, "the consumer read other bytes");
    munmap((void *)q, r.u.acquire_reply.capacity);
    close(afd[0]);
    rv_release_send(c, 10, r.u.acquire_reply.handle);
    close(c);

    /* release_many, one unknown handle among them: named, the others released */
    uint64_t handles[PROTO_MAX_BATCH];
    for (uint32_t i = 0; i < PROTO_MAX_BATCH; i++)
        handles[i] = items[i].handle;
    uint64_t keep = handles[3];
    handles[3] = 999;
    char text[PROTO_MAX_ERRMSG + 1];
    release_many_send(fd, 11, handles, PROTO_MAX_BATCH, PROTO_RELEASE_NOREPLY);
    rv_expect_error(fd, 5000, 11, ENOENT, text, sizeof(text), "release_many with an unknown handle");
    cr_assert(strstr(text, "handle 999 (item 3 of 32)"), "%s", text);
    cr_assert_eq(wait_status(&d, "buffers.leases", 1, 5000), 1);
    release_many_send(fd, 12, &keep, 1, 0);
    rv_expect(fd, 5000, PROTO_OP_RELEASE_MANY + PROTO_OP_REPLY, 12, &r, "release_many");
    cr_assert_eq(status_u64(&d, "buffers.leases"), 0);

    /* fd-once per item: the recycled buffers this connection still knows come without an
     * fd; a forgotten one comes with its fd again */
    struct proto_msg fg = { .op = PROTO_OP_FORGET, .id = 0 };
    fg.u.forget.buf_id = items[0].buf_id;
    fg.u.forget.writable = 1;
    rv_send(fd, &fg);
    lease_many_send(fd, 13, 4, 4 * KiB, 0);
    nfds = 0;
    cr_assert_gt(rv_recv_fds(fd, 5000, &r, fds + 32, 32, &nfds), 0);
    cr_assert_eq(r.op, PROTO_OP_LEASE_MANY + PROTO_OP_REPLY, "%.*s", (int)r.u.error.msg_len, r.u.error.msg);
    unsigned with_fd = 0;
    for (uint32_t i = 0; i < 4; i++) {
        const struct proto_item *it = &r.u.lease_many_reply.items[i];
        bool known = false;
        for (uint32_t j = 0; j < PROTO_MAX_BATCH; j++)
            known |= it->buf_id == items[j].buf_id && it->buf_id != items[0].buf_id;
        cr_assert_eq(it->has_fd, !known, "item %u (buffer %llu): has_fd %u", i, (unsigned long long)it->buf_id,
                     it->has_fd);
        with_fd += it->has_fd;
        handles[i] = it->handle;
    }
    cr_assert_eq(nfds, with_fd, "%u fds for %u items with has_fd", nfds, with_fd);
    for (unsigned i = 0; i < nfds; i++)
        close(fds[32 + i]);
    release_many_send(fd, 14, handles, 4, PROTO_RELEASE_NOREPLY);
    rv_nothing(fd, 200, "a no-reply release_many");
    cr_assert_eq(status_u64(&d, "buffers.leases"), 0);
    for (uint32_t i = 0; i < PROTO_MAX_BATCH; i++)
        close(fds[i]);
    close(fd);
    daemon_stop(&d);
}

/* All or nothing: one item past the quota, and the batch leaves nothing charged. */
Test(batch, lease_many_is_all_or_nothing, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "4M", "--max-leases", "64", NULL);
    int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    lease_many_send(fd, 21, 5, MiB, 0); /* 1 MiB + i each: five of them pass 4 MiB (their classes, sooner) */
    char text[PROTO_MAX_ERRMSG + 1];
    rv_expect_error(fd, 10000, 21, EDQUOT, text, sizeof(text), "lease_many past the quota");
    cr_assert(strstr(text, "lease_many item ") && strstr(text, " of 5 (1.0 MiB): quota exceeded for uid "), "%s", text);
    cr_assert(strstr(text, "no lease of the batch was made"), "%s", text);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0, "an undone batch kept bytes");
    cr_assert_eq(status_u64(&d, "buffers.leases"), 0);
    /* a lease_many that asks to wait waits as a unit: nothing while the quota is held,
     * the whole batch (with its fds) once it frees */
    uint64_t h = rv_lease(fd, 23, 4 * MiB, NULL);
    lease_many_send(fd, 22, 2, MiB, 10000);
    rv_nothing(fd, 300, "a waiting lease_many with the quota held");
    cr_assert_eq(status_u64(&d, "counters.lease_waits"), 1);
    rv_release_send(fd, 24, h);
    struct proto_msg r;
    int fds[8];
    unsigned nfds = 0;
    cr_assert_gt(rv_recv_fds(fd, 5000, &r, fds, 8, &nfds), 0);
    cr_assert_eq(r.op, PROTO_OP_LEASE_MANY + PROTO_OP_REPLY, "%.*s", (int)r.u.error.msg_len, r.u.error.msg);
    cr_assert_eq(r.id, 22);
    cr_assert_eq(nfds, 2);
    uint64_t hs[2] = { r.u.lease_many_reply.items[0].handle, r.u.lease_many_reply.items[1].handle };
    for (unsigned i = 0; i < nfds; i++)
        close(fds[i]);
    release_many_send(fd, 25, hs, 2, PROTO_RELEASE_NOREPLY);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    close(fd);
    daemon_stop(&d);
}

/* A version 1 client: the hello layout is the same in every version, so it reads the
 * refusal, which names both versions; then the daemon closes the connection. */
Test(batch, version_1_hello_is_refused_and_closed, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int fd = raw_connect(&d);
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 3 };
    m.u.hello.version = 1;
    m.u.hello.name = "old";
    m.u.hello.name_len = 3;
    rv_send(fd, &m);
    char text[PROTO_MAX_ERRMSG + 1];
    rv_expect_error(fd, 5000, 3, EPROTONOSUPPORT, text, sizeof(text), "a version 1 hello");
    cr_assert_str_eq(text, "protocol version 1 is not supported: this shmrefd speaks version 3 (and 2); use a "
                           "libshmref of either protocol version");
    cr_assert(raw_closed(fd, 5000), "the connection stayed open after a version mismatch");
    close(fd);
    /* the daemon serves everyone else */
    fd = rv_connect(&d, 0);
    uint64_t h = rv_lease(fd, 4, 100, NULL);
    rv_release_send(fd, 5, h);
    close(fd);
    daemon_stop(&d);
}

/* A newer libshmref (version 4) is refused with the versions this daemon speaks, like
 * version 1 (version 2, the previous one, is served: test-skew.c). */
Test(batch, a_newer_version_hello_is_refused_and_closed, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int fd = raw_connect(&d);
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 4 };
    m.u.hello.version = 4;
    m.u.hello.name = "v4";
    m.u.hello.name_len = 2;
    rv_send(fd, &m);
    char text[PROTO_MAX_ERRMSG + 1];
    rv_expect_error(fd, 5000, 4, EPROTONOSUPPORT, text, sizeof(text), "a version 4 hello");
    cr_assert_str_eq(text, "protocol version 4 is not supported: this shmrefd speaks version 3 (and 2); use a "
                           "libshmref of either protocol version");
    cr_assert(raw_closed(fd, 5000), "the connection stayed open after a version mismatch");
    close(fd);
    daemon_stop(&d);
}

/* fake_v2_daemon: accepts one connection on lfd and answers its hello as a version 2
 * shmrefd that accepted it would (a hello reply saying version 2). */
static int fake_v2_daemon(void *arg)
{
    int lfd = *(int *)arg, c = accept(lfd, NULL, NULL);
    uint8_t buf[4096];
    struct proto_msg m, r = { .op = PROTO_OP_HELLO + PROTO_OP_REPLY };
    const char *why;
    ssize_t n = c < 0 ? -1 : rawclient_recv_wait(c, buf, sizeof(buf), 5000);
    if (n <= 0 || proto_decode(buf, (size_t)n, sizeof(buf), &m, &why) < 0 || m.op != PROTO_OP_HELLO)
        return 1;
    r.id = m.id;
    r.u.hello_reply.version = 2;
    r.u.hello_reply.max_request = PROTO_MAX_REQUEST;
    r.u.hello_reply.max_lease = 1 << 20;
    r.u.hello_reply.max_leases = 16;
    r.u.hello_reply.max_meta = PROTO_MAX_META;
    int len = proto_encode(&r, buf, sizeof(buf));
    if (len <= 0 || rawclient_send(c, buf, (size_t)len) < 0)
        return 2;
    rawclient_closed(c, 5000);
    return 0;
}

/* libshmref refuses a daemon that answers its version 3 hello in version 2, naming both (a
 * real version 2 daemon refuses that hello, and libshmref then says hello in version 2:
 * test-skew.c). */
Test(batch, a_daemon_answering_another_version_is_refused_by_libshmref, .timeout = 60)
{
    char dir[] = "/tmp/shmref-v2-XXXXXX", path[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/sock", dir);
    int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    strcpy(sa.sun_path, path);
    cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(lfd, 4), 0);
    pid_t pid = child_run(fake_v2_daemon, &lfd);
    shmref_conn *c = NULL;
    int r = shmref_connect(path, &c);
    cr_assert_eq(r, -EPROTONOSUPPORT, "connect: %d", r);
    cr_assert_null(c);
    cr_assert(strstr(shmref_errmsg(NULL), "answered in protocol 2") &&
              strstr(shmref_errmsg(NULL), "a hello of protocol 3"), "%s", shmref_errmsg(NULL));
    cr_assert_eq(child_wait(pid), 0);
    close(lfd);
    unlink(path);
    rmdir(dir);
}
