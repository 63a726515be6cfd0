/* SPDX-License-Identifier: MIT */
/* test-hugepages.c: the huge-page pool. As root, shmrefd mounts a private
 * huge=within_size tmpfs over its pool dir, and a client's mapping of a buffer of 2 MiB
 * or more is made of 2 MiB pages (PMD-mapped in /proc/self/smaps); off, 4 KiB pages. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* pmd_mapped_kb: ShmemPmdMapped + FilePmdMapped of the mapping that holds addr. */
static long pmd_mapped_kb(const void *addr)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert_not_null(f);
    char line[512];
    int inside = 0;
    long kb = 0;
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof(line), f)) {
        uintptr_t lo, hi;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && a < hi;
            continue;
        }
        long v;
        if (inside && (sscanf(line, "ShmemPmdMapped: %ld kB", &v) == 1 || sscanf(line, "FilePmdMapped: %ld kB", &v) == 1))
            kb += v;
    }
    fclose(f);
    return kb;
}

static const char *pool_kind(const struct daemon *d, char *buf, size_t cap)
{
    shmref_conn *c = connect_ok(d);
    shmref_status *st;
    const char *kind = "";
    cr_assert_eq(shmref_status_get(c, &st), 0);
    cr_assert_eq(shmref_status_str(st, "pool.kind", &kind), 0);
    snprintf(buf, cap, "%s", kind);
    shmref_status_free(st);
    shmref_close(c);
    return buf;
}

Test(hugepages, buffers_are_huge_page_backed_by_default)
{
    struct daemon d;
    char kind[64];
    cr_assert_eq(geteuid(), 0, "mounting the pool needs root, as in CI");
    daemon_start(&d, NULL);
    cr_assert_str_eq(pool_kind(&d, kind, sizeof(kind)), "tmpfile-hugepages");
    cr_assert(daemon_log_contains(&d, "mounted a private huge-page tmpfs"), "a log line says which pool");
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b, *small;
    cr_assert_eq(shmref_lease(c, 8u << 20, &b), 0, "%s", shmref_errmsg(c));
    memset(shmref_buf_data(b), 1, 8u << 20);
    long kb = pmd_mapped_kb(shmref_buf_data(b));
    cr_assert_geq(kb, 8 * 1024, "an 8 MiB buffer should be all 2 MiB pages, %ld kB PMD-mapped", kb);
    /* Sizes above 1 MiB are whole huge pages; smaller ones keep 4 KiB classes. */
    cr_assert_eq(shmref_lease(c, 3u << 20, &small), 0);
    cr_assert_eq(shmref_buf_capacity(small), 4u << 20);
    cr_assert_eq(shmref_release(small), 0);
    cr_assert_eq(shmref_lease(c, 100000, &small), 0);
    cr_assert_eq(shmref_buf_capacity(small), 114688, "the 4 KiB-page class of 100000 bytes");
    shmref_close(c);
    daemon_stop(&d);
}

Test(hugepages, off_means_small_pages)
{
    struct daemon d;
    char kind[64];
    daemon_start(&d, "--pool-hugepages", "no", NULL);
    cr_assert_str_eq(pool_kind(&d, kind, sizeof(kind)), "tmpfile");
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, 8u << 20, &b), 0);
    memset(shmref_buf_data(b), 1, 8u << 20);
    cr_assert_eq(pmd_mapped_kb(shmref_buf_data(b)), 0);
    cr_assert_eq(shmref_lease(c, 3u << 20, &b), 0);
    cr_assert_eq(shmref_buf_capacity(b), 3u << 20, "4 KiB classes: 3 MiB is a class of its own");
    shmref_close(c);
    daemon_stop(&d);
}

/* has_pool_mount: whether the mount table of pid ("self" or a number) has the pool. */
static int has_pool_mount(const char *pid)
{
    char path[64], line[1024];
    snprintf(path, sizeof(path), "/proc/%s/mountinfo", pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    int seen = 0;
    while (fgets(line, sizeof(line), f))
        seen |= strstr(line, "shmrefd-pool") != NULL;
    fclose(f);
    return seen;
}

Test(hugepages, the_private_mount_is_invisible_to_others)
{
    struct daemon d;
    char pid[16];
    daemon_start(&d, NULL);
    snprintf(pid, sizeof(pid), "%d", (int)d.pid);
    cr_assert(has_pool_mount(pid), "the daemon has its pool mount");
    cr_assert_not(has_pool_mount("self"), "the daemon's pool mount leaked into the host's mount namespace");
    daemon_stop(&d);
}

/* counter: one of libshmref's counters of c. */
static uint64_t counter(shmref_conn *c, const char *name)
{
    uint64_t v = 0;
    cr_assert_eq(shmref_conn_counter(c, name, &v), 0, "%s", name);
    return v;
}

/* small_leases_on_huge_always: n leases of 8000 bytes, one after the other, from a pool on
 * a huge=always tmpfs mounted at a fresh directory made from tmpl: each is a whole 2 MiB
 * page, and the one buffer comes back intact and is recycled every time.
 * The pool's recycling is reached through shmref_lease_many (its buffers never join the
 * uid's table); then n shmref_lease of the default path: the first one recycles the same
 * buffer from the pool, and at its release it joins the table, which serves the other
 * n - 1 with no message; when the connection (the uid's last) closes, the table gives it
 * back to the pool, intact (not tampered), warm, and the pool recycles it again. */
static void small_leases_on_huge_always(char *tmpl, int n)
{
    char cmd[256];
    cr_assert_not_null(mkdtemp(tmpl));
    snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o huge=always,size=256M shmref-test '%s'", tmpl);
    cr_assert_eq(system(cmd), 0, "mounting a huge=always tmpfs (as root)");
    struct daemon d;
    char kind[64];
    daemon_start(&d, "--pool-dir", tmpl, "--pool-size", "64M", NULL);
    cr_assert_str_eq(pool_kind(&d, kind, sizeof(kind)), "tmpfile-hugepages");
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    const size_t size = 8000;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(shmref_lease_many(c, &size, 1, &b), 0, "%s", shmref_errmsg(c));
        cr_assert_eq(shmref_buf_capacity(b), 2u << 20, "a small buffer is a whole huge page here");
        cr_assert_eq(shmref_release(b), 0);
    }
    cr_assert_eq(shmref_ping(c), 0); /* releases are one-way: now they are done */
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 1);
    cr_assert_eq(status_u64(&d, "counters.buffers_recycled"), (uint64_t)n - 1);
    cr_assert_eq(status_u64(&d, "counters.buffers_tampered"), 0);
    cr_assert_eq(status_u64(&d, "table.grants"), 0, "lease_many's buffers never join the table");
    /* the default path: the first lease is the daemon's (the table is empty); its release
     * (one-way: the ping makes it done) puts the buffer in the table */
    cr_assert_eq(shmref_lease(c, size, &b), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0);
    uint64_t sent = counter(c, "sent");
    for (int i = 1; i < n; i++) {
        cr_assert_eq(shmref_lease(c, size, &b), 0, "%s", shmref_errmsg(c));
        cr_assert_eq(shmref_buf_capacity(b), 2u << 20, "a small buffer is a whole huge page here");
        cr_assert_eq(shmref_release(b), 0);
    }
    cr_assert_eq(counter(c, "table_leases"), (uint64_t)n - 1, "the table serves every lease after the first");
    cr_assert_eq(counter(c, "sent"), sent, "no message for a table lease or its release");
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 1);
    cr_assert_eq(status_u64(&d, "counters.buffers_recycled"), (uint64_t)n, "the first table lease is the pool's");
    cr_assert_eq(status_u64(&d, "table.grants"), 1);
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), 2u << 20);
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    shmref_close(c);
    /* the uid's last table connection is gone: the table's buffer is the pool's again */
    cr_assert_eq(wait_status(&d, "pool.bytes_warm", 2u << 20, 5000), 2u << 20, "the table's buffer is back, warm");
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), 0);
    cr_assert_eq(status_u64(&d, "counters.buffers_tampered"), 0);
    c = connect_ok(&d);
    cr_assert_eq(shmref_lease_many(c, &size, 1, &b), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(status_u64(&d, "counters.buffers_created"), 1);
    cr_assert_eq(status_u64(&d, "counters.buffers_recycled"), (uint64_t)n + 1);
    cr_assert_eq(status_u64(&d, "counters.buffers_tampered"), 0);
    shmref_close(c);
    daemon_stop(&d);
    snprintf(cmd, sizeof(cmd), "umount '%s'", tmpl);
    cr_assert_eq(system(cmd), 0);
    rmdir(tmpl);
}

/* Regression: on a huge=always tmpfs even an 8 KiB file takes a 2 MiB page; its class is
 * a whole huge page, so it comes back intact and is recycled (it used to be retired as
 * tampered, and every lease created a new file). */
Test(hugepages, huge_always_pool_dir_recycles_small_buffers)
{
    char dir[] = "/tmp/shmref-hugealways-XXXXXX";
    small_leases_on_huge_always(dir, 200);
}

/* Regression (issue 8, item 12): mountinfo escapes a space in a mount point as \040; a
 * pool directory with a space in its path used to go unrecognised, its huge pages
 * unaccounted (classes of 4 KiB pages over files of 2 MiB pages), and every buffer came
 * back "tampered" and was retired. */
Test(hugepages, pool_dir_with_a_space_is_recognised)
{
    char dir[] = "/tmp/shmref pool with spaces-XXXXXX";
    small_leases_on_huge_always(dir, 20);
}
