/* SPDX-License-Identifier: MIT */
/* session.c: see session.h. Library code: it never logs and never aborts; failures are
 * -errno with a message in conn->errmsg. */
#include "session.h"
#include "autostart.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "handle.h"
#include "localhold.h"
#include "mapcache.h"
#include "paths.h"
#include "requests.h"
#include "stock.h"
#include "transport.h"
#include "units.h"

static int reconnect(shmref_conn *conn);
static int revive(shmref_conn *conn);

/* adopt: the first call in a forked child. Everything of the parent's connection is
 * forgotten without a word on its socket and nothing is unmapped: inherited handles stay
 * readable (their release only frees their memory here), undelivered completions and
 * requests in flight are the parent's. The child's own connection is made when it first
 * needs the daemon. Returns whether conn was adopted now. */
static bool adopt(shmref_conn *conn)
{
    pid_t me = client_pid();
    if (me == conn->pid)
        return false;
    handle_inherit(conn);
    localhold_unmap(conn); /* the parent's table: this process's copy of its mapping only */
    mapcache_abandon(&conn->cache); /* first: nothing below may unmap */
    stock_abandon(conn);
    pending_discard(conn);
    transport_discard(conn);
    if (conn->fd >= 0)
        close(conn->fd); /* this process's copy: the parent's connection is untouched */
    conn->fd = -1;
    conn->failed = 0;
    conn->abandoned = NULL;
    conn->fail_msg[0] = conn->late[0] = '\0';
    conn->features = 0;
    conn->pid = me;
    return true;
}

void client_adopt(shmref_conn *conn)
{
    adopt(conn);
}

int client_usable(shmref_conn *conn)
{
    adopt(conn);
    if (conn->failed && conn->idle_closed && !conn->closing)
        revive(conn); /* failed as before, with why, when it cannot */
    if (conn->fd < 0 && !conn->failed && !conn->abandoned && !conn->closing) {
        int r = reconnect(conn);
        if (r < 0)
            return r;
    }
    if (conn->abandoned)
        return client_fail(conn, -ENOTCONN, "connection abandoned after %s timed out (%d ms): connect again",
                           conn->abandoned, conn->timeout_ms);
    if (conn->failed)
        return client_fail(conn, conn->failed, "%s", conn->fail_msg);
    return 0;
}

int client_enter(shmref_conn *conn)
{
    int r = client_usable(conn);
    if (r < 0)
        return r;
    conn->errmsg[0] = '\0';
    /* Replies to the stock's refills are taken in when the stock runs dry (stock_take),
     * not looked for at every call: with only those out, a look would mostly find none
     * (a recvmsg that says EAGAIN, about 4 per 8 kB round trip); and refills not sent yet
     * stay for the next message (client_send_later). */
    r = conn->n_out > conn->stock.out || conn->q ? pending_intake(conn) : 0;
    if (r == 0)
        r = conn->failed;
    if (r < 0)
        return client_fail(conn, r, "%s", conn->fail_msg);
    if (conn->late[0]) { /* an error reply to a one-way request: said once, at the next call */
        snprintf(conn->errmsg, sizeof(conn->errmsg), "%s", conn->late);
        conn->late[0] = '\0';
    }
    return 0;
}

static void on_unmap(void *ctx, uint64_t buf_id, bool writable)
{
    client_forget(ctx, buf_id, writable);
}

/* The daemon user set by shmref_set_daemon_uid (-1: none): process-wide, read at connect. */
static _Atomic long daemon_uid_set = -1;

int shmref_set_daemon_uid(long uid)
{
    if (uid < -1 || uid > (long)UINT32_MAX - 1)
        return -EINVAL;
    atomic_store(&daemon_uid_set, uid);
    return 0;
}

/* user_uid: the uid of user name, or -1. */
static long user_uid(const char *name)
{
    struct passwd pw, *res = NULL;
    char buf[1024];
    if (getpwnam_r(name, &pw, buf, sizeof(buf), &res) != 0 || !res)
        return -1;
    return (long)res->pw_uid;
}

/* configured_uid: the daemon user this process was told of: shmref_set_daemon_uid, else
 * $SHMREF_DAEMON_UID (a number), else $SHMREF_DAEMON_USER (a name), else the packaged
 * daemon's user "shmrefd" if it exists; -1 if none. */
static long configured_uid(void)
{
    long set = atomic_load(&daemon_uid_set);
    if (set >= 0)
        return set;
    const char *e = getenv("SHMREF_DAEMON_UID");
    if (e && *e) {
        char *end;
        errno = 0;
        long v = strtol(e, &end, 10);
        if (!errno && !*end && v >= 0 && v < (long)UINT32_MAX)
            return v;
    }
    e = getenv("SHMREF_DAEMON_USER");
    return user_uid(e && *e ? e : "shmrefd");
}

/* check_peer: the daemon at the other end is one this client trusts: its peer
 * credentials (SO_PEERCRED, the uid that made the listening socket) are root, the
 * configured daemon user, or this process's own uid (a private daemon). */
static int check_peer(shmref_conn *conn, int fd, const char *path)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
        int e = errno;
        return client_fail(conn, -e, "cannot read the credentials of shmrefd at %s: %s", path, strerror(e));
    }
    if (cr.uid == 0 || cr.uid == getuid() || cr.uid == geteuid())
        return 0;
    long want = configured_uid(); /* only now: a user lookup may load NSS modules */
    if (want >= 0 && (long)cr.uid == want)
        return 0;
    char who[48] = "none";
    if (want >= 0)
        snprintf(who, sizeof(who), "%ld", want);
    return client_fail(conn, -EPERM, "refusing the daemon at %s: it runs as uid %u (pid %d); trusted are uid 0, "
                       "this process's uid %u and the daemon user (uid %s: $SHMREF_DAEMON_UID, $SHMREF_DAEMON_USER "
                       "or shmref_set_daemon_uid)", path, (unsigned)cr.uid, (int)cr.pid, (unsigned)getuid(), who);
}

/* connect_path: a non-blocking SOCK_SEQPACKET connection to path. A listener whose
 * backlog is full answers EAGAIN: retried until the deadline. */
static int connect_path(shmref_conn *conn, const char *path, int64_t deadline)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(sa.sun_path))
        return client_fail(conn, -ENAMETOOLONG, "socket path too long (%zu bytes, at most %zu): %s",
                           strlen(path), sizeof(sa.sun_path) - 1, path);
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
    {
        int e = errno;
        return client_fail(conn, -e, "socket: %s", strerror(e));
    }
    for (;;) {
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
            break;
        int e = errno;
        if (e == EINTR)
            continue;
        if (e == EAGAIN && (deadline < 0 || client_mono_ms() < deadline)) {
            struct timespec ts = { .tv_nsec = 2 * 1000 * 1000 };
            nanosleep(&ts, NULL);
            continue;
        }
        close(fd);
        if (e == EAGAIN)
            return client_fail(conn, -ETIMEDOUT, "connect: shmrefd at %s accepted no connection within %d ms",
                               path, conn->timeout_ms);
        return client_fail(conn, -e, "cannot connect to shmrefd at %s: %s%s", path, strerror(e),
                           e == ENOENT || e == ECONNREFUSED ? " (is shmrefd running?)" : "");
    }
    int r = check_peer(conn, fd, path);
    if (r < 0) {
        close(fd);
        return r;
    }
    conn->fd = fd;
    return 0;
}

/* default_timeout: $SHMREF_TIMEOUT_MS when it is a number of milliseconds. */
static int default_timeout(void)
{
    const char *e = getenv("SHMREF_TIMEOUT_MS");
    if (!e || !*e)
        return SHMREF_TIMEOUT_DEFAULT_MS;
    char *end;
    errno = 0;
    long v = strtol(e, &end, 10);
    if (errno || *end || v < 0 || v > INT32_MAX)
        return SHMREF_TIMEOUT_DEFAULT_MS;
    return (int)v;
}

#define CLIENT_MAX_REQUESTS 65536
#define CLIENT_MAX_QUEUE (8u << 20)

/* env_limit: $name as a number (units allowed: "4M") from 1 to max, else def. */
static uint64_t env_limit(const char *name, uint64_t def, uint64_t max)
{
    const char *e = getenv(name);
    uint64_t v;
    if (e && *e && units_parse(e, &v) == 0 && v >= 1 && v <= max)
        return v;
    return def;
}

int shmref_set_limits(shmref_conn *conn, long max_requests, long max_queue_bytes)
{
    if (!conn || max_requests < -1 || max_requests == 0 || max_queue_bytes < -1 || max_queue_bytes == 0 ||
        (max_requests > 0 && (unsigned long)max_requests > UINT32_MAX))
        return -EINVAL;
    conn->max_requests = max_requests > 0 ? (unsigned)max_requests
                                          : (unsigned)env_limit("SHMREF_MAX_REQUESTS", CLIENT_MAX_REQUESTS, UINT32_MAX);
    conn->max_queue_bytes = max_queue_bytes > 0 ? (size_t)max_queue_bytes
                                                : (size_t)env_limit("SHMREF_MAX_QUEUE", CLIENT_MAX_QUEUE, SIZE_MAX);
    return 0;
}

/* hello_take: the hello's reply: the connection's facts. */
static int hello_take(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds,
                      bool lost)
{
    (void)p;
    (void)lost;
    /* conn->version: what hello_as said; a daemon answers in it, or refuses. */
    bool agreed = rep->u.hello_reply.version == conn->version;
    if (agreed && conn->version == PROTO_VERSION && (rep->u.hello_reply.features & PROTO_FEAT_TABLE))
        localhold_setup(conn, fds, nfds); /* maps what it accepts: the fds are closed below */
    for (unsigned i = 0; i < nfds; i++)
        close(fds[i]);
    if (!agreed)
        return client_fail(conn, -EPROTONOSUPPORT, "shmrefd answered in protocol %u a hello of protocol %u",
                           (unsigned)rep->u.hello_reply.version, (unsigned)conn->version);
    conn->daemon_pid = (pid_t)rep->u.hello_reply.pid;
    conn->features = rep->u.hello_reply.features;
    conn->max_lease = rep->u.hello_reply.max_lease;
    return 0;
}

static const struct pending_ops hello_ops = { .take = hello_take };

/* hello_as: say hello in protocol version (PROTO_VERSION, or PROTO_VERSION_PREV with only
 * the features that version knew) and take the reply. */
static int hello_as(shmref_conn *conn, uint32_t version, int64_t deadline)
{
    char name[PROTO_MAX_NAME + 1] = "";
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, name, PROTO_MAX_NAME);
        close(fd);
        if (n > 0) {
            name[n] = '\0';
            name[strcspn(name, "\n")] = '\0';
        }
    }
    struct proto_msg req = { .op = PROTO_OP_HELLO };
    req.u.hello.version = conn->version = version;
    req.u.hello.features =
        PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE | PROTO_FEAT_SEALED | PROTO_FEAT_FOREIGN | PROTO_FEAT_BYE |
        PROTO_FEAT_PRIVATE | PROTO_FEAT_RETAIN;
    if (localhold_wanted()) /* $SHMREF_TABLE=0: every lease and acquire asks the daemon */
        req.u.hello.features |= PROTO_FEAT_TABLE;
    if (version != PROTO_VERSION)
        req.u.hello.features &= PROTO_FEAT_PREV;
    req.u.hello.name = name;
    req.u.hello.name_len = (uint32_t)strlen(name);
    struct pending *p = pending_new(conn, PROTO_OP_HELLO, PENDING_WAIT, &hello_ops);
    if (!p)
        return pending_new_error(conn);
    int r = pending_submit_msg(conn, p, &req);
    if (r < 0) {
        pending_free(conn, p);
        return r;
    }
    int ms = 0;
    if (deadline >= 0 && (ms = (int)(deadline - client_mono_ms())) <= 0)
        ms = 1;
    r = pending_wait(conn, p, ms); /* the reply's fields are the connection's (pending.c) */
    pending_free(conn, p);
    if (r < 0)
        return r;
    mapcache_fit(&conn->cache, conn->max_lease);
    return 0;
}

/* hello: hello_as in this library's protocol version; a daemon of the previous one refuses
 * it ("... this shmrefd speaks version 2; ...") and closes the connection: then a new one
 * to the same path, and hello in that version. */
static int hello(shmref_conn *conn, int64_t deadline)
{
    int r = hello_as(conn, PROTO_VERSION, deadline);
    const char *says = r == -EPROTONOSUPPORT ? strstr(conn->errmsg, "speaks version ") : NULL;
    if (!says || strtoul(says + strlen("speaks version "), NULL, 10) != PROTO_VERSION_PREV)
        return r;
    close(conn->fd);
    conn->fd = -1;
    conn->failed = 0;
    conn->fail_msg[0] = '\0';
    pending_discard(conn);
    transport_discard(conn);
    conn->next_id = 0;
    if ((r = connect_path(conn, conn->path, deadline)) < 0)
        return r;
    return hello_as(conn, PROTO_VERSION_PREV, deadline);
}

/* Why the calling thread's last shmref_connect failed: shmref_errmsg(NULL). */
static __thread char connect_errmsg[PROTO_MAX_ERRMSG + 1];

/* copy_msg: a connect failure's message, for the caller's errbuf and for
 * shmref_errmsg(NULL) in this thread. */
static void copy_msg(char *errbuf, size_t errcap, const char *msg)
{
    snprintf(connect_errmsg, sizeof(connect_errmsg), "%s", msg);
    if (errbuf && errcap)
        snprintf(errbuf, errcap, "%s", msg);
}

/* Attempts at the daemon autostart finds: a private one exiting as it is reached resets
 * the connection, and the next attempt waits for it to be gone. */
#define CONNECT_AUTOSTART_TRIES 10

/* hello_failed: the daemon at path refused or dropped the hello: its words, prefixed with
 * where it listens. Returns r. */
static int hello_failed(shmref_conn *conn, int r, const char *path)
{
    char msg[sizeof(conn->errmsg)];
    snprintf(msg, sizeof(msg), "%s", conn->errmsg);
    return client_fail(conn, r, "shmrefd at %.*s: %.*s", 200, path, (int)(sizeof(conn->errmsg) - 220), msg);
}

/* drop_connection: a connection whose hello failed, forgotten, to be made anew. */
static void drop_connection(shmref_conn *conn)
{
    if (conn->fd >= 0)
        close(conn->fd);
    conn->fd = -1;
    conn->failed = 0;
    conn->abandoned = NULL;
    conn->fail_msg[0] = '\0';
    pending_discard(conn);
    transport_discard(conn);
    conn->next_id = 0;
    conn->daemon_pid = 0;
}

/* connect_rule: conn's connection to conn->path and its hello, by the one rule every
 * connection of conn follows (the first, and a new one after an idle close). When
 * conn->path is the default socket resolved at connect (conn->default_path) and nothing
 * answers there: the system's, or the uid's private daemon (autostart.c), and conn->path
 * becomes the socket that answered. A private daemon in its idle exit still takes
 * connections into its backlog, then resets them: asked again, autostart waits for it to
 * let go of its lock and starts another. 0, or -errno with the message set (conn->fd may
 * then be open: the caller drops it). Requests outstanding on conn are dropped by a retry
 * (drop_connection): there must be none. */
static int connect_rule(shmref_conn *conn, int64_t deadline)
{
    char def[4096], path[4096];
    snprintf(path, sizeof(path), "%s", conn->path); /* for messages: conn->path may change */
    snprintf(def, sizeof(def), "%s", conn->path);
    int r = connect_path(conn, path, deadline);
    bool greeted = false;
    for (int tries = 0; r < 0 && conn->default_path && tries < CONNECT_AUTOSTART_TRIES; tries++) {
        if ((r = autostart_socket(r, def, sizeof(def), deadline, conn->errmsg, sizeof(conn->errmsg))) < 0)
            break;
        free(conn->path);
        if (!(conn->path = strdup(def))) {
            r = client_fail(conn, -ENOMEM, "out of memory");
            break;
        }
        if ((r = connect_path(conn, conn->path, deadline)) == 0 && (greeted = (r = hello(conn, deadline)) == 0))
            break;
        if (conn->fd >= 0)
            hello_failed(conn, r, path);
        if ((r != -ECONNRESET && r != -EPIPE && r != -ECONNREFUSED && r != -ENOENT) ||
            (deadline >= 0 && client_mono_ms() >= deadline)) {
            greeted = true; /* said */
            break;
        }
        drop_connection(conn);
        r = -ECONNREFUSED;
        struct timespec ts = { .tv_nsec = 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    if (r == 0 && !greeted && (r = hello(conn, deadline)) < 0)
        hello_failed(conn, r, path);
    return r;
}

int shmref_connect_timeout(const char *path, int timeout_ms, char *errbuf, size_t errcap,
                           shmref_conn **ret_conn)
{
    char def[4096];
    connect_errmsg[0] = '\0';
    if (!ret_conn || timeout_ms < -1) {
        copy_msg(errbuf, errcap, "connect: ret_conn must not be NULL and timeout_ms >= -1");
        return -EINVAL;
    }
    if (!path) {
        if (paths_default_socket(def, sizeof(def)) < 0) {
            copy_msg(errbuf, errcap, "the default socket path is too long");
            return -ENAMETOOLONG;
        }
        path = def;
    }
    shmref_conn *conn = calloc(1, sizeof(*conn));
    if (!conn) {
        copy_msg(errbuf, errcap, "out of memory");
        return -ENOMEM;
    }
    conn->fd = -1;
    conn->pid = client_pid();
    conn->default_path = path == def; /* autostart applies (connect_rule), also after an idle close */
    conn->timeout_ms = timeout_ms < 0 ? default_timeout() : timeout_ms;
    shmref_set_limits(conn, -1, -1);
    if (!(conn->path = strdup(path))) {
        free(conn);
        copy_msg(errbuf, errcap, "out of memory");
        return -ENOMEM;
    }
    mapcache_init(&conn->cache);
    conn->cache.on_unmap = on_unmap;
    conn->cache.ctx = conn;
    conn->id_taken = pending_id_taken;
    conn->on_stray = handle_undo_reply;
    conn->revive = revive;
    stock_init(&conn->stock);
    conn->acquire_wait_ms = client_acquire_wait_default(conn->timeout_ms);
    int64_t deadline = conn->timeout_ms > 0 ? client_mono_ms() + conn->timeout_ms : -1;
    int r = connect_rule(conn, deadline);
    if (r < 0) {
        copy_msg(errbuf, errcap, conn->errmsg);
        conn->cache.on_unmap = NULL;
        handle_teardown(conn);
        return r;
    }
    conn->errmsg[0] = '\0';
    *ret_conn = conn;
    return 0;
}

/* reconnect: a forked child's own connection to the parent's socket path, made when it
 * first needs the daemon. */
static int reconnect(shmref_conn *conn)
{
    int64_t deadline = conn->timeout_ms > 0 ? client_mono_ms() + conn->timeout_ms : -1;
    conn->next_id = 0;
    conn->daemon_pid = 0;
    int r = connect_rule(conn, deadline);
    if (r < 0 && conn->fd >= 0) {
        close(conn->fd);
        conn->fd = -1;
        conn->failed = 0; /* tried again at the next call */
        conn->abandoned = NULL;
        pending_discard(conn);
    }
    return r;
}

/* holds_nothing: whether this side of conn holds nothing a new connection would lose: no
 * handle (leases, acquires, ledger holds, the stock's; a forked child's inherited ones
 * are its parent's and need no connection), no completion undelivered, nothing pinned. */
static bool holds_nothing(const shmref_conn *conn)
{
    for (const shmref_buf *b = conn->bufs; b; b = b->next)
        if (!b->inherited)
            return false;
    return !conn->done && !atomic_load(&conn->pins);
}

/* revive: conn->revive, and at the start of a call on a connection found closed. The
 * daemon closes a connection idle for --idle-timeout only when it holds nothing for it
 * (no lease, handle, request or ledger hold: daemon/session.c) and has read nothing from
 * it for that long, so requests outstanding now were never read. When this side holds
 * nothing either, a new connection is made by the first connect's rule (connect_rule:
 * the same socket, or the private daemon started anew for the default one), under the
 * same fd number (a poll on it stays valid), and those requests go again on it. What was
 * the old connection's goes with it: its ledger (the new one gets its own), idle mappings
 * (the daemon's side of the new connection has sent none of their fds: they would be
 * mapped again from the fd it sends, and never forgotten to it), the stock's refills.
 * Otherwise, or when the new connection fails, the connection stays failed (a new one is
 * tried again at the next call) and what is outstanding fails with the reason. 0 or
 * -errno. */
static int revive(shmref_conn *conn)
{
    bool ok = false;
    if (!conn->idle_closed || conn->closing || conn->pid != client_pid() || !holds_nothing(conn))
        return conn->failed ? conn->failed : -ENOTCONN;
    struct pending *again = pending_detach_all(conn, &ok); /* out of the table while it connects */
    if (!ok)
        return conn->failed;
    char why[sizeof(conn->fail_msg)];
    snprintf(why, sizeof(why), "%s", conn->fail_msg);
    int old = conn->fd;
    localhold_unmap(conn);
    conn->cache.on_unmap = NULL;
    mapcache_drop_idle(&conn->cache);
    conn->cache.on_unmap = on_unmap;
    stock_reset(conn);
    transport_discard(conn);
    conn->fd = -1;
    conn->failed = 0;
    conn->abandoned = NULL;
    conn->idle_closed = false;
    conn->fail_msg[0] = conn->late[0] = '\0';
    conn->features = 0;
    conn->daemon_pid = 0;
    int64_t deadline = conn->timeout_ms > 0 ? client_mono_ms() + conn->timeout_ms : -1;
    int r = connect_rule(conn, deadline);
    if (r == 0 && dup3(conn->fd, old, O_CLOEXEC) == old) {
        close(conn->fd);
        conn->fd = old;
    } else if (r == 0) {
        close(old); /* a new number: dup3 failed */
    } else {
        if (conn->fd >= 0)
            close(conn->fd);
        conn->fd = old; /* the closed socket: nothing is sent on a failed connection */
        char msg[sizeof(conn->fail_msg)];
        snprintf(msg, sizeof(msg), "%.*s; a new connection failed: %.*s", 200, why, (int)(sizeof(msg) - 240),
                 conn->errmsg);
        conn->abandoned = NULL;
        conn->idle_closed = true; /* tried again at the next call */
        conn->failed = r;
        snprintf(conn->fail_msg, sizeof(conn->fail_msg), "%s", msg);
        pending_fail_all(conn, r, msg); /* none: the hello's own is gone */
        pending_attach(conn, again, r, msg);
        client_fail(conn, r, "%s", msg);
        return r;
    }
    conn->counters.reconnects++;
    conn->errmsg[0] = '\0'; /* the close said nothing about this call */
    pending_attach(conn, again, 0, NULL);
    return 0;
}

int shmref_connect(const char *path, shmref_conn **ret_conn)
{
    return shmref_connect_timeout(path, -1, NULL, 0, ret_conn);
}

int shmref_set_timeout(shmref_conn *conn, int timeout_ms)
{
    if (!conn || timeout_ms < -1)
        return -EINVAL;
    conn->timeout_ms = timeout_ms < 0 ? default_timeout() : timeout_ms;
    if (!conn->acquire_wait_set)
        conn->acquire_wait_ms = client_acquire_wait_default(conn->timeout_ms);
    return 0;
}

int client_acquire_wait_default(int timeout_ms)
{
    return timeout_ms > 0 && timeout_ms < CLIENT_ACQUIRE_WAIT_MS ? timeout_ms : CLIENT_ACQUIRE_WAIT_MS;
}

int shmref_get_timeout(const shmref_conn *conn)
{
    return conn ? conn->timeout_ms : -EINVAL;
}

int shmref_conn_pid(const shmref_conn *conn)
{
    return conn ? (int)conn->pid : -EINVAL;
}

/* CLOSE_PUBLISH_MS: how long shmref_close waits, at most, for a queued publish to go. */
#define CLOSE_PUBLISH_MS 2000

void shmref_close(shmref_conn *conn)
{
    if (!conn)
        return;
    /* Never blocks: what has arrived is taken in, releases are one-way messages sent if
     * the socket takes them now, and nothing is waited for. Whatever the daemon still
     * holds for this connection (a release the socket did not take, a lease on its way,
     * a parked acquire) ends with the connection on its side; the bye said last makes
     * that a clean close when all went (transport_bye). In a forked child nothing of the
     * parent's connection is touched (adopt). */
    adopt(conn);
    conn->closing = true;
    bool live = client_usable(conn) == 0;
    if (live) {
        pending_intake(conn);
        conn->stock.depth = 0; /* nothing is refilled from now on */
        stock_return(conn);
        transport_drop_later(conn); /* refills not sent yet never go */
    }
    /* Requests still out become nobody's (a handle they hold is the closer's now); a
     * completion not collected is released. */
    pending_orphan_all(conn);
    /* Release every handle (one-way, no round trips). A pinned buffer (its unit's Arrow
     * exports are alive) stays: the last export releases it. So does, in a forked child,
     * every handle it inherited: its holder may still read it, and its release (which
     * frees the child's copy only) may come after this close; the connection's memory
     * stays for them, and the last one frees it (handle_forget_pinned). */
    conn->cache.on_unmap = NULL; /* the daemon forgets everything with the connection */
    unsigned inherited = 0;
    for (shmref_buf *b = conn->bufs, *next; b; b = next) {
        next = b->next;
        bool released = b->doomed; /* shmref_release'd while busy: nobody holds it any more */
        if (b->busy) { /* cannot be after pending_orphan_all; never leaked if it were */
            b->busy = 0;
            b->doomed = false;
        }
        if (b->inherited && !b->pinned && !released)
            client_pin(b);
        if (b->pinned)
            inherited += b->inherited;
        else
            handle_drop(b); /* unlinks and frees b, one-way release */
    }
    while (conn->bufs) {
        shmref_buf *b = conn->bufs;
        conn->bufs = b->next;
        b->prev = b->next = NULL;
    }
    /* Nothing is waited for, with one exception: a one-way publish still in the send queue
     * (the daemon was not reading) would be lost with the socket, so the queue is flushed,
     * waiting at most the connection's timeout (2 s without one). A stopped daemon with no
     * publish queued costs nothing. */
    if (client_usable(conn) == 0 && client_flush(conn) == 1 && transport_holds_publish(conn))
        transport_flush_wait(conn, conn->timeout_ms > 0 && conn->timeout_ms < CLOSE_PUBLISH_MS ? conn->timeout_ms
                                                                                         : CLOSE_PUBLISH_MS);
    unsigned kept = atomic_load(&conn->pins);
    if (kept == inherited) { /* nothing of this process's own needs the socket any more */
        transport_bye(conn); /* refills still on their way: a clean close all the same */
        if (!kept) {
            handle_teardown(conn);
            return;
        }
        if (conn->fd >= 0) /* a forked child's own connection: its inherited handles send nothing */
            close(conn->fd);
        conn->fd = -1;
    }
    atomic_store(&conn->closed, true);
}

int shmref_set_stock(shmref_conn *conn, int depth)
{
    if (!conn || depth < -1 || depth > STOCK_MAX_DEPTH)
        return -EINVAL;
    if (depth == -1) {
        struct stock def;
        stock_init(&def);
        depth = (int)def.depth;
    }
    client_usable(conn); /* a forked child adopts the connection first: the stock was the parent's */
    stock_set_depth(conn, (unsigned)depth);
    return 0;
}

void client_pin(shmref_buf *buf)
{
    buf->pinned = true;
    atomic_fetch_add(&buf->conn->pins, 1);
}

void client_unpin(shmref_buf *buf)
{
    shmref_conn *conn = buf->conn;
    if (!atomic_load(&conn->closed)) {
        buf->pinned = false;
        atomic_fetch_sub(&conn->pins, 1);
        if (buf->inherited)
            client_adopt(conn); /* the parent's handle: nothing to send, no connection needed */
        else
            client_enter(conn); /* a forked child adopts the connection first */
        handle_drop(buf);
        return;
    }
    /* Closed by its owner: only pinned buffers' holders use it now, maybe from several
     * threads, so no shared state but the atomic counts (send is atomic per message). */
    handle_forget_pinned(buf);
}

const char *shmref_errmsg(const shmref_conn *conn)
{
    return conn ? conn->errmsg : connect_errmsg;
}

int shmref_ping(shmref_conn *conn)
{
    if (!conn)
        return -EINVAL;
    int r = client_enter(conn);
    if (r < 0)
        return r;
    struct pending *p = pending_new(conn, PROTO_OP_PING, PENDING_WAIT, NULL);
    if (!p)
        return pending_new_error(conn);
    struct proto_msg req = { .op = PROTO_OP_PING };
    if ((r = pending_submit_msg(conn, p, &req)) == 0)
        r = pending_wait(conn, p, pending_budget(conn, 0));
    pending_free(conn, p);
    return r;
}

int shmref_daemon_pid(const shmref_conn *conn)
{
    return conn ? (int)conn->daemon_pid : -EINVAL;
}

int shmref_conn_socket(const shmref_conn *conn, char *buf, size_t cap)
{
    if (!conn || !conn->path || !buf)
        return -EINVAL;
    size_t n = strlen(conn->path);
    if (n >= cap)
        return -ERANGE;
    memcpy(buf, conn->path, n + 1);
    return (int)n;
}
