/* SPDX-License-Identifier: MIT */
/* test-broker.c: the lease lifecycle (daemon/broker.c) with a fake session (a struct
 * broker_peer that records its replies) over a real pool under /dev/shm, a real quota
 * ledger, a real registry and a real libuv loop. After every step the ledgers must agree
 * (broker_check aborts in test builds), and every refusal names its numbers. */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "broker.h"
#include "core-fixture.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

struct fake {
    struct broker_peer peer;
    unsigned replies, refs;
    struct proto_msg last;       /* the last reply (pointers not kept) */
    int last_fd;
    int code;                    /* of the last refusal, 0 if the last reply was not one */
    char msg[PROTO_MAX_ERRMSG + 1];
    uint8_t token[PROTO_TOKEN_LEN];
};

static void fake_reply(struct broker_peer *p, const struct proto_msg *m, int fd)
{
    struct fake *f = (struct fake *)p;
    f->replies++;
    f->last = *m;
    f->last_fd = fd;
    f->code = 0;
    if (m->op == PROTO_OP_PUBLISH + PROTO_OP_REPLY)
        memcpy(f->token, m->u.publish_reply.token, PROTO_TOKEN_LEN);
}

static void fake_refuse(struct broker_peer *p, uint32_t id, int code, const char *msg)
{
    struct fake *f = (struct fake *)p;
    f->replies++;
    f->last = (struct proto_msg){ .op = PROTO_OP_ERROR, .id = id };
    f->code = code;
    snprintf(f->msg, sizeof(f->msg), "%s", msg);
}

static void fake_ref(struct broker_peer *p) { ((struct fake *)p)->refs++; }
static void fake_unref(struct broker_peer *p) { ((struct fake *)p)->refs--; }

static const struct broker_peer_ops fake_ops = { fake_reply, fake_refuse, fake_ref, fake_unref };

struct fx {
    uv_loop_t loop;
    struct core core;
    struct options opt;
    struct counters counters;
    struct broker bk;
    struct fake a, b;            /* uid 1000 and uid 1001 */
};

static void fake_init(struct fake *f, uint64_t id, uid_t uid)
{
    memset(f, 0, sizeof(*f));
    f->peer.ops = &fake_ops;
    f->peer.id = id;
    f->peer.pid = 4242;
    f->peer.uid = uid;
}

static void fx_open(struct fx *f)
{
    memset(f, 0, sizeof(*f));
    core_open(&f->core, &f->loop, "broker", 64 * MiB, 16 * MiB);
    f->opt.max_lease_size = 32 * MiB;
    f->opt.max_leases = 4;
    f->bk = (struct broker){ .opt = &f->opt, .pool = f->core.pool, .quota = f->core.quota, .reg = f->core.reg,
                             .counters = &f->counters };
    fake_init(&f->a, 1, 1000);
    fake_init(&f->b, 2, 1001);
}

static void fx_close(struct fx *f)
{
    broker_disconnect(&f->bk, &f->a.peer);
    broker_disconnect(&f->bk, &f->b.peer);
    broker_check(&f->bk);
    cr_assert_eq(quota_total(f->bk.quota), 0, "a charge outlived every lease");
    core_close(&f->core, &f->loop);
}

/* request: hand m to the broker and run the loop until the peer has one more reply
 * (a new buffer is made off the loop), or 5 s pass. Checks the ledgers after. */
static void request(struct fx *f, struct fake *p, const struct proto_msg *m)
{
    unsigned before = p->replies;
    cr_assert(broker_handle(&f->bk, &p->peer, m), "op %u not handled", (unsigned)m->op);
    for (int i = 0; i < 5000 && p->replies == before && p->peer.pending; i++) {
        uv_run(&f->loop, UV_RUN_NOWAIT);
        if (p->replies == before)
            usleep(1000);
    }
    broker_check(&f->bk);
}

static uint64_t lease(struct fx *f, struct fake *p, uint64_t size)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 10 };
    m.u.lease.size = size;
    request(f, p, &m);
    if (p->code)
        return 0;
    cr_assert_eq(p->last.op, PROTO_OP_LEASE + PROTO_OP_REPLY);
    cr_assert_eq(p->last.id, 10);
    return p->last.u.lease_reply.handle;
}

static void publish(struct fx *f, struct fake *p, uint64_t handle, uint64_t size, uint32_t keep_ms)
{
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 11 };
    m.u.publish.handle = handle;
    m.u.publish.size = size;
    m.u.publish.keep_ms = keep_ms;
    m.u.publish.meta = (const uint8_t *)"f8";
    m.u.publish.meta_len = 2;
    request(f, p, &m);
}

static void acquire(struct fx *f, struct fake *p, const uint8_t *token)
{
    struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = 12 };
    memcpy(m.u.acquire.token, token, PROTO_TOKEN_LEN);
    request(f, p, &m);
}

static void release(struct fx *f, struct fake *p, uint64_t handle, uint32_t flags)
{
    struct proto_msg m = { .op = PROTO_OP_RELEASE, .id = 13 };
    m.u.release.handle = handle;
    m.u.release.flags = flags;
    request(f, p, &m);
}

Test(broker, lease_publish_acquire_release)
{
    struct fx f;
    fx_open(&f);
    uint64_t h = lease(&f, &f.a, 5000);
    cr_assert_neq(h, 0, "lease refused: %s", f.a.msg);
    cr_assert_eq(f.a.last.u.lease_reply.size, 5000);
    cr_assert_eq(f.a.last.u.lease_reply.capacity, 8 * KiB, "the class of 5000 bytes");
    cr_assert_geq(f.a.last_fd, 0, "a lease reply carries the buffer's fd");
    cr_assert_eq(f.a.refs, 0, "the wait for a new buffer kept a reference");
    cr_assert_eq(quota_total(f.bk.quota), 8 * KiB, "charged the class size");
    uint64_t buf_id = f.a.last.u.lease_reply.buf_id;

    publish(&f, &f.a, h, 4000, 0);
    cr_assert_eq(f.a.last.op, PROTO_OP_PUBLISH + PROTO_OP_REPLY, "publish: %s", f.a.msg);
    cr_assert_eq(f.a.last.u.publish_reply.size, 4000);

    acquire(&f, &f.b, f.a.token);
    cr_assert_eq(f.b.last.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY, "acquire: %s", f.b.msg);
    cr_assert_eq(f.b.last.u.acquire_reply.buf_id, buf_id);
    cr_assert_eq(f.b.last.u.acquire_reply.size, 4000);
    cr_assert_eq(f.b.last.u.acquire_reply.meta_len, 2);
    cr_assert_geq(f.b.last_fd, 0);
    cr_assert_neq(f.b.last_fd, f.a.last_fd, "an acquire gets the read-only fd");
    uint64_t hb = f.b.last.u.acquire_reply.handle;

    release(&f, &f.a, h, 0);
    cr_assert_eq(f.a.last.op, PROTO_OP_RELEASE + PROTO_OP_REPLY);
    cr_assert_eq(quota_total(f.bk.quota), 8 * KiB, "still held by the consumer");
    unsigned before = f.b.replies;
    release(&f, &f.b, hb, PROTO_RELEASE_NOREPLY);
    cr_assert_eq(f.b.replies, before, "a no-reply release replied");
    cr_assert_eq(quota_total(f.bk.quota), 0);
    cr_assert_eq(registry_stats(f.bk.reg).buffers, 0);
    /* another uid mapped it: retired, not recycled */
    cr_assert_eq(pool_bytes_warm(f.bk.pool), 0);
    cr_assert_eq(f.counters.leases, 1);
    cr_assert_eq(f.counters.publishes, 1);
    cr_assert_eq(f.counters.acquires, 1);
    cr_assert_eq(f.counters.releases, 2);
    fx_close(&f);
}

/* The lease reply names the token the publish keeps; a NOREPLY publish is silent on
 * success, and its error still replies with the request id. */
Test(broker, token_at_lease_and_noreply_publish)
{
    struct fx f;
    fx_open(&f);
    uint64_t h = lease(&f, &f.a, 5000);
    cr_assert_neq(h, 0, "lease refused: %s", f.a.msg);
    uint8_t token[PROTO_TOKEN_LEN], zero[PROTO_TOKEN_LEN] = { 0 };
    memcpy(token, f.a.last.u.lease_reply.token, PROTO_TOKEN_LEN);
    cr_assert_neq(memcmp(token, zero, PROTO_TOKEN_LEN), 0, "a lease reply without a token");

    acquire(&f, &f.b, token);
    cr_assert_eq(f.b.code, ENOENT, "an unpublished buffer was acquired");

    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 31 };
    m.u.publish.handle = h;
    m.u.publish.size = 10;
    m.u.publish.flags = PROTO_PUBLISH_NOREPLY;
    unsigned before = f.a.replies;
    request(&f, &f.a, &m);
    cr_assert_eq(f.a.replies, before, "a NOREPLY publish replied");
    cr_assert_eq(f.counters.publishes, 1);
    acquire(&f, &f.b, token);
    cr_assert_eq(f.b.last.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY, "acquire by the lease's token: %s", f.b.msg);
    cr_assert_eq(memcmp(f.b.last.u.acquire_reply.token, token, PROTO_TOKEN_LEN), 0);
    uint64_t hb = f.b.last.u.acquire_reply.handle;

    m.id = 32; /* again: already published, an error with the id */
    request(&f, &f.a, &m);
    cr_assert_eq(f.a.replies, before + 1);
    cr_assert_eq(f.a.code, EALREADY);
    cr_assert_eq(f.a.last.id, 32);
    release(&f, &f.a, h, 0);
    release(&f, &f.b, hb, 0);

    /* the next lease of the recycled buffer has a new token */
    h = lease(&f, &f.a, 5000);
    cr_assert_neq(memcmp(f.a.last.u.lease_reply.token, token, PROTO_TOKEN_LEN), 0);
    release(&f, &f.a, h, 0);
    fx_close(&f);
}

Test(broker, a_recycled_buffer_comes_at_once)
{
    struct fx f;
    fx_open(&f);
    uint64_t h = lease(&f, &f.a, 100 * KiB);
    uint64_t id = f.a.last.u.lease_reply.buf_id, cap = f.a.last.u.lease_reply.capacity;
    release(&f, &f.a, h, 0);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), cap);
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 20 };
    m.u.lease.size = 99 * KiB;
    unsigned before = f.a.replies;
    cr_assert(broker_handle(&f.bk, &f.a.peer, &m));
    cr_assert_eq(f.a.replies, before + 1, "a warm buffer waited for the loop");
    cr_assert_eq(f.a.last.u.lease_reply.buf_id, id);
    broker_check(&f.bk);
    fx_close(&f);
}

Test(broker, refusals_name_the_numbers)
{
    struct fx f;
    fx_open(&f);
    cr_assert_eq(lease(&f, &f.a, 0), 0);
    cr_assert_eq(f.a.code, EINVAL);
    cr_assert_eq(lease(&f, &f.a, 33 * MiB), 0);
    cr_assert_eq(f.a.code, EFBIG);
    cr_assert(strstr(f.a.msg, "(34603008 bytes)") && strstr(f.a.msg, "(33554432 bytes)"), "%s", f.a.msg);
    cr_assert_eq(f.counters.refused_limit, 1);

    cr_assert_neq(lease(&f, &f.a, 16 * MiB), 0, "the whole quota: %s", f.a.msg);
    cr_assert_eq(lease(&f, &f.a, 1), 0);
    cr_assert_eq(f.a.code, EDQUOT);
    cr_assert(strstr(f.a.msg, "quota exceeded for uid 1000"), "%s", f.a.msg);
    cr_assert(strstr(f.a.msg, "(16777216 bytes)"), "%s", f.a.msg);
    cr_assert_eq(f.counters.refused_quota, 1);
    /* another tenant's quota is its own */
    cr_assert_neq(lease(&f, &f.b, 1), 0);
    fx_close(&f);
}

Test(broker, lease_count_limit_per_peer)
{
    struct fx f;
    fx_open(&f);
    for (int i = 0; i < 4; i++)
        cr_assert_neq(lease(&f, &f.a, 4096), 0, "lease %d: %s", i, f.a.msg);
    cr_assert_eq(lease(&f, &f.a, 4096), 0);
    cr_assert_eq(f.a.code, EMFILE);
    cr_assert(strstr(f.a.msg, "4 held, limit 4"), "%s", f.a.msg);
    cr_assert_neq(lease(&f, &f.b, 4096), 0, "the limit is per peer");
    fx_close(&f);
}

Test(broker, wrong_handles_and_publishes)
{
    struct fx f;
    fx_open(&f);
    release(&f, &f.a, 12345, 0);
    cr_assert_eq(f.a.code, ENOENT);
    release(&f, &f.a, 12345, PROTO_RELEASE_NOREPLY);
    cr_assert_eq(f.a.code, ENOENT, "an error replies even without a reply asked");
    uint64_t h = lease(&f, &f.a, 4096);
    publish(&f, &f.a, h, 5000, 0);
    cr_assert_eq(f.a.code, EINVAL, "more than leased");
    publish(&f, &f.a, h, 4096, 0);
    cr_assert_eq(f.a.code, 0);
    publish(&f, &f.a, h, 4096, 0);
    cr_assert_eq(f.a.code, EALREADY);
    acquire(&f, &f.b, f.a.token);
    uint64_t hb = f.b.last.u.acquire_reply.handle;
    publish(&f, &f.b, hb, 1, 0);
    cr_assert_eq(f.b.code, EPERM);
    publish(&f, &f.b, hb + 1, 1, 0);
    cr_assert_eq(f.b.code, ENOENT, "a handle this peer does not hold");
    uint8_t nobody[PROTO_TOKEN_LEN] = { 1 };
    acquire(&f, &f.b, nobody);
    cr_assert_eq(f.b.code, ENOENT);
    fx_close(&f);
}

/* A lease waiting for a new buffer when its peer goes: no reply, the buffer goes back
 * warm, the charge is credited, and the peer's reference is dropped. */
Test(broker, peer_closing_while_a_buffer_is_made)
{
    struct fx f;
    fx_open(&f);
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = 30 };
    m.u.lease.size = MiB;
    cr_assert(broker_handle(&f.bk, &f.a.peer, &m));
    cr_assert_eq(f.a.peer.pending, 1);
    cr_assert_eq(f.a.refs, 1, "a pending lease holds its peer");
    cr_assert_eq(f.bk.pending_bytes, MiB);
    broker_check(&f.bk);
    f.a.peer.closing = true;
    for (int i = 0; i < 5000 && f.a.peer.pending; i++) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    cr_assert_eq(f.a.peer.pending, 0);
    cr_assert_eq(f.a.refs, 0);
    cr_assert_eq(f.a.replies, 0, "a closing peer got a reply");
    cr_assert_eq(quota_total(f.bk.quota), 0);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), MiB);
    broker_check(&f.bk);
    fx_close(&f);
}

Test(broker, disconnect_reclaims_every_handle)
{
    struct fx f;
    fx_open(&f);
    lease(&f, &f.a, 4096);
    lease(&f, &f.a, 8192);
    cr_assert_eq(broker_disconnect(&f.bk, &f.a.peer), 2);
    cr_assert_eq(f.counters.reclaimed_leases, 2);
    cr_assert_eq(f.counters.reclaimed_clients, 1);
    cr_assert_eq(quota_total(f.bk.quota), 0);
    cr_assert_eq(broker_disconnect(&f.bk, &f.a.peer), 0);
    cr_assert_eq(f.counters.reclaimed_clients, 1, "nothing reclaimed counts no client");
    fx_close(&f);
}

Test(broker, other_ops_are_not_the_brokers)
{
    struct fx f;
    fx_open(&f);
    const uint32_t ops[] = { PROTO_OP_HELLO, PROTO_OP_STATUS, PROTO_OP_PING, PROTO_OP_FORGET, 99 };
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        struct proto_msg m = { .op = ops[i], .id = 1 };
        cr_assert_not(broker_handle(&f.bk, &f.a.peer, &m), "op %u", (unsigned)ops[i]);
    }
    cr_assert_eq(f.a.replies, 0);
    fx_close(&f);
}

/* The cross-check can fail: a charge no buffer accounts for aborts a test build. */
Test(broker, ledger_drift_aborts_a_test_build, .signal = SIGABRT)
{
    struct fx f;
    char why[256];
    fx_open(&f);
    lease(&f, &f.a, 4096);
    cr_assert_eq(quota_charge(f.bk.quota, 1000, 4096, why, sizeof(why)), 0);
    broker_check(&f.bk);
}
