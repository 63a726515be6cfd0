/* SPDX-License-Identifier: MIT */
/* test-waits.c: protocol version 2 waits through a real shmrefd on a temporary socket,
 * spoken raw by real processes of several uids: acquires parked for a publish (capped by
 * max-leases, while the daemon serves everyone else), leases parked for quota or pool
 * space (FIFO within a tenant, never in another tenant's way, dropped with their
 * connection, a timeout that names the numbers), and a fast producer with a slow
 * consumer that slows to its pace instead of being refused. */
#include <criterion/criterion.h>

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rawv2.h"

TestSuite(waits, .fini = reap_children);

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

static int become(uid_t uid)
{
    return setgroups(0, NULL) == 0 && setgid(uid) == 0 && setuid(uid) == 0 ? 0 : -1;
}

/* ---- a child's side of the wire: plain return codes (no Criterion in children) ---- */

static uint8_t cbuf[PROTO_MAX_REPLY];

/* c_recv: the next message within ms, decoded; its fd (if any) into *ret_fd. */
static int c_recv(int fd, int ms, struct proto_msg *m, int *ret_fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    if (ret_fd)
        *ret_fd = -1;
    if (poll(&p, 1, ms) != 1)
        return -ETIMEDOUT;
    ssize_t n = rawclient_recv(fd, cbuf, sizeof(cbuf), ret_fd);
    const char *why;
    if (n <= 0 || proto_decode(cbuf, (size_t)n, sizeof(cbuf), m, &why) < 0)
        return -EPROTO;
    return 0;
}

static int c_send(int fd, const struct proto_msg *m)
{
    uint8_t buf[1024];
    int n = proto_encode(m, buf, sizeof(buf));
    return n > 0 ? rawclient_send(fd, buf, (size_t)n) : -EMSGSIZE;
}

static int c_connect(const char *socket)
{
    int fd = rawclient_connect(socket);
    if (fd < 0)
        return fd;
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.features = PROTO_FEAT_NOREPLY_RELEASE;
    if (c_send(fd, &m) < 0 || c_recv(fd, 5000, &r, NULL) < 0 || r.op != PROTO_OP_HELLO + PROTO_OP_REPLY) {
        close(fd);
        return -EPROTO;
    }
    return fd;
}

static int c_lease(int fd, uint32_t id, uint64_t size, uint32_t wait_ms)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = id };
    m.u.lease.size = size;
    m.u.lease.wait_ms = wait_ms;
    return c_send(fd, &m);
}

static void tell(int fd, char c)
{
    if (write(fd, &c, 1) != 1)
        _exit(90);
}

static char hear(int fd, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    char c = 0;
    if (poll(&p, 1, ms) != 1 || read(fd, &c, 1) != 1)
        return 0;
    return c;
}

/* ---- parked acquires: capped by max-leases, and the daemon goes on serving ---------- */

Test(waits, parked_acquires_are_capped_while_others_are_served, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, "--max-leases", "8", NULL);
    int prod = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    uint8_t token[PROTO_TOKEN_LEN];
    uint64_t h = rv_lease(prod, 2, 4 * KiB, token); /* never published */

    int hostile = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    for (uint32_t i = 0; i < 8; i++)
        rv_acquire_send(hostile, 100 + i, token, PROTO_MAX_ACQUIRE_WAIT_MS);
    char text[PROTO_MAX_ERRMSG + 1];
    rv_acquire_send(hostile, 108, token, PROTO_MAX_ACQUIRE_WAIT_MS);
    rv_expect_error(hostile, 5000, 108, EMFILE, text, sizeof(text), "a ninth parked acquire");
    cr_assert(strstr(text, "8 of them waiting"), "%s", text);
    rv_lease_send(hostile, 109, 100, 0);
    rv_expect_error(hostile, 5000, 109, EMFILE, text, sizeof(text), "a lease past max-leases");
    cr_assert_eq(status_u64(&d, "counters.acquire_waits"), 8);

    /* everyone else is served at once meanwhile */
    int other = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    long t0 = now_ms();
    for (uint32_t i = 0; i < 200; i++) {
        uint64_t hh = rv_lease(other, 1000 + i, 4 * KiB, NULL);
        rv_release_send(other, 2000 + i, hh);
    }
    cr_assert_lt(now_ms() - t0, 10000, "200 leases took %ld ms next to parked acquires", now_ms() - t0);

    /* the producer releases it unpublished: every waiter hears ENOENT, in order */
    rv_release_send(prod, 3, h);
    for (uint32_t i = 0; i < 8; i++) {
        rv_expect_error(hostile, 5000, 100 + i, ENOENT, text, sizeof(text), "a waiter of a released buffer");
        cr_assert(strstr(text, "released before it was published"), "%s", text);
    }
    cr_assert_eq(status_u64(&d, "counters.acquire_wait_timeouts"), 0);
    /* its places are free again */
    uint64_t hh = rv_lease(hostile, 110, 100, NULL);
    rv_release_send(hostile, 111, hh);
    close(hostile);
    close(other);
    close(prod);
    daemon_stop(&d);
}

/* An acquire that reaches the daemon before the producer's one-way publish is served by
 * it; the acquire of another tenant (uid 65534) is checked at serve time. */
struct early {
    const char *socket;
    uint8_t token[PROTO_TOKEN_LEN];
    int go;            /* read end: the parent says the acquire may go */
    int ready;         /* write end: the child says it sent it */
};

static int early_acquirer(void *arg)
{
    struct early *e = arg;
    if (become(65534) < 0)
        return 10;
    int fd = c_connect(e->socket);
    if (fd < 0)
        return 11;
    struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = 5 }, r;
    memcpy(m.u.acquire.token, e->token, PROTO_TOKEN_LEN);
    m.u.acquire.wait_ms = 20000;
    if (c_send(fd, &m) < 0)
        return 12;
    tell(e->ready, 'a');
    int bfd;
    if (c_recv(fd, 20000, &r, &bfd) < 0)
        return 13;
    if (r.op != PROTO_OP_ACQUIRE + PROTO_OP_REPLY || r.id != 5 || bfd < 0) {
        fprintf(stderr, "early acquire: op %u: %.*s\n", r.op, r.op == PROTO_OP_ERROR ? (int)r.u.error.msg_len : 0,
                r.op == PROTO_OP_ERROR ? r.u.error.msg : "");
        return 14;
    }
    const uint8_t *p = mmap(NULL, r.u.acquire_reply.capacity, PROT_READ, MAP_SHARED, bfd, 0);
    if (p == MAP_FAILED)
        return 15;
    int bad = check_pattern(p, r.u.acquire_reply.size, 77) != -1;
    munmap((void *)p, r.u.acquire_reply.capacity);
    close(bfd);
    close(fd);
    return bad ? 16 : 0;
}

Test(waits, an_acquire_before_the_publish_is_served_by_it, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    int prod = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    struct proto_msg r;
    int fds[1];
    unsigned nf = 0;
    rv_lease_send(prod, 2, 64 * KiB, 0);
    cr_assert_gt(rv_recv_fds(prod, 5000, &r, fds, 1, &nf), 0);
    cr_assert_eq(r.op, PROTO_OP_LEASE + PROTO_OP_REPLY);
    cr_assert_eq(nf, 1);
    struct early e = { .socket = d.socket };
    memcpy(e.token, r.u.lease_reply.token, PROTO_TOKEN_LEN);
    uint64_t h = r.u.lease_reply.handle, cap = r.u.lease_reply.capacity;
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    e.ready = ready[1];
    pid_t pid = child_run(early_acquirer, &e);
    cr_assert_eq(hear(ready[0], 10000), 'a', "the consumer did not send its acquire");
    cr_assert_eq(wait_status(&d, "counters.acquire_waits", 1, 5000), 1, "the acquire did not wait");
    usleep(100 * 1000); /* it waits: no ENOENT for a buffer not published yet */
    uint8_t *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    cr_assert_neq(p, MAP_FAILED);
    fill_pattern(p, 10000, 77);
    munmap(p, cap);
    close(fds[0]);
    rv_publish_send(prod, 3, h, 10000);
    cr_assert_eq(child_wait(pid), 0, "the early consumer failed");
    cr_assert_eq(status_u64(&d, "counters.acquires"), 1);
    rv_release_send(prod, 4, h);
    close(prod);
    daemon_stop(&d);
}

/* ---- leases that wait ------------------------------------------------------------- */

/* uid 65534, at its quota, parks a lease and holds it until told to go. */
struct parker {
    const char *socket;
    int go, ready;
};

static int quota_parker(void *arg)
{
    struct parker *k = arg;
    struct proto_msg r;
    if (become(65534) < 0)
        return 10;
    int fd = c_connect(k->socket);
    if (fd < 0)
        return 11;
    if (c_lease(fd, 2, MiB, 0) < 0 || c_recv(fd, 5000, &r, NULL) < 0 || r.op != PROTO_OP_LEASE + PROTO_OP_REPLY)
        return 12;
    if (c_lease(fd, 3, 64 * KiB, 60000) < 0)
        return 13;
    if (c_recv(fd, 300, &r, NULL) != -ETIMEDOUT)
        return 14; /* at its quota: it must wait, not be refused */
    tell(k->ready, 'p');
    if (hear(k->go, 60000) != 'g')
        return 15;
    close(fd); /* with the lease still parked: dropped, nothing charged */
    return 0;
}

Test(waits, a_tenant_waiting_at_its_quota_never_delays_another, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "1M", "--socket-mode", "0666", NULL);
    int ready[2], go[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(go), 0);
    struct parker k = { .socket = d.socket, .go = go[0], .ready = ready[1] };
    pid_t pid = child_run(quota_parker, &k);
    cr_assert_eq(hear(ready[0], 20000), 'p', "uid 65534 did not park its lease");
    cr_assert_eq(status_u64(&d, "counters.lease_waits"), 1);

    /* root (another tenant) leases up to its own quota and back, at once, many times */
    int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    long worst = 0;
    for (uint32_t i = 0; i < 100; i++) {
        long t0 = now_ms();
        uint64_t a = rv_lease(fd, 10 + 2 * i, 512 * KiB, NULL), b = rv_lease(fd, 11 + 2 * i, 512 * KiB, NULL);
        long t = now_ms() - t0;
        worst = t > worst ? t : worst;
        rv_release_send(fd, 1000 + i, a);
        rv_release_send(fd, 2000 + i, b);
    }
    cr_assert_lt(worst, 2000, "another tenant's leases waited %ld ms", worst);
    /* and root's own waiting lease is served when root frees room, while 65534 still waits */
    uint64_t a = rv_lease(fd, 300, MiB, NULL);
    rv_lease_send(fd, 301, 64 * KiB, 30000);
    rv_nothing(fd, 200, "a lease over root's quota");
    rv_release_send(fd, 302, a);
    struct proto_msg r;
    rv_expect(fd, 5000, PROTO_OP_LEASE + PROTO_OP_REPLY, 301, &r, "root's waiting lease");
    rv_release_send(fd, 303, r.u.lease_reply.handle);
    cr_assert_eq(status_u64(&d, "counters.refused_quota"), 0, "a waiting lease was refused");

    /* 65534 closes with its lease parked: dropped, its charge (1 MiB) gone with its lease */
    tell(go[1], 'g');
    cr_assert_eq(child_wait(pid), 0, "uid 65534's child failed");
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    cr_assert_eq(status_u64(&d, "counters.lease_wait_timeouts"), 0);
    cr_assert_eq(status_u64(&d, "counters.lease_waits"), 2);
    close(fd);
    daemon_stop(&d);
}

/* FIFO within a tenant: a small lease that would fit never overtakes an earlier big one. */
Test(waits, leases_of_one_tenant_are_served_in_arrival_order, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "1M", NULL);
    int x = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE), y = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE),
        z = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    uint64_t x1 = rv_lease(x, 1, 512 * KiB, NULL), x2 = rv_lease(x, 2, 512 * KiB, NULL);
    rv_lease_send(y, 10, MiB, 30000);        /* first: needs all of it */
    cr_assert_eq(wait_status(&d, "counters.lease_waits", 1, 5000), 1);
    rv_lease_send(z, 20, 4 * KiB, 30000);    /* second: would fit once 512 KiB free */
    cr_assert_eq(wait_status(&d, "counters.lease_waits", 2, 5000), 2);
    rv_release_send(x, 3, x1);
    rv_nothing(z, 300, "the later, smaller lease overtook the earlier one");
    rv_nothing(y, 10, "the first lease, with room for half of it");
    rv_release_send(x, 4, x2);
    struct proto_msg r;
    rv_expect(y, 5000, PROTO_OP_LEASE + PROTO_OP_REPLY, 10, &r, "the first waiter, once room is free");
    uint64_t yh = r.u.lease_reply.handle;
    rv_nothing(z, 300, "the second waiter, past the quota");
    rv_release_send(y, 11, yh);
    rv_expect(z, 5000, PROTO_OP_LEASE + PROTO_OP_REPLY, 20, &r, "the second waiter");
    rv_release_send(z, 21, r.u.lease_reply.handle);
    cr_assert_eq(status_u64(&d, "counters.refused_quota"), 0);
    close(x);
    close(y);
    close(z);
    daemon_stop(&d);
}

/* Deadlines: ETIMEDOUT with the numbers, for quota and for pool space; an acquire's wait
 * ends in ENOENT saying so. */
Test(waits, a_wait_that_runs_out_names_the_numbers, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "4M", NULL);
    int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    uint64_t h[4];
    for (int i = 0; i < 4; i++)
        h[i] = rv_lease(fd, 1 + i, MiB, NULL);
    char text[PROTO_MAX_ERRMSG + 1];
    long t0 = now_ms();
    rv_lease_send(fd, 9, MiB, 500);
    rv_expect_error(fd, 5000, 9, ETIMEDOUT, text, sizeof(text), "a lease that waits 500 ms for quota");
    long waited = now_ms() - t0;
    cr_assert_geq(waited, 450, "gave up after %ld ms", waited);
    cr_assert(strstr(text, "lease of 1.0 MiB (1048576 bytes) waited "), "%s", text);
    cr_assert(strstr(text, " ms for quota: uid 0 holds 4.0 MiB (4194304 bytes) of its 4.0 MiB quota"), "%s", text);
    cr_assert_eq(status_u64(&d, "counters.lease_wait_timeouts"), 1);

    uint8_t token[PROTO_TOKEN_LEN];
    for (int i = 0; i < 4; i++)
        rv_release_send(fd, 20 + i, h[i]);
    uint64_t w = rv_lease(fd, 30, 100, token);
    rv_acquire_send(fd, 31, token, 200);
    rv_expect_error(fd, 5000, 31, ENOENT, text, sizeof(text), "an acquire that waits 200 ms");
    cr_assert_str_eq(text, "buffer leased under this descriptor was not published within 200 ms");
    cr_assert_eq(status_u64(&d, "counters.acquire_wait_timeouts"), 1);
    rv_release_send(fd, 32, w);
    close(fd);
    daemon_stop(&d);

    /* pool space: a 16 MiB pool held whole */
    daemon_start(&d, "--pool-size", "16M", "--tenant-quota", "64M", NULL);
    fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    uint64_t all = rv_lease(fd, 1, 16 * MiB, NULL);
    rv_lease_send(fd, 2, MiB, 300);
    rv_expect_error(fd, 5000, 2, ETIMEDOUT, text, sizeof(text), "a lease that waits for pool space");
    cr_assert(strstr(text, "lease of 1.0 MiB (1048576 bytes) waited "), "%s", text);
    cr_assert(strstr(text, " ms for pool space: the pool holds 16.0 MiB (16777216 bytes) of its 16.0 MiB"), "%s",
              text);
    /* and with room freed in time it is served */
    rv_lease_send(fd, 3, MiB, 10000);
    rv_nothing(fd, 100, "a lease with the pool full");
    rv_release_send(fd, 4, all);
    struct proto_msg r;
    rv_expect(fd, 5000, PROTO_OP_LEASE + PROTO_OP_REPLY, 3, &r, "a lease once pool space freed");
    rv_release_send(fd, 5, r.u.lease_reply.handle);
    close(fd);
    daemon_stop(&d);
}

/* A lease that may wait is not parked behind what its own connection keeps: an idle
 * mapping of a buffer the daemon retired for the quota pins its pages (charged to the
 * uid) until this process unmaps it, which the daemon cannot ask; a lease without a wait
 * is refused, gives it back and goes again. One that waits now does the same before it
 * waits (before: parked to the end of its wait, -ETIMEDOUT, though the quota was free). */
Test(waits, a_waiting_lease_is_not_held_up_by_its_own_idle_mappings, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--pool-size", "64M", "--tenant-quota", "16M", NULL);
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(c, 0), 0);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, 12 * MiB, &b), 0, "%s", shmref_errmsg(c));
    memset(shmref_buf_data(b), 1, 12 * MiB);
    shmref_release(b); /* its mapping stays cached, idle */
    long t0 = now_ms();
    int r = shmref_lease_ex(c, 8 * MiB, 0, 3000, &b);
    long took = now_ms() - t0;
    cr_assert_eq(r, 0, "%d after %ld ms: %s", r, took, shmref_errmsg(c));
    cr_assert_lt(took, 1500, "served after %ld ms", took);
    shmref_release(b);
    /* Nothing to give back: it waits, and runs out naming the numbers. */
    shmref_buf *held;
    cr_assert_eq(shmref_lease(c, 12 * MiB, &held), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_set_lease_wait(c, 300), 0);
    t0 = now_ms();
    r = shmref_lease(c, 8 * MiB, &b); /* the connection's wait (shmref_set_lease_wait) */
    took = now_ms() - t0;
    cr_assert_eq(r, -ETIMEDOUT, "%d: %s", r, shmref_errmsg(c));
    cr_assert_geq(took, 280, "gave up after %ld ms", took);
    cr_assert(strstr(shmref_errmsg(c), "waited ") && strstr(shmref_errmsg(c), " ms for quota"), "%s",
              shmref_errmsg(c));
    cr_assert_eq(shmref_set_lease_wait(c, 600001), -EINVAL);
    cr_assert_eq(shmref_set_lease_wait(c, 0), 0);
    cr_assert_eq(shmref_lease(c, 8 * MiB, &b), -EDQUOT, "%s", shmref_errmsg(c));
    shmref_release(held);
    shmref_close(c);
    daemon_stop(&d);
}

/* Closing a connection with parked leases and acquires drops them: nothing charged,
 * nothing served later, the daemon's ledgers agree (a test build aborts otherwise). */
Test(waits, a_closed_connection_drops_its_parked_requests, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--tenant-quota", "1M", NULL);
    int holder = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    uint8_t token[PROTO_TOKEN_LEN];
    uint64_t h = rv_lease(holder, 1, MiB, token);
    int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    for (uint32_t i = 0; i < 3; i++)
        rv_lease_send(fd, 10 + i, 64 * KiB, 30000);
    rv_acquire_send(fd, 20, token, 30000);
    cr_assert_eq(wait_status(&d, "counters.acquire_waits", 1, 5000), 1);
    cr_assert_eq(status_u64(&d, "counters.lease_waits"), 3);
    close(fd);
    cr_assert_eq(wait_status(&d, "clients_total", 2, 5000), 2, "the closed connection is still listed");
    uint64_t leased = status_u64(&d, "pool.bytes_leased");
    rv_publish_send(holder, 2, h, 10);   /* no waiter left to serve */
    rv_release_send(holder, 3, h);       /* the quota frees: no waiter left to charge */
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0, "held %llu before", (unsigned long long)leased);
    uint64_t again = rv_lease(holder, 4, MiB, NULL); /* all of the quota: nothing was charged to the dropped */
    rv_release_send(holder, 5, again);
    cr_assert_eq(status_u64(&d, "counters.lease_wait_timeouts"), 0);
    cr_assert_eq(status_u64(&d, "counters.acquire_wait_timeouts"), 0);
    cr_assert_eq(status_u64(&d, "counters.acquires"), 0);
    cr_assert_eq(status_u64(&d, "counters.leases"), 2);
    close(holder);
    daemon_stop(&d);
}

/* ---- a fast producer and a slow consumer ------------------------------------------ */

#define FLOW_N 120
#define FLOW_SIZE (200 * KiB)

struct flow {
    const char *socket;
    int tokens[2];     /* producer -> consumer: struct flow_msg */
};

struct flow_msg {
    uint8_t token[PROTO_TOKEN_LEN];
    uint64_t size;
    uint32_t seq;
};

/* uid 65534: leases as fast as it may (waiting for quota), writes, publishes one-way with
 * a retention that ends at the one acquire, releases its handle, hands the descriptor on. */
static int flow_producer(void *arg)
{
    struct flow *fl = arg;
    if (become(65534) < 0)
        return 10;
    int fd = c_connect(fl->socket);
    if (fd < 0)
        return 11;
    for (uint32_t i = 0; i < FLOW_N; i++) {
        struct proto_msg r;
        int bfd;
        if (c_lease(fd, 2 * i + 10, FLOW_SIZE, 60000) < 0 || c_recv(fd, 60000, &r, &bfd) < 0)
            return 12;
        if (r.op != PROTO_OP_LEASE + PROTO_OP_REPLY || bfd < 0) {
            fprintf(stderr, "producer lease %u: op %u: %.*s\n", i, r.op,
                    r.op == PROTO_OP_ERROR ? (int)r.u.error.msg_len : 0, r.op == PROTO_OP_ERROR ? r.u.error.msg : "");
            return 13;
        }
        uint64_t h = r.u.lease_reply.handle, cap = r.u.lease_reply.capacity;
        struct flow_msg fm = { .size = FLOW_SIZE - i, .seq = i };
        memcpy(fm.token, r.u.lease_reply.token, PROTO_TOKEN_LEN);
        uint8_t *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, bfd, 0);
        if (p == MAP_FAILED)
            return 14;
        fill_pattern(p, fm.size, 1000 + i);
        munmap(p, cap);
        close(bfd);
        struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 2 * i + 11 };
        m.u.publish.handle = h;
        m.u.publish.size = fm.size;
        m.u.publish.keep_ms = 60000;
        m.u.publish.max_acquires = 1;
        m.u.publish.flags = PROTO_PUBLISH_NOREPLY;
        struct proto_msg rel = { .op = PROTO_OP_RELEASE, .id = 0 };
        rel.u.release.handle = h;
        rel.u.release.flags = PROTO_RELEASE_NOREPLY;
        if (c_send(fd, &m) < 0 || c_send(fd, &rel) < 0)
            return 15;
        if (write(fl->tokens[1], &fm, sizeof(fm)) != sizeof(fm))
            return 16;
    }
    struct proto_msg r;
    if (c_recv(fd, 200, &r, NULL) != -ETIMEDOUT)
        return 17; /* an error for a one-way publish or release */
    close(fd);
    return 0;
}

/* uid 65533: acquires each descriptor (waiting for its publish if need be), checks the
 * bytes, takes its time, releases. */
static int flow_consumer(void *arg)
{
    struct flow *fl = arg;
    if (become(65533) < 0)
        return 20;
    int fd = c_connect(fl->socket);
    if (fd < 0)
        return 21;
    for (uint32_t i = 0; i < FLOW_N; i++) {
        struct flow_msg fm;
        if (read(fl->tokens[0], &fm, sizeof(fm)) != sizeof(fm) || fm.seq != i)
            return 22;
        struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = i + 1 }, r;
        memcpy(m.u.acquire.token, fm.token, PROTO_TOKEN_LEN);
        m.u.acquire.wait_ms = 10000;
        int bfd;
        if (c_send(fd, &m) < 0 || c_recv(fd, 20000, &r, &bfd) < 0)
            return 23;
        if (r.op != PROTO_OP_ACQUIRE + PROTO_OP_REPLY || bfd < 0 || r.u.acquire_reply.size != fm.size) {
            fprintf(stderr, "consumer acquire %u: op %u: %.*s\n", i, r.op,
                    r.op == PROTO_OP_ERROR ? (int)r.u.error.msg_len : 0, r.op == PROTO_OP_ERROR ? r.u.error.msg : "");
            return 24;
        }
        const uint8_t *p = mmap(NULL, r.u.acquire_reply.capacity, PROT_READ, MAP_SHARED, bfd, 0);
        if (p == MAP_FAILED)
            return 25;
        ssize_t bad = check_pattern(p, fm.size, 1000 + i);
        munmap((void *)p, r.u.acquire_reply.capacity);
        close(bfd);
        if (bad != -1)
            return 26;
        usleep(3000); /* slow */
        struct proto_msg rel = { .op = PROTO_OP_RELEASE, .id = 0 };
        rel.u.release.handle = r.u.acquire_reply.handle;
        rel.u.release.flags = PROTO_RELEASE_NOREPLY;
        if (c_send(fd, &rel) < 0)
            return 27;
    }
    close(fd);
    return 0;
}

Test(waits, a_fast_producer_slows_to_a_slow_consumer, .timeout = 180)
{
    struct daemon d;
    /* the class of 200 KiB is 224 KiB: four in flight fit in 1 MiB, a fifth does not */
    daemon_start(&d, "--tenant-quota", "1M", "--socket-mode", "0666", NULL);
    struct flow fl = { .socket = d.socket };
    cr_assert_eq(pipe(fl.tokens), 0);
    pid_t prod = child_run(flow_producer, &fl);
    pid_t cons = child_run(flow_consumer, &fl);
    close(fl.tokens[0]);
    close(fl.tokens[1]);
    uint64_t most = 0;
    int samples = 0;
    for (;;) {
        int st;
        pid_t done = waitpid(prod, &st, WNOHANG);
        uint64_t leased = status_u64(&d, "pool.bytes_leased");
        most = leased > most ? leased : most;
        samples++;
        cr_assert_leq(leased, MiB, "the producer's buffers hold %llu bytes, past its 1 MiB quota",
                      (unsigned long long)leased);
        if (done == prod) {
            cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the producer failed (%d)", st);
            break;
        }
        usleep(5000);
    }
    cr_assert_eq(child_wait(cons), 0, "the consumer failed");
    cr_assert_gt(status_u64(&d, "counters.lease_waits"), 0, "the producer never had to wait");
    cr_assert_eq(status_u64(&d, "counters.lease_wait_timeouts"), 0);
    cr_assert_eq(status_u64(&d, "counters.refused_quota"), 0, "a lease was refused");
    cr_assert_eq(status_u64(&d, "counters.refused_other"), 0);
    cr_assert_eq(status_u64(&d, "counters.acquires"), FLOW_N);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    cr_log_info("fast producer: %llu lease waits, at most %llu bytes in flight over %d samples",
                (unsigned long long)status_u64(&d, "counters.lease_waits"), (unsigned long long)most, samples);
    daemon_stop(&d);
}
