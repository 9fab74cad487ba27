/* Plans: a graph segment specialized for one input key, ready to run.
 * In: FcGraph + segment + input arrays. Out: output arrays, via kernels
 * loaded by cpu.c; the per-call path runs no Python. */
#ifndef FC_PLAN_H
#define FC_PLAN_H

#include <Python.h>

#include "../core/schedule.h"
#include "../core/spec.h"
#include "cpu.h"
#include "devarray.h"
#include "profile.h"
#include "tune.h"

typedef struct {
    char *name;          /* fc_<hash> */
    char *source;        /* the C text */
    FcLoaded loaded;     /* function, .so/.c paths */
    int kernel;          /* index into spec.kernels */
    FcTuneTable tune;    /* settings chosen per launch shape when autotuning */
    /* CUDA plans: the source is gen_cuda's; loaded are these instead of loaded.fn */
    void *cu_fn[2];      /* name_i32, name_i64 (CUfunction, borrowed: modules are never unloaded;
                          * name_i64 NULL until a launch needs 64-bit indexes) */
    char cu_key[65];     /* the disk-cache key of name_i32's cubin */
    char cu_arch[16];    /* "sm_90", or "compute_90" for PTX */
    char cu_path[1024];  /* the source beside the cubin (loaded.c_path), or "" */
    int nonempty;        /* a reduction without identity: an empty row raises */
    int per_thread;      /* CUDA pointwise: elements per thread and trip (the grid's divisor) */
    FcProfRef prof;      /* its row in fastcompile.profile()'s table */
} FcPlanKernel;

typedef struct FcPlan {
    struct FcPlan *next;      /* MRU list per segment */
    FcMeta *metas;            /* the key: one per segment input */
    FcSpec spec;
    FcPlanKernel *kernels; int nkernels;
    char *dump;               /* the fused segment, for explain() and debug */
    double compile_ms;
    int loaded;               /* kernels loaded (fc_plan_load); 0 from fc_plan_build until then */
    int dev;                  /* 0: CPU kernels (gen_c); d + 1: CUDA device d (gen_cuda) */
} FcPlan;

typedef struct {
    int num_threads;          /* resolved, >= 1 */
    int64_t serial_below;
    int debug;
    int verify;
    int autotune;             /* fastcompile.config.autotune: Compiled objects that do not say */
    const char *origin;       /* "file:line" of the graph, for kernel headers (borrowed) */
} FcPlanConfig;

/* fc_state.plan: the plans' configuration (fc_plan_configure). */
typedef struct {
    FcPlanConfig c;
    char version[32];
    char dump_dir[1024];   /* empty: no dumps */
} FcPlanRt;

FC_INTERNAL int fc_plan_configure(PyObject *cfg);
FC_INTERNAL const FcPlanConfig *fc_plan_config(void);

/* the NumPy type number that stores dtype (bfloat16: none, float16 stands in) */
FC_INTERNAL int fc_plan_typenum(int dtype);

/* NumPy array -> meta (dtype, rank, size-1 mask, contiguity). Returns 0, or -1
 * with TypeError for a dtype the core does not have. arr: borrowed. */
FC_INTERNAL int fc_plan_meta(PyObject *arr, FcMeta *m);

/* Build a plan for `metas` (shape inference, fusion, codegen): its kernels
 * rendered (C for dev 0, CUDA for device dev - 1), none loaded; fc_plan_load compiles and loads them, for many plans
 * in one batch. origin: "file:line" for kernel headers. Returns a new plan or
 * NULL + exception. */
FC_INTERNAL FcPlan *fc_plan_build(const FcGraph *g, const FcSegment *seg, const FcMeta *metas,
                                  const char *origin, int dev);
/* Loads the kernels of every plan in plans[0..n) that is not loaded yet, in
 * one batch (the compiler runs for all of them at once, without the GIL).
 * newly[i] (may be NULL) is set to 1 for each plan this call loaded: 0 for
 * one loaded before, or by another thread meanwhile. Each plan loaded here
 * gets an even share of the batch's wall time in compile_ms. GIL held.
 * 0, or -1 with an exception set (the first compile failure): then the plans
 * whose kernels all compiled are loaded all the same, the others are not. */
FC_INTERNAL int fc_plan_load(FcPlan *const *plans, int n, char *newly);
FC_INTERNAL void fc_plan_free(FcPlan *p);

/* Test hook behind Compiled._cuda_render: every kernel of the specialization
 * for `metas` rendered by gen_cuda (no compile, no device). Returns a new
 * list of dicts, or NULL + exception. */
FC_INTERNAL PyObject *fc_plan_render_cuda(const FcGraph *g, const FcSegment *seg, const FcMeta *metas,
                                          const char *origin);

/* Run: vals[node] holds a new reference to each available array (CUDA
 * plans: torch tensors on the plan's device, read through memo, the call's
 * views; outputs allocated by torch and kernels launched on its current
 * stream, asynchronously; memo may be NULL for CPU plans); the
 * segment's outputs are stored there (new references). autotune: choose each
 * kernel's launch settings by timing (tune.h). dry: allocate the outputs but
 * launch nothing (their contents are undefined; p need not be loaded), for
 * a pass that only builds the later segments' plans. p must be loaded
 * unless dry. Returns 0 or -1. */
FC_INTERNAL int fc_plan_run(FcPlan *p, PyObject **vals, int autotune, int dry, FcDevMemo *memo);

/* Appends the tuning table of each kernel of p to list (borrowed), as
 * fc_tune_report. Returns 0, or -1 with an exception set. */
FC_INTERNAL int fc_plan_tuning(const FcPlan *p, PyObject *list);

#endif
