/* SPDX-License-Identifier: MIT */
/* server.c: see server.h. Accepting is non-blocking and bounded by --max-clients; on
 * EMFILE the listener pauses for 100 ms instead of spinning. */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "access.h"
#include "log.h"
#include "status.h"
#include "transport.h"
#include "units.h"

/* status_of: the status map, from every layer's numbers (sessions call it). */
static int status_of(void *arg, uint32_t uid, uint8_t *buf, size_t cap)
{
    struct server *s = arg;
    /* The operators see everyone; others see their own clients and buffers. */
    bool all = access_operator(uid);
    s->counters.fd_waits = transport_fd_waits();
    struct status_src src = { .uptime_ms = uv_now(s->loop) - s->started_ms, .now_ms = uv_now(s->loop),
                              .opt = s->opt, .pool = s->pool,
                              .quota = s->quota, .reg = s->reg, .counters = &s->counters,
                              .sessions = &s->sessions, .only_uid = !all, .uid = uid,
                              .reserved_clients = SERVER_RESERVED_SLOTS };
    return status_build(&src, buf, cap);
}

/* server_fd_caps: fds in flight (sent, not yet received) count against the daemon's
 * RLIMIT_NOFILE in the kernel (ETOOMANYREFS past it). One uid's connections may have a
 * quarter of it unread, one connection at most SERVER_FDS_PER_CONN: a tenant that never
 * reads its replies stalls itself, not the fds of others. */
static void server_fd_caps(struct session_env *env)
{
    struct rlimit rl;
    uint64_t lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 1048576;
    uint64_t uid_cap = lim / 4 > 16 ? lim / 4 : 16;
    env->fd_cap_uid = uid_cap > UINT32_MAX ? UINT32_MAX : (unsigned)uid_cap;
    env->fd_cap_conn = env->fd_cap_uid < SERVER_FDS_PER_CONN ? env->fd_cap_uid : SERVER_FDS_PER_CONN;
    /* All uids together: past half of it only a connection whose peer has read all it
     * was sent gets fds, and nothing passes three quarters (the kernel's limit counts
     * every process of the daemon's user). */
    uint64_t soft = lim / 2 > UINT32_MAX ? UINT32_MAX : lim / 2;
    uint64_t hard = lim / 4 * 3 > UINT32_MAX ? UINT32_MAX : lim / 4 * 3;
    transport_set_fd_budget((unsigned)soft, (unsigned)hard);
}

/* stock_changed: the pool's count of uid's stock bytes, kept in its quota entry (status). */
static void stock_changed(void *arg, uint32_t uid, int64_t delta)
{
    quota_stock(arg, uid, delta);
}

int server_init(struct server *s, uv_loop_t *loop, struct options *opt)
{
    const char *why = NULL;
    memset(s, 0, sizeof(*s));
    s->loop = loop;
    s->opt = opt;
    s->listen_fd = -1;
    s->started_ms = uv_now(loop);
    uv_timer_init(loop, &s->accept_retry); /* first, so server_stop can always close them */
    uv_timer_init(loop, &s->housekeeping);
    int r = pool_new(loop, opt->pool_dir, opt->pool_size, opt->memfd, &s->pool, &why);
    if (r < 0) {
        log_error("cannot start: %s", why);
        return r;
    }
    if ((r = quota_new(opt->tenant_quota, &s->quota)) < 0 ||
        (r = registry_new(loop, s->pool, s->quota, &s->reg)) < 0 || (r = server_apply_limits(s)) < 0) {
        log_error("cannot start: %s", strerror(-r));
        return r;
    }
    uint64_t reserve = pool_set_stock(s->pool, opt->stock_reserve, stock_changed, s->quota);
    if (reserve < opt->stock_reserve) {
        char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];
        log_notice("stock reserve %s instead of %s: that is what %s has beyond the pool size",
                   units_format(reserve, a), units_format(opt->stock_reserve, b), opt->pool_dir);
    }
    s->broker = (struct broker){ .opt = opt, .pool = s->pool, .quota = s->quota, .reg = s->reg,
                                 .counters = &s->counters };
    broker_start(&s->broker, loop);
    tenantdir_init(&s->tenantdirs, s->reg, s->pool, &s->counters);
    s->sessions = (struct session_env){ .loop = loop, .opt = opt, .broker = &s->broker,
                                        .counters = &s->counters, .status = status_of, .status_arg = s,
                                        .tenantdirs = &s->tenantdirs };
    server_fd_caps(&s->sessions);
    return 0;
}

int server_apply_limits(struct server *s)
{
    quota_set_default(s->quota, s->opt->tenant_quota);
    quota_clear_limits(s->quota);
    for (unsigned i = 0; i < s->opt->n_quotas; i++)
        if (quota_set(s->quota, s->opt->quotas[i].uid, s->opt->quotas[i].bytes) < 0)
            return -ENOMEM;
    log_max_level = s->opt->verbose ? LOG_DEBUG : LOG_INFO;
    broker_kick(&s->broker); /* a raised quota may let waiting leases through */
    return 0;
}

static void on_accept(uv_poll_t *p, int status, int events);

static void accept_resume(uv_timer_t *t)
{
    struct server *s = t->data;
    if (s->listening)
        uv_poll_start(&s->listen_poll, UV_READABLE, on_accept);
}

/* refuse: tell a peer why it is not served (best effort), then close it. */
static void refuse(int fd, const struct ucred *cred, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(int fd, const struct ucred *cred, int code, const char *fmt, ...)
{
    char msg[PROTO_MAX_ERRMSG];
    uint8_t buf[PROTO_MAX_ERRMSG + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    int n = proto_encode_error(0, code, buf, sizeof(buf), "%s", msg);
    if (n > 0 && send(fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        log_debug("could not tell pid %d it was refused: %s", (int)cred->pid, strerror(errno));
    /* One source for every refused connect: a peer that reconnects in a loop is limited too. */
    static struct log_rate rate;
    unsigned held_back;
    bool ok = log_rate_take(&rate, &held_back);
    if (held_back)
        log_notice("suppressed %u refused-connection line%s in the last second", held_back, held_back == 1 ? "" : "s");
    if (ok)
        log_notice("refused client pid=%d uid=%u gid=%u: %s", (int)cred->pid, (unsigned)cred->uid,
                   (unsigned)cred->gid, msg);
    close(fd);
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* peer_pidfd: a pidfd of the process that connected (SO_PEERPIDFD, Linux 6.5; else
 * pidfd_open of its pid, which a pid reused since the connect could fool), or -1. It lets
 * the daemon charge a client's mappings of sealed buffers until its process exits. */
static int peer_pidfd(int fd, pid_t pid)
{
    int pidfd = -1;
    socklen_t len = sizeof(pidfd);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0) {
        fcntl(pidfd, F_SETFD, FD_CLOEXEC);
        return pidfd;
    }
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    return pidfd;
}

static void accept_one(struct server *s, int fd)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
        log_warning("SO_PEERCRED failed: %s; dropping the connection", strerror(errno));
        close(fd);
        return;
    }
    if (access_unmapped(&cred)) {
        s->counters.refused_access++;
        refuse(fd, &cred, EACCES, "access denied: uid %u (pid %d) is the overflow uid: its real uid is not "
               "mapped in shmrefd's user namespace, so it cannot be told apart from other such peers",
               (unsigned)cred.uid, (int)cred.pid);
        return;
    }
    if (!access_allowed(s->opt, &cred, fd)) {
        s->counters.refused_access++;
        quota_note_refusal(s->quota, cred.uid, EACCES);
        refuse(fd, &cred, EACCES, "access denied: uid %u (pid %d) is not in allow-users or allow-groups",
               (unsigned)cred.uid, (int)cred.pid);
        return;
    }
    /* The operators (root, the daemon's own uid unless it is nobody's) have
     * SERVER_RESERVED_SLOTS above --max-clients (an operator's status works when others
     * took every slot) and no per-uid limit. */
    bool privileged = access_operator(cred.uid);
    uint32_t slots = s->opt->max_clients + (privileged ? SERVER_RESERVED_SLOTS : 0);
    if (s->sessions.n >= slots && session_count_open(&s->sessions) >= slots) {
        s->counters.refused_limit++;
        quota_note_refusal(s->quota, cred.uid, EUSERS);
        refuse(fd, &cred, EUSERS, "too many clients: %u connected, limit %u (and %u reserved for root and the "
               "daemon's user)", session_count_open(&s->sessions), s->opt->max_clients, SERVER_RESERVED_SLOTS);
        return;
    }
    uint32_t mine = session_uid_conns(&s->sessions, cred.uid);
    if (!privileged && mine >= s->opt->max_clients_per_uid) {
        s->counters.refused_limit++;
        quota_note_refusal(s->quota, cred.uid, EUSERS);
        refuse(fd, &cred, EUSERS, "too many clients of uid %u: %u connected, limit %u per uid", (unsigned)cred.uid,
               mine, s->opt->max_clients_per_uid);
        return;
    }
    /* Room for the largest reply (status) in one datagram. */
    int sndbuf = PROTO_MAX_REPLY + 4096;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    struct session *c;
    int r = session_new(&s->sessions, fd, &cred, &c);
    if (r < 0) {
        log_error("cannot serve client pid=%d: %s", (int)cred.pid, strerror(-r));
        close(fd);
        return;
    }
    c->pidfd = peer_pidfd(fd, cred.pid);
    s->counters.connections++;
    log_debug("client %llu pid=%d uid=%u gid=%u connected", (unsigned long long)c->peer.id, (int)cred.pid,
              (unsigned)cred.uid, (unsigned)cred.gid);
}

/* listener_failed: accepting failed in a way waiting will not mend (POLLERR, or a socket
 * shut down under us: accept then fails at once, and the poll would spin). A daemon that
 * cannot accept must not look alive to the service manager's watchdog: stop the loop, so
 * main exits 1 and the manager can restart the service. */
static void listener_failed(struct server *s, const char *why)
{
    log_error("the listening socket failed (%s): stopping, so that the service manager can "
              "restart shmrefd", why);
    uv_poll_stop(&s->listen_poll);
    s->failed = true;
    uv_stop(s->loop);
}

static void on_accept(uv_poll_t *p, int status, int events)
{
    struct server *s = p->data;
    (void)events;
    if (status < 0) {
        listener_failed(s, uv_strerror(status));
        return;
    }
    for (int i = 0; i < 64; i++) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            accept_one(s, fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            log_warning("cannot accept: %s (%u clients); pausing accepts for 100 ms",
                        strerror(errno), s->sessions.n);
            uv_poll_stop(&s->listen_poll);
            s->accept_retry.data = s;
            uv_timer_start(&s->accept_retry, accept_resume, 100, 0);
        } else if (errno != EAGAIN) {
            listener_failed(s, strerror(errno));
        }
        return;
    }
}

/* exit_when_idle: --exit-idle. With no connection and no buffer in use (warm ones aside)
 * for that many seconds, the daemon stops as on SIGTERM (main.c's clean stop). */
static void exit_when_idle(struct server *s)
{
    uint64_t now = uv_now(s->loop);
    uint64_t busy = pool_bytes_alloc(s->pool) - pool_bytes_warm(s->pool) - pool_bytes_creating(s->pool);
    if (s->sessions.n > 0 || busy > 0 || !s->opt->exit_idle) {
        s->idle_since_ms = now;
        return;
    }
    if (s->stopping || now - s->idle_since_ms < (uint64_t)s->opt->exit_idle * 1000)
        return;
    log_notice("idle for %u s (no connection, no buffer in use): exiting (exit-idle)", s->opt->exit_idle);
    s->idle_since_ms = now; /* once: SIGTERM takes it from here */
    uv_kill(getpid(), SIGTERM);
}

/* housekeeping: a connection holds a --max-clients slot from accept on; one that never
 * says hello must not keep it forever. */
static void housekeeping(uv_timer_t *t)
{
    struct server *s = t->data;
    exit_when_idle(s);
    session_expire_hello(&s->sessions, uv_now(s->loop));
    session_expire_idle(&s->sessions, uv_now(s->loop), (uint64_t)s->opt->idle_timeout * 1000);
    log_flush(); /* lines that waited for a full stderr */
    /* A listening socket that was shut down or broke wakes no epoll waiter: look. */
    struct pollfd pf = { .fd = s->listen_fd, .events = POLLIN };
    if (s->listening && !s->stopping && poll(&pf, 1, 0) == 1 && (pf.revents & (POLLERR | POLLHUP | POLLNVAL)))
        listener_failed(s, pf.revents & POLLNVAL ? "closed" : pf.revents & POLLERR ? "error" : "shut down");
}

int server_listen_fd(struct server *s, int fd)
{
    int r = uv_poll_init(s->loop, &s->listen_poll, fd);
    if (r < 0) {
        log_error("cannot poll the listening socket: %s", uv_strerror(r));
        return r;
    }
    s->listen_fd = fd;
    s->listen_poll.data = s;
    s->listening = true;
    uv_poll_start(&s->listen_poll, UV_READABLE, on_accept);
    s->housekeeping.data = s;
    s->idle_since_ms = uv_now(s->loop);
    uv_timer_start(&s->housekeeping, housekeeping, 1000, 1000);
    return 0;
}

/* stale_or_live: for an existing path, 0 if it is a dead socket (removed), -EADDRINUSE
 * if a daemon answers there, -EEXIST if it is not a socket. */
static int stale_or_live(const char *path, const struct sockaddr_un *sa)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISSOCK(st.st_mode))
        return -EEXIST;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
    int e = errno;
    close(fd);
    if (r == 0)
        return -EADDRINUSE;
    if (e != ECONNREFUSED && e != ENOENT)
        return -e;
    return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
}

/* socket_hint: for a socket path this uid cannot create (EACCES, EPERM, or ENOENT: its
 * directory could not be made), where to put it instead. */
static const char *socket_hint(int e)
{
    if (e != EACCES && e != EPERM && e != ENOENT)
        return "";
    if (geteuid() == 0)
        return e == ENOENT ? "; create the directory, or give --socket PATH" : "";
    return "; as a user other than root, give --socket PATH in a directory of yours, e.g. --socket "
           "$XDG_RUNTIME_DIR/shmrefd.sock (the default when XDG_RUNTIME_DIR is set), or set $SHMREFD_SOCKET";
}

int server_listen_path(struct server *s)
{
    const char *path = s->opt->socket_path;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(sa.sun_path)) {
        log_error("socket path %s is longer than %zu bytes", path, sizeof(sa.sun_path) - 1);
        return -ENAMETOOLONG;
    }
    strcpy(sa.sun_path, path);
    char *dir = strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
    if (slash && slash != dir) {
        *slash = '\0';
        if (mkdir(dir, 0755) == 0)
            s->created_dir = true;
        else if (errno != EEXIST)
            log_warning("cannot create %s: %s", dir, strerror(errno)); /* the error says more */
    }
    free(dir);
    int r = stale_or_live(path, &sa);
    if (r == -EADDRINUSE) {
        log_error("another shmrefd is already serving %s", path);
        return r;
    }
    if (r < 0) {
        log_error("cannot use socket path %s: %s%s", path, strerror(-r), socket_hint(-r));
        return r;
    }
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        r = -errno;
        log_error("socket: %s", strerror(errno));
        return r;
    }
    /* Bind under a umask that already gives the final mode: no window with more. */
    mode_t old = umask(0777 & ~s->opt->socket_mode);
    r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    struct stat st;
    if (r == 0 && lstat(path, &st) == 0) { /* ours from here: server_remove_socket */
        s->bound = true;
        s->bound_dev = st.st_dev;
        s->bound_ino = st.st_ino;
    }
    if (r < 0 || chmod(path, s->opt->socket_mode) < 0 || listen(fd, 128) < 0) {
        r = -errno;
        log_error("cannot listen on %s: %s%s", path, strerror(errno), socket_hint(errno));
        close(fd);
        server_remove_socket(s);
        return r;
    }
    return server_listen_fd(s, fd);
}

/* still_ours: whether path is still the socket file server_listen_path bound. */
static bool still_ours(const struct server *s, const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == s->bound_dev &&
           st.st_ino == s->bound_ino;
}

void server_remove_socket(struct server *s)
{
    const char *path = s->opt ? s->opt->socket_path : NULL;
    if (!s->bound || !path)
        return;
    s->bound = false;
    if (!still_ours(s, path)) {
        if (access(path, F_OK) == 0)
            log_info("leaving %s: it is no longer the socket this daemon bound", path);
        return;
    }
    if (unlink(path) < 0 && errno != ENOENT)
        log_warning("cannot remove the socket %s: %s%s; the next start replaces it", path, strerror(errno),
                    errno == EACCES || errno == EPERM ? " (the user shmrefd serves as may not write its directory)" : "");
}

void server_warn_unremovable(struct server *s)
{
    const char *path = s->opt->socket_path;
    if (!s->bound)
        return;
    char *dir = strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
    if (!slash) {
        free(dir);
        return;
    }
    if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    struct stat ds, ss;
    /* A sticky directory (/tmp) lets only the owner of the file or of the directory remove it. */
    bool blocked = access(dir, W_OK | X_OK) < 0 ||
                   (stat(dir, &ds) == 0 && (ds.st_mode & S_ISVTX) && ds.st_uid != geteuid() &&
                    lstat(path, &ss) == 0 && ss.st_uid != geteuid());
    if (blocked)
        log_warning("uid %u, which shmrefd serves as, may not remove files in %s: the socket %s will stay "
                    "at exit (the next start replaces it); give the directory to that user, or put the "
                    "socket in a directory shmrefd makes", (unsigned)geteuid(), dir, path);
    free(dir);
}

static void noop_close(uv_handle_t *h)
{
    (void)h;
}

void server_stop(struct server *s)
{
    if (s->stopping || !s->loop) /* !loop: server_init never ran */
        return;
    s->stopping = true;
    if (s->listening) {
        s->listening = false;
        uv_close((uv_handle_t *)&s->listen_poll, noop_close);
    }
    uv_close((uv_handle_t *)&s->accept_retry, noop_close);
    uv_close((uv_handle_t *)&s->housekeeping, noop_close);
    s->broker.stopping = true;
    if (s->pool)
        pool_stop(s->pool); /* before sessions release: clients keep the bytes they hold */
    broker_stop(&s->broker); /* its waiters' sessions are closing */
    session_close_all(&s->sessions); /* each releases what it held from the loop */
    if (s->reg)
        registry_end_retentions(s->reg);
}

void server_free(struct server *s)
{
    if (!s->loop)
        return;
    tenantdir_free(&s->tenantdirs); /* LENT buffers end before the registry goes */
    registry_free(s->reg);
    s->reg = NULL;
    quota_free(s->quota);
    s->quota = NULL;
    pool_free(s->pool);
    s->pool = NULL;
    session_free_env(&s->sessions);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    s->listen_fd = -1;
}
