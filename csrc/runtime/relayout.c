/* Runtime, relayout: copies between memory orders, outside any graph: the
 * torch backend's conversions of a tensor to channels_last (NCHW -> NHWC) and
 * back, around convolutions it runs channels_last.
 * In: a dense buffer and its shape. Out: a new array in the other order.
 *
 * Each is nb transposes of an (nr, nk) matrix, in square tiles, each read as
 * TILE rows of TILE contiguous source elements and written as TILE rows of
 * TILE contiguous destination elements, so both sides move whole cache
 * lines. The extension is built for any x86-64, so the loops come in AVX-512
 * and AVX2 versions too, chosen at load (target_clones).
 *
 * Threads: OpenMP's runtime, found at the first threaded copy (dlopen of
 * libgomp.so.1: torch's where it has that name, else the one the kernels
 * load), not linked into the extension. libgomp reads OMP_WAIT_POLICY when it
 * loads; linked, it would load at `import fastcompile`, before the torch
 * backend's PASSIVE default (backends/torch/__init__.py), and where torch ships its
 * own renamed libgomp the two runtimes' spinning threads starve each other.
 * Without libgomp, or below SERIAL_BYTES, one thread copies. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

#include "../fc_numpy.h"
#include "alloc.h"
#include "plan.h"
#include "relayout.h"

#define TILE 16
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
/* below this many bytes one thread does it: a team's start costs more */
#define SERIAL_BYTES (128 * 1024)

typedef struct {
    const void *src;
    void *dst;
    int64_t nb, nr, nk;
    int itemsize;
} Job;

/* tiles [t0, t1) of a job, numbered (b, r block, k block) with the k block
 * fastest: consecutive tiles read the same TILE source rows on */
#define DEFINE_TRANSPOSE(NAME, T)                                                         \
CLONES static void                                                                        \
NAME(const Job *j, int64_t t0, int64_t t1)                                                \
{                                                                                         \
    const T *restrict src = j->src;                                                       \
    T *restrict dst = j->dst;                                                             \
    const int64_t nr = j->nr, nk = j->nk;                                                 \
    const int64_t rb = (nr + TILE - 1) / TILE, kb = (nk + TILE - 1) / TILE;              \
    for (int64_t t = t0; t < t1; t++) {                                                   \
        const int64_t b = t / (rb * kb), r0 = t / kb % rb * TILE, k0 = t % kb * TILE;    \
        const int64_t r1 = r0 + TILE < nr ? r0 + TILE : nr;                               \
        const int64_t k1 = k0 + TILE < nk ? k0 + TILE : nk;                               \
        const T *s = src + b * nr * nk;                                                   \
        T *d = dst + b * nr * nk;                                                         \
        for (int64_t k = k0; k < k1; k++) {                                               \
            _Pragma("omp simd")                                                          \
            for (int64_t r = r0; r < r1; r++) {                                           \
                d[k * nr + r] = s[r * nk + k];                                            \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

DEFINE_TRANSPOSE(transpose1, uint8_t)
DEFINE_TRANSPOSE(transpose2, uint16_t)
DEFINE_TRANSPOSE(transpose4, uint32_t)
DEFINE_TRANSPOSE(transpose8, uint64_t)

static int64_t
job_tiles(const Job *j)
{
    return j->nb * ((j->nr + TILE - 1) / TILE) * ((j->nk + TILE - 1) / TILE);
}

static void
run_tiles(const Job *j, int64_t t0, int64_t t1)
{
    switch (j->itemsize) {
    case 1: transpose1(j, t0, t1); break;
    case 2: transpose2(j, t0, t1); break;
    case 4: transpose4(j, t0, t1); break;
    default: transpose8(j, t0, t1); break;
    }
}

/* libgomp's entry points, looked up once (GOMP_parallel: the call a
 * "#pragma omp parallel" compiles to; the calling thread runs fn too) */
static struct {
    pthread_once_t once;
    void (*parallel)(void (*fn)(void *), void *data, unsigned nthreads, unsigned flags);
    int (*thread_num)(void);
    int (*num_threads)(void);
} gomp = {PTHREAD_ONCE_INIT, NULL, NULL, NULL};

static void
gomp_find(void)
{
    void *h = dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL);     /* never closed */
    if (h != NULL) {
        *(void **)&gomp.parallel = dlsym(h, "GOMP_parallel");
        *(void **)&gomp.thread_num = dlsym(h, "omp_get_thread_num");
        *(void **)&gomp.num_threads = dlsym(h, "omp_get_num_threads");
        if (gomp.parallel == NULL || gomp.thread_num == NULL || gomp.num_threads == NULL) {
            gomp.parallel = NULL;
        }
    }
}

/* one team member's share of the tiles */
static void
team_member(void *data)
{
    const Job *j = data;
    const int64_t n = job_tiles(j), tid = gomp.thread_num(), nth = gomp.num_threads();
    run_tiles(j, n * tid / nth, n * (tid + 1) / nth);
}

int
fc_relayout_transpose(const void *src, void *dst, int64_t nb, int64_t nr, int64_t nk,
                      int itemsize, int nthreads)
{
    const Job j = {src, dst, nb, nr, nk, itemsize};
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) {
        return -1;
    }
    if (nb * nr * nk * itemsize >= SERIAL_BYTES && nthreads > 1) {
        pthread_once(&gomp.once, gomp_find);
        if (gomp.parallel != NULL) {
            gomp.parallel(team_member, (void *)&j, (unsigned)nthreads, 0);
            return 0;
        }
    }
    run_tiles(&j, 0, job_tiles(&j));
    return 0;
}

PyObject *
fc_relayout_py_copy(PyObject *self, PyObject *args)
{
    unsigned long long src;
    PyObject *shape_obj, *seq = NULL;
    int typenum, to_cl, nd, itemsize, nthreads = fc_plan_config()->num_threads;
    npy_intp shape[5], mem[5], perm_data[5];
    long long n = 1, rest = 1, bytes;
    PyArray_Descr *descr;
    PyObject *block = NULL;    /* new reference: the array in memory order */
    PyObject *out = NULL;      /* new reference, returned */

    if (!PyArg_ParseTuple(args, "KOip:_relayout", &src, &shape_obj, &typenum, &to_cl)) {
        return NULL;
    }
    if ((seq = PySequence_Fast(shape_obj, "_relayout: shape must be a sequence")) == NULL) {
        return NULL;
    }
    nd = (int)PySequence_Fast_GET_SIZE(seq);
    if (nd < 3 || nd > 5) {
        PyErr_Format(PyExc_ValueError, "_relayout: rank %d (3 to 5 only)", nd);
        goto cleanup;
    }
    for (int d = 0; d < nd; d++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, d));
        if (v == -1 && PyErr_Occurred()) {
            goto cleanup;
        }
        if (v < 0 || __builtin_mul_overflow(n, v, &n)) {
            PyErr_SetString(PyExc_ValueError, "_relayout: negative or overflowing sizes");
            goto cleanup;
        }
        shape[d] = (npy_intp)v;
        rest *= d >= 2 ? v : 1;
    }
    if ((descr = PyArray_DescrFromType(typenum)) == NULL) {
        goto cleanup;
    }
    itemsize = (int)PyDataType_ELSIZE(descr);
    Py_DECREF(descr);          /* a builtin type's: static */
    if ((itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) ||
            __builtin_mul_overflow(n, (long long)itemsize, &bytes)) {
        PyErr_Format(PyExc_ValueError, "_relayout: elements of %d bytes (1, 2, 4 or 8 only)", itemsize);
        goto cleanup;
    }
    if (n > 0 && src == 0) {
        PyErr_SetString(PyExc_ValueError, "_relayout: a null buffer");
        goto cleanup;
    }
    /* the result's memory order: (N, *S, C) for channels_last, else (N, C, *S) */
    mem[0] = shape[0];
    for (int d = 1; d < nd; d++) {
        mem[d] = to_cl ? shape[d == nd - 1 ? 1 : d + 1] : shape[d];
    }
    if ((block = fc_alloc_empty(nd, mem, typenum, itemsize)) == NULL) {
        goto cleanup;
    }
    {
        /* src holds (N, C, rest) to_cl, else (N, rest, C): its (nr, nk) matrices */
        const int64_t nr = to_cl ? shape[1] : rest, nk = to_cl ? rest : shape[1];
        void *dst = PyArray_DATA((PyArrayObject *)block);
        Py_BEGIN_ALLOW_THREADS
        (void)fc_relayout_transpose((const void *)(uintptr_t)src, dst, shape[0], nr, nk, itemsize, nthreads);
        Py_END_ALLOW_THREADS
    }
    if (!to_cl) {
        out = block;
        block = NULL;
    }
    else {
        /* (N, *S, C) seen as (N, C, *S): a view of block */
        PyArray_Dims perm = {perm_data, nd};
        perm_data[0] = 0;
        perm_data[1] = nd - 1;
        for (int d = 2; d < nd; d++) {
            perm_data[d] = d - 1;
        }
        out = PyArray_Transpose((PyArrayObject *)block, &perm);
    }
cleanup:
    Py_XDECREF(block);
    Py_XDECREF(seq);
    return out;
}
