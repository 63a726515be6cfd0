/* SPDX-License-Identifier: MIT */
/* requests.h: libshmref's one table of outstanding requests (hiredis's model). Each
 * record carries its own handlers (struct pending_ops, given by the module that made it)
 * and the submitter's pointer; the table matches replies to records by id (a balanced
 * tree), calls the record's handlers, and delivers completions. It knows no request kind:
 * leases, the stock, status and the hello register their handlers. Bounded: past
 * conn->max_requests a submit is refused with -ENOBUFS. */
#ifndef SHMREF_REQUESTS_H
#define SHMREF_REQUESTS_H

#include "conn.h"

/* pending_new: a request record (calloc'd) for op with its module's handlers (NULL: a
 * reply with nothing in it, a ping); NULL on ENOMEM (message set). */
struct pending *pending_new(shmref_conn *conn, uint32_t op, uint8_t owner, const struct pending_ops *ops);
/* pending_new_error: why the last pending_new failed: -ENOBUFS (past the bound: at most
 * conn->max_requests records outstanding or not collected) or -ENOMEM. */
int pending_new_error(const shmref_conn *conn);
/* pending_free: a record and what it still owns (its release handler, then dispose). */
void pending_free(shmref_conn *conn, struct pending *p);
/* pending_submit: send p by its send handler (a record without handlers, a ping, as
 * pending_send_plain). On failure p is not listed. */
int pending_submit(shmref_conn *conn, struct pending *p);
/* pending_send_plain: the send handler of a request with nothing in it (status, ping). */
int pending_send_plain(shmref_conn *conn, struct pending *p);
/* pending_detach_all: the connection is replaced by a new one (the daemon closed it for
 * idleness, session.c): every outstanding request is taken out of the table, as a list
 * (linked by next) to go again by pending_attach; stock refills and records nobody wants
 * are dropped unanswered. *ret_ok false (NULL returned, nothing changed) when a request
 * cannot go again (it refers to a handle). */
struct pending *pending_detach_all(shmref_conn *conn, bool *ret_ok);
/* pending_attach: the detached requests of list sent again on the new connection (new
 * ids), or, with err < 0, failed with err and msg; a send that fails fails its request. */
void pending_attach(shmref_conn *conn, struct pending *list, int err, const char *msg);
/* pending_submit_msg: send req (built by the record's module) and list p as outstanding.
 * On failure p is not listed (the caller frees it): -ENOBUFS past the table's bound. */
int pending_submit_msg(shmref_conn *conn, struct pending *p, struct proto_msg *req);
/* pending_park: list p without sending it (no id: no reply matches it) until
 * pending_resend_parked. */
int pending_park(shmref_conn *conn, struct pending *p);
/* pending_resend_parked: send every parked record again (its send handler). */
void pending_resend_parked(shmref_conn *conn);
/* pending_orphan_all: every outstanding request becomes PENDING_DROP (a handle it holds
 * is unheld), every undelivered completion is dropped (pending_free): at shmref_close. */
void pending_orphan_all(shmref_conn *conn);
/* pending_discard: free every record without sending anything or calling a handler but
 * dispose (teardown, or a forked child forgetting its parent's requests). */
void pending_discard(shmref_conn *conn);
/* pending_intake: take in every reply that has arrived, without blocking (no syscall when
 * nothing is outstanding), after flushing queued messages. 0, or -errno: the connection
 * broke (every outstanding request then fails with it). */
int pending_intake(shmref_conn *conn);
/* pending_wait: block until p (a PENDING_WAIT listed by pending_submit_msg) is answered,
 * at most ms (0: no limit), handling every other reply meanwhile. Returns p's result,
 * its message in conn->errmsg. Past ms the connection is abandoned (-ETIMEDOUT). */
int pending_wait(shmref_conn *conn, struct pending *p, int ms);
/* pending_budget: the connection's timeout plus extra ms (0: no limit). */
int pending_budget(const shmref_conn *conn, uint32_t extra_ms);
/* pending_fail_all: the connection broke: every outstanding request fails with err. */
void pending_fail_all(shmref_conn *conn, int err, const char *msg);
/* pending_settle: a failed connection's outstanding requests fail now (if any). */
void pending_settle(shmref_conn *conn);
/* pending_unhold: p no longer refers to the handle it holds (its unhold handler). */
void pending_unhold(struct pending *p);
/* pending_id_taken: whether a request with id is outstanding (conn->id_taken). */
bool pending_id_taken(shmref_conn *conn, uint32_t id);
/* pending_complete: p is finished: a PENDING_USER goes to the completion queue, a
 * PENDING_WAIT is marked done, a PENDING_STOCK goes to its finish handler, the others are
 * freed. */
void pending_complete(shmref_conn *conn, struct pending *p);
/* pending_set_error: p's result is err with message msg (copied). */
void pending_set_error(struct pending *p, int err, const char *msg);

#endif
