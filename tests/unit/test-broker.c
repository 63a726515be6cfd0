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
#include "broker-fixture.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

/* Not fake-peer.h's: a refusal here is one more reply (a PROTO_OP_ERROR), in order with
 * the others, as the session sends it; the tests wait for replies and read the last. */
struct fake {
    struct broker_peer peer;
    unsigned replies, refs;
    struct proto_msg last;       /* the last reply (pointers not kept) */
    int last_fd;
    int code;                    /* of the last refusal, 0 if the last reply was not one */
    char msg[PROTO_MAX_ERRMSG + 1];
    uint8_t token[PROTO_TOKEN_LEN];
    int fds[PROTO_MAX_BATCH];    /* of the last lease_many reply */
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

/* A lease_many reply: kept whole, with every item's fd (as if each travelled). */
static void fake_reply_many(struct broker_peer *p, const struct proto_msg *m, const int *fds)
{
    struct fake *f = (struct fake *)p;
    fake_reply(p, m, -1);
    for (uint32_t i = 0; i < m->u.lease_many_reply.n; i++) {
        f->last.u.lease_many_reply.items[i].has_fd = 1;
        f->fds[i] = fds[i];
    }
}

static const struct broker_peer_ops fake_ops = { fake_reply, fake_refuse, fake_ref, fake_unref, fake_reply_many };

struct fx {
    BROKER_FIXTURE_FIELDS;
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
    broker_fixture_open(f, "broker", 64 * MiB, 16 * MiB);
    f->opt.max_lease_size = 32 * MiB;
    f->opt.max_leases = 4;
    f->opt.max_parked_per_uid = 1024;
    fake_init(&f->a, 1, 1000);
    fake_init(&f->b, 2, 1001);
    broker_start(&f->bk, &f->loop);
}

static void fx_close(struct fx *f)
{
    broker_disconnect(&f->bk, &f->a.peer);
    broker_disconnect(&f->bk, &f->b.peer);
    broker_check(&f->bk);
    cr_assert_eq(quota_total(f->bk.quota), 0, "a charge outlived every lease");
    cr_assert_eq(f->bk.waiters.n, 0, "a waiter outlived its peer");
    broker_stop(&f->bk);
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
    /* The abort skips fx_close: the pool directory goes now (its buffers are O_TMPFILE
     * files, with no names in it), not left in /dev/shm by every run. */
    cr_assert_eq(rmdir(f.core.dir), 0, "%s: %s", f.core.dir, strerror(errno));
    broker_check(&f.bk);
}

/* ---- waits (protocol v2) ------------------------------------------------------------ */

/* run_until: runs the loop until p has want replies or ms pass; returns its replies. */
static unsigned run_until(struct fx *f, struct fake *p, unsigned want, int ms)
{
    for (int i = 0; i < ms && p->replies < want; i++) {
        uv_run(&f->loop, UV_RUN_NOWAIT);
        if (p->replies < want)
            usleep(1000);
    }
    broker_check(&f->bk);
    return p->replies;
}

static void acquire_wait(struct fx *f, struct fake *p, const uint8_t *token, uint32_t id, uint32_t wait_ms)
{
    struct proto_msg m = { .op = PROTO_OP_ACQUIRE, .id = id };
    memcpy(m.u.acquire.token, token, PROTO_TOKEN_LEN);
    m.u.acquire.wait_ms = wait_ms;
    cr_assert(broker_handle(&f->bk, &p->peer, &m));
    broker_check(&f->bk);
}

static void lease_wait(struct fx *f, struct fake *p, uint64_t size, uint32_t id, uint32_t wait_ms)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE, .id = id };
    m.u.lease.size = size;
    m.u.lease.wait_ms = wait_ms;
    cr_assert(broker_handle(&f->bk, &p->peer, &m));
    broker_check(&f->bk);
}

static void publish_noreply(struct fx *f, struct fake *p, uint64_t handle)
{
    struct proto_msg m = { .op = PROTO_OP_PUBLISH, .id = 30 };
    m.u.publish.handle = handle;
    m.u.publish.size = 10;
    m.u.publish.flags = PROTO_PUBLISH_NOREPLY;
    cr_assert(broker_handle(&f->bk, &p->peer, &m));
    broker_check(&f->bk);
}

Test(broker, acquire_waits_for_the_publish)
{
    struct fx f;
    fx_open(&f);
    uint64_t h = lease(&f, &f.a, 5000);
    uint8_t token[PROTO_TOKEN_LEN];
    memcpy(token, f.a.last.u.lease_reply.token, PROTO_TOKEN_LEN);
    unsigned before = f.b.replies;
    acquire_wait(&f, &f.b, token, 41, 5000);
    acquire_wait(&f, &f.b, token, 42, 5000);
    cr_assert_eq(f.b.replies, before, "a waiting acquire replied before the publish");
    cr_assert_eq(f.b.peer.parked.places, 2);
    cr_assert_eq(f.counters.acquire_waits, 2);
    publish_noreply(&f, &f.a, h);
    cr_assert_eq(f.b.replies, before + 2, "the publish did not serve its waiters");
    cr_assert_eq(f.b.last.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY, "%s", f.b.msg);
    cr_assert_eq(f.b.last.id, 42, "served out of arrival order");
    cr_assert_eq(f.b.peer.parked.places, 0);
    cr_assert_eq(f.b.peer.holder.leases, 2);
    cr_assert_eq(f.counters.acquires, 2);
    cr_assert_eq(f.counters.acquire_wait_timeouts, 0);

    /* wait 0: the old behaviour, ENOENT at once for an unpublished buffer */
    uint64_t h2 = lease(&f, &f.a, 5000);
    memcpy(token, f.a.last.u.lease_reply.token, PROTO_TOKEN_LEN);
    before = f.b.replies;
    acquire_wait(&f, &f.b, token, 43, 0);
    cr_assert_eq(f.b.replies, before + 1);
    cr_assert_eq(f.b.code, ENOENT);
    /* a token never leased: ENOENT at once, wait or not */
    token[0] ^= 0xff;
    acquire_wait(&f, &f.b, token, 44, 5000);
    cr_assert_eq(f.b.replies, before + 2);
    cr_assert_eq(f.b.code, ENOENT);
    release(&f, &f.a, h, 0);
    release(&f, &f.a, h2, 0);
    fx_close(&f);
}

Test(broker, acquire_wait_ends_with_enoent)
{
    struct fx f;
    fx_open(&f);
    uint64_t h = lease(&f, &f.a, 5000);
    uint8_t token[PROTO_TOKEN_LEN];
    memcpy(token, f.a.last.u.lease_reply.token, PROTO_TOKEN_LEN);
    unsigned before = f.b.replies;

    /* the producer releases it unpublished */
    acquire_wait(&f, &f.b, token, 51, 5000);
    release(&f, &f.a, h, 0);
    cr_assert_eq(f.b.replies, before + 1);
    cr_assert_eq(f.b.code, ENOENT);
    cr_assert_eq(f.b.last.id, 51);
    cr_assert(strstr(f.b.msg, "released before it was published"), "%s", f.b.msg);
    cr_assert_eq(f.b.peer.parked.places, 0);

    /* the wait runs out */
    h = lease(&f, &f.a, 5000);
    memcpy(token, f.a.last.u.lease_reply.token, PROTO_TOKEN_LEN);
    acquire_wait(&f, &f.b, token, 52, 30);
    cr_assert_eq(run_until(&f, &f.b, before + 2, 2000), before + 2, "the wait never ran out");
    cr_assert_eq(f.b.code, ENOENT);
    cr_assert_eq(f.b.last.id, 52);
    cr_assert(strstr(f.b.msg, "was not published within 30 ms"), "%s", f.b.msg);
    cr_assert_eq(f.counters.acquire_wait_timeouts, 1);

    /* the producer disconnects */
    acquire_wait(&f, &f.b, token, 53, 5000);
    broker_disconnect(&f.bk, &f.a.peer);
    cr_assert_eq(f.b.replies, before + 3);
    cr_assert_eq(f.b.code, ENOENT);
    cr_assert_eq(f.b.last.id, 53);
    fx_close(&f);
}

/* Parked acquires take places under max-leases (4 here); a waiter's peer that goes drops it. */
Test(broker, parked_acquires_count_against_max_leases)
{
    struct fx f;
    fx_open(&f);
    uint64_t h = lease(&f, &f.a, 5000);
    uint8_t token[PROTO_TOKEN_LEN];
    memcpy(token, f.a.last.u.lease_reply.token, PROTO_TOKEN_LEN);
    unsigned before = f.b.replies;
    for (uint32_t i = 0; i < 4; i++)
        acquire_wait(&f, &f.b, token, 60 + i, 5000);
    cr_assert_eq(f.b.replies, before);
    acquire_wait(&f, &f.b, token, 64, 5000);
    cr_assert_eq(f.b.replies, before + 1);
    cr_assert_eq(f.b.code, EMFILE, "a fifth parked acquire: %s", f.b.msg);
    cr_assert(strstr(f.b.msg, "4 of them waiting"), "%s", f.b.msg);
    cr_assert_eq(lease(&f, &f.b, 100), 0, "a lease past max-leases");
    cr_assert_eq(f.b.code, EMFILE);
    broker_disconnect(&f.bk, &f.b.peer);
    cr_assert_eq(f.bk.waiters.n, 0);
    cr_assert_eq(f.b.peer.parked.places, 0);
    before = f.b.replies;
    publish_noreply(&f, &f.a, h);
    cr_assert_eq(f.b.replies, before, "a dropped waiter was served");
    release(&f, &f.a, h, 0);
    fx_close(&f);
}

/* Quota is 16 MiB per uid here: a waiting lease at the quota is served when a release
 * credits it, in FIFO order; another tenant is never held up. */
Test(broker, lease_waits_for_quota_in_order)
{
    struct fx f;
    fx_open(&f);
    uint64_t h1 = lease(&f, &f.a, 8 * MiB), h2 = lease(&f, &f.a, 8 * MiB);
    cr_assert(h1 && h2, "%s", f.a.msg);
    unsigned before = f.a.replies;
    lease_wait(&f, &f.a, 8 * MiB, 71, 5000);
    lease_wait(&f, &f.a, 4 * KiB, 72, 5000);  /* queues behind the first, FIFO */
    cr_assert_eq(f.a.replies, before, "a waiting lease replied at once: %s", f.a.msg);
    cr_assert_eq(f.a.peer.parked.places, 2);
    cr_assert_eq(f.counters.lease_waits, 2);
    cr_assert_eq(f.counters.refused_quota, 0);
    /* uid 1001 is not held up by uid 1000's waiters */
    uint64_t hb = lease(&f, &f.b, 8 * MiB);
    cr_assert_neq(hb, 0, "another tenant's lease: %s", f.b.msg);
    /* room for the first waiter: it is served, and the second (4 KiB) still does not fit */
    release(&f, &f.a, h1, PROTO_RELEASE_NOREPLY);
    cr_assert_eq(run_until(&f, &f.a, before + 1, 3000), before + 1, "the first waiter was not served");
    cr_assert_eq(f.a.code, 0, "%s", f.a.msg);
    cr_assert_eq(f.a.last.id, 71, "the second waiter came first");
    uint64_t h3 = f.a.last.u.lease_reply.handle;
    cr_assert_eq(run_until(&f, &f.a, before + 2, 100), before + 1, "a lease past the quota was served");
    cr_assert_eq(f.a.peer.parked.places, 1);
    cr_assert_eq(quota_held(f.bk.quota, 1000), 16 * MiB);
    release(&f, &f.a, h2, PROTO_RELEASE_NOREPLY);
    cr_assert_eq(run_until(&f, &f.a, before + 2, 3000), before + 2, "the second waiter was not served");
    cr_assert_eq(f.a.last.id, 72);
    cr_assert_eq(f.a.code, 0, "%s", f.a.msg);
    cr_assert_eq(f.a.peer.parked.places, 0);
    cr_assert_eq(f.a.peer.holder.leases, 2);
    cr_assert_eq(f.counters.refused_quota, 0, "a waiting lease was refused");
    release(&f, &f.a, h3, 0);
    release(&f, &f.b, hb, 0);
    fx_close(&f);
}

Test(broker, lease_wait_times_out_with_the_numbers)
{
    struct fx f;
    fx_open(&f);
    uint64_t h1 = lease(&f, &f.a, 16 * MiB);
    cr_assert_neq(h1, 0, "%s", f.a.msg);
    unsigned before = f.a.replies;
    lease_wait(&f, &f.a, MiB, 81, 40);
    cr_assert_eq(run_until(&f, &f.a, before + 1, 3000), before + 1, "the wait never ran out");
    cr_assert_eq(f.a.code, ETIMEDOUT);
    cr_assert_eq(f.a.last.id, 81);
    cr_assert(strstr(f.a.msg, "lease of 1.0 MiB (1048576 bytes) waited "), "%s", f.a.msg);
    cr_assert(strstr(f.a.msg, " ms for quota: uid 1000 holds 16.0 MiB (16777216 bytes) of its 16.0 MiB quota"), "%s",
              f.a.msg);
    cr_assert_eq(f.counters.lease_wait_timeouts, 1);
    cr_assert_eq(f.a.peer.parked.places, 0);
    cr_assert_eq(quota_held(f.bk.quota, 1000), 16 * MiB, "a timed-out wait was charged");

    /* a waiter whose peer goes is dropped with nothing charged */
    lease_wait(&f, &f.a, MiB, 82, 5000);
    cr_assert_eq(f.a.peer.parked.places, 1);
    release(&f, &f.a, h1, 0);
    broker_disconnect(&f.bk, &f.a.peer);
    cr_assert_eq(f.bk.waiters.n, 0);
    run_until(&f, &f.a, f.a.replies + 1, 50);
    cr_assert_eq(quota_total(f.bk.quota), 0);
    fx_close(&f);
}

/* The pool is 64 MiB here: a waiting lease for pool space (another tenant holds it). */
Test(broker, lease_waits_for_pool_space, .timeout = 30)
{
    struct fx f;
    fx_open(&f);
    quota_set(f.bk.quota, 1000, 64 * MiB);
    quota_set(f.bk.quota, 1001, 64 * MiB);
    f.opt.max_leases = 8;
    uint64_t h[4];
    for (int i = 0; i < 4; i++)
        cr_assert_neq(h[i] = lease(&f, &f.a, 16 * MiB), 0, "%s", f.a.msg);
    unsigned before = f.b.replies;
    lease_wait(&f, &f.b, 16 * MiB, 91, 5000);
    cr_assert_eq(f.b.replies, before, "%s", f.b.msg);
    cr_assert_eq(f.b.peer.parked.places, 1);
    /* a retry that fails frees nothing: it must not kick itself again (a busy loop) */
    broker_kick(&f.bk);
    run_until(&f, &f.b, before + 1, 30);
    cr_assert_not(uv_is_active((uv_handle_t *)&f.bk.waiters.kick), "the retry keeps kicking itself");
    release(&f, &f.a, h[0], 0);
    cr_assert_eq(run_until(&f, &f.b, before + 1, 3000), before + 1);
    cr_assert_eq(f.b.code, 0, "%s", f.b.msg);
    cr_assert_eq(f.b.last.op, PROTO_OP_LEASE + PROTO_OP_REPLY);
    /* and a timeout names the pool's numbers */
    lease_wait(&f, &f.b, 16 * MiB, 92, 30);
    cr_assert_eq(run_until(&f, &f.b, before + 2, 3000), before + 2);
    cr_assert_eq(f.b.code, ETIMEDOUT);
    cr_assert(strstr(f.b.msg, "lease of 16.0 MiB (16777216 bytes) waited "), "%s", f.b.msg);
    cr_assert(strstr(f.b.msg, "ms for pool space: the pool holds 64.0 MiB (67108864 bytes) of its 64.0 MiB"), "%s",
              f.b.msg);
    for (int i = 1; i < 4; i++)
        release(&f, &f.a, h[i], 0);
    fx_close(&f);
}

/* ---- batches ----------------------------------------------------------------------- */

static void lease_many(struct fx *f, struct fake *p, uint32_t id, const uint64_t *sizes, uint32_t n, uint32_t wait)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE_MANY, .id = id };
    m.u.lease_many.n = n;
    memcpy(m.u.lease_many.sizes, sizes, n * sizeof(sizes[0]));
    m.u.lease_many.wait_ms = wait;
    request(f, p, &m);
}

static void release_many(struct fx *f, struct fake *p, uint32_t id, const uint64_t *handles, uint32_t n,
                         uint32_t flags)
{
    struct proto_msg m = { .op = PROTO_OP_RELEASE_MANY, .id = id };
    m.u.release_many.n = n;
    memcpy(m.u.release_many.handles, handles, n * sizeof(handles[0]));
    m.u.release_many.flags = flags;
    request(f, p, &m);
}

Test(broker, lease_many_and_release_many)
{
    struct fx f;
    fx_open(&f);
    f.opt.max_leases = 32;
    /* one warm (recycled) buffer, three made off the loop */
    uint64_t h0 = lease(&f, &f.a, 8 * KiB);
    release(&f, &f.a, h0, 0);
    static const uint64_t sizes[] = { 8 * KiB, 100, MiB, 3 * MiB };
    unsigned before = f.a.replies;
    lease_many(&f, &f.a, 101, sizes, 4, 0);
    cr_assert_eq(run_until(&f, &f.a, before + 1, 5000), before + 1);
    cr_assert_eq(f.a.last.op, PROTO_OP_LEASE_MANY + PROTO_OP_REPLY, "lease_many: %s", f.a.msg);
    cr_assert_eq(f.a.last.id, 101);
    cr_assert_eq(f.a.last.u.lease_many_reply.n, 4);
    uint64_t handles[4];
    for (uint32_t i = 0; i < 4; i++) {
        const struct proto_item *it = &f.a.last.u.lease_many_reply.items[i];
        cr_assert_eq(it->size, sizes[i], "item %u", i);
        cr_assert_geq(it->capacity, sizes[i]);
        cr_assert_geq(f.a.fds[i], 0);
        handles[i] = it->handle;
        for (uint32_t j = 0; j < i; j++)
            cr_assert_neq(memcmp(it->token, f.a.last.u.lease_many_reply.items[j].token, PROTO_TOKEN_LEN), 0);
    }
    cr_assert_eq(f.a.peer.holder.leases, 4);
    cr_assert_eq(f.counters.leases, 5);
    /* each item can be published under its token */
    publish(&f, &f.a, handles[2], 10, 0);
    cr_assert_eq(f.a.last.op, PROTO_OP_PUBLISH + PROTO_OP_REPLY, "%s", f.a.msg);

    /* release_many: an unknown handle is named, the others are released */
    uint64_t rel[3] = { handles[0], 12345, handles[1] };
    release_many(&f, &f.a, 102, rel, 3, PROTO_RELEASE_NOREPLY);
    cr_assert_eq(f.a.code, ENOENT);
    cr_assert_eq(f.a.last.id, 102);
    cr_assert(strstr(f.a.msg, "handle 12345 (item 1 of 3)"), "%s", f.a.msg);
    cr_assert_eq(f.a.peer.holder.leases, 2);
    before = f.a.replies;
    release_many(&f, &f.a, 103, handles + 2, 2, PROTO_RELEASE_NOREPLY);
    cr_assert_eq(f.a.replies, before, "a no-reply release_many replied");
    cr_assert_eq(f.a.peer.holder.leases, 0);
    h0 = lease(&f, &f.a, 100);
    release_many(&f, &f.a, 104, &h0, 1, 0);
    cr_assert_eq(f.a.last.op, PROTO_OP_RELEASE_MANY + PROTO_OP_REPLY);
    cr_assert_eq(f.counters.releases, 6);
    fx_close(&f);
}

/* All or nothing: a batch one of whose items passes the quota (16 MiB) makes no lease. */
Test(broker, lease_many_is_all_or_nothing)
{
    struct fx f;
    fx_open(&f);
    f.opt.max_leases = 32;
    static const uint64_t sizes[] = { MiB, 8 * MiB, 4 * MiB, 8 * MiB, 100 };
    lease_many(&f, &f.a, 111, sizes, 5, 0);
    run_until(&f, &f.a, f.a.replies + 1, 300); /* items still being made finish */
    cr_assert_eq(f.a.code, EDQUOT, "%s", f.a.msg);
    cr_assert_eq(f.a.last.id, 111);
    cr_assert(strstr(f.a.msg, "lease_many item 3 of 5 (8.0 MiB): quota exceeded for uid 1000"), "%s", f.a.msg);
    cr_assert(strstr(f.a.msg, "no lease of the batch was made"), "%s", f.a.msg);
    cr_assert_eq(f.a.peer.holder.leases, 0);
    cr_assert_eq(f.a.peer.pending, 0);
    cr_assert_eq(quota_total(f.bk.quota), 0, "an undone batch kept a charge");
    cr_assert_eq(f.counters.leases, 0);

    /* limits checked before anything: count, size, wait */
    f.opt.max_leases = 4;
    lease_many(&f, &f.a, 112, sizes, 5, 0);
    cr_assert_eq(f.a.code, EMFILE, "%s", f.a.msg);
    static const uint64_t zero[] = { 1, 0 };
    lease_many(&f, &f.a, 113, zero, 2, 0);
    cr_assert_eq(f.a.code, EINVAL);
    cr_assert(strstr(f.a.msg, "item 1 of 2"), "%s", f.a.msg);
    cr_assert_eq(quota_total(f.bk.quota), 0);
    fx_close(&f);
}

/* A waiting lease_many waits as a unit: parked while the quota (16 MiB) cannot take all
 * of it, served whole when it can; FIFO with the tenant's other waiting leases. */
Test(broker, lease_many_waits_as_a_unit, .timeout = 30)
{
    struct fx f;
    fx_open(&f);
    f.opt.max_leases = 32;
    uint64_t h1 = lease(&f, &f.a, 8 * MiB), h2 = lease(&f, &f.a, 4 * MiB);
    static const uint64_t sizes[] = { 4 * MiB, 4 * MiB, 100 };
    unsigned before = f.a.replies;
    lease_many(&f, &f.a, 121, sizes, 3, 5000);
    run_until(&f, &f.a, before + 1, 100);
    cr_assert_eq(f.a.replies, before, "a waiting batch replied: %s", f.a.msg);
    cr_assert_eq(f.a.peer.parked.places, 3);
    cr_assert_eq(f.a.peer.holder.leases, 2, "a waiting batch holds some of its leases");
    cr_assert_eq(quota_held(f.bk.quota, 1000), 12 * MiB, "a waiting batch kept a charge");
    lease_wait(&f, &f.a, 4 * KiB, 122, 5000); /* behind the batch */
    cr_assert_eq(f.counters.lease_waits, 2);
    release(&f, &f.a, h2, PROTO_RELEASE_NOREPLY);  /* 8 MiB held: 4 + 4 + 4 KiB does not fit */
    run_until(&f, &f.a, before + 1, 100);
    cr_assert_eq(f.a.replies, before, "a batch past the quota was served");
    release(&f, &f.a, h1, PROTO_RELEASE_NOREPLY);
    cr_assert_eq(run_until(&f, &f.a, before + 2, 3000), before + 2, "the batch and the lease behind it");
    cr_assert_eq(f.a.peer.parked.places, 0);
    cr_assert_eq(f.a.peer.holder.leases, 4);
    cr_assert_eq(f.a.last.id, 122, "the lease behind the batch came first");
    cr_assert_eq(f.counters.refused_quota, 0);
    registry_release_all(f.bk.reg, &f.a.peer.holder);
    broker_check(&f.bk);

    /* a waiting batch that times out: ETIMEDOUT with the numbers, nothing charged */
    h1 = lease(&f, &f.a, 16 * MiB);
    before = f.a.replies;
    lease_many(&f, &f.a, 123, sizes, 2, 40);
    cr_assert_eq(run_until(&f, &f.a, before + 1, 3000), before + 1);
    cr_assert_eq(f.a.code, ETIMEDOUT, "%s", f.a.msg);
    cr_assert(strstr(f.a.msg, "lease_many of 2 leases of 8.0 MiB (8388608 bytes) waited "), "%s", f.a.msg);
    cr_assert_eq(f.a.peer.parked.places, 0);
    cr_assert_eq(quota_held(f.bk.quota, 1000), 16 * MiB);
    /* and one whose connection goes is dropped */
    lease_many(&f, &f.a, 124, sizes, 2, 5000);
    cr_assert_eq(f.a.peer.parked.places, 2);
    broker_disconnect(&f.bk, &f.a.peer);
    cr_assert_eq(f.bk.waiters.n, 0);
    fx_close(&f);
}
