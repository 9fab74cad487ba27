/* Runtime, device arrays: torch CUDA tensors as the plans read them.
 * In: torch tensors. Out: pointer, dims, strides and key metadata; new outputs from torch's allocator. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "../state.h"
#include "devarray.h"

#define FC_DEV_NOBJS (FC_NDTYPES + 10)

/* The addresses of every object r holds (FC_DEV_NOBJS of them), for
 * release and fc_dev_traverse alike. */
static void
held(FcDevRt *r, PyObject **slots[FC_DEV_NOBJS])
{
    PyObject **named[] = {&r->tensor_type, &r->empty, &r->full, &r->stream, &r->s_is_cuda,
                          &r->s_get_device, &r->s_dtype, &r->s_shape, &r->s_stride, &r->s_data_ptr};
    _Static_assert(sizeof(named) / sizeof(named[0]) + FC_NDTYPES == FC_DEV_NOBJS, "FC_DEV_NOBJS");
    for (int i = 0; i < FC_NDTYPES; i++) {
        slots[i] = &r->dtypes[i];
    }
    memcpy(slots + FC_NDTYPES, named, sizeof(named));
}

static void
release(FcDevRt *r)
{
    PyObject **slots[FC_DEV_NOBJS];
    held(r, slots);
    for (int i = 0; i < FC_DEV_NOBJS; i++) {
        Py_CLEAR(*slots[i]);
    }
    r->loaded = 0;
}

/* 1 loaded; 0 torch is not imported (so nothing is a tensor); -1 + exception.
 * The imports may let another thread in: the state is built aside and
 * published whole, unless that thread published its own meanwhile. */
static int
load_bridge(void)
{
    PyObject *name = NULL, *torch = NULL, *mod = NULL;
    FcDevRt r = {0};
    int rc = -1;
    if (fc_state.dev.loaded) {
        return 1;
    }
    if ((name = PyUnicode_FromString("torch")) == NULL) {
        return -1;
    }
    torch = PyImport_GetModule(name);          /* new reference, or NULL without an error */
    Py_DECREF(name);
    if (torch == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if ((mod = PyImport_ImportModule("fastcompile._cuda_bridge")) == NULL) {
        goto cleanup;
    }
    for (int i = 0; i < FC_NDTYPES; i++) {
        if ((r.dtypes[i] = PyObject_GetAttrString(torch, fc_dtypes[i].name)) == NULL) {
            PyErr_Clear();                     /* an older torch without uint32: never matched */
        }
    }
    if ((r.tensor_type = PyObject_GetAttrString(mod, "TENSOR")) == NULL ||
            (r.empty = PyObject_GetAttrString(mod, "empty")) == NULL ||
            (r.full = PyObject_GetAttrString(mod, "full")) == NULL ||
            (r.stream = PyObject_GetAttrString(mod, "stream")) == NULL ||
            (r.s_is_cuda = PyUnicode_InternFromString("is_cuda")) == NULL ||
            (r.s_get_device = PyUnicode_InternFromString("get_device")) == NULL ||
            (r.s_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
            (r.s_shape = PyUnicode_InternFromString("shape")) == NULL ||
            (r.s_stride = PyUnicode_InternFromString("stride")) == NULL ||
            (r.s_data_ptr = PyUnicode_InternFromString("data_ptr")) == NULL) {
        goto cleanup;
    }
    if (!PyType_Check(r.tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "fastcompile._cuda_bridge.TENSOR is not a type");
        goto cleanup;
    }
    if (!fc_state.dev.loaded) {
        fc_state.dev = r;                            /* the references move to fc_state.dev */
        fc_state.dev.loaded = 1;
        memset(&r, 0, sizeof(r));
    }
    rc = 1;
cleanup:
    release(&r);
    Py_XDECREF(mod);
    Py_DECREF(torch);
    return rc;
}

void
fc_dev_free(void)
{
    release(&fc_state.dev);
}

int
fc_dev_traverse(visitproc visit, void *arg)
{
    PyObject **slots[FC_DEV_NOBJS];
    held(&fc_state.dev, slots);
    for (int i = 0; i < FC_DEV_NOBJS; i++) {
        Py_VISIT(*slots[i]);
    }
    return 0;
}

/* obj.name() as a C integer; -1 + exception (a real -1 is told apart by PyErr_Occurred) */
static long long
call_int(PyObject *obj, PyObject *name)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);
    long long v;
    if (r == NULL) {
        return -1;
    }
    v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

int
fc_dev_is_cuda(PyObject *obj, int *dev)
{
    PyObject *flag = NULL;
    int on, rc;
    long long d;
    if ((rc = load_bridge()) <= 0) {
        return rc;
    }
    if (!PyObject_TypeCheck(obj, (PyTypeObject *)fc_state.dev.tensor_type)) {
        return 0;
    }
    if ((flag = PyObject_GetAttr(obj, fc_state.dev.s_is_cuda)) == NULL) {
        return -1;
    }
    on = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    if (on <= 0) {
        return on;
    }
    d = call_int(obj, fc_state.dev.s_get_device);
    if (d < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "fastcompile: a CUDA tensor reported device -1");
        }
        return -1;
    }
    *dev = (int)d;
    return 1;
}

/* tuple of ints -> out[0..n); n must equal nd */
static int
read_ints(PyObject *seq, int nd, Py_intptr_t *out, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, "fastcompile: tensor shape/stride is not a sequence");
    int rc = -1;
    if (fast == NULL) {
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(fast) != nd) {
        PyErr_Format(PyExc_RuntimeError, "fastcompile: tensor %s has %zd entries for rank %d", what,
                     PySequence_Fast_GET_SIZE(fast), nd);
        goto cleanup;
    }
    for (int d = 0; d < nd; d++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, d));
        if (v == -1 && PyErr_Occurred()) {
            goto cleanup;
        }
        out[d] = (Py_intptr_t)v;
    }
    rc = 0;
cleanup:
    Py_DECREF(fast);
    return rc;
}

int
fc_dev_view(PyObject *t, FcDevArr *a)
{
    PyObject *dt = NULL, *shape = NULL, *stride = NULL, *cuda = NULL;
    long long ptr, d;
    Py_ssize_t nd;
    int rc = -1;
    a->dtype = -1;
    if (!fc_state.dev.loaded || !PyObject_TypeCheck(t, (PyTypeObject *)fc_state.dev.tensor_type)) {
        PyErr_Format(PyExc_TypeError, "fastcompile: a graph running on CUDA got a %.100s where a kernel "
                     "needs a CUDA torch.Tensor: a compiled graph runs on one device (its arguments, and "
                     "what its externs return)", Py_TYPE(t)->tp_name);
        return -1;
    }
    if ((dt = PyObject_GetAttr(t, fc_state.dev.s_dtype)) == NULL) {
        return -1;
    }
    for (int i = 0; i < FC_NDTYPES; i++) {
        if (fc_state.dev.dtypes[i] == dt) {
            a->dtype = i;
        }
    }
    if (a->dtype < 0) {
        PyErr_Format(PyExc_TypeError, "fastcompile: tensors of dtype %S are not supported by the core "
                     "(supported: bool, int8-64, uint8-64, float16, bfloat16, float32, float64)", dt);
        goto cleanup;
    }
    if ((shape = PyObject_GetAttr(t, fc_state.dev.s_shape)) == NULL ||
            (stride = PyObject_CallMethodNoArgs(t, fc_state.dev.s_stride)) == NULL) {
        goto cleanup;
    }
    if ((nd = PyObject_Length(shape)) < 0) {
        goto cleanup;
    }
    if (nd > FC_MAXDIM) {
        PyErr_Format(PyExc_ValueError, "fastcompile: arrays of rank %zd are not supported (at most %d)",
                     nd, FC_MAXDIM);
        goto cleanup;
    }
    a->nd = (int)nd;
    a->itemsize = fc_dtypes[a->dtype].size;
    if (read_ints(shape, a->nd, a->dims, "shape") < 0 || read_ints(stride, a->nd, a->strides, "stride") < 0) {
        goto cleanup;
    }
    for (int k = 0; k < a->nd; k++) {
        a->strides[k] *= (Py_intptr_t)a->itemsize;     /* elements -> bytes, as NumPy */
    }
    ptr = call_int(t, fc_state.dev.s_data_ptr);
    if (ptr == -1 && PyErr_Occurred()) {
        goto cleanup;
    }
    d = call_int(t, fc_state.dev.s_get_device);
    if (d == -1 && PyErr_Occurred()) {
        goto cleanup;
    }
    if (d >= 0 && (cuda = PyObject_GetAttr(t, fc_state.dev.s_is_cuda)) != NULL) {
        d = PyObject_IsTrue(cuda) == 1 ? d : -1;     /* XPU, MPS: an index, but no CUDA pointer */
    }
    if (PyErr_Occurred()) {
        goto cleanup;
    }
    if (d < 0) {
        PyErr_SetString(PyExc_ValueError, "fastcompile: a graph running on CUDA got a tensor on another "
                        "device where a kernel needs a CUDA one: a compiled graph runs on one device (its "
                        "arguments, and what its externs return); move it with .cuda()");
        goto cleanup;
    }
    a->data = (char *)(intptr_t)ptr;
    a->dev = (int)d;
    rc = 0;
cleanup:
    Py_XDECREF(cuda);
    Py_XDECREF(stride);
    Py_XDECREF(shape);
    Py_DECREF(dt);
    return rc;
}

void
fc_dev_meta(const FcDevArr *a, FcMeta *m)
{
    Py_intptr_t want = (Py_intptr_t)a->itemsize;
    int contig = 1;
    m->dtype = a->dtype;
    m->ndim = a->nd;
    m->ones = 0;
    m->dev = a->dev + 1;
    for (int d = a->nd - 1; d >= 0; d--) {
        if (a->dims[d] == 1) {
            m->ones |= 1u << d;
            continue;
        }
        if (a->dims[d] == 0) {
            contig = 2;                        /* empty: contiguous, as NumPy says */
        }
        else if (contig == 1 && a->strides[d] != want) {
            contig = 0;
        }
        want *= a->dims[d];
    }
    m->contig = contig != 0;
    m->zlast = !m->contig && a->nd > 0 && a->dims[a->nd - 1] > 1 && a->strides[a->nd - 1] == 0;
}

PyObject *
fc_dev_empty(int nd, const Py_intptr_t *shape, int dtype, int dev, FcDevArr *a)
{
    PyObject *tup = PyTuple_New(nd), *r = NULL;
    if (tup == NULL) {
        return NULL;
    }
    for (int d = 0; d < nd; d++) {
        PyObject *n = PyLong_FromSsize_t(shape[d]);
        if (n == NULL) {
            goto cleanup;
        }
        PyTuple_SET_ITEM(tup, d, n);
    }
    if (fc_state.dev.dtypes[dtype] == NULL) {
        PyErr_Format(PyExc_TypeError, "fastcompile: this torch has no %s", fc_dtypes[dtype].name);
        goto cleanup;
    }
    r = PyObject_CallFunction(fc_state.dev.empty, "OOi", tup, fc_state.dev.dtypes[dtype], dev);
    if (r != NULL && a != NULL) {
        long long ptr = call_int(r, fc_state.dev.s_data_ptr);
        Py_intptr_t st = (Py_intptr_t)fc_dtypes[dtype].size;
        if (ptr == -1 && PyErr_Occurred()) {
            Py_CLEAR(r);
            goto cleanup;
        }
        a->data = (char *)(intptr_t)ptr;
        a->nd = nd;
        a->dtype = dtype;
        a->dev = dev;
        a->itemsize = fc_dtypes[dtype].size;
        for (int d = nd - 1; d >= 0; d--) {     /* torch's contiguous strides */
            a->dims[d] = shape[d];
            a->strides[d] = st;
            st *= shape[d] > 1 ? shape[d] : 1;
        }
    }
cleanup:
    Py_DECREF(tup);
    return r;
}

PyObject *
fc_dev_full(PyObject *value, int dtype, int dev)
{
    if (load_bridge() <= 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "fastcompile: CUDA constants need torch");
        }
        return NULL;
    }
    if (fc_state.dev.dtypes[dtype] == NULL) {
        PyErr_Format(PyExc_TypeError, "fastcompile: this torch has no %s", fc_dtypes[dtype].name);
        return NULL;
    }
    return PyObject_CallFunction(fc_state.dev.full, "OOi", value, fc_state.dev.dtypes[dtype], dev);
}

int
fc_dev_stream(int dev, void **stream)
{
    PyObject *r = PyObject_CallFunction(fc_state.dev.stream, "i", dev);
    if (r == NULL) {
        return -1;
    }
    *stream = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 0;
}

/* kDLCUDA, kDLCUDAHost, kDLCUDAManaged */
#define FC_DL_CUDA(t) ((t) == 2 || (t) == 3 || (t) == 13)

int
fc_dev_foreign_cuda(PyObject *obj, int *dev)
{
    PyObject *d = NULL;
    long type, id;
    if (!PyObject_HasAttrString(obj, "__dlpack_device__")) {
        return 0;
    }
    d = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (d == NULL || !PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 2) {
        Py_XDECREF(d);
        PyErr_Clear();
        return 0;
    }
    type = PyLong_AsLong(PyTuple_GET_ITEM(d, 0));
    id = PyLong_AsLong(PyTuple_GET_ITEM(d, 1));
    Py_DECREF(d);
    PyErr_Clear();
    *dev = (int)id;
    return FC_DL_CUDA(type) ? 1 : 0;
}

int
fc_dev_memo_init(FcDevMemo *m, int n)
{
    m->n = n;
    m->arr = PyMem_Malloc((n + 1) * sizeof(FcDevArr));
    m->have = PyMem_Calloc(n + 1, 1);
    if (m->arr == NULL || m->have == NULL) {
        fc_dev_memo_free(m);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void
fc_dev_memo_free(FcDevMemo *m)
{
    PyMem_Free(m->arr);
    PyMem_Free(m->have);
    m->arr = NULL;
    m->have = NULL;
}

const FcDevArr *
fc_dev_memo_view(FcDevMemo *m, int node, PyObject *obj)
{
    if (node < 0 || node >= m->n) {
        PyErr_SetString(PyExc_SystemError, "fastcompile: a view of a node outside the graph");
        return NULL;
    }
    if (!m->have[node]) {
        if (fc_dev_view(obj, &m->arr[node]) < 0) {
            return NULL;
        }
        m->have[node] = 1;
    }
    return &m->arr[node];
}
