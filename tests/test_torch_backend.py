"""The torch.compile backend (python/fastcompile/backends/torch/): its entry point, modes and
options, fallbacks, symbolic sizes, the runner, async and batch compile, profile labels. Eager
torch is the reference.

- registration: the torch_dynamo_backends entry point, list_backends(), backend="fastcompile"
  without importing fastcompile (subprocess; needs the package pip-installed, else skipped);
- modes and options, graphs that run as plain torch, dynamic shapes;
- async compile (plain torch while the kernels build) and batch compile (every kernel of the
  forward and backward graphs in one batch at the first call).

The lowering of ops is tested in test_torch_lowering.py, models, training and eager's semantics
in test_torch_training.py; their shared models and helpers live in torchhelp.py. Every test
skips with a reason where torch is not importable (CI runs a Python without it).
"""

import copy
import functools
import gc
import importlib.metadata
import os
import subprocess
import sys
import weakref

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch backend is not tested")

import numpy as np  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from conftest import run_threads  # noqa: E402
import fastcompile  # noqa: E402
from fastcompile.backends import torch as fbt  # noqa: E402
from torchhelp import (  # noqa: E402
    MLP,
    MODELS,
    TOL,
    Block,
    compile_fc,
    _fc_graphs,  # noqa: E402
    _frontend,
    _sgd_step,
    _training_pair,
)
from torchhelp import _reset_dynamo  # noqa: E402,F401  (autouse fixture)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------
# registration
# ----------------------------------------------------------------------------------------------


def test_entry_point_declared():
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert '[project.entry-points.torch_dynamo_backends]' in text
    assert 'fastcompile = "fastcompile.backends.torch:backend"' in text


def _installed_entry_point():
    try:
        eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    except Exception:
        return None
    return next((e for e in eps if e.name == "fastcompile"), None)


def test_backend_by_name_without_import_subprocess():
    ep = _installed_entry_point()
    if ep is None or ep.value != "fastcompile.backends.torch:backend":
        pytest.skip("fastcompile is not pip-installed with its entry point (python3 -m pip install .)")
    src = (
        "import sys, torch, torch._dynamo\n"
        "assert 'fastcompile' not in sys.modules\n"
        "assert 'fastcompile' in torch._dynamo.list_backends(), torch._dynamo.list_backends()\n"
        "f = torch.compile(lambda x: torch.sigmoid(x) * x + 1, backend='fastcompile')\n"
        "x = torch.randn(64, 33)\n"
        "torch.testing.assert_close(f(x), torch.sigmoid(x) * x + 1)\n"
        "assert 'fastcompile._C' in sys.modules\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=300, cwd="/", env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_backend_callable_and_kwargs():
    with pytest.raises(ValueError, match="unknown option"):
        fbt.compile_fx._parse_options(None, {"no_such_knob": 1})
    with pytest.raises(ValueError, match="unknown mode"):
        fbt.compile_fx._parse_options("fastest", None)
    assert fbt.compile_fx._parse_options("max-autotune-no-cudagraphs", None) == ("max-autotune", {})
    assert fbt.compile_fx._parse_options(None, {"num_threads": 2}) == ("default", {"num_threads": 2})


# ----------------------------------------------------------------------------------------------
# modes, options, fallbacks
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune"])
def test_modes(mode):
    torch.manual_seed(0)
    m = MLP().eval()
    x = torch.randn(256, 32)
    cm = torch.compile(m, backend="fastcompile" if _installed_entry_point() else fbt.backend, mode=mode)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cm(x), m(x), **TOL)
        x.mul_(2)  # an input changed in place: seen again
        torch.testing.assert_close(cm(x), m(x), **TOL)


@pytest.mark.parametrize("mode", ["default", "max-autotune"])
def test_max_autotune_tunes_each_kernel(mode):
    """max-autotune: every kernel of the graph times thread counts (and column blocks where the
    launch is strided) per launch shape on its first call, then runs the fastest (tune.c)."""
    torch.manual_seed(0)
    m = MLP().eval()
    x = torch.randn(512, 32)
    record = []
    cm = compile_fc(m, record=record, mode=mode)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cm(x), m(x), **TOL)
    runners = [r for r in record if r.compiled is not None]
    assert runners
    for r in runners:
        if mode == "default":
            assert r.compiled.autotune is None and r.compiled.tuning == []
            continue
        assert r.compiled.autotune is True
        tuned = {e["kernel"] for e in r.compiled.tuning}
        big = [k.name for k in r.kernels]
        assert tuned and tuned <= set(big)
        assert all(e["uses"] == 2 for e in r.compiled.tuning)  # calls 2 and 3 reuse the choice


def test_options_set_knobs():
    from fastcompile import config

    old = config.get("serial_below")
    try:
        f = torch.compile(lambda x: x.exp() + 1, backend=fbt.backend, options={"serial_below": 12345})
        x = torch.randn(10)
        torch.testing.assert_close(f(x), x.exp() + 1)
        assert config.get("serial_below") == 12345
    finally:
        config.set(serial_below=old)


def test_unknown_and_unsupported_ops_do_not_fail():
    record = []

    def f(x, i):
        y = torch.cumsum(x, 0).sin()  # cumsum: an extern
        z = torch.fft.rfft(y, dim=-1).abs()  # complex inside one extern cluster
        return y[i] * 2, z.sum(-1), torch.linalg.svdvals(x)

    x, i = torch.randn(8, 8), torch.tensor([1, 3])
    out = compile_fc(f, record=record)(x, i)
    ref = f(x, i)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, **TOL)


def test_dynamic_shapes_compile_per_size_and_reuse_kernels():
    """A graph with symbolic sizes (dynamic=True) is lowered once per set of concrete sizes, each
    through the core (no runner falls back), and the kernels of the first size serve the others:
    no kernel compiles after it. A size seen before reuses its graph."""
    record = []
    fn = lambda x: ((x * 2).exp() + 1).sum(-1)  # noqa: E731
    f = torch.compile(fn, backend=functools.partial(fbt.backend, record=record), dynamic=True)
    x = torch.randn(3, 40)
    torch.testing.assert_close(f(x), fn(x))
    compiles = fastcompile.stats()["compiles"]
    for n in (5, 7, 5, 3):
        x = torch.randn(n, 40)
        torch.testing.assert_close(f(x), fn(x))
    assert len(record) == 3, "one runner per set of sizes: 3, 5, 7"
    assert [r.fallback for r in record] == [None] * 3
    assert all(r.core_ops > 0 for r in record)
    assert fastcompile.stats()["compiles"] == compiles, "a new size compiled kernels again"


def test_dynamic_shapes_symint_inputs_bound_per_size():
    """Dynamo passes a symbolic size as an input of its own (an int at each call), here used in a
    view's shape: each size's graph takes it as a constant, the int input is dropped, and the
    result is eager's."""
    record = []

    def fn(x):
        y = x.view(x.shape[0] * 2, -1).sigmoid()
        return y * y.shape[0], y.sum(0)

    f = torch.compile(fn, backend=functools.partial(fbt.backend, record=record), dynamic=True)
    for n in (4, 6, 10):
        x = torch.randn(n, 8)
        for a, b in zip(f(x), fn(x)):
            torch.testing.assert_close(a, b)
    assert len(record) == 3 and [r.fallback for r in record] == [None] * 3


def test_automatic_dynamic_training_keeps_compiling():
    """Dynamo's automatic dynamic: after one size change it recompiles the frame with a symbolic
    batch size, and that graph serves every later call, the first size's included. Each size
    gets its forward and backward graphs through the core; outputs and gradients match eager's
    at every step (a smaller last batch must not send the rest of training to plain torch)."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    ref, mod = copy.deepcopy(base), copy.deepcopy(base)
    record = []
    cm = torch.compile(mod, backend=functools.partial(fbt.backend, record=record))
    for n in (8, 8, 6, 8, 5):
        x = torch.randn(n, 16)
        out_ref, out = ref(x), cm(x)
        torch.testing.assert_close(out, out_ref, **TOL)
        (out_ref**2).mean().backward()
        (out**2).mean().backward()
        for p, q in zip(ref.parameters(), mod.parameters()):
            torch.testing.assert_close(q.grad, p.grad, **TOL)
            p.grad = q.grad = None
    # sizes 8 (static graph), then 6, 8, 5 through the symbolic graph: forward and backward each
    assert len(record) == 8, [r.fallback for r in record]
    assert [r.fallback for r in record] == [None] * 8


def test_dynamic_shapes_past_the_limit_run_plain_torch(caplog):
    """Past cache_size_limit sets of sizes, a new one runs the graph as plain torch (a warning,
    once); the sizes compiled before keep their graphs."""
    record = []
    fn = lambda x: (x * 3).tanh()  # noqa: E731
    f = torch.compile(fn, backend=functools.partial(fbt.backend, record=record), dynamic=True)
    with fastcompile.config.overriding(cache_size_limit=2), caplog.at_level("WARNING", logger="fastcompile"):
        for n in (2, 3, 4, 5, 3, 6):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), fn(x))
    assert len(record) == 2
    assert caplog.text.count("the limit (cache_size_limit)") == 1


def test_dynamic_shapes_build_error_runs_that_size_as_plain_torch(monkeypatch, caplog):
    """An error building one size's graph is logged, and that size runs as plain torch (not
    rebuilt at each call); results stay eager's."""
    fn = lambda x: x.exp() - 1  # noqa: E731
    calls = []

    def broken(*a, **k):
        calls.append(1)
        raise RuntimeError("lowering broke")

    monkeypatch.setattr(fbt.compile_fx, "_compile_later", broken)
    f = torch.compile(fn, backend=fbt.backend, dynamic=True)
    with caplog.at_level("WARNING", logger="fastcompile"):
        for n in (3, 3, 4):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), fn(x))
    assert len(calls) == 2, "a size whose build failed was built again"
    assert caplog.text.count("lowering broke") == 2


def test_steady_state_calls_run_the_generated_runner():
    """A graph runs one generated function (FxGraphRunner._make_fast), made at its first call:
    inputs converted inline (parameters through _convert's cache, which a step's in-place update
    invalidates), outputs made as the plan says (a dtype cast, eager's layout for a transposed
    output, an input passed through); results as eager's at every call, and a wrong input type
    is still a TypeError."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w, b):
        y = torch.sigmoid(x @ w) * 2
        return y, (y + b).t(), (y > 1).to(torch.int32), b, x.t() * 2 + y.sum()  # the last: restrided

    x, w, b = torch.randn(6, 8), nn.Parameter(torch.randn(8, 5)), torch.randn(5)
    gm = make_fx(f, decomposition_table=fbt.decompositions())(x, w, b)
    run = fbt.fx_to_graph(gm, [x, w, b])
    assert run._fast is None
    for step in range(4):
        with torch.no_grad():
            got, want = run(x, w, b), f(x, w, b)
        assert len(got) == len(want)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
            assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
        assert run._fast is not None  # made by the first call, used by the rest
        with torch.no_grad():
            w.mul_(0.5)  # a parameter updated in place, as an optimizer step
        x = torch.randn(6, 8)
    assert "compiled(" in run._fast.source and "_restride(" in run._fast.source
    with pytest.raises(TypeError, match="input 2"):
        run(x, w, b.numpy())
    # a bfloat16 tensor where the graph was built for float32 converts as the generic path does
    with torch.no_grad():
        got, want = run(x, w, b.to(torch.bfloat16)), f(x, w, b.to(torch.bfloat16).float())
    torch.testing.assert_close(got[0], want[0])
    # the generated call holds what it calls, not the runner: no reference cycle keeps a runner
    ref = weakref.ref(run)
    gc.disable()
    try:
        del run
        assert ref() is None
    finally:
        gc.enable()


def test_fx_to_graph_reusable():
    """fx_to_graph lowers an aten graph on its own (the project's own frontend can route here)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x, w: torch.softmax(x @ w, -1) * 3, decomposition_table=fbt.decompositions())(
        torch.randn(4, 8), torch.randn(8, 5)
    )
    run = fbt.fx_to_graph(gm, [torch.randn(4, 8), torch.randn(8, 5)])
    x, w = torch.randn(4, 8), torch.randn(8, 5)
    (out,) = run(x, w)
    torch.testing.assert_close(out, torch.softmax(x @ w, -1) * 3)
    assert run.core_ops >= 2 and run.extern_calls == 1 and len(run.kernels) == 1


# ----------------------------------------------------------------------------------------------
# async compile (config.async_compile): plain torch while the kernels build in the background
# ----------------------------------------------------------------------------------------------


def _knob(name, value):
    """A fixture body: the fastcompile knob `name` set to `value` for one test."""
    from fastcompile import config

    old = config.get(name)
    config.set(**{name: value})
    yield
    config.set(**{name: old})


@pytest.fixture(params=[0, 1], ids=["delay0", "delay1"])
def async_compile(request):
    """async_compile on, with the build starting at a graph's first call (async_delay_calls=0)
    or, as by default, at its second (1: the first call runs Dynamo's graph, not lowered)."""
    from fastcompile import config

    old = config.get("async_compile"), config.get("async_delay_calls")
    config.set(async_compile=True, async_delay_calls=request.param)
    yield request.param
    config.set(async_compile=old[0], async_delay_calls=old[1])


def _plain_calls(record, call, delay):
    """The calls of a graph before its build starts: `delay` of them lower nothing (Dynamo's
    graph runs as plain torch), the next lowers it and starts the build; each call's result is
    checked by `call`."""
    for _ in range(delay):
        call()
        assert record == []  # nothing lowered: aot_autograd has not run
    call()
    assert record


@pytest.fixture
def no_batch_compile():
    yield from _knob("batch_compile", False)


def _wait_all(record, timeout=300):
    runners = [r for r in record if r.compiled is not None]
    assert runners
    for r in runners:
        assert r.wait(timeout), "background compile still running after %d s" % timeout
    return runners


def test_async_compile_serves_torch_first_then_the_kernels(async_compile):
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 16, 64)
    record = []
    cm = compile_fc(m, record=record)
    with torch.no_grad():
        ref = m(x)
        # plain torch (Dynamo's graph, then the decomposed one)
        _plain_calls(record, lambda: torch.testing.assert_close(cm(x), ref, **TOL), async_compile)
        runners = _wait_all(record)
        assert all(r.ready and r.ready_s is not None and r.ready_s > 0 for r in runners)
        plans = [r.compiled.nplans for r in runners]
        kernels = [len(r.kernels) for r in runners]
        assert all(kernels)  # built in the background, not run yet
        for _ in range(2):
            torch.testing.assert_close(cm(x), ref, **TOL)
    # the stand-ins had the layouts real calls bring: no plan was built again
    assert [r.compiled.nplans for r in runners] == plans
    assert [len(r.kernels) for r in runners] == kernels


def test_async_compile_is_off_by_default():
    record = []
    cm = compile_fc(lambda x: (x * 2).exp() + 1, record=record)
    x = torch.randn(64)
    torch.testing.assert_close(cm(x), (x * 2).exp() + 1)
    (r,) = record
    assert r.ready and r.ready_s is None and len(r.kernels) == 1


def test_async_compile_training_draws_random_numbers_as_eager(async_compile):
    """Dropout runs as aten.native_dropout, an extern: the background build must not call it
    (that would move the generator on), so every step's mask matches eager's under one seed,
    before and after the kernels take over."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 8)

        def forward(self, x):
            return self.fc2(F.dropout(F.gelu(self.fc1(x)), p=0.3, training=self.training))

    torch.manual_seed(0)
    base = Net().train()
    x = torch.randn(16, 32)

    def steps(model, run, n, record=None):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        outs = []
        torch.manual_seed(123)
        for i in range(n):
            out = run(x)
            loss = out.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            outs.append(out.detach().clone())
            if record is not None and i == async_compile:
                _wait_all(record)  # the steps after it run the kernels
        return outs

    eager_model, comp_model = copy.deepcopy(base), copy.deepcopy(base)
    ref = steps(eager_model, eager_model, 4)
    record = []
    got = steps(comp_model, compile_fc(comp_model, record=record), 4, record)
    assert len([r for r in record if r.compiled is not None]) == 2  # forward and backward
    for a, b in zip(got, ref):
        assert torch.equal(a == 0, b == 0), "a dropout mask differs from eager's"
        torch.testing.assert_close(a, b, **TOL)
    for p, q in zip(comp_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, **TOL)


def test_async_compile_failure_builds_on_the_next_call(async_compile, no_batch_compile, monkeypatch, caplog):
    """The background build stops at a stand-in that raises (without batch compile, which would
    have built the plans from the FX metadata before it); the next call builds and says why."""

    def broken(values, nodes):
        def stand_in(*a):
            raise RuntimeError("stand-in broke")

        return stand_in

    monkeypatch.setattr(fbt.runner, "_replay", broken)
    m = MLP().eval()
    x = torch.randn(16, 32)
    record = []
    cm = compile_fc(m, record=record)
    with torch.no_grad():
        _plain_calls(record, lambda: torch.testing.assert_close(cm(x), m(x), **TOL), async_compile)
        runners = _wait_all(record)
        assert all(r.compiled.nplans == 0 for r in runners)  # the build stopped at the extern
        with caplog.at_level("WARNING", logger="fastcompile"):
            torch.testing.assert_close(cm(x), m(x), **TOL)
    assert "background compile failed" in caplog.text and "stand-in broke" in caplog.text
    assert all(r.compiled.nplans > 0 for r in runners)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_async_compile_training_steps_match_eager_through_the_switch(name, async_compile):
    """Training steps with async compile: plain Dynamo graphs (delay 1), the lowering step's
    plain aot graphs, then the kernels. Every step's loss, parameters and buffers (BatchNorm's
    running statistics, updated in place by the plain runs too) match eager's."""
    ref, mod, x = _training_pair(name)
    record = []
    cm = compile_fc(mod, record=record)
    target = []
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, mod)]
    for step in range(async_compile + 3):
        (l0, _), (l1, _) = [
            _sgd_step(model, run, opt, x, target) for (model, run), opt in zip(((ref, ref), (mod, cm)), opts)
        ]
        torch.testing.assert_close(l1, l0, **TOL)
        for a, b in zip(list(mod.parameters()) + list(mod.buffers()), list(ref.parameters()) + list(ref.buffers())):
            torch.testing.assert_close(a, b, **TOL)
        assert bool(record) == (step >= async_compile), "lowered at the wrong call"
        if step == async_compile:
            _wait_all(record)  # later steps run the kernels
    assert {("bw" if any(n.name.startswith("tangents") for n in r.gm.graph.nodes) else "fw") for r in record} == {
        "fw",
        "bw",
    }
    assert all(r.ready and r.fallback is None for r in record)


@pytest.fixture
def async_delay1():
    from fastcompile import config

    old = config.get("async_compile"), config.get("async_delay_calls")
    config.set(async_compile=True, async_delay_calls=1)
    yield
    config.set(async_compile=old[0], async_delay_calls=old[1])


def test_async_compile_deferred_lowering_neither_keeps_nor_reads_the_first_calls_tensors(async_delay1):
    """Dynamo hands the backend the caller's real tensors. The deferred lowering works on fake
    copies made then: the first call's tensor is freed, and restriding it in place before the
    lowering call (x.t_()) does not lower the graph for the wrong layout."""
    import gc
    import weakref

    def f(x):
        return (x * 2).sum(-1)

    record = []
    cm = compile_fc(f, record=record)
    x1 = torch.randn(4, 3)
    torch.testing.assert_close(cm(x1), f(x1))  # plain: the graph waits for its next call
    x1.t_()  # now (3, 4): a second graph
    torch.testing.assert_close(cm(x1), f(x1))
    ref = weakref.ref(x1)
    del x1
    for _ in range(3):
        x = torch.randn(4, 3)
        torch.testing.assert_close(cm(x), f(x))  # lowers the (4, 3) graph, then its kernels
        for r in record:
            assert r.wait(300)
    gc.collect()
    assert ref() is None, "the first call's tensor is kept alive"
    assert record and all(r.fallback is None for r in record)


def test_async_compile_deferred_lowering_of_item_uses_dynamos_shape_env(async_delay1):
    """A .item() in the graph (capture_scalar_outputs) makes an unbacked size: the deferred
    lowering needs Dynamo's fake mode and shape env, as without the delay. The setting goes
    through config.patch, which restores it: pytest 9's monkeypatch deletes it at teardown, and
    every later Dynamo compile in the process fails."""

    def f(x):
        return x * x.sum().item() + 1

    record = []
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        cm = torch.compile(f, backend=functools.partial(fbt.backend, record=record), dynamic=False, fullgraph=True)
        for _ in range(3):
            x = torch.randn(5)
            torch.testing.assert_close(cm(x), f(x))
            for r in record:
                assert r.wait(300)
    assert record and all(r.fallback is None for r in record)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_async_compile_fastcompile_compile_matches_eager(name, async_delay1):
    """fastcompile.compile with async compile: inference (our tracer's core route: the first call
    returns the values its trace computed, the next waits for the kernels) and training (the
    autograd route: aot_autograd's graphs, deferred as torch.compile's) match eager at every
    call, before and after the kernels take over."""
    import fastcompile

    ref, mod, x = _training_pair(name)
    cm = _frontend("fastcompile.compile", mod, [])
    ref.eval(), mod.eval()
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cm(x), ref(x), **TOL)
            fastcompile.pending_compiles(wait=True, timeout=300)
    graphs, _ = _fc_graphs(mod)
    assert graphs and all(g.compiled is not None and g.compiled.kernels for g in graphs)
    ref.train(), mod.train()
    fastcompile.reset()
    cm = _frontend("fastcompile.compile", mod, [])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, mod)]
    target = []
    for step in range(4):
        (l0, _), (l1, _) = [
            _sgd_step(model, run, opt, x, target) for (model, run), opt in zip(((ref, ref), (mod, cm)), opts)
        ]
        torch.testing.assert_close(l1, l0, **TOL)
        for a, b in zip(list(mod.parameters()) + list(mod.buffers()), list(ref.parameters()) + list(ref.buffers())):
            torch.testing.assert_close(a, b, **TOL)
        fastcompile.pending_compiles(wait=True, timeout=300)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_fastcompile_compile_runs_an_extern_with_side_effects_once_at_the_first_call(asynchronous):
    """BatchNorm in training mode under no_grad (recalibrating its statistics) is an extern of
    our tracer's core route that updates the running statistics. The trace runs it on the first
    call's inputs: the first call must not run it again (it did: statistics updated twice,
    num_batches_tracked 2 after one call), with async compile or without."""
    import fastcompile
    from fastcompile import config

    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU()).train()
    mod = copy.deepcopy(ref)
    old = config.get("async_compile")
    config.set(async_compile=asynchronous)
    try:
        cm = fastcompile.compile(mod)
        with torch.no_grad():
            for i in range(3):
                x = torch.randn(8, 4)
                torch.testing.assert_close(cm(x), ref(x), **TOL)
                assert int(mod[1].num_batches_tracked) == int(ref[1].num_batches_tracked) == i + 1
                torch.testing.assert_close(mod[1].running_mean, ref[1].running_mean, **TOL)
                torch.testing.assert_close(mod[1].running_var, ref[1].running_var, **TOL)
                fastcompile.pending_compiles(wait=True, timeout=300)
    finally:
        config.set(async_compile=old)


def test_fastcompile_compile_no_grad_autograd_mode_keeps_batchnorm_statistics_updates():
    """A frame traced in autograd mode under no_grad (here: it creates a tensor, torch.zeros)
    with BatchNorm in training mode: aot_autograd's inference graph takes the real buffers and
    keeps their updates, once per call (the module call must not clone its buffers because grad
    is off: that is for the tracer's example run only)."""
    import fastcompile

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.bn = nn.Linear(4, 6), nn.BatchNorm1d(6)

        def forward(self, x):
            return self.bn(self.lin(x) + torch.zeros(x.shape[0], 6))

    torch.manual_seed(0)
    ref = M().train()
    mod = copy.deepcopy(ref)
    fastcompile.reset()
    cm = fastcompile.compile(mod)
    with torch.no_grad():
        for i in range(3):
            x = torch.randn(8, 4)
            torch.testing.assert_close(cm(x), ref(x), **TOL)
            assert int(mod.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == i + 1
            torch.testing.assert_close(mod.bn.running_mean, ref.bn.running_mean, **TOL)
            torch.testing.assert_close(mod.bn.running_var, ref.bn.running_var, **TOL)
    graphs, runners = _fc_graphs(mod)
    assert runners and all(r.inference and r.fallback is None for r in runners)


def test_fastcompile_compile_first_call_compiles_every_segment_in_one_batch():
    """fastcompile.compile's core route on the benchmark MLP's shape (Linear, GELU + LayerNorm,
    Linear, SiLU, Linear): the kernels between the matmuls compile in one batch at the first
    call, with the trace's matmul results standing in for the dry run. The values are eager's."""
    import fastcompile
    from fastcompile import config

    torch.manual_seed(0)
    salt = float(torch.rand(()))  # kernels of this run's own: compiled now
    mod = nn.Sequential(
        nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 8)
    ).eval()

    def f(x):
        return mod(x * (1.0 + salt))

    with torch.no_grad(), config.overriding(specialize_float=True):
        cf = fastcompile.compile(f)
        x = torch.randn(12, 16)
        before = fastcompile.stats()
        torch.testing.assert_close(cf(x), f(x), **TOL)
        after = fastcompile.stats()
        torch.testing.assert_close(cf(x + 1), f(x + 1), **TOL)
    assert after["compiles"] - before["compiles"] >= 2
    assert after["compile_batches"] - before["compile_batches"] == 1


def test_async_compile_deferred_lowering_that_fails_leaves_the_graph_plain_torch(monkeypatch, caplog):
    """async_delay_calls: the call that lowers the graph (aot_autograd, the lowering) meets an
    error: it is logged once, that call and every later one run Dynamo's graph as plain torch."""
    from fastcompile import config

    calls = []

    def broken(gm, example_inputs, mode, record):
        calls.append(1)
        raise RuntimeError("lowering broke")

    monkeypatch.setattr(fbt.compile_fx, "_compile", broken)
    old = config.get("async_compile"), config.get("async_delay_calls")
    config.set(async_compile=True, async_delay_calls=2)
    try:
        fn = lambda x: (x * 2).exp() + 1  # noqa: E731
        cm = compile_fc(fn)
        x = torch.randn(64)
        with caplog.at_level("WARNING", logger="fastcompile"):
            for i in range(5):
                torch.testing.assert_close(cm(x), fn(x))
                assert len(calls) == (0 if i < 2 else 1)
    finally:
        config.set(async_compile=old[0], async_delay_calls=old[1])
    assert len([r for r in caplog.records if "lowering broke" in r.getMessage()]) == 1


def test_async_compile_dynamic_shapes_lower_at_the_first_call(async_compile):
    """A graph with symbolic sizes is lowered when Dynamo hands it over, whatever the delay: a
    later call's tensors would specialize it to their sizes."""
    record = []
    cm = torch.compile(lambda x: (x * 2).exp() + 1, backend=functools.partial(fbt.backend, record=record), dynamic=True)
    x = torch.randn(64)
    torch.testing.assert_close(cm(x), (x * 2).exp() + 1)
    assert record, "a graph of symbolic sizes waited for a later call"
    for n in (64, 100):
        y = torch.randn(n)
        torch.testing.assert_close(cm(y), (y * 2).exp() + 1)


# ----------------------------------------------------------------------------------------------
# batch compile (config.batch_compile): every kernel of the forward and backward graphs compiles
# in one batch at the first call, from layouts the FX metadata predicted
# ----------------------------------------------------------------------------------------------


def test_batch_compile_builds_forward_and_backward_kernels_at_the_first_call():
    """The backward graph is lowered with the forward (force_non_lazy_backward_lowering), both
    render their plans then, and the forward's first call compiles both graphs' kernels: the
    backward runs kernels compiled before it was called, and no call builds a plan (the FX
    metadata predicted every layout, extern results included)."""
    import fastcompile

    torch.manual_seed(0)
    m = Block(d=32, h=4).train()
    x = torch.randn(2, 8, 32)
    ref_m = copy.deepcopy(m)
    record = []
    cm = compile_fc(m, record=record)
    before = fastcompile.stats()["compiles"]
    out = cm(x)
    runners = [r for r in record if r.compiled is not None]
    assert len(record) == 2 and len(runners) == 2  # forward and backward, already
    plans = [r.compiled.nplans for r in runners]
    kernels = [len(r.kernels) for r in runners]
    assert all(plans) and all(kernels) and not any(r._pending for r in runners)
    compiles = fastcompile.stats()["compiles"] - before
    ref = ref_m(x)
    torch.testing.assert_close(out, ref, **TOL)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)
    assert [r.compiled.nplans for r in runners] == plans  # no layout was mispredicted
    assert [len(r.kernels) for r in runners] == kernels
    assert fastcompile.stats()["compiles"] - before == compiles


def test_batch_compile_off_compiles_each_graph_when_it_first_runs(no_batch_compile):
    """batch_compile=0: the backward is lowered lazily (aot_autograd's default) and each segment
    compiles when a call first reaches it; results are the same."""
    torch.manual_seed(0)
    m = MLP().train()
    x = torch.randn(16, 32)
    ref_m = copy.deepcopy(m)
    record = []
    out = compile_fc(m, record=record)(x)
    assert len(record) == 1 and not record[0]._pending  # no backward graph yet
    out.sum().backward()
    ref_m(x).sum().backward()
    assert len(record) == 2
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)


def test_batch_compile_with_async_compile_builds_in_the_background(async_compile):
    """async_compile and batch_compile together: the background thread compiles the batch,
    then the stand-in run finds every plan built."""
    torch.manual_seed(0)
    m = Block(d=32, h=4).eval()
    x = torch.randn(2, 8, 32)
    record = []
    cm = compile_fc(m, record=record)
    with torch.no_grad():
        ref = m(x)
        _plain_calls(record, lambda: torch.testing.assert_close(cm(x), ref, **TOL), async_compile)
        runners = _wait_all(record)
        plans = [r.compiled.nplans for r in runners]
        assert all(plans) and all(len(r.kernels) for r in runners)
        torch.testing.assert_close(cm(x), ref, **TOL)
    assert [r.compiled.nplans for r in runners] == plans


def test_batch_compile_threads_first_calling_two_graphs_compile_each_kernel_once():
    """Two runners whose first calls come at once from two threads: one thread's batch takes
    both runners' kernels, the other waits for it (outside the lock), and no kernel compiles
    twice."""
    import fastcompile
    from torch.fx.experimental.proxy_tensor import make_fx

    k1, k2 = 1.0 + 2.0**-9 * 3, 1.0 + 2.0**-9 * 5  # kernels of this test's own

    def f1(x, w):
        return ((x + k1).exp() @ w).sigmoid() * k1

    def f2(x, w):
        return ((x * k2).tanh() @ w).relu() - k2

    x, w = torch.randn(8, 16), torch.randn(16, 4)
    runners = [fbt.fx_to_graph(make_fx(f)(x, w), [x, w]) for f in (f1, f2)]
    assert all(r._pending for r in runners)
    before = fastcompile.stats()["compiles"]

    def work(i):
        torch.testing.assert_close(runners[i](x, w)[0], (f1, f2)[i](x, w), **TOL)

    assert run_threads(work, 2) == []
    assert not any(r._pending for r in runners)
    assert fastcompile.stats()["compiles"] - before == sum(len(r.kernels) for r in runners) == 4


def test_batch_compile_backward_ahead_failing_falls_back_to_lazy(monkeypatch, caplog):
    """Where lowering the backward ahead makes aot_autograd raise (it re-raises with the
    flag, and defers without it), the backend warns and compiles the graph again the lazy
    way: training still matches eager."""
    real = fbt.fx_to_graph
    calls = []

    def flaky(gm, inputs, mode="default", **kw):
        calls.append(1)
        if len(calls) == 2:  # the first backward graph
            raise RuntimeError("backward lowering broke")
        return real(gm, inputs, mode=mode, **kw)

    monkeypatch.setattr(fbt.compile_fx, "fx_to_graph", flaky)
    torch.manual_seed(0)
    m = MLP().train()
    ref_m = copy.deepcopy(m)
    x = torch.randn(16, 32)
    record = []
    with caplog.at_level("WARNING", logger="fastcompile"):
        out = compile_fc(m, record=record)(x)
    assert "compiling the backward graph ahead failed" in caplog.text
    assert len(record) == 1  # the retry's forward; its backward comes lazily
    out.sum().backward()
    ref_m(x).sum().backward()
    assert len(record) == 2
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)


def test_concurrent_calls_from_threads_get_their_own_results():
    """One compiled graph called from several threads at once (an inference server): each call
    must compute on its own inputs. The runner filled one shared argument list per call, so a
    thread switch between filling it and calling the core could run a call on another's input."""
    f = compile_fc(lambda x, y: (x * y).sin() + y)
    xs = [torch.full((64,), float(i)) for i in range(4)]
    y = torch.linspace(0, 1, 64)
    f(xs[0], y)

    def work(i):
        for _ in range(300):
            torch.testing.assert_close(f(xs[i], y), (xs[i] * y).sin() + y, rtol=1e-5, atol=1e-6)

    assert run_threads(work, 4, switch=1e-6) == []  # switch as often as CPython allows


def test_open_extern_clusters_merge_into_one_call():
    """Two extern clusters that meet at one node (each weight's transpose, then a matmul of both;
    two cumsums, then their product's cumsum) run as one extern call, members in graph order,
    not as one call per cluster."""

    def f(x, w, v):
        a = torch.cumsum(x, 0)  # cluster 1
        b = torch.cumsum(w.t(), 1)  # cluster 2, independent of 1
        c = torch.cumsum(a @ b, 1)  # reads both: they merge
        return c * 2, v + 1

    from torch.fx.experimental.proxy_tensor import make_fx

    args = (torch.randn(4, 8), torch.randn(5, 8), torch.randn(3))
    gm = make_fx(f, decomposition_table=fbt.decompositions())(*args)
    run = fbt.fx_to_graph(gm, list(args))
    out = run(*args)
    for a, b in zip(out, f(*args)):
        torch.testing.assert_close(a, b, **TOL)
    assert run.extern_calls == 1, run.extern_calls


def test_merged_clusters_draw_random_numbers_in_eager_order():
    """Two random draws in separate clusters that merge at a matmul draw in the graph's order:
    the same numbers as eager (flushing the second cluster on its own ran it first)."""

    def f(x):
        a = torch.rand(5, 6)
        b = torch.rand(6, 7)
        return torch.cumsum(a @ b, 1) * x

    c = torch.compile(f, backend=fbt.backend)
    x = torch.randn(5, 7)
    for step in range(3):
        torch.manual_seed(step)
        got = c(x)
        torch.manual_seed(step)
        torch.testing.assert_close(got, f(x), **TOL)


@pytest.mark.parametrize(
    "xs,shape",
    [
        ((1, 64), (4, 32, 64)),
        ((64,), (4, 32, 64)),
        ((4, 1, 64), (4, 32, 64)),
        ((), (2, 3)),
        ((3, 1), (3, 0)),
        ((0,), (2, 0)),
        ("T", (2, 4, 3)),
    ],
)
def test_fast_broadcast_is_numpys(xs, shape):
    """_broadcast (the leaves of views pushed through pointwise ops) gives np.broadcast_to's
    values, shape and read-only flag, for C-contiguous and other arrays, and keeps its source
    alive; a shape that does not broadcast raises NumPy's ValueError."""
    x = np.arange(12.0).reshape(3, 4).T[None, :, :1] if xs == "T" else np.asarray(np.random.randn(*xs))
    ref = np.broadcast_to(x, shape).copy()
    r = fbt.views._broadcast(x, shape)
    del x
    assert r.shape == ref.shape and not r.flags.writeable
    np.testing.assert_array_equal(r, ref)
    with pytest.raises(ValueError):
        fbt.views._broadcast(np.zeros(3), (4,))


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_bfloat16_parameters_updated_through_data_are_seen(mode):
    """A bfloat16 parameter (or, reduce-overhead, input) updated through .data, as an EMA does
    (p.data.mul_), moves no version the tensor shows: a float32 copy cached on the version
    would give later calls the old values."""
    torch.manual_seed(0)
    m = nn.LayerNorm(8).to(torch.bfloat16)
    x = torch.randn(4, 8).to(torch.bfloat16)
    c = torch.compile(
        m, backend=fbt.backend if mode == "default" else functools.partial(fbt.backend, mode=mode), dynamic=False
    )
    with torch.no_grad():
        for k in range(3):
            torch.testing.assert_close(c(x), m(x), rtol=0, atol=0)
            m.weight.data.mul_(1.5)
            m.bias.data.add_(1.0)
            x.data.add_(0.5)


# ----------------------------------------------------------------------------------------------
# fastcompile.profile() over a training step
# ----------------------------------------------------------------------------------------------


def test_profile_names_forward_and_backward_graphs():
    """A training step under fastcompile.profile(): one call row per aot_autograd graph, labelled
    "forward graph N (file:line)" / "backward graph N (...)" from the user's code; the kernels of
    each graph carry its label; the matmuls are extern rows; call time covers kernels and externs."""
    import re
    import fastcompile

    torch.manual_seed(0)
    m = MLP()
    cm = compile_fc(m)
    x = torch.randn(16, 32)
    for _ in range(2):
        cm(x).square().mean().backward()
    with fastcompile.profile() as prof:
        for _ in range(3):
            cm(x).square().mean().backward()
    calls = {r.name: r for r in prof.rows if r.kind == "call"}
    names = sorted(calls)
    assert len(names) == 2 and all(r.calls == 3 for r in calls.values()), names
    # the user code the graphs come from is MLP.forward, in torchhelp.py
    assert re.fullmatch(r"backward graph \d+ \(torchhelp\.py:\d+\)", names[0]), names
    assert re.fullmatch(r"forward graph \d+ \(torchhelp\.py:\d+\)", names[1]), names
    kernels = [r for r in prof.rows if r.kind == "kernel"]
    assert kernels and {r.origin for r in kernels} == set(names)
    assert any(r.kind == "extern" and "mm" in r.name and r.calls % 3 == 0 for r in prof.rows)
    t = prof.totals()
    assert t["call"] >= t["kernel"] + t["extern"] - 1e-3 and t["kernel"] > 0 and t["extern"] > 0
