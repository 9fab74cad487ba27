/* Plans: build (infer, fuse, render, load) and run a specialized segment.
 * In: FcGraph segment + NumPy arrays. Out: output arrays; running a built
 * plan calls kernels straight from C, releasing the GIL for large work. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/strbuf.h"
#include "../fc_numpy.h"
#include "alloc.h"
#include "cuda.h"
#include "devarray.h"
#include "disk.h"
#include "../state.h"
#include "plan.h"
#include "tune.h"


const FcPlanConfig *
fc_plan_config(void)
{
    return &fc_state.plan.c;
}

/* cfg: borrowed dict (fastcompile.config.resolved()) */
int
fc_plan_configure(PyObject *cfg)
{
    PyObject *v;
    if ((v = PyDict_GetItemString(cfg, "num_threads")) != NULL && PyLong_Check(v)) {
        long n = PyLong_AsLong(v);
        fc_state.plan.c.num_threads = n < 1 ? 1 : n > 256 ? 256 : (int)n;
    }
    if ((v = PyDict_GetItemString(cfg, "serial_below")) != NULL && PyLong_Check(v)) {
        fc_state.plan.c.serial_below = PyLong_AsLongLong(v);
    }
    if ((v = PyDict_GetItemString(cfg, "debug")) != NULL && PyLong_Check(v)) {
        fc_state.plan.c.debug = (int)PyLong_AsLong(v);
    }
    if ((v = PyDict_GetItemString(cfg, "verify")) != NULL) {
        fc_state.plan.c.verify = PyObject_IsTrue(v) == 1;
    }
    if ((v = PyDict_GetItemString(cfg, "autotune")) != NULL) {
        fc_state.plan.c.autotune = PyObject_IsTrue(v) == 1;
    }
    if ((v = PyDict_GetItemString(cfg, "dump_dir")) != NULL) {
        snprintf(fc_state.plan.dump_dir, sizeof(fc_state.plan.dump_dir), "%s",
                 PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : "");
    }
    if ((v = PyDict_GetItemString(cfg, "pool_mb")) != NULL && PyLong_Check(v)) {
        long long mb = PyLong_AsLongLong(v);
        fc_alloc_set_cap(mb > 0 ? (size_t)mb << 20 : 0);
    }
    if ((v = PyDict_GetItemString(cfg, "version")) != NULL && PyUnicode_Check(v)) {
        snprintf(fc_state.plan.version, sizeof(fc_state.plan.version), "%s", PyUnicode_AsUTF8(v));
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* ------------------------------------------------------------------------
 * keys
 * ---------------------------------------------------------------------- */

int
fc_plan_typenum(int dtype)
{
    static const int typenum[FC_NDTYPES] = {
        NPY_BOOL, NPY_INT8, NPY_INT16, NPY_INT32, NPY_INT64, NPY_UINT8, NPY_UINT16,
        NPY_UINT32, NPY_UINT64, NPY_HALF, NPY_HALF, NPY_FLOAT32, NPY_FLOAT64};
    return typenum[dtype];
}

static int
dtype_of(PyArrayObject *a)
{
    PyArray_Descr *d = PyArray_DESCR(a);
    int size = (int)PyDataType_ELSIZE(d);
    switch (d->kind) {
    case 'b': return FC_BOOL;
    case 'i': return size == 1 ? FC_I8 : size == 2 ? FC_I16 : size == 4 ? FC_I32 : size == 8 ? FC_I64 : -1;
    case 'u': return size == 1 ? FC_U8 : size == 2 ? FC_U16 : size == 4 ? FC_U32 : size == 8 ? FC_U64 : -1;
    case 'f': return size == 2 ? FC_F16 : size == 4 ? FC_F32 : size == 8 ? FC_F64 : -1;
    default: return -1;
    }
}

/* FcMeta's perm of a (see spec.h): torch's channels_last order, (N, H, W, C)
 * in memory for (N, C, H, W) (and its rank-5 form, channels_last_3d), where
 * a is dense in it and not C-contiguous; 0 otherwise. Only that order: the
 * one convolutions want, which the core then keeps in their neighbours'
 * results. A transposed view (attention's (B, S, H, D) read as (B, H, S, D),
 * a matrix's .T) stays 0: its results stay C order, as an explicit copy of
 * it (.contiguous()) wants. Size-1 dims may sit anywhere in memory. */
static uint64_t
dense_perm(PyArrayObject *a)
{
    const int nd = PyArray_NDIM(a);
    const npy_intp *dims = PyArray_DIMS(a), *st = PyArray_STRIDES(a);
    npy_intp want = PyArray_ITEMSIZE(a);
    int order[FC_MAXDIM];
    uint64_t code = 0;

    if (nd < 4 || nd > 5 || PyArray_IS_C_CONTIGUOUS(a) || PyArray_SIZE(a) == 0) {
        return 0;
    }
    order[0] = 0;                      /* N, H, W, [D,] C: dims 0, 2, ..., nd - 1, 1 */
    for (int i = 1; i < nd - 1; i++) {
        order[i] = i + 1;
    }
    order[nd - 1] = 1;
    for (int i = nd - 1; i >= 0; i--) {
        int d = order[i];
        if (dims[d] == 1) {
            continue;
        }
        if (st[d] != want) {
            return 0;
        }
        want *= dims[d];
    }
    for (int i = 0; i < nd; i++) {
        code |= (uint64_t)order[i] << (4 * i);
    }
    return code;
}

int
fc_plan_meta(PyObject *obj, FcMeta *m)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    int nd = PyArray_NDIM(a);
    m->dtype = dtype_of(a);
    if (m->dtype < 0 || !PyArray_ISNOTSWAPPED(a)) {
        PyObject *r = PyObject_Repr((PyObject *)PyArray_DESCR(a));
        PyErr_Format(PyExc_TypeError,
                     "fastcompile: arrays of dtype %S are not supported by the core "
                     "(supported: bool, int8-64, uint8-64, float16/32/64, native byte order)", r);
        Py_XDECREF(r);
        return -1;
    }
    if (nd > FC_MAXDIM) {
        PyErr_Format(PyExc_ValueError, "fastcompile: arrays of rank %d are not supported (at most %d)",
                     nd, FC_MAXDIM);
        return -1;
    }
    m->ndim = nd;
    m->ones = 0;
    for (int d = 0; d < nd; d++) {
        if (PyArray_DIM(a, d) == 1) {
            m->ones |= 1u << d;
        }
    }
    m->contig = PyArray_IS_C_CONTIGUOUS(a) ? 1 : 0;
    m->zlast = !m->contig && nd > 0 && PyArray_DIM(a, nd - 1) > 1 && PyArray_STRIDE(a, nd - 1) == 0;
    m->perm = dense_perm(a);
    return 0;
}

/* ------------------------------------------------------------------------
 * build
 * ---------------------------------------------------------------------- */

static void
log_debug(const char *text)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    {
    PyObject *logging = PyImport_ImportModule("logging");
    PyObject *logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "fastcompile") : NULL;
    PyObject *r = logger ? PyObject_CallMethod(logger, "debug", "s", text) : NULL;
    Py_XDECREF(r);
    Py_XDECREF(logger);
    Py_XDECREF(logging);
    PyErr_Clear();
    }
    PyErr_Restore(et, ev, tb);
}


/* A CUDA plan's kernels compiled (NVRTC, disk cache) and loaded on its
 * device, with 32-bit index math; a launch that needs 64 bits compiles that
 * entry point then (launch_cuda). GIL held. 0, or -1 + exception (the plan
 * stays unloaded). */
static int
load_cuda(FcPlan *p)
{
    double t0 = fc_disk_now_ms();
    for (int o = 0; o < p->nkernels; o++) {
        FcPlanKernel *pk = &p->kernels[o];
        const FcKernelIR *K = &p->spec.kernels[pk->kernel];
        if (fc_cuda_check_params(K->nops, K->nd) < 0) {
            return -1;
        }
        if (pk->cu_fn[0] == NULL &&
                fc_cuda_load_kernel(pk->source, pk->name, p->dev - 1, 32, &pk->cu_fn[0], pk->cu_key,
                                    pk->cu_arch, pk->cu_path) < 0) {
            return -1;
        }
        pk->loaded.key = pk->cu_key;
        pk->loaded.c_path = pk->cu_path[0] ? pk->cu_path : NULL;
    }
    p->loaded = 1;
    p->compile_ms += fc_disk_now_ms() - t0;
    return 0;
}

int
fc_plan_load(FcPlan *const *plans, int n, char *newly)
{
    const char **srcs = NULL, **names = NULL;
    FcLoaded *loaded = NULL;
    char *batch = NULL;         /* per plan: its kernels are in this batch */
    int total = 0, nplans = 0, rc = -1;
    double t0 = fc_disk_now_ms();
    if (newly != NULL && n > 0) {
        memset(newly, 0, n);
    }
    batch = PyMem_Calloc(n + 1, 1);
    if (batch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int dup = 0;
        for (int k = 0; k < i && !dup; k++) {
            dup = batch[k] && plans[k] == plans[i];     /* a plan listed twice loads once */
        }
        if (!plans[i]->loaded && plans[i]->dev > 0) {  /* CUDA: NVRTC, one kernel at a time */
            if (load_cuda(plans[i]) < 0) {
                goto cleanup;
            }
            if (newly != NULL) {
                newly[i] = 1;
            }
            continue;
        }
        if (!plans[i]->loaded && !dup) {
            batch[i] = 1;
            total += plans[i]->nkernels;
            nplans++;
        }
    }
    if (nplans == 0) {
        rc = 0;
        goto cleanup;
    }
    srcs = PyMem_Calloc(total + 1, sizeof(char *));
    names = PyMem_Calloc(total + 1, sizeof(char *));
    loaded = PyMem_Calloc(total + 1, sizeof(FcLoaded));
    if (srcs == NULL || names == NULL || loaded == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    /* the sources stay valid while the GIL is out: a plan is freed only with
     * its Compiled object, which the caller holds */
    for (int i = 0, j = 0; i < n; i++) {
        for (int o = 0; batch[i] && o < plans[i]->nkernels; o++, j++) {
            srcs[j] = plans[i]->kernels[o].source;
            names[j] = plans[i]->kernels[o].name;
        }
    }
    /* after a failure (exception set), the plans whose kernels all loaded
     * are still marked loaded below; the others stay for their calls */
    rc = fc_cpu_load_many(total, srcs, names, 1, loaded);   /* rendered: may bundle */
    /* the GIL is back; a plan another thread loaded meanwhile keeps what it
     * has (the same functions: the kernel table holds one entry per key) */
    double ms = fc_disk_now_ms() - t0, share = ms / nplans;
    int nloaded = 0;
    for (int i = 0, j = 0; i < n; i++) {
        FcPlan *p = plans[i];
        int ok = 1;
        if (!batch[i]) {
            continue;
        }
        for (int o = 0; o < p->nkernels; o++) {
            ok &= loaded[j + o].fn != NULL;
        }
        if (ok && !p->loaded) {
            for (int o = 0; o < p->nkernels; o++) {
                p->kernels[o].loaded = loaded[j + o];
            }
            p->loaded = 1;
            p->compile_ms += share;
            nloaded++;
            if (newly != NULL) {
                newly[i] = 1;
            }
        }
        j += p->nkernels;
    }
    if (fc_state.plan.c.debug >= 1) {
        char msg[160];
        snprintf(msg, sizeof(msg), "loaded %d of %d plan%s (%d kernel%s) in one batch in %.1f ms",
                 nloaded, nplans, nplans == 1 ? "" : "s", total, total == 1 ? "" : "s", ms);
        log_debug(msg);                       /* keeps a pending exception */
    }
cleanup:
    PyMem_Free(srcs);
    PyMem_Free(names);
    PyMem_Free(loaded);
    PyMem_Free(batch);
    return rc;
}

/* FASTCOMPILE_DUMP_DIR: every stage as a file, <graph hash>.<stage> */
static void
dump_stage(const char *ghash, const char *stage, const char *text)
{
    char path[1200];
    FILE *f;
    if (fc_state.plan.dump_dir[0] == 0) {
        return;
    }
    mkdir(fc_state.plan.dump_dir, 0700);
    snprintf(path, sizeof(path), "%s/%s.%s", fc_state.plan.dump_dir, ghash, stage);
    if ((f = fopen(path, "w")) != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

static int
copy_ints(int **dst, const int *src, int n)
{
    *dst = PyMem_Malloc((n + 1) * sizeof(int));
    if (*dst == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(*dst, src, n * sizeof(int));
    return 0;
}

/* s (zeroed) for segment seg of g under the key metas (borrowed, kept in
 * s->metas): per-node membership, segment inputs and outputs. On error the
 * caller's fc_spec_free releases what was allocated. */
static int
spec_init(FcSpec *s, const FcGraph *g, const FcSegment *seg, const FcMeta *metas)
{
    s->g = g;
    s->metas = metas;
    s->sn = PyMem_Calloc(g->nnodes + 1, sizeof(FcSNode));
    if (s->sn == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < g->nnodes; i++) {
        s->sn[i].in_seg = seg->in_seg[i];
    }
    if (copy_ints(&s->inputs, seg->inputs, seg->ninputs) < 0 ||
            copy_ints(&s->outputs, seg->outputs, seg->noutputs) < 0) {
        return -1;
    }
    s->ninputs = seg->ninputs;
    s->noutputs = seg->noutputs;
    return 0;
}

static char *
kernel_header(const FcSpec *s, int k, const char *name, const char *dump_hash, const char *origin)
{
    FcStr b = {0};
    const FcKernelIR *K = &s->kernels[k];
    int nodes = K->nnodes;
    /* the text goes into a C comment: a "*\/" in the user's path must not end it */
    char *where = fc_str_replace(origin ? origin : "<unknown>", "*/", "*\\/");
    if (where == NULL) {
        return NULL;
    }
    fc_str_printf(&b, "fastcompile %s: kernel %s\n * graph %s from %s\n * %d op%s, %s",
                  fc_state.plan.version, name, dump_hash, where, nodes,
                  nodes == 1 ? "" : "s", K->mask ? "reduction" : K->flat ? "pointwise (flat)" : "pointwise");
    fc_str_release(where);
    if (K->mask) {
        fc_str_printf(&b, ", %d sweep%s per row", K->nphases + 1, K->nphases ? "s" : "");
    }
    return fc_str_take(&b);
}

/* Kernel k's source from a renderer (fc_gen_c, fc_gen_cuda), rendered once:
 * with a placeholder name and an empty header comment, its node locals
 * renumbered (fc_expr_canon_names), named by a hash of that text (so equal
 * kernels share a name), then the placeholder replaced by the name and the
 * comment by kernel_header's. Writes the name into name. Returns a new
 * string (fc_str_release), or NULL + exception. */
#define KERNEL_PLACEHOLDER "FCKNAME"
typedef char *(*Renderer)(const FcSpec *s, int k, const char *name, const char *header_comment);

static char *
render_kernel(Renderer render, const FcSpec *s, int k, const char *ghash, const char *origin, char name[40])
{
    FcStr b = {0};
    char *raw = render(s, k, KERNEL_PLACEHOLDER, "");
    char *draft = raw ? fc_expr_canon_names(raw, s->g->nnodes) : NULL;
    char *named = NULL, *header = NULL;
    const char *body;
    fc_str_release(raw);
    if (draft == NULL) {
        return NULL;
    }
    snprintf(name, 40, "fc_%016llx", (unsigned long long)fc_fnv1a(draft));
    named = fc_str_replace(draft, KERNEL_PLACEHOLDER, name);
    header = named ? kernel_header(s, k, name, ghash, origin) : NULL;
    fc_str_release(draft);
    if (header == NULL) {
        fc_str_release(named);
        return NULL;
    }
    body = strstr(named, "*/");               /* the end of the renderer's empty comment */
    fc_str_printf(&b, "/* %s %s", header, body ? body : "*/\n");
    fc_str_release(header);
    fc_str_release(named);
    return fc_str_take(&b);
}

FcPlan *
fc_plan_build(const FcGraph *g, const FcSegment *seg, const FcMeta *metas, const char *origin, int dev)
{
    FcPlan *p = NULL;
    FcSpec *s;
    char ghash[24];
    double t0 = fc_disk_now_ms();

    p = PyMem_Calloc(1, sizeof(FcPlan));
    if (p == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    s = &p->spec;
    p->dev = dev;
    p->metas = PyMem_Malloc((seg->ninputs + 1) * sizeof(FcMeta));
    if (p->metas == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    memcpy(p->metas, metas, seg->ninputs * sizeof(FcMeta));
    for (int k = 0; dev > 0 && k < seg->ninputs; k++) {
        p->metas[k].perm = 0;           /* CUDA buffers are allocated in C order */
    }
    if (spec_init(s, g, seg, p->metas) < 0) {
        goto error;
    }

    if (fc_shape_infer(s, p->metas) < 0 || fc_fuse(s) < 0) {
        goto error;
    }
    if (fc_state.plan.c.verify && fc_spec_verify(s) < 0) {
        goto error;
    }
    if ((p->dump = fc_spec_dump(s)) == NULL) {
        goto error;
    }
    snprintf(ghash, sizeof(ghash), "%016llx", (unsigned long long)fc_fnv1a(p->dump));
    dump_stage(ghash, "fused.txt", p->dump);
    if (fc_state.plan.c.debug >= 2) {
        char *msg = fc_str_replace(p->dump, "\n", "\n  ");
        if (msg != NULL) {
            FcStr b = {0};
            fc_str_printf(&b, "fused graph %s (%s):\n  %s", ghash, origin ? origin : "?", msg);
            fc_str_release(msg);
            msg = fc_str_take(&b);
            if (msg != NULL) {
                log_debug(msg);
                fc_str_release(msg);
            }
        }
        PyErr_Clear();
    }

    p->kernels = PyMem_Calloc(s->nkernels + 1, sizeof(FcPlanKernel));
    if (p->kernels == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (int o = 0; o < s->nkernels; o++) {
        int k = s->order[o];
        FcPlanKernel *pk = &p->kernels[o];
        char name[40];
        pk->kernel = k;
        pk->source = render_kernel(dev ? fc_gen_cuda : fc_gen_c, s, k, ghash, origin, name);
        pk->nonempty = dev ? fc_gen_cuda_needs_nonempty(s, k) : 0;
        pk->per_thread = dev ? fc_gen_cuda_per_thread(s, k) : 0;
        pk->name = pk->source ? PyMem_Malloc(strlen(name) + 1) : NULL;
        if (pk->source == NULL || pk->name == NULL) {
            /* p->nkernels does not count this one yet: free what it got here */
            fc_str_release(pk->source);
            pk->source = NULL;
            if (!PyErr_Occurred()) {
                PyErr_NoMemory();
            }
            goto error;
        }
        strcpy(pk->name, name);
        p->nkernels = o + 1;
        if (fc_state.plan.c.debug >= 3) {
            log_debug(pk->source);
        }
        {
            char stage[64];
            snprintf(stage, sizeof(stage), "kernel%d.%s.%s", o, pk->name, dev ? "cu" : "c");
            dump_stage(ghash, stage, pk->source);
        }
    }
    p->nkernels = s->nkernels;
    p->compile_ms = fc_disk_now_ms() - t0;
    if (fc_state.plan.c.debug >= 1) {
        char msg[256];
        snprintf(msg, sizeof(msg), "rendered plan for graph %s (%s): %d kernel%s in %.1f ms",
                 ghash, origin ? origin : "?", p->nkernels, p->nkernels == 1 ? "" : "s", p->compile_ms);
        log_debug(msg);
    }
    return p;
error:
    fc_plan_free(p);
    return NULL;
}

/* The CUDA renderer over one specialization, no compile and no device:
 * shape inference and fusion as fc_plan_build, then gen_cuda per kernel in
 * execution order. Returns a new list of dicts {name, source, reduction,
 * needs_nonempty, nops, nd, per_thread}, or NULL + exception. */
PyObject *
fc_plan_render_cuda(const FcGraph *g, const FcSegment *seg, const FcMeta *metas, const char *origin)
{
    FcSpec spec, *s = &spec;
    PyObject *list = NULL;
    char *dump = NULL;
    char ghash[24];
    FcMeta *cuda_metas = PyMem_Malloc((seg->ninputs + 1) * sizeof(FcMeta));   /* owned */

    memset(s, 0, sizeof(*s));
    if (cuda_metas == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    memcpy(cuda_metas, metas, seg->ninputs * sizeof(FcMeta));
    for (int k = 0; k < seg->ninputs; k++) {
        cuda_metas[k].perm = 0;         /* as fc_plan_build's for a device */
    }
    if (spec_init(s, g, seg, cuda_metas) < 0) {
        goto error;
    }
    if (fc_shape_infer(s, cuda_metas) < 0 || fc_fuse(s) < 0 || (dump = fc_spec_dump(s)) == NULL) {
        goto error;
    }
    snprintf(ghash, sizeof(ghash), "%016llx", (unsigned long long)fc_fnv1a(dump));
    if ((list = PyList_New(0)) == NULL) {
        goto error;
    }
    for (int o = 0; o < s->nkernels; o++) {
        int k = s->order[o];
        char name[40], *src;
        PyObject *d;
        if ((src = render_kernel(fc_gen_cuda, s, k, ghash, origin, name)) == NULL) {
            goto error;
        }
        d = Py_BuildValue("{s:s,s:s,s:O,s:O,s:i,s:i,s:i}", "name", name, "source", src,
                          "reduction", s->kernels[k].mask ? Py_True : Py_False,
                          "needs_nonempty", fc_gen_cuda_needs_nonempty(s, k) ? Py_True : Py_False,
                          "nops", s->kernels[k].nops, "nd", s->kernels[k].nd,
                          "per_thread", fc_gen_cuda_per_thread(s, k));
        fc_str_release(src);
        if (d == NULL || PyList_Append(list, d) < 0) {
            Py_XDECREF(d);
            goto error;
        }
        Py_DECREF(d);
    }
    goto cleanup;
error:
    Py_CLEAR(list);
cleanup:
    PyMem_Free(dump);
    s->metas = NULL;
    fc_spec_free(s);
    PyMem_Free(cuda_metas);
    return list;
}

void
fc_plan_free(FcPlan *p)
{
    if (p == NULL) {
        return;
    }
    for (int k = 0; k < p->nkernels; k++) {
        PyMem_Free(p->kernels[k].name);
        fc_str_release(p->kernels[k].source);
        fc_tune_free(&p->kernels[k].tune);
    }
    PyMem_Free(p->kernels);
    PyMem_Free(p->dump);
    PyMem_Free(p->metas);
    fc_spec_free(&p->spec);
    PyMem_Free(p);
}

/* ------------------------------------------------------------------------
 * run
 * ---------------------------------------------------------------------- */

/* input k's rank and dims: its view in memo where given (CUDA), else the
 * NumPy array in vals */
static int
input_dims(const FcSpec *s, PyObject **vals, const FcDevMemo *memo, int k, const Py_intptr_t **dims)
{
    PyArrayObject *a;
    if (memo != NULL) {
        const FcDevArr *v = &memo->arr[s->inputs[k]];
        *dims = v->dims;
        return v->nd;
    }
    a = (PyArrayObject *)vals[s->inputs[k]];
    *dims = PyArray_DIMS(a);
    return PyArray_NDIM(a);
}

static void
raise_broadcast(const FcSpec *s, PyObject **vals, const FcDevMemo *memo)
{
    FcStr b = {0};
    char *text;
    fc_str_puts(&b, "operands could not be broadcast together with shapes");
    for (int k = 0; k < s->ninputs; k++) {
        const Py_intptr_t *dims;
        int nd = input_dims(s, vals, memo, k, &dims);
        fc_str_puts(&b, " (");
        for (int d = 0; d < nd; d++) {
            fc_str_printf(&b, d ? ",%lld" : "%lld", (long long)dims[d]);
        }
        fc_str_puts(&b, nd == 1 ? ",)" : ")");
    }
    text = fc_str_take(&b);
    if (text != NULL) {
        PyErr_SetString(PyExc_ValueError, text);
        fc_str_release(text);
    }
}

static void
raise_kernel_error(const FcSpec *s, int k, int err)
{
    if (err == FC_ERR_NEGATIVE_POWER) {
        PyErr_SetString(PyExc_ValueError, "Integers to negative integer powers are not allowed.");
        return;
    }
    if (err == FC_ERR_ZERO_DIVISION) {
        PyErr_SetString(PyExc_RuntimeError, "ZeroDivisionError");   /* torch's message */
        return;
    }
    if (err == FC_ERR_EMPTY_REDUCE) {
        const FcKernelIR *K = &s->kernels[k];
        for (int m = 0; m < K->nnodes; m++) {
            int op = s->g->nodes[K->nodes[m]].op;
            if (op == FC_OP_ARGMAX || op == FC_OP_ARGMIN) {
                PyErr_Format(PyExc_ValueError, "attempt to get %s of an empty sequence", fc_ops[op].name);
                return;
            }
            if (op == FC_OP_AMAX || op == FC_OP_AMIN) {
                PyErr_Format(PyExc_ValueError,
                             "zero-size array to reduction operation %s which has no identity",
                             op == FC_OP_AMAX ? "maximum" : "minimum");
                return;
            }
        }
    }
    PyErr_Format(PyExc_RuntimeError, "fastcompile: kernel failed with code %d", err);
}

/* collapse the F positions listed in `pos` into shape/strides (see fc_launch) */
static int
collapse(const int *pos, int npos, const int64_t *fsz, int64_t (*st)[FC_MAXDIM], int nops,
         int64_t *shape, int64_t (*stride)[FC_LAUNCH_MAXDIM], int64_t *count)
{
    int m = 0;
    int64_t n = 1;
    for (int q = 0; q < npos; q++) {
        int d = pos[q];
        int merge = m > 0;
        if (fsz[d] == 1) {
            continue;
        }
        for (int o = 0; merge && o < nops; o++) {
            merge = stride[o][m - 1] == st[o][d] * fsz[d];
        }
        if (merge) {
            shape[m - 1] *= fsz[d];
            for (int o = 0; o < nops; o++) {
                stride[o][m - 1] = st[o][d];
            }
        }
        else {
            shape[m] = fsz[d];
            for (int o = 0; o < nops; o++) {
                stride[o][m] = st[o][d];
            }
            m++;
        }
        n *= fsz[d];
    }
    if (m == 0) {
        shape[0] = 1;
        for (int o = 0; o < nops; o++) {
            stride[o][0] = 0;
        }
        m = 1;
    }
    *count = n;
    return m;
}

/* Column blocks for a strided pointwise launch. When the last (collapsed)
 * dim walks some operand with a stride other than 0 or +-1 (x * y.T,
 * gelu(x.T)), a row sweep touches one cache line of that operand per element
 * and the next row comes back to the same lines only after the whole row:
 * for wide rows they have left L1 by then, so every element is a miss
 * (15x slower than contiguous on 512 x 2048 float32). Run as column blocks
 * instead, a block's lines stay in L1 from one row to the next. Returns the
 * block width, or 0 to run the launch whole (no such operand; narrow or
 * short spaces). Blocks widen until one is worth a parallel region. */
#define FC_COL_BLOCK 64
static int64_t
column_block(const fc_launch *L)
{
    const int last = L->nd_outer - 1;
    const int64_t w = L->oshape[last];
    int64_t rows, b = FC_COL_BLOCK;
    int strided = 0;
    if (L->nd_outer < 2 || w <= 2 * FC_COL_BLOCK) {
        return 0;
    }
    rows = L->n_outer / w;
    for (int q = 0; q < L->nops; q++) {
        const int64_t st = L->ostride[q][last];
        strided |= st != 0 && st != 1 && st != -1;
    }
    if (!strided || rows < 8) {
        return 0;
    }
    while (rows * b < L->serial_below && b < w) {
        b *= 2;
    }
    return b < w ? b : 0;
}

/* run one launch: whole, or as column blocks of width bw (see column_block);
 * elsize: bytes per element of each operand. Returns the kernel's error. */
static int
run_launch(fc_kernel_fn fn, fc_launch *L, int64_t bw, const int64_t *elsize)
{
    const int last = L->nd_outer - 1;
    const int64_t w = L->oshape[last], n = L->n_outer;
    char *base[FC_LAUNCH_MAXOPS];
    int err = 0;
    if (bw == 0) {
        return fn(L);
    }
    memcpy(base, L->ptr, L->nops * sizeof(char *));
    for (int64_t c0 = 0; c0 < w && err == 0; c0 += bw) {
        const int64_t cw = w - c0 < bw ? w - c0 : bw;
        L->oshape[last] = cw;
        L->n_outer = n / w * cw;
        for (int q = 0; q < L->nops; q++) {
            L->ptr[q] = base[q] + c0 * L->ostride[q][last] * elsize[q];
        }
        err = fn(L);
    }
    L->oshape[last] = w;          /* L as it came */
    L->n_outer = n;
    memcpy(L->ptr, base, L->nops * sizeof(char *));
    return err;
}

/* Launch settings a tuner may choose: nthreads, and serial_below so that the
 * kernel's own threshold neither overrides a choice of 1 thread nor of more. */
static void
set_threads(fc_launch *L, int nthreads)
{
    L->nthreads = nthreads;
    L->serial_below = nthreads > 1 ? 0 : INT64_MAX;
}

typedef struct {
    fc_kernel_fn fn;
    fc_launch *L;
    const int64_t *elsize;
} TuneCtx;

/* FcTuneRun: one run of the launch being tuned (no GIL; L restored after) */
static int
tune_launch(void *ctx, int nthreads, int64_t block)
{
    TuneCtx *c = ctx;
    const int nthreads0 = c->L->nthreads;
    const int64_t serial_below0 = c->L->serial_below;
    int err;
    set_threads(c->L, nthreads);
    err = run_launch(c->fn, c->L, block, c->elsize);
    c->L->nthreads = nthreads0;
    c->L->serial_below = serial_below0;
    return err;
}

/* One kernel operand as fill_launch reads it: a NumPy array or a CUDA tensor */
typedef struct {
    char *data;
    int nd;
    const Py_intptr_t *dims, *strides;   /* strides in bytes */
    int64_t itemsize;
} Operand;

/* bytes of the memory the operands span, each element once (a dim of
 * stride 0, a broadcast, counts once): what a launch moves at least, for
 * profile()'s bandwidth */
static int64_t
launch_bytes(const Operand *ops, int nops)
{
    int64_t bytes = 0;
    for (int q = 0; q < nops; q++) {
        int64_t n = ops[q].itemsize;
        for (int d = 0; d < ops[q].nd; d++) {
            n *= ops[q].strides[d] != 0 || ops[q].dims[d] == 0 ? ops[q].dims[d] : 1;
        }
        bytes += n;
    }
    return bytes;
}

/* The launch of kernel K over ops (one per kernel operand): the outer and
 * inner spaces collapsed (see fc_launch), strides in elements; elsize gets
 * each operand's bytes per element. Threads and blocks are the caller's. */
static void
fill_launch(const FcKernelIR *K, const Operand *ops, const int64_t *sizes, fc_launch *L, int64_t *elsize)
{
    int64_t fsz[FC_MAXDIM], st[FC_MAXOPS][FC_MAXDIM];
    int outer[FC_MAXDIM], inner[FC_MAXDIM], nouter = 0, ninner = 0;

    for (int d = 0; d < K->nd; d++) {
        fsz[d] = K->F[d] ? sizes[K->F[d]] : 1;
        if (K->mask & (1u << d)) {
            inner[ninner++] = d;
        }
        else {
            outer[nouter++] = d;
        }
    }
    if (K->loop_perm != 0) {       /* pointwise (every dim outer): its output's memory order */
        for (int i = 0; i < K->nd; i++) {
            outer[i] = FC_PERM_DIM(K->loop_perm, i);
        }
    }
    L->nops = K->nops;
    for (int q = 0; q < K->nops; q++) {
        const Operand *a = &ops[q];
        int nda = a->nd;
        int64_t el = a->itemsize;
        L->ptr[q] = a->data;
        elsize[q] = el;
        if (K->flat) {
            continue;
        }
        for (int d = 0; d < K->nd; d++) {
            int sd;
            if (K->ops[q].align == FC_ALIGN_FULL) {
                sd = d - (K->nd - nda);
            }
            else if (K->mask & (1u << d)) {
                sd = -1;
            }
            else {
                int qpos = 0;
                for (int e = 0; e < d; e++) {
                    qpos += !(K->mask & (1u << e));
                }
                sd = qpos - (nouter - nda);
            }
            st[q][d] = (sd >= 0 && a->dims[sd] != 1) ? a->strides[sd] / el : 0;
        }
    }
    if (K->flat) {
        int64_t n = 1;
        for (int d = 0; d < K->nd; d++) {
            n *= fsz[d];
        }
        L->n_outer = n;
        L->n_inner = 1;
        L->nd_outer = L->nd_inner = 1;
        L->oshape[0] = n;
        L->ishape[0] = 1;
    }
    else {
        L->nd_outer = collapse(outer, nouter, fsz, st, K->nops, L->oshape, L->ostride, &L->n_outer);
        L->nd_inner = collapse(inner, ninner, fsz, st, K->nops, L->ishape, L->istride, &L->n_inner);
    }
}

/* Short rows. A pointwise launch that collapses to (rows, len) with len
 * short, every operand unit-stride along the row, and each operand either
 * dense over rows (stride len) or the same row for all (stride 0: channels_last's
 * per-channel scale of a BatchNorm, whose rows are the C channels) pays each
 * run's setup for len elements. Such a launch runs as (rows / k, k * len):
 * each stride-0 input is read from a copy of its row repeated k times
 * (tiles[q], raw-malloc'd; the caller frees them), so runs are about
 * FC_TILE_ELEMS long. Returns 1 if it
 * retiled L, 0 if not (out of memory: the launch runs as it was). */
#define FC_SHORT_ROW 64
#define FC_TILE_ELEMS 256
static int
tile_short_rows(const FcKernelIR *K, fc_launch *L, const int64_t *elsize, char **tiles)
{
    const int64_t rows = L->oshape[0], len = L->oshape[1];
    int64_t k;
    int bcast = 0;

    if (K->mask != 0 || K->flat || L->nd_outer != 2 || len < 1 || len >= FC_SHORT_ROW || rows < 2) {
        return 0;
    }
    for (int q = 0; q < L->nops; q++) {
        if (L->ostride[q][1] != 1 || (L->ostride[q][0] != len && L->ostride[q][0] != 0)
                || (K->ops[q].is_out && L->ostride[q][0] == 0)) {
            return 0;
        }
        bcast |= L->ostride[q][0] == 0;
    }
    for (k = FC_TILE_ELEMS / len; k > 1 && rows % k != 0; k--) {
    }
    if (!bcast || k < 2) {
        return 0;
    }
    for (int q = 0; q < L->nops; q++) {
        if (L->ostride[q][0] != 0) {
            continue;
        }
        tiles[q] = PyMem_RawMalloc((size_t)(k * len * elsize[q]));
        if (tiles[q] == NULL) {
            for (int r = 0; r < q; r++) {
                PyMem_RawFree(tiles[r]);
                tiles[r] = NULL;
            }
            return 0;
        }
    }
    for (int q = 0; q < L->nops; q++) {
        if (tiles[q] != NULL) {
            for (int64_t r = 0; r < k; r++) {
                memcpy(tiles[q] + r * len * elsize[q], L->ptr[q], (size_t)(len * elsize[q]));
            }
            L->ptr[q] = tiles[q];
        }
        else {
            L->ostride[q][0] = k * len;
        }
    }
    L->oshape[0] = rows / k;
    L->oshape[1] = k * len;
    return 1;
}

/* Runs kernel o of p over arrs. autotune: time the settings tune.c offers for
 * a launch shape not seen before and use the fastest from then on. */
static int
launch(FcPlan *p, int o, PyArrayObject **arrs, const int64_t *sizes, int autotune)
{
    const FcSpec *s = &p->spec;
    FcPlanKernel *pk = &p->kernels[o];
    int k = pk->kernel;
    const FcKernelIR *K = &s->kernels[k];
    fc_launch L;
    Operand ops[FC_MAXOPS];
    int64_t elsize[FC_MAXOPS], bw = 0;
    char *tiles[FC_MAXOPS] = {NULL};     /* owned: tile_short_rows' row copies */
    int err, rc = 0;
    uint64_t t0;

    for (int q = 0; q < K->nops; q++) {
        PyArrayObject *a = arrs[K->ops[q].slot];
        ops[q].data = PyArray_BYTES(a);
        ops[q].nd = PyArray_NDIM(a);
        ops[q].dims = PyArray_DIMS(a);
        ops[q].strides = PyArray_STRIDES(a);
        ops[q].itemsize = PyArray_ITEMSIZE(a);
    }
    fill_launch(K, ops, sizes, &L, elsize);
    L.nthreads = fc_state.plan.c.num_threads;
    L.serial_below = fc_state.plan.c.serial_below;
    /* nothing to compute, unless a reduction with no identity must raise
     * over an empty axis (np.max(np.ones((0, 0)), axis=0) raises) */
    if (L.n_outer == 0 && !(K->mask != 0 && L.n_inner == 0)) {
        return 0;
    }
    tile_short_rows(K, &L, elsize, tiles);
    if (!K->flat) {
        bw = K->mask == 0 ? column_block(&L) : 0;
    }
    /* whether the launch is big enough to let other threads in while it runs:
     * decided before a tuned setting changes serial_below (1 thread: never) */
    const int release_gil = L.n_outer * L.n_inner >= L.serial_below;
    if (autotune && L.n_outer * L.n_inner >= FC_TUNE_MIN_ELEMS) {
        FcTuneEntry *e = fc_tune_find(&pk->tune, &L);
        if (e == NULL) {
            TuneCtx ctx = {pk->loaded.fn, &L, elsize};
            err = fc_tune_run(&pk->tune, &L, fc_state.plan.c.num_threads, bw, tune_launch, &ctx);
            if (err < 0) {
                rc = -1;
                goto cleanup;
            }
            goto done;      /* the fastest setting ran last: its outputs stand */
        }
        set_threads(&L, e->cands[e->best].nthreads);
        bw = e->cands[e->best].block;
        e->uses++;
    }
    /* profiled: launches of a call (not _warm's background runs, nor a first autotuned run) */
    t0 = fc_prof_on && fc_prof_current() != NULL ? fc_prof_now() : 0;
    if (release_gil) {
        Py_BEGIN_ALLOW_THREADS
        err = run_launch(pk->loaded.fn, &L, bw, elsize);
        Py_END_ALLOW_THREADS
    }
    else {
        err = run_launch(pk->loaded.fn, &L, bw, elsize);
    }
    if (t0 != 0 && fc_prof_on && err == 0) {
        fc_prof_add(&pk->prof, FC_PROF_KERNEL, pk->name, pk->loaded.c_path, fc_prof_current(), fc_prof_now() - t0,
                    L.n_outer * L.n_inner, launch_bytes(ops, K->nops));
    }
done:
    if (err) {
        raise_kernel_error(s, k, err);
        rc = -1;
    }
cleanup:
    for (int q = 0; q < K->nops; q++) {
        PyMem_RawFree(tiles[q]);
    }
    return rc;
}

#define FC_STACK_SLOTS 64
#define FC_STACK_CLASSES 64

/* sizes of every symbolic dim (s->nclasses entries) from the inputs' dims
 * (memo: CUDA, as input_dims); a mismatch raises NumPy's broadcast error.
 * 0, or -1 + ValueError. */
static int
bind_sizes(const FcSpec *s, PyObject **vals, const FcDevMemo *memo, int64_t *sizes)
{
    for (int c = 0; c < s->nclasses; c++) {
        sizes[c] = -1;
    }
    sizes[0] = 1;
    for (int k = 0; k < s->ninputs; k++) {
        int v = s->inputs[k];
        const Py_intptr_t *dims;
        input_dims(s, vals, memo, k, &dims);
        for (int d = 0; d < s->sn[v].ndim; d++) {
            int c = s->sn[v].dims[d];
            if (c == 0) {
                continue;
            }
            if (sizes[c] < 0) {
                sizes[c] = dims[d];
            }
            else if (sizes[c] != dims[d]) {
                raise_broadcast(s, vals, memo);
                return -1;
            }
        }
    }
    return 0;
}

/* Kernel o of CUDA plan p over the slots' tensors on stream. GIL held. */
static int
launch_cuda(FcPlan *p, int o, const FcDevArr *arrs, const int64_t *sizes, void *stream)
{
    const FcSpec *s = &p->spec;
    FcPlanKernel *pk = &p->kernels[o];
    const FcKernelIR *K = &s->kernels[pk->kernel];
    fc_launch L;
    FcCuLaunch packed;
    Operand ops[FC_MAXOPS];
    int64_t elsize[FC_MAXOPS];

    for (int q = 0; q < K->nops; q++) {
        const FcDevArr *a = &arrs[K->ops[q].slot];
        ops[q].data = a->data;
        ops[q].nd = a->nd;
        ops[q].dims = a->dims;
        ops[q].strides = a->strides;
        ops[q].itemsize = a->itemsize;
    }
    fill_launch(K, ops, sizes, &L, elsize);
    /* what the CPU kernels raise from inside is checked here, before the
     * launch: a reduction with no identity over an empty row */
    if (K->mask != 0 && L.n_inner == 0 && pk->nonempty) {
        raise_kernel_error(s, pk->kernel, FC_ERR_EMPTY_REDUCE);
        return -1;
    }
    if (L.n_outer == 0) {
        return 0;
    }
    if (fc_cuda_pack(&L, K->nd, K->flat, pk->per_thread, &packed) < 0) {
        return -1;
    }
    if (packed.bits == 64 && pk->cu_fn[1] == NULL) {
        char key[65], arch[16], path[1024];
        if (fc_cuda_load_kernel(pk->source, pk->name, p->dev - 1, 64, &pk->cu_fn[1], key, arch, path) < 0) {
            return -1;
        }
    }
    if (fc_cuda_run(pk->cu_fn[packed.bits == 64], p->dev - 1, &packed, stream) < 0) {
        return -1;
    }
    if (fc_prof_on && fc_prof_current() != NULL) {      /* asynchronous: counted, with no time */
        fc_prof_add(&pk->prof, FC_PROF_CUDA, pk->name, pk->loaded.c_path, fc_prof_current(), 0,
                    L.n_outer * L.n_inner, launch_bytes(ops, K->nops));
    }
    return 0;
}

/* fc_plan_run for a CUDA plan: vals hold torch tensors on device p->dev - 1
 * (find_plan checked the device of each input it read into memo). */
static int
run_cuda(FcPlan *p, PyObject **vals, int dry, FcDevMemo *memo)
{
    const FcSpec *s = &p->spec;
    const int dev = p->dev - 1;
    FcDevArr *arrs = NULL;
    PyObject **objs = NULL;              /* per slot: borrowed (inputs) or owned (allocated) */
    int64_t *sizes = NULL;
    void *stream = NULL;
    int rc = -1;

    arrs = PyMem_Calloc(s->nslots + 1, sizeof(FcDevArr));
    objs = PyMem_Calloc(s->nslots + 1, sizeof(PyObject *));
    sizes = PyMem_Calloc(s->nclasses + 1, sizeof(int64_t));
    if (arrs == NULL || objs == NULL || sizes == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (int k = 0; k < s->ninputs; k++) {
        if (fc_dev_memo_view(memo, s->inputs[k], vals[s->inputs[k]]) == NULL) {
            goto cleanup;
        }
    }
    if (bind_sizes(s, vals, memo, sizes) < 0) {
        goto cleanup;
    }
    for (int i = 0; i < s->nslots; i++) {
        const FcSlot *sl = &s->slots[i];
        if (sl->kind == FC_SLOT_INPUT) {
            objs[i] = vals[sl->node];
            arrs[i] = memo->arr[sl->node];
            continue;
        }
        {
            Py_intptr_t shape[FC_MAXDIM];
            for (int d = 0; d < sl->ndim; d++) {
                shape[d] = sl->dims[d] ? sizes[sl->dims[d]] : 1;
            }
            if ((objs[i] = fc_dev_empty(sl->ndim, shape, sl->dtype, dev, &arrs[i])) == NULL) {
                goto cleanup;
            }
        }
    }
    if (!dry && p->nkernels > 0 && fc_dev_stream(dev, &stream) < 0) {
        goto cleanup;
    }
    for (int o = 0; !dry && o < p->nkernels; o++) {
        if (launch_cuda(p, o, arrs, sizes, stream) < 0) {
            goto cleanup;
        }
    }
    for (int q = 0; q < s->noutputs; q++) {
        int v = s->outputs[q];
        int slot = s->sn[v].slot;
        PyObject *a = objs[slot];
        Py_INCREF(a);
        Py_XSETREF(vals[v], a);
        memo->arr[v] = arrs[slot];             /* a later segment reads it: its view is known */
        memo->have[v] = 1;
    }
    rc = 0;
cleanup:
    for (int i = 0; objs != NULL && i < s->nslots; i++) {
        if (s->slots[i].kind == FC_SLOT_ALLOC) {
            Py_XDECREF(objs[i]);
        }
    }
    PyMem_Free(objs);
    PyMem_Free(arrs);
    PyMem_Free(sizes);
    return rc;
}

/* A new array for slot sl of the given shape: C order, or dense in the
 * slot's perm order (a C-order block of the dims in that order, seen
 * through a transposed view). New reference, or NULL + exception. */
static PyArrayObject *
alloc_slot(const FcSlot *sl, const npy_intp *shape)
{
    npy_intp pshape[FC_MAXDIM], inv[FC_MAXDIM];
    PyArray_Dims axes = {inv, sl->ndim};
    PyObject *block, *view;
    const int typenum = fc_plan_typenum(sl->dtype);

    if (sl->perm == 0) {
        return (PyArrayObject *)fc_alloc_empty(sl->ndim, shape, typenum, fc_dtypes[sl->dtype].size);
    }
    for (int i = 0; i < sl->ndim; i++) {
        int d = FC_PERM_DIM(sl->perm, i);
        pshape[i] = shape[d];
        inv[d] = i;
    }
    block = fc_alloc_empty(sl->ndim, pshape, typenum, fc_dtypes[sl->dtype].size);   /* new */
    if (block == NULL) {
        return NULL;
    }
    view = PyArray_Transpose((PyArrayObject *)block, &axes);   /* new; holds block as its base */
    Py_DECREF(block);
    return (PyArrayObject *)view;
}

int
fc_plan_run(FcPlan *p, PyObject **vals, int autotune, int dry, FcDevMemo *memo)
{
    const FcSpec *s = &p->spec;
    PyArrayObject *stack_arrs[FC_STACK_SLOTS], **arrs = stack_arrs;
    int64_t stack_sizes[FC_STACK_CLASSES], *sizes = stack_sizes;
    int rc = -1, nalloc = 0;

    if (!dry && !p->loaded) {
        PyErr_SetString(PyExc_SystemError, "fastcompile: a plan ran before its kernels were loaded");
        return -1;
    }
    if (p->dev > 0) {
        if (memo == NULL) {
            PyErr_SetString(PyExc_SystemError, "fastcompile: a CUDA plan ran without the call's views");
            return -1;
        }
        return run_cuda(p, vals, dry, memo);
    }
    if (s->nslots > FC_STACK_SLOTS) {
        arrs = PyMem_Malloc(s->nslots * sizeof(PyArrayObject *));
    }
    if (s->nclasses > FC_STACK_CLASSES) {
        sizes = PyMem_Malloc(s->nclasses * sizeof(int64_t));
    }
    if (arrs == NULL || sizes == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    if (bind_sizes(s, vals, NULL, sizes) < 0) {
        goto cleanup;
    }
    for (int i = 0; i < s->nslots; i++) {
        const FcSlot *sl = &s->slots[i];
        if (sl->kind == FC_SLOT_INPUT) {
            arrs[i] = (PyArrayObject *)vals[sl->node];
            continue;
        }
        {
            npy_intp shape[FC_MAXDIM];
            for (int d = 0; d < sl->ndim; d++) {
                shape[d] = sl->dims[d] ? sizes[sl->dims[d]] : 1;
            }
            if (sl->dtype == FC_BF16) {
                PyErr_SetString(PyExc_TypeError, "fastcompile: bfloat16 results need torch tensors");
                goto cleanup;
            }
            arrs[i] = alloc_slot(sl, shape);
            if (arrs[i] == NULL) {
                goto cleanup;
            }
            nalloc = i + 1;
        }
    }
    for (int o = 0; !dry && o < p->nkernels; o++) {
        if (launch(p, o, arrs, sizes, autotune) < 0) {
            goto cleanup;
        }
    }
    for (int q = 0; q < s->noutputs; q++) {
        int v = s->outputs[q];
        PyObject *a = (PyObject *)arrs[s->sn[v].slot];
        Py_INCREF(a);
        Py_XSETREF(vals[v], a);
    }
    rc = 0;
cleanup:
    for (int i = 0; i < nalloc; i++) {
        if (s->slots[i].kind == FC_SLOT_ALLOC) {
            Py_XDECREF(arrs[i]);
        }
    }
    if (arrs != stack_arrs) {
        PyMem_Free(arrs);
    }
    if (sizes != stack_sizes) {
        PyMem_Free(sizes);
    }
    return rc;
}

int
fc_plan_tuning(const FcPlan *p, PyObject *list)
{
    for (int o = 0; o < p->nkernels; o++) {
        if (fc_tune_report(&p->kernels[o].tune, p->kernels[o].name, list) < 0) {
            return -1;
        }
    }
    return 0;
}
