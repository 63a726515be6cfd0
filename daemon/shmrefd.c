/* shmrefd.c: the daemon's entry point: options, setup, the loop, a clean stop on SIGTERM
 * or SIGINT (exit 0). Everything else lives in the modules named after what they do. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <uv.h>

#include "log.h"
#include "options.h"
#include "server.h"
#include "units.h"

static uv_signal_t sig_term, sig_int;

static void on_signal(uv_signal_t *h, int signum)
{
    struct server *s = h->data;
    log_notice("received %s, stopping", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    server_stop(s);
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
}

static void log_started(const struct server *s, const struct options *o)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], c[UNITS_TEXT_MAX];
    log_notice("shmrefd %s serving on %s; pool %s (%s), pool size %s (%llu bytes), "
               "tenant quota %s, max lease %s, max %u leases per client",
               SHMREF_VERSION_STRING, o->socket_path, pool_dir(s->pool), pool_kind(s->pool),
               units_format(o->pool_size, a), (unsigned long long)o->pool_size,
               units_format(o->tenant_quota, b), units_format(o->max_lease_size, c), o->max_leases);
}

int main(int argc, char **argv)
{
    struct options opt;
    struct statvfs sv;
    int r = options_parse(argc, argv, &opt);
    if (r != 0) {
        options_free(&opt);
        return r > 0 ? 0 : 2;
    }
    if (opt.verbose)
        log_max_level = LOG_DEBUG;
    signal(SIGPIPE, SIG_IGN);
    if (statvfs(opt.pool_dir, &sv) < 0) {
        log_error("cannot start: pool directory %s: %s", opt.pool_dir, strerror(errno));
        options_free(&opt);
        return 1;
    }
    options_resolve_sizes(&opt, (uint64_t)sv.f_bavail * sv.f_frsize);

    uv_loop_t *loop = uv_default_loop();
    struct server *s = malloc(sizeof(*s));
    if (!s) {
        log_error("cannot start: out of memory");
        return 1;
    }
    int code = 1;
    if (server_init(s, loop, &opt) < 0 || server_listen_path(s) < 0)
        goto out;
    uv_signal_init(loop, &sig_term);
    uv_signal_init(loop, &sig_int);
    sig_term.data = sig_int.data = s;
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    log_started(s, &opt);

    uv_run(loop, UV_RUN_DEFAULT);
    unlink(opt.socket_path);
    code = 0;
out:
    server_stop(s);
    uv_run(loop, UV_RUN_DEFAULT); /* let closes and in-flight pool work finish */
    server_free(s);
    uv_run(loop, UV_RUN_DEFAULT);
    if (uv_loop_close(loop) != 0)
        log_warning("event loop closed with handles still open");
    free(s);
    if (code == 0)
        log_info("stopped");
    options_free(&opt);
    return code;
}
