/* SPDX-License-Identifier: MIT */
/* batch.h: lease_many (all or nothing) and release_many. Private to the daemon. A
 * lease_many's items are held as their buffers come (each one lease_attempt: warm at
 * once, new ones off the loop), so the ledgers hold at every step; any refusal releases
 * every item held and sends one error. A waiting lease_many is one lease waiter (its
 * sizes in w->data, n places under max-leases) that is parked first and then tried whole;
 * refused EDQUOT/ENOSPC it stays at its place, busy while its buffers are being made. */
#ifndef SHMREFD_BATCH_H
#define SHMREFD_BATCH_H

#include <stdbool.h>

#include "peer.h"

/* batch_lease_many / batch_release_many: one request each (decoded, any n the protocol
 * allows). */
void batch_lease_many(struct broker *bk, struct broker_peer *p, const struct proto_msg *m);
void batch_release_many(struct broker *bk, struct broker_peer *p, const struct proto_msg *m);

/* batch_retry: a waiting batch at its tenant's head, tried again. Returns true when its
 * waiter is gone (served, or refused for good); false: still parked. */
bool batch_retry(struct broker *bk, struct waiter *w);

/* batch_detach: the waiting batch w goes (timeout, disconnect, stop) while an attempt may
 * be in flight: that attempt then undoes itself, silently. */
void batch_detach(struct waiter *w);

#endif
