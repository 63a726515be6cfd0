/* conn.h: one client connection: framing, fd passing and the output queue. Private to
 * the daemon. Each SOCK_SEQPACKET message is one request; replies that cannot be sent
 * at once are queued, and while any are queued the connection reads no new requests,
 * so a client that does not read stalls only itself. A connection's memory is freed in
 * its poll handle's close callback, once no asynchronous operation holds a reference. */
#ifndef SHMREFD_CONN_H
#define SHMREFD_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "idset.h"
#include "proto.h"
#include "registry.h"

struct server;
struct conn_out;

struct conn {
    uv_poll_t poll;
    int fd;
    uint64_t id;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    char name[PROTO_MAX_NAME + 1];
    bool hello, closing;
    bool fd_once;                /* PROTO_FEAT_FD_ONCE agreed in hello */
    struct idset known;          /* buf_id << 1 | writable: fds this client was sent */
    uint64_t accepted_ms;        /* uv_now at accept, for the hello deadline */
    unsigned refs;
    unsigned pending;            /* leases waiting for a new buffer */
    struct server *server;
    struct registry_holder holder;
    struct conn_out *out_head, *out_tail;
    unsigned out_count;
    struct conn *prev, *next;    /* the server's list */
};

#define CONN_MAX_QUEUED 256      /* replies queued before the client counts as stuck */
#define CONN_BATCH 16            /* requests read by one recvmmsg */
#define CONN_HELLO_MS 10000      /* a connection that says no hello by then is closed */
#define CONN_KNOWN_SLACK 256     /* fd-once set: 2 x max-leases + this; beyond, fds are sent again */

/* conn_new: takes ownership of fd (non-blocking, CLOEXEC) and starts reading. */
int conn_new(struct server *s, int fd, const struct ucred *cred, struct conn **ret);

/* conn_send: encode and send m, with fd attached if fd >= 0 (the fd stays the caller's).
 * Returns 0 when sent or queued; on failure the connection is closed. */
int conn_send(struct conn *c, const struct proto_msg *m, int fd);

/* conn_fail: send an error reply with a formatted message (best effort). */
void conn_fail(struct conn *c, uint32_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* conn_close: releases everything the client held, logs why, and closes. Idempotent. */
void conn_close(struct conn *c, const char *why);

void conn_ref(struct conn *c);
void conn_unref(struct conn *c);

#endif
