/* SPDX-License-Identifier: MIT */
/* client.h: libshmref's private internals. Not installed.
 * A connection does blocking request/reply calls over SOCK_SEQPACKET; replies carrying
 * a buffer bring its fd with SCM_RIGHTS. Mappings of pool buffers are cached per
 * connection, keyed by the daemon's buffer id, and reused when the daemon hands the
 * same buffer out again, so a recycled buffer is mapped once. */
#ifndef SHMREF_CLIENT_H
#define SHMREF_CLIENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"
#include "shmref/shmref.h"

struct mapcache_entry {
    uint64_t buf_id;
    void *addr;
    size_t len;
    bool writable;
    unsigned users;         /* live handles using this mapping */
    uint64_t last_use;
};

struct mapcache {
    /* called for every mapping the cache unmaps while the connection lives */
    void (*on_unmap)(void *ctx, uint64_t buf_id, bool writable);
    void *ctx;
    struct mapcache_entry *v;
    unsigned n, cap;
    uint64_t tick;
    uint64_t idle_bytes, max_idle_bytes;
    unsigned max_idle;
    bool fixed;             /* set by $SHMREF_MAP_CACHE: not adjusted */
};

struct shmref_buf {
    shmref_conn *conn;
    uint64_t handle, buf_id;
    void *data;
    size_t size, capacity;
    bool writable, published;
    bool pinned;            /* held by a unit's exports: outlives shmref_close */
    bool sealed;                /* an acquired sealed buffer, its seals checked */
    void *meta;
    size_t meta_len;
    shmref_buf *prev, *next;
};

struct shmref_conn {
    int fd;                 /* non-blocking: every wait is a poll bounded by the deadline */
    pid_t pid;              /* the process that connected: a forked child must not use fd */
    int timeout_ms;         /* 0: no limit */
    int64_t deadline_ms;    /* of the exchange in progress (CLOCK_MONOTONIC), -1: none */
    const char *op;         /* its name, for the timeout message */
    const char *abandoned;  /* the operation that timed out: the connection is unusable */
    uint32_t next_id;
    pid_t daemon_pid;
    uint64_t features, max_lease;
    struct mapcache cache;
    shmref_buf *bufs;
    atomic_uint pins;       /* pinned buffers (client_pin) */
    atomic_bool closed;     /* shmref_close was called while pins were held */
    char errmsg[PROTO_MAX_ERRMSG + 1];
    bool fd_lost;           /* the last message's fd did not fit (MSG_CTRUNC) */
    char lost_msg[192];     /* the EMFILE message a lost fd's reply becomes */
    uint8_t wbuf[PROTO_MAX_REQUEST];
    uint8_t rbuf[PROTO_MAX_REPLY];
};

/* client_call: send req (id assigned here) and wait for its reply. A reply that carries
 * an fd returns it in *ret_fd (if ret_fd is NULL, or none was expected, it is closed).
 * An error reply becomes -code with its message in conn->errmsg. rep's pointers point
 * into conn->rbuf until the next call. */
int client_call(shmref_conn *conn, struct proto_msg *req, struct proto_msg *rep, int *ret_fd);

/* client_send / client_recv: the two halves of a call, for pipelining. send assigns
 * req->id. recv returns the next message (its fd, or -1, in *ret_fd), or -errno; a
 * daemon's error about the whole connection (id 0) is returned as -code. */
int client_send(shmref_conn *conn, struct proto_msg *req);
int client_recv(shmref_conn *conn, struct proto_msg *rep, int *ret_fd);
/* client_forget: tell the daemon (with PROTO_FEAT_FD_ONCE) that this process no longer
 * has buffer buf_id mapped (writable or not), so the next lease or acquire of it comes
 * with an fd. No reply. */
void client_forget(shmref_conn *conn, uint64_t buf_id, bool writable);

/* client_usable: 0, or -ECHILD (a forked child) / -ENOTCONN (abandoned after a timeout)
 * with the message set. Checked before every send and receive. */
int client_usable(shmref_conn *conn);

/* client_pin / client_unpin: a buffer whose mapping and daemon-side reference must
 * outlive shmref_close (an acquired unit whose Arrow exports are still alive). While a
 * connection has pinned buffers, shmref_close releases every other handle and keeps the
 * socket and the mappings; client_unpin then releases the buffer (on an open connection:
 * shmref_release; after shmref_close: a one-way release encoded on the stack, so it may
 * run on any thread), and the unpin of the last pinned buffer of a closed connection
 * closes its socket, unmaps everything and frees it. */
void client_pin(shmref_buf *buf);
void client_unpin(shmref_buf *buf);

/* client_reply_error: an error reply as -code, with its message in conn->errmsg. */
int client_reply_error(shmref_conn *conn, const struct proto_msg *rep);

/* client_fail: set conn->errmsg and return err (negative). */
int client_fail(shmref_conn *conn, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void mapcache_init(struct mapcache *mc);
/* mapcache_get: a mapping of buffer buf_id (len bytes) from fd, shared with earlier
 * handles if one exists (a writable one also serves read-only requests). Returns 0 with
 * *ret_addr, or -errno from mmap. fd stays the caller's. */
int mapcache_get(struct mapcache *mc, uint64_t buf_id, int fd, size_t len, bool writable,
                 void **ret_addr);
/* mapcache_fit: raise the idle bound to twice the daemon's largest lease (unless the
 * environment fixed it). */
void mapcache_fit(struct mapcache *mc, uint64_t max_lease);
/* mapcache_find: the live mapping for buf_id usable as asked, without an fd, or NULL. */
void *mapcache_find(struct mapcache *mc, uint64_t buf_id, size_t len, bool writable);
/* mapcache_put: a handle stopped using addr. Idle mappings stay mapped, up to a byte
 * and count bound ($SHMREF_MAP_CACHE bytes; default the larger of 1 GiB and twice the
 * daemon's largest lease), least recently used first out. */
void mapcache_put(struct mapcache *mc, void *addr);
/* mapcache_drop_idle: unmap every idle mapping (telling on_unmap); returns how many. */
unsigned mapcache_drop_idle(struct mapcache *mc);
/* mapcache_drop: unmap the mapping at addr, whoever uses it (telling on_unmap): for a
 * buffer whose writable mapping must be gone before it is sealed. */
void mapcache_drop(struct mapcache *mc, void *addr);
/* mapcache_clear: unmap everything (the connection closes). */
void mapcache_clear(struct mapcache *mc);

#endif
