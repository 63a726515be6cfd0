/* SPDX-License-Identifier: MIT */
/* client.c: Conn (one libshmref connection, its lock and the releases queued while it
 * was busy) and Client (the public object: connect, empty, publish, share, acquire,
 * release, close). Every call that can wait drops the GIL and takes the Conn's lock;
 * the library's timeout bounds the wait. */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL shmrefpy_ARRAY_API
#include "client.h"

#include <numpy/arrayobject.h>
/* numpy 1.x (Debian 12: 1.24) has no accessor: the field is public there. (numpy 2's
 * accessor is an inline function, not a macro: hence the ABI version test.) */
#if NPY_ABI_VERSION < 0x02000000
#define PyDataType_ELSIZE(descr) ((descr)->elsize)
#endif
#include <unistd.h>

#define MSG_MAX SHMREFPY_MSG_MAX

/* seconds_to_ms: a duration in float seconds (the standard library's unit) as the C
 * library's milliseconds: None -> dflt, inf -> inf_ms, else rounded up, at least 1 ms for
 * anything > 0 and at most UINT32_MAX. -1 with ValueError/TypeError. */
static int seconds_to_ms(PyObject *v, const char *what, long long dflt, long long inf_ms, bool zero_ok,
                         long long *ret)
{
    if (!v || v == Py_None) {
        *ret = dflt;
        return 0;
    }
    double s = PyFloat_AsDouble(v);
    if (s == -1.0 && PyErr_Occurred())
        return -1;
    if (s != s || s < 0 || (!zero_ok && s == 0)) {
        PyErr_Format(PyExc_ValueError, "%s must be %s seconds (a float), not %R", what, zero_ok ? ">= 0" : "> 0", v);
        return -1;
    }
    if (s == Py_HUGE_VAL) {
        *ret = inf_ms;
        return 0;
    }
    double ms = s * 1000.0;
    *ret = ms >= (double)UINT32_MAX ? (long long)UINT32_MAX : (long long)ms + ((double)(long long)ms < ms);
    if (*ret == 0 && s > 0)
        *ret = 1;
    return 0;
}

/* keep_arg: keep= (float seconds) or its deprecated form keep_ms= (int milliseconds). */
static int keep_arg(PyObject *keep, PyObject *keep_ms, uint32_t *ret)
{
    long long ms = 0;
    if (keep_ms && keep_ms != Py_None) {
        if (keep && keep != Py_None) {
            PyErr_SetString(PyExc_TypeError, "give keep= (seconds) or keep_ms= (deprecated), not both");
            return -1;
        }
        if (PyErr_WarnEx(PyExc_DeprecationWarning, "keep_ms= is deprecated: use keep= in seconds (a float)", 2) < 0)
            return -1;
        ms = PyLong_AsLongLong(keep_ms);
        if (ms == -1 && PyErr_Occurred())
            return -1;
        if (ms < 0) {
            PyErr_SetString(PyExc_ValueError, "keep_ms must be >= 0");
            return -1;
        }
        *ret = ms > (long long)UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
        return 0;
    }
    if (seconds_to_ms(keep, "keep", 0, UINT32_MAX, true, &ms) < 0)
        return -1;
    *ret = (uint32_t)ms;
    return 0;
}

/* WAIT_MAX_MS: the longest a lease may wait for quota or space (shmref_lease_ex). */
#define WAIT_MAX_MS 600000

/* wait_arg: wait= (float seconds; None or 0: no wait, at most 600) as a lease's wait_ms. */
static int wait_arg(PyObject *v, uint32_t *ret)
{
    long long ms = 0;
    if (seconds_to_ms(v, "wait", 0, (long long)WAIT_MAX_MS + 1, true, &ms) < 0)
        return -1;
    if (ms > WAIT_MAX_MS) {
        PyErr_Format(PyExc_ValueError, "wait must be at most %d seconds (the daemon's bound), not %R",
                     WAIT_MAX_MS / 1000, v);
        return -1;
    }
    *ret = (uint32_t)ms;
    return 0;
}

static int max_acquires_arg(PyObject *v, uint32_t dflt, uint32_t *ret)
{
    if (!v || v == Py_None) {
        *ret = dflt;
        return 0;
    }
    long long n = PyLong_AsLongLong(v);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (n < 0 || n > (long long)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "max_acquires must be 0 (no cap) or a count up to %u", UINT32_MAX);
        return -1;
    }
    *ret = (uint32_t)n;
    return 0;
}

/* fast_args: the arguments of a METH_FASTCALL | METH_KEYWORDS method (no argument tuple
 * or keyword dict is made) into out[0..n), NULL where not given: names[i] is the keyword
 * of out[i], the first npos may come by position, the first required must come. The
 * TypeErrors say what PyArg_ParseTupleAndKeywords says. */
static int fast_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                     const char *const *names, int n, int npos, int required, PyObject **out)
{
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    if (nargs > npos) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d %sargument%s (%zd given)", fname, npos,
                     npos < n ? "positional " : "", npos == 1 ? "" : "s", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int j = 0;
        while (j < n && PyUnicode_CompareWithASCIIString(key, names[j]) != 0)
            j++;
        if (j == n) {
            PyErr_Format(PyExc_TypeError, "'%U' is an invalid keyword argument for %s()", key, fname);
            return -1;
        }
        if (out[j]) {
            PyErr_Format(PyExc_TypeError, "argument for %s() given by name ('%s') and position (%d)", fname,
                         names[j], j + 1);
            return -1;
        }
        out[j] = args[nargs + k];
    }
    for (int i = 0; i < required; i++) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", fname, names[i], i + 1);
            return -1;
        }
    }
    return 0;
}

/* ---- Client ---- */

typedef struct {
    PyObject_HEAD
    ConnObject *conn;   /* NULL once closed */
    PyObject *socket;   /* str: the path connected to */
    PyObject *shares;   /* dict: Ref -> the array share() copied into */
} ClientObject;

static ConnObject *client_conn(ClientObject *self)
{
    ConnObject *conn = self->conn;
    if (!conn) {
        PyErr_SetString(PyExc_ValueError, "shmref.Client is closed");
        return NULL;
    }
    if (conn_forked(conn) < 0)
        return NULL;
    Py_INCREF(conn);
    return conn;
}

static PyObject *Client_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args, (void)kw;
    ClientObject *self = (ClientObject *)type->tp_alloc(type, 0);
    if (self && !(self->shares = PyDict_New()))
        Py_CLEAR(self);
    return (PyObject *)self;
}

static int Client_init(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = { "socket", "timeout", "timeout_ms", NULL };
    PyObject *sock = Py_None, *timeout = Py_None, *timeout_ms = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO$O:Client", names, &sock, &timeout, &timeout_ms))
        return -1;
    if (self->conn) {
        PyErr_SetString(PyExc_RuntimeError, "Client already connected");
        return -1;
    }
    long long ms = -1;
    if (timeout_ms != Py_None) { /* the first API's milliseconds */
        if (timeout != Py_None) {
            PyErr_SetString(PyExc_TypeError, "give timeout= (seconds) or timeout_ms=, not both");
            return -1;
        }
        ms = PyLong_AsLongLong(timeout_ms);
        if (ms == -1 && PyErr_Occurred())
            return -1;
    } else if (seconds_to_ms(timeout, "timeout", -1, 0, false, &ms) < 0) {
        return -1;
    }
    if (ms > INT32_MAX)
        ms = INT32_MAX;
    PyObject *path = NULL;
    if (sock == Py_None) {
        PyObject *m = PyImport_ImportModule("shmref._shmref");
        path = m ? PyObject_CallMethod(m, "default_socket", NULL) : NULL;
        Py_XDECREF(m);
    } else {
        PyObject *b = PyOS_FSPath(sock);
        path = b && PyBytes_Check(b) ? PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(b)) : b;
        if (b && path != b)
            Py_DECREF(b);
    }
    if (!path || !PyUnicode_Check(path)) {
        Py_XDECREF(path);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "socket must be a path");
        return -1;
    }
    /* No socket named: libshmref's default, which may start a private daemon. */
    ConnObject *conn = conn_new(path, (int)ms, sock != Py_None);
    if (!conn) {
        Py_DECREF(path);
        return -1;
    }
    self->conn = conn;
    if (sock == Py_None) { /* the socket that answered: the default, or the private daemon's */
        char got[4096];
        PyObject *reached = shmref_conn_socket(conn->c, got, sizeof(got)) >= 0 ? PyUnicode_DecodeFSDefault(got) : NULL;
        if (reached) {
            Py_DECREF(path);
            path = reached;
        }
        PyErr_Clear();
    }
    Py_XSETREF(self->socket, path);
    return 0;
}

static void Client_dealloc(ClientObject *self)
{
    Py_XDECREF(self->shares);
    Py_XDECREF(self->conn);
    Py_XDECREF(self->socket);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The descriptor of an array-valued argument (None: float64; type strings cached). */
static int parse_dtype_order(PyObject *dtype, const char *order, PyArray_Descr **ret)
{
    if (order[0] != 'C' && order[0] != 'F') {
        PyErr_SetString(PyExc_ValueError, "order must be 'C' or 'F'");
        return -1;
    }
    if (!(*ret = (PyArray_Descr *)buffer_descr(dtype)))
        return -1;
    if (PyDataType_REFCHK(*ret) || PyDataType_HASFIELDS(*ret) || PyDataType_HASSUBARRAY(*ret)) {
        PyErr_Format(PyExc_TypeError, "dtype %R cannot be described in shmref's metadata "
                     "(objects, fields and subarrays are not)", (PyObject *)*ret);
        Py_DECREF(*ret);
        return -1;
    }
    return 0;
}

/* client_call: fn(c, arg) on the client's connection, taken, with the GIL released (other
 * threads' calls queue on its lock); a failure raises what fn returned, with the library's
 * message. 0, or -1 with the error set. */
static int client_call(ClientObject *self, int (*fn)(shmref_conn *c, void *arg), void *arg)
{
    ConnObject *conn = client_conn(self);
    if (!conn)
        return -1;
    char msg[MSG_MAX] = "";
    int r;
    Py_BEGIN_ALLOW_THREADS
    conn_lock_nogil(conn);
    r = fn(conn->c, arg);
    if (r < 0)
        snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
    conn_unlock_nogil(conn);
    Py_END_ALLOW_THREADS
    Py_DECREF(conn);
    if (r < 0) {
        shmrefpy_raise(r, msg);
        return -1;
    }
    return 0;
}

/* layout_new: the metadata of an array (descr, shape, order) kept with its lease, for a
 * by-reference pickle that publishes it (_publish_buffer). NULL with the error set. */
static shmref_meta_array *layout_new(PyArray_Descr *descr, int ndim, const Py_ssize_t *shape, char order)
{
    shmref_meta_array *layout = PyMem_Malloc(sizeof(*layout));
    if (!layout) {
        PyErr_NoMemory();
        return NULL;
    }
    if (buffer_typestr((PyObject *)descr, layout->dtype) < 0) {
        PyMem_Free(layout);
        return NULL;
    }
    layout->ndim = (uint32_t)ndim;
    for (int i = 0; i < ndim; i++)
        layout->shape[i] = (uint64_t)shape[i];
    layout->order = order;
    layout->offset = 0;
    layout->user_kind = SHMREF_META_USER_NONE;
    layout->user = NULL;
    layout->user_len = 0;
    return layout;
}

/* lease_wrap: the writable array (descr, shape, order) over the fresh lease buf, which it
 * owns from here (released on failure), with its layout. New reference, or NULL. */
static PyObject *lease_wrap(ConnObject *conn, shmref_buf *buf, PyArray_Descr *descr, int ndim, const Py_ssize_t *shape,
                            char order)
{
    shmref_meta_array *layout = layout_new(descr, ndim, shape, order);
    if (!layout) {
        conn_release_buf(conn, buf);
        return NULL;
    }
    BufferObject *owner = buffer_new(conn, buf, true);
    if (!owner) {
        PyMem_Free(layout);
        return NULL;
    }
    owner->layout = layout;
    Py_INCREF(descr);
    PyObject *arr = buffer_array_descr(owner, (PyObject *)descr, ndim, shape, NULL, order, 0);
    Py_DECREF(owner);
    return arr;
}

/* lease_array: a writable array of the given layout over a fresh lease, which may wait
 * wait_ms for quota or pool space (the GIL released meanwhile); what: the caller's name,
 * for the TimeoutError of such a wait. */
static PyObject *lease_array(ClientObject *self, ConnObject *conn, PyArray_Descr *descr, int ndim,
                             const npy_intp *dims, char order, uint32_t wait_ms, const char *what)
{
    (void)self;
    size_t n = (size_t)PyDataType_ELSIZE(descr);
    Py_ssize_t shape[SHMREF_META_MAX_DIMS];
    if (ndim > SHMREF_META_MAX_DIMS)
        return PyErr_Format(PyExc_ValueError, "%d dimensions: at most %d", ndim, SHMREF_META_MAX_DIMS);
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < 0)
            return PyErr_Format(PyExc_ValueError, "negative dimension %zd", (Py_ssize_t)dims[i]);
        shape[i] = dims[i];
        if (dims[i] && n > SIZE_MAX / (size_t)dims[i])
            return PyErr_Format(PyExc_ValueError, "array too large");
        n *= (size_t)dims[i];
    }
    shmref_buf *buf = NULL;
    char msg[MSG_MAX];
    msg[0] = 0;
    int r;
    Py_BEGIN_ALLOW_THREADS
    conn_lock_nogil(conn);
    r = shmref_lease_ex(conn->c, n ? n : 1, 0, wait_ms, &buf);
    if (r < 0)
        snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
    conn_unlock_nogil(conn);
    Py_END_ALLOW_THREADS
    if (r < 0)
        return shmrefpy_raise_wait(r, what, wait_ms, msg);
    return lease_wrap(conn, buf, descr, ndim, shape, order);
}

struct lease_many_args {
    const size_t *sizes;
    size_t n;
    shmref_buf **bufs;
};

static int do_lease_many(shmref_conn *c, void *arg)
{
    struct lease_many_args *a = arg;
    return shmref_lease_many(c, a->sizes, a->n, a->bufs);
}

/* empty_many(sizes): a 1-D uint8 array of each length, over leases made in one batch
 * (shmref_lease_many: up to 32 leases a message, every message sent before the first
 * answer is awaited): one round trip where empty() makes one each. All or nothing. */
static PyObject *Client_empty_many(ClientObject *self, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "empty_many() takes a sequence of sizes");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    size_t *sizes = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(*sizes));
    shmref_buf **bufs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*bufs));
    PyObject *out = NULL;
    PyArray_Descr *u8 = PyArray_DescrFromType(NPY_UINT8);
    if (!sizes || !bufs || !u8) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t v = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred())
            goto done;
        if (v < 0) {
            PyErr_Format(PyExc_ValueError, "empty_many(): size %zd is negative", v);
            goto done;
        }
        sizes[i] = v ? (size_t)v : 1;
    }
    struct lease_many_args a = { sizes, (size_t)n, bufs };
    if (n && client_call(self, do_lease_many, &a) < 0)
        goto done;
    ConnObject *conn = client_conn(self);
    if (!conn)
        goto done;
    out = PyList_New(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        shmref_buf *b = bufs[i];
        bufs[i] = NULL;
        Py_ssize_t len = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        PyObject *arr = out ? lease_wrap(conn, b, u8, 1, &len, 'C') : NULL;
        if (!out || !arr) {
            if (!out && b)
                conn_release_buf(conn, b);
            for (Py_ssize_t j = i + 1; j < n; j++) /* the rest go back too: all or nothing */
                conn_release_buf(conn, bufs[j]), bufs[j] = NULL;
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, arr);
    }
    Py_DECREF(conn);
done:
    Py_XDECREF(u8);
    PyMem_Free(sizes);
    PyMem_Free(bufs);
    Py_DECREF(seq);
    return out;
}

static PyObject *Client_empty(ClientObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = { "shape", "dtype", "order", "wait" };
    PyObject *v[4];
    uint32_t wait_ms;
    if (fast_args("empty", args, nargs, kwnames, names, 4, 3, 1, v) < 0 || wait_arg(v[3], &wait_ms) < 0)
        return NULL;
    const char *order = "C";
    if (v[2]) {
        Py_ssize_t len;
        if (!PyUnicode_Check(v[2])) {
            return PyErr_Format(PyExc_TypeError, "empty() argument 3 must be str, not %.50s", Py_TYPE(v[2])->tp_name);
        }
        if (!(order = PyUnicode_AsUTF8AndSize(v[2], &len)))
            return NULL;
        if ((size_t)len != strlen(order)) {
            PyErr_SetString(PyExc_ValueError, "embedded null character");
            return NULL;
        }
    }
    /* An int shape (the common case) without numpy's converter and its allocation. */
    npy_intp one;
    PyArray_Dims dims = { NULL, 0 };
    npy_intp *dp = NULL;
    int nd = -1;
    if (PyLong_CheckExact(v[0])) {
        one = PyLong_AsSsize_t(v[0]);
        if (one == -1 && PyErr_Occurred())
            PyErr_Clear(); /* numpy's converter says what is wrong */
        else
            dp = &one, nd = 1;
    }
    if (nd < 0) {
        if (!PyArray_IntpConverter(v[0], &dims))
            return NULL;
        dp = dims.ptr;
        nd = dims.len;
    }
    PyArray_Descr *descr;
    PyObject *res = NULL;
    if (parse_dtype_order(v[1] ? v[1] : Py_None, order, &descr) == 0) {
        ConnObject *conn = client_conn(self);
        if (conn) {
            res = lease_array(self, conn, descr, nd, dp, order[0], wait_ms, "empty");
            Py_DECREF(conn);
        }
        Py_DECREF(descr);
    }
    if (dims.ptr)
        PyDimMem_FREE(dims.ptr);
    return res;
}

/* publish_array: publish the lease behind arr, which must be contiguous. */
static PyObject *publish_array(ClientObject *self, PyObject *obj, uint32_t keep, uint32_t max_acquires,
                               PyObject *user, PyObject *raw)
{
    if (!PyArray_Check(obj))
        return PyErr_Format(PyExc_TypeError, "publish takes a numpy array from Client.empty(), not %.100s",
                            Py_TYPE(obj)->tp_name);
    PyArrayObject *arr = (PyArrayObject *)obj;
    BufferObject *owner = buffer_of(obj);
    if (!owner || !owner->lease || owner->conn != self->conn)
        return PyErr_Format(PyExc_ValueError, "publish takes an array from this client's empty(); "
                            "share() copies any array");
    if (owner->published) {
        char text[SHMREF_DESC_TEXT_MAX];
        shmref_desc_to_text(&owner->desc, text, sizeof(text));
        return PyErr_Format(PyExc_ValueError, "this buffer is already published as %s", text);
    }
    char order;
    int ndim = PyArray_NDIM(arr);
    if (PyArray_IS_C_CONTIGUOUS(arr))
        order = 'C';
    else if (PyArray_IS_F_CONTIGUOUS(arr))
        order = 'F';
    else
        return PyErr_Format(PyExc_ValueError, "publish needs an array contiguous in C or F order; "
                            "share() copies any array");
    if (user != Py_None && !PyObject_CheckBuffer(user))
        return PyErr_Format(PyExc_TypeError, "meta must be bytes-like, not %.100s", Py_TYPE(user)->tp_name);
    size_t offset = (size_t)((char *)PyArray_DATA(arr) - owner->data);
    size_t len = offset + (size_t)PyArray_NBYTES(arr);
    shmref_meta_array m = { .order = order, .offset = offset, .ndim = (uint32_t)ndim };
    if (buffer_typestr((PyObject *)PyArray_DESCR(arr), m.dtype) < 0)
        return NULL;
    for (int i = 0; i < ndim; i++)
        m.shape[i] = (uint64_t)PyArray_DIM(arr, i);
    Py_buffer ub = { 0 };
    if (user != Py_None) {
        if (PyObject_GetBuffer(user, &ub, PyBUF_SIMPLE) < 0)
            return NULL;
        m.user_kind = SHMREF_META_USER_BIN;
        m.user = ub.buf;
        m.user_len = (size_t)ub.len;
    }
    char meta[SHMREF_META_MAX];
    const char *why = "";
    int mlen = shmref_meta_array_encode(&m, meta, sizeof(meta), &why);
    if (user != Py_None)
        PyBuffer_Release(&ub);
    if (raw) { /* _publish_raw: the caller's bytes, whatever they say */
        if (PyBytes_GET_SIZE(raw) > SHMREF_META_MAX)
            return PyErr_Format(PyExc_ValueError, "metadata of %zd bytes: at most %d", PyBytes_GET_SIZE(raw),
                                SHMREF_META_MAX);
        mlen = (int)PyBytes_GET_SIZE(raw);
        memcpy(meta, PyBytes_AS_STRING(raw), (size_t)mlen);
    }
    if (mlen < 0)
        return mlen == -EMSGSIZE
                   ? PyErr_Format(PyExc_ValueError, "array metadata: %s (at most %d bytes with meta)", why, SHMREF_META_MAX)
                   : PyErr_Format(PyExc_TypeError, "array metadata: %s", why);
    ConnObject *conn = client_conn(self);
    if (!conn)
        return NULL;
    shmref_desc d;
    char msg[MSG_MAX];
    msg[0] = 0;
    int r;
    if (len == 0)
        len = 1; /* an empty array still names a buffer; its metadata says 0 elements */
    /* The bytes are read-only for every view before anyone else can read them. */
    if (buffer_freeze(owner, obj) < 0) {
        Py_DECREF(conn);
        return NULL;
    }
    if (!max_acquires && conn_trylock(conn)) {
        /* A plain publish is one-way and never waits (a request the socket cannot take
         * is queued): with the connection free it runs with the GIL held. */
        r = shmref_publish(owner->buf, len, keep, meta, (size_t)mlen, &d);
        if (r < 0)
            snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
        conn_unlock_nogil(conn);
    } else {
        Py_BEGIN_ALLOW_THREADS
        conn_lock_nogil(conn);
        r = max_acquires ? shmref_publish_ex(owner->buf, len, keep, max_acquires, 0, meta, (size_t)mlen, &d)
                         : shmref_publish(owner->buf, len, keep, meta, (size_t)mlen, &d); /* one-way */
        if (r < 0)
            snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
        conn_unlock_nogil(conn);
        Py_END_ALLOW_THREADS
    }
    Py_DECREF(conn);
    if (r < 0)
        return shmrefpy_raise(r, msg);
    owner->published = true;
    owner->has_desc = true;
    owner->desc = d;
    if (user != Py_None)
        Py_XSETREF(owner->user, PyBytes_FromObject(user));
    return ref_new(&d);
}

static PyObject *Client_publish(ClientObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = { "array", "keep", "max_acquires", "meta", "keep_ms" };
    PyObject *v[5];
    if (fast_args("publish", args, nargs, kwnames, names, 5, 1, 1, v) < 0)
        return NULL;
    uint32_t k, n;
    if (keep_arg(v[1], v[4], &k) < 0 || max_acquires_arg(v[2], 0, &n) < 0)
        return NULL;
    return publish_array(self, v[0], k, n, v[3] ? v[3] : Py_None, NULL);
}

/* _publish_raw(array, meta, keep=0.0): publish with metadata bytes given as they are
 * (another convention, or, in tests, a hostile producer). */
static PyObject *Client_publish_raw(ClientObject *self, PyObject *args)
{
    PyObject *arr, *raw, *keep = NULL;
    if (!PyArg_ParseTuple(args, "OO!|O:_publish_raw", &arr, &PyBytes_Type, &raw, &keep))
        return NULL;
    uint32_t k;
    if (keep_arg(keep, NULL, &k) < 0)
        return NULL;
    return publish_array(self, arr, k, 0, Py_None, raw);
}

static PyObject *Client_share(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = { "obj", "keep", "max_acquires", "meta", "keep_ms", "wait", NULL };
    PyObject *obj, *meta = Py_None, *keep = NULL, *keep_ms = NULL, *maxa = NULL, *wait = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OOOOO:share", names, &obj, &keep, &maxa, &meta, &keep_ms, &wait))
        return NULL;
    uint32_t k, n, wait_ms;
    if (keep_arg(keep, keep_ms, &k) < 0 || max_acquires_arg(maxa, 1, &n) < 0 || wait_arg(wait, &wait_ms) < 0)
        return NULL;
    PyObject *src;
    if (PyArray_Check(obj)) {
        Py_INCREF(obj);
        src = obj;
    } else if (PyObject_CheckBuffer(obj)) { /* bytes, bytearray, memoryview: their own format */
        PyObject *mv = PyMemoryView_FromObject(obj);
        src = mv ? PyArray_FromAny(mv, NULL, 0, 0, 0, NULL) : NULL;
        Py_XDECREF(mv);
    } else { /* torch tensors and the like: through __array__ / __array_interface__ */
        src = PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
    }
    if (!src)
        return NULL;
    PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)src);
    PyObject *res = NULL, *dst = NULL;
    if (PyDataType_REFCHK(descr) || PyDataType_HASFIELDS(descr) || PyDataType_HASSUBARRAY(descr)) {
        PyErr_Format(PyExc_TypeError, "dtype %R cannot be described in shmref's metadata", (PyObject *)descr);
        goto done;
    }
    ConnObject *conn = client_conn(self);
    if (!conn)
        goto done;
    dst = lease_array(self, conn, descr, PyArray_NDIM((PyArrayObject *)src), PyArray_DIMS((PyArrayObject *)src), 'C',
                      wait_ms, "share");
    Py_DECREF(conn);
    if (!dst || PyArray_CopyInto((PyArrayObject *)dst, (PyArrayObject *)src) < 0)
        goto done;
    res = publish_array(self, dst, k, n, meta, NULL);
    if (res && PyDict_SetItem(self->shares, res, dst) < 0)
        Py_CLEAR(res);
done:
    Py_XDECREF(dst);
    Py_DECREF(src);
    return res;
}

/* acquire: the buffer (owner) and its array metadata (0, or -ENOMSG: opaque). */
static BufferObject *acquire(ClientObject *self, PyObject *refobj, unsigned flags, shmref_meta_array *m,
                            int *ret_meta)
{
    shmref_desc d;
    if (ref_parse(refobj, &d) < 0)
        return NULL;
    ConnObject *conn = client_conn(self);
    if (!conn)
        return NULL;
    shmref_buf *buf = NULL;
    char msg[MSG_MAX];
    msg[0] = 0;
    int r, mr = 0;
    Py_BEGIN_ALLOW_THREADS
    conn_lock_nogil(conn);
    r = shmref_acquire_ex(conn->c, &d, flags, &buf);
    if (r < 0)
        snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
    else if ((mr = shmref_buf_meta_array(buf, m)) < 0 && mr != -ENOMSG)
        snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
    conn_unlock_nogil(conn);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        Py_DECREF(conn);
        return (BufferObject *)shmrefpy_raise(r, msg);
    }
    BufferObject *owner = buffer_new(conn, buf, false);
    Py_DECREF(conn);
    if (!owner)
        return NULL;
    owner->has_desc = true;
    owner->desc = d;
    if (mr < 0 && mr != -ENOMSG) {
        Py_DECREF(owner);
        PyErr_Format(PyExc_ValueError, "%s", msg);
        return NULL;
    }
    size_t ml = 0;
    const void *raw = shmref_buf_meta(buf, &ml);
    if (mr == 0 && m->user_kind)
        owner->user = PyBytes_FromStringAndSize(m->user, (Py_ssize_t)m->user_len);
    else if (mr == -ENOMSG && ml)
        owner->user = PyBytes_FromStringAndSize(raw, (Py_ssize_t)ml); /* opaque: all of it */
    if ((mr == 0 && m->user_kind) || (mr == -ENOMSG && ml)) {
        if (!owner->user) {
            Py_DECREF(owner);
            return NULL;
        }
    }
    *ret_meta = mr;
    return owner;
}

static PyObject *Client_acquire(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = { "ref", "private", NULL };
    PyObject *ref;
    int priv = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$p:acquire", names, &ref, &priv))
        return NULL;
    shmref_meta_array m;
    int mr = 0;
    BufferObject *owner = acquire(self, ref, priv ? SHMREF_ACQUIRE_PRIVATE : 0, &m, &mr);
    if (!owner)
        return NULL;
    PyObject *arr;
    if (mr == 0) {
        Py_ssize_t shape[SHMREF_META_MAX_DIMS];
        for (uint32_t i = 0; i < m.ndim; i++)
            shape[i] = m.shape[i] > (uint64_t)PY_SSIZE_T_MAX ? -1 : (Py_ssize_t)m.shape[i];
        PyObject *dt = buffer_descr_str(m.dtype);
        arr = dt ? buffer_array_descr(owner, dt, (int)m.ndim, shape, NULL, m.order, m.offset) : NULL;
    } else { /* opaque metadata: the bytes as uint8 */
        Py_ssize_t n = (Py_ssize_t)owner->size;
        arr = buffer_array_descr(owner, (PyObject *)PyArray_DescrFromType(NPY_UINT8), 1, &n, NULL, 'C', 0);
    }
    Py_DECREF(owner);
    return arr;
}

/* _acquire_view(ref, dtype, shape, strides, offset): the layout given, not the metadata's
 * (for pickles of views and for JSON whose dtype and shape are authoritative). */
static PyObject *Client_acquire_view(ClientObject *self, PyObject *args)
{
    PyObject *ref, *dtype, *shape_o, *strides_o;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "OOOOn:_acquire_view", &ref, &dtype, &shape_o, &strides_o, &offset))
        return NULL;
    Py_ssize_t shape[SHMREF_META_MAX_DIMS], strides[SHMREF_META_MAX_DIMS];
    PyObject *s1 = PySequence_Fast(shape_o, "shape must be a sequence");
    if (!s1)
        return NULL;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(s1);
    PyObject *s2 = strides_o == Py_None ? NULL : PySequence_Fast(strides_o, "strides must be a sequence");
    if ((strides_o != Py_None && !s2) || nd > SHMREF_META_MAX_DIMS || offset < 0 ||
        (s2 && PySequence_Fast_GET_SIZE(s2) != nd)) {
        Py_DECREF(s1);
        Py_XDECREF(s2);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "bad layout: shape, strides and offset do not agree");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nd; i++) {
        shape[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(s1, i));
        if (s2)
            strides[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(s2, i));
    }
    Py_DECREF(s1);
    Py_XDECREF(s2);
    if (PyErr_Occurred())
        return NULL;
    shmref_meta_array m;
    int mr = 0;
    BufferObject *owner = acquire(self, ref, 0, &m, &mr);
    if (!owner)
        return NULL;
    PyObject *arr = buffer_array(owner, dtype, (int)nd, shape, strides_o == Py_None ? NULL : strides, 'C',
                                 (size_t)offset);
    Py_DECREF(owner);
    return arr;
}

static PyObject *release(ClientObject *self, PyObject *obj, Py_ssize_t allowed)
{
    if (PyObject_TypeCheck(obj, &Ref_Type) || PyUnicode_Check(obj)) {
        shmref_desc d;
        if (ref_parse(obj, &d) < 0)
            return NULL;
        PyObject *key = ref_new(&d);
        if (!key)
            return NULL;
        PyObject *arr = PyDict_GetItemWithError(self->shares, key);
        if (!arr) {
            Py_DECREF(key);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "%R was not shared by this client (release the array instead)", obj);
            return NULL;
        }
        BufferObject *owner = buffer_of(arr);
        if (owner)
            owner->released = true;
        int r = PyDict_DelItem(self->shares, key);
        Py_DECREF(key);
        if (r < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (!PyArray_Check(obj) && !PyMemoryView_Check(obj))
        return PyErr_Format(PyExc_TypeError, "release takes an array from shmref or a Ref, not %.100s",
                            Py_TYPE(obj)->tp_name);
    BufferObject *owner = buffer_of(obj);
    if (!owner)
        return PyErr_Format(PyExc_ValueError, "not an array from shmref");
    if (owner->conn != self->conn)
        return PyErr_Format(PyExc_ValueError, "this array belongs to another client");
    if (owner->has_desc && owner->lease && PyDict_Size(self->shares) > 0) { /* a share()d copy: the client's hold goes first */
        PyObject *key = ref_new(&owner->desc);
        if (!key)
            return NULL;
        PyObject *arr = PyDict_GetItemWithError(self->shares, key);
        if (arr && buffer_of(arr) == owner && arr != obj && PyDict_DelItem(self->shares, key) < 0) {
            Py_DECREF(key);
            return NULL;
        }
        Py_DECREF(key);
        if (PyErr_Occurred())
            return NULL;
    }
    if (buffer_release(owner, obj, allowed) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Client_release(ClientObject *self, PyObject *obj)
{
    return release(self, obj, 2); /* the caller's reference and the call's */
}

/* _release(obj, allowed): release for callers that hold more references themselves
 * (the context managers of shmref's arrays). */
static PyObject *Client_release_held(ClientObject *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t allowed;
    if (!PyArg_ParseTuple(args, "On:_release", &obj, &allowed))
        return NULL;
    return release(self, obj, allowed + 1); /* + the argument tuple's */
}

static PyObject *Client_publish_batch(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = { "obj", "keep", "keep_ms", "sealed", "wait", NULL };
    PyObject *obj, *keep = NULL, *keep_ms = NULL, *wait = NULL;
    int sealed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OOpO:publish_batch", names, &obj, &keep, &keep_ms, &sealed, &wait))
        return NULL;
    uint32_t k, wait_ms;
    if (keep_arg(keep, keep_ms, &k) < 0 || wait_arg(wait, &wait_ms) < 0)
        return NULL;
    ConnObject *conn = client_conn(self);
    if (!conn)
        return NULL;
    PyObject *unit = NULL, *ref = batch_publish(conn, obj, k, sealed ? SHMREF_PUBLISH_SEALED : 0, wait_ms, &unit);
    Py_DECREF(conn);
    if (ref && PyDict_SetItem(self->shares, ref, unit) < 0)
        Py_CLEAR(ref);
    Py_XDECREF(unit);
    return ref;
}

static PyObject *Client_acquire_batch(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = { "ref", "sealed", "trust_producer", NULL };
    PyObject *ref;
    int sealed = 0, trust = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$pp:acquire_batch", names, &ref, &sealed, &trust))
        return NULL;
    unsigned flags = (sealed ? SHMREF_ACQUIRE_SEALED : 0) | (trust ? SHMREF_ACQUIRE_TRUST_PRODUCER : 0);
    ConnObject *conn = client_conn(self);
    if (!conn)
        return NULL;
    PyObject *b = batch_acquire(conn, ref, flags);
    Py_DECREF(conn);
    return b;
}

struct retain_args {
    shmref_desc d;
    uint32_t ms;
};

static int do_retain(shmref_conn *c, void *arg)
{
    struct retain_args *a = arg;
    return shmref_retain(c, &a->d, a->ms);
}

/* retain(ref, keep): shmref_retain; keep in float seconds (> 0, inf: the longest). */
static PyObject *Client_retain(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = { "ref", "keep", NULL };
    PyObject *ref, *keep;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:retain", names, &ref, &keep))
        return NULL;
    long long ms = 0;
    struct retain_args a;
    if (keep == Py_None) {
        PyErr_SetString(PyExc_TypeError, "retain needs keep= (seconds > 0)");
        return NULL;
    }
    if (seconds_to_ms(keep, "keep", 0, UINT32_MAX, false, &ms) < 0 || ref_parse(ref, &a.d) < 0)
        return NULL;
    a.ms = (uint32_t)ms;
    if (client_call(self, do_retain, &a) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int do_ping(shmref_conn *c, void *arg)
{
    (void)arg;
    return shmref_ping(c);
}

static PyObject *Client_ping(ClientObject *self, PyObject *unused)
{
    (void)unused;
    if (client_call(self, do_ping, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* set_stock: libshmref's shmref_set_stock (the lease stock's depth; 0 returns it). */
static PyObject *Client_set_stock(ClientObject *self, PyObject *arg)
{
    long depth = PyLong_AsLong(arg);
    if (depth == -1 && PyErr_Occurred())
        return NULL;
    if (depth < -1 || depth > 16)
        return PyErr_Format(PyExc_ValueError, "stock depth %ld: -1 (the default) or 0 to 16", depth);
    ConnObject *conn = client_conn(self);
    if (!conn)
        return NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    conn_lock_nogil(conn);
    r = shmref_set_stock(conn->c, (int)depth);
    conn_unlock_nogil(conn);
    Py_END_ALLOW_THREADS
    Py_DECREF(conn);
    if (r < 0)
        return shmrefpy_raise(r, "shmref_set_stock refused the depth");
    Py_RETURN_NONE;
}

static int do_status(shmref_conn *c, void *arg)
{
    return shmref_status_get(c, arg);
}

static PyObject *Client_status(ClientObject *self, PyObject *unused)
{
    (void)unused;
    shmref_status *st = NULL;
    if (client_call(self, do_status, &st) < 0)
        return NULL;
    const char *json = shmref_status_json(st);
    PyObject *text = json ? PyUnicode_FromString(json) : PyErr_NoMemory();
    shmref_status_free(st);
    if (!text)
        return NULL;
    PyObject *mod = PyImport_ImportModule("json");
    PyObject *res = mod ? PyObject_CallMethod(mod, "loads", "O", text) : NULL;
    Py_XDECREF(mod);
    Py_DECREF(text);
    return res;
}

/* return_stock: the connection's ready stock leases go back to the daemon (one-way). */
static void return_stock(void *arg)
{
    shmref_set_stock(arg, 0);
}

static PyObject *Client_close(ClientObject *self, PyObject *unused)
{
    (void)unused;
    if (self->shares)
        PyDict_Clear(self->shares);
    /* Arrays still alive keep the connection (and their mappings), not its lease stock,
     * which nobody can use once the Client is closed: it goes back now (never waiting for
     * another thread's call), not when the last array does. */
    ConnObject *conn = self->conn;
    if (conn && conn->c && conn->pid == shmrefpy_getpid())
        conn_core_run(conn->core, return_stock, conn->c);
    Py_CLEAR(self->conn);
    Py_RETURN_NONE;
}

static PyObject *Client_enter(ClientObject *self, PyObject *unused)
{
    (void)unused;
    if (!self->conn) {
        PyErr_SetString(PyExc_ValueError, "shmref.Client is closed");
        return NULL;
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *Client_exit(ClientObject *self, PyObject *args)
{
    (void)args;
    return Client_close(self, NULL);
}

static PyObject *Client_repr(ClientObject *self)
{
    if (!self->conn)
        return PyUnicode_FromFormat("<shmref.Client %R closed>", self->socket ? self->socket : Py_None);
    if (!self->conn->c || self->conn->pid != shmrefpy_getpid())
        return PyUnicode_FromFormat("<shmref.Client %R of pid %d (forked: unusable here)>", self->socket,
                                    (int)self->conn->pid);
    return PyUnicode_FromFormat("<shmref.Client %R daemon pid %d, timeout %d ms, %zd shared>", self->socket,
                                shmref_daemon_pid(self->conn->c), shmref_get_timeout(self->conn->c),
                                PyDict_Size(self->shares));
}

static PyObject *Client_get_closed(ClientObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->conn == NULL);
}

static PyObject *Client_get_socket(ClientObject *self, void *c)
{
    (void)c;
    PyObject *s = self->socket ? self->socket : Py_None;
    Py_INCREF(s);
    return s;
}

static PyObject *Client_get_daemon_pid(ClientObject *self, void *c)
{
    (void)c;
    ConnObject *conn = client_conn(self);
    if (!conn)
        return NULL;
    PyObject *r = PyLong_FromLong(shmref_daemon_pid(conn->c));
    Py_DECREF(conn);
    return r;
}

static PyObject *Client_get_timeout(ClientObject *self, void *c)
{
    (void)c;
    ConnObject *conn = client_conn(self);
    if (!conn)
        return NULL;
    int ms = shmref_get_timeout(conn->c);
    Py_DECREF(conn);
    if (ms == 0)
        return PyFloat_FromDouble(Py_HUGE_VAL);
    return PyFloat_FromDouble(ms / 1000.0);
}

static int Client_set_timeout(ClientObject *self, PyObject *v, void *c)
{
    (void)c;
    int ms = -1;
    if (v && v != Py_None) {
        double s = PyFloat_AsDouble(v);
        if (s == -1.0 && PyErr_Occurred())
            return -1;
        if (!(s > 0)) {
            PyErr_SetString(PyExc_ValueError, "timeout must be > 0 seconds, inf (no limit) or None (the default)");
            return -1;
        }
        ms = s >= 2147483.0 ? 0 : (int)(s * 1000.0 + 0.999);
        if (ms < 1 && s < 2147483.0)
            ms = 1;
    }
    ConnObject *conn = client_conn(self);
    if (!conn)
        return -1;
    Py_BEGIN_ALLOW_THREADS
    conn_lock_nogil(conn);
    shmref_set_timeout(conn->c, ms);
    conn_unlock_nogil(conn);
    Py_END_ALLOW_THREADS
    Py_DECREF(conn);
    return 0;
}

static PyObject *Client_get_shares(ClientObject *self, void *c)
{
    (void)c;
    return PyDict_Keys(self->shares);
}

static PyMethodDef Client_methods[] = {
    { "empty_many", (PyCFunction)Client_empty_many, METH_O,
      "empty_many($self, sizes, /)\n--\n\n"
      "A writable 1-D uint8 array of each length in sizes, over leases made in one batch (libshmref's "
      "shmref_lease_many: up to 32 leases a message, all sent before the first answer is awaited): one round "
      "trip where empty() makes one per lease. All or nothing: on failure no lease is kept." },
    { "empty", (PyCFunction)(void (*)(void))Client_empty, METH_FASTCALL | METH_KEYWORDS,
      "empty($self, /, shape, dtype=None, order='C', *, wait=None)\n--\n\n"
      "A writable numpy array (a shmref.SharedArray) backed by a new lease (contents unspecified). "
      "dtype None means float64. Fill it, then publish() it. wait (float seconds, at most 600; "
      "None or 0: no wait): when the uid's quota or the pool is full, wait that long for "
      "another holder's release instead of raising QuotaExceeded/PoolFull at once "
      "(backpressure: a producer slows to its consumers' pace; other threads run meanwhile); "
      "TimeoutError past it, naming the wait, with the daemon's numbers." },
    { "publish", (PyCFunction)(void (*)(void))Client_publish, METH_FASTCALL | METH_KEYWORDS,
      "publish($self, /, array, *, keep=0.0, max_acquires=0, meta=None, keep_ms=None)\n--\n\n"
      "Publishes an array from empty() (the whole array or a contiguous view of it) and returns "
      "its Ref: dtype, shape, order and offset travel in the metadata (proto/METADATA.md), meta "
      "(bytes) as its user value. The buffer becomes read-only for every view, those made "
      "before included: numpy refuses writes through the array, the arrays it views and "
      "every numpy view of them made before (slices, reshapes); a writable memoryview (or "
      "other buffer export) still alive raises BufferError, nothing published. When nothing "
      "else refers to the array, the mapping is also made read-only. keep (float seconds): the "
      "daemon keeps the buffer that long with no holder, for every consumer that comes within "
      "it, until max_acquires acquires were made (0: no cap). The producer's lease stays while "
      "the array (or any view) lives. keep_ms= (milliseconds) is a deprecated alias of keep." },
    { "_publish_raw", (PyCFunction)Client_publish_raw, METH_VARARGS,
      "_publish_raw(array, meta, keep=0.0) -> Ref: publish with these metadata bytes, as they are." },
    { "share", (PyCFunction)(void (*)(void))Client_share, METH_VARARGS | METH_KEYWORDS,
      "share($self, /, obj, *, keep=0.0, max_acquires=1, meta=None, keep_ms=None, wait=None)\n--\n\n"
      "Copies any array-like (numpy array, torch CPU tensor, bytes, any buffer) once into a "
      "lease, publishes it and returns its Ref. The client holds the copy until release(ref) or "
      "close(); after that the daemon keeps it for keep seconds, ended by the first "
      "max_acquires acquires (default 1: one consumer; 0: every consumer within keep). So a "
      "loop of share/release cannot fill a quota with buffers nobody will read. wait: as for "
      "empty(), for the copy's lease." },
    { "acquire", (PyCFunction)(void (*)(void))Client_acquire, METH_VARARGS | METH_KEYWORDS,
      "acquire($self, ref, /, *, private=False)\n--\n\n"
      "A read-only, zero-copy numpy array (a shmref.SharedArray) of a published buffer (a Ref or its text), with the "
      "producer's dtype and shape; uint8 bytes when the metadata is not shmref's. The mapping "
      "stays while the array or any view of it lives; the array cannot be made writable. private=True: a "
      "writable array over a private copy-on-write mapping (no copy until written; a page is copied at its "
      "first write, into this process only: the producer and other consumers never see the writes); "
      "OSError EOPNOTSUPP if shmrefd does not know private acquires." },
    { "retain", (PyCFunction)(void (*)(void))Client_retain, METH_VARARGS | METH_KEYWORDS,
      "retain($self, ref, keep)\n--\n\n"
      "One more acquire of retention for the published buffer ref (a Ref or its text) names, which this "
      "client holds (an array acquired or leased from it, still alive): the daemon keeps it, even after "
      "this process is gone, until one more acquire than those made so far or keep seconds from now, "
      "whichever comes first (a retention it has keeps the later deadline). Call it before handing on a "
      "descriptor you acquired if you may exit before the receiver acquires it: it returns once the "
      "retention is in place. Charged to the buffer's uid as any retention. PermissionError: another "
      "uid's buffer, or not held here; FileNotFoundError: nothing published under ref; OSError "
      "EOPNOTSUPP: the daemon does not know retain requests (an older shmrefd)." },
    { "_acquire_view", (PyCFunction)Client_acquire_view, METH_VARARGS,
      "_acquire_view(ref, dtype, shape, strides, offset) -> numpy.ndarray (private)" },
    { "release", (PyCFunction)Client_release, METH_O,
      "release($self, array_or_ref, /)\n--\n\n"
      "Gives up an array (from empty() or acquire()) now, or a Ref from share() or publish_batch() "
      "(the client's hold of it). An array: the daemon's reference is dropped at once and the "
      "array (with the arrays it is a view of) reads as empty from then on; BufferError, "
      "naming what still uses the buffer, while anything else does: a view of it, a "
      "memoryview, another array over the buffer, another name for the array (memoryview."
      "release's rule: drop them first, or let the last of them go). Releasing twice is harmless." },
    { "_release", (PyCFunction)Client_release_held, METH_VARARGS,
      "_release(array, allowed) -> None: release() for a caller holding `allowed` references (private)." },
    { "publish_batch", (PyCFunction)(void (*)(void))Client_publish_batch, METH_VARARGS | METH_KEYWORDS,
      "publish_batch($self, /, obj, *, keep=0.0, keep_ms=None, sealed=False, wait=None)\n--\n\n"
      "Copies any Arrow data (an object with __arrow_c_array__, e.g. a pyarrow RecordBatch or "
      "struct array, or __arrow_c_stream__: pyarrow Table, polars DataFrame, duckdb result, "
      "nanoarrow stream) once into one lease, as a unit of work with its manifest, publishes it "
      "and returns its Ref. The client holds the lease until release(ref) or close(); keep "
      "(seconds) as for publish(). View types (string/binary views, list views: polars' strings) are cast "
      "by pyarrow to their large forms first (one more copy; needs pyarrow). OSError(ENOTSUP) "
      "for unions and run-end encoded arrays. sealed=True seals the unit (a daemon with a memfd "
      "pool, shmrefd --memfd; OSError(EOPNOTSUPP) otherwise): nobody, its producer included, can "
      "change it any more, as consumers of another uid require. wait: as for empty(), for the "
      "unit's lease." },
    { "acquire_batch", (PyCFunction)(void (*)(void))Client_acquire_batch, METH_VARARGS | METH_KEYWORDS,
      "acquire_batch($self, /, ref, *, sealed=False, trust_producer=False)\n--\n\n"
      "A shmref.Batch of a unit published by publish_batch (or libshmref's shmref_unit_*): its "
      "manifest is checked against the buffer first (ValueError naming the array and field "
      "otherwise). The Batch gives zero-copy Arrow data through the PyCapsule interface. It "
      "shares this client's connection (any number of Batches: one connection) and keeps it, "
      "so it and its arrays outlive close(); their releases, from any thread, never wait. A unit "
      "of another uid that is not sealed is refused (PermissionError: its producer could rewrite "
      "it after the check) unless trust_producer=True; sealed=True refuses any unsealed unit." },
    { "ping", (PyCFunction)Client_ping, METH_NOARGS, "ping($self, /)\n--\n\nOne round trip to the daemon." },
    { "set_stock", (PyCFunction)Client_set_stock, METH_O,
      "set_stock($self, depth, /)\n--\n\n"
      "The depth of this connection's lease stock (libshmref's shmref_set_stock: leases of a "
      "size kept ready in the background, held and charged like any lease): 0 returns the "
      "stock and keeps none, -1 the default ($SHMREF_STOCK, else 2), at most 16." },
    { "status", (PyCFunction)Client_status, METH_NOARGS,
      "status($self, /)\n--\n\nThe daemon's status snapshot (the keys of `shmrefctl status --json`)." },
    { "close", (PyCFunction)Client_close, METH_NOARGS,
      "close($self, /)\n--\n\n"
      "Closes the client and drops what share() held. Arrays still alive keep the connection "
      "(and their buffers) until they are gone; then it closes. Never blocks: one-way "
      "messages only, whatever the daemon does (stopped, slow). Idempotent." },
    { "__enter__", (PyCFunction)Client_enter, METH_NOARGS, "Returns the client." },
    { "__exit__", (PyCFunction)Client_exit, METH_VARARGS, "Closes the client." },
    { NULL }
};

static PyGetSetDef Client_getset[] = {
    { "closed", (getter)Client_get_closed, NULL, "Whether close() was called.", NULL },
    { "socket", (getter)Client_get_socket, NULL,
      "The daemon's socket path: the one named, or with none named the one that answered (the system's "
      "default socket, or the private daemon libshmref started).", NULL },
    { "daemon_pid", (getter)Client_get_daemon_pid, NULL, "The daemon's pid, as it said in hello.", NULL },
    { "timeout", (getter)Client_get_timeout, (setter)Client_set_timeout,
      "Seconds every call may wait for the daemon (inf: no limit); set None for the default "
      "($SHMREF_TIMEOUT_MS, else 30 s).", NULL },
    { "shares", (getter)Client_get_shares, NULL, "The Refs share() holds, as a list.", NULL },
    { NULL }
};

PyTypeObject Client_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmref.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Client(socket=None, timeout=None, *, timeout_ms=None)\n--\n\n"
              "A connection to shmrefd; use shmref.connect(). Safe to share between threads "
              "(calls are serialised; the GIL is released while one waits). Bound to the process "
              "that made it: in a forked child every call raises ChildProcessError. timeout: float "
              "seconds (math.inf: no limit; None: $SHMREF_TIMEOUT_MS, else 30 s). close() and the "
              "last reference going never wait for the daemon (one-way messages; at most about a "
              "millisecond, without the GIL, for replies already on their way).",
    .tp_init = (initproc)Client_init,
    .tp_new = Client_new,
    .tp_dealloc = (destructor)Client_dealloc,
    .tp_repr = (reprfunc)Client_repr,
    .tp_methods = Client_methods,
    .tp_getset = Client_getset,
};

PyObject *client_publish_buffer(PyObject *m, PyObject *args)
{
    (void)m;
    BufferObject *owner;
    PyObject *keep;
    if (!PyArg_ParseTuple(args, "O!O:_publish_buffer", &Buffer_Type, &owner, &keep))
        return NULL;
    uint32_t keep_ms;
    if (keep_arg(keep, NULL, &keep_ms) < 0)
        return NULL;
    if (owner->has_desc)
        return ref_new(&owner->desc);
    if (!owner->lease || !owner->layout || !owner->buf)
        return PyErr_Format(PyExc_ValueError, "not an unpublished lease");
    shmref_meta_array a = *owner->layout;
    uint64_t len = 0;
    char meta[SHMREF_META_MAX];
    const char *why = "";
    int mlen = shmref_meta_array_encode(&a, meta, sizeof(meta), &why);
    if (mlen < 0 || shmref_meta_array_nbytes(&a, &len) < 0)
        return PyErr_Format(PyExc_ValueError, "array metadata: %s", why);
    ConnObject *conn = owner->conn;
    if (conn_forked(conn) < 0)
        return NULL;
    if (buffer_freeze(owner, NULL) < 0)
        return NULL;
    Py_INCREF(conn);
    shmref_desc d;
    char msg[MSG_MAX] = "";
    int r;
    Py_BEGIN_ALLOW_THREADS
    conn_lock_nogil(conn);
    /* A pickle is unpickled once: its retention ends at the first acquire (max_acquires
     * 1), as it did before retention fanned out. */
    r = shmref_publish_ex(owner->buf, len ? (size_t)len : 1, keep_ms, 1, 0, meta, (size_t)mlen, &d);
    if (r < 0)
        snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
    conn_unlock_nogil(conn);
    Py_END_ALLOW_THREADS
    Py_DECREF(conn);
    if (r < 0)
        return shmrefpy_raise(r, msg);
    owner->published = owner->has_desc = true;
    owner->desc = d;
    return ref_new(&d);
}
