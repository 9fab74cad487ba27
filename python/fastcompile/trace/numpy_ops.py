"""Trace stage, NumPy mapping: which NumPy functions, operators and array
methods become core ops (name, attributes); everything else pure in NumPy runs
as an extern call. In: a NumPy callable and its traced arguments; out: a plan."""

import operator

import numpy as np

from fastcompile._common import hashable as _hashable

UNARY = {
    np.negative: "neg",
    np.absolute: "abs",
    np.exp: "exp",
    np.exp2: "exp2",
    np.expm1: "expm1",
    np.log: "log",
    np.log2: "log2",
    np.log10: "log10",
    np.log1p: "log1p",
    np.sqrt: "sqrt",
    np.reciprocal: "reciprocal",
    np.square: "square",
    np.sin: "sin",
    np.cos: "cos",
    np.tan: "tan",
    np.tanh: "tanh",
    np.arcsin: "asin",
    np.arccos: "acos",
    np.arctan: "atan",
    np.sinh: "sinh",
    np.cosh: "cosh",
    np.arcsinh: "asinh",
    np.arccosh: "acosh",
    np.arctanh: "atanh",
    np.floor: "floor",
    np.ceil: "ceil",
    np.rint: "round",
    np.trunc: "trunc",
    np.sign: "sign",
    np.isnan: "isnan",
    np.isinf: "isinf",
    np.isfinite: "isfinite",
    np.logical_not: "logical_not",
    np.invert: "bitwise_not",
}

BINARY = {
    np.add: "add",
    np.subtract: "sub",
    np.multiply: "mul",
    np.divide: "div",
    np.floor_divide: "floordiv",
    np.remainder: "remainder",
    np.power: "pow",
    np.maximum: "maximum",
    np.minimum: "minimum",
    np.fmax: "fmax",
    np.fmin: "fmin",
    np.arctan2: "atan2",
    np.hypot: "hypot",
    np.copysign: "copysign",
    np.equal: "eq",
    np.not_equal: "ne",
    np.less: "lt",
    np.less_equal: "le",
    np.greater: "gt",
    np.greater_equal: "ge",
    np.logical_and: "logical_and",
    np.logical_or: "logical_or",
    np.logical_xor: "logical_xor",
    np.bitwise_and: "bitwise_and",
    np.bitwise_or: "bitwise_or",
    np.bitwise_xor: "bitwise_xor",
}

# Python operators (BINARY_OP argrepr without "=", COMPARE_OP argval) -> (core op, eager fn)
OPERATORS = {
    "+": ("add", operator.add),
    "-": ("sub", operator.sub),
    "*": ("mul", operator.mul),
    "/": ("div", operator.truediv),
    "//": ("floordiv", operator.floordiv),
    "%": ("remainder", operator.mod),
    "**": ("pow", operator.pow),
    "&": ("bitwise_and", operator.and_),
    "|": ("bitwise_or", operator.or_),
    "^": ("bitwise_xor", operator.xor),
    "@": (None, operator.matmul),
    "<<": (None, operator.lshift),
    ">>": (None, operator.rshift),
    "<": ("lt", operator.lt),
    "<=": ("le", operator.le),
    "==": ("eq", operator.eq),
    "!=": ("ne", operator.ne),
    ">": ("gt", operator.gt),
    ">=": ("ge", operator.ge),
}

# in-place operator methods called by name (a.__iadd__(b)): traced as the statement a += b
INPLACE_METHODS = {
    "__i%s__" % name: sym
    for sym, name in (
        ("+", "add"),
        ("-", "sub"),
        ("*", "mul"),
        ("/", "truediv"),
        ("//", "floordiv"),
        ("%", "mod"),
        ("**", "pow"),
        ("&", "and"),
        ("|", "or"),
        ("^", "xor"),
        ("@", "matmul"),
        ("<<", "lshift"),
        (">>", "rshift"),
    )
}

# methods that write into their array or change it (side effects the graph cannot hold): of
# any array (ndarray and Tensor), and of ndarrays (Tensor.sort and Tensor.put return new ones)
MUTATING_DUNDERS = frozenset(("__setitem__", "__delitem__", "__setstate__"))
MUTATING_METHODS = frozenset(
    ("fill", "sort", "resize", "put", "itemset", "setfield", "setflags", "tofile", "partition", "byteswap")
)

# reductions: function or method name -> core op
REDUCTIONS = {
    "sum": "sum",
    "mean": "mean",
    "prod": "prod",
    "max": "amax",
    "amax": "amax",
    "min": "amin",
    "amin": "amin",
    "argmax": "argmax",
    "argmin": "argmin",
    "var": "var",
    "std": "std",
    "any": "any",
    "all": "all",
}
REDUCTION_FNS = {getattr(np, name): name for name in REDUCTIONS}

# NumPy callables never traced (side effects, randomness, I/O)
NOT_PURE_MODULES = ("numpy.random", "numpy.testing", "numpy.lib.npyio", "numpy._core.arrayprint")
NOT_PURE = {
    np.save,
    np.load,
    np.savetxt,
    np.loadtxt,
    np.set_printoptions,
    np.seterr,
    np.copyto,
    np.put,
    np.place,
    np.putmask,
    np.fill_diagonal,
}

# NumPy callables that may be called at trace time on Python-level values
FOLDABLE_CLASSES = (np.dtype, np.generic, np.errstate, np.finfo, np.iinfo)


def is_numpy_callable(fn):
    mod = getattr(fn, "__module__", None) or ""
    if isinstance(fn, np.ufunc):
        return True
    return mod == "numpy" or mod.startswith("numpy.")


def is_pure(fn):
    if fn in NOT_PURE if _hashable(fn) else False:
        return False
    mod = getattr(fn, "__module__", None) or ""
    return not mod.startswith(NOT_PURE_MODULES)


def writes_into(fn, nargs, kwargs):
    """Whether calling NumPy's fn with nargs positional arguments and kwargs (names) writes into
    an array it is given: an ``out`` argument by keyword or by position (a ufunc's outputs follow
    its nin inputs; a function's or a ufunc method's ``out`` parameter), or ``ufunc.at``."""
    if "out" in kwargs:
        return True
    if isinstance(fn, np.ufunc):
        return nargs > fn.nin
    if getattr(fn, "__name__", None) == "at" and isinstance(getattr(fn, "__self__", None), np.ufunc):
        return True
    pos = _out_position(fn)
    return pos is not None and nargs > pos


_OUT_POSITION = {}


def _out_position(fn):
    """The index of fn's positional ``out`` parameter, or None (none, or no signature)."""
    key = fn if _hashable(fn) else None
    if key is not None and key in _OUT_POSITION:
        return _OUT_POSITION[key]
    import inspect

    pos = None
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    for i, p in enumerate(params):
        if p.kind in (p.VAR_POSITIONAL, p.KEYWORD_ONLY, p.VAR_KEYWORD):
            break
        if p.name == "out":
            pos = i
            break
    if key is not None:
        _OUT_POSITION[key] = pos
    return pos


def reduction_attrs(name, axis=None, keepdims=False, ddof=0, dtype=None, out=None, **rest):
    """Core attributes for a NumPy reduction, or None when only an extern can do it."""
    if dtype is not None or out is not None or rest:
        return None
    if axis is not None and not isinstance(axis, (int, tuple)):
        return None
    attrs = {"axis": axis, "keepdim": bool(keepdims)}
    if name in ("var", "std"):
        if ddof not in (0, 1):
            return None
        attrs["correction"] = int(ddof)
    elif ddof:
        return None
    return attrs
