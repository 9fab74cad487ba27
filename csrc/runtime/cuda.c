/* Runtime, CUDA: CUDA source text -> cubin (NVRTC, disk cache) -> module -> launch on a stream.
 * In: kernel source from gen_cuda. Out: cubins, loaded functions, cuda_info(). Builds without a CUDA toolkit. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/strbuf.h"
#include "cpu.h"
#include "cuda.h"
#include "disk.h"
#include "sha256.h"

/* ---------------------------------------------------------------------------
 * The few driver and NVRTC declarations we use (stable C ABI since CUDA 11),
 * resolved with dlsym: the build needs no toolkit, the import no GPU.
 * ------------------------------------------------------------------------- */
typedef int CUresult;                     /* 0: CUDA_SUCCESS */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef int nvrtcResult;                  /* 0: NVRTC_SUCCESS */
typedef struct _nvrtcProgram *nvrtcProgram;

#define FC_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define FC_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define FC_CU_THREADS 256                 /* as fc_cuda_kernel.h */
#define FC_CU_LAUNCH_PARAM_END ((void *)0x00)
#define FC_CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define FC_CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

typedef struct {
    /* NVRTC */
    void *nvrtc;
    char *nvrtc_path;
    char nvrtc_why[512];
    int nvrtc_major, nvrtc_minor;
    int archs[64]; int narchs;            /* NVRTC's supported sm_XY, as XY */
    nvrtcResult (*nvrtcVersion)(int *, int *);
    const char *(*nvrtcGetErrorString)(nvrtcResult);
    nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                      const char *const *, const char *const *);
    nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *);
    nvrtcResult (*nvrtcGetNumSupportedArchs)(int *);
    nvrtcResult (*nvrtcGetSupportedArchs)(int *);
    /* driver */
    void *cuda;
    char cuda_why[512];
    int driver_version;
    int ndevices;
    int inited;                           /* cuInit attempted: 1 ok, -1 failed */
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuGetErrorString)(CUresult, const char **);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuCtxPushCurrent)(CUcontext);
    CUresult (*cuCtxPopCurrent)(CUcontext *);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
    int fmad;                             /* fastcompile.config.cuda_fmad: contract a * b + c */
    int64_t max_grid;                     /* fastcompile.config.cuda_max_grid (0: none) */
    char nvrtc_req[4096];                 /* fastcompile.config.nvrtc ("": search) */
    char libcuda_req[4096];               /* fastcompile.config.libcuda ("": libcuda.so.1) */
    CUcontext ctx[16];                    /* retained primary contexts (torch's), per device */
    int probed;
} FcCudaRt;

static FcCudaRt cu;

/* ---------------------------------------------------------------------------
 * The one status check: every NVRTC and driver call goes through FC_CUDA_CHECK,
 * which raises RuntimeError with the call, the error string, and for NVRTC
 * compiles the program log and the numbered source, then jumps to error:.
 * ------------------------------------------------------------------------- */
#define FC_NVRTC 0
#define FC_DRIVER 1
#define FC_CUDA_CHECK(api, call, prog, src)                                 \
    do {                                                                    \
        int rc_ = (call);                                                   \
        if (rc_ != 0) {                                                     \
            cuda_raise((api), rc_, #call, (prog), (src));                   \
            goto error;                                                     \
        }                                                                   \
    } while (0)

static char *
program_log(nvrtcProgram prog)
{
    size_t n = 0;
    char *log;
    if (prog == NULL || cu.nvrtcGetProgramLogSize(prog, &n) != 0 || n == 0) {
        return NULL;
    }
    log = PyMem_Malloc(n + 1);
    if (log != NULL && cu.nvrtcGetProgramLog(prog, log) != 0) {
        PyMem_Free(log);
        return NULL;
    }
    if (log != NULL) {
        log[n] = 0;
    }
    return log;
}

static void
cuda_raise(int api, int rc, const char *call, nvrtcProgram prog, const char *src)
{
    FcStr b = {0};
    const char *what = NULL;
    char *log = NULL, *text;
    if (api == FC_NVRTC) {
        what = cu.nvrtcGetErrorString ? cu.nvrtcGetErrorString(rc) : NULL;
        log = program_log(prog);
    }
    else if (cu.cuGetErrorString == NULL || cu.cuGetErrorString(rc, &what) != 0) {
        what = NULL;
    }
    fc_str_printf(&b, "fastcompile: %s failed with %s (%d): %s", api == FC_NVRTC ? "NVRTC" : "CUDA",
                  what ? what : "unknown error", rc, call);
    if (log != NULL && log[0]) {
        fc_str_printf(&b, "\n--- NVRTC log ---\n%s", log);
    }
    if (src != NULL) {
        int line = 1;
        const char *p = src;
        fc_str_puts(&b, "\n--- source ---\n");
        while (*p) {
            const char *nl = strchr(p, '\n');
            size_t len = nl ? (size_t)(nl - p) : strlen(p);
            fc_str_printf(&b, "%4d  %.*s\n", line++, (int)len, p);
            p += len + (nl ? 1 : 0);
        }
    }
    PyMem_Free(log);
    text = fc_str_take(&b);
    if (text != NULL) {
        PyErr_SetString(PyExc_RuntimeError, text);
        fc_str_release(text);
    }
}

/* ---------------------------------------------------------------------------
 * Finding the libraries
 * ------------------------------------------------------------------------- */

static const char *nvrtc_names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so", NULL};

/* dlopen dir/<name> for the first name present; NULL if none */
static void *
open_in_dir(const char *dir, char **path_out)
{
    for (int i = 0; nvrtc_names[i]; i++) {
        char path[4096];
        void *h;
        snprintf(path, sizeof(path), "%s/%s", dir, nvrtc_names[i]);
        if (access(path, R_OK) != 0) {
            continue;
        }
        if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL) {
            *path_out = strdup(path);
            return h;
        }
        snprintf(cu.nvrtc_why, sizeof(cu.nvrtc_why), "dlopen(%s): %s", path, dlerror());
    }
    return NULL;
}

/* the nvidia-cuda-nvrtc wheel: <site-packages>/nvidia/cuda_nvrtc/lib, for
 * every entry of sys.path. GIL held. */
static void *
open_from_wheel(char **path_out)
{
    PyObject *path = PySys_GetObject("path");   /* borrowed */
    if (path == NULL || !PyList_Check(path)) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(path); i++) {
        PyObject *e = PyList_GET_ITEM(path, i);
        const char *s = PyUnicode_Check(e) ? PyUnicode_AsUTF8(e) : NULL;
        char dir[4096];
        void *h;
        if (s == NULL) {
            PyErr_Clear();
            continue;
        }
        /* CUDA 12's wheel, then CUDA 13's (one folder for every component) */
        static const char *sub[] = {"nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib"};
        for (int j = 0; j < 2; j++) {
            snprintf(dir, sizeof(dir), "%s/%s", s[0] ? s : ".", sub[j]);
            if ((h = open_in_dir(dir, path_out)) != NULL) {
                return h;
            }
        }
    }
    return NULL;
}

#define SYM(lib, name)                                                        \
    do {                                                                      \
        *(void **)&cu.name = dlsym(lib, #name);                               \
        if (cu.name == NULL) {                                                \
            snprintf(why, whylen, "%s has no symbol %s", libname, #name);     \
            return -1;                                                        \
        }                                                                     \
    } while (0)
#define SYM_AS(lib, field, name)                                              \
    do {                                                                      \
        *(void **)&cu.field = dlsym(lib, name);                               \
        if (cu.field == NULL) {                                               \
            snprintf(why, whylen, "%s has no symbol %s", libname, name);      \
            return -1;                                                        \
        }                                                                     \
    } while (0)

static int
bind_nvrtc(void *h, const char *libname, char *why, size_t whylen)
{
    SYM(h, nvrtcVersion);
    SYM(h, nvrtcGetErrorString);
    SYM(h, nvrtcCreateProgram);
    SYM(h, nvrtcCompileProgram);
    SYM(h, nvrtcGetProgramLogSize);
    SYM(h, nvrtcGetProgramLog);
    SYM(h, nvrtcGetCUBINSize);
    SYM(h, nvrtcGetCUBIN);
    SYM(h, nvrtcGetPTXSize);
    SYM(h, nvrtcGetPTX);
    SYM(h, nvrtcDestroyProgram);
    SYM(h, nvrtcGetNumSupportedArchs);
    SYM(h, nvrtcGetSupportedArchs);
    return 0;
}

static int
bind_driver(void *h, const char *libname, char *why, size_t whylen)
{
    SYM(h, cuInit);
    SYM(h, cuDriverGetVersion);
    SYM(h, cuGetErrorString);
    SYM(h, cuDeviceGetCount);
    SYM(h, cuDeviceGet);
    SYM(h, cuDeviceGetAttribute);
    SYM(h, cuDevicePrimaryCtxRetain);
    SYM_AS(h, cuCtxPushCurrent, "cuCtxPushCurrent_v2");
    SYM_AS(h, cuCtxPopCurrent, "cuCtxPopCurrent_v2");
    SYM(h, cuModuleLoadData);
    SYM(h, cuModuleUnload);
    SYM(h, cuModuleGetFunction);
    SYM(h, cuLaunchKernel);
    return 0;
}

/* Search order: config.nvrtc ($FASTCOMPILE_NVRTC: a file or a folder), the
 * nvidia-cuda-nvrtc wheel, $CUDA_HOME/lib64, /usr/local/cuda/lib64, the
 * loader's path. Never raises; cu.nvrtc_why says what went wrong. GIL held. */
static void
probe_nvrtc(void)
{
    const char *env = cu.nvrtc_req;
    const char *home = getenv("CUDA_HOME");   /* a place to search, not our knob */
    char *path = NULL;
    void *h = NULL;
    snprintf(cu.nvrtc_why, sizeof(cu.nvrtc_why),
             "libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12, or set FASTCOMPILE_NVRTC)");
    if (env != NULL && env[0]) {
        if ((h = open_in_dir(env, &path)) == NULL && access(env, R_OK) == 0) {
            h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
            path = h ? strdup(env) : NULL;
            if (h == NULL) {
                snprintf(cu.nvrtc_why, sizeof(cu.nvrtc_why), "dlopen(%s): %s", env, dlerror());
            }
        }
        if (h == NULL) {
            return;   /* an explicit choice that fails is not silently replaced */
        }
    }
    if (h == NULL) {
        h = open_from_wheel(&path);
    }
    if (h == NULL && home != NULL && home[0]) {
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s/lib64", home);
        h = open_in_dir(dir, &path);
    }
    if (h == NULL) {
        h = open_in_dir("/usr/local/cuda/lib64", &path);
    }
    for (int i = 0; h == NULL && nvrtc_names[i]; i++) {
        if ((h = dlopen(nvrtc_names[i], RTLD_NOW | RTLD_LOCAL)) != NULL) {
            path = strdup(nvrtc_names[i]);
        }
    }
    if (h == NULL) {
        return;
    }
    if (bind_nvrtc(h, path ? path : "libnvrtc", cu.nvrtc_why, sizeof(cu.nvrtc_why)) < 0 ||
            cu.nvrtcVersion(&cu.nvrtc_major, &cu.nvrtc_minor) != 0) {
        dlclose(h);
        free(path);
        return;
    }
    if (cu.nvrtcGetNumSupportedArchs(&cu.narchs) != 0 || cu.narchs <= 0 || cu.narchs > 64 ||
            cu.nvrtcGetSupportedArchs(cu.archs) != 0) {
        cu.narchs = 0;
    }
    cu.nvrtc = h;
    cu.nvrtc_path = path;
    cu.nvrtc_why[0] = 0;
}

/* libcuda.so.1 (config.libcuda, $FASTCOMPILE_LIBCUDA, overrides), cuInit, device count.
 * Never raises; cu.cuda_why says why there is no device. GIL held. */
static void
probe_driver(void)
{
    const char *env = cu.libcuda_req;
    const char *name = env && env[0] ? env : "libcuda.so.1";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    int rc;
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(cu.cuda_why, sizeof(cu.cuda_why), "no NVIDIA driver: dlopen(%s) failed: %s", name,
                 e ? e : "not found");
        return;
    }
    if (bind_driver(h, name, cu.cuda_why, sizeof(cu.cuda_why)) < 0) {
        dlclose(h);
        return;
    }
    cu.cuda = h;
    cu.cuDriverGetVersion(&cu.driver_version);
    if ((rc = cu.cuInit(0)) != 0) {
        const char *what = NULL;
        cu.cuGetErrorString(rc, &what);
        snprintf(cu.cuda_why, sizeof(cu.cuda_why), "cuInit failed: %s (%d)", what ? what : "?", rc);
        cu.inited = -1;
        return;
    }
    cu.inited = 1;
    if ((rc = cu.cuDeviceGetCount(&cu.ndevices)) != 0 || cu.ndevices == 0) {
        snprintf(cu.cuda_why, sizeof(cu.cuda_why), "the driver reports no CUDA device");
        cu.ndevices = 0;
        return;
    }
    cu.cuda_why[0] = 0;
}

static void
probe(void)
{
    if (!cu.probed) {
        cu.probed = 1;
        probe_nvrtc();
        probe_driver();
    }
}

int
fc_cuda_nvrtc_found(void)
{
    probe();
    return cu.nvrtc != NULL;
}

const char *
fc_cuda_unavailable(void)
{
    probe();
    return cu.ndevices > 0 ? NULL : cu.cuda_why;
}

/* ---------------------------------------------------------------------------
 * NVRTC -> cubin, through the disk cache
 * ------------------------------------------------------------------------- */

/* the shipped device headers, handed to NVRTC in memory (and hashed into the key) */
static const char *header_names[] = {"fc_cuda_kernel.h", "fc_cuda_math.h", "fc_math_common.h"};
#define NHEADERS 3

static int
read_headers(char *text[NHEADERS])
{
    const char *dir = fc_cpu_include_dir();
    for (int i = 0; i < NHEADERS; i++) {
        char path[4096];
        size_t n;
        text[i] = NULL;
        snprintf(path, sizeof(path), "%s/%s", dir ? dir : ".", header_names[i]);
        if (dir == NULL || fc_disk_read_all(path, 16 << 20, &text[i], &n) < 0) {
            PyErr_Format(PyExc_RuntimeError, "fastcompile: cannot read the CUDA header %s: %s", path,
                         dir ? strerror(errno) : "include_dir is not configured");
            return -1;
        }
    }
    return 0;
}

/* "sm_90" -> 90; 0 if malformed */
static int
arch_number(const char *arch)
{
    int n = 0;
    if (arch == NULL || strncmp(arch, "sm_", 3) != 0) {
        return 0;
    }
    for (const char *p = arch + 3; *p; p++) {
        if (*p < '0' || *p > '9') {
            return *p == 'a' && p[1] == 0 ? n : 0;   /* sm_90a */
        }
        n = n * 10 + (*p - '0');
    }
    return n;
}

/* the device's arch, or 0 without one */
static int
device_arch(int dev)
{
    CUdevice d;
    int major = 0, minor = 0;
    probe();
    if (cu.ndevices <= dev || cu.cuDeviceGet(&d, dev) != 0 ||
            cu.cuDeviceGetAttribute(&major, FC_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d) != 0 ||
            cu.cuDeviceGetAttribute(&minor, FC_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d) != 0) {
        return 0;
    }
    return major * 10 + minor;
}

int
fc_cuda_device_arch(int dev)
{
    return device_arch(dev);
}

static void
cache_path(char *out, size_t n, const char *dir, const char *key, int is_ptx)
{
    snprintf(out, n, "%s/%.2s/%s.%s", dir, key, key, is_ptx ? "ptx" : "cubin");
}

/* An entry is "fccuda1 <sha256 of the image>\n" + image. 1 found, 0 not, -1 error. */
static int
cache_load(const char *dir, FcCudaImage *img)
{
    char path[4096], hex[65], *text = NULL;
    size_t n = 0;
    int rc = 0;
    cache_path(path, sizeof(path), dir, img->key, img->is_ptx);
    if (fc_disk_read_all(path, 256 << 20, &text, &n) < 0) {
        return 0;
    }
    if (n < 73 || memcmp(text, "fccuda1 ", 8) != 0 || text[72] != '\n') {
        goto corrupt;
    }
    fc_sha256_hex_of(text + 73, n - 73, hex);
    if (memcmp(hex, text + 8, 64) != 0) {
        goto corrupt;
    }
    img->image = PyMem_Malloc(n - 73 + 1);
    if (img->image == NULL) {
        PyErr_NoMemory();
        rc = -1;
        goto done;
    }
    memcpy(img->image, text + 73, n - 73);
    img->image[n - 73] = 0;
    img->size = n - 73;
    img->cached = 1;
    rc = 1;
    goto done;
corrupt:
    unlink(path);
    rc = PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "fastcompile: corrupt CUDA cache entry %s "
                          "removed; recompiling", path) < 0 ? -1 : 0;
done:
    free(text);
    return rc;
}

/* best effort: a failed write only costs a recompile later */
static void
cache_store(const char *dir, const FcCudaImage *img)
{
    char path[4096], shard[4096], tmp[4200], head[74], sfx[FC_DISK_SUFFIX];
    char *buf = PyMem_Malloc(img->size + 73);
    if (buf == NULL) {
        return;
    }
    fc_sha256_hex_of(img->image, img->size, head + 8);
    memcpy(head, "fccuda1 ", 8);
    head[72] = '\n';
    memcpy(buf, head, 73);
    memcpy(buf + 73, img->image, img->size);
    snprintf(shard, sizeof(shard), "%s/%.2s", dir, img->key);
    cache_path(path, sizeof(path), dir, img->key, img->is_ptx);
    fc_disk_temp_suffix(sfx);
    snprintf(tmp, sizeof(tmp), "%s/.tmp.%s", shard, sfx);
    if (fc_disk_mkdir_p(shard, 0700) == 0 && fc_disk_write_new(tmp, buf, img->size + 73, 0600) == 0) {
        if (fc_disk_move_noreplace(tmp, path) < 0) {
            unlink(tmp);
        }
        else {
            fc_disk_fsync_dir(shard);
        }
    }
    PyMem_Free(buf);
}

/* The kernel's source beside its cubin, <dir>/<key[:2]>/<key>.cu, so that a
 * user can read what runs (explain(), Compiled.kernels[i].path); written
 * once, best effort: img->src_path stays "" when it cannot be. */
static void
store_source(const char *dir, const char *source, FcCudaImage *img)
{
    char path[1024], shard[1024], tmp[1200], sfx[FC_DISK_SUFFIX];
    snprintf(shard, sizeof(shard), "%s/%.2s", dir, img->key);
    snprintf(path, sizeof(path), "%s/%s.cu", shard, img->key);
    if (access(path, R_OK) != 0) {
        fc_disk_temp_suffix(sfx);
        snprintf(tmp, sizeof(tmp), "%s/.tmp.%s", shard, sfx);
        if (fc_disk_mkdir_p(shard, 0700) != 0 || fc_disk_write_new(tmp, source, strlen(source), 0600) != 0) {
            return;
        }
        if (fc_disk_move_noreplace(tmp, path) < 0) {
            unlink(tmp);
        }
        if (access(path, R_OK) != 0) {
            return;
        }
    }
    snprintf(img->src_path, sizeof(img->src_path), "%s", path);
}

void
fc_cuda_image_free(FcCudaImage *img)
{
    PyMem_Free(img->image);
    img->image = NULL;
}

int
fc_cuda_compile(const char *source, const char *arch, const char *define, FcCudaImage *out)
{
    char *headers[NHEADERS] = {NULL};
    char opt_arch[64], ver[32];
    const char *opts[5];
    const char *dir;
    nvrtcProgram prog = NULL;
    int want, use = 0, rc = -1, nopts = 0;
    FcSha256 h;
    uint8_t digest[32];

    memset(out, 0, sizeof(*out));
    probe();
    if (cu.nvrtc == NULL) {
        PyErr_Format(PyExc_ImportError, "fastcompile: CUDA kernels need NVRTC: %s", cu.nvrtc_why);
        return -1;
    }
    if (arch == NULL) {
        int d = device_arch(0);
        snprintf(opt_arch, sizeof(opt_arch), "sm_%d", d ? d : 80);
        want = d ? d : 80;
    }
    else if ((want = arch_number(arch)) == 0) {
        PyErr_Format(PyExc_ValueError, "fastcompile: arch must look like 'sm_90', got '%s'", arch);
        return -1;
    }
    /* cubin for an arch NVRTC knows; else PTX for the newest one below it,
     * which the driver JIT-compiles for the newer device */
    for (int i = 0; i < cu.narchs; i++) {
        if (cu.archs[i] == want) {
            use = want;
        }
    }
    if (use == 0) {
        for (int i = 0; i < cu.narchs; i++) {
            if (cu.archs[i] < want && cu.archs[i] > use) {
                use = cu.archs[i];
            }
        }
        if (use == 0) {
            PyErr_Format(PyExc_ValueError, "fastcompile: NVRTC %d.%d cannot compile for sm_%d",
                         cu.nvrtc_major, cu.nvrtc_minor, want);
            return -1;
        }
        out->is_ptx = 1;
    }
    snprintf(out->arch, sizeof(out->arch), "%s_%d", out->is_ptx ? "compute" : "sm", use);
    snprintf(opt_arch, sizeof(opt_arch), "--gpu-architecture=%s", out->arch);
    opts[nopts++] = opt_arch;
    opts[nopts++] = "--std=c++17";
    /* by default no contraction of a * b + c, as the CPU kernels
     * (-ffp-contract=off): arithmetic gives NumPy's results bit for bit.
     * config.cuda_fmad: contract, as nvcc's default and torch's kernels */
    opts[nopts++] = cu.fmad ? "--fmad=true" : "--fmad=false";     /* never --use_fast_math */
    if (define != NULL) {
        opts[nopts++] = define;
    }
    if (read_headers(headers) < 0) {
        goto error;
    }
    /* key: source, headers, NVRTC version, options, fastcompile version */
    fc_sha256_init(&h);
    snprintf(ver, sizeof(ver), "nvrtc %d.%d", cu.nvrtc_major, cu.nvrtc_minor);
    fc_sha256_update(&h, ver, strlen(ver) + 1);
    fc_sha256_update(&h, fc_cpu_version(), strlen(fc_cpu_version()) + 1);
    for (int i = 0; i < nopts; i++) {
        fc_sha256_update(&h, opts[i], strlen(opts[i]) + 1);
    }
    for (int i = 0; i < NHEADERS; i++) {
        fc_sha256_update(&h, header_names[i], strlen(header_names[i]) + 1);
        fc_sha256_update(&h, headers[i], strlen(headers[i]) + 1);
    }
    fc_sha256_update(&h, source, strlen(source));
    fc_sha256_final(&h, digest);
    fc_sha256_hex(digest, out->key);
    if ((dir = fc_cpu_cache_dir()) == NULL) {
        goto error;
    }
    store_source(dir, source, out);
    if ((rc = cache_load(dir, out)) != 0) {
        rc = rc < 0 ? -1 : 0;
        goto cleanup;
    }
    rc = -1;
    FC_CUDA_CHECK(FC_NVRTC, cu.nvrtcCreateProgram(&prog, source, "fastcompile.cu", NHEADERS,
                                                  (const char *const *)headers, header_names), NULL, NULL);
    FC_CUDA_CHECK(FC_NVRTC, cu.nvrtcCompileProgram(prog, nopts, opts), prog, source);
    if (out->is_ptx) {
        FC_CUDA_CHECK(FC_NVRTC, cu.nvrtcGetPTXSize(prog, &out->size), prog, NULL);
    }
    else {
        FC_CUDA_CHECK(FC_NVRTC, cu.nvrtcGetCUBINSize(prog, &out->size), prog, NULL);
    }
    if ((out->image = PyMem_Malloc(out->size + 1)) == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    if (out->is_ptx) {
        FC_CUDA_CHECK(FC_NVRTC, cu.nvrtcGetPTX(prog, out->image), prog, NULL);
    }
    else {
        FC_CUDA_CHECK(FC_NVRTC, cu.nvrtcGetCUBIN(prog, out->image), prog, NULL);
    }
    cache_store(dir, out);
    rc = 0;
    goto cleanup;
error:
    fc_cuda_image_free(out);
    rc = -1;
cleanup:
    if (prog != NULL) {
        cu.nvrtcDestroyProgram(&prog);
    }
    for (int i = 0; i < NHEADERS; i++) {
        free(headers[i]);
    }
    return rc;
}

/* ---------------------------------------------------------------------------
 * Driver: load and launch. GPU only; nothing here runs without a device.
 * Modules are never unloaded: functions handed out live as long as the process.
 * ------------------------------------------------------------------------- */

int
fc_cuda_load(const FcCudaImage *img, const char *const *symbols, int n, int dev, void **fns)
{
    const char *why = fc_cuda_unavailable();
    CUdevice d;
    CUcontext ctx = NULL, popped;
    CUmodule mod = NULL;
    int pushed = 0;
    if (why != NULL) {
        PyErr_Format(PyExc_RuntimeError, "fastcompile: no CUDA device: %s", why);
        return -1;
    }
    if (dev < 0 || dev >= cu.ndevices) {
        PyErr_Format(PyExc_ValueError, "fastcompile: no CUDA device %d (%d present)", dev, cu.ndevices);
        return -1;
    }
    if (dev >= 16) {
        PyErr_Format(PyExc_ValueError, "fastcompile: CUDA device %d: at most 16 devices", dev);
        return -1;
    }
    FC_CUDA_CHECK(FC_DRIVER, cu.cuDeviceGet(&d, dev), NULL, NULL);
    /* the primary context is the one torch uses; retained once per device and
     * never released, so it outlives every module we put in it */
    if (cu.ctx[dev] == NULL) {
        FC_CUDA_CHECK(FC_DRIVER, cu.cuDevicePrimaryCtxRetain(&ctx, d), NULL, NULL);
        cu.ctx[dev] = ctx;
    }
    ctx = cu.ctx[dev];
    FC_CUDA_CHECK(FC_DRIVER, cu.cuCtxPushCurrent(ctx), NULL, NULL);
    pushed = 1;
    FC_CUDA_CHECK(FC_DRIVER, cu.cuModuleLoadData(&mod, img->image), NULL, NULL);
    for (int i = 0; i < n; i++) {
        CUfunction f = NULL;
        FC_CUDA_CHECK(FC_DRIVER, cu.cuModuleGetFunction(&f, mod, symbols[i]), NULL, NULL);
        fns[i] = f;
    }
    cu.cuCtxPopCurrent(&popped);
    return 0;
error:
    if (mod != NULL) {
        cu.cuModuleUnload(mod);        /* a symbol was missing: nothing handed out from it */
    }
    if (pushed) {
        cu.cuCtxPopCurrent(&popped);
    }
    return -1;
}

int
fc_cuda_load_kernel(const char *source, const char *name, int dev, int bits, void **fn, char key[65],
                    char arch[16], char src_path[1024])
{
    FcCudaImage img;
    char want[16], sym[96], define[32];
    const char *syms[1] = {sym};
    int a = device_arch(dev), rc;
    if (a == 0) {
        const char *why = fc_cuda_unavailable();
        PyErr_Format(PyExc_RuntimeError, "fastcompile: no CUDA device %d: %s", dev,
                     why ? why : "the driver does not report its compute capability");
        return -1;
    }
    snprintf(want, sizeof(want), "sm_%d", a);
    snprintf(sym, sizeof(sym), "%s_i%d", name, bits);
    snprintf(define, sizeof(define), "-DFC_CU_INDEX=%d", bits);
    if (fc_cuda_compile(source, want, define, &img) < 0) {
        return -1;
    }
    rc = fc_cuda_load(&img, syms, 1, dev, fn);
    memcpy(key, img.key, 65);
    memcpy(arch, img.arch, 16);
    memcpy(src_path, img.src_path, 1024);
    fc_cuda_image_free(&img);
    return rc;
}

int
fc_cuda_launch(void *fn, int dev, unsigned grid, unsigned block, void *stream, void *params,
               size_t nbytes)
{
    void *extra[] = {FC_CU_LAUNCH_PARAM_BUFFER_POINTER, params, FC_CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &nbytes, FC_CU_LAUNCH_PARAM_END};
    CUcontext popped;
    int pushed = 0;
    if (cu.cuLaunchKernel == NULL || dev < 0 || dev >= 16 || cu.ctx[dev] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: launch before fc_cuda_load on this device");
        return -1;
    }
    if (nbytes > 4096) {
        /* the classic kernel parameter limit; larger needs CUDA 12.1+ and sm_70+ */
        PyErr_Format(PyExc_RuntimeError, "fastcompile: kernel parameters of %zu bytes (at most 4096)", nbytes);
        return -1;
    }
    /* the stream belongs to torch's primary context: make it current for the launch */
    FC_CUDA_CHECK(FC_DRIVER, cu.cuCtxPushCurrent(cu.ctx[dev]), NULL, NULL);
    pushed = 1;
    FC_CUDA_CHECK(FC_DRIVER, cu.cuLaunchKernel((CUfunction)fn, grid, 1, 1, block, 1, 1, 0,
                                               (CUstream)stream, NULL, extra), NULL, NULL);
    cu.cuCtxPopCurrent(&popped);
    return 0;
error:
    if (pushed) {
        cu.cuCtxPopCurrent(&popped);
    }
    return -1;
}

/* The kernel parameter fc_cu_launch<nops, nd> (fc_cuda_kernel.h) packed from
 * the CPU's launch description: every field 8 bytes, in its order. Returns
 * the bytes used. flat: operands are indexed by i (no strides read). Sets
 * *maxoff to the largest element offset any operand reaches. */
static size_t
pack_launch(const fc_launch *L, int nd, int flat, int64_t *buf, int64_t *maxoff)
{
    const int nops = L->nops;
    size_t n = 0;
    *maxoff = flat ? L->n_outer : 0;
    buf[n++] = L->n_outer;
    buf[n++] = L->n_inner;
    buf[n++] = L->nd_outer;
    buf[n++] = L->nd_inner;
    buf[n++] = 0;                          /* err: NULL, unchecked (see cuda.h) */
    for (int q = 0; q < nops; q++) {
        buf[n++] = (int64_t)(intptr_t)L->ptr[q];
    }
    for (int d = 0; d < nd; d++) {
        buf[n++] = d < L->nd_outer ? L->oshape[d] : 1;
    }
    for (int d = 0; d < nd; d++) {
        buf[n++] = d < L->nd_inner ? L->ishape[d] : 1;
    }
    /* ostride[NOPS][ND], then istride[NOPS][ND] */
    for (int q = 0; q < nops; q++) {
        for (int d = 0; d < nd; d++) {
            buf[n++] = !flat && d < L->nd_outer ? L->ostride[q][d] : 0;
        }
    }
    for (int q = 0; q < nops; q++) {
        for (int d = 0; d < nd; d++) {
            buf[n++] = !flat && d < L->nd_inner ? L->istride[q][d] : 0;
        }
    }
    for (int q = 0; q < nops && !flat; q++) {
        int64_t off = 0;
        for (int d = 0; d < L->nd_outer; d++) {
            off += (L->oshape[d] - 1) * (L->ostride[q][d] < 0 ? -L->ostride[q][d] : L->ostride[q][d]);
        }
        for (int d = 0; d < L->nd_inner; d++) {
            off += (L->ishape[d] - 1) * (L->istride[q][d] < 0 ? -L->istride[q][d] : L->istride[q][d]);
        }
        *maxoff = off > *maxoff ? off : *maxoff;
    }
    return n * sizeof(int64_t);
}

/* pack_launch's buffer (FcCuLaunch.params) holds any kernel the core can make */
_Static_assert(FC_MAXOPS <= FC_LAUNCH_MAXOPS && FC_MAXDIM <= FC_LAUNCH_MAXDIM, "launch limits");

/* The grid of a launch over L: one trip of the grid-stride loop per thread
 * for a pointwise kernel (per_thread elements each), a block per row for a
 * reduction. Measured on an H100 (benchmarks/gpu_tuning.py, 2^28 elements):
 * against one wave of 8 blocks per SM looping over the data, this grid took
 * float32 GELU from 90% to 100% of the copy bandwidth, x*sigmoid(x)*y from
 * 97% to 104% (bfloat16: 85% to 104%); and against 32 blocks per SM looping
 * over rows, softmax and layernorm rows of 4096 floats from 94% and 98% to
 * 98% and 103%. The kernels' loops stay grid-stride, so any grid is right
 * (config.cuda_max_grid caps it: the tests cover the loops that way). */
static int64_t
grid_of(const fc_launch *L, int per_thread)
{
    const int64_t most = 2147483647;       /* gridDim.x's limit */
    int64_t grid = per_thread > 0 ? (L->n_outer + FC_CU_THREADS * per_thread - 1) / (FC_CU_THREADS * per_thread)
                                  : L->n_outer;
    if (cu.max_grid > 0 && grid > cu.max_grid) {
        grid = cu.max_grid;
    }
    return grid < 1 ? 1 : grid > most ? most : grid;
}

int
fc_cuda_check_params(int nops, int nd)
{
    size_t nbytes;
    nd = nd > 0 ? nd : 1;
    nbytes = 8 * (size_t)(5 + nops + 2 * nd + 2 * nops * nd);
    if (nbytes > 4096) {
        PyErr_Format(PyExc_NotImplementedError, "fastcompile: a CUDA kernel of %d operands over %d dims needs "
                     "%zu bytes of parameters (at most 4096): split the graph (an extern between its parts)",
                     nops, nd, nbytes);
        return -1;
    }
    return 0;
}

int
fc_cuda_pack(const fc_launch *L, int nd, int flat, int per_thread, FcCuLaunch *out)
{
    const int64_t i32max = 2147483647;
    int64_t maxoff, grid, step;
    nd = nd > 0 ? nd : 1;
    if (L->nops > FC_LAUNCH_MAXOPS || nd > FC_LAUNCH_MAXDIM) {
        PyErr_Format(PyExc_SystemError, "fastcompile: a CUDA launch of %d operands over %d dims", L->nops, nd);
        return -1;
    }
    grid = grid_of(L, per_thread);
    out->grid = (unsigned)grid;
    out->nbytes = pack_launch(L, nd, flat, out->params, &maxoff);
    /* 32-bit index math when no index, offset or loop step can pass 2^31 - 1:
     * a pointwise trip steps by grid x threads x per_thread elements (at least
     * the scalar loop's 8), a reduction's row loop by grid rows */
    step = per_thread > 0 ? (grid + 1) * FC_CU_THREADS * (per_thread > 8 ? per_thread : 8) : grid;
    out->bits = maxoff < i32max && L->n_outer + step < i32max && L->n_inner + FC_CU_THREADS * 4 < i32max ? 32 : 64;
    return 0;
}

int
fc_cuda_run(void *fn, int dev, const FcCuLaunch *pk, void *stream)
{
    if (fn == NULL || dev < 0 || dev >= 16 || cu.ctx[dev] == NULL) {
        PyErr_SetString(PyExc_SystemError, "fastcompile: a CUDA launch before its kernel was loaded");
        return -1;
    }
    return fc_cuda_launch(fn, dev, pk->grid, FC_CU_THREADS, stream, (void *)pk->params, pk->nbytes);
}

/* ---------------------------------------------------------------------------
 * Python surface
 * ------------------------------------------------------------------------- */

PyObject *
fc_cuda_py_info(PyObject *self, PyObject *unused)
{
    PyObject *d = NULL, *archs = NULL;
    char ver[32] = "";
    probe();
    if (cu.nvrtc != NULL) {
        snprintf(ver, sizeof(ver), "%d.%d", cu.nvrtc_major, cu.nvrtc_minor);
    }
    if ((archs = PyList_New(0)) == NULL) {
        return NULL;
    }
    for (int i = 0; i < cu.narchs; i++) {
        PyObject *s = PyUnicode_FromFormat("sm_%d", cu.archs[i]);
        if (s == NULL || PyList_Append(archs, s) < 0) {
            Py_XDECREF(s);
            goto error;
        }
        Py_DECREF(s);
    }
    d = Py_BuildValue("{s:O,s:s,s:s,s:z,s:O,s:O,s:i,s:i,s:z,s:i}",
                      "nvrtc", cu.nvrtc ? Py_True : Py_False,
                      "nvrtc_path", cu.nvrtc_path ? cu.nvrtc_path : "",
                      "nvrtc_version", ver,
                      "nvrtc_error", cu.nvrtc ? NULL : cu.nvrtc_why,
                      "nvrtc_archs", archs,
                      "driver", cu.cuda ? Py_True : Py_False,
                      "driver_version", cu.driver_version,
                      "device_count", cu.ndevices,
                      "why_no_device", cu.ndevices > 0 ? NULL : cu.cuda_why,
                      "device_arch", device_arch(0));
error:
    Py_DECREF(archs);
    return d;
}

PyObject *
fc_cuda_py_compile(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"source", "arch", "define", NULL};
    const char *source, *arch = NULL, *define = NULL;
    FcCudaImage img;
    PyObject *r;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|zz:_cuda_compile", kwlist, &source, &arch, &define)) {
        return NULL;
    }
    if (define != NULL && strncmp(define, "-D", 2) != 0) {
        PyErr_Format(PyExc_ValueError, "fastcompile: define must look like '-DNAME=VALUE', got '%s'", define);
        return NULL;
    }
    if (fc_cuda_compile(source, arch, define, &img) < 0) {
        return NULL;
    }
    r = Py_BuildValue("{s:y#,s:s,s:s,s:s,s:O,s:z}", "image", img.image, (Py_ssize_t)img.size,
                      "kind", img.is_ptx ? "ptx" : "cubin", "arch", img.arch, "key", img.key,
                      "cached", img.cached ? Py_True : Py_False,
                      "source_path", img.src_path[0] ? img.src_path : NULL);
    fc_cuda_image_free(&img);
    return r;
}

/* cfg[name]: a str copied into buf (cap bytes), None as ""; missing: buf
 * unchanged. 0, or -1 with an exception set. */
static int
cfg_path(PyObject *cfg, const char *name, char *buf, size_t cap)
{
    PyObject *v = PyDict_GetItemString(cfg, name);     /* borrowed */
    const char *s;
    if (v == NULL) {
        return 0;
    }
    if (v == Py_None) {
        buf[0] = '\0';
        return 0;
    }
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "fastcompile config '%s' must be a str, not %.100s", name,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    if ((s = PyUnicode_AsUTF8(v)) == NULL) {
        return -1;
    }
    if (strlen(s) >= cap) {
        PyErr_Format(PyExc_ValueError, "fastcompile config '%s' is too long", name);
        return -1;
    }
    memcpy(buf, s, strlen(s) + 1);
    return 0;
}

int
fc_cuda_configure(PyObject *cfg)
{
    if (cfg_path(cfg, "nvrtc", cu.nvrtc_req, sizeof(cu.nvrtc_req)) < 0
        || cfg_path(cfg, "libcuda", cu.libcuda_req, sizeof(cu.libcuda_req)) < 0) {
        return -1;
    }
    PyObject *v = PyDict_GetItemString(cfg, "cuda_fmad");     /* borrowed */
    if (v != NULL) {
        int on = PyObject_IsTrue(v);
        if (on < 0) {
            return -1;
        }
        cu.fmad = on;
    }
    v = PyDict_GetItemString(cfg, "cuda_max_grid");
    if (v != NULL) {
        long long g = PyLong_AsLongLong(v);
        if (g == -1 && PyErr_Occurred()) {
            return -1;
        }
        cu.max_grid = g > 0 ? g : 0;
    }
    return 0;
}

void
fc_cuda_free(void)
{
    /* the libraries stay loaded: kernels handed out may still run */
    free(cu.nvrtc_path);
    cu.nvrtc_path = NULL;
}
