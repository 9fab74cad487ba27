"""Child process of tests/test_cuda_emulated.py: compiled graphs run through the CUDA path
against emu_cuda.so (a fake NVRTC + driver: kernels built by g++, CUDA threads as fibers) on
CPU tensors that say they are on cuda:0. Checks each result against NumPy; prints one line per
case and "EMULATED OK <n>" at the end, or raises.

What this covers without a GPU: the device-array bridge, plan keys per device, gen_cuda's
kernels (grid-stride loops, unrolling, block reductions, the row cache), the launch packing
(fc_cu_launch's layout), 32-bit index selection and the errors. What it cannot: the real
NVRTC/driver, timing, 64-bit indexing (needs > 2^31 elements)."""

import sys
import types

import numpy as np
import torch

import fastcompile
from fastcompile.graph import Graph


class EmuCuda(torch.Tensor):
    """A CPU tensor that reports cuda:0: its data pointer is host memory the emulated kernels
    read and write."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # attributes straight from C

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 0


bridge = types.ModuleType("fastcompile._cuda_bridge")
bridge.TENSOR = EmuCuda
bridge.empty = lambda shape, dtype, dev: torch.empty(shape, dtype=dtype).as_subclass(EmuCuda)
bridge.full = lambda value, dtype, dev: torch.full((), value, dtype=dtype).as_subclass(EmuCuda)
bridge.stream = lambda dev: 0
sys.modules["fastcompile._cuda_bridge"] = bridge


def dev(a):
    """a NumPy array as an EmuCuda tensor with the same element strides (no negative ones);
    uint16 arrays hold bfloat16 bits and become bfloat16 tensors"""
    if a.dtype == np.uint16:
        return dev(a.view(np.int16)).view(torch.bfloat16).as_subclass(EmuCuda)
    strides = tuple(s // a.itemsize for s in a.strides)
    if a.size == 0:
        return torch.from_numpy(np.ascontiguousarray(a)).as_subclass(EmuCuda)
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides))
    flat = np.lib.stride_tricks.as_strided(a, (span,), (a.itemsize,))
    return torch.as_strided(torch.from_numpy(np.array(flat)), a.shape, strides).as_subclass(EmuCuda)


def host(t):
    assert isinstance(t, EmuCuda), type(t)
    t = t.as_subclass(torch.Tensor)
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


def run(build, *arrays):
    g = Graph()
    ins = [g.input(a.dtype.name if a.dtype != np.uint16 else "bfloat16", a.ndim) for a in arrays]
    g.output(*build(g, *ins))
    f = g.compile()
    outs = f(*[dev(a) for a in arrays])
    return f, [host(o) for o in outs]


def close(got, want, rtol=2e-6, atol=1e-6, what=""):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
    assert got.dtype == np.asarray(want).dtype or rtol > 0, what


rng = np.random.default_rng(0)
n_ok = 0


def case(name):
    def deco(fn):
        global n_ok
        fn()
        n_ok += 1
        print("ok", name, flush=True)
        return fn

    return deco


info = fastcompile.cuda_info()
assert info["device_count"] == 1 and info["nvrtc_version"] == "99.0", info


@case("flat pointwise, a tail shorter than a trip")
def _():
    x = rng.standard_normal(5000).astype(np.float32)
    y = rng.standard_normal(5000).astype(np.float32)
    f, (z,) = run(lambda g, a, b: [g.call("add", g.call("mul", a, b), 1.0)], x, y)
    np.testing.assert_array_equal(z, x * y + np.float32(1))  # no contraction: exact
    k = f.kernels[0]
    assert k.so_path is None and "__global__" in k.source and k.path.endswith(k.key + ".cu")
    assert open(k.path).read() == k.source  # what runs, readable beside its cubin


@case("flat kernels' vector loop: aligned and misaligned views, tails, mixed element sizes")
def _():
    for n in (1, 7, 8, 9, 517, 4099):
        x = rng.standard_normal(n + 1).astype(np.float32)
        h = rng.standard_normal(n + 1).astype(np.float16)
        for off in (0, 1):  # off 1: a view one element in, not 16-byte aligned
            f, (z, b) = run(
                lambda g, a, c: [
                    g.call("add", g.call("mul", a, a), g.call("cast", c, dtype="float32")),
                    g.call("gt", c, 0.5),
                ],
                x[off : off + n],
                h[off : off + n],
            )
            np.testing.assert_array_equal(z, x[off : off + n] * x[off : off + n] + h[off : off + n].astype(np.float32))
            np.testing.assert_array_equal(b, h[off : off + n] > 0.5)
    assert "fc_cu_vload<4>" in f.kernels[0].source  # float32 the widest: 4 a vector
    bf = rng.integers(0, 1 << 16, 4099, dtype=np.uint16)
    bf[(bf & 0x7F80) == 0x7F80] = 0x3F80  # no NaN/inf bit patterns
    for off in (0, 3):
        u = bf[off : off + 4093]
        _, (y,) = run(lambda g, a: [g.call("neg", a)], u)
        np.testing.assert_array_equal(y.view(np.uint16), u ^ 0x8000)


@case("reductions' vector path: rows aligned or not, a stride-0 input, full and per-row outputs")
def _():
    def build(g, u, m):
        d = g.call("sub", u, m)
        return [g.call("exp", d), g.call("sum", d, axis=-1)]

    for rows, cols, off in ((3, 4096, 0), (4, 4100, 0), (3, 4096, 1), (2, 5000, 0), (5, 12, 0), (3, 10, 0)):
        x = rng.standard_normal((rows, cols + off)).astype(np.float32)[:, off:]
        m = rng.standard_normal((rows, 1)).astype(np.float32)
        f, (e, s) = run(build, x, np.broadcast_to(m, x.shape))
        close(e, np.exp(x - m), rtol=2e-6, atol=0, what="%s off %d" % ((rows, cols), off))
        close(s, (x.astype(np.float64) - m).sum(-1), rtol=1e-5, atol=1e-4, what="%s off %d" % ((rows, cols), off))
    assert "fc_rv" in f.kernels[0].source and "fc_cu_vstore<4>" in f.kernels[0].source
    bf = rng.integers(0x3C00, 0x4000, (4, 2048), dtype=np.uint16)  # bfloat16 in [0.0078, 2)
    _, (y,) = run(lambda g, a: [g.call("softmax", a, axis=-1)], bf)
    xs = (bf.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    want = np.exp(xs - xs.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    got = (y.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    close(got, want, rtol=8e-3, atol=0)


@case("a capped grid (config.cuda_max_grid): every thread loops, pointwise and over rows")
def _():
    x = rng.standard_normal(9001).astype(np.float32)
    r = rng.standard_normal((37, 130)).astype(np.float32)
    try:
        for cap in (1, 3):
            fastcompile.config.set(cuda_max_grid=cap)
            for off in (0, 1):  # the vector loop, then the scalar one
                _, (y,) = run(lambda g, a: [g.call("mul", g.call("exp", a), 2.0)], x[off:])
                close(y, np.exp(x[off:]) * 2, rtol=2e-6)
            _, (z,) = run(lambda g, a: [g.call("add", a, 1.0)], r.T)  # strided
            np.testing.assert_array_equal(z, r.T + np.float32(1))
            _, (s, m) = run(lambda g, a: [g.call("softmax", a, axis=-1), g.call("amax", a, axis=-1)], r)
            e = np.exp(r.astype(np.float64) - r.max(-1, keepdims=True))
            close(s, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-9)
            np.testing.assert_array_equal(m, r.max(-1))
    finally:
        fastcompile.config.set(cuda_max_grid=0)


@case("transposed and broadcast operands (strided kernel)")
def _():
    x = rng.standard_normal((37, 300)).astype(np.float32).T
    y = rng.standard_normal((1, 37)).astype(np.float32)
    _, (z,) = run(lambda g, a, b: [g.call("sub", g.call("exp", a), b)], x, np.broadcast_to(y, (300, 37)))
    close(z, np.exp(x) - y)


@case("int32 and bool")
def _():
    x = rng.integers(-1000, 1000, (50, 70)).astype(np.int32)
    _, (a, b) = run(lambda g, u: [g.call("floordiv", u, 7), g.call("gt", u, 3)], x)
    np.testing.assert_array_equal(a, x // 7)
    np.testing.assert_array_equal(b, x > 3)


@case("float16 in, float16 out")
def _():
    x = rng.standard_normal(3000).astype(np.float16)
    _, (y,) = run(lambda g, u: [g.call("gelu", u)], x)
    assert y.dtype == np.float16
    xf = x.astype(np.float64)
    from math import erf

    want = np.array([0.5 * v * (1 + erf(v / 2**0.5)) for v in xf]).astype(np.float16)
    close(y.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)


@case("softmax over rows shorter than the row cache, and longer (its tail from memory)")
def _():
    for cols in (7, 1000, 4096, 5000, 9001):
        x = (rng.standard_normal((5, cols)) * 3).astype(np.float32)
        _, (y,) = run(lambda g, u: [g.call("softmax", u, axis=-1)], x)
        e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
        close(y, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-9, what="cols %d" % cols)


@case("layernorm, one kernel")
def _():
    x = rng.standard_normal((33, 4100)).astype(np.float32)
    w = rng.standard_normal(4100).astype(np.float32)

    def build(g, u, v):
        mu = g.call("mean", u, axis=-1, keepdims=True)
        d = g.call("sub", u, mu)
        var = g.call("mean", g.call("mul", d, d), axis=-1, keepdims=True)
        return [g.call("mul", g.call("mul", d, g.call("rsqrt", g.call("add", var, 1e-5))), v)]

    f, (y,) = run(build, x, w)
    xd = x.astype(np.float64)
    want = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * w
    close(y, want, rtol=1e-4, atol=1e-5)
    assert len(f.kernels) == 1


@case("reductions over a middle axis and over two axes (the general unravelling)")
def _():
    x = rng.standard_normal((6, 50, 7)).astype(np.float32)
    _, (a, b, c) = run(
        lambda g, u: [g.call("sum", u, axis=1), g.call("amax", u, axis=(0, 2)), g.call("argmax", u, axis=1)], x
    )
    close(a, x.astype(np.float64).sum(1), rtol=1e-5)
    np.testing.assert_array_equal(b, x.max((0, 2)))
    np.testing.assert_array_equal(c, x.argmax(1))


@case("NaN in amax, any/all, var")
def _():
    x = rng.standard_normal((4, 300)).astype(np.float64)
    x[2, 17] = np.nan
    _, (a, b, c) = run(
        lambda g, u: [
            g.call("amax", u, axis=-1),
            g.call("any", g.call("gt", u, 2.5), axis=-1),
            g.call("var", u, axis=-1),
        ],
        x,
    )
    np.testing.assert_array_equal(np.isnan(a), np.isnan(x.max(-1)))
    np.testing.assert_array_equal(b, (x > 2.5).any(-1))
    close(c, x.var(-1), rtol=1e-10, atol=0)


@case("empty inputs and an empty reduction's error")
def _():
    x = np.zeros((3, 0), np.float32)
    _, (s,) = run(lambda g, u: [g.call("sum", u, axis=-1)], x)
    np.testing.assert_array_equal(s, np.zeros(3, np.float32))
    try:
        run(lambda g, u: [g.call("amax", u, axis=-1)], x)
    except ValueError as e:
        assert "zero-size array" in str(e)
    else:
        raise AssertionError("amax over an empty axis did not raise")


@case("an extern between two segments; a constant output")
def _():
    x = rng.standard_normal(100).astype(np.float32)
    g = Graph()
    u = g.input("float32", 1)
    e = g.extern(lambda t: (t * 2).as_subclass(EmuCuda), g.call("exp", u))
    g.output(g.call("add", e, 1.0), g.constant(3.0))
    f = g.compile()
    y, c = f(dev(x))
    close(host(y), np.exp(x) * 2 + 1, rtol=1e-6)
    assert isinstance(c, EmuCuda) and float(c) == 3.0


@case("one graph on the CPU and on the device: a plan each, both right")
def _():
    g = Graph()
    u = g.input("float32", 1)
    g.output(g.call("tanh", u))
    f = g.compile()
    x = rng.standard_normal(999).astype(np.float32)
    (a,) = f(x)
    n = len(f.kernels)
    (b,) = f(dev(x))
    (c,) = f(x)
    assert len(f.kernels) == n + 1
    close(host(b), np.tanh(x), rtol=2e-6)
    np.testing.assert_array_equal(a, c)


@case("float32 gelu and gelu_grad: the device's text is the CPU's (fc_math_common.h)")
def _():
    # CUDA runs the CPU's erfc (rational function times an inline exp) with fmaf and a
    # correctly rounded P / Q, so with FMA on the CPU the two agree bit for bit (here the
    # emulation's division is exact; the device's rcp-based one equals it on gelu's range)
    x = np.concatenate(
        [
            rng.standard_normal(4000) * 4,
            np.linspace(-16, 16, 3001),
            [0.0, -0.0, 1e-30, -1e-30, 14.5, -14.5, 40.0, -40.0],
        ]
    ).astype(np.float32)
    for op in ("gelu", "gelu_grad"):
        g = Graph()
        u = g.input("float32", 1)
        g.output(g.call(op, u))
        f = g.compile()
        (cpu,) = f(x)
        (cu,) = f(dev(x))
        cu = host(cu)
        if " fma" in open("/proc/cpuinfo").read() or "fphp" in open("/proc/cpuinfo").read():
            np.testing.assert_array_equal(cu, cpu, err_msg=op)  # -0 and +0 alike, NaN by position
        else:  # an x86-64 without FMA: the CPU's kernel rounds each product
            close(cu, cpu, rtol=4e-6, atol=1e-37, what=op)


@case("errors: two kinds of argument, a foreign array for a kernel")
def _():
    g = Graph()
    u, v = g.input("float32", 1), g.input("float32", 1)
    g.output(g.call("add", u, v))
    f = g.compile()
    x = np.ones(4, np.float32)
    # (a CPU tensor is no EmuCuda here: TypeError; with torch's own CUDA, ValueError)
    for bad, exc in ((x, TypeError), (torch.ones(4), (TypeError, ValueError))):
        try:
            f(dev(x), bad)
        except exc as e:
            assert "one device" in str(e), e
        else:
            raise AssertionError("a %s beside a CUDA tensor was accepted" % type(bad).__name__)
    try:
        f(dev(x), dev(x.astype(np.float64)))
    except TypeError as e:
        assert "declared float32" in str(e)
    else:
        raise AssertionError("a float64 tensor for a float32 input was accepted")


@case("a kernel over the 4096-byte launch parameter limit raises before it compiles")
def _():
    xs = [np.ones((1,) * 15 + (3,), np.float32) for _ in range(17)]

    def build(g, *us):
        acc = us[0]
        for u in us[1:]:
            acc = g.call("add", acc, u)
        return [acc]

    try:
        run(build, *xs)
    except NotImplementedError as e:
        assert "4096" in str(e) and "split the graph" in str(e), e
    else:
        raise AssertionError("18 operands over 16 dims launched")


@case("no references leak: inputs, outputs, extern results, constants, across many calls")
def _():
    import gc

    g = Graph()
    u, v = g.input("float32", 1), g.input("float32", 1)
    e = g.extern(lambda t: (t + 1).as_subclass(EmuCuda), g.call("mul", u, v))
    g.output(g.call("exp", e), g.constant(2.0), u)
    f = g.compile()
    a, b = dev(np.ones(8, np.float32)), dev(np.ones(8, np.float32))
    f(a, b)
    gc.collect()
    ra, rb = sys.getrefcount(a), sys.getrefcount(b)
    live = sum(isinstance(o, torch.Tensor) for o in gc.get_objects())
    for _ in range(200):
        y, c, same = f(a, b)
        assert same is a
    del y, c, same
    gc.collect()
    assert (sys.getrefcount(a), sys.getrefcount(b)) == (ra, rb)
    assert sum(isinstance(o, torch.Tensor) for o in gc.get_objects()) <= live + 2


@case("profile(): CUDA kernels counted with their elements and bytes, not timed")
def _():
    x = rng.standard_normal((64, 100)).astype(np.float32)
    g = Graph()
    u = g.input("float32", 2)
    g.output(g.call("sum", g.call("exp", u), axis=1))
    f = g.compile()
    a = dev(x)
    f(a)
    with fastcompile.profile() as prof:
        for _ in range(3):
            (s,) = f(a)
    close(host(s), np.exp(x).sum(axis=1), rtol=1e-5)
    rows = {(r.kind, r.name): r for r in prof.rows}
    (k,) = f.kernels
    r = rows[("cuda", k.name)]
    assert (r.calls, r.ns, r.elements, r.bytes) == (3, 0, 3 * x.size, 3 * (x.nbytes + 64 * 4)), r
    assert r.path == k.path and rows[("call", f.origin)].calls == 3
    assert "1 CUDA kernel launch" not in str(prof) and "3 CUDA kernel launches counted" in str(prof)


print("EMULATED OK %d" % n_ok)
