/* SPDX-License-Identifier: MIT */
/* cgroup.h: the memory limit the kernel enforces on shmrefd. A pre-faulted pool's pages
 * are shmem charged to the daemon's memory cgroup, so a pool larger than the cgroup's
 * limit gets the daemon OOM-killed on a lease that is within every quota. */
#ifndef SHMREFD_CGROUP_H
#define SHMREFD_CGROUP_H

#include <stddef.h>
#include <stdint.h>

struct cgroup_memory {
    uint64_t limit;     /* the tightest limit of the cgroup and its ancestors */
    uint64_t usage;     /* what that cgroup uses now */
    char path[4096];    /* the directory whose limit it is */
};

/* cgroup_memory_read: the memory limit of this process's cgroup (v2 memory.max, or the
 * v1 memory controller's memory.limit_in_bytes), the tightest over its ancestors up to
 * the hierarchy's mount. Returns 1 and fills *ret if there is a limit, 0 if there is
 * none (no memory controller, or unlimited), -errno if /proc could not be read. */
int cgroup_memory_read(struct cgroup_memory *ret);

#endif
