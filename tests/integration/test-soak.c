/* SPDX-License-Identifier: MIT */
/* test-soak.c: a soak through a real shmrefd (default pool mode: as root, the private
 * huge-page tmpfs) and ~100 real processes of five uids, for SHMREF_SOAK_SECONDS (15 by
 * default; the issue-17 soak is 90): 5 cross-uid producer/consumer pairs handing buffers
 * off continuously, 15 same-uid pairs, and 60 background clients leasing, writing and
 * releasing buffers of changing sizes (some reconnecting every few leases). Every call
 * must succeed (0 failed calls) and every handoff read back intact. Regression (issue
 * 17): 104 cross-uid leases failed "pool full ... pinned (retired buffers that clients
 * still map)" in 90 s, because libshmref cached its mappings of other tenants' buffers
 * that the daemon retires, and retired buffers' pages stayed in the pool's cap. */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define CROSS_PAIRS 5
#define SAME_PAIRS 15
#define BACKGROUND 60
#define NPROC (2 * CROSS_PAIRS + 2 * SAME_PAIRS + BACKGROUND)
#define UID_A 1000   /* cross pairs: A produces for B (and B for A, every other pair) */
#define UID_B 1001
#define UID_SAME 1002
#define UID_BG1 1003
#define UID_BG2 1004

static struct daemon d;

struct tally {
    _Atomic uint64_t handoffs, cross_handoffs, bg_ops, failed;
    char first_error[512];
    _Atomic int have_error;
};
static struct tally *tally;
static int64_t deadline_ms;

static int64_t soak_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void failed(const char *who, const char *what, shmref_conn *c, int r)
{
    atomic_fetch_add(&tally->failed, 1);
    int no = 0;
    if (atomic_compare_exchange_strong(&tally->have_error, &no, 1))
        snprintf(tally->first_error, sizeof(tally->first_error), "%s (pid %d uid %u): %s: %d %s", who, (int)getpid(),
                 (unsigned)getuid(), what, r, c ? shmref_errmsg(c) : shmref_errmsg(NULL));
}

static int become(uid_t uid)
{
    return setgid(65534) == 0 && setuid(uid) == 0 ? 0 : -1;
}

static shmref_conn *connect_as(const char *who)
{
    shmref_conn *c = NULL;
    int r = shmref_connect_timeout(d.socket, 30000, NULL, 0, &c);
    if (r < 0) {
        failed(who, "connect", NULL, r);
        return NULL;
    }
    return c;
}

/* pattern: the byte at offset off of handoff n. */
static uint8_t pattern(uint64_t n, uint64_t off)
{
    return (uint8_t)(n * 131 + (off >> 12) * 7 + 1);
}

struct pair {
    uid_t producer_uid, consumer_uid;
    int desc[2], ack[2];
    bool cross;
};

static int producer(void *arg)
{
    struct pair *pr = arg;
    close(pr->desc[0]);
    close(pr->ack[1]);
    if (become(pr->producer_uid) < 0)
        return 100;
    shmref_conn *c = connect_as("producer");
    if (!c)
        return 1;
    for (uint64_t n = 0; soak_now_ms() < deadline_ms; n++) {
        size_t size = (size_t)(64 << 10) << (n % 6); /* 64 KiB .. 2 MiB */
        shmref_buf *b;
        shmref_desc desc;
        int r = shmref_lease(c, size, &b);
        if (r < 0) {
            failed("producer", "lease", c, r);
            continue;
        }
        uint8_t *p = shmref_buf_data(b);
        for (uint64_t off = 0; off < size; off += 4096)
            p[off] = pattern(n, off);
        p[size - 1] = pattern(n, size - 1);
        if ((r = shmref_publish(b, size, 0, NULL, 0, &desc)) < 0) {
            failed("producer", "publish", c, r);
            shmref_release(b);
            continue;
        }
        struct { shmref_desc desc; uint64_t n; } m = { desc, n };
        if (write(pr->desc[1], &m, sizeof(m)) != sizeof(m))
            break;
        char ack;
        if (read(pr->ack[0], &ack, 1) != 1)
            break;
        if ((r = shmref_release(b)) < 0)
            failed("producer", "release", c, r);
    }
    close(pr->desc[1]);
    shmref_close(c);
    return 0;
}

static int consumer(void *arg)
{
    struct pair *pr = arg;
    close(pr->desc[1]);
    close(pr->ack[0]);
    if (become(pr->consumer_uid) < 0)
        return 100;
    shmref_conn *c = connect_as("consumer");
    if (!c)
        return 1;
    struct { shmref_desc desc; uint64_t n; } m;
    while (read(pr->desc[0], &m, sizeof(m)) == sizeof(m)) {
        shmref_buf *b;
        int r = shmref_acquire(c, &m.desc, &b);
        if (r < 0) {
            failed("consumer", "acquire", c, r);
        } else {
            const uint8_t *p = shmref_buf_data(b);
            size_t size = shmref_buf_size(b);
            bool ok = size == m.desc.size && p[size - 1] == pattern(m.n, size - 1);
            for (uint64_t off = 0; ok && off < size; off += 4096)
                ok = p[off] == pattern(m.n, off);
            if (!ok)
                failed("consumer", "bytes differ from what the producer wrote", c, -EBADMSG);
            if ((r = shmref_release(b)) < 0)
                failed("consumer", "release", c, r);
            atomic_fetch_add(&tally->handoffs, 1);
            if (pr->cross)
                atomic_fetch_add(&tally->cross_handoffs, 1);
        }
        if (write(pr->ack[1], "k", 1) != 1)
            break;
    }
    shmref_close(c);
    return 0;
}

/* background: leases of changing sizes (4 KiB .. 1 MiB), written and released; every
 * fourth client reconnects every 16 leases; some hold two buffers at a time. */
static int background(void *arg)
{
    int i = (int)(intptr_t)arg;
    if (become(i % 2 ? UID_BG1 : UID_BG2) < 0)
        return 100;
    shmref_conn *c = connect_as("background");
    if (!c)
        return 1;
    shmref_buf *held = NULL;
    for (uint64_t n = 0; soak_now_ms() < deadline_ms; n++) {
        size_t size = (size_t)4096 << ((n + (uint64_t)i) % 9);
        shmref_buf *b;
        int r = shmref_lease(c, size, &b);
        if (r < 0) {
            failed("background", "lease", c, r);
        } else {
            memset(shmref_buf_data(b), (int)n, size);
            atomic_fetch_add(&tally->bg_ops, 1);
            if (i % 3 == 0 && !held) {
                held = b;
            } else if ((r = shmref_release(b)) < 0) {
                failed("background", "release", c, r);
            }
            if (held && n % 5 == 0) {
                shmref_release(held);
                held = NULL;
            }
        }
        if (i % 4 == 0 && n % 16 == 15) {
            if (held)
                shmref_release(held);
            held = NULL;
            shmref_close(c);
            if (!(c = connect_as("background")))
                return 1;
        }
        usleep(2000 + (useconds_t)(i % 7) * 1000);
    }
    shmref_close(c);
    return 0;
}

static int soak_seconds(void)
{
    const char *e = getenv("SHMREF_SOAK_SECONDS");
    int s = e ? atoi(e) : 15;
    return s > 0 ? s : 15;
}

Test(soak, cross_uid_handoffs_and_background_clients_never_fail, .timeout = 600)
{
    cr_assert_eq(geteuid(), 0, "other uids need root, as in CI");
    int secs = soak_seconds();
    tally = mmap(NULL, sizeof(*tally), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(tally, MAP_FAILED);
    daemon_start(&d, "--pool-size", "512M", "--socket-mode", "0666", "--max-clients-per-uid", "256", NULL);
    static struct pair pairs[CROSS_PAIRS + SAME_PAIRS];
    pid_t pids[NPROC];
    unsigned np = 0;
    deadline_ms = soak_now_ms() + secs * 1000;
    for (unsigned i = 0; i < CROSS_PAIRS + SAME_PAIRS; i++) {
        struct pair *pr = &pairs[i];
        pr->cross = i < CROSS_PAIRS;
        pr->producer_uid = pr->cross ? (i % 2 ? UID_B : UID_A) : UID_SAME;
        pr->consumer_uid = pr->cross ? (i % 2 ? UID_A : UID_B) : UID_SAME;
        cr_assert_eq(pipe(pr->desc), 0);
        cr_assert_eq(pipe(pr->ack), 0);
        pids[np++] = child_run(producer, pr);
        pids[np++] = child_run(consumer, pr);
        close(pr->desc[0]);
        close(pr->desc[1]);
        close(pr->ack[0]);
        close(pr->ack[1]);
    }
    for (int i = 0; i < BACKGROUND; i++)
        pids[np++] = child_run(background, (void *)(intptr_t)i);
    uint64_t max_pinned = 0;
    while (soak_now_ms() < deadline_ms) {
        sleep(1);
        uint64_t pinned = status_u64(&d, "pool.bytes_pinned");
        max_pinned = pinned > max_pinned ? pinned : max_pinned;
    }
    int bad = 0;
    for (unsigned i = 0; i < np; i++)
        bad += child_wait(pids[i]) != 0;
    fprintf(stderr, "soak %d s, %u processes: %llu handoffs (%llu cross-uid), %llu background leases, %llu failed "
            "calls; refused_space %llu refused_quota %llu; stock leases %llu refused %llu; retired %llu (emptied while "
            "mapped %llu); most pinned %llu bytes\n", secs, np, (unsigned long long)tally->handoffs,
            (unsigned long long)tally->cross_handoffs, (unsigned long long)tally->bg_ops,
            (unsigned long long)tally->failed, (unsigned long long)status_u64(&d, "counters.refused_space"),
            (unsigned long long)status_u64(&d, "counters.refused_quota"),
            (unsigned long long)status_u64(&d, "counters.stock_leases"),
            (unsigned long long)status_u64(&d, "counters.stock_refused"),
            (unsigned long long)status_u64(&d, "counters.buffers_retired"),
            (unsigned long long)status_u64(&d, "counters.buffers_emptied_mapped"), (unsigned long long)max_pinned);
    if (tally->have_error)
        fprintf(stderr, "first failure: %s\n", tally->first_error);
    cr_expect_eq(bad, 0, "%d processes failed", bad);
    cr_expect_eq(tally->failed, 0, "%llu failed calls; the first: %s", (unsigned long long)tally->failed,
                 tally->first_error);
    cr_expect_gt(tally->cross_handoffs, 0);
    cr_expect_eq(status_u64(&d, "counters.refused_space"), 0);
    cr_expect_eq(wait_status(&d, "pool.bytes_leased", 0, 10000), 0, "everyone left: nothing is leased");
    daemon_stop(&d);
    munmap(tally, sizeof(*tally));
}
