/* Graph API: fastcompile.graph.Graph, Value and Compiled.
 * In: Python calls (ops, attributes, arrays). Out: an FcGraph; at call time,
 * plans per segment and per input key, run from C. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

#include "../core/graph.h"
#include "../core/shape.h"
#include "../core/strbuf.h"
#include "../fc_numpy.h"
#include "../runtime/cuda.h"
#include "../runtime/plan.h"
#include "api.h"

/* ========================================================================
 * types
 * ====================================================================== */

typedef struct {
    PyObject_HEAD
    FcGraph g;
    PyObject *externs;        /* list of callables; extern nodes index it */
    PyObject *origin;         /* str "file:line" where the graph was made */
} GraphObject;

typedef struct {
    PyObject_HEAD
    GraphObject *graph;       /* owned */
    int node;
} ValueObject;

typedef struct {
    int level;                /* 0: before any extern */
    FcSegment seg;
} SegmentSlot;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    FcGraph g;                /* a private copy */
    PyObject *externs;        /* owned list */
    PyObject *origin;         /* owned str */
    PyObject *kernels;        /* owned list of kernel records */
    int *level;               /* per node */
    int nlevels;
    SegmentSlot *segs;        /* one per level */
    int nplans;
    double compile_ms;
} CompiledObject;

static PyTypeObject Graph_Type;
static PyTypeObject Value_Type;
static PyTypeObject Compiled_Type;

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

static PyObject *
caller_origin(void)
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
    self->origin = caller_origin();
    if (self->externs == NULL || self->origin == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
Graph_traverse(GraphObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->externs);
    return 0;
}

static int
Graph_clear(GraphObject *self)
{
    Py_CLEAR(self->externs);
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

/* obj: borrowed; dtype as a name, a NumPy dtype or a scalar type. -1 + TypeError */
static int
parse_dtype(PyObject *obj)
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
    static char *kwlist[] = {"dtype", "ndim", "device", NULL};
    PyObject *dtype;
    int ndim, *p;
    const char *device = "cpu";
    FcNode n;
    int idx;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oi|s:input", kwlist, &dtype, &ndim, &device)) {
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
    if ((n.dtype = parse_dtype(dtype)) < 0) {
        return NULL;
    }
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
        n.dtype = parse_dtype(dt);
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
            if ((a->cast_to = parse_dtype(val)) < 0) {
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

static PyObject *
Graph_extern(GraphObject *self, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    PyObject *fn, *nout_obj = NULL, *pure_obj = NULL, *result = NULL;
    int *in = NULL, idx = -1, pure = 0;
    long nout = -1;
    FcNode n;
    if (nargs < 1 || !PyCallable_Check(PyTuple_GET_ITEM(args, 0))) {
        PyErr_SetString(PyExc_TypeError, "extern(fn, *values, nout=None, pure=False): fn must be callable");
        return NULL;
    }
    if (kwargs != NULL) {
        nout_obj = PyDict_GetItemString(kwargs, "nout");
        pure_obj = PyDict_GetItemString(kwargs, "pure");
        if (PyDict_GET_SIZE(kwargs) > (nout_obj ? 1 : 0) + (pure_obj ? 1 : 0)) {
            PyErr_SetString(PyExc_TypeError, "extern() takes only the keyword arguments nout= and pure=");
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
    if (self->externs == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: this Graph was cleared by the garbage collector");
        return NULL;
    }
    in = PyMem_Malloc(nargs * sizeof(int));
    if (in == NULL) {
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

static PyObject *
dump_graph(const FcGraph *g)
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
    return dump_graph(&self->g);
}

static PyObject *compiled_new(GraphObject *graph);

static PyObject *
Graph_compile(GraphObject *self, PyObject *unused)
{
    return compiled_new(self);
}

static PyMethodDef Graph_methods[] = {
    {"input", (PyCFunction)(void (*)(void))Graph_input, METH_VARARGS | METH_KEYWORDS,
     "input(dtype, ndim, device='cpu') -> Value: an array argument of the compiled graph"},
    {"constant", (PyCFunction)Graph_constant, METH_O,
     "constant(value) -> Value: a scalar (Python scalars are weakly typed, as NumPy's NEP 50)"},
    {"call", (PyCFunction)(void (*)(void))Graph_call, METH_VARARGS | METH_KEYWORDS,
     "call(op_name, *values, **attrs) -> Value: a core op (see fastcompile.graph.ops())"},
    {"extern", (PyCFunction)(void (*)(void))Graph_extern, METH_VARARGS | METH_KEYWORDS,
     "extern(fn, *values, nout=None, pure=False) -> Value: call a Python function on the arrays at run time; "
     "pure=True: fn has no side effects, so it is not called when nothing uses its result"},
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
 * Compiled
 * ====================================================================== */

static int
add_unique(int **arr, int *n, int v)
{
    int *p;
    for (int i = 0; i < *n; i++) {
        if ((*arr)[i] == v) {
            return 0;
        }
    }
    p = PyMem_Realloc(*arr, (*n + 1) * sizeof(int));
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *arr = p;
    (*arr)[(*n)++] = v;
    return 0;
}

/* Levels are first as early as the inputs allow. A core op then moves down to
 * the earliest level that reads it (the level before, for an extern reader),
 * so it lands in its readers' segment and fuses with them instead of being
 * stored in an early segment and read back later: the backward of unbind,
 * masks made from an arange extern and applied after six more externs, wrote
 * three full-size bool arrays that way. Graph outputs stay where they are.
 * GIL held; 0, or -1 with MemoryError. */
static int
sink_levels(CompiledObject *c, const char *live)
{
    const FcGraph *g = &c->g;
    int *bound = PyMem_Malloc((g->nnodes + 1) * sizeof(int));
    if (bound == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < g->nnodes; i++) {
        bound[i] = INT_MAX;
    }
    for (int k = 0; k < g->noutputs; k++) {
        bound[g->outputs[k]] = c->level[g->outputs[k]];
    }
    for (int i = g->nnodes - 1; i >= 0; i--) {      /* readers come after what they read */
        const FcNode *n = &g->nodes[i];
        int calls = n->op == FC_OP_EXTERN || n->op == FC_OP_ITEM;   /* runs before its level's kernels */
        int movable = !calls && n->op != FC_OP_INPUT && n->op != FC_OP_CONST;
        if (!live[i]) {
            continue;
        }
        if (movable && bound[i] != INT_MAX && bound[i] > c->level[i]) {
            c->level[i] = bound[i];
        }
        for (int j = 0; j < n->nin; j++) {
            int u = n->in[j], b = calls ? c->level[i] - 1 : c->level[i];
            bound[u] = b < bound[u] ? b : bound[u];
        }
    }
    PyMem_Free(bound);
    return 0;
}

/* Levels: externs split the graph; segment L runs after the externs of level L.
 * Dead nodes get level -1: neither computed nor called. A node is live when an
 * output needs it, or it is an extern not declared pure (it may act). */
static int
build_segments(CompiledObject *c)
{
    const FcGraph *g = &c->g;
    int maxl = 0;
    char *live;
    c->level = PyMem_Calloc(g->nnodes + 1, sizeof(int));
    live = PyMem_Calloc(g->nnodes + 1, 1);
    if (c->level == NULL || live == NULL) {
        PyMem_Free(live);
        PyErr_NoMemory();
        return -1;
    }
    for (int k = 0; k < g->noutputs; k++) {
        live[g->outputs[k]] = 1;
    }
    for (int i = g->nnodes - 1; i >= 0; i--) {      /* nodes are in topological order */
        const FcNode *n = &g->nodes[i];
        if (n->op == FC_OP_EXTERN && !n->pure) {
            live[i] = 1;
        }
        for (int j = 0; live[i] && j < n->nin; j++) {
            live[n->in[j]] = 1;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const FcNode *n = &g->nodes[i];
        int l = 0;
        for (int j = 0; j < n->nin; j++) {
            l = c->level[n->in[j]] > l ? c->level[n->in[j]] : l;
        }
        if (n->op == FC_OP_EXTERN) {
            l += 1;
        }
        c->level[i] = live[i] ? l : -1;       /* a live node's inputs are live */
        maxl = live[i] && l > maxl ? l : maxl;
    }
    if (sink_levels(c, live) < 0) {
        PyMem_Free(live);
        return -1;
    }
    PyMem_Free(live);
    c->nlevels = maxl + 1;
    c->segs = PyMem_Calloc(c->nlevels, sizeof(SegmentSlot));
    if (c->segs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int L = 0; L < c->nlevels; L++) {
        FcSegment *seg = &c->segs[L].seg;
        c->segs[L].level = L;
        seg->in_seg = PyMem_Calloc(g->nnodes + 1, 1);
        if (seg->in_seg == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (int i = 0; i < g->nnodes; i++) {
            int op = g->nodes[i].op;
            seg->in_seg[i] = c->level[i] == L && op != FC_OP_INPUT && op != FC_OP_EXTERN && op != FC_OP_ITEM;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const FcNode *n = &g->nodes[i];
        for (int j = 0; j < n->nin && c->level[i] >= 0; j++) {
            int u = n->in[j];
            int op_u = g->nodes[u].op;
            if (op_u == FC_OP_CONST) {
                continue;
            }
            /* i reads u: u enters i's segment from outside, or leaves u's segment */
            if (op_u != FC_OP_INPUT && op_u != FC_OP_EXTERN && op_u != FC_OP_ITEM) {
                FcSegment *su = &c->segs[c->level[u]].seg;
                int same = n->op != FC_OP_EXTERN && n->op != FC_OP_ITEM && c->level[i] == c->level[u];
                if (!same && add_unique(&su->outputs, &su->noutputs, u) < 0) {
                    return -1;
                }
            }
            if (n->op != FC_OP_EXTERN && n->op != FC_OP_ITEM) {
                FcSegment *si = &c->segs[c->level[i]].seg;
                if (!si->in_seg[u] && add_unique(&si->inputs, &si->ninputs, u) < 0) {
                    return -1;
                }
            }
        }
    }
    for (int k = 0; k < g->noutputs; k++) {
        int v = g->outputs[k];
        int op = g->nodes[v].op;
        if (op != FC_OP_INPUT && op != FC_OP_EXTERN && op != FC_OP_ITEM && op != FC_OP_CONST) {
            FcSegment *sv = &c->segs[c->level[v]].seg;
            if (add_unique(&sv->outputs, &sv->noutputs, v) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

static PyObject *Compiled_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw);

static PyObject *
compiled_new(GraphObject *graph)
{
    CompiledObject *c;
    if (graph->externs == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: this Graph was cleared by the garbage collector");
        return NULL;
    }
    if (graph->g.noutputs == 0) {
        PyErr_SetString(PyExc_ValueError, "fastcompile: the graph has no outputs; call Graph.output(...) first");
        return NULL;
    }
    if (fc_graph_verify(&graph->g) < 0) {
        return NULL;
    }
    c = PyObject_GC_New(CompiledObject, &Compiled_Type);
    if (c == NULL) {
        return NULL;
    }
    c->vectorcall = Compiled_vectorcall;
    memset(&c->g, 0, sizeof(c->g));
    c->externs = NULL;
    c->origin = NULL;
    c->kernels = NULL;
    c->level = NULL;
    c->segs = NULL;
    c->nlevels = 0;
    c->nplans = 0;
    c->compile_ms = 0;
    PyObject_GC_Track(c);
    if (fc_graph_copy(&c->g, &graph->g) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    c->externs = PyList_GetSlice(graph->externs, 0, PyList_GET_SIZE(graph->externs));
    c->origin = caller_origin();
    c->kernels = PyList_New(0);
    if (c->externs == NULL || c->origin == NULL || c->kernels == NULL || build_segments(c) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

static int
Compiled_traverse(CompiledObject *c, visitproc visit, void *arg)
{
    Py_VISIT(c->externs);
    Py_VISIT(c->kernels);
    return 0;
}

static int
Compiled_clear(CompiledObject *c)
{
    Py_CLEAR(c->externs);
    Py_CLEAR(c->kernels);
    return 0;
}

static void
Compiled_dealloc(CompiledObject *c)
{
    PyObject_GC_UnTrack(c);
    Compiled_clear(c);
    Py_XDECREF(c->origin);
    for (int L = 0; L < c->nlevels && c->segs; L++) {
        FcSegment *seg = &c->segs[L].seg;
        FcPlan *p = seg->plans;
        while (p != NULL) {
            FcPlan *next = p->next;
            fc_plan_free(p);
            p = next;
        }
        PyMem_Free(seg->in_seg);
        PyMem_Free(seg->inputs);
        PyMem_Free(seg->outputs);
    }
    PyMem_Free(c->segs);
    PyMem_Free(c->level);
    fc_graph_free(&c->g);
    PyObject_GC_Del(c);
}

/* a record for Compiled.kernels; returns a new reference */
static PyObject *
kernel_record(const FcPlanKernel *pk, const FcPlan *p)
{
    PyObject *types = PyImport_ImportModule("types"), *ns = NULL, *kw = NULL, *empty = NULL;
    if (types == NULL) {
        return NULL;
    }
    kw = Py_BuildValue("{s:s,s:s,s:s,s:s,s:s,s:s}", "name", pk->name, "source", pk->source,
                       "path", pk->loaded.c_path, "so_path", pk->loaded.so_path,
                       "key", pk->loaded.key, "fused", p->dump);
    ns = PyObject_GetAttrString(types, "SimpleNamespace");
    empty = PyTuple_New(0);
    if (kw != NULL && ns != NULL && empty != NULL) {
        PyObject *r = PyObject_Call(ns, empty, kw);
        Py_DECREF(kw);
        Py_DECREF(ns);
        Py_DECREF(empty);
        Py_DECREF(types);
        return r;
    }
    Py_XDECREF(kw);
    Py_XDECREF(ns);
    Py_XDECREF(empty);
    Py_DECREF(types);
    return NULL;
}

static FcPlan *
find_plan(CompiledObject *c, FcSegment *seg, PyObject **vals)
{
    FcMeta stack[16], *metas = stack;
    FcPlan *p, *prev = NULL;
    if (seg->ninputs > 16) {
        metas = PyMem_Malloc(seg->ninputs * sizeof(FcMeta));
        if (metas == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    memset(metas, 0, (seg->ninputs ? seg->ninputs : 1) * sizeof(FcMeta));
    for (int k = 0; k < seg->ninputs; k++) {
        PyObject *a = vals[seg->inputs[k]];
        if (fc_plan_meta(a, &metas[k]) < 0) {
            p = NULL;
            goto done;
        }
    }
    for (p = seg->plans; p != NULL; prev = p, p = p->next) {
        if (memcmp(p->metas, metas, seg->ninputs * sizeof(FcMeta)) == 0) {
            if (prev != NULL) {   /* most recently used first */
                prev->next = p->next;
                p->next = seg->plans;
                seg->plans = p;
            }
            goto done;
        }
    }
    p = fc_plan_build(&c->g, seg, metas, PyUnicode_AsUTF8(c->origin));
    if (p != NULL) {
        p->next = seg->plans;
        seg->plans = p;
        seg->nplans++;
        c->nplans++;
        c->compile_ms += p->compile_ms;
        for (int k = 0; k < p->nkernels; k++) {
            PyObject *rec = kernel_record(&p->kernels[k], p);
            if (rec == NULL || PyList_Append(c->kernels, rec) < 0) {
                Py_XDECREF(rec);
                p = NULL;   /* the plan stays cached; this call fails */
                goto done;
            }
            Py_DECREF(rec);
        }
    }
done:
    if (metas != stack) {
        PyMem_Free(metas);
    }
    return p;
}

static PyObject *
as_array(PyObject *obj)
{
    if (PyArray_Check(obj)) {
        PyArrayObject *a = (PyArrayObject *)obj;
        if (PyArray_ISALIGNED(a)) {
            Py_INCREF(obj);
            return obj;
        }
        return PyArray_NewCopy(a, NPY_CORDER);
    }
    return PyArray_FROM_O(obj);
}

static PyObject *
const_array(const FcNode *n)
{
    PyObject *v, *r;
    if (n->ckind == FC_CONST_FLOAT) {
        v = PyFloat_FromDouble(n->fval);
    }
    else if (n->ckind == FC_CONST_BOOL) {
        v = PyBool_FromLong((long)n->ival);
    }
    else {
        v = PyLong_FromLongLong(n->ival);
    }
    if (v == NULL) {
        return NULL;
    }
    r = PyArray_FROM_O(v);
    Py_DECREF(v);
    if (r != NULL && !n->weak) {
        PyObject *cast = PyArray_Cast((PyArrayObject *)r, fc_plan_typenum(n->dtype));
        Py_DECREF(r);
        r = cast;
    }
    return r;
}

static int
run_extern(CompiledObject *c, int e, PyObject **vals)
{
    const FcNode *n = &c->g.nodes[e];
    PyObject *args = PyTuple_New(n->nin), *res = NULL;
    int rc = -1;
    if (args == NULL) {
        return -1;
    }
    for (int j = 0; j < n->nin; j++) {
        int u = n->in[j];
        PyObject *a = vals[u];
        if (a == NULL && c->g.nodes[u].op == FC_OP_CONST) {
            if ((vals[u] = const_array(&c->g.nodes[u])) == NULL) {
                goto done;
            }
            a = vals[u];
        }
        Py_INCREF(a);
        PyTuple_SET_ITEM(args, j, a);
    }
    res = PyObject_Call(PyList_GET_ITEM(c->externs, n->extern_index), args, NULL);
    if (res == NULL) {
        goto done;
    }
    if (n->item < 0) {
        Py_XSETREF(vals[e], as_array(res));
        rc = vals[e] ? 0 : -1;
        goto done;
    }
    if (!PyTuple_Check(res) && !PyList_Check(res)) {
        PyErr_Format(PyExc_TypeError, "fastcompile: extern %R was declared nout=%d but returned %.100s",
                     PyList_GET_ITEM(c->externs, n->extern_index), n->item, Py_TYPE(res)->tp_name);
        goto done;
    }
    if (PySequence_Size(res) != n->item) {
        PyErr_Format(PyExc_ValueError, "fastcompile: extern %R was declared nout=%d but returned %zd values",
                     PyList_GET_ITEM(c->externs, n->extern_index), n->item, PySequence_Size(res));
        goto done;
    }
    /* the items are the nodes right after the extern */
    for (int i = e + 1; i < c->g.nnodes; i++) {
        const FcNode *it = &c->g.nodes[i];
        if (it->op == FC_OP_ITEM && it->in[0] == e) {
            PyObject *x = PySequence_GetItem(res, it->item);
            if (x == NULL) {
                goto done;
            }
            Py_XSETREF(vals[i], as_array(x));
            Py_DECREF(x);
            if (vals[i] == NULL) {
                goto done;
            }
        }
    }
    rc = 0;
done:
    Py_XDECREF(res);
    Py_DECREF(args);
    return rc;
}

static int
check_input(CompiledObject *c, int k, PyObject *arg, PyObject **slot)
{
    const FcNode *n = &c->g.nodes[c->g.inputs[k]];
    FcMeta m;
    PyObject *a;
    if (!PyArray_Check(arg)) {
        if (fc_cuda_check_host(arg) < 0) {   /* a CUDA array: say why it cannot run */
            return -1;
        }
        PyErr_Format(PyExc_TypeError, "fastcompile: argument %d must be a numpy.ndarray, got %.100s",
                     k, Py_TYPE(arg)->tp_name);
        return -1;
    }
    if ((a = as_array(arg)) == NULL) {
        return -1;
    }
    if (fc_plan_meta(a, &m) < 0) {
        Py_DECREF(a);
        return -1;
    }
    if (m.dtype != n->dtype) {
        PyErr_Format(PyExc_TypeError, "fastcompile: argument %d was declared %s but is an array of %s",
                     k, fc_dtypes[n->dtype].name, fc_dtypes[m.dtype].name);
        Py_DECREF(a);
        return -1;
    }
    if (m.ndim != n->ndim) {
        PyErr_Format(PyExc_ValueError, "fastcompile: argument %d was declared with ndim=%d but has ndim=%d",
                     k, n->ndim, m.ndim);
        Py_DECREF(a);
        return -1;
    }
    *slot = a;
    return 0;
}

#define FC_STACK_VALS 128

static PyObject *
Compiled_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    CompiledObject *c = (CompiledObject *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *stack[FC_STACK_VALS], **vals = stack, *result = NULL;
    int nn = c->g.nnodes;

    if (kw != NULL && PyTuple_GET_SIZE(kw) != 0) {
        PyErr_SetString(PyExc_TypeError, "fastcompile: a compiled graph takes positional arrays only");
        return NULL;
    }
    if (nargs != c->g.ninputs) {
        PyErr_Format(PyExc_TypeError, "fastcompile: the compiled graph takes %d array%s, got %zd",
                     c->g.ninputs, c->g.ninputs == 1 ? "" : "s", nargs);
        return NULL;
    }
    if (nn > FC_STACK_VALS) {
        vals = PyMem_Malloc(nn * sizeof(PyObject *));
        if (vals == NULL) {
            return PyErr_NoMemory();
        }
    }
    memset(vals, 0, nn * sizeof(PyObject *));
    for (int k = 0; k < c->g.ninputs; k++) {
        if (check_input(c, k, args[k], &vals[c->g.inputs[k]]) < 0) {
            goto done;
        }
    }
    for (int L = 0; L < c->nlevels; L++) {
        FcSegment *seg = &c->segs[L].seg;
        FcPlan *p;
        if (L > 0) {
            for (int i = 0; i < nn; i++) {
                if (c->g.nodes[i].op == FC_OP_EXTERN && c->level[i] == L && run_extern(c, i, vals) < 0) {
                    goto done;
                }
            }
        }
        if (seg->noutputs == 0) {
            continue;
        }
        if ((p = find_plan(c, seg, vals)) == NULL || fc_plan_run(p, vals) < 0) {
            goto done;
        }
    }
    result = PyTuple_New(c->g.noutputs);
    if (result == NULL) {
        goto done;
    }
    for (int k = 0; k < c->g.noutputs; k++) {
        int v = c->g.outputs[k];
        PyObject *o = vals[v];
        if (o == NULL && c->g.nodes[v].op == FC_OP_CONST) {
            o = const_array(&c->g.nodes[v]);
        }
        else {
            Py_XINCREF(o);
        }
        if (o == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_SystemError, "fastcompile: output %d was never computed", k);
            }
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, k, o);
    }
done:
    for (int i = 0; i < nn; i++) {
        Py_XDECREF(vals[i]);
    }
    if (vals != stack) {
        PyMem_Free(vals);
    }
    return result;
}

static PyObject *
Compiled_get_kernels(CompiledObject *c, void *closure)
{
    return PyList_GetSlice(c->kernels, 0, PyList_GET_SIZE(c->kernels));
}

static PyObject *
Compiled_get_graph(CompiledObject *c, void *closure)
{
    return dump_graph(&c->g);
}

static PyObject *
Compiled_get_fused(CompiledObject *c, void *closure)
{
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (int L = 0; L < c->nlevels; L++) {
        for (FcPlan *p = c->segs[L].seg.plans; p != NULL; p = p->next) {
            PyObject *s = PyUnicode_FromString(p->dump);
            if (s == NULL || PyList_Append(out, s) < 0) {
                Py_XDECREF(s);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(s);
        }
    }
    return out;
}

static PyObject *
Compiled_get_nplans(CompiledObject *c, void *closure)
{
    return PyLong_FromLong(c->nplans);
}

static PyObject *
Compiled_get_compile_ms(CompiledObject *c, void *closure)
{
    return PyFloat_FromDouble(c->compile_ms);
}

static PyObject *
Compiled_get_origin(CompiledObject *c, void *closure)
{
    Py_INCREF(c->origin);
    return c->origin;
}

/* Compiled._cuda_render(*arrays) -> [{name, source, ...}]: the CUDA source
 * of every kernel of the specialization the arrays (NumPy, any device-free
 * stand-ins with the wanted dtype, rank, size-1 dims and contiguity) select.
 * Renders only: no compile, no device. Graphs with extern calls are refused.
 * args: borrowed; returns: new reference. */
static PyObject *
Compiled_cuda_render(CompiledObject *c, PyObject *args)
{
    FcSegment *seg;
    FcMeta *metas = NULL;
    PyObject **arrs = NULL, *r = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (c->nlevels != 1) {
        PyErr_SetString(PyExc_NotImplementedError, "fastcompile: _cuda_render takes graphs without extern calls");
        return NULL;
    }
    if (n != c->g.ninputs) {
        PyErr_Format(PyExc_TypeError, "fastcompile: the graph takes %d inputs, got %zd", c->g.ninputs, n);
        return NULL;
    }
    seg = &c->segs[0].seg;
    metas = PyMem_Calloc(seg->ninputs + 1, sizeof(FcMeta));
    arrs = PyMem_Calloc(c->g.nnodes + 1, sizeof(PyObject *));
    if (metas == NULL || arrs == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int node = c->g.inputs[i];
        PyObject *arg = PyTuple_GET_ITEM(args, i);
        if (PyTuple_Check(arg)) {
            /* (dtype, ndim[, size-1 mask[, contiguous]]): no array needed (bfloat16) */
            Py_INCREF(arg);
            arrs[node] = arg;
        }
        else if ((arrs[node] = as_array(arg)) == NULL) {
            goto cleanup;
        }
    }
    for (int k = 0; k < seg->ninputs; k++) {
        PyObject *a = arrs[seg->inputs[k]];
        if (a != NULL && PyTuple_Check(a)) {
            PyObject *dt;
            unsigned int ones = 0;
            int contig = 1;
            if (!PyArg_ParseTuple(a, "Oi|Ip", &dt, &metas[k].ndim, &ones, &contig) ||
                    (metas[k].dtype = parse_dtype(dt)) < 0) {
                goto cleanup;
            }
            metas[k].ones = ones;
            metas[k].contig = contig;
            continue;
        }
        if (a == NULL) {
            PyErr_SetString(PyExc_NotImplementedError, "fastcompile: _cuda_render: a segment input is not a graph input");
            goto cleanup;
        }
        if (fc_plan_meta(a, &metas[k]) < 0) {
            goto cleanup;
        }
    }
    r = fc_plan_render_cuda(&c->g, seg, metas, PyUnicode_AsUTF8(c->origin));
cleanup:
    for (int i = 0; arrs != NULL && i < c->g.nnodes; i++) {
        Py_XDECREF(arrs[i]);
    }
    PyMem_Free(arrs);
    PyMem_Free(metas);
    return r;
}

static PyMethodDef Compiled_methods[] = {
    {"_cuda_render", (PyCFunction)Compiled_cuda_render, METH_VARARGS,
     "_cuda_render(*arrays) -> list of {name, source, ...}: CUDA source per kernel (tests)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Compiled_getset[] = {
    {"kernels", (getter)Compiled_get_kernels, NULL,
     "kernels built so far: name, source, path (.c), so_path, key, fused", NULL},
    {"graph", (getter)Compiled_get_graph, NULL, "the graph as text", NULL},
    {"fused", (getter)Compiled_get_fused, NULL, "each plan's fused kernels as text", NULL},
    {"nplans", (getter)Compiled_get_nplans, NULL, "specializations built (one per input key and segment)", NULL},
    {"compile_ms", (getter)Compiled_get_compile_ms, NULL, "total time spent building plans", NULL},
    {"origin", (getter)Compiled_get_origin, NULL, "file:line where compile() was called", NULL},
    {NULL},
};

static PyTypeObject Compiled_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile.graph.Compiled",
    .tp_basicsize = sizeof(CompiledObject),
    .tp_dealloc = (destructor)Compiled_dealloc,
    .tp_vectorcall_offset = offsetof(CompiledObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A compiled graph: call it with NumPy arrays; returns a tuple of arrays.",
    .tp_traverse = (traverseproc)Compiled_traverse,
    .tp_clear = (inquiry)Compiled_clear,
    .tp_methods = Compiled_methods,
    .tp_getset = Compiled_getset,
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
    if (PyType_Ready(&Value_Type) < 0 || PyType_Ready(&Graph_Type) < 0 ||
            PyType_Ready(&Compiled_Type) < 0) {
        return -1;
    }
    if (PyModule_AddObjectRef(m, "Graph", (PyObject *)&Graph_Type) < 0 ||
            PyModule_AddObjectRef(m, "Value", (PyObject *)&Value_Type) < 0 ||
            PyModule_AddObjectRef(m, "Compiled", (PyObject *)&Compiled_Type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(m, api_methods);
}
