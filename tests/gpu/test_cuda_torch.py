"""CUDA against torch eager on CUDA: graph API ops in float16/bfloat16, the torch.compile backend
and fastcompile.compile on the torch issue's models (forward and one training step), a graph
moved between CPU and CUDA, streams, and the errors a user meets."""

import copy
import functools
import sys

import numpy as np
import pytest

import cudahelp
import fastcompile
from fastcompile.graph import Graph

pytestmark = cudahelp.SKIP
torch = cudahelp.torch
F = torch.nn.functional
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.dirname(__file__)))
import torchhelp as tb  # noqa: E402  (the models and the SGD step of the CPU tests)
from fastcompile.backends import torch as fbt  # noqa: E402


def compiled(build, *dtypes_ndims):
    g = Graph()
    ins = [g.input(dt, nd) for dt, nd in dtypes_ndims]
    g.output(*build(g, *ins))
    return g.compile()


# ----------------------------------------------------------------------------------------------
# the graph API on CUDA tensors
# ----------------------------------------------------------------------------------------------

# against a float64 reference on the same inputs: the output's rounding, plus libdevice's few ULP
TOL_BY_DTYPE = {
    torch.float16: dict(rtol=2e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
    torch.float32: dict(rtol=1e-5, atol=1e-6),
}
CASES = {
    "gelu": (lambda g, x: [g.call("gelu", x)], lambda x: F.gelu(x)),
    "silu_mul": (
        lambda g, x: [g.call("mul", g.call("mul", x, g.call("sigmoid", x)), x)],
        lambda x: x * torch.sigmoid(x) * x,
    ),
    "softmax": (lambda g, x: [g.call("softmax", x, axis=-1)], lambda x: torch.softmax(x, -1)),
    "sum": (lambda g, x: [g.call("sum", x, axis=-1)], lambda x: x.sum(-1)),
    "amax": (lambda g, x: [g.call("amax", x, axis=0)], lambda x: x.amax(0)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("shape", [(1 << 20,), (97, 1031), (3, 0)])
def test_ops_against_torch_eager(case, dtype, shape):
    """Each op on CUDA tensors of each float dtype against torch eager computed in float64 on
    the same (rounded) inputs; the result keeps the input's dtype, as torch's does."""
    if case == "amax" and len(shape) == 1:
        shape = (5,) + shape
    build, ref = CASES[case]
    f = compiled(build, (str(dtype).replace("torch.", ""), len(shape)))
    x = torch.randn(shape, device="cuda").to(dtype)
    (y,) = f(x)
    want = ref(x.double())
    assert y.is_cuda and y.device == x.device and y.dtype == dtype and y.shape == want.shape
    torch.testing.assert_close(y.double(), want, **TOL_BY_DTYPE[dtype])


def test_layernorm_one_kernel_matches_torch():
    def build(g, x, w, b):
        mu = g.call("mean", x, axis=-1, keepdims=True)
        d = g.call("sub", x, mu)
        var = g.call("mean", g.call("mul", d, d), axis=-1, keepdims=True)
        y = g.call("mul", d, g.call("rsqrt", g.call("add", var, 1e-5)))
        return [g.call("add", g.call("mul", y, w), b)]

    f = compiled(build, ("float32", 2), ("float32", 1), ("float32", 1))
    x = torch.randn(4096, 4096, device="cuda")
    w, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    (y,) = f(x, w, b)
    torch.testing.assert_close(y, F.layer_norm(x, (4096,), w, b, 1e-5), rtol=1e-5, atol=1e-5)
    assert len(f.kernels) == 1


def test_strided_and_broadcast_inputs():
    f = compiled(lambda g, x, y: [g.call("add", g.call("exp", x), y)], ("float32", 2), ("float32", 2))
    base = torch.randn(300, 500, device="cuda")
    x = base.t()  # transposed
    y = torch.randn(1, 300, device="cuda").expand(500, 300)  # stride 0
    (z,) = f(x, y)
    torch.testing.assert_close(z, torch.exp(x) + y)
    (z2,) = f(x.contiguous(), y.contiguous())  # another layout: another plan, same values
    torch.testing.assert_close(z2, z)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("cap", [0, 3])
def test_vector_paths_aligned_misaligned_and_capped_grids(dtype, cap):
    """The flat kernels' vector loop and the reductions' vector rows against their scalar
    fallbacks on the device: views one element in (not 16-byte aligned), lengths that are not a
    multiple of a vector, rows at a misaligned pitch, a stride-0 input along the rows; with the
    default grid (one trip a thread, a block a row) and a grid of 3 blocks (every thread loops:
    config.cuda_max_grid). float32 and uint8 are exact against eager (no contraction, wrapping
    integers); bfloat16 against float64 on the same inputs, one rounding of the result."""
    name = str(dtype).replace("torch.", "")
    add = compiled(lambda g, x, y: [g.call("add", g.call("mul", x, x), y)], (name, 1), (name, 1))
    red = compiled(lambda g, x, m: [g.call("sub", x, m), g.call("amax", x, axis=-1)], (name, 2), (name, 2))
    base = (torch.randn(9001, device="cuda") * 8).to(dtype)
    rows = (torch.randn(37, 4097, device="cuda") * 8).to(dtype)
    m = rows[:, :1].clone()
    try:
        fastcompile.config.set(cuda_max_grid=cap)
        for off, n in ((0, 8192), (1, 8192), (0, 8999), (3, 4097)):
            x, y = base[off : off + n], base[off + 1 : off + 1 + n]
            (z,) = add(x, y)
            if dtype == torch.bfloat16:
                torch.testing.assert_close(z.double(), x.double() * x.double() + y.double(), rtol=4e-3, atol=1e-3)
            else:
                torch.testing.assert_close(z, x * x + y, rtol=0, atol=0)
        for x in (rows[:, :4096].contiguous(), rows[:, :4096], rows[:, 1:4001], rows[:, 1:38]):
            mm = m.expand(x.shape)
            d, mx = red(x, mm)
            torch.testing.assert_close(d, x - mm, rtol=0, atol=0)
            torch.testing.assert_close(mx, x.amax(-1), rtol=0, atol=0)
    finally:
        fastcompile.config.set(cuda_max_grid=0)


def test_64bit_indexing():
    """More than 2^31 elements: the kernel's int64 entry point."""
    if torch.cuda.get_device_properties(0).total_memory < 24 << 30:
        pytest.skip("needs 24 GiB of GPU memory")
    f = compiled(lambda g, x: [g.call("add", x, 1)], ("int8", 1))
    x = torch.zeros((1 << 31) + 7, dtype=torch.int8, device="cuda")
    (y,) = f(x)
    assert int(y[-1]) == 1 and int(y[0]) == 1 and int(y.sum(dtype=torch.int64)) == x.numel()
    del x, y
    torch.cuda.empty_cache()


def test_cpu_then_cuda_recompiles_and_stays_correct():
    """A jit.script pitfall: kernels keyed on shape but not on device. Here each device gets its
    own plan and both keep giving the right values, in any order."""
    f = compiled(lambda g, x: [g.call("tanh", x)], ("float32", 1))
    xc = np.linspace(-3, 3, 1000, dtype=np.float32)
    (a,) = f(xc)
    n_cpu = len(f.kernels)
    (b,) = f(torch.from_numpy(xc).cuda())
    assert b.is_cuda and len(f.kernels) == n_cpu + 1
    (c,) = f(xc)
    np.testing.assert_allclose(a, np.tanh(xc), rtol=2e-6)
    np.testing.assert_allclose(b.cpu().numpy(), np.tanh(xc), rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(c, a)
    assert len(f.kernels) == n_cpu + 1  # nothing rebuilt on the way back


def test_mixed_devices_raise_a_clear_error():
    f = compiled(lambda g, x, y: [g.call("add", x, y)], ("float32", 1), ("float32", 1))
    with pytest.raises(TypeError, match="one device"):
        f(torch.ones(3, device="cuda"), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="one device"):
        f(torch.ones(3, device="cuda"), torch.ones(3))
    (y,) = f(torch.ones(3, device="cuda"), torch.ones(3, device="cuda"))
    assert y.is_cuda and float(y.sum()) == 6.0


def test_cpu_tensor_for_an_extern_in_a_cuda_graph():
    """A CPU tensor may ride along in a CUDA call when only an extern reads it (an attention
    backward's RNG state): the extern gets it as it is."""
    g = Graph()
    x, s = g.input("float32", 1), g.input("float32", 0)
    e = g.extern(lambda a, b: a * b.item(), g.call("exp", x), s)
    g.output(g.call("add", e, 1.0))
    f = g.compile()
    x = torch.randn(1000, device="cuda")
    (y,) = f(x, torch.tensor(2.0))
    torch.testing.assert_close(y, torch.exp(x) * 2 + 1)


def test_side_stream_orders_with_torch():
    """Kernels run on torch's current stream: on a side stream, torch work before and after the
    call on that stream sees them in order."""
    f = compiled(lambda g, x: [g.call("mul", x, 2.0)], ("float32", 1))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones(1 << 24, device="cuda")
        x.add_(1)  # 2
        (y,) = f(x)  # 4
        y.add_(1)  # 5
    s.synchronize()
    assert float(y.min()) == 5.0 and float(y.max()) == 5.0


def test_cubin_disk_cache_hit():
    src = compiled(lambda g, x: [g.call("sin", x)], ("float32", 1))._cuda_render(np.zeros(8, np.float32))
    r1 = fastcompile._C._cuda_compile(src[0]["source"], None)
    r2 = fastcompile._C._cuda_compile(src[0]["source"], None)
    assert r2["cached"] and r2["key"] == r1["key"]


# ----------------------------------------------------------------------------------------------
# the torch backend and fastcompile.compile on the torch issue's models
# ----------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


GPU_MODELS = ["mlp", "transformer_block", "cnn_bn"]
TOL = dict(rtol=1e-4, atol=1e-4)


def _make(name):
    torch.manual_seed(0)
    cls, make = tb.MODELS[name]
    return cls().cuda(), make().cuda()


def _frontend(frontend, module, record):
    if frontend == "torch.compile":
        return torch.compile(module, backend=functools.partial(fbt.backend, record=record), dynamic=False)
    fastcompile.reset()
    return fastcompile.compile(module)


@pytest.mark.parametrize("frontend", ["torch.compile", "fastcompile.compile"])
@pytest.mark.parametrize("name", GPU_MODELS)
def test_model_forward_cuda(name, frontend):
    m, x = _make(name)
    m.eval()
    record = []
    cm = _frontend(frontend, m, record)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), **TOL)
        torch.testing.assert_close(cm(x), m(x), **TOL)
    if frontend == "torch.compile":
        assert record and all(r.fallback is None for r in record), [r.fallback for r in record]
        assert all(r.device == x.device for r in record)
        assert sum(r.core_ops for r in record) > 0 and any(r.kernels for r in record)


@pytest.mark.parametrize("frontend", ["torch.compile", "fastcompile.compile"])
@pytest.mark.parametrize("name", GPU_MODELS)
def test_model_training_step_cuda(name, frontend):
    ref, x = _make(name)
    ref.train()
    mod = copy.deepcopy(ref)
    record = []
    cm = _frontend(frontend, mod, record)
    (l0, g0, p0, b0), (l1, g1, p1, b1) = tb.sgd_steps(((ref, ref), (mod, cm)), x)
    torch.testing.assert_close(l1, l0, **TOL)
    for a, b in zip(g1 + p1 + b1, g0 + p0 + b0):
        torch.testing.assert_close(a, b, **TOL)
    if frontend == "torch.compile":
        kinds = {("bw" if any(n.name.startswith("tangents") for n in r.gm.graph.nodes) else "fw") for r in record}
        assert kinds == {"fw", "bw"}
        assert all(r.fallback is None for r in record), [r.fallback for r in record]
        assert sum(r.core_ops for r in record) > 0


def test_backend_bf16_autocast_cuda():
    m, x = _make("mlp")
    record = []
    cm = _frontend("torch.compile", m, record)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        torch.testing.assert_close(cm(x).float(), m(x).float(), rtol=2e-2, atol=2e-2)
    assert record and all(r.fallback is None for r in record)
