/* SPDX-License-Identifier: MIT */
/* waiters.c: see waiters.h. Each waiter is on three structures: the list of all (arrival
 * order), its queue, and the deadline heap; the deadline timer pops what is due and
 * re-arms for the earliest that is left. */
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
    free(ws->heap);
    ws->heap = NULL;
    ws->heap_cap = 0;
    ws->open = false;
    uv_close((uv_handle_t *)&ws->deadline, NULL);
    uv_close((uv_handle_t *)&ws->kick, NULL);
}

/* ---- the deadline heap (ws->n entries) ---- */

static void heap_set(struct waiters *ws, unsigned i, struct waiter *w)
{
    ws->heap[i] = w;
    w->hidx = i;
}

static void heap_up(struct waiters *ws, unsigned i)
{
    struct waiter *w = ws->heap[i];
    while (i > 0 && ws->heap[(i - 1) / 2]->deadline_ms > w->deadline_ms) {
        heap_set(ws, i, ws->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_set(ws, i, w);
}

static void heap_down(struct waiters *ws, unsigned i, unsigned n)
{
    struct waiter *w = ws->heap[i];
    for (;;) {
        unsigned c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && ws->heap[c + 1]->deadline_ms < ws->heap[c]->deadline_ms)
            c++;
        if (ws->heap[c]->deadline_ms >= w->deadline_ms)
            break;
        heap_set(ws, i, ws->heap[c]);
        i = c;
    }
    heap_set(ws, i, w);
}

/* heap_remove: w out of the heap of n entries (n - 1 are left). */
static void heap_remove(struct waiters *ws, struct waiter *w, unsigned n)
{
    struct waiter *last = ws->heap[n - 1];
    if (last == w)
        return;
    heap_set(ws, w->hidx, last);
    heap_down(ws, last->hidx, n - 1);
    heap_up(ws, last->hidx);
}

/* arm: the deadline timer targets the earliest deadline. */
static void arm(struct waiters *ws)
{
    if (!ws->n) {
        if (ws->armed_ms)
            uv_timer_stop(&ws->deadline);
        ws->armed_ms = 0;
        return;
    }
    uint64_t deadline_ms = ws->heap[0]->deadline_ms, now = uv_now(ws->loop);
    if (ws->armed_ms == deadline_ms)
        return;
    ws->armed_ms = deadline_ms;
    uv_timer_start(&ws->deadline, on_deadline, deadline_ms > now ? deadline_ms - now : 0, 0);
}

static void on_deadline(uv_timer_t *t)
{
    struct waiters *ws = t->data;
    uint64_t now = uv_now(ws->loop);
    ws->armed_ms = 0;
    while (ws->n && ws->heap[0]->deadline_ms <= now)
        ws->expire(ws->arg, ws->heap[0]); /* removes it, and only it */
    arm(ws);
}

static void on_kick(uv_timer_t *t)
{
    struct waiters *ws = t->data;
    ws->retrying = true;
    if (ws->leases)
        ws->retry(ws->arg);
    ws->retrying = false;
}

void waiters_poll(struct waiters *ws, uint64_t ms)
{
    if (ws->leases && ws->open && !uv_is_active((uv_handle_t *)&ws->kick))
        uv_timer_start(&ws->kick, on_kick, ms ? ms : 1, 0);
}

/* A kick from inside the retry is dropped: libuv runs a zero-delay timer restarted in
 * its own callback again in the same turn, so it would never return to polling. */
void waiters_kick(struct waiters *ws)
{
    if (ws->leases && ws->open && !ws->retrying && !uv_is_active((uv_handle_t *)&ws->kick))
        uv_timer_start(&ws->kick, on_kick, 0, 0);
}

static struct waiter *add(struct waiters *ws, void *owner, struct waiters_mine *mine, uint32_t id, uint32_t wait_ms,
                          struct waiters_queue *q)
{
    if (ws->n == ws->heap_cap) {
        unsigned cap = ws->heap_cap ? ws->heap_cap * 2 : 16;
        struct waiter **h = realloc(ws->heap, cap * sizeof(*h));
        if (!h)
            return NULL;
        ws->heap = h;
        ws->heap_cap = cap;
    }
    struct waiter *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->owner = owner;
    w->id = id;
    w->count = 1;
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
    w->mine = mine;
    w->mprev = mine->tail;
    if (mine->tail) mine->tail->mnext = w; else mine->head = w;
    mine->tail = w;
    mine->n++;
    mine->places++;
    if (mine->group)
        (*mine->group)++;
    heap_set(ws, ws->n, w);
    heap_up(ws, ws->n);
    ws->n++;
    arm(ws);
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

struct waiter *waiters_park_lease(struct waiters *ws, void *owner, struct waiters_mine *mine, uint32_t id,
                                  uint32_t uid, uint64_t size, int blocked, uint32_t wait_ms)
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
    struct waiter *w = add(ws, owner, mine, id, wait_ms, q);
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

struct waiter *waiters_park_acquire(struct waiters *ws, void *owner, struct waiters_mine *mine, uint32_t id,
                                    struct waiters_queue **slot, uint32_t wait_ms)
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
    struct waiter *w = add(ws, owner, mine, id, wait_ms, q);
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

void waiters_set_count(struct waiter *w, uint32_t count)
{
    w->mine->places = w->mine->places - w->count + count;
    if (w->mine->group)
        *w->mine->group = *w->mine->group - w->count + count;
    w->count = count;
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
    struct waiters_mine *m = w->mine;
    if (w->mprev) w->mprev->mnext = w->mnext; else m->head = w->mnext;
    if (w->mnext) w->mnext->mprev = w->mprev; else m->tail = w->mprev;
    m->n--;
    m->places -= w->count;
    if (m->group)
        *m->group -= w->count;
    heap_remove(ws, w, ws->n);
    ws->n--;
    if (!w->acquire)
        ws->leases--;
    if (!ws->n && ws->armed_ms) {
        uv_timer_stop(&ws->deadline);
        ws->armed_ms = 0;
    }
    free(w->data);
    free(w);
}
