"""Trace stage, interpreter: symbolic execution of one frame's bytecode
(CPython 3.11 and 3.12) into a graph, guards and, at an unsupported point, a
break. In: code, globals, builtins, closure, bound locals; out: the final
state (return value or the stack and locals at the break)."""
import builtins as _builtins
import contextlib
import dis
import enum
import linecache
import math
import numbers
import functools
import inspect
import operator
import sys
import threading
import types

import numpy as np

from fastcompile._common import hashable as _hashable, torch_numpy_dtypes

from fastcompile import config as _config
from fastcompile.graph import Graph

from . import guards as G
from . import numpy_ops as NP
from . import sources as S
from .variables import (NULL, ArrayMethodVar, ArrayVar, CellVar, DictVar, FuncVar, IterVar,
                        ListVar, MethodVar, PyVar, ScalarVar, ShapeVar, TupleVar, Unsupported, Var,
                        AbsentAttribute)

# torch is bound by _sync_torch() once the process has imported it: importing fastcompile never
# imports torch (over a second), and a frame can hold torch objects only after the user's code
# imported it. None on NumPy-only installs, and until then.
torch = None
TORCH_TO_NP = {}

MAX_STEPS = 200000
_DEBUG = bool(__import__('os').environ.get('FC_TRACE_DEBUG'))
SCALARS = (type(None), bool, int, float, str, bytes)
FOLDABLE_BUILTINS = {
    len, range, isinstance, issubclass, abs, min, max, int, float, bool, str, tuple, list, dict,
    enumerate, zip, reversed, sorted, getattr, hasattr, type, round, divmod, pow, sum, any, all,
    slice, iter, callable, hash, repr, format, id,
}
FOLDABLE_MODULES = ("math", "operator", "functools", "itertools")


class NeedAutograd(Exception):
    """A tensor that requires grad reached the trace while grad mode is on (or a torch op the core
    graph cannot hold, such as torch.zeros): the frame is traced again in autograd mode, where
    torch-level ops are recorded as an FX graph for aot_autograd and the torch backend.
    optional: the core route could trace it too, only worse (a module holding convolutions, see
    Tracer.wrap); where autograd mode cannot trace the frame, it is traced the core way."""

    def __init__(self, optional=False):
        super().__init__()
        self.optional = optional


class Stop(Exception):
    """Raised when the top frame reaches the break instruction on a restart."""

    def __init__(self, frame):
        self.frame = frame


def localsplus_names(code):
    names, i = [], 0
    while True:
        try:
            names.append(code._varname_from_oparg(i))
        except (IndexError, ValueError):
            return names
        i += 1


def protected_offsets(code):
    """Offsets covered by the exception table (try/except/with bodies)."""
    out = set()
    instrs = list(dis.get_instructions(code))
    for e in dis._parse_exception_table(code):
        if _cleanup_only(instrs, e.target):
            continue                        # 3.12 inlined comprehension: restores a local, reraises
        out.update(range(e.start, e.end, 2))
    return out


def _cleanup_only(instrs, target):
    started = False
    for ins in instrs:
        if ins.offset == target:
            started = True
        if started:
            if ins.opname in ("PUSH_EXC_INFO", "WITH_EXCEPT_START", "CHECK_EXC_MATCH"):
                return False
            if ins.opname == "RERAISE":
                return True
    return False


def const_ok(v):
    if isinstance(v, tuple):
        return all(const_ok(x) for x in v)
    return type(v) in SCALARS


class Frame:
    def __init__(self, code, f_globals, f_builtins, parent, top=False):
        self.code, self.f_globals, self.f_builtins, self.parent, self.top = \
            code, f_globals, f_builtins, parent, top
        self.instrs = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "EXTENDED_ARG")]
        self.index_of = {ins.offset: k for k, ins in enumerate(self.instrs)}
        self.protected = protected_offsets(code)
        self.locals = {}        # name -> Var (fast locals)
        self.cells = {}         # name -> CellVar (cellvars and freevars)
        self.stack = []
        self.pc = 0
        self.kw_names = None
        self.lineno = code.co_firstlineno

    def user_stack(self):
        out, f = [], self
        while f is not None:
            line = linecache.getline(f.code.co_filename, f.lineno).strip()
            out.append((f.code.co_filename, f.lineno, f.code.co_name, line))
            f = f.parent
        return out[::-1]


class Tracer:
    """One trace of one frame. stop_at: index of the top-frame instruction to
    stop before (a restart after a break)."""

    def __init__(self, code, f_globals, f_builtins, closure, f_locals, stop_at=None, autograd=False,
                 core_only=False):
        _sync_torch()
        self.core_only = core_only  # no optional switch to autograd mode (NeedAutograd.optional)
        self.code, self.f_globals, self.closure = code, f_globals, closure or ()
        self.f_builtins = f_builtins if isinstance(f_builtins, dict) else vars(f_builtins or _builtins)
        self.f_locals, self.stop_at = f_locals, stop_at
        self.graph = Graph()
        self.inputs = []            # (source, kind, example) per graph input
        self.scalar_exprs = []      # the ScalarVars of float arithmetic (scalar_op), in trace order
        self.extern_results = []    # per extern of the graph, in order: (eager result, run function,
        #                             its array arguments' examples), from tracing
        self.arrays = {}            # (id(array), source), autograd mode id(array) -> ArrayVar of inputs
        self.keep = []              # objects whose id is a key above
        self.guards = []
        self.wrapped = {}           # source -> Var
        self.op_count = 0
        self.lines = []             # (filename, lineno) of each op
        self.steps = 0
        self.slots = {n: i for i, n in enumerate(localsplus_names(code))}
        # autograd mode: every torch op is recorded as a node of an FX graph, which runs through
        # aot_autograd and the core (forward and backward) instead of the core graph above
        self.autograd = autograd
        if autograd:
            import torch.fx
        self.fx = torch.fx.Graph() if autograd else None
        self.fx_placeholders = []
        if autograd:
            self.guard(S.CallSource(torch.is_grad_enabled), "eq", torch.is_grad_enabled())
        # the core route's eager runs, in order: (function, argument examples, result). A restart
        # after a graph break (codegen.resume_after_break) replays them instead of running them
        # again: an extern with side effects (BatchNorm in training mode under no_grad updates
        # its running statistics) ran twice on the first call
        self.eager_log = []
        self.replay = None

    # ------------------------------------------------------------------ errors

    def unsupported(self, reason, whole_frame=False):
        raise Unsupported(reason, self.frame.user_stack(), whole_frame)

    # ------------------------------------------------------------------ wrapping frame values

    def guard(self, source, kind, *args):
        if source is not None:
            self.guards.append(G.Guard(source, kind, *args))

    def wrap(self, value, source, constant=False):
        """A Var for a value read from the frame, with the guards it needs. constant: a float
        is baked in (a module's attribute: math.pi), not read at each call."""
        if source is not None and source in self.wrapped:
            return self.wrapped[source]
        var = self._wrap(value, source, constant)
        if source is not None:
            self.wrapped[source] = var
        return var

    def _wrap(self, value, source, constant=False):
        t = type(value)
        if t is np.ndarray:
            return self.array_input(value, source, "numpy")
        if torch is not None and isinstance(value, torch.Tensor):
            return self.array_input(value, source, "torch")
        if (t is float or t in _NP_FLOATS) and source is not None and not constant and self.fx is None \
                and not _config.get("specialize_float"):
            # read at each call (a learning rate, a time step, x.max() across a graph break): a
            # new value is no recompile. Where the trace needs its value (a branch, a shape, a
            # call into Python) py() specializes it
            var = ScalarVar(value, source)
            self.guard(source, "type", t)
            var.type_guard = self.guards[-1]
            return var
        if t in SCALARS:
            self.guard(source, "eq", value)
            return PyVar(value, source)
        if t is tuple:
            self.guard(source, "type", tuple)
            self.guard(source, "len", len(value))
            return TupleVar([self.wrap(v, S.ItemSource(source, i) if source else None)
                             for i, v in enumerate(value)], source)
        if t is list:
            if source is None:
                return ListVar([self.wrap(v, None) for v in value])
            self.guard(source, "type", list)
            snapshot = list(value)          # the items as read now; the trace mutates no outside list

            def items():                    # on the first read of the items or length (ListVar)
                self.guard(source, "len", len(snapshot))
                return [self.wrap(v, S.ItemSource(source, i)) for i, v in enumerate(snapshot)]
            return ListVar((), source, loader=items)
        if t is dict:
            if source is None:
                if not all(type(k) in (str, int) for k in value):
                    self.unsupported("dict with non-str/int keys")
                return DictVar({k: self.wrap(v, None) for k, v in value.items()})
            self.guard(source, "type", dict)
            snapshot = dict(value)          # as ListVar's: read at the first use of the items

            def entries():
                self.guard(source, "len", len(snapshot))
                if not all(type(k) in (str, int) for k in snapshot):
                    self.unsupported("dict with non-str/int keys")
                return {k: self.wrap(v, S.ItemSource(source, k)) for k, v in snapshot.items()}
            return DictVar((), source, loader=entries)
        if isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type,
                              np.ufunc, np.dtype)) or value is Ellipsis:
            self.guard(source, "id", value)
            return PyVar(value, source)
        if torch is not None and isinstance(value, torch.nn.Module):
            if self.fx is None and any(p.requires_grad for p in value.parameters()):
                if torch.is_grad_enabled():
                    # it trains: traced for autograd from the start, before anything of it runs
                    # eagerly here (a BatchNorm ahead of the first parameter updated its running
                    # statistics once in this attempt and again in the autograd trace)
                    raise NeedAutograd()
                # traced under no_grad, its parameters data: only while grad stays off. Without
                # this guard a call with grad on ran this graph, which raised (.numpy() of a
                # tensor that requires grad), and the frame ran as plain Python at every call:
                # a model called once under no_grad (a warm-up, an evaluation) then trained eagerly
                self.guard(S.CallSource(torch.is_grad_enabled), "eq", False)
            if self.fx is None and not self.core_only and not self.eager_log and _holds_convolutions(value):
                # under no_grad too, a module with convolutions goes the torch backend's way
                # (aot_autograd's inference graph): convolutions channels_last, BatchNorm
                # decomposed and fused with them. The core route calls each module's forward
                # as one opaque extern (NCHW). Only before anything ran eagerly here: an extern
                # BatchNorm in training mode would otherwise update its statistics twice
                raise NeedAutograd(optional=True)
            self.guard(source, "id", value)
            if source is not None:
                self.guard(S.DictAttrSource(source, "training"), "eq", bool(value.training))
            return PyVar(value, source)
        if torch is not None and isinstance(value, (torch.dtype, torch.device)):
            self.guard(source, "id", value)
            return PyVar(value, source)
        if G.eq_ok(value):          # NumPy scalars, complex, slices, ranges, namedtuples: by value
            self.guard(source, "eq", value)
            return PyVar(value, source)
        if isinstance(value, (enum.Enum, numbers.Number)):   # a member; Fraction, Decimal, long double
            self.guard(source, "id", value)                  # (immutable, but no eq the C engine runs)
            return PyVar(value, source)
        # other objects: by type; what the trace reads of them (attributes) is guarded as read
        self.guard(source, "type", t)
        return PyVar(value, source)

    def array_input(self, arr, source, kind):
        # The core route keys inputs by object and source: one object reached through two sources
        # (z = pick(x, y) returning y) is two inputs, since no guard says the two sources will hold
        # one object at later calls (one input read through the first source gave z's value for y
        # once they differed). Its graph ops are pure, so aliasing changes no value. Autograd
        # mode keeps one placeholder per object (tied weights), as before.
        key = id(arr) if self.fx is not None else (id(arr), source)
        if key in self.arrays:
            return self.arrays[key]
        if kind == "numpy":
            if self.fx is not None:
                self.unsupported("a NumPy array in a frame that trains (tensors requiring grad): "
                                 "autograd frames are traced as torch ops only", whole_frame=True)
            if arr.dtype.kind not in "biuf" or arr.dtype.itemsize > 8:      # longdouble: not in the core
                self.unsupported("array of dtype %s is not supported" % arr.dtype)
            if source is not None:
                self.guards.append(G.array_guard(source, arr))
            dtype = arr.dtype
        else:
            if arr.device.type != "cpu":
                self.unsupported("tensor on device %s: only CPU tensors are traced" % arr.device)
            if arr.layout != torch.strided:
                self.unsupported("tensor with layout %s: only strided tensors are traced" % arr.layout)
            if arr.requires_grad and torch.is_grad_enabled() and self.fx is None:
                raise NeedAutograd()
            if arr.requires_grad and self.fx is None:   # traced as data under no_grad: only while grad stays off
                self.guard(S.CallSource(torch.is_grad_enabled), "eq", False)
            if arr.dtype not in TORCH_TO_NP:
                self.unsupported("tensor dtype %s has no NumPy dtype" % arr.dtype)
            if source is not None:
                self.guards.append(G.tensor_guard(source, arr))
            dtype = TORCH_TO_NP[arr.dtype]
        if source is None:
            self.unsupported("array without a source in the frame")
        if self.fx is not None:
            var = ArrayVar(None, arr, kind, source)
            var.fx = self._fx_placeholder()
        else:
            var = ArrayVar(self.graph.input(dtype.name, arr.ndim), arr, kind, source)
        self.inputs.append((source, kind, arr))
        self.arrays[key] = var
        self.keep.append(arr)
        return var

    # ------------------------------------------------------------------ running

    def run(self):
        code = self.code
        frame = Frame(code, self.f_globals, self.f_builtins, None, top=True)
        names = localsplus_names(code)
        nfree = len(code.co_freevars)
        for i, name in enumerate(code.co_freevars):
            cell_src = S.ClosureSource(name, i)
            frame.cells[name] = CellVar(external=True, loader=self._loader(name, cell_src))
        for name in names[:len(names) - nfree]:
            if name in self.f_locals:
                src = S.LocalSource(name, self.slots[name])
                frame.locals[name] = _Lazy(self._loader(name, src))
        self.frame = self.top_frame = frame
        return self.run_frame(frame)

    def _loader(self, name, src):
        def load():
            if isinstance(src, S.ClosureSource):
                try:
                    value = self.closure[src.index].cell_contents
                except (ValueError, IndexError):
                    value = self.f_locals[name]
            else:
                value = self.f_locals[name]
            return self.wrap(value, src)
        return load

    def run_frame(self, frame):
        saved = getattr(self, "frame", None)
        self.frame = frame
        try:
            while True:
                ins = frame.instrs[frame.pc]
                frame.cur = frame.pc
                pos = getattr(ins, "positions", None)
                if pos is not None and pos.lineno:          # also right after a jump into a line
                    frame.lineno = pos.lineno
                elif ins.starts_line is not None:
                    frame.lineno = ins.starts_line
                if frame.top and self.stop_at is not None and frame.pc == self.stop_at:
                    raise Stop(frame)
                self.steps += 1
                if self.steps > MAX_STEPS:
                    self.unsupported("trace longer than %d instructions" % MAX_STEPS)
                if ins.offset in frame.protected:
                    self.unsupported("try/except/with blocks are not supported (%s inside a protected "
                                     "region)" % ins.opname)
                frame.pc += 1
                handler = getattr(self, "op_" + ins.opname, None)
                if handler is None:
                    self.unsupported("bytecode %s is not supported" % ins.opname)
                result = handler(frame, ins)
                if result is not None:
                    return result[0]
        finally:
            self.frame = saved

    # ------------------------------------------------------------------ helpers

    def push(self, v):
        self.frame.stack.append(v)

    def pop(self, n=None):
        st = self.frame.stack
        if n is None:
            return st.pop()
        if n == 0:
            return []
        out = st[-n:]
        del st[-n:]
        return out

    def jump(self, frame, offset):
        frame.pc = frame.index_of[offset]

    def const(self, v):
        return PyVar(v)

    def py(self, var, what="value"):
        """The Python value of a Var, or a break if it depends on array data."""
        if isinstance(var, _Lazy):
            var = var.get()
        if isinstance(var, PyVar):
            return var.value
        if isinstance(var, ScalarVar):
            for r in var.roots:             # its value is the trace's from now on: guard it
                if not r.specialized:
                    r.specialized = True
                    self.guards = [g for g in self.guards if g is not r.type_guard]   # eq checks the type
                    self.guard(r.source, "eq", r.value)
            return var.value
        if isinstance(var, TupleVar):
            return tuple(self.py(v, what) for v in var.items)
        if isinstance(var, ListVar):
            return [self.py(v, what) for v in var.items]
        if isinstance(var, DictVar):
            return {k: self.py(v, what) for k, v in var.items.items()}
        if isinstance(var, ShapeVar):
            return tuple(self.dim(var.array, i) for i in range(var.array.ndim))
        if isinstance(var, ArrayVar):
            self.unsupported("data-dependent %s: an array value is used as a Python value" % what)
        if isinstance(var, FuncVar):
            self.unsupported("a function made in the trace is passed to Python code")
        self.unsupported("%s of kind %s used as a Python value" % (what, type(var).__name__))

    def dim(self, arr, axis):
        """arr.shape[axis] as a Python int, guarded."""
        size = int(arr.example.shape[axis])
        if arr.source is not None:
            self.guard(arr.source, "dim", axis % arr.ndim, size)
        else:
            # the size of an intermediate: guard every size of every input
            for src, kind, ex in self.inputs:
                if kind == "scalar":
                    continue
                for a, n in enumerate(ex.shape):
                    self.guard(src, "dim", a, int(n))
        return size

    def truth(self, var, opname):
        var = _unlazy(var)
        if isinstance(var, ArrayVar):
            self.unsupported("data-dependent branch on an array value (%s) (hint: use np.where "
                             "or torch.where)" % opname)
        if isinstance(var, (TupleVar, ListVar)):
            return bool(var.items)
        if isinstance(var, DictVar):
            return bool(var.items)
        if isinstance(var, (FuncVar, MethodVar, ArrayMethodVar)):
            return True
        return bool(self.py(var))

    # ------------------------------------------------------------------ array ops

    def record_op(self):
        self.op_count += 1
        self.lines.append((self.frame.code.co_filename, self.frame.lineno))

    def example_of(self, var):
        var = _unlazy(var)
        if isinstance(var, (ArrayVar, ScalarVar)):
            return var.example if isinstance(var, ArrayVar) else var.value
        return self.py(var)

    def scalar_value(self, var):
        """A ScalarVar's graph value: a weak 0-d input, made at its first use."""
        if var.gv is None:
            weak = type(var.value) is float       # a NumPy scalar is strongly typed (NEP 50)
            var.gv = self.graph.input("float64" if weak else var.value.dtype.name, 0, weak=weak)
            self.inputs.append((var.source, "scalar", var.value))
        return var.gv

    def half_scalar(self, var):
        """float16(var) of a Python float read at each call, computed by Python at each call
        (a strongly typed float16 input): what NumPy and torch make of it next to float16."""
        if var.half is None:
            var.half = ScalarVar(_to_float16(var.value), S.ScalarExprSource(_to_float16, "float16", [var.source]),
                                 var.roots)
        return var.half

    def scalar_op(self, fn, label, args):
        """fn(*args) on ScalarVars and Python numbers, with a float result: a ScalarVar that
        Python computes again at each call (a ScalarExprSource), or None when the trace cannot
        tell its result is always a float (a power may be complex) or it raises now: Python
        folds it then, specializing the ScalarVars."""
        if fn not in _FLOAT_RESULT:
            return None
        for a in args:
            if not isinstance(a, ScalarVar) and not (isinstance(a, PyVar) and type(a.value) in (int, float, bool)):
                return None
        try:
            with np.errstate(all="ignore"):     # NumPy's overflow warning: the call's own, at each call
                value = fn(*[a.value for a in args])
        except Exception:
            return None
        # a NumPy scalar's result type follows from the types alone (NEP 50), which are guarded
        if type(value) is not float and type(value) not in _NP_FLOATS:
            return None
        roots = []
        for a in args:
            if isinstance(a, ScalarVar):
                roots.extend(r for r in a.roots if all(r is not q for q in roots))
        src = S.ScalarExprSource(fn, label, [a.source if isinstance(a, ScalarVar) else a.value for a in args])
        var = ScalarVar(value, src, roots)
        self.scalar_exprs.append(var)       # computed at each call even if unused: what it raises is raised
        return var

    def graph_arg(self, var):
        var = _unlazy(var)
        if isinstance(var, ArrayVar):
            return var.value
        if isinstance(var, ScalarVar):
            return self.scalar_value(var)
        v = self.py(var)
        if isinstance(v, (bool, int, float, np.generic)):
            return v
        raise _NoCore()

    def eager(self, fn, args, kwargs):
        ex_args = [_map_examples(self, a) for a in args]
        ex_kwargs = {k: _map_examples(self, v) for k, v in kwargs.items()}
        key = getattr(fn, "__code__", fn)               # a lambda made anew per call: its code
        flat = ex_args + list(ex_kwargs.values())
        if self.replay is not None:
            entry = next(self.replay, None)
            if entry is not None and entry[0] is key and len(entry[1]) == len(flat) and all(
                    a is b for a, b in zip(entry[1], flat) if _is_array(a) or _is_array(b)):
                return entry[2]
            self.replay = None                          # out of step: run them from here on
        # autograd mode: the example gives metadata only, no autograd graph is built for it
        grad = torch.no_grad() if self.fx is not None else contextlib.nullcontext()
        _EXAMPLE.depth = getattr(_EXAMPLE, "depth", 0) + 1
        try:
            with grad:
                result = fn(*ex_args, **ex_kwargs)
        except Exception as e:                               # the user's code raises
            self.unsupported("%s raised %s: %s while tracing" % (_name(fn), type(e).__name__, e))
        finally:
            _EXAMPLE.depth -= 1
        if self.fx is None:
            self.eager_log.append((key, flat, result))
        return result

    # ------------------------------------------------------------------ autograd mode (FX)

    def _fx_placeholder(self):
        name = "in%d" % len(self.fx_placeholders)
        first_op = next((n for n in self.fx.nodes if n.op != "placeholder"), None)
        if first_op is None:
            node = self.fx.placeholder(name)
        else:
            with self.fx.inserting_before(first_op):
                node = self.fx.placeholder(name)
        self.fx_placeholders.append(node)
        return node

    def fx_module_call(self, mod_var, args, kwargs):
        """Autograd mode, a torch.nn module (Linear, Conv2d, MultiheadAttention, ...): one FX node
        that calls it through torch.func.functional_call with its parameters and buffers as graph
        inputs, so aot_autograd sees its aten ops and gradients reach the parameters."""
        mod = mod_var.value
        if mod_var.source is None:
            self.unsupported("a module made in the trace")
        names, tensors = [], []
        for name, t in list(mod.named_parameters()) + list(mod.named_buffers()):
            *path, leaf = name.split(".")
            src = mod_var.source
            for part in path:
                src = S.ItemSource(S.DictAttrSource(src, "_modules"), part)
            sub = mod.get_submodule(".".join(path)) if path else mod
            where = "_parameters" if leaf in sub._parameters else "_buffers"
            names.append(name)
            tensors.append(self.wrap(t, S.ItemSource(S.DictAttrSource(src, where), leaf)))
        call = _FunctionalModule(mod, tuple(names), len(list(mod.named_parameters())))
        return self.fx_call(call, [TupleVar(tensors)] + list(args), kwargs)

    def fx_arg(self, v):
        """A traced argument as an FX argument: nodes for arrays, Python values otherwise."""
        v = _unlazy(v)
        if isinstance(v, ArrayVar):
            return v.fx
        if isinstance(v, TupleVar):
            return tuple(self.fx_arg(x) for x in v.items)
        if isinstance(v, ListVar):
            return [self.fx_arg(x) for x in v.items]
        if isinstance(v, DictVar):
            return {k: self.fx_arg(x) for k, x in v.items.items()}
        return self.py(v)

    def fx_call(self, fn, args, kwargs, method=None, example=None):
        """Autograd mode: fn(*args, **kwargs) (or args[0].method(*args[1:], **kwargs)) as one FX
        node; its eager example (or the example given: a random op's, which must not draw from
        the RNG while tracing) gives the result's metadata."""
        if example is None:
            example = self.eager(fn, args, kwargs)
        fa = tuple(self.fx_arg(a) for a in args)
        fk = {k: self.fx_arg(v) for k, v in kwargs.items()}
        tensors = isinstance(example, torch.Tensor) or (      # or e.g. MultiheadAttention's (output, None)
            isinstance(example, (tuple, list)) and example
            and all(isinstance(e, torch.Tensor) or e is None for e in example))
        if not tensors:
            self.unsupported("%s returns %s computed from tensors (data-dependent Python value)"
                             % (_name(fn) if method is None else "Tensor." + method, type(example).__name__))
        node = self.fx.call_method(method, fa, fk) if method else self.fx.call_function(fn, fa, fk)
        self.record_op()
        # a result that views an argument (y.t(), y[0], x.contiguous() returning x) is not fresh:
        # an in-place update of it must reach what it views, so it is a graph break, and so is
        # an in-place update of an argument it views (escaped), which must reach the view
        arrays = [a for a in (_unlazy(v) for v in list(args) + list(kwargs.values())) if isinstance(a, ArrayVar)]
        stores = {_storage_ptr(a.example) for a in arrays} - {None}

        def fresh(e):
            ptr = _storage_ptr(e)
            if e._is_view() or ptr is None or ptr in stores:
                for a in arrays:
                    a.escaped = True
                return False
            return True
        if isinstance(example, torch.Tensor):
            var = ArrayVar(None, example, "torch", fresh=fresh(example))
            var.fx = node
            return var
        items = []
        for i, e in enumerate(example):
            if e is None:
                items.append(PyVar(None))
                continue
            var = ArrayVar(None, e, "torch", fresh=fresh(e))
            var.fx = self.fx.call_function(operator.getitem, (node, i))
            items.append(var)
        return TupleVar(items)

    def core(self, op, args, attrs, example, kind):
        """A core op; dtype checked against the eager example (cast when it differs)."""
        want = _np_dtype(example)
        # NumPy (NEP 50) makes a Python scalar that meets float16 operands a float16 first:
        # x < 0.1 compares with float16(0.1), x * 100000 is x * inf, x ** 0.1 is
        # x ** float16(0.1); torch too but for mul and div (_TORCH_OPMATH_SCALAR). The strongly
        # typed operands (arrays, tensors cast to the op's dtype, NumPy scalars) decide it,
        # not the result (a comparison's is bool)
        half = _strong_dtype(args, kind) == np.float16 and not (kind == "torch" and op in _TORCH_OPMATH_SCALAR)
        args = [self._core_scalar(_unlazy(a), op == "pow" and i == 1, kind, half)
                if isinstance(_unlazy(a), ScalarVar) else a for i, a in enumerate(args)]
        vals = [self.graph_arg(a) for a in args]
        if kind == "torch":             # torch takes a NumPy scalar constant as a Python one (weak)
            vals = [v.item() if isinstance(v, np.generic) else v for v in vals]
        if half:                        # the core keeps weak constants in float32, as torch does
            vals = [_to_float16(v) if type(v) in (int, float) else v for v in vals]
        try:
            if kind == "torch" and op in ("floordiv", "remainder") and want.kind in "iu" \
                    and not isinstance(vals[1], (bool, int, float)):
                # torch raises on an integer division by a tensor holding 0 (RuntimeError
                # "ZeroDivisionError"), NumPy gives 0: the divisor is checked in the kernel
                if vals[1].dtype == "bool":
                    vals[1] = self.graph.call("cast", vals[1], dtype=want.name)
                vals[1] = self.graph.call("check_divisor", vals[1])
            v = self.graph.call(op, *vals, **attrs)
            if v.dtype != want.name:        # None after an extern call: known at compile time
                v = self.graph.call("cast", v, dtype=want.name)     # TypeError: not a core dtype
        except (TypeError, ValueError, OverflowError, np.exceptions.AxisError) as e:
            if _DEBUG:
                print("core %s failed: %r" % (op, e))
            raise _NoCore()
        if v.ndim is not None and v.ndim != np.ndim(example):
            raise _NoCore()
        self.record_op()
        return ArrayVar(v, example, kind, fresh=True)

    def _core_scalar(self, var, exponent, kind, half):
        """A float read at each call as a core op's operand. Baked in (its value guarded): an
        exponent (NumPy and torch take x ** 0.5 as sqrt, -0.0 and -inf differ from pow, which
        the core does for a constant exponent only) and a NumPy scalar in torch code (torch
        takes it as a Python one, weak, which the core would promote). Next to float16
        (half): float16(lr), computed by Python at each call."""
        if exponent or kind == "torch" and type(var.value) is not float:
            return PyVar(self.py(var))
        if half and type(var.value) is float:
            return self.half_scalar(var)
        return var

    def extern(self, fn, args, kwargs, example, kind):
        """fn(*args, **kwargs) at run time through g.extern; arrays are the values."""
        arrays = []

        def template(v):
            v = _unlazy(v)
            if isinstance(v, ArrayVar):
                arrays.append(v)
                v.escaped = True
                return _Slot(len(arrays) - 1)
            if isinstance(v, (TupleVar, ListVar)):
                items = [template(x) for x in v.items]
                return tuple(items) if isinstance(v, TupleVar) else _ListT(items)
            if isinstance(v, DictVar):
                return _DictT({k: template(x) for k, x in v.items.items()})
            if isinstance(v, ShapeVar):
                return self.py(v)
            return self.py(v)
        targs = [template(a) for a in args]
        tkw = {k: template(v) for k, v in kwargs.items()}
        if isinstance(example, (tuple, list)) and example and all(_is_array(e) for e in example):
            nout = len(example)
        elif _is_array(example):
            nout = None
        elif kind == "torch" and isinstance(example, tuple) and any(_is_array(e) for e in example) \
                and all(_is_array(e) or e is None for e in example) and self.fx is None:
            raise NeedAutograd()            # (output, None) from MultiheadAttention: as torch ops
        else:
            self.unsupported("%s returns %s computed from arrays (data-dependent Python value)"
                             % (_name(fn), type(example).__name__))
        if nout and any(w in _name(fn).rsplit(".", 1)[-1] for w in _COUNT_BY_SIZE):
            # how many arrays x.unbind(0) or np.split(x, 2) gives depends on sizes the graph does
            # not otherwise fix: guard them (a new size traces again, not a wrong count)
            for a in arrays:
                for axis in range(a.ndim):
                    self.dim(a, axis)
        to_torch = kind == "torch"
        examples = example if nout else [example]
        for e in examples:
            if torch is not None and isinstance(e, torch.Tensor) and (e.dtype not in TORCH_TO_NP or e.layout != torch.strided):
                self.unsupported("%s returns a tensor of dtype %s, layout %s: the core takes NumPy's "
                                 "dtypes, strided" % (_name(fn), e.dtype, e.layout))
        if to_torch and any(getattr(e, "requires_grad", False) for e in examples):
            if torch.is_grad_enabled() and self.fx is None:
                raise NeedAutograd()            # parameters inside a torch module: trace for autograd
            self.unsupported("%s returns a tensor that requires grad (a parameter or input requires grad): "
                             "autograd is not traced (hint: torch.no_grad() or module.requires_grad_(False))"
                             % _name(fn))

        def run(*arrs):
            if to_torch:
                arrs = [torch.from_numpy(a) if isinstance(a, np.ndarray) else torch.as_tensor(a) for a in arrs]
            out = fn(*[_fill(t, arrs) for t in targs], **{k: _fill(t, arrs) for k, t in tkw.items()})
            if to_torch:
                if nout is None:
                    return out.numpy()
                return tuple(o.numpy() for o in out)
            return out if nout is None else tuple(out)
        run.__name__ = run.__qualname__ = "extern_" + _name(fn).replace(".", "_")   # (profile()'s row)
        v = self.graph.extern(run, *[a.value for a in arrays], nout=nout)
        self.extern_results.append((example, run, [a.example for a in arrays]))
        self.record_op()
        # a result sharing no memory with the arguments or the other results (F.linear's, a
        # conv's) is the extern's own: fresh, so an in-place update may rebind it
        hosts = [h for h in (_host_of(a.example) for a in arrays) if h is not None]
        outs = [_host_of(e) for e in examples]

        def fresh(i):
            h = outs[i]
            return h is not None and not any(np.may_share_memory(h, o) for o in hosts + outs[:i] + outs[i + 1:]
                                             if o is not None)
        if nout is None:
            return ArrayVar(v, example, kind, fresh=fresh(0))
        return TupleVar([ArrayVar(x, e, kind, fresh=fresh(i)) for i, (x, e) in enumerate(zip(v, example))])

    def array_call(self, fn, args, kwargs, core_op=None, attrs=None, core_args=None, kind=None):
        """Call fn on traced arguments: a core op when possible, else an extern call."""
        if self.fx is not None:
            return self.fx_call(fn, args, kwargs)
        kind = kind or _kind_of(args, kwargs)
        example = self.eager(fn, args, kwargs)
        if kind == "torch" and _is_array(example) and not isinstance(example, torch.Tensor):
            kind = "numpy"
        if core_op is not None and _is_array(example):
            try:
                return self.core(core_op, core_args if core_args is not None else args, attrs or {},
                                 example, kind)
            except _NoCore:
                pass
        return self.extern(fn, args, kwargs, example, kind)

    # ------------------------------------------------------------------ opcodes: loads and stores

    def op_RESUME(self, f, ins): pass
    def op_NOP(self, f, ins): pass
    def op_PRECALL(self, f, ins): pass
    def op_COPY_FREE_VARS(self, f, ins): pass

    def op_MAKE_CELL(self, f, ins):
        name = ins.argval
        if name not in f.cells:
            init = f.locals.pop(name, None)
            f.cells[name] = CellVar(_unlazy(init) if init is not None else None)

    def op_LOAD_CONST(self, f, ins):
        self.push(PyVar(ins.argval))

    def op_RETURN_CONST(self, f, ins):
        return (PyVar(ins.argval),)

    def op_RETURN_VALUE(self, f, ins):
        return (self.pop(),)

    def op_LOAD_FAST(self, f, ins):
        name = ins.argval
        if name in f.cells:                                  # 3.12 comprehension cells
            return self.op_LOAD_DEREF(f, ins)
        if name not in f.locals:
            self.unsupported("local variable %r read before assignment" % name)
        v = f.locals[name]
        if isinstance(v, _Lazy):
            v = f.locals[name] = v.get()
        self.push(v)

    op_LOAD_FAST_CHECK = op_LOAD_FAST

    def op_LOAD_FAST_AND_CLEAR(self, f, ins):
        v = f.locals.pop(ins.argval, None)
        self.push(_unlazy(v) if v is not None else _UNBOUND)

    def op_STORE_FAST(self, f, ins):
        v = self.pop()
        if v is _UNBOUND:
            f.locals.pop(ins.argval, None)
        else:
            f.locals[ins.argval] = v

    def op_DELETE_FAST(self, f, ins):
        f.locals.pop(ins.argval, None)

    def op_LOAD_DEREF(self, f, ins):
        cell = f.cells.get(ins.argval)
        if cell is None or cell.contents is None:
            self.unsupported("free variable %r read before assignment" % ins.argval)
        self.push(cell.contents)

    def op_STORE_DEREF(self, f, ins):
        cell = f.cells.get(ins.argval)
        if cell is None:
            cell = f.cells[ins.argval] = CellVar()
        if cell.external:
            self.unsupported("store to a variable of an enclosing function (nonlocal %s) "
                             "is not supported" % ins.argval)
        cell.contents = self.pop()

    def op_LOAD_CLOSURE(self, f, ins):
        name = ins.argval
        if name not in f.cells:
            f.cells[name] = CellVar()
        self.push(f.cells[name])

    def op_LOAD_GLOBAL(self, f, ins):
        name = ins.argval
        if (ins.arg & 1) and sys.version_info >= (3, 11):
            self.push(NULL)
        self.push(self.load_global(f, name))

    def load_global(self, f, name):
        top_globals = f.f_globals is self.f_globals
        if name in f.f_globals:
            value = f.f_globals[name]
        elif name in f.f_builtins:
            value = f.f_builtins[name]
        else:
            self.unsupported("name %r is not defined" % name)
        if top_globals:
            return self.wrap(value, S.GlobalSource(name))
        # a function inlined from another module: guard the name in that module's globals
        # (or its builtins), read through the dict itself, which the guard program holds
        d = f.f_globals if name in f.f_globals else f.f_builtins
        if not isinstance(d, dict):
            d = vars(d)
        label = "%s.G" % d.get("__name__", "?") if d is f.f_globals else "builtins"
        if type(value) is np.ndarray or (torch is not None and isinstance(value, torch.Tensor)):
            self.unsupported("array global of another module is not supported")
        return self.wrap(value, S.ItemSource(S.ConstSource(d, label), name))

    def op_STORE_GLOBAL(self, f, ins):
        self.unsupported("store to global %r is not supported (side effect)" % ins.argval)

    def op_PUSH_NULL(self, f, ins):
        self.push(NULL)

    def op_POP_TOP(self, f, ins):
        self.pop()

    def op_COPY(self, f, ins):
        self.push(f.stack[-ins.arg])

    def op_SWAP(self, f, ins):
        st = f.stack
        st[-1], st[-ins.arg] = st[-ins.arg], st[-1]

    def op_KW_NAMES(self, f, ins):
        f.kw_names = f.code.co_consts[ins.arg]

    # ------------------------------------------------------------------ building

    def op_BUILD_TUPLE(self, f, ins):
        self.push(TupleVar(self.pop(ins.arg)))

    def op_BUILD_LIST(self, f, ins):
        self.push(ListVar(self.pop(ins.arg)))

    def op_BUILD_MAP(self, f, ins):
        items = self.pop(2 * ins.arg)
        self.push(DictVar({self.py(items[i], "dict key"): items[i + 1] for i in range(0, len(items), 2)}))

    def op_BUILD_CONST_KEY_MAP(self, f, ins):
        keys = self.py(self.pop())
        vals = self.pop(ins.arg)
        self.push(DictVar(dict(zip(keys, vals))))

    def op_BUILD_SLICE(self, f, ins):
        parts = [self.py(v, "slice bound") for v in self.pop(ins.arg)]
        self.push(PyVar(slice(*parts)))

    def op_BUILD_STRING(self, f, ins):
        self.push(PyVar("".join(self.py(v) for v in self.pop(ins.arg))))

    def op_FORMAT_VALUE(self, f, ins):
        spec = self.py(self.pop()) if (ins.arg & 0x04) else ""
        v = self.py(self.pop(), "formatted value")
        conv = ins.arg & 0x03
        v = {0: v, 1: str(v), 2: repr(v), 3: ascii(v)}[conv] if conv else v
        self.push(PyVar(format(v, spec)))

    def op_LIST_APPEND(self, f, ins):
        v = self.pop()
        self.local_list(f.stack[-ins.arg]).items.append(v)

    def op_LIST_EXTEND(self, f, ins):
        v = self.pop()
        self.local_list(f.stack[-ins.arg]).items.extend(self.unpack(v))

    def op_SET_UPDATE(self, f, ins):
        self.unsupported("sets are not supported")

    op_BUILD_SET = op_SET_UPDATE

    def op_LIST_TO_TUPLE(self, f, ins):
        self.push(TupleVar(self.pop().items))

    def op_CALL_INTRINSIC_1(self, f, ins):
        name = dis._intrinsic1_descs[ins.arg] if hasattr(dis, "_intrinsic1_descs") else str(ins.argrepr)
        if name == "INTRINSIC_LIST_TO_TUPLE":
            self.push(TupleVar(self.pop().items))
        elif name == "INTRINSIC_UNARY_POSITIVE":
            v = self.pop()
            self.push(self.unary(v, operator.pos, None, "+"))
        else:
            self.unsupported("intrinsic %s is not supported" % name)

    def op_MAP_ADD(self, f, ins):
        v = self.pop()
        k = self.py(self.pop(), "dict key")
        self.local_dict(f.stack[-ins.arg]).items[k] = v

    def op_DICT_UPDATE(self, f, ins):
        v = _unlazy(self.pop())
        if not isinstance(v, DictVar):
            self.unsupported("dict update from %s" % type(v).__name__)
        self.local_dict(f.stack[-ins.arg]).items.update(v.items)

    op_DICT_MERGE = op_DICT_UPDATE

    def local_list(self, v):
        v = _unlazy(v)
        if not isinstance(v, ListVar):
            self.unsupported("list operation on %s" % type(v).__name__)
        if v.source is not None:
            self.unsupported("mutation of a list from outside the frame (side effect)")
        return v

    def local_dict(self, v):
        v = _unlazy(v)
        if not isinstance(v, DictVar):
            self.unsupported("dict operation on %s" % type(v).__name__)
        if v.source is not None:
            self.unsupported("mutation of a dict from outside the frame (side effect)")
        return v

    def unpack(self, v):
        """Items of an iterable Var as a list of Vars."""
        v = _unlazy(v)
        if isinstance(v, (TupleVar, ListVar)):
            return list(v.items)
        if isinstance(v, DictVar):
            return [PyVar(k) for k in v.items]
        if isinstance(v, IterVar):
            out = v.items[v.pos:]
            v.pos = len(v.items)
            return out
        if isinstance(v, ShapeVar):
            return [PyVar(x) for x in self.py(v)]
        if isinstance(v, PyVar):
            val = v.value
            if torch is not None and isinstance(val, (torch.nn.ModuleList, torch.nn.Sequential,
                                                      torch.nn.ModuleDict)):
                if v.source is not None:            # a module appended later must recompile
                    self.guard(S.DictAttrSource(v.source, "_modules"), "len", len(val._modules))
                if isinstance(val, torch.nn.ModuleDict):
                    return [PyVar(k) for k in val._modules]
                return [self.module_child(v, k) for k in val._modules]
            if isinstance(val, (range, str, bytes)) or type(val) is tuple:
                return [PyVar(x) for x in val]      # a tuple constant: for k in (1.0, 2.0)
        if isinstance(v, ArrayVar):
            self.unsupported("iteration over an array (data-dependent length)")
        self.unsupported("iteration over %s is not supported" % _describe(v))

    def op_UNPACK_SEQUENCE(self, f, ins):
        items = self.unpack(self.pop())
        if len(items) != ins.arg:
            self.unsupported("unpacking %d values into %d names" % (len(items), ins.arg))
        for v in reversed(items):
            self.push(v)

    def op_UNPACK_EX(self, f, ins):
        items = self.unpack(self.pop())
        before, after = ins.arg & 0xFF, ins.arg >> 8
        if len(items) < before + after:
            self.unsupported("not enough values to unpack")
        mid = ListVar(items[before:len(items) - after])
        for v in reversed(items[len(items) - after:]):
            self.push(v)
        self.push(mid)
        for v in reversed(items[:before]):
            self.push(v)

    # ------------------------------------------------------------------ control flow

    def op_JUMP_FORWARD(self, f, ins):
        self.jump(f, ins.argval)

    op_JUMP_BACKWARD = op_JUMP_FORWARD
    op_JUMP_BACKWARD_NO_INTERRUPT = op_JUMP_FORWARD

    def _pop_jump(self, f, ins):
        name = ins.opname.replace("FORWARD_", "").replace("BACKWARD_", "")
        v = self.pop()
        if name.endswith("IF_NONE") or name.endswith("IF_NOT_NONE"):
            u = _unlazy(v)
            is_none = isinstance(u, PyVar) and u.value is None
            take = is_none if name.endswith("IF_NONE") else not is_none
        else:
            t = self.truth(v, ins.opname)
            take = t if name.endswith("TRUE") else not t
        if take:
            self.jump(f, ins.argval)

    op_POP_JUMP_IF_FALSE = op_POP_JUMP_IF_TRUE = op_POP_JUMP_IF_NONE = op_POP_JUMP_IF_NOT_NONE = _pop_jump
    op_POP_JUMP_FORWARD_IF_FALSE = op_POP_JUMP_FORWARD_IF_TRUE = _pop_jump
    op_POP_JUMP_FORWARD_IF_NONE = op_POP_JUMP_FORWARD_IF_NOT_NONE = _pop_jump
    op_POP_JUMP_BACKWARD_IF_FALSE = op_POP_JUMP_BACKWARD_IF_TRUE = _pop_jump
    op_POP_JUMP_BACKWARD_IF_NONE = op_POP_JUMP_BACKWARD_IF_NOT_NONE = _pop_jump

    def _jump_or_pop(self, f, ins):
        t = self.truth(f.stack[-1], ins.opname)
        if t == ins.opname.startswith("JUMP_IF_TRUE"):
            self.jump(f, ins.argval)
        else:
            self.pop()

    op_JUMP_IF_TRUE_OR_POP = op_JUMP_IF_FALSE_OR_POP = _jump_or_pop

    def op_GET_ITER(self, f, ins):
        v = _unlazy(self.pop())
        if isinstance(v, IterVar):
            self.push(v)
        else:
            self.push(IterVar(self.unpack(v)))

    def op_FOR_ITER(self, f, ins):
        it = f.stack[-1]
        if not isinstance(it, IterVar):
            self.unsupported("for loop over %s" % _describe(it))
        if it.pos < len(it.items):
            self.push(it.items[it.pos])
            it.pos += 1
            return
        self.pop()
        self.jump(f, ins.argval)
        if f.instrs[f.pc].opname == "END_FOR":              # 3.12: skip END_FOR
            f.pc += 1

    def op_END_FOR(self, f, ins):
        self.pop(2)

    def op_GET_LEN(self, f, ins):
        self.push(PyVar(len(self.unpack(f.stack[-1]))))

    # ------------------------------------------------------------------ unsupported on purpose

    def op_BEFORE_WITH(self, f, ins):
        self.unsupported("with-blocks are not supported (BEFORE_WITH)")

    def op_RAISE_VARARGS(self, f, ins):
        self.unsupported("raise is not supported (RAISE_VARARGS)")

    def op_RETURN_GENERATOR(self, f, ins):
        self.unsupported("generators are not supported")

    def op_IMPORT_NAME(self, f, ins):
        self.unsupported("import inside the traced function is not supported")

    def op_LOAD_ASSERTION_ERROR(self, f, ins):
        self.push(PyVar(AssertionError))

    # ------------------------------------------------------------------ operators

    def op_BINARY_OP(self, f, ins):
        b, a = self.pop(), self.pop()
        sym = ins.argrepr
        inplace = sym.endswith("=")
        self.push(self.binary(a, b, sym[:-1] if inplace else sym, inplace))

    def op_COMPARE_OP(self, f, ins):
        b, a = self.pop(), self.pop()
        self.push(self.binary(a, b, ins.argval, False))

    def binary(self, a, b, sym, inplace):
        a, b = _unlazy(a), _unlazy(b)
        core_op, fn = NP.OPERATORS[sym]
        if not isinstance(a, ArrayVar) and not isinstance(b, ArrayVar):
            if isinstance(a, ScalarVar) or isinstance(b, ScalarVar):
                r = self.scalar_op(fn, sym, [a, b])
                if r is not None:
                    return r
            if sym == "+" and type(a) is type(b) and isinstance(a, (TupleVar, ListVar)):
                if inplace and isinstance(a, ListVar):
                    self.local_list(a).items.extend(b.items)
                    return a
                return type(a)(a.items + b.items)
            if sym == "*" and isinstance(a, (TupleVar, ListVar)):
                return type(a)(a.items * self.py(b))
            if inplace and isinstance(a, ListVar):
                self.local_list(a).items.extend(self.unpack(b))
                return a
            return self.fold(fn, [a, b], {})
        if inplace and isinstance(a, ArrayVar) and self.fx is not None:
            if a.source is not None or not a.fresh or a.escaped:
                self.unsupported("in-place %s= on a tensor that may be shared (an input or a view) "
                                 "is not supported" % sym)
            new = self.array_op(fn, core_op, [a, b], sym)      # a fresh tensor: rebind it
            a.example, a.fx = new.example, new.fx
            return a
        if inplace and isinstance(a, ArrayVar):
            if a.source is not None or not a.fresh or a.escaped:
                self.unsupported("in-place %s= on an array that may be shared (an input or a view) "
                                 "is not supported" % sym)
            ifn = getattr(operator, "i" + fn.__name__.strip("_"))
            new = self.array_op(lambda x, y: ifn(x.clone() if a.kind == "torch" else x.copy(), y), core_op, [a, b], sym + "=")
            a.value, a.example = new.value, new.example
            return a
        return self.array_op(fn, core_op, [a, b], sym)

    def array_op(self, fn, core_op, args, what):
        kind = _kind_of(args, {})
        if kind == "torch":
            from . import torch_ops
            return torch_ops.pointwise(self, fn, core_op, args, {})
        return self.array_call(fn, args, {}, core_op)

    def fold(self, fn, args, kwargs):
        """Call fn at trace time on Python values (its result is a constant)."""
        pa = [self.py(a) for a in args]
        pk = {k: self.py(v) for k, v in kwargs.items()}
        try:
            value = fn(*pa, **pk)
        except Exception as e:
            self.unsupported("%s raised %s: %s while tracing" % (_name(fn), type(e).__name__, e))
        var = self.wrap_result(value)
        if isinstance(var, PyVar) and hasattr(type(value), "__enter__"):
            var.remake = (fn, pa, pk)       # a context manager is stateful: made afresh per call
        return var

    def wrap_result(self, v):
        if isinstance(v, np.generic) and v.dtype.kind in "biuf":
            return PyVar(v)         # np.float32(0.5): a strongly typed constant, as core ops take it
        if _is_array(v):
            self.unsupported("an array computed from Python values only (constant arrays are "
                             "not supported)")
        if type(v) is tuple:
            return TupleVar([self.wrap_result(x) for x in v])
        if type(v) is list:
            return ListVar([self.wrap_result(x) for x in v])
        return PyVar(v)

    def unary(self, v, fn, core_op, what):
        v = _unlazy(v)
        if isinstance(v, ArrayVar):
            return self.array_op(fn, core_op, [v], what)
        if isinstance(v, ScalarVar):
            r = self.scalar_op(fn, what, [v])
            if r is not None:
                return r
        return self.fold(fn, [v], {})

    def op_UNARY_NEGATIVE(self, f, ins):
        self.push(self.unary(self.pop(), operator.neg, "neg", "-"))

    def op_UNARY_INVERT(self, f, ins):
        self.push(self.unary(self.pop(), operator.invert, "bitwise_not", "~"))

    def op_UNARY_NOT(self, f, ins):
        self.push(PyVar(not self.truth(self.pop(), "UNARY_NOT")))

    def op_IS_OP(self, f, ins):
        b, a = _unlazy(self.pop()), _unlazy(self.pop())
        if isinstance(a, ScalarVar) or isinstance(b, ScalarVar):
            # a float read at each call is a new object at each call (or not): only itself, or a
            # value of another type (its type is guarded), gives the same answer each time
            s, o = (a, b) if isinstance(a, ScalarVar) else (b, a)
            if s is o:
                r = True
            elif not isinstance(o, (PyVar, ScalarVar)) or type(o.value) is not type(s.value):
                r = False
            else:
                self.unsupported("identity (is) of floats read at each call")
        elif isinstance(a, PyVar) and isinstance(b, PyVar):
            va, vb = a.value, b.value
            if a is not b and (a.source is not None or b.source is not None) and type(va) is type(vb) \
                    and type(va) in (int, float, complex, str, bytes) and va == vb \
                    and not (type(va) is int and -5 <= va <= 256):
                # equal numbers or strings, guarded by value: one object at this call, maybe
                # two at the next (only CPython's small ints are always one)
                self.unsupported("identity (is) of equal %s values read from the frame" % type(va).__name__)
            r = va is vb
        else:
            r = a is b
        self.push(PyVar(r != bool(ins.arg)))

    def op_CONTAINS_OP(self, f, ins):
        b, a = _unlazy(self.pop()), self.py(self.pop())
        if isinstance(b, DictVar):
            r = a in b.items
        else:
            r = a in [self.py(x) for x in self.unpack(b)] if not isinstance(b, PyVar) else a in b.value
        self.push(PyVar(r != bool(ins.arg)))

    # ------------------------------------------------------------------ subscripts

    def op_BINARY_SUBSCR(self, f, ins):
        k, o = self.pop(), self.pop()
        self.push(self.getitem(o, k))

    def op_BINARY_SLICE(self, f, ins):
        stop, start, o = self.pop(), self.pop(), self.pop()
        self.push(self.getitem(o, PyVar(slice(self.py(start), self.py(stop)))))

    def getitem(self, o, k):
        o, k = _unlazy(o), _unlazy(k)
        if isinstance(o, ArrayVar):
            return self.array_call(operator.getitem, [o, k], {})
        if isinstance(o, ShapeVar):
            key = self.py(k)
            axes = range(o.array.ndim)[key]
            if isinstance(key, slice):
                return TupleVar([PyVar(self.dim(o.array, a)) for a in axes])
            return PyVar(self.dim(o.array, axes))
        key = self.py(k, "index")
        if isinstance(o, (TupleVar, ListVar)):
            r = o.items[key]
            return type(o)(r) if isinstance(key, slice) else r
        if isinstance(o, DictVar):
            if key not in o.items:
                self.unsupported("KeyError %r while tracing" % (key,))
            return o.items[key]
        if isinstance(o, PyVar) and torch is not None and isinstance(o.value, (torch.nn.ModuleList, torch.nn.Sequential)):
            names = list(o.value._modules)
            if isinstance(key, slice):
                self.unsupported("slicing an nn.ModuleList/Sequential")
            return self.module_child(o, names[key])
        if isinstance(o, PyVar) and torch is not None and isinstance(o.value, torch.nn.ModuleDict):
            return self.module_child(o, key)
        return self.fold(operator.getitem, [o, k], {})

    def op_STORE_SUBSCR(self, f, ins):
        k, o, v = self.pop(), _unlazy(self.pop()), self.pop()
        if isinstance(o, ListVar):
            self.local_list(o).items[self.py(k)] = v
        elif isinstance(o, DictVar):
            self.local_dict(o).items[self.py(k, "dict key")] = v
        elif isinstance(o, ArrayVar):
            self.unsupported("item assignment into an array (in-place update) is not supported")
        else:
            self.unsupported("item assignment into %s (side effect)" % _describe(o))

    def op_STORE_SLICE(self, f, ins):
        self.unsupported("slice assignment is not supported")

    def op_DELETE_SUBSCR(self, f, ins):
        self.unsupported("del of an item is not supported")

    def op_STORE_ATTR(self, f, ins):
        self.unsupported("attribute store .%s is not supported (side effect)" % ins.argval)

    # ------------------------------------------------------------------ attributes

    def op_LOAD_ATTR(self, f, ins):
        obj = _unlazy(self.pop())
        method = sys.version_info >= (3, 12) and (ins.arg & 1)
        self.load_attr(obj, ins.argval, method)

    def op_LOAD_METHOD(self, f, ins):
        self.load_attr(_unlazy(self.pop()), ins.argval, True)

    def load_attr(self, obj, name, method):
        v = self.getattr_var(obj, name)
        if method:
            if isinstance(v, MethodVar):
                self.push(v.fn)
                self.push(v.self_var)
            else:
                self.push(NULL)
                self.push(v)
        else:
            self.push(v)

    def getattr_var(self, obj, name):
        obj = _unlazy(obj)
        if isinstance(obj, ArrayVar):
            return self.array_attr(obj, name)
        if isinstance(obj, (ListVar, DictVar, TupleVar)):
            base = {ListVar: list, DictVar: dict, TupleVar: tuple}[type(obj)]
            if not hasattr(base, name):
                raise AbsentAttribute("%s has no attribute %r" % (base.__name__, name), self.frame.user_stack())
            return MethodVar(PyVar(getattr(base, name)), obj)
        if isinstance(obj, FuncVar):
            self.unsupported("attribute of a function made in the trace")
        if isinstance(obj, ScalarVar):
            obj = PyVar(self.py(obj))       # lr.real, lr.is_integer(): of this value
        if not isinstance(obj, PyVar):
            self.unsupported("attribute %r of %s" % (name, _describe(obj)))
        value, src = obj.value, obj.source
        if name == "__dict__" and src is not None:
            # a mapping whose items no guard reads (o.__dict__["lr"] = 0.25 later went unseen)
            self.unsupported("%s.__dict__ is read by Python (hint: read the attribute itself)"
                             % type(value).__name__)
        if isinstance(value, types.ModuleType):
            d = value.__dict__
            if name in d:
                return self.wrap(d[name], S.DictAttrSource(src, name) if src else None, constant=True)
            return self.wrap(getattr(value, name), None)
        if torch is not None and isinstance(value, torch.nn.Module):
            for dname in ("_parameters", "_buffers", "_modules"):
                d = value.__dict__.get(dname)
                if d is not None and name in d:
                    s = S.ItemSource(S.DictAttrSource(src, dname), name) if src else None
                    if d[name] is None:
                        return PyVar(None)
                    return self.wrap(d[name], s)
        if isinstance(value, type):
            raw = S.type_lookup(value, name)
            if src is not None and _plain_class_attr(raw):      # C.eps: guarded as it is read
                return self.wrap(raw, S.TypeAttrSource(src, name))
            if src is not None and raw is not S.MISSING:
                self.guard(S.TypeAttrSource(src, name), "id", raw)     # a method replaced on the class
                if isinstance(raw, classmethod) and isinstance(raw.__func__, types.FunctionType):
                    return MethodVar(PyVar(raw.__func__), obj)       # cls: the class, with its source
                if isinstance(raw, staticmethod):
                    return PyVar(raw.__func__)
            try:
                return PyVar(getattr(value, name))
            except AttributeError as e:
                if raw is S.MISSING and not hasattr(type(value), name):
                    self.guard(src, "notypeattr", name)
                raise AbsentAttribute("AttributeError while tracing: %s" % e, self.frame.user_stack())
        if isinstance(value, threading.local):
            self.unsupported("attribute %r of a threading.local (state per thread)" % name)
        inst = getattr(value, "__dict__", None)
        if isinstance(inst, dict) and name in inst:
            return self.wrap(inst[name], S.DictAttrSource(src, name) if src else None)
        cls_attr = S.type_lookup(type(value), name)
        if src is not None and type(cls_attr) is types.MemberDescriptorType:     # a __slots__ member
            v = S.slot_get(value, name)
            if v is S.MISSING:
                raise AbsentAttribute("%s.%s is unset" % (type(value).__name__, name), self.frame.user_stack())
            return self.wrap(v, S.SlotAttrSource(src, name))
        # the class, as a constant: the object's type is guarded before any attribute is read,
        # and one register serves every instance of it
        csrc = S.ConstSource(type(value), G._type_name(type(value))) if src is not None else None
        shadowable = cls_attr is S.MISSING or _plain_class_attr(cls_attr) or \
            isinstance(cls_attr, (types.FunctionType, staticmethod, classmethod))
        if src is not None and isinstance(inst, dict) and shadowable:
            # an instance attribute set later would shadow the class's value or method (or the
            # absence getattr(obj, name, default) and hasattr read): guarded, as Python looks
            self.guard(src, "noattr", name)
        if cls_attr is S.MISSING:
            if src is not None:
                self.guard(csrc, "notypeattr", name)                    # nor on the class
            cls_attr = None
        elif src is not None and _plain_class_attr(cls_attr):
            return self.wrap(cls_attr, S.TypeAttrSource(csrc, name))
        elif src is not None and isinstance(cls_attr, (types.FunctionType, property, staticmethod, classmethod)):
            self.guard(S.TypeAttrSource(csrc, name), "id", cls_attr)   # a method replaced on the class
        if isinstance(cls_attr, types.FunctionType):
            return MethodVar(PyVar(cls_attr), obj)
        if isinstance(cls_attr, property) and isinstance(cls_attr.fget, types.FunctionType):
            return self.call_var(PyVar(cls_attr.fget), [obj], {})
        if isinstance(cls_attr, staticmethod):
            return PyVar(cls_attr.__func__)
        if isinstance(cls_attr, classmethod):
            return MethodVar(PyVar(cls_attr.__func__), PyVar(type(value), csrc))
        custom = getattr(type(value), "__getattr__", None)
        if cls_attr is None and src is not None and custom is not None and \
                not (torch is not None and isinstance(value, torch.nn.Module)):
            # computed by Python code on each read (a config object over a dict): no guard can
            # tell when it changes, so it is read by Python
            self.unsupported("%s.%s is served by %s.__getattr__" % (type(value).__name__, name,
                                                                   type(value).__name__))
        try:
            attr = getattr(value, name)
        except AttributeError as e:
            raise AbsentAttribute("AttributeError while tracing: %s" % e, self.frame.user_stack())
        if type(attr) in SCALARS or isinstance(attr, (types.BuiltinMethodType, types.MethodWrapperType)):
            return PyVar(attr)
        return self.wrap(attr, None)

    def array_attr(self, arr, name):
        if name == "shape":
            return ShapeVar(arr)
        if name == "ndim":
            return PyVar(arr.ndim)
        if name == "dtype":
            return PyVar(arr.example.dtype)
        if name == "size" and arr.kind == "numpy":
            n = 1
            for a in range(arr.ndim):
                n *= self.dim(arr, a)
            return PyVar(n)
        if name in ("T", "mT", "real"):
            return self.array_call(lambda x: getattr(x, name), [arr], {})
        if arr.kind == "torch" and name in ("device", "requires_grad", "is_cuda", "layout"):
            return PyVar(getattr(arr.example, name))
        if name == "itemsize":
            return PyVar(int(arr.example.itemsize))         # of the dtype, which is guarded
        if name == "nbytes":
            n = int(arr.example.itemsize)
            for a in range(arr.ndim):
                n *= self.dim(arr, a)
            return PyVar(n)
        raw = inspect.getattr_static(arr.example, name, None)
        if isinstance(raw, (property, types.GetSetDescriptorType, types.MemberDescriptorType)) or \
                raw is not None and not callable(raw):
            # a data attribute (x.base, x.strides, x.flags, t.grad): its value, or whether it is
            # None, is not a method to call later: Python reads it
            self.unsupported("array attribute %r is read by Python" % name)
        return ArrayMethodVar(arr, name)

    def module_child(self, mod_var, name):
        mod = mod_var.value
        src = S.ItemSource(S.DictAttrSource(mod_var.source, "_modules"), name) if mod_var.source else None
        return self.wrap(mod._modules[name], src)

    # ------------------------------------------------------------------ calls

    def op_CALL(self, f, ins):
        n = ins.arg
        args = self.pop(n)
        callable_, first = self.pop(), self.pop()
        if first is not NULL:                       # [method, self, args] form
            callable_, args = first, [callable_] + args
        kwargs = {}
        if f.kw_names:
            k = len(f.kw_names)
            kwargs = dict(zip(f.kw_names, args[len(args) - k:]))
            args = args[:len(args) - k]
            f.kw_names = None
        self.push(self.call_var(callable_, args, kwargs))

    def op_CALL_FUNCTION_EX(self, f, ins):
        kw = _unlazy(self.pop()) if ins.arg & 1 else DictVar({})
        args = self.unpack(self.pop())
        fn = self.pop()
        if f.stack and f.stack[-1] is NULL:
            self.pop()
        if not isinstance(kw, DictVar):
            self.unsupported("**kwargs from %s" % _describe(kw))
        self.push(self.call_var(fn, args, dict(kw.items)))

    def op_MAKE_FUNCTION(self, f, ins):
        code = self.py(self.pop())
        closure = tuple(self.pop().items) if ins.arg & 0x08 else ()
        if ins.arg & 0x04:
            self.pop()
        kwdefaults = {}
        if ins.arg & 0x02:
            kwd = _unlazy(self.pop())
            kwdefaults = dict(kwd.items) if isinstance(kwd, DictVar) else {k: PyVar(v) for k, v in self.py(kwd).items()}
        defaults = tuple(self.unpack(self.pop())) if ins.arg & 0x01 else ()    # (0,): a constant tuple
        self.push(FuncVar(code, f.f_globals, defaults, kwdefaults, closure, code.co_name))

    def call_var(self, fn, args, kwargs):
        fn = _unlazy(fn)
        if isinstance(fn, MethodVar):
            return self.call_var(fn.fn, [fn.self_var] + list(args), kwargs)
        if isinstance(fn, FuncVar):
            return self.inline(fn.code, fn.f_globals, fn.closure, fn.defaults, fn.kwdefaults, args, kwargs)
        if isinstance(fn, ArrayMethodVar):
            return self.array_method(fn.array, fn.name, args, kwargs)
        if not isinstance(fn, PyVar):
            self.unsupported("call of %s" % _describe(fn))
        v = fn.value
        if v in _CONTAINER_METHODS if _hashable(v) else False:
            return self.container_method(v, args, kwargs)
        if torch is not None and isinstance(v, torch.nn.Module):
            return self.module_call(fn, args, kwargs)
        if isinstance(v, types.BuiltinFunctionType) and getattr(v, "__module__", None) == "builtins" \
                or v in (range, enumerate, zip, reversed, int, float, bool, str, tuple, list, dict,
                         type, slice, isinstance, len):
            return self.builtin_call(v, args, kwargs)
        if NP.is_numpy_callable(v):
            return self.numpy_call(v, args, kwargs)
        if torch is not None and _is_torch_callable(v):
            from . import torch_ops
            return torch_ops.call(self, v, args, kwargs)
        if isinstance(v, types.FunctionType):
            cells = tuple(CellVar(loader=_cell_loader(self, c, S.CellSource(c, "%s.<cell %s>" % (v.__qualname__, n))))
                          for n, c in zip(v.__code__.co_freevars, v.__closure__ or ()))
            defaults = self.function_defaults(v, fn.source, "__defaults__")
            kwd = self.function_defaults(v, fn.source, "__kwdefaults__")
            return self.inline(v.__code__, v.__globals__, cells, defaults, kwd, args, kwargs)
        if isinstance(v, types.MethodType) and isinstance(v.__func__, types.FunctionType):
            # a bound method held somewhere (scale = obj.scale): its function and its object are
            # read through it, so rebinding it or changing the object is seen
            src = fn.source
            func = self.wrap(v.__func__, S.SlotAttrSource(src, "__func__") if src else None)
            obj = self.wrap(v.__self__, S.SlotAttrSource(src, "__self__") if src else None)
            return self.call_var(func, [obj] + list(args), kwargs)
        if _hashable(v) and v in _FLOAT_RESULT and not kwargs and any(isinstance(_unlazy(a), ScalarVar) for a in args):
            r = self.scalar_op(v, _name(v), [_unlazy(a) for a in args])      # math.sqrt(lr)
            if r is not None:
                return r
        mod = (getattr(v, "__module__", None) or "").split(".")[0]
        if mod in FOLDABLE_MODULES and not _any_array(args, kwargs):
            return self.fold(v, args, kwargs)
        if isinstance(v, type):
            self.unsupported("constructing an instance of %s is not supported" % v.__qualname__)
        if isinstance(v, (types.BuiltinMethodType, types.MethodWrapperType)):
            owner = getattr(v, "__self__", None)
            if type(owner) in SCALARS or type(owner) is tuple:
                return self.fold(v, args, kwargs)
        self.unsupported("call to %s %s is not supported" % (_kind_name(v), _name(v)))

    def function_defaults(self, fn, src, name):
        """fn.__defaults__ (a tuple) or fn.__kwdefaults__ (a dict) as lazy Vars: a default the
        call uses is read through fn (src) and guarded then, so assigning fn.__defaults__ later
        is seen; the defaults a call never uses are not guarded."""
        values = getattr(fn, name)
        empty = () if name == "__defaults__" else {}
        if not values:
            return empty
        if src is None:
            return type(empty)((k, self.wrap(d, None)) for k, d in values.items()) if isinstance(values, dict) \
                else tuple(self.wrap(d, None) for d in values)
        fsrc, shape = S.FuncAttrSource(src, name), []

        def loader(key):
            def load():
                if not shape:       # the first default used: the tuple or dict itself
                    shape.append(True)
                    self.guard(fsrc, "type", type(values))
                    self.guard(fsrc, "len", len(values))
                return self.wrap(values[key], S.ItemSource(fsrc, key))
            return load
        if isinstance(values, dict):
            return {k: _Lazy(loader(k)) for k in values}
        return tuple(_Lazy(loader(i)) for i in range(len(values)))

    def inline(self, code, f_globals, closure, defaults, kwdefaults, args, kwargs):
        if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):
            self.unsupported("generator/coroutine function %s is not supported" % code.co_name)
        depth, p = 0, self.frame
        while p is not None:
            depth, p = depth + 1, p.parent
        if depth > 40:
            self.unsupported("inlining deeper than 40 frames (recursion?)")
        dummy = types.FunctionType(code, {}, code.co_name, defaults or None,
                                   tuple(types.CellType() for _ in code.co_freevars))
        dummy.__kwdefaults__ = dict(kwdefaults) or None
        import inspect
        try:
            bound = inspect.signature(dummy).bind(*args, **kwargs)
        except TypeError as e:
            self.unsupported("TypeError while tracing a call to %s: %s" % (code.co_name, e))
        bound.apply_defaults()
        builtins_ = f_globals.get("__builtins__", _builtins)
        frame = Frame(code, f_globals, builtins_ if isinstance(builtins_, dict) else vars(builtins_),
                      self.frame)
        for name, value in bound.arguments.items():
            if name.startswith("implicit") and name not in code.co_varnames:
                name = "." + name[len("implicit"):]         # inspect renames comprehension args
            if isinstance(value, tuple) and code.co_flags & 0x04 and name == code.co_varnames[
                    code.co_argcount + code.co_kwonlyargcount]:
                value = TupleVar(value)
            elif isinstance(value, dict) and code.co_flags & 0x08:
                value = DictVar(value)
            frame.locals[name] = value
        for name, cell in zip(code.co_freevars, closure):
            frame.cells[name] = cell
        return self.run_frame(frame)

    def module_call(self, mod_var, args, kwargs):
        mod = mod_var.value
        m = torch.nn.modules.module
        if mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or \
                m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks:
            self.unsupported("nn.Module hooks are not supported")
        if isinstance(mod, torch.nn.modules.dropout._DropoutNd) and mod.training and mod.p > 0 \
                and type(mod) is not torch.nn.Dropout:
            # Dropout1d/2d/3d, AlphaDropout, ...: as an extern call its eager example would draw
            # from the RNG while tracing (nn.Dropout is inlined: F.dropout, see torch_ops.call)
            self.unsupported("%s in training mode is random (hint: model.eval())" % type(mod).__name__)
        fwd = type(mod).forward
        if getattr(mod, "inplace", False) is True and (type(mod).__module__ or "").startswith("torch.nn"):
            # nn.ReLU/LeakyReLU/ELU/...(inplace=True): its forward, inlined, calls F.<act>(x, ...,
            # inplace=True), traced in place where x is no input (torch_ops._inplace_call). As a
            # module call, its eager example while tracing would update the input it is given, and
            # the call would then apply it a second time
            from .torch_ops import _INPLACE_ACTIVATIONS
            if type(mod).__name__.lower() not in {a.replace("_", "") for a in _INPLACE_ACTIVATIONS}:
                self.unsupported("%s(inplace=True) updates its input in place" % type(mod).__name__)
            return self.inline(fwd.__code__, fwd.__globals__, (), tuple(self.wrap(d, None) for d in
                               (fwd.__defaults__ or ())), {}, [mod_var] + list(args), kwargs)
        if type(mod) is torch.nn.Sequential and len(args) == 1 and not kwargs:
            # its children one after the other: each is inlined, traced or called on its own
            if mod_var.source is not None:
                self.guard(S.DictAttrSource(mod_var.source, "_modules"), "len", len(mod._modules))
            x = args[0]
            for name in mod._modules:
                x = self.call_var(self.module_child(mod_var, name), [x], {})
            return x
        if self.fx is not None and type(mod) not in _inline_torch_modules() and \
                (type(mod).__module__ or "").startswith("torch."):
            return self.fx_module_call(mod_var, args, kwargs)
        if self.fx is None and type(mod) in _batch_norms() and not mod.training and mod_var.source is not None \
                and mod.running_mean is not None and mod.running_var is not None and len(args) == 1 and not kwargs \
                and isinstance(_unlazy(args[0]), ArrayVar) and _unlazy(args[0]).kind == "torch" \
                and _unlazy(args[0]).ndim >= 2 and _unlazy(args[0]).example.dtype in (torch.float32, torch.float64) \
                and all(t is None or t.dtype == _unlazy(args[0]).example.dtype
                        for t in (mod.running_mean, mod.running_var, mod.weight, mod.bias)):
            # eval mode (guarded), float32/float64 throughout (the dtypes are guarded): a
            # per-channel scale and shift, traced, so it fuses with the ops around it (torch's
            # CPU kernel computes half in float32). Training mode updates its statistics: one
            # extern call
            from .torch_ops import batch_norm_eval
            return self.inline(batch_norm_eval.__code__, batch_norm_eval.__globals__, (), (), {},
                               [mod_var] + list(args), {})
        if type(mod) in _inline_torch_modules():
            # torch's own forward, inlined so its ops fuse (nn.GELU -> the core's gelu)
            return self.inline(fwd.__code__, fwd.__globals__, (), tuple(self.wrap(d, None) for d in
                               (fwd.__defaults__ or ())), {}, [mod_var] + list(args), kwargs)
        return self.call_var(PyVar(fwd), [mod_var] + list(args), kwargs)

    def container_method(self, fn, args, kwargs):
        self_var = _unlazy(args[0])
        rest = args[1:]
        if fn in (list.append, list.extend, list.insert, list.pop, list.clear, list.reverse):
            lst = self.local_list(self_var)
            if fn is list.append:
                lst.items.append(rest[0])
            elif fn is list.extend:
                lst.items.extend(self.unpack(rest[0]))
            elif fn is list.insert:
                lst.items.insert(self.py(rest[0]), rest[1])
            elif fn is list.pop:
                return lst.items.pop(*[self.py(r) for r in rest])
            elif fn is list.clear:
                lst.items.clear()
            else:
                lst.items.reverse()
            return PyVar(None)
        if fn in (dict.items, dict.keys, dict.values, dict.get):
            if not isinstance(self_var, DictVar):
                self.unsupported("dict method on %s" % _describe(self_var))
            if fn is dict.items:
                return ListVar([TupleVar([PyVar(k), v]) for k, v in self_var.items.items()])
            if fn is dict.keys:
                return ListVar([PyVar(k) for k in self_var.items])
            if fn is dict.values:
                return ListVar(list(self_var.items.values()))
            key = self.py(rest[0])
            return self_var.items.get(key, rest[1] if len(rest) > 1 else PyVar(None))
        if fn is dict.update:
            self.local_dict(self_var).items.update(_unlazy(rest[0]).items)
            return PyVar(None)
        if fn in (list.index, list.count, tuple.index, tuple.count):
            return self.fold(fn, [self_var] + list(rest), kwargs)
        self.unsupported("container method %s" % _name(fn))

    def builtin_call(self, fn, args, kwargs):
        args = [_unlazy(a) for a in args]
        if fn is print:
            self.unsupported("call to builtin print is not supported")
        if fn is len:
            a = args[0]
            if isinstance(a, ArrayVar):
                return PyVar(self.dim(a, 0))
            if isinstance(a, ShapeVar):
                return PyVar(a.array.ndim)
            if isinstance(a, DictVar):
                return PyVar(len(a.items))
            return PyVar(len(self.unpack(a)))
        if isinstance(args[0] if args else None, ScalarVar) and len(args) <= 2:
            a = args[0]                         # a float or NumPy float, by its type guard; its value unread
            if fn is float and len(args) == 1 and type(a.value) is float:
                return a
            if fn in (float, abs) and len(args) == 1:
                r = self.scalar_op(fn, fn.__name__, args)      # float(np.float32(x)): a Python float
                if r is not None:
                    return r
            if fn is type and len(args) == 1:
                return PyVar(type(a.value))
            if fn is isinstance:
                return PyVar(isinstance(a.value, self.py(args[1])))
        if fn is isinstance:
            a = args[0]
            ex = a.example if isinstance(a, ArrayVar) else None
            if ex is not None:
                return PyVar(isinstance(ex, self.py(args[1])))
            if isinstance(a, (TupleVar, ListVar, DictVar)):
                return PyVar(isinstance({TupleVar: (), ListVar: [], DictVar: {}}[type(a)], self.py(args[1])))
        if fn is type and len(args) == 1:
            a = args[0]
            if isinstance(a, ArrayVar):
                return PyVar(type(a.example))
            if isinstance(a, (TupleVar, ListVar, DictVar)):
                return PyVar({TupleVar: tuple, ListVar: list, DictVar: dict}[type(a)])
        if fn in (tuple, list) and len(args) == 1:
            return (TupleVar if fn is tuple else ListVar)(self.unpack(args[0]))
        if fn in (tuple, list) and not args:
            return (TupleVar if fn is tuple else ListVar)([])
        if fn is dict and not args:
            return DictVar({k: v for k, v in kwargs.items()})
        if fn is enumerate:
            start = self.py(args[1]) if len(args) > 1 else self.py(kwargs.get("start", PyVar(0)))
            return ListVar([TupleVar([PyVar(i + start), v]) for i, v in enumerate(self.unpack(args[0]))])
        if fn is zip:
            cols = [self.unpack(a) for a in args]
            return ListVar([TupleVar(list(t)) for t in zip(*cols)])
        if fn is reversed:
            return ListVar(self.unpack(args[0])[::-1])
        if fn is iter and len(args) == 1:
            return IterVar(self.unpack(args[0]))
        if fn is next and isinstance(args[0], IterVar):
            it = args[0]
            if it.pos >= len(it.items):
                self.unsupported("StopIteration while tracing")
            it.pos += 1
            return it.items[it.pos - 1]
        if fn is getattr and len(args) in (2, 3):
            name = self.py(args[1])
            try:
                return self.getattr_var(args[0], name)
            except AbsentAttribute:
                if len(args) == 3:
                    return args[2]          # absent (guarded by getattr_var where it can be)
                raise
        if fn is hasattr:
            o = _unlazy(args[0])
            if isinstance(o, ArrayVar):
                return PyVar(hasattr(o.example, self.py(args[1])))
            if isinstance(o, PyVar) and o.source is not None and len(args) == 2:
                name = self.py(args[1])
                try:
                    self.getattr_var(o, name)      # guards what it finds, or the absence
                    return PyVar(True)
                except AbsentAttribute:
                    return PyVar(False)
        if fn in (sum, max, min, abs) and _any_array(args, kwargs) or \
                fn is sum and len(args) == 1 and any(isinstance(_unlazy(x), ArrayVar) for x in self.unpack(args[0])):
            return self.builtin_array(fn, args, kwargs)
        if fn in (float, int, bool, complex) and _any_array(args, kwargs):
            self.unsupported("data-dependent %s() of an array value" % fn.__name__)
        if fn in FOLDABLE_BUILTINS:
            return self.fold(fn, args, kwargs)
        self.unsupported("call to builtin %s is not supported" % _name(fn))

    def builtin_array(self, fn, args, kwargs):
        if fn is abs and len(args) == 1:
            return self.array_op(operator.abs, "abs", args, "abs")
        if fn is sum and len(args) <= 2 and not kwargs:
            items = self.unpack(args[0])
            acc = args[1] if len(args) > 1 else PyVar(0)
            for x in items:
                acc = self.binary(acc, x, "+", False)
            return acc
        self.unsupported("builtin %s on arrays (data-dependent comparison)" % fn.__name__)

    def numpy_call(self, fn, args, kwargs):
        if NP.writes_into(fn, len(args), kwargs):
            self.unsupported("%s(out=...) writes into an array (side effect)" % _name(fn))
        if not NP.is_pure(fn):
            self.unsupported("call to %s is not supported (not a pure function)" % _name(fn))
        if not _any_array(args, kwargs):
            if isinstance(fn, type) and issubclass(fn, NP.FOLDABLE_CLASSES) or \
                    fn in (np.result_type, np.promote_types, np.can_cast, np.dtype):
                return self.fold(fn, args, kwargs)
            return self.fold(fn, args, kwargs)
        kind = _kind_of(args, kwargs)
        if kind == "torch":
            self.unsupported("NumPy function %s on a torch tensor" % _name(fn))
        nargs = len(args)
        if fn in NP.UNARY and nargs == 1 and not kwargs:
            return self.array_call(fn, args, kwargs, NP.UNARY[fn])
        if fn in NP.BINARY and nargs == 2 and not kwargs:
            return self.array_call(fn, args, kwargs, NP.BINARY[fn])
        if fn is np.where and nargs == 3 and not kwargs:
            return self.array_call(fn, args, kwargs, "where")
        if fn is np.clip and nargs == 3 and not kwargs:
            lo, hi = _unlazy(args[1]), _unlazy(args[2])
            if not (isinstance(lo, PyVar) and lo.value is None) and not (isinstance(hi, PyVar) and hi.value is None):
                return self.array_call(fn, args, kwargs, "clamp")
        if fn in (np.round, np.around) and nargs == 1 and not kwargs:
            return self.array_call(fn, args, kwargs, "round")
        if fn in NP.REDUCTION_FNS:
            name = NP.REDUCTION_FNS[fn]
            import inspect
            try:
                b = inspect.signature(fn).bind(*args, **kwargs)
                params = {k: self.py(v) for k, v in b.arguments.items() if k != "a"}
            except (TypeError, ValueError, Unsupported):
                params = None
            if params is not None and "a" in b.arguments and not any(
                    v is not np._NoValue for k, v in params.items() if k in ("where", "initial")):
                params = {k: v for k, v in params.items() if v is not np._NoValue}
                attrs = NP.reduction_attrs(name, **params)
                if attrs is not None:
                    return self.array_call(fn, args, kwargs, NP.REDUCTIONS[name], attrs,
                                           core_args=[b.arguments["a"]])
        if fn is np.asarray and nargs == 1 and not kwargs and isinstance(_unlazy(args[0]), ArrayVar):
            return _unlazy(args[0])
        return self.array_call(fn, args, kwargs)

    def array_method(self, arr, name, args, kwargs):
        what = "Tensor" if arr.kind == "torch" else "ndarray"
        if name in NP.INPLACE_METHODS:
            if len(args) != 1 or kwargs:
                self.unsupported("%s.%s with %d arguments" % (what, name, len(args) + len(kwargs)))
            return self.binary(arr, args[0], NP.INPLACE_METHODS[name], True)
        if name in NP.MUTATING_DUNDERS or what == "ndarray" and name in NP.MUTATING_METHODS:
            self.unsupported("%s.%s mutates the array (side effect)" % (what, name))
        if arr.kind == "torch":
            from . import torch_ops
            return torch_ops.method(self, arr, name, args, kwargs)
        if name in NP.REDUCTIONS:
            return self.numpy_call(getattr(np, name), [arr] + list(args), kwargs)
        if name == "astype" and len(args) == 1 and not kwargs:
            dt = np.dtype(self.py(args[0]))
            return self.array_call(lambda x: x.astype(dt), [arr], {}, "cast", {"dtype": dt.name})
        if name in ("clip", "round") and hasattr(np, name):
            return self.numpy_call(getattr(np, name), [arr] + list(args), kwargs)
        if name in ("item", "tolist", "tobytes", "__bool__", "__int__", "__float__"):
            self.unsupported("data-dependent ndarray.%s()" % name)
        if not hasattr(np.ndarray, name):
            self.unsupported("ndarray has no attribute %r" % name)
        if hasattr(np, name) and NP.writes_into(getattr(np, name), 1 + len(args), kwargs):
            self.unsupported("ndarray.%s(out=...) writes into an array (side effect)" % name)   # a.clip(0, 1, o)
        return self.array_call(lambda x, *a, **k: getattr(x, name)(*a, **k), [arr] + list(args), kwargs)


# ---------------------------------------------------------------------- helpers

def _holds_convolutions(mod):
    """mod is, or holds, a torch.nn convolution (Conv1d/2d/3d, ConvTranspose1d/2d/3d)."""
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in mod.modules())


_EXAMPLE = threading.local()     # depth: inside Tracer.eager (an example computation) on this thread


class _FunctionalModule:
    """A torch module called with its parameters and buffers passed in (autograd mode). In the
    tracer's example computation (Tracer.eager) buffers are cloned, so it cannot update running
    statistics; under aot_autograd (grad on, or off for a no_grad inference graph) the real
    buffers are inputs and their updates are kept."""

    def __init__(self, mod, names, nparams):
        self.mod, self.names, self.nparams = mod, names, nparams
        self.__name__ = "module_" + type(mod).__name__

    def __call__(self, tensors, *args, **kwargs):
        from torch.func import functional_call
        if getattr(_EXAMPLE, "depth", 0):         # the tracer's eager example
            tensors = tuple(t if i < self.nparams else t.clone() for i, t in enumerate(tensors))
        return functional_call(self.mod, dict(zip(self.names, tensors)), args, kwargs)

    def __repr__(self):
        return "functional %s" % type(self.mod).__name__


class _NoCore(Exception):
    """A core op cannot express this call; use an extern call."""


class _Lazy:
    """A frame local not read yet: wrapped (and guarded) on first read."""

    def __init__(self, loader):
        self.loader, self.value = loader, None

    def get(self):
        if self.value is None:
            self.value = self.loader()
        return self.value


class _UnboundMarker(Var):
    pass


_UNBOUND = _UnboundMarker()


def _unlazy(v):
    return v.get() if isinstance(v, _Lazy) else v


def _cell_loader(tracer, cell, source):
    """Loads an inlined function's closure cell; source (S.CellSource): its contents are guarded
    and re-read at call time, and mutating them is a side effect."""
    def load():
        try:
            value = cell.cell_contents
        except ValueError:
            return None
        return tracer.wrap(value, source)
    return load


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


class _ListT(list):
    pass


class _DictT(dict):
    pass


def _fill(t, arrs):
    if isinstance(t, _Slot):
        return arrs[t.i]
    if isinstance(t, _ListT):
        return [_fill(x, arrs) for x in t]
    if isinstance(t, tuple):
        return tuple(_fill(x, arrs) for x in t)
    if isinstance(t, _DictT):
        return {k: _fill(x, arrs) for k, x in t.items()}
    return t


def _map_examples(tracer, v):
    v = _unlazy(v)
    if isinstance(v, ArrayVar):
        return v.example
    if isinstance(v, ScalarVar):        # metadata only: an example's value is never read later
        return v.value
    if isinstance(v, TupleVar):
        return tuple(_map_examples(tracer, x) for x in v.items)
    if isinstance(v, ListVar):
        return [_map_examples(tracer, x) for x in v.items]
    if isinstance(v, DictVar):
        return {k: _map_examples(tracer, x) for k, x in v.items.items()}
    return tracer.py(v)


def _is_array(x):
    return isinstance(x, (np.ndarray, np.generic)) or (torch is not None and isinstance(x, torch.Tensor))


def _strong_dtype(args, kind):
    """The result type of an op's strongly typed operands: arrays, and in NumPy code NumPy
    scalars (torch takes them as Python scalars); None where there are none."""
    dts = []
    for a in args:
        a = _unlazy(a)
        if isinstance(a, ArrayVar):
            dts.append(_np_dtype(a.example))
        elif kind == "numpy" and isinstance(a, (PyVar, ScalarVar)) and isinstance(a.value, np.generic):
            dts.append(a.value.dtype)
    return np.result_type(*dts) if dts else None


def _to_float16(v):
    """np.float16(v) of a Python int or float, inf past float16's range with no warning
    (torch gives none; NumPy's cast warning is not one the compiled call repeats)."""
    if -65520.0 < v < 65520.0:
        return np.float16(v)
    with np.errstate(over="ignore"):
        return np.float16(v)


def _np_dtype(example):
    if torch is not None and isinstance(example, torch.Tensor):
        return TORCH_TO_NP[example.dtype]
    return np.asarray(example).dtype


def _walk(v):
    v = _unlazy(v)
    if isinstance(v, (TupleVar, ListVar)):
        for x in v.items:
            yield from _walk(x)
    elif isinstance(v, DictVar):
        for x in v.items.values():
            yield from _walk(x)
    else:
        yield v


def _any_array(args, kwargs):
    return any(isinstance(x, ArrayVar) for a in list(args) + list(kwargs.values()) for x in _walk(a))


def _kind_of(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        for x in _walk(a):
            if isinstance(x, ArrayVar):
                return x.kind
    return "numpy"


# functions whose number of results follows their arguments' sizes (Tracer.extern guards them)
_COUNT_BY_SIZE = ("unbind", "split", "chunk", "unstack", "hsplit", "vsplit", "dsplit")


def _name(fn):
    mod = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return "%s.%s" % (mod, name) if mod and mod != "builtins" else name


def _kind_name(v):
    if isinstance(v, types.BuiltinFunctionType):
        return "builtin"
    return "C extension function" if not isinstance(v, types.FunctionType) else "function"


def _plain_class_attr(v):
    """A class attribute that reads back as it is stored: data, not a descriptor (a function,
    property, staticmethod or classmethod is bound or called on the way)."""
    return v is not S.MISSING and not hasattr(type(v), "__get__")


def _describe(v):
    v = _unlazy(v)
    if isinstance(v, PyVar):
        return type(v.value).__name__
    return type(v).__name__


def _is_torch_callable(v):
    mod = getattr(v, "__module__", None) or ""
    return mod == "torch" or mod.startswith("torch.") or getattr(v, "__self__", None) is torch._C._VariableFunctions \
        or type(v).__name__ == "builtin_function_or_method" and getattr(v, "__self__", None).__class__.__name__ == "module" \
        and getattr(getattr(v, "__self__", None), "__name__", "").startswith("torch")


_NP_FLOATS = (np.float16, np.float32, np.float64)

# torch's CPU ops that take a Python scalar (or a 0-d tensor of another float dtype) next to a
# float16/bfloat16 tensor as it is, in float32 (opmath: x * 100000 is 0 at 0); its other ops
# make it a float16 first (x - 0.1 is 0 at float16(0.1), x < 0.1 compares with float16(0.1)).
# Both torch routes read it: this tracer's and the backend's lowering (backends/torch.py)
_TORCH_OPMATH_SCALAR = frozenset(("mul", "div", "floordiv"))

# functions of floats and ints whose result is a float (or an exception): float arithmetic on
# ScalarVars that Python computes again at each call (Tracer.scalar_op); ** is not here (a
# negative base gives a complex)
_FLOAT_RESULT = frozenset((operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
                           operator.mod, operator.neg, operator.pos, abs, math.sqrt, math.exp, math.log,
                           math.log2, math.log10, math.log1p, math.expm1, math.sin, math.cos, math.tan,
                           math.tanh, math.atan, math.fabs, math.hypot, math.atan2, math.copysign, float))

_CONTAINER_METHODS = {list.append, list.extend, list.insert, list.pop, list.clear, list.reverse,
                      list.index, list.count, tuple.index, tuple.count, dict.items, dict.keys,
                      dict.values, dict.get, dict.update}

def _sync_torch():
    """Bind torch (and the dtype table) here once the process has imported it. Every Tracer
    calls it, so torch imported after fastcompile is seen by the next trace."""
    global torch
    if torch is not None:
        return
    t = sys.modules.get("torch")
    if t is None or not hasattr(t, "nn"):          # not imported, or still importing
        return
    TORCH_TO_NP.update({dt: np.dtype(name) for dt, name in torch_numpy_dtypes(t).items()})
    torch = t



def _host_of(x):
    """A traced example's memory as a NumPy array (tensors: their NumPy view), or None."""
    if isinstance(x, np.ndarray):
        return x
    if torch is not None and isinstance(x, torch.Tensor) and x.dtype in TORCH_TO_NP \
            and x.layout == torch.strided and x.device.type == "cpu":
        return x.detach().numpy()
    return None


def _storage_ptr(t):
    """Where a tensor's storage starts; None for an empty or non-strided one (unknown: not fresh)."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or not t.numel():
        return None
    return t.untyped_storage().data_ptr()


@functools.lru_cache(maxsize=None)
def _batch_norms():
    nn = torch.nn
    return frozenset((nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d))


@functools.lru_cache(maxsize=None)
def _inline_torch_modules():
    """torch.nn modules whose forward is inlined (its ops become core ops); other torch
    modules run whole as one extern call, which is safer for large forwards
    (attention, convolutions) the tracer would break inside."""
    nn = torch.nn
    return frozenset(getattr(nn, n) for n in ("GELU", "SiLU", "ReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax",
                                              "LayerNorm", "Dropout", "Identity", "Softplus", "Mish", "Hardtanh")
                     if hasattr(nn, n))
