/* SPDX-License-Identifier: MIT */
/* test-store.c: backing files (daemon/store.c) in a real directory under /dev/shm and as
 * memfds: made unlinked and reserved in full, the integrity check that catches a file a
 * producer truncated, grew or punched, the read-only reopen, the allocation piece on a
 * huge-page directory, and the huge-page detection on a real tmpfs (mounted in a child's
 * own mount namespace, as root). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store.h"

#define MiB (UINT64_C(1) << 20)

static void open_dir(struct store *st, char *dir, bool memfd)
{
    char why[256];
    strcpy(dir, "/dev/shm/shmref-test-store-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(store_open(st, dir, memfd, why, sizeof(why)), 0, "%s", why);
}

static void close_dir(struct store *st, char *dir)
{
    store_close(st);
    cr_assert_eq(rmdir(dir), 0, "a file was left in %s: %s", dir, strerror(errno));
}

static void check_made(const struct store *st, uint64_t size)
{
    int fd = -1;
    cr_assert_eq(store_create(st, size, &fd), 0);
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    cr_assert_eq((uint64_t)sb.st_size, size);
    cr_assert_eq((uint64_t)sb.st_blocks * 512, size, "not every block is reserved");
    cr_assert_eq(sb.st_nlink, 0, "the file has a name");
    cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    cr_assert_eq(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
    cr_assert(store_intact(st, fd, size));
    close(fd);
}

Test(store, tmpfile_and_memfd_files_are_reserved_and_nameless)
{
    struct store st;
    char dir[64];
    open_dir(&st, dir, false);
    cr_assert_str_eq(store_kind(&st), "tmpfile");
    check_made(&st, 3 * 4096);
    close_dir(&st, dir);
    open_dir(&st, dir, true);
    cr_assert_str_eq(store_kind(&st), "memfd");
    check_made(&st, 5 * 4096);
    close_dir(&st, dir);
}

Test(store, a_dir_without_o_tmpfile_is_refused_with_why)
{
    struct store st;
    char why[256];
    cr_assert_lt(store_open(&st, "/proc", false, why, sizeof(why)), 0);
    cr_assert(strstr(why, "/proc does not support O_TMPFILE"), "%s", why);
    store_close(&st);
}

Test(store, integrity_catches_truncate_growth_and_holes)
{
    struct store st;
    char dir[64];
    const uint64_t size = 16 * 4096;
    open_dir(&st, dir, false);
    int fd;
    cr_assert_eq(store_create(&st, size, &fd), 0);
    cr_assert_eq(ftruncate(fd, size / 2), 0);
    cr_assert_not(store_intact(&st, fd, size), "a shrunk file passed");
    close(fd);
    cr_assert_eq(store_create(&st, size, &fd), 0);
    cr_assert_eq(fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)size, 4096), 0);
    cr_assert_not(store_intact(&st, fd, size), "blocks beyond the size passed");
    close(fd);
    cr_assert_eq(store_create(&st, size, &fd), 0);
    cr_assert_eq(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4096), 0);
    cr_assert_not(store_intact(&st, fd, size), "a hole passed");
    close(fd);
    cr_assert_not(store_intact(&st, -1, size), "a bad fd passed");
    close_dir(&st, dir);
}

Test(store, read_only_reopen_cannot_write)
{
    struct store st;
    char dir[64];
    open_dir(&st, dir, false);
    int fd;
    cr_assert_eq(store_create(&st, 4096, &fd), 0);
    cr_assert_eq(pwrite(fd, "abc", 3, 0), 3);
    int ro = store_reopen_ro(&st, fd);
    cr_assert_geq(ro, 0, "%s", strerror(-ro));
    cr_assert_eq(fcntl(ro, F_GETFL) & O_ACCMODE, O_RDONLY);
    cr_assert(fcntl(ro, F_GETFD) & FD_CLOEXEC);
    char b[3];
    cr_assert_eq(pread(ro, b, 3, 0), 3);
    cr_assert_eq(memcmp(b, "abc", 3), 0, "another file");
    cr_assert_eq(pwrite(ro, "x", 1, 0), -1);
    cr_assert_eq(store_reopen_ro(&st, 1 << 20), -ENOENT);
    close(ro);
    close(fd);
    close_dir(&st, dir);
}

Test(store, allocation_piece_follows_the_page_kind)
{
    struct store none = { .huge = STORE_HUGE_NONE }, within = { .huge = STORE_HUGE_WITHIN_SIZE },
                 always = { .huge = STORE_HUGE_ALWAYS };
    cr_assert_eq(store_round(&none, 3 * MiB + 1), 3 * MiB + 1);
    cr_assert_eq(store_round(&within, MiB), MiB, "small buffers keep small pages");
    cr_assert_eq(store_round(&within, MiB + 1), 2 * MiB);
    cr_assert_eq(store_round(&within, 5 * MiB), 6 * MiB);
    cr_assert_eq(store_round(&always, 4096), 2 * MiB, "huge=always gives even small files a huge page");
    cr_assert_str_eq(store_kind(&within), "tmpfile-hugepages");
}

Test(store, hugepages_off_or_memfd_mounts_nothing)
{
    struct options o = { .pool_dir = (char *)"/dev/shm", .socket_path = (char *)"/tmp/x.sock",
                         .pool_size = 64 * MiB, .pool_hugepages = OPTIONS_HUGE_NO };
    cr_assert_eq(store_setup_hugepages(&o), 0);
    o.pool_hugepages = OPTIONS_HUGE_YES;
    o.memfd = true;
    cr_assert_eq(store_setup_hugepages(&o), 0);
    cr_assert_eq(store_detect_huge("/dev/shm"), STORE_HUGE_NONE, "this process mounted over /dev/shm");
}

/* detect_child: in its own mount namespace, mounts a tmpfs with opts and reports what
 * store_detect_huge sees in it (exit status: the enum, or 100+ on a setup failure). */
static int detect_child(const char *opts)
{
    char dir[] = "/tmp/shmref-test-store-mnt-XXXXXX";
    if (!mkdtemp(dir))
        return 100;
    pid_t pid = fork();
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            _exit(101);
        if (mount("t", dir, "tmpfs", 0, opts) < 0)
            _exit(102);
        _exit(store_detect_huge(dir));
    }
    int st;
    waitpid(pid, &st, 0);
    rmdir(dir);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 103;
}

Test(store, detects_huge_page_tmpfs)
{
    if (geteuid() != 0)
        cr_skip_test("mounting a tmpfs needs root");
    cr_assert_eq(detect_child("huge=within_size"), STORE_HUGE_WITHIN_SIZE);
    cr_assert_eq(detect_child("huge=always"), STORE_HUGE_ALWAYS);
    cr_assert_eq(detect_child("huge=never"), STORE_HUGE_NONE);
}

/* A memfd is mode 0600 (not memfd_create's 0777) and sealed against shrink and grow from
 * birth; store_seal_write adds F_SEAL_WRITE, after which it is not intact any more (never
 * recycled); a tmpfile store cannot seal. */
Test(store, memfd_is_private_size_sealed_and_write_sealable)
{
    struct store st;
    char dir[64];
    int fd = -1;
    open_dir(&st, dir, true);
    cr_assert_eq(store_create(&st, 8192, &fd), 0);
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0600);
    cr_assert_eq(fcntl(fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW);
    cr_assert_eq(ftruncate(fd, 4096), -1);
    cr_assert_eq(fallocate(fd, 0, 0, 16384), -1);
    cr_assert(store_intact(&st, fd, 8192));
    cr_assert_eq(store_seal_write(&st, fd), 0);
    cr_assert_eq(fcntl(fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
    cr_assert_eq(pwrite(fd, "x", 1, 0), -1);
    cr_assert_not(store_intact(&st, fd, 8192), "a write-sealed memfd must not be recycled");
    close(fd);
    close_dir(&st, dir);
    open_dir(&st, dir, false);
    cr_assert_eq(store_create(&st, 8192, &fd), 0);
    cr_assert_eq(store_seal_write(&st, fd), -EOPNOTSUPP);
    close(fd);
    close_dir(&st, dir);
}
