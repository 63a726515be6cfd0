/* SPDX-License-Identifier: MIT */
/* idset.c: see idset.h. Deletion shifts the following run back, so there are no
 * tombstones and lookups stay short however many adds and deletes come. */
#include "idset.h"

#include <errno.h>
#include <stdlib.h>

static uint32_t home(const struct idset *s, uint64_t id)
{
    return (uint32_t)((id * 0x9E3779B97F4A7C15ULL) >> 32) & (s->cap - 1);
}

static uint32_t find(const struct idset *s, uint64_t id)
{
    uint32_t i = home(s, id);
    while (s->slots[i] && s->slots[i] != id)
        i = (i + 1) & (s->cap - 1);
    return i;
}

bool idset_has(const struct idset *s, uint64_t id)
{
    return s->cap && id && s->slots[find(s, id)] == id;
}

static int grow(struct idset *s)
{
    struct idset bigger = { calloc(s->cap ? s->cap * 2 : 16, sizeof(uint64_t)), s->cap ? s->cap * 2 : 16, 0 };
    if (!bigger.slots)
        return -ENOMEM;
    for (uint32_t i = 0; i < s->cap; i++)
        if (s->slots[i]) {
            bigger.slots[find(&bigger, s->slots[i])] = s->slots[i];
            bigger.n++;
        }
    free(s->slots);
    *s = bigger;
    return 0;
}

int idset_add(struct idset *s, uint64_t id, uint32_t max)
{
    if (!id)
        return -EINVAL;
    if (idset_has(s, id))
        return 0;
    if (s->n >= max)
        return -ENOSPC;
    if ((s->n + 1) * 4 > s->cap * 3 && grow(s) < 0) /* load at most 3/4 */
        return -ENOMEM;
    s->slots[find(s, id)] = id;
    s->n++;
    return 0;
}

void idset_del(struct idset *s, uint64_t id)
{
    if (!idset_has(s, id))
        return;
    uint32_t mask = s->cap - 1, i = find(s, id), j = i;
    s->slots[i] = 0;
    s->n--;
    for (;;) {
        j = (j + 1) & mask;
        if (!s->slots[j])
            return;
        uint32_t k = home(s, s->slots[j]);
        /* Move slots[j] into the hole at i unless its home lies cyclically in (i, j]. */
        if ((j > i && (k <= i || k > j)) || (j < i && k <= i && k > j)) {
            s->slots[i] = s->slots[j];
            s->slots[j] = 0;
            i = j;
        }
    }
}

void idset_free(struct idset *s)
{
    free(s->slots);
    *s = (struct idset){ 0 };
}
