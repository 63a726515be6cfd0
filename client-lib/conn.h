/* SPDX-License-Identifier: MIT */
/* conn.h: the types every module of libshmref shares (a connection, a handle, a request
 * record, the stock's classes). Types only: each module's functions are in its own
 * header. Not installed. */
#ifndef SHMREF_CONN_H
#define SHMREF_CONN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mapcache.h"
#include "proto.h"
#include "shmref/shmref.h"

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
    unsigned busy;          /* outstanding requests that refer to this handle */
    bool doomed;            /* released while busy: freed when the last such request ends */
    bool shareable;         /* listed in conn->by_token */
    bool private_map;       /* SHMREF_ACQUIRE_PRIVATE: data is its own MAP_PRIVATE mapping, not the cache's */
    bool inherited;         /* a forked child's copy of its parent's handle: never released */
    bool table;             /* a table hold (localhold.c): a lease or an acquire with no daemon
                             * handle, given back in the table */
    uint32_t slot, seq;     /* a table hold's slot, and the generation it holds */
    void *meta;
    size_t meta_len;
    shmref_buf *prev, *next;
};

/* One request the daemon has not answered yet (requests.c), or a completion not yet
 * delivered. Whoever owns it decides what its result becomes; the module that made it
 * gave it its handlers (ops): the table itself knows no request kinds. */
struct pending;
struct pending_ops {
    /* send: build the record's message and send it (pending_submit_msg), also when it is
     * sent again after a retry or a park. */
    int (*send)(shmref_conn *conn, struct pending *p);
    /* take: a reply of the request's own kind (op + PROTO_OP_REPLY), with its fds (the
     * handler's now), as p's result: 0, or -errno with conn->errmsg set. NULL: a reply
     * with nothing in it (its fds are closed). */
    int (*take)(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds,
                bool lost);
    /* refused: the daemon refused p with errno code: true when the handler sent p again
     * or parked it (then p is still outstanding). */
    bool (*refused)(shmref_conn *conn, struct pending *p, int code);
    /* answered: any answer to p arrived (before it is handled). */
    void (*answered)(shmref_conn *conn, struct pending *p);
    /* settled: after p's answer was handled (p may be gone; nothing of it is passed). */
    void (*settled)(shmref_conn *conn);
    /* finish: p completed and belongs to its module (PENDING_STOCK); freed after. */
    void (*finish)(shmref_conn *conn, struct pending *p);
    /* release: free what p owns (a handle made for nobody is released). */
    void (*release)(shmref_conn *conn, struct pending *p);
    /* unhold: p no longer refers to the handle it holds busy (p->holds); p->buf becomes
     * NULL when that handle was released meanwhile and is gone now. */
    void (*unhold)(struct pending *p);
    /* dispose: free the memory p's module keeps in it (a status reply), nothing else:
     * nothing is sent, no handle touched. Called for every record freed, after release,
     * also by pending_discard (which calls no other handler). */
    void (*dispose)(struct pending *p);
};

enum pending_owner {
    PENDING_WAIT,   /* a blocking call waits for it */
    PENDING_USER,   /* a submit: its completion goes to shmref_complete */
    PENDING_STOCK,  /* a stock refill (stock.c) */
    PENDING_DROP,   /* nobody wants it any more: a lease or handle it brings is released */
};

struct pending {
    struct pending *next, *prev;
    const struct pending_ops *ops; /* its module's handlers; NULL: a ping */
    uint32_t id;            /* 0 while parked (waiting to be sent again) */
    uint32_t op;            /* PROTO_OP_* of the request */
    uint8_t owner;          /* enum pending_owner */
    void *user;             /* the submitter's pointer, handed back with its completion */
    bool done;              /* a PENDING_WAIT's result is in */
    bool retried;           /* sent again once after EDQUOT/ENOSPC */
    bool parked;            /* waits for the stock's refills before it is sent again */
    bool require_sealed;    /* acquire: SHMREF_ACQUIRE_SEALED */
    bool private_map;       /* acquire: SHMREF_ACQUIRE_PRIVATE */
    bool refill;            /* sent by the stock (counted in stock.out until answered) */
    bool stock_sent;        /* sent with PROTO_LEASE_STOCK (the daemon bounds the stock) */
    bool stale_retried;     /* asked again once after a reply that raced our forget (-ESTALE) */
    bool wait_held;         /* a lease that may wait, sent without its wait (stock.c's wait_now) */
    bool holds;             /* buf is held busy by this request (handle_hold) */
    bool for_table;         /* lease: PROTO_LEASE_TABLE (the table's free list was empty) */
    int result;             /* 0 or -errno, once done */
    char *errmsg;           /* the message of a failure (malloc'd), once done */
    /* what the request's module keeps in it (the table never reads these) */
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
    uint32_t op;            /* PROTO_OP_* of the message */
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
    unsigned skip;          /* refills not asked for after the daemon refused one (EAGAIN) */
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
    uint64_t table_leases;      /* leases popped from the table (localhold.c): no daemon */
    uint64_t table_publishes;   /* publishes made in the table: no daemon */
    uint64_t table_acquires;    /* acquires taken in the table: no daemon */
    uint64_t table_fallbacks;   /* acquires the table could not take: asked of the daemon */
    uint64_t table_maps;        /* table leases of a buffer this process did not map (PROTO_OP_MAP) */
    uint64_t table_adopts;      /* table leases made the daemon's for its publish (PROTO_OP_ADOPT) */
    uint64_t table_givebacks;   /* last holds given back to the daemon (PROTO_OP_GIVEBACK) */
    uint64_t table_refused;     /* tables offered at hello and refused (bad size, seals, header) */
    uint64_t reconnects;        /* new connections after the daemon closed this one for idleness */
};

/* The uid's table and this connection's journal (proto/handoff.h), mapped at hello
 * (localhold.c): both NULL when the daemon did not agree PROTO_FEAT_TABLE or what it sent
 * was refused. */
struct localhold {
    void *tab;                  /* the uid's table, handoff_size(HANDOFF_MAX_SLOTS) bytes */
    _Atomic uint32_t *journal;  /* this connection's journal, a count per slot */
    uint8_t key[16];            /* this connection's token key (random, never shared) */
    uint64_t next;              /* tokens drawn under it */
};

struct shmref_conn {
    int fd;                 /* non-blocking: every wait is a poll bounded by the deadline */
    pid_t pid;              /* the process that connected: a forked child must not use fd */
    int timeout_ms;         /* 0: no limit */
    int acquire_wait_ms;    /* an acquire waits this long for a publish */
    bool acquire_wait_set;  /* set by shmref_set_acquire_wait: not derived from timeout_ms */
    uint32_t lease_wait_ms; /* shmref_lease's wait for quota or space (shmref_set_lease_wait) */
    const char *abandoned;  /* the operation that timed out: the connection is unusable */
    int failed;             /* -errno: the connection broke (its message in fail_msg) */
    char fail_msg[PROTO_MAX_ERRMSG + 1];
    uint32_t next_id;
    pid_t daemon_pid;
    uint32_t version;       /* the protocol version of the hello (session.c): PROTO_VERSION or _PREV */
    uint64_t features, max_lease;
    struct mapcache cache;
    shmref_buf *bufs;
    void *by_token;         /* tsearch root: acquired handles a re-acquire may share */
    char *path;             /* the socket path: a forked child connects to it again */
    bool closing;           /* shmref_close runs: a forked child does not connect again */
    bool idle_closed;       /* the daemon closed the connection for idleness (its id-0 ETIMEDOUT) */
    bool default_path;      /* path is the default socket resolved at connect: autostart applies */
    atomic_uint pins;       /* pinned buffers (client_pin) */
    atomic_bool closed;     /* shmref_close was called while pins were held */
    struct pending *out, *out_tail; /* outstanding requests, in the order sent */
    void *by_id;            /* tsearch root: the outstanding requests by id */
    unsigned n_out, n_parked;
    unsigned n_records;     /* request records alive: outstanding or completions not collected */
    size_t q_bytes;         /* bytes in q */
    unsigned max_requests;  /* bound of n_records (shmref_set_limits) */
    size_t max_queue_bytes; /* bound of the send queue for requests (one-way releases pass) */
    struct pending *done, *done_tail;   /* completions of submits, not yet delivered */
    struct pending *delivered;          /* delivered by the last shmref_complete */
    struct client_out *q, *q_tail;      /* messages not sent yet, in order */
    struct client_out *later, *later_tail; /* requests sent with the next message (client_send_later) */
    unsigned n_later;
    struct stock stock;
    struct client_counters counters;
    struct localhold lh;
    /* whether a request with this id is outstanding (requests.c): ids wrap at 2^32 */
    bool (*id_taken)(shmref_conn *conn, uint32_t id);
    /* the daemon closed the connection for idleness: a new one is made and the outstanding
     * requests are sent again on it when nothing is lost by it (session.c): 0, or -errno */
    int (*revive)(shmref_conn *conn);
    /* a reply that answers nothing outstanding: what it brings is given back (handle.c) */
    void (*on_stray)(shmref_conn *conn, const struct proto_msg *rep, int *fds, unsigned nfds, bool lost);
    char errmsg[PROTO_MAX_ERRMSG + 1];
    char late[PROTO_MAX_ERRMSG + 1];    /* an error reply to a one-way request, for the next call */
    char lost_msg[192];     /* the EMFILE message a lost fd's reply becomes */
    uint8_t wbuf[PROTO_MAX_REQUEST];
    uint8_t rbuf[PROTO_MAX_REPLY];
};

#endif
