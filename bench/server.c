/* SPDX-License-Identifier: MIT */
/* server.c: the server side of the benchmark, one process per row, spawned by the runner
 * as `shmref-bench --serve ROLE [SOCKET]` with its control socket on fd 3. It serves
 * until the runner closes the socket, then cleans up and exits 0 (non-zero on failure,
 * which the runner reports). Its heap buffers are warm and kept across calls. */
#include "bench.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define HEAP_SLOTS 4

static struct {
    void *p;
    size_t cap;
} heaps[HEAP_SLOTS];

void *srv_heap(int slot, size_t size)
{
    if (slot < 0 || slot >= HEAP_SLOTS)
        return NULL;
    if (size <= heaps[slot].cap && heaps[slot].p)
        return heaps[slot].p;
    payload_free(heaps[slot].p, heaps[slot].cap);
    heaps[slot].p = payload_alloc_warm(size);
    heaps[slot].cap = heaps[slot].p ? size : 0;
    return heaps[slot].p;
}

/* srv_echo: the bare SOCK_SEQPACKET round trip: each message comes back as it is, with
 * an fd attached if with_fd (the cost of SCM_RIGHTS, which every lease reply pays). */
int srv_echo(int fd, bool with_fd)
{
    char buf[256];
    int memfd = with_fd ? memfd_create("shmref-bench-echo", MFD_CLOEXEC) : -1;
    if (with_fd && memfd < 0)
        return -errno;
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0; /* the runner is done */
        struct iovec iov = { .iov_base = buf, .iov_len = (size_t)n };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
        if (with_fd) {
            mh.msg_control = ctl.b;
            mh.msg_controllen = sizeof(ctl.b);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
        }
        if (sendmsg(fd, &mh, MSG_NOSIGNAL) < 0)
            return -errno;
    }
}

int server_main(int argc, char **argv)
{
    const char *role = argc > 2 ? argv[2] : "";
    const char *socket = argc > 3 ? argv[3] : NULL;
    int fd = BENCH_CTL_FD, r;
    signal(SIGPIPE, SIG_IGN);
    if (!strcmp(role, "bytes"))
        r = srv_bytes(fd);
    else if (!strcmp(role, "base64"))
        r = srv_base64(fd);
    else if (!strcmp(role, "binref-fresh"))
        r = srv_binref_fresh(fd);
    else if (!strcmp(role, "binref-pool4"))
        r = srv_binref_pool4(fd);
    else if (!strcmp(role, "shmref-1copy") && socket)
        r = srv_shmref(fd, socket, false);
    else if (!strcmp(role, "shmref-0copy") && socket)
        r = srv_shmref(fd, socket, true);
    else if (!strncmp(role, "shmref-pubsub", 13) && socket)
        r = srv_shmref_pubsub(fd, socket, argc > 4 && !strcmp(argv[4], "full") ? 2 : strcmp(role + 13, "-notouch") ? 1 : 0);
    else if (!strcmp(role, "shm-pair"))
        r = srv_shm_pair(fd);
    else if (!strcmp(role, "table-floor"))
        r = srv_table_floor(fd);
    else if (!strcmp(role, "echo"))
        r = srv_echo(fd, false);
    else if (!strcmp(role, "echo-fd"))
        r = srv_echo(fd, true);
    else
        r = -EINVAL;
    if (r < 0)
        fprintf(stderr, "shmref-bench server (%s): %s\n", role, strerror(-r));
    return r < 0 ? 1 : 0;
}
