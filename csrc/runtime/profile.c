/* Runtime, profiling: rows of (kind, name) with calls, time, elements and
 * bytes, filled by the launch and call paths while fastcompile.profile() is
 * on (see profile.h). GIL held throughout: no locks. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <time.h>

#include "profile.h"

typedef struct {
    FcProfKind kind;
    char *name, *path, *origin;  /* owned (PyMem); path, origin may be NULL */
    uint64_t calls, ns;
    int64_t elems, bytes;
} ProfRow;

int fc_prof_on = 0;

static struct {
    ProfRow *rows;          /* owned (PyMem), cap entries */
    int n, cap;
    unsigned gen;           /* starts at 1: a zeroed FcProfRef never matches */
    uint64_t dropped;       /* events lost to out of memory */
} prof = {NULL, 0, 0, 1, 0};

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
free_row(ProfRow *r)
{
    PyMem_Free(r->name);
    PyMem_Free(r->path);
    PyMem_Free(r->origin);
}

/* the row of (kind, name), made if new; -1 when out of memory */
static int
find_row(FcProfKind kind, const char *name, const char *path, const char *origin)
{
    ProfRow *r;
    int failed = 0;
    for (int i = 0; i < prof.n; i++) {
        if (prof.rows[i].kind == kind && strcmp(prof.rows[i].name, name) == 0) {
            return i;
        }
    }
    if (prof.n == prof.cap) {
        int cap = prof.cap ? 2 * prof.cap : 64;
        ProfRow *rows = PyMem_Realloc(prof.rows, cap * sizeof(ProfRow));
        if (rows == NULL) {
            return -1;
        }
        prof.rows = rows;
        prof.cap = cap;
    }
    r = &prof.rows[prof.n];
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->name = copy_str(name, &failed);
    r->path = copy_str(path, &failed);
    r->origin = copy_str(origin, &failed);
    if (failed) {
        free_row(r);
        return -1;
    }
    return prof.n++;
}

int
fc_prof_known(const FcProfRef *ref)
{
    return ref->gen == prof.gen;
}

void
fc_prof_add(FcProfRef *ref, FcProfKind kind, const char *name, const char *path, const char *origin,
            uint64_t ns, int64_t elems, int64_t bytes)
{
    ProfRow *r;
    if (ref->gen != prof.gen) {
        int row = find_row(kind, name != NULL ? name : "?", path, origin);
        if (row < 0) {
            prof.dropped++;
            return;
        }
        ref->gen = prof.gen;
        ref->row = row;
    }
    r = &prof.rows[ref->row];
    r->calls++;
    r->ns += ns;
    r->elems += elems;
    r->bytes += bytes;
}

static void
reset(void)
{
    for (int i = 0; i < prof.n; i++) {
        free_row(&prof.rows[i]);
    }
    PyMem_Free(prof.rows);
    prof.rows = NULL;
    prof.n = prof.cap = 0;
    prof.dropped = 0;
    prof.gen++;
    if (prof.gen == 0) {        /* wrapped: 0 is a fresh FcProfRef's */
        prof.gen = 1;
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
    PyObject *rows = PyList_New(prof.n);    /* owned until returned */
    (void)self;
    (void)noargs;
    if (rows == NULL) {
        return NULL;
    }
    for (int i = 0; i < prof.n; i++) {
        const ProfRow *r = &prof.rows[i];
        PyObject *t = Py_BuildValue("(ssKKLLzz)", kind_names[r->kind], r->name,
                                    (unsigned long long)r->calls, (unsigned long long)r->ns,
                                    (long long)r->elems, (long long)r->bytes, r->path, r->origin);
        if (t == NULL) {
            Py_DECREF(rows);
            return NULL;
        }
        PyList_SET_ITEM(rows, i, t);
    }
    return Py_BuildValue("(NK)", rows, (unsigned long long)prof.dropped);
}
