/* SPDX-License-Identifier: MIT */
/* pending.c: libshmref's outstanding requests. Every request that expects a reply is a
 * record in the connection's table, keyed by its id, until its reply is taken in; the
 * reply is turned into the record's result at once (a handle mapped, a status copied, an
 * error's message kept), so replies may be taken in by whichever call is running. A
 * blocking call is a submit and a wait for that one record; the event-loop API delivers
 * the records of submits as completions (eventloop.c); the stock owns its refills. */
#include "client.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

struct pending *pending_new(shmref_conn *conn, uint32_t op, uint8_t owner)
{
    struct pending *p = calloc(1, sizeof(*p));
    if (!p) {
        client_fail(conn, -ENOMEM, "out of memory");
        return NULL;
    }
    p->op = op;
    p->owner = owner;
    return p;
}

/* unhold: the request no longer refers to its handle; a handle released meanwhile goes now
 * (p->buf is then NULL). */
void pending_unhold(struct pending *p)
{
    if (p->holds) {
        p->holds = false;
        p->buf = lease_unhold(p->buf);
    }
}

void pending_free(shmref_conn *conn, struct pending *p)
{
    if (!p)
        return;
    pending_unhold(p);
    if (p->op != PROTO_OP_PUBLISH && p->buf)
        lease_drop(p->buf);
    for (unsigned i = 0; p->bufs && i < p->n; i++)
        if (p->bufs[i])
            lease_drop(p->bufs[i]);
    (void)conn;
    shmref_status_free(p->status);
    free(p->bufs);
    free(p->sizes);
    free(p->errmsg);
    free(p);
}

static void set_error(struct pending *p, int err, const char *msg)
{
    p->result = err;
    free(p->errmsg);
    p->errmsg = strdup(msg ? msg : "");
}

static void build(const struct pending *p, struct proto_msg *req)
{
    *req = (struct proto_msg){ .op = p->op };
    switch (p->op) {
    case PROTO_OP_LEASE:
        req->u.lease.size = p->size;
        req->u.lease.wait_ms = p->wait_ms;
        break;
    case PROTO_OP_ACQUIRE:
        memcpy(req->u.acquire.token, p->desc.token, PROTO_TOKEN_LEN);
        req->u.acquire.wait_ms = p->wait_ms;
        break;
    case PROTO_OP_LEASE_MANY:
        req->u.lease_many.n = p->n;
        req->u.lease_many.wait_ms = p->wait_ms;
        memcpy(req->u.lease_many.sizes, p->sizes, p->n * sizeof(uint64_t));
        break;
    default: /* status, ping: no fields */
        break;
    }
}

static int cmp_id(const void *a, const void *b)
{
    uint32_t x = ((const struct pending *)a)->id, y = ((const struct pending *)b)->id;
    return x == y ? 0 : x < y ? -1 : 1;
}

/* find: the outstanding request with id (never a parked one: they have none). */
static struct pending *find(shmref_conn *conn, uint32_t id)
{
    struct pending key = { .id = id };
    void *n = id ? tfind(&key, &conn->by_id, cmp_id) : NULL;
    return n ? *(struct pending **)n : NULL;
}

bool pending_id_taken(shmref_conn *conn, uint32_t id)
{
    return find(conn, id) != NULL;
}

/* link_out: list p as outstanding, last; a request with an id is found by it. */
static int link_out(shmref_conn *conn, struct pending *p)
{
    if (p->id && !tsearch(p, &conn->by_id, cmp_id))
        return client_fail(conn, -ENOMEM, "out of memory");
    p->next = NULL;
    p->prev = conn->out_tail;
    if (conn->out_tail)
        conn->out_tail->next = p;
    else
        conn->out = p;
    conn->out_tail = p;
    conn->n_out++;
    return 0;
}

/* unlink_out: take p out of the table. */
static void unlink_out(shmref_conn *conn, struct pending *p)
{
    if (p->id && find(conn, p->id) == p)
        tdelete(p, &conn->by_id, cmp_id);
    if (p->prev) p->prev->next = p->next; else conn->out = p->next;
    if (p->next) p->next->prev = p->prev; else conn->out_tail = p->prev;
    p->next = p->prev = NULL;
    conn->n_out--;
}

int pending_submit_msg(shmref_conn *conn, struct pending *p, struct proto_msg *req)
{
    if (conn->n_out >= conn->max_requests)
        return client_fail(conn, -ENOBUFS, "%s refused: %u requests outstanding, the limit is %u "
                           "(shmref_set_limits, $SHMREF_MAX_REQUESTS); take completions in first",
                           proto_op_name(p->op), conn->n_out, conn->max_requests);
    int r = client_send(conn, req);
    if (r < 0)
        return r;
    p->id = req->id;
    if ((r = link_out(conn, p)) < 0) {
        p->id = 0;
        return r;
    }
    return 0;
}

int pending_submit(shmref_conn *conn, struct pending *p)
{
    struct proto_msg req;
    build(p, &req);
    return pending_submit_msg(conn, p, &req);
}

int pending_budget(const shmref_conn *conn, uint32_t extra_ms)
{
    if (conn->timeout_ms <= 0)
        return 0;
    int64_t ms = (int64_t)conn->timeout_ms + extra_ms;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

void pending_complete(shmref_conn *conn, struct pending *p)
{
    if (p->owner != PENDING_USER) /* a submit's completion holds it until it is delivered */
        pending_unhold(p);
    switch (p->owner) {
    case PENDING_WAIT:
        p->done = true;
        break;
    case PENDING_USER:
        p->next = NULL;
        if (conn->done_tail)
            conn->done_tail->next = p;
        else
            conn->done = p;
        conn->done_tail = p;
        break;
    case PENDING_STOCK:
        stock_arrived(conn, p);
        pending_free(conn, p);
        break;
    default:
        pending_free(conn, p);
        break;
    }
}

void pending_fail_all(shmref_conn *conn, int err, const char *msg)
{
    while (conn->out) {
        struct pending *p = conn->out;
        unlink_out(conn, p);
        set_error(p, err, msg);
        if (p->owner == PENDING_STOCK)
            p->owner = PENDING_DROP;
        pending_complete(conn, p);
    }
    stock_reset(conn);
}

void pending_orphan_all(shmref_conn *conn)
{
    for (struct pending *p = conn->out; p; p = p->next) {
        pending_unhold(p); /* a handle a request refers to is the closer's to release now */
        if (p->owner != PENDING_WAIT)
            p->owner = PENDING_DROP;
    }
    while (conn->done) {
        struct pending *p = conn->done;
        conn->done = p->next;
        pending_free(conn, p);
    }
    conn->done_tail = NULL;
    while (conn->delivered) {
        struct pending *p = conn->delivered;
        conn->delivered = p->next;
        pending_free(conn, p);
    }
}

static void discard_list(struct pending *p)
{
    while (p) {
        struct pending *next = p->next;
        if (p->holds && p->buf)
            p->buf->busy--;
        shmref_status_free(p->status);
        free(p->bufs);
        free(p->sizes);
        free(p->errmsg);
        free(p);
        p = next;
    }
}

static void no_free(void *p)
{
    (void)p; /* the records are freed from the list */
}

void pending_discard(shmref_conn *conn)
{
    /* The handles records hold are in conn->bufs, freed by shmref_close already. */
    tdestroy(conn->by_id, no_free);
    conn->by_id = NULL;
    discard_list(conn->out);
    discard_list(conn->done);
    discard_list(conn->delivered);
    conn->out = conn->out_tail = conn->done = conn->done_tail = conn->delivered = NULL;
    conn->n_out = 0;
}

/* forget_fd: the daemon counts the fd of buffer buf_id as sent (fd-once) though this
 * process does not keep it: say so, so the next lease or acquire of it brings one. */
static void forget_fd(shmref_conn *conn, uint64_t buf_id, bool writable)
{
    client_forget(conn, buf_id, writable);
}

/* undo_reply: a lease, acquire or lease_many reply whose handles nobody will have:
 * release them and forget the fds that came (or were meant to come) with them. */
static void undo_reply(shmref_conn *conn, const struct proto_msg *rep, int *fds, unsigned nfds, bool lost)
{
    for (unsigned i = 0; i < nfds; i++)
        close(fds[i]);
    if (rep->op == PROTO_OP_LEASE + PROTO_OP_REPLY || rep->op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY) {
        bool writable = rep->op == PROTO_OP_LEASE + PROTO_OP_REPLY;
        client_release_handle(conn, rep->u.lease_reply.handle);
        if (nfds > 0 || lost)
            forget_fd(conn, rep->u.lease_reply.buf_id, writable);
    } else if (rep->op == PROTO_OP_LEASE_MANY + PROTO_OP_REPLY) {
        for (uint32_t i = 0; i < rep->u.lease_many_reply.n; i++) {
            const struct proto_item *it = &rep->u.lease_many_reply.items[i];
            client_release_handle(conn, it->handle);
            if (it->has_fd)
                forget_fd(conn, it->buf_id, true);
        }
    }
}

/* stray: a message that answers nothing outstanding: a handle it brings is released; an
 * error (a one-way publish or release refused: a library bug or a hostile daemon) is
 * kept for the next call's shmref_errmsg. */
static void stray(shmref_conn *conn, const struct proto_msg *rep, int *fds, unsigned nfds, bool lost)
{
    undo_reply(conn, rep, fds, nfds, lost);
    if (rep->op == PROTO_OP_ERROR)
        snprintf(conn->late, sizeof(conn->late), "shmrefd refused an earlier one-way request (id %u): %.*s",
                 (unsigned)rep->id, (int)rep->u.error.msg_len, rep->u.error.msg);
}

/* lost_error: a reply whose fd this process could not receive (it is at its open-file
 * limit): the handle is released and the buffer forgotten; the request fails EMFILE. */
static void lost_error(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds,
                       unsigned nfds)
{
    undo_reply(conn, rep, fds, nfds, true);
    bool writable = p->op != PROTO_OP_ACQUIRE;
    struct rlimit rl;
    unsigned long long lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (unsigned long long)rl.rlim_cur : 0;
    char msg[192];
    snprintf(msg, sizeof(msg), "the %s's fd could not be received: this process is at its open-file limit "
             "(RLIMIT_NOFILE %llu); the %s was released", writable ? "lease" : "acquired buffer",
             lim, writable ? "lease" : "buffer");
    set_error(p, -EMFILE, msg);
}

/* retry: a lease refused for space or quota (or an acquire for quota) is sent once more
 * after the stock is returned and idle mappings (which pin evicted pages charged to this
 * client) are dropped; while refills are still out it waits for them (parked), so their
 * leases are back too. True when p was sent again or parked. */
static bool retry(shmref_conn *conn, struct pending *p, int code)
{
    if (p->retried || (p->owner != PENDING_WAIT && p->owner != PENDING_USER))
        return false;
    bool lease = p->op == PROTO_OP_LEASE || p->op == PROTO_OP_LEASE_MANY;
    if (!(lease && (code == ENOSPC || code == EDQUOT)) && !(p->op == PROTO_OP_ACQUIRE && code == EDQUOT))
        return false;
    unsigned freed = stock_return(conn) + mapcache_drop_idle(&conn->cache);
    if (freed == 0 && stock_inflight(conn) == 0)
        return false;
    p->retried = true;
    if (stock_inflight(conn) > 0) {
        p->parked = true;
        p->id = 0; /* never an id: no reply matches it */
        return link_out(conn, p) == 0;
    }
    return pending_submit(conn, p) == 0;
}

void pending_resend_parked(shmref_conn *conn)
{
    if (stock_inflight(conn) > 0)
        return;
    for (struct pending *p = conn->out, *next; p; p = next) {
        next = p->next;
        if (!p->parked)
            continue;
        unlink_out(conn, p);
        p->parked = false;
        if (pending_submit(conn, p) < 0) {
            set_error(p, -ECONNRESET, conn->errmsg);
            pending_complete(conn, p);
        }
    }
}

/* take_many: a lease_many reply's leases, fds attached in item order. */
static int take_many(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds)
{
    const struct proto_item *items = rep->u.lease_many_reply.items;
    uint32_t n = rep->u.lease_many_reply.n;
    unsigned fi = 0;
    int r = 0;
    if (n != p->n) {
        undo_reply(conn, rep, fds, nfds, false);
        return client_fail(conn, -EPROTO, "shmrefd answered a lease_many of %u with %u leases", p->n, (unsigned)n);
    }
    if (!(p->bufs = calloc(n, sizeof(*p->bufs)))) {
        undo_reply(conn, rep, fds, nfds, false);
        return client_fail(conn, -ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < n; i++) {
        int fd = items[i].has_fd && fi < nfds ? fds[fi++] : -1;
        if (r < 0) { /* after a failure: undo the rest */
            if (fd >= 0) {
                close(fd);
                forget_fd(conn, items[i].buf_id, true);
            }
            client_release_handle(conn, items[i].handle);
            continue;
        }
        r = lease_take(conn, items[i].handle, items[i].buf_id, items[i].size, items[i].capacity, items[i].token,
                       NULL, 0, 0, fd, true, false, &p->bufs[i]);
    }
    while (fi < nfds)
        close(fds[fi++]);
    return r;
}

/* take_reply: the successful reply rep to p, as p's result (0 or -errno, message set). */
static int take_reply(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds)
{
    int fd = nfds > 0 ? fds[0] : -1;
    for (unsigned i = 1; i < nfds && p->op != PROTO_OP_LEASE_MANY; i++)
        close(fds[i]);
    switch (p->op) {
    case PROTO_OP_HELLO:
        if (fd >= 0)
            close(fd);
        if (rep->u.hello_reply.version != PROTO_VERSION)
            return client_fail(conn, -EPROTONOSUPPORT, "shmrefd speaks protocol %u, this library %d",
                               (unsigned)rep->u.hello_reply.version, PROTO_VERSION);
        conn->daemon_pid = (pid_t)rep->u.hello_reply.pid;
        conn->features = rep->u.hello_reply.features;
        conn->max_lease = rep->u.hello_reply.max_lease;
        return 0;
    case PROTO_OP_LEASE:
    case PROTO_OP_ACQUIRE: {
        const typeof(rep->u.lease_reply) *l = &rep->u.lease_reply;
        bool writable = p->op == PROTO_OP_LEASE;
        if (!writable && l->size != p->desc.size) {
            undo_reply(conn, rep, &fd, fd >= 0, false);
            return client_fail(conn, -EINVAL, "descriptor says %llu bytes, the buffer has %llu",
                               (unsigned long long)p->desc.size, (unsigned long long)l->size);
        }
        int r = lease_take(conn, l->handle, l->buf_id, l->size, l->capacity, l->token, l->meta, l->meta_len,
                           l->flags, fd, writable, p->require_sealed, &p->buf);
        if (r == 0 && writable && (p->owner == PENDING_WAIT || p->owner == PENDING_USER)) {
            p->buf->size = p->want;
            stock_learn(conn, p->want, p->buf->capacity);
        }
        return r;
    }
    case PROTO_OP_LEASE_MANY:
        return take_many(conn, p, rep, fds, nfds);
    case PROTO_OP_STATUS:
        if (fd >= 0)
            close(fd);
        return status_from_reply(conn, rep, &p->status);
    case PROTO_OP_PUBLISH:
        if (fd >= 0)
            close(fd);
        memcpy(p->desc.token, rep->u.publish_reply.token, SHMREF_TOKEN_LEN);
        p->desc.size = rep->u.publish_reply.size;
        if (p->buf)
            p->buf->published = true;
        return 0;
    default:
        if (fd >= 0)
            close(fd);
        return 0;
    }
}

/* dispatch: one message taken in. */
static void dispatch(shmref_conn *conn, const struct proto_msg *rep, int *fds, unsigned nfds, bool lost)
{
    struct pending *p = find(conn, rep->id);
    if (!p) {
        stray(conn, rep, fds, nfds, lost);
        return;
    }
    unlink_out(conn, p);
    bool refill = p->refill;
    if (refill) { /* counted once: a refill taken over and sent again is a plain lease */
        conn->stock.out--;
        p->refill = false;
    }
    char keep[sizeof(conn->errmsg)];
    memcpy(keep, conn->errmsg, sizeof(keep));
    if (rep->op == PROTO_OP_ERROR) {
        for (unsigned i = 0; i < nfds; i++)
            close(fds[i]);
        if (retry(conn, p, rep->u.error.code)) {
            memcpy(conn->errmsg, keep, sizeof(keep));
            if (refill)
                pending_resend_parked(conn);
            return;
        }
        char msg[PROTO_MAX_ERRMSG + 1];
        snprintf(msg, sizeof(msg), "%.*s", (int)rep->u.error.msg_len, rep->u.error.msg);
        set_error(p, -rep->u.error.code, msg);
    } else if (rep->op != p->op + PROTO_OP_REPLY) {
        undo_reply(conn, rep, fds, nfds, lost);
        char msg[128];
        snprintf(msg, sizeof(msg), "shmrefd answered %s with %s", proto_op_name(p->op), proto_op_name(rep->op));
        set_error(p, -EPROTO, msg);
    } else if (lost && (p->op == PROTO_OP_LEASE || p->op == PROTO_OP_ACQUIRE || p->op == PROTO_OP_LEASE_MANY)) {
        lost_error(conn, p, rep, fds, nfds);
    } else {
        int r = take_reply(conn, p, rep, fds, nfds);
        if (r < 0)
            set_error(p, r, conn->errmsg);
    }
    memcpy(conn->errmsg, keep, sizeof(keep));
    pending_complete(conn, p);
    if (refill)
        pending_resend_parked(conn);
}

int pending_intake(shmref_conn *conn)
{
    if (conn->failed)
        return conn->failed;
    if (conn->q && client_flush(conn) < 0)
        return conn->failed ? conn->failed : -EIO;
    while (conn->n_out > 0) {
        struct proto_msg rep;
        int fds[PROTO_MAX_BATCH];
        unsigned nfds = 0;
        bool lost = false;
        int r = client_recv(conn, &rep, fds, &nfds, &lost);
        if (r < 0)
            return r;
        if (r == 0)
            break;
        dispatch(conn, &rep, fds, nfds, lost);
    }
    return 0;
}

int pending_wait(shmref_conn *conn, struct pending *p, int ms)
{
    int64_t deadline = ms > 0 ? client_mono_ms() + ms : -1;
    bool waited = false;
    if (!p->done) /* a blocking call needs the daemon's answer: a round trip, in already or not */
        conn->counters.round_trips++;
    for (;;) {
        int r = pending_intake(conn);
        if (p->done)
            break;
        if (r < 0) { /* the connection broke: pending_fail_all has failed p */
            if (!p->done)
                set_error(p, r, conn->fail_msg);
            break;
        }
        int left = -1;
        if (deadline >= 0 && (left = (int)(deadline - client_mono_ms())) <= 0) {
            char msg[192];
            int extra = conn->timeout_ms > 0 ? ms - conn->timeout_ms : 0;
            if (extra > 0)
                snprintf(msg, sizeof(msg), "%s: no answer from shmrefd within %d ms (the %d ms timeout and the "
                         "%d ms the daemon may wait)", proto_op_name(p->op), ms, conn->timeout_ms, extra);
            else
                /* the connection's timeout, not what was left of it (the hello follows the connect) */
                snprintf(msg, sizeof(msg), "%s: no answer from shmrefd within %d ms", proto_op_name(p->op),
                         conn->timeout_ms > 0 && ms <= conn->timeout_ms ? conn->timeout_ms : ms);
            conn->abandoned = proto_op_name(p->op);
            pending_fail_all(conn, -ETIMEDOUT, msg);
            break;
        }
        if (!waited) {
            conn->counters.waits++;
            waited = true;
        }
        struct pollfd pf = { .fd = conn->fd, .events = POLLIN | (conn->q ? POLLOUT : 0) };
        if (poll(&pf, 1, left) < 0 && errno != EINTR) {
            int e = errno; /* saved: snprintf may change it */
            char msg[128];
            snprintf(msg, sizeof(msg), "poll failed: %s", strerror(e));
            conn->failed = -e;
            snprintf(conn->fail_msg, sizeof(conn->fail_msg), "%s", msg);
            pending_fail_all(conn, conn->failed, msg);
            break;
        }
    }
    if (p->result < 0)
        snprintf(conn->errmsg, sizeof(conn->errmsg), "%s", p->errmsg ? p->errmsg : "");
    return p->result;
}
