/* SPDX-License-Identifier: MIT */
/* test-units.c: human byte sizes (proto/units.c). units_parse takes binary multiples
 * with an optional "iB"/"B" and refuses anything else or anything past UINT64_MAX;
 * units_format prints bytes below 1 KiB exactly and larger sizes with one decimal. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "units.h"

static uint64_t parse_ok(const char *text)
{
    uint64_t v = 0xdeadbeef;
    int r = units_parse(text, &v);
    cr_assert_eq(r, 0, "units_parse(\"%s\") = %d", text, r);
    return v;
}

Test(units, parse_plain_numbers)
{
    cr_assert_eq(parse_ok("0"), 0);
    cr_assert_eq(parse_ok("4096"), 4096);
    cr_assert_eq(parse_ok("007"), 7);
    cr_assert_eq(parse_ok("10B"), 10);
    cr_assert_eq(parse_ok("0B"), 0);
    cr_assert_eq(parse_ok("18446744073709551615"), UINT64_MAX);
    cr_assert_eq(parse_ok("18446744073709551615B"), UINT64_MAX);
}

Test(units, parse_suffixes)
{
    static const struct { const char *text; uint64_t value; } cases[] = {
        { "64K", UINT64_C(65536) },
        { "64KiB", UINT64_C(65536) },
        { "64KB", UINT64_C(65536) },
        { "64k", UINT64_C(65536) },
        { "64kB", UINT64_C(65536) },
        { "80M", UINT64_C(83886080) },
        { "80MiB", UINT64_C(83886080) },
        { "80m", UINT64_C(83886080) },
        { "2G", UINT64_C(2147483648) },
        { "2GiB", UINT64_C(2147483648) },
        { "2g", UINT64_C(2147483648) },
        { "1T", UINT64_C(1099511627776) },
        { "1TiB", UINT64_C(1099511627776) },
        { "1t", UINT64_C(1099511627776) },
        { "0K", 0 },
        { "1K", 1024 },
        { "3M", UINT64_C(3) << 20 },
        { "17179869183G", UINT64_C(17179869183) << 30 },   /* largest G that fits */
        { "16777215T", UINT64_C(16777215) << 40 },
    };
    for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        cr_assert_eq(parse_ok(cases[i].text), cases[i].value, "\"%s\"", cases[i].text);
}

Test(units, parse_rejects)
{
    static const char *const bad[] = {
        "", "abc", "-1", "+1", " 1", "1 ", "1X", "1 M", "M", "K", "iB", "B",
        "1.5M", "1,024", "0x10", "1MM", "1KiBB", "1Ki", "1iB", "1BB", "1b",
        "1kib", "1E", "1P", "64Kib", "1M ", "1\n",
    };
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 0xabcdef;
        cr_assert_eq(units_parse(bad[i], &v), -EINVAL, "\"%s\" accepted", bad[i]);
        cr_assert_eq(v, 0xabcdef, "\"%s\" wrote *ret", bad[i]);
    }
    uint64_t v;
    cr_assert_eq(units_parse(NULL, &v), -EINVAL);
}

Test(units, parse_overflow)
{
    static const char *const big[] = {
        "99999999999999999999",
        "18446744073709551616",            /* UINT64_MAX + 1 */
        "100000000000000000000000",
        "17179869184G",                    /* 2^34 GiB = 2^64 */
        "16777216T",                       /* 2^24 TiB = 2^64 */
        "17592186044416M",                 /* 2^44 MiB = 2^64 */
        "18014398509481984K",              /* 2^54 KiB = 2^64 */
        "18446744073709551615K",
    };
    for (unsigned i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
        uint64_t v = 0xabcdef;
        cr_assert_eq(units_parse(big[i], &v), -ERANGE, "\"%s\"", big[i]);
        cr_assert_eq(v, 0xabcdef, "\"%s\" wrote *ret", big[i]);
    }
}

static void format_is(uint64_t bytes, const char *expected)
{
    char buf[UNITS_TEXT_MAX];
    memset(buf, '#', sizeof(buf));
    const char *r = units_format(bytes, buf);
    cr_assert_eq(r, buf, "units_format must return its buffer");
    cr_assert_str_eq(buf, expected, "units_format(%llu)", (unsigned long long)bytes);
}

Test(units, format)
{
    format_is(0, "0 B");
    format_is(1, "1 B");
    format_is(512, "512 B");
    format_is(1023, "1023 B");
    format_is(1024, "1.0 KiB");
    format_is(1536, "1.5 KiB");
    format_is(65536, "64.0 KiB");
    format_is(1048576, "1.0 MiB");
    format_is(83886080, "80.0 MiB");
    format_is(UINT64_C(1) << 30, "1.0 GiB");
    format_is((UINT64_C(5) << 30) / 2, "2.5 GiB");
    format_is(UINT64_C(1) << 40, "1.0 TiB");
    format_is(UINT64_C(1) << 50, "1.0 PiB");
    format_is(UINT64_C(1) << 60, "1.0 EiB");
    format_is(UINT64_MAX, "16.0 EiB");
}

Test(units, format_and_parse_agree)
{
    static const char *const texts[] = { "1K", "80M", "2G", "1T" };
    static const char *const shown[] = { "1.0 KiB", "80.0 MiB", "2.0 GiB", "1.0 TiB" };
    for (unsigned i = 0; i < 4; i++) {
        char buf[UNITS_TEXT_MAX];
        cr_assert_str_eq(units_format(parse_ok(texts[i]), buf), shown[i]);
    }
}
