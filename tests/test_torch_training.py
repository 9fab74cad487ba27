"""nn models and eager's semantics through the torch backend: eager torch is the reference.

- nn models (MLP, CNN + BatchNorm, transformer block, a hand-written RNN loop): forward and one
  SGD training step match eager under torch.compile and fastcompile.compile; autocast bf16/fp16
  graphs match eager within torch's tolerances;
- fastcompile.compile's first call: statistics, random draws and side effects as eager's;
- aliasing and in-place semantics: copies, views, in-place updates and autograd as in eager.

Every test skips with a reason where torch is not importable (CI runs a Python without it).
"""

import copy
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch backend is not tested")

import numpy as np  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fastcompile  # noqa: E402
from fastcompile.backends import torch as fbt  # noqa: E402
from torchhelp import (  # noqa: E402
    MLP,
    MODELS,
    TOL,
    FRONTENDS,
    compile_fc,
    _fc_graphs,  # noqa: E402
    _frontend,
    _training_pair,
    sgd_steps,
)
from torchhelp import _reset_dynamo  # noqa: E402,F401  (autouse fixture)


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_forward(name, frontend):
    torch.manual_seed(0)
    cls, make = MODELS[name]
    m = cls().eval()
    x = make()
    record = []
    cm = _frontend(frontend, m, record)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), **TOL)
        torch.testing.assert_close(cm(x), m(x), **TOL)  # second call: cached graph
    if frontend == "fastcompile.compile":
        graphs, record = _fc_graphs(m)
        assert len(graphs) == 1, graphs  # the whole forward, no break
        compiled = graphs[0].compiled
        assert compiled is not None and compiled.kernels  # core kernels ran
        if not record:
            return  # the core graph route (no aot_autograd)
    assert record and all(r.fallback is None for r in record)
    assert sum(r.core_ops for r in record) > 0


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_training_step(name, frontend):
    """One SGD step: loss, gradients, updated parameters and BatchNorm running statistics match
    eager; forward and backward graphs both go through the core. fastcompile.compile traces the
    forward with its own tracer (autograd mode: torch ops recorded for aot_autograd)."""
    ref, mod, x = _training_pair(name)
    record = []
    cm = _frontend(frontend, mod, record)
    (l0, g0, p0, b0), (l1, g1, p1, b1) = sgd_steps(((ref, ref), (mod, cm)), x)
    torch.testing.assert_close(l1, l0, **TOL)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(p1, p0):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(b1, b0):  # BatchNorm running stats
        torch.testing.assert_close(a, b, **TOL)
    if frontend == "fastcompile.compile":
        graphs, record = _fc_graphs(mod)
        assert len(graphs) == 1 and isinstance(graphs[0].graph, torch.fx.Graph)
    kinds = {("bw" if any(n.name.startswith("tangents") for n in r.gm.graph.nodes) else "fw") for r in record}
    assert kinds == {"fw", "bw"}, "forward and backward graphs both go through the lowering"
    assert all(r.fallback is None for r in record)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast(dtype):
    torch.manual_seed(0)
    m = MLP().eval()
    x = torch.randn(16, 32)
    record = []
    cm = compile_fc(m, record=record)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        expected = m(x)
        actual = cm(x)
    assert actual.dtype == expected.dtype == dtype
    # eager rounds to bf16/fp16 after every op, we only where a value leaves the core
    torch.testing.assert_close(actual.float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert all(r.fallback is None for r in record) and sum(r.core_ops for r in record) > 0


def test_autocast_training_bf16():
    torch.manual_seed(0)
    ref = MLP()
    mod = copy.deepcopy(ref)
    x = torch.randn(16, 32)
    cm = compile_fc(mod)
    grads = []
    for model, run in ((ref, ref), (mod, cm)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run(x).float().square().mean()
        loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2)


def test_bf16_inputs():
    x = torch.randn(33, 17).to(torch.bfloat16)
    f = compile_fc(lambda x: torch.softmax(x * 2, -1) + 1)
    out = f(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, torch.softmax(x * 2, -1) + 1)


def test_fc_compile_first_call_updates_norm_statistics_once():
    """fastcompile.compile on a training module whose BatchNorm/InstanceNorm runs before its first
    parameter: the first call updates the running statistics once, as eager does, though the
    tracer runs the norm, meets the parameter and traces again for autograd."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.BatchNorm1d(4), nn.Tanh(), nn.InstanceNorm1d(4, track_running_stats=True), nn.Linear(6, 2))
    eager, ours = copy.deepcopy(base).train(), copy.deepcopy(base).train()
    compiled = fastcompile.compile(ours)
    for k in range(3):
        x = torch.randn(5, 4, 6) + k
        torch.testing.assert_close(compiled(x), eager(x))
        for (name, b1), (_, b2) in zip(eager.named_buffers(), ours.named_buffers()):
            torch.testing.assert_close(b2, b1, msg=lambda m: "call %d, %s: %s" % (k, name, m))


def test_fc_compile_first_call_draws_what_eager_draws():
    """A module wrapping nn.MultiheadAttention(dropout=0.1) in training: with one seed, the first
    compiled call draws the dropout masks eager draws, and leaves the generator where eager does
    (the trace's example computation must not draw them a first time)."""

    class W(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = nn.MultiheadAttention(16, 4, dropout=0.1, batch_first=True)

        def forward(self, x):
            return self.m(x, x, x, need_weights=False)[0]

    torch.manual_seed(0)
    m = W()
    mc = fastcompile.compile(copy.deepcopy(m))
    x = torch.randn(2, 5, 16)
    for k in range(2):
        torch.manual_seed(1)
        a, ra = m(x), torch.rand(3)
        torch.manual_seed(1)
        b, rb = mc(x), torch.rand(3)
        torch.testing.assert_close(b, a, msg=lambda s: "call %d: %s" % (k, s))
        torch.testing.assert_close(rb, ra, rtol=0, atol=0)


def test_fc_compile_checkpoint_of_a_submodule_trains():
    """torch.utils.checkpoint(block, x, use_reentrant=False) inside forward, block a custom module
    with a LayerNorm: the block is traced in line and the gradients are eager's. aot_autograd
    traced the checkpoint call itself, and backward raised CheckpointError (its recomputation
    saved other tensors than the forward had)."""
    import torch.utils.checkpoint as cp

    class Blk(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.n, self.l2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 8)

        def forward(self, x):
            return self.l2(torch.tanh(self.n(self.l1(x))))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Blk()

        def forward(self, x):
            return cp.checkpoint(self.a, x, use_reentrant=False) * 2

    torch.manual_seed(0)
    m = M()
    mc = copy.deepcopy(m)
    compiled = fastcompile.compile(mc)
    for k in range(2):
        x = torch.randn(6, 8) + k
        m(x).square().sum().backward()
        compiled(x).square().sum().backward()
        for (name, p), q in zip(m.named_parameters(), mc.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=lambda s: "%s: %s" % (name, s))


def test_fastcompile_compile_first_call_keeps_views_of_kernel_outputs_and_refuses_out():
    """The first call answers externs from the trace, except one whose result views an argument
    (z = y[0]): it runs again on the kernels' output, so the in-place y += 1 after the graph break
    reaches z as in eager. torch.add(x, 1, out=c) breaks the graph before the trace writes c (an
    add that never writes c would give calls after the first stale values)."""
    import fastcompile

    def view_then_update(x):
        y = x * 2
        z = y[0]
        y += 1
        return z

    def add_out(x, c):
        torch.add(x, 1, out=c)
        return c * 2

    for fn in (view_then_update, add_out):
        fastcompile.reset()
        cf = fastcompile.compile(fn)
        for _ in range(3):
            x = torch.randn(4, 3)
            args = (x,) if fn is view_then_update else (x, torch.empty(4, 3))
            want_args = tuple(a.clone() for a in args)
            torch.testing.assert_close(cf(*args), fn(*want_args))
            for a, b in zip(args, want_args):
                torch.testing.assert_close(a, b)


def _tstep(x, lr, mom):
    return x * lr + (x * mom).relu() - lr * 0.5


def test_fc_compile_floats_are_read_at_each_call_with_torch_dtypes():
    """fastcompile.compile on torch code: a Python float is read at each call (no new trace per
    value), with torch's result dtypes (float32 and float16 stay, an int64 tensor gives float32);
    a NumPy float scalar is baked in (torch takes it as a Python scalar, NumPy strongly typed)."""
    from fastcompile import _C

    f = fastcompile.compile(_tstep)
    for dtype in (torch.float32, torch.float16, torch.int64):
        fastcompile.reset()
        x = (torch.arange(-6, 6)).to(dtype)
        for lr, mom in [(0.1, 0.9), (0.01, 0.5), (3.5, -1.0), (1e-4, 0.0)]:
            got, want = f(x, lr, mom), _tstep(x, lr, mom)
            assert got.dtype == want.dtype
            # float16: eager rounds between ops, a kernel keeps float32 (README): torch's tolerances
            exact = {} if dtype == torch.float16 else {"rtol": 0, "atol": 0}
            torch.testing.assert_close(got, want, **exact)
        assert len(_C.code_entries(_tstep.__code__)) == 1, dtype
    x = torch.linspace(-1, 1, 7)
    for s in (np.float64(0.1), np.float64(0.2)):
        got, want = f(x, s, 0.5), _tstep(x, s, 0.5)
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(_C.code_entries(_tstep.__code__)) == 3


def _alpha_step(p, g, lr):
    return p.add(g, alpha=-lr), torch.sub(p, g, alpha=lr * 2), torch.add(p, g, alpha=3)


def test_fc_compile_add_with_alpha_reads_the_float_at_each_call():
    """p.add(g, alpha=-lr) (torch.optim's SGD form) is a + b * alpha in the graph, so a decaying
    learning rate is one trace, not one per value; float32/float64 within one rounding of
    torch's fused a + alpha * b, integers exact; a float alpha with integer tensors raises as
    in eager."""
    from fastcompile import _C

    f = fastcompile.compile(_alpha_step)
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64):
            fastcompile.reset()
            p, g = torch.randn(257, dtype=dtype), torch.randn(257, dtype=dtype)
            for k in range(6):
                lr = 0.1 * 0.9**k
                for got, want in zip(f(p, g, lr), _alpha_step(p, g, lr)):
                    assert got.dtype == want.dtype
                    torch.testing.assert_close(got, want)
            assert len(_C.code_entries(_alpha_step.__code__)) == 1, dtype
        p, g = torch.arange(-4, 4), torch.arange(8)
        for got, want in zip(f(p, g, 3), _alpha_step(p, g, 3)):
            assert got.dtype == want.dtype and torch.equal(got, want)
        with pytest.raises(RuntimeError, match="alpha must not be a floating point"):
            f(p, g, 0.5)
    out = str(fastcompile.explain(_alpha_step)(torch.ones(3), torch.ones(3), 0.1))
    assert "Graph break count: 0" in out and "Floats read at each call: -(L['lr']), (L['lr'] * 2)" in out, out


def test_fc_compile_dropout_checks_p_outside_training():
    """F.dropout(x, p=1.7, training=False) raises as eager does, compiled or not."""

    def f(x, p):
        return F.dropout(x, p=p, training=False) * 2

    cf = fastcompile.compile(f)
    x = torch.ones(3)
    torch.testing.assert_close(cf(x, 0.5), f(x, 0.5))
    for p in (1.7, -0.1):
        with pytest.raises(ValueError, match="dropout probability"):
            f(x, p)
        with pytest.raises(ValueError, match="dropout probability"):
            cf(x, p)


def test_fc_compile_first_call_with_a_computed_float_runs_each_extern_once():
    """The first call reuses the trace's extern results (a BatchNorm in training mode under
    no_grad updates its statistics once) when a graph input is a float Python computes at the
    call (lr * 2.0): a new object, matched by value."""
    bn = nn.BatchNorm1d(4).train().requires_grad_(False)
    eager, ours = copy.deepcopy(bn), copy.deepcopy(bn)

    def f(m, x, lr):
        return m(x) * (lr * 2.0)

    cf = fastcompile.compile(f)
    for k in range(3):
        x = torch.randn(5, 4) + k
        torch.testing.assert_close(cf(ours, x, 0.1 * (k + 1)), f(eager, x, 0.1 * (k + 1)))
        torch.testing.assert_close(ours.running_mean, eager.running_mean, msg="call %d" % k)
        torch.testing.assert_close(ours.running_var, eager.running_var)


# -- aliasing and in-place semantics (a differential probe's findings) ---------------------------


def _outputs(r):
    return r if isinstance(r, tuple) else (r,)


@pytest.mark.parametrize(
    "name,fn",
    [
        ("clone_t", lambda x: x.clone().t()),
        ("clone_slice", lambda x: x.clone()[1:]),
        ("clone_view", lambda x: x.clone().view(-1)),
        ("clone_select", lambda x: x.clone()[0]),
        ("to_copy_slice", lambda x: x.to(copy=True)[1:]),
        ("detach_clone_t", lambda x: x.detach().clone().t()),
        ("contiguous_t", lambda x: x.t().contiguous()),
        ("plain_t", lambda x: x.t()),
    ],
)
def test_a_copy_then_a_view_never_shares_the_input(name, fn):
    """x.clone().t(): the core lowers the clone to x's own value; the extern view of it must
    still be a view of a copy (a view of x: writing to the result would write x). A plain view
    of an input shares it, as eager's does."""
    f = compile_fc(fn)
    for _ in range(2):
        xe, xc = torch.zeros(4, 3), torch.zeros(4, 3)
        oe, oc = fn(xe), f(xc)
        oe.add_(1)
        oc.add_(1)
        assert torch.equal(xc, xe), (xc, xe)
        assert torch.equal(oc, oe) and oc.stride() == oe.stride()


def _exp_then_add_(x):
    y = x.exp()
    y.add_(1)  # y is saved for exp's backward: eager's backward raises
    return y.sum()


@pytest.mark.parametrize("how", ["torch.compile", "torch.compile, mutated after", "fastcompile.compile"])
def test_an_update_of_a_tensor_saved_for_backward_raises_as_eager(how):
    """aot_autograd's forward graph returns exp's result and, saved for backward, its detach():
    one value which, as two tensors with two version counters, would let an in-place update of
    the result go unnoticed (backward giving exp(x) + 1 for exp(x)). Eager raises; so do we."""
    x = torch.randn(5, requires_grad=True)
    if how == "torch.compile, mutated after":
        f = compile_fc(torch.exp)
        run = lambda: f(x).add_(1).sum()  # noqa: E731
    else:
        f = compile_fc(_exp_then_add_) if how == "torch.compile" else fastcompile.compile(_exp_then_add_)
        run = lambda: f(x)  # noqa: E731
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _exp_then_add_(x).backward()
    for _ in range(2):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            run().backward()
    assert x.grad is None
    if how == "torch.compile, mutated after":
        f(x).sum().backward()  # no update: the gradient
        torch.testing.assert_close(x.grad, x.detach().exp())


def _outputs_viewing_outputs(x):
    a = x * 2
    b = x.clone()
    c = x + 1
    return a.expand(3, 4), a, b, b[::2], c.view(2, 2), c[1:].detach(), a.detach(), b.view(torch.int32)


@pytest.mark.parametrize("grad", [False, True])
def test_outputs_that_view_other_outputs_share_them_as_in_eager(grad):
    """Outputs that are views of one value (a, a.expand(...); b, b[::2]; two views of c, which is no
    output) share its memory and version counter in eager; the core gave each its own array, so
    writing one output did not show in the others. b.view(torch.int32) is made by its op (no
    as_strided of a float32 tensor gives it)."""
    f = compile_fc(_outputs_viewing_outputs)
    for n in (4, 4):
        x = torch.randn(n, requires_grad=grad)
        oe, oc = _outputs_viewing_outputs(x), f(x)
        assert len(oe) == len(oc)
        with torch.no_grad():
            for i, (e, c) in enumerate(zip(oe, oc)):
                assert torch.equal(e, c) and e.stride() == c.stride(), i
            for pair in ((1, 0), (2, 3), (4, 5), (1, 6), (7, 2)):
                for o in (oe, oc):
                    v0 = o[pair[1]]._version
                    o[pair[0]].view(-1)[0:1].add_(100)
                    assert o[pair[1]]._version > v0, pair
                for i, (e, c) in enumerate(zip(oe, oc)):
                    assert torch.equal(e, c), (pair, i)


def _clear_sign(x):
    x.view(torch.int32).bitwise_and_(0x7FFFFFFF)
    return x


@pytest.mark.parametrize("how", ["fastcompile.compile", "torch.compile"])
def test_view_as_another_dtype_reinterprets_bits(how):
    """x.view(torch.int32) reinterprets the float's bits (torch's op), no value cast ([-1.5, 2.25]
    to [-1, 2]); clearing the sign bit through the view gives eager's values."""
    fns = [
        lambda x: x.view(torch.int32) + 0,
        lambda x: (x.view(torch.int16) * 1, x.view(torch.uint8)[::2] + 1),
        _clear_sign,
    ]
    for fn in fns:
        f = fastcompile.compile(fn) if how == "fastcompile.compile" else compile_fc(fn)
        for vals in ([-1.5, 2.25, -3.0, 0.0], [1e30, -0.0, float("inf"), -7.0]):
            xe, xc = torch.tensor(vals), torch.tensor(vals)
            for a, b in zip(_outputs(fn(xe)), _outputs(f(xc))):
                assert a.dtype == b.dtype and torch.equal(a, b), (a, b)
            assert torch.equal(xe.view(torch.int32), xc.view(torch.int32))


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.LeakyReLU(0.1, inplace=True),
        lambda: nn.ELU(inplace=True),
        lambda: nn.Hardswish(inplace=True),
        lambda: nn.Hardsigmoid(inplace=True),
        lambda: nn.SELU(inplace=True),
        lambda: nn.CELU(inplace=True),
        lambda: nn.Sequential(nn.Linear(3, 3), nn.LeakyReLU(0.2, True)),
    ],
)
def test_fc_compile_inplace_activation_modules_apply_once(make):
    """nn activations with inplace=True call F.leaky_relu(x, slope, True): inplace passed by
    position. The op applies once on the first call too (LeakyReLU: -0.1 for -1, not -0.01, as
    when both the trace and the call apply it), and the result is x itself."""
    torch.manual_seed(0)
    m = make()
    ref = copy.deepcopy(m)
    f = fastcompile.compile(m)
    with torch.no_grad():
        for _ in range(3):
            xe = torch.tensor([[-1.0, 2.0, -3.0], [0.5, -0.25, 4.0]])
            xc = xe.clone()
            oe, oc = ref(xe), f(xc)
            torch.testing.assert_close(oc, oe)
            torch.testing.assert_close(xc, xe)
            assert (oc is xc) == (oe is xe)


_LIN = nn.Linear(4, 4)
_LIN2 = nn.Linear(4, 4)


def _ip_relu(x, b):
    y = x * 2
    y.relu_()
    return y


def _ip_add_broadcast(x, b):
    y = x * 2
    y.add_(b)
    return y


def _ip_keeps_dtype(x, b):
    y = x * 2
    y.add_(x.double()).mul_(b)
    return y


def _ip_int_mul_float(x, b):
    y = (x * 2).int()
    y.mul_(1.5)  # eager: RuntimeError (Float cannot be cast to Int)
    return y


def _ip_grows(x, b):
    y = x * 2
    y.add_(b.view(-1, 1) * 0)  # (1, 4) += (4, 1): eager RuntimeError
    return y


def _ip_a_row(x, b):
    y = x * 2
    y[0].relu_()  # a view: eager code (graph break)
    return y


def _ip_after_linear(x, b):
    y = F.leaky_relu(_LIN(x), 0.2, True)
    y.clamp_(min=-0.1, max=0.5).sub_(b, alpha=2)
    r = y.relu_()
    return y, r is y


def _ip_read_by_an_extern(x, b):
    y = _LIN(x)
    z = _LIN2(y)
    y.relu_()  # y was handed to an extern: eager code (graph break)
    return z, y


def _ip_input(x, b):
    x.relu_()  # an input: eager code (graph break)
    return x * 2


def _ip_masked(x, b):
    y = x * 1
    y.masked_fill_(x > 0, 0.0).lerp_(x, 0.5)
    return y


_W = torch.randn(4, requires_grad=True)


def _ip_through_a_view_then_a_row(x, b):
    g = x * _W
    g.t().mul_(2.0)  # a view: eager code (in autograd mode, recorded for aot_autograd
    g[0] += 1.0  # it left g a view made inside its Function: this raised)
    return g


def _ip_saved_for_backward(x, b):
    y = x.exp()
    y.relu_()  # exp saved y: eager's backward raises
    return y


@pytest.mark.parametrize(
    "fn,breaks",
    [
        (_ip_relu, 0),
        (_ip_add_broadcast, 0),
        (_ip_keeps_dtype, 0),
        (_ip_int_mul_float, None),
        (_ip_grows, None),
        (_ip_a_row, 1),
        (_ip_after_linear, 0),
        (_ip_read_by_an_extern, 1),
        (_ip_input, 1),
        (_ip_masked, 0),
        (_ip_saved_for_backward, 0),
        (_ip_through_a_view_then_a_row, None),
    ],
)
@pytest.mark.parametrize("grad", [False, True])
def test_fc_compile_in_place_tensor_methods_as_eager(fn, breaks, grad):
    """y.relu_(), y.add_(b), F.leaky_relu(y, 0.2, True), ...: on a tensor the graph made that
    nothing else can see, in-place Tensor methods are traced, not graph breaks: the core route
    rebinds y to the out-of-place value (in y's dtype), autograd mode records the
    in-place op for aot_autograd. Inputs, views and tensors an extern read stay eager code;
    what eager refuses raises as in eager, at the call or at backward."""
    if breaks is not None:
        with torch.no_grad():
            ex = fastcompile.explain(fn)(torch.randn(3, 4), torch.randn(4))
        assert ex.graph_count == 1 and ex.graph_break_count == breaks, ex
    f = fastcompile.compile(fn)
    for n in (3, 3, 5):
        x, b = torch.randn(n, 4) if fn is not _ip_grows else torch.randn(1, 4), torch.randn(4)
        xe, xc = (
            x.clone().requires_grad_(grad and fn is not _ip_input),
            x.clone().requires_grad_(grad and fn is not _ip_input),
        )
        ctx = torch.enable_grad if grad else torch.no_grad
        with ctx():
            try:
                oe = _outputs(fn(xe, b))
            except RuntimeError:
                with pytest.raises(RuntimeError):
                    f(xc, b)
                continue
            oc = _outputs(f(xc, b))
        assert len(oe) == len(oc)
        for e, c in zip(oe, oc):
            if isinstance(e, torch.Tensor):
                assert e.dtype == c.dtype
                torch.testing.assert_close(c, e)
            else:
                assert e == c
        torch.testing.assert_close(xc, xe)
        if grad and xe.requires_grad:
            try:
                sum(o.sum() for o in oe if isinstance(o, torch.Tensor)).backward()
            except RuntimeError:
                with pytest.raises(RuntimeError):
                    sum(o.sum() for o in oc if isinstance(o, torch.Tensor)).backward()
                continue
            sum(o.sum() for o in oc if isinstance(o, torch.Tensor)).backward()
            torch.testing.assert_close(xc.grad, xe.grad)


def test_fc_compile_a_network_with_in_place_activations_is_one_graph():
    """nn.ReLU(inplace=True) / nn.LeakyReLU(inplace=True) after a Linear, as CNNs and GANs write
    them: one graph (no graph break per activation, which in nn.Sequential would run the whole
    forward as plain Python), forward and a training step as eager."""
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Linear(6, 8),
        nn.ReLU(inplace=True),
        nn.Linear(8, 8),
        nn.LeakyReLU(0.1, True),
        nn.Linear(8, 3),
        nn.Hardtanh(-0.5, 0.5, inplace=True),
    )
    ref = copy.deepcopy(m)
    with torch.no_grad():
        ex = fastcompile.explain(m)(torch.randn(4, 6))
    assert ex.graph_count == 1 and ex.graph_break_count == 0, ex
    f = fastcompile.compile(m)
    oe_ = torch.optim.SGD(ref.parameters(), lr=0.1)
    oc_ = torch.optim.SGD(m.parameters(), lr=0.1)
    for n in (4, 4, 7):
        x = torch.randn(n, 6)
        with torch.no_grad():
            torch.testing.assert_close(f(x), ref(x))
        le, lc = ref(x).square().mean(), f(x).square().mean()
        torch.testing.assert_close(lc, le)
        le.backward()
        lc.backward()
        oe_.step()
        oc_.step()
        oe_.zero_grad()
        oc_.zero_grad()
        for pe, pc in zip(ref.parameters(), m.parameters()):
            torch.testing.assert_close(pc, pe)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_norm_casts_of_broadcast_views_run_in_their_readers(dtype):
    """GroupNorm + SiLU (inference, aot's decomposition): the weight and bias viewed (1, G, C/G, 1)
    and the scale and shift viewed (N, C, 1, 1) by an extern are cast to their own dtype before
    the core reads them (the core learns an extern's dtype only at run time). The fuser computes
    such cheap casts in the kernel that reads them broadcast, not as a copy kernel each of the
    view's shape: 3 kernels, none of them a copy."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.GroupNorm(8, 32), nn.SiLU()).eval().to(dtype)
    with torch.no_grad():
        m[0].weight.normal_()
        m[0].bias.normal_()
    x = torch.randn(2, 32, 6, 6, dtype=dtype)
    record = []
    f = compile_fc(m, record=record)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(f(x), m(x), **TOL)
    kernels = [k for r in record for k in r.kernels]
    copies = [
        k.fused
        for k in kernels
        if all(line.split("=")[1].strip().startswith("cast(") for line in k.fused.splitlines()[1:] if "=" in line)
    ]
    assert not copies, copies
    assert len({k.name for k in kernels}) == 3, [k.fused for k in kernels]


def test_fc_compile_a_module_called_under_no_grad_then_trained_compiles_for_autograd():
    """A model called under no_grad first (a warm-up, an evaluation), then trained: the no_grad
    graph holds its parameters as data, so it is guarded on grad mode, and a call with grad on
    traces an autograd-mode graph. Without the guard that call would run the no_grad graph, which
    raises (.numpy() of a tensor that requires grad), and the frame would run as plain Python at
    every training step (a RuntimeWarning, an error in this suite)."""
    torch.manual_seed(0)
    # parameters read only by externs (Linear's matmuls); a LayerNorm's, read by the core,
    # brought the guard with them
    m = nn.Sequential(nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 3), nn.GELU())
    ref = copy.deepcopy(m)
    f = fastcompile.compile(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for step in range(3):
            x = torch.randn(5, 6)
            with torch.no_grad():
                torch.testing.assert_close(f(x), ref(x))
            out = f(x)
            assert out.requires_grad
            out.square().sum().backward()
            ref(x).square().sum().backward()
            for pe, pc in zip(ref.parameters(), m.parameters()):
                torch.testing.assert_close(pc.grad, pe.grad, msg="step %d" % step)
    ex = fastcompile.explain(m)(torch.randn(5, 6))  # grad on: the autograd-mode graph
    assert ex.graph_count == 1 and ex.graph_break_count == 0, ex


@pytest.mark.parametrize(
    "name,fn",
    [
        ("t_contiguous", lambda x: x.t().contiguous()),
        ("contiguous", lambda x: x.contiguous()),
        ("t_contiguous_view", lambda x: x.t().contiguous().view(-1)),
        ("t_contiguous_t", lambda x: x.t().contiguous().t()),
        ("detach", lambda x: x.detach()),
        ("sin_detach", lambda x: x.sin().detach()),
    ],
)
def test_fc_compile_contiguous_and_detach_as_eager(name, fn):
    """x.t().contiguous() is a C-ordered copy, not the transposed view of x (.view(-1) after it
    would raise, and writes would reach x); x.detach() is a new tensor, not x."""
    f = fastcompile.compile(fn)
    for _ in range(3):
        xe = torch.arange(6.0).view(2, 3)
        xc = xe.clone()
        oe, oc = fn(xe), f(xc)
        assert (oe is xe) == (oc is xc)
        assert oc.stride() == oe.stride() and oc.is_contiguous() == oe.is_contiguous()
        oe.add_(1)
        oc.add_(1)
        assert torch.equal(oc, oe) and torch.equal(xc, xe)


def _views_of_inputs_and_outputs(x):
    a = x * 2
    return x[1:], x.t(), a, a.t(), a[1:], a, x.view(-1)[::2], x.view(torch.int32), x + 1


def test_fc_compile_views_share_their_base_as_in_eager():
    """Tensor outputs that view an input or another output are views of the tensor they view,
    not torch.from_numpy tensors over the same memory (no _base, storage_offset() 0, and a
    version counter of their own, so autograd would miss an in-place update through one: a
    tensor saved for backward updated unnoticed); an output returned twice is one tensor;
    x.view(torch.int32), of another dtype, still shares x's memory."""
    ex = fastcompile.explain(_views_of_inputs_and_outputs)(torch.ones(4, 3))
    assert ex.graph_count == 1 and ex.graph_break_count == 0, ex
    f = fastcompile.compile(_views_of_inputs_and_outputs)
    for n in (4, 4, 5):
        xe = torch.arange(n * 3.0).view(n, 3).clone()
        xc = xe.clone()
        oe, oc = _views_of_inputs_and_outputs(xe), f(xc)
        base = {"x": (xe, xc), "a": (oe[2], oc[2])}
        for i, (e, c) in enumerate(zip(oe, oc)):
            assert torch.equal(e, c) and e.stride() == c.stride(), i
            assert e.storage_offset() == c.storage_offset(), i
            assert (e._base is None) == (c._base is None), i
            for name, (be, bc) in base.items():
                assert (e._base is be) == (c._base is bc), (i, name)
        assert (oc[2] is oc[5]) and (oe[2] is oe[5])
        for i in (0, 1, 3, 4, 6):
            for o, x in ((oe, xe), (oc, xc)):
                b = x if i in (0, 1, 6) else o[2]
                v = b._version
                o[i].view(-1)[0:1].add_(1) if o[i].is_contiguous() else o[i].select(-1, 0).add_(1)
                assert b._version > v, i
            assert torch.equal(xe, xc) and all(torch.equal(e, c) for e, c in zip(oe, oc)), i
        oe[7].add_(1)
        oc[7].add_(1)
        assert torch.equal(xe, xc)


def _detach_and_views(x):
    return x.detach(), x[1:], x.float(), x.t() * 1


def test_fc_compile_views_of_an_input_requiring_grad_as_in_eager():
    """Under no_grad, x.detach() of an x requiring grad requires no grad: it shares x's memory,
    and a view of x itself would require grad (x[1:] does: the tracer breaks the graph there)."""
    f = fastcompile.compile(_detach_and_views)
    x = torch.randn(4, 3, requires_grad=True)
    for ctx in (torch.no_grad, torch.inference_mode, torch.no_grad):
        with ctx():
            oe, oc = _detach_and_views(x), f(x)
        for i, (e, c) in enumerate(zip(oe, oc)):
            assert torch.equal(e, c) and e.requires_grad == c.requires_grad, i
            assert (e is x) == (c is x) and (e._base is x) == (c._base is x), i


def _mul_then_broadcast(x, z):
    x.mul_(2)
    y = x * z
    x.add_(1)
    return y


def test_fc_compile_shapes_that_do_not_broadcast_raise_runtime_error():
    """A graph's kernels are not specialized on sizes, so z of shape (3,) reaches the core, which
    raised NumPy's ValueError; torch raises RuntimeError. The input state is eager's."""
    f = fastcompile.compile(_mul_then_broadcast)
    for z in (torch.randn(5), torch.randn(3), torch.randn(3), torch.randn(1)):
        xe = torch.randn(4, 5)
        xc = xe.clone()
        try:
            oe = _mul_then_broadcast(xe, z)
        except RuntimeError:
            oe = None
            with pytest.raises(RuntimeError):
                f(xc, z)
        else:
            assert torch.equal(f(xc, z), oe)
        assert torch.equal(xc, xe)


def _iadd_through_a_view(x, w):
    y = x * w
    z = y.t()
    z += 1  # reaches y
    return y


def _imul_a_row(x, w):
    y = x * w
    z = y[0]
    z *= 2
    return y, z


def _iadd_a_viewed_base(x, w):
    y = x * w
    v = y.t()
    y += 1  # reaches v
    return v


def _iadd_through_flatten(x, w):
    y = x * w
    z = nn.Flatten(0)(y)
    z += 1
    return y


@pytest.mark.parametrize("fn", [_iadd_through_a_view, _imul_a_row, _iadd_a_viewed_base, _iadd_through_flatten])
def test_fc_compile_autograd_in_place_update_of_a_view_reaches_its_base(fn):
    """Autograd mode (a weight requires grad): a view, and a tensor a view was taken of, are
    updated in place only in eager code (a graph break). Were views 'fresh' FX results, z += 1
    on z = y.t() would rebind z alone and y come back without the update (and y += 1 miss y's
    view)."""
    f = fastcompile.compile(fn)
    x = torch.randn(3, 3)
    for _ in range(2):
        w = torch.randn(3, 3, requires_grad=True)
        we = w.detach().clone().requires_grad_(True)
        oe, oc = _outputs(fn(x, we)), _outputs(f(x, w))
        for e, c in zip(oe, oc):
            torch.testing.assert_close(c, e)
        sum(o.sum() for o in oe).backward()
        sum(o.sum() for o in oc).backward()
        torch.testing.assert_close(w.grad, we.grad)


def _branch_on_a_value(x):
    h = x * 2
    if h.mean() > 0:  # a graph break
        h = h * 3
    return h + 1


def _no_break(x):
    return (x * 2).sin()


@pytest.mark.parametrize("fn", [_branch_on_a_value, _no_break])
def test_fc_compile_autograd_mode_graphs_follow_new_sizes(fn, caplog):
    """aot_autograd compiles a graph for the sizes of its first call, and no guard of the frame
    checks sizes: each set of input sizes gets its own compiled graph (else a new batch size
    raises in a frame with a graph break, 'The expanded size of the tensor (2) must match the
    existing size (3)', and a frame without one runs as plain Python at every call), up to
    cache_size_limit; past it a graph runs its torch ops uncompiled, with a warning."""
    import logging

    records = []
    old_backend = fbt.backend

    def counting(gm, example_inputs, **kw):
        records.append(tuple(example_inputs[0].shape))
        return old_backend(gm, example_inputs, **kw)

    f = fastcompile.compile(fn)
    old_limit = fastcompile.config.get("cache_size_limit")
    fbt.backend = counting
    fastcompile.config.set(cache_size_limit=3)
    try:
        with caplog.at_level(logging.WARNING, logger="fastcompile"):
            for b in (2, 3, 2, 3, 4, 5, 6, 5):
                x = torch.rand(b, 4, requires_grad=True)  # h.mean() > 0: one resume path
                xe = x.detach().clone().requires_grad_(True)
                out = f(x)
                torch.testing.assert_close(out, fn(xe))
                out.sum().backward()
                fn(xe).sum().backward()
                torch.testing.assert_close(x.grad, xe.grad)
    finally:
        fbt.backend = old_backend
        fastcompile.config.set(cache_size_limit=old_limit)
    graphs = 2 if fn is _branch_on_a_value else 1
    assert sorted(set(records)) == [(2, 4), (3, 4), (4, 4)], records  # 5 and 6: past the limit
    assert len(records) == 3 * graphs, records
    assert any("cache_size_limit" in r.getMessage() for r in caplog.records)


def _bn_then_item(x, bn):
    y = bn(x)
    s = y.abs().max().item()  # a graph break
    return y / s


def test_fc_compile_a_graph_break_runs_each_extern_once_on_the_first_call():
    """A graph break traces the frame again up to the break (the restart that builds the partial
    graph): the restart replays the first trace's results, so that BatchNorm in training mode
    under no_grad updates its running statistics once on the first call, not once per trace."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4)
    ref = copy.deepcopy(bn)
    f = fastcompile.compile(_bn_then_item)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(8, 4)
            torch.testing.assert_close(f(x, bn), _bn_then_item(x, ref))
            assert bn.num_batches_tracked.item() == ref.num_batches_tracked.item()
            torch.testing.assert_close(bn.running_mean, ref.running_mean)
            torch.testing.assert_close(bn.running_var, ref.running_var)


@pytest.mark.parametrize(
    "make,shape",
    [
        (lambda: nn.BatchNorm1d(6), (5, 6)),
        (lambda: nn.BatchNorm1d(6), (5, 6, 7)),
        (lambda: nn.BatchNorm2d(6), (2, 6, 4, 5)),
        (lambda: nn.BatchNorm3d(6, affine=False), (2, 6, 3, 4, 5)),
        (lambda: nn.BatchNorm2d(6).double(), (2, 6, 4, 5)),
        (lambda: nn.BatchNorm2d(6, track_running_stats=False), (2, 6, 4, 5)),
        (lambda: nn.BatchNorm2d(6).half(), (2, 6, 4, 5)),
    ],
)
def test_fc_compile_batch_norm_in_eval_mode_fuses(make, shape):
    """BatchNorm in eval mode, float32/float64, is traced as its per-channel scale and shift (not
    one extern call), so BN + ReLU(inplace=True) is one kernel over x; without running statistics
    or in float16 it stays torch's op. A switch to training mode (guarded) updates the statistics
    as eager does."""
    torch.manual_seed(0)
    bn = make().eval()
    if bn.running_mean is not None:
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2)
    if bn.weight is not None:
        bn.weight.data.normal_()
        bn.bias.data.normal_()
    seq = nn.Sequential(bn, nn.ReLU(inplace=True))
    ref = copy.deepcopy(seq)
    dt = bn.running_mean.dtype if bn.running_mean is not None else torch.float32
    lowered = dt in (torch.float32, torch.float64) and bn.running_mean is not None
    f = fastcompile.compile(seq)
    with torch.no_grad():
        ex = fastcompile.explain(seq)(torch.randn(*shape).to(dt))
        assert ex.graph_count == 1 and ex.graph_break_count == 0, ex
        assert ("sqrt" in str(ex)) == lowered, ex
        for mode in ("eval", "eval", "train", "eval"):
            seq.train(mode == "train")
            ref.train(mode == "train")
            x = torch.randn(*shape).to(dt)
            e, c = ref(x.clone()), f(x.clone())
            assert e.dtype == c.dtype
            torch.testing.assert_close(c, e)
            if bn.running_mean is not None:
                torch.testing.assert_close(bn.running_mean, ref[0].running_mean)
                assert bn.num_batches_tracked.item() == ref[0].num_batches_tracked.item()


def _set_data(x, y):
    x.data = y * 2
    return x + 1


def test_a_graph_aot_autograd_refuses_runs_as_plain_torch(caplog):
    """x.data = y on an input: aot_autograd refuses the graph (a set_ on an input it cannot keep;
    aot_eager takes it). The graph runs as plain torch (not BackendCompilerFailed), with a
    warning, and gives eager's result and input state."""
    import logging

    with caplog.at_level(logging.WARNING, logger="fastcompile.backends.torch"):
        f = compile_fc(_set_data)
        for _ in range(2):
            xe, ye, xc, yc = torch.ones(3), torch.arange(3.0), torch.ones(3), torch.arange(3.0)
            oe, oc = _set_data(xe, ye), f(xc, yc)
            assert torch.equal(oe, oc) and torch.equal(xe, xc)
    assert any("runs as plain torch" in r.getMessage() for r in caplog.records)


def _unbind_first(x):
    a, *rest = x.unbind(0)
    a.add_(1)
    return len(rest)


def _split_pair(x):
    a, b, *rest = x.split(2)
    return a + b.sum(), len(rest)


def _np_split(x):
    parts = np.split(x, 2)
    return parts[0] * 2, len(parts)


def test_fc_compile_results_counted_by_size_follow_the_size():
    """x.unbind(0), x.split(2): how many tensors they give follows the input's size, which the
    graph's guards fix (unguarded, a first dim of 6 after 4 would raise "declared nout=4 but
    returned 6 values"): a new size traces again."""
    f, g, h = fastcompile.compile(_unbind_first), fastcompile.compile(_split_pair), fastcompile.compile(_np_split)
    for n in (4, 6, 4, 2, 7):
        xe, xc = torch.zeros(n, 5), torch.zeros(n, 5)
        assert f(xc) == _unbind_first(xe) and torch.equal(xc, xe)
        if n >= 4:
            ge, gc = _split_pair(torch.ones(n, 3)), g(torch.ones(n, 3))
            assert torch.equal(ge[0], gc[0]) and ge[1] == gc[1]
        if n % 2 == 0:
            a = np.arange(n * 3.0).reshape(n, 3)
            he, hc = _np_split(a), h(a)
            assert np.array_equal(he[0], hc[0]) and he[1] == hc[1]
