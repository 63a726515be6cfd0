/* SPDX-License-Identifier: MIT */
/* status.h: libshmref's status requests: their handlers (the reply copied and checked
 * into a shmref_status). Above the request table. */
#ifndef SHMREF_STATUS_H
#define SHMREF_STATUS_H

#include "conn.h"

extern const struct pending_ops status_ops;

#endif
