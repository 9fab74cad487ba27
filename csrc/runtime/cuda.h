/* Runtime, CUDA: CUDA source text -> cubin (NVRTC, disk cache) -> module -> launch on a stream.
 * In: kernel source from gen_cuda. Out: cubins, loaded functions, cuda_info(). No CUDA toolkit at build time. */
#ifndef FC_CUDA_H
#define FC_CUDA_H

#include <Python.h>
#include "../core/ir.h"

/* A compiled image for one arch. */
typedef struct {
    char *image;         /* cubin or PTX bytes (PyMem_Malloc) */
    size_t size;
    int is_ptx;          /* 1: PTX (the arch was newer than NVRTC knows) */
    char arch[16];       /* "sm_90" (cubin) or "compute_90" (PTX) */
    char key[65];        /* disk cache key */
    int cached;          /* came from the disk cache */
} FcCudaImage;

/* Compile `source` for arch ("sm_80", "sm_90", ...; NULL: the device's,
 * or sm_80 without one) through the disk cache. Returns 0, or -1 with
 * RuntimeError carrying the NVRTC log and the numbered source, or ImportError
 * when NVRTC cannot be found. */
FC_INTERNAL int fc_cuda_compile(const char *source, const char *arch, FcCudaImage *out);
FC_INTERNAL void fc_cuda_image_free(FcCudaImage *img);

/* GPU only (untested without a device): load an image into torch's primary
 * context of device `dev` and look up `symbol`. Returns 0 and *fn, or -1 + exception. */
FC_INTERNAL int fc_cuda_load(const FcCudaImage *img, const char *symbol, int dev, void **fn);
/* Launch fn (from fc_cuda_load on dev) with the packed fc_cu_launch (params,
 * nbytes <= 4096: 8 * (5 + nops + 2 nd + 2 nops nd)) on stream (a CUstream,
 * e.g. torch.cuda.current_stream().cuda_stream), grid x FC_CU_THREADS.
 * Asynchronous: errors inside the kernel surface at torch's next sync.
 * Returns 0 or -1 + exception. */
FC_INTERNAL int fc_cuda_launch(void *fn, int dev, unsigned grid, unsigned block, void *stream,
                               void *params, size_t nbytes);

/* Why the CUDA path cannot run, or NULL when a device is there. Borrowed. GIL held. */
FC_INTERNAL const char *fc_cuda_unavailable(void);

/* 0 when obj is not a DLPack array on a CUDA device (CPU tensors, anything
 * else: NumPy decides); -1 + RuntimeError for CUDA arrays: the plan runs
 * on the CPU only for now, and the message says why CUDA cannot run here.
 * obj: borrowed. GIL held. */
FC_INTERNAL int fc_cuda_check_host(PyObject *obj);

/* Python: _C.cuda_info() -> dict; _C._cuda_compile(source, arch=None) -> dict.
 * self, args: borrowed; returns: new reference. */
FC_INTERNAL PyObject *fc_cuda_py_info(PyObject *self, PyObject *unused);
FC_INTERNAL PyObject *fc_cuda_py_compile(PyObject *self, PyObject *args, PyObject *kwargs);
FC_INTERNAL void fc_cuda_free(void);

#endif
