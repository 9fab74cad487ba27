"""Trace stage, torch mapping: torch functions, Tensor methods/operators and
torch.nn.functional -> core ops (with casts so results keep torch's dtypes) or
extern torch calls. In: a torch callable and traced arguments; out: a Var."""

import sys

import numpy as np
import torch
import torch.nn.functional as F

from fastcompile._common import TORCH_OPMATH_SCALAR

from . import sources as S
from .helpers import TORCH_TO_NP, NeedAutograd, NoCore, any_array, kind_of, storage_ptr, unlazy
from .variables import ArrayVar, PyVar, ScalarVar, ShapeVar

UNARY = {
    torch.exp: "exp",
    torch.log: "log",
    torch.sqrt: "sqrt",
    torch.rsqrt: "rsqrt",
    torch.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    torch.relu: "relu",
    torch.abs: "abs",
    torch.neg: "neg",
    torch.sin: "sin",
    torch.cos: "cos",
    torch.erf: "erf",
    torch.floor: "floor",
    torch.ceil: "ceil",
    torch.trunc: "trunc",
    torch.sign: "sign",
    torch.isnan: "isnan",
    torch.isinf: "isinf",
    torch.isfinite: "isfinite",
    torch.logical_not: "logical_not",
    torch.reciprocal: "reciprocal",
    torch.square: "square",
    torch.expm1: "expm1",
    torch.log1p: "log1p",
    torch.log2: "log2",
    torch.log10: "log10",
    F.relu: "relu",
    F.silu: "silu",
    torch.nn.functional.sigmoid: "sigmoid",
    torch.nn.functional.tanh: "tanh",
}
BINARY = {
    torch.add: "add",
    torch.sub: "sub",
    torch.mul: "mul",
    torch.div: "div",
    torch.maximum: "maximum",
    torch.minimum: "minimum",
    torch.pow: "pow",
    torch.eq: "eq",
    torch.ne: "ne",
    torch.lt: "lt",
    torch.le: "le",
    torch.gt: "gt",
    torch.ge: "ge",
    torch.logical_and: "logical_and",
    torch.logical_or: "logical_or",
    torch.logical_xor: "logical_xor",
    torch.atan2: "atan2",
    torch.remainder: "remainder",
    torch.floor_divide: "floordiv",
}
REDUCE = {
    torch.sum: "sum",
    torch.mean: "mean",
    torch.amax: "amax",
    torch.amin: "amin",
    torch.argmax: "argmax",
    torch.argmin: "argmin",
    torch.prod: "prod",
    torch.any: "any",
    torch.all: "all",
    torch.logsumexp: "logsumexp",
    torch.var: "var",
    torch.std: "std",
}
BOOL_RESULT = {"isnan", "isinf", "isfinite", "logical_not", "logical_and", "logical_or", "logical_xor"}
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
METHOD_CASTS = {
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
    "int": torch.int32,
    "long": torch.int64,
    "bool": torch.bool,
}
IMPURE = {
    torch.manual_seed,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.bernoulli,
    torch.multinomial,
    torch.normal,
    torch.save,
    torch.load,
    torch.rand_like,
    torch.randn_like,
    torch.randint_like,
}
FACTORIES = {
    torch.zeros,
    torch.ones,
    torch.full,
    torch.empty,
    torch.arange,
    torch.eye,
    torch.linspace,
    torch.tensor,
}  # autograd mode records them as graph nodes
FOLD = {
    torch.is_tensor,
    torch.is_floating_point,
    torch.result_type,
    torch.promote_types,
    torch.get_default_dtype,
    torch.is_grad_enabled,
    torch.is_inference_mode_enabled,
    torch.finfo,
    torch.iinfo,
}
# zero-argument readers of torch's global state: a trace that reads one is guarded on its value
STATE = (torch.get_default_dtype, torch.is_grad_enabled, torch.is_inference_mode_enabled)


def _u(v):
    return unlazy(v)


_CHECKPOINT_KWARGS = frozenset(
    ("use_reentrant", "context_fn", "determinism_check", "debug", "preserve_rng_state", "early_stop")
)


def _state(tr, fn):
    """fn() (one of STATE) as a Python value, guarded: torch.set_default_dtype or a no_grad block
    around a later call recompiles."""
    value = fn()
    tr.guard(S.CallSource(fn), "id" if isinstance(value, torch.dtype) else "eq", value)
    return PyVar(value)


def _checkpoints():
    """torch.utils.checkpoint's entry points: a graph break (aot_autograd cannot trace through
    their saved-tensor hooks; the recomputation would raise CheckpointError in backward)."""
    cp = sys.modules.get("torch.utils.checkpoint")
    return () if cp is None else (cp.checkpoint, cp.checkpoint_sequential)


def _np(tr, dt):
    """The NumPy dtype the core computes torch dtype dt in; a graph break where there is none
    (bfloat16, complex, float8: the core route takes NumPy arrays)."""
    if dt not in TORCH_TO_NP:
        tr.unsupported("tensor dtype %s has no NumPy dtype" % dt)
    return TORCH_TO_NP[dt]


def cast(tr, var, np_dtype):
    if not isinstance(var, ArrayVar) or var.example.dtype == _torch_dtype(np_dtype):
        return var
    v = tr.graph.call("cast", var.value, dtype=np_dtype.name)
    tr.record_op()
    return ArrayVar(v, var.example.to(_torch_dtype(np_dtype)), "torch", fresh=True)


def _torch_dtype(np_dtype):
    for k, v in TORCH_TO_NP.items():
        if v == np_dtype:
            return k
    raise KeyError(np_dtype)


def pointwise(tr, fn, core_op, args, kwargs, attrs=None):
    """A pointwise op with torch's result dtype: operands cast first."""
    args = [_u(a) for a in args]
    if core_op in ("clamp", "where"):
        # torch checks these scalars fit the tensor's dtype (1e308 for float32 raises): a float
        # read at each call is baked in here, its value guarded
        args = [PyVar(tr.py(a)) if isinstance(a, ScalarVar) else a for a in args]
    if tr.fx is not None:
        return tr.fx_call(fn, args, kwargs)
    example = tr.eager(fn, args, kwargs)
    if core_op is None or not isinstance(example, torch.Tensor) or kwargs:
        return tr.extern(fn, args, kwargs, example, "torch")
    want = _np(tr, example.dtype)
    if core_op == "pow" and want.kind in "iu" and isinstance(_u(args[1]), ArrayVar):
        # an integer tensor exponent may be negative (or become so in the base's dtype): torch
        # gives 1, +-1 or 0 where NumPy's pow, the core's, raises (at run time, and the frame
        # would run as plain Python at every call). torch's own pow, as an extern
        return tr.extern(fn, args, kwargs, example, "torch")
    if core_op in COMPARE:
        exs = [tr.example_of(a) for a in args]  # a ScalarVar's type only: not specialized
        common = _np(tr, torch.result_type(*exs))
        cargs = [cast(tr, a, common) for a in args]
        if common.kind in "iu":
            # torch makes a Python int its integer dtype first (it wraps: int8 < 300 is
            # int8 < 44), where NumPy compares exactly
            cargs = [
                PyVar(int(np.array(a.value).astype(common))) if isinstance(a, PyVar) and type(a.value) is int else a
                for a in cargs
            ]
    elif core_op in BOOL_RESULT:
        cargs = args
    elif core_op == "where":
        cargs = [args[0]] + [cast(tr, a, want) for a in args[1:]]
    elif core_op in TORCH_OPMATH_SCALAR and want == np.float16:
        # torch's CPU mul/div take a 0-d tensor of another float dtype as a scalar, in float32,
        # not rounded to the half type first (x // torch.tensor(0.1, dtype=torch.float64))
        cargs = [
            cast(tr, a, np.dtype(np.float32))
            if isinstance(a, ArrayVar)
            and a.ndim == 0
            and a.example.dtype.is_floating_point
            and _np(tr, a.example.dtype) != want
            else cast(tr, a, want)
            for a in args
        ]
    else:
        cargs = [cast(tr, a, want) for a in args]
    try:
        if core_op == "sign" and example.is_floating_point():
            # torch: sign(nan) is 0 (NumPy's, the core's, is nan)
            x = cargs[0]
            nan = tr.core("isnan", [x], {}, torch.isnan(x.example), "torch")
            sign = tr.core("sign", [x], {}, example, "torch")
            return tr.core("where", [nan, PyVar(0.0), sign], {}, example, "torch")
        return tr.core(core_op, cargs, attrs or {}, example, "torch")
    except NoCore:
        return tr.extern(fn, args, kwargs, example, "torch")


_INPLACE_POS = {}


def _inplace_position(fn):
    """The position of fn's ``inplace`` parameter (torch.nn.functional's activations take it
    positionally too: F.elu(x, 1.0, True)), or None."""
    try:
        return _INPLACE_POS[fn]
    except (KeyError, TypeError):
        pass
    pos = None
    try:
        import inspect

        params = list(inspect.signature(fn).parameters.values())
        for i, prm in enumerate(params):
            if prm.name == "inplace" and prm.kind in (prm.POSITIONAL_ONLY, prm.POSITIONAL_OR_KEYWORD):
                pos = i
    except (TypeError, ValueError):
        pass
    try:
        _INPLACE_POS[fn] = pos
    except TypeError:
        pass
    return pos


def _method_fn(name):
    """t.name(*a, **k) as a function named Tensor.name (reports, and Tracer.extern's checks)."""

    def fn(t, *a, **k):
        return getattr(t, name)(*a, **k)

    fn.__name__ = name
    fn.__qualname__ = "Tensor." + name
    return fn


def _arg(args, kwargs, i, name, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else PyVar(default)


def reduction(tr, fn, op, args, kwargs):
    x = _u(args[0])
    py = tr.py
    example = tr.eager(fn, args, kwargs)
    if not isinstance(example, torch.Tensor):
        return tr.extern(fn, args, kwargs, example, "torch")
    allowed = {"dim", "keepdim", "unbiased", "correction"}
    if set(kwargs) - allowed or len(args) > 3:
        return tr.extern(fn, args, kwargs, example, "torch")
    dim = py(_arg(args, kwargs, 1, "dim"))
    keep = py(_arg(args, kwargs, 2, "keepdim", False))
    if isinstance(dim, list):
        dim = tuple(dim)
    attrs = {"axis": dim, "keepdim": bool(keep)}
    if op in ("var", "std"):
        corr = kwargs.get("correction")
        unb = kwargs.get("unbiased")
        c = 1
        if corr is not None:
            c = py(corr)
        elif unb is not None:
            c = 1 if py(unb) else 0
        if c not in (0, 1):
            return tr.extern(fn, args, kwargs, example, "torch")
        attrs["correction"] = int(c)
    if op in ("logsumexp",) and dim is None:
        return tr.extern(fn, args, kwargs, example, "torch")
    src = x
    if op in ("sum", "prod") and x.example.dtype in (torch.bool, torch.int8, torch.int16, torch.int32, torch.uint8):
        src = cast(tr, x, _np(tr, torch.int64))
    try:
        return tr.core(op, [src], attrs, example, "torch")
    except NoCore:
        return tr.extern(fn, args, kwargs, example, "torch")


def softmax(tr, fn, op, x, dim, args, kwargs):
    example = tr.eager(fn, args, kwargs)
    d = tr.py(dim)
    if d is None or not isinstance(example, torch.Tensor):
        return tr.extern(fn, args, kwargs, example, "torch")
    try:
        return tr.core(op, [cast(tr, _u(x), _np(tr, example.dtype))], {"axis": d}, example, "torch")
    except NoCore:
        return tr.extern(fn, args, kwargs, example, "torch")


def layer_norm(tr, args, kwargs):
    example = tr.eager(F.layer_norm, args, kwargs)
    x = _u(args[0])
    shape = tr.py(_arg(args, kwargs, 1, "normalized_shape"))
    w, b = _u(_arg(args, kwargs, 2, "weight")), _u(_arg(args, kwargs, 3, "bias"))
    eps = tr.py(_arg(args, kwargs, 4, "eps", 1e-5))
    k = len(shape) if isinstance(shape, (tuple, list)) else 1
    axes = tuple(range(-k, 0))
    g = tr.graph
    xv = cast(tr, x, _np(tr, example.dtype)).value
    mean = g.call("mean", xv, axis=axes, keepdim=True)
    d = g.call("sub", xv, mean)
    var = g.call("mean", g.call("mul", d, d), axis=axes, keepdim=True)
    y = g.call("mul", d, g.call("rsqrt", g.call("add", var, float(eps))))
    if isinstance(w, ArrayVar):
        y = g.call("mul", y, w.value)
    if isinstance(b, ArrayVar):
        y = g.call("add", y, b.value)
    if y.dtype != _np(tr, example.dtype).name:
        y = g.call("cast", y, dtype=_np(tr, example.dtype).name)
    tr.record_op()
    return ArrayVar(y, example, "torch", fresh=True)


def call(tr, fn, args, kwargs):
    cps = _checkpoints()
    if cps and fn is cps[0] and args:
        # checkpoint(function, *args, use_reentrant=..., **kwargs): function is traced in line
        # (aot_autograd cannot trace the saved-tensor hooks of a checkpoint; backward would raise
        # CheckpointError). Values and gradients are eager's; the activations are kept.
        fkw = {k: v for k, v in kwargs.items() if k not in _CHECKPOINT_KWARGS}
        return tr.call_var(args[0], list(args[1:]), fkw)
    if fn in cps:
        tr.unsupported("%s runs as Python: its recomputation in backward is not traced" % getattr(fn, "__name__", fn))
    if "out" in kwargs:  # before any eager run: the trace must not write it either
        tr.unsupported("%s(out=...) writes into a tensor (side effect)" % getattr(fn, "__name__", fn))
    if fn in IMPURE or (getattr(fn, "__name__", "").endswith("_") and not getattr(fn, "__name__", "").endswith("__")):
        tr.unsupported("call to %s is not supported (random or in-place)" % getattr(fn, "__name__", fn))
    if not any_array(args, kwargs):
        if fn in STATE and not args and not kwargs:
            return _state(tr, fn)
        if fn in FOLD or isinstance(fn, type):
            return tr.fold(fn, args, kwargs)
        if fn in FACTORIES:
            if "dtype" not in kwargs:
                _state(tr, torch.get_default_dtype)  # torch.zeros(3) is of the default dtype
            if tr.fx is None:  # the core graph has no tensor constants: trace as torch ops
                raise NeedAutograd()
            return tr.fx_call(fn, args, kwargs)
        tr.unsupported(
            "torch call %s without tensor arguments (tensor creation) is not supported" % getattr(fn, "__name__", fn)
        )
    if _kind_any(args, kwargs) == "numpy":
        tr.unsupported("torch function %s on a NumPy array" % getattr(fn, "__name__", fn))
    if getattr(fn, "__module__", "") == "torch.nn.functional":
        pos = _inplace_position(fn)
        if "inplace" in kwargs:
            if tr.py(kwargs["inplace"]):
                return _inplace_call(tr, fn, args, kwargs, pos)
            kwargs = {k: v for k, v in kwargs.items() if k != "inplace"}  # F.relu(x, inplace=False)
        elif pos is not None and len(args) > pos and tr.py(args[pos]):
            # F.leaky_relu(x, 0.1, True), as nn.LeakyReLU(inplace=True) calls it (its eager run on
            # an input would update the input while tracing: the first call applied it twice)
            return _inplace_call(tr, fn, args, kwargs, pos)
    if fn is F.dropout:
        training = tr.py(_arg(args, kwargs, 2, "training", True))
        p = tr.py(_arg(args, kwargs, 1, "p", 0.5))
        if not 0 <= p <= 1:
            tr.eager(fn, args, kwargs)  # torch raises whatever training is: so does the call
        if not training or p == 0:
            return _u(args[0])
        if tr.py(_arg(args, kwargs, 3, "inplace", False)):
            tr.unsupported("dropout(inplace=True) updates its input in place")
        if tr.fx is None:
            # random: traced as a torch op (aten.native_dropout, called at run time, so it draws
            # from torch's generator exactly as eager does) in autograd mode
            raise NeedAutograd()
        x = _u(args[0])
        if not isinstance(x, ArrayVar):
            tr.unsupported("dropout of a non-tensor")
        # the example is a copy: drawing here would move the RNG ahead of eager's
        return tr.fx_call(fn, args, kwargs, example=x.example.detach().clone())
    if tr.fx is not None:
        return tr.fx_call(fn, args, kwargs)
    n = len(args)
    if fn in UNARY and n == 1 and not kwargs:
        return pointwise(tr, fn, UNARY[fn], args, {})
    if fn is F.gelu and n == 1 and set(kwargs) <= {"approximate"}:
        approx = tr.py(kwargs.get("approximate", PyVar("none")))
        return pointwise(
            tr, lambda x: F.gelu(x, approximate=approx), "gelu" if approx == "none" else "gelu_tanh", args, {}
        )
    if fn in BINARY and n == 2 and not kwargs:
        return pointwise(tr, fn, BINARY[fn], args, {})
    if fn in (torch.add, torch.sub) and n == 2 and set(kwargs) == {"alpha"} and tr.fx is None:
        r = _add_alpha(tr, fn, args, kwargs["alpha"])
        if r is not None:
            return r
    if fn is torch.where and n == 3 and not kwargs:
        return pointwise(tr, fn, "where", args, {})
    if (
        fn is torch.clamp
        and n == 3
        and not kwargs
        and all(not (isinstance(_u(a), PyVar) and _u(a).value is None) for a in args[1:])
    ):
        return pointwise(tr, fn, "clamp", args, {})
    if fn in REDUCE:
        return reduction(tr, fn, REDUCE[fn], args, kwargs)
    if fn in (torch.softmax, F.softmax, torch.log_softmax, F.log_softmax) and set(kwargs) <= {"dim", "_stacklevel"}:
        op = "softmax" if fn in (torch.softmax, F.softmax) else "log_softmax"
        kw = {k: v for k, v in kwargs.items() if k != "_stacklevel"}
        return softmax(tr, lambda x, *a, **k: fn(x, *a, **k), op, args[0], _arg(args, kw, 1, "dim"), args, kw)
    if fn is F.layer_norm:
        return layer_norm(tr, args, kwargs)
    return tr.array_call(fn, args, kwargs, kind="torch")


def _add_alpha(tr, fn, args, alpha):
    """torch.add(a, b, alpha=s) (torch.optim's p.add(g, alpha=-lr)) as a + b * s, so a float
    alpha read at each call (a decaying learning rate) is no recompile; None (an extern call)
    but for two tensors of one float32/float64 dtype (torch rounds b * s once more than its
    fused a + s * b: a last-bit difference, the tolerance the core's float ops have anyway)
    or of one integer dtype with an int alpha (exact)."""
    a, b, s = _u(args[0]), _u(args[1]), _u(alpha)
    example = tr.eager(fn, [a, b], {"alpha": s})  # raises as torch does (a float alpha, int tensors)
    if not (isinstance(a, ArrayVar) and isinstance(b, ArrayVar) and isinstance(example, torch.Tensor)):
        return None
    dt = example.dtype
    if a.example.dtype != dt or b.example.dtype != dt:
        return None
    if dt not in (torch.float32, torch.float64) and not (
        dt in (torch.int32, torch.int64) and isinstance(s, PyVar) and type(s.value) is int
    ):
        return None
    scaled = pointwise(tr, torch.mul, "mul", [b, s], {})
    return pointwise(tr, fn, BINARY[fn], [a, scaled], {})


def _kind_any(args, kwargs):
    return kind_of(args, kwargs)


# Tensor.<name>_ methods traced as their out-of-place op: the pointwise ones (their out-of-place
# form takes the same arguments; bernoulli_, fill_, zero_, random_, ... do not, or draw)
_INPLACE_METHODS = frozenset(
    [f.__name__ for f in list(UNARY) + list(BINARY) if getattr(f, "__module__", "") != "torch.nn.functional"]
    + [
        "clamp",
        "clamp_min",
        "clamp_max",
        "clip",
        "masked_fill",
        "lerp",
        "addcmul",
        "addcdiv",
        "fmod",
        "copysign",
        "hypot",
        "true_divide",
        "nan_to_num",
        "sigmoid",
        "tanh",
        "relu",
        "sgn",
        "frac",
        "round",
        "float_power",
        "xlogy",
        "logit",
        "mvlgamma",
        "sinh",
        "cosh",
        "asin",
        "acos",
        "atan",
        "tan",
        "exp2",
        "where",
    ]
)
# F.* activations with an inplace parameter traced in place (see _inplace_call)
_INPLACE_ACTIVATIONS = (
    "relu",
    "relu6",
    "leaky_relu",
    "elu",
    "celu",
    "selu",
    "hardtanh",
    "hardswish",
    "hardsigmoid",
    "silu",
    "mish",
    "threshold",
)


def batch_norm_eval(bn, x):
    """nn.BatchNorm1d/2d/3d in eval mode, traced in line by Tracer.module_call (the core route)
    so that it fuses with what comes before and after it (ReLU, a residual add). torch's CPU
    kernel's order: alpha = weight / sqrt(var + eps), beta = bias - mean * alpha, x * alpha + beta."""
    alpha = 1 / torch.sqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        alpha = alpha * bn.weight
    beta = -(bn.running_mean * alpha) if bn.bias is None else bn.bias - bn.running_mean * alpha
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return x * alpha.view(shape) + beta.view(shape)


def _shares_input(tr, arr):
    """Whether arr's example shares memory with a traced input's (a parameter, the frame's
    tensors): its in-place update while tracing would change what the user holds."""
    ptr = storage_ptr(arr.example)
    return arr.source is not None or ptr is None or any(storage_ptr(a) == ptr for _, _, a in tr.inputs)


def _check_unshared(tr, arr, what):
    """A graph break unless arr is a tensor this graph made that nothing else can see: not an
    input, no view (an update must reach what it views), never viewed (escaped: handed to an
    extern, which may keep a view; in autograd mode, a view was taken of it). In autograd mode
    an update through a view would also leave aot_autograd a graph output that views an
    intermediate, which eager code may not update in place."""
    if arr.source is not None or not arr.fresh or arr.escaped or (tr.fx is not None and _shares_input(tr, arr)):
        tr.unsupported("%s updates a tensor that may be shared (an input or a view) in place" % what)


def _rebind(tr, arr, what, compute):
    """Core route: an in-place update of arr that no one else can see (a tensor this graph made,
    no view of anything and never handed to an extern, which may view it) as the out-of-place
    value, rebound to arr: later reads of arr read it. compute() -> the new Var; it keeps arr's
    dtype and shape (eager checked that they allow the update)."""
    new = _u(compute())
    if not isinstance(new, ArrayVar) or tuple(new.example.shape) != tuple(arr.example.shape):
        tr.unsupported("%s in place changes the tensor's shape" % what)
    new = cast(tr, new, _np(tr, arr.example.dtype))
    # arr is now the new value: computing it handed the old one to an extern perhaps (escaped),
    # which nothing reads any more
    arr.value, arr.example, arr.fresh, arr.escaped = new.value, new.example, new.fresh, new.escaped
    return arr


def _fx_in_place(arr, result):
    """Autograd mode: arr is now the in-place node's result (arr itself, no view of it that
    anyone holds); aot_autograd functionalizes the node."""
    r = _u(result)
    arr.example, arr.fx, arr.escaped = r.example, r.fx, False
    return arr


def _inplace_method(tr, arr, name, args, kwargs):
    """t.add_(b), t.mul_(0.5), t.relu_(), t.clamp_(min=0), ...: in autograd mode one FX node of
    the in-place op (aot_autograd functionalizes it), where t shares no memory with an input; in
    the core route the out-of-place op rebound to t (_rebind). Either way t is returned, and
    what eager refuses (int_t.mul_(1.5), a broadcast that grows t) raises as in eager (a graph
    break, then eager code)."""
    base = name[:-1]
    what = "Tensor." + name
    if base not in _INPLACE_METHODS or not hasattr(torch.Tensor, name):
        tr.unsupported("in-place %s is not supported" % what)
    _check_unshared(tr, arr, what)
    if tr.fx is not None:
        return _fx_in_place(arr, tr.fx_call(_method_fn(name), [arr] + args, kwargs, method=name))
    tr.eager(lambda t, *a, **k: getattr(t.clone(), name)(*a, **k), [arr] + args, kwargs)
    return _rebind(tr, arr, what, lambda: method(tr, arr, base, args, kwargs))


def _inplace_call(tr, fn, args, kwargs, pos):
    """F.relu(x, inplace=True), F.leaky_relu(x, 0.1, True), ... (nn.ReLU(inplace=True) calls
    them): as _inplace_method, x updated in place and returned."""
    arr = _u(args[0]) if args else None
    what = "%s(inplace=True)" % fn.__name__
    if not isinstance(arr, ArrayVar) or fn.__name__ not in _INPLACE_ACTIVATIONS:
        tr.unsupported("%s updates its input in place" % what)
    _check_unshared(tr, arr, what)
    if tr.fx is not None:
        return _fx_in_place(arr, tr.fx_call(fn, args, kwargs))
    args, kwargs = list(args), dict(kwargs)
    if "inplace" in kwargs:
        kwargs["inplace"] = PyVar(False)
    else:
        args[pos] = PyVar(False)
    tr.eager(lambda t, *a, **k: fn(t.clone(), *a, **k), args, kwargs)  # what eager refuses raises
    return _rebind(tr, arr, what, lambda: call(tr, fn, args, kwargs))


def method(tr, arr, name, args, kwargs):
    """Tensor.name(*args, **kwargs)."""
    args = list(args)
    if name.endswith("_") and not name.endswith("__"):
        return _inplace_method(tr, arr, name, args, kwargs)
    if name in ("item", "tolist", "numpy", "__bool__", "__int__", "__float__"):
        tr.unsupported("data-dependent Tensor.%s()" % name)
    if name == "size":
        if args or kwargs:
            d = tr.py(_arg(args, kwargs, 0, "dim"))
            return PyVar(tr.dim(arr, d))
        return ShapeVar(arr)
    if name == "dim" and not args:
        return PyVar(arr.ndim)
    if name == "contiguous" and not args and arr.example.is_contiguous():
        return arr  # eager returns the tensor itself (its layout is guarded)
    if name == "contiguous" and not args:
        name = "clone"  # a C-ordered copy, as eager's: never a view of what it copies
        kwargs = {"memory_format": PyVar(torch.contiguous_format)}
    if name == "detach" and not args and tr.fx is None and getattr(arr, "source", None) is None:
        return arr  # a value the graph computes: a new tensor either way
    if tr.fx is not None:
        if not hasattr(torch.Tensor, name):
            tr.unsupported("Tensor has no attribute %r" % name)
        return tr.fx_call(_method_fn(name), [arr] + args, kwargs, method=name)
    if name in METHOD_CASTS and not args:
        return cast(tr, arr, _np(tr, METHOD_CASTS[name]))
    if name == "to" and len(args) == 1 and not kwargs and isinstance(tr.py(args[0]), torch.dtype):
        return cast(tr, arr, _np(tr, tr.py(args[0])))
    if name == "type_as" and len(args) == 1:
        return cast(tr, arr, _np(tr, _u(args[0]).example.dtype))
    fn = getattr(torch, name, None)
    if name in ("max", "min") and not args and not kwargs:
        return reduction(
            tr, torch.amax if name == "max" else torch.amin, "amax" if name == "max" else "amin", [arr], {}
        )
    if fn is not None and (
        fn in UNARY
        or fn in BINARY
        or fn in REDUCE
        or fn in (torch.softmax, torch.log_softmax, torch.where, torch.clamp)
    ):
        return call(tr, fn, [arr] + args, kwargs)
    if name == "relu":
        return call(tr, torch.relu, [arr], {})
    if not hasattr(torch.Tensor, name):
        tr.unsupported("Tensor has no attribute %r" % name)
    return tr.array_call(_method_fn(name), [arr] + args, kwargs, kind="torch")
