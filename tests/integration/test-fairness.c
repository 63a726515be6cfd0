/* SPDX-License-Identifier: MIT */
/* test-fairness.c: no tenant can starve another through the session and transport layers
 * (issue 8): connection slots (a per-uid limit, slots reserved for root), idle
 * connections, a second hello, status privacy, fds in flight, a log pipe nobody reads,
 * refusal lines, a slow-to-close fd attached to a message. Real shmrefd, real client
 * processes of several uids (setuid children), real kernel limits. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "launcher.h"
#include "proto.h"
#include "rawclient.h"

#define WAIT_MS 5000
#define LOG_RATE_LINES_EXPECTED 10 /* daemon/log.h LOG_RATE_LINES */

TestSuite(fairness, .fini = reap_children);

static int become(uid_t uid)
{
    return setgroups(0, NULL) == 0 && setgid(uid) == 0 && setuid(uid) == 0 ? 0 : -1;
}

static size_t enc(const struct proto_msg *m, uint8_t *buf, size_t cap)
{
    int n = proto_encode(m, buf, cap);
    return n > 0 ? (size_t)n : 0;
}

static bool error_is(const uint8_t *rep, ssize_t n, int code, const char *text)
{
    struct proto_msg m;
    const char *why;
    if (n <= 0 || proto_decode(rep, (size_t)n, PROTO_MAX_REPLY, &m, &why) < 0 || m.op != PROTO_OP_ERROR)
        return false;
    return m.u.error.code == code && (!text || memmem(m.u.error.msg, m.u.error.msg_len, text, strlen(text)));
}

/* ---- a child of another uid that holds connections until told to go ---- */

struct holder {
    const char *socket;
    uid_t uid;
    int conns;          /* how many it must get */
    const char *refusal; /* the 1+conns-th is refused with EUSERS naming this (NULL: not tried) */
    int ready[2], go[2];
};

static int hold_connections(void *arg)
{
    struct holder *h = arg;
    shmref_conn *c[16] = { 0 }, *extra = NULL;
    close(h->ready[0]);
    close(h->go[1]);
    if (become(h->uid) < 0)
        return 40;
    for (int i = 0; i < h->conns; i++)
        if (shmref_connect(h->socket, &c[i]) != 0)
            return 41 + i;
    if (h->refusal) {
        if (shmref_connect(h->socket, &extra) != -EUSERS)
            return 60;
        if (!strstr(shmref_errmsg(NULL), h->refusal)) {
            fprintf(stderr, "refusal says \"%s\", not \"%s\"\n", shmref_errmsg(NULL), h->refusal);
            return 61;
        }
    }
    char x = 'r';
    if (write(h->ready[1], &x, 1) != 1 || read(h->go[0], &x, 1) != 1)
        return 62;
    for (int i = 0; i < h->conns; i++)
        if (shmref_ping(c[i]) != 0)
            return 63;
    for (int i = 0; i < h->conns; i++)
        shmref_close(c[i]);
    return 0;
}

static pid_t holder_start(struct holder *h)
{
    cr_assert_eq(pipe(h->ready), 0);
    cr_assert_eq(pipe(h->go), 0);
    pid_t pid = child_run(hold_connections, h);
    close(h->ready[1]);
    close(h->go[0]);
    char x;
    struct pollfd p = { .fd = h->ready[0], .events = POLLIN };
    cr_assert_eq(poll(&p, 1, 10000), 1, "uid %u's child is not ready", (unsigned)h->uid);
    if (read(h->ready[0], &x, 1) != 1) {
        int st = child_wait(pid);
        cr_assert_fail("uid %u's child failed: %d", (unsigned)h->uid, st);
    }
    return pid;
}

static void holder_finish(struct holder *h, pid_t pid)
{
    char x = 'g';
    cr_assert_eq(write(h->go[1], &x, 1), 1);
    cr_assert_eq(child_wait(pid), 0, "uid %u's child", (unsigned)h->uid);
    close(h->ready[0]);
    close(h->go[1]);
}

static int third_uid_refused(void *arg)
{
    const char *socket = arg;
    shmref_conn *c = NULL;
    if (become(65532) < 0)
        return 40;
    if (shmref_connect(socket, &c) != -EUSERS)
        return 41;
    return strstr(shmref_errmsg(NULL), "too many clients") ? 0 : 42;
}

Test(fairness, one_uid_cannot_take_every_slot_and_root_still_gets_in)
{
    struct daemon d;
    daemon_start(&d, "--max-clients", "6", "--max-clients-per-uid", "3", "--socket-mode", "0666", NULL);
    cr_assert_eq(wait_status(&d, "daemon.clients", 1, WAIT_MS), 1);
    struct holder a = { .socket = d.socket, .uid = 65534, .conns = 3, .refusal = "limit 3 per uid" };
    pid_t pa = holder_start(&a);
    struct holder b = { .socket = d.socket, .uid = 65533, .conns = 3 };
    pid_t pb = holder_start(&b);
    /* Six connections: a third uid is refused... */
    cr_assert_eq(child_wait(child_run(third_uid_refused, d.socket)), 0);
    /* ...root is not: its status works while every ordinary slot is taken. */
    shmref_conn *root = connect_ok(&d);
    shmref_status *st;
    cr_assert_eq(shmref_status_get(root, &st), 0, "%s", shmref_errmsg(root));
    uint64_t n = 0;
    cr_assert_eq(shmref_status_u64(st, "daemon.clients", &n), 0);
    cr_assert_eq(n, 7);
    cr_assert_eq(shmref_status_u64(st, "limits.max_clients_per_uid", &n), 0);
    cr_assert_eq(n, 3);
    shmref_status_free(st);
    holder_finish(&a, pa);
    holder_finish(&b, pb);
    cr_assert_geq(status_u64(&d, "counters.refused_limit"), 2);
    shmref_close(root);
    daemon_stop(&d);
}

Test(fairness, idle_connection_holding_nothing_is_closed)
{
    struct daemon d;
    daemon_start(&d, "--idle-timeout", "2", NULL);
    shmref_conn *idle = connect_ok(&d), *busy = connect_ok(&d), *talker = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(busy, 4096, &b), 0, "%s", shmref_errmsg(busy));
    for (int i = 0; i < 7; i++) { /* 3.5 s: the talker pings every half second */
        usleep(500 * 1000);
        cr_assert_eq(shmref_ping(talker), 0, "a connection that talks idled out: %s", shmref_errmsg(talker));
    }
    shmref_status *st;
    cr_assert_eq(shmref_status_get(talker, &st), 0, "%s", shmref_errmsg(talker));
    uint64_t n = 0;
    cr_assert_eq(shmref_status_u64(st, "daemon.clients", &n), 0);
    cr_assert_eq(n, 2, "the idle connection is still open (%llu clients)", (unsigned long long)n);
    shmref_status_free(st);
    cr_assert(daemon_log_contains(&d, "idle, holding nothing"), "no log line for the idle close");
    /* It held nothing: its next call gets a new connection (libshmref's side of it). */
    cr_assert_eq(shmref_ping(idle), 0, "%s", shmref_errmsg(idle));
    cr_assert_eq(shmref_conn_counter(idle, "reconnects", &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(shmref_ping(busy), 0, "a connection holding a lease idled out: %s", shmref_errmsg(busy));
    shmref_release(b);
    shmref_close(idle);
    shmref_close(busy);
    shmref_close(talker);
    daemon_stop(&d);
}

Test(fairness, second_hello_is_eproto_and_closes)
{
    struct daemon d;
    uint8_t buf[256], rep[1024];
    daemon_start(&d, NULL);
    int fd = raw_connect(&d);
    raw_hello(fd);
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 7 };
    m.u.hello.version = PROTO_VERSION;
    size_t len = enc(&m, buf, sizeof(buf));
    ssize_t n = raw_roundtrip(fd, buf, len, rep, sizeof(rep), WAIT_MS);
    cr_assert(error_is(rep, n, EPROTO, "hello was already said"), "no EPROTO for a second hello");
    cr_assert(raw_closed(fd, WAIT_MS), "the connection stays after a second hello");
    close(fd);
    daemon_stop(&d);
}

/* ---- status privacy ---- */

static int unprivileged_status(void *arg)
{
    const char *socket = arg;
    shmref_conn *c;
    shmref_buf *b;
    shmref_status *st;
    uint64_t v;
    if (become(65534) < 0)
        return 40;
    /* no stock: its refills (granted before or after the status, by timing) are buffers too */
    if (shmref_connect(socket, &c) != 0 || shmref_set_stock(c, 0) != 0 || shmref_lease(c, 4096, &b) != 0)
        return 41;
    if (shmref_status_get(c, &st) != 0)
        return 42;
    int nc = shmref_status_count(st, "clients"), nb = shmref_status_count(st, "buffers.list");
    int nt = shmref_status_count(st, "tenants");
    if (nc != 1 || nb != 1 || nt != 1)
        return 43;
    if (shmref_status_u64(st, "clients.0.uid", &v) != 0 || v != 65534)
        return 44;
    if (shmref_status_u64(st, "buffers.list.0.uid", &v) != 0 || v != 65534)
        return 45;
    if (shmref_status_u64(st, "tenants.0.uid", &v) != 0 || v != 65534)
        return 46;
    if (shmref_status_u64(st, "clients_total", &v) != 0 || v != 1)
        return 47;
    if (shmref_status_u64(st, "daemon.clients", &v) != 0 || v < 3) /* totals stay global */
        return 48;
    if (!shmref_status_json(st) || strstr(shmref_status_json(st), "\"uid\": 0") ||
        strstr(shmref_status_json(st), "\"uid\":0"))
        return 49;
    shmref_status_free(st);
    shmref_release(b);
    shmref_close(c);
    return 0;
}

Test(fairness, status_shows_an_unprivileged_caller_only_its_own_uid)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    shmref_conn *c = connect_ok(&d), *other = connect_ok(&d);
    shmref_buf *b, *w;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 8192, &b), 0);
    cr_assert_eq(shmref_publish(b, 8192, 0, NULL, 0, &desc), 0);
    cr_assert_eq(shmref_lease(other, 4096, &w), 0);
    cr_assert_eq(child_wait(child_run(unprivileged_status, d.socket)), 0);
    /* root still sees everyone */
    shmref_status *st;
    cr_assert_eq(shmref_status_get(c, &st), 0);
    cr_assert_geq(shmref_status_count(st, "clients"), 2);
    cr_assert_geq(shmref_status_count(st, "buffers.list"), 2);
    shmref_status_free(st);
    shmref_release(w);
    shmref_release(b);
    shmref_close(other);
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- fds in flight ---- */

/* start_with_nofile: daemon_start's daemon (same directory layout, so daemon_stop and
 * the status helpers work), with RLIMIT_NOFILE at nofile, soft and hard. */
static void start_with_nofile(struct daemon *d, rlim_t nofile)
{
    memset(d, 0, sizeof(*d));
    strcpy(d->dir, "/tmp/shmref-test-XXXXXX");
    cr_assert_not_null(mkdtemp(d->dir));
    chmod(d->dir, 0755);
    snprintf(d->socket, sizeof(d->socket), "%s/shmrefd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/shmrefd.log", d->dir);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct rlimit rl = { nofile, nofile };
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        for (int i = 3; i < 1024; i++)
            close(i);
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            _exit(126);
        execl(SHMREFD_BIN, SHMREFD_BIN, "--socket", d->socket, "--socket-mode", "0666", "--verbose", "--user", "root", (char *)NULL);
        _exit(127);
    }
    d->pid = pid;
    int st = 0;
    cr_assert_eq(launcher_wait_ready(pid, d->socket, 10000, &st), 0, "shmrefd did not start (%d); see %s", st,
                 d->log);
}

struct flooder {
    const char *socket;
    shmref_desc desc;
    uid_t uid;          /* 0: 65534 */
    int conns, per_conn;
    int ready[2], go[2];
};

/* flood_acquires: many connections pipelining acquires without reading; once told to
 * go, it reads every reply: all must come (backpressure, not closing). */
static int flood_acquires(void *arg)
{
    struct flooder *f = arg;
    int fds[64];
    uint8_t buf[256], rep[4096];
    close(f->ready[0]);
    close(f->go[1]);
    if (become(f->uid ? f->uid : 65534) < 0)
        return 40;
    struct proto_msg hello = { .op = PROTO_OP_HELLO, .id = 1 };
    hello.u.hello.version = PROTO_VERSION;
    for (int i = 0; i < f->conns; i++) {
        if ((fds[i] = rawclient_connect(f->socket)) < 0)
            return 41;
        size_t len = enc(&hello, buf, sizeof(buf));
        if (rawclient_call(fds[i], buf, len, rep, sizeof(rep), WAIT_MS) <= 0)
            return 42;
    }
    /* (Hellos first, then the floods: every connection gets its share of fds in flight.) */
    for (int i = 0; i < f->conns; i++) {
        for (int k = 0; k < f->per_conn; k++) {
            size_t len;
            struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = (uint32_t)k + 2 };
            memcpy(m.u.acquire.token, f->desc.token, PROTO_TOKEN_LEN);
            len = enc(&m, buf, sizeof(buf));
            if (send(fds[i], buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
                return 43;
        }
    }
    char x = 'r';
    if (write(f->ready[1], &x, 1) != 1 || read(f->go[0], &x, 1) != 1)
        return 44;
    for (int i = 0; i < f->conns; i++) {
        int got = 0;
        while (got < f->per_conn) {
            ssize_t n = rawclient_recv_wait(fds[i], rep, sizeof(rep), WAIT_MS);
            if (n <= 0) {
                fprintf(stderr, "connection %d: %d of %d replies, then %zd\n", i, got, f->per_conn, n);
                return 45;
            }
            struct proto_msg m;
            const char *why;
            if (proto_decode(rep, (size_t)n, sizeof(rep), &m, &why) < 0 || m.op != PROTO_OP_ACQUIRE + PROTO_OP_REPLY)
                return 46;
            got++;
        }
        close(fds[i]);
    }
    return 0;
}

static int victim_acquires(void *arg)
{
    struct flooder *f = arg;
    if (become(65533) < 0)
        return 40;
    for (int i = 0; i < 30; i++) {
        shmref_conn *c;
        shmref_buf *b;
        if (shmref_connect(f->socket, &c) != 0)
            return 41;
        shmref_set_timeout(c, 5000);
        int r = shmref_acquire(c, &f->desc, &b);
        if (r != 0) {
            fprintf(stderr, "victim's acquire %d: %s (%s)\n", i, strerror(-r), shmref_errmsg(c));
            return 42;
        }
        shmref_release(b);
        if (shmref_ping(c) != 0)
            return 43;
        shmref_close(c);
    }
    return 0;
}

Test(fairness, unread_fds_of_one_uid_neither_close_nor_starve_another, .timeout = 120)
{
    struct daemon d;
    /* The daemon's fds in flight count against its RLIMIT_NOFILE: start it with 400. */
    start_with_nofile(&d, 400);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    struct flooder f = { .socket = d.socket, .conns = 10, .per_conn = 150 };
    cr_assert_eq(shmref_lease(c, 4096, &b), 0);
    cr_assert_eq(shmref_publish(b, 4096, 0, NULL, 0, &f.desc), 0);
    cr_assert_eq(pipe(f.ready), 0);
    cr_assert_eq(pipe(f.go), 0);
    pid_t flood = child_run(flood_acquires, &f);
    close(f.ready[1]);
    close(f.go[0]);
    char x;
    cr_assert_eq(read(f.ready[0], &x, 1), 1, "the flooder failed: %d", child_wait(flood));
    usleep(500 * 1000); /* the daemon answers what it reads */
    /* 1,500 fd-carrying replies asked for, 400 allowed in flight: another uid is served. */
    cr_assert_eq(child_wait(child_run(victim_acquires, &f)), 0, "another uid was not served");
    cr_assert(!daemon_log_contains(&d, "send failed"), "the daemon closed a connection on a failed send");
    cr_assert_eq(write(f.go[1], &x, 1), 1);
    cr_assert_eq(child_wait(flood), 0, "the flooder's connections lost replies");
    cr_assert_eq(status_u64(&d, "counters.slow_clients"), 0);
    shmref_release(b);
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- logging never blocks the loop ---- */

static int refusal_storm(void *arg)
{
    const char *socket = arg;
    shmref_conn *c;
    shmref_buf *b;
    if (become(65534) < 0)
        return 40;
    if (shmref_connect(socket, &c) != 0)
        return 41;
    long end = now_ms() + 2000;
    int n = 0;
    while (now_ms() < end) {
        if (shmref_lease(c, (size_t)1 << 40, &b) != -EFBIG)
            return 42;
        n++;
    }
    shmref_close(c);
    return n > 500 ? 0 : 43;
}

/* ping_latency: pings over c for ms; the slowest, or -1 when one failed. */
static long ping_latency(shmref_conn *c, int ms)
{
    long worst = 0, end = now_ms() + ms;
    while (now_ms() < end) {
        long t = now_ms();
        if (shmref_ping(c) != 0)
            return -1;
        if (now_ms() - t > worst)
            worst = now_ms() - t;
        usleep(10 * 1000);
    }
    return worst;
}

Test(fairness, a_log_pipe_nobody_reads_does_not_stall_the_daemon, .timeout = 120)
{
    char dir[] = "/tmp/shmref-test-XXXXXX", sock[128], path[64];
    cr_assert_not_null(mkdtemp(dir));
    chmod(dir, 0755);
    snprintf(sock, sizeof(sock), "%s/s.sock", dir);
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        dup2(p[1], STDERR_FILENO);
        execl(SHMREFD_BIN, SHMREFD_BIN, "--socket", sock, "--socket-mode", "0666", "--verbose", "--user", "root", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    cr_assert_eq(launcher_wait_ready(pid, sock, 10000, &st), 0, "shmrefd did not start (%d)", st);
    /* Fill the pipe through a file description of our own (non-blocking), as a reader
     * that stopped reading would leave it. */
    snprintf(path, sizeof(path), "/proc/self/fd/%d", p[1]);
    int w = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    cr_assert_geq(w, 0);
    static char junk[4096];
    memset(junk, 'j', sizeof(junk));
    while (write(w, junk, sizeof(junk)) > 0)
        ;
    while (write(w, junk, 1) > 0)
        ;
    cr_assert_eq(errno, EAGAIN);
    close(w);

    shmref_conn *c = NULL;
    cr_assert_eq(shmref_connect(sock, &c), 0);
    shmref_set_timeout(c, 3000);
    pid_t storm = child_run(refusal_storm, sock);
    long worst = ping_latency(c, 2500);
    cr_assert_eq(child_wait(storm), 0, "the refusal storm did not run");
    cr_assert_geq(worst, 0, "a ping failed while the log pipe was full: %s", shmref_errmsg(c));
    cr_assert_lt(worst, 1000, "a ping took %ld ms while the log pipe was full", worst);

    /* Read the pipe now: what waited comes out, rate-limited, with the suppressed count. */
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    static char out[1 << 20];
    size_t got = 0;
    long end = now_ms() + 4000;
    while (now_ms() < end && !memmem(out, got, "suppressed", 10)) {
        ssize_t n = read(p[0], out + got, sizeof(out) - 1 - got);
        if (n > 0)
            got += (size_t)n;
        else
            usleep(20 * 1000);
    }
    cr_assert(memmem(out, got, "suppressed", 10), "no suppressed-lines line came out of the pipe");
    shmref_close(c);
    cr_assert_eq(launcher_stop(pid, 10000, &st), 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
    close(p[0]);
    close(p[1]);
    unlink(sock);
    rmdir(dir);
}

static int count_lines(const char *file, const char *text)
{
    FILE *f = fopen(file, "r");
    char line[2048];
    int n = 0;
    while (f && fgets(line, sizeof(line), f))
        n += strstr(line, text) != NULL;
    if (f)
        fclose(f);
    return n;
}

Test(fairness, refusal_lines_are_rate_limited_per_client)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d), *calm = connect_ok(&d);
    shmref_buf *b;
    long t0 = now_ms();
    for (int i = 0; i < 2000; i++)
        cr_assert_eq(shmref_lease(c, (size_t)1 << 40, &b), -EFBIG);
    long secs = (now_ms() - t0) / 1000 + 1;
    cr_assert_eq(shmref_lease(calm, (size_t)1 << 40, &b), -EFBIG, "the other client's refusal");
    shmref_close(c);
    cr_assert_eq(shmref_ping(calm), 0);
    int lines = count_lines(d.log, "refused lease for client");
    cr_assert_leq(lines, LOG_RATE_LINES_EXPECTED * (secs + 1) + 1, "%d refusal lines in %ld s", lines, secs);
    cr_assert_geq(lines, 2, "the calm client's refusal was not logged");
    long end = now_ms() + 3000; /* the flooder's close is seen asynchronously */
    while (!count_lines(d.log, "suppressed") && now_ms() < end)
        usleep(10 * 1000);
    cr_assert_gt(count_lines(d.log, "suppressed"), 0, "no line counts the suppressed ones");
    shmref_close(calm);
    daemon_stop(&d);
}

/* ---- a slow-to-close fd attached to a message ---- */

Test(fairness, a_lingering_socket_sent_to_the_daemon_stalls_nobody, .timeout = 60)
{
    struct daemon d;
    uint8_t buf[256], rep[1024];
    daemon_start(&d, NULL);
    /* A TCP connection whose peer never reads, with unsent data and SO_LINGER 5 s: its
     * last close waits up to 5 s. */
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), small = 4096;
    cr_assert_geq(l, 0);
    setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(l, 1), 0);
    cr_assert_eq(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
    int t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(t, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    cr_assert_eq(connect(t, (struct sockaddr *)&sa, sizeof(sa)), 0);
    int peer = accept(l, NULL, NULL);
    cr_assert_geq(peer, 0);
    fcntl(t, F_SETFL, O_NONBLOCK);
    static char junk[65536];
    long end = now_ms() + 2000;
    while (now_ms() < end && (send(t, junk, sizeof(junk), MSG_NOSIGNAL) > 0 || errno != EAGAIN))
        ;
    struct linger lg = { .l_onoff = 1, .l_linger = 5 };
    cr_assert_eq(setsockopt(t, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);

    shmref_conn *c = connect_ok(&d);
    shmref_set_timeout(c, 3000);
    int fd = raw_connect(&d);
    raw_hello(fd);
    struct proto_msg ping = { .op = PROTO_OP_PING, .id = 5 };
    size_t len = enc(&ping, buf, sizeof(buf));
    /* The daemon's copy must be the last one: it is stopped until ours is closed. */
    cr_assert_eq(kill(d.pid, SIGSTOP), 0);
    cr_assert_eq(rawclient_send_fds(fd, buf, len, &t, 1), 0);
    long t0 = now_ms();
    close(t); /* the message holds a reference: this close does not wait */
    cr_assert_lt(now_ms() - t0, 1000, "the test's own close lingered");
    cr_assert_eq(kill(d.pid, SIGCONT), 0);
    long worst = ping_latency(c, 1500);
    cr_assert_geq(worst, 0, "a ping failed: %s", shmref_errmsg(c));
    cr_assert_lt(worst, 1000, "a ping took %ld ms while the daemon closed a lingering socket", worst);
    ssize_t n = rawclient_recv_wait(fd, rep, sizeof(rep), WAIT_MS);
    cr_assert(error_is(rep, n, EPROTO, "file descriptors"), "no EPROTO for the attached fd");
    cr_assert(raw_closed(fd, WAIT_MS));
    close(fd);
    close(peer); /* ends the linger */
    close(l);
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- the buffer fd budget, shared between tenants ---- */

struct leaser {
    const char *socket;
    uid_t uid;
    int want;        /* leases that must succeed (0: lease until refused) */
    int got;
};

static int lease_many_small(void *arg)
{
    struct leaser *l = arg;
    shmref_conn *c;
    shmref_buf *b;
    if (become(l->uid) < 0)
        return 40;
    if (shmref_connect(l->socket, &c) != 0)
        return 41;
    int n = 0, r;
    while ((r = shmref_lease(c, 1, &b)) == 0 && n < 5000)
        n++;
    if (l->want && n < l->want) {
        fprintf(stderr, "uid %u got %d leases of %d: %s\n", (unsigned)l->uid, n, l->want, shmref_errmsg(c));
        return 42;
    }
    if (!l->want && (r != -EMFILE || !strstr(shmref_errmsg(c), "share"))) {
        fprintf(stderr, "uid %u: %d leases, then %d (%s)\n", (unsigned)l->uid, n, r, shmref_errmsg(c));
        return 43;
    }
    shmref_close(c);
    return 0;
}

static int greedy_then_hold(void *arg)
{
    struct holder *h = arg; /* conns unused: the pipes say when to let go */
    shmref_conn *c;
    shmref_buf *b;
    close(h->ready[0]);
    close(h->go[1]);
    if (become(h->uid) < 0)
        return 40;
    if (shmref_connect(h->socket, &c) != 0)
        return 41;
    int n = 0, r;
    while ((r = shmref_lease(c, 1, &b)) == 0 && n < 5000)
        n++;
    if (r != -EMFILE || !strstr(shmref_errmsg(c), "share")) {
        fprintf(stderr, "greedy uid: %d leases, then %d (%s)\n", n, r, shmref_errmsg(c));
        return 42;
    }
    char x = 'r';
    if (write(h->ready[1], &x, 1) != 1 || read(h->go[0], &x, 1) != 1)
        return 43;
    shmref_close(c);
    return 0;
}

Test(fairness, one_uid_cannot_take_every_buffer_fd, .timeout = 120)
{
    struct daemon d;
    start_with_nofile(&d, 400); /* an fd budget of 236: one uid may hold 118 */
    struct holder greedy = { .socket = d.socket, .uid = 65534 };
    cr_assert_eq(pipe(greedy.ready), 0);
    cr_assert_eq(pipe(greedy.go), 0);
    pid_t pg = child_run(greedy_then_hold, &greedy);
    close(greedy.ready[1]);
    close(greedy.go[0]);
    char x;
    cr_assert_eq(read(greedy.ready[0], &x, 1), 1, "the greedy uid failed: %d", child_wait(pg));
    struct leaser other = { .socket = d.socket, .uid = 65533, .want = 100 };
    cr_assert_eq(child_wait(child_run(lease_many_small, &other)), 0, "another uid found the fd budget taken");
    x = 'g';
    cr_assert_eq(write(greedy.go[1], &x, 1), 1);
    cr_assert_eq(child_wait(pg), 0);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, WAIT_MS), 0);
    daemon_stop(&d);
}

static int victim_waits(void *arg)
{
    struct flooder *f = arg;
    shmref_conn *c;
    shmref_buf *b;
    if (become(65528) < 0)
        return 40;
    if (shmref_connect(f->socket, &c) != 0)
        return 41;
    shmref_set_timeout(c, 20000);
    int r = shmref_acquire(c, &f->desc, &b);
    if (r != 0) {
        fprintf(stderr, "the waiting victim's acquire: %s (%s)\n", strerror(-r), shmref_errmsg(c));
        return 42;
    }
    shmref_release(b);
    shmref_close(c);
    return 0;
}

Test(fairness, fds_in_flight_at_the_kernel_limit_wait_and_close_nobody, .timeout = 120)
{
    struct daemon d;
    start_with_nofile(&d, 400); /* 100 unread per uid: six uids would pass the kernel's 400 */
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 4096, &b), 0);
    cr_assert_eq(shmref_publish(b, 4096, 0, NULL, 0, &desc), 0);
    struct flooder f[6];
    pid_t pids[6];
    for (int i = 0; i < 6; i++) {
        f[i] = (struct flooder){ .socket = d.socket, .desc = desc, .uid = (uid_t)(65529 + i), .conns = 2,
                                 .per_conn = 120 };
        cr_assert_eq(pipe(f[i].ready), 0);
        cr_assert_eq(pipe(f[i].go), 0);
        pids[i] = child_run(flood_acquires, &f[i]);
        close(f[i].ready[1]);
        close(f[i].go[0]);
        char x;
        cr_assert_eq(read(f[i].ready[0], &x, 1), 1, "flooder %d failed: %d", i, child_wait(pids[i]));
    }
    usleep(500 * 1000);
    /* the daemon's budget (half of RLIMIT_NOFILE, nothing past three quarters) keeps it
     * below the kernel's limit: the flooders' replies wait, nobody meets ETOOMANYREFS */
    uint64_t inflight = status_u64(&d, "daemon.fds_in_flight");
    cr_assert_geq(inflight, 190, "only %llu fds in flight: the test tests nothing", (unsigned long long)inflight);
    cr_assert_leq(inflight, 300, "%llu fds in flight past the daemon's bound", (unsigned long long)inflight);
    cr_assert(!daemon_log_contains(&d, "ETOOMANYREFS"), "the daemon reached the kernel's limit");
    struct flooder v = { .socket = d.socket, .desc = desc };
    pid_t victim = child_run(victim_waits, &v);
    usleep(300 * 1000);
    for (int i = 0; i < 6; i++) { /* the flooders read: fds drain, the victim's reply goes */
        char x = 'g';
        cr_assert_eq(write(f[i].go[1], &x, 1), 1);
    }
    for (int i = 0; i < 6; i++)
        cr_assert_eq(child_wait(pids[i]), 0, "flooder %d lost replies", i);
    cr_assert_eq(child_wait(victim), 0, "the victim was not served once the fds drained");
    cr_assert(!daemon_log_contains(&d, "send failed"), "the daemon closed a connection on a failed send");
    cr_assert_eq(status_u64(&d, "counters.slow_clients"), 0);
    shmref_release(b);
    shmref_close(c);
    daemon_stop(&d);
}
