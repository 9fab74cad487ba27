/* Core, schedule: a compiled graph's levels and segments, a pure graph pass.
 * In: a verified FcGraph (externs split it). Out: FcSchedule: levels, segments, the call's externs and releases. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>

#include "graph.h"
#include "schedule.h"

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
sink_levels(const FcGraph *g, FcSchedule *c, const char *live)
{
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
 * output needs it, or it is an extern not declared pure (it may act). Sets
 * c->level (replacing any earlier one) and c->nlevels. GIL held; 0, or -1
 * with MemoryError. */
static int
compute_levels(FcGraph *g, FcSchedule *c)
{
    int maxl = 0;
    char *live;
    PyMem_Free(c->level);
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
    if (sink_levels(g, c, live) < 0) {
        PyMem_Free(live);
        return -1;
    }
    PyMem_Free(live);
    c->nlevels = maxl + 1;
    return 0;
}

/* Levels, then equal work merged within each level (fc_graph_cse; levels
 * again if any was), then one segment per level: its nodes, the values that
 * enter it and those it must leave for later. GIL held; 0, or -1 with an
 * exception set. */
static int
build_segments(FcGraph *g, FcSchedule *c)
{
    int merged;
    if (compute_levels(g, c) < 0 || (merged = fc_graph_cse(g, c->level)) < 0
        || (merged > 0 && compute_levels(g, c) < 0)) {
        return -1;
    }
    c->segs = PyMem_Calloc(c->nlevels, sizeof(FcSegmentSlot));
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
    /* an input no kernel reads is only handed to externs (or returned): it may be any object */
    c->any_arg = PyMem_Calloc(g->ninputs + 1, 1);
    if (c->any_arg == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int k = 0; k < g->ninputs; k++) {
        int u = g->inputs[k], read = 0;
        for (int L = 0; L < c->nlevels && !read; L++) {
            const FcSegment *seg = &c->segs[L].seg;
            for (int j = 0; j < seg->ninputs && !read; j++) {
                read = seg->inputs[j] == u;
            }
        }
        c->any_arg[k] = !read;
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

/* Bucket the nodes with key[i] in [0, nlevels) by key, in node order, as CSR
 * arrays (*start: nlevels + 1 entries; *nodes: the members). 0, or -1 with
 * MemoryError. */
static int
by_level(const int *key, int nnodes, int nlevels, int **start, int **nodes)
{
    int *fill = PyMem_Calloc(nlevels + 1, sizeof(int));
    *start = PyMem_Calloc(nlevels + 2, sizeof(int));
    *nodes = PyMem_Calloc(nnodes + 1, sizeof(int));
    if (fill == NULL || *start == NULL || *nodes == NULL) {
        PyMem_Free(fill);
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < nnodes; i++) {
        if (key[i] >= 0 && key[i] < nlevels) {
            (*start)[key[i] + 1]++;
        }
    }
    for (int L = 0; L < nlevels; L++) {
        (*start)[L + 1] += (*start)[L];
    }
    for (int i = 0; i < nnodes; i++) {
        if (key[i] >= 0 && key[i] < nlevels) {
            (*nodes)[(*start)[key[i]] + fill[key[i]]++] = i;
        }
    }
    PyMem_Free(fill);
    return 0;
}

/* The call's schedule (see FcSchedule): the externs of each level, and for
 * each value (an input, a constant, an extern's result, a segment's output) the
 * level after which nothing reads it. Graph outputs are kept to the end; a
 * value nothing reads goes after its own level. GIL held; 0, or -1 with
 * MemoryError. */
static int
build_schedule(const FcGraph *g, FcSchedule *c)
{
    int rc = -1;
    int *ext = PyMem_Malloc((g->nnodes + 1) * sizeof(int));
    int *last = PyMem_Malloc((g->nnodes + 1) * sizeof(int));
    if (ext == NULL || last == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int i = 0; i < g->nnodes; i++) {
        ext[i] = g->nodes[i].op == FC_OP_EXTERN && c->level[i] > 0 ? c->level[i] : -1;
        last[i] = c->level[i] >= 0 ? c->level[i] : (g->nodes[i].op == FC_OP_INPUT ? 0 : -1);
    }
    for (int i = 0; i < g->nnodes; i++) {
        const FcNode *n = &g->nodes[i];
        for (int j = 0; j < n->nin && c->level[i] >= 0; j++) {
            last[n->in[j]] = c->level[i] > last[n->in[j]] ? c->level[i] : last[n->in[j]];
        }
    }
    for (int k = 0; k < g->noutputs; k++) {
        last[g->outputs[k]] = -1;          /* kept: the final loop of run_graph releases it */
    }
    rc = by_level(ext, g->nnodes, c->nlevels, &c->ext_start, &c->ext_nodes) < 0
         || by_level(last, g->nnodes, c->nlevels, &c->free_start, &c->free_nodes) < 0 ? -1 : 0;
done:
    PyMem_Free(ext);
    PyMem_Free(last);
    return rc;
}

int
fc_schedule_build(FcGraph *g, FcSchedule *s)
{
    return build_segments(g, s) < 0 || build_schedule(g, s) < 0 ? -1 : 0;
}
