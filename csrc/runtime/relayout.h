/* Runtime, relayout: copies between memory orders, outside any graph.
 * In: a dense buffer and its shape. Out: a new array in the other order. */
#ifndef FC_RELAYOUT_H
#define FC_RELAYOUT_H

#include <Python.h>
#include <stdint.h>

#include "../core/ir.h"

/* dst[b][k][r] = src[b][r][k] for b < nb, r < nr, k < nk: nb transposes of
 * an (nr, nk) matrix of itemsize-byte elements (1, 2, 4 or 8), both arrays
 * dense, not overlapping. Bits are copied as they are. Uses up to nthreads
 * threads (OpenMP's, where libgomp can be loaded). Returns 0, or -1 for an itemsize it does not take (no exception:
 * no Python here; the GIL may be released). */
FC_INTERNAL int fc_relayout_transpose(const void *src, void *dst, int64_t nb, int64_t nr, int64_t nk,
                                      int itemsize, int nthreads);

/* _C._relayout(src_ptr, shape, typenum, to_cl) -> a new NumPy array of
 * shape `shape` (rank 3 to 5: (N, C, *S)) and NumPy type typenum (elements
 * of 1, 2, 4 or 8 bytes), copied from the dense buffer at src_ptr: to_cl
 * true, src holds it in C order and the result has C last in memory (a view
 * of an (N, *S, C) block: torch's channels_last strides); false, src holds
 * it with C last and the result is C order. The buffer must stay alive and
 * hold N * C * prod(S) elements (the caller's torch tensor). The memory comes
 * from the core's pool (alloc.c) where large: its pages stay mapped from one
 * call to the next. Runs on the configured thread count, GIL released.
 * self, args: borrowed; returns: new reference. */
FC_INTERNAL PyObject *fc_relayout_py_copy(PyObject *self, PyObject *args);

#endif
