/* SPDX-License-Identifier: MIT */
/* batch.c: see batch.h. Each item is one lease_attempt (lease.c), the same pipeline as a
 * single lease; the batch only gathers them, replies once, or undoes them all. */
#include "batch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "units.h"

struct batch;
struct batch_item {
    struct lease_attempt a;      /* first: the attempt's done callback finds the item */
    struct batch *bt;
};

/* A lease_many in progress: the reply (or the error, which undoes every item) goes when
 * the last item is in. */
struct batch {
    struct broker *broker;
    struct broker_peer *peer;
    uint32_t id, n, making;
    struct waiter *waiter;       /* a waiting batch's place in its tenant's queue, or NULL */
    bool expired;                /* its wait ran out while it was being made: undo, silently */
    bool hard;                   /* a failure that waiting would not cure (a create failed) */
    bool stock;                  /* PROTO_LEASE_STOCK: every item from the stock reserve */
    int code;                    /* the first refusal, 0 if none */
    char msg[2 * PROTO_MAX_ERRMSG]; /* room for a reason of PROTO_MAX_ERRMSG; cut when sent */
    struct batch_item items[PROTO_MAX_BATCH];
};

/* A waiting lease_many: the waiter's data. */
struct batch_wait {
    uint32_t n;
    uint64_t sizes[PROTO_MAX_BATCH];
    struct batch *bt;            /* its attempt in flight (w->busy), or NULL */
};

/* cancel: buffers still being made for bt go back when they come. */
static void cancel(struct batch *bt)
{
    for (uint32_t i = 0; i < bt->n; i++)
        bt->items[i].a.cancelled = true;
}

void batch_detach(struct waiter *w)
{
    struct batch_wait *bw = w->data;
    if (bw->bt) {
        bw->bt->waiter = NULL;
        bw->bt->expired = true;
        cancel(bw->bt);
        bw->bt = NULL;
    }
}

static void batch_fail(struct batch *bt, uint32_t i, int code, const char *why)
{
    char a[UNITS_TEXT_MAX];
    if (bt->code)
        return; /* the first reason is the one told */
    bt->code = code;
    cancel(bt);
    snprintf(bt->msg, sizeof(bt->msg), "lease_many item %u of %u (%s): %.*s; no lease of the batch was made", i,
             bt->n, units_format(bt->items[i].a.size, a), PROTO_MAX_ERRMSG, why);
}

/* unpark: the batch's waiter leaves (served or refused); the next of its tenant may go. */
static void unpark(struct broker *bk, struct waiter *w)
{
    waiters_remove(&bk->waiters, w);
    waiters_kick(&bk->waiters);
}

/* batch_done: every item is in: one reply with all of them, or every held item released
 * and one error; a waiting batch refused EDQUOT/ENOSPC stays parked instead. Returns
 * whether its waiter (if any) is still parked. */
static bool batch_done(struct batch *bt)
{
    struct broker *bk = bt->broker;
    struct broker_peer *p = bt->peer;
    struct waiter *w = bt->waiter;
    /* The items' handles are the client's to guess (generation << 32 | slot) before the
     * reply names them: one released meanwhile (release, release_many) took its buffer
     * with it, which may be gone. Every item must still be held as it was, or the batch is
     * undone like any other failure (never a reply naming a dead buffer). */
    for (uint32_t i = 0; i < bt->n && !bt->code && !p->closing && !bt->expired; i++) {
        struct lease_attempt *a = &bt->items[i].a;
        struct registry_lease *l = a->handle ? registry_lease_of(&p->holder, a->handle) : NULL;
        if (a->handle && (!l || l->buf != a->buf)) {
            a->handle = 0;
            bt->hard = true; /* not a want of space: waiting would not cure it */
            batch_fail(bt, i, EINVAL, "its handle was released before the lease_many reply named it");
        }
    }
    if (bt->code || p->closing || bt->expired) {
        for (uint32_t i = 0; i < bt->n; i++)
            if (bt->items[i].a.handle)
                registry_release(bk->reg, &p->holder, bt->items[i].a.handle); /* -ENOENT once reclaimed */
        if (w && !p->closing && !bt->hard && (bt->code == EDQUOT || bt->code == ENOSPC)) {
            w->busy = false; /* waits on, at the head of its tenant's queue */
            w->blocked = bt->code;
            ((struct batch_wait *)w->data)->bt = NULL;
            free(bt);
            return true;
        }
        if (w)
            unpark(bk, w);
        if (!p->closing && !bt->expired && bt->stock && bt->code == EAGAIN)
            lease_stock_refuse(bk, p, bt->id, bt->msg);
        else if (!p->closing && !bt->expired)
            peer_refuse(bk, p, bt->id, bt->code, "lease_many", bt->msg);
        free(bt);
        return false;
    }
    if (w)
        unpark(bk, w);
    static struct proto_msg r; /* one loop thread */
    int fds[PROTO_MAX_BATCH];
    r = (struct proto_msg){ .op = PROTO_OP_LEASE_MANY + PROTO_OP_REPLY, .id = bt->id };
    r.u.lease_many_reply.n = bt->n;
    for (uint32_t i = 0; i < bt->n; i++) {
        struct lease_attempt *a = &bt->items[i].a;
        struct proto_item *o = &r.u.lease_many_reply.items[i];
        o->handle = a->handle;
        o->buf_id = a->buf->pb->id;
        o->size = a->size;
        o->capacity = a->buf->pb->size;
        memcpy(o->token, a->buf->token, PROTO_TOKEN_LEN);
        fds[i] = a->buf->pb->fd;
    }
    bk->counters->leases += bt->n;
    if (bt->stock)
        bk->counters->stock_leases += bt->n;
    p->ops->reply_many(p, &r, fds);
    free(bt);
    return false;
}

/* item_done: an item whose buffer was made off the loop is in (held, or failed). */
static void item_done(struct lease_attempt *a, int err, const char *msg)
{
    struct batch_item *it = (struct batch_item *)a;
    struct batch *bt = it->bt;
    if (err < 0 && err != -ECANCELED) {
        batch_fail(bt, (uint32_t)(it - bt->items), -err, msg);
        bt->hard = true; /* a full tmpfs: waiting would only make the files again */
    }
    if (--bt->making == 0)
        batch_done(bt);
}

/* batch_start: an attempt at n leases (checked), all or nothing. w: the batch's waiter,
 * if it waits. Returns whether w is still parked (blocked, or its buffers being made). */
static bool batch_start(struct broker *bk, struct broker_peer *p, uint32_t id, uint32_t n, const uint64_t *sizes,
                        struct waiter *w, bool stock)
{
    struct batch *bt = calloc(1, sizeof(*bt));
    if (!bt) {
        if (w)
            waiters_remove(&bk->waiters, w);
        peer_fail(p, id, ENOMEM, "daemon out of memory");
        return false;
    }
    *bt = (struct batch){ .broker = bk, .peer = p, .id = id, .n = n, .waiter = w, .stock = stock };
    if (w) {
        w->busy = true;
        ((struct batch_wait *)w->data)->bt = bt;
    }
    char msg[PROTO_MAX_ERRMSG];
    for (uint32_t i = 0; i < n; i++) {
        struct batch_item *it = &bt->items[i];
        *it = (struct batch_item){ .a = { .bk = bk, .p = p, .size = sizes[i], .waits = w != NULL, .stock = stock,
                                          .done = item_done },
                                   .bt = bt };
        int r = lease_attempt(&it->a, msg, sizeof(msg));
        if (r == 1) {
            bt->making++;
        } else if (r < 0) {
            batch_fail(bt, i, -r, msg);
            break;
        }
    }
    if (bt->making == 0)
        return batch_done(bt);
    return w != NULL; /* the last buffer made finishes it */
}

void batch_lease_many(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    uint32_t n = m->u.lease_many.n;
    char msg[PROTO_MAX_ERRMSG], a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];
    for (uint32_t i = 0; i < n; i++) {
        uint64_t size = m->u.lease_many.sizes[i];
        if (size == 0) {
            peer_fail(p, m->id, EINVAL, "lease_many item %u of %u: lease size must be at least 1 byte", i, n);
            return;
        }
        if (size > bk->opt->max_lease_size) {
            snprintf(msg, sizeof(msg), "lease_many item %u of %u: lease of %s (%llu bytes) exceeds the maximum "
                     "lease size %s (%llu bytes)", i, n, units_format(size, a), (unsigned long long)size,
                     units_format(bk->opt->max_lease_size, b), (unsigned long long)bk->opt->max_lease_size);
            peer_refuse(bk, p, m->id, EFBIG, "lease_many", msg);
            return;
        }
    }
    unsigned held = p->holder.leases + p->pending + p->parked.places;
    if (held + n > bk->opt->max_leases) {
        snprintf(msg, sizeof(msg), "too many leases on this connection: %u held, %u asked, limit %u", held, n,
                 bk->opt->max_leases);
        peer_refuse(bk, p, m->id, EMFILE, "lease_many", msg);
        return;
    }
    if (!lease_fd_share_left(bk, p, m->id, n, "lease_many"))
        return;
    bool stock = (m->u.lease_many.flags & PROTO_LEASE_STOCK) != 0;
    uint32_t wait = bk->loop && !stock ? m->u.lease_many.wait_ms : 0; /* a stock lease never waits */
    if (wait > PROTO_MAX_LEASE_WAIT_MS)
        wait = PROTO_MAX_LEASE_WAIT_MS;
    if (!wait) {
        batch_start(bk, p, m->id, n, m->u.lease_many.sizes, NULL, stock);
        return;
    }
    if (lease_beyond_all(bk, p, m->id, m->u.lease_many.sizes, n, "lease_many") ||
        !peer_park_left(bk, p, m->id, n, "lease_many"))
        return;
    /* A waiting batch waits as a unit: parked first (FIFO behind its tenant's earlier
     * waiters), then tried; refused EDQUOT/ENOSPC, it stays parked and is tried again
     * whole when space frees. */
    struct batch_wait *bw = calloc(1, sizeof(*bw));
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += m->u.lease_many.sizes[i];
    struct waiters_queue *q = waiters_tenant(&bk->waiters, p->uid);
    struct waiter *w = bw ? waiters_park_lease(&bk->waiters, p, &p->parked, m->id, p->uid, sum,
                                               q ? q->tail->blocked : EDQUOT, wait)
                          : NULL;
    if (!w) {
        free(bw);
        peer_fail(p, m->id, ENOMEM, "daemon out of memory");
        return;
    }
    bw->n = n;
    memcpy(bw->sizes, m->u.lease_many.sizes, n * sizeof(bw->sizes[0]));
    w->data = bw;
    waiters_set_count(w, n);
    if (q || batch_start(bk, p, m->id, n, bw->sizes, w, false))
        bk->counters->lease_waits++;
}

bool batch_retry(struct broker *bk, struct waiter *w)
{
    struct batch_wait *bw = w->data;
    return !batch_start(bk, w->owner, w->id, bw->n, bw->sizes, w, false);
}

void batch_release_many(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    uint32_t n = m->u.release_many.n, bad = 0, unknown = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        if (registry_release(bk->reg, &p->holder, m->u.release_many.handles[i]) == 0) {
            bk->counters->releases++;
        } else {
            bad++;
            if (unknown == UINT32_MAX)
                unknown = i;
        }
    }
    if (bad) {
        peer_fail(p, m->id, ENOENT, "no lease with handle %llu (item %u of %u) on this connection; %u of the %u "
                  "handles were unknown, the others were released",
                  (unsigned long long)m->u.release_many.handles[unknown], unknown, n, bad, n);
        return;
    }
    if (m->u.release_many.flags & PROTO_RELEASE_NOREPLY)
        return;
    struct proto_msg r = { .op = PROTO_OP_RELEASE_MANY + PROTO_OP_REPLY, .id = m->id };
    p->ops->reply(p, &r, -1);
}
