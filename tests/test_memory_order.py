"""Results in their inputs' memory order (plan.c dense_perm, fuse.c alloc_order): a segment
whose rank-4/5 inputs are dense in torch's channels_last order allocates its results of that
rank in that order, walks its strided kernels in it (loop_perm) and runs flat where every
operand shares it; inputs that disagree keep C order. The order is a plan-key component.
Tolerances: elementwise float32 math against NumPy, rtol 1e-6 (assert_close_np's default)."""

import numpy as np
import pytest

import fastcompile
from fastcompile.graph import Graph

from conftest import assert_close_np


def channels_last(shape, rng, dtype=np.float32):
    """A C-ordered (N, H, W, C) block seen as (N, C, H, W): torch's channels_last."""
    n, c = shape[0], shape[1]
    rest = shape[2:]
    block = rng.standard_normal((n,) + rest + (c,)).astype(dtype)
    axes = (0, len(shape) - 1) + tuple(range(1, len(shape) - 1))
    return block.transpose(axes)


def is_channels_last(a):
    axes = (0,) + tuple(range(2, a.ndim)) + (1,)
    return a.transpose(axes).flags.c_contiguous and not a.flags.c_contiguous


def scale_shift_relu():
    g = Graph()
    x, s, b, r = g.input("float32", 4), g.input("float32", 3), g.input("float32", 3), g.input("float32", 4)
    y = g.call("add", g.call("add", g.call("mul", x, s), b), r)
    g.output(g.call("relu", y), g.call("exp", x))
    return g.compile()


def flat(f):
    return [" [flat]" in k.fused for k in f.kernels]


@pytest.mark.parametrize("c", [3, 16, 64])
def test_channels_last_results_keep_the_order(c):
    rng = np.random.default_rng(c)
    x, r = channels_last((2, c, 5, 7), rng), channels_last((2, c, 5, 7), rng)
    s, b = rng.standard_normal((c, 1, 1), dtype=np.float32), rng.standard_normal((c, 1, 1), dtype=np.float32)
    x[0, 1, 2, 3] = np.nan
    f = scale_shift_relu()
    y, e = f(x, s, b, r)
    assert_close_np(y, np.maximum(x * s + b + r, 0))
    assert_close_np(e, np.exp(x), kind="transcendental")
    assert is_channels_last(y) and is_channels_last(e)
    # exp reads x alone (flat, in memory order); the broadcast scale walks (N, H, W, C)
    assert f.nplans == 1 and len(f.kernels) >= 1


def test_channels_last_flat_kernel_and_3d():
    rng = np.random.default_rng(0)
    g = Graph()
    x, y = g.input("float32", 5), g.input("float32", 5)
    g.output(g.call("mul", g.call("sin", x), y))
    f = g.compile()
    a, b = channels_last((2, 4, 3, 5, 6), rng), channels_last((2, 4, 3, 5, 6), rng)
    (out,) = f(a, b)
    assert_close_np(out, np.sin(a.astype(np.float64)) * b, dtype=np.float32, kind="transcendental")
    assert is_channels_last(out)
    assert flat(f) == [True], [k.fused for k in f.kernels]


@pytest.mark.parametrize("other", ["c_order", "strided"])
def test_disagreeing_inputs_keep_c_order(other):
    """A full-size input of the same rank in C order (or strided) beside a channels_last one:
    the results stay C order (no order wins)."""
    rng = np.random.default_rng(1)
    a = channels_last((2, 8, 4, 4), rng)
    b = rng.standard_normal((2, 8, 4, 4), dtype=np.float32)
    if other == "strided":
        b = rng.standard_normal((2, 8, 4, 8), dtype=np.float32)[..., ::2]
    g = Graph()
    x, y = g.input("float32", 4), g.input("float32", 4)
    g.output(g.call("add", x, y))
    (out,) = g.compile()(a, b)
    assert_close_np(out, a + b)
    assert out.flags.c_contiguous


def test_an_expanded_input_does_not_disagree():
    """A full-size input that is an expanded view (zero strides, as the gradient of a global
    average pool, (N, C) expanded to (N, C, H, W), in a CNN's backward) has no order of its own:
    beside a channels_last input the results are channels_last, as torch's are: were it to make
    the segment C order, each later kernel would transpose."""
    rng = np.random.default_rng(3)
    a = channels_last((2, 8, 4, 6), rng)
    gp = rng.standard_normal((2, 8, 1, 1), dtype=np.float32)
    for b in (
        np.broadcast_to(gp, (2, 8, 4, 6)),  # zero strides in H, W
        np.broadcast_to(rng.standard_normal((2, 8, 4, 1), dtype=np.float32), (2, 8, 4, 6)),
    ):
        g = Graph()
        x, y = g.input("float32", 4), g.input("float32", 4)
        g.output(g.call("mul", g.call("add", x, y), x))
        (out,) = g.compile()(a, b)
        assert_close_np(out, (a + b) * a)
        assert is_channels_last(out), out.strides


def test_other_dense_orders_keep_c_order():
    """Only channels_last carries over: a transposed matrix or an attention-style transposed
    rank-4 view gives C-ordered results, as an explicit copy of it wants."""
    rng = np.random.default_rng(2)
    g = Graph()
    x = g.input("float32", 2)
    g.output(g.call("exp", x))
    (out,) = g.compile()(rng.standard_normal((30, 20), dtype=np.float32).T)
    assert out.flags.c_contiguous
    g = Graph()
    x = g.input("float32", 4)
    g.output(g.call("exp", x))
    a = rng.standard_normal((2, 5, 3, 4), dtype=np.float32).transpose(0, 2, 1, 3)
    (out,) = g.compile()(a)
    assert_close_np(out, np.exp(a), kind="transcendental")
    assert out.flags.c_contiguous


def test_size_one_dims_and_reductions():
    """Size-1 dims may sit anywhere in a channels_last block (N = 1, W = 1); a keepdims
    reduction of a channels_last input is right whatever its layout."""
    rng = np.random.default_rng(3)
    for shape in [(1, 6, 4, 5), (3, 6, 4, 1)]:
        a = channels_last(shape, rng)
        g = Graph()
        x = g.input("float32", 4)
        m = g.call("mean", x, axis=(2, 3), keepdims=True)
        g.output(g.call("sub", x, m), m)
        d, mm = g.compile()(
            a,
        )
        assert_close_np(mm, a.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
        assert_close_np(d, a - a.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


def test_memory_order_is_a_plan_key_component(tmp_path):
    """Same shape, same dtype, both not C-contiguous: a strided input and a channels_last one
    select different plans (flipping the order misses)."""
    old = fastcompile.config.get("cache_dir")
    fastcompile.config.set(cache_dir=str(tmp_path))
    try:
        g = Graph()
        x = g.input("float32", 4)
        g.output(g.call("exp", x))
        f = g.compile()
        rng = np.random.default_rng(4)
        strided = rng.standard_normal((2, 3, 4, 10), dtype=np.float32)[..., ::2]
        f(strided)
        assert f.nplans == 1
        cl = channels_last((2, 3, 4, 5), rng)
        (out,) = f(cl)
        assert f.nplans == 2, "flipping the memory order must build a new plan"
        assert is_channels_last(out)
        assert_close_np(out, np.exp(cl), kind="transcendental")
    finally:
        fastcompile.config.set(cache_dir=old)
        fastcompile.cache_clear(disk=False)


# ----------------------------------------------------------------------------------------------
# torch: channels_last tensors through both frontends keep eager's layouts
# ----------------------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed: the torch frontends are not tested")


@pytest.mark.parametrize("frontend", ["backend", "fc.compile"])
def test_torch_channels_last_outputs_have_eager_strides(frontend):
    """Every output has eager's strides: channels_last where eager's is (the core's own result,
    no copy), C order where eager's is (.contiguous(): the backend copies it back to eager's
    layout at each call, _layout's check), and values as eager's."""
    torch = _torch()
    torch.manual_seed(0)
    x = torch.randn(2, 16, 6, 5).contiguous(memory_format=torch.channels_last)
    s, b = torch.randn(16, 1, 1), torch.randn(16, 1, 1)

    def fn(x):
        y = torch.relu(x * s + b)
        return y, (y * 2).contiguous(), y.sum((2, 3), keepdim=True), torch.sigmoid(x) + y

    if frontend == "backend":
        from fastcompile.backends import torch as fbt

        torch._dynamo.reset()
        cf = torch.compile(fn, backend=fbt.backend, dynamic=False)
    else:
        cf = fastcompile.compile(fn)
    for _ in range(2):
        outs, refs = cf(x), fn(x)
        for o, r in zip(outs, refs):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
            if frontend == "backend":
                nontrivial = [d for d in range(o.dim()) if o.shape[d] > 1]
                assert [o.stride(d) for d in nontrivial] == [r.stride(d) for d in nontrivial], (o.stride(), r.stride())
    assert outs[0].is_contiguous(memory_format=torch.channels_last) and not outs[0].is_contiguous()
    assert outs[1].is_contiguous() or frontend == "fc.compile"


def _resnet_pair(torch, c=16, inplace=False):
    """Two ResNet basic blocks (convolution, BatchNorm in eval, ReLU, convolution, BatchNorm,
    residual add, ReLU; inplace: torch.relu_ and +=, as torchvision writes them) and a max pool,
    with random running statistics."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

        def forward(self, x):
            if inplace:
                y = torch.relu_(self.b1(self.c1(x)))
                y = self.b2(self.c2(y))
                y += x
                return torch.relu_(y)
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + x)

    m = nn.Sequential(Block(), Block(), nn.MaxPool2d(2))
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-1, 1)
            mod.running_var.uniform_(0.5, 2)
    return m


def test_torch_channels_last_cnn_matches_eager():
    """ResNet-style blocks in channels_last (convolutions, BatchNorm in eval, in-place ReLU, a
    residual +=) through both frontends: eager's values and output layout."""
    torch = _torch()
    from fastcompile.backends import torch as fbt

    torch.manual_seed(0)
    m = _resnet_pair(torch, inplace=True).eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 8, 8).contiguous(memory_format=torch.channels_last)
    torch._dynamo.reset()
    with torch.no_grad():
        ref = m(x)
        for cf in (torch.compile(m, backend=fbt.backend, dynamic=False), fastcompile.compile(m)):
            for _ in range(2):
                out = cf(x)
                torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
                assert out.is_contiguous(memory_format=torch.channels_last)


def test_values_not_computed_from_channels_last_inputs_stay_c_order():
    """In a segment with a channels_last input, a full-size value computed from broadcast
    per-channel and per-pixel inputs only is C-ordered (as torch lays it out), while one computed
    from the channels_last input keeps that order."""
    rng = np.random.default_rng(5)
    a = channels_last((2, 6, 4, 5), rng)
    m = rng.standard_normal((1, 6, 1, 1), dtype=np.float32)
    q = rng.standard_normal((2, 1, 4, 5), dtype=np.float32)
    g = Graph()
    x, mm, qq = g.input("float32", 4), g.input("float32", 4), g.input("float32", 4)
    g.output(g.call("mul", mm, qq), g.call("add", x, mm))
    outer, shifted = g.compile()(a, m, q)
    assert_close_np(outer, m * q)
    assert_close_np(shifted, a + m)
    assert outer.flags.c_contiguous and is_channels_last(shifted)


def test_inference_convolutions_run_channels_last(monkeypatch):
    """torch.compile(backend=fastcompile) of an NCHW CNN in inference: the graph input a
    convolution reads is made channels_last once on entry, every convolution gets channels_last
    input and weight (oneDNN's fast path), the kernels between them keep that order (the residual
    add reads the converted input), and the one output comes back in eager's NCHW layout (the only
    relayout copy per call). Values as eager's."""
    torch = _torch()
    import functools
    from fastcompile.backends import torch as fbt

    torch.manual_seed(0)
    m = _resnet_pair(torch).eval()
    x = torch.randn(2, 16, 8, 8)
    copies = []
    real = fbt.channels_last._restride
    for where in (fbt.externs, fbt.runner):  # the modules whose generated code calls it
        monkeypatch.setattr(where, "_restride", lambda *a, **k: copies.append(tuple(a[0].shape)) or real(*a, **k))
    record = []
    torch._dynamo.reset()
    cf = torch.compile(m, backend=functools.partial(fbt.backend, record=record), dynamic=False)
    with torch.no_grad():
        ref = m(x)
        for _ in range(3):
            out = cf(x)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
            assert out.stride() == ref.stride()
    (runner,) = record
    assert runner.channels_last and runner.fallback is None and len(runner._cl_args) == 1
    assert copies == [(2, 16, 4, 4)] * 3, copies
    # not even a channels_last input's own copy goes back: the first convolution reads it as is
    xc = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(cf(xc), ref, rtol=1e-4, atol=1e-4)


def _sgd_pair_step(torch, out, ref, mod, x, opt_ref, opt):
    """The compiled model's output `out` and eager `ref` on x: backward of the mean square,
    gradients compared, one SGD step each."""
    out.square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(ref.parameters(), mod.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4)
    for o in (opt, opt_ref):
        o.step()
        o.zero_grad()


@pytest.mark.parametrize(
    "inplace,frontend", [(False, "torch.compile"), (True, "torch.compile"), (False, "fastcompile.compile")]
)
def test_training_graphs_run_convolutions_channels_last(monkeypatch, inplace, frontend):
    """A training step of an NCHW CNN (BatchNorm in training, residual adds, a max pool) through
    torch.compile(backend=fastcompile): forward and backward graphs run their convolutions (and
    the convolutions' backward) channels_last, as Inductor does on the CPU (oneDNN's
    channels_last kernels: 2-3x faster at 32 channels). The rank-4 values the forward saves for
    the backward come back channels_last and the backward expects them so: per step the only
    activation-sized relayout copy is the output the user sees, and the backward's first call
    builds no plan the batch compile had not (its layouts were predicted). Gradients, updated
    parameters and running statistics as eager's over three SGD steps. fastcompile.compile's
    training graphs (autograd mode) take the same route."""
    torch = _torch()
    import copy
    import fastcompile
    from fastcompile.backends import torch as fbt

    torch.manual_seed(0)
    base = _resnet_pair(torch, c=8, inplace=inplace).train()
    ref, mod = copy.deepcopy(base), copy.deepcopy(base)
    copies = []
    real = fbt.channels_last._restride
    for where in (fbt.externs, fbt.runner):  # the modules whose generated code calls it
        monkeypatch.setattr(where, "_restride", lambda *a, **k: copies.append(tuple(a[0].shape)) or real(*a, **k))
    record = []
    real_lower = fbt.fx_to_graph
    monkeypatch.setattr(fbt.compile_fx, "fx_to_graph", lambda *a, **k: record.append(real_lower(*a, **k)) or record[-1])
    torch._dynamo.reset()
    fastcompile.reset()
    cf = (
        torch.compile(mod, backend=fbt.backend, dynamic=False)
        if frontend == "torch.compile"
        else fastcompile.compile(mod)
    )
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    x = torch.randn(2, 8, 8, 8)
    for step in range(3):
        del copies[:]
        out = cf(x)
        if step == 0:
            runners = [r for r in record if r.compiled is not None]
            plans = [r.compiled.nplans for r in runners]
        _sgd_pair_step(torch, out, ref, mod, x, opt_ref, opt)
        for p, q in zip(ref.state_dict().values(), mod.state_dict().values()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-4)
        assert [c for c in copies if c[0] == 2] == [(2, 8, 4, 4)], copies
    fw, bw = runners
    assert fw.channels_last and bw.channels_last and fw.fallback is None and bw.fallback is None
    assert fw.cl_outputs and bw.cl_inputs == fw.cl_outputs
    assert [r.compiled.nplans for r in runners] == plans


def test_training_step_converts_the_input_and_weights_to_channels_last_once(monkeypatch):
    """A training step of an NCHW CNN whose first layer is a convolution: the forward's
    channels_last copy of the input goes to the backward's convolution_backward (which read the
    same saved input and converted it again), and each weight is converted once between
    optimizer steps, not once per graph. The next step converts again (a copy is handed over
    once, never reused across steps, though the input is the same tensor). Gradients as eager's."""
    torch = _torch()
    import copy
    import fastcompile
    from fastcompile.backends import torch as fbt

    torch.manual_seed(0)
    nn = torch.nn
    base = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
    ).train()
    ref, mod = copy.deepcopy(base), copy.deepcopy(base)
    conversions = []
    real = fbt.channels_last._to_channels_last

    def counted(t):
        r = real(t)
        if r.data_ptr() != t.data_ptr():  # a copy, not the tensor itself
            conversions.append(tuple(t.shape))
        return r

    for where in (fbt.channels_last, fbt.externs, fbt.runner):  # each module that calls it
        monkeypatch.setattr(where, "_to_channels_last", counted)
    torch._dynamo.reset()
    fastcompile.reset()
    cf = torch.compile(mod, backend=fbt.backend, dynamic=False)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    x = torch.randn(2, 4, 6, 6)
    for step in range(4):
        del conversions[:]
        _sgd_pair_step(torch, cf(x), ref, mod, x, opt_ref, opt)
        if step:  # the first step compiled (its stand-ins convert too)
            # the input and each weight once; the backward's incoming gradient (eager's NCHW)
            assert sorted(conversions) == sorted([(2, 4, 6, 6), (8, 4, 3, 3), (8, 8, 3, 3), (2, 8, 6, 6)]), conversions
    assert not fbt.channels_last._CL_HANDOFF.entries


@pytest.mark.parametrize("train", [False, True], ids=["eval", "bn_train"])
@pytest.mark.parametrize("fx_fails", [False, True], ids=["aot", "core_fallback"])
def test_fastcompile_compile_no_grad_cnn_goes_the_aot_route(monkeypatch, train, fx_fails):
    """fastcompile.compile of a module holding convolutions, called under no_grad, is traced in
    autograd mode (aot_autograd's inference graph, as torch.compile(backend=fastcompile)): its
    convolutions run channels_last and BatchNorm is decomposed into our kernels (the core route
    calls each Conv2d/BatchNorm forward as an opaque extern, NCHW). BatchNorm in training mode
    updates its running statistics once per call, as eager. Where autograd mode cannot trace the
    frame (fx_fails: made to fail here), the frame is traced the core way: same values, no graph
    break."""
    torch = _torch()
    import copy
    import fastcompile
    from fastcompile.backends import torch as fbt
    from fastcompile.trace import interp
    from fastcompile.trace.variables import Unsupported

    torch.manual_seed(0)
    base = _resnet_pair(torch, c=8).train(train)
    ref, mod = copy.deepcopy(base), copy.deepcopy(base)
    record = []
    real_lower = fbt.fx_to_graph
    monkeypatch.setattr(fbt.compile_fx, "fx_to_graph", lambda *a, **k: record.append(real_lower(*a, **k)) or record[-1])
    if fx_fails:

        def refuse(self, *a, **k):
            raise Unsupported("refused by the test", [])

        monkeypatch.setattr(interp.Tracer, "fx_module_call", refuse)
    torch._dynamo.reset()
    fastcompile.reset()
    cf = fastcompile.compile(mod)
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(2, 8, 8, 8)
            torch.testing.assert_close(cf(x), ref(x), rtol=1e-4, atol=1e-4)
            for p, q in zip(ref.state_dict().values(), mod.state_dict().values()):
                torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-4)
    assert int(mod[0].b1.num_batches_tracked) == int(ref[0].b1.num_batches_tracked) == (3 if train else 0)
    entries = fastcompile._C.code_entries(type(mod).forward.__code__)
    assert entries and all(not e.info.result.breaks for e in entries)
    runners = [r for r in record if r.compiled is not None]
    if fx_fails:
        assert not runners  # the core route: no aot_autograd graph
        return
    assert len(runners) == 1, runners
    (fw,) = runners
    assert fw.inference and fw.channels_last and fw.fallback is None
    assert fw.compiled.kernels  # BatchNorm + ReLU + residual add: our kernels


@pytest.mark.parametrize(
    "rows,length,dtype",
    [
        (256, 16, "float32"),
        (70, 3, "float64"),
        (257, 16, "float32"),
        (96, 40, "int32"),
        (64, 63, "float32"),
        (512, 1, "float32"),
    ],
)
def test_short_rows_with_a_broadcast_row(rows, length, dtype):
    """A pointwise launch of short rows where an input is the same row for every row (a bias, a
    channels_last per-channel scale) runs as longer rows over a repeated copy of that row
    (plan.c, tile_short_rows); rows that no tile size divides (257) and rows of 64 or more run
    as they are. Values as NumPy's, every case."""
    rng = np.random.default_rng(rows + length)
    x = (rng.standard_normal((rows, length)) * 10).astype(dtype)
    b = (rng.standard_normal((length,)) * 10).astype(dtype)
    y = (rng.standard_normal((rows, length)) * 10).astype(dtype)
    if dtype != "int32":
        x[3 % rows, 0] = np.nan
    g = Graph()
    xx, bb, yy = g.input(dtype, 2), g.input(dtype, 1), g.input(dtype, 2)
    g.output(g.call("add", g.call("mul", xx, bb), yy), g.call("sub", bb, xx))
    f = g.compile()
    for _ in range(2):
        s, d = f(x, b, y)
        assert_close_np(s, x * b + y)
        assert_close_np(d, b - x)


def test_a_backward_without_convolutions_takes_channels_last_values(monkeypatch):
    """A frozen first convolution (no convolution_backward in the backward graph) still hands
    its channels_last activations to the backward, which then runs channels_last too (its
    externs get eager's layout where they read strides): gradients as eager's, and no plan
    built at the backward's first call."""
    torch = _torch()
    import copy
    from fastcompile.backends import torch as fbt

    nn = torch.nn
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 64, 4),
    )
    m[0].requires_grad_(False)
    ref = copy.deepcopy(m)
    record = []
    real_lower = fbt.fx_to_graph
    monkeypatch.setattr(fbt.compile_fx, "fx_to_graph", lambda *a, **k: record.append(real_lower(*a, **k)) or record[-1])
    torch._dynamo.reset()
    cf = torch.compile(m, backend=fbt.backend, dynamic=False)
    x = torch.randn(4, 8, 16, 16)
    for step in range(2):
        out = cf(x)
        if step == 0:
            plans = [r.compiled.nplans for r in record]
        out.square().mean().backward()
        ref(x).square().mean().backward()
        for (n, p), q in zip(ref.named_parameters(), m.parameters()):
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=n)
    fw, bw = record
    assert not any(n.target is torch.ops.aten.convolution_backward.default for n in bw.gm.graph.nodes)
    assert fw.cl_outputs and bw.cl_inputs == fw.cl_outputs and bw.channels_last
    assert [r.compiled.nplans for r in record] == plans
