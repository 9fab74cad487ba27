/* Runtime, memory: a NumPy allocator that keeps freed large blocks mapped.
 * In: sizes from plans. Out: NumPy arrays (owning their data). */
#ifndef FC_ALLOC_H
#define FC_ALLOC_H

#include <Python.h>
#include "../core/ir.h"
#include "../fc_numpy.h"

FC_INTERNAL int fc_alloc_init(void);
/* keep at most `bytes` of freed blocks (0: keep none) */
FC_INTERNAL void fc_alloc_set_cap(size_t bytes);
/* a new C-contiguous array of itemsize-byte elements; ones of FC_POOL_MIN
 * bytes or more come from the pool. Returns a new reference. */
FC_INTERNAL PyObject *fc_alloc_empty(int ndim, const npy_intp *shape, int typenum, int itemsize);
/* returns a new reference to a dict of counters */
FC_INTERNAL PyObject *fc_alloc_stats(void);
FC_INTERNAL void fc_alloc_free(void);

#endif
