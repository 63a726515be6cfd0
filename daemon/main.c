/* SPDX-License-Identifier: MIT */
/* main.c: shmrefd's entry point: configuration, setup (socket, pool), dropping
 * privileges, the loop, SIGHUP reloads, and a clean stop on SIGTERM or SIGINT (exit 0).
 * Everything else lives in the modules named after what they do. */
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <stdbool.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>
#include <uv.h>

#include "access.h"
#include "cgroup.h"
#include "log.h"
#include "notify.h"
#include "options.h"
#include "privs.h"
#include "quota.h"
#include "server.h"
#include "store.h"
#include "units.h"

struct daemon {
    struct options flags;       /* the command line, kept for reloads */
    struct options opt;         /* in force */
    struct server *server;
    struct notify notify;
    bool activated;             /* the socket came from the service manager */
    bool default_user;          /* opt.user is privs_default_user's choice, not configured */
    uv_signal_t sig_term, sig_int, sig_hup;
};

/* load: flags over the config file over defaults, resolved against the pool dir. */
static int load(const struct options *flags, struct options *ret, char *err, size_t len)
{
    struct options file = { 0 };
    const char *path = flags->config_path ? flags->config_path : OPTIONS_DEFAULT_CONFIG;
    /* An empty --config= reads no file (the user unit: not the system's config). */
    int r = *path ? options_read_file(path, &file, err, len) : 0;
    if (r < 0 && !(r == -ENOENT && !flags->config_path))
        return r;
    r = options_merge(flags, &file, ret);
    options_free(&file);
    if (r < 0)
        return r;
    const char *dir = ret->pool_dir ? ret->pool_dir : "/dev/shm";
    struct statvfs sv;
    if (statvfs(dir, &sv) < 0) {
        r = -errno;
        snprintf(err, len, "pool directory %s: %s", dir, strerror(errno));
        options_free(ret);
        return r;
    }
    /* The default pool fits both the tmpfs and the memory cgroup (its limit, not what is
     * free now: a reload must derive the same defaults while the pool is in use). */
    uint64_t room = (uint64_t)sv.f_bavail * sv.f_frsize;
    struct cgroup_memory cg;
    if (cgroup_memory_read(&cg) > 0 && cg.limit < room)
        room = cg.limit;
    if (options_resolve(ret, room) < 0) {
        options_free(ret);
        return -ENOMEM;
    }
    uid_t uid;
    gid_t gid;
    if (ret->user && privs_lookup(ret->user, &uid, &gid) < 0) {
        snprintf(err, len, "user: unknown user '%s'", ret->user);
        options_free(ret);
        return -EINVAL;
    }
    if (ret->socket_group && !getgrnam(ret->socket_group)) {
        snprintf(err, len, "socket-group: unknown group '%s'", ret->socket_group);
        options_free(ret);
        return -EINVAL;
    }
    return 0;
}

/* quota_warning: a quota above the pool size is accepted (the pool bounds the tenant
 * anyway) but is likely a mistake: a message for the first one, or 0 if none. */
static int quota_warning(const struct options *o, char *buf, size_t len)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];
    if (o->tenant_quota > o->pool_size) {
        snprintf(buf, len, "tenant-quota %s is above the pool size %s: the pool, not the quota, bounds a tenant",
                 units_format(o->tenant_quota, a), units_format(o->pool_size, b));
        return 1;
    }
    for (unsigned i = 0; i < o->n_quotas; i++) {
        if (o->quotas[i].bytes > o->pool_size) {
            snprintf(buf, len, "[quota] %u = %s is above the pool size %s: the pool, not the quota, bounds it",
                     o->quotas[i].uid, units_format(o->quotas[i].bytes, a), units_format(o->pool_size, b));
            return 1;
        }
    }
    return 0;
}

/* fds_warning: every connection takes two of the daemon's fds (its socket and a pidfd of
 * its process), and the buffers may take all but a quarter of RLIMIT_NOFILE (and the
 * daemon's own: pool_fd_budget_of): a --max-clients whose connections need more than that
 * quarter would meet EMFILE at
 * accept, which pauses the listener, and clients would wait or time out. A message with
 * the numbers and both ways out, or 0 if they fit. lim: the limit the daemon will run
 * with (it raises the soft limit to the hard one at start). */
static int fds_warning(const struct options *o, unsigned long long lim, char *buf, size_t len)
{
    if (lim == 0 || lim == (unsigned long long)RLIM_INFINITY) /* 0: unknown */
        return 0;
    unsigned long long need = 2ULL * (o->max_clients + SERVER_RESERVED_SLOTS),
                       taken = pool_fd_budget_of(lim) + POOL_FDS_DAEMON, room = lim > taken ? lim - taken : 0;
    if (need <= room)
        return 0;
    unsigned long long fit = room / 2 > SERVER_RESERVED_SLOTS ? room / 2 - SERVER_RESERVED_SLOTS : 0;
    snprintf(buf, len,
             "max-clients %u (and %u for operators) may take %llu fds, a socket and a pidfd each, more than "
             "the %llu that RLIMIT_NOFILE %llu leaves beside the buffers (a quarter): connections past that wait "
             "at accept; raise the limit to %llu or more (LimitNOFILE= in the unit, ulimit -n), or lower "
             "--max-clients to %llu",
             o->max_clients, SERVER_RESERVED_SLOTS, need, room, lim, need * 4, fit);
    return 1;
}

/* check_config: --check-config. What start would refuse (the pool against its
 * directory, O_TMPFILE support) is checked by the same pool_new; exit status as start's. */
static int check_config(const struct options *o)
{
    struct pool *p;
    const char *why;
    char w[512];
    options_print(o, stdout);
    if (quota_warning(o, w, sizeof(w)))
        fprintf(stderr, "shmrefd: warning: %s\n", w);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && fds_warning(o, rl.rlim_max, w, sizeof(w)))
        fprintf(stderr, "shmrefd: warning: %s\n", w);
    if (pool_new(uv_default_loop(), o->pool_dir, o->pool_size, o->memfd, &p, &why) < 0) {
        fprintf(stderr, "shmrefd: %s\n", why);
        return 1;
    }
    pool_free(p);
    uv_loop_close(uv_default_loop());
    return 0;
}

/* Room the daemon itself needs in its memory cgroup beside the pool's pages. */
#define CGROUP_HEADROOM (UINT64_C(8) << 20)

/* check_cgroup: at start (and for --check-config), the pool must fit the memory cgroup
 * as it must fit the tmpfs: its pages are charged to the daemon, and a pool beyond the
 * limit gets the daemon OOM-killed by a lease within every quota. */
static int check_cgroup(const struct options *o, char *err, size_t len)
{
    struct cgroup_memory cg;
    if (cgroup_memory_read(&cg) <= 0)
        return 0;
    uint64_t room = cg.limit > cg.usage + CGROUP_HEADROOM ? cg.limit - cg.usage - CGROUP_HEADROOM : 0;
    if (o->pool_size <= room)
        return 0;
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], c[UNITS_TEXT_MAX];
    snprintf(err, len,
             "pool size %s (%llu bytes) does not fit the memory cgroup %.300s: limit %s (%llu bytes), "
             "in use %s (%llu bytes), and shmrefd needs %llu bytes beside the pool; lower "
             "--pool-size or raise the cgroup's limit (MemoryMax= in the unit)",
             units_format(o->pool_size, a), (unsigned long long)o->pool_size, cg.path,
             units_format(cg.limit, b), (unsigned long long)cg.limit, units_format(cg.usage, c),
             (unsigned long long)cg.usage, (unsigned long long)CGROUP_HEADROOM);
    return -ENOSPC;
}

/* keep_restart_only: settings a reload cannot change; say so if the file tried. */
static void keep_restart_only(const struct options *old, struct options *new)
{
#define KEEP_STR(f, key)                                                                       \
    if ((new->f ? strcmp(new->f, old->f ? old->f : "") : old->f != NULL) != 0)                \
        log_warning("config: %s changed; restart shmrefd to apply it", key);                   \
    free(new->f);                                                                              \
    new->f = old->f ? strdup(old->f) : NULL;
#define KEEP_NUM(f, key)                                                                       \
    if (new->f != old->f)                                                                      \
        log_warning("config: %s changed; restart shmrefd to apply it", key);                   \
    new->f = old->f;
    KEEP_STR(socket_path, "socket")
    KEEP_STR(socket_group, "socket-group")
    KEEP_STR(pool_dir, "pool-dir")
    KEEP_STR(user, "user")
    KEEP_NUM(socket_mode, "socket-mode")
    KEEP_NUM(pool_size, "pool-size")
    KEEP_NUM(memfd, "memfd")
    KEEP_NUM(pool_hugepages, "pool-hugepages")
#undef KEEP_STR
#undef KEEP_NUM
}

static void reload(struct daemon *d)
{
    char err[512];
    struct options next;
    log_notice("received SIGHUP, reloading the configuration");
    notify_reloading(&d->notify);
    int r = load(&d->flags, &next, err, sizeof(err));
    if (r < 0) {
        log_error("reload failed, keeping the configuration in force: %s", r == -ENOMEM ? "out of memory" : err);
    } else {
        if (d->default_user && !next.user)
            next.user = strdup(d->opt.user); /* not a change: the default in force */
        keep_restart_only(&d->opt, &next);
        /* Defaults derived from the pool size follow the size in force. */
        if (!options_given(&next, "tenant-quota"))
            next.tenant_quota = next.private_config ? next.pool_size : next.pool_size / 2; /* private: one tenant */
        if (!options_given(&next, "max-lease-size"))
            next.max_lease_size = next.pool_size;
        options_free(&d->opt);
        d->opt = next;
        server_apply_limits(d->server);
        if (quota_warning(&d->opt, err, sizeof(err)))
            log_warning("%s", err);
        char a[UNITS_TEXT_MAX];
        log_notice("configuration reloaded: tenant quota %s, %u per-uid quota%s, max %u leases per client, "
                   "max %u clients", units_format(d->opt.tenant_quota, a), d->opt.n_quotas,
                   d->opt.n_quotas == 1 ? "" : "s", d->opt.max_leases, d->opt.max_clients);
    }
    notify_reloaded(&d->notify);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct daemon *d = h->data;
    if (signum == SIGHUP) {
        reload(d);
        return;
    }
    log_notice("received %s, stopping", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    notify_stopping(&d->notify);
    server_stop(d->server);
    uv_close((uv_handle_t *)&d->sig_term, NULL);
    uv_close((uv_handle_t *)&d->sig_int, NULL);
    uv_close((uv_handle_t *)&d->sig_hup, NULL);
}

/* listen_activated: serve on the socket systemd passed, if any. Returns 1 if there was
 * none, 0 when serving on it, -errno when what was passed is not usable. */
static int listen_activated(struct daemon *d)
{
    int n = sd_listen_fds(1);
    if (n == 0)
        return 1;
    if (n < 0) {
        log_error("socket activation: %s", strerror(-n));
        return n;
    }
    int fd = SD_LISTEN_FDS_START;
    if (n != 1 || sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0) {
        log_error("socket activation passed %d fd%s; shmrefd needs exactly one listening "
                  "SOCK_SEQPACKET Unix socket (ListenSequentialPacket=)", n, n == 1 ? " of another kind" : "s");
        return -EINVAL;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    struct sockaddr_un sa;
    socklen_t len = sizeof(sa);
    if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 && len > sizeof(sa.sun_family) && sa.sun_path[0]) {
        free(d->opt.socket_path);
        d->opt.socket_path = strndup(sa.sun_path, sizeof(sa.sun_path));
    }
    log_info("serving on the socket passed by the service manager");
    d->activated = true;
    return server_listen_fd(d->server, fd);
}

static int own_socket_dir(struct daemon *d)
{
    uid_t uid = (uid_t)-1;
    gid_t gid = (gid_t)-1;
    if (d->opt.socket_group) {
        struct group *g = getgrnam(d->opt.socket_group);
        gid = g ? g->gr_gid : (gid_t)-1;
        if (chown(d->opt.socket_path, (uid_t)-1, gid) < 0) {
            log_error("cannot give %s to group %s: %s", d->opt.socket_path, d->opt.socket_group, strerror(errno));
            return -errno;
        }
    }
    /* A directory we made for the socket belongs to the user we become, so that user
     * can remove its socket at exit and replace a stale one at the next start. */
    if (d->server->created_dir && d->opt.user && geteuid() == 0) {
        gid_t ugid;
        char *dir = strdup(d->opt.socket_path), *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash && privs_lookup(d->opt.user, &uid, &ugid) == 0) {
            *slash = '\0';
            if (chown(dir, uid, gid != (gid_t)-1 ? gid : ugid) < 0)
                log_warning("cannot give %s to %s: %s", dir, d->opt.user, strerror(errno));
        }
        free(dir);
    }
    return 0;
}

static void log_started(struct daemon *d)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], c[UNITS_TEXT_MAX];
    const struct options *o = &d->opt;
    log_notice("shmrefd %s serving on %s; pool %s (%s), pool size %s (%llu bytes), "
               "tenant quota %s, max lease %s, max %u leases per client",
               SHMREF_VERSION_STRING, o->socket_path, pool_dir(d->server->pool), pool_kind(d->server->pool),
               units_format(o->pool_size, a), (unsigned long long)o->pool_size,
               units_format(o->tenant_quota, b), units_format(o->max_lease_size, c), o->max_leases);
}

static int setup(struct daemon *d, uv_loop_t *loop)
{
    char why[256];
    int r = store_setup_hugepages(&d->opt);
    if (r < 0)
        return r;
    r = server_init(d->server, loop, &d->opt);
    if (r < 0)
        return r;
    r = listen_activated(d);
    if (r == 1 && (r = server_listen_path(d->server)) == 0)
        r = own_socket_dir(d);
    if (r < 0)
        return r;
    uid_t nobody;
    gid_t nogroup;
    bool has_nobody = privs_lookup("nobody", &nobody, &nogroup) == 0; /* before the drop: NSS may need root */
    if ((r = privs_drop(d->opt.user, why, sizeof(why))) < 0) {
        log_error("cannot drop privileges: %s", why);
        return r;
    }
    server_warn_unremovable(d->server);
    bool shared = has_nobody && geteuid() == nobody && nobody != 0;
    access_set_operator(shared ? 0 : geteuid());
    if (d->default_user)
        log_notice("serving as user %s (uid %u), not root: given no --user, a root shmrefd gives up root once "
                   "its socket and pool are set up (--user root keeps root)", d->opt.user, (unsigned)getuid());
    if (shared)
        log_warning("uid %u is user nobody's, which other services share: its clients are tenants like any "
                    "other, not operators (root is), and any process of nobody may signal shmrefd; create user "
                    "shmrefd (the package does) or give --user", (unsigned)getuid());
    uv_signal_t *sigs[] = { &d->sig_term, &d->sig_int, &d->sig_hup };
    int nums[] = { SIGTERM, SIGINT, SIGHUP };
    for (int i = 0; i < 3; i++) {
        uv_signal_init(loop, sigs[i]);
        sigs[i]->data = d;
        uv_signal_start(sigs[i], on_signal, nums[i]);
    }
    log_started(d);
    notify_ready(&d->notify, loop, d->server);
    return 0;
}

/* wait_for_entropy: tokens come from getrandom. At early boot its pool may not be
 * initialized yet, and getrandom would block the event loop at the first publish: wait
 * here once, before serving, and say so. */
static void wait_for_entropy(void)
{
    unsigned char b;
    if (getrandom(&b, 1, GRND_NONBLOCK) == 1 || errno != EAGAIN)
        return;
    log_notice("waiting for the kernel's random number generator to be initialized");
    while (getrandom(&b, 1, 0) < 0 && errno == EINTR)
        ;
}

int main(int argc, char **argv)
{
    static struct daemon d;
    char err[512];
    log_init(); /* before the first line: logging never blocks the loop */
    int r = options_parse_args(argc, argv, &d.flags);
    if (r != 0) {
        options_free(&d.flags);
        return r > 0 ? 0 : 2;
    }
    if ((r = load(&d.flags, &d.opt, err, sizeof(err))) < 0 || (r = check_cgroup(&d.opt, err, sizeof(err))) < 0) {
        fprintf(stderr, "shmrefd: %s\n", r == -ENOMEM ? "out of memory" : err);
        options_free(&d.opt);
        options_free(&d.flags);
        return 1;
    }
    if (d.flags.check_config) {
        r = check_config(&d.opt);
        options_free(&d.opt);
        options_free(&d.flags);
        return r;
    }
    log_max_level = d.opt.verbose ? LOG_DEBUG : LOG_INFO;
    /* Root given no --user serves as an unprivileged user once the socket and pool are set
     * up: the kernel counts fds in flight per sending uid, so a root daemon's replies would
     * wait (ETOOMANYREFS) on every other root process's fds. --user root keeps root. */
    const char *def = d.opt.user ? NULL : privs_default_user();
    if (def) {
        d.opt.user = strdup(def);
        d.default_user = d.opt.user != NULL;
    } else if (!d.opt.user && geteuid() == 0) {
        log_warning("running as root with no --user, and no unprivileged user can be become here (user "
                    "namespace): fds are sent as uid 0");
    }
    if (quota_warning(&d.opt, err, sizeof(err)))
        log_warning("%s", err);
    if (d.opt.private_config) { /* its user gives it no flags: the knobs the user has */
        char advice[320];
        snprintf(advice, sizeof(advice), "raise this private shmrefd's quota with SHMREF_TENANT_QUOTA=SIZE where "
                 "it is started, or tenant-quota = SIZE in %.150s, then kill %d (the next connect starts it anew)",
                 d.opt.private_config, (int)getpid());
        quota_set_advice(advice);
    }
    signal(SIGPIPE, SIG_IGN);
    /* --sched-batch: the kernel does not let a task of this policy preempt the running one
     * when it wakes. A client's one-way message (publish, release, TOOK) then does not
     * switch its CPU to the daemon in the middle of the client's work; the daemon runs
     * when the CPU is free, and takes in what came meanwhile in one go. Faster with the
     * processes pinned, slower unpinned (docs/performance.md): off by default. The threads
     * of libuv's pool, made later, inherit it. */
    if (d.opt.sched_batch && sched_setscheduler(0, SCHED_BATCH, &(struct sched_param){ 0 }) < 0)
        log_warning("cannot run as SCHED_BATCH (%s): running as SCHED_OTHER", strerror(errno));
    wait_for_entropy();
    if (fds_warning(&d.opt, privs_raise_nofile(), err, sizeof(err)))
        log_warning("%s", err);

    uv_loop_t *loop = uv_default_loop();
    d.server = calloc(1, sizeof(*d.server));
    if (!d.server) {
        log_error("cannot start: out of memory");
        return 1;
    }
    int code = 1;
    if (setup(&d, loop) == 0) {
        uv_run(loop, UV_RUN_DEFAULT);
        code = d.server->failed ? 1 : 0;
        uv_signal_t *sigs[] = { &d.sig_term, &d.sig_int, &d.sig_hup };
        for (int i = 0; i < 3; i++) /* still open when the loop stopped on a failure */
            if (!uv_is_closing((uv_handle_t *)sigs[i]))
                uv_close((uv_handle_t *)sigs[i], NULL);
    }
    /* Only the socket it bound, and only while the path is still that file: an activated
     * socket belongs to the service manager, a path rebound since to another daemon's. Also
     * when setup failed after binding. */
    server_remove_socket(d.server);
    notify_stopping(&d.notify);
    server_stop(d.server);
    uv_run(loop, UV_RUN_DEFAULT); /* let closes and in-flight pool work finish */
    server_free(d.server);
    uv_run(loop, UV_RUN_DEFAULT);
    if (uv_loop_close(loop) != 0)
        log_warning("event loop closed with handles still open");
    free(d.server);
    if (code == 0)
        log_info("stopped");
    log_flush();
    options_free(&d.opt);
    options_free(&d.flags);
    return code;
}
