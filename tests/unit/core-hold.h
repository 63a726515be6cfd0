/* SPDX-License-Identifier: MIT */
/* core-hold.h: what lease.c does for a lease, done by hand in the unit tests above the
 * registry (acquire, peer, tenantdir, ledgers): a pool buffer, its class charged, a
 * registry buffer, a writable handle. Test code only. */
#ifndef SHMREF_TEST_CORE_HOLD_H
#define SHMREF_TEST_CORE_HOLD_H

#include <criterion/criterion.h>

#include <string.h>

#include <uv.h>

#include "core-fixture.h"
#include "pool-callback.h"
#include "proto.h"

/* core_hold: a buffer of uid from c's pool (warm, or made off the loop: loop runs until
 * it is there), its class charged to uid in c's quota, registered in c's registry and
 * held writable by holder; *ret_handle is the handle. Any failure fails the test. */
static struct registry_buf *core_hold(struct core *c, uv_loop_t *loop, uint32_t uid, uint64_t size,
                                      struct registry_holder *holder, uint64_t *ret_handle)
{
    struct got g = { 0 };
    struct pool_buf *pb = NULL;
    struct quota_ticket t;
    char why[PROTO_MAX_ERRMSG];
    int r = pool_get(c->pool, size, uid, &pb, got_cb, &g);
    cr_assert(r == 0 || r == 1, "pool_get: %d", r);
    if (r == 1) {
        while (g.calls == 0)
            uv_run(loop, UV_RUN_ONCE);
        cr_assert_eq(g.err, 0, "creating a buffer: %s", strerror(-g.err));
        pb = g.buf;
    }
    cr_assert_not_null(pb);
    cr_assert_eq(quota_take(c->quota, uid, pb->size, &t, why, sizeof(why)), 0, "%s", why);
    struct registry_buf *b = registry_buf_charged(c->reg, pb, &t, size);
    cr_assert_not_null(b);
    cr_assert_eq(registry_hold(c->reg, holder, b, true, ret_handle), 0);
    return b;
}

#endif
