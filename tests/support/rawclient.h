/* SPDX-License-Identifier: MIT */
/* rawclient.h: a raw-protocol client for tests: a plain SOCK_SEQPACKET connection to a
 * shmrefd, messages sent and received as bytes (encode and decode them with proto/), fds
 * that replies carry kept or closed. Lets a test say what libshmref never would (junk,
 * floods, fds to the daemon). Plain C: returns >= 0 or -errno. */
#ifndef SHMREF_TEST_RAWCLIENT_H
#define SHMREF_TEST_RAWCLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* rawclient_connect: a connection to the socket at path, no hello. Returns the fd. */
int rawclient_connect(const char *path);

/* rawclient_send: one message, whole. Returns 0, or -errno (-EPIPE, -ECONNRESET: the
 * daemon has closed the connection). */
int rawclient_send(int fd, const void *msg, size_t len);

/* rawclient_send_fds: one message, whole, with nfds (0..64) fds attached (SCM_RIGHTS):
 * a hostile client's fds to the daemon, or a fake daemon's to a client. Returns 0 or
 * -errno as rawclient_send. */
int rawclient_send_fds(int fd, const void *msg, size_t len, const int *fds, unsigned nfds);

/* rawclient_recv: one waiting message, without waiting. The first fd that came along
 * goes to *ret_fd (when ret_fd is not NULL; else -1 there), every other one is closed.
 * Returns its length, 0 on EOF, -EAGAIN when nothing waits. When the daemon closes a
 * connection whose requests it left unread, the kernel reports ECONNRESET once, before
 * the replies still queued: those are read past it. */
ssize_t rawclient_recv(int fd, uint8_t *buf, size_t cap, int *ret_fd);

/* rawclient_recv_wait: rawclient_recv after waiting up to ms for something to read
 * (fds are closed); -ETIMEDOUT if nothing came. */
ssize_t rawclient_recv_wait(int fd, uint8_t *buf, size_t cap, int ms);

/* rawclient_recv_fds: rawclient_recv after waiting up to ms, keeping the first max fds
 * that came, in order, in fds (*ret_n of them); more are closed. -ENOBUFS when the
 * control data was truncated (more than 64 fds). */
ssize_t rawclient_recv_fds(int fd, uint8_t *buf, size_t cap, int *fds, unsigned max, unsigned *ret_n, int ms);

/* rawclient_call: send one message and wait up to ms for one reply. Returns the reply's
 * length, 0 if the daemon closed the connection, -ETIMEDOUT if nothing came. */
ssize_t rawclient_call(int fd, const void *msg, size_t len, uint8_t *rep, size_t cap, int ms);

/* rawclient_closed: whether the daemon closes fd within ms (EOF seen; replies drained). */
int rawclient_closed(int fd, int ms);

#endif
