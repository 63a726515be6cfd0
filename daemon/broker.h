/* SPDX-License-Identifier: MIT */
/* broker.h: what each lease request means: the lease lifecycle (lease, publish, acquire,
 * release, their batches, and waiting for quota, space or a publish) and a disconnect's
 * reclaim. Private to the daemon; its parts are lease.c, batch.c, waits.c, acquire.c on
 * peer.h. The broker knows a client only as a struct broker_peer (peer.h: a session
 * embeds one; a unit test fakes one): it replies through the peer's ops and never
 * touches a socket. Every refusal is an error reply whose
 * message names the numbers; the broker never closes a connection. */
#ifndef SHMREFD_BROKER_H
#define SHMREFD_BROKER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "peer.h"

/* broker_start: the waiters (their timers on loop) and the registry's events. Until it
 * has run, a request's wait_ms is taken as 0. */
void broker_start(struct broker *b, uv_loop_t *loop);
/* broker_stop: forgets every waiter (their sessions are closing) and closes the timers. */
void broker_stop(struct broker *b);
/* broker_kick: quota limits changed (a reload): waiting leases are retried. */
void broker_kick(struct broker *b);

/* broker_handle: act on one decoded lease, publish, acquire or release request; returns
 * false for any other op (the caller's to handle). */
bool broker_handle(struct broker *b, struct broker_peer *p, const struct proto_msg *m);

/* broker_check: cross-checks the quota, registry and pool ledgers (the session calls it
 * after each request and disconnect; the broker after each buffer made off the loop).
 * In test builds (SHMREF_LEDGER_CHECK) a mismatch aborts the daemon; otherwise a drift the
 * registry saw is logged once. */
void broker_check(struct broker *b);

/* broker_mapped / broker_unmapped: p was sent buffer buf_id's fd and maps it now / said
 * it unmapped it (or went). A buffer retired while mapped stays counted as pinned
 * against the pool's cap and p's tenant quota until its last mapping goes. */
void broker_mapped(struct broker *b, struct broker_peer *p, uint64_t buf_id);
void broker_unmapped(struct broker *b, struct broker_peer *p, uint64_t buf_id);
/* broker_pins_after_close: whether a mapping of buf_id outlives what the daemon can free
 * (pool_pins_after_close): a closing connection hands those to broker_hold_until_exit. */
bool broker_pins_after_close(struct broker *b, uint64_t buf_id);
/* broker_hold_until_exit: p's connection closed while it mapped ids[0..n); they stay
 * charged to p's uid until p's process exits (pidfd, taken). */
void broker_hold_until_exit(struct broker *b, struct broker_peer *p, int pidfd, const uint64_t *ids, unsigned n);

/* broker_resend: the lease or acquire reply for request id, held back by p for room for
 * its fd, goes now, rebuilt from handle (which must still name buffer buf_id; if the
 * client released it meanwhile, an EINVAL error goes instead). */
void broker_resend(struct broker *b, struct broker_peer *p, uint32_t id, uint64_t handle, uint64_t buf_id);
/* broker_lease_fd: the fd to send for p's lease handle, which must still name buffer
 * buf_id: -ESTALE if p released it meanwhile, or why a read-only fd could not be made. */
int broker_lease_fd(struct broker *b, struct broker_peer *p, uint64_t handle, uint64_t buf_id);

/* broker_disconnect: drops p's waiting requests (nothing was charged for them) and
 * releases every handle p holds; returns how many handles there were. */
uint32_t broker_disconnect(struct broker *b, struct broker_peer *p);

#endif
