/* CUDA emulation, host side: a fake NVRTC and a fake driver in one library, for tests.
 * In: gen_cuda kernels (compiled by g++ with fc_emu.h). Out: launches run on the CPU, each block's
 * threads as fibers with real __syncthreads/warp-shuffle barriers (tests/test_cuda_emulated.py).
 *
 * NVRTC: "compiling" writes the program and its headers to $FC_EMU_DIR and runs g++ into a shared
 * object; the "cubin" is that file's path. Driver: one device (sm_90, one multiprocessor), the
 * module is the dlopen'd object, a launch runs the grid's blocks one after another, synchronously.
 * Every status is 0 (success) or 1 (failure). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- NVRTC ------------------------------------------------------------- */

typedef struct {
    char *src;
    int nheaders;
    char **headers, **names;
    char *log;
    char *image;               /* the .so path */
} Prog;

static char *
dup_str(const char *s)
{
    char *d = malloc(strlen(s) + 1);
    if (d) {
        strcpy(d, s);
    }
    return d;
}

EXPORT int nvrtcVersion(int *major, int *minor) { *major = 99; *minor = 0; return 0; }
EXPORT const char *nvrtcGetErrorString(int rc) { return rc ? "EMU_ERROR" : "EMU_SUCCESS"; }
EXPORT int nvrtcGetNumSupportedArchs(int *n) { *n = 2; return 0; }
EXPORT int nvrtcGetSupportedArchs(int *a) { a[0] = 80; a[1] = 90; return 0; }

EXPORT int
nvrtcCreateProgram(Prog **out, const char *src, const char *name, int n, const char *const *headers,
                   const char *const *names)
{
    Prog *p = calloc(1, sizeof(Prog));
    (void)name;
    p->src = dup_str(src);
    p->nheaders = n;
    p->headers = calloc(n + 1, sizeof(char *));
    p->names = calloc(n + 1, sizeof(char *));
    for (int i = 0; i < n; i++) {
        p->headers[i] = dup_str(headers[i]);
        p->names[i] = dup_str(names[i]);
    }
    *out = p;
    return 0;
}

static int
write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    fputs(text, f);
    return fclose(f);
}

/* for each entry point "NAME_iW(const TYPE L)": extern "C" void NAME_iW__emu(p, api) */
static void
write_trampolines(FILE *f, const char *src)
{
    const char *p = src;
    while ((p = strstr(p, "(const ")) != NULL) {
        const char *end = p, *start = p, *t = p + 7, *te = strstr(t, " L)");
        while (start > src && (start[-1] == '_' || (start[-1] >= 'a' && start[-1] <= 'z') ||
                               (start[-1] >= 'A' && start[-1] <= 'Z') || (start[-1] >= '0' && start[-1] <= '9'))) {
            start--;
        }
        p += 7;
        if (te == NULL || end - start < 5 || (strncmp(end - 4, "_i32", 4) != 0 && strncmp(end - 4, "_i64", 4) != 0) ||
                memchr(t, '\n', te - t) != NULL) {
            continue;
        }
        fprintf(f, "\n#if !defined(FC_CU_INDEX) || FC_CU_INDEX == %.2s\n", end - 2);
        fprintf(f, "extern \"C\" void %.*s__emu(const void *p, const fc_emu_api *api)\n{\n", (int)(end - start), start);
        fprintf(f, "    fc_emu = api;\n    %.*s(*(const %.*s *)p);\n}\n#endif\n", (int)(end - start), start,
                (int)(te - t), t);
    }
}

EXPORT int
nvrtcCompileProgram(Prog *p, int nopts, const char *const *opts)
{
    const char *dir = getenv("FC_EMU_DIR");
    static int serial;
    char path[4096], cmd[16384], so[4096], logpath[4096];
    FILE *f;
    int rc;
    if (dir == NULL) {
        p->log = dup_str("FC_EMU_DIR is not set");
        return 1;
    }
    for (int i = 0; i < p->nheaders; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, p->names[i]);
        if (write_file(path, p->headers[i]) < 0) {
            p->log = dup_str("cannot write a header");
            return 1;
        }
    }
    snprintf(path, sizeof(path), "%s/k%d_%d.cpp", dir, (int)getpid(), serial);
    snprintf(so, sizeof(so), "%s/k%d_%d.so", dir, (int)getpid(), serial);
    snprintf(logpath, sizeof(logpath), "%s/k%d_%d.log", dir, (int)getpid(), serial++);
    if ((f = fopen(path, "w")) == NULL) {
        p->log = dup_str("cannot write the program");
        return 1;
    }
    fputs(p->src, f);
    write_trampolines(f, p->src);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "g++ -std=c++17 -O1 -fPIC -shared -w -ffp-contract=off -include %s/fc_emu.h -I%s",
             getenv("FC_EMU_SHIM") ? getenv("FC_EMU_SHIM") : dir, dir);
    for (int i = 0; i < nopts; i++) {
        if (strncmp(opts[i], "-D", 2) == 0) {
            strcat(cmd, " ");
            strcat(cmd, opts[i]);
        }
    }
    snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), " %s -o %s > %s 2>&1", path, so, logpath);
    rc = system(cmd);
    if (rc != 0) {
        char *text = NULL;
        size_t n = 0;
        FILE *lf = fopen(logpath, "r");
        if (lf) {
            text = calloc(1, 1 << 20);
            n = fread(text, 1, (1 << 20) - 1, lf);
            text[n] = 0;
            fclose(lf);
        }
        p->log = text ? text : dup_str("g++ failed");
        return 1;
    }
    p->image = dup_str(so);
    return 0;
}

EXPORT int nvrtcGetProgramLogSize(Prog *p, size_t *n) { *n = p->log ? strlen(p->log) + 1 : 1; return 0; }
EXPORT int nvrtcGetProgramLog(Prog *p, char *out) { strcpy(out, p->log ? p->log : ""); return 0; }
EXPORT int nvrtcGetCUBINSize(Prog *p, size_t *n) { *n = strlen(p->image) + 1; return 0; }
EXPORT int nvrtcGetCUBIN(Prog *p, char *out) { strcpy(out, p->image); return 0; }
EXPORT int nvrtcGetPTXSize(Prog *p, size_t *n) { return nvrtcGetCUBINSize(p, n); }
EXPORT int nvrtcGetPTX(Prog *p, char *out) { return nvrtcGetCUBIN(p, out); }

EXPORT int
nvrtcDestroyProgram(Prog **pp)
{
    Prog *p = *pp;
    for (int i = 0; i < p->nheaders; i++) {
        free(p->headers[i]);
        free(p->names[i]);
    }
    free(p->headers);
    free(p->names);
    free(p->src);
    free(p->log);
    free(p->image);
    free(p);
    *pp = NULL;
    return 0;
}

/* ---- driver -------------------------------------------------------------- */

EXPORT int cuInit(unsigned flags) { (void)flags; return 0; }
EXPORT int cuDriverGetVersion(int *v) { *v = 99000; return 0; }
EXPORT int cuGetErrorString(int rc, const char **s) { *s = rc ? "CUDA_EMU_ERROR" : "CUDA_SUCCESS"; return 0; }
EXPORT int cuDeviceGetCount(int *n) { *n = 1; return 0; }
EXPORT int cuDeviceGet(int *d, int i) { *d = i; return i == 0 ? 0 : 1; }

EXPORT int
cuDeviceGetAttribute(int *v, int attr, int dev)
{
    (void)dev;
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 1 : 0;   /* sm_90, one multiprocessor */
    return 0;
}

static int the_ctx;
EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &the_ctx; return 0; }
EXPORT int cuCtxPushCurrent_v2(void *ctx) { (void)ctx; return 0; }
EXPORT int cuCtxPopCurrent_v2(void **ctx) { *ctx = &the_ctx; return 0; }

EXPORT int
cuModuleLoadData(void **mod, const void *image)
{
    void *h = dlopen((const char *)image, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "emu_cuda: dlopen %s: %s\n", (const char *)image, dlerror());
        return 1;
    }
    *mod = h;
    return 0;
}

EXPORT int
cuModuleUnload(void *mod)
{
    return dlclose(mod) == 0 ? 0 : 1;
}

EXPORT int
cuModuleGetFunction(void **fn, void *mod, const char *name)
{
    char sym[512];
    snprintf(sym, sizeof(sym), "%s__emu", name);
    *fn = dlsym(mod, sym);
    return *fn ? 0 : 1;
}

/* ---- the fiber scheduler ---- */

typedef struct { unsigned x, y, z; } Dim;
typedef struct {
    const Dim *tid, *bid, *bdim, *gdim;
    void (*block_sync)(void);
    void (*warp_sync)(void);
    unsigned long long *slots;
} Api;
typedef void (*Entry)(const void *, const Api *);

enum { RUN, AT_BLOCK, AT_WARP, DONE };
#define MAXT 1024
#define STACK (256 << 10)

static struct {
    ucontext_t sched, ctx[MAXT];
    char *stacks;
    int state[MAXT];
    int nthreads, cur;
    Dim tid, bid, bdim, gdim;
    Entry entry;
    const void *params;
    Api api;
    unsigned long long slots[MAXT];
} E;

static void
yield_as(int state)
{
    E.state[E.cur] = state;
    swapcontext(&E.ctx[E.cur], &E.sched);
}

static void block_sync(void) { yield_as(AT_BLOCK); }
static void warp_sync(void) { yield_as(AT_WARP); }

static void
fiber_main(void)
{
    E.entry(E.params, &E.api);
    E.state[E.cur] = DONE;
}

/* runs one block to its end; 0, or 1 when its threads deadlock */
static int
run_block(void)
{
    for (int t = 0; t < E.nthreads; t++) {
        getcontext(&E.ctx[t]);
        E.ctx[t].uc_stack.ss_sp = E.stacks + (size_t)t * STACK;
        E.ctx[t].uc_stack.ss_size = STACK;
        E.ctx[t].uc_link = &E.sched;
        makecontext(&E.ctx[t], fiber_main, 0);
        E.state[t] = RUN;
    }
    for (;;) {
        int ran = 0, done = 0, at_block = 0;
        for (int t = 0; t < E.nthreads; t++) {
            if (E.state[t] == RUN) {
                E.cur = t;
                E.tid.x = (unsigned)t;
                swapcontext(&E.sched, &E.ctx[t]);
                ran = 1;
            }
        }
        for (int t = 0; t < E.nthreads; t++) {
            done += E.state[t] == DONE;
            at_block += E.state[t] == AT_BLOCK;
        }
        if (done == E.nthreads) {
            return 0;
        }
        if (at_block + done == E.nthreads) {
            for (int t = 0; t < E.nthreads; t++) {
                E.state[t] = E.state[t] == AT_BLOCK ? RUN : E.state[t];
            }
            continue;
        }
        for (int w = 0; w * 32 < E.nthreads; w++) {      /* a warp whose lanes all wait */
            int n = 0, lanes = 0;
            for (int t = w * 32; t < w * 32 + 32 && t < E.nthreads; t++) {
                lanes++;
                n += E.state[t] == AT_WARP;
            }
            if (n == lanes) {
                for (int t = w * 32; t < w * 32 + lanes; t++) {
                    E.state[t] = RUN;
                }
                ran = 1;
            }
        }
        if (!ran) {
            fprintf(stderr, "emu_cuda: the block's threads deadlock\n");
            return 1;
        }
    }
}

EXPORT int
cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
               unsigned shmem, void *stream, void **params, void **extra)
{
    (void)shmem;
    (void)stream;
    (void)params;
    if (gy != 1 || gz != 1 || by != 1 || bz != 1 || bx > MAXT || extra == NULL) {
        return 1;
    }
    if (E.stacks == NULL && (E.stacks = malloc((size_t)MAXT * STACK)) == NULL) {
        return 1;
    }
    E.entry = (Entry)fn;
    E.params = extra[1];
    E.nthreads = (int)bx;
    E.bdim = (Dim){bx, 1, 1};
    E.gdim = (Dim){gx, 1, 1};
    E.tid = (Dim){0, 0, 0};
    E.api = (Api){&E.tid, &E.bid, &E.bdim, &E.gdim, block_sync, warp_sync, E.slots};
    for (unsigned b = 0; b < gx; b++) {
        E.bid = (Dim){b, 0, 0};
        if (run_block() != 0) {
            return 1;
        }
    }
    return 0;
}
