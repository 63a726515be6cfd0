/* SPDX-License-Identifier: MIT */
/* cgroup.c: see cgroup.h. Reads /proc/self/cgroup and /proc/self/mountinfo, then the
 * limit files from the process's cgroup directory up to the hierarchy's mount point. */
#include "cgroup.h"
#include "mountinfo.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits at or above this are "no limit" (v1 reports PAGE_COUNTER_MAX pages as bytes). */
#define UNLIMITED (UINT64_C(1) << 62)

/* own_path: this process's path in the v1 hierarchy with the memory controller (*v2 =
 * false), else in the v2 hierarchy (*v2 = true). */
static int own_path(char *ret, size_t len, bool *v2)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return -errno;
    char line[4096], unified[4096] = "";
    bool v1 = false;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *ctl = c1 + 1, *path = c2 + 1;
        if (strcmp(ctl, "") == 0 && strncmp(line, "0", 2) == 0)
            snprintf(unified, sizeof(unified), "%s", path);
        for (char *tok = strtok((char *)ctl, ","); tok; tok = strtok(NULL, ","))
            if (strcmp(tok, "memory") == 0) {
                snprintf(ret, len, "%s", path);
                v1 = true;
            }
    }
    fclose(f);
    if (v1) {
        *v2 = false;
        return 0;
    }
    if (!unified[0])
        return -ENOENT;
    snprintf(ret, len, "%s", unified);
    *v2 = true;
    return 0;
}

/* mount_of: the mount point and root of the hierarchy (cgroup2, or cgroup with the
 * memory option). */
static int mount_of(bool v2, char *ret_point, char *ret_root, size_t len)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -errno;
    struct mountinfo_entry *e = malloc(sizeof(*e));
    int r = e ? -ENOENT : -ENOMEM;
    while (r == -ENOENT && mountinfo_next(f, e)) {
        bool match = v2 ? strcmp(e->fstype, "cgroup2") == 0 : strcmp(e->fstype, "cgroup") == 0;
        if (match && !v2) {
            match = false;
            for (char *tok = strtok(e->super, ","); tok; tok = strtok(NULL, ","))
                match |= strcmp(tok, "memory") == 0;
        }
        if (!match)
            continue;
        snprintf(ret_point, len, "%s", e->point);
        snprintf(ret_root, len, "%s", e->root);
        r = 0;
    }
    free(e);
    fclose(f);
    return r;
}

/* read_u64: a limit file's number; "max" is no limit. */
static int read_u64(const char *dir, const char *file, uint64_t *ret)
{
    char p[4200], buf[64];
    if ((size_t)snprintf(p, sizeof(p), "%s/%s", dir, file) >= sizeof(p))
        return -ENAMETOOLONG;
    FILE *f = fopen(p, "re");
    if (!f)
        return -errno;
    bool ok = fgets(buf, sizeof(buf), f) != NULL;
    fclose(f);
    if (!ok)
        return -EIO;
    if (strncmp(buf, "max", 3) == 0) {
        *ret = UINT64_MAX;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || end == buf)
        return -EINVAL;
    *ret = v;
    return 0;
}

int cgroup_memory_read(struct cgroup_memory *ret)
{
    char path[4096], point[4096], root[4096];
    bool v2 = false;
    int r = own_path(path, sizeof(path), &v2);
    if (r < 0)
        return r == -ENOENT ? 0 : r;
    if ((r = mount_of(v2, point, root, sizeof(point))) < 0)
        return 0; /* the hierarchy is not mounted here: nothing to read */
    /* The path is relative to the cgroup namespace's root, which is the mount's root
     * inside a container; strip the mount root if the path carries it. */
    const char *rel = path;
    size_t rl = strlen(root);
    if (strcmp(root, "/") != 0 && strncmp(path, root, rl) == 0 && (path[rl] == '/' || path[rl] == '\0'))
        rel = path + rl;
    char dir[sizeof(ret->path)];
    if ((size_t)snprintf(dir, sizeof(dir), "%s%s", point, strcmp(rel, "/") == 0 ? "" : rel) >= sizeof(dir))
        return 0;
    const char *limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
    const char *usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
    uint64_t best = UINT64_MAX;
    size_t pl = strlen(point);
    for (;;) {
        uint64_t v;
        if (read_u64(dir, limit_file, &v) == 0 && v < best && v < UNLIMITED) {
            best = v;
            memcpy(ret->path, dir, sizeof(dir));
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= pl || !slash || slash < dir + pl)
            break;
        *slash = '\0';
    }
    if (best == UINT64_MAX)
        return 0;
    ret->limit = best;
    if (read_u64(ret->path, usage_file, &ret->usage) < 0)
        ret->usage = 0;
    return 1;
}
