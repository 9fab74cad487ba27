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
    c = rng.standard_normal(shape_a[-1:], dtype=np.float32)  # unit stride, broadcast over rows
    a.flat[5] = np.nan
    out, gel = _mul_add(shape_a, b, c)(a, b, c)
    want = a * b + c
    assert out.shape == want.shape
    assert np.array_equal(out, want, equal_nan=True)  # exact: one rounding per op
    from test_ops import ref_gelu

    assert_close_np(gel, ref_gelu(b.astype(np.float64)).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_one_array_read_transposed_and_straight():
    """x.T + x - 2x: one buffer read through both layouts in one kernel."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((600, 600), dtype=np.float32)
    g = Graph()
    u, v = g.input("float32", 2), g.input("float32", 2)
    g.output(g.call("sub", g.call("add", u, v), g.call("mul", v, 2.0)))
    (got,) = g.compile()(x.T, x)
    assert np.array_equal(got, (x.T + x) - x * np.float32(2.0))


@pytest.mark.parametrize("nd", [1, 2, 3, 4])
def test_strided_runs_over_outer_spaces_of_one_to_four_dims(nd):
    """A pointwise kernel's runs (fc_offsets_run / fc_advance_run: 2-d and 3-d spaces inline,
    others out of line) and a row reduction's outer walk (fc_offset / fc_advance: 1-d and 2-d
    inline) over launches that collapse to 1..4 outer dims: a q/k/v split with its bias (the
    input read through a permuted view) and a residual add + layernorm reading one operand
    transposed. On 2 threads from 0 elements (serial_below=0): the threads' ranges start and
    end inside runs and rows, odd sizes."""
    import fastcompile

    rng = np.random.default_rng(nd)
    s, b, h, d = 13, 6, 3, 37
    mm = rng.standard_normal((s * b, h * d), dtype=np.float32)
    bias = rng.standard_normal((h * d,), dtype=np.float32)
    # q/k/v split: (s, b, h, d) -> (h, s, b, d), with views that leave nd - 1 dims and the run
    qkv = mm.reshape(s, b, h, d).transpose(2, 0, 1, 3)
    bias4 = bias.reshape(h, 1, 1, d)
    if nd == 1:
        x, y = mm, bias.reshape(1, h * d)  # collapses to one dim of runs
    elif nd == 2:
        x, y = qkv[:, :, 0, :], bias4[:, :, 0, :]  # (h, s, d)
    elif nd == 3:
        x, y = qkv, bias4  # (h, s*b, d)
    else:
        x, y = qkv[:, ::-1], bias4  # seq reversed: (h, s, b, d), no collapse
    old = fastcompile.config.get("serial_below")
    fastcompile.config.set(serial_below=0)
    try:
        g = Graph()
        u, v = g.input("float32", x.ndim), g.input("float32", y.ndim)
        g.output(g.call("add", u, v))
        (got,) = g.compile()(x, y)
        assert np.array_equal(got, x + y)
        # residual add + layernorm over the last dim, the second operand read transposed
        xs = rng.standard_normal((b, s, d), dtype=np.float32)
        at = rng.standard_normal((s, b, d), dtype=np.float32).transpose(1, 0, 2)
        if nd == 1:
            xs, at = xs.reshape(b * s, d), np.ascontiguousarray(at).reshape(b * s, d)
        elif nd == 4:
            xs = rng.standard_normal((2, b, s, d), dtype=np.float32)
            at = rng.standard_normal((s, 2, b, d), dtype=np.float32).transpose(1, 2, 0, 3)
        g = Graph()
        p, q = g.input("float32", xs.ndim), g.input("float32", at.ndim)
        r = g.call("add", p, q)
        m = g.call("mean", r, axis=-1, keepdim=True)
        c = g.call("sub", r, m)
        var = g.call("mean", g.call("mul", c, c), axis=-1, keepdim=True)
        g.output(r, g.call("mul", c, g.call("rsqrt", g.call("add", var, 1e-5))))
        got_r, got_n = g.compile()(xs, at)
    finally:
        fastcompile.config.set(serial_below=old)
    r64 = xs.astype(np.float64) + at
    c64 = r64 - r64.mean(-1, keepdims=True)
    want = c64 / np.sqrt((c64 * c64).mean(-1, keepdims=True) + 1e-5)
    assert np.array_equal(got_r, xs + at)
    assert_close_np(got_n, want.astype(np.float32), rtol=1e-5, atol=1e-5)
