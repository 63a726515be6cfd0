/* SPDX-License-Identifier: MIT */
/* ref.c: shmref.Ref: parse, print, hash, compare and pickle descriptors. */
#include "ref.h"

#include <string.h>

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

/* Ref_hash: FNV-1a over the token (public API only: no _Py_HashBytes). */
static Py_hash_t Ref_hash(RefObject *self)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < SHMREF_TOKEN_LEN; i++)
        h = (h ^ self->desc.token[i]) * 1099511628211ull;
    Py_hash_t r = (Py_hash_t)(h ^ self->desc.size);
    return r == -1 ? -2 : r;
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

