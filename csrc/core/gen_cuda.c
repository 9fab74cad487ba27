/* Renderer, CUDA: one fused kernel -> CUDA C++ source text for NVRTC.
 * In: FcSpec + kernel index. Out: a malloc'd string. Never compiles or launches (csrc/runtime/cuda.c does).
 *
 * gen_c.c's sibling: nodes, conversions, loads, stores and accumulators
 * come from gen_expr.c (the same text as the CPU's, in CUDA's dialect),
 * device helpers from fc_cuda_math.h and the skeletons (launch struct,
 * offsets, block reductions) from fc_cuda_kernel.h; this file holds the
 * loops and the launch entry points.
 *
 * Shape of the output: a template body NAME_body<I> over an index type I and
 * two entry points, NAME_i32 (every offset fits in 32 bits) and NAME_i64.
 *   pointwise:  a grid-stride loop over the outer space, unroll_of elements
 *               per thread and trip; contiguous kernels
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
#include <stdio.h>
#include <string.h>

#include "gen_expr.h"

#define EXPR FC_EXPR_MAX
#define LINE(G, ...) FC_LINE(&(G)->e, __VA_ARGS__)
#define CLOSE(G) FC_CLOSE(&(G)->e)

typedef enum { SP_FLAT, SP_VECTOR, SP_STRIDED, SP_INNER, SP_CACHED, SP_OUTER_POINT } Space;

/* Row cache: a reduction kernel's sweeps over its row read the inputs from
 * registers, FC_CU_ROWCACHE elements per thread (fc_cuda_kernel.h: 16, rows
 * of up to 4096 elements whole), loaded before the first sweep that reads
 * them; the rest of a longer row is read again from memory by each sweep.
 * Softmax and layernorm then read their row from memory once, all of a
 * thread's loads out together. */
#define ROWCACHE "FC_CU_ROWCACHE"

typedef struct {
    FcExprGen e;         /* shared with gen_expr.c (first member: mem_expr casts back) */
    int nd;              /* the launch struct's ND: the kernel's rank, at least 1 */
    Space sp;            /* how buffer operands are addressed right now */
    int prefetched;            /* pointwise: inputs are read from pf<o>[u], loaded before */
    int rv;                    /* reductions: elements per vector of the rows' vector path, 0 none */
    int probe;                 /* reductions: a first pass that only learns first_sweep and staged */
    int sweep;                 /* reductions: the sweep being written (0, 1, ...) */
    signed char first_sweep[FC_MAXOPS];   /* input o: the first sweep that reads it, -1 none */
    char staged[FC_MAXOPS];    /* output o: written by the final sweep (through so<o>[k]) */
} Gen;

/* the probe pass of a reduction records where operand o is read or written in
 * a row's sweeps */
static void
note_inner_use(Gen *G, int o)
{
    if (!G->probe) {
        return;
    }
    if (G->e.K->ops[o].is_out) {
        G->staged[o] = 1;
    }
    else if (G->first_sweep[o] < 0) {
        G->first_sweep[o] = (signed char)G->sweep;
    }
}

/* memory expression of operand o at the current point (FcExprTarget.mem) */
static void
mem_expr(const FcExprGen *E, int o, char *out)
{
    const Gen *G = (const Gen *)E;
    switch (G->sp) {
    case SP_VECTOR:            /* a flat kernel's vector loop: element w of the trip's vectors */
        if (fc_expr_operand_is_scalar(E, o)) {
            snprintf(out, EXPR, "%s[0]", E->opname[o]);
        }
        else {
            snprintf(out, EXPR, E->K->ops[o].is_out ? "st%d[w]" : "pf%d[w]", o);
        }
        break;
    case SP_FLAT:
        if (G->prefetched && !E->K->ops[o].is_out && !fc_expr_operand_is_scalar(E, o)) {
            snprintf(out, EXPR, "pf%d[u]", o);
        }
        else {
            snprintf(out, EXPR, fc_expr_operand_is_scalar(E, o) ? "%s[0]" : "%s[i]", E->opname[o]);
        }
        break;
    case SP_STRIDED:
        if (G->prefetched && !E->K->ops[o].is_out) {
            snprintf(out, EXPR, "pf%d[u]", o);
        }
        else {
            snprintf(out, EXPR, "%s[po[u][%d]]", E->opname[o], o);
        }
        break;
    case SP_INNER:
        snprintf(out, EXPR, "%s[ob[%d] + ib[%d]]", E->opname[o], o, o);
        note_inner_use((Gen *)G, o);
        break;
    case SP_CACHED:
        /* inputs were loaded into the row cache before the sweep (emit_fill),
         * outputs go through so<o>[k] to emit_staged_stores */
        snprintf(out, EXPR, E->K->ops[o].is_out ? "so%d[k]" : "rc%d[k]", o);
        note_inner_use((Gen *)G, o);      /* the renderer's own state, behind E */
        break;
    case SP_OUTER_POINT:
        snprintf(out, EXPR, "%s[ob[%d]]", E->opname[o], o);
        break;
    }
}

/* the block's result of reduction v, in every thread */
static void
combine_block(Gen *G, int v)
{
    int op = G->e.s->g->nodes[v].op;
    static const char *fn[] = {"fc_cu_sum", "fc_cu_prod", "fc_cu_max", "fc_cu_min"};
    if (fc_expr_has_index(G->e.s, v)) {
        LINE(G, "fc_cu_block_argreduce<%s, %s>(acc%d, idx%d, sm%d, smi%d);",
             fc_expr_ctype(&G->e, fc_expr_acc_dtype(G->e.s, v)), op == FC_OP_ARGMAX ? "true" : "false",
             v, v, v, v);
        return;
    }
    if (op == FC_OP_ANY || op == FC_OP_ALL) {
        LINE(G, "acc%d = fc_cu_block_reduce(acc%d, %s(), sm%d);", v, v,
             op == FC_OP_ANY ? "fc_cu_or" : "fc_cu_and", v);
        return;
    }
    LINE(G, "acc%d = fc_cu_block_reduce(acc%d, %s(), sm%d);", v, v, fn[op - FC_OP_SUM], v);
    if (fc_expr_has_nan_flag(G->e.s, v)) {
        LINE(G, "nan%d = fc_cu_block_reduce(nan%d, fc_cu_or(), smn%d);", v, v, v);
    }
}

/* ------------------------------------------------------------------------
 * sweeps over one row
 * ---------------------------------------------------------------------- */

/* the widest operand's element size in bytes */
static int
widest_of(const Gen *G)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    int widest = 1;
    for (int q = 0; q < K->nops; q++) {
        int size = fc_dtypes[s->slots[K->ops[q].slot].dtype].size;
        widest = size > widest ? size : widest;
    }
    return widest;
}

/* ib[q]: operand q's offset of inner position j */
static void
emit_inner_offsets(Gen *G)
{
    const FcKernelIR *K = G->e.K;
    LINE(G, "I ib[%d];", K->nops);
    if (__builtin_popcount(K->mask) == 1) {
        /* one reduced dim: the inner space never has more (and the general
         * unravelling, unrolled ROWCACHE times, cost NVRTC seconds) */
        for (int q = 0; q < K->nops; q++) {
            LINE(G, "ib[%d] = j * (I)L.istride[%d][0];", q, q);
        }
    }
    else {
        LINE(G, "fc_cu_offsets<I, %d, %d>(j, (int)L.nd_inner, L.ishape, L.istride, ib);", K->nops, G->nd);
    }
}

/* The row cache: slot k of a thread holds row element j(k). A kernel with a
 * vector path (G->rv = V elements a vector) lays the slots out as vectors:
 * V elements side by side per thread and vector, the threads' vectors side
 * by side, so a thread's slots k..k+V-1 are one aligned vector of the row. A
 * row that cannot take vector loads (fc_rv false: misaligned, a stride
 * other than 0 or 1, a length not a multiple of V) keeps that layout, one
 * element at a time. Other kernels: one element a slot, the threads side by
 * side. Opens the unrolled loop over the slots (one vector at a time with
 * `vector` set) and defines j, the element of slot k. */
static void
open_cache_loop(Gen *G, int vector)
{
    const int V = G->rv;
    LINE(G, "#pragma unroll");
    LINE(G, "for (int k = 0; k < %s; k += %d) {", ROWCACHE, vector ? V : 1);
    G->e.depth++;
    if (V) {
        LINE(G, "const I j = ((I)threadIdx.x + (I)(k / %d) * FC_CU_THREADS) * %d + (I)(k %% %d);", V, V, V);
    }
    else {
        LINE(G, "const I j = (I)threadIdx.x + (I)k * FC_CU_THREADS;");
    }
}

/* The row cache's loads of the inputs this sweep reads first: all of a
 * thread's loads out together, before any use (vector loads where the row
 * allows, else one element at a time). */
static int
fills(const Gen *G, int o, int sweep)
{
    return !G->e.K->ops[o].is_out && G->first_sweep[o] == sweep;
}

static void
emit_fill(Gen *G, int sweep)
{
    const FcKernelIR *K = G->e.K;
    int any = 0;
    for (int o = 0; o < K->nops; o++) {
        any |= fills(G, o, sweep);
    }
    if (!any) {
        return;
    }
    if (G->rv) {
        LINE(G, "if (fc_rv) {");
        G->e.depth++;
        open_cache_loop(G, 1);
        LINE(G, "if (j < (I)L.n_inner) {");
        G->e.depth++;
        for (int o = 0; o < K->nops; o++) {
            if (fills(G, o, sweep)) {
                LINE(G, "fc_cu_vload_row<%d>(rc%d + k, %s + ob[%d], j, L.istride[%d][0]);", G->rv, o,
                     G->e.opname[o], o, o);
            }
        }
        CLOSE(G);
        CLOSE(G);
        CLOSE(G);
        LINE(G, "else {");
        G->e.depth++;
    }
    open_cache_loop(G, 0);
    LINE(G, "if (j < (I)L.n_inner) {");
    G->e.depth++;
    emit_inner_offsets(G);
    for (int o = 0; o < K->nops; o++) {
        if (fills(G, o, sweep)) {
            LINE(G, "rc%d[k] = %s[ob[%d] + ib[%d]];", o, G->e.opname[o], o, o);
        }
    }
    CLOSE(G);
    CLOSE(G);
    if (G->rv) {
        CLOSE(G);
    }
}

/* The final sweep's outputs, from so<o>[k] to memory, inside the slot loop
 * after slot k's values: at once without a vector path, else once a
 * vector's last slot is done (a vector store where the row allows), so a
 * thread holds one vector of each output at a time. */
static void
emit_staged_stores(Gen *G)
{
    const FcKernelIR *K = G->e.K;
    const int V = G->rv;
    if (!V) {
        LINE(G, "if (j < (I)L.n_inner) {");
        G->e.depth++;
        emit_inner_offsets(G);
        for (int o = 0; o < K->nops; o++) {
            if (G->staged[o]) {
                LINE(G, "%s[ob[%d] + ib[%d]] = so%d[k];", G->e.opname[o], o, o, o);
            }
        }
        CLOSE(G);
        return;
    }
    LINE(G, "if (k %% %d == %d) {          /* a vector's last slot */", V, V - 1);
    G->e.depth++;
    LINE(G, "const I j0 = j - %d;", V - 1);
    LINE(G, "if (fc_rv) {");
    G->e.depth++;
    LINE(G, "if (j0 < (I)L.n_inner) {");
    G->e.depth++;
    for (int o = 0; o < K->nops; o++) {
        if (G->staged[o]) {
            LINE(G, "fc_cu_vstore<%d>(%s + ob[%d] + j0, so%d + (k - %d));", V, G->e.opname[o], o, o, V - 1);
        }
    }
    CLOSE(G);
    CLOSE(G);
    LINE(G, "else {");
    G->e.depth++;
    LINE(G, "#pragma unroll");
    LINE(G, "for (int e = 0; e < %d; e++) {", V);
    G->e.depth++;
    LINE(G, "if (j0 + e < (I)L.n_inner) {");
    G->e.depth++;
    for (int o = 0; o < K->nops; o++) {
        if (G->staged[o]) {
            LINE(G, "%s[ob[%d] + (j0 + e) * (I)L.istride[%d][0]] = so%d[k - %d + e];", G->e.opname[o], o, o,
                 o, V - 1);
        }
    }
    CLOSE(G);
    CLOSE(G);
    CLOSE(G);
    CLOSE(G);
}

/* one loop of a sweep: cached, the first ROWCACHE elements of the thread
 * (fully unrolled, inputs from the row cache, outputs through so<o>[k]),
 * else the rest of the row, straight from memory */
static int
emit_sweep_loop(Gen *G, const char *need, const int *reds, int nreds, int store, int cached)
{
    const FcSpec *s = G->e.s;
    int nn = s->g->nnodes;
    memset(G->e.loaded, 0, FC_MAXOPS);
    if (cached) {
        G->sp = SP_CACHED;
        open_cache_loop(G, 0);
        LINE(G, "if (j < (I)L.n_inner) {");
        G->e.depth++;
    }
    else {
        G->sp = SP_INNER;
        LINE(G, "#pragma unroll 4");
        LINE(G, "for (I j = (I)threadIdx.x + (I)(%s * FC_CU_THREADS); j < (I)L.n_inner; j += FC_CU_THREADS) {",
             ROWCACHE);
        G->e.depth++;
        emit_inner_offsets(G);
    }
    for (int v = 0; v < nn; v++) {
        if (need[v] && fc_expr_emit_node(&G->e, v) < 0) {
            return -1;
        }
    }
    for (int r = 0; r < nreds; r++) {
        if (fc_expr_feed(&G->e, reds[r], "(int64_t)j") < 0) {
            return -1;
        }
    }
    for (int v = 0; store && v < nn; v++) {
        if (need[v] && s->sn[v].materialize) {
            fc_expr_emit_store(&G->e, v);
        }
    }
    if (cached) {
        CLOSE(G);
        if (store) {
            emit_staged_stores(G);
        }
    }
    CLOSE(G);
    return 0;
}

/* one sweep over the row's inner space: feeds `reds`, or with store set,
 * writes the materialized full-size values */
static int
emit_sweep(Gen *G, const int *reds, int nreds, int store)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    int nn = s->g->nnodes, rc = -1;
    char *need = PyMem_Calloc(nn + 1, 1), saved[FC_MAXOPS];

    if (need == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    fc_expr_need_sweep(&G->e, reds, nreds, store, need);
    memcpy(saved, G->e.loaded, FC_MAXOPS);
    if (!G->probe) {
        emit_fill(G, G->sweep);
    }
    for (int o = 0; store && o < K->nops; o++) {
        if (G->staged[o]) {
            LINE(G, "%s so%d[%s];", fc_expr_storetype(s->slots[K->ops[o].slot].dtype), o, ROWCACHE);
        }
    }
    if (emit_sweep_loop(G, need, reds, nreds, store, 1) < 0) {
        goto cleanup;
    }
    if (emit_sweep_loop(G, need, reds, nreds, store, 0) < 0) {
        goto cleanup;
    }
    rc = 0;
cleanup:
    G->sweep++;
    G->sp = SP_OUTER_POINT;
    memcpy(G->e.loaded, saved, FC_MAXOPS);
    PyMem_Free(need);
    return rc;
}

/* ------------------------------------------------------------------------
 * kernel bodies
 * ---------------------------------------------------------------------- */

/* Elements a thread takes per trip of the grid-stride loop: its loads go out
 * together, so enough bytes are in flight to cover the memory's latency (one
 * 4-byte element per thread at a time gave 63% of the copy bandwidth on an
 * H200, 2-byte elements 33%): 4, or 8 where no operand is wider than 2 bytes. */
static int
unroll_of(const Gen *G)
{
    return widest_of(G) <= 2 ? 8 : 4;
}

/* operand q is read through the prefetch arrays (an input, not a flat scalar) */
static int
prefetches(const Gen *G, int q)
{
    const FcKernelIR *K = G->e.K;
    return !K->ops[q].is_out && !(K->flat && fc_expr_operand_is_scalar(&G->e, q));
}

/* a pointwise kernel's nodes at the current point of its loop (the caller
 * sets how operands are addressed: G->sp and the mode flags) */
static int
emit_kernel_nodes(Gen *G)
{
    const FcKernelIR *K = G->e.K;
    memset(G->e.loaded, 0, FC_MAXOPS);
    for (int m = 0; m < K->nnodes; m++) {
        if (fc_expr_emit_node(&G->e, K->nodes[m]) < 0) {
            return -1;
        }
    }
    return 0;
}

/* and the stores of its materialized nodes */
static void
emit_kernel_stores(Gen *G)
{
    const FcKernelIR *K = G->e.K;
    for (int m = 0; m < K->nnodes; m++) {
        if (G->e.s->sn[K->nodes[m]].materialize) {
            fc_expr_emit_store(&G->e, K->nodes[m]);
        }
    }
}

/* fc_cuda_kernel.h's FC_CU_VEC_UNROLL (the runtime sizes grids by it) */
#define CU_VEC_UNROLL 2

/* The flat kernels' vector loop, where every array operand is aligned to its
 * vector's size (checked at run time): a trip loads FC_CU_VEC_UNROLL vectors
 * (fc_cuda_kernel.h) of each input (pf<o>), 16 bytes of the widest operand
 * (the narrower ones: as many elements, fewer bytes), computes their elements
 * (w) into st<o> and stores those as vectors; the last n_outer % V elements
 * are left to the scalar loop (fc_start). A flat kernel never has a scalar
 * output. */
static int
emit_vector_loop(Gen *G)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    const int V = 16 / widest_of(G);
    char cond[FC_MAXOPS * 48 + 8] = "", *p = cond;

    for (int q = 0; q < K->nops; q++) {
        if (!fc_expr_operand_is_scalar(&G->e, q)) {
            p += sprintf(p, "%sfc_cu_aligned<%d>(%s)", p == cond ? "" : " && ", V, G->e.opname[q]);
        }
    }
    LINE(G, "I fc_start = 0;           /* the scalar loop's first element */");
    LINE(G, "if (%s) {", cond);
    G->e.depth++;
    LINE(G, "const I nv = (I)L.n_outer / %d;", V);
    LINE(G, "fc_start = nv * %d;", V);
    LINE(G, "#pragma unroll 1");
    LINE(G, "for (I v0 = (I)blockIdx.x * (FC_CU_THREADS * FC_CU_VEC_UNROLL) + (I)threadIdx.x; v0 < nv;");
    LINE(G, "     v0 += (I)gridDim.x * (FC_CU_THREADS * FC_CU_VEC_UNROLL)) {");
    G->e.depth++;
    for (int q = 0; q < K->nops; q++) {
        if (!fc_expr_operand_is_scalar(&G->e, q)) {
            LINE(G, "%s %s%d[FC_CU_VEC_UNROLL * %d];", fc_expr_storetype(s->slots[K->ops[q].slot].dtype),
                 K->ops[q].is_out ? "st" : "pf", q, V);
        }
    }
    LINE(G, "#pragma unroll");
    LINE(G, "for (int u = 0; u < FC_CU_VEC_UNROLL; u++) {");
    G->e.depth++;
    LINE(G, "const I vu = v0 + (I)u * FC_CU_THREADS;");
    LINE(G, "const I vi = vu < nv ? vu : nv - 1;");
    for (int q = 0; q < K->nops; q++) {
        if (prefetches(G, q)) {
            LINE(G, "fc_cu_vload<%d>(pf%d + u * %d, %s + vi * %d);", V, q, V, G->e.opname[q], V);
        }
    }
    CLOSE(G);
    LINE(G, "#pragma unroll");
    LINE(G, "for (int w = 0; w < FC_CU_VEC_UNROLL * %d; w++) {", V);
    G->e.depth++;
    LINE(G, "const I i = (v0 + (I)(w / %d) * FC_CU_THREADS) * %d + (I)(w %% %d);", V, V, V);
    G->sp = SP_VECTOR;
    if (emit_kernel_nodes(G) < 0) {
        return -1;
    }
    emit_kernel_stores(G);
    CLOSE(G);
    LINE(G, "#pragma unroll");
    LINE(G, "for (int u = 0; u < FC_CU_VEC_UNROLL; u++) {");
    G->e.depth++;
    LINE(G, "const I vu = v0 + (I)u * FC_CU_THREADS;");
    LINE(G, "if (vu < nv) {");
    G->e.depth++;
    for (int q = 0; q < K->nops; q++) {
        if (K->ops[q].is_out) {
            LINE(G, "fc_cu_vstore<%d>(%s + vu * %d, st%d + u * %d);", V, G->e.opname[q], V, q, V);
        }
    }
    CLOSE(G);
    CLOSE(G);
    CLOSE(G);
    CLOSE(G);
    return 0;
}

/* a flat kernel gets the vector loop unless an output is a scalar */
static int
has_vector_loop(const Gen *G)
{
    const FcKernelIR *K = G->e.K;
    if (!K->flat) {
        return 0;
    }
    for (int q = 0; q < K->nops; q++) {
        if (K->ops[q].is_out && fc_expr_operand_is_scalar(&G->e, q)) {
            return 0;
        }
    }
    return 1;
}

/* A trip of the grid-stride loop takes unroll_of elements a thread: first
 * every input element of the trip is loaded (pf<o>[u]), then each element is
 * computed and stored. Loads before stores in the program's own order: the
 * compiler need not prove that a store leaves the next loads alone (it does
 * not take __restrict__ on the kernel's local pointers), so the trip's loads
 * are in flight together. Flat kernels run their vector loop first and this
 * loop over what it leaves (all of it where an operand is misaligned). */
static int
emit_pointwise(Gen *G)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    const int unroll = unroll_of(G), vec = has_vector_loop(G);
    LINE(G, "int fc_err = 0;");
    fc_expr_emit_operand_decls(&G->e);
    if (vec && emit_vector_loop(G) < 0) {
        return -1;
    }
    LINE(G, "#pragma unroll 1");
    LINE(G, "for (I i0 = %s(I)blockIdx.x * (FC_CU_THREADS * %d) + (I)threadIdx.x; i0 < (I)L.n_outer;",
         vec ? "fc_start + " : "", unroll);
    LINE(G, "     i0 += (I)gridDim.x * (FC_CU_THREADS * %d)) {", unroll);
    G->e.depth++;
    for (int q = 0; q < K->nops; q++) {
        if (prefetches(G, q)) {
            LINE(G, "%s pf%d[%d];", fc_expr_storetype(s->slots[K->ops[q].slot].dtype), q, unroll);
        }
    }
    if (!K->flat) {
        LINE(G, "I po[%d][%d];", unroll, K->nops);
    }
    /* past the end, a lane loads the last element again and stores nothing */
    LINE(G, "#pragma unroll");
    LINE(G, "for (int u = 0; u < %d; u++) {", unroll);
    G->e.depth++;
    LINE(G, "const I iu = i0 + (I)u * FC_CU_THREADS;");
    LINE(G, "const I i = iu < (I)L.n_outer ? iu : (I)L.n_outer - 1;");
    if (!K->flat) {
        LINE(G, "fc_cu_offsets<I, %d, %d>(i, (int)L.nd_outer, L.oshape, L.ostride, po[u]);", K->nops, G->nd);
    }
    for (int q = 0; q < K->nops; q++) {
        if (prefetches(G, q)) {
            if (K->flat) {
                LINE(G, "pf%d[u] = %s[i];", q, G->e.opname[q]);
            }
            else {
                LINE(G, "pf%d[u] = %s[po[u][%d]];", q, G->e.opname[q], q);
            }
        }
    }
    CLOSE(G);
    LINE(G, "#pragma unroll");
    LINE(G, "for (int u = 0; u < %d; u++) {", unroll);
    G->e.depth++;
    LINE(G, "const I i = i0 + (I)u * FC_CU_THREADS;");
    G->sp = K->flat ? SP_FLAT : SP_STRIDED;
    G->prefetched = 1;
    if (emit_kernel_nodes(G) < 0) {
        G->prefetched = 0;
        return -1;
    }
    G->prefetched = 0;
    LINE(G, "if (i < (I)L.n_outer) {");
    G->e.depth++;
    emit_kernel_stores(G);
    CLOSE(G);
    CLOSE(G);
    CLOSE(G);
    LINE(G, "fc_cu_report(L.err, fc_err);");
    return 0;
}

/* fc_rv: this row takes the vector path (every operand its sweeps read or
 * write has inner stride 1 and an aligned row start, or is an input of
 * stride 0; the row length a multiple of V) */
static void
emit_row_vector_check(Gen *G)
{
    const FcKernelIR *K = G->e.K;
    LINE(G, "bool fc_rv = (I)L.n_inner %% %d == 0;", G->rv);
    for (int o = 0; o < K->nops; o++) {
        int in = !K->ops[o].is_out && G->first_sweep[o] >= 0;
        if (in || (K->ops[o].is_out && G->staged[o])) {
            LINE(G, "fc_rv = fc_rv && fc_cu_row_vec<%d>(%s + ob[%d], L.istride[%d][0], %s);", G->rv,
                 G->e.opname[o], o, o, in ? "true" : "false");
        }
    }
}

static int
reduction_body(Gen *G)
{
    const FcSpec *s = G->e.s;
    const FcKernelIR *K = G->e.K;
    int reds[FC_MAX_KERNEL_REDS];

    /* shared scratch of the block reductions, one set per reduction */
    for (int m = 0; m < K->nnodes; m++) {
        int v = K->nodes[m];
        if (!fc_expr_is_red(s, v)) {
            continue;
        }
        LINE(G, "__shared__ %s sm%d[32];", fc_expr_ctype(&G->e, fc_expr_acc_dtype(s, v)), v);
        if (fc_expr_has_nan_flag(s, v)) {
            LINE(G, "__shared__ int smn%d[32];", v);
        }
        if (fc_expr_has_index(s, v)) {
            LINE(G, "__shared__ int64_t smi%d[32];", v);
        }
    }
    if (G->rv) {
        LINE(G, "static_assert(FC_CU_ROWCACHE %% %d == 0, \"FC_CU_ROWCACHE: whole vectors of %d\");", G->rv, G->rv);
    }
    LINE(G, "int fc_err = 0;");
    fc_expr_emit_operand_decls(&G->e);
    LINE(G, "#pragma unroll 1");
    LINE(G, "for (I o = blockIdx.x; o < (I)L.n_outer; o += gridDim.x) {");
    G->e.depth++;
    LINE(G, "I ob[%d];", K->nops);
    LINE(G, "fc_cu_offsets<I, %d, %d>(o, (int)L.nd_outer, L.oshape, L.ostride, ob);", K->nops, G->nd);
    if (G->rv) {
        emit_row_vector_check(G);
    }
    for (int q = 0; q < K->nops; q++) {      /* the row cache (registers: unused ones vanish) */
        if (!K->ops[q].is_out) {
            LINE(G, "%s rc%d[%s];", fc_expr_storetype(s->slots[K->ops[q].slot].dtype), q, ROWCACHE);
        }
    }
    G->sp = SP_OUTER_POINT;
    G->sweep = 0;
    memset(G->e.loaded, 0, FC_MAXOPS);
    for (int level = 0; level <= K->nphases; level++) {
        if (level > 0) {
            int nreds = fc_expr_begin_level(&G->e, level, reds);
            if (emit_sweep(G, reds, nreds, 0) < 0) {
                return -1;
            }
            for (int r = 0; r < nreds; r++) {
                combine_block(G, reds[r]);
                fc_expr_emit_red_result(&G->e, reds[r]);
            }
        }
        if (fc_expr_emit_outer_nodes(&G->e, level) < 0) {
            return -1;
        }
    }
    if (fc_expr_has_materialized(&G->e, FC_VK_FULL)) {
        LINE(G, "/* final sweep: write full-size results */");
        if (emit_sweep(G, NULL, 0, 1) < 0) {
            return -1;
        }
    }
    if (fc_expr_has_materialized(&G->e, FC_VK_OUTER)) {
        LINE(G, "if (threadIdx.x == 0) {");
        G->e.depth++;
        fc_expr_emit_outer_stores(&G->e);
        CLOSE(G);
    }
    CLOSE(G);
    LINE(G, "fc_cu_report(L.err, fc_err);");
    return 0;
}

/* Blocks of 256 threads per SM a reduction kernel asks ptxas for
 * (FC_CU_RED_BLOCKS_OR): 4, at most 64 registers a thread, where the row
 * cache holds 16 words (one input of up to 4 bytes: softmax, layernorm; an
 * H100 measured that best, 94-103% of the copy bandwidth, where 2 blocks gave
 * 28-35% in bfloat16); 2 (128 registers) up to 48 words, as layernorm with a
 * weight and a bias; 1 past that, 8-byte operands counting double and 32
 * words more. At 64 registers those spilled 150-1000 bytes a thread (ptxas
 * -v); the 2- and 1-block choices are not measured on a device yet. */
static int
red_blocks(const Gen *G)
{
    const FcKernelIR *K = G->e.K;
    int words = widest_of(G) == 8 ? 32 : 0;
    for (int o = 0; o < K->nops; o++) {
        if (!K->ops[o].is_out && G->first_sweep[o] >= 0) {
            words += 16 * (fc_dtypes[G->e.s->slots[K->ops[o].slot].dtype].size == 8 ? 2 : 1);
        }
    }
    return words <= 16 ? 4 : words <= 48 ? 2 : 1;
}

/* A reduction kernel is written twice: a probe pass into scratch text learns
 * which sweep first reads each input and which outputs the final sweep
 * writes (the row cache is filled, and fc_rv checks the operands, before the
 * sweeps that use them), then the real pass. Rows of one reduced dim get the
 * vector path (G->rv elements a vector: 16 bytes of the widest operand). */
static int
emit_reduction(Gen *G)
{
    FcStr scratch = {0};
    FcStr *text = G->e.b;
    int depth = G->e.depth, rc, V = 16 / widest_of(G);

    G->rv = __builtin_popcount(G->e.K->mask) == 1 && V > 1 ? V : 0;
    memset(G->first_sweep, -1, sizeof(G->first_sweep));
    memset(G->staged, 0, sizeof(G->staged));
    G->probe = 1;
    G->e.b = &scratch;
    rc = reduction_body(G);
    G->e.b = text;
    G->e.depth = depth;
    G->probe = 0;
    fc_str_free(&scratch);
    return rc < 0 ? -1 : reduction_body(G);
}

int
fc_gen_cuda_needs_nonempty(const FcSpec *s, int k)
{
    return fc_expr_needs_nonempty(s, &s->kernels[k]);
}

static const FcExprTarget cuda_target = {
    .who = "gen_cuda",
    .bool_type = "bool",
    .bool_load = "(%s != 0)",
    .launch = "L.",
    .restrict_kw = "__restrict__",
    .mem = mem_expr,
};

int
fc_gen_cuda_per_thread(const FcSpec *s, int k)
{
    Gen G;
    FcStr none = {0};
    char loaded[FC_MAXOPS];
    memset(&G, 0, sizeof(G));
    fc_expr_init(&G.e, &cuda_target, s, k, &none, loaded);
    if (G.e.K->mask) {
        return 0;
    }
    return has_vector_loop(&G) ? CU_VEC_UNROLL * (16 / widest_of(&G)) : unroll_of(&G);
}

char *
fc_gen_cuda(const FcSpec *s, int k, const char *name, const char *header_comment)
{
    FcStr b = {0};
    Gen G;
    char loaded[FC_MAXOPS];
    int rc;

    memset(&G, 0, sizeof(G));
    fc_expr_init(&G.e, &cuda_target, s, k, &b, loaded);
    G.nd = G.e.K->nd > 0 ? G.e.K->nd : 1;
    fc_str_printf(&b, "/* %s */\n#include \"fc_cuda_kernel.h\"\n\n",
                  header_comment ? header_comment : "fastcompile kernel");
    LINE(&G, "typedef fc_cu_launch<%d, %d> %s_launch;", G.e.K->nops, G.nd, name);
    fc_str_puts(&b, "\n");
    LINE(&G, "template <typename I>");
    LINE(&G, "static __device__ __forceinline__ void");
    LINE(&G, "%s_body(const %s_launch &L)", name, name);
    LINE(&G, "{");
    G.e.depth++;
    rc = G.e.K->mask ? emit_reduction(&G) : emit_pointwise(&G);
    CLOSE(&G);
    /* the runtime compiles one of them (-DFC_CU_INDEX=32, or 64 when a launch needs it) */
    for (int w = 32; rc == 0 && w <= 64; w += 32) {
        fc_str_puts(&b, "\n");
        LINE(&G, "#if !defined(FC_CU_INDEX) || FC_CU_INDEX == %d", w);
        if (G.e.K->mask) {
            LINE(&G, "extern \"C\" __global__ void __launch_bounds__(FC_CU_THREADS, FC_CU_RED_BLOCKS_OR(%d))",
                 red_blocks(&G));
        }
        else {
            LINE(&G, "extern \"C\" __global__ void __launch_bounds__(FC_CU_THREADS)");
        }
        LINE(&G, "%s_i%d(const %s_launch L)", name, w, name);
        LINE(&G, "{");
        LINE(&G, "    %s_body<int%d_t>(L);", name, w);
        LINE(&G, "}");
        LINE(&G, "#endif");
    }
    if (rc < 0) {
        fc_str_free(&b);
        return NULL;
    }
    return fc_str_take(&b);
}
