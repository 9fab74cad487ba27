/* Graph API: fastcompile.graph.Graph and Value (Compiled: compiledobj.c).
 * In: Python calls (ops, attributes). Out: an FcGraph, handed to compile(). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

#include "../core/graph.h"
#include "../core/shape.h"
#include "../common/strbuf.h"
#include "../fc_numpy.h"
#include "../runtime/cuda.h"
#include "../runtime/plan.h"
#include "api.h"
#include "objects.h"

/* ========================================================================
 * types
 * ====================================================================== */

typedef struct {
    PyObject_HEAD
    GraphObject *graph;       /* owned */
    int node;
} ValueObject;

static PyTypeObject Graph_Type;
static PyTypeObject Value_Type;

/* ========================================================================
 * Value
 * ====================================================================== */

static PyObject *
value_new(GraphObject *g, int node)
{
    ValueObject *v = PyObject_GC_New(ValueObject, &Value_Type);
    if (v == NULL) {
        return NULL;
    }
    Py_INCREF(g);
    v->graph = g;
    v->node = node;
    PyObject_GC_Track(v);
    return (PyObject *)v;
}

static int
Value_traverse(ValueObject *v, visitproc visit, void *arg)
{
    Py_VISIT(v->graph);
    return 0;
}

static int
Value_clear(ValueObject *v)
{
    Py_CLEAR(v->graph);
    return 0;
}

static void
Value_dealloc(ValueObject *v)
{
    PyObject_GC_UnTrack(v);
    Value_clear(v);
    PyObject_GC_Del(v);
}

static PyObject *
Value_repr(ValueObject *v)
{
    const FcNode *n;
    if (v->graph == NULL) {
        return PyUnicode_FromString("<fastcompile.graph.Value (graph freed)>");
    }
    n = &v->graph->g.nodes[v->node];
    const char *dt = n->dtype >= 0 ? fc_dtypes[n->dtype].name : "?";
    if (n->ndim >= 0) {
        return PyUnicode_FromFormat("<fastcompile.graph.Value %%%d = %s: %s, ndim=%d>", v->node,
                                    fc_ops[n->op].name, dt, n->ndim);
    }
    return PyUnicode_FromFormat("<fastcompile.graph.Value %%%d = %s: %s>", v->node, fc_ops[n->op].name, dt);
}

static PyObject *
Value_get_dtype(ValueObject *v, void *closure)
{
    int dt = v->graph ? v->graph->g.nodes[v->node].dtype : -1;
    if (dt < 0) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(fc_dtypes[dt].name);
}

static PyObject *
Value_get_ndim(ValueObject *v, void *closure)
{
    int nd = v->graph ? v->graph->g.nodes[v->node].ndim : -1;
    if (nd < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(nd);
}

static PyObject *
Value_get_node(ValueObject *v, void *closure)
{
    return PyLong_FromLong(v->node);
}

static PyGetSetDef Value_getset[] = {
    {"dtype", (getter)Value_get_dtype, NULL, "result dtype name, None if known only at run time", NULL},
    {"ndim", (getter)Value_get_ndim, NULL, "result rank, None if known only at run time", NULL},
    {"node", (getter)Value_get_node, NULL, "node index in the graph", NULL},
    {NULL},
};

static PyTypeObject Value_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile.graph.Value",
    .tp_basicsize = sizeof(ValueObject),
    .tp_dealloc = (destructor)Value_dealloc,
    .tp_repr = (reprfunc)Value_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Value_traverse,
    .tp_clear = (inquiry)Value_clear,
    .tp_doc = "A value in a fastcompile graph (made by Graph.input/constant/call/extern).",
    .tp_getset = Value_getset,
};

/* ========================================================================
 * Graph
 * ====================================================================== */

PyObject *
fc_api_caller_origin(void)
{
    PyFrameObject *f = PyEval_GetFrame();   /* borrowed */
    PyCodeObject *co;
    PyObject *r;
    if (f == NULL) {
        return PyUnicode_FromString("<unknown>");
    }
    co = PyFrame_GetCode(f);
    r = PyUnicode_FromFormat("%U:%d", co->co_filename, PyFrame_GetLineNumber(f));
    Py_DECREF(co);
    return r;
}

static PyObject *
Graph_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    GraphObject *self;
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Graph() takes no arguments");
        return NULL;
    }
    self = (GraphObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    fc_graph_init(&self->g);
    self->externs = PyList_New(0);
    self->views = PyList_New(0);
    self->origin = fc_api_caller_origin();
    if (self->externs == NULL || self->views == NULL || self->origin == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
Graph_traverse(GraphObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->externs);
    Py_VISIT(self->views);
    return 0;
}

static int
Graph_clear(GraphObject *self)
{
    Py_CLEAR(self->externs);
    Py_CLEAR(self->views);
    return 0;
}

static void
Graph_dealloc(GraphObject *self)
{
    PyObject_GC_UnTrack(self);
    Graph_clear(self);
    fc_graph_free(&self->g);
    Py_XDECREF(self->origin);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

int
fc_api_parse_dtype(PyObject *obj)
{
    PyObject *np = NULL, *d = NULL, *name = NULL;
    int dt = -1;
    if (PyUnicode_Check(obj)) {
        dt = fc_dtype_from_name(PyUnicode_AsUTF8(obj));
        if (dt >= 0) {
            return dt;
        }
    }
    np = PyImport_ImportModule("numpy");
    d = np ? PyObject_CallMethod(np, "dtype", "O", obj) : NULL;
    name = d ? PyObject_GetAttrString(d, "name") : NULL;
    if (name != NULL) {
        dt = fc_dtype_from_name(PyUnicode_AsUTF8(name));
    }
    PyErr_Clear();
    if (dt < 0) {
        PyErr_Format(PyExc_TypeError,
                     "fastcompile: unsupported dtype %R (supported: bool, int8, int16, int32, "
                     "int64, uint8, uint16, uint32, uint64, float16, bfloat16, float32, float64)", obj);
    }
    Py_XDECREF(name);
    Py_XDECREF(d);
    Py_XDECREF(np);
    return dt;
}

static PyObject *
Graph_input(GraphObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dtype", "ndim", "device", "weak", NULL};
    PyObject *dtype;
    int ndim, weak = 0, *p;
    const char *device = "cpu";
    FcNode n;
    int idx;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oi|sp:input", kwlist, &dtype, &ndim, &device, &weak)) {
        return NULL;
    }
    if (strcmp(device, "cpu") != 0) {
        PyErr_Format(PyExc_ValueError,
                     "fastcompile: device '%s' is not supported yet (only 'cpu' for now)", device);
        return NULL;
    }
    if (ndim < 0 || ndim > FC_MAXDIM) {
        PyErr_Format(PyExc_ValueError, "fastcompile: ndim must be in 0..%d, got %d", FC_MAXDIM, ndim);
        return NULL;
    }
    memset(&n, 0, sizeof(n));
    n.op = FC_OP_INPUT;
    if ((n.dtype = fc_api_parse_dtype(dtype)) < 0) {
        return NULL;
    }
    if (weak && (ndim != 0 || n.dtype != FC_F64)) {
        /* a Python float's value passed at each call (NEP 50: it takes the other side's dtype);
         * a weak int would have to raise where NumPy does (int8 and 1000), a value known only
         * at run time */
        PyErr_Format(PyExc_ValueError, "fastcompile: a weak input is a Python float: dtype float64 "
                     "and ndim 0, got %s and ndim %d", fc_dtypes[n.dtype].name, ndim);
        return NULL;
    }
    n.weak = weak;
    n.ndim = ndim;
    n.input_index = self->g.ninputs;
    if ((idx = fc_graph_add_node(&self->g, &n, NULL, 0)) < 0) {
        return NULL;
    }
    p = PyMem_Realloc(self->g.inputs, (self->g.ninputs + 1) * sizeof(int));
    if (p == NULL) {
        return PyErr_NoMemory();
    }
    self->g.inputs = p;
    self->g.inputs[self->g.ninputs++] = idx;
    return value_new(self, idx);
}

/* a constant node for a Python or NumPy scalar; -1 + TypeError otherwise */
static int
add_constant(GraphObject *self, PyObject *value)
{
    FcNode n;
    memset(&n, 0, sizeof(n));
    n.op = FC_OP_CONST;
    n.ndim = 0;
    if (PyArray_IsScalar(value, Generic)) {
        /* NumPy scalars are strongly typed (NEP 50); test them first:
         * np.float64 is a subclass of float */
        PyObject *dt = PyObject_GetAttrString(value, "dtype");
        PyObject *item;
        if (dt == NULL) {
            return -1;
        }
        n.dtype = fc_api_parse_dtype(dt);
        Py_DECREF(dt);
        if (n.dtype < 0) {
            return -1;
        }
        item = PyObject_CallMethod(value, "item", NULL);
        if (item == NULL) {
            return -1;
        }
        if (fc_dtypes[n.dtype].kind == 'f') {
            n.ckind = FC_CONST_FLOAT;
            n.fval = PyFloat_AsDouble(item);
        }
        else if (fc_dtypes[n.dtype].kind == 'u' && n.dtype == FC_U64) {
            n.ckind = FC_CONST_INT;
            n.ival = (int64_t)PyLong_AsUnsignedLongLong(item);
            n.fval = (double)(uint64_t)n.ival;
        }
        else {
            n.ckind = n.dtype == FC_BOOL ? FC_CONST_BOOL : FC_CONST_INT;
            n.ival = PyLong_AsLongLong(item);
            n.fval = (double)n.ival;
        }
        Py_DECREF(item);
        if (PyErr_Occurred()) {
            return -1;
        }
    }
    else if (PyBool_Check(value)) {
        n.ckind = FC_CONST_BOOL;
        n.ival = value == Py_True;
        n.fval = (double)n.ival;
        n.dtype = FC_BOOL;
        n.weak = 1;
    }
    else if (PyLong_Check(value)) {
        int overflow = 0;
        n.ckind = FC_CONST_INT;
        n.ival = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow) {
            PyErr_SetString(PyExc_OverflowError, "fastcompile: integer constant does not fit in int64");
            return -1;
        }
        n.fval = (double)n.ival;
        n.dtype = FC_I64;
        n.weak = 1;
    }
    else if (PyFloat_Check(value)) {
        n.ckind = FC_CONST_FLOAT;
        n.fval = PyFloat_AS_DOUBLE(value);
        n.dtype = FC_F64;
        n.weak = 1;
    }
    else {
        PyErr_Format(PyExc_TypeError,
                     "fastcompile: a constant must be a Python or NumPy scalar (bool, int, float), "
                     "got %.100s; pass arrays as graph inputs", Py_TYPE(value)->tp_name);
        return -1;
    }
    return fc_graph_add_node(&self->g, &n, NULL, 0);
}

static PyObject *
Graph_constant(GraphObject *self, PyObject *value)
{
    int idx = add_constant(self, value);
    return idx < 0 ? NULL : value_new(self, idx);
}

/* argument -> node index: a Value of this graph, or a scalar made a constant */
static int
arg_node(GraphObject *self, PyObject *arg, const char *what, Py_ssize_t pos)
{
    if (Py_IS_TYPE(arg, &Value_Type)) {
        ValueObject *v = (ValueObject *)arg;
        if (v->graph != self) {
            PyErr_Format(PyExc_ValueError, "fastcompile: argument %zd of %s is a Value of another Graph",
                         pos, what);
            return -1;
        }
        return v->node;
    }
    if (PyArray_Check(arg)) {
        PyErr_Format(PyExc_TypeError,
                     "fastcompile: argument %zd of %s is a NumPy array; graphs take arrays as "
                     "inputs (Graph.input) and arrays are passed when the compiled graph is called",
                     pos, what);
        return -1;
    }
    return add_constant(self, arg);
}

static int
parse_axes(PyObject *axis, FcNode *a)
{
    a->axes_all = 0;
    a->naxes_raw = 0;
    if (axis == NULL || axis == Py_None) {
        a->axes_all = 1;
        return 0;
    }
    if (PyLong_Check(axis)) {
        a->axes_raw[0] = (int32_t)PyLong_AsLong(axis);
        a->naxes_raw = 1;
        return PyErr_Occurred() ? -1 : 0;
    }
    if (PyTuple_Check(axis) || PyList_Check(axis)) {
        Py_ssize_t n = PySequence_Size(axis);
        if (n > FC_MAXDIM) {
            PyErr_SetString(PyExc_ValueError, "fastcompile: too many axes");
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *it = PySequence_GetItem(axis, i);
            if (it == NULL) {
                return -1;
            }
            if (!PyLong_Check(it)) {
                Py_DECREF(it);
                PyErr_SetString(PyExc_TypeError, "fastcompile: axis must be None, an int or a tuple of ints");
                return -1;
            }
            a->axes_raw[i] = (int32_t)PyLong_AsLong(it);
            Py_DECREF(it);
        }
        a->naxes_raw = (int)n;
        return PyErr_Occurred() ? -1 : 0;
    }
    PyErr_SetString(PyExc_TypeError, "fastcompile: axis must be None, an int or a tuple of ints");
    return -1;
}

/* the attributes call() accepts, per op family */
static int
parse_attrs(int op, PyObject *kwargs, FcNode *a, int *opout)
{
    const FcOpInfo *info = &fc_ops[op];
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    int is_red = info->kind == FC_KIND_RED ||
                 (info->kind == FC_KIND_COMPOSITE);
    int axis_seen = 0;
    memset(a, 0, sizeof(*a));
    a->axes_all = 1;
    a->correction = 0;
    *opout = op;
    if (op == FC_OP_SOFTMAX || op == FC_OP_LOG_SOFTMAX) {
        a->axes_all = 0;
        a->axes_raw[0] = -1;
        a->naxes_raw = 1;
    }
    if (op == FC_OP_CAST) {
        a->cast_to = -1;
    }
    while (kwargs && PyDict_Next(kwargs, &pos, &key, &val)) {
        const char *k = PyUnicode_AsUTF8(key);
        if (k == NULL) {
            return -1;
        }
        if (is_red && (strcmp(k, "axis") == 0 || strcmp(k, "dim") == 0)) {
            if (parse_axes(val, a) < 0) {
                return -1;
            }
            axis_seen = 1;
            if ((op == FC_OP_SOFTMAX || op == FC_OP_LOG_SOFTMAX) && a->naxes_raw != 1) {
                PyErr_Format(PyExc_TypeError, "fastcompile: %s takes one int axis", info->name);
                return -1;
            }
        }
        else if (is_red && (strcmp(k, "keepdim") == 0 || strcmp(k, "keepdims") == 0)) {
            a->keepdim = PyObject_IsTrue(val);
        }
        else if ((op == FC_OP_VAR || op == FC_OP_STD) &&
                 (strcmp(k, "correction") == 0 || strcmp(k, "ddof") == 0)) {
            a->correction = (int)PyLong_AsLong(val);
            if (PyErr_Occurred()) {
                return -1;
            }
        }
        else if (op == FC_OP_CAST && strcmp(k, "dtype") == 0) {
            if ((a->cast_to = fc_api_parse_dtype(val)) < 0) {
                return -1;
            }
        }
        else if (op == FC_OP_GELU && strcmp(k, "approximate") == 0) {
            const char *s = PyUnicode_Check(val) ? PyUnicode_AsUTF8(val) : "";
            if (strcmp(s, "tanh") == 0) {
                *opout = FC_OP_GELU_TANH;
            }
            else if (strcmp(s, "none") != 0) {
                PyErr_SetString(PyExc_ValueError, "fastcompile: gelu approximate must be 'none' or 'tanh'");
                return -1;
            }
        }
        else {
            PyErr_Format(PyExc_TypeError, "fastcompile: op '%s' got an unexpected keyword argument '%s'",
                         info->name, k);
            return -1;
        }
    }
    (void)axis_seen;
    if (op == FC_OP_CAST && a->cast_to < 0) {
        PyErr_SetString(PyExc_TypeError, "fastcompile: cast needs dtype=");
        return -1;
    }
    return 0;
}

static PyObject *
unknown_op(const char *name)
{
    FcStr b = {0};
    char *text;
    fc_str_printf(&b, "fastcompile: unknown op '%s'; ops are:", name);
    for (int i = 0; i < FC_NOPS; i++) {
        if (fc_ops[i].kind != FC_KIND_SPECIAL || i == FC_OP_CAST) {
            fc_str_printf(&b, " %s", fc_ops[i].name);
        }
    }
    text = fc_str_take(&b);
    if (text != NULL) {
        PyErr_SetString(PyExc_ValueError, text);
        fc_str_release(text);
    }
    return NULL;
}

static PyObject *
Graph_call(GraphObject *self, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    const char *name;
    int op, in[3], idx, realop;
    FcNode attrs;
    if (nargs < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(args, 0))) {
        PyErr_SetString(PyExc_TypeError, "call(op_name, *values, **attrs): op_name must be a str");
        return NULL;
    }
    name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(args, 0));
    op = fc_op_lookup(name);
    if (op < 0 || (fc_ops[op].kind == FC_KIND_SPECIAL && op != FC_OP_CAST)) {
        if (op >= 0) {
            PyErr_Format(PyExc_ValueError, "fastcompile: '%s' is not callable through call(); use "
                         "Graph.input/constant/extern", name);
            return NULL;
        }
        return unknown_op(name);
    }
    if (nargs - 1 != fc_ops[op].arity) {
        PyErr_Format(PyExc_TypeError, "fastcompile: op '%s' takes %d argument%s, got %zd", name,
                     fc_ops[op].arity, fc_ops[op].arity == 1 ? "" : "s", nargs - 1);
        return NULL;
    }
    if (parse_attrs(op, kwargs, &attrs, &realop) < 0) {
        return NULL;
    }
    for (Py_ssize_t i = 1; i < nargs; i++) {
        if ((in[i - 1] = arg_node(self, PyTuple_GET_ITEM(args, i), name, i - 1)) < 0) {
            return NULL;
        }
    }
    if (fc_ops[op].kind == FC_KIND_RED || fc_ops[op].kind == FC_KIND_COMPOSITE) {
        const FcNode *x = &self->g.nodes[in[0]];
        if (x->ndim >= 0) {
            uint32_t mask;
            if (fc_norm_axes(&attrs, x->ndim, &mask) < 0) {
                return NULL;
            }
        }
    }
    idx = fc_graph_add(&self->g, realop, in, (int)(nargs - 1), &attrs);
    if (idx < 0) {
        return NULL;
    }
    return value_new(self, idx);
}

/* One sequence of at most FC_MAXDIM ints into out; its length, or -1 + TypeError/ValueError. */
static int
parse_dims(PyObject *seq, int64_t *out, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, "extern(view=...): shapes and strides are sequences of ints");
    Py_ssize_t n;
    if (fast == NULL) {
        return -1;
    }
    n = PySequence_Fast_GET_SIZE(fast);
    if (n > FC_MAXDIM) {
        PyErr_Format(PyExc_ValueError, "extern(view=...): %s has %zd dims, at most %d", what, n, FC_MAXDIM);
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        out[i] = (int64_t)v;
    }
    Py_DECREF(fast);
    return (int)n;
}

/* The lowest and highest element offset an array of this shape and these
 * strides touches, with its element count in *count: 1; 0 if it is empty
 * (nothing touched); -1 where a sum or product overflows int64. */
static int
extent(int nd, const int64_t *shape, const int64_t *strides, int64_t *lo, int64_t *hi, int64_t *count)
{
    int empty = 0;
    *lo = *hi = 0;
    *count = 1;
    for (int d = 0; d < nd; d++) {
        int64_t span;
        if (__builtin_mul_overflow(*count, shape[d], count)) {
            return -1;
        }
        if (shape[d] == 0) {
            empty = 1;
        }
        if (shape[d] <= 1) {
            continue;
        }
        if (__builtin_mul_overflow(shape[d] - 1, strides[d], &span) ||
                __builtin_add_overflow(span > 0 ? *hi : *lo, span, span > 0 ? hi : lo)) {
            return -1;
        }
    }
    return empty ? 0 : 1;
}

/* view=(in_shape, in_strides, out_shape, out_strides, offset): a new bytes
 * object holding the FcViewSpec, or NULL + ValueError/TypeError. */
static PyObject *
parse_view(PyObject *obj)
{
    FcViewSpec vs;
    int64_t lo_in, hi_in, lo_out, hi_out, n_in, n_out;
    int in_some, out_some;
    memset(&vs, 0, sizeof(vs));
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 5) {
        PyErr_SetString(PyExc_TypeError, "extern(view=...) takes (in_shape, in_strides, out_shape, out_strides, "
                        "offset), in elements");
        return NULL;
    }
    if ((vs.in_nd = parse_dims(PyTuple_GET_ITEM(obj, 0), vs.in_shape, "in_shape")) < 0 ||
        parse_dims(PyTuple_GET_ITEM(obj, 1), vs.in_strides, "in_strides") != vs.in_nd ||
        (vs.out_nd = parse_dims(PyTuple_GET_ITEM(obj, 2), vs.out_shape, "out_shape")) < 0 ||
        parse_dims(PyTuple_GET_ITEM(obj, 3), vs.out_strides, "out_strides") != vs.out_nd) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "extern(view=...): a shape and its strides differ in length");
        }
        return NULL;
    }
    vs.offset = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, 4));
    if (vs.offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    for (int d = 0; d < vs.in_nd; d++) {
        if (vs.in_shape[d] < 0) {
            PyErr_SetString(PyExc_ValueError, "extern(view=...): negative size");
            return NULL;
        }
    }
    for (int d = 0; d < vs.out_nd; d++) {
        if (vs.out_shape[d] < 0) {
            PyErr_SetString(PyExc_ValueError, "extern(view=...): negative size");
            return NULL;
        }
    }
    in_some = extent(vs.in_nd, vs.in_shape, vs.in_strides, &lo_in, &hi_in, &n_in);
    out_some = extent(vs.out_nd, vs.out_shape, vs.out_strides, &lo_out, &hi_out, &n_out);
    if (in_some < 0 || out_some < 0) {
        PyErr_SetString(PyExc_ValueError, "extern(view=...): sizes and strides too large (int64 overflow)");
        return NULL;
    }
    if (out_some && (!in_some || __builtin_add_overflow(vs.offset, lo_out, &lo_out) ||
                     __builtin_add_overflow(vs.offset, hi_out, &hi_out) || lo_out < lo_in || hi_out > hi_in)) {
        PyErr_SetString(PyExc_ValueError, "extern(view=...): the view reaches outside its input");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)&vs, sizeof(vs));
}

PyObject *
fc_api_view_apply(const FcViewSpec *vs, PyObject *obj)
{
    PyArrayObject *a = (PyArrayObject *)obj, *v;
    npy_intp shape[FC_MAXDIM], strides[FC_MAXDIM];
    npy_intp item;
    int64_t bytes, off = 0;
    int flags, empty;
    if (!PyArray_CheckExact(obj) || PyArray_NDIM(a) != vs->in_nd) {
        return NULL;
    }
    item = PyArray_ITEMSIZE(a);
    if (item <= 0) {
        return NULL;
    }
    for (int d = 0; d < vs->in_nd; d++) {
        npy_intp st = PyArray_STRIDE(a, d);
        if (PyArray_DIM(a, d) != vs->in_shape[d] ||
                (vs->in_shape[d] > 1 && (st % item != 0 || st / item != vs->in_strides[d]))) {
            return NULL;
        }
    }
    /* parse_view checked the view lies inside an array of in_shape and in_strides, which `a`
     * is: its byte offsets fit. Size-1 and empty dims were not checked: stride 0 there, and
     * an empty view starts at a's data. Any product that still overflows: the function runs. */
    flags = PyArray_ISWRITEABLE(a) ? NPY_ARRAY_WRITEABLE : 0;
    empty = 0;
    bytes = item;
    for (int d = 0; d < vs->out_nd; d++) {
        int64_t st = 0;
        shape[d] = (npy_intp)vs->out_shape[d];
        empty |= shape[d] == 0;
        if (__builtin_mul_overflow(bytes, (int64_t)shape[d], &bytes) ||
                (shape[d] > 1 && __builtin_mul_overflow(vs->out_strides[d], (int64_t)item, &st))) {
            return NULL;
        }
        strides[d] = (npy_intp)st;
        if (shape[d] > 1 && strides[d] == 0) {
            flags = 0;          /* a broadcast: read-only, as np.broadcast_to's */
        }
    }
    if (!empty && __builtin_mul_overflow(vs->offset, (int64_t)item, &off)) {
        return NULL;
    }
    Py_INCREF(PyArray_DESCR(a));
    v = (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, PyArray_DESCR(a), vs->out_nd, shape, strides,
                                              PyArray_BYTES(a) + (empty ? 0 : off), flags, NULL);
    if (v == NULL) {
        return NULL;
    }
    Py_INCREF(obj);
    if (PyArray_SetBaseObject(v, obj) < 0) {      /* steals the reference to obj */
        Py_DECREF(v);
        return NULL;
    }
    PyArray_UpdateFlags(v, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_F_CONTIGUOUS | NPY_ARRAY_ALIGNED);
    return (PyObject *)v;
}

static PyObject *
Graph_extern(GraphObject *self, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    PyObject *fn, *nout_obj = NULL, *pure_obj = NULL, *view_obj = NULL, *view = NULL, *result = NULL;
    int *in = NULL, idx = -1, pure = 0;
    long nout = -1;
    FcNode n;
    if (nargs < 1 || !PyCallable_Check(PyTuple_GET_ITEM(args, 0))) {
        PyErr_SetString(PyExc_TypeError, "extern(fn, *values, nout=None, pure=False, view=None): fn must be callable");
        return NULL;
    }
    if (kwargs != NULL) {
        nout_obj = PyDict_GetItemString(kwargs, "nout");
        pure_obj = PyDict_GetItemString(kwargs, "pure");
        view_obj = PyDict_GetItemString(kwargs, "view");
        if (PyDict_GET_SIZE(kwargs) > (nout_obj ? 1 : 0) + (pure_obj ? 1 : 0) + (view_obj ? 1 : 0)) {
            PyErr_SetString(PyExc_TypeError, "extern() takes only the keyword arguments nout=, pure= and view=");
            return NULL;
        }
        if (pure_obj != NULL && (pure = PyObject_IsTrue(pure_obj)) < 0) {
            return NULL;
        }
        if (nout_obj != NULL && nout_obj != Py_None) {
            nout = PyLong_AsLong(nout_obj);
            if (nout < 1) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_ValueError, "extern(): nout must be >= 1");
                }
                return NULL;
            }
        }
    }
    fn = PyTuple_GET_ITEM(args, 0);
    if (self->externs == NULL || self->views == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: this Graph was cleared by the garbage collector");
        return NULL;
    }
    if (view_obj != NULL && view_obj != Py_None) {
        if (nargs != 2 || nout >= 0) {
            PyErr_SetString(PyExc_ValueError, "extern(view=...) takes one value and a single result (no nout=)");
            return NULL;
        }
        if ((view = parse_view(view_obj)) == NULL) {
            return NULL;
        }
    }
    in = PyMem_Malloc(nargs * sizeof(int));
    if (in == NULL) {
        Py_XDECREF(view);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 1; i < nargs; i++) {
        if ((in[i - 1] = arg_node(self, PyTuple_GET_ITEM(args, i), "extern", i - 1)) < 0) {
            goto done;
        }
    }
    memset(&n, 0, sizeof(n));
    n.op = FC_OP_EXTERN;
    n.dtype = n.ndim = -1;
    n.extern_index = (int)PyList_GET_SIZE(self->externs);
    n.item = nout < 0 ? -1 : (int)nout;
    n.pure = pure;
    if (PyList_Append(self->externs, fn) < 0) {
        goto done;
    }
    if (PyList_Append(self->views, view ? view : Py_None) < 0) {
        PyList_SetSlice(self->externs, n.extern_index, n.extern_index + 1, NULL);   /* keep them beside */
        goto done;
    }
    if ((idx = fc_graph_add_node(&self->g, &n, in, (int)(nargs - 1))) < 0) {
        goto done;
    }
    if (nout < 0) {
        result = value_new(self, idx);
        goto done;
    }
    result = PyTuple_New(nout);
    if (result == NULL) {
        goto done;
    }
    for (long k = 0; k < nout; k++) {
        FcNode it;
        int item_idx;
        PyObject *v;
        memset(&it, 0, sizeof(it));
        it.op = FC_OP_ITEM;
        it.dtype = it.ndim = -1;
        it.item = (int)k;
        if ((item_idx = fc_graph_add_node(&self->g, &it, &idx, 1)) < 0 ||
                (v = value_new(self, item_idx)) == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, k, v);
    }
done:
    Py_XDECREF(view);
    PyMem_Free(in);
    return result;
}

static PyObject *
Graph_output(GraphObject *self, PyObject *args)
{
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    int *outs = PyMem_Malloc((n + 1) * sizeof(int));
    if (outs == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((outs[i] = arg_node(self, PyTuple_GET_ITEM(args, i), "output", i)) < 0) {
            PyMem_Free(outs);
            return NULL;
        }
    }
    PyMem_Free(self->g.outputs);
    self->g.outputs = outs;
    self->g.noutputs = (int)n;
    Py_RETURN_NONE;
}

PyObject *
fc_api_dump_graph(const FcGraph *g)
{
    FcStr b = {0};
    char *text;
    PyObject *r;
    for (int i = 0; i < g->nnodes; i++) {
        const FcNode *n = &g->nodes[i];
        fc_str_printf(&b, "%%%d = %s(", i, fc_ops[n->op].name);
        for (int j = 0; j < n->nin; j++) {
            fc_str_printf(&b, j ? ", %%%d" : "%%%d", n->in[j]);
        }
        if (n->op == FC_OP_CONST) {
            if (n->ckind == FC_CONST_FLOAT) {
                fc_str_printf(&b, "%.17g", n->fval);
            }
            else {
                fc_str_printf(&b, "%lld", (long long)n->ival);
            }
        }
        fc_str_printf(&b, ") : %s", n->dtype >= 0 ? fc_dtypes[n->dtype].name : "?");
        if (n->ndim >= 0) {
            fc_str_printf(&b, "[%dd]", n->ndim);
        }
        fc_str_puts(&b, "\n");
    }
    fc_str_puts(&b, "return (");
    for (int k = 0; k < g->noutputs; k++) {
        fc_str_printf(&b, k ? ", %%%d" : "%%%d", g->outputs[k]);
    }
    fc_str_puts(&b, ")\n");
    text = fc_str_take(&b);
    if (text == NULL) {
        return NULL;
    }
    r = PyUnicode_FromString(text);
    fc_str_release(text);
    return r;
}

static PyObject *
Graph_dump(GraphObject *self, PyObject *unused)
{
    return fc_api_dump_graph(&self->g);
}

static PyObject *
Graph_compile(GraphObject *self, PyObject *unused)
{
    return fc_api_compiled_new(self);
}

static PyMethodDef Graph_methods[] = {
    {"input", (PyCFunction)(void (*)(void))Graph_input, METH_VARARGS | METH_KEYWORDS,
     "input(dtype, ndim, device='cpu', weak=False) -> Value: an array argument of the compiled graph; "
     "a 0-d input also takes a scalar of its dtype (a Python float for float64); weak=True (float64, "
     "ndim 0): typed as a Python float (NEP 50: float32 array * it is float32)"},
    {"constant", (PyCFunction)Graph_constant, METH_O,
     "constant(value) -> Value: a scalar (Python scalars are weakly typed, as NumPy's NEP 50)"},
    {"call", (PyCFunction)(void (*)(void))Graph_call, METH_VARARGS | METH_KEYWORDS,
     "call(op_name, *values, **attrs) -> Value: a core op (see fastcompile.graph.ops())"},
    {"extern", (PyCFunction)(void (*)(void))Graph_extern, METH_VARARGS | METH_KEYWORDS,
     "extern(fn, *values, nout=None, pure=False, view=None) -> Value: call a Python function on the arrays at run "
     "time; pure=True: fn has no side effects, so it is not called when nothing uses its result; "
     "view=(in_shape, in_strides, out_shape, out_strides, offset) in elements, for fn a view of its one "
     "argument: when the argument is an array of in_shape and in_strides, the result is made in C without "
     "calling fn"},
    {"output", (PyCFunction)Graph_output, METH_VARARGS, "output(*values): the compiled graph returns these"},
    {"compile", (PyCFunction)Graph_compile, METH_NOARGS, "compile() -> Compiled"},
    {"dump", (PyCFunction)Graph_dump, METH_NOARGS, "the graph as text"},
    {NULL},
};

static PyTypeObject Graph_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile.graph.Graph",
    .tp_basicsize = sizeof(GraphObject),
    .tp_dealloc = (destructor)Graph_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Graph_traverse,
    .tp_clear = (inquiry)Graph_clear,
    .tp_doc = "A graph of array ops: build with input/constant/call/extern/output, then compile().",
    .tp_methods = Graph_methods,
    .tp_new = Graph_new,
};

/* ========================================================================
 * ops() and module wiring
 * ====================================================================== */

static PyObject *
api_ops(PyObject *self, PyObject *unused)
{
    static const char *kinds[] = {"pointwise", "reduction", "composite", "special"};
    PyObject *out = PyDict_New();
    if (out == NULL) {
        return NULL;
    }
    for (int i = 0; i < FC_NOPS; i++) {
        PyObject *rec;
        if (fc_ops[i].kind == FC_KIND_SPECIAL && i != FC_OP_CAST) {
            continue;
        }
        rec = Py_BuildValue("{s:i,s:s,s:s}", "arity", fc_ops[i].arity, "kind", kinds[fc_ops[i].kind],
                            "meaning", fc_ops[i].meaning);
        if (rec == NULL || PyDict_SetItemString(out, fc_ops[i].name, rec) < 0) {
            Py_XDECREF(rec);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(rec);
    }
    return out;
}

static PyMethodDef api_methods[] = {
    {"ops", api_ops, METH_NOARGS, "the op table: name -> {arity, kind, meaning}"},
    {NULL},
};

int
fc_api_init(PyObject *m)
{
    if (PyType_Ready(&Value_Type) < 0 || PyType_Ready(&Graph_Type) < 0 || fc_api_compiled_init(m) < 0) {
        return -1;
    }
    if (PyModule_AddObjectRef(m, "Graph", (PyObject *)&Graph_Type) < 0 ||
            PyModule_AddObjectRef(m, "Value", (PyObject *)&Value_Type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(m, api_methods);
}
