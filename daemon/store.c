/* SPDX-License-Identifier: MIT */
/* store.c: see store.h. Files are unlinked from birth (O_TMPFILE | O_EXCL in the pool
 * directory, never linkable, or memfds), so nothing is left behind when the daemon dies.
 * The private tmpfs is huge=within_size rather than always: a file gets huge pages only
 * where its size covers them, so small buffers keep small pages and waste nothing. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/falloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "log.h"
#include "mountinfo.h"
#include "privs.h"
#include "units.h"

int store_open(struct store *st, const char *dir, bool memfd, char *why, size_t why_len)
{
    *st = (struct store){ .memfd = memfd };
    if (!memfd) {
        int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) {
            int e = errno;
            snprintf(why, why_len, "pool directory %s does not support O_TMPFILE: %s", dir, strerror(e));
            return -e;
        }
        close(fd);
    }
    if (!(st->dir = strdup(dir))) {
        snprintf(why, why_len, "out of memory");
        return -ENOMEM;
    }
    st->huge = memfd ? STORE_HUGE_NONE : store_detect_huge(dir);
    return 0;
}

void store_close(struct store *st)
{
    free(st->dir);
    st->dir = NULL;
}

/* The seals every memfd gets at birth: its size is its class for good, so neither its
 * producer (who holds it O_RDWR) nor anyone else can truncate it under a consumer's
 * mapping (SIGBUS) or grow it past what the pool accounts for. */
#define BIRTH_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

int store_create(const struct store *st, uint64_t size, int *ret_fd)
{
    int fd = st->memfd ? memfd_create("shmref", MFD_CLOEXEC | MFD_ALLOW_SEALING)
                       : open(st->dir, O_TMPFILE | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int r;
    /* A memfd is born mode 0777: anyone who gets an fd could reopen it writable through
     * /proc/self/fd. 0600 keeps every other uid out, as for the O_TMPFILE files. */
    if (st->memfd && fchmod(fd, 0600) < 0)
        goto fail;
    do
        r = fallocate(fd, 0, 0, (off_t)size);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        goto fail;
    if (st->memfd && fcntl(fd, F_ADD_SEALS, BIRTH_SEALS) < 0)
        goto fail;
    *ret_fd = fd;
    return 0;
fail:
    r = -errno;
    close(fd);
    return r;
}

bool store_intact(const struct store *st, int fd, uint64_t size)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        return false;
    /* A memfd with any other seal (a producer may add F_SEAL_WRITE through its fd) could
     * not be written by the next lease. */
    if (st->memfd && fcntl(fd, F_GET_SEALS) != BIRTH_SEALS)
        return false;
    return (uint64_t)sb.st_size == size && (uint64_t)sb.st_blocks * 512 == size;
}

int store_seal_write(const struct store *st, int fd)
{
    if (!st->memfd)
        return -EOPNOTSUPP;
    return fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SEAL) < 0 ? -errno : 0;
}

bool store_emptiable(const struct store *st, int fd)
{
    if (!st->memfd)
        return true;
    int seals = fcntl(fd, F_GET_SEALS);
    return seals >= 0 && !(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
}

int store_empty(const struct store *st, int fd, uint64_t size)
{
    int r;
    do
        r = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)size);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return -errno;
    /* A memfd is size-sealed (BIRTH_SEALS) and keeps its size: its holes read as zeros. */
    if (!st->memfd && ftruncate(fd, 0) < 0)
        return -errno;
    return 0;
}

int store_reopen_ro(const struct store *st, int fd)
{
    char path[64];
    (void)st;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int ro = open(path, O_RDONLY | O_CLOEXEC);
    return ro < 0 ? -errno : ro;
}

uint64_t store_round(const struct store *st, uint64_t size)
{
    if (st->huge == STORE_HUGE_NONE || (st->huge == STORE_HUGE_WITHIN_SIZE && size <= (1u << 20)))
        return size;
    return (size + STORE_HUGE_PAGE - 1) / STORE_HUGE_PAGE * STORE_HUGE_PAGE;
}

const char *store_kind(const struct store *st)
{
    return st->memfd ? "memfd" : st->huge ? "tmpfile-hugepages" : "tmpfile";
}

/* ---- huge pages ------------------------------------------------------------------- */

enum store_huge store_detect_huge(const char *dir)
{
    char real[PATH_MAX];
    struct mountinfo_entry *e = malloc(sizeof(*e));
    enum store_huge h = STORE_HUGE_NONE;
    if (e && realpath(dir, real) && mountinfo_find(NULL, real, e) == 0 && strcmp(e->fstype, "tmpfs") == 0) {
        if (strstr(e->super, "huge=always"))
            h = STORE_HUGE_ALWAYS;
        else if (strstr(e->super, "huge=within_size"))
            h = STORE_HUGE_WITHIN_SIZE;
    }
    free(e);
    return h;
}

/* can_mount: whether this process holds CAP_SYS_ADMIN (effective). */
static bool can_mount(void)
{
    cap_t caps = cap_get_proc();
    cap_flag_value_t v = CAP_CLEAR;
    if (caps)
        cap_get_flag(caps, CAP_SYS_ADMIN, CAP_EFFECTIVE, &v);
    cap_free(caps);
    return v == CAP_SET;
}

/* mount_huge: in a mount namespace of its own, mounts a tmpfs with huge=within_size of
 * `bytes` over dir, owned by uid:gid. Returns 0, or -errno with what failed in why. */
static int mount_huge(const char *dir, uint64_t bytes, uid_t uid, gid_t gid, char *why, size_t why_len)
{
    char opts[256];
    if (unshare(CLONE_NEWNS) < 0) {
        int e = errno;
        snprintf(why, why_len, "unshare(CLONE_NEWNS): %s", strerror(e));
        return -e;
    }
    /* Nothing we mount from here on propagates back to the host. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
        int e = errno;
        snprintf(why, why_len, "making mounts private: %s", strerror(e));
        return -e;
    }
    bytes = (bytes + STORE_HUGE_PAGE - 1) / STORE_HUGE_PAGE * STORE_HUGE_PAGE;
    snprintf(opts, sizeof(opts), "huge=within_size,size=%llu,mode=0700,uid=%u,gid=%u",
             (unsigned long long)bytes, (unsigned)uid, (unsigned)gid);
    if (mount("shmrefd-pool", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0) {
        int e = errno;
        snprintf(why, why_len, "mount -t tmpfs -o %s on %s: %s", opts, dir, strerror(e));
        return -e;
    }
    return 0;
}

int store_setup_hugepages(const struct options *o)
{
    char why[512], a[UNITS_TEXT_MAX];
    if (o->memfd || o->pool_hugepages == OPTIONS_HUGE_NO || store_detect_huge(o->pool_dir) != STORE_HUGE_NONE)
        return 0;
    /* The private mount must not hide a pool that the real directory could not hold:
     * the size check against it (and its message) stays with pool_new. */
    struct statvfs sv;
    if (statvfs(o->pool_dir, &sv) < 0 || o->pool_size > (uint64_t)sv.f_bavail * sv.f_frsize)
        return 0;
    size_t dl = strlen(o->pool_dir);
    if (strncmp(o->socket_path, o->pool_dir, dl) == 0 && (o->socket_path[dl] == '/' || o->pool_dir[dl - 1] == '/')) {
        if (o->pool_hugepages == OPTIONS_HUGE_YES) {
            log_error("cannot set up the huge-page pool: the socket %s is inside pool-dir %s, which "
                      "the private mount would hide from clients", o->socket_path, o->pool_dir);
            return -EINVAL;
        }
        log_notice("no huge-page pool: the socket %s is inside pool-dir %s, which a private mount "
                   "would hide from clients; buffers use 4 KiB pages", o->socket_path, o->pool_dir);
        return 0;
    }
    if (!can_mount()) {
        if (o->pool_hugepages == OPTIONS_HUGE_YES) {
            log_error("cannot set up the huge-page pool: mounting needs CAP_SYS_ADMIN");
            return -EPERM;
        }
        log_notice("no huge-page pool (mounting needs CAP_SYS_ADMIN): buffers use 4 KiB pages in %s; "
                   "a tmpfs mounted with huge=within_size as pool-dir gives huge pages", o->pool_dir);
        return 0;
    }
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (o->user && geteuid() == 0 && privs_lookup(o->user, &uid, &gid) < 0)
        return -ENOENT;
    /* The tmpfs is the pool cap, so the kernel enforces it too: a producer that grows its
     * file (fallocate through its O_RDWR fd) takes at most what the pool may hold. (The
     * pool counts a batch of retired buffers until it is closed off the loop, and a
     * create that finds their pages not freed yet waits for them: see pool.c.) */
    uint64_t bytes = o->pool_size + o->stock_reserve; /* the stock reserve is beyond the cap */
    int r = mount_huge(o->pool_dir, bytes, uid, gid, why, sizeof(why));
    if (r == 0) {
        log_info("mounted a private huge-page tmpfs (huge=within_size, at most %s) over %s",
                 units_format(bytes, a), o->pool_dir);
        return 0;
    }
    if (o->pool_hugepages == OPTIONS_HUGE_YES) {
        log_error("cannot set up the huge-page pool: %s", why);
        return r;
    }
    log_notice("no huge-page pool (%s): buffers use 4 KiB pages in %s", why, o->pool_dir);
    return 0;
}

