/* SPDX-License-Identifier: MIT */
/* peer.h: what the broker's modules share: a client as the broker sees it (struct
 * broker_peer: it replies through the peer's ops and never touches a socket), the
 * broker's state (struct broker), and the replies every module makes (a refusal counted
 * and logged at a bounded rate, a buffer reply, the max-leases check). Private to the
 * daemon; below lease.c, acquire.c, batch.c, waits.c and broker.c. */
#ifndef SHMREFD_PEER_H
#define SHMREFD_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "counters.h"
#include "log.h"
#include "options.h"
#include "pool.h"
#include "proto.h"
#include "quota.h"
#include "registry.h"
#include "waiters.h"

struct broker_peer;

struct broker_peer_ops {
    /* reply: send m, with fd attached if fd >= 0 (the fd stays the broker's). */
    void (*reply)(struct broker_peer *p, const struct proto_msg *m, int fd);
    /* refuse: an error reply with code and msg for request id. */
    void (*refuse)(struct broker_peer *p, uint32_t id, int code, const char *msg);
    /* ref / unref: keep the peer's memory while a lease waits for a new buffer. */
    void (*ref)(struct broker_peer *p);
    void (*unref)(struct broker_peer *p);
    /* reply_many: a lease_many reply m, fds[i] the buffer of item i (the fds stay the
     * broker's); the peer sets each item's has_fd (fd-once) and sends the fds that travel,
     * in item order, with the one message. */
    void (*reply_many)(struct broker_peer *p, const struct proto_msg *m, const int *fds);
    /* table_holds: whether p's journal counts a hold on b, a member of its uid's table (a
     * hold taken without the daemon, PROTO_FEAT_TABLE). NULL: p has no journal. */
    bool (*table_holds)(struct broker_peer *p, const struct registry_buf *b);
};

/* broker_peer: one client as the broker sees it. The owner fills ops, id, pid and uid,
 * sets closing when the connection is going (a buffer that arrives later goes back), and
 * calls broker_disconnect once, at a point where nothing else uses the peer. */
struct broker_peer {
    const struct broker_peer_ops *ops;
    uint64_t id;
    pid_t pid;
    uid_t uid;
    bool closing;
    unsigned pending;               /* leases waiting for a new buffer */
    struct waiters_mine parked;     /* its leases and acquires in the broker's waiters */
    struct registry_holder holder;  /* the handle table */
    struct log_rate log_rate;       /* its refusal lines: LOG_RATE_LINES a second */
};

struct broker {
    const struct options *opt;      /* max_lease_size, max_leases: read at each request */
    struct pool *pool;
    struct quota *quota;
    struct registry *reg;
    struct counters *counters;
    bool stopping;                  /* shutting down: a buffer created now goes back */
    uint64_t pending_bytes;         /* charged to leases still waiting for a buffer */
    bool drift_logged;
    uv_loop_t *loop;                /* set by broker_start: without it nothing waits */
    struct waiters waiters;         /* leases parked for quota or space, acquires for a publish */
    bool retrying;                  /* in the retry of waiting leases: frees do not kick */
};

/* peer_fail: an error reply (not counted as a refusal: a bad request). */
void peer_fail(struct broker_peer *p, uint32_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* peer_refuse: a refusal of what (a lease, an acquire...): counted by cause, in the
 * tenant's counts too, logged (LOG_RATE_LINES a second per peer), then replied. */
void peer_refuse(struct broker *bk, struct broker_peer *p, uint32_t id, int code, const char *what,
                 const char *msg);
/* peer_send_buffer: a lease reply (b writing) or an acquire reply (b published) for
 * handle; whether fd travels is the peer's business (fd-once). */
void peer_send_buffer(struct broker_peer *p, uint32_t id, uint64_t handle, struct registry_buf *b, int fd);
/* peer_park_left: whether p may park n more requests: its uid's waiting requests (on
 * all its connections, p->parked.group) stay within --max-parked-per-uid; refuses
 * EMFILE with the numbers when not. */
bool peer_park_left(struct broker *bk, struct broker_peer *p, uint32_t id, uint32_t n, const char *what);
/* peer_leases_left: whether p may take one more lease (held, pending and parked count);
 * refuses EMFILE with the numbers when not. */
bool peer_leases_left(struct broker *bk, struct broker_peer *p, uint32_t id, const char *what);

#endif
