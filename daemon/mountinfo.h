/* SPDX-License-Identifier: MIT */
/* mountinfo.h: /proc/self/mountinfo, read once the right way: fields split on spaces,
 * then every path's octal escapes (\040 for a space, \011, \012, \134) decoded, so a
 * mount point with a space in its name is found like any other. Private to the daemon;
 * shared by store.c (which tmpfs holds the pool, and with which huge= option) and
 * cgroup.c (where the cgroup hierarchy is mounted). */
#ifndef SHMREFD_MOUNTINFO_H
#define SHMREFD_MOUNTINFO_H

#include <stdio.h>

struct mountinfo_entry {
    char root[4096];        /* the mount's root inside its filesystem, unescaped */
    char point[4096];       /* where it is mounted, unescaped */
    char fstype[64];
    char super[1024];       /* the superblock options (huge=, size=, memory ...) */
};

/* mountinfo_unescape: mountinfo's octal escapes decoded in place. */
void mountinfo_unescape(char *s);

/* mountinfo_parse: one mountinfo line into *ret. Returns 0, or -EINVAL for a line that
 * is not "id parent maj:min root point opts [optional...] - fstype source super". */
int mountinfo_parse(const char *line, struct mountinfo_entry *ret);

/* mountinfo_next: the next well-formed entry of f (malformed lines are skipped).
 * Returns 1 with *ret, or 0 at the end. */
int mountinfo_next(FILE *f, struct mountinfo_entry *ret);

/* mountinfo_find: the mount that holds the absolute, symlink-free path: the longest
 * mount point that is path or a parent of it (the last of equally long ones, the one
 * on top). file is the mountinfo to read (NULL: /proc/self/mountinfo). Returns 0 with
 * *ret, -ENOENT if no mount holds it, or -errno if file cannot be read. */
int mountinfo_find(const char *file, const char *path, struct mountinfo_entry *ret);

#endif
