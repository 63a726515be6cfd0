/* SPDX-License-Identifier: MIT */
/* test-ledgers.c: the cross-check of the quota, registry and pool ledgers
 * (daemon/ledgers.c) over a real pool under /dev/shm, a real quota ledger and a real
 * registry, built as a test build (SHMREF_LEDGER_CHECK): silent while a lease goes through
 * every step, including the wait for a new buffer, and aborting, with one line naming the
 * numbers, on each kind of mismatch. A check that must abort runs in a child process, so
 * the test reads its line and its signal. */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <uv.h>

#include "broker-fixture.h"
#include "core-hold.h"
#include "ledgers.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

struct fx {
    BROKER_FIXTURE_FIELDS;
};

static void fx_open(struct fx *f)
{
    broker_fixture_open(f, "ledgers", 64 * MiB, 16 * MiB);
    f->opt.max_leases = 4;
}

static void fx_close(struct fx *f)
{
    core_close(&f->core, &f->loop);
}

/* check_apart: ledgers_check in a child, its stderr read here. Returns the child's wait
 * status; out gets what it wrote. */
static int check_apart(struct fx *f, char *out, size_t cap)
{
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], STDERR_FILENO);
        ledgers_check(&f->bk);
        _exit(0);
    }
    close(pfd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && ((r = read(pfd[0], out + n, cap - 1 - n)) > 0 || (r < 0 && errno == EINTR)))
        if (r > 0)
            n += (size_t)r;
    out[n] = 0;
    close(pfd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        cr_assert_eq(errno, EINTR);
    return st;
}

static void assert_aborts(struct fx *f, const char *line)
{
    char out[1024];
    int st = check_apart(f, out, sizeof(out));
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "a mismatch did not abort (status %#x): %s", st, out);
    cr_assert(strstr(out, line), "expected \"%s\" in: %s", line, out);
}

static void assert_agree(struct fx *f)
{
    char out[1024];
    int st = check_apart(f, out, sizeof(out));
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the ledgers agree, yet (status %#x): %s", st, out);
    cr_assert_str_eq(out, "", "a check that passed logged");
}

/* charge: what lease.c charges for size bytes of uid (the class size). */
static struct quota_ticket charge(struct fx *f, uint32_t uid, uint64_t size)
{
    struct quota_ticket t;
    char why[PROTO_MAX_ERRMSG];
    uint64_t csize = pool_class_size(f->bk.pool, size);
    cr_assert_neq(csize, 0);
    cr_assert_eq(quota_take(f->bk.quota, uid, csize, &t, why, sizeof(why)), 0, "%s", why);
    return t;
}

/* A lease step by step, as lease.c takes it: charged while its new buffer is made
 * (pending bytes), registered and held, published, released back warm. The ledgers
 * agree at every step; the step where the pending bytes are left out does not. */
Test(ledgers, agree_through_a_lease)
{
    struct fx f;
    fx_open(&f);
    ledgers_check(&f.bk);
    assert_agree(&f);

    struct quota_ticket t = charge(&f, 1000, 5000);
    cr_assert_eq(t.bytes, 8 * KiB);
    struct got g = { 0 };
    struct pool_buf *pb = NULL;
    cr_assert_eq(pool_get(f.bk.pool, 5000, 1000, &pb, got_cb, &g), 1, "a new buffer is made off the loop");
    cr_assert_eq(pool_bytes_creating(f.bk.pool), 8 * KiB);
    f.bk.pending_bytes = t.bytes;
    assert_agree(&f);
    /* the same moment without the lease waiting for its buffer: the quota holds more */
    f.bk.pending_bytes = 0;
    assert_aborts(&f, "ledgers disagree: quota holds 8192 bytes, registry 0 (+0 pending), pool hands out 0; "
                      "0 credits found less charged than credited");
    f.bk.pending_bytes = t.bytes;

    while (g.calls == 0)
        uv_run(&f.loop, UV_RUN_ONCE);
    cr_assert_eq(g.err, 0);
    f.bk.pending_bytes = 0;
    struct registry_buf *b = registry_buf_charged(f.bk.reg, g.buf, &t, 5000);
    cr_assert_not_null(b);
    struct registry_holder h = { 0 };
    uint64_t handle;
    cr_assert_eq(registry_hold(f.bk.reg, &h, b, true, &handle), 0);
    ledgers_check(&f.bk);
    assert_agree(&f);
    cr_assert_eq(registry_publish(f.bk.reg, b, 100, 0, NULL, 0), 0);
    assert_agree(&f);
    cr_assert_eq(registry_release(f.bk.reg, &h, handle), 0);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), 8 * KiB, "not back warm");
    ledgers_check(&f.bk);
    assert_agree(&f);
    registry_release_all(f.bk.reg, &h);
    fx_close(&f);
}

/* A charge no buffer accounts for (the quota holds more than the registry). */
Test(ledgers, a_charge_without_a_buffer_aborts)
{
    struct fx f;
    fx_open(&f);
    struct registry_holder h = { 0 };
    uint64_t handle;
    core_hold(&f.core, &f.loop, 1000, 8 * KiB, &h, &handle);
    assert_agree(&f);
    struct quota_ticket extra = charge(&f, 1001, 4096);
    assert_aborts(&f, "quota holds 12288 bytes, registry 8192 (+0 pending), pool hands out 8192");
    quota_return(f.bk.quota, &extra);
    assert_agree(&f);
    registry_release_all(f.bk.reg, &h);
    fx_close(&f);
}

/* A buffer the pool handed out that no registry buffer is (the pool hands out more). */
Test(ledgers, a_pool_buffer_without_a_registry_buffer_aborts)
{
    struct fx f;
    fx_open(&f);
    struct got g = { 0 };
    struct pool_buf *pb = NULL;
    int r = pool_get(f.bk.pool, 16 * KiB, 1000, &pb, got_cb, &g);
    if (r == 1) {
        while (g.calls == 0)
            uv_run(&f.loop, UV_RUN_ONCE);
        pb = g.buf;
    }
    cr_assert_not_null(pb);
    assert_aborts(&f, "quota holds 0 bytes, registry 0 (+0 pending), pool hands out 16384");
    pool_put(f.bk.pool, pb);
    assert_agree(&f);
    fx_close(&f);
}

/* A credit the quota did not hold (the registry counts it as drift) aborts even when
 * the three sums agree again afterwards. */
Test(ledgers, registry_drift_alone_aborts)
{
    struct fx f;
    fx_open(&f);
    struct registry_holder h = { 0 };
    uint64_t handle;
    core_hold(&f.core, &f.loop, 1000, 8 * KiB, &h, &handle);
    /* someone credits the charge behind the registry's back */
    cr_assert_eq(quota_credit(f.bk.quota, 1000, 8 * KiB), 0);
    assert_aborts(&f, "quota holds 0 bytes, registry 8192 (+0 pending), pool hands out 8192");
    /* the registry's own credit at the end then finds nothing charged */
    cr_assert_eq(registry_release(f.bk.reg, &h, handle), 0);
    struct registry_stats st = registry_stats(f.bk.reg);
    cr_assert_eq(st.drift, 1);
    cr_assert_eq(st.bytes, 0);
    cr_assert_eq(quota_total(f.bk.quota), 0);
    assert_aborts(&f, "quota holds 0 bytes, registry 0 (+0 pending), pool hands out 0; "
                      "1 credits found less charged than credited");
    registry_release_all(f.bk.reg, &h);
    fx_close(&f);
}

/* Warm buffers and buffers being made are no one's charge: they are left out of what the
 * pool hands out, so a pool full of warm buffers agrees with an empty registry. */
Test(ledgers, warm_and_creating_bytes_are_not_handed_out)
{
    struct fx f;
    fx_open(&f);
    struct got g[3] = { { 0 } };
    struct pool_buf *pb[3];
    const uint64_t sizes[3] = { 4096, 64 * KiB, MiB };
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pool_get(f.bk.pool, sizes[i], 1000, &pb[i], got_cb, &g[i]), 1);
    cr_assert_eq(pool_bytes_creating(f.bk.pool), 4096 + 64 * KiB + MiB);
    assert_agree(&f);
    for (int i = 0; i < 3; i++) {
        while (g[i].calls == 0)
            uv_run(&f.loop, UV_RUN_ONCE);
        cr_assert_eq(g[i].err, 0);
    }
    assert_aborts(&f, "pool hands out 1118208");
    for (int i = 0; i < 3; i++)
        pool_put(f.bk.pool, g[i].buf);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), 4096 + 64 * KiB + MiB);
    ledgers_check(&f.bk);
    assert_agree(&f);
    fx_close(&f);
}
