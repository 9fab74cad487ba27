/* Runtime, compile pool: a batch's jobs on worker threads, the precompiled header and bundles.
 * In: the FcJobs of one fc_cpu_load_many batch. Out: every job run (bundled where that pays). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../state.h"
#include "sha256.h"

/* The shared state of fc_pool_run's workers: the next job to take. */
typedef struct {
    FcJob *const *jobs;
    int n;
    int next;                  /* guarded by mu */
    pthread_mutex_t mu;
} FcJobQueue;

/* Takes jobs off q until none is left. */
static void
drain_jobs(FcJobQueue *q)
{
    for (;;) {
        pthread_mutex_lock(&q->mu);
        int i = q->next < q->n ? q->next++ : -1;
        pthread_mutex_unlock(&q->mu);
        if (i < 0) {
            return;
        }
        fc_job_run(q->jobs[i]);
    }
}

static void *
job_thread(void *arg)
{
    drain_jobs((FcJobQueue *)arg);
    return NULL;
}

#define FC_MAX_PARALLEL_CC 16

/* A queued job's compile-cost estimate: its own, or a bundle leader's
 * members' together. */
static size_t
job_cost(const FcJob *j)
{
    size_t w = j->nmembers ? 0 : j->weight;
    for (int m = 0; m < j->nmembers; m++) {
        w += j->members[m]->weight;
    }
    return w;
}

/* qsort order of FcJob pointers: heavier first; ties keep no order that
 * matters (each job writes only its own files). */
int
fc_pool_cmp_heaviest(const void *a, const void *b)
{
    size_t la = job_cost(*(FcJob *const *)a), lb = job_cost(*(FcJob *const *)b);
    return la < lb ? 1 : la > lb ? -1 : 0;
}

/* How many compilers run at once: one per online CPU, at most FC_MAX_PARALLEL_CC. */
int
fc_pool_width(void)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    return ncpu < 1 ? 1 : ncpu > FC_MAX_PARALLEL_CC ? FC_MAX_PARALLEL_CC : (int)ncpu;
}

/* Runs *jobs[0..n), taken in that order, up to one per online CPU at a
 * time: a worker that finishes a job takes the next one (a long compile
 * holds up no other core). Each job waits on its own compiler process.
 * Called with the GIL released. */
void
fc_pool_run(FcJob *const *jobs, int n)
{
    int width = fc_pool_width();
    pthread_t th[FC_MAX_PARALLEL_CC];
    int started[FC_MAX_PARALLEL_CC] = {0};
    FcJobQueue q = {.jobs = jobs, .n = n, .next = 0};
    if (width > n) {
        width = n;
    }
    if (pthread_mutex_init(&q.mu, NULL) != 0) {
        for (int i = 0; i < n; i++) {
            fc_job_run(jobs[i]);           /* no lock to be had: one at a time, here */
        }
        return;
    }
    for (int t = 1; t < width; t++) {
        started[t] = pthread_create(&th[t], NULL, job_thread, &q) == 0;   /* else: fewer workers */
    }
    drain_jobs(&q);
    for (int t = 1; t < width; t++) {
        if (started[t]) {
            pthread_join(th[t], NULL);
        }
    }
    pthread_mutex_destroy(&q.mu);
}

/* ---------------------------------------------------------------------------
 * Precompiled header. Every kernel starts with #include "fc_kernel.h", and
 * parsing it (with math.h and omp.h) is a good part of cc1's work on a small
 * kernel. With GCC the header is
 * compiled once per compiler, flags and header bytes (the key digest) into
 * <cache>/pch-<digest[0:16]>/fc_kernel.h.gch, and each kernel compile puts
 * that folder first on its include path: GCC takes the .gch it finds beside
 * the name it includes if it was made with the same options, else reads the
 * header. The generated code is the same either way.
 * A batch that is about to compile with no .gch there builds one in a job of
 * its own, run first, beside the kernels (on another core); kernels that
 * start before it is published read the header. A .gch GCC cannot read fails
 * the compile: the kernel is compiled again without it and the file removed
 * (compile_job.c). Clang reads no .gch on #include, and is never given one.
 * ------------------------------------------------------------------------- */

/* *out: the folder for this configuration's .gch (made if missing), or NULL
 * when there is to be none. GIL held. 0, or -1 with MemoryError. */
int
fc_pool_pch_folder(char **out)
{
    char hex[65];
    struct stat st;
    *out = NULL;
    if (!fc_state.cpu.pch || fc_state.cpu.pch_failed || !fc_state.cpu.include_dir || !fc_state.cpu.cc_line || strstr(fc_state.cpu.cc_line, "clang")) {
        return 0;
    }
    fc_sha256_hex(fc_state.cpu.digest, hex);
    char *dir = fc_cpu_fmt("%s/pch-%.16s", fc_state.cpu.cache_dir, hex);
    if (dir == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if ((mkdir(dir, 0700) < 0 && errno != EEXIST) || lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        free(dir);        /* compile without: the header is still there */
        return 0;
    }
    *out = dir;
    return 0;
}

/* Should this batch build the .gch: it is missing, and some job will compile
 * (always_compile, or no .so on disk for it)? GIL held. */
int
fc_pool_pch_wanted(const FcJob *jobs, int njobs)
{
    struct stat st;
    if (njobs == 0 || jobs[0].pch_gch == NULL || lstat(jobs[0].pch_gch, &st) == 0) {
        return 0;
    }
    for (int k = 0; k < njobs; k++) {
        if (!jobs[k].read_disk || lstat(jobs[k].so_path, &st) < 0) {
            return 1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Bundles. A compiler run has a fixed cost whatever it compiles (the driver,
 * cc1's start, loading the precompiled header, as and ld). When a batch has more
 * kernels to compile than there are workers, they are dealt out into one
 * bundle per worker and each bundle is compiled as one translation unit
 * (bundle_compile), which pays that once.
 * Dealing: the kernels that will compile (nothing on disk, or
 * always_compile) go longest first to the lightest bundle so far (LPT). A
 * bundle never gets two kernels of one symbol (they would clash in one
 * translation unit), and past FC_BUNDLE_MAX_WEIGHT a batch gets more bundles
 * than workers. A batch with bundles builds no precompiled header: building it
 * would hold up one worker longer than it saves the bundles' few runs. Only rendered kernels are
 * bundled (the caller's may_bundle: plan.c's kernels name everything at file
 * scope after their symbol, so two never clash), and only those whose
 * directives reach no further than the kernel (bundle_ok). Each kernel
 * keeps its own key, .c, .meta and .so name (a hard link to the bundle's
 * file), so the disk cache sees no difference. The compile_bundles knob
 * turns this off.
 * ------------------------------------------------------------------------- */

/* Whether source may share a translation unit with other kernels: its
 * directives are the kernel header's #include (first, at the start of its
 * line) and then only #pragma omp simd|parallel|barrier, #if, #else and
 * #endif, which reach no further than the kernel; nothing defines a macro,
 * brings in another file or sets a file-wide pragma. Anything that could
 * hide a directive from this scan (a '#' after other text on its line,
 * digraphs, trigraphs, _Pragma, form feeds) keeps the source alone. */
static int
bundle_ok(const char *source)
{
    static const char *const allowed[] = {"pragma omp simd", "pragma omp parallel",
                                          "pragma omp barrier", "if ", "else", "endif"};
    int includes = 0;
    if (strstr(source, "_Pragma") || strstr(source, "%:") || strstr(source, "?\?=")
        || strpbrk(source, "\f\v\r")) {
        return 0;
    }
    for (const char *p = source; *p;) {
        const char *q = p + strspn(p, " \t");
        size_t line = strcspn(p, "\n");
        const char *hash = memchr(p, '#', line);
        if (hash != NULL && hash != q) {
            return 0;                          /* a '#' after other text */
        }
        if (hash != NULL) {
            q += 1 + strspn(q + 1, " \t");
            if (strncmp(q, "include", 7) == 0) {
                if (includes++ > 0 || strncmp(p, FC_PCH_INCLUDE, strlen(FC_PCH_INCLUDE)) != 0) {
                    return 0;
                }
            }
            else {
                int ok = 0;
                for (size_t k = 0; k < sizeof(allowed) / sizeof(allowed[0]) && !ok; k++) {
                    ok = strncmp(q, allowed[k], strlen(allowed[k])) == 0;
                }
                if (!ok || includes == 0) {
                    return 0;
                }
            }
        }
        p += line + (p[line] == '\n');
    }
    return includes == 1;
}

/* Makes bundles of jobs[0..njobs) (see above) for `width` workers, if
 * may_bundle (fc_cpu_load_many's):
 * each bundle's first job leads it (members, nmembers), the others
 * are marked in_bundle. Out of memory, it makes none (each job compiles
 * alone, as without bundles). GIL held. Returns the number of bundles made. */
int
fc_pool_make_bundles(FcJob *jobs, int njobs, int width, int may_bundle)
{
    FcJob **cand = NULL;
    size_t *load = NULL, total = 0;
    int *group = NULL, *count = NULL, ncand = 0, nb, rc = -1, made = 0;   /* rc -1: out of memory */
    struct stat st;

    if (!may_bundle || !fc_state.cpu.bundles || njobs <= width) {
        return 0;
    }
    cand = PyMem_Calloc(njobs, sizeof(FcJob *));
    group = PyMem_Calloc(njobs, sizeof(int));
    if (cand == NULL || group == NULL) {
        goto cleanup;
    }
    for (int k = 0; k < njobs; k++) {
        FcJob *j = &jobs[k];
        if (bundle_ok(j->source) && (!j->read_disk || lstat(j->so_path, &st) < 0)) {
            cand[ncand++] = j;
            total += j->weight;
        }
    }
    if (ncand <= width) {
        rc = 0;
        goto cleanup;
    }
    nb = width;
    while (nb < ncand && total / (size_t)nb > FC_BUNDLE_MAX_WEIGHT) {
        nb++;
    }
    load = PyMem_Calloc(nb, sizeof(size_t));
    count = PyMem_Calloc(nb, sizeof(int));
    if (load == NULL || count == NULL) {
        goto cleanup;
    }
    qsort(cand, ncand, sizeof(FcJob *), fc_pool_cmp_heaviest);
    for (int c = 0; c < ncand; c++) {
        int best = -1;
        for (int b = 0; b < nb; b++) {
            int clash = 0;
            for (int o = 0; o < c && !clash; o++) {
                clash = group[o] == b && strcmp(cand[o]->symbol, cand[c]->symbol) == 0;
            }
            if (!clash && (best < 0 || load[b] < load[best])) {
                best = b;
            }
        }
        group[c] = best;           /* -1: a symbol in every bundle; it compiles alone */
        if (best >= 0) {
            load[best] += cand[c]->weight;
            count[best]++;
        }
    }
    for (int b = 0; b < nb; b++) {
        FcJob *lead = NULL;
        if (count[b] < 2) {
            continue;                  /* a bundle of one is a plain job */
        }
        made++;
        for (int c = 0; c < ncand; c++) {
            if (group[c] != b) {
                continue;
            }
            if (lead == NULL) {
                lead = cand[c];
                lead->members = malloc(count[b] * sizeof(FcJob *));   /* job_free frees it */
                if (lead->members == NULL) {
                    goto cleanup;
                }
            }
            else {
                cand[c]->in_bundle = 1;
            }
            lead->members[lead->nmembers++] = cand[c];
        }
    }
    rc = made;
cleanup:
    if (rc < 0) {                      /* out of memory: undo, no bundles */
        for (int k = 0; k < njobs; k++) {
            free(jobs[k].members);
            jobs[k].members = NULL;
            jobs[k].nmembers = jobs[k].in_bundle = 0;
        }
        rc = 0;
    }
    PyMem_Free(cand);
    PyMem_Free(group);
    PyMem_Free(load);
    PyMem_Free(count);
    return rc;
}
