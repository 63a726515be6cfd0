/* SPDX-License-Identifier: MIT */
/* transport.h: one client's socket: framing, the fd policy and the output queue. Private
 * to the daemon; knows nothing of leases (it includes neither broker nor registry).
 * Each SOCK_SEQPACKET message is one request; a message with fds attached, truncated, or
 * over the size limit is a framing fault (EPROTO reply, then closed). Replies that cannot
 * be sent at once are queued, and while any are queued the transport reads no new
 * messages, so a peer that does not read stalls only itself. Closing is asynchronous:
 * transport_close (or a fault) only marks the transport closing; its owner hears of it
 * in ops->on_close, from libuv's close callback, never inside another of its calls. A
 * second transport (a shared-memory ring) would offer the same four calls. */
#ifndef SHMREFD_TRANSPORT_H
#define SHMREFD_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#define TRANSPORT_MAX_QUEUED 256 /* replies queued before the peer counts as stuck */
#define TRANSPORT_BATCH 16       /* messages read by one recvmmsg */
#define TRANSPORT_MAX_FDS 32     /* fds attached to one message (a lease_many reply) */
/* Handling time of one connection per wake-up (and at most 4 batches): the request that
 * passes it is the last; the rest waits, in order, for the connection's next wake-up,
 * and every other connection ready now is served in between. 100 us is about 30 pings'
 * handling, so a wake-up's own cost (epoll_wait, recvmmsg: a few us) stays small, while
 * another client waits for 100 us plus one request, not for 64 requests (64 statuses
 * beside 12,000 leases: 6 ms). */
#define TRANSPORT_TURN_NS 100000u

struct transport;

/* Why a transport ended, as on_close reports it. */
enum transport_end {
    TRANSPORT_END_PEER,     /* EOF, reset or a broken pipe: the peer closed or died */
    TRANSPORT_END_LOCAL,    /* transport_close by the owner */
    TRANSPORT_END_SLOW,     /* the peer let TRANSPORT_MAX_QUEUED replies pile up */
    TRANSPORT_END_FRAMING,  /* fds from the peer, truncation, oversize (EPROTO was sent) */
    TRANSPORT_END_FAILED,   /* a send, receive or queueing error */
};

struct transport_ops {
    /* on_message: one whole message of len bytes (at most the max given to
     * transport_new). Never called once the transport is closing. */
    void (*on_message)(void *ctx, const uint8_t *data, size_t len);
    /* on_close: the socket is closed and nothing else will be called: the safe point for
     * the owner to release what it holds. why is NULL for a plain peer EOF; it is valid
     * during the call only. */
    void (*on_close)(void *ctx, enum transport_end end, const char *why);
    /* on_room: (may be NULL) the peer read replies or the queue drained: replies the owner
     * held back (transport_fd_room said no) may go now. */
    void (*on_room)(void *ctx);
};

/* transport_new: takes ownership of fd (non-blocking, CLOEXEC) and starts reading. On
 * failure fd is still the caller's and no callback is ever called. */
int transport_new(uv_loop_t *loop, int fd, size_t max_message, const struct transport_ops *ops, void *ctx,
                  struct transport **ret);

/* transport_send: sends len bytes, with fd attached if fd >= 0 (the fd stays the
 * caller's; a queued reply keeps a duplicate). Returns 0 when sent or queued, -EPIPE when
 * closing, or -errno after which the transport is closing (nothing is freed yet: the
 * caller may go on using its own objects). */
int transport_send(struct transport *t, const uint8_t *data, size_t len, int fd);
/* transport_send_fds: transport_send with nfds (at most TRANSPORT_MAX_FDS, else -EINVAL)
 * fds attached to the one message, in order; each counts as one fd in flight. */
int transport_send_fds(struct transport *t, const uint8_t *data, size_t len, const int *fds, unsigned nfds);
/* transport_send_fds_now: transport_send_fds, but only if it can go at once: -EAGAIN
 * (nothing sent, nothing queued, nothing counted) when replies are queued, a cap of fds in
 * flight is reached, the socket is full or the kernel refuses the fds (ETOOMANYREFS), so
 * the caller can send something else instead (a hello without its optional fds). */
int transport_send_fds_now(struct transport *t, const uint8_t *data, size_t len, const int *fds, unsigned nfds);

/* transport_fd_waits: how many times, daemon-wide, a reply began to wait because its send
 * met ETOOMANYREFS (the sending uid's fds in flight past RLIMIT_NOFILE). */
uint64_t transport_fd_waits(void);

/* transport_close: marks the transport closing (idempotent); on_close follows from the
 * loop with TRANSPORT_END_LOCAL and why (copied), or the first fault's reason. */
void transport_close(struct transport *t, const char *why);

bool transport_closing(const struct transport *t);

/* transport_set_fd_limits: caps on fd-carrying replies the peer has not read yet: at
 * per_transport of its own, or when *shared (a counter several transports add their
 * unread fds to, e.g. one uid's) reaches shared_cap, the transport reads no requests
 * until the peer has read its replies (SIOCOUTQ shows nothing unread). 0: no cap. A send
 * that meets ETOOMANYREFS (the daemon's fds in flight at the kernel's limit) is queued
 * and retried, never a reason to close. */
void transport_set_fd_limits(struct transport *t, unsigned per_transport, unsigned *shared, unsigned shared_cap);

/* transport_fds_unread: fds sent that the peer may not have received yet. */
unsigned transport_fds_unread(const struct transport *t);

/* transport_fd_room: whether a reply with nfds fds would go now (nothing queued, within
 * the caps and the daemon's budget). An owner with many replies to send (parked requests
 * served at once) sends while this holds and the rest on ops->on_room. */
bool transport_fd_room(struct transport *t, unsigned nfds);

/* transport_set_fd_budget: the daemon's fds in flight, all transports together, stay
 * below the kernel's limit for its user (RLIMIT_NOFILE, ETOOMANYREFS past it): past
 * soft, only a transport whose peer has read everything sends fds; nobody passes hard.
 * 0: no budget. */
void transport_set_fd_budget(unsigned soft, unsigned hard);
/* transport_fds_in_flight / transport_fd_budget: the daemon's fds in flight now, and the
 * soft budget (for status). */
unsigned transport_fds_in_flight(void);
unsigned transport_fd_budget(void);

#endif
