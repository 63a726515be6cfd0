/* SPDX-License-Identifier: MIT */
/* server.h: the daemon's state, its listening socket, accepting and housekeeping. Private to the daemon.
 * One libuv loop owns everything here; nothing is touched from another thread. */
#ifndef SHMREFD_SERVER_H
#define SHMREFD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "broker.h"
#include "counters.h"
#include "options.h"
#include "pool.h"
#include "quota.h"
#include "registry.h"
#include "session.h"

#define SERVER_RESERVED_SLOTS 8  /* connections above --max-clients for the operators (access_operator) */
#define SERVER_FDS_PER_CONN 64    /* fd-carrying replies one connection may leave unread */

struct server {
    uv_loop_t *loop;
    struct options *opt;
    int listen_fd;
    bool listening, stopping;
    bool failed;               /* the listening socket broke: the daemon exits 1 */
    bool created_dir;          /* server_listen_path made the socket's directory */
    bool bound;                /* server_listen_path bound the socket file at opt->socket_path */
    dev_t bound_dev;           /* and this is its inode, taken right after bind: at exit the */
    ino_t bound_ino;           /* path is removed only if it is still that file */
    uv_poll_t listen_poll;
    uv_timer_t accept_retry;   /* re-arms accepting after EMFILE */
    uv_timer_t housekeeping;   /* once a second: connections that never said hello */
    struct pool *pool;
    struct quota *quota;
    struct registry *reg;
    struct broker broker;      /* the lease lifecycle over pool, quota and registry */
    struct session_env sessions; /* all connections (sessions.n of them) */
    struct tenantdirs tenantdirs; /* the ledgers of same-tenant handoffs, per uid */
    uint64_t started_ms;
    uint64_t idle_since_ms;    /* housekeeping: when the daemon last had a connection or a buffer in use */
    struct counters counters;
};

/* server_init: sets up the pool, quotas and registry from opt. Logs and returns -errno
 * on failure (the pool message names the bytes required and available). */
int server_init(struct server *s, uv_loop_t *loop, struct options *opt);
/* server_listen_path: binds a SOCK_SEQPACKET socket at opt->socket_path (mode
 * opt->socket_mode), replacing a stale one, refusing a live one. */
int server_listen_path(struct server *s);
/* server_remove_socket: removes the socket file server_listen_path bound, if the path
 * still names that file (same st_dev and st_ino): never a socket the service manager
 * passed, nor one another daemon bound there since. Logs when it cannot. Once. */
void server_remove_socket(struct server *s);
/* server_warn_unremovable: after the privilege drop, warns if the user the daemon now
 * serves as will not be able to remove its socket at exit (server_remove_socket). */
void server_warn_unremovable(struct server *s);
/* server_listen_fd: serves on an already-listening socket (socket activation). */
int server_listen_fd(struct server *s, int fd);
/* server_apply_limits: (re)applies quotas, per-uid quotas and limits from s->opt. */
int server_apply_limits(struct server *s);
/* server_stop: stops accepting, closes every connection, ends retentions. The loop then
 * runs dry; call server_free after uv_run returns. */
void server_stop(struct server *s);
void server_free(struct server *s);

#endif
