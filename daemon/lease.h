/* SPDX-License-Identifier: MIT */
/* lease.h: one lease attempt, the one pipeline for a single lease and for each item of a
 * lease_many: the size class (computed once), a warm buffer of the tenant's, the charge
 * (a quota_ticket), the pool (a new buffer reserved off the loop), then the registry and
 * a handle. The ticket travels with the attempt into the registry; every failure on the
 * way hands it to registry_abandon. Private to the daemon. */
#ifndef SHMREFD_LEASE_H
#define SHMREFD_LEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "peer.h"

struct lease_attempt;

/* lease_done_cb: an attempt that went off the loop ended: err 0 (held: a->buf, a->handle),
 * -ECANCELED (a->cancelled, or its peer closing, or the daemon stopping: nothing held,
 * nothing to say), or -errno with msg (nothing held). */
typedef void (*lease_done_cb)(struct lease_attempt *a, int err, const char *msg);

struct lease_attempt {
    struct broker *bk;
    struct broker_peer *p;
    uint64_t size;               /* asked */
    uint64_t csize;              /* its class, once known */
    struct quota_ticket charge;  /* until the registry takes it */
    struct registry_buf *buf;    /* held, on success */
    uint64_t handle;             /* 0 until held */
    bool cancelled;              /* its owner no longer wants it: a buffer made goes back */
    bool waits;                  /* the lease waits for quota (wait_ms): its tenant's retained
                                  * buffers are its consumers' to take, not reclaimed for it */
    bool stock;                  /* PROTO_LEASE_STOCK: from the pool's stock reserve, never
                                  * waits; refused -EAGAIN when the reserve or the uid's
                                  * stock cap has no room */
    bool for_table;              /* PROTO_LEASE_TABLE: the buffer joins its tenant's table at
                                  * its end */
    lease_done_cb done;          /* called once, for an attempt that returned 1 */
};

/* lease_attempt: try a (bk, p, size and done filled in). Returns 0 when held (a->buf,
 * a->handle), 1 when a new buffer is being made (a must live until a->done), or -errno
 * with nothing held and the reason, with its numbers, in msg: -EDQUOT and -ENOSPC are
 * the ones waiting can cure. */
int lease_attempt(struct lease_attempt *a, char *msg, size_t cap);

/* lease_one: one lease request (checked for size and max-leases; waits: it asked to wait
 * for quota) tried once: 0 when it
 * is answered (served, on its way, or refused with a reply), or -EDQUOT / -ENOSPC with
 * nothing sent and the refusal's text in msg (the caller refuses, or parks it). */
int lease_one(struct broker *bk, struct broker_peer *p, uint32_t id, uint64_t size, bool waits, uint32_t flags,
              char *msg, size_t cap);

/* lease_stock_refuse: EAGAIN for a stock lease: routine (the client leases plainly when a
 * caller asks), so counted but not logged. */
void lease_stock_refuse(struct broker *bk, struct broker_peer *p, uint32_t id, const char *msg);

/* lease_beyond_all: leases of n sizes asked together (a batch waits as one) that need
 * more than the tenant's whole quota or the whole pool, which waiting cannot cure:
 * refused at once; returns true after refusing. */
bool lease_beyond_all(struct broker *bk, struct broker_peer *p, uint32_t id, const uint64_t *sizes, uint32_t n,
                      const char *what);

/* lease_fd_share_left: whether p's tenant may hold n more buffers (each one of the
 * daemon's fds: one tenant takes at most half the pool's fd budget; root and the
 * daemon's uid unless nobody's are exempt: access_operator); refuses EMFILE with the numbers when not. */
bool lease_fd_share_left(struct broker *bk, struct broker_peer *p, uint32_t id, uint32_t n, const char *what);

#endif
