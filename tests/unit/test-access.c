/* SPDX-License-Identifier: MIT */
/* test-access.c: who may connect (daemon/access.c), from credentials and, for
 * supplementary groups, SO_PEERGROUPS of a real socket whose peer is a child process
 * that set its groups (the test runs as root, as the suite does). */
#include <criterion/criterion.h>

#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "access.h"

static struct options with_lists(uint32_t *uids, unsigned nu, uint32_t *gids, unsigned ng)
{
    struct options o = { 0 };
    o.allow_uids = (struct options_list){ uids, nu };
    o.allow_gids = (struct options_list){ gids, ng };
    return o;
}

Test(access, no_lists_allow_everyone)
{
    struct options o = { 0 };
    struct ucred c = { .pid = 1, .uid = 4242, .gid = 4242 };
    cr_assert(access_allowed(&o, &c, -1));
}

Test(access, lists_decide_but_root_and_self_always_may)
{
    uint32_t uids[] = { 1000 }, gids[] = { 2000 };
    struct options o = with_lists(uids, 1, gids, 1);
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    struct ucred member = { .pid = 1, .uid = 1000, .gid = 9 }, group = { .pid = 1, .uid = 7, .gid = 2000 };
    struct ucred other = { .pid = 1, .uid = 7, .gid = 9 }, root = { .pid = 1, .uid = 0, .gid = 9 };
    struct ucred self = { .pid = 1, .uid = geteuid(), .gid = 9 };
    cr_assert(access_allowed(&o, &member, sv[0]));
    cr_assert(access_allowed(&o, &group, sv[0]), "primary gid in allow-groups");
    cr_assert(access_allowed(&o, &root, sv[0]));
    cr_assert(access_allowed(&o, &self, sv[0]));
    if (geteuid() != 7)
        cr_assert_not(access_allowed(&o, &other, sv[0]), "a stranger got in");
    close(sv[0]);
    close(sv[1]);
}

/* A supplementary group counts, seen through SO_PEERGROUPS of the connecting process. */
Test(access, supplementary_groups_of_the_peer)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to set a child's groups");
    char dir[] = "/tmp/shmref-test-access-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/s", dir);
    int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(l, 4), 0);
    pid_t pid = fork();
    if (pid == 0) {
        gid_t g[] = { 4321 };
        if (setgroups(1, g) < 0)
            _exit(2);
        int c = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        if (connect(c, (struct sockaddr *)&sa, sizeof(sa)) < 0)
            _exit(3);
        char b;
        (void)!read(c, &b, 1); /* until the parent is done */
        _exit(0);
    }
    int fd = accept(l, NULL, NULL);
    cr_assert_geq(fd, 0);
    uint32_t in[] = { 4321 }, out[] = { 4322 };
    struct options yes = with_lists(NULL, 0, in, 1), no = with_lists(NULL, 0, out, 1);
    struct ucred c = { .pid = pid, .uid = 7, .gid = 9 };
    cr_assert(access_allowed(&yes, &c, fd), "a supplementary group was not seen");
    cr_assert_not(access_allowed(&no, &c, fd));
    close(fd);
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
    close(l);
    unlink(sa.sun_path);
    rmdir(dir);
}
