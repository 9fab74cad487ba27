/* Renderer, shared part: the statements both renderers write the same way.
 * In: FcSpec + kernel + a dialect (FcExprTarget). Out: text appended to the renderer's FcStr.
 *
 * gen_c.c and gen_cuda.c differ in their loop skeletons and launch code; what
 * runs inside a loop is one text in both: a node as "const T tN = expr;"
 * (literals, conversions, ops.def templates, exact comparisons), operand
 * loads, stores of results, and the reduction accumulators. The differences
 * of dialect are the fields of FcExprTarget; the address of an operand at
 * the current point of the skeleton is a callback into the renderer. */
#ifndef FC_GEN_EXPR_H
#define FC_GEN_EXPR_H

#include "spec.h"
#include "../common/strbuf.h"

#define FC_EXPR_MAX 512           /* bytes of one rendered expression */

typedef struct FcExprGen FcExprGen;

/* what a dialect calls things */
typedef struct {
    const char *who;              /* "gen_c", "gen_cuda": in error messages */
    const char *bool_type;        /* the compute type of bool: "_Bool", "bool" */
    const char *bool_load;        /* a stored uint8_t read as bool, %s the memory: "((_Bool)%s)" */
    const char *launch;           /* the launch struct's member access: "L->", "L." */
    const char *restrict_kw;      /* "restrict", "__restrict__" */
    /* the memory expression (an lvalue) of operand o at the current point
     * of the renderer's skeleton; E is the first member of its state */
    void (*mem)(const FcExprGen *E, int o, char *out);
} FcExprTarget;

/* The state the shared statements read and write: the first member of each
 * renderer's own state (its mem callback casts E back to that). */
struct FcExprGen {
    const FcExprTarget *t;
    const FcSpec *s;
    const FcKernelIR *K;
    FcStr *b;
    int depth;                    /* indentation of the next line */
    int cols;                     /* gen_c's column blocks: OUTER values and
                                   * accumulators are arrays over b (else 0) */
    const char *lane;             /* gen_c's lane loops: the accumulators are
                                   * arrays acc<v>_l[16] and this their subscript
                                   * ("_l[l]"); NULL: plain scalars */
    const char *lane_block;       /* gen_c's lane loops and column blocks with
                                   * block sums: a float32 sum
                                   * (fc_expr_sum_blocked) adds to acc<v>_f[...]
                                   * and this is its subscript ("_f[l]",
                                   * "_f[b]"); NULL: none */
    char *loaded;                 /* per operand: a local x<o> holds its value in this body */
    char opname[FC_MAXOPS][16];   /* in0.., out0.. */
};

/* one line at the current depth */
#define FC_LINE(E, ...)                         \
    do {                                        \
        fc_str_indent((E)->b, (E)->depth);      \
        fc_str_printf((E)->b, __VA_ARGS__);     \
        fc_str_puts((E)->b, "\n");              \
    } while (0)

/* ends the innermost open block: one level out, then its "}" */
#define FC_CLOSE(E)                             \
    do {                                        \
        (E)->depth--;                           \
        FC_LINE((E), "}");                      \
    } while (0)

/* E zeroed but for t, s, K, b, loaded (FC_MAXOPS bytes) and the operand names */
FC_INTERNAL void fc_expr_init(FcExprGen *E, const FcExprTarget *t, const FcSpec *s, int k, FcStr *b,
                              char *loaded);

/* ---- types and conversions (out: FC_EXPR_MAX bytes) ---- */
FC_INTERNAL const char *fc_expr_ctype(const FcExprGen *E, int dt);   /* compute type */
FC_INTERNAL const char *fc_expr_storetype(int dt);                   /* element type in memory */
/* expr (of compute type `from`) as compute type `to` */
FC_INTERNAL void fc_expr_convert(const FcExprGen *E, char *out, const char *expr, int from, int to);

/* ---- kernel membership and operands ---- */
FC_INTERNAL int fc_expr_is_red(const FcSpec *s, int v);          /* a reduction over some axes */
FC_INTERNAL int fc_expr_in_kernel(const FcExprGen *E, int v);     /* computed by this kernel */
FC_INTERNAL int fc_expr_find_operand(const FcExprGen *E, int slot, FcAlign al);   /* -1: none */
FC_INTERNAL int fc_expr_operand_is_scalar(const FcExprGen *E, int o);
/* mark every FULL node of this kernel that v needs (need: nnodes bytes) */
FC_INTERNAL void fc_expr_need_full(const FcExprGen *E, int v, char *need);
/* mark what one sweep computes: the FULL nodes the reductions `reds` read,
 * and with store set every materialized FULL node. Marks already in need
 * stay (a node marked 2 is read back, not computed: the walk stops there). */
FC_INTERNAL void fc_expr_need_sweep(const FcExprGen *E, const int *reds, int nreds, int store,
                                    char *need);
/* the kernel's operand pointers in0.., out0.. from the launch struct */
FC_INTERNAL void fc_expr_emit_operand_decls(FcExprGen *E);

/* ---- values and nodes ---- */
/* The expression for value u read by `consumer`, in u's compute type: a
 * literal, t<u>, or x<o> (loaded here first if this body has not yet).
 * -1 + SystemError if u has no operand. */
FC_INTERNAL int fc_expr_value(FcExprGen *E, int u, int consumer, char *out);
/* node v as the statement "const T tN = expr;" (column blocks: tN[b] = expr;) */
FC_INTERNAL int fc_expr_emit_node(FcExprGen *E, int v);
/* materialized node v as stored into its operand (align al): returns the operand, out the value */
FC_INTERNAL int fc_expr_stored(const FcExprGen *E, int v, FcAlign al, char *out);
/* store materialized FULL node v through its operand at the current point */
FC_INTERNAL void fc_expr_emit_store(FcExprGen *E, int v);
/* 1 if the kernel writes a value of this kind (FC_VK_FULL, FC_VK_OUTER) */
FC_INTERNAL int fc_expr_has_materialized(const FcExprGen *E, FcValKind kind);
/* write the kernel's materialized OUTER values at the current outer point */
FC_INTERNAL void fc_expr_emit_outer_stores(FcExprGen *E);
/* v is one of the kernel's OUTER non-reduction nodes computed at this level */
FC_INTERNAL int fc_expr_outer_node(const FcExprGen *E, int v, int level);
/* emit those nodes, in kernel order */
FC_INTERNAL int fc_expr_emit_outer_nodes(FcExprGen *E, int level);

/* ---- reductions: accumulators acc<v> (nan<v>, idx<v>) ---- */
FC_INTERNAL int fc_expr_acc_dtype(const FcSpec *s, int v);
FC_INTERNAL void fc_expr_acc_init(const FcSpec *s, int v, char *out);   /* the identity */
FC_INTERNAL int fc_expr_has_nan_flag(const FcSpec *s, int v);           /* amax/amin of floats */
FC_INTERNAL int fc_expr_sum_blocked(const FcSpec *s, int v);           /* a float32 sum: see gen_c's emit_lanes */
FC_INTERNAL int fc_expr_has_index(const FcSpec *s, int v);              /* argmax/argmin */
/* 1 if kernel K has a reduction with no identity (amax, argmax, ...) */
FC_INTERNAL int fc_expr_needs_nonempty(const FcSpec *s, const FcKernelIR *K);
/* the reductions finished at this level (reds: FC_MAX_KERNEL_REDS); returns how many */
FC_INTERNAL int fc_expr_level_reds(const FcExprGen *E, int level, int *reds);
/* fc_expr_level_reds, after a comment line and their accumulators' declarations */
FC_INTERNAL int fc_expr_begin_level(FcExprGen *E, int level, int *reds);
/* fold x (at flat inner index j) into v's accumulator */
FC_INTERNAL void fc_expr_accumulate(FcExprGen *E, int v, const char *x, const char *j);
/* fold reduction v's input at the current point (inner index j) into its accumulator */
FC_INTERNAL int fc_expr_feed(FcExprGen *E, int v, const char *j);
/* define t<v> from reduction v's finished accumulator */
FC_INTERNAL void fc_expr_emit_red_result(FcExprGen *E, int v);

#endif
