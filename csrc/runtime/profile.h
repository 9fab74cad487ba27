/* Runtime, profiling: time per kernel, per extern and per compiled call while
 * fastcompile.profile() is on. In: records from plan.c (a kernel launch) and
 * compiledobj.c (an extern call, a whole call). Out: a table Python reads
 * (_C._profile_read). Everything here runs with the GIL held. */
#ifndef FC_PROFILE_H
#define FC_PROFILE_H

#include <Python.h>
#include <stdint.h>

#include "../core/ir.h"

typedef enum {
    FC_PROF_KERNEL = 0,     /* a CPU kernel: timed around its launch (OpenMP team included) */
    FC_PROF_CUDA = 1,       /* a CUDA kernel: launched asynchronously, so counted, not timed */
    FC_PROF_EXTERN = 2,     /* an extern call (Python: torch ops, views), its conversions included */
    FC_PROF_CALL = 3,       /* one call of a compiled graph, everything in it but compiles */
    FC_PROF_COMPILE = 4,    /* the compiles a call waited for (plans built and loaded) */
} FcProfKind;

/* A record site's cached row: valid while gen is the table's (a reset
 * starts a new generation). Zero-initialized means "not looked up yet". */
typedef struct {
    unsigned gen;
    int row;
} FcProfRef;

/* nonzero while profiling (read on every launch: a plain int) */
FC_INTERNAL extern int fc_prof_on;

/* monotonic nanoseconds */
FC_INTERNAL uint64_t fc_prof_now(void);

/* whether ref's row is known: fc_prof_add may then take NULL for name, path and origin */
FC_INTERNAL int fc_prof_known(const FcProfRef *ref);

/* Adds one event to the row of (kind, name), made at its first event with
 * path (the kernel's source, or NULL) and origin ("file:line" or NULL),
 * copied. ref caches the row for the record site. ns: the event's time;
 * elems: elements computed; bytes: bytes of the arrays it read and wrote.
 * Out of memory drops the event and counts it (the table says so). */
FC_INTERNAL void fc_prof_add(FcProfRef *ref, FcProfKind kind, const char *name, const char *path,
                             const char *origin, uint64_t ns, int64_t elems, int64_t bytes);

/* Sets the name of the graph whose call is running (borrowed: the caller keeps
 * it alive until it restores the one returned), which kernel rows made during
 * it take as their origin (per thread). Returns the previous name (NULL: none). */
FC_INTERNAL const char *fc_prof_scope(const char *name);
/* the name fc_prof_scope set, or NULL */
FC_INTERNAL const char *fc_prof_current(void);

/* _C._profile(on, reset): switch recording on or off; reset empties the
 * table first. args: borrowed; returns None (new reference) or NULL. */
FC_INTERNAL PyObject *fc_prof_py_set(PyObject *self, PyObject *args);
/* _C._profile_read(): (rows, dropped), a new reference (or NULL): rows a list
 * of tuples (kind, name, calls, ns, elems, bytes, path, origin), dropped the
 * events lost to out of memory. A kernel's row is shared by every graph that
 * runs that kernel (kernels are named by their text); its origin is the
 * first graph's. */
FC_INTERNAL PyObject *fc_prof_py_read(PyObject *self, PyObject *noargs);

typedef struct {
    FcProfKind kind;
    char *name, *path, *origin;  /* owned (PyMem); path, origin may be NULL */
    uint64_t calls, ns;
    int64_t elems, bytes;
} FcProfRow;

/* fc_state.prof: the rows recorded while profiling. */
typedef struct {
    FcProfRow *rows;        /* owned (PyMem), cap entries */
    int n, cap;
    unsigned gen;           /* starts at 1: a zeroed FcProfRef never matches */
    uint64_t dropped;       /* events lost to out of memory */
} FcProfRt;

#endif
