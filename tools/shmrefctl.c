/* SPDX-License-Identifier: MIT */
/* shmrefctl.c: the operators' and scripts' tool, built on the public libshmref API only.
 * Commands: status [--json] [--buffers], top, metrics [--output FILE], put [--keep-ms N] [--max-gets N] [--sealed]
 * FILE|-, get -|@FILE [-o FILE] (the descriptor from stdin or a file), ping, which (libshmref's
 * rule for finding or starting the daemon: client-lib/autostart.c, compiled in).
 * Exit status: 0 done, 1 the daemon or the system refused, 2 usage error. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "autostart.h"
#include "metrics.h"
#include "paths.h"
#include "shmref/shmref.h"
#include "hint.h"
#include "top.h"
#include "units.h"

#define PUT_DEFAULT_KEEP_MS 300000

static const char usage[] =
    "Usage: shmrefctl [--socket PATH] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  status [--json] [--buffers]     the daemon's pool, tenants, clients and counters\n"
    "                                  (--buffers: and every live buffer)\n"
    "  top [--delay SECONDS] [--once]  a live view of clients, tenants, buffers and rates\n"
    "                                  (q quits)\n"
    "  put [--keep-ms N] [--max-gets N] [--sealed] FILE|-\n"
    "                                  copy FILE (or stdin) into a buffer, publish it, and\n"
    "                                  print its descriptor; the daemon keeps it N ms\n"
    "                                  (default 300000) for every get, or until N gets;\n"
    "                                  --sealed: nobody can change it (a memfd pool)\n"
    "  get -|@FILE [-o FILE]           write a published buffer to FILE (default stdout);\n"
    "                                  its descriptor is read from stdin (-) or from a\n"
    "                                  file (@FILE, or --descriptor-file FILE); one given\n"
    "                                  as the argument works, with a warning: every user\n"
    "                                  can read it in /proc/PID/cmdline\n"
    "  metrics [--output FILE]         the status in Prometheus text format (for\n"
    "                                  node_exporter's textfile collector); --output\n"
    "                                  replaces FILE atomically, with shmref_up 0 when\n"
    "                                  the daemon is down\n"
    "  ping                            one round trip to the daemon\n"
    "  which                           the daemon a connect would use, why, and its limits\n"
    "                                  (its pid and uid, pool size, your quota); starts\n"
    "                                  nothing\n"
    "\n"
    "Options (before or after the command):\n"
    "  -s, --socket PATH   the daemon's socket (default: $SHMREFD_SOCKET, else\n"
    "                      $XDG_RUNTIME_DIR/shmrefd.sock, else /run/shmrefd/shmrefd.sock)\n"
    "  -h, --help          show this help\n"
    "  -V, --version       show the version\n";

static const char *socket_path;

static int fail(shmref_conn *conn, const char *what, int r)
{
    const char *msg = conn ? shmref_errmsg(conn) : "";
    fprintf(stderr, "shmrefctl: %s: %s%s%s\n", what, strerror(-r), *msg ? ": " : "", msg);
    return 1;
}

/* the_socket: the path a connect uses (the default rule when --socket is not given). */
static const char *the_socket(char buf[4096])
{
    if (socket_path)
        return socket_path;
    return paths_default_socket(buf, 4096) == 0 ? buf : "the default socket";
}

static int connect_or_fail(shmref_conn **conn)
{
    char def[4096];
    int r = shmref_connect(socket_path, conn);
    if (r < 0) {
        /* When the daemon answered, its refusal says why (allow-users, max-clients); so
         * does a private daemon that could not be started (its log file). */
        const char *why = shmref_errmsg(NULL);
        if (strncmp(why, "shmrefd at ", 11) == 0 || strncmp(why, "private shmrefd", 15) == 0)
            fprintf(stderr, "shmrefctl: %s (%s)\n", why, strerror(-r));
        else
            fprintf(stderr, "shmrefctl: cannot reach shmrefd at %s: %s%s\n", the_socket(def), strerror(-r),
                    hint_connect(the_socket(def), r));
        return 1;
    }
    return 0;
}

static uint64_t u64(const shmref_status *st, const char *path)
{
    uint64_t v = 0;
    shmref_status_u64(st, path, &v);
    return v;
}

static const char *str(const shmref_status *st, const char *path)
{
    const char *s = "?";
    shmref_status_str(st, path, &s);
    return s;
}

static const char *size_at(const shmref_status *st, const char *path, char buf[UNITS_TEXT_MAX])
{
    return units_format(u64(st, path), buf);
}

static void print_table(const shmref_status *st)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], c[UNITS_TEXT_MAX], d[UNITS_TEXT_MAX], p[128];
    printf("shmrefd %s (protocol %llu), pid %llu, up %.1f s, %llu client(s), socket %s\n",
           str(st, "daemon.version"), (unsigned long long)u64(st, "daemon.protocol"),
           (unsigned long long)u64(st, "daemon.pid"), u64(st, "daemon.uptime_ms") / 1000.0,
           (unsigned long long)u64(st, "daemon.clients"), str(st, "daemon.socket"));
    printf("fds in flight %llu (budget %llu)\n", (unsigned long long)u64(st, "daemon.fds_in_flight"),
           (unsigned long long)u64(st, "daemon.fds_in_flight_budget"));
    printf("\npool %s (%s)\n", str(st, "pool.dir"), str(st, "pool.kind"));
    printf("  total %s, leased %s, free %s\n", size_at(st, "pool.bytes_total", a),
           size_at(st, "pool.bytes_leased", b), size_at(st, "pool.bytes_free", c));
    printf("  allocated %s (warm %s), filesystem has %s available\n",
           size_at(st, "pool.bytes_allocated", a), size_at(st, "pool.bytes_warm", b),
           size_at(st, "pool.fs_available", d));
    printf("  pinned %s (%llu exited-connection process(es) watched), stock %s of a %s reserve\n",
           size_at(st, "pool.bytes_pinned", a), (unsigned long long)u64(st, "pool.mappers"),
           size_at(st, "pool.bytes_stock", b), size_at(st, "pool.stock_reserve", c));
    int n = shmref_status_count(st, "pool.classes");
    printf("\n  %12s %8s %8s\n", "CLASS", "BUFFERS", "FREE");
    for (int i = 0; i < n; i++) {
        char k1[64], k2[64], k3[64];
        snprintf(k1, sizeof(k1), "pool.classes.%d.size", i);
        snprintf(k2, sizeof(k2), "pool.classes.%d.total", i);
        snprintf(k3, sizeof(k3), "pool.classes.%d.free", i);
        printf("  %12s %8llu %8llu\n", size_at(st, k1, a), (unsigned long long)u64(st, k2),
               (unsigned long long)u64(st, k3));
    }
    printf("\nbuffers: %llu live, %llu published, %llu retained (%s), %llu retentions reclaimed for quota\n",
           (unsigned long long)u64(st, "buffers.live"), (unsigned long long)u64(st, "buffers.published"),
           (unsigned long long)u64(st, "buffers.retained"), size_at(st, "buffers.retained_bytes", a),
           (unsigned long long)u64(st, "buffers.reclaimed"));
    n = shmref_status_count(st, "tenants");
    printf("\n%-10s %12s %12s %8s %12s %12s\n", "TENANT", "BYTES", "QUOTA", "BUFFERS", "PINNED", "STOCK");
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof(p), "tenants.%d.", i);
        char k[160];
        printf("uid %-6llu", (unsigned long long)u64(st, (snprintf(k, sizeof(k), "%suid", p), k)));
        printf(" %12s", size_at(st, (snprintf(k, sizeof(k), "%sbytes", p), k), a));
        printf(" %12s", size_at(st, (snprintf(k, sizeof(k), "%squota", p), k), b));
        printf(" %8llu", (unsigned long long)u64(st, (snprintf(k, sizeof(k), "%sbuffers", p), k)));
        printf(" %12s", size_at(st, (snprintf(k, sizeof(k), "%spinned", p), k), a));
        printf(" %12s\n", size_at(st, (snprintf(k, sizeof(k), "%sstock", p), k), b));
    }
    n = shmref_status_count(st, "clients");
    printf("\n%-6s %8s %6s %-16s %7s %12s\n", "CLIENT", "PID", "UID", "NAME", "LEASES", "BYTES");
    for (int i = 0; i < n; i++) {
        char k[160];
        snprintf(p, sizeof(p), "clients.%d.", i);
        printf("%-6llu", (unsigned long long)u64(st, (snprintf(k, sizeof(k), "%sid", p), k)));
        printf(" %8llu", (unsigned long long)u64(st, (snprintf(k, sizeof(k), "%spid", p), k)));
        printf(" %6llu", (unsigned long long)u64(st, (snprintf(k, sizeof(k), "%suid", p), k)));
        printf(" %-16.16s", str(st, (snprintf(k, sizeof(k), "%sname", p), k)));
        printf(" %7llu", (unsigned long long)u64(st, (snprintf(k, sizeof(k), "%sleases", p), k)));
        printf(" %12s\n", size_at(st, (snprintf(k, sizeof(k), "%sbytes", p), k), a));
    }
    static const char *const counters[] = {
        "connections", "leases", "publishes", "acquires", "releases", "reclaimed_leases",
        "reclaimed_clients", "refused_quota", "refused_space", "refused_limit", "refused_access", "refused_other",
        "protocol_errors", "slow_clients", "buffers_created", "buffers_recycled", "buffers_retired",
        "buffers_evicted", "buffers_create_failed", "buffers_tampered", "retentions_expired",
        "clients_closed", "clients_died", "lease_waits", "lease_wait_timeouts", "acquire_waits",
        "acquire_wait_timeouts", "fd_waits", "buffers_emptied_mapped", "buffers_empty_failed", "stock_leases", "stock_refused",
    };
    printf("\ncounters\n");
    for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++) {
        char k[64];
        snprintf(k, sizeof(k), "counters.%s", counters[i]);
        printf("  %-22s %llu\n", counters[i], (unsigned long long)u64(st, k));
    }
}

static int cmd_status(int argc, char **argv)
{
    int json = 0, buffers = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--buffers") == 0)
            buffers = 1;
        else {
            fprintf(stderr, "shmrefctl status: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    shmref_conn *conn;
    shmref_status *st;
    if (connect_or_fail(&conn))
        return 1;
    int r = shmref_status_get(conn, &st);
    if (r < 0) {
        r = fail(conn, "status", r);
        shmref_close(conn);
        return r;
    }
    if (json) {
        const char *j = shmref_status_json(st);
        if (!j)
            r = fail(NULL, "status", -ENOMEM);
        else
            printf("%s\n", j);
    } else {
        print_table(st);
        if (buffers) {
            printf("\n");
            top_print_buffers(st, stdout, 0, 0);
        }
    }
    shmref_status_free(st);
    shmref_close(conn);
    return r;
}

/* read_all: the whole of fd into a malloc'd buffer (for pipes, whose size is unknown). */
static int read_all(int fd, char **ret, size_t *ret_len)
{
    size_t len = 0, cap = 1 << 20;
    char *buf = malloc(cap);
    if (!buf)
        return -ENOMEM;
    for (;;) {
        if (len == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                return -ENOMEM;
            }
            buf = nb;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = -errno;
            free(buf);
            return e;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    *ret = buf;
    *ret_len = len;
    return 0;
}

/* read_into: exactly len bytes of fd into dst (the lease's mapping: one copy). */
static int read_into(int fd, char *dst, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = read(fd, dst + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO; /* the file shrank under us */
        done += (size_t)n;
    }
    return 0;
}

struct put_opts {
    uint32_t keep_ms, max_gets;
    unsigned flags;
};

static int put_bytes(shmref_conn *conn, int fd, const char *src, size_t len, const struct put_opts *o)
{
    shmref_buf *buf;
    shmref_desc desc;
    char text[SHMREF_DESC_TEXT_MAX], a[UNITS_TEXT_MAX], what[96];
    snprintf(what, sizeof(what), "lease of %s", units_format(len, a));
    int r = shmref_lease(conn, len ? len : 1, &buf);
    if (r < 0)
        return fail(conn, what, r);
    if (src)
        memcpy(shmref_buf_data(buf), src, len);
    else if ((r = read_into(fd, shmref_buf_data(buf), len)) < 0)
        return fail(NULL, "read", r);
    r = shmref_publish_ex(buf, len, o->keep_ms, o->max_gets, o->flags, NULL, 0, &desc);
    if (r < 0)
        return fail(conn, "publish", r);
    shmref_desc_to_text(&desc, text, sizeof(text));
    printf("%s\n", text);
    return fflush(stdout) == 0 ? 0 : fail(NULL, "stdout", -errno);
}

static int cmd_put(int argc, char **argv)
{
    static const struct option longopts[] = { { "keep-ms", required_argument, NULL, 'k' },
                                               { "max-gets", required_argument, NULL, 'g' },
                                               { "sealed", no_argument, NULL, 's' }, { 0 } };
    struct put_opts o = { .keep_ms = PUT_DEFAULT_KEEP_MS };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+k:g:s", longopts, NULL)) != -1) {
        if (c == 's') {
            o.flags |= SHMREF_PUBLISH_SEALED;
            continue;
        }
        if (c != 'k' && c != 'g')
            return 2;
        char *end;
        unsigned long v = strtoul(optarg, &end, 10);
        if (!*optarg || *end || v > UINT32_MAX || optarg[0] == '-') {
            fprintf(stderr, "shmrefctl put: %s: '%s' is not a number%s\n", c == 'k' ? "--keep-ms" : "--max-gets",
                    optarg, c == 'k' ? " of milliseconds" : "");
            return 2;
        }
        if (c == 'k')
            o.keep_ms = (uint32_t)v;
        else
            o.max_gets = (uint32_t)v;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "shmrefctl put: expects one FILE (or - for stdin)\n");
        return 2;
    }
    const char *path = argv[optind];
    int fd = strcmp(path, "-") == 0 ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "shmrefctl put: %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        fprintf(stderr, "shmrefctl put: %s: %s\n", path, strerror(errno));
        return 1;
    }
    shmref_conn *conn;
    if (connect_or_fail(&conn))
        return 1;
    int r;
    if (S_ISREG(sb.st_mode)) {
        r = put_bytes(conn, fd, NULL, (size_t)sb.st_size, &o);
    } else {
        char *data = NULL;
        size_t len = 0;
        r = read_all(fd, &data, &len);
        r = r < 0 ? fail(NULL, "read", r) : put_bytes(conn, fd, data, len, &o);
        free(data);
    }
    if (fd != STDIN_FILENO)
        close(fd);
    shmref_close(conn);
    return r;
}

static int write_all(int fd, const char *p, size_t len)
{
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* read_descriptor: the descriptor's text from stdin ("-") or a file, into buf (cap
 * bytes, NUL-terminated). A descriptor is a bearer capability: on the command line it
 * would be readable by every user in /proc/PID/cmdline. 0, or 2 (usage) with a message. */
static int read_descriptor(const char *path, char *buf, size_t cap)
{
    bool from_stdin = strcmp(path, "-") == 0;
    int fd = from_stdin ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "shmrefctl get: %s: %s\n", path, strerror(errno));
        return 2;
    }
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fprintf(stderr, "shmrefctl get: reading %s: %s\n", from_stdin ? "stdin" : path, strerror(errno));
            if (!from_stdin)
                close(fd);
            return 2;
        }
        len += (size_t)n;
        if (n == 0 || len == cap - 1)
            break;
    }
    char extra;
    bool more = len == cap - 1 && read(fd, &extra, 1) == 1;
    if (!from_stdin)
        close(fd);
    buf[len] = '\0';
    if (more) {
        fprintf(stderr, "shmrefctl get: %s holds more than a descriptor (over %zu bytes)\n",
                from_stdin ? "stdin" : path, cap - 1);
        return 2;
    }
    return 0;
}

static int cmd_get(int argc, char **argv)
{
    const char *out = NULL;
    const char *text = NULL, *from = NULL;
    char read_text[128];
    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--descriptor-file") == 0 && i + 1 < argc && !text && !from)
            from = argv[++i];
        else if (!text && !from && argv[i][0] == '@' && argv[i][1])
            from = argv[i] + 1;
        else if (!text && !from && strcmp(argv[i], "-") == 0)
            from = "-";
        else if (!text && !from)
            text = argv[i];
        else {
            fprintf(stderr, "shmrefctl get: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (from) {
        if (read_descriptor(from, read_text, sizeof(read_text)))
            return 2;
        text = read_text;
    } else if (text) {
        fprintf(stderr, "shmrefctl get: warning: a descriptor on the command line can be read by every user "
                "(/proc/PID/cmdline): pass it on stdin (get -) or in a file (get @FILE)\n");
    }
    shmref_desc desc;
    if (!text || shmref_desc_from_text(text, &desc) < 0) {
        fprintf(stderr, "shmrefctl get: expects a descriptor like shmref1:<32 hex digits>:<size>, on stdin (-), "
                "in a file (@FILE, --descriptor-file FILE) or as an argument\n");
        return 2;
    }
    shmref_conn *conn;
    shmref_buf *buf;
    if (connect_or_fail(&conn))
        return 1;
    int r = shmref_acquire(conn, &desc, &buf);
    if (r < 0) {
        r = fail(conn, "acquire", r);
        shmref_close(conn);
        return r;
    }
    int fd = out ? open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : STDOUT_FILENO;
    if (fd < 0) {
        r = -errno;
        fprintf(stderr, "shmrefctl get: %s: %s\n", out, strerror(errno));
    } else {
        r = write_all(fd, shmref_buf_data(buf), shmref_buf_size(buf));
        if (r < 0)
            fprintf(stderr, "shmrefctl get: write: %s\n", strerror(-r));
        if (out && close(fd) < 0 && r == 0) {
            r = -errno;
            fprintf(stderr, "shmrefctl get: %s: %s\n", out, strerror(errno));
        }
    }
    int rr = shmref_release(buf);
    if (rr < 0 && r == 0)
        r = fail(conn, "release", rr) ? -EIO : 0;
    shmref_close(conn);
    return r < 0 ? 1 : 0;
}

/* write_metrics: the exposition into f; 0, or 1 when the daemon could not be asked
 * (then f says shmref_up 0). */
static int write_metrics(FILE *f)
{
    shmref_conn *conn;
    shmref_status *st;
    char def[4096];
    int r = shmref_connect(socket_path, &conn);
    if (r < 0) {
        metrics_print_down(f);
        fprintf(stderr, "shmrefctl: cannot reach shmrefd at %s: %s\n", the_socket(def), strerror(-r));
        return 1;
    }
    r = shmref_status_get(conn, &st);
    if (r < 0) {
        metrics_print_down(f);
        r = fail(conn, "status", r);
    } else {
        metrics_print(st, f);
        shmref_status_free(st);
    }
    shmref_close(conn);
    return r;
}

/* cmd_metrics: to stdout, or with --output FILE written to a temporary file in FILE's
 * directory and renamed over FILE, so a reader (node_exporter's textfile collector)
 * never sees half a file; a daemon that is down still replaces FILE, with shmref_up 0
 * (exit status 1). */
static int cmd_metrics(int argc, char **argv)
{
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--output") == 0 || strcmp(argv[i], "-o") == 0) && i + 1 < argc)
            out = argv[++i];
        else if (strncmp(argv[i], "--output=", 9) == 0)
            out = argv[i] + 9;
        else {
            fprintf(stderr, "shmrefctl metrics: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!out) {
        int r = write_metrics(stdout);
        return fflush(stdout) == 0 ? r : 1;
    }
    size_t n = strlen(out);
    char *tmp = malloc(n + 16);
    if (!tmp)
        return fail(NULL, "metrics", -ENOMEM);
    snprintf(tmp, n + 16, "%s.tmp.XXXXXX", out);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "shmrefctl metrics: %s: %s\n", tmp, strerror(errno));
        free(tmp);
        return 1;
    }
    fchmod(fd, 0644); /* mkostemp makes it 0600; the collector may run as another user */
    FILE *f = fdopen(fd, "w");
    int r = f ? write_metrics(f) : 1;
    int werr = !f || fflush(f) != 0 || fsync(fd) != 0;
    if (f ? fclose(f) != 0 : close(fd) != 0)
        werr = 1;
    if (werr || rename(tmp, out) < 0) {
        fprintf(stderr, "shmrefctl metrics: cannot write %s: %s\n", out, strerror(errno));
        unlink(tmp);
        r = 1;
    }
    free(tmp);
    return r;
}

static int cmd_ping(void)
{
    shmref_conn *conn;
    struct timespec t0, t1;
    if (connect_or_fail(&conn))
        return 1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = shmref_ping(conn);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (r < 0)
        r = fail(conn, "ping", r);
    else
        printf("pong from shmrefd pid %d in %.1f us\n", shmref_daemon_pid(conn),
               (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3);
    shmref_close(conn);
    return r;
}

static const char *const kinds[] = {
    [AUTOSTART_NAMED] = "the socket you named",
    [AUTOSTART_DEFAULT] = "the daemon at the default socket",
    [AUTOSTART_SYSTEM] = "the system shmrefd",
    [AUTOSTART_PRIVATE] = "your private shmrefd, running",
    [AUTOSTART_PRIVATE_START] = "your private shmrefd, not running: the next connect starts it",
    [AUTOSTART_NONE] = "none: a connect fails",
};

/* which_limits: the daemon answering at sock: its pid and uid, its pool and this uid's
 * quota, from its status. */
static int which_limits(const char *sock)
{
    shmref_conn *conn;
    shmref_status *st;
    char a[UNITS_TEXT_MAX], k[64];
    int r = shmref_connect(sock, &conn); /* named: it answers, and nothing may be started */
    if (r < 0) {
        printf("status: cannot connect: %s: %s\n", strerror(-r), shmref_errmsg(NULL));
        return 1;
    }
    if ((r = shmref_status_get(conn, &st)) < 0) {
        printf("status: %s: %s\n", strerror(-r), shmref_errmsg(conn));
        shmref_close(conn);
        return 1;
    }
    long long pid = (long long)u64(st, "daemon.pid");
    struct stat ps;
    snprintf(k, sizeof(k), "/proc/%lld", pid);
    if (stat(k, &ps) == 0)
        printf("pid: %lld, uid %u\n", pid, (unsigned)ps.st_uid);
    else
        printf("pid: %lld, uid ? (not in this pid namespace)\n", pid);
    uint64_t quota = u64(st, "limits.tenant_quota"), pool = u64(st, "limits.pool_size");
    for (int i = 0, n = shmref_status_count(st, "tenants"); i < n; i++) /* a quota of its own */
        if (u64(st, (snprintf(k, sizeof(k), "tenants.%d.uid", i), k)) == getuid())
            quota = u64(st, (snprintf(k, sizeof(k), "tenants.%d.quota", i), k));
    printf("pool size: %s (%llu bytes)\n", units_format(pool, a), (unsigned long long)pool);
    printf("tenant quota: %s (%llu bytes) for uid %u\n", units_format(quota, a), (unsigned long long)quota,
           (unsigned)getuid());
    shmref_status_free(st);
    shmref_close(conn);
    return 0;
}

/* cmd_which: the daemon a connect from this process would use, why, and its limits,
 * by libshmref's own rule (autostart.c, compiled in); starts and makes nothing. */
static int cmd_which(int argc)
{
    struct autostart_choice c;
    char a[UNITS_TEXT_MAX];
    if (argc != 1) {
        fputs("Usage: shmrefctl [--socket PATH] which\n", stderr);
        return 2;
    }
    if (autostart_which(socket_path, &c) < 0) {
        fprintf(stderr, "shmrefctl which: the default socket path is too long\n");
        return 1;
    }
    printf("socket: %s\ndaemon: %s\nwhy: %s\n", c.socket, kinds[c.kind], c.why);
    if (c.answers)
        return which_limits(c.socket);
    if (c.kind != AUTOSTART_PRIVATE_START)
        return 1;
    const struct autostart_sizes *z = &c.sizes;
    if (c.program[0])
        printf("program: %s\n", c.program);
    if (z->pool)
        printf("pool size: %s (%llu bytes) (would be given: %s)\n", units_format(z->pool, a),
               (unsigned long long)z->pool, z->pool_why);
    else
        printf("pool size: shmrefd's default (would be given: %s)\n", z->pool_why);
    if (z->quota)
        printf("tenant quota: %s (%llu bytes) for uid %u (would be given: %s)\n", units_format(z->quota, a),
               (unsigned long long)z->quota, (unsigned)getuid(), z->quota_why);
    printf("config file: %s (%s)\n", z->config, z->config_exists ? "read" : "none");
    return 0;
}

/* take_global: removes --socket/-s PATH, --help and --version wherever they stand. */
static int take_global(int *argc, char **argv)
{
    int n = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        if ((strcmp(a, "--socket") == 0 || strcmp(a, "-s") == 0) && i + 1 < *argc) {
            socket_path = argv[++i];
        } else if (strncmp(a, "--socket=", 9) == 0) {
            socket_path = a + 9;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            printf("shmrefctl %d.%d.%d\n", SHMREF_VERSION_MAJOR, SHMREF_VERSION_MINOR, SHMREF_VERSION_PATCH);
            return 0;
        } else {
            argv[n++] = argv[i];
        }
    }
    *argc = n;
    return 1;
}

int main(int argc, char **argv)
{
    argc--;
    argv++;
    if (!take_global(&argc, argv))
        return 0;
    if (argc == 0) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[0];
    if (strcmp(cmd, "status") == 0)
        return cmd_status(argc, argv);
    if (strcmp(cmd, "put") == 0)
        return cmd_put(argc, argv);
    if (strcmp(cmd, "get") == 0)
        return cmd_get(argc, argv);
    if (strcmp(cmd, "metrics") == 0)
        return cmd_metrics(argc, argv);
    if (strcmp(cmd, "top") == 0)
        return top_main(socket_path, argc, argv);
    if (strcmp(cmd, "ping") == 0 && argc == 1)
        return cmd_ping();
    if (strcmp(cmd, "which") == 0)
        return cmd_which(argc);
    fprintf(stderr, "shmrefctl: unknown command '%s'\nTry 'shmrefctl --help'.\n", cmd);
    return 2;
}
