/* status.h: the daemon's state as a msgpack map, for the status request. Private to the
 * daemon. Lists (classes, tenants, clients) are cut to fit in one reply; the *_total
 * fields say how many there were. */
#ifndef SHMREFD_STATUS_H
#define SHMREFD_STATUS_H

#include <stddef.h>
#include <stdint.h>

struct server;

/* status_build: writes the map into buf. Returns its length, or -EMSGSIZE. */
int status_build(struct server *s, uint8_t *buf, size_t cap);

#endif
