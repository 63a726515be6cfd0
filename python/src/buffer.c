/* SPDX-License-Identifier: MIT */
/* buffer.c: the owner object behind every array shmref hands out. It holds the C
 * buffer handle and a reference to the connection, exports its bytes (read-only unless
 * it is a lease not yet published) and drops the daemon's reference when the last view
 * of it is gone, or at Client.release when nothing else uses it: numpy arrays keep it as
 * their .base, memoryviews count exports. Publishing freezes it (buffer_freeze): the
 * writable views of shmref's array type are remembered for that, and writable exports
 * counted, since neither can be found afterwards. */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL shmrefpy_ARRAY_API
#include "buffer.h"

#include "ref.h"

#include <numpy/arrayobject.h>
/* numpy 1.x (Debian 12: 1.24) has no accessor: the field is public there. (numpy 2's
 * accessor is an inline function, not a macro: hence the ABI version test.) */
#if NPY_ABI_VERSION < 0x02000000
#define PyDataType_ELSIZE(descr) ((descr)->elsize)
#endif

static PyObject *array_type; /* shmref.SharedArray, set at import */

int buffer_set_array_type(PyObject *type)
{
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyArray_Type)) {
        PyErr_SetString(PyExc_TypeError, "expected a subclass of numpy.ndarray");
        return -1;
    }
    /* Its views remember their buffer (to be frozen at publish), its buffer exports are
     * counted: a C method as __array_finalize__, numpy's buffer slots wrapped. */
    static PyMethodDef finalize = { "__array_finalize__", (PyCFunction)buffer_array_finalize, METH_O,
                                    "Remembers a writable view of a lease, which publishing makes read-only." };
    PyObject *d = PyDescr_NewMethod((PyTypeObject *)type, &finalize);
    int r = d ? PyObject_SetAttrString(type, "__array_finalize__", d) : -1;
    Py_XDECREF(d);
    if (r < 0 || buffer_track_exports((PyTypeObject *)type) < 0)
        return -1;
    Py_INCREF(type);
    Py_XSETREF(array_type, type);
    return 0;
}

BufferObject *buffer_new(ConnObject *conn, shmref_buf *buf, bool lease)
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
    b->published = b->frozen = b->released = b->has_desc = false;
    b->private_ = shmref_buf_private(buf) == 1; /* its own copy-on-write mapping: writable */
    b->layout = NULL;
    b->user = NULL;
    b->exports = b->exports_rw = 0;
    b->views = NULL;
    b->views_prune = 0;
    return b;
}

/* give_up: the daemon's reference goes (one-way). */
static void give_up(BufferObject *self)
{
    shmref_buf *buf = self->buf;
    if (!buf)
        return;
    self->buf = NULL;
    self->released = true;
    conn_release_buf(self->conn, buf);
}

static void Buffer_dealloc(BufferObject *self)
{
    give_up(self);
    Py_XDECREF(self->conn);
    PyMem_Free(self->layout);
    Py_XDECREF(self->user);
    Py_XDECREF(self->views);
    PyObject_Free(self);
}

static bool writable(BufferObject *self)
{
    return self->buf && (self->private_ || (self->lease && !self->published && !self->frozen));
}

/* weak_get: the object a weak reference refers to (new reference), or NULL when gone. */
static PyObject *weak_get(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o = NULL;
    if (PyWeakref_GetRef(ref, &o) < 0)
        PyErr_Clear();
    return o;
#else
    PyObject *o = PyWeakref_GetObject(ref);
    if (o == Py_None)
        return NULL;
    Py_INCREF(o);
    return o;
#endif
}

/* freeze_views: every live view remembered by buffer_array_finalize read-only. */
static void freeze_views(BufferObject *owner)
{
    PyObject *views = owner->views;
    owner->views = NULL;
    if (!views)
        return;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(views); i++) {
        PyObject *v = weak_get(PyList_GET_ITEM(views, i));
        if (v && PyArray_Check(v))
            PyArray_CLEARFLAGS((PyArrayObject *)v, NPY_ARRAY_WRITEABLE);
        Py_XDECREF(v);
    }
    Py_DECREF(views);
}

int buffer_freeze(BufferObject *owner, PyObject *array)
{
    if (owner->exports_rw > 0) {
        /* numpy's arrays can be told read-only; a memoryview (or a ctypes from_buffer) holds its own writable Py_buffer, which nothing can take back:
         * mmap's rule ("cannot close exported pointers exist"). */
        PyErr_Format(PyExc_BufferError,
                     "cannot publish: the buffer (%zu bytes) has %zd writable export(s) (memoryviews "
                     "or ctypes from_buffer views made before publishing), which cannot be made "
                     "read-only; release them first (memoryview.release(), or drop them)",
                     owner->size, owner->exports_rw);
        return -1;
    }
    for (int i = 0; array && PyArray_Check(array) && i < 64; i++) {
        PyArray_CLEARFLAGS((PyArrayObject *)array, NPY_ARRAY_WRITEABLE);
        array = PyArray_BASE((PyArrayObject *)array);
    }
    if (owner->frozen || !owner->lease)
        return 0;
    owner->frozen = true;
    freeze_views(owner);
    return 0;
}

/* track: remember v, a writable view of owner's bytes, weakly; dead references are
 * dropped whenever the list has doubled since the last look. */
static int track(BufferObject *owner, PyObject *v)
{
    if (!owner->views && !(owner->views = PyList_New(0)))
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(owner->views);
    if (n >= 16 && n >= owner->views_prune) {
        PyObject *alive = PyList_New(0);
        if (!alive)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *w = PyList_GET_ITEM(owner->views, i), *o = weak_get(w);
            if (o && PyList_Append(alive, w) < 0) {
                Py_DECREF(o);
                Py_DECREF(alive);
                return -1;
            }
            Py_XDECREF(o);
        }
        Py_SETREF(owner->views, alive);
        owner->views_prune = 2 * PyList_GET_SIZE(alive);
    }
    PyObject *w = PyWeakref_NewRef(v, NULL);
    if (!w)
        return -1;
    int r = PyList_Append(owner->views, w);
    Py_DECREF(w);
    return r;
}

PyObject *buffer_array_finalize(PyObject *self, PyObject *obj)
{
    if (!PyArray_Check(self) || !PyArray_ISWRITEABLE((PyArrayObject *)self))
        Py_RETURN_NONE;
    BufferObject *owner = buffer_of(self);
    if (!owner && obj && obj != Py_None)
        owner = buffer_of(obj);
    if (!owner || !writable(owner))
        Py_RETURN_NONE;
    /* A view of the buffer's bytes, not a new array made like obj (empty_like, copy). */
    char *p = PyArray_DATA((PyArrayObject *)self);
    if (p < owner->data || p >= owner->data + owner->size)
        Py_RETURN_NONE;
    if (track(owner, self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* numpy's buffer slots, which the tracked type's wrap. */
static getbufferproc np_getbuffer;
static releasebufferproc np_releasebuffer;

static int tracked_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    if (np_getbuffer(self, view, flags) < 0)
        return -1;
    BufferObject *owner = view->readonly ? NULL : buffer_of(self);
    if (owner)
        owner->exports_rw++;
    return 0;
}

static void tracked_releasebuffer(PyObject *self, Py_buffer *view)
{
    BufferObject *owner = view->readonly ? NULL : buffer_of(self);
    if (owner)
        owner->exports_rw--;
    if (np_releasebuffer)
        np_releasebuffer(self, view);
}

int buffer_track_exports(PyTypeObject *type)
{
    PyBufferProcs *pb = type->tp_as_buffer;
    if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || !pb || pb == PyArray_Type.tp_as_buffer) {
        PyErr_SetString(PyExc_TypeError, "expected a heap subclass of numpy.ndarray");
        return -1;
    }
    if (pb->bf_getbuffer == tracked_getbuffer)
        return 0;
    np_getbuffer = PyArray_Type.tp_as_buffer->bf_getbuffer;
    np_releasebuffer = PyArray_Type.tp_as_buffer->bf_releasebuffer;
    pb->bf_getbuffer = tracked_getbuffer;
    pb->bf_releasebuffer = tracked_releasebuffer;
    return 0;
}

/* The items of 0-d arrays neutered by a release point here (read as zeros). */
static _Alignas(64) const char zeros[4096];

/* neuter: a released array reads as empty: no dimension lets numpy touch the memory
 * that went back to the daemon (a 0-d array reads zeros instead). */
static void neuter(PyArrayObject *a)
{
    PyArrayObject_fields *f = (PyArrayObject_fields *)a;
    PyArray_CLEARFLAGS(a, NPY_ARRAY_WRITEABLE);
    if (f->nd == 0) {
        f->data = (char *)zeros;
        return;
    }
    for (int i = 0; i < f->nd; i++)
        f->dimensions[i] = 0;
}

int buffer_release(BufferObject *owner, PyObject *array, Py_ssize_t allowed_first)
{
    if (!owner->buf)
        return 0; /* given up already */
    /* The chain from the array passed up to the owner: the one the caller passed may be
     * held by the caller and by the call; every array between it and the owner only by
     * the view below it; the owner only by the top one. Anything more is a user of the
     * memory (a view, a memoryview, another name): memoryview.release's rule. */
    PyObject *chain[64];
    int n = 0;
    Py_ssize_t extra_views = 0;
    for (PyObject *o = array; o && o != (PyObject *)owner && n < 64;) {
        chain[n] = o;
        Py_ssize_t allowed = n == 0 ? allowed_first : 1;
        if (Py_REFCNT(o) > allowed)
            extra_views += Py_REFCNT(o) - allowed;
        if (PyArray_Check(o))
            o = PyArray_BASE((PyArrayObject *)o);
        else if (PyMemoryView_Check(o))
            o = PyMemoryView_GET_BUFFER(o)->obj;
        else
            o = NULL;
        n++;
    }
    Py_ssize_t others = Py_REFCNT(owner) - 1 - owner->exports;
    if (extra_views > 0 || owner->exports > 0 || others > 0) {
        PyErr_Format(PyExc_BufferError,
                     "cannot release: the buffer (%zu bytes) is still in use: %zd more reference(s) to the "
                     "array or the arrays it views (views of it, memoryviews, other names), %zd memoryview(s) "
                     "of the buffer, %zd other array(s) over it; drop them first (the buffer then goes "
                     "with the last of them)", owner->size, extra_views, owner->exports, others);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (PyArray_Check(chain[i]) && PyArray_NDIM((PyArrayObject *)chain[i]) == 0 &&
            PyArray_ITEMSIZE((PyArrayObject *)chain[i]) > (npy_intp)sizeof(zeros)) {
            PyErr_Format(PyExc_BufferError, "cannot release a 0-d array of %zd-byte items: drop it instead",
                         (Py_ssize_t)PyArray_ITEMSIZE((PyArrayObject *)chain[i]));
            return -1;
        }
    }
    for (int i = 0; i < n; i++)
        if (PyArray_Check(chain[i]))
            neuter((PyArrayObject *)chain[i]);
    give_up(owner);
    return 0;
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
    if (!self->buf) {
        PyErr_SetString(PyExc_BufferError, "the buffer was released");
        return -1;
    }
    int readonly = !writable(self);
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->data, (Py_ssize_t)self->size, readonly, flags) < 0)
        return -1;
    self->exports++;
    if (!readonly)
        self->exports_rw++;
    return 0;
}

static void Buffer_releasebuffer(BufferObject *self, Py_buffer *view)
{
    self->exports--;
    if (!view->readonly)
        self->exports_rw--;
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
    if (PyArray_DescrCheck(dtype)) {
        Py_INCREF(dtype);
        return (PyArray_Descr *)dtype;
    }
    if (dtype == Py_None)
        return PyArray_DescrFromType(NPY_DOUBLE); /* numpy's default, as np.empty's */
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

PyObject *buffer_descr(PyObject *dtype)
{
    return (PyObject *)descr_of(dtype);
}

/* The last type strings acquired, with their descriptors: an acquire looks its metadata's
 * string up here by its bytes (a few comparisons), not through a new str and a dict. */
#define DESCR_SLOTS 8
static struct {
    char s[SHMREF_META_DTYPE_MAX];
    PyArray_Descr *d;
} descr_slots[DESCR_SLOTS];
static unsigned descr_next;

PyObject *buffer_descr_str(const char *s)
{
    for (unsigned i = 0; i < DESCR_SLOTS && descr_slots[i].d; i++) {
        if (strcmp(descr_slots[i].s, s) == 0) {
            Py_INCREF(descr_slots[i].d);
            return (PyObject *)descr_slots[i].d;
        }
    }
    size_t n = strlen(s);
    PyObject *u = PyUnicode_FromStringAndSize(s, (Py_ssize_t)n);
    PyArray_Descr *d = u ? descr_of(u) : NULL;
    Py_XDECREF(u);
    if (d && n < SHMREF_META_DTYPE_MAX) {
        unsigned i = descr_next++ % DESCR_SLOTS;
        Py_XSETREF(descr_slots[i].d, (Py_INCREF(d), d));
        memcpy(descr_slots[i].s, s, n + 1);
    }
    return (PyObject *)d;
}

int buffer_typestr(PyObject *obj, char out[SHMREF_META_DTYPE_MAX])
{
    PyArray_Descr *d = (PyArray_Descr *)obj;
    int t = d->type_num;
    Py_ssize_t item = PyDataType_ELSIZE(d);
    /* numpy's numeric types: dtype.str is byte order, kind, item size ("<f8", "|b1"),
     * the order '|' for one-byte items and '<' or '>' for the others ('=' is native). */
    if (PyArray_DescrCheck(obj) && (PyTypeNum_ISBOOL(t) || PyTypeNum_ISINTEGER(t) || PyTypeNum_ISFLOAT(t) ||
                                    PyTypeNum_ISCOMPLEX(t)) && item > 0 && item <= 64 &&
        !PyDataType_HASFIELDS(d) && !PyDataType_HASSUBARRAY(d)) {
        char bo = d->byteorder;
        if (item == 1 || bo == '|')
            bo = '|';
        else if (bo == '=')
            bo = PY_LITTLE_ENDIAN ? '<' : '>';
        int k = 0;
        out[k++] = bo;
        out[k++] = d->kind;
        if (item >= 10)
            out[k++] = (char)('0' + item / 10);
        out[k++] = (char)('0' + item % 10);
        out[k] = 0;
        return 0;
    }
    PyObject *ts = PyObject_GetAttrString(obj, "str");
    if (!ts)
        return -1;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(ts, &n);
    if (s && n >= SHMREF_META_DTYPE_MAX) {
        PyErr_Format(PyExc_TypeError, "dtype %R: its type string is longer than %d bytes", obj,
                     SHMREF_META_DTYPE_MAX - 1);
        s = NULL;
    }
    if (s)
        memcpy(out, s, (size_t)n + 1);
    Py_DECREF(ts);
    return s ? 0 : -1;
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
    PyObject *descr = (PyObject *)descr_of(dtype);
    return descr ? buffer_array_descr(owner, descr, ndim, shape, strides, order, offset) : NULL;
}

PyObject *buffer_array_descr(BufferObject *owner, PyObject *descr_obj, int ndim, const Py_ssize_t *shape,
                             const Py_ssize_t *strides, char order, size_t offset)
{
    PyArray_Descr *descr = (PyArray_Descr *)descr_obj;
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
    if (!owner->buf) {
        Py_DECREF(descr);
        return PyErr_Format(PyExc_BufferError, "the buffer was released");
    }
    int flags = writable(owner) ? NPY_ARRAY_WRITEABLE : 0;
    PyTypeObject *type = array_type ? (PyTypeObject *)array_type : &PyArray_Type;
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
                                self->lease ? (self->published ? ", published" : writable(self) ? ", writable" : ", read-only") : "",
                                self->released ? ", released" : "", "");
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
    bool v = which[0] == 'l' ? self->lease : which[0] == 'p' ? self->published : which[0] == 'f' ? self->frozen : self->released;
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
    { "released", (getter)Buffer_get_flag, NULL, "Whether the buffer was given up (Client.release).", "released" },
    { "frozen", (getter)Buffer_get_flag, NULL, "Whether the bytes are read-only for every view (published, or a shared() copy).", "frozen" },
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
              "buffers), and releases when the last view is gone or at Client.release() when no "
              "other view exists. Publishing makes the bytes read-only for every view, the ones "
              "made before included (BufferError while a writable memoryview of it is alive). "
              "Not created directly.",
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_repr = (reprfunc)Buffer_repr,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_getset = Buffer_getset,
};
