/* Runtime, autotuning: per kernel and launch shape, the fastest launch settings.
 * In: a kernel's prepared fc_launch and a callback that runs it with given
 * settings. Out: the settings later launches of that shape use, and a table
 * of every candidate timed (Compiled.tuning). */
#ifndef FC_TUNE_H
#define FC_TUNE_H

#include <Python.h>
#include "../core/ir.h"
#include "../../python/fastcompile/include/fc_launch.h"

#define FC_TUNE_MAXCANDS 80      /* settings timed per launch shape: up to 8 block widths x
                                  * 10 thread counts (1, 2, 4, ... 256, FC_MAX_THREADS) */
#define FC_TUNE_MAXENTRIES 8     /* launch shapes remembered per kernel (oldest replaced) */
#define FC_TUNE_MIN_ELEMS 4096   /* smaller launches run as configured, untimed */

/* What a launch can change without recompiling the kernel. */
typedef struct {
    int nthreads;        /* OpenMP threads; 1 runs on the calling thread */
    int64_t block;       /* column-block width of a strided pointwise launch; 0: the launch whole */
    double us;           /* median time of one launch, microseconds (0 if not timed) */
} FcTuneCand;

typedef struct {
    int nd_outer, nd_inner;                  /* the launch shape the settings were chosen for */
    int64_t oshape[FC_LAUNCH_MAXDIM];
    int64_t ishape[FC_LAUNCH_MAXDIM];
    int ncands, best;                        /* best: index into cands */
    FcTuneCand cands[FC_TUNE_MAXCANDS];
    uint64_t uses;                           /* launches that ran with the best setting since */
} FcTuneEntry;

typedef struct {
    FcTuneEntry *entries;   /* FC_TUNE_MAXENTRIES once the first is made (PyMem); NULL before */
    int n;                  /* entries in use */
    int next;               /* the one to replace when full */
} FcTuneTable;

/* Runs the launch the tuner is choosing settings for; returns the kernel's
 * error code (0: ran). Called without the GIL: it must not touch Python. */
typedef int (*FcTuneRun)(void *ctx, int nthreads, int64_t block);

/* The entry chosen for L's shape, or NULL (never tuned, or evicted). GIL held. */
FC_INTERNAL FcTuneEntry *fc_tune_find(FcTuneTable *t, const fc_launch *L);

/* Times every candidate for L: thread counts 1, 2, 4, ... up to max_threads,
 * times column-block widths around block0 when block0 != 0 (else the launch
 * whole). Runs the fastest once more, last, so that its outputs are the
 * ones the caller keeps, and records it in t. Releases the GIL while the
 * kernel runs. Returns 0; the kernel's error code (> 0) when a run failed
 * (nothing recorded); -1 with MemoryError. GIL held on entry and exit. */
FC_INTERNAL int fc_tune_run(FcTuneTable *t, const fc_launch *L, int max_threads, int64_t block0,
                            FcTuneRun run, void *ctx);

FC_INTERNAL void fc_tune_free(FcTuneTable *t);

/* Appends one dict per entry of t to list (borrowed): kernel (name), outer and
 * inner (shape tuples), threads, block, us, uses, and candidates (a list
 * of (threads, block, us) tuples). Returns 0, or -1 with an exception set. */
FC_INTERNAL int fc_tune_report(const FcTuneTable *t, const char *name, PyObject *list);

#endif
