/* SPDX-License-Identifier: MIT */
/* test-mountinfo.c: daemon/mountinfo.c: escapes decoded after splitting, so a mount point
 * with a space is found; the longest (and, of equal ones, the last) mount point wins;
 * and the real /proc/self/mountinfo holds "/". */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mountinfo.h"

Test(mountinfo, unescape)
{
    char s[] = "/run/pool\\040dir\\011x\\134y\\012";
    mountinfo_unescape(s);
    cr_expect_str_eq(s, "/run/pool dir\tx\\y\n");
    char t[] = "\\04no\\999";
    mountinfo_unescape(t);
    cr_expect_str_eq(t, "\\04no\\999", "only three octal digits are an escape");
}

Test(mountinfo, parse_keeps_a_space_in_the_mount_point)
{
    struct mountinfo_entry e;
    const char *line = "36 35 0:40 / /srv/my\\040pool rw,nosuid shared:7 - tmpfs shmref-test "
                       "rw,size=65536k,huge=always\n";
    cr_assert_eq(mountinfo_parse(line, &e), 0);
    cr_expect_str_eq(e.root, "/");
    cr_expect_str_eq(e.point, "/srv/my pool");
    cr_expect_str_eq(e.fstype, "tmpfs");
    cr_expect_str_eq(e.super, "rw,size=65536k,huge=always");
    cr_expect_eq(mountinfo_parse("36 35 0:40 / /x rw\n", &e), -EINVAL, "no separator");
    cr_expect_eq(mountinfo_parse("", &e), -EINVAL);
}

static void write_file(char *path, const char *text)
{
    strcpy(path, "/tmp/shmref-test-mountinfo-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

Test(mountinfo, find_picks_the_longest_and_the_last)
{
    char path[64];
    write_file(path,
               "1 0 0:1 / / rw - ext4 /dev/sda1 rw\n"
               "2 1 0:2 / /dev/shm rw - tmpfs tmpfs rw\n"
               "garbage line\n"
               "3 1 0:3 / /srv/my\\040pool rw - tmpfs a rw,huge=within_size\n"
               "4 1 0:4 / /srv/my\\040pool rw - tmpfs b rw,huge=always\n"
               "5 1 0:5 / /srv/my rw - xfs c rw\n");
    struct mountinfo_entry e;
    cr_assert_eq(mountinfo_find(path, "/srv/my pool/sub", &e), 0);
    cr_expect_str_eq(e.point, "/srv/my pool");
    cr_expect_str_eq(e.super, "rw,huge=always", "the later of two mounts on one point is on top");
    cr_assert_eq(mountinfo_find(path, "/srv/my pool", &e), 0);
    cr_expect_str_eq(e.fstype, "tmpfs");
    cr_assert_eq(mountinfo_find(path, "/srv/my", &e), 0);
    cr_expect_str_eq(e.fstype, "xfs");
    cr_assert_eq(mountinfo_find(path, "/srv/myx", &e), 0);
    cr_expect_str_eq(e.point, "/", "a mount point is a path prefix, not a string prefix");
    cr_assert_eq(mountinfo_find(path, "/dev/shm/a", &e), 0);
    cr_expect_str_eq(e.point, "/dev/shm");
    unlink(path);
    cr_expect_eq(mountinfo_find(path, "/", &e), -ENOENT, "a file that is gone");
}

Test(mountinfo, the_real_table_has_a_root)
{
    struct mountinfo_entry e;
    cr_assert_eq(mountinfo_find(NULL, "/", &e), 0);
    cr_expect_str_eq(e.point, "/");
}
