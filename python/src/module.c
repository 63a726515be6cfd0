/* SPDX-License-Identifier: MIT */
/* module.c: shmref._shmref: module setup, the metadata helpers, the fork hook. The top
 * layer: it includes every other module, none includes it. */
#define PY_ARRAY_UNIQUE_SYMBOL shmrefpy_ARRAY_API
#include "client.h"

#include <numpy/arrayobject.h>
#include <unistd.h>

static int init_numpy(void)
{
    import_array1(-1);
    return 0;
}

static PyObject *mod_after_fork_child(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    conn_after_fork_child();
    Py_RETURN_NONE;
}

static PyObject *mod_set_array_type(PyObject *m, PyObject *type)
{
    (void)m;
    if (buffer_set_array_type(type) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *mod_buffer_info(PyObject *m, PyObject *array)
{
    (void)m;
    BufferObject *b = buffer_of(array);
    if (!b)
        Py_RETURN_NONE;
    PyObject *ref = b->has_desc ? ref_new(&b->desc) : (Py_INCREF(Py_None), Py_None);
    if (!ref)
        return NULL;
    Py_ssize_t off = 0;
    if (PyArray_Check(array))
        off = (char *)PyArray_DATA((PyArrayObject *)array) - b->data;
    return Py_BuildValue("{s:O,s:N,s:n,s:n,s:O,s:O,s:O,s:O,s:O}", "buffer", (PyObject *)b, "ref", ref,
                         "offset", off, "size", (Py_ssize_t)b->size,
                         "lease", b->lease ? Py_True : Py_False,
                         "published", b->published ? Py_True : Py_False,
                         "frozen", b->frozen ? Py_True : Py_False,
                         "user", b->user ? b->user : Py_None, "socket", b->conn->socket);
}

static PyObject *mod_freeze(PyObject *m, PyObject *array)
{
    (void)m;
    BufferObject *b = buffer_of(array);
    if (!b)
        return PyErr_Format(PyExc_ValueError, "not an array from shmref");
    if (buffer_freeze(b, array) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *mod_release_array(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *array;
    Py_ssize_t allowed;
    if (!PyArg_ParseTuple(args, "On:_release_array", &array, &allowed))
        return NULL;
    BufferObject *b = buffer_of(array);
    if (!b)
        return PyErr_Format(PyExc_ValueError, "not an array from shmref");
    if (b->conn->pid != shmrefpy_getpid())
        Py_RETURN_NONE; /* a forked child leaves the parent's buffer alone */
    if (buffer_release(b, array, allowed + 1) < 0) /* + the argument tuple's */
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *mod_meta_encode(PyObject *m, PyObject *args)
{
    (void)m;
    const char *dtype, *order;
    PyObject *shape, *user = Py_None;
    unsigned long long offset = 0;
    if (!PyArg_ParseTuple(args, "sOs|KO", &dtype, &shape, &order, &offset, &user))
        return NULL;
    shmref_meta_array a = { .order = order[0], .offset = offset };
    snprintf(a.dtype, sizeof(a.dtype), "%s", dtype);
    PyObject *seq = PySequence_Fast(shape, "shape must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > SHMREF_META_MAX_DIMS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "more than %d dimensions", SHMREF_META_MAX_DIMS);
    }
    a.ndim = (uint32_t)n;
    for (Py_ssize_t i = 0; i < n; i++)
        a.shape[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
    Py_DECREF(seq);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer ub = { 0 };
    if (user != Py_None) {
        if (PyObject_GetBuffer(user, &ub, PyBUF_SIMPLE) < 0)
            return NULL;
        a.user_kind = SHMREF_META_USER_BIN;
        a.user = ub.buf;
        a.user_len = (size_t)ub.len;
    }
    char out[SHMREF_META_MAX];
    const char *why = "";
    int r = shmref_meta_array_encode(&a, out, sizeof(out), &why);
    if (user != Py_None)
        PyBuffer_Release(&ub);
    if (r < 0)
        return PyErr_Format(PyExc_ValueError, "array metadata: %s", why);
    return PyBytes_FromStringAndSize(out, r);
}

static PyObject *mod_meta_decode(PyObject *m, PyObject *arg)
{
    (void)m;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    shmref_meta_array a;
    const char *why = "";
    int r = shmref_meta_array_decode(b.buf, (size_t)b.len, &a, &why);
    PyObject *res = NULL;
    if (r == -ENOMSG) {
        res = Py_None;
        Py_INCREF(res);
    } else if (r < 0) {
        PyErr_Format(PyExc_ValueError, "array metadata: %s", why);
    } else {
        PyObject *shape = PyTuple_New(a.ndim);
        for (uint32_t i = 0; shape && i < a.ndim; i++)
            PyTuple_SET_ITEM(shape, i, PyLong_FromUnsignedLongLong(a.shape[i]));
        PyObject *user = a.user_kind ? PyBytes_FromStringAndSize(a.user, (Py_ssize_t)a.user_len)
                                     : (Py_INCREF(Py_None), Py_None);
        if (shape && user)
            res = Py_BuildValue("{s:s,s:O,s:C,s:K,s:O,s:s}", "dtype", a.dtype, "shape", shape,
                                "order", a.order, "offset", (unsigned long long)a.offset, "user", user,
                                "user_kind", a.user_kind == SHMREF_META_USER_BIN ? "bin"
                                             : a.user_kind ? "msgpack" : "none");
        Py_XDECREF(shape);
        Py_XDECREF(user);
    }
    PyBuffer_Release(&b);
    return res;
}

static PyObject *mod_default_socket(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    const char *e = getenv("SHMREFD_SOCKET");
    if (e && *e)
        return PyUnicode_FromString(e);
    e = getenv("XDG_RUNTIME_DIR");
    if (e && *e)
        return PyUnicode_FromFormat("%s/shmrefd.sock", e);
    return PyUnicode_FromString("/run/shmrefd/shmrefd.sock");
}

static PyMethodDef mod_methods[] = {
    { "_publish_buffer", client_publish_buffer, METH_VARARGS, "Publishes a whole lease with its layout." },
    { "_after_fork_child", mod_after_fork_child, METH_NOARGS, "Closes every connection for a forked child." },
    { "_set_array_type", mod_set_array_type, METH_O, "The ndarray subclass arrays are made of." },
    { "_release_array", mod_release_array, METH_VARARGS,
      "_release_array(array, allowed): Client.release for an array's own buffer (the with block)." },
    { "_freeze", mod_freeze, METH_O, "Makes an array's buffer read-only for every view (see buffer_freeze)." },
    { "_buffer_info", mod_buffer_info, METH_O, "What backs an array: a dict, or None if not shmref." },
    { "meta_encode", mod_meta_encode, METH_VARARGS,
      "meta_encode(dtype, shape, order, offset=0, user=None, /)\n--\n\n"
      "The array metadata of proto/METADATA.md (kind 'array') as msgpack bytes; user (bytes) "
      "travels as a msgpack bin." },
    { "meta_decode", mod_meta_decode, METH_O,
      "meta_decode(data, /)\n--\n\n"
      "Metadata bytes as kind 'array': a dict with dtype, shape, order, offset, user (bytes: "
      "a bin's payload, or the raw msgpack of another type) and user_kind; None when the bytes "
      "are opaque (not this convention, or another kind); ValueError when malformed." },
    { "default_socket", mod_default_socket, METH_NOARGS,
      "default_socket()\n--\n\nThe C library's default: $SHMREFD_SOCKET, else "
      "$XDG_RUNTIME_DIR/shmrefd.sock, else /run/shmrefd/shmrefd.sock." },
    { NULL }
};

static struct PyModuleDef mod_def = {
    PyModuleDef_HEAD_INIT, .m_name = "shmref._shmref",
    .m_doc = "The C half of shmref: connections, buffers and descriptors over libshmref.",
    .m_size = -1, .m_methods = mod_methods,
};

PyMODINIT_FUNC PyInit__shmref(void)
{
    if (init_numpy() < 0 || shmrefpy_pid_init() < 0)
        return NULL;
    PyTypeObject *types[] = { &Conn_Type, &Buffer_Type, &Ref_Type, &Client_Type, &Batch_Type, &Unit_Type };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&mod_def);
    if (!m)
        return NULL;
    if (errors_init(m) < 0 ||
        shmrefpy_add_object(m, "Ref", (PyObject *)&Ref_Type) < 0 ||
        shmrefpy_add_object(m, "Client", (PyObject *)&Client_Type) < 0 ||
        shmrefpy_add_object(m, "Buffer", (PyObject *)&Buffer_Type) < 0 ||
        shmrefpy_add_object(m, "Batch", (PyObject *)&Batch_Type) < 0 ||
        PyModule_AddIntConstant(m, "META_MAX", SHMREF_META_MAX) < 0 ||
        PyModule_AddIntConstant(m, "TIMEOUT_DEFAULT_MS", SHMREF_TIMEOUT_DEFAULT_MS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
