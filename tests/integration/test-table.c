/* SPDX-License-Identifier: MIT */
/* test-table.c: same-tenant handoffs through the uid's table (issue 28, proto/handoff.h,
 * daemon/tenantdir.c, client-lib/localhold.c) against a real shmrefd and real processes:
 * the "Done when". It replaces test-ledger-daemon.c and test-ledger-client.c (the
 * ledger design's): what of them still means something is here (the steady state makes no
 * message, consumers racing recycles never read a new generation, SIGKILLed holders are
 * reclaimed, another uid goes through the daemon and can do nothing to the table); took,
 * nudge, the directory and the fd-once ledger cap are gone with the design.
 *
 * Each test says how it failed, or would fail, on the old code or with an order broken. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "handoff.h"
#include "harness.h"
#include "proto.h"
#include "rawclient.h"

#define SIZE 8192
#define OTHER_UID 65534

static struct daemon d;

static void init(void)
{
    signal(SIGPIPE, SIG_IGN); /* a dead peer's socket fails the write, and the test says so */
}

static void fini(void)
{
    reap_children();
}

TestSuite(table, .init = init, .fini = fini, .timeout = 300);

/* ---- helpers ---------------------------------------------------------------------- */

static uint64_t counter(const shmref_conn *c, const char *name)
{
    uint64_t v = 0;
    cr_assert_eq(shmref_conn_counter(c, name, &v), 0, "no counter %s", name);
    return v;
}

/* ctr: a counter without asserting (children). */
static uint64_t ctr(const shmref_conn *c, const char *name)
{
    uint64_t v = 0;
    shmref_conn_counter(c, name, &v);
    return v;
}

/* st: one number of status over c (a connection the test keeps: status_u64's fresh
 * connection would itself join the uid's table and move table.journals). */
static uint64_t st(shmref_conn *c, const char *path)
{
    shmref_status *s;
    uint64_t v = 0;
    cr_assert_eq(shmref_status_get(c, &s), 0, "status: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_status_u64(s, path, &v), 0, "status has no %s", path);
    shmref_status_free(s);
    return v;
}

/* wait_st: polls st until path equals want or ms pass; the last value. */
static uint64_t wait_st(shmref_conn *c, const char *path, uint64_t want, int ms)
{
    long deadline = now_ms() + ms;
    uint64_t v;
    while ((v = st(c, path)) != want && now_ms() < deadline)
        usleep(2000);
    return v;
}

static int become(uid_t uid)
{
    return setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0 ? -1 : 0;
}

/* One handoff on connections p (producer) and c (consumer): lease, the whole payload from
 * seed, publish (metadata "m"), acquire on c, every byte and the metadata compared,
 * both released. false (with a line on stderr) when anything differs or fails. */
static bool handoff(shmref_conn *p, shmref_conn *c, uint32_t seed, size_t size)
{
    shmref_buf *b, *a;
    shmref_desc desc;
    if (shmref_lease(p, size, &b) < 0) {
        fprintf(stderr, "lease: %s\n", shmref_errmsg(p));
        return false;
    }
    fill_pattern(shmref_buf_data(b), size, seed);
    if (shmref_publish(b, size, 0, "m", 1, &desc) < 0) {
        fprintf(stderr, "publish: %s\n", shmref_errmsg(p));
        return false;
    }
    if (shmref_acquire(c, &desc, &a) < 0) {
        fprintf(stderr, "acquire: %s\n", shmref_errmsg(c));
        return false;
    }
    size_t ml = 0;
    const char *m = shmref_buf_meta(a, &ml);
    ssize_t off = check_pattern(shmref_buf_data(a), size, seed);
    bool ok = off == -1 && shmref_buf_size(a) == size && ml == 1 && m && m[0] == 'm';
    if (!ok)
        fprintf(stderr, "handoff %u: byte %zd differs (size %zu, meta %zu)\n", seed, off, shmref_buf_size(a), ml);
    shmref_release(a);
    shmref_release(b);
    return ok;
}

/* ---- 1. the steady state costs no message ----------------------------------------- */

/* Two connections of one process. On the ledger design each handoff still sent one-way
 * messages (the consumer's took, a nudge at a LENT buffer's last give): "sent" moved by at
 * least one per round on the consumer; with the table a message per round is any of the
 * slow paths (a MAP, an ADOPT, a daemon lease or acquire), and the assertion names it. */
Test(table, steady_state_two_connections_sends_nothing)
{
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    for (uint32_t i = 1; i <= 100; i++)
        cr_assert(handoff(p, c, i, SIZE), "warm-up round %u", i);
    uint64_t sp = counter(p, "sent"), sc = counter(c, "sent");
    uint64_t pub = counter(p, "table_publishes"), acq = counter(c, "table_acquires");
    unsigned bad = 0;
    for (uint32_t i = 1; i <= 2000; i++)
        bad += !handoff(p, c, 1000 + i, SIZE);
    uint64_t dsp = counter(p, "sent") - sp, dsc = counter(c, "sent") - sc;
    printf("steady (one process): 2000 rounds: producer sent %llu, consumer sent %llu; %llu table publishes, "
           "%llu table acquires, %u rounds wrong\n", (unsigned long long)dsp, (unsigned long long)dsc,
           (unsigned long long)(counter(p, "table_publishes") - pub),
           (unsigned long long)(counter(c, "table_acquires") - acq), bad);
    cr_assert_eq(bad, 0, "%u rounds read bytes that were not their round's", bad);
    cr_assert_eq(dsp, 0, "the producer sent %llu messages in 2000 steady-state rounds (maps %llu, adopts %llu, "
                 "leases not from the table)", (unsigned long long)dsp, (unsigned long long)counter(p, "table_maps"),
                 (unsigned long long)counter(p, "table_adopts"));
    cr_assert_eq(dsc, 0, "the consumer sent %llu messages in 2000 steady-state rounds (fallbacks %llu)",
                 (unsigned long long)dsc, (unsigned long long)counter(c, "table_fallbacks"));
    cr_assert_eq(counter(p, "table_publishes") - pub, 2000);
    cr_assert_eq(counter(c, "table_acquires") - acq, 2000);
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* A buffer published once through the daemon (the first lease of its class: the table had
 * none) and acquired again and again, a model or a lookup table: after the consumer's first
 * acquire (its fd) every acquire and release is taken in the table, no message, while the
 * producer keeps its lease. Before the daemon joined such a publish to the table, every
 * acquire of it was a daemon round trip (16.6 us each in the Python bench's acquire + release
 * pairs, 0.9 us when taken in the ledger before the table). */
Test(table, a_buffer_published_through_the_daemon_is_taken_in_the_table)
{
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    shmref_buf *b, *a;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(counter(p, "table_leases"), 0, "the first lease of a class is the daemon's");
    fill_pattern(shmref_buf_data(b), SIZE, 77);
    cr_assert_eq(shmref_publish(b, SIZE, 0, "m", 1, &desc), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(counter(p, "table_publishes"), 0, "published through the daemon");
    cr_assert_eq(shmref_acquire(c, &desc, &a), 0, "%s", shmref_errmsg(c)); /* its fd */
    cr_assert_eq(check_pattern(shmref_buf_data(a), SIZE, 77), -1);
    shmref_release(a);
    cr_assert_eq(shmref_ping(c), 0);
    uint64_t sent = counter(c, "sent"), acq = counter(c, "table_acquires");
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(shmref_acquire(c, &desc, &a), 0, "round %d: %s", i, shmref_errmsg(c));
        size_t ml;
        const char *m = shmref_buf_meta(a, &ml);
        cr_assert(ml == 1 && m[0] == 'm', "round %d: metadata", i);
        cr_assert_eq(check_pattern(shmref_buf_data(a), SIZE, 77), -1, "round %d: bytes", i);
        shmref_release(a);
    }
    cr_assert_eq(counter(c, "sent") - sent, 0, "1000 acquires and releases of a daemon publish sent %llu messages",
                 (unsigned long long)(counter(c, "sent") - sent));
    cr_assert_eq(counter(c, "table_acquires") - acq, 1000);
    /* the producer's release gives the daemon's hold back: the buffer is the table's, free */
    shmref_release(b);
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(st(p, "table.lent"), 1);
    cr_assert_eq(st(p, "buffers.live"), 0);
    cr_assert_neq(shmref_acquire(c, &desc, &a), 0, "a publish nobody holds is gone");
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* What travels on the socketpair between the two processes. */
struct msg {
    shmref_desc desc;
    uint32_t seed;
    uint32_t cmd;           /* 0: a handoff; 1: report counters; 2: stop */
    uint64_t sent, table_acquires, fallbacks, bad;
};

static int pp_consumer(void *arg)
{
    int s = *(int *)arg;
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    uint64_t bad = 0;
    struct msg m;
    while (read(s, &m, sizeof(m)) == (ssize_t)sizeof(m)) {
        if (m.cmd == 2)
            break;
        if (m.cmd == 0) {
            shmref_buf *a;
            if (shmref_acquire(c, &m.desc, &a) < 0) {
                fprintf(stderr, "consumer acquire: %s\n", shmref_errmsg(c));
                return 102;
            }
            size_t ml = 0;
            const char *meta = shmref_buf_meta(a, &ml);
            if (check_pattern(shmref_buf_data(a), m.desc.size, m.seed) != -1 || ml != 1 || !meta || meta[0] != 'm')
                bad++;
            shmref_release(a);
        }
        m.sent = ctr(c, "sent");
        m.table_acquires = ctr(c, "table_acquires");
        m.fallbacks = ctr(c, "table_fallbacks");
        m.bad = bad;
        if (write(s, &m, sizeof(m)) != (ssize_t)sizeof(m))
            return 103;
    }
    shmref_close(c);
    return 0;
}

static struct msg pp_call(int s, struct msg m)
{
    cr_assert_eq(write(s, &m, sizeof(m)), (ssize_t)sizeof(m), "the consumer went away");
    cr_assert(read_full(s, &m, sizeof(m)), "the consumer failed");
    return m;
}

/* pp_round: a handoff to the consumer process; the producer's hold goes after its answer. */
static struct msg pp_round(shmref_conn *p, int s, uint32_t seed)
{
    shmref_buf *b;
    struct msg m = { .seed = seed };
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "lease: %s", shmref_errmsg(p));
    fill_pattern(shmref_buf_data(b), SIZE, seed);
    cr_assert_eq(shmref_publish(b, SIZE, 0, "m", 1, &m.desc), 0, "publish: %s", shmref_errmsg(p));
    m = pp_call(s, m);
    shmref_release(b);
    return m;
}

/* Two processes: the consumer maps the buffers after the warm-up (its first acquire of
 * each went to the daemon). Fails as above on the ledger design (a took per round); and
 * if a consumer's table take fell back to the daemon (not mapped, refused), as one acquire
 * and one release per round on the consumer's "sent". */
Test(table, steady_state_two_processes_sends_nothing)
{
    daemon_start(&d, NULL);
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    pid_t pid = child_run(pp_consumer, &sv[1]);
    close(sv[1]);
    shmref_conn *p = connect_ok(&d);
    for (uint32_t i = 1; i <= 100; i++)
        pp_round(p, sv[0], i);
    struct msg c0 = pp_call(sv[0], (struct msg){ .cmd = 1 });
    uint64_t sp = counter(p, "sent"), pub = counter(p, "table_publishes");
    struct msg c1 = { 0 };
    for (uint32_t i = 1; i <= 2000; i++)
        c1 = pp_round(p, sv[0], 1000 + i);
    uint64_t dsp = counter(p, "sent") - sp, dsc = c1.sent - c0.sent;
    printf("steady (two processes): 2000 rounds: producer sent %llu, consumer sent %llu; %llu table publishes, "
           "%llu table acquires, %llu payloads wrong\n", (unsigned long long)dsp, (unsigned long long)dsc,
           (unsigned long long)(counter(p, "table_publishes") - pub),
           (unsigned long long)(c1.table_acquires - c0.table_acquires), (unsigned long long)c1.bad);
    cr_assert_eq(c1.bad, 0, "the consumer read %llu payloads that were not their round's", (unsigned long long)c1.bad);
    cr_assert_eq(dsp, 0, "the producer sent %llu messages in 2000 steady-state rounds", (unsigned long long)dsp);
    cr_assert_eq(dsc, 0, "the consumer sent %llu messages in 2000 steady-state rounds (fallbacks %llu)",
                 (unsigned long long)dsc, (unsigned long long)(c1.fallbacks - c0.fallbacks));
    cr_assert_eq(c1.table_acquires - c0.table_acquires, 2000);
    struct msg stop = { .cmd = 2 };
    cr_assert_eq(write(sv[0], &stop, sizeof(stop)), (ssize_t)sizeof(stop));
    cr_assert_eq(child_wait(pid), 0, "the consumer failed");
    close(sv[0]);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- 2. more holds than any limit never recycle a buffer under a hold -------------- */

#define MANY_SIZE 4096
#define MANY_HOLDS 9000     /* > 8,448: the old fd-once cap, max_leases * 2 + 256 */
#define MANY_BATCH 4000     /* daemon leases held at once (below max-leases 4096) */

struct held {
    shmref_buf *b;
    uint32_t seed;
};

/* One consumer connection takes holds on MANY_HOLDS distinct published table buffers
 * (local takes: the process maps them through the producer's leases) and keeps them
 * while the producer connection goes on leasing, writing, publishing and releasing. On
 * the ledger design the 8,449th hold was past the fd-once cap: its buffer was recycled
 * under the hold, and the final check read a later generation ("read generation 17,452
 * where it had taken 16,898"). A give that pushed a buffer with holds left would fail the
 * same check. */
Test(table, more_holds_than_any_limit_never_recycle)
{
    /* every member is an fd of the daemon's, which keeps a quarter of RLIMIT_NOFILE for
     * the rest (its own and this process's limit: it inherits it) */
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 13000)
        cr_skip_test("RLIMIT_NOFILE's hard limit %llu is below the 13,000 fds %u table members need",
                     (unsigned long long)rl.rlim_max, MANY_HOLDS);
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    daemon_start(&d, "--pool-size", "1G", NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    struct held *h = calloc(MANY_HOLDS, sizeof(*h));
    cr_assert(h);
    /* the table grows to MANY_HOLDS members: daemon leases (PROTO_LEASE_TABLE) join it
     * at their release; at most MANY_BATCH daemon leases held at once (max-leases) */
    for (;;) {
        uint64_t members = st(c, "table.members");
        if (members >= MANY_HOLDS)
            break;
        unsigned k = (unsigned)members + MANY_BATCH;
        if (k > MANY_HOLDS + 64)
            k = MANY_HOLDS + 64;
        shmref_buf **all = calloc(k, sizeof(*all));
        cr_assert(all);
        for (unsigned i = 0; i < k; i++)
            cr_assert_eq(shmref_lease(p, MANY_SIZE, &all[i]), 0, "lease %u of %u (%llu members): %s", i, k,
                         (unsigned long long)members, shmref_errmsg(p));
        for (unsigned i = 0; i < k; i++)
            shmref_release(all[i]);
        free(all);
        cr_assert_gt(wait_st(c, "table.members", k, 5000), members, "the table does not grow");
    }
    uint32_t gen = 0;
    unsigned n = 0, daemon_holds = 0;
    uint64_t acq0 = counter(c, "table_acquires");
    /* then each member in turn: leased, written, published, taken by c, released by p */
    while (n < MANY_HOLDS) {
        shmref_buf *b;
        int r = shmref_lease(p, MANY_SIZE, &b);
        if (r < 0) {
            fprintf(stderr, "lease %u: %s\n", n, shmref_errmsg(p));
            break;
        }
        h[n].seed = ++gen;
        fill_pattern(shmref_buf_data(b), MANY_SIZE, gen);
        shmref_desc desc;
        cr_assert_eq(shmref_publish(b, MANY_SIZE, 0, NULL, 0, &desc), 0, "publish: %s", shmref_errmsg(p));
        /* c maps the buffer through a daemon acquire (table.takes), released (the
         * mapping stays cached, idle), then takes its hold in the table: a hold the daemon
         * does not see (past the fd-once cap, where the mapping is not cached, the second
         * acquire is a daemon handle too: counted apart) */
        shmref_buf *first;
        uint64_t before = counter(c, "table_acquires");
        int r1 = shmref_acquire(c, &desc, &first);
        if (r1 < 0) {
            fprintf(stderr, "acquire %u: %s\n", n, shmref_errmsg(c));
            shmref_release(b);
            break;
        }
        shmref_release(first); /* its mapping stays cached (idle) for the next acquire */
        int r2 = shmref_acquire(c, &desc, &h[n].b);
        if (r2 < 0)
            fprintf(stderr, "second acquire %u: %s\n", n, shmref_errmsg(c));
        bool local = counter(c, "table_acquires") > before;
        if (!local)
            daemon_holds++;
        shmref_release(b);
        n++;
        if (r2 < 0)
            break;
    }
    uint64_t local = counter(c, "table_acquires") - acq0;
    cr_assert_gt(n, 8448, "only %u holds (%llu in the table): the test did not pass the old limit", n,
                 (unsigned long long)local);
    uint64_t members = st(c, "table.members");
    /* the producer goes on: every lease of the churn can only be a buffer no one holds */
    uint64_t leases0 = counter(p, "table_leases");
    for (unsigned i = 0; i < 2000; i++) {
        shmref_buf *b;
        cr_assert_eq(shmref_lease(p, MANY_SIZE, &b), 0, "churn lease: %s", shmref_errmsg(p));
        fill_pattern(shmref_buf_data(b), MANY_SIZE, 0x80000000u + i);
        shmref_desc desc;
        cr_assert_eq(shmref_publish(b, MANY_SIZE, 0, NULL, 0, &desc), 0);
        if (i % 4 == 0) { /* sometimes a hold of its own, given back at once */
            shmref_buf *a;
            cr_assert_eq(shmref_acquire(c, &desc, &a), 0);
            shmref_release(a);
        }
        shmref_release(b);
    }
    unsigned wrong = 0;
    for (unsigned i = 0; i < n; i++) {
        ssize_t off = check_pattern(shmref_buf_data(h[i].b), MANY_SIZE, h[i].seed);
        if (off != -1 && wrong++ < 5)
            fprintf(stderr, "hold %u (generation %u) differs at byte %zd\n", i, h[i].seed, off);
    }
    printf("many holds: %u holds on one connection (%llu taken in the table, %u daemon handles), %llu table "
           "members, 2000 churn leases (%llu from the table): %u held buffers read another generation\n", n,
           (unsigned long long)local, daemon_holds,
           (unsigned long long)members, (unsigned long long)(counter(p, "table_leases") - leases0), wrong);
    cr_assert_gt(local, 4096, "only %llu holds were taken in the table", (unsigned long long)local);
    cr_assert_eq(wrong, 0, "%u held buffers were recycled under their holds", wrong);
    for (unsigned i = 0; i < n; i++)
        shmref_release(h[i].b);
    free(h);
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- 3. a consumer racing recycles ------------------------------------------------- */

#define RACE_SIZE 65536
#define RACE_PAGE 4096

struct race {
    _Atomic bool stop;
    _Atomic uint64_t gens, dropped, local, daemon, enoent, wrong;
};
static struct race *race;

struct race_msg {
    shmref_desc desc;
    uint64_t gen;
};

/* stamp: every 8 bytes of every page say gen (a page a recycle rewrote says another). */
static void stamp(void *p, uint64_t gen)
{
    uint64_t *w = p;
    for (size_t i = 0; i < RACE_SIZE / 8; i++)
        w[i] = gen;
}

/* wrong_pages: pages of p with any word other than gen. */
static unsigned wrong_pages(const void *p, uint64_t gen)
{
    const uint64_t *w = p;
    unsigned bad = 0;
    for (size_t pg = 0; pg < RACE_SIZE / RACE_PAGE; pg++)
        for (size_t i = 0; i < RACE_PAGE / 8; i++)
            if (w[pg * RACE_PAGE / 8 + i] != gen) {
                bad++;
                break;
            }
    return bad;
}

/* race_producer: recycles as fast as it can; the last two publishes stay held (so the
 * consumer can find them), every older one is released at once. */
static int race_producer(void *arg)
{
    int s = *(int *)arg;
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    shmref_buf *keep[2] = { NULL, NULL };
    uint64_t gen = 0;
    while (!atomic_load(&race->stop)) {
        shmref_buf *b;
        if (shmref_lease(c, RACE_SIZE, &b) < 0) {
            fprintf(stderr, "race producer lease: %s\n", shmref_errmsg(c));
            return 102;
        }
        stamp(shmref_buf_data(b), ++gen);
        struct race_msg m = { .gen = gen };
        if (shmref_publish(b, RACE_SIZE, 0, NULL, 0, &m.desc) < 0)
            return 103;
        if (send(s, &m, sizeof(m), MSG_DONTWAIT) != (ssize_t)sizeof(m))
            atomic_fetch_add(&race->dropped, 1);
        if (keep[gen % 2])
            shmref_release(keep[gen % 2]);
        keep[gen % 2] = b;
    }
    atomic_store(&race->gens, gen);
    shmref_close(c);
    return 0;
}

static int race_consumer(void *arg)
{
    int s = *(int *)arg;
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    shmref_set_acquire_wait(c, 0); /* a descriptor whose buffer went is ENOENT at once */
    uint32_t rnd = (uint32_t)getpid() | 1;
    uint64_t n_daemon = 0, enoent = 0, wrong = 0;
    struct race_msg m, prev = { .gen = 0 };
    while (!atomic_load(&race->stop)) {
        struct pollfd pfd = { .fd = s, .events = POLLIN };
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        /* the newest descriptor (the queue drained), sometimes the one before it */
        bool any = false;
        while (recv(s, &m, sizeof(m), MSG_DONTWAIT) == (ssize_t)sizeof(m)) {
            if (any)
                prev = m;
            any = true;
        }
        if (!any)
            continue;
        struct race_msg *which = (xorshift(&rnd) & 3) == 0 && prev.gen ? &prev : &m;
        uint64_t before = ctr(c, "table_acquires");
        shmref_buf *b;
        int r = shmref_acquire(c, &which->desc, &b);
        if (r < 0) {
            if (r != -ENOENT) {
                fprintf(stderr, "race consumer acquire: %d %s\n", r, shmref_errmsg(c));
                return 102;
            }
            enoent++;
            continue;
        }
        bool local = ctr(c, "table_acquires") > before;
        n_daemon += !local;
        unsigned bad = wrong_pages(shmref_buf_data(b), which->gen);
        if ((xorshift(&rnd) & 7) == 0) { /* held a while: recycles meet the hold */
            usleep(200);
            bad += wrong_pages(shmref_buf_data(b), which->gen);
        }
        if (bad)
            fprintf(stderr, "race: %u pages not of generation %llu under its token (%s)\n", bad,
                    (unsigned long long)which->gen, local ? "table take" : "daemon");
        wrong += bad;
        shmref_release(b);
    }
    atomic_store(&race->local, ctr(c, "table_acquires"));
    atomic_store(&race->daemon, n_daemon);
    atomic_store(&race->enoent, enoent);
    atomic_store(&race->wrong, wrong);
    shmref_close(c);
    return wrong ? 103 : 0;
}

/* Generations are stamped on every page and checked under the consumer's hold (and again
 * after 200 us for one in eight). Fails if a take's word CAS did not check seq and state
 * together with the count (a take of a buffer just recycled), or a give pushed the buffer
 * with a hold left, or the producer's publish made it PUBLISHED before its bytes (release
 * order): a page of a later generation under an old token. Tried: handoff_take without
 * its tokhash/size check read 98,448 wrong pages in 3 s. */
Test(table, consumer_racing_recycles_never_reads_a_new_generation)
{
    daemon_start(&d, NULL);
    race = mmap(NULL, sizeof(*race), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(race, MAP_FAILED);
    memset(race, 0, sizeof(*race));
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), 0);
    pid_t cons = child_run(race_consumer, &sv[1]);
    pid_t prod = child_run(race_producer, &sv[0]);
    close(sv[0]);
    close(sv[1]);
    long ms = getenv("SHMREF_TABLE_RACE_MS") ? atol(getenv("SHMREF_TABLE_RACE_MS")) : 10000;
    usleep((useconds_t)ms * 1000); /* the duration, not a wait for a state */
    atomic_store(&race->stop, true);
    cr_assert_eq(child_wait(prod), 0, "the producer failed");
    int cr = child_wait(cons);
    printf("race (%ld ms): %llu generations (%llu descriptors dropped, queue full); consumer: %llu table takes, "
           "%llu daemon acquires, %llu ENOENT; %llu wrong pages\n", ms, (unsigned long long)race->gens,
           (unsigned long long)race->dropped, (unsigned long long)race->local, (unsigned long long)race->daemon,
           (unsigned long long)race->enoent, (unsigned long long)race->wrong);
    cr_assert_eq(race->wrong, 0, "the consumer read %llu pages of another generation", (unsigned long long)race->wrong);
    cr_assert_eq(cr, 0, "the consumer failed");
    cr_assert_gt(race->local, 0, "no table take happened: the race was not tested");
    cr_assert_gt(race->daemon + race->enoent, 0, "no daemon path happened: the race was not tested");
    munmap(race, sizeof(*race));
    daemon_stop(&d);
}

static int raw_send(int fd, struct proto_msg *m);

/* ---- 4. SIGKILL between steps is reclaimed within 10 ms --------------------------- */

#define KILLS 25

/* killee: two connections of one process leasing, publishing, taking and giving at
 * random, with up to 6 holds alive; says "running" once after its first take. */
static int killee(void *arg)
{
    int ready = *(int *)arg;
    shmref_conn *p, *c;
    if (shmref_connect(d.socket, &p) < 0 || shmref_connect(d.socket, &c) < 0)
        return 101;
    uint32_t rnd = (uint32_t)getpid() | 1;
    shmref_buf *held[6] = { 0 };
    bool told = false;
    for (;;) {
        unsigned i = xorshift(&rnd) % 6;
        if (held[i]) {
            shmref_release(held[i]);
            held[i] = NULL;
            continue;
        }
        shmref_buf *b;
        if (shmref_lease(p, SIZE, &b) < 0)
            return 102;
        memset(shmref_buf_data(b), (int)i, 64);
        shmref_desc desc;
        if (shmref_publish(b, SIZE, 0, NULL, 0, &desc) < 0)
            return 103;
        if (shmref_acquire(c, &desc, &held[i]) < 0)
            return 104;
        unsigned j = (i + 1) % 6;
        if (!held[j])
            held[j] = b; /* the producer's hold kept */
        else
            shmref_release(b);
        if (!told && ctr(c, "table_acquires") > 0) {
            told = true;
            if (write(ready, "r", 1) != 1)
                return 105;
        }
    }
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

static long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

/* The child is SIGKILLed at a random point of its loop (a random delay after it runs);
 * from waitpid the parent polls status until the child's two journals are gone (the
 * daemon read them and dropped their holds) and its daemon handles too (buffers.leases
 * 0: the parent has no stock), then leases every member of the table
 * itself: each must be served from the table (its free list), but for at most one more
 * per kill (a step cut between its two stores: a leaked hold, by design). On the
 * ledger design nothing read a dead consumer's ledger until a sweep (a kill left buffers
 * LENT); with take's two stores in the other order a kill between them would drop a hold
 * the word never had: a member with holds of a live process pushed early, or a count
 * that never reaches 0 (the parent's leases would then go to the daemon). Tried: with
 * tenantdir_leave's handoff_reclaim skipped, kill 0 left 2 of 6 members held. */
Test(table, sigkill_between_steps_is_reclaimed_within_10ms)
{
    setenv("SHMREF_STOCK", "0", 1); /* no lease is the daemon's but the child's */
    daemon_start(&d, NULL);
    shmref_conn *s = connect_ok(&d); /* keeps the uid's table across the kills; asks status */
    uint32_t rnd = 12345;
    long us[KILLS];
    uint64_t crash0 = st(s, "table.crash_holds"), held_before = 0;
    unsigned leaks = 0;
    for (int k = 0; k < KILLS; k++) {
        int pfd[2];
        cr_assert_eq(pipe(pfd), 0);
        pid_t pid = child_run(killee, &pfd[1]);
        close(pfd[1]);
        char x;
        cr_assert_eq(read(pfd[0], &x, 1), 1, "the child failed before it ran");
        close(pfd[0]);
        usleep(xorshift(&rnd) % 20000);
        kill(pid, SIGKILL);
        child_wait(pid);
        long t0 = now_us();
        while ((st(s, "table.journals") != 1 || st(s, "buffers.leases") != 0) && now_us() - t0 < 5000000)
            ;
        us[k] = now_us() - t0;
        cr_assert_eq(st(s, "table.journals"), 1, "the killed child's journals were still read after 5 s");
        cr_assert_eq(st(s, "buffers.leases"), 0, "the killed child's daemon handles were still held after 5 s");
        /* every member is free again (the parent's leases are served from the table) but
         * at most one more than before: the one step the kill may have cut between its two
         * stores (take, lease: the word counted, the journal not yet; give: the journal
         * given, the word not yet) leaves the word one too high, by design (handoff.h: a
         * leaked hold, never an early recycle), until the tenant is quiet (checked below) */
        uint64_t members = st(s, "table.members"), l0 = counter(s, "table_leases");
        shmref_buf **b = calloc(members + 1, sizeof(*b));
        unsigned got = 0;
        for (uint64_t i = 0; i < members; i++) {
            uint64_t before = counter(s, "table_leases");
            cr_assert_eq(shmref_lease(s, SIZE, &b[got]), 0, "lease: %s", shmref_errmsg(s));
            if (counter(s, "table_leases") == before) { /* the free list is empty */
                shmref_release(b[got]);
                break;
            }
            got++;
        }
        uint64_t held = members - (counter(s, "table_leases") - l0);
        if (held > held_before) {
            leaks++;
            fprintf(stderr, "kill %d: %llu of %llu members held after the reclaim (%llu before)\n", k,
                    (unsigned long long)held, (unsigned long long)members, (unsigned long long)held_before);
        }
        cr_assert_leq(held, held_before + 1, "kill %d: %llu members held after the reclaim, %llu before: the dead "
                      "child's holds were not dropped", k, (unsigned long long)held, (unsigned long long)held_before);
        held_before = held;
        for (unsigned i = 0; i < got; i++)
            shmref_release(b[i]);
        free(b);
    }
    long sorted[KILLS];
    memcpy(sorted, us, sizeof(us));
    qsort(sorted, KILLS, sizeof(long), cmp_long);
    uint64_t crash = st(s, "table.crash_holds") - crash0;
    printf("sigkill: %d kills, reclaimed (journals read, holds and handles dropped) in median %.2f ms, worst %.2f ms, best "
           "%.2f ms; %llu crash holds dropped; %u kills cut a step between its two stores (a leaked hold, or a free entry off its list)\n",
           KILLS, sorted[KILLS / 2] / 1000.0, sorted[KILLS - 1] / 1000.0, sorted[0] / 1000.0,
           (unsigned long long)crash, leaks);
    cr_assert_gt(crash, 0, "no kill found a hold to drop: the reclaim was not tested");
    cr_assert_leq(sorted[KILLS / 2], 10000, "median reclaim %.2f ms, over the issue's 10 ms",
                  sorted[KILLS / 2] / 1000.0);
    /* what the leaked holds are: the table read through a raw hello's fd (no live
     * process holds anything now, the parent's leases are all released) */
    uint64_t words_held = 0;
    {
        int fd = raw_connect(&d);
        static uint8_t rb[PROTO_MAX_REPLY];
        struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
        m.u.hello.version = PROTO_VERSION;
        m.u.hello.features = PROTO_FEAT_FD_ONCE | PROTO_FEAT_TABLE;
        m.u.hello.name = "look";
        m.u.hello.name_len = 4;
        cr_assert_eq(raw_send(fd, &m), 0);
        int fds[4];
        unsigned nf = 0;
        ssize_t len = rawclient_recv_fds(fd, rb, sizeof(rb), fds, 4, &nf, 5000);
        const char *why;
        cr_assert(len > 0 && proto_decode(rb, (size_t)len, sizeof(rb), &r, &why) == 0 && nf == 2);
        size_t tlen = handoff_size(HANDOFF_MAX_SLOTS);
        void *tab = mmap(NULL, tlen, PROT_READ, MAP_SHARED, fds[0], 0);
        cr_assert_neq(tab, MAP_FAILED);
        for (uint32_t slot = 0; slot < HANDOFF_MAX_SLOTS; slot++) {
            uint64_t w = atomic_load(&handoff_entry_at(tab, slot)->word);
            if (handoff_count_of(w)) {
                words_held += handoff_count_of(w);
                printf("sigkill: slot %u left with count %u, state %u (%s), flags 0x%x\n", slot, handoff_count_of(w),
                       handoff_state_of(w), handoff_state_of(w) == HANDOFF_LEASED ? "leased" : "published",
                       handoff_flags_of(w));
            }
        }
        /* and the free lists as they are linked now */
        const struct handoff_header *hh = tab;
        uint64_t linked = 0;
        for (unsigned cl = 0; cl < HANDOFF_CLASSES; cl++)
            for (uint32_t at = (uint32_t)atomic_load(&hh->head[cl]); at && linked <= HANDOFF_MAX_SLOTS; linked++)
                at = atomic_load(&handoff_entry_at(tab, at - 1)->next);
        uint64_t members = st(s, "table.members");
        printf("sigkill: at the end %llu members: %llu on a free list, %llu holds in words, %llu free but "
               "unlinked (a kill between a pop's or a push's two steps)\n", (unsigned long long)members,
               (unsigned long long)linked, (unsigned long long)words_held,
               (unsigned long long)(members - linked - words_held));
        munmap(tab, tlen);
        close(fds[0]);
        close(fds[1]);
        close(fd);
    }
    cr_assert_leq(words_held, leaks, "%llu holds left in the table's words, more than the %u kills that cut a step",
                  (unsigned long long)words_held, leaks);
    /* the tenant quiet (its last connection gone): the table goes back whole, leaked
     * holds and all */
    shmref_close(s);
    uint64_t members = wait_status(&d, "table.members", 0, 5000);
    uint64_t leases = wait_status(&d, "buffers.leases", 0, 5000);
    cr_assert_eq(members, 0, "%llu members left after the uid's last connection", (unsigned long long)members);
    cr_assert_eq(leases, 0, "%llu leases left after the uid's last connection", (unsigned long long)leases);
    daemon_stop(&d);
}

/* ---- 5. another uid ------------------------------------------------------------- */

struct other {
    shmref_desc desc;
    uint32_t seed;
};

/* other_lib: uid 65534 acquires the publish through libshmref: a read-only mapping of the
 * bytes (a write in a grandchild faults), nothing taken in a table. */
static int other_lib(void *arg)
{
    struct other *o = arg;
    if (become(OTHER_UID) < 0)
        return 100;
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    shmref_buf *a;
    if (shmref_acquire(c, &o->desc, &a) < 0) {
        fprintf(stderr, "other uid acquire: %s\n", shmref_errmsg(c));
        return 102;
    }
    if (check_pattern(shmref_buf_data(a), SIZE, o->seed) != -1)
        return 103;
    if (shmref_buf_writable(a))
        return 104;
    if (ctr(c, "table_acquires") != 0)
        return 105;
    pid_t g = fork();
    if (g == 0) {
        signal(SIGSEGV, SIG_DFL); /* the kernel's fault, not a sanitizer's report and exit */
        ((volatile uint8_t *)shmref_buf_data(a))[0] = 1;
        _exit(0);
    }
    int ws;
    if (waitpid(g, &ws, 0) != g || !WIFSIGNALED(ws))
        return 106; /* the write went through */
    shmref_release(a);
    shmref_close(c);
    return 0;
}

/* other_hold: uid 65534 acquires and holds until told (a byte on go), then releases. */
struct other_hold_arg {
    struct other *o;
    int ready, go;
};

static int other_hold(void *arg)
{
    struct other_hold_arg *h = arg;
    if (become(OTHER_UID) < 0)
        return 100;
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    shmref_buf *a;
    if (shmref_acquire(c, &h->o->desc, &a) < 0)
        return 102;
    if (check_pattern(shmref_buf_data(a), SIZE, h->o->seed) != -1 || shmref_buf_writable(a))
        return 103;
    char x = 'h';
    if (write(h->ready, &x, 1) != 1 || read(h->go, &x, 1) != 1)
        return 104;
    if (check_pattern(shmref_buf_data(a), SIZE, h->o->seed) != -1)
        return 105;
    shmref_release(a);
    shmref_close(c);
    return 0;
}

static int raw_send(int fd, struct proto_msg *m)
{
    uint8_t buf[PROTO_MAX_REQUEST];
    int n = proto_encode(m, buf, sizeof(buf));
    return n < 0 ? n : rawclient_send(fd, buf, (size_t)n);
}

/* raw_next: the next message within ms; its fd (or -1) into *fd. <= 0: none. */
static ssize_t raw_next(int fd, struct proto_msg *r, uint8_t *buf, int *rfd)
{
    int fds[4];
    unsigned n = 0;
    ssize_t len = rawclient_recv_fds(fd, buf, PROTO_MAX_REPLY, fds, 4, &n, 5000);
    if (rfd)
        *rfd = n ? fds[0] : -1;
    for (unsigned i = rfd ? 1 : 0; i < n; i++)
        close(fds[i]);
    if (len <= 0)
        return len;
    const char *why;
    return proto_decode(buf, (size_t)len, PROTO_MAX_REPLY, r, &why) == 0 ? len : -EPROTO;
}

/* other_raw: uid 65534 speaks raw: a hello with PROTO_FEAT_TABLE (it gets a table of its
 * own), an acquire of the publish (buf_id and a read-only fd), then MAP, GIVEBACK and ADOPT
 * of that buf_id: refused with ESTALE, or ignored (GIVEBACK has no reply: a ping's is next). */
static int other_raw(void *arg)
{
    struct other *o = arg;
    static uint8_t buf[PROTO_MAX_REPLY];
    if (become(OTHER_UID) < 0)
        return 100;
    int fd = rawclient_connect(d.socket);
    if (fd < 0)
        return 101;
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, r;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.features = PROTO_FEAT_FD_ONCE | PROTO_FEAT_TABLE;
    m.u.hello.name = "other";
    m.u.hello.name_len = 5;
    if (raw_send(fd, &m) < 0 || raw_next(fd, &r, buf, NULL) <= 0 || r.op != PROTO_OP_HELLO + PROTO_OP_REPLY)
        return 102;
    if (!(r.u.hello_reply.features & PROTO_FEAT_TABLE))
        return 103;
    m = (struct proto_msg){ .op = PROTO_OP_ACQUIRE, .id = 2 };
    memcpy(m.u.acquire.token, o->desc.token, PROTO_TOKEN_LEN);
    int bfd;
    if (raw_send(fd, &m) < 0 || raw_next(fd, &r, buf, &bfd) <= 0 || r.op != PROTO_OP_ACQUIRE + PROTO_OP_REPLY)
        return 104;
    uint64_t buf_id = r.u.acquire_reply.buf_id, handle = r.u.acquire_reply.handle;
    if (bfd < 0)
        return 105;
    if (mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, bfd, 0) != MAP_FAILED)
        return 106; /* a writable mapping of another uid's buffer */
    void *ro = mmap(NULL, SIZE, PROT_READ, MAP_SHARED, bfd, 0);
    if (ro == MAP_FAILED || check_pattern(ro, SIZE, o->seed) != -1)
        return 107;
    m = (struct proto_msg){ .op = PROTO_OP_MAP, .id = 3 };
    m.u.map.buf_id = buf_id;
    int mfd;
    if (raw_send(fd, &m) < 0 || raw_next(fd, &r, buf, &mfd) <= 0)
        return 108;
    if (r.op != PROTO_OP_ERROR || r.u.error.code != ESTALE || mfd >= 0) {
        fprintf(stderr, "other uid's MAP of buffer %llu: op %u code %d fd %d\n", (unsigned long long)buf_id, r.op,
                r.op == PROTO_OP_ERROR ? (int)r.u.error.code : 0, mfd);
        return 109;
    }
    m = (struct proto_msg){ .op = PROTO_OP_GIVEBACK, .id = 4 };
    m.u.giveback.buf_id = buf_id;
    if (raw_send(fd, &m) < 0)
        return 110;
    for (uint32_t seq = 0; seq < 4; seq++) {
        m = (struct proto_msg){ .op = PROTO_OP_ADOPT, .id = 5 + seq };
        m.u.adopt.buf_id = buf_id;
        m.u.adopt.seq = seq;
        if (raw_send(fd, &m) < 0 || raw_next(fd, &r, buf, NULL) <= 0)
            return 111;
        if (r.id != 5 + seq || r.op != PROTO_OP_ERROR || r.u.error.code != ESTALE) {
            fprintf(stderr, "other uid's ADOPT of buffer %llu seq %u: op %u id %u code %d\n",
                    (unsigned long long)buf_id, seq, r.op, r.id, r.op == PROTO_OP_ERROR ? (int)r.u.error.code : 0);
            return 112;
        }
    }
    m = (struct proto_msg){ .op = PROTO_OP_PING, .id = 20 };
    if (raw_send(fd, &m) < 0 || raw_next(fd, &r, buf, NULL) <= 0 || r.op != PROTO_OP_PING + PROTO_OP_REPLY ||
        r.id != 20)
        return 113;
    if (check_pattern(ro, SIZE, o->seed) != -1)
        return 114;
    munmap(ro, SIZE);
    close(bfd);
    m = (struct proto_msg){ .op = PROTO_OP_RELEASE, .id = 21 };
    m.u.release.handle = handle;
    if (raw_send(fd, &m) < 0 || raw_next(fd, &r, buf, NULL) <= 0 || r.op != PROTO_OP_RELEASE + PROTO_OP_REPLY)
        return 115;
    close(fd);
    return 0;
}

/* Root publishes in its table; uid 65534 acquires it (libshmref, then raw). On a daemon
 * that served another uid's acquire from the table (or sent the table member's O_RDWR fd)
 * the mapping would be writable; one that let another uid MAP or ADOPT root's buffer by
 * buf_id would answer with an fd or a handle; one that recycled the buffer locally after
 * another uid mapped it (no OUT) would lease it to root again: table.members would not
 * drop and no giveback would come (tried: acquire.c not marking the buffer foreign sent
 * no giveback, and the table kept its 2 members). Both orders: the other uid releases
 * first (root's last local give sends GIVEBACK), or last (the daemon's give ends it). */
Test(table, another_uid_gets_read_only_bytes_and_retires_the_buffer)
{
    daemon_start(&d, "--socket-mode", "0666", NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    for (uint32_t i = 1; i <= 4; i++)
        cr_assert(handoff(p, c, i, SIZE));
    cr_assert_eq(shmref_ping(p), 0); /* every release seen: the members are all in */
    cr_assert_eq(shmref_ping(c), 0);
    uint64_t l0 = counter(p, "table_leases");
    shmref_buf *b;
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0);
    cr_assert_eq(counter(p, "table_leases"), l0 + 1, "the lease was not served from the table");
    struct other *o = mmap(NULL, sizeof(*o), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(o, MAP_FAILED);
    o->seed = 777;
    fill_pattern(shmref_buf_data(b), SIZE, o->seed);
    uint64_t pub0 = counter(p, "table_publishes");
    cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &o->desc), 0);
    cr_assert_eq(counter(p, "table_publishes"), pub0 + 1, "the publish was not made in the table");
    /* root's consumer holds it in the table meanwhile */
    shmref_buf *a;
    cr_assert_eq(shmref_acquire(c, &o->desc, &a), 0);
    uint64_t ign0 = st(c, "table.ignored"), takes0 = st(c, "table.takes"), gb0 = st(c, "table.givebacks");
    int rl = child_wait(child_run(other_lib, o));
    cr_assert_eq(rl, 0, "uid %d through libshmref: exit %d (see other_lib)", OTHER_UID, rl);
    int rr = child_wait(child_run(other_raw, o));
    cr_assert_eq(rr, 0, "uid %d raw: exit %d (see other_raw)", OTHER_UID, rr);
    uint64_t ign = st(c, "table.ignored") - ign0, takes = st(c, "table.takes") - takes0;
    /* the producer is unaffected: its bytes, its holds, its connection */
    cr_assert_eq(check_pattern(shmref_buf_data(b), SIZE, o->seed), -1, "the producer's bytes changed");
    cr_assert_eq(check_pattern(shmref_buf_data(a), SIZE, o->seed), -1, "the consumer's bytes changed");
    cr_assert_eq(shmref_ping(p), 0, "the producer's connection: %s", shmref_errmsg(p));
    uint64_t members0 = st(c, "table.members"); /* (after round trips: every release seen) */
    uint64_t gbp0 = counter(p, "table_givebacks") + counter(c, "table_givebacks");
    shmref_release(a);
    shmref_release(b);
    uint64_t gbp = counter(p, "table_givebacks") + counter(c, "table_givebacks") - gbp0;
    uint64_t members = wait_st(c, "table.members", members0 - 1, 5000);
    uint64_t gb = st(c, "table.givebacks") - gb0;
    printf("other uid: %llu daemon takes of the table publish, %llu requests ignored, %llu givebacks "
           "(client %llu); table members %llu -> %llu\n", (unsigned long long)takes, (unsigned long long)ign,
           (unsigned long long)gb, (unsigned long long)gbp, (unsigned long long)members0,
           (unsigned long long)members);
    cr_assert_geq(takes, 1, "the other uid's acquire was not served as a daemon take");
    cr_assert_geq(ign, 2, "the other uid's MAP and GIVEBACK were not counted as ignored");
    cr_assert_eq(gbp, 1, "the last local give did not send the giveback");
    cr_assert_eq(members, members0 - 1, "the buffer another uid mapped stayed in the table");
    /* and root's later leases never have it: the rest of the free list, then fresh ones */
    uint64_t l1 = counter(p, "table_leases");
    shmref_buf *n[8];
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(shmref_lease(p, SIZE, &n[i]), 0);
        fill_pattern(shmref_buf_data(n[i]), SIZE, 900 + (uint32_t)i);
    }
    for (int i = 0; i < 8; i++)
        shmref_release(n[i]);
    /* the fresh ones join the table when the daemon reads their releases (one-way): a round
     * trip on the same connection comes after them (the sanitized fresh-clone CI run leased
     * again before the daemon had, and got a daemon lease) */
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(counter(p, "table_leases") - l1, members0 - 1,
                 "8 leases found %llu buffers in the table, which had %llu members left",
                 (unsigned long long)(counter(p, "table_leases") - l1), (unsigned long long)(members0 - 1));

    /* the other order: root's holds go first, the other uid's daemon hold last: the
     * daemon's give finds it OUT and ends it (no giveback from root) */
    l1 = counter(p, "table_leases");
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0);
    cr_assert_eq(counter(p, "table_leases"), l1 + 1, "the lease was not served from the table");
    o->seed = 778;
    fill_pattern(shmref_buf_data(b), SIZE, o->seed);
    cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &o->desc), 0);
    int rp[2], gp[2];
    cr_assert_eq(pipe(rp), 0);
    cr_assert_eq(pipe(gp), 0);
    struct other_hold_arg ha = { .o = o, .ready = rp[1], .go = gp[0] };
    pid_t hp = child_run(other_hold, &ha);
    char x;
    cr_assert_eq(read(rp[0], &x, 1), 1, "uid %d's holder failed", OTHER_UID);
    gbp0 = counter(p, "table_givebacks");
    shmref_release(b);
    cr_assert_eq(shmref_ping(p), 0);
    uint64_t members1 = st(c, "table.members");
    cr_assert_eq(write(gp[1], "g", 1), 1);
    int rh = child_wait(hp);
    cr_assert_eq(rh, 0, "uid %d's holder: exit %d (see other_hold)", OTHER_UID, rh);
    uint64_t members2 = wait_st(c, "table.members", members1 - 1, 5000);
    printf("other uid, its release last: table members %llu -> %llu, root's givebacks %llu\n",
           (unsigned long long)members1, (unsigned long long)members2,
           (unsigned long long)(counter(p, "table_givebacks") - gbp0));
    cr_assert_eq(members2, members1 - 1, "the buffer another uid held last stayed in the table");
    cr_assert_eq(counter(p, "table_givebacks"), gbp0, "root gave back a buffer the daemon still held");
    for (int i = 0; i < 2; i++) {
        close(rp[i]);
        close(gp[i]);
    }
    munmap(o, sizeof(*o));
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- 6. retention, max_acquires, sealed ----------------------------------------- */

struct keeper {
    int out;
    uint32_t keep_ms, max_acquires;
};

/* keeper: a table lease published with a retention (and a cap), released; exits. */
static int keeper(void *arg)
{
    struct keeper *k = arg;
    shmref_conn *c, *c2;
    if (shmref_connect(d.socket, &c) < 0 || shmref_connect(d.socket, &c2) < 0)
        return 101;
    for (uint32_t i = 1; i <= 3; i++)
        if (!handoff(c, c2, i, SIZE))
            return 102;
    if (shmref_ping(c) < 0) /* every release seen: the members are all in */
        return 102;
    uint64_t l0 = ctr(c, "table_leases"), a0 = ctr(c, "table_adopts");
    shmref_buf *b;
    if (shmref_lease(c, SIZE, &b) < 0 || ctr(c, "table_leases") != l0 + 1)
        return 103;
    fill_pattern(shmref_buf_data(b), SIZE, 4242);
    struct msg m = { .seed = 4242 };
    if (shmref_publish_ex(b, SIZE, k->keep_ms, k->max_acquires, 0, "m", 1, &m.desc) < 0) {
        fprintf(stderr, "publish_ex: %s\n", shmref_errmsg(c));
        return 104;
    }
    if (ctr(c, "table_adopts") != a0 + 1)
        return 105;
    shmref_release(b);
    shmref_close(c2);
    shmref_close(c);
    return write(k->out, &m, sizeof(m)) == (ssize_t)sizeof(m) ? 0 : 106;
}

static struct msg run_keeper(uint32_t keep_ms, uint32_t max_acquires)
{
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    struct keeper k = { .out = pfd[1], .keep_ms = keep_ms, .max_acquires = max_acquires };
    pid_t pid = child_run(keeper, &k);
    close(pfd[1]);
    struct msg m;
    cr_assert(read_full(pfd[0], &m, sizeof(m)), "the producer failed");
    close(pfd[0]);
    cr_assert_eq(child_wait(pid), 0, "the producer failed");
    return m;
}

/* A retention of a table lease: the producer released and exited (its uid's last
 * connection: the table went back to the pool), the consumer still acquires within
 * keep_ms; with max_acquires 1, once. With the publish made in the table despite keep_ms
 * (lease.c's condition without !keep_ms && !max_acquires: tried) the producer's own check
 * that it was adopted fails; without that check the buffer would go with the producer's
 * last give and the consumer's acquire would be ENOENT. */
Test(table, retention_and_max_acquires_of_a_table_lease)
{
    daemon_start(&d, NULL);
    struct msg m = run_keeper(60000, 0);
    shmref_conn *c = connect_ok(&d);
    shmref_set_acquire_wait(c, 0);
    for (int i = 0; i < 2; i++) {
        shmref_buf *a;
        cr_assert_eq(shmref_acquire(c, &m.desc, &a), 0, "acquire %d after the producer exited: %s", i,
                     shmref_errmsg(c));
        cr_assert_eq(check_pattern(shmref_buf_data(a), SIZE, m.seed), -1);
        shmref_release(a);
    }
    m = run_keeper(60000, 1);
    shmref_buf *a;
    cr_assert_eq(shmref_acquire(c, &m.desc, &a), 0, "the capped retention's first acquire: %s", shmref_errmsg(c));
    cr_assert_eq(check_pattern(shmref_buf_data(a), SIZE, m.seed), -1);
    shmref_release(a);
    cr_assert_eq(shmref_acquire(c, &m.desc, &a), -ENOENT, "max_acquires 1 allowed a second acquire");
    printf("retention: a retained table lease was acquired twice after its producer exited; max_acquires 1 "
           "ended it after one\n");
    shmref_close(c);
    daemon_stop(&d);
}

/* A sealed publish of a table lease: the consumer gets a sealed copy, the producer's
 * table lease goes back on its free list (the next lease is served from the table, the
 * table does not grow). Fails if the table buffer itself were sealed (the table would
 * lose a member, or later leases would write a sealed buffer), or the lease were leaked. */
Test(table, sealed_publish_of_a_table_lease)
{
    daemon_start(&d, "--memfd", NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    shmref_status *s;
    cr_assert_eq(shmref_status_get(c, &s), 0);
    const char *kind = NULL;
    shmref_status_str(s, "pool.kind", &kind);
    bool memfd = kind && strncmp(kind, "memfd", 5) == 0;
    shmref_status_free(s);
    if (!memfd) {
        shmref_close(c);
        shmref_close(p);
        daemon_stop(&d);
        cr_skip_test("sealed publishes need a memfd pool");
    }
    for (uint32_t i = 1; i <= 3; i++)
        cr_assert(handoff(p, c, i, SIZE));
    cr_assert_eq(shmref_ping(p), 0); /* every release seen: the members are all in */
    cr_assert_eq(shmref_ping(c), 0);
    uint64_t members0 = st(c, "table.members"), l0 = counter(p, "table_leases");
    shmref_buf *b;
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0);
    cr_assert_eq(counter(p, "table_leases"), l0 + 1);
    fill_pattern(shmref_buf_data(b), SIZE, 31337);
    shmref_desc desc;
    cr_assert_eq(shmref_publish_ex(b, SIZE, 0, 0, SHMREF_PUBLISH_SEALED, NULL, 0, &desc), 0, "sealed publish: %s",
                 shmref_errmsg(p));
    shmref_buf *a;
    cr_assert_eq(shmref_acquire_ex(c, &desc, SHMREF_ACQUIRE_SEALED, &a), 0, "sealed acquire: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_buf_sealed(a), 1, "the consumer's buffer is not sealed");
    cr_assert_eq(check_pattern(shmref_buf_data(a), SIZE, 31337), -1);
    shmref_release(b);
    shmref_release(a);
    uint64_t l1 = counter(p, "table_leases");
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0);
    cr_assert_eq(counter(p, "table_leases"), l1 + 1, "the next lease was not served from the table");
    cr_assert_eq(shmref_buf_writable(b), 1);
    memset(shmref_buf_data(b), 1, SIZE); /* a sealed table member would fault here */
    shmref_release(b);
    uint64_t members = st(c, "table.members");
    printf("sealed: table members %llu before, %llu after\n", (unsigned long long)members0,
           (unsigned long long)members);
    cr_assert_eq(members, members0, "the sealed publish changed the table's members");
    shmref_close(c);
    shmref_close(p);
    daemon_stop(&d);
}

/* ---- 7. idle close during local handoffs ----------------------------------------- */

/* With --idle-timeout 1 a connection that only hands off locally sends nothing: the
 * daemon closes it as idle (its journal CLOSED), and libshmref reconnects. Every handoff
 * must stay right and, once everything is closed, nothing may remain: no member (the
 * table went back with the uid's last connection), no lease. A client that kept taking
 * holds in a CLOSED journal would leak them (members left held); a daemon that closed a
 * connection holding table holds would drop them under a live process (wrong bytes).
 * Tried: with tenantdir_holds always false, 2 handoffs read wrong bytes. */
Test(table, idle_close_during_local_handoffs)
{
    setenv("SHMREF_STOCK", "0", 1); /* a stock of daemon leases is a hold: never idle */
    daemon_start(&d, "--idle-timeout", "1", NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    uint32_t seed = 1;
    unsigned bad = 0, rounds = 0;
    long t0 = now_ms();
    /* until both connections were closed for idleness and reconnected (or 30 s): rounds of
     * handoffs, then a pause holding nothing (both idle), or every other time a pause
     * longer than the timeout with c holding (c is not idle: a close would drop its hold,
     * and p's next lease could pop the buffer and write it under c's hold) */
    for (unsigned it = 0; (counter(p, "reconnects") < 2 || counter(c, "reconnects") < 2) && now_ms() - t0 < 30000;
         it++) {
        for (int i = 0; i < 20; i++, rounds++)
            bad += !handoff(p, c, seed++, SIZE);
        if (it % 2 == 0) {
            usleep(1500000);
            continue;
        }
        shmref_buf *b, *a;
        shmref_desc desc;
        cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "lease: %s", shmref_errmsg(p));
        fill_pattern(shmref_buf_data(b), SIZE, seed);
        cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &desc), 0);
        cr_assert_eq(shmref_acquire(c, &desc, &a), 0, "acquire: %s", shmref_errmsg(c));
        shmref_release(b);
        usleep(1500000);
        for (int i = 0; i < 4; i++, rounds++) /* any buffer the table has free is rewritten */
            bad += !handoff(p, p, 0x40000000u + seed + (uint32_t)i, SIZE);
        bad += check_pattern(shmref_buf_data(a), SIZE, seed++) != -1;
        shmref_release(a);
    }
    uint64_t rp = counter(p, "reconnects"), rc = counter(c, "reconnects");
    uint64_t lp = counter(p, "table_leases"), ac = counter(c, "table_acquires");
    shmref_close(c);
    shmref_close(p);
    uint64_t members = wait_status(&d, "table.members", 0, 5000);
    uint64_t leases = wait_status(&d, "buffers.leases", 0, 5000);
    printf("idle: %u handoffs over %ld ms, reconnects %llu and %llu, %llu table leases, %llu table acquires; "
           "%u wrong; after close: %llu members, %llu leases\n", rounds, now_ms() - t0, (unsigned long long)rp,
           (unsigned long long)rc, (unsigned long long)lp, (unsigned long long)ac, bad, (unsigned long long)members,
           (unsigned long long)leases);
    cr_assert_eq(bad, 0, "%u handoffs read wrong bytes", bad);
    cr_assert(rp > 0 && rc > 0, "no idle close happened on one of the connections: the test did not test it");
    cr_assert_gt(lp, 0, "no local lease happened");
    cr_assert_eq(members, 0, "table members left after every connection closed");
    cr_assert_eq(leases, 0, "leases left after every connection closed");
    daemon_stop(&d);
}
