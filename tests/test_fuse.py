"""Fusion: how many kernels a graph becomes, and that they compute the right thing.

Kernel counts come from ``Compiled.kernels`` (one record per generated kernel of
every plan built so far) and ``Compiled.fused`` (the fused plan as text); the
"never recompute" rule is checked by counting helper calls in the generated C.
Every result is compared with NumPy evaluating the same graph: NaN and inf by
position, finite values within a tolerance relative to their magnitude.

Tests that count kernels or plans build their own Compiled (equal kernels come
from the kernel cache); the large-input and threading tests reuse compiled
graphs through ``_cached``: sizes are not part of the plan key, so they add no
kernels.
"""

import functools
import math
import re

import numpy as np
import pytest

import fastcompile
from conftest import assert_close_np
from fastcompile.graph import Graph

SQRT1_2 = 0.7071067811865476


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def assert_close(got, want, rtol=None, atol=0.0):
    """conftest's assert_close_np (dtype, shape, NaN and +-inf positions), with
    finite values within rtol * max(|want|, 1) + atol: fused reductions and
    normalizations cancel, so values near 0 get an absolute slack of rtol.
    rtol defaults by dtype (float16 2e-3, float32 2e-5, float64 1e-12)."""
    want = np.asarray(want)
    if want.dtype.kind != "f":
        assert_close_np(got, want)
        return
    if rtol is None:
        rtol = {2: 2e-3, 4: 2e-5, 8: 1e-12}[want.dtype.itemsize]
    slack = rtol * np.maximum(np.abs(want.astype(np.float64)), 1.0) + atol
    assert_close_np(got, want, kind="reduction", rtol=0.0, atol=slack, signed_zeros=False)


def build(fn, *specs):
    """Graph with inputs `specs` ((dtype, ndim) pairs); fn(g, *inputs) returns
    the output Value or a tuple of them. Returns the Compiled."""
    g = Graph()
    ins = [g.input(dt, nd) for dt, nd in specs]
    outs = fn(g, *ins)
    if not isinstance(outs, tuple):
        outs = (outs,)
    g.output(*outs)
    return g.compile()


_CACHE = {}


def _cached(name, fn, *specs):
    if name not in _CACHE:
        _CACHE[name] = build(fn, *specs)
    return _CACHE[name]


def nkernels(c):
    """Kernels of a compiled graph that has built exactly one plan."""
    assert c.nplans == 1, c.fused
    assert len(c.kernels) == len(re.findall(r"^kernel \d+:", c.fused[0], re.M))
    return len(c.kernels)


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(shape, dtype, seed=0):
    return rng(seed).standard_normal(shape).astype(dtype)


def calls_per_loop(source, helper):
    """How many times each innermost loop of the generated source calls
    `helper` (the C text is cut at every `#pragma omp simd`; a kernel may carry
    several variants of one loop, e.g. contiguous and strided)."""
    loops = re.split(r"#pragma omp simd", source)[1:]
    assert loops, "no simd loop in the kernel"
    return [loop.count(helper + "(") for loop in loops]


def computed_once(c, helper):
    """`helper` is called in some loop, and never twice in one loop."""
    counts = [n for k in c.kernels for n in calls_per_loop(k.source, helper)]
    return max(counts) == 1


# ---------------------------------------------------------------------------
# NumPy references
# ---------------------------------------------------------------------------


def np_erf(x):
    """erf in float64 (no SciPy dependency): math.erf elementwise."""
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


def np_gelu(x):
    """GELU in float64 as 0.5 x erfc(-x / sqrt 2) (no cancellation for x << 0)."""
    x64 = x.astype(np.float64)
    return (0.5 * x64 * np.vectorize(math.erfc, otypes=[np.float64])(-x64 * SQRT1_2)).astype(x.dtype)


def np_softmax(x, axis=-1):
    if x.size == 0:
        return x.copy()  # empty rows: nothing to normalize (as torch)
    with np.errstate(all="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        e = np.exp(x - m)
        return e / np.sum(e, axis=axis, keepdims=True, dtype=np.float64).astype(x.dtype)


def np_log_softmax(x, axis=-1):
    with np.errstate(all="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        d = x - m
        s = np.sum(np.exp(d), axis=axis, keepdims=True, dtype=np.float64).astype(x.dtype)
        return d - np.log(s)


def np_layernorm(x, eps):
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        m = x64.mean(-1, keepdims=True)
        d = x64 - m
        v = (d * d).mean(-1, keepdims=True)
        return (d / np.sqrt(v + eps)).astype(x.dtype)


# ---------------------------------------------------------------------------
# graph builders
# ---------------------------------------------------------------------------


def gelu_primitives(g, x):
    # 0.5 * x * (1 + erf(x / sqrt(2))), in Python's evaluation order
    half_x = g.call("mul", x, 0.5)
    inner = g.call("add", 1.0, g.call("erf", g.call("div", x, 2**0.5)))
    return g.call("mul", half_x, inner)


def gelu_primitives_chain(g, x):
    # x * (0.5 * (1 + erf(x * (1/sqrt(2))))): every op reads the previous one
    e = g.call("erf", g.call("mul", x, SQRT1_2))
    return g.call("mul", x, g.call("mul", 0.5, g.call("add", e, 1.0)))


def silu_times(g, x, y):
    return g.call("mul", g.call("mul", x, g.call("sigmoid", x)), y)


def softmax_by_hand(g, x):
    m = g.call("amax", x, axis=-1, keepdim=True)
    e = g.call("exp", g.call("sub", x, m))
    return g.call("div", e, g.call("sum", e, axis=-1, keepdim=True))


def layernorm_by_hand(g, x, eps=1e-5):
    m = g.call("mean", x, axis=-1, keepdim=True)
    d = g.call("sub", x, m)
    v = g.call("mean", g.call("square", d), axis=-1, keepdim=True)
    return g.call("mul", d, g.call("rsqrt", g.call("add", v, eps)))


def softmax_op(g, x):
    return g.call("softmax", x)


def log_softmax_op(g, x):
    return g.call("log_softmax", x, axis=-1)


# ---------------------------------------------------------------------------
# pointwise chains: one kernel
# ---------------------------------------------------------------------------

# Nodes that read only graph inputs (x / sqrt(2), exp(y), x > 2) must join an
# open kernel over the same space (horizontal fusion); otherwise two branches
# become two kernels and the first one is written to memory and read back.


def test_gelu_from_primitives_is_one_kernel():
    c = build(gelu_primitives, ("float32", 2))
    x = randn((7, 33), np.float32)
    (out,) = c(x)
    assert nkernels(c) == 1, c.fused[0]
    assert_close(out, np_gelu(x), rtol=1e-5)


def test_gelu_from_primitives_results():
    c = build(gelu_primitives, ("float64", 2))
    x = randn((7, 33), np.float64)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    (out,) = c(x)
    with np.errstate(invalid="ignore"):
        want = x * 0.5 * (1.0 + np_erf(x * SQRT1_2))
    assert_close(out, want, rtol=1e-13)


def test_gelu_chain_is_one_kernel_and_erf_once():
    c = build(gelu_primitives_chain, ("float32", 2))
    x = randn((5, 17), np.float32)
    (out,) = c(x)
    assert nkernels(c) == 1, c.fused[0]
    assert computed_once(c, "fc_erf_f32")
    assert_close(out, np_gelu(x), rtol=1e-5)


@pytest.mark.parametrize("approximate", [None, "none"])
def test_gelu_op_is_one_kernel(approximate):
    kw = {} if approximate is None else {"approximate": approximate}
    c = build(lambda g, x: g.call("gelu", x, **kw), ("float32", 2))
    x = randn((4, 9), np.float32)
    (out,) = c(x)
    assert nkernels(c) == 1
    assert "fc_gelu_f32(" in c.kernels[0].source
    assert_close(out, np_gelu(x), rtol=1e-5)


def test_silu_times_y_is_one_kernel():
    c = build(silu_times, ("float32", 2), ("float32", 2))
    x, y = randn((6, 10), np.float32, 1), randn((6, 10), np.float32, 2)
    (out,) = c(x, y)
    assert nkernels(c) == 1, c.fused[0]
    assert computed_once(c, "fc_sigmoid_f32")
    want = (x.astype(np.float64) / (1 + np.exp(-x.astype(np.float64))) * y).astype(np.float32)
    assert_close(out, want, rtol=1e-5)


def test_independent_branches_are_one_kernel():
    c = build(lambda g, x, y: g.call("add", g.call("exp", x), g.call("exp", y)), ("float64", 2), ("float64", 2))
    x, y = randn((3, 5), np.float64, 1), randn((3, 5), np.float64, 2)
    (out,) = c(x, y)
    assert_close(out, np.exp(x) + np.exp(y))
    assert nkernels(c) == 1, c.fused[0]


def test_sibling_reductions_with_prologues_are_one_kernel():
    # sum(exp(x), 0) and amax(|x|, 0): same space, same axes, one pass over x
    c = build(
        lambda g, x: (g.call("sum", g.call("exp", x), axis=0), g.call("amax", g.call("abs", x), axis=0)), ("float64", 2)
    )
    x = randn((4, 6), np.float64, 3)
    s, m = c(x)
    assert_close(s, np.exp(x).sum(0), rtol=1e-13)
    assert_close(m, np.abs(x).max(0))
    assert nkernels(c) == 1, c.fused[0]


def test_sibling_reductions_share_a_kernel():
    # without prologues the horizontal rule already applies
    c = build(lambda g, x: (g.call("sum", x, axis=0), g.call("amax", x, axis=0)), ("float64", 2))
    x = randn((4, 6), np.float64, 3)
    s, m = c(x)
    assert_close(s, x.sum(0), rtol=1e-13)
    assert_close(m, x.max(0))
    assert nkernels(c) == 1, c.fused[0]


def test_broadcast_pointwise_is_one_kernel():
    # a row vector and a scalar-like (1, 1) input broadcast against a matrix
    c = build(lambda g, x, b, s: g.call("mul", g.call("add", x, b), s), ("float64", 2), ("float64", 1), ("float64", 2))
    x, b, s = randn((5, 7), np.float64), randn((7,), np.float64, 1), randn((1, 1), np.float64, 2)
    (out,) = c(x, b, s)
    assert nkernels(c) == 1, c.fused[0]
    assert_close(out, (x + b) * s)


def test_cheap_broadcast_operand_is_computed_by_its_reader():
    """A cast of a broadcast operand ((7,) read at (5, 7)) was a kernel of its own shape writing
    a buffer the reader's kernel read back; cheap ops of buffers only (cast, neg, add, sub, mul)
    that one other kernel's full-size values read are now computed there, at every point."""

    def fn(g, x, b, s):
        w = g.call("neg", g.call("cast", b, dtype="float64"))
        return g.call("mul", g.call("add", x, w), g.call("cast", s, dtype="float64"))

    c = build(fn, ("float64", 2), ("float32", 1), ("float32", 2))
    x, b, s = randn((5, 7), np.float64), randn((7,), np.float32, 1), randn((5, 1), np.float32, 2)
    (out,) = c(x, b, s)
    assert nkernels(c) == 1, c.fused[0]
    assert_close(out, (x - b.astype(np.float64)) * s.astype(np.float64))


def test_broadcast_operand_kept_where_recomputing_it_is_not_cheap_or_not_alone():
    """Not moved into the reader: an expensive op (exp, computed once per element of its own
    shape, as the never-recompute rule wants), a cast that is also an output (written once, at
    its own shape), and a cast read by a reduction's per-row values (OUTER)."""

    def fn(g, x, b, c32):
        e = g.call("exp", b)
        cb = g.call("cast", c32, dtype="float64")
        rows = g.call("add", g.call("sum", g.call("mul", x, e), axis=1), g.call("cast", c32, dtype="float64"))
        return g.call("mul", x, cb), cb, rows

    c = build(fn, ("float64", 2), ("float64", 1), ("float32", 1))
    x, b, c32 = randn((5, 5), np.float64), randn((5,), np.float64, 1), randn((5,), np.float32, 2)
    out, cb, rows = c(x, b, c32)
    assert_close(out, x * c32.astype(np.float64))
    assert_close(cb, c32.astype(np.float64))
    assert_close(rows, (x * np.exp(b)).sum(axis=1) + c32.astype(np.float64))
    fused = c.fused[0]
    exp_kernel = [blk for blk in re.split(r"(?m)^(?=kernel \d+:)", fused) if "exp(" in blk]
    assert len(exp_kernel) == 1 and "sum(" not in exp_kernel[0], fused  # exp at its own shape
    out_cast = [blk for blk in re.split(r"(?m)^(?=kernel \d+:)", fused) if "-> output" in blk or "-> buffer" in blk]
    assert any(re.search(r"= cast\(", blk) and "mul(" not in blk for blk in out_cast), fused


def test_cheap_operand_moves_into_a_reduction_kernel_and_kernels_renumber():
    """Casts moving into reduction kernels (read by a level-0 prologue and by a level-1 value
    after a max), the kernels they leave dropped and the rest renumbered in order: the softmax-
    weighted sum is one kernel (2 before), and a two-reduction chain's casts join its first."""

    def softmax_weighted(g, x, b):
        cb = g.call("neg", g.call("cast", b, dtype="float64"))
        e = g.call("exp", g.call("sub", x, g.call("amax", x, axis=1, keepdim=True)))
        return g.call("sum", g.call("mul", e, cb), axis=1)

    c = build(softmax_weighted, ("float64", 2), ("float32", 1))
    x, b = randn((6, 7), np.float64), randn((7,), np.float32, 1)
    (out,) = c(x, b)
    assert nkernels(c) == 1, c.fused[0]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert_close(out, (e * -b.astype(np.float64)).sum(axis=1))

    def chain(g, x, a, b, w):
        t = g.call("sum", g.call("mul", x, g.call("cast", a, dtype="float64")), axis=1, keepdim=True)
        u = g.call("mul", g.call("sub", x, t), g.call("cast", b, dtype="float64"))
        v = g.call("sum", g.call("mul", u, u), axis=0)
        return g.call("mul", v, g.call("cast", w, dtype="float64"))

    c = build(chain, ("float64", 2), ("float32", 1), ("float32", 1), ("float32", 1))
    x = randn((5, 7), np.float64)
    a, b, w = (randn((7,), np.float32, k) for k in (1, 2, 3))
    (out,) = c(x, a, b, w)
    A, B, W = (z.astype(np.float64) for z in (a, b, w))
    u = (x - (x * A).sum(axis=1, keepdims=True)) * B
    assert_close(out, (u * u).sum(axis=0) * W, rtol=1e-12)
    # the casts of a and b (one kernel of their own before) run in the row-sum kernel that reads
    # them; the cast of w, read by the column sum's per-column result (OUTER), keeps its kernel
    assert nkernels(c) == 3, c.fused[0]
    kernels = re.split(r"(?m)^(?=kernel \d+:)", c.fused[0])[1:]
    (rows,) = [k for k in kernels if "reduce axes {1}" in k]
    assert rows.count("= cast(") == 2, c.fused[0]
    assert [k.count("= cast(") for k in kernels if "reduce" not in k] == [1], c.fused[0]


def test_cheap_operand_leaves_a_kernel_that_keeps_its_other_values():
    """The cast moves to its reader; the exp beside it (an output) stays in the kernel they shared."""

    def fn(g, x, b):
        return g.call("mul", x, g.call("cast", b, dtype="float32")), g.call("exp", b)

    c = build(fn, ("float32", 2), ("float64", 1))
    x, b = randn((5, 7), np.float32), randn((7,), np.float64, 1)
    y, e = c(x, b)
    assert_close(y, x * b.astype(np.float32))
    assert_close(e, np.exp(b))
    kernels = re.split(r"(?m)^(?=kernel \d+:)", c.fused[0])[1:]
    assert len(kernels) == 2, c.fused[0]
    (small,) = [k for k in kernels if "exp(" in k]
    assert "cast(" not in small and "mul(" not in small, c.fused[0]


def test_shared_subexpression_computed_once():
    # exp(x) feeds three consumers and two outputs: evaluated once per element
    def fn(g, x):
        e = g.call("exp", x)
        return g.call("add", g.call("mul", e, e), e), g.call("sub", e, 1.0)

    c = build(fn, ("float64", 2))
    x = randn((3, 8), np.float64)
    a, b = c(x)
    assert nkernels(c) == 1, c.fused[0]
    assert computed_once(c, "fc_exp_f64")
    e = np.exp(x)
    assert_close(a, e * e + e)
    assert_close(b, e - 1.0)


# ---------------------------------------------------------------------------
# softmax, log_softmax, layernorm
# ---------------------------------------------------------------------------


def _softmax_input(dtype, rows=6, cols=37):
    x = randn((rows, cols), dtype, 3) * 4
    x[1] = np.nan  # a NaN row
    x[2] = -np.inf  # a row of -inf: -inf - -inf is NaN, as NumPy
    x[3, 5] = np.nan  # one NaN poisons its row
    x[4, ::3] = -np.inf  # some -inf: exp gives exact zeros
    x[5, 0] = 1e4  # a huge value: no overflow after the max is taken out
    return x


@pytest.mark.parametrize("name,fn", [("softmax_op", softmax_op), ("softmax_hand", softmax_by_hand)])
def test_softmax_kernels_and_values(name, fn):
    c = build(fn, ("float32", 2))
    x = _softmax_input(np.float32)
    with np.errstate(all="ignore"):
        (out,) = c(x)
    assert nkernels(c) <= 2, c.fused[0]
    assert_close(out, np_softmax(x), rtol=1e-5)
    # rows sum to 1 where they are finite
    s = out[[0, 4, 5]].astype(np.float64).sum(-1)
    np.testing.assert_allclose(s, 1.0, rtol=1e-5)


@pytest.mark.parametrize("name,fn", [("softmax_op", softmax_op), ("softmax_hand", softmax_by_hand)])
def test_softmax_exp_once_per_sweep(name, fn):
    c = _cached(name, fn, ("float32", 2))
    c(randn((2, 5), np.float32))
    # every sweep after the max needs exp(x - max); none computes it twice
    assert computed_once(c, "fc_exp_f32"), [calls_per_loop(k.source, "fc_exp_f32") for k in c.kernels]


def test_softmax_float64_and_other_axis():
    c = build(lambda g, x: g.call("softmax", x, axis=0), ("float64", 2))
    x = randn((9, 4), np.float64, 5) * 10
    x[:, 1] = -np.inf
    with np.errstate(all="ignore"):
        (out,) = c(x)
    assert nkernels(c) <= 2, c.fused[0]
    assert_close(out, np_softmax(x, axis=0), rtol=1e-13)


def test_normalizations_over_empty_axes():
    # softmax of empty rows is empty, the log of an empty sum is -inf (as torch)
    c = build(
        lambda g, x: (g.call("softmax", x, axis=1), g.call("log_softmax", x, axis=1), g.call("logsumexp", x, axis=1)),
        ("float32", 2),
    )
    for shape in [(3, 0), (0, 4)]:
        x = np.ones(shape, np.float32)
        s, ls, lse = c(x)
        assert s.shape == ls.shape == shape and s.dtype == ls.dtype == np.float32
        assert_close(lse, np.full(shape[:1], -np.inf if shape[1] == 0 else 0, np.float32))


def test_log_softmax():
    c = build(log_softmax_op, ("float32", 2))
    x = _softmax_input(np.float32)
    with np.errstate(all="ignore"):
        (out,) = c(x)
    assert nkernels(c) <= 2, c.fused[0]
    assert_close(out, np_log_softmax(x), rtol=1e-5, atol=1e-5)
    assert c.kernels[0].source.count("fc_log_f32(") >= 1


def test_layernorm_by_hand():
    c = build(layernorm_by_hand, ("float32", 2))
    x = randn((6, 50), np.float32, 7) * 3 + 1
    x[1] = 2.5  # constant row: variance 0, rsqrt(eps)
    x[2, 7] = np.nan  # NaN row
    x[3, 0] = -np.inf  # -inf row: mean -inf, -inf - -inf = NaN
    with np.errstate(all="ignore"):
        (out,) = c(x)
    assert nkernels(c) <= 3, c.fused[0]
    assert_close(out, np_layernorm(x, 1e-5), rtol=2e-5, atol=2e-5)


def test_layernorm_with_affine_and_residual():
    # (x + r) normalized, then * w + b: still at most one kernel per reduction boundary
    def fn(g, x, r, w, b):
        return g.call("add", g.call("mul", layernorm_by_hand(g, g.call("add", x, r)), w), b)

    c = build(fn, ("float64", 2), ("float64", 2), ("float64", 1), ("float64", 1))
    x, r = randn((4, 12), np.float64, 1), randn((4, 12), np.float64, 2)
    w, b = randn((12,), np.float64, 3), randn((12,), np.float64, 4)
    (out,) = c(x, r, w, b)
    assert nkernels(c) <= 3, c.fused[0]
    assert_close(out, np_layernorm(x + r, 1e-5) * w + b, rtol=1e-12)


@pytest.mark.parametrize("keep_gelu", [True, False], ids=["gelu_output", "gelu_internal"])
def test_layernorm_of_gelu_computes_gelu_once(keep_gelu):
    """LayerNorm(GELU(x)) (the MLP block): three sweeps per row (mean, variance, normalize), all
    reading gelu(x). The first sweep writes it to an output buffer and the variance and final
    sweeps read it back, so no loop computes it twice and only the first sweep computes it. With
    gelu(x) an output it is written there; else the normalized output's buffer holds it until
    the final sweep overwrites it with the result."""

    def fn(g, x):
        y = g.call("gelu", x)
        n = layernorm_by_hand(g, y)
        return (y, n) if keep_gelu else n

    c = build(fn, ("float32", 2))
    x = randn((7, 300), np.float32, 11) * 2
    x[2, 5] = np.nan
    outs = c(x)
    y64 = np_gelu(x)
    assert_close(outs[-1], np_layernorm(y64, 1e-5).astype(np.float32), rtol=2e-5, atol=2e-5)
    if keep_gelu:
        assert_close(outs[0], y64.astype(np.float32), rtol=1e-6, atol=1e-7)
    (red,) = [k.source for k in c.kernels if "sweep 2" in k.source]
    sweeps = re.split(r"/\* (?:sweep \d+|final sweep)", red)[1:]
    assert len(sweeps) == 3, red
    calls = [sw.count("fc_gelu_f32(") for sw in sweeps]
    assert calls[0] >= 1 and calls[1:] == [0, 0], calls
    assert computed_once(c, "fc_gelu_f32")


# ---------------------------------------------------------------------------
# reductions with prologues and epilogues
# ---------------------------------------------------------------------------

REDUCTIONS = {
    # name: (builder, numpy reference, input ndim)
    "axis0_norm": (
        lambda g, x: g.call("sqrt", g.call("sum", g.call("square", x), axis=0)),
        lambda x: np.sqrt(np.sum(x * x, axis=0)),
        2,
    ),
    "mid_keep": (
        lambda g, x: g.call("exp", g.call("amax", g.call("abs", x), axis=1, keepdim=True)),
        lambda x: np.exp(np.max(np.abs(x), axis=1, keepdims=True)),
        3,
    ),
    "mid_nokeep": (
        lambda g, x: g.call("mul", g.call("amin", g.call("neg", x), axis=1), 3.0),
        lambda x: np.min(-x, axis=1) * 3.0,
        3,
    ),
    "axes02_nokeep": (
        lambda g, x: g.call("mul", g.call("sum", g.call("tanh", x), axis=(0, 2)), 2.0),
        lambda x: np.sum(np.tanh(x), axis=(0, 2)) * 2.0,
        3,
    ),
    "axes02_keep": (
        lambda g, x: g.call("sub", x, g.call("mean", x, axis=(0, -1), keepdim=True)),
        lambda x: x - np.mean(x, axis=(0, 2), keepdims=True),
        3,
    ),
    "all_axes": (lambda g, x: g.call("log", g.call("sum", g.call("exp", x))), lambda x: np.log(np.sum(np.exp(x))), 2),
    "last_keep_epilogue": (
        lambda g, x: g.call("div", x, g.call("sum", g.call("abs", x), axis=-1, keepdim=True)),
        lambda x: x / np.sum(np.abs(x), axis=-1, keepdims=True),
        2,
    ),
    "var_std": (
        lambda g, x: g.call("add", g.call("var", x, axis=1, correction=1), g.call("std", x, axis=1)),
        lambda x: np.var(x, axis=1, ddof=1) + np.std(x, axis=1),
        2,
    ),
    "argmax_prologue": (
        lambda g, x: g.call("argmax", g.call("abs", g.call("sub", x, 0.25)), axis=1),
        lambda x: np.argmax(np.abs(x - 0.25), axis=1),
        2,
    ),
    "prod_any": (
        lambda g, x: (g.call("prod", g.call("add", x, 1.0), axis=0), g.call("any", g.call("gt", x, 2.0), axis=0)),
        lambda x: (np.prod(x + 1.0, axis=0), np.any(x > 2.0, axis=0)),
        2,
    ),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_fused_with_prologue_and_epilogue(name):
    fn, ref, nd = REDUCTIONS[name]
    c = build(fn, ("float64", nd))
    shape = (5, 6, 7)[:nd]
    x = randn(shape, np.float64, 11)
    got = c(x)
    want = ref(x)
    if not isinstance(want, tuple):
        want = (want,)
    for gv, wv in zip(got, want):
        if gv.dtype == np.int64 or wv.dtype == np.intp:
            wv = wv.astype(gv.dtype)
        assert_close(gv, wv, rtol=1e-12)
    # a reduction with its pointwise producers and consumers is one kernel, and
    # so are sibling reductions over the same space (prod_any); var and std of
    # the same x are two reduction levels with many reductions: at most two
    assert nkernels(c) <= (2 if name == "var_std" else 1), c.fused[0]


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_strided_and_new_sizes(name):
    # the same compiled graph on a transposed, reversed input of other sizes
    fn, ref, nd = REDUCTIONS[name]
    c = _cached("red_" + name, fn, ("float64", nd))
    x = randn((4, 9, 3)[:nd], np.float64, 12)
    x = x[::-1].swapaxes(0, -1) if nd > 1 else x[::-1]
    got = c(x)
    want = ref(x)
    if not isinstance(want, tuple):
        want = (want,)
    for gv, wv in zip(got, want):
        if wv.dtype == np.intp:
            wv = wv.astype(gv.dtype)
        assert_close(gv, wv, rtol=1e-12)


def test_two_index_patterns_materialized():
    # x - x.sum(axis=1) for square x: the row sums are broadcast along the
    # *other* axis (out[i, j] = x[i, j] - rowsum[j]), so they cannot be read
    # in the reduction's kernel
    c = build(lambda g, x: g.call("sub", x, g.call("sum", x, axis=1)), ("float64", 2))
    x = randn((6, 6), np.float64, 13)
    (out,) = c(x)
    assert_close(out, x - x.sum(axis=1))
    assert nkernels(c) > 1, c.fused[0]
    assert "-> buffer" in c.fused[0].split("kernel 1:")[0]
    # new sizes reuse the plan and stay right
    x = randn((9, 9), np.float64, 14)
    (out,) = c(x)
    assert_close(out, x - x.sum(axis=1))
    assert c.nplans == 1


def test_reduction_result_broadcast_both_ways():
    # the column sums read along their own axis (x - x.sum(0)) and the row sums
    # read along the other one, in a single graph
    def fn(g, x):
        return g.call("add", g.call("sub", x, g.call("sum", x, axis=0)), g.call("amax", x, axis=1))

    c = build(fn, ("float64", 2))
    x = randn((5, 5), np.float64, 15)
    (out,) = c(x)
    assert_close(out, x - x.sum(0) + x.max(1))


def test_reduction_of_reduction():
    # max over rows of the per-row mean: two reduction levels
    def fn(g, x):
        return g.call("amax", g.call("mean", g.call("square", x), axis=1), axis=0)

    c = build(fn, ("float64", 3))
    x = randn((3, 4, 5), np.float64, 16)
    (out,) = c(x)
    assert_close(out, np.max(np.mean(x * x, axis=1), axis=0))
    assert len(c.kernels) <= 2, c.fused[0]


def test_long_chain_is_capped_and_right():
    # 300 ops in one chain: kernels are capped in size, the chain stays right
    g = Graph()
    x = g.input("float64", 1)
    v = x
    for i in range(300):
        v = g.call("sin", v) if i % 2 == 0 else g.call("add", g.call("mul", v, 0.999), 0.001)
    g.output(v)
    c = g.compile()
    a = np.linspace(-1.0, 1.0, 7)
    (out,) = c(a)
    want = a.copy()
    for i in range(300):
        want = np.sin(want) if i % 2 == 0 else want * 0.999 + 0.001
    assert_close(out, want, rtol=1e-13)
    texts = re.split(r"^kernel \d+:", c.fused[0], flags=re.M)[1:]
    nodes_per_kernel = [len(re.findall(r"^  %", k, re.M)) for k in texts]
    assert sum(nodes_per_kernel) == 450
    assert 1 < len(nodes_per_kernel) <= 8 and max(nodes_per_kernel) <= 128, nodes_per_kernel


def test_rank16_transposed_reversed():
    g = Graph()
    x = g.input("float64", 16)
    g.output(g.call("sum", g.call("exp", x), axis=(0, 3, 15)), g.call("amax", x, axis=-2, keepdim=True))
    c = g.compile()
    a = randn((2,) * 16, np.float64, 50).transpose(rng(51).permutation(16))[::-1, :, ::-1]
    s, m = c(a)
    assert_close(s, np.exp(a).sum(axis=(0, 3, 15)), rtol=1e-13)
    assert_close(m, a.max(axis=-2, keepdims=True))


@pytest.mark.parametrize("op", ["amax", "argmin"])
@pytest.mark.parametrize("shape,axis", [((3, 0), 1), ((0, 3), 0), ((0, 0), 0), ((0, 0), 1), ((2, 0, 0), 1)])
def test_no_identity_reduction_over_empty_axis_raises(op, shape, axis):
    # NumPy raises for a 0-size reduced axis even where the result is empty
    x = np.ones(shape)
    with pytest.raises(ValueError):
        {"amax": np.max, "argmin": np.argmin}[op](x, axis=axis)
    c = build(lambda g, v: g.call(op, v, axis=axis), ("float64", len(shape)))
    with pytest.raises(ValueError):
        c(x)


# ---------------------------------------------------------------------------
# multi-output kernels
# ---------------------------------------------------------------------------


def test_intermediate_output_written_by_same_kernel():
    def fn(g, x):
        t = g.call("tanh", x)
        return t, g.call("mul", g.call("add", t, 1.0), x)

    c = build(fn, ("float32", 2))
    x = randn((4, 6), np.float32, 17)
    t, out = c(x)
    assert nkernels(c) == 1, c.fused[0]
    assert c.fused[0].count("-> buffer") == 2
    assert computed_once(c, "fc_tanh_f32")
    assert_close(t, np.tanh(x), rtol=1e-6)
    assert_close(out, (np.tanh(x) + 1) * x, rtol=1e-6)


def test_intermediate_output_of_reduction_kernel():
    def fn(g, x):
        t = g.call("tanh", x)
        return t, g.call("sum", g.call("exp", t), axis=-1)

    c = build(fn, ("float64", 2))
    x = randn((3, 11), np.float64, 18)
    t, s = c(x)
    assert nkernels(c) == 1, c.fused[0]
    assert c.fused[0].count("-> buffer") == 2
    assert_close(t, np.tanh(x))
    assert_close(s, np.exp(np.tanh(x)).sum(-1), rtol=1e-13)


def test_softmax_with_max_and_sum_outputs():
    # the row max and the normalizer are outputs too: still one plan, all right
    def fn(g, x):
        m = g.call("amax", x, axis=-1, keepdim=True)
        e = g.call("exp", g.call("sub", x, m))
        s = g.call("sum", e, axis=-1, keepdim=True)
        return g.call("div", e, s), m, s

    c = build(fn, ("float64", 2))
    x = randn((5, 8), np.float64, 19)
    p, m, s = c(x)
    assert nkernels(c) <= 2, c.fused[0]
    assert_close(m, x.max(-1, keepdims=True))
    assert_close(s, np.exp(x - m).sum(-1, keepdims=True), rtol=1e-13)
    assert_close(p, np_softmax(x), rtol=1e-13)


def test_outputs_input_constant_and_duplicates():
    def fn(g, x):
        y = g.call("neg", x)
        return y, x, y, g.constant(2.5)

    c = build(fn, ("float64", 1))
    x = np.arange(4.0)
    y1, xi, y2, k = c(x)
    assert_close(y1, -x)
    assert_close(y2, -x)
    np.testing.assert_array_equal(xi, x)
    assert k.shape == () and float(k) == 2.5
    assert len(c.kernels) == 1


# ---------------------------------------------------------------------------
# externs
# ---------------------------------------------------------------------------


def test_extern_matmul_between_pointwise_ops():
    def fn(g, a, b, bias):
        h = g.extern(np.matmul, g.call("exp", a), g.call("mul", b, 2.0))
        return g.call("relu", g.call("add", h, bias))

    c = build(fn, ("float64", 2), ("float64", 2), ("float64", 1))
    a, b = randn((3, 4), np.float64, 20), randn((4, 5), np.float64, 21)
    bias = randn((5,), np.float64, 24)
    (out,) = c(a, b, bias)
    assert_close(out, np.maximum(np.exp(a) @ (b * 2.0) + bias, 0.0), rtol=1e-12)
    assert c.nplans == 2  # the segments before and after the extern
    assert len(c.kernels) <= 3, c.fused  # exp and b*2 (before), add+relu (after)
    assert len(c.fused) == 2  # one text per plan, by segment
    before, after = c.fused
    assert "exp(" in before and "relu(" not in before
    assert "relu(" in after and "exp(" not in after
    assert len(re.findall(r"^kernel \d+:", after, re.M)) == 1  # add and relu fused
    # a new batch size: no new plan
    a, b, bias = randn((7, 2), np.float64, 22), randn((2, 3), np.float64, 23), randn((3,), np.float64, 25)
    (out,) = c(a, b, bias)
    assert_close(out, np.maximum(np.exp(a) @ (b * 2.0) + bias, 0.0), rtol=1e-12)
    assert c.nplans == 2


def test_constant_after_extern():
    # the constant is read by the segment after the extern: it keeps its value and type
    g = Graph()
    a = g.input("float64", 1)
    h = g.extern(np.negative, g.call("mul", a, 2.0))
    g.output(g.call("add", h, -3.0))
    c = g.compile()
    (out,) = c(np.array([1.0, 2.0]))
    assert_close(out, np.array([-5.0, -7.0]))


def test_strong_constant_after_extern():
    g = Graph()
    a = g.input("float32", 1)
    h = g.extern(np.negative, a)
    g.output(g.call("mul", h, np.float64(0.1)), g.call("add", g.call("cast", h, dtype="int8"), np.int16(300)))
    c = g.compile()
    x = np.array([1.0, -2.0], np.float32)
    p, q = c(x)
    assert_close(p, -x * np.float64(0.1))
    assert_close(q, (-x).astype(np.int8) + np.int16(300))


def test_extern_divmod_nout2():
    def fn(g, a, b):
        q, r = g.extern(np.divmod, g.call("abs", a), b, nout=2)
        return g.call("add", g.call("mul", q, b), r), q

    c = build(fn, ("float64", 1), ("float64", 1))
    a = np.array([-7.0, 7.5, 3.0, 0.0, -1.25])
    b = np.array([2.0, 2.0, -4.0, 3.0, 0.5])
    s, q = c(a, b)
    wq, wr = np.divmod(np.abs(a), b)
    assert_close(q, wq)
    assert_close(s, wq * b + wr)


def test_extern_wrong_nout_raises():
    g = Graph()
    a = g.input("float64", 1)
    q, r = g.extern(lambda x: (x, x, x), a, nout=2)
    g.output(g.call("add", q, r))
    c = g.compile()
    with pytest.raises(ValueError, match="nout=2"):
        c(np.ones(3))


def test_extern_scalar_results_become_arrays():
    def fn(g, a):
        s = g.extern(lambda x: float(x.sum()), a)  # a Python float
        n = g.extern(lambda x: np.float32(x.max()), a)  # a NumPy scalar
        return s, n, g.call("add", g.call("mul", a, n), s)

    c = build(fn, ("float32", 1))
    a = np.array([1.0, 2.0, 4.0], np.float32)
    s, n, out = c(a)
    assert isinstance(s, np.ndarray) and s.shape == () and s.dtype == np.float64 and s == 7.0
    assert isinstance(n, np.ndarray) and n.shape == () and n.dtype == np.float32 and n == 4.0
    # float32 array * float32 0-d array + float64 0-d array: NumPy gives float64
    assert_close(out, a * np.asarray(np.float32(4.0)) + np.asarray(7.0))


def test_extern_exception_propagates():
    def boom(x):
        raise KeyError("from the extern")

    g = Graph()
    a = g.input("float64", 1)
    g.output(g.call("exp", g.extern(boom, g.call("neg", a))))
    c = g.compile()
    with pytest.raises(KeyError, match="from the extern"):
        c(np.ones(3))


def test_extern_result_changes_dtype_and_rank_new_plan():
    mode = {"dtype": np.float64, "rank": 1}

    def shaper(x):
        y = x.astype(mode["dtype"])
        return y.reshape((1,) * (mode["rank"] - 1) + y.shape)

    g = Graph()
    a = g.input("float64", 1)
    g.output(g.call("neg", g.call("square", g.extern(shaper, a))))
    c = g.compile()
    x = np.arange(5.0)
    (out,) = c(x)
    assert_close(out, -(x * x))
    n = c.nplans
    mode["dtype"] = np.float32
    (out,) = c(x)
    assert_close(out, -(x * x).astype(np.float32))
    assert c.nplans == n + 1
    mode["rank"] = 3
    (out,) = c(x)
    assert_close(out, -(x * x).astype(np.float32).reshape(1, 1, 5))
    assert c.nplans == n + 2
    # back to a float64 vector: that plan is found again
    mode["dtype"], mode["rank"] = np.float64, 1
    (out,) = c(x)
    assert_close(out, -(x * x))
    assert c.nplans == n + 2


# ---------------------------------------------------------------------------
# large inputs: the OpenMP paths (serial below 32768 elements)
# ---------------------------------------------------------------------------


@pytest.fixture(params=[0, 1, 3], ids=["threads_default", "threads_1", "threads_3"])
def nthreads(request):
    old = fastcompile.config.get("num_threads")
    fastcompile.config.set(num_threads=request.param)
    yield request.param
    fastcompile.config.set(num_threads=old)


def test_large_pointwise(nthreads):
    c = _cached("silu_y", silu_times, ("float32", 2), ("float32", 2))
    x, y = randn((1000, 1024), np.float32, 30), randn((1000, 1024), np.float32, 31)
    x[::97, ::13] = np.nan
    with np.errstate(all="ignore"):
        (out,) = c(x, y)
        x64 = x.astype(np.float64)
        want = (x64 / (1 + np.exp(-x64)) * y).astype(np.float32)
    assert_close(out, want, rtol=1e-5)


@functools.lru_cache(maxsize=None)
def _large_strided_gelu_case():
    base = randn((2100, 1100), np.float32, 32)
    x = base[::-2, 5:].T  # negative, sliced and transposed
    return x, np_gelu(x)


def test_large_pointwise_strided(nthreads):
    c = _cached("gelu_chain", gelu_primitives_chain, ("float32", 2))
    x, want = _large_strided_gelu_case()
    assert x.size >= 1_000_000 and not x.flags.c_contiguous and x.strides[1] < 0
    (out,) = c(x)
    assert_close(out, want, rtol=1e-5)


@pytest.mark.parametrize(
    "shape", [(1, 1_200_000), (3, 400_000), (200_000, 7)], ids=["one_row", "few_rows_split", "many_short_rows"]
)
def test_large_softmax(nthreads, shape):
    c = _cached("softmax_op", softmax_op, ("float32", 2))
    x = randn(shape, np.float32, 33) * 3
    x[0, ::1001] = -np.inf
    if shape[0] > 2:
        x[2, 5] = np.nan
    with np.errstate(all="ignore"):
        (out,) = c(x)
    assert_close(out, np_softmax(x), rtol=2e-5)


@pytest.mark.parametrize(
    "shape", [(2, 600_000), (3, 5, 80_000), (150_000, 9)], ids=["few_rows_split", "few_rows_3d", "many_short_rows"]
)
def test_large_sum_last_axis(nthreads, shape):
    c = _cached("red_last_keep_epilogue", REDUCTIONS["last_keep_epilogue"][0], ("float64", 2))
    x = randn((shape[0], int(np.prod(shape[1:]))), np.float64, 34)
    (out,) = c(x)
    assert_close(out, x / np.sum(np.abs(x), axis=-1, keepdims=True), rtol=1e-12)


@pytest.mark.parametrize("shape", [(1_000_000, 3), (400, 3000)], ids=["axis0_few_cols", "axis0_many_cols"])
def test_large_sum_axis0(nthreads, shape):
    c = _cached("red_axis0_norm", REDUCTIONS["axis0_norm"][0], ("float64", 2))
    x = randn(shape, np.float64, 35)
    (out,) = c(x)
    assert_close(out, np.sqrt(np.sum(x * x, axis=0)), rtol=1e-11)


def test_large_layernorm_and_argmax(nthreads):
    c = _cached("layernorm", layernorm_by_hand, ("float32", 2))
    x = randn((3, 500_000), np.float32, 36) + 2
    (out,) = c(x)
    assert_close(out, np_layernorm(x, 1e-5), rtol=1e-4, atol=1e-4)
    c = _cached("red_argmax_prologue", REDUCTIONS["argmax_prologue"][0], ("float64", 2))
    x = randn((2, 700_000), np.float64, 37)
    x[1, 123_456] = 99.0
    x[1, 654_321] = 99.0  # a tie: the first index wins
    (out,) = c(x)
    np.testing.assert_array_equal(out, np.argmax(np.abs(x - 0.25), axis=1))
    assert out[1] == 123_456


def test_large_full_reduction(nthreads):
    c = _cached("red_all_axes", REDUCTIONS["all_axes"][0], ("float64", 2))
    x = randn((1100, 1000), np.float64, 38) * 0.1
    (out,) = c(x)
    assert_close(out, np.log(np.sum(np.exp(x))), rtol=1e-12)


@pytest.fixture
def parallel_always():
    """Every kernel takes its OpenMP path, even on a handful of elements."""
    old = fastcompile.config.get("serial_below"), fastcompile.config.get("num_threads")
    fastcompile.config.set(serial_below=1, num_threads=3)
    yield
    fastcompile.config.set(serial_below=old[0], num_threads=old[1])


@pytest.mark.parametrize("shape", [(1, 5), (2, 17), (3, 40), (5, 3), (7, 33), (0, 5), (4, 0)])
def test_parallel_paths_on_small_inputs(parallel_always, shape):
    # threads get empty or partial 16-element chunks; rows are split across
    # threads (n_outer < 2 * threads) or owned by them
    x = randn(shape, np.float32, 39) * 3
    if x.size:
        x.flat[::7] = -np.inf
    with np.errstate(all="ignore"):
        (out,) = _cached("softmax_op", softmax_op, ("float32", 2))(x)
        assert_close(out, np_softmax(x), rtol=1e-5)
        x64 = randn(shape, np.float64, 40)
        (out,) = _cached("red_last_keep_epilogue", REDUCTIONS["last_keep_epilogue"][0], ("float64", 2))(x64)
        assert_close(out, x64 / np.sum(np.abs(x64), axis=-1, keepdims=True), rtol=1e-12)
        (out,) = _cached("red_axis0_norm", REDUCTIONS["axis0_norm"][0], ("float64", 2))(x64)
        assert_close(out, np.sqrt(np.sum(x64 * x64, axis=0)), rtol=1e-12)
        (out,) = _cached("silu_y", silu_times, ("float32", 2), ("float32", 2))(x, x)
        x64 = x.astype(np.float64)
        assert_close(out, (x64 / (1 + np.exp(-x64)) * x64).astype(np.float32), rtol=1e-5)


# ---------------------------------------------------------------------------
# specialization: what makes a new plan
# ---------------------------------------------------------------------------


def _spec_graph():
    return build(lambda g, x, y: g.call("add", g.call("mul", x, y), 1.0), ("float64", 2), ("float64", 2))


def test_new_sizes_make_no_new_plan():
    c = _spec_graph()
    x, y = randn((3, 4), np.float64, 40), randn((3, 4), np.float64, 41)
    assert_close(c(x, y)[0], x * y + 1)
    nplans, compiles, nk = c.nplans, fastcompile.stats()["compiles"], len(c.kernels)
    for shape in [(5, 7), (100, 3), (2, 50_000), (0, 3), (3, 0)]:
        x, y = randn(shape, np.float64, 42), randn(shape, np.float64, 43)
        assert_close(c(x, y)[0], x * y + 1)
    # broadcasting the same way (no size-1 dims) on new sizes
    assert c.nplans == nplans
    assert len(c.kernels) == nk
    assert fastcompile.stats()["compiles"] == compiles


def test_size1_dim_transpose_make_new_plans():
    c = _spec_graph()
    x, y = randn((3, 4), np.float64, 44), randn((3, 4), np.float64, 45)
    c(x, y)
    n = c.nplans
    # a size-1 dim broadcasts: new key
    y1 = randn((1, 4), np.float64, 46)
    assert_close(c(x, y1)[0], x * y1 + 1)
    assert c.nplans == n + 1
    # the same size-1 pattern at other sizes: no new plan
    x2, y2 = randn((8, 2), np.float64, 47), randn((1, 2), np.float64, 48)
    assert_close(c(x2, y2)[0], x2 * y2 + 1)
    assert c.nplans == n + 1
    # a transposed input: new contiguity class
    xt = randn((4, 3), np.float64, 49).T
    assert_close(c(xt, y)[0], xt * y + 1)
    assert c.nplans == n + 2
    # back to the first key: found again, nothing built
    compiles = fastcompile.stats()["compiles"]
    assert_close(c(x, y)[0], x * y + 1)
    assert c.nplans == n + 2
    assert fastcompile.stats()["compiles"] == compiles


def test_fused_text_lists_each_plan():
    c = _spec_graph()
    c(np.ones((2, 2)), np.ones((2, 2)))
    c(np.ones((2, 2)), np.ones((1, 2)))
    assert c.nplans == 2
    assert len(c.fused) == 2
    for text in c.fused:
        assert text.startswith("kernel 0:")
    for k in c.kernels:
        assert k.name.startswith("fc_") and k.name in k.source
        assert k.fused in c.fused
        assert isinstance(k.path, str) and isinstance(k.so_path, str) and k.key


def test_run_with_an_operand_broadcast_along_it_stays_vectorized():
    """x + b with b of shape (n, 1): b is constant along each run, so the fast version
    of the run reads b[0] (checked at run time: stride 0) instead of the scalar one."""
    g = Graph()
    x, b = g.input("float32", 2), g.input("float32", 2)
    g.output(g.call("mul", g.call("add", x, b), 2.0))
    c = g.compile()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    bb = np.array([[1.0], [2.0], [3.0]], np.float32)
    np.testing.assert_array_equal(c(a, bb)[0], (a + bb) * 2)
    src = c.kernels[0].source
    assert "== 0) {" in src and "[0];" in src, src
    # the same compiled kernel on a layout where the check fails takes the general version
    np.testing.assert_array_equal(c(a.T.copy().T, bb)[0], (a + bb) * 2)
    wide = np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]
    np.testing.assert_array_equal(c(wide, bb)[0], (wide + bb) * 2)


def test_expanded_operand_is_read_once_per_run():
    """An expanded view (stride 0 in its last dim, as torch's expand and
    np.broadcast_to make) is broadcast along the run like a size-1 dim: the
    key records the zero stride, and the fast version reads p[0] for it. The
    masks of unbind's backward, where(arange(3).view(3, 1, 1).expand(3, n, m) == k, g, 0),
    are this shape."""
    g = Graph()
    idx, gr = g.input("int64", 3), g.input("float32", 2)
    g.output(g.call("where", g.call("eq", idx, 1), gr, 0.0))
    c = g.compile()
    rng = np.random.default_rng(0)
    gg = rng.standard_normal((50, 300), dtype=np.float32)
    gg[3, 7] = np.nan
    ar = np.broadcast_to(np.arange(3).reshape(3, 1, 1), (3, 50, 300))
    (got,) = c(ar, gg)
    assert np.array_equal(got, np.where(ar == 1, gg, np.float32(0)), equal_nan=True)
    src = c.kernels[0].source
    # the expanded int64 operand is p1; the output p0 and the gradient p2 are unit-stride
    assert "s1 == 0" in src and "p1[0]" in src, src
    # a strided (not expanded) index array is another key: the general version, still correct
    strided = np.arange(3 * 50 * 600).reshape(3, 50, 600)[:, :, ::2] % 3
    (got2,) = c(strided, gg)
    assert c.nplans == 2
    assert np.array_equal(got2, np.where(strided == 1, gg, np.float32(0)), equal_nan=True)


# ---------------------------------------------------------------------------
# common subexpressions (fc_graph_cse, on the compiled copy of the graph)
# ---------------------------------------------------------------------------


def _ops_in(c, name):
    return sum(len(re.findall(r"= %s\(" % name, f)) for f in c.fused)


def test_cse_equal_work_is_done_once():
    """The same op on the same inputs, written twice (a decomposition's mean and the mean a
    layer norm asks for separately): computed once, in the fused plan and in the C."""
    g = Graph()
    x = g.input("float32", 2)
    m1 = g.call("mean", x, axis=-1, keepdims=True)
    v = g.call("var", x, axis=-1, keepdims=True)  # computes its own mean of x
    m2 = g.call("mean", x, axis=-1, keepdims=True)
    e1, e2 = g.call("exp", x), g.call("exp", x)
    g.output(g.call("add", g.call("sub", e1, m1), g.call("mul", e2, g.call("add", m2, v))))
    c = g.compile()
    a = np.random.default_rng(4).standard_normal((7, 33), dtype=np.float32)
    (got,) = c(a)
    m, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
    assert_close(got, (np.exp(a) - m) + np.exp(a) * (m + var), rtol=2e-5)
    assert _ops_in(c, "exp") == 1, c.fused
    assert _ops_in(c, "sum") == 2, c.fused  # the mean's sum and var's squared deviations
    assert _ops_in(c, "rcount") == 1, c.fused
    assert len(c.kernels) == 1 and c.kernels[0].source.count("acc") > 0
    assert len(re.findall(r"double acc\d+ = 0;", c.kernels[0].source)) == 2


def test_cse_keeps_what_differs():
    """Nodes that differ in an input, an attribute, a cast target or a constant's bits stay apart:
    x + 0.0 and x + -0.0 differ at x = -0.0; sums over different axes, or with and without
    keepdims; casts to different dtypes."""
    g = Graph()
    x = g.input("float32", 2)
    outs = [
        g.call("add", x, 0.0),
        g.call("add", x, -0.0),
        g.call("sum", x, axis=0),
        g.call("sum", x, axis=1),
        g.call("sum", x, axis=1, keepdims=True),
        g.call("cast", x, dtype="float64"),
        g.call("cast", x, dtype="int32"),
    ]
    g.output(*[g.call("neg", o) for o in outs])  # readers: outputs themselves never merge
    c = g.compile()
    a = np.array([[-0.0, 1.5, -2.25], [3.0, -0.0, 0.5]], np.float32)
    got = [-v for v in c(a)]
    want = [
        a + np.float32(0.0),
        a + np.float32(-0.0),
        a.sum(0),
        a.sum(1),
        a.sum(1, keepdims=True),
        a.astype(np.float64),
        a.astype(np.int32),
    ]
    for gv, wv in zip(got, want):
        assert_close(gv, wv)
    assert np.signbit(got[0]).tolist() == [[False, False, True], [False, False, False]]
    assert np.signbit(got[1]).tolist() == np.signbit(a).tolist()
    assert _ops_in(c, "sum") == 3, c.fused


def test_cse_outputs_stay_separate_arrays():
    """Two outputs of equal work are two arrays, as NumPy would return: writing one leaves the
    other alone."""
    g = Graph()
    x = g.input("float32", 1)
    g.output(g.call("exp", x), g.call("exp", x))
    c = g.compile()
    a = np.linspace(-1, 1, 50, dtype=np.float32)
    p, q = c(a)
    assert not np.shares_memory(p, q)
    p[:] = 0
    assert_close(q, np.exp(a))


def test_cse_never_merges_externs_nor_redirects_their_arguments():
    """Extern calls run as often as written, pure ones too (each call's result depends on how
    many ran before); and an extern gets its own argument array even when an equal one feeds
    another extern: one that writes its argument in place leaves the other's alone."""
    calls = []

    def f(v):
        calls.append(1)
        return v + len(calls)

    def bump(v):
        v += 1
        return v

    g = Graph()
    x = g.input("float32", 1)
    y1, y2 = g.extern(f, g.call("exp", x), pure=True), g.extern(f, g.call("exp", x), pure=True)
    z1, z2 = g.extern(bump, g.call("exp", x)), g.extern(bump, g.call("exp", x))
    g.output(g.call("add", y1, y2), z1, z2)
    a = np.arange(5, dtype=np.float32)
    got, w1, w2 = g.compile()(a)
    assert calls == [1, 1]
    assert_close(got, 2 * np.exp(a) + 3)
    assert_close(w1, np.exp(a) + 1)
    assert_close(w2, np.exp(a) + 1)
    assert not np.shares_memory(w1, w2)


def test_cse_does_not_move_work_across_an_extern():
    """exp(x) read before an extern and again after it: merging the two would store exp(x) in the
    first segment and read it back in the second; each segment computes its own instead."""
    g = Graph()
    x = g.input("float32", 2)
    s = g.call("sum", g.call("exp", x), axis=-1, keepdims=True)
    y = g.extern(lambda v: v * 0.5, s)
    g.output(g.call("mul", g.call("exp", x), y))
    c = g.compile()
    a = np.random.default_rng(5).standard_normal((6, 9), dtype=np.float32)
    (got,) = c(a)
    assert_close(got, np.exp(a) * (np.exp(a).sum(-1, keepdims=True) * 0.5))
    assert c.nplans == 2 and _ops_in(c, "exp") == 2, c.fused
    assert not re.search(r"= exp\([^\n]*-> buffer", "".join(c.fused)), c.fused


def test_cse_leaves_the_graph_alone():
    """Merging happens on the compiled copy: the Graph keeps its nodes and compiles again after
    it grows."""
    g = Graph()
    x = g.input("float32", 1)
    g.output(g.call("add", g.call("exp", x), g.call("exp", x)))
    a = np.arange(5, dtype=np.float32)
    assert_close(g.compile()(a)[0], 2 * np.exp(a))
    g.output(g.call("mul", g.call("exp", x), g.call("exp", x)))
    got = g.compile()(a)
    assert_close(got[-1], np.exp(a) ** 2)
