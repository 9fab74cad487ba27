/* Shapes and dtypes: NumPy's promotion rules and symbolic broadcasting.
 * In: graph nodes. Out: result dtypes, ranks, normalized axes. */
#ifndef FC_SHAPE_H
#define FC_SHAPE_H

#include "ir.h"

#define FC_CAST_MEANLIKE (-2)   /* ints -> float64, floats unchanged (mean, var) */
#define FC_CAST_FLOATLIKE (-3)  /* ints -> smallest float that holds them (softmax) */

/* dt/wk: input dtypes and weak flags; g (may be NULL) gives constants'
 * values. Returns 0, or -1 with TypeError (no loop) or OverflowError (a
 * Python int the integer dtype cannot hold) set. */
FC_INTERNAL int fc_infer_dtype(const FcGraph *g, const FcNode *n, const int *dt, const int *wk,
                               int *out, int *out_weak);
/* index of a weak int constant input of n that dtype `other` cannot hold, or -1 */
FC_INTERNAL int fc_weak_int_out_of_range(const FcGraph *g, const FcNode *n, int other);
FC_INTERNAL int fc_op_compute_dtype(const FcNode *n, int result, const int *dt, const int *wk);
/* Returns 0, or -1 with numpy.exceptions.AxisError / ValueError set. */
FC_INTERNAL int fc_norm_axes(const FcNode *n, int ndim, uint32_t *mask);
/* Rank of n's result from its inputs' ranks; -1 with an exception set. */
FC_INTERNAL int fc_result_ndim(const FcNode *n, const int *in_ndim);

#endif
