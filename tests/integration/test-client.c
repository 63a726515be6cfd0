/* SPDX-License-Identifier: MIT */
/* test-client.c: libshmref's own robustness against a real shmrefd: every blocking call
 * is bounded by the connection's timeout (stopped daemon, connect, the environment
 * default), a dead or absent daemon is an error at once, and a connection used in a
 * forked child refuses with -ECHILD without touching the parent's socket. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* Every child killed after each test: one that fails while its daemon is stopped (SIGSTOP)
 * must not leave it so (the launcher's parent-death SIGTERM waits for a SIGCONT that never
 * comes: two such daemons were found stopped hours after failed runs). */
TestSuite(client, .fini = reap_children);

/* published: a lease of n bytes filled with a pattern, published (kept by the lease). */
static shmref_buf *published(shmref_conn *c, size_t n, uint32_t seed, shmref_desc *ret)
{
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, n, &b), 0, "%s", shmref_errmsg(c));
    fill_pattern(shmref_buf_data(b), n, seed);
    cr_assert_eq(shmref_publish(b, n, 0, NULL, 0, ret), 0, "%s", shmref_errmsg(c));
    return b;
}

/* stopped: SIGSTOP the daemon (resumed by resume()). */
static void stopped(const struct daemon *d) { cr_assert_eq(kill(d->pid, SIGSTOP), 0); }
static void resume(const struct daemon *d) { cr_assert_eq(kill(d->pid, SIGCONT), 0); }

Test(client, stopped_daemon_times_out_naming_the_operation)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d);
    /* The acquire is another connection's, which does not map the buffer: it must ask the
     * daemon (the publishing connection may take its publish in the uid's table). */
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(shmref_set_timeout(c, 300), 0);
    cr_assert_eq(shmref_get_timeout(c), 300);
    shmref_desc desc;
    shmref_buf *b = published(p, 4096, 7, &desc);
    stopped(&d);
    shmref_buf *a = NULL;
    long t0 = now_ms();
    int r = shmref_acquire(c, &desc, &a);
    long took = now_ms() - t0;
    cr_assert_eq(r, -ETIMEDOUT, "%d: %s", r, shmref_errmsg(c));
    /* The acquire's deadline covers the wait for a publish it asks of the daemon (300 ms
     * by default here: the timeout is shorter than 2 s). */
    cr_assert_str_eq(shmref_errmsg(c), "acquire: no answer from shmrefd within 600 ms (the 300 ms timeout "
                     "and the 300 ms the daemon may wait)");
    cr_assert(took >= 590 && took < 3000, "took %ld ms", took);
    /* Whatever comes later on this connection would be out of step: it is abandoned. */
    cr_assert_eq(shmref_ping(c), -ENOTCONN);
    cr_assert(strstr(shmref_errmsg(c), "abandoned after acquire timed out"), "%s", shmref_errmsg(c));
    cr_assert_eq(check_pattern(shmref_buf_data(b), 4096, 7), -1); /* mapped memory stays */
    resume(&d);
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

Test(client, environment_sets_the_default_timeout)
{
    struct daemon d;
    daemon_start(&d, NULL);
    setenv("SHMREF_TIMEOUT_MS", "250", 1);
    shmref_conn *c = connect_ok(&d);
    unsetenv("SHMREF_TIMEOUT_MS");
    cr_assert_eq(shmref_get_timeout(c), 250);
    stopped(&d);
    long t0 = now_ms();
    cr_assert_eq(shmref_ping(c), -ETIMEDOUT);
    cr_assert_lt(now_ms() - t0, 3000);
    cr_assert(strstr(shmref_errmsg(c), "ping: no answer from shmrefd within 250 ms"), "%s", shmref_errmsg(c));
    resume(&d);
    shmref_close(c);

    setenv("SHMREF_TIMEOUT_MS", "not a number", 1); /* ignored: the built-in default */
    c = connect_ok(&d);
    unsetenv("SHMREF_TIMEOUT_MS");
    cr_assert_eq(shmref_get_timeout(c), SHMREF_TIMEOUT_DEFAULT_MS);
    cr_assert_eq(shmref_set_timeout(c, 0), 0);      /* 0: no limit */
    cr_assert_eq(shmref_get_timeout(c), 0);
    cr_assert_eq(shmref_set_timeout(c, -2), -EINVAL);
    cr_assert_eq(shmref_ping(c), 0);
    shmref_close(c);
    daemon_stop(&d);
}

Test(client, connect_to_a_stopped_daemon_times_out_with_the_socket_path)
{
    struct daemon d;
    daemon_start(&d, NULL);
    stopped(&d);
    char msg[512] = "";
    shmref_conn *c = NULL;
    long t0 = now_ms();
    int r = shmref_connect_timeout(d.socket, 300, msg, sizeof(msg), &c);
    cr_assert_eq(r, -ETIMEDOUT, "%d: %s", r, msg);
    cr_assert_null(c);
    cr_assert_lt(now_ms() - t0, 3000);
    cr_assert(strstr(msg, d.socket) && strstr(msg, "300 ms"), "%s", msg);
    resume(&d);
    daemon_stop(&d);
}

Test(client, absent_daemon_fails_at_once_with_the_socket_path)
{
    char msg[512] = "";
    shmref_conn *c = NULL;
    const char *path = "/tmp/shmref-test-no-such-dir/shmrefd.sock";
    long t0 = now_ms();
    cr_assert_eq(shmref_connect_timeout(path, 5000, msg, sizeof(msg), &c), -ENOENT);
    cr_assert_lt(now_ms() - t0, 500);
    cr_assert_str_eq(msg, "cannot connect to shmrefd at /tmp/shmref-test-no-such-dir/shmrefd.sock: "
                          "No such file or directory (is shmrefd running?)");
    cr_assert_eq(shmref_connect(path, &c), -ENOENT); /* the plain call: same rule, code only */
    cr_assert_eq(shmref_connect_timeout(path, -2, msg, sizeof(msg), &c), -EINVAL);
}

Test(client, killed_daemon_is_an_error_not_a_hang)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    /* Another connection, which does not map the buffer: its acquire must ask the daemon.
     * The publishing connection maps it and may take it in the uid's table with no daemon
     * at all (the fresh-clone CI run raced into that: the daemon had joined the publish to
     * the table before the kill). */
    shmref_conn *other = connect_ok(&d);
    shmref_desc desc;
    shmref_buf *b = published(c, 1 << 20, 3, &desc);
    cr_assert_eq(kill(d.pid, SIGKILL), 0);
    int st;
    cr_assert_eq(waitpid(d.pid, &st, 0), d.pid);
    long t0 = now_ms();
    shmref_buf *a;
    cr_assert_eq(shmref_acquire(other, &desc, &a), -ECONNRESET);
    cr_assert_str_eq(shmref_errmsg(other), "shmrefd closed the connection");
    cr_assert_lt(now_ms() - t0, 1000);
    cr_assert_eq(check_pattern(shmref_buf_data(b), 1 << 20, 3), -1);
    shmref_close(other);
    shmref_close(c);
    unlink(d.log);
    unlink(d.socket);
    rmdir(d.dir);
}

/* In the child: the inherited connection sends nothing on the parent's socket; the
 * child's first call makes its own connection to the same socket. */
struct forked {
    shmref_conn *c;
    shmref_buf *lease, *acq;
    shmref_desc desc;
    const char *socket;
};

static int child_uses_parent_connection(void *arg)
{
    struct forked *f = arg;
    int parent = shmref_conn_pid(f->c);
    if (check_pattern(shmref_buf_data(f->acq), 65536, 9) != -1) /* inherited mappings are readable */
        return 12;
    if (shmref_release(f->acq) != 0) /* frees the child's copy only */
        return 13;
    if (check_pattern(shmref_buf_data(f->lease), 65536, 9) != -1)
        return 14;
    if (shmref_ping(f->c) != 0 || shmref_conn_pid(f->c) == parent || shmref_conn_pid(f->c) != (int)getpid())
        return 10;
    shmref_buf *b, *l;
    if (shmref_acquire(f->c, &f->desc, &b) != 0 || check_pattern(shmref_buf_data(b), 65536, 9) != -1 ||
        shmref_lease(f->c, 10, &l) != 0)
        return 11;
    shmref_desc d2;
    if (shmref_publish(f->lease, 10, 0, NULL, 0, &d2) >= 0) /* the parent's lease is not the child's */
        return 17;
    const void *lease_data = shmref_buf_data(f->lease);
    shmref_close(f->c); /* the child's own connection; the inherited mappings stay */
    if (check_pattern(lease_data, 65536, 9) != -1)
        return 15;
    return 0;
}

Test(client, forked_child_gets_its_own_connection_and_the_parent_keeps_its)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct forked f = { .socket = d.socket };
    f.c = connect_ok(&d);
    f.lease = published(f.c, 65536, 9, &f.desc);
    cr_assert_eq(shmref_acquire(f.c, &f.desc, &f.acq), 0);
    cr_assert_eq(shmref_ping(f.c), 0);
    uint64_t leases = status_u64(&d, "buffers.leases");
    pid_t pid = child_run(child_uses_parent_connection, &f);
    cr_assert_eq(child_wait(pid), 0);
    /* The child's release and close reached nothing of the parent's: it still holds both. */
    cr_assert_eq(shmref_ping(f.c), 0);
    cr_assert_eq(status_u64(&d, "buffers.leases"), leases);
    shmref_buf *again;
    cr_assert_eq(shmref_acquire(f.c, &f.desc, &again), 0, "%s", shmref_errmsg(f.c));
    cr_assert_eq(check_pattern(shmref_buf_data(again), 65536, 9), -1);
    cr_assert_eq(shmref_conn_pid(f.c), (int)getpid());
    shmref_close(f.c);
    daemon_stop(&d);
}

/* ---- a reply whose fd cannot be received (the process at its RLIMIT_NOFILE) ---- */

struct at_limit {
    const char *socket;
    shmref_desc desc;
};

/* fill_fds: dup until EMFILE; returns how many, their numbers in fds. */
static int fill_fds(int *fds, int cap)
{
    int n = 0;
    while (n < cap && (fds[n] = dup(0)) >= 0)
        n++;
    return errno == EMFILE ? n : -1;
}

static int leases_at_fd_limit(void *arg)
{
    struct at_limit *a = arg;
    static int fds[256];
    shmref_conn *c;
    shmref_buf *b, *acq;
    shmref_status *st;
    uint64_t leases = 0;
    struct rlimit rl = { 64, 64 };
    if (shmref_connect(a->socket, &c) != 0 || setrlimit(RLIMIT_NOFILE, &rl) < 0)
        return 40;
    int n = fill_fds(fds, 256);
    if (n < 1)
        return 41;
    for (int i = 0; i < 16; i++) { /* every one refused, none left charged */
        int r = shmref_lease(c, 4096, &b);
        if (r != -EMFILE || !strstr(shmref_errmsg(c), "open-file limit")) {
            fprintf(stderr, "lease at the fd limit: %d (%s)\n", r, shmref_errmsg(c));
            return 42;
        }
    }
    if (shmref_acquire(c, &a->desc, &acq) != -EMFILE)
        return 43;
    if (shmref_status_get(c, &st) != 0)
        return 44;
    shmref_status_u64(st, "buffers.leases", &leases);
    shmref_status_free(st);
    if (leases != 1) { /* the publisher's only */
        fprintf(stderr, "%llu leases held after the refusals\n", (unsigned long long)leases);
        return 45;
    }
    close(fds[--n]); /* room for one fd: the next calls work */
    if (shmref_lease(c, 4096, &b) != 0) {
        fprintf(stderr, "lease after freeing an fd: %s\n", shmref_errmsg(c));
        return 46;
    }
    if (shmref_acquire(c, &a->desc, &acq) != 0) { /* the same buffer, same connection */
        fprintf(stderr, "acquire after freeing an fd: %s\n", shmref_errmsg(c));
        return 47;
    }
    if (check_pattern(shmref_buf_data(acq), 65536, 3) != -1)
        return 48;
    shmref_release(acq);
    shmref_release(b);
    shmref_close(c);
    return 0;
}

Test(client, a_reply_fd_that_does_not_fit_is_emfile_and_leaks_no_lease)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d);
    struct at_limit a = { .socket = d.socket };
    shmref_buf *pub = published(p, 65536, 3, &a.desc);
    cr_assert_eq(child_wait(child_run(leases_at_fd_limit, &a)), 0);
    cr_assert_eq(wait_status(&d, "buffers.leases", 1, 5000), 1);
    shmref_release(pub);
    shmref_close(p);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    daemon_stop(&d);
}

/* idle_closed: waits (by the daemon's state, not by guessing a time) until the daemon has
 * closed idle connections, so that `left` remain (the status probe's own counted). */
static void idle_closed(const struct daemon *d, uint64_t left)
{
    cr_assert_eq(wait_status(d, "daemon.clients", left, 10000), left, "the idle connection was not closed");
    cr_assert(daemon_log_contains(d, "idle, holding nothing"), "no log line for the idle close");
}

Test(client, a_connection_closed_for_idleness_reconnects_at_its_next_call)
{
    struct daemon d;
    daemon_start(&d, "--idle-timeout", "1", NULL);
    shmref_conn *c = connect_ok(&d), *other = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(c, 0), 0); /* holds nothing between calls */
    int fd = shmref_conn_fd(c);
    shmref_buf *b, *a;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 65536, &b), 0, "%s", shmref_errmsg(c));
    shmref_release(b); /* its mapping stays cached, idle: the new connection sends its fd again */
    shmref_close(other);
    idle_closed(&d, 1);
    /* The first call after the close finds out by its request: sent again on a new
     * connection, to the same socket, with nothing to show for it but the counter. */
    int r = shmref_lease(c, 65536, &b);
    cr_assert_eq(r, 0, "lease after an idle close: %d %s", r, shmref_errmsg(c));
    fill_pattern(shmref_buf_data(b), 65536, 11);
    cr_assert_eq(shmref_publish(b, 65536, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(c));
    other = connect_ok(&d);
    cr_assert_eq(shmref_acquire(other, &desc, &a), 0, "%s", shmref_errmsg(other));
    cr_assert_eq(check_pattern(shmref_buf_data(a), 65536, 11), -1);
    shmref_release(a);
    shmref_release(b);
    uint64_t n = 0;
    cr_assert_eq(shmref_conn_counter(c, "reconnects", &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(shmref_conn_fd(c), fd, "the socket's fd number changed");
    /* Again, for an acquire and a ping. */
    cr_assert_eq(shmref_lease(other, 4096, &b), 0, "%s", shmref_errmsg(other));
    fill_pattern(shmref_buf_data(b), 4096, 12);
    cr_assert_eq(shmref_publish(b, 4096, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(other));
    idle_closed(&d, 2); /* other holds b */;
    cr_assert_eq(shmref_acquire(c, &desc, &a), 0, "acquire after an idle close: %s", shmref_errmsg(c));
    cr_assert_eq(check_pattern(shmref_buf_data(a), 4096, 12), -1);
    shmref_release(a);
    shmref_release(b);
    shmref_close(other);
    idle_closed(&d, 1);
    cr_assert_eq(shmref_ping(c), 0, "ping after an idle close: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_conn_counter(c, "reconnects", &n), 0);
    cr_assert_eq(n, 3);
    /* The event-loop face: a submit finds out at shmref_complete, under the same fd. */
    idle_closed(&d, 1);
    cr_assert_eq(shmref_ping_submit(c, &d), 0, "%s", shmref_errmsg(c));
    shmref_completion done = { 0 };
    int got = 0;
    for (long until = now_ms() + 5000; got == 0 && now_ms() < until;) {
        struct pollfd pf = { .fd = shmref_conn_fd(c), .events = POLLIN };
        poll(&pf, 1, 100);
        cr_assert_geq(got = shmref_complete(c, &done, 1), 0, "%s", shmref_errmsg(c));
    }
    cr_assert_eq(got, 1);
    cr_assert_eq(done.result, 0, "%s", done.errmsg);
    cr_assert_eq(done.user, &d);
    cr_assert_eq(shmref_conn_fd(c), fd);
    cr_assert_eq(shmref_conn_counter(c, "reconnects", &n), 0);
    cr_assert_eq(n, 4);
    /* With no daemon left to connect to, the call fails saying both things. */
    idle_closed(&d, 1);
    daemon_stop(&d);
    int r2 = shmref_ping(c);
    cr_assert(r2 == -ENOENT || r2 == -ECONNREFUSED, "%d: %s", r2, shmref_errmsg(c));
    cr_assert(strstr(shmref_errmsg(c), "idle for") && strstr(shmref_errmsg(c), "a new connection failed: cannot "
              "connect to shmrefd at"), "%s", shmref_errmsg(c));
    shmref_close(c);
}

Test(client, the_connection_says_which_socket_it_reached)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    char got[256], small[4];
    cr_assert_eq(shmref_conn_socket(c, got, sizeof(got)), (int)strlen(d.socket));
    cr_assert_str_eq(got, d.socket);
    cr_assert_eq(shmref_conn_socket(c, small, sizeof(small)), -ERANGE);
    cr_assert_eq(shmref_conn_socket(NULL, got, sizeof(got)), -EINVAL);
    shmref_close(c);
    daemon_stop(&d);
}
