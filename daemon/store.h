/* SPDX-License-Identifier: MIT */
/* store.h: backing files: how a buffer's file is made (O_TMPFILE in the pool directory,
 * or a memfd), reserved in full, checked when it comes back, and reopened read-only; and
 * whether the pool directory gives huge pages (detected, or a private tmpfs mounted at
 * setup). Private to the daemon. The pool decides which buffers exist; the store only
 * how their files behave. A second store kind (sealed memfds) is a new kind here, beside
 * these two, with the same calls. */
#ifndef SHMREFD_STORE_H
#define SHMREFD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "options.h"

#define STORE_HUGE_PAGE (2u << 20)

enum store_huge {
    STORE_HUGE_NONE = 0,
    STORE_HUGE_WITHIN_SIZE, /* huge pages where the file's size covers them */
    STORE_HUGE_ALWAYS,      /* huge pages for every file, however small */
};

struct store {
    char *dir;
    bool memfd;             /* memfd_create instead of O_TMPFILE in dir */
    enum store_huge huge;   /* what dir's filesystem allocates (NONE for memfds) */
};

/* store_open: a store over dir (checked to support O_TMPFILE unless memfd). Returns 0,
 * or -errno with the reason in why. */
int store_open(struct store *st, const char *dir, bool memfd, char *why, size_t why_len);
/* store_close: frees what store_open made. Accepts a zeroed store. */
void store_close(struct store *st);

/* store_create: a new file of size bytes, every block reserved (fallocate), O_RDWR and
 * CLOEXEC in *ret_fd. Blocks (gigabytes may take long): call it off the loop. Touches
 * nothing but st's read-only fields, so any thread may call it. */
int store_create(const struct store *st, uint64_t size, int *ret_fd);

/* store_intact: whether the file is still exactly what was reserved: same size, every
 * block allocated. A producer holds an O_RDWR fd and could ftruncate it (the next holder
 * would SIGBUS), grow it or punch holes (storage nobody accounts for). */
bool store_intact(const struct store *st, int fd, uint64_t size);

/* store_seal_write: adds F_SEAL_WRITE (and F_SEAL_SEAL) to a memfd: nobody can write it
 * any more, through any fd or mapping, root included. Returns 0; -EOPNOTSUPP for a
 * tmpfile store (tmpfs files cannot be sealed); -EBUSY while a writable shared mapping
 * of it exists anywhere (the kernel's rule). */
int store_seal_write(const struct store *st, int fd);

/* store_emptiable: whether store_empty can free fd's pages: not for a memfd sealed against
 * writing (F_SEAL_WRITE or F_SEAL_FUTURE_WRITE: the kernel refuses to punch it). Cheap
 * (one fcntl, none for a tmpfile store): call it on the loop. */
bool store_emptiable(const struct store *st, int fd);

/* store_empty: frees every page of a file the pool lets go of, whoever still maps it:
 * punches a hole over its size bytes (FALLOC_FL_PUNCH_HOLE | KEEP_SIZE), and on a
 * tmpfile store also truncates it to 0. Stale mappings of a memfd then read zeros (a page
 * they touch again is a new page, charged by the kernel to the memory cgroup of the
 * process that touches it); stale mappings of a tmpfile fault SIGBUS, so they can never
 * bring pages back into the pool's tmpfs (reading a hole of a shared mapping would
 * allocate one). Takes as long as freeing the pages does: the pool calls it off the loop
 * for large batches. Returns 0 or -errno. */
int store_empty(const struct store *st, int fd, uint64_t size);

/* store_reopen_ro: a new O_RDONLY, CLOEXEC fd of the same file. Returns it or -errno. */
int store_reopen_ro(const struct store *st, int fd);

/* store_round: size rounded to what the store allocates in one piece: on a huge-page
 * directory, sizes above 1 MiB (every size on huge=always) are whole 2 MiB pages, so no
 * page is split between a buffer and the rest of the file. */
uint64_t store_round(const struct store *st, uint64_t size);

/* store_kind: "tmpfile", "tmpfile-hugepages" or "memfd" (status and the start line). */
const char *store_kind(const struct store *st);

/* store_detect_huge: whether dir is on a tmpfs that allocates huge pages, and how. */
enum store_huge store_detect_huge(const char *dir);

/* store_setup_hugepages: at setup, while the process may still mount (CAP_SYS_ADMIN,
 * single-threaded): unless o's pool dir already has huge pages (or they are off), mount a
 * private huge-page tmpfs over it, in a mount namespace of its own (nobody else sees it;
 * it vanishes with the daemon). Logs what it decided. Returns 0 (also when it fell back
 * to 4 KiB pages), or -errno when pool-hugepages=yes cannot be met. */
int store_setup_hugepages(const struct options *o);

#endif
