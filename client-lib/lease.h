/* SPDX-License-Identifier: MIT */
/* lease.h: libshmref's publish and acquire requests and the blocking calls on buffers
 * (lease, publish, acquire, release, lease_many). Above the stock, handles and the
 * session; the event-loop face (eventloop.c) uses these to submit. */
#ifndef SHMREF_LEASE_H
#define SHMREF_LEASE_H

#include "conn.h"

/* The handlers of acquire and sealed publish requests. */
extern const struct pending_ops lease_acquire_ops, lease_publish_ops;

/* lease_acquire: shmref_acquire_ex; local false: never a table hold (localhold.c), for
 * a buffer that may be pinned past shmref_close (a unit's), whose journal goes with the
 * connection. */
int lease_acquire(shmref_conn *conn, const shmref_desc *desc, unsigned flags, bool local, shmref_buf **ret_buf);
/* lease_plain: shmref_lease_ex of a lease of the daemon's, never the table's (a unit's
 * buffer, which may be pinned past shmref_close). */
int lease_plain(shmref_conn *conn, size_t size, uint32_t wait_ms, shmref_buf **ret_buf);
/* lease_acquire_send: the message of an acquire record. */
int lease_acquire_send(shmref_conn *conn, struct pending *p);
/* lease_publish_check: whether buf may be published (len, flags): 0 or -errno. */
int lease_publish_check(shmref_buf *buf, size_t len, unsigned flags);
/* lease_publish_send: send the publish. A table lease's plain publish is made in the
 * table (no message); one that needs the daemon (a retention, seals, long metadata) first
 * makes the lease the daemon's (a round trip; a sealed one copies it into a lease of the
 * daemon's: other processes of the uid may map a table buffer writable). A plain one is
 * one-way: *ret_desc is written and p is left alone. A sealed one is listed as p
 * (p->buf = buf, held busy), its reply awaited. */
int lease_publish_send(shmref_buf *buf, size_t len, uint32_t keep_ms, uint32_t max_acquires, unsigned flags,
                       const void *meta, size_t meta_len, struct pending *p, shmref_desc *ret_desc);

#endif
