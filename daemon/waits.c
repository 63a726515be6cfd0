/* SPDX-License-Identifier: MIT */
/* waits.c: see waits.h. A waiter holds no charge and no buffer; it takes its places under
 * max-leases in its peer's list. Retries run on the next loop turn (waiters_kick), never
 * inside the registry call that freed the space. */
#include "waits.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "acquire.h"
#include "batch.h"
#include "lease.h"
#include "ledgers.h"
#include "units.h"

/* A buffer given back in a table frees reclaimable space without a word to the daemon:
 * while leases wait and tables have members, they are tried again every WAITS_TABLE_POLL_MS
 * (each try reclaims free members of the tables first). */
#define WAITS_TABLE_POLL_MS 5

static void table_poll(struct broker *bk)
{
    if (registry_stats(bk->reg).lent)
        waiters_poll(&bk->waiters, WAITS_TABLE_POLL_MS);
}

int waits_park_lease(struct broker *bk, struct broker_peer *p, uint32_t id, uint64_t size, uint32_t flags,
                     int blocked, uint32_t wait_ms)
{
    if (!peer_park_left(bk, p, id, 1, "lease"))
        return -EMFILE;
    struct waiter *w = waiters_park_lease(&bk->waiters, p, &p->parked, id, p->uid, size, blocked, wait_ms);
    if (!w)
        return -ENOMEM;
    w->flags = flags & PROTO_LEASE_TABLE;
    bk->counters->lease_waits++;
    table_poll(bk);
    return 0;
}

/* retry_leases: quota or pool space may have freed: each tenant's waiting leases are
 * tried in order until one is still blocked (FIFO: the rest stay behind it); a tenant's
 * blocked head never stops another tenant's. Tenants served go to the back, so space that
 * frees a little at a time is shared in turn. */
static void retry_leases(void *arg)
{
    struct broker *bk = arg;
    struct waiters *ws = &bk->waiters;
    char msg[PROTO_MAX_ERRMSG];
    unsigned tenants = 0;
    for (struct waiters_queue *q = ws->tenants_head; q; q = q->next)
        tenants++;
    /* An attempt that fails gives back the charge it just took: that frees nothing, and
     * must not kick another retry (which would spin while a lease waits for space). */
    bk->retrying = true;
    for (unsigned t = 0; t < tenants && ws->tenants_head; t++) {
        struct waiters_queue *q = ws->tenants_head;
        for (;;) {
            struct waiter *w = q->head;
            struct broker_peer *p = w->owner;
            bool last = w->qnext == NULL;
            if (w->busy) { /* a batch whose buffers are being made: the tenant waits for it */
                waiters_tenant_last(ws, q);
                break;
            }
            if (w->data && !p->closing) {
                if (batch_retry(bk, w)) { /* done: served or refused, and removed */
                    if (last)
                        break;
                    continue;
                }
                waiters_tenant_last(ws, q);
                break;
            }
            if (!p->closing) {
                int r = lease_one(bk, p, w->id, w->size, true, w->flags, msg, sizeof(msg));
                if (r < 0) { /* still blocked: the rest of this tenant stays behind it */
                    w->blocked = -r;
                    waiters_tenant_last(ws, q);
                    break;
                }
            }
            waiters_remove(ws, w); /* frees q with its last waiter */
            if (last)
                break;
        }
    }
    bk->retrying = false;
    table_poll(bk);
    ledgers_check(bk);
}

/* lease_expired: a waiting lease's deadline passed: ETIMEDOUT with the numbers. */
static void lease_expired(struct broker *bk, struct waiter *w)
{
    struct broker_peer *p = w->owner;
    char msg[PROTO_MAX_ERRMSG], a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], c[UNITS_TEXT_MAX];
    uint64_t waited = uv_now(bk->loop) - w->since_ms;
    char what[80] = "lease";
    bk->counters->lease_wait_timeouts++;
    if (w->data) {
        batch_detach(w);
        snprintf(what, sizeof(what), "lease_many of %u leases", w->count);
    }
    if (w->blocked == ENOSPC) {
        struct registry_stats st = registry_stats(bk->reg);
        uint64_t held = st.bytes + pool_bytes_pinned(bk->pool);
        snprintf(msg, sizeof(msg),
                 "%s of %s (%llu bytes) waited %llu ms for pool space: the pool holds %s (%llu bytes) of its %s "
                 "(%llu bytes)", what, units_format(w->size, a), (unsigned long long)w->size, (unsigned long long)waited,
                 units_format(held, b), (unsigned long long)held, units_format(pool_cap(bk->pool), c),
                 (unsigned long long)pool_cap(bk->pool));
    } else {
        uint64_t held = quota_held(bk->quota, p->uid), limit = quota_limit(bk->quota, p->uid);
        snprintf(msg, sizeof(msg),
                 "%s of %s (%llu bytes) waited %llu ms for quota: uid %u holds %s (%llu bytes) of its %s quota",
                 what, units_format(w->size, a), (unsigned long long)w->size, (unsigned long long)waited,
                 (unsigned)p->uid, units_format(held, b), (unsigned long long)held, units_format(limit, c));
    }
    uint32_t id = w->id;
    waiters_remove(&bk->waiters, w);
    /* It may have been its tenant's blocked head: the ones behind it may fit now, though
     * nothing freed. */
    waiters_kick(&bk->waiters);
    if (!p->closing)
        peer_refuse(bk, p, id, ETIMEDOUT, "lease", msg);
}

/* unpark: a parked request leaves its queue and its peer's list; its peer to answer (and
 * *ret_id), or NULL when the peer is closing. */
static struct broker_peer *unpark(struct broker *bk, struct waiter *w, uint32_t *ret_id)
{
    struct broker_peer *p = w->owner;
    *ret_id = w->id;
    waiters_remove(&bk->waiters, w);
    return p->closing ? NULL : p;
}

void waits_park_acquire(struct broker *bk, struct broker_peer *p, uint32_t id, struct registry_buf *b,
                        uint32_t wait_ms)
{
    /* a parked acquire takes a place under max-leases, as a lease does, and one of its
     * uid's under max-parked-per-uid */
    if (!peer_leases_left(bk, p, id, "acquire") || !peer_park_left(bk, p, id, 1, "acquire"))
        return;
    if (!waiters_park_acquire(&bk->waiters, p, &p->parked, id, &b->waiting, wait_ms)) {
        peer_fail(p, id, ENOMEM, "daemon out of memory");
        return;
    }
    bk->counters->acquire_waits++;
}

void waits_serve_acquires(struct broker *bk, struct registry_buf *b)
{
    uint32_t id;
    /* Its producer holds it throughout, so b stays alive. */
    while (b->waiting) {
        struct broker_peer *p = unpark(bk, b->waiting->head, &id);
        if (p)
            acquire_serve(bk, p, id, b);
    }
}

/* acquire_expired: no publish within the wait: ENOENT, saying so. */
static void acquire_expired(struct broker *bk, struct waiter *w)
{
    uint32_t id, ms = w->wait_ms;
    bk->counters->acquire_wait_timeouts++;
    struct broker_peer *p = unpark(bk, w, &id);
    if (p)
        peer_fail(p, id, ENOENT, "buffer leased under this descriptor was not published within %u ms", (unsigned)ms);
}

static void waiter_expired(void *arg, struct waiter *w)
{
    if (w->acquire)
        acquire_expired(arg, w);
    else
        lease_expired(arg, w);
}

/* on_gone_waited: a buffer with waiting acquires goes unpublished. */
static void on_gone_waited(void *arg, struct registry_buf *b)
{
    struct broker *bk = arg;
    uint32_t id;
    while (b->waiting) {
        struct broker_peer *p = unpark(bk, b->waiting->head, &id);
        if (p)
            peer_fail(p, id, ENOENT, "the buffer leased under this descriptor was released before it was published "
                      "(its producer released it, or went away)");
    }
}

static void on_freed(void *arg, struct registry_buf *b)
{
    (void)b;
    struct broker *bk = arg;
    if (!bk->retrying)
        waiters_kick(&bk->waiters);
}

void waits_start(struct broker *bk, uv_loop_t *loop)
{
    bk->loop = loop;
    waiters_init(&bk->waiters, loop, waiter_expired, retry_leases, bk);
    struct registry_events ev = { .freed = on_freed, .gone_waited = on_gone_waited, .arg = bk };
    registry_set_events(bk->reg, &ev);
}

void waits_stop(struct broker *bk)
{
    if (!bk->loop)
        return;
    registry_set_events(bk->reg, NULL);
    for (struct waiter *w = bk->waiters.head; w; w = w->next)
        if (w->data)
            batch_detach(w); /* an attempt in flight finishes alone (the peer is closing) */
    waiters_close(&bk->waiters);
    bk->loop = NULL;
}

void waits_kick(struct broker *bk)
{
    if (bk->loop)
        waiters_kick(&bk->waiters);
}

void waits_drop_peer(struct broker *bk, struct broker_peer *p)
{
    bool leases = false;
    while (p->parked.head) {
        struct waiter *w = p->parked.head;
        if (w->data)
            batch_detach(w);
        leases = leases || !w->acquire;
        waiters_remove(&bk->waiters, w);
    }
    if (leases) /* a tenant's blocked head may have gone: the ones behind it may fit */
        waiters_kick(&bk->waiters);
}
