/* SPDX-License-Identifier: MIT */
/* methods-floor.c: reference costs measured in the same run as the transports, with no
 * second process and no IPC: a memcpy and the server's work (payload_transform: the
 * floor the targets name), the copies shmrefd one-copy does by construction (a copy, the
 * work, a copy, plus the client's page touch), and the page touch alone. All buffers are
 * warm. */
#include "bench.h"

#include <string.h>

/* The copies stay: the buffers are reachable from ctx after the call. */
#define KEEP() __asm__ volatile("" ::: "memory")

static int memcpy2(struct rt_ctx *ctx, uint64_t iter)
{
    memcpy(ctx->tmp, ctx->in, ctx->size);
    payload_transform(ctx->out, ctx->tmp, ctx->size, 1);
    KEEP();
    if (ctx->full)
        rt_check_output(ctx, ctx->out, iter);
    return 0;
}

/* One-copy's data path: client heap -> lease, lease -> server heap, server heap ->
 * output lease, then the client reads one word per page of the output. */
static int memcpy3_touch(struct rt_ctx *ctx, uint64_t iter)
{
    memcpy(ctx->tmp, ctx->in, ctx->size);
    payload_transform(ctx->out, ctx->tmp, ctx->size, 1);
    memcpy(ctx->tmp, ctx->out, ctx->size);
    KEEP();
    rt_check_output(ctx, ctx->tmp, iter);
    return 0;
}

static volatile uint64_t sink;

static int touch(struct rt_ctx *ctx, uint64_t iter)
{
    (void)iter;
    sink ^= payload_touch(ctx->in, ctx->size);
    return 0;
}

const struct rt_method rt_floor_memcpy2 = {
    .name = "memcpy-x2", .floor = true, .prepare = rt_prepare_heap, .call = memcpy2,
};
const struct rt_method rt_floor_memcpy3 = {
    .name = "memcpy-x3-touch", .floor = true, .prepare = rt_prepare_heap, .call = memcpy3_touch,
};
const struct rt_method rt_floor_touch = {
    .name = "touch-pages", .floor = true, .prepare = rt_prepare_heap, .call = touch,
};
