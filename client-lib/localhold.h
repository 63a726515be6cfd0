/* SPDX-License-Identifier: MIT */
/* localhold.h: libshmref's half of same-tenant handoffs without the daemon: the uid's
 * table and this connection's journal (proto/handoff.h), mapped at hello; a lease popped
 * from the table, a publish made in it, an acquire of a buffer this process maps taken in
 * it, and each given back in it: no message to shmrefd. Above the mapping cache and
 * transport, below requests and handles: what needs the daemon (the fd of a buffer this
 * process does not map, a lease that becomes the daemon's) is lease.c's, with the steps
 * here before and after it. */
#ifndef SHMREF_LOCALHOLD_H
#define SHMREF_LOCALHOLD_H

#include "conn.h"

/* localhold_wanted: whether this process asks for PROTO_FEAT_TABLE ($SHMREF_TABLE=0: no). */
bool localhold_wanted(void);
/* localhold_setup: the hello reply agreed PROTO_FEAT_TABLE and brought fds[0] (the table)
 * and fds[1] (this connection's journal): checked (size, seals, header) and mapped.
 * Anything wrong: the connection works without the local path (counters.table_refused).
 * The fds stay the caller's. */
void localhold_setup(shmref_conn *conn, const int *fds, unsigned nfds);
/* localhold_unmap: the table and journal unmapped (teardown, or a forked child's copies
 * of its parent's: never touched by the child). */
void localhold_unmap(shmref_conn *conn);
/* localhold_on: whether the connection has a table. */
bool localhold_on(const shmref_conn *conn);

/* A local lease popped from the table whose buffer this process does not map yet. */
struct localhold_popped {
    uint32_t slot, seq;
    uint64_t buf_id;
    size_t size;            /* the caller's */
};

/* localhold_lease: a lease of size bytes from the table: 0 and *ret_buf (writable, a
 * table hold, not linked yet); 1: popped, but this process does not map the buffer:
 * *ret_popped says which (the caller asks the daemon for its fd, then calls
 * localhold_lease_mapped or localhold_lease_drop); -EAGAIN: no table, no class for size,
 * or its free list is empty: a lease of the daemon's (PROTO_LEASE_TABLE). */
int localhold_lease(shmref_conn *conn, size_t size, shmref_buf **ret_buf, struct localhold_popped *ret_popped);
/* localhold_lease_mapped: the popped lease, its buffer now mapped writable at data (len
 * bytes, the mapping cache's, one use taken for it): 0 and *ret_buf, or -EAGAIN (the
 * buffer is smaller than asked: given back; the use is put back). */
int localhold_lease_mapped(shmref_conn *conn, const struct localhold_popped *pp, void *data, size_t len,
                           shmref_buf **ret_buf);
/* localhold_lease_drop: the popped lease given back (its fd could not be had). */
void localhold_lease_drop(shmref_conn *conn, const struct localhold_popped *pp);

/* localhold_publish: buf (a table lease) published in the table (len bytes, meta): 0
 * and *ret_desc; -EAGAIN: meta too long for the table (the caller makes the lease the
 * daemon's and publishes there); -ESTALE: the table no longer has it as this lease (a
 * scribbled table, or the daemon took it back). */
int localhold_publish(shmref_buf *buf, size_t len, const void *meta, size_t meta_len, shmref_desc *ret_desc);
/* localhold_adopted: the daemon adopted buf (a table lease): it now holds handle under
 * token; the local hold is given back. */
void localhold_adopted(shmref_buf *buf, uint64_t handle, const uint8_t token[PROTO_TOKEN_LEN]);

/* localhold_acquire: an acquire of desc taken in the table: 0 with *ret_buf (a table
 * hold, not linked yet: handle_local does), or -EAGAIN: ask the daemon (not published
 * there under this token, this process does not map the buffer, a sealed or private
 * acquire). */
int localhold_acquire(shmref_conn *conn, const shmref_desc *desc, unsigned flags, shmref_buf **ret_buf);
/* localhold_again: one more hold on the buffer of buf, a live table hold of this
 * connection (a re-acquire of its descriptor): 0, or -EAGAIN. */
int localhold_again(shmref_buf *buf);
/* localhold_give: buf (a table hold, not inherited) is given back; when the daemon is
 * to have the buffer back (HANDOFF_TO_DAEMON) a giveback is sent. */
void localhold_give(shmref_buf *buf);

#endif
