/* Runtime, CPU: C source text -> shared object in a private disk cache -> loaded kernel.
 * In: kernel source from gen_c, fastcompile.config. Out: FcLoaded (fn, .so/.c paths, key). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <pthread.h>
#include <unistd.h>

#include "../core/strbuf.h"
#include "cpu.h"
#include "disk.h"
#include "sha256.h"

/* The kernel compile line:
 *     cc FC_FLAGS [-mprefer-vector-width=N -DFC_VECTOR_BITS=N] [-I<pch dir>] -I<include_dir> <cflags>
 *        -o OUT SRC FC_LIBS
 * Never -ffast-math/-Ofast: they link crtfastmath.o, which sets FTZ/DAZ in MXCSR
 * for the whole process when the .so is loaded. -nostartfiles leaves out the
 * crt*.o files altogether (crtfastmath.o is one; kernels need none of them):
 * no constructor or destructor runs from a kernel .so, so loading cannot
 * touch MXCSR and exit never runs code from a kernel file that someone
 * truncated under us. -O2, not -O3: the hot loops carry `omp simd` and are
 * vectorized either way, and -O2 compiles reduction kernels about 2x faster.
 * -nodefaultlibs: the driver's default -lgcc_s -lc (linker scripts naming
 * several libraries) made linking take 20 ms instead of 12; FC_LIBS names
 * libgcc (static helpers) again, and libc's symbols (memcpy) resolve at load
 * time through libm's and libgomp's own dependency on it.
 * -mprefer-vector-width (x86-64, vector_width_flags): GCC's tuning for AMD Zen 1
 * (which runs 256-bit ops as two halves) prefers 128-bit vectors even with
 * AVX2, and then calls libmvec's SSE4 variants (_ZGVbN4v_expf), which have no
 * FMA; with 256-bit vectors the AVX2 variants are called: softmax and
 * x*sigmoid(x)*y ran about 1.4x faster on Zen 1 (float32 exp was libmvec's
 * then; it is inline since, but float64 exp, log, sin, ... still call it). GCC 12 tunes every AVX-512
 * CPU for 256-bit vectors, because Intel's first AVX-512 cores lower their
 * clock under 512-bit work; AMD's (Zen 4 on) keep it, and there 512 bits
 * make arithmetic-heavy kernels faster: on Zen 4, 2 threads, GELU 1e5
 * 33 -> 26.5 us, x*sigmoid(x)*y 1e7 4.0 -> 3.4 ms, layernorm 1e7 2.9 -> 2.4 ms.
 * Intel's cores from Ice Lake on (the first with AVX512-VBMI2) lower their
 * clock little or not at all under 512-bit work, and torch's own kernels run
 * 512-bit there: on an Emerald Rapids Xeon (GCC 12 takes it for Cooper Lake),
 * 2 threads, 512 bits made GELU 1e6 1.19 -> 0.56 ms, silu 1e7 4.85 -> 3.61 ms,
 * softmax 1e7 8.1 -> 6.3 ms, a column sum 1e7 2.8 -> 2.1 ms; a plain add
 * (memory-bound) was unchanged. So AMD CPUs with AVX-512 and Intel CPUs with
 * AVX512-VBMI2 get 512; every other x86-64 CPU (Skylake-X, Cascade Lake and
 * Cooper Lake among the AVX-512 ones) gets 256.
 * -DFC_VECTOR_BITS tells fc_kernel.h the same width: reductions take one
 * register of float32 as their lane count (FC_LANES; gen_c.c, sweep_lanes_wide). */
static const char *const FC_FLAGS[] = {
    "-O2", "-march=native", "-std=c11", "-fPIC", "-shared", "-fopenmp",
    "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fwrapv",
    "-fvisibility=hidden", "-nostartfiles", "-nodefaultlibs",
};
static const char *const FC_LIBS[] = {"-lmvec", "-lm", "-lgcc"};
#define FC_PCH_HEADER "fc_kernel.h"   /* what every kernel includes first; see pch_folder */
#define FC_PCH_INCLUDE "#include \"" FC_PCH_HEADER "\""
#define FC_NFLAGS ((int)(sizeof(FC_FLAGS) / sizeof(FC_FLAGS[0])))
#define FC_NLIBS ((int)(sizeof(FC_LIBS) / sizeof(FC_LIBS[0])))

/* The vector-width flags for the CPU this process runs on (see the compile
 * line's comment above): a NULL-terminated static array, or NULL where there
 * are none to give. */
static const char *const *
vector_width_flags(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static const char *const w512[] = {"-mprefer-vector-width=512", "-DFC_VECTOR_BITS=512", NULL};
    static const char *const w256[] = {"-mprefer-vector-width=256", "-DFC_VECTOR_BITS=256", NULL};
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") &&
        (__builtin_cpu_is("amd") || (__builtin_cpu_is("intel") && __builtin_cpu_supports("avx512vbmi2")))) {
        return w512;
    }
    return w256;
#else
    return NULL;
#endif
}

/* cflags that would link crtfastmath.o (gcc's spec file) and so change MXCSR. */
static const char *const FC_FORBIDDEN_CFLAGS[] = {
    "-ffast-math", "-Ofast", "-funsafe-math-optimizations", "-mdaz-ftz",
};

#define FC_COMPILE_TIMEOUT_S 120   /* default; the config key "compile_timeout" overrides */
#define FC_PROBE_TIMEOUT_S 30      /* cc --version */
#define FC_LOG_MAX (1 << 20)       /* compiler output kept for the error message */
#define FC_META_WAIT_READ_MS 100   /* a reader waits this long for a .meta mid-publish */
#define FC_META_WAIT_PUBLISH_MS 2000
#define FC_PUBLISH_TRIES 3

/* ---------------------------------------------------------------------------
 * Runtime state: the one piece of mutable global state in this file.
 * Touched only with the GIL held; a load releases the GIL only around work on
 * an FcJob, which owns copies of everything it needs.
 * ------------------------------------------------------------------------- */

typedef struct FcEntry {
    struct FcEntry *next;   /* rt.entries: every entry ever made, freed by fc_cpu_free */
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

static struct {
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
    int bundles;            /* compile a batch's kernels several to a compiler run (see make_bundles) */
    int timeout_s;
    /* derived lazily from the configuration; reset by fc_cpu_configure */
    char *cache_dir;        /* the folder in use, checked private; NULL until first use */
    int cache_is_fallback;  /* cache_dir is our own mkdtemp, removed when we leave it */
    char *cc_abs;           /* absolute compiler path */
    char *cc_line;          /* first line of `cc --version` */
    int have_digest;
    uint8_t digest[32];     /* sha256 of every key component but the source */
    /* kernel table: open addressing over rt.entries, keyed by (key, symbol) */
    FcEntry **slots;
    size_t cap, used;
    FcEntry *entries;
    int pch_failed;         /* a build failed in this process: not tried again */
    /* counters, never reset (tests diff them) */
    long long compiles, disk_hits, memory_hits;   /* compiles: kernels compiled */
    long long compiler_runs;                      /* compiler processes run for kernels */
    long long compile_batches;                    /* fc_cpu_load_many calls that compiled */
} rt;

/* ---------------------------------------------------------------------------
 * Small string helpers (GIL-free). Files and processes are in disk.c.
 * ------------------------------------------------------------------------- */

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));

/* malloc'd printf result, or NULL when out of memory */
static char *
fmt(const char *f, ...)
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

/* The first line of s (without the newline), copied; NULL when out of memory. */
static char *
first_line(const char *s)
{
    size_t n = strcspn(s, "\r\n");
    return strndup(s, n);
}

/* ---------------------------------------------------------------------------
 * Warnings and the debug log (GIL held).
 * ------------------------------------------------------------------------- */

/* RuntimeWarning; returns -1 if a warnings filter turned it into an error. */
static int
warn(const char *msg)
{
    return PyErr_WarnEx(PyExc_RuntimeWarning, msg, 1);
}

/* FASTCOMPILE_DEBUG >= 1: through logging.getLogger("fastcompile") when
 * logging is set up, else straight to stderr. Call with no exception set;
 * never raises. */
static void log_debug(const char *f, ...) __attribute__((format(printf, 1, 2)));

static void
log_debug(const char *f, ...)
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
 * The cache folder: private (0700, ours, not a symlink), never the CWD.
 * ------------------------------------------------------------------------- */

/* $XDG_CACHE_HOME/fastcompile, ~/.cache/fastcompile, /tmp/fastcompile-uid<N>. */
static char *
default_cache_dir(void)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (xdg && xdg[0] == '/') {
        return fmt("%s/fastcompile", xdg);
    }
    if (home && home[0] == '/') {
        return fmt("%s/.cache/fastcompile", home);
    }
    return fmt("/tmp/fastcompile-uid%ld", (long)geteuid());
}

/* Forget the folder in use; a private fallback of ours is deleted with it
 * (kernels loaded from it stay mapped). */
static void
drop_cache_dir(void)
{
    if (rt.cache_dir && rt.cache_is_fallback) {
        fc_disk_clear_dir(rt.cache_dir, 1);
    }
    free(rt.cache_dir);
    rt.cache_dir = NULL;
    rt.cache_is_fallback = 0;
}

/* Makes rt.cache_dir a checked private folder, re-checking one already chosen
 * (another process could have changed it since). An unsafe folder is refused
 * with a RuntimeWarning naming the reason, and a fresh mkdtemp folder is used
 * instead. GIL held. Returns 0, or -1 with an exception set. */
static int
ensure_cache_dir(void)
{
    char why[512];
    char tmpl[] = "/tmp/fastcompile-XXXXXX";
    char *want = NULL, *msg = NULL;
    int rc = -1;

    if (rt.cache_dir && fc_disk_check_private(rt.cache_dir, why, sizeof(why)) == 0) {
        return 0;
    }
    /* first use, or the folder went bad since: resolve the request again */
    want = rt.cache_req ? strdup(rt.cache_req) : default_cache_dir();
    if (want == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (size_t n = strlen(want); n > 1 && want[n - 1] == '/'; n--) {
        want[n - 1] = '\0';   /* "link/" would make lstat follow the link */
    }
    drop_cache_dir();
    if (want[0] != '/') {
        snprintf(why, sizeof(why), "it is not an absolute path (the cache is never the CWD)");
    }
    else if (fc_disk_mkdir_p(want, 0700) < 0) {
        snprintf(why, sizeof(why), "cannot create it: %s", strerror(errno));
    }
    else if (fc_disk_check_private(want, why, sizeof(why)) == 0) {
        rt.cache_dir = want;
        want = NULL;
        rc = 0;
        goto cleanup;
    }
    if (mkdtemp(tmpl) == NULL) {
        PyErr_Format(PyExc_RuntimeError, "fastcompile: cache dir %s refused (%s), and no private "
                     "fallback could be made: mkdtemp: %s", want, why, strerror(errno));
        goto cleanup;
    }
    rt.cache_dir = strdup(tmpl);
    if (rt.cache_dir == NULL) {
        rmdir(tmpl);
        PyErr_NoMemory();
        goto cleanup;
    }
    rt.cache_is_fallback = 1;
    msg = fmt("fastcompile: refusing cache dir %s (%s); using the private folder %s for this "
              "process instead", want, why, tmpl);
    if (msg == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    rc = warn(msg);
cleanup:
    free(want);
    free(msg);
    return rc;
}

/* For the CUDA runtime, which keeps cubins in the same folder (same shards,
 * so cache_clear removes them too). GIL held. */
const char *
fc_cpu_cache_dir(void)
{
    return ensure_cache_dir() < 0 ? NULL : rt.cache_dir;
}

const char *
fc_cpu_include_dir(void)
{
    return rt.include_dir;
}

const char *
fc_cpu_version(void)
{
    return rt.version ? rt.version : "0";
}

/* ---------------------------------------------------------------------------
 * Key components: the compiler's identity, the CPU's, the shipped headers.
 * ------------------------------------------------------------------------- */

/* The first line of `cc --version`. Probing costs a process spawn, so the
 * answer is kept in <cache>/compiler-<hash>.id, keyed by the compiler file's
 * path, inode, size and times: a warm start spawns nothing. GIL held.
 * Returns a malloc'd line, or NULL with an exception set. */
static char *
compiler_line(const char *cc_abs)
{
    struct stat st;
    char hex[65], *id_path = NULL, *real = NULL, *text = NULL, *line = NULL, *stored = NULL;
    char **argv = NULL, **envp = NULL;
    FcStr ident = {0};
    size_t n;
    int fd = -1, status, timed_out;

    real = realpath(cc_abs, NULL);
    if (real == NULL || stat(real, &st) < 0) {
        PyErr_Format(PyExc_RuntimeError, "fastcompile: cannot stat the C compiler %s: %s",
                     cc_abs, strerror(errno));
        goto cleanup;
    }
    fc_str_printf(&ident, "%s\n%s\n%llu %llu %lld %lld.%09ld %lld.%09ld", cc_abs, real,
                  (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                  (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                  (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
    if (ident.failed) {
        PyErr_NoMemory();
        goto cleanup;
    }
    fc_sha256_hex_of(ident.s, ident.len, hex);
    id_path = fmt("%s/compiler-%.16s.id", rt.cache_dir, hex);
    if (id_path == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    if (fc_disk_read_all(id_path, 4096, &text, &n) == 0 && n > 0) {
        line = first_line(text);
        if (line == NULL) {
            PyErr_NoMemory();
        }
        goto cleanup;
    }

    /* not known yet: ask the compiler */
    fd = memfd_create("fastcompile-cc-version", MFD_CLOEXEC);
    envp = fc_disk_scrubbed_env();
    if (fd < 0 || envp == NULL || fc_disk_strv_push(&argv, cc_abs) < 0
        || fc_disk_strv_push(&argv, "--version") < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto cleanup;
    }
    /* the GIL stays held: a few ms once per compiler, and rt.cc_abs must not
     * change under us */
    int rc = fc_disk_spawn_wait(argv, envp, fd, FC_PROBE_TIMEOUT_S, &status, &timed_out);
    if (rc < 0 || timed_out || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        PyErr_Format(PyExc_RuntimeError, "fastcompile: `%s --version` failed (%s)", cc_abs,
                     rc < 0 ? strerror(errno) : timed_out ? "timed out" : "nonzero exit");
        goto cleanup;
    }
    off_t len = lseek(fd, 0, SEEK_END);
    free(text);
    text = calloc(1, len > 0 && len < 65536 ? (size_t)len + 1 : 65537);
    if (text == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    if (pread(fd, text, len > 0 && len < 65536 ? (size_t)len : 65536, 0) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto cleanup;
    }
    line = first_line(text);
    if (line == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    stored = fmt("%s\n", line);
    if (stored != NULL) {
        /* best effort: else we re-probe */
        fc_disk_write_atomic(id_path, stored, strlen(stored), 0600);
    }
cleanup:
    if (fd >= 0) {
        close(fd);
    }
    fc_disk_strv_free(argv);
    fc_disk_strv_free(envp);
    fc_str_free(&ident);
    free(real);
    free(id_path);
    free(text);
    free(stored);
    return line;
}

/* Feeds one length-prefixed field into the key hash, so that no two
 * different field lists hash the same bytes. */
static void
key_field(FcSha256 *s, const char *name, const void *data, size_t n)
{
    char head[96];
    int h = snprintf(head, sizeof(head), "%s:%zu:", name, n);
    fc_sha256_update(s, head, (size_t)h);
    fc_sha256_update(s, data, n);
}

static void
key_str(FcSha256 *s, const char *name, const char *v)
{
    key_field(s, name, v ? v : "", v ? strlen(v) : 0);
}

/* The CPU the kernels are built for with -march=native: the first "model
 * name" and "flags" lines of /proc/cpuinfo (and the arm64 equivalents). */
static void
key_cpu(FcSha256 *s)
{
    static const char *const fields[] = {
        "model name", "flags", "Features", "CPU implementer", "CPU architecture", "CPU part",
    };
    char *text = NULL;
    size_t n;
    if (fc_disk_read_all("/proc/cpuinfo", 64 << 20, &text, &n) < 0) {
        key_str(s, "cpu", "unknown");
        return;
    }
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        size_t flen = strlen(fields[i]);
        for (char *line = text; line != NULL; line = strchr(line, '\n')) {
            line += line[0] == '\n';
            if (strncmp(line, fields[i], flen) == 0 && strchr(" \t:", line[flen]) != NULL
                && line[flen] != '\0') {
                key_field(s, fields[i], line, strcspn(line, "\n"));
                break;
            }
        }
    }
    free(text);
}

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.h in include_dir, name and bytes, in name order: editing a shipped
 * header invalidates every kernel built against it. */
static void
key_headers(FcSha256 *s, const char *dir)
{
    DIR *d = dir ? opendir(dir) : NULL;
    char **names = NULL;
    struct dirent *de;
    if (d == NULL) {
        key_str(s, "headers", "none");
        return;
    }
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len > 2 && strcmp(de->d_name + len - 2, ".h") == 0
            && fc_disk_strv_push(&names, de->d_name) < 0) {
            key_str(s, "headers", "out of memory");   /* never matches a real entry */
            break;
        }
    }
    closedir(d);
    size_t count = fc_disk_strv_len(names);
    if (count > 1) {
        qsort(names, count, sizeof(char *), cmp_str);
    }
    for (size_t i = 0; i < count; i++) {
        char *path = fmt("%s/%s", dir, names[i]), *text = NULL;
        size_t n;
        key_str(s, "header", names[i]);
        if (path && fc_disk_read_all(path, 64 << 20, &text, &n) == 0) {
            key_field(s, "bytes", text, n);
        }
        else {
            key_str(s, "bytes", "unreadable");
        }
        free(text);
        free(path);
    }
    fc_disk_strv_free(names);
}

/* Where the code starts: after the leading comment block. gen_c opens each
 * kernel with a comment naming the user's file:line; the same kernel reached
 * from two call sites must still be one cache entry, and no comment changes
 * the compiled code. */
static const char *
key_body(const char *src)
{
    for (;;) {
        src += strspn(src, " \t\r\n");
        if (src[0] == '/' && src[1] == '*') {
            const char *end = strstr(src + 2, "*/");
            if (end == NULL) {
                return src;
            }
            src = end + 2;
        }
        else if (src[0] == '/' && src[1] == '/') {
            src += strcspn(src, "\n");
        }
        else {
            return src;
        }
    }
}

/* Resolves the compiler and hashes every key component but the source into
 * rt.digest, once per configuration. GIL held; 0 or -1 with an exception. */
static int
ensure_identity(void)
{
    FcSha256 s;
    if (rt.have_digest) {
        return 0;
    }
    free(rt.cc_abs);
    free(rt.cc_line);
    rt.cc_line = NULL;
    rt.cc_abs = fc_disk_find_program(rt.cc && rt.cc[0] ? rt.cc : "cc");
    if (rt.cc_abs == NULL) {
        PyErr_Format(PyExc_RuntimeError, "fastcompile: C compiler '%s' not found or not "
                     "executable (set FASTCOMPILE_CC or CC)", rt.cc ? rt.cc : "cc");
        return -1;
    }
    rt.cc_line = compiler_line(rt.cc_abs);
    if (rt.cc_line == NULL) {
        return -1;
    }
    fc_sha256_init(&s);
    key_str(&s, "fastcompile-cpu-key", "1");
    key_str(&s, "cc", rt.cc_abs);
    key_str(&s, "cc --version", rt.cc_line);
    for (int i = 0; i < FC_NFLAGS; i++) {
        key_str(&s, "flag", FC_FLAGS[i]);
    }
    const char *const *width = vector_width_flags();
    for (int i = 0; width != NULL && width[i] != NULL; i++) {
        key_str(&s, "flag", width[i]);
    }
    if (rt.include_dir) {
        key_str(&s, "include", rt.include_dir);
    }
    for (char **f = rt.cflags; f && *f; f++) {
        key_str(&s, "cflag", *f);
    }
    for (int i = 0; i < FC_NLIBS; i++) {
        key_str(&s, "lib", FC_LIBS[i]);
    }
    key_cpu(&s);
    key_str(&s, "version", rt.version);
    key_headers(&s, rt.include_dir);
    fc_sha256_final(&s, rt.digest);
    rt.have_digest = 1;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Kernel table: open addressing on (key, symbol), entries never freed before
 * fc_cpu_free (their strings are handed out as borrowed).
 * ------------------------------------------------------------------------- */

static size_t
entry_hash(const char *key, const char *symbol)
{
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = symbol; *p; p++) {
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    }
    for (int i = 0; i < 16 && key[i]; i++) {   /* the key is already a uniform hash */
        h = (h << 4 | h >> 60) ^ (uint64_t)(key[i] <= '9' ? key[i] - '0' : key[i] - 'a' + 10);
    }
    return (size_t)h;
}

static FcEntry *
table_find(const char *key, const char *symbol)
{
    if (rt.cap == 0) {
        return NULL;
    }
    for (size_t i = entry_hash(key, symbol) & (rt.cap - 1);; i = (i + 1) & (rt.cap - 1)) {
        FcEntry *e = rt.slots[i];
        if (e == NULL) {
            return NULL;
        }
        if (strcmp(e->key, key) == 0 && strcmp(e->symbol, symbol) == 0) {
            return e;
        }
    }
}

static void
table_place(FcEntry **slots, size_t cap, FcEntry *e)
{
    size_t i = entry_hash(e->key, e->symbol) & (cap - 1);
    while (slots[i] != NULL) {
        i = (i + 1) & (cap - 1);
    }
    slots[i] = e;
}

/* Indexes e (already on rt.entries). 0, or -1 with MemoryError. */
static int
table_insert(FcEntry *e)
{
    if (2 * (rt.used + 1) > rt.cap) {
        size_t cap = rt.cap ? 2 * rt.cap : 64;
        FcEntry **slots = calloc(cap, sizeof(FcEntry *));
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < rt.cap; i++) {
            if (rt.slots[i]) {
                table_place(slots, cap, rt.slots[i]);
            }
        }
        free(rt.slots);
        rt.slots = slots;
        rt.cap = cap;
    }
    table_place(rt.slots, rt.cap, e);
    rt.used++;
    return 0;
}

static void
entry_free(FcEntry *e)
{
    free(e->key);
    free(e->symbol);
    free(e->so_path);
    free(e->c_path);
    free(e);
}

/* ---------------------------------------------------------------------------
 * A load job: everything a disk lookup or a compile needs, owned, so that it
 * runs with the GIL released while other threads may reconfigure.
 * ------------------------------------------------------------------------- */

enum { FC_JOB_OK, FC_JOB_OS, FC_JOB_CC, FC_JOB_LOAD, FC_JOB_NOMEM };
#define FC_JOB_MAXWARN 4
/* Compile-time estimates in source bytes (about 10 us each with GCC -O2):
 * the fixed cost of a compiler run (the driver, cc1's start, the precompiled
 * header, as, ld: ~20 ms) and the most a bundle grows to (~0.6 s). See
 * make_bundles. */
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

static void job_warn(FcJob *j, const char *f, ...) __attribute__((format(printf, 2, 3)));

static void
job_warn(FcJob *j, const char *f, ...)
{
    char *s = NULL;
    va_list ap;
    if (j->nwarn == FC_JOB_MAXWARN) {
        return;
    }
    va_start(ap, f);
    if (vasprintf(&s, f, ap) >= 0) {
        j->warnings[j->nwarn++] = s;
    }
    va_end(ap);
}

static void job_fail(FcJob *j, int err, const char *f, ...) __attribute__((format(printf, 3, 4)));

static void
job_fail(FcJob *j, int err, const char *f, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, f);
    vsnprintf(msg, sizeof(msg), f, ap);
    va_end(ap);
    j->err = err;
    fc_str_puts(&j->errmsg, msg);
}

static void
job_free(FcJob *j)
{
    free(j->shard);
    free(j->so_path);
    free(j->c_path);
    free(j->meta_path);
    free(j->version);
    free(j->cc);
    free(j->pch_gch);
    fc_disk_strv_free(j->flags);
    fc_disk_strv_free(j->envp);
    free(j->loaded_path);
    free(j->members);       /* the array only: its jobs are the batch's */
    for (int i = 0; i < j->nwarn; i++) {
        free(j->warnings[i]);
    }
    fc_str_free(&j->errmsg);
}

/* What every job needs out of rt: the compiler, its environment and time
 * limit, and its flags: FC_FLAGS, the vector width, -I<pch> for a kernel job (pch: the
 * precompiled header's folder, or NULL), -I<include_dir>, cflags; with pch,
 * the .gch's path. GIL held. 0, or -1 when out of memory. */
static int
job_prepare_compiler(FcJob *j, const char *pch)
{
    j->cc = strdup(rt.cc_abs);
    j->envp = fc_disk_scrubbed_env();
    j->timeout_s = rt.timeout_s;
    j->pch_flag = -1;
    if (!j->cc || !j->envp || (pch && (j->pch_gch = fmt("%s/%s.gch", pch, FC_PCH_HEADER)) == NULL)) {
        return -1;
    }
    for (int i = 0; i < FC_NFLAGS; i++) {
        if (fc_disk_strv_push(&j->flags, FC_FLAGS[i]) < 0) {
            return -1;
        }
    }
    const char *const *width = vector_width_flags();
    for (int i = 0; width != NULL && width[i] != NULL; i++) {
        if (fc_disk_strv_push(&j->flags, width[i]) < 0) {
            return -1;
        }
    }
    if (pch && !j->pch_build) {
        char *inc = fmt("-I%s", pch);
        j->pch_flag = (int)fc_disk_strv_len(j->flags);
        int rc = inc ? fc_disk_strv_push(&j->flags, inc) : -1;
        free(inc);
        if (rc < 0) {
            return -1;
        }
    }
    if (rt.include_dir) {
        char *inc = fmt("-I%s", rt.include_dir);
        int rc = inc ? fc_disk_strv_push(&j->flags, inc) : -1;
        free(inc);
        if (rc < 0) {
            return -1;
        }
    }
    for (char **f = rt.cflags; f && *f; f++) {
        if (fc_disk_strv_push(&j->flags, *f) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A kernel's job: copies what it needs out of rt; pch as for
 * job_prepare_compiler. GIL held. 0, or -1 with MemoryError. */
static int
job_prepare(FcJob *j, const char *source, const char *symbol, const char *key, const char *pch)
{
    j->source = source;
    j->source_len = strlen(source);
    j->weight = j->source_len + FC_RUN_WEIGHT;
    j->symbol = symbol;
    memcpy(j->key, key, 65);
    j->shard = fmt("%s/%.2s", rt.cache_dir, key);
    j->so_path = fmt("%s/%.2s/%s.so", rt.cache_dir, key, key);
    j->c_path = fmt("%s/%.2s/%s.c", rt.cache_dir, key, key);
    j->meta_path = fmt("%s/%.2s/%s.meta", rt.cache_dir, key, key);
    j->version = strdup(rt.version ? rt.version : "unknown");
    j->read_disk = !rt.always_compile;
    for (FcEntry *e = rt.entries; e != NULL; e = e->next) {
        if (!e->via_alias && e->so_path && j->so_path && strcmp(e->so_path, j->so_path) == 0) {
            j->prev_loaded = 1;
            j->prev_dev = e->dev;
            j->prev_ino = e->ino;
            break;
        }
    }
    if (!j->shard || !j->so_path || !j->c_path || !j->meta_path || !j->version
        || job_prepare_compiler(j, pch) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The job that builds pch's .gch from the shipped header (pch_build). GIL
 * held. 0, or -1 with MemoryError. */
static int
pch_job_prepare(FcJob *j, const char *pch)
{
    j->pch_build = 1;
    j->c_path = fmt("%s/%s", rt.include_dir, FC_PCH_HEADER);   /* the input */
    if (j->c_path == NULL || job_prepare_compiler(j, pch) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* dlopen + dlsym. 0; -1 with why when the loader rejects the file (a bad
 * entry); -2 with j->err set when it loads but lacks the symbol (the source's
 * fault: a checksummed file is exactly what was compiled) or on an OS error.
 *
 * glibc's dlopen returns an already loaded object when the path matches its
 * name, without looking at the file. If this process loaded an earlier file
 * under so_path (since replaced: cache_clear(disk=True), or a corrupt entry
 * rewritten in place and healed), dlopen(so_path) would hand back that stale
 * mapping, which may SIGBUS. Then the new file is loaded through a one-off
 * hard link, removed right after. */
static int
open_entry(FcJob *j, const char *so, char *why, size_t whylen)
{
    char *path = strdup(so), *alias = NULL, sfx[FC_DISK_SUFFIX];
    struct stat st;
    void *h = NULL;
    int rc = -2;
    if (path == NULL) {
        job_fail(j, FC_JOB_NOMEM, "out of memory");
        goto cleanup;
    }
    if (stat(so, &st) < 0) {
        snprintf(why, whylen, "cannot stat it: %s", strerror(errno));
        rc = -1;
        goto cleanup;
    }
    if (j->prev_loaded && strcmp(so, j->so_path) == 0
        && (st.st_dev != j->prev_dev || st.st_ino != j->prev_ino)) {
        fc_disk_temp_suffix(sfx);
        alias = fmt("%s/%s.%s.so", j->shard, j->key, sfx);
        if (alias == NULL || link(so, alias) < 0) {
            job_fail(j, FC_JOB_OS, "fastcompile: cannot link %s to a fresh name: %s", so,
                     strerror(alias ? errno : ENOMEM));
            goto cleanup;
        }
    }
    h = dlopen(alias ? alias : so, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(why, whylen, "dlopen: %s", e ? e : "unknown error");
        rc = -1;
        goto cleanup;
    }
    void *sym = dlsym(h, j->symbol);
    if (sym == NULL) {
        /* drops only our reference: nothing from it was handed out through h */
        dlclose(h);
        job_fail(j, FC_JOB_LOAD, "fastcompile: kernel %s has no exported symbol '%s' (kernels "
                 "are built with -fvisibility=hidden; mark the entry point visible)", so,
                 j->symbol);
        goto cleanup;
    }
    j->handle = h;
    j->fn = (fc_kernel_fn)sym;
    j->loaded_path = path;
    path = NULL;
    j->dev = st.st_dev;
    j->ino = st.st_ino;
    j->via_alias = alias != NULL;
    rc = 0;
cleanup:
    if (alias != NULL) {
        unlink(alias);   /* the mapping stays; the published name is so */
    }
    free(alias);
    free(path);
    return rc;
}

/* Write <key>.c if it went missing (explain() reads it). Best effort. */
static void
ensure_source_file(FcJob *j)
{
    if (access(j->c_path, F_OK) != 0) {
        fc_disk_write_atomic(j->c_path, j->source, j->source_len, 0600);
    }
}

/* The numbered source and the compile line, for the error a failed compile raises. */
static void
describe_failure(FcJob *j, char *const argv[], const char *log, const char *how)
{
    FcStr *b = &j->errmsg;
    j->err = FC_JOB_CC;
    fc_str_printf(b, "fastcompile: the C compiler %s on kernel '%s' (key %s)\ncommand:", how,
                  j->symbol, j->key);
    for (char *const *a = argv; *a; a++) {
        int plain = strpbrk(*a, " \t\n'\"\\$`*?;&|<>()[]{}~!#") == NULL && (*a)[0] != '\0';
        fc_str_printf(b, plain ? " %s" : " '%s'", *a);
    }
    fc_str_puts(b, "\n--- compiler output ---\n");
    fc_str_puts(b, log && log[0] ? log : "(none)\n");
    if (b->len && b->s[b->len - 1] != '\n') {
        fc_str_puts(b, "\n");
    }
    fc_str_puts(b, "--- source ---\n");
    int line = 1;
    for (const char *p = j->source; *p; line++) {
        size_t n = strcspn(p, "\n");
        fc_str_printf(b, "%5d | %.*s\n", line, (int)n, p);
        p += n + (p[n] == '\n');
    }
}

/* Publishes tmp_so as j->so_path and loads it, never replacing a good
 * published file: the first process to link wins and writes the .meta; the
 * others load the winner's file once its .meta checks out. A bad entry in the
 * way is removed and the link retried. shared: tmp_so also holds other
 * kernels (a bundle's), so it is linked to so_path and left in place rather
 * than moved. 0: loaded j->so_path (ours or another process's); 1: could not
 * publish, tmp_so is still there; -1: j->err set. */
static int
publish(FcJob *j, const char *tmp_so, const char *tmp_meta, int shared)
{
    char why[512];
    for (int attempt = 0; attempt < FC_PUBLISH_TRIES; attempt++) {
        if ((shared ? link(tmp_so, j->so_path) : fc_disk_move_noreplace(tmp_so, j->so_path)) == 0) {
            if (rename(tmp_meta, j->meta_path) < 0) {
                job_fail(j, FC_JOB_OS, "fastcompile: cannot publish %s: %s", j->meta_path,
                         strerror(errno));
                return -1;
            }
            fc_disk_fsync_dir(j->shard);
            int rc = open_entry(j, j->so_path, why, sizeof(why));
            if (rc == -1) {
                job_fail(j, FC_JOB_LOAD, "fastcompile: cannot load the freshly compiled kernel "
                         "%s: %s", j->so_path, why);
            }
            return rc < 0 ? -1 : 0;
        }
        if (errno != EEXIST) {
            if (shared) {
                return 1;          /* no hard links here (EPERM, ...): load the bundle's file */
            }
            job_fail(j, FC_JOB_OS, "fastcompile: cannot publish %s: %s", j->so_path,
                     strerror(errno));
            return -1;
        }
        /* use theirs, unless it is the very file we already found corrupt */
        struct stat st;
        int known_bad = j->have_bad && lstat(j->so_path, &st) == 0 && st.st_dev == j->bad_dev
                        && st.st_ino == j->bad_ino;
        int rc = known_bad ? -1 : fc_disk_check_entry(j->so_path, j->meta_path, j->key,
                                                      j->version, FC_META_WAIT_PUBLISH_MS, why,
                                                      sizeof(why));
        if (rc == 0) {
            rc = open_entry(j, j->so_path, why, sizeof(why));
        }
        if (rc != -1) {
            return rc == 0 ? 0 : -1;
        }
        if (!j->warned_corrupt) {
            job_warn(j, "fastcompile: cache entry %s is corrupt (%s); replacing it", j->so_path,
                     why);
            j->warned_corrupt = 1;
        }
        if (unlink(j->so_path) < 0 && errno != ENOENT) {
            job_fail(j, FC_JOB_OS, "fastcompile: cannot remove corrupt %s: %s", j->so_path,
                     strerror(errno));
            return -1;
        }
    }
    return 1;
}

/* Runs j's compiler on src (len bytes, written to tmp_c) with output
 * tmp_so. With describe (j's own source) it runs once more without the
 * precompiled header if the first run fails with one, and a failure leaves
 * the command, its output and j's numbered source in j->err; without (a
 * bundle's), a failure is only reported, since each kernel is compiled
 * again alone. Counts the runs and their time on j. 0: tmp_so is written;
 * 1: the compiler failed; -1: j->err set (could not run it). GIL-free. */
static int
run_compiler(FcJob *j, const char *src, size_t len, const char *tmp_c, const char *tmp_so,
             int describe)
{
    char sfx[FC_DISK_SUFFIX], why[512];
    char *tmp_log = NULL, *log = NULL;
    char **argv = NULL;
    int logfd = -1, status = 0, timed_out = 0, rc = -1;
    size_t nflags = fc_disk_strv_len(j->flags), k = 0;

    fc_disk_temp_suffix(sfx);
    tmp_log = fmt("%s/%s.%s.log", j->shard, j->key, sfx);
    argv = calloc(nflags + FC_NLIBS + 5, sizeof(char *));
    if (!tmp_log || !argv) {
        job_fail(j, FC_JOB_NOMEM, "out of memory");
        goto cleanup;
    }
    argv[k++] = j->cc;
    for (size_t i = 0; i < nflags; i++) {
        argv[k++] = j->flags[i];
    }
    argv[k++] = "-o";
    argv[k++] = (char *)tmp_so;
    argv[k++] = (char *)tmp_c;
    for (int i = 0; i < FC_NLIBS; i++) {
        argv[k++] = (char *)FC_LIBS[i];
    }

    if (fc_disk_write_new(tmp_c, src, len, 0600) < 0) {
        job_fail(j, FC_JOB_OS, "fastcompile: cannot write %s: %s", tmp_c, strerror(errno));
        goto cleanup;
    }
    logfd = open(tmp_log, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (logfd < 0) {
        job_fail(j, FC_JOB_OS, "fastcompile: cannot create %s: %s", tmp_log, strerror(errno));
        goto cleanup;
    }
    unlink(tmp_log);   /* anonymous from here on: nothing to clean up after a crash */

    double t0 = fc_disk_now_ms();
    j->compiled = 1;
    if (fc_disk_spawn_wait(argv, j->envp, logfd, j->timeout_s, &status, &timed_out) < 0) {
        job_fail(j, FC_JOB_OS, "fastcompile: cannot run the C compiler %s: %s", j->cc,
                 strerror(errno));
        goto cleanup;
    }
    j->runs++;
    if (describe && !timed_out && WIFEXITED(status) && WEXITSTATUS(status) != 0
        && j->pch_flag >= 0) {
        /* perhaps a .gch GCC could not read (it fails rather than falling back
         * to the header): once more without it, on an emptied log */
        int again = 0;
        memmove(&argv[j->pch_flag + 1], &argv[j->pch_flag + 2],
                (k - (size_t)j->pch_flag - 1) * sizeof(char *));
        k--;
        if (ftruncate(logfd, 0) == 0 && lseek(logfd, 0, SEEK_SET) == 0
            && fc_disk_spawn_wait(argv, j->envp, logfd, j->timeout_s, &again, &timed_out) == 0) {
            j->runs++;
            if (!timed_out && WIFEXITED(again) && WEXITSTATUS(again) == 0) {
                unlink(j->pch_gch);
                job_warn(j, "fastcompile: the precompiled header %s could not be used; removed "
                         "it (the next compile makes it again)", j->pch_gch);
            }
            status = again;
        }
    }
    j->compile_ms = fc_disk_now_ms() - t0;
    struct stat st;
    if (timed_out) {
        snprintf(why, sizeof(why), "timed out after %d s and was killed", j->timeout_s);
    }
    else if (WIFSIGNALED(status)) {
        snprintf(why, sizeof(why), "was killed by signal %d", WTERMSIG(status));
    }
    else if (WEXITSTATUS(status) != 0) {
        snprintf(why, sizeof(why), "failed (exit status %d)", WEXITSTATUS(status));
    }
    else if (lstat(tmp_so, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
        snprintf(why, sizeof(why), "exited 0 but wrote no shared object");
    }
    else {
        why[0] = '\0';
    }
    rc = why[0] ? 1 : 0;
    if (rc == 1 && describe) {
        log = fc_disk_read_head(logfd, FC_LOG_MAX, "\n... (compiler output truncated)\n");
        describe_failure(j, argv, log, why);
    }
cleanup:
    if (logfd >= 0) {
        close(logfd);
    }
    free(tmp_log);
    free(log);
    free(argv);
    return rc;
}

/* Makes tmp_so (compiled from j's source; hex: its sha256) j's entry and
 * loads it: writes the .meta that vouches for it, publishes the source
 * (tmp_c renamed, or written afresh when NULL) and then the .so (publish;
 * shared as there). Sets *keep_so when j loaded tmp_so itself, which must
 * then stay on disk. GIL-free; failures land in j->err. */
static void
install(FcJob *j, const char *tmp_so, const char *hex, const char *tmp_c, int shared, int *keep_so)
{
    char sfx[FC_DISK_SUFFIX], why[512];
    char *tmp_meta = NULL, *meta = NULL;

    fc_disk_temp_suffix(sfx);
    tmp_meta = fmt("%s/%s.%s.meta", j->shard, j->key, sfx);
    meta = fc_disk_meta_text(j->key, hex, j->version);
    if (tmp_meta == NULL || meta == NULL) {
        job_fail(j, FC_JOB_NOMEM, "out of memory");
        goto cleanup;
    }
    if (fc_disk_write_new(tmp_meta, meta, strlen(meta), 0600) < 0) {
        job_fail(j, FC_JOB_OS, "fastcompile: cannot write %s: %s", tmp_meta, strerror(errno));
        goto cleanup;
    }
    /* everyone with this key has the same code (the leading comment may name
     * another call site): replacing the .c is harmless */
    if (tmp_c ? rename(tmp_c, j->c_path) < 0
              : fc_disk_write_atomic(j->c_path, j->source, j->source_len, 0600) < 0) {
        job_fail(j, FC_JOB_OS, "fastcompile: cannot publish %s: %s", j->c_path, strerror(errno));
        goto cleanup;
    }
    if (publish(j, tmp_so, tmp_meta, shared) == 1) {
        /* others kept breaking the published entry: use our file, privately */
        *keep_so = 1;
        if (open_entry(j, tmp_so, why, sizeof(why)) == -1) {
            job_fail(j, FC_JOB_LOAD, "fastcompile: cannot load the freshly compiled kernel "
                     "%s: %s", tmp_so, why);
        }
    }
cleanup:
    if (tmp_meta) {
        unlink(tmp_meta);   /* gone already once published */
    }
    free(tmp_meta);
    free(meta);
}

/* Compile j->source to <key>.<pid>.<rand>.so in the shard, publish it, load
 * the published file. GIL-free. */
static void
job_compile(FcJob *j)
{
    char sfx[FC_DISK_SUFFIX], hex[65];
    char *tmp_c = NULL, *tmp_so = NULL;
    int keep_so = 0;

    fc_disk_temp_suffix(sfx);
    tmp_c = fmt("%s/%s.%s.c", j->shard, j->key, sfx);
    tmp_so = fmt("%s/%s.%s.so", j->shard, j->key, sfx);
    if (!tmp_c || !tmp_so) {
        job_fail(j, FC_JOB_NOMEM, "out of memory");
        goto cleanup;
    }
    j->bundled = 1;
    if (run_compiler(j, j->source, j->source_len, tmp_c, tmp_so, 1) != 0) {
        goto cleanup;
    }
    /* sync the .so's bytes, then the sidecar that vouches for them */
    if (fc_disk_hash_file(tmp_so, 1, hex, NULL) < 0) {
        job_fail(j, FC_JOB_OS, "fastcompile: cannot read %s: %s", tmp_so, strerror(errno));
        goto cleanup;
    }
    install(j, tmp_so, hex, tmp_c, 0, &keep_so);
cleanup:
    /* whatever temps remain were not published (each publish step consumed its temp) */
    if (tmp_c) {
        unlink(tmp_c);
    }
    if (tmp_so && !keep_so) {
        unlink(tmp_so);
    }
    free(tmp_c);
    free(tmp_so);
}

/* The shard j publishes in exists and is a private folder of ours. 0, or -1
 * with j->err set. GIL-free. */
static int
shard_ready(FcJob *j)
{
    struct stat st;
    if (mkdir(j->shard, 0700) < 0 && errno != EEXIST) {
        job_fail(j, FC_JOB_OS, "fastcompile: cannot create %s: %s", j->shard, strerror(errno));
        return -1;
    }
    if (lstat(j->shard, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()
        || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        job_fail(j, FC_JOB_OS, "fastcompile: cache shard %s is not a private directory of ours",
                 j->shard);
        return -1;
    }
    return 0;
}

/* Where source's kernel-header #include line starts (bundle_ok vouched for
 * one, at the start of a line), or NULL. */
static const char *
header_include(const char *source)
{
    for (const char *p = source; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, FC_PCH_INCLUDE, strlen(FC_PCH_INCLUDE)) == 0) {
            return p;
        }
    }
    return NULL;
}

/* A bundle's fallback: each member that has not failed yet compiles alone.
 * GIL-free. */
static void
compile_each_alone(FcJob *lead)
{
    for (int m = 0; m < lead->nmembers; m++) {
        if (lead->members[m]->err == FC_JOB_OK) {
            job_compile(lead->members[m]);
        }
    }
}

/* A bundle (see make_bundles): the leader's members, itself first, compiled
 * as one translation unit into one .so, which each member publishes under
 * its own key (hard links to one file: the loader maps it once and each
 * member looks up its own symbol). Every member but the first drops its
 * #include of the kernel header, which the first one's brought in (with the
 * precompiled header, a second #include of it would look for the header in
 * the .gch's folder). If the bundle does not compile, each member compiles
 * alone, so that a failure is reported against the kernel that caused it
 * and the others still load. GIL-free; results land in each member. */
static void
bundle_compile(FcJob *lead)
{
    char sfx[FC_DISK_SUFFIX], hex[65];
    char *tmp_c = NULL, *tmp_so = NULL;
    char *src = NULL;          /* PyMem_Raw (fc_str_release): the translation unit */
    FcStr b = {0};
    int keep_so = 0, rc = -1, n = 0;

    for (int m = 0; m < lead->nmembers; m++) {
        (void)shard_ready(lead->members[m]);   /* a member whose shard is not ours fails alone */
    }
    if (lead->err != FC_JOB_OK) {
        compile_each_alone(lead);          /* the bundle's temps would go in the leader's shard */
        goto cleanup;
    }
    for (int m = 0; m < lead->nmembers; m++) {
        FcJob *j = lead->members[m];
        if (j->err != FC_JOB_OK) {
            continue;
        }
        const char *inc = n > 0 ? header_include(j->source) : NULL;
        if (inc != NULL) {
            fc_str_printf(&b, "%.*s", (int)(inc - j->source), j->source);
            fc_str_puts(&b, inc + strlen(FC_PCH_INCLUDE));
        }
        else {
            fc_str_puts(&b, j->source);
        }
        fc_str_puts(&b, "\n");
        n++;
    }
    size_t len = b.len;
    src = fc_str_take_raw(&b);           /* NULL if an append failed */
    fc_disk_temp_suffix(sfx);
    tmp_c = fmt("%s/%s.%s.bundle.c", lead->shard, lead->key, sfx);
    tmp_so = fmt("%s/%s.%s.bundle.so", lead->shard, lead->key, sfx);
    if (src != NULL && tmp_c != NULL && tmp_so != NULL) {
        rc = run_compiler(lead, src, len, tmp_c, tmp_so, 0);
    }
    if (rc == 0 && fc_disk_hash_file(tmp_so, 1, hex, NULL) < 0) {
        rc = -1;
    }
    if (rc != 0) {
        /* out of memory, no compiler run, or one that failed: each alone (the
         * leader was clean before: its shard is ready) */
        fc_str_free(&lead->errmsg);
        lead->err = FC_JOB_OK;
        compile_each_alone(lead);
        goto cleanup;
    }
    for (int m = 0; m < lead->nmembers; m++) {
        FcJob *j = lead->members[m];
        if (j->err != FC_JOB_OK) {
            continue;
        }
        j->compiled = 1;
        j->bundled = n;
        j->compile_ms = lead->compile_ms;
        install(j, tmp_so, hex, NULL, 1, &keep_so);
    }
cleanup:
    if (tmp_c) {
        unlink(tmp_c);
    }
    if (tmp_so && !keep_so) {
        unlink(tmp_so);       /* the members' links keep the file */
    }
    free(tmp_c);
    free(tmp_so);
    fc_str_release(src);
    fc_str_free(&b);
}

/* Compiles the header (j->c_path) to a temp beside j->pch_gch and renames it
 * there: a compiler opening the .gch sees none or a whole one. Not synced: a
 * file the disk lost after a crash fails a compile, which then goes without
 * it (job_compile). GIL-free; j->err set on failure. */
static void
pch_build(FcJob *j)
{
    char sfx[FC_DISK_SUFFIX];
    char *tmp = NULL;
    char **argv = NULL;
    size_t nflags = fc_disk_strv_len(j->flags), k = 0;
    int fd = -1, status = 0, timed_out = 0;

    fc_disk_temp_suffix(sfx);
    tmp = fmt("%s.%s.tmp", j->pch_gch, sfx);
    argv = calloc(nflags + 7, sizeof(char *));
    if (tmp == NULL || argv == NULL) {
        job_fail(j, FC_JOB_NOMEM, "out of memory");
        goto cleanup;
    }
    argv[k++] = j->cc;
    for (size_t i = 0; i < nflags; i++) {
        argv[k++] = j->flags[i];
    }
    argv[k++] = "-x";
    argv[k++] = "c-header";
    argv[k++] = "-o";
    argv[k++] = tmp;
    argv[k++] = j->c_path;
    fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    double t0 = fc_disk_now_ms();
    if (fd < 0 || fc_disk_spawn_wait(argv, j->envp, fd, j->timeout_s, &status, &timed_out) < 0) {
        job_fail(j, FC_JOB_OS, "cannot run %s: %s", j->cc, strerror(errno));
        goto cleanup;
    }
    j->compile_ms = fc_disk_now_ms() - t0;
    if (timed_out || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        job_fail(j, FC_JOB_CC, "%s", timed_out ? "timed out" : "the compiler failed");
        goto cleanup;
    }
    if (chmod(tmp, 0600) < 0 || rename(tmp, j->pch_gch) < 0) {
        job_fail(j, FC_JOB_OS, "cannot publish %s: %s", j->pch_gch, strerror(errno));
    }
cleanup:
    if (fd >= 0) {
        close(fd);
    }
    if (tmp) {
        unlink(tmp);   /* gone already once renamed */
    }
    free(tmp);
    free(argv);
}

/* Disk lookup, else compile; a bundle's leader compiles its members (they
 * have nothing on disk). GIL-free; results and failures land in *j (and in
 * each member). */
static void
job_run(FcJob *j)
{
    char why[512];
    struct stat st;
    if (j->pch_build) {
        pch_build(j);
        return;
    }
    if (j->nmembers > 0) {
        bundle_compile(j);
        return;
    }
    if (shard_ready(j) < 0) {
        return;
    }
    if (j->read_disk && lstat(j->so_path, &st) == 0) {
        int rc = fc_disk_check_entry(j->so_path, j->meta_path, j->key, j->version,
                                     FC_META_WAIT_READ_MS, why, sizeof(why));
        rc = rc == 0 ? open_entry(j, j->so_path, why, sizeof(why)) : rc;
        if (rc == 0) {
            j->disk_hit = 1;
            ensure_source_file(j);
            return;
        }
        if (rc == -2) {
            return;
        }
        job_warn(j, "fastcompile: cache entry %s is corrupt (%s); recompiling", j->so_path, why);
        j->warned_corrupt = 1;
        j->have_bad = 1;
        j->bad_dev = st.st_dev;
        j->bad_ino = st.st_ino;
    }
    job_compile(j);
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

/* cfg: borrowed dict. Keys: cc, cflags, include_dir, cache_dir, version,
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
    if (!str_eq(cache_req, rt.cache_req)) {
        drop_cache_dir();
    }
#define FC_SWAP(field, val) \
    do {                    \
        free(rt.field);     \
        rt.field = (val);   \
        (val) = NULL;       \
    } while (0)
    FC_SWAP(cc, cc);
    FC_SWAP(include_dir, include_dir);
    FC_SWAP(cache_req, cache_req);
    FC_SWAP(version, version);
    FC_SWAP(dump_dir, dump_dir);
#undef FC_SWAP
    fc_disk_strv_free(rt.cflags);
    rt.cflags = flagv;
    flagv = NULL;
    rt.always_compile = always_compile != 0;
    rt.debug = (int)debug;
    rt.pch = pch != 0;
    rt.bundles = bundles != 0;
    rt.pch_failed = 0;
    rt.timeout_s = (int)timeout_s;
    rt.have_digest = 0;   /* compiler, flags or headers may have changed */
    rt.configured = 1;
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
    if (fc_disk_mkdir_p(rt.dump_dir, 0777) < 0
        || (path = fmt("%s/%s.c", rt.dump_dir, key)) == NULL
        || fc_disk_write_atomic(path, source, strlen(source), 0644) < 0) {
        msg = fmt("fastcompile: cannot dump the kernel source to %s: %s", rt.dump_dir,
                  strerror(errno));
        rc = msg ? warn(msg) : 0;
    }
    free(path);
    free(msg);
    return rc;
}

/* The shared state of run_jobs' workers: the next job to take. */
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
        job_run(q->jobs[i]);
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
static int
cmp_job_heaviest(const void *a, const void *b)
{
    size_t la = job_cost(*(FcJob *const *)a), lb = job_cost(*(FcJob *const *)b);
    return la < lb ? 1 : la > lb ? -1 : 0;
}

/* How many compilers run at once: one per online CPU, at most FC_MAX_PARALLEL_CC. */
static int
worker_count(void)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    return ncpu < 1 ? 1 : ncpu > FC_MAX_PARALLEL_CC ? FC_MAX_PARALLEL_CC : (int)ncpu;
}

/* Runs *jobs[0..n), taken in that order, up to one per online CPU at a
 * time: a worker that finishes a job takes the next one (a long compile
 * holds up no other core). Each job waits on its own compiler process.
 * Called with the GIL released. */
static void
run_jobs(FcJob *const *jobs, int n)
{
    int width = worker_count();
    pthread_t th[FC_MAX_PARALLEL_CC];
    int started[FC_MAX_PARALLEL_CC] = {0};
    FcJobQueue q = {.jobs = jobs, .n = n, .next = 0};
    if (width > n) {
        width = n;
    }
    if (pthread_mutex_init(&q.mu, NULL) != 0) {
        for (int i = 0; i < n; i++) {
            job_run(jobs[i]);           /* no lock to be had: one at a time, here */
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

/* After job j ran: its counters, log lines and warnings; on success a table
 * entry for its key and symbol (or the one another thread registered
 * meanwhile) in *out.
 * GIL held. 0, or -1 with an exception set. */
static int
job_finish(FcJob *j, FcEntry **out)
{
    const char *key = j->key, *symbol = j->symbol;
    FcEntry *e;
    rt.compiles += j->compiled;
    rt.compiler_runs += j->runs;
    rt.disk_hits += j->disk_hit;
    if (rt.debug >= 1) {
        if (j->disk_hit) {
            log_debug("cpu kernel %s: memory miss, disk hit %s", symbol, j->so_path);
        }
        else if (j->compiled) {
            char with[48] = "";
            if (j->bundled > 1) {
                snprintf(with, sizeof(with), " (one compiler run for %d kernels)", j->bundled);
            }
            log_debug("cpu kernel %s: cache miss (%s), compiled in %.0f ms%s -> %s", symbol,
                      rt.always_compile ? "always_compile" : "memory and disk", j->compile_ms,
                      with, j->loaded_path ? j->loaded_path : "(failed)");
        }
    }
    for (int i = 0; i < j->nwarn; i++) {
        if (warn(j->warnings[i]) < 0) {
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
    e = table_find(key, symbol);
    if (e == NULL) {
        e = calloc(1, sizeof(FcEntry));
        if (e == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        e->next = rt.entries;
        rt.entries = e;
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
        if (!e->key || !e->symbol || table_insert(e) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_NoMemory();
            }
            return -1;
        }
    }
    *out = e;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Precompiled header. Every kernel starts with #include "fc_kernel.h", and
 * parsing it (with math.h and omp.h) is about 80 of the 650 million
 * instructions cc1 spends on a softmax kernel. With GCC the header is
 * compiled once per compiler, flags and header bytes (the key digest) into
 * <cache>/pch-<digest[0:16]>/fc_kernel.h.gch, and each kernel compile puts
 * that folder first on its include path: GCC takes the .gch it finds beside
 * the name it includes if it was made with the same options, else reads the
 * header. The generated code is the same either way.
 * A batch that is about to compile with no .gch there builds one in a job of
 * its own, run first, beside the kernels (on another core); kernels that
 * start before it is published read the header. A .gch GCC cannot read fails
 * the compile: the kernel is compiled again without it and the file removed
 * (job_compile). Clang reads no .gch on #include, and is never given one.
 * ------------------------------------------------------------------------- */

/* *out: the folder for this configuration's .gch (made if missing), or NULL
 * when there is to be none. GIL held. 0, or -1 with MemoryError. */
static int
pch_folder(char **out)
{
    char hex[65];
    struct stat st;
    *out = NULL;
    if (!rt.pch || rt.pch_failed || !rt.include_dir || !rt.cc_line || strstr(rt.cc_line, "clang")) {
        return 0;
    }
    fc_sha256_hex(rt.digest, hex);
    char *dir = fmt("%s/pch-%.16s", rt.cache_dir, hex);
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
static int
pch_wanted(const FcJob *jobs, int njobs)
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
 * Bundles. A compiler run costs ~20 ms whatever it compiles (the driver,
 * cc1's start, loading the precompiled header, as and ld: a one-op kernel
 * takes ~55 ms, the same file with an empty body ~28). When a batch has more
 * kernels to compile than there are workers, they are dealt out into one
 * bundle per worker and each bundle is compiled as one translation unit
 * (bundle_compile), which pays that once: on 2 cores the transformer
 * block's 13 training kernels compile in ~460 ms instead of ~680.
 * Dealing: the kernels that will compile (nothing on disk, or
 * always_compile) go longest first to the lightest bundle so far (LPT). A
 * bundle never gets two kernels of one symbol (they would clash in one
 * translation unit), and past FC_BUNDLE_MAX_WEIGHT a batch gets more bundles
 * than workers. A batch with bundles builds no precompiled header: it would
 * hold up one worker ~70 ms to save each run ~15. Only rendered kernels are
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
static int
make_bundles(FcJob *jobs, int njobs, int width, int may_bundle)
{
    FcJob **cand = NULL;
    size_t *load = NULL, total = 0;
    int *group = NULL, *count = NULL, ncand = 0, nb, rc = -1, made = 0;   /* rc -1: out of memory */
    struct stat st;

    if (!may_bundle || !rt.bundles || njobs <= width) {
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
    qsort(cand, ncand, sizeof(FcJob *), cmp_job_heaviest);
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

    if (!rt.configured) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: the CPU runtime is not configured "
                        "(fastcompile._C._configure was never called)");
        return -1;
    }
    /* the key needs the compiler's identity, which is cached in the cache dir */
    if (!rt.have_digest && (ensure_cache_dir() < 0 || ensure_identity() < 0)) {
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
        FcSha256 s;
        uint8_t digest[32];
        fc_sha256_init(&s);
        fc_sha256_update(&s, rt.digest, sizeof(rt.digest));
        key_str(&s, "source", key_body(sources[i]));
        fc_sha256_final(&s, digest);
        fc_sha256_hex(digest, keys[i]);
        job_of[i] = -1;
        found[i] = table_find(keys[i], symbols[i]);
        if (found[i] != NULL) {
            rt.memory_hits++;
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
        if (ensure_cache_dir() < 0 || (njobs == 0 && pch_folder(&pch) < 0)
            || job_prepare(&jobs[njobs], sources[i], symbols[i], keys[i], pch) < 0) {
            njobs++;                                           /* job_free for the partial one */
            goto cleanup;
        }
        job_of[i] = njobs++;
    }
    if (njobs > 0) {
        int nrun = 0, bundles = make_bundles(jobs, njobs, worker_count(), may_bundle);
        /* with bundles, no header build: each run parses the header once anyway */
        if (bundles == 0 && pch_wanted(jobs, njobs)) {
            pch_job = 1;
            if (pch_job_prepare(&jobs[njobs], pch) < 0) {
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
        qsort(&order[first_kernel], nrun - first_kernel, sizeof(FcJob *), cmp_job_heaviest);
        Py_BEGIN_ALLOW_THREADS
        run_jobs(order, nrun);
        Py_END_ALLOW_THREADS
        if (pch_job) {
            FcJob *h = &jobs[njobs];
            rt.pch_failed = h->err != FC_JOB_OK;
            if (rt.debug >= 1) {
                log_debug("precompiled header %s: %s (%.0f ms)", h->pch_gch,
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
    rt.compile_batches += compiled;
    for (int i = 0; i < n; i++) {
        if (found[i] == NULL) {
            found[i] = made[job_of[i]];
        }
    }
    if (rt.dump_dir) {
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
        job_free(&jobs[k]);
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
    const char *dir = rt.cache_dir ? rt.cache_dir : rt.cache_req;
    return Py_BuildValue("{sLsLsLsLsLsz}", "compiles", rt.compiles, "compiler_runs",
                         rt.compiler_runs, "compile_batches", rt.compile_batches, "disk_hits",
                         rt.disk_hits, "memory_hits", rt.memory_hits, "cache_dir", dir);
}

/* The table forgets its entries but they are not freed and their .so files
 * are not dlclose'd: compiled graphs may still hold fn and the path strings,
 * and unmapping code that another thread is running crashes. They are
 * reclaimed by fc_cpu_free (module teardown), or the OS. */
FC_INTERNAL int
fc_cpu_cache_clear(int disk)
{
    free(rt.slots);
    rt.slots = NULL;
    rt.cap = rt.used = 0;
    if (!disk) {
        return 0;
    }
    if (!rt.configured) {
        return 0;
    }
    if (ensure_cache_dir() < 0) {
        return -1;
    }
    if (fc_disk_clear_dir(rt.cache_dir, 0) < 0) {
        PyErr_Format(PyExc_OSError, "fastcompile: could not empty the cache %s: %s",
                     rt.cache_dir, strerror(errno));
        return -1;
    }
    return 0;
}

FC_INTERNAL void
fc_cpu_free(void)
{
    drop_cache_dir();
    free(rt.cc);
    free(rt.include_dir);
    free(rt.cache_req);
    free(rt.version);
    free(rt.dump_dir);
    fc_disk_strv_free(rt.cflags);
    free(rt.cc_abs);
    free(rt.cc_line);
    free(rt.slots);
    while (rt.entries) {
        FcEntry *next = rt.entries->next;
        entry_free(rt.entries);
        rt.entries = next;
    }
    memset(&rt, 0, sizeof(rt));
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
