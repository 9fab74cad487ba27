"""Reductions in every loop order the runtime picks: rows owned by a thread,
rows shared by all threads (few long rows), and column blocks (reduced with a
stride while outer neighbours are adjacent, e.g. sum over axis 0)."""

import re

import numpy as np
import pytest
import fastcompile

from fastcompile.graph import Graph

from conftest import assert_close_np

REFS = {
    "sum": lambda x, ax, kd: np.sum(x, axis=ax, keepdims=kd, dtype=np.float64).astype(x.dtype),
    "mean": lambda x, ax, kd: np.mean(x, axis=ax, keepdims=kd, dtype=np.float64).astype(x.dtype),
    "amax": lambda x, ax, kd: np.max(x, axis=ax, keepdims=kd),
    "amin": lambda x, ax, kd: np.min(x, axis=ax, keepdims=kd),
    "any": lambda x, ax, kd: np.any(x, axis=ax, keepdims=kd),
    "prod": lambda x, ax, kd: np.prod(x, axis=ax, keepdims=kd, dtype=np.float64).astype(x.dtype),
}

SHAPES = [
    ((300, 70), 0),  # column blocks, a partial block at the end
    ((5, 130, 9), (0, 1)),  # two reduced leading axes, short outer rows
    ((64, 3, 40), 0),  # outer rows of 3*40 with blocks crossing row ends
    ((2, 200000), 1),  # few long rows: threads share each row
    ((40000, 3), 1),  # many short rows
    ((3, 40000), 0),  # column blocks over a long outer dim (threaded)
]


@pytest.mark.parametrize("op", sorted(REFS))
@pytest.mark.parametrize("shape,axis", SHAPES)
def test_reduction_loop_orders(op, shape, axis):
    rng = np.random.default_rng(abs(hash((op, shape))) % 2**32)
    x = (rng.standard_normal(shape) * 0.5 + (1.0 if op == "prod" else 0.0)).astype(np.float32)
    if op == "prod":
        x = np.clip(x, 0.98, 1.02).astype(np.float32)
    x.flat[7] = np.nan  # one NaN, found by position in the result
    for keepdim in (False, True):
        g = Graph()
        a = g.input("float32", len(shape))
        g.output(g.call(op, a, axis=axis, keepdim=keepdim))
        (got,) = g.compile()(x)
        expected = REFS[op](x, axis, keepdim)
        assert_close_np(got, expected, rtol=1e-5 if op != "prod" else 1e-4, atol=1e-5)


def test_column_reduction_with_prologue_and_epilogue():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1000, 100)).astype(np.float64)
    w = rng.standard_normal((1000, 1)).astype(np.float64)
    g = Graph()
    a, b = g.input("float64", 2), g.input("float64", 2)
    s = g.call("sum", g.call("mul", g.call("exp", a), b), axis=0, keepdim=True)
    g.output(g.call("log", g.call("add", s, 1.0)), g.call("amax", a, axis=0))
    f = g.compile()
    got_s, got_m = f(x, w)
    with np.errstate(invalid="ignore"):  # log of negative sums: NaN at the same places
        expected = np.log((np.exp(x) * w).sum(0, keepdims=True) + 1.0)
    np.testing.assert_allclose(got_s, expected, rtol=1e-12)
    np.testing.assert_array_equal(got_m, x.max(0))
    # the same plan on a transposed view runs the row loop order instead
    got_s2, _ = f(np.ascontiguousarray(x.T).T, w)
    np.testing.assert_allclose(got_s2, got_s, rtol=1e-12)


@pytest.mark.parametrize("shape", [(512, 300), (9, 1000), (3, 70, 130)], ids=str)
def test_column_reduction_that_also_writes_full_size_values(shape):
    """A backward's shape: y = g * x is an output and is also summed over the batch (a weight's
    gradient): the column-block version stores y in the reduction's sweep. z = x - mean(x, 0)
    needs the reduction first (a second walk of each block's rows). Both against NumPy, in
    both layouts of x."""
    rng = np.random.default_rng(len(shape))
    gx = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[11] = np.nan
    g = Graph()
    a, b = g.input("float32", len(shape)), g.input("float32", len(shape))
    y = g.call("mul", a, b)
    g.output(y, g.call("sum", y, axis=0))
    f = g.compile()
    g2 = Graph()
    b2 = g2.input("float32", len(shape))
    g2.output(g2.call("sub", b2, g2.call("mean", b2, axis=0, keepdim=True)))
    f2 = g2.compile()
    for xs in (x, np.asfortranarray(x)):
        got_y, got_s = f(gx, xs)
        want_y = gx * x
        assert np.array_equal(got_y, want_y, equal_nan=True)
        assert_close_np(got_s, want_y.astype(np.float64).sum(0).astype(np.float32), rtol=1e-5, atol=1e-4)
        (got_z,) = f2(xs)
        assert_close_np(
            got_z,
            (x.astype(np.float64) - x.astype(np.float64).mean(0, keepdims=True)).astype(np.float32),
            rtol=1e-5,
            atol=1e-5,
        )
    assert any("_cols(" in k.source for k in f.kernels)  # the column-block version exists
    # z needs the mean first: column blocks with two walks of the rows (the mean's, then z's)
    assert all("_cols(" in k.source and "final sweep" in k.source for k in f2.kernels)
    for col in [k.source for k in f.kernels if "_cols(" in k.source]:  # (a plan per layout)
        # rows ahead prefetched: g and x for reading, y (stored in the sweep) for writing
        ahead = re.findall(r"__builtin_prefetch\(p\d+ \+ \(i \+ FC_COLS_AHEAD\) \* s\d+ \+ b, ([01])\)", col)
        assert sorted(ahead) == ["0", "0", "1"], col


MULTI_SHAPES = [(512, 300), (9, 1000), (3, 70, 130), (1000, 8), (70, 3, 40)]


@pytest.mark.parametrize("shape", MULTI_SHAPES)
def test_column_blocks_with_several_sweeps(shape):
    """Reductions over the batch whose results feed more reductions and full-size results,
    as BatchNorm's training forward and backward over (N, C): column blocks walk each
    block's rows once per reduction level, then once more for the results. Softmax over
    axis 0 adds max's NaN flag. Against NumPy in float64, with a NaN and an inf, in C and F
    order (F order: the rows' version) and with axes (0, 1) of a 3-d input."""
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    gy = rng.standard_normal(shape).astype(np.float32)
    x.flat[13] = np.nan
    x.flat[-5] = np.inf
    axes = (0, 1) if len(shape) == 3 and shape[1] == 3 else 0

    g = Graph()  # BatchNorm forward: mean, var, normalize
    a = g.input("float32", len(shape))
    d = g.call("sub", a, g.call("mean", a, axis=axes, keepdim=True))
    var = g.call("mean", g.call("mul", d, d), axis=axes, keepdim=True)
    rstd = g.call("rsqrt", g.call("add", var, 1e-5))
    g.output(g.call("mul", d, rstd), rstd)
    fwd = g.compile()

    g = Graph()  # its backward: dx from gy, xhat, rstd
    xh, gr, rs = (g.input("float32", len(shape)) for _ in range(3))
    m1 = g.call("mean", gr, axis=axes, keepdim=True)
    m2 = g.call("mean", g.call("mul", gr, xh), axis=axes, keepdim=True)
    g.output(
        g.call("mul", g.call("sub", g.call("sub", gr, m1), g.call("mul", xh, m2)), rs), g.call("sum", gr, axis=axes)
    )
    bwd = g.compile()

    g = Graph()  # softmax over the batch
    a = g.input("float32", len(shape))
    g.output(g.call("softmax", a, axis=0))
    smax = g.compile()

    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        d64 = x64 - x64.mean(axis=axes, keepdims=True)
        r64 = 1 / np.sqrt((d64 * d64).mean(axis=axes, keepdims=True) + 1e-5)
        want_z = d64 * r64
        e = np.exp(x64 - x64.max(axis=0, keepdims=True))
        want_s = e / e.sum(axis=0, keepdims=True)
    xh64 = np.where(np.isfinite(want_z), want_z, 0.5)
    rs64 = np.where(np.isfinite(r64), r64, 2.0) * np.ones(shape)
    g64 = gy.astype(np.float64)
    want_dx = (g64 - g64.mean(axis=axes, keepdims=True) - xh64 * (g64 * xh64).mean(axis=axes, keepdims=True)) * rs64
    for order in ("C", "F"):
        xs = np.asarray(x, order=order)
        z, r = fwd(xs)
        assert_close_np(z, want_z.astype(np.float32), rtol=1e-4, atol=1e-5)
        assert_close_np(r, r64.astype(np.float32), rtol=1e-4, atol=1e-6)
        (sm,) = smax(xs)
        assert_close_np(sm, want_s.astype(np.float32), rtol=1e-5, atol=1e-7)
        dx, db = bwd(*(np.asarray(v.astype(np.float32), order=order) for v in (xh64, gy, rs64)))
        assert_close_np(dx, want_dx.astype(np.float32), rtol=1e-4, atol=1e-5)
        assert_close_np(db, g64.sum(axis=axes).astype(np.float32), rtol=1e-5, atol=1e-4)
    for f, sweeps in ((fwd, 2), (bwd, 1), (smax, 2)):
        cols = [k.source for k in f.kernels if "_cols(" in k.source]  # (a plan per layout)
        assert cols
        for k in cols:
            body = k[k.index("_cols(") : k.index("_body(")]
            assert body.count("/* sweep ") == sweeps and "final sweep" in body, k


def test_several_sweeps_over_the_last_dim_of_c_order_skip_column_blocks():
    """Softmax over the last axis of a C-ordered array reduces unit-stride rows: the several-
    walk column-block version could never run there and is not written (compile time); an
    F-ordered input's plan has it (its rows are strided)."""
    g = Graph()
    a = g.input("float32", 2)
    g.output(g.call("softmax", a, axis=-1))
    f = g.compile()
    x = np.random.default_rng(5).standard_normal((40, 50)).astype(np.float32)
    for xs in (x, np.asfortranarray(x)):
        (got,) = f(xs)
        e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
        assert_close_np(got, (e / e.sum(-1, keepdims=True)).astype(np.float32), rtol=1e-5, atol=1e-7)
    assert len(f.kernels) == 2
    c_order, f_order = f.kernels
    assert "_cols(" not in c_order.source and "_cols(" in f_order.source


def test_layernorm_backward_reads_row_statistics_once_per_run():
    """LayerNorm's backward reads the forward's per-row mean and rstd, shape (n, 1): along a
    row's inner run (dx: sums over the row) and along a column block (dw, db: sums over the
    batch) they are constant. Both loop orders read them once per run instead of falling to
    the strided scalar loop; the results match NumPy (float64 reference, one NaN by position)."""
    import re

    rng = np.random.default_rng(5)
    n, d = 600, 192
    x = rng.standard_normal((n, d), dtype=np.float32)
    gy = rng.standard_normal((n, d), dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    gy[17, 3] = np.nan
    mu = x.mean(-1, keepdims=True)
    rs = (1 / np.sqrt(x.var(-1, keepdims=True) + 1e-5)).astype(np.float32)
    x64, gy64, w64 = x.astype(np.float64), gy.astype(np.float64), w.astype(np.float64)
    xh = (x64 - mu) * rs

    def inputs(g):
        return g.input("float32", 2), g.input("float32", 2), g.input("float32", 2), g.input("float32", 2)

    g = Graph()  # dx: two sums over each row, then the row
    a, m, r, gr = inputs(g)
    wt = g.input("float32", 1)
    xhat = g.call("mul", g.call("sub", a, m), r)
    gw = g.call("mul", gr, wt)
    s1 = g.call("sum", gw, axis=-1, keepdim=True)
    s2 = g.call("sum", g.call("mul", gw, xhat), axis=-1, keepdim=True)
    g.output(
        g.call(
            "mul",
            g.call("div", r, float(d)),
            g.call("sub", g.call("sub", g.call("mul", gw, float(d)), s1), g.call("mul", xhat, s2)),
        )
    )
    fdx = g.compile()
    (got_dx,) = fdx(x, mu, rs, gy, w)
    gw64 = gy64 * w64
    want_dx = rs / d * (d * gw64 - gw64.sum(-1, keepdims=True) - xh * (gw64 * xh).sum(-1, keepdims=True))
    assert_close_np(got_dx, want_dx.astype(np.float32), rtol=1e-4, atol=1e-5)
    assert np.isnan(got_dx[17]).all() and not np.isnan(got_dx[16]).any()

    g = Graph()  # dw, db: sums over the batch
    a, m, r, gr = inputs(g)
    g.output(g.call("sum", g.call("mul", gr, g.call("mul", g.call("sub", a, m), r)), axis=0), g.call("sum", gr, axis=0))
    fdw = g.compile()
    got_dw, got_db = fdw(x, mu, rs, gy)
    assert_close_np(got_dw, (gy64 * xh).sum(0).astype(np.float32), rtol=1e-4, atol=1e-4)
    assert_close_np(got_db, gy64.sum(0).astype(np.float32), rtol=1e-4, atol=1e-4)
    assert np.isnan(got_dw[3]) and np.isnan(got_db[3]) and not np.isnan(got_dw[2])

    (row,) = [k.source for k in fdx.kernels if "_rows(" in k.source]
    # mean (p4 or so) and rstd are read as p[0] in the unit-stride version of the inner run
    assert len(re.findall(r"= p\d+\[0\];", row)) >= 2, row
    (col,) = [k.source for k in fdw.kernels if "_cols(" in k.source]
    # column blocks take them with outer stride 0 (a non-zero operand mask), read once per row
    assert re.search(r"fc_use_cols\(L, 0x0*[1-9a-f][0-9a-f]*ULL\)", col), col
    assert re.search(r"= p\d+\[i \* s\d+\];", col), col
    # the block's rows FC_COLS_AHEAD ahead are prefetched (a row apart is more than a page,
    # which the hardware prefetchers do not cross), the streamed operands (x, gy) but not
    # mean and rstd, read once per row
    ahead = re.findall(r"__builtin_prefetch\(p(\d+) \+ \(i \+ FC_COLS_AHEAD\) \* s\d+ \+ b, 0\)", col)
    streamed = {m for m in re.findall(r"= p(\d+)\[i \* s\d+ \+ b\];", col)}
    assert ahead and set(ahead) == streamed and len(ahead) == 2, col


# ---------------------------------------------------------------------------
# lanes: a unit-stride run's whole blocks of FC_LANES (8 or 16: one vector of float32)
# accumulate in that many lanes, folded pairwise at the run's end; the last
# len % FC_LANES elements take the scalar loop. Sweeps with 8-byte values keep 8 lanes.
# ---------------------------------------------------------------------------

LANE_REFS = {
    "sum": lambda x, ax: np.sum(x, axis=ax, dtype=np.float64 if x.dtype.kind == "f" else None),
    "prod": lambda x, ax: np.prod(x, axis=ax, dtype=np.float64 if x.dtype.kind == "f" else None),
    "amax": lambda x, ax: np.max(x, axis=ax),
    "amin": lambda x, ax: np.min(x, axis=ax),
    "any": lambda x, ax: np.any(x, axis=ax),
    "all": lambda x, ax: np.all(x, axis=ax),
    "mean": lambda x, ax: np.mean(x, axis=ax, dtype=np.float64),
    "var": lambda x, ax: np.var(x, axis=ax, dtype=np.float64),
    "logsumexp": lambda x, ax: (
        np.log(np.sum(np.exp(x.astype(np.float64) - np.max(x, axis=ax, keepdims=True)), axis=ax))
        + np.max(x, axis=ax).astype(np.float64)
    ),
}
LANE_DTYPES = {
    "sum": ("float32", "float64", "float16", "int32", "uint8"),
    "prod": ("float32", "int64"),
    "amax": ("float32", "float64", "float16", "int16", "uint8"),
    "amin": ("float32", "int32"),
    "any": ("bool", "float32"),
    "all": ("bool", "int8"),
    "mean": ("float32",),
    "var": ("float32", "float64"),
    "logsumexp": ("float32",),
}


def _lane_input(dtype, shape, rng, op):
    if dtype == "bool":
        x = rng.random(shape) < (0.05 if op == "any" else 0.95)
    elif np.dtype(dtype).kind == "f":
        x = rng.standard_normal(shape)
        if op == "prod":
            x = 1.0 + 0.02 * x
    else:
        info = np.iinfo(dtype)
        hi = 3 if op == "prod" else min(int(info.max), 100)
        x = rng.integers(max(int(info.min), -hi) if op != "all" else 0, hi, size=shape, endpoint=True)
        if op == "prod":
            x = np.where(x == 0, 1, x)
    return np.asarray(x).astype(dtype)


@pytest.fixture(params=[8, 16], ids=lambda v: "lanes%d" % v)
def lanes(request):
    """FC_LANES forced through the compile line, so both lane counts run on any machine
    (kernels are built for 512-bit vectors only on AMD CPUs with AVX-512)."""
    fastcompile.config.set(cflags="-DFC_LANES=%d" % request.param)
    try:
        yield request.param
    finally:
        fastcompile.config.set(cflags="")


def _lane_decl(dtype, op):
    """The lane arrays' size in the source: 8 for 8-byte values; twice FC_LANES where a sweep
    sums float32 values (float16 computes in float32), in blocks; else FC_LANES."""
    if np.dtype(dtype).itemsize == 8:
        return "_l[8];"
    if np.dtype(dtype).kind == "f" and op in ("sum", "mean", "var", "logsumexp"):
        return "_l[(2 * FC_LANES)];"
    return "_l[FC_LANES];"


@pytest.mark.parametrize("op,dtype", [(op, dt) for op in LANE_REFS for dt in LANE_DTYPES[op]], ids=lambda v: str(v))
@pytest.mark.parametrize("n", [7, 8, 9, 15, 16, 17, 31, 33, 128, 131])
def test_lane_reductions_by_row_length(op, dtype, n, lanes):
    """Rows shorter than a lane block (scalar only), exactly whole blocks, and blocks plus a
    tail, for 8 and 16 lanes; 7 rows, so row ends fall anywhere in memory. NaN (floats) goes
    in a lane block of row 1 and in the tail of row 2; row 3 is all -inf and row 4 all +inf
    for amax/amin."""
    rng = np.random.default_rng(n * 7 + len(op))
    x = _lane_input(dtype, (7, n), rng, op)
    if np.dtype(dtype).kind == "f" and op not in ("prod",):
        x[1, min(5, n - 1)] = np.nan
        x[2, n - 1] = np.nan
        if op in ("amax", "amin"):
            x[3, :] = -np.inf
            x[4, :] = np.inf
    g = Graph()
    a = g.input(dtype, 2)
    g.output(g.call(op, a, axis=1))
    f = g.compile()
    (got,) = f(x)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = LANE_REFS[op](x, 1)
    if got.dtype.kind == "f":
        assert_close_np(
            got,
            ref.astype(got.dtype) if ref.dtype != np.float64 else ref,
            dtype=got.dtype,
            rtol=1e-5 if got.dtype == np.float32 else 1e-12,
            atol=1e-6,
        )
    else:
        np.testing.assert_array_equal(got, ref.astype(got.dtype))
    src = f.kernels[0].source
    assert _lane_decl(dtype, op) in src, "a unit-stride reduction kernel has lane arrays"


@pytest.mark.parametrize("op", ["sum", "amax", "var", "any"])
def test_lane_reductions_over_several_runs(op):
    """Inner space of two dims that do not collapse (a slice of the last axis): runs of 20
    (two lane blocks and a tail of 4), five runs per row, folded into one accumulator; also the
    transposed view (strided runs: the scalar loop only) and few long rows shared by threads."""
    rng = np.random.default_rng(11)
    base = rng.standard_normal((6, 5, 40)).astype(np.float32)
    base[2, 3, 17] = np.nan
    views = [base[:, :, :20], base.transpose(0, 2, 1)[:, :20, :]]
    if op == "any":
        views = [(v > 2.2) for v in views]
    g = Graph()
    a = g.input(views[0].dtype.name, 3)
    g.output(g.call(op, a, axis=(1, 2)))
    f = g.compile()
    for v in views:
        (got,) = f(v)
        ref = LANE_REFS[op](v, (1, 2))
        if got.dtype.kind == "f":
            assert_close_np(got, ref, dtype=got.dtype, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, ref)
    long = rng.standard_normal((2, 300001)).astype(np.float32)
    long[1, 123457] = np.nan
    if op == "any":
        long = long > 4.5
    g = Graph()
    a = g.input(long.dtype.name, 2)
    g.output(g.call(op, a, axis=1))
    (got,) = g.compile()(long)
    ref = LANE_REFS[op](long, 1)
    if got.dtype.kind == "f":
        assert_close_np(got, ref, dtype=got.dtype, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize(
    "case", ["f32_scaled", "f32_softmax", "f64_sum", "f64_cast_down", "f32_cast_up", "f32_above_f64_mean"]
)
def test_lane_count_follows_the_widest_value(case, lanes):
    """FC_LANES lanes where every value a sweep loads or computes is 4 bytes or less, 8 where
    one is 8 bytes (a float64 row mean that float32 values are compared with counts too);
    neither a Python-float constant nor the double accumulator of a float32 sum counts. The
    results stay right either way."""
    rng = np.random.default_rng(5)
    g = Graph()
    dt = "float64" if case.startswith("f64") else "float32"
    a = g.input(dt, 2)
    x = rng.standard_normal((5, 70)).astype(dt)
    if case == "f32_scaled":
        g.output(g.call("sum", g.call("mul", a, g.constant(0.5)), axis=1))
        ref = (x.astype(np.float64) * 0.5).sum(1)
    elif case == "f32_softmax":
        g.output(g.call("softmax", a, axis=1))
        e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
        ref = e / e.sum(1, keepdims=True)
    elif case == "f64_sum":
        g.output(g.call("sum", a, axis=1))
        ref = x.sum(1)
    elif case == "f64_cast_down":
        g.output(g.call("sum", g.call("cast", a, dtype="float32"), axis=1))
        ref = x.astype(np.float32).astype(np.float64).sum(1)
    elif case == "f32_cast_up":
        g.output(g.call("sum", g.call("cast", a, dtype="float64"), axis=1))
        ref = x.astype(np.float64).sum(1)
    else:
        m = g.call("mean", g.call("cast", a, dtype="float64"), axis=1, keepdim=True)
        g.output(g.call("sum", g.call("gt", a, m), axis=1))
        ref = (x > x.astype(np.float64).mean(1, keepdims=True)).sum(1)
    f = g.compile()
    (got,) = f(x)
    if got.dtype.kind == "f":
        assert_close_np(got, ref.astype(got.dtype), dtype=got.dtype, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, ref)
    decls = set(re.findall(r"^\s*\w+ (?:acc|nan)\d+_l\[([^\]]+)\];$", f.kernels[0].source, re.M))
    # a float32 sum's sweep: twice the lanes (two registers of float32 partials, in blocks)
    want = {
        "f32_scaled": {"(2 * FC_LANES)"},
        "f32_softmax": {"FC_LANES", "(2 * FC_LANES)"},
        "f64_cast_down": {"16"},
    }.get(case, {"8"})
    assert decls == want, decls


@pytest.mark.parametrize("n", [31, 32, 33, 511, 512, 513, 1100, 300001])
def test_float32_sums_round_in_float32_over_16_values_a_lane_at_most(n, lanes):
    """A float32 sum (and mean, and var's two sums) adds in float32 lane partials over blocks of
    16 values a lane (2 * FC_LANES lanes), each block's partials folded into float64 lanes: its
    float32 rounding spans 16 values at most, so the relative error of a sum of positive values
    stays under 16 units of float32 rounding (2**-24) at any length. Float32 lanes over whole rows
    of 300001 thirds (each add rounds the same way once a partial passes 2048) are off by 1e-4.
    Lengths: below a lane block (scalar), a block, a
    block and a tail, around a flush (16 blocks), several flushes; 8 and 16 lanes."""
    rng = np.random.default_rng(n)
    x = (1.0 + rng.random((3, n))).astype(np.float32)
    x[0] = np.float32(1 / 3)  # float32 partials over long runs round it the same way each add
    x[2] *= 1000.0
    f = _sums_within_16_roundings(x, 1)
    assert "_f[(2 * FC_LANES)];" in f.kernels[0].source


def _sums_within_16_roundings(x, axis):
    """The sum, mean and var of positive float32 x over axis, compiled: the sum's and mean's
    relative errors within 16 units of float32 rounding (2**-24) plus the final rounding, var
    within 1e-5. Returns the compiled graph."""
    n = x.shape[axis]
    ref = x.astype(np.float64).sum(axis)
    g = Graph()
    a = g.input("float32", 2)
    g.output(g.call("sum", a, axis=axis), g.call("mean", a, axis=axis), g.call("var", a, axis=axis))
    f = g.compile()
    total, mean, var = f(x)
    bound = 16 * 2.0**-24
    assert np.all(np.abs(total.astype(np.float64) - ref) <= (bound + 2.0**-24) * ref), (total, ref)
    assert np.all(np.abs(mean.astype(np.float64) - ref / n) <= (bound + 2.0**-23) * ref / n)
    assert_close_np(var, x.astype(np.float64).var(axis), dtype=np.float32, rtol=1e-5, atol=1e-9)
    return f


@pytest.mark.parametrize("n", [15, 16, 17, 300, 100001])
def test_float32_column_sums_round_in_float32_over_16_rows_at_most(n):
    """Column blocks (a sum over the batch, as BatchNorm's over (N, C) or channels_last rows)
    add each column's float32 values in float32 over blocks of 16 rows, then into the column's
    float64 accumulator: the relative error of a sum of positive values stays under 16 units of
    float32 rounding at any length (unbounded float32 partials over 100001 thirds are off by
    1e-4). Lengths: below a block, a block, a block and one row, many blocks."""
    rng = np.random.default_rng(n)
    x = (1.0 + rng.random((n, 40))).astype(np.float32)
    x[:, 0] = np.float32(1 / 3)
    x[:, 1] *= 1000.0
    f = _sums_within_16_roundings(x, 0)
    (col,) = [k.source for k in f.kernels if "_cols(" in k.source]
    assert "float acc" in col and "_f[FC_COLS];" in col and "if (++blk == 16) {" in col, col


def test_column_blocks_prefetch_only_operands_that_change_by_row():
    """A column block prefetches the rows ahead of the operands that differ by row (x), not of
    one the key says is the same in every row (a column's mean and weight, shaped (1, C))."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((500, 40)).astype(np.float32)
    m, w = rng.standard_normal((1, 40)).astype(np.float32), rng.standard_normal((1, 40)).astype(np.float32)
    g = Graph()
    a, b, c = g.input("float32", 2), g.input("float32", 2), g.input("float32", 2)
    g.output(g.call("sum", g.call("relu", g.call("mul", g.call("sub", a, b), c)), axis=0))
    f = g.compile()
    (got,) = f(x, m, w)
    want = np.maximum((x.astype(np.float64) - m) * w, 0).sum(0)
    assert_close_np(got, want.astype(np.float32), rtol=1e-5, atol=1e-4)
    (col,) = [k.source for k in f.kernels if "_cols(" in k.source]
    body = col[col.index("_cols(") :]
    ahead = re.findall(r"__builtin_prefetch\(p(\d+) \+ \(i \+ FC_COLS_AHEAD\)", body)
    xs = re.findall(r"const float x(\d+) = p(\d+)\[i \* s\d+ \+ b\];", body)
    assert len(set(p for _, p in xs)) == 3 and len(set(ahead)) == 1, (ahead, xs)


def test_arg_reductions_keep_the_scalar_first_index_loop():
    """argmax needs the first of equal maxima: no lanes, and ties are still first-index."""
    x = np.zeros((3, 40), np.float32)
    x[0, [3, 20, 35]] = 5.0
    x[1, [37, 38]] = 7.0
    x[2, [9, 25]] = np.nan
    g = Graph()
    a = g.input("float32", 2)
    g.output(g.call("argmax", a, axis=1), g.call("sum", a, axis=1))
    f = g.compile()
    got, s = f(x)
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))
    assert_close_np(s, x.sum(1, dtype=np.float64).astype(np.float32))
    assert "_l[" not in f.kernels[0].source


def test_rows_are_shared_between_threads_without_rounding():
    """A row reduction splits its rows between threads one by one (fc_thread_range's gran 1):
    in 16-row steps, 2 threads got 64 and 33 of 97 rows. Pointwise ranges keep 16-element steps."""
    g = Graph()
    a = g.input("float32", 2)
    g.output(g.call("softmax", a, axis=-1), g.call("exp", a))
    f = g.compile()
    x = np.random.default_rng(2).standard_normal((97, 300)).astype(np.float32)
    s, e = f(x)
    ref = np.exp(x - x.max(-1, keepdims=True))
    assert_close_np(s, ref / ref.sum(-1, keepdims=True), dtype=np.float32, rtol=1e-5, atol=1e-7)
    assert_close_np(e, np.exp(x), dtype=np.float32, rtol=1e-6, atol=0)
    srcs = "\n".join(k.source for k in f.kernels)
    assert re.search(r"FC_RUN_RANGES\(L, L->n_outer, 1, fc_\w+_rows", srcs), srcs
    if len(f.kernels) > 1:
        assert re.search(r"FC_RUN_RANGES\(L, L->n_outer, 16, fc_\w+_range", srcs)


@pytest.fixture
def two_threads_always():
    """2 threads and no serial threshold: small launches take the threaded paths."""
    old = {k: fastcompile.config.get(k) for k in ("num_threads", "serial_below")}
    fastcompile.config.set(num_threads=2, serial_below=0)
    yield
    fastcompile.config.set(**old)


@pytest.mark.parametrize("op", sorted(REFS) + ["all"])
@pytest.mark.parametrize(
    "shape,axis",
    [((4096, 32), 0), ((2000, 3), 0), ((1000, 50), 0), ((640, 64), 0), ((700, 65), 0), ((300, 7, 5), (0, 1))],
)
def test_column_blocks_share_rows_between_threads(two_threads_always, op, shape, axis):
    """Few columns, many rows (fc_use_cols_split: 64 columns or fewer on 2 threads): the threads
    share each block's rows, each thread's partial per column is published and every thread
    folds them in thread order before the block's next sweep. Every reduction kind, NaN and
    inf included, against NumPy (sums in float64 within float32 rounding); 65 columns keep the
    columns-per-thread version. NaN must survive max/min's folding from either thread's half."""
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    if op in ("amax", "amin"):
        x.reshape(shape[0], -1)[shape[0] - 3, 1] = np.nan  # in the second thread's rows
        x.reshape(shape[0], -1)[2, 2 % x.reshape(shape[0], -1).shape[1]] = np.inf
    if op == "prod":
        x = (1 + x / 50).astype(np.float32)
    if op in ("any", "all"):
        x = (rng.random(shape) < (0.002 if op == "any" else 0.998)).astype(np.float32)
    g = Graph()
    a = g.input("float32", len(shape))
    if op == "all":
        g.output(g.call("logical_not", g.call("any", g.call("eq", a, 0.0), axis=axis)))
        want = np.all(x != 0, axis=axis)
    else:
        g.output(g.call(op, a, axis=axis))
        want = REFS[op](x, axis, False)
    (got,) = g.compile()(x)
    assert_close_np(got, want, rtol=2e-5, atol=1e-5)


def test_batchnorm_statistics_of_channels_last_share_rows(two_threads_always):
    """BatchNorm's training statistics and normalize over a channels_last (N, C, H, W) of 32
    channels (the CNN case: 16 columns per thread was one vector per row, and the threads'
    columns shared cache lines; shared rows run 2x faster on 2 cores): mean and variance
    over (N, H, W) each folded across the threads before the next sweep, results stored by
    each thread for its rows. Against NumPy in float64."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 9, 10, 32), dtype=np.float32).transpose(0, 3, 1, 2)
    g = Graph()
    u = g.input("float32", 4)
    d = g.call("sub", u, g.call("mean", u, axis=(0, 2, 3), keepdim=True))
    v = g.call("mean", g.call("mul", d, d), axis=(0, 2, 3), keepdim=True)
    g.output(g.call("relu", g.call("mul", d, g.call("rsqrt", g.call("add", v, 1e-5)))), v)
    f = g.compile()
    y, var = f(x)
    x64 = x.astype(np.float64)
    d64 = x64 - x64.mean(axis=(0, 2, 3), keepdims=True)
    v64 = (d64 * d64).mean(axis=(0, 2, 3), keepdims=True)
    assert_close_np(var, v64.astype(np.float32), rtol=1e-5, atol=1e-7)
    assert_close_np(y, np.maximum(d64 / np.sqrt(v64 + 1e-5), 0).astype(np.float32), rtol=1e-4, atol=1e-5)
    assert y.strides == x.strides  # channels_last results, as the input
    src = f.kernels[0].source
    assert "fc_use_cols_split(L)" in src and "_cparts P;" in src
