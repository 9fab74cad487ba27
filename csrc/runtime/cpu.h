/* Runtime, CPU: C source text -> shared object on disk -> loaded kernel.
 * In: kernel source from gen_c. Out: a function pointer, the .so and .c paths. */
#ifndef FC_CPU_H
#define FC_CPU_H

#include <Python.h>
#include "../core/ir.h"
#include "../../python/fastcompile/include/fc_launch.h"

typedef struct {
    fc_kernel_fn fn;     /* borrowed: lives as long as the process (dlopen'd) */
    const char *so_path; /* borrowed: owned by the runtime's kernel table */
    const char *c_path;  /* borrowed: the source beside it */
    const char *key;     /* borrowed: hex sha256 disk-cache key */
} FcLoaded;

/* Configure the CPU runtime once (module exec and fastcompile.config changes).
 * cfg: borrowed dict with str values: "cc", "cflags", "include_dir",
 * "cache_dir", "version". Returns 0, or -1 with an exception set. */
FC_INTERNAL int fc_cpu_configure(PyObject *cfg);

/* Compile (or find in the memory/disk cache) `source` and look up `symbol`.
 * Returns 0 and fills *out, or -1 with an exception set (RuntimeError carrying
 * the numbered source and the compiler log on a compile failure). */
FC_INTERNAL int fc_cpu_load(const char *source, const char *symbol, FcLoaded *out);

/* fc_cpu_load for n kernels at once: the ones missing from both caches are
 * compiled concurrently, up to one compiler per online CPU, several to a
 * compiler run when there are more of them than CPUs and may_bundle is set
 * (only for rendered kernels, whose file-scope names all carry their
 * symbol: see fc_pool_make_bundles). outs[i] for sources[i]/symbols[i]. 0, or -1
 * with an exception set (the first failure); after a compile failure,
 * outs[i].fn is NULL for each kernel that failed and set for each one that
 * loaded. */
FC_INTERNAL int fc_cpu_load_many(int n, const char *const *sources, const char *const *symbols,
                                 int may_bundle, FcLoaded *outs);

/* Counters: compiles (kernels compiled), compiler_runs (compiler processes: a
 * bundle of kernels takes one), compile_batches (batches that compiled: the
 * kernels of one batch compile side by side, one compiler per core),
 * disk_hits, memory_hits.
 * Returns a new reference to a dict. */
FC_INTERNAL PyObject *fc_cpu_stats(void);
/* Forget loaded kernels' table entries (not unloading them) and, if
 * `disk` is true, delete the on-disk cache contents. Returns 0 or -1. */
FC_INTERNAL int fc_cpu_cache_clear(int disk);
FC_INTERNAL void fc_cpu_free(void);
/* The checked private cache folder (NULL + exception), the shipped include
 * folder (NULL if unset) and fastcompile's version, for the CUDA runtime.
 * Borrowed; valid until the next fc_cpu_configure. GIL held. */
FC_INTERNAL const char *fc_cpu_cache_dir(void);
FC_INTERNAL const char *fc_cpu_include_dir(void);
FC_INTERNAL const char *fc_cpu_version(void);
/* Test hook _C._cpu_load(source, symbol) -> {"so_path", "c_path", "key", "fn"}.
 * self, args: borrowed; returns: new reference. */
FC_INTERNAL PyObject *fc_cpu_py_load(PyObject *self, PyObject *args);
/* Test hook _C._cpu_load_many([(source, symbol), ...]) -> [that dict, ...]: one
 * fc_cpu_load_many batch. self, arg: borrowed; returns: new reference. */
FC_INTERNAL PyObject *fc_cpu_py_load_many(PyObject *self, PyObject *arg);

#endif
