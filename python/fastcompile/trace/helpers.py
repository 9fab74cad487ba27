"""Trace stage, helpers: what every part of the tracer shares: torch (bound once the process
has imported it), the exceptions that switch routes, lazy frame locals, and small functions of
Vars and values. A leaf: it imports no trace module but variables (itself a leaf)."""

import math
import operator
import sys

import numpy as np

from fastcompile._common import torch_numpy_dtypes

from .variables import ArrayVar, DictVar, ListVar, PyVar, TupleVar

# torch is bound by sync_torch() once the process has imported it: importing fastcompile never
# imports torch (over a second), and a frame can hold torch objects only after the user's code
# imported it. None on NumPy-only installs, and until then.
torch = None
TORCH_TO_NP = {}
_TORCH_READERS = []  # the trace modules whose code reads the global torch (reads_torch)

SCALARS = (type(None), bool, int, float, str, bytes)


def reads_torch(module_name):
    """Registers a trace module whose code reads the global name torch: sync_torch binds it there
    too. Returns torch as bound now (None until the process has imported torch)."""
    _TORCH_READERS.append(module_name)
    return torch


def sync_torch():
    """Bind torch (and the dtype table) here once the process has imported it. Every Tracer
    calls it, so torch imported after fastcompile is seen by the next trace."""
    global torch
    if torch is not None:
        return
    t = sys.modules.get("torch")
    if t is None or not hasattr(t, "nn"):  # not imported, or still importing
        return
    TORCH_TO_NP.update({dt: np.dtype(name) for dt, name in torch_numpy_dtypes(t).items()})
    torch = t
    for name in _TORCH_READERS:
        sys.modules[name].torch = t


class NeedAutograd(Exception):
    """A tensor that requires grad reached the trace while grad mode is on (or a torch op the core
    graph cannot hold, such as torch.zeros): the frame is traced again in autograd mode, where
    torch-level ops are recorded as an FX graph for aot_autograd and the torch backend.
    optional: the core route could trace it too, only worse (a module holding convolutions, see
    Tracer.wrap); where autograd mode cannot trace the frame, it is traced the core way."""

    def __init__(self, optional=False):
        super().__init__()
        self.optional = optional


class NoCore(Exception):
    """A core op cannot express this call; use an extern call."""


class Lazy:
    """A frame local not read yet: wrapped (and guarded) on first read."""

    def __init__(self, loader):
        self.loader, self.value = loader, None

    def get(self):
        if self.value is None:
            self.value = self.loader()
        return self.value


def unlazy(v):
    return v.get() if isinstance(v, Lazy) else v


def is_array(x):
    return isinstance(x, (np.ndarray, np.generic)) or (torch is not None and isinstance(x, torch.Tensor))


def _walk(v):
    v = unlazy(v)
    if isinstance(v, (TupleVar, ListVar)):
        for x in v.items:
            yield from _walk(x)
    elif isinstance(v, DictVar):
        for x in v.items.values():
            yield from _walk(x)
    else:
        yield v


def any_array(args, kwargs):
    return any(isinstance(x, ArrayVar) for a in list(args) + list(kwargs.values()) for x in _walk(a))


def kind_of(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        for x in _walk(a):
            if isinstance(x, ArrayVar):
                return x.kind
    return "numpy"


def fn_name(fn):
    mod = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return "%s.%s" % (mod, name) if mod and mod != "builtins" else name


def describe(v):
    v = unlazy(v)
    if isinstance(v, PyVar):
        return type(v.value).__name__
    return type(v).__name__


NP_FLOATS = (np.float16, np.float32, np.float64)


# functions of floats and ints whose result is a float (or an exception): float arithmetic on
# ScalarVars that Python computes again at each call (Tracer.scalar_op); ** is not here (a
# negative base gives a complex)
FLOAT_RESULT = frozenset(
    (
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.floordiv,
        operator.mod,
        operator.neg,
        operator.pos,
        abs,
        math.sqrt,
        math.exp,
        math.log,
        math.log2,
        math.log10,
        math.log1p,
        math.expm1,
        math.sin,
        math.cos,
        math.tan,
        math.tanh,
        math.atan,
        math.fabs,
        math.hypot,
        math.atan2,
        math.copysign,
        float,
    )
)


def host_of(x):
    """A traced example's memory as a NumPy array (tensors: their NumPy view), or None."""
    if isinstance(x, np.ndarray):
        return x
    if (
        torch is not None
        and isinstance(x, torch.Tensor)
        and x.dtype in TORCH_TO_NP
        and x.layout == torch.strided
        and x.device.type == "cpu"
    ):
        return x.detach().numpy()
    return None


def storage_ptr(t):
    """Where a tensor's storage starts; None for an empty or non-strided one (unknown: not fresh)."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or not t.numel():
        return None
    return t.untyped_storage().data_ptr()
