/* hugepool.c: see hugepool.h. huge=within_size rather than always: a file gets huge
 * pages only where its size covers them, so small buffers keep small pages and waste
 * nothing, while every buffer of 2 MiB and more is made of 2 MiB pages. */
#include "hugepool.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/mount.h>

enum hugepool_kind hugepool_detect(const char *dir)
{
    char real[PATH_MAX], line[4096], best_opts[1024] = "", best_type[64] = "";
    size_t best = 0;
    if (!realpath(dir, real))
        return HUGEPOOL_NONE;
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return HUGEPOOL_NONE;
    /* id parent major:minor root mountpoint options [optional...] - fstype source superopts */
    while (fgets(line, sizeof(line), f)) {
        char mnt[PATH_MAX], type[64], opts[1024];
        char *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 ||
            sscanf(dash + 3, "%63s %*s %1023s", type, opts) != 2)
            continue;
        size_t n = strlen(mnt);
        bool under = strncmp(real, mnt, n) == 0 && (real[n] == '/' || real[n] == '\0' || n == 1);
        if (under && n >= best) { /* the last of equally long mounts is the visible one */
            best = n;
            snprintf(best_type, sizeof(best_type), "%s", type);
            snprintf(best_opts, sizeof(best_opts), "%s", opts);
        }
    }
    fclose(f);
    if (strcmp(best_type, "tmpfs") != 0)
        return HUGEPOOL_NONE;
    if (strstr(best_opts, "huge=always"))
        return HUGEPOOL_ALWAYS;
    return strstr(best_opts, "huge=within_size") ? HUGEPOOL_WITHIN_SIZE : HUGEPOOL_NONE;
}

bool hugepool_can_mount(void)
{
    cap_t caps = cap_get_proc();
    cap_flag_value_t v = CAP_CLEAR;
    if (caps)
        cap_get_flag(caps, CAP_SYS_ADMIN, CAP_EFFECTIVE, &v);
    cap_free(caps);
    return v == CAP_SET;
}

int hugepool_mount(const char *dir, uint64_t bytes, uid_t uid, gid_t gid, char *why, size_t why_len)
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
    bytes = (bytes + HUGEPOOL_PAGE - 1) / HUGEPOOL_PAGE * HUGEPOOL_PAGE;
    snprintf(opts, sizeof(opts), "huge=within_size,size=%llu,mode=0700,uid=%u,gid=%u",
             (unsigned long long)bytes, (unsigned)uid, (unsigned)gid);
    if (mount("shmrefd-pool", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0) {
        int e = errno;
        snprintf(why, why_len, "mount -t tmpfs -o %s on %s: %s", opts, dir, strerror(e));
        return -e;
    }
    return 0;
}
