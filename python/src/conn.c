/* SPDX-License-Identifier: MIT */
/* conn.c: _Conn: one libshmref connection, its lock, the releases queued while it was
 * busy, the fork hook, and a close that never blocks. */
#include "conn.h"

#include <stdlib.h>
#include <unistd.h>

static ConnObject *all_conns; /* guarded by the GIL */

/* ---- Conn ---- */

static void drain(ConnObject *conn)
{
    for (;;) {
        pthread_mutex_lock(&conn->plock);
        struct conn_pending *p = conn->pending;
        conn->pending = NULL;
        pthread_mutex_unlock(&conn->plock);
        if (!p)
            return;
        while (p) {
            struct conn_pending *next = p->next;
            if (conn->c && p->buf)
                shmref_release(p->buf);
            else if (conn->c)
                shmref_unit_release(p->unit);
            free(p);
            p = next;
        }
    }
}

/* unlock: the queued releases first; one queued after our last look is picked up by
 * its own trylock, or by us here. */
static void unlock(ConnObject *conn)
{
    for (;;) {
        drain(conn);
        pthread_mutex_unlock(&conn->lock);
        pthread_mutex_lock(&conn->plock);
        bool more = conn->pending != NULL;
        pthread_mutex_unlock(&conn->plock);
        if (!more || pthread_mutex_trylock(&conn->lock) != 0)
            return;
    }
}

void conn_lock_nogil(ConnObject *conn)
{
    pthread_mutex_lock(&conn->lock);
}

void conn_unlock_nogil(ConnObject *conn)
{
    unlock(conn);
}

static void release_now(shmref_buf *buf, shmref_unit *unit)
{
    if (buf)
        shmref_release(buf);
    else
        shmref_unit_release(unit);
}

static void conn_release(ConnObject *conn, shmref_buf *buf, shmref_unit *unit)
{
    if (!conn->c || getpid() != conn->pid)
        return; /* a forked child: the parent's handle is not ours to drop */
    if (pthread_mutex_trylock(&conn->lock) == 0) {
        release_now(buf, unit);
        unlock(conn);
        return;
    }
    struct conn_pending *p = malloc(sizeof(*p));
    if (!p) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&conn->lock);
        release_now(buf, unit);
        unlock(conn);
        Py_END_ALLOW_THREADS
        return;
    }
    p->buf = buf;
    p->unit = unit;
    pthread_mutex_lock(&conn->plock);
    p->next = conn->pending;
    conn->pending = p;
    pthread_mutex_unlock(&conn->plock);
    if (pthread_mutex_trylock(&conn->lock) == 0)
        unlock(conn);
}

void conn_release_buf(ConnObject *conn, shmref_buf *buf)
{
    conn_release(conn, buf, NULL);
}

void conn_release_unit(ConnObject *conn, shmref_unit *unit)
{
    conn_release(conn, NULL, unit);
}

static void conn_unlist(ConnObject *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else if (all_conns == c)
        all_conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

/* close_nowait: shmref_close bounded to about a millisecond (it waits only for replies
 * already on their way, so that the daemon counts a clean close; what has not come by
 * then ends with the connection anyway), the GIL released: a destructor never blocks
 * the interpreter, whatever the daemon does (stopped, paused at its fd cap). */
static void close_nowait(shmref_conn *c)
{
    shmref_set_timeout(c, 1);
    Py_BEGIN_ALLOW_THREADS
    shmref_close(c);
    Py_END_ALLOW_THREADS
}

static void Conn_dealloc(ConnObject *self)
{
    conn_unlist(self);
    if (self->c) {
        drain(self);
        if (self->pid == getpid())
            close_nowait(self->c);
        else
            shmref_close(self->c); /* a forked child: its copy of the socket only, no message */
    }
    for (struct conn_pending *p = self->pending, *n; p; p = n) {
        n = p->next;
        free(p);
    }
    Py_XDECREF(self->socket);
    pthread_mutex_destroy(&self->lock);
    pthread_mutex_destroy(&self->plock);
    PyObject_Free(self);
}

void conn_after_fork_child(void)
{
    for (ConnObject *c = all_conns; c; c = c->next) {
        pthread_mutex_init(&c->lock, NULL); /* another thread may have held it at fork */
        pthread_mutex_init(&c->plock, NULL);
        for (struct conn_pending *p = c->pending, *n; p; p = n) {
            n = p->next;
            free(p);
        }
        c->pending = NULL;
        if (c->c)
            shmref_close(c->c); /* the child's copy of the socket; mappings stay */
        c->c = NULL;
    }
}

PyTypeObject Conn_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmref._Conn",
    .tp_basicsize = sizeof(ConnObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One connection to shmrefd, shared by a Client and the buffers it handed out.",
    .tp_dealloc = (destructor)Conn_dealloc,
};

ConnObject *conn_new(PyObject *socket, int timeout_ms)
{
    const char *path = PyUnicode_AsUTF8(socket);
    if (!path)
        return NULL;
    char msg[SHMREFPY_MSG_MAX] = "";
    shmref_conn *c = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = shmref_connect_timeout(path, timeout_ms, msg, sizeof(msg), &c);
    Py_END_ALLOW_THREADS
    if (r < 0)
        return (ConnObject *)shmrefpy_raise(r, msg);
    ConnObject *conn = PyObject_New(ConnObject, &Conn_Type);
    if (!conn) {
        close_nowait(c);
        return NULL;
    }
    conn->c = c;
    conn->pid = getpid();
    pthread_mutex_init(&conn->lock, NULL);
    pthread_mutex_init(&conn->plock, NULL);
    conn->pending = NULL;
    Py_INCREF(socket);
    conn->socket = socket;
    conn->prev = NULL;
    conn->next = all_conns;
    if (all_conns)
        all_conns->prev = conn;
    all_conns = conn;
    return conn;
}

int conn_forked(ConnObject *conn)
{
    pid_t me = getpid();
    if (conn->c && me == conn->pid)
        return 0;
    PyErr_Format(PyExc_ChildProcessError,
                 "connection was opened by pid %d; this is pid %d: connect again in the child",
                 (int)conn->pid, (int)me);
    return -1;
}
