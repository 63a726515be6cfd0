/* SPDX-License-Identifier: MIT */
/* methods-socket.c: the array through a Unix stream socket, as length-prefixed frames:
 * raw bytes, or base64 text (what a JSON API does). Client and server sides; the server
 * computes its own output (payload_transform) into a second heap buffer; every buffer is
 * a warm heap buffer kept across calls, so only the transfer, the codec and the work are
 * measured. */
#include "bench.h"

#include <errno.h>
#include <string.h>

/* ---- bytes ---- */

static int bytes_call(struct rt_ctx *ctx, uint64_t iter)
{
    size_t len;
    int r = wire_send_frame(ctx->ctl, NULL, 0, ctx->in, ctx->size);
    if (r < 0)
        return rt_fail(ctx, r, "send: %s", strerror(-r));
    if ((r = wire_recv_frame(ctx->ctl, ctx->out, ctx->size, &len)) < 0)
        return rt_fail(ctx, r, "receive: %s", strerror(-r));
    if (len != ctx->size)
        return rt_fail(ctx, -EPROTO, "server returned %zu bytes for %zu", len, ctx->size);
    rt_check_output(ctx, ctx->out, iter);
    return 0;
}

int srv_bytes(int fd)
{
    for (;;) {
        uint64_t len;
        if (wire_recv_frame_len(fd, &len) < 0)
            return 0; /* the client is done */
        void *heap = srv_heap(0, len), *out = srv_heap(2, len);
        if (!heap || !out)
            return -ENOMEM;
        int r = wire_recv_all(fd, heap, len);
        if (r < 0)
            return r;
        payload_transform(out, heap, len, 1);
        if ((r = wire_send_frame(fd, NULL, 0, out, len)) < 0)
            return r;
    }
}

/* ---- base64 ---- */

static int base64_call(struct rt_ctx *ctx, uint64_t iter)
{
    size_t n = b64_encode(ctx->in, ctx->size, ctx->tmp), len;
    int r = wire_send_frame(ctx->ctl, NULL, 0, ctx->tmp, n);
    if (r < 0)
        return rt_fail(ctx, r, "send: %s", strerror(-r));
    if ((r = wire_recv_frame(ctx->ctl, ctx->tmp, ctx->tmp_cap, &len)) < 0)
        return rt_fail(ctx, r, "receive: %s", strerror(-r));
    ssize_t got = b64_decode(ctx->tmp, len, ctx->out, ctx->size);
    if (got != (ssize_t)ctx->size)
        return rt_fail(ctx, -EPROTO, "server returned bad base64 (%zd bytes decoded)", got);
    rt_check_output(ctx, ctx->out, iter);
    return 0;
}

int srv_base64(int fd)
{
    for (;;) {
        uint64_t len;
        if (wire_recv_frame_len(fd, &len) < 0)
            return 0;
        size_t cap = len / 4 * 3;
        char *text = srv_heap(1, len);
        void *heap = srv_heap(0, cap), *out = srv_heap(2, cap);
        if (!text || !heap || !out)
            return -ENOMEM;
        int r = wire_recv_all(fd, text, len);
        if (r < 0)
            return r;
        ssize_t n = b64_decode(text, len, heap, cap);
        if (n < 0)
            return (int)n;
        payload_transform(out, heap, (size_t)n, 1);
        size_t m = b64_encode(out, (size_t)n, text);
        if ((r = wire_send_frame(fd, NULL, 0, text, m)) < 0)
            return r;
    }
}

const struct rt_method rt_unix_bytes = {
    .name = "unix-bytes", .role = "bytes", .prepare = rt_prepare_heap, .call = bytes_call,
};
const struct rt_method rt_unix_base64 = {
    .name = "unix-base64", .role = "base64", .prepare = rt_prepare_heap, .call = base64_call,
};
