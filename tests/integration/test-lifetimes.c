/* SPDX-License-Identifier: MIT */
/* test-lifetimes: libshmref's lifetimes through real processes and a real shmrefd (issue
 * 16 items 1-4, issue 17 item 5): a handle an outstanding request refers to stays valid
 * until it completes (release during a sealed publish); a forked child reads what it
 * inherited after releasing it, gets its own connection, and leaves the parent's alone,
 * and may drop what it inherited after closing the connection (as an at-fork hook does);
 * the request table and the send queue are bounded (2,000,000 submits to a stopped
 * daemon); shmref_close never waits for a stopped daemon; lookups scale (200,000 local
 * re-acquires); the daemon's credentials are checked at connect and every fd it sends is
 * checked before it is mapped (a fake daemon, written here, lies about both). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "proto.h"
#include "rawclient.h"

TestSuite(lifetimes, .fini = reap_children);

/* collect: poll conn until `want` completions arrived (5 s at most). */
static int collect(shmref_conn *c, shmref_completion *out, int want)
{
    int got = 0;
    long deadline = now_ms() + 5000;
    while (got < want && now_ms() < deadline) {
        int ev = shmref_conn_events(c);
        cr_assert_geq(ev, 0);
        if (!(ev & SHMREF_READY)) {
            struct pollfd p = { .fd = shmref_conn_fd(c), .events = POLLIN };
            poll(&p, 1, 100);
        }
        int n = shmref_complete(c, out + got, (size_t)(want - got));
        if (n < 0)
            return n;
        got += n;
    }
    return got;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    cr_assert_not_null(f);
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

Test(lifetimes, release_during_a_sealed_publish_is_deferred_until_it_completes, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--memfd", NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    for (int round = 0; round < 20; round++) {
        shmref_buf *b;
        cr_assert_eq(shmref_lease(p, 8192, &b), 0, "%s", shmref_errmsg(p));
        fill_pattern(shmref_buf_data(b), 8192, (uint32_t)round + 1);
        int tag;
        cr_assert_eq(shmref_publish_submit(b, 8192, 5000, 0, SHMREF_PUBLISH_SEALED, NULL, 0, &tag), 0, "%s",
                     shmref_errmsg(p));
        /* allowed by the header: the handle goes, the publish in flight keeps it valid */
        cr_assert_eq(shmref_release(b), 0, "%s", shmref_errmsg(p));
        shmref_completion v;
        cr_assert_eq(collect(p, &v, 1), 1);
        cr_assert_eq(v.user, &tag);
        cr_assert_eq(v.op, SHMREF_OP_PUBLISH);
        cr_assert_eq(v.result, 0, "%s", v.errmsg);
        cr_assert_null(v.buf, "the handle was released meanwhile: the completion does not hand it back");
        cr_assert_eq(v.desc.size, 8192);
        /* the publish held: another process's connection reads it, sealed */
        shmref_buf *r;
        cr_assert_eq(shmref_acquire_ex(c, &v.desc, SHMREF_ACQUIRE_SEALED, &r), 0, "%s", shmref_errmsg(c));
        cr_assert_eq(check_pattern(shmref_buf_data(r), 8192, (uint32_t)round + 1), -1);
        cr_assert_eq(shmref_release(r), 0);
    }
    /* and once more with close instead of complete: nothing leaks, nothing is touched */
    shmref_buf *b;
    cr_assert_eq(shmref_lease(p, 8192, &b), 0);
    cr_assert_eq(shmref_publish_submit(b, 100, 0, 0, SHMREF_PUBLISH_SEALED, NULL, 0, NULL), 0);
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(p);
    shmref_close(c);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 5000), 0, "nothing held after both closed");
    daemon_stop(&d);
}

/* A read-only handle of one's own buffer gets a PROT_READ view of the writable mapping;
 * the view is gone before that buffer, recycled to this process, is published sealed
 * (a view made from a writable mapping still counts for F_SEAL_WRITE). */
Test(lifetimes, a_read_only_view_never_blocks_sealing_the_recycled_buffer, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--memfd", NULL);
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(c, 0), 0);
    for (int round = 0; round < 20; round++) {
        shmref_buf *b, *r;
        shmref_desc desc;
        cr_assert_eq(shmref_lease(c, 4096, &b), 0, "%s", shmref_errmsg(c));
        fill_pattern(shmref_buf_data(b), 4096, (uint32_t)round + 1);
        cr_assert_eq(shmref_publish(b, 4096, 0, NULL, 0, &desc), 0);
        cr_assert_eq(shmref_acquire(c, &desc, &r), 0, "%s", shmref_errmsg(c));
        cr_assert_neq(shmref_buf_data(r), shmref_buf_data(b), "a read-only handle has its own view");
        cr_assert_eq(check_pattern(shmref_buf_data(r), 4096, (uint32_t)round + 1), -1);
        cr_assert_eq(shmref_release(r), 0);
        cr_assert_eq(shmref_release(b), 0);
        /* the same buffer comes back (recycled), and is sealed */
        cr_assert_eq(shmref_lease(c, 4096, &b), 0);
        fill_pattern(shmref_buf_data(b), 4096, 99);
        cr_assert_eq(shmref_publish_ex(b, 4096, 0, 0, SHMREF_PUBLISH_SEALED, NULL, 0, &desc), 0, "round %d: %s",
                     round, shmref_errmsg(c));
        cr_assert_eq(shmref_release(b), 0);
    }
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- fork ---- */

#define NBUF 1000
#define BUFSZ (64 * 1024)

struct producer_arg {
    const char *socket;
    int wfd;
};

/* producer: another process leases and publishes NBUF buffers (retained 60 s), writes the
 * descriptors to a pipe and exits. */
static int producer(void *arg)
{
    struct producer_arg *a = arg;
    shmref_conn *c;
    if (shmref_connect(a->socket, &c) < 0)
        return 10;
    for (uint32_t i = 0; i < NBUF; i++) {
        shmref_buf *b;
        shmref_desc desc;
        if (shmref_lease(c, BUFSZ, &b) < 0)
            return 11;
        fill_pattern(shmref_buf_data(b), BUFSZ, i + 1);
        if (shmref_publish_ex(b, BUFSZ, 60000, 0, 0, NULL, 0, &desc) < 0)
            return 12;
        if (write(a->wfd, &desc, sizeof(desc)) != (ssize_t)sizeof(desc))
            return 13;
        shmref_release(b);
    }
    shmref_close(c);
    return 0;
}

/* client_leases: the "leases" of this daemon's client with pid (its handles), or -1. */
static long client_leases(const struct daemon *d, pid_t pid)
{
    shmref_conn *c = connect_ok(d);
    shmref_status *st;
    cr_assert_eq(shmref_status_get(c, &st), 0);
    long found = -1;
    int n = shmref_status_count(st, "clients");
    for (int i = 0; i < n; i++) {
        char path[64];
        uint64_t v;
        snprintf(path, sizeof(path), "clients.%d.pid", i);
        if (shmref_status_u64(st, path, &v) == 0 && v == (uint64_t)pid) {
            snprintf(path, sizeof(path), "clients.%d.leases", i);
            cr_assert_eq(shmref_status_u64(st, path, &v), 0);
            found = (long)v;
        }
    }
    shmref_status_free(st);
    shmref_close(c);
    return found;
}

Test(lifetimes, a_forked_child_reads_what_it_inherited_and_gets_its_own_connection, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, "--pool-size", "1G", "--max-leases", "8192", NULL);
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    struct producer_arg pa = { .socket = d.socket, .wfd = pfd[1] };
    pid_t prod = child_run(producer, &pa);
    close(pfd[1]);
    static shmref_desc descs[NBUF];
    size_t got = 0;
    while (got < sizeof(descs)) {
        ssize_t n = read(pfd[0], (char *)descs + got, sizeof(descs) - got);
        cr_assert_gt(n, 0, "the producer stopped after %zu descriptors", got / sizeof(descs[0]));
        got += (size_t)n;
    }
    close(pfd[0]);
    cr_assert_eq(child_wait(prod), 0);

    shmref_conn *c = connect_ok(&d);
    static shmref_buf *bufs[NBUF];
    static const void *data[NBUF];
    for (int i = 0; i < NBUF; i++) {
        cr_assert_eq(shmref_acquire(c, &descs[i], &bufs[i]), 0, "%d: %s", i, shmref_errmsg(c));
        data[i] = shmref_buf_data(bufs[i]);
    }
    cr_assert_eq(client_leases(&d, getpid()), NBUF);

    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        /* What Python's GC or an at-fork close does: every inherited handle released. */
        for (int i = 0; i < NBUF; i++)
            if (shmref_release(bufs[i]) < 0)
                _exit(20);
        /* inherited mappings stay readable while the child lives */
        for (int i = 0; i < NBUF; i++)
            if (check_pattern(data[i], BUFSZ, (uint32_t)i + 1) != -1)
                _exit(21);
        /* the child's own connection, made on first use, same socket */
        shmref_buf *b, *r;
        shmref_desc desc;
        if (shmref_lease(c, 4096, &b) < 0)
            _exit(22);
        fill_pattern(shmref_buf_data(b), 4096, 77);
        if (shmref_publish(b, 4096, 0, NULL, 0, &desc) < 0)
            _exit(23);
        if (shmref_acquire(c, &descs[5], &r) < 0 || check_pattern(shmref_buf_data(r), BUFSZ, 6) != -1)
            _exit(24);
        if (shmref_conn_pid(c) != getpid())
            _exit(25);
        shmref_close(c);
        /* still readable after the close, too */
        for (int i = 0; i < NBUF; i += 97)
            if (check_pattern(data[i], BUFSZ, (uint32_t)i + 1) != -1)
                _exit(26);
        _exit(0);
    }
    int st = child_wait(child);
    cr_assert_eq(st, 0, "the child failed (status %d: 20+ = a step, 128+ = a signal)", st);
    /* The parent's connection and handles are as they were: nothing released by the child. */
    cr_assert_eq(client_leases(&d, getpid()), NBUF, "the child released the parent's handles");
    for (int i = 0; i < NBUF; i++)
        cr_assert_eq(check_pattern(shmref_buf_data(bufs[i]), BUFSZ, (uint32_t)i + 1), -1);
    cr_assert_eq(shmref_ping(c), 0, "%s", shmref_errmsg(c));
    cr_assert_str_empty(shmref_errmsg(c), "no late error from the daemon");
    cr_assert_eq(shmref_release_many(bufs, NBUF), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_str_empty(shmref_errmsg(c), "every release was the parent's own, accepted");
    cr_assert_eq(client_leases(&d, getpid()), 0);
    shmref_close(c);
    daemon_stop(&d);
}

/* What an at-fork hook does (shmref's Python binding closes every inherited connection in
 * the child): the child closes the connection first, then reads and drops what it
 * inherited, in any order, with either release call, after the close. Every inherited
 * handle stays valid until its own release: the close frees none of them (before, it
 * freed them all, and each later read or release in the child was a use after free:
 * heap-use-after-free under ASan), and the connection's memory goes with the last. */
Test(lifetimes, a_forked_child_drops_what_it_inherited_after_closing_the_connection, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    enum { N = 6 };
    shmref_buf *h[N];
    uint32_t seed[N];
    shmref_desc desc, other;
    /* a plain lease, a published lease, its re-acquire on the same connection, another
     * process's publish acquired twice (the second shares the first's daemon handle) */
    cr_assert_eq(shmref_lease(c, 8192, &h[0]), 0, "%s", shmref_errmsg(c));
    fill_pattern(shmref_buf_data(h[0]), 8192, seed[0] = 1);
    cr_assert_eq(shmref_lease(c, 8192, &h[1]), 0, "%s", shmref_errmsg(c));
    fill_pattern(shmref_buf_data(h[1]), 8192, seed[1] = 2);
    cr_assert_eq(shmref_publish(h[1], 8192, 30000, NULL, 0, &desc), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_acquire(c, &desc, &h[2]), 0, "%s", shmref_errmsg(c));
    seed[2] = 2;
    shmref_buf *pb;
    cr_assert_eq(shmref_lease(p, 8192, &pb), 0, "%s", shmref_errmsg(p));
    fill_pattern(shmref_buf_data(pb), 8192, 3);
    cr_assert_eq(shmref_publish(pb, 8192, 30000, NULL, 0, &other), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(shmref_acquire(c, &other, &h[3]), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_acquire(c, &other, &h[4]), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_lease(c, 100, &h[5]), 0, "%s", shmref_errmsg(c));
    fill_pattern(shmref_buf_data(h[5]), 100, seed[5] = 6);
    seed[3] = seed[4] = 3;
    cr_assert_eq(shmref_ping(c), 0, "%s", shmref_errmsg(c));
    long before = client_leases(&d, getpid());

    for (int variant = 0; variant < 2; variant++) {
        pid_t child = fork();
        cr_assert_geq(child, 0);
        if (child == 0) {
            if (variant == 1) { /* the child's own connection first, then the close */
                shmref_buf *own;
                if (shmref_lease(c, 4096, &own) < 0 || shmref_conn_pid(c) != getpid())
                    _exit(20);
            }
            shmref_close(c);
            for (int i = 0; i < N; i++) {
                size_t len = i == 5 ? 100 : 8192;
                if (!shmref_buf_data(h[i]) || shmref_buf_size(h[i]) < len)
                    _exit(21);
                if (check_pattern(shmref_buf_data(h[i]), len, seed[i]) != -1)
                    _exit(22);
            }
            if (shmref_release(h[2]) < 0 || shmref_release(h[0]) < 0 || shmref_release(h[3]) < 0)
                _exit(23);
            /* the rest still readable after some went */
            if (check_pattern(shmref_buf_data(h[4]), 8192, 3) != -1 ||
                check_pattern(shmref_buf_data(h[1]), 8192, 2) != -1)
                _exit(24);
            shmref_buf *rest[] = { h[1], h[4], h[5] };
            if (shmref_release_many(rest, 3) < 0)
                _exit(25);
            /* and a connection of the child's own works as any */
            shmref_conn *mine;
            shmref_buf *b;
            if (shmref_connect(d.socket, &mine) < 0 || shmref_lease(mine, 4096, &b) < 0)
                _exit(26);
            shmref_close(mine);
            _exit(0);
        }
        int st = child_wait(child);
        cr_assert_eq(st, 0, "variant %d: the child failed (status %d: 20+ = a step, 1 = a sanitizer's report, "
                     "128+ = a signal)", variant, st);
    }
    /* The parent's connection and handles are as they were: nothing released by a child. */
    cr_assert_eq(shmref_ping(c), 0, "%s", shmref_errmsg(c));
    cr_assert_str_empty(shmref_errmsg(c), "no late error from the daemon");
    cr_assert_eq(client_leases(&d, getpid()), before, "a child released the parent's handles");
    for (int i = 0; i < N; i++)
        cr_assert_eq(check_pattern(shmref_buf_data(h[i]), i == 5 ? 100 : 8192, seed[i]), -1);
    for (int i = 0; i < N; i++)
        cr_assert_eq(shmref_release(h[i]), 0, "%d: %s", i, shmref_errmsg(c));
    shmref_release(pb);
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* A child made by a raw clone() runs none of the libc's fork handlers: libshmref still
 * tells it from its parent (it keeps its pid in a page the kernel wipes in a child, not in
 * a cache an at-fork handler resets), so the child never speaks on the parent's socket. */
Test(lifetimes, a_raw_clone_child_is_told_from_its_parent, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, 4096, &b), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(b), 0); /* the parent has called the library: its pid is known */
    cr_assert_eq(shmref_ping(c), 0, "%s", shmref_errmsg(c)); /* its stock's refills are in */
    long before = client_leases(&d, getpid());
    pid_t child = (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, 0);
    cr_assert_geq(child, 0);
    if (child == 0) {
        pid_t me = (pid_t)syscall(SYS_getpid);
        shmref_buf *cb;
        if (shmref_lease(c, 4096, &cb) < 0)
            _exit(20);
        if (shmref_conn_pid(c) != me)
            _exit(21); /* the parent's connection, used by the child */
        shmref_release(cb);
        shmref_close(c);
        _exit(0);
    }
    int st = child_wait(child);
    cr_assert_eq(st, 0, "the child failed (status %d: 20 lease, 21 it used the parent's connection)", st);
    cr_assert_eq(shmref_conn_pid(c), getpid());
    cr_assert_eq(shmref_ping(c), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(client_leases(&d, getpid()), before, "the child's lease went on the parent's connection");
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- bounds ---- */

Test(lifetimes, submits_to_a_stopped_daemon_are_refused_past_the_bound, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(kill(d.pid, SIGSTOP), 0);
    long before = rss_kb();
    long ok = 0, refused = 0;
    char first[256] = "";
    for (long i = 0; i < 2000000; i++) {
        int r = shmref_ping_submit(c, NULL);
        if (r == 0) {
            ok++;
            continue;
        }
        cr_assert_eq(r, -ENOBUFS, "submit %ld: %d %s", i, r, shmref_errmsg(c));
        if (!refused++)
            snprintf(first, sizeof(first), "%s", shmref_errmsg(c));
    }
    long grown = rss_kb() - before;
    cr_log_info("2,000,000 submits: %ld accepted, %ld refused, RSS +%ld kB; first refusal: %s", ok, refused,
                grown, first);
    cr_assert_leq(ok, 65536, "the request table holds at most its default bound");
    cr_assert_eq(ok + refused, 2000000);
    cr_assert(strstr(first, "65536"), "the refusal names the limit: %s", first);
    cr_assert_lt(grown, 96 * 1024, "client memory bounded (RSS +%ld kB)", grown);
    /* a lower bound set by the public call holds at once */
    cr_assert_eq(shmref_set_limits(c, 10, -1), 0);
    cr_assert_eq(shmref_ping_submit(c, NULL), -ENOBUFS);
    cr_assert_eq(shmref_set_limits(c, 0, -1), -EINVAL);
    long t0 = now_ms();
    shmref_close(c);
    long took = now_ms() - t0;
    cr_assert_eq(kill(d.pid, SIGCONT), 0);
    /* no wait (close_never_waits_for_a_stopped_daemon holds it to 100 ms): here only the
     * freeing of 65536 records, slower under ASan */
    cr_assert_lt(took, 1000, "close with 65536 requests out to a stopped daemon took %ld ms", took);
    daemon_stop(&d);
}

Test(lifetimes, the_send_queue_is_bounded_in_bytes, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, NULL);
    setenv("SHMREF_MAX_QUEUE", "64K", 1);
    shmref_conn *c = connect_ok(&d);
    unsetenv("SHMREF_MAX_QUEUE");
    cr_assert_eq(kill(d.pid, SIGSTOP), 0);
    int r = 0;
    long n;
    for (n = 0; n < 1000000 && (r = shmref_ping_submit(c, NULL)) == 0; n++)
        ;
    cr_log_info("queue bound after %ld pings: %s", n, shmref_errmsg(c));
    cr_assert_eq(r, -ENOBUFS, "%s", shmref_errmsg(c));
    cr_assert(strstr(shmref_errmsg(c), "send queue") && strstr(shmref_errmsg(c), "limit is 65536"),
              "the byte bound binds first, named: %s", shmref_errmsg(c));
    cr_assert_lt(n, 65536);
    long t0 = now_ms();
    shmref_close(c);
    cr_assert_lt(now_ms() - t0, 100);
    kill(d.pid, SIGCONT);
    daemon_stop(&d);
}

Test(lifetimes, close_never_waits_for_a_stopped_daemon, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0);
    cr_assert_eq(shmref_lease_submit(c, 4096, 0, 0, NULL), 0);
    cr_assert_eq(kill(d.pid, SIGSTOP), 0);
    cr_assert_eq(shmref_status_submit(c, NULL), 0);
    long t0 = now_ms();
    shmref_close(c);
    long took = now_ms() - t0;
    cr_assert_eq(kill(d.pid, SIGCONT), 0);
    cr_assert_lt(took, 100, "close took %ld ms", took);
    /* the daemon ends what the connection held */
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 5000), 0);
    daemon_stop(&d);
}

/* reacquire_ms: the best of 3 runs of k local re-acquires (and releases) of desc. */
static long reacquire_ms(shmref_conn *c, const shmref_desc *desc, int k)
{
    long best = -1;
    for (int run = 0; run < 3; run++) {
        long t0 = now_ms();
        for (int i = 0; i < k; i++) {
            shmref_buf *b;
            cr_assert_eq(shmref_acquire(c, desc, &b), 0);
            cr_assert_eq(shmref_release(b), 0);
        }
        long t = now_ms() - t0;
        if (best < 0 || t < best)
            best = t;
    }
    return best;
}

Test(lifetimes, local_reacquires_cost_the_same_among_thousands_of_handles, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    enum { SMALL = 50, N = 2500, K = 100000 };
    static shmref_desc descs[N];
    static shmref_buf *held[N];
    for (int i = 0; i < N; i++) {
        shmref_buf *b;
        cr_assert_eq(shmref_lease(p, 64, &b), 0, "%d: %s", i, shmref_errmsg(p));
        cr_assert_eq(shmref_publish_ex(b, 64, 120000, 0, 0, NULL, 0, &descs[i]), 0);
        shmref_release(b);
    }
    /* desc 0 first: the oldest of the handles (a scan of them meets it last) */
    for (int i = 0; i < SMALL; i++)
        cr_assert_eq(shmref_acquire(c, &descs[i], &held[i]), 0, "%d: %s", i, shmref_errmsg(c));
    long small = reacquire_ms(c, &descs[0], K);
    for (int i = SMALL; i < N; i++)
        cr_assert_eq(shmref_acquire(c, &descs[i], &held[i]), 0, "%d: %s", i, shmref_errmsg(c));
    long large = reacquire_ms(c, &descs[0], K);
    uint64_t local;
    cr_assert_eq(shmref_conn_counter(c, "local_acquires", &local), 0);
    cr_assert_eq(local, (uint64_t)6 * K, "every re-acquire was local");
    cr_log_info("%d local re-acquires: %ld ms among %d handles, %ld ms among %d", K, small, SMALL, large, N);
    /* 50x the handles: a scan per acquire costs ~50x; a tree lookup a few steps more */
    cr_assert_lt(large, 4 * small + 100, "%ld ms among %d handles, %ld ms among %d: it grows with the handles",
                 small, SMALL, large, N);
    cr_assert_eq(shmref_release_many(held, N), 0);
    shmref_close(p);
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- trust ---- */

struct fake {
    char dir[32], path[64];
    uid_t uid;          /* run as this uid (0: as the test) */
    uint64_t fd_size;   /* bytes of the file sent for each acquire */
};

static int send_with_fd(int fd, const uint8_t *msg, size_t len, int pass)
{
    return rawclient_send_fds(fd, msg, len, &pass, pass >= 0 ? 1 : 0) == 0 ? 0 : -1;
}

/* fake_daemon: a SOCK_SEQPACKET server speaking just enough of the protocol: a hello
 * answered, every acquire answered with a handle and a fresh memfd of fd_size bytes for
 * a buffer of the descriptor's size (the lie), everything else ignored. */
static int fake_daemon(void *arg)
{
    struct fake *f = arg;
    if (f->uid && (setresgid(f->uid, f->uid, f->uid) < 0 || setresuid(f->uid, f->uid, f->uid) < 0))
        return 30;
    /* Bound under another name and renamed once listening: fake_start waits for the
     * path, and a connect between bind and listen is refused (ECONNREFUSED, seen in CI). */
    int ls = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s.new", f->path);
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(ls, 16) < 0 ||
        rename(sa.sun_path, f->path) < 0)
        return 31;
    uint64_t next = 1;
    for (;;) {
        int s = accept(ls, NULL, NULL);
        if (s < 0)
            return 32;
        uint8_t in[PROTO_MAX_REQUEST], out[PROTO_MAX_REPLY];
        for (;;) {
            ssize_t n = recv(s, in, sizeof(in), 0);
            if (n <= 0)
                break;
            struct proto_msg m, rep;
            const char *why;
            if (proto_decode(in, (size_t)n, sizeof(in), &m, &why) < 0)
                break;
            memset(&rep, 0, sizeof(rep));
            rep.id = m.id;
            int pass = -1;
            if (m.op == PROTO_OP_HELLO) {
                rep.op = PROTO_OP_HELLO + PROTO_OP_REPLY;
                rep.u.hello_reply.version = PROTO_VERSION;
                rep.u.hello_reply.features = PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE;
                rep.u.hello_reply.max_request = PROTO_MAX_REQUEST;
                rep.u.hello_reply.max_lease = 1 << 30;
                rep.u.hello_reply.max_leases = 4096;
                rep.u.hello_reply.max_meta = 16384;
                rep.u.hello_reply.pid = (uint64_t)getpid();
            } else if (m.op == PROTO_OP_ACQUIRE) {
                rep.op = PROTO_OP_ACQUIRE + PROTO_OP_REPLY;
                rep.u.acquire_reply.handle = next;
                rep.u.acquire_reply.buf_id = next++;
                rep.u.acquire_reply.size = 1 << 20;
                rep.u.acquire_reply.capacity = 1 << 20;
                memcpy(rep.u.acquire_reply.token, m.u.acquire.token, PROTO_TOKEN_LEN);
                pass = memfd_create("fake", MFD_CLOEXEC);
                if (pass < 0 || ftruncate(pass, (off_t)f->fd_size) < 0)
                    return 33;
            } else {
                continue;
            }
            int len = proto_encode(&rep, out, sizeof(out));
            if (len < 0 || send_with_fd(s, out, (size_t)len, pass) < 0)
                return 34;
            if (pass >= 0)
                close(pass);
        }
        close(s);
    }
}

static pid_t fake_start(struct fake *f, uid_t uid, uint64_t fd_size)
{
    snprintf(f->dir, sizeof(f->dir), "/tmp/shmref-fake-XXXXXX");
    cr_assert_not_null(mkdtemp(f->dir));
    cr_assert_eq(chmod(f->dir, 0777), 0); /* another uid binds in it (the test's own dir) */
    snprintf(f->path, sizeof(f->path), "%s/s.sock", f->dir);
    f->uid = uid;
    f->fd_size = fd_size;
    pid_t pid = child_run(fake_daemon, f);
    for (int i = 0; i < 500 && access(f->path, F_OK) != 0; i++)
        usleep(10000);
    cr_assert_eq(access(f->path, F_OK), 0, "the fake daemon did not bind");
    return pid;
}

static void fake_stop(struct fake *f, pid_t pid)
{
    kill(pid, SIGKILL);
    child_wait(pid);
    unlink(f->path);
    rmdir(f->dir);
}

Test(lifetimes, an_fd_shorter_than_its_buffer_is_refused_and_closed, .timeout = 60)
{
    struct fake f;
    pid_t pid = fake_start(&f, 0, 4096);
    shmref_conn *c;
    cr_assert_eq(shmref_connect(f.path, &c), 0, "%s", shmref_errmsg(NULL));
    shmref_desc desc = { .size = 1 << 20 };
    memset(desc.token, 7, sizeof(desc.token));
    int fds = count_fds();
    for (int i = 0; i < 200; i++) {
        shmref_buf *b = NULL;
        int r = shmref_acquire(c, &desc, &b);
        cr_assert_lt(r, 0, "a 4 KiB file for a 1 MiB buffer must not be mapped");
        cr_assert_null(b);
        cr_assert(strstr(shmref_errmsg(c), "4096") && strstr(shmref_errmsg(c), "1048576"), "%s",
                  shmref_errmsg(c));
    }
    cr_assert_eq(count_fds(), fds, "every refused fd was closed");
    shmref_close(c);
    fake_stop(&f, pid);
}

Test(lifetimes, a_daemon_of_another_uid_is_refused_unless_configured, .timeout = 60)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to run the fake daemon as another uid");
    struct fake f;
    pid_t pid = fake_start(&f, 65534, 1 << 20);
    shmref_conn *c = NULL;
    unsetenv("SHMREF_DAEMON_UID");
    unsetenv("SHMREF_DAEMON_USER");
    cr_assert_eq(shmref_connect(f.path, &c), -EPERM);
    cr_assert_null(c);
    cr_assert(strstr(shmref_errmsg(NULL), "uid 65534"), "%s", shmref_errmsg(NULL));
    cr_log_info("%s", shmref_errmsg(NULL));
    /* the configured daemon user is trusted: by the environment, then by the setter */
    setenv("SHMREF_DAEMON_UID", "65534", 1);
    cr_assert_eq(shmref_connect(f.path, &c), 0, "%s", shmref_errmsg(NULL));
    shmref_close(c);
    unsetenv("SHMREF_DAEMON_UID");
    cr_assert_eq(shmref_connect(f.path, &c), -EPERM);
    cr_assert_eq(shmref_set_daemon_uid(65534), 0);
    cr_assert_eq(shmref_connect(f.path, &c), 0, "%s", shmref_errmsg(NULL));
    shmref_close(c);
    cr_assert_eq(shmref_set_daemon_uid(-1), 0);
    fake_stop(&f, pid);
}
