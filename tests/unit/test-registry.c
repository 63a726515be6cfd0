/* SPDX-License-Identifier: MIT */
/* test-registry.c: live buffers, tokens and holders (daemon/registry.c) over a real pool
 * under /dev/shm, a real quota ledger and a real libuv loop for retention timers. The last
 * reference must credit the producer and return the buffer warm to the pool, exactly once. */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "handoff.h"
#include "pool-callback.h"
#include "pool.h"
#include "quota.h"
#include "registry.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

struct fx {
    uv_loop_t loop;
    char dir[64];
    struct pool *pool;
    struct quota *quota;
    struct registry *reg;
};

static void fx_open(struct fx *f)
{
    const char *why = NULL;
    memset(f, 0, sizeof(*f));
    cr_assert_eq(uv_loop_init(&f->loop), 0);
    strcpy(f->dir, "/dev/shm/shmref-test-registry-XXXXXX");
    cr_assert_not_null(mkdtemp(f->dir), "mkdtemp: %s", strerror(errno));
    int r = pool_new(&f->loop, f->dir, 256 * MiB, false, &f->pool, &why);
    cr_assert_eq(r, 0, "pool_new: %d %s", r, why ? why : "");
    cr_assert_eq(quota_new(64 * MiB, &f->quota), 0);
    cr_assert_eq(registry_new(&f->loop, f->pool, f->quota, &f->reg), 0);
}

/* Frees everything in shutdown order, lets the loop close the retention timers, and
 * checks that no handle leaked and no file was left in the pool directory. */
static void fx_close(struct fx *f)
{
    registry_free(f->reg);
    f->reg = NULL;
    uv_run(&f->loop, UV_RUN_DEFAULT);
    quota_free(f->quota);
    pool_free(f->pool);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&f->loop), 0, "a handle leaked (retention timer?)");
    cr_assert_eq(rmdir(f->dir), 0, "pool directory: %s", strerror(errno));
}


/* What the broker does for a lease: a pool buffer (warm, or created off the loop),
 * a quota charge for its class size, then a registry buffer. */
static struct registry_buf *make_buf(struct fx *f, uint64_t size, uint32_t uid)
{
    struct got g = { 0 };
    struct pool_buf *pb = NULL;
    char why[256];
    int r = pool_get(f->pool, size, uid, &pb, got_cb, &g);
    cr_assert(r == 0 || r == 1, "pool_get: %d", r);
    if (r == 1) {
        /* ONCE, not DEFAULT: a pending retention timer must not keep us waiting */
        while (g.calls == 0)
            uv_run(&f->loop, UV_RUN_ONCE);
        cr_assert_eq(g.err, 0);
        pb = g.buf;
    }
    cr_assert_not_null(pb);
    cr_assert_eq(quota_charge(f->quota, uid, pb->size, why, sizeof(why)), 0, "%s", why);
    struct registry_buf *b = registry_buf_new(f->reg, pb, uid, size);
    cr_assert_not_null(b);
    cr_assert_eq(b->pb, pb);
    cr_assert_eq(b->refs, 0);
    cr_assert_eq(b->tenant, uid);
    cr_assert_eq(b->size, size);
    cr_assert_not(b->published);
    return b;
}

/* A producer's lease: a new buffer held writable by h. */
static struct registry_buf *lease(struct fx *f, struct registry_holder *h, uint64_t size,
                                  uint32_t uid, uint64_t *ret_handle)
{
    struct registry_buf *b = make_buf(f, size, uid);
    cr_assert_eq(registry_hold(f->reg, h, b, true, ret_handle), 0);
    return b;
}

static void stop_cb(uv_timer_t *t)
{
    uv_stop(t->loop);
    uv_close((uv_handle_t *)t, NULL);
}

/* Runs the loop for about ms milliseconds of loop time. */
static void run_for(uv_loop_t *loop, uint64_t ms)
{
    uv_timer_t t;
    uint64_t start = uv_now(loop);
    cr_assert_eq(uv_timer_init(loop, &t), 0);
    cr_assert_eq(uv_timer_start(&t, stop_cb, ms, 0), 0);
    uv_run(loop, UV_RUN_DEFAULT);
    cr_assert_geq(uv_now(loop) - start, ms);
}

static uint64_t tenant_bytes(const struct quota *q, uint32_t uid, bool *ret_listed)
{
    struct quota_tenant t[32];
    unsigned n = quota_tenants(q, t, 32);
    *ret_listed = false;
    for (unsigned i = 0; i < n; i++)
        if (t[i].uid == uid) {
            *ret_listed = true;
            return t[i].bytes;
        }
    return 0;
}

Test(registry, hold_gives_distinct_handles)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t hs[20];
    fx_open(&f);
    struct registry_buf *b = lease(&f, &h, MiB, 1000, &hs[0]);
    cr_assert_neq(hs[0], 0);
    /* more handles on the same buffer than the first slot table holds (8) */
    for (int i = 1; i < 20; i++)
        cr_assert_eq(registry_hold(f.reg, &h, b, false, &hs[i]), 0);
    for (int i = 0; i < 20; i++) {
        cr_assert_neq(hs[i], 0);
        for (int j = 0; j < i; j++)
            cr_assert_neq(hs[i], hs[j], "handles %d and %d equal", i, j);
        struct registry_lease *l = registry_lease_of(&h, hs[i]);
        cr_assert_not_null(l, "handle %d not found", i);
        cr_assert_eq(l->buf, b);
        cr_assert_eq(l->writable, i == 0);
    }
    cr_assert_eq(b->refs, 20);
    cr_assert_eq(h.leases, 20);
    cr_assert_eq(h.bytes, 20 * MiB);
    cr_assert_null(registry_lease_of(&h, 0));
    cr_assert_null(registry_lease_of(&h, UINT64_C(1) << 32 | 100000), "index beyond the table");
    cr_assert_null(registry_lease_of(&h, hs[3] + (UINT64_C(1) << 32)), "wrong generation");
    struct registry_stats st = registry_stats(f.reg);
    cr_assert_eq(st.buffers, 1);
    cr_assert_eq(st.bytes, MiB);

    cr_assert_eq(registry_release_all(f.reg, &h), 20);
    cr_assert_eq(pool_bytes_warm(f.pool), MiB);
    fx_close(&f);
}

Test(registry, released_handle_not_found_after_slot_reuse)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t keep, h1, h2;
    fx_open(&f);
    struct registry_buf *b = lease(&f, &h, 64 * KiB, 1000, &keep);
    cr_assert_eq(registry_hold(f.reg, &h, b, false, &h1), 0);
    cr_assert_eq(registry_release(f.reg, &h, h1), 0);
    cr_assert_null(registry_lease_of(&h, h1));
    cr_assert_eq(registry_release(f.reg, &h, h1), -ENOENT, "double release");
    cr_assert_eq(b->refs, 1);
    cr_assert_eq(h.leases, 1);

    /* the freed slot is reused, under a new generation */
    cr_assert_eq(registry_hold(f.reg, &h, b, false, &h2), 0);
    cr_assert_eq((uint32_t)h2, (uint32_t)h1, "slot not reused (test premise)");
    cr_assert_neq(h2, h1);
    cr_assert_null(registry_lease_of(&h, h1), "stale handle names the new lease");
    cr_assert_eq(registry_release(f.reg, &h, h1), -ENOENT);
    cr_assert_not_null(registry_lease_of(&h, h2));
    cr_assert_eq(b->refs, 2);
    cr_assert_eq(pool_bytes_warm(f.pool), 0);

    cr_assert_eq(registry_release(f.reg, &h, h2), 0);
    cr_assert_eq(registry_release(f.reg, &h, keep), 0);
    cr_assert_eq(h.leases, 0);
    cr_assert_eq(h.bytes, 0);
    cr_assert_eq(pool_bytes_warm(f.pool), 64 * KiB);
    cr_assert_eq(registry_release_all(f.reg, &h), 0);
    fx_close(&f);
}

Test(registry, last_release_credits_quota_and_recycles)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t ha, hb;
    bool listed;
    fx_open(&f);
    cr_assert_eq(quota_set(f.quota, 1000, 32 * MiB), 0); /* keeps its ledger entry */
    struct registry_buf *a = lease(&f, &h, 1000000, 1000, &ha);
    struct pool_buf *pa = a->pb;
    uint64_t asize = pa->size;
    cr_assert_eq(asize, pool_class_size(f.pool, 1000000));
    struct registry_buf *b = lease(&f, &h, MiB, 1001, &hb);
    cr_assert_neq(b->pb, pa);
    cr_assert_eq(tenant_bytes(f.quota, 1000, &listed), asize);
    cr_assert_eq(tenant_bytes(f.quota, 1001, &listed), MiB);
    struct registry_stats st = registry_stats(f.reg);
    cr_assert_eq(st.buffers, 2);
    cr_assert_eq(st.bytes, asize + MiB);
    cr_assert_eq(pool_bytes_warm(f.pool), 0);

    cr_assert_eq(registry_release(f.reg, &h, ha), 0);
    cr_assert_eq(tenant_bytes(f.quota, 1000, &listed), 0);
    cr_assert(listed);
    cr_assert_eq(pool_bytes_warm(f.pool), asize);
    cr_assert(pa->is_free);
    st = registry_stats(f.reg);
    cr_assert_eq(st.buffers, 1);
    cr_assert_eq(st.bytes, MiB);

    cr_assert_eq(registry_release(f.reg, &h, hb), 0);
    tenant_bytes(f.quota, 1001, &listed);
    cr_assert_not(listed, "uid 1001 still charged");
    cr_assert_eq(quota_count(f.quota), 1);
    cr_assert_eq(pool_bytes_warm(f.pool), asize + MiB);
    st = registry_stats(f.reg);
    cr_assert_eq(st.buffers, 0);
    cr_assert_eq(st.bytes, 0);

    /* the next lease of that class by that tenant gets the same warm buffer */
    struct registry_buf *again = lease(&f, &h, 1000000, 1000, &ha);
    cr_assert_eq(again->pb, pa);
    cr_assert_eq(pa->gen, 2);
    cr_assert_eq(registry_release_all(f.reg, &h), 1);
    fx_close(&f);
}

Test(registry, publish_and_find)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t ha, hb;
    uint8_t token[PROTO_TOKEN_LEN], zero[PROTO_TOKEN_LEN] = { 0 }, other[PROTO_TOKEN_LEN];
    static const uint8_t meta[] = { 'f', '8', 0, 3, 0xff };
    fx_open(&f);
    struct registry_buf *a = lease(&f, &h, MiB, 1000, &ha);
    struct registry_buf *b = lease(&f, &h, MiB, 1000, &hb);
    cr_assert_eq(registry_stats(f.reg).published, 0);

    cr_assert_eq(registry_publish(f.reg, a, 1000, 0, meta, sizeof(meta)), 0);
    memcpy(token, a->token, sizeof(token));
    cr_assert_neq(memcmp(token, zero, sizeof(token)), 0, "token is all zero");
    cr_assert(a->published);
    cr_assert_not(a->retained);
    cr_assert_eq(a->size, 1000, "published size");
    cr_assert_eq(a->refs, 1, "publish without keep_ms adds no reference");
    cr_assert_eq(a->meta_len, sizeof(meta));
    cr_assert_not_null(a->meta);
    cr_assert_neq((const uint8_t *)a->meta, meta, "meta not copied");
    cr_assert_eq(memcmp(a->meta, meta, sizeof(meta)), 0);
    cr_assert_eq(registry_find(f.reg, token), a);
    cr_assert_eq(registry_stats(f.reg).published, 1);

    cr_assert_eq(registry_publish(f.reg, a, 2000, 0, NULL, 0), -EALREADY);
    cr_assert_eq(memcmp(a->token, token, sizeof(token)), 0, "token changed");
    cr_assert_eq(a->size, 1000);
    cr_assert_eq(registry_stats(f.reg).published, 1);

    memcpy(other, token, sizeof(other));
    other[PROTO_TOKEN_LEN - 1] ^= 1; /* same bucket, different token */
    cr_assert_null(registry_find(f.reg, other));
    other[0] ^= 0x80;
    cr_assert_null(registry_find(f.reg, other));
    cr_assert_null(registry_find(f.reg, zero));

    cr_assert_eq(registry_publish(f.reg, b, MiB, 0, NULL, 0), 0);
    cr_assert_neq(memcmp(a->token, b->token, PROTO_TOKEN_LEN), 0);
    cr_assert_null(b->meta);
    cr_assert_eq(registry_find(f.reg, b->token), b);
    cr_assert_eq(registry_stats(f.reg).published, 2);

    /* released (no retention): gone at once, token and all */
    cr_assert_eq(registry_release(f.reg, &h, ha), 0);
    cr_assert_null(registry_find(f.reg, token));
    cr_assert_eq(registry_stats(f.reg).published, 1);
    cr_assert_eq(pool_bytes_warm(f.pool), MiB);
    cr_assert_eq(registry_release_all(f.reg, &h), 1);
    cr_assert_eq(registry_stats(f.reg).published, 0);
    fx_close(&f);
}

/* Version 2: a buffer has its token from its lease on (the lease reply carries it), keeps
 * it at publish, is findable as "writing" until then and as published after; its token
 * dies with it, and the recycled buffer gets a new one at its next lease. */
Test(registry, token_given_at_lease_kept_at_publish)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t ha, hb;
    uint8_t token[PROTO_TOKEN_LEN], zero[PROTO_TOKEN_LEN] = { 0 };
    fx_open(&f);
    struct registry_buf *a = lease(&f, &h, MiB, 1000, &ha);
    memcpy(token, a->token, sizeof(token));
    cr_assert_neq(memcmp(token, zero, sizeof(token)), 0, "no token at lease");
    cr_assert_null(registry_find(f.reg, token), "an unpublished buffer is found as published");
    cr_assert_eq(registry_find_writing(f.reg, token), a);
    struct registry_buf *b = lease(&f, &h, MiB, 1000, &hb);
    cr_assert_neq(memcmp(a->token, b->token, PROTO_TOKEN_LEN), 0, "two leases, one token");
    const struct registry_buf *list[4];
    cr_assert_eq(registry_published(f.reg, list, 4), 0, "status lists a writing buffer");

    cr_assert_eq(registry_publish(f.reg, a, 10, 0, NULL, 0), 0);
    cr_assert_eq(memcmp(a->token, token, sizeof(token)), 0, "publish changed the token");
    cr_assert_eq(registry_find(f.reg, token), a);
    cr_assert_null(registry_find_writing(f.reg, token));
    cr_assert_eq(registry_published(f.reg, list, 4), 1);
    cr_assert_eq(list[0], a);

    /* released unpublished: its token is gone too */
    memcpy(token, b->token, sizeof(token));
    uint64_t id = b->pb->id;
    cr_assert_eq(registry_release(f.reg, &h, hb), 0);
    cr_assert_null(registry_find_writing(f.reg, token));
    /* the same (recycled) buffer, leased again, under a new token */
    struct registry_buf *c = lease(&f, &h, MiB, 1000, &hb);
    cr_assert_eq(c->pb->id, id, "not recycled");
    cr_assert_neq(memcmp(c->token, token, PROTO_TOKEN_LEN), 0, "a recycled buffer kept its old token");
    cr_assert_null(registry_find_writing(f.reg, token));
    cr_assert_eq(registry_find_writing(f.reg, c->token), c);
    cr_assert_eq(registry_release_all(f.reg, &h), 2);
    fx_close(&f);
}

/* More leases than the token stock (64) and the table's first size: all distinct, all found. */
Test(registry, many_leased_tokens_distinct_and_found)
{
    enum { N = 300 };
    struct fx f;
    struct registry_holder h = { 0 };
    static struct registry_buf *bufs[N];
    uint64_t handle;
    fx_open(&f);
    for (int i = 0; i < N; i++)
        bufs[i] = lease(&f, &h, 4 * KiB, 1000, &handle);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(registry_find_writing(f.reg, bufs[i]->token), bufs[i], "token %d lost", i);
        for (int j = 0; j < i; j++)
            cr_assert_neq(memcmp(bufs[i]->token, bufs[j]->token, PROTO_TOKEN_LEN), 0, "tokens %d and %d", i, j);
    }
    cr_assert_eq(registry_release_all(f.reg, &h), N);
    fx_close(&f);
}

/* Enough publications to make the token table grow (64 buckets at first). */
Test(registry, many_published_tokens_all_found)
{
    enum { N = 200 };
    struct fx f;
    struct registry_holder h = { 0 };
    static uint8_t tokens[N][PROTO_TOKEN_LEN];
    static struct registry_buf *bufs[N];
    uint64_t hd;
    fx_open(&f);
    for (int i = 0; i < N; i++) {
        bufs[i] = lease(&f, &h, 4096, 1000, &hd);
        cr_assert_eq(registry_publish(f.reg, bufs[i], 100 + (uint64_t)i, 0, NULL, 0), 0);
        memcpy(tokens[i], bufs[i]->token, PROTO_TOKEN_LEN);
    }
    cr_assert_eq(registry_stats(f.reg).published, N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(registry_find(f.reg, tokens[i]), bufs[i], "token %d lost", i);
        cr_assert_eq(bufs[i]->size, 100 + (uint64_t)i);
    }
    cr_assert_eq(h.leases, N);
    cr_assert_eq(registry_release_all(f.reg, &h), N);
    for (int i = 0; i < N; i++)
        cr_assert_null(registry_find(f.reg, tokens[i]));
    cr_assert_eq(registry_stats(f.reg).published, 0);
    cr_assert_eq(pool_bytes_warm(f.pool), N * 4096);
    fx_close(&f);
}

Test(registry, three_holders_release_in_any_order)
{
    struct fx f;
    struct registry_holder h[3] = { { 0 } };
    uint64_t hd[3];
    uint8_t token[PROTO_TOKEN_LEN];
    bool listed;
    fx_open(&f);
    struct registry_buf *b = lease(&f, &h[0], 2 * MiB, 1000, &hd[0]);
    cr_assert_eq(registry_publish(f.reg, b, 2 * MiB, 0, NULL, 0), 0);
    memcpy(token, b->token, sizeof(token));
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(registry_find(f.reg, token), b);
        cr_assert_eq(registry_hold(f.reg, &h[i], b, false, &hd[i]), 0);
        cr_assert_eq(h[i].bytes, 2 * MiB);
    }
    cr_assert_eq(b->refs, 3);

    int order[3] = { 1, 0, 2 };
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(pool_bytes_warm(f.pool), 0, "returned before the last release");
        cr_assert_eq(tenant_bytes(f.quota, 1000, &listed), 2 * MiB);
        cr_assert_eq(registry_release(f.reg, &h[order[k]], hd[order[k]]), 0);
        if (k < 2) {
            cr_assert_eq(registry_find(f.reg, token), b);
            cr_assert_eq(b->refs, (uint32_t)(2 - k));
        }
    }
    cr_assert_eq(pool_bytes_warm(f.pool), 2 * MiB);
    cr_assert_null(registry_find(f.reg, token));
    tenant_bytes(f.quota, 1000, &listed);
    cr_assert_not(listed);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(registry_release_all(f.reg, &h[i]), 0);
    fx_close(&f);
}

Test(registry, retention_keeps_buffer_until_expiry)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t hd;
    uint8_t token[PROTO_TOKEN_LEN];
    bool listed;
    fx_open(&f);
    struct registry_buf *b = lease(&f, &h, MiB, 1000, &hd);
    cr_assert_eq(registry_publish(f.reg, b, MiB, 50, NULL, 0), 0);
    memcpy(token, b->token, sizeof(token));
    cr_assert(b->retained);
    cr_assert_eq(b->refs, 2);
    cr_assert_eq(b->deadline, uv_now(&f.loop) + 50);

    /* the producer goes: the retention alone keeps it */
    cr_assert_eq(registry_release(f.reg, &h, hd), 0);
    struct registry_stats st = registry_stats(f.reg);
    cr_assert_eq(st.retained, 1);
    cr_assert_eq(st.retained_bytes, MiB);
    cr_assert_eq(st.buffers, 1);
    cr_assert_eq(st.expired, 0);
    cr_assert_eq(registry_find(f.reg, token), b);
    cr_assert_eq(b->refs, 1);
    cr_assert_eq(pool_bytes_warm(f.pool), 0);
    cr_assert_eq(tenant_bytes(f.quota, 1000, &listed), MiB, "a retained buffer stays charged");

    run_for(&f.loop, 120);
    cr_assert_null(registry_find(f.reg, token));
    st = registry_stats(f.reg);
    cr_assert_eq(st.expired, 1);
    cr_assert_eq(st.retained, 0);
    cr_assert_eq(st.retained_bytes, 0);
    cr_assert_eq(st.published, 0);
    cr_assert_eq(st.buffers, 0);
    cr_assert_eq(pool_bytes_warm(f.pool), MiB);
    tenant_bytes(f.quota, 1000, &listed);
    cr_assert_not(listed);
    cr_assert_eq(registry_release_all(f.reg, &h), 0);
    fx_close(&f);
}

Test(registry, end_retention_at_acquire_keeps_buffer_while_held)
{
    struct fx f;
    struct registry_holder prod = { 0 }, cons = { 0 };
    uint64_t hp, hc;
    uint8_t token[PROTO_TOKEN_LEN];
    fx_open(&f);
    struct registry_buf *b = lease(&f, &prod, MiB, 1000, &hp);
    cr_assert_eq(registry_publish(f.reg, b, MiB, 50, NULL, 0), 0);
    memcpy(token, b->token, sizeof(token));
    cr_assert_eq(registry_release(f.reg, &prod, hp), 0);

    /* first acquire: hold, then end the retention */
    cr_assert_eq(registry_find(f.reg, token), b);
    cr_assert_eq(registry_hold(f.reg, &cons, b, false, &hc), 0);
    registry_end_retention(f.reg, b);
    cr_assert_not(b->retained);
    cr_assert_eq(b->refs, 1);
    cr_assert_eq(registry_stats(f.reg).retained, 0);
    cr_assert_eq(registry_stats(f.reg).retained_bytes, 0);
    registry_end_retention(f.reg, b); /* a second time: nothing */
    cr_assert_eq(b->refs, 1);

    run_for(&f.loop, 120); /* past the old deadline; the stopped timer closes */
    cr_assert_eq(registry_find(f.reg, token), b, "a held buffer expired");
    cr_assert_eq(registry_stats(f.reg).expired, 0);
    cr_assert_eq(pool_bytes_warm(f.pool), 0);

    cr_assert_eq(registry_release(f.reg, &cons, hc), 0);
    cr_assert_null(registry_find(f.reg, token));
    cr_assert_eq(pool_bytes_warm(f.pool), MiB);
    cr_assert_eq(registry_stats(f.reg).buffers, 0);
    cr_assert_eq(registry_release_all(f.reg, &prod), 0);
    cr_assert_eq(registry_release_all(f.reg, &cons), 0);
    fx_close(&f);
}

/* Fan-out: acquires leave the retention in place for the next consumer; max_acquires
 * ends it at that many. */
Test(registry, acquired_keeps_retention_until_max_acquires)
{
    struct fx f;
    struct registry_holder prod = { 0 }, cons = { 0 };
    uint64_t hp, hc;
    fx_open(&f);
    struct registry_buf *b = lease(&f, &prod, MiB, 1000, &hp);
    b->max_acquires = 3;
    cr_assert_eq(registry_publish(f.reg, b, MiB, 60 * 1000, NULL, 0), 0);
    cr_assert_eq(registry_release(f.reg, &prod, hp), 0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(registry_hold(f.reg, &cons, b, false, &hc), 0);
        registry_acquired(f.reg, b);
        cr_assert(b->retained, "acquire %d ended the retention", i + 1);
        cr_assert_eq(registry_release(f.reg, &cons, hc), 0);
        cr_assert_eq(registry_stats(f.reg).buffers, 1, "the retention keeps it for the next consumer");
    }
    cr_assert_eq(registry_hold(f.reg, &cons, b, false, &hc), 0);
    registry_acquired(f.reg, b);
    cr_assert_not(b->retained, "the third acquire of max_acquires 3 ends the retention");
    cr_assert_eq(b->acquires, 3);
    cr_assert_eq(registry_release(f.reg, &cons, hc), 0);
    cr_assert_eq(registry_stats(f.reg).buffers, 0);
    cr_assert_eq(pool_bytes_warm(f.pool), MiB);
    registry_release_all(f.reg, &prod);
    registry_release_all(f.reg, &cons);
    fx_close(&f);
}

/* registry.h: "A retention that has run out counts as gone even if its timer has not
 * fired yet." Loop time moves past the deadline without running timers. */
Test(registry, find_treats_run_out_retention_as_gone)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t hd;
    uint8_t token[PROTO_TOKEN_LEN];
    fx_open(&f);
    struct registry_buf *b = lease(&f, &h, MiB, 1000, &hd);
    cr_assert_eq(registry_publish(f.reg, b, MiB, 50, NULL, 0), 0);
    memcpy(token, b->token, sizeof(token));
    cr_assert_eq(registry_release(f.reg, &h, hd), 0);

    usleep(80 * 1000);
    uv_update_time(&f.loop);
    cr_assert_null(registry_find(f.reg, token));
    struct registry_stats st = registry_stats(f.reg);
    cr_assert_eq(st.expired, 1);
    cr_assert_eq(st.retained, 0);
    cr_assert_eq(st.buffers, 0);
    cr_assert_eq(pool_bytes_warm(f.pool), MiB);
    cr_assert_eq(quota_count(f.quota), 0);

    run_for(&f.loop, 100); /* the timer was stopped: it must not count again */
    cr_assert_eq(registry_stats(f.reg).expired, 1);
    cr_assert_eq(registry_release_all(f.reg, &h), 0);
    fx_close(&f);
}

Test(registry, release_all_frees_every_handle)
{
    struct fx f;
    struct registry_holder h = { 0 }, other = { 0 };
    uint64_t hd, ho;
    fx_open(&f);
    struct registry_buf *b1 = lease(&f, &h, MiB, 1000, &hd);
    struct registry_buf *b2 = lease(&f, &h, 2 * MiB, 1000, &hd);
    struct registry_buf *b3 = lease(&f, &h, 4 * MiB, 1000, &hd);
    cr_assert_eq(registry_hold(f.reg, &h, b1, false, &hd), 0);
    cr_assert_eq(registry_hold(f.reg, &h, b2, false, &hd), 0);
    cr_assert_eq(registry_hold(f.reg, &other, b3, false, &ho), 0);
    cr_assert_eq(h.leases, 5);
    cr_assert_eq(h.bytes, 2 * MiB + 4 * MiB + 4 * MiB);

    cr_assert_eq(registry_release_all(f.reg, &h), 5);
    cr_assert_null(h.slots);
    cr_assert_eq(h.nslots, 0);
    cr_assert_eq(h.leases, 0);
    cr_assert_eq(h.bytes, 0);
    cr_assert_null(registry_lease_of(&h, hd));
    cr_assert_eq(pool_bytes_warm(f.pool), 3 * MiB, "b1 and b2 back, b3 still held");
    cr_assert_eq(b3->refs, 1);
    cr_assert_eq(registry_stats(f.reg).buffers, 1);
    cr_assert_eq(registry_release_all(f.reg, &h), 0);

    /* the holder is usable again after release_all */
    cr_assert_eq(registry_hold(f.reg, &h, b3, false, &hd), 0);
    cr_assert_neq(hd, 0);
    cr_assert_eq(registry_lease_of(&h, hd)->buf, b3);
    cr_assert_eq(registry_release_all(f.reg, &h), 1);
    cr_assert_eq(registry_release_all(f.reg, &other), 1);
    cr_assert_eq(pool_bytes_warm(f.pool), 7 * MiB);
    cr_assert_eq(registry_stats(f.reg).buffers, 0);
    fx_close(&f);
}

Test(registry, end_retentions_then_free_leaves_nothing)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t hd;
    fx_open(&f);
    for (int i = 0; i < 3; i++) {
        struct registry_buf *b = lease(&f, &h, MiB, 1000 + (uint32_t)i, &hd);
        cr_assert_eq(registry_publish(f.reg, b, MiB, 60 * 1000, NULL, 0), 0);
    }
    cr_assert_eq(registry_release_all(f.reg, &h), 3);
    struct registry_stats st = registry_stats(f.reg);
    cr_assert_eq(st.retained, 3);
    cr_assert_eq(st.buffers, 3);
    cr_assert_eq(quota_count(f.quota), 3);

    registry_end_retentions(f.reg);
    st = registry_stats(f.reg);
    cr_assert_eq(st.retained, 0);
    cr_assert_eq(st.retained_bytes, 0);
    cr_assert_eq(st.buffers, 0);
    cr_assert_eq(st.bytes, 0);
    cr_assert_eq(st.published, 0);
    cr_assert_eq(st.expired, 0);
    cr_assert_eq(quota_count(f.quota), 0);
    cr_assert_eq(pool_bytes_warm(f.pool), 3 * MiB);
    fx_close(&f); /* registry_free, then the loop closes the three timers */
}

Test(registry, free_ends_retentions_itself)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t hd;
    fx_open(&f);
    struct registry_buf *b = lease(&f, &h, MiB, 1000, &hd);
    cr_assert_eq(registry_publish(f.reg, b, MiB, 60 * 1000, NULL, 0), 0);
    cr_assert_eq(registry_release(f.reg, &h, hd), 0);
    cr_assert_eq(registry_stats(f.reg).retained, 1);
    cr_assert_eq(registry_release_all(f.reg, &h), 0);
    registry_free(f.reg);
    f.reg = NULL;
    cr_assert_eq(pool_bytes_warm(f.pool), MiB);
    cr_assert_eq(quota_count(f.quota), 0);
    fx_close(&f);
}

Test(registry, buf_drop_undoes_buf_new)
{
    struct fx f;
    fx_open(&f);
    struct registry_buf *b = make_buf(&f, MiB, 1000);
    cr_assert_eq(registry_stats(f.reg).buffers, 1);
    cr_assert_eq(quota_count(f.quota), 1);
    registry_buf_drop(f.reg, b);
    cr_assert_eq(registry_stats(f.reg).buffers, 0);
    cr_assert_eq(registry_stats(f.reg).bytes, 0);
    cr_assert_eq(quota_count(f.quota), 0);
    cr_assert_eq(pool_bytes_warm(f.pool), MiB);
    fx_close(&f);
}

/* The tables (daemon/tenantdir.c is the lender): a token names its buffer's pool slot; a
 * buffer the lender keeps at its last reference stays charged and out of the pool, and no
 * token finds it (its token is forgotten), until registry_lent_end. */
static unsigned lend_calls;
static bool lend_answer;
static bool lend_cb(void *arg, struct registry_buf *b)
{
    (void)arg;
    (void)b;
    lend_calls++;
    return lend_answer;
}

Test(registry, lender_keeps_a_buffer_lent)
{
    struct fx f;
    struct registry_holder h = { 0 };
    uint64_t handle;
    fx_open(&f);
    struct registry_lender l = { .lend = lend_cb };
    registry_set_lender(f.reg, &l);
    struct registry_buf *b = lease(&f, &h, 64 * KiB, 1000, &handle);
    cr_assert_eq(handoff_slot_of(b->token), b->pb->slot, "the token names the slot");
    uint8_t token[PROTO_TOKEN_LEN];
    memcpy(token, b->token, sizeof(token));
    cr_assert_eq(registry_publish(f.reg, b, 100, 0, NULL, 0), 0);
    lend_answer = true;
    cr_assert_eq(registry_release(f.reg, &h, handle), 0);
    cr_assert_eq(lend_calls, 1);
    cr_assert(b->lent);
    struct registry_stats st = registry_stats(f.reg);
    cr_assert_eq(st.lent, 1);
    cr_assert_eq(st.buffers, 1, "a LENT buffer is still live");
    cr_assert_eq(st.published, 0);
    cr_assert_null(registry_find(f.reg, token), "a LENT buffer is findable");
    cr_assert_eq(pool_bytes_warm(f.pool), 0, "a LENT buffer went back to the pool");
    cr_assert_eq(quota_total(f.quota), 64 * KiB, "a LENT buffer's charge went back");
    registry_lent_end(f.reg, b);
    st = registry_stats(f.reg);
    cr_assert_eq(st.lent, 0);
    cr_assert_eq(st.buffers, 0);
    cr_assert_eq(pool_bytes_warm(f.pool), 64 * KiB);
    cr_assert_eq(quota_total(f.quota), 0);

    /* the lender says no: it ends at once, as without one */
    lend_answer = false;
    b = lease(&f, &h, 64 * KiB, 1000, &handle);
    cr_assert_eq(registry_release(f.reg, &h, handle), 0);
    cr_assert_eq(lend_calls, 2);
    cr_assert_eq(registry_stats(f.reg).buffers, 0);
    registry_set_lender(f.reg, NULL);
    registry_release_all(f.reg, &h);
    fx_close(&f);
}
