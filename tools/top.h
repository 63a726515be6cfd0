/* SPDX-License-Identifier: MIT */
/* top.h: `shmrefctl top`, a live view of a daemon's clients, tenants, buffers and rates,
 * and the buffer table that `shmrefctl status --buffers` shares with it. Part of
 * shmrefctl, built on the public libshmref status API only. */
#ifndef SHMREFCTL_TOP_H
#define SHMREFCTL_TOP_H

#include <stdio.h>

#include "shmref/shmref.h"

/* top_main: runs the view until 'q' (or SIGINT/SIGTERM/SIGHUP). socket_path NULL: the
 * default socket. argv[0] is "top". Returns the exit status (0, 1 failed, 2 usage). */
int top_main(const char *socket_path, int argc, char **argv);

/* top_print_buffers: the buffers.list table of st, at most max rows (0: all), each line
 * cut at width columns (0: uncut). Returns the number of lines printed. */
int top_print_buffers(const shmref_status *st, FILE *f, int max, int width);

#endif
