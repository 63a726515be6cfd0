/* SPDX-License-Identifier: MIT */
/* batch.c: Arrow units of work from Python. Client.publish_batch copies any object with
 * __arrow_c_array__ / __arrow_c_stream__ once into one lease (shmref_unit_import_*) and
 * publishes it; the client holds the lease in a _Unit. Client.acquire_batch gives a Batch,
 * whose capsules ("arrow_schema", "arrow_array", "arrow_array_stream") carry libshmref's
 * zero-copy exports. A Batch acquires on its Client's connection and keeps it (a Conn
 * reference): the capsules' structures release through the connection's core
 * (exports.c), so pyarrow, polars and duckdb may free them from their own threads,
 * without the GIL, while the connection serves other calls. */
#include "batch.h"

#include "exports.h"
#include "ref.h"

#include <unistd.h>

#define MSG_MAX SHMREFPY_MSG_MAX

/* ---- _Unit: a published producer unit, held by its Client ---- */

typedef struct {
    PyObject_HEAD
    ConnObject *conn;
    shmref_unit *u;
} UnitObject;

static void Unit_dealloc(UnitObject *self)
{
    if (self->u)
        conn_release_unit(self->conn, self->u);
    Py_XDECREF(self->conn);
    PyObject_Free(self);
}

PyTypeObject Unit_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmref._Unit",
    .tp_basicsize = sizeof(UnitObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The lease of a unit published by Client.publish_batch (held by the client).",
    .tp_dealloc = (destructor)Unit_dealloc,
};

/* arrow_input: the C structures behind obj's PyCapsule methods. *ret_keep owns them (the
 * capsules, whose destructors release them); either *ret_stream or both *ret_schema and
 * *ret_array are set. __arrow_c_array__ is preferred: a single batch, no callbacks. */
static int arrow_input(PyObject *obj, PyObject **ret_keep, struct ArrowSchema **ret_schema,
                       struct ArrowArray **ret_array, struct ArrowArrayStream **ret_stream)
{
    *ret_schema = NULL, *ret_array = NULL, *ret_stream = NULL;
    bool has_stream = PyObject_HasAttrString(obj, "__arrow_c_stream__");
    if (PyObject_HasAttrString(obj, "__arrow_c_array__")) {
        PyObject *t = PyObject_CallMethod(obj, "__arrow_c_array__", NULL);
        if (!t && has_stream && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear(); /* e.g. a Batch of several record batches: its stream */
            goto stream;
        }
        if (!t)
            return -1;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
            Py_DECREF(t);
            PyErr_SetString(PyExc_TypeError, "__arrow_c_array__ must return (schema capsule, array capsule)");
            return -1;
        }
        *ret_schema = PyCapsule_GetPointer(PyTuple_GET_ITEM(t, 0), "arrow_schema");
        *ret_array = *ret_schema ? PyCapsule_GetPointer(PyTuple_GET_ITEM(t, 1), "arrow_array") : NULL;
        if (!*ret_array || !(*ret_schema)->release || !(*ret_array)->release) {
            Py_DECREF(t);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "__arrow_c_array__ returned released structures");
            return -1;
        }
        *ret_keep = t;
        return 0;
    }
stream:
    if (has_stream) {
        PyObject *cap = PyObject_CallMethod(obj, "__arrow_c_stream__", NULL);
        if (!cap)
            return -1;
        *ret_stream = PyCapsule_GetPointer(cap, "arrow_array_stream");
        if (!*ret_stream || !(*ret_stream)->release) {
            Py_DECREF(cap);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "__arrow_c_stream__ returned a released stream");
            return -1;
        }
        *ret_keep = cap;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "publish_batch takes an object with __arrow_c_array__ or __arrow_c_stream__ "
                 "(pyarrow, polars, duckdb, nanoarrow ...), not %.100s", Py_TYPE(obj)->tp_name);
    return -1;
}

/* without_views: shmref._arrow.without_views(obj): a new reference, None, or NULL. */
static PyObject *without_views(PyObject *obj)
{
    PyObject *m = PyImport_ImportModule("shmref._arrow");
    PyObject *res = m ? PyObject_CallMethod(m, "without_views", "O", obj) : NULL;
    Py_XDECREF(m);
    return res;
}

PyObject *batch_publish(ConnObject *conn, PyObject *obj, uint32_t keep_ms, unsigned flags, uint32_t wait_ms,
                        PyObject **ret_unit)
{
    PyObject *keep;
    struct ArrowSchema *schema;
    struct ArrowArray *array;
    struct ArrowArrayStream *stream;
    if (arrow_input(obj, &keep, &schema, &array, &stream) < 0)
        return NULL;
    uint32_t keep32 = keep_ms;
    shmref_unit *u = NULL;
    shmref_desc d;
    char msg[MSG_MAX] = "";
    int r;
    /* Without the GIL: the copy, the lease and publish. Producers' stream callbacks that
     * need Python (pyarrow readers over Python iterators) take the GIL themselves. */
    Py_BEGIN_ALLOW_THREADS
    conn_lock_nogil(conn);
    shmref_set_lease_wait(conn->c, wait_ms); /* the unit's lease; back to none below, under the same lock */
    r = stream ? shmref_unit_import_stream(conn->c, stream, &u) : shmref_unit_import_array(conn->c, schema, array, &u);
    if (r < 0)
        snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
    shmref_set_lease_wait(conn->c, 0);
    if (r >= 0 && (r = shmref_unit_publish_ex(u, keep32, 0, flags, &d)) < 0) {
        snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
        shmref_unit_release(u);
        u = NULL;
    }
    conn_unlock_nogil(conn);
    Py_END_ALLOW_THREADS
    Py_DECREF(keep); /* the capsules release what the producer gave */
    if (r == -ENOTSUP && (strstr(msg, "format \"v") || strstr(msg, "format \"+v"))) {
        /* View types (polars' strings): cast by pyarrow when it is there, then again. */
        PyObject *plain = without_views(obj);
        if (!plain)
            return NULL;
        PyObject *ref = plain == Py_None ? NULL : batch_publish(conn, plain, keep_ms, flags, wait_ms, ret_unit);
        Py_DECREF(plain);
        if (ref || PyErr_Occurred())
            return ref;
    }
    if (r < 0)
        return shmrefpy_raise_wait(r, "publish_batch", wait_ms, msg);
    UnitObject *unit = PyObject_New(UnitObject, &Unit_Type);
    if (!unit) {
        conn_release_unit(conn, u);
        return NULL;
    }
    Py_INCREF(conn);
    unit->conn = conn;
    unit->u = u;
    PyObject *ref = ref_new(&d);
    if (!ref) {
        Py_DECREF(unit);
        return NULL;
    }
    *ret_unit = (PyObject *)unit;
    return ref;
}

/* ---- Batch: an acquired unit ---- */

typedef struct {
    PyObject_HEAD
    shmref_unit *u;     /* NULL once released */
    ConnObject *conn;   /* the Client's connection, kept while the Batch lives */
    pid_t pid;
    shmref_desc desc;
    const char *data;
    size_t size;
} BatchObject;

static int batch_live(BatchObject *self)
{
    if (!self->u) {
        PyErr_SetString(PyExc_ValueError, "shmref.Batch is released");
        return -1;
    }
    if (self->pid != shmrefpy_getpid()) {
        PyErr_Format(PyExc_ChildProcessError, "this Batch was acquired by pid %d; this is pid %d: acquire it "
                     "again in the child", (int)self->pid, (int)getpid());
        return -1;
    }
    return 0;
}

static PyObject *batch_fail(BatchObject *self, int r)
{
    return shmrefpy_raise(r, shmref_errmsg(self->conn->c));
}

PyObject *batch_acquire(ConnObject *conn, PyObject *refobj, unsigned flags)
{
    shmref_desc d;
    if (ref_parse(refobj, &d) < 0)
        return NULL;
    char msg[MSG_MAX] = "";
    shmref_unit *u = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    conn_lock_nogil(conn);
    if ((r = shmref_unit_acquire_ex(conn->c, &d, flags, &u)) < 0)
        snprintf(msg, sizeof(msg), "%s", shmref_errmsg(conn->c));
    conn_unlock_nogil(conn);
    Py_END_ALLOW_THREADS
    if (r < 0)
        return r == -EBADMSG ? PyErr_Format(PyExc_ValueError, "%s", msg) : shmrefpy_raise(r, msg);
    BatchObject *b = PyObject_New(BatchObject, &Batch_Type);
    if (!b) {
        conn_release_unit(conn, u);
        return NULL;
    }
    b->u = u;
    Py_INCREF(conn);
    b->conn = conn;
    b->pid = shmrefpy_getpid();
    b->desc = d;
    b->data = shmref_unit_data(u);
    b->size = shmref_unit_size(u);
    return (PyObject *)b;
}

static void batch_drop(BatchObject *self)
{
    shmref_unit *u = self->u;
    self->u = NULL;
    /* A forked child leaves the parent's reference alone (conn_release_unit sends
     * nothing there). One-way, never waiting; the exports keep theirs. */
    if (u)
        conn_release_unit(self->conn, u);
}

static void Batch_dealloc(BatchObject *self)
{
    batch_drop(self);
    Py_XDECREF(self->conn);
    PyObject_Free(self);
}

/* Capsule destructors: release what the consumer did not move (release set to NULL). */
static void schema_capsule_free(PyObject *cap)
{
    struct ArrowSchema *s = PyCapsule_GetPointer(cap, "arrow_schema");
    if (s && s->release)
        s->release(s);
    free(s);
}

static void array_capsule_free(PyObject *cap)
{
    struct ArrowArray *a = PyCapsule_GetPointer(cap, "arrow_array");
    if (a && a->release)
        a->release(a);
    free(a);
}

static void stream_capsule_free(PyObject *cap)
{
    struct ArrowArrayStream *st = PyCapsule_GetPointer(cap, "arrow_array_stream");
    if (st && st->release)
        st->release(st);
    free(st);
}

static PyObject *schema_capsule(struct ArrowSchema *s)
{
    struct ArrowSchema *p = malloc(sizeof(*p));
    if (!p) {
        s->release(s);
        return PyErr_NoMemory();
    }
    *p = *s;
    PyObject *cap = PyCapsule_New(p, "arrow_schema", schema_capsule_free);
    if (!cap) {
        p->release(p);
        free(p);
    }
    return cap;
}

static PyObject *array_capsule(struct ArrowArray *a)
{
    struct ArrowArray *p = malloc(sizeof(*p));
    if (!p) {
        a->release(a);
        return PyErr_NoMemory();
    }
    *p = *a;
    PyObject *cap = PyCapsule_New(p, "arrow_array", array_capsule_free);
    if (!cap) {
        p->release(p);
        free(p);
    }
    return cap;
}

static int check_requested(PyObject *requested)
{
    if (requested && requested != Py_None) {
        PyErr_SetString(PyExc_NotImplementedError, "shmref.Batch exports its own schema only (requested_schema "
                        "must be None: cast after import)");
        return -1;
    }
    return 0;
}

static PyObject *Batch_arrow_c_stream(BatchObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = { "requested_schema", NULL };
    PyObject *requested = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:__arrow_c_stream__", names, &requested))
        return NULL;
    if (check_requested(requested) < 0 || batch_live(self) < 0)
        return NULL;
    struct ArrowArrayStream *st = malloc(sizeof(*st));
    if (!st)
        return PyErr_NoMemory();
    int r = shmref_unit_export_stream(self->u, st);
    if (r < 0) {
        free(st);
        return batch_fail(self, r);
    }
    if (exports_wrap_stream(self->conn->core, st) < 0) {
        st->release(st);
        free(st);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(st, "arrow_array_stream", stream_capsule_free);
    if (!cap) {
        st->release(st);
        free(st);
    }
    return cap;
}

static PyObject *Batch_arrow_c_array(BatchObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = { "requested_schema", NULL };
    PyObject *requested = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:__arrow_c_array__", names, &requested))
        return NULL;
    if (check_requested(requested) < 0 || batch_live(self) < 0)
        return NULL;
    int n = shmref_unit_n_batches(self->u);
    if (n != 1)
        return PyErr_Format(PyExc_TypeError, "this unit has %d record batches: __arrow_c_array__ is for a single "
                            "batch, use __arrow_c_stream__ (pyarrow.table(batch), to_pyarrow())", n);
    struct ArrowSchema s;
    struct ArrowArray a;
    int r = shmref_unit_export_batch(self->u, 0, &s, &a);
    if (r < 0)
        return batch_fail(self, r);
    if (exports_wrap_array(self->conn->core, &a) < 0) {
        s.release(&s);
        a.release(&a);
        return PyErr_NoMemory();
    }
    PyObject *sc = schema_capsule(&s);
    if (!sc) {
        a.release(&a);
        return NULL;
    }
    PyObject *ac = array_capsule(&a);
    if (!ac) {
        Py_DECREF(sc);
        return NULL;
    }
    return Py_BuildValue("(NN)", sc, ac);
}

static PyObject *Batch_arrow_c_schema(BatchObject *self, PyObject *unused)
{
    (void)unused;
    if (batch_live(self) < 0)
        return NULL;
    struct ArrowArrayStream st;
    struct ArrowSchema s;
    int r = shmref_unit_export_stream(self->u, &st);
    if (r < 0)
        return batch_fail(self, r);
    r = st.get_schema(&st, &s);
    st.release(&st);
    if (r != 0)
        return shmrefpy_raise(-ENOMEM, "");
    return schema_capsule(&s);
}

static PyObject *pyarrow_call(const char *fn, PyObject *arg)
{
    PyObject *pa = PyImport_ImportModule("pyarrow");
    if (!pa)
        return NULL;
    PyObject *res = PyObject_CallMethod(pa, fn, "O", arg);
    Py_DECREF(pa);
    return res;
}

static PyObject *Batch_to_pyarrow(BatchObject *self, PyObject *unused)
{
    (void)unused;
    if (batch_live(self) < 0)
        return NULL;
    return pyarrow_call(shmref_unit_n_batches(self->u) == 1 ? "record_batch" : "table", (PyObject *)self);
}

static PyObject *Batch_release(BatchObject *self, PyObject *unused)
{
    (void)unused;
    batch_drop(self);
    Py_RETURN_NONE;
}

static PyObject *Batch_enter(BatchObject *self, PyObject *unused)
{
    (void)unused;
    if (batch_live(self) < 0)
        return NULL;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *Batch_exit(BatchObject *self, PyObject *args)
{
    (void)args;
    batch_drop(self);
    Py_RETURN_NONE;
}

static PyObject *Batch_mapping_range(BatchObject *self, PyObject *unused)
{
    (void)unused;
    if (batch_live(self) < 0)
        return NULL;
    uintptr_t start = (uintptr_t)self->data;
    return Py_BuildValue("(KK)", (unsigned long long)start, (unsigned long long)(start + self->size));
}

static PyObject *Batch_get_schema(BatchObject *self, void *c)
{
    (void)c;
    if (batch_live(self) < 0)
        return NULL;
    return pyarrow_call("schema", (PyObject *)self);
}

static PyObject *Batch_get_num_rows(BatchObject *self, void *c)
{
    (void)c;
    if (batch_live(self) < 0)
        return NULL;
    int64_t rows = 0;
    for (int i = 0, n = shmref_unit_n_batches(self->u); i < n; i++)
        rows += shmref_unit_batch_length(self->u, i);
    return PyLong_FromLongLong(rows);
}

static PyObject *Batch_get_num_batches(BatchObject *self, void *c)
{
    (void)c;
    if (batch_live(self) < 0)
        return NULL;
    return PyLong_FromLong(shmref_unit_n_batches(self->u));
}

static PyObject *Batch_get_column_names(BatchObject *self, void *c)
{
    (void)c;
    if (batch_live(self) < 0)
        return NULL;
    int n = shmref_unit_n_columns(self->u);
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(shmref_unit_column_name(self->u, i),
                                           (Py_ssize_t)strlen(shmref_unit_column_name(self->u, i)), "replace");
        if (!s) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, s);
    }
    return l;
}

static PyObject *Batch_get_ref(BatchObject *self, void *c)
{
    (void)c;
    return ref_new(&self->desc);
}

static PyObject *Batch_get_released(BatchObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->u == NULL);
}

static PyObject *Batch_repr(BatchObject *self)
{
    char text[SHMREF_DESC_TEXT_MAX];
    shmref_desc_to_text(&self->desc, text, sizeof(text));
    if (!self->u)
        return PyUnicode_FromFormat("<shmref.Batch %s released>", text);
    return PyUnicode_FromFormat("<shmref.Batch %s: %d columns, %d batches>", text, shmref_unit_n_columns(self->u),
                                shmref_unit_n_batches(self->u));
}

static PyMethodDef Batch_methods[] = {
    { "__arrow_c_stream__", (PyCFunction)(void (*)(void))Batch_arrow_c_stream, METH_VARARGS | METH_KEYWORDS,
      "__arrow_c_stream__($self, /, requested_schema=None)\n--\n\n"
      "An 'arrow_array_stream' capsule of every record batch, zero-copy: the arrays' buffers "
      "point into the read-only mapping, which they keep (with the daemon's reference) until "
      "the consumer releases them, also after release() and Client.close()." },
    { "__arrow_c_array__", (PyCFunction)(void (*)(void))Batch_arrow_c_array, METH_VARARGS | METH_KEYWORDS,
      "__arrow_c_array__($self, /, requested_schema=None)\n--\n\n"
      "('arrow_schema', 'arrow_array') capsules of the only record batch (a struct array), "
      "zero-copy; TypeError when the unit has more than one batch (use the stream)." },
    { "__arrow_c_schema__", (PyCFunction)Batch_arrow_c_schema, METH_NOARGS,
      "__arrow_c_schema__($self, /)\n--\n\nAn 'arrow_schema' capsule of the unit's schema (a struct)." },
    { "to_pyarrow", (PyCFunction)Batch_to_pyarrow, METH_NOARGS,
      "to_pyarrow($self, /)\n--\n\n"
      "A pyarrow.RecordBatch (one batch) or pyarrow.Table (any other count), zero-copy through "
      "the capsules. Needs pyarrow (imported here, not by shmref)." },
    { "release", (PyCFunction)Batch_release, METH_NOARGS,
      "release($self, /)\n--\n\n"
      "Drops this handle's reference. Arrays exported before keep theirs: the buffer goes back "
      "to the daemon when the last of them is released. Idempotent." },
    { "_mapping_range", (PyCFunction)Batch_mapping_range, METH_NOARGS,
      "_mapping_range($self, /)\n--\n\n(start, end): the addresses of the unit's bytes in this process." },
    { "__enter__", (PyCFunction)Batch_enter, METH_NOARGS, "Returns the batch." },
    { "__exit__", (PyCFunction)Batch_exit, METH_VARARGS, "Releases the batch (see release())." },
    { NULL }
};

static PyGetSetDef Batch_getset[] = {
    { "schema", (getter)Batch_get_schema, NULL, "The schema, as a pyarrow.Schema (needs pyarrow).", NULL },
    { "num_rows", (getter)Batch_get_num_rows, NULL, "Rows of all batches.", NULL },
    { "num_batches", (getter)Batch_get_num_batches, NULL, "Record batches in the unit.", NULL },
    { "column_names", (getter)Batch_get_column_names, NULL, "The columns' names, in order.", NULL },
    { "ref", (getter)Batch_get_ref, NULL, "The unit's Ref.", NULL },
    { "released", (getter)Batch_get_released, NULL, "Whether release() was called.", NULL },
    { NULL }
};

PyTypeObject Batch_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmref.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An acquired Arrow unit of work (from Client.acquire_batch): one or more record batches "
              "with one schema, checked against the buffer at acquire. Implements the Arrow PyCapsule "
              "interface (__arrow_c_stream__, __arrow_c_array__ for a single batch, __arrow_c_schema__), "
              "so pyarrow, polars, duckdb, nanoarrow and daft read it zero-copy.",
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_repr = (reprfunc)Batch_repr,
    .tp_methods = Batch_methods,
    .tp_getset = Batch_getset,
};
