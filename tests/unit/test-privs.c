/* SPDX-License-Identifier: MIT */
/* test-privs.c: giving up privilege (daemon/privs.c), for real, in a forked child running
 * as root: after privs_drop the child is the named user, holds no capability in any set
 * and has no_new_privs, as /proc/self/status shows. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "privs.h"

Test(privs, lookup)
{
    uid_t uid = 1;
    gid_t gid = 1;
    cr_assert_eq(privs_lookup("root", &uid, &gid), 0);
    cr_assert_eq(uid, 0);
    cr_assert_eq(gid, 0);
    cr_assert_eq(privs_lookup("no-such-user-shmref", &uid, &gid), -ENOENT);
}

Test(privs, raise_nofile_to_the_hard_limit)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    unsigned long n = privs_raise_nofile();
    cr_assert_eq(n, (unsigned long)rl.rlim_max);
    getrlimit(RLIMIT_NOFILE, &rl);
    cr_assert_eq(rl.rlim_cur, rl.rlim_max);
}

/* status_line: the value of key in /proc/self/status ("" if absent). */
static void status_line(const char *key, char *val, size_t cap)
{
    char line[256];
    size_t kl = strlen(key);
    FILE *f = fopen("/proc/self/status", "r");
    val[0] = '\0';
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            snprintf(val, cap, "%s", line + kl + 1 + strspn(line + kl + 1, " \t"));
            val[strcspn(val, "\n")] = '\0';
        }
    if (f)
        fclose(f);
}

static int drop_child(void)
{
    char why[256], v[128];
    if (privs_drop("nobody", why, sizeof(why)) < 0) {
        fprintf(stderr, "privs_drop: %s\n", why);
        return 10;
    }
    if (getuid() != 65534 || geteuid() != 65534 || getgid() != 65534)
        return 11;
    const char *sets[] = { "CapInh", "CapPrm", "CapEff", "CapAmb" };
    for (int i = 0; i < 4; i++) {
        status_line(sets[i], v, sizeof(v));
        if (strcmp(v, "0000000000000000") != 0)
            return 20 + i;
    }
    status_line("CapBnd", v, sizeof(v));
    if (strcmp(v, "0000000000000000") != 0)
        return 30;
    status_line("NoNewPrivs", v, sizeof(v));
    if (strcmp(v, "1") != 0)
        return 31;
    /* and there is no way back */
    if (setuid(0) == 0)
        return 32;
    return 0;
}

Test(privs, drop_leaves_nothing)
{
    if (geteuid() != 0)
        cr_skip_test("needs root");
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(drop_child());
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "child died: %#x", st);
    cr_assert_eq(WEXITSTATUS(st), 0, "check %d failed", WEXITSTATUS(st));
}

Test(privs, unknown_user_is_refused_with_why)
{
    if (geteuid() != 0)
        cr_skip_test("needs root");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char why[256];
        int r = privs_drop("no-such-user-shmref", why, sizeof(why));
        _exit(r == -ENOENT && strstr(why, "unknown user") ? 0 : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
