/* Module state: everything fastcompile._C keeps between calls, in one struct.
 * In: each stage's state type. Out: fc_state, which module.c traverses, clears and frees. */
#ifndef FC_STATE_H
#define FC_STATE_H

#include "runtime/cpu_internal.h"

/* One instance, fc_state, defined in module.c: the runtime reaches it from
 * code that has no module object at hand (kernel launches, plan steps, the
 * allocator), and a process has one fastcompile._C (single-phase init). It
 * is zeroed static storage, so a late call after module teardown finds empty
 * state rather than freed memory. The eval-frame globals (hook/eval_frame.c)
 * are the one documented exception and stay there. */
typedef struct {
    FcCpuRt cpu;            /* runtime/kcache.c, ckey.c, compile_job.c, pool.c, cpu.c */
} FcModState;

FC_INTERNAL extern FcModState fc_state;

#endif
