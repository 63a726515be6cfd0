/* SPDX-License-Identifier: MIT */
/* buffer.c: the owner object behind every array shmref hands out. It holds the C
 * buffer handle and a reference to the connection, exports its bytes (read-only unless
 * it is a lease not yet published) and drops the daemon's reference only when the last
 * view of it is gone: numpy arrays keep it as their .base, memoryviews count exports. */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL shmrefpy_ARRAY_API
#include "shmrefpy.h"

#include <numpy/arrayobject.h>

BufferObject *buffer_new(ConnObject *conn, shmref_buf *buf, bool lease, PyObject *socket)
{
    BufferObject *b = PyObject_New(BufferObject, &Buffer_Type);
    if (!b) {
        conn_release_buf(conn, buf);
        return NULL;
    }
    Py_INCREF(conn);
    b->conn = conn;
    b->buf = buf;
    b->data = shmref_buf_data(buf);
    b->size = shmref_buf_size(buf);
    b->lease = lease;
    b->published = b->released = b->has_desc = false;
    b->layout = b->user = NULL;
    Py_XINCREF(socket);
    b->socket = socket;
    b->exports = 0;
    return b;
}

static void Buffer_dealloc(BufferObject *self)
{
    if (self->buf)
        conn_release_buf(self->conn, self->buf);
    Py_XDECREF(self->conn);
    Py_XDECREF(self->layout);
    Py_XDECREF(self->user);
    Py_XDECREF(self->socket);
    PyObject_Free(self);
}

BufferObject *buffer_of(PyObject *obj)
{
    for (int i = 0; obj && i < 64; i++) {
        if (Py_TYPE(obj) == &Buffer_Type)
            return (BufferObject *)obj;
        if (PyArray_Check(obj))
            obj = PyArray_BASE((PyArrayObject *)obj);
        else if (PyMemoryView_Check(obj))
            obj = PyMemoryView_GET_BUFFER(obj)->obj;
        else
            return NULL;
    }
    return NULL;
}

static int Buffer_getbuffer(BufferObject *self, Py_buffer *view, int flags)
{
    int readonly = !(self->lease && !self->published);
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->data, (Py_ssize_t)self->size, readonly, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void Buffer_releasebuffer(BufferObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

static PyBufferProcs Buffer_as_buffer = {
    .bf_getbuffer = (getbufferproc)Buffer_getbuffer,
    .bf_releasebuffer = (releasebufferproc)Buffer_releasebuffer,
};

/* descr_of: dtype as a descriptor; type strings (what metadata carries) are cached, since
 * parsing one costs about as much as the rest of building an array. New reference. */
static PyArray_Descr *descr_of(PyObject *dtype)
{
    static PyObject *cache;
    PyArray_Descr *descr = NULL;
    if (!PyUnicode_Check(dtype)) {
        return PyArray_DescrConverter(dtype, &descr) ? descr : NULL;
    }
    if (!cache && !(cache = PyDict_New()))
        return NULL;
    PyObject *hit = PyDict_GetItemWithError(cache, dtype);
    if (hit) {
        Py_INCREF(hit);
        return (PyArray_Descr *)hit;
    }
    if (PyErr_Occurred() || !PyArray_DescrConverter(dtype, &descr))
        return NULL;
    if (PyDict_Size(cache) >= 256)
        PyDict_Clear(cache);
    if (PyDict_SetItem(cache, dtype, (PyObject *)descr) < 0)
        PyErr_Clear();
    return descr;
}

/* extent: the lowest and one-past-highest byte a strided layout touches. */
static int check_extent(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides, Py_ssize_t item,
                        size_t offset, size_t size)
{
    __int128 lo = (__int128)offset, hi = (__int128)offset + item;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] == 0)
            return offset <= size ? 0 : -1;
        __int128 span = (__int128)(shape[i] - 1) * strides[i];
        if (span < 0)
            lo += span;
        else
            hi += span;
    }
    return lo >= 0 && hi <= (__int128)size ? 0 : -1;
}

PyObject *buffer_array(BufferObject *owner, PyObject *dtype, int ndim, const Py_ssize_t *shape,
                       const Py_ssize_t *strides, char order, size_t offset)
{
    PyArray_Descr *descr = descr_of(dtype);
    if (!descr)
        return NULL;
    if (PyDataType_REFCHK(descr)) {
        Py_DECREF(descr);
        return PyErr_Format(PyExc_TypeError, "dtype %R holds Python objects: it cannot live in shared memory",
                            (PyObject *)descr);
    }
    if (ndim < 0 || ndim > SHMREF_META_MAX_DIMS) {
        Py_DECREF(descr);
        return PyErr_Format(PyExc_ValueError, "%d dimensions: at most %d", ndim, SHMREF_META_MAX_DIMS);
    }
    Py_ssize_t item = PyDataType_ELSIZE(descr);
    Py_ssize_t cs[SHMREF_META_MAX_DIMS];
    if (!strides) { /* contiguous in the given order */
        Py_ssize_t s = item;
        for (int k = 0; k < ndim; k++) {
            int i = order == 'F' ? k : ndim - 1 - k;
            cs[i] = s;
            if (shape[i] > 0 && s > PY_SSIZE_T_MAX / shape[i]) {
                Py_DECREF(descr);
                return PyErr_Format(PyExc_ValueError, "array too large");
            }
            s *= shape[i] > 0 ? shape[i] : 1;
        }
        strides = cs;
    }
    if (check_extent(ndim, shape, strides, item, offset, owner->size) < 0) {
        Py_DECREF(descr);
        return PyErr_Format(PyExc_ValueError, "the array (dtype %R, %d dimensions, offset %zu) does not lie "
                            "within the buffer's %zu bytes", (PyObject *)descr, ndim, offset, owner->size);
    }
    int flags = owner->lease && !owner->published ? NPY_ARRAY_WRITEABLE : 0;
    PyTypeObject *type = shmrefpy_array_type ? (PyTypeObject *)shmrefpy_array_type : &PyArray_Type;
    npy_intp dims[SHMREF_META_MAX_DIMS], st[SHMREF_META_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        dims[i] = shape[i];
        st[i] = strides[i];
    }
    PyObject *arr = PyArray_NewFromDescr(type, descr, ndim, dims, st, owner->data + offset, flags, NULL);
    if (!arr)
        return NULL;
    Py_INCREF(owner);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)owner) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *Buffer_repr(BufferObject *self)
{
    char text[SHMREF_DESC_TEXT_MAX] = "";
    if (self->has_desc)
        shmref_desc_to_text(&self->desc, text, sizeof(text));
    return PyUnicode_FromFormat("<shmref.Buffer %s of %zu bytes%s%s%s%s%s>",
                                self->lease ? "lease" : "acquired", self->size,
                                self->has_desc ? " " : "", text,
                                self->lease ? (self->published ? ", published" : ", writable") : "",
                                self->released ? ", released (when its last view goes)" : "",
                                self->buf ? "" : ", gone");
}

static PyObject *Buffer_get_ref(BufferObject *self, void *c)
{
    (void)c;
    if (!self->has_desc)
        Py_RETURN_NONE;
    return ref_new(&self->desc);
}

static PyObject *Buffer_get_nbytes(BufferObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(self->size);
}

static PyObject *Buffer_get_flag(BufferObject *self, void *c)
{
    const char *which = c;
    bool v = which[0] == 'l' ? self->lease : which[0] == 'p' ? self->published : self->released;
    return PyBool_FromLong(v);
}

static PyObject *Buffer_get_exports(BufferObject *self, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(self->exports);
}

static PyGetSetDef Buffer_getset[] = {
    { "ref", (getter)Buffer_get_ref, NULL, "The descriptor once published or acquired, else None.", NULL },
    { "nbytes", (getter)Buffer_get_nbytes, NULL, "The usable bytes of the buffer.", NULL },
    { "lease", (getter)Buffer_get_flag, NULL, "Whether this is a lease (a producer's buffer).", "lease" },
    { "published", (getter)Buffer_get_flag, NULL, "Whether the lease has been published.", "published" },
    { "released", (getter)Buffer_get_flag, NULL, "Whether release() was asked.", "released" },
    { "exports", (getter)Buffer_get_exports, NULL, "Live buffer-protocol exports (memoryviews).", NULL },
    { NULL }
};

PyTypeObject Buffer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmref.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The owner of one shmref buffer: the .base of the arrays shmref hands out. It keeps "
              "the mapping (and the daemon's reference) while any view of it exists, exports its "
              "bytes through the buffer protocol (read-only once published, and for acquired "
              "buffers), and releases when the last view is gone. Not created directly.",
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_repr = (reprfunc)Buffer_repr,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_getset = Buffer_getset,
};
