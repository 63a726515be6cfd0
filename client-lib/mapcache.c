/* SPDX-License-Identifier: MIT */
/* mapcache.c: see client.h. Keyed by the daemon-issued buffer id, which names one
 * backing file for the daemon's lifetime, never by fd number (fd numbers are reused,
 * and a cache keyed by them hands out the wrong memory). Entries are found through two
 * balanced trees (tsearch(3): by buffer id and access, by address) and idle ones are
 * kept in a list in order of last use, so no operation scans the cache. */
#include "mapcache.h"
#include "proto.h"

#include <errno.h>
#include <search.h>
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

static int cmp_id(const void *a, const void *b)
{
    const struct mapcache_entry *x = a, *y = b;
    if (x->buf_id != y->buf_id)
        return x->buf_id < y->buf_id ? -1 : 1;
    return (int)x->writable - (int)y->writable;
}

static int cmp_addr(const void *a, const void *b)
{
    const struct mapcache_entry *x = a, *y = b;
    return x->addr == y->addr ? 0 : (uintptr_t)x->addr < (uintptr_t)y->addr ? -1 : 1;
}

/* An entry is in by_id only while it is the one mapping of its (buf_id, access). */
static struct mapcache_entry *by_id(struct mapcache *mc, uint64_t buf_id, bool writable)
{
    struct mapcache_entry key = { .buf_id = buf_id, .writable = writable };
    void *n = tfind(&key, &mc->by_id, cmp_id);
    return n ? *(struct mapcache_entry **)n : NULL;
}

static struct mapcache_entry *by_addr(struct mapcache *mc, void *addr)
{
    struct mapcache_entry key = { .addr = addr };
    void *n = tfind(&key, &mc->by_addr, cmp_addr);
    return n ? *(struct mapcache_entry **)n : NULL;
}

static void lru_unlink(struct mapcache *mc, struct mapcache_entry *e)
{
    if (e->lru_prev) e->lru_prev->lru_next = e->lru_next; else mc->lru_head = e->lru_next;
    if (e->lru_next) e->lru_next->lru_prev = e->lru_prev; else mc->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
    mc->n_idle--;
    mc->idle_bytes -= e->len;
}

static void lru_append(struct mapcache *mc, struct mapcache_entry *e)
{
    e->lru_next = NULL;
    e->lru_prev = mc->lru_tail;
    if (mc->lru_tail) mc->lru_tail->lru_next = e; else mc->lru_head = e;
    mc->lru_tail = e;
    mc->n_idle++;
    mc->idle_bytes += e->len;
}

static void use(struct mapcache *mc, struct mapcache_entry *e)
{
    if (e->users++ == 0)
        lru_unlink(mc, e);
}

/* forget: take e out of both trees (and the idle list) and free it; the mapping stays. */
static void forget(struct mapcache *mc, struct mapcache_entry *e)
{
    if (e->users == 0)
        lru_unlink(mc, e);
    if (by_id(mc, e->buf_id, e->writable) == e)
        tdelete(e, &mc->by_id, cmp_id);
    tdelete(e, &mc->by_addr, cmp_addr);
    mc->n--;
    free(e);
}

/* unmap: unmap e (telling on_unmap when it was the one mapping of its kind) and free it. */
static void unmap(struct mapcache *mc, struct mapcache_entry *e)
{
    bool indexed = by_id(mc, e->buf_id, e->writable) == e;
    uint64_t buf_id = e->buf_id;
    bool writable = e->writable;
    munmap(e->addr, e->len);
    forget(mc, e);
    if (indexed && mc->on_unmap)
        mc->on_unmap(mc->ctx, buf_id, writable);
}

/* insert: a new entry for a mapping made at addr, with one user. */
static int insert(struct mapcache *mc, uint64_t buf_id, void *addr, size_t len, bool writable)
{
    struct mapcache_entry *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    *e = (struct mapcache_entry){ .buf_id = buf_id, .addr = addr, .len = len, .writable = writable, .users = 1 };
    if (!tsearch(e, &mc->by_addr, cmp_addr)) {
        free(e);
        return -ENOMEM;
    }
    if (!by_id(mc, buf_id, writable) && !tsearch(e, &mc->by_id, cmp_id)) {
        tdelete(e, &mc->by_addr, cmp_addr);
        free(e);
        return -ENOMEM;
    }
    mc->n++;
    return 0;
}

void *mapcache_find(struct mapcache *mc, uint64_t buf_id, size_t len, bool writable)
{
    struct mapcache_entry *e = by_id(mc, buf_id, writable);
    if (e && e->len == len) {
        use(mc, e);
        return e->addr;
    }
    if (writable)
        return NULL;
    /* A read-only handle never gets a writable mapping: a PROT_READ view of the same
     * pages (mremap of a shared mapping with old size 0 maps them again elsewhere). */
    struct mapcache_entry *w = by_id(mc, buf_id, true);
    if (!w || w->len != len || e)
        return NULL;
    void *addr = mremap(w->addr, 0, len, MREMAP_MAYMOVE);
    if (addr == MAP_FAILED)
        return NULL;
    if (mprotect(addr, len, PROT_READ) < 0 || insert(mc, buf_id, addr, len, false) < 0) {
        munmap(addr, len);
        return NULL;
    }
    by_addr(mc, addr)->view = true;
    return addr;
}

void *mapcache_find_ro(struct mapcache *mc, uint64_t buf_id, size_t len, size_t *ret_len)
{
    struct mapcache_entry *e = by_id(mc, buf_id, false);
    if (!e || e->nocache || e->len < len)
        return NULL;
    use(mc, e);
    *ret_len = e->len;
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
    addr = mmap(NULL, len, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED)
        return -errno;
    int r = insert(mc, buf_id, addr, len, writable);
    if (r < 0) {
        munmap(addr, len);
        return r;
    }
    *ret_addr = addr;
    return 0;
}

/* trim: unmap least recently used idle mappings until within both bounds. */
static void trim(struct mapcache *mc)
{
    while (mc->lru_head && (mc->idle_bytes > mc->max_idle_bytes || mc->n_idle > mc->max_idle))
        unmap(mc, mc->lru_head);
}

void mapcache_put(struct mapcache *mc, void *addr)
{
    struct mapcache_entry *e = by_addr(mc, addr);
    if (!e || e->users == 0)
        return;
    if (--e->users > 0)
        return;
    if (e->nocache || by_id(mc, e->buf_id, e->writable) != e) {
        lru_append(mc, e); /* unmap() takes an idle entry off the list */
        unmap(mc, e);
        return;
    }
    lru_append(mc, e);
    trim(mc);
}

void mapcache_nocache(struct mapcache *mc, void *addr)
{
    struct mapcache_entry *e = by_addr(mc, addr);
    if (e)
        e->nocache = true;
}

unsigned mapcache_drop_idle(struct mapcache *mc)
{
    unsigned n = 0;
    while (mc->lru_head) {
        unmap(mc, mc->lru_head);
        n++;
    }
    return n;
}

void mapcache_drop(struct mapcache *mc, void *addr)
{
    struct mapcache_entry *e = by_addr(mc, addr);
    if (e)
        unmap(mc, e);
}

void mapcache_drop_view(struct mapcache *mc, uint64_t buf_id)
{
    struct mapcache_entry *e = by_id(mc, buf_id, false);
    if (e && e->view && e->users == 0)
        unmap(mc, e);
}

void *mapcache_ref(struct mapcache *mc, void *addr)
{
    struct mapcache_entry *e = by_addr(mc, addr);
    if (!e)
        return addr; /* not cached (a forked child's inherited mapping): stays mapped */
    use(mc, e);
    return addr;
}

unsigned mapcache_users(struct mapcache *mc, void *addr)
{
    struct mapcache_entry *e = by_addr(mc, addr);
    return e ? e->users : 0;
}

static void free_node(void *p)
{
    (void)p; /* entries are freed from by_addr */
}

static __thread bool clear_unmaps;
static void unmap_free(void *p)
{
    struct mapcache_entry *e = p;
    if (clear_unmaps)
        munmap(e->addr, e->len);
    free(e);
}

/* release_all: free every entry (unmapping it when unmap_too), the trees with them. */
static void release_all(struct mapcache *mc, bool unmap_too)
{
    tdestroy(mc->by_id, free_node);
    /* tdestroy's callback has no context: a thread-local flag set for this call only. */
    clear_unmaps = unmap_too;
    tdestroy(mc->by_addr, unmap_free);
    clear_unmaps = false;
    mc->by_id = mc->by_addr = NULL;
}

void mapcache_clear(struct mapcache *mc)
{
    release_all(mc, true);
    mapcache_init(mc);
}

void mapcache_abandon(struct mapcache *mc)
{
    struct mapcache save = *mc;
    release_all(mc, false);
    mapcache_init(mc);
    mc->on_unmap = save.on_unmap;
    mc->ctx = save.ctx;
    mc->max_idle_bytes = save.max_idle_bytes;
    mc->fixed = save.fixed;
}
