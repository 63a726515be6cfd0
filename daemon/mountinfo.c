/* SPDX-License-Identifier: MIT */
/* mountinfo.c: see mountinfo.h. Fields are split before they are unescaped: an escaped
 * path never holds a raw space, so splitting first is what keeps a space in a path. */
#include "mountinfo.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void mountinfo_unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' && p[3] >= '0' &&
            p[3] <= '7') {
            *o++ = (char)((p[1] - '0') << 6 | (p[2] - '0') << 3 | (p[3] - '0'));
            p += 3;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
}

/* field: the next space-separated field of *p into out (cap bytes); false if none or
 * too long. */
static bool field(const char **p, char *out, size_t cap)
{
    const char *s = *p;
    while (*s == ' ')
        s++;
    size_t n = strcspn(s, " \n");
    if (n == 0 || n >= cap)
        return false;
    memcpy(out, s, n);
    out[n] = '\0';
    *p = s + n;
    return true;
}

int mountinfo_parse(const char *line, struct mountinfo_entry *ret)
{
    char skip[4096];
    const char *p = line;
    /* id parent major:minor */
    for (int i = 0; i < 3; i++)
        if (!field(&p, skip, sizeof(skip)))
            return -EINVAL;
    if (!field(&p, ret->root, sizeof(ret->root)) || !field(&p, ret->point, sizeof(ret->point)))
        return -EINVAL;
    const char *dash = strstr(p, " - ");
    if (!dash)
        return -EINVAL;
    p = dash + 3;
    if (!field(&p, ret->fstype, sizeof(ret->fstype)) || !field(&p, skip, sizeof(skip)) ||
        !field(&p, ret->super, sizeof(ret->super)))
        return -EINVAL;
    mountinfo_unescape(ret->root);
    mountinfo_unescape(ret->point);
    return 0;
}

int mountinfo_next(FILE *f, struct mountinfo_entry *ret)
{
    char line[16384];
    while (fgets(line, sizeof(line), f))
        if (mountinfo_parse(line, ret) == 0)
            return 1;
    return 0;
}

int mountinfo_find(const char *file, const char *path, struct mountinfo_entry *ret)
{
    FILE *f = fopen(file ? file : "/proc/self/mountinfo", "re");
    if (!f)
        return -errno;
    struct mountinfo_entry *e = malloc(sizeof(*e));
    if (!e) {
        fclose(f);
        return -ENOMEM;
    }
    size_t best = 0;
    int r = -ENOENT;
    while (mountinfo_next(f, e)) {
        size_t n = strlen(e->point);
        bool under = strncmp(path, e->point, n) == 0 && (path[n] == '/' || path[n] == '\0' || n == 1);
        if (under && n >= best) { /* the last of equally long mounts is the visible one */
            best = n;
            *ret = *e;
            r = 0;
        }
    }
    free(e);
    fclose(f);
    return r;
}
