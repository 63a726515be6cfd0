/* SPDX-License-Identifier: MIT */
/* notify.h: telling the service manager how shmrefd is doing (sd_notify): READY=1 once
 * it serves, a one-line STATUS= kept current, WATCHDOG=1 at half the watchdog interval
 * when the watchdog is enabled for this pid, RELOADING=1/READY=1 around a reload, and
 * STOPPING=1 on shutdown. Every call is a no-op outside systemd. Private to the daemon. */
#ifndef SHMREFD_NOTIFY_H
#define SHMREFD_NOTIFY_H

#include <stdint.h>

#include <uv.h>

struct server;

struct notify {
    uv_timer_t watchdog, status;
    uint64_t watchdog_usec;
    struct server *server;
    char last[256];
    int started;
};

/* notify_ready: READY=1 and STATUS=, and starts the timers. */
void notify_ready(struct notify *n, uv_loop_t *loop, struct server *s);
void notify_reloading(struct notify *n);
void notify_reloaded(struct notify *n);
/* notify_stopping: STOPPING=1; closes the timers. */
void notify_stopping(struct notify *n);

#endif
