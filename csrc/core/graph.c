/* Graph: the op and dtype tables, node storage, composite ops, the verifier.
 * In: nodes from the graph API. Out: an FcGraph of core ops and externs. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "graph.h"
#include "shape.h"

const FcDTypeInfo fc_dtypes[FC_NDTYPES] = {
#define X(id, name, ctype, suffix, size, kind) {name, #ctype, suffix, size, kind},
    FC_DTYPES(X)
#undef X
};

const FcOpInfo fc_ops[FC_NOPS] = {
#define FC_OP(id, name, arity, kind, rule, types, cexpr, meaning) \
    {name, arity, kind, rule, types, cexpr, meaning},
#include "ops.def"
#undef FC_OP
};

int
fc_op_lookup(const char *name)
{
    for (int i = 0; i < FC_NOPS; i++) {
        if (strcmp(fc_ops[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

int
fc_graph_init(FcGraph *g)
{
    memset(g, 0, sizeof(*g));
    return 0;
}

void
fc_graph_free(FcGraph *g)
{
    for (int i = 0; i < g->nnodes; i++) {
        PyMem_Free(g->nodes[i].in);
    }
    PyMem_Free(g->nodes);
    PyMem_Free(g->inputs);
    PyMem_Free(g->outputs);
    memset(g, 0, sizeof(*g));
}

int
fc_graph_add_node(FcGraph *g, const FcNode *proto, const int *in, int nin)
{
    FcNode *n;
    int *ins = NULL;
    if (g->nnodes == g->cap) {
        int cap = g->cap ? 2 * g->cap : 32;
        FcNode *p = PyMem_Realloc(g->nodes, cap * sizeof(FcNode));
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        g->nodes = p;
        g->cap = cap;
    }
    if (nin > 0) {
        ins = PyMem_Malloc(nin * sizeof(int));
        if (ins == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(ins, in, nin * sizeof(int));
    }
    n = &g->nodes[g->nnodes];
    *n = *proto;
    n->in = ins;
    n->nin = nin;
    return g->nnodes++;
}

/* Type a new node from its inputs where they are known (externs' results
 * are known only at run time). Returns 0, or -1 with an exception set. */
static int
type_node(FcGraph *g, FcNode *n)
{
    int dt[3] = {0, 0, 0}, wk[3] = {0, 0, 0}, nd[3] = {0, 0, 0};
    int known_dt = 1, known_nd = 1;
    if (n->op == FC_OP_CONST || n->op == FC_OP_INPUT) {
        return 0;
    }
    if (n->op == FC_OP_EXTERN || n->op == FC_OP_ITEM) {
        n->dtype = -1;
        n->ndim = -1;
        return 0;
    }
    for (int j = 0; j < n->nin; j++) {
        const FcNode *src = &g->nodes[n->in[j]];
        dt[j] = src->dtype;
        wk[j] = src->weak;
        nd[j] = src->ndim;
        known_dt &= src->dtype >= 0;
        known_nd &= src->ndim >= 0;
    }
    n->dtype = -1;
    n->ndim = -1;
    n->weak = 0;
    if (known_dt && fc_infer_dtype(g, n, dt, wk, &n->dtype, &n->weak) < 0) {
        return -1;
    }
    if (known_nd && (n->ndim = fc_result_ndim(n, nd)) < 0) {
        return -1;
    }
    return 0;
}

/* x ** 2 and x ** 3 with a Python-scalar exponent on a float array become
 * multiplications: libm's pow costs ~20x more, x*x is exact and x*x*x within
 * 1.5 ULP of pow's result (inf, NaN and signed zeros come out the same). An
 * exponent that is a NumPy scalar could promote the result, so only weak ones.
 * Returns the exponent (2 or 3), or 0 to keep pow. */
static int
pow_by_multiplication(const FcGraph *g, const int *in)
{
    const FcNode *b = &g->nodes[in[0]], *e = &g->nodes[in[1]];
    int k = 0;
    if (e->op != FC_OP_CONST || !e->weak || b->dtype < 0 || fc_dtypes[b->dtype].kind != 'f') {
        return 0;
    }
    if (e->ckind == FC_CONST_INT && (e->ival == 2 || e->ival == 3)) {
        k = (int)e->ival;
    }
    else if (e->ckind == FC_CONST_FLOAT && (e->fval == 2.0 || e->fval == 3.0)) {
        k = (int)e->fval;
    }
    return k;
}

int
fc_graph_add(FcGraph *g, int op, const int *in, int nin, const FcNode *attrs)
{
    FcNode n;
    int k;
    if (op == FC_OP_POW && nin == 2 && (k = pow_by_multiplication(g, in)) != 0) {
        int xx[2] = {in[0], in[0]};
        int sq = fc_graph_add(g, FC_OP_MUL, xx, 2, NULL);
        if (sq < 0 || k == 2) {
            return sq;
        }
        int xs[2] = {sq, in[0]};
        return fc_graph_add(g, FC_OP_MUL, xs, 2, NULL);
    }
    if (attrs != NULL) {
        n = *attrs;
    }
    else {
        memset(&n, 0, sizeof(n));
    }
    n.op = op;
    n.in = (int *)in;
    n.nin = nin;
    if (fc_ops[op].kind == FC_KIND_COMPOSITE) {
        return fc_graph_add_composite(g, op, in[0], &n);
    }
    if (type_node(g, &n) < 0) {
        return -1;
    }
    return fc_graph_add_node(g, &n, in, nin);
}

/* ------------------------------------------------------------------------
 * composites: mean, var, std, logsumexp, softmax, log_softmax
 * ---------------------------------------------------------------------- */

static int
add1(FcGraph *g, int op, int a)
{
    if (a < 0) {
        return -1;
    }
    return fc_graph_add(g, op, &a, 1, NULL);
}

static int
add2(FcGraph *g, int op, int a, int b)
{
    int in[2] = {a, b};
    if (a < 0 || b < 0) {
        return -1;
    }
    return fc_graph_add(g, op, in, 2, NULL);
}

static int
add_cast(FcGraph *g, int x, int how)
{
    FcNode a;
    if (x < 0) {
        return -1;
    }
    memset(&a, 0, sizeof(a));
    a.cast_to = how;
    return fc_graph_add(g, FC_OP_CAST, &x, 1, &a);
}

/* a reduction with the composite's axes and the given keepdim */
static int
add_red(FcGraph *g, int op, int x, const FcNode *like, int keepdim)
{
    FcNode a = *like;
    if (x < 0) {
        return -1;
    }
    a.keepdim = keepdim;
    a.correction = 0;    /* var's: applied to the count afterwards, not a sum's attribute */
    a.quiet_empty = 1;   /* only composites add reductions here */
    return fc_graph_add(g, op, &x, 1, &a);
}

static int
add_const_int(FcGraph *g, int64_t v)
{
    FcNode c;
    memset(&c, 0, sizeof(c));
    c.op = FC_OP_CONST;
    c.ckind = FC_CONST_INT;
    c.ival = v;
    c.fval = (double)v;
    c.dtype = FC_I64;
    c.weak = 1;
    c.ndim = 0;
    return fc_graph_add_node(g, &c, NULL, 0);
}

static int
add_const_float(FcGraph *g, double v)
{
    FcNode c;
    memset(&c, 0, sizeof(c));
    c.op = FC_OP_CONST;
    c.ckind = FC_CONST_FLOAT;
    c.fval = v;
    c.dtype = FC_F64;
    c.weak = 1;
    c.ndim = 0;
    return fc_graph_add_node(g, &c, NULL, 0);
}

static int
add_mean(FcGraph *g, int xf, const FcNode *a, int keepdim)
{
    int s = add_red(g, FC_OP_SUM, xf, a, keepdim);
    int c = add_red(g, FC_OP_RCOUNT, xf, a, keepdim);
    return add2(g, FC_OP_DIV, s, c);
}

int
fc_graph_add_composite(FcGraph *g, int op, int x, const FcNode *a)
{
    int xf, m, d, e, s, c, r;
    switch (op) {
    case FC_OP_MEAN:
        xf = add_cast(g, x, FC_CAST_MEANLIKE);
        return xf < 0 ? -1 : add_mean(g, xf, a, a->keepdim);
    case FC_OP_VAR:
    case FC_OP_STD:
        /* two passes (mean, then squared deviations): NumPy's algorithm */
        if ((xf = add_cast(g, x, FC_CAST_MEANLIKE)) < 0 || (m = add_mean(g, xf, a, 1)) < 0) {
            return -1;
        }
        d = add2(g, FC_OP_SUB, xf, m);
        s = add_red(g, FC_OP_SUM, add2(g, FC_OP_MUL, d, d), a, a->keepdim);
        c = add_red(g, FC_OP_RCOUNT, xf, a, a->keepdim);
        c = add2(g, FC_OP_MAXIMUM, add2(g, FC_OP_SUB, c, add_const_int(g, a->correction)),
                 add_const_int(g, 0));
        r = add2(g, FC_OP_DIV, s, c);
        if (r < 0 || op == FC_OP_VAR) {
            return r;
        }
        return add1(g, FC_OP_SQRT, r);
    case FC_OP_LOGSUMEXP: {
        /* max is taken out; an infinite max is replaced by 0 (as torch) */
        int mk, ms, msn;
        xf = add_cast(g, x, FC_CAST_FLOATLIKE);
        mk = add_red(g, FC_OP_AMAX, xf, a, 1);
        if (mk < 0) {
            return -1;
        }
        {
            int in[3] = {add1(g, FC_OP_ISINF, mk), add_const_float(g, 0.0), mk};
            if (in[0] < 0 || in[1] < 0 || (ms = fc_graph_add(g, FC_OP_WHERE, in, 3, NULL)) < 0) {
                return -1;
            }
        }
        s = add_red(g, FC_OP_SUM, add1(g, FC_OP_EXP, add2(g, FC_OP_SUB, xf, ms)), a, a->keepdim);
        if (a->keepdim) {
            msn = ms;
        }
        else {
            int mn = add_red(g, FC_OP_AMAX, xf, a, 0);
            int in[3] = {mn < 0 ? -1 : add1(g, FC_OP_ISINF, mn), add_const_float(g, 0.0), mn};
            if (in[0] < 0 || in[1] < 0 || (msn = fc_graph_add(g, FC_OP_WHERE, in, 3, NULL)) < 0) {
                return -1;
            }
        }
        return add2(g, FC_OP_ADD, s < 0 ? -1 : add1(g, FC_OP_LOG, s), msn);
    }
    case FC_OP_SOFTMAX:
    case FC_OP_LOG_SOFTMAX:
        xf = add_cast(g, x, FC_CAST_FLOATLIKE);
        m = add_red(g, FC_OP_AMAX, xf, a, 1);
        d = add2(g, FC_OP_SUB, xf, m);
        if (d < 0) {
            return -1;
        }
        e = add1(g, FC_OP_EXP, d);
        s = add_red(g, FC_OP_SUM, e, a, 1);
        if (op == FC_OP_SOFTMAX) {
            /* e * (1 / s), as torch's CPU and CUDA softmax do: one division per
             * row instead of one per element (about 1 ulp from e / s) */
            return add2(g, FC_OP_MUL, e, add1(g, FC_OP_RECIPROCAL, s));
        }
        return add2(g, FC_OP_SUB, d, s < 0 ? -1 : add1(g, FC_OP_LOG, s));
    default:
        PyErr_Format(PyExc_SystemError, "fastcompile: no decomposition for '%s'", fc_ops[op].name);
        return -1;
    }
}

/* ------------------------------------------------------------------------
 * verifier: structure every pass must keep
 * ---------------------------------------------------------------------- */

int
fc_graph_verify(const FcGraph *g)
{
    for (int i = 0; i < g->nnodes; i++) {
        const FcNode *n = &g->nodes[i];
        const FcOpInfo *op;
        if (n->op < 0 || n->op >= FC_NOPS) {
            PyErr_Format(PyExc_RuntimeError, "fc_graph_verify: node %d has bad op %d", i, n->op);
            return -1;
        }
        op = &fc_ops[n->op];
        if (op->kind == FC_KIND_COMPOSITE) {
            PyErr_Format(PyExc_RuntimeError, "fc_graph_verify: node %d is an undecomposed %s",
                         i, op->name);
            return -1;
        }
        if (op->arity >= 0 && n->nin != op->arity) {
            PyErr_Format(PyExc_RuntimeError, "fc_graph_verify: node %d (%s) has %d inputs, wants %d",
                         i, op->name, n->nin, op->arity);
            return -1;
        }
        for (int j = 0; j < n->nin; j++) {
            if (n->in[j] < 0 || n->in[j] >= i) {
                PyErr_Format(PyExc_RuntimeError,
                             "fc_graph_verify: node %d (%s) input %d = %d is not an earlier node",
                             i, op->name, j, n->in[j]);
                return -1;
            }
        }
        if (n->dtype < -1 || n->dtype >= FC_NDTYPES || n->ndim < -1 || n->ndim > FC_MAXDIM) {
            PyErr_Format(PyExc_RuntimeError, "fc_graph_verify: node %d (%s) has dtype %d ndim %d",
                         i, op->name, n->dtype, n->ndim);
            return -1;
        }
    }
    for (int k = 0; k < g->noutputs; k++) {
        if (g->outputs[k] < 0 || g->outputs[k] >= g->nnodes) {
            PyErr_Format(PyExc_RuntimeError, "fc_graph_verify: output %d is node %d of %d",
                         k, g->outputs[k], g->nnodes);
            return -1;
        }
    }
    return 0;
}

/* a deep copy, so a compiled graph never sees nodes added later */
int
fc_graph_copy(FcGraph *dst, const FcGraph *src)
{
    fc_graph_init(dst);
    for (int i = 0; i < src->nnodes; i++) {
        if (fc_graph_add_node(dst, &src->nodes[i], src->nodes[i].in, src->nodes[i].nin) < 0) {
            goto error;
        }
    }
    dst->inputs = PyMem_Malloc((src->ninputs + 1) * sizeof(int));
    dst->outputs = PyMem_Malloc((src->noutputs + 1) * sizeof(int));
    if (dst->inputs == NULL || dst->outputs == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    memcpy(dst->inputs, src->inputs, src->ninputs * sizeof(int));
    memcpy(dst->outputs, src->outputs, src->noutputs * sizeof(int));
    dst->ninputs = src->ninputs;
    dst->noutputs = src->noutputs;
    return 0;
error:
    fc_graph_free(dst);
    return -1;
}

/* ------------------------------------------------------------------------
 * common subexpressions
 * ---------------------------------------------------------------------- */

/* Whether n may stand for an equal node: every core op (pure by
 * construction); never an input, an extern call or one of its items. */
static int
cse_candidate(const FcNode *n)
{
    return n->op != FC_OP_INPUT && n->op != FC_OP_EXTERN && n->op != FC_OP_ITEM;
}

/* a and b compute the same value: same op, result type, inputs and
 * attributes (a constant's value compared bit for bit: -0.0 and NaNs stay
 * apart) */
static int
cse_equal(const FcNode *a, const FcNode *b)
{
    if (a->op != b->op || a->nin != b->nin || a->dtype != b->dtype || a->ndim != b->ndim
        || a->weak != b->weak || a->cast_to != b->cast_to || a->axes != b->axes
        || a->axes_all != b->axes_all || a->naxes_raw != b->naxes_raw
        || a->keepdim != b->keepdim || a->correction != b->correction || a->ckind != b->ckind
        || a->ival != b->ival || memcmp(&a->fval, &b->fval, sizeof(double)) != 0
        || a->quiet_empty != b->quiet_empty) {
        return 0;
    }
    for (int j = 0; j < a->nin; j++) {
        if (a->in[j] != b->in[j]) {
            return 0;
        }
    }
    for (int j = 0; j < a->naxes_raw; j++) {
        if (a->axes_raw[j] != b->axes_raw[j]) {
            return 0;
        }
    }
    return 1;
}

static uint64_t
cse_hash(const FcNode *n, int level)
{
    uint64_t h = 1469598103934665603ULL, bits;
    memcpy(&bits, &n->fval, sizeof(bits));
    uint64_t parts[11] = {(uint64_t)n->op, (uint64_t)n->dtype, (uint64_t)n->ndim,
                          (uint64_t)n->cast_to, n->axes, (uint64_t)n->ival, (uint64_t)n->nin,
                          bits, (uint64_t)n->ckind, (uint64_t)(n->weak | n->keepdim << 1),
                          (uint64_t)level};
    for (int k = 0; k < 11; k++) {
        h = (h ^ parts[k]) * 1099511628211ULL;
    }
    for (int j = 0; j < n->nin; j++) {
        h = (h ^ (uint64_t)n->in[j]) * 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

int
fc_graph_cse(FcGraph *g, const int *level)
{
    size_t cap = 16;
    int *rep, *slots, merged = 0;
    while (cap < 2 * (size_t)g->nnodes) {
        cap *= 2;
    }
    rep = PyMem_Malloc((g->nnodes + 1) * sizeof(int));
    slots = PyMem_Malloc(cap * sizeof(int));
    if (rep == NULL || slots == NULL) {
        PyMem_Free(rep);
        PyMem_Free(slots);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < cap; k++) {
        slots[k] = -1;
    }
    for (int i = 0; i < g->nnodes; i++) {
        FcNode *n = &g->nodes[i];
        /* an extern keeps its own arguments: it may write or return them */
        for (int j = 0; j < n->nin && n->op != FC_OP_EXTERN; j++) {
            n->in[j] = rep[n->in[j]];        /* inputs are earlier nodes (fc_graph_verify) */
        }
        rep[i] = i;
        if (!cse_candidate(n) || level[i] < 0) {
            continue;                        /* dead nodes need no merging */
        }
        size_t k = (size_t)cse_hash(n, level[i]) & (cap - 1);
        while (slots[k] >= 0 && !(level[slots[k]] == level[i] && cse_equal(&g->nodes[slots[k]], n))) {
            k = (k + 1) & (cap - 1);
        }
        if (slots[k] >= 0) {
            rep[i] = slots[k];
            merged++;
        }
        else {
            slots[k] = i;
        }
    }
    PyMem_Free(rep);
    PyMem_Free(slots);
    return merged;
}
