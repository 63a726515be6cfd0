/* access.c: see access.h. */
#include "access.h"

#include <stdint.h>
#include <unistd.h>

static bool in_list(const struct options_list *l, uint32_t id)
{
    for (unsigned i = 0; i < l->n; i++)
        if (l->v[i] == id)
            return true;
    return false;
}

bool access_allowed(const struct options *o, const struct ucred *cred, int fd)
{
    if (o->allow_uids.n == 0 && o->allow_gids.n == 0)
        return true;
    if (cred->uid == 0 || cred->uid == geteuid())
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
