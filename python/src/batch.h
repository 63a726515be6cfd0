/* SPDX-License-Identifier: MIT */
/* batch.h: Arrow units of work from Python: shmref.Batch (an acquired unit, the Arrow
 * PyCapsule interface) and _Unit (a published producer unit, held by its Client). */
#ifndef SHMREFPY_BATCH_H
#define SHMREFPY_BATCH_H

#include "conn.h"

extern PyTypeObject Batch_Type, Unit_Type;

/* batch_publish: publish_batch's work on conn: obj's Arrow data copied into one unit and
 * published with keep_ms of retention, its lease waiting up to wait_ms for quota or pool
 * space (the GIL released); the Ref, with *ret_unit (a _Unit holding the lease) for the
 * client to keep. */
PyObject *batch_publish(ConnObject *conn, PyObject *obj, uint32_t keep_ms, unsigned flags, uint32_t wait_ms,
                        PyObject **ret_unit);
/* batch_acquire: a Batch for ref, acquired on conn (the Client's), which it keeps, with
 * shmref_unit_acquire_ex's flags (SHMREF_ACQUIRE_SEALED, SHMREF_ACQUIRE_TRUST_PRODUCER). */
PyObject *batch_acquire(ConnObject *conn, PyObject *ref, unsigned flags);

#endif
