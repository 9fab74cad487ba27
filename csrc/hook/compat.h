/* Hook compat: every CPython-version-specific access to an interpreter frame.
 * In: a _PyInterpreterFrame handed to the PEP 523 hook. Out: its code, function,
 * slots and state through FC_FRAME_* macros; frame push/clear/pop (compat.c).
 *
 * Only eval_frame.c and compat.c include this header (it pulls in CPython's
 * Py_BUILD_CORE headers); guards.c and cache.c see frames through FcHookView. */
#ifndef FC_HOOK_COMPAT_H
#define FC_HOOK_COMPAT_H

#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
#error "fastcompile hook: compat.h/compat.c cover CPython 3.11, 3.12 and 3.13 only; re-check the copied internals in compat.c for this version"
#endif

#define Py_BUILD_CORE
#if PY_VERSION_HEX >= 0x030C0000
#undef _PyGC_FINALIZED   /* core and non-core headers disagree (cpython#105268) */
#endif
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

#include "hook.h"

typedef struct _PyInterpreterFrame FcFrame;

#if PY_VERSION_HEX >= 0x030D0000
#define FC_FRAME_CODE(f)      ((PyCodeObject *)(f)->f_executable)
#define FC_FRAME_FUNC(f)      ((PyFunctionObject *)(f)->f_funcobj)
#define FC_FRAME_LASTI(f)     ((int)((f)->instr_ptr - _PyCode_CODE(FC_FRAME_CODE(f))))
#define FC_FRAME_AT_START(f)  ((f)->instr_ptr == _PyCode_CODE(FC_FRAME_CODE(f)))
#elif PY_VERSION_HEX >= 0x030C0000
#define FC_FRAME_CODE(f)      ((f)->f_code)
#define FC_FRAME_FUNC(f)      ((PyFunctionObject *)(f)->f_funcobj)
#define FC_FRAME_LASTI(f)     ((int)((f)->prev_instr - _PyCode_CODE(FC_FRAME_CODE(f))))
#define FC_FRAME_AT_START(f)  ((f)->prev_instr == _PyCode_CODE(FC_FRAME_CODE(f)) - 1)
#else
#define FC_FRAME_CODE(f)      ((f)->f_code)
#define FC_FRAME_FUNC(f)      ((f)->f_func)
#define FC_FRAME_LASTI(f)     ((int)((f)->prev_instr - _PyCode_CODE(FC_FRAME_CODE(f))))
#define FC_FRAME_AT_START(f)  ((f)->prev_instr == _PyCode_CODE(FC_FRAME_CODE(f)) - 1)
#endif

#define FC_FRAME_GLOBALS(f)     ((f)->f_globals)
#define FC_FRAME_BUILTINS(f)    ((f)->f_builtins)
#define FC_FRAME_LOCALS_DICT(f) ((f)->f_locals)
#define FC_FRAME_SLOTS(f)       ((f)->localsplus)
#define FC_FRAME_BY_THREAD(f)   ((f)->owner == FRAME_OWNED_BY_THREAD)

/* A view of `f` for guards (hook.h). Everything borrowed from the frame. */
static inline void
fc_hook_view_of(FcHookView *v, FcFrame *f)
{
    PyFunctionObject *fn = FC_FRAME_FUNC(f);
    v->code = FC_FRAME_CODE(f);
    v->slots = FC_FRAME_SLOTS(f);
    v->closure = (fn->func_closure != NULL && fn->func_closure != Py_None) ? fn->func_closure : NULL;
    v->globals = FC_FRAME_GLOBALS(f);
    v->builtins = FC_FRAME_BUILTINS(f);
}

/* The hook ran neither `frame` nor handed it to the interpreter (a cache hit, or
 * an error): release it the way this version needs. 3.11: nothing, the caller
 * (_PyEval_Vector) clears and pops it. 3.12+: clear its references and pop it
 * off the thread's data stack (the eval function owns it). frame: must be the
 * top frame of the thread's data stack and never linked as current frame. */
FC_INTERNAL void fc_hook_frame_release(PyThreadState *tstate, FcFrame *frame);

/* Runs `code` in place of frame's code: a clone of the frame's function with
 * `code` (same globals, builtins, defaults, kwdefaults, closure), a shadow frame
 * pushed above `frame` with the first `ncopy` slots (the arguments) copied, then
 * `eval` on it; the shadow is cleared and popped on every path. `frame` itself
 * is left alone (the caller releases it). code: borrowed, layout already
 * checked. Returns: new reference, or NULL with an exception set. */
FC_INTERNAL PyObject *fc_hook_eval_shadow(PyThreadState *tstate, FcFrame *frame, PyCodeObject *code,
                                          int ncopy, _PyFrameEvalFunction eval);

#endif
