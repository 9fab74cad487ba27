/* Module init: fastcompile._C. In: nothing. Out: the module object wired to
 * every stage (api types, runtime configuration, counters). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define FC_NUMPY_MAIN   /* this file imports the NumPy C API; the others share it */
#include "fc_numpy.h"

#include "api/api.h"
#include "hook/hook.h"
#include "runtime/alloc.h"
#include "runtime/cpu.h"
#include "runtime/cuda.h"
#include "runtime/devarray.h"
#include "runtime/plan.h"
#include "runtime/profile.h"
#include "runtime/relayout.h"
#include "state.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

FcModState fc_state = {
    .plan = {{1, 32768, 0, 0, 0, NULL}, "0", ""},
    .prof = {NULL, 0, 0, 1, 0},
};

/* The module object whose GC slots report fc_state: the first one made. A
 * second fastcompile._C (an import after its sys.modules entry was
 * dropped) shares the state but must not report its references twice. */
static PyObject *state_owner;   /* borrowed: cleared by mod_free */

static PyObject *
mod_configure(PyObject *self, PyObject *cfg)
{
    if (!PyDict_Check(cfg)) {
        PyErr_SetString(PyExc_TypeError, "_configure expects a dict");
        return NULL;
    }
    if (fc_cpu_configure(cfg) < 0 || fc_plan_configure(cfg) < 0 || fc_cuda_configure(cfg) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
mod_stats(PyObject *self, PyObject *unused)
{
    PyObject *r = fc_cpu_stats(), *a = NULL, *v = NULL;
    if (r != NULL && ((a = fc_alloc_stats()) == NULL || PyDict_Update(r, a) < 0 ||
                      (v = fc_api_stats()) == NULL || PyDict_Update(r, v) < 0)) {
        Py_CLEAR(r);
    }
    Py_XDECREF(a);
    Py_XDECREF(v);
    return r;
}

static PyObject *
mod_cache_clear(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"disk", NULL};
    int disk = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p", kwlist, &disk)) {
        return NULL;
    }
    if (fc_cpu_cache_clear(disk) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The floating-point control register, for tests that a kernel load leaves
 * FTZ/DAZ and the rounding mode alone. -1 where there is no MXCSR. */
static PyObject *
mod_mxcsr(PyObject *self, PyObject *unused)
{
#if defined(__x86_64__) || defined(__i386__)
    return PyLong_FromUnsignedLong(_mm_getcsr());
#else
    return PyLong_FromLong(-1);
#endif
}

static PyMethodDef mod_methods[] = {
    {"_configure", mod_configure, METH_O, "push fastcompile.config values to the core"},
    {"stats", mod_stats, METH_NOARGS, "counters: compiles, disk_hits, memory_hits"},
    {"cache_clear", (PyCFunction)(void (*)(void))mod_cache_clear, METH_VARARGS | METH_KEYWORDS,
     "forget loaded kernels; with disk=True (default) also empty the disk cache"},
    {"_profile", fc_prof_py_set, METH_VARARGS, "_profile(on, reset): record kernel, extern and call times"},
    {"_profile_read", fc_prof_py_read, METH_NOARGS,
     "_profile_read() -> (rows, dropped): rows (kind, name, calls, ns, elems, bytes, path, origin)"},
    {"_relayout", fc_relayout_py_copy, METH_VARARGS,
     "_relayout(src_ptr, shape, typenum, to_cl) -> array: NCHW <-> channels_last copies (torch backend)"},
    {"_mxcsr", mod_mxcsr, METH_NOARGS, "the MXCSR register (tests)"},
    {"_cpu_load", fc_cpu_py_load, METH_VARARGS, "compile or load C source (tests)"},
    {"_cpu_load_many", fc_cpu_py_load_many, METH_O, "compile or load several C sources in one batch (tests)"},
    {"cuda_info", fc_cuda_py_info, METH_NOARGS,
     "CUDA status: NVRTC and driver found (paths, versions), device count or why there is none"},
    {"_cuda_compile", (PyCFunction)(void (*)(void))fc_cuda_py_compile, METH_VARARGS | METH_KEYWORDS,
     "_cuda_compile(source, arch=None, define=None) -> {image, kind, arch, key, cached}: NVRTC through the disk cache (tests)"},
    {NULL, NULL, 0, NULL},
};

static int
mod_exec(PyObject *m)
{
    if (PyArray_ImportNumPyAPI() < 0) {
        return -1;
    }
    if (fc_alloc_init() < 0 || fc_api_init(m) < 0 || fc_hook_init(m) < 0) {
        return -1;
    }
    if (state_owner == NULL) {
        state_owner = m;
    }
    return 0;
}

/* fc_state's Python objects (the torch objects devarray.c keeps) are the
 * module's references, so the GC sees them. m: borrowed. */
static int
mod_traverse(PyObject *m, visitproc visit, void *arg)
{
    return m == state_owner ? fc_dev_traverse(visit, arg) : 0;
}

static int
mod_clear(PyObject *m)
{
    if (m == state_owner) {
        fc_dev_free();          /* loaded again on the next torch tensor */
    }
    return 0;
}

static void
mod_free(void *m)
{
    if (state_owner != NULL && m != state_owner) {
        return;
    }
    state_owner = NULL;
    fc_dev_free();
    fc_cuda_free();
    fc_cpu_free();
    fc_alloc_free();
}

static PyModuleDef_Slot mod_slots[] = {
    {Py_mod_exec, mod_exec},
    {0, NULL},
};

static struct PyModuleDef mod_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastcompile._C",
    .m_doc = "fastcompile's C core: graph API, fusion, codegen, kernel runtime",
    .m_size = 0,
    .m_methods = mod_methods,
    .m_slots = mod_slots,
    .m_traverse = mod_traverse,
    .m_clear = mod_clear,
    .m_free = mod_free,
};

PyMODINIT_FUNC PyInit__C(void);

PyMODINIT_FUNC
PyInit__C(void)
{
    return PyModuleDef_Init(&mod_def);
}
