/* SPDX-License-Identifier: MIT */
/* acquire.h: an acquire of a published buffer, every check made at the moment it is
 * served (also for an acquire that waited for the publish). Private to the daemon. */
#ifndef SHMREFD_ACQUIRE_H
#define SHMREFD_ACQUIRE_H

#include <stdint.h>

#include "peer.h"

/* acquire_serve: hold published buffer b read-only for p and reply (max-leases,
 * quota_check_pinned for another tenant's buffer, a read-only fd); or refuse with the
 * numbers. */
void acquire_serve(struct broker *bk, struct broker_peer *p, uint32_t id, struct registry_buf *b);

#endif
