"""runtime/relayout.c: _C._relayout, the batched 2-d transpose the torch backend converts
tensors to channels_last and back with (_cl_relayout, _to_channels_last), against NumPy's
transpose and torch's .contiguous(memory_format=...). A copy moves bits, so results must be
bit-identical (NaN payloads and signed zeros included): compared as unsigned integers."""

import numpy as np
import pytest

from fastcompile import _C

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _relayout(src, shape, to_cl):
    return _C._relayout(src.ctypes.data, shape, src.dtype.num, to_cl)


# sizes: whole tiles of 16, partial tiles, one position, and past the one-thread limit
# (128 KiB) so that both threads' shares are checked; ranks 3 to 5
@pytest.mark.parametrize(
    "shape",
    [
        (1, 16, 16),
        (3, 5, 7),
        (2, 33, 1),
        (4, 17, 1000),
        (16, 16, 32, 32),
        (3, 1000, 17),
        (2, 3, 4, 5, 6),
        (1, 0, 5),
        (0, 3, 4),
    ],
    ids=str,
)
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_relayout_matches_numpy_bit_for_bit_both_ways(shape, itemsize):
    """To C last in memory and back, against NumPy's transpose: the same values, shape and
    strides (the channels_last result is C last in memory), moved as bits."""
    rng = np.random.default_rng(sum(shape) * 10 + itemsize)
    n = int(np.prod(shape))
    src = rng.integers(0, np.iinfo(_UINT[itemsize]).max, size=n, dtype=_UINT[itemsize], endpoint=True).reshape(shape)
    axes = (0,) + tuple(range(2, len(shape))) + (1,)
    cl = _relayout(src, shape, True)
    assert cl.shape == shape and cl.dtype == src.dtype
    np.testing.assert_array_equal(cl, src)
    assert cl.transpose(axes).flags.c_contiguous  # C last in memory
    back = _relayout(np.ascontiguousarray(cl.transpose(axes)), shape, False)
    assert back.flags.c_contiguous and back.shape == shape
    np.testing.assert_array_equal(back, src)


def test_relayout_keeps_nan_payloads_and_signed_zeros():
    bits = (
        np.array([0x7FC00001, 0xFFC12345, 0x80000000, 0x7F800000, 0x00000001, 0x3F800000] * 50, dtype=np.uint32)
        .view(np.float32)
        .reshape(6, 10, 5)
    )
    out = _relayout(bits, bits.shape, True)
    np.testing.assert_array_equal(out.view(np.uint32), bits.view(np.uint32))


def test_relayout_takes_no_references_it_keeps():
    """Refcounts: the shape passed in keeps its count, over calls that succeed and calls that
    fail; a result and the block a channels_last result views die with the last reference the
    caller drops (weak references)."""
    import sys
    import weakref

    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32)
    shape = (2, 3, 4, 5)
    before = sys.getrefcount(shape)
    for _ in range(100):
        cl = _relayout(x, shape, True)
        back = _relayout(np.ascontiguousarray(cl.transpose(0, 2, 3, 1)), shape, False)
        with pytest.raises(ValueError):
            _C._relayout(x.ctypes.data, shape, np.dtype("complex128").num, True)
    assert sys.getrefcount(shape) == before
    np.testing.assert_array_equal(back, x.reshape(shape))
    refs = [weakref.ref(a) for a in (cl, cl.base, back)]
    del cl, back
    assert [r() for r in refs] == [None, None, None]


@pytest.mark.parametrize(
    "args,exc,match",
    [
        ((1, (2, 3, 4), np.dtype("complex128").num, True), ValueError, "elements of 16 bytes"),
        ((1, (2, 3), np.dtype("float32").num, True), ValueError, "rank 2"),
        ((1, (2, 3, 4, 5, 6, 7), np.dtype("float32").num, True), ValueError, "rank 6"),
        ((1, (2, -3, 4), np.dtype("float32").num, True), ValueError, "negative or overflowing"),
        ((1, (1 << 40, 1 << 40, 1 << 40), np.dtype("float32").num, True), ValueError, "negative or overflowing"),
        ((0, (2, 3, 4), np.dtype("float32").num, True), ValueError, "null buffer"),
        ((1, 5, np.dtype("float32").num, True), TypeError, "sequence"),
    ],
)
def test_relayout_rejects_bad_arguments(args, exc, match):
    with pytest.raises(exc, match=match):
        _C._relayout(*args)


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed: the torch frontends are not tested")


@pytest.fixture
def small_too(monkeypatch):
    """The backend's transpose for tensors of any size (it leaves ones under _RELAYOUT_MIN
    elements to torch, whose call costs less there), so that small shapes test it."""
    _torch()
    from fastcompile.backends.torch import channels_last as fbcl

    monkeypatch.setattr(fbcl, "_RELAYOUT_MIN", 0)


_SHAPES = [(16, 16, 32, 32), (2, 3, 5, 7), (1, 64, 9, 9), (3, 17, 1, 40), (4, 8, 3, 5, 6)]


@pytest.mark.parametrize("shape", _SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16", "uint8", "bool", "int64"])
def test_cl_relayout_is_torchs_copy_both_ways(small_too, shape, dtype):
    """NCHW -> channels_last (and channels_last_3d) and back: values, strides and dtype as
    torch's .contiguous(memory_format=...), in new memory."""
    torch = _torch()
    from fastcompile.backends.torch import channels_last as fbcl

    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = (torch.randn(shape) * 100).to(getattr(torch, dtype))
    ref = x.contiguous(memory_format=fmt)
    y = fbcl._cl_relayout(x, ref.stride())
    assert y is not None and y.dtype == x.dtype and y.shape == x.shape and y.stride() == ref.stride()
    assert torch.equal(y, ref) and y.data_ptr() != x.data_ptr()
    back = fbcl._cl_relayout(ref, x.stride())
    assert back is not None and back.stride() == x.stride() and torch.equal(back, x)
    assert back.data_ptr() != ref.data_ptr()
    if len(shape) == 4:
        z = fbcl._to_channels_last(x)
        assert z.stride() == ref.stride() and torch.equal(z, ref)
        assert fbcl._to_channels_last(ref) is ref  # already channels_last: itself


def test_cl_relayout_leaves_other_cases_to_torch(monkeypatch):
    """None (torch's copy does it) where the transpose would be wrong or is not the job: other
    orders, strided views, one channel, complex (a conjugate view's bits are not its values),
    a tensor autograd must record, fewer than _RELAYOUT_MIN elements; the restride then still
    gives eager's layout."""
    torch = _torch()
    from fastcompile.backends.torch import channels_last as fbcl

    x = torch.randn(2, 4, 6, 6)
    cl = fbcl._cl_strides(x.shape)
    assert fbcl._RELAYOUT_MIN > x.numel() and fbcl._cl_relayout(x, cl) is None  # small
    monkeypatch.setattr(fbcl, "_RELAYOUT_MIN", 0)
    assert fbcl._cl_relayout(x, cl) is not None
    assert fbcl._cl_relayout(x[:, :, ::2], fbcl._cl_strides((2, 4, 3, 6))) is None  # not dense
    assert fbcl._cl_relayout(x.permute(0, 1, 3, 2), cl) is None  # another order
    assert fbcl._cl_relayout(x, x.permute(0, 3, 2, 1).contiguous().stride()) is None  # another target
    assert fbcl._cl_relayout(torch.randn(2, 1, 6, 6), (36, 36, 6, 1)) is None  # one channel
    assert fbcl._cl_relayout(torch.randn(2, 4, 6, 6, dtype=torch.complex64).conj(), cl) is None
    w = torch.randn(2, 4, 6, 6, requires_grad=True)
    assert fbcl._cl_relayout(w, cl) is None
    with torch.no_grad():
        assert torch.equal(fbcl._cl_relayout(w, cl), w)
    for t in (x[:, :, ::2], x.permute(0, 1, 3, 2), torch.randn(2, 4, 6, 6, dtype=torch.complex64)):
        layout = (tuple(t.shape), fbcl._cl_strides(t.shape))
        r = fbcl._restride(t, layout)
        assert r.stride() == layout[1] and torch.equal(r, t)


def _relayouts_per_call(monkeypatch, m, x, calls=2):
    """Eval module m compiled through the backend and called on x under no_grad `calls` times:
    per call, its output and the (shape, to_cl) of each _relayout it made; eager's output."""
    torch = _torch()
    import fastcompile
    from fastcompile.backends import torch as fbt
    from fastcompile.backends.torch import channels_last as fbcl

    seen = []
    real = fbcl._relayout
    monkeypatch.setattr(fbcl, "_relayout", lambda t, to_cl: seen.append((tuple(t.shape), to_cl)) or real(t, to_cl))
    torch._dynamo.reset()
    fastcompile.reset()
    cf = torch.compile(m, backend=fbt.backend, dynamic=False)
    runs = []
    with torch.no_grad():
        ref = m(x)
        for _ in range(calls):
            del seen[:]
            runs.append((cf(x), list(seen)))
    return runs, ref


def test_backend_cnn_converts_with_the_transpose(monkeypatch, small_too):
    """A channels_last CNN through the backend converts its NCHW input with _C._relayout (not
    torch's copy), and its result is eager's: a wrong transpose fails here."""
    torch = _torch()
    torch.manual_seed(0)
    nn = torch.nn
    m = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 8, 3, padding=1)
    ).eval()
    runs, ref = _relayouts_per_call(monkeypatch, m, torch.randn(4, 8, 20, 20))
    for out, calls in runs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        assert ((4, 8, 20, 20), True) in calls, calls


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/maps"), reason="reads /proc/self/maps (Linux)")
def test_import_loads_no_openmp_runtime():
    """`import fastcompile` loads no libgomp: the runtime reads OMP_WAIT_POLICY when it loads, and
    the torch backend's PASSIVE default must come first (two runtimes' spinning threads starve
    each other where torch ships its own). A threaded copy then finds libgomp itself."""
    import subprocess
    import sys

    code = (
        "import fastcompile, numpy as np\n"
        "from fastcompile import _C\n"
        "def gomp():\n"
        "    return any('libgomp' in l for l in open('/proc/self/maps'))\n"
        "print(gomp())\n"
        "x = np.arange(16 * 16 * 1024, dtype=np.float32).reshape(16, 16, 32, 32)\n"
        "fastcompile.config.set(num_threads=2)\n"
        "y = _C._relayout(x.ctypes.data, x.shape, x.dtype.num, True)\n"
        "assert (y == x).all() and y.transpose(0, 2, 3, 1).flags.c_contiguous\n"
        "print(gomp())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], out.stdout


def test_backend_gives_eager_layout_back_with_the_transpose(monkeypatch, small_too):
    """An inference graph that ends in its channels_last convolution's result: eager gives the
    NCHW input's layout (C order), the graph's result is channels_last, and the backend copies it
    back with _C._relayout (to_cl false): values and strides as eager's."""
    torch = _torch()
    torch.manual_seed(1)
    nn = torch.nn
    m = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 12, 3, padding=1)).eval()
    runs, ref = _relayouts_per_call(monkeypatch, m, torch.randn(2, 8, 10, 10))
    for out, calls in runs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        assert out.stride() == ref.stride() and out.is_contiguous()
        assert ((2, 12, 10, 10), False) in calls, calls
