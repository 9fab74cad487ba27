/* IR: the data model every stage shares.
 * In: nothing. Out: dtypes, the op table as an enum, graph nodes, kernels. */
#ifndef FC_IR_H
#define FC_IR_H

#include <stddef.h>
#include <stdint.h>

#define FC_INTERNAL __attribute__((visibility("hidden")))

#define FC_MAXDIM 16      /* highest rank an array may have (NumPy allows 64) */
#define FC_MAXOPS 64      /* most buffer operands one kernel may touch */

/* ---------------------------------------------------------------------------
 * dtypes: FC_DTYPE(ID, name, storage C type, compute suffix, size, kind, bits)
 * kind: 'b' bool, 'i' signed, 'u' unsigned, 'f' float.
 * float16 and bfloat16 are stored as such and computed in float32.
 * ------------------------------------------------------------------------- */
#define FC_DTYPES(X)                                                 \
    X(BOOL, "bool", uint8_t, "b", 1, 'b')                            \
    X(I8, "int8", int8_t, "i8", 1, 'i')                              \
    X(I16, "int16", int16_t, "i16", 2, 'i')                          \
    X(I32, "int32", int32_t, "i32", 4, 'i')                          \
    X(I64, "int64", int64_t, "i64", 8, 'i')                          \
    X(U8, "uint8", uint8_t, "u8", 1, 'u')                            \
    X(U16, "uint16", uint16_t, "u16", 2, 'u')                        \
    X(U32, "uint32", uint32_t, "u32", 4, 'u')                        \
    X(U64, "uint64", uint64_t, "u64", 8, 'u')                        \
    X(F16, "float16", uint16_t, "f32", 2, 'f')                       \
    X(BF16, "bfloat16", uint16_t, "f32", 2, 'f')                     \
    X(F32, "float32", float, "f32", 4, 'f')                          \
    X(F64, "float64", double, "f64", 8, 'f')

typedef enum {
#define X(id, name, ctype, suffix, size, kind) FC_##id,
    FC_DTYPES(X)
#undef X
    FC_NDTYPES
} FcDType;

typedef struct {
    const char *name;    /* "float32" */
    const char *ctype;   /* storage type in generated C */
    const char *suffix;  /* compute-type suffix of helper functions */
    int size;            /* bytes per element */
    char kind;           /* 'b', 'i', 'u', 'f' */
} FcDTypeInfo;

FC_INTERNAL extern const FcDTypeInfo fc_dtypes[FC_NDTYPES];

/* ---------------------------------------------------------------------------
 * ops: one X-macro table, csrc/core/ops.def.
 * ------------------------------------------------------------------------- */
typedef enum {
    FC_KIND_PW,          /* pointwise, fused freely */
    FC_KIND_RED,         /* primitive reduction over a set of axes */
    FC_KIND_COMPOSITE,   /* decomposed into other ops when added */
    FC_KIND_SPECIAL,     /* input, constant, cast, extern, ... */
} FcOpKind;

/* result-dtype rules (NumPy's, checked against NumPy in tests/test_ops.py) */
typedef enum {
    FC_R_SAME,       /* promoted inputs */
    FC_R_SAMEI8,     /* promoted inputs, bool -> int8 (square, floordiv, ...) */
    FC_R_FLOAT,      /* promoted inputs, ints -> smallest float that holds them */
    FC_R_DIV,        /* promoted inputs, ints -> float64 */
    FC_R_BOOL,       /* bool (comparisons, predicates) */
    FC_R_INDEX,      /* int64 (argmax) */
    FC_R_SUM,        /* bool/signed -> int64, unsigned -> uint64 */
    FC_R_MEAN,       /* ints -> float64 */
    FC_R_WHERE,      /* promoted inputs 1 and 2 */
    FC_R_NONE,       /* decided elsewhere */
} FcRule;

/* which input dtypes an op accepts */
typedef enum {
    FC_T_ALL,        /* every dtype */
    FC_T_NOBOOL,     /* no bool (NumPy raises TypeError: neg, sub, sign) */
    FC_T_INT,        /* bool and integers only (bitwise) */
} FcTypes;

typedef enum {
#define FC_OP(id, name, arity, kind, rule, types, cexpr, meaning) FC_OP_##id,
#include "ops.def"
#undef FC_OP
    FC_NOPS
} FcOpId;

typedef struct {
    const char *name;
    int arity;           /* -1: variadic (extern) */
    FcOpKind kind;
    FcRule rule;
    FcTypes types;
    const char *cexpr;   /* C template: %0 %1 %2 operands, %t compute suffix */
    const char *meaning;
} FcOpInfo;

FC_INTERNAL extern const FcOpInfo fc_ops[FC_NOPS];
FC_INTERNAL int fc_op_lookup(const char *name);   /* -1 if unknown */

/* ---------------------------------------------------------------------------
 * graph nodes. A node's value has a dtype and a rank; sizes exist only at
 * run time. dtype/ndim are -1 where they depend on an extern's result.
 * ------------------------------------------------------------------------- */
typedef enum { FC_CONST_BOOL, FC_CONST_INT, FC_CONST_FLOAT } FcConstKind;

typedef struct {
    int op;              /* FcOpId */
    int nin;
    int *in;             /* nin node indices (owned) */
    int dtype;           /* result dtype, -1 if known only at run time */
    int ndim;            /* result rank, -1 if known only at run time */
    int weak;            /* a Python scalar constant: takes the other side's dtype */
    /* attributes */
    int cast_to;         /* cast: target dtype */
    uint32_t axes;       /* reductions: bit mask of (normalized) axes */
    int axes_all;        /* reductions: axis=None */
    int32_t axes_raw[FC_MAXDIM]; int naxes_raw;  /* as given, before the rank is known */
    int keepdim;
    int correction;      /* var/std */
    FcConstKind ckind;   /* constants */
    double fval;
    int64_t ival;
    int input_index;     /* input: position among the graph's inputs */
    int extern_index;    /* extern: index into the graph's callables list */
    int item;            /* extern item: which element of a tuple result (-1: not a tuple) */
    int pure;            /* extern: declared free of side effects, so skipped when unused */
    int quiet_empty;     /* amax inside a composite: an empty axis gives -inf, not an error */
} FcNode;

typedef struct {
    FcNode *nodes;
    int nnodes, cap;
    int *inputs; int ninputs;     /* node index of each graph input */
    int *outputs; int noutputs;   /* node index of each graph output */
} FcGraph;

FC_INTERNAL int fc_graph_init(FcGraph *g);
FC_INTERNAL void fc_graph_free(FcGraph *g);
/* returns the new node's index, or -1 with MemoryError set */
FC_INTERNAL int fc_graph_add_node(FcGraph *g, const FcNode *proto, const int *in, int nin);

/* dtype helpers (shape.c) */
FC_INTERNAL int fc_dtype_promote(int a, int b);        /* -1: no common type */
FC_INTERNAL int fc_dtype_floatof(int a);
FC_INTERNAL int fc_dtype_from_name(const char *name);  /* -1 if unknown */
FC_INTERNAL int fc_dtype_compute(int a);               /* f16/bf16 -> f32 */

#endif
