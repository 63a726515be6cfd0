/* SPDX-License-Identifier: MIT */
/* session.h: one client's conversation: hello and features, the handle table and pending
 * leases (its broker_peer), and the fd-once set (which buffers' fds this client was
 * sent). Private to the daemon. The only caller of the broker. A session sits on a
 * transport; it is torn down at a safe point: session_close only marks it closing, and
 * session_disconnected (the transport's close callback) releases what it held, logs, and
 * drops the transport's reference. Its memory goes with the last reference (a lease
 * waiting for a new buffer holds one). */
#ifndef SHMREFD_SESSION_H
#define SHMREFD_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <uv.h>

#include "broker.h"
#include "counters.h"
#include "idset.h"
#include "options.h"
#include "proto.h"
#include "transport.h"

#define SESSION_HELLO_MS 10000   /* a connection that says no hello by then is closed */

/* session_env: what every session shares; owned by the server. */
struct session_env {
    uv_loop_t *loop;
    const struct options *opt;
    struct broker *broker;
    struct counters *counters;
    /* status: writes the status map into buf; returns its length or -EMSGSIZE. */
    int (*status)(void *arg, uint8_t *buf, size_t cap);
    void *status_arg;
    struct session *head;        /* every session not yet disconnected, newest first */
    uint32_t n;
    uint64_t next_id;
};

struct session {
    struct broker_peer peer;     /* id, pid, uid, handles, pending leases */
    gid_t gid;
    char name[PROTO_MAX_NAME + 1];
    bool hello;
    bool fd_once;                /* PROTO_FEAT_FD_ONCE agreed in hello */
    struct idset known;          /* buf_id << 1 | writable: fds this client was sent */
    uint64_t accepted_ms;        /* uv_now at accept, for the hello deadline */
    unsigned refs;
    struct session_env *env;
    struct transport *transport; /* NULL once disconnected */
    struct session *prev, *next;
};

/* session_new: a session on fd (non-blocking, CLOEXEC), which it takes on success. */
int session_new(struct session_env *env, int fd, const struct ucred *cred, struct session **ret);

/* session_send: encode and send m, with fd attached if fd >= 0 (the fd stays the
 * caller's). Returns 0 when sent or queued; on failure the session is closing. */
int session_send(struct session *s, const struct proto_msg *m, int fd);

/* session_fail: an error reply with a formatted message (best effort). */
void session_fail(struct session *s, uint32_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* session_close: marks the session closing, with why for the log (NULL: the peer just
 * left). Idempotent; the session stays usable until session_disconnected has run. */
void session_close(struct session *s, const char *why);

/* session_expire_hello: closes sessions that said no hello within SESSION_HELLO_MS. */
void session_expire_hello(struct session_env *env, uint64_t now_ms);

/* session_count_open: sessions not closing (one that is closing no longer counts against
 * --max-clients, though it is released only at the end of this loop iteration). */
uint32_t session_count_open(const struct session_env *env);

/* session_close_all: session_close for every session (at shutdown). */
void session_close_all(struct session_env *env);

#endif
