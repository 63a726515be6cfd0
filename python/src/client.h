/* SPDX-License-Identifier: MIT */
/* client.h: shmref.Client, the public object (connect, empty, publish, share, acquire,
 * release, batches, close), and the publish of a lease for a pickle. */
#ifndef SHMREFPY_CLIENT_H
#define SHMREFPY_CLIENT_H

#include "batch.h"
#include "buffer.h"
#include "ref.h"

extern PyTypeObject Client_Type;

/* client_publish_buffer: _publish_buffer(buffer, keep) -> Ref: publish a whole lease
 * with the layout it was made with (a pickle of an unpublished array), retained keep
 * seconds for its one consumer (max_acquires 1). */
PyObject *client_publish_buffer(PyObject *m, PyObject *args);

#endif
