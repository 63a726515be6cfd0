/* SPDX-License-Identifier: MIT */
/* test-lease.c: one lease attempt and the checks around it (daemon/lease.c) through a
 * fake session (a struct broker_peer that records its replies and references) over a
 * real pool under /dev/shm, a real quota ledger, a real registry and a real libuv loop:
 * the class charged once, the tenant's warm buffer first, a new one made off the loop
 * while the peer is referenced, the charge back on every refusal (a warm buffer taken too),
 * retention reclaimed for a lease that does not wait, stock caps, and the refusals that
 * waiting cannot cure. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "access.h"
#include "broker-fixture.h"
#include "fake-peer.h"
#include "lease.h"
#include "ledgers.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

struct fx {
    BROKER_FIXTURE_FIELDS;
    struct fake a, b;            /* uid 1000 and uid 1001 */
};

static void fx_open_cap(struct fx *f, uint64_t pool_cap, uint64_t quota)
{
    broker_fixture_open(f, "lease", pool_cap, quota);
    f->opt.max_lease_size = pool_cap;
    f->opt.max_leases = 64;
    f->opt.max_parked_per_uid = 256;
    fake_init(&f->a, 1, 1000);
    fake_init(&f->b, 2, 1001);
    cr_assert_not(access_operator(1000) || access_operator(1001), "run these tests as another uid than 1000/1001");
}

static void fx_open(struct fx *f)
{
    fx_open_cap(f, 64 * MiB, 16 * MiB);
}

static void fx_close(struct fx *f)
{
    registry_release_all(f->bk.reg, &f->a.peer.holder);
    registry_release_all(f->bk.reg, &f->b.peer.holder);
    registry_end_retentions(f->bk.reg);
    ledgers_check(&f->bk);
    cr_assert_eq(quota_total(f->bk.quota), 0, "a charge outlived every lease");
    cr_assert_eq(f->a.refs + f->b.refs, 0, "a peer reference was kept");
    core_close(&f->core, &f->loop);
}

/* ---- attempts ----------------------------------------------------------------------- */

/* An attempt that went off the loop, and what its done callback said. */
struct att {
    struct lease_attempt a;
    unsigned done_calls;
    int err;
    char msg[PROTO_MAX_ERRMSG + 1];
};

static void att_done(struct lease_attempt *a, int err, const char *msg)
{
    struct att *t = (struct att *)a;
    t->done_calls++;
    t->err = err;
    snprintf(t->msg, sizeof(t->msg), "%s", msg ? msg : "");
}

static void att_init(struct att *t, struct fx *f, struct fake *p, uint64_t size)
{
    memset(t, 0, sizeof(*t));
    t->a = (struct lease_attempt){ .bk = &f->bk, .p = &p->peer, .size = size, .done = att_done };
}

/* try: lease_attempt; for a new buffer (1) the loop runs until done is called. Returns
 * what the attempt came to (0 held, or -errno), and whether it went off the loop. */
static int try(struct fx *f, struct att *t, bool *ret_made)
{
    int r = lease_attempt(&t->a, t->msg, sizeof(t->msg));
    if (ret_made)
        *ret_made = r == 1;
    if (r != 1)
        return r;
    while (t->done_calls == 0)
        uv_run(&f->loop, UV_RUN_ONCE);
    cr_assert_eq(t->done_calls, 1);
    return t->err;
}

/* A lease whose class has no warm buffer: charged at once, a buffer made off the loop
 * while the peer is referenced and the bytes are pending; then registered under a token
 * and held writable. */
Test(lease, attempt_charges_the_class_and_holds)
{
    struct fx f;
    struct att t;
    fx_open(&f);
    att_init(&t, &f, &f.a, 5000);
    int r = lease_attempt(&t.a, t.msg, sizeof(t.msg));
    cr_assert_eq(r, 1, "%d %s", r, t.msg);
    cr_assert_eq(t.a.csize, 8 * KiB);
    cr_assert_eq(quota_held(f.bk.quota, 1000), 8 * KiB, "the class is charged before the buffer is made");
    cr_assert_eq(f.a.peer.pending, 1);
    cr_assert_eq(f.bk.pending_bytes, 8 * KiB);
    cr_assert_eq(f.a.refs, 1, "a lease waiting for its buffer does not hold its peer");
    cr_assert_null(t.a.buf);
    ledgers_check(&f.bk);
    while (t.done_calls == 0)
        uv_run(&f.loop, UV_RUN_ONCE);
    cr_assert_eq(t.done_calls, 1);
    cr_assert_eq(t.err, 0, "%s", t.msg);
    cr_assert_eq(f.a.peer.pending, 0);
    cr_assert_eq(f.bk.pending_bytes, 0);
    cr_assert_eq(f.a.refs, 0);
    struct registry_buf *b = t.a.buf;
    cr_assert_not_null(b);
    cr_assert_eq(b->size, 5000);
    cr_assert_eq(b->pb->size, 8 * KiB);
    cr_assert_eq(b->tenant, 1000);
    cr_assert_eq(b->producer_pid, 4242);
    cr_assert_not(b->published);
    cr_assert_eq(registry_find_writing(f.bk.reg, b->token), b, "not findable by its token");
    struct registry_lease *l = registry_lease_of(&f.a.peer.holder, t.a.handle);
    cr_assert_not_null(l, "the attempt's handle is not held");
    cr_assert_eq(l->buf, b);
    cr_assert(l->writable);
    cr_assert_eq(quota_held(f.bk.quota, 1000), 8 * KiB, "charged twice");
    cr_assert_eq(f.a.replies + f.a.refusals, 0, "an attempt replied");
    fx_close(&f);
}

/* A warm buffer of the tenant's class comes back at once (no loop turn), to its own
 * tenant only. */
Test(lease, a_warm_buffer_is_its_tenants_at_once)
{
    struct fx f;
    struct att t;
    bool made;
    fx_open(&f);
    att_init(&t, &f, &f.a, 100 * KiB);
    cr_assert_eq(try(&f, &t, &made), 0, "%s", t.msg);
    cr_assert(made);
    uint64_t id = t.a.buf->pb->id, cap = t.a.buf->pb->size;
    cr_assert_eq(registry_release(f.bk.reg, &f.a.peer.holder, t.a.handle), 0);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), cap);

    struct att u;
    att_init(&u, &f, &f.b, 100 * KiB);
    cr_assert_eq(try(&f, &u, &made), 0, "%s", u.msg);
    cr_assert(made, "another tenant was not given a new buffer");
    cr_assert_neq(u.a.buf->pb->id, id, "another tenant got the warm buffer");

    att_init(&t, &f, &f.a, 99 * KiB);
    cr_assert_eq(lease_attempt(&t.a, t.msg, sizeof(t.msg)), 0, "a warm buffer waited: %s", t.msg);
    cr_assert_eq(t.done_calls, 0);
    cr_assert_eq(t.a.buf->pb->id, id);
    cr_assert_eq(t.a.buf->size, 99 * KiB);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), 0);
    cr_assert_eq(quota_held(f.bk.quota, 1000), cap);
    cr_assert_eq(f.a.refs, 0);
    fx_close(&f);
}

/* Refused for quota: nothing held, nothing charged, and a warm buffer the attempt took
 * before the charge goes back warm, to be taken by the next lease that fits. */
Test(lease, quota_refusal_gives_back_the_warm_buffer)
{
    struct fx f;
    struct att t, w;
    fx_open(&f);
    quota_set(f.bk.quota, 1000, 16 * KiB);
    att_init(&t, &f, &f.a, 8 * KiB);
    cr_assert_eq(try(&f, &t, NULL), 0, "%s", t.msg);
    att_init(&w, &f, &f.a, 8 * KiB);
    cr_assert_eq(try(&f, &w, NULL), 0, "%s", w.msg);
    uint64_t warm_id = w.a.buf->pb->id;
    cr_assert_eq(registry_release(f.bk.reg, &f.a.peer.holder, w.a.handle), 0);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), 8 * KiB);
    quota_set(f.bk.quota, 1000, 8 * KiB); /* lowered: the held 8 KiB fill it */

    struct att r;
    att_init(&r, &f, &f.a, 8 * KiB);
    cr_assert_eq(try(&f, &r, NULL), -EDQUOT, "%s", r.msg);
    cr_assert(strstr(r.msg, "quota exceeded for uid 1000"), "%s", r.msg);
    cr_assert_null(r.a.buf);
    cr_assert_eq(r.a.handle, 0);
    cr_assert_eq(r.a.charge.bytes, 0, "a refused attempt kept a ticket");
    cr_assert_eq(quota_held(f.bk.quota, 1000), 8 * KiB);
    cr_assert_eq(f.a.peer.holder.leases, 1);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), 8 * KiB, "the warm buffer taken before the charge was lost");
    ledgers_check(&f.bk);

    quota_set(f.bk.quota, 1000, 16 * KiB);
    att_init(&r, &f, &f.a, 8 * KiB);
    cr_assert_eq(lease_attempt(&r.a, r.msg, sizeof(r.msg)), 0, "%s", r.msg);
    cr_assert_eq(r.a.buf->pb->id, warm_id, "the warm buffer given back is not the tenant's");
    fx_close(&f);
}

/* retain: n leases of 8 KiB by p, each published with a long retention and released:
 * only their retentions hold them. Their tokens in tokens[0..n) (NULL: not wanted). */
static void retain_tokens(struct fx *f, struct fake *p, int n, uint8_t (*tokens)[PROTO_TOKEN_LEN])
{
    for (int i = 0; i < n; i++) {
        struct att t;
        att_init(&t, f, p, 8 * KiB);
        cr_assert_eq(try(f, &t, NULL), 0, "%s", t.msg);
        if (tokens)
            memcpy(tokens[i], t.a.buf->token, PROTO_TOKEN_LEN);
        cr_assert_eq(registry_publish(f->bk.reg, t.a.buf, 8 * KiB, 60000, NULL, 0), 0);
        cr_assert_eq(registry_release(f->bk.reg, &p->peer.holder, t.a.handle), 0);
    }
}

static void retain(struct fx *f, struct fake *p, int n)
{
    retain_tokens(f, p, n, NULL);
}

/* A lease refused for quota that reclaiming its tenant's retained buffers would cure
 * reclaims as many as it needs, and no more; a lease that waits for quota reclaims none
 * (its consumers take them), and neither does one that would not fit anyway. */
Test(lease, reclaims_retained_as_needed_unless_it_waits)
{
    struct fx f;
    fx_open(&f);
    quota_set(f.bk.quota, 1000, 16 * KiB);
    retain(&f, &f.a, 2);
    cr_assert_eq(registry_stats(f.bk.reg).retained, 2);
    cr_assert_eq(quota_held(f.bk.quota, 1000), 16 * KiB);

    struct att w;
    att_init(&w, &f, &f.a, 8 * KiB);
    w.a.waits = true;
    cr_assert_eq(try(&f, &w, NULL), -EDQUOT, "a waiting lease: %s", w.msg);
    cr_assert_eq(registry_stats(f.bk.reg).retained, 2, "a waiting lease reclaimed retention");

    struct att big;
    att_init(&big, &f, &f.a, 32 * KiB);
    cr_assert_eq(try(&f, &big, NULL), -EDQUOT, "%s", big.msg);
    cr_assert_eq(registry_stats(f.bk.reg).retained, 2, "a lease that cannot fit reclaimed retention");

    /* 16 KiB: both must go */
    struct att n;
    att_init(&n, &f, &f.a, 16 * KiB);
    cr_assert_eq(try(&f, &n, NULL), 0, "%s", n.msg);
    struct registry_stats st = registry_stats(f.bk.reg);
    cr_assert_eq(st.reclaimed, 2);
    cr_assert_eq(st.retained, 0);
    cr_assert_eq(quota_held(f.bk.quota, 1000), 16 * KiB);
    registry_release_all(f.bk.reg, &f.a.peer.holder);

    /* 8 KiB of three retained at a 24 KiB quota: one goes, two stay; the one that goes is
     * the first retained (all three in the same millisecond: before, the order was the
     * hash's) */
    quota_set(f.bk.quota, 1000, 24 * KiB);
    uint8_t tok[3][PROTO_TOKEN_LEN];
    retain_tokens(&f, &f.a, 3, tok);
    cr_assert_eq(quota_held(f.bk.quota, 1000), 24 * KiB);
    att_init(&n, &f, &f.a, 8 * KiB);
    cr_assert_eq(try(&f, &n, NULL), 0, "%s", n.msg);
    st = registry_stats(f.bk.reg);
    cr_assert_eq(st.reclaimed, 3, "reclaimed more than it needed");
    cr_assert_eq(st.retained, 2);
    cr_assert_null(registry_find(f.bk.reg, tok[0]), "the first retained is not the one reclaimed");
    cr_assert_not_null(registry_find(f.bk.reg, tok[1]));
    cr_assert_not_null(registry_find(f.bk.reg, tok[2]));
    cr_assert_eq(quota_held(f.bk.quota, 1000), 24 * KiB);

    /* another tenant's retention is never reclaimed for this one */
    quota_set(f.bk.quota, 1001, 8 * KiB);
    retain(&f, &f.b, 1);
    struct att o;
    att_init(&o, &f, &f.a, 8 * KiB);
    cr_assert_eq(try(&f, &o, NULL), 0, "%s", o.msg);
    cr_assert_eq(registry_stats(f.bk.reg).retained, 2, "uid 1001's retention went for uid 1000");
    cr_assert_eq(registry_stats(f.bk.reg).reclaimed, 4);
    cr_assert_eq(quota_held(f.bk.quota, 1001), 8 * KiB);
    fx_close(&f);
}

/* The pool is full: ENOSPC with its numbers, and the charge goes back. */
Test(lease, pool_full_names_its_numbers)
{
    struct fx f;
    struct att t, u;
    fx_open_cap(&f, MiB, 4 * MiB);
    att_init(&t, &f, &f.a, MiB);
    cr_assert_eq(try(&f, &t, NULL), 0, "%s", t.msg);
    att_init(&u, &f, &f.b, 4096);
    cr_assert_eq(try(&f, &u, NULL), -ENOSPC, "%s", u.msg);
    cr_assert(strstr(u.msg, "pool full: 1.0 MiB (1048576 bytes) held of 1.0 MiB (1048576 bytes); "), "%s", u.msg);
    cr_assert(strstr(u.msg, "(4096 bytes) buffer does not fit"), "%s", u.msg);
    cr_assert_eq(quota_held(f.bk.quota, 1001), 0, "a lease the pool refused stayed charged");
    cr_assert_null(u.a.buf);
    ledgers_check(&f.bk);
    fx_close(&f);
}

/* Beyond every size class: EFBIG, nothing charged, nothing made. */
Test(lease, beyond_every_class_is_efbig)
{
    struct fx f;
    struct att t;
    fx_open(&f);
    att_init(&t, &f, &f.a, UINT64_C(1) << 47);
    cr_assert_eq(lease_attempt(&t.a, t.msg, sizeof(t.msg)), -EFBIG);
    cr_assert_str_eq(t.msg, "lease size beyond every size class");
    cr_assert_eq(quota_total(f.bk.quota), 0);
    cr_assert_eq(pool_bytes_creating(f.bk.pool), 0);
    cr_assert_eq(t.done_calls, 0);
    fx_close(&f);
}

/* An attempt cancelled, or whose peer is closing, while its buffer is made: -ECANCELED,
 * nothing held, the charge credited and the buffer warm for its tenant. */
Test(lease, cancelled_or_closing_while_made_gives_it_back)
{
    struct fx f;
    struct att t;
    fx_open(&f);
    att_init(&t, &f, &f.a, MiB);
    cr_assert_eq(lease_attempt(&t.a, t.msg, sizeof(t.msg)), 1);
    t.a.cancelled = true;
    while (t.done_calls == 0)
        uv_run(&f.loop, UV_RUN_ONCE);
    cr_assert_eq(t.err, -ECANCELED);
    cr_assert_null(t.a.buf);
    cr_assert_eq(f.a.peer.holder.leases, 0);
    cr_assert_eq(quota_total(f.bk.quota), 0);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), MiB);
    cr_assert_eq(f.a.refs, 0);
    cr_assert_eq(f.a.peer.pending, 0);

    att_init(&t, &f, &f.b, 2 * MiB);
    cr_assert_eq(lease_attempt(&t.a, t.msg, sizeof(t.msg)), 1);
    f.b.peer.closing = true;
    while (t.done_calls == 0)
        uv_run(&f.loop, UV_RUN_ONCE);
    cr_assert_eq(t.err, -ECANCELED);
    cr_assert_eq(f.b.peer.holder.leases, 0);
    cr_assert_eq(quota_total(f.bk.quota), 0);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), 3 * MiB);
    cr_assert_eq(f.b.refs, 0);
    fx_close(&f);
}

/* ---- lease_one ---------------------------------------------------------------------- */

/* lease_one answers a lease itself (served, now or off the loop, or refused), except for
 * what waiting can cure: EDQUOT and ENOSPC come back unsent for the caller to refuse or
 * park. */
Test(lease, one_answers_or_returns_what_waiting_cures)
{
    struct fx f;
    char msg[PROTO_MAX_ERRMSG];
    fx_open(&f);
    cr_assert_eq(lease_one(&f.bk, &f.a.peer, 5, 5000, false, false, msg, sizeof(msg)), 0);
    while (f.a.replies + f.a.refusals == 0)
        uv_run(&f.loop, UV_RUN_ONCE);
    cr_assert_eq(f.a.refusals, 0, "%s", f.a.msg);
    cr_assert_eq(f.a.last.op, PROTO_OP_LEASE + PROTO_OP_REPLY);
    cr_assert_eq(f.a.last.id, 5);
    cr_assert_eq(f.a.last.u.lease_reply.size, 5000);
    cr_assert_eq(f.a.last.u.lease_reply.capacity, 8 * KiB);
    struct registry_lease *l = registry_lease_of(&f.a.peer.holder, f.a.last.u.lease_reply.handle);
    cr_assert_not_null(l);
    cr_assert_eq(f.a.last_fd, l->buf->pb->fd, "a lease reply without the buffer's writable fd");
    cr_assert_eq(f.counters.leases, 1);
    cr_assert_eq(f.a.refs, 0);

    /* a warm buffer: answered before lease_one returns */
    cr_assert_eq(registry_release(f.bk.reg, &f.a.peer.holder, f.a.last.u.lease_reply.handle), 0);
    cr_assert_eq(lease_one(&f.bk, &f.a.peer, 6, 6000, false, false, msg, sizeof(msg)), 0);
    cr_assert_eq(f.a.replies, 2);
    cr_assert_eq(f.a.last.id, 6);
    cr_assert_eq(f.counters.leases, 2);

    /* quota: returned unsent */
    quota_set(f.bk.quota, 1000, 16 * KiB);
    msg[0] = 0;
    cr_assert_eq(lease_one(&f.bk, &f.a.peer, 7, 16 * KiB, true, false, msg, sizeof(msg)), -EDQUOT);
    cr_assert(strstr(msg, "quota exceeded for uid 1000"), "%s", msg);
    cr_assert_eq(f.a.replies, 2);
    cr_assert_eq(f.a.refusals, 0, "lease_one refused what waiting can cure");
    cr_assert_eq(f.counters.refused_quota, 0);
    cr_assert_eq(f.a.peer.holder.leases, 1);

    /* a size beyond every class: refused here, counted */
    cr_assert_eq(lease_one(&f.bk, &f.a.peer, 8, UINT64_C(1) << 47, false, false, msg, sizeof(msg)), 0);
    cr_assert_eq(f.a.refusals, 1);
    cr_assert_eq(f.a.code, EFBIG);
    cr_assert_eq(f.a.refused_id, 8);
    cr_assert_eq(f.counters.refused_limit, 1);
    fx_close(&f);
}

static void stock_changed(void *arg, uint32_t uid, int64_t delta)
{
    cr_assert_eq(quota_stock(arg, uid, delta), 0);
}

/* Stock leases: within the largest stock lease, the uid's stock cap and the reserve, or
 * EAGAIN, counted as a stock refusal and not as a refusal of the tenant's. */
Test(lease, stock_leases_stay_within_their_caps)
{
    struct fx f;
    char msg[PROTO_MAX_ERRMSG];
    fx_open(&f);
    cr_assert_eq(pool_set_stock(f.bk.pool, 256 * KiB, stock_changed, f.bk.quota), 256 * KiB);
    f.opt.stock_max_lease = 64 * KiB;
    f.opt.stock_per_uid = 128 * KiB;

    cr_assert_eq(lease_one(&f.bk, &f.a.peer, 1, 65 * KiB, false, true, msg, sizeof(msg)), 0);
    cr_assert_eq(f.a.refusals, 1);
    cr_assert_eq(f.a.code, EAGAIN);
    cr_assert(strstr(f.a.msg, "exceeds the largest stock lease 64.0 KiB (65536 bytes)"), "%s", f.a.msg);
    cr_assert_eq(f.counters.stock_refused, 1);
    cr_assert_eq(quota_total(f.bk.quota), 0);

    for (uint32_t id = 2; id <= 3; id++) {
        unsigned before = f.a.replies;
        cr_assert_eq(lease_one(&f.bk, &f.a.peer, id, 64 * KiB, false, true, msg, sizeof(msg)), 0);
        while (f.a.replies == before && f.a.refusals == 1)
            uv_run(&f.loop, UV_RUN_ONCE);
        cr_assert_eq(f.a.refusals, 1, "stock lease %u: %s", id, f.a.msg);
        cr_assert_eq(f.a.last.id, id);
    }
    cr_assert_eq(f.counters.stock_leases, 2);
    cr_assert_eq(quota_stock_held(f.bk.quota, 1000), 128 * KiB);
    cr_assert_eq(pool_bytes_stock(f.bk.pool), 128 * KiB);

    cr_assert_eq(lease_one(&f.bk, &f.a.peer, 4, 4 * KiB, false, true, msg, sizeof(msg)), 0);
    cr_assert_eq(f.a.refusals, 2);
    cr_assert_eq(f.a.code, EAGAIN);
    cr_assert_eq(f.a.refused_id, 4);
    cr_assert(strstr(f.a.msg, "uid 1000's stock holds 128.0 KiB (131072 bytes)"), "%s", f.a.msg);
    cr_assert_eq(f.counters.stock_refused, 2);

    /* another uid: its own cap, the same reserve (128 of 256 KiB left) */
    for (uint32_t id = 5; id <= 6; id++) {
        unsigned before = f.b.replies;
        cr_assert_eq(lease_one(&f.bk, &f.b.peer, id, 64 * KiB, false, true, msg, sizeof(msg)), 0);
        while (f.b.replies == before && f.b.refusals == 0)
            uv_run(&f.loop, UV_RUN_ONCE);
        cr_assert_eq(f.b.refusals, 0, "%s", f.b.msg);
    }
    f.opt.stock_per_uid = 256 * KiB;
    cr_assert_eq(lease_one(&f.bk, &f.b.peer, 7, 4 * KiB, false, true, msg, sizeof(msg)), 0);
    cr_assert_eq(f.b.code, EAGAIN);
    cr_assert(strstr(f.b.msg, "the stock reserve is full: 256.0 KiB (262144 bytes) of 256.0 KiB"), "%s", f.b.msg);

    cr_assert_eq(f.counters.refused_quota + f.counters.refused_space + f.counters.refused_limit +
                 f.counters.refused_other, 0, "a stock refusal counted as a refusal");
    struct quota_tenant qt[4];
    unsigned n = quota_tenants(f.bk.quota, qt, 4);
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(qt[i].refused_other + qt[i].refused_limit + qt[i].refused_quota + qt[i].refused_space, 0,
                     "uid %u counts a stock refusal", qt[i].uid);
    fx_close(&f);
    /* (fx_close released them: the stock bytes went with them) */
}

/* ---- checks before an attempt ------------------------------------------------------- */

/* What needs more than the tenant's whole quota or the whole pool is refused at once
 * (EDQUOT, ENOSPC, the numbers, size classes included); what fits them is left to wait. */
Test(lease, beyond_all_refuses_what_waiting_cannot_cure)
{
    struct fx f;
    fx_open(&f);
    const uint64_t fits[] = { 8 * MiB, 8 * MiB };
    cr_assert_not(lease_beyond_all(&f.bk, &f.a.peer, 1, fits, 2, "lease_many"), "%s", f.a.msg);
    cr_assert_eq(f.a.refusals, 0);

    const uint64_t over[] = { 8 * MiB, 8 * MiB, 1 };
    cr_assert(lease_beyond_all(&f.bk, &f.a.peer, 2, over, 3, "lease_many"));
    cr_assert_eq(f.a.code, EDQUOT);
    cr_assert_eq(f.a.refused_id, 2);
    cr_assert(strstr(f.a.msg, "lease_many of 16.0 MiB (16781312 bytes, size classes included) is more than "
                              "uid 1000's whole quota 16.0 MiB (16777216 bytes)"), "%s", f.a.msg);
    cr_assert_eq(f.counters.refused_quota, 1);

    /* uid 1001 may hold 128 MiB, but the pool is 64 MiB */
    quota_set(f.bk.quota, 1001, 128 * MiB);
    const uint64_t big[] = { 64 * MiB, 1 };
    cr_assert(lease_beyond_all(&f.bk, &f.b.peer, 3, big, 2, "lease"));
    cr_assert_eq(f.b.code, ENOSPC);
    cr_assert(strstr(f.b.msg, "more than the whole pool 64.0 MiB (67108864 bytes)"), "%s", f.b.msg);
    cr_assert_not(lease_beyond_all(&f.bk, &f.b.peer, 4, big, 1, "lease"), "the whole pool fits");

    /* an item beyond every class is the attempt's to refuse */
    const uint64_t huge[] = { 1, UINT64_C(1) << 47 };
    cr_assert_not(lease_beyond_all(&f.bk, &f.a.peer, 5, huge, 2, "lease_many"));
    cr_assert_eq(f.a.refusals, 1);
    cr_assert_eq(quota_total(f.bk.quota), 0);
    fx_close(&f);
}

/* One tenant holds at most half the pool's fd budget in buffers (the operators, root
 * here, are exempt). */
Test(lease, fd_share_is_half_the_budget)
{
    struct fx f;
    struct att t;
    fx_open(&f);
    uint64_t share = pool_fd_budget(f.bk.pool) / 2;
    cr_assert_gt(share, 1);
    att_init(&t, &f, &f.a, 4096);
    cr_assert_eq(try(&f, &t, NULL), 0, "%s", t.msg);
    cr_assert_eq(quota_buffers(f.bk.quota, 1000), 1);
    cr_assert(lease_fd_share_left(&f.bk, &f.a.peer, 1, (uint32_t)(share - 1), "lease_many"), "%s", f.a.msg);
    cr_assert_eq(f.a.refusals, 0);
    cr_assert_not(lease_fd_share_left(&f.bk, &f.a.peer, 2, (uint32_t)share, "lease_many"));
    cr_assert_eq(f.a.code, EMFILE);
    char want[160];
    snprintf(want, sizeof(want), "uid 1000 holds 1 buffers; %llu more would pass its share of the daemon's fd budget",
             (unsigned long long)share);
    cr_assert(strstr(f.a.msg, want), "%s", f.a.msg);
    cr_assert_eq(f.counters.refused_limit, 1);
    /* another tenant's share is its own */
    cr_assert(lease_fd_share_left(&f.bk, &f.b.peer, 3, (uint32_t)share, "lease_many"), "%s", f.b.msg);

    struct fake root;
    fake_init(&root, 9, 0);
    cr_assert(access_operator(0));
    cr_assert(lease_fd_share_left(&f.bk, &root.peer, 4, (uint32_t)share + 1, "lease_many"), "root was refused");
    cr_assert_eq(root.refusals, 0);
    fx_close(&f);
}
