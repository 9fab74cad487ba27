/* Runtime, profiling: rows of (kind, name) with calls, time, elements and
 * bytes, filled by the launch and call paths while fastcompile.profile() is
 * on (see profile.h). GIL held throughout: no locks. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <time.h>

#include "../state.h"
#include "profile.h"


int fc_prof_on = 0;


static _Thread_local const char *scope;     /* borrowed, per thread: see fc_prof_scope */

const char *
fc_prof_scope(const char *name)
{
    const char *prev = scope;
    scope = name;
    return prev;
}

const char *
fc_prof_current(void)
{
    return scope;
}

uint64_t
fc_prof_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* a PyMem copy of s (NULL for NULL); *failed set when the copy fails */
static char *
copy_str(const char *s, int *failed)
{
    char *c;
    if (s == NULL) {
        return NULL;
    }
    c = PyMem_Malloc(strlen(s) + 1);
    if (c == NULL) {
        *failed = 1;
        return NULL;
    }
    strcpy(c, s);
    return c;
}

static void
free_row(FcProfRow *r)
{
    PyMem_Free(r->name);
    PyMem_Free(r->path);
    PyMem_Free(r->origin);
}

/* the row of (kind, name), made if new; -1 when out of memory */
static int
find_row(FcProfKind kind, const char *name, const char *path, const char *origin)
{
    FcProfRow *r;
    int failed = 0;
    for (int i = 0; i < fc_state.prof.n; i++) {
        if (fc_state.prof.rows[i].kind == kind && strcmp(fc_state.prof.rows[i].name, name) == 0) {
            return i;
        }
    }
    if (fc_state.prof.n == fc_state.prof.cap) {
        int cap = fc_state.prof.cap ? 2 * fc_state.prof.cap : 64;
        FcProfRow *rows = PyMem_Realloc(fc_state.prof.rows, cap * sizeof(FcProfRow));
        if (rows == NULL) {
            return -1;
        }
        fc_state.prof.rows = rows;
        fc_state.prof.cap = cap;
    }
    r = &fc_state.prof.rows[fc_state.prof.n];
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->name = copy_str(name, &failed);
    r->path = copy_str(path, &failed);
    r->origin = copy_str(origin, &failed);
    if (failed) {
        free_row(r);
        return -1;
    }
    return fc_state.prof.n++;
}

int
fc_prof_known(const FcProfRef *ref)
{
    return ref->gen == fc_state.prof.gen;
}

void
fc_prof_add(FcProfRef *ref, FcProfKind kind, const char *name, const char *path, const char *origin,
            uint64_t ns, int64_t elems, int64_t bytes)
{
    FcProfRow *r;
    if (ref->gen != fc_state.prof.gen) {
        int row = find_row(kind, name != NULL ? name : "?", path, origin);
        if (row < 0) {
            fc_state.prof.dropped++;
            return;
        }
        ref->gen = fc_state.prof.gen;
        ref->row = row;
    }
    r = &fc_state.prof.rows[ref->row];
    r->calls++;
    r->ns += ns;
    r->elems += elems;
    r->bytes += bytes;
}

static void
reset(void)
{
    for (int i = 0; i < fc_state.prof.n; i++) {
        free_row(&fc_state.prof.rows[i]);
    }
    PyMem_Free(fc_state.prof.rows);
    fc_state.prof.rows = NULL;
    fc_state.prof.n = fc_state.prof.cap = 0;
    fc_state.prof.dropped = 0;
    fc_state.prof.gen++;
    if (fc_state.prof.gen == 0) {        /* wrapped: 0 is a fresh FcProfRef's */
        fc_state.prof.gen = 1;
    }
}

PyObject *
fc_prof_py_set(PyObject *self, PyObject *args)
{
    int on, clear;
    (void)self;
    if (!PyArg_ParseTuple(args, "pp:_profile", &on, &clear)) {
        return NULL;
    }
    if (clear) {
        reset();
    }
    fc_prof_on = on;
    Py_RETURN_NONE;
}

static const char *const kind_names[] = {"kernel", "cuda", "extern", "call", "compile"};

PyObject *
fc_prof_py_read(PyObject *self, PyObject *noargs)
{
    PyObject *rows = PyList_New(fc_state.prof.n);    /* owned until returned */
    (void)self;
    (void)noargs;
    if (rows == NULL) {
        return NULL;
    }
    for (int i = 0; i < fc_state.prof.n; i++) {
        const FcProfRow *r = &fc_state.prof.rows[i];
        PyObject *t = Py_BuildValue("(ssKKLLzz)", kind_names[r->kind], r->name,
                                    (unsigned long long)r->calls, (unsigned long long)r->ns,
                                    (long long)r->elems, (long long)r->bytes, r->path, r->origin);
        if (t == NULL) {
            Py_DECREF(rows);
            return NULL;
        }
        PyList_SET_ITEM(rows, i, t);
    }
    return Py_BuildValue("(NK)", rows, (unsigned long long)fc_state.prof.dropped);
}
