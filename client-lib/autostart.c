/* SPDX-License-Identifier: MIT */
/* autostart.c: see autostart.h. A private shmrefd for the calling uid:
 *   where:   $XDG_RUNTIME_DIR/shmref/ (else /tmp/shmref-UID/), a 0700 directory the uid
 *            owns, holding shmrefd.sock, shmrefd.lock and shmrefd.log;
 *   who:     --allow-users UID and a 0600 socket: no other uid connects;
 *   sizes:   the daemon's defaults, from its memory cgroup (the user's) and /dev/shm;
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
#include <limits.h>
#include <poll.h>
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
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "paths.h"

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

/* answers: a daemon accepts connections at path (a full backlog counts: it lives). */
static bool answers(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(sa.sun_path))
        return false;
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return false;
    int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    int e = errno;
    close(fd);
    return r == 0 || e == EAGAIN;
}

/* private_dir: the uid's directory, made 0700 if missing; refused unless it is a real
 * directory of this uid that no one else may enter. */
static int private_dir(char *dir, size_t cap, char *msg, size_t msgcap)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    int n = xdg && *xdg && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid()
                ? snprintf(dir, cap, "%s/shmref", xdg)
                : snprintf(dir, cap, "/tmp/shmref-%u", (unsigned)getuid());
    if (n < 0 || (size_t)n >= cap - sizeof("/shmrefd.sock"))
        return fail(msg, msgcap, -ENAMETOOLONG, "private shmrefd: directory name too long: %s", dir);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return fail(msg, msgcap, -errno, "private shmrefd: cannot make %s: %s", dir, strerror(errno));
    if (lstat(dir, &st) < 0)
        return fail(msg, msgcap, -errno, "private shmrefd: %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        return fail(msg, msgcap, -EPERM,
                    "private shmrefd: %s must be a directory of uid %u with mode 0700 (it is %s of uid %u, "
                    "mode %04o): remove it, or set SHMREFD_SOCKET", dir, (unsigned)getuid(),
                    S_ISDIR(st.st_mode) ? "a directory" : "not a directory", (unsigned)st.st_uid,
                    (unsigned)(st.st_mode & 07777));
    return 0;
}

static bool executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* find_daemon: $SHMREF_DAEMON, beside this library, then PATH. */
static int find_daemon(char *exe, size_t cap, char *msg, size_t msgcap)
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

/* spawn: the daemon, detached (setsid, reparented by a double fork), with the lock fd
 * and the write end of `alive` inherited: EOF on alive[0] means it is gone. Only
 * async-signal-safe calls between fork and exec (the caller may have threads). */
static int spawn(const char *exe, const char *sock, int logfd, int lockfd, int alive_w, char *msg, size_t msgcap)
{
    char uid[16], idle[16], banner[PATH_MAX * 2 + 200];
    snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
    snprintf(idle, sizeof(idle), "%u", idle_seconds());
    char *const argv[] = { (char *)exe, "--socket", (char *)sock, "--socket-mode", "0600", "--allow-users", uid,
                           "--exit-idle", idle, "--config=", NULL };
    int blen = snprintf(banner, sizeof(banner), "libshmref (pid %d): starting a private shmrefd: %s --socket %s "
                        "--socket-mode 0600 --allow-users %s --exit-idle %s --config=\n", (int)getpid(), exe, sock,
                        uid, idle);
    if (blen < 0 || (size_t)blen >= sizeof(banner))
        blen = 0;
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
static int start(const char *dir, const char *sock, int lockfd, int64_t deadline, char *msg, size_t msgcap)
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
    r = spawn(exe, sock, logfd, lockfd, alive[1], msg, msgcap);
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
    /* Never from a setuid/setgid program: its environment (SHMREF_DAEMON, PATH) is the
     * caller's to choose. */
    if ((err != -ENOENT && err != -ECONNREFUSED) || !enabled() || getauxval(AT_SECURE))
        return err;
    const char *explicit = getenv("SHMREFD_SOCKET");
    if (explicit && *explicit)
        return err;
    /* A system daemon is always preferred. */
    if (strcmp(path, PATHS_SYSTEM_SOCKET) != 0 && answers(PATHS_SYSTEM_SOCKET)) {
        snprintf(path, cap, "%s", PATHS_SYSTEM_SOCKET);
        return 0;
    }
    char dir[PATH_MAX - 32], sock[PATH_MAX], lock[PATH_MAX];
    int r = private_dir(dir, sizeof(dir), msg, msgcap);
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
            r = answers(sock) ? 0 : start(dir, sock, lockfd, deadline, msg, msgcap);
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
