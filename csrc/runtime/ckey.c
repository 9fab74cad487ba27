/* Runtime, compile key: the disk-cache key of a CPU kernel.
 * In: the compile line, the compiler, the CPU, the shipped headers, a kernel's source. Out: hex sha256 keys. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/strbuf.h"
#include "../state.h"
#include "disk.h"
#include "spawn.h"
#include "sha256.h"

/* The kernel compile line:
 *     cc fc_ckey_flags [-mprefer-vector-width=N -DFC_VECTOR_BITS=N] [-I<pch dir>] -I<include_dir> <cflags>
 *        -o OUT SRC fc_ckey_libs
 * Never -ffast-math/-Ofast: they link crtfastmath.o, which sets FTZ/DAZ in MXCSR
 * for the whole process when the .so is loaded. -nostartfiles leaves out the
 * crt*.o files altogether (crtfastmath.o is one; kernels need none of them):
 * no constructor or destructor runs from a kernel .so, so loading cannot
 * touch MXCSR and exit never runs code from a kernel file that someone
 * truncated under us. -O2, not -O3: the hot loops carry `omp simd` and are
 * vectorized either way, and -O2 compiles reduction kernels faster.
 * -nodefaultlibs: the driver's default -lgcc_s -lc (linker scripts naming
 * several libraries) make linking slower; fc_ckey_libs names
 * libgcc (static helpers) again, and libc's symbols (memcpy) resolve at load
 * time through libm's and libgomp's own dependency on it.
 * -mprefer-vector-width (x86-64, fc_ckey_vector_width_flags): GCC's tuning for
 * CPUs that run 256-bit ops as two halves prefers 128-bit vectors even with
 * AVX2, and then calls libmvec's SSE4 variants (_ZGVbN4v_expf), which have no
 * FMA; with 256-bit vectors the AVX2 variants are called (float64 exp, log,
 * sin, ... still call libmvec). GCC tunes every AVX-512 CPU for 256-bit
 * vectors, because Intel's first AVX-512 cores lower their clock under 512-bit
 * work; AMD's AVX-512 cores keep it, and so do Intel's from the first with
 * AVX512-VBMI2 on (torch's own kernels run 512-bit there): there 512 bits make
 * arithmetic-heavy kernels faster, and a memory-bound add is unchanged. So
 * AMD CPUs with AVX-512 and Intel CPUs with AVX512-VBMI2 get 512; every other
 * x86-64 CPU gets 256.
 * -DFC_VECTOR_BITS tells fc_kernel.h the same width: reductions take one
 * register of float32 as their lane count (FC_LANES; gen_c.c, sweep_lanes_wide). */
const char *const fc_ckey_flags[FC_NFLAGS] = {
    "-O2", "-march=native", "-std=c11", "-fPIC", "-shared", "-fopenmp",
    "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fwrapv",
    "-fvisibility=hidden", "-nostartfiles", "-nodefaultlibs",
};
const char *const fc_ckey_libs[FC_NLIBS] = {"-lmvec", "-lm", "-lgcc"};

/* The vector-width flags for the CPU this process runs on (see the compile
 * line's comment above): a NULL-terminated static array, or NULL where there
 * are none to give. */
const char *const *
fc_ckey_vector_width_flags(void)
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

#define FC_PROBE_TIMEOUT_S 30      /* cc --version */

/* The first line of s (without the newline), copied; NULL when out of memory. */
static char *
first_line(const char *s)
{
    size_t n = strcspn(s, "\r\n");
    return strndup(s, n);
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
    id_path = fc_cpu_fmt("%s/compiler-%.16s.id", fc_state.cpu.cache_dir, hex);
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
    envp = fc_spawn_scrubbed_env();
    if (fd < 0 || envp == NULL || fc_disk_strv_push(&argv, cc_abs) < 0
        || fc_disk_strv_push(&argv, "--version") < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto cleanup;
    }
    /* the GIL stays held: a few ms once per compiler, and fc_state.cpu.cc_abs must not
     * change under us */
    int rc = fc_spawn_wait(argv, envp, fd, FC_PROBE_TIMEOUT_S, &status, &timed_out);
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
    stored = fc_cpu_fmt("%s\n", line);
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
        char *path = fc_cpu_fmt("%s/%s", dir, names[i]), *text = NULL;
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
 * fc_state.cpu.digest, once per configuration. GIL held; 0 or -1 with an exception. */
int
fc_ckey_ensure_identity(void)
{
    FcSha256 s;
    if (fc_state.cpu.have_digest) {
        return 0;
    }
    free(fc_state.cpu.cc_abs);
    free(fc_state.cpu.cc_line);
    fc_state.cpu.cc_line = NULL;
    fc_state.cpu.cc_abs = fc_spawn_find_program(fc_state.cpu.cc && fc_state.cpu.cc[0] ? fc_state.cpu.cc : "cc");
    if (fc_state.cpu.cc_abs == NULL) {
        PyErr_Format(PyExc_RuntimeError, "fastcompile: C compiler '%s' not found or not "
                     "executable (set FASTCOMPILE_CC or CC)", fc_state.cpu.cc ? fc_state.cpu.cc : "cc");
        return -1;
    }
    fc_state.cpu.cc_line = compiler_line(fc_state.cpu.cc_abs);
    if (fc_state.cpu.cc_line == NULL) {
        return -1;
    }
    fc_sha256_init(&s);
    key_str(&s, "fastcompile-cpu-key", "1");
    key_str(&s, "cc", fc_state.cpu.cc_abs);
    key_str(&s, "cc --version", fc_state.cpu.cc_line);
    for (int i = 0; i < FC_NFLAGS; i++) {
        key_str(&s, "flag", fc_ckey_flags[i]);
    }
    const char *const *width = fc_ckey_vector_width_flags();
    for (int i = 0; width != NULL && width[i] != NULL; i++) {
        key_str(&s, "flag", width[i]);
    }
    if (fc_state.cpu.include_dir) {
        key_str(&s, "include", fc_state.cpu.include_dir);
    }
    for (char **f = fc_state.cpu.cflags; f && *f; f++) {
        key_str(&s, "cflag", *f);
    }
    for (int i = 0; i < FC_NLIBS; i++) {
        key_str(&s, "lib", fc_ckey_libs[i]);
    }
    key_cpu(&s);
    key_str(&s, "version", fc_state.cpu.version);
    key_headers(&s, fc_state.cpu.include_dir);
    fc_sha256_final(&s, fc_state.cpu.digest);
    fc_state.cpu.have_digest = 1;
    return 0;
}

void
fc_ckey_kernel(const char *source, char hex[65])
{
    FcSha256 s;
    uint8_t digest[32];
    fc_sha256_init(&s);
    fc_sha256_update(&s, fc_state.cpu.digest, sizeof(fc_state.cpu.digest));
    key_str(&s, "source", key_body(source));
    fc_sha256_final(&s, digest);
    fc_sha256_hex(digest, hex);
}
