/* SPDX-License-Identifier: MIT */
/* iox.c: shmref-bench-iox, the iceoryx 2.0.3 side of the benchmark (built only when the
 * C binding is installed). Two roles, each a process of its own, spawned by the runner
 * (scenario-iox.c) with a control socket on fd 3, against the RouDi the runner started:
 *   shmref-bench-iox server SIZE TOUCH FULL
 *   shmref-bench-iox client SIZE WARMUP ITERS TOUCH FULL
 * The client loans a request chunk, writes it, publishes it on "req"; the server, woken
 * by a WaitSet (blocking, no polling), takes it, reads it, loans a reply chunk, writes
 * it, publishes it on "rep" and releases the request; the client, woken by its WaitSet,
 * takes the reply, reads it and releases it. TOUCH 1: one word per 4 KiB page written
 * and read on each side (the server copies each page's stamp into the reply); TOUCH 0:
 * the first word only. FULL 1 (smoke): every word filled, copied and checked.
 * The client says "ready" when both topics are connected, waits for a byte (the runner
 * pins the processes meanwhile), runs, then writes one line per timed round trip
 * ("%.6f" ms) and "end BAD" (wrong words seen), or "error MSG". The server exits when
 * fd 3 reaches EOF (a thread marks its WaitSet for destruction). */
#include "bench.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <iceoryx_binding_c/log.h>
#include <iceoryx_binding_c/notification_info.h>
#include <iceoryx_binding_c/publisher.h>
#include <iceoryx_binding_c/runtime.h>
#include <iceoryx_binding_c/subscriber.h>
#include <iceoryx_binding_c/wait_set.h>

#define CONNECT_MS 15000              /* discovery through RouDi: every ~100 ms */

struct iox_side {
    iox_pub_storage_t pub_st;
    iox_sub_storage_t sub_st;
    iox_ws_storage_t ws_st;
    iox_pub_t pub;
    iox_sub_t sub;
    iox_ws_t ws;
};

static FILE *ctl;

static void side_open(struct iox_side *s, const char *pub_event, const char *sub_event)
{
    iox_pub_options_t po;
    iox_sub_options_t so;
    iox_pub_options_init(&po);
    po.historyCapacity = 0;
    iox_sub_options_init(&so);
    so.queueCapacity = 4;
    s->pub = iox_pub_init(&s->pub_st, "shmref-bench", "roundtrip", pub_event, &po);
    s->sub = iox_sub_init(&s->sub_st, "shmref-bench", "roundtrip", sub_event, &so);
    s->ws = iox_ws_init(&s->ws_st);
    iox_ws_attach_subscriber_state(s->ws, s->sub, SubscriberState_HAS_DATA, 0, NULL);
}

static void side_close(struct iox_side *s)
{
    iox_ws_detach_subscriber_state(s->ws, s->sub, SubscriberState_HAS_DATA);
    iox_ws_deinit(s->ws);
    iox_sub_deinit(s->sub);
    iox_pub_deinit(s->pub);
}

/* side_connected: both topics have a peer (setup only, untimed). */
static bool side_connected(struct iox_side *s)
{
    for (int i = 0; i < CONNECT_MS / 10; i++) {
        if (iox_pub_has_subscribers(s->pub) && iox_sub_get_subscription_state(s->sub) == SubscribeState_SUBSCRIBED)
            return true;
        usleep(10000);
    }
    return false;
}

/* take: blocks in the WaitSet until a chunk is there; NULL when the WaitSet is gone. */
static const void *take(struct iox_side *s)
{
    iox_notification_info_t info[2];
    uint64_t missed;
    const void *chunk;
    for (;;) {
        if (iox_sub_take_chunk(s->sub, &chunk) == ChunkReceiveResult_SUCCESS)
            return chunk;
        if (iox_ws_wait(s->ws, info, 2, &missed) == 0)
            return NULL;
    }
}

static void write_req(void *buf, size_t size, uint64_t iter, bool touch, bool full)
{
    if (full)
        payload_fill(buf, size, iter);
    else if (touch)
        payload_stamp_pages(buf, size, iter);
    else
        *(uint64_t *)buf = payload_stamp(iter, 0);
}

/* copy_reply: the server's read of the request and write of its own reply (the same
 * work as shmref-pubsub's server: payload_transform). */
static void copy_reply(void *out, const void *in, size_t size, bool touch, bool full)
{
    payload_transform(out, in, size, full ? 1 : touch ? BENCH_PAGE / sizeof(uint64_t) : 0);
}

static size_t check_reply(const void *buf, size_t size, uint64_t iter, bool touch, bool full)
{
    if (full || touch)
        return payload_check(buf, size, iter, full);
    return *(const uint64_t *)buf != payload_out_word(iter, 0);
}

static void *watch_eof(void *arg)
{
    char c;
    while (read(BENCH_CTL_FD, &c, 1) > 0)
        ;
    iox_ws_mark_for_destruction(*(iox_ws_t *)arg);
    return NULL;
}

static int server(size_t size, bool touch, bool full)
{
    struct iox_side s;
    char name[64];
    pthread_t th;
    snprintf(name, sizeof(name), "shmref-bench-iox-s%d", (int)getpid());
    iox_runtime_init(name);
    side_open(&s, "rep", "req");
    if (pthread_create(&th, NULL, watch_eof, &s.ws) != 0)
        return 1;
    int r = 0;
    const void *in;
    while ((in = take(&s))) {
        void *out;
        if (iox_pub_loan_chunk(s.pub, &out, (uint32_t)size) != AllocationResult_SUCCESS) {
            fprintf(stderr, "shmref-bench-iox server: cannot loan %zu bytes\n", size);
            r = 1;
            break;
        }
        copy_reply(out, in, size, touch, full);
        iox_pub_publish_chunk(s.pub, out);
        iox_sub_release_chunk(s.sub, in);
    }
    pthread_join(th, NULL);
    side_close(&s);
    iox_runtime_shutdown();
    return r;
}

static int client(size_t size, unsigned warmup, unsigned iters, bool touch, bool full)
{
    struct iox_side s;
    char name[64], c;
    snprintf(name, sizeof(name), "shmref-bench-iox-c%d", (int)getpid());
    iox_runtime_init(name);
    side_open(&s, "req", "rep");
    double *ms = calloc(iters ? iters : 1, sizeof(double));
    if (!ms || !side_connected(&s)) {
        fprintf(ctl, "error %s\n", ms ? "the server's topics did not connect through RouDi" : "no memory");
        return 1;
    }
    fprintf(ctl, "ready\n");
    fflush(ctl);
    if (read(BENCH_CTL_FD, &c, 1) != 1)
        return 1;
    size_t bad = 0;
    uint64_t iter = (uint64_t)getpid() << 20;
    for (unsigned i = 0; i < warmup + iters; i++) {
        void *req;
        ++iter;
        uint64_t t0 = stats_now_ns();
        if (iox_pub_loan_chunk(s.pub, &req, (uint32_t)size) != AllocationResult_SUCCESS) {
            fprintf(ctl, "error cannot loan a chunk of %zu bytes (mempool config)\n", size);
            return 1;
        }
        write_req(req, size, iter, touch, full);
        iox_pub_publish_chunk(s.pub, req);
        const void *rep = take(&s);
        if (!rep) {
            fprintf(ctl, "error the WaitSet went away\n");
            return 1;
        }
        bad += check_reply(rep, size, iter, touch, full);
        iox_sub_release_chunk(s.sub, rep);
        uint64_t t1 = stats_now_ns();
        if (i >= warmup)
            ms[i - warmup] = (double)(t1 - t0) / 1e6;
    }
    for (unsigned i = 0; i < iters; i++)
        fprintf(ctl, "%.6f\n", ms[i]);
    fprintf(ctl, "end %zu\n", bad);
    fflush(ctl);
    free(ms);
    side_close(&s);
    iox_runtime_shutdown();
    return 0;
}

int main(int argc, char **argv)
{
    iox_set_loglevel(Iceoryx_LogLevel_Warn);
    ctl = fdopen(BENCH_CTL_FD, "w");
    if (!ctl)
        return 2;
    if (argc == 5 && !strcmp(argv[1], "server"))
        return server(strtoull(argv[2], NULL, 10), atoi(argv[3]), atoi(argv[4]));
    if (argc == 7 && !strcmp(argv[1], "client"))
        return client(strtoull(argv[2], NULL, 10), (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]),
                      atoi(argv[5]), atoi(argv[6]));
    fprintf(stderr, "usage: shmref-bench-iox server SIZE TOUCH FULL | client SIZE WARMUP ITERS TOUCH FULL\n");
    return 2;
}
