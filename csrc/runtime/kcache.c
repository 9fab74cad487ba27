/* Runtime, kernel cache: the private cache folder on disk and the in-memory kernel table.
 * In: fastcompile.config's cache_dir, (key, symbol) pairs. Out: a checked folder, FcEntry lookups. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../state.h"
#include "disk.h"

/* ---------------------------------------------------------------------------
 * The cache folder: private (0700, ours, not a symlink), never the CWD.
 * ------------------------------------------------------------------------- */

/* Forget the folder in use; a private fallback of ours is deleted with it
 * (kernels loaded from it stay mapped). */
void
fc_kcache_drop_dir(void)
{
    if (fc_state.cpu.cache_dir && fc_state.cpu.cache_is_fallback) {
        fc_disk_clear_dir(fc_state.cpu.cache_dir, 1);
    }
    free(fc_state.cpu.cache_dir);
    fc_state.cpu.cache_dir = NULL;
    fc_state.cpu.cache_is_fallback = 0;
}

/* Makes fc_state.cpu.cache_dir a checked private folder, re-checking one already chosen
 * (another process could have changed it since). An unsafe folder is refused
 * with a RuntimeWarning naming the reason, and a fresh mkdtemp folder is used
 * instead. GIL held. Returns 0, or -1 with an exception set. */
int
fc_kcache_ensure_dir(void)
{
    char why[512];
    char tmpl[] = "/tmp/fastcompile-XXXXXX";
    char *want = NULL, *msg = NULL;
    int rc = -1;

    if (fc_state.cpu.cache_dir && fc_disk_check_private(fc_state.cpu.cache_dir, why, sizeof(why)) == 0) {
        return 0;
    }
    /* first use, or the folder went bad since: resolve the request again */
    if (fc_state.cpu.cache_req == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: no cache folder configured "
                        "(fastcompile.config.resolved() gives cache_dir)");
        goto cleanup;
    }
    want = strdup(fc_state.cpu.cache_req);
    if (want == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (size_t n = strlen(want); n > 1 && want[n - 1] == '/'; n--) {
        want[n - 1] = '\0';   /* "link/" would make lstat follow the link */
    }
    fc_kcache_drop_dir();
    if (want[0] != '/') {
        snprintf(why, sizeof(why), "it is not an absolute path (the cache is never the CWD)");
    }
    else if (fc_disk_mkdir_p(want, 0700) < 0) {
        snprintf(why, sizeof(why), "cannot create it: %s", strerror(errno));
    }
    else if (fc_disk_check_private(want, why, sizeof(why)) == 0) {
        fc_state.cpu.cache_dir = want;
        want = NULL;
        rc = 0;
        goto cleanup;
    }
    if (mkdtemp(tmpl) == NULL) {
        PyErr_Format(PyExc_RuntimeError, "fastcompile: cache dir %s refused (%s), and no private "
                     "fallback could be made: mkdtemp: %s", want, why, strerror(errno));
        goto cleanup;
    }
    fc_state.cpu.cache_dir = strdup(tmpl);
    if (fc_state.cpu.cache_dir == NULL) {
        rmdir(tmpl);
        PyErr_NoMemory();
        goto cleanup;
    }
    fc_state.cpu.cache_is_fallback = 1;
    msg = fc_cpu_fmt("fastcompile: refusing cache dir %s (%s); using the private folder %s for this "
              "process instead", want, why, tmpl);
    if (msg == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    rc = fc_cpu_warn(msg);
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
    return fc_kcache_ensure_dir() < 0 ? NULL : fc_state.cpu.cache_dir;
}

const char *
fc_cpu_include_dir(void)
{
    return fc_state.cpu.include_dir;
}

const char *
fc_cpu_version(void)
{
    return fc_state.cpu.version ? fc_state.cpu.version : "0";
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

FcEntry *
fc_kcache_find(const char *key, const char *symbol)
{
    if (fc_state.cpu.cap == 0) {
        return NULL;
    }
    for (size_t i = entry_hash(key, symbol) & (fc_state.cpu.cap - 1);; i = (i + 1) & (fc_state.cpu.cap - 1)) {
        FcEntry *e = fc_state.cpu.slots[i];
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

/* Indexes e (already on fc_state.cpu.entries). 0, or -1 with MemoryError. */
int
fc_kcache_insert(FcEntry *e)
{
    if (2 * (fc_state.cpu.used + 1) > fc_state.cpu.cap) {
        size_t cap = fc_state.cpu.cap ? 2 * fc_state.cpu.cap : 64;
        FcEntry **slots = calloc(cap, sizeof(FcEntry *));
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < fc_state.cpu.cap; i++) {
            if (fc_state.cpu.slots[i]) {
                table_place(slots, cap, fc_state.cpu.slots[i]);
            }
        }
        free(fc_state.cpu.slots);
        fc_state.cpu.slots = slots;
        fc_state.cpu.cap = cap;
    }
    table_place(fc_state.cpu.slots, fc_state.cpu.cap, e);
    fc_state.cpu.used++;
    return 0;
}

void
fc_kcache_entry_free(FcEntry *e)
{
    free(e->key);
    free(e->symbol);
    free(e->so_path);
    free(e->c_path);
    free(e);
}
