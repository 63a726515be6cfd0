/* SPDX-License-Identifier: MIT */
/* stock.c: the lease stock of a connection without a table (one with a table leases from
 * its uid's free lists: localhold.c). After the first lease of a size (a round
 * trip), `depth` more leases of its size class are asked for without waiting and kept
 * ready; a later lease of that class takes one at once and asks for one more, with the
 * next message (client_send_later); the replies are taken in when the stock runs dry. Stock
 * leases are leases like any other (charged to quota, in status), returned when unused:
 * at close, when a lease or acquire meets EDQUOT/ENOSPC, when their class is the least
 * recently used of more than STOCK_CLASSES. */
#include "stock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "handle.h"
#include "localhold.h"
#include "mapcache.h"
#include "requests.h"
#include "transport.h"


#define STOCK_DEFAULT_DEPTH 2

void stock_init(struct stock *st)
{
    *st = (struct stock){ .depth = STOCK_DEFAULT_DEPTH };
    const char *e = getenv("SHMREF_STOCK");
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (!*end && v >= 0)
            st->depth = v > STOCK_MAX_DEPTH ? STOCK_MAX_DEPTH : (unsigned)v;
    }
}

bool stock_eligible(const shmref_conn *conn, size_t size)
{
    /* a connection with a table has no stock: its uid's free lists are it */
    return conn->stock.depth > 0 && size <= STOCK_MAX_SIZE && !localhold_on(conn);
}

/* find: the class a lease of size bytes falls in (the daemon's classes are monotone, so
 * every size between the smallest seen for a capacity and the capacity has it). */
static struct stock_class *find(shmref_conn *conn, size_t size)
{
    for (unsigned i = 0; i < STOCK_CLASSES; i++) {
        struct stock_class *c = &conn->stock.cls[i];
        if (c->used && c->lo <= size && size <= c->capacity)
            return c;
    }
    return NULL;
}

static struct stock_class *by_capacity(shmref_conn *conn, uint64_t capacity)
{
    for (unsigned i = 0; i < STOCK_CLASSES; i++)
        if (conn->stock.cls[i].used && conn->stock.cls[i].capacity == capacity)
            return &conn->stock.cls[i];
    return NULL;
}

/* empty: release a class's ready leases; refills of it in flight are dropped. */
static unsigned empty(struct stock_class *c)
{
    unsigned n = c->n_ready;
    while (c->n_ready > 0)
        handle_drop(c->ready[--c->n_ready]);
    c->inflight = 0;
    return n;
}

/* refill: ask for k leases of class c, without waiting. */
/* After the daemon refuses a stock refill (EAGAIN: its stock reserve or this uid's stock
 * cap is full, or the class is too large for a stock), so many refills of the class are
 * not asked for: leases of it go plainly meanwhile. */
#define STOCK_SKIP_AFTER_REFUSAL 64

static void refill(shmref_conn *conn, struct stock_class *c, unsigned k)
{
    if (c->skip > 0) {
        c->skip--;
        return;
    }
    while (k > 0) {
        bool many = CLIENT_WIRE_BATCH && k > 1;
        struct pending *p = pending_new(conn, many ? PROTO_OP_LEASE_MANY : PROTO_OP_LEASE, PENDING_STOCK,
                                        &stock_lease_ops);
        if (!p)
            return;
        unsigned n = many ? k : 1;
        if (many) {
            if (!(p->sizes = malloc(n * sizeof(uint64_t)))) {
                pending_free(conn, p);
                return;
            }
            for (unsigned i = 0; i < n; i++)
                p->sizes[i] = c->capacity;
            p->n = n;
        }
        p->size = p->want = c->capacity;
        p->refill = true;
        if (pending_submit(conn, p) < 0) {
            pending_free(conn, p);
            return;
        }
        c->inflight += n;
        conn->stock.out++;
        k -= n;
    }
}

int stock_take(shmref_conn *conn, size_t size, shmref_buf **ret_buf, struct pending **ret_wait)
{
    struct stock_class *c = find(conn, size);
    if (!c)
        return 0;
    c->last_use = ++conn->stock.tick;
    if (c->n_ready == 0 && c->inflight > 0)
        pending_intake(conn); /* refills answered meanwhile (a failure shows to the caller's wait) */
    if (c->n_ready > 0) {
        shmref_buf *b = c->ready[--c->n_ready];
        b->size = size;
        refill(conn, c, 1);
        *ret_buf = b;
        return 1;
    }
    if (!ret_wait || c->inflight == 0)
        return 0;
    for (struct pending *p = conn->out; p; p = p->next)
        if (p->refill && p->owner == PENDING_STOCK && p->op == PROTO_OP_LEASE && p->size == c->capacity) {
            p->owner = PENDING_WAIT;
            p->want = size;
            c->inflight--;
            *ret_wait = p;
            return 0;
        }
    return 0;
}

static void stock_learn(shmref_conn *conn, size_t size, uint64_t capacity)
{
    struct stock *st = &conn->stock;
    if (!stock_eligible(conn, size) || capacity > STOCK_MAX_SIZE || capacity < size)
        return;
    struct stock_class *c = by_capacity(conn, capacity);
    if (!c) {
        for (unsigned i = 0; i < STOCK_CLASSES && !c; i++)
            if (!st->cls[i].used)
                c = &st->cls[i];
        if (!c) { /* the least recently used class goes back */
            c = &st->cls[0];
            for (unsigned i = 1; i < STOCK_CLASSES; i++)
                if (st->cls[i].last_use < c->last_use)
                    c = &st->cls[i];
            empty(c);
            for (struct pending *p = conn->out; p; p = p->next)
                if (p->refill && p->owner == PENDING_STOCK && p->size == c->capacity)
                    p->owner = PENDING_DROP;
        }
        *c = (struct stock_class){ .capacity = capacity, .lo = size, .used = true };
    } else if (size < c->lo) {
        c->lo = size;
    }
    c->last_use = ++st->tick;
    unsigned have = c->n_ready + c->inflight;
    if (have < st->depth)
        refill(conn, c, st->depth - have);
}

static void stock_arrived(shmref_conn *conn, struct pending *p)
{
    shmref_buf **v = p->op == PROTO_OP_LEASE ? &p->buf : p->bufs;
    unsigned n = p->op == PROTO_OP_LEASE ? 1 : p->n;
    struct stock_class *c = by_capacity(conn, p->size);
    if (c)
        c->inflight -= n < c->inflight ? n : c->inflight;
    if (c && p->result == -EAGAIN)
        c->skip = STOCK_SKIP_AFTER_REFUSAL;
    for (unsigned i = 0; v && i < n; i++) {
        if (!v[i])
            continue;
        if (c && p->result == 0 && c->n_ready < conn->stock.depth)
            c->ready[c->n_ready++] = v[i];
        else
            handle_drop(v[i]);
        v[i] = NULL;
    }
}

unsigned stock_return(shmref_conn *conn)
{
    unsigned n = 0;
    for (unsigned i = 0; i < STOCK_CLASSES; i++)
        if (conn->stock.cls[i].used)
            n += empty(&conn->stock.cls[i]);
    for (struct pending *p = conn->out; p; p = p->next)
        if (p->refill && p->owner == PENDING_STOCK) {
            p->owner = PENDING_DROP;
            n++;
        }
    return n;
}

static unsigned stock_inflight(const shmref_conn *conn)
{
    return conn->stock.out;
}

void stock_abandon(shmref_conn *conn)
{
    for (unsigned i = 0; i < STOCK_CLASSES; i++) {
        struct stock_class *c = &conn->stock.cls[i];
        while (c->n_ready > 0)
            handle_forget(c->ready[--c->n_ready]); /* inherited: no release */
    }
    stock_reset(conn);
}

void stock_reset(shmref_conn *conn)
{
    for (unsigned i = 0; i < STOCK_CLASSES; i++)
        conn->stock.cls[i].inflight = 0;
    conn->stock.out = 0;
}

void stock_set_depth(shmref_conn *conn, unsigned depth)
{
    /* Leases past the new depth are released (handle_drop: one-way on a live connection;
     * on a broken one the daemon has ended them with it, and only their local handles go).
     * Never dropped unreleased. */
    struct stock *st = &conn->stock;
    st->depth = depth;
    for (unsigned i = 0; i < STOCK_CLASSES; i++) {
        struct stock_class *c = &st->cls[i];
        while (c->n_ready > st->depth)
            handle_drop(c->ready[--c->n_ready]);
    }
    if (depth == 0)
        stock_return(conn);
}

/* ---- lease requests: their handlers ---- */

/* wait_now: the wait a lease asks of the daemon this time. One that may wait goes first
 * without it while this connection keeps ready stock leases or idle mappings: they may be
 * what the quota or the pool lacks (an idle mapping of a buffer the daemon retired pins
 * its pages, charged to the uid), and the daemon, which cannot take them back, would park
 * the lease behind them to the end of its wait. Refused, it gives them back and goes
 * again with its wait (stock_retry): one more round trip, only when the quota or the
 * pool is full. */
static uint32_t wait_now(const shmref_conn *conn, struct pending *p)
{
    p->wait_held = false;
    if (!p->wait_ms || p->retried)
        return p->wait_ms;
    p->wait_held = conn->cache.n_idle > 0;
    for (unsigned i = 0; i < STOCK_CLASSES; i++)
        p->wait_held |= conn->stock.cls[i].n_ready > 0;
    return p->wait_held ? 0 : p->wait_ms;
}

static int lease_send(shmref_conn *conn, struct pending *p)
{
    struct proto_msg req = { .op = p->op };
    /* The daemon bounds the stock: refills say so (a daemon of version 2 has no stock
     * reserve, and knew no lease flags: its refills are plain leases). */
    p->stock_sent = p->refill && conn->version != PROTO_VERSION_PREV;
    if (p->op == PROTO_OP_LEASE) {
        req.u.lease.size = p->size;
        req.u.lease.wait_ms = wait_now(conn, p);
        req.u.lease.flags = (p->stock_sent ? PROTO_LEASE_STOCK : 0) | (p->for_table ? PROTO_LEASE_TABLE : 0);
    } else {
        req.u.lease_many.n = p->n;
        req.u.lease_many.wait_ms = wait_now(conn, p);
        req.u.lease_many.flags = p->stock_sent ? PROTO_LEASE_STOCK : 0;
        memcpy(req.u.lease_many.sizes, p->sizes, p->n * sizeof(uint64_t));
    }
    return pending_submit_msg(conn, p, &req);
}

static int take_many(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds)
{
    const struct proto_item *items = rep->u.lease_many_reply.items;
    uint32_t n = rep->u.lease_many_reply.n;
    unsigned fi = 0;
    int r = 0;
    if (n != p->n) {
        handle_undo_reply(conn, rep, fds, nfds, false);
        return client_fail(conn, -EPROTO, "shmrefd answered a lease_many of %u with %u leases", p->n, (unsigned)n);
    }
    if (!(p->bufs = calloc(n, sizeof(*p->bufs)))) {
        handle_undo_reply(conn, rep, fds, nfds, false);
        return client_fail(conn, -ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < n; i++) {
        int fd = items[i].has_fd && fi < nfds ? fds[fi++] : -1;
        if (r < 0) { /* after a failure: undo the rest */
            if (fd >= 0) {
                close(fd);
                client_forget(conn, items[i].buf_id, true);
            }
            client_release_handle(conn, items[i].handle);
            continue;
        }
        r = handle_take(conn, items[i].handle, items[i].buf_id, items[i].size, items[i].capacity, items[i].token,
                        NULL, 0, 0, fd, true, false, false, &p->bufs[i]);
    }
    while (fi < nfds)
        close(fds[fi++]);
    return r;
}

static int lease_reply(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds,
                       bool lost)
{
    if (lost) {
        handle_lost(conn, p, rep, fds, nfds);
        return p->result;
    }
    if (p->op == PROTO_OP_LEASE_MANY)
        return take_many(conn, p, rep, fds, nfds);
    for (unsigned i = 1; i < nfds; i++)
        close(fds[i]);
    const typeof(rep->u.lease_reply) *l = &rep->u.lease_reply;
    int r = handle_take(conn, l->handle, l->buf_id, l->size, l->capacity, l->token, l->meta, l->meta_len, l->flags,
                        nfds > 0 ? fds[0] : -1, true, false, false, &p->buf);
    if (r == 0 && (p->owner == PENDING_WAIT || p->owner == PENDING_USER)) {
        p->buf->size = p->want;
        stock_learn(conn, p->want, p->buf->capacity);
    }
    return r;
}

bool stock_retry(shmref_conn *conn, struct pending *p, int code)
{
    if (p->owner != PENDING_WAIT && p->owner != PENDING_USER)
        return false;
    if (code == ESTALE) /* the reply raced our forget of its buffer: the daemon knows now */
        return pending_submit(conn, p) == 0;
    /* A refill a caller took over, refused by the daemon's stock reserve (EAGAIN): asked
     * again plainly (p->refill is false now, so it goes without the stock flag). */
    if (code == EAGAIN && p->stock_sent)
        return pending_submit(conn, p) == 0;
    if (p->retried)
        return false;
    bool lease = p->op == PROTO_OP_LEASE || p->op == PROTO_OP_LEASE_MANY;
    if (!(lease && (code == ENOSPC || code == EDQUOT)) && !(p->op == PROTO_OP_ACQUIRE && code == EDQUOT))
        return false;
    unsigned freed = stock_return(conn) + mapcache_drop_idle(&conn->cache);
    /* A lease that may wait and went without its wait (wait_now) goes again with it. */
    if (freed == 0 && stock_inflight(conn) == 0 && !p->wait_held)
        return false;
    p->retried = true;
    if (stock_inflight(conn) > 0)
        return pending_park(conn, p) == 0;
    return pending_submit(conn, p) == 0;
}

/* answered: a refill is counted once: one taken over and sent again is a plain lease */
static void lease_answered(shmref_conn *conn, struct pending *p)
{
    if (p->refill) {
        conn->stock.out--;
        p->refill = false;
    }
}

/* settled: requests parked for the stock's refills go once none is out */
static void lease_settled(shmref_conn *conn)
{
    if (stock_inflight(conn) == 0)
        pending_resend_parked(conn);
}

static void lease_release(shmref_conn *conn, struct pending *p)
{
    (void)conn;
    if (p->buf)
        handle_drop(p->buf);
    p->buf = NULL;
    for (unsigned i = 0; p->bufs && i < p->n; i++)
        if (p->bufs[i])
            handle_drop(p->bufs[i]);
}

const struct pending_ops stock_lease_ops = {
    .send = lease_send,
    .take = lease_reply,
    .refused = stock_retry,
    .answered = lease_answered,
    .settled = lease_settled,
    .finish = stock_arrived,
    .release = lease_release,
};

struct pending *stock_lease_new(shmref_conn *conn, uint8_t owner, uint64_t size, size_t want, uint32_t wait_ms)
{
    struct pending *p = pending_new(conn, PROTO_OP_LEASE, owner, &stock_lease_ops);
    if (p) {
        p->size = size;
        p->want = want;
        p->wait_ms = wait_ms;
    }
    return p;
}
