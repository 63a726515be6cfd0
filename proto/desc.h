/* SPDX-License-Identifier: MIT */
/* desc.h: the descriptor a producer hands to its consumers. Private header.
 * A descriptor is the 128-bit capability token plus the published size. It has a binary
 * form (msgpack [1, bin16 token, size]) and a text form for command lines, JSON fields
 * and HTTP headers: "shmref1:" 32 lowercase hex digits ":" decimal size. Pure code. */
#ifndef SHMREF_DESC_H
#define SHMREF_DESC_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define DESC_VERSION 1
#define DESC_TEXT_PREFIX "shmref1:"
/* "shmref1:" + 32 hex + ":" + up to 20 digits + NUL */
#define DESC_TEXT_MAX (8 + 32 + 1 + 20 + 1)
#define DESC_BINARY_MAX 32

struct desc {
    uint8_t token[PROTO_TOKEN_LEN];
    uint64_t size;
};

/* desc_to_text: writes the NUL-terminated text form. Returns its length, or -ENOBUFS
 * when cap is too small (nothing useful is written then). */
int desc_to_text(const struct desc *d, char *buf, size_t cap);

/* desc_from_text: parses exactly len bytes (surrounding whitespace is the caller's
 * business). Returns 0, or -EINVAL for anything that is not a well-formed descriptor. */
int desc_from_text(const char *text, size_t len, struct desc *ret);

/* desc_pack / desc_unpack: the binary form. pack returns the length or -EMSGSIZE;
 * unpack returns 0 or -EINVAL, and is bounded like every decoder in proto/. */
int desc_pack(const struct desc *d, uint8_t *buf, size_t cap);
int desc_unpack(const uint8_t *buf, size_t len, struct desc *ret);

/* desc_token_equal: whether two tokens are equal, in a time that does not depend on
 * where they differ (a token is a capability: a compare that stops at the first
 * difference tells a prober how many leading bytes it has right). 1 or 0. */
int desc_token_equal(const uint8_t *a, const uint8_t *b);

#endif
