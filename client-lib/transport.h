/* SPDX-License-Identifier: MIT */
/* transport.h: libshmref's socket: messages sent without blocking (a send queue with a
 * bound, in order), messages and their fds received, one-way messages, the error
 * message of a connection. Knows nothing of requests, leases or the stock. The lowest
 * layer with mapcache.h. */
#ifndef SHMREF_TRANSPORT_H
#define SHMREF_TRANSPORT_H

#include "conn.h"

/* client_fail: set conn->errmsg and return err (negative). */
int client_fail(shmref_conn *conn, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* client_mono_ms: CLOCK_MONOTONIC in milliseconds. */
int64_t client_mono_ms(void);
/* client_pid: getpid(), with one system call per process instead of one per call (every
 * call of the library compares it with its connection's, to tell a forked child). */
pid_t client_pid(void);
/* transport_ok: whether conn's socket may be used by this process now (connected, not
 * broken or abandoned, and this is the process that connected: never the parent's
 * socket in a forked child). 0 or a negative errno (no message set). */
int transport_ok(const shmref_conn *conn);
/* transport_broken: the socket failed (err, msg): the connection is failed from now on
 * (the request table fails what is outstanding when it next looks). Returns err. */
int transport_broken(shmref_conn *conn, int err, const char *msg);

/* client_send: assign req->id (never 0, never one conn->id_taken says is outstanding)
 * and send it without blocking; a message the socket cannot take now is queued, in
 * order, and sent by the next flush. Past the queue's bound (conn->max_queue_bytes) a
 * request is refused with -ENOBUFS; one-way releases and forgets always pass. 0 or
 * -errno (-EMSGSIZE, -ENOBUFS, or the connection is broken: then its message is set). */
int client_send(shmref_conn *conn, struct proto_msg *req);
/* client_send_later: client_send for a request nobody waits for yet (a stock refill):
 * kept, and sent in one sendmmsg with the next message (a publish, a release), or by the
 * next flush (every wait flushes first). At most CLIENT_LATER_MAX are kept; past that,
 * or while the send queue holds messages, it is client_send. Same returns. */
#define CLIENT_LATER_MAX 8
int client_send_later(shmref_conn *conn, struct proto_msg *req);
/* client_flush: send queued messages (the kept ones first) while the socket takes them:
 * 0 all sent, 1 some remain, -errno. */
int client_flush(shmref_conn *conn);
/* transport_discard: drop every message not sent (a forked child's copy of its
 * parent's, or at the end of the connection). */
void transport_discard(shmref_conn *conn);
/* transport_drop_later: the kept messages (stock refills) are dropped unsent: at a close,
 * their leases would only come back. */
void transport_drop_later(shmref_conn *conn);
/* transport_send_direct: one small one-way message (64 bytes encoded at most) sent now,
 * past the send queue and without touching conn's state (a closed connection's
 * releases, from any thread), if the socket takes it at once. Whether it went. */
bool transport_send_direct(shmref_conn *conn, const struct proto_msg *req);
/* transport_bye: the connection's last message, if the daemon agreed PROTO_FEAT_BYE:
 * what it still has on its way to this connection (the stock's refills) then ends as a
 * clean close, not a death. Sent only if nothing is queued before it (it must be the
 * last) and the socket takes it at once; never by a forked child. Whether it went. */
bool transport_bye(shmref_conn *conn);
/* transport_holds_publish: whether a one-way publish is still in the send queue. */
bool transport_holds_publish(const shmref_conn *conn);
/* transport_flush_wait: flush, waiting for the socket at most ms: 0 all sent, -ETIMEDOUT,
 * -errno. */
int transport_flush_wait(shmref_conn *conn, int ms);
/* client_recv: the next message if one has arrived (never blocks): 1 with *rep and its
 * fds (*ret_nfds of them, at most PROTO_MAX_BATCH; each the caller's), 0 if none yet,
 * -errno if the connection broke. *ret_lost: the fds did not fit (MSG_CTRUNC). */
int client_recv(shmref_conn *conn, struct proto_msg *rep, int *fds, unsigned *ret_nfds, bool *ret_lost);
/* client_forget: tell the daemon (with PROTO_FEAT_FD_ONCE) that this process no longer
 * has buffer buf_id mapped (writable or not), so the next lease or acquire of it comes
 * with an fd. No reply. Nothing is sent unless transport_ok. */
void client_forget(shmref_conn *conn, uint64_t buf_id, bool writable);
/* client_release_handle: a one-way release of a daemon handle (errmsg kept). Nothing is
 * sent unless transport_ok. */
void client_release_handle(shmref_conn *conn, uint64_t handle);

#endif
