/* server.h: the daemon's state and its listening socket. Private to the daemon.
 * One libuv loop owns everything here; nothing is touched from another thread. */
#ifndef SHMREFD_SERVER_H
#define SHMREFD_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "conn.h"
#include "options.h"
#include "pool.h"
#include "proto.h"
#include "quota.h"
#include "registry.h"

struct conn;

struct server_counters {
    uint64_t connections, leases, publishes, acquires, releases;
    uint64_t reclaimed_leases, reclaimed_clients;
    uint64_t refused_quota, refused_space, refused_limit, refused_other, refused_access;
    uint64_t protocol_errors, slow_clients;
};

struct server {
    uv_loop_t *loop;
    struct options *opt;
    int listen_fd;
    bool listening, stopping;
    bool failed;               /* the listening socket broke: the daemon exits 1 */
    bool created_dir;          /* server_listen_path made the socket's directory */
    uv_poll_t listen_poll;
    uv_timer_t accept_retry;   /* re-arms accepting after EMFILE */
    uv_timer_t housekeeping;   /* once a second: connections that never said hello */
    struct pool *pool;
    struct quota *quota;
    struct registry *reg;
    struct conn *conns;        /* all open connections */
    uint32_t nconns;
    uint64_t next_conn_id;
    uint64_t started_ms;
    struct server_counters counters;
    uint8_t rbuf[CONN_BATCH][PROTO_MAX_REQUEST + 1]; /* one batch (+1 to see truncation) */
    uint8_t wbuf[PROTO_MAX_REPLY];       /* one encoded reply */
};

/* server_init: sets up the pool, quotas and registry from opt. Logs and returns -errno
 * on failure (the pool message names the bytes required and available). */
int server_init(struct server *s, uv_loop_t *loop, struct options *opt);
/* server_listen_path: binds a SOCK_SEQPACKET socket at opt->socket_path (mode
 * opt->socket_mode), replacing a stale one, refusing a live one. */
int server_listen_path(struct server *s);
/* server_listen_fd: serves on an already-listening socket (socket activation). */
int server_listen_fd(struct server *s, int fd);
/* server_apply_limits: (re)applies quotas, per-uid quotas and limits from s->opt. */
int server_apply_limits(struct server *s);
/* server_stop: stops accepting, closes every connection, ends retentions. The loop then
 * runs dry; call server_free after uv_run returns. */
void server_stop(struct server *s);
void server_free(struct server *s);

#endif
