/* SPDX-License-Identifier: MIT */
/* autostart.c: see autostart.h. A private shmrefd for the calling uid:
 *   where:   $XDG_RUNTIME_DIR/shmref/ (else /tmp/shmref-UID/, or $HOME/.cache/shmref/
 *            when another uid took that name), a 0700 directory the uid owns, holding
 *            shmrefd.sock, shmrefd.lock and shmrefd.log;
 *   as whom: the caller, root included; it inherits no fd of the caller's but the lock;
 *   who:     --allow-users UID and a 0600 socket: no other uid connects;
 *   sizes:   pool: $SHMREF_POOL_SIZE, else pool-size in the user's shmrefd.conf, else the
 *            least of half the memory cgroup's room, half of /dev/shm's free space and a
 *            quarter of MemAvailable; tenant quota: $SHMREF_TENANT_QUOTA, else the file's,
 *            else the pool (one tenant); --private names the file, so refusals name the knobs;
 *   life:    --exit-idle $SHMREF_IDLE_EXIT_S (60): it exits when nothing is held;
 *   one:     the starter takes a flock on shmrefd.lock and the daemon inherits it, so
 *            the lock is held exactly while a private daemon lives (or is being
 *            started); a racer that cannot take it waits for the socket to answer.
 * The daemon is found at $SHMREF_DAEMON, else beside this library (a wheel's shmref/bin,
 * a prefix's bin or sbin), else on PATH. */
#include "autostart.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "paths.h"
#include "units.h"

#define AUTOSTART_IDLE_DEFAULT_S 60
#define AUTOSTART_WAIT_MAX_MS 30000
#define AUTOSTART_POLL_MS 5

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int fail(char *msg, size_t cap, int err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *msg, size_t cap, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return err;
}

/* enabled: $SHMREF_AUTOSTART unset, empty, or anything but 0/no/off/false. */
static bool enabled(void)
{
    const char *e = getenv("SHMREF_AUTOSTART");
    if (!e || !*e)
        return true;
    return strcmp(e, "0") && strcasecmp(e, "no") && strcasecmp(e, "off") && strcasecmp(e, "false");
}

/* probe: 0 if a daemon accepts connections at path (a full backlog counts: it lives),
 * else -errno of the connect (-ENOENT: nothing there, -EACCES: the socket refuses us). */
static int probe(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    int e = errno;
    close(fd);
    return r == 0 || e == EAGAIN ? 0 : -e;
}

static bool answers(const char *path)
{
    return probe(path) == 0;
}

/* refused_note: why the system socket refused this uid, and what would let it in, for the
 * private daemon's log (the library itself never logs). Empty when it did not refuse. */
static void refused_note(int err, char *note, size_t cap)
{
    note[0] = '\0';
    if (err != -EACCES && err != -EPERM)
        return;
    struct stat st;
    char group[64] = "";
    if (stat(PATHS_SYSTEM_SOCKET, &st) == 0) {
        struct group gr, *g = NULL;
        char buf[1024];
        if (getgrgid_r(st.st_gid, &gr, buf, sizeof(buf), &g) == 0 && g)
            snprintf(group, sizeof(group), "%s", g->gr_name);
        else
            snprintf(group, sizeof(group), "%u", (unsigned)st.st_gid);
    }
    snprintf(note, cap, "the system shmrefd at %s refused uid %u (%s): its socket admits group %s (mode %04o); "
             "join that group (then log in again) to use the system daemon", PATHS_SYSTEM_SOCKET,
             (unsigned)getuid(), strerror(-err), group[0] ? group : "?", (unsigned)(st.st_mode & 07777));
}

/* own_dir: dir, made 0700 if missing, checked to be a real directory of this uid that no
 * one else may enter. Returns 0; -EEXIST (with *ret_st) when something of another uid, or
 * not a directory, is there; another -errno when dir cannot be made or read. */
static int own_dir(const char *dir, bool make, struct stat *ret_st)
{
    if (make && mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -errno;
    if (lstat(dir, ret_st) < 0)
        return !make && errno == ENOENT ? 0 : -errno; /* not made yet: it would be */
    if (!S_ISDIR(ret_st->st_mode) || ret_st->st_uid != getuid())
        return -EEXIST;
    return ret_st->st_mode & 077 ? -EPERM : 0;
}

/* alt_dir: where the private daemon lives when /tmp/shmref-UID is taken by another uid
 * (which, in sticky /tmp, the victim cannot remove): ${XDG_CACHE_HOME:-$HOME/.cache}/shmref,
 * a directory of the uid's own that no other uid can plant. */
static int alt_dir(char *dir, size_t cap, bool make)
{
    const char *base = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = base && base[0] == '/' ? snprintf(dir, cap, "%s", base)
            : home && home[0] == '/' ? snprintf(dir, cap, "%s/.cache", home) : -1;
    if (n < 0)
        return -ENOENT;
    if ((size_t)n >= cap - sizeof("/shmref/shmrefd.sock"))
        return -ENAMETOOLONG;
    if (make && mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -errno;
    strcat(dir, "/shmref");
    struct stat st;
    int r = own_dir(dir, make, &st);
    return r == -EEXIST ? -EPERM : r;
}

int autostart_dir(char *dir, size_t cap, bool make, char *msg, size_t msgcap)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    bool runtime = xdg && *xdg && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid();
    int n = runtime ? snprintf(dir, cap, "%s/shmref", xdg) : snprintf(dir, cap, "/tmp/shmref-%u", (unsigned)getuid());
    if (n < 0 || (size_t)n >= cap - sizeof("/shmrefd.sock"))
        return fail(msg, msgcap, -ENAMETOOLONG, "private shmrefd: directory name too long: %s", dir);
    int r = own_dir(dir, make, &st);
    if (r == -EPERM)
        return fail(msg, msgcap, -EPERM, "private shmrefd: %s is yours but others may enter it (mode %04o): "
                    "chmod 0700 %s", dir, (unsigned)(st.st_mode & 07777), dir);
    if (r == -EEXIST && !runtime) {
        /* Planted in /tmp by another uid: the uid's own alternative, where no one plants. */
        char squatted[PATH_MAX];
        snprintf(squatted, sizeof(squatted), "%s", dir);
        int a = alt_dir(dir, cap, make);
        if (a == 0)
            return 1;
        return fail(msg, msgcap, -EPERM,
                    "private shmrefd: %s belongs to uid %u (%s, mode %04o), and in /tmp you cannot remove it; "
                    "the alternative, $XDG_CACHE_HOME or $HOME/.cache/shmref, is not usable either (%s): set "
                    "XDG_RUNTIME_DIR to a directory of yours (export XDG_RUNTIME_DIR=$(mktemp -d)), or ask root "
                    "to remove %s", squatted, (unsigned)st.st_uid, S_ISDIR(st.st_mode) ? "a directory" : "not a directory",
                    (unsigned)(st.st_mode & 07777), strerror(-a), squatted);
    }
    if (r == -EEXIST)
        return fail(msg, msgcap, -EPERM,
                    "private shmrefd: %s must be a directory of uid %u with mode 0700 (it is %s of uid %u, "
                    "mode %04o): remove it, or set SHMREFD_SOCKET", dir, (unsigned)getuid(),
                    S_ISDIR(st.st_mode) ? "a directory" : "not a directory", (unsigned)st.st_uid,
                    (unsigned)(st.st_mode & 07777));
    if (r < 0)
        return fail(msg, msgcap, r, "private shmrefd: cannot make %s: %s", dir, strerror(-r));
    return 0;
}

static bool executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* find_daemon_at: $SHMREF_DAEMON, beside this library, then PATH, as found (maybe a
 * relative path). */
static int find_daemon_at(char *exe, size_t cap, char *msg, size_t msgcap)
{
    const char *e = getenv("SHMREF_DAEMON");
    if (e && *e) {
        if (!executable(e))
            return fail(msg, msgcap, -ENOENT, "private shmrefd: SHMREF_DAEMON=%s is not an executable file", e);
        snprintf(exe, cap, "%s", e);
        return 0;
    }
    Dl_info info;
    if (dladdr((void *)autostart_socket, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s", info.dli_fname);
        *strrchr(dir, '/') = '\0';
        static const char *const near[] = { "bin/shmrefd", "../bin/shmrefd", "../sbin/shmrefd", "../../sbin/shmrefd",
                                            "shmrefd" };
        for (size_t i = 0; i < sizeof(near) / sizeof(near[0]); i++) {
            int n = snprintf(exe, cap, "%s/%s", dir, near[i]);
            if (n > 0 && (size_t)n < cap && executable(exe))
                return 0;
        }
    }
    const char *path = getenv("PATH");
    for (const char *p = path ? path : ""; *p;) {
        size_t len = strcspn(p, ":");
        int n = snprintf(exe, cap, "%.*s/shmrefd", (int)len, p);
        if (len && n > 0 && (size_t)n < cap && executable(exe))
            return 0;
        p += len + (p[len] == ':');
    }
    return fail(msg, msgcap, -ENOENT,
                "private shmrefd: no shmrefd answers at the default socket and none was found to start one "
                "(looked at SHMREF_DAEMON, beside libshmref, on PATH): install shmrefd or set SHMREF_DAEMON");
}

/* find_daemon: find_daemon_at's program as an absolute path: the daemon's child changes to
 * / before it execs (a relative SHMREF_DAEMON, PATH entry or library path would name
 * nothing there). */
static int find_daemon(char *exe, size_t cap, char *msg, size_t msgcap)
{
    int r = find_daemon_at(exe, cap, msg, msgcap);
    char abs[PATH_MAX];
    if (r < 0 || exe[0] == '/')
        return r;
    if (!realpath(exe, abs) || strlen(abs) >= cap)
        return fail(msg, msgcap, -ENOENT, "private shmrefd: cannot resolve %s: %s", exe, strerror(errno));
    snprintf(exe, cap, "%s", abs);
    return 0;
}

/* idle_seconds: $SHMREF_IDLE_EXIT_S when a number of seconds (0: never), else 60. */
static unsigned idle_seconds(void)
{
    const char *e = getenv("SHMREF_IDLE_EXIT_S");
    if (!e || !*e)
        return AUTOSTART_IDLE_DEFAULT_S;
    char *end;
    errno = 0;
    unsigned long v = strtoul(e, &end, 10);
    return errno || *end || v > 86400u * 365 ? AUTOSTART_IDLE_DEFAULT_S : (unsigned)v;
}

/* Limits at or above this are "no limit" (cgroup v1 reports PAGE_COUNTER_MAX pages). */
#define AUTOSTART_UNLIMITED (UINT64_C(1) << 62)
#define AUTOSTART_MIB (UINT64_C(1) << 20)

/* read_u64: the first number of a file ("max": UINT64_MAX). Returns 0 or -1. */
static int read_u64(const char *path, uint64_t *ret)
{
    FILE *f = fopen(path, "re");
    char buf[64];
    bool ok = f && fgets(buf, sizeof(buf), f);
    if (f)
        fclose(f);
    if (!ok)
        return -1;
    if (strncmp(buf, "max", 3) == 0) {
        *ret = UINT64_MAX;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || end == buf)
        return -1;
    *ret = v;
    return 0;
}

/* cgroup_room: what the caller's memory cgroup (v2, else v1's memory controller, as
 * /proc/self/cgroup names it under /sys/fs/cgroup) and its ancestors still allow: the
 * smallest limit minus use. UINT64_MAX when nothing limits it. The daemon it starts is in
 * the same cgroup, and its pool's pages are charged there. */
static uint64_t cgroup_room(void)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return UINT64_MAX;
    char line[2048], dir[PATH_MAX] = "";
    const char *root = NULL;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        bool v1 = strstr(c1 + 1, "memory") != NULL, v2 = strcmp(line, "0") == 0 && c1[1] == '\0';
        if (v1 || (v2 && !root)) {
            root = v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
            snprintf(dir, sizeof(dir), "%s%s", root, strcmp(c2 + 1, "/") ? c2 + 1 : "");
        }
    }
    fclose(f);
    if (!root)
        return UINT64_MAX;
    bool v1 = strcmp(root, "/sys/fs/cgroup/memory") == 0;
    uint64_t room = UINT64_MAX;
    for (size_t rl = strlen(root);;) {
        char p[PATH_MAX + 32];
        uint64_t limit, usage = 0;
        snprintf(p, sizeof(p), "%s/%s", dir, v1 ? "memory.limit_in_bytes" : "memory.max");
        if (read_u64(p, &limit) == 0 && limit < AUTOSTART_UNLIMITED) {
            snprintf(p, sizeof(p), "%s/%s", dir, v1 ? "memory.usage_in_bytes" : "memory.current");
            read_u64(p, &usage);
            uint64_t left = limit > usage ? limit - usage : 0;
            if (left < room)
                room = left;
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= rl || !slash || (size_t)(slash - dir) < rl)
            break;
        *slash = '\0';
    }
    return room;
}

/* mem_available: MemAvailable of /proc/meminfo in bytes (UINT64_MAX if unknown). */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f))
        found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    if (f)
        fclose(f);
    return found ? (uint64_t)kb * 1024 : UINT64_MAX;
}

/* config_keys: the [daemon] section's pool-size and tenant-quota of the user's config
 * file (shmrefd's --config format), as far as they are there and sizes. */
static void config_keys(const char *path, uint64_t *ret_pool, uint64_t *ret_quota)
{
    FILE *f = fopen(path, "re");
    char line[512];
    bool daemon = true; /* keys before any section: shmrefd reads them as [daemon]'s */
    while (f && fgets(line, sizeof(line), f)) {
        char *k = line + strspn(line, " \t"), *eq = strchr(k, '=');
        if (*k == '[') {
            daemon = strncmp(k, "[daemon]", 8) == 0;
            continue;
        }
        if (!daemon || !eq || *k == '#' || *k == ';')
            continue;
        size_t kl = (size_t)(eq - k);
        while (kl && (k[kl - 1] == ' ' || k[kl - 1] == '\t'))
            kl--;
        char *v = eq + 1 + strspn(eq + 1, " \t");
        v[strcspn(v, " \t\r\n;#")] = '\0';
        uint64_t n;
        if (units_parse(v, &n) < 0)
            continue;
        if (kl == 9 && strncmp(k, "pool-size", 9) == 0)
            *ret_pool = n;
        else if (kl == 12 && strncmp(k, "tenant-quota", 12) == 0)
            *ret_quota = n;
    }
    if (f)
        fclose(f);
}

/* env_size: $name as a size into *ret (0 when unset). -EINVAL with msg when not a size. */
static int env_size(const char *name, uint64_t *ret, char *msg, size_t msgcap)
{
    const char *e = getenv(name);
    *ret = 0;
    if (!e || !*e)
        return 0;
    if (units_parse(e, ret) < 0 || *ret == 0)
        return fail(msg, msgcap, -EINVAL, "private shmrefd: %s=%s is not a size (e.g. 512M, 4G)", name, e);
    return 0;
}

int autostart_sizes(struct autostart_sizes *ret, char *msg, size_t msgcap)
{
    memset(ret, 0, sizeof(*ret));
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    struct passwd pw, *p = NULL;
    char buf[1024];
    if ((!home || home[0] != '/') && getpwuid_r(getuid(), &pw, buf, sizeof(buf), &p) == 0 && p)
        home = p->pw_dir;
    if (xdg && xdg[0] == '/')
        snprintf(ret->config, sizeof(ret->config), "%s/shmref/shmrefd.conf", xdg);
    else if (home && home[0] == '/')
        snprintf(ret->config, sizeof(ret->config), "%s/.config/shmref/shmrefd.conf", home);
    else /* no home: the name, for messages; no file is read */
        snprintf(ret->config, sizeof(ret->config), "~/.config/shmref/shmrefd.conf");
    struct stat st;
    ret->config_exists = ret->config[0] == '/' && stat(ret->config, &st) == 0 && S_ISREG(st.st_mode);
    uint64_t file_pool = 0, file_quota = 0, env_pool, env_quota;
    if (ret->config_exists)
        config_keys(ret->config, &file_pool, &file_quota);
    int r = env_size("SHMREF_POOL_SIZE", &env_pool, msg, msgcap);
    if (r < 0 || (r = env_size("SHMREF_TENANT_QUOTA", &env_quota, msg, msgcap)) < 0)
        return r;
    char a[UNITS_TEXT_MAX];
    if (env_pool) {
        ret->pool = ret->pool_flag = env_pool;
        snprintf(ret->pool_why, sizeof(ret->pool_why), "SHMREF_POOL_SIZE");
    } else if (file_pool) {
        ret->pool = file_pool;
        snprintf(ret->pool_why, sizeof(ret->pool_why), "pool-size in %s", ret->config);
    } else {
        struct statvfs vfs;
        uint64_t cg = cgroup_room(), avail = mem_available(), shm = UINT64_MAX;
        if (statvfs("/dev/shm", &vfs) == 0)
            shm = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        uint64_t pool = avail / 4;
        const char *why = "a quarter of MemAvailable";
        if (cg / 2 < pool) {
            pool = cg / 2;
            why = "half of what the memory cgroup still allows";
        }
        if (shm / 2 < pool) {
            pool = shm / 2;
            why = "half of /dev/shm's free space";
        }
        if (pool == UINT64_MAX / 4) { /* nothing known: shmrefd's own default */
            pool = 0;
            why = "shmrefd's default";
        } else if (pool >= AUTOSTART_MIB) {
            pool -= pool % AUTOSTART_MIB;
        }
        ret->pool = ret->pool_flag = pool;
        snprintf(ret->pool_why, sizeof(ret->pool_why), "%s (%s)", why, units_format(pool, a));
    }
    if (env_quota) {
        ret->quota = ret->quota_flag = env_quota;
        snprintf(ret->quota_why, sizeof(ret->quota_why), "SHMREF_TENANT_QUOTA");
    } else if (file_quota) {
        ret->quota = file_quota;
        snprintf(ret->quota_why, sizeof(ret->quota_why), "tenant-quota in %s", ret->config);
    } else {
        ret->quota = ret->pool;
        snprintf(ret->quota_why, sizeof(ret->quota_why), "the pool: a private daemon has one tenant");
    }
    return 0;
}

/* close_from: closes every fd >= lo but keep_a and keep_b (async-signal-safe). */
static void close_from(int lo, int keep_a, int keep_b, int maxfd)
{
    int keep[2] = { keep_a < keep_b ? keep_a : keep_b, keep_a < keep_b ? keep_b : keep_a };
    for (int i = 0; i <= 2; i++) {
        int hi = i < 2 ? keep[i] - 1 : INT_MAX;
        if (hi >= lo && syscall(SYS_close_range, (unsigned)lo, (unsigned)hi, 0) < 0)
            for (int fd = lo; fd <= hi && fd < maxfd; fd++) /* kernel < 5.9 */
                close(fd);
        if (i < 2)
            lo = keep[i] + 1;
    }
}

/* spawn: the daemon, detached (setsid, reparented by a double fork), with the lock fd
 * and the write end of `alive` inherited and no other fd of the caller's (a pipe it
 * holds must see EOF when the caller exits, not when the daemon does): EOF on alive[0]
 * means it is gone. Root's daemon stays root (--user root): shmrefd otherwise gives root
 * up for nobody, whom any process of nobody may signal. Only async-signal-safe calls
 * between fork and exec (the caller may have threads). */
static int spawn(const char *exe, const char *sock, int logfd, int lockfd, int alive_w, const char *note,
                 char *msg, size_t msgcap)
{
    char uid[16], idle[16], banner[PATH_MAX * 3 + 1024], root[64] = "", config[PATH_MAX + 16];
    char pool[24], quota[24];
    struct autostart_sizes sz;
    int r = autostart_sizes(&sz, msg, msgcap);
    if (r < 0)
        return r;
    snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
    snprintf(idle, sizeof(idle), "%u", idle_seconds());
    snprintf(config, sizeof(config), "--config=%s", sz.config_exists ? sz.config : "");
    snprintf(pool, sizeof(pool), "%llu", (unsigned long long)sz.pool_flag);
    snprintf(quota, sizeof(quota), "%llu", (unsigned long long)sz.quota_flag);
    if (getuid() == 0) {
        struct passwd pw, *p = NULL;
        char buf[1024];
        snprintf(root, sizeof(root), "%s", getpwuid_r(0, &pw, buf, sizeof(buf), &p) == 0 && p ? p->pw_name : "root");
    }
    char *argv[24] = { (char *)exe, "--socket", (char *)sock, "--socket-mode", "0600", "--allow-users", uid,
                       "--exit-idle", idle, config, "--private", sz.config };
    int argc = 12;
    if (sz.pool_flag) {
        argv[argc++] = "--pool-size";
        argv[argc++] = pool;
    }
    if (sz.quota_flag) {
        argv[argc++] = "--tenant-quota";
        argv[argc++] = quota;
    }
    if (root[0]) {
        argv[argc++] = "--user";
        argv[argc++] = root;
    }
    argv[argc] = NULL;
    int blen = snprintf(banner, sizeof(banner), "libshmref (pid %d): %s%sstarting a private shmrefd:", (int)getpid(),
                        note, note[0] ? "; " : "");
    for (int i = 0; i < argc && blen > 0 && (size_t)blen < sizeof(banner); i++)
        blen += snprintf(banner + blen, sizeof(banner) - (size_t)blen, " %s", argv[i]);
    if (blen < 0 || (size_t)blen >= sizeof(banner) - 1)
        blen = 0;
    else
        banner[blen++] = '\n';
    long maxfd = sysconf(_SC_OPEN_MAX);
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nullfd < 0)
        return fail(msg, msgcap, -errno, "private shmrefd: /dev/null: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(nullfd);
        return fail(msg, msgcap, -e, "private shmrefd: fork: %s", strerror(e));
    }
    if (pid == 0) {
        setsid();
        if (fork() != 0)
            _exit(0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (chdir("/") < 0 || dup2(nullfd, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
            _exit(127);
        close_from(3, lockfd, alive_w, maxfd > 0 && maxfd < INT_MAX ? (int)maxfd : 65536);
        fcntl(lockfd, F_SETFD, 0);
        fcntl(alive_w, F_SETFD, 0);
        if (blen > 0 && write(2, banner, (size_t)blen) < 0)
            _exit(127);
        execv(exe, argv);
        int e = errno;
        (void)!write(alive_w, &e, sizeof(e));
        _exit(127);
    }
    close(nullfd);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return 0;
}

/* last_line: the log's last line (what a daemon that failed to start said). */
static void last_line(const char *log, char *buf, size_t cap)
{
    buf[0] = '\0';
    FILE *f = fopen(log, "re");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f))
        if (line[0] && line[0] != '\n') {
            size_t n = strnlen(line, cap - 1);
            memcpy(buf, line, n);
            buf[n] = '\0';
        }
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

/* start: with the lock held, the daemon at sock; waits until it answers. */
static int start(const char *dir, const char *sock, int lockfd, int64_t deadline, const char *note, char *msg,
                 size_t msgcap)
{
    char exe[PATH_MAX], log[PATH_MAX];
    int r = find_daemon(exe, sizeof(exe), msg, msgcap);
    if (r < 0)
        return r;
    snprintf(log, sizeof(log), "%s/shmrefd.log", dir);
    int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (logfd < 0)
        return fail(msg, msgcap, -errno, "private shmrefd: cannot open its log %s: %s", log, strerror(errno));
    struct stat st; /* one log across restarts, begun anew past 1 MiB (no daemon writes it now: the lock) */
    if (fstat(logfd, &st) == 0 && st.st_size > (1 << 20) && ftruncate(logfd, 0) < 0)
        (void)0;
    int alive[2];
    if (pipe2(alive, O_CLOEXEC) < 0) {
        close(logfd);
        return fail(msg, msgcap, -errno, "private shmrefd: pipe: %s", strerror(errno));
    }
    r = spawn(exe, sock, logfd, lockfd, alive[1], note, msg, msgcap);
    close(logfd);
    close(alive[1]);
    while (r == 0) {
        if (answers(sock))
            break;
        struct pollfd pf = { .fd = alive[0], .events = POLLIN };
        int64_t left = deadline - mono_ms();
        if (left <= 0) {
            r = fail(msg, msgcap, -ETIMEDOUT, "private shmrefd (%s) did not answer at %s in time (the connect "
                     "timeout, at most %d ms); its log: %s", exe, sock, AUTOSTART_WAIT_MAX_MS, log);
            break;
        }
        if (poll(&pf, 1, left < AUTOSTART_POLL_MS ? (int)left : AUTOSTART_POLL_MS) == 1) {
            int e = 0;
            ssize_t n = read(alive[0], &e, sizeof(e));
            if (answers(sock)) /* it may have started and closed its fds */
                break;
            char said[400];
            last_line(log, said, sizeof(said));
            r = n == (ssize_t)sizeof(e)
                    ? fail(msg, msgcap, -e, "private shmrefd: cannot run %s: %s; its log: %s", exe, strerror(e), log)
                    : fail(msg, msgcap, -ECONNREFUSED, "private shmrefd (%s) exited at start: %s; its log: %s", exe,
                           said[0] ? said : "(it said nothing)", log);
        }
    }
    close(alive[0]);
    return r;
}

int autostart_socket(int err, char *path, size_t cap, int64_t deadline, char *msg, size_t msgcap)
{
    /* Nothing at the default socket, or (no XDG_RUNTIME_DIR) the system socket refuses
     * this uid: the same choice either way, the private daemon. Never from a
     * setuid/setgid program: its environment (SHMREF_DAEMON, PATH) is the caller's. */
    bool refused = (err == -EACCES || err == -EPERM) && strcmp(path, PATHS_SYSTEM_SOCKET) == 0;
    if ((err != -ENOENT && err != -ECONNREFUSED && !refused) || !enabled() || getauxval(AT_SECURE))
        return err;
    const char *explicit = getenv("SHMREFD_SOCKET");
    if (explicit && *explicit)
        return err;
    /* A system daemon is always preferred. */
    int sys = refused ? err : strcmp(path, PATHS_SYSTEM_SOCKET) == 0 ? err : probe(PATHS_SYSTEM_SOCKET);
    if (sys == 0) {
        snprintf(path, cap, "%s", PATHS_SYSTEM_SOCKET);
        return 0;
    }
    char note[512];
    refused_note(sys, note, sizeof(note));
    char dir[PATH_MAX - 32], sock[PATH_MAX], lock[PATH_MAX];
    int r = autostart_dir(dir, sizeof(dir), true, msg, msgcap);
    if (r < 0)
        return r;
    snprintf(sock, sizeof(sock), "%s/shmrefd.sock", dir);
    snprintf(lock, sizeof(lock), "%s/shmrefd.lock", dir);
    if (strlen(sock) >= cap || strlen(sock) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return fail(msg, msgcap, -ENAMETOOLONG, "private shmrefd: socket path too long: %s", sock);
    if (deadline < 0 || deadline > mono_ms() + AUTOSTART_WAIT_MAX_MS)
        deadline = mono_ms() + AUTOSTART_WAIT_MAX_MS;
    int lockfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lockfd < 0)
        return fail(msg, msgcap, -errno, "private shmrefd: cannot open %s: %s", lock, strerror(errno));
    /* The lock is held while a private daemon lives: whoever cannot take it waits for
     * that daemon's socket (or for a dying one to let go). */
    for (r = 1; r == 1;) {
        if (answers(sock))
            r = 0;
        else if (flock(lockfd, LOCK_EX | LOCK_NB) == 0)
            r = answers(sock) ? 0 : start(dir, sock, lockfd, deadline, note, msg, msgcap);
        else if (errno != EWOULDBLOCK && errno != EINTR)
            r = fail(msg, msgcap, -errno, "private shmrefd: flock %s: %s", lock, strerror(errno));
        else if (mono_ms() >= deadline)
            r = fail(msg, msgcap, -ETIMEDOUT,
                     "private shmrefd: %s is locked (a private shmrefd starting or stopping) and %s did not "
                     "answer in time (at most %d ms); its log: %s/shmrefd.log", lock, sock, AUTOSTART_WAIT_MAX_MS, dir);
        else
            poll(NULL, 0, AUTOSTART_POLL_MS);
    }
    close(lockfd); /* the daemon keeps its inherited copy of the lock */
    if (r == 0)
        snprintf(path, cap, "%s", sock);
    return r;
}

/* add: appends a clause of the explanation ("; " between clauses). */
static void add(struct autostart_choice *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct autostart_choice *c, const char *fmt, ...)
{
    size_t n = strlen(c->why);
    if (n && n + 2 < sizeof(c->why)) {
        memcpy(c->why + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why + n, sizeof(c->why) - n, fmt, ap);
    va_end(ap);
}

int autostart_which(const char *named, struct autostart_choice *ret)
{
    memset(ret, 0, sizeof(*ret));
    const char *env = getenv("SHMREFD_SOCKET");
    char def[PATH_MAX];
    if (named || (env && *env)) { /* a choice: that socket or nothing */
        snprintf(ret->socket, sizeof(ret->socket), "%s", named ? named : env);
        ret->kind = AUTOSTART_NAMED;
        int e = probe(ret->socket);
        add(ret, "named by %s: a choice, so nothing is started; %s", named ? "--socket" : "$SHMREFD_SOCKET",
            e ? strerror(-e) : "a daemon answers there");
        ret->answers = e == 0;
        return 0;
    }
    if (paths_default_socket(def, sizeof(def)) < 0)
        return -ENAMETOOLONG;
    snprintf(ret->socket, sizeof(ret->socket), "%s", def);
    int e = probe(def);
    if (e == 0) {
        ret->kind = strcmp(def, PATHS_SYSTEM_SOCKET) == 0 ? AUTOSTART_SYSTEM : AUTOSTART_DEFAULT;
        ret->answers = true;
        add(ret, "a daemon answers at the default socket %s", def);
        return 0;
    }
    bool refused = (e == -EACCES || e == -EPERM) && strcmp(def, PATHS_SYSTEM_SOCKET) == 0;
    if (strcmp(def, PATHS_SYSTEM_SOCKET) != 0)
        add(ret, "no daemon at the default socket %s (%s)", def, strerror(-e));
    ret->kind = AUTOSTART_NONE;
    if ((e != -ENOENT && e != -ECONNREFUSED && !refused) || !enabled() || getauxval(AT_SECURE)) {
        add(ret, "%s: a connect fails", !enabled() ? "SHMREF_AUTOSTART turns the private daemon off"
                 : getauxval(AT_SECURE) ? "a setuid program starts no daemon" : "that is not a missing daemon");
        return 0;
    }
    int sys = strcmp(def, PATHS_SYSTEM_SOCKET) == 0 ? e : probe(PATHS_SYSTEM_SOCKET);
    if (sys == 0) {
        snprintf(ret->socket, sizeof(ret->socket), "%s", PATHS_SYSTEM_SOCKET);
        ret->kind = AUTOSTART_SYSTEM;
        ret->answers = true;
        add(ret, "the system socket %s answers: a system daemon is always preferred", PATHS_SYSTEM_SOCKET);
        return 0;
    }
    char note[512];
    refused_note(sys, note, sizeof(note));
    if (note[0])
        add(ret, "system socket %s: refused uid %u (%s): %s", PATHS_SYSTEM_SOCKET, (unsigned)getuid(), strerror(-sys),
            strstr(note, "): ") ? strstr(note, "): ") + 3 : note);
    else
        add(ret, "system socket %s: %s", PATHS_SYSTEM_SOCKET, sys == -ENOENT ? "absent" : strerror(-sys));
    char dir[PATH_MAX - 32], msg[1024];
    int r = autostart_dir(dir, sizeof(dir), false, msg, sizeof(msg));
    if (r < 0) {
        add(ret, "%s", msg);
        return 0;
    }
    if (r == 1)
        add(ret, "/tmp/shmref-%u is another uid's (ask root to remove it): yours is %s", (unsigned)getuid(), dir);
    snprintf(ret->socket, sizeof(ret->socket), "%s/shmrefd.sock", dir);
    ret->answers = answers(ret->socket);
    ret->kind = ret->answers ? AUTOSTART_PRIVATE : AUTOSTART_PRIVATE_START;
    add(ret, ret->answers ? "your private daemon answers at %s" : "no private daemon at %s: the next connect starts one",
        ret->socket);
    if (!ret->answers) {
        if (find_daemon(ret->program, sizeof(ret->program), msg, sizeof(msg)) < 0)
            add(ret, "%s", msg);
        if (autostart_sizes(&ret->sizes, msg, sizeof(msg)) < 0)
            add(ret, "%s", msg);
    }
    return 0;
}
