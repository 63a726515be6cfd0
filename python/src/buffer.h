/* SPDX-License-Identifier: MIT */
/* buffer.h: shmref.Buffer, the owner object behind every array shmref hands out (their
 * .base): the C buffer handle, its mapping and a reference to the connection. */
#ifndef SHMREFPY_BUFFER_H
#define SHMREFPY_BUFFER_H

#include "conn.h"

typedef struct {
    PyObject_HEAD
    ConnObject *conn;
    shmref_buf *buf;            /* NULL once released */
    char *data;
    size_t size;
    bool lease;                 /* writable until published or frozen */
    bool published;
    bool frozen;                /* read-only from now on (published, or a shared() copy) */
    bool released;              /* given up (Client.release) */
    bool private_;              /* acquired private (copy-on-write): writable, its writes this process's only */
    bool has_desc;
    shmref_desc desc;
    shmref_meta_array *layout;  /* a lease's layout from empty() (PyMem_Malloc'd), or NULL */
    PyObject *user;             /* the user metadata, or NULL */
    Py_ssize_t exports;         /* live buffer-protocol exports of this object (memoryviews) */
    Py_ssize_t exports_rw;      /* live writable exports of it and of its arrays (buffer_track_exports) */
    PyObject *views;            /* a writable lease's numpy views of shmref's type: a list of
                                 * weak references (buffer_array_finalize), frozen at publish */
    Py_ssize_t views_prune;     /* the length of views at which dead references are dropped */
} BufferObject;

extern PyTypeObject Buffer_Type;

/* buffer_new: an owner for buf (reference to conn taken). On failure buf is released. */
BufferObject *buffer_new(ConnObject *conn, shmref_buf *buf, bool lease);
/* buffer_of: the Buffer behind a numpy array or memoryview (following .base), or NULL
 * (no error set). */
BufferObject *buffer_of(PyObject *array);
/* buffer_array: an ndarray over owner's bytes at offset, with dtype / shape / strides
 * (strides NULL: contiguous in order 'C' or 'F'); checked to lie within the buffer.
 * Writable only for a lease neither published nor frozen. New reference, or NULL. */
PyObject *buffer_array(BufferObject *owner, PyObject *dtype, int ndim, const Py_ssize_t *shape,
                       const Py_ssize_t *strides, char order, size_t offset);
/* buffer_array_descr: the same with dtype a numpy descriptor whose reference it steals. */
PyObject *buffer_array_descr(BufferObject *owner, PyObject *descr, int ndim, const Py_ssize_t *shape,
                             const Py_ssize_t *strides, char order, size_t offset);
/* buffer_descr: dtype (a str, a numpy dtype, a type, None: float64) as a numpy descriptor,
 * type strings cached. New reference, or NULL. */
PyObject *buffer_descr(PyObject *dtype);
/* buffer_descr_str: a type string from metadata ("<f8") as a numpy descriptor, cached
 * by its bytes (no str made on a hit). New reference, or NULL. */
PyObject *buffer_descr_str(const char *typestr);
/* buffer_typestr: descr's type string (numpy's dtype.str, what metadata carries) into
 * out: computed for numpy's numeric types, asked of numpy for the others. 0, or -1 with
 * an error. */
int buffer_typestr(PyObject *descr, char out[SHMREF_META_DTYPE_MAX]);
/* buffer_freeze: the buffer read-only for every view: the array given, each array it is
 * a view of and every live numpy view of shmref's type made from them (slices, reshapes)
 * lose NPY_ARRAY_WRITEABLE (a write raises), and later exports and views are read-only.
 * A writable buffer-protocol export still alive (a memoryview made before) cannot be
 * made read-only: BufferError naming them, nothing frozen. The mapping itself stays
 * writable (no mprotect: docs/python.md says why); array may be NULL (the owner alone).
 * 0, or -1 with BufferError set. */
int buffer_freeze(BufferObject *owner, PyObject *array);
/* buffer_array_finalize: SharedArray.__array_finalize__ (a C method on the type): a
 * writable view of a writable lease is remembered (weakly) so that publishing freezes
 * it. New reference to None, or NULL with an error. */
PyObject *buffer_array_finalize(PyObject *self, PyObject *obj);
/* buffer_track_exports: count writable buffer-protocol exports of arrays of type (a
 * heap subclass of ndarray: shmref.SharedArray) in their owner's exports_rw, by
 * wrapping numpy's getbuffer / releasebuffer in the type's slots. 0, or -1. */
int buffer_track_exports(PyTypeObject *type);
/* buffer_release: Client.release's work: give the buffer up now, or BufferError naming
 * what still uses it. array: the array (or memoryview) the caller passed, which may hold
 * `allowed` references (the caller's name and the call's own: 2); every array between it
 * and the owner may be held only by the view below it, the owner only by the top one.
 * The arrays of that chain then read as empty. 0, or -1 with the error set. */
int buffer_release(BufferObject *owner, PyObject *array, Py_ssize_t allowed);
/* buffer_set_array_type: the ndarray subclass arrays are made of (shmref.SharedArray). */
int buffer_set_array_type(PyObject *type);

#endif
