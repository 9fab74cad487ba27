/* Runtime, memory: a NumPy allocator that keeps freed large blocks.
 * In: output and temporary allocations of plans. Out: NumPy arrays whose
 * pages are already mapped when a block is reused, so a kernel writing a
 * fresh 40 MB output does not pay 10,000 page faults on every call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../fc_numpy.h"
#include "alloc.h"

#define FC_POOL_MIN (256 * 1024)     /* smaller blocks go to malloc */
#define FC_POOL_SLOTS 32
#define FC_PAGE 4096
#define FC_HUGE (2 * 1024 * 1024)

typedef struct {
    void *ptr;
    size_t size;       /* mapped size (a page multiple) */
    uint64_t stamp;    /* when it was freed: oldest goes first */
} FcBlock;

static struct {
    pthread_mutex_t lock;
    FcBlock free_[FC_POOL_SLOTS];
    int nfree;
    size_t cached;     /* bytes held in free_ */
    size_t cap;        /* at most this many bytes held */
    uint64_t clock;
    uint64_t hits, misses;
    PyObject *handler; /* capsule for PyDataMem_SetHandler */
} pool = {PTHREAD_MUTEX_INITIALIZER, {{0}}, 0, 0, (size_t)256 << 20, 0, 0, 0, NULL};

static size_t
round_size(size_t n)
{
    return (n + FC_PAGE - 1) & ~(size_t)(FC_PAGE - 1);
}

/* large blocks are mmapped so they can be returned to the OS whole; a
 * mapping size is stored in front of the data (one page) */
static void *
map_block(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (size >= FC_HUGE) {
        madvise(p, size, MADV_HUGEPAGE);
    }
#endif
    return p;
}

static void *
pool_get(size_t want)
{
    size_t size = round_size(want + FC_PAGE);
    void *p = NULL;
    int best = -1;
    pthread_mutex_lock(&pool.lock);
    for (int i = 0; i < pool.nfree; i++) {
        /* exact fits are the common case (the same plan called again) */
        if (pool.free_[i].size >= size && pool.free_[i].size <= size + size / 8 &&
                (best < 0 || pool.free_[i].size < pool.free_[best].size)) {
            best = i;
        }
    }
    if (best >= 0) {
        p = pool.free_[best].ptr;
        size = pool.free_[best].size;
        pool.cached -= size;
        pool.free_[best] = pool.free_[--pool.nfree];
        pool.hits++;
    }
    else {
        pool.misses++;
    }
    pthread_mutex_unlock(&pool.lock);
    if (p == NULL && (p = map_block(size)) == NULL) {
        return NULL;
    }
    *(size_t *)p = size;
    return (char *)p + FC_PAGE;
}

static void
pool_put(void *data)
{
    void *p = (char *)data - FC_PAGE;
    size_t size = *(size_t *)p;
    pthread_mutex_lock(&pool.lock);
    if (size >= FC_POOL_MIN && size <= pool.cap) {
        while (pool.nfree > 0 && (pool.nfree == FC_POOL_SLOTS || pool.cached + size > pool.cap)) {
            int old = 0;
            for (int i = 1; i < pool.nfree; i++) {
                if (pool.free_[i].stamp < pool.free_[old].stamp) {
                    old = i;
                }
            }
            munmap(pool.free_[old].ptr, pool.free_[old].size);
            pool.cached -= pool.free_[old].size;
            pool.free_[old] = pool.free_[--pool.nfree];
        }
        if (pool.cached + size <= pool.cap) {
            pool.free_[pool.nfree].ptr = p;
            pool.free_[pool.nfree].size = size;
            pool.free_[pool.nfree].stamp = ++pool.clock;
            pool.nfree++;
            pool.cached += size;
            p = NULL;
        }
    }
    pthread_mutex_unlock(&pool.lock);
    if (p != NULL) {
        munmap(p, size);
    }
}

/* ------------------------------------------------------------------------
 * the NumPy handler. It is installed only while a plan allocates a large
 * array, so every block it sees came from pool_get (a header page in front
 * of the data holds the mapping size).
 * ---------------------------------------------------------------------- */

static void *
h_malloc(void *ctx, size_t size)
{
    return pool_get(size);
}

static void *
h_calloc(void *ctx, size_t nelem, size_t elsize)
{
    size_t size = nelem * elsize;
    void *p;
    if (elsize != 0 && size / elsize != nelem) {
        return NULL;
    }
    if ((p = pool_get(size)) != NULL) {
        memset(p, 0, size);
    }
    return p;
}

static void
h_free(void *ctx, void *ptr, size_t size)
{
    if (ptr != NULL) {
        pool_put(ptr);
    }
}

static void *
h_realloc(void *ctx, void *ptr, size_t new_size)
{
    void *q;
    size_t old;
    if (ptr == NULL) {
        return pool_get(new_size);
    }
    old = *(size_t *)((char *)ptr - FC_PAGE) - FC_PAGE;
    if ((q = pool_get(new_size)) != NULL) {
        memcpy(q, ptr, old < new_size ? old : new_size);
        pool_put(ptr);
    }
    return q;
}

static PyDataMem_Handler fc_handler = {
    "fastcompile_pool",
    1,
    {NULL, h_malloc, h_calloc, h_realloc, h_free},
};

int
fc_alloc_init(void)
{
    if (pool.handler == NULL) {
        pool.handler = PyCapsule_New(&fc_handler, "mem_handler", NULL);
        if (pool.handler == NULL) {
            return -1;
        }
    }
    return 0;
}

void
fc_alloc_set_cap(size_t bytes)
{
    pthread_mutex_lock(&pool.lock);
    pool.cap = bytes;
    while (pool.nfree > 0 && pool.cached > pool.cap) {
        pool.nfree--;
        munmap(pool.free_[pool.nfree].ptr, pool.free_[pool.nfree].size);
        pool.cached -= pool.free_[pool.nfree].size;
    }
    pthread_mutex_unlock(&pool.lock);
}

PyObject *
fc_alloc_empty(int ndim, const npy_intp *shape, int typenum, int itemsize)
{
    PyObject *old, *arr;
    npy_intp n = itemsize;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] != 0 && n > NPY_MAX_INTP / shape[d]) {
            return PyArray_SimpleNew(ndim, (npy_intp *)shape, typenum);   /* raises: too big */
        }
        n *= shape[d];
    }
    /* Only blocks the pool keeps go through it: a smaller one would be mapped
     * and unmapped on every call (pool_put returns it to the OS), paying page
     * faults that malloc's heap, which reuses it, does not. */
    if (pool.cap == 0 || pool.handler == NULL || n < FC_POOL_MIN) {
        return PyArray_SimpleNew(ndim, (npy_intp *)shape, typenum);
    }
    old = PyDataMem_SetHandler(pool.handler);
    if (old == NULL) {
        return NULL;
    }
    arr = PyArray_SimpleNew(ndim, (npy_intp *)shape, typenum);
    {
        PyObject *back = PyDataMem_SetHandler(old);
        Py_DECREF(old);
        if (back == NULL) {
            Py_XDECREF(arr);
            return NULL;
        }
        Py_DECREF(back);
    }
    return arr;
}

PyObject *
fc_alloc_stats(void)
{
    PyObject *r;
    pthread_mutex_lock(&pool.lock);
    r = Py_BuildValue("{s:K,s:K,s:n,s:n}", "pool_hits", (unsigned long long)pool.hits,
                      "pool_misses", (unsigned long long)pool.misses, "pool_cached_bytes",
                      (Py_ssize_t)pool.cached, "pool_cap_bytes", (Py_ssize_t)pool.cap);
    pthread_mutex_unlock(&pool.lock);
    return r;
}

void
fc_alloc_free(void)
{
    fc_alloc_set_cap(0);
    /* the capsule may still be referenced by live arrays' mem_handler: keep it */
}
