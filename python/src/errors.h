/* SPDX-License-Identifier: MIT */
/* errors.h: the bottom layer of shmref._shmref: the headers every module needs (Python,
 * libshmref's public API) and how errors become Python exceptions. Includes no other
 * module of the extension. */
#ifndef SHMREFPY_ERRORS_H
#define SHMREFPY_ERRORS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <sys/types.h>

#include "shmref/shmref.h"

#define SHMREFPY_MSG_MAX 640

/* The extension's OSError subclasses, made by errors_init: Refused(OSError) and under it
 * QuotaExceeded (EDQUOT), PoolFull (ENOSPC) and LimitReached (EUSERS, EMFILE, ENFILE,
 * ETOOMANYREFS, ENOBUFS). */
extern PyObject *shmrefpy_Refused, *shmrefpy_QuotaExceeded, *shmrefpy_PoolFull, *shmrefpy_LimitReached;

/* errors_init: create the exception classes and add them to module m. -1 with an error. */
int errors_init(PyObject *m);

/* shmrefpy_raise: an OSError(-err, msg): one of the classes above for the daemon's
 * refusals, else Python picks the subclass (TimeoutError, FileNotFoundError,
 * ConnectionResetError ...). msg "" means strerror. Returns NULL. */
PyObject *shmrefpy_raise(int err, const char *msg);
/* shmrefpy_raise_wait: shmrefpy_raise for a lease of call `what` (empty, share,
 * publish_batch) that was asked to wait wait_ms for quota or pool space. When the daemon
 * said the wait ran out (ETIMEDOUT, the connection fine), a TimeoutError whose message
 * names the wait before the daemon's words and numbers, and whose attribute `wait` is
 * that wait in seconds (a connection that timed out has none). Returns NULL. */
PyObject *shmrefpy_raise_wait(int err, const char *what, uint32_t wait_ms, const char *msg);

/* shmrefpy_getpid: this process's pid without a system call. getpid() is one (about
 * 0.5 us on a VM with the usual mitigations) and the extension checks for a forked child
 * on every call: the pid is read at import and again in every child fork() makes
 * (pthread_atfork: os.fork, multiprocessing, C code's fork alike). */
extern pid_t shmrefpy_self_pid;
static inline pid_t shmrefpy_getpid(void)
{
    return shmrefpy_self_pid;
}
/* shmrefpy_pid_init: at import. -1 with an error. */
int shmrefpy_pid_init(void);

/* shmrefpy_add_object: PyModule_AddObjectRef's contract on every Python from 3.9 on (value
 * borrowed). */
int shmrefpy_add_object(PyObject *m, const char *name, PyObject *value);

#endif
