/* SPDX-License-Identifier: MIT */
/* status.h: the daemon's state as a msgpack map, for the status request. Private to the
 * daemon. Lists (classes, tenants, clients, buffers) are cut to fit in one reply (500 entries,
 * or 100 when those do not fit); the *_total
 * fields say how many there were. */
#ifndef SHMREFD_STATUS_H
#define SHMREFD_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "counters.h"
#include "options.h"
#include "pool.h"
#include "quota.h"
#include "registry.h"
#include "session.h"

/* status_src: where the numbers come from (the server fills it at each request). */
struct status_src {
    uint64_t uptime_ms;
    uint64_t now_ms;               /* uv_now, for ages */
    const struct options *opt;
    const struct pool *pool;
    const struct quota *quota;
    const struct registry *reg;
    const struct counters *counters;
    const struct session_env *sessions;
    uint32_t reserved_clients;     /* slots above max_clients for the operators (access_operator) */
    bool only_uid;                 /* an unprivileged viewer: list only uid's clients, buffers, tenant */
    uint32_t uid;
};

/* status_build: writes the map into buf. Returns its length, or -EMSGSIZE. */
int status_build(const struct status_src *src, uint8_t *buf, size_t cap);

#endif
