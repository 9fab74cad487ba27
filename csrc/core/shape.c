/* Shapes and dtypes: NumPy's promotion rules and symbolic broadcasting.
 * In: graph nodes (+ segment input metas). Out: each node's dtype, rank and
 * symbolic dims (class ids unified by broadcasting). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "shape.h"
#include "spec.h"

/* ------------------------------------------------------------------------
 * dtype promotion (NumPy 2, NEP 50 for Python scalars)
 * ---------------------------------------------------------------------- */

static int
kind_rank(int dt)
{
    switch (fc_dtypes[dt].kind) {
    case 'b': return 0;
    case 'i': case 'u': return 1;
    default: return 2;
    }
}

static int
signed_of_size(int size)
{
    switch (size) {
    case 1: return FC_I8;
    case 2: return FC_I16;
    case 4: return FC_I32;
    case 8: return FC_I64;
    default: return FC_F64;   /* uint64 with a signed int: NumPy goes to float64 */
    }
}

static int
float_rank(int dt)
{
    switch (dt) {
    case FC_F16: case FC_BF16: return 1;
    case FC_F32: return 2;
    default: return 3;
    }
}

int
fc_dtype_floatof(int a)
{
    if (fc_dtypes[a].kind == 'f') {
        return a;
    }
    switch (fc_dtypes[a].size) {
    case 1: return FC_F16;
    case 2: return FC_F32;
    default: return FC_F64;
    }
}

int
fc_dtype_compute(int a)
{
    return (a == FC_F16 || a == FC_BF16) ? FC_F32 : a;
}

int
fc_dtype_promote(int a, int b)
{
    const FcDTypeInfo *A = &fc_dtypes[a], *B = &fc_dtypes[b];
    if (a == b) {
        return a;
    }
    if (A->kind == 'b') {
        return b;
    }
    if (B->kind == 'b') {
        return a;
    }
    if (A->kind == 'f' && B->kind == 'f') {
        if ((a == FC_F16 && b == FC_BF16) || (a == FC_BF16 && b == FC_F16)) {
            return FC_F32;
        }
        return float_rank(a) >= float_rank(b) ? a : b;
    }
    if (A->kind == 'f' || B->kind == 'f') {
        int f = A->kind == 'f' ? a : b;
        int i = A->kind == 'f' ? b : a;
        int fi = fc_dtype_floatof(i);
        if (f == FC_BF16 && fc_dtypes[i].size == 1) {
            return FC_BF16;       /* bfloat16 holds every 8-bit integer */
        }
        if (f == FC_BF16) {
            return fi == FC_F16 ? FC_F32 : fi;
        }
        return float_rank(f) >= float_rank(fi) ? f : fi;
    }
    if (A->kind == B->kind) {
        return A->size >= B->size ? a : b;
    }
    {
        int s = A->kind == 'i' ? a : b;
        int u = A->kind == 'i' ? b : a;
        if (fc_dtypes[s].size > fc_dtypes[u].size) {
            return s;
        }
        return signed_of_size(2 * fc_dtypes[u].size);
    }
}

/* NEP 50: a weak (Python scalar) operand takes the other side's dtype unless
 * it is of a higher kind, then it becomes that kind's default dtype. */
static int
promote_weak(int a, int aw, int b, int bw, int *weak)
{
    if (aw && bw) {
        *weak = 1;
        return fc_dtype_promote(a, b);
    }
    *weak = 0;
    if (aw || bw) {
        int w = aw ? a : b, s = aw ? b : a;
        if (kind_rank(w) <= kind_rank(s)) {
            return s;
        }
        return kind_rank(w) == 1 ? FC_I64 : FC_F64;
    }
    return fc_dtype_promote(a, b);
}

int
fc_dtype_from_name(const char *name)
{
    for (int i = 0; i < FC_NDTYPES; i++) {
        if (strcmp(name, fc_dtypes[i].name) == 0) {
            return i;
        }
    }
    if (strcmp(name, "bool_") == 0) {
        return FC_BOOL;
    }
    if (strcmp(name, "half") == 0) {
        return FC_F16;
    }
    if (strcmp(name, "float") == 0 || strcmp(name, "double") == 0) {
        return FC_F64;
    }
    return -1;
}

/* Result dtype of node n from its inputs' dtypes. Returns 0, or -1 with a
 * TypeError set (the type NumPy raises for a ufunc without a loop). */
/* does integer v fit dtype dt? */
static int
int_fits(int64_t v, int dt)
{
    switch (dt) {
    case FC_BOOL: return v == 0 || v == 1;
    case FC_I8: return v >= INT8_MIN && v <= INT8_MAX;
    case FC_I16: return v >= INT16_MIN && v <= INT16_MAX;
    case FC_I32: return v >= INT32_MIN && v <= INT32_MAX;
    case FC_U8: return v >= 0 && v <= UINT8_MAX;
    case FC_U16: return v >= 0 && v <= UINT16_MAX;
    case FC_U32: return v >= 0 && v <= (int64_t)UINT32_MAX;
    case FC_U64: return v >= 0;
    default: return 1;
    }
}

int
fc_weak_int_out_of_range(const FcGraph *g, const FcNode *n, int other)
{
    for (int j = 0; j < n->nin; j++) {
        const FcNode *c = &g->nodes[n->in[j]];
        if (c->op == FC_OP_CONST && c->weak && c->ckind == FC_CONST_INT &&
                fc_dtypes[other].kind != 'f' && fc_dtypes[other].kind != 'b' && !int_fits(c->ival, other)) {
            return j;
        }
    }
    return -1;
}

int
fc_infer_dtype(const FcGraph *g, const FcNode *n, const int *dt, const int *wk, int *out, int *out_weak)
{
    const FcOpInfo *op = &fc_ops[n->op];
    int p = -1, weak = 0, first = 0;

    if (n->op == FC_OP_CAST) {
        int src = dt[0];
        if (n->cast_to >= 0) {
            *out = n->cast_to;
        }
        else if (n->cast_to == FC_CAST_MEANLIKE) {
            *out = fc_dtypes[src].kind == 'f' ? src : FC_F64;
        }
        else {
            *out = fc_dtype_floatof(src);
        }
        *out_weak = n->cast_to < 0 ? wk[0] : 0;
        return 0;
    }
    if (n->op == FC_OP_RCOUNT) {
        *out = FC_I64;
        *out_weak = 1;
        return 0;
    }
    if (op->rule == FC_R_WHERE) {
        first = 1;
    }
    p = dt[first];
    weak = wk[first];
    for (int i = first + 1; i < n->nin; i++) {
        int w2;
        p = promote_weak(p, weak, dt[i], wk[i], &w2);
        weak = w2;
    }
    if (op->types == FC_T_NOBOOL && p == FC_BOOL) {
        PyErr_Format(PyExc_TypeError,
                     "fastcompile: op '%s' does not support bool inputs (NumPy raises "
                     "TypeError too); cast to an integer type first", op->name);
        return -1;
    }
    if (op->types == FC_T_INT && fc_dtypes[p].kind == 'f') {
        PyErr_Format(PyExc_TypeError,
                     "fastcompile: op '%s' needs bool or integer inputs, got %s",
                     op->name, fc_dtypes[p].name);
        return -1;
    }
    /* NEP 50: a Python int the integer dtype cannot hold is an error (a
     * comparison instead compares exactly, see gen_c) */
    if (g != NULL && !weak && op->rule != FC_R_BOOL && op->kind == FC_KIND_PW) {
        int j = fc_weak_int_out_of_range(g, n, p);
        if (j >= 0) {
            PyErr_Format(PyExc_OverflowError, "Python integer %lld out of bounds for %s",
                         (long long)g->nodes[n->in[j]].ival, fc_dtypes[p].name);
            return -1;
        }
    }
    if (op->rule == FC_R_FLOAT && n->nin > 1 && !weak) {
        /* NumPy picks the first float loop every input casts to safely, each
         * Python scalar first taking the dtype it would promote to: so
         * arctan2(int8, uint8) is float16, not float(int16) = float32 */
        int f = -1;
        for (int i = 0; i < n->nin; i++) {
            int w2, d = wk[i] ? promote_weak(dt[i], 1, p, 0, &w2) : dt[i];
            d = fc_dtype_floatof(d);
            f = f < 0 ? d : fc_dtype_promote(f, d);
        }
        *out = f;
        *out_weak = 0;
        return 0;
    }
    switch (op->rule) {
    case FC_R_SAME: case FC_R_WHERE: *out = p; break;
    case FC_R_SAMEI8: *out = p == FC_BOOL ? FC_I8 : p; break;
    case FC_R_FLOAT: *out = fc_dtype_floatof(p); break;
    case FC_R_DIV: *out = fc_dtypes[p].kind == 'f' ? p : FC_F64; break;
    case FC_R_BOOL: *out = FC_BOOL; weak = 0; break;
    case FC_R_INDEX: *out = FC_I64; weak = 0; break;
    case FC_R_SUM:
        *out = fc_dtypes[p].kind == 'f' ? p : fc_dtypes[p].kind == 'u' ? FC_U64 : FC_I64;
        break;
    case FC_R_MEAN: *out = fc_dtypes[p].kind == 'f' ? p : FC_F64; break;
    default:
        PyErr_Format(PyExc_SystemError, "fastcompile: no dtype rule for op '%s'", op->name);
        return -1;
    }
    *out_weak = weak;
    return 0;
}

/* The dtype an op computes in (its operands are converted to it). */
int
fc_op_compute_dtype(const FcNode *n, int result, const int *dt, const int *wk)
{
    const FcOpInfo *op = &fc_ops[n->op];
    if (op->rule == FC_R_BOOL || op->rule == FC_R_INDEX || op->kind == FC_KIND_RED) {
        int p = dt[0], weak = wk[0];
        for (int i = 1; i < n->nin; i++) {
            int w2;
            p = promote_weak(p, weak, dt[i], wk[i], &w2);
            weak = w2;
        }
        return fc_dtype_compute(p);
    }
    return fc_dtype_compute(result);
}

/* ------------------------------------------------------------------------
 * axes
 * ---------------------------------------------------------------------- */

static void
raise_axis_error(int axis, int ndim)
{
    PyObject *mod = PyImport_ImportModule("numpy.exceptions");
    PyObject *cls = mod ? PyObject_GetAttrString(mod, "AxisError") : NULL;
    Py_XDECREF(mod);
    if (cls == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "axis %d is out of bounds for array of dimension %d",
                     axis, ndim);
        return;
    }
    PyObject *exc = PyObject_CallFunction(cls, "ii", axis, ndim);
    if (exc != NULL) {
        PyErr_SetObject(cls, exc);
        Py_DECREF(exc);
    }
    Py_DECREF(cls);
}

int
fc_norm_axes(const FcNode *n, int ndim, uint32_t *mask)
{
    uint32_t m = 0;
    if (n->axes_all) {
        *mask = ndim >= 32 ? 0xffffffffu : ((1u << ndim) - 1u);
        return 0;
    }
    for (int i = 0; i < n->naxes_raw; i++) {
        int a = n->axes_raw[i];
        if (a < -ndim || a >= ndim) {
            raise_axis_error(a, ndim);
            return -1;
        }
        if (a < 0) {
            a += ndim;
        }
        if (m & (1u << a)) {
            PyErr_SetString(PyExc_ValueError, "duplicate value in 'axis'");
            return -1;
        }
        m |= 1u << a;
    }
    *mask = m;
    return 0;
}

int
fc_result_ndim(const FcNode *n, const int *in_ndim)
{
    const FcOpInfo *op = &fc_ops[n->op];
    if (n->op == FC_OP_CONST) {
        return 0;
    }
    if (op->kind == FC_KIND_RED || n->op == FC_OP_RCOUNT) {
        uint32_t m;
        int cnt = 0;
        if (n->keepdim) {
            return in_ndim[0];
        }
        if (fc_norm_axes(n, in_ndim[0], &m) < 0) {
            return -1;
        }
        for (int i = 0; i < in_ndim[0]; i++) {
            cnt += (m >> i) & 1;
        }
        return in_ndim[0] - cnt;
    }
    {
        int r = 0;
        for (int i = 0; i < n->nin; i++) {
            r = in_ndim[i] > r ? in_ndim[i] : r;
        }
        return r;
    }
}

/* ------------------------------------------------------------------------
 * symbolic shapes for a segment
 * ---------------------------------------------------------------------- */

static int
new_class(FcSpec *s, int input, int dim)
{
    if (s->nclasses == s->capclasses) {
        int cap = s->capclasses ? 2 * s->capclasses : 16;
        int *p = PyMem_Realloc(s->parent, cap * sizeof(int));
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->parent = p;
        FcClassRep *r = PyMem_Realloc(s->reps, cap * sizeof(FcClassRep));
        if (r == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->reps = r;
        s->capclasses = cap;
    }
    s->parent[s->nclasses] = s->nclasses;
    s->reps[s->nclasses].cls_input = input;
    s->reps[s->nclasses].cls_dim = dim;
    return s->nclasses++;
}

int
fc_class_find(FcSpec *s, int c)
{
    while (s->parent[c] != c) {
        s->parent[c] = s->parent[s->parent[c]];
        c = s->parent[c];
    }
    return c;
}

static int
unify(FcSpec *s, int a, int b)
{
    if (a == 0) {
        return b;
    }
    if (b == 0) {
        return a;
    }
    a = fc_class_find(s, a);
    b = fc_class_find(s, b);
    if (a != b) {
        /* keep the older class as root: its representative came first */
        if (a < b) {
            s->parent[b] = a;
        }
        else {
            s->parent[a] = b;
            a = b;
        }
    }
    return a;
}

int
fc_shape_infer(FcSpec *s, const FcMeta *metas)
{
    const FcGraph *g = s->g;
    s->nclasses = 0;
    if (new_class(s, -1, -1) < 0) {   /* class 0: size 1 */
        return -1;
    }
    for (int k = 0; k < s->ninputs; k++) {
        FcSNode *sn = &s->sn[s->inputs[k]];
        const FcMeta *m = &metas[k];
        sn->dtype = m->dtype;
        sn->weak = g->nodes[s->inputs[k]].weak;
        sn->ndim = m->ndim;
        for (int d = 0; d < m->ndim; d++) {
            if (m->ones & (1u << d)) {
                sn->dims[d] = 0;
            }
            else if ((sn->dims[d] = new_class(s, k, d)) < 0) {
                return -1;
            }
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const FcNode *n = &g->nodes[i];
        FcSNode *sn = &s->sn[i];
        int dt[3] = {0, 0, 0}, wk[3] = {0, 0, 0}, nd[3] = {0, 0, 0};
        if (n->op == FC_OP_CONST) {
            /* constants belong to no segment: any segment may read them */
            sn->dtype = n->dtype;
            sn->weak = n->weak;
            sn->ndim = 0;
            continue;
        }
        if (!sn->in_seg) {
            continue;
        }
        for (int j = 0; j < n->nin; j++) {
            dt[j] = s->sn[n->in[j]].dtype;
            wk[j] = s->sn[n->in[j]].weak;
            nd[j] = s->sn[n->in[j]].ndim;
        }
        if (fc_infer_dtype(g, n, dt, wk, &sn->dtype, &sn->weak) < 0) {
            return -1;
        }
        if (fc_ops[n->op].kind == FC_KIND_RED || n->op == FC_OP_RCOUNT) {
            const FcSNode *src = &s->sn[n->in[0]];
            int r = 0;
            if (n->op == FC_OP_ARGMAX || n->op == FC_OP_ARGMIN) {
                if (!n->axes_all && n->naxes_raw != 1) {
                    PyErr_Format(PyExc_TypeError, "fastcompile: %s takes one axis or axis=None",
                                 fc_ops[n->op].name);
                    return -1;
                }
            }
            if (fc_norm_axes(n, src->ndim, &sn->axes) < 0) {
                return -1;
            }
            for (int d = 0; d < src->ndim; d++) {
                if (sn->axes & (1u << d)) {
                    if (n->keepdim) {
                        sn->dims[r++] = 0;
                    }
                }
                else {
                    sn->dims[r++] = src->dims[d];
                }
            }
            sn->ndim = r;
            continue;
        }
        /* pointwise and cast: broadcast, right-aligned */
        {
            int r = fc_result_ndim(n, nd);
            sn->ndim = r;
            for (int d = 0; d < r; d++) {
                int c = 0;
                for (int j = 0; j < n->nin; j++) {
                    const FcSNode *src = &s->sn[n->in[j]];
                    int sd = d - (r - src->ndim);
                    if (sd >= 0) {
                        c = unify(s, c, src->dims[sd]);
                    }
                }
                sn->dims[d] = c;
            }
        }
    }
    /* canonical class ids everywhere */
    for (int i = 0; i < g->nnodes; i++) {
        FcSNode *sn = &s->sn[i];
        for (int d = 0; d < sn->ndim; d++) {
            if (sn->dims[d] != 0) {
                sn->dims[d] = fc_class_find(s, sn->dims[d]);
            }
        }
    }
    return 0;
}
