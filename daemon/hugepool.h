/* hugepool.h: a pool directory backed by transparent huge pages. Private to the daemon.
 * Mapping and first-touching a buffer costs 20-70x less with 2 MiB pages on this kind of
 * machine (DESIGN.md section 6), so shmrefd uses them wherever it can: an existing tmpfs
 * mounted with huge=always or huge=within_size, or one it mounts for itself. */
#ifndef SHMREFD_HUGEPOOL_H
#define SHMREFD_HUGEPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define HUGEPOOL_PAGE (2u << 20)

enum hugepool_kind {
    HUGEPOOL_NONE = 0,
    HUGEPOOL_WITHIN_SIZE, /* huge pages where the file's size covers them */
    HUGEPOOL_ALWAYS,      /* huge pages for every file, however small */
};

/* hugepool_detect: whether dir is on a tmpfs that allocates huge pages, and how. */
enum hugepool_kind hugepool_detect(const char *dir);

/* hugepool_can_mount: whether this process holds CAP_SYS_ADMIN (effective). */
bool hugepool_can_mount(void);

/* hugepool_mount: in a mount namespace of its own (so no other process sees it and it
 * vanishes with the daemon), mounts a tmpfs with huge=within_size of `bytes` over dir,
 * owned by uid:gid. Needs CAP_SYS_ADMIN and a single-threaded process. Returns 0, or
 * -errno with what failed in why. */
int hugepool_mount(const char *dir, uint64_t bytes, uid_t uid, gid_t gid, char *why, size_t why_len);

#endif
