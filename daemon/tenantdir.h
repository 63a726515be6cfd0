/* SPDX-License-Identifier: MIT */
/* tenantdir.h: the daemon's side of same-tenant handoffs (proto/ledger.h). Private to the
 * daemon; below session.c, above the registry. One directory memfd per uid that has a
 * ledger connection (made at its first, freed with its last), one ledger memfd per such
 * connection (mapped read-only here), and the buffers LENT: their last daemon reference
 * went while a ledger of their uid still counted a hold on them.
 *
 * What is trusted: nothing a client writes, except that a count in its own ledger keeps a
 * buffer of its own uid whose fd it was sent (and has not forgotten) from being recycled.
 * The daemon writes each directory entry's state and seq (ledger_mark, ledger_unmark)
 * and never reads a directory. */
#ifndef SHMREFD_TENANTDIR_H
#define SHMREFD_TENANTDIR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "counters.h"
#include "idset.h"
#include "pool.h"
#include "proto.h"
#include "registry.h"

struct tenantdir;

/* tenantdir_conn: one connection's ledger, inside its session. dir NULL: none. */
struct tenantdir_conn {
    struct tenantdir *dir;
    const _Atomic uint32_t *counts;    /* the ledger, mapped PROT_READ */
    const struct idset *known;         /* the session's fd-once set: buf_id << 1 | writable */
    struct tenantdir_conn *prev, *next;
};

struct tenantdir_stats {
    uint64_t dirs, ledgers;            /* now */
    uint64_t took, nudges, recycle_waits, ignored;
};

/* tenantdirs: every directory; owned by the server. */
struct tenantdirs {
    struct registry *reg;
    struct pool *pool;
    struct counters *counters;         /* acquires: a took counts as one */
    struct tenantdir *head;
    struct registry_buf **lent_at;     /* [LEDGER_SLOTS]: the LENT buffer in each slot, or NULL */
    struct tenantdir_stats st;
    bool failed_logged;
};

/* tenantdir_init: empty, and the registry's lender (registry_set_lender): from now on a
 * buffer whose last reference goes is checked against its uid's ledgers. */
void tenantdir_init(struct tenantdirs *t, struct registry *reg, struct pool *pool, struct counters *counters);
/* tenantdir_free: ends every LENT buffer, frees every directory (after every session). */
void tenantdir_free(struct tenantdirs *t);

/* tenantdir_join: a ledger for connection c of uid, whose fd-once set is known. On success
 * (0) ret_fds[0] is uid's directory (the module's own fd: send it, do not close it) and
 * ret_fds[1] this connection's ledger (the caller's: close it once sent); both sealed
 * against resizing. -ENOMEM, -EMFILE...: no ledger (logged once per daemon). */
int tenantdir_join(struct tenantdirs *t, uint32_t uid, const struct idset *known, struct tenantdir_conn *c,
                   int ret_fds[2]);
/* tenantdir_leave: c's ledger is read no more (its connection went): unmapped, and the
 * LENT buffers it may have held are checked again; the directory goes with its uid's last
 * ledger. Accepts a conn without a ledger. */
void tenantdir_leave(struct tenantdirs *t, struct tenantdir_conn *c);

/* tenantdir_took: PROTO_OP_TOOK: counts an acquire of buffer buf_id under token, if c has
 * a ledger and was sent buf_id's fd, and buf_id is the live, published buffer of c's uid
 * with that token; anything else is ignored (counted). */
void tenantdir_took(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id,
                    const uint8_t token[PROTO_TOKEN_LEN]);
/* tenantdir_nudge: PROTO_OP_NUDGE: if buf_id is a LENT buffer of c's uid, its ledgers are
 * read again (only that buffer's). */
void tenantdir_nudge(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id);
/* tenantdir_forgot: c forgot buf_id (its count for it is read no more): as a nudge. */
void tenantdir_forgot(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id);

/* tenantdir_holds: whether c's ledger counts a hold on a buffer of its uid that it maps
 * (such a connection is not idle: closing it would drop holds a process still uses). */
bool tenantdir_holds(const struct tenantdirs *t, const struct tenantdir_conn *c);

/* tenantdir_holds_buf: whether c's ledger counts a hold on b that keeps it (b of c's uid,
 * whose fd c was sent and has not forgotten): what the daemon trusts of a ledger, as at
 * b's end (a LENT b is kept by such counts). */
bool tenantdir_holds_buf(const struct tenantdirs *t, const struct tenantdir_conn *c, const struct registry_buf *b);

/* tenantdir_lent: buffers LENT now. */
uint64_t tenantdir_lent(const struct tenantdirs *t);

#endif
