/* SPDX-License-Identifier: MIT */
/* fuzz-proto.c: libFuzzer target for everything in proto/ that reads untrusted bytes:
 * the message decoder (as the daemon and the library call it), the status-body check,
 * both descriptor forms, and the array metadata decoder (meta.c). Any crash, sanitizer report, or a decoded message that
 * does not survive re-encoding is a finding. Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>

#include "desc.h"
#include "meta.h"
#include "proto.h"

static uint8_t out[PROTO_MAX_REPLY];

/* meta_roundtrip: metadata that decodes re-encodes to bytes that decode the same. */
static void meta_roundtrip(const uint8_t *data, size_t size, const struct meta_array *m)
{
    static uint8_t buf[PROTO_MAX_META + 64];
    struct meta_array again;
    const char *why;
    if (m->user && (m->user < data || m->user + m->user_len > data + size))
        abort(); /* the user value lies inside the input */
    uint64_t nb;
    if (meta_array_nbytes(m, &nb) != 0)
        abort(); /* the decoder checked the size */
    int n = meta_array_encode(m, buf, sizeof(buf), &why);
    if (n < 0)
        abort();
    if (meta_array_decode(buf, (size_t)n, &again, &why) != 0 || strcmp(again.dtype, m->dtype) != 0 ||
        again.ndim != m->ndim || memcmp(again.shape, m->shape, m->ndim * sizeof(m->shape[0])) != 0 ||
        again.order != m->order || again.offset != m->offset || again.user_kind != m->user_kind ||
        again.user_len != m->user_len || (m->user_len && memcmp(again.user, m->user, m->user_len) != 0))
        abort();
}

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

    struct meta_array ma;
    why = NULL;
    r = meta_array_decode(data, size, &ma, &why);
    if (r == 0)
        meta_roundtrip(data, size, &ma);
    else if ((r != -ENOMSG && r != -EBADMSG) || !why)
        abort();

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
