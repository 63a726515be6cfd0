/* SPDX-License-Identifier: MIT */
/* broker.h: what each lease request means: the lease lifecycle (lease, publish, acquire,
 * release, their batches, and waiting for quota, space or a publish) and a disconnect's
 * reclaim. Private to the daemon. The broker knows a client
 * only as a struct broker_peer (a session embeds one; a unit test fakes one): it replies
 * through the peer's ops and never touches a socket. Every refusal is an error reply whose
 * message names the numbers; the broker never closes a connection. */
#ifndef SHMREFD_BROKER_H
#define SHMREFD_BROKER_H

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
    unsigned parked;                /* its leases and acquires in the broker's waiters */
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

/* broker_start: the waiters (their timers on loop) and the registry's events. Until it
 * has run, a request's wait_ms is taken as 0. */
void broker_start(struct broker *b, uv_loop_t *loop);
/* broker_stop: forgets every waiter (their sessions are closing) and closes the timers. */
void broker_stop(struct broker *b);
/* broker_kick: quota limits changed (a reload): waiting leases are retried. */
void broker_kick(struct broker *b);

/* broker_handle: act on one decoded lease, publish, acquire or release request; returns
 * false for any other op (the caller's to handle). */
bool broker_handle(struct broker *b, struct broker_peer *p, const struct proto_msg *m);

/* broker_check: cross-checks the quota, registry and pool ledgers (the session calls it
 * after each request and disconnect; the broker after each buffer made off the loop).
 * In test builds (SHMREF_LEDGER_CHECK) a mismatch aborts the daemon; otherwise a drift the
 * registry saw is logged once. */
void broker_check(struct broker *b);

/* broker_mapped / broker_unmapped: p was sent buffer buf_id's fd and maps it now / said
 * it unmapped it (or went). A buffer retired while mapped stays counted as pinned
 * against the pool's cap and p's tenant quota until its last mapping goes. */
void broker_mapped(struct broker *b, struct broker_peer *p, uint64_t buf_id);
void broker_unmapped(struct broker *b, struct broker_peer *p, uint64_t buf_id);
/* broker_pins_after_close: whether a mapping of buf_id outlives what the daemon can free
 * (pool_pins_after_close): a closing connection hands those to broker_hold_until_exit. */
bool broker_pins_after_close(struct broker *b, uint64_t buf_id);
/* broker_hold_until_exit: p's connection closed while it mapped ids[0..n); they stay
 * charged to p's uid until p's process exits (pidfd, taken). */
void broker_hold_until_exit(struct broker *b, struct broker_peer *p, int pidfd, const uint64_t *ids, unsigned n);

/* broker_disconnect: drops p's waiting requests (nothing was charged for them) and
 * releases every handle p holds; returns how many handles there were. */
uint32_t broker_disconnect(struct broker *b, struct broker_peer *p);

#endif
