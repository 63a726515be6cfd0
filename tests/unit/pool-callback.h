/* SPDX-License-Identifier: MIT */
/* pool-callback.h: what the unit tests of pool and registry give pool_get as its
 * completion: a record of how often it ran and with what. Test code only. */
#ifndef SHMREF_TEST_POOL_CALLBACK_H
#define SHMREF_TEST_POOL_CALLBACK_H

#include "pool.h"

struct got {
    int calls, err;
    struct pool_buf *buf;
};

static void got_cb(struct pool *pool, struct pool_buf *buf, int err, void *data)
{
    struct got *g = data;
    (void)pool;
    g->calls++;
    g->buf = buf;
    g->err = err;
}

#endif
