/* access.h: who may use the daemon, decided once per connection from SO_PEERCRED (and
 * SO_PEERGROUPS for supplementary groups). Private to the daemon. With neither
 * allow-users nor allow-groups set, anyone who can open the socket may; root and the
 * daemon's own uid always may. */
#ifndef SHMREFD_ACCESS_H
#define SHMREFD_ACCESS_H

#include <stdbool.h>
#include <sys/socket.h>

#include "options.h"

bool access_allowed(const struct options *o, const struct ucred *cred, int fd);

#endif
