/* SPDX-License-Identifier: MIT */
/* privs.h: giving up privilege once the socket and the pool are set up. Private to the
 * daemon. After privs_drop, the process has no capabilities in any set (effective,
 * permitted, inheritable, ambient, and the bounding set where it could drop it) and
 * no_new_privs is set, so nothing it executes could gain any. */
#ifndef SHMREFD_PRIVS_H
#define SHMREFD_PRIVS_H

#include <stddef.h>
#include <sys/types.h>

/* privs_lookup: the uid and gid of user name. Returns 0 or -ENOENT. */
int privs_lookup(const char *user, uid_t *ret_uid, gid_t *ret_gid);

/* privs_default_user: the user a root daemon given no --user becomes: "shmrefd" (the
 * package's) if it exists, else "nobody"; NULL when not root, or when that user cannot be
 * become here (its uid or gid unmapped in this user namespace, or setgroups denied). */
const char *privs_default_user(void);

/* privs_raise_nofile: raises the soft RLIMIT_NOFILE to the hard limit (fds are how
 * buffers travel). Returns the new soft limit. */
unsigned long privs_raise_nofile(void);

/* privs_drop: if user is not NULL and we are root, become that user (groups: its
 * primary group only); then drop every capability and set no_new_privs. Returns 0, or
 * -errno with what failed in why. */
int privs_drop(const char *user, char *why, size_t why_len);

#endif
