/* Runtime, CPU internals: what kcache.c, ckey.c, compile_job.c, pool.c and cpu.c share.
 * In: nothing. Out: the CPU runtime's state type, the load job and each file's fc_<stage>_* functions. */
#ifndef FC_CPU_INTERNAL_H
#define FC_CPU_INTERNAL_H

#include <Python.h>
#include <stdint.h>
#include <sys/types.h>

#include "../common/strbuf.h"
#include "cpu.h"
#include "sha256.h"

#define FC_PCH_HEADER "fc_kernel.h"   /* what every kernel includes first; see fc_pool_pch_folder */
#define FC_PCH_INCLUDE "#include \"" FC_PCH_HEADER "\""

/* ---------------------------------------------------------------------------
 * The kernel compile line (ckey.c says why each flag): cc fc_ckey_flags
 * [vector width] [-I<pch dir>] -I<include_dir> <cflags> -o OUT SRC fc_ckey_libs
 * ------------------------------------------------------------------------- */
#define FC_NFLAGS 13
#define FC_NLIBS 3
FC_INTERNAL extern const char *const fc_ckey_flags[FC_NFLAGS];
FC_INTERNAL extern const char *const fc_ckey_libs[FC_NLIBS];
/* The vector-width flags for the CPU this process runs on: a NULL-terminated
 * static array, or NULL where there are none to give. */
FC_INTERNAL const char *const *fc_ckey_vector_width_flags(void);

/* ---------------------------------------------------------------------------
 * Runtime state (fc_state.cpu, state.h). Touched only with the GIL held; a
 * load releases the GIL only around work on an FcJob, which owns copies of
 * everything it needs.
 * ------------------------------------------------------------------------- */

typedef struct FcEntry {
    struct FcEntry *next;   /* FcCpuRt.entries: every entry ever made, freed by fc_cpu_free */
    char *key;              /* hex sha256 disk key */
    char *symbol;
    char *so_path;          /* the file that was dlopen'd */
    char *c_path;
    void *handle;           /* never dlclose'd: callers may hold fn past cache_clear */
    fc_kernel_fn fn;
    dev_t dev;              /* the file that is mapped */
    ino_t ino;
    int via_alias;          /* loaded through a one-off hard link, see open_entry */
} FcEntry;

typedef struct {
    /* configuration (fc_cpu_configure); malloc'd strings, NULL where unset */
    int configured;
    char *cc;               /* as configured: absolute path, or a name to find on PATH */
    char **cflags;          /* extra flags, NULL-terminated */
    char *include_dir;
    char *cache_req;        /* cache_dir as asked for; NULL: the default chain */
    char *version;
    char *dump_dir;
    int always_compile;
    int debug;
    int pch;                /* use a precompiled header where the compiler is GCC */
    int bundles;            /* compile a batch's kernels several to a compiler run (see fc_pool_make_bundles) */
    int timeout_s;
    /* derived lazily from the configuration; reset by fc_cpu_configure */
    char *cache_dir;        /* the folder in use, checked private; NULL until first use */
    int cache_is_fallback;  /* cache_dir is our own mkdtemp, removed when we leave it */
    char *cc_abs;           /* absolute compiler path */
    char *cc_line;          /* first line of `cc --version` */
    int have_digest;
    uint8_t digest[32];     /* sha256 of every key component but the source */
    /* kernel table: open addressing over entries, keyed by (key, symbol) */
    FcEntry **slots;
    size_t cap, used;
    FcEntry *entries;
    int pch_failed;         /* a build failed in this process: not tried again */
    /* counters, never reset (tests diff them) */
    long long compiles, disk_hits, memory_hits;   /* compiles: kernels compiled */
    long long compiler_runs;                      /* compiler processes run for kernels */
    long long compile_batches;                    /* fc_cpu_load_many calls that compiled */
} FcCpuRt;


/* ---------------------------------------------------------------------------
 * A load job: everything a disk lookup or a compile needs, owned, so that it
 * runs with the GIL released while other threads may reconfigure.
 * ------------------------------------------------------------------------- */

enum { FC_JOB_OK, FC_JOB_OS, FC_JOB_CC, FC_JOB_LOAD, FC_JOB_NOMEM };
#define FC_JOB_MAXWARN 4
/* Compile-time estimates in source bytes (about 10 us each with GCC -O2):
 * the fixed cost of a compiler run (the driver, cc1's start, the precompiled
 * header, as, ld: ~20 ms) and the most a bundle grows to (~0.6 s). See
 * fc_pool_make_bundles (pool.c). */
#define FC_RUN_WEIGHT 2000
#define FC_BUNDLE_MAX_WEIGHT 65536

typedef struct FcJob {
    /* in */
    const char *source;     /* borrowed: the caller keeps it alive for the call */
    size_t source_len;
    const char *symbol;     /* borrowed likewise */
    char key[65];
    char *shard, *so_path, *c_path, *meta_path;   /* <cache>/<key[0:2]>/<key>.{so,c,meta} */
    char *version;
    char *cc;               /* absolute */
    char **flags;           /* FC_FLAGS, vector width, [-I<pch dir>], -I<include_dir>, cflags */
    char **envp;
    char *pch_gch;          /* the precompiled header's path; NULL: none in use */
    int pch_flag;           /* index of -I<pch dir> in flags, or -1 */
    int pch_build;          /* this job builds pch_gch instead of compiling a kernel */
    int read_disk;          /* 0 under always_compile */
    int timeout_s;
    size_t weight;          /* its own compile-cost estimate (job_prepare); see job_cost */
    struct FcJob **members; /* owned array: set on a bundle's leader, members[0] being itself */
    int nmembers;           /* 0, or >= 2 on a bundle's leader */
    int in_bundle;          /* a member that another job (its leader) compiles: never queued */
    int prev_loaded;        /* this process has so_path dlopen'd by name already... */
    dev_t prev_dev;         /* ...and it is this file */
    ino_t prev_ino;
    /* working state */
    int have_bad;           /* the .so we found at so_path and judged corrupt */
    dev_t bad_dev;
    ino_t bad_ino;
    /* out */
    void *handle;
    fc_kernel_fn fn;
    char *loaded_path;      /* the file dlopen'd: so_path, or a private temp */
    dev_t dev;              /* and its identity */
    ino_t ino;
    int via_alias;
    int disk_hit, compiled, warned_corrupt;
    int runs;               /* compiler processes this job ran (a bundle's run counts on its leader) */
    int bundled;            /* kernels in the compiler run that built this one: 1 alone */
    double compile_ms;
    char *warnings[FC_JOB_MAXWARN];
    int nwarn;
    int err;                /* FC_JOB_* */
    FcStr errmsg;           /* PyMem_Raw: built without the GIL */
} FcJob;


/* cpu.c: malloc'd printf result, or NULL when out of memory (GIL-free). */
FC_INTERNAL char *fc_cpu_fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
/* cpu.c: RuntimeWarning; returns -1 if a warnings filter turned it into an error. */
FC_INTERNAL int fc_cpu_warn(const char *msg);
/* cpu.c: FASTCOMPILE_DEBUG >= 1 log line; call with no exception set; never raises. */
FC_INTERNAL void fc_cpu_log_debug(const char *f, ...) __attribute__((format(printf, 1, 2)));

/* kcache.c: the cache folder (GIL held). fc_kcache_ensure_dir makes
 * fc_state.cpu.cache_dir a checked private folder: 0, or -1 with an exception.
 * fc_kcache_drop_dir forgets it (deleting a private fallback of ours). */
FC_INTERNAL int fc_kcache_ensure_dir(void);
FC_INTERNAL void fc_kcache_drop_dir(void);
/* kcache.c: the kernel table (GIL held). find: NULL when absent; insert
 * indexes e (already on the entries list): 0, or -1 with MemoryError. */
FC_INTERNAL FcEntry *fc_kcache_find(const char *key, const char *symbol);
FC_INTERNAL int fc_kcache_insert(FcEntry *e);
FC_INTERNAL void fc_kcache_entry_free(FcEntry *e);

/* ckey.c: resolves the compiler and hashes every key component but the
 * source into fc_state.cpu.digest, once per configuration. GIL held; 0 or -1
 * with an exception. */
FC_INTERNAL int fc_ckey_ensure_identity(void);
/* ckey.c: the disk key of one kernel's source (its leading comment left out). */
FC_INTERNAL void fc_ckey_kernel(const char *source, char hex[65]);

/* compile_job.c. prepare: a kernel's job, copying what it needs out of
 * fc_state.cpu (pch: the precompiled header's folder, or NULL); prepare_pch:
 * the job that builds that header. GIL held; 0, or -1 with MemoryError.
 * run: disk lookup, else compile (GIL-free; results land in *j). */
FC_INTERNAL int fc_job_prepare(FcJob *j, const char *source, const char *symbol, const char *key,
                               const char *pch);
FC_INTERNAL int fc_job_prepare_pch(FcJob *j, const char *pch);
FC_INTERNAL void fc_job_run(FcJob *j);
FC_INTERNAL void fc_job_free(FcJob *j);

/* pool.c: workers, the precompiled header and bundles (see there). */
FC_INTERNAL int fc_pool_width(void);
FC_INTERNAL void fc_pool_run(FcJob *const *jobs, int n);
FC_INTERNAL int fc_pool_cmp_heaviest(const void *a, const void *b);
FC_INTERNAL int fc_pool_pch_folder(char **out);
FC_INTERNAL int fc_pool_pch_wanted(const FcJob *jobs, int njobs);
FC_INTERNAL int fc_pool_make_bundles(FcJob *jobs, int njobs, int width, int may_bundle);

#endif
