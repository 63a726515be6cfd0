/* SPDX-License-Identifier: MIT */
/* hint.c: see hint.h. */
#include "hint.h"

#include <errno.h>
#include <sys/stat.h>

const char *hint_connect(const char *path, int err)
{
    struct stat st;
    if (err == -ECONNREFUSED && path && stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return " (that is a directory, not a socket: --socket names the socket file, e.g. DIR/shmrefd.sock)";
        if (!S_ISSOCK(st.st_mode))
            return " (that is not a socket but a regular or special file: is --socket or $SHMREFD_SOCKET right?)";
    }
    switch (-err) {
    case ENOENT: return " (no socket there: is shmrefd running? systemctl start shmrefd.socket; or give --socket)";
    case ECONNREFUSED: return " (nothing listens there: shmrefd is not running)";
    case ENOTDIR: return " (a component of the path is not a directory)";
    case EACCES: return " (the socket's mode or group refuses this user, or the daemon's allow-users/allow-groups does)";
    default: return "";
    }
}
