/* TEMPORARY stub until cpu.c lands: compile every time into /tmp. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "cpu.h"
static char incdir[1024] = ".";
static long ncomp;
int fc_cpu_configure(PyObject *cfg) {
    PyObject *v = PyDict_GetItemString(cfg, "include_dir");
    if (v && PyUnicode_Check(v)) snprintf(incdir, sizeof(incdir), "%s", PyUnicode_AsUTF8(v));
    return 0;
}
int fc_cpu_load(const char *source, const char *symbol, FcLoaded *out) {
    char c[256], so[256], cmd[2048];
    snprintf(c, sizeof c, "/tmp/fcstub_%s.c", symbol);
    snprintf(so, sizeof so, "/tmp/fcstub_%s_%ld.so", symbol, ncomp);
    FILE *f = fopen(c, "w"); fputs(source, f); fclose(f);
    snprintf(cmd, sizeof cmd, "cc -O3 -march=native -std=c11 -fPIC -shared -fopenmp -fno-math-errno -fno-trapping-math -ffp-contract=off -fwrapv -I%s %s -o %s -lmvec -lm", incdir, c, so);
    ncomp++;
    if (system(cmd) != 0) { PyErr_Format(PyExc_RuntimeError, "compile failed: %s\n%s", cmd, source); return -1; }
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!h) { PyErr_Format(PyExc_RuntimeError, "dlopen: %s", dlerror()); return -1; }
    out->fn = (fc_kernel_fn)dlsym(h, symbol);
    out->so_path = strdup(so); out->c_path = strdup(c); out->key = strdup(symbol);
    return 0;
}
PyObject *fc_cpu_stats(void) { return Py_BuildValue("{s:l,s:i,s:i}", "compiles", ncomp, "disk_hits", 0, "memory_hits", 0); }
int fc_cpu_cache_clear(int disk) { return 0; }
void fc_cpu_free(void) {}
