/* SPDX-License-Identifier: MIT */
/* test-ledger-client.c: libshmref's half of same-tenant handoffs without the daemon
 * (issue 18, client-lib/localhold.c over proto/ledger.h), through a real shmrefd and real
 * processes: a steady-state handoff between two processes of one uid makes no round trip
 * and no wait on either side, every payload compared in full; a consumer of another uid
 * gets the same descriptors through the daemon; consumers racing recycles never read a
 * new generation's bytes under an old token (local takes and fallbacks both happen);
 * SIGKILLed consumers and producers are reclaimed; $SHMREF_LEDGER=0 is today's path; a
 * daemon that sends bad ledger files is refused without a fault. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "ledger.h"
#include "proto.h"
#include "rawclient.h"

#define SIZE 8192

/* Sanitized builds (SHMREF_SANITIZE): the daemon is several times slower. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static struct daemon d;

static void init(void)
{
    signal(SIGPIPE, SIG_IGN); /* a dead peer's pipe fails the write, and the test says so */
}

static void fini(void)
{
    reap_children();
}

TestSuite(ledger_client, .init = init, .fini = fini, .timeout = 240);

static uint64_t counter(shmref_conn *c, const char *name)
{
    uint64_t v = 0;
    cr_assert_eq(shmref_conn_counter(c, name, &v), 0, "no counter %s", name);
    return v;
}

/* status_has: one number of status, or UINT64_MAX when the daemon has none at path. */
static uint64_t status_or_none(const char *path)
{
    shmref_conn *c = connect_ok(&d);
    shmref_status *st;
    uint64_t v = UINT64_MAX;
    cr_assert_eq(shmref_status_get(c, &st), 0, "status: %s", shmref_errmsg(c));
    if (shmref_status_u64(st, path, &v) != 0)
        v = UINT64_MAX;
    shmref_status_free(st);
    shmref_close(c);
    return v;
}

/* wait_reclaimed: no lease held and (if the daemon reports it) nothing lent, within ms. */
static void wait_reclaimed(int ms, const char *what)
{
    long deadline = now_ms() + ms;
    uint64_t leases, lent;
    for (;;) {
        leases = status_u64(&d, "buffers.leases");
        lent = status_or_none("ledger.lent");
        if ((leases == 0 && (lent == 0 || lent == UINT64_MAX)) || now_ms() > deadline)
            break;
        usleep(5000);
    }
    cr_assert_eq(leases, 0, "%s: %llu leases still held after %d ms", what, (unsigned long long)leases, ms);
    cr_assert(lent == 0 || lent == UINT64_MAX, "%s: ledger.lent %llu after %d ms", what, (unsigned long long)lent,
              ms);
}

/* ---- (1), (5), (2): a ping-pong between two processes ---- */

/* What travels on the pipes: a descriptor and the seed of its whole payload, or a
 * request for the server's counters (seed 0 and size 0), or the counters. */
struct msg {
    shmref_desc desc;
    uint32_t seed;
    uint32_t bad;           /* server: payloads that did not match (reply to a stats request) */
    uint64_t round_trips, waits, ledger_acquires, ledger_fallbacks, stock_misses;
};

struct pingpong {
    int req[2], rep[2];
    bool ledger_off;
    unsigned uid;           /* the server's uid (0: the test's) */
    bool answer;            /* the server answers with its own output */
};

static void counters_of(shmref_conn *c, struct msg *m)
{
    shmref_conn_counter(c, "round_trips", &m->round_trips);
    shmref_conn_counter(c, "waits", &m->waits);
    shmref_conn_counter(c, "ledger_acquires", &m->ledger_acquires);
    shmref_conn_counter(c, "ledger_fallbacks", &m->ledger_fallbacks);
    shmref_conn_counter(c, "stock_misses", &m->stock_misses);
}

/* server: acquires each descriptor, checks its whole payload, and (if asked) answers with
 * an output of its own of the same size, published; the previous output is released then
 * (the client has acquired and released it by the time it asks again). */
static int server(void *arg)
{
    struct pingpong *pp = arg;
    close(pp->req[1]);
    close(pp->rep[0]);
    if (pp->uid && (setgid(pp->uid) < 0 || setuid(pp->uid) < 0))
        return 100;
    if (pp->ledger_off)
        setenv("SHMREF_LEDGER", "0", 1);
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    shmref_buf *out = NULL;
    uint32_t bad = 0, n = 0;
    struct msg m;
    while (read_full(pp->req[0], &m, sizeof(m))) {
        if (m.desc.size == 0) { /* the counters */
            struct msg s = { .bad = bad };
            counters_of(c, &s);
            if (write(pp->rep[1], &s, sizeof(s)) != sizeof(s))
                return 102;
            continue;
        }
        shmref_buf *in;
        int r = shmref_acquire(c, &m.desc, &in);
        if (r < 0) {
            fprintf(stderr, "server uid %u acquire: %d %s\n", pp->uid, r, shmref_errmsg(c));
            return 103;
        }
        if (shmref_buf_size(in) != m.desc.size || check_pattern(shmref_buf_data(in), m.desc.size, m.seed) != -1)
            bad++;
        struct msg o = { .seed = m.seed ^ 0x5a5a5a5au ^ ++n };
        if (pp->answer) {
            if (out)
                shmref_release(out);
            if (shmref_lease(c, m.desc.size, &out) < 0)
                return 104;
            fill_pattern(shmref_buf_data(out), m.desc.size, o.seed);
            if (shmref_publish(out, m.desc.size, 0, NULL, 0, &o.desc) < 0)
                return 105;
        }
        shmref_release(in);
        if (write(pp->rep[1], &o, sizeof(o)) != sizeof(o))
            return 106;
    }
    if (out)
        shmref_release(out);
    shmref_close(c);
    return bad ? 107 : 0;
}

/* round: one request (a fresh lease, whole payload written, published) and its answer
 * (acquired, whole payload compared, released). Returns false on a mismatch. */
static bool round_trip(shmref_conn *c, struct pingpong *pp, uint32_t seed, size_t size)
{
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, size, &b), 0, "lease: %s", shmref_errmsg(c));
    fill_pattern(shmref_buf_data(b), size, seed);
    struct msg m = { .seed = seed };
    cr_assert_eq(shmref_publish(b, size, 0, NULL, 0, &m.desc), 0, "publish: %s", shmref_errmsg(c));
    cr_assert_eq(write(pp->req[1], &m, sizeof(m)), (ssize_t)sizeof(m));
    struct msg o;
    cr_assert(read_full(pp->rep[0], &o, sizeof(o)), "the server died");
    bool ok = true;
    if (pp->answer) {
        shmref_buf *in;
        cr_assert_eq(shmref_acquire(c, &o.desc, &in), 0, "acquire of the answer: %s", shmref_errmsg(c));
        ok = shmref_buf_size(in) == size && check_pattern(shmref_buf_data(in), size, o.seed) == -1;
        shmref_release(in);
    }
    shmref_release(b);
    return ok;
}

static struct msg server_counters(struct pingpong *pp)
{
    struct msg m = { .seed = 0 }, s;
    cr_assert_eq(write(pp->req[1], &m, sizeof(m)), (ssize_t)sizeof(m));
    cr_assert(read_full(pp->rep[0], &s, sizeof(s)), "the server died");
    return s;
}

static pid_t start_server(struct pingpong *pp)
{
    cr_assert_eq(pipe(pp->req), 0);
    cr_assert_eq(pipe(pp->rep), 0);
    pid_t pid = child_run(server, pp);
    close(pp->req[0]);
    close(pp->rep[1]);
    return pid;
}

static void stop_server(struct pingpong *pp, pid_t pid)
{
    close(pp->req[1]);
    close(pp->rep[0]);
    cr_assert_eq(child_wait(pid), 0, "the server failed (exit %d: 107 is a payload mismatch)", child_wait(pid));
}

#define WARM 300
#define ROUNDS 1000

Test(ledger_client, steady_state_handoff_makes_no_round_trip)
{
    daemon_start(&d, NULL);
    struct pingpong pp = { .answer = true };
    pid_t pid = start_server(&pp);
    shmref_conn *c = connect_ok(&d);
    uint32_t seed = 1;
    for (int i = 0; i < WARM; i++)
        cr_assert(round_trip(c, &pp, seed++, SIZE), "warm-up round %d: the answer's payload differs", i);
    struct msg s0 = server_counters(&pp), c0;
    counters_of(c, &c0);
    for (int i = 0; i < ROUNDS; i++)
        cr_assert(round_trip(c, &pp, seed++, SIZE), "round %d: the answer's payload differs", i);
    struct msg s1 = server_counters(&pp), c1;
    counters_of(c, &c1);
    cr_assert_eq(s1.bad, 0, "the server saw %u payloads that differ", s1.bad);
    printf("steady state, %d rounds: client round_trips %llu waits %llu stock_misses %llu ledger_acquires %llu "
           "fallbacks %llu; server round_trips %llu waits %llu ledger_acquires %llu fallbacks %llu\n", ROUNDS,
           (unsigned long long)(c1.round_trips - c0.round_trips), (unsigned long long)(c1.waits - c0.waits),
           (unsigned long long)(c1.stock_misses - c0.stock_misses),
           (unsigned long long)(c1.ledger_acquires - c0.ledger_acquires),
           (unsigned long long)(c1.ledger_fallbacks - c0.ledger_fallbacks),
           (unsigned long long)(s1.round_trips - s0.round_trips), (unsigned long long)(s1.waits - s0.waits),
           (unsigned long long)(s1.ledger_acquires - s0.ledger_acquires),
           (unsigned long long)(s1.ledger_fallbacks - s0.ledger_fallbacks));
    /* Every acquire in the ledger; a round trip is allowed only for a lease the stock could
     * not serve (its refill still on its way on a loaded machine: "stock_misses"), never for
     * an acquire. On a quiet machine all of them are 0. Under the sanitizers the daemon is
     * several times slower: its refills fall behind (misses), and a lease that missed may
     * bring a buffer the other side has not mapped yet (a fallback, one round trip); how
     * many leases miss is then not bounded here (10% with the race test beside it). */
    /* A lease that missed the stock may bring a buffer the other side has not mapped yet:
     * its acquire of it is a fallback (one round trip). So fallbacks <= misses (both sides). */
    uint64_t misses = c1.stock_misses - c0.stock_misses + s1.stock_misses - s0.stock_misses;
    /* (10% without the sanitizers: usually 0 misses, but one fresh-clone run of the suite
     * on a 2-vCPU VM, with nothing else running, saw 72 of 1000 in one burst) */
    uint64_t slack = SANITIZED ? ROUNDS : ROUNDS / 10, fb_max = misses + (SANITIZED ? ROUNDS / 100 : 0);
    struct msg *who[2][2] = { { &c0, &c1 }, { &s0, &s1 } };
    for (int i = 0; i < 2; i++) {
        const struct msg *a = who[i][0], *b = who[i][1];
        const char *name = i ? "server" : "client";
        uint64_t fb = b->ledger_fallbacks - a->ledger_fallbacks, miss = b->stock_misses - a->stock_misses;
        cr_assert_leq(fb, fb_max, "the %s asked the daemon for %llu acquires (%llu stock misses)", name,
                      (unsigned long long)fb, (unsigned long long)misses);
        cr_assert_eq(b->ledger_acquires - a->ledger_acquires + fb, ROUNDS);
        cr_assert_leq(b->round_trips - a->round_trips, miss + fb,
                      "the %s made round trips in the steady state that were neither stock misses nor fallbacks",
                      name);
        cr_assert_leq(b->waits - a->waits, miss + fb, "the %s waited for the daemon", name);
        cr_assert_leq(miss, slack, "%llu of the %s's leases missed the stock", (unsigned long long)miss, name);
    }
    stop_server(&pp, pid);
    shmref_close(c);
    wait_reclaimed(3000, "after both closed");
    daemon_stop(&d);
}

Test(ledger_client, ledger_off_is_the_daemon_path)
{
    daemon_start(&d, NULL);
    setenv("SHMREF_LEDGER", "0", 1);
    struct pingpong pp = { .answer = true, .ledger_off = true };
    pid_t pid = start_server(&pp);
    shmref_conn *c = connect_ok(&d);
    unsetenv("SHMREF_LEDGER");
    uint32_t seed = 1;
    for (int i = 0; i < 50; i++)
        cr_assert(round_trip(c, &pp, seed++, SIZE));
    struct msg s0 = server_counters(&pp), c0;
    counters_of(c, &c0);
    for (int i = 0; i < 200; i++)
        cr_assert(round_trip(c, &pp, seed++, SIZE), "round %d: the answer's payload differs", i);
    struct msg s1 = server_counters(&pp), c1;
    counters_of(c, &c1);
    cr_assert_eq(s1.bad, 0);
    cr_assert_eq(c1.ledger_acquires, 0, "SHMREF_LEDGER=0 took %llu acquires locally",
                 (unsigned long long)c1.ledger_acquires);
    cr_assert_eq(s1.ledger_acquires, 0);
    cr_assert_geq(c1.round_trips - c0.round_trips, 200, "every acquire is a round trip");
    cr_assert_geq(s1.round_trips - s0.round_trips, 200, "every acquire is a round trip");
    stop_server(&pp, pid);
    shmref_close(c);
    wait_reclaimed(3000, "after both closed");
    daemon_stop(&d);
}

Test(ledger_client, another_uid_goes_through_the_daemon)
{
    daemon_start(&d, "--socket-mode", "0666", NULL);
    struct pingpong same = { .answer = false }, other = { .answer = false, .uid = 65534 };
    pid_t p1 = start_server(&same), p2 = start_server(&other);
    shmref_conn *c = connect_ok(&d);
    uint32_t seed = 1;
    /* Every other descriptor goes to both consumers, the others to the same uid's only: a
     * buffer another uid acquired is retired after use (a fresh one each time), so the
     * same uid's consumer takes locally only the buffers that stay in the tenant; the
     * other uid asks the daemon each time. */
    for (int i = 0; i < 400; i++) {
        bool both = i % 2 == 0;
        shmref_buf *b;
        cr_assert_eq(shmref_lease(c, SIZE, &b), 0, "lease: %s", shmref_errmsg(c));
        fill_pattern(shmref_buf_data(b), SIZE, seed);
        struct msg m = { .seed = seed++ }, o;
        cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &m.desc), 0);
        cr_assert_eq(write(same.req[1], &m, sizeof(m)), (ssize_t)sizeof(m));
        if (both)
            cr_assert_eq(write(other.req[1], &m, sizeof(m)), (ssize_t)sizeof(m));
        cr_assert(read_full(same.rep[0], &o, sizeof(o)), "the same uid's consumer died");
        if (both)
            cr_assert(read_full(other.rep[0], &o, sizeof(o)), "uid 65534's consumer died");
        shmref_release(b);
    }
    struct msg s = server_counters(&same), x = server_counters(&other);
    printf("same uid: ledger_acquires %llu round_trips %llu; uid 65534: ledger_acquires %llu round_trips %llu\n",
           (unsigned long long)s.ledger_acquires, (unsigned long long)s.round_trips,
           (unsigned long long)x.ledger_acquires, (unsigned long long)x.round_trips);
    cr_assert_eq(s.bad, 0);
    cr_assert_eq(x.bad, 0, "uid 65534 read %u payloads that differ", x.bad);
    cr_assert_eq(x.ledger_acquires, 0, "another uid took a buffer locally");
    cr_assert_geq(x.round_trips, 200, "another uid's acquires are round trips");
    cr_assert_gt(s.ledger_acquires, 100, "the same uid's consumer took few buffers locally");
    /* Both pipes first: the second server inherited the parent's ends of the first's. */
    close(same.req[1]);
    close(other.req[1]);
    cr_assert_eq(child_wait(p1), 0, "the same uid's consumer failed");
    cr_assert_eq(child_wait(p2), 0, "uid 65534's consumer failed");
    close(same.rep[0]);
    close(other.rep[0]);
    shmref_close(c);
    wait_reclaimed(3000, "after all closed");
    daemon_stop(&d);
}

/* ---- (3), (4): consumers racing recycles ---- */

#define RING 16
#define NCONS 2

/* Shared by the producer and the consumers (MAP_SHARED anonymous, made before fork). */
struct ring {
    _Atomic uint64_t head;          /* descriptors published so far */
    struct { _Atomic uint32_t lock; shmref_desc desc; uint32_t seed; } e[RING];
    _Atomic bool stop;
    _Atomic uint64_t local, daemon, refused, bad, holds_now;
};

static struct ring *ring;

static void ring_put(const shmref_desc *desc, uint32_t seed)
{
    uint64_t h = atomic_load(&ring->head);
    unsigned i = (unsigned)(h % RING);
    atomic_fetch_add(&ring->e[i].lock, 1); /* odd: writing */
    ring->e[i].desc = *desc;
    ring->e[i].seed = seed;
    atomic_fetch_add(&ring->e[i].lock, 1);
    atomic_store(&ring->head, h + 1);
}

static bool ring_get(unsigned back, shmref_desc *desc, uint32_t *seed)
{
    uint64_t h = atomic_load(&ring->head);
    if (h <= back)
        return false;
    unsigned i = (unsigned)((h - 1 - back) % RING);
    uint32_t l = atomic_load(&ring->e[i].lock);
    if (l & 1)
        return false;
    *desc = ring->e[i].desc;
    *seed = ring->e[i].seed;
    return atomic_load(&ring->e[i].lock) == l;
}

/* producer: a tight loop over a few buffers: lease, whole payload from a fresh seed,
 * publish, keep it published a moment (so daemon acquires can find it), release. */
static int producer(void *arg)
{
    int hold_us = *(int *)arg;
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    uint32_t seed = (uint32_t)getpid() << 8, s = seed | 1;
    shmref_buf *held[2] = { NULL, NULL };
    unsigned k = 0;
    while (!atomic_load(&ring->stop)) {
        shmref_buf *b;
        if (shmref_lease(c, SIZE, &b) < 0) {
            fprintf(stderr, "producer lease: %s\n", shmref_errmsg(c));
            return 102;
        }
        fill_pattern(shmref_buf_data(b), SIZE, ++seed);
        shmref_desc desc;
        if (shmref_publish(b, SIZE, 0, NULL, 0, &desc) < 0)
            return 103;
        ring_put(&desc, seed);
        if (held[k % 2])
            shmref_release(held[k % 2]);
        held[k++ % 2] = b;
        if (hold_us)
            usleep((useconds_t)(xorshift(&s) % (unsigned)hold_us));
    }
    shmref_close(c);
    return 0;
}

/* consumer: acquires recent and older descriptors at random, racing the producer's
 * recycles; every acquire that succeeds has its whole payload compared while held. */
static int consumer(void *arg)
{
    (void)arg;
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    shmref_set_acquire_wait(c, 0); /* a descriptor whose buffer went is ENOENT at once */
    uint32_t s = (uint32_t)getpid() | 1;
    uint64_t local0 = 0, n_daemon = 0, refused = 0, bad = 0;
    while (!atomic_load(&ring->stop)) {
        shmref_desc desc;
        uint32_t seed;
        if (!ring_get(xorshift(&s) % 4, &desc, &seed))
            continue;
        uint64_t before = 0;
        shmref_conn_counter(c, "ledger_acquires", &before);
        shmref_buf *b;
        int r = shmref_acquire(c, &desc, &b);
        if (r < 0) {
            if (r != -ENOENT) {
                fprintf(stderr, "consumer acquire: %d %s\n", r, shmref_errmsg(c));
                return 102;
            }
            refused++;
            continue;
        }
        uint64_t after = 0;
        shmref_conn_counter(c, "ledger_acquires", &after);
        if (after == before)
            n_daemon++;
        if (check_pattern(shmref_buf_data(b), SIZE, seed) != -1) {
            bad++;
            fprintf(stderr, "consumer: a payload under token %02x%02x%02x%02x... is not its publish's (%s)\n",
                    desc.token[0], desc.token[1], desc.token[2], desc.token[3], after > before ? "local" : "daemon");
        }
        /* A few are held a little longer, so recycles meet ledger holds, and compared again
         * at the end of the hold (a recycle under a hold would have rewritten them). */
        if ((xorshift(&s) & 7) == 0) {
            usleep(200);
            if (check_pattern(shmref_buf_data(b), SIZE, seed) != -1) {
                bad++;
                fprintf(stderr, "consumer: a held payload changed under its token (%s)\n",
                        after > before ? "local" : "daemon");
            }
        }
        shmref_release(b);
    }
    shmref_conn_counter(c, "ledger_acquires", &local0);
    uint64_t fb = 0;
    shmref_conn_counter(c, "ledger_fallbacks", &fb);
    atomic_fetch_add(&ring->local, local0);
    atomic_fetch_add(&ring->daemon, n_daemon);
    atomic_fetch_add(&ring->refused, refused);
    atomic_fetch_add(&ring->bad, bad);
    shmref_close(c);
    return bad ? 103 : 0;
}

static void ring_map(void)
{
    ring = mmap(NULL, sizeof(*ring), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(ring, MAP_FAILED);
    memset(ring, 0, sizeof(*ring));
}

static long env_ms(const char *name, long def)
{
    const char *e = getenv(name);
    return e && *e ? atol(e) : def;
}

Test(ledger_client, consumers_racing_recycles_never_read_a_new_generation)
{
    daemon_start(&d, NULL);
    ring_map();
    int hold_us = 200;
    pid_t prod = child_run(producer, &hold_us);
    pid_t cons[NCONS];
    for (int i = 0; i < NCONS; i++)
        cons[i] = child_run(consumer, NULL);
    usleep((useconds_t)env_ms("SHMREF_LEDGER_RACE_MS", 5000) * 1000);
    atomic_store(&ring->stop, true);
    cr_assert_eq(child_wait(prod), 0, "the producer failed");
    int bad_exit = 0;
    for (int i = 0; i < NCONS; i++)
        if (child_wait(cons[i]) != 0)
            bad_exit++;
    printf("race: %llu descriptors published; %llu local takes, %llu daemon acquires, %llu refused (ENOENT), "
           "%llu payloads that differ\n", (unsigned long long)atomic_load(&ring->head),
           (unsigned long long)atomic_load(&ring->local), (unsigned long long)atomic_load(&ring->daemon),
           (unsigned long long)atomic_load(&ring->refused), (unsigned long long)atomic_load(&ring->bad));
    cr_assert_eq(atomic_load(&ring->bad), 0, "a consumer read another generation's bytes under a token");
    cr_assert_eq(bad_exit, 0, "a consumer failed");
    cr_assert_gt(atomic_load(&ring->local), 0, "no local take happened: the race was not tested");
    cr_assert_gt(atomic_load(&ring->daemon) + atomic_load(&ring->refused), 0,
                 "no fallback happened: the race was not tested");
    wait_reclaimed(3000, "after the race");
    munmap(ring, sizeof(*ring));
    daemon_stop(&d);
}

Test(ledger_client, sigkill_of_consumers_and_producer_is_reclaimed)
{
    daemon_start(&d, NULL);
    ring_map();
    int hold_us = 100;
    pid_t prod = child_run(producer, &hold_us);
    pid_t cons[NCONS];
    for (int i = 0; i < NCONS; i++)
        cons[i] = child_run(consumer, NULL);
    usleep(1500 * 1000);
    /* The consumers hold ledger holds at random moments; then the producer mid-loop. */
    for (int i = 0; i < NCONS; i++)
        kill(cons[i], SIGKILL);
    for (int i = 0; i < NCONS; i++)
        child_wait(cons[i]);
    usleep(300 * 1000);
    kill(prod, SIGKILL);
    child_wait(prod);
    long t0 = now_ms();
    wait_reclaimed(2000, "after SIGKILL of the consumers and the producer");
    printf("sigkill: reclaimed within %ld ms\n", now_ms() - t0);
    munmap(ring, sizeof(*ring));
    daemon_stop(&d);
}

/* A consumer SIGKILLed while it certainly holds ledger holds (it signals first). */
struct killee {
    int go[2], ready[2];
};

static int holder(void *arg)
{
    struct killee *k = arg;
    close(k->go[1]);
    close(k->ready[0]);
    shmref_conn *c;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    shmref_buf *bufs[8];
    struct msg m;
    unsigned n = 0;
    while (read_full(k->go[0], &m, sizeof(m))) {
        if (m.desc.size == 0) { /* hold everything acquired since; say how many locally */
            struct msg s;
            counters_of(c, &s);
            if (write(k->ready[1], &s, sizeof(s)) != sizeof(s))
                return 102;
            pause();
        }
        if (shmref_acquire(c, &m.desc, &bufs[n % 8]) < 0 ||
            check_pattern(shmref_buf_data(bufs[n % 8]), SIZE, m.seed) != -1)
            return 103;
        uint8_t x = 1;
        if (write(k->ready[1], &x, 1) != 1)
            return 104;
        if (m.bad) /* keep this one */
            n++;
        else
            shmref_release(bufs[n % 8]);
    }
    return 0;
}

Test(ledger_client, sigkill_with_ledger_holds_is_reclaimed)
{
    daemon_start(&d, NULL);
    struct killee k;
    cr_assert_eq(pipe(k.go), 0);
    cr_assert_eq(pipe(k.ready), 0);
    pid_t pid = child_run(holder, &k);
    close(k.go[0]);
    close(k.ready[1]);
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(c, 0), 0);
    /* Rounds of 4 leases published, acquired (and released) by the holder, released: the
     * holder comes to map the pool's buffers; the last round it keeps. */
    uint32_t seed = 1;
    for (int round = 0; round < 30; round++) {
        bool keep = round == 29;
        shmref_buf *b[4];
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(shmref_lease(c, SIZE, &b[i]), 0);
            fill_pattern(shmref_buf_data(b[i]), SIZE, seed);
            struct msg m = { .seed = seed++, .bad = keep };
            cr_assert_eq(shmref_publish(b[i], SIZE, 0, NULL, 0, &m.desc), 0);
            cr_assert_eq(write(k.go[1], &m, sizeof(m)), (ssize_t)sizeof(m));
            uint8_t x;
            cr_assert(read_full(k.ready[0], &x, 1), "the holder failed");
        }
        for (int i = 0; i < 4; i++)
            shmref_release(b[i]);
    }
    struct msg m = { .seed = 0 }, s;
    cr_assert_eq(write(k.go[1], &m, sizeof(m)), (ssize_t)sizeof(m));
    cr_assert(read_full(k.ready[0], &s, sizeof(s)));
    cr_assert_gt(s.ledger_acquires, 0, "the holder took nothing locally");
    uint64_t lent = status_or_none("ledger.lent");
    printf("holder: %llu local takes; ledger.lent before the kill: %lld\n", (unsigned long long)s.ledger_acquires,
           lent == UINT64_MAX ? -1LL : (long long)lent);
    kill(pid, SIGKILL);
    child_wait(pid);
    long t0 = now_ms();
    wait_reclaimed(2000, "after SIGKILL of a consumer with ledger holds");
    printf("holder: reclaimed within %ld ms\n", now_ms() - t0);
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- a daemon that sends bad ledger files ---- */

struct fake {
    char path[108];
    int kind;               /* 0: short directory; 1: not sealed; 2: bad header; 3: one fd */
};

/* fake_daemon: accepts one connection, answers its hello agreeing PROTO_FEAT_LEDGER with
 * files that must be refused, then answers pings. */
static int fake_daemon(void *arg)
{
    struct fake *f = arg;
    int ls = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(ls, 4) < 0)
        return 100;
    int s = accept(ls, NULL, NULL);
    if (s < 0)
        return 101;
    uint8_t buf[4096];
    ssize_t n = recv(s, buf, sizeof(buf), 0);
    struct proto_msg m;
    const char *why;
    if (n <= 0 || proto_decode(buf, (size_t)n, sizeof(buf), &m, &why) < 0 || m.op != PROTO_OP_HELLO ||
        !(m.u.hello.features & PROTO_FEAT_LEDGER))
        return 102;
    int dir = memfd_create("dir", MFD_ALLOW_SEALING), led = memfd_create("led", MFD_ALLOW_SEALING);
    size_t dlen = f->kind == 0 ? 4096 : LEDGER_DIR_SIZE;
    if (dir < 0 || led < 0 || ftruncate(dir, (off_t)dlen) < 0 || ftruncate(led, (off_t)LEDGER_COUNTS_SIZE) < 0)
        return 103;
    if (f->kind != 2) {
        void *p = mmap(NULL, dlen, PROT_READ | PROT_WRITE, MAP_SHARED, dir, 0);
        if (p == MAP_FAILED)
            return 104;
        uint8_t key[16] = { 1 };
        if (dlen >= LEDGER_HEADER)
            ledger_dir_init(p, getuid(), key);
        munmap(p, dlen);
    }
    int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    if (f->kind != 1 && (fcntl(dir, F_ADD_SEALS, seals) < 0 || fcntl(led, F_ADD_SEALS, seals) < 0))
        return 105;
    struct proto_msg r = { .op = PROTO_OP_HELLO + PROTO_OP_REPLY, .id = m.id };
    r.u.hello_reply.version = PROTO_VERSION;
    r.u.hello_reply.features = m.u.hello.features;
    r.u.hello_reply.max_request = PROTO_MAX_REQUEST;
    r.u.hello_reply.max_lease = 1 << 20;
    r.u.hello_reply.max_leases = 16;
    r.u.hello_reply.max_meta = 4096;
    r.u.hello_reply.pid = (uint64_t)getpid();
    int len = proto_encode(&r, buf, sizeof(buf));
    int fds[2] = { dir, led };
    unsigned nfds = f->kind == 3 ? 1 : 2;
    if (len <= 0 || rawclient_send_fds(s, buf, (size_t)len, fds, nfds) < 0)
        return 106;
    while ((n = recv(s, buf, sizeof(buf), 0)) > 0) {
        if (proto_decode(buf, (size_t)n, sizeof(buf), &m, &why) < 0 || m.op != PROTO_OP_PING)
            continue;
        struct proto_msg p = { .op = PROTO_OP_PING + PROTO_OP_REPLY, .id = m.id };
        len = proto_encode(&p, buf, sizeof(buf));
        if (len <= 0 || send(s, buf, (size_t)len, 0) < 0)
            return 107;
    }
    return 0;
}

Test(ledger_client, bad_ledger_files_are_refused_without_a_fault)
{
    for (int kind = 0; kind < 4; kind++) {
        struct fake f = { .kind = kind };
        char tmpl[] = "/tmp/shmref-fake-XXXXXX";
        cr_assert_not_null(mkdtemp(tmpl));
        snprintf(f.path, sizeof(f.path), "%s/sock", tmpl);
        pid_t pid = child_run(fake_daemon, &f);
        shmref_conn *c = NULL;
        int r = -1;
        for (int i = 0; i < 200 && r < 0; i++) {
            r = shmref_connect(f.path, &c);
            if (r < 0)
                usleep(10000);
        }
        cr_assert_eq(r, 0, "kind %d: connect to the fake daemon: %s", kind, shmref_errmsg(NULL));
        cr_assert_eq(counter(c, "ledger_refused"), 1, "kind %d: bad ledger files were not refused", kind);
        cr_assert_eq(shmref_ping(c), 0, "kind %d: the connection does not work without the ledger", kind);
        shmref_close(c);
        cr_assert_eq(child_wait(pid), 0, "kind %d: the fake daemon failed", kind);
        unlink(f.path);
        rmdir(tmpl);
    }
}

/* ---- one process, two connections: the submit face, metadata, a wrong size ---- */

/* acquire_by_submit: shmref_acquire_submit, then its completion (which a ledger take
 * delivers with no reply: the first shmref_complete has it). */
static shmref_buf *acquire_by_submit(shmref_conn *c, const shmref_desc *desc, bool *ret_at_once)
{
    int tag;
    cr_assert_eq(shmref_acquire_submit(c, desc, 0, &tag), 0, "acquire_submit: %s", shmref_errmsg(c));
    shmref_completion done;
    int n = shmref_complete(c, &done, 1);
    *ret_at_once = n == 1;
    for (long deadline = now_ms() + 5000; n == 0 && now_ms() < deadline; n = shmref_complete(c, &done, 1))
        usleep(100);
    cr_assert_eq(n, 1, "no completion");
    cr_assert_eq(done.user, &tag);
    cr_assert_eq(done.result, 0, "acquire_submit: %s", done.errmsg);
    return done.buf;
}

Test(ledger_client, submit_meta_and_size_in_one_process)
{
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(p, 0), 0);
    const char meta[] = "{\"dtype\":\"<f8\",\"shape\":[1024]}";
    uint64_t at_once = 0;
    for (int i = 0; i < 50; i++) {
        shmref_buf *b;
        cr_assert_eq(shmref_lease(p, SIZE, &b), 0);
        fill_pattern(shmref_buf_data(b), SIZE, (uint32_t)i + 7);
        shmref_desc desc;
        cr_assert_eq(shmref_publish(b, SIZE, 0, meta, sizeof(meta), &desc), 0);
        /* A descriptor of the wrong size is refused as before, locally taken or not. */
        shmref_desc wrong = desc;
        wrong.size = SIZE - 8;
        shmref_buf *x = NULL;
        cr_assert_eq(shmref_acquire(c, &wrong, &x), -EINVAL, "round %d: a wrong size was not refused", i);
        uint64_t rt0 = counter(c, "round_trips"), l0 = counter(c, "ledger_acquires");
        bool now;
        shmref_buf *in = acquire_by_submit(c, &desc, &now);
        bool local = counter(c, "ledger_acquires") == l0 + 1;
        if (local) {
            at_once++;
            cr_assert(now, "round %d: a ledger acquire was not complete at once", i);
            cr_assert_eq(counter(c, "round_trips"), rt0, "a ledger acquire counted a round trip");
        }
        cr_assert_eq(shmref_buf_size(in), SIZE);
        cr_assert_eq(check_pattern(shmref_buf_data(in), SIZE, (uint32_t)i + 7), -1, "round %d: payload", i);
        size_t ml = 0;
        const void *m = shmref_buf_meta(in, &ml);
        cr_assert_eq(ml, sizeof(meta), "round %d (%s): metadata of %zu bytes", i, local ? "ledger" : "daemon", ml);
        cr_assert_eq(memcmp(m, meta, ml), 0, "round %d: metadata differs", i);
        cr_assert_eq(shmref_release(in), 0);
        cr_assert_eq(shmref_release(b), 0);
    }
    printf("submit: %llu of 50 acquires taken in the ledger\n", (unsigned long long)at_once);
    cr_assert_gt(at_once, 25, "the ledger took few acquires (%llu of 50)", (unsigned long long)at_once);
    shmref_close(c);
    shmref_close(p);
    wait_reclaimed(3000, "after close");
    daemon_stop(&d);
}

/* ---- fork: a child never touches its parent's ledger ---- */

struct forked {
    shmref_conn *c;
    shmref_buf *inherited;
    shmref_desc d2;
    uint32_t seed2;
};

/* child: releases its copy of the parent's ledger hold (which must not be given back in
 * the parent's ledger), then uses the connection: its own, with its own ledger. */
static int forked_child(void *arg)
{
    struct forked *f = arg;
    if (shmref_release(f->inherited) != 0)
        return 101;
    shmref_buf *b;
    if (shmref_acquire(f->c, &f->d2, &b) != 0)
        return 102;
    if (check_pattern(shmref_buf_data(b), SIZE, f->seed2) != -1)
        return 103;
    shmref_release(b);
    uint64_t refused = 1;
    shmref_conn_counter(f->c, "ledger_refused", &refused);
    if (refused)
        return 104;
    shmref_close(f->c);
    return 0;
}

Test(ledger_client, a_forked_child_never_gives_back_its_parents_holds)
{
    daemon_start(&d, NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(p, 0), 0);
    shmref_buf *lease = NULL, *hold = NULL;
    for (int i = 0; i < 50 && !hold; i++) {
        shmref_buf *b, *in;
        cr_assert_eq(shmref_lease(p, SIZE, &b), 0);
        fill_pattern(shmref_buf_data(b), SIZE, (uint32_t)i + 1);
        shmref_desc desc;
        cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &desc), 0);
        uint64_t l0 = counter(c, "ledger_acquires");
        cr_assert_eq(shmref_acquire(c, &desc, &in), 0, "%s", shmref_errmsg(c));
        if (counter(c, "ledger_acquires") == l0 + 1) { /* a ledger hold: keep both */
            hold = in;
            lease = b;
            break;
        }
        shmref_release(in);
        shmref_release(b);
    }
    cr_assert_not_null(hold, "no acquire was taken in the ledger");
    struct forked f = { .c = c, .inherited = hold, .seed2 = 777 };
    shmref_buf *b2;
    cr_assert_eq(shmref_lease(p, SIZE, &b2), 0);
    fill_pattern(shmref_buf_data(b2), SIZE, f.seed2);
    cr_assert_eq(shmref_publish(b2, SIZE, 0, NULL, 0, &f.d2), 0);
    cr_assert_eq(child_wait(child_run(forked_child, &f)), 0, "the forked child failed");
    /* The producer lets go: the parent's hold (still counted: the child gave nothing back)
     * keeps the buffer lent; the parent's release ends it. */
    cr_assert_eq(shmref_release(lease), 0);
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(wait_status(&d, "ledger.lent", 1, 2000), 1, "the parent's hold was given back by its child");
    cr_assert_eq(shmref_release(hold), 0);
    cr_assert_eq(wait_status(&d, "ledger.lent", 0, 2000), 0, "the parent's release did not end the loan");
    shmref_release(b2);
    shmref_close(c);
    shmref_close(p);
    wait_reclaimed(3000, "after close");
    daemon_stop(&d);
}

/* ---- a hold past every limit still counts ---- */

/* The daemon records which buffers a connection maps (its fd-once set, capped at
 * 2 x max-leases + 256) and reads ledger counts only for those. A consumer that holds
 * more buffers in its ledger than that cap must never see one recycled under a hold:
 * past the cap its acquires go to the daemon (counted as leases). Before, the fd of a
 * buffer past the cap was sent unrecorded, the client cached the mapping, took the next
 * publish of it in its ledger, and the producer's next lease rewrote it under the hold. */
#define CAP_LEASES 8
#define CAP (CAP_LEASES * 2 + 256)
#define CAP_HOLDS (CAP + 16)

Test(ledger_client, holds_past_the_record_of_mappings_never_see_a_recycle)
{
    daemon_start(&d, "--max-leases", "8", NULL);
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(p, 0), 0);
    cr_assert_eq(shmref_set_stock(c, 0), 0);
    static shmref_buf *held[CAP_HOLDS];
    static uint32_t seeds[CAP_HOLDS];
    unsigned n = 0, misses = 0;
    uint32_t seed = 1;
    uint64_t f0 = counter(c, "ledger_fallbacks");
    /* Each ledger hold pins one buffer; the next lease gets another (a fresh one, first
     * acquired from the daemon, mapped and released, then recycled and taken in the
     * ledger). Stop at CAP_HOLDS holds, or after 64 rounds in a row without a ledger take
     * (what the daemon path does once the consumer maps CAP buffers). */
    while (n < CAP_HOLDS && misses < 64) {
        shmref_buf *b, *in;
        cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "lease: %s", shmref_errmsg(p));
        fill_pattern(shmref_buf_data(b), SIZE, seed);
        shmref_desc desc;
        cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &desc), 0);
        uint64_t l0 = counter(c, "ledger_acquires");
        cr_assert_eq(shmref_acquire(c, &desc, &in), 0, "acquire after %u holds: %s", n, shmref_errmsg(c));
        cr_assert_eq(check_pattern(shmref_buf_data(in), SIZE, seed), -1, "hold %u: payload at acquire", n);
        if (counter(c, "ledger_acquires") == l0 + 1) {
            held[n] = in;
            seeds[n++] = seed;
            misses = 0;
        } else {
            cr_assert_eq(shmref_release(in), 0);
            misses++;
        }
        cr_assert_eq(shmref_release(b), 0);
        seed++;
        /* A hold's bytes stay what they were whatever the producer leases next. */
        for (unsigned i = n > 4 ? n - 4 : 0; i < n; i++)
            cr_assert_eq(check_pattern(shmref_buf_data(held[i]), SIZE, seeds[i]), -1,
                         "ledger hold %u of %u (past the cap of %d: %s) was recycled under it", i, n, CAP,
                         i >= CAP ? "yes" : "no");
    }
    uint64_t fallbacks = counter(c, "ledger_fallbacks") - f0;
    printf("record of mappings: %u ledger holds (cap %d), %u daemon acquires at the end, %llu ledger fallbacks\n", n,
           CAP, misses, (unsigned long long)fallbacks);
    cr_assert_geq(n, CAP - 8, "only %u ledger holds were taken (cap %d)", n, CAP);
    /* The producer churns: a recycle under any hold would rewrite it. */
    for (int i = 0; i < 64; i++) {
        shmref_buf *b;
        cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "lease: %s", shmref_errmsg(p));
        fill_pattern(shmref_buf_data(b), SIZE, 0xdead0000u + (uint32_t)i);
        cr_assert_eq(shmref_release(b), 0);
    }
    cr_assert_eq(shmref_ping(p), 0);
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(check_pattern(shmref_buf_data(held[i]), SIZE, seeds[i]), -1,
                     "ledger hold %u of %u was recycled under it", i, n);
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(shmref_release(held[i]), 0);
    shmref_close(c);
    shmref_close(p);
    wait_reclaimed(3000, "after close");
    daemon_stop(&d);
}
