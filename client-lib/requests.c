/* SPDX-License-Identifier: MIT */
/* requests.c: libshmref's outstanding requests. Every request that expects a reply is a
 * record in the connection's table, keyed by its id (a tsearch(3) tree), until its reply
 * is taken in; the record's own handler turns the reply into its result at once (a handle
 * mapped, a status copied), so replies may be taken in by whichever call is running. A
 * blocking call is a submit and a wait for that one record; the event-loop API delivers
 * the records of submits as completions (eventloop.c); the stock owns its refills. The
 * table knows no request kind: each record's module gave it its handlers. */
#include "requests.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "transport.h"

struct pending *pending_new(shmref_conn *conn, uint32_t op, uint8_t owner, const struct pending_ops *ops)
{
    /* Refused before anything is allocated: a loop of refused submits costs nothing. */
    if (conn->n_records >= conn->max_requests) {
        client_fail(conn, -ENOBUFS, "%s refused: %u requests outstanding or not collected, the limit is %u "
                    "(shmref_set_limits, $SHMREF_MAX_REQUESTS); take completions in first",
                    proto_op_name(op), conn->n_records, conn->max_requests);
        return NULL;
    }
    struct pending *p = calloc(1, sizeof(*p));
    if (!p) {
        client_fail(conn, -ENOMEM, "out of memory");
        return NULL;
    }
    p->op = op;
    p->owner = owner;
    p->ops = ops;
    conn->n_records++;
    return p;
}

/* unhold: the request no longer refers to its handle; a handle released meanwhile goes now
 * (p->buf is then NULL). */
void pending_unhold(struct pending *p)
{
    if (p->holds) {
        p->holds = false;
        if (p->ops && p->ops->unhold)
            p->ops->unhold(p);
    }
}

int pending_new_error(const shmref_conn *conn)
{
    return conn->n_records >= conn->max_requests ? -ENOBUFS : -ENOMEM;
}

void pending_free(shmref_conn *conn, struct pending *p)
{
    if (!p)
        return;
    pending_unhold(p);
    if (p->ops && p->ops->release)
        p->ops->release(conn, p);
    if (p->ops && p->ops->dispose)
        p->ops->dispose(p);
    free(p->bufs);
    free(p->sizes);
    free(p->errmsg);
    free(p);
    conn->n_records--;
}

void pending_set_error(struct pending *p, int err, const char *msg)
{
    p->result = err;
    free(p->errmsg);
    p->errmsg = strdup(msg ? msg : "");
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
    if (p->parked) {
        p->parked = false;
        conn->n_parked--;
    }
    if (p->id && find(conn, p->id) == p)
        tdelete(p, &conn->by_id, cmp_id);
    if (p->prev) p->prev->next = p->next; else conn->out = p->next;
    if (p->next) p->next->prev = p->prev; else conn->out_tail = p->prev;
    p->next = p->prev = NULL;
    conn->n_out--;
}

int pending_submit_msg(shmref_conn *conn, struct pending *p, struct proto_msg *req)
{
    /* A stock refill waits for the next message: nobody waits for it yet (a wait flushes) */
    int r = p->refill ? client_send_later(conn, req) : client_send(conn, req);
    if (r < 0)
        return r;
    p->id = req->id;
    if ((r = link_out(conn, p)) < 0) {
        p->id = 0;
        return r;
    }
    return 0;
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
        if (p->ops && p->ops->finish)
            p->ops->finish(conn, p);
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
        if (p->ops && p->ops->answered)
            p->ops->answered(conn, p);
        pending_set_error(p, err, msg);
        if (p->owner == PENDING_STOCK)
            p->owner = PENDING_DROP;
        pending_complete(conn, p);
    }
}

void pending_settle(shmref_conn *conn)
{
    if (conn->failed && conn->out)
        pending_fail_all(conn, conn->failed, conn->fail_msg);
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
        if (p->ops && p->ops->dispose)
            p->ops->dispose(p);
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
    conn->n_out = conn->n_parked = conn->n_records = 0;
}

int pending_send_plain(shmref_conn *conn, struct pending *p)
{
    struct proto_msg req = { .op = p->op };
    return pending_submit_msg(conn, p, &req);
}

int pending_submit(shmref_conn *conn, struct pending *p)
{
    if (!p->ops) /* a ping: nothing in it */
        return pending_send_plain(conn, p);
    return p->ops->send ? p->ops->send(conn, p) : -EINVAL;
}

/* resendable: whether p can go again, unchanged, on a new connection: it has a send
 * handler (a ping needs none) and refers to no handle of the old one. */
static bool resendable(const struct pending *p)
{
    return (!p->ops || p->ops->send) && !p->holds;
}

struct pending *pending_detach_all(shmref_conn *conn, bool *ret_ok)
{
    *ret_ok = true;
    for (struct pending *p = conn->out; p; p = p->next)
        if (p->owner != PENDING_STOCK && p->owner != PENDING_DROP && !resendable(p))
            *ret_ok = false;
    if (!*ret_ok)
        return NULL;
    struct pending *head = NULL, **tail = &head;
    while (conn->out) {
        struct pending *p = conn->out;
        unlink_out(conn, p);
        if (p->ops && p->ops->answered) /* a refill stops counting as one (the stock's) */
            p->ops->answered(conn, p);
        if (p->owner == PENDING_STOCK || p->owner == PENDING_DROP) {
            pending_free(conn, p); /* never answered: it brings nothing to give back */
            continue;
        }
        p->id = 0;
        *tail = p;
        tail = &p->next;
    }
    return head;
}

void pending_attach(shmref_conn *conn, struct pending *list, int err, const char *msg)
{
    while (list) {
        struct pending *p = list;
        list = p->next;
        p->next = p->prev = NULL;
        if (err < 0 || pending_submit(conn, p) < 0) { /* sent with a new id, or failed */
            pending_set_error(p, err < 0 ? err : -ECONNRESET, err < 0 ? msg : conn->errmsg);
            pending_complete(conn, p);
        }
    }
}

int pending_park(shmref_conn *conn, struct pending *p)
{
    conn->n_parked++;
    p->parked = true;
    p->id = 0; /* never an id: no reply matches it */
    return link_out(conn, p);
}

void pending_resend_parked(shmref_conn *conn)
{
    if (conn->n_parked == 0)
        return;
    for (struct pending *p = conn->out, *next; p; p = next) {
        next = p->next;
        if (!p->parked)
            continue;
        unlink_out(conn, p);
        if (pending_submit(conn, p) < 0) {
            pending_set_error(p, -ECONNRESET, conn->errmsg);
            pending_complete(conn, p);
        }
    }
}

/* stray: a message that answers nothing outstanding: what it brings is given back
 * (conn->on_stray); an error (a one-way publish or release refused: a library bug or a
 * hostile daemon) is kept for the next call's shmref_errmsg. */
static void stray(shmref_conn *conn, const struct proto_msg *rep, int *fds, unsigned nfds, bool lost)
{
    if (conn->on_stray)
        conn->on_stray(conn, rep, fds, nfds, lost);
    else
        for (unsigned i = 0; i < nfds; i++)
            close(fds[i]);
    if (rep->op == PROTO_OP_ERROR)
        snprintf(conn->late, sizeof(conn->late), "shmrefd refused an earlier one-way request (id %u): %.*s",
                 (unsigned)rep->id, (int)rep->u.error.msg_len, rep->u.error.msg);
}

/* dispatch: one message taken in, handed to its record's handlers. */
static void dispatch(shmref_conn *conn, const struct proto_msg *rep, int *fds, unsigned nfds, bool lost)
{
    struct pending *p = find(conn, rep->id);
    if (!p) {
        stray(conn, rep, fds, nfds, lost);
        return;
    }
    unlink_out(conn, p);
    const struct pending_ops *ops = p->ops;
    if (ops && ops->answered)
        ops->answered(conn, p);
    char keep[sizeof(conn->errmsg)];
    memcpy(keep, conn->errmsg, sizeof(keep));
    if (rep->op == PROTO_OP_ERROR) {
        for (unsigned i = 0; i < nfds; i++)
            close(fds[i]);
        if (ops && ops->refused && ops->refused(conn, p, rep->u.error.code)) {
            memcpy(conn->errmsg, keep, sizeof(keep));
            if (ops->settled)
                ops->settled(conn);
            return;
        }
        char msg[PROTO_MAX_ERRMSG + 1];
        snprintf(msg, sizeof(msg), "%.*s", (int)rep->u.error.msg_len, rep->u.error.msg);
        pending_set_error(p, -rep->u.error.code, msg);
    } else if (rep->op != p->op + PROTO_OP_REPLY) {
        stray(conn, rep, fds, nfds, lost);
        char msg[128];
        snprintf(msg, sizeof(msg), "shmrefd answered %s with %s", proto_op_name(p->op), proto_op_name(rep->op));
        pending_set_error(p, -EPROTO, msg);
    } else if (ops && ops->take) {
        int r = ops->take(conn, p, rep, fds, nfds, lost);
        /* A reply that raced our own forget of its buffer (handle.c): asked once more. */
        if (r == -ESTALE && !p->stale_retried && (p->op == PROTO_OP_LEASE || p->op == PROTO_OP_ACQUIRE) &&
            ops->refused) {
            p->stale_retried = true;
            memcpy(conn->errmsg, keep, sizeof(keep));
            if (ops->refused(conn, p, ESTALE)) {
                if (ops->settled)
                    ops->settled(conn);
                return;
            }
        }
        if (r < 0 && !p->errmsg)
            pending_set_error(p, r, conn->errmsg);
    } else {
        for (unsigned i = 0; i < nfds; i++)
            close(fds[i]);
    }
    memcpy(conn->errmsg, keep, sizeof(keep));
    pending_complete(conn, p);
    if (ops && ops->settled)
        ops->settled(conn);
}

int pending_intake(shmref_conn *conn)
{
    if (conn->failed) {
        pending_settle(conn);
        return conn->failed;
    }
    if ((conn->q || conn->later) && client_flush(conn) < 0) {
        pending_settle(conn);
        return conn->failed ? conn->failed : -EIO;
    }
    while (conn->n_out > 0) {
        struct proto_msg rep;
        int fds[PROTO_MAX_BATCH];
        unsigned nfds = 0;
        bool lost = false;
        int r = client_recv(conn, &rep, fds, &nfds, &lost);
        /* Closed by the daemon for idleness: what is outstanding it never read, and goes
         * again on a new connection when nothing is lost by it (conn->revive). */
        if (r < 0 && conn->idle_closed && conn->revive && conn->revive(conn) == 0)
            continue;
        if (r < 0) {
            pending_settle(conn);
            return r;
        }
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
                pending_set_error(p, r, conn->fail_msg);
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
