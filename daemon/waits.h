/* SPDX-License-Identifier: MIT */
/* waits.h: what the broker does with requests that wait: a lease refused EDQUOT/ENOSPC
 * that asked to wait, and an acquire of a token leased but not yet published. They are
 * parked in bk->waiters (waiters.c, a container that decides nothing) and in their
 * peer's own list (p->parked); here they are retried when the registry says space freed,
 * served when their buffer is published, and answered when their deadline passes.
 * Private to the daemon. */
#ifndef SHMREFD_WAITS_H
#define SHMREFD_WAITS_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "peer.h"

/* waits_start: the waiters' timers on loop, and the registry's events. */
void waits_start(struct broker *bk, uv_loop_t *loop);
/* waits_stop: forgets every waiter (their sessions are closing) and closes the timers. */
void waits_stop(struct broker *bk);
/* waits_kick: quota or space may have freed: waiting leases are retried next turn. */
void waits_kick(struct broker *bk);

/* waits_park_lease: a lease (checked; flags: its PROTO_LEASE_TABLE, kept for its retries)
 * that met EDQUOT/ENOSPC (blocked), or that must queue behind its tenant's earlier waiters,
 * waits up to wait_ms. Returns 0, -EMFILE after refusing (its uid's waiting requests at
 * --max-parked-per-uid), or -ENOMEM. */
int waits_park_lease(struct broker *bk, struct broker_peer *p, uint32_t id, uint64_t size, uint32_t flags,
                     int blocked, uint32_t wait_ms);
/* waits_park_acquire: an acquire waits up to wait_ms for the publish of b (leased, not
 * published). Refuses (max-leases, memory) itself. */
void waits_park_acquire(struct broker *bk, struct broker_peer *p, uint32_t id, struct registry_buf *b,
                        uint32_t wait_ms);
/* waits_serve_acquires: b was just published: its waiting acquires, in arrival order. */
void waits_serve_acquires(struct broker *bk, struct registry_buf *b);

/* waits_drop_peer: p's waiters go, silently (nothing was charged for them): at its
 * disconnect. Costs what p parked, whatever others have parked. */
void waits_drop_peer(struct broker *bk, struct broker_peer *p);

#endif
