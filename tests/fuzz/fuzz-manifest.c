/* SPDX-License-Identifier: MIT */
/* fuzz-manifest.c: libFuzzer target for proto/manifest.c, everything a consumer runs on a
 * producer's bytes: the unit envelope, the manifest decoder, and manifest_validate
 * against a buffer. Input: 2 bytes (little-endian) n, then n bytes of manifest, then the
 * buffer it describes (copied to an exact-size allocation, so ASan sees any read past
 * it). A decoded manifest must re-encode and decode again; every refusal has a message.
 * Built and run by tests/fuzz/run.sh. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "manifest.h"

static char err[MANIFEST_ERR_MAX];

static void check_refusal(int r)
{
    if (r != -EBADMSG && r != -ENOMEM)
        abort();
    if (!err[0])
        abort(); /* every refusal says why */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct manifest *m = NULL, *again = NULL;
    uint64_t at, n;
    err[0] = '\0';
    int r = manifest_envelope_decode(data, size, &m, &at, &n, err);
    if (r < 0)
        check_refusal(r);
    manifest_free(m);
    m = NULL;
    if (size < 2)
        return 0;
    size_t mlen = (size_t)data[0] | (size_t)data[1] << 8;
    if (mlen > size - 2)
        mlen = size - 2;
    const uint8_t *mb = data + 2, *buf = data + 2 + mlen;
    size_t blen = size - 2 - mlen;
    err[0] = '\0';
    r = manifest_decode(mb, mlen, &m, err);
    if (r < 0) {
        check_refusal(r);
        return 0;
    }
    uint8_t *bytes;
    size_t len;
    if (manifest_encode(m, &bytes, &len) < 0)
        abort(); /* whatever decodes must encode */
    if (manifest_decode(bytes, len, &again, err) != 0 || again->n_columns != m->n_columns ||
        again->n_batches != m->n_batches)
        abort();
    free(bytes);
    manifest_free(again);
    uint8_t *copy = malloc(blen ? blen : 1);
    if (copy) {
        memcpy(copy, buf, blen);
        err[0] = '\0';
        r = manifest_validate(m, copy, blen, err);
        if (r < 0)
            check_refusal(r);
        free(copy);
    }
    manifest_free(m);
    return 0;
}
