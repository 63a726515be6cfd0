/* SPDX-License-Identifier: MIT */
/* idset.h: a set of nonzero 64-bit ids (open addressing, linear probing). Private to
 * the daemon: each connection keeps the buffers whose fd it has already been sent. */
#ifndef SHMREFD_IDSET_H
#define SHMREFD_IDSET_H

#include <stdbool.h>
#include <stdint.h>

struct idset {
    uint64_t *slots;        /* 0 is an empty slot */
    uint32_t cap, n;
};

bool idset_has(const struct idset *s, uint64_t id);
/* idset_add: 0 when id is in the set; -ENOSPC when the set holds max ids already. */
int idset_add(struct idset *s, uint64_t id, uint32_t max);
void idset_del(struct idset *s, uint64_t id);
void idset_free(struct idset *s);

#endif
