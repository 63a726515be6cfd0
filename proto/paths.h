/* SPDX-License-Identifier: MIT */
/* paths.h: where the daemon listens by default; one rule for the daemon, the library and
 * the CLI. Reads the environment, does no I/O. */
#ifndef SHMREF_PATHS_H
#define SHMREF_PATHS_H

#include <stddef.h>

#define PATHS_SYSTEM_SOCKET "/run/shmrefd/shmrefd.sock"

/* paths_default_socket: $SHMREFD_SOCKET, else $XDG_RUNTIME_DIR/shmrefd.sock, else
 * PATHS_SYSTEM_SOCKET, written NUL-terminated into buf. Returns 0, or -ENAMETOOLONG. */
int paths_default_socket(char *buf, size_t cap);

#endif
