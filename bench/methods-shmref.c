/* SPDX-License-Identifier: MIT */
/* methods-shmref.c: the array through shmrefd, with the public libshmref API only; the
 * binary descriptor travels over the control socket. Every server writes its own output
 * (payload_transform) into a lease of its own, published for its one consumer and held
 * until the next request (by then the client has acquired it), as a server that answers
 * requests in turn does (the Python bench's servers the same); a publish with a retention
 * for one consumer goes through the daemon (docs/architecture.md, "What needs the daemon"). One-copy: the client copies its heap array into a lease; the server
 * copies the input into its heap (as a server that keeps its input would) and computes
 * from there into its output. Zero-copy: the client writes its input in place (every
 * word) into its lease; the server computes from the input's mapping straight into its
 * output's; nobody copies the array. Pub/sub: iceoryx's work (one word per page written,
 * transformed and read), for the rows against iceoryx. The
 * -nocache variants turn libshmref's mapping cache off (SHMREF_MAP_CACHE=0, in the
 * client and the server), so every lease and acquire maps the buffer anew: the lever
 * of DESIGN section 6 that the cache pulls, measured by its absence. */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* srv_last: the server's previous output, held until the next request's is published */
static shmref_buf *srv_last;

/* srv_hand_out: publish out (size bytes) for the client and keep it until the next one. */
static int srv_hand_out(shmref_buf *out, size_t size, shmref_desc *ret)
{
    int r = shmref_publish(out, size, 0, NULL, 0, ret);
    int r2 = shmref_release(srv_last);
    srv_last = out;
    return r < 0 ? r : r2;
}

static void srv_hand_back(void)
{
    shmref_release(srv_last);
    srv_last = NULL;
}

static int conn_fail(struct rt_ctx *ctx, int r, const char *what)
{
    return rt_fail(ctx, r, "%s: %s: %s", what, strerror(-r), shmref_errmsg(ctx->conn));
}

static int sh_open(struct rt_ctx *ctx)
{
    int r = shmref_connect(ctx->socket, &ctx->conn);
    return r < 0 ? rt_fail(ctx, r, "connect %s: %s", ctx->socket, strerror(-r)) : 0;
}

static void sh_close(struct rt_ctx *ctx)
{
    shmref_close(ctx->conn);
    ctx->conn = NULL;
}

/* send_desc / recv_desc: the binary descriptor in one frame. */
static int send_desc(int fd, const shmref_desc *d)
{
    unsigned char bin[SHMREF_DESC_BINARY_MAX];
    int n = shmref_desc_to_binary(d, bin, sizeof(bin));
    return n < 0 ? n : wire_send_frame(fd, bin, (size_t)n, NULL, 0);
}

static int recv_desc(int fd, shmref_desc *ret)
{
    unsigned char bin[SHMREF_DESC_BINARY_MAX];
    size_t len;
    int r = wire_recv_frame(fd, bin, sizeof(bin), &len);
    return r < 0 ? r : shmref_desc_from_binary(bin, len, ret);
}

/* finish: hand the input over, acquire the server's answer, read it, release both
 * (first_word: only the first word is read and checked; stamps: one word per page). */
static int finish_ex(struct rt_ctx *ctx, shmref_buf *in, uint64_t iter, bool first_word, bool stamps)
{
    shmref_desc d, back;
    shmref_buf *out;
    int r = shmref_publish(in, ctx->size, 0, NULL, 0, &d);
    if (r < 0)
        return conn_fail(ctx, r, "publish");
    if ((r = send_desc(ctx->ctl, &d)) < 0 || (r = recv_desc(ctx->ctl, &back)) < 0)
        return rt_fail(ctx, r, "control socket: %s", strerror(-r));
    if ((r = shmref_acquire(ctx->conn, &back, &out)) < 0)
        return conn_fail(ctx, r, "acquire");
    if (first_word && !ctx->full)
        ctx->bad += *(const uint64_t *)shmref_buf_data(out) != payload_out_word(iter, 0);
    else if (stamps)
        rt_check_stamps(ctx, shmref_buf_data(out), iter);
    else
        rt_check_output(ctx, shmref_buf_data(out), iter);
    if ((r = shmref_release(out)) < 0)
        return conn_fail(ctx, r, "release");
    return 0;
}

static int finish(struct rt_ctx *ctx, shmref_buf *in, uint64_t iter)
{
    return finish_ex(ctx, in, iter, false, false);
}

static int onecopy_call(struct rt_ctx *ctx, uint64_t iter)
{
    shmref_buf *in;
    int r = shmref_lease(ctx->conn, ctx->size, &in);
    if (r < 0)
        return conn_fail(ctx, r, "lease");
    memcpy(shmref_buf_data(in), ctx->in, ctx->size);
    r = finish(ctx, in, iter);
    int r2 = shmref_release(in);
    return r < 0 ? r : r2 < 0 ? conn_fail(ctx, r2, "release") : 0;
}

static int zerocopy_call(struct rt_ctx *ctx, uint64_t iter)
{
    shmref_buf *in;
    int r = shmref_lease(ctx->conn, ctx->size, &in);
    if (r < 0)
        return conn_fail(ctx, r, "lease");
    payload_fill(shmref_buf_data(in), ctx->size, iter);
    r = finish(ctx, in, iter);
    int r2 = shmref_release(in);
    return r < 0 ? r : r2 < 0 ? conn_fail(ctx, r2, "release") : 0;
}

/* pubsub_call: iceoryx's work through shmrefd. Lease, write (every page's stamp, or the
 * first word), publish, descriptor to the server; acquire its reply, read, release. */
static int pubsub_call_ex(struct rt_ctx *ctx, uint64_t iter, bool touch)
{
    shmref_buf *in;
    int r = shmref_lease(ctx->conn, ctx->size, &in);
    if (r < 0)
        return conn_fail(ctx, r, "lease");
    if (ctx->full)
        payload_fill(shmref_buf_data(in), ctx->size, iter);
    else if (touch)
        payload_stamp_pages(shmref_buf_data(in), ctx->size, iter);
    else
        *(uint64_t *)shmref_buf_data(in) = payload_stamp(iter, 0);
    r = finish_ex(ctx, in, iter, !touch, touch);
    int r2 = shmref_release(in);
    return r < 0 ? r : r2 < 0 ? conn_fail(ctx, r2, "release") : 0;
}

static int pubsub_call(struct rt_ctx *ctx, uint64_t iter)
{
    return pubsub_call_ex(ctx, iter, true);
}

static int pubsub_notouch_call(struct rt_ctx *ctx, uint64_t iter)
{
    return pubsub_call_ex(ctx, iter, false);
}

/* ---- server ---- */

/* srv_copy: the one-copy server: input into the heap, its output computed from there
 * into a new lease. */
static int srv_copy(shmref_conn *c, shmref_buf *in, shmref_desc *ret)
{
    size_t size = shmref_buf_size(in);
    void *heap = srv_heap(0, size);
    shmref_buf *out;
    if (!heap)
        return -ENOMEM;
    memcpy(heap, shmref_buf_data(in), size);
    int r = shmref_release(in);
    if (r < 0 || (r = shmref_lease(c, size, &out)) < 0)
        return r;
    payload_transform(shmref_buf_data(out), heap, size, 1);
    return srv_hand_out(out, size, ret);
}

static int srv_reply(shmref_conn *c, shmref_buf *in, int mode, shmref_desc *ret);

static int srv_serve_one(shmref_conn *c, int fd, bool zero_copy)
{
    shmref_desc d, out;
    shmref_buf *in;
    int r = recv_desc(fd, &d);
    if (r < 0)
        return 1; /* the client is done */
    if ((r = shmref_acquire(c, &d, &in)) < 0)
        return r;
    r = zero_copy ? srv_reply(c, in, 2, &out) : srv_copy(c, in, &out);
    return r < 0 ? r : send_desc(fd, &out);
}

/* srv_waits_*: the server's own counts of the times it waited for shmrefd (libshmref's
 * "round_trips" counter) and of the messages it sent it ("sent"), from after its hello to
 * its last call, left for the runner in the file $SHMREF_BENCH_WAITS_FILE as two numbers
 * (rt_server_waits reads them). */
struct srv_counts {
    uint64_t round_trips, sent;
};

static struct srv_counts srv_waits_start(shmref_conn *c)
{
    struct srv_counts v = { 0, 0 };
    shmref_conn_counter(c, "round_trips", &v.round_trips);
    shmref_conn_counter(c, "sent", &v.sent);
    return v;
}

static void srv_waits_report(shmref_conn *c, struct srv_counts start)
{
    const char *path = getenv("SHMREF_BENCH_WAITS_FILE");
    struct srv_counts v;
    if (!path || shmref_conn_counter(c, "round_trips", &v.round_trips) < 0 ||
        shmref_conn_counter(c, "sent", &v.sent) < 0)
        return;
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%llu %llu\n", (unsigned long long)(v.round_trips - start.round_trips),
                (unsigned long long)(v.sent - start.sent));
        fclose(f);
    }
}

/* srv_connect: the server's connection, and its round-trip count after the hello. */
static int srv_connect(const char *socket, shmref_conn **ret, struct srv_counts *ret_w0)
{
    int r = shmref_connect(socket, ret);
    if (r < 0) {
        fprintf(stderr, "shmref-bench server: connect %s: %s\n", socket, strerror(-r));
        return r;
    }
    *ret_w0 = srv_waits_start(*ret);
    return 0;
}

int srv_shmref(int fd, const char *socket, bool zero_copy)
{
    shmref_conn *c;
    struct srv_counts w0;
    int r = srv_connect(socket, &c, &w0);
    if (r < 0)
        return r;
    while ((r = srv_serve_one(c, fd, zero_copy)) == 0)
        ;
    if (r < 0)
        fprintf(stderr, "shmref-bench server: %s: %s\n", strerror(-r), shmref_errmsg(c));
    srv_hand_back();
    srv_waits_report(c, w0);
    shmref_close(c);
    return r < 0 ? r : 0;
}

/* srv_reply: the zero-copy and pub/sub servers' work on one request: a reply leased,
 * computed from the request (mode 2: every word; 1: one word per page; 0: the first
 * word), published and held until the next request; the request released. */
static int srv_reply(shmref_conn *c, shmref_buf *in, int mode, shmref_desc *ret)
{
    size_t size = shmref_buf_size(in);
    shmref_buf *out;
    int r = shmref_lease(c, size, &out);
    if (r < 0)
        return r;
    payload_transform(shmref_buf_data(out), shmref_buf_data(in), size,
                      mode == 2 ? 1 : mode ? BENCH_PAGE / 8 : 0);
    r = srv_hand_out(out, size, ret);
    int r3 = shmref_release(in);
    return r < 0 ? r : r3;
}

int srv_shmref_pubsub(int fd, const char *socket, int mode)
{
    shmref_conn *c;
    struct srv_counts w0;
    int r = srv_connect(socket, &c, &w0);
    if (r < 0)
        return r;
    for (;;) {
        shmref_desc d, out;
        shmref_buf *in;
        if (recv_desc(fd, &d) < 0) {
            r = 0;
            break;
        }
        if ((r = shmref_acquire(c, &d, &in)) < 0 || (r = srv_reply(c, in, mode, &out)) < 0 ||
            (r = send_desc(fd, &out)) < 0)
            break;
    }
    if (r < 0)
        fprintf(stderr, "shmref-bench server: %s: %s\n", strerror(-r), shmref_errmsg(c));
    srv_hand_back();
    srv_waits_report(c, w0);
    shmref_close(c);
    return r;
}

const struct rt_method rt_shmref_pubsub = {
    .name = "shmref-pubsub", .role = "shmref-pubsub", .shmref = true, .open = sh_open,
    .call = pubsub_call, .close = sh_close,
};
const struct rt_method rt_shmref_pubsub_notouch = {
    .name = "shmref-pubsub-notouch", .role = "shmref-pubsub-notouch", .shmref = true, .notouch = true,
    .open = sh_open, .call = pubsub_notouch_call, .close = sh_close,
};

const struct rt_method rt_shmref_1copy = {
    .name = "shmref-1copy", .role = "shmref-1copy", .shmref = true, .open = sh_open,
    .prepare = rt_prepare_heap, .call = onecopy_call, .close = sh_close,
};
const struct rt_method rt_shmref_0copy = {
    .name = "shmref-0copy", .role = "shmref-0copy", .shmref = true, .open = sh_open,
    .call = zerocopy_call, .close = sh_close,
};
const struct rt_method rt_shmref_1copy_nocache = {
    .name = "shmref-1copy-nocache", .role = "shmref-1copy", .shmref = true, .nocache = true,
    .open = sh_open, .prepare = rt_prepare_heap, .call = onecopy_call, .close = sh_close,
};
const struct rt_method rt_shmref_0copy_nocache = {
    .name = "shmref-0copy-nocache", .role = "shmref-0copy", .shmref = true, .nocache = true,
    .open = sh_open, .call = zerocopy_call, .close = sh_close,
};
