/* SPDX-License-Identifier: MIT */
/* methods-file.c: the "binref" patterns: arrays passed as files in /dev/shm, the path
 * over the control socket; the server reads the input into its heap and writes its own
 * output (payload_transform) into its file. Fresh: a new file per array on both sides, unlinked after
 * use. Pool4: each side keeps 4 pre-faulted files mapped and copies into the next one
 * (tesseract-core's BinrefWritePool), while the reader maps the peer's file per call,
 * as tesseract-core's decoders do (its pool is on the writer's side only). */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define POOL_SLOTS 4

static unsigned long long file_seq;

/* file_name: a fresh name in /dev/shm, prefixed by the runner's pid for cleanup. */
static void file_name(char *buf, size_t cap, pid_t runner, const char *what)
{
    snprintf(buf, cap, "/dev/shm/shmref-bench-%d-%d-%s-%llu", (int)runner, (int)getpid(), what,
             ++file_seq);
}

/* file_write: create path, size it, map it, copy len bytes in, unmap, close. */
static int file_write(const char *path, const void *src, size_t len)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int r = 0;
    if (ftruncate(fd, (off_t)len) < 0) {
        r = -errno;
    } else {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            r = -errno;
        } else {
            memcpy(p, src, len);
            munmap(p, len);
        }
    }
    close(fd);
    if (r < 0)
        unlink(path);
    return r;
}

/* file_map: a new read-only mapping of path (len bytes), or NULL with errno. */
static const void *file_map(const char *path, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    errno = e;
    return p == MAP_FAILED ? NULL : p;
}

/* exchange: send our file's path, receive the peer's. */
static int exchange(struct rt_ctx *ctx, const char *path, struct wire_path *ret)
{
    struct wire_path m = { .size = ctx->size };
    size_t len;
    snprintf(m.path, sizeof(m.path), "%s", path);
    int r = wire_send_frame(ctx->ctl, &m, sizeof(m), NULL, 0);
    if (r < 0)
        return rt_fail(ctx, r, "send: %s", strerror(-r));
    if ((r = wire_recv_frame(ctx->ctl, ret, sizeof(*ret), &len)) < 0)
        return rt_fail(ctx, r, "receive: %s", strerror(-r));
    if (len != sizeof(*ret) || ret->size != ctx->size)
        return rt_fail(ctx, -EPROTO, "bad reply from the server");
    ret->path[sizeof(ret->path) - 1] = '\0';
    return 0;
}

/* read_output: map the server's file, read it, unmap. */
static int read_output(struct rt_ctx *ctx, const char *path, uint64_t iter)
{
    const void *p = file_map(path, ctx->size);
    if (!p)
        return rt_fail(ctx, -errno, "map %s: %s", path, strerror(errno));
    rt_check_output(ctx, p, iter);
    munmap((void *)p, ctx->size);
    return 0;
}

/* ---- fresh file per call ---- */

static int fresh_call(struct rt_ctx *ctx, uint64_t iter)
{
    char in[120];
    struct wire_path rep = { .path = "" };
    file_name(in, sizeof(in), getpid(), "in");
    int r = file_write(in, ctx->in, ctx->size);
    if (r < 0)
        return rt_fail(ctx, r, "write %s: %s", in, strerror(-r));
    if ((r = exchange(ctx, in, &rep)) == 0)
        r = read_output(ctx, rep.path, iter);
    if (rep.path[0])
        unlink(rep.path);
    unlink(in);
    return r;
}

/* srv_read_input: map the client's file and copy it into the server's heap. */
static void *srv_read_input(const struct wire_path *m)
{
    const void *p = file_map(m->path, m->size);
    void *heap = srv_heap(0, m->size);
    if (!p || !heap) {
        fprintf(stderr, "shmref-bench server: map %s: %s\n", m->path, strerror(errno));
        if (p)
            munmap((void *)p, m->size);
        return NULL;
    }
    memcpy(heap, p, m->size);
    munmap((void *)p, m->size);
    return heap;
}

int srv_binref_fresh(int fd)
{
    struct wire_path m;
    while (wire_recv_path(fd, &m) == 0) {
        void *heap = srv_read_input(&m), *out = srv_heap(2, m.size);
        if (!heap || !out)
            return -EIO;
        payload_transform(out, heap, m.size, 1);
        file_name(m.path, sizeof(m.path), getppid(), "out");
        int r = file_write(m.path, out, m.size);
        if (r < 0)
            return r;
        if ((r = wire_send_frame(fd, &m, sizeof(m), NULL, 0)) < 0)
            return r;
    }
    return 0;
}

/* ---- pool of 4 pre-faulted mapped files per side ---- */

struct slot {
    char path[120];
    void *map;
    size_t cap;
};

struct pool4 {
    struct slot s[POOL_SLOTS];
    unsigned next;
};

static void slots_free(struct pool4 *p)
{
    for (int i = 0; i < POOL_SLOTS; i++) {
        if (p->s[i].map)
            munmap(p->s[i].map, p->s[i].cap);
        if (p->s[i].path[0])
            unlink(p->s[i].path);
    }
    memset(p, 0, sizeof(*p));
}

/* slots_make: 4 files of size bytes, mapped and pre-faulted (written once). */
static int slots_make(struct pool4 *p, size_t size, pid_t runner)
{
    slots_free(p);
    for (int i = 0; i < POOL_SLOTS; i++) {
        struct slot *s = &p->s[i];
        file_name(s->path, sizeof(s->path), runner, "pool");
        int fd = open(s->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
            goto fail;
        s->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        fd = -1;
        if (s->map == MAP_FAILED) {
            s->map = NULL;
            goto fail;
        }
        s->cap = size;
        memset(s->map, 0, size);
        continue;
    fail:;
        int e = errno;
        if (fd >= 0)
            close(fd);
        slots_free(p);
        return -e;
    }
    return 0;
}

static int pool4_open(struct rt_ctx *ctx)
{
    struct pool4 *p = calloc(1, sizeof(*p));
    if (!p)
        return rt_fail(ctx, -ENOMEM, "out of memory");
    ctx->state = p;
    int r = slots_make(p, ctx->size, getpid());
    return r < 0 ? rt_fail(ctx, r, "pool files: %s", strerror(-r)) : 0;
}

static void pool4_close(struct rt_ctx *ctx)
{
    if (ctx->state)
        slots_free(ctx->state);
    free(ctx->state);
    ctx->state = NULL;
}

static int pool4_call(struct rt_ctx *ctx, uint64_t iter)
{
    struct pool4 *p = ctx->state;
    struct slot *s = &p->s[p->next++ % POOL_SLOTS];
    struct wire_path rep;
    memcpy(s->map, ctx->in, ctx->size);
    int r = exchange(ctx, s->path, &rep);
    return r < 0 ? r : read_output(ctx, rep.path, iter);
}

int srv_binref_pool4(int fd)
{
    struct pool4 p = { 0 };
    struct wire_path m;
    int r = 0;
    while (r == 0 && wire_recv_path(fd, &m) == 0) {
        void *heap = srv_read_input(&m);
        if (!heap) {
            r = -EIO;
            break;
        }
        if (p.s[0].cap != m.size && (r = slots_make(&p, m.size, getppid())) < 0)
            break;
        struct slot *s = &p.s[p.next++ % POOL_SLOTS];
        payload_transform(s->map, heap, m.size, 1);
        snprintf(m.path, sizeof(m.path), "%s", s->path);
        r = wire_send_frame(fd, &m, sizeof(m), NULL, 0);
    }
    slots_free(&p);
    return r;
}

const struct rt_method rt_binref_fresh = {
    .name = "binref-fresh", .role = "binref-fresh", .prepare = rt_prepare_heap, .call = fresh_call,
};
const struct rt_method rt_binref_pool4 = {
    .name = "binref-pool4", .role = "binref-pool4", .open = pool4_open,
    .prepare = rt_prepare_heap, .call = pool4_call, .close = pool4_close,
};
