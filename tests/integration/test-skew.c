/* SPDX-License-Identifier: MIT */
/* test-skew.c: version skew (issue 25 item 8). This shmrefd serves a client of the
 * previous protocol version, spoken raw, and sends it nothing that version does not know;
 * this libshmref talks to the last shmrefd of the previous version, built from git history
 * by tests/integration/skew-previous.sh ($SHMREF_PREVIOUS_DAEMON; skipped without it). */
#include <criterion/criterion.h>

#include <errno.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "launcher.h"
#include "proto.h"
#include "rawv2.h"

#define OTHER_UID 65534

/* hello_in: a raw connection's hello in version v asking features: the reply (hello
 * reply or error) into *ret, the number of fds it carried into *ret_nfds (closed). */
static void hello_in(int fd, uint32_t v, uint64_t features, struct proto_msg *ret, unsigned *ret_nfds)
{
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 };
    int fds[8];
    m.u.hello.version = v;
    m.u.hello.features = features;
    m.u.hello.name = "skew";
    m.u.hello.name_len = 4;
    rv_send(fd, &m);
    cr_assert_gt(rv_recv_fds(fd, 5000, ret, fds, 8, ret_nfds), 0, "no answer to a hello of version %u", v);
    for (unsigned i = 0; i < *ret_nfds; i++)
        close(fds[i]);
}

#define ALL_FEATURES                                                                                      \
    (PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE | PROTO_FEAT_SEALED | PROTO_FEAT_TABLE | PROTO_FEAT_BYE | \
     PROTO_FEAT_FOREIGN | PROTO_FEAT_PRIVATE | PROTO_FEAT_RETAIN)

/* prev_connect: a raw connection of the previous version that asked every feature; it
 * gets only that version's, in a reply of that version without fds. */
static int prev_connect(const struct daemon *d)
{
    struct proto_msg r;
    unsigned nfds = 0;
    int fd = raw_connect(d);
    hello_in(fd, PROTO_VERSION_PREV, ALL_FEATURES, &r, &nfds);
    cr_assert_eq(r.op, PROTO_OP_HELLO + PROTO_OP_REPLY, "a hello of version %d: %.*s", PROTO_VERSION_PREV,
                 r.op == PROTO_OP_ERROR ? (int)r.u.error.msg_len : 0, r.op == PROTO_OP_ERROR ? r.u.error.msg : "");
    cr_assert_eq(r.u.hello_reply.version, PROTO_VERSION_PREV, "the reply speaks version %u",
                 (unsigned)r.u.hello_reply.version);
    cr_assert_eq(r.u.hello_reply.features, PROTO_FEAT_PREV, "agreed features %#llx",
                 (unsigned long long)r.u.hello_reply.features);
    cr_assert_eq(nfds, 0, "the hello reply carried %u fds (a table)", nfds);
    return fd;
}

/* acquire_flags: the flags of an acquire reply to token on a connection of the given
 * version, in a process of uid; the buffer is mapped and its first bytes compared with
 * want. The child's exit status: the flags (below 100), 101.. on failure. */
struct acq {
    const struct daemon *d;
    uint32_t version;
    uint8_t token[PROTO_TOKEN_LEN];
    uint32_t uid;
    const char *want;
};

static int acquire_child(void *arg)
{
    struct acq *a = arg;
    if (a->uid && (setgroups(0, NULL) < 0 || setgid(a->uid) < 0 || setuid(a->uid) < 0))
        return 101;
    int fd = rawclient_connect(a->d->socket);
    if (fd < 0)
        return 102;
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
    int fds[8];
    unsigned n = 0;
    m.u.hello.version = a->version;
    m.u.hello.features = a->version == PROTO_VERSION ? PROTO_FEAT_FD_ONCE | PROTO_FEAT_FOREIGN : PROTO_FEAT_FD_ONCE;
    rv_send(fd, &m);
    if (rv_recv(fd, 5000, &r) <= 0 || r.op != PROTO_OP_HELLO + PROTO_OP_REPLY)
        return 103;
    rv_acquire_send(fd, 2, a->token, 0);
    if (rv_recv_fds(fd, 5000, &r, fds, 8, &n) <= 0 || r.op != PROTO_OP_ACQUIRE + PROTO_OP_REPLY || n != 1)
        return 104;
    uint32_t flags = r.u.acquire_reply.flags;
    size_t len = strlen(a->want);
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fds[0], 0);
    if (p == MAP_FAILED || memcmp(p, a->want, len) != 0)
        return 105;
    munmap(p, len);
    close(fds[0]);
    close(fd);
    return flags < 100 ? (int)flags : 99;
}

static int acquire_flags(struct acq *a)
{
    pid_t pid = child_run(acquire_child, a);
    int st = child_wait(pid);
    cr_assert_lt(st, 100, "the acquire of a version %u client of uid %u failed (%d)", a->version, a->uid, st);
    return st;
}

/* A client of the previous version does hello, lease, publish, acquire and release with
 * this daemon, and is sent no flag of the newer one: another uid's buffer comes without
 * PROTO_BUF_FOREIGN and PROTO_BUF_RETIRE, which a client of this version is sent. */
Test(skew, a_client_of_the_previous_version_is_served, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    int fd = prev_connect(&d);
    uint8_t token[PROTO_TOKEN_LEN];
    struct proto_msg r;
    int fds[4];
    unsigned n = 0;
    rv_lease_send(fd, 2, 100000, 0);
    cr_assert_gt(rv_recv_fds(fd, 5000, &r, fds, 4, &n), 0);
    cr_assert_eq(r.op, PROTO_OP_LEASE + PROTO_OP_REPLY, "lease: op %u %.*s", r.op,
                 r.op == PROTO_OP_ERROR ? (int)r.u.error.msg_len : 0, r.op == PROTO_OP_ERROR ? r.u.error.msg : "");
    cr_assert_eq(n, 1, "the lease reply carries its fd");
    cr_assert_eq(r.u.lease_reply.flags & ~(uint32_t)PROTO_BUF_PREV, 0);
    uint64_t handle = r.u.lease_reply.handle;
    memcpy(token, r.u.lease_reply.token, PROTO_TOKEN_LEN);
    char *p = mmap(NULL, 100000, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    cr_assert_neq(p, MAP_FAILED);
    strcpy(p, "written by a version 2 client");
    munmap(p, 100000);
    close(fds[0]);
    struct proto_msg pub = { .op = PROTO_OP_PUBLISH, .id = 3 };
    pub.u.publish.handle = handle;
    pub.u.publish.size = 100000;
    pub.u.publish.keep_ms = 10000;
    rv_send(fd, &pub);
    rv_expect(fd, 5000, PROTO_OP_PUBLISH + PROTO_OP_REPLY, 3, &r, "publish");
    cr_assert_eq(memcmp(r.u.publish_reply.token, token, PROTO_TOKEN_LEN), 0);

    /* its own uid, then another uid, of the previous version: the bytes, no new flag */
    struct acq a = { .d = &d, .version = PROTO_VERSION_PREV, .uid = 0, .want = "written by a version 2 client" };
    memcpy(a.token, token, PROTO_TOKEN_LEN);
    cr_assert_eq(acquire_flags(&a), 0);
    if (geteuid() == 0) {
        a.uid = OTHER_UID;
        cr_assert_eq(acquire_flags(&a), 0, "another uid's buffer, to a client of version 2: only its flags");
        a.version = PROTO_VERSION;
        cr_assert_eq(acquire_flags(&a), PROTO_BUF_FOREIGN | PROTO_BUF_RETIRE,
                     "the same to a client of this version: foreign, and not to be cached");
    }
    struct proto_msg rel = { .op = PROTO_OP_RELEASE, .id = 4 };
    rel.u.release.handle = handle;
    rv_send(fd, &rel);
    rv_expect(fd, 5000, PROTO_OP_RELEASE + PROTO_OP_REPLY, 4, &r, "release");
    struct proto_msg ping = { .op = PROTO_OP_PING, .id = 5 };
    rv_send(fd, &ping);
    rv_expect(fd, 5000, PROTO_OP_PING + PROTO_OP_REPLY, 5, &r, "ping");
    close(fd);
    cr_assert_eq(status_u64(&d, "counters.protocol_errors"), 0);
    daemon_stop(&d);
}

/* Versions other than this one and the previous are refused, naming both. */
Test(skew, other_versions_are_refused_naming_both, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    uint32_t versions[] = { PROTO_VERSION_PREV - 1, PROTO_VERSION + 1 };
    for (unsigned i = 0; i < 2; i++) {
        struct proto_msg r;
        unsigned nfds = 0;
        char want[128];
        int fd = raw_connect(&d);
        hello_in(fd, versions[i], PROTO_FEAT_FD_ONCE, &r, &nfds);
        cr_assert_eq(r.op, PROTO_OP_ERROR, "a hello of version %u was answered", versions[i]);
        cr_assert_eq(r.u.error.code, EPROTONOSUPPORT);
        snprintf(want, sizeof(want), "protocol version %u is not supported: this shmrefd speaks version %d (and %d)",
                 versions[i], PROTO_VERSION, PROTO_VERSION_PREV);
        cr_assert(r.u.error.msg_len >= strlen(want) && memcmp(r.u.error.msg, want, strlen(want)) == 0, "%.*s",
                  (int)r.u.error.msg_len, r.u.error.msg);
        cr_assert_eq(raw_closed(fd, 5000), 1, "the connection closes");
        close(fd);
    }
    daemon_stop(&d);
}

/* previous_start: the previous version's shmrefd on a temporary socket, or a skip. */
static void previous_start(struct daemon *d)
{
    const char *bin = getenv("SHMREF_PREVIOUS_DAEMON");
    if (!bin || access(bin, X_OK) != 0)
        cr_skip_test("no shmrefd of protocol version %d ($SHMREF_PREVIOUS_DAEMON: ctest builds it, skew-previous)",
                     PROTO_VERSION_PREV);
    memset(d, 0, sizeof(*d));
    strcpy(d->dir, "/tmp/shmref-test-XXXXXX");
    cr_assert_not_null(mkdtemp(d->dir));
    snprintf(d->socket, sizeof(d->socket), "%s/shmrefd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/shmrefd.log", d->dir);
    const char *argv[] = { bin, "--socket", d->socket, "--verbose", "--pool-size", "64M", "--config", "/dev/null",
                           geteuid() == 0 ? "--user" : NULL, "root", NULL };
    cr_assert_eq(launcher_spawn(bin, (char *const *)argv, d->log, LAUNCHER_CLOSE_FDS | LAUNCHER_PDEATHSIG, &d->pid), 0);
    /* Ready when it accepts (a hello of this version would be refused before the fix). */
    for (int i = 0; i < 2000; i++) {
        int fd = rawclient_connect(d->socket);
        if (fd >= 0) {
            close(fd);
            return;
        }
        usleep(5000);
    }
    cr_assert_fail("the previous shmrefd did not listen within 10 s; see %s", d->log);
}

/* This library connects to the previous version's daemon (which refuses a hello of this
 * version and closes: the library says hello again in that version) and leases,
 * publishes, acquires and releases through it, with a stock and a second connection. */
Test(skew, the_library_talks_to_a_daemon_of_the_previous_version, .timeout = 120)
{
    struct daemon d;
    previous_start(&d);
    shmref_conn *p, *c;
    char err[PROTO_MAX_ERRMSG + 1] = "";
    int r = shmref_connect_timeout(d.socket, 10000, err, sizeof(err), &p);
    cr_assert_eq(r, 0, "connect to a daemon of protocol %d: %s", PROTO_VERSION_PREV, err);
    cr_assert_eq(shmref_connect_timeout(d.socket, 10000, err, sizeof(err), &c), 0, "%s", err);
    for (unsigned round = 0; round < 20; round++) {
        size_t size = (size_t)3 << 20;
        shmref_buf *b, *rb;
        shmref_desc desc;
        cr_assert_eq(shmref_lease(p, size, &b), 0, "lease: %s", shmref_errmsg(p));
        fill_pattern(shmref_buf_data(b), size, round);
        cr_assert_eq(shmref_publish(b, size, 0, NULL, 0, &desc), 0, "publish: %s", shmref_errmsg(p));
        cr_assert_eq(shmref_acquire(c, &desc, &rb), 0, "acquire: %s", shmref_errmsg(c));
        cr_assert_eq(check_pattern(shmref_buf_data(rb), size, round), -1, "round %u: bytes differ", round);
        /* a retain is never asked of it (it did not agree PROTO_FEAT_RETAIN) */
        cr_assert_eq(shmref_retain(c, &desc, 1000), -EOPNOTSUPP, "retain: %s", shmref_errmsg(c));
        cr_assert_eq(shmref_release(rb), 0);
        cr_assert_eq(shmref_release(b), 0);
    }
    shmref_close(c);
    shmref_close(p);
    /* Nothing it sent was beyond the previous version: the only protocol errors are the
     * three hellos of this version (two connections here, one for the status), refused. */
    cr_assert_eq(status_u64(&d, "counters.protocol_errors"), 3, "see %s", d.log);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 5000), 0, "every lease came back");
    daemon_stop(&d);
}

/* private_acquire: a raw acquire of token with PROTO_ACQUIRE_PRIVATE; the number of fds
 * its reply carried (closed). */
static unsigned private_acquire(int fd, uint32_t id, const uint8_t *token)
{
    struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = id }, r;
    memcpy(m.u.acquire.token, token, PROTO_TOKEN_LEN);
    m.u.acquire.flags = PROTO_ACQUIRE_PRIVATE;
    rv_send(fd, &m);
    int fds[4];
    unsigned n = 0;
    cr_assert_gt(rv_recv_fds(fd, 5000, &r, fds, 4, &n), 0);
    cr_assert_eq(r.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY, "acquire: op %u", r.op);
    for (unsigned i = 0; i < n; i++)
        close(fds[i]);
    return n;
}

/* PROTO_ACQUIRE_PRIVATE: on this version the fd comes again to a connection that maps the
 * buffer, and is not counted (the next plain acquire still gets none, as before it); a
 * version-2 connection's flag is ignored (fd-once: no fd). */
Test(skew, a_private_acquire_always_carries_its_fd_but_not_on_version_2, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 4096, &b), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_publish(b, 4096, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(c));

    int v3 = raw_connect(&d);
    struct proto_msg r;
    unsigned n = 0;
    hello_in(v3, PROTO_VERSION, PROTO_FEAT_FD_ONCE | PROTO_FEAT_PRIVATE, &r, &n);
    cr_assert(r.u.hello_reply.features & PROTO_FEAT_PRIVATE, "the daemon agrees PROTO_FEAT_PRIVATE");
    int fds[4];
    rv_acquire_send(v3, 2, desc.token, 0);
    cr_assert_gt(rv_recv_fds(v3, 5000, &r, fds, 4, &n), 0);
    cr_assert_eq(n, 1, "the first plain acquire carries the fd");
    close(fds[0]);
    cr_assert_eq(private_acquire(v3, 3, desc.token), 1, "a private acquire carries it again");
    cr_assert_eq(private_acquire(v3, 4, desc.token), 1, "and again");
    rv_acquire_send(v3, 5, desc.token, 0);
    cr_assert_gt(rv_recv_fds(v3, 5000, &r, fds, 4, &n), 0);
    cr_assert_eq(n, 0, "a plain acquire after them: still mapped (fd-once), none");
    close(v3);

    int v2 = prev_connect(&d);
    rv_acquire_send(v2, 2, desc.token, 0);
    cr_assert_gt(rv_recv_fds(v2, 5000, &r, fds, 4, &n), 0);
    cr_assert_eq(n, 1);
    close(fds[0]);
    cr_assert_eq(private_acquire(v2, 3, desc.token), 0, "version 2: the flag is ignored");
    close(v2);
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);
    daemon_stop(&d);
}
