/* Hook compat: our own versions of the non-exported CPython frame helpers
 * (push a frame, clear and pop a frame, hand a frame to its frame object), one
 * section per CPython minor. In: frames from the hook. Out: frames released.
 *
 * Written against CPython 3.11.7 (Python/frame.c, Python/pystate.c,
 * Python/ceval.c), 3.12.1 and 3.13.0. None of these are PyAPI_FUNC before
 * 3.13 (libpython is built with -fvisibility=hidden), so the logic is redone
 * here; re-check every section when a new minor version is added. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "compat.h"

#if PY_VERSION_HEX >= 0x030E0000 || PY_VERSION_HEX < 0x030B0000
#error "fastcompile hook: compat.c has no frame helpers for this CPython version"
#endif

/* ========================================================================
 * data stack (all versions): the allocator behind _PyObject_VirtualAlloc
 * ====================================================================== */

#define FC_DATA_STACK_CHUNK_SIZE (16 * 1024)
#define FC_MINIMUM_OVERHEAD 1000

static _PyStackChunk *
compat_allocate_chunk(int size_in_bytes, _PyStackChunk *previous)
{
    PyObjectArenaAllocator arena;
    PyObject_GetArenaAllocator(&arena);
    _PyStackChunk *res = arena.alloc(arena.ctx, (size_t)size_in_bytes);
    if (res == NULL) {
        return NULL;
    }
    res->previous = previous;
    res->size = size_in_bytes;
    res->top = 0;
    return res;
}

/* pystate.c push_chunk: a new chunk big enough for `size` slots. */
static PyObject **
compat_push_chunk(PyThreadState *tstate, int size)
{
    int allocate_size = FC_DATA_STACK_CHUNK_SIZE;
    while (allocate_size < (int)sizeof(PyObject *) * (size + FC_MINIMUM_OVERHEAD)) {
        allocate_size *= 2;
    }
    _PyStackChunk *chunk = compat_allocate_chunk(allocate_size, tstate->datastack_chunk);
    if (chunk == NULL) {
        return NULL;
    }
    if (tstate->datastack_chunk != NULL) {
        tstate->datastack_chunk->top = tstate->datastack_top - &tstate->datastack_chunk->data[0];
    }
    tstate->datastack_chunk = chunk;
    tstate->datastack_limit = (PyObject **)(((char *)chunk) + allocate_size);
    /* a root chunk skips its first slot so that popping never frees it */
    PyObject **res = &chunk->data[chunk->previous == NULL];
    tstate->datastack_top = res + size;
    return res;
}

/* _PyThreadState_BumpFramePointer (3.11) / _PyThreadState_PushFrame (3.12+). */
static FcFrame *
compat_push_frame(PyThreadState *tstate, int size)
{
    if (tstate->datastack_top != NULL && size < tstate->datastack_limit - tstate->datastack_top) {
        FcFrame *res = (FcFrame *)tstate->datastack_top;
        tstate->datastack_top += size;
        return res;
    }
    FcFrame *res = (FcFrame *)compat_push_chunk(tstate, size);
    if (res == NULL) {
        PyErr_NoMemory();
    }
    return res;
}

#if PY_VERSION_HEX < 0x030D0000
static void
compat_free_chunk(_PyStackChunk *chunk)
{
    PyObjectArenaAllocator arena;
    PyObject_GetArenaAllocator(&arena);
    arena.free(arena.ctx, chunk, chunk->size);
}

/* _PyThreadState_PopFrame (exported from 3.13 on). */
static void
compat_pop_frame(PyThreadState *tstate, FcFrame *frame)
{
    PyObject **base = (PyObject **)frame;
    assert(tstate->datastack_chunk != NULL);
    if (base == &tstate->datastack_chunk->data[0]) {
        _PyStackChunk *chunk = tstate->datastack_chunk;
        _PyStackChunk *previous = chunk->previous;
        assert(previous != NULL);   /* the root chunk is never popped */
        tstate->datastack_top = &previous->data[previous->top];
        tstate->datastack_chunk = previous;
        tstate->datastack_limit = (PyObject **)(((char *)previous) + previous->size);
        compat_free_chunk(chunk);
    }
    else {
        assert(tstate->datastack_top >= base);
        tstate->datastack_top = base;
    }
}
#else
#define compat_pop_frame _PyThreadState_PopFrame
#endif

/* ========================================================================
 * function with a new code object (no CPython counterpart)
 * ====================================================================== */

/* A clone of `fn` running `code`. fn, code: borrowed; returns: new reference. */
static PyFunctionObject *
compat_function_with_code(PyFunctionObject *fn, PyCodeObject *code)
{
    PyFunctionObject *res = (PyFunctionObject *)PyFunction_New((PyObject *)code, fn->func_globals);
    if (res == NULL) {
        goto error;
    }
    Py_SETREF(res->func_builtins, Py_NewRef(fn->func_builtins));
    if ((fn->func_defaults != NULL && PyFunction_SetDefaults((PyObject *)res, fn->func_defaults) < 0) ||
            (fn->func_kwdefaults != NULL &&
             PyFunction_SetKwDefaults((PyObject *)res, fn->func_kwdefaults) < 0) ||
            (fn->func_closure != NULL && PyFunction_SetClosure((PyObject *)res, fn->func_closure) < 0)) {
        goto error;
    }
    return res;
error:
    Py_XDECREF(res);
    return NULL;
}

/* ========================================================================
 * 3.11: Python/frame.c _PyFrame_Clear and take_ownership. Only shadow frames
 * (which ran in the eval loop as entry frames, so the loop did not clear them)
 * come here; the original frame is cleared by _PyEval_Vector.
 * ====================================================================== */

#if PY_VERSION_HEX < 0x030C0000

/* The frame object `f` outlives `frame`: move the frame's data into it. */
static void
compat_take_ownership(PyThreadState *tstate, PyFrameObject *f, FcFrame *frame)
{
    Py_ssize_t size = ((char *)&frame->localsplus[frame->stacktop]) - (char *)frame;
    memcpy((FcFrame *)f->_f_frame_data, frame, (size_t)size);
    frame = (FcFrame *)f->_f_frame_data;
    f->f_frame = frame;
    frame->owner = FRAME_OWNED_BY_FRAME_OBJECT;
    if (_PyFrame_IsIncomplete(frame)) {
        PyCodeObject *code = frame->f_code;
        frame->prev_instr = _PyCode_CODE(code) + code->_co_firsttraceable;
    }
    FcFrame *prev = frame->previous;
    while (prev != NULL && _PyFrame_IsIncomplete(prev)) {
        prev = prev->previous;
    }
    frame->previous = NULL;
    if (prev != NULL && f->f_back == NULL) {
        /* CPython makes prev's frame object here (_PyFrame_MakeAndSetFrameObject,
         * hidden). prev is the frame that called the hooked function, i.e. the
         * thread's current frame, whose object PyEval_GetFrame() makes; any
         * other frame keeps f_back NULL unless it already has an object. */
        PyFrameObject *back = prev->frame_obj;
        if (back == NULL && prev == tstate->cframe->current_frame) {
            back = PyEval_GetFrame();   /* borrowed; NULL only on memory error */
            if (back == NULL) {
                PyErr_Clear();
            }
        }
        f->f_back = (PyFrameObject *)Py_XNewRef(back);
    }
    if (!PyObject_GC_IsTracked((PyObject *)f)) {
        PyObject_GC_Track((PyObject *)f);
    }
}

static void
compat_clear_and_pop(PyThreadState *tstate, FcFrame *frame)
{
    if (frame->frame_obj != NULL) {
        PyFrameObject *f = frame->frame_obj;
        frame->frame_obj = NULL;
        if (Py_REFCNT(f) > 1) {
            compat_take_ownership(tstate, f, frame);
            Py_DECREF(f);
            compat_pop_frame(tstate, frame);
            return;
        }
        Py_DECREF(f);
    }
    for (int i = 0; i < frame->stacktop; i++) {
        Py_XDECREF(frame->localsplus[i]);
    }
    Py_XDECREF(frame->f_locals);
    Py_DECREF(frame->f_func);
    Py_DECREF(frame->f_code);
    compat_pop_frame(tstate, frame);
}

void
fc_hook_frame_release(PyThreadState *tstate, FcFrame *frame)
{
    (void)tstate;
    (void)frame;
}

PyObject *
fc_hook_eval_shadow(PyThreadState *tstate, FcFrame *frame, PyCodeObject *code, int ncopy,
                    _PyFrameEvalFunction eval)
{
    PyFunctionObject *fn = compat_function_with_code(frame->f_func, code);
    if (fn == NULL) {
        return NULL;
    }
    int size = code->co_nlocalsplus + code->co_stacksize + (int)FRAME_SPECIALS_SIZE;
    FcFrame *shadow = compat_push_frame(tstate, size);
    if (shadow == NULL) {
        Py_DECREF(fn);
        return NULL;
    }
    _PyFrame_InitializeSpecials(shadow, fn, NULL, code->co_nlocalsplus);   /* steals fn */
    for (int i = 0; i < code->co_nlocalsplus; i++) {
        shadow->localsplus[i] = i < ncopy ? Py_XNewRef(frame->localsplus[i]) : NULL;
    }
    PyObject *res = eval(tstate, shadow, 0);
    compat_clear_and_pop(tstate, shadow);
    return res;
}

#else

/* ========================================================================
 * 3.12 / 3.13: the eval loop clears and pops the frames it runs (the shadow);
 * the hook clears and pops the original when it does not run it.
 * ====================================================================== */

#if PY_VERSION_HEX < 0x030D0000
/* ceval.c clear_thread_frame + frame.c _PyFrame_ClearExceptCode (3.12). The
 * original frame was never linked as the current frame, so nothing can have
 * made a frame object for it: frame_obj is NULL and no ownership moves. */
static void
compat_clear_and_pop(PyThreadState *tstate, FcFrame *frame)
{
    assert(frame->owner == FRAME_OWNED_BY_THREAD);
    assert(frame->frame_obj == NULL);
    Py_CLEAR(frame->frame_obj);
    for (int i = 0; i < frame->stacktop; i++) {
        Py_XDECREF(frame->localsplus[i]);
    }
    Py_XDECREF(frame->f_locals);
    Py_DECREF(frame->f_funcobj);
    Py_DECREF(frame->f_code);
    compat_pop_frame(tstate, frame);
}
#else
/* Exported in 3.13 (declared in internal/pycore_ceval.h, which we do not pull in). */
PyAPI_FUNC(void) _PyEval_FrameClearAndPop(PyThreadState *tstate, _PyInterpreterFrame *frame);
#define compat_clear_and_pop _PyEval_FrameClearAndPop
#endif

void
fc_hook_frame_release(PyThreadState *tstate, FcFrame *frame)
{
    compat_clear_and_pop(tstate, frame);
}

PyObject *
fc_hook_eval_shadow(PyThreadState *tstate, FcFrame *frame, PyCodeObject *code, int ncopy,
                    _PyFrameEvalFunction eval)
{
    PyFunctionObject *fn = compat_function_with_code(FC_FRAME_FUNC(frame), code);
    if (fn == NULL) {
        return NULL;
    }
    FcFrame *shadow = compat_push_frame(tstate, code->co_framesize);
    if (shadow == NULL) {
        Py_DECREF(fn);
        return NULL;
    }
    _PyFrame_Initialize(shadow, fn, NULL, code, ncopy);   /* steals fn; NULLs slots from ncopy */
    for (int i = 0; i < ncopy; i++) {
        shadow->localsplus[i] = Py_XNewRef(frame->localsplus[i]);
    }
    return eval(tstate, shadow, 0);   /* the eval loop clears and pops the shadow */
}

#endif
