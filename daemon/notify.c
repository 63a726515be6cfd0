/* SPDX-License-Identifier: MIT */
/* notify.c: see notify.h. */
#include "notify.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <systemd/sd-daemon.h>

#include "log.h"
#include "server.h"
#include "units.h"

static void status_line(struct server *s, char *buf, size_t len)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];
    struct registry_stats st = registry_stats(s->reg);
    snprintf(buf, len, "STATUS=%u client%s, %s of %s leased, %llu buffer%s live", s->sessions.n,
             s->sessions.n == 1 ? "" : "s", units_format(st.bytes, a), units_format(pool_cap(s->pool), b),
             (unsigned long long)st.buffers, st.buffers == 1 ? "" : "s");
}

static void update_status(struct notify *n, int force)
{
    char line[256];
    status_line(n->server, line, sizeof(line));
    if (!force && strcmp(line, n->last) == 0)
        return;
    snprintf(n->last, sizeof(n->last), "%s", line);
    sd_notify(0, line);
}

static void on_status(uv_timer_t *t)
{
    update_status(t->data, 0);
}

static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    sd_notify(0, "WATCHDOG=1");
}

void notify_ready(struct notify *n, uv_loop_t *loop, struct server *s)
{
    memset(n, 0, sizeof(*n));
    n->server = s;
    status_line(s, n->last, sizeof(n->last));
    sd_notifyf(0, "READY=1\n%s", n->last);
    uv_timer_init(loop, &n->status);
    n->status.data = n;
    uv_timer_start(&n->status, on_status, 1000, 1000);
    uv_timer_init(loop, &n->watchdog);
    n->started = 1;
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        n->watchdog_usec = usec;
        uint64_t every = usec / 2 / 1000;
        if (every == 0)
            every = 1;
        uv_timer_start(&n->watchdog, on_watchdog, every, every);
        sd_notify(0, "WATCHDOG=1");
        log_info("watchdog enabled: pinging every %llu ms", (unsigned long long)every);
    }
}

void notify_reloading(struct notify *n)
{
    struct timespec ts;
    (void)n;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu",
               (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL);
}

void notify_reloaded(struct notify *n)
{
    update_status(n, 1);
    sd_notify(0, "READY=1");
}

void notify_stopping(struct notify *n)
{
    sd_notify(0, "STOPPING=1");
    if (!n->started)
        return;
    n->started = 0;
    uv_close((uv_handle_t *)&n->status, NULL);
    uv_close((uv_handle_t *)&n->watchdog, NULL);
}
