/* Renderer, CPU: one fused kernel -> C11 + OpenMP source text.
 * In: FcSpec + kernel index. Out: a malloc'd string. Never compiles or runs
 * anything (csrc/runtime does); loop skeletons live in fc_kernel.h.
 *
 * Shape of the output:
 *   pointwise:  NAME_range(L, lo, hi) over the outer space, split by threads
 *   reduction:  NAME_rows(L, lo, hi): a thread owns whole outer elements, or
 *               NAME_split(L): threads share each outer element's inner range
 *               (few, long rows), combining partials at barriers. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "shape.h"
#include "spec.h"
#include "strbuf.h"

#define EXPR 512

typedef enum { SP_FLAT, SP_OUTER_RUN, SP_INNER_RUN, SP_OUTER_POINT } Space;

typedef struct {
    const FcSpec *s;
    const FcKernelIR *K;
    FcStr *b;
    int depth;
    Space sp;            /* how buffer operands are addressed right now */
    int unit;            /* runs: every operand has unit stride (or stride 0, see bcast) */
    char bcast[FC_MAXOPS]; /* unit runs: operand broadcast along the run (stride 0): p[0] */
    int cols;            /* column blocks: OUTER values are arrays over b */
    int stash, stash_op; /* a costly FULL value the last reduction sweep writes into an
                          * output the final sweep then reads back (-1: none) */
    int stash_level;
    int in_stash_sweep;  /* emitting the sweep of stash_level */
    char *loaded;        /* per operand: a local x<o> holds its value in this body */
    char opname[FC_MAXOPS][16];
} Gen;

static const char *
ctname(int dt)
{
    switch (dt) {
    case FC_BOOL: return "_Bool";
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

static const char *
storename(int dt)
{
    return fc_dtypes[dt].ctype;
}

#define LINE(G, ...)                            \
    do {                                        \
        fc_str_indent((G)->b, (G)->depth);      \
        fc_str_printf((G)->b, __VA_ARGS__);     \
        fc_str_puts((G)->b, "\n");              \
    } while (0)

/* ------------------------------------------------------------------------
 * conversions
 * ---------------------------------------------------------------------- */

/* expr (of compute type `from`) as compute type `to` */
static void
convert(char *out, const char *expr, int from, int to)
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
        snprintf(out, EXPR, "((%s)(%s))", ctname(to), expr);
    }
}

static void
load_expr(char *out, const char *mem, int dt)
{
    switch (dt) {
    case FC_F16: snprintf(out, EXPR, "fc_load_f16(%s)", mem); break;
    case FC_BF16: snprintf(out, EXPR, "fc_load_bf16(%s)", mem); break;
    case FC_BOOL: snprintf(out, EXPR, "((_Bool)%s)", mem); break;
    default: snprintf(out, EXPR, "%s", mem); break;
    }
}

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
literal(char *out, const FcNode *n, int dt)
{
    if (n->ckind == FC_CONST_FLOAT) {
        if (isnan(n->fval)) {
            snprintf(out, EXPR, "((%s)NAN)", ctname(dt));
        }
        else if (isinf(n->fval)) {
            snprintf(out, EXPR, "((%s)%sINFINITY)", ctname(dt), n->fval < 0 ? "-" : "");
        }
        else {
            snprintf(out, EXPR, "((%s)%.17g)", ctname(dt), n->fval);
        }
    }
    else if (n->ckind == FC_CONST_BOOL) {
        snprintf(out, EXPR, "((%s)%d)", ctname(dt), n->ival != 0);
    }
    else if (n->ival == INT64_MIN) {
        snprintf(out, EXPR, "((%s)INT64_MIN)", ctname(dt));
    }
    else {
        snprintf(out, EXPR, "((%s)%lldLL)", ctname(dt), (long long)n->ival);
    }
}

/* ------------------------------------------------------------------------
 * operands
 * ---------------------------------------------------------------------- */

static int
is_red(const FcSpec *s, int v)
{
    return fc_ops[s->g->nodes[v].op].kind == FC_KIND_RED && s->sn[v].axes != 0;
}

static int
in_kernel(const Gen *G, int v)
{
    return G->s->sn[v].in_seg && G->s->g->nodes[v].op != FC_OP_CONST &&
           G->s->sn[v].kernel == (int)(G->K - G->s->kernels);
}

static FcAlign
consumer_align(const FcSpec *s, int consumer)
{
    const FcSNode *c = &s->sn[consumer];
    if (is_red(s, consumer)) {
        return FC_ALIGN_FULL;
    }
    return (c->kind == FC_VK_OUTER && !c->keepform) ? FC_ALIGN_OUTER : FC_ALIGN_FULL;
}

static int
find_operand(const Gen *G, int slot, FcAlign al)
{
    for (int o = 0; o < G->K->nops; o++) {
        if (G->K->ops[o].slot == slot && G->K->ops[o].align == al) {
            return o;
        }
    }
    return -1;
}

static int
operand_is_scalar(const Gen *G, int o)
{
    const FcSlot *sl = &G->s->slots[G->K->ops[o].slot];
    for (int d = 0; d < sl->ndim; d++) {
        if (sl->dims[d] != 0) {
            return 0;
        }
    }
    return 1;
}

/* operand o's last dim is size 1 in the key (or it is 0-d): broadcast along a run */
static int
operand_last_dim_is_one(const Gen *G, int o)
{
    const FcSlot *sl = &G->s->slots[G->K->ops[o].slot];
    return sl->ndim == 0 || sl->dims[sl->ndim - 1] == 0;
}

/* memory expression of operand o at the current point */
static void
mem_expr(const Gen *G, int o, char *out)
{
    switch (G->sp) {
    case SP_FLAT:
        snprintf(out, EXPR, operand_is_scalar(G, o) ? "%s[0]" : "%s[i]", G->opname[o]);
        break;
    case SP_OUTER_RUN:
    case SP_INNER_RUN:
        if (G->cols) {
            snprintf(out, EXPR, "p%d[i * s%d + b]", o, o);
        }
        else if (G->unit) {
            snprintf(out, EXPR, G->bcast[o] ? "p%d[0]" : "p%d[i]", o);
        }
        else {
            snprintf(out, EXPR, "p%d[i * s%d]", o, o);
        }
        break;
    case SP_OUTER_POINT:
        snprintf(out, EXPR, G->cols ? "%s[ob%d + b]" : "%s[ob%d]", G->opname[o], o);
        break;
    }
}

/* C expression for value u read by `consumer`, in u's compute type */
static int
value_of(Gen *G, int u, int consumer, char *out)
{
    const FcSpec *s = G->s;
    const FcNode *n = &s->g->nodes[u];
    if (n->op == FC_OP_CONST) {
        literal(out, n, s->sn[u].dtype);
        return 0;
    }
    if (in_kernel(G, u)) {
        snprintf(out, EXPR, G->cols && s->sn[u].kind == FC_VK_OUTER ? "t%d[b]" : "t%d", u);
        return 0;
    }
    {
        int o = find_operand(G, s->sn[u].slot, consumer_align(s, consumer));
        char mem[EXPR], val[EXPR];
        if (o < 0) {
            PyErr_Format(PyExc_SystemError, "gen_c: node %d reads node %d with no operand", consumer, u);
            return -1;
        }
        if (!G->loaded[o]) {
            mem_expr(G, o, mem);
            load_expr(val, mem, s->slots[G->K->ops[o].slot].dtype);
            LINE(G, "const %s x%d = %s;", ctname(fc_dtype_compute(s->slots[G->K->ops[o].slot].dtype)), o, val);
            G->loaded[o] = 1;
        }
        snprintf(out, EXPR, "x%d", o);
        return 0;
    }
}

/* ------------------------------------------------------------------------
 * one node as a statement: const T tN = expr;
 * ---------------------------------------------------------------------- */

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
emit_def(Gen *G, int v, const char *type, const char *expr)
{
    if (G->cols && G->s->sn[v].kind == FC_VK_OUTER) {
        LINE(G, "t%d[b] = %s;", v, expr);
    }
    else {
        LINE(G, "const %s t%d = %s;", type, v, expr);
    }
}

/* Comparisons NumPy 2 makes exact where promotion would not: a signed int
 * with a uint64 (promoted: float64), and a Python int outside the other
 * side's integer range (promoted: wrapped). Returns 0 when emitted, 1 when
 * the ordinary path applies, -1 on error. */
static int
emit_exact_compare(Gen *G, int v, const int *dt, const int *wk)
{
    const FcSpec *s = G->s;
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
            if (value_of(G, n->in[i], v, raw) < 0) {
                return -1;
            }
            convert(i ? b : a, raw, dt[i], FC_I64);
        }
        {
            char e[EXPR];
            snprintf(e, EXPR, "(%s %s %s)", a, syms[n->op - FC_OP_EQ], b);
            emit_def(G, v, "_Bool", e);
        }
        return 0;
    }
    return 1;
mixed:
    for (int i = 0; i < 2; i++) {
        if (value_of(G, n->in[i], v, raw) < 0) {
            return -1;
        }
        convert(i ? b : a, raw, dt[i], sig[i] ? FC_I64 : FC_U64);
    }
    {
        char e[EXPR];
        snprintf(e, EXPR, "fc_%s_%s(%s, %s)", name, sig[0] ? "iu" : "ui", a, b);
        emit_def(G, v, "_Bool", e);
    }
    return 0;
}

static int
emit_node(Gen *G, int v)
{
    const FcSpec *s = G->s;
    const FcNode *n = &s->g->nodes[v];
    const FcSNode *sn = &s->sn[v];
    int ct = fc_dtype_compute(sn->dtype);
    char args[3][EXPR], raw[EXPR], expr[EXPR];
    int dt[3] = {0, 0, 0}, wk[3] = {0, 0, 0};

    if (n->op == FC_OP_RCOUNT) {
        emit_def(G, v, "int64_t", sn->axes ? "L->n_inner" : "1");
        return 0;
    }
    for (int j = 0; j < n->nin; j++) {
        dt[j] = s->sn[n->in[j]].dtype;
        wk[j] = s->sn[n->in[j]].weak;
    }
    if (n->op == FC_OP_CAST || fc_ops[n->op].kind == FC_KIND_RED) {
        /* casts; reductions over no axes are casts too (np.sum(x, axis=())) */
        if (value_of(G, n->in[0], v, raw) < 0) {
            return -1;
        }
        if (n->op == FC_OP_ARGMAX || n->op == FC_OP_ARGMIN) {
            snprintf(expr, EXPR, "((int64_t)0)");
        }
        else if (n->op == FC_OP_ANY || n->op == FC_OP_ALL) {
            convert(expr, raw, dt[0], FC_BOOL);
        }
        else if (dt[0] == FC_F64 && (sn->dtype == FC_F16 || sn->dtype == FC_BF16)) {
            /* one rounding, not two: round to odd into float32 first */
            const char *h = sn->dtype == FC_F16 ? "f16" : "bf16";
            snprintf(expr, EXPR, "fc_load_%s(fc_store_%s(fc_f64_to_f32_odd(%s)))", h, h, raw);
        }
        else {
            convert(expr, raw, dt[0], ct);
        }
        emit_def(G, v, ctname(ct), expr);
        return 0;
    }
    if (n->op >= FC_OP_EQ && n->op <= FC_OP_GE) {
        int rc = emit_exact_compare(G, v, dt, wk);
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
            if (value_of(G, n->in[j], v, raw) < 0) {
                return -1;
            }
            convert(args[j], raw, dt[j], want);
        }
        subst(raw, fc_ops[n->op].cexpr, args, fc_dtypes[opct].suffix);
        if (opct != ct && fc_ops[n->op].rule != FC_R_BOOL) {
            convert(expr, raw, opct, ct);
        }
        else {
            snprintf(expr, EXPR, "%s", raw);
        }
        emit_def(G, v, ctname(ct), expr);
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * reductions: accumulators
 * ---------------------------------------------------------------------- */

static int
acc_dtype(const FcSpec *s, int v)
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

static void
acc_init(const FcSpec *s, int v, char *out)
{
    int op = s->g->nodes[v].op, a = acc_dtype(s, v);
    int isf = fc_dtypes[a].kind == 'f';
    const char *lo = "0", *hi = "0";
    static const char *mins[] = {"0", "INT8_MIN", "INT16_MIN", "INT32_MIN", "INT64_MIN",
                                 "0", "0", "0", "0"};
    static const char *maxs[] = {"1", "INT8_MAX", "INT16_MAX", "INT32_MAX", "INT64_MAX",
                                 "UINT8_MAX", "UINT16_MAX", "UINT32_MAX", "UINT64_MAX"};
    if (isf) {
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

static int
has_nan_flag(const FcSpec *s, int v)
{
    int op = s->g->nodes[v].op;
    return (op == FC_OP_AMAX || op == FC_OP_AMIN) && fc_dtypes[acc_dtype(s, v)].kind == 'f';
}

static int
has_index(const FcSpec *s, int v)
{
    int op = s->g->nodes[v].op;
    return op == FC_OP_ARGMAX || op == FC_OP_ARGMIN;
}

static void
declare_acc(Gen *G, int v)
{
    char init[EXPR];
    acc_init(G->s, v, init);
    LINE(G, "%s acc%d = %s;", ctname(acc_dtype(G->s, v)), v, init);
    if (has_nan_flag(G->s, v)) {
        LINE(G, "int nan%d = 0;", v);
    }
    if (has_index(G->s, v)) {
        LINE(G, "int64_t idx%d = 0;", v);
    }
}

/* fold value `x` (with flat inner index `j`) into v's accumulator */
static void
accumulate(Gen *G, int v, const char *x, const char *j)
{
    int op = G->s->g->nodes[v].op;
    const char *ty = ctname(acc_dtype(G->s, v));
    const char *b = G->cols ? "[b]" : "";
    switch (op) {
    case FC_OP_SUM: LINE(G, "acc%d%s += (%s)%s;", v, b, ty, x); break;
    case FC_OP_PROD: LINE(G, "acc%d%s *= (%s)%s;", v, b, ty, x); break;
    case FC_OP_AMAX:
    case FC_OP_AMIN:
        LINE(G, "acc%d%s = %s %s acc%d%s ? %s : acc%d%s;", v, b, x, op == FC_OP_AMAX ? ">" : "<",
             v, b, x, v, b);
        if (has_nan_flag(G->s, v)) {
            LINE(G, "nan%d%s |= %s != %s;", v, b, x, x);
        }
        break;
    case FC_OP_ARGMAX:
    case FC_OP_ARGMIN:
        /* the first extreme wins; the first NaN beats everything */
        LINE(G, "if (%s %s acc%d%s || (%s != %s && acc%d%s == acc%d%s)) {", x,
             op == FC_OP_ARGMAX ? ">" : "<", v, b, x, x, v, b, v, b);
        LINE(G, "    acc%d%s = %s;", v, b, x);
        LINE(G, "    idx%d%s = %s;", v, b, j);
        LINE(G, "}");
        break;
    case FC_OP_ANY: LINE(G, "acc%d%s |= (%s != 0);", v, b, x); break;
    default: LINE(G, "acc%d%s &= (%s != 0);", v, b, x); break;
    }
}

/* "#pragma omp simd reduction(...)..." for a unit-stride run, or "" when
 * an arg-reduction needs first-index order (the loop then stays scalar) */
static void
simd_clauses(const Gen *G, const int *reds, int nreds, FcStr *out)
{
    for (int r = 0; r < nreds; r++) {
        if (has_index(G->s, reds[r])) {
            return;
        }
    }
    fc_str_puts(out, "#pragma omp simd");
    for (int r = 0; r < nreds; r++) {
        int v = reds[r], op = G->s->g->nodes[v].op;
        const char *how = op == FC_OP_SUM ? "+" : op == FC_OP_PROD ? "*" : op == FC_OP_AMAX ? "max"
                        : op == FC_OP_AMIN ? "min" : op == FC_OP_ANY ? "|" : "&";
        fc_str_printf(out, " reduction(%s:acc%d)", how, v);
        if (has_nan_flag(G->s, v)) {
            fc_str_printf(out, " reduction(|:nan%d)", v);
        }
    }
}

/* ------------------------------------------------------------------------
 * sweeps: loops over the outer space (pointwise) or one row's inner space
 * ---------------------------------------------------------------------- */

/* mark every FULL node of this kernel that `v` needs */
static void
need_full(const Gen *G, int v, char *need)
{
    const FcNode *n = &G->s->g->nodes[v];
    if (!in_kernel(G, v) || G->s->sn[v].kind != FC_VK_FULL || is_red(G->s, v) || need[v]) {
        return;
    }
    need[v] = 1;
    for (int j = 0; j < n->nin; j++) {
        need_full(G, n->in[j], need);
    }
}

/* operands a sweep reads or writes through strides */
static void
sweep_operands(const Gen *G, const char *need, const int *reds, int nreds, int store, char *use)
{
    const FcSpec *s = G->s;
    memset(use, 0, FC_MAXOPS);
    if (G->stash >= 0 && (need[G->stash] == 2 || G->in_stash_sweep)) {
        use[G->stash_op] = 1;
    }
    for (int v = 0; v < s->g->nnodes; v++) {
        int reads = need[v] == 1;
        for (int r = 0; r < nreds; r++) {
            reads |= reds[r] == v;
        }
        if (!reads) {
            continue;
        }
        for (int j = 0; j < s->g->nodes[v].nin; j++) {
            int u = s->g->nodes[v].in[j];
            if (s->g->nodes[u].op != FC_OP_CONST && !in_kernel(G, u)) {
                int o = find_operand(G, s->sn[u].slot, FC_ALIGN_FULL);
                if (o >= 0) {
                    use[o] = 1;
                }
            }
        }
        if (store && need[v] && s->sn[v].materialize) {
            use[find_operand(G, s->sn[v].slot, FC_ALIGN_FULL)] = 1;
        }
    }
}

/* the innermost loop of a sweep over one run of `len` elements */
static int
emit_run(Gen *G, const char *need, const int *reds, int nreds, int store, int simd)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    int nn = s->g->nnodes;
    if (simd) {
        FcStr pragma = {0};
        char *text;
        simd_clauses(G, reds, nreds, &pragma);
        if ((text = fc_str_take(&pragma)) == NULL) {
            return -1;
        }
        if (text[0]) {
            LINE(G, "%s", text);
        }
        fc_str_release(text);
    }
    else {
        LINE(G, "#pragma omp simd safelen(1)   /* strided: scalar, quick to compile */");
    }
    LINE(G, "for (int64_t i = 0; i < len; i++) {");
    G->depth++;
    memset(G->loaded, 0, FC_MAXOPS);
    for (int v = 0; v < nn; v++) {
        if (need[v] == 2) {
            /* computed by an earlier sweep and parked in an output: read it back */
            const char *ty = ctname(fc_dtype_compute(s->sn[v].dtype));
            if (G->unit) {
                LINE(G, "const %s t%d = p%d[i];", ty, v, G->stash_op);
            }
            else {
                LINE(G, "const %s t%d = p%d[i * s%d];", ty, v, G->stash_op, G->stash_op);
            }
        }
        else if (need[v] && emit_node(G, v) < 0) {
            return -1;
        }
    }
    if (G->in_stash_sweep) {
        if (G->unit) {
            LINE(G, "p%d[i] = t%d;", G->stash_op, G->stash);
        }
        else {
            LINE(G, "p%d[i * s%d] = t%d;", G->stash_op, G->stash_op, G->stash);
        }
    }
    for (int r = 0; r < nreds; r++) {
        const FcNode *n = &s->g->nodes[reds[r]];
        char raw[EXPR], x[EXPR];
        int ct = fc_dtype_compute(s->sn[n->in[0]].dtype);
        if (value_of(G, n->in[0], reds[r], raw) < 0) {
            return -1;
        }
        convert(x, raw, s->sn[n->in[0]].dtype, ct);
        if (strcmp(x, raw) != 0) {
            LINE(G, "const %s r%d = %s;", ctname(ct), reds[r], x);
            snprintf(x, EXPR, "r%d", reds[r]);
        }
        accumulate(G, reds[r], x, "(j0 + i)");
    }
    if (store) {
        for (int v = 0; v < nn; v++) {
            if (need[v] && s->sn[v].materialize) {
                int o = find_operand(G, s->sn[v].slot, FC_ALIGN_FULL);
                char val[EXPR], name[32];
                snprintf(name, sizeof(name), "t%d", v);
                store_expr(val, name, s->slots[K->ops[o].slot].dtype);
                if (G->unit) {
                    LINE(G, "p%d[i] = %s;", o, val);
                }
                else {
                    LINE(G, "p%d[i * s%d] = %s;", o, o, val);
                }
            }
        }
    }
    G->depth--;
    LINE(G, "}");
    return 0;
}

/* One sweep. inner: over the row's inner space [jlo, jhi) (reductions), else
 * over the outer space [lo, hi) (pointwise, strided). reds: reductions fed
 * by this sweep; store: write materialized FULL values. */
static int
emit_sweep(Gen *G, int inner, const int *reds, int nreds, int store)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    int nn = s->g->nnodes, rc = -1;
    char *need = PyMem_Calloc(nn + 1, 1), use[FC_MAXOPS], saved[FC_MAXOPS];
    const char *nd = inner ? "L->nd_inner" : "L->nd_outer";
    const char *shape = inner ? "L->ishape" : "L->oshape";
    const char *stride = inner ? "L->istride" : "L->ostride";
    const char *lo = inner ? "jlo" : "lo", *hi = inner ? "jhi" : "hi";

    if (need == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int r = 0; r < nreds; r++) {
        need_full(G, s->g->nodes[reds[r]].in[0], need);
    }
    if (store && G->stash >= 0) {
        need[G->stash] = 2;          /* read back, not recomputed (need_full stops here) */
    }
    if (store) {
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            if (s->sn[v].materialize && s->sn[v].kind == FC_VK_FULL) {
                need_full(G, v, need);
            }
        }
    }
    sweep_operands(G, need, reds, nreds, store, use);
    G->sp = inner ? SP_INNER_RUN : SP_OUTER_RUN;
    memcpy(saved, G->loaded, FC_MAXOPS);   /* locals loaded inside the loop die with it */

    LINE(G, "{");
    G->depth++;
    LINE(G, "int64_t idx[FC_LAUNCH_MAXDIM];");
    LINE(G, "fc_unravel(%s, %s, %s, idx);", lo, nd, shape);
    LINE(G, "for (int64_t j0 = %s; j0 < %s;) {", lo, hi);
    G->depth++;
    LINE(G, "const int64_t len = fc_run_length(%s, %s, idx, %s - j0);", nd, shape, hi);
    for (int o = 0; o < K->nops; o++) {
        int dt;
        if (!use[o]) {
            continue;
        }
        dt = s->slots[K->ops[o].slot].dtype;
        if (inner) {
            /* the row's outer offset, then the run's inner offset */
            LINE(G, "%s%s *restrict p%d = %s + ob%d + fc_offset(%s, idx, %s[%d]);",
                 K->ops[o].is_out ? "" : "const ", storename(dt), o, G->opname[o], o, nd, stride, o);
        }
        else {
            LINE(G, "%s%s *restrict p%d = %s + fc_offset(%s, idx, %s[%d]);",
                 K->ops[o].is_out ? "" : "const ", storename(dt), o, G->opname[o], nd, stride, o);
        }
        LINE(G, "const int64_t s%d = %s[%d][%s - 1];", o, stride, o, nd);
    }
    /* two versions of the run: every operand unit-stride (vectorized with
     * omp simd), or general strides (scalar; omp simd would make gathers).
     * An input whose last dim is 1 in the key (b of shape (n, 1) in x + b) is
     * broadcast along a pointwise run: the fast version reads p[0] for it,
     * checked at run time (stride 0), instead of falling to the scalar one. */
    {
        FcStr cond = {0};
        char *c;
        memset(G->bcast, 0, sizeof(G->bcast));
        for (int o = 0; o < K->nops; o++) {
            if (use[o]) {
                G->bcast[o] = !inner && !K->ops[o].is_out && operand_last_dim_is_one(G, o);
                fc_str_printf(&cond, "%ss%d == %d", cond.len ? " && " : "", o, G->bcast[o] ? 0 : 1);
            }
        }
        c = fc_str_take(&cond);
        if (c == NULL) {
            goto cleanup;
        }
        if (c[0] == 0) {
            fc_str_release(c);
            G->unit = 1;
            if (emit_run(G, need, reds, nreds, store, 1) < 0) {
                goto cleanup;
            }
        }
        else {
            LINE(G, "if (%s) {", c);
            fc_str_release(c);
            G->depth++;
            G->unit = 1;
            if (emit_run(G, need, reds, nreds, store, 1) < 0) {
                goto cleanup;
            }
            G->depth--;
            LINE(G, "}");
            LINE(G, "else {");
            G->depth++;
            G->unit = 0;
            if (emit_run(G, need, reds, nreds, store, 0) < 0) {
                goto cleanup;
            }
            G->depth--;
            LINE(G, "}");
        }
    }
    memset(G->bcast, 0, sizeof(G->bcast));
    LINE(G, "j0 += len;");
    LINE(G, "fc_advance(%s, %s, idx, len);", nd, shape);
    G->depth--;
    LINE(G, "}");
    G->depth--;
    LINE(G, "}");
    rc = 0;
cleanup:
    memcpy(G->loaded, saved, FC_MAXOPS);
    PyMem_Free(need);
    return rc;
}

/* ------------------------------------------------------------------------
 * kernel bodies
 * ---------------------------------------------------------------------- */

static void
emit_operand_decls(Gen *G)
{
    const FcKernelIR *K = G->K;
    for (int o = 0; o < K->nops; o++) {
        int dt = G->s->slots[K->ops[o].slot].dtype;
        LINE(G, "%s%s *restrict %s = (%s%s *)L->ptr[%d];", K->ops[o].is_out ? "" : "const ",
             storename(dt), G->opname[o], K->ops[o].is_out ? "" : "const ", storename(dt), o);
    }
}

/* A flat kernel that does enough arithmetic per element (a transcendental,
 * a division, a pow) to keep the core busy: the hardware prefetcher then
 * falls behind on a cold input (measured: GELU on a 40 MB input just evicted
 * from L3, 2 cores, 5.4 -> 4.6 ms), and an explicit prefetch a few KB ahead
 * keeps it streaming. Cheap kernels are memory-bound already and skip it. */
static int
flat_is_heavy(const Gen *G)
{
    const FcSpec *s = G->s;
    for (int m = 0; m < G->K->nnodes; m++) {
        const FcNode *n = &s->g->nodes[G->K->nodes[m]];
        if (fc_dtypes[s->sn[G->K->nodes[m]].dtype].kind != 'f') {
            continue;
        }
        switch (n->op) {
        case FC_OP_EXP: case FC_OP_EXP2: case FC_OP_EXPM1: case FC_OP_LOG: case FC_OP_LOG2:
        case FC_OP_LOG10: case FC_OP_LOG1P: case FC_OP_SIN: case FC_OP_COS: case FC_OP_TAN:
        case FC_OP_TANH: case FC_OP_ASIN: case FC_OP_ACOS: case FC_OP_ATAN: case FC_OP_SINH:
        case FC_OP_COSH: case FC_OP_ASINH: case FC_OP_ACOSH: case FC_OP_ATANH: case FC_OP_ERF:
        case FC_OP_SIGMOID: case FC_OP_GELU: case FC_OP_GELU_TANH: case FC_OP_SILU:
        case FC_OP_SOFTPLUS: case FC_OP_POW: case FC_OP_ATAN2: case FC_OP_HYPOT:
            return 1;
        default:
            break;
        }
    }
    return 0;
}

static int
emit_pointwise(Gen *G, const char *name)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    LINE(G, "static void");
    LINE(G, "%s_range(const fc_launch *L, int64_t lo, int64_t hi, int *err)", name);
    LINE(G, "{");
    G->depth++;
    LINE(G, "int fc_err = 0;");
    emit_operand_decls(G);
    if (K->flat) {
        int heavy = flat_is_heavy(G);
        if (heavy) {
            /* blocks of FC_PF_BLOCK elements; each block first prefetches
             * its inputs FC_PF_BYTES ahead (see fc_kernel.h) */
            LINE(G, "for (int64_t i0 = lo; i0 < hi; i0 += FC_PF_BLOCK) {");
            G->depth++;
            LINE(G, "const int64_t i1 = hi - i0 > FC_PF_BLOCK ? i0 + FC_PF_BLOCK : hi;");
            for (int o = 0; o < K->nops; o++) {
                if (!K->ops[o].is_out && !operand_is_scalar(G, o)) {
                    LINE(G, "FC_PREFETCH_BLOCK(%s, i0, hi);", G->opname[o]);
                }
            }
        }
        LINE(G, "#pragma omp simd");
        LINE(G, heavy ? "for (int64_t i = i0; i < i1; i++) {" : "for (int64_t i = lo; i < hi; i++) {");
        G->depth++;
        G->sp = SP_FLAT;
        memset(G->loaded, 0, FC_MAXOPS);
        for (int m = 0; m < K->nnodes; m++) {
            if (emit_node(G, K->nodes[m]) < 0) {
                return -1;
            }
        }
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            if (s->sn[v].materialize) {
                int o = find_operand(G, s->sn[v].slot, FC_ALIGN_FULL);
                char val[EXPR], tn[32];
                snprintf(tn, sizeof(tn), "t%d", v);
                store_expr(val, tn, s->slots[K->ops[o].slot].dtype);
                LINE(G, "%s[i] = %s;", G->opname[o], val);
            }
        }
        G->depth--;
        LINE(G, "}");
        if (heavy) {
            G->depth--;
            LINE(G, "}");
        }
    }
    else if (emit_sweep(G, 0, NULL, 0, 1) < 0) {
        return -1;
    }
    LINE(G, "fc_report(err, fc_err);");
    G->depth--;
    LINE(G, "}");
    fc_str_puts(G->b, "\n");
    LINE(G, "FC_EXPORT int");
    LINE(G, "%s(const fc_launch *L)", name);
    LINE(G, "{");
    G->depth++;
    LINE(G, "int err = 0;");
    LINE(G, "FC_RUN_RANGES(L, L->n_outer, %s_range, &err);", name);
    LINE(G, "return err;");
    G->depth--;
    LINE(G, "}");
    return 0;
}

/* write the kernel's materialized OUTER values at the current outer point
 * (in column blocks: at every b of the block) */
static void
emit_outer_stores(Gen *G)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (s->sn[v].materialize && s->sn[v].kind == FC_VK_OUTER) {
            FcAlign al = s->sn[v].keepform ? FC_ALIGN_FULL : FC_ALIGN_OUTER;
            int o = find_operand(G, s->sn[v].slot, al);
            char val[EXPR], tn[32];
            snprintf(tn, sizeof(tn), G->cols ? "t%d[b]" : "t%d", v);
            store_expr(val, tn, s->slots[K->ops[o].slot].dtype);
            LINE(G, G->cols ? "%s[ob%d + b] = %s;" : "%s[ob%d] = %s;", G->opname[o], o, val);
        }
    }
}

/* A FULL value with a transcendental in it, needed by the last reduction
 * sweep and again by the final sweep (softmax's exp(x - max)), is written to
 * an output of its type in the first and read back in the second instead of
 * being computed twice. Sets G->stash/stash_op, or leaves stash at -1. */
static int
choose_stash(Gen *G)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    int nn = s->g->nnodes, best = -1;
    char *fin = PyMem_Calloc(nn + 1, 1), *last = PyMem_Calloc(nn + 1, 1);
    G->stash = -1;
    if (fin == NULL || last == NULL) {
        PyMem_Free(fin);
        PyMem_Free(last);
        PyErr_NoMemory();
        return -1;
    }
    for (int m = 0; K->nphases > 0 && m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (s->sn[v].materialize && s->sn[v].kind == FC_VK_FULL) {
            need_full(G, v, fin);
        }
        if (is_red(s, v) && s->sn[v].level == K->nphases) {
            need_full(G, s->g->nodes[v].in[0], last);
        }
    }
    for (int v = 0; v < nn; v++) {
        const FcOpInfo *op = &fc_ops[s->g->nodes[v].op];
        if (fin[v] && last[v] && op->kind == FC_KIND_PW && op->rule == FC_R_FLOAT &&
                strncmp(op->cexpr, "fc_", 3) == 0) {
            best = v;
        }
    }
    for (int o = 0; best >= 0 && o < K->nops; o++) {
        const FcOperand *op = &K->ops[o];
        int node = op->node;
        if (op->is_out && op->align == FC_ALIGN_FULL && s->sn[node].kind == FC_VK_FULL &&
                s->slots[op->slot].dtype == fc_dtype_compute(s->sn[best].dtype)) {
            G->stash = best;
            G->stash_op = o;
            G->stash_level = K->nphases;
            if (node == best) {
                break;
            }
        }
    }
    PyMem_Free(fin);
    PyMem_Free(last);
    return 0;
}

/* the body for one outer element o (offsets ob<k> already set). With P
 * non-NULL the threads share the row: partials are combined at barriers. */
static int
emit_row(Gen *G)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    int reds[FC_MAX_KERNEL_REDS], has_full_out = 0;

    if (choose_stash(G) < 0) {
        return -1;
    }
    G->sp = SP_OUTER_POINT;
    memset(G->loaded, 0, FC_MAXOPS);
    for (int level = 0; level <= K->nphases; level++) {
        int nreds = 0;
        if (level > 0) {
            for (int m = 0; m < K->nnodes; m++) {
                int v = K->nodes[m];
                if (is_red(s, v) && s->sn[v].level == level && nreds < FC_MAX_KERNEL_REDS) {
                    reds[nreds++] = v;
                }
            }
            LINE(G, "/* sweep %d: %d reduction%s */", level, nreds, nreds == 1 ? "" : "s");
            for (int r = 0; r < nreds; r++) {
                declare_acc(G, reds[r]);
            }
            G->in_stash_sweep = G->stash >= 0 && level == G->stash_level;
            if (emit_sweep(G, 1, reds, nreds, 0) < 0) {
                return -1;
            }
            G->in_stash_sweep = 0;
            G->sp = SP_OUTER_POINT;
            /* shared rows: publish partials, then every thread folds them in thread order */
            LINE(G, "if (P != NULL) {");
            G->depth++;
            for (int r = 0; r < nreds; r++) {
                int v = reds[r];
                LINE(G, "P->part%d[tid] = acc%d;", v, v);
                if (has_nan_flag(s, v)) {
                    LINE(G, "P->nan%d[tid] = nan%d;", v, v);
                }
                if (has_index(s, v)) {
                    LINE(G, "P->idx%d[tid] = idx%d;", v, v);
                }
            }
            LINE(G, "#pragma omp barrier");
            for (int r = 0; r < nreds; r++) {
                char init[EXPR], px[32], pj[32];
                int v = reds[r];
                acc_init(s, v, init);
                LINE(G, "acc%d = %s;", v, init);
                if (has_nan_flag(s, v)) {
                    LINE(G, "nan%d = 0;", v);
                }
                LINE(G, "for (int t = 0; t < nth; t++) {");
                G->depth++;
                snprintf(px, sizeof(px), "P->part%d[t]", v);
                snprintf(pj, sizeof(pj), "P->idx%d[t]", v);
                if (s->g->nodes[v].op == FC_OP_SUM) {
                    LINE(G, "acc%d += %s;", v, px);
                }
                else if (s->g->nodes[v].op == FC_OP_PROD) {
                    LINE(G, "acc%d *= %s;", v, px);
                }
                else {
                    accumulate(G, v, px, pj);
                    if (has_nan_flag(s, v)) {
                        LINE(G, "nan%d |= P->nan%d[t];", v, v);
                    }
                }
                G->depth--;
                LINE(G, "}");
            }
            LINE(G, "#pragma omp barrier");
            G->depth--;
            LINE(G, "}");
            for (int r = 0; r < nreds; r++) {
                int v = reds[r], op = s->g->nodes[v].op;
                int ct = fc_dtype_compute(s->sn[v].dtype);
                if (has_index(s, v)) {
                    LINE(G, "const int64_t t%d = idx%d;", v, v);
                }
                else if (has_nan_flag(s, v)) {
                    LINE(G, "const %s t%d = nan%d ? (%s)NAN : (%s)acc%d;", ctname(ct), v, v,
                         ctname(ct), ctname(ct), v);
                }
                else if (op == FC_OP_ANY || op == FC_OP_ALL) {
                    LINE(G, "const _Bool t%d = acc%d != 0;", v, v);
                }
                else {
                    LINE(G, "const %s t%d = (%s)acc%d;", ctname(ct), v, ctname(ct), v);
                }
            }
        }
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            if (s->sn[v].kind == FC_VK_OUTER && !is_red(s, v) && s->sn[v].level == level) {
                if (emit_node(G, v) < 0) {
                    return -1;
                }
            }
        }
    }
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        has_full_out |= s->sn[v].materialize && s->sn[v].kind == FC_VK_FULL;
    }
    if (has_full_out) {
        LINE(G, "/* final sweep: write full-size results */");
        if (emit_sweep(G, 1, NULL, 0, 1) < 0) {
            return -1;
        }
        G->sp = SP_OUTER_POINT;
    }
    LINE(G, "if (P == NULL || tid == 0) {");
    G->depth++;
    emit_outer_stores(G);
    G->depth--;
    LINE(G, "}");
    return 0;
}

static int
needs_nonempty(const Gen *G)
{
    for (int m = 0; m < G->K->nnodes; m++) {
        int v = G->K->nodes[m], op = G->s->g->nodes[v].op;
        if (is_red(G->s, v) && !G->s->g->nodes[v].quiet_empty &&
                (op == FC_OP_AMAX || op == FC_OP_AMIN || has_index(G->s, v))) {
            return 1;
        }
    }
    return 0;
}

/* Column blocks: one reduction level, nothing full-size to write, and (at
 * run time) rows reduced with a stride while neighbouring outer elements sit
 * next to each other (sum over axis 0 of a C-ordered array). Each thread
 * walks its outer range FC_COLS elements at a time, the reduced index
 * outside and the block inside, so the block's loads are contiguous and
 * the accumulators are arrays over b. */
static int
cols_eligible(const Gen *G)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    if (K->nphases != 1) {
        return 0;
    }
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if ((s->sn[v].materialize && s->sn[v].kind == FC_VK_FULL) || (is_red(s, v) && has_index(s, v))) {
            return 0;
        }
    }
    return 1;
}

static int
emit_outer_level(Gen *G, int level)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    int any = 0;
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        any |= s->sn[v].kind == FC_VK_OUTER && !is_red(s, v) && s->sn[v].level == level;
    }
    if (!any) {
        return 0;
    }
    LINE(G, "for (int64_t b = 0; b < nb; b++) {");
    G->depth++;
    memset(G->loaded, 0, FC_MAXOPS);
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (s->sn[v].kind == FC_VK_OUTER && !is_red(s, v) && s->sn[v].level == level &&
                emit_node(G, v) < 0) {
            return -1;
        }
    }
    G->depth--;
    LINE(G, "}");
    return 0;
}

static int
emit_cols(Gen *G, const char *name)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    int reds[FC_MAX_KERNEL_REDS], nreds = 0, nn = s->g->nnodes, rc = -1;
    char *need = PyMem_Calloc(nn + 1, 1), use[FC_MAXOPS];

    if (need == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    G->cols = 1;
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (is_red(s, v)) {
            reds[nreds++] = v;
            need_full(G, s->g->nodes[v].in[0], need);
        }
    }
    sweep_operands(G, need, reds, nreds, 0, use);
    LINE(G, "static void");
    LINE(G, "%s_cols(const fc_launch *L, int64_t lo, int64_t hi, int *err)", name);
    LINE(G, "{");
    G->depth++;
    LINE(G, "int fc_err = 0;");
    LINE(G, "int64_t oidx[FC_LAUNCH_MAXDIM];");
    emit_operand_decls(G);
    LINE(G, "fc_unravel(lo, L->nd_outer, L->oshape, oidx);");
    LINE(G, "for (int64_t o = lo; o < hi;) {");
    G->depth++;
    LINE(G, "int64_t nb = fc_run_length(L->nd_outer, L->oshape, oidx, hi - o);");
    LINE(G, "nb = nb < FC_COLS ? nb : FC_COLS;");
    for (int o = 0; o < K->nops; o++) {
        LINE(G, "const int64_t ob%d = fc_offset(L->nd_outer, oidx, L->ostride[%d]);", o, o);
    }
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (s->sn[v].kind == FC_VK_OUTER) {
            LINE(G, "%s t%d[FC_COLS];", ctname(fc_dtype_compute(s->sn[v].dtype)), v);
        }
    }
    G->sp = SP_OUTER_POINT;
    if (emit_outer_level(G, 0) < 0) {
        goto cleanup;
    }
    for (int r = 0; r < nreds; r++) {
        int v = reds[r];
        char init[EXPR];
        acc_init(s, v, init);
        LINE(G, "%s acc%d[FC_COLS];", ctname(acc_dtype(s, v)), v);
        if (has_nan_flag(s, v)) {
            LINE(G, "int nan%d[FC_COLS];", v);
        }
        LINE(G, "for (int64_t b = 0; b < nb; b++) {");
        LINE(G, "    acc%d[b] = %s;", v, init);
        if (has_nan_flag(s, v)) {
            LINE(G, "    nan%d[b] = 0;", v);
        }
        LINE(G, "}");
    }
    LINE(G, "{");
    G->depth++;
    LINE(G, "int64_t idx[FC_LAUNCH_MAXDIM];");
    LINE(G, "fc_unravel(0, L->nd_inner, L->ishape, idx);");
    LINE(G, "for (int64_t j0 = 0; j0 < L->n_inner;) {");
    G->depth++;
    LINE(G, "const int64_t len = fc_run_length(L->nd_inner, L->ishape, idx, L->n_inner - j0);");
    for (int o = 0; o < K->nops; o++) {
        int dt;
        if (!use[o]) {
            continue;
        }
        dt = s->slots[K->ops[o].slot].dtype;
        LINE(G, "const %s *restrict p%d = %s + ob%d + fc_offset(L->nd_inner, idx, L->istride[%d]);",
             storename(dt), o, G->opname[o], o, o);
        LINE(G, "const int64_t s%d = L->istride[%d][L->nd_inner - 1];", o, o);
    }
    LINE(G, "for (int64_t i = 0; i < len; i++) {");
    G->depth++;
    LINE(G, "#pragma omp simd");
    LINE(G, "for (int64_t b = 0; b < nb; b++) {");
    G->depth++;
    G->sp = SP_INNER_RUN;
    memset(G->loaded, 0, FC_MAXOPS);
    for (int v = 0; v < nn; v++) {
        if (need[v] && emit_node(G, v) < 0) {
            goto cleanup;
        }
    }
    for (int r = 0; r < nreds; r++) {
        const FcNode *n = &s->g->nodes[reds[r]];
        char raw[EXPR], x[EXPR];
        if (value_of(G, n->in[0], reds[r], raw) < 0) {
            goto cleanup;
        }
        convert(x, raw, s->sn[n->in[0]].dtype, fc_dtype_compute(s->sn[n->in[0]].dtype));
        accumulate(G, reds[r], x, "(j0 + i)");
    }
    G->depth--;
    LINE(G, "}");
    G->depth--;
    LINE(G, "}");
    LINE(G, "j0 += len;");
    LINE(G, "fc_advance(L->nd_inner, L->ishape, idx, len);");
    G->depth--;
    LINE(G, "}");
    G->depth--;
    LINE(G, "}");
    G->sp = SP_OUTER_POINT;
    LINE(G, "for (int64_t b = 0; b < nb; b++) {");
    G->depth++;
    for (int r = 0; r < nreds; r++) {
        int v = reds[r], op = s->g->nodes[v].op;
        const char *ct = ctname(fc_dtype_compute(s->sn[v].dtype));
        if (has_nan_flag(s, v)) {
            LINE(G, "t%d[b] = nan%d[b] ? (%s)NAN : (%s)acc%d[b];", v, v, ct, ct, v);
        }
        else if (op == FC_OP_ANY || op == FC_OP_ALL) {
            LINE(G, "t%d[b] = acc%d[b] != 0;", v, v);
        }
        else {
            LINE(G, "t%d[b] = (%s)acc%d[b];", v, ct, v);
        }
    }
    G->depth--;
    LINE(G, "}");
    if (emit_outer_level(G, 1) < 0) {
        goto cleanup;
    }
    LINE(G, "for (int64_t b = 0; b < nb; b++) {");
    G->depth++;
    emit_outer_stores(G);
    G->depth--;
    LINE(G, "}");
    LINE(G, "o += nb;");
    LINE(G, "fc_advance(L->nd_outer, L->oshape, oidx, nb);");
    G->depth--;
    LINE(G, "}");
    LINE(G, "fc_report(err, fc_err);");
    G->depth--;
    LINE(G, "}");
    fc_str_puts(G->b, "\n");
    rc = 0;
cleanup:
    G->cols = 0;
    PyMem_Free(need);
    return rc;
}

static int
emit_reduction(Gen *G, const char *name)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    int cols = cols_eligible(G);

    if (cols && emit_cols(G, name) < 0) {
        return -1;
    }

    /* per-thread partials for rows shared by all threads */
    LINE(G, "typedef struct {");
    G->depth++;
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (!is_red(s, v)) {
            continue;
        }
        LINE(G, "%s part%d[FC_MAX_THREADS];", ctname(acc_dtype(s, v)), v);
        if (has_nan_flag(s, v)) {
            LINE(G, "int nan%d[FC_MAX_THREADS];", v);
        }
        if (has_index(s, v)) {
            LINE(G, "int64_t idx%d[FC_MAX_THREADS];", v);
        }
    }
    G->depth--;
    LINE(G, "} %s_parts;", name);
    fc_str_puts(G->b, "\n");

    /* outer elements [lo, hi); P == NULL: this thread owns them whole,
     * else every thread takes its share of each one's inner range */
    LINE(G, "static void");
    LINE(G, "%s_body(const fc_launch *L, int64_t lo, int64_t hi, int *err, %s_parts *P, int tid, int nth)",
         name, name);
    LINE(G, "{");
    G->depth++;
    LINE(G, "int fc_err = 0;");
    LINE(G, "int64_t jlo = 0, jhi = L->n_inner;");
    LINE(G, "int64_t oidx[FC_LAUNCH_MAXDIM];");
    emit_operand_decls(G);
    LINE(G, "if (P != NULL) {");
    LINE(G, "    fc_thread_range(L->n_inner, tid, nth, &jlo, &jhi);");
    LINE(G, "}");
    LINE(G, "fc_unravel(lo, L->nd_outer, L->oshape, oidx);");
    LINE(G, "for (int64_t o = lo; o < hi; o++) {");
    G->depth++;
    for (int o = 0; o < K->nops; o++) {
        LINE(G, "const int64_t ob%d = fc_offset(L->nd_outer, oidx, L->ostride[%d]);", o, o);
    }
    if (emit_row(G) < 0) {
        return -1;
    }
    LINE(G, "fc_advance(L->nd_outer, L->oshape, oidx, 1);");
    G->depth--;
    LINE(G, "}");
    LINE(G, "fc_report(err, fc_err);");
    G->depth--;
    LINE(G, "}");
    fc_str_puts(G->b, "\n");

    LINE(G, "static void");
    LINE(G, "%s_rows(const fc_launch *L, int64_t lo, int64_t hi, int *err)", name);
    LINE(G, "{");
    LINE(G, "    %s_body(L, lo, hi, err, NULL, 0, 1);", name);
    LINE(G, "}");
    fc_str_puts(G->b, "\n");

    LINE(G, "FC_EXPORT int");
    LINE(G, "%s(const fc_launch *L)", name);
    LINE(G, "{");
    G->depth++;
    LINE(G, "int err = 0;");
    if (needs_nonempty(G)) {
        LINE(G, "if (L->n_inner == 0) {");
        LINE(G, "    return FC_ERR_EMPTY_REDUCE;");
        LINE(G, "}");
    }
    if (cols) {
        LINE(G, "if (fc_use_cols(L)) {");
        LINE(G, "    FC_RUN_RANGES(L, L->n_outer, %s_cols, &err);", name);
        LINE(G, "    return err;");
        LINE(G, "}");
    }
    LINE(G, "if (fc_use_split(L)) {");
    G->depth++;
    LINE(G, "%s_parts P;", name);
    LINE(G, "#pragma omp parallel num_threads(L->nthreads)");
    LINE(G, "%s_body(L, 0, L->n_outer, &err, &P, omp_get_thread_num(), omp_get_num_threads());", name);
    G->depth--;
    LINE(G, "}");
    LINE(G, "else {");
    LINE(G, "    FC_RUN_RANGES(L, L->n_outer, %s_rows, &err);", name);
    LINE(G, "}");
    LINE(G, "return err;");
    G->depth--;
    LINE(G, "}");
    return 0;
}

char *
fc_gen_c(const FcSpec *s, int k, const char *name, const char *header_comment)
{
    FcStr b = {0};
    Gen G;
    char loaded[FC_MAXOPS];
    int nin = 0, nout = 0, rc;

    memset(&G, 0, sizeof(G));
    G.stash = -1;
    G.s = s;
    G.K = &s->kernels[k];
    G.b = &b;
    G.loaded = loaded;
    for (int o = 0; o < G.K->nops; o++) {
        if (G.K->ops[o].is_out) {
            snprintf(G.opname[o], sizeof(G.opname[o]), "out%d", nout++);
        }
        else {
            snprintf(G.opname[o], sizeof(G.opname[o]), "in%d", nin++);
        }
    }
    fc_str_printf(&b, "/* %s */\n#include \"fc_kernel.h\"\n\n", header_comment ? header_comment : "fastcompile kernel");
    rc = G.K->mask ? emit_reduction(&G, name) : emit_pointwise(&G, name);
    if (rc < 0) {
        fc_str_free(&b);
        return NULL;
    }
    return fc_str_take(&b);
}
