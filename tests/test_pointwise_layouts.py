"""Pointwise kernels whose last dim walks an operand with a stride (x * y.T) run as column
blocks (plan.c, column_block): every block width, partial last block, rank, negative stride,
broadcast and multi-output case against NumPy."""
import numpy as np
import pytest

from fastcompile.graph import Graph

from conftest import assert_close_np


def _mul_add(shape_a, b, c):
    g = Graph()
    x, y, z = g.input("float32", len(shape_a)), g.input("float32", b.ndim), g.input("float32", c.ndim)
    g.output(g.call("add", g.call("mul", x, y), z), g.call("gelu", y))
    return g.compile()


CASES = {
    # name: (a's shape, b as a function of rng -> strided view broadcasting against a)
    "transposed": ((300, 1000), lambda r: r.standard_normal((1000, 300), dtype=np.float32).T),
    "wide_rows_serial_blocks": ((9, 5000), lambda r: r.standard_normal((5000, 9), dtype=np.float32).T),
    "rank3": ((7, 50, 400), lambda r: r.standard_normal((400, 50, 7), dtype=np.float32).transpose(2, 1, 0)),
    "negative_and_step": ((200, 700), lambda r: r.standard_normal((1400, 200), dtype=np.float32)[::-2].T),
    "column_broadcast": ((300, 1000), lambda r: r.standard_normal((1, 300), dtype=np.float32).T),
    "one_block_exact": ((400, 256), lambda r: r.standard_normal((256, 400), dtype=np.float32).T),
    "few_rows_unblocked": ((4, 3000), lambda r: r.standard_normal((3000, 4), dtype=np.float32).T),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_strided_pointwise_blocks(name):
    shape_a, make_b = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    a = rng.standard_normal(shape_a, dtype=np.float32)
    b = make_b(rng)
    c = rng.standard_normal(shape_a[-1:], dtype=np.float32)      # unit stride, broadcast over rows
    a.flat[5] = np.nan
    out, gel = _mul_add(shape_a, b, c)(a, b, c)
    want = a * b + c
    assert out.shape == want.shape
    assert np.array_equal(out, want, equal_nan=True)             # exact: one rounding per op
    from test_ops import ref_gelu
    assert_close_np(gel, ref_gelu(b.astype(np.float64)).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_one_array_read_transposed_and_straight():
    """x.T + x - 2x: one buffer read through both layouts in one kernel."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((600, 600), dtype=np.float32)
    g = Graph()
    u, v = g.input("float32", 2), g.input("float32", 2)
    g.output(g.call("sub", g.call("add", u, v), g.call("mul", v, 2.0)))
    got, = g.compile()(x.T, x)
    assert np.array_equal(got, (x.T + x) - x * np.float32(2.0))
