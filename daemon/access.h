/* SPDX-License-Identifier: MIT */
/* access.h: who may use the daemon, decided once per connection from SO_PEERCRED (and
 * SO_PEERGROUPS for supplementary groups). Private to the daemon. With neither
 * allow-users nor allow-groups set, anyone who can open the socket may; the operators
 * (access_operator) always may. */
#ifndef SHMREFD_ACCESS_H
#define SHMREFD_ACCESS_H

#include <stdbool.h>
#include <sys/socket.h>

#include "options.h"

bool access_allowed(const struct options *o, const struct ucred *cred, int fd);

/* access_set_operator: the operator uid besides root (0: none): the daemon's uid once it
 * has dropped privileges, unless that is user nobody's, which unrelated services (and
 * NFS's squashed root) share: a daemon serving as nobody (a root shmrefd's default where
 * user shmrefd does not exist) makes it no operator. Without this call the daemon's
 * current uid is one (a server run inside a test process). */
void access_set_operator(uid_t uid);

/* access_operator: uid is root or the daemon's own (unshared) uid: it sees every tenant in
 * status, may connect whatever allow-users says, has the reserved slots and no per-uid
 * connection or fd-share limit. */
bool access_operator(uid_t uid);

/* access_unmapped: true if cred's uid is the kernel's overflow uid while shmrefd runs in
 * a user namespace that does not map every uid: the peer's real uid is then unknown, so
 * peers of different users would all look like one tenant and could read each other's
 * recycled bytes. Such peers are refused. In the initial user namespace every uid maps,
 * and 65534 is simply the user it names. */
bool access_unmapped(const struct ucred *cred);

#endif
