/* SPDX-License-Identifier: MIT */
/* rawclient.c: see rawclient.h. */
#include "rawclient.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"

int rawclient_connect(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int rawclient_send(int fd, const void *msg, size_t len)
{
    ssize_t n;
    do
        n = send(fd, msg, len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    return (size_t)n == len ? 0 : -EMSGSIZE;
}

int rawclient_send_fds(int fd, const void *msg, size_t len, const int *fds, unsigned nfds)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(64 * sizeof(int))];
    } ctl;
    if (nfds > 64)
        return -EINVAL;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (nfds) {
        mh.msg_control = ctl.b;
        mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
    }
    ssize_t n;
    do
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    return (size_t)n == len ? 0 : -EMSGSIZE;
}

/* recv_msg: one recvmsg, without waiting: the first max fds that came go to fds (in
 * order; *ret_n says how many, when not NULL), the rest are closed. */
static ssize_t recv_msg(int fd, uint8_t *buf, size_t cap, int *fds, unsigned max, unsigned *ret_n)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(64 * sizeof(int))];
    } ctl;
    unsigned got = 0;
    struct iovec iov = { .iov_base = buf, .iov_len = cap };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                         .msg_controllen = sizeof(ctl.b) };
    ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return -errno;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (got < max)
                fds[got++] = f;
            else
                close(f);
        }
    }
    if (ret_n)
        *ret_n = got;
    if (mh.msg_flags & MSG_CTRUNC)
        return -ENOBUFS;
    return n;
}

ssize_t rawclient_recv(int fd, uint8_t *buf, size_t cap, int *ret_fd)
{
    if (ret_fd)
        *ret_fd = -1;
    ssize_t n = recv_msg(fd, buf, cap, ret_fd, ret_fd ? 1 : 0, NULL);
    if (n == -ECONNRESET) {
        n = recv_msg(fd, buf, cap, ret_fd, ret_fd ? 1 : 0, NULL);
        if (n < 0)
            n = 0;
    }
    return n;
}

ssize_t rawclient_recv_fds(int fd, uint8_t *buf, size_t cap, int *fds, unsigned max, unsigned *ret_n, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    *ret_n = 0;
    if (poll(&p, 1, ms) <= 0)
        return -ETIMEDOUT;
    ssize_t n = recv_msg(fd, buf, cap, fds, max, ret_n);
    if (n == -ECONNRESET) {
        n = recv_msg(fd, buf, cap, fds, max, ret_n);
        if (n < 0)
            n = 0;
    }
    return n;
}

ssize_t rawclient_recv_wait(int fd, uint8_t *buf, size_t cap, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    if (poll(&p, 1, ms) <= 0)
        return -ETIMEDOUT;
    return rawclient_recv(fd, buf, cap, NULL);
}

ssize_t rawclient_call(int fd, const void *msg, size_t len, uint8_t *rep, size_t cap, int ms)
{
    int r = rawclient_send(fd, msg, len);
    if (r == -EPIPE || r == -ECONNRESET)
        return 0;
    if (r < 0)
        return r;
    return rawclient_recv_wait(fd, rep, cap, ms);
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

int rawclient_closed(int fd, int ms)
{
    long deadline = now_ms() + ms;
    uint8_t buf[PROTO_MAX_REPLY];
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        long left = deadline - now_ms();
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            return 0;
        ssize_t n = recv_msg(fd, buf, sizeof(buf), NULL, 0, NULL);
        if (n == 0 || n == -ECONNRESET)
            return 1;
    }
}
