/* SPDX-License-Identifier: MIT */
/* waiters.h: requests parked until something changes, with a deadline each. Private to
 * the daemon. A container that decides nothing and sends nothing (the broker does both):
 * leases waiting for quota or pool space queue FIFO per tenant (uid); acquires waiting
 * for a buffer's publish queue FIFO per buffer (the queue hangs off a slot the caller
 * owns, e.g. registry_buf.waiting). One timer fires at the earliest deadline; a second,
 * zero-delay one (waiters_kick) asks the owner to retry its lease queues on the next loop
 * turn, never inside the call that freed the space. Deadlines are a binary heap, so a
 * client parking many requests with many deadlines costs O(log n) each. A kick with no
 * lease waiting costs a compare. */
#ifndef SHMREFD_WAITERS_H
#define SHMREFD_WAITERS_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

struct waiters_queue;
struct waiter;

/* waiters_mine: one owner's waiters (a peer keeps its own list: a disconnect drops them
 * without looking at anyone else's), and the places they take under a cap (a batch of n
 * leases takes n). The container keeps both as waiters come and go. */
struct waiters_mine {
    struct waiter *head, *tail;
    unsigned n;                 /* waiters */
    unsigned places;            /* the sum of their counts */
    unsigned *group;            /* or NULL: a sum of places several owners share (one uid's) */
};

struct waiter {
    bool acquire;               /* an acquire waiting for a publish; else a lease */
    void *owner;                /* who asked (the broker's peer) */
    uint32_t id;                /* the request id, for the reply */
    uint64_t since_ms, deadline_ms; /* uv_now at parking, and when it gives up */
    uint32_t wait_ms;           /* the wait granted (for messages) */
    uint64_t size;              /* a lease: bytes asked */
    int blocked;                /* a lease: what it last met, EDQUOT or ENOSPC */
    uint32_t flags;             /* a lease: its PROTO_LEASE_TABLE, kept for its retries */
    uint32_t count;             /* places under max-leases it takes (waiters_set_count) */
    void *data;                 /* the owner's, freed with the waiter (a batch's sizes) */
    bool busy;                  /* being tried (a batch whose buffers are being made) */
    struct waiter *prev, *next;   /* every waiter, in arrival order */
    struct waiter *qprev, *qnext; /* its queue */
    struct waiters_queue *q;
    struct waiters_mine *mine;    /* its owner's list */
    struct waiter *mprev, *mnext;
    unsigned hidx;                /* its place in the deadline heap */
};

/* One FIFO: a tenant's leases (uid) or one buffer's acquires (slot). */
struct waiters_queue {
    uint32_t uid;
    struct waiters_queue **slot; /* an acquire queue: the caller's pointer to it */
    struct waiter *head, *tail;
    struct waiters_queue *prev, *next; /* tenant queues, in service order */
};

/* expire: w's deadline passed: the owner replies and calls waiters_remove on w (and on no
 * other waiter). retry: a kick. */
typedef void (*waiters_expire_cb)(void *arg, struct waiter *w);
typedef void (*waiters_retry_cb)(void *arg);

struct waiters {
    uv_loop_t *loop;
    uv_timer_t deadline, kick;
    bool open;
    waiters_expire_cb expire;
    waiters_retry_cb retry;
    void *arg;
    struct waiter *head, *tail;
    unsigned n, leases;         /* waiters, and of those leases */
    struct waiters_queue *tenants_head, *tenants_tail; /* tenants with leases waiting */
    uint64_t armed_ms;          /* the deadline timer's target, 0 when stopped */
    struct waiter **heap;       /* every waiter, a min-heap by deadline */
    unsigned heap_cap;
    bool retrying;              /* in the retry callback: kicks are dropped */
};

void waiters_init(struct waiters *ws, uv_loop_t *loop, waiters_expire_cb expire, waiters_retry_cb retry,
                  void *arg);
/* waiters_close: frees every waiter (no callbacks) and closes the timers on the loop. */
void waiters_close(struct waiters *ws);

/* waiters_park_lease: a lease of uid at the tail of uid's queue, and of mine (the
 * owner's list). NULL: out of memory. */
struct waiter *waiters_park_lease(struct waiters *ws, void *owner, struct waiters_mine *mine, uint32_t id,
                                  uint32_t uid, uint64_t size, int blocked, uint32_t wait_ms);
/* waiters_park_acquire: an acquire at the tail of the queue *slot (made on first use). */
struct waiter *waiters_park_acquire(struct waiters *ws, void *owner, struct waiters_mine *mine, uint32_t id,
                                    struct waiters_queue **slot, uint32_t wait_ms);
/* waiters_set_count: w takes count places (1 when parked) in its owner's list. */
void waiters_set_count(struct waiter *w, uint32_t count);
/* waiters_remove: unlinks w (and its queue if now empty, clearing the slot) and frees it. */
void waiters_remove(struct waiters *ws, struct waiter *w);

/* waiters_tenant: uid's queue of waiting leases, or NULL (a new waiting lease of uid
 * queues behind them). */
struct waiters_queue *waiters_tenant(const struct waiters *ws, uint32_t uid);
/* waiters_tenant_last: tenant q was served; it goes to the back of the service order. */
void waiters_tenant_last(struct waiters *ws, struct waiters_queue *q);

/* waiters_poll: when leases wait, the retry callback runs in ms (at least 1) unless a kick
 * comes first: for space that frees without an event (a buffer given back in a table). */
void waiters_poll(struct waiters *ws, uint64_t ms);
/* waiters_kick: when leases wait, the retry callback runs on the next loop turn. */
void waiters_kick(struct waiters *ws);

#endif
