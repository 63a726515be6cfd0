/* SPDX-License-Identifier: MIT */
/* hint.h: what a failed connect to shmrefd usually means, for shmrefctl's messages. */
#ifndef SHMREFCTL_HINT_H
#define SHMREFCTL_HINT_H

/* hint_connect: a parenthesised hint for connect error err (negative errno) at path:
 * a regular file or a directory given as the socket is named as such (connect says
 * ECONNREFUSED for both, as for a socket nobody listens on). "" when it has none. */
const char *hint_connect(const char *path, int err);

#endif
