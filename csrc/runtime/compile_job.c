/* Runtime, compile jobs: one kernel's disk lookup or compile, publish and load, GIL-free.
 * In: an FcJob (source, key, compiler, flags, paths). Out: a loaded .so (handle, fn) or j->err. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/strbuf.h"
#include "../state.h"
#include "disk.h"
#include "spawn.h"

#define FC_LOG_MAX (1 << 20)       /* compiler output kept for the error message */
#define FC_META_WAIT_READ_MS 100   /* a reader waits this long for a .meta mid-publish */
#define FC_META_WAIT_PUBLISH_MS 2000
#define FC_PUBLISH_TRIES 3

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

void
fc_job_free(FcJob *j)
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
 * limit, and its flags: fc_ckey_flags, the vector width, -I<pch> for a kernel job (pch: the
 * precompiled header's folder, or NULL), -I<include_dir>, cflags; with pch,
 * the .gch's path. GIL held. 0, or -1 when out of memory. */
static int
job_prepare_compiler(FcJob *j, const char *pch)
{
    j->cc = strdup(fc_state.cpu.cc_abs);
    j->envp = fc_spawn_scrubbed_env();
    j->timeout_s = fc_state.cpu.timeout_s;
    j->pch_flag = -1;
    if (!j->cc || !j->envp || (pch && (j->pch_gch = fc_cpu_fmt("%s/%s.gch", pch, FC_PCH_HEADER)) == NULL)) {
        return -1;
    }
    for (int i = 0; i < FC_NFLAGS; i++) {
        if (fc_disk_strv_push(&j->flags, fc_ckey_flags[i]) < 0) {
            return -1;
        }
    }
    const char *const *width = fc_ckey_vector_width_flags();
    for (int i = 0; width != NULL && width[i] != NULL; i++) {
        if (fc_disk_strv_push(&j->flags, width[i]) < 0) {
            return -1;
        }
    }
    if (pch && !j->pch_build) {
        char *inc = fc_cpu_fmt("-I%s", pch);
        j->pch_flag = (int)fc_disk_strv_len(j->flags);
        int rc = inc ? fc_disk_strv_push(&j->flags, inc) : -1;
        free(inc);
        if (rc < 0) {
            return -1;
        }
    }
    if (fc_state.cpu.include_dir) {
        char *inc = fc_cpu_fmt("-I%s", fc_state.cpu.include_dir);
        int rc = inc ? fc_disk_strv_push(&j->flags, inc) : -1;
        free(inc);
        if (rc < 0) {
            return -1;
        }
    }
    for (char **f = fc_state.cpu.cflags; f && *f; f++) {
        if (fc_disk_strv_push(&j->flags, *f) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A kernel's job: copies what it needs out of rt; pch as for
 * job_prepare_compiler. GIL held. 0, or -1 with MemoryError. */
int
fc_job_prepare(FcJob *j, const char *source, const char *symbol, const char *key, const char *pch)
{
    j->source = source;
    j->source_len = strlen(source);
    j->weight = j->source_len + FC_RUN_WEIGHT;
    j->symbol = symbol;
    memcpy(j->key, key, 65);
    j->shard = fc_cpu_fmt("%s/%.2s", fc_state.cpu.cache_dir, key);
    j->so_path = fc_cpu_fmt("%s/%.2s/%s.so", fc_state.cpu.cache_dir, key, key);
    j->c_path = fc_cpu_fmt("%s/%.2s/%s.c", fc_state.cpu.cache_dir, key, key);
    j->meta_path = fc_cpu_fmt("%s/%.2s/%s.meta", fc_state.cpu.cache_dir, key, key);
    j->version = strdup(fc_state.cpu.version ? fc_state.cpu.version : "unknown");
    j->read_disk = !fc_state.cpu.always_compile;
    for (FcEntry *e = fc_state.cpu.entries; e != NULL; e = e->next) {
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
int
fc_job_prepare_pch(FcJob *j, const char *pch)
{
    j->pch_build = 1;
    j->c_path = fc_cpu_fmt("%s/%s", fc_state.cpu.include_dir, FC_PCH_HEADER);   /* the input */
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
        alias = fc_cpu_fmt("%s/%s.%s.so", j->shard, j->key, sfx);
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
    tmp_log = fc_cpu_fmt("%s/%s.%s.log", j->shard, j->key, sfx);
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
        argv[k++] = (char *)fc_ckey_libs[i];
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
    if (fc_spawn_wait(argv, j->envp, logfd, j->timeout_s, &status, &timed_out) < 0) {
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
            && fc_spawn_wait(argv, j->envp, logfd, j->timeout_s, &again, &timed_out) == 0) {
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
    tmp_meta = fc_cpu_fmt("%s/%s.%s.meta", j->shard, j->key, sfx);
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
    tmp_c = fc_cpu_fmt("%s/%s.%s.c", j->shard, j->key, sfx);
    tmp_so = fc_cpu_fmt("%s/%s.%s.so", j->shard, j->key, sfx);
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

/* A bundle (see fc_pool_make_bundles): the leader's members, itself first, compiled
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
    tmp_c = fc_cpu_fmt("%s/%s.%s.bundle.c", lead->shard, lead->key, sfx);
    tmp_so = fc_cpu_fmt("%s/%s.%s.bundle.so", lead->shard, lead->key, sfx);
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
    tmp = fc_cpu_fmt("%s.%s.tmp", j->pch_gch, sfx);
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
    if (fd < 0 || fc_spawn_wait(argv, j->envp, fd, j->timeout_s, &status, &timed_out) < 0) {
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
void
fc_job_run(FcJob *j)
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
