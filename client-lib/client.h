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

/* An acquired daemon handle shared by several local handles of one connection (a
 * re-acquire of a buffer this connection holds: no round trip). The daemon's release is
 * sent when the last of them goes. Atomic: a pinned one may be released on any thread
 * after shmref_close. */
struct client_share {
    atomic_uint refs;
};

struct shmref_buf {
    shmref_conn *conn;
    uint64_t handle, buf_id;
    void *data;
    size_t size, capacity;
    uint8_t token[PROTO_TOKEN_LEN]; /* the descriptor's (a lease: the one it is published under) */
    bool writable, published;
    bool pinned;            /* held by a unit's exports: outlives shmref_close */
    bool sealed;                /* an acquired sealed buffer, its seals checked */
    bool foreign;               /* acquired: the producer is another uid (or the daemon cannot say) */
    struct client_share *share; /* an acquired handle shared locally, else NULL */
    void *meta;
    size_t meta_len;
    shmref_buf *prev, *next;
};

/* One request the daemon has not answered yet (pending.c), or a completion not yet
 * delivered. Whoever owns it decides what its result becomes. */
enum pending_owner {
    PENDING_WAIT,   /* a blocking call waits for it */
    PENDING_USER,   /* a submit: its completion goes to shmref_complete */
    PENDING_STOCK,  /* a stock refill (stock.c) */
    PENDING_DROP,   /* nobody wants it any more: a lease or handle it brings is released */
};

struct pending {
    struct pending *next;
    uint32_t id;            /* 0 while parked (waiting to be sent again) */
    uint32_t op;            /* PROTO_OP_* of the request */
    uint8_t owner;          /* enum pending_owner */
    bool done;              /* a PENDING_WAIT's result is in */
    bool retried;           /* sent again once after EDQUOT/ENOSPC */
    bool parked;            /* waits for the stock's refills before it is sent again */
    bool require_sealed;    /* acquire: SHMREF_ACQUIRE_SEALED */
    bool refill;            /* sent by the stock (counted in stock.out until answered) */
    int result;             /* 0 or -errno, once done */
    char *errmsg;           /* the message of a failure (malloc'd), once done */
    void *user;
    uint64_t size;          /* lease: the size asked of the daemon */
    size_t want;            /* lease: the caller's size (the handle's) */
    uint32_t wait_ms;
    unsigned n;             /* lease_many: leases asked */
    uint64_t *sizes;        /* lease_many: their sizes (malloc'd) */
    shmref_desc desc;       /* acquire: the descriptor; publish: the result */
    shmref_buf *buf;        /* lease, acquire: the handle made; publish: the buffer */
    shmref_buf **bufs;      /* lease_many: the handles made */
    shmref_status *status;
};

/* A message that could not be sent at once (the socket was full): sent in order later. */
struct client_out {
    struct client_out *next;
    size_t len;
    uint8_t data[];
};

/* CLIENT_WIRE_BATCH: lease_many, release_many and multi-lease refills as single
 * lease_many / release_many messages (protocol 2). */
#ifndef CLIENT_WIRE_BATCH
#define CLIENT_WIRE_BATCH 1
#endif

#define STOCK_CLASSES 4
#define STOCK_MAX_DEPTH 16
#define STOCK_MAX_SIZE (16u << 20)

/* A size class of the lease stock: leases of `capacity` bytes (what the daemon returned
 * for requests of lo..capacity bytes) ready for the next lease of that size. */
struct stock_class {
    uint64_t capacity, lo;
    shmref_buf *ready[STOCK_MAX_DEPTH];
    unsigned n_ready, inflight;
    uint64_t last_use;
    bool used;
};

struct stock {
    unsigned depth;         /* leases kept ready per class; 0: no stock */
    unsigned out;           /* refill requests not answered yet (dropped ones too) */
    uint64_t tick;
    struct stock_class cls[STOCK_CLASSES];
};

struct client_counters {
    uint64_t waits, round_trips, sent, received, stock_hits, stock_misses, local_acquires;
};

struct shmref_conn {
    int fd;                 /* non-blocking: every wait is a poll bounded by the deadline */
    pid_t pid;              /* the process that connected: a forked child must not use fd */
    int timeout_ms;         /* 0: no limit */
    int acquire_wait_ms;    /* an acquire waits this long for a publish */
    bool acquire_wait_set;  /* set by shmref_set_acquire_wait: not derived from timeout_ms */
    const char *abandoned;  /* the operation that timed out: the connection is unusable */
    int failed;             /* -errno: the connection broke (its message in fail_msg) */
    char fail_msg[PROTO_MAX_ERRMSG + 1];
    uint32_t next_id;
    pid_t daemon_pid;
    uint64_t features, max_lease;
    struct mapcache cache;
    shmref_buf *bufs;
    atomic_uint pins;       /* pinned buffers (client_pin) */
    atomic_bool closed;     /* shmref_close was called while pins were held */
    struct pending *out, *out_tail; /* outstanding requests, in the order sent */
    unsigned n_out;
    struct pending *done, *done_tail;   /* completions of submits, not yet delivered */
    struct pending *delivered;          /* delivered by the last shmref_complete */
    struct client_out *q, *q_tail;      /* messages not sent yet, in order */
    struct stock stock;
    struct client_counters counters;
    char errmsg[PROTO_MAX_ERRMSG + 1];
    char late[PROTO_MAX_ERRMSG + 1];    /* an error reply to a one-way request, for the next call */
    char lost_msg[192];     /* the EMFILE message a lost fd's reply becomes */
    uint8_t wbuf[PROTO_MAX_REQUEST];
    uint8_t rbuf[PROTO_MAX_REPLY];
};

/* ---- transport (client.c) ---- */

/* client_send: assign req->id and send it without blocking; a message the socket cannot
 * take now is queued, in order, and sent by the next flush. 0 or -errno (-EMSGSIZE, or
 * the connection is broken: then its message is set). */
int client_send(shmref_conn *conn, struct proto_msg *req);
/* client_flush: send queued messages while the socket takes them: 0 all sent, 1 some
 * remain, -errno. */
int client_flush(shmref_conn *conn);
/* client_flush_wait: flush, waiting for the socket up to ms (0: no limit): at close. */
int client_flush_wait(shmref_conn *conn, int ms);
/* client_recv: the next message if one has arrived (never blocks): 1 with *rep and its
 * fds (*ret_nfds of them, at most PROTO_MAX_BATCH; each the caller's), 0 if none yet,
 * -errno if the connection broke. *ret_lost: the fds did not fit (MSG_CTRUNC). */
int client_recv(shmref_conn *conn, struct proto_msg *rep, int *fds, unsigned *ret_nfds, bool *ret_lost);
/* client_forget: tell the daemon (with PROTO_FEAT_FD_ONCE) that this process no longer
 * has buffer buf_id mapped (writable or not), so the next lease or acquire of it comes
 * with an fd. No reply. */
void client_forget(shmref_conn *conn, uint64_t buf_id, bool writable);
/* client_release_handle: a one-way release of a daemon handle (errmsg kept). */
void client_release_handle(shmref_conn *conn, uint64_t handle);
/* client_mono_ms: CLOCK_MONOTONIC in milliseconds. */
int64_t client_mono_ms(void);

/* client_usable: 0, or -ECHILD (a forked child) / -ENOTCONN (abandoned after a timeout)
 * / the error that broke the connection, with the message set. */
int client_usable(shmref_conn *conn);
/* client_enter: the start of every public call on conn: usable, then take in whatever
 * replies have arrived (no blocking), errmsg cleared (or set to a late error). */
int client_enter(shmref_conn *conn);

/* CLIENT_ACQUIRE_WAIT_MS: an acquire waits at most this long for a publish by default
 * (less when the connection's timeout is shorter). */
#define CLIENT_ACQUIRE_WAIT_MS 2000
int client_acquire_wait_default(int timeout_ms);
/* client_teardown: unmap, close and free everything of conn (nothing is sent). */
void client_teardown(shmref_conn *conn);

/* ---- outstanding requests (pending.c) ---- */

/* pending_new: a request record (calloc'd) for op; NULL on ENOMEM (message set). */
struct pending *pending_new(shmref_conn *conn, uint32_t op, uint8_t owner);
/* pending_free: a record and what it still owns (a handle made for nobody is released). */
void pending_free(shmref_conn *conn, struct pending *p);
/* pending_submit: build p's request, send it (or queue it) and list p as outstanding.
 * On failure p is not listed (the caller frees it). */
int pending_submit(shmref_conn *conn, struct pending *p);
/* pending_submit_msg: pending_submit with the request already built (hello). */
int pending_submit_msg(shmref_conn *conn, struct pending *p, struct proto_msg *req);
/* pending_orphan_all: every outstanding request becomes PENDING_DROP, every undelivered
 * completion is dropped (its handle released, its status freed): at shmref_close. */
void pending_orphan_all(shmref_conn *conn);
/* pending_drain: at close, after pending_orphan_all: wait (at most ms) for the answers
 * the daemon has made or will make without waiting, so the leases they bring are released
 * before the socket closes. Waits the daemon holds (a lease for quota, an acquire for a
 * publish) end with the connection. */
void pending_drain(shmref_conn *conn, int ms);
/* pending_discard: free every record without sending anything (teardown). */
void pending_discard(shmref_conn *conn);
/* pending_intake: take in every reply that has arrived, without blocking (no syscall when
 * nothing is outstanding), after flushing queued messages. 0, or -errno: the connection
 * broke (every outstanding request then fails with it). */
int pending_intake(shmref_conn *conn);
/* pending_wait: block until p (a PENDING_WAIT listed by pending_submit) is answered,
 * at most ms (0: no limit), handling every other reply meanwhile. Returns p's result,
 * its message in conn->errmsg. Past ms the connection is abandoned (-ETIMEDOUT). */
int pending_wait(shmref_conn *conn, struct pending *p, int ms);
/* pending_budget: the connection's timeout plus extra ms (0: no limit). */
int pending_budget(const shmref_conn *conn, uint32_t extra_ms);
/* pending_fail_all: the connection broke: every outstanding request fails with err. */
void pending_fail_all(shmref_conn *conn, int err, const char *msg);
/* pending_complete: p is finished: a PENDING_USER goes to the completion queue, a
 * PENDING_WAIT is marked done, the others are handled (stock) or freed. */
void pending_complete(shmref_conn *conn, struct pending *p);
/* pending_resend_parked: send requests parked for the stock's refills, once none is out. */
void pending_resend_parked(shmref_conn *conn);

/* ---- buffers (lease.c) ---- */

/* lease_take: turn a lease or acquire reply's fields and fd into a handle (linked into
 * the connection). On failure the daemon's handle is released and the fd closed. */
int lease_take(shmref_conn *conn, uint64_t handle, uint64_t buf_id, uint64_t size, uint64_t capacity,
               const uint8_t *token, const uint8_t *meta, uint32_t meta_len, uint32_t flags, int fd,
               bool writable, bool require_sealed, shmref_buf **ret_buf);
/* lease_forget: a handle's local half (list, mapping use, memory). Returns the daemon
 * handle to release, or 0 when another local handle still shares it. */
uint64_t lease_forget(shmref_buf *buf);
/* lease_drop: lease_forget, then a one-way release of the daemon handle if it was the
 * last local one (nothing is sent in a forked child or on a broken connection). */
void lease_drop(shmref_buf *buf);

/* lease_publish_check: whether buf may be published (len, flags): 0 or -errno. */
int lease_publish_check(shmref_buf *buf, size_t len, unsigned flags);
/* lease_publish_send: send the publish. A plain one is one-way: *ret_desc is written and
 * p is left alone. A sealed one is listed as p (p->buf = buf), its reply awaited. */
int lease_publish_send(shmref_buf *buf, size_t len, uint32_t keep_ms, uint32_t max_acquires, unsigned flags,
                       const void *meta, size_t meta_len, struct pending *p, shmref_desc *ret_desc);
/* lease_share: a new local handle sharing the daemon handle of a live acquired handle of
 * desc on conn (no round trip), or NULL. */
shmref_buf *lease_share(shmref_conn *conn, const shmref_desc *desc, unsigned flags);

/* ---- the lease stock (stock.c) ---- */

void stock_init(struct stock *st);
/* stock_take: a ready lease for size bytes (its size set to size), sending one refill:
 * 1 with *ret_buf, 0 (none ready: *ret_wait, if not NULL, gets a refill in flight for
 * that class, which the caller may take over), or -errno. */
int stock_take(shmref_conn *conn, size_t size, shmref_buf **ret_buf, struct pending **ret_wait);
/* stock_learn: a foreground lease of size bytes came back with capacity: record the
 * class and send refills up to depth. */
void stock_learn(shmref_conn *conn, size_t size, uint64_t capacity);
/* stock_arrived: a refill's reply (p is freed by the caller). */
void stock_arrived(shmref_conn *conn, struct pending *p);
/* stock_return: release every ready lease and drop refills in flight (they are released
 * when they arrive). Returns how many were released or dropped. */
unsigned stock_return(shmref_conn *conn);
/* stock_reset: the connection broke: nothing is in flight any more. */
void stock_reset(shmref_conn *conn);
/* stock_inflight: refills not answered yet (for any class, dropped ones too). */
unsigned stock_inflight(const shmref_conn *conn);
/* stock_eligible: whether a lease of size uses the stock. */
bool stock_eligible(const shmref_conn *conn, size_t size);

/* ---- status (status.c) ---- */

/* status_from_reply: a status object from a reply's body (copied). -EPROTO/-ENOMEM. */
int status_from_reply(shmref_conn *conn, const struct proto_msg *rep, shmref_status **ret);

/* client_pin / client_unpin: a buffer whose mapping and daemon-side reference must
 * outlive shmref_close (an acquired unit whose Arrow exports are still alive). While a
 * connection has pinned buffers, shmref_close releases every other handle and keeps the
 * socket and the mappings; client_unpin then releases the buffer (on an open connection:
 * shmref_release; after shmref_close: a one-way release encoded on the stack, so it may
 * run on any thread), and the unpin of the last pinned buffer of a closed connection
 * closes its socket, unmaps everything and frees it. */
void client_pin(shmref_buf *buf);
void client_unpin(shmref_buf *buf);

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
