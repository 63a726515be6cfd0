/* SPDX-License-Identifier: MIT */
/* test-service.c: shmrefd as a system service, without systemd as PID 1: socket
 * activation through systemd-socket-activate with a test-owned NOTIFY_SOCKET, the
 * privilege drop, the access policy, the config file and SIGHUP reloads. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "launcher.h"


/* ---- a NOTIFY_SOCKET of our own, that sees who sent each message ---- */

struct notify_listener {
    int fd;
    char path[128];
};

static void notify_open(struct notify_listener *n, const char *dir)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(n->path, sizeof(n->path), "%s/notify.sock", dir);
    strcpy(sa.sun_path, n->path);
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(n->fd, 0);
    int one = 1;
    cr_assert_eq(setsockopt(n->fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
    cr_assert_eq(bind(n->fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "bind %s: %s", n->path, strerror(errno));
}

/* notify_wait: the next message containing want (e.g. "READY=1"), within ms; returns
 * the sender's pid, or -1 on timeout. Messages without want are skipped. */
static pid_t notify_wait(struct notify_listener *n, const char *want, int ms, char *text, size_t cap)
{
    long deadline = now_ms() + ms;
    for (;;) {
        long left = deadline - now_ms();
        struct pollfd p = { .fd = n->fd, .events = POLLIN };
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            return -1;
        char buf[4096];
        union {
            struct cmsghdr h;
            char c[CMSG_SPACE(sizeof(struct ucred))];
        } ctl;
        struct iovec iov = { buf, sizeof(buf) - 1 };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.c, .msg_controllen = sizeof(ctl.c) };
        ssize_t len = recvmsg(n->fd, &mh, 0);
        if (len < 0)
            continue;
        buf[len] = '\0';
        pid_t pid = -1;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS) {
                struct ucred uc;
                memcpy(&uc, CMSG_DATA(cm), sizeof(uc));
                pid = uc.pid;
            }
        if (strstr(buf, want)) {
            if (text && cap) {
                size_t k = strlen(buf) < cap - 1 ? strlen(buf) : cap - 1;
                memcpy(text, buf, k);
                text[k] = '\0';
            }
            return pid;
        }
    }
}

static void make_dir(char *dir)
{
    strcpy(dir, "/tmp/shmref-svc-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    chmod(dir, 0755);
}

static void remove_dir(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* unix_listening: whether /proc/net/unix lists a listening socket (__SO_ACCEPTCON in its
 * flags) bound at path. */
static bool unix_listening(const char *path)
{
    FILE *f = fopen("/proc/net/unix", "re");
    char line[4352];
    bool found = false;
    if (!f)
        return access(path, F_OK) == 0;
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned long flags;
        char p[4096] = "";
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "%*s %*s %*s %lx %*s %*s %*s %4095s", &flags, p) == 2 && strcmp(p, path) == 0)
            found = (flags & 0x10000) != 0;
    }
    fclose(f);
    return found;
}

/* activate: systemd-socket-activate listening at sock (seqpacket or stream), which
 * execs shmrefd on the first connection, in the same process (so the same pid). */
static pid_t activate(const char *dir, const char *sock, const char *notify, int seqpacket, int watchdog_usec)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        char log[160], env_notify[200], env_wd[64], env_wdpid[64];
        snprintf(log, sizeof(log), "%s/shmrefd.log", dir);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        snprintf(env_notify, sizeof(env_notify), "NOTIFY_SOCKET=%s", notify);
        snprintf(env_wd, sizeof(env_wd), "WATCHDOG_USEC=%d", watchdog_usec);
        snprintf(env_wdpid, sizeof(env_wdpid), "WATCHDOG_PID=%d", (int)getpid());
        const char *argv[16];
        int n = 0;
        argv[n++] = "systemd-socket-activate";
        if (seqpacket)
            argv[n++] = "--seqpacket";
        argv[n++] = "-l";
        argv[n++] = sock;
        argv[n++] = "-E";
        argv[n++] = env_notify;
        argv[n++] = "-E";
        argv[n++] = env_wd;
        argv[n++] = "-E";
        argv[n++] = env_wdpid;
        argv[n++] = SHMREFD_BIN;
        argv[n++] = "--verbose";
        argv[n++] = "--user"; /* the notify socket is in the test's root-only directory */
        argv[n++] = "root";
        argv[n] = NULL;
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    /* It binds before it listens: wait for the listening state (without connecting,
     * which would start the daemon early), or the first connect may be refused. */
    long deadline = now_ms() + 5000;
    while (!unix_listening(sock)) {
        cr_assert_lt(now_ms(), deadline, "systemd-socket-activate did not listen at %s", sock);
        usleep(5000);
    }
    return pid;
}

Test(service, socket_activation_notify_and_watchdog, .timeout = 60)
{
    char dir[64], sock[128], text[512];
    struct notify_listener n;
    make_dir(dir);
    snprintf(sock, sizeof(sock), "%s/shmrefd.sock", dir);
    notify_open(&n, dir);
    pid_t pid = activate(dir, sock, n.path, 1, 200000);

    /* The first connection starts the daemon, which serves it on the passed socket. */
    shmref_conn *c;
    int r = shmref_connect(sock, &c);
    cr_assert_eq(r, 0, "connect through the activated socket: %s", strerror(-r));
    cr_assert_eq(shmref_daemon_pid(c), pid, "the daemon runs in the activator's process");
    pid_t from = notify_wait(&n, "READY=1", 5000, text, sizeof(text));
    cr_assert_eq(from, pid, "READY=1 must come from the daemon's own pid (got %d)", (int)from);
    cr_assert(strstr(text, "STATUS="), "READY=1 carries a STATUS line: %s", text);

    shmref_buf *b, *b2;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0);
    memset(shmref_buf_data(b), 7, 1 << 20);
    cr_assert_eq(shmref_publish(b, 1 << 20, 0, NULL, 0, &desc), 0);
    cr_assert_eq(shmref_acquire(c, &desc, &b2), 0);
    cr_assert_eq(((unsigned char *)shmref_buf_data(b2))[4242], 7);

    /* WATCHDOG_USEC=200 ms: a ping every 100 ms. Count over 1.5 s. */
    long t0 = now_ms();
    int pings = 0;
    while (now_ms() - t0 < 1500)
        if (notify_wait(&n, "WATCHDOG=1", 200, NULL, 0) == pid)
            pings++;
    cr_assert(pings >= 7 && pings <= 20, "expected ~15 watchdog pings in 1.5 s, got %d", pings);

    cr_assert_eq(kill(pid, SIGTERM), 0);
    cr_assert_eq(notify_wait(&n, "STOPPING=1", 5000, NULL, 0), pid);
    cr_assert_eq(child_wait(pid), 0);
    cr_assert_eq(access(sock, F_OK), 0, "an activated socket belongs to the service manager: left in place");
    shmref_close(c);
    close(n.fd);
    remove_dir(dir);
}

Test(service, socket_activation_refuses_a_stream_socket, .timeout = 30)
{
    char dir[64], sock[128], log[160], cmd[400];
    struct notify_listener n;
    make_dir(dir);
    snprintf(sock, sizeof(sock), "%s/shmrefd.sock", dir);
    notify_open(&n, dir);
    pid_t pid = activate(dir, sock, n.path, 0, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    strcpy(sa.sun_path, sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(child_wait(pid), 1, "a stream socket must be refused with exit 1");
    close(fd);
    snprintf(log, sizeof(log), "%s/shmrefd.log", dir);
    snprintf(cmd, sizeof(cmd), "grep -q 'needs exactly one listening SOCK_SEQPACKET' '%s'", log);
    cr_assert_eq(system(cmd), 0, "the log says why");
    close(n.fd);
    remove_dir(dir);
}

/* ---- privileges ---- */

static void proc_status(pid_t pid, const char *field, char *ret, size_t cap)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    ret[0] = '\0';
    size_t n = strlen(field);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            char *v = line + n + 1;
            v += strspn(v, " \t");
            v[strcspn(v, "\n")] = '\0';
            snprintf(ret, cap, "%s", v);
        }
    fclose(f);
}

Test(service, drops_every_capability_and_sets_no_new_privs)
{
    struct daemon d;
    char v[128];
    cr_assert_eq(geteuid(), 0, "this test runs as root, like CI");
    daemon_start(&d, NULL);
    proc_status(d.pid, "CapEff", v, sizeof(v));
    cr_assert_str_eq(v, "0000000000000000");
    proc_status(d.pid, "CapPrm", v, sizeof(v));
    cr_assert_str_eq(v, "0000000000000000");
    proc_status(d.pid, "CapBnd", v, sizeof(v));
    cr_assert_str_eq(v, "0000000000000000");
    proc_status(d.pid, "NoNewPrivs", v, sizeof(v));
    cr_assert_str_eq(v, "1");
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0, "still serves without privileges: %s", shmref_errmsg(c));
    shmref_close(c);
    daemon_stop(&d);
}

/* SCHED_OTHER by default; SCHED_BATCH with --sched-batch (a client's one-way message
 * never preempts it), and it serves. */
Test(service, runs_as_sched_batch_when_told)
{
    struct daemon d;
    daemon_start(&d, NULL);
    cr_assert_eq(sched_getscheduler(d.pid), SCHED_OTHER);
    daemon_stop(&d);
    daemon_start(&d, "--sched-batch", NULL);
    cr_assert_eq(sched_getscheduler(d.pid), SCHED_BATCH);
    shmref_conn *c = connect_ok(&d);
    cr_assert_eq(shmref_ping(c), 0);
    shmref_close(c);
    daemon_stop(&d);
}

Test(service, user_switches_to_that_user)
{
    struct daemon d;
    char v[128];
    daemon_start(&d, "--user", "nobody", NULL);
    proc_status(d.pid, "Uid", v, sizeof(v));
    cr_assert_str_eq(v, "65534\t65534\t65534\t65534");
    proc_status(d.pid, "CapEff", v, sizeof(v));
    cr_assert_str_eq(v, "0000000000000000");
    proc_status(d.pid, "NoNewPrivs", v, sizeof(v));
    cr_assert_str_eq(v, "1");
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, 1 << 20, &b), 0, "%s", shmref_errmsg(c));
    shmref_close(c);
    daemon_stop(&d);
}

/* ---- access policy ---- */

static struct daemon d_access;

struct ids {
    uid_t uid;
    gid_t gid; /* the only group: primary and supplementary */
};

static int connect_as(void *arg)
{
    const struct ids *id = arg;
    shmref_conn *c;
    if (setgroups(1, &id->gid) < 0 || setgid(id->gid) < 0 || setuid(id->uid) < 0)
        return 100;
    int r = shmref_connect(d_access.socket, &c);
    if (r == -EACCES)
        return 13;
    if (r < 0)
        return 101;
    r = shmref_ping(c);
    shmref_close(c);
    return r == 0 ? 0 : 102;
}

Test(service, refuses_a_peer_uid_not_allowed)
{
    daemon_start(&d_access, "--allow-users", "1000", "--socket-mode", "0666", NULL);
    struct ids nobody = { 65534, 65534 }, allowed = { 1000, 65534 };
    cr_assert_eq(child_wait(child_run(connect_as, &nobody)), 13, "uid 65534 should get EACCES");
    cr_assert_eq(child_wait(child_run(connect_as, &allowed)), 0, "uid 1000 is allowed");
    shmref_conn *c = connect_ok(&d_access); /* root always is */
    shmref_close(c);
    cr_assert(daemon_log_contains(&d_access, "refused client pid="), "a log line names the peer");
    cr_assert(daemon_log_contains(&d_access, "uid=65534"));
    cr_assert_eq(status_u64(&d_access, "counters.refused_access"), 1);
    daemon_stop(&d_access);
}

Test(service, allow_groups_admits_members_only)
{
    daemon_start(&d_access, "--allow-groups", "nogroup", "--socket-mode", "0666", NULL);
    struct ids member = { 65534, 65534 }, other = { 65534, 1000 };
    cr_assert_eq(child_wait(child_run(connect_as, &member)), 0, "gid nogroup is allowed");
    cr_assert_eq(child_wait(child_run(connect_as, &other)), 13, "the same uid in another group is not");
    cr_assert_eq(status_u64(&d_access, "counters.refused_access"), 1);
    daemon_stop(&d_access);
}

/* ---- config file ---- */

/* run: shmrefd with args; its stdout+stderr into out. Returns the exit status. */
static int run(char *out, size_t cap, const char *const *args)
{
    int r = launcher_run(SHMREFD_BIN, args, out, cap);
    cr_assert_geq(r, 0, "running shmrefd: %s", strerror(-r));
    return r;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

Test(service, check_config_prints_the_effective_configuration)
{
    char dir[64], conf[128], out[8192];
    make_dir(dir);
    snprintf(conf, sizeof(conf), "%s/shmrefd.conf", dir);
    write_file(conf, "# a comment\n[daemon]\npool-size = 64M\ntenant-quota = 8M\nmax-leases = 77\n"
                     "allow-users = 0 nobody\n\n[quota]\n1000 = 2M\nnobody = 3M\n");
    const char *args[] = { "--config", conf, "--pool-size", "32M", "--check-config", NULL };
    cr_assert_eq(run(out, sizeof(out), args), 0, "%s", out);
    cr_assert(strstr(out, "pool-size = 33554432\n"), "the flag wins over the file:\n%s", out);
    cr_assert(strstr(out, "tenant-quota = 8388608\n"), "the file wins over defaults:\n%s", out);
    cr_assert(strstr(out, "max-leases = 77\n"), "%s", out);
    cr_assert(strstr(out, "max-clients = 1024\n"), "defaults fill the rest:\n%s", out);
    cr_assert(strstr(out, "max-lease-size = 33554432\n"), "derived from the pool size in force:\n%s", out);
    cr_assert(strstr(out, "allow-users = 0 65534\n"), "names resolve to uids:\n%s", out);
    cr_assert(strstr(out, "1000 = 2097152\n") && strstr(out, "65534 = 3145728\n"), "%s", out);
    remove_dir(dir);
}

Test(service, bad_config_files_name_the_line)
{
    static const struct { const char *text, *want; } cases[] = {
        { "[daemon]\npool-size = 1G\nbogus = 1\n", ":3: unknown key 'bogus' in [daemon]" },
        { "[daemon]\n\npool-size = lots\n", ":3: pool-size: 'lots' is not a size" },
        { "[daemon]\nmax-leases = 0\n", ":2: max-leases: '0' is not a number of at least 1" },
        { "[daemon]\nsocket-mode = 999\n", ":2: socket-mode: '999' is not an octal file mode" },
        { "[daemon]\nmemfd = maybe\n", ":2: memfd: 'maybe' is not yes or no" },
        { "[daemon]\nallow-users = no-such-user-here\n", ":2: allow-users: unknown user 'no-such-user-here'" },
        { "[pool]\nsize = 1\n", ":2: unknown section [pool]" },
        { "[quota]\n1000 = big\n", ":2: [quota] 1000: 'big' is not a size" },
        { "[daemon]\nthis line has no equals sign\n", ":2: " },
    };
    char dir[64], conf[128], out[4096];
    make_dir(dir);
    snprintf(conf, sizeof(conf), "%s/shmrefd.conf", dir);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_file(conf, cases[i].text);
        const char *args[] = { "--config", conf, "--check-config", NULL };
        cr_assert_eq(run(out, sizeof(out), args), 1, "case %zu should fail: %s", i, out);
        cr_assert(strstr(out, cases[i].want), "case %zu: expected '%s' in: %s", i, cases[i].want, out);
        cr_assert(strstr(out, conf), "case %zu: the message names the file: %s", i, out);
    }
    const char *missing[] = { "--config", "/nonexistent/shmrefd.conf", "--check-config", NULL };
    cr_assert_eq(run(out, sizeof(out), missing), 1);
    cr_assert(strstr(out, "/nonexistent/shmrefd.conf: No such file"), "%s", out);
    const char *badflag[] = { "--pool-size", "huge", NULL };
    cr_assert_eq(run(out, sizeof(out), badflag), 2, "a bad flag is a usage error");
    remove_dir(dir);
}

Test(service, sighup_reloads_quotas_without_dropping_clients, .timeout = 60)
{
    struct daemon d;
    char dir[64], conf[128];
    struct notify_listener n;
    make_dir(dir);
    snprintf(conf, sizeof(conf), "%s/shmrefd.conf", dir);
    notify_open(&n, dir);
    /* Root given no --user serves as an unprivileged user: it must reach the notify
     * socket and re-read the file there. */
    chmod(dir, 0755);
    chmod(n.path, 0777);
    write_file(conf, "[daemon]\ntenant-quota = 1M\n");
    setenv("NOTIFY_SOCKET", n.path, 1);
    daemon_start(&d, "--config", conf, "--pool-size", "64M", NULL);
    unsetenv("NOTIFY_SOCKET");
    cr_assert_eq(notify_wait(&n, "READY=1", 5000, NULL, 0), d.pid);

    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, 2 << 20, &b), -EDQUOT);
    cr_assert_eq(status_u64(&d, "limits.tenant_quota"), 1 << 20);

    write_file(conf, "[daemon]\ntenant-quota = 4M\n[quota]\n65534 = 5M\n");
    cr_assert_eq(kill(d.pid, SIGHUP), 0);
    cr_assert_eq(notify_wait(&n, "RELOADING=1", 5000, NULL, 0), d.pid);
    cr_assert_eq(notify_wait(&n, "READY=1", 5000, NULL, 0), d.pid);
    cr_assert_eq(status_u64(&d, "limits.tenant_quota"), 4 << 20);
    cr_assert_eq(shmref_lease(c, 2 << 20, &b), 0, "the same connection, the new quota: %s", shmref_errmsg(c));

    /* A broken file is reported and the configuration in force stays. */
    write_file(conf, "[daemon]\ntenant-quota = ???\n");
    cr_assert_eq(kill(d.pid, SIGHUP), 0);
    cr_assert_eq(notify_wait(&n, "READY=1", 5000, NULL, 0), d.pid);
    cr_assert_eq(status_u64(&d, "limits.tenant_quota"), 4 << 20);
    cr_assert(daemon_log_contains(&d, "reload failed, keeping the configuration in force"));

    /* A file that parses but fails later (an unknown user) leaks nothing: under
     * LeakSanitizer a leak makes the daemon's exit status non-zero at daemon_stop. */
    for (int i = 0; i < 3; i++) {
        write_file(conf, "[daemon]\ntenant-quota = 2M\nuser = shmref-no-such-user\n");
        cr_assert_eq(kill(d.pid, SIGHUP), 0);
        cr_assert_eq(notify_wait(&n, "READY=1", 5000, NULL, 0), d.pid);
    }
    cr_assert(daemon_log_contains(&d, "unknown user 'shmref-no-such-user'"));
    cr_assert_eq(status_u64(&d, "limits.tenant_quota"), 4 << 20);

    /* Restart-only keys are not applied, and the log says so. */
    write_file(conf, "[daemon]\ntenant-quota = 4M\npool-size = 128M\n");
    cr_assert_eq(kill(d.pid, SIGHUP), 0);
    cr_assert_eq(notify_wait(&n, "READY=1", 5000, NULL, 0), d.pid);
    cr_assert_eq(status_u64(&d, "limits.pool_size"), 64 << 20, "the --pool-size flag still wins");
    cr_assert_eq(shmref_ping(c), 0, "the client survived three reloads");
    shmref_close(c);
    daemon_stop(&d);
    close(n.fd);
    remove_dir(dir);
}
