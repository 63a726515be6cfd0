/* SPDX-License-Identifier: MIT */
/* test-text.c: proto/text.c, making a client's name safe to show. */
#include <criterion/criterion.h>

#include <string.h>

#include "text.h"

static void expect_clean(const char *in, size_t len, const char *want)
{
    char out[256];
    size_t n = text_clean(out, in, len);
    cr_expect_str_eq(out, want);
    cr_expect_eq(n, strlen(want));
    cr_expect_leq(n, len);
}

Test(text, keeps_valid_utf8)
{
    expect_clean("worker-3", 8, "worker-3");
    expect_clean("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", 17,
                 "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");
    expect_clean("", 0, "");
}

Test(text, replaces_every_invalid_byte)
{
    expect_clean("a\xff" "b", 3, "a?b");
    expect_clean("\xc3", 1, "?");                     /* truncated sequence */
    expect_clean("\xc0\xaf", 2, "??");                /* overlong '/' */
    expect_clean("\xe0\x80\xaf", 3, "???");           /* overlong, 3 bytes */
    expect_clean("\xed\xa0\x80", 3, "???");           /* a surrogate, U+D800 */
    expect_clean("\xf4\x90\x80\x80", 4, "????");      /* above U+10FFFF */
    expect_clean("\x80\x80", 2, "??");                /* lone continuation bytes */
}

Test(text, drops_control_and_bidi_characters)
{
    expect_clean("a\x1b[2Jb", 6, "a[2Jb");              /* ESC of a CSI */
    expect_clean("a\nb\rc\td", 7, "abcd");
    expect_clean("a\x7f" "b", 3, "ab");
    expect_clean("a\xc2\x9b" "b", 4, "ab");            /* C1 CSI, U+009B */
    expect_clean("a\xe2\x80\xae" "b", 5, "ab");        /* RIGHT-TO-LEFT OVERRIDE */
    expect_clean("a\xe2\x81\xa6" "b", 5, "ab");        /* LEFT-TO-RIGHT ISOLATE */
    expect_clean("a\xe2\x80\x8f" "b", 5, "ab");        /* RIGHT-TO-LEFT MARK */
    expect_clean("a\xd8\x9c" "b", 4, "ab");            /* ARABIC LETTER MARK */
    expect_clean("a\0b", 3, "ab");                     /* an embedded NUL */
}
