/* SPDX-License-Identifier: MIT */
/* top.c: `shmrefctl top`, a refreshing terminal view (like pw-top) of one daemon's status
 * snapshot: rates from the difference of two snapshots, clients, tenants, buffers. Plain
 * ANSI escapes and termios (no curses): the alternate screen, the cursor hidden, keys
 * read unbuffered; every frame is written at once from the home position, lines cleared
 * to their end, so nothing flickers. When the daemon goes away the view says so and
 * keeps trying to reconnect at every refresh. Without a terminal (or with --once) it
 * prints one frame without escapes and exits. */
#include "top.h"
#include "hint.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "paths.h"
#include "units.h"

#define TOP_DEFAULT_DELAY_MS 1000
#define TOP_LINE_MAX 1024

static volatile sig_atomic_t top_quit, top_resized;

struct top_rates {
    bool have;                 /* prev holds an earlier snapshot's counters */
    double t;                  /* CLOCK_MONOTONIC seconds of prev */
    uint64_t leases, refused[5];
    double leases_s, refused_s[5];
};

static const char *const top_causes[5] = { "quota", "space", "limit", "access", "other" };

/* --- output ------------------------------------------------------------------------ */

/* top_line: one line, cut at width (0: uncut); on a terminal, cleared to its end. */
static void top_line(FILE *f, int width, bool tty, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void top_line(FILE *f, int width, bool tty, const char *fmt, ...)
{
    char buf[TOP_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(buf))
        n = sizeof(buf) - 1;
    if (width > 0 && n > width)
        n = width;
    fwrite(buf, 1, (size_t)n, f);
    fputs(tty ? "\033[K\r\n" : "\n", f);
}

static uint64_t top_u64(const shmref_status *st, const char *fmt, int i, const char *field)
{
    char k[128];
    uint64_t v = 0;
    snprintf(k, sizeof(k), fmt, i, field);
    shmref_status_u64(st, k, &v);
    return v;
}

static const char *top_str(const shmref_status *st, const char *fmt, int i, const char *field)
{
    char k[128];
    const char *s = "?";
    snprintf(k, sizeof(k), fmt, i, field);
    shmref_status_str(st, k, &s);
    return s;
}

/* top_user: the user name of uid, or the number. */
static const char *top_user(uint64_t uid, char buf[32])
{
    struct passwd *pw = getpwuid((uid_t)uid);
    if (pw && strlen(pw->pw_name) < 32)
        return strcpy(buf, pw->pw_name);
    snprintf(buf, 32, "%llu", (unsigned long long)uid);
    return buf;
}

/* top_duration: "59s", "12m03s", "5h07m", "3d04h". */
static const char *top_duration(uint64_t ms, char buf[24])
{
    uint64_t s = ms / 1000;
    if (s < 60)
        snprintf(buf, 24, "%llus", (unsigned long long)s);
    else if (s < 3600)
        snprintf(buf, 24, "%llum%02llus", (unsigned long long)(s / 60), (unsigned long long)(s % 60));
    else if (s < 86400)
        snprintf(buf, 24, "%lluh%02llum", (unsigned long long)(s / 3600), (unsigned long long)(s % 3600 / 60));
    else
        snprintf(buf, 24, "%llud%02lluh", (unsigned long long)(s / 86400), (unsigned long long)(s % 86400 / 3600));
    return buf;
}

/* top_since: the wall-clock time ms ago, as HH:MM:SS (or the date if not today). */
static const char *top_since(uint64_t ms_ago, char buf[24])
{
    time_t now = time(NULL), then = now - (time_t)(ms_ago / 1000);
    struct tm a, b;
    localtime_r(&now, &a);
    localtime_r(&then, &b);
    strftime(buf, 24, a.tm_yday == b.tm_yday && a.tm_year == b.tm_year ? "%H:%M:%S" : "%Y-%m-%d", &b);
    return buf;
}

/* top_fit: how many of a table's n rows (of total in all) to show under a header, in
 * max lines header included (0: all); *more when a "... N more" line follows. */
static int top_fit(int n, uint64_t total, int max, bool *more)
{
    uint64_t all = total > (uint64_t)n ? total : (uint64_t)n;
    int room = max > 0 ? max - 1 : n;
    int shown = n < room ? n : room;
    *more = (uint64_t)shown < all;
    if (*more && max > 0 && shown == room && shown > 0)
        shown--;
    return shown;
}

/* --- sections ---------------------------------------------------------------------- */

static void top_rates_update(struct top_rates *r, const shmref_status *st)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    uint64_t leases = 0, refused[5];
    shmref_status_u64(st, "counters.leases", &leases);
    for (int i = 0; i < 5; i++) {
        char k[64];
        refused[i] = 0;
        snprintf(k, sizeof(k), "counters.refused_%s", top_causes[i]);
        shmref_status_u64(st, k, &refused[i]);
    }
    if (r->have && t > r->t) {
        r->leases_s = (double)(leases - r->leases) / (t - r->t);
        for (int i = 0; i < 5; i++)
            r->refused_s[i] = (double)(refused[i] - r->refused[i]) / (t - r->t);
    }
    r->have = true;
    r->t = t;
    r->leases = leases;
    memcpy(r->refused, refused, sizeof(refused));
}

static int top_header(const shmref_status *st, const struct top_rates *r, FILE *f, int width, bool tty)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], d[24];
    uint64_t up = 0, clients = 0, total = 0, leased = 0, pid = 0;
    const char *ver = "?", *sock = "?", *kind = "?";
    shmref_status_str(st, "daemon.version", &ver);
    shmref_status_str(st, "daemon.socket", &sock);
    shmref_status_str(st, "pool.kind", &kind);
    shmref_status_u64(st, "daemon.uptime_ms", &up);
    shmref_status_u64(st, "daemon.pid", &pid);
    shmref_status_u64(st, "daemon.clients", &clients);
    shmref_status_u64(st, "pool.bytes_total", &total);
    shmref_status_u64(st, "pool.bytes_leased", &leased);
    top_line(f, width, tty, "shmrefd %s pid %llu up %s on %s; %llu client%s; pool %s of %s leased (%s)", ver,
             (unsigned long long)pid, top_duration(up, d), sock, (unsigned long long)clients,
             clients == 1 ? "" : "s", units_format(leased, a), units_format(total, b), kind);
    double all = 0;
    for (int i = 0; i < 5; i++)
        all += r->refused_s[i];
    top_line(f, width, tty, "rates: %.1f leases/s, %.1f refusals/s (quota %.1f, space %.1f, limit %.1f, access %.1f, other %.1f)%s",
             r->leases_s, all, r->refused_s[0], r->refused_s[1], r->refused_s[2], r->refused_s[3],
             r->refused_s[4], tty ? "   q quits" : "");
    return 2;
}

static int top_clients(const shmref_status *st, FILE *f, int max, int width, bool tty)
{
    char a[UNITS_TEXT_MAX], u[32], d[24], t[24];
    int n = shmref_status_count(st, "clients"), lines = 0;
    uint64_t total = 0;
    shmref_status_u64(st, "clients_total", &total);
    if (n < 0)
        n = 0;
    top_line(f, width, tty, "%s%-6s %8s %-12s %-16s %7s %11s %-8s %s%s", tty ? "\033[7m" : "", "CLIENT", "PID",
             "USER", "NAME", "LEASES", "BYTES", "SINCE", "FOR", tty ? "\033[0m" : "");
    lines++;
    const char *p = "clients.%d.%s";
    bool more;
    int shown = top_fit(n, total, max, &more);
    for (int i = 0; i < shown; i++, lines++) {
        uint64_t ms = top_u64(st, p, i, "connected_ms");
        top_line(f, width, tty, "%-6llu %8llu %-12.12s %-16.16s %7llu %11s %-8s %s",
                 (unsigned long long)top_u64(st, p, i, "id"), (unsigned long long)top_u64(st, p, i, "pid"),
                 top_user(top_u64(st, p, i, "uid"), u), top_str(st, p, i, "name"),
                 (unsigned long long)top_u64(st, p, i, "leases"), units_format(top_u64(st, p, i, "bytes"), a),
                 top_since(ms, t), top_duration(ms, d));
    }
    if (more) {
        top_line(f, width, tty, "  ... %llu more", (unsigned long long)((total > (uint64_t)n ? total : (uint64_t)n) - (uint64_t)shown));
        lines++;
    }
    return lines;
}

static int top_tenants(const shmref_status *st, FILE *f, int max, int width, bool tty)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], u[32];
    int n = shmref_status_count(st, "tenants"), lines = 0;
    uint64_t total = 0;
    shmref_status_u64(st, "tenants_total", &total);
    if (n < 0)
        n = 0;
    top_line(f, width, tty, "%s%-8s %-12s %11s %11s %7s  REFUSED: %5s %5s %5s %6s %5s %10s %10s%s",
             tty ? "\033[7m" : "", "TENANT", "USER", "BYTES", "QUOTA", "BUFFERS", "QUOTA", "SPACE", "LIMIT", "ACCESS",
             "OTHER", "PINNED", "STOCK", tty ? "\033[0m" : "");
    lines++;
    const char *p = "tenants.%d.%s";
    bool more;
    int shown = top_fit(n, total, max, &more);
    for (int i = 0; i < shown; i++, lines++) {
        uint64_t uid = top_u64(st, p, i, "uid");
        char pn[UNITS_TEXT_MAX], sk[UNITS_TEXT_MAX];
        top_line(f, width, tty, "%-8llu %-12.12s %11s %11s %7llu           %5llu %5llu %5llu %6llu %5llu %10s %10s",
                 (unsigned long long)uid, top_user(uid, u), units_format(top_u64(st, p, i, "bytes"), a),
                 units_format(top_u64(st, p, i, "quota"), b), (unsigned long long)top_u64(st, p, i, "buffers"),
                 (unsigned long long)top_u64(st, p, i, "refused_quota"),
                 (unsigned long long)top_u64(st, p, i, "refused_space"),
                 (unsigned long long)top_u64(st, p, i, "refused_limit"),
                 (unsigned long long)top_u64(st, p, i, "refused_access"),
                 (unsigned long long)top_u64(st, p, i, "refused_other"),
                 units_format(top_u64(st, p, i, "pinned"), pn), units_format(top_u64(st, p, i, "stock"), sk));
    }
    if (more) {
        top_line(f, width, tty, "  ... %llu more", (unsigned long long)((total > (uint64_t)n ? total : (uint64_t)n) - (uint64_t)shown));
        lines++;
    }
    return lines;
}

/* top_buffers: the buffers.list table (header included in max). */
static int top_buffers(const shmref_status *st, FILE *f, int max, int width, bool tty)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], u[32], d[24], r[24];
    int n = shmref_status_count(st, "buffers.list"), lines = 0;
    uint64_t total = 0;
    shmref_status_u64(st, "buffers.list_total", &total);
    if (n < 0)
        n = 0;
    top_line(f, width, tty, "%s%-7s %-9s %11s %11s %8s %-12s %7s %8s %s%s", tty ? "\033[7m" : "", "BUFFER",
             "STATE", "SIZE", "CAPACITY", "PID", "PUBLISHER", "HOLDERS", "AGE", "RETENTION LEFT",
             tty ? "\033[0m" : "");
    lines++;
    const char *p = "buffers.list.%d.%s";
    bool more;
    int shown = top_fit(n, total, max, &more);
    for (int i = 0; i < shown; i++, lines++) {
        uint64_t left = top_u64(st, p, i, "retention_left_ms");
        top_line(f, width, tty, "%-7llu %-9s %11s %11s %8llu %-12.12s %7llu %8s %s",
                 (unsigned long long)top_u64(st, p, i, "id"), top_str(st, p, i, "state"),
                 units_format(top_u64(st, p, i, "size"), a), units_format(top_u64(st, p, i, "capacity"), b),
                 (unsigned long long)top_u64(st, p, i, "pid"), top_user(top_u64(st, p, i, "uid"), u),
                 (unsigned long long)top_u64(st, p, i, "holders"), top_duration(top_u64(st, p, i, "age_ms"), d),
                 left ? top_duration(left, r) : "-");
    }
    if (more) {
        top_line(f, width, tty, "  ... %llu more", (unsigned long long)((total > (uint64_t)n ? total : (uint64_t)n) - (uint64_t)shown));
        lines++;
    }
    return lines;
}

int top_print_buffers(const shmref_status *st, FILE *f, int max, int width)
{
    return top_buffers(st, f, max, width, false);
}

/* top_frame: one whole frame into f, fitted to rows x cols (0: unbounded). */
static void top_frame(const shmref_status *st, struct top_rates *r, FILE *f, int rows, int cols, bool tty)
{
    int used = top_header(st, r, f, cols, tty);
    /* The rest of the screen, minus 3 blank lines, split over the three tables: each
     * gets a third, and what one does not need goes to the next. */
    int avail = rows > 0 ? rows - used - 3 : 0;
    int n[3] = { shmref_status_count(st, "clients"), shmref_status_count(st, "tenants"),
                 shmref_status_count(st, "buffers.list") };
    int share[3] = { 0, 0, 0 };
    if (rows > 0) {
        int left = avail;
        for (int i = 0; i < 3; i++) {
            int want = (n[i] > 0 ? n[i] : 0) + 2, fair = left / (3 - i);
            share[i] = want < fair ? want : fair;
            if (share[i] < 1)
                share[i] = 1;
            left -= share[i];
        }
    }
    top_line(f, cols, tty, "%s", "");
    top_clients(st, f, share[0], cols, tty);
    top_line(f, cols, tty, "%s", "");
    top_tenants(st, f, share[1], cols, tty);
    top_line(f, cols, tty, "%s", "");
    top_buffers(st, f, share[2], cols, tty);
}

/* --- the terminal -------------------------------------------------------------------- */

static struct termios top_saved;
static bool top_raw;

static void top_restore(void)
{
    if (!top_raw)
        return;
    tcsetattr(STDIN_FILENO, TCSANOW, &top_saved);
    fputs("\033[?25h\033[?1049l", stdout);
    fflush(stdout);
    top_raw = false;
}

static void top_on_signal(int sig)
{
    if (sig == SIGWINCH)
        top_resized = 1;
    else
        top_quit = 1;
}

/* top_enter: unbuffered keys without echo (signals still work), the alternate screen,
 * no cursor; restored at exit. */
static int top_enter(void)
{
    if (tcgetattr(STDIN_FILENO, &top_saved) < 0)
        return -errno;
    struct termios t = top_saved;
    t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    t.c_cc[VMIN] = 0;
    t.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &t) < 0)
        return -errno;
    top_raw = true;
    atexit(top_restore);
    fputs("\033[?1049h\033[?25l\033[2J", stdout);
    return 0;
}

static void top_size(int *rows, int *cols)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    } else {
        *rows = 24;
        *cols = 80;
    }
}

/* top_keys: reads what was typed; true if it asks to quit ('q', 'Q'). */
static bool top_keys(void)
{
    char k[64];
    ssize_t n = read(STDIN_FILENO, k, sizeof(k));
    for (ssize_t i = 0; i < n; i++)
        if (k[i] == 'q' || k[i] == 'Q')
            return true;
    return false;
}

/* top_show: draws one frame (or the "daemon gone" screen) to stdout in one write. */
static void top_show(const shmref_status *st, struct top_rates *r, const char *path, const char *err,
                     int delay_ms, bool tty)
{
    int rows = 0, cols = 0;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    if (tty) {
        top_size(&rows, &cols);
        fputs("\033[H", f);
    }
    if (st) {
        top_frame(st, r, f, rows, cols, tty);
    } else {
        top_line(f, cols, tty, "shmrefd is not reachable at %s: %s", path, err);
        if (delay_ms > 0) /* 0: --once (or no terminal), which does not retry */
            top_line(f, cols, tty, "retrying every %.1f s%s", delay_ms / 1000.0, tty ? "; q quits" : "");
    }
    if (tty)
        fputs("\033[J", f);
    if (fclose(f) == 0) {
        fwrite(buf, 1, len, stdout);
        fflush(stdout);
    }
    free(buf);
}

/* top_wait: until the next refresh, a 'q', or a signal; a resize redraws at once. */
static void top_wait(const shmref_status *st, struct top_rates *r, const char *path, const char *err,
                     int delay_ms)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long spent = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if (spent >= delay_ms || top_quit)
            return;
        struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
        if (poll(&pfd, 1, (int)(delay_ms - spent)) > 0 &&
            ((pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) || top_keys()))
            top_quit = 1; /* 'q', or the terminal went away */
        if (top_resized) {
            top_resized = 0;
            top_show(st, r, path, err, delay_ms, true);
        }
    }
}

static int top_usage(void)
{
    fputs("usage: shmrefctl top [--delay SECONDS] [--once]\n", stderr);
    return 2;
}

int top_main(const char *socket_path, int argc, char **argv)
{
    static const struct option longopts[] = {
        { "delay", required_argument, NULL, 'd' }, { "once", no_argument, NULL, '1' }, { 0 } };
    int delay_ms = TOP_DEFAULT_DELAY_MS, c;
    bool once = false;
    char path[4096];
    optind = 1;
    while ((c = getopt_long(argc, argv, "+d:", longopts, NULL)) != -1) {
        if (c == '1') {
            once = true;
        } else if (c == 'd') {
            char *end;
            double s = strtod(optarg, &end);
            if (*end || !(s >= 0.1 && s <= 3600))
                return top_usage();
            delay_ms = (int)(s * 1000);
        } else {
            return top_usage();
        }
    }
    if (optind != argc)
        return top_usage();
    if (socket_path)
        snprintf(path, sizeof(path), "%s", socket_path);
    else if (paths_default_socket(path, sizeof(path)) < 0)
        return 1;
    bool tty = !once && isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    if (tty && top_enter() < 0)
        tty = false;
    if (!tty)
        once = true;
    struct sigaction sa = { .sa_handler = top_on_signal }; /* no SA_RESTART: poll wakes */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGWINCH, &sa, NULL);

    struct top_rates rates = { 0 };
    shmref_conn *conn = NULL;
    shmref_status *st = NULL;
    int status = 0;
    char err[600] = "";
    while (!top_quit) {
        int r = 0;
        if (!conn && (r = shmref_connect(socket_path, &conn)) < 0) {
            snprintf(err, sizeof(err), "%s%s", strerror(-r), hint_connect(path, r));
            conn = NULL;
        }
        if (conn) {
            shmref_status *next = NULL;
            if ((r = shmref_status_get(conn, &next)) < 0) {
                snprintf(err, sizeof(err), "%s%s%s", strerror(-r), *shmref_errmsg(conn) ? ": " : "",
                         shmref_errmsg(conn));
                shmref_close(conn);
                conn = NULL;
            } else {
                shmref_status_free(st);
                st = next;
                top_rates_update(&rates, st);
            }
        }
        if (!conn) { /* gone: show it, forget the old numbers and rates */
            shmref_status_free(st);
            st = NULL;
            rates.have = false;
        }
        top_show(st, &rates, path, err, once ? 0 : delay_ms, tty);
        if (once) {
            status = st ? 0 : 1;
            break;
        }
        top_wait(st, &rates, path, err, delay_ms);
    }
    top_restore();
    shmref_status_free(st);
    shmref_close(conn);
    return status;
}
