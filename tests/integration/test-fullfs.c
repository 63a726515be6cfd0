/* SPDX-License-Identifier: MIT */
/* test-fullfs.c: a pool directory whose tmpfs fills up behind the daemon's back (someone
 * else writes to it). A lease that cannot be reserved is an ENOSPC reply naming the
 * bytes, never a SIGBUS in a client; the daemon keeps serving, and leases work again
 * once space is back. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

Test(fullfs, full_tmpfs_is_enospc_with_numbers_then_recovers)
{
    char dir[] = "/tmp/shmref-fullfs-XXXXXX", cmd[512], filler[300];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=16M shmref-test '%s'", dir);
    cr_assert_eq(system(cmd), 0, "mounting a 16 MiB tmpfs (as root)");
    struct daemon d;
    daemon_start(&d, "--pool-dir", dir, "--pool-size", "8M", "--tenant-quota", "8M", "--pool-hugepages", "no", NULL);

    /* Someone else takes 12 of the 16 MiB: the pool's 8 MiB no longer fit. */
    snprintf(filler, sizeof(filler), "%s/filler", dir);
    snprintf(cmd, sizeof(cmd), "head -c 12582912 /dev/zero > '%s'", filler);
    cr_assert_eq(system(cmd), 0);

    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    int r = shmref_lease(c, 6u << 20, &b);
    cr_assert_eq(r, -ENOSPC, "lease on a full tmpfs: %d (%s)", r, shmref_errmsg(c));
    const char *m = shmref_errmsg(c);
    cr_assert(strstr(m, "cannot reserve") && strstr(m, "6291456") && strstr(m, dir), "message: %s", m);
    cr_assert_eq(status_u64(&d, "counters.buffers_create_failed"), 1);
    cr_assert_eq(status_u64(&d, "pool.bytes_allocated"), 0, "the failed reservation is given back");
    /* The tenant stays listed for its refusal, charged nothing. */
    cr_assert_eq(status_u64(&d, "tenants_total"), 1);
    cr_assert_eq(status_u64(&d, "tenants.0.bytes"), 0, "and so is the tenant's charge");
    cr_assert_eq(status_u64(&d, "tenants.0.refused_space"), 1, "the refusal is the tenant's");
    cr_assert_eq(shmref_ping(c), 0, "the client is still served");

    /* A lease that fits in what is left works. */
    cr_assert_eq(shmref_lease(c, 2u << 20, &b), 0, "%s", shmref_errmsg(c));
    memset(shmref_buf_data(b), 0xee, 2u << 20); /* reserved: no SIGBUS */
    cr_assert_eq(shmref_release(b), 0);

    unlink(filler);
    cr_assert_eq(shmref_lease(c, 6u << 20, &b), 0, "space is back: %s", shmref_errmsg(c));
    memset(shmref_buf_data(b), 0xee, 6u << 20);
    shmref_close(c);
    daemon_stop(&d);
    snprintf(cmd, sizeof(cmd), "umount '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    rmdir(dir);
}
