/* SPDX-License-Identifier: MIT */
/* test-mapcache.c: libshmref's mapping cache (client-lib/mapcache.c) over real memfds
 * and real mappings: keyed by buffer id (never by fd number), shared between handles, a
 * writable mapping serving reads through a read-only view, idle mappings kept up to a byte and a count bound
 * (PROTO_MAX_IDLE_MAPPINGS, the bound the daemon's fd-once set counts on), least
 * recently used first out, each unmap reported (the client then says forget). */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mapcache.h"
#include "proto.h"

#define PAGE 4096

struct unmapped {
    unsigned n;
    uint64_t last_id;
    bool last_writable;
};

static void on_unmap(void *ctx, uint64_t buf_id, bool writable)
{
    struct unmapped *u = ctx;
    u->n++;
    u->last_id = buf_id;
    u->last_writable = writable;
}

static int new_file(size_t len)
{
    int fd = memfd_create("mapcache", MFD_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)len), 0);
    return fd;
}

static void cache_open(struct mapcache *mc, struct unmapped *u)
{
    unsetenv("SHMREF_MAP_CACHE");
    mapcache_init(mc);
    memset(u, 0, sizeof(*u));
    mc->on_unmap = on_unmap;
    mc->ctx = u;
}

Test(mapcache, default_bounds)
{
    struct mapcache mc;
    struct unmapped u;
    cache_open(&mc, &u);
    cr_assert_eq(mc.max_idle, PROTO_MAX_IDLE_MAPPINGS);
    cr_assert_eq(mc.max_idle_bytes, UINT64_C(1) << 30);
    mapcache_fit(&mc, UINT64_C(1) << 30);
    cr_assert_eq(mc.max_idle_bytes, UINT64_C(2) << 30, "twice the largest lease");
    mapcache_clear(&mc);
}

Test(mapcache, keyed_by_buffer_id_and_shared)
{
    struct mapcache mc;
    struct unmapped u;
    void *a, *b, *c;
    cache_open(&mc, &u);
    int fd = new_file(PAGE);
    cr_assert_eq(mapcache_get(&mc, 7, fd, PAGE, true, &a), 0);
    memcpy(a, "hello", 5);
    close(fd); /* the mapping outlives the fd */
    /* a read-only use of a writable mapping gets a PROT_READ view of the same pages */
    void *ro = mapcache_find(&mc, 7, PAGE, false);
    cr_assert_not_null(ro, "a writable mapping serves reading");
    cr_assert_neq(ro, a, "through its own read-only view, never the writable mapping");
    cr_assert_eq(memcmp(ro, "hello", 5), 0);
    memcpy(a, "world", 5);
    cr_assert_eq(memcmp(ro, "world", 5), 0, "the same pages");
    cr_assert_eq(mapcache_find(&mc, 7, PAGE, false), ro, "the view is cached too");
    mapcache_put(&mc, ro);
    mapcache_put(&mc, ro);
    mapcache_find(&mc, 7, PAGE, true); /* a second user of a, as before */
    cr_assert_null(mapcache_find(&mc, 8, PAGE, false), "another buffer id is another buffer");
    cr_assert_null(mapcache_find(&mc, 7, 2 * PAGE, false), "another length is another mapping");
    /* a read-only one does not serve writing */
    int fd2 = new_file(PAGE);
    cr_assert_eq(mapcache_get(&mc, 9, fd2, PAGE, false, &b), 0);
    cr_assert_null(mapcache_find(&mc, 9, PAGE, true));
    /* the same fd number for another buffer id maps afresh */
    cr_assert_eq(mapcache_get(&mc, 10, fd2, PAGE, false, &c), 0);
    cr_assert_neq(c, b);
    close(fd2);
    mapcache_put(&mc, a);
    mapcache_put(&mc, a);
    mapcache_put(&mc, b);
    mapcache_put(&mc, c);
    cr_assert_eq(u.n, 0, "idle mappings within the bounds stay");
    cr_assert_eq(mc.idle_bytes, 4 * PAGE);
    mapcache_clear(&mc);
    cr_assert_eq(mc.n, 0);
}

/* More idle mappings than the count bound: the least recently used goes, and the
 * connection hears of it (to say forget). */
Test(mapcache, count_bound_unmaps_least_recently_used)
{
    struct mapcache mc;
    struct unmapped u;
    cache_open(&mc, &u);
    mc.max_idle = 3;
    void *addr[5];
    int fd = new_file(PAGE);
    for (uint64_t id = 1; id <= 4; id++)
        cr_assert_eq(mapcache_get(&mc, id, fd, PAGE, id % 2 == 1, &addr[id]), 0);
    for (uint64_t id = 1; id <= 4; id++)
        mapcache_put(&mc, addr[id]);
    cr_assert_eq(u.n, 1);
    cr_assert_eq(u.last_id, 1, "not the least recently used");
    cr_assert(u.last_writable);
    cr_assert_null(mapcache_find(&mc, 1, PAGE, false));
    /* a use makes 2 recent: 3 goes next */
    void *again = mapcache_find(&mc, 2, PAGE, false);
    cr_assert_eq(again, addr[2]);
    mapcache_put(&mc, again);
    void *five;
    cr_assert_eq(mapcache_get(&mc, 5, fd, PAGE, false, &five), 0);
    mapcache_put(&mc, five);
    cr_assert_eq(u.n, 2);
    cr_assert_eq(u.last_id, 3);
    close(fd);
    mapcache_clear(&mc);
}

/* The byte bound counts idle bytes only: mappings in use are never unmapped. */
Test(mapcache, byte_bound_spares_mappings_in_use)
{
    struct mapcache mc;
    struct unmapped u;
    cache_open(&mc, &u);
    mc.max_idle_bytes = 2 * PAGE;
    int fd = new_file(4 * PAGE);
    void *a, *b, *c;
    cr_assert_eq(mapcache_get(&mc, 1, fd, 2 * PAGE, true, &a), 0);
    cr_assert_eq(mapcache_get(&mc, 2, fd, 2 * PAGE, true, &b), 0);
    cr_assert_eq(mapcache_get(&mc, 3, fd, 4 * PAGE, true, &c), 0);
    mapcache_put(&mc, a);
    cr_assert_eq(u.n, 0);
    mapcache_put(&mc, c); /* 6 pages idle: c is the newest, a goes, still 4 > 2: c goes */
    cr_assert_eq(u.n, 2);
    cr_assert_null(mapcache_find(&mc, 1, 2 * PAGE, true));
    cr_assert_null(mapcache_find(&mc, 3, 4 * PAGE, true));
    cr_assert_eq(mapcache_find(&mc, 2, 2 * PAGE, true), b, "a mapping in use was unmapped");
    mapcache_put(&mc, b);
    mapcache_put(&mc, b);
    cr_assert_eq(u.n, 2, "2 pages idle is within the bound");
    close(fd);
    mapcache_clear(&mc);
}

Test(mapcache, zero_from_the_environment_unmaps_at_every_release)
{
    struct mapcache mc;
    struct unmapped u = { 0 };
    setenv("SHMREF_MAP_CACHE", "0", 1);
    mapcache_init(&mc);
    unsetenv("SHMREF_MAP_CACHE");
    mc.on_unmap = on_unmap;
    mc.ctx = &u;
    cr_assert_eq(mc.max_idle_bytes, 0);
    mapcache_fit(&mc, UINT64_C(1) << 30);
    cr_assert_eq(mc.max_idle_bytes, 0, "a fixed bound is not adjusted");
    int fd = new_file(PAGE);
    void *a;
    cr_assert_eq(mapcache_get(&mc, 1, fd, PAGE, false, &a), 0);
    mapcache_put(&mc, a);
    cr_assert_eq(u.n, 1);
    cr_assert_eq(mc.n, 0);
    close(fd);
    mapcache_clear(&mc);
}

Test(mapcache, size_from_the_environment)
{
    struct mapcache mc;
    setenv("SHMREF_MAP_CACHE", "64M", 1);
    mapcache_init(&mc);
    unsetenv("SHMREF_MAP_CACHE");
    cr_assert_eq(mc.max_idle_bytes, UINT64_C(64) << 20);
    cr_assert(mc.fixed);
    mapcache_clear(&mc);
}

Test(mapcache, mmap_failure_is_an_error_and_caches_nothing)
{
    struct mapcache mc;
    struct unmapped u;
    void *a = NULL;
    cache_open(&mc, &u);
    cr_assert_eq(mapcache_get(&mc, 1, -1, PAGE, false, &a), -EBADF);
    cr_assert_eq(mc.n, 0);
    mapcache_clear(&mc);
}
