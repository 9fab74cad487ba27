/* Runtime, device arrays: torch CUDA tensors as the plans read them.
 * In: torch tensors. Out: pointer, dims, strides and key metadata; new outputs from torch's allocator. */
#ifndef FC_DEVARRAY_H
#define FC_DEVARRAY_H

#include <Python.h>

#include "../core/spec.h"

/* One CUDA tensor as a plan reads it. dims and strides as NumPy's (strides
 * in bytes), so the CPU's launch setup reads both kinds alike. */
typedef struct {
    char *data;               /* device pointer (data_ptr(): storage offset included) */
    int nd;
    int dtype;                /* FC_* */
    int dev;                  /* CUDA device index */
    Py_intptr_t dims[FC_MAXDIM];
    Py_intptr_t strides[FC_MAXDIM];
    int64_t itemsize;
} FcDevArr;

/* Module state: python/fastcompile/_cuda_bridge.py and the torch objects it
 * exposes, loaded once a torch tensor first reaches a compiled graph. All
 * owned; released by fc_dev_free (also module.c's
 * m_clear), visited by fc_dev_traverse (its m_traverse). */
typedef struct {
    int loaded;
    PyObject *tensor_type;          /* torch.Tensor */
    PyObject *dtypes[FC_NDTYPES];   /* torch dtype per FC dtype (NULL: this torch lacks it) */
    PyObject *empty, *full, *stream;
    PyObject *s_is_cuda, *s_get_device, *s_dtype, *s_shape, *s_stride, *s_data_ptr;
} FcDevRt;

/* 1 and *dev when obj is a torch tensor on a CUDA device; 0 when it is
 * anything else (a NumPy array, a CPU tensor: no error); -1 + exception.
 * Never imports torch: without torch in sys.modules nothing is a CUDA
 * tensor. obj: borrowed. GIL held. */
FC_INTERNAL int fc_dev_is_cuda(PyObject *obj, int *dev);

/* Reads CUDA tensor t into *a. 0, or -1 with TypeError for anything but a
 * torch tensor or a dtype the core lacks, ValueError for a tensor on another
 * device than CUDA or a rank above FC_MAXDIM. t: borrowed. */
FC_INTERNAL int fc_dev_view(PyObject *t, FcDevArr *a);

/* The views of one call's values, read once each (a CUDA call reads an
 * input when it checks it, when it looks its plan up and when it runs it):
 * one slot per graph node. A value is never replaced during a call once
 * read, so a slot stays true for the call. */
typedef struct {
    FcDevArr *arr;
    char *have;
    int n;
} FcDevMemo;

/* 0, or -1 + MemoryError. */
FC_INTERNAL int fc_dev_memo_init(FcDevMemo *m, int n);
FC_INTERNAL void fc_dev_memo_free(FcDevMemo *m);
/* node's value obj (borrowed) as a view, read on the first ask of the call.
 * Returns a pointer into m, or NULL + exception (fc_dev_view's). */
FC_INTERNAL const FcDevArr *fc_dev_memo_view(FcDevMemo *m, int node, PyObject *obj);

/* The plan key of a: as fc_plan_meta's, with m->dev = a->dev + 1. */
FC_INTERNAL void fc_dev_meta(const FcDevArr *a, FcMeta *m);

/* A new C-contiguous CUDA tensor (contents undefined), from torch's caching
 * allocator; *a (may be NULL) gets its view, its layout known without asking
 * but its pointer. Returns: new reference, or NULL + exception. */
FC_INTERNAL PyObject *fc_dev_empty(int nd, const Py_intptr_t *shape, int dtype, int dev, FcDevArr *a);

/* A new 0-d CUDA tensor of dtype holding value (borrowed). Returns: new
 * reference, or NULL + exception. */
FC_INTERNAL PyObject *fc_dev_full(PyObject *value, int dtype, int dev);

/* torch's current stream on dev, as a CUstream. 0, or -1 + exception. */
FC_INTERNAL int fc_dev_stream(int dev, void **stream);

/* 1 and *dev when obj is some other library's CUDA array (DLPack says so:
 * CuPy, JAX), which compiled graphs do not take; else 0. Never raises.
 * obj: borrowed. */
FC_INTERNAL int fc_dev_foreign_cuda(PyObject *obj, int *dev);

/* Drops the bridge's references (module free). GIL held. */
FC_INTERNAL void fc_dev_free(void);

/* The GC's view of fc_state.dev (module.c's m_traverse): visits every
 * object it holds. Returns what visit returned, else 0. */
FC_INTERNAL int fc_dev_traverse(visitproc visit, void *arg);

#endif
