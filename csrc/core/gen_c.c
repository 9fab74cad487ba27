/* Renderer, CPU: one fused kernel -> C11 + OpenMP source text.
 * In: FcSpec + kernel index. Out: a malloc'd string. Never compiles or runs
 * anything (csrc/runtime does); loop skeletons live in fc_kernel.h, and the
 * statements inside the loops (nodes, loads, stores, accumulators) come from
 * gen_expr.c, shared with gen_cuda.c. This file holds the loops.
 *
 * Shape of the output:
 *   pointwise:  NAME_range(L, lo, hi) over the outer space, split by threads
 *   reduction:  NAME_rows(L, lo, hi): a thread owns whole outer elements, or
 *               NAME_split(L): threads share each outer element's inner range
 *               (few, long rows), combining partials at barriers. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <string.h>

#include "gen_expr.h"

#define EXPR FC_EXPR_MAX
#define LINE(G, ...) FC_LINE(&(G)->e, __VA_ARGS__)
#define CLOSE(G) FC_CLOSE(&(G)->e)

typedef enum { SP_FLAT, SP_OUTER_RUN, SP_INNER_RUN, SP_OUTER_POINT } Space;

typedef struct {
    FcExprGen e;         /* shared with gen_expr.c (first member: mem_expr casts back) */
    Space sp;            /* how buffer operands are addressed right now */
    int unit;            /* runs: every operand has unit stride (or stride 0, see bcast) */
    char bcast[FC_MAXOPS]; /* unit runs: operand broadcast along the run (stride 0): p[0];
                          * column blocks: along the block (outer stride 0): p[i * s] */
    uint64_t cols_zero;  /* column blocks: the operands bcast names, as fc_use_cols takes them */
    int stash, stash_op; /* a costly FULL value the first reduction sweep that needs it
                          * writes into an output, later sweeps read back (-1: none) */
    int stash_level;     /* the reduction sweep that computes and writes it */
    int in_stash_sweep;  /* emitting the sweep of stash_level */
    int after_stash;     /* emitting a sweep after it: read the stash back */
} Gen;

/* ------------------------------------------------------------------------
 * operands
 * ---------------------------------------------------------------------- */

/* the dim of the kernel space a loop walks with unit steps */
typedef enum {
    WALK_POINTWISE,      /* a pointwise run: the last dim */
    WALK_INNER,          /* a row's inner run: the last reduced dim */
    WALK_COLS            /* a column block: the last outer dim */
} Walk;

/* input operand o is broadcast along the walked dim: it has no such dim, a
 * size-1 one in the key, or one the key says has stride 0. A guess the
 * run-time stride check confirms. A kernel with a loop_perm (pointwise, every
 * dim outer) walks the innermost dim of that order. */
static int
operand_bcast_along(const Gen *G, int o, Walk w)
{
    const FcKernelIR *K = G->e.K;
    const FcSlot *sl = &G->e.s->slots[K->ops[o].slot];
    int d = K->nd - 1, sd;
    if (K->ops[o].is_out) {
        return 0;
    }
    if (K->loop_perm != 0 && w != WALK_INNER) {
        d = FC_PERM_DIM(K->loop_perm, K->nd - 1);
    }
    while (w != WALK_POINTWISE && d >= 0 && ((K->mask >> d) & 1u) != (w == WALK_INNER)) {
        d--;
    }
    sd = d - (K->nd - sl->ndim);
    return d >= 0 && (sd < 0 || sl->dims[sd] == 0 || (sl->zlast && sd == sl->ndim - 1));
}

/* memory expression of operand o at the current point (FcExprTarget.mem) */
static void
mem_expr(const FcExprGen *E, int o, char *out)
{
    const Gen *G = (const Gen *)E;
    switch (G->sp) {
    case SP_FLAT:
        snprintf(out, EXPR, fc_expr_operand_is_scalar(E, o) ? "%s[0]" : "%s[i]", E->opname[o]);
        break;
    case SP_OUTER_RUN:
    case SP_INNER_RUN:
        if (E->cols) {
            snprintf(out, EXPR, G->bcast[o] ? "p%d[i * s%d]" : "p%d[i * s%d + b]", o, o);
        }
        else if (G->unit) {
            snprintf(out, EXPR, G->bcast[o] ? "p%d[0]" : "p%d[i]", o);
        }
        else {
            snprintf(out, EXPR, "p%d[i * s%d]", o, o);
        }
        break;
    case SP_OUTER_POINT:
        snprintf(out, EXPR, E->cols ? "%s[ob%d + b]" : "%s[ob%d]", E->opname[o], o);
        break;
    }
}

/* "#pragma omp simd reduction(...)..." for a unit-stride run, or "" when
 * an arg-reduction needs first-index order (the loop then stays scalar) */
static void
simd_clauses(const Gen *G, const int *reds, int nreds, FcStr *out)
{
    for (int r = 0; r < nreds; r++) {
        if (fc_expr_has_index(G->e.s, reds[r])) {
            return;
        }
    }
    fc_str_puts(out, "#pragma omp simd");
    for (int r = 0; r < nreds; r++) {
        int v = reds[r], op = G->e.s->g->nodes[v].op;
        const char *how = op == FC_OP_SUM ? "+" : op == FC_OP_PROD ? "*" : op == FC_OP_AMAX ? "max"
                        : op == FC_OP_AMIN ? "min" : op == FC_OP_ANY ? "|" : "&";
        fc_str_printf(out, " reduction(%s:acc%d)", how, v);
        if (fc_expr_has_nan_flag(G->e.s, v)) {
            fc_str_printf(out, " reduction(|:nan%d)", v);
        }
    }
}

/* ------------------------------------------------------------------------
 * sweeps: loops over the outer space (pointwise) or one row's inner space
 * ---------------------------------------------------------------------- */

/* operands a sweep reads or writes through strides */
static void
sweep_operands(const Gen *G, const char *need, const int *reds, int nreds, int store, char *use)
{
    const FcSpec *s = G->e.s;
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
            if (s->g->nodes[u].op != FC_OP_CONST && !fc_expr_in_kernel(&G->e, u)) {
                int o = fc_expr_find_operand(&G->e, s->sn[u].slot, FC_ALIGN_FULL);
                if (o >= 0) {
                    use[o] = 1;
                }
            }
        }
        if (store && need[v] && s->sn[v].materialize) {
            int o = fc_expr_find_operand(&G->e, s->sn[v].slot, FC_ALIGN_FULL);
            if (o >= 0) {
                use[o] = 1;
            }
        }
    }
}

/* Reductions over unit-stride runs accumulate in lanes: independent
 * partials (arrays acc<v>_l and nan<v>_l, see emit_lanes), folded in a fixed
 * pairwise order when the run ends; the run's last len % lanes elements go
 * through the scalar loop. GCC's own lowering of "omp simd reduction" keeps
 * the partials in a stack array it fills with 16 scalar stores and folds
 * with 16 dependent scalar loads per run: with rows of 128, softmax spent a
 * third of its time there.
 * The lane count is one vector register of float32, FC_LANES in fc_kernel.h:
 * 8 where kernels are built for 256-bit vectors, 16 for 512-bit ones
 * (FC_VECTOR_BITS, from fc_ckey_vector_width_flags in runtime/ckey.c). The
 * lane loop then vectorizes to one iteration, GCC keeps the lanes in
 * registers, and a libmvec call in it takes the full-width variant. With
 * 256-bit vectors, 16 lanes (two registers) were kept on the stack and
 * stored every block; with 512-bit ones, 8 lanes called the 256-bit libmvec
 * variants.
 * A sweep that computes in an 8-byte type keeps 8 lanes (one 512-bit
 * register of double): 16 made float64 layernorm slower. */
#define LANES_MAX 16     /* FC_LANES at most: emit_lanes folds from here */
#define LANES_TEXT(wide) ((wide) ? "FC_LANES" : "8")

/* Whether a sweep's unit runs take FC_LANES lanes (1) or 8 (0): 8 where a
 * value it loads or stores (use: sweep_operands), computes (need) or
 * computes from (a row's float64 mean, say) is 8 bytes wide. A reduction's
 * accumulator does not count (float32 sums in double lanes), nor does a
 * constant: it is a literal of the type it meets, not a value of the loop (a
 * Python float is a float64 node). */
static int
sweep_lanes_wide(const Gen *G, const char *need, const char *use)
{
    const FcSpec *s = G->e.s;
    for (int o = 0; o < G->e.K->nops; o++) {
        if (use[o] && fc_dtypes[s->slots[G->e.K->ops[o].slot].dtype].size == 8) {
            return 0;
        }
    }
    for (int v = 0; v < s->g->nnodes; v++) {
        if (!need[v]) {
            continue;
        }
        if (fc_dtypes[fc_dtype_compute(s->sn[v].dtype)].size == 8) {
            return 0;
        }
        for (int j = 0; j < s->g->nodes[v].nin; j++) {     /* a float64 row mean, compared */
            int u = s->g->nodes[v].in[j];
            if (s->g->nodes[u].op != FC_OP_CONST && fc_dtypes[s->sn[u].dtype].size == 8) {
                return 0;
            }
        }
    }
    return 1;
}

/* the statements of one element of a run: nodes, the stash, reductions, stores */
static int
emit_run_body(Gen *G, const char *need, const int *reds, int nreds, int store)
{
    const FcSpec *s = G->e.s;
    int nn = s->g->nnodes;
    char stash[EXPR] = "";   /* the stash's element of this run */
    memset(G->e.loaded, 0, FC_MAXOPS);
    if (G->stash >= 0) {
        mem_expr(&G->e, G->stash_op, stash);
    }
    for (int v = 0; v < nn; v++) {
        if (need[v] == 2) {
            /* computed by an earlier sweep and parked in an output: read it back */
            const char *ty = fc_expr_ctype(&G->e, fc_dtype_compute(s->sn[v].dtype));
            LINE(G, "const %s t%d = %s;", ty, v, stash);
        }
        else if (need[v] && fc_expr_emit_node(&G->e, v) < 0) {
            return -1;
        }
    }
    if (G->in_stash_sweep) {
        LINE(G, "%s = t%d;", stash, G->stash);
    }
    for (int r = 0; r < nreds; r++) {
        if (fc_expr_feed(&G->e, reds[r], "(j0 + i)") < 0) {
            return -1;
        }
    }
    for (int v = 0; store && v < nn; v++) {
        if (need[v] && s->sn[v].materialize) {
            fc_expr_emit_store(&G->e, v);
        }
    }
    return 0;
}

/* the innermost loop of a sweep over one run, elements [from, len):
 * vectorized (simd: every operand unit-stride or broadcast) or scalar */
static int
emit_run(Gen *G, const char *need, const int *reds, int nreds, int store, int simd, const char *from)
{
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
        LINE(G, "#pragma omp simd safelen(1)   /* %s: scalar, quick to compile */",
             strcmp(from, "0") == 0 ? "strided" : "strided, or a unit run's last elements");
    }
    LINE(G, "for (int64_t i = %s; i < len; i++) {", from);
    G->e.depth++;
    if (emit_run_body(G, need, reds, nreds, store) < 0) {
        return -1;
    }
    CLOSE(G);
    return 0;
}

/* lane partial src folded into dst (acc<v> and nan<v>, each plus a suffix) */
static void
emit_lane_fold(Gen *G, int v, const char *dst, const char *src)
{
    int op = G->e.s->g->nodes[v].op;
    switch (op) {
    case FC_OP_SUM: LINE(G, "acc%d%s += acc%d%s;", v, dst, v, src); break;
    case FC_OP_PROD: LINE(G, "acc%d%s *= acc%d%s;", v, dst, v, src); break;
    case FC_OP_ANY: LINE(G, "acc%d%s |= acc%d%s;", v, dst, v, src); break;
    case FC_OP_ALL: LINE(G, "acc%d%s &= acc%d%s;", v, dst, v, src); break;
    default:   /* amax, amin: partials are never NaN (the flag says so) */
        LINE(G, "acc%d%s = acc%d%s %s acc%d%s ? acc%d%s : acc%d%s;", v, dst, v, src,
             op == FC_OP_AMAX ? ">" : "<", v, dst, v, src, v, dst);
        if (fc_expr_has_nan_flag(G->e.s, v)) {
            LINE(G, "nan%d%s |= nan%d%s;", v, dst, v, src);
        }
        break;
    }
}

/* Whether a sweep's lane loop feeds a float32 sum (fc_expr_sum_blocked): it
 * then walks blocks (emit_lanes) */
static int
sweep_blocked(const Gen *G, const int *reds, int nreds)
{
    for (int r = 0; r < nreds; r++) {
        if (fc_expr_sum_blocked(G->e.s, reds[r])) {
            return 1;
        }
    }
    return 0;
}

/* The lane count of a sweep's lane loop: one vector of float32 (FC_LANES)
 * where wide, else 8; twice that where it feeds a float32 sum */
static const char *
lanes_text(int wide, int blocked)
{
    if (blocked) {
        return wide ? "(2 * FC_LANES)" : "16";
    }
    return LANES_TEXT(wide);
}

/* A unit-stride run's whole blocks of lanes (FC_LANES where wide, see
 * sweep_lanes_wide, else 8), reductions into lane arrays; advances i0 past
 * them (the caller's scalar loop does the rest).
 * A float32 sum (fc_expr_sum_blocked) adds in float32 lanes, twice as many
 * (two vector registers), over blocks of 16 values a lane; each block's
 * lanes are added to the float64 lanes at its end. Its float32 rounding then
 * spans 16 values at most (NumPy's pairwise float32 sum: 16 a partial, then
 * partials added in float32), and the row's total stays float64. Converting
 * every value to float64 instead cost a layernorm over 1024 rows of 256
 * (float32, 2 threads, 512-bit) 1.6x Inductor's time; in blocks, 1.25x (the
 * two registers: two chains of dependent adds, not one, for a row's values). */
static int
emit_lanes(Gen *G, const char *need, const int *reds, int nreds, int store, int wide)
{
    const int blocked = sweep_blocked(G, reds, nreds);
    const char *lanes = lanes_text(wide, blocked);
    const FcSpec *s = G->e.s;
    char init[EXPR], src[32];
    for (int r = 0; r < nreds; r++) {
        int v = reds[r];
        LINE(G, "%s acc%d_l[%s];", fc_expr_ctype(&G->e, fc_expr_acc_dtype(s, v)), v, lanes);
        if (fc_expr_has_nan_flag(s, v)) {
            LINE(G, "int nan%d_l[%s];", v, lanes);
        }
    }
    LINE(G, "for (int l = 0; l < %s; l++) {", lanes);
    G->e.depth++;
    for (int r = 0; r < nreds; r++) {
        int v = reds[r];
        fc_expr_acc_init(s, v, init);
        LINE(G, "acc%d_l[l] = %s;", v, init);
        if (fc_expr_has_nan_flag(s, v)) {
            LINE(G, "nan%d_l[l] = 0;", v);
        }
    }
    CLOSE(G);
    if (blocked) {
        LINE(G, "while (i0 + %s <= len) {", lanes);
        G->e.depth++;
        LINE(G, "const int64_t iend = len - i0 > 16 * %s ? i0 + 16 * %s : len;", lanes, lanes);
        for (int r = 0; r < nreds; r++) {
            if (fc_expr_sum_blocked(s, reds[r])) {
                LINE(G, "float acc%d_f[%s];", reds[r], lanes);
            }
        }
        LINE(G, "for (int l = 0; l < %s; l++) {", lanes);
        G->e.depth++;
        for (int r = 0; r < nreds; r++) {
            if (fc_expr_sum_blocked(s, reds[r])) {
                LINE(G, "acc%d_f[l] = 0;", reds[r]);
            }
        }
        CLOSE(G);
    }
    LINE(G, "for (; i0 + %s <= %s; i0 += %s) {", lanes, blocked ? "iend" : "len", lanes);
    G->e.depth++;
    /* l indexes the lanes, i = i0 + l the run: 3% less to compile than
     * subscripting the lanes with i - i0 */
    LINE(G, "#pragma omp simd");
    LINE(G, "for (int l = 0; l < %s; l++) {", lanes);
    G->e.depth++;
    LINE(G, "const int64_t i = i0 + l;");
    G->e.lane = "_l[l]";
    G->e.lane_block = blocked ? "_f[l]" : NULL;
    if (emit_run_body(G, need, reds, nreds, store) < 0) {
        G->e.lane = G->e.lane_block = NULL;
        return -1;
    }
    G->e.lane = G->e.lane_block = NULL;
    CLOSE(G);
    CLOSE(G);
    if (blocked) {
        LINE(G, "for (int l = 0; l < %s; l++) {", lanes);
        G->e.depth++;
        for (int r = 0; r < nreds; r++) {
            if (fc_expr_sum_blocked(s, reds[r])) {
                LINE(G, "acc%d_l[l] += (double)acc%d_f[l];", reds[r], reds[r]);
            }
        }
        CLOSE(G);
        CLOSE(G);
        /* the second register's lanes onto the first's */
        LINE(G, "for (int l = 0; l < %s; l++) {", LANES_TEXT(wide));
        G->e.depth++;
        snprintf(src, sizeof(src), "_l[l + %s]", LANES_TEXT(wide));
        for (int r = 0; r < nreds; r++) {
            emit_lane_fold(G, reds[r], "_l[l]", src);
        }
        CLOSE(G);
    }
    /* pairwise, lanes -> ... -> 2 in constant-bound loops GCC vectorizes
     * (out-of-line helpers instead were as costly to compile, and slower:
     * the call spills the lanes; one sequential loop was slower still); the
     * steps above 8 only where FC_LANES is wider */
    for (int w = wide ? LANES_MAX / 2 : 4; w > 1; w /= 2) {
        if (w >= 8) {
            LINE(G, "#if FC_LANES > %d", w);
        }
        LINE(G, "for (int l = 0; l < %d; l++) {", w);
        G->e.depth++;
        snprintf(src, sizeof(src), "_l[l + %d]", w);
        for (int r = 0; r < nreds; r++) {
            emit_lane_fold(G, reds[r], "_l[l]", src);
        }
        CLOSE(G);
        if (w >= 8) {
            LINE(G, "#endif");
        }
    }
    for (int r = 0; r < nreds; r++) {
        emit_lane_fold(G, reds[r], "_l[0]", "_l[1]");
        emit_lane_fold(G, reds[r], "", "_l[0]");
    }
    return 0;
}

/* One sweep. inner: over the row's inner space [jlo, jhi) (reductions), else
 * over the outer space [lo, hi) (pointwise, strided). reds: reductions fed
 * by this sweep; store: write materialized FULL values. */
static int
emit_sweep(Gen *G, int inner, const int *reds, int nreds, int store)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    int nn = s->g->nnodes, rc = -1, lanes = inner && nreds > 0;
    char *need = PyMem_Calloc(nn + 1, 1), use[FC_MAXOPS], saved[FC_MAXOPS];
    const char *nd = inner ? "L->nd_inner" : "L->nd_outer";
    const char *shape = inner ? "L->ishape" : "L->oshape";
    const char *stride = inner ? "L->istride" : "L->ostride";
    const char *lo = inner ? "jlo" : "lo", *hi = inner ? "jhi" : "hi";

    if (need == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (G->stash >= 0 && (store || G->after_stash)) {
        need[G->stash] = 2;          /* read back, not recomputed (need_full stops here) */
    }
    for (int r = 0; r < nreds; r++) {
        lanes &= !fc_expr_has_index(s, reds[r]);   /* first-index order: scalar */
    }
    fc_expr_need_sweep(&G->e, reds, nreds, store, need);
    sweep_operands(G, need, reds, nreds, store, use);
    G->sp = inner ? SP_INNER_RUN : SP_OUTER_RUN;
    memcpy(saved, G->e.loaded, FC_MAXOPS);   /* locals loaded inside the loop die with it */

    LINE(G, "{");
    G->e.depth++;
    LINE(G, "int64_t idx[FC_LAUNCH_MAXDIM];");
    LINE(G, "fc_unravel(%s, %s, %s, idx);", lo, nd, shape);
    LINE(G, "for (int64_t j0 = %s; j0 < %s;) {", lo, hi);
    G->e.depth++;
    LINE(G, "const int64_t len = fc_run_length(%s, %s, idx, %s - j0);", nd, shape, hi);
    LINE(G, "int64_t off[%d];", K->nops);
    LINE(G, "fc_offsets%s(%s, idx, %s, %d, off);", inner ? "" : "_run", nd, stride, K->nops);
    for (int o = 0; o < K->nops; o++) {
        const char *st;
        if (!use[o]) {
            continue;
        }
        st = fc_expr_storetype(s->slots[K->ops[o].slot].dtype);
        if (inner) {
            /* the row's outer offset, then the run's inner offset */
            LINE(G, "%s%s *restrict p%d = %s + ob%d + off[%d];",
                 K->ops[o].is_out ? "" : "const ", st, o, G->e.opname[o], o, o);
        }
        else {
            LINE(G, "%s%s *restrict p%d = %s + off[%d];",
                 K->ops[o].is_out ? "" : "const ", st, o, G->e.opname[o], o);
        }
        LINE(G, "const int64_t s%d = %s[%d][%s - 1];", o, stride, o, nd);
    }
    /* two versions of the run: every operand unit-stride (vectorized with
     * omp simd), or general strides (scalar; omp simd would make gathers).
     * An input whose dim along the run is 1 in the key (b of shape (n, 1) in
     * x + b, or a row's mean in x - mean), or has stride 0 there (an expanded
     * view), is broadcast along the run: the fast version reads p[0] for it,
     * checked at run time (stride 0), instead of falling to the scalar one. */
    {
        FcStr cond = {0};
        char *c;
        memset(G->bcast, 0, sizeof(G->bcast));
        for (int o = 0; o < K->nops; o++) {
            if (use[o]) {
                G->bcast[o] = operand_bcast_along(G, o, inner ? WALK_INNER : WALK_POINTWISE);
                fc_str_printf(&cond, "%ss%d == %d", cond.len ? " && " : "", o, G->bcast[o] ? 0 : 1);
            }
        }
        c = fc_str_take(&cond);
        if (c == NULL) {
            goto cleanup;
        }
        if (lanes) {
            /* whole blocks of lanes in lane arrays when unit-stride; the
             * scalar loop takes the rest (and whole strided runs) */
            const int wide = sweep_lanes_wide(G, need, use);
            LINE(G, "int64_t i0 = 0;");
            LINE(G, "if (%s%slen >= %s) {", c, c[0] ? " && " : "", lanes_text(wide, sweep_blocked(G, reds, nreds)));
            fc_str_release(c);
            G->e.depth++;
            G->unit = 1;
            if (emit_lanes(G, need, reds, nreds, store, wide) < 0) {
                goto cleanup;
            }
            CLOSE(G);
            G->unit = 0;
            if (emit_run(G, need, reds, nreds, store, 0, "i0") < 0) {
                goto cleanup;
            }
        }
        else if (c[0] == 0) {
            fc_str_release(c);
            G->unit = 1;
            if (emit_run(G, need, reds, nreds, store, 1, "0") < 0) {
                goto cleanup;
            }
        }
        else {
            LINE(G, "if (%s) {", c);
            fc_str_release(c);
            G->e.depth++;
            G->unit = 1;
            if (emit_run(G, need, reds, nreds, store, 1, "0") < 0) {
                goto cleanup;
            }
            CLOSE(G);
            LINE(G, "else {");
            G->e.depth++;
            G->unit = 0;
            if (emit_run(G, need, reds, nreds, store, 0, "0") < 0) {
                goto cleanup;
            }
            CLOSE(G);
        }
    }
    memset(G->bcast, 0, sizeof(G->bcast));
    LINE(G, "j0 += len;");
    LINE(G, "fc_advance%s(%s, %s, idx, len);", inner ? "" : "_run", nd, shape);
    CLOSE(G);
    CLOSE(G);
    rc = 0;
cleanup:
    memcpy(G->e.loaded, saved, FC_MAXOPS);
    PyMem_Free(need);
    return rc;
}

/* ------------------------------------------------------------------------
 * kernel bodies
 * ---------------------------------------------------------------------- */

/* A flat kernel that does enough arithmetic per element (a transcendental,
 * a division, a pow) to keep the core busy: the hardware prefetcher then
 * falls behind on a cold input (measured with GELU on an input just evicted
 * from L3), and an explicit prefetch a few KB ahead
 * keeps it streaming. Cheap kernels are memory-bound already and skip it. */
static int
flat_is_heavy(const Gen *G)
{
    const FcSpec *s = G->e.s;
    for (int m = 0; m < G->e.K->nnodes; m++) {
        const FcNode *n = &s->g->nodes[G->e.K->nodes[m]];
        if (fc_dtypes[s->sn[G->e.K->nodes[m]].dtype].kind != 'f') {
            continue;
        }
        switch (n->op) {
        case FC_OP_EXP: case FC_OP_EXP2: case FC_OP_EXPM1: case FC_OP_LOG: case FC_OP_LOG2:
        case FC_OP_LOG10: case FC_OP_LOG1P: case FC_OP_SIN: case FC_OP_COS: case FC_OP_TAN:
        case FC_OP_TANH: case FC_OP_ASIN: case FC_OP_ACOS: case FC_OP_ATAN: case FC_OP_SINH:
        case FC_OP_COSH: case FC_OP_ASINH: case FC_OP_ACOSH: case FC_OP_ATANH: case FC_OP_ERF:
        case FC_OP_SIGMOID: case FC_OP_GELU: case FC_OP_GELU_TANH: case FC_OP_GELU_GRAD: case FC_OP_SILU:
        case FC_OP_SOFTPLUS: case FC_OP_POW: case FC_OP_ATAN2: case FC_OP_HYPOT:
            return 1;
        default:
            break;
        }
    }
    return 0;
}

/* A heavy flat kernel walks blocks of FC_PF_BLOCK elements. Each block first
 * prefetches its inputs FC_PF_BYTES ahead and, when the launch writes
 * FC_NT_BYTES or more, is computed into fc_tmp<o> and streamed out (see
 * fc_kernel.h). This opens the block loop; the element loop inside writes
 * w<o>[k]. */
static void
emit_heavy_open(Gen *G)
{
    const FcKernelIR *K = G->e.K;
    int out_bytes = 0;                   /* per element, all outputs: 0 streams nothing */
    for (int o = 0; o < K->nops; o++) {
        if (K->ops[o].is_out) {
            out_bytes += fc_dtypes[G->e.s->slots[K->ops[o].slot].dtype].size;
        }
    }
    LINE(G, "const int fc_nt = FC_HAVE_NT && L->n_outer * %d >= FC_NT_BYTES;", out_bytes);
    LINE(G, "for (int64_t i0 = lo; i0 < hi; i0 += FC_PF_BLOCK) {");
    G->e.depth++;
    LINE(G, "const int64_t i1 = hi - i0 > FC_PF_BLOCK ? i0 + FC_PF_BLOCK : hi;");
    for (int o = 0; o < K->nops; o++) {
        if (K->ops[o].is_out) {
            const char *st = fc_expr_storetype(G->e.s->slots[K->ops[o].slot].dtype);
            LINE(G, "%s fc_tmp%d[FC_PF_BLOCK] __attribute__((aligned(64)));", st, o);
            LINE(G, "%s *restrict w%d = fc_nt ? fc_tmp%d : %s + i0;", st, o, o, G->e.opname[o]);
        }
        else if (!fc_expr_operand_is_scalar(&G->e, o)) {
            LINE(G, "FC_PREFETCH_BLOCK(%s, i0, hi);", G->e.opname[o]);
        }
    }
}

/* closes emit_heavy_open's block loop: streams the block, fences at the end */
static void
emit_heavy_close(Gen *G)
{
    const FcKernelIR *K = G->e.K;
    LINE(G, "if (fc_nt) {");
    G->e.depth++;
    for (int o = 0; o < K->nops; o++) {
        if (K->ops[o].is_out) {
            LINE(G, "fc_stream_store(%s + i0, fc_tmp%d, (i1 - i0) * (int64_t)sizeof(*%s));",
                 G->e.opname[o], o, G->e.opname[o]);
        }
    }
    CLOSE(G);
    CLOSE(G);
    LINE(G, "if (fc_nt) {");
    LINE(G, "    FC_STREAM_FENCE();     /* the streamed lines reach memory before the region ends */");
    LINE(G, "}");
}

static int
emit_pointwise(Gen *G, const char *name)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    LINE(G, "static void");
    LINE(G, "%s_range(const fc_launch *L, int64_t lo, int64_t hi, int *err)", name);
    LINE(G, "{");
    G->e.depth++;
    LINE(G, "int fc_err = 0;");
    fc_expr_emit_operand_decls(&G->e);
    if (K->flat) {
        int heavy = flat_is_heavy(G);
        if (heavy) {
            emit_heavy_open(G);
        }
        LINE(G, "#pragma omp simd");
        if (heavy) {
            LINE(G, "for (int64_t k = 0; k < i1 - i0; k++) {");
            LINE(G, "    const int64_t i = i0 + k;");
        }
        else {
            LINE(G, "for (int64_t i = lo; i < hi; i++) {");
        }
        G->e.depth++;
        G->sp = SP_FLAT;
        memset(G->e.loaded, 0, FC_MAXOPS);
        for (int m = 0; m < K->nnodes; m++) {
            if (fc_expr_emit_node(&G->e, K->nodes[m]) < 0) {
                return -1;
            }
        }
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            if (s->sn[v].materialize) {
                /* by name, not mem_expr: a size-1 output is still written at [i] */
                char val[EXPR];
                int o = fc_expr_stored(&G->e, v, FC_ALIGN_FULL, val);
                if (heavy) {
                    LINE(G, "w%d[k] = %s;", o, val);
                }
                else {
                    LINE(G, "%s[i] = %s;", G->e.opname[o], val);
                }
            }
        }
        CLOSE(G);
        if (heavy) {
            emit_heavy_close(G);
        }
    }
    else if (emit_sweep(G, 0, NULL, 0, 1) < 0) {
        return -1;
    }
    LINE(G, "fc_report(err, fc_err);");
    CLOSE(G);
    fc_str_puts(G->e.b, "\n");
    LINE(G, "FC_EXPORT int");
    LINE(G, "%s(const fc_launch *L)", name);
    LINE(G, "{");
    G->e.depth++;
    LINE(G, "int err = 0;");
    LINE(G, "FC_RUN_RANGES(L, L->n_outer, 16, %s_range, &err);", name);
    LINE(G, "return err;");
    CLOSE(G);
    return 0;
}

/* A FULL value with a transcendental in it, needed by a reduction sweep and
 * again by a later sweep (softmax's exp(x - max) by the final one;
 * layernorm(gelu(x))'s gelu by the variance sweep and the final one), is
 * written to an output of its type in the first sweep that needs it and read
 * back in the later ones (the row is still in cache) instead of being
 * computed again. Sets G->stash/stash_op/stash_level, or leaves stash at -1. */
static int
choose_stash(Gen *G)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    int nn = s->g->nnodes, best = -1;
    /* first[v]: the first sweep (reduction level, 1-based; final = nphases + 1)
     * that needs v; again[v]: a later one needs it too */
    char *first = PyMem_Calloc(nn + 1, 1), *again = PyMem_Calloc(nn + 1, 1);
    char *need = PyMem_Calloc(nn + 1, 1);
    G->stash = -1;
    if (first == NULL || again == NULL || need == NULL) {
        PyMem_Free(first);
        PyMem_Free(again);
        PyMem_Free(need);
        PyErr_NoMemory();
        return -1;
    }
    for (int level = 1; K->nphases > 0 && level <= K->nphases + 1; level++) {
        int reds[FC_MAX_KERNEL_REDS], nreds = fc_expr_level_reds(&G->e, level, reds);
        memset(need, 0, nn);
        fc_expr_need_sweep(&G->e, reds, nreds, level > K->nphases, need);   /* the sweep's own marking */
        for (int v = 0; v < nn; v++) {
            if (need[v] && first[v]) {
                again[v] = 1;
            }
            else if (need[v]) {
                first[v] = (char)level;
            }
        }
    }
    for (int v = 0; v < nn; v++) {
        const FcOpInfo *op = &fc_ops[s->g->nodes[v].op];
        if (again[v] && first[v] <= K->nphases && op->kind == FC_KIND_PW && op->rule == FC_R_FLOAT &&
                strncmp(op->cexpr, "fc_", 3) == 0 && (best < 0 || first[v] <= first[best])) {
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
            G->stash_level = first[best];
            if (node == best) {
                break;
            }
        }
    }
    PyMem_Free(first);
    PyMem_Free(again);
    PyMem_Free(need);
    return 0;
}

/* reduction v's members in a partials struct: dims per thread (and column) */
static void
emit_part_members(Gen *G, int v, const char *dims)
{
    const FcSpec *s = G->e.s;
    LINE(G, "%s part%d%s;", fc_expr_ctype(&G->e, fc_expr_acc_dtype(s, v)), v, dims);
    if (fc_expr_has_nan_flag(s, v)) {
        LINE(G, "int nan%d%s;", v, dims);
    }
    if (fc_expr_has_index(s, v)) {
        LINE(G, "int64_t idx%d%s;", v, dims);
    }
}

/* name_<wrapper>(L, lo, hi, err): name_<shared> over [lo, hi) by this thread
 * alone (P NULL), the form FC_RUN_RANGES calls */
static void
emit_serial_wrapper(Gen *G, const char *name, const char *wrapper, const char *shared)
{
    LINE(G, "static void");
    LINE(G, "%s_%s(const fc_launch *L, int64_t lo, int64_t hi, int *err)", name, wrapper);
    LINE(G, "{");
    LINE(G, "    %s_%s(L, lo, hi, err, NULL, 0, 1);", name, shared);
    LINE(G, "}");
    fc_str_puts(G->e.b, "\n");
}

/* The head of name_<fn>(L, lo, hi, err, P, tid, nth), over outer elements
 * [lo, hi): P == NULL, this thread walks their rows whole; else (a
 * name_<parts> shared by the team) its share [jlo, jhi) of them. Leaves the
 * body open at oidx = lo. */
static void
emit_shared_head(Gen *G, const char *name, const char *fn, const char *parts)
{
    LINE(G, "static void");
    LINE(G, "%s_%s(const fc_launch *L, int64_t lo, int64_t hi, int *err, %s_%s *P, int tid, int nth)",
         name, fn, name, parts);
    LINE(G, "{");
    G->e.depth++;
    LINE(G, "int fc_err = 0;");
    LINE(G, "int64_t jlo = 0, jhi = L->n_inner;");
    LINE(G, "int64_t oidx[FC_LAUNCH_MAXDIM];");
    fc_expr_emit_operand_decls(&G->e);
    LINE(G, "if (P != NULL) {");
    LINE(G, "    fc_thread_range(L->n_inner, 16, tid, nth, &jlo, &jhi);");
    LINE(G, "}");
    LINE(G, "fc_unravel(lo, L->nd_outer, L->oshape, oidx);");
}

/* Threads that share rows (P non-NULL): each publishes its partial of every
 * reduction in reds, then every thread folds them all in thread order, so
 * all hold the same result. pre: the member prefix in P ("" for a row's
 * scalars; "l<level>." for a column block's arrays, folded over b < nb, the
 * accumulators then indexed [b] by gen_expr). Two barriers: the partials are
 * read by all before any thread publishes the next ones. */
static void
emit_fold(Gen *G, const int *reds, int nreds, const char *pre)
{
    const FcSpec *s = G->e.s;
    const char *sub = G->e.cols ? "[b]" : "";
    LINE(G, "if (P != NULL) {");
    G->e.depth++;
    if (G->e.cols) {
        LINE(G, "for (int64_t b = 0; b < nb; b++) {");
        G->e.depth++;
    }
    for (int r = 0; r < nreds; r++) {
        int v = reds[r];
        LINE(G, "P->%spart%d[tid]%s = acc%d%s;", pre, v, sub, v, sub);
        if (fc_expr_has_nan_flag(s, v)) {
            LINE(G, "P->%snan%d[tid]%s = nan%d%s;", pre, v, sub, v, sub);
        }
        if (fc_expr_has_index(s, v)) {
            LINE(G, "P->%sidx%d[tid]%s = idx%d%s;", pre, v, sub, v, sub);
        }
    }
    if (G->e.cols) {
        CLOSE(G);
    }
    LINE(G, "#pragma omp barrier");
    if (G->e.cols) {
        LINE(G, "for (int64_t b = 0; b < nb; b++) {");
        G->e.depth++;
    }
    for (int r = 0; r < nreds; r++) {
        char init[EXPR], px[48], pj[48];
        int v = reds[r];
        fc_expr_acc_init(s, v, init);
        LINE(G, "acc%d%s = %s;", v, sub, init);
        if (fc_expr_has_nan_flag(s, v)) {
            LINE(G, "nan%d%s = 0;", v, sub);
        }
        LINE(G, "for (int t = 0; t < nth; t++) {");
        G->e.depth++;
        snprintf(px, sizeof(px), "P->%spart%d[t]%s", pre, v, sub);
        snprintf(pj, sizeof(pj), "P->%sidx%d[t]%s", pre, v, sub);
        if (s->g->nodes[v].op == FC_OP_SUM) {
            LINE(G, "acc%d%s += %s;", v, sub, px);
        }
        else if (s->g->nodes[v].op == FC_OP_PROD) {
            LINE(G, "acc%d%s *= %s;", v, sub, px);
        }
        else {
            fc_expr_accumulate(&G->e, v, px, pj);
            if (fc_expr_has_nan_flag(s, v)) {
                LINE(G, "nan%d%s |= P->%snan%d[t]%s;", v, sub, pre, v, sub);
            }
        }
        CLOSE(G);
    }
    if (G->e.cols) {
        CLOSE(G);
    }
    LINE(G, "#pragma omp barrier");
    CLOSE(G);
}

/* the body for one outer element o (offsets ob<k> already set). With P
 * non-NULL the threads share the row: partials are combined at barriers. */
static int
emit_row(Gen *G)
{
    const FcKernelIR *K = G->e.K;
    int reds[FC_MAX_KERNEL_REDS];

    if (choose_stash(G) < 0) {
        return -1;
    }
    G->sp = SP_OUTER_POINT;
    memset(G->e.loaded, 0, FC_MAXOPS);
    for (int level = 0; level <= K->nphases; level++) {
        if (level > 0) {
            int nreds = fc_expr_begin_level(&G->e, level, reds);
            G->in_stash_sweep = G->stash >= 0 && level == G->stash_level;
            G->after_stash = G->stash >= 0 && level > G->stash_level;
            if (emit_sweep(G, 1, reds, nreds, 0) < 0) {
                return -1;
            }
            G->in_stash_sweep = G->after_stash = 0;
            G->sp = SP_OUTER_POINT;
            emit_fold(G, reds, nreds, "");       /* shared rows */
            for (int r = 0; r < nreds; r++) {
                fc_expr_emit_red_result(&G->e, reds[r]);
            }
        }
        if (fc_expr_emit_outer_nodes(&G->e, level) < 0) {
            return -1;
        }
    }
    if (fc_expr_has_materialized(&G->e, FC_VK_FULL)) {
        LINE(G, "/* final sweep: write full-size results */");
        if (emit_sweep(G, 1, NULL, 0, 1) < 0) {
            return -1;
        }
        G->sp = SP_OUTER_POINT;
    }
    LINE(G, "if (P == NULL || tid == 0) {");
    G->e.depth++;
    fc_expr_emit_outer_stores(&G->e);
    CLOSE(G);
    return 0;
}

/* Column blocks: reductions over a dim walked with a stride while
 * neighbouring outer elements sit next to each other (a sum over axis 0 of
 * a C-ordered array; a BatchNorm's statistics over the batch), checked at
 * run time (fc_use_cols). Each thread walks its outer range FC_COLS elements
 * at a time, the reduced index outside and the block inside, so the block's
 * loads and stores are contiguous, the accumulators and OUTER values are
 * arrays over b, and every sweep of the block walks the rows again (one per
 * reduction level, then a final one for full-size results that need a
 * reduction's value, as a row's sweeps do; a block of a few thousand rows
 * is still in cache for the next). With one level and no such result,
 * full-size results computed before any reduction (a backward's grad * x,
 * stored and also summed over the batch for a weight's gradient) are
 * stored in the reduction's sweep: one walk. Arg reductions stay with rows
 * (first-index order). The several-walk version is written only where the
 * key allows a layout that takes it (fc_use_cols: the reduced dims strided):
 * the innermost dim of the kernel's space is not reduced, or an input is not
 * C-contiguous (transposed, channels_last). A softmax or layernorm over the
 * last dim of C-ordered arrays never runs it, and its compile would pay for
 * the extra text. */
/* the single-walk case below: one level, every stored FULL value at level 0 */
static int
cols_one_sweep(const Gen *G)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    if (K->nphases != 1) {
        return 0;
    }
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (s->sn[v].materialize && s->sn[v].kind == FC_VK_FULL && s->sn[v].level > 0) {
            return 0;
        }
    }
    return 1;
}

static int
cols_eligible(const Gen *G)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    int strided_layout = K->nd > 0 && !(K->mask & (1u << (K->nd - 1)));
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (fc_expr_is_red(s, v) && fc_expr_has_index(s, v)) {
            return 0;
        }
    }
    for (int o = 0; o < K->nops; o++) {
        const FcSlot *sl = &s->slots[K->ops[o].slot];
        strided_layout |= !K->ops[o].is_out && (!sl->contig || sl->perm != 0);
    }
    return K->nphases >= 1 && (strided_layout || cols_one_sweep(G));
}

/* column blocks: the OUTER nodes of a level, over the block */
static int
emit_outer_level(Gen *G, int level)
{
    const FcKernelIR *K = G->e.K;
    int any = 0;
    for (int m = 0; m < K->nnodes; m++) {
        any |= fc_expr_outer_node(&G->e, K->nodes[m], level);
    }
    if (!any) {
        return 0;
    }
    LINE(G, "for (int64_t b = 0; b < nb; b++) {");
    G->e.depth++;
    memset(G->e.loaded, 0, FC_MAXOPS);
    if (fc_expr_emit_outer_nodes(&G->e, level) < 0) {
        return -1;
    }
    CLOSE(G);
    return 0;
}

/* the reductions a column-block sweep feeds (reds: level's, or all of the
 * one-sweep case's), store: whether it writes materialized FULL values; the
 * operands it walks into use (NULL: none wanted). need: nn + 1 bytes. */
static void
cols_sweep_need(Gen *G, const int *reds, int nreds, int store, char *need, char *use)
{
    const FcSpec *s = G->e.s;
    memset(need, 0, s->g->nnodes + 1);
    fc_expr_need_sweep(&G->e, reds, nreds, store, need);
    sweep_operands(G, need, reds, nreds, store, use);
}

/* a column block's float32 partial sums (fc_expr_sum_blocked) added to its
 * float64 accumulators; reset: start the next block of rows */
static void
emit_cols_flush(Gen *G, const int *reds, int nreds, int reset)
{
    LINE(G, "for (int64_t b = 0; b < nb; b++) {");
    G->e.depth++;
    for (int r = 0; r < nreds; r++) {
        if (fc_expr_sum_blocked(G->e.s, reds[r])) {
            LINE(G, "acc%d[b] += (double)acc%d_f[b];", reds[r], reds[r]);
            if (reset) {
                LINE(G, "acc%d_f[b] = 0;", reds[r]);
            }
        }
    }
    CLOSE(G);
}

/* One walk of a column block over every row. A float32 sum (as in a
 * BatchNorm's statistics over channels_last channels) adds each column's
 * values in float32 over blocks of at most 16 rows, each block's partial then
 * added to the column's float64 accumulator: float32 rounding spans 16 values
 * at most, as in the row sweeps' lanes (emit_lanes), where converting every
 * value to float64 cost a vector conversion and twice the adds. */
static int
emit_cols_sweep(Gen *G, const int *reds, int nreds, int store, char *need)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    int nn = s->g->nnodes;
    const int blocked = sweep_blocked(G, reds, nreds);
    char use[FC_MAXOPS];

    cols_sweep_need(G, reds, nreds, store, need, use);
    LINE(G, "{");
    G->e.depth++;
    if (blocked) {
        for (int r = 0; r < nreds; r++) {
            if (fc_expr_sum_blocked(s, reds[r])) {
                LINE(G, "float acc%d_f[FC_COLS];", reds[r]);
                LINE(G, "for (int64_t b = 0; b < nb; b++) {");
                LINE(G, "    acc%d_f[b] = 0;", reds[r]);
                LINE(G, "}");
            }
        }
        LINE(G, "int blk = 0;");
    }
    LINE(G, "int64_t idx[FC_LAUNCH_MAXDIM];");
    LINE(G, "fc_unravel(jlo, L->nd_inner, L->ishape, idx);");
    LINE(G, "for (int64_t j0 = jlo; j0 < jhi;) {");
    G->e.depth++;
    LINE(G, "const int64_t len = fc_run_length(L->nd_inner, L->ishape, idx, jhi - j0);");
    for (int o = 0; o < K->nops; o++) {
        int dt;
        if (!use[o]) {
            continue;
        }
        dt = s->slots[K->ops[o].slot].dtype;
        LINE(G, "%s%s *restrict p%d = %s + ob%d + fc_offset(L->nd_inner, idx, L->istride[%d]);",
             K->ops[o].is_out ? "" : "const ", fc_expr_storetype(dt), o, G->e.opname[o], o, o);
        LINE(G, "const int64_t s%d = L->istride[%d][L->nd_inner - 1];", o, o);
    }
    LINE(G, "for (int64_t i = 0; i < len; i++) {");
    G->e.depth++;
    /* the rows ahead, each of its cache lines: a stride of a row (kilobytes)
     * is past what the hardware prefetchers follow (a page). Not for an
     * operand the same in every row (a channel's mean or weight in a
     * BatchNorm over channels_last rows: its lines stay in L1), which the key
     * says is broadcast along the rows; a prefetch is only a hint, so a wrong
     * guess costs time, never a result: CNN BatchNorm + ReLU + mean over
     * (16, 32, 32, 32) channels_last, with the float32 blocks above, 82-92
     * -> 63-80 us (2 threads, Intel family 6 model 167; Inductor's 66 us) */
    LINE(G, "if (i + FC_COLS_AHEAD < len) {");
    G->e.depth++;
    for (int o = 0; o < K->nops; o++) {
        if (use[o] && !G->bcast[o] && !operand_bcast_along(G, o, WALK_INNER)) {
            int esz = fc_dtypes[s->slots[K->ops[o].slot].dtype].size;
            LINE(G, "for (int64_t b = 0; b < nb; b += %d) {", 64 / esz);
            LINE(G, "    __builtin_prefetch(p%d + (i + FC_COLS_AHEAD) * s%d + b, %d);", o, o, K->ops[o].is_out);
            LINE(G, "}");
        }
    }
    CLOSE(G);
    LINE(G, "#pragma omp simd");
    LINE(G, "for (int64_t b = 0; b < nb; b++) {");
    G->e.depth++;
    G->sp = SP_INNER_RUN;
    memset(G->e.loaded, 0, FC_MAXOPS);
    for (int v = 0; v < nn; v++) {
        if (need[v] && fc_expr_emit_node(&G->e, v) < 0) {
            return -1;
        }
    }
    G->e.lane_block = blocked ? "_f[b]" : NULL;
    for (int r = 0; r < nreds; r++) {
        if (fc_expr_feed(&G->e, reds[r], "(j0 + i)") < 0) {
            G->e.lane_block = NULL;
            return -1;
        }
    }
    G->e.lane_block = NULL;
    for (int v = 0; store && v < nn; v++) {
        if (need[v] && s->sn[v].materialize && s->sn[v].kind == FC_VK_FULL) {
            fc_expr_emit_store(&G->e, v);
        }
    }
    CLOSE(G);
    if (blocked) {
        LINE(G, "if (++blk == 16) {");
        G->e.depth++;
        emit_cols_flush(G, reds, nreds, 1);
        LINE(G, "blk = 0;");
        CLOSE(G);
    }
    CLOSE(G);
    LINE(G, "j0 += len;");
    LINE(G, "fc_advance(L->nd_inner, L->ishape, idx, len);");
    CLOSE(G);
    if (blocked) {
        emit_cols_flush(G, reds, nreds, 0);
    }
    CLOSE(G);
    G->sp = SP_OUTER_POINT;
    return 0;
}

/* a level's accumulators, one per column of the block */
static void
emit_cols_accs(Gen *G, const int *reds, int nreds)
{
    const FcSpec *s = G->e.s;
    for (int r = 0; r < nreds; r++) {
        int v = reds[r];
        char init[EXPR];
        fc_expr_acc_init(s, v, init);
        LINE(G, "%s acc%d[FC_COLS];", fc_expr_ctype(&G->e, fc_expr_acc_dtype(s, v)), v);
        if (fc_expr_has_nan_flag(s, v)) {
            LINE(G, "int nan%d[FC_COLS];", v);
        }
        LINE(G, "for (int64_t b = 0; b < nb; b++) {");
        LINE(G, "    acc%d[b] = %s;", v, init);
        if (fc_expr_has_nan_flag(s, v)) {
            LINE(G, "    nan%d[b] = 0;", v);
        }
        LINE(G, "}");
    }
}

/* a level's reduction results, then its OUTER nodes, over the block */
static int
emit_cols_results(Gen *G, const int *reds, int nreds, int level)
{
    char pre[16];
    snprintf(pre, sizeof(pre), "l%d.", level);
    emit_fold(G, reds, nreds, pre);
    LINE(G, "for (int64_t b = 0; b < nb; b++) {");
    G->e.depth++;
    for (int r = 0; r < nreds; r++) {
        fc_expr_emit_red_result(&G->e, reds[r]);
    }
    CLOSE(G);
    return emit_outer_level(G, level);
}

/* Walk w (from 0) of a column block: the reductions it feeds (reds; their
 * count returned) and *store, whether it writes materialized FULL values.
 * One sweep: walk 0 feeds level 1 and stores. Else walk w feeds level w + 1
 * and the last walk (w == nphases, where a FULL value is stored) only stores. */
static int
cols_walk(const Gen *G, int one, int w, int *reds, int *store)
{
    *store = one || w == G->e.K->nphases;
    return w < G->e.K->nphases ? fc_expr_level_reds(&G->e, w + 1, reds) : 0;
}

static int
emit_cols(Gen *G, const char *name)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    int reds[FC_MAX_KERNEL_REDS], nn = s->g->nnodes, rc = -1;
    const int one = cols_one_sweep(G);
    const int nwalks = one ? 1 : K->nphases + fc_expr_has_materialized(&G->e, FC_VK_FULL);
    char *need = PyMem_Calloc(nn + 1, 1), use[FC_MAXOPS], any[FC_MAXOPS] = {0};

    if (need == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    G->e.cols = 1;
    G->stash = -1;
    /* the operands some sweep walks; an input broadcast along the block (a
     * row's mean in a weight gradient's sum over the batch of
     * (x - mean) * rstd * grad) is read once per block row */
    for (int w = 0; w < nwalks; w++) {
        int store, n = cols_walk(G, one, w, reds, &store);
        cols_sweep_need(G, reds, n, store, need, use);
        for (int o = 0; o < K->nops; o++) {
            any[o] |= use[o];
        }
    }
    G->cols_zero = 0;
    memset(G->bcast, 0, sizeof(G->bcast));
    for (int o = 0; o < K->nops; o++) {
        if (any[o] && operand_bcast_along(G, o, WALK_COLS)) {
            G->bcast[o] = 1;
            G->cols_zero |= (uint64_t)1 << o;
        }
    }
    /* partials per thread and column, for rows shared by the threads: one
     * level's at a time (emit_fold's second barrier), so the levels share
     * the memory */
    LINE(G, "typedef union {");
    G->e.depth++;
    for (int level = 1; level <= K->nphases; level++) {
        int n = fc_expr_level_reds(&G->e, level, reds);
        LINE(G, "struct {");
        G->e.depth++;
        for (int r = 0; r < n; r++) {
            emit_part_members(G, reds[r], "[FC_COLS_SPLIT_THREADS][FC_COLS]");
        }
        G->e.depth--;
        LINE(G, "} l%d;", level);
    }
    G->e.depth--;
    LINE(G, "} %s_cparts;", name);
    fc_str_puts(G->e.b, "\n");
    /* in blocks of FC_COLS; shared rows: fc_use_cols_split */
    emit_shared_head(G, name, "cols", "cparts");
    LINE(G, "for (int64_t o = lo; o < hi;) {");
    G->e.depth++;
    LINE(G, "int64_t nb = fc_run_length(L->nd_outer, L->oshape, oidx, hi - o);");
    LINE(G, "nb = nb < FC_COLS ? nb : FC_COLS;");
    for (int o = 0; o < K->nops; o++) {
        LINE(G, "const int64_t ob%d = fc_offset(L->nd_outer, oidx, L->ostride[%d]);", o, o);
    }
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (s->sn[v].kind == FC_VK_OUTER) {
            LINE(G, "%s t%d[FC_COLS];", fc_expr_ctype(&G->e, fc_dtype_compute(s->sn[v].dtype)), v);
        }
    }
    G->sp = SP_OUTER_POINT;
    if (emit_outer_level(G, 0) < 0) {
        goto cleanup;
    }
    for (int w = 0; w < nwalks; w++) {
        int store, nreds = cols_walk(G, one, w, reds, &store), level = w + 1;
        if (level > K->nphases) {
            LINE(G, "/* final sweep: write full-size results */");
        }
        else if (!one) {
            LINE(G, "/* sweep %d: %d reduction%s */", level, nreds, nreds == 1 ? "" : "s");
        }
        if (level <= K->nphases) {
            emit_cols_accs(G, reds, nreds);
        }
        if (emit_cols_sweep(G, reds, nreds, store, need) < 0 ||
                (level <= K->nphases && emit_cols_results(G, reds, nreds, level) < 0)) {
            goto cleanup;
        }
    }
    LINE(G, "if (P == NULL || tid == 0) {");
    G->e.depth++;
    LINE(G, "for (int64_t b = 0; b < nb; b++) {");
    G->e.depth++;
    fc_expr_emit_outer_stores(&G->e);
    CLOSE(G);
    CLOSE(G);
    LINE(G, "o += nb;");
    LINE(G, "fc_advance(L->nd_outer, L->oshape, oidx, nb);");
    CLOSE(G);
    LINE(G, "fc_report(err, fc_err);");
    CLOSE(G);
    fc_str_puts(G->e.b, "\n");
    emit_serial_wrapper(G, name, "cols_all", "cols");
    rc = 0;
cleanup:
    G->e.cols = 0;
    memset(G->bcast, 0, sizeof(G->bcast));
    PyMem_Free(need);
    return rc;
}

/* The driver's two ways over the outer elements: with test(L) true, one team
 * whose threads share each one's rows (name_<shared>, partials in a
 * name_<parts> P); else ranges of them per thread, in gran-element steps
 * (name_<ranges>). Then returns err. */
static void
emit_dispatch(Gen *G, const char *name, const char *test, const char *parts, const char *shared,
              const char *ranges, int gran, const char *comment)
{
    LINE(G, "if (%s(L)) {", test);
    G->e.depth++;
    LINE(G, "%s_%s P;", name, parts);
    LINE(G, "#pragma omp parallel num_threads(L->nthreads)");
    LINE(G, "%s_%s(L, 0, L->n_outer, &err, &P, omp_get_thread_num(), omp_get_num_threads());", name, shared);
    CLOSE(G);
    LINE(G, "else {");
    LINE(G, "    FC_RUN_RANGES(L, L->n_outer, %d, %s_%s, &err);%s", gran, name, ranges, comment);
    LINE(G, "}");
    LINE(G, "return err;");
}

static int
emit_reduction(Gen *G, const char *name)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    int cols = cols_eligible(G);

    if (cols && emit_cols(G, name) < 0) {
        return -1;
    }

    /* per-thread partials for rows shared by all threads */
    LINE(G, "typedef struct {");
    G->e.depth++;
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (!fc_expr_is_red(s, v)) {
            continue;
        }
        emit_part_members(G, v, "[FC_MAX_THREADS]");
    }
    G->e.depth--;
    LINE(G, "} %s_parts;", name);
    fc_str_puts(G->e.b, "\n");

    /* outer elements [lo, hi); P == NULL: this thread owns them whole,
     * else every thread takes its share of each one's inner range */
    emit_shared_head(G, name, "body", "parts");
    LINE(G, "for (int64_t o = lo; o < hi; o++) {");
    G->e.depth++;
    for (int o = 0; o < K->nops; o++) {
        LINE(G, "const int64_t ob%d = fc_offset(L->nd_outer, oidx, L->ostride[%d]);", o, o);
    }
    if (emit_row(G) < 0) {
        return -1;
    }
    LINE(G, "fc_advance(L->nd_outer, L->oshape, oidx, 1);");
    CLOSE(G);
    LINE(G, "fc_report(err, fc_err);");
    CLOSE(G);
    fc_str_puts(G->e.b, "\n");

    emit_serial_wrapper(G, name, "rows", "body");

    LINE(G, "FC_EXPORT int");
    LINE(G, "%s(const fc_launch *L)", name);
    LINE(G, "{");
    G->e.depth++;
    LINE(G, "int err = 0;");
    if (fc_expr_needs_nonempty(G->e.s, G->e.K)) {
        LINE(G, "if (L->n_inner == 0) {");
        LINE(G, "    return FC_ERR_EMPTY_REDUCE;");
        LINE(G, "}");
    }
    if (cols) {
        LINE(G, "if (fc_use_cols(L, 0x%llxULL)) {", (unsigned long long)G->cols_zero);
        G->e.depth++;
        emit_dispatch(G, name, "fc_use_cols_split", "cparts", "cols", "cols_all", 16, "");
        CLOSE(G);
    }
    emit_dispatch(G, name, "fc_use_split", "parts", "body", "rows", 1, "   /* rows: no rounding */");
    CLOSE(G);
    return 0;
}

static const FcExprTarget c_target = {
    .who = "gen_c",
    .bool_type = "_Bool",
    .bool_load = "((_Bool)%s)",
    .launch = "L->",
    .restrict_kw = "restrict",
    .mem = mem_expr,
};

char *
fc_gen_c(const FcSpec *s, int k, const char *name, const char *header_comment)
{
    FcStr b = {0};
    Gen G;
    char loaded[FC_MAXOPS];
    int rc;

    memset(&G, 0, sizeof(G));
    fc_expr_init(&G.e, &c_target, s, k, &b, loaded);
    G.stash = -1;
    fc_str_printf(&b, "/* %s */\n#include \"fc_kernel.h\"\n\n", header_comment ? header_comment : "fastcompile kernel");
    rc = G.e.K->mask ? emit_reduction(&G, name) : emit_pointwise(&G, name);
    if (rc < 0) {
        fc_str_free(&b);
        return NULL;
    }
    return fc_str_take(&b);
}
