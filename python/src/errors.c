/* SPDX-License-Identifier: MIT */
/* errors.c: libshmref's -errno and message as Python exceptions. */
#include "errors.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

pid_t shmrefpy_self_pid;

static void pid_after_fork_child(void)
{
    shmrefpy_self_pid = getpid();
}

int shmrefpy_pid_init(void)
{
    static bool registered;
    shmrefpy_self_pid = getpid();
    if (!registered) {
        int r = pthread_atfork(NULL, NULL, pid_after_fork_child);
        if (r) {
            errno = r;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        registered = true;
    }
    return 0;
}

PyObject *shmrefpy_Refused, *shmrefpy_QuotaExceeded, *shmrefpy_PoolFull, *shmrefpy_LimitReached;

int shmrefpy_add_object(PyObject *m, const char *name, PyObject *value)
{
    Py_INCREF(value);
    if (PyModule_AddObject(m, name, value) < 0) {
        Py_DECREF(value);
        return -1;
    }
    return 0;
}

static PyObject *new_class(PyObject *m, const char *name, PyObject *base, const char *doc)
{
    char full[128];
    snprintf(full, sizeof(full), "shmref.%s", name);
    PyObject *cls = PyErr_NewExceptionWithDoc(full, doc, base, NULL);
    if (cls && shmrefpy_add_object(m, name, cls) < 0)
        Py_CLEAR(cls);
    return cls;
}

int errors_init(PyObject *m)
{
    if (shmrefpy_Refused)
        return shmrefpy_add_object(m, "Refused", shmrefpy_Refused) < 0 ||
                       shmrefpy_add_object(m, "QuotaExceeded", shmrefpy_QuotaExceeded) < 0 ||
                       shmrefpy_add_object(m, "PoolFull", shmrefpy_PoolFull) < 0 ||
                       shmrefpy_add_object(m, "LimitReached", shmrefpy_LimitReached) < 0
                   ? -1
                   : 0;
    shmrefpy_Refused = new_class(m, "Refused", PyExc_OSError,
                                 "The daemon refused a request for a limit of its policy (an OSError: errno "
                                 "and the daemon's message with its numbers). Subclasses: QuotaExceeded, "
                                 "PoolFull, LimitReached.");
    if (!shmrefpy_Refused)
        return -1;
    shmrefpy_QuotaExceeded = new_class(m, "QuotaExceeded", shmrefpy_Refused,
                                       "errno EDQUOT: the tenant's quota (bytes or buffers) would be exceeded.");
    shmrefpy_PoolFull = new_class(m, "PoolFull", shmrefpy_Refused,
                                  "errno ENOSPC: the daemon's pool has no room for the buffer.");
    shmrefpy_LimitReached = new_class(m, "LimitReached", shmrefpy_Refused,
                                      "errno EUSERS, EMFILE, ENFILE, ETOOMANYREFS or ENOBUFS: a count limit "
                                      "(connections per uid, descriptors, queued requests) was reached.");
    return shmrefpy_QuotaExceeded && shmrefpy_PoolFull && shmrefpy_LimitReached ? 0 : -1;
}

PyObject *shmrefpy_raise_wait(int err, const char *what, uint32_t wait_ms, const char *msg)
{
    /* The library's own timeout (no answer: the connection is abandoned) says so. */
    if (err != -ETIMEDOUT || !wait_ms || strstr(msg, "no answer from shmrefd"))
        return shmrefpy_raise(err, msg);
    char full[SHMREFPY_MSG_MAX + 96];
    snprintf(full, sizeof(full), "%s(wait=%g): no buffer within %g s: %s", what, wait_ms / 1000.0,
             wait_ms / 1000.0, msg);
    shmrefpy_raise(err, full);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *w = PyFloat_FromDouble(wait_ms / 1000.0);
    if (!w || !value || PyObject_SetAttrString(value, "wait", w) < 0)
        PyErr_Clear(); /* the exception stands without it */
    Py_XDECREF(w);
    PyErr_Restore(type, value, tb);
    return NULL;
}

PyObject *shmrefpy_raise(int err, const char *msg)
{
    if (err < 0)
        err = -err;
    if (err == ENOMEM && (!msg || !*msg))
        return PyErr_NoMemory();
    PyObject *cls = PyExc_OSError;
    switch (err) {
    case EDQUOT:
        cls = shmrefpy_QuotaExceeded;
        break;
    case ENOSPC:
        cls = shmrefpy_PoolFull;
        break;
    case EUSERS:
    case EMFILE:
    case ENFILE:
    case ETOOMANYREFS:
    case ENOBUFS:
        cls = shmrefpy_LimitReached;
        break;
    }
    if (!cls)
        cls = PyExc_OSError;
    PyObject *args = Py_BuildValue("(is)", err, msg && *msg ? msg : strerror(err));
    if (args) {
        PyErr_SetObject(cls, args);
        Py_DECREF(args);
    }
    return NULL;
}
