/* SPDX-License-Identifier: MIT */
/* ledgers.h: the cross-check of the three ledgers of the same bytes (quota, registry,
 * pool). Private to the daemon. */
#ifndef SHMREFD_LEDGERS_H
#define SHMREFD_LEDGERS_H

#include "peer.h"

/* ledgers_check: what the quota holds is what the registry's buffers are charged plus
 * the leases waiting for a buffer, and what the pool has handed out (allocated, not
 * warm, not being made) is the registry's buffers. A drift is a bug: test builds
 * (SHMREF_LEDGER_CHECK) abort; others log it once. */
void ledgers_check(struct broker *bk);

#endif
