"""Random graphs against NumPy (Hypothesis).

A program is drawn as plain data: 1-3 float32/float64 inputs whose shapes are
broadcast-compatible suffixes of one base shape (size-1 dims, 0-size dims and
0-d included), each with a memory layout (contiguous, transposed, sliced,
reversed), then 1-30 steps of pointwise unary/binary/ternary ops, casts and
reductions with random axes and keepdim, then a few outputs, and sometimes a
thread count with which every kernel takes its OpenMP path. The same program is
run by fastcompile and by NumPy.

Comparison: dtype and shape equal; NaN and +-inf at the same positions; finite
values within 16 * E, where E is a first-order bound on how far a value can be
from the exact result, carried through the program beside the NumPy reference:
each op adds one rounding of its result (eps of its dtype * |result|) and
scales its operands' bounds by its derivative; sums add n * eps * sum|terms|
(fastcompile and NumPy add in different orders). So the tolerance is relative to
the magnitudes that went into each value, not only to the value itself, and it
needs no per-graph tuning.

Ops whose result jumps (floor, comparisons, argmax, division, log, sqrt, ...)
only take *exact* operands (inputs, or exact functions of them such as neg,
abs, maximum, floor): rounding a few ulps differently must never move a value
across a discontinuity, or the comparison would be meaningless. Their NaN and
inf positions are compared like everything else.

Set FASTCOMPILE_FUZZ=1 for random seeds and more examples; by default the
examples are derandomized, so CI runs are reproducible.
"""

import math
import os
import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fastcompile  # noqa: E402
from conftest import assert_close_np  # noqa: E402
from fastcompile.graph import Graph  # noqa: E402

FUZZ = os.environ.get("FASTCOMPILE_FUZZ", "") not in ("", "0")
settings.register_profile(
    "fastcompile-random-graphs-ci",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    max_examples=int(os.environ.get("FASTCOMPILE_RANDOM_GRAPHS", "150")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile(
    "fastcompile-random-graphs-fuzz",
    deadline=None,
    derandomize=False,
    print_blob=True,
    max_examples=int(os.environ.get("FASTCOMPILE_RANDOM_GRAPHS", "1000")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
PROFILE = settings.get_profile("fastcompile-random-graphs-" + ("fuzz" if FUZZ else "ci"))

C_TOL = 16.0  # ulps of slack per unit of the error bound E
TINY = 1e-300


# ---------------------------------------------------------------------------
# NumPy side: reference values and error bounds
# ---------------------------------------------------------------------------

_ERF = np.vectorize(math.erf, otypes=[np.float64])
_ERFC = np.vectorize(math.erfc, otypes=[np.float64])
SQRT2 = math.sqrt(2.0)


def erf(a):
    return _ERF(a.astype(np.float64)).astype(a.dtype) if a.size else a.copy()


def gelu(a):
    """0.5 x erfc(-x / sqrt 2): the erf form without its cancellation for x << 0."""
    x = f64(a)
    return (0.5 * x * _ERFC(-x / SQRT2)).astype(a.dtype) if a.size else a.copy()


def eps(dtype):
    return float(np.finfo(dtype).eps) if np.dtype(dtype).kind == "f" else 0.0


def rnd(r):
    """One rounding of result r, in float64."""
    return eps(r.dtype) * np.abs(r.astype(np.float64))


def f64(a):
    return np.asarray(a).astype(np.float64)


class Val:
    """A node on the NumPy side: reference value and error bound E (float64)."""

    def __init__(self, ref, err):
        self.ref = np.asarray(ref)
        self.err = np.broadcast_to(np.asarray(err, np.float64), self.ref.shape)


# unary ops on any float operand: (numpy function, derivative bound of the exact op)
SMOOTH_UNARY = {
    "neg": (np.negative, None),
    "abs": (np.abs, None),
    "relu": (lambda a: np.maximum(a, a.dtype.type(0)), None),
    "exp": (np.exp, lambda a, r: np.abs(f64(r))),
    "expm1": (np.expm1, lambda a, r: np.exp(f64(a))),
    "tanh": (np.tanh, lambda a, r: 1.0 - f64(r) ** 2),
    "sin": (np.sin, lambda a, r: np.abs(np.cos(f64(a)))),
    "cos": (np.cos, lambda a, r: np.abs(np.sin(f64(a)))),
    "atan": (np.arctan, lambda a, r: 1.0 / (1.0 + f64(a) ** 2)),
    "sigmoid": (lambda a: (1.0 / (1.0 + np.exp(-f64(a)))).astype(a.dtype), lambda a, r: 0.25),
    "square": (np.square, lambda a, r: 2.0 * np.abs(f64(a))),
    "erf": (erf, lambda a, r: 1.13 * np.exp(-(f64(a) ** 2))),
    "gelu": (gelu, lambda a, r: 1.13),
    "silu": (lambda a: (f64(a) / (1.0 + np.exp(-f64(a)))).astype(a.dtype), lambda a, r: 1.1),
}
EXACT_RESULT_UNARY = {"neg", "abs", "relu"}

# unary ops whose result jumps or blows up somewhere: exact operands only
EXACT_UNARY = {
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
    "round": np.round,
    "sign": np.sign,
    "sqrt": np.sqrt,
    "log": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "log1p": np.log1p,
    "reciprocal": np.reciprocal,
    "rsqrt": lambda a: (1.0 / np.sqrt(f64(a))).astype(a.dtype),
    "asin": np.arcsin,
    "acos": np.arccos,
    "atanh": np.arctanh,
    "acosh": np.arccosh,
    "tan": np.tan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "exp2": np.exp2,
}
ROUNDING_UNARY = {"floor", "ceil", "trunc", "round", "sign"}

SMOOTH_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "fmax": np.fmax,
    "fmin": np.fmin,
    "hypot": np.hypot,
}
EXACT_BINARY = {
    "div": np.true_divide,
    "atan2": np.arctan2,
    "floordiv": np.floor_divide,
    "remainder": np.remainder,
    "copysign": np.copysign,
    "pow": np.power,
}
COMPARE = {
    "gt": np.greater,
    "lt": np.less,
    "ge": np.greater_equal,
    "le": np.less_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}
FLOAT_REDUCE = ["sum", "mean", "amax", "amin", "var", "std", "logsumexp", "softmax", "log_softmax"]
CONSTANTS = [0.5, -1.25, 2.0, 0.0, 3.0, -0.75]


def np_unary(op, a):
    """(reference, error bound) of a unary op on Val a."""
    with np.errstate(all="ignore"):
        if op in SMOOTH_UNARY:
            fn, deriv = SMOOTH_UNARY[op]
            r = fn(a.ref)
            if deriv is None:
                return r, a.err
            return r, deriv(a.ref, r) * a.err + rnd(r)
        r = EXACT_UNARY[op](a.ref)
        return r, (0.0 if op in ROUNDING_UNARY else rnd(r))


def np_binary(op, a, b):
    with np.errstate(all="ignore"):
        if op in SMOOTH_BINARY:
            r = SMOOTH_BINARY[op](a.ref, b.ref)
            if op in ("add", "sub"):
                e = a.err + b.err + rnd(r)
            elif op == "mul":
                e = np.abs(f64(b.ref)) * a.err + np.abs(f64(a.ref)) * b.err + rnd(r)
            elif op == "hypot":
                e = a.err + b.err + rnd(r)
            else:
                e = np.maximum(a.err, b.err)
            return r, e
        r = EXACT_BINARY[op](a.ref, b.ref)
        return r, (0.0 if op == "copysign" else rnd(r))


def red_kw(axis, keepdim):
    return dict(axis=axis, keepdims=keepdim)


def np_reduce(op, a, axis, keepdim, ddof):
    """(reference, error bound) of a reduction; may raise like NumPy does."""
    x = a.ref
    e = a.err
    ax = axis
    n = x.size if ax is None else int(np.prod([x.shape[i] for i in (ax if isinstance(ax, tuple) else (ax,))]))
    with np.errstate(all="ignore"):
        absx = np.abs(f64(x))
        if op == "sum":
            r = np.sum(x, **red_kw(ax, keepdim))
            err = np.sum(e, **red_kw(ax, keepdim)) + n * eps(r.dtype) * np.sum(absx, **red_kw(ax, keepdim))
            return r, err + rnd(r)
        if op == "mean":
            r = np.mean(x, **red_kw(ax, keepdim))
            err = (np.sum(e, **red_kw(ax, keepdim)) + n * eps(r.dtype) * np.sum(absx, **red_kw(ax, keepdim))) / max(
                n, 1
            )
            return r, err + 2 * rnd(r)
        if op in ("amax", "amin"):
            r = (np.max if op == "amax" else np.min)(x, **red_kw(ax, keepdim))
            return r, np.max(e, **red_kw(ax, keepdim), initial=0.0)
        if op in ("var", "std"):
            v = np.var(x, ddof=ddof, **red_kw(ax, keepdim))
            m = np.mean(f64(x), axis=ax, keepdims=True)
            em = (np.sum(e, axis=ax, keepdims=True) + n * eps(x.dtype) * np.sum(absx, axis=ax, keepdims=True)) / max(
                n, 1
            )
            d = np.abs(f64(x) - m)
            cnt = np.float64(max(n - ddof, 0))
            ev = (
                2 * np.sum(d * (e + em), **red_kw(ax, keepdim))
                + 2 * n * eps(x.dtype) * np.sum(d * d + absx * absx, **red_kw(ax, keepdim))
            ) / cnt + 2 * rnd(v)
            if op == "var":
                return v, ev
            r = np.sqrt(v)
            return r, ev / (f64(r) + np.sqrt(ev)) + rnd(r)
        if n == 0 or x.size == 0:
            # nothing to normalize: softmax of empty rows is empty, and the
            # log of an empty sum is -inf (as torch and scipy)
            if op == "logsumexp":
                r = np.full(np.sum(x, **red_kw(ax, keepdim)).shape, -np.inf if n == 0 else 0, x.dtype)
                return r, 0.0
            return x.copy(), 0.0
        maxe = np.max(e, axis=ax, keepdims=True, initial=0.0)
        if op == "logsumexp":
            m = np.max(x, axis=ax, keepdims=True)
            m = np.where(np.isinf(m), 0, m).astype(x.dtype)
            s = np.sum(np.exp(f64(x) - m), **red_kw(ax, keepdim))
            r = (np.log(s) + (m if keepdim else np.squeeze(m, axis=ax))).astype(x.dtype)
            err = (maxe if keepdim else np.squeeze(maxe, axis=ax)) + (n + 2) * eps(x.dtype) * (1 + np.abs(f64(r)))
            return r, err
        # softmax / log_softmax along one axis
        m = np.max(x, axis=ax, keepdims=True)
        d = f64(x) - m
        s = np.sum(np.exp(d), axis=ax, keepdims=True)
        if op == "softmax":
            r = (np.exp(d) / s).astype(x.dtype)
            return r, 2 * np.abs(f64(r)) * maxe + (n + 2) * eps(x.dtype) * np.abs(f64(r)) + rnd(r)
        r = (d - np.log(s)).astype(x.dtype)
        return r, 2 * maxe + (n + 2) * eps(x.dtype) * (1 + np.abs(f64(r)))


# ---------------------------------------------------------------------------
# programs
# ---------------------------------------------------------------------------

LAYOUTS = ["c", "c", "transposed", "sliced", "reversed", "mixed"]


def make_array(shape, dtype, layout, seed, specials):
    """An array of `shape` with the given memory layout and some NaN/inf/0."""
    rs = np.random.default_rng(seed)
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        base = rs.standard_normal(shape[::-1]) * 2
        a = base.astype(dtype).T
    elif layout == "sliced" and len(shape) >= 1:
        big = tuple(2 * s + 1 for s in shape)
        base = rs.standard_normal(big).astype(dtype) * 2
        a = base[tuple(slice(1, None, 2) for _ in shape)]
    elif layout == "reversed" and len(shape) >= 1:
        a = (rs.standard_normal(shape) * 2).astype(dtype)[::-1]
    elif layout == "mixed" and len(shape) >= 2:
        big = (shape[0],) + tuple(s * 2 for s in shape[1:])
        base = (rs.standard_normal(big[::-1]) * 2).astype(dtype).T
        a = base[(slice(None, None, -1),) + tuple(slice(None, None, 2) for _ in shape[1:])]
    else:
        a = np.array(rs.standard_normal(shape) * 2, dtype=dtype)
    assert a.shape == shape, (a.shape, shape)
    if specials and a.size:
        flat_idx = rs.integers(0, a.size, size=max(1, a.size // 6))
        vals = rs.choice([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], size=flat_idx.size)
        for f, v in zip(flat_idx, vals):
            a[np.unravel_index(f, shape)] = v
    return a


def bshape(*shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def reduced_shape(shape, axis, keepdim):
    nd = len(shape)
    axes = range(nd) if axis is None else [(a % nd) for a in (axis if isinstance(axis, tuple) else (axis,))]
    return tuple((1 if keepdim else None) if i in axes else s for i, s in enumerate(shape) if keepdim or i not in axes)


@st.composite
def programs(draw):
    rank = draw(st.integers(0, 4))
    sizes = st.sampled_from([1, 2, 3, 4, 5, 7, 0]) if draw(st.booleans()) else st.sampled_from([1, 2, 3, 5, 6])
    base = [draw(sizes) for _ in range(rank)]
    ninputs = draw(st.integers(1, 3))
    inputs = []
    for _ in range(ninputs):
        r = draw(st.integers(0, rank))
        shape = list(base[rank - r :])
        for d in range(r):
            if draw(st.integers(0, 4)) == 0:
                shape[d] = 1
        dtype = draw(st.sampled_from(["float64", "float64", "float32"]))
        inputs.append(
            dict(
                shape=tuple(shape),
                dtype=dtype,
                layout=draw(st.sampled_from(LAYOUTS)),
                seed=draw(st.integers(0, 2**16)),
                specials=draw(st.integers(0, 3)) == 0,
            )
        )
    # symbolic nodes: (kind, shape, dtype, exact); kind: 'f' float, 'b' bool, 'i' index
    nodes = [("f", x["shape"], x["dtype"], True) for x in inputs]
    steps = []
    nsteps = draw(st.integers(1, 30))

    def pick(pred):
        cand = [i for i, n in enumerate(nodes) if pred(n)]
        if not cand:
            return None
        # prefer recent nodes, so graphs get deep as well as wide
        j = draw(st.integers(0, len(cand) - 1))
        return cand[-1 - j] if draw(st.booleans()) else cand[j]

    def fdt(*dts):
        return "float64" if "float64" in dts else "float32"

    for _ in range(nsteps):
        family = draw(
            st.sampled_from(
                [
                    "unary",
                    "unary",
                    "binary",
                    "binary",
                    "const",
                    "exact_unary",
                    "exact_binary",
                    "compare",
                    "where",
                    "clamp",
                    "cast",
                    "reduce",
                    "reduce",
                    "reduce",
                    "argreduce",
                    "boolreduce",
                ]
            )
        )
        a = pick(lambda n: n[0] == "f")
        A = nodes[a]
        if family == "unary":
            op = draw(st.sampled_from(sorted(SMOOTH_UNARY)))
            steps.append(("unary", op, (a,), {}))
            nodes.append(("f", A[1], A[2], A[3] and op in EXACT_RESULT_UNARY))
        elif family == "exact_unary":
            a = pick(lambda n: n[0] == "f" and n[3])
            if a is None:
                continue
            op = draw(st.sampled_from(sorted(EXACT_UNARY)))
            steps.append(("unary", op, (a,), {}))
            nodes.append(("f", nodes[a][1], nodes[a][2], op in ROUNDING_UNARY))
        elif family in ("binary", "exact_binary", "compare"):
            exact = family != "binary"
            a = pick(lambda n: n[0] == "f" and (n[3] or not exact))
            if a is None:
                continue
            b = pick(lambda n: n[0] == "f" and (n[3] or not exact) and bshape(n[1], nodes[a][1]) is not None)
            if b is None:
                continue
            sh = bshape(nodes[a][1], nodes[b][1])
            table = {"binary": SMOOTH_BINARY, "exact_binary": EXACT_BINARY, "compare": COMPARE}[family]
            op = draw(st.sampled_from(sorted(table)))
            if draw(st.booleans()):
                a, b = b, a
            steps.append(("binary", op, (a, b), {}))
            if family == "compare":
                nodes.append(("b", sh, "bool", True))
            else:
                both_exact = nodes[a][3] and nodes[b][3]
                nodes.append(
                    (
                        "f",
                        sh,
                        fdt(nodes[a][2], nodes[b][2]),
                        both_exact and op in ("copysign", "maximum", "minimum", "fmax", "fmin"),
                    )
                )
        elif family == "const":
            op = draw(st.sampled_from(["add", "sub", "mul", "maximum", "minimum"]))
            c = draw(st.sampled_from(CONSTANTS))
            left = draw(st.booleans())
            steps.append(("const", op, (a,), dict(c=c, left=left)))
            exact_op = op in ("maximum", "minimum") or (op == "mul" and c in (0.0, 2.0))
            nodes.append(("f", A[1], A[2], A[3] and exact_op))
        elif family == "where":
            cnd = pick(lambda n: n[0] == "b")
            if cnd is None:
                continue
            b = pick(lambda n: n[0] == "f" and bshape(n[1], A[1], nodes[cnd][1]) is not None)
            if b is None:
                continue
            sh = bshape(A[1], nodes[b][1], nodes[cnd][1])
            steps.append(("where", "where", (cnd, a, b), {}))
            nodes.append(("f", sh, fdt(A[2], nodes[b][2]), A[3] and nodes[b][3]))
        elif family == "clamp":
            lo = draw(st.sampled_from([-1.0, -0.5, 0.0, 1.5]))
            hi = draw(st.sampled_from([-1.0, 0.5, 1.0, 2.0]))
            steps.append(("clamp", "clamp", (a,), dict(lo=lo, hi=hi)))
            nodes.append(("f", A[1], A[2], A[3]))
        elif family == "cast":
            if draw(st.integers(0, 3)) == 0:
                src = pick(lambda n: n[0] == "b" or (n[0] == "f" and n[3]))
                if src is None:
                    continue
                S = nodes[src]
                to = "bool" if S[0] == "f" else draw(st.sampled_from(["float32", "float64"]))
                steps.append(("cast", "cast", (src,), dict(dtype=to)))
                nodes.append(("b" if to == "bool" else "f", S[1], to, True))
            else:
                to = draw(st.sampled_from(["float32", "float64"]))
                steps.append(("cast", "cast", (a,), dict(dtype=to)))
                nodes.append(("f", A[1], to, A[3] and (to == "float64" or A[2] == "float32")))
        elif family in ("reduce", "argreduce", "boolreduce"):
            if family == "argreduce":
                a = pick(lambda n: n[0] == "f" and n[3])
            elif family == "boolreduce":
                a = pick(lambda n: n[0] == "b")
            if a is None:
                continue
            A = nodes[a]
            nd = len(A[1])
            op = {
                "reduce": st.sampled_from(FLOAT_REDUCE),
                "argreduce": st.sampled_from(["argmax", "argmin"]),
                "boolreduce": st.sampled_from(["any", "all"]),
            }[family]
            op = draw(op)
            keepdim = draw(st.booleans())
            if op in ("softmax", "log_softmax") or (op in ("argmax", "argmin") and nd and draw(st.booleans())):
                if nd == 0:
                    continue
                axis = draw(st.integers(-nd, nd - 1))
                keepdim = op in ("softmax", "log_softmax") or keepdim
            elif op in ("argmax", "argmin"):
                axis, keepdim = None, False
            else:
                sub = draw(st.lists(st.integers(0, max(nd - 1, 0)), unique=True, max_size=nd)) if nd else []
                form = draw(st.sampled_from(["none", "int", "tuple", "negtuple"]))
                if form == "none" or not sub:
                    axis = None
                elif form == "int":
                    axis = sub[0] - (nd if draw(st.booleans()) else 0)
                elif form == "tuple":
                    axis = tuple(sub)
                else:
                    axis = tuple(i - nd for i in sub)
            attrs = dict(axis=axis, keepdim=keepdim)
            if op in ("var", "std"):
                attrs["correction"] = draw(st.sampled_from([0, 1]))
            steps.append(("reduce", op, (a,), attrs))
            sh = A[1] if op in ("softmax", "log_softmax") else reduced_shape(A[1], axis, keepdim)
            kind = {"reduce": "f", "argreduce": "i", "boolreduce": "b"}[family]
            dt = {"f": A[2], "i": "int64", "b": "bool"}[kind]
            nodes.append((kind, sh, dt, kind != "f" or (op in ("amax", "amin") and A[3])))
    computed = list(range(ninputs, len(nodes)))
    if not computed:
        outputs = [0]
    else:
        extra = draw(st.lists(st.sampled_from(list(range(len(nodes)))), max_size=3))
        outputs = [computed[-1]] + extra
        # index results are outputs too, so they are checked
        outputs += [i for i in computed if nodes[i][0] == "i" and i not in outputs]
    # sometimes every kernel takes its OpenMP path, even on a few elements
    threads = draw(st.sampled_from([None, None, 2, 3, 4]))
    return dict(inputs=inputs, steps=steps, outputs=outputs, threads=threads)


# ---------------------------------------------------------------------------
# running a program both ways
# ---------------------------------------------------------------------------


class EmptyOutputNoIdentity(Exception):
    """A reduction without identity over a 0-size axis whose result is empty
    too: NumPy raises, fastcompile returns the empty result (a known bug,
    test_fuse.py::test_no_identity_reduction_over_empty_axis_raises)."""


def empty_without_identity(x, attrs):
    axis = attrs["axis"]
    axes = range(x.ndim) if axis is None else [a % x.ndim for a in (axis if isinstance(axis, tuple) else (axis,))]
    n = int(np.prod([x.shape[a] for a in axes]))
    out = int(np.prod([s for i, s in enumerate(x.shape) if i not in axes]))
    return n == 0 and out == 0 and x.ndim > 0


def run_numpy(prog, arrays):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _run_numpy(prog, arrays)


def live_steps(prog):
    """The steps an output depends on. The graph skips the others (a value no output needs is
    never computed), so NumPy must not run them either: an error there is no error of the graph."""
    n_in = len(prog["inputs"])
    live = set(prog["outputs"])
    for j in range(len(prog["steps"]) - 1, -1, -1):
        if n_in + j in live:
            live.update(prog["steps"][j][2])
    return live


def _run_numpy(prog, arrays):
    vals = [Val(a, 0.0) for a in arrays]
    live = live_steps(prog)
    for kind, op, args, attrs in prog["steps"]:
        if len(vals) not in live:
            vals.append(None)
            continue
        xs = [vals[i] for i in args]
        with np.errstate(all="ignore"):
            if kind == "unary":
                r, e = np_unary(op, xs[0])
            elif kind == "binary" and op in COMPARE:
                r, e = COMPARE[op](xs[0].ref, xs[1].ref), 0.0
            elif kind == "binary":
                r, e = np_binary(op, xs[0], xs[1])
            elif kind == "const":
                c = Val(np.asarray(attrs["c"], xs[0].ref.dtype), 0.0)  # a weak scalar
                r, e = np_binary(op, *((c, xs[0]) if attrs["left"] else (xs[0], c)))
            elif kind == "where":
                r = np.where(xs[0].ref, xs[1].ref, xs[2].ref)
                e = np.where(xs[0].ref, xs[1].err, xs[2].err)
            elif kind == "clamp":
                t = xs[0].ref.dtype.type
                r, e = np.clip(xs[0].ref, t(attrs["lo"]), t(attrs["hi"])), xs[0].err
            elif kind == "cast":
                r = xs[0].ref.astype(attrs["dtype"])
                narrowing = r.dtype.kind == "f" and r.dtype.itemsize < xs[0].ref.dtype.itemsize
                e = xs[0].err + (rnd(r) if narrowing else 0.0)
            elif op in ("argmax", "argmin", "amax", "amin") and empty_without_identity(xs[0].ref, attrs):
                raise EmptyOutputNoIdentity(op)
            elif op in ("argmax", "argmin", "any", "all"):
                r = getattr(np, op)(xs[0].ref, axis=attrs["axis"], keepdims=attrs["keepdim"])
                e = 0.0
            else:
                r, e = np_reduce(op, xs[0], attrs["axis"], attrs["keepdim"], attrs.get("correction", 0))
                r = np.asarray(r).astype(xs[0].ref.dtype)
        vals.append(Val(r, e))
    return [vals[i] for i in prog["outputs"]]


def build_graph(prog):
    g = Graph()
    vals = [g.input(x["dtype"], len(x["shape"])) for x in prog["inputs"]]
    for kind, op, args, attrs in prog["steps"]:
        xs = [vals[i] for i in args]
        if kind in ("unary", "binary", "where"):
            v = g.call(op, *xs)
        elif kind == "const":
            v = g.call(op, attrs["c"], xs[0]) if attrs["left"] else g.call(op, xs[0], attrs["c"])
        elif kind == "clamp":
            v = g.call("clamp", xs[0], attrs["lo"], attrs["hi"])
        elif kind == "cast":
            v = g.call("cast", xs[0], dtype=attrs["dtype"])
        elif op in ("softmax", "log_softmax"):
            v = g.call(op, xs[0], axis=attrs["axis"])
        else:
            v = g.call(op, xs[0], **attrs)
        vals.append(v)
    g.output(*[vals[i] for i in prog["outputs"]])
    return g, vals


def check_output(k, got, want):
    """conftest's assert_close_np (dtype, shape, NaN and +-inf positions, bools
    and indices exactly) with finite values within C_TOL * E of NumPy's."""
    if want.ref.dtype.kind != "f":
        assert_close_np(got, want.ref, err_msg="output %d" % k)
        return
    bound = want.err
    tol = np.where(np.isfinite(bound), C_TOL * bound, np.inf) + TINY
    assert_close_np(got, want.ref, kind="reduction", rtol=0.0, atol=tol, signed_zeros=False, err_msg="output %d" % k)


def _event(text):
    """Hypothesis statistics (--hypothesis-show-statistics); no-op outside @given."""
    try:
        hypothesis.event(text)
    except hypothesis.errors.InvalidArgument:
        pass


def call_with_threads(c, arrays, threads):
    if threads is None:
        return c(*arrays)
    old = fastcompile.config.get("serial_below"), fastcompile.config.get("num_threads")
    fastcompile.config.set(serial_below=1, num_threads=threads)
    try:
        return c(*arrays)
    finally:
        fastcompile.config.set(serial_below=old[0], num_threads=old[1])


def run_program(prog):
    # conftest turns the IR verifiers on for every test: every pass is checked
    assert fastcompile.config.get("verify") is True
    arrays = [make_array(x["shape"], x["dtype"], x["layout"], x["seed"], x["specials"]) for x in prog["inputs"]]
    g, vals = build_graph(prog)
    # the graph's static dtypes agree with NumPy's
    try:
        want = run_numpy(prog, arrays)
    except EmptyOutputNoIdentity:
        with pytest.raises(ValueError):
            call_with_threads(g.compile(), arrays, prog.get("threads"))
        _event("empty reduction without identity, empty result: ValueError as NumPy")
        return
    except (ValueError, IndexError) as e:
        # NumPy refuses (a reduction without identity over an empty axis):
        # fastcompile must refuse with the same exception type
        with pytest.raises(type(e)):
            call_with_threads(g.compile(), arrays, prog.get("threads"))
        _event("NumPy and fastcompile raise %s" % type(e).__name__)
        return
    for i, w in zip(prog["outputs"], want):
        assert vals[i].dtype == w.ref.dtype.name, (i, vals[i].dtype, w.ref.dtype)
        assert vals[i].ndim == w.ref.ndim, (i, vals[i].ndim, w.ref.ndim)
    c = g.compile()
    originals = [a.copy() for a in arrays]
    got = call_with_threads(c, arrays, prog.get("threads"))
    assert len(got) == len(want)
    for k, (gv, wv) in enumerate(zip(got, want)):
        check_output(k, gv, wv)
    _event("kernels: %d" % len(c.kernels))
    _event("reduction kernels: %d" % sum("reduce axes" in line for text in c.fused for line in text.splitlines()))
    # inputs are never written
    for a, o in zip(arrays, originals):
        np.testing.assert_array_equal(a, o)


@PROFILE
@hypothesis.given(programs())
def test_random_graph_matches_numpy(prog):
    note(repr(prog))
    run_program(prog)


# ---------------------------------------------------------------------------
# a few fixed programs: regressions found by the generator, and a self-test
# of the comparison (it must reject a wrong answer)
# ---------------------------------------------------------------------------

FIXED = {
    "softmax_of_sum_broadcast": dict(
        inputs=[
            dict(shape=(3, 4), dtype="float32", layout="transposed", seed=1, specials=False),
            dict(shape=(4,), dtype="float64", layout="reversed", seed=2, specials=False),
        ],
        steps=[
            ("binary", "add", (0, 1), {}),
            ("reduce", "softmax", (2,), dict(axis=0, keepdim=True)),
            ("reduce", "sum", (3,), dict(axis=(-1,), keepdim=False)),
        ],
        outputs=[4, 3],
    ),
    "zero_size_and_0d": dict(
        inputs=[
            dict(shape=(0, 3), dtype="float64", layout="sliced", seed=3, specials=False),
            dict(shape=(), dtype="float32", layout="c", seed=4, specials=False),
        ],
        steps=[
            ("binary", "mul", (0, 1), {}),
            ("reduce", "sum", (2,), dict(axis=0, keepdim=False)),
            ("reduce", "mean", (2,), dict(axis=None, keepdim=True)),
        ],
        outputs=[3, 4, 2],
    ),
    "specials_through_var_and_argmax": dict(
        inputs=[dict(shape=(5, 6), dtype="float64", layout="mixed", seed=5, specials=True)],
        steps=[
            ("reduce", "var", (0,), dict(axis=1, keepdim=False, correction=1)),
            ("reduce", "argmax", (0,), dict(axis=0, keepdim=False)),
            ("unary", "tanh", (0,), {}),
            ("reduce", "logsumexp", (3,), dict(axis=(0, 1), keepdim=True)),
        ],
        outputs=[1, 2, 4],
        threads=3,
    ),
    "empty_amax_raises": dict(
        inputs=[dict(shape=(0, 2), dtype="float64", layout="c", seed=6, specials=False)],
        steps=[("reduce", "amax", (0,), dict(axis=0, keepdim=False))],
        outputs=[1],
    ),
    # no output reads the amax: the graph never computes it, so nothing raises
    "unused_empty_amax_skipped": dict(
        inputs=[dict(shape=(0, 2), dtype="float64", layout="c", seed=6, specials=False)],
        steps=[("reduce", "amax", (0,), dict(axis=0, keepdim=False)), ("unary", "exp", (0,), {})],
        outputs=[2],
    ),
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_program(name):
    run_program(FIXED[name])


def test_comparison_rejects_wrong_answers():
    want = Val(np.array([1.0, np.nan, np.inf, 1e-3]), np.array([1e-16, 0, 0, 1e-19]))
    check_output(0, np.array([1.0, np.nan, np.inf, 1e-3]), want)
    for bad in (
        [1.0 + 1e-12, np.nan, np.inf, 1e-3],
        [1.0, 0.0, np.inf, 1e-3],
        [1.0, np.nan, -np.inf, 1e-3],
        [1.0, np.nan, np.inf, 1.0001e-3],
    ):
        with pytest.raises(AssertionError):
            check_output(0, np.array(bad), want)
    with pytest.raises(AssertionError):
        check_output(0, np.array([1.0, np.nan, np.inf, 1e-3], np.float32), want)
