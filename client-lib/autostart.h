/* SPDX-License-Identifier: MIT */
/* autostart.h: a private shmrefd on demand (DESIGN.md section 12). Private to libshmref.
 * Knows nothing of connections: it finds or starts a daemon and says where it listens. */
#ifndef SHMREF_AUTOSTART_H
#define SHMREF_AUTOSTART_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* autostart_socket: connecting to the default socket `path` failed with err (-errno).
 * When err says no daemon listens there (-ENOENT, -ECONNREFUSED) or path is the system
 * socket and it refuses this uid (-EACCES), $SHMREFD_SOCKET is unset and
 * $SHMREF_AUTOSTART is not 0: the system socket (when path was another), then
 * the calling uid's private daemon, started here if it does not answer (one per uid: a
 * flock on a lock file beside its socket). On success writes the socket that answers
 * into path and returns 0. Returns err untouched, writing nothing, when it does not
 * apply; another -errno with why (the daemon's log file named) in msg when it fails.
 * deadline: client_mono_ms() time to give up at, or -1 (then a 30 s bound). */
int autostart_socket(int err, char *path, size_t cap, int64_t deadline, char *msg, size_t msgcap);

/* autostart_dir: the directory of the uid's private daemon, made 0700 if missing:
 * $XDG_RUNTIME_DIR/shmref when XDG_RUNTIME_DIR is a directory of the uid's, else
 * /tmp/shmref-UID, or, when another uid holds that name (which the uid cannot remove from
 * sticky /tmp), ${XDG_CACHE_HOME:-$HOME/.cache}/shmref. Returns 0, 1 for that last
 * alternative, or -errno with why and what to do in msg. make false: makes nothing (a
 * directory missing is where it would be made). */
int autostart_dir(char *dir, size_t cap, bool make, char *msg, size_t msgcap);

/* What a private daemon started now would be given, and why. */
struct autostart_sizes {
    uint64_t pool, quota;          /* in force (0: shmrefd's own default) */
    uint64_t pool_flag, quota_flag; /* passed as --pool-size / --tenant-quota; 0: not passed */
    char pool_why[PATH_MAX + 64], quota_why[PATH_MAX + 64];
    char config[PATH_MAX];         /* the user's shmrefd.conf (with no home: ~/.config/...) */
    bool config_exists;
};

/* autostart_sizes: the private daemon's pool and tenant quota: $SHMREF_POOL_SIZE, else the
 * user's config file ($XDG_CONFIG_HOME/shmref/shmrefd.conf, else
 * ~/.config/shmref/shmrefd.conf), else the least of half the memory cgroup's room, half
 * of /dev/shm's free space and a quarter of MemAvailable; the quota the same way from
 * $SHMREF_TENANT_QUOTA, else the pool. Returns 0, or -EINVAL with msg (a variable that is
 * not a size). */
int autostart_sizes(struct autostart_sizes *ret, char *msg, size_t msgcap);

/* What a connect would reach, and why (shmrefctl which). */
enum autostart_kind {
    AUTOSTART_NAMED,         /* --socket or $SHMREFD_SOCKET: that socket, nothing started */
    AUTOSTART_DEFAULT,       /* a daemon answers at the default socket */
    AUTOSTART_SYSTEM,        /* the system daemon */
    AUTOSTART_PRIVATE,       /* the uid's private daemon, running */
    AUTOSTART_PRIVATE_START, /* the uid's private daemon, which the next connect starts */
    AUTOSTART_NONE,          /* nothing: a connect fails */
};

struct autostart_choice {
    enum autostart_kind kind;
    bool answers;                  /* a daemon accepts connections at socket now */
    char socket[PATH_MAX];
    char why[4096];                /* clauses separated by "; " */
    char program[PATH_MAX];        /* AUTOSTART_PRIVATE_START: the shmrefd it would run */
    struct autostart_sizes sizes;  /* AUTOSTART_PRIVATE_START: what it would be given */
};

/* autostart_which: the rule shmref_connect_timeout and autostart_socket follow, applied
 * without starting or making anything: named is the socket the caller names (NULL: none).
 * Returns 0, or -ENAMETOOLONG (the default socket's path). */
int autostart_which(const char *named, struct autostart_choice *ret);

#endif
