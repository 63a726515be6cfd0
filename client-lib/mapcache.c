/* SPDX-License-Identifier: MIT */
/* mapcache.c: see client.h. Keyed by the daemon-issued buffer id, which names one
 * backing file for the daemon's lifetime, never by fd number (fd numbers are reused,
 * and a cache keyed by them hands out the wrong memory). */
#include "client.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "units.h"

#define DEFAULT_MAX_IDLE_BYTES (1ULL << 30)
#define DEFAULT_MAX_IDLE PROTO_MAX_IDLE_MAPPINGS /* the daemon sizes its fd-once set by it */

void mapcache_init(struct mapcache *mc)
{
    *mc = (struct mapcache){ .max_idle_bytes = DEFAULT_MAX_IDLE_BYTES, .max_idle = DEFAULT_MAX_IDLE };
    const char *e = getenv("SHMREF_MAP_CACHE");
    uint64_t v;
    if (e && units_parse(e, &v) == 0) {
        mc->max_idle_bytes = v;
        mc->fixed = true;
    } else if (e && e[0] == '0' && e[1] == '\0') {
        mc->max_idle_bytes = 0;
        mc->fixed = true;
    }
}

void mapcache_fit(struct mapcache *mc, uint64_t max_lease)
{
    /* Two of the largest leases idle at once (a producer's last input and output) must
     * stay mapped, or arrays near that size are re-mapped on every round trip. */
    if (!mc->fixed && max_lease <= UINT64_MAX / 2 && 2 * max_lease > mc->max_idle_bytes)
        mc->max_idle_bytes = 2 * max_lease;
}

static struct mapcache_entry *lookup(struct mapcache *mc, uint64_t buf_id, size_t len, bool writable)
{
    for (unsigned i = 0; i < mc->n; i++) {
        struct mapcache_entry *e = &mc->v[i];
        if (e->buf_id == buf_id && e->len == len && (e->writable || !writable))
            return e;
    }
    return NULL;
}

static void use(struct mapcache *mc, struct mapcache_entry *e)
{
    if (e->users++ == 0)
        mc->idle_bytes -= e->len;
    e->last_use = ++mc->tick;
}

void *mapcache_find(struct mapcache *mc, uint64_t buf_id, size_t len, bool writable)
{
    struct mapcache_entry *e = lookup(mc, buf_id, len, writable);
    if (!e)
        return NULL;
    use(mc, e);
    return e->addr;
}

int mapcache_get(struct mapcache *mc, uint64_t buf_id, int fd, size_t len, bool writable,
                 void **ret_addr)
{
    void *addr = mapcache_find(mc, buf_id, len, writable);
    if (addr) {
        *ret_addr = addr;
        return 0;
    }
    if (mc->n == mc->cap) {
        unsigned cap = mc->cap ? mc->cap * 2 : 16;
        struct mapcache_entry *v = realloc(mc->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        mc->v = v;
        mc->cap = cap;
    }
    addr = mmap(NULL, len, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED)
        return -errno;
    struct mapcache_entry *e = &mc->v[mc->n++];
    *e = (struct mapcache_entry){ .buf_id = buf_id, .addr = addr, .len = len, .writable = writable };
    mc->idle_bytes += len; /* use() takes it back out */
    use(mc, e);
    *ret_addr = addr;
    return 0;
}

static unsigned idle_count(const struct mapcache *mc)
{
    unsigned n = 0;
    for (unsigned i = 0; i < mc->n; i++)
        n += mc->v[i].users == 0;
    return n;
}

/* trim: unmap least recently used idle mappings until within both bounds. */
static void trim(struct mapcache *mc)
{
    while (mc->idle_bytes > mc->max_idle_bytes || idle_count(mc) > mc->max_idle) {
        struct mapcache_entry *oldest = NULL;
        for (unsigned i = 0; i < mc->n; i++)
            if (mc->v[i].users == 0 && (!oldest || mc->v[i].last_use < oldest->last_use))
                oldest = &mc->v[i];
        if (!oldest)
            return;
        munmap(oldest->addr, oldest->len);
        mc->idle_bytes -= oldest->len;
        if (mc->on_unmap)
            mc->on_unmap(mc->ctx, oldest->buf_id, oldest->writable);
        *oldest = mc->v[--mc->n];
    }
}

void mapcache_put(struct mapcache *mc, void *addr)
{
    for (unsigned i = 0; i < mc->n; i++) {
        struct mapcache_entry *e = &mc->v[i];
        if (e->addr != addr)
            continue;
        if (e->users > 0 && --e->users == 0)
            mc->idle_bytes += e->len;
        trim(mc);
        return;
    }
}

unsigned mapcache_drop_idle(struct mapcache *mc)
{
    uint64_t keep = mc->max_idle_bytes;
    unsigned before = mc->n;
    mc->max_idle_bytes = 0;
    trim(mc);
    mc->max_idle_bytes = keep;
    return before - mc->n;
}

void mapcache_drop(struct mapcache *mc, void *addr)
{
    for (unsigned i = 0; i < mc->n; i++) {
        struct mapcache_entry *e = &mc->v[i];
        if (e->addr != addr)
            continue;
        munmap(e->addr, e->len);
        if (e->users == 0)
            mc->idle_bytes -= e->len;
        if (mc->on_unmap)
            mc->on_unmap(mc->ctx, e->buf_id, e->writable);
        *e = mc->v[--mc->n];
        return;
    }
}

void mapcache_drop_idle_one(struct mapcache *mc, void *addr)
{
    for (unsigned i = 0; i < mc->n; i++)
        if (mc->v[i].addr == addr) {
            if (mc->v[i].users == 0)
                mapcache_drop(mc, addr);
            return;
        }
}

void mapcache_clear(struct mapcache *mc)
{
    for (unsigned i = 0; i < mc->n; i++)
        munmap(mc->v[i].addr, mc->v[i].len);
    free(mc->v);
    mapcache_init(mc);
}
