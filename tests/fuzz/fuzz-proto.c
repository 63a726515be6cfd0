/* fuzz-proto.c: libFuzzer target for everything in proto/ that reads untrusted bytes:
 * the message decoder (as the daemon and the library call it), the status-body check,
 * and both descriptor forms. Any crash, sanitizer report, or a decoded message that
 * does not survive re-encoding is a finding. Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>

#include "desc.h"
#include "proto.h"

static uint8_t out[PROTO_MAX_REPLY];

static void roundtrip(const struct proto_msg *m)
{
    struct proto_msg again;
    const char *why;
    int n = proto_encode(m, out, sizeof(out));
    if (n < 0)
        abort(); /* whatever decodes must encode */
    if (proto_decode(out, (size_t)n, sizeof(out), &again, &why) != 0 || again.op != m->op || again.id != m->id)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct proto_msg m;
    const char *why = NULL;
    int r = proto_decode(data, size, PROTO_MAX_REQUEST, &m, &why);
    if (r == 0)
        roundtrip(&m);
    else if (r != -EPROTO && r != -EOPNOTSUPP)
        abort();
    else if (!why)
        abort(); /* every refusal has a reason */
    proto_check(data, size, PROTO_MAX_DEPTH, &why);

    struct desc d;
    if (desc_unpack(data, size, &d) == 0) {
        uint8_t buf[DESC_BINARY_MAX];
        struct desc back;
        int n = desc_pack(&d, buf, sizeof(buf));
        if (n < 0 || desc_unpack(buf, (size_t)n, &back) != 0 || memcmp(&d, &back, sizeof(d)) != 0)
            abort();
    }
    if (desc_from_text((const char *)data, size, &d) == 0) {
        char text[DESC_TEXT_MAX];
        int n = desc_to_text(&d, text, sizeof(text));
        /* one spelling per descriptor: what parses prints back the same */
        if (n < 0 || (size_t)n != size || memcmp(text, data, size) != 0)
            abort();
    }
    return 0;
}
