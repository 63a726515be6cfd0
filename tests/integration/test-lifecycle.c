/* SPDX-License-Identifier: MIT */
/* test-lifecycle.c: the lease lifecycle end to end, against a real shmrefd and real
 * client processes: bytes across processes, reference counting, reclaim on SIGKILL,
 * retention, quotas, tenants, recycling and the mapping cache, and no leaks over time. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* A failed assertion ends the test before it tells its children "done": they are killed
 * and reaped (they would wait on their pipe, whose write end they hold too, until ctest's
 * timeout). */
TestSuite(lifecycle, .fini = reap_children);

#define MB80 (80u * 1000 * 1000)
#define CLASS80 81788928u /* 78 MiB: 80 MB rounded up to a 2 MiB step (32 per power of two) */

/* A pipe pair to talk to a child: the child writes to up, reads from down. */
struct link {
    int up[2], down[2];
};

static void link_open(struct link *l)
{
    cr_assert_eq(pipe(l->up), 0);
    cr_assert_eq(pipe(l->down), 0);
}

static void say(int fd, const char *msg)
{
    size_t n = strlen(msg) + 1;
    cr_assert_eq(write(fd, msg, n), (ssize_t)n);
}

/* hear: one NUL-terminated message, or "" at EOF. */
static void hear(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, 1);
        if (r <= 0 || buf[n] == '\0')
            break;
        n++;
    }
    buf[n] = '\0';
}


static struct daemon d;

/* ---- an 80 MB buffer written by one process is read byte-identical by another ---- */

struct producer_arg {
    struct link *l;
    size_t size;
    uint32_t seed, keep_ms;
    uint32_t max_acquires;
};

/* producer: lease, fill, publish, send the descriptor text up; then wait for "done". */
static int producer(void *p)
{
    struct producer_arg *a = p;
    shmref_conn *c;
    shmref_buf *b;
    shmref_desc desc;
    char text[SHMREF_DESC_TEXT_MAX], cmd[16];
    if (shmref_connect(d.socket, &c) < 0 || shmref_lease(c, a->size, &b) < 0)
        return 10;
    fill_pattern(shmref_buf_data(b), a->size, a->seed);
    if (shmref_publish_ex(b, a->size, a->keep_ms, a->max_acquires, 0, "f8[10000000]", 12, &desc) < 0)
        return 11;
    shmref_desc_to_text(&desc, text, sizeof(text));
    if (write(a->l->up[1], text, strlen(text) + 1) < 0)
        return 12;
    hear(a->l->down[0], cmd, sizeof(cmd));
    shmref_close(c);
    return strcmp(cmd, "done") == 0 || a->keep_ms ? 0 : 13;
}

Test(lifecycle, eighty_megabytes_cross_process_identical)
{
    daemon_start(&d, NULL);
    struct link l;
    link_open(&l);
    struct producer_arg a = { &l, MB80, 42, 0, 0 };
    pid_t pid = child_run(producer, &a);
    char text[SHMREF_DESC_TEXT_MAX];
    hear(l.up[0], text, sizeof(text));
    cr_assert_eq(strncmp(text, "shmref1:", 8), 0, "descriptor text: '%s'", text);

    shmref_conn *c = connect_ok(&d);
    shmref_desc desc;
    shmref_buf *b;
    cr_assert_eq(shmref_desc_from_text(text, &desc), 0);
    cr_assert_eq(desc.size, MB80);
    cr_assert_eq(shmref_acquire(c, &desc, &b), 0, "acquire: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_buf_size(b), MB80);
    cr_assert_eq(shmref_buf_capacity(b), CLASS80);
    cr_assert_eq(shmref_buf_writable(b), 0);
    size_t mlen;
    const char *meta = shmref_buf_meta(b, &mlen);
    cr_assert_eq(mlen, 12);
    cr_assert_eq(memcmp(meta, "f8[10000000]", 12), 0);
    cr_assert_eq(check_pattern(shmref_buf_data(b), MB80, 42), -1, "bytes differ");
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), CLASS80);
    cr_assert_eq(shmref_release(b), 0);
    say(l.down[1], "done");
    cr_assert_eq(child_wait(pid), 0);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 1000), 0);
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- three consumers: back to the pool only after all three release ---- */

struct consumer_arg {
    struct link *l;
    const char *text;
    uint32_t seed;
};

static int consumer(void *p)
{
    struct consumer_arg *a = p;
    shmref_conn *c;
    shmref_buf *b;
    shmref_desc desc;
    char cmd[16];
    if (shmref_connect(d.socket, &c) < 0 || shmref_desc_from_text(a->text, &desc) < 0 ||
        shmref_acquire(c, &desc, &b) < 0)
        return 20;
    if (check_pattern(shmref_buf_data(b), shmref_buf_size(b), a->seed) != -1)
        return 21;
    say(a->l->up[1], "acquired");
    hear(a->l->down[0], cmd, sizeof(cmd));
    if (shmref_release(b) < 0 || shmref_ping(c) < 0) /* the ping: the release is done */
        return 22;
    say(a->l->up[1], "released");
    hear(a->l->down[0], cmd, sizeof(cmd));
    shmref_close(c);
    return 0;
}

/* counter: one of libshmref's counters of c. */
static uint64_t counter(shmref_conn *c, const char *name)
{
    uint64_t v = 0;
    cr_assert_eq(shmref_conn_counter(c, name, &v), 0, "%s", name);
    return v;
}

enum consumers_round { BY_LEASE_MANY, DAEMON_LEASE_FOR_TABLE, TABLE_LEASE };

/* three_consumers: one round: c leases (as round says) 1 MiB, publishes it, three child
 * processes (connections of their own, which do not map it: their acquires ask the
 * daemon) acquire it; c lets go first, then each child in turn. Until the last release
 * the buffer is held (the daemon holds it for the acquirers): neither warm in the pool nor
 * free in the table. Returns the buffer's address in c. */
static void *three_consumers(shmref_conn *c, enum consumers_round round, uint32_t seed)
{
    shmref_buf *b;
    shmref_desc desc;
    char text[SHMREF_DESC_TEXT_MAX], msg[16];
    const size_t size = 1 << 20;
    uint64_t acquires = status_u64(&d, "counters.acquires");
    if (round == BY_LEASE_MANY)
        cr_assert_eq(shmref_lease_many(c, &size, 1, &b), 0, "%s", shmref_errmsg(c));
    else
        cr_assert_eq(shmref_lease(c, size, &b), 0, "%s", shmref_errmsg(c));
    void *data = shmref_buf_data(b);
    fill_pattern(data, size, seed);
    cr_assert_eq(shmref_publish(b, size, 0, NULL, 0, &desc), 0);
    shmref_desc_to_text(&desc, text, sizeof(text));

    struct link l[3];
    struct consumer_arg a[3];
    pid_t pid[3];
    for (int i = 0; i < 3; i++) {
        link_open(&l[i]);
        a[i] = (struct consumer_arg){ &l[i], text, seed };
        pid[i] = child_run(consumer, &a[i]);
        hear(l[i].up[0], msg, sizeof(msg));
        cr_assert_str_eq(msg, "acquired");
    }
    cr_assert_eq(status_u64(&d, "counters.acquires"), acquires + 3, "every acquire asked the daemon");
    cr_assert_eq(shmref_release(b), 0); /* the producer lets go first */
    cr_assert_eq(shmref_ping(c), 0);    /* (a release of a daemon lease is one-way) */
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(status_u64(&d, "pool.bytes_leased"), size, "released too early (after %d)", i);
        cr_assert_eq(status_u64(&d, "buffers.live"), 1);
        cr_assert_eq(status_u64(&d, "pool.bytes_warm"), 0);
        cr_assert_eq(status_u64(&d, "pool.bytes_tables"), 0, "free in the table too early (after %d)", i);
        cr_assert_eq(status_u64(&d, "table.lent"), 0);
        say(l[i].down[1], "release");
        hear(l[i].up[0], msg, sizeof(msg));
        cr_assert_str_eq(msg, "released");
    }
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    if (round == BY_LEASE_MANY) {
        cr_assert_eq(status_u64(&d, "buffers.live"), 0);
        cr_assert_eq(status_u64(&d, "pool.bytes_warm"), size, "the buffer should be back, warm");
        cr_assert_eq(status_u64(&d, "pool.bytes_tables"), 0, "lease_many's buffers never join the table");
    } else {
        /* a lease of the default path: the buffer is back in the uid's table, free */
        cr_assert_eq(status_u64(&d, "pool.bytes_warm"), 0);
        cr_assert_eq(status_u64(&d, "pool.bytes_tables"), size, "the buffer should be back in the table");
        cr_assert_eq(status_u64(&d, "table.members"), 1);
        cr_assert_eq(status_u64(&d, "table.lent"), 1);
        cr_assert_eq(status_u64(&d, "table.grants"), 1);
    }
    for (int i = 0; i < 3; i++) {
        say(l[i].down[1], "exit");
        cr_assert_eq(child_wait(pid[i]), 0);
    }
    return data;
}

/* The pool's mechanism (reached by shmref_lease_many, whose buffers never join a table),
 * then the default path's: a daemon lease for the table (the table is empty) and a lease
 * popped from the table, published in it; in both the buffer is free again, in the table,
 * only after all three consumers released it, and is reused (same pages) by the next
 * lease; when the uid's last connection closes, it goes back to the pool, warm. */
Test(lifecycle, three_consumers_all_release_before_reuse)
{
    const size_t size = 1 << 20;
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    three_consumers(c, BY_LEASE_MANY, 7);
    three_consumers(c, DAEMON_LEASE_FOR_TABLE, 8);
    cr_assert_eq(counter(c, "table_leases"), 0);
    cr_assert_eq(status_u64(&d, "table.takes"), 0);
    void *data = three_consumers(c, TABLE_LEASE, 9);
    cr_assert_eq(counter(c, "table_leases"), 1, "the lease was the table's");
    cr_assert_eq(counter(c, "table_publishes"), 1, "published in the table");
    cr_assert_eq(status_u64(&d, "table.takes"), 1, "the daemon held it in the table for the acquirers");
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 1);
    /* reused: the next lease is the same buffer, popped from the table, no message */
    uint64_t sent = counter(c, "sent");
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, size, &b), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(counter(c, "table_leases"), 2);
    cr_assert_eq(counter(c, "sent"), sent);
    cr_assert_eq(shmref_buf_data(b), data, "the same buffer, its mapping kept");
    cr_assert_eq(check_pattern(shmref_buf_data(b), size, 9), -1, "the same pages");
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);
    /* the uid's last connection is gone: its table's buffer is the pool's, warm */
    cr_assert_eq(wait_status(&d, "pool.bytes_warm", size, 5000), size, "the buffer should be back, warm");
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    daemon_stop(&d);
}

/* ---- a holder killed with SIGKILL is reclaimed within a second ---- */

static int holder(void *p)
{
    struct link *l = p;
    shmref_conn *c;
    shmref_buf *b;
    shmref_desc desc;
    if (shmref_connect(d.socket, &c) < 0)
        return 30;
    for (int i = 0; i < 3; i++)
        if (shmref_lease(c, 4u << 20, &b) < 0)
            return 31;
    if (shmref_publish(b, 4u << 20, 0, NULL, 0, &desc) < 0)
        return 32;
    say(l->up[1], "holding");
    pause();
    return 0;
}

Test(lifecycle, sigkill_of_holder_is_reclaimed_within_one_second)
{
    daemon_start(&d, NULL);
    struct link l;
    char msg[16];
    link_open(&l);
    pid_t pid = child_run(holder, &l);
    hear(l.up[0], msg, sizeof(msg));
    cr_assert_str_eq(msg, "holding");
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 12u << 20);
    long t0 = now_ms();
    kill(pid, SIGKILL);
    cr_assert_eq(child_wait(pid), 128 + SIGKILL);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 1000), 0, "not reclaimed within 1 s");
    cr_assert_lt(now_ms() - t0, 1000);
    cr_assert_eq(status_u64(&d, "counters.reclaimed_leases"), 3);
    cr_assert_eq(status_u64(&d, "tenants_total"), 0, "the tenant's charge should be gone");
    daemon_stop(&d);
}

/* ---- retention: the producer exits, a consumer acquires later; expiry is ENOENT ---- */

Test(lifecycle, retention_outlives_producer_then_expires)
{
    daemon_start(&d, NULL);
    struct link l;
    char text[SHMREF_DESC_TEXT_MAX];
    link_open(&l);
    struct producer_arg a = { &l, 100000, 9, 2000, 1 };
    pid_t pid = child_run(producer, &a);
    hear(l.up[0], text, sizeof(text));
    say(l.down[1], "done");
    cr_assert_eq(child_wait(pid), 0); /* the producer is gone */
    cr_assert_eq(status_u64(&d, "buffers.retained"), 1);

    shmref_conn *c = connect_ok(&d);
    shmref_desc desc;
    shmref_buf *b;
    cr_assert_eq(shmref_desc_from_text(text, &desc), 0);
    cr_assert_eq(shmref_acquire(c, &desc, &b), 0, "acquire after the producer left: %s", shmref_errmsg(c));
    cr_assert_eq(check_pattern(shmref_buf_data(b), 100000, 9), -1);
    cr_assert_eq(status_u64(&d, "buffers.retained"), 0, "max_acquires 1: the first acquire ends the retention");
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_acquire(c, &desc, &b), -ENOENT, "released by all: gone");

    /* Nobody acquires: after keep_ms the descriptor is dead. */
    struct link l2;
    link_open(&l2);
    struct producer_arg a2 = { &l2, 100000, 9, 150, 0 };
    pid = child_run(producer, &a2);
    hear(l2.up[0], text, sizeof(text));
    say(l2.down[1], "done");
    cr_assert_eq(child_wait(pid), 0);
    usleep(400 * 1000);
    cr_assert_eq(shmref_desc_from_text(text, &desc), 0);
    cr_assert_eq(shmref_acquire(c, &desc, &b), -ENOENT);
    cr_assert(strstr(shmref_errmsg(c), "retention") != NULL, "message: %s", shmref_errmsg(c));
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    cr_assert_eq(status_u64(&d, "counters.retentions_expired"), 1);
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- fan-out: the retention serves every consumer within its time, up to max_acquires ---- */

static int consumer_checks(void *p)
{
    const char *text = p;
    shmref_conn *c;
    shmref_desc desc;
    shmref_buf *b;
    if (shmref_connect(d.socket, &c) < 0 || shmref_desc_from_text(text, &desc) < 0)
        return 20;
    int r = shmref_acquire(c, &desc, &b);
    if (r == -ENOENT)
        return 2;
    if (r < 0)
        return 21;
    int ok = check_pattern(shmref_buf_data(b), shmref_buf_size(b), 5) == -1;
    shmref_close(c);
    return ok ? 0 : 22;
}

/* Regression (issue 8 item 13): retention ended at the first acquire, so a producer that
 * exits could not fan out to several consumers. */
Test(lifecycle, retention_fans_out_to_every_consumer_then_caps)
{
    daemon_start(&d, "--socket-mode", "0666", NULL);
    char text[SHMREF_DESC_TEXT_MAX];
    struct link l;
    link_open(&l);
    struct producer_arg a = { &l, 50000, 5, 60000, 0 };
    pid_t pid = child_run(producer, &a);
    hear(l.up[0], text, sizeof(text));
    say(l.down[1], "done");
    cr_assert_eq(child_wait(pid), 0); /* the producer is gone */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(child_wait(child_run(consumer_checks, text)), 0, "consumer %d of 3", i + 1);
    cr_assert_eq(status_u64(&d, "buffers.retained"), 1, "still retained for the next consumer");

    /* max_acquires 2: the second acquire ends the retention; the third finds nothing. */
    struct link l2;
    link_open(&l2);
    struct producer_arg a2 = { &l2, 50000, 5, 60000, 2 };
    pid = child_run(producer, &a2);
    hear(l2.up[0], text, sizeof(text));
    say(l2.down[1], "done");
    cr_assert_eq(child_wait(pid), 0);
    cr_assert_eq(child_wait(child_run(consumer_checks, text)), 0);
    cr_assert_eq(child_wait(child_run(consumer_checks, text)), 0);
    cr_assert_eq(child_wait(child_run(consumer_checks, text)), 2, "a third acquire after max_acquires 2: ENOENT");
    cr_assert_eq(status_u64(&d, "buffers.retained"), 1, "only the first buffer is still retained");
    daemon_stop(&d);
}

/* ---- quotas: EDQUOT with the numbers, and everyone else is still served ---- */

static int other_uid_leases(void *p)
{
    (void)p;
    shmref_conn *c;
    shmref_buf *b;
    if (setgid(65534) < 0 || setuid(65534) < 0)
        return 40;
    if (shmref_connect(d.socket, &c) < 0)
        return 41;
    if (shmref_lease(c, 1 << 20, &b) < 0)
        return 42;
    shmref_close(c);
    return 0;
}

Test(lifecycle, over_quota_is_edquot_and_others_are_served)
{
    daemon_start(&d, "--tenant-quota", "2M", "--pool-size", "64M", "--socket-mode", "0666", NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b1, *b2;
    cr_assert_eq(shmref_lease(c, 2 << 20, &b1), 0);
    cr_assert_eq(shmref_lease(c, 4096, &b2), -EDQUOT);
    const char *m = shmref_errmsg(c);
    cr_assert(strstr(m, "quota exceeded for uid 0") && strstr(m, "2097152") && strstr(m, "4096"),
              "message should name the numbers: %s", m);
    cr_assert_eq(status_u64(&d, "counters.refused_quota"), 1);
    cr_assert_eq(shmref_ping(c), 0, "the refused client is still connected");

    /* Another tenant is not affected by uid 0's quota. */
    cr_assert_eq(child_wait(child_run(other_uid_leases, NULL)), 0);

    /* Once the holder lets go, the same tenant can lease again. */
    cr_assert_eq(shmref_release(b1), 0);
    cr_assert_eq(shmref_ping(c), 0); /* releases are one-way: now it is done */
    shmref_conn *c2 = connect_ok(&d);
    cr_assert_eq(shmref_lease(c2, 2 << 20, &b2), 0, "%s", shmref_errmsg(c2));
    shmref_close(c2);
    shmref_close(c);
    daemon_stop(&d);
}

Test(lifecycle, full_pool_is_enospc_with_numbers)
{
    daemon_start(&d, "--pool-size", "4M", "--tenant-quota", "64M", "--max-lease-size", "4M", NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b1, *b2;
    cr_assert_eq(shmref_lease(c, 3 << 20, &b1), 0);
    cr_assert_eq(shmref_lease(c, 2 << 20, &b2), -ENOSPC);
    cr_assert(strstr(shmref_errmsg(c), "pool full") && strstr(shmref_errmsg(c), "4194304"),
              "message: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(b1), 0);
    /* The warm 3 MiB buffer is evicted to make room for another class. */
    cr_assert_eq(shmref_lease(c, 2 << 20, &b2), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(status_u64(&d, "counters.buffers_evicted"), 1);
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- recycling: within a tenant, warm and mapped once; across tenants, retired ---- */

/* The pool's recycling through shmref_lease_many (its buffers never join a table); then
 * the default path's: a shmref_lease's buffer joins the uid's table at its release and the
 * next lease of its class is popped from there, no message: same mapping, same pages. */
Test(lifecycle, recycles_within_tenant_and_keeps_the_mapping)
{
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    size_t size = 1 << 20;
    cr_assert_eq(shmref_lease_many(c, &size, 1, &b), 0);
    void *first = shmref_buf_data(b);
    memset(first, 0xab, 1 << 20);
    cr_assert_eq(shmref_release(b), 0);
    size = 1000000; /* same class */
    cr_assert_eq(shmref_lease_many(c, &size, 1, &b), 0);
    cr_assert_eq(shmref_buf_data(b), first, "the cached mapping should be reused");
    cr_assert_eq(((unsigned char *)shmref_buf_data(b))[12345], 0xab, "same pages, still warm");
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 1);
    cr_assert_eq(status_u64(&d, "counters.buffers_recycled"), 1);
    cr_assert_eq(shmref_release(b), 0);
    /* the table: the first lease is the daemon's (recycled from the pool) */
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0);
    cr_assert_eq(shmref_buf_data(b), first, "the cached mapping should be reused");
    size_t cap = shmref_buf_capacity(b);
    memset(first, 0xcd, 1 << 20);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0); /* the release is done: the buffer is in the table */
    cr_assert_eq(status_u64(&d, "table.grants"), 1);
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), cap, "still charged: the table's");
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    uint64_t sent = counter(c, "sent");
    cr_assert_eq(shmref_lease(c, 1000000, &b), 0); /* same class */
    cr_assert_eq(counter(c, "table_leases"), 1, "popped from the table");
    cr_assert_eq(counter(c, "sent"), sent, "no message");
    cr_assert_eq(shmref_buf_data(b), first, "the cached mapping should be reused");
    cr_assert_eq(((unsigned char *)shmref_buf_data(b))[12345], 0xcd, "same pages, still warm");
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 1);
    cr_assert_eq(status_u64(&d, "counters.buffers_recycled"), 2, "the table's reuse is not the pool's");
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(c);
    daemon_stop(&d);
}

static int other_uid_acquires(void *p)
{
    const char *text = p;
    shmref_conn *c;
    shmref_buf *b;
    shmref_desc desc;
    if (setgid(65534) < 0 || setuid(65534) < 0)
        return 50;
    if (shmref_connect(d.socket, &c) < 0 || shmref_desc_from_text(text, &desc) < 0)
        return 51;
    if (shmref_acquire(c, &desc, &b) < 0)
        return 52;
    if (check_pattern(shmref_buf_data(b), shmref_buf_size(b), 5) != -1)
        return 53;
    shmref_close(c);
    return 0;
}

Test(lifecycle, buffer_seen_by_another_tenant_is_retired_not_recycled)
{
    daemon_start(&d, "--socket-mode", "0666", NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    shmref_desc desc;
    char text[SHMREF_DESC_TEXT_MAX];
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0);
    fill_pattern(shmref_buf_data(b), 1 << 20, 5);
    cr_assert_eq(shmref_publish(b, 1 << 20, 0, NULL, 0, &desc), 0);
    shmref_desc_to_text(&desc, text, sizeof(text));
    cr_assert_eq(child_wait(child_run(other_uid_acquires, text)), 0);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0); /* releases are one-way: now it is done */
    cr_assert_eq(status_u64(&d, "counters.buffers_retired"), 1);
    cr_assert_eq(status_u64(&d, "pool.bytes_warm"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_allocated"), 0);
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0);
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 2, "a fresh buffer, not the seen one");
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- 1,000 cycles leave the daemon's fds and leased bytes where they started ---- */

Test(lifecycle, thousand_cycles_leak_nothing, .timeout = 120)
{
    daemon_start(&d, NULL);
    shmref_conn *prod = connect_ok(&d), *cons = connect_ok(&d);
    shmref_buf *b, *r;
    shmref_desc desc;
    /* Releases need no reply: a ping on each connection is the point where the daemon
     * has handled them, before anything is counted from outside. */
    /* One warm-up cycle creates the buffer and its read-only fd. */
    for (int i = 0; i <= 1000; i++) {
        if (i == 1) {
            cr_assert_eq(shmref_ping(prod), 0);
            cr_assert_eq(shmref_ping(cons), 0);
            cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
        }
        cr_assert_eq(shmref_lease(prod, 65536, &b), 0, "cycle %d: %s", i, shmref_errmsg(prod));
        ((uint32_t *)shmref_buf_data(b))[0] = (uint32_t)i;
        cr_assert_eq(shmref_publish(b, 65536, 0, NULL, 0, &desc), 0);
        cr_assert_eq(shmref_acquire(cons, &desc, &r), 0, "cycle %d: %s", i, shmref_errmsg(cons));
        cr_assert_eq(((const uint32_t *)shmref_buf_data(r))[0], (uint32_t)i);
        cr_assert_eq(shmref_release(r), 0);
        cr_assert_eq(shmref_release(b), 0);
        /* The consumer's release is on another connection: a round trip there makes sure
         * the daemon has it before the producer's next lease (publish is one-way now, so
         * nothing else orders them), or that lease may find the buffer still held. */
        cr_assert_eq(shmref_ping(cons), 0);
    }
    cr_assert_eq(shmref_ping(prod), 0);
    cr_assert_eq(shmref_ping(cons), 0);
    int fds_after_warmup = daemon_fds(&d);
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(shmref_lease(prod, 65536, &b), 0);
        cr_assert_eq(shmref_publish(b, 65536, 0, NULL, 0, &desc), 0);
        cr_assert_eq(shmref_acquire(cons, &desc, &r), 0);
        cr_assert_eq(shmref_release(r), 0);
        cr_assert_eq(shmref_release(b), 0);
        /* The consumer's release is on another connection: a round trip there makes sure
         * the daemon has it before the producer's next lease (publish is one-way now, so
         * nothing else orders them), or that lease may find the buffer still held. */
        cr_assert_eq(shmref_ping(cons), 0);
    }
    cr_assert_eq(shmref_ping(prod), 0);
    cr_assert_eq(shmref_ping(cons), 0);
    cr_assert_eq(daemon_fds(&d), fds_after_warmup, "the daemon's fd count moved");
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    uint64_t created = status_u64(&d, "counters.buffers_created");
    cr_assert_eq(created, 1, "every cycle should recycle (%llu buffers created)", (unsigned long long)created);
    shmref_close(prod);
    shmref_close(cons);
    daemon_stop(&d);
}

/* ---- start-up refusals name the numbers; SIGTERM with holders exits 0 ---- */

Test(lifecycle, refuses_to_start_when_pool_does_not_fit)
{
    char dir[] = "/tmp/shmref-test-XXXXXX", sock[128], log[128], line[1024] = "";
    cr_assert_not_null(mkdtemp(dir));
    snprintf(sock, sizeof(sock), "%s/s.sock", dir);
    snprintf(log, sizeof(log), "%s/log", dir);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        execl(SHMREFD_BIN, SHMREFD_BIN, "--socket", sock, "--pool-size", "1000T", (char *)NULL);
        _exit(127);
    }
    cr_assert_eq(child_wait(pid), 1);
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(line, sizeof(line), f));
    fclose(f);
    cr_assert(strstr(line, "1099511627776000 bytes") && strstr(line, "available"), "log: %s", line);
    cr_assert_eq(access(sock, F_OK), -1, "no socket is left behind");
    unlink(log);
    rmdir(dir);
}

Test(lifecycle, sigterm_with_holders_and_retention_exits_cleanly)
{
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0);
    cr_assert_eq(shmref_publish(b, 1 << 20, 60000, NULL, 0, &desc), 0);
    cr_assert_eq(shmref_lease(c, 3 << 20, &b), 0);
    daemon_stop(&d); /* asserts exit status 0 and no libuv handle left open */
    cr_assert_eq(shmref_ping(c), -ECONNRESET);
    shmref_close(c);
}

/* ---- batches: lease_many pipelines (replies come back out of order when some
 * buffers are new), release_many needs no round trip ---- */

Test(lifecycle, lease_many_and_release_many)
{
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    enum { N = 100 };
    size_t sizes[N];
    shmref_buf *bufs[N];
    /* Warm a few 64 KiB buffers so that the batch mixes warm (immediate) and new
     * (created off the loop, answered later) leases. */
    shmref_buf *warm[10];
    for (int i = 0; i < 10; i++)
        cr_assert_eq(shmref_lease(c, 65536, &warm[i]), 0);
    cr_assert_eq(shmref_release_many(warm, 10), 0);
    for (int i = 0; i < N; i++)
        sizes[i] = i % 2 ? 65536 : (size_t)(i + 1) * 8192;
    cr_assert_eq(shmref_lease_many(c, sizes, N, bufs), 0, "%s", shmref_errmsg(c));
    for (int i = 0; i < N; i++) {
        cr_assert_not_null(bufs[i]);
        cr_assert_eq(shmref_buf_size(bufs[i]), sizes[i], "slot %d got the wrong lease", i);
        memset(shmref_buf_data(bufs[i]), i, sizes[i]);
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(((unsigned char *)shmref_buf_data(bufs[i]))[sizes[i] - 1], (unsigned char)i,
                     "leases %d and another share memory", i);
    cr_assert_eq(status_u64(&d, "buffers.leases"), N);
    cr_assert_eq(shmref_release_many(bufs, N), 0);
    for (int i = 0; i < N; i++)
        cr_assert_null(bufs[i]);
    cr_assert_eq(shmref_ping(c), 0); /* after the releases, in order */
    cr_assert_eq(status_u64(&d, "buffers.leases"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    shmref_close(c);
    daemon_stop(&d);
}

Test(lifecycle, lease_many_is_all_or_nothing)
{
    daemon_start(&d, "--tenant-quota", "1M", "--pool-size", "64M", NULL);
    shmref_conn *c = connect_ok(&d);
    size_t sizes[40];
    shmref_buf *bufs[40];
    for (int i = 0; i < 40; i++)
        sizes[i] = 65536; /* 16 fit in the quota, 24 do not */
    cr_assert_eq(shmref_lease_many(c, sizes, 40, bufs), -EDQUOT);
    cr_assert(strstr(shmref_errmsg(c), "quota exceeded"), "%s", shmref_errmsg(c));
    for (int i = 0; i < 40; i++)
        cr_assert_null(bufs[i]);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(status_u64(&d, "buffers.leases"), 0, "the leases made were given back");
    cr_assert_eq(shmref_lease_many(c, sizes, 16, bufs), 0, "exactly the quota: %s", shmref_errmsg(c));
    shmref_close(c);
    daemon_stop(&d);
}

/* Regression: an acquire refused for a wrong size used to leave the fd-once state out of
 * step (the fd was sent, not kept, not forgotten), so the next acquire failed. */
Test(lifecycle, wrong_size_descriptor_then_right_one)
{
    daemon_start(&d, NULL);
    shmref_conn *prod = connect_ok(&d), *cons = connect_ok(&d);
    shmref_buf *b, *r;
    shmref_desc desc, wrong;
    cr_assert_eq(shmref_lease(prod, 4096, &b), 0);
    cr_assert_eq(shmref_publish(b, 4096, 0, NULL, 0, &desc), 0);
    wrong = desc;
    wrong.size = 1234;
    cr_assert_eq(shmref_acquire(cons, &wrong, &r), -EINVAL);
    cr_assert(strstr(shmref_errmsg(cons), "1234"), "%s", shmref_errmsg(cons));
    cr_assert_eq(shmref_acquire(cons, &desc, &r), 0, "%s", shmref_errmsg(cons));
    cr_assert_eq(shmref_release(r), 0);
    cr_assert_eq(shmref_lease(cons, 0, &r), -EINVAL);
    cr_assert(strstr(shmref_errmsg(cons), "size must be"), "argument errors have a message too");
    shmref_close(prod);
    shmref_close(cons);
    daemon_stop(&d);
}

/* Regression: the daemon keeps its buffers' fds within three quarters of RLIMIT_NOFILE,
 * evicting warm buffers first, so a client cannot leave the daemon unable to accept. */
Test(lifecycle, buffers_stay_within_the_fd_limit, .timeout = 120)
{
    struct rlimit rl = { 512, 512 }; /* the daemon inherits it: a budget of 320 buffer fds */
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    daemon_start(&d, NULL);
    shmref_conn *c = connect_ok(&d);
    enum { N = 3000 };
    static shmref_buf *bufs[N];
    static size_t sizes[N];
    /* 3000 distinct buffers of 8 KiB, in sizes that rotate over 8 classes. */
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < N; i++)
            sizes[i] = 4096u * (1 + (size_t)((i + round) % 4));
        int r = shmref_lease_many(c, sizes, N, bufs);
        cr_assert_eq(r, -EMFILE, "3000 buffers held at once pass the fd budget: %d", r);
        cr_assert(strstr(shmref_errmsg(c), "fd limit"), "%s", shmref_errmsg(c));
        /* What fits still works, evicting warm buffers of other classes as needed. */
        cr_assert_eq(shmref_lease_many(c, sizes, 200, bufs), 0, "%s", shmref_errmsg(c));
        shmref_release_many(bufs, 200);
    }
    cr_assert_leq(status_u64(&d, "counters.buffers_created") - status_u64(&d, "counters.buffers_retired"), 320);
    shmref_close(c);
    /* Whatever happened, a new client still gets in and is served. */
    shmref_conn *c2 = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c2, 1u << 20, &b), 0, "%s", shmref_errmsg(c2));
    shmref_close(c2);
    daemon_stop(&d);
}
