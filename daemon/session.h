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
#include "tenantdir.h"
#include "transport.h"

#define SESSION_HELLO_MS 10000   /* a connection that says no hello by then is closed */
#define SESSION_IDLE_VISITS 65536 /* table members one idle sweep may walk (plus one walk) */

/* session_tenant: what one uid's connections share: how many there are (for
 * --max-clients-per-uid) and how many fd-carrying replies they have not read yet (each
 * transport adds its own; the cap on the sum keeps one uid from taking every fd the
 * kernel lets the daemon have in flight). Freed with the uid's last session. */
struct session_tenant {
    uint32_t uid;
    uint32_t conns;
    unsigned fds_unread;
    unsigned parked;             /* requests of the uid waiting in the broker (places) */
    struct session_tenant *next;
};

/* session_env: what every session shares; owned by the server. */
struct session_env {
    uv_loop_t *loop;
    const struct options *opt;
    struct broker *broker;
    struct counters *counters;
    /* status: writes the status map, as uid may see it, into buf; returns its length or
     * -EMSGSIZE. */
    int (*status)(void *arg, uint32_t uid, uint8_t *buf, size_t cap);
    void *status_arg;
    struct session *head;        /* every session not yet disconnected, newest first */
    uint32_t n;
    uint64_t next_id;
    struct session_tenant *tenants; /* one per uid with a session */
    struct tenantdirs *tenantdirs; /* tables (PROTO_FEAT_TABLE); NULL: none offered */
    unsigned fd_cap_conn;        /* unread fd-carrying replies per connection (0: none) */
    unsigned fd_cap_uid;         /* the same, summed over one uid's connections (0: none) */
};

struct session_owed;

struct session {
    struct broker_peer peer;     /* id, pid, uid, handles, pending leases */
    gid_t gid;
    char name[PROTO_MAX_NAME + 1];
    bool hello;
    uint32_t version;            /* agreed in hello: PROTO_VERSION, or PROTO_VERSION_PREV */
    bool fd_once;                /* PROTO_FEAT_FD_ONCE agreed in hello */
    bool bye;                    /* it said bye (PROTO_FEAT_BYE): its end is a clean close */
    struct idset known;          /* buf_id << 1 | writable: fds this client was sent */
    struct idset private_ids;    /* request id + 1 of each PROTO_ACQUIRE_PRIVATE not answered yet */
    struct tenantdir_conn journal; /* PROTO_FEAT_TABLE agreed: its journal (dir NULL: none) */
    uint64_t accepted_ms;        /* uv_now at accept, for the hello deadline */
    uint64_t last_ms;            /* uv_now at its last request, for --idle-timeout */
    uint64_t idle_checked_ms;    /* when an idle check last found it holding in the table */
    struct session_tenant *tenant;
    int pidfd;                   /* the peer process's (server.c sets it at accept), or -1 */
    unsigned refs;
    struct session_env *env;
    struct transport *transport; /* NULL once disconnected */
    /* Buffer replies held back while the transport has no room for their fds (parked
     * requests served together, many at once): sent, in order, as the client reads. Each
     * names a handle the client holds (so at most max-leases), never an fd. */
    struct session_owed *owed_head, *owed_tail;
    bool resending;
    struct session *prev, *next;
};

/* session_new: a session on fd (non-blocking, CLOEXEC), which it takes on success. */
int session_new(struct session_env *env, int fd, const struct ucred *cred, struct session **ret);

/* session_send: encode and send m, with fd attached if fd >= 0 (the fd stays the
 * caller's). Returns 0 when sent or queued; on failure the session is closing. */
int session_send(struct session *s, const struct proto_msg *m, int fd);
/* session_send_fds: session_send with nfds fds attached, in order (a lease_many reply). */
int session_send_fds(struct session *s, const struct proto_msg *m, const int *fds, unsigned nfds);
/* session_send_fds_now: session_send_fds only if it can go at once, else -EAGAIN with
 * nothing sent (transport_send_fds_now). */
int session_send_fds_now(struct session *s, const struct proto_msg *m, const int *fds, unsigned nfds);

/* session_fail: an error reply with a formatted message (best effort). */
void session_fail(struct session *s, uint32_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* session_close: marks the session closing, with why for the log (NULL: the peer just
 * left). Idempotent; the session stays usable until session_disconnected has run. */
void session_close(struct session *s, const char *why);

/* session_expire_hello: closes sessions that said no hello within SESSION_HELLO_MS. */
void session_expire_hello(struct session_env *env, uint64_t now_ms);

/* session_expire_idle: closes (ETIMEDOUT) sessions that hold nothing (no lease, none
 * pending, no hold in its journal) and sent nothing for idle_ms; 0 disables. A session
 * holding leases or table holds never idles out. One found holding in the table is looked
 * at again idle_ms later (a connection that only hands off in its table sends nothing:
 * without that, every sweep would walk its uid's members for it), and a sweep walks at
 * most SESSION_IDLE_VISITS members (plus one walk) in all: the rest wait for the next. */
void session_expire_idle(struct session_env *env, uint64_t now_ms, uint64_t idle_ms);

/* session_uid_conns: how many sessions uid has (closing ones included until they end). */
uint32_t session_uid_conns(const struct session_env *env, uint32_t uid);

/* session_free_env: frees what the env allocated (after every session ended). */
void session_free_env(struct session_env *env);

/* session_count_open: sessions not closing (one that is closing no longer counts against
 * --max-clients, though it is released only at the end of this loop iteration). */
uint32_t session_count_open(const struct session_env *env);

/* session_close_all: session_close for every session (at shutdown). */
void session_close_all(struct session_env *env);

#endif
