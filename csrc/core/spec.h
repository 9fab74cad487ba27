/* Specialization: one segment of a graph, typed and shaped for one input key.
 * In: FcGraph + segment input metas. Out: typed nodes, symbolic shapes,
 * fused kernels (FcKernelIR) that gen_c renders and the plan runs. */
#ifndef FC_SPEC_H
#define FC_SPEC_H

#include "ir.h"

/* A symbolic dim is a class id: 0 means "size 1", any other id is a size
 * known at run time, equal for every dim in the class (broadcasting unified
 * them). Each class has a representative dim of a segment input. */

#define FC_MAX_KERNEL_REDS 32     /* reductions one kernel may hold */

typedef enum { FC_VK_NONE, FC_VK_FULL, FC_VK_OUTER } FcValKind;
typedef enum { FC_ALIGN_FULL, FC_ALIGN_OUTER } FcAlign;

/* per graph node, for the segment being specialized */
typedef struct {
    int in_seg;          /* computed by this segment (else: a segment input or unused) */
    int slot;            /* buffer slot holding its value, -1 if none */
    int dtype, weak, ndim;
    int dims[FC_MAXDIM]; /* class ids */
    uint32_t axes;       /* reductions: normalized mask over the input's dims */
    /* fusion results */
    int kernel;          /* kernel index, -1 for constants and buffers */
    FcValKind kind;
    int keepform;        /* OUTER values: 1 if shaped like F with 1s at reduced dims */
    int level;           /* reductions finished before it can be computed */
    int materialize;     /* written to its slot by its kernel */
    int in_order;        /* of alloc_perm's rank and computed from a segment input laid
                          * out in alloc_perm (fuse.c): its buffer is laid out so too */
} FcSNode;

/* a runtime array */
typedef enum { FC_SLOT_INPUT, FC_SLOT_ALLOC } FcSlotKind;
typedef struct {
    FcSlotKind kind;
    int node;
    int input;           /* FC_SLOT_INPUT: position among the segment inputs */
    int dtype, ndim;
    int dims[FC_MAXDIM];
    int contig;          /* C-contiguous (inputs: from the key; allocs: unless perm) */
    int zlast;           /* inputs: the last dim is broadcast by a zero stride (from the key) */
    uint64_t perm;       /* dense in another memory order (FcMeta's perm; allocs: the
                          * segment's alloc_perm where the rank matches), 0: none */
} FcSlot;

typedef struct {
    int slot;
    FcAlign align;
    int is_out;
    int node;            /* the node whose value this operand holds */
} FcOperand;

typedef struct {
    int nd;
    int F[FC_MAXDIM];    /* iteration space (class ids) */
    uint32_t mask;       /* reduced positions of F; 0 for pointwise kernels */
    int *nodes; int nnodes, capnodes;  /* member nodes, topological order */
    int *deps; int ndeps, capdeps;     /* kernels this one reads from */
    FcOperand ops[FC_MAXOPS]; int nops;
    int flat;            /* pointwise, every operand contiguous over F or a scalar */
    int nphases;         /* highest reduction level */
    uint64_t loop_perm;  /* a strided pointwise kernel whose output is dense in another
                          * memory order (its slot's perm, over F): the launch nests
                          * its loops in that order, innermost last; 0: F's order */
} FcKernelIR;

typedef struct {
    int cls_input, cls_dim;   /* representative: segment input, dim */
} FcClassRep;

/* An input's part of a plan key, compared with memcmp (zero it first).
 * zlast: the last dim, of size > 1, has stride 0 (an expanded view such as
 * torch's x.expand(n, k)); pointwise runs then read it once instead of
 * falling to the strided loop. dev: 0 for a CPU (NumPy) array, d + 1 for a
 * tensor on CUDA device d. */
typedef struct { int dtype, ndim; uint32_t ones; int contig, zlast, dev; uint64_t perm; } FcMeta;

/* perm: a CPU array dense in another memory order than C, which the core's
 * results then keep (fuse.c, alloc_order): its dims from the outermost in
 * memory to the innermost, 4 bits each from the lowest (FC_PERM_DIM); 0 for
 * any other array (C-contiguous, strided, on CUDA). plan.c's dense_perm
 * gives torch's channels_last order only. A permutation of rank >= 2 that is
 * not the identity never encodes to 0. */
#define FC_PERM_DIM(perm, i) ((int)(((perm) >> (4 * (i))) & 15u))

typedef struct {
    const FcGraph *g;
    const FcMeta *metas;      /* borrowed: the key, one per segment input */
    FcSNode *sn;              /* g->nnodes entries */
    /* segment inputs, in key order */
    int *inputs; int ninputs;
    /* nodes the segment must leave in slots for later (graph outputs, externs, later segments) */
    int *outputs; int noutputs;
    /* symbolic classes */
    int *parent; int nclasses, capclasses;
    FcClassRep *reps;
    /* buffers and kernels */
    FcSlot *slots; int nslots, capslots;
    FcKernelIR *kernels; int nkernels, capkernels;
    int *order;               /* kernel execution order */
    /* the memory order of the buffers the segment allocates for in_order
     * values (0: C order for all): its inputs' (fuse.c, alloc_order) */
    uint64_t alloc_perm;
} FcSpec;

/* shape.c: dtypes and symbolic shapes for every segment node.
 * metas: per segment input (dtype, ndim, size-1 mask, contiguous, zero last stride). */
FC_INTERNAL int fc_shape_infer(FcSpec *s, const FcMeta *metas);
FC_INTERNAL int fc_class_find(FcSpec *s, int c);

/* fuse.c: partition the segment's nodes into kernels. */
FC_INTERNAL int fc_fuse(FcSpec *s);
FC_INTERNAL int fc_spec_verify(const FcSpec *s);   /* -1 + RuntimeError if broken */
FC_INTERNAL void fc_spec_free(FcSpec *s);

/* gen_c.c: one kernel -> C source (free it with fc_str_release). name: the symbol to define. */
FC_INTERNAL char *fc_gen_c(const FcSpec *s, int k, const char *name, const char *header_comment);
/* gen_cuda.c: one kernel -> CUDA C++ source for NVRTC (free it with fc_str_release).
 * Defines name_i32 and name_i64 (32/64-bit index math), each taking an
 * fc_cu_launch<nops, max(nd, 1)> by value (fc_cuda_kernel.h). */
FC_INTERNAL char *fc_gen_cuda(const FcSpec *s, int k, const char *name, const char *header_comment);
/* gen_expr.c: a renderer's text with its node-numbered locals renumbered in
 * order of first appearance (outside comments), so kernels that differ only
 * in where their nodes sit in the graph are one text. nnodes: the graph's
 * node count. Returns a new string (fc_str_release), or NULL + MemoryError. */
FC_INTERNAL char *fc_expr_canon_names(const char *src, int nnodes);
/* 1 if kernel k has a reduction with no identity (amax, argmax, ...): the
 * runtime raises before launching it over an empty axis */
FC_INTERNAL int fc_gen_cuda_needs_nonempty(const FcSpec *s, int k);
/* elements a thread takes per trip of pointwise kernel k's main loop (its
 * vector loop where it has one): the runtime's grid gives each thread one
 * trip. 0 for a reduction (a block per row). */
FC_INTERNAL int fc_gen_cuda_per_thread(const FcSpec *s, int k);
/* a human-readable dump of the fused segment (PyMem_Malloc, free with PyMem_Free) */
FC_INTERNAL char *fc_spec_dump(const FcSpec *s);

#endif
