/* SPDX-License-Identifier: MIT */
/* shmref.h: libshmref, the client library of shmrefd. The only public header.
 *
 * A producer leases a buffer, writes into its mapping, and publishes it; publishing
 * returns a descriptor (a 128-bit capability token and a size) that it hands to its
 * consumers over any channel. A consumer acquires the descriptor and gets a read-only
 * mapping of the same bytes. Every lease is released explicitly or when the connection
 * closes (or the process dies); the daemon recycles the buffer once no one holds it.
 *
 * Conventions: functions that can fail return an int, >= 0 on success and -errno on
 * failure; on failure no output parameter is written. Refusals from the daemon map to
 * -EDQUOT (quota), -ENOSPC (pool full), -ENOENT (unknown or expired descriptor),
 * -EACCES (refused by policy), -EPROTO (protocol violation) and others; the daemon's
 * message is then in shmref_errmsg(). A connection is not thread-safe: use one per
 * thread, or serialise calls. Compiles as C99 and C++. */
#ifndef SHMREF_SHMREF_H
#define SHMREF_SHMREF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SHMREF_EXPORT __attribute__((visibility("default")))
#else
#define SHMREF_EXPORT
#endif

#define SHMREF_VERSION_MAJOR 0
#define SHMREF_VERSION_MINOR 1
#define SHMREF_VERSION_PATCH 0

typedef struct shmref_conn shmref_conn;
typedef struct shmref_buf shmref_buf;
typedef struct shmref_status shmref_status;

/* A descriptor: a plain value, safe to copy. Its text form starts with "shmref1:". */
#define SHMREF_TOKEN_LEN 16
#define SHMREF_DESC_TEXT_MAX 64   /* bytes of the text form, with its NUL */
#define SHMREF_DESC_BINARY_MAX 32 /* bytes of the binary (msgpack) form */
#define SHMREF_META_MAX 16384     /* bytes of metadata a publish may attach */

typedef struct shmref_desc {
    uint8_t token[SHMREF_TOKEN_LEN];
    uint64_t size;
} shmref_desc;

/* shmref_connect: connect to shmrefd and say hello. path NULL means the default:
 * $SHMREFD_SOCKET, else $XDG_RUNTIME_DIR/shmrefd.sock, else /run/shmrefd/shmrefd.sock.
 * On success *ret_conn is owned by the caller: free it with shmref_close(). On failure
 * nothing is returned: -ENOENT / -ECONNREFUSED (no daemon), -EACCES (the socket's mode,
 * or the daemon's allow-users/allow-groups), -EUSERS, -EPROTONOSUPPORT; the reason, with
 * the socket's path and the daemon's own message when it sent one, is then
 * shmref_errmsg(NULL) (per thread, until the thread's next shmref_connect).
 * Trust: the daemon's peer credentials (SO_PEERCRED) must name uid 0, this process's uid
 * (a private daemon) or the daemon user: shmref_set_daemon_uid, else $SHMREF_DAEMON_UID,
 * else the user named by $SHMREF_DAEMON_USER, else the packaged daemon's user "shmrefd";
 * any other is refused with -EPERM naming the uids. */
SHMREF_EXPORT int shmref_connect(const char *path, shmref_conn **ret_conn);

/* shmref_set_daemon_uid: the uid of the daemon user this process trusts besides root and
 * itself, for every later connect (process-wide; -1 goes back to the environment). */
SHMREF_EXPORT int shmref_set_daemon_uid(long uid);

/* shmref_close: releases every handle still held (one-way messages, no round trip),
 * says bye, then closes the connection, so the daemon counts a clean close
 * (clients_closed), not a client that died holding leases (clients_died), even with the
 * stock's refills still on their way. Never blocks on the daemon: no reply or ping is
 * waited for (releases the socket cannot take at once, and leases still on their way,
 * end with the connection on the daemon's side); only a one-way publish still queued is
 * flushed, for at most the connection's timeout (2 s without one). In a
 * forked child it touches nothing of the parent's connection: see "Lifetimes" in
 * shmref(3).
 * Buffers obtained from it must not be used afterwards (their mappings are unmapped);
 * their handles are freed. In a forked child, the handles it inherited are not freed:
 * each stays valid (and readable) until its own shmref_release, which frees the child's
 * copy, and the last one frees what is left of the connection. Accepts NULL. Exception: while Arrow structures exported from
 * an acquired unit (shmref_unit_export_*) are alive, the connection's socket and those
 * units' mappings stay open (every other handle is released now); the release callback
 * of the last of them releases the unit's buffer, closes the socket and frees the rest. */
SHMREF_EXPORT void shmref_close(shmref_conn *conn);

/* shmref_errmsg: the message of the last failed call on conn (the daemon's words for a
 * refusal, the library's otherwise), "" if none. Owned by conn, valid until its next call.
 * With conn NULL: why this thread's last shmref_connect failed ("" if it did not). */
SHMREF_EXPORT const char *shmref_errmsg(const shmref_conn *conn);

/* shmref_ping: one round trip. */
SHMREF_EXPORT int shmref_ping(shmref_conn *conn);

/* shmref_daemon_pid: the daemon's pid, as it said in hello. */
SHMREF_EXPORT int shmref_daemon_pid(const shmref_conn *conn);

/* shmref_conn_socket: the socket conn is connected to, copied into buf (cap bytes,
 * NUL-terminated): the path given at connect, or, with none given, the one that answered
 * (the system's default socket, or the uid's private daemon's). Its length, or -ERANGE
 * (cap too small), -EINVAL. */
SHMREF_EXPORT int shmref_conn_socket(const shmref_conn *conn, char *buf, size_t cap);

/* shmref_lease: a writable buffer of at least size bytes (size > 0). The daemon charges
 * the tenant's quota for the buffer's size class. *ret_buf is owned by the caller until
 * shmref_release() or shmref_close(). */
SHMREF_EXPORT int shmref_lease(shmref_conn *conn, size_t size, shmref_buf **ret_buf);

/* shmref_publish: makes the first len bytes of a leased buffer readable by anyone who
 * gets the descriptor. keep_ms > 0 asks the daemon to keep the buffer alive that long
 * with no holder, so the producer may release or exit before its consumers acquire; the
 * retention serves every consumer that comes within that time (shmref_publish_ex's
 * max_acquires ends it earlier). meta (up to SHMREF_META_MAX bytes, may be NULL)
 * is returned to every consumer: dtype, shape, a manifest. The producer keeps its lease
 * and must not write after publishing. A buffer is published at most once (-EALREADY).
 * It does not wait for the daemon: the descriptor is the lease's token and len (see
 * "One round trip per handoff" below); a refusal of it (not expected: the library checks what the daemon
 * would) is reported by shmref_errmsg after the next call. */
SHMREF_EXPORT int shmref_publish(shmref_buf *buf, size_t len, uint32_t keep_ms,
                                 const void *meta, size_t meta_len, shmref_desc *ret_desc);

/* shmref_acquire: a read-only view of a published buffer. -ENOENT when the descriptor
 * is unknown, released by everyone, or its retention ran out (a buffer leased but not yet
 * published is waited for: shmref_set_acquire_wait); -EINVAL when the size in
 * the descriptor does not match. *ret_buf is owned by the caller until shmref_release(). */
SHMREF_EXPORT int shmref_acquire(shmref_conn *conn, const shmref_desc *desc, shmref_buf **ret_buf);

/* shmref_release: drops this holder's reference and frees the handle, which must not be
 * used again, whatever the result. It does not wait for the daemon (no round trip): the
 * daemon handles a connection's requests in order, so anything this connection asks
 * next sees the release done (another connection may see it a moment later: a round
 * trip on this one, e.g. shmref_ping, makes sure it is done). The library may keep the mapping cached for the next
 * lease of the same buffer; the memory may still be readable, but reading it is a bug.
 * Accepts NULL (returns 0). */
SHMREF_EXPORT int shmref_release(shmref_buf *buf);

/* shmref_lease_many: n leases (sizes[i] > 0 bytes each) in lease_many messages of up to
 * 32 each, all sent before the first answer is awaited (not from the stock). On success ret_bufs[0..n) are the caller's; on
 * failure every lease already made is released, ret_bufs is all NULL, and the first
 * error is returned (its message in shmref_errmsg). */
SHMREF_EXPORT int shmref_lease_many(shmref_conn *conn, const size_t *sizes, size_t n, shmref_buf **ret_bufs);

/* shmref_release_many: shmref_release on each of bufs[0..n) (NULLs are skipped), which
 * are set to NULL, as one-way release_many messages of up to 32 handles. Returns the first
 * error, or 0. */
SHMREF_EXPORT int shmref_release_many(shmref_buf **bufs, size_t n);

/* Accessors of a buffer handle. data is writable for a lease, read-only for an acquire.
 * size: the usable size (the leased size, or the published size for an acquire);
 * capacity: the bytes behind the mapping (the size class). */
SHMREF_EXPORT void *shmref_buf_data(const shmref_buf *buf);
SHMREF_EXPORT size_t shmref_buf_size(const shmref_buf *buf);
SHMREF_EXPORT size_t shmref_buf_capacity(const shmref_buf *buf);
SHMREF_EXPORT int shmref_buf_writable(const shmref_buf *buf);
/* The metadata the producer attached (NULL and 0 if none). Owned by buf. */
SHMREF_EXPORT const void *shmref_buf_meta(const shmref_buf *buf, size_t *ret_len);

/* Descriptor forms. to_text writes a NUL-terminated string of fewer than
 * SHMREF_DESC_TEXT_MAX bytes and returns its length (-ENOBUFS if cap is too small);
 * from_text accepts the string with surrounding whitespace (-EINVAL otherwise).
 * to_binary returns the length written (-EMSGSIZE); from_binary returns 0 or -EINVAL. */
SHMREF_EXPORT int shmref_desc_to_text(const shmref_desc *desc, char *buf, size_t cap);
SHMREF_EXPORT int shmref_desc_from_text(const char *text, shmref_desc *ret_desc);
SHMREF_EXPORT int shmref_desc_to_binary(const shmref_desc *desc, void *buf, size_t cap);
SHMREF_EXPORT int shmref_desc_from_binary(const void *buf, size_t len, shmref_desc *ret_desc);

/* shmref_status_get: a snapshot of the daemon's state. *ret_status is owned by the
 * caller: free it with shmref_status_free() (accepts NULL). The snapshot is a tree of
 * maps and arrays addressed by dotted paths: "pool.bytes_total", "clients.0.pid",
 * "pool.classes.2.size". The keys are documented in the README. */
SHMREF_EXPORT int shmref_status_get(shmref_conn *conn, shmref_status **ret_status);
SHMREF_EXPORT void shmref_status_free(shmref_status *status);
/* The snapshot as one JSON object (NUL-terminated, owned by status). NULL on ENOMEM. */
SHMREF_EXPORT const char *shmref_status_json(shmref_status *status);
/* An unsigned integer at path: 0, -ENOENT (no such path), -EINVAL (not an integer). */
SHMREF_EXPORT int shmref_status_u64(const shmref_status *status, const char *path, uint64_t *ret);
/* A string at path, NUL-terminated, owned by status: 0, -ENOENT or -EINVAL. */
SHMREF_EXPORT int shmref_status_str(const shmref_status *status, const char *path, const char **ret);
/* The number of elements of the array (or pairs of the map) at path, or -ENOENT/-EINVAL. */
SHMREF_EXPORT int shmref_status_count(const shmref_status *status, const char *path);

/* ---- Timeouts, fork detection and the array metadata convention ---- */

/* Every call that waits for the daemon is bounded by the connection's timeout: past it
 * the call returns -ETIMEDOUT, its message naming the operation and the milliseconds,
 * and the connection is abandoned (the reply may still come: later calls return
 * -ENOTCONN; connect again). The default is $SHMREF_TIMEOUT_MS if it is a number of
 * milliseconds (0: no limit), else SHMREF_TIMEOUT_DEFAULT_MS. A connection belongs to
 * the process that opened it: in a forked child nothing is ever sent on, released or
 * unmapped from the parent's connection; the child's first call adopts it (inherited
 * handles stay readable in the child, their release frees the child's copies only) and
 * the child gets its own connection to the same socket when it first needs the daemon
 * (shmref_conn_pid() then names the child). */
#define SHMREF_TIMEOUT_DEFAULT_MS 30000

/* shmref_connect_timeout: shmref_connect with a timeout (-1: the default above, 0: no
 * limit, else milliseconds) for the connect, the hello and every later call, and, when
 * errbuf is not NULL, the reason for a failure in errbuf (errcap bytes, NUL-terminated),
 * naming the socket path: "cannot connect to shmrefd at /run/x.sock: No such file or
 * directory (is shmrefd running?)". A daemon that does not answer fails with -ETIMEDOUT
 * after timeout_ms. */
SHMREF_EXPORT int shmref_connect_timeout(const char *path, int timeout_ms, char *errbuf, size_t errcap,
                                         shmref_conn **ret_conn);
/* shmref_set_timeout: the timeout of later calls (-1: the default, 0: none, else ms). */
SHMREF_EXPORT int shmref_set_timeout(shmref_conn *conn, int timeout_ms);
/* shmref_get_timeout: the timeout in force in milliseconds (0: none), or -EINVAL. */
SHMREF_EXPORT int shmref_get_timeout(const shmref_conn *conn);
/* shmref_conn_pid: the pid of the process that opened conn, or -EINVAL. */
SHMREF_EXPORT int shmref_conn_pid(const shmref_conn *conn);

/* The metadata convention of proto/METADATA.md, kind "array": one n-dimensional array
 * described by a numpy type string, a shape, an order and an offset, with an optional
 * user value. Shared by C, Python and Arrow. */
#define SHMREF_META_MAX_DIMS 32
#define SHMREF_META_DTYPE_MAX 32 /* bytes of the type string, with its NUL */
#define SHMREF_META_USER_NONE 0
#define SHMREF_META_USER_BIN 1     /* user: the payload of a msgpack bin */
#define SHMREF_META_USER_MSGPACK 2 /* user: one whole msgpack object (any type but ext) */

typedef struct shmref_meta_array {
    char dtype[SHMREF_META_DTYPE_MAX]; /* "<f8", "|u1", "<M8[ns]": NUL-terminated */
    uint32_t ndim;                     /* 0 for a 0-d array */
    uint64_t shape[SHMREF_META_MAX_DIMS];
    char order;                        /* 'C' or 'F' */
    uint64_t offset;                   /* bytes from the start of the buffer */
    uint32_t user_kind;                /* SHMREF_META_USER_* */
    const void *user;                  /* after decode: points into the decoded bytes */
    size_t user_len;
} shmref_meta_array;

/* shmref_meta_array_encode: m as metadata bytes into buf (cap bytes; SHMREF_META_MAX
 * always suffices for a user value that fits). Returns the length, -EINVAL (a field
 * out of range; *ret_why, if not NULL, names it) or -EMSGSIZE. */
SHMREF_EXPORT int shmref_meta_array_encode(const shmref_meta_array *m, void *buf, size_t cap,
                                           const char **ret_why);
/* shmref_meta_array_decode: metadata bytes as kind "array". 0 with *ret filled (its
 * user points into buf); -ENOMSG: the bytes are opaque (not this convention, or another
 * kind); -EBADMSG: malformed, or a later version. *ret_why (if not NULL) gets a static
 * reason naming the field. The range is not checked against any buffer: see below. */
SHMREF_EXPORT int shmref_meta_array_decode(const void *buf, size_t len, shmref_meta_array *ret,
                                           const char **ret_why);
/* shmref_meta_array_nbytes: offset + itemsize * prod(shape), or -EINVAL / -EOVERFLOW. */
SHMREF_EXPORT int shmref_meta_array_nbytes(const shmref_meta_array *m, uint64_t *ret);
/* shmref_meta_array_itemsize: the item size a type string names, or -EINVAL. */
SHMREF_EXPORT int shmref_meta_array_itemsize(const char *dtype);
/* shmref_buf_meta_array: decode buf's metadata and check that the array lies within
 * shmref_buf_size(buf): 0, -ENOMSG (no metadata, or opaque), -EBADMSG (malformed, or
 * the array would reach past the published bytes); the reason is in shmref_errmsg(). */
SHMREF_EXPORT int shmref_buf_meta_array(const shmref_buf *buf, shmref_meta_array *ret);

/* ---- Units of work and the Arrow C Data Interface ----
 *
 * A unit of work is one buffer holding many Arrow arrays (columns of one or more record
 * batches with one schema), each array's buffers at 64-byte aligned offsets of the
 * buffer, described by a manifest (proto/manifest.h, proto/METADATA.md) that travels in
 * the metadata, or inside the buffer when it exceeds SHMREF_META_MAX. No Arrow library
 * is needed: the ABI structs of the Arrow C Data and C Stream Interfaces are declared
 * here, under the specification's own guard macros.
 *
 * Producer: shmref_unit_begin (one lease), shmref_unit_claim ranges and write them,
 * describe the arrays (shmref_unit_add_buffers, or shmref_unit_add_array with
 * ArrowArray structures whose buffers point into the claimed ranges: referenced in
 * place, anything else is copied in), shmref_unit_next_batch for a stream, then
 * shmref_unit_publish once. Or shmref_unit_import_array / _import_stream: any Arrow
 * data copied once into one lease sized for it, with the manifest built.
 * Consumer: shmref_unit_acquire checks the whole manifest against the buffer (every
 * range, offsets, child length and dictionary index; -EBADMSG naming the array and the
 * field otherwise), then shmref_unit_export_* give zero-copy Arrow structures whose
 * buffers point into the read-only mapping. Each exported structure holds a reference;
 * the unit's buffer goes back to the daemon when the unit handle and the last exported
 * structure are released, in any order, also after shmref_close (see there).
 * Release callbacks of exported structures may run on any thread once the connection
 * is closed; while it is open they send a release on it, so they must not run
 * concurrently with another call on that connection. */

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

struct ArrowSchema {
    /* Array type description */
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;

    /* Release callback */
    void (*release)(struct ArrowSchema *);
    /* Opaque producer-specific data */
    void *private_data;
};

struct ArrowArray {
    /* Array data description */
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;

    /* Release callback */
    void (*release)(struct ArrowArray *);
    /* Opaque producer-specific data */
    void *private_data;
};

#endif /* ARROW_C_DATA_INTERFACE */

#ifndef ARROW_C_STREAM_INTERFACE
#define ARROW_C_STREAM_INTERFACE

struct ArrowArrayStream {
    /* Callbacks providing stream functionality */
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *out);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *out);
    const char *(*get_last_error)(struct ArrowArrayStream *);

    /* Release callback */
    void (*release)(struct ArrowArrayStream *);

    /* Opaque producer-specific data */
    void *private_data;
};

#endif /* ARROW_C_STREAM_INTERFACE */

typedef struct shmref_unit shmref_unit;

#define SHMREF_UNIT_ALIGN 64 /* every claimed range starts at a multiple of this offset */

/* shmref_unit_begin: a producer's unit of work over one lease of size bytes. Leave room
 * for the manifest when it will not fit in SHMREF_META_MAX (about 100 bytes per array):
 * publish then stores it inside the buffer. *ret_unit is the caller's until
 * shmref_unit_release; it must not outlive conn. */
SHMREF_EXPORT int shmref_unit_begin(shmref_conn *conn, size_t size, shmref_unit **ret_unit);

/* shmref_unit_claim: the next len bytes of the unit, at an offset that is a multiple of
 * SHMREF_UNIT_ALIGN: *ret_offset (from the buffer's start) and *ret_ptr (in the
 * producer's mapping; either may be NULL). -ENOSPC when the lease is full. */
SHMREF_EXPORT int shmref_unit_claim(shmref_unit *unit, size_t len, uint64_t *ret_offset, void **ret_ptr);

/* shmref_unit_add_buffers: describe one column without children or dictionary (any
 * primitive, bool, binary/utf8 and large forms, fixed-size binary, decimals, dates,
 * times, timestamps, durations) of the current batch, from n_buffers claimed ranges
 * given as offsets and lengths (validity first; offset and length 0 for no validity
 * bitmap). n_buffers must be what the format has in the C Data Interface. */
SHMREF_EXPORT int shmref_unit_add_buffers(shmref_unit *unit, const char *name, const char *format,
                                          int64_t flags, int64_t length, int64_t null_count,
                                          int n_buffers, const uint64_t *offsets, const uint64_t *lengths);

/* shmref_unit_add_array: describe one column of the current batch by its C Data Interface
 * structures (any type above, nested and dictionary-encoded too; schema->name names the
 * column). Buffers that lie in claimed ranges of this unit, 64-byte aligned, are
 * referenced in place (zero-copy); the others are copied into new claims. The caller
 * keeps ownership of both structures (they are not released). */
SHMREF_EXPORT int shmref_unit_add_array(shmref_unit *unit, const struct ArrowSchema *schema,
                                        const struct ArrowArray *array);

/* shmref_unit_add_batch: a record batch (a struct array, "+s", without nulls) as the
 * columns of the current batch (of a new batch when the current one has columns). */
SHMREF_EXPORT int shmref_unit_add_batch(shmref_unit *unit, const struct ArrowSchema *schema,
                                        const struct ArrowArray *array);

/* shmref_unit_next_batch: start the next record batch of a stream. Every batch must have
 * the columns of the first (same names and formats, in order): -EINVAL otherwise. */
SHMREF_EXPORT int shmref_unit_next_batch(shmref_unit *unit);

/* shmref_unit_publish: build the manifest and publish the unit (see shmref_publish for
 * keep_ms). Once. The unit keeps its lease until shmref_unit_release. */
SHMREF_EXPORT int shmref_unit_publish(shmref_unit *unit, uint32_t keep_ms, shmref_desc *ret_desc);

/* shmref_unit_import_array / shmref_unit_import_stream: any Arrow data, copied once into
 * one lease sized for it (slices, i.e. non-zero offsets, are copied as the slice only),
 * with the manifest built: a struct array ("+s", a record batch) gives its children as
 * columns, any other array one column. A stream is read to its end (every batch one
 * batch of the unit). The caller keeps ownership of what it passes (and releases it).
 * The result is an unpublished producer unit: shmref_unit_publish it. -ENOTSUP for
 * unions, run-end encoded and view types. */
SHMREF_EXPORT int shmref_unit_import_array(shmref_conn *conn, const struct ArrowSchema *schema,
                                           const struct ArrowArray *array, shmref_unit **ret_unit);
SHMREF_EXPORT int shmref_unit_import_stream(shmref_conn *conn, struct ArrowArrayStream *stream,
                                            shmref_unit **ret_unit);

/* shmref_unit_acquire: acquire a published unit and check its manifest against the
 * buffer. -EBADMSG (message in shmref_errmsg, naming the array and the field) for a
 * manifest that is malformed or does not fit the buffer; -EPERM for another uid's unit
 * that is not sealed (see shmref_unit_acquire_ex); other errors as shmref_acquire. */
SHMREF_EXPORT int shmref_unit_acquire(shmref_conn *conn, const shmref_desc *desc, shmref_unit **ret_unit);

/* Accessors. n_batches, n_columns: counts (or -EINVAL); column_index: the first column
 * of that name, or -ENOENT; column_name: owned by the unit (NULL if out of range);
 * batch_length: rows of a batch (-EINVAL out of range); data, size: the buffer (the
 * producer's writable mapping, or the consumer's read-only one) and its usable bytes. */
SHMREF_EXPORT int shmref_unit_n_batches(const shmref_unit *unit);
SHMREF_EXPORT int shmref_unit_n_columns(const shmref_unit *unit);
SHMREF_EXPORT int shmref_unit_column_index(const shmref_unit *unit, const char *name);
SHMREF_EXPORT const char *shmref_unit_column_name(const shmref_unit *unit, int column);
SHMREF_EXPORT int64_t shmref_unit_batch_length(const shmref_unit *unit, int batch);
SHMREF_EXPORT const void *shmref_unit_data(const shmref_unit *unit);
SHMREF_EXPORT size_t shmref_unit_size(const shmref_unit *unit);

/* shmref_unit_export_array: column `column` of batch `batch` of an acquired unit, as C
 * Data Interface structures (either output may be NULL). shmref_unit_export_batch: the
 * whole batch as a struct array ("+s") whose children are the columns.
 * shmref_unit_export_stream: every batch in order. The outputs belong to the caller,
 * who calls their release callbacks (Arrow's rules: children may be moved out); arrays
 * and streams keep the buffer mapped and held until released, schemas hold nothing. */
SHMREF_EXPORT int shmref_unit_export_array(shmref_unit *unit, int batch, int column,
                                           struct ArrowSchema *ret_schema, struct ArrowArray *ret_array);
SHMREF_EXPORT int shmref_unit_export_batch(shmref_unit *unit, int batch,
                                           struct ArrowSchema *ret_schema, struct ArrowArray *ret_array);
SHMREF_EXPORT int shmref_unit_export_stream(shmref_unit *unit, struct ArrowArrayStream *ret_stream);

/* shmref_unit_release: drop the unit handle (a producer's lease, a consumer's reference;
 * exported structures keep theirs). Accepts NULL. */
SHMREF_EXPORT int shmref_unit_release(shmref_unit *unit);

/* ---- sealed publish, fan-out ------------------------------------------------------ */

/* Flags of shmref_publish_ex. */
#define SHMREF_PUBLISH_SEALED 1u   /* seal the buffer against writing (memfd pools only) */
/* Flags of shmref_acquire_ex. */
#define SHMREF_ACQUIRE_SEALED 1u   /* accept only a sealed buffer */
/* A private acquire: the buffer is this process's to write, at no copy until it does. The
 * bytes read are the producer's; writes go to private pages of this process only
 * (copy-on-write: a page is copied at its first write), never to the buffer, which the
 * producer and every other consumer keep seeing unchanged. shmref_buf_data returns that
 * mapping (writable); it lives until the handle's release, is never shared with another
 * acquire of the same buffer, and always asks the daemon (no table hold). -EOPNOTSUPP:
 * the daemon does not know private acquires. (4u: 2u is SHMREF_ACQUIRE_TRUST_PRODUCER's,
 * a flag of shmref_unit_acquire_ex.) */
#define SHMREF_ACQUIRE_PRIVATE 4u

/* shmref_publish_ex: shmref_publish with a cap on acquires and flags. keep_ms retains
 * the buffer for every consumer that comes within that time; max_acquires > 0 ends the
 * retention early once that many acquires were made (1: until the first consumer). With
 * SHMREF_PUBLISH_SEALED the library unmaps the producer's writable mapping first
 * (shmref_buf_data(buf) is NULL from then on, also if the publish fails), and the daemon
 * adds F_SEAL_WRITE to the memfd: nobody, not the producer, not root, can change the
 * bytes any more; consumers check the seals before they map it. A sealed buffer is
 * published once and never recycled. -EOPNOTSUPP: the daemon's pool is not memfd
 * (shmrefd --memfd), or the daemon is too old; -EBUSY: another process still maps the
 * buffer writable (a cached mapping of an earlier lease of it). */
SHMREF_EXPORT int shmref_publish_ex(shmref_buf *buf, size_t len, uint32_t keep_ms, uint32_t max_acquires,
                                    unsigned flags, const void *meta, size_t meta_len,
                                    shmref_desc *ret_desc);

/* shmref_retain: the published buffer desc names, which conn holds (an acquire or a lease
 * of it not yet released), gets one more acquire of retention: it stays alive, even after
 * every holder is gone (a process that exits right after handing desc on), until one more
 * acquire than those made so far (by anyone; with a retention already, one more than it
 * waited for) or keep_ms from now, whichever comes first (a retention it had keeps the
 * later deadline). Charged to the buffer's uid as any retention (a lease of that uid that
 * would fail for quota ends it first). One round trip: the retention is in place when it
 * returns, so hand desc on after it. -EPERM: the buffer is another uid's, or conn does not
 * hold it; -ENOENT: nothing is published under desc; -EOPNOTSUPP: the daemon does not know
 * retain requests (an older shmrefd); -EINVAL: desc NULL or keep_ms 0. conn stays usable
 * after any of them. */
SHMREF_EXPORT int shmref_retain(shmref_conn *conn, const shmref_desc *desc, uint32_t keep_ms);

/* shmref_acquire_ex: shmref_acquire with flags. Whenever the daemon says a buffer is
 * sealed, the library checks F_GET_SEALS (F_SEAL_WRITE, F_SEAL_SHRINK and F_SEAL_GROW)
 * on its fd before mapping it and refuses it otherwise (-EPERM); SHMREF_ACQUIRE_SEALED
 * also refuses a buffer that is not sealed (-EPERM), for a consumer that must not trust
 * its producer. */
SHMREF_EXPORT int shmref_acquire_ex(shmref_conn *conn, const shmref_desc *desc, unsigned flags,
                                    shmref_buf **ret_buf);

/* shmref_buf_sealed: 1 if buf is a sealed buffer (its seals were checked), else 0. */
SHMREF_EXPORT int shmref_buf_sealed(const shmref_buf *buf);

/* shmref_buf_private: 1 if buf was acquired with SHMREF_ACQUIRE_PRIVATE (its data is a
 * private copy-on-write mapping, writable by this process only), else 0. */
SHMREF_EXPORT int shmref_buf_private(const shmref_buf *buf);

/* ---- Units across tenants: sealed units ----
 *
 * A unit's manifest is checked once, at acquire. A producer that keeps write access can
 * change the bytes afterwards (rewrite an offsets buffer, and the consumer's Arrow reader
 * reads outside the mapping), so a unit that crosses uids must be sealed: published with
 * SHMREF_PUBLISH_SEALED on a memfd pool (shmrefd --memfd), after which nobody, its
 * producer and root included, can write it. shmref_unit_acquire and _acquire_ex refuse
 * another uid's unsealed unit (-EPERM, the message says why and what to do) unless the
 * consumer passes SHMREF_ACQUIRE_TRUST_PRODUCER; a unit of the caller's own uid is never
 * refused for being unsealed (its producer could change the consumer's memory anyway).
 * The daemon says in each acquire reply whether the producer is another uid; a daemon
 * too old to say is treated as saying so. */

/* Flag of shmref_unit_acquire_ex: accept another uid's unsealed unit, trusting that its
 * producer does not change the bytes while the unit is in use. */
#define SHMREF_ACQUIRE_TRUST_PRODUCER 2u

/* shmref_unit_publish_ex: shmref_unit_publish with max_acquires (see shmref_publish_ex)
 * and flags: SHMREF_PUBLISH_SEALED seals the unit as shmref_publish_ex does a buffer:
 * the producer's writable mapping is unmapped first (shmref_unit_data is NULL from then
 * on, also if the publish fails; the unit can then only be released). -EOPNOTSUPP when
 * the pool is not memfd, -EBUSY when the buffer is still mapped writable elsewhere (a
 * forked child's copy of the mapping, an earlier lease's cached mapping). */
SHMREF_EXPORT int shmref_unit_publish_ex(shmref_unit *unit, uint32_t keep_ms, uint32_t max_acquires,
                                         unsigned flags, shmref_desc *ret_desc);

/* shmref_unit_acquire_ex: shmref_unit_acquire with flags: SHMREF_ACQUIRE_SEALED (refuse
 * a unit that is not sealed, -EPERM, whoever published it), SHMREF_ACQUIRE_TRUST_PRODUCER
 * (accept another uid's unsealed unit). With 0 it is shmref_unit_acquire. A sealed unit's
 * seals are checked on its fd before it is mapped. */
SHMREF_EXPORT int shmref_unit_acquire_ex(shmref_conn *conn, const shmref_desc *desc, unsigned flags,
                                         shmref_unit **ret_unit);

/* shmref_unit_sealed: 1 if the unit is sealed (a consumer's: its seals were checked; a
 * producer's: published sealed), 0 if not, -EINVAL for NULL. */
SHMREF_EXPORT int shmref_unit_sealed(const shmref_unit *unit);

/* ---- One round trip per handoff and the event-loop API ---- */

/* What waits for the daemon. Between processes of one uid, a steady-state zero-copy
 * handoff sends the daemon nothing: the lease, the plain publish, the acquire and both
 * releases are taken in the uid's table (below). Otherwise a plain shmref_publish is
 * one-way (the descriptor is known from the lease); shmref_release is one-way; a lease is
 * served from the connection's stock (below) when it has no table; so any other handoff
 * (another uid's buffer, the first handoff of each buffer) waits once: the consumer's
 * acquire. Every call first takes in, without blocking, whatever replies have already
 * arrived; a request the socket cannot take at once is queued in memory, in order, and
 * sent by the next call (or shmref_flush). */

/* Same-tenant handoffs without the daemon (the table). When the daemon offers it at
 * connect, each connection maps its uid's table and a journal of its own (two sealed
 * files the daemon owns; what it refuses leaves the connection working without them,
 * counter "table_refused" 1). Then, with no message to the daemon:
 * - shmref_lease and shmref_lease_ex take a free buffer of the size's class from the table
 *   ("table_leases"); the table holds the buffers this uid leased before and released, and
 *   when it has none of the class the lease asks the daemon, and that buffer joins the
 *   table when it is released. A buffer this process has never mapped costs one round trip
 *   for its fd ("table_maps"), once;
 * - shmref_publish of such a lease with keep_ms 0 and metadata up to 248 bytes is made in
 *   the table ("table_publishes"); with a retention, max_acquires or longer metadata the
 *   lease is first handed to the daemon (a round trip, "table_adopts") and published there
 *   as before; a sealed publish copies the bytes into a lease of the daemon's first;
 * - shmref_acquire (and shmref_acquire_ex without flags) of a descriptor published in the
 *   table whose buffer this process maps takes a hold in it ("table_acquires"); anything
 *   else asks the daemon ("table_fallbacks"): another uid's buffer, a buffer not mapped
 *   here yet, a sealed or private acquire;
 * - shmref_release of those gives the hold back in the table.
 * Buffers in the table stay charged to the uid (status pool.bytes_tables) until the uid's
 * last connection closes, or its own lease needs the quota, or the pool is full. A
 * connection's holds end with it (closed or killed); the daemon never recycles a buffer
 * a live connection holds. Another uid's acquire of a buffer in the table takes it out for
 * good (it is retired after its last release). shmref_lease_many, units and the submit
 * calls always ask the daemon. A forked child unmaps its parent's table: inherited holds
 * stay readable and are never given back by the child, whose own connection gets its own
 * journal. $SHMREF_TABLE=0 turns the table off for a process's connections (every lease
 * and acquire asks the daemon, leases from the stock). */

/* The lease stock (a connection without a table). After the first lease of a size (a round trip), the library asks for
 * `depth` more leases of that size class in the background and keeps them ready; a later
 * lease of the class (shmref_lease, shmref_lease_ex, shmref_lease_submit) takes one at
 * once and asks for one more. The asks go with the connection's next message (one system
 * call), or before the next wait, shmref_flush or shmref_complete (shmref_conn_events says
 * SHMREF_WANT_WRITE meanwhile); their replies are read when the stock runs dry. Only sizes up to 16 MiB, at most 4 size classes per
 * connection (the least recently used one is returned). Stock leases are leases like any
 * other: charged to the tenant's quota and counted in status ("buffers.leases",
 * "pool.bytes_leased" include them); they are returned at shmref_close, when a lease or
 * acquire meets EDQUOT or ENOSPC (then the request is retried once), and when their class
 * falls out. depth: $SHMREF_STOCK (0 disables), default 2, at most 16. */
/* shmref_set_stock: the stock depth of conn (-1: the default above; 0 returns the stock). */
SHMREF_EXPORT int shmref_set_stock(shmref_conn *conn, int depth);

/* shmref_set_limits: the bounds of conn's client memory. max_requests: requests
 * outstanding (submitted, not answered: $SHMREF_MAX_REQUESTS, default 65536);
 * max_queue_bytes: bytes queued while the socket takes nothing ($SHMREF_MAX_QUEUE, units
 * allowed, default 8 MiB). -1: the default. Past either bound a request (a submit, a
 * blocking call, a one-way publish) is refused at once with -ENOBUFS and both numbers in
 * shmref_errmsg; one-way releases always pass (there are no more of them than handles). */
SHMREF_EXPORT int shmref_set_limits(shmref_conn *conn, long max_requests, long max_queue_bytes);

/* shmref_set_acquire_wait: how long an acquire of a descriptor whose buffer is leased but
 * not yet published waits for its publish (the producer's one-way publish may reach the
 * daemon after the consumer's acquire): -ENOENT after it, or at once if the producer
 * releases or dies first. -1: the default, min(connection timeout, 2000 ms); 0: no wait;
 * at most 60000. The acquire's own deadline is the connection's timeout plus this. */
SHMREF_EXPORT int shmref_set_acquire_wait(shmref_conn *conn, int wait_ms);

/* Re-acquire without a round trip: an acquire of a descriptor this connection already
 * holds through an acquired handle not yet released gets a new handle sharing that one's
 * daemon reference and mapping (the daemon's release is sent when the last of them goes).
 * While any of them lives the daemon holds the buffer, so it cannot be recycled. Such an
 * acquire does not count toward the publish's max_acquires. */

/* shmref_lease_ex: shmref_lease that may wait up to wait_ms (0: not at all; at most
 * 600000) for quota or pool space instead of failing with -EDQUOT/-ENOSPC at once: a
 * producer that outruns its consumer slows to its pace. -ETIMEDOUT with the daemon's
 * message (held, asked, quota) when the wait runs out; the call's deadline is the
 * connection's timeout plus wait_ms. flags: 0. The stock is tried first. While conn keeps
 * ready stock leases or idle mappings the lease is first asked without its wait: refused,
 * they are given back (an idle mapping of a buffer the daemon retired for the quota pins
 * its pages, and only this process can unmap it) and it is asked again with the wait. */
SHMREF_EXPORT int shmref_lease_ex(shmref_conn *conn, size_t size, unsigned flags, uint32_t wait_ms,
                                  shmref_buf **ret_buf);

/* shmref_set_lease_wait: how long the leases of conn that name no wait of their own wait
 * for quota or pool space, as shmref_lease_ex's wait_ms: shmref_lease and a unit's lease
 * (shmref_unit_begin, shmref_unit_import_array, shmref_unit_import_stream). 0 (the
 * default): not at all, -EDQUOT/-ENOSPC at once; at most 600000 (-EINVAL beyond). */
SHMREF_EXPORT int shmref_set_lease_wait(shmref_conn *conn, uint32_t wait_ms);

/* The event-loop API (the hiredis model). Poll shmref_conn_fd for what
 * shmref_conn_events asks; submit requests with the *_submit functions (they never
 * block, and return 0 once the request is queued or -errno with nothing queued); collect
 * their completions with shmref_complete whenever the fd is readable, or at once when
 * shmref_conn_events says SHMREF_READY (a stock lease, a plain publish and a local
 * re-acquire complete without the daemon). Every submit completes exactly once, in no
 * particular order; user is returned with it. Blocking calls may be mixed in: they take
 * in the replies of submits too, whose completions then wait for shmref_complete. The
 * library keeps no timers for submits: the daemon's bounds (a lease's wait_ms, an
 * acquire's wait) end them; a blocking call on the connection that times out abandons it
 * and every outstanding submit completes with -ETIMEDOUT; when the connection breaks they
 * complete with its error, after which shmref_complete returns that error. At
 * shmref_close, outstanding submits deliver no completion: leases and handles they bring
 * are released, completions not collected are dropped (their handles released). */
#define SHMREF_WANT_READ 1u  /* requests are outstanding: poll for readability */
#define SHMREF_WANT_WRITE 2u /* requests are queued unsent: poll for writability, then shmref_flush */
#define SHMREF_READY 4u      /* completions (or the connection's failure) wait for shmref_complete */

#define SHMREF_OP_LEASE 1
#define SHMREF_OP_PUBLISH 2
#define SHMREF_OP_ACQUIRE 3
#define SHMREF_OP_STATUS 4
#define SHMREF_OP_PING 5

typedef struct shmref_completion {
    void *user;             /* as submitted */
    int op;                 /* SHMREF_OP_* */
    int result;             /* 0 or -errno */
    const char *errmsg;     /* "" on success; valid until the next shmref_complete */
    shmref_buf *buf;        /* lease, acquire: the new handle, now the caller's; publish: the buffer */
    shmref_status *status;  /* status: the snapshot, the caller's (shmref_status_free) */
    shmref_desc desc;       /* publish: the descriptor; acquire: the one acquired */
} shmref_completion;

/* shmref_conn_fd: the socket to poll (owned by conn; never read or write it). In a forked
 * child the first call makes the child's own connection (as any call there does) and
 * returns its socket, never the parent's; -errno if that connection cannot be made. */
SHMREF_EXPORT int shmref_conn_fd(const shmref_conn *conn);
/* shmref_conn_events: SHMREF_WANT_READ | SHMREF_WANT_WRITE | SHMREF_READY, or -EINVAL. */
SHMREF_EXPORT int shmref_conn_events(const shmref_conn *conn);
/* shmref_flush: send queued requests without blocking: 0 all sent, 1 some remain, -errno. */
SHMREF_EXPORT int shmref_flush(shmref_conn *conn);
/* Submit forms of shmref_lease_ex, shmref_publish_ex, shmref_acquire_ex, shmref_status_get
 * and shmref_ping (same arguments, same results in the completion). A plain publish is
 * done when submitted (its completion comes with the next shmref_complete); a sealed one
 * completes with the daemon's reply. */
SHMREF_EXPORT int shmref_lease_submit(shmref_conn *conn, size_t size, unsigned flags, uint32_t wait_ms, void *user);
SHMREF_EXPORT int shmref_publish_submit(shmref_buf *buf, size_t len, uint32_t keep_ms, uint32_t max_acquires,
                                        unsigned flags, const void *meta, size_t meta_len, void *user);
SHMREF_EXPORT int shmref_acquire_submit(shmref_conn *conn, const shmref_desc *desc, unsigned flags, void *user);
SHMREF_EXPORT int shmref_status_submit(shmref_conn *conn, void *user);
SHMREF_EXPORT int shmref_ping_submit(shmref_conn *conn, void *user);
/* shmref_complete: read whatever replies have arrived (never blocks) and write up to max
 * completions into ret: returns how many (0: none yet), or -errno once the connection has
 * failed and every completion was delivered. */
SHMREF_EXPORT int shmref_complete(shmref_conn *conn, shmref_completion *ret, size_t max);

/* shmref_conn_counter: a counter of conn since it connected: "waits" (times the library
 * blocked waiting for a daemon reply), "round_trips" (blocking calls that needed a daemon
 * reply, whether it had arrived before they looked or not: one-way messages, stock
 * leases, local re-acquires and table steps are not round trips), "sent" and "received"
 * (messages), "stock_hits" and "stock_misses" (leases served from the stock, or not),
 * "local_acquires" (re-acquires without a round trip), "table_leases", "table_publishes",
 * "table_acquires" (taken in the uid's table, no message), "table_fallbacks" (acquires
 * the table could not take, asked of the daemon), "table_maps", "table_adopts",
 * "table_givebacks" (the table's round trips and one-way messages, above),
 * "table_refused" (1 when the table files the daemon sent at connect were refused: wrong
 * size or seals), "reconnects" (new connections made after the daemon closed this one
 * for idleness, below). 0, -ENOENT for an unknown name, -EINVAL.
 *
 * Idle connections: the daemon closes a connection that holds nothing (no lease, handle,
 * request or table hold) and has said nothing for its --idle-timeout (600 s by
 * default). The next call on it makes a new connection, to the same socket by the first
 * connect's rule (the default socket: the system's, else the private daemon), under the
 * same fd number, and sends the requests outstanding again (the daemon never read them):
 * it succeeds as if nothing had happened. An event loop that registered shmref_conn_fd
 * with epoll registers it again when "reconnects" changes. */
SHMREF_EXPORT int shmref_conn_counter(const shmref_conn *conn, const char *name, uint64_t *ret);

#ifdef __cplusplus
}
#endif

#endif
