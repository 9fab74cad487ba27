"""Lowering of pointwise aten ops, casts, copies and constants to core ops.

In: FX nodes of those ops (through the handler table). Out: core values (``_Rec``), or
``_NotLowered``: the node runs in an extern cluster.
"""

import numpy as np
import torch
import torch.fx

from ..._common import TORCH_OPMATH_SCALAR as _TORCH_OPMATH_SCALAR
from .registry import _register
from .values import _NotLowered, _Rec, _core_dtype, _meta, _static_shape

aten = torch.ops.aten
prims = torch.ops.prims


def _dummy(L, a):
    """A stand-in for torch.result_type: an empty tensor (0-d stays 0-d) or the scalar."""
    if isinstance(a, torch.fx.Node):
        r = L.rec(a)
        return torch.empty(() if len(r.tshape) == 0 else (0,), dtype=r.dtype)
    return a


def _result_type(L, args):
    """torch's promoted dtype of the operands (0-d tensors and scalars weakly typed)."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    _, dt = elementwise_dtypes(
        *[_dummy(L, a) for a in args], type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    )
    return dt


def _pointwise(core, compute="out", nargs=None):
    """compute: "out": operands cast to the result dtype (arithmetic); "common": to their promoted
    dtype (comparisons); "none": as they are."""

    def handler(L, node):
        args = list(node.args[:nargs] if nargs else node.args)
        if node.kwargs:
            raise _NotLowered("kwargs %s" % node.kwargs)
        for a in args:
            if not isinstance(a, (torch.fx.Node, bool, int, float)):
                raise _NotLowered("argument %r" % (a,))
        meta = _meta(node)
        if compute == "out":
            dt = meta.dtype
        elif compute == "common":
            dt = _result_type(L, args)
        else:
            dt = None
        _check_int_divisor(core, dt, args[1:])
        ops = [L.operand(a, dt, opmath=core in _TORCH_OPMATH_SCALAR) for a in args]
        if compute == "common" and dt is not None and not dt.is_floating_point and dt != torch.bool:
            # torch compares an integer tensor with a Python int made its dtype first (it wraps:
            # int8 < 300 is int8 < 44; uint8 < -1 is uint8 < 255)
            ops = [torch.tensor(o).to(dt).item() if type(o) is int else o for o in ops]
        if core in ("floordiv", "remainder"):
            ops[1] = _checked_divisor(L, ops[1], dt)
        return L.out(node, L.g.call(core, *ops), L.cshape_of(*args))

    return handler


def _check_int_divisor(core, dt, divisors):
    """torch raises on an integer division by a zero Python scalar (the core gives 0): the op is
    left to torch then, which raises at the call as eager does."""
    if (
        core in ("floordiv", "remainder", "div")
        and dt is not None
        and not dt.is_floating_point
        and any(type(d) in (int, bool) and d == 0 for d in divisors)
    ):
        raise _NotLowered("integer %s by zero" % core)


def _checked_divisor(L, y, dt):
    """An integer division's tensor divisor, checked in the kernel: a 0 raises RuntimeError
    "ZeroDivisionError" at the call, as torch's CPU kernels do (the core alone gives 0, as NumPy).
    Python scalars are checked while lowering (_check_int_divisor)."""
    if dt is None or dt.is_floating_point or isinstance(y, (bool, int, float)):
        return y
    return L.g.call("check_divisor", y)


_UNARY = [
    "abs",
    "neg",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "tan",
    "tanh",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "erf",
    "sigmoid",
    "relu",
    "floor",
    "ceil",
    "trunc",
    "silu",
    "bitwise_not",
]
_BINARY = {
    "mul": "mul",
    "maximum": "maximum",
    "minimum": "minimum",
    "fmax": "fmax",
    "fmin": "fmin",
    "atan2": "atan2",
    "hypot": "hypot",
    "copysign": "copysign",
    "remainder": "remainder",
    "floor_divide": "floordiv",
    "bitwise_and": "bitwise_and",
    "bitwise_or": "bitwise_or",
    "bitwise_xor": "bitwise_xor",
}
_COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]

for _name in _UNARY:
    _register(getattr(aten, _name))(_pointwise(_name, nargs=1))
for _name, _core in _BINARY.items():
    _register(getattr(aten, _name))(_pointwise(_core, nargs=2))
for _name in _COMPARE:
    _register(getattr(aten, _name))(_pointwise(_name, "common", nargs=2))
for _name in ("logical_and", "logical_or", "logical_xor"):
    _register(getattr(aten, _name))(_pointwise(_name, "none", nargs=2))
for _name in ("logical_not", "isnan", "isinf", "isfinite"):
    _register(getattr(aten, _name))(_pointwise(_name, "none", nargs=1))


@_register(aten.round)
def _round(L, node):
    d = node.kwargs.get("decimals", node.args[1] if len(node.args) > 1 else 0)
    x = node.args[0]
    dt = _meta(node).dtype
    v = L.operand(x, dt)
    if d == 0 or not dt.is_floating_point:
        r = L.g.call("round", v)
    elif d > 0:  # torch: nearbyint(x * 10^d) / 10^d
        r = L.g.call("div", L.g.call("round", L.g.call("mul", v, 10.0**d)), 10.0**d)
    else:  # torch: nearbyint(x / 10^-d) * 10^-d
        r = L.g.call("mul", L.g.call("round", L.g.call("div", v, 10.0**-d)), 10.0**-d)
    return L.out(node, r, L.cshape_of(x))


@_register(aten.sign)
def _sign(L, node):
    x = node.args[0]
    r = L.rec(x)
    if r.dtype == torch.bool:
        return _Rec(r.value, r.cshape, r.tshape, r.dtype)
    if not r.dtype.is_floating_point:
        return _pointwise("sign", nargs=1)(L, node)
    v = L.operand(x, _meta(node).dtype)  # torch: sign(nan) is 0 (NumPy's, the core's, is nan)
    return L.out(node, L.g.call("where", L.g.call("isnan", v), 0.0, L.g.call("sign", v)), L.cshape_of(x))


@_register(aten.pow)
def _pow(L, node):
    base, exp = node.args[:2]
    meta = _meta(node)
    if isinstance(base, torch.fx.Node) and isinstance(exp, (int, float)) and not isinstance(exp, bool):
        if exp == 2:
            x = L.operand(base, meta.dtype)
            return L.out(node, L.g.call("mul", x, x), L.cshape_of(base))
        if exp == 0.5 and meta.dtype.is_floating_point:
            return L.out(node, L.g.call("sqrt", L.operand(base, meta.dtype)), L.cshape_of(base))
    if (
        meta.dtype != torch.bool
        and not meta.dtype.is_floating_point
        and not meta.dtype.is_complex
        and isinstance(exp, torch.fx.Node)
        and not node.kwargs
    ):
        return _int_pow_by_tensor(L, node, base, exp, meta.dtype)
    return _pointwise("pow", nargs=2)(L, node)


def _int_pow_by_tensor(L, node, base, exp, dtype):
    """Integer pow with a tensor exponent, which may be negative, or become negative in the
    result's dtype (int8 ** tensor(1000) is int8 ** -24, as torch casts it): torch gives 1 for a
    base of 1, +-1 for -1 (by the exponent's parity), 0 for any other base; the core's pow raises
    on a negative exponent, as NumPy's does. So: the core's pow at max(e, 0), and that rule where
    e < 0."""
    g = L.g
    x, e = L.operand(base, dtype), L.operand(exp, dtype)
    pos = g.call("pow", x, g.call("maximum", e, 0))
    minus_one = g.call("where", g.call("ne", g.call("remainder", e, 2), 0), -1, 1)
    if isinstance(base, torch.fx.Node):
        neg = g.call("where", g.call("eq", x, 1), 1, g.call("where", g.call("eq", x, -1), minus_one, 0))
    else:
        neg = 1 if x == 1 else minus_one if x == -1 else 0
    return L.out(node, g.call("where", g.call("lt", e, 0), neg, pos), L.cshape_of(base, exp))


@_register(aten.add, aten.sub)
def _add_sub(L, node):
    core = "add" if node.target.overloadpacket is aten.add else "sub"
    a, b = node.args[:2]
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
    if set(node.kwargs) - {"alpha"} or not isinstance(alpha, (bool, int, float)):
        raise _NotLowered("add kwargs")
    dt = _meta(node).dtype
    if core == "sub" and any(
        type(v) is bool or isinstance(v, torch.fx.Node) and L.rec(v).dtype == torch.bool for v in (a, b)
    ):
        raise _NotLowered("sub of a bool")  # torch raises: left to it, which raises at the call
    x, y = L.operand(a, dt), L.operand(b, dt)
    if alpha != 1:
        y = L.g.call("mul", y, alpha) if not isinstance(y, (int, float)) else y * alpha
    return L.out(node, L.g.call(core, x, y), L.cshape_of(a, b))


@_register(aten.div)
def _div(L, node):
    a, b = node.args[:2]
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    dt = _meta(node).dtype
    _check_int_divisor("floordiv" if mode is not None else "div", dt, [b])
    if mode is None:
        return L.out(
            node, L.g.call("div", L.operand(a, dt, opmath=True), L.operand(b, dt, opmath=True)), L.cshape_of(a, b)
        )
    if mode == "floor":
        return L.out(
            node,
            L.g.call("floordiv", L.operand(a, dt, opmath=True), _checked_divisor(L, L.operand(b, dt, opmath=True), dt)),
            L.cshape_of(a, b),
        )
    if mode == "trunc" and dt.is_floating_point:
        q = L.g.call("div", L.operand(a, dt, opmath=True), L.operand(b, dt, opmath=True))
        return L.out(node, L.g.call("trunc", q), L.cshape_of(a, b))
    if mode == "trunc" and dt != torch.bool:
        # integers: floor quotient, plus one where the remainder is nonzero and the signs differ
        x, y = L.operand(a, dt), _checked_divisor(L, L.operand(b, dt), dt)
        q = L.g.call("floordiv", x, y)
        fix = L.g.call(
            "logical_and",
            L.g.call("ne", L.g.call("remainder", x, y), 0),
            L.g.call("logical_xor", L.g.call("lt", x, 0), L.g.call("lt", y, 0)),
        )
        return L.out(node, L.g.call("where", fix, L.g.call("add", q, 1), q), L.cshape_of(a, b))
    raise _NotLowered("div rounding_mode=%r on %s" % (mode, dt))


@_register(aten.gelu)
def _gelu(L, node):
    approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    x = node.args[0]
    v = L.operand(x, _meta(node).dtype)
    return L.out(node, L.g.call("gelu", v, approximate=approx), L.cshape_of(x))


@_register(aten.gelu_backward)
def _gelu_backward(L, node):
    """grad * gelu'(x). The erf form is the core's gelu_grad: one exp and a rational per
    element, where torch's decomposition (which Inductor compiles) computes erf and exp apart;
    the tanh form is torch's decomposition, op for op."""
    grad, x = node.args[:2]
    approx = node.kwargs.get("approximate", node.args[2] if len(node.args) > 2 else "none")
    dt = _meta(node).dtype
    g, v = L.operand(grad, dt), L.operand(x, dt)
    call = L.g.call
    if approx == "none":
        d = call("gelu_grad", v)
    elif approx == "tanh":
        beta, kappa = 1.41421356237309504880 * 1.12837916709551257390 * 0.5, 0.044715
        x_sq = call("mul", v, v)
        inner = call("mul", call("add", v, call("mul", call("mul", x_sq, v), kappa)), beta)
        t = call("tanh", inner)
        left_d = call("mul", call("add", t, 1), 0.5)
        right_d = call(
            "mul",
            call("mul", call("mul", v, 0.5), call("sub", 1, call("mul", t, t))),
            call("mul", call("add", call("mul", x_sq, 3 * kappa), 1), beta),
        )
        d = call("add", left_d, right_d)
    else:
        raise _NotLowered("gelu_backward approximate=%r" % (approx,))
    return L.out(node, call("mul", g, d), L.cshape_of(grad, x))


@_register(aten.softplus)
def _softplus(L, node):
    beta = node.args[1] if len(node.args) > 1 else node.kwargs.get("beta", 1)
    thr = node.args[2] if len(node.args) > 2 else node.kwargs.get("threshold", 20)
    x = node.args[0]
    v = L.operand(x, _meta(node).dtype)
    if beta == 1 and thr == 20:
        return L.out(node, L.g.call("softplus", v), L.cshape_of(x))
    # torch: x * beta > threshold ? x : log1p(exp(x * beta)) / beta
    t = L.g.call("mul", v, beta)
    soft = L.g.call("div", L.g.call("log1p", L.g.call("exp", t)), beta)
    return L.out(node, L.g.call("where", L.g.call("gt", t, thr), v, soft), L.cshape_of(x))


@_register(aten.where)
def _where(L, node):
    if len(node.args) != 3 or node.kwargs:
        raise _NotLowered("where(cond) without values")
    c, a, b = node.args
    dt = _meta(node).dtype
    cond = L.operand(c, torch.bool)
    return L.out(node, L.g.call("where", cond, L.operand(a, dt), L.operand(b, dt)), L.cshape_of(c, a, b))


@_register(aten.clamp, aten.clamp_min, aten.clamp_max)
def _clamp(L, node):
    packet = node.target.overloadpacket
    x = node.args[0]
    if packet is aten.clamp:
        lo = node.kwargs.get("min", node.args[1] if len(node.args) > 1 else None)
        hi = node.kwargs.get("max", node.args[2] if len(node.args) > 2 else None)
    elif packet is aten.clamp_min:
        lo, hi = node.args[1], None
    else:
        lo, hi = None, node.args[1]
    dt = _meta(node).dtype
    v = L.operand(x, dt)
    if lo is not None:
        v = L.g.call("maximum", v, L.operand(lo, dt))
    if hi is not None:
        v = L.g.call("minimum", v, L.operand(hi, dt))
    return L.out(node, v, L.cshape_of(*[a for a in (x, lo, hi) if a is not None]))


# -- casts, copies, constants ----------------------------------------------------------------


def _cpu_only(node, *names):
    for n in names:
        d = node.kwargs.get(n)
        if n == "device" and d is not None and torch.device(d).type != "cpu":
            raise _NotLowered("device %s" % d)
        if n == "layout" and d not in (None, torch.strided):
            raise _NotLowered("layout %s" % d)


@_register(
    aten._to_copy,
    aten.clone,
    aten.alias,
    aten.detach,
    aten.lift_fresh_copy,
    prims.convert_element_type,
    aten.contiguous,
)
def _identity_cast(L, node):
    _cpu_only(node, "device", "layout")
    if node.kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        pass  # values are the same; the core writes C order
    x = node.args[0]
    r = L.rec(x)
    meta = _meta(node)
    if node.target.overloadpacket in (aten.alias, aten.detach) and _core_dtype(meta.dtype) == _core_dtype(r.dtype):
        # a view of the same value: no cast node, whose dtype the core cannot know for an extern
        # result until run time, and which would make a copy kernel of it (then a graph output
        # carries the extern's tensor with its own layout, not a C-ordered copy restrided)
        return _Rec(r.value, r.cshape, _static_shape(meta), meta.dtype)
    v = L.convert(node, r.value, r.dtype, meta.dtype)
    if v is r.value and node.target.overloadpacket not in (aten.alias, aten.detach):
        L.copied.add(node)  # a copy in torch, the same value in the core (_fresh_inputs)
    return _Rec(v, r.cshape, _static_shape(meta), meta.dtype)


@_register(aten.copy)
def _copy(L, node):
    if len(node.args) > 2 or node.kwargs:
        raise _NotLowered("copy non_blocking")
    src = L.rec(node.args[1])
    meta = _meta(node)
    v = L.convert(node, src.value, src.dtype, meta.dtype)
    if v is src.value:
        L.copied.add(node)
    return _Rec(v, src.cshape, _static_shape(meta), meta.dtype)


def _constant(L, node, value):
    meta = _meta(node)
    if not isinstance(value, (bool, int, float)):
        raise _NotLowered("fill value %r" % (value,))
    name = _core_dtype(meta.dtype)
    if name is None:
        raise _NotLowered("dtype")
    if np.dtype(name).kind in "iu" and isinstance(value, float):
        raise _NotLowered("float fill of an integer tensor")
    c = L.g.constant(np.dtype(name).type(value))
    return _Rec(c, (), _static_shape(meta), meta.dtype)


@_register(aten.full, aten.scalar_tensor)
def _full(L, node):
    _cpu_only(node, "device", "layout")
    if node.target.overloadpacket is aten.scalar_tensor:
        return _constant(L, node, node.args[0])
    return _constant(L, node, node.args[1])


@_register(aten.full_like, aten.fill)
def _full_like(L, node):
    _cpu_only(node, "device", "layout")
    if node.target not in (aten.full_like.default, aten.fill.Scalar):
        raise _NotLowered("fill with a tensor")
    return _constant(L, node, node.args[1])
