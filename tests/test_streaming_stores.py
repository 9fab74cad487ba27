"""Heavy flat kernels with large outputs (FC_NT_BYTES, 16 MB, or more per launch) compute each
block into a stack buffer and stream it out with non-temporal stores (fc_kernel.h). The results
must equal, bit for bit, those of the same kernel on pieces below the threshold (normal stores):
every output dtype width, several outputs, odd lengths (unaligned thread starts and tails)."""

import numpy as np
import pytest

from fastcompile.graph import Graph

NT_ELEMS_F32 = (16 << 20) // 4


def _pieces(f, arrays, n, step=1 << 20):
    """f on slices of `step` elements (below the threshold), concatenated per output"""
    outs = [f(*[a[i : i + step] for a in arrays]) for i in range(0, n, step)]
    return [np.concatenate([o[k] for o in outs]) for k in range(len(outs[0]))]


@pytest.mark.parametrize(
    "dtype,n",
    [("float32", NT_ELEMS_F32 + 37), ("float32", 3 * NT_ELEMS_F32 // 2 + 5), ("float64", NT_ELEMS_F32 // 2 + 11)],
    ids=str,
)
def test_streamed_outputs_equal_normal_stores(dtype, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(dtype)
    x[[0, 5, n - 1]] = [np.nan, np.inf, -np.inf]
    g = Graph()
    u = g.input(dtype, 1)
    g.output(g.call("gelu", u), g.call("sigmoid", u))
    f = g.compile()
    got = f(x)
    assert "fc_stream_store" in f.kernels[0].source
    want = _pieces(f, [x], n)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == (n,)
        assert np.array_equal(a, b, equal_nan=True)


def test_streamed_half_output_and_threshold_edge():
    """float16 results (stored as 16-bit): 16 MB of them is 8M elements; one element fewer than
    the threshold takes the normal path. Both equal the piecewise result."""
    n16 = (16 << 20) // 2
    rng = np.random.default_rng(7)
    for n in (n16 + 3, n16 - 1):
        x = rng.standard_normal(n).astype(np.float32)
        g = Graph()
        u = g.input("float32", 1)
        g.output(g.call("cast", g.call("gelu", u), dtype="float16"))
        f = g.compile()
        (got,) = f(x)
        (want,) = _pieces(f, [x], n)
        assert got.dtype == np.float16 and np.array_equal(got, want, equal_nan=True)
