/* Module state: everything fastcompile._C keeps between calls, in one struct.
 * In: each stage's state type. Out: fc_state, which module.c traverses, clears and frees. */
#ifndef FC_STATE_H
#define FC_STATE_H

#include "runtime/cpu_internal.h"
#include "runtime/devarray.h"
#include "runtime/plan.h"
#include "runtime/profile.h"

/* One instance, fc_state, defined in module.c: the runtime reaches it from
 * code that has no module object at hand (kernel launches, plan steps), so
 * it is one documented global rather than PyModule_GetState's. It is zeroed
 * static storage: a late call after module teardown finds empty state, not
 * freed memory. module.c's m_traverse/m_clear/m_free walk it. Outside it:
 * the eval-frame globals (hook/eval_frame.c, the documented exception); the
 * NumPy allocator's pool (runtime/alloc.c: arrays outlive the module); the
 * CUDA libraries' symbols (runtime/cuda.c) and libgomp's (relayout.c), which
 * stay loaded for the process and hold no Python objects. */
typedef struct {
    FcCpuRt cpu;            /* runtime/kcache.c, ckey.c, compile_job.c, pool.c, cpu.c */
    FcDevRt dev;            /* runtime/devarray.c: torch's objects, which the GC sees */
    FcPlanRt plan;          /* runtime/plan.c: the plans' configuration */
    FcProfRt prof;          /* runtime/profile.c: profile() rows */
} FcModState;

FC_INTERNAL extern FcModState fc_state;

#endif
