/* SPDX-License-Identifier: MIT */
/* stock.h: libshmref's lease stock and the lease requests (a foreground lease, a
 * lease_many, a refill): their handlers take the daemon's leases as handles, teach the
 * stock the size classes, and retry a lease refused for space or quota once the stock is
 * back. Above handles and the request table. */
#ifndef SHMREF_STOCK_H
#define SHMREF_STOCK_H

#include "conn.h"

/* The handlers of lease and lease_many requests. */
extern const struct pending_ops stock_lease_ops;

/* stock_retry: a lease (or an acquire, for quota) refused for space or quota is sent once
 * more after the stock is returned and idle mappings (which pin evicted pages charged to
 * this client) are dropped; while refills are still out it waits for them (parked).
 * True when p was sent again or parked. An acquire's refused handler. */
bool stock_retry(shmref_conn *conn, struct pending *p, int code);
/* stock_lease_new: a lease record (size bytes, the caller's want) of owner. */
struct pending *stock_lease_new(shmref_conn *conn, uint8_t owner, uint64_t size, size_t want, uint32_t wait_ms);

void stock_init(struct stock *st);
/* stock_take: a ready lease for size bytes (its size set to size), sending one refill:
 * 1 with *ret_buf, 0 (none ready: *ret_wait, if not NULL, gets a refill in flight for
 * that class, which the caller may take over), or -errno. */
int stock_take(shmref_conn *conn, size_t size, shmref_buf **ret_buf, struct pending **ret_wait);
/* stock_return: release every ready lease and drop refills in flight (they are released
 * when they arrive). Returns how many were released or dropped. */
unsigned stock_return(shmref_conn *conn);
/* stock_abandon: a forked child: the ready leases are the parent's (their local handles
 * freed, nothing released), nothing is in flight. */
void stock_abandon(shmref_conn *conn);
/* stock_reset: the connection broke: nothing is in flight any more. */
void stock_reset(shmref_conn *conn);
/* stock_eligible: whether a lease of size uses the stock. */
bool stock_eligible(const shmref_conn *conn, size_t size);
/* stock_set_depth: shmref_set_stock's work: leases past the new depth are released. */
void stock_set_depth(shmref_conn *conn, unsigned depth);

#endif
