/* SPDX-License-Identifier: MIT */
/* test-eventloop: libshmref's submit/complete API against a real shmrefd: every submit
 * completes once with its user pointer, nothing blocks, what needs no daemon is ready at
 * once, a failing request completes with the daemon's message, shmref_close with requests
 * outstanding leaves nothing held, a broken connection fails what is outstanding, the
 * stock's refills kept for the next message are sent by a flush or before a wait, a
 * forked child polls its own connection. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* collect: poll conn until `want` completions arrived (5 s at most). */
static int collect(shmref_conn *c, shmref_completion *out, int want)
{
    int got = 0;
    long deadline = now_ms() + 5000;
    while (got < want && now_ms() < deadline) {
        int ev = shmref_conn_events(c);
        cr_assert_geq(ev, 0);
        if (!(ev & SHMREF_READY)) {
            struct pollfd p = { .fd = shmref_conn_fd(c),
                                .events = (short)((ev & SHMREF_WANT_READ ? POLLIN : 0) |
                                                  (ev & SHMREF_WANT_WRITE ? POLLOUT : 0)) };
            if (ev & SHMREF_WANT_WRITE)
                shmref_flush(c);
            poll(&p, 1, 100);
        }
        int n = shmref_complete(c, out + got, (size_t)(want - got));
        if (n < 0)
            return n;
        got += n;
    }
    return got;
}

Test(eventloop, every_submit_completes_once_with_its_user_pointer, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    shmref_completion v[8];
    int tag[8];
    cr_assert_eq(shmref_complete(p, v, 8), 0, "nothing submitted, nothing completes");
    cr_assert_eq(shmref_conn_events(p), 0);
    cr_assert_eq(shmref_lease_submit(p, 10000, 0, 0, &tag[0]), 0);
    cr_assert(shmref_conn_events(p) & SHMREF_WANT_READ);
    cr_assert_eq(collect(p, v, 1), 1);
    cr_assert_eq(v[0].user, &tag[0]);
    cr_assert_eq(v[0].op, SHMREF_OP_LEASE);
    cr_assert_eq(v[0].result, 0, "%s", v[0].errmsg);
    shmref_buf *b = v[0].buf;
    cr_assert_eq(shmref_buf_size(b), 10000);
    fill_pattern(shmref_buf_data(b), 10000, 5);
    /* A plain publish needs no daemon: ready at once. */
    cr_assert_eq(shmref_publish_submit(b, 10000, 0, 0, 0, NULL, 0, &tag[1]), 0);
    cr_assert(shmref_conn_events(p) & SHMREF_READY);
    cr_assert_eq(shmref_complete(p, v, 8), 1);
    cr_assert_eq(v[0].user, &tag[1]);
    cr_assert_eq(v[0].op, SHMREF_OP_PUBLISH);
    cr_assert_eq(v[0].buf, b);
    shmref_desc desc = v[0].desc;
    cr_assert_eq(desc.size, 10000);
    /* The consumer: acquire, status and ping submitted together. */
    cr_assert_eq(shmref_acquire_submit(c, &desc, 0, &tag[2]), 0);
    cr_assert_eq(shmref_status_submit(c, &tag[3]), 0);
    cr_assert_eq(shmref_ping_submit(c, &tag[4]), 0);
    cr_assert_eq(collect(c, v, 3), 3);
    bool seen[3] = { false };
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(v[i].result, 0, "%s", v[i].errmsg);
        int k = (int)((int *)v[i].user - &tag[2]);
        cr_assert(k >= 0 && k < 3 && !seen[k], "a completion came twice or unasked");
        seen[k] = true;
        if (v[i].op == SHMREF_OP_ACQUIRE) {
            cr_assert_eq(check_pattern(shmref_buf_data(v[i].buf), 10000, 5), -1);
            shmref_buf *r = v[i].buf;
            /* A re-acquire on the same connection: ready at once, no daemon. */
            cr_assert_eq(shmref_acquire_submit(c, &desc, 0, &tag[5]), 0);
            cr_assert(shmref_conn_events(c) & SHMREF_READY);
            shmref_release(r);
        } else if (v[i].op == SHMREF_OP_STATUS) {
            uint64_t n;
            cr_assert_eq(shmref_status_u64(v[i].status, "daemon.clients", &n), 0);
            cr_assert_geq(n, 2);
            shmref_status_free(v[i].status);
        } else {
            cr_assert_eq(v[i].op, SHMREF_OP_PING);
        }
    }
    cr_assert_eq(shmref_complete(c, v, 8), 1);
    cr_assert_eq(v[0].user, &tag[5]);
    cr_assert_eq(check_pattern(shmref_buf_data(v[0].buf), 10000, 5), -1);
    shmref_release(v[0].buf);
    /* A refusal completes with the daemon's words. */
    shmref_desc bogus = desc;
    bogus.token[0] ^= 0xff;
    cr_assert_eq(shmref_set_acquire_wait(c, 0), 0);
    cr_assert_eq(shmref_acquire_submit(c, &bogus, 0, &tag[6]), 0);
    cr_assert_eq(collect(c, v, 1), 1);
    cr_assert_eq(v[0].result, -ENOENT);
    cr_assert_neq(strlen(v[0].errmsg), 0);
    cr_assert_null(v[0].buf);
    shmref_release(b);
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

Test(eventloop, close_with_requests_outstanding_leaves_nothing_held, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(shmref_lease_submit(p, 4096 + (size_t)i * 4096, 0, 0, NULL), 0);
    long t0 = now_ms();
    shmref_close(p); /* never waits: no completion is delivered; what the daemon granted ends with the connection */
    cr_assert_lt(now_ms() - t0, 100);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 3000), 0);
    /* Leases still on their way at close are the daemon's to reclaim (it may count the
     * client as died holding them: close does not wait for them, by design). */
    daemon_stop(&d);
}

Test(eventloop, a_dead_daemon_fails_what_is_outstanding, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "64K", NULL);
    shmref_conn *p = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(p, 0), 0);
    shmref_buf *held;
    cr_assert_eq(shmref_lease(p, 65536, &held), 0);
    cr_assert_eq(shmref_lease_submit(p, 65536, 0, 30000, &d), 0); /* waits for quota */
    shmref_completion v[2];
    cr_assert_eq(shmref_complete(p, v, 2), 0);
    kill(d.pid, SIGKILL);
    cr_assert_eq(collect(p, v, 1), 1);
    cr_assert_eq(v[0].user, &d);
    cr_assert_eq(v[0].result, -ECONNRESET, "%d %s", v[0].result, v[0].errmsg);
    cr_assert_eq(shmref_complete(p, v, 2), -ECONNRESET);
    cr_assert_eq(shmref_ping(p), -ECONNRESET);
    shmref_release(held);
    shmref_close(p);
    int st;
    waitpid(d.pid, &st, 0);
}

/* counter: one of libshmref's counters of c. */
static uint64_t counter(shmref_conn *c, const char *name)
{
    uint64_t v = 0;
    cr_assert_eq(shmref_conn_counter(c, name, &v), 0, "%s", name);
    return v;
}

/* The stock's refills wait for the next message (one sendmmsg, one wake-up of the daemon):
 * an event loop is told to write meanwhile (SHMREF_WANT_WRITE) and shmref_flush sends
 * them; a blocking call sends them before it waits. Either way the next lease of the
 * class comes from the stock, with no round trip.
 * The stock serves only connections without a table: p is made with $SHMREF_TABLE=0.
 * With a table (the default, q at the end) shmref_lease never takes from the stock:
 * after the first lease of a class, whose buffer joins the table at its release, a lease
 * is popped from the table and sends nothing at all (nothing kept for a next message). */
Test(eventloop, refills_kept_for_the_next_message_are_never_lost, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    cr_assert_eq(setenv("SHMREF_TABLE", "0", 1), 0); /* the stock exists only without a table */
    shmref_conn *p = connect_ok(&d);
    cr_assert_eq(unsetenv("SHMREF_TABLE"), 0);
    cr_assert_eq(shmref_set_stock(p, 2), 0); /* the suite runs with SHMREF_STOCK=0 */
    shmref_buf *b;
    cr_assert_eq(shmref_lease(p, 8192, &b), 0, "%s", shmref_errmsg(p)); /* learns the class: 2 refills */
    uint64_t sent = counter(p, "sent");
    cr_assert(shmref_conn_events(p) & SHMREF_WANT_WRITE, "refills are kept, and the loop is told to write");
    cr_assert_eq(shmref_flush(p), 0);
    cr_assert_eq(counter(p, "sent"), sent + 1, "the flush sent the refill (one lease_many of 2)");
    cr_assert_eq(shmref_conn_events(p) & SHMREF_WANT_WRITE, 0);
    shmref_completion v[1];
    /* until the refill is answered (5 s at most): its reply is the stock's, no completion */
    for (long deadline = now_ms() + 5000; (shmref_conn_events(p) & SHMREF_WANT_READ) && now_ms() < deadline;) {
        struct pollfd pf = { .fd = shmref_conn_fd(p), .events = POLLIN };
        poll(&pf, 1, 100);
        cr_assert_eq(shmref_complete(p, v, 1), 0, "the refill's reply is the stock's, no completion");
    }
    cr_assert_eq(shmref_conn_events(p) & SHMREF_WANT_READ, 0, "the refill was answered");
    uint64_t rt = counter(p, "round_trips"), waits = counter(p, "waits");
    int tag;
    cr_assert_eq(shmref_lease_submit(p, 8192, 0, 0, &tag), 0);
    cr_assert(shmref_conn_events(p) & SHMREF_READY, "a stock lease is ready at once");
    cr_assert_eq(shmref_complete(p, v, 1), 1);
    cr_assert_eq(v[0].result, 0, "%s", v[0].errmsg);
    cr_assert_eq(counter(p, "stock_hits"), 1);
    /* a blocking stock lease keeps its refill too; the next blocking call sends it first */
    shmref_buf *c;
    cr_assert_eq(shmref_lease(p, 8192, &c), 0);
    cr_assert_eq(counter(p, "stock_hits"), 2);
    cr_assert(shmref_conn_events(p) & SHMREF_WANT_WRITE);
    sent = counter(p, "sent");
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(counter(p, "sent"), sent + 2, "the kept refill, then the ping");
    cr_assert_eq(counter(p, "round_trips"), rt + 1, "the ping; the stock leases are none");
    cr_assert_leq(counter(p, "waits"), waits + 1, "only the ping may have waited");
    shmref_release(c);
    shmref_release(v[0].buf);
    shmref_release(b);
    cr_assert_eq(counter(p, "table_leases"), 0);
    shmref_close(p);

    /* the default: a table, which serves shmref_lease instead of the stock */
    shmref_conn *q = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(q, 2), 0);
    cr_assert_eq(shmref_lease(q, 8192, &b), 0, "%s", shmref_errmsg(q)); /* the daemon's: the table is empty */
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(q), 0); /* the release is done: the buffer is in the table */
    /* Nothing of the caller's stays leased. (This shmref_lease of the daemon's still
     * learned its class for the stock, whose refills are held as stock, pool.bytes_stock,
     * though no lease of a table connection takes from it but the submit API's.) */
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), status_u64(&d, "pool.bytes_stock"));
    cr_assert_eq(status_u64(&d, "table.grants"), 1);
    sent = counter(q, "sent");
    rt = counter(q, "round_trips");
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(shmref_lease(q, 8192, &b), 0, "%s", shmref_errmsg(q));
        cr_assert_eq(shmref_conn_events(q) & (SHMREF_WANT_WRITE | SHMREF_WANT_READ), 0, "nothing kept or awaited");
        cr_assert_eq(shmref_release(b), 0);
    }
    cr_assert_eq(counter(q, "table_leases"), 3);
    cr_assert_eq(counter(q, "sent"), sent, "a steady-state lease sends no message");
    cr_assert_eq(counter(q, "round_trips"), rt);
    cr_assert_eq(counter(q, "stock_hits") + counter(q, "stock_misses"), 0, "the stock is not used with a table");
    shmref_close(q);
    daemon_stop(&d);
}

static ino_t sock_ino(int fd)
{
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/* A forked child that polls the connection gets its own socket, never its parent's (whose
 * replies it would read), and sees none of the parent's requests as its own; the parent's
 * outstanding request still completes in the parent. */
Test(eventloop, a_forked_child_polls_its_own_connection, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d);
    ino_t parent_sock = sock_ino(shmref_conn_fd(p));
    cr_assert_neq(parent_sock, 0);
    int tag;
    cr_assert_eq(shmref_ping_submit(p, &tag), 0);
    cr_assert(shmref_conn_events(p) & SHMREF_WANT_READ);
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        if (shmref_conn_events(p) & (SHMREF_WANT_READ | SHMREF_READY))
            _exit(20); /* the parent's ping is not the child's */
        int fd = shmref_conn_fd(p);
        if (fd < 0)
            _exit(21);
        if (sock_ino(fd) == parent_sock)
            _exit(22); /* the parent's socket */
        if (shmref_conn_pid(p) != getpid())
            _exit(23);
        int mine;
        shmref_completion v[2];
        if (shmref_ping_submit(p, &mine) < 0 || collect(p, v, 1) != 1 || v[0].user != &mine || v[0].result != 0)
            _exit(24);
        if (shmref_conn_fd(p) != fd)
            _exit(25); /* one connection, kept */
        shmref_close(p);
        _exit(0);
    }
    int st = child_wait(child);
    cr_assert_eq(st, 0, "the child failed (status %d: 20+ = a step, 128+ = a signal)", st);
    shmref_completion v[1];
    cr_assert_eq(collect(p, v, 1), 1, "the parent's ping completes in the parent");
    cr_assert_eq(v[0].user, &tag);
    cr_assert_eq(v[0].result, 0, "%s", v[0].errmsg);
    cr_assert_eq(sock_ino(shmref_conn_fd(p)), parent_sock);
    shmref_close(p);
    daemon_stop(&d);
}
