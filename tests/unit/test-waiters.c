/* SPDX-License-Identifier: MIT */
/* test-waiters.c: parked requests (daemon/waiters.c) on a real libuv loop: per-tenant and
 * per-slot FIFO queues, the deadline heap firing in deadline order whatever the arrival
 * order, removal from the middle, kicks that run once on the next turn (never from inside
 * the retry), and a loop that closes cleanly. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "waiters.h"

struct fx {
    uv_loop_t loop;
    struct waiters ws;
    unsigned expired, retries;
    uint32_t order[512];         /* ids in the order they expired */
    int owner;
    struct waiters_mine mine;    /* the owner's list */
};

static void on_expire(void *arg, struct waiter *w)
{
    struct fx *f = arg;
    cr_assert_leq(w->deadline_ms, uv_now(&f->loop), "expired early");
    f->order[f->expired++] = w->id;
    waiters_remove(&f->ws, w);
}

static void on_retry(void *arg)
{
    struct fx *f = arg;
    f->retries++;
    waiters_kick(&f->ws); /* dropped: a kick from inside the retry */
}

static void fx_open(struct fx *f)
{
    memset(f, 0, sizeof(*f));
    cr_assert_eq(uv_loop_init(&f->loop), 0);
    waiters_init(&f->ws, &f->loop, on_expire, on_retry, f);
}

static void fx_close(struct fx *f)
{
    waiters_close(&f->ws);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&f->loop), 0, "a handle leaked");
}

Test(waiters, deadlines_fire_in_deadline_order)
{
    struct fx f;
    fx_open(&f);
    uint32_t s = 12345;
    enum { N = 300 };
    static uint32_t waits[N];
    for (uint32_t i = 0; i < N; i++) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        waits[i] = 1 + s % 60;
        struct waiter *w = i % 2 ? waiters_park_lease(&f.ws, &f.owner, &f.mine, i, i % 5, 100, 0, waits[i])
                                 : NULL;
        if (!w) {
            static struct waiters_queue *slots[7];
            w = waiters_park_acquire(&f.ws, &f.owner, &f.mine, i, &slots[i % 7], waits[i]);
        }
        cr_assert_not_null(w);
    }
    cr_assert_eq(f.ws.n, N);
    uv_run(&f.loop, UV_RUN_DEFAULT); /* until every deadline fired */
    cr_assert_eq(f.expired, N);
    for (uint32_t i = 1; i < N; i++)
        cr_assert_leq(waits[f.order[i - 1]], waits[f.order[i]], "expired out of deadline order at %u", i);
    cr_assert_eq(f.ws.n, 0);
    cr_assert_null(f.ws.tenants_head);
    fx_close(&f);
}

Test(waiters, queues_are_fifo_and_removal_keeps_them)
{
    struct fx f;
    fx_open(&f);
    struct waiters_queue *slot = NULL;
    struct waiter *a = waiters_park_lease(&f.ws, &f.owner, &f.mine, 1, 1000, 10, 0, 5000);
    struct waiter *b = waiters_park_lease(&f.ws, &f.owner, &f.mine, 2, 1001, 10, 0, 5000);
    struct waiter *c = waiters_park_lease(&f.ws, &f.owner, &f.mine, 3, 1000, 10, 0, 100);
    struct waiter *x = waiters_park_acquire(&f.ws, &f.owner, &f.mine, 4, &slot, 5000);
    struct waiter *y = waiters_park_acquire(&f.ws, &f.owner, &f.mine, 5, &slot, 50);
    cr_assert(a && b && c && x && y);
    struct waiters_queue *q = waiters_tenant(&f.ws, 1000);
    cr_assert_not_null(q);
    cr_assert_eq(q->head, a);
    cr_assert_eq(q->tail, c);
    cr_assert_eq(waiters_tenant(&f.ws, 1001)->head, b);
    cr_assert_null(waiters_tenant(&f.ws, 1002));
    cr_assert_eq(f.ws.tenants_head, q, "tenants in the order they came");
    waiters_tenant_last(&f.ws, q);
    cr_assert_eq(f.ws.tenants_tail, q);
    cr_assert_eq(slot->head, x);
    cr_assert_eq(f.ws.leases, 3);
    waiters_remove(&f.ws, a);
    cr_assert_eq(q->head, c);
    waiters_remove(&f.ws, x);
    waiters_remove(&f.ws, y);
    cr_assert_null(slot, "the slot was not cleared with its last waiter");
    waiters_remove(&f.ws, b);
    cr_assert_null(waiters_tenant(&f.ws, 1001));
    cr_assert_eq(f.ws.n, 1);
    uv_run(&f.loop, UV_RUN_DEFAULT);
    cr_assert_eq(f.expired, 1);
    cr_assert_eq(f.order[0], 3);
    fx_close(&f);
}

Test(waiters, a_kick_runs_the_retry_once_when_leases_wait)
{
    struct fx f;
    fx_open(&f);
    waiters_kick(&f.ws); /* nothing waits: no retry */
    uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(f.retries, 0);
    struct waiters_queue *slot = NULL;
    cr_assert_not_null(waiters_park_acquire(&f.ws, &f.owner, &f.mine, 1, &slot, 1000));
    waiters_kick(&f.ws); /* only acquires wait: no retry either */
    uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(f.retries, 0);
    struct waiter *w = waiters_park_lease(&f.ws, &f.owner, &f.mine, 2, 1000, 10, 0, 1000);
    waiters_kick(&f.ws);
    waiters_kick(&f.ws);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    cr_assert_eq(f.retries, 1, "%u retries for two kicks in one turn", f.retries);
    cr_assert_not(uv_is_active((uv_handle_t *)&f.ws.kick), "the retry's own kick was kept");
    waiters_remove(&f.ws, w);
    fx_close(&f); /* frees the acquire still parked */
    cr_assert_eq(f.ws.n, 0);
}

/* Each owner keeps its own list: places (a batch takes its count) and its group's sum
 * (one uid's connections) follow parking, recounting and removal; dropping one owner's
 * waiters walks only its own. */
Test(waiters, each_owner_keeps_its_own_list_and_its_groups_sum)
{
    struct fx f;
    fx_open(&f);
    unsigned group = 0;
    struct waiters_mine a = { .group = &group }, b = { .group = &group };
    struct waiters_queue *slot = NULL;
    int owner_b;
    struct waiter *w1 = waiters_park_lease(&f.ws, &f.owner, &a, 1, 1000, 10, 0, 5000);
    struct waiter *w2 = waiters_park_acquire(&f.ws, &owner_b, &b, 2, &slot, 5000);
    struct waiter *w3 = waiters_park_lease(&f.ws, &f.owner, &a, 3, 1000, 10, 0, 5000);
    cr_assert(w1 && w2 && w3);
    waiters_set_count(w3, 5); /* a batch of 5 */
    cr_assert_eq(a.n, 2);
    cr_assert_eq(a.places, 6);
    cr_assert_eq(b.places, 1);
    cr_assert_eq(group, 7);
    cr_assert_eq(a.head, w1);
    cr_assert_eq(a.tail, w3);
    cr_assert_eq(b.head, w2);
    while (a.head) /* a disconnect: only a's own */
        waiters_remove(&f.ws, a.head);
    cr_assert_eq(a.places, 0);
    cr_assert_eq(group, 1);
    cr_assert_eq(f.ws.n, 1);
    cr_assert_eq(b.head, w2);
    waiters_remove(&f.ws, w2);
    cr_assert_eq(group, 0);
    cr_assert_null(slot);
    fx_close(&f);
}
