/* SPDX-License-Identifier: MIT */
/* sd-daemon.h for a shmrefd built without libsystemd (-DSHMREF_SYSTEMD=OFF: the Python
 * wheel's, which users start themselves or libshmref starts on demand). No service
 * manager is told anything and no socket is taken from one: every call says "none". */
#ifndef SHMREFD_NOSYSTEMD_SD_DAEMON_H
#define SHMREFD_NOSYSTEMD_SD_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#define SD_LISTEN_FDS_START 3

static inline int sd_listen_fds(int unset_environment) { (void)unset_environment; return 0; }
static inline int sd_is_socket_unix(int fd, int type, int listening, const char *path, size_t length)
{
    (void)fd, (void)type, (void)listening, (void)path, (void)length;
    return 0;
}
static inline int sd_notify(int unset_environment, const char *state) { (void)unset_environment, (void)state; return 0; }
static inline int sd_notifyf(int unset_environment, const char *format, ...)
{
    (void)unset_environment, (void)format;
    return 0;
}
static inline int sd_watchdog_enabled(int unset_environment, uint64_t *usec)
{
    (void)unset_environment, (void)usec;
    return 0;
}

#endif
