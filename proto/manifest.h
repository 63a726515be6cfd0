/* SPDX-License-Identifier: MIT */
/* manifest.h: the manifest of a unit of work (version 1). Private header (not installed).
 * Pure code: no I/O, no logging. The decoder is bounded like proto_decode (size, depth and
 * every length and count checked on the raw bytes before msgpack-c unpacks, every type and
 * range after), and manifest_validate checks a decoded manifest against the bytes of the
 * buffer it describes, so that nothing a producer writes can make a consumer read outside
 * its mapping.
 *
 * A unit of work is one shmref buffer holding many Arrow arrays: one schema (a list of
 * columns, each a tree of fields) and one or more record batches (each a list of column
 * arrays with that schema). Every buffer of every array is a range [offset, length] of the
 * shmref buffer, offset counted from its start and a multiple of 64 (never an address).
 *
 * The format: one msgpack map with string keys (unknown keys are ignored):
 *   "v"        uint   manifest version, 1 (a larger one is refused)
 *   "columns"  uint   number of top-level fields (columns)
 *   "fields"   array  the schema's field trees, flattened in pre-order: each node is
 *                     [name: str, format: str, flags: uint, n_children: uint,
 *                      has_dictionary: bool, metadata: bin | nil]
 *                     and is followed by its n_children children (each with its own
 *                     subtree), then, if has_dictionary, by the dictionary's value field.
 *                     format is an Arrow C Data Interface format string; flags are
 *                     ARROW_FLAG_* (1 dictionary ordered, 2 nullable, 4 map keys sorted);
 *                     metadata is Arrow's binary key/value encoding (int32 count, then
 *                     int32 length + bytes for each key and value, little-endian).
 *   "metadata" bin|nil the schema's own metadata (same encoding); optional
 *   "batches"  array  the record batches: each [length: uint, nodes: array], nodes being
 *                     the column arrays flattened in the same pre-order as "fields" (one
 *                     node per field node, dictionaries included), each node
 *                     [length: uint, null_count: int, offset: uint,
 *                      buf0_offset, buf0_length, buf1_offset, buf1_length, ...]
 *                     with exactly as many buffers as the format has in the C Data
 *                     Interface (validity first; [0, 0] is an absent buffer, allowed for a
 *                     validity bitmap when null_count is 0). offset is Arrow's array
 *                     offset (in elements). null_count is -1 (unknown) or 0..length.
 * Flattening keeps the msgpack nesting at 5 whatever the type nesting (at most
 * MANIFEST_MAX_DEPTH), so the decoder needs no recursion on the raw bytes.
 *
 * In the metadata of the shmref buffer the manifest travels in the unit envelope of
 * proto/METADATA.md: {"shmref": 1, "kind": "unit", "manifest": <the map above>}, or, when
 * that would exceed the 16 KiB metadata limit, {"shmref": 1, "kind": "unit",
 * "manifest_at": [offset, length]} with the manifest's bytes inside the buffer. */
#ifndef SHMREF_MANIFEST_H
#define SHMREF_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MANIFEST_VERSION 1
#define MANIFEST_ALIGN 64                   /* every buffer's offset is a multiple */
#define MANIFEST_MAX_BYTES (256u << 20)     /* a manifest kept inside the buffer */
#define MANIFEST_MAX_DEPTH 64               /* nesting of types (Arrow's own IPC limit) */
#define MANIFEST_MAX_FORMAT 64              /* bytes of a format string */
#define MANIFEST_MAX_BUFFERS 3
#define MANIFEST_ERR_MAX 256                /* bytes of a refusal's message */

/* The physical layout a format string implies. */
enum manifest_layout {
    MANIFEST_NULL,          /* "n": no buffers */
    MANIFEST_BOOL,          /* "b": validity, bits */
    MANIFEST_FIXED,         /* validity, width bytes per element (primitives, decimals,
                             * fixed-size binary, dates, times, timestamps, durations) */
    MANIFEST_BINARY,        /* "z" "u": validity, int32 offsets, bytes */
    MANIFEST_LARGE_BINARY,  /* "Z" "U": validity, int64 offsets, bytes */
    MANIFEST_LIST,          /* "+l" and "+m" (map): validity, int32 offsets; one child */
    MANIFEST_LARGE_LIST,    /* "+L": validity, int64 offsets; one child */
    MANIFEST_FIXED_LIST,    /* "+w:N": validity; one child of width elements per slot */
    MANIFEST_STRUCT,        /* "+s": validity; any number of children */
};

struct manifest_type {
    enum manifest_layout layout;
    unsigned n_buffers;
    uint64_t width;         /* FIXED: bytes per element; FIXED_LIST: child slots per slot */
    bool integer;           /* usable as dictionary indices: c C s S i I l L */
    bool is_signed;
    bool map;               /* "+m" */
};

/* manifest_type_parse: the layout of an Arrow format string (NUL-terminated). Returns 0,
 * or -EINVAL for a malformed or unsupported format (unions, run-end encoded, views). */
int manifest_type_parse(const char *format, struct manifest_type *ret);

struct manifest_field {
    char *name, *format;                /* NUL-terminated */
    int64_t flags;
    const uint8_t *metadata;            /* Arrow binary metadata, or NULL */
    uint32_t metadata_len;
    struct manifest_type type;
    uint32_t n_children;
    struct manifest_field **children;
    struct manifest_field *dictionary;  /* the dictionary's value field, or NULL */
};

struct manifest_range {
    uint64_t off, len;
};

/* An array: shaped like its field (same children, a dictionary iff the field has one). */
struct manifest_array {
    int64_t length, null_count, offset;
    struct manifest_range buffers[MANIFEST_MAX_BUFFERS];
    struct manifest_array **children;
    struct manifest_array *dictionary;
};

struct manifest_batch {
    int64_t length;
    struct manifest_array **columns;    /* n_columns of them */
};

struct manifest_arena;

struct manifest {
    uint32_t n_columns;
    struct manifest_field **columns;
    const uint8_t *metadata;
    uint32_t metadata_len;
    uint32_t n_batches, cap_batches;
    struct manifest_batch *batches;
    struct manifest_arena *arena;       /* owns every node and string above */
};

/* manifest_new: an empty manifest (no columns, no batches) owning an arena; NULL on
 * ENOMEM. manifest_free accepts NULL and half-built manifests. */
struct manifest *manifest_new(void);
void manifest_free(struct manifest *m);
/* Memory owned by m's arena (zeroed), freed with m. NULL on ENOMEM. */
void *manifest_alloc(struct manifest *m, size_t size);
char *manifest_strndup(struct manifest *m, const char *s, size_t n);
/* manifest_add_batch: append an empty batch (columns array of n_columns NULLs). */
struct manifest_batch *manifest_add_batch(struct manifest *m, int64_t length);

/* manifest_encode: the msgpack bytes of m (malloc'd, the caller frees *ret). Every field
 * must have been parsed (type set) and every batch fully filled. -ENOMEM, -EINVAL. */
int manifest_encode(const struct manifest *m, uint8_t **ret, size_t *ret_len);

/* manifest_decode: check and decode len bytes. Returns 0 with *ret (free it with
 * manifest_free), or -EBADMSG with a message in err (MANIFEST_ERR_MAX bytes), or -ENOMEM.
 * A decoded manifest is well-formed but not yet checked against any buffer. */
int manifest_decode(const uint8_t *buf, size_t len, struct manifest **ret, char *err);

/* Envelopes (proto/METADATA.md, kind "unit"). envelope_inline wraps manifest bytes,
 * envelope_at points into the buffer; both malloc *ret. */
int manifest_envelope_inline(const uint8_t *manifest, size_t len, uint8_t **ret, size_t *ret_len);
int manifest_envelope_at(uint64_t off, uint64_t len, uint8_t **ret, size_t *ret_len);
/* manifest_envelope_decode: the unit envelope in meta. Returns 0 with either *ret (an
 * inline manifest, decoded) or *ret == NULL and [*ret_at_off, +*ret_at_len) (the
 * manifest is inside the buffer: decode it with manifest_decode). -EBADMSG with err when
 * meta is not a unit envelope of a known version, or its manifest is malformed. */
int manifest_envelope_decode(const uint8_t *meta, size_t len, struct manifest **ret,
                             uint64_t *ret_at_off, uint64_t *ret_at_len, char *err);

/* manifest_validate: check every batch of m against the bytes it describes, base[0..len)
 * (the published part of the buffer): buffer ranges inside and aligned, buffer sizes for
 * each array's offset + length, offsets buffers (first >= 0, monotonic, last within the
 * data or the child), child lengths (struct, list, fixed-size list, map), dictionary
 * indices (each non-null one < the dictionary's length), validity bitmaps, null counts.
 * Returns 0, or -EBADMSG with err naming the array ("batch 0 col3.child0") and the field. */
int manifest_validate(const struct manifest *m, const uint8_t *base, size_t len, char *err);

/* manifest_metadata_check: whether len bytes are well-formed Arrow binary metadata. */
bool manifest_metadata_check(const uint8_t *p, size_t len);

#endif
