/* Fusion: partition a typed, shaped segment into kernels.
 * In: FcSpec after fc_shape_infer. Out: FcKernelIR list (nodes, operands,
 * buffers to materialize, execution order).
 *
 * A kernel iterates a space F and reduces the positions in `mask` (0 for a
 * pointwise kernel). Its values are FULL (one per point of F) or OUTER (one
 * per point of F outside the mask: reduction results and pointwise work on
 * them). Reductions that read FULL values computed from earlier reductions
 * of the same kernel run in later phases, so softmax and layernorm are one
 * kernel each: one sweep per reduction level, plus a final sweep that writes
 * FULL outputs. A value read in an index pattern its kernel cannot produce
 * is materialized and read by another kernel. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <string.h>

#include "spec.h"

#define FC_MAX_KERNEL_NODES 96
#define FC_HORIZONTAL_WINDOW 4     /* how many recent kernels a node may join sideways */

/* ------------------------------------------------------------------------
 * shapes as class tuples
 * ---------------------------------------------------------------------- */

/* equal up to leading size-1 dims */
static int
same_shape(const int *a, int na, const int *b, int nb)
{
    while (na > 0 && a[0] == 0) {
        a++, na--;
    }
    while (nb > 0 && b[0] == 0) {
        b++, nb--;
    }
    if (na != nb) {
        return 0;
    }
    for (int i = 0; i < na; i++) {
        if (a[i] != b[i]) {
            return 0;
        }
    }
    return 1;
}

static int
all_ones(const int *a, int na)
{
    for (int i = 0; i < na; i++) {
        if (a[i] != 0) {
            return 0;
        }
    }
    return 1;
}

/* F with reduced positions set to 1 (keep) or dropped (nokeep) */
static int
outer_shape(const FcKernelIR *K, int keep, int *out)
{
    int r = 0;
    for (int d = 0; d < K->nd; d++) {
        if (K->mask & (1u << d)) {
            if (keep) {
                out[r++] = 0;
            }
        }
        else {
            out[r++] = K->F[d];
        }
    }
    return r;
}

static int
matches_outer(const FcKernelIR *K, const int *dims, int nd, int keep)
{
    int o[FC_MAXDIM];
    int no = outer_shape(K, keep, o);
    return same_shape(dims, nd, o, no);
}

/* ------------------------------------------------------------------------
 * kernels and their dependencies
 * ---------------------------------------------------------------------- */

static int
grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap) {
        return 0;
    }
    int ncap = *cap ? *cap : 8;
    while (ncap < need) {
        ncap *= 2;
    }
    void *q = PyMem_Realloc(*p, ncap * elem);
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = ncap;
    return 0;
}

static int
new_kernel(FcSpec *s, const int *F, int nd, uint32_t mask)
{
    FcKernelIR *K;
    if (grow((void **)&s->kernels, &s->capkernels, s->nkernels + 1, sizeof(FcKernelIR)) < 0) {
        return -1;
    }
    K = &s->kernels[s->nkernels];
    memset(K, 0, sizeof(*K));
    K->nd = nd;
    memcpy(K->F, F, nd * sizeof(int));
    K->mask = mask;
    return s->nkernels++;
}

static int
kernel_add_node(FcSpec *s, int k, int node)
{
    FcKernelIR *K = &s->kernels[k];
    if (grow((void **)&K->nodes, &K->capnodes, K->nnodes + 1, sizeof(int)) < 0) {
        return -1;
    }
    K->nodes[K->nnodes++] = node;
    s->sn[node].kernel = k;
    return 0;
}

static int
kernel_add_dep(FcSpec *s, int k, int dep)
{
    FcKernelIR *K = &s->kernels[k];
    for (int i = 0; i < K->ndeps; i++) {
        if (K->deps[i] == dep) {
            return 0;
        }
    }
    if (grow((void **)&K->deps, &K->capdeps, K->ndeps + 1, sizeof(int)) < 0) {
        return -1;
    }
    K->deps[K->ndeps++] = dep;
    return 0;
}

/* does kernel `from` depend on kernel `to`, directly or not? */
static int
reaches(const FcSpec *s, int from, int to, int depth)
{
    const FcKernelIR *K = &s->kernels[from];
    if (from == to) {
        return 1;
    }
    if (depth > s->nkernels) {
        return 1;   /* cannot happen in a DAG; be conservative */
    }
    for (int i = 0; i < K->ndeps; i++) {
        if (reaches(s, K->deps[i], to, depth + 1)) {
            return 1;
        }
    }
    return 0;
}

/* a value computed in the segment (not a buffer, not a constant) */
static int
computed(const FcSpec *s, int v)
{
    return s->sn[v].in_seg && s->g->nodes[v].op != FC_OP_CONST;
}

/* may a consumer of kind `ck` (keep form `ckeep`) in kernel k read value v? */
static int
readable(const FcSpec *s, int k, int v, FcValKind ck, int ckeep)
{
    const FcSNode *vs = &s->sn[v];
    const FcKernelIR *K = &s->kernels[k];
    if (!computed(s, v) || vs->kernel != k) {
        return 1;   /* buffers are read through strides in any pattern */
    }
    if (vs->kind == FC_VK_FULL) {
        return ck == FC_VK_FULL;
    }
    if (all_ones(vs->dims, vs->ndim)) {
        return 1;
    }
    if (ck == FC_VK_FULL || ckeep) {
        return matches_outer(K, vs->dims, vs->ndim, 1);
    }
    return matches_outer(K, vs->dims, vs->ndim, 0);
}

/* adds buffer u to bufs (capacity FC_MAXOPS + 4) unless there; -1 past
 * FC_MAXOPS + 2 buffers (more than any kernel may take) */
static int
note_buf(int *bufs, int *nb, int u)
{
    for (int b = 0; b < *nb; b++) {
        if (bufs[b] == u) {
            return 0;
        }
    }
    if (*nb == FC_MAXOPS + 2) {
        return -1;
    }
    bufs[(*nb)++] = u;
    return 0;
}

/* at most how many operands kernel k has with node i in it: every node may
 * become an output, and every distinct buffer it reads is an input */
static int
operand_bound(const FcSpec *s, int k, int i)
{
    const FcKernelIR *K = &s->kernels[k];
    int bufs[FC_MAXOPS + 4], nb = 0;
    for (int m = 0; m <= K->nnodes; m++) {
        int v = m < K->nnodes ? K->nodes[m] : i;
        const FcNode *n = &s->g->nodes[v];
        for (int j = 0; j < n->nin; j++) {
            int u = n->in[j];
            if (s->g->nodes[u].op == FC_OP_CONST || (computed(s, u) && s->sn[u].kernel == k)) {
                continue;
            }
            if (note_buf(bufs, &nb, u) < 0) {
                return FC_MAXOPS + 1;
            }
        }
    }
    return K->nnodes + 1 + nb;
}

/* may node i join kernel k as kind ck? Also checks that its inputs from other
 * kernels do not themselves depend on k (that would be a cycle). */
static int
can_join(FcSpec *s, int k, int i, FcValKind ck, int ckeep)
{
    const FcNode *n = &s->g->nodes[i];
    if (s->kernels[k].nnodes >= FC_MAX_KERNEL_NODES || operand_bound(s, k, i) > FC_MAXOPS) {
        return 0;
    }
    for (int j = 0; j < n->nin; j++) {
        int v = n->in[j];
        if (!computed(s, v)) {
            continue;
        }
        if (s->sn[v].kernel == k) {
            if (!readable(s, k, v, ck, ckeep)) {
                return 0;
            }
        }
        else if (reaches(s, s->sn[v].kernel, k, 0)) {
            return 0;
        }
    }
    return 1;
}

static int
join(FcSpec *s, int k, int i, FcValKind kind, int keep)
{
    const FcNode *n = &s->g->nodes[i];
    s->sn[i].kind = kind;
    s->sn[i].keepform = keep;
    if (kernel_add_node(s, k, i) < 0) {
        return -1;
    }
    for (int j = 0; j < n->nin; j++) {
        int v = n->in[j];
        if (computed(s, v) && s->sn[v].kernel != k) {
            if (kernel_add_dep(s, k, s->sn[v].kernel) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* candidate kernels for node i: its producers' kernels, newest first */
static int
candidates(const FcSpec *s, int i, int *out)
{
    const FcNode *n = &s->g->nodes[i];
    int nc = 0;
    for (int j = 0; j < n->nin; j++) {
        int v = n->in[j], k, dup = 0;
        if (!computed(s, v)) {
            continue;
        }
        k = s->sn[v].kernel;
        for (int c = 0; c < nc; c++) {
            dup |= out[c] == k;
        }
        if (!dup) {
            out[nc++] = k;
        }
    }
    for (int a = 1; a < nc; a++) {   /* newest first */
        for (int b = a; b > 0 && out[b] > out[b - 1]; b--) {
            int t = out[b];
            out[b] = out[b - 1];
            out[b - 1] = t;
        }
    }
    return nc;
}

static int
place_reduction(FcSpec *s, int i)
{
    const FcNode *n = &s->g->nodes[i];
    const FcSNode *src = &s->sn[n->in[0]];
    FcSNode *sn = &s->sn[i];
    int cand[4] = {-1, -1, -1, -1}, nc = 0, k;
    int keep = n->keepdim;

    if (computed(s, n->in[0])) {
        cand[nc++] = src->kernel;
    }
    /* horizontal: a recent kernel over the same space */
    for (int k2 = s->nkernels - 1; k2 >= 0 && k2 >= s->nkernels - FC_HORIZONTAL_WINDOW; k2--) {
        const FcKernelIR *K2 = &s->kernels[k2];
        if ((nc == 0 || cand[0] != k2) && (K2->mask == 0 || K2->mask == sn->axes) &&
                same_shape(src->dims, src->ndim, K2->F, K2->nd) && K2->nd == src->ndim) {
            cand[nc++] = k2;
            break;
        }
    }
    for (int c = 0; c < nc; c++) {
        FcKernelIR *K = &s->kernels[cand[c]];
        int exact = K->nd == src->ndim, nred = 0;
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            nred += fc_ops[s->g->nodes[v].op].kind == FC_KIND_RED && s->sn[v].axes != 0;
        }
        if (nred >= FC_MAX_KERNEL_REDS) {
            continue;
        }
        for (int d = 0; exact && d < K->nd; d++) {
            exact = K->F[d] == src->dims[d];
        }
        if (!exact || (K->mask != 0 && K->mask != sn->axes)) {
            continue;
        }
        if (computed(s, n->in[0]) && src->kernel == cand[c] && src->kind != FC_VK_FULL) {
            continue;
        }
        if (K->mask == 0) {
            /* a pointwise kernel becomes this reduction's prologue; its values stay FULL */
            if (!can_join(s, cand[c], i, FC_VK_FULL, 1)) {
                continue;
            }
            K->mask = sn->axes;
        }
        else if (!can_join(s, cand[c], i, FC_VK_FULL, 1)) {
            continue;
        }
        keep = keep || matches_outer(K, sn->dims, sn->ndim, 1);
        return join(s, cand[c], i, FC_VK_OUTER, keep);
    }
    if ((k = new_kernel(s, src->dims, src->ndim, sn->axes)) < 0) {
        return -1;
    }
    keep = keep || matches_outer(&s->kernels[k], sn->dims, sn->ndim, 1);
    return join(s, k, i, FC_VK_OUTER, keep);
}

static int
place_pointwise(FcSpec *s, int i)
{
    FcSNode *sn = &s->sn[i];
    int cand[4] = {-1, -1, -1, -1}, nc = candidates(s, i, cand), k;

    /* horizontal: a recent kernel over the same space (two results of the
     * same inputs then share one pass over them) */
    for (int k2 = s->nkernels - 1; k2 >= 0 && k2 >= s->nkernels - FC_HORIZONTAL_WINDOW; k2--) {
        int dup = 0;
        for (int c = 0; c < nc; c++) {
            dup |= cand[c] == k2;
        }
        if (!dup && same_shape(sn->dims, sn->ndim, s->kernels[k2].F, s->kernels[k2].nd)) {
            cand[nc++] = k2;
            break;
        }
    }

    for (int c = 0; c < nc; c++) {
        const FcKernelIR *K = &s->kernels[cand[c]];
        if (same_shape(sn->dims, sn->ndim, K->F, K->nd)) {
            if (can_join(s, cand[c], i, FC_VK_FULL, 1)) {
                return join(s, cand[c], i, FC_VK_FULL, 1);
            }
            continue;
        }
        if (K->mask == 0) {
            continue;
        }
        for (int keep = 1; keep >= 0; keep--) {
            if (matches_outer(K, sn->dims, sn->ndim, keep) &&
                    can_join(s, cand[c], i, FC_VK_OUTER, keep)) {
                return join(s, cand[c], i, FC_VK_OUTER, keep);
            }
        }
    }
    if ((k = new_kernel(s, sn->dims, sn->ndim, 0)) < 0) {
        return -1;
    }
    return join(s, k, i, FC_VK_FULL, 1);
}

/* ------------------------------------------------------------------------
 * sinking: cheap broadcast operands computed where they are read
 * ---------------------------------------------------------------------- */

/* ops cheap enough to compute again at every point of a reader's space */
static int
cheap_op(int op)
{
    return op == FC_OP_CAST || op == FC_OP_NEG || op == FC_OP_ADD || op == FC_OP_SUB || op == FC_OP_MUL;
}

/* insert node v into kernel k's members, keeping them in node order */
static int
kernel_insert_node(FcSpec *s, int k, int v)
{
    FcKernelIR *K = &s->kernels[k];
    int p = K->nnodes;
    if (grow((void **)&K->nodes, &K->capnodes, K->nnodes + 1, sizeof(int)) < 0) {
        return -1;
    }
    while (p > 0 && K->nodes[p - 1] > v) {
        p--;
    }
    memmove(K->nodes + p + 1, K->nodes + p, (size_t)(K->nnodes - p) * sizeof(int));
    K->nodes[p] = v;
    K->nnodes++;
    s->sn[v].kernel = k;
    return 0;
}

/* Drops the kernels left without nodes, renumbering the others and their
 * dependencies (a kernel emptied by sink_kernels was read only by the
 * kernels its nodes moved to: their dependency on it goes too; a kernel
 * that kept nodes keeps its readers' dependencies, needed or not, which
 * only constrains the order). */
static int
drop_empty_kernels(FcSpec *s)
{
    int *remap = PyMem_Malloc((s->nkernels + 1) * sizeof(int));   /* owned here */
    int n = 0;
    if (remap == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int k = 0; k < s->nkernels; k++) {
        remap[k] = s->kernels[k].nnodes > 0 ? n++ : -1;
    }
    for (int k = 0; k < s->nkernels; k++) {
        FcKernelIR *K = &s->kernels[k];
        if (remap[k] < 0) {
            PyMem_Free(K->nodes);
            PyMem_Free(K->deps);
            continue;
        }
        int nd = 0;
        for (int d = 0; d < K->ndeps; d++) {
            if (remap[K->deps[d]] >= 0) {
                K->deps[nd++] = remap[K->deps[d]];
            }
        }
        K->ndeps = nd;
        if (remap[k] != k) {
            s->kernels[remap[k]] = *K;
        }
    }
    for (int i = 0; i < s->g->nnodes; i++) {
        if (s->sn[i].kernel >= 0) {
            s->sn[i].kernel = remap[s->sn[i].kernel];
        }
    }
    if (n < s->nkernels) {     /* the slots past n hold moved or freed arrays: none of them */
        memset(&s->kernels[n], 0, (size_t)(s->nkernels - n) * sizeof(FcKernelIR));
    }
    s->nkernels = n;
    PyMem_Free(remap);
    return 0;
}

/* operand bound of kernel kd with the nodes v of `tgt` == kd added (as
 * operand_bound: every node may be an output, every distinct buffer an input) */
static int
group_bound(const FcSpec *s, int kd, const int *tgt)
{
    const FcGraph *g = s->g;
    const FcKernelIR *K = &s->kernels[kd];
    int bufs[FC_MAXOPS + 4], nb = 0, nn = K->nnodes;
    for (int v = 0; v < g->nnodes; v++) {
        int member = (computed(s, v) && s->sn[v].kernel == kd) || tgt[v] == kd;
        if (!member) {
            continue;
        }
        nn += tgt[v] == kd;
        for (int j = 0; j < g->nodes[v].nin; j++) {
            int u = g->nodes[v].in[j];
            if (g->nodes[u].op == FC_OP_CONST || (computed(s, u) && s->sn[u].kernel == kd) || tgt[u] == kd) {
                continue;
            }
            if (note_buf(bufs, &nb, u) < 0) {
                return FC_MAXOPS + 1;
            }
        }
    }
    return nn > FC_MAX_KERNEL_NODES ? FC_MAXOPS + 1 : nn + nb;
}

/* A pointwise kernel's cheap values (cast, neg, add, sub, mul) that only
 * the FULL values of one other kernel read, directly or through each other
 * within their kernel, and that read only buffers or each other, move into
 * that kernel (a chain through a third kernel stays where it is): it
 * computes them at every point of its space from the same buffers
 * (broadcast), instead of a launch of their own writing a buffer it reads
 * back. They are the small operands a larger kernel reads broadcast
 * (GroupNorm's weight and bias viewed (1, G, C/G, 1), its per-channel scale
 * and shift (N, C, 1, 1): extern results the core casts to their own dtype,
 * since it learns theirs only at run time), which the placement above,
 * walking producers before readers, put in kernels of their own shape. A
 * segment output never moves (it is written once, at its own shape), nor
 * does anything costlier than those five ops (never computed twice). A
 * kernel left empty is dropped. */
static int
sink_kernels(FcSpec *s)
{
    const FcGraph *g = s->g;
    int n = g->nnodes, moved = 0, rc = -1;
    int *tgt = PyMem_Malloc((n + 1) * sizeof(int));     /* owned here: node -> kernel it moves to, or -1 */
    char *out = PyMem_Calloc(n + 1, 1);                 /* owned here: segment outputs */
    if (tgt == NULL || out == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (int o = 0; o < s->noutputs; o++) {
        out[s->outputs[o]] = 1;
    }
    /* candidates: cheap, not an output, in a pointwise kernel; the target is
     * the kernel of the first reader outside it (checked below) */
    for (int v = 0; v < n; v++) {
        tgt[v] = -1;
    }
    for (int i = 0; i < n; i++) {
        if (!computed(s, i)) {
            continue;
        }
        for (int j = 0; j < g->nodes[i].nin; j++) {
            int v = g->nodes[i].in[j], kv;
            if (!computed(s, v) || out[v] || !cheap_op(g->nodes[v].op)) {
                continue;
            }
            kv = s->sn[v].kernel;
            if (s->kernels[kv].mask == 0 && s->sn[i].kernel != kv && tgt[v] == -1) {
                tgt[v] = s->sn[i].kernel;
            }
        }
    }
    /* values read inside their kernel take a moving reader's target: from
     * the last node back, so a reader's target is known before its inputs' */
    for (int i = n - 1; i >= 0; i--) {
        if (!computed(s, i) || tgt[i] < 0) {
            continue;
        }
        for (int j = 0; j < g->nodes[i].nin; j++) {
            int v = g->nodes[i].in[j];
            if (computed(s, v) && !out[v] && cheap_op(g->nodes[v].op) && tgt[v] == -1 &&
                    s->sn[v].kernel == s->sn[i].kernel) {
                tgt[v] = tgt[i];
            }
        }
    }
    /* to a fixed point: every reader of a moving node is a FULL value of the
     * target or moves there too; every computed input moves there too */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = n - 1; i >= 0; i--) {     /* readers first: a chain read by an OUTER value unwinds in one pass */
            if (!computed(s, i)) {
                continue;
            }
            for (int j = 0; j < g->nodes[i].nin; j++) {
                int v = g->nodes[i].in[j];
                if (!computed(s, v)) {
                    continue;
                }
                /* i reads v: if v moves, i must be in (or move to) v's target as a FULL value */
                int where = tgt[i] >= 0 ? tgt[i] : s->sn[i].kernel;
                int full = tgt[i] >= 0 || s->sn[i].kind == FC_VK_FULL;
                if (tgt[v] >= 0 && (where != tgt[v] || !full)) {
                    tgt[v] = -1;
                    changed = 1;
                }
                /* if i moves, v must be a buffer or move with it */
                if (tgt[i] >= 0 && tgt[v] != tgt[i]) {
                    tgt[i] = -1;
                    changed = 1;
                }
            }
        }
    }
    /* move each target's group if the target kernel has room for it */
    for (int kd = 0; kd < s->nkernels; kd++) {
        int any = 0;
        for (int v = 0; v < n && !any; v++) {
            any = tgt[v] == kd;
        }
        if (!any) {
            continue;
        }
        if (group_bound(s, kd, tgt) > FC_MAXOPS) {
            for (int v = 0; v < n; v++) {
                tgt[v] = tgt[v] == kd ? -1 : tgt[v];
            }
            continue;
        }
        for (int v = 0; v < n; v++) {
            if (tgt[v] != kd) {
                continue;
            }
            FcKernelIR *K = &s->kernels[s->sn[v].kernel];
            int m = 0;
            while (K->nodes[m] != v) {
                m++;
            }
            memmove(K->nodes + m, K->nodes + m + 1, (size_t)(K->nnodes - m - 1) * sizeof(int));
            K->nnodes--;
            if (kernel_insert_node(s, kd, v) < 0) {
                goto cleanup;
            }
            s->sn[v].kind = FC_VK_FULL;
            s->sn[v].keepform = 1;
            tgt[v] = -1;
            moved++;
        }
    }
    rc = moved ? drop_empty_kernels(s) : 0;
cleanup:
    PyMem_Free(tgt);
    PyMem_Free(out);
    return rc;
}

/* ------------------------------------------------------------------------
 * buffers, operands, order
 * ---------------------------------------------------------------------- */

/* kind FC_SLOT_INPUT: contig, zlast and perm from the input's key;
 * FC_SLOT_ALLOC: contig 1, zlast 0, perm 0, then alloc_layout */
static int
add_slot(FcSpec *s, FcSlotKind kind, int node, int input, int contig, int zlast, uint64_t perm)
{
    FcSlot *sl;
    const FcSNode *sn = &s->sn[node];
    if (grow((void **)&s->slots, &s->capslots, s->nslots + 1, sizeof(FcSlot)) < 0) {
        return -1;
    }
    sl = &s->slots[s->nslots];
    memset(sl, 0, sizeof(*sl));
    sl->kind = kind;
    sl->node = node;
    sl->input = input;
    sl->dtype = sn->dtype;
    sl->ndim = sn->ndim;
    memcpy(sl->dims, sn->dims, sn->ndim * sizeof(int));
    sl->contig = contig;
    sl->zlast = zlast;
    sl->perm = perm;
    return s->nslots++;
}

/* The layout of a buffer the segment allocates: dense in the segment's
 * alloc_perm order where its value is in_order, else C order. */
static void
alloc_layout(const FcSpec *s, FcSlot *sl)
{
    if (s->sn[sl->node].in_order) {
        sl->perm = s->alloc_perm;
        sl->contig = 0;
    }
}

/* The memory order of the segment's allocated buffers (s->alloc_perm): that
 * of its inputs, as NumPy's (order 'K') and torch's elementwise results follow
 * theirs, so a kernel over channels_last tensors or a transposed matrix walks
 * every operand in memory order (and can run flat) and its result keeps the
 * layout the next op (a channels_last convolution) wants. An input dense in
 * another order sets it; it stays C order (0) where inputs of that rank
 * disagree: two orders, or one without size-1 dims that is C-contiguous or
 * strided. An input broadcast along its last dim by a zero stride (zlast: an
 * expanded view, as the gradient of a global average pool, (N, C) expanded
 * to (N, C, H, W)) has no order of its own and does not disagree, as torch's
 * elementwise results ignore zero strides. CUDA inputs carry no order (their
 * metas' perm is 0). */
static void
alloc_order(FcSpec *s)
{
    uint64_t perm = 0;
    int nd = 0;
    for (int k = 0; k < s->ninputs; k++) {
        const FcMeta *m = &s->metas[k];
        if (m->perm != 0 && (perm == 0 || m->ndim > nd)) {
            perm = m->perm;
            nd = m->ndim;
        }
    }
    for (int k = 0; k < s->ninputs && perm != 0; k++) {
        const FcMeta *m = &s->metas[k];
        if (m->ndim == nd && m->perm != perm && !m->zlast && (m->perm != 0 || m->ones == 0)) {
            perm = 0;
        }
    }
    s->alloc_perm = perm;
    if (perm == 0) {
        return;
    }
    /* in_order: a value of that rank computed from such an input (nodes are
     * in topological order), as torch's result of an op follows its
     * channels_last operand; one computed from C-ordered values only (a
     * broadcast of two per-channel tensors) stays C order, as torch's does */
    for (int k = 0; k < s->ninputs; k++) {
        s->sn[s->inputs[k]].in_order = s->metas[k].perm == perm;
    }
    for (int i = 0; i < s->g->nnodes; i++) {
        const FcNode *nd_i = &s->g->nodes[i];
        if (!computed(s, i) || s->sn[i].ndim != nd) {
            continue;
        }
        for (int j = 0; j < nd_i->nin && !s->sn[i].in_order; j++) {
            s->sn[i].in_order = s->sn[nd_i->in[j]].in_order;
        }
    }
}

static int
add_operand(FcSpec *s, int k, int slot, FcAlign align, int is_out, int node)
{
    FcKernelIR *K = &s->kernels[k];
    for (int o = 0; o < K->nops; o++) {
        if (K->ops[o].slot == slot && K->ops[o].align == align) {
            return 0;
        }
    }
    if (K->nops == FC_MAXOPS) {
        PyErr_Format(PyExc_RuntimeError,
                     "fastcompile: a fused kernel needs more than %d arrays; "
                     "split the graph (this limit will be lifted)", FC_MAXOPS);
        return -1;
    }
    K->ops[K->nops].slot = slot;
    K->ops[K->nops].align = align;
    K->ops[K->nops].is_out = is_out;
    K->ops[K->nops].node = node;
    K->nops++;
    return 0;
}

static FcAlign
align_for(const FcSNode *consumer)
{
    if (consumer->kind == FC_VK_OUTER && !consumer->keepform) {
        return FC_ALIGN_OUTER;
    }
    return FC_ALIGN_FULL;
}

static int
topo_visit(FcSpec *s, int k, char *state, int *n)
{
    if (state[k] == 2) {
        return 0;
    }
    if (state[k] == 1) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: fusion produced a kernel cycle");
        return -1;
    }
    state[k] = 1;
    for (int d = 0; d < s->kernels[k].ndeps; d++) {
        if (topo_visit(s, s->kernels[k].deps[d], state, n) < 0) {
            return -1;
        }
    }
    state[k] = 2;
    s->order[(*n)++] = k;
    return 0;
}

static int
finish(FcSpec *s)
{
    const FcGraph *g = s->g;
    char *state = NULL;
    int n = 0, rc = -1;

    /* which values leave their kernel */
    for (int o = 0; o < s->noutputs; o++) {
        int v = s->outputs[o];
        if (computed(s, v)) {
            s->sn[v].materialize = 1;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const FcNode *nd = &g->nodes[i];
        if (!computed(s, i)) {
            continue;
        }
        for (int j = 0; j < nd->nin; j++) {
            int v = nd->in[j];
            if (computed(s, v) && s->sn[v].kernel != s->sn[i].kernel) {
                s->sn[v].materialize = 1;
            }
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        if (computed(s, i) && s->sn[i].materialize) {
            int leaves = 0;
            if ((s->sn[i].slot = add_slot(s, FC_SLOT_ALLOC, i, -1, 1, 0, 0)) < 0) {
                goto cleanup;
            }
            alloc_layout(s, &s->slots[s->sn[i].slot]);
            for (int o = 0; o < s->noutputs; o++) {
                leaves |= s->outputs[o] == i;
            }
            /* a buffer only kernels see keeps the compute type: a float16
             * intermediate stays float32, as it would inside one kernel */
            if (!leaves) {
                s->slots[s->sn[i].slot].dtype = fc_dtype_compute(s->sn[i].dtype);
            }
        }
    }
    /* operands: outputs first, then inputs in the order nodes read them */
    for (int k = 0; k < s->nkernels; k++) {
        FcKernelIR *K = &s->kernels[k];
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            if (s->sn[v].materialize &&
                    add_operand(s, k, s->sn[v].slot, align_for(&s->sn[v]), 1, v) < 0) {
                goto cleanup;
            }
        }
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            const FcNode *nd = &g->nodes[v];
            if (nd->op == FC_OP_RCOUNT) {
                continue;
            }
            for (int j = 0; j < nd->nin; j++) {
                int u = nd->in[j];
                FcAlign al = (fc_ops[nd->op].kind == FC_KIND_RED && s->sn[v].axes != 0)
                             ? FC_ALIGN_FULL : align_for(&s->sn[v]);
                if (g->nodes[u].op == FC_OP_CONST || (computed(s, u) && s->sn[u].kernel == k)) {
                    continue;
                }
                if (add_operand(s, k, s->sn[u].slot, al, 0, u) < 0) {
                    goto cleanup;
                }
            }
        }
        /* flat: pointwise, every operand a scalar or dense over F in one
         * memory order (C, or the same perm: element i of each is then the
         * same element of F) */
        K->flat = K->mask == 0;
        int have_order = 0;
        uint64_t order = 0;
        for (int o = 0; K->flat && o < K->nops; o++) {
            const FcSlot *sl = &s->slots[K->ops[o].slot];
            if (all_ones(sl->dims, sl->ndim)) {
                continue;
            }
            if ((!sl->contig && sl->perm == 0) || !same_shape(sl->dims, sl->ndim, K->F, K->nd)
                    || (have_order && sl->perm != order)) {
                K->flat = 0;
            }
            order = sl->perm;
            have_order = 1;
            for (int d = 0; K->flat && d < K->nd; d++) {
                int sd = d - (K->nd - sl->ndim);
                if (K->F[d] != 0 && (sd < 0 || sl->dims[sd] != K->F[d])) {
                    K->flat = 0;
                }
            }
        }
        /* loop order: a strided pointwise kernel walks its first output in
         * memory order (the others share its layout, being the segment's
         * allocations of one rank) */
        K->loop_perm = 0;
        for (int o = 0; K->mask == 0 && !K->flat && o < K->nops; o++) {
            const FcSlot *sl = &s->slots[K->ops[o].slot];
            if (K->ops[o].is_out) {
                K->loop_perm = sl->ndim == K->nd ? sl->perm : 0;
                break;
            }
        }
        /* reduction levels */
        K->nphases = 0;
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m], lvl = 0;
            const FcNode *nd = &g->nodes[v];
            for (int j = 0; j < nd->nin && nd->op != FC_OP_RCOUNT; j++) {
                int u = nd->in[j];
                if (computed(s, u) && s->sn[u].kernel == k && s->sn[u].level > lvl) {
                    lvl = s->sn[u].level;
                }
            }
            if (fc_ops[nd->op].kind == FC_KIND_RED && s->sn[v].axes != 0) {
                lvl += 1;
                K->nphases = lvl > K->nphases ? lvl : K->nphases;
            }
            s->sn[v].level = lvl;
        }
    }
    s->order = PyMem_Malloc((s->nkernels + 1) * sizeof(int));
    state = PyMem_Calloc(s->nkernels + 1, 1);
    if (s->order == NULL || state == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (int k = 0; k < s->nkernels; k++) {
        if (topo_visit(s, k, state, &n) < 0) {
            goto cleanup;
        }
    }
    rc = 0;
cleanup:
    PyMem_Free(state);
    return rc;
}

int
fc_fuse(FcSpec *s)
{
    const FcGraph *g = s->g;
    for (int i = 0; i < g->nnodes; i++) {
        s->sn[i].kernel = -1;
        s->sn[i].slot = -1;
    }
    alloc_order(s);
    for (int k = 0; k < s->ninputs; k++) {
        int v = s->inputs[k];
        const FcMeta *m = &s->metas[k];
        if ((s->sn[v].slot = add_slot(s, FC_SLOT_INPUT, v, k, m->contig, m->zlast, m->perm)) < 0) {
            return -1;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        int op = g->nodes[i].op;
        if (!computed(s, i)) {
            continue;
        }
        if ((fc_ops[op].kind == FC_KIND_RED || op == FC_OP_RCOUNT) && s->sn[i].axes != 0) {
            if (place_reduction(s, i) < 0) {
                return -1;
            }
        }
        else if (place_pointwise(s, i) < 0) {
            return -1;
        }
    }
    if (sink_kernels(s) < 0) {
        return -1;
    }
    return finish(s);
}

/* ------------------------------------------------------------------------
 * verifier and dump
 * ---------------------------------------------------------------------- */

#define VERIFY(cond, ...)                                          \
    do {                                                           \
        if (!(cond)) {                                             \
            PyErr_Format(PyExc_RuntimeError, "fc_spec_verify: " __VA_ARGS__); \
            goto error;                                            \
        }                                                          \
    } while (0)

int
fc_spec_verify(const FcSpec *s)
{
    const FcGraph *g = s->g;
    int *pos = NULL, rc = -1;     /* pos: owned */
    for (int i = 0; i < g->nnodes; i++) {
        const FcSNode *sn = &s->sn[i];
        if (!computed(s, i)) {
            continue;
        }
        VERIFY(sn->kernel >= 0 && sn->kernel < s->nkernels, "node %d has no kernel", i);
        VERIFY(sn->kind == FC_VK_FULL || sn->kind == FC_VK_OUTER, "node %d has no kind", i);
        VERIFY(sn->dtype >= 0 && sn->dtype < FC_NDTYPES, "node %d has dtype %d", i, sn->dtype);
        VERIFY(!sn->materialize || (sn->slot >= 0 && sn->slot < s->nslots),
               "materialized node %d has no slot", i);
        for (int j = 0; j < g->nodes[i].nin; j++) {
            int u = g->nodes[i].in[j];
            VERIFY(g->nodes[u].op == FC_OP_CONST || (computed(s, u) && s->sn[u].kernel == sn->kernel)
                   || s->sn[u].slot >= 0, "node %d reads node %d, which is nowhere", i, u);
        }
    }
    pos = PyMem_Calloc(s->nkernels + 1, sizeof(int));
    if (pos == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (int o = 0; o < s->nkernels; o++) {
        pos[s->order[o]] = o;
    }
    for (int k = 0; k < s->nkernels; k++) {
        const FcKernelIR *K = &s->kernels[k];
        for (int d = 0; d < K->ndeps; d++) {
            if (pos[K->deps[d]] >= pos[k]) {
                PyErr_Format(PyExc_RuntimeError, "fc_spec_verify: kernel %d runs before its input kernel %d",
                             k, K->deps[d]);
                goto error;
            }
        }
        for (int m = 1; m < K->nnodes; m++) {
            if (K->nodes[m] <= K->nodes[m - 1]) {
                PyErr_Format(PyExc_RuntimeError, "fc_spec_verify: kernel %d nodes out of order", k);
                goto error;
            }
        }
        for (int o = 0; o < K->nops; o++) {
            if (K->ops[o].slot < 0 || K->ops[o].slot >= s->nslots) {
                PyErr_Format(PyExc_RuntimeError, "fc_spec_verify: kernel %d operand %d bad slot", k, o);
                goto error;
            }
        }
    }
    rc = 0;
error:
    PyMem_Free(pos);
    return rc;
}

void
fc_spec_free(FcSpec *s)
{
    for (int k = 0; k < s->nkernels; k++) {
        PyMem_Free(s->kernels[k].nodes);
        PyMem_Free(s->kernels[k].deps);
    }
    PyMem_Free(s->kernels);
    PyMem_Free(s->slots);
    PyMem_Free(s->order);
    PyMem_Free(s->parent);
    PyMem_Free(s->reps);
    PyMem_Free(s->sn);
    PyMem_Free(s->inputs);
    PyMem_Free(s->outputs);
    memset(s, 0, sizeof(*s));
}

static void
dims_str(char *buf, size_t cap, const int *dims, int nd)
{
    size_t used = 0;
    used += snprintf(buf + used, cap - used, "(");
    for (int d = 0; d < nd && used < cap; d++) {
        if (dims[d] == 0) {
            used += snprintf(buf + used, cap - used, d ? ", 1" : "1");
        }
        else {
            used += snprintf(buf + used, cap - used, d ? ", s%d" : "s%d", dims[d]);
        }
    }
    if (used < cap) {
        snprintf(buf + used, cap - used, nd == 1 ? ",)" : ")");
    }
}

char *
fc_spec_dump(const FcSpec *s)
{
    size_t cap = 4096, used = 0;
    char *out = PyMem_Malloc(cap), tmp[256];
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    out[0] = 0;
#define EMIT(...)                                                       \
    do {                                                                \
        int need_ = snprintf(NULL, 0, __VA_ARGS__);                     \
        if (used + need_ + 1 > cap) {                                   \
            while (used + need_ + 1 > cap) cap *= 2;                    \
            char *q_ = PyMem_Realloc(out, cap);                         \
            if (q_ == NULL) { PyMem_Free(out); PyErr_NoMemory(); return NULL; } \
            out = q_;                                                   \
        }                                                               \
        used += snprintf(out + used, cap - used, __VA_ARGS__);          \
    } while (0)
    for (int o = 0; o < s->nkernels; o++) {
        int k = s->order[o];
        const FcKernelIR *K = &s->kernels[k];
        dims_str(tmp, sizeof(tmp), K->F, K->nd);
        EMIT("kernel %d: space %s", o, tmp);
        if (K->mask) {
            EMIT(" reduce axes {");
            for (int d = 0, first = 1; d < K->nd; d++) {
                if (K->mask & (1u << d)) {
                    EMIT(first ? "%d" : ", %d", d);
                    first = 0;
                }
            }
            EMIT("} in %d sweep%s", K->nphases + 1, K->nphases ? "s" : "");
        }
        EMIT("%s\n", K->flat ? " [flat]" : "");
        for (int m = 0; m < K->nnodes; m++) {
            int v = K->nodes[m];
            const FcNode *nd = &s->g->nodes[v];
            const FcSNode *sn = &s->sn[v];
            dims_str(tmp, sizeof(tmp), sn->dims, sn->ndim);
            EMIT("  %%%d = %s(", v, fc_ops[nd->op].name);
            for (int j = 0; j < nd->nin; j++) {
                EMIT(j ? ", %%%d" : "%%%d", nd->in[j]);
            }
            EMIT(") : %s%s %s %s%s\n", fc_dtypes[sn->dtype].name, tmp,
                 sn->kind == FC_VK_FULL ? "full" : "outer",
                 sn->materialize ? "-> buffer" : "", "");
        }
    }
#undef EMIT
    return out;
}
