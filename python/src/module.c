/* SPDX-License-Identifier: MIT */
/* module.c: shmref._shmref: errors, the Ref type, the fork hook, module setup. */
#define PY_ARRAY_UNIQUE_SYMBOL shmrefpy_ARRAY_API
#include "shmrefpy.h"

#include <numpy/arrayobject.h>
#include <unistd.h>

PyObject *shmrefpy_array_type;

int shmrefpy_init_numpy(void)
{
    import_array1(-1);
    return 0;
}

PyObject *shmrefpy_raise(int err, const char *msg)
{
    if (err < 0)
        err = -err;
    if (err == ENOMEM && (!msg || !*msg))
        return PyErr_NoMemory();
    PyObject *args = Py_BuildValue("(is)", err, msg && *msg ? msg : strerror(err));
    if (args) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

int shmrefpy_forked(ConnObject *conn)
{
    pid_t me = getpid();
    if (conn->c && me == conn->pid)
        return 0;
    PyErr_Format(PyExc_ChildProcessError,
                 "connection was opened by pid %d; this is pid %d: connect again in the child",
                 (int)conn->pid, (int)me);
    return -1;
}

/* ---- Ref ---- */

PyObject *ref_new(const shmref_desc *desc)
{
    RefObject *r = PyObject_New(RefObject, &Ref_Type);
    if (r)
        r->desc = *desc;
    return (PyObject *)r;
}

int ref_parse(PyObject *obj, shmref_desc *ret)
{
    if (PyObject_TypeCheck(obj, &Ref_Type)) {
        *ret = ((RefObject *)obj)->desc;
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        const char *s = PyUnicode_AsUTF8(obj);
        if (!s)
            return -1;
        if (shmref_desc_from_text(s, ret) < 0) {
            PyErr_Format(PyExc_ValueError, "not a shmref descriptor: %R", obj);
            return -1;
        }
        return 0;
    }
    if (PyBytes_Check(obj)) {
        if (shmref_desc_from_binary(PyBytes_AS_STRING(obj), (size_t)PyBytes_GET_SIZE(obj), ret) < 0) {
            PyErr_SetString(PyExc_ValueError, "not a binary shmref descriptor");
            return -1;
        }
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "expected a shmref.Ref or its text, not %.100s", Py_TYPE(obj)->tp_name);
    return -1;
}

static PyObject *Ref_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = { "descriptor", NULL };
    PyObject *obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:Ref", names, &obj))
        return NULL;
    RefObject *r = (RefObject *)type->tp_alloc(type, 0);
    if (r && ref_parse(obj, &r->desc) < 0)
        Py_CLEAR(r);
    return (PyObject *)r;
}

static PyObject *Ref_str(RefObject *self)
{
    char text[SHMREF_DESC_TEXT_MAX];
    shmref_desc_to_text(&self->desc, text, sizeof(text));
    return PyUnicode_FromString(text);
}

static PyObject *Ref_repr(RefObject *self)
{
    char text[SHMREF_DESC_TEXT_MAX];
    shmref_desc_to_text(&self->desc, text, sizeof(text));
    return PyUnicode_FromFormat("shmref.Ref('%s')", text);
}

static Py_hash_t Ref_hash(RefObject *self)
{
    Py_hash_t h = (Py_hash_t)_Py_HashBytes(self->desc.token, SHMREF_TOKEN_LEN) ^ (Py_hash_t)self->desc.size;
    return h == -1 ? -2 : h;
}

static PyObject *Ref_richcompare(PyObject *a, PyObject *b, int op)
{
    if (!PyObject_TypeCheck(b, &Ref_Type) || (op != Py_EQ && op != Py_NE))
        Py_RETURN_NOTIMPLEMENTED;
    shmref_desc *x = &((RefObject *)a)->desc, *y = &((RefObject *)b)->desc;
    /* in constant time: a token is a capability (no early exit at the first difference) */
    volatile unsigned diff = x->size != y->size;
    for (int i = 0; i < SHMREF_TOKEN_LEN; i++)
        diff |= (unsigned)(x->token[i] ^ y->token[i]);
    int eq = diff == 0;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyObject *Ref_reduce(RefObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *text = Ref_str(self);
    return text ? Py_BuildValue("(O(N))", (PyObject *)Py_TYPE(self), text) : NULL;
}

static PyObject *Ref_bytes(RefObject *self, PyObject *unused)
{
    (void)unused;
    char b[SHMREF_DESC_BINARY_MAX];
    int n = shmref_desc_to_binary(&self->desc, b, sizeof(b));
    return n < 0 ? shmrefpy_raise(n, "") : PyBytes_FromStringAndSize(b, n);
}

static PyObject *Ref_get_size(RefObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(self->desc.size);
}

static PyObject *Ref_get_token(RefObject *self, void *c)
{
    (void)c;
    return PyBytes_FromStringAndSize((const char *)self->desc.token, SHMREF_TOKEN_LEN);
}

static PyMethodDef Ref_methods[] = {
    { "__reduce__", (PyCFunction)Ref_reduce, METH_NOARGS, "Pickles as its text form." },
    { "__bytes__", (PyCFunction)Ref_bytes, METH_NOARGS, "The binary (msgpack) form of the descriptor." },
    { NULL }
};

static PyGetSetDef Ref_getset[] = {
    { "size", (getter)Ref_get_size, NULL, "The published size in bytes.", NULL },
    { "token", (getter)Ref_get_token, NULL, "The 16-byte capability token: whoever knows it can acquire.", NULL },
    { NULL }
};

PyTypeObject Ref_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmref.Ref",
    .tp_basicsize = sizeof(RefObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ref(descriptor)\n--\n\nA descriptor of a published buffer: a 128-bit capability token and a "
              "size. str(ref) is the text form 'shmref1:<32 hex>:<size>'; Ref(text), Ref(bytes(ref)) "
              "parse it back. Hashable, comparable, picklable (as its text). Hand it only to consumers: "
              "knowing it is what lets a process acquire the buffer.",
    .tp_new = Ref_new,
    .tp_str = (reprfunc)Ref_str,
    .tp_repr = (reprfunc)Ref_repr,
    .tp_hash = (hashfunc)Ref_hash,
    .tp_richcompare = Ref_richcompare,
    .tp_methods = Ref_methods,
    .tp_getset = Ref_getset,
};

/* ---- module ---- */

static PyObject *mod_after_fork_child(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    conn_after_fork_child();
    Py_RETURN_NONE;
}

static PyObject *mod_set_array_type(PyObject *m, PyObject *type)
{
    (void)m;
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyArray_Type)) {
        PyErr_SetString(PyExc_TypeError, "expected a subclass of numpy.ndarray");
        return NULL;
    }
    Py_INCREF(type);
    Py_XSETREF(shmrefpy_array_type, type);
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
    return Py_BuildValue("{s:O,s:N,s:n,s:n,s:O,s:O,s:O,s:O}", "buffer", (PyObject *)b, "ref", ref,
                         "offset", off, "size", (Py_ssize_t)b->size,
                         "lease", b->lease ? Py_True : Py_False,
                         "published", b->published ? Py_True : Py_False,
                         "user", b->user ? b->user : Py_None, "socket", b->socket ? b->socket : Py_None);
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

PyObject *shmrefpy_publish_buffer(PyObject *m, PyObject *args);

static PyMethodDef mod_methods[] = {
    { "_publish_buffer", shmrefpy_publish_buffer, METH_VARARGS, "Publishes a whole lease with its layout." },
    { "_after_fork_child", mod_after_fork_child, METH_NOARGS, "Closes every connection for a forked child." },
    { "_set_array_type", mod_set_array_type, METH_O, "The ndarray subclass arrays are made of." },
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
    if (shmrefpy_init_numpy() < 0)
        return NULL;
    PyTypeObject *types[] = { &Conn_Type, &Buffer_Type, &Ref_Type, &Client_Type, &Batch_Type, &Unit_Type };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&mod_def);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Ref", (PyObject *)&Ref_Type) < 0 ||
        PyModule_AddObjectRef(m, "Client", (PyObject *)&Client_Type) < 0 ||
        PyModule_AddObjectRef(m, "Buffer", (PyObject *)&Buffer_Type) < 0 ||
        PyModule_AddObjectRef(m, "Batch", (PyObject *)&Batch_Type) < 0 ||
        PyModule_AddIntConstant(m, "META_MAX", SHMREF_META_MAX) < 0 ||
        PyModule_AddIntConstant(m, "TIMEOUT_DEFAULT_MS", SHMREF_TIMEOUT_DEFAULT_MS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
