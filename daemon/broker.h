/* broker.h: what each request means: the lease lifecycle (lease, publish, acquire,
 * release), hello, status and ping. Private to the daemon. Every refusal is an error
 * reply whose message names the numbers; only a malformed conversation (no hello, a
 * version mismatch) closes the connection. */
#ifndef SHMREFD_BROKER_H
#define SHMREFD_BROKER_H

#include "conn.h"
#include "proto.h"

/* broker_handle: act on one decoded request from c. conn.c has already refused anything
 * but a hello as the first message, and every op that is not a request. */
void broker_handle(struct conn *c, const struct proto_msg *m);

#endif
