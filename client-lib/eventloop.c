/* SPDX-License-Identifier: MIT */
/* eventloop.c: libshmref's event-loop API (the hiredis model): submit requests without
 * waiting, poll the connection's socket, collect completions. Built on the same table of
 * outstanding requests as the blocking calls (pending.c); a submit never blocks. */
#include "handle.h"
#include "lease.h"
#include "requests.h"
#include "session.h"
#include "status.h"
#include "stock.h"
#include "transport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The two getters take a const conn, but in a forked child they first adopt it, as every
 * call does there (session.c): the child must never poll its parent's socket, nor see the
 * parent's requests as its own. conn is never a const object (shmref_connect made it). */
int shmref_conn_fd(const shmref_conn *conn)
{
    if (!conn)
        return -EINVAL;
    shmref_conn *c = (shmref_conn *)conn;
    if (c->fd < 0 || c->pid != client_pid()) {
        int r = client_usable(c); /* a child's own connection, made now (or why it cannot be) */
        if (r < 0)
            return r;
    }
    return c->fd;
}

int shmref_conn_events(const shmref_conn *conn)
{
    if (!conn)
        return -EINVAL;
    client_adopt((shmref_conn *)conn);
    int ev = 0;
    if (conn->n_out > 0)
        ev |= SHMREF_WANT_READ;
    if (conn->q || conn->later)
        ev |= SHMREF_WANT_WRITE;
    if (conn->done || conn->failed || conn->abandoned)
        ev |= SHMREF_READY;
    return ev;
}

int shmref_flush(shmref_conn *conn)
{
    if (!conn)
        return -EINVAL;
    int r = client_usable(conn);
    return r < 0 ? r : client_flush(conn);
}

/* done_now: a submit that needs no daemon (a stock lease, a plain publish, a local
 * acquire): its completion is delivered by the next shmref_complete. */
static int done_now(shmref_conn *conn, struct pending *p)
{
    pending_complete(conn, p);
    return 0;
}

static int submit(shmref_conn *conn, struct pending *p)
{
    int r = pending_submit(conn, p);
    if (r < 0)
        pending_free(conn, p);
    return r;
}

int shmref_lease_submit(shmref_conn *conn, size_t size, unsigned flags, uint32_t wait_ms, void *user)
{
    if (!conn)
        return -EINVAL;
    if (size == 0 || flags || wait_ms > PROTO_MAX_LEASE_WAIT_MS)
        return client_fail(conn, -EINVAL, "lease_submit: size must be at least 1, flags 0 and wait_ms at most %d",
                           PROTO_MAX_LEASE_WAIT_MS);
    int r = client_enter(conn);
    if (r < 0)
        return r;
    if (stock_eligible(conn, size)) {
        shmref_buf *b;
        struct pending *refill = NULL;
        if ((r = stock_take(conn, size, &b, wait_ms ? NULL : &refill)) == 1) {
            struct pending *p = pending_new(conn, PROTO_OP_LEASE, PENDING_USER, &stock_lease_ops);
            if (!p) {
                handle_drop(b);
                return pending_new_error(conn);
            }
            conn->counters.stock_hits++;
            p->user = user;
            p->buf = b;
            return done_now(conn, p);
        }
        conn->counters.stock_misses++;
        if (refill) { /* a refill of this class is on its way: it is this submit's */
            refill->owner = PENDING_USER;
            refill->want = size;
            refill->user = user;
            return 0;
        }
    }
    struct pending *p = stock_lease_new(conn, PENDING_USER, size, size, wait_ms);
    if (!p)
        return pending_new_error(conn);
    p->user = user;
    return submit(conn, p);
}

int shmref_publish_submit(shmref_buf *buf, size_t len, uint32_t keep_ms, uint32_t max_acquires, unsigned flags,
                          const void *meta, size_t meta_len, void *user)
{
    if (!buf || (meta_len && !meta) || meta_len > SHMREF_META_MAX || (flags & ~SHMREF_PUBLISH_SEALED))
        return -EINVAL;
    shmref_conn *conn = buf->conn;
    int r = client_enter(conn);
    if (r < 0 || (r = lease_publish_check(buf, len, flags)) < 0)
        return r;
    struct pending *p = pending_new(conn, PROTO_OP_PUBLISH, PENDING_USER, &lease_publish_ops);
    if (!p)
        return pending_new_error(conn);
    p->user = user;
    r = lease_publish_send(buf, len, keep_ms, max_acquires, flags, meta, meta_len, p, &p->desc);
    if (r < 0) {
        p->buf = NULL;
        pending_free(conn, p);
        return r;
    }
    if (!p->buf) { /* one-way: done */
        p->buf = buf;
        return done_now(conn, p);
    }
    return 0; /* sealed: listed, completes with its reply */
}

int shmref_acquire_submit(shmref_conn *conn, const shmref_desc *desc, unsigned flags, void *user)
{
    if (!conn)
        return -EINVAL;
    if (!desc || (flags & ~(SHMREF_ACQUIRE_SEALED | SHMREF_ACQUIRE_PRIVATE)))
        return client_fail(conn, -EINVAL, "acquire_submit: desc must not be NULL, flags known");
    int r = client_enter(conn);
    if (r < 0)
        return r;
    struct pending *p = pending_new(conn, PROTO_OP_ACQUIRE, PENDING_USER, &lease_acquire_ops);
    if (!p)
        return pending_new_error(conn);
    p->user = user;
    p->desc = *desc;
    p->private_map = (flags & SHMREF_ACQUIRE_PRIVATE) != 0; /* always the daemon's (lease_acquire) */
    if (!p->private_map && ((p->buf = handle_share(conn, desc, flags)) || (p->buf = handle_local(conn, desc, flags))))
        return done_now(conn, p);
    p->wait_ms = (uint32_t)conn->acquire_wait_ms;
    p->require_sealed = (flags & SHMREF_ACQUIRE_SEALED) != 0;
    return submit(conn, p);
}

static int submit_plain(shmref_conn *conn, uint32_t op, const struct pending_ops *ops, void *user)
{
    if (!conn)
        return -EINVAL;
    int r = client_enter(conn);
    if (r < 0)
        return r;
    struct pending *p = pending_new(conn, op, PENDING_USER, ops);
    if (!p)
        return pending_new_error(conn);
    p->user = user;
    struct proto_msg req = { .op = op };
    if ((r = pending_submit_msg(conn, p, &req)) < 0)
        pending_free(conn, p);
    return r;
}

int shmref_status_submit(shmref_conn *conn, void *user)
{
    return submit_plain(conn, PROTO_OP_STATUS, &status_ops, user);
}

int shmref_ping_submit(shmref_conn *conn, void *user)
{
    return submit_plain(conn, PROTO_OP_PING, NULL, user);
}

static int op_of(uint32_t op)
{
    switch (op) {
    case PROTO_OP_LEASE: return SHMREF_OP_LEASE;
    case PROTO_OP_PUBLISH: return SHMREF_OP_PUBLISH;
    case PROTO_OP_ACQUIRE: return SHMREF_OP_ACQUIRE;
    case PROTO_OP_STATUS: return SHMREF_OP_STATUS;
    default: return SHMREF_OP_PING;
    }
}

int shmref_complete(shmref_conn *conn, shmref_completion *ret, size_t max)
{
    if (!conn || (!ret && max))
        return -EINVAL;
    while (conn->delivered) { /* their messages were valid until now */
        struct pending *p = conn->delivered;
        conn->delivered = p->next;
        pending_free(conn, p);
    }
    int r = client_usable(conn);
    if (r == -ECHILD)
        return r;
    if (r == 0)
        pending_intake(conn); /* a failure fails every outstanding request: delivered below */
    else
        pending_settle(conn);
    size_t n = 0;
    while (n < max && conn->done) {
        struct pending *p = conn->done;
        if (!(conn->done = p->next))
            conn->done_tail = NULL;
        pending_unhold(p); /* a handle released while the request was out goes now */
        shmref_completion *c = &ret[n++];
        *c = (shmref_completion){ .user = p->user, .op = op_of(p->op), .result = p->result,
                                  .errmsg = p->errmsg ? p->errmsg : "" };
        if (p->result == 0) {
            c->buf = p->buf;
            c->status = p->status;
            c->desc = p->op == PROTO_OP_ACQUIRE || p->op == PROTO_OP_PUBLISH ? p->desc : c->desc;
            if (p->op == PROTO_OP_ACQUIRE)
                c->desc.size = p->buf->size;
        }
        p->buf = NULL;
        p->status = NULL;
        p->next = conn->delivered;
        conn->delivered = p;
    }
    if (n == 0 && !conn->done && (r = client_usable(conn)) < 0)
        return r;
    return (int)n;
}

int shmref_conn_counter(const shmref_conn *conn, const char *name, uint64_t *ret)
{
    if (!conn || !name || !ret)
        return -EINVAL;
    static const struct { const char *name; size_t off; } names[] = {
        { "waits", offsetof(struct client_counters, waits) },
        { "round_trips", offsetof(struct client_counters, round_trips) },
        { "sent", offsetof(struct client_counters, sent) },
        { "received", offsetof(struct client_counters, received) },
        { "stock_hits", offsetof(struct client_counters, stock_hits) },
        { "stock_misses", offsetof(struct client_counters, stock_misses) },
        { "local_acquires", offsetof(struct client_counters, local_acquires) },
        { "table_leases", offsetof(struct client_counters, table_leases) },
        { "table_publishes", offsetof(struct client_counters, table_publishes) },
        { "table_acquires", offsetof(struct client_counters, table_acquires) },
        { "table_fallbacks", offsetof(struct client_counters, table_fallbacks) },
        { "table_maps", offsetof(struct client_counters, table_maps) },
        { "table_adopts", offsetof(struct client_counters, table_adopts) },
        { "table_givebacks", offsetof(struct client_counters, table_givebacks) },
        { "table_refused", offsetof(struct client_counters, table_refused) },
        { "reconnects", offsetof(struct client_counters, reconnects) },
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i].name) == 0) {
            memcpy(ret, (const char *)&conn->counters + names[i].off, sizeof(*ret));
            return 0;
        }
    return -ENOENT;
}
