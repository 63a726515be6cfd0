/* SPDX-License-Identifier: MIT */
/* shmrefpy.h: the CPython extension shmref._shmref, over libshmref's public API only.
 * Private to the extension. Lifetimes: a Conn owns the C connection; every Buffer (the
 * owner object behind numpy arrays) holds a reference to its Conn, so the connection and
 * the mapping stay while any array of it exists, even after Client.close(). */
#ifndef SHMREFPY_H
#define SHMREFPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>

#include "shmref/shmref.h"

/* A release that found the connection busy (another thread waits on it): done by
 * whoever holds the lock, before it lets go. */
struct pending {
    shmref_buf *buf;
    shmref_unit *unit;          /* or a producer unit (publish_batch) */
    struct pending *next;
};

typedef struct ConnObject {
    PyObject_HEAD
    shmref_conn *c;             /* NULL once closed for a forked child */
    pid_t pid;                  /* the process that connected */
    pthread_mutex_t lock;       /* serialises every use of c */
    pthread_mutex_t plock;      /* guards pending; never held across a wait */
    struct pending *pending;
    struct ConnObject *prev, *next; /* every live Conn, for the fork hook */
} ConnObject;

typedef struct {
    PyObject_HEAD
    ConnObject *conn;
    shmref_buf *buf;            /* NULL once released */
    char *data;
    size_t size;
    bool lease;                 /* writable until published */
    bool published;
    bool released;              /* release() asked: done when the last view goes */
    bool has_desc;
    shmref_desc desc;
    PyObject *layout;           /* (dtype str, shape, order) the buffer was made for, or NULL */
    PyObject *user;             /* the user metadata, or NULL */
    PyObject *socket;           /* str: the daemon's socket path */
    Py_ssize_t exports;
} BufferObject;

typedef struct {
    PyObject_HEAD
    shmref_desc desc;
} RefObject;

extern PyTypeObject Conn_Type, Buffer_Type, Ref_Type, Client_Type, Batch_Type, Unit_Type;
extern PyObject *shmrefpy_array_type; /* shmref.SharedArray, set at import */

/* shmrefpy_raise: OSError(-err, msg): Python picks the subclass (TimeoutError,
 * FileNotFoundError, ConnectionResetError, ChildProcessError ...). Returns NULL. */
PyObject *shmrefpy_raise(int err, const char *msg);
/* shmrefpy_forked: raise ChildProcessError if conn belongs to another process (or was
 * closed for a forked child). Returns -1 with the error set, else 0. */
int shmrefpy_forked(ConnObject *conn);

/* Conn: lock / unlock with the GIL released around the wait; unlock first does the
 * releases that queued up meanwhile. */
void conn_lock_nogil(ConnObject *conn);
void conn_unlock_nogil(ConnObject *conn);
/* conn_release_buf: drop buf now if the connection is free, else queue it. GIL held;
 * never waits for another thread's call. */
void conn_release_buf(ConnObject *conn, shmref_buf *buf);
/* conn_release_unit: the same for a producer unit (its lease). */
void conn_release_unit(ConnObject *conn, shmref_unit *unit);
/* conn_after_fork_child: every Conn is closed for the child (mappings kept). */
void conn_after_fork_child(void);

/* buffer_new: an owner for buf (reference to conn taken). */
BufferObject *buffer_new(ConnObject *conn, shmref_buf *buf, bool lease, PyObject *socket);
/* buffer_of: the Buffer behind a numpy array (following .base), or NULL (no error set). */
BufferObject *buffer_of(PyObject *array);
/* buffer_array: an ndarray over owner's bytes at offset, with dtype / shape / strides
 * (strides NULL: contiguous in order 'C' or 'F'); checked to lie within the buffer.
 * Writable only for an unpublished lease. New reference, or NULL with an error. */
PyObject *buffer_array(BufferObject *owner, PyObject *dtype, int ndim, const Py_ssize_t *shape,
                       const Py_ssize_t *strides, char order, size_t offset);

/* ref_new: a Ref for desc. */
PyObject *ref_new(const shmref_desc *desc);
/* ref_parse: a Ref or its text into *ret. Returns -1 with TypeError/ValueError set. */
int ref_parse(PyObject *obj, shmref_desc *ret);

/* batch_publish: publish_batch's work on conn: obj's Arrow data copied into one unit and
 * published; the Ref, with *ret_unit (a _Unit holding the lease) for the client to keep. */
PyObject *batch_publish(ConnObject *conn, PyObject *obj, unsigned long keep_ms, unsigned flags, PyObject **ret_unit);
/* batch_acquire: a Batch for ref, acquired on a connection of its own to socket, with
 * shmref_unit_acquire_ex's flags (SHMREF_ACQUIRE_SEALED, SHMREF_ACQUIRE_TRUST_PRODUCER). */
PyObject *batch_acquire(PyObject *socket, int timeout_ms, PyObject *ref, unsigned flags);

int shmrefpy_init_numpy(void);

#endif
