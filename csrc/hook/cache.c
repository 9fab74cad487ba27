/* Hook cache: CacheEntry objects and the per-code state in co_extra.
 * In: entries the tracer's callback returns. Out: a most-recently-used-first
 * list per code object, looked up by the eval function; skip / run-only marks.
 *
 * Every live FcHookExtra is in one registry (a circular list) so that
 * reset_all() can reach them; the co_extra free function unlinks it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <structmember.h>

#include "hook.h"

#if PY_VERSION_HEX >= 0x030C0000
#define FC_CODE_GET_EXTRA PyUnstable_Code_GetExtra
#define FC_CODE_SET_EXTRA PyUnstable_Code_SetExtra
#define FC_REQUEST_CODE_EXTRA_INDEX PyUnstable_Eval_RequestCodeExtraIndex
#else
#define FC_CODE_GET_EXTRA _PyCode_GetExtra
#define FC_CODE_SET_EXTRA _PyCode_SetExtra
#define FC_REQUEST_CODE_EXTRA_INDEX _PyEval_RequestCodeExtraIndex
#endif

static Py_ssize_t extra_index = -1;
static FcHookExtra registry = {.prev = &registry, .next = &registry};

/* ========================================================================
 * CacheEntry
 * ====================================================================== */

int
fc_hook_code_nargs(PyCodeObject *code)
{
    return code->co_argcount + code->co_kwonlyargcount + ((code->co_flags & CO_VARARGS) ? 1 : 0) +
           ((code->co_flags & CO_VARKEYWORDS) ? 1 : 0);
}

static int
kind_of(PyCodeObject *code, Py_ssize_t i)
{
    return (unsigned char)PyBytes_AS_STRING(code->co_localspluskinds)[i];
}

static PyObject *
Entry_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"guards", "target", "slots", "name", "info", NULL};
    PyObject *guards = NULL, *target = NULL, *slots = Py_None, *name = Py_None, *info = Py_None;
    FcHookEntry *e = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$OOO:CacheEntry", kwlist, &guards, &target, &slots,
                                     &name, &info)) {
        goto error;
    }
    if (name != Py_None && !PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "CacheEntry: name must be a str or None");
        goto error;
    }
    int is_code = PyCode_Check(target);
    if (is_code && slots != Py_None) {
        PyErr_SetString(PyExc_TypeError, "CacheEntry: a code-object target takes slots=None");
        goto error;
    }
    if (!is_code && (!PyCallable_Check(target) || !PyTuple_Check(slots))) {
        PyErr_SetString(PyExc_TypeError,
                        "CacheEntry: target must be a code object (slots=None) or a callable with "
                        "slots=tuple of fast-local indices");
        goto error;
    }
    e = (FcHookEntry *)type->tp_alloc(type, 0);
    if (e == NULL) {
        goto error;
    }
    e->is_code = is_code;
    if (PyObject_TypeCheck(guards, &FcHookGuards_Type)) {
        e->guards = (FcHookGuards *)Py_NewRef(guards);
    }
    else if ((e->guards = (FcHookGuards *)PyObject_CallOneArg((PyObject *)&FcHookGuards_Type,
                                                               guards)) == NULL) {
        goto error;
    }
    e->target = Py_NewRef(target);
    e->slots = Py_NewRef(slots);
    e->name = Py_NewRef(name);
    e->info = Py_NewRef(info);
    if (!is_code) {
        e->nslots = PyTuple_GET_SIZE(slots);
        e->slot_index = PyMem_Calloc(e->nslots > 0 ? (size_t)e->nslots : 1, sizeof(Py_ssize_t));
        if (e->slot_index == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        for (Py_ssize_t i = 0; i < e->nslots; i++) {
            PyObject *s = PyTuple_GET_ITEM(slots, i);
            Py_ssize_t v = PyLong_Check(s) ? PyLong_AsSsize_t(s) : -1;
            if (v < 0) {
                if (!PyErr_Occurred()) {
                    PyErr_Format(PyExc_TypeError, "CacheEntry: slots[%zd] must be an int >= 0", i);
                }
                goto error;
            }
            e->slot_index[i] = v;
        }
    }
    return (PyObject *)e;
error:
    Py_XDECREF(e);
    return NULL;
}

static int
Entry_traverse(FcHookEntry *e, visitproc visit, void *arg)
{
    Py_VISIT(e->guards);
    Py_VISIT(e->target);
    Py_VISIT(e->slots);
    Py_VISIT(e->name);
    Py_VISIT(e->info);
    return 0;
}

static int
Entry_clear(FcHookEntry *e)
{
    Py_CLEAR(e->guards);
    Py_CLEAR(e->target);
    Py_CLEAR(e->slots);
    Py_CLEAR(e->name);
    Py_CLEAR(e->info);
    return 0;
}

static void
Entry_dealloc(FcHookEntry *e)
{
    PyObject_GC_UnTrack(e);
    Entry_clear(e);
    PyMem_Free(e->slot_index);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *
Entry_repr(FcHookEntry *e)
{
    return PyUnicode_FromFormat("<fastcompile CacheEntry %R: %zd guards, %s target, %zd hits>", e->name,
                                e->guards != NULL ? PyObject_Length((PyObject *)e->guards) : 0,
                                e->is_code ? "code" : "callable", e->hits);
}

int
fc_hook_entry_check(FcHookEntry *e, PyCodeObject *code)
{
    Py_ssize_t nargs = fc_hook_code_nargs(code);
    Py_ssize_t firstfree = code->co_nlocalsplus - code->co_nfreevars;
    if (!e->is_code) {
        for (Py_ssize_t i = 0; i < e->nslots; i++) {
            Py_ssize_t s = e->slot_index[i];
            if (s >= code->co_nlocalsplus || (s >= nargs && s < firstfree)) {
                PyErr_Format(PyExc_ValueError,
                             "CacheEntry: slot %zd of %U is not an argument or free-variable slot "
                             "(%zd arguments, %d slots, frees from %zd)",
                             s, code->co_qualname, nargs, code->co_nlocalsplus, firstfree);
                return -1;
            }
        }
        return 0;
    }
    PyCodeObject *t = (PyCodeObject *)e->target;
    const char *what = NULL;
    const int argflags = CO_VARARGS | CO_VARKEYWORDS;
    const int genflags = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE;
    if (t->co_argcount != code->co_argcount || t->co_posonlyargcount != code->co_posonlyargcount) {
        what = "positional argument count";
    }
    else if (t->co_kwonlyargcount != code->co_kwonlyargcount) {
        what = "keyword-only argument count";
    }
    else if ((t->co_flags & argflags) != (code->co_flags & argflags)) {
        what = "*args/**kwargs flags";
    }
    else if ((t->co_flags & genflags) != 0) {
        what = "generator/coroutine flags (target must be a plain function)";
    }
    else if (t->co_nfreevars != code->co_nfreevars || t->co_ncellvars != code->co_ncellvars) {
        what = "number of free or cell variables";
    }
    else {
        Py_ssize_t tfirstfree = t->co_nlocalsplus - t->co_nfreevars;
        for (Py_ssize_t i = 0; i < nargs && what == NULL; i++) {
            if (kind_of(t, i) != kind_of(code, i)) {
                what = "kind of an argument slot (cell or not)";
            }
        }
        for (Py_ssize_t i = 0; i < code->co_nfreevars && what == NULL; i++) {
            if (kind_of(t, tfirstfree + i) != kind_of(code, firstfree + i)) {
                what = "kind of a free-variable slot";
            }
        }
    }
    if (what != NULL) {
        PyErr_Format(PyExc_ValueError, "CacheEntry: code target %U cannot replace %U: different %s",
                     t->co_qualname, code->co_qualname, what);
        return -1;
    }
    return 0;
}

static PyMemberDef Entry_members[] = {
    {"guards", T_OBJECT, offsetof(FcHookEntry, guards), READONLY, "the Guards program"},
    {"target", T_OBJECT, offsetof(FcHookEntry, target), READONLY, "callable or code object"},
    {"slots", T_OBJECT, offsetof(FcHookEntry, slots), READONLY, "tuple of localsplus indices, or None"},
    {"name", T_OBJECT, offsetof(FcHookEntry, name), READONLY, "label for explain(), or None"},
    {"info", T_OBJECT, offsetof(FcHookEntry, info), READONLY, "whatever the frontend keeps for reports, or None"},
    {"hits", T_PYSSIZET, offsetof(FcHookEntry, hits), READONLY, "number of guard hits"},
    {"fallbacks", T_PYSSIZET, offsetof(FcHookEntry, fallbacks), READONLY,
     "calls whose callable target raised where the frame, run as plain Python, did not"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject FcHookEntry_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile._C.CacheEntry",
    .tp_basicsize = sizeof(FcHookEntry),
    .tp_dealloc = (destructor)Entry_dealloc,
    .tp_repr = (reprfunc)Entry_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "CacheEntry(guards, target, *, slots=None, name=None): one compiled version of a code "
              "object.\ntarget is a callable called as target(*frame_slots[slots]), or a code object "
              "(slots=None) run in place of the frame's code.",
    .tp_traverse = (traverseproc)Entry_traverse,
    .tp_clear = (inquiry)Entry_clear,
    .tp_members = Entry_members,
    .tp_new = Entry_new,
};

/* ========================================================================
 * per-code extra state
 * ====================================================================== */

/* Detaches x's entries: returns the array (caller decrefs n items and frees
 * it) and leaves x empty. */
static FcHookEntry **
extra_detach(FcHookExtra *x, Py_ssize_t *n)
{
    FcHookEntry **items = x->entries;
    *n = x->n;
    x->entries = NULL;
    x->n = x->cap = 0;
    return items;
}

static void
entries_release(FcHookEntry **items, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(items[i]);
    }
    PyMem_Free(items);
}

/* co_extra free function: the code object dies (or its slot is replaced).
 * CPython calls it for every registered index of a code object that has any
 * extra slots (e.g. only torch's), so p is NULL for code we never touched. */
static void
extra_free(void *p)
{
    FcHookExtra *x = p;
    Py_ssize_t n;
    if (x == NULL) {
        return;
    }
    x->prev->next = x->next;
    x->next->prev = x->prev;
    FcHookEntry **items = extra_detach(x, &n);
    PyMem_Free(x);
    entries_release(items, n);
}

FcHookExtra *
fc_hook_extra_get(PyCodeObject *code)
{
    void *p = NULL;
    if (FC_CODE_GET_EXTRA((PyObject *)code, extra_index, &p) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return p;
}

FcHookExtra *
fc_hook_extra_ensure(PyCodeObject *code)
{
    FcHookExtra *x = fc_hook_extra_get(code);
    if (x != NULL) {
        return x;
    }
    x = PyMem_Calloc(1, sizeof(FcHookExtra));
    if (x == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (FC_CODE_SET_EXTRA((PyObject *)code, extra_index, x) < 0) {
        PyMem_Free(x);
        return NULL;
    }
    x->next = registry.next;
    x->prev = &registry;
    registry.next->prev = x;
    registry.next = x;
    return x;
}

int
fc_hook_extra_push_front(FcHookExtra *x, FcHookEntry *e)
{
    if (x->n == x->cap) {
        Py_ssize_t cap = x->cap ? 2 * x->cap : 4;
        FcHookEntry **items = PyMem_Realloc(x->entries, (size_t)cap * sizeof(*items));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        x->entries = items;
        x->cap = cap;
    }
    memmove(&x->entries[1], &x->entries[0], (size_t)x->n * sizeof(*x->entries));
    x->entries[0] = (FcHookEntry *)Py_NewRef(e);
    x->n++;
    return 0;
}

FcHookEntry *
fc_hook_extra_lookup(FcHookExtra *x, const FcHookView *v)
{
    /* Guards run no Python code except the tensor check's attribute reads;
     * the array is re-read every step in case such code changed it. */
    for (Py_ssize_t i = 0; i < x->n; i++) {
        FcHookEntry *e = (FcHookEntry *)Py_NewRef(x->entries[i]);
        if (fc_hook_guards_first_failure(e->guards, v) < 0) {
            for (Py_ssize_t j = 0; j < x->n; j++) {
                if (x->entries[j] == e) {
                    memmove(&x->entries[1], &x->entries[0], (size_t)j * sizeof(*x->entries));
                    x->entries[0] = e;
                    break;
                }
            }
            e->hits++;
            return e;
        }
        Py_DECREF(e);
    }
    return NULL;
}

/* ========================================================================
 * Python API
 * ====================================================================== */

static int
code_arg(PyObject *code)
{
    if (!PyCode_Check(code)) {
        PyErr_Format(PyExc_TypeError, "expected a code object, got %.100s", Py_TYPE(code)->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *
hook_code_entries(PyObject *self, PyObject *code)
{
    if (code_arg(code) < 0) {
        return NULL;
    }
    FcHookExtra *x = fc_hook_extra_get((PyCodeObject *)code);
    PyObject *res = PyList_New(x != NULL ? x->n : 0);
    if (res == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; x != NULL && i < x->n; i++) {
        PyList_SET_ITEM(res, i, Py_NewRef(x->entries[i]));
    }
    return res;
}

static PyObject *
hook_code_state(PyObject *self, PyObject *code)
{
    if (code_arg(code) < 0) {
        return NULL;
    }
    FcHookExtra *x = fc_hook_extra_get((PyCodeObject *)code);
    const char *s = "none";
    if (x != NULL && x->state == FC_HOOK_STATE_SKIP) {
        s = "skip";
    }
    else if (x != NULL && x->state == FC_HOOK_STATE_RUN_ONLY) {
        s = "run_only";
    }
    else if (x != NULL && x->n > 0) {
        s = "active";
    }
    return PyUnicode_FromString(s);
}

static PyObject *
hook_reset_code(PyObject *self, PyObject *code)
{
    if (code_arg(code) < 0) {
        return NULL;
    }
    FcHookExtra *x = fc_hook_extra_get((PyCodeObject *)code);
    if (x != NULL) {
        Py_ssize_t n;
        x->state = FC_HOOK_STATE_NONE;
        FcHookEntry **items = extra_detach(x, &n);
        entries_release(items, n);
    }
    Py_RETURN_NONE;
}

static PyObject *
hook_reset_all(PyObject *self, PyObject *unused)
{
    /* Detach everything first, release after: releasing runs destructors that
     * may add or free extra states. */
    PyObject *dead = PyList_New(0);
    if (dead == NULL) {
        return NULL;
    }
    for (FcHookExtra *x = registry.next; x != &registry; x = x->next) {
        for (Py_ssize_t i = 0; i < x->n; i++) {
            if (PyList_Append(dead, (PyObject *)x->entries[i]) < 0) {
                Py_DECREF(dead);
                return NULL;
            }
        }
    }
    for (FcHookExtra *x = registry.next; x != &registry; x = x->next) {
        Py_ssize_t n;
        x->state = FC_HOOK_STATE_NONE;
        FcHookEntry **items = extra_detach(x, &n);
        entries_release(items, n);   /* the list still holds them */
    }
    Py_DECREF(dead);
    Py_RETURN_NONE;
}

/* Tests: give `code` an extra slot under a second, foreign index (as torch's
 * Dynamo does), so that when the code dies CPython calls our free function
 * with NULL for our slot. */
static void
foreign_extra_free(void *p)
{
    (void)p;
}

static PyObject *
hook_test_foreign_extra(PyObject *self, PyObject *code)
{
    static Py_ssize_t foreign_index = -1;
    static char dummy;
    if (!PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "_test_foreign_extra expects a code object");
        return NULL;
    }
    if (foreign_index < 0 && (foreign_index = FC_REQUEST_CODE_EXTRA_INDEX(foreign_extra_free)) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: no co_extra slot left");
        return NULL;
    }
    if (FC_CODE_SET_EXTRA(code, foreign_index, &dummy) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef cache_methods[] = {
    {"_test_foreign_extra", hook_test_foreign_extra, METH_O,
     "give a code object an extra slot under another index (tests)"},
    {"code_entries", hook_code_entries, METH_O, "code_entries(code) -> list of CacheEntry, most recent first"},
    {"code_state", hook_code_state, METH_O, "code_state(code) -> 'none' | 'skip' | 'run_only' | 'active'"},
    {"reset_code", hook_reset_code, METH_O, "reset_code(code): drop the entries and marks of one code object"},
    {"reset_all", hook_reset_all, METH_NOARGS, "reset_all(): drop every entry and mark of every code object"},
    {NULL, NULL, 0, NULL},
};

int
fc_hook_cache_init(PyObject *m)
{
    if (extra_index < 0) {
        extra_index = FC_REQUEST_CODE_EXTRA_INDEX(extra_free);
        if (extra_index < 0) {
            PyErr_SetString(PyExc_RuntimeError, "fastcompile: no co_extra slot left");
            return -1;
        }
    }
    if (PyType_Ready(&FcHookEntry_Type) < 0 ||
            PyModule_AddObjectRef(m, "CacheEntry", (PyObject *)&FcHookEntry_Type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(m, cache_methods);
}
