/* SPDX-License-Identifier: MIT */
/* test-hostile-v2.c: protocol version 2 against hostile clients, through a real shmrefd
 * on a temporary socket, spoken raw by real processes (several uids where it matters):
 * handles of a lease_many touched before its reply, clients that park the most waiting
 * requests they may and vanish, a lease_many whose replies are never read, release_many
 * with duplicates and foreign handles, one uid's flood of waiting leases beside another
 * uid leasing freely, and an acquire parked on a token whose buffer is released and
 * leased again (ENOENT, never the new bytes). Nothing may leak: status counters, quota,
 * the daemon's own fds (/proc/<pid>/fd); the daemon's ledger check aborts on a drift. */
#include <criterion/criterion.h>

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rawv2.h"

TestSuite(hostile_v2, .fini = reap_children);

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

static void lease_many_send(int fd, uint32_t id, uint32_t n, const uint64_t *sizes, uint32_t wait_ms)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE_MANY, .id = id };
    m.u.lease_many.n = n;
    memcpy(m.u.lease_many.sizes, sizes, n * sizeof(sizes[0]));
    m.u.lease_many.wait_ms = wait_ms;
    rv_send(fd, &m);
}

/* handle_guess: the handle a fresh connection's registry gives its k-th hold of slot i
 * (generation k, slot index i): what a hostile client can predict. */
static uint64_t handle_guess(uint32_t gen, uint32_t slot)
{
    return (uint64_t)gen << 32 | slot;
}

/* A lease_many whose first item is a warm buffer (held at once) and whose second must be
 * made off the loop: the client releases the first item's handle, which it guessed, before
 * the reply. The daemon must not reply with (or touch) the buffer it no longer holds: the
 * whole batch is refused and undone, the ledgers agree, the daemon lives on. */
Test(hostile_v2, lease_many_item_released_before_the_reply, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    /* a warm 64 KiB buffer of this uid (another connection leases and releases it) */
    int warm = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
    uint64_t wh = rv_lease(warm, 1, 64 * KiB, NULL);
    rv_release_send(warm, 2, wh);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);

    for (int round = 0; round < 3; round++) {
        int fd = rv_connect(&d, PROTO_FEAT_NOREPLY_RELEASE);
        /* item 0: the warm class (slot 0, generation 1); item 1: a new 4 MiB buffer */
        uint64_t sizes[2] = { 64 * KiB, 4 * MiB + (uint64_t)round * MiB };
        lease_many_send(fd, 10, 2, sizes, 0);
        rv_release_send(fd, 11, handle_guess(1, 0));
        struct proto_msg r;
        ssize_t n = rv_recv(fd, 10000, &r);
        if (n <= 0) { usleep(300000); char c[256]; snprintf(c, sizeof c, "tail -5 %s >&2", d.log); if (system(c)) {} }
        cr_assert_gt(n, 0, "round %d: no reply to the lease_many (%zd; daemon exited? %d)", round, n, waitpid(d.pid, NULL, WNOHANG) == d.pid);
        cr_assert_eq(r.id, 10, "round %d: reply id %u op %u", round, r.id, r.op);
        if (r.op == PROTO_OP_LEASE_MANY + PROTO_OP_REPLY) {
            /* the release came too late to matter: the reply must name live handles */
            cr_assert_eq(r.u.lease_many_reply.n, 2);
        } else {
            cr_assert_eq(r.op, PROTO_OP_ERROR, "round %d: op %u", round, r.op);
        }
        close(fd);
        cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0, "round %d: bytes still leased", round);
        cr_assert_eq(wait_status(&d, "buffers.leases", 0, 5000), 0, "round %d", round);
    }
    /* the daemon still serves, and its ledgers agree (a drift aborts it) */
    uint64_t h = rv_lease(warm, 3, 64 * KiB, NULL);
    rv_release_send(warm, 4, h);
    cr_assert_eq(wait_status(&d, "pool.bytes_leased", 0, 5000), 0);
    close(warm);
    daemon_stop(&d);
}
