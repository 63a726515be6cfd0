/* SPDX-License-Identifier: MIT */
/* test-retain.c: shmref_retain (PROTO_OP_RETAIN) through a real shmrefd and real
 * processes: a holder that retains a buffer and is SIGKILLed leaves it to the next
 * acquire (and to that one only), or to its deadline; it works for a hold the daemon
 * knows only from the holder's journal (a take in its uid's table), also when that hold
 * alone kept the buffer (LENT: no daemon reference);
 * another uid, a connection that holds nothing, and a token nothing is published under
 * are refused; a flood of retains keeps alive only what the flooder's own quota pays. */
#include <criterion/criterion.h>

#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "rawv2.h"

#define SIZE (256u << 10)
#define KiB (UINT64_C(1) << 10)

static struct daemon d;

TestSuite(retain, .fini = reap_children, .timeout = 120);

/* ---- a child that holds, retains, says so, and waits to be killed ---- */

struct holder {
    shmref_desc desc;
    uint32_t keep_ms, retains;
    bool via_table;             /* acquire, release, acquire again: a table hold */
    bool wait_go;               /* wait for a byte on go[0] before retaining */
    uid_t uid;                  /* 0: the test's */
    int up[2], go[2];
};

static int hear_int(int fd)
{
    int v = -1;
    cr_assert_eq(read(fd, &v, sizeof(v)), (ssize_t)sizeof(v), "the child died");
    return v;
}

/* holder_main: says 1 when it holds, then (after go, if asked) the result of its retains
 * (0 or -errno), then pauses until it is killed. */
static int holder_main(void *arg)
{
    struct holder *h = arg;
    shmref_conn *c;
    shmref_buf *b;
    int r = 0;
    close(h->up[0]);
    close(h->go[1]);
    if (h->uid && (setgroups(0, NULL) < 0 || setgid(h->uid) < 0 || setuid(h->uid) < 0))
        return 10;
    if (shmref_connect(d.socket, &c) < 0)
        return 11;
    if (shmref_acquire(c, &h->desc, &b) < 0)
        return 12;
    if (check_pattern(shmref_buf_data(b), h->desc.size, 3) != -1)
        return 13;
    if (h->via_table) {
        uint64_t before = 0, after = 0;
        shmref_conn_counter(c, "table_acquires", &before);
        shmref_release(b); /* its mapping stays cached: the next acquire is a table hold */
        if (shmref_ping(c) < 0) /* (the release of a daemon acquire is one-way) */
            return 19;
        if (shmref_acquire(c, &h->desc, &b) < 0)
            return 14;
        shmref_conn_counter(c, "table_acquires", &after);
        if (after != before + 1)
            return 15;
    }
    if (write(h->up[1], &(int){ 1 }, sizeof(int)) != sizeof(int))
        return 16;
    if (h->wait_go) {
        char x;
        if (read(h->go[0], &x, 1) != 1)
            return 17;
    }
    for (uint32_t i = 0; i < h->retains && r == 0; i++)
        r = shmref_retain(c, &h->desc, h->keep_ms);
    if (r < 0)
        fprintf(stderr, "holder: retain: %d %s\n", r, shmref_errmsg(c));
    if (write(h->up[1], &r, sizeof(r)) != sizeof(r))
        return 18;
    pause();
    return 0;
}

/* holder_run: starts a holder of desc; returns its pid once it holds. */
static pid_t holder_run(struct holder *h)
{
    cr_assert_eq(pipe(h->up), 0);
    cr_assert_eq(pipe(h->go), 0);
    pid_t pid = child_run(holder_main, h);
    close(h->up[1]);
    close(h->go[0]);
    cr_assert_eq(hear_int(h->up[0]), 1, "the holder could not acquire");
    return pid;
}

static void kill_holder(struct holder *h, pid_t pid)
{
    cr_assert_eq(kill(pid, SIGKILL), 0);
    cr_assert_eq(child_wait(pid), 128 + SIGKILL);
    close(h->up[0]);
    close(h->go[1]);
}

/* publish: a buffer of SIZE bytes (pattern 3) published with keep_ms and max_acquires,
 * its lease released (the retention alone keeps it, as a Dask frame's) unless *ret_buf. */
static shmref_desc publish(shmref_conn *p, uint32_t keep_ms, uint32_t max_acquires, shmref_buf **ret_buf)
{
    shmref_buf *b;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "%s", shmref_errmsg(p));
    fill_pattern(shmref_buf_data(b), SIZE, 3);
    cr_assert_eq(shmref_publish_ex(b, SIZE, keep_ms, max_acquires, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(p));
    if (ret_buf)
        *ret_buf = b;
    else
        cr_assert_eq(shmref_release(b), 0);
    return desc;
}

static void acquire_checks(shmref_conn *c, const shmref_desc *desc, const char *what)
{
    shmref_buf *b;
    cr_assert_eq(shmref_acquire(c, desc, &b), 0, "%s: %s", what, shmref_errmsg(c));
    cr_assert_eq(check_pattern(shmref_buf_data(b), SIZE, 3), -1, "%s: the bytes", what);
    cr_assert_eq(shmref_release(b), 0);
}

/* ---- outliving its holder ---- */

/* A forwarded Dask frame: the publish's retention (max_acquires 1) ended at the holder's
 * own acquire; the holder retains it for its peer and dies. Before PROTO_OP_RETAIN the
 * peer's acquire failed ENOENT. */
Test(retain, outlives_its_sigkilled_holder_for_one_acquire)
{
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    struct holder h = { .desc = publish(p, 60000, 1, NULL), .keep_ms = 60000, .retains = 1, .wait_go = true };
    pid_t pid = holder_run(&h);
    cr_assert_eq(status_u64(&d, "buffers.retained"), 0, "the publish's retention ended at the holder's acquire");
    cr_assert_eq(write(h.go[1], "g", 1), 1);
    cr_assert_eq(hear_int(h.up[0]), 0, "retain");
    cr_assert_eq(status_u64(&d, "buffers.retained"), 1);
    kill_holder(&h, pid);

    acquire_checks(c, &h.desc, "the acquire after its holder was killed");
    cr_assert_eq(status_u64(&d, "buffers.retained"), 0, "the retention ends at that acquire");
    shmref_buf *b;
    cr_assert_eq(shmref_acquire(c, &h.desc, &b), -ENOENT, "a second acquire: gone (%s)", shmref_errmsg(c));
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);

    /* two retains: two acquires after the holder, the third finds nothing */
    struct holder h2 = { .desc = publish(p, 60000, 1, NULL), .keep_ms = 60000, .retains = 2 };
    pid = holder_run(&h2);
    cr_assert_eq(hear_int(h2.up[0]), 0, "retain twice");
    kill_holder(&h2, pid);
    acquire_checks(c, &h2.desc, "first of two");
    acquire_checks(c, &h2.desc, "second of two");
    /* c maps the buffer (the pool's warm buffer again): those two may have been taken in
     * its ledger, counted when the daemon reads their one-way TOOK notes; a ping is read
     * after them (the state to wait for, not a time) */
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_acquire(c, &h2.desc, &b), -ENOENT, "a third acquire");
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

Test(retain, ends_at_its_deadline_if_nobody_comes)
{
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    struct holder h = { .desc = publish(p, 60000, 1, NULL), .keep_ms = 200, .retains = 1 };
    pid_t pid = holder_run(&h);
    cr_assert_eq(hear_int(h.up[0]), 0, "retain");
    kill_holder(&h, pid);
    cr_assert_eq(status_u64(&d, "buffers.retained"), 1);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 2000), 0, "not gone at its deadline");
    cr_assert_eq(status_u64(&d, "counters.retentions_expired"), 1);
    shmref_buf *b;
    cr_assert_eq(shmref_acquire(c, &h.desc, &b), -ENOENT);

    /* a retain of a buffer still retained keeps the later deadline: 60 s, not 200 ms */
    shmref_desc desc = publish(p, 60000, 0, NULL);
    struct holder h2 = { .desc = desc, .keep_ms = 200, .retains = 1 };
    pid = holder_run(&h2);
    cr_assert_eq(hear_int(h2.up[0]), 0, "retain");
    kill_holder(&h2, pid);
    usleep(500 * 1000);
    acquire_checks(c, &desc, "the publish's 60 s retention, not the retain's 200 ms");
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- holds the daemon knows from a journal (table takes) ---- */

/* The holder (another process of the uid) maps the buffer (its first acquire asked the
 * daemon) and takes its second acquire of a publish made in the table: a hold the daemon
 * knows only from the holder's journal. It may retain the buffer: the daemon checks the
 * journal. First when that hold alone keeps the buffer (LENT: no daemon reference), then
 * while the producer still holds its lease too. */
Test(retain, a_ledger_hold_and_a_lent_buffer_are_held)
{
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    shmref_buf *mine;
    /* a buffer in the table first: the publishes below are the table's */
    cr_assert_eq(shmref_lease(p, SIZE, &mine), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(shmref_release(mine), 0);
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(status_u64(&d, "table.lent"), 1, "free in the table");
    uint64_t v = 0;
    /* the producer holds it (no retention); the holder's second acquire is a table hold */
    struct holder h = { .via_table = true, .wait_go = true, .keep_ms = 60000, .retains = 1 };
    h.desc = publish(p, 0, 0, &mine);
    cr_assert_eq(shmref_conn_counter(p, "table_publishes", &v), 0);
    cr_assert_eq(v, 1, "published in the table");
    pid_t pid = holder_run(&h);
    cr_assert_eq(status_u64(&d, "table.takes"), 1, "the holder's first acquire asked the daemon");
    /* the producer lets go: the holder's table hold alone keeps it (LENT) */
    cr_assert_eq(shmref_release(mine), 0);
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(status_u64(&d, "table.lent"), 1, "LENT: held in the table without the daemon");
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), SIZE);
    cr_assert_eq(write(h.go[1], "g", 1), 1);
    cr_assert_eq(hear_int(h.up[0]), 0, "retain of a LENT buffer the holder took in its table");
    cr_assert_eq(status_u64(&d, "table.lent"), 0, "live again: the retention holds it");
    cr_assert_eq(status_u64(&d, "buffers.retained"), 1);
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), SIZE, "the daemon holds it for the retention");
    uint64_t crash_holds = status_u64(&d, "table.crash_holds");
    kill_holder(&h, pid);
    cr_assert_eq(wait_status(&d, "table.crash_holds", crash_holds + 1, 2000), crash_holds + 1,
                 "the killed holder's table hold was dropped");
    cr_assert_eq(status_u64(&d, "buffers.retained"), 1, "the retention outlives the holder");
    acquire_checks(c, &h.desc, "the acquire after the table holder was killed");
    cr_assert_eq(shmref_ping(c), 0);
    shmref_buf *b;
    cr_assert_eq(shmref_acquire(c, &h.desc, &b), -ENOENT, "the retention served its one acquire");
    cr_assert_eq(status_u64(&d, "buffers.retained"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    /* a retained member leaves its table with its last hold (its takes were the daemon's) */
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), 0);
    cr_assert_eq(status_u64(&d, "table.members"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_warm"), SIZE, "back in the pool");

    /* not LENT: the producer still holds it, the holder's hold is in its journal; and c
     * maps the buffer, so only the retention sends its acquire to the daemon */
    cr_assert_eq(shmref_lease(p, SIZE, &mine), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(shmref_release(mine), 0);
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(status_u64(&d, "table.lent"), 1, "free in the table");
    struct holder h2 = { .via_table = true, .keep_ms = 60000, .retains = 1 };
    h2.desc = publish(p, 0, 0, &mine);
    cr_assert_eq(shmref_conn_counter(p, "table_publishes", &v), 0);
    cr_assert_eq(v, 2, "published in the table");
    acquire_checks(c, &h2.desc, "c maps it");
    pid = holder_run(&h2);
    cr_assert_eq(hear_int(h2.up[0]), 0, "retain of a buffer held in the table");
    cr_assert_eq(status_u64(&d, "buffers.retained"), 1);
    kill_holder(&h2, pid);
    cr_assert_eq(shmref_release(mine), 0);
    uint64_t takes = 0, fallbacks = 0, n = 0;
    cr_assert_eq(shmref_conn_counter(c, "table_acquires", &takes), 0);
    cr_assert_eq(shmref_conn_counter(c, "table_fallbacks", &fallbacks), 0);
    acquire_checks(c, &h2.desc, "after the producer and the table holder let go");
    cr_assert_eq(shmref_conn_counter(c, "table_fallbacks", &n), 0);
    cr_assert_eq(n, fallbacks + 1, "a retained buffer's acquire asks the daemon");
    cr_assert_eq(shmref_conn_counter(c, "table_acquires", &n), 0);
    cr_assert_eq(n, takes);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_acquire(c, &h2.desc, &b), -ENOENT, "the retention served its one acquire");
    cr_assert_eq(status_u64(&d, "buffers.retained"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), 0);
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- refusals ---- */

Test(retain, another_uid_is_refused_eperm)
{
    daemon_start(&d, "--socket-mode", "0666", NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    shmref_buf *mine;
    /* uid 65534 acquires root's buffer and asks to extend root's charge */
    struct holder h = { .uid = 65534, .keep_ms = 60000, .retains = 1 };
    h.desc = publish(p, 0, 0, &mine);
    pid_t pid = holder_run(&h);
    cr_assert_eq(hear_int(h.up[0]), -EPERM, "another uid's retain");
    kill_holder(&h, pid);
    cr_assert_eq(status_u64(&d, "buffers.retained"), 0);
    cr_assert_eq(shmref_release(mine), 0);
    shmref_buf *b;
    cr_assert_eq(shmref_acquire(c, &h.desc, &b), -ENOENT, "nothing kept it");
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

Test(retain, nothing_held_or_published_is_refused)
{
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    shmref_buf *mine, *b;
    shmref_desc desc = publish(p, 0, 0, &mine);

    cr_assert_eq(shmref_retain(c, &desc, 60000), -EPERM, "c holds nothing: %s", shmref_errmsg(c));
    cr_assert(strstr(shmref_errmsg(c), "does not hold"), "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_acquire(c, &desc, &b), 0);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_retain(c, &desc, 60000), -EPERM, "c released it (its mapping is only cached)");
    cr_assert_eq(shmref_retain(c, &desc, 0), -EINVAL);
    cr_assert_eq(shmref_retain(NULL, &desc, 1), -EINVAL);
    cr_assert_eq(shmref_retain(c, NULL, 1), -EINVAL);

    shmref_desc bogus = desc;
    bogus.token[9] ^= 0x40;
    cr_assert_eq(shmref_retain(c, &bogus, 60000), -ENOENT, "no such token: %s", shmref_errmsg(c));
    cr_assert(strstr(shmref_errmsg(c), "no published buffer"), "%s", shmref_errmsg(c));

    /* leased, not published: its producer holds it, but there is no publish to retain */
    int raw = rv_connect(&d, PROTO_FEAT_RETAIN);
    struct proto_msg m = { .op = PROTO_OP_RETAIN, .id = 7 };
    uint64_t handle = rv_lease(raw, 6, SIZE, m.u.retain.token);
    m.u.retain.keep_ms = 60000;
    rv_send(raw, &m);
    rv_expect_error(raw, 5000, 7, ENOENT, NULL, 0, "the retain of an unpublished lease");
    rv_release_send(raw, 8, handle);
    close(raw);

    /* the producer holds its publish: it may retain it */
    cr_assert_eq(shmref_retain(p, &desc, 60000), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(shmref_release(mine), 0);
    cr_assert_eq(status_u64(&d, "buffers.retained"), 1);
    acquire_checks(c, &desc, "retained by its producer");
    /* c mapped it before: that acquire was a ledger take, whose one-way TOOK ends the
     * retention once the daemon reads it (a round trip makes sure it has) */
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_acquire(c, &desc, &b), -ENOENT, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_retain(p, &desc, 60000), -ENOENT, "gone");
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- a flood costs the flooder's own quota ---- */

struct flooder {
    int up[2];
};

/* uid 65534, quota 1 MiB: 4 leases of 256 KiB (all of it), published, each retained
 * 10000 times, then it says so and is killed. */
static int flooder_main(void *arg)
{
    struct flooder *f = arg;
    shmref_conn *c;
    close(f->up[0]);
    if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
        return 10;
    if (shmref_connect(d.socket, &c) < 0)
        return 11;
    for (int i = 0; i < 4; i++) {
        shmref_buf *b;
        shmref_desc desc;
        if (shmref_lease(c, SIZE, &b) < 0 || shmref_publish(b, SIZE, 0, NULL, 0, &desc) < 0)
            return 12;
        for (int k = 0; k < 10000; k++)
            if (shmref_retain(c, &desc, UINT32_MAX) < 0) {
                fprintf(stderr, "flooder: retain %d: %s\n", k, shmref_errmsg(c));
                return 13;
            }
    }
    if (write(f->up[1], &(int){ 1 }, sizeof(int)) != sizeof(int))
        return 14;
    pause();
    return 0;
}

/* uid 65534 again: its whole quota, which its own retentions fill, is its to lease */
static int releaser_main(void *arg)
{
    (void)arg;
    shmref_conn *c;
    shmref_buf *b;
    if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
        return 10;
    if (shmref_connect(d.socket, &c) < 0)
        return 11;
    if (shmref_lease(c, 1024 * KiB, &b) < 0) {
        fprintf(stderr, "uid 65534 lease: %s\n", shmref_errmsg(c));
        return 12;
    }
    shmref_close(c);
    return 0;
}

Test(retain, a_flood_costs_only_the_flooders_quota, .timeout = 240)
{
    daemon_start(&d, "--tenant-quota", "1M", "--socket-mode", "0666", NULL);
    struct flooder f;
    cr_assert_eq(pipe(f.up), 0);
    pid_t pid = child_run(flooder_main, &f);
    close(f.up[1]);
    cr_assert_eq(hear_int(f.up[0]), 1, "the flooder failed (see its line above)");
    cr_assert_eq(kill(pid, SIGKILL), 0);
    cr_assert_eq(child_wait(pid), 128 + SIGKILL);
    cr_assert_eq(status_u64(&d, "buffers.retained"), 4, "its 4 buffers outlive it");
    cr_assert_eq(status_u64(&d, "buffers.retained_bytes"), 4 * SIZE);

    /* root's quota is untouched: all of it is root's to lease */
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, 1024 * KiB, &b), 0, "root's own 1 MiB: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(status_u64(&d, "buffers.retained"), 4, "root's lease reclaims nothing of 65534's");
    cr_assert_eq(status_u64(&d, "counters.refused_quota"), 0);
    /* and the flooder's uid gets its quota back: its lease reclaims the retentions */
    cr_assert_eq(child_wait(child_run(releaser_main, NULL)), 0, "uid 65534's lease (see its line above)");
    cr_assert_eq(status_u64(&d, "buffers.retained"), 0);
    cr_assert_eq(status_u64(&d, "buffers.reclaimed"), 4);
    shmref_close(c);
    daemon_stop(&d);
}
