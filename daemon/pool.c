/* SPDX-License-Identifier: MIT */
/* pool.c: see pool.h. How a backing file is made, checked and reopened is the store's
 * (store.c). Creating and reserving a buffer (fallocate of up to gigabytes) runs in
 * libuv's thread pool; all other state is touched only on the loop thread. */
#include "pool.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "handoff.h"
#include "store.h"
#include "units.h"

/* pool_doomed: an fd of a retired buffer, to close; empty > 0: free the file's pages first
 * (store_empty over that many bytes), so no stale mapping keeps them. */
struct pool_doomed {
    int fd;
    uint64_t empty;
};

struct pool_class {
    struct pool_class_stat st;
    struct pool_buf *free_head;
};

struct pool {
    uv_loop_t *loop;
    struct store store;         /* backing files; a huge-page dir: classes follow */
    uint64_t cap, unit;
    unsigned unit_bits;
    uint64_t bytes_alloc, bytes_warm, bytes_creating;
    uint64_t next_id;
    uint64_t nfds, fd_budget;   /* fds held by buffers (and being created), and the most */
    struct pool_doomed *batch;  /* fds of retired buffers, to empty and close (see flush) */
    unsigned nbatch, batch_cap;
    uint64_t batch_bytes;
    _Atomic uint64_t closing_bytes; /* batches queued to close off the loop, not yet closed */
    _Atomic uint64_t empty_failed;  /* store_empty failures (off the loop), for the log */
    bool closing;               /* pool_free: the loop no longer runs */
    struct pool_buf *lru_head, *lru_tail;
    struct pool_buf **ids;      /* every buffer (live, warm or pinned) by id */
    uint64_t nids, id_buckets;
    uint64_t bytes_pinned;      /* pinned buffers, warm or retired */
    uint64_t bytes_retired_pinned; /* of those, retired: outside bytes_alloc, inside the cap */
    pool_pin_cb pin_cb;
    void *pin_arg;
    struct pool_mapper *mappers; /* processes whose connection closed, still charged */
    uint64_t stock_reserve, bytes_stock; /* see pool_set_stock */
    pool_pin_cb stock_cb;
    void *stock_arg;
    bool keep_pages;            /* pool_stop: retired files are no longer emptied */
    uint32_t next_slot;         /* slots below it were handed out once */
    uint32_t *free_slots;       /* slots given back, reused first (a stack) */
    uint32_t nfree_slots, free_slots_cap, slots_used;
    struct pool_counters counters;
    struct pool_class classes[POOL_MAX_CLASSES];
};

/* pool_mapper: a client process whose connection closed while it mapped buffers whose
 * pages the pool cannot free (sealed memfds). Its mappings stay counted (charged to uid)
 * until its pidfd turns readable: the process exited, and its mappings with it. */
struct pool_mapper {
    uv_poll_t poll;
    struct pool *pool;
    pid_t pid;
    uint32_t uid;
    int pidfd;
    unsigned n, cap;
    uint64_t *ids;
    struct pool_mapper *next;
};

struct pool_create {
    uv_work_t work;
    struct pool *pool;
    uint64_t size;
    uint16_t cls;
    uint32_t tenant;
    bool stock;
    int fd, err;
    pool_get_cb cb;
    void *data;
};

static char why_buf[512];

int pool_new(uv_loop_t *loop, const char *dir, uint64_t cap, bool use_memfd,
             struct pool **ret, const char **ret_why)
{
    struct statvfs sv;
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];

    if (statvfs(dir, &sv) < 0) {
        int e = errno;
        snprintf(why_buf, sizeof(why_buf), "pool directory %s: %s", dir, strerror(e));
        *ret_why = why_buf;
        return -e;
    }
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    if (cap > avail) {
        snprintf(why_buf, sizeof(why_buf),
                 "pool size %s (%llu bytes) does not fit in %s: %s (%llu bytes) available; "
                 "lower --pool-size or enlarge the tmpfs (for docker: --shm-size)",
                 units_format(cap, a), (unsigned long long)cap, dir, units_format(avail, b),
                 (unsigned long long)avail);
        *ret_why = why_buf;
        return -ENOSPC;
    }
    struct pool *p = calloc(1, sizeof(*p));
    if (!p) {
        *ret_why = "out of memory";
        return -ENOMEM;
    }
    int r = store_open(&p->store, dir, use_memfd, why_buf, sizeof(why_buf));
    if (r < 0) {
        free(p);
        *ret_why = why_buf;
        return r;
    }
    p->loop = loop;
    p->cap = cap;
    struct rlimit rl;
    uint64_t lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 1048576;
    p->fd_budget = pool_fd_budget_of(lim);
    p->unit = (uint64_t)sysconf(_SC_PAGESIZE);
    p->unit_bits = (unsigned)__builtin_ctzll(p->unit);
    *ret = p;
    return 0;
}

static int class_of(const struct pool *p, uint64_t size, uint64_t *ret_size);

/* ---- buffers by id (ids are sequential: id & mask spreads them evenly) ---------- */

static struct pool_buf *id_find(const struct pool *p, uint64_t id)
{
    if (!p->ids)
        return NULL;
    struct pool_buf *b = p->ids[id & (p->id_buckets - 1)];
    while (b && b->id != id)
        b = b->id_next;
    return b;
}

static void id_add(struct pool *p, struct pool_buf *b)
{
    if (p->nids >= p->id_buckets) {
        uint64_t n = p->id_buckets ? p->id_buckets * 2 : 64;
        struct pool_buf **v = calloc(n, sizeof(*v));
        if (v) {
            for (uint64_t i = 0; i < p->id_buckets; i++)
                while (p->ids[i]) {
                    struct pool_buf *x = p->ids[i];
                    p->ids[i] = x->id_next;
                    x->id_next = v[x->id & (n - 1)];
                    v[x->id & (n - 1)] = x;
                }
            free(p->ids);
            p->ids = v;
            p->id_buckets = n;
        } else if (!p->ids) {
            return; /* not findable: its mappings go uncounted, nothing breaks */
        }
    }
    struct pool_buf **head = &p->ids[b->id & (p->id_buckets - 1)];
    b->id_next = *head;
    *head = b;
    p->nids++;
}

static void id_remove(struct pool *p, struct pool_buf *b)
{
    if (!p->ids)
        return;
    struct pool_buf **pp = &p->ids[b->id & (p->id_buckets - 1)];
    while (*pp && *pp != b)
        pp = &(*pp)->id_next;
    if (*pp) {
        *pp = b->id_next;
        p->nids--;
    }
}

/* slot_get: a dense slot for a new buffer (the ledger's index), or HANDOFF_NO_SLOT. */
static uint32_t slot_get(struct pool *p)
{
    uint32_t slot = HANDOFF_NO_SLOT;
    if (p->nfree_slots)
        slot = p->free_slots[--p->nfree_slots];
    else if (p->next_slot < HANDOFF_MAX_SLOTS)
        slot = p->next_slot++;
    p->slots_used += slot != HANDOFF_NO_SLOT;
    return slot;
}

/* slot_put: b's slot is free again (its file is closed and no client maps it). If the
 * stack cannot grow the slot is lost: the buffer that would have had it asks the daemon. */
static void slot_put(struct pool *p, uint32_t slot)
{
    if (slot == HANDOFF_NO_SLOT)
        return;
    p->slots_used--;
    if (p->nfree_slots == p->free_slots_cap) {
        uint32_t cap = p->free_slots_cap ? p->free_slots_cap * 2 : 64;
        uint32_t *v = realloc(p->free_slots, cap * sizeof(*v));
        if (!v)
            return;
        p->free_slots = v;
        p->free_slots_cap = cap;
    }
    p->free_slots[p->nfree_slots++] = slot;
}

uint32_t pool_slots_used(const struct pool *p)
{
    return p->slots_used;
}

uint32_t pool_slot_of(const struct pool *p, uint64_t id, uint32_t tenant)
{
    const struct pool_buf *b = id_find(p, id);
    return b && b->tenant == tenant ? b->slot : HANDOFF_NO_SLOT;
}

static void buf_free(struct pool *p, struct pool_buf *b)
{
    id_remove(p, b);
    slot_put(p, b->slot);
    free(b->pins);
    free(b);
}

/* The classes: up to four pages every page count; then four steps per power of two up to
 * POOL_FINE_FROM (so at most 25% is wasted on small buffers, which share few classes and
 * recycle well), and from there POOL_FINE_STEPS steps per power of two (at most 1/32,
 * 3.1%, on large arrays: 150 MB is charged 144 MiB, not 160 MiB). A step is never below a
 * page (with 64 KiB pages the fine steps start at 2 MiB). Every step from 2 MiB up is a
 * multiple of 2 MiB or divides it, so rounding to the store's piece (store_round) before
 * and after the class rounding lands on a class; on a huge-page pool sizes above 1 MiB
 * are charged whole 2 MiB pages, so below 64 MiB the classes there are the 2 MiB
 * multiples. On huge=always even a small file takes a 2 MiB page, so it is charged one
 * and comes back with the blocks the integrity check expects. Sizes up to 2^46: about
 * 860 classes with 4 KiB pages (POOL_MAX_CLASSES bounds them). */
#define POOL_FINE_FROM_BITS 20   /* 1 MiB */
#define POOL_FINE_STEPS_BITS 5   /* 32 steps per power of two */

/* fine_from: the power of two (its bit) where the fine steps start for this page size. */
static unsigned fine_from(const struct pool *p)
{
    unsigned b = p->unit_bits + POOL_FINE_STEPS_BITS;
    return b > POOL_FINE_FROM_BITS ? b : POOL_FINE_FROM_BITS;
}

/* class_round: n (page-rounded, above four pages) rounded up to its step. */
static uint64_t class_round(const struct pool *p, uint64_t n)
{
    unsigned k = 63 - (unsigned)__builtin_clzll(n);
    uint64_t step = 1ULL << (k - (k >= fine_from(p) ? POOL_FINE_STEPS_BITS : 2));
    return (n + step - 1) & ~(step - 1);
}

/* class_of: the class index and size for size bytes, or -1 if beyond every class. */
static int class_of(const struct pool *p, uint64_t size, uint64_t *ret_size)
{
    if (size > (1ULL << 46)) /* before any rounding, which could wrap around */
        return -1;
    size = store_round(&p->store, size);
    uint64_t u = p->unit;
    if (size == 0)
        size = 1;
    uint64_t n = (size + u - 1) / u * u;
    if (n <= 4 * u) {
        *ret_size = n;
        return (int)(n / u) - 1;
    }
    n = store_round(&p->store, class_round(p, n));
    unsigned k = 63 - (unsigned)__builtin_clzll(n), f = fine_from(p);
    int idx;
    if (k < f) { /* four steps: m is 4..7 */
        unsigned m = (unsigned)(n >> (k - 2));
        idx = 3 + (int)(k - p->unit_bits - 2) * 4 + (int)(m - 4);
    } else {     /* after the coarse ones, 32 steps: m is 32..63 */
        unsigned m = (unsigned)(n >> (k - POOL_FINE_STEPS_BITS));
        idx = 4 + (int)(f - p->unit_bits - 2) * 4 + (int)(k - f) * (1 << POOL_FINE_STEPS_BITS) +
              (int)(m - (1u << POOL_FINE_STEPS_BITS));
    }
    if (idx >= POOL_MAX_CLASSES)
        return -1;
    *ret_size = n;
    return idx;
}

uint64_t pool_class_size(const struct pool *p, uint64_t size)
{
    uint64_t n;
    return class_of(p, size, &n) < 0 ? 0 : n;
}

int pool_class(const struct pool *p, uint64_t size, struct pool_cls *ret)
{
    uint64_t n;
    int idx = class_of(p, size, &n);
    if (idx < 0)
        return -EFBIG;
    *ret = (struct pool_cls){ .idx = (uint16_t)idx, .size = n };
    return 0;
}

static void lru_unlink(struct pool *p, struct pool_buf *b)
{
    struct pool_class *c = &p->classes[b->cls];
    if (b->lru_prev) b->lru_prev->lru_next = b->lru_next; else p->lru_head = b->lru_next;
    if (b->lru_next) b->lru_next->lru_prev = b->lru_prev; else p->lru_tail = b->lru_prev;
    if (b->cls_prev) b->cls_prev->cls_next = b->cls_next; else c->free_head = b->cls_next;
    if (b->cls_next) b->cls_next->cls_prev = b->cls_prev;
    b->lru_prev = b->lru_next = b->cls_prev = b->cls_next = NULL;
    b->is_free = false;
    c->st.nfree--;
    p->bytes_warm -= b->size;
}

/* Closing the last fd of a tmpfs file frees its pages inside close(): for hundreds of
 * MiB that is milliseconds. Retired buffers' fds are gathered in a batch; a batch of at
 * least 1 MiB is closed off the loop in one work item, a smaller one right away. */
#define CLOSE_OFF_LOOP_BYTES (1u << 20)

struct pool_close {
    uv_work_t work;
    struct pool *pool;
    uint64_t bytes;
    unsigned n;
    struct pool_doomed fds[];
};

/* doom: empty (if asked) and close one fd; any thread. */
static void doom(struct pool *p, const struct pool_doomed *d)
{
    if (d->empty && store_empty(&p->store, d->fd, d->empty) < 0)
        atomic_fetch_add(&p->empty_failed, 1);
    close(d->fd);
}

static void close_work(uv_work_t *w)
{
    struct pool_close *c = w->data;
    for (unsigned i = 0; i < c->n; i++)
        doom(c->pool, &c->fds[i]);
    atomic_fetch_sub(&c->pool->closing_bytes, c->bytes);
}

static void close_done(uv_work_t *w, int status)
{
    (void)status;
    free(w->data);
}

static void batch_add(struct pool *p, int fd, uint64_t empty)
{
    struct pool_doomed d = { .fd = fd, .empty = empty };
    if (p->nbatch == p->batch_cap) {
        unsigned cap = p->batch_cap ? p->batch_cap * 2 : 16;
        struct pool_doomed *v = realloc(p->batch, cap * sizeof(*v));
        if (!v) {
            doom(p, &d); /* no memory to defer: now */
            return;
        }
        p->batch = v;
        p->batch_cap = cap;
    }
    p->batch[p->nbatch++] = d;
}

/* flush: close the batch of retired fds, off the loop if it is large. */
static void flush(struct pool *p)
{
    if (p->nbatch == 0)
        return;
    struct pool_close *c = NULL;
    if (p->batch_bytes >= CLOSE_OFF_LOOP_BYTES && !p->closing &&
        (c = malloc(sizeof(*c) + p->nbatch * sizeof(c->fds[0])))) {
        c->n = p->nbatch;
        c->pool = p;
        c->bytes = p->batch_bytes;
        memcpy(c->fds, p->batch, p->nbatch * sizeof(c->fds[0]));
        c->work.data = c;
        atomic_fetch_add(&p->closing_bytes, c->bytes);
        if (uv_queue_work(p->loop, &c->work, close_work, close_done) < 0) {
            atomic_fetch_sub(&p->closing_bytes, c->bytes);
            free(c);
            c = NULL;
        }
    }
    if (!c)
        for (unsigned i = 0; i < p->nbatch; i++)
            doom(p, &p->batch[i]);
    p->nbatch = 0;
    p->batch_bytes = 0;
}

/* pin_charge: a buffer that no lease holds, mapped by clients, becomes pinned (charged to
 * every mapping uid) or, taken by a lease again, stops being. Idempotent both ways. */
static void pin_charge(struct pool *p, struct pool_buf *b, bool on)
{
    if (b->pin_charged == on || (on && b->maps == 0))
        return;
    b->pin_charged = on;
    if (on)
        p->bytes_pinned += b->size;
    else
        p->bytes_pinned -= b->size;
    for (uint32_t i = 0; i < b->npins; i++)
        if (p->pin_cb)
            p->pin_cb(p->pin_arg, b->pins[i].uid, on ? (int64_t)b->size : -(int64_t)b->size);
}

/* stock_count: size bytes of tenant's stock leases come (on) or go. */
static void stock_count(struct pool *p, uint32_t tenant, uint64_t size, bool on)
{
    if (on)
        p->bytes_stock += size;
    else
        p->bytes_stock -= size;
    if (p->stock_cb)
        p->stock_cb(p->stock_arg, tenant, on ? (int64_t)size : -(int64_t)size);
}

static void stock_mark(struct pool *p, struct pool_buf *b, bool on)
{
    if (b->stock == on)
        return;
    b->stock = on;
    stock_count(p, b->tenant, b->size, on);
}

/* retire: a buffer leaves the pool; its fds join the batch (see flush), which first frees
 * its pages (store_empty), so whoever still maps it keeps none of them. One whose pages
 * cannot be freed (a memfd sealed against writing) and that clients still map stays,
 * pinned, charged to the mapping uids until the last mapping is gone (which, for a client
 * whose connection closed, is when its process is: see pool_hold_until_exit). */
static void retire(struct pool *p, struct pool_buf *b)
{
    /* Stopping: clients that still hold leases keep their bytes (the pages go with their
     * mappings). */
    bool emptiable = !p->keep_pages && store_emptiable(&p->store, b->fd);
    p->nfds -= 1 + (b->ro_fd >= 0);
    p->classes[b->cls].st.total--;
    p->bytes_alloc -= b->size;
    p->counters.retired++;
    batch_add(p, b->fd, emptiable ? b->size : 0);
    if (b->ro_fd >= 0)
        batch_add(p, b->ro_fd, 0);
    p->batch_bytes += b->size;
    if (emptiable && b->maps)
        p->counters.emptied_mapped++;
    if (b->maps == 0 || emptiable) {
        pin_charge(p, b, false); /* a warm buffer's pin ends with its pages */
        buf_free(p, b);
        return;
    }
    b->fd = b->ro_fd = -1;
    b->retired = true;
    p->bytes_retired_pinned += b->size;
    pin_charge(p, b, true);
}

void pool_set_pin_cb(struct pool *p, pool_pin_cb cb, void *arg)
{
    p->pin_cb = cb;
    p->pin_arg = arg;
}

int pool_mapped(struct pool *p, uint64_t id, uint32_t uid)
{
    struct pool_buf *b = id_find(p, id);
    if (!b || b->retired)
        return -ENOENT;
    uint32_t i = 0;
    while (i < b->npins && b->pins[i].uid != uid)
        i++;
    if (i == b->npins) {
        if (b->npins == b->pins_cap) {
            uint32_t cap = b->pins_cap ? b->pins_cap * 2 : 2;
            struct pool_pin *v = realloc(b->pins, cap * sizeof(*v));
            if (!v)
                return -ENOMEM;
            b->pins = v;
            b->pins_cap = cap;
        }
        b->pins[b->npins++] = (struct pool_pin){ .uid = uid };
    }
    b->pins[i].n++;
    b->maps++;
    return 0;
}

void pool_unmapped(struct pool *p, uint64_t id, uint32_t uid)
{
    struct pool_buf *b = id_find(p, id);
    if (!b)
        return;
    uint32_t i = 0;
    while (i < b->npins && b->pins[i].uid != uid)
        i++;
    if (i == b->npins)
        return;
    b->maps--;
    if (--b->pins[i].n == 0) {
        if (b->pin_charged && p->pin_cb)
            p->pin_cb(p->pin_arg, uid, -(int64_t)b->size);
        b->pins[i] = b->pins[--b->npins];
    }
    if (b->maps == 0 && b->pin_charged) {
        b->pin_charged = false;
        p->bytes_pinned -= b->size;
    }
    if (b->retired && b->maps == 0) {
        p->bytes_retired_pinned -= b->size;
        buf_free(p, b);
    }
}

/* make_room: evict the least recently used free buffers until need more bytes fit.
 * Pinned bytes of retired buffers count: their pages are still in memory. A warm buffer
 * that a client still maps is evicted all the same: retiring empties its file
 * (store_empty), so its pages go. (Only a memfd sealed against writing cannot be emptied,
 * and those are never warm: a producer that seals one through its own fd finds it retired
 * as tampered when it comes back; evicting one anyway leaves it pinned, so used is read
 * back from the counters.) */
/* used: what counts against the cap (ordinary) or against cap + reserve (stock). */
static uint64_t used(const struct pool *p, bool stock)
{
    uint64_t all = p->bytes_alloc + p->bytes_retired_pinned;
    return stock ? all : all - p->bytes_stock;
}

static int make_room(struct pool *p, uint64_t need, bool stock)
{
    uint64_t evictable = p->bytes_warm, limit = stock ? p->cap + p->stock_reserve : p->cap;
    if (stock && p->bytes_stock + need > p->stock_reserve)
        return -EAGAIN;
    /* A request that would not fit even with every evictable buffer gone evicts none. */
    if (used(p, stock) - evictable + need > limit)
        return stock ? -EAGAIN : -ENOSPC;
    for (struct pool_buf *b = p->lru_head, *next; b && used(p, stock) + need > limit; b = next) {
        next = b->lru_next;
        lru_unlink(p, b);
        p->counters.evicted++;
        retire(p, b);
    }
    return used(p, stock) + need <= limit ? 0 : stock ? -EAGAIN : -ENOSPC;
}

/* make_fd_room: evict warm buffers until one more fd fits in the budget. */
static int make_fd_room(struct pool *p)
{
    while (p->nfds + 1 > p->fd_budget && p->lru_head) {
        struct pool_buf *b = p->lru_head;
        lru_unlink(p, b);
        p->counters.evicted++;
        retire(p, b);
    }
    return p->nfds + 1 > p->fd_budget ? -EMFILE : 0;
}

/* The private tmpfs is exactly the cap, and retired buffers' pages are freed off the
 * loop: a create that finds the tmpfs full while a batch is still being closed waits for
 * it (that batch was queued first, so it is being closed now), up to a second. */
static void create_work(uv_work_t *w)
{
    struct pool_create *c = w->data;
    c->err = store_create(&c->pool->store, c->size, &c->fd);
    for (int i = 0; c->err == -ENOSPC && i < 1000 && atomic_load(&c->pool->closing_bytes) > 0; i++) {
        usleep(1000);
        c->err = store_create(&c->pool->store, c->size, &c->fd);
    }
}

static void create_done(uv_work_t *w, int status)
{
    struct pool_create *c = w->data;
    struct pool *p = c->pool;
    struct pool_buf *b = NULL;

    p->bytes_creating -= c->size;
    if (status < 0 && c->err == 0)
        c->err = status;
    if (c->err == 0 && !(b = calloc(1, sizeof(*b)))) {
        close(c->fd);
        c->err = -ENOMEM;
    }
    if (c->err < 0) {
        p->nfds--;
        p->bytes_alloc -= c->size;
        if (c->stock)
            stock_count(p, c->tenant, c->size, false);
        p->counters.create_failed++;
        c->cb(p, NULL, c->err, c->data);
        free(c);
        return;
    }
    b->id = ++p->next_id;
    id_add(p, b);
    b->slot = slot_get(p);
    b->fd = c->fd;
    b->ro_fd = -1;
    b->size = c->size;
    b->tenant = c->tenant;
    b->gen = 1;
    b->cls = c->cls;
    b->stock = c->stock; /* counted since it was queued */
    p->classes[c->cls].st.size = c->size;
    p->classes[c->cls].st.total++;
    p->counters.created++;
    c->cb(p, b, 0, c->data);
    free(c);
}

int pool_get(struct pool *p, uint64_t size, uint32_t tenant, struct pool_buf **ret,
             pool_get_cb cb, void *data)
{
    struct pool_cls cls;
    int r = pool_class(p, size, &cls);
    return r < 0 ? r : pool_get_class(p, &cls, tenant, ret, cb, data);
}

struct pool_buf *pool_take_warm(struct pool *p, const struct pool_cls *cls, uint32_t tenant)
{
    /* Only the tenant's own warm buffer: every buffer is created for a tenant. */
    struct pool_buf *pick = NULL;
    if (cls->stock && !pool_stock_room(p, cls->size))
        return NULL;
    for (struct pool_buf *b = p->classes[cls->idx].free_head; b; b = b->cls_next) {
        if (b->tenant == tenant) {
            pick = b;
            break;
        }
    }
    if (!pick)
        return NULL;
    lru_unlink(p, pick);
    pin_charge(p, pick, false); /* held again: charged to its lease, not as a pin */
    pick->gen++;
    p->counters.recycled++;
    if (cls->stock)
        stock_mark(p, pick, true);
    return pick;
}

void pool_untake(struct pool *p, struct pool_buf *b)
{
    b->gen--;
    p->counters.recycled--;
    pool_put(p, b);
}

int pool_get_class(struct pool *p, const struct pool_cls *cls, uint32_t tenant, struct pool_buf **ret,
                   pool_get_cb cb, void *data)
{
    uint64_t csize = cls->size;
    int idx = cls->idx;

    struct pool_buf *pick = pool_take_warm(p, cls, tenant);
    if (pick) {
        *ret = pick;
        return 0;
    }
    int room = make_room(p, csize, cls->stock);
    if (room == 0)
        room = make_fd_room(p);
    flush(p); /* whatever was evicted, in one go */
    if (room < 0)
        return room;
    struct pool_create *cr = calloc(1, sizeof(*cr));
    if (!cr)
        return -ENOMEM;
    cr->work.data = cr;
    cr->pool = p;
    cr->size = csize;
    cr->cls = (uint16_t)idx;
    cr->tenant = tenant;
    cr->stock = cls->stock;
    cr->fd = -1;
    cr->cb = cb;
    cr->data = data;
    int r = uv_queue_work(p->loop, &cr->work, create_work, create_done);
    if (r < 0) {
        free(cr);
        return r;
    }
    p->bytes_alloc += csize;
    p->bytes_creating += csize;
    p->nfds++;
    if (cls->stock)
        stock_count(p, tenant, csize, true);
    return 1;
}

void pool_put(struct pool *p, struct pool_buf *b)
{
    stock_mark(p, b, false);
    if (b->sealed) /* seals are for good: publish-once */
        b->foreign = true;
    if (!b->foreign && !store_intact(&p->store, b->fd, b->size)) {
        p->counters.tampered++;
        b->foreign = true;
    }
    if (b->foreign) {
        retire(p, b);
        flush(p);
        return;
    }
    struct pool_class *c = &p->classes[b->cls];
    pool_ro_close(p, b); /* reopened when next acquired: warm buffers hold one fd */
    b->is_free = true;
    b->lru_prev = p->lru_tail;
    b->lru_next = NULL;
    if (p->lru_tail) p->lru_tail->lru_next = b; else p->lru_head = b;
    p->lru_tail = b;
    b->cls_prev = NULL;
    b->cls_next = c->free_head;
    if (c->free_head)
        c->free_head->cls_prev = b;
    c->free_head = b;
    c->st.nfree++;
    p->bytes_warm += b->size;
    pin_charge(p, b, true); /* warm, but clients map it: its pages stay theirs */
}

int pool_seal(struct pool *p, struct pool_buf *b)
{
    int r = store_seal_write(&p->store, b->fd);
    if (r == 0)
        b->sealed = true;
    return r;
}

bool pool_sealable(const struct pool *p)
{
    return p->store.memfd;
}

void pool_ro_close(struct pool *p, struct pool_buf *b)
{
    if (b->ro_fd >= 0) {
        close(b->ro_fd);
        b->ro_fd = -1;
        p->nfds--;
    }
}

int pool_ro_fd(struct pool *p, struct pool_buf *b)
{
    if (b->ro_fd >= 0)
        return b->ro_fd;
    int room = make_fd_room(p);
    flush(p);
    if (room < 0)
        return -EMFILE;
    int fd = store_reopen_ro(&p->store, b->fd);
    if (fd < 0)
        return fd;
    b->ro_fd = fd;
    p->nfds++;
    return fd;
}

bool pool_pins_after_close(struct pool *p, uint64_t id)
{
    struct pool_buf *b = id_find(p, id);
    return b && (b->retired || b->sealed || (b->fd >= 0 && !store_emptiable(&p->store, b->fd)));
}

static void mapper_closed(uv_handle_t *h)
{
    struct pool_mapper *m = h->data;
    free(m->ids);
    free(m);
}

/* mapper_end: m's process is gone (or the pool stops): its mappings are no longer
 * counted (unless stopping), and it leaves the list. */
static void mapper_end(struct pool *p, struct pool_mapper *m, bool unmap)
{
    for (struct pool_mapper **pp = &p->mappers; *pp; pp = &(*pp)->next)
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    for (unsigned i = 0; unmap && i < m->n; i++)
        pool_unmapped(p, m->ids[i], m->uid);
    p->nfds--;
    uv_poll_stop(&m->poll);
    close(m->pidfd); /* libuv's epoll forgot it at stop */
    uv_close((uv_handle_t *)&m->poll, mapper_closed);
}

static void mapper_exited(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events; /* readable, or an error: either way nothing more will come */
    struct pool_mapper *m = h->data;
    mapper_end(m->pool, m, true);
}

int pool_hold_until_exit(struct pool *p, uint32_t uid, pid_t pid, int pidfd, const uint64_t *ids, unsigned n)
{
    struct pool_mapper *m = NULL;
    if (p->keep_pages || n == 0)
        goto drop;
    for (m = p->mappers; m && !(m->pid == pid && m->uid == uid); m = m->next)
        ;
    if (m) { /* another connection of the same process: one watch */
        close(pidfd);
        pidfd = -1;
    } else {
        if (!(m = calloc(1, sizeof(*m))))
            goto drop;
        m->pool = p;
        m->pid = pid;
        m->uid = uid;
        m->pidfd = pidfd;
        if (uv_poll_init(p->loop, &m->poll, pidfd) < 0) {
            free(m);
            goto drop;
        }
        m->poll.data = m;
        if (uv_poll_start(&m->poll, UV_READABLE, mapper_exited) < 0) {
            uv_close((uv_handle_t *)&m->poll, mapper_closed);
            m = NULL;
            goto drop;
        }
        m->next = p->mappers;
        p->mappers = m;
        p->nfds++;
    }
    if (m->n + n > m->cap) {
        unsigned cap = m->n + n > 2 * m->cap ? m->n + n : 2 * m->cap;
        uint64_t *v = realloc(m->ids, cap * sizeof(*v));
        if (!v) { /* nothing new is counted for it: as if it had unmapped them */
            for (unsigned i = 0; i < n; i++)
                pool_unmapped(p, ids[i], uid);
            return -ENOMEM;
        }
        m->ids = v;
        m->cap = cap;
    }
    memcpy(m->ids + m->n, ids, n * sizeof(*ids));
    m->n += n;
    return 0;
drop:
    if (pidfd >= 0)
        close(pidfd);
    for (unsigned i = 0; i < n; i++)
        pool_unmapped(p, ids[i], uid);
    return p->keep_pages || n == 0 ? 0 : -ENOMEM;
}

void pool_stop(struct pool *p)
{
    p->keep_pages = true;
    while (p->mappers)
        mapper_end(p, p->mappers, false);
}

uint64_t pool_mappers(const struct pool *p)
{
    uint64_t n = 0;
    for (const struct pool_mapper *m = p->mappers; m; m = m->next)
        n++;
    return n;
}

void pool_free(struct pool *p)
{
    if (!p)
        return;
    p->closing = true;
    while (p->lru_head) {
        struct pool_buf *b = p->lru_head;
        lru_unlink(p, b);
        retire(p, b);
    }
    flush(p); /* closing: right here */
    for (uint64_t i = 0; i < p->id_buckets; i++) /* left: pinned (mapped by clients still) */
        while (p->ids[i]) {
            struct pool_buf *b = p->ids[i];
            p->ids[i] = b->id_next;
            free(b->pins);
            free(b);
        }
    free(p->ids);
    free(p->batch);
    free(p->free_slots);
    store_close(&p->store);
    free(p);
}

uint64_t pool_set_stock(struct pool *p, uint64_t reserve, pool_pin_cb cb, void *arg)
{
    if (!p->store.memfd) {
        uint64_t avail = pool_fs_available(p), held = p->bytes_alloc;
        uint64_t beyond = avail + held > p->cap ? avail + held - p->cap : 0;
        if (reserve > beyond)
            reserve = beyond;
    }
    p->stock_reserve = reserve;
    p->stock_cb = cb;
    p->stock_arg = arg;
    return reserve;
}

uint64_t pool_stock_reserve(const struct pool *p) { return p->stock_reserve; }
uint64_t pool_bytes_stock(const struct pool *p) { return p->bytes_stock; }
uint64_t pool_bytes_retired_pinned(const struct pool *p) { return p->bytes_retired_pinned; }

bool pool_stock_room(const struct pool *p, uint64_t size)
{
    return p->bytes_stock + size <= p->stock_reserve;
}

bool pool_unstock(struct pool *p, struct pool_buf *b)
{
    if (!b->stock)
        return false;
    /* Counted as ordinary, it must fit the cap: the reserve can never be a way past it. */
    stock_mark(p, b, false);
    if (make_room(p, 0, false) == 0) {
        flush(p);
        return true;
    }
    flush(p);
    stock_mark(p, b, true);
    return false;
}

uint64_t pool_cap(const struct pool *p) { return p->cap; }
uint64_t pool_fds(const struct pool *p) { return p->nfds; }
uint64_t pool_fd_budget(const struct pool *p) { return p->fd_budget; }

uint64_t pool_fd_budget_of(uint64_t nofile)
{
    /* Every buffer is an fd (two while acquired): keep a quarter of RLIMIT_NOFILE, and
     * POOL_FDS_DAEMON more, for connections and the daemon itself. */
    return nofile > 128 ? nofile - nofile / 4 - POOL_FDS_DAEMON : 32;
}
uint64_t pool_bytes_alloc(const struct pool *p) { return p->bytes_alloc; }
uint64_t pool_bytes_warm(const struct pool *p) { return p->bytes_warm; }
uint64_t pool_bytes_creating(const struct pool *p) { return p->bytes_creating; }
uint64_t pool_bytes_pinned(const struct pool *p) { return p->bytes_pinned; }
const char *pool_dir(const struct pool *p) { return p->store.dir; }
const char *pool_kind(const struct pool *p) { return store_kind(&p->store); }
struct pool_counters pool_counters(const struct pool *p)
{
    struct pool_counters c = p->counters;
    c.empty_failed = atomic_load(&((struct pool *)p)->empty_failed);
    return c;
}

uint64_t pool_fs_available(const struct pool *p)
{
    struct statvfs sv;
    if (statvfs(p->store.dir, &sv) < 0)
        return 0;
    return (uint64_t)sv.f_bavail * sv.f_frsize;
}

unsigned pool_classes(const struct pool *p, struct pool_class_stat *ret, unsigned max)
{
    unsigned n = 0;
    for (unsigned i = 0; i < POOL_MAX_CLASSES && n < max; i++)
        if (p->classes[i].st.total > 0)
            ret[n++] = p->classes[i].st;
    return n;
}
