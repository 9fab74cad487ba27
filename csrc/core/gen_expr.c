/* Renderer, shared part: nodes, operand loads and stores, reduction accumulators as statements.
 * In: FcSpec + kernel + a dialect (FcExprTarget). Out: lines appended to the renderer's FcStr.
 *
 * Used by gen_c.c (C11 + OpenMP) and gen_cuda.c (CUDA C++ for NVRTC); see
 * gen_expr.h for what differs between them and how. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gen_expr.h"
#include "shape.h"

#define EXPR FC_EXPR_MAX

void
fc_expr_init(FcExprGen *E, const FcExprTarget *t, const FcSpec *s, int k, FcStr *b, char *loaded)
{
    int nin = 0, nout = 0;
    memset(E, 0, sizeof(*E));
    E->t = t;
    E->s = s;
    E->K = &s->kernels[k];
    E->b = b;
    E->loaded = loaded;
    memset(loaded, 0, FC_MAXOPS);
    for (int o = 0; o < E->K->nops; o++) {
        if (E->K->ops[o].is_out) {
            snprintf(E->opname[o], sizeof(E->opname[o]), "out%d", nout++);
        }
        else {
            snprintf(E->opname[o], sizeof(E->opname[o]), "in%d", nin++);
        }
    }
}

/* ------------------------------------------------------------------------
 * types and conversions
 * ---------------------------------------------------------------------- */

const char *
fc_expr_ctype(const FcExprGen *E, int dt)
{
    switch (dt) {
    case FC_BOOL: return E->t->bool_type;
    case FC_I8: return "int8_t";
    case FC_I16: return "int16_t";
    case FC_I32: return "int32_t";
    case FC_I64: return "int64_t";
    case FC_U8: return "uint8_t";
    case FC_U16: return "uint16_t";
    case FC_U32: return "uint32_t";
    case FC_U64: return "uint64_t";
    case FC_F64: return "double";
    default: return "float";
    }
}

const char *
fc_expr_storetype(int dt)
{
    return fc_dtypes[dt].ctype;
}

void
fc_expr_convert(const FcExprGen *E, char *out, const char *expr, int from, int to)
{
    from = fc_dtype_compute(from);
    to = fc_dtype_compute(to);
    if (from == to) {
        snprintf(out, EXPR, "%s", expr);
    }
    else if (to == FC_BOOL) {
        snprintf(out, EXPR, "((%s) != 0)", expr);
    }
    else if (fc_dtypes[from].kind == 'f' && fc_dtypes[to].kind != 'f') {
        snprintf(out, EXPR, "fc_f2%s(%s)", fc_dtypes[to].suffix, expr);
    }
    else {
        snprintf(out, EXPR, "((%s)(%s))", fc_expr_ctype(E, to), expr);
    }
}

/* memory of storage type dt as its compute type */
static void
load_expr(const FcExprGen *E, char *out, const char *mem, int dt)
{
    switch (dt) {
    case FC_F16: snprintf(out, EXPR, "fc_load_f16(%s)", mem); break;
    case FC_BF16: snprintf(out, EXPR, "fc_load_bf16(%s)", mem); break;
    case FC_BOOL: snprintf(out, EXPR, E->t->bool_load, mem); break;
    default: snprintf(out, EXPR, "%s", mem); break;
    }
}

/* a compute-type value as storage type dt */
static void
store_expr(char *out, const char *val, int dt)
{
    switch (dt) {
    case FC_F16: snprintf(out, EXPR, "fc_store_f16(%s)", val); break;
    case FC_BF16: snprintf(out, EXPR, "fc_store_bf16(%s)", val); break;
    case FC_BOOL: snprintf(out, EXPR, "((uint8_t)%s)", val); break;
    default: snprintf(out, EXPR, "%s", val); break;
    }
}

static void
literal(const FcExprGen *E, char *out, const FcNode *n, int dt)
{
    const char *ty = fc_expr_ctype(E, dt);
    if (n->ckind == FC_CONST_FLOAT) {
        if (isnan(n->fval)) {
            snprintf(out, EXPR, "((%s)NAN)", ty);
        }
        else if (isinf(n->fval)) {
            snprintf(out, EXPR, "((%s)%sINFINITY)", ty, n->fval < 0 ? "-" : "");
        }
        else if (n->fval == 0 && signbit(n->fval)) {
            snprintf(out, EXPR, "((%s)-0.0)", ty);     /* %.17g's "-0" is the int 0 */
        }
        else {
            snprintf(out, EXPR, "((%s)%.17g)", ty, n->fval);
        }
    }
    else if (n->ckind == FC_CONST_BOOL) {
        snprintf(out, EXPR, "((%s)%d)", ty, n->ival != 0);
    }
    else if (n->ival == INT64_MIN) {
        snprintf(out, EXPR, "((%s)INT64_MIN)", ty);
    }
    else {
        snprintf(out, EXPR, "((%s)%lldLL)", ty, (long long)n->ival);
    }
}

/* ------------------------------------------------------------------------
 * kernel membership and operands
 * ---------------------------------------------------------------------- */

int
fc_expr_is_red(const FcSpec *s, int v)
{
    return fc_ops[s->g->nodes[v].op].kind == FC_KIND_RED && s->sn[v].axes != 0;
}

int
fc_expr_in_kernel(const FcExprGen *E, int v)
{
    return E->s->sn[v].in_seg && E->s->g->nodes[v].op != FC_OP_CONST &&
           E->s->sn[v].kernel == (int)(E->K - E->s->kernels);
}

static FcAlign
consumer_align(const FcSpec *s, int consumer)
{
    const FcSNode *c = &s->sn[consumer];
    if (fc_expr_is_red(s, consumer)) {
        return FC_ALIGN_FULL;
    }
    return (c->kind == FC_VK_OUTER && !c->keepform) ? FC_ALIGN_OUTER : FC_ALIGN_FULL;
}

int
fc_expr_find_operand(const FcExprGen *E, int slot, FcAlign al)
{
    for (int o = 0; o < E->K->nops; o++) {
        if (E->K->ops[o].slot == slot && E->K->ops[o].align == al) {
            return o;
        }
    }
    return -1;
}

int
fc_expr_operand_is_scalar(const FcExprGen *E, int o)
{
    const FcSlot *sl = &E->s->slots[E->K->ops[o].slot];
    for (int d = 0; d < sl->ndim; d++) {
        if (sl->dims[d] != 0) {
            return 0;
        }
    }
    return 1;
}

void
fc_expr_need_full(const FcExprGen *E, int v, char *need)
{
    const FcNode *n = &E->s->g->nodes[v];
    if (!fc_expr_in_kernel(E, v) || E->s->sn[v].kind != FC_VK_FULL || fc_expr_is_red(E->s, v) ||
            need[v]) {
        return;
    }
    need[v] = 1;
    for (int j = 0; j < n->nin; j++) {
        fc_expr_need_full(E, n->in[j], need);
    }
}

void
fc_expr_need_sweep(const FcExprGen *E, const int *reds, int nreds, int store, char *need)
{
    const FcKernelIR *K = E->K;
    for (int r = 0; r < nreds; r++) {
        fc_expr_need_full(E, E->s->g->nodes[reds[r]].in[0], need);
    }
    for (int m = 0; store && m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (E->s->sn[v].materialize && E->s->sn[v].kind == FC_VK_FULL) {
            fc_expr_need_full(E, v, need);
        }
    }
}

void
fc_expr_emit_operand_decls(FcExprGen *E)
{
    const FcKernelIR *K = E->K;
    for (int o = 0; o < K->nops; o++) {
        const char *st = fc_expr_storetype(E->s->slots[K->ops[o].slot].dtype);
        const char *c = K->ops[o].is_out ? "" : "const ";
        FC_LINE(E, "%s%s *%s %s = (%s%s *)%sptr[%d];", c, st, E->t->restrict_kw, E->opname[o], c, st,
                E->t->launch, o);
    }
}

/* ------------------------------------------------------------------------
 * values and nodes
 * ---------------------------------------------------------------------- */

/* the name of node v's value: in column blocks an OUTER value's element b */
static void
tname(const FcExprGen *E, int v, char *out, size_t n)
{
    snprintf(out, n, E->cols && E->s->sn[v].kind == FC_VK_OUTER ? "t%d[b]" : "t%d", v);
}

int
fc_expr_value(FcExprGen *E, int u, int consumer, char *out)
{
    const FcSpec *s = E->s;
    const FcNode *n = &s->g->nodes[u];
    if (n->op == FC_OP_CONST) {
        literal(E, out, n, s->sn[u].dtype);
        return 0;
    }
    if (fc_expr_in_kernel(E, u)) {
        tname(E, u, out, EXPR);
        return 0;
    }
    {
        int o = fc_expr_find_operand(E, s->sn[u].slot, consumer_align(s, consumer));
        char mem[EXPR], val[EXPR];
        if (o < 0) {
            PyErr_Format(PyExc_SystemError, "%s: node %d reads node %d with no operand", E->t->who,
                         consumer, u);
            return -1;
        }
        if (!E->loaded[o]) {
            int dt = s->slots[E->K->ops[o].slot].dtype;
            E->t->mem(E, o, mem);
            load_expr(E, val, mem, dt);
            FC_LINE(E, "const %s x%d = %s;", fc_expr_ctype(E, fc_dtype_compute(dt)), o, val);
            E->loaded[o] = 1;
        }
        snprintf(out, EXPR, "x%d", o);
        return 0;
    }
}

/* an ops.def template with %0..%2 (arguments) and %t (type suffix) filled in */
static void
subst(char *out, const char *tmpl, char args[3][EXPR], const char *suffix)
{
    size_t used = 0;
    out[0] = 0;
    for (const char *p = tmpl; *p && used < EXPR - 1; p++) {
        const char *piece = NULL;
        char one[2] = {*p, 0};
        if (p[0] == '%' && p[1] >= '0' && p[1] <= '2') {
            piece = args[p[1] - '0'];
            p++;
        }
        else if (p[0] == '%' && p[1] == 't') {
            piece = suffix;
            p++;
        }
        else {
            piece = one;
        }
        used += snprintf(out + used, EXPR - used, "%s", piece);
    }
}

/* the statement that defines node v's value: a const local, or in column
 * blocks an OUTER value's element b */
static void
emit_def(FcExprGen *E, int v, const char *type, const char *expr)
{
    if (E->cols && E->s->sn[v].kind == FC_VK_OUTER) {
        FC_LINE(E, "t%d[b] = %s;", v, expr);
    }
    else {
        FC_LINE(E, "const %s t%d = %s;", type, v, expr);
    }
}

/* Comparisons NumPy 2 makes exact where promotion would not: a signed int
 * with a uint64 (promoted: float64), and a Python int outside the other
 * side's integer range (promoted: wrapped). Returns 0 when emitted, 1 when
 * the ordinary path applies, -1 on error. */
static int
emit_exact_compare(FcExprGen *E, int v, const int *dt, const int *wk)
{
    const FcSpec *s = E->s;
    const FcNode *n = &s->g->nodes[v];
    static const char *names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
    static const char *syms[] = {"==", "!=", "<", "<=", ">", ">="};
    const char *name = names[n->op - FC_OP_EQ];
    int sig[2], uns[2];
    char raw[EXPR], a[EXPR], b[EXPR];
    for (int j = 0; j < 2; j++) {
        char k = fc_dtypes[dt[j]].kind;
        sig[j] = k == 'i' || k == 'b';
        uns[j] = dt[j] == FC_U64 && !wk[j];
    }
    for (int j = 0; j < 2; j++) {
        if (!wk[j] && sig[j] && uns[1 - j]) {
            goto mixed;
        }
    }
    /* a weak Python int the other (integer) side cannot hold */
    for (int j = 0; j < 2; j++) {
        const FcNode *c = &s->g->nodes[n->in[j]];
        int other = dt[1 - j];
        if (!(c->op == FC_OP_CONST && c->weak && c->ckind == FC_CONST_INT) || wk[1 - j] ||
                fc_weak_int_out_of_range(s->g, n, other) != j) {
            continue;
        }
        if (other == FC_U64) {
            sig[j] = 1;
            uns[1 - j] = 1;
            goto mixed;
        }
        for (int i = 0; i < 2; i++) {
            if (fc_expr_value(E, n->in[i], v, raw) < 0) {
                return -1;
            }
            fc_expr_convert(E, i ? b : a, raw, dt[i], FC_I64);
        }
        {
            char e[EXPR];
            snprintf(e, EXPR, "(%s %s %s)", a, syms[n->op - FC_OP_EQ], b);
            emit_def(E, v, E->t->bool_type, e);
        }
        return 0;
    }
    return 1;
mixed:
    for (int i = 0; i < 2; i++) {
        if (fc_expr_value(E, n->in[i], v, raw) < 0) {
            return -1;
        }
        fc_expr_convert(E, i ? b : a, raw, dt[i], sig[i] ? FC_I64 : FC_U64);
    }
    {
        char e[EXPR];
        snprintf(e, EXPR, "fc_%s_%s(%s, %s)", name, sig[0] ? "iu" : "ui", a, b);
        emit_def(E, v, E->t->bool_type, e);
    }
    return 0;
}

int
fc_expr_emit_node(FcExprGen *E, int v)
{
    const FcSpec *s = E->s;
    const FcNode *n = &s->g->nodes[v];
    const FcSNode *sn = &s->sn[v];
    int ct = fc_dtype_compute(sn->dtype);
    char args[3][EXPR], raw[EXPR], expr[EXPR];
    int dt[3] = {0, 0, 0}, wk[3] = {0, 0, 0};

    if (n->op == FC_OP_RCOUNT) {
        snprintf(expr, EXPR, sn->axes ? "%sn_inner" : "1", E->t->launch);
        emit_def(E, v, "int64_t", expr);
        return 0;
    }
    for (int j = 0; j < n->nin; j++) {
        dt[j] = s->sn[n->in[j]].dtype;
        wk[j] = s->sn[n->in[j]].weak;
    }
    if (n->op == FC_OP_CAST || fc_ops[n->op].kind == FC_KIND_RED) {
        /* casts; reductions over no axes are casts too (np.sum(x, axis=())) */
        if (fc_expr_value(E, n->in[0], v, raw) < 0) {
            return -1;
        }
        if (n->op == FC_OP_ARGMAX || n->op == FC_OP_ARGMIN) {
            snprintf(expr, EXPR, "((int64_t)0)");
        }
        else if (n->op == FC_OP_ANY || n->op == FC_OP_ALL) {
            fc_expr_convert(E, expr, raw, dt[0], FC_BOOL);
        }
        else if (dt[0] == FC_F64 && (sn->dtype == FC_F16 || sn->dtype == FC_BF16)) {
            /* one rounding, not two: round to odd into float32 first */
            const char *h = sn->dtype == FC_F16 ? "f16" : "bf16";
            snprintf(expr, EXPR, "fc_load_%s(fc_store_%s(fc_f64_to_f32_odd(%s)))", h, h, raw);
        }
        else if ((sn->dtype == FC_F16 || sn->dtype == FC_BF16) && dt[0] != sn->dtype) {
            /* a cast to a half type rounds to it, as NumPy's astype and torch's .to do
             * (an op's float16 result is not rounded between ops: README); from float32,
             * an integer (through float32, as torch converts) or the other half type */
            const char *h = sn->dtype == FC_F16 ? "f16" : "bf16";
            char wide[EXPR];
            fc_expr_convert(E, wide, raw, dt[0], FC_F32);
            snprintf(expr, EXPR, "fc_load_%s(fc_store_%s(%s))", h, h, wide);
        }
        else {
            fc_expr_convert(E, expr, raw, dt[0], ct);
        }
        emit_def(E, v, fc_expr_ctype(E, ct), expr);
        return 0;
    }
    if (n->op >= FC_OP_EQ && n->op <= FC_OP_GE) {
        int rc = emit_exact_compare(E, v, dt, wk);
        if (rc <= 0) {
            return rc;
        }
    }
    {
        int opct = fc_op_compute_dtype(n, sn->dtype, dt, wk);
        for (int j = 0; j < n->nin; j++) {
            int want = opct;
            if (n->op == FC_OP_WHERE) {
                want = j == 0 ? FC_BOOL : ct;
            }
            else if (n->op == FC_OP_LOGICAL_AND || n->op == FC_OP_LOGICAL_OR ||
                     n->op == FC_OP_LOGICAL_XOR || n->op == FC_OP_LOGICAL_NOT) {
                want = FC_BOOL;    /* each operand's own truth, as NumPy's ??->? loops: a constant
                                    * the other operand's type cannot hold (int8 and 256) is not
                                    * wrapped into it first */
            }
            if (fc_expr_value(E, n->in[j], v, raw) < 0) {
                return -1;
            }
            fc_expr_convert(E, args[j], raw, dt[j], want);
        }
        {
            /* x ** 0.5 with the exponent a constant is sqrt(x), as in NumPy and torch (their
             * scalar-exponent fast path): sqrt(-0) = -0 and sqrt(-inf) = nan, where C's pow
             * gives +0 and +inf. GCC made the same exchange in vectorized loops only, so the
             * result depended on an element's position; an array exponent keeps pow */
            const FcNode *e = n->op == FC_OP_POW ? &s->g->nodes[n->in[1]] : NULL;
            int half = e != NULL && e->op == FC_OP_CONST && e->ckind == FC_CONST_FLOAT && e->fval == 0.5
                       && fc_dtypes[opct].kind == 'f';
            subst(raw, fc_ops[half ? FC_OP_SQRT : n->op].cexpr, args, fc_dtypes[opct].suffix);
        }
        if (opct != ct && fc_ops[n->op].rule != FC_R_BOOL) {
            fc_expr_convert(E, expr, raw, opct, ct);
        }
        else {
            snprintf(expr, EXPR, "%s", raw);
        }
        emit_def(E, v, fc_expr_ctype(E, ct), expr);
    }
    return 0;
}

int
fc_expr_stored(const FcExprGen *E, int v, FcAlign al, char *out)
{
    int o = fc_expr_find_operand(E, E->s->sn[v].slot, al);
    char tn[32];
    tname(E, v, tn, sizeof(tn));
    store_expr(out, tn, E->s->slots[E->K->ops[o].slot].dtype);
    return o;
}

void
fc_expr_emit_store(FcExprGen *E, int v)
{
    char val[EXPR], mem[EXPR];
    int o = fc_expr_stored(E, v, FC_ALIGN_FULL, val);
    E->t->mem(E, o, mem);
    FC_LINE(E, "%s = %s;", mem, val);
}

int
fc_expr_has_materialized(const FcExprGen *E, FcValKind kind)
{
    for (int m = 0; m < E->K->nnodes; m++) {
        const FcSNode *sn = &E->s->sn[E->K->nodes[m]];
        if (sn->materialize && sn->kind == kind) {
            return 1;
        }
    }
    return 0;
}

void
fc_expr_emit_outer_stores(FcExprGen *E)
{
    const FcSpec *s = E->s;
    const FcKernelIR *K = E->K;
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (s->sn[v].materialize && s->sn[v].kind == FC_VK_OUTER) {
            char val[EXPR], mem[EXPR];
            int o = fc_expr_stored(E, v, s->sn[v].keepform ? FC_ALIGN_FULL : FC_ALIGN_OUTER, val);
            E->t->mem(E, o, mem);
            FC_LINE(E, "%s = %s;", mem, val);
        }
    }
}

int
fc_expr_outer_node(const FcExprGen *E, int v, int level)
{
    const FcSNode *sn = &E->s->sn[v];
    return sn->kind == FC_VK_OUTER && !fc_expr_is_red(E->s, v) && sn->level == level;
}

int
fc_expr_emit_outer_nodes(FcExprGen *E, int level)
{
    for (int m = 0; m < E->K->nnodes; m++) {
        int v = E->K->nodes[m];
        if (fc_expr_outer_node(E, v, level) && fc_expr_emit_node(E, v) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * reductions: accumulators
 * ---------------------------------------------------------------------- */

int
fc_expr_acc_dtype(const FcSpec *s, int v)
{
    int op = s->g->nodes[v].op;
    int in = fc_dtype_compute(s->sn[s->g->nodes[v].in[0]].dtype);
    switch (op) {
    case FC_OP_SUM:
    case FC_OP_PROD:
        if (fc_dtypes[in].kind == 'f') {
            return FC_F64;
        }
        return fc_dtypes[in].kind == 'u' ? FC_U64 : FC_I64;
    case FC_OP_ANY:
    case FC_OP_ALL:
        return FC_I32;
    default:
        return in;
    }
}

void
fc_expr_acc_init(const FcSpec *s, int v, char *out)
{
    int op = s->g->nodes[v].op, a = fc_expr_acc_dtype(s, v);
    const char *lo = "0", *hi = "0";
    static const char *mins[] = {"0", "INT8_MIN", "INT16_MIN", "INT32_MIN", "INT64_MIN",
                                 "0", "0", "0", "0"};
    static const char *maxs[] = {"1", "INT8_MAX", "INT16_MAX", "INT32_MAX", "INT64_MAX",
                                 "UINT8_MAX", "UINT16_MAX", "UINT32_MAX", "UINT64_MAX"};
    if (fc_dtypes[a].kind == 'f') {
        lo = "-INFINITY";
        hi = "INFINITY";
    }
    else if (a <= FC_U64) {
        lo = mins[a];
        hi = maxs[a];
    }
    switch (op) {
    case FC_OP_SUM: snprintf(out, EXPR, "0"); break;
    case FC_OP_PROD: snprintf(out, EXPR, "1"); break;
    case FC_OP_AMAX: case FC_OP_ARGMAX: snprintf(out, EXPR, "%s", lo); break;
    case FC_OP_AMIN: case FC_OP_ARGMIN: snprintf(out, EXPR, "%s", hi); break;
    case FC_OP_ANY: snprintf(out, EXPR, "0"); break;
    default: snprintf(out, EXPR, "1"); break;
    }
}

int
fc_expr_has_nan_flag(const FcSpec *s, int v)
{
    int op = s->g->nodes[v].op;
    return (op == FC_OP_AMAX || op == FC_OP_AMIN) && fc_dtypes[fc_expr_acc_dtype(s, v)].kind == 'f';
}

/* A sum of float32 values (float16 and bfloat16 compute in float32) into a
 * float64 accumulator: in gen_c's lane loops it adds to float32 lane partials
 * over blocks of at most 16 values a lane, folded into the float64 lanes at
 * each block's end (emit_lanes); in its column blocks, to float32 partials
 * per column over blocks of at most 16 rows (emit_cols_sweep) */
int
fc_expr_sum_blocked(const FcSpec *s, int v)
{
    return s->g->nodes[v].op == FC_OP_SUM && fc_expr_acc_dtype(s, v) == FC_F64 &&
           fc_dtype_compute(s->sn[s->g->nodes[v].in[0]].dtype) == FC_F32;
}

int
fc_expr_has_index(const FcSpec *s, int v)
{
    int op = s->g->nodes[v].op;
    return op == FC_OP_ARGMAX || op == FC_OP_ARGMIN;
}

int
fc_expr_needs_nonempty(const FcSpec *s, const FcKernelIR *K)
{
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m], op = s->g->nodes[v].op;
        if (fc_expr_is_red(s, v) && !s->g->nodes[v].quiet_empty &&
                (op == FC_OP_AMAX || op == FC_OP_AMIN || fc_expr_has_index(s, v))) {
            return 1;
        }
    }
    return 0;
}

static void
declare_acc(FcExprGen *E, int v)
{
    char init[EXPR];
    fc_expr_acc_init(E->s, v, init);
    FC_LINE(E, "%s acc%d = %s;", fc_expr_ctype(E, fc_expr_acc_dtype(E->s, v)), v, init);
    if (fc_expr_has_nan_flag(E->s, v)) {
        FC_LINE(E, "int nan%d = 0;", v);
    }
    if (fc_expr_has_index(E->s, v)) {
        FC_LINE(E, "int64_t idx%d = 0;", v);
    }
}

int
fc_expr_level_reds(const FcExprGen *E, int level, int *reds)
{
    int nreds = 0;
    for (int m = 0; m < E->K->nnodes; m++) {
        int v = E->K->nodes[m];
        if (fc_expr_is_red(E->s, v) && E->s->sn[v].level == level && nreds < FC_MAX_KERNEL_REDS) {
            reds[nreds++] = v;
        }
    }
    return nreds;
}

int
fc_expr_begin_level(FcExprGen *E, int level, int *reds)
{
    int nreds = fc_expr_level_reds(E, level, reds);
    FC_LINE(E, "/* sweep %d: %d reduction%s */", level, nreds, nreds == 1 ? "" : "s");
    for (int r = 0; r < nreds; r++) {
        declare_acc(E, reds[r]);
    }
    return nreds;
}

void
fc_expr_accumulate(FcExprGen *E, int v, const char *x, const char *j)
{
    int op = E->s->g->nodes[v].op;
    const char *ty = fc_expr_ctype(E, fc_expr_acc_dtype(E->s, v));
    const char *b = E->cols ? "[b]" : E->lane ? E->lane : "";
    if (E->lane_block != NULL && fc_expr_sum_blocked(E->s, v)) {
        FC_LINE(E, "acc%d%s += %s;", v, E->lane_block, x);    /* float32 partials */
        return;
    }
    switch (op) {
    case FC_OP_SUM: FC_LINE(E, "acc%d%s += (%s)%s;", v, b, ty, x); break;
    case FC_OP_PROD: FC_LINE(E, "acc%d%s *= (%s)%s;", v, b, ty, x); break;
    case FC_OP_AMAX:
    case FC_OP_AMIN:
        FC_LINE(E, "acc%d%s = %s %s acc%d%s ? %s : acc%d%s;", v, b, x, op == FC_OP_AMAX ? ">" : "<",
                v, b, x, v, b);
        if (fc_expr_has_nan_flag(E->s, v)) {
            FC_LINE(E, "nan%d%s |= %s != %s;", v, b, x, x);
        }
        break;
    case FC_OP_ARGMAX:
    case FC_OP_ARGMIN:
        /* the first extreme wins; the first NaN beats everything */
        FC_LINE(E, "if (%s %s acc%d%s || (%s != %s && acc%d%s == acc%d%s)) {", x,
                op == FC_OP_ARGMAX ? ">" : "<", v, b, x, x, v, b, v, b);
        FC_LINE(E, "    acc%d%s = %s;", v, b, x);
        FC_LINE(E, "    idx%d%s = %s;", v, b, j);
        FC_LINE(E, "}");
        break;
    case FC_OP_ANY: FC_LINE(E, "acc%d%s |= (%s != 0);", v, b, x); break;
    default: FC_LINE(E, "acc%d%s &= (%s != 0);", v, b, x); break;
    }
}

int
fc_expr_feed(FcExprGen *E, int v, const char *j)
{
    char x[EXPR];
    /* x is in the input's compute type; accumulate casts it to the accumulator's */
    if (fc_expr_value(E, E->s->g->nodes[v].in[0], v, x) < 0) {
        return -1;
    }
    fc_expr_accumulate(E, v, x, j);
    return 0;
}

void
fc_expr_emit_red_result(FcExprGen *E, int v)
{
    const FcSpec *s = E->s;
    int op = s->g->nodes[v].op;
    const char *ct = fc_expr_ctype(E, fc_dtype_compute(s->sn[v].dtype));
    const char *b = E->cols ? "[b]" : "";
    char e[EXPR];
    if (fc_expr_has_index(s, v)) {
        snprintf(e, EXPR, "idx%d%s", v, b);
        emit_def(E, v, "int64_t", e);
    }
    else if (fc_expr_has_nan_flag(s, v)) {
        snprintf(e, EXPR, "nan%d%s ? (%s)NAN : (%s)acc%d%s", v, b, ct, ct, v, b);
        emit_def(E, v, ct, e);
    }
    else if (op == FC_OP_ANY || op == FC_OP_ALL) {
        snprintf(e, EXPR, "acc%d%s != 0", v, b);
        emit_def(E, v, E->t->bool_type, e);
    }
    else {
        snprintf(e, EXPR, "(%s)acc%d%s", ct, v, b);
        emit_def(E, v, ct, e);
    }
}

#define CANON_DIGIT(c) ((c) >= '0' && (c) <= '9')
#define CANON_ALPHA(c) (((c) >= 'a' && (c) <= 'z') || ((c) >= 'A' && (c) <= 'Z') || (c) == '_')
#define CANON_ALNUM(c) (CANON_ALPHA(c) || CANON_DIGIT(c))

/* The prefixes fc_expr_canon_names renumbers. The rule that keeps renaming
 * safe: the generators (gen_c.c, gen_expr.c, gen_cuda.c) and the kernel
 * headers use <prefix><digits> only for locals numbered by graph node. A
 * local numbered by anything else (operand, lane, dimension) must take
 * another prefix (x, p, s, ob, w, in, out do), or it would be renumbered
 * with the nodes; a new node-numbered local must be listed here, or equal
 * kernels stop sharing (tests: test_cache, test_torch_lowering). */
static int
canon_prefix(const char *id, size_t n)
{
    static const char *const prefixes[] = {"t", "acc", "nan", "part", "idx", "sm", "smn", "smi"};
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        size_t pl = strlen(prefixes[i]);
        if (n > pl && memcmp(id, prefixes[i], pl) == 0 && CANON_DIGIT(id[pl])) {
            return (int)pl;
        }
    }
    return 0;
}

/* Node-numbered locals (t<v>, acc<v>, nan<v>, part<v>, idx<v>; CUDA's
 * shared arrays sm<v>, smn<v>, smi<v>; with any suffix such as _l) carry
 * graph node indices, so two kernels that differ only in where their nodes
 * sit in the graph (the same layer norm in every layer of a model, a bias
 * gradient per linear layer) would differ in text, and in name and cache key
 * with it. This renumbers them 0, 1, ... in order of first appearance,
 * outside comments, so such kernels are one text, one name and one compile.
 * Returns a new string (fc_str_release), or NULL + MemoryError. nnodes
 * bounds the indices; a larger one is left as it is. Identifiers are ASCII
 * (no locale-dependent ctype). */
char *
fc_expr_canon_names(const char *src, int nnodes)
{
    FcStr b = {0};
    int *map = PyMem_Malloc((size_t)(nnodes + 1) * sizeof(int));
    int next = 0;
    const char *p = src;
    if (map == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (int v = 0; v <= nnodes; v++) {
        map[v] = -1;
    }
    while (*p) {
        if (p[0] == '/' && p[1] == '*') {                     /* a comment: as it is */
            const char *end = strstr(p + 2, "*/");
            size_t n = end ? (size_t)(end + 2 - p) : strlen(p);
            fc_str_printf(&b, "%.*s", (int)n, p);
            p += n;
            continue;
        }
        if (CANON_ALPHA(*p)) {       /* one identifier */
            size_t n = 1, pl;
            while (CANON_ALNUM(p[n])) {
                n++;
            }
            pl = (size_t)canon_prefix(p, n);
            if (pl > 0) {
                size_t d = pl;
                long v = 0;
                while (d < n && p[d] >= '0' && p[d] <= '9' && v <= nnodes) {
                    v = v * 10 + (p[d] - '0');
                    d++;
                }
                if ((d == n || p[d] == '_') && v < nnodes && !(p[pl] == '0' && d > pl + 1)) {
                    if (map[v] < 0) {
                        map[v] = next++;
                    }
                    fc_str_printf(&b, "%.*s%d%.*s", (int)pl, p, map[v], (int)(n - d), p + d);
                    p += n;
                    continue;
                }
            }
            fc_str_printf(&b, "%.*s", (int)n, p);
            p += n;
            continue;
        }
        if (CANON_DIGIT(*p)) {                    /* a number: 1e5f is not an identifier */
            size_t n = 1;
            while (CANON_ALNUM(p[n]) || p[n] == '.') {
                n++;
            }
            fc_str_printf(&b, "%.*s", (int)n, p);
            p += n;
            continue;
        }
        fc_str_printf(&b, "%c", *p);
        p++;
    }
    PyMem_Free(map);
    return fc_str_take(&b);
}
