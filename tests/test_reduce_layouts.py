"""Reductions in every loop order the runtime picks: rows owned by a thread,
rows shared by all threads (few long rows), and column blocks (reduced with a
stride while outer neighbours are adjacent, e.g. sum over axis 0)."""
import numpy as np
import pytest

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
    ((300, 70), 0),          # column blocks, a partial block at the end
    ((5, 130, 9), (0, 1)),   # two reduced leading axes, short outer rows
    ((64, 3, 40), 0),        # outer rows of 3*40 with blocks crossing row ends
    ((2, 200000), 1),        # few long rows: threads share each row
    ((40000, 3), 1),         # many short rows
    ((3, 40000), 0),         # column blocks over a long outer dim (threaded)
]


@pytest.mark.parametrize("op", sorted(REFS))
@pytest.mark.parametrize("shape,axis", SHAPES)
def test_reduction_loop_orders(op, shape, axis):
    rng = np.random.default_rng(abs(hash((op, shape))) % 2**32)
    x = (rng.standard_normal(shape) * 0.5 + (1.0 if op == "prod" else 0.0)).astype(np.float32)
    if op == "prod":
        x = np.clip(x, 0.98, 1.02).astype(np.float32)
    x.flat[7] = np.nan                      # one NaN, found by position in the result
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
    with np.errstate(invalid="ignore"):     # log of negative sums: NaN at the same places
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
    needs the reduction first (a second sweep, so the row order only). Both against NumPy, in
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
        got_z, = f2(xs)
        assert_close_np(got_z, (x.astype(np.float64) - x.astype(np.float64).mean(0, keepdims=True))
                        .astype(np.float32), rtol=1e-5, atol=1e-5)
    assert any("_cols(" in k.source for k in f.kernels)          # the column-block version exists
    assert not any("_cols(" in k.source for k in f2.kernels)     # a second sweep: rows only



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

    g = Graph()                                      # dx: two sums over each row, then the row
    a, m, r, gr = inputs(g)
    wt = g.input("float32", 1)
    xhat = g.call("mul", g.call("sub", a, m), r)
    gw = g.call("mul", gr, wt)
    s1 = g.call("sum", gw, axis=-1, keepdim=True)
    s2 = g.call("sum", g.call("mul", gw, xhat), axis=-1, keepdim=True)
    g.output(g.call("mul", g.call("div", r, float(d)),
                    g.call("sub", g.call("sub", g.call("mul", gw, float(d)), s1), g.call("mul", xhat, s2))))
    fdx = g.compile()
    (got_dx,) = fdx(x, mu, rs, gy, w)
    gw64 = gy64 * w64
    want_dx = rs / d * (d * gw64 - gw64.sum(-1, keepdims=True) - xh * (gw64 * xh).sum(-1, keepdims=True))
    assert_close_np(got_dx, want_dx.astype(np.float32), rtol=1e-4, atol=1e-5)
    assert np.isnan(got_dx[17]).all() and not np.isnan(got_dx[16]).any()

    g = Graph()                                      # dw, db: sums over the batch
    a, m, r, gr = inputs(g)
    g.output(g.call("sum", g.call("mul", gr, g.call("mul", g.call("sub", a, m), r)), axis=0),
             g.call("sum", gr, axis=0))
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
