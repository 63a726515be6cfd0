/* SPDX-License-Identifier: MIT */
/* test-private.c: private acquires (SHMREF_ACQUIRE_PRIVATE, PROTO_ACQUIRE_PRIVATE): a
 * copy-on-write mapping of a published buffer, writable by its process alone, which the
 * daemon sends even to a connection that maps the buffer already (fd-once) and never
 * counts; the producer's and every other consumer's view stays as published. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "harness.h"

#define SIZE (1u << 20)

static struct daemon d;

static void start(void) { daemon_start(&d, NULL); }
static void stop(void) { daemon_stop(&d); }

TestSuite(private, .init = start, .fini = stop, .timeout = 120);

/* counter: one of libshmref's counters of c. */
static uint64_t counter(shmref_conn *c, const char *name)
{
    uint64_t v = 0;
    cr_assert_eq(shmref_conn_counter(c, name, &v), 0, "%s", name);
    return v;
}

static shmref_buf *acquire_ok(shmref_conn *c, const shmref_desc *desc, unsigned flags)
{
    shmref_buf *b = NULL;
    cr_assert_eq(shmref_acquire_ex(c, desc, flags, &b), 0, "%s", shmref_errmsg(c));
    return b;
}

Test(private, writes_stay_in_the_acquirers_own_pages)
{
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d), *other = connect_ok(&d);
    shmref_buf *b;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "%s", shmref_errmsg(p));
    fill_pattern(shmref_buf_data(b), SIZE, 7);
    cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(p));

    /* c maps it already (acquired, released, its mapping cached: fd-once) */
    shmref_buf *plain = acquire_ok(c, &desc, 0);
    cr_assert_eq(shmref_buf_private(plain), 0);
    const void *shared = shmref_buf_data(plain);
    cr_assert_eq(shmref_release(plain), 0);

    shmref_buf *mine = acquire_ok(c, &desc, SHMREF_ACQUIRE_PRIVATE);
    cr_assert_eq(shmref_buf_private(mine), 1);
    unsigned char *w = shmref_buf_data(mine);
    cr_assert_neq((const void *)w, shared, "a private mapping of its own, not the cached one");
    cr_assert_eq(check_pattern(w, SIZE, 7), -1, "it reads the producer's bytes");
    memset(w, 0x5a, 4096);
    w[SIZE - 1] ^= 0xff;
    cr_assert_eq(w[100], 0x5a);

    cr_assert_eq(check_pattern(shmref_buf_data(b), SIZE, 7), -1, "the producer's buffer is unchanged");
    shmref_buf *theirs = acquire_ok(other, &desc, 0);
    cr_assert_eq(check_pattern(shmref_buf_data(theirs), SIZE, 7), -1, "another consumer's view is unchanged");
    shmref_buf *again = acquire_ok(c, &desc, 0); /* the same connection's plain view too */
    cr_assert_eq(check_pattern(shmref_buf_data(again), SIZE, 7), -1);
    cr_assert_eq(shmref_buf_private(again), 0);

    cr_assert_eq(shmref_release(again), 0);
    cr_assert_eq(shmref_release(theirs), 0);
    cr_assert_eq(shmref_release(mine), 0);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 3000), 0, "every lease went back");
    /* The buffer is free again, in the uid's table (the lease was the daemon's, for the
     * table): nothing holds it, and the next lease of its class is the same buffer, with
     * the producer's bytes (the private writes were in c's own pages). */
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), SIZE);
    cr_assert_eq(status_u64(&d, "table.lent"), 1);
    uint64_t leases = counter(p, "table_leases"), sent = counter(p, "sent");
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(counter(p, "table_leases"), leases + 1, "the buffer was reused, from the table");
    cr_assert_eq(counter(p, "sent"), sent);
    cr_assert_eq(check_pattern(shmref_buf_data(b), SIZE, 7), -1, "the buffer is as published");

    /* the same, published in the table: c maps the buffer, but a private acquire is still
     * a private copy, and a plain one is a table hold */
    fill_pattern(shmref_buf_data(b), SIZE, 8);
    uint64_t publishes = counter(p, "table_publishes");
    cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(counter(p, "table_publishes"), publishes + 1);
    mine = acquire_ok(c, &desc, SHMREF_ACQUIRE_PRIVATE);
    cr_assert_eq(shmref_buf_private(mine), 1);
    w = shmref_buf_data(mine);
    cr_assert_eq(check_pattern(w, SIZE, 8), -1, "it reads the producer's bytes");
    memset(w, 0x5a, 4096);
    cr_assert_eq(check_pattern(shmref_buf_data(b), SIZE, 8), -1, "the producer's buffer is unchanged");
    uint64_t takes = counter(c, "table_acquires");
    again = acquire_ok(c, &desc, 0);
    cr_assert_eq(shmref_buf_private(again), 0);
    cr_assert_eq(counter(c, "table_acquires"), takes + 1, "a plain acquire is a table hold");
    cr_assert_eq(check_pattern(shmref_buf_data(again), SIZE, 8), -1);
    cr_assert_eq(shmref_release(again), 0);
    cr_assert_eq(shmref_release(mine), 0);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(shmref_ping(p), 0);
    cr_assert_eq(status_u64(&d, "pool.bytes_leased"), 0, "nothing stays leased");
    cr_assert_eq(status_u64(&d, "pool.bytes_tables"), SIZE);
    cr_assert_eq(status_u64(&d, "table.lent"), 1);
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "%s", shmref_errmsg(p));
    cr_assert_eq(counter(p, "table_leases"), leases + 2, "free again in the table");
    cr_assert_eq(check_pattern(shmref_buf_data(b), SIZE, 8), -1, "as published: the private writes were c's own");
    cr_assert_eq(shmref_release(b), 0);
    shmref_close(other);
    shmref_close(c);
    shmref_close(p);
}

Test(private, two_private_acquires_of_one_connection_are_independent)
{
    shmref_conn *p = connect_ok(&d), *c = connect_ok(&d);
    shmref_buf *b;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(p, SIZE, &b), 0, "%s", shmref_errmsg(p));
    fill_pattern(shmref_buf_data(b), SIZE, 9);
    cr_assert_eq(shmref_publish(b, SIZE, 0, NULL, 0, &desc), 0, "%s", shmref_errmsg(p));
    shmref_buf *x = acquire_ok(c, &desc, SHMREF_ACQUIRE_PRIVATE);
    shmref_buf *y = acquire_ok(c, &desc, SHMREF_ACQUIRE_PRIVATE);
    memset(shmref_buf_data(x), 1, SIZE);
    cr_assert_eq(check_pattern(shmref_buf_data(y), SIZE, 9), -1, "x's writes are not y's");
    cr_assert_eq(shmref_release(x), 0);
    cr_assert_eq(shmref_release(y), 0);
    cr_assert_eq(shmref_release(b), 0);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 3000), 0);
    shmref_close(c);
    shmref_close(p);
}
