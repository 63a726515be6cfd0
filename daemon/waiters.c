/* SPDX-License-Identifier: MIT */
/* waiters.c: see waiters.h. Waiters are few (each counts against its connection's
 * max-leases), so the deadline timer scans them all when it fires and re-arms for the
 * earliest that is left. */
#include "waiters.h"

#include <stdlib.h>

static void on_deadline(uv_timer_t *t);
static void on_kick(uv_timer_t *t);

void waiters_init(struct waiters *ws, uv_loop_t *loop, waiters_expire_cb expire, waiters_retry_cb retry,
                  void *arg)
{
    *ws = (struct waiters){ .loop = loop, .expire = expire, .retry = retry, .arg = arg, .open = true };
    uv_timer_init(loop, &ws->deadline);
    uv_timer_init(loop, &ws->kick);
    ws->deadline.data = ws;
    ws->kick.data = ws;
}

void waiters_close(struct waiters *ws)
{
    if (!ws->open)
        return;
    while (ws->head)
        waiters_remove(ws, ws->head);
    ws->open = false;
    uv_close((uv_handle_t *)&ws->deadline, NULL);
    uv_close((uv_handle_t *)&ws->kick, NULL);
}

/* arm: the deadline timer targets the earliest deadline (deadlines only move it earlier
 * here; a timer that fires early finds nothing due and re-arms). */
static void arm(struct waiters *ws, uint64_t deadline_ms)
{
    if (ws->armed_ms && ws->armed_ms <= deadline_ms)
        return;
    uint64_t now = uv_now(ws->loop);
    ws->armed_ms = deadline_ms;
    uv_timer_start(&ws->deadline, on_deadline, deadline_ms > now ? deadline_ms - now : 0, 0);
}

static void on_deadline(uv_timer_t *t)
{
    struct waiters *ws = t->data;
    uint64_t now = uv_now(ws->loop), next = 0;
    ws->armed_ms = 0;
    for (struct waiter *w = ws->head, *nx; w; w = nx) {
        nx = w->next;
        if (w->deadline_ms <= now) {
            ws->expire(ws->arg, w); /* removes w, and only w */
            continue;
        }
        if (!next || w->deadline_ms < next)
            next = w->deadline_ms;
    }
    if (next)
        arm(ws, next);
}

static void on_kick(uv_timer_t *t)
{
    struct waiters *ws = t->data;
    if (ws->leases)
        ws->retry(ws->arg);
}

void waiters_kick(struct waiters *ws)
{
    if (ws->leases && ws->open && !uv_is_active((uv_handle_t *)&ws->kick))
        uv_timer_start(&ws->kick, on_kick, 0, 0);
}

static struct waiter *add(struct waiters *ws, void *owner, uint32_t id, uint32_t wait_ms, struct waiters_queue *q)
{
    struct waiter *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->owner = owner;
    w->id = id;
    w->wait_ms = wait_ms;
    w->since_ms = uv_now(ws->loop);
    w->deadline_ms = w->since_ms + wait_ms;
    w->q = q;
    w->qprev = q->tail;
    if (q->tail) q->tail->qnext = w; else q->head = w;
    q->tail = w;
    w->prev = ws->tail;
    if (ws->tail) ws->tail->next = w; else ws->head = w;
    ws->tail = w;
    ws->n++;
    arm(ws, w->deadline_ms);
    return w;
}

static struct waiters_queue *tenant_find(const struct waiters *ws, uint32_t uid)
{
    for (struct waiters_queue *q = ws->tenants_head; q; q = q->next)
        if (q->uid == uid)
            return q;
    return NULL;
}

struct waiters_queue *waiters_tenant(const struct waiters *ws, uint32_t uid)
{
    return ws->leases ? tenant_find(ws, uid) : NULL;
}

static void tenant_unlink(struct waiters *ws, struct waiters_queue *q)
{
    if (q->prev) q->prev->next = q->next; else ws->tenants_head = q->next;
    if (q->next) q->next->prev = q->prev; else ws->tenants_tail = q->prev;
    q->prev = q->next = NULL;
}

static void tenant_append(struct waiters *ws, struct waiters_queue *q)
{
    q->prev = ws->tenants_tail;
    q->next = NULL;
    if (ws->tenants_tail) ws->tenants_tail->next = q; else ws->tenants_head = q;
    ws->tenants_tail = q;
}

void waiters_tenant_last(struct waiters *ws, struct waiters_queue *q)
{
    if (ws->tenants_tail == q)
        return;
    tenant_unlink(ws, q);
    tenant_append(ws, q);
}

struct waiter *waiters_park_lease(struct waiters *ws, void *owner, uint32_t id, uint32_t uid, uint64_t size,
                                  int blocked, uint32_t wait_ms)
{
    struct waiters_queue *q = tenant_find(ws, uid);
    bool made = false;
    if (!q) {
        if (!(q = calloc(1, sizeof(*q))))
            return NULL;
        q->uid = uid;
        tenant_append(ws, q);
        made = true;
    }
    struct waiter *w = add(ws, owner, id, wait_ms, q);
    if (!w) {
        if (made) {
            tenant_unlink(ws, q);
            free(q);
        }
        return NULL;
    }
    w->size = size;
    w->blocked = blocked;
    ws->leases++;
    return w;
}

struct waiter *waiters_park_acquire(struct waiters *ws, void *owner, uint32_t id, struct waiters_queue **slot,
                                    uint32_t wait_ms)
{
    struct waiters_queue *q = *slot;
    bool made = false;
    if (!q) {
        if (!(q = calloc(1, sizeof(*q))))
            return NULL;
        q->slot = slot;
        *slot = q;
        made = true;
    }
    struct waiter *w = add(ws, owner, id, wait_ms, q);
    if (!w) {
        if (made) {
            *slot = NULL;
            free(q);
        }
        return NULL;
    }
    w->acquire = true;
    return w;
}

void waiters_remove(struct waiters *ws, struct waiter *w)
{
    struct waiters_queue *q = w->q;
    if (w->qprev) w->qprev->qnext = w->qnext; else q->head = w->qnext;
    if (w->qnext) w->qnext->qprev = w->qprev; else q->tail = w->qprev;
    if (!q->head) {
        if (q->slot)
            *q->slot = NULL;
        else
            tenant_unlink(ws, q);
        free(q);
    }
    if (w->prev) w->prev->next = w->next; else ws->head = w->next;
    if (w->next) w->next->prev = w->prev; else ws->tail = w->prev;
    ws->n--;
    if (!w->acquire)
        ws->leases--;
    if (!ws->n && ws->armed_ms) {
        uv_timer_stop(&ws->deadline);
        ws->armed_ms = 0;
    }
    free(w);
}
