/* SPDX-License-Identifier: MIT */
/* test-quota.c: the per-tenant byte ledger (daemon/quota.c). A charge that would pass a
 * tenant's limit is refused whole with the numbers in the message; limits per uid override
 * the default; empty tenants drop out; sums near UINT64_MAX are refused, never wrapped. */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "quota.h"

#define MiB (UINT64_C(1) << 20)

static struct quota *new_quota(uint64_t def)
{
    struct quota *q = NULL;
    cr_assert_eq(quota_new(def, &q), 0);
    cr_assert_not_null(q);
    return q;
}

/* The ledger entry of uid, which must exist. */
static struct quota_tenant tenant_of(const struct quota *q, uint32_t uid)
{
    struct quota_tenant t[128];
    unsigned n = quota_tenants(q, t, 128);
    for (unsigned i = 0; i < n; i++)
        if (t[i].uid == uid)
            return t[i];
    cr_assert_fail("uid %u has no ledger entry", uid);
    return (struct quota_tenant){ 0 };
}

static bool has_tenant(const struct quota *q, uint32_t uid)
{
    struct quota_tenant t[128];
    unsigned n = quota_tenants(q, t, 128);
    for (unsigned i = 0; i < n; i++)
        if (t[i].uid == uid)
            return true;
    return false;
}

static void expect_contains(const char *why, const char *needle)
{
    cr_assert_not_null(strstr(why, needle), "\"%s\" not in: %s", needle, why);
}

Test(quota, charge_within_quota)
{
    char why[256] = "";
    struct quota *q = new_quota(MiB);
    cr_assert_eq(quota_count(q), 0);
    cr_assert_eq(quota_limit(q, 1000), MiB);
    cr_assert_eq(quota_charge(q, 1000, 4096, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 1000, 8192, why, sizeof(why)), 0);
    cr_assert_eq(quota_count(q), 1);
    struct quota_tenant t = tenant_of(q, 1000);
    cr_assert_eq(t.bytes, 12288);
    cr_assert_eq(t.buffers, 2);
    cr_assert_eq(t.quota, MiB);
    quota_free(q);
}

Test(quota, over_quota_refused_with_numbers)
{
    char why[512] = "";
    struct quota *q = new_quota(10000);
    cr_assert_eq(quota_charge(q, 1000, 6000, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 1000, 5000, why, sizeof(why)), -EDQUOT);
    expect_contains(why, "uid 1000");
    expect_contains(why, "(6000 bytes)");  /* held */
    expect_contains(why, "(5000 bytes)");  /* asked */
    expect_contains(why, "(10000 bytes)"); /* quota */
    /* refused whole: nothing of it is charged */
    struct quota_tenant t = tenant_of(q, 1000);
    cr_assert_eq(t.bytes, 6000);
    cr_assert_eq(t.buffers, 1);
    /* what still fits is allowed */
    cr_assert_eq(quota_charge(q, 1000, 4000, why, sizeof(why)), 0);
    cr_assert_eq(tenant_of(q, 1000).bytes, 10000);
    quota_free(q);
}

Test(quota, message_is_truncated_safely)
{
    char why[16];
    memset(why, 'x', sizeof(why));
    struct quota *q = new_quota(100);
    cr_assert_eq(quota_charge(q, 1000, 101, why, 8), -EDQUOT);
    cr_assert_eq(strlen(why), 7);
    cr_assert_eq(why[8], 'x', "wrote past why_len");
    quota_free(q);
}

Test(quota, credit_gives_back)
{
    char why[256];
    struct quota *q = new_quota(10000);
    cr_assert_eq(quota_charge(q, 1000, 6000, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 1000, 3000, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 1000, 6000, why, sizeof(why)), -EDQUOT);
    quota_credit(q, 1000, 6000);
    struct quota_tenant t = tenant_of(q, 1000);
    cr_assert_eq(t.bytes, 3000);
    cr_assert_eq(t.buffers, 1);
    cr_assert_eq(quota_charge(q, 1000, 6000, why, sizeof(why)), 0);
    cr_assert_eq(tenant_of(q, 1000).bytes, 9000);
    quota_credit(q, 1000, 6000);
    quota_credit(q, 1000, 3000);
    cr_assert_eq(quota_count(q), 0, "an empty tenant stays listed");
    /* crediting an unknown uid changes nothing */
    quota_credit(q, 4242, 100);
    cr_assert_eq(quota_count(q), 0);
    cr_assert_eq(quota_charge(q, 1000, 10000, why, sizeof(why)), 0);
    quota_free(q);
}

Test(quota, boundary_exactly_up_to_quota)
{
    char why[256];
    struct quota *q = new_quota(8192);
    cr_assert_eq(quota_charge(q, 1000, 8192, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 1000, 1, why, sizeof(why)), -EDQUOT);
    cr_assert_eq(tenant_of(q, 1000).bytes, 8192);

    cr_assert_eq(quota_charge(q, 2000, 4096, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 2000, 4097, why, sizeof(why)), -EDQUOT);
    cr_assert_eq(quota_charge(q, 2000, 4096, why, sizeof(why)), 0);
    cr_assert_eq(tenant_of(q, 2000).bytes, 8192);

    /* a single charge bigger than the quota, for a fresh uid */
    cr_assert_eq(quota_charge(q, 3000, 8193, why, sizeof(why)), -EDQUOT);
    expect_contains(why, "uid 3000");
    expect_contains(why, "(0 bytes)");
    expect_contains(why, "(8193 bytes)");
    expect_contains(why, "(8192 bytes)");
    /* a zero quota refuses every byte */
    quota_set_default(q, 0);
    cr_assert_eq(quota_charge(q, 4000, 1, why, sizeof(why)), -EDQUOT);
    quota_free(q);
}

Test(quota, per_uid_limit_overrides_default)
{
    char why[256];
    struct quota *q = new_quota(4096);
    cr_assert_eq(quota_set(q, 1001, 16384), 0);
    cr_assert_eq(quota_limit(q, 1001), 16384);
    cr_assert_eq(quota_limit(q, 1000), 4096);
    cr_assert_eq(quota_limit(q, 7), 4096);
    cr_assert_eq(quota_charge(q, 1001, 16384, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 1000, 16384, why, sizeof(why)), -EDQUOT);
    expect_contains(why, "(4096 bytes)");
    cr_assert_eq(quota_charge(q, 1000, 4096, why, sizeof(why)), 0);

    /* a lowered limit takes nothing back but refuses new charges */
    cr_assert_eq(quota_set(q, 1001, 8192), 0);
    cr_assert_eq(tenant_of(q, 1001).bytes, 16384);
    cr_assert_eq(tenant_of(q, 1001).quota, 8192);
    cr_assert_eq(quota_charge(q, 1001, 1, why, sizeof(why)), -EDQUOT);
    expect_contains(why, "uid 1001");
    expect_contains(why, "(16384 bytes)");
    expect_contains(why, "(8192 bytes)");
    quota_free(q);
}

Test(quota, set_default_changes_only_uids_without_own_limit)
{
    char why[256];
    struct quota *q = new_quota(4096);
    cr_assert_eq(quota_charge(q, 1000, 100, why, sizeof(why)), 0); /* default limit */
    cr_assert_eq(quota_set(q, 1001, 50000), 0);                     /* own limit */
    quota_set_default(q, 20000);
    cr_assert_eq(quota_limit(q, 1000), 20000);
    cr_assert_eq(quota_limit(q, 1001), 50000);
    cr_assert_eq(quota_limit(q, 1002), 20000);
    cr_assert_eq(tenant_of(q, 1000).quota, 20000);
    cr_assert_eq(tenant_of(q, 1001).quota, 50000);
    cr_assert_eq(quota_charge(q, 1000, 19900, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 1000, 1, why, sizeof(why)), -EDQUOT);
    cr_assert_eq(quota_charge(q, 1002, 20000, why, sizeof(why)), 0);

    quota_set_default(q, 1000);
    cr_assert_eq(quota_limit(q, 1000), 1000);
    cr_assert_eq(tenant_of(q, 1000).bytes, 20000, "a lowered default took bytes back");
    cr_assert_eq(quota_limit(q, 1001), 50000);
    cr_assert_eq(quota_charge(q, 1001, 50000, why, sizeof(why)), 0);
    quota_free(q);
}

Test(quota, tenants_lists_charged_and_own_limits_only)
{
    char why[256];
    struct quota_tenant t[8];
    struct quota *q = new_quota(MiB);
    cr_assert_eq(quota_charge(q, 1000, 4096, why, sizeof(why)), 0); /* charged */
    cr_assert_eq(quota_set(q, 1001, 2 * MiB), 0);                   /* own limit only */
    cr_assert_eq(quota_charge(q, 1002, 8192, why, sizeof(why)), 0); /* charged, then not */
    quota_credit(q, 1002, 8192);
    cr_assert_eq(quota_charge(q, 1003, 2 * MiB, why, sizeof(why)), -EDQUOT); /* refused */
    cr_assert_eq(quota_limit(q, 7), MiB, "unknown uids see the default");

    cr_assert_eq(quota_count(q), 2);
    cr_assert(has_tenant(q, 1000));
    cr_assert(has_tenant(q, 1001));
    cr_assert_not(has_tenant(q, 1002), "credited to zero but still listed");
    cr_assert_not(has_tenant(q, 1003), "a refused charge left an entry");
    struct quota_tenant a = tenant_of(q, 1000), b = tenant_of(q, 1001);
    cr_assert_eq(a.bytes, 4096);
    cr_assert_eq(a.buffers, 1);
    cr_assert_eq(a.quota, MiB);
    cr_assert_eq(b.bytes, 0);
    cr_assert_eq(b.buffers, 0);
    cr_assert_eq(b.quota, 2 * MiB);
    cr_assert_eq(quota_tenants(q, t, 1), 1, "max is honoured");

    /* an own limit keeps its entry at zero bytes */
    cr_assert_eq(quota_charge(q, 1001, 4096, why, sizeof(why)), 0);
    quota_credit(q, 1001, 4096);
    cr_assert(has_tenant(q, 1001));
    cr_assert_eq(tenant_of(q, 1001).bytes, 0);
    /* the one charged tenant drops out when credited */
    quota_credit(q, 1000, 4096);
    cr_assert_eq(quota_count(q), 1);
    cr_assert_eq(quota_tenants(q, t, 8), 1);
    cr_assert_eq(t[0].uid, 1001);
    quota_free(q);
    quota_free(NULL);
}

Test(quota, many_tenants)
{
    char why[256];
    struct quota *q = new_quota(MiB);
    for (uint32_t uid = 0; uid < 100; uid++)
        cr_assert_eq(quota_charge(q, 5000 + uid, 4096 * (uid + 1), why, sizeof(why)), 0);
    cr_assert_eq(quota_count(q), 100);
    for (uint32_t uid = 0; uid < 100; uid += 2)
        quota_credit(q, 5000 + uid, 4096 * (uid + 1));
    cr_assert_eq(quota_count(q), 50);
    for (uint32_t uid = 1; uid < 100; uid += 2) {
        cr_assert_eq(tenant_of(q, 5000 + uid).bytes, 4096 * (uid + 1));
        cr_assert_not(has_tenant(q, 5000 + uid - 1));
    }
    quota_free(q);
}

Test(quota, overflow_safe)
{
    char why[512];
    struct quota *q = new_quota(UINT64_MAX);
    cr_assert_eq(quota_charge(q, 1000, UINT64_MAX - 100, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 1000, 200, why, sizeof(why)), -EDQUOT, "sum wrapped");
    cr_assert_eq(tenant_of(q, 1000).bytes, UINT64_MAX - 100);
    cr_assert_eq(quota_charge(q, 1000, UINT64_MAX, why, sizeof(why)), -EDQUOT);
    cr_assert_eq(quota_charge(q, 1000, 100, why, sizeof(why)), 0);
    cr_assert_eq(tenant_of(q, 1000).bytes, UINT64_MAX);
    cr_assert_eq(quota_charge(q, 1000, 1, why, sizeof(why)), -EDQUOT);
    expect_contains(why, "(18446744073709551615 bytes)");

    quota_set_default(q, 1 << 30);
    cr_assert_eq(quota_charge(q, 2000, UINT64_MAX, why, sizeof(why)), -EDQUOT);
    cr_assert_eq(quota_charge(q, 2000, 1 << 30, why, sizeof(why)), 0);
    cr_assert_eq(quota_charge(q, 2000, UINT64_MAX - (1 << 30) + 1, why, sizeof(why)), -EDQUOT);
    cr_assert_eq(tenant_of(q, 2000).bytes, 1 << 30);
    /* a credit of more than is held clamps at zero */
    quota_credit(q, 2000, UINT64_MAX);
    cr_assert_not(has_tenant(q, 2000));
    quota_free(q);
}

Test(quota, counts_refusals_per_tenant_by_cause)
{
    struct quota *q = new_quota(4 * MiB);
    char why[512];
    cr_assert_eq(quota_charge(q, 1000, 8 * MiB, why, sizeof(why)), -EDQUOT);
    cr_assert(strstr(why, "--tenant-quota") && strstr(why, "[quota]"), "the message points at the fix: %s", why);
    quota_note_refusal(q, 1000, EDQUOT);
    quota_note_refusal(q, 1000, ENOSPC);
    quota_note_refusal(q, 1000, EFBIG);
    quota_note_refusal(q, 1000, EACCES);
    quota_note_refusal(q, 1000, EINVAL);
    /* A tenant holding nothing stays listed while it has refusals to show. */
    struct quota_tenant t = tenant_of(q, 1000);
    cr_assert_eq(t.bytes, 0);
    cr_assert_eq(t.refused_quota, 1);
    cr_assert_eq(t.refused_space, 1);
    cr_assert_eq(t.refused_limit, 1);
    cr_assert_eq(t.refused_access, 1);
    cr_assert_eq(t.refused_other, 1);
    quota_clear_limits(q);
    cr_assert(has_tenant(q, 1000));
    cr_assert(!has_tenant(q, 1001));
    quota_free(q);
}

/* Pinned bytes count against the quota, are shown per tenant, and are not charges (the
 * ledger total stays the buffers' charges). */
Test(quota, pinned_bytes_count_against_the_quota)
{
    struct quota *q;
    char why[512];
    cr_assert_eq(quota_new(10 << 20, &q), 0);
    cr_assert_eq(quota_pin(q, 1000, 6 << 20), 0);
    cr_assert_eq(quota_total(q), 0, "a pin is no charge");
    cr_assert_eq(quota_check_pinned(q, 1000, why, sizeof(why)), 0, "within the quota");
    cr_assert_eq(quota_charge(q, 1000, 5 << 20, why, sizeof(why)), -EDQUOT);
    cr_assert(strstr(why, "pinned"), "the message names the pins: %s", why);
    cr_assert_eq(quota_charge(q, 1000, 4 << 20, why, sizeof(why)), 0);
    cr_assert_eq(quota_pin(q, 1000, 1 << 20), 0);
    cr_assert_eq(quota_check_pinned(q, 1000, why, sizeof(why)), -EDQUOT, "11 MiB held and pinned of 10");
    struct quota_tenant t[4];
    cr_assert_eq(quota_tenants(q, t, 4), 1);
    cr_assert_eq(t[0].pinned, 7 << 20);
    cr_assert_eq(quota_credit(q, 1000, 4 << 20), 0);
    cr_assert_eq(quota_pin(q, 1000, -(7 << 20)), 0);
    cr_assert_eq(quota_count(q), 0, "nothing held, nothing pinned: not listed");
    quota_free(q);
}
