/* SPDX-License-Identifier: MIT */
/* core-fixture.h: what the unit tests of the layers above the pool share: a real pool in
 * a fresh directory under /dev/shm, a quota ledger and a registry, on the test's libuv
 * loop; closed in shutdown order, asserting the loop closed cleanly and no file was left
 * behind. Test code only. */
#ifndef SHMREF_TEST_CORE_FIXTURE_H
#define SHMREF_TEST_CORE_FIXTURE_H

#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "pool.h"
#include "quota.h"
#include "registry.h"

struct core {
    char dir[64];
    struct pool *pool;
    struct quota *quota;
    struct registry *reg;
};

static void core_open(struct core *c, uv_loop_t *loop, const char *name, uint64_t pool_cap, uint64_t default_quota)
{
    const char *why = NULL;
    memset(c, 0, sizeof(*c));
    cr_assert_eq(uv_loop_init(loop), 0);
    snprintf(c->dir, sizeof(c->dir), "/dev/shm/shmref-test-%s-XXXXXX", name);
    cr_assert_not_null(mkdtemp(c->dir));
    cr_assert_eq(pool_new(loop, c->dir, pool_cap, false, &c->pool, &why), 0, "%s", why ? why : "");
    cr_assert_eq(quota_new(default_quota, &c->quota), 0);
    cr_assert_eq(registry_new(loop, c->pool, c->quota, &c->reg), 0);
}

static void core_close(struct core *c, uv_loop_t *loop)
{
    registry_free(c->reg);
    uv_run(loop, UV_RUN_DEFAULT);
    quota_free(c->quota);
    pool_free(c->pool);
    uv_run(loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(loop), 0, "a handle leaked");
    cr_assert_eq(rmdir(c->dir), 0, "pool directory not empty: %s", strerror(errno));
}

#endif
