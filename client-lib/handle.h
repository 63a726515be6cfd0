/* SPDX-License-Identifier: MIT */
/* handle.h: libshmref's buffer handles: a lease or acquire reply turned into a mapped
 * handle (its fd checked before mmap), a handle's local half forgotten or dropped, a
 * handle held busy by a request in flight, local sharing of an acquired handle, and what
 * a reply nobody will have brings given back. Above transport and the mapping cache. */
#ifndef SHMREF_HANDLE_H
#define SHMREF_HANDLE_H

#include "conn.h"

/* handle_take: turn a lease or acquire reply's fields and fd into a handle (linked into
 * the connection). The fd must be a regular file covering capacity bytes (else -EBADF,
 * nothing mapped). On failure the daemon's handle is released and the fd closed. */
int handle_take(shmref_conn *conn, uint64_t handle, uint64_t buf_id, uint64_t size, uint64_t capacity,
                const uint8_t *token, const uint8_t *meta, uint32_t meta_len, uint32_t flags, int fd,
                bool writable, bool require_sealed, bool private_map, shmref_buf **ret_buf);
/* handle_link: a new handle b linked into conn's list. */
void handle_link(shmref_conn *conn, shmref_buf *b);
/* handle_forget: a handle's local half (list, mapping use, memory; a ledger hold is given
 * back in the ledger). Returns the daemon handle to release, or 0 when another local
 * handle still shares it, it is a forked child's inherited copy or a ledger hold. A
 * handle kept past shmref_close (pinned, of a closed connection: a forked child's
 * inherited one) goes as handle_forget_pinned (0). */
uint64_t handle_forget(shmref_buf *buf);
/* handle_forget_pinned: a pinned handle of a closed connection (a unit's buffer whose
 * exports outlived shmref_close, or a forked child's inherited handle, kept by its
 * close): its memory only, after a one-way release of the daemon handle when it is this
 * process's own and the last local one; the last such handle ends the connection (bye,
 * handle_teardown). Any thread: only atomics and one send (atomic per message). */
void handle_forget_pinned(shmref_buf *buf);
/* handle_teardown: the last of a connection: every mapping (a forked child's inherited
 * ones stay mapped), the ledger, the socket, the memory. Nothing is sent. */
void handle_teardown(shmref_conn *conn);
/* handle_drop: handle_forget, then a one-way release of the daemon handle if it was the
 * last local one (nothing is sent in a forked child or on a broken connection). */
void handle_drop(shmref_buf *buf);
/* handle_hold: a request in flight refers to buf: it stays valid (shmref_release only
 * marks it) until handle_unhold. handle_unhold: that request ended; returns buf, or NULL
 * when it was released meanwhile and is gone now. */
void handle_hold(shmref_buf *buf);
shmref_buf *handle_unhold(shmref_buf *buf);
/* handle_release_busy: shmref_release of a busy handle: marked, released when the last
 * request that refers to it ends. */
void handle_release_busy(shmref_buf *buf);
/* handle_share: a new local handle sharing the daemon handle of a live acquired handle of
 * desc on conn (no round trip; found in a tree, not by a scan), or NULL. */
shmref_buf *handle_share(shmref_conn *conn, const shmref_desc *desc, unsigned flags);
/* handle_local: a new handle for desc taken in the tenant's ledger (localhold.c), linked
 * into conn, or NULL: ask the daemon. */
shmref_buf *handle_local(shmref_conn *conn, const shmref_desc *desc, unsigned flags);
/* handle_uncacheable: buf's mapping is unmapped when its last user goes instead of being
 * kept idle (the daemon retires the buffer when this handle is released: the acquire
 * reply's flag, protocol 3). */
void handle_uncacheable(shmref_buf *buf);
/* handle_inherit: a forked child: every handle is its parent's (never released, never
 * unmapped, never shared with the child's own). */
void handle_inherit(shmref_conn *conn);
/* handle_undo_reply: a lease, acquire or lease_many reply whose handles nobody will have:
 * released, and the fds that came (or were meant to come) with them forgotten. Any other
 * reply: its fds closed. Also conn->on_stray. */
void handle_undo_reply(shmref_conn *conn, const struct proto_msg *rep, int *fds, unsigned nfds, bool lost);
/* handle_lost: a reply whose fds this process could not receive (at its open-file limit):
 * undone, p fails with -EMFILE and the limit in its message. */
void handle_lost(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds);

#endif
