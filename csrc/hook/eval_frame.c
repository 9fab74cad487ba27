/* Hook eval function (PEP 523): per-thread mode, set_eval_frame, Hooked, Frame.
 * In: every Python frame started while some thread is in a hooked call. Out:
 * the frame run normally, a cached entry run in its place, or the tracer's
 * callback asked for an entry.
 *
 * The eval-frame state below is process-global (the documented exception to
 * module state in STYLE.md): the eval function has no module to look in. It
 * changes only with the GIL held. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "compat.h"
#include "hook.h"

/* ========================================================================
 * eval-frame globals
 * ====================================================================== */

static Py_tss_t mode_key = Py_tss_NEEDS_INIT;   /* owned ref: False or a callable; NULL = None */
static Py_ssize_t active_threads;               /* threads whose mode is not None */
static _PyFrameEvalFunction previous_eval;      /* installed before us (a debugger's), or NULL */
static PyObject *hook_skip, *hook_run_only;     /* the SKIP and RUN_ONLY sentinels */
/* A mode that is off for the eval function but keeps the thread counted, so
 * that running a cached target does not uninstall and reinstall the hook. */
static PyObject *hook_paused;

static PyObject *hook_eval(PyThreadState *tstate, FcFrame *frame, int throwflag);

static const int hook_genflags = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE;

/* ========================================================================
 * mode and installation
 * ====================================================================== */

/* This thread's mode: borrowed, NULL when off (hook_paused is off too). */
static inline PyObject *
mode_get(void)
{
    return (PyObject *)PyThread_tss_get(&mode_key);
}

/* Another PEP 523 user (a debugger, torch's Dynamo shim) may install itself
 * while we are installed, keeping hook_eval as the function it chains to. We
 * cannot take ourselves out of its chain, so we note that we are still in it
 * and stop touching the interpreter's function until we find ourselves on
 * top again: reinstalling would make previous_eval point at the function that
 * calls us, and the two would call each other forever. */
static int hook_in_chain;

static void
hook_install(void)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction cur = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (cur == hook_eval) {
        hook_in_chain = 0;
        return;
    }
    if (hook_in_chain) {
        return;          /* the function above us still calls us */
    }
    previous_eval = cur == _PyEval_EvalFrameDefault ? NULL : cur;
    _PyInterpreterState_SetEvalFrameFunc(interp, hook_eval);
}

static void
hook_uninstall(void)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction cur = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (cur == hook_eval) {
        _PyInterpreterState_SetEvalFrameFunc(interp,
                                             previous_eval != NULL ? previous_eval : _PyEval_EvalFrameDefault);
        hook_in_chain = 0;
    }
    else if (cur != _PyEval_EvalFrameDefault && cur != previous_eval) {
        hook_in_chain = 1;
    }
}

/* Sets this thread's mode (None or NULL: off) and keeps the eval function
 * installed while any thread's mode is on. mode: borrowed. Returns 0, or -1
 * with an exception set (the mode is then unchanged). Leaves a pending
 * exception alone on success. */
static int
mode_set(PyObject *mode)
{
    if (mode == Py_None) {
        mode = NULL;
    }
    PyObject *old = mode_get();
    if (old == mode) {
        return 0;
    }
    if (PyThread_tss_set(&mode_key, Py_XNewRef(mode)) != 0) {
        Py_XDECREF(mode);
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: cannot set the thread-local hook mode");
        return -1;
    }
    if (old == NULL && mode != NULL && active_threads++ == 0) {
        hook_install();
    }
    else if (old != NULL && mode == NULL && --active_threads == 0) {
        hook_uninstall();
    }
    Py_XDECREF(old);
    return 0;
}

/* ========================================================================
 * _C.Frame: the frame as the callback sees it (valid during the callback)
 * ====================================================================== */

typedef struct {
    PyObject_HEAD
    FcFrame *frame;     /* NULL once the callback returned */
} FrameObject;

static PyTypeObject Frame_Type;

static FcFrame *
frame_live(FrameObject *self)
{
    if (self->frame == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "fastcompile._C.Frame is only valid during the callback it was passed to");
    }
    return self->frame;
}

int
fc_hook_frame_view(PyObject *frame, FcHookView *v)
{
    if (!PyObject_TypeCheck(frame, &Frame_Type)) {
        PyErr_Format(PyExc_TypeError, "expected a fastcompile._C.Frame, got %.100s", Py_TYPE(frame)->tp_name);
        return -1;
    }
    FcFrame *f = frame_live((FrameObject *)frame);
    if (f == NULL) {
        return -1;
    }
    fc_hook_view_of(v, f);
    return 0;
}

static PyObject *
Frame_f_code(FrameObject *self, void *unused)
{
    FcFrame *f = frame_live(self);
    return f == NULL ? NULL : Py_NewRef((PyObject *)FC_FRAME_CODE(f));
}

static PyObject *
Frame_f_globals(FrameObject *self, void *unused)
{
    FcFrame *f = frame_live(self);
    return f == NULL ? NULL : Py_NewRef(FC_FRAME_GLOBALS(f));
}

static PyObject *
Frame_f_builtins(FrameObject *self, void *unused)
{
    FcFrame *f = frame_live(self);
    return f == NULL ? NULL : Py_NewRef(FC_FRAME_BUILTINS(f));
}

static PyObject *
Frame_f_func(FrameObject *self, void *unused)
{
    FcFrame *f = frame_live(self);
    return f == NULL ? NULL : Py_NewRef((PyObject *)FC_FRAME_FUNC(f));
}

static PyObject *
Frame_closure(FrameObject *self, void *unused)
{
    FcFrame *f = frame_live(self);
    if (f == NULL) {
        return NULL;
    }
    PyObject *c = FC_FRAME_FUNC(f)->func_closure;
    return Py_NewRef(c != NULL ? c : Py_None);
}

static int
frame_lasti_bytes(FcFrame *f)
{
    int lasti = FC_FRAME_LASTI(f);
    return (lasti < 0 ? 0 : lasti) * (int)sizeof(_Py_CODEUNIT);
}

static PyObject *
Frame_f_lasti(FrameObject *self, void *unused)
{
    FcFrame *f = frame_live(self);
    return f == NULL ? NULL : PyLong_FromLong(frame_lasti_bytes(f));
}

static PyObject *
Frame_f_lineno(FrameObject *self, void *unused)
{
    FcFrame *f = frame_live(self);
    if (f == NULL) {
        return NULL;
    }
    /* the prefix (COPY_FREE_VARS, MAKE_CELL) has no line: report the def line */
    int line = PyCode_Addr2Line(FC_FRAME_CODE(f), frame_lasti_bytes(f));
    return PyLong_FromLong(line >= 0 ? line : FC_FRAME_CODE(f)->co_firstlineno);
}

static PyObject *
Frame_f_locals(FrameObject *self, void *unused)
{
    FcHookView v;
    PyObject *d = NULL;
    if (fc_hook_frame_view((PyObject *)self, &v) < 0) {
        goto error;
    }
    if ((d = PyDict_New()) == NULL) {
        goto error;
    }
    PyCodeObject *co = v.code;
    for (int i = 0; i < co->co_nlocalsplus; i++) {
        int kind = (unsigned char)PyBytes_AS_STRING(co->co_localspluskinds)[i];
        PyObject *val = fc_hook_view_slot(&v, i);
        if ((kind & FC_FAST_HIDDEN) || val == NULL) {
            continue;
        }
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(co->co_localsplusnames, i), val) < 0) {
            goto error;
        }
    }
    return d;
error:
    Py_XDECREF(d);
    return NULL;
}

static PyObject *
Frame_repr(FrameObject *self)
{
    if (self->frame == NULL) {
        return PyUnicode_FromString("<fastcompile Frame (expired)>");
    }
    PyCodeObject *co = FC_FRAME_CODE(self->frame);
    return PyUnicode_FromFormat("<fastcompile Frame %U at %U:%d>", co->co_qualname, co->co_filename,
                                co->co_firstlineno);
}

static void
Frame_dealloc(FrameObject *self)
{
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyGetSetDef Frame_getset[] = {
    {"f_code", (getter)Frame_f_code, NULL, "code object", NULL},
    {"f_globals", (getter)Frame_f_globals, NULL, "globals dict", NULL},
    {"f_builtins", (getter)Frame_f_builtins, NULL, "builtins dict", NULL},
    {"f_func", (getter)Frame_f_func, NULL, "the function object", NULL},
    {"closure", (getter)Frame_closure, NULL, "tuple of cells, or None", NULL},
    {"f_locals", (getter)Frame_f_locals, NULL, "new dict of the bound fast locals (free vars from the closure)",
     NULL},
    {"f_lineno", (getter)Frame_f_lineno, NULL, "line of the first instruction (the def line)", NULL},
    {"f_lasti", (getter)Frame_f_lasti, NULL, "instruction offset in bytes (0: not started)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Frame_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile._C.Frame",
    .tp_basicsize = sizeof(FrameObject),
    .tp_dealloc = (destructor)Frame_dealloc,
    .tp_repr = (reprfunc)Frame_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A frame about to start, as passed to the hook's callback; valid only during the callback.",
    .tp_getset = Frame_getset,
};

/* ========================================================================
 * the eval function
 * ====================================================================== */

/* The frame this thread is handing to previous_eval: if it comes back to
 * hook_eval, the chain loops (see hook_in_chain), and it runs the default way. */
static _Thread_local FcFrame *forwarding;

/* Runs a frame the normal way: the eval function installed before ours. */
static PyObject *
eval_default(PyThreadState *tstate, FcFrame *frame, int throwflag)
{
    _PyFrameEvalFunction prev = previous_eval;
    if (prev == NULL || prev == hook_eval || forwarding == frame) {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    FcFrame *outer = forwarding;
    forwarding = frame;
    PyObject *res = prev(tstate, frame, throwflag);
    forwarding = outer;
    return res;
}

/* target(*slots) for a callable entry, with this thread's mode paused (the
 * target is compiled code, not user code; frames it runs are not hooked). The
 * call holds a reference to each value: free variables are read from cells
 * that code running during the call (or another thread, while a kernel runs
 * without the GIL) may rebind. e, v: borrowed; returns: new reference. */
static PyObject *
call_target(FcHookEntry *e, const FcHookView *v)
{
    PyObject *small[1 + 8];
    PyObject **argv = small, *res = NULL, *mode = NULL;
    Py_ssize_t n = e->nslots, held = 0;   /* argv[1 .. held] are owned */
    if (n > 8 && (argv = PyMem_Malloc((size_t)(n + 1) * sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        argv[1 + i] = Py_XNewRef(fc_hook_view_slot(v, e->slot_index[i]));
        held = i + 1;
        if (argv[1 + i] == NULL) {
            PyObject *name = e->slot_index[i] < v->code->co_nlocalsplus
                ? PyTuple_GET_ITEM(v->code->co_localsplusnames, e->slot_index[i]) : Py_None;
            PyErr_Format(PyExc_NameError, "fastcompile: slot %zd (%R) of %U is unbound", e->slot_index[i],
                         name, v->code->co_qualname);
            goto error;
        }
    }
    mode = Py_XNewRef(mode_get());
    if (mode_set(hook_paused) < 0) {
        goto error;
    }
    res = PyObject_Vectorcall(e->target, argv + 1, (size_t)n | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (mode_set(mode) < 0) {
        Py_CLEAR(res);
    }
    goto cleanup;
error:
    res = NULL;
cleanup:
    Py_XDECREF(mode);
    for (Py_ssize_t i = 0; i < held; i++) {
        Py_XDECREF(argv[1 + i]);
    }
    if (argv != small) {
        PyMem_Free(argv);
    }
    return res;
}

/* The warning of a frame whose compiled graph raised `err` where plain Python
 * ran (its first such call). code, err: borrowed. 0, or -1 with the exception
 * set (warnings turned into errors). */
static int
warn_fallback(PyCodeObject *code, PyObject *err)
{
    return PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                            "fastcompile: the compiled graph of %U (%U:%d) raised %s: %S, where the "
                            "function ran as plain Python; calls that meet this run as plain Python "
                            "(at its speed)", code->co_qualname, code->co_filename, code->co_firstlineno,
                            err != NULL ? Py_TYPE(err)->tp_name : "an error", err != NULL ? err : Py_None);
}

/* Runs entry `e` in place of `frame` and releases the frame. e: stolen. */
static PyObject *
run_entry(PyThreadState *tstate, FcFrame *frame, FcHookEntry *e, const FcHookView *v)
{
    PyObject *res;
    if (e->is_code) {
        PyCodeObject *code = FC_FRAME_CODE(frame);
        res = fc_hook_eval_shadow(tstate, frame, (PyCodeObject *)e->target, fc_hook_code_nargs(code),
                                  eval_default);
    }
    else {
        res = call_target(e, v);
        if (res == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
            /* The compiled graph raised (shapes that do not broadcast, ...). It has no
             * side effects, so the frame runs as plain Python instead: the exception,
             * its message and its traceback (the user's line) are Python's own, and
             * a case the core refuses but Python accepts still gets its result. That
             * last case runs at Python's speed: the first such call warns. */
            PyObject *et, *ev, *etb;      /* owned: the graph's error, for the warning */
            PyCodeObject *code = (PyCodeObject *)Py_NewRef(FC_FRAME_CODE(frame));
            PyErr_Fetch(&et, &ev, &etb);
            PyErr_NormalizeException(&et, &ev, &etb);
            res = eval_default(tstate, frame, 0);
            if (res != NULL && ++e->fallbacks == 1 && warn_fallback(code, ev) < 0) {
                Py_CLEAR(res);
            }
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(etb);
            Py_DECREF(code);
            Py_DECREF(e);
            return res;
        }
    }
    Py_DECREF(e);
    fc_hook_frame_release(tstate, frame);
    return res;
}

/* A cache miss in compile mode: ask callback(frame, cache_size) with this
 * thread's mode off, then act on its answer. callback: borrowed. */
static PyObject *
compile_frame(PyThreadState *tstate, FcFrame *frame, PyObject *callback, FcHookExtra *x, const FcHookView *v)
{
    PyCodeObject *code = FC_FRAME_CODE(frame);
    PyObject *cb = Py_NewRef(callback), *res = NULL, *argv[3] = {NULL, NULL, NULL};
    FrameObject *fobj = NULL;
    if ((fobj = PyObject_New(FrameObject, &Frame_Type)) == NULL) {
        goto error;
    }
    fobj->frame = frame;
    argv[1] = (PyObject *)fobj;
    if ((argv[2] = PyLong_FromSsize_t(x != NULL ? x->n : 0)) == NULL) {
        goto error;
    }
    if (mode_set(NULL) < 0) {
        goto error;
    }
    res = PyObject_Vectorcall(cb, argv + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    fobj->frame = NULL;
    if (mode_set(cb) < 0) {
        Py_CLEAR(res);
    }
    if (res == NULL) {
        goto error;
    }
    if (res == Py_None) {
        goto run_normally;
    }
    if (res == hook_skip || res == hook_run_only) {
        if ((x = fc_hook_extra_ensure(code)) == NULL) {
            goto error;
        }
        x->state = res == hook_skip ? FC_HOOK_STATE_SKIP : FC_HOOK_STATE_RUN_ONLY;
        goto run_normally;
    }
    if (!PyObject_TypeCheck(res, &FcHookEntry_Type)) {
        PyErr_Format(PyExc_TypeError,
                     "fastcompile hook callback must return None, SKIP, RUN_ONLY or a CacheEntry, not %.100s",
                     Py_TYPE(res)->tp_name);
        goto error;
    }
    FcHookEntry *e = (FcHookEntry *)res;
    if (fc_hook_entry_check(e, code) < 0 || (x = fc_hook_extra_ensure(code)) == NULL ||
            fc_hook_extra_push_front(x, e) < 0) {
        goto error;
    }
    Py_DECREF(cb);
    Py_DECREF(fobj);
    Py_DECREF(argv[2]);
    return run_entry(tstate, frame, e, v);   /* steals res */

run_normally:
    Py_DECREF(cb);
    Py_DECREF(fobj);
    Py_DECREF(argv[2]);
    Py_DECREF(res);
    return eval_default(tstate, frame, 0);
error:
    if (fobj != NULL) {
        fobj->frame = NULL;
    }
    Py_DECREF(cb);
    Py_XDECREF(fobj);
    Py_XDECREF(argv[2]);
    Py_XDECREF(res);
    fc_hook_frame_release(tstate, frame);
    return NULL;
}

static PyObject *
hook_eval(PyThreadState *tstate, FcFrame *frame, int throwflag)
{
    if (forwarding == frame) {          /* came back round a chain of eval functions */
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    PyObject *mode = mode_get();
    if (mode == NULL || mode == hook_paused || throwflag || !FC_FRAME_BY_THREAD(frame) || FC_FRAME_LOCALS_DICT(frame) != NULL) {
        return eval_default(tstate, frame, throwflag);
    }
    PyCodeObject *code = FC_FRAME_CODE(frame);
    if ((code->co_flags & hook_genflags) != 0 || !FC_FRAME_AT_START(frame)) {
        return eval_default(tstate, frame, throwflag);
    }
    FcHookExtra *x = fc_hook_extra_get(code);
    if (x != NULL && x->state == FC_HOOK_STATE_SKIP) {
        return eval_default(tstate, frame, throwflag);
    }
    FcHookView v;
    fc_hook_view_of(&v, frame);
    if (x != NULL && x->n > 0) {
        FcHookEntry *e = fc_hook_extra_lookup(x, &v);
        if (e != NULL) {
            return run_entry(tstate, frame, e, &v);
        }
        mode = mode_get();   /* a tensor guard may have run Python code */
        if (mode == NULL || mode == hook_paused) {
            return eval_default(tstate, frame, throwflag);
        }
    }
    if (mode == Py_False || (x != NULL && x->state == FC_HOOK_STATE_RUN_ONLY)) {
        return eval_default(tstate, frame, throwflag);
    }
    return compile_frame(tstate, frame, mode, x, &v);
}

/* ========================================================================
 * _C.Hooked: fn called with this thread's mode set to callback
 * ====================================================================== */

typedef struct {
    PyObject_HEAD
    PyObject *fn;           /* owned */
    PyObject *callback;     /* owned: None, False or a callable */
    vectorcallfunc vectorcall;
} HookedObject;

static int
check_mode(PyObject *cb)
{
    if (cb != Py_None && cb != Py_False && !PyCallable_Check(cb)) {
        PyErr_Format(PyExc_TypeError, "hook mode must be None, False or a callable, not %.100s",
                     Py_TYPE(cb)->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *
Hooked_vectorcall(HookedObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *prev = mode_get();
    PyObject *want = self->callback == Py_None ? NULL : self->callback;
    if (prev == want) {
        return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    }
    Py_XINCREF(prev);
    PyObject *res = NULL;
    if (mode_set(want) == 0) {
        res = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
        if (mode_set(prev) < 0) {
            Py_CLEAR(res);
        }
    }
    Py_XDECREF(prev);
    return res;
}

static PyObject *
Hooked_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"fn", "callback", NULL};
    PyObject *fn, *cb;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:Hooked", kwlist, &fn, &cb)) {
        return NULL;
    }
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "Hooked: fn must be callable");
        return NULL;
    }
    if (check_mode(cb) < 0) {
        return NULL;
    }
    HookedObject *self = (HookedObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->fn = Py_NewRef(fn);
    self->callback = Py_NewRef(cb);
    self->vectorcall = (vectorcallfunc)Hooked_vectorcall;
    return (PyObject *)self;
}

static int
Hooked_traverse(HookedObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    Py_VISIT(self->callback);
    return 0;
}

static int
Hooked_clear(HookedObject *self)
{
    Py_CLEAR(self->fn);
    Py_CLEAR(self->callback);
    return 0;
}

static void
Hooked_dealloc(HookedObject *self)
{
    PyObject_GC_UnTrack(self);
    Hooked_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Hooked_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
Hooked_repr(HookedObject *self)
{
    return PyUnicode_FromFormat("<fastcompile Hooked %R>", self->fn);
}

static PyObject *
Hooked_forward(HookedObject *self, void *name)
{
    return PyObject_GetAttrString(self->fn, (const char *)name);
}

static PyMemberDef Hooked_members[] = {
    {"fn", T_OBJECT, offsetof(HookedObject, fn), READONLY, "the wrapped callable"},
    {"__wrapped__", T_OBJECT, offsetof(HookedObject, fn), READONLY, "the wrapped callable"},
    {"callback", T_OBJECT, offsetof(HookedObject, callback), READONLY, "the mode: None, False or a callable"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Hooked_getset[] = {
    {"__name__", (getter)Hooked_forward, NULL, "fn.__name__", "__name__"},
    {"__qualname__", (getter)Hooked_forward, NULL, "fn.__qualname__", "__qualname__"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Hooked_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile._C.Hooked",
    .tp_basicsize = sizeof(HookedObject),
    .tp_dealloc = (destructor)Hooked_dealloc,
    .tp_vectorcall_offset = offsetof(HookedObject, vectorcall),
    .tp_repr = (reprfunc)Hooked_repr,
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Hooked(fn, callback): calls fn with this thread's hook mode set to callback "
              "(None: off, False: run-only, callable: compile), restoring the previous mode after.",
    .tp_traverse = (traverseproc)Hooked_traverse,
    .tp_clear = (inquiry)Hooked_clear,
    .tp_members = Hooked_members,
    .tp_getset = Hooked_getset,
    .tp_descr_get = Hooked_descr_get,
    .tp_new = Hooked_new,
};

/* ========================================================================
 * sentinels
 * ====================================================================== */

typedef struct {
    PyObject_HEAD
    const char *name;
} SentinelObject;

static PyObject *
Sentinel_repr(SentinelObject *self)
{
    return PyUnicode_FromFormat("fastcompile._C.%s", self->name);
}

static PyTypeObject Sentinel_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcompile._C.HookSentinel",
    .tp_basicsize = sizeof(SentinelObject),
    .tp_repr = (reprfunc)Sentinel_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

static PyObject *
sentinel_new(const char *name)
{
    SentinelObject *s = PyObject_New(SentinelObject, &Sentinel_Type);
    if (s != NULL) {
        s->name = name;
    }
    return (PyObject *)s;
}

/* ========================================================================
 * module functions
 * ====================================================================== */

static PyObject *
hook_set_eval_frame(PyObject *self, PyObject *cb)
{
    if (check_mode(cb) < 0) {
        return NULL;
    }
    PyObject *prev = mode_get();
    PyObject *res = Py_NewRef(prev != NULL && prev != hook_paused ? prev : Py_None);
    if (mode_set(cb) < 0) {
        Py_DECREF(res);
        return NULL;
    }
    return res;
}

static PyObject *
hook_eval_frame_installed(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(_PyInterpreterState_GetEvalFrameFunc(PyInterpreterState_Get()) == hook_eval);
}

/* A stand-in for another PEP 523 user (a debugger) to test chaining. */
static _PyFrameEvalFunction counting_prev;
static Py_ssize_t counting_calls;

static PyObject *
counting_eval(PyThreadState *tstate, FcFrame *frame, int throwflag)
{
    counting_calls++;
    return counting_prev != NULL ? counting_prev(tstate, frame, throwflag)
                                 : _PyEval_EvalFrameDefault(tstate, frame, throwflag);
}

static PyObject *
hook_test_counting_eval(PyObject *self, PyObject *flag)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction cur = _PyInterpreterState_GetEvalFrameFunc(interp);
    int above = PyUnicode_Check(flag) && PyUnicode_CompareWithASCIIString(flag, "above") == 0;
    if ((flag == Py_True || above) && cur != counting_eval) {
        if (active_threads > 0 && !above) {
            PyErr_SetString(PyExc_RuntimeError, "install the counting eval function outside hooked calls");
            return NULL;
        }
        counting_prev = cur == _PyEval_EvalFrameDefault ? NULL : cur;
        _PyInterpreterState_SetEvalFrameFunc(interp, counting_eval);
    }
    else if (flag == Py_False && cur == counting_eval) {
        _PyInterpreterState_SetEvalFrameFunc(interp,
                                             counting_prev != NULL ? counting_prev : _PyEval_EvalFrameDefault);
    }
    return PyLong_FromSsize_t(counting_calls);
}

static PyMethodDef hook_methods[] = {
    {"set_eval_frame", hook_set_eval_frame, METH_O,
     "set_eval_frame(callback) -> previous: this thread's hook mode (None off, False run-only, "
     "callable compile)"},
    {"_eval_frame_installed", hook_eval_frame_installed, METH_NOARGS,
     "whether the hook is the interpreter's eval function (tests)"},
    {"_test_counting_eval", hook_test_counting_eval, METH_O,
     "install (True) / remove (False) / keep (None) a counting PEP 523 function; returns its count (tests); "
     "'above' installs it even on top of the hook, chaining to it, as torch's Dynamo shim does"},
    {NULL, NULL, 0, NULL},
};

int
fc_hook_init(PyObject *m)
{
    if (!PyThread_tss_is_created(&mode_key) && PyThread_tss_create(&mode_key) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "fastcompile: cannot create the hook's thread-local key");
        return -1;
    }
    if (PyType_Ready(&Frame_Type) < 0 || PyType_Ready(&Hooked_Type) < 0 || PyType_Ready(&Sentinel_Type) < 0) {
        return -1;
    }
    if (hook_skip == NULL && ((hook_skip = sentinel_new("SKIP")) == NULL ||
                              (hook_run_only = sentinel_new("RUN_ONLY")) == NULL ||
                              (hook_paused = sentinel_new("PAUSED")) == NULL)) {
        Py_CLEAR(hook_skip);
        Py_CLEAR(hook_run_only);
        return -1;
    }
    if (fc_hook_guards_init(m) < 0 || fc_hook_cache_init(m) < 0 || fc_hook_adapter_init(m) < 0 ||
            PyModule_AddObjectRef(m, "Frame", (PyObject *)&Frame_Type) < 0 ||
            PyModule_AddObjectRef(m, "Hooked", (PyObject *)&Hooked_Type) < 0 ||
            PyModule_AddObjectRef(m, "SKIP", hook_skip) < 0 ||
            PyModule_AddObjectRef(m, "RUN_ONLY", hook_run_only) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(m, hook_methods);
}
