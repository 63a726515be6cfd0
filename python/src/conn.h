/* SPDX-License-Identifier: MIT */
/* conn.h: _Conn, one libshmref connection shared by a Client, the buffers and Batches it
 * handed out, with the lock that serialises its use and the releases queued while it was
 * busy. Lifetimes: every Buffer and Batch holds a reference to its Conn, so the connection
 * and the mappings stay while any of them exists, even after Client.close(). */
#ifndef SHMREFPY_CONN_H
#define SHMREFPY_CONN_H

#include <pthread.h>

#include "errors.h"

/* The connection's lock and the work queued while it was busy, in a block of its own:
 * Arrow structures exported from a Batch keep it (not the Python object) and release
 * through it from any thread, without the GIL, also after the Conn is gone. */
struct conn_core;

typedef struct ConnObject {
    PyObject_HEAD
    shmref_conn *c;             /* NULL once closed for a forked child */
    pid_t pid;                  /* the process that connected */
    struct conn_core *core;     /* the lock serialising every use of c, and the queue */
    PyObject *socket;           /* str: the path connected to */
    struct ConnObject *prev, *next; /* every live Conn, for the fork hook */
} ConnObject;

extern PyTypeObject Conn_Type;

/* conn_new: connect to path (a str; named 0: libshmref's default socket instead, which may
 * start a private daemon) (timeout_ms as shmref_connect_timeout), the GIL released
 * while it waits. New reference, or NULL with the error set. */
ConnObject *conn_new(PyObject *path, int timeout_ms, int named);
/* conn_forked: raise ChildProcessError if conn belongs to another process (or was
 * closed for a forked child). Returns -1 with the error set, else 0. */
int conn_forked(ConnObject *conn);
/* conn_lock_nogil / conn_unlock_nogil: take / let go of the connection, called without
 * the GIL; unlock first does the releases that queued up meanwhile. */
void conn_lock_nogil(ConnObject *conn);
void conn_unlock_nogil(ConnObject *conn);
/* conn_trylock: take the connection if it is free, with or without the GIL (never
 * waits): 1 taken (let go with conn_unlock_nogil), 0 busy. For calls that never wait
 * for the daemon (a plain publish is one-way), which then keep the GIL. */
int conn_trylock(ConnObject *conn);
/* conn_release_buf: drop buf now if the connection is free, else queue it (one-way
 * messages only); in a forked child, free the child's copy of the inherited handle.
 * GIL held; never waits for another thread's call. */
void conn_release_buf(ConnObject *conn, shmref_buf *buf);
/* conn_release_unit: the same for a unit handle. */
void conn_release_unit(ConnObject *conn, shmref_unit *unit);
/* conn_core_ref / conn_core_unref: a reference to a Conn's core (atomic; no GIL needed). */
struct conn_core *conn_core_ref(struct conn_core *core);
void conn_core_unref(struct conn_core *core);
/* conn_core_run: fn(arg) serialised with every other use of the connection, from any
 * thread, with or without the GIL, never waiting: at once if the lock is free (or this
 * thread holds it) or the connection is closed (libshmref's calls on a closed connection
 * are thread-safe), else queued and run by the thread holding the lock before it lets
 * go. -ENOMEM when it could be neither (nothing run). */
int conn_core_run(struct conn_core *core, void (*fn)(void *), void *arg);
/* conn_after_fork_child: every Conn is closed for the child: its copy of the socket goes,
 * the mappings and the inherited handles stay until their Buffers and Batches go. */
void conn_after_fork_child(void);

#endif
