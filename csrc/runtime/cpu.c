/* Runtime, CPU: the public API of the CPU kernel runtime (configure, load, stats, clear).
 * In: kernel source from gen_c, fastcompile.config. Out: FcLoaded (fn, .so/.c paths, key). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu.h"
#include "../state.h"
#include "disk.h"

/* cflags that would link crtfastmath.o (gcc's spec file) and so change MXCSR. */
static const char *const FC_FORBIDDEN_CFLAGS[] = {
    "-ffast-math", "-Ofast", "-funsafe-math-optimizations", "-mdaz-ftz",
};

#define FC_COMPILE_TIMEOUT_S 120   /* default; the config key "compile_timeout" overrides */

/* ---------------------------------------------------------------------------
 * Small string helpers (GIL-free). Files are in disk.c, processes in spawn.c.
 * ------------------------------------------------------------------------- */

/* malloc'd printf result, or NULL when out of memory */
char *
fc_cpu_fmt(const char *f, ...)
{
    char *s = NULL;
    va_list ap;
    va_start(ap, f);
    if (vasprintf(&s, f, ap) < 0) {
        s = NULL;
    }
    va_end(ap);
    return s;
}

static int
str_eq(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

/* ---------------------------------------------------------------------------
 * Warnings and the debug log (GIL held).
 * ------------------------------------------------------------------------- */

/* RuntimeWarning; returns -1 if a warnings filter turned it into an error. */
int
fc_cpu_warn(const char *msg)
{
    return PyErr_WarnEx(PyExc_RuntimeWarning, msg, 1);
}

/* FASTCOMPILE_DEBUG >= 1: through logging.getLogger("fastcompile") when
 * logging is set up, else straight to stderr. Call with no exception set;
 * never raises. */
void
fc_cpu_log_debug(const char *f, ...)
{
    char msg[1024];
    va_list ap;
    PyObject *logging = NULL, *logger = NULL, *has = NULL, *res = NULL;

    va_start(ap, f);
    vsnprintf(msg, sizeof(msg), f, ap);
    va_end(ap);
    logging = PyImport_ImportModule("logging");
    if (logging == NULL) {
        goto fallback;
    }
    logger = PyObject_CallMethod(logging, "getLogger", "s", "fastcompile");
    has = logger ? PyObject_CallMethod(logger, "hasHandlers", NULL) : NULL;
    if (has == NULL || !PyObject_IsTrue(has)) {
        goto fallback;
    }
    res = PyObject_CallMethod(logger, "info", "s", msg);
    if (res != NULL) {
        goto cleanup;
    }
fallback:
    PyErr_Clear();
    PySys_FormatStderr("fastcompile: %s\n", msg);
cleanup:
    PyErr_Clear();
    Py_XDECREF(res);
    Py_XDECREF(has);
    Py_XDECREF(logger);
    Py_XDECREF(logging);
}


/* ---------------------------------------------------------------------------
 * Public API
 * ------------------------------------------------------------------------- */

/* cfg[name] (str or os.PathLike) as a malloc'd UTF-8 string in *out; missing
 * or None -> NULL. 0, or -1 with an exception set. */
static int
cfg_str(PyObject *cfg, const char *name, char **out)
{
    PyObject *v = PyDict_GetItemString(cfg, name);   /* borrowed */
    PyObject *path = NULL;
    const char *s;
    int rc = -1;
    *out = NULL;
    if (v == NULL || v == Py_None) {
        return 0;
    }
    path = PyOS_FSPath(v);
    if (path == NULL) {
        PyErr_Format(PyExc_TypeError, "fastcompile config '%s' must be a str, not %.100s", name,
                     Py_TYPE(v)->tp_name);
        goto cleanup;
    }
    s = PyUnicode_Check(path) ? PyUnicode_AsUTF8(path) : PyBytes_AsString(path);
    if (s == NULL) {
        goto cleanup;
    }
    *out = strdup(s);
    if (*out == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    rc = 0;
cleanup:
    Py_XDECREF(path);
    return rc;
}

/* cfg[name] as an int in *out; missing or None -> dflt. 0, or -1 with an exception. */
static int
cfg_int(PyObject *cfg, const char *name, long dflt, long *out)
{
    PyObject *v = PyDict_GetItemString(cfg, name);   /* borrowed */
    *out = dflt;
    if (v == NULL || v == Py_None) {
        return 0;
    }
    if (PyBool_Check(v)) {
        *out = v == Py_True;
        return 0;
    }
    *out = PyLong_AsLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* cfg: borrowed dict. Keys: cc, cflags, include_dir, cache_dir (required), version,
 * dump_dir (str or None), always_compile (bool), debug (int), and optionally
 * compile_timeout (seconds, default 120), pch and compile_bundles (bools,
 * default on). */
FC_INTERNAL int
fc_cpu_configure(PyObject *cfg)
{
    char *cc = NULL, *cflags = NULL, *include_dir = NULL, *cache_req = NULL;
    char *version = NULL, *dump_dir = NULL;
    char **flagv = NULL;
    long always_compile, debug, timeout_s, pch, bundles;
    int rc = -1;

    if (!PyDict_Check(cfg)) {
        PyErr_SetString(PyExc_TypeError, "fastcompile: the CPU runtime config must be a dict");
        goto cleanup;
    }
    if (cfg_str(cfg, "cc", &cc) < 0 || cfg_str(cfg, "cflags", &cflags) < 0
        || cfg_str(cfg, "include_dir", &include_dir) < 0
        || cfg_str(cfg, "cache_dir", &cache_req) < 0 || cfg_str(cfg, "version", &version) < 0
        || cfg_str(cfg, "dump_dir", &dump_dir) < 0
        || cfg_int(cfg, "always_compile", 0, &always_compile) < 0
        || cfg_int(cfg, "debug", 0, &debug) < 0 || cfg_int(cfg, "pch", 1, &pch) < 0
        || cfg_int(cfg, "compile_bundles", 1, &bundles) < 0
        || cfg_int(cfg, "compile_timeout", FC_COMPILE_TIMEOUT_S, &timeout_s) < 0) {
        goto cleanup;
    }
    if (timeout_s <= 0 || timeout_s > 86400) {
        PyErr_Format(PyExc_ValueError, "fastcompile: compile_timeout must be 1..86400 s, not %ld",
                     timeout_s);
        goto cleanup;
    }
    if (cache_req == NULL) {
        /* the default folder ($XDG_CACHE_HOME, ~/.cache) is config.py's to resolve */
        PyErr_SetString(PyExc_ValueError, "fastcompile: the CPU runtime config needs cache_dir "
                        "(fastcompile.config.resolved() gives it)");
        goto cleanup;
    }
    char *save = NULL;
    for (char *f = cflags ? strtok_r(cflags, " \t\r\n", &save) : NULL; f;
         f = strtok_r(NULL, " \t\r\n", &save)) {
        for (size_t i = 0; i < sizeof(FC_FORBIDDEN_CFLAGS) / sizeof(char *); i++) {
            if (strcmp(f, FC_FORBIDDEN_CFLAGS[i]) == 0) {
                PyErr_Format(PyExc_ValueError, "fastcompile: cflags may not contain %s: it links "
                             "crtfastmath.o, which sets flush-to-zero for the whole process",
                             f);
                goto cleanup;
            }
        }
        if (fc_disk_strv_push(&flagv, f) < 0) {
            PyErr_NoMemory();
            goto cleanup;
        }
    }

    /* commit: nothing below can fail */
    if (!str_eq(cache_req, fc_state.cpu.cache_req)) {
        fc_kcache_drop_dir();
    }
#define FC_SWAP(field, val) \
    do {                    \
        free(fc_state.cpu.field);     \
        fc_state.cpu.field = (val);   \
        (val) = NULL;       \
    } while (0)
    FC_SWAP(cc, cc);
    FC_SWAP(include_dir, include_dir);
    FC_SWAP(cache_req, cache_req);
    FC_SWAP(version, version);
    FC_SWAP(dump_dir, dump_dir);
#undef FC_SWAP
    fc_disk_strv_free(fc_state.cpu.cflags);
    fc_state.cpu.cflags = flagv;
    flagv = NULL;
    fc_state.cpu.always_compile = always_compile != 0;
    fc_state.cpu.debug = (int)debug;
    fc_state.cpu.pch = pch != 0;
    fc_state.cpu.bundles = bundles != 0;
    fc_state.cpu.pch_failed = 0;
    fc_state.cpu.timeout_s = (int)timeout_s;
    fc_state.cpu.have_digest = 0;   /* compiler, flags or headers may have changed */
    fc_state.cpu.configured = 1;
    rc = 0;
cleanup:
    free(cc);
    free(cflags);
    free(include_dir);
    free(cache_req);
    free(version);
    free(dump_dir);
    fc_disk_strv_free(flagv);
    return rc;
}

/* Copies the source to <dump_dir>/<key>.c (FASTCOMPILE_DUMP_DIR). A failure
 * is a warning, not an error. GIL held; -1 only if the warning raised. */
static int
dump_source(const char *key, const char *source)
{
    char *path = NULL, *msg = NULL;
    int rc = 0;
    if (fc_disk_mkdir_p(fc_state.cpu.dump_dir, 0777) < 0
        || (path = fc_cpu_fmt("%s/%s.c", fc_state.cpu.dump_dir, key)) == NULL
        || fc_disk_write_atomic(path, source, strlen(source), 0644) < 0) {
        msg = fc_cpu_fmt("fastcompile: cannot dump the kernel source to %s: %s", fc_state.cpu.dump_dir,
                  strerror(errno));
        rc = msg ? fc_cpu_warn(msg) : 0;
    }
    free(path);
    free(msg);
    return rc;
}

/* After job j ran: its counters, log lines and warnings; on success a table
 * entry for its key and symbol (or the one another thread registered
 * meanwhile) in *out.
 * GIL held. 0, or -1 with an exception set. */
static int
job_finish(FcJob *j, FcEntry **out)
{
    const char *key = j->key, *symbol = j->symbol;
    FcEntry *e;
    fc_state.cpu.compiles += j->compiled;
    fc_state.cpu.compiler_runs += j->runs;
    fc_state.cpu.disk_hits += j->disk_hit;
    if (fc_state.cpu.debug >= 1) {
        if (j->disk_hit) {
            fc_cpu_log_debug("cpu kernel %s: memory miss, disk hit %s", symbol, j->so_path);
        }
        else if (j->compiled) {
            char with[48] = "";
            if (j->bundled > 1) {
                snprintf(with, sizeof(with), " (one compiler run for %d kernels)", j->bundled);
            }
            fc_cpu_log_debug("cpu kernel %s: cache miss (%s), compiled in %.0f ms%s -> %s", symbol,
                      fc_state.cpu.always_compile ? "always_compile" : "memory and disk", j->compile_ms,
                      with, j->loaded_path ? j->loaded_path : "(failed)");
        }
    }
    for (int i = 0; i < j->nwarn; i++) {
        if (fc_cpu_warn(j->warnings[i]) < 0) {
            return -1;
        }
    }
    if (j->err != FC_JOB_OK) {
        if (j->err == FC_JOB_NOMEM || j->errmsg.failed || j->errmsg.s == NULL) {
            PyErr_NoMemory();
        }
        else {
            PyErr_SetString(PyExc_RuntimeError, j->errmsg.s);
        }
        return -1;
    }
    /* another thread may have loaded the same kernel while the GIL was released */
    e = fc_kcache_find(key, symbol);
    if (e == NULL) {
        e = calloc(1, sizeof(FcEntry));
        if (e == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        e->next = fc_state.cpu.entries;
        fc_state.cpu.entries = e;
        e->key = strdup(key);
        e->symbol = strdup(symbol);
        e->so_path = j->loaded_path;          /* ownership moves to the entry */
        j->loaded_path = NULL;
        e->c_path = j->c_path;
        j->c_path = NULL;
        e->handle = j->handle;
        e->fn = j->fn;
        e->dev = j->dev;
        e->ino = j->ino;
        e->via_alias = j->via_alias;
        if (!e->key || !e->symbol || fc_kcache_insert(e) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_NoMemory();
            }
            return -1;
        }
    }
    *out = e;
    return 0;
}


FC_INTERNAL int
fc_cpu_load_many(int n, const char *const *sources, const char *const *symbols, int may_bundle,
                 FcLoaded *outs)
{
    FcJob *jobs = NULL;                     /* the kernels' jobs, then the header's (pch_job) */
    FcJob **order = NULL;                   /* the order they run in */
    FcEntry **found = NULL, **made = NULL;  /* per item; per job (its entry once finished) */
    char (*keys)[65] = NULL;
    char *pch = NULL;
    PyObject *et = NULL, *ev = NULL, *etb = NULL;   /* owned: the first job's failure, raised at the end */
    int *job_of = NULL, njobs = 0, pch_job = 0, rc = -1, cap = n > 0 ? n : 1;   /* cap: no zero-size allocations */

    if (!fc_state.cpu.configured) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: the CPU runtime is not configured "
                        "(fastcompile._C._configure was never called)");
        return -1;
    }
    /* the key needs the compiler's identity, which is cached in the cache dir */
    if (!fc_state.cpu.have_digest && (fc_kcache_ensure_dir() < 0 || fc_ckey_ensure_identity() < 0)) {
        return -1;
    }
    jobs = PyMem_Calloc(cap + 1, sizeof(FcJob));
    order = PyMem_Calloc(cap + 1, sizeof(FcJob *));
    found = PyMem_Calloc(cap, sizeof(FcEntry *));
    keys = PyMem_Calloc(cap, sizeof(*keys));
    job_of = PyMem_Calloc(cap, sizeof(int));
    made = PyMem_Calloc(cap, sizeof(FcEntry *));
    if (jobs == NULL || order == NULL || found == NULL || keys == NULL || job_of == NULL
        || made == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (int i = 0; i < n; i++) {
        fc_ckey_kernel(sources[i], keys[i]);
        job_of[i] = -1;
        found[i] = fc_kcache_find(keys[i], symbols[i]);
        if (found[i] != NULL) {
            fc_state.cpu.memory_hits++;
            continue;
        }
        for (int k = 0; k < i && job_of[i] < 0; k++) {       /* the same kernel twice in one batch */
            if (job_of[k] >= 0 && strcmp(keys[k], keys[i]) == 0 && strcmp(symbols[k], symbols[i]) == 0) {
                job_of[i] = job_of[k];
            }
        }
        if (job_of[i] >= 0) {
            continue;
        }
        /* re-check the folder right before trusting what is in it */
        if (fc_kcache_ensure_dir() < 0 || (njobs == 0 && fc_pool_pch_folder(&pch) < 0)
            || fc_job_prepare(&jobs[njobs], sources[i], symbols[i], keys[i], pch) < 0) {
            njobs++;                                           /* job_free for the partial one */
            goto cleanup;
        }
        job_of[i] = njobs++;
    }
    if (njobs > 0) {
        int nrun = 0, bundles = fc_pool_make_bundles(jobs, njobs, fc_pool_width(), may_bundle);
        /* with bundles, no header build: each run parses the header once anyway */
        if (bundles == 0 && fc_pool_pch_wanted(jobs, njobs)) {
            pch_job = 1;
            if (fc_job_prepare_pch(&jobs[njobs], pch) < 0) {
                goto cleanup;
            }
            order[nrun++] = &jobs[njobs];
        }
        int first_kernel = nrun;
        for (int k = 0; k < njobs; k++) {
            if (!jobs[k].in_bundle) {
                order[nrun++] = &jobs[k];
            }
        }
        /* heaviest first (source bytes, a proxy for compile time): the last
         * job to start is a light one, so the cores finish close together */
        qsort(&order[first_kernel], nrun - first_kernel, sizeof(FcJob *), fc_pool_cmp_heaviest);
        Py_BEGIN_ALLOW_THREADS
        fc_pool_run(order, nrun);
        Py_END_ALLOW_THREADS
        if (pch_job) {
            FcJob *h = &jobs[njobs];
            fc_state.cpu.pch_failed = h->err != FC_JOB_OK;
            if (fc_state.cpu.debug >= 1) {
                fc_cpu_log_debug("precompiled header %s: %s (%.0f ms)", h->pch_gch,
                          h->err == FC_JOB_OK ? "built" : h->errmsg.s ? h->errmsg.s : "failed",
                          h->compile_ms);
            }
        }
    }
    /* every job is finished, failed or not, so the kernels that did compile
     * are usable (outs[i]) even when another one failed; a kernel twice in
     * the batch shares its job */
    int compiled = 0;                         /* did this batch compile anything */
    for (int j = 0; j < njobs; j++) {
        compiled |= jobs[j].compiled;
        if (job_finish(&jobs[j], &made[j]) < 0) {
            if (et == NULL) {
                PyErr_Fetch(&et, &ev, &etb);
            }
            else {
                PyErr_Clear();
            }
        }
    }
    fc_state.cpu.compile_batches += compiled;
    for (int i = 0; i < n; i++) {
        if (found[i] == NULL) {
            found[i] = made[job_of[i]];
        }
    }
    if (fc_state.cpu.dump_dir) {
        for (int i = 0; i < n; i++) {
            if (job_of[i] >= 0 && dump_source(keys[i], sources[i]) < 0) {
                goto cleanup;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof(outs[i]));
        if (found[i] != NULL) {
            outs[i].fn = found[i]->fn;
            outs[i].so_path = found[i]->so_path;
            outs[i].c_path = found[i]->c_path;
            outs[i].key = found[i]->key;
        }
    }
    if (et != NULL) {
        PyErr_Restore(et, ev, etb);           /* steals the references */
        et = ev = etb = NULL;
        goto cleanup;
    }
    rc = 0;
cleanup:
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(etb);
    for (int k = 0; jobs != NULL && k < njobs + pch_job; k++) {
        fc_job_free(&jobs[k]);
    }
    PyMem_Free(jobs);
    PyMem_Free(order);
    free(pch);
    PyMem_Free(found);
    PyMem_Free(keys);
    PyMem_Free(job_of);
    PyMem_Free(made);
    return rc;
}

FC_INTERNAL int
fc_cpu_load(const char *source, const char *symbol, FcLoaded *out)
{
    return fc_cpu_load_many(1, &source, &symbol, 0, out);
}

/* returns: new reference */
FC_INTERNAL PyObject *
fc_cpu_stats(void)
{
    const char *dir = fc_state.cpu.cache_dir ? fc_state.cpu.cache_dir : fc_state.cpu.cache_req;
    return Py_BuildValue("{sLsLsLsLsLsz}", "compiles", fc_state.cpu.compiles, "compiler_runs",
                         fc_state.cpu.compiler_runs, "compile_batches", fc_state.cpu.compile_batches, "disk_hits",
                         fc_state.cpu.disk_hits, "memory_hits", fc_state.cpu.memory_hits, "cache_dir", dir);
}

/* The table forgets its entries but they are not freed and their .so files
 * are not dlclose'd: compiled graphs may still hold fn and the path strings,
 * and unmapping code that another thread is running crashes. They are
 * reclaimed by fc_cpu_free (module teardown), or the OS. */
FC_INTERNAL int
fc_cpu_cache_clear(int disk)
{
    free(fc_state.cpu.slots);
    fc_state.cpu.slots = NULL;
    fc_state.cpu.cap = fc_state.cpu.used = 0;
    if (!disk) {
        return 0;
    }
    if (!fc_state.cpu.configured) {
        return 0;
    }
    if (fc_kcache_ensure_dir() < 0) {
        return -1;
    }
    if (fc_disk_clear_dir(fc_state.cpu.cache_dir, 0) < 0) {
        PyErr_Format(PyExc_OSError, "fastcompile: could not empty the cache %s: %s",
                     fc_state.cpu.cache_dir, strerror(errno));
        return -1;
    }
    return 0;
}

FC_INTERNAL void
fc_cpu_free(void)
{
    fc_kcache_drop_dir();
    free(fc_state.cpu.cc);
    free(fc_state.cpu.include_dir);
    free(fc_state.cpu.cache_req);
    free(fc_state.cpu.version);
    free(fc_state.cpu.dump_dir);
    fc_disk_strv_free(fc_state.cpu.cflags);
    free(fc_state.cpu.cc_abs);
    free(fc_state.cpu.cc_line);
    free(fc_state.cpu.slots);
    while (fc_state.cpu.entries) {
        FcEntry *next = fc_state.cpu.entries->next;
        fc_kcache_entry_free(fc_state.cpu.entries);
        fc_state.cpu.entries = next;
    }
    memset(&fc_state.cpu, 0, sizeof(fc_state.cpu));
}

/* _C._cpu_load(source, symbol) -> {"so_path", "c_path", "key", "fn"} (tests).
 * self, args: borrowed; returns: new reference. */
FC_INTERNAL PyObject *
fc_cpu_py_load(PyObject *self, PyObject *args)
{
    const char *source, *symbol;
    FcLoaded out;
    if (!PyArg_ParseTuple(args, "ss:_cpu_load", &source, &symbol)) {
        return NULL;
    }
    if (fc_cpu_load(source, symbol, &out) < 0) {
        return NULL;
    }
    return Py_BuildValue("{sssssssN}", "so_path", out.so_path, "c_path", out.c_path, "key",
                         out.key, "fn", PyLong_FromVoidPtr((void *)out.fn));
}

/* _C._cpu_load_many([(source, symbol), ...]) -> [{"so_path", "c_path", "key",
 * "fn"}, ...] (tests): one fc_cpu_load_many batch; raises its first failure.
 * self, arg: borrowed; returns: new reference. */
FC_INTERNAL PyObject *
fc_cpu_py_load_many(PyObject *self, PyObject *arg)
{
    PyObject *items = NULL, *res = NULL;   /* owned */
    const char **srcs = NULL, **syms = NULL;
    FcLoaded *outs = NULL;
    Py_ssize_t n;
    (void)self;
    /* a tuple of our own: the strings stay alive while the GIL is released */
    items = PySequence_Tuple(arg);
    if (items == NULL) {
        return NULL;
    }
    n = PyTuple_GET_SIZE(items);
    if (n > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "_cpu_load_many: too many kernels");
        goto cleanup;
    }
    srcs = PyMem_Calloc(n ? n : 1, sizeof(char *));
    syms = PyMem_Calloc(n ? n : 1, sizeof(char *));
    outs = PyMem_Calloc(n ? n : 1, sizeof(FcLoaded));
    if (srcs == NULL || syms == NULL || outs == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyTuple_GET_ITEM(items, i);    /* borrowed */
        if (!PyTuple_Check(it) || !PyArg_ParseTuple(it, "ss:_cpu_load_many", &srcs[i], &syms[i])) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "_cpu_load_many takes (source, symbol) tuples");
            }
            goto cleanup;
        }
    }
    if (fc_cpu_load_many((int)n, srcs, syms, 1, outs) < 0) {
        goto cleanup;
    }
    res = PyList_New(n);
    for (Py_ssize_t i = 0; res != NULL && i < n; i++) {
        PyObject *d = Py_BuildValue("{sssssssN}", "so_path", outs[i].so_path, "c_path",
                                    outs[i].c_path, "key", outs[i].key, "fn",
                                    PyLong_FromVoidPtr((void *)outs[i].fn));
        if (d == NULL) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, i, d);    /* steals d */
    }
cleanup:
    Py_XDECREF(items);
    PyMem_Free(srcs);
    PyMem_Free(syms);
    PyMem_Free(outs);
    return res;
}
