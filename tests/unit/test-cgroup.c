/* SPDX-License-Identifier: MIT */
/* test-cgroup.c: daemon/cgroup.c reads the memory limit of the cgroup a process is in,
 * checked in a real child cgroup (v1 or v2) made for the test. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cgroup.h"

/* make_child_cgroup: a child of this process's memory cgroup with the given limit, in
 * ret (its directory); false if this machine has no writable memory cgroup. */
static bool make_child_cgroup(char *ret, size_t len, unsigned long long limit)
{
    char line[4096], own[4200] = "";
    bool v2 = false;
    FILE *f = fopen("/proc/self/cgroup", "re");
    cr_assert_not_null(f);
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c2 && strstr(c1, ":memory:") == c1) /* "N:memory:/path" */
            snprintf(own, sizeof(own), "/sys/fs/cgroup/memory%s", c2 + 1);
    }
    fclose(f);
    if (!own[0]) {
        f = fopen("/proc/self/cgroup", "re");
        while (fgets(line, sizeof(line), f))
            if (strncmp(line, "0::", 3) == 0) {
                line[strcspn(line, "\n")] = '\0';
                snprintf(own, sizeof(own), "/sys/fs/cgroup%s", line + 3);
                v2 = true;
            }
        fclose(f);
    }
    if (!own[0])
        return false;
    snprintf(ret, len, "%s/shmref-unit-%d", own, (int)getpid());
    if (mkdir(ret, 0755) < 0)
        return false;
    char p[8500];
    snprintf(p, sizeof(p), "%s/%s", ret, v2 ? "memory.max" : "memory.limit_in_bytes");
    f = fopen(p, "we");
    if (!f || fprintf(f, "%llu\n", limit) < 0 || fclose(f) != 0) {
        rmdir(ret);
        return false;
    }
    return true;
}

Test(cgroup, reads_the_limit_of_its_own_cgroup)
{
    char dir[4300];
    if (!make_child_cgroup(dir, sizeof(dir), 40ULL << 20))
        cr_skip_test("no writable memory cgroup here");
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        char p[8500];
        snprintf(p, sizeof(p), "%s/cgroup.procs", dir);
        FILE *f = fopen(p, "we");
        if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0)
            _exit(10);
        struct cgroup_memory cg;
        if (cgroup_memory_read(&cg) != 1)
            _exit(11);
        if (cg.limit != 40ULL << 20)
            _exit(12);
        if (strcmp(cg.path, dir) != 0)
            _exit(13);
        if (cg.usage == 0 || cg.usage > cg.limit)
            _exit(14);
        _exit(0);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    for (int i = 0; i < 50 && rmdir(dir) < 0; i++)
        usleep(20000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child check %d failed", WEXITSTATUS(st));
}
