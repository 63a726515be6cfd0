/* SPDX-License-Identifier: MIT */
/* counters.h: the daemon's event counters, shown by status. Private to the daemon. A leaf:
 * every layer that counts something gets a pointer to one instance, owned by the server. */
#ifndef SHMREFD_COUNTERS_H
#define SHMREFD_COUNTERS_H

#include <stdint.h>

struct counters {
    uint64_t connections, leases, publishes, acquires, releases;
    uint64_t messages;         /* every message read from a client (a table's steps send none) */
    uint64_t reclaimed_leases, reclaimed_clients;
    uint64_t refused_quota, refused_space, refused_limit, refused_other, refused_access;
    uint64_t protocol_errors, slow_clients;
    uint64_t clients_closed;   /* went away holding nothing: a clean close */
    uint64_t clients_died;     /* went away holding leases (reclaimed) */
    /* waits (protocol v2): leases parked for quota or pool space and acquires parked for a
     * publish, and those whose deadline passed (ETIMEDOUT / ENOENT) */
    uint64_t lease_waits, lease_wait_timeouts, acquire_waits, acquire_wait_timeouts;
    uint64_t fd_waits;         /* replies that waited on ETOOMANYREFS (from the transport) */
    /* stock leases (protocol v3) served from the stock reserve, and refused EAGAIN */
    uint64_t stock_leases, stock_refused;
};

#endif
