/* SPDX-License-Identifier: MIT */
/* metrics.h: shmrefctl's Prometheus text exposition of a status snapshot, for
 * node_exporter's textfile collector. Part of shmrefctl, not of libshmref. */
#ifndef SHMREFCTL_METRICS_H
#define SHMREFCTL_METRICS_H

#include <stdio.h>

#include "shmref/shmref.h"

/* metrics_print: every gauge and counter of st, as text format 0.0.4. */
void metrics_print(const shmref_status *st, FILE *f);
/* metrics_print_down: shmref_up 0, for when the daemon cannot be reached. */
void metrics_print_down(FILE *f);

#endif
