/* SPDX-License-Identifier: MIT */
/* paths.c: see paths.h. */
#include "paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int paths_default_socket(char *buf, size_t cap)
{
    const char *e = getenv("SHMREFD_SOCKET");
    int n;
    if (e && *e)
        n = snprintf(buf, cap, "%s", e);
    else if ((e = getenv("XDG_RUNTIME_DIR")) && *e)
        n = snprintf(buf, cap, "%s/shmrefd.sock", e);
    else
        n = snprintf(buf, cap, "%s", PATHS_SYSTEM_SOCKET);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}
