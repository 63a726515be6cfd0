/* SPDX-License-Identifier: MIT */
/* tenantdir.h: the daemon's side of same-tenant handoffs: each uid's table (proto/handoff.h,
 * the argument in docs/architecture.md, "Same-tenant handoffs: the table"). Private to the
 * daemon; below session.c, the registry's lender. One table memfd per uid that has a
 * table connection (made at its first, taken back whole with its last), one journal memfd
 * per such connection (mapped read-only here).
 *
 * A buffer joins its uid's table at the end of its daemon life if it was leased for the
 * table (PROTO_LEASE_TABLE: a client's local lease found its class's free list empty):
 * granted (FREE, on its class's list), still charged to its uid, LENT in the registry.
 * From then on the table's word counts every hold of it; while the daemon has references
 * (handles of acquires through the daemon, an adopted lease, a retention) they are one
 * hold there, given back when the last of them goes.
 *
 * What is trusted: nothing a client writes, except that a journal's count for a buffer of
 * its own uid's table is that connection's holds (read when it ends). The daemon reads the
 * table only by the slots of its own members, below HANDOFF_MAX_SLOTS, and every step it
 * makes on a word or a list is bounded (HANDOFF_TRIES). */
#ifndef SHMREFD_TENANTDIR_H
#define SHMREFD_TENANTDIR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "counters.h"
#include "pool.h"
#include "proto.h"
#include "registry.h"

struct tenantdir;

/* tenantdir_conn: one connection's journal, inside its session. dir NULL: none. */
struct tenantdir_conn {
    struct tenantdir *dir;
    _Atomic uint32_t *journal;         /* mapped read-write: CLOSED, and counts taken over */
    uint32_t hint;                     /* slot + 1 of the member tenantdir_holds last found held */
    struct tenantdir_conn *prev, *next;
};

struct tenantdir_stats {
    uint64_t tables, journals;         /* now */
    uint64_t grants;                   /* buffers that joined a table */
    uint64_t takes;                    /* daemon acquires of a publish made in a table */
    uint64_t maps, adopts, givebacks;  /* requests served */
    uint64_t reclaimed;                /* free buffers taken back (quota or pool space) */
    uint64_t crash_holds;              /* holds dropped from the journals of ended connections */
    uint64_t repaired;                 /* free members found off their lists after a kill */
    uint64_t ignored;                  /* requests that named nothing of theirs */
    uint64_t idle_visits;              /* members walked by idle checks (tenantdir_holds) */
};

/* tenantdirs: every table; owned by the server. */
struct tenantdirs {
    struct registry *reg;
    struct pool *pool;
    struct counters *counters;
    struct tenantdir *head;
    struct registry_buf **at;          /* [HANDOFF_MAX_SLOTS]: the table member in each slot */
    uint64_t nat;                      /* at[]'s entries that are not NULL */
    struct tenantdir_stats st;
    bool failed_logged;
    bool drift_logged;
};

/* tenantdir_init: empty, and the registry's lender (registry_set_lender). */
void tenantdir_init(struct tenantdirs *t, struct registry *reg, struct pool *pool, struct counters *counters);
/* tenantdir_free: ends every member, frees every table (after every session). */
void tenantdir_free(struct tenantdirs *t);

/* tenantdir_join: a journal for connection c of uid. On success (0) ret_fds[0] is uid's
 * table (the module's own fd: send it, do not close it) and ret_fds[1] this connection's
 * journal (the caller's: close it once sent); both sealed against resizing. -ENOMEM,
 * -EMFILE...: none (logged once per daemon). */
int tenantdir_join(struct tenantdirs *t, uint32_t uid, struct tenantdir_conn *c, int ret_fds[2]);
/* tenantdir_leave: c ended: the holds its journal counts are dropped from the words (at
 * most what each word counts), then its journal is unmapped; the whole table is taken
 * back with its uid's last journal. Accepts a conn without one. */
void tenantdir_leave(struct tenantdirs *t, struct tenantdir_conn *c);

/* tenantdir_repair: c ended without saying bye (killed): members its process may have
 * left FREE and on no free list (killed inside a push) are taken back (OUT, ended to the
 * pool: a live process of the uid inside a push of one of them finds OUT and gives it to
 * the daemon, which ignores it). Holds a kill left counted in a word stay until the uid's
 * last connection ends (a stopped process is not told from a dead one). O(members). */
void tenantdir_repair(struct tenantdirs *t, struct tenantdir_conn *c);
/* tenantdir_member: the member of c's uid's table with buffer id buf_id, or NULL (O(1)). */
struct registry_buf *tenantdir_member(const struct tenantdirs *t, const struct tenantdir_conn *c, uint64_t buf_id);
/* tenantdir_giveback: PROTO_OP_GIVEBACK: buf_id's last local hold went and it is OUT: if
 * the word says so (count 0, FREE, OUT, unlinked) and the daemon holds nothing of it, it
 * leaves the table and ends. Anything else is ignored (counted). */
void tenantdir_giveback(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id);
/* tenantdir_adopt: PROTO_OP_ADOPT: c's local lease of member buf_id (LEASED under seq) gets
 * a hold of the daemon's and becomes a writing buffer under a fresh token, to be held at
 * once by the caller (a handle of c). 0 and *ret, or -ESTALE (not c's uid's member, not
 * that lease, or the daemon already holds it), -ENOMEM, -EAGAIN. */
int tenantdir_adopt(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t buf_id, uint32_t seq,
                    struct registry_buf **ret);

/* tenantdir_holds: whether c's journal counts a hold on a member of its table (such a
 * connection is not idle: closing it would drop holds a process still uses). The member
 * its last answer found held is looked at first (O(1) while the process keeps holding
 * it), then the uid's members (O(members)); *visits grows by the members walked, so that
 * the caller can bound one sweep's work. Asked only before closing c for idleness: false
 * leaves the journal CLOSED (a hold its client takes from here is given back by the
 * client, which then asks the daemon). */
bool tenantdir_holds(struct tenantdirs *t, struct tenantdir_conn *c, uint64_t *visits);
/* tenantdir_holds_buf: whether c's journal counts a hold on member b of its uid. */
bool tenantdir_holds_buf(const struct tenantdirs *t, const struct tenantdir_conn *c, const struct registry_buf *b);

/* tenantdir_members: buffers in tables now (live or LENT). */
uint64_t tenantdir_members(const struct tenantdirs *t);

/* tenantdir_check: the daemon's three records of one fact, which buffers are in which
 * table, agree: each uid's members list, the slot index at[] and the registry's flags
 * (every member has registry_buf.table set, its uid's tenant, at[its slot] == itself, and
 * at[] holds nothing else), and the LENT members are the registry's count of LENT buffers.
 * O(members). A disagreement is a bug: test builds (SHMREF_LEDGER_CHECK) abort, others log
 * it once. (The table's words, which the uid may scribble on, are not read.) */
void tenantdir_check(struct tenantdirs *t);

#endif
