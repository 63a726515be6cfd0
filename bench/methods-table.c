/* SPDX-License-Identifier: MIT */
/* methods-table.c: two rows that measure the same-tenant handoff without any daemon.
 *
 * shm-pair: two reused shared segments, the C form of the Python rows' reused
 * multiprocessing.shared_memory pair (issue 28's reference): the client writes its input
 * in place (every word), sends the iteration number over the control socket; the server
 * computes its output (payload_transform) from the input segment into the output segment
 * and answers; the client reads the output. Nothing is leased, counted or checked: the
 * floor a shared-memory handoff can reach with a socket as the user's channel.
 *
 * table-floor: the same work through proto/handoff.c, the core of tenant-local recycling
 * (docs/architecture.md, "Next: tenant-local recycling"), which shmrefd and libshmref do
 * not use yet: the client plays the daemon once (it makes the table and grants 8 buffers
 * of one class), then every round trip is what the design promises a steady-state
 * handoff costs: a local lease, the input written in place, a token drawn (SipHash of
 * slot and generation under a secret) and published, the 16-byte token on the control
 * socket; the server hashes it, takes the input, leases its output, computes it, publishes
 * it, gives the input and sends its token; the client takes the output, reads it, gives
 * it and its input. It measures the shape, not shmrefd: the row is deleted when the
 * library's path is this (shmref-0copy then measures it). */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "handoff.h"
#include "handoff.h"

/* ---- files both processes map (made by the client, the path sent at open) ---- */

struct shared_file {
    char path[120];
    void *map;
    size_t len;
};

static int file_make(struct shared_file *f, const char *what, size_t len)
{
    snprintf(f->path, sizeof(f->path), "/dev/shm/shmref-bench-%d-%s", (int)getpid(), what);
    int fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int r = ftruncate(fd, (off_t)len) < 0 ? -errno : 0;
    f->map = r ? MAP_FAILED : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!r && f->map == MAP_FAILED)
        r = -errno;
    close(fd);
    if (r) {
        unlink(f->path);
        f->map = NULL;
        return r;
    }
    memset(f->map, 0, len); /* faulted in, as every row's buffers are warm */
    f->len = len;
    return 0;
}

static void file_drop(struct shared_file *f)
{
    if (f->map)
        munmap(f->map, f->len);
    if (f->path[0])
        unlink(f->path);
    memset(f, 0, sizeof(*f));
}

static void *file_open_map(const char *path, size_t len)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* The open message (struct wire_path): the size and the one file's path. */
static int send_open(struct rt_ctx *ctx, const struct shared_file *f)
{
    struct wire_path m = { .size = ctx->size };
    snprintf(m.path, sizeof(m.path), "%s", f->path);
    uint64_t ok;
    size_t len;
    int r = wire_send_frame(ctx->ctl, &m, sizeof(m), NULL, 0);
    if (r < 0 || (r = wire_recv_frame(ctx->ctl, &ok, sizeof(ok), &len)) < 0)
        return rt_fail(ctx, r, "control socket: %s", strerror(-r));
    return 0;
}

/* ---- shm-pair ---- */

static struct shared_file pair;

static int pair_open(struct rt_ctx *ctx)
{
    int r = file_make(&pair, "pair", 2 * ctx->size);
    if (r < 0)
        return rt_fail(ctx, r, "make the segments: %s", strerror(-r));
    return send_open(ctx, &pair);
}

static int pair_call(struct rt_ctx *ctx, uint64_t iter)
{
    char *in = pair.map, *out = in + ctx->size;
    size_t len;
    payload_fill(in, ctx->size, iter);
    int r = wire_send_frame(ctx->ctl, &iter, sizeof(iter), NULL, 0);
    uint64_t back;
    if (r < 0 || (r = wire_recv_frame(ctx->ctl, &back, sizeof(back), &len)) < 0)
        return rt_fail(ctx, r, "control socket: %s", strerror(-r));
    rt_check_output(ctx, out, iter);
    return 0;
}

static void pair_close(struct rt_ctx *ctx)
{
    (void)ctx;
    file_drop(&pair);
}

int srv_shm_pair(int fd)
{
    struct wire_path m;
    int r = wire_recv_path(fd, &m);
    char *in = r < 0 ? NULL : file_open_map(m.path, 2 * m.size);
    uint64_t iter;
    size_t len;
    if (!in || (r = wire_send_frame(fd, &m.size, sizeof(m.size), NULL, 0)) < 0)
        return r < 0 ? r : -EIO;
    while (wire_recv_frame(fd, &iter, sizeof(iter), &len) == 0) {
        payload_transform(in + m.size, in, m.size, 1);
        if ((r = wire_send_frame(fd, &iter, sizeof(iter), NULL, 0)) < 0)
            return r;
    }
    return 0;
}

/* ---- table-floor ---- */

#define TF_SLOTS 8u
#define TF_CLASS 0u

/* The layout of the one file: the table, the two journals, the buffers (page-aligned). */
struct tf {
    void *tab;
    _Atomic uint32_t *journal;      /* this process's */
    char *bufs;
    size_t stride;
    uint8_t secret[16];             /* this process's token secret */
    uint64_t drawn;
};

static size_t tf_stride(size_t size)
{
    return (size + 4095) & ~(size_t)4095;
}

static size_t tf_len(size_t size)
{
    return handoff_size(TF_SLOTS) + 2 * TF_SLOTS * sizeof(uint32_t) + 4096 + TF_SLOTS * tf_stride(size);
}

static void tf_layout(struct tf *t, void *map, size_t size, int side)
{
    char *p = map;
    t->tab = p;
    t->journal = (_Atomic uint32_t *)(p + handoff_size(TF_SLOTS)) + side * TF_SLOTS;
    size_t off = handoff_size(TF_SLOTS) + 2 * TF_SLOTS * sizeof(uint32_t);
    t->bufs = p + ((off + 4095) & ~(size_t)4095);
    t->stride = tf_stride(size);
    for (unsigned i = 0; i < sizeof(t->secret); i++)
        t->secret[i] = (uint8_t)(side * 31 + i * 7 + getpid());
}

/* token: what a descriptor would carry: the slot in bytes 0..3 and 96 bits that no other
 * uid can guess (SipHash of the slot, the generation and a counter under a secret). */
struct tf_token {
    uint8_t b[16];
};

static struct tf_token tf_draw(struct tf *t, uint32_t slot, uint32_t seq)
{
    struct tf_token k;
    uint64_t in[2] = { (uint64_t)slot << 32 | seq, ++t->drawn };
    uint64_t a = handoff_siphash(t->secret, in, sizeof(in));
    in[1] ^= 0x5555555555555555ull;
    uint64_t b = handoff_siphash(t->secret, in, sizeof(in));
    memcpy(k.b, &slot, 4);
    memcpy(k.b + 4, &a, 8);
    memcpy(k.b + 12, &b, 4);
    return k;
}

static uint64_t tf_hash(struct tf *t, const struct tf_token *k)
{
    return handoff_siphash(((const struct handoff_header *)t->tab)->key, k->b, sizeof(k->b));
}

static uint32_t tf_slot(const struct tf_token *k)
{
    uint32_t s;
    memcpy(&s, k->b, 4);
    return s;
}

/* tf_publish: lease, fill (fill(dst, src, size, arg)), publish; the token in *ret. */
static int tf_lease(struct tf *t, uint32_t *slot, uint32_t *seq)
{
    return handoff_lease(t->tab, t->journal, TF_CLASS, HANDOFF_TRIES, slot, seq);
}

static int tf_publish(struct tf *t, uint32_t slot, uint32_t seq, size_t size, struct tf_token *ret)
{
    *ret = tf_draw(t, slot, seq);
    return handoff_publish(t->tab, slot, seq, tf_hash(t, ret), size);
}

static char *tf_take(struct tf *t, const struct tf_token *k, size_t size, uint32_t *ret_slot)
{
    uint32_t slot = tf_slot(k), seq;
    if (slot >= TF_SLOTS || handoff_take(t->tab, t->journal, slot, tf_hash(t, k), size, HANDOFF_TRIES, &seq) != 0)
        return NULL;
    *ret_slot = slot;
    return t->bufs + slot * t->stride;
}

static struct shared_file tf_file;
static struct tf tf_client;

static int tf_open(struct rt_ctx *ctx)
{
    int r = file_make(&tf_file, "table", tf_len(ctx->size));
    if (r < 0)
        return rt_fail(ctx, r, "make the table: %s", strerror(-r));
    uint8_t key[16];
    for (unsigned i = 0; i < sizeof(key); i++)
        key[i] = (uint8_t)(i * 13 + getpid());
    handoff_init(tf_file.map, TF_SLOTS, getuid(), key);
    tf_layout(&tf_client, tf_file.map, ctx->size, 0);
    for (uint32_t s = 0; s < TF_SLOTS; s++)
        if ((r = handoff_grant(tf_client.tab, s, TF_CLASS, s + 1, HANDOFF_TRIES)) < 0)
            return rt_fail(ctx, r, "grant: %s", strerror(-r));
    return send_open(ctx, &tf_file);
}

static int tf_call(struct rt_ctx *ctx, uint64_t iter)
{
    struct tf *t = &tf_client;
    uint32_t in_slot, seq, out_slot;
    struct tf_token k, back;
    size_t len;
    int r = tf_lease(t, &in_slot, &seq);
    if (r < 0)
        return rt_fail(ctx, r, "local lease: %s", strerror(-r));
    payload_fill(t->bufs + in_slot * t->stride, ctx->size, iter);
    if ((r = tf_publish(t, in_slot, seq, ctx->size, &k)) < 0)
        return rt_fail(ctx, r, "local publish: %s", strerror(-r));
    if ((r = wire_send_frame(ctx->ctl, &k, sizeof(k), NULL, 0)) < 0 ||
        (r = wire_recv_frame(ctx->ctl, &back, sizeof(back), &len)) < 0)
        return rt_fail(ctx, r, "control socket: %s", strerror(-r));
    const char *out = tf_take(t, &back, ctx->size, &out_slot);
    if (!out)
        return rt_fail(ctx, -EAGAIN, "take of the output failed");
    rt_check_output(ctx, out, iter);
    if (handoff_give(t->tab, t->journal, out_slot, HANDOFF_TRIES) < 0 ||
        handoff_give(t->tab, t->journal, in_slot, HANDOFF_TRIES) < 0)
        return rt_fail(ctx, -EIO, "give failed");
    return 0;
}

static void tf_close(struct rt_ctx *ctx)
{
    (void)ctx;
    file_drop(&tf_file);
}

int srv_table_floor(int fd)
{
    struct wire_path m;
    int r = wire_recv_path(fd, &m);
    void *map = r < 0 ? NULL : file_open_map(m.path, tf_len(m.size));
    if (!map || (r = wire_send_frame(fd, &m.size, sizeof(m.size), NULL, 0)) < 0)
        return r < 0 ? r : -EIO;
    struct tf t;
    tf_layout(&t, map, m.size, 1);
    struct tf_token k, out_k;
    size_t len;
    uint32_t prev = HANDOFF_NO_SLOT;
    while (wire_recv_frame(fd, &k, sizeof(k), &len) == 0) {
        uint32_t in_slot, out_slot, seq;
        /* its previous output, held until the client's next request (by which it has
         * taken it): the hold a retention would keep in the library */
        if (prev != HANDOFF_NO_SLOT && handoff_give(t.tab, t.journal, prev, HANDOFF_TRIES) < 0)
            return -EIO;
        const char *in = tf_take(&t, &k, m.size, &in_slot);
        if (!in || tf_lease(&t, &out_slot, &seq) < 0)
            return -EAGAIN;
        payload_transform(t.bufs + out_slot * t.stride, in, m.size, 1);
        if (tf_publish(&t, out_slot, seq, m.size, &out_k) < 0)
            return -ESTALE;
        if (handoff_give(t.tab, t.journal, in_slot, HANDOFF_TRIES) < 0)
            return -EIO;
        if ((r = wire_send_frame(fd, &out_k, sizeof(out_k), NULL, 0)) < 0)
            return r;
        prev = out_slot;
    }
    return 0;
}

const struct rt_method rt_shm_pair = {
    .name = "shm-pair", .role = "shm-pair", .open = pair_open, .call = pair_call, .close = pair_close,
};
const struct rt_method rt_table_floor = {
    .name = "table-floor", .role = "table-floor", .open = tf_open, .call = tf_call, .close = tf_close,
};
