/* SPDX-License-Identifier: MIT */
/* access.c: see access.h. */
#include "access.h"

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

static bool in_list(const struct options_list *l, uint32_t id)
{
    for (unsigned i = 0; i < l->n; i++)
        if (l->v[i] == id)
            return true;
    return false;
}

static int64_t operator_uid = -1; /* -1: not set (the current uid) */

void access_set_operator(uid_t uid)
{
    operator_uid = uid;
}

bool access_operator(uid_t uid)
{
    return uid == 0 || (int64_t)uid == (operator_uid == -1 ? (int64_t)geteuid() : operator_uid);
}

bool access_allowed(const struct options *o, const struct ucred *cred, int fd)
{
    if (o->allow_uids.n == 0 && o->allow_gids.n == 0)
        return true;
    if (access_operator(cred->uid))
        return true;
    if (in_list(&o->allow_uids, cred->uid) || in_list(&o->allow_gids, cred->gid))
        return true;
    gid_t groups[256];
    socklen_t len = sizeof(groups);
    if (o->allow_gids.n && getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
        for (socklen_t i = 0; i < len / sizeof(gid_t); i++)
            if (in_list(&o->allow_gids, groups[i]))
                return true;
    return false;
}

/* overflow_uid: the uid that stands for unmapped ones, or -1 when this user namespace
 * maps all 2^32 - 1 uids (the initial one) and no peer can be unmapped. Read once. */
static int64_t overflow_uid(void)
{
    static int64_t cached = -2;
    if (cached != -2)
        return cached;
    unsigned long long first, lower, count, total = 0;
    FILE *f = fopen("/proc/self/uid_map", "re");
    if (f) {
        while (fscanf(f, "%llu %llu %llu", &first, &lower, &count) == 3)
            total += count;
        fclose(f);
    }
    cached = -1;
    if (total < 4294967295ULL) {
        unsigned long long o = 65534;
        if ((f = fopen("/proc/sys/kernel/overflowuid", "re"))) {
            if (fscanf(f, "%llu", &o) != 1)
                o = 65534;
            fclose(f);
        }
        cached = (int64_t)o;
    }
    return cached;
}

bool access_unmapped(const struct ucred *cred)
{
    return (int64_t)cred->uid == overflow_uid();
}
