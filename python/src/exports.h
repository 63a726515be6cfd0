/* SPDX-License-Identifier: MIT */
/* exports.h: Arrow structures exported from a Batch, made safe to release from any
 * thread while the Batch's connection (its Client's) stays open: every release callback
 * (of each array node, and of a stream and the arrays it gives) goes through the
 * connection's core (conn_core_run): at once when the connection is free or closed,
 * else after the call that holds it. Consumers (pyarrow, polars, duckdb) release from
 * their own threads, without the GIL; nothing here waits. */
#ifndef SHMREFPY_EXPORTS_H
#define SHMREFPY_EXPORTS_H

#include "conn.h"

/* exports_wrap_array: a's release (and each child's and dictionary's) through core.
 * -ENOMEM (a released, nothing wrapped half-way is left: a is then released through
 * core) or 0. */
int exports_wrap_array(struct conn_core *core, struct ArrowArray *a);
/* exports_wrap_stream: st replaced by a stream that forwards to it, whose release and
 * whose arrays' releases go through core. -ENOMEM (st left as it was) or 0. */
int exports_wrap_stream(struct conn_core *core, struct ArrowArrayStream *st);

#endif
