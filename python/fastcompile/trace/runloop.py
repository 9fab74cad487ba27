"""Trace stage, run loop: executes a Frame's instructions one at a time through the opcode
handlers, and wraps the values read from the real frame as Vars with the guards they need.
In: a Frame; out: its return value (or Stop at the break instruction of a restart)."""

import enum
import numbers
import types

import numpy as np

from fastcompile import config as _config

from . import guards as G
from . import helpers as H
from . import sources as S
from .helpers import NP_FLOATS, SCALARS, TORCH_TO_NP, Lazy, NeedAutograd, unlazy
from .variables import (
    ArrayMethodVar,
    ArrayVar,
    DictVar,
    FuncVar,
    ListVar,
    MethodVar,
    PyVar,
    ScalarVar,
    ShapeVar,
    TupleVar,
)

torch = H.reads_torch(__name__)  # bound by helpers.sync_torch()

MAX_STEPS = 200000


class Stop(Exception):
    """Raised when the top frame reaches the break instruction on a restart."""

    def __init__(self, frame):
        self.frame = frame


def _holds_convolutions(mod):
    """mod is, or holds, a torch.nn convolution (Conv1d/2d/3d, ConvTranspose1d/2d/3d)."""
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in mod.modules())


class RunLoop:
    """Tracer methods: wrapping frame values, the instruction loop, the stack and Python values."""

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
        if (
            (t is float or t in NP_FLOATS)
            and source is not None
            and not constant
            and self.fx is None
            and not _config.get("specialize_float")
        ):
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
            return TupleVar(
                [self.wrap(v, S.ItemSource(source, i) if source else None) for i, v in enumerate(value)], source
            )
        if t is list:
            if source is None:
                return ListVar([self.wrap(v, None) for v in value])
            self.guard(source, "type", list)
            snapshot = list(value)  # the items as read now; the trace mutates no outside list

            def items():  # on the first read of the items or length (ListVar)
                self.guard(source, "len", len(snapshot))
                return [self.wrap(v, S.ItemSource(source, i)) for i, v in enumerate(snapshot)]

            return ListVar((), source, loader=items)
        if t is dict:
            if source is None:
                if not all(type(k) in (str, int) for k in value):
                    self.unsupported("dict with non-str/int keys")
                return DictVar({k: self.wrap(v, None) for k, v in value.items()})
            self.guard(source, "type", dict)
            snapshot = dict(value)  # as ListVar's: read at the first use of the items

            def entries():
                self.guard(source, "len", len(snapshot))
                if not all(type(k) in (str, int) for k in snapshot):
                    self.unsupported("dict with non-str/int keys")
                return {k: self.wrap(v, S.ItemSource(source, k)) for k, v in snapshot.items()}

            return DictVar((), source, loader=entries)
        if (
            isinstance(
                value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type, np.ufunc, np.dtype)
            )
            or value is Ellipsis
        ):
            self.guard(source, "id", value)
            return PyVar(value, source)
        if torch is not None and isinstance(value, torch.nn.Module):
            if self.fx is None and any(p.requires_grad for p in value.parameters()):
                if torch.is_grad_enabled():
                    # it trains: traced for autograd from the start, before anything of it runs
                    # eagerly here (a BatchNorm ahead of the first parameter would update its
                    # running statistics once in this attempt and again in the autograd trace)
                    raise NeedAutograd()
                # traced under no_grad, its parameters data: only while grad stays off. Without
                # this guard a call with grad on would run this graph, which raises (.numpy() of a
                # tensor that requires grad), and the frame would run as plain Python at every
                # call: a model called once under no_grad (a warm-up, an evaluation) would train eagerly
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
        if G.eq_ok(value):  # NumPy scalars, complex, slices, ranges, namedtuples: by value
            self.guard(source, "eq", value)
            return PyVar(value, source)
        if isinstance(value, (enum.Enum, numbers.Number)):  # a member; Fraction, Decimal, long double
            self.guard(source, "id", value)  # (immutable, but no eq the C engine runs)
            return PyVar(value, source)
        # other objects: by type; what the trace reads of them (attributes) is guarded as read
        self.guard(source, "type", t)
        return PyVar(value, source)

    def array_input(self, arr, source, kind):
        # The core route keys inputs by object and source: one object reached through two sources
        # (z = pick(x, y) returning y) is two inputs, since no guard says the two sources will hold
        # one object at later calls (one input read through the first source would give z's value
        # for y once they differ). Its graph ops are pure, so aliasing changes no value. Autograd
        # mode keeps one placeholder per object (tied weights).
        key = id(arr) if self.fx is not None else (id(arr), source)
        if key in self.arrays:
            return self.arrays[key]
        if kind == "numpy":
            if self.fx is not None:
                self.unsupported(
                    "a NumPy array in a frame that trains (tensors requiring grad): "
                    "autograd frames are traced as torch ops only",
                    whole_frame=True,
                )
            if arr.dtype.kind not in "biuf" or arr.dtype.itemsize > 8:  # longdouble: not in the core
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
            if arr.requires_grad and self.fx is None:  # traced as data under no_grad: only while grad stays off
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

    def run_frame(self, frame):
        saved = getattr(self, "frame", None)
        self.frame = frame
        try:
            while True:
                ins = frame.instrs[frame.pc]
                frame.cur = frame.pc
                pos = getattr(ins, "positions", None)
                if pos is not None and pos.lineno:  # also right after a jump into a line
                    frame.lineno = pos.lineno
                elif ins.starts_line is not None:
                    frame.lineno = ins.starts_line
                if frame.top and self.stop_at is not None and frame.pc == self.stop_at:
                    raise Stop(frame)
                self.steps += 1
                if self.steps > MAX_STEPS:
                    self.unsupported("trace longer than %d instructions" % MAX_STEPS)
                if ins.offset in frame.protected:
                    self.unsupported(
                        "try/except/with blocks are not supported (%s inside a protected region)" % ins.opname
                    )
                frame.pc += 1
                handler = getattr(self, "op_" + ins.opname, None)
                if handler is None:
                    self.unsupported("bytecode %s is not supported" % ins.opname)
                result = handler(frame, ins)
                if result is not None:
                    return result[0]
        finally:
            self.frame = saved

    # ------------------------------------------------------------------ the stack, Python values

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
        if isinstance(var, Lazy):
            var = var.get()
        if isinstance(var, PyVar):
            return var.value
        if isinstance(var, ScalarVar):
            for r in var.roots:  # its value is the trace's from now on: guard it
                if not r.specialized:
                    r.specialized = True
                    self.guards = [g for g in self.guards if g is not r.type_guard]  # eq checks the type
                    self.guard(r.source, "eq", r.value)
            return var.value
        if isinstance(var, TupleVar):
            return tuple(self.py(v, what) for v in var.items)
        if isinstance(var, ListVar):
            return [self.py(v, what) for v in var.items]
        if isinstance(var, DictVar):
            return {k: self.py(v, what) for k, v in var.items.items()}
        if isinstance(var, ShapeVar):
            # the array's own shape type: torch.Size for a tensor (x.new(size) reads it as a
            # size, a plain tuple as data), tuple for NumPy
            dims = tuple(self.dim(var.array, i) for i in range(var.array.ndim))
            return type(var.array.example.shape)(dims)
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
        var = unlazy(var)
        if isinstance(var, ArrayVar):
            self.unsupported(
                "data-dependent branch on an array value (%s) (hint: use np.where or torch.where)" % opname
            )
        if isinstance(var, (TupleVar, ListVar)):
            return bool(var.items)
        if isinstance(var, DictVar):
            return bool(var.items)
        if isinstance(var, (FuncVar, MethodVar, ArrayMethodVar)):
            return True
        return bool(self.py(var))
