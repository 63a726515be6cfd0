/* SPDX-License-Identifier: MIT */
/* registry.h: live buffers, their tokens, and who holds them. Private to the daemon.
 * A buffer is writing (leased, not yet published) or published; it is alive while it
 * has references (lease handles plus a retention). When the last reference goes, the
 * registry credits the producer's quota and gives the buffer back to the pool. A
 * holder is one connection's set of lease handles; handles are never reused within a
 * holder's life, so a stale handle is reported, not mistaken for another lease. */
#ifndef SHMREFD_REGISTRY_H
#define SHMREFD_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "pool.h"
#include "proto.h"
#include "quota.h"

struct waiters_queue;

struct registry_buf {
    struct pool_buf *pb;
    uint8_t token[PROTO_TOKEN_LEN];
    uint32_t refs;          /* lease handles plus one while retained */
    uint32_t tenant;        /* the producer's uid, charged for pb->size: the ticket the
                             * registry took, kept as (tenant, pb->size), no bytes more */
    uint64_t size;          /* leased size; after publish, the published size */
    bool published, retained;
    uint32_t acquires;      /* acquires through the daemon */
    uint32_t max_acquires;  /* the retention ends at this many acquires (0: only at its time) */
    uint32_t meta_len;
    uint8_t *meta;
    uint64_t deadline;      /* uv_now() ms at which retention ends */
    uv_timer_t *timer;      /* retention timer, freed in its close callback */
    struct registry *reg;
    struct registry_buf *hnext;
    uint64_t created_ms;    /* uv_now() at registry_buf_new, for status ages */
    int32_t producer_pid;   /* the leasing connection's pid, for status */
    struct waiters_queue *waiting; /* acquires waiting for its publish (the broker's) */
    /* LENT (registry_set_lender): its last daemon reference went and its tenant's table
     * keeps it (tenantdir.c); charged, unhashed, not back in the pool until
     * registry_lent_end; live again by registry_lent_revive. */
    bool lent;
    bool for_table;         /* leased for its tenant's table (PROTO_LEASE_TABLE): joins it
                             * at its end, instead of going back to the pool */
    bool table;             /* in its tenant's table: the entry's word counts its holds, and
                             * while it has daemon references they are one hold there */
    struct registry_buf *lent_prev, *lent_next; /* its table's list (the lender's) */
    /* while retained: its tenant's list of retained buffers, oldest retention first
     * (registry_reclaim_retained walks only its own tenant's) */
    struct registry_buf *ret_prev, *ret_next;
};

struct registry_lease {
    struct registry_buf *buf; /* NULL: free slot */
    uint32_t gen;
    uint32_t next_free;
    bool writable;
};

struct registry_holder {
    struct registry_lease *slots;
    uint32_t nslots, free_head, leases;
    uint64_t bytes;             /* class bytes of buffers this holder has handles on */
};

struct registry;

/* registry_events: what the broker hears of. freed: a charge went back to a tenant, or a
 * tenant's pinned bytes went down (quota or pool space may be free now); b is NULL.
 * gone_waited: b, whose waiting queue is not empty, is about to go (unpublished). */
typedef void (*registry_event_cb)(void *arg, struct registry_buf *b);
struct registry_events {
    registry_event_cb freed, gone_waited;
    void *arg;
};

int registry_new(uv_loop_t *loop, struct pool *pool, struct quota *quota, struct registry **ret);
/* registry_set_events: who hears of freed space and waited-for buffers (NULL: nobody). */
void registry_set_events(struct registry *reg, const struct registry_events *ev);
/* The lender (tenantdir.c): the tenants' tables.
 * lend: b's last reference went (its waiters were told, its token forgotten). True keeps
 *   it LENT: still charged to its tenant, not given back to the pool, until the lender
 *   calls registry_lent_end (or registry_lent_revive makes it live again); false ends it.
 * take: a LENT buffer published in its tenant's table under token, with a hold of the
 *   daemon's taken there and revived (registry_lent_revive) under token; or NULL.
 * reclaim: free buffers of tenant's table (every tenant's: UINT32_MAX) given back until
 *   bytes were; returns the bytes given back.
 * retained: b, a member of its tenant's table, got a retention (registry_retain): its
 *   acquires must come to the daemon, which counts them against it.
 * published: b, leased for the table and not in it, got a plain publish (no retention, no
 *   max_acquires) through the daemon: it may join its table at once, published there. */
struct registry_lender {
    bool (*lend)(void *arg, struct registry_buf *b);
    struct registry_buf *(*take)(void *arg, const uint8_t *token);
    uint64_t (*reclaim)(void *arg, uint32_t tenant, uint64_t bytes);
    void (*retained)(void *arg, struct registry_buf *b);
    void (*published)(void *arg, struct registry_buf *b);
    void *arg;
};
/* registry_set_lender: who decides at each buffer's end (NULL: nobody, every end is at once). */
void registry_set_lender(struct registry *reg, const struct registry_lender *lender);
/* registry_lent_end: a LENT buffer's holds are gone: credit its tenant, recycle it. */
void registry_lent_end(struct registry *reg, struct registry_buf *b);
/* registry_lent_revive: LENT b live again, hashed under token (published, size bytes, meta)
 * or, with token NULL, under a fresh token as a writing buffer (a lease). It has no
 * reference yet: hold it (or retain it) at once. 0, -ENOMEM, -EAGAIN (no random token). */
int registry_lent_revive(struct registry *reg, struct registry_buf *b, const uint8_t *token, uint64_t size,
                         const uint8_t *meta, uint32_t meta_len);
/* registry_find_table: the lender's take (a publish made in a table, which the daemon
 * never heard of), or NULL. */
struct registry_buf *registry_find_table(struct registry *reg, const uint8_t *token);
/* registry_reclaim_table: the lender's reclaim (0 without one). */
uint64_t registry_reclaim_table(struct registry *reg, uint32_t tenant, uint64_t bytes);

/* registry_end_retentions: drops every retention (at shutdown; timers close on the loop). */
void registry_end_retentions(struct registry *reg);
/* registry_free: ends every retention; holders must have been released first. */
void registry_free(struct registry *reg);

/* registry_buf_charged: a writing buffer whose charge is *charge (for exactly pb->size
 * bytes), with a fresh random token (the one it will be published under; the lease
 * reply carries it). On success the registry owns the charge (*charge is emptied) and
 * gives it back with the buffer. It has no reference yet: hold it at once. Returns NULL
 * with errno ENOMEM, or EAGAIN/EIO from getrandom (nothing is taken). */
struct registry_buf *registry_buf_charged(struct registry *reg, struct pool_buf *pb,
                                          struct quota_ticket *charge, uint64_t size);
/* registry_buf_new: registry_buf_charged for a charge of pb->size already made to tenant. */
struct registry_buf *registry_buf_new(struct registry *reg, struct pool_buf *pb, uint32_t tenant,
                                      uint64_t size);
/* registry_abandon: a charge that never became a buffer goes back, and pb (if not NULL)
 * to the pool: the same one place that gives back a buffer's charge at its end. */
void registry_abandon(struct registry *reg, struct quota_ticket *charge, struct pool_buf *pb);
/* registry_buf_drop: undo registry_buf_new for a buffer that was never held. */
void registry_buf_drop(struct registry *reg, struct registry_buf *b);

/* registry_hold: a new handle on b for holder. Returns 0 and *ret_handle, or -ENOMEM. */
int registry_hold(struct registry *reg, struct registry_holder *h, struct registry_buf *b,
                  bool writable, uint64_t *ret_handle);
/* registry_lease_of: the lease a handle names, or NULL. */
struct registry_lease *registry_lease_of(struct registry_holder *h, uint64_t handle);
/* registry_release: drop one handle. Returns 0 or -ENOENT. */
int registry_release(struct registry *reg, struct registry_holder *h, uint64_t handle);
/* registry_release_all: drop every handle of h and free its table; returns how many. */
uint32_t registry_release_all(struct registry *reg, struct registry_holder *h);

/* registry_publish: makes b findable (registry_find) by the token it got at its lease;
 * keep_ms > 0 adds a retention reference. Returns 0, or -EALREADY if published, -ENOMEM. */
int registry_publish(struct registry *reg, struct registry_buf *b, uint64_t size, uint32_t keep_ms,
                     const uint8_t *meta, uint32_t meta_len);
/* registry_find: the published, live buffer with this token, or NULL. A retention that
 * has run out counts as gone even if its timer has not fired yet. */
struct registry_buf *registry_find(struct registry *reg, const uint8_t *token);
/* registry_find_writing: the live buffer leased under this token and not published yet,
 * or NULL (an acquire may wait for its publish). */
struct registry_buf *registry_find_writing(struct registry *reg, const uint8_t *token);
/* registry_holds: whether h has a handle on b. */
bool registry_holds(const struct registry_holder *h, const struct registry_buf *b);
/* registry_retain: published, live b gets one more acquire of retention (PROTO_OP_RETAIN):
 * without a retention it gets one (the one reference a retention is, charged to its tenant
 * as any) that ends at the acquire after those counted so far or at now + keep_ms; with
 * one, that retention ends one acquire later (a cap of 0, none, stays none) and at the
 * later of its deadline and now + keep_ms. keep_ms >= 1. Returns 0, or -ENOMEM (nothing
 * changed). */
int registry_retain(struct registry *reg, struct registry_buf *b, uint32_t keep_ms);
/* registry_end_retention: drops the retention reference, if any. */
void registry_end_retention(struct registry *reg, struct registry_buf *b);
/* registry_reclaim_retained: ends the retention that started first among tenant's
 * buffers that only their retention holds (no handle on them anywhere); that buffer goes
 * back to the pool; returns its bytes, 0 when there is none. Its tenant's lease that would
 * fail for quota calls it first: retention alone never fills a quota. Both this and
 * registry_reclaimable read only that tenant's retained buffers (a list per tenant in the
 * order their retentions started), never every live buffer. */
uint64_t registry_reclaim_retained(struct registry *reg, uint32_t tenant);
/* registry_reclaimable: the bytes registry_reclaim_retained could give back for tenant. */
uint64_t registry_reclaimable(const struct registry *reg, uint32_t tenant);
/* registry_acquired: counts an acquire of b. The retention serves every consumer that
 * comes within its time (fan-out); it ends early once max_acquires (if set) is reached. */
void registry_acquired(struct registry *reg, struct registry_buf *b);

struct registry_stats {
    uint64_t buffers, bytes, published, retained, retained_bytes, expired;
    uint64_t handles;       /* lease handles held by all connections */
    uint64_t drift;         /* charges the quota ledger did not hold in full (a bug) */
    uint64_t reclaimed;     /* retentions ended early for their tenant's lease (quota) */
    uint64_t lent;          /* LENT now: in a table, no daemon reference (counted in buffers
                             * and bytes: still charged) */
    uint64_t lent_bytes;    /* their bytes */
};
struct registry_stats registry_stats(const struct registry *reg);

/* registry_published: up to max published, live buffers (for status), in no order.
 * Returns how many were written to ret. */
unsigned registry_published(const struct registry *reg, const struct registry_buf **ret, unsigned max);

#endif
