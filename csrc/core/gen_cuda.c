/* Renderer, CUDA: one fused kernel -> CUDA C++ source text for NVRTC.
 * In: FcSpec + kernel index. Out: a malloc'd string. Never compiles or launches (csrc/runtime/cuda.c does).
 *
 * gen_c.c's sibling: the same op table templates (ops.def), the same
 * conversions and NumPy rules, device helpers from fc_cuda_math.h and the
 * skeletons (launch struct, offsets, block reductions) from fc_cuda_kernel.h.
 *
 * Shape of the output: a template body NAME_body<I> over an index type I and
 * two entry points, NAME_i32 (every offset fits in 32 bits) and NAME_i64.
 *   pointwise:  a grid-stride loop over the outer space; contiguous kernels
 *               index the operands with i, the others unravel i into
 *               per-operand offsets (same collapsed dims and strides as the
 *               CPU's fc_launch).
 *   reduction:  one block per outer element (grid-stride over rows); every
 *               sweep of gen_c's row (one per reduction level, then a final
 *               one writing full-size results) is a block-strided loop over
 *               the row followed by warp-shuffle block reductions, so
 *               softmax and layernorm are one kernel, one block per row. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "shape.h"
#include "spec.h"
#include "strbuf.h"

#define EXPR 512

typedef enum { SP_FLAT, SP_STRIDED, SP_INNER, SP_OUTER_POINT } Space;

typedef struct {
    const FcSpec *s;
    const FcKernelIR *K;
    FcStr *b;
    int depth;
    int nd;              /* the launch struct's ND: the kernel's rank, at least 1 */
    Space sp;            /* how buffer operands are addressed right now */
    char *loaded;        /* per operand: a local x<o> holds its value in this body */
    char opname[FC_MAXOPS][16];
} Gen;

/* compute types: gen_c's, with C++'s bool */
static const char *
ctname(int dt)
{
    switch (dt) {
    case FC_BOOL: return "bool";
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
 * conversions (as gen_c.c)
 * ---------------------------------------------------------------------- */

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
    case FC_BOOL: snprintf(out, EXPR, "(%s != 0)", mem); break;
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

static void
mem_expr(const Gen *G, int o, char *out)
{
    switch (G->sp) {
    case SP_FLAT:
        snprintf(out, EXPR, operand_is_scalar(G, o) ? "%s[0]" : "%s[i]", G->opname[o]);
        break;
    case SP_STRIDED:
        snprintf(out, EXPR, "%s[off[%d]]", G->opname[o], o);
        break;
    case SP_INNER:
        snprintf(out, EXPR, "%s[ob[%d] + ib[%d]]", G->opname[o], o, o);
        break;
    case SP_OUTER_POINT:
        snprintf(out, EXPR, "%s[ob[%d]]", G->opname[o], o);
        break;
    }
}

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
        snprintf(out, EXPR, "t%d", u);
        return 0;
    }
    {
        int o = find_operand(G, s->sn[u].slot, consumer_align(s, consumer));
        char mem[EXPR], val[EXPR];
        if (o < 0) {
            PyErr_Format(PyExc_SystemError, "gen_cuda: node %d reads node %d with no operand", consumer, u);
            return -1;
        }
        if (!G->loaded[o]) {
            int dt = s->slots[G->K->ops[o].slot].dtype;
            mem_expr(G, o, mem);
            load_expr(val, mem, dt);
            LINE(G, "const %s x%d = %s;", ctname(fc_dtype_compute(dt)), o, val);
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

static void
emit_def(Gen *G, int v, const char *type, const char *expr)
{
    LINE(G, "const %s t%d = %s;", type, v, expr);
}

/* exact int/uint64 and out-of-range Python int comparisons: gen_c.c's rule */
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
            emit_def(G, v, "bool", e);
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
        emit_def(G, v, "bool", e);
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
        emit_def(G, v, "int64_t", sn->axes ? "L.n_inner" : "1");
        return 0;
    }
    for (int j = 0; j < n->nin; j++) {
        dt[j] = s->sn[n->in[j]].dtype;
        wk[j] = s->sn[n->in[j]].weak;
    }
    if (n->op == FC_OP_CAST || fc_ops[n->op].kind == FC_KIND_RED) {
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
 * reductions: accumulators (gen_c.c's types and identities)
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

/* fold x (inner index j) into this thread's accumulator */
static void
accumulate(Gen *G, int v, const char *x, const char *j)
{
    int op = G->s->g->nodes[v].op;
    const char *ty = ctname(acc_dtype(G->s, v));
    switch (op) {
    case FC_OP_SUM: LINE(G, "acc%d += (%s)%s;", v, ty, x); break;
    case FC_OP_PROD: LINE(G, "acc%d *= (%s)%s;", v, ty, x); break;
    case FC_OP_AMAX:
    case FC_OP_AMIN:
        LINE(G, "acc%d = %s %s acc%d ? %s : acc%d;", v, x, op == FC_OP_AMAX ? ">" : "<", v, x, v);
        if (has_nan_flag(G->s, v)) {
            LINE(G, "nan%d |= %s != %s;", v, x, x);
        }
        break;
    case FC_OP_ARGMAX:
    case FC_OP_ARGMIN:
        LINE(G, "if (%s %s acc%d || (%s != %s && acc%d == acc%d)) {", x,
             op == FC_OP_ARGMAX ? ">" : "<", v, x, x, v, v);
        LINE(G, "    acc%d = %s;", v, x);
        LINE(G, "    idx%d = %s;", v, j);
        LINE(G, "}");
        break;
    case FC_OP_ANY: LINE(G, "acc%d |= (%s != 0);", v, x); break;
    default: LINE(G, "acc%d &= (%s != 0);", v, x); break;
    }
}

/* the block's result of reduction v, in every thread */
static void
combine_block(Gen *G, int v)
{
    int op = G->s->g->nodes[v].op;
    static const char *fn[] = {"fc_cu_sum", "fc_cu_prod", "fc_cu_max", "fc_cu_min"};
    if (has_index(G->s, v)) {
        LINE(G, "fc_cu_block_argreduce<%s, %s>(acc%d, idx%d, sm%d, smi%d);",
             ctname(acc_dtype(G->s, v)), op == FC_OP_ARGMAX ? "true" : "false", v, v, v, v);
        return;
    }
    if (op == FC_OP_ANY || op == FC_OP_ALL) {
        LINE(G, "acc%d = fc_cu_block_reduce(acc%d, %s(), sm%d);", v, v,
             op == FC_OP_ANY ? "fc_cu_or" : "fc_cu_and", v);
        return;
    }
    LINE(G, "acc%d = fc_cu_block_reduce(acc%d, %s(), sm%d);", v, v, fn[op - FC_OP_SUM], v);
    if (has_nan_flag(G->s, v)) {
        LINE(G, "nan%d = fc_cu_block_reduce(nan%d, fc_cu_or(), smn%d);", v, v, v);
    }
}

/* ------------------------------------------------------------------------
 * sweeps over one row
 * ---------------------------------------------------------------------- */

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

/* one block-strided loop over the row's inner space: feeds `reds`, or with
 * store set, writes the materialized full-size values */
static int
emit_sweep(Gen *G, const int *reds, int nreds, int store)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    int nn = s->g->nnodes, rc = -1;
    char *need = PyMem_Calloc(nn + 1, 1), saved[FC_MAXOPS];

    if (need == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int r = 0; r < nreds; r++) {
        need_full(G, s->g->nodes[reds[r]].in[0], need);
    }
    if (store) {
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            if (s->sn[v].materialize && s->sn[v].kind == FC_VK_FULL) {
                need_full(G, v, need);
            }
        }
    }
    memcpy(saved, G->loaded, FC_MAXOPS);
    memset(G->loaded, 0, FC_MAXOPS);
    G->sp = SP_INNER;
    LINE(G, "for (I j = threadIdx.x; j < (I)L.n_inner; j += FC_CU_THREADS) {");
    G->depth++;
    LINE(G, "I ib[%d];", K->nops);
    LINE(G, "fc_cu_offsets<I, %d, %d>(j, (int)L.nd_inner, L.ishape, L.istride, ib);", K->nops, G->nd);
    for (int v = 0; v < nn; v++) {
        if (need[v] && emit_node(G, v) < 0) {
            goto cleanup;
        }
    }
    for (int r = 0; r < nreds; r++) {
        const FcNode *n = &s->g->nodes[reds[r]];
        char raw[EXPR], x[EXPR];
        int ct = fc_dtype_compute(s->sn[n->in[0]].dtype);
        if (value_of(G, n->in[0], reds[r], raw) < 0) {
            goto cleanup;
        }
        convert(x, raw, s->sn[n->in[0]].dtype, ct);
        if (strcmp(x, raw) != 0) {
            LINE(G, "const %s r%d = %s;", ctname(ct), reds[r], x);
            snprintf(x, EXPR, "r%d", reds[r]);
        }
        accumulate(G, reds[r], x, "(int64_t)j");
    }
    if (store) {
        for (int v = 0; v < nn; v++) {
            if (need[v] && s->sn[v].materialize) {
                int o = find_operand(G, s->sn[v].slot, FC_ALIGN_FULL);
                char val[EXPR], name[32], mem[EXPR];
                snprintf(name, sizeof(name), "t%d", v);
                store_expr(val, name, s->slots[K->ops[o].slot].dtype);
                mem_expr(G, o, mem);
                LINE(G, "%s = %s;", mem, val);
            }
        }
    }
    G->depth--;
    LINE(G, "}");
    rc = 0;
cleanup:
    G->sp = SP_OUTER_POINT;
    memcpy(G->loaded, saved, FC_MAXOPS);
    PyMem_Free(need);
    return rc;
}

static void
emit_operand_decls(Gen *G)
{
    const FcKernelIR *K = G->K;
    for (int o = 0; o < K->nops; o++) {
        int dt = G->s->slots[K->ops[o].slot].dtype;
        const char *c = K->ops[o].is_out ? "" : "const ";
        LINE(G, "%s%s *__restrict__ %s = (%s%s *)L.ptr[%d];", c, storename(dt), G->opname[o], c,
             storename(dt), o);
    }
}

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
            snprintf(tn, sizeof(tn), "t%d", v);
            store_expr(val, tn, s->slots[K->ops[o].slot].dtype);
            LINE(G, "%s[ob[%d]] = %s;", G->opname[o], o, val);
        }
    }
}

/* ------------------------------------------------------------------------
 * kernel bodies
 * ---------------------------------------------------------------------- */

static int
emit_pointwise(Gen *G)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    LINE(G, "int fc_err = 0;");
    emit_operand_decls(G);
    LINE(G, "#pragma unroll 1");
    LINE(G, "for (I i = (I)blockIdx.x * FC_CU_THREADS + (I)threadIdx.x; i < (I)L.n_outer;");
    LINE(G, "     i += (I)gridDim.x * FC_CU_THREADS) {");
    G->depth++;
    if (K->flat) {
        G->sp = SP_FLAT;
    }
    else {
        G->sp = SP_STRIDED;
        LINE(G, "I off[%d];", K->nops);
        LINE(G, "fc_cu_offsets<I, %d, %d>(i, (int)L.nd_outer, L.oshape, L.ostride, off);", K->nops, G->nd);
    }
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
            char val[EXPR], tn[32], mem[EXPR];
            snprintf(tn, sizeof(tn), "t%d", v);
            store_expr(val, tn, s->slots[K->ops[o].slot].dtype);
            mem_expr(G, o, mem);
            LINE(G, "%s = %s;", mem, val);
        }
    }
    G->depth--;
    LINE(G, "}");
    LINE(G, "fc_cu_report(L.err, fc_err);");
    return 0;
}

static int
emit_reduction(Gen *G)
{
    const FcSpec *s = G->s;
    const FcKernelIR *K = G->K;
    int reds[FC_MAX_KERNEL_REDS];

    /* shared scratch of the block reductions, one set per reduction */
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (!is_red(s, v)) {
            continue;
        }
        LINE(G, "__shared__ %s sm%d[32];", ctname(acc_dtype(s, v)), v);
        if (has_nan_flag(s, v)) {
            LINE(G, "__shared__ int smn%d[32];", v);
        }
        if (has_index(s, v)) {
            LINE(G, "__shared__ int64_t smi%d[32];", v);
        }
    }
    LINE(G, "int fc_err = 0;");
    emit_operand_decls(G);
    LINE(G, "#pragma unroll 1");
    LINE(G, "for (I o = blockIdx.x; o < (I)L.n_outer; o += gridDim.x) {");
    G->depth++;
    LINE(G, "I ob[%d];", K->nops);
    LINE(G, "fc_cu_offsets<I, %d, %d>(o, (int)L.nd_outer, L.oshape, L.ostride, ob);", K->nops, G->nd);
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
            if (emit_sweep(G, reds, nreds, 0) < 0) {
                return -1;
            }
            for (int r = 0; r < nreds; r++) {
                int v = reds[r], op = s->g->nodes[v].op;
                int ct = fc_dtype_compute(s->sn[v].dtype);
                combine_block(G, v);
                if (has_index(s, v)) {
                    LINE(G, "const int64_t t%d = idx%d;", v, v);
                }
                else if (has_nan_flag(s, v)) {
                    LINE(G, "const %s t%d = nan%d ? (%s)NAN : (%s)acc%d;", ctname(ct), v, v,
                         ctname(ct), ctname(ct), v);
                }
                else if (op == FC_OP_ANY || op == FC_OP_ALL) {
                    LINE(G, "const bool t%d = acc%d != 0;", v, v);
                }
                else {
                    LINE(G, "const %s t%d = (%s)acc%d;", ctname(ct), v, ctname(ct), v);
                }
            }
        }
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            if (s->sn[v].kind == FC_VK_OUTER && !is_red(s, v) && s->sn[v].level == level &&
                    emit_node(G, v) < 0) {
                return -1;
            }
        }
    }
    {
        int has_full_out = 0;
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            has_full_out |= s->sn[v].materialize && s->sn[v].kind == FC_VK_FULL;
        }
        if (has_full_out) {
            LINE(G, "/* final sweep: write full-size results */");
            if (emit_sweep(G, NULL, 0, 1) < 0) {
                return -1;
            }
        }
    }
    {
        int has_outer_out = 0;
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            has_outer_out |= s->sn[v].materialize && s->sn[v].kind == FC_VK_OUTER;
        }
        if (has_outer_out) {
            LINE(G, "if (threadIdx.x == 0) {");
            G->depth++;
            emit_outer_stores(G);
            G->depth--;
            LINE(G, "}");
        }
    }
    G->depth--;
    LINE(G, "}");
    LINE(G, "fc_cu_report(L.err, fc_err);");
    return 0;
}

int
fc_gen_cuda_needs_nonempty(const FcSpec *s, int k)
{
    const FcKernelIR *K = &s->kernels[k];
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m], op = s->g->nodes[v].op;
        if (is_red(s, v) && !s->g->nodes[v].quiet_empty &&
                (op == FC_OP_AMAX || op == FC_OP_AMIN || has_index(s, v))) {
            return 1;
        }
    }
    return 0;
}

char *
fc_gen_cuda(const FcSpec *s, int k, const char *name, const char *header_comment)
{
    FcStr b = {0};
    Gen G;
    char loaded[FC_MAXOPS];
    int nin = 0, nout = 0, rc;

    memset(&G, 0, sizeof(G));
    G.s = s;
    G.K = &s->kernels[k];
    G.b = &b;
    G.nd = G.K->nd > 0 ? G.K->nd : 1;
    G.loaded = loaded;
    for (int o = 0; o < G.K->nops; o++) {
        if (G.K->ops[o].is_out) {
            snprintf(G.opname[o], sizeof(G.opname[o]), "out%d", nout++);
        }
        else {
            snprintf(G.opname[o], sizeof(G.opname[o]), "in%d", nin++);
        }
    }
    fc_str_printf(&b, "/* %s */\n#include \"fc_cuda_kernel.h\"\n\n",
                  header_comment ? header_comment : "fastcompile kernel");
    LINE(&G, "typedef fc_cu_launch<%d, %d> %s_launch;", G.K->nops, G.nd, name);
    fc_str_puts(&b, "\n");
    LINE(&G, "template <typename I>");
    LINE(&G, "static __device__ __forceinline__ void");
    LINE(&G, "%s_body(const %s_launch &L)", name, name);
    LINE(&G, "{");
    G.depth++;
    rc = G.K->mask ? emit_reduction(&G) : emit_pointwise(&G);
    G.depth--;
    LINE(&G, "}");
    for (int w = 32; rc == 0 && w <= 64; w += 32) {
        fc_str_puts(&b, "\n");
        LINE(&G, "extern \"C\" __global__ void __launch_bounds__(FC_CU_THREADS)");
        LINE(&G, "%s_i%d(const %s_launch L)", name, w, name);
        LINE(&G, "{");
        LINE(&G, "    %s_body<int%d_t>(L);", name, w);
        LINE(&G, "}");
    }
    if (rc < 0) {
        fc_str_free(&b);
        return NULL;
    }
    return fc_str_take(&b);
}
