/* Hook, dispatch: Pick, the C adapter between a cache entry and a compiled graph.
 * In: the values of the entry's slots. Out: fn(*values[positions]), or one item of it,
 * without a Python frame in between (the frontend's fast target for arrays-in, arrays-out frames). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "hook.h"

#define FC_PICK_MAX_ARGS 64

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn;              /* owned: the callable (a graph Compiled) */
    PyObject *positions;       /* owned: tuple of ints, which arguments to pass, in order */
    PyObject *item;            /* owned: int index into fn's result, or None for all of it */
    Py_ssize_t npos;
    Py_ssize_t pos[FC_PICK_MAX_ARGS];
    Py_ssize_t index;          /* -1: the whole result */
} PickObject;

static PyObject *
Pick_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PickObject *p = (PickObject *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *picked[FC_PICK_MAX_ARGS];
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "Pick takes positional arguments only");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < p->npos; i++) {
        if (p->pos[i] >= nargs) {
            PyErr_Format(PyExc_TypeError, "Pick: argument %zd of %zd requested", p->pos[i], nargs);
            return NULL;
        }
        picked[i] = args[p->pos[i]];
    }
    /* fn is held for the call: Pick.fn may be replaced meanwhile (the graph may release the GIL) */
    PyObject *fn = Py_NewRef(p->fn);
    PyObject *res = PyObject_Vectorcall(fn, picked, (size_t)p->npos, NULL);
    Py_DECREF(fn);
    if (res == NULL || p->index < 0) {
        return res;
    }
    PyObject *out = NULL;
    if (PyTuple_Check(res) && p->index < PyTuple_GET_SIZE(res)) {
        out = Py_NewRef(PyTuple_GET_ITEM(res, p->index));
    }
    else {
        out = PySequence_GetItem(res, p->index);
    }
    Py_DECREF(res);
    return out;
}

static PyObject *
Pick_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"fn", "positions", "item", NULL};
    PyObject *fn = NULL, *positions = NULL, *item = Py_None;
    PickObject *p = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!|O:Pick", kwlist, &fn, &PyTuple_Type, &positions,
                                     &item)) {
        goto error;
    }
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "Pick: fn must be callable");
        goto error;
    }
    if (PyTuple_GET_SIZE(positions) > FC_PICK_MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "Pick: at most %d positions", FC_PICK_MAX_ARGS);
        goto error;
    }
    if ((p = (PickObject *)type->tp_alloc(type, 0)) == NULL) {
        goto error;
    }
    p->vectorcall = Pick_vectorcall;
    p->fn = Py_NewRef(fn);
    p->positions = Py_NewRef(positions);
    p->item = Py_NewRef(item);
    p->npos = PyTuple_GET_SIZE(positions);
    for (Py_ssize_t i = 0; i < p->npos; i++) {
        PyObject *o = PyTuple_GET_ITEM(positions, i);
        p->pos[i] = PyLong_Check(o) ? PyLong_AsSsize_t(o) : -1;
        if (p->pos[i] < 0) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "Pick: positions[%zd] must be an int >= 0", i);
            }
            goto error;
        }
    }
    p->index = -1;
    if (item != Py_None) {
        p->index = PyLong_Check(item) ? PyLong_AsSsize_t(item) : -1;
        if (p->index < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "Pick: item must be an int >= 0 or None");
            }
            goto error;
        }
    }
    return (PyObject *)p;
error:
    Py_XDECREF(p);
    return NULL;
}

static int
Pick_traverse(PickObject *p, visitproc visit, void *arg)
{
    Py_VISIT(p->fn);
    Py_VISIT(p->positions);
    Py_VISIT(p->item);
    return 0;
}

static int
Pick_clear(PickObject *p)
{
    Py_CLEAR(p->fn);
    Py_CLEAR(p->positions);
    Py_CLEAR(p->item);
    return 0;
}

static void
Pick_dealloc(PickObject *p)
{
    PyObject_GC_UnTrack(p);
    Pick_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

/* Pick.fn: readable, and replaceable by another callable (the async first call's wrapper hands
 * the entry over to the Compiled itself once its kernels are built) */
static PyObject *
Pick_get_fn(PickObject *p, void *closure)
{
    (void)closure;
    return Py_NewRef(p->fn != NULL ? p->fn : Py_None);        /* NULL only after tp_clear */
}

static int
Pick_set_fn(PickObject *p, PyObject *value, void *closure)
{
    (void)closure;
    if (value == NULL || !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "Pick.fn must be a callable");
        return -1;
    }
    Py_SETREF(p->fn, Py_NewRef(value));
    return 0;
}

static PyGetSetDef Pick_getset[] = {
    {"fn", (getter)Pick_get_fn, (setter)Pick_set_fn, "the callable", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Pick_members[] = {
    {"positions", T_OBJECT, offsetof(PickObject, positions), READONLY, "which arguments it gets"},
    {"item", T_OBJECT, offsetof(PickObject, item), READONLY, "which item of its result is returned, or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject Pick_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile._C.Pick",
    .tp_basicsize = sizeof(PickObject),
    .tp_dealloc = (destructor)Pick_dealloc,
    .tp_vectorcall_offset = offsetof(PickObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Pick(fn, positions, item=None)(*args) == fn(*[args[i] for i in positions])[item] "
              "(the whole result when item is None), in C.",
    .tp_traverse = (traverseproc)Pick_traverse,
    .tp_clear = (inquiry)Pick_clear,
    .tp_members = Pick_members,
    .tp_getset = Pick_getset,
    .tp_new = Pick_new,
};

int
fc_hook_adapter_init(PyObject *m)
{
    if (PyType_Ready(&Pick_Type) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(m, "Pick", (PyObject *)&Pick_Type);
}
