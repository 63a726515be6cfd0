/* SPDX-License-Identifier: MIT */
/* privs.c: see privs.h. Uses libcap rather than raw capset(2). */
#include "privs.h"

#include <errno.h>
#include <stdbool.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <sys/capability.h>

int privs_lookup(const char *user, uid_t *ret_uid, gid_t *ret_gid)
{
    struct passwd *pw = getpwnam(user);
    if (!pw)
        return -ENOENT;
    *ret_uid = pw->pw_uid;
    *ret_gid = pw->pw_gid;
    return 0;
}

/* mapped: whether id lies in one of the ranges of /proc/self/{uid,gid}_map (path). */
static bool mapped(const char *path, unsigned long id)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return errno == ENOENT; /* no user namespaces: everything is mapped */
    unsigned long inside, outside, count;
    bool found = false;
    while (!found && fscanf(f, "%lu %lu %lu", &inside, &outside, &count) == 3)
        found = id >= inside && id - inside < count;
    fclose(f);
    return found;
}

const char *privs_default_user(void)
{
    static const char *const names[] = { "shmrefd", "nobody" };
    if (geteuid() != 0)
        return NULL;
    char deny[16] = "";
    FILE *f = fopen("/proc/self/setgroups", "re");
    if (f) {
        if (!fgets(deny, sizeof(deny), f))
            deny[0] = '\0';
        fclose(f);
    }
    if (strncmp(deny, "deny", 4) == 0)
        return NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        uid_t uid;
        gid_t gid;
        if (privs_lookup(names[i], &uid, &gid) == 0)
            return uid != 0 && mapped("/proc/self/uid_map", uid) && mapped("/proc/self/gid_map", gid) ? names[i]
                                                                                                      : NULL;
    }
    return NULL;
}

unsigned long privs_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    return (unsigned long)rl.rlim_cur;
}

static int fail(char *why, size_t len, const char *what)
{
    int e = errno;
    snprintf(why, len, "%s: %s", what, strerror(e));
    return -e;
}

int privs_drop(const char *user, char *why, size_t why_len)
{
    bool root = geteuid() == 0;
    /* The bounding set can only shrink while we still hold CAP_SETPCAP. */
    if (CAP_IS_SUPPORTED(CAP_SETPCAP)) {
        for (cap_value_t c = 0; c <= CAP_LAST_CAP; c++)
            if (CAP_IS_SUPPORTED(c) && cap_drop_bound(c) < 0 && errno != EPERM && errno != EINVAL)
                return fail(why, why_len, "dropping the capability bounding set");
    }
    if (user && root) {
        uid_t uid;
        gid_t gid;
        if (privs_lookup(user, &uid, &gid) < 0) {
            snprintf(why, why_len, "unknown user '%s'", user);
            return -ENOENT;
        }
        if (setgroups(1, &gid) < 0)
            return fail(why, why_len, "setgroups");
        if (setresgid(gid, gid, gid) < 0)
            return fail(why, why_len, "setresgid");
        if (setresuid(uid, uid, uid) < 0)
            return fail(why, why_len, "setresuid");
    }
    cap_t none = cap_init(), now = cap_get_proc();
    if (!none || !now) {
        cap_free(none);
        cap_free(now);
        return fail(why, why_len, "cap_init");
    }
    /* Already empty (the service: no capabilities, not root): no capset(2), which the
     * unit's SystemCallFilter=~@privileged refuses. */
    int r = cap_compare(now, none) == 0 ? 0 : cap_set_proc(none);
    cap_free(none);
    cap_free(now);
    if (r < 0)
        return fail(why, why_len, "clearing capabilities");
    if (CAP_AMBIENT_SUPPORTED() && cap_reset_ambient() < 0)
        return fail(why, why_len, "clearing ambient capabilities");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return fail(why, why_len, "PR_SET_NO_NEW_PRIVS");
    return 0;
}
