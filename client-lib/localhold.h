/* SPDX-License-Identifier: MIT */
/* localhold.h: libshmref's half of same-tenant handoffs without the daemon (the ledger,
 * proto/ledger.h): the tenant directory and this connection's ledger mapped at hello, a
 * plain publish recorded in the directory, an acquire of a descriptor whose buffer this
 * connection already maps read-only taken locally (a "ledger hold": no daemon handle),
 * and its release given back. Above the mapping cache and transport, below handles. */
#ifndef SHMREF_LOCALHOLD_H
#define SHMREF_LOCALHOLD_H

#include "conn.h"

/* localhold_wanted: whether this process asks for PROTO_FEAT_LEDGER ($SHMREF_LEDGER=0: no). */
bool localhold_wanted(void);
/* localhold_setup: the hello reply agreed PROTO_FEAT_LEDGER and brought fds[0] (the
 * directory) and fds[1] (this connection's ledger): checked (size, seals, header) and
 * mapped. Anything wrong: the connection works without the local path
 * (counters.ledger_refused). The fds stay the caller's. */
void localhold_setup(shmref_conn *conn, const int *fds, unsigned nfds);
/* localhold_unmap: the directory and ledger unmapped (teardown, or a forked child's
 * copies of its parent's: never touched by the child). */
void localhold_unmap(shmref_conn *conn);
/* localhold_publish: a plain publish of buf (len bytes, meta) is recorded in the
 * directory before the publish is sent, when the local path is on and it fits. */
void localhold_publish(shmref_buf *buf, size_t len, const void *meta, size_t meta_len);
/* localhold_acquire: an acquire of desc taken without the daemon: 0 with *ret_buf (a
 * ledger hold, its TOOK queued; not linked into the connection yet: handle_local does),
 * or -EAGAIN: ask the daemon. */
int localhold_acquire(shmref_conn *conn, const shmref_desc *desc, unsigned flags, shmref_buf **ret_buf);
/* localhold_again: one more hold on the buffer of buf, a live ledger hold of this
 * connection (a re-acquire of its descriptor): 0, or -EAGAIN. No TOOK: like a local
 * re-acquire of a daemon handle, it does not count toward max_acquires. */
int localhold_again(shmref_buf *buf);
/* localhold_give: buf (a ledger hold, not inherited) is given back; a NUDGE is sent when
 * the daemon waits for it. */
void localhold_give(shmref_buf *buf);

#endif
