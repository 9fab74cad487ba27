"""Trace stage: symbolic execution of a Python frame (NumPy/torch code) into
fastcompile graphs, guards and graph breaks. In: a frame's code, globals,
builtins, closure and bound locals; out: a TraceResult.

    r = trace_function(fn, *args)
    r.target(*[value of each slot in r.slots])   # == fn(*args), one compiled graph
    r.program                                    # flat guard program (guards.py)
"""

import inspect
import sys

from . import graph_call, guards, resume, sources
from .frame import localsplus_names
from .graph_call import GraphInfo, graph_info
from .helpers import NeedAutograd
from .interp import Tracer
from .variables import Unsupported

SUPPORTED_PYTHONS = ((3, 11), (3, 12))  # bytecode the interpreter loop knows

__all__ = [
    "trace_frame",
    "trace_function",
    "TraceResult",
    "GraphInfo",
    "BreakReason",
    "Unsupported",
    "EntryInfo",
    "reset",
    "guards",
]


class BreakReason:
    """reason: str; user_stack: list of (filename, lineno, funcname, source_line)."""

    def __init__(self, reason, user_stack):
        self.reason, self.user_stack = reason, list(user_stack)

    def __repr__(self):
        where = "%s:%d" % self.user_stack[-1][:2] if self.user_stack else "?"
        return "BreakReason(%r at %s)" % (self.reason, where)


class TraceResult:
    """graphs, guards, program, breaks; target + slots when the whole frame
    traced; code (the transformed code object) when a break resumes."""

    def __init__(self):
        self.graphs, self.guards, self.program, self.breaks = [], [], [], []
        self.target, self.slots, self.code = None, (), None

    def __repr__(self):
        return "TraceResult(graphs=%d, breaks=%r, guards=%d, target=%s, code=%s)" % (
            len(self.graphs),
            self.breaks,
            len(self.guards),
            self.target is not None,
            self.code is not None,
        )


def _rng_state():
    """torch's CPU generator state (and each initialized CUDA device's), or None without torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state):
    if state is not None:
        import torch

        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state_all(state[1])


def trace_frame(code, f_globals, f_builtins, closure, f_locals, fullgraph=False):
    """Trace one frame. f_locals: name -> value of the bound fast locals (args
    included) and of the free variables; closure: the function's cells."""
    result = TraceResult()
    if sys.version_info[:2] not in SUPPORTED_PYTHONS:
        why = "fastcompile's tracer reads CPython %s bytecode, not %d.%d: the frame runs as plain Python" % (
            " and ".join("%d.%d" % v for v in SUPPORTED_PYTHONS),
            *sys.version_info[:2],
        )
        stack = [(code.co_filename, code.co_firstlineno, code.co_name, "")]
        if fullgraph:
            raise Unsupported(why, stack)
        result.breaks.append(BreakReason(why, stack))
        return result
    tracer = Tracer(code, f_globals, f_builtins, closure, f_locals)
    rng = _rng_state()
    try:
        try:
            ret = tracer.run()
        except NeedAutograd as need:
            # a tensor that requires grad: trace again, recording torch ops for aot_autograd
            tracer = Tracer(code, f_globals, f_builtins, closure, f_locals, autograd=True)
            try:
                ret = tracer.run()
            except Unsupported as fx_error:
                if not need.optional:
                    raise
                # autograd mode was only preferred (convolutions under no_grad) and cannot trace
                # this frame whole: the core way; where that needs
                # autograd mode after all, the frame breaks where autograd mode stopped
                _set_rng_state(rng)
                fx_tracer = tracer
                tracer = Tracer(code, f_globals, f_builtins, closure, f_locals, core_only=True)
                try:
                    ret = tracer.run()
                except NeedAutograd:
                    tracer = fx_tracer
                    raise fx_error from None
        run = graph_call.build(tracer, [ret])
    except Unsupported as e:
        if fullgraph:
            raise
        result.breaks.append(BreakReason(e.reason, e.user_stack))
        result.guards = guards.dedupe(tracer.guards)
        result.program = guards.compile_program(result.guards)
        if e.whole_frame:
            resume.give_up(result, "it applies to the whole frame")
        else:
            resume.resume_after_break(result, code, f_globals, f_builtins, closure, f_locals, tracer)
        return result
    finally:
        if tracer.fx is not None:
            # an autograd trace runs nothing of its graph at the call (the backend compiles the
            # FX graph, or the graph up to a break, and runs it): what its example computations
            # and a first, non-autograd attempt drew (a dropout inside an extern module) is not
            # the call's, so the generator goes back and the call draws as eager does
            _set_rng_state(rng)

    def target(*values):
        return run(*values)[0]

    result.target, result.slots = run.fast_target or target, run.slots
    result.graphs = graph_info(tracer, run)
    result.guards = guards.dedupe(tracer.guards)
    result.program = guards.compile_program(result.guards)
    return result


class EntryInfo:
    """Kept on the hook's CacheEntry for reports: the trace result and, per guard
    program instruction, the guard it serves."""

    def __init__(self, result):
        self.result = result
        self.guards = guards.dedupe(result.guards)
        self.owners = []
        program = guards.compile_program(self.guards, self.owners)
        assert program == list(result.program), "guard program out of step with its guards"

    def describe_failure(self, index, frame):
        """'guard: expected ..., got ...' for instruction `index` of the program, read on
        `frame` (a hook Frame: f_code, f_locals, f_globals, f_builtins, closure)."""
        if index < 0 or index >= len(self.owners):
            return "no guard failed (entry #%d)" % index
        g = self.guards[self.owners[index]]
        names = localsplus_names(frame.f_code)
        by_slot = {i: frame.f_locals[n] for i, n in enumerate(names) if n in frame.f_locals}
        try:
            actual = sources.evaluate(g.source, by_slot, frame.f_globals, frame.f_builtins, frame.closure)
        except Exception as exc:  # a report must not fail the frame
            actual = "unreadable (%s)" % type(exc).__name__
        else:
            actual = guards.describe_actual(g, actual)
        return "guard failed: %s; now %s" % (g.describe(), actual)


def reset():
    """Forget the resume functions built so far."""
    resume.reset()


def bind_locals(fn, args, kwargs):
    """name -> value of fn's fast locals at frame start, as a call binds them."""
    sig = inspect.signature(fn)
    b = sig.bind(*args, **kwargs)
    b.apply_defaults()
    f_locals = dict(b.arguments)
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            f_locals[name] = cell.cell_contents
        except ValueError:
            pass
    return f_locals


def slot_values(fn, args, kwargs, slots):
    """The values of the given localsplus slots for a call fn(*args, **kwargs)."""
    f_locals = bind_locals(fn, args, kwargs)
    names = localsplus_names(fn.__code__)
    return [f_locals[names[s]] for s in slots]


def trace_function(fn, *args, fullgraph=False, **kwargs):
    """trace_frame for a call fn(*args, **kwargs) (defaults, *args, **kwargs bound as a call does)."""
    f_locals = bind_locals(fn, args, kwargs)
    b = fn.__globals__.get("__builtins__", __builtins__)
    return trace_frame(fn.__code__, fn.__globals__, b, fn.__closure__, f_locals, fullgraph=fullgraph)
