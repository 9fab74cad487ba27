/* Runtime, CUDA: CUDA source text -> cubin (NVRTC, disk cache) -> module -> launch on a stream.
 * In: kernel source from gen_cuda. Out: cubins, loaded functions, cuda_info(). No CUDA toolkit at build time. */
#ifndef FC_CUDA_H
#define FC_CUDA_H

#include <Python.h>
#include "../core/ir.h"
#include "cpu.h"

/* A compiled image for one arch. */
typedef struct {
    char *image;         /* cubin or PTX bytes (PyMem_Malloc) */
    size_t size;
    int is_ptx;          /* 1: PTX (the arch was newer than NVRTC knows) */
    char arch[16];       /* "sm_90" (cubin) or "compute_90" (PTX) */
    char key[65];        /* disk cache key */
    int cached;          /* came from the disk cache */
    char src_path[1024]; /* the source beside the cubin, <key>.cu ("" if it could not be written) */
} FcCudaImage;

/* Compile `source` for arch ("sm_80", "sm_90", ...; NULL: the device's,
 * or sm_80 without one) through the disk cache; define: NULL, or one more
 * NVRTC option ("-DFC_CU_INDEX=32"), part of the key. Returns 0, or -1 with
 * RuntimeError carrying the NVRTC log and the numbered source, or ImportError
 * when NVRTC cannot be found. */
FC_INTERNAL int fc_cuda_compile(const char *source, const char *arch, const char *define, FcCudaImage *out);
FC_INTERNAL void fc_cuda_image_free(FcCudaImage *img);

/* GPU only: load an image into torch's primary context of device `dev` and
 * look up symbols[0..n) into fns. Returns 0, or -1 + exception. */
FC_INTERNAL int fc_cuda_load(const FcCudaImage *img, const char *const *symbols, int n, int dev, void **fns);
/* A rendered kernel (gen_cuda) compiled for device dev's arch through the disk
 * cache with only its entry point for `bits`-bit index math (32 or 64:
 * name_i32, name_i64), loaded into *fn; its cache key, arch and the path of
 * its source beside the cubin ("" if unwritable) are copied out. Returns 0,
 * or -1 + exception. */
FC_INTERNAL int fc_cuda_load_kernel(const char *source, const char *name, int dev, int bits, void **fn,
                                    char key[65], char arch[16], char src_path[1024]);
/* Launch fn (from fc_cuda_load on dev) with the packed fc_cu_launch (params,
 * nbytes <= 4096) on stream (a CUstream), grid x block threads.
 * Asynchronous: errors inside the kernel surface at torch's next sync.
 * Returns 0 or -1 + exception. */
FC_INTERNAL int fc_cuda_launch(void *fn, int dev, unsigned grid, unsigned block, void *stream,
                               void *params, size_t nbytes);
/* 0 when a kernel of nops operands over nd dims fits the launch parameter
 * limit (4096 bytes), else -1 + NotImplementedError saying so. */
FC_INTERNAL int fc_cuda_check_params(int nops, int nd);
/* One launch, packed: the kernel parameter fc_cu_launch<nops, nd>, the
 * grid, and the index width its entry point must have. */
#define FC_CU_PARAM_WORDS (5 + FC_LAUNCH_MAXOPS + 2 * FC_LAUNCH_MAXDIM + 2 * FC_LAUNCH_MAXOPS * FC_LAUNCH_MAXDIM)
typedef struct {
    int64_t params[FC_CU_PARAM_WORDS];
    size_t nbytes;
    unsigned grid;
    int bits;            /* 32 when no index, offset or loop step can pass 2^31 - 1, else 64 */
} FcCuLaunch;

/* Packs the launch of a kernel over L (filled as for the CPU; L->ptr are
 * device pointers; nd: the kernel's rank; flat: a flat pointwise kernel;
 * per_thread: fc_gen_cuda_per_thread, 0 for a reduction) and chooses its
 * grid and index width. 0, or -1 + SystemError. */
FC_INTERNAL int fc_cuda_pack(const fc_launch *L, int nd, int flat, int per_thread, FcCuLaunch *out);
/* Launches fn (the entry point for out->bits) on stream. The kernel's error
 * flag is not passed: CUDA kernels report no errors (integer negative powers
 * give what the kernel computes, as torch on CUDA). GIL held. 0, or -1 +
 * exception. */
FC_INTERNAL int fc_cuda_run(void *fn, int dev, const FcCuLaunch *pk, void *stream);
/* The compute capability of device dev as major * 10 + minor; 0 without one. */
FC_INTERNAL int fc_cuda_device_arch(int dev);

/* 1 when NVRTC was found (fc_cuda_compile can run), else 0. GIL held. */
FC_INTERNAL int fc_cuda_nvrtc_found(void);
/* Why the CUDA path cannot run, or NULL when a device is there. Borrowed. GIL held. */
FC_INTERNAL const char *fc_cuda_unavailable(void);

/* Python: _C.cuda_info() -> dict; _C._cuda_compile(source, arch=None, define=None) -> dict.
 * self, args: borrowed; returns: new reference. */
FC_INTERNAL PyObject *fc_cuda_py_info(PyObject *self, PyObject *unused);
FC_INTERNAL PyObject *fc_cuda_py_compile(PyObject *self, PyObject *args, PyObject *kwargs);
/* fastcompile.config's CUDA knobs (cuda_fmad, cuda_max_grid, nvrtc, libcuda; the
 * libraries are found at the first probe). cfg: borrowed dict. 0, or -1 + exception. */
FC_INTERNAL int fc_cuda_configure(PyObject *cfg);
FC_INTERNAL void fc_cuda_free(void);

#endif
