/* Kernel ABI: what the runtime hands a generated kernel.
 * Shared by csrc/runtime (which fills it) and generated code (which reads it). */
#ifndef FC_LAUNCH_H
#define FC_LAUNCH_H
#include <stdint.h>

#define FC_LAUNCH_MAXDIM 16
#define FC_LAUNCH_MAXOPS 64

/* A kernel iterates an outer space (parallel) and, for reductions, an inner
 * space (reduced) per outer element. Dims are already collapsed; strides are
 * in elements, per operand, 0 where the operand is broadcast. */
typedef struct fc_launch {
    int64_t n_outer;          /* elements in the outer space */
    int64_t n_inner;          /* elements reduced per outer element (1: pointwise) */
    int32_t nd_outer;         /* dims of the outer space (>= 1) */
    int32_t nd_inner;         /* dims of the inner space (>= 1) */
    int32_t nops;             /* operands, in the kernel's operand order */
    int32_t nthreads;         /* OpenMP threads to use (>= 1) */
    int64_t serial_below;     /* run on one thread below this many elements */
    int64_t oshape[FC_LAUNCH_MAXDIM];
    int64_t ishape[FC_LAUNCH_MAXDIM];
    char *ptr[FC_LAUNCH_MAXOPS];
    int64_t ostride[FC_LAUNCH_MAXOPS][FC_LAUNCH_MAXDIM];
    int64_t istride[FC_LAUNCH_MAXOPS][FC_LAUNCH_MAXDIM];
} fc_launch;

/* Every kernel: returns 0, or an FC_ERR_* code (raised by the runtime). */
typedef int (*fc_kernel_fn)(const fc_launch *L);

#define FC_ERR_NEGATIVE_POWER 1   /* ValueError: integers to negative integer powers */
#define FC_ERR_EMPTY_REDUCE 2     /* ValueError: zero-size reduction with no identity */
#define FC_ERR_ZERO_DIVISION 3    /* RuntimeError "ZeroDivisionError" (torch): integer // or % by 0 */

#endif
