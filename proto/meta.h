/* SPDX-License-Identifier: MIT */
/* meta.h: the metadata convention of proto/METADATA.md, kind "array": encode and a
 * bounded decoder. Private header (not installed). Pure code: no I/O, no allocation;
 * the decoder is safe on hostile bytes (every length checked before it is used). */
#ifndef SHMREF_META_H
#define SHMREF_META_H

#include <stddef.h>
#include <stdint.h>

#define META_VERSION 1
#define META_MAX_DIMS 32
#define META_DTYPE_MAX 32  /* bytes of a dtype type string, with its NUL */

/* How the user value's bytes read: its payload as a msgpack bin, or one msgpack object. */
enum meta_user { META_USER_NONE = 0, META_USER_BIN = 1, META_USER_MSGPACK = 2 };

struct meta_array {
    char dtype[META_DTYPE_MAX];    /* numpy array-interface type string, NUL-terminated */
    uint32_t ndim;
    uint64_t shape[META_MAX_DIMS];
    char order;                    /* 'C' or 'F' */
    uint64_t offset;               /* of the first element from the start of the buffer */
    uint32_t user_kind;            /* enum meta_user */
    const uint8_t *user;           /* decoded: points into the decoded bytes */
    size_t user_len;
};

/* meta_dtype_itemsize: the item size a type string names ("<f8" -> 8, "<M8[ns]" -> 8,
 * "|V16" -> 16, "<U5" -> 20: U counts 4-byte characters), or -EINVAL if it is not one this convention accepts: byte order one of
 * "<>|=", kind one of "biufcmMSUV" (never "O": a pointer means nothing in another
 * process), a size of 1 to 2^20 bytes, and a "[unit]" exactly for m and M. */
int meta_dtype_itemsize(const char *dtype, size_t len);

/* meta_array_nbytes: offset + itemsize * prod(shape) into *ret, or -EOVERFLOW / -EINVAL. */
int meta_array_nbytes(const struct meta_array *m, uint64_t *ret);

/* meta_array_encode: m as one msgpack map into buf (cap bytes). Returns the length,
 * -EINVAL (a field out of range: *ret_why says which) or -EMSGSIZE. */
int meta_array_encode(const struct meta_array *m, uint8_t *buf, size_t cap, const char **ret_why);

/* meta_array_decode: buf[0..len) as kind "array". Returns 0 with *ret filled (user points
 * into buf); -ENOMSG when the bytes do not follow the convention or are another kind
 * (opaque to this decoder); -EBADMSG when they claim to and are malformed, or name a
 * later version. *ret_why gets a static reason naming the field on failure. */
int meta_array_decode(const uint8_t *buf, size_t len, struct meta_array *ret, const char **ret_why);

#endif
