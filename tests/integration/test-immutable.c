/* SPDX-License-Identifier: MIT */
/* test-immutable.c: a published buffer cannot be changed by another uid, in every pool
 * kind (tmpfile, tmpfile-hugepages, memfd): a consumer of another uid that keeps its
 * O_RDONLY fd (a raw client, as an attacker would) cannot reopen it writable through
 * /proc/self/fd, truncate, grow, write or map it writable, and the producer reads its
 * bytes intact afterwards (regression, issue 8 item 1: with --memfd the file was mode
 * 0777, and the producer died of SIGBUS after the consumer's ftruncate). A memfd's size
 * is sealed at birth, so not even its producer can resize it; a tmpfile producer's growth
 * is bounded by the private tmpfs, which is the pool's size. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "proto.h"
#include "rawclient.h"

#define WAIT_MS 5000
#define SIZE (1u << 20)
#define OTHER_UID 65534

static struct daemon d;

/* tenant_pinned: tenants[].pinned of uid (0 if not listed). */
static uint64_t tenant_pinned(uint32_t uid)
{
    uint64_t n = status_u64(&d, "tenants_total");
    char path[64];
    for (uint64_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "tenants.%llu.uid", (unsigned long long)i);
        if (status_u64(&d, path) != uid)
            continue;
        snprintf(path, sizeof(path), "tenants.%llu.pinned", (unsigned long long)i);
        return status_u64(&d, path);
    }
    return 0;
}

/* raw_request: send m on sock, wait for its reply into *rep (decoded from buf); the fd
 * the reply carried in *ret_fd (or -1). */
static void raw_request(int sock, const struct proto_msg *m, uint8_t *buf, size_t cap, struct proto_msg *rep,
                        int *ret_fd)
{
    const char *why = "";
    int len = proto_encode(m, buf, cap);
    cr_assert_gt(len, 0);
    cr_assert_eq(rawclient_send(sock, buf, (size_t)len), 0);
    struct pollfd p = { .fd = sock, .events = POLLIN };
    cr_assert_gt(poll(&p, 1, WAIT_MS), 0, "no reply to %s", proto_op_name(m->op));
    ssize_t n = rawclient_recv(sock, buf, cap, ret_fd);
    cr_assert_gt(n, 0);
    cr_assert_eq(proto_decode(buf, (size_t)n, PROTO_MAX_REPLY, rep, &why), 0, "%s", why);
}

/* raw_open: a raw connection past hello. */
static int raw_open(void)
{
    uint8_t buf[4096];
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, rep;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.name = "attacker";
    m.u.hello.name_len = 8;
    int sock = rawclient_connect(d.socket);
    cr_assert_geq(sock, 0);
    raw_request(sock, &m, buf, sizeof(buf), &rep, NULL);
    cr_assert_eq(rep.op, PROTO_OP_HELLO + PROTO_OP_REPLY);
    return sock;
}

/* raw_acquire: acquire the buffer of desc on sock; returns its O_RDONLY fd, or -errno
 * of the refusal. */
static int raw_acquire(int sock, const shmref_desc *desc, uint64_t *ret_cap)
{
    uint8_t buf[4096];
    struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = 2 }, rep;
    int fd = -1;
    memcpy(m.u.acquire.token, desc->token, PROTO_TOKEN_LEN);
    raw_request(sock, &m, buf, sizeof(buf), &rep, &fd);
    if (rep.op == PROTO_OP_ERROR)
        return -rep.u.error.code;
    cr_assert_eq(rep.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY);
    cr_assert_geq(fd, 0, "an acquire reply without an fd");
    *ret_cap = rep.u.acquire_reply.capacity;
    return fd;
}

enum { REOPEN_RW = 1, TRUNCATE = 2, GROW = 4, WRITE = 8, MPROTECT = 16, MAP_RW = 32, PUNCH = 64 };

/* try_changes: every way to change a file through an fd; returns a mask of those that
 * worked (0: none did). */
static int try_changes(int fd, uint64_t cap)
{
    char path[64];
    int done = 0;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int rw = open(path, O_RDWR | O_CLOEXEC);
    if (rw >= 0)
        done |= REOPEN_RW;
    fd = rw >= 0 ? rw : fd; /* an attacker goes on with what it got */
    if (ftruncate(fd, 0) == 0)
        done |= TRUNCATE;
    if (fallocate(fd, 0, 0, (off_t)(cap * 2)) == 0)
        done |= GROW;
    if (pwrite(fd, "x", 1, 0) == 1)
        done |= WRITE;
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0)
        done |= PUNCH;
    void *p = mmap(NULL, cap, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
        if (mprotect(p, cap, PROT_READ | PROT_WRITE) == 0)
            done |= MPROTECT;
        munmap(p, cap);
    }
    p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
        done |= MAP_RW;
        munmap(p, cap);
    }
    if (rw >= 0)
        close(rw);
    return done;
}

/* attack_as_other_uid: a consumer of another uid acquires the buffer raw (checking, if
 * want_seals, that it is sealed against writing, shrinking and growing) and tries every
 * change; returns the mask of those that worked (100+ for a setup failure). */
static int attack_as_other_uid(const shmref_desc *desc, bool want_seals)
{
    uint64_t cap = 0;
    if (setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0)
        return 100;
    int sock = raw_open();
    int fd = raw_acquire(sock, desc, &cap);
    if (fd < 0)
        return 101;
    const int all = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;
    if (want_seals && (fcntl(fd, F_GET_SEALS) & all) != all)
        return 102;
    int done = try_changes(fd, cap);
    close(fd);
    close(sock);
    return done;
}

/* other_uid_attacks: a child's body: attack_as_other_uid on a plain buffer. */
static int other_uid_attacks(void *arg)
{
    return attack_as_other_uid(arg, false);
}

/* published_cannot_change: root publishes SIZE bytes of a pattern; another uid attacks;
 * the bytes, the size and the blocks are what they were. */
static void published_cannot_change(const char *want_kind, const char *opt, const char *val)
{
    daemon_start(&d, "--socket-mode", "0666", "--pool-size", "64M", opt, val, NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_status *st;
    const char *kind = "";
    cr_assert_eq(shmref_status_get(c, &st), 0);
    cr_assert_eq(shmref_status_str(st, "pool.kind", &kind), 0);
    cr_assert_str_eq(kind, want_kind);
    shmref_status_free(st);

    shmref_buf *b;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, SIZE, &b), 0, "%s", shmref_errmsg(c));
    size_t cap = shmref_buf_capacity(b);
    fill_pattern(shmref_buf_data(b), cap, 7);
    cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(c));
    int done = child_wait(child_run(other_uid_attacks, &desc));
    cr_assert_eq(done, 0, "%s: uid %d changed the published buffer (mask %d: 1 reopen O_RDWR, 2 ftruncate, "
                 "4 fallocate, 8 write, 16 mprotect, 32 writable mmap, 64 punch hole)", want_kind, OTHER_UID, done);
    /* Reading the whole capacity would be SIGBUS past a truncated end. */
    cr_assert_eq(check_pattern(shmref_buf_data(b), cap, 7), -1, "the producer's bytes changed");
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);
    daemon_stop(&d);
}

Test(immutable, tmpfile_published_buffer_is_read_only_to_other_uids)
{
    published_cannot_change("tmpfile", "--pool-hugepages", "no");
}

Test(immutable, hugepages_published_buffer_is_read_only_to_other_uids)
{
    cr_assert_eq(geteuid(), 0, "the huge-page pool needs root, as in CI");
    published_cannot_change("tmpfile-hugepages", "--pool-hugepages", "yes");
}

Test(immutable, memfd_published_buffer_is_read_only_to_other_uids)
{
    published_cannot_change("memfd", "--memfd", "--verbose");
}

/* raw_lease_fd: a raw lease that keeps its O_RDWR fd, as a hostile producer would. */
static int raw_lease_fd(int sock, uint64_t size, uint64_t *ret_cap)
{
    uint8_t buf[4096];
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 3 }, rep;
    int fd = -1;
    m.u.lease.size = size;
    raw_request(sock, &m, buf, sizeof(buf), &rep, &fd);
    cr_assert_eq(rep.op, PROTO_OP_LEASE + PROTO_OP_REPLY, "lease refused: %.*s", (int)rep.u.error.msg_len,
                 rep.u.error.msg);
    cr_assert_geq(fd, 0);
    *ret_cap = rep.u.lease_reply.capacity;
    return fd;
}

/* A memfd's size is sealed at creation: its own producer cannot shrink or grow it. */
Test(immutable, memfd_producer_cannot_resize_its_lease)
{
    daemon_start(&d, "--memfd", NULL);
    int sock = raw_open();
    uint64_t cap;
    int fd = raw_lease_fd(sock, 4096, &cap);
    int seals = fcntl(fd, F_GET_SEALS);
    cr_assert_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW, "seals %#x", seals);
    cr_expect_eq(ftruncate(fd, 0), -1);
    cr_expect_eq(ftruncate(fd, (off_t)cap * 2), -1);
    cr_expect_eq(fallocate(fd, 0, 0, 8 << 20), -1, "a 4 KiB lease grew to 8 MiB");
    cr_expect_eq(errno, EPERM);
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    cr_expect_eq((uint64_t)sb.st_size, cap);
    cr_expect_eq(sb.st_mode & 0777, 0600, "a memfd is mode 0600, not 0777");
    close(fd);
    close(sock);
    daemon_stop(&d);
}

/* Regression (issue 8 item 5): the private tmpfs was twice the pool (at least 64 MiB), so
 * a producer's fallocate took 64 MiB over an 8 MiB pool. It is the pool's size now. */
Test(immutable, tmpfile_producer_growth_is_bounded_by_the_pool)
{
    cr_assert_eq(geteuid(), 0, "the huge-page pool needs root, as in CI");
    daemon_start(&d, "--pool-size", "8M", "--pool-hugepages", "yes", NULL);
    int sock = raw_open();
    uint64_t cap;
    int fd = raw_lease_fd(sock, 4096, &cap);
    int r = posix_fallocate(fd, 0, 64 << 20);
    cr_expect_eq(r, ENOSPC, "a 4 KiB lease grew to 64 MiB over an 8 MiB pool");
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    cr_expect_leq((uint64_t)sb.st_blocks * 512, 8u << 20, "%llu bytes allocated",
                  (unsigned long long)sb.st_blocks * 512);
    close(fd);
    close(sock);
    daemon_stop(&d);
}

/* ---- sealed publish ------------------------------------------------------------------- */

/* sealed_attacker: a child's body: another uid acquires a sealed buffer raw: the seals
 * are there, and nothing changes it. */
static int sealed_attacker(void *arg)
{
    return attack_as_other_uid(arg, true);
}

Test(immutable, sealed_publish_cannot_be_changed_by_anyone)
{
    daemon_start(&d, "--memfd", "--socket-mode", "0666", NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b, *r;
    shmref_desc desc, plain;
    cr_assert_eq(shmref_lease(c, SIZE, &b), 0, "%s", shmref_errmsg(c));
    fill_pattern(shmref_buf_data(b), SIZE, 11);
    cr_assert_eq(shmref_publish_ex(b, SIZE, 60000, 0, SHMREF_PUBLISH_SEALED, "m", 1, &desc), 0, "%s",
                 shmref_errmsg(c));
    cr_assert_null(shmref_buf_data(b), "the producer's writable mapping is gone");

    /* another uid: nothing at all; root (the daemon's uid here) may reopen it O_RDWR, and
     * can still change nothing. */
    cr_assert_eq(child_wait(child_run(sealed_attacker, &desc)), 0);
    int sock = raw_open();
    uint64_t cap;
    int fd = raw_acquire(sock, &desc, &cap);
    cr_assert_geq(fd, 0);
    int done = try_changes(fd, cap);
    cr_assert_eq(done & ~REOPEN_RW, 0, "root changed a sealed buffer (mask %d)", done);
    close(fd);
    close(sock);

    /* a consumer through libshmref: seals checked, bytes intact */
    cr_assert_eq(shmref_acquire_ex(c, &desc, SHMREF_ACQUIRE_SEALED, &r), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_buf_sealed(r), 1);
    cr_assert_eq(check_pattern(shmref_buf_data(r), SIZE, 11), -1);
    cr_assert_eq(shmref_release(r), 0);

    /* a consumer that asks for sealed refuses a plain buffer */
    shmref_buf *p;
    cr_assert_eq(shmref_lease(c, 4096, &p), 0);
    cr_assert_eq(shmref_publish(p, 4096, 0, NULL, 0, &plain), 0);
    cr_assert_eq(shmref_acquire_ex(c, &plain, SHMREF_ACQUIRE_SEALED, &r), -EPERM);
    cr_assert(strstr(shmref_errmsg(c), "not sealed"), "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_acquire_ex(c, &plain, 0, &r), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_buf_sealed(r), 0);
    cr_assert_eq(shmref_release(r), 0);
    cr_assert_eq(shmref_release(p), 0);
    shmref_close(c);
    daemon_stop(&d);
}

/* Publish-once: a sealed buffer is retired after its last holder, never recycled. */
Test(immutable, sealed_buffer_is_retired_not_recycled)
{
    daemon_start(&d, "--memfd", NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 4096, &b), 0);
    cr_assert_eq(shmref_publish_ex(b, 4096, 0, 0, SHMREF_PUBLISH_SEALED, NULL, 0, &desc), 0, "%s",
                 shmref_errmsg(c));
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(status_u64(&d, "counters.buffers_retired"), 1);
    cr_assert_eq(status_u64(&d, "pool.bytes_warm"), 0);
    cr_assert_eq(shmref_lease(c, 4096, &b), 0);
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 2, "a new buffer, not the sealed one");
    memset(shmref_buf_data(b), 1, 4096); /* writable as ever */
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);
    daemon_stop(&d);
}

Test(immutable, sealed_publish_on_a_tmpfile_pool_is_eopnotsupp)
{
    daemon_start(&d, "--pool-hugepages", "no", NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 4096, &b), 0);
    cr_assert_eq(shmref_publish_ex(b, 4096, 0, 0, SHMREF_PUBLISH_SEALED, NULL, 0, &desc), -EOPNOTSUPP);
    cr_assert(strstr(shmref_errmsg(c), "memfd"), "the message names the way: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0, "the connection stays");
    shmref_close(c);
    daemon_stop(&d);
}

/* F_SEAL_WRITE needs every writable mapping gone: a producer that keeps one (a raw
 * client; libshmref unmaps its own) gets EBUSY, and its buffer stays unpublished. */
Test(immutable, sealed_publish_with_a_writable_mapping_is_ebusy)
{
    daemon_start(&d, "--memfd", NULL);
    int sock = raw_open();
    uint64_t cap;
    int fd = raw_lease_fd(sock, 4096, &cap);
    void *w = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(w, MAP_FAILED);
    uint8_t buf[256];
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 9 }, rep;
    m.u.publish.handle = (UINT64_C(1) << 32); /* the first handle of a connection */
    m.u.publish.size = 4096;
    m.u.publish.flags = PROTO_PUBLISH_SEALED;
    raw_request(sock, &m, buf, sizeof(buf), &rep, NULL);
    cr_assert_eq(rep.op, PROTO_OP_ERROR);
    cr_assert_eq(rep.u.error.code, EBUSY, "%.*s", (int)rep.u.error.msg_len, rep.u.error.msg);
    munmap(w, cap);
    raw_request(sock, &m, buf, sizeof(buf), &rep, NULL);
    cr_assert_eq(rep.op, PROTO_OP_PUBLISH + PROTO_OP_REPLY, "once unmapped it seals: %.*s",
                 (int)rep.u.error.msg_len, rep.u.error.msg);
    cr_assert_eq(fcntl(fd, F_GET_SEALS) & F_SEAL_WRITE, F_SEAL_WRITE);
    cr_assert_eq(pwrite(fd, "x", 1, 0), -1, "the producer's own O_RDWR fd cannot write");
    close(fd);
    close(sock);
    daemon_stop(&d);
}

/* A sealed buffer always carries its fd (for the seal check), and its acquire reply says
 * it will be retired (PROTO_BUF_RETIRE): libshmref unmaps it at its last local release
 * instead of caching it, and says so, so nothing stays pinned once it is retired (issue
 * 17: a cached mapping of a sealed buffer pinned its pages). */
Test(immutable, a_sealed_buffer_is_not_cached_by_libshmref)
{
    daemon_start(&d, "--memfd", NULL);
    shmref_conn *c = connect_ok(&d), *c2 = connect_ok(&d);
    shmref_buf *b, *r;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, SIZE, &b), 0);
    cr_assert_eq(shmref_publish_ex(b, SIZE, 0, 0, SHMREF_PUBLISH_SEALED, NULL, 0, &desc), 0, "%s",
                 shmref_errmsg(c));
    cr_assert_eq(shmref_acquire_ex(c2, &desc, SHMREF_ACQUIRE_SEALED, &r), 0, "%s", shmref_errmsg(c2));
    cr_assert_eq(shmref_release(r), 0);
    cr_assert_eq(shmref_acquire_ex(c2, &desc, SHMREF_ACQUIRE_SEALED, &r), 0, "again: %s", shmref_errmsg(c2));
    cr_assert_eq(shmref_release(r), 0);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_ping(c2), 0);
    cr_assert_eq(status_u64(&d, "counters.buffers_retired"), 1);
    cr_assert_eq(status_u64(&d, "pool.bytes_pinned"), 0, "c2 dropped its mapping at its release");
    shmref_close(c2);
    shmref_close(c);
    daemon_stop(&d);
}

static int keeper_up[2], keeper_down[2];
static shmref_desc keeper_desc;

/* keeper: a raw client of OTHER_UID that acquires the sealed buffer, maps it, closes its
 * connection and keeps the mapping until told to go (or its parent goes). */
static int keeper(void *arg)
{
    (void)arg;
    close(keeper_up[0]);
    close(keeper_down[1]);
    if (setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0)
        return 100;
    int sock = raw_open();
    uint64_t cap;
    int fd = raw_acquire(sock, &keeper_desc, &cap);
    if (fd < 0)
        return 101;
    volatile uint8_t *p = mmap(NULL, cap, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || p[0] != 7)
        return 102;
    close(fd);
    close(sock); /* its release and its mapping's end are the daemon's guess now */
    char c = 'k';
    if (write(keeper_up[1], &c, 1) != 1 || read(keeper_down[0], &c, 1) < 0)
        return 103;
    return p[0] == 7 ? 0 : 104;
}

/* A sealed memfd cannot be emptied: a client of another uid that keeps its mapping after
 * closing its connection stays charged for it (pinned, in the cap and its quota) until its
 * process exits, which the daemon learns from the process's pidfd. Before issue 17 the
 * charge ended with the connection while the pages lived on. */
Test(immutable, a_sealed_mapping_is_charged_until_its_process_exits)
{
    cr_assert_eq(geteuid(), 0, "another uid needs root, as in CI");
    daemon_start(&d, "--memfd", "--socket-mode", "0666", NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, SIZE, &b), 0);
    memset(shmref_buf_data(b), 7, SIZE);
    cr_assert_eq(shmref_publish_ex(b, SIZE, 0, 0, SHMREF_PUBLISH_SEALED, NULL, 0, &keeper_desc), 0, "%s",
                 shmref_errmsg(c));
    cr_assert_eq(pipe(keeper_up), 0);
    cr_assert_eq(pipe(keeper_down), 0);
    pid_t pid = child_run(keeper, NULL);
    close(keeper_up[1]);
    close(keeper_down[0]);
    char x;
    cr_assert_eq(read(keeper_up[0], &x, 1), 1, "the keeper failed: exit %d", child_wait(pid));
    cr_assert_eq(shmref_release(b), 0); /* the last handle: retired, but mapped by the keeper */
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(wait_status(&d, "counters.buffers_retired", 1, WAIT_MS), 1);
    usleep(200 * 1000);
    cr_assert_eq(status_u64(&d, "pool.bytes_pinned"), SIZE, "the keeper's connection closed, its mapping lives");
    cr_assert_eq(tenant_pinned(OTHER_UID), SIZE);
    cr_assert_eq(status_u64(&d, "pool.mappers"), 1, "one process watched");
    cr_assert_eq(write(keeper_down[1], "x", 1), 1);
    cr_assert_eq(child_wait(pid), 0, "the keeper's mapping read its bytes to the end");
    cr_assert_eq(wait_status(&d, "pool.bytes_pinned", 0, WAIT_MS), 0, "the keeper exited: nothing is pinned");
    cr_assert_eq(tenant_pinned(OTHER_UID), 0);
    cr_assert_eq(status_u64(&d, "pool.mappers"), 0);
    close(keeper_up[0]);
    close(keeper_down[1]);
    shmref_close(c);
    daemon_stop(&d);
}
