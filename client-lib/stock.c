/* SPDX-License-Identifier: MIT */
/* stock.c: the lease stock of a connection. After the first lease of a size (a round
 * trip), `depth` more leases of its size class are asked for without waiting and kept
 * ready; a later lease of that class takes one at once and asks for one more. Stock
 * leases are leases like any other (charged to quota, in status), returned when unused:
 * at close, when a lease or acquire meets EDQUOT/ENOSPC, when their class is the least
 * recently used of more than STOCK_CLASSES. */
#include "client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>


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
    return conn->stock.depth > 0 && size <= STOCK_MAX_SIZE;
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
        lease_drop(c->ready[--c->n_ready]);
    c->inflight = 0;
    return n;
}

/* refill: ask for k leases of class c, without waiting. */
static void refill(shmref_conn *conn, struct stock_class *c, unsigned k)
{
    while (k > 0) {
        bool many = CLIENT_WIRE_BATCH && k > 1;
        struct pending *p = pending_new(conn, many ? PROTO_OP_LEASE_MANY : PROTO_OP_LEASE, PENDING_STOCK);
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

void stock_learn(shmref_conn *conn, size_t size, uint64_t capacity)
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

void stock_arrived(shmref_conn *conn, struct pending *p)
{
    shmref_buf **v = p->op == PROTO_OP_LEASE ? &p->buf : p->bufs;
    unsigned n = p->op == PROTO_OP_LEASE ? 1 : p->n;
    struct stock_class *c = by_capacity(conn, p->size);
    if (c)
        c->inflight -= n < c->inflight ? n : c->inflight;
    for (unsigned i = 0; v && i < n; i++) {
        if (!v[i])
            continue;
        if (c && p->result == 0 && c->n_ready < conn->stock.depth)
            c->ready[c->n_ready++] = v[i];
        else
            lease_drop(v[i]);
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

unsigned stock_inflight(const shmref_conn *conn)
{
    return conn->stock.out;
}

void stock_abandon(shmref_conn *conn)
{
    for (unsigned i = 0; i < STOCK_CLASSES; i++) {
        struct stock_class *c = &conn->stock.cls[i];
        while (c->n_ready > 0)
            lease_forget(c->ready[--c->n_ready]); /* inherited: no release */
    }
    stock_reset(conn);
}

void stock_reset(shmref_conn *conn)
{
    for (unsigned i = 0; i < STOCK_CLASSES; i++)
        conn->stock.cls[i].inflight = 0;
    conn->stock.out = 0;
}

int shmref_set_stock(shmref_conn *conn, int depth)
{
    if (!conn || depth < -1 || depth > STOCK_MAX_DEPTH)
        return -EINVAL;
    if (depth == -1) {
        struct stock def;
        stock_init(&def);
        depth = (int)def.depth;
    }
    /* Leases past the new depth are released (lease_drop: one-way on a live connection;
     * on a broken one the daemon has ended them with it, and only their local handles go).
     * Never dropped unreleased. */
    struct stock *st = &conn->stock;
    st->depth = (unsigned)depth;
    for (unsigned i = 0; i < STOCK_CLASSES; i++) {
        struct stock_class *c = &st->cls[i];
        while (c->n_ready > st->depth)
            lease_drop(c->ready[--c->n_ready]);
    }
    if (depth == 0)
        stock_return(conn);
    return 0;
}
