/* SPDX-License-Identifier: MIT */
/* test-idset.c: the set of nonzero 64-bit ids (daemon/idset.c) that holds which
 * buffers' fds a connection was sent, driven by a long random sequence of adds, deletes
 * and lookups against a plain reference array: deletion without tombstones must never
 * lose a member or keep a deleted one, whatever the collisions. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "idset.h"

#define RANGE 600 /* few distinct ids, many collisions and wrap-arounds */

static uint32_t next(uint32_t *s)
{
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

/* id_of: spread small numbers over the 64-bit space, as buf_id << 1 | writable does. */
static uint64_t id_of(uint32_t k)
{
    return (uint64_t)(k + 1) << 1 | (k & 1);
}

Test(idset, random_operations_match_a_reference)
{
    for (uint32_t seed = 1; seed <= 20; seed++) {
        struct idset s = { 0 };
        bool ref[RANGE] = { false };
        uint32_t n = 0, rng = seed * 2654435761u;
        for (int op = 0; op < 20000; op++) {
            uint32_t k = next(&rng) % RANGE;
            uint64_t id = id_of(k);
            switch (next(&rng) % 3) {
            case 0:
                cr_assert_eq(idset_add(&s, id, UINT32_MAX), 0);
                n += !ref[k];
                ref[k] = true;
                break;
            case 1:
                idset_del(&s, id);
                n -= ref[k];
                ref[k] = false;
                break;
            default:
                break;
            }
            cr_assert_eq(idset_has(&s, id), ref[k], "seed %u op %d: id %llu", seed, op, (unsigned long long)id);
            cr_assert_eq(s.n, n);
        }
        for (uint32_t k = 0; k < RANGE; k++)
            cr_assert_eq(idset_has(&s, id_of(k)), ref[k], "seed %u: id of %u", seed, k);
        idset_free(&s);
        cr_assert_eq(s.n, 0);
        cr_assert_not(idset_has(&s, id_of(0)));
    }
}

Test(idset, bounded_and_zero_is_not_an_id)
{
    struct idset s = { 0 };
    cr_assert_not(idset_has(&s, 5), "an empty set has nothing");
    idset_del(&s, 5); /* deleting from an empty set is fine */
    cr_assert_eq(idset_add(&s, 0, 10), -EINVAL);
    for (uint64_t id = 1; id <= 10; id++)
        cr_assert_eq(idset_add(&s, id, 10), 0);
    cr_assert_eq(idset_add(&s, 11, 10), -ENOSPC, "past its bound");
    cr_assert_eq(idset_add(&s, 3, 10), 0, "a member is always there");
    idset_del(&s, 3);
    cr_assert_eq(idset_add(&s, 11, 10), 0, "room again after a delete");
    cr_assert_eq(s.n, 10);
    idset_free(&s);
}
