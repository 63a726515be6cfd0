/* SPDX-License-Identifier: MIT */
/* mapcache.h: libshmref's cache of mappings of pool buffers, per connection, keyed by
 * the daemon's buffer id: a recycled buffer is mapped once. Knows nothing of handles or
 * the connection: it calls on_unmap for each mapping it unmaps. The lowest layer with
 * transport.h. */
#ifndef SHMREF_MAPCACHE_H
#define SHMREF_MAPCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mapcache_entry {
    uint64_t buf_id;
    void *addr;
    size_t len;
    bool writable;
    bool nocache;           /* unmapped when its last user goes (the daemon retires it) */
    bool view;              /* a PROT_READ view made from a writable mapping (mremap) */
    unsigned users;         /* live handles using this mapping */
    struct mapcache_entry *lru_prev, *lru_next; /* idle entries, least recently used first */
};

/* Lookups are balanced trees (tsearch(3)): by (buf_id, writable) and by address; the idle
 * entries are a list in order of last use. No operation scans the cache. */
struct mapcache {
    /* called for every mapping the cache unmaps while the connection lives */
    void (*on_unmap)(void *ctx, uint64_t buf_id, bool writable);
    void *ctx;
    void *by_id, *by_addr;  /* tsearch roots */
    unsigned n, n_idle;
    struct mapcache_entry *lru_head, *lru_tail;
    uint64_t idle_bytes, max_idle_bytes;
    unsigned max_idle;
    bool fixed;             /* set by $SHMREF_MAP_CACHE: not adjusted */
};

void mapcache_init(struct mapcache *mc);
/* mapcache_get: a mapping of buffer buf_id (len bytes) from fd, shared with earlier
 * handles if one exists (a writable one also serves read-only requests). Returns 0 with
 * *ret_addr, or -errno from mmap. fd stays the caller's. */
int mapcache_get(struct mapcache *mc, uint64_t buf_id, int fd, size_t len, bool writable,
                 void **ret_addr);
/* mapcache_fit: raise the idle bound to twice the daemon's largest lease (unless the
 * environment fixed it). */
void mapcache_fit(struct mapcache *mc, uint64_t max_lease);
/* mapcache_find: the live mapping for buf_id usable as asked, without an fd, or NULL. */
void *mapcache_find(struct mapcache *mc, uint64_t buf_id, size_t len, bool writable);
/* mapcache_put: a handle stopped using addr. Idle mappings stay mapped, up to a byte
 * and count bound ($SHMREF_MAP_CACHE bytes; default the larger of 1 GiB and twice the
 * daemon's largest lease), least recently used first out. */
void mapcache_put(struct mapcache *mc, void *addr);
/* mapcache_drop_idle: unmap every idle mapping (telling on_unmap); returns how many. */
unsigned mapcache_drop_idle(struct mapcache *mc);
/* mapcache_drop: unmap the mapping at addr, whoever uses it (telling on_unmap): for a
 * buffer whose writable mapping must be gone before it is sealed. */
void mapcache_drop(struct mapcache *mc, void *addr);
/* mapcache_clear: unmap everything (the connection closes). */
void mapcache_clear(struct mapcache *mc);
/* mapcache_abandon: forget every entry without unmapping anything (a forked child: what it
 * inherited stays mapped, and readable, for as long as the child lives). */
void mapcache_abandon(struct mapcache *mc);
/* mapcache_nocache: the mapping at addr is unmapped when its last user goes, not kept
 * idle (the daemon retires its buffer: for the acquire reply's flag, protocol 3). */
void mapcache_nocache(struct mapcache *mc, void *addr);
/* mapcache_drop_view: unmap an idle read-only view of buf_id made from a writable
 * mapping (it counts as a writable mapping for F_SEAL_WRITE): before a sealed publish. */
void mapcache_drop_view(struct mapcache *mc, uint64_t buf_id);
/* mapcache_find_ro: one more user of the read-only mapping of buf_id made for an acquire
 * reply (cacheable, at least len bytes): its address (*ret_len its length), or NULL. */
void *mapcache_find_ro(struct mapcache *mc, uint64_t buf_id, size_t len, size_t *ret_len);
/* mapcache_ref: one more user of the mapping at addr; returns addr. */
void *mapcache_ref(struct mapcache *mc, void *addr);
/* mapcache_users: the handles using the mapping at addr (0 if not cached). */
unsigned mapcache_users(struct mapcache *mc, void *addr);

#endif
