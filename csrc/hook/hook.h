/* The frame hook (PEP 523): set_eval_frame, Hooked, Frame, CacheEntry, Guards.
 * In: Python frames about to run. Out: cached targets run in their place, or
 * the tracer's callback asked for one.
 *
 * Files: compat.{h,c} (version-specific frame access and copied CPython
 * internals), eval_frame.c (mode, eval function, Hooked, Frame), cache.c
 * (CacheEntry, per-code extra state), guards.c (guard programs). */
#ifndef FC_HOOK_H
#define FC_HOOK_H

#include <Python.h>

#ifndef FC_INTERNAL
#define FC_INTERNAL __attribute__((visibility("hidden")))
#endif

/* Kinds of localsplus slots (CPython's CO_FAST_*, internal/pycore_code.h). */
#define FC_FAST_HIDDEN 0x10
#define FC_FAST_LOCAL  0x20
#define FC_FAST_CELL   0x40
#define FC_FAST_FREE   0x80

/* What guards and Frame.f_locals read: a frame at its first instruction.
 * Every pointer is borrowed from the frame. Free-variable slots are not filled
 * yet (COPY_FREE_VARS has not run) and are read from `closure`; cell slots that
 * are not arguments are still NULL. */
typedef struct {
    PyCodeObject *code;
    PyObject *const *slots;     /* localsplus */
    PyObject *closure;          /* tuple of cells, or NULL */
    PyObject *globals;
    PyObject *builtins;
} FcHookView;

/* Value of localsplus slot `i` as the function body would see it after its
 * prefix ran (free variables unwrapped from their cells). Borrowed, or NULL if
 * unbound or out of range (no exception set). */
FC_INTERNAL PyObject *fc_hook_view_slot(const FcHookView *v, Py_ssize_t i);

/* Number of leading slots that are arguments (posonly+pos, kwonly, *args, **kw). */
FC_INTERNAL int fc_hook_code_nargs(PyCodeObject *code);

/* Fills `v` from a _C.Frame that is still valid (inside its callback).
 * frame: borrowed. Returns 0, or -1 with TypeError/RuntimeError set. */
FC_INTERNAL int fc_hook_frame_view(PyObject *frame, FcHookView *v);

/* ---- guards.c ---- */
typedef struct FcHookGuards FcHookGuards;
FC_INTERNAL extern PyTypeObject FcHookGuards_Type;

/* Runs guard program `g` on the frame view. Never raises (an exception while
 * checking is cleared and counts as a failure). Returns the index of the first
 * failing instruction, or -1 if every check passed. g, v: borrowed. */
FC_INTERNAL Py_ssize_t fc_hook_guards_first_failure(FcHookGuards *g, const FcHookView *v);

/* Adds Guards to module. module: borrowed. Returns 0, or -1 with an exception. */
FC_INTERNAL int fc_hook_guards_init(PyObject *module);

/* ---- cache.c ---- */
typedef struct {
    PyObject_HEAD
    FcHookGuards *guards;       /* owned */
    PyObject *target;           /* owned: a callable or a code object */
    PyObject *slots;            /* owned tuple of ints, or None (code target) */
    PyObject *name;             /* owned str or None */
    PyObject *info;             /* owned: the frontend's report data (trace.EntryInfo) or None */
    Py_ssize_t hits;
    Py_ssize_t fallbacks;       /* calls whose callable target raised and plain Python did not */
    Py_ssize_t *slot_index;     /* PyMem; one per slot */
    Py_ssize_t nslots;
    int is_code;
} FcHookEntry;

FC_INTERNAL extern PyTypeObject FcHookEntry_Type;

enum { FC_HOOK_STATE_NONE = 0, FC_HOOK_STATE_SKIP = 1, FC_HOOK_STATE_RUN_ONLY = 2 };

/* Per-code state kept in the code object's co_extra slot. */
typedef struct FcHookExtra {
    FcHookEntry **entries;      /* owned refs, most recently used first */
    Py_ssize_t n, cap;
    int state;
    struct FcHookExtra *prev, *next;   /* registry of live states */
} FcHookExtra;

/* The extra state of `code`, or NULL if it has none (no exception set).
 * code: borrowed; returns: borrowed (lives as long as code). */
FC_INTERNAL FcHookExtra *fc_hook_extra_get(PyCodeObject *code);

/* The extra state of `code`, created if missing. code: borrowed; returns:
 * borrowed, or NULL with an exception set. */
FC_INTERNAL FcHookExtra *fc_hook_extra_ensure(PyCodeObject *code);

/* Inserts `e` at the front. e: borrowed (a new reference is stored). Returns 0,
 * or -1 with an exception set. */
FC_INTERNAL int fc_hook_extra_push_front(FcHookExtra *x, FcHookEntry *e);

/* The first entry whose guards pass on `v`, moved to the front; NULL on a miss.
 * Never raises. returns: new reference. */
FC_INTERNAL FcHookEntry *fc_hook_extra_lookup(FcHookExtra *x, const FcHookView *v);

/* Checks that `e` fits `code` before it is stored for it: a code target has the
 * same argument and free-variable layout (counts, flags, slot kinds), a
 * callable's slots are argument or free-variable slots of `code`. Returns 0, or
 * -1 with ValueError. e, code: borrowed. */
FC_INTERNAL int fc_hook_entry_check(FcHookEntry *e, PyCodeObject *code);

/* Adds CacheEntry, code_entries, code_state, reset_code, reset_all to module.
 * module: borrowed. Returns 0, or -1 with an exception set. */
FC_INTERNAL int fc_hook_cache_init(PyObject *module);
/* adapter.c: the Pick type (a C fast target). */
FC_INTERNAL int fc_hook_adapter_init(PyObject *module);

/* ---- eval_frame.c ---- */

/* Adds the hook's functions, types and constants to fastcompile._C.
 * module: borrowed. Returns 0, or -1 with an exception set. */
FC_INTERNAL int fc_hook_init(PyObject *module);

#endif
