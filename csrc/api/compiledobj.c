/* Graph API: fastcompile.graph.Compiled, a compiled graph.
 * In: a Graph's FcGraph, then arrays at each call. Out: output arrays; plans
 * per segment and per input key, built on first use and run from C. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

#include "../core/graph.h"
#include "../core/schedule.h"
#include "../core/shape.h"
#include "../common/strbuf.h"
#include "../fc_numpy.h"
#include "../runtime/cuda.h"
#include "../runtime/devarray.h"
#include "../runtime/plan.h"
#include "../runtime/profile.h"
#include "api.h"
#include "objects.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    FcGraph g;                /* a private copy */
    PyObject *externs;        /* owned list */
    PyObject *views;          /* owned list beside externs: None or bytes (FcViewSpec) */
    PyObject *origin;         /* owned str */
    PyObject *label;          /* owned str or NULL: names the graph in profile() (else origin) */
    FcProfRef *prof;          /* owned: profile() rows, per node (externs), then the call's, the compiles' */
    PyObject *kernels;        /* owned list of kernel records */
    FcSchedule sched;         /* levels, segments, the call's externs and releases (core/schedule.h) */
    int nplans;
    double compile_ms;
    int autotune;             /* -1: as fastcompile.config.autotune; 0/1: this graph's own choice */
} CompiledObject;

static PyTypeObject Compiled_Type;

/* view externs made in C / by their function (GIL held when either moves) */
static unsigned long long views_made, views_by_function;

PyObject *
fc_api_stats(void)
{
    return Py_BuildValue("{s:K,s:K}", "views_made", views_made, "views_by_function", views_by_function);
}

/* ========================================================================
 * Compiled
 * ====================================================================== */

static PyObject *Compiled_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw);

PyObject *
fc_api_compiled_new(GraphObject *graph)
{
    CompiledObject *c;
    if (graph->externs == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: this Graph was cleared by the garbage collector");
        return NULL;
    }
    if (graph->g.noutputs == 0) {
        PyErr_SetString(PyExc_ValueError, "fastcompile: the graph has no outputs; call Graph.output(...) first");
        return NULL;
    }
    if (fc_graph_verify(&graph->g) < 0) {
        return NULL;
    }
    c = PyObject_GC_New(CompiledObject, &Compiled_Type);
    if (c == NULL) {
        return NULL;
    }
    c->vectorcall = Compiled_vectorcall;
    memset(&c->g, 0, sizeof(c->g));
    c->externs = NULL;
    c->views = NULL;
    c->origin = NULL;
    c->label = NULL;
    c->prof = NULL;
    c->kernels = NULL;
    c->sched.level = NULL;
    c->sched.any_arg = NULL;
    c->sched.ext_start = c->sched.ext_nodes = c->sched.free_start = c->sched.free_nodes = NULL;
    c->sched.segs = NULL;
    c->sched.nlevels = 0;
    c->nplans = 0;
    c->compile_ms = 0;
    c->autotune = -1;
    PyObject_GC_Track(c);
    /* on the copy (fc_schedule_build merges equal work): the Graph may grow further */
    if (fc_graph_copy(&c->g, &graph->g) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    c->externs = PyList_GetSlice(graph->externs, 0, PyList_GET_SIZE(graph->externs));
    c->views = PyList_GetSlice(graph->views, 0, PyList_GET_SIZE(graph->views));
    c->origin = fc_api_caller_origin();
    c->kernels = PyList_New(0);
    if (c->externs == NULL || c->views == NULL || c->origin == NULL || c->kernels == NULL
        || fc_schedule_build(&c->g, &c->sched) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    /* after fc_schedule_build: the node count is final */
    c->prof = PyMem_Calloc(c->g.nnodes + 2, sizeof(FcProfRef));
    if (c->prof == NULL) {
        Py_DECREF(c);
        return PyErr_NoMemory();
    }
    return (PyObject *)c;
}

static int
Compiled_traverse(CompiledObject *c, visitproc visit, void *arg)
{
    Py_VISIT(c->externs);
    Py_VISIT(c->views);
    Py_VISIT(c->kernels);
    return 0;
}

static int
Compiled_clear(CompiledObject *c)
{
    Py_CLEAR(c->externs);
    Py_CLEAR(c->views);
    Py_CLEAR(c->kernels);
    return 0;
}

static void
Compiled_dealloc(CompiledObject *c)
{
    PyObject_GC_UnTrack(c);
    Compiled_clear(c);
    Py_XDECREF(c->origin);
    Py_XDECREF(c->label);
    PyMem_Free(c->prof);
    for (int L = 0; L < c->sched.nlevels && c->sched.segs; L++) {
        FcSegment *seg = &c->sched.segs[L].seg;
        FcPlan *p = seg->plans;
        while (p != NULL) {
            FcPlan *next = p->next;
            fc_plan_free(p);
            p = next;
        }
        PyMem_Free(seg->in_seg);
        PyMem_Free(seg->inputs);
        PyMem_Free(seg->outputs);
    }
    PyMem_Free(c->sched.segs);
    PyMem_Free(c->sched.level);
    PyMem_Free(c->sched.any_arg);
    PyMem_Free(c->sched.ext_start);
    PyMem_Free(c->sched.ext_nodes);
    PyMem_Free(c->sched.free_start);
    PyMem_Free(c->sched.free_nodes);
    fc_graph_free(&c->g);
    PyObject_GC_Del(c);
}

/* a record for Compiled.kernels; returns a new reference */
static PyObject *
kernel_record(const FcPlanKernel *pk, const FcPlan *p)
{
    PyObject *types = PyImport_ImportModule("types"), *ns = NULL, *kw = NULL, *empty = NULL;
    if (types == NULL) {
        return NULL;
    }
    kw = Py_BuildValue("{s:s,s:s,s:s,s:s,s:s,s:s}", "name", pk->name, "source", pk->source,
                       "path", pk->loaded.c_path, "so_path", pk->loaded.so_path,
                       "key", pk->loaded.key, "fused", p->dump);
    ns = PyObject_GetAttrString(types, "SimpleNamespace");
    empty = PyTuple_New(0);
    if (kw != NULL && ns != NULL && empty != NULL) {
        PyObject *r = PyObject_Call(ns, empty, kw);
        Py_DECREF(kw);
        Py_DECREF(ns);
        Py_DECREF(empty);
        Py_DECREF(types);
        return r;
    }
    Py_XDECREF(kw);
    Py_XDECREF(ns);
    Py_XDECREF(empty);
    Py_DECREF(types);
    return NULL;
}

/* seg's plan for metas on dev (0: CPU, d + 1: CUDA device d), moved to the
 * front of its list (most recently used first), or NULL. Returns: borrowed (seg owns its plans). */
static FcPlan *
cached_plan(FcSegment *seg, const FcMeta *metas, int dev)
{
    FcPlan *p, *prev = NULL;
    for (p = seg->plans; p != NULL; prev = p, p = p->next) {
        if (p->dev == dev && memcmp(p->metas, metas, seg->ninputs * sizeof(FcMeta)) == 0) {
            if (prev != NULL) {
                prev->next = p->next;
                p->next = seg->plans;
                seg->plans = p;
            }
            return p;
        }
    }
    return NULL;
}

/* p has just been loaded: count it and list its kernels in c->kernels.
 * 0, or -1 with an exception set (p stays cached and loaded). */
static int
plan_loaded(CompiledObject *c, const FcPlan *p)
{
    c->compile_ms += p->compile_ms;
    for (int k = 0; k < p->nkernels; k++) {
        PyObject *rec = kernel_record(&p->kernels[k], p);
        if (rec == NULL || PyList_Append(c->kernels, rec) < 0) {
            Py_XDECREF(rec);
            return -1;
        }
        Py_DECREF(rec);
    }
    return 0;
}

/* seg's plan for the arrays in vals, built if missing; defer: a new plan's
 * kernels are rendered, not loaded (Compiled._prebuild), else a plan found
 * unloaded is loaded now. Returns: borrowed (seg owns its plans), or NULL +
 * exception. */
static FcPlan *
find_plan(CompiledObject *c, FcSegment *seg, PyObject **vals, int defer, int dev, FcDevMemo *memo)
{
    FcMeta stack[16], *metas = stack;
    FcPlan *p;
    if (seg->ninputs > 16) {
        metas = PyMem_Malloc(seg->ninputs * sizeof(FcMeta));
        if (metas == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    memset(metas, 0, (seg->ninputs ? seg->ninputs : 1) * sizeof(FcMeta));
    for (int k = 0; k < seg->ninputs; k++) {
        PyObject *a = vals[seg->inputs[k]];
        if (dev > 0) {
            const FcDevArr *da = fc_dev_memo_view(memo, seg->inputs[k], a);
            if (da == NULL) {
                p = NULL;
                goto done;
            }
            if (da->dev + 1 != dev) {          /* an extern's result on another GPU */
                PyErr_Format(PyExc_ValueError, "fastcompile: a value on cuda:%d reached a graph running on "
                             "cuda:%d: a compiled graph runs on one device", da->dev, dev - 1);
                p = NULL;
                goto done;
            }
            fc_dev_meta(da, &metas[k]);
        }
        else if (fc_plan_meta(a, &metas[k]) < 0) {
            p = NULL;
            goto done;
        }
    }
    if ((p = cached_plan(seg, metas, dev)) == NULL) {
        if ((p = fc_plan_build(&c->g, seg, metas, PyUnicode_AsUTF8(c->origin), dev)) == NULL) {
            goto done;
        }
        /* the build may let other threads in (its debug log runs Python):
         * one of them may have added the same plan meanwhile */
        FcPlan *q = cached_plan(seg, metas, dev);
        if (q != NULL) {
            fc_plan_free(p);
            p = q;
        }
        else {
            p->next = seg->plans;
            seg->plans = p;
            seg->nplans++;
            c->nplans++;
        }
    }
    if (!p->loaded && !defer) {
        /* the compiler runs without the GIL: another thread may load p
         * meanwhile, and only the one that does records it (newly) */
        FcPlan *one[1] = {p};
        char newly = 0;
        if (fc_plan_load(one, 1, &newly) < 0 || (newly && plan_loaded(c, p) < 0)) {
            p = NULL;               /* the plan stays cached; this call fails */
        }
    }
done:
    if (metas != stack) {
        PyMem_Free(metas);
    }
    return p;
}

static PyObject *
as_array(PyObject *obj)
{
    if (PyArray_Check(obj)) {
        PyArrayObject *a = (PyArrayObject *)obj;
        if (PyArray_ISALIGNED(a)) {
            Py_INCREF(obj);
            return obj;
        }
        return PyArray_NewCopy(a, NPY_CORDER);
    }
    return PyArray_FROM_O(obj);
}

static PyObject *
const_array(const FcNode *n, int dev)
{
    PyObject *v, *r;
    if (n->ckind == FC_CONST_FLOAT) {
        v = PyFloat_FromDouble(n->fval);
    }
    else if (n->ckind == FC_CONST_BOOL) {
        v = PyBool_FromLong((long)n->ival);
    }
    else {
        v = PyLong_FromLongLong(n->ival);
    }
    if (v == NULL) {
        return NULL;
    }
    if (dev > 0) {                 /* a 0-d tensor on the graph's device */
        r = fc_dev_full(v, n->dtype, dev - 1);
        Py_DECREF(v);
        return r;
    }
    r = PyArray_FROM_O(v);
    Py_DECREF(v);
    if (r != NULL && !n->weak) {
        PyObject *cast = PyArray_Cast((PyArrayObject *)r, fc_plan_typenum(n->dtype));
        Py_DECREF(r);
        r = cast;
    }
    return r;
}

/* calls extern node e: externs is the list of callables (the graph's own, or
 * _warm's stand-ins), borrowed; dev > 0 (CUDA): results are kept as the
 * extern returns them (tensors), else made NumPy arrays. Python code may change the list meanwhile (an
 * extern, another thread while a kernel runs): the callable is looked up with
 * a bounds check and held for the call. */
static int
run_extern(CompiledObject *c, PyObject *externs, int e, PyObject **vals, int dev)
{
    const FcNode *n = &c->g.nodes[e];
    PyObject *args = PyTuple_New(n->nin), *res = NULL, *fn = NULL;   /* args, res, fn: owned */
    int rc = -1;
    if (args == NULL) {
        return -1;
    }
    for (int j = 0; j < n->nin; j++) {
        int u = n->in[j];
        PyObject *a = vals[u];
        if (a == NULL && c->g.nodes[u].op == FC_OP_CONST) {
            if ((vals[u] = const_array(&c->g.nodes[u], dev)) == NULL) {
                goto done;
            }
            a = vals[u];
        }
        Py_INCREF(a);
        PyTuple_SET_ITEM(args, j, a);
    }
    if (n->extern_index >= PyList_GET_SIZE(externs)) {
        PyErr_Format(PyExc_RuntimeError, "fastcompile: extern %d is gone: the list of extern callables "
                     "shrank during the call", n->extern_index);
        goto done;
    }
    if (dev == 0 && c->views != NULL && n->extern_index < PyList_GET_SIZE(c->views)
            && PyList_GET_ITEM(c->views, n->extern_index) != Py_None) {
        /* a view: made here where its argument has the layout traced, else by its function */
        PyObject *spec = PyList_GET_ITEM(c->views, n->extern_index);
        PyObject *v = fc_api_view_apply((const FcViewSpec *)PyBytes_AS_STRING(spec), PyTuple_GET_ITEM(args, 0));
        if (v != NULL) {
            Py_XSETREF(vals[e], v);
            views_made++;
            rc = 0;
            goto done;
        }
        if (PyErr_Occurred()) {
            goto done;
        }
        views_by_function++;
    }
    fn = PyList_GET_ITEM(externs, n->extern_index);
    Py_INCREF(fn);
    res = PyObject_Call(fn, args, NULL);
    if (res == NULL) {
        goto done;
    }
    if (n->item < 0) {
        Py_XSETREF(vals[e], dev > 0 ? Py_NewRef(res) : as_array(res));
        rc = vals[e] ? 0 : -1;
        goto done;
    }
    if (!PyTuple_Check(res) && !PyList_Check(res)) {
        PyErr_Format(PyExc_TypeError, "fastcompile: extern %R was declared nout=%d but returned %.100s",
                     fn, n->item, Py_TYPE(res)->tp_name);
        goto done;
    }
    if (PySequence_Size(res) != n->item) {
        PyErr_Format(PyExc_ValueError, "fastcompile: extern %R was declared nout=%d but returned %zd values",
                     fn, n->item, PySequence_Size(res));
        goto done;
    }
    /* the items are the nodes right after the extern */
    for (int i = e + 1; i < c->g.nnodes; i++) {
        const FcNode *it = &c->g.nodes[i];
        if (it->op == FC_OP_ITEM && it->in[0] == e) {
            PyObject *x = PySequence_GetItem(res, it->item);
            if (x == NULL) {
                goto done;
            }
            Py_XSETREF(vals[i], dev > 0 ? Py_NewRef(x) : as_array(x));
            Py_DECREF(x);
            if (vals[i] == NULL) {
                goto done;
            }
        }
    }
    rc = 0;
done:
    Py_XDECREF(res);
    Py_XDECREF(fn);
    Py_DECREF(args);
    return rc;
}

/* The device a call runs on: 0 (CPU) when no argument is a CUDA tensor, else
 * d + 1 for CUDA device d, the device of every CUDA tensor among them, whose
 * views it reads into memo (initialized here for c's nodes). The other
 * arguments of a CUDA call may only be read by externs (a CPU scalar tensor
 * that an attention kernel's backward takes): a kernel that would read one
 * raises (fc_dev_view). CUDA needs the driver and NVRTC: without them the
 * error says why. args: borrowed. 0, or -1 + exception. */
static int
call_device(CompiledObject *c, PyObject *const *args, Py_ssize_t nargs, int *dev, FcDevMemo *memo)
{
    Py_ssize_t first = -1;
    int d = -1;
    *dev = 0;
    for (Py_ssize_t k = 0; k < nargs; k++) {
        int r = PyArray_Check(args[k]) ? 0 : fc_dev_is_cuda(args[k], &d);
        if (r < 0) {
            return -1;
        }
        if (r == 1 && first < 0) {
            first = k;
            *dev = d + 1;
            if (fc_dev_memo_init(memo, c->g.nnodes) < 0) {
                return -1;
            }
        }
        else if (r == 1 && d + 1 != *dev) {
            PyErr_Format(PyExc_ValueError, "fastcompile: argument %zd is on cuda:%d and argument %zd on "
                         "cuda:%d: a compiled graph runs on one device", first, *dev - 1, k, d);
            return -1;
        }
        if (r == 1 && fc_dev_memo_view(memo, c->g.inputs[k], args[k]) == NULL) {
            return -1;
        }
    }
    if (first >= 0) {
        const char *why = fc_cuda_unavailable();
        if (why != NULL) {
            PyErr_Format(PyExc_RuntimeError, "fastcompile: got a tensor on cuda:%d, but CUDA cannot run "
                         "here: %s", *dev - 1, why);
            return -1;
        }
        if (!fc_cuda_nvrtc_found()) {
            PyErr_Format(PyExc_RuntimeError, "fastcompile: got a tensor on cuda:%d, but CUDA kernels need "
                         "NVRTC (see fastcompile.cuda_info())", *dev - 1);
            return -1;
        }
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* A scalar for a 0-d input: a NumPy scalar, or a Python bool, int or float (NumPy's dtype
 * for it: float64 for a float); its dtype is checked as an array's */
static int
is_scalar_arg(PyObject *arg)
{
    return PyArray_IsScalar(arg, Generic) || PyFloat_Check(arg) || PyLong_Check(arg);
}

static int
check_input(CompiledObject *c, int k, PyObject *arg, PyObject **slot, int dev, FcDevMemo *memo)
{
    const FcNode *n = &c->g.nodes[c->g.inputs[k]];
    FcMeta m;
    PyObject *a = NULL;      /* owned until it goes to *slot */
    if (dev == 0 && n->ndim == 0 && !PyArray_Check(arg) && is_scalar_arg(arg)) {
        if ((a = PyArray_FROM_O(arg)) == NULL) {     /* new: a 0-d array */
            goto error;
        }
        if (!PyArray_Check(a) || PyArray_NDIM((PyArrayObject *)a) != 0 || fc_plan_meta(a, &m) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "fastcompile: argument %d (%.100s) has no 0-d array form", k,
                             Py_TYPE(arg)->tp_name);
            }
            goto error;
        }
    }
    else if (dev > 0) {
        if (!memo->have[c->g.inputs[k]]) {    /* no CUDA tensor: for externs only (call_device) */
            *slot = Py_NewRef(arg);
            return 0;
        }
        fc_dev_meta(&memo->arr[c->g.inputs[k]], &m);
        a = Py_NewRef(arg);
    }
    else if (!PyArray_Check(arg) && c->sched.any_arg[k]) {   /* only externs read it: passed as it is */
        *slot = Py_NewRef(arg);
        return 0;
    }
    else if (!PyArray_Check(arg)) {
        int d = 0;
        if (fc_dev_foreign_cuda(arg, &d)) {
            PyErr_Format(PyExc_RuntimeError, "fastcompile: argument %d is a %.100s on CUDA device %d: "
                         "compiled graphs run on CUDA for torch tensors only (torch.from_dlpack makes one "
                         "without a copy)", k, Py_TYPE(arg)->tp_name, d);
            goto error;
        }
        PyErr_Format(PyExc_TypeError, "fastcompile: argument %d must be a numpy.ndarray or a CUDA "
                     "torch.Tensor, got %.100s", k, Py_TYPE(arg)->tp_name);
        goto error;
    }
    else {
        if ((a = as_array(arg)) == NULL || fc_plan_meta(a, &m) < 0) {
            goto error;
        }
    }
    if (m.dtype != n->dtype) {
        PyErr_Format(PyExc_TypeError, "fastcompile: argument %d was declared %s but is %s of %s",
                     k, fc_dtypes[n->dtype].name, PyArray_Check(arg) ? "an array" : "a scalar",
                     fc_dtypes[m.dtype].name);
        goto error;
    }
    if (m.ndim != n->ndim) {
        PyErr_Format(PyExc_ValueError, "fastcompile: argument %d was declared with ndim=%d but has ndim=%d",
                     k, n->ndim, m.ndim);
        goto error;
    }
    *slot = a;
    return 0;
error:
    Py_XDECREF(a);
    return -1;
}

/* s as UTF-8 for a profile() row, or NULL (no exception left set) */
static const char *
prof_text(PyObject *s)
{
    const char *t = PyUnicode_AsUTF8(s);
    if (t == NULL) {
        PyErr_Clear();
    }
    return t;
}

/* a profile() row for extern node e's call of ns nanoseconds, named by its
 * callable's __qualname__ (or __name__, or its type's name) */
static void
prof_extern(CompiledObject *c, PyObject *externs, int e, uint64_t ns)
{
    FcProfRef *ref = &c->prof[e];
    PyObject *fn, *name = NULL;   /* fn, name: owned (a name lookup may run Python code) */
    const char *text = NULL;
    int idx = c->g.nodes[e].extern_index;
    if (fc_prof_known(ref)) {
        fc_prof_add(ref, FC_PROF_EXTERN, NULL, NULL, NULL, ns, 0, 0);
        return;
    }
    fn = Py_NewRef(idx < PyList_GET_SIZE(externs) ? PyList_GET_ITEM(externs, idx) : Py_None);
    if ((name = PyObject_GetAttrString(fn, "__qualname__")) == NULL) {
        PyErr_Clear();
        name = PyObject_GetAttrString(fn, "__name__");
    }
    if (name != NULL && PyUnicode_Check(name)) {
        text = PyUnicode_AsUTF8(name);
    }
    PyErr_Clear();     /* a name that cannot be read is not the call's error */
    fc_prof_add(ref, FC_PROF_EXTERN, text != NULL ? text : Py_TYPE(fn)->tp_name, NULL, prof_text(c->origin),
                ns, 0, 0);
    Py_XDECREF(name);
    Py_DECREF(fn);
}

/* c's name in profile(): its label, else its origin (borrowed) */
static PyObject *
current_label(const CompiledObject *c)
{
    return c->label != NULL ? c->label : c->origin;
}

#define FC_STACK_VALS 128

/* One run of the graph: externs are the callables extern nodes call
 * (borrowed list); tune: autotune the launches; dry: build missing plans
 * deferred and launch no kernel (Compiled._prebuild: the outputs are
 * allocated, their contents undefined). Returns a new tuple of the outputs,
 * or NULL with an exception set. */
static PyObject *
run_graph(CompiledObject *c, PyObject *const *args, Py_ssize_t nargs, PyObject *externs, int tune, int dry)
{
    PyObject *stack[FC_STACK_VALS], **vals = NULL, *result = NULL;   /* vals: nn slots, owned */
    int nn = c->g.nnodes, dev = 0;
    FcDevMemo memo = {NULL, NULL, 0};          /* CUDA: the call's views, read once each */

    if (nargs != c->g.ninputs) {
        PyErr_Format(PyExc_TypeError, "fastcompile: the compiled graph takes %d array%s, got %zd",
                     c->g.ninputs, c->g.ninputs == 1 ? "" : "s", nargs);
        goto done;
    }
    if (call_device(c, args, nargs, &dev, &memo) < 0) {
        goto done;
    }
    vals = nn > FC_STACK_VALS ? PyMem_Malloc(nn * sizeof(PyObject *)) : stack;
    if (vals == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memset(vals, 0, nn * sizeof(PyObject *));
    for (int k = 0; k < c->g.ninputs; k++) {
        if (check_input(c, k, args[k], &vals[c->g.inputs[k]], dev, &memo) < 0) {
            goto done;
        }
    }
    for (int L = 0; L < c->sched.nlevels; L++) {
        FcSegment *seg = &c->sched.segs[L].seg;
        FcPlan *p;
        for (int e = c->sched.ext_start[L]; e < c->sched.ext_start[L + 1]; e++) {
            /* stand-ins (_warm, _prebuild, _call_with's replays) are not the externs' time */
            const uint64_t t0 = fc_prof_on && externs == c->externs && !dry ? fc_prof_now() : 0;
            if (run_extern(c, externs, c->sched.ext_nodes[e], vals, dev) < 0) {
                goto done;
            }
            if (t0 != 0 && fc_prof_on) {
                prof_extern(c, externs, c->sched.ext_nodes[e], fc_prof_now() - t0);
            }
        }
        if (seg->noutputs > 0 && ((p = find_plan(c, seg, vals, dry, dev, &memo)) == NULL
                                  || fc_plan_run(p, vals, tune, dry, &memo) < 0)) {
            goto done;
        }
        for (int f = c->sched.free_start[L]; f < c->sched.free_start[L + 1]; f++) {
            Py_CLEAR(vals[c->sched.free_nodes[f]]);      /* its last reader has run */
        }
    }
    result = PyTuple_New(c->g.noutputs);
    if (result == NULL) {
        goto done;
    }
    for (int k = 0; k < c->g.noutputs; k++) {
        int v = c->g.outputs[k];
        PyObject *o = vals[v];
        if (o == NULL && c->g.nodes[v].op == FC_OP_CONST) {
            o = const_array(&c->g.nodes[v], dev);
        }
        else {
            Py_XINCREF(o);
        }
        if (o == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_SystemError, "fastcompile: output %d was never computed", k);
            }
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, k, o);
    }
done:
    for (int i = 0; vals != NULL && i < nn; i++) {
        Py_XDECREF(vals[i]);
    }
    if (vals != stack) {
        PyMem_Free(vals);
    }
    fc_dev_memo_free(&memo);
    return result;
}

/* run_graph for a call (not dry), with profile() rows for it while
 * profiling: its time less the compiles it waited for, and those */
static PyObject *
profiled_run(CompiledObject *c, PyObject *const *args, Py_ssize_t nargs, PyObject *externs, int tune)
{
    const double ms0 = c->compile_ms;
    const uint64_t t0 = fc_prof_on ? fc_prof_now() : 0;
    PyObject *label, *r;       /* label: owned for the call (a thread may set another meanwhile) */
    const char *name, *outer;
    if (t0 == 0) {
        return run_graph(c, args, nargs, externs, tune, 0);
    }
    label = Py_NewRef(current_label(c));
    if ((name = prof_text(label)) == NULL) {
        name = "?";
    }
    outer = fc_prof_scope(name);        /* the kernels' rows name this graph */
    r = run_graph(c, args, nargs, externs, tune, 0);
    fc_prof_scope(outer);
    if (fc_prof_on && r != NULL) {
        const uint64_t ns = fc_prof_now() - t0;
        const double cms = c->compile_ms - ms0;
        const uint64_t cns = cms > 0 ? (uint64_t)(cms * 1e6) : 0;
        /* the label changed meanwhile (another thread, an extern): this call's row is
         * looked up afresh, not cached where the new label's rows will be */
        FcProfRef fresh[2] = {{0, 0}, {0, 0}};
        FcProfRef *refs = label == current_label(c) ? &c->prof[c->g.nnodes] : fresh;
        fc_prof_add(&refs[0], FC_PROF_CALL, name, NULL, prof_text(c->origin), ns > cns ? ns - cns : 0, 0, 0);
        if (cns > 0) {
            fc_prof_add(&refs[1], FC_PROF_COMPILE, name, NULL, prof_text(c->origin), cns, 0, 0);
        }
    }
    Py_DECREF(label);
    return r;
}

/* whether a call autotunes: the graph's own setting, else the process's */
static int
call_autotune(const CompiledObject *c)
{
    return c->autotune >= 0 ? c->autotune : fc_plan_config()->autotune;
}

static PyObject *
Compiled_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw)
{
    CompiledObject *c = (CompiledObject *)self;
    if (kw != NULL && PyTuple_GET_SIZE(kw) != 0) {
        PyErr_SetString(PyExc_TypeError, "fastcompile: a compiled graph takes positional arrays only");
        return NULL;
    }
    return profiled_run(c, args, PyVectorcall_NARGS(nargsf), c->externs, call_autotune(c));
}

/* _warm, _prebuild and _call_with: one run of the graph with the callables
 * in `externs` standing in for its extern calls (same order and count).
 * keep = 0 (_warm, _prebuild): without autotuning, the outputs dropped;
 * returns None. keep = 1 (_call_with): a call in every other respect;
 * returns its outputs. args: borrowed; returns a new reference, or NULL +
 * exception. */
static PyObject *
run_with_stand_ins(CompiledObject *c, PyObject *args, int dry, int keep, const char *format)
{
    PyObject *arrays, *externs, *r;
    if (!PyArg_ParseTuple(args, format, &PyTuple_Type, &arrays, &PyList_Type, &externs)) {
        return NULL;
    }
    if (PyList_GET_SIZE(externs) != PyList_GET_SIZE(c->externs)) {
        PyErr_Format(PyExc_ValueError, "fastcompile: %s takes %zd extern stand-ins, got %zd",
                     keep ? "_call_with" : dry ? "_prebuild" : "_warm", PyList_GET_SIZE(c->externs),
                     PyList_GET_SIZE(externs));
        return NULL;
    }
    r = keep ? profiled_run(c, PySequence_Fast_ITEMS(arrays), PyTuple_GET_SIZE(arrays), externs, call_autotune(c))
             : run_graph(c, PySequence_Fast_ITEMS(arrays), PyTuple_GET_SIZE(arrays), externs, 0, dry);
    if (r == NULL || keep) {
        return r;
    }
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* Compiled._warm(arrays, externs): it builds (compiles) every plan a call
 * with these values would need, running the kernels, so that a later real
 * call finds them: the torch backend's async compile runs it in a background
 * thread with the results an eager run recorded, so no extern (matmul, a
 * random op) runs twice. */
static PyObject *
Compiled_warm(CompiledObject *c, PyObject *args)
{
    return run_with_stand_ins(c, args, 0, 0, "O!O!:_warm");
}

/* Compiled._prebuild(arrays, externs): a dry run that renders every plan a
 * call with arrays of these layouts would need, and compiles none. It runs
 * no kernel: each segment's results are allocated and left undefined, so
 * the stand-ins must not read their arguments' values (they may return
 * empty arrays of the layouts the real externs will give). Then
 * Compiled._load_pending compiles the plans of many graphs in one batch, on
 * every core; a plan still unloaded at a real call is loaded by that call. */
static PyObject *
Compiled_prebuild(CompiledObject *c, PyObject *args)
{
    return run_with_stand_ins(c, args, 1, 0, "O!O!:_prebuild");
}

/* Compiled._call_with(arrays, externs) -> outputs: a call whose extern calls
 * are answered by the stand-in callables: our tracer's first call, whose
 * trace already ran every extern on these inputs (once: an extern with side
 * effects, BatchNorm's running statistics, must not run again). */
static PyObject *
Compiled_call_with(CompiledObject *c, PyObject *args)
{
    return run_with_stand_ins(c, args, 0, 1, "O!O!:_call_with");
}

/* Compiled._load_pending(graphs) -> int: loads (compiling where needed) the
 * plans _prebuild left unloaded in every Compiled of the sequence, in one
 * batch; returns how many plans it loaded. graphs: borrowed. */
static PyObject *
Compiled_load_pending(PyObject *unused, PyObject *graphs)
{
    /* a tuple of our own: the caller's list may change, and drop a graph,
     * while the compiler runs without the GIL; this keeps every owner alive */
    PyObject *seq = PySequence_Check(graphs) ? PySequence_Tuple(graphs) : NULL;
    FcPlan **plans = NULL;
    CompiledObject **owner = NULL;     /* borrowed from seq */
    char *newly = NULL;
    PyObject *r = NULL;
    int n = 0, cap = 0, count = 0;
    if (seq == NULL) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "fastcompile: _load_pending takes a sequence of Compiled");
        }
        return NULL;
    }
    Py_ssize_t ng = PyTuple_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < ng; i++) {
        PyObject *o = PyTuple_GET_ITEM(seq, i);
        if (!PyObject_TypeCheck(o, &Compiled_Type)) {
            PyErr_Format(PyExc_TypeError, "fastcompile: _load_pending takes Compiled objects, got %.100s",
                         Py_TYPE(o)->tp_name);
            goto cleanup;
        }
        CompiledObject *c = (CompiledObject *)o;
        for (int L = 0; L < c->sched.nlevels; L++) {
            for (FcPlan *p = c->sched.segs[L].seg.plans; p != NULL; p = p->next) {
                cap += !p->loaded;
            }
        }
    }
    plans = PyMem_Calloc(cap + 1, sizeof(FcPlan *));
    owner = PyMem_Calloc(cap + 1, sizeof(CompiledObject *));
    newly = PyMem_Calloc(cap + 1, 1);
    if (plans == NULL || owner == NULL || newly == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (Py_ssize_t i = 0; i < ng; i++) {
        CompiledObject *c = (CompiledObject *)PyTuple_GET_ITEM(seq, i);
        for (int L = 0; L < c->sched.nlevels; L++) {
            for (FcPlan *p = c->sched.segs[L].seg.plans; p != NULL && n < cap; p = p->next) {
                if (!p->loaded) {
                    owner[n] = c;
                    plans[n++] = p;
                }
            }
        }
    }
    /* seq holds every owner, so no plan is freed while the compiler runs.
     * After a compile failure the plans that did load are recorded all the
     * same (else they would never be), and the failure is raised. */
    int failed = fc_plan_load(plans, n, newly) < 0;
    PyObject *et = NULL, *ev = NULL, *etb = NULL;
    if (failed) {
        PyErr_Fetch(&et, &ev, &etb);
    }
    for (int i = 0; i < n; i++) {
        if (newly[i]) {
            count++;
            if (plan_loaded(owner[i], plans[i]) < 0) {
                if (et == NULL) {
                    PyErr_Fetch(&et, &ev, &etb);
                }
                else {
                    PyErr_Clear();
                }
            }
        }
    }
    if (et != NULL) {
        PyErr_Restore(et, ev, etb);
    }
    else {
        r = PyLong_FromLong(count);
    }
cleanup:
    PyMem_Free(plans);
    PyMem_Free(owner);
    PyMem_Free(newly);
    Py_DECREF(seq);
    return r;
}

static PyObject *
Compiled_get_kernels(CompiledObject *c, void *closure)
{
    return PyList_GetSlice(c->kernels, 0, PyList_GET_SIZE(c->kernels));
}

static PyObject *
Compiled_get_graph(CompiledObject *c, void *closure)
{
    return fc_api_dump_graph(&c->g);
}

static PyObject *
Compiled_get_fused(CompiledObject *c, void *closure)
{
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (int L = 0; L < c->sched.nlevels; L++) {
        for (FcPlan *p = c->sched.segs[L].seg.plans; p != NULL; p = p->next) {
            PyObject *s = PyUnicode_FromString(p->dump);
            if (s == NULL || PyList_Append(out, s) < 0) {
                Py_XDECREF(s);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(s);
        }
    }
    return out;
}

static PyObject *
Compiled_get_nplans(CompiledObject *c, void *closure)
{
    return PyLong_FromLong(c->nplans);
}

static PyObject *
Compiled_get_compile_ms(CompiledObject *c, void *closure)
{
    return PyFloat_FromDouble(c->compile_ms);
}

static PyObject *
Compiled_get_origin(CompiledObject *c, void *closure)
{
    Py_INCREF(c->origin);
    return c->origin;
}

static PyObject *
Compiled_get_label(CompiledObject *c, void *closure)
{
    return Py_NewRef(current_label(c));
}

static int
Compiled_set_label(CompiledObject *c, PyObject *v, void *closure)
{
    if (v != NULL && v != Py_None && !PyUnicode_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "fastcompile: Compiled.label must be a str or None");
        return -1;
    }
    /* a new name: the rows found under the old one are not this graph's any more */
    c->prof[c->g.nnodes].gen = c->prof[c->g.nnodes + 1].gen = 0;
    Py_XSETREF(c->label, v != NULL && v != Py_None ? Py_NewRef(v) : NULL);
    return 0;
}

static PyObject *
Compiled_get_autotune(CompiledObject *c, void *closure)
{
    if (c->autotune < 0) {
        Py_RETURN_NONE;
    }
    return PyBool_FromLong(c->autotune);
}

static int
Compiled_set_autotune(CompiledObject *c, PyObject *v, void *closure)
{
    if (v == NULL || v == Py_None) {
        c->autotune = -1;
        return 0;
    }
    if (!PyBool_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "fastcompile: Compiled.autotune is True, False or None");
        return -1;
    }
    c->autotune = v == Py_True;
    return 0;
}

static PyObject *
Compiled_get_tuning(CompiledObject *c, void *closure)
{
    PyObject *out = PyList_New(0);
    for (int L = 0; out != NULL && L < c->sched.nlevels; L++) {
        for (FcPlan *p = c->sched.segs[L].seg.plans; p != NULL; p = p->next) {
            if (fc_plan_tuning(p, out) < 0) {
                Py_CLEAR(out);
                break;
            }
        }
    }
    return out;
}

/* Compiled._cuda_render(*arrays) -> [{name, source, ...}]: the CUDA source
 * of every kernel of the specialization the arrays (NumPy, any device-free
 * stand-ins with the wanted dtype, rank, size-1 dims and contiguity) select.
 * Renders only: no compile, no device. Graphs with extern calls are refused.
 * args: borrowed; returns: new reference. */
static PyObject *
Compiled_cuda_render(CompiledObject *c, PyObject *args)
{
    FcSegment *seg;
    FcMeta *metas = NULL;
    PyObject **arrs = NULL, *r = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (c->sched.nlevels != 1) {
        PyErr_SetString(PyExc_NotImplementedError, "fastcompile: _cuda_render takes graphs without extern calls");
        return NULL;
    }
    if (n != c->g.ninputs) {
        PyErr_Format(PyExc_TypeError, "fastcompile: the graph takes %d inputs, got %zd", c->g.ninputs, n);
        return NULL;
    }
    seg = &c->sched.segs[0].seg;
    metas = PyMem_Calloc(seg->ninputs + 1, sizeof(FcMeta));
    arrs = PyMem_Calloc(c->g.nnodes + 1, sizeof(PyObject *));
    if (metas == NULL || arrs == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int node = c->g.inputs[i];
        PyObject *arg = PyTuple_GET_ITEM(args, i);
        if (PyTuple_Check(arg)) {
            /* (dtype, ndim[, size-1 mask[, contiguous]]): no array needed (bfloat16) */
            Py_INCREF(arg);
            arrs[node] = arg;
        }
        else if ((arrs[node] = as_array(arg)) == NULL) {
            goto cleanup;
        }
    }
    for (int k = 0; k < seg->ninputs; k++) {
        PyObject *a = arrs[seg->inputs[k]];
        if (a != NULL && PyTuple_Check(a)) {
            PyObject *dt;
            unsigned int ones = 0;
            int contig = 1;
            if (!PyArg_ParseTuple(a, "Oi|Ip", &dt, &metas[k].ndim, &ones, &contig) ||
                    (metas[k].dtype = fc_api_parse_dtype(dt)) < 0) {
                goto cleanup;
            }
            metas[k].ones = ones;
            metas[k].contig = contig;
            continue;
        }
        if (a == NULL) {
            PyErr_SetString(PyExc_NotImplementedError, "fastcompile: _cuda_render: a segment input is not a graph input");
            goto cleanup;
        }
        if (fc_plan_meta(a, &metas[k]) < 0) {
            goto cleanup;
        }
    }
    r = fc_plan_render_cuda(&c->g, seg, metas, PyUnicode_AsUTF8(c->origin));
cleanup:
    for (int i = 0; arrs != NULL && i < c->g.nnodes; i++) {
        Py_XDECREF(arrs[i]);
    }
    PyMem_Free(arrs);
    PyMem_Free(metas);
    return r;
}

static PyMethodDef Compiled_methods[] = {
    {"_warm", (PyCFunction)Compiled_warm, METH_VARARGS,
     "_warm(arrays, externs): run once with stand-in extern callables, building every plan; outputs dropped"},
    {"_prebuild", (PyCFunction)Compiled_prebuild, METH_VARARGS,
     "_prebuild(arrays, externs): a dry run (no kernel runs) rendering every plan arrays of these layouts "
     "need, compiling none (see _load_pending)"},
    {"_call_with", (PyCFunction)Compiled_call_with, METH_VARARGS,
     "_call_with(arrays, externs) -> outputs: a call with stand-in extern callables (same order and count)"},
    {"_load_pending", (PyCFunction)Compiled_load_pending, METH_O | METH_STATIC,
     "_load_pending(graphs) -> int: compile the plans _prebuild left in these Compiled objects, in one batch"},
    {"_cuda_render", (PyCFunction)Compiled_cuda_render, METH_VARARGS,
     "_cuda_render(*arrays) -> list of {name, source, ...}: CUDA source per kernel (tests)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Compiled_getset[] = {
    {"kernels", (getter)Compiled_get_kernels, NULL,
     "kernels built so far: name, source, path (.c), so_path, key, fused", NULL},
    {"graph", (getter)Compiled_get_graph, NULL, "the graph as text", NULL},
    {"fused", (getter)Compiled_get_fused, NULL, "each plan's fused kernels as text", NULL},
    {"nplans", (getter)Compiled_get_nplans, NULL, "specializations built (one per input key and segment)", NULL},
    {"compile_ms", (getter)Compiled_get_compile_ms, NULL, "total time spent building plans", NULL},
    {"origin", (getter)Compiled_get_origin, NULL, "file:line where compile() was called", NULL},
    {"label", (getter)Compiled_get_label, (setter)Compiled_set_label,
     "the graph's name in fastcompile.profile() (default: origin); set None to go back", NULL},
    {"autotune", (getter)Compiled_get_autotune, (setter)Compiled_set_autotune,
     "time launch settings per kernel and launch shape and keep the fastest: True, False, "
     "or None (the default) to follow fastcompile.config.autotune", NULL},
    {"tuning", (getter)Compiled_get_tuning, NULL,
     "what autotuning chose: one dict per kernel and launch shape (kernel, outer, inner, threads, "
     "block, us, candidates)", NULL},
    {NULL},
};

static PyTypeObject Compiled_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile.graph.Compiled",
    .tp_basicsize = sizeof(CompiledObject),
    .tp_dealloc = (destructor)Compiled_dealloc,
    .tp_vectorcall_offset = offsetof(CompiledObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A compiled graph: call it with NumPy arrays; returns a tuple of arrays.",
    .tp_traverse = (traverseproc)Compiled_traverse,
    .tp_clear = (inquiry)Compiled_clear,
    .tp_methods = Compiled_methods,
    .tp_getset = Compiled_getset,
};

int
fc_api_compiled_init(PyObject *m)
{
    if (PyType_Ready(&Compiled_Type) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(m, "Compiled", (PyObject *)&Compiled_Type);
}
