/* SPDX-License-Identifier: MIT */
/* conn.c: _Conn: one libshmref connection, its lock, the releases queued while it was
 * busy, the fork hook, and a close that never blocks. */
#include "conn.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

static ConnObject *all_conns; /* guarded by the GIL */

/* ---- the core: lock and queue ---- */

struct conn_pending {
    void (*fn)(void *);
    void *arg;
    struct conn_pending *next;
};

struct conn_core {
    pthread_mutex_t lock;       /* serialises every use of the connection */
    pthread_mutex_t plock;      /* guards pending; never held across a wait */
    struct conn_pending *pending;
    pthread_t owner;            /* the thread holding lock, while owned */
    atomic_bool owned;
    atomic_bool closed;         /* shmref_close done (or a forked child's) */
    atomic_int refs;
};

static struct conn_core *core_new(void)
{
    struct conn_core *k = calloc(1, sizeof(*k));
    if (!k)
        return NULL;
    pthread_mutex_init(&k->lock, NULL);
    pthread_mutex_init(&k->plock, NULL);
    atomic_init(&k->owned, false);
    atomic_init(&k->closed, false);
    atomic_init(&k->refs, 1);
    return k;
}

struct conn_core *conn_core_ref(struct conn_core *k)
{
    atomic_fetch_add(&k->refs, 1);
    return k;
}

void conn_core_unref(struct conn_core *k)
{
    if (atomic_fetch_sub(&k->refs, 1) != 1)
        return;
    for (struct conn_pending *p = k->pending, *n; p; p = n) { /* none: drained at close */
        n = p->next;
        free(p);
    }
    pthread_mutex_destroy(&k->lock);
    pthread_mutex_destroy(&k->plock);
    free(k);
}

static void took(struct conn_core *k)
{
    k->owner = pthread_self();
    atomic_store(&k->owned, true);
}

static bool mine(struct conn_core *k)
{
    return atomic_load(&k->owned) && pthread_equal(k->owner, pthread_self());
}

static void drain(struct conn_core *k)
{
    for (;;) {
        pthread_mutex_lock(&k->plock);
        struct conn_pending *p = k->pending;
        k->pending = NULL;
        pthread_mutex_unlock(&k->plock);
        if (!p)
            return;
        while (p) {
            struct conn_pending *next = p->next;
            p->fn(p->arg);
            free(p);
            p = next;
        }
    }
}

/* unlock: the queued work first; work queued after our last look is picked up by its
 * own trylock, or by us here. */
static void unlock(struct conn_core *k)
{
    for (;;) {
        drain(k);
        atomic_store(&k->owned, false);
        pthread_mutex_unlock(&k->lock);
        pthread_mutex_lock(&k->plock);
        bool more = k->pending != NULL;
        pthread_mutex_unlock(&k->plock);
        if (!more || pthread_mutex_trylock(&k->lock) != 0)
            return;
        took(k);
    }
}

int conn_core_run(struct conn_core *k, void (*fn)(void *), void *arg)
{
    if (mine(k) || atomic_load(&k->closed)) {
        fn(arg);
        return 0;
    }
    if (pthread_mutex_trylock(&k->lock) == 0) {
        took(k);
        fn(arg);
        unlock(k);
        return 0;
    }
    struct conn_pending *p = malloc(sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->fn = fn;
    p->arg = arg;
    pthread_mutex_lock(&k->plock);
    p->next = k->pending;
    k->pending = p;
    pthread_mutex_unlock(&k->plock);
    if (pthread_mutex_trylock(&k->lock) == 0) {
        took(k);
        unlock(k);
    }
    return 0;
}

/* ---- Conn ---- */

void conn_lock_nogil(ConnObject *conn)
{
    pthread_mutex_lock(&conn->core->lock);
    took(conn->core);
}

int conn_trylock(ConnObject *conn)
{
    if (pthread_mutex_trylock(&conn->core->lock) != 0)
        return 0;
    took(conn->core);
    return 1;
}

void conn_unlock_nogil(ConnObject *conn)
{
    unlock(conn->core);
}

static void release_buf(void *buf)
{
    shmref_release(buf);
}

static void release_unit(void *unit)
{
    shmref_unit_release(unit);
}

static void conn_release(ConnObject *conn, void (*fn)(void *), void *arg)
{
    if (shmrefpy_getpid() != conn->pid) {
        /* A forked child: the parent's handle, inherited. libshmref frees the child's copy
         * only (nothing sent, nothing unmapped), also after the at-fork close, which keeps
         * such handles until they are released (conn_after_fork_child). No lock: the
         * connection is closed here, and libshmref's kept handles go with atomics only. */
        fn(arg);
        return;
    }
    if (conn_core_run(conn->core, fn, arg) == 0)
        return;
    Py_BEGIN_ALLOW_THREADS /* out of memory: wait for the lock, without the GIL */
    conn_lock_nogil(conn);
    fn(arg);
    conn_unlock_nogil(conn);
    Py_END_ALLOW_THREADS
}

void conn_release_buf(ConnObject *conn, shmref_buf *buf)
{
    conn_release(conn, release_buf, buf);
}

void conn_release_unit(ConnObject *conn, shmref_unit *unit)
{
    conn_release(conn, release_unit, unit);
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
 * the interpreter, whatever the daemon does (stopped, paused at its fd cap). Conn_dealloc
 * does the same under the core's lock. */
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
    struct conn_core *k = self->core;
    if (self->c) {
        /* The lock, without the GIL: an export's release may be running on another
         * thread (they never wait, so neither do we, for long). */
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&k->lock);
        took(k);
        drain(k);
        if (self->pid == shmrefpy_getpid()) {
            shmref_set_timeout(self->c, 1);
            shmref_close(self->c);
        } else {
            shmref_close(self->c); /* a forked child: its copy of the socket only, no message */
        }
        atomic_store(&k->closed, true);
        unlock(k);
        Py_END_ALLOW_THREADS
    }
    conn_core_unref(k);
    Py_XDECREF(self->socket);
    PyObject_Free(self);
}

void conn_after_fork_child(void)
{
    for (ConnObject *c = all_conns; c; c = c->next) {
        struct conn_core *k = c->core;
        pthread_mutex_init(&k->lock, NULL); /* another thread may have held it at fork */
        pthread_mutex_init(&k->plock, NULL);
        atomic_store(&k->owned, false);
        for (struct conn_pending *p = k->pending, *n; p; p = n) { /* the parent's work */
            n = p->next;
            free(p);
        }
        k->pending = NULL;
        if (c->c) /* the child's copy of the socket; mappings stay, and so do the handles
                   * (units too) that Buffers and Batches hold: each goes at its release */
            shmref_close(c->c);
        c->c = NULL;
        atomic_store(&k->closed, true);
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

ConnObject *conn_new(PyObject *socket, int timeout_ms, int named)
{
    const char *path = PyUnicode_AsUTF8(socket);
    if (!path)
        return NULL;
    char msg[SHMREFPY_MSG_MAX] = "";
    shmref_conn *c = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = shmref_connect_timeout(named ? path : NULL, timeout_ms, msg, sizeof(msg), &c);
    Py_END_ALLOW_THREADS
    if (r < 0)
        return (ConnObject *)shmrefpy_raise(r, msg);
    ConnObject *conn = PyObject_New(ConnObject, &Conn_Type);
    struct conn_core *k = conn ? core_new() : NULL;
    if (!k) {
        if (conn)
            PyObject_Free(conn);
        close_nowait(c);
        return (ConnObject *)PyErr_NoMemory();
    }
    conn->c = c;
    conn->pid = shmrefpy_getpid();
    conn->core = k;
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
    if (conn->c && shmrefpy_getpid() == conn->pid)
        return 0;
    pid_t me = getpid();
    PyErr_Format(PyExc_ChildProcessError,
                 "connection was opened by pid %d; this is pid %d: connect again in the child",
                 (int)conn->pid, (int)me);
    return -1;
}
