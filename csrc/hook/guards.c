/* Hook guards: a flat program of loads and checks over a frame's fast locals.
 * In: a list of instruction tuples (built by the tracer). Out: FcHookGuards,
 * run by the hook on every call before a cache entry may be used.
 *
 * Registers hold strong references for the length of one check and are all
 * released at its end. No check raises: an exception while checking is
 * cleared and counts as a failure. Only the "tensor" check may run Python code
 * (it reads attributes and calls is_contiguous(); torch implements these in C). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>

#include "../fc_numpy.h"
#include "hook.h"

#define FC_GUARD_MAX_REGS 256   /* one per guarded source; a model with many parameters needs many */

typedef enum {
    G_LOCAL, G_GLOBAL, G_CLOSURE, G_CONST, G_CALL0, G_ITEM, G_DICTATTR, G_TYPE_OF, G_TYPEATTR, G_SLOTATTR,
    G_FUNCATTR,
    G_TYPE, G_ID, G_EQ, G_LEN, G_NDARRAY, G_TENSOR, G_DIM, G_NOATTR, G_NOTYPEATTR,
} GuardOp;

static const struct {
    const char *name;
    int arity;          /* tuple length, the op name included */
    int is_load;
} guard_ops[] = {
    [G_LOCAL] = {"local", 3, 1},
    [G_GLOBAL] = {"global", 3, 1},
    [G_CLOSURE] = {"closure", 3, 1},
    [G_CONST] = {"const", 3, 1},
    [G_CALL0] = {"call0", 3, 1},
    [G_ITEM] = {"item", 4, 1},
    [G_DICTATTR] = {"dictattr", 4, 1},
    [G_TYPE_OF] = {"type_of", 3, 1},
    [G_TYPEATTR] = {"typeattr", 4, 1},
    [G_SLOTATTR] = {"slotattr", 4, 1},
    [G_FUNCATTR] = {"funcattr", 4, 1},
    [G_TYPE] = {"type", 3, 0},
    [G_ID] = {"id", 3, 0},
    [G_EQ] = {"eq", 3, 0},
    [G_LEN] = {"len", 3, 0},
    [G_NDARRAY] = {"ndarray", 6, 0},
    [G_TENSOR] = {"tensor", 8, 0},
    [G_DIM] = {"dim", 4, 0},
    [G_NOATTR] = {"noattr", 3, 0},
    [G_NOTYPEATTR] = {"notypeattr", 3, 0},
};
#define G_NOPS ((int)(sizeof(guard_ops) / sizeof(guard_ops[0])))

typedef struct {
    GuardOp op;
    int reg;            /* destination (loads) or checked register */
    int src;            /* source register (item, dictattr, type_of, typeattr, slotattr) */
    Py_ssize_t n;       /* slot, closure index, int key, length, ndim, dim axis */
    Py_ssize_t size;    /* dim: the size shape[n] must have */
    int has_n;          /* item: key is an int (tuple/list index) */
    uint64_t mask;      /* size-1 pattern */
    int contig;         /* 0 any, 1 C-contiguous, 2 not C-contiguous */
    int flag;           /* tensor: requires_grad */
    PyObject *a;        /* owned: name, key, type, object, value, dtype */
    PyObject *b;        /* owned: tensor device */
} GuardInstr;

struct FcHookGuards {
    PyObject_HEAD
    GuardInstr *code;   /* PyMem */
    Py_ssize_t n;
    int nregs;
    PyObject *program;  /* owned tuple: the instructions as given */
};

static PyObject *str_dtype, *str_device, *str_requires_grad, *str_shape, *str_is_contiguous;

/* ========================================================================
 * frame view
 * ====================================================================== */

PyObject *
fc_hook_view_slot(const FcHookView *v, Py_ssize_t i)
{
    PyCodeObject *co = v->code;
    if (i < 0 || i >= co->co_nlocalsplus) {
        return NULL;
    }
    Py_ssize_t firstfree = co->co_nlocalsplus - co->co_nfreevars;
    if (i < firstfree) {
        return v->slots[i];
    }
    if (v->closure == NULL || i - firstfree >= PyTuple_GET_SIZE(v->closure)) {
        return NULL;
    }
    PyObject *cell = PyTuple_GET_ITEM(v->closure, i - firstfree);
    return PyCell_Check(cell) ? PyCell_GET(cell) : NULL;
}

/* ========================================================================
 * construction
 * ====================================================================== */

/* A NumPy scalar "eq" compares by its bytes: bool, integer or floating, at most 8 bytes
 * (long double has padding bytes). */
static int
np_scalar_ok(PyObject *v)
{
    if (!(PyArray_IsScalar(v, Bool) || PyArray_IsScalar(v, Integer) || PyArray_IsScalar(v, Floating))) {
        return 0;
    }
    PyArray_Descr *d = PyArray_DescrFromScalar(v);
    if (d == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = PyDataType_ELSIZE(d) <= 8;
    Py_DECREF(d);
    return ok;
}

/* Values "eq" may compare: None/bool/int/float/complex/str/bytes, NumPy's numeric scalars,
 * ranges, and tuples (namedtuples too), slices and frozensets of those. None of their
 * comparisons runs Python code. */
static int
eq_value_ok(PyObject *v)
{
    if (v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v) ||
            PyComplex_CheckExact(v) || PyUnicode_CheckExact(v) || PyBytes_CheckExact(v) ||
            PyRange_Check(v) || np_scalar_ok(v)) {
        return 1;
    }
    if (PySlice_Check(v)) {
        PySliceObject *sl = (PySliceObject *)v;
        return eq_value_ok(sl->start) && eq_value_ok(sl->stop) && eq_value_ok(sl->step);
    }
    if (PyFrozenSet_CheckExact(v)) {
        PyObject *it = PyObject_GetIter(v), *key;    /* a set's iterator runs no Python code */
        int ok = it != NULL;
        while (ok && (key = PyIter_Next(it)) != NULL) {
            ok = eq_value_ok(key);
            Py_DECREF(key);
        }
        Py_XDECREF(it);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
        }
        return ok;
    }
    if (PyTuple_Check(v) && (PyTuple_CheckExact(v) || Py_TYPE(v)->tp_richcompare == PyTuple_Type.tp_richcompare)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++) {
            if (!eq_value_ok(PyTuple_GET_ITEM(v, i))) {
                return 0;
            }
        }
        return 1;
    }
    return 0;
}

static int
parse_nonneg(PyObject *o, Py_ssize_t idx, const char *what, Py_ssize_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "guard #%zd: %s must be an int, not %.100s", idx, what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    Py_ssize_t v = PyLong_AsSsize_t(o);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "guard #%zd: %s must be >= 0", idx, what);
        return -1;
    }
    *out = v;
    return 0;
}

static int
parse_reg(PyObject *o, Py_ssize_t idx, const unsigned char *written, int must_be_written, int *out)
{
    Py_ssize_t r;
    if (parse_nonneg(o, idx, "register", &r) < 0) {
        return -1;
    }
    if (r >= FC_GUARD_MAX_REGS) {
        PyErr_Format(PyExc_ValueError, "guard #%zd: bad register %zd (at most %d registers)", idx, r,
                     FC_GUARD_MAX_REGS);
        return -1;
    }
    if (must_be_written && !written[r]) {
        PyErr_Format(PyExc_ValueError, "guard #%zd: bad register %zd (read before any load)", idx, r);
        return -1;
    }
    *out = (int)r;
    return 0;
}

static int
parse_mask_contig(PyObject *mask, PyObject *contig, Py_ssize_t ndim, Py_ssize_t idx, GuardInstr *in)
{
    if (ndim > 64) {
        PyErr_Format(PyExc_ValueError, "guard #%zd: ndim %zd > 64", idx, ndim);
        return -1;
    }
    if (!PyLong_Check(mask)) {
        PyErr_Format(PyExc_TypeError, "guard #%zd: size1_mask must be an int", idx);
        return -1;
    }
    unsigned long long m = PyLong_AsUnsignedLongLong(mask);
    if (m == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t c;
    if (parse_nonneg(contig, idx, "contig", &c) < 0) {
        return -1;
    }
    if (c > 2) {
        PyErr_Format(PyExc_ValueError, "guard #%zd: contig must be 0, 1 or 2", idx);
        return -1;
    }
    in->mask = (uint64_t)m;
    in->contig = (int)c;
    return 0;
}

/* Parses instruction `t` (index idx) into `in`. Returns 0, or -1 with an
 * exception set. t: borrowed; in->a/in->b receive new references. */
static int
guard_parse(PyObject *t, Py_ssize_t idx, unsigned char *written, GuardInstr *in)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(t, 0))) {
        PyErr_Format(PyExc_ValueError, "guard #%zd: expected a tuple (op, reg, ...), got %R", idx, t);
        return -1;
    }
    int op = -1;
    for (int k = 0; k < G_NOPS; k++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(t, 0), guard_ops[k].name) == 0) {
            op = k;
            break;
        }
    }
    if (op < 0) {
        PyErr_Format(PyExc_ValueError, "guard #%zd: unknown op %R", idx, PyTuple_GET_ITEM(t, 0));
        return -1;
    }
    if (PyTuple_GET_SIZE(t) != guard_ops[op].arity) {
        PyErr_Format(PyExc_ValueError, "guard #%zd: %s takes %d fields, got %zd", idx, guard_ops[op].name,
                     guard_ops[op].arity, PyTuple_GET_SIZE(t));
        return -1;
    }
    in->op = (GuardOp)op;
    PyObject *x1 = PyTuple_GET_SIZE(t) > 2 ? PyTuple_GET_ITEM(t, 2) : NULL;
    if (parse_reg(PyTuple_GET_ITEM(t, 1), idx, written, !guard_ops[op].is_load, &in->reg) < 0) {
        return -1;
    }
    switch (in->op) {
    case G_LOCAL:
        if (parse_nonneg(x1, idx, "slot", &in->n) < 0) {
            return -1;
        }
        break;
    case G_CLOSURE:
        if (parse_nonneg(x1, idx, "closure index", &in->n) < 0) {
            return -1;
        }
        break;
    case G_GLOBAL:
        if (!PyUnicode_Check(x1)) {
            PyErr_Format(PyExc_TypeError, "guard #%zd: global name must be a str", idx);
            return -1;
        }
        in->a = Py_NewRef(x1);
        PyUnicode_InternInPlace(&in->a);
        break;
    case G_ITEM:
    case G_DICTATTR:
    case G_TYPEATTR:
    case G_SLOTATTR:
    case G_FUNCATTR: {
        if (parse_reg(x1, idx, written, 1, &in->src) < 0) {
            return -1;
        }
        PyObject *key = PyTuple_GET_ITEM(t, 3);
        if (in->op != G_ITEM && !PyUnicode_Check(key)) {
            PyErr_Format(PyExc_TypeError, "guard #%zd: %s name must be a str", idx, guard_ops[in->op].name);
            return -1;
        }
        if (in->op == G_FUNCATTR) {     /* n: 1 __defaults__, 2 __kwdefaults__ */
            in->n = PyUnicode_CompareWithASCIIString(key, "__defaults__") == 0 ? 1
                    : PyUnicode_CompareWithASCIIString(key, "__kwdefaults__") == 0 ? 2 : 0;
            if (in->n == 0) {
                PyErr_Format(PyExc_ValueError, "guard #%zd: funcattr reads __defaults__ or __kwdefaults__", idx);
                return -1;
            }
        }
        if (PyObject_Hash(key) == -1) {
            return -1;
        }
        if (in->op == G_ITEM && PyLong_CheckExact(key)) {
            in->n = PyLong_AsSsize_t(key);
            if (in->n == -1 && PyErr_Occurred()) {
                PyErr_Clear();   /* too big for an index: only a dict can match */
            }
            else {
                in->has_n = 1;
            }
        }
        in->a = Py_NewRef(key);
        if (in->op != G_ITEM) {
            PyUnicode_InternInPlace(&in->a);
        }
        break;
    }
    case G_NOATTR:
    case G_NOTYPEATTR:
        if (!PyUnicode_Check(x1)) {
            PyErr_Format(PyExc_TypeError, "guard #%zd: %s name must be a str", idx, guard_ops[in->op].name);
            return -1;
        }
        in->a = Py_NewRef(x1);
        PyUnicode_InternInPlace(&in->a);
        break;
    case G_TYPE_OF:
        if (parse_reg(x1, idx, written, 1, &in->src) < 0) {
            return -1;
        }
        break;
    case G_TYPE:
        if (!PyType_Check(x1)) {
            PyErr_Format(PyExc_TypeError, "guard #%zd: type needs a type, got %.100s", idx,
                         Py_TYPE(x1)->tp_name);
            return -1;
        }
        in->a = Py_NewRef(x1);
        break;
    case G_ID:
    case G_CONST:
        in->a = Py_NewRef(x1);
        break;
    case G_CALL0:
        if (!PyCallable_Check(x1)) {
            PyErr_Format(PyExc_TypeError, "guard #%zd: call0 needs a callable", idx);
            return -1;
        }
        in->a = Py_NewRef(x1);
        break;
    case G_EQ:
        if (!eq_value_ok(x1)) {
            PyErr_Format(PyExc_TypeError,
                         "guard #%zd: eq compares None/bool/int/float/str/bytes and tuples of them, "
                         "not %.100s", idx, Py_TYPE(x1)->tp_name);
            return -1;
        }
        in->a = Py_NewRef(x1);
        break;
    case G_LEN:
        if (parse_nonneg(x1, idx, "length", &in->n) < 0) {
            return -1;
        }
        break;
    case G_DIM:
        if (parse_nonneg(x1, idx, "axis", &in->n) < 0 ||
                parse_nonneg(PyTuple_GET_ITEM(t, 3), idx, "size", &in->size) < 0) {
            return -1;
        }
        break;
    case G_NDARRAY: {
        PyArray_Descr *d = NULL;
        if (!PyArray_DescrConverter(x1, &d)) {
            return -1;
        }
        in->a = (PyObject *)d;
        if (parse_nonneg(PyTuple_GET_ITEM(t, 3), idx, "ndim", &in->n) < 0 ||
                parse_mask_contig(PyTuple_GET_ITEM(t, 4), PyTuple_GET_ITEM(t, 5), in->n, idx, in) < 0) {
            return -1;
        }
        break;
    }
    case G_TENSOR: {
        in->a = Py_NewRef(x1);
        if (parse_nonneg(PyTuple_GET_ITEM(t, 3), idx, "ndim", &in->n) < 0 ||
                parse_mask_contig(PyTuple_GET_ITEM(t, 4), PyTuple_GET_ITEM(t, 5), in->n, idx, in) < 0) {
            return -1;
        }
        in->b = Py_NewRef(PyTuple_GET_ITEM(t, 6));
        int rg = PyObject_IsTrue(PyTuple_GET_ITEM(t, 7));
        if (rg < 0) {
            return -1;
        }
        in->flag = rg;
        break;
    }
    }
    if (guard_ops[op].is_load) {
        written[in->reg] = 1;
    }
    return 0;
}

static void
guards_free_code(FcHookGuards *g)
{
    for (Py_ssize_t i = 0; i < g->n; i++) {
        Py_CLEAR(g->code[i].a);
        Py_CLEAR(g->code[i].b);
    }
    PyMem_Free(g->code);
    g->code = NULL;
    g->n = 0;
}

static PyObject *
Guards_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"program", NULL};
    PyObject *program = NULL, *seq = NULL;
    FcHookGuards *g = NULL;
    unsigned char written[FC_GUARD_MAX_REGS] = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Guards", kwlist, &program)) {
        goto error;
    }
    seq = PySequence_Tuple(program);
    if (seq == NULL) {
        goto error;
    }
    g = (FcHookGuards *)type->tp_alloc(type, 0);
    if (g == NULL) {
        goto error;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    g->code = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(GuardInstr));
    if (g->code == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        g->n = i + 1;   /* so that dealloc frees what guard_parse stored */
        if (guard_parse(PyTuple_GET_ITEM(seq, i), i, written, &g->code[i]) < 0) {
            goto error;
        }
    }
    g->n = n;
    g->nregs = 0;
    for (int r = 0; r < FC_GUARD_MAX_REGS; r++) {
        if (written[r]) {
            g->nregs = r + 1;
        }
    }
    g->program = seq;
    return (PyObject *)g;
error:
    Py_XDECREF(seq);
    Py_XDECREF(g);
    return NULL;
}

/* Guard operands are arbitrary objects (an id guard on a model that holds the
 * compiled function, a const dict of globals): the GC must see them. */
static int
Guards_traverse(FcHookGuards *g, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < g->n; i++) {
        Py_VISIT(g->code[i].a);
        Py_VISIT(g->code[i].b);
    }
    Py_VISIT(g->program);
    return 0;
}

static int
Guards_clear(FcHookGuards *g)
{
    guards_free_code(g);
    Py_CLEAR(g->program);
    return 0;
}

static void
Guards_dealloc(FcHookGuards *g)
{
    PyObject_GC_UnTrack(g);
    Guards_clear(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

/* ========================================================================
 * checking
 * ====================================================================== */

/* 1 if a and b have the same exact type and are equal (tuples elementwise),
 * 0 if not, -1 with an exception set. Only the types eq_value_ok allows reach
 * the comparison, so no Python code runs. */
static int
eq_exact(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    if (Py_TYPE(a) != Py_TYPE(b)) {
        return 0;
    }
    if (PyFloat_CheckExact(a)) {       /* bit for bit: -0.0 is not 0.0, a NaN is itself */
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return memcmp(&x, &y, sizeof(double)) == 0;
    }
    if (PyComplex_CheckExact(a)) {
        Py_complex x = PyComplex_AsCComplex(a), y = PyComplex_AsCComplex(b);
        return memcmp(&x, &y, sizeof(Py_complex)) == 0;
    }
    if (PyArray_IsScalar(a, Generic)) {   /* same type: same dtype; its bytes */
        if (!np_scalar_ok(a)) {
            return 0;
        }
        char x[16], y[16];
        memset(x, 0, sizeof(x));
        memset(y, 0, sizeof(y));
        PyArray_ScalarAsCtype(a, x);
        PyArray_ScalarAsCtype(b, y);
        return memcmp(x, y, sizeof(x)) == 0;
    }
    if (PySlice_Check(a)) {
        PySliceObject *p = (PySliceObject *)a, *q = (PySliceObject *)b;
        int r = eq_exact(p->start, q->start);
        if (r == 1) {
            r = eq_exact(p->stop, q->stop);
        }
        return r == 1 ? eq_exact(p->step, q->step) : r;
    }
    if (PyTuple_Check(a)) {
        if (PyTuple_GET_SIZE(a) != PyTuple_GET_SIZE(b)) {
            return 0;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a); i++) {
            int r = eq_exact(PyTuple_GET_ITEM(a, i), PyTuple_GET_ITEM(b, i));
            if (r != 1) {
                return r;
            }
        }
        return 1;
    }
    if (!eq_value_ok(a)) {
        return 0;
    }
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* o.__dict__[name] for an instance dict (dictattr loads it, noattr wants it absent): 1 with
 * *out a new reference, 0 when absent (o has no instance dict, or no such entry), -1 with an
 * exception. A type is refused (-1, no exception set): its dict is a mappingproxy (3.12+: NULL
 * tp_dict on static builtin types, which GenericGetDict would fill in), never an instance dict. */
static int
instance_dict_get(PyObject *o, PyObject *name, PyObject **out)
{
    *out = NULL;
    if (PyType_Check(o)) {
        return -1;
    }
    PyObject *dict = PyObject_GenericGetDict(o, NULL);
    if (dict == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    if (PyDict_Check(dict)) {
        *out = Py_XNewRef(PyDict_GetItemWithError(dict, name));
    }
    Py_DECREF(dict);
    return *out != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
}

/* New reference to the load's value, or NULL (failure; maybe an exception). */
static PyObject *
guard_load(const GuardInstr *in, PyObject **regs, const FcHookView *v)
{
    PyObject *src = regs[in->src];
    switch (in->op) {
    case G_LOCAL:
        return Py_XNewRef(fc_hook_view_slot(v, in->n));
    case G_GLOBAL: {
        PyObject *r = PyDict_GetItemWithError(v->globals, in->a);
        if (r == NULL && !PyErr_Occurred() && PyDict_Check(v->builtins)) {
            r = PyDict_GetItemWithError(v->builtins, in->a);
        }
        return Py_XNewRef(r);
    }
    case G_CONST:
        return Py_NewRef(in->a);
    case G_CALL0:        /* a C function reading global state (torch.is_grad_enabled) */
        return PyObject_CallNoArgs(in->a);
    case G_CLOSURE: {
        if (v->closure == NULL || in->n >= PyTuple_GET_SIZE(v->closure)) {
            return NULL;
        }
        PyObject *cell = PyTuple_GET_ITEM(v->closure, in->n);
        return PyCell_Check(cell) ? Py_XNewRef(PyCell_GET(cell)) : NULL;
    }
    case G_ITEM: {
        if (src == NULL) {
            return NULL;
        }
        if (PyDict_CheckExact(src)) {
            return Py_XNewRef(PyDict_GetItemWithError(src, in->a));
        }
        if (!in->has_n || !(PyTuple_CheckExact(src) || PyList_CheckExact(src))) {
            return NULL;
        }
        Py_ssize_t len = Py_SIZE(src), i = in->n < 0 ? in->n + len : in->n;
        if (i < 0 || i >= len) {
            return NULL;
        }
        return Py_NewRef(PyTuple_CheckExact(src) ? PyTuple_GET_ITEM(src, i) : PyList_GET_ITEM(src, i));
    }
    case G_DICTATTR: {
        PyObject *r = NULL;
        return src != NULL && instance_dict_get(src, in->a, &r) == 1 ? r : NULL;
    }
    case G_TYPE_OF:
        return src == NULL ? NULL : Py_NewRef((PyObject *)Py_TYPE(src));
    case G_TYPEATTR:
        /* the attribute as found in the type's MRO, unbound (no descriptor runs);
         * _PyType_Lookup sets no exception */
        if (src == NULL || !PyType_Check(src)) {
            return NULL;
        }
        return Py_XNewRef(_PyType_Lookup((PyTypeObject *)src, in->a));
    case G_SLOTATTR: {
        /* a __slots__ member, read through its member descriptor (C code; an unset
         * slot raises AttributeError, cleared by the caller as a failed load) */
        if (src == NULL) {
            return NULL;
        }
        PyObject *descr = _PyType_Lookup(Py_TYPE(src), in->a);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            return NULL;
        }
        return Py_TYPE(descr)->tp_descr_get(descr, src, (PyObject *)Py_TYPE(src));
    }
    case G_FUNCATTR: {
        /* a Python function's defaults (a tuple or None) or keyword defaults (a dict or None),
         * read from the function object itself (no descriptor runs) */
        PyObject *d;
        if (src == NULL || !PyFunction_Check(src)) {
            return NULL;
        }
        d = in->n == 1 ? PyFunction_GetDefaults(src) : PyFunction_GetKwDefaults(src);
        return Py_NewRef(d != NULL ? d : Py_None);
    }
    default:
        return NULL;
    }
}

/* noattr: 1 when o's instance dict (if it has one) holds no entry named in->a, 0 when it
 * does or o is a type (never installed on one), -1 on error. */
static int
check_noattr(const GuardInstr *in, PyObject *o)
{
    PyObject *found;
    int rc = instance_dict_get(o, in->a, &found);
    Py_XDECREF(found);
    return rc == 0 ? 1 : rc == 1 || !PyErr_Occurred() ? 0 : -1;
}

static int
check_ndarray(const GuardInstr *in, PyObject *o)
{
    if (!PyArray_CheckExact(o)) {
        return 0;
    }
    PyArrayObject *a = (PyArrayObject *)o;
    if (PyArray_NDIM(a) != in->n) {
        return 0;
    }
    PyArray_Descr *d = PyArray_DESCR(a);
    if (d != (PyArray_Descr *)in->a && !PyArray_EquivTypes(d, (PyArray_Descr *)in->a)) {
        return 0;
    }
    const npy_intp *shape = PyArray_DIMS(a);
    uint64_t mask = 0;
    for (int k = 0; k < PyArray_NDIM(a); k++) {
        if (shape[k] == 1) {
            mask |= (uint64_t)1 << k;
        }
    }
    if (mask != in->mask) {
        return 0;
    }
    int c = PyArray_IS_C_CONTIGUOUS(a) ? 1 : 0;
    return in->contig == 0 || (in->contig == 1) == c;
}

/* 1 pass, 0 fail, -1 error. Reads attributes through the C API: slower than
 * check_ndarray (one getattr per property, one call for is_contiguous). */
static int
check_tensor(const GuardInstr *in, PyObject *o)
{
    PyObject *dtype = NULL, *device = NULL, *rg = NULL, *shape = NULL, *contig = NULL;
    int ok = 0;
    if ((dtype = PyObject_GetAttr(o, str_dtype)) == NULL) {
        goto error;
    }
    if (dtype != in->a && (ok = PyObject_RichCompareBool(dtype, in->a, Py_EQ)) != 1) {
        goto cleanup;
    }
    if ((shape = PyObject_GetAttr(o, str_shape)) == NULL) {
        goto error;
    }
    Py_ssize_t ndim = PySequence_Size(shape);
    if (ndim < 0) {
        goto error;
    }
    ok = 0;
    if (ndim != in->n) {
        goto cleanup;
    }
    uint64_t mask = 0;
    for (Py_ssize_t k = 0; k < ndim; k++) {
        PyObject *s = PySequence_GetItem(shape, k);
        if (s == NULL) {
            goto error;
        }
        Py_ssize_t sz = PyLong_AsSsize_t(s);
        Py_DECREF(s);
        if (sz == -1 && PyErr_Occurred()) {
            goto error;
        }
        if (sz == 1) {
            mask |= (uint64_t)1 << k;
        }
    }
    if (mask != in->mask) {
        goto cleanup;
    }
    if ((device = PyObject_GetAttr(o, str_device)) == NULL) {
        goto error;
    }
    if (device != in->b && (ok = PyObject_RichCompareBool(device, in->b, Py_EQ)) != 1) {
        goto cleanup;
    }
    ok = 0;
    if ((rg = PyObject_GetAttr(o, str_requires_grad)) == NULL) {
        goto error;
    }
    int r = PyObject_IsTrue(rg);
    if (r < 0) {
        goto error;
    }
    if (r != in->flag) {
        goto cleanup;
    }
    if (in->contig != 0) {
        if ((contig = PyObject_CallMethodNoArgs(o, str_is_contiguous)) == NULL) {
            goto error;
        }
        int c = PyObject_IsTrue(contig);
        if (c < 0) {
            goto error;
        }
        if ((in->contig == 1) != c) {
            goto cleanup;
        }
    }
    ok = 1;
    goto cleanup;
error:
    ok = -1;
cleanup:
    Py_XDECREF(dtype);
    Py_XDECREF(device);
    Py_XDECREF(rg);
    Py_XDECREF(shape);
    Py_XDECREF(contig);
    return ok;
}

/* shape[axis] == size, for an ndarray directly, else through .shape (torch.Size
 * is a tuple subclass). 1 pass, 0 fail, -1 error. */
static int
check_dim(const GuardInstr *in, PyObject *o)
{
    if (PyArray_Check(o)) {
        PyArrayObject *a = (PyArrayObject *)o;
        return in->n < PyArray_NDIM(a) && PyArray_DIM(a, (int)in->n) == in->size;
    }
    PyObject *shape = NULL, *item = NULL;
    int ok = 0;
    if ((shape = PyObject_GetAttr(o, str_shape)) == NULL) {
        goto error;
    }
    if (!PyTuple_Check(shape)) {
        goto cleanup;
    }
    if (in->n >= PyTuple_GET_SIZE(shape)) {
        goto cleanup;
    }
    item = Py_NewRef(PyTuple_GET_ITEM(shape, in->n));
    Py_ssize_t sz = PyLong_Check(item) ? PyLong_AsSsize_t(item) : -1;
    if (sz == -1 && PyErr_Occurred()) {
        goto error;
    }
    ok = sz == in->size;
    goto cleanup;
error:
    ok = -1;
cleanup:
    Py_XDECREF(shape);
    Py_XDECREF(item);
    return ok;
}

/* 1 pass, 0 fail, -1 error. */
static int
guard_check(const GuardInstr *in, PyObject *o)
{
    if (o == NULL) {
        return 0;
    }
    switch (in->op) {
    case G_TYPE:
        return (PyObject *)Py_TYPE(o) == in->a;
    case G_ID:
        return o == in->a;
    case G_EQ:
        return eq_exact(o, in->a);
    case G_LEN:
        if (PyTuple_CheckExact(o) || PyList_CheckExact(o)) {
            return Py_SIZE(o) == in->n;
        }
        if (PyDict_CheckExact(o)) {
            return PyDict_GET_SIZE(o) == in->n;
        }
        return 0;
    case G_NDARRAY:
        return check_ndarray(in, o);
    case G_TENSOR:
        return check_tensor(in, o);
    case G_DIM:
        return check_dim(in, o);
    case G_NOATTR:
        return check_noattr(in, o);
    case G_NOTYPEATTR:          /* a type whose MRO has no such name (_PyType_Lookup sets no error) */
        return PyType_Check(o) && _PyType_Lookup((PyTypeObject *)o, in->a) == NULL;
    default:
        return 0;
    }
}

Py_ssize_t
fc_hook_guards_first_failure(FcHookGuards *g, const FcHookView *v)
{
    PyObject *regs[FC_GUARD_MAX_REGS];
    Py_ssize_t failed = -1;
    for (int r = 0; r < g->nregs; r++) {
        regs[r] = NULL;
    }
    for (Py_ssize_t i = 0; i < g->n; i++) {
        const GuardInstr *in = &g->code[i];
        int ok;
        if (guard_ops[in->op].is_load) {
            PyObject *val = guard_load(in, regs, v);
            ok = val != NULL;
            Py_XSETREF(regs[in->reg], val);
        }
        else {
            ok = guard_check(in, regs[in->reg]);
        }
        if (ok != 1) {
            failed = i;
            break;
        }
    }
    if (failed >= 0 && PyErr_Occurred()) {
        PyErr_Clear();
    }
    for (int r = 0; r < g->nregs; r++) {
        Py_XDECREF(regs[r]);
    }
    return failed;
}

/* ========================================================================
 * Python API
 * ====================================================================== */

static Py_ssize_t
Guards_len(FcHookGuards *g)
{
    return g->n;
}

static PyObject *
Guards_first_failure(FcHookGuards *g, PyObject *frame)
{
    FcHookView v;
    if (fc_hook_frame_view(frame, &v) < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(fc_hook_guards_first_failure(g, &v));
}

static PyObject *
Guards_repr(FcHookGuards *g)
{
    return PyUnicode_FromFormat("<fastcompile Guards, %zd instructions>", g->n);
}

static PyMethodDef Guards_methods[] = {
    {"first_failure", (PyCFunction)Guards_first_failure, METH_O,
     "first_failure(frame) -> index of the first failing instruction on a _C.Frame, or -1"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Guards_members[] = {
    {"program", T_OBJECT, offsetof(FcHookGuards, program), READONLY, "the instructions, as a tuple"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods Guards_as_sequence = {
    .sq_length = (lenfunc)Guards_len,
};

PyTypeObject FcHookGuards_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile._C.Guards",
    .tp_basicsize = sizeof(FcHookGuards),
    .tp_dealloc = (destructor)Guards_dealloc,
    .tp_repr = (reprfunc)Guards_repr,
    .tp_as_sequence = &Guards_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Guards_traverse,
    .tp_clear = (inquiry)Guards_clear,
    .tp_doc = "Guards(program): a flat guard program over a frame's fast locals.\n"
              "Loads: ('local', r, slot), ('global', r, name), ('closure', r, i), ('item', r, src, key),\n"
              "('dictattr', r, src, name), ('type_of', r, src), ('typeattr', r, src, name),\n"
              "('slotattr', r, src, name), ('funcattr', r, src, '__defaults__' or '__kwdefaults__'),\n"
              "('const', r, obj), ('call0', r, fn).\n"
              "Checks: ('type', r, T), ('id', r, obj), ('eq', r, value), ('len', r, n), ('noattr', r, name),\n"
              "('notypeattr', r, name),\n"
              "('ndarray', r, dtype, ndim, size1_mask, contig), ('dim', r, axis, size),\n"
              "('tensor', r, dtype, ndim, size1_mask, contig, device, requires_grad).",
    .tp_methods = Guards_methods,
    .tp_members = Guards_members,
    .tp_new = Guards_new,
};

int
fc_hook_guards_init(PyObject *m)
{
    if ((str_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
            (str_device = PyUnicode_InternFromString("device")) == NULL ||
            (str_requires_grad = PyUnicode_InternFromString("requires_grad")) == NULL ||
            (str_shape = PyUnicode_InternFromString("shape")) == NULL ||
            (str_is_contiguous = PyUnicode_InternFromString("is_contiguous")) == NULL) {
        return -1;
    }
    if (PyType_Ready(&FcHookGuards_Type) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(m, "Guards", (PyObject *)&FcHookGuards_Type);
}
