"""Kernel caches, seen from the graph API.

In memory: a plan per (segment, input key) where the key is dtype, rank,
size-1 pattern, C-contiguity and a zero last stride of every input; sizes
are not in it.
On disk: content-addressed by source, compiler, flags, CPU and version.
Every key component is flipped here and must cause a miss.
"""

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import fastcompile
from conftest import NO_TORCH
from fastcompile.graph import Graph


@pytest.fixture
def cache_dir(tmp_path):
    """A private, empty disk cache for one test; the old one comes back after."""
    old = fastcompile.config.get("cache_dir")
    d = tmp_path / "cache"
    fastcompile.config.set(cache_dir=str(d))
    fastcompile.cache_clear(disk=False)
    yield d
    fastcompile.config.set(cache_dir=old)
    fastcompile.cache_clear(disk=False)


def gelu_graph(dtype="float32", ndim=2):
    g = Graph()
    x = g.input(dtype, ndim)
    g.output(g.call("gelu", x))
    return g


def compiles():
    return fastcompile.stats()["compiles"]


def test_size_change_does_not_recompile(cache_dir):
    f = gelu_graph().compile()
    f(np.ones((4, 8), np.float32))
    before, plans = compiles(), f.nplans
    for shape in [(5, 9), (1000, 3), (2, 70000), (0, 4)]:
        (y,) = f(np.full(shape, 0.5, np.float32))
        assert y.shape == shape
    assert compiles() == before
    assert f.nplans == plans == 1


@pytest.mark.parametrize("flip", ["size1", "contiguity", "zero_last_stride"])
def test_input_key_components_miss(cache_dir, flip):
    f = gelu_graph().compile()
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    if flip == "zero_last_stride":
        x = x[:, ::2]  # non-contiguous, last stride 8
    f(x)
    assert f.nplans == 1
    other = {
        "size1": lambda: x[:, :1],
        "contiguity": lambda: x.T,
        # same shape, still non-contiguous, but the last dim is an expanded one
        "zero_last_stride": lambda: np.broadcast_to(x[:, :1], x.shape),
    }[flip]()
    (y,) = f(other)
    assert f.nplans == 2, "flipping %s must build a new plan" % flip
    expected = 0.5 * other * (1 + np.vectorize(__import__("math").erf)(other / np.sqrt(2)))
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("flip", ["dtype", "rank"])
def test_extern_result_key_components_miss(cache_dir, flip):
    # an extern's result is a segment input whose dtype and rank are only known
    # at run time: they are key components of the segment after it
    g = Graph()
    x = g.input("float64", 2)
    mode = g.input("int8", 0)
    y = g.extern(
        lambda a, m: (a.astype(np.float32) if m else a) if flip == "dtype" else (a.reshape(-1) if m else a), x, mode
    )
    g.output(g.call("exp", y))
    f = g.compile()
    a = np.linspace(-1, 1, 6).reshape(2, 3)
    (r0,) = f(a, np.array(0, np.int8))
    n0 = compiles()
    (r1,) = f(a, np.array(1, np.int8))
    assert f.nplans == 2
    if flip == "dtype":
        assert compiles() == n0 + 1, "a new dtype is new source: one compile"
    assert r1.dtype == (np.float32 if flip == "dtype" else np.float64)
    assert r1.ndim == (2 if flip == "dtype" else 1)
    np.testing.assert_allclose(r1.reshape(r0.shape), np.exp(a), rtol=1e-6)


def test_compiler_flags_and_version_miss(cache_dir):
    x = np.ones((2, 3), np.float32)
    gelu_graph().compile()(x)
    n0 = compiles()
    gelu_graph().compile()(x)  # same key: memory hit, no compile
    assert compiles() == n0
    try:
        fastcompile.config.set(cflags="-DFASTCOMPILE_TEST_FLAG=1")
        gelu_graph().compile()(x)
        assert compiles() == n0 + 1, "extra compiler flags are part of the key"
    finally:
        fastcompile.config.set(cflags="")
    resolved = dict(fastcompile.config.resolved(), version="0.0.0-test")
    try:
        fastcompile._C._configure(resolved)
        gelu_graph().compile()(x)
        assert compiles() == n0 + 2, "the fastcompile version is part of the key"
    finally:
        fastcompile.config.set()  # back to the real version


WARM_SCRIPT = NO_TORCH + textwrap.dedent("""
    import numpy as np, fastcompile
    from fastcompile.graph import Graph
    g = Graph(); x = g.input("float32", 2)
    m = g.call("amax", x, axis=-1, keepdim=True)
    g.output(g.call("softmax", x, axis=-1), g.call("gelu", g.call("sub", x, m)))
    f = g.compile()
    a = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)
    s, y = f(a)
    e = np.exp(a - a.max(-1, keepdims=True))
    assert np.allclose(s, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    st = fastcompile.stats()
    print(st["compiles"], st["disk_hits"])
""")


def run_script(cache, script=WARM_SCRIPT):
    env = dict(os.environ, FASTCOMPILE_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def test_fresh_process_with_warm_cache_makes_no_compiler_call(tmp_path):
    cache = tmp_path / "warm"
    cold = run_script(cache).stdout.split()
    assert int(cold[0]) >= 1
    warm = run_script(cache).stdout.split()
    assert int(warm[0]) == 0, "a warm disk cache must mean zero compiler calls"
    assert int(warm[1]) == int(cold[0])


def test_truncated_shared_object_recompiles_with_warning(cache_dir):
    x = np.linspace(-3, 3, 10, dtype=np.float32).reshape(2, 5)
    f = gelu_graph().compile()
    (good,) = f(x)
    so = f.kernels[0].so_path
    with open(so, "r+b") as fh:
        fh.truncate(100)
    fastcompile.cache_clear(disk=False)  # forget it in memory; the disk copy is now broken
    n0 = compiles()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (again,) = gelu_graph().compile()(x)
    assert compiles() == n0 + 1
    assert any("corrupt" in str(w.message) for w in caught), [str(w.message) for w in caught]
    np.testing.assert_array_equal(again, good)


RACE_SCRIPT = NO_TORCH + textwrap.dedent("""
    import sys, numpy as np, fastcompile
    from fastcompile.graph import Graph
    g = Graph(); x = g.input("float64", 1)
    g.output(g.call("mul", g.call("tanh", x), g.call("sigmoid", x)))
    (y,) = g.compile()(np.linspace(-5, 5, 1001))
    ref = np.tanh(np.linspace(-5, 5, 1001)) / (1 + np.exp(-np.linspace(-5, 5, 1001)))
    assert np.allclose(y, ref, rtol=1e-12, atol=1e-15), "wrong result"
    print("ok")
""")


def test_four_processes_racing_on_one_key(tmp_path):
    cache = tmp_path / "race"
    env = dict(os.environ, FASTCOMPILE_CACHE_DIR=str(cache))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE_SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "ok"
    published = [f for _, _, files in os.walk(cache) for f in files if f.endswith(".so")]
    assert len(published) == 1, published
    leftovers = [
        f
        for _, _, files in os.walk(cache)
        for f in files
        if ".tmp" in f or (f.count(".") > 1 and f != "fc_kernel.h.gch")
    ]
    assert leftovers == []


def test_cache_dir_is_private(cache_dir):
    gelu_graph().compile()(np.ones((1, 1), np.float32))
    assert (os.stat(cache_dir).st_mode & 0o777) == 0o700


def test_mxcsr_unchanged_after_loading_a_kernel(cache_dir):
    before = fastcompile._C._mxcsr()
    g = Graph()
    x = g.input("float32", 1)
    g.output(g.call("exp", x))
    g.compile()(np.ones(3, np.float32))
    assert fastcompile._C._mxcsr() == before
    # denormals still work: FTZ/DAZ were not switched on by the load
    assert np.float32(1e-40) * np.float32(1.0) != 0


def test_cache_clear_disk_empties_the_folder(cache_dir):
    gelu_graph().compile()(np.ones((2, 2), np.float32))
    assert any(f.endswith(".so") for _, _, fs in os.walk(cache_dir) for f in fs)
    fastcompile.cache_clear(disk=True)
    assert not any(f.endswith((".so", ".c", ".meta")) for _, _, fs in os.walk(cache_dir) for f in fs)
    n0 = compiles()
    gelu_graph().compile()(np.ones((2, 2), np.float32))
    assert compiles() == n0 + 1


def test_kernels_of_one_plan_compile_as_one_batch(cache_dir):
    """A plan's kernels are loaded in one batch (their compiler runs overlap): each kernel is one
    compiler call, the results are right, and a process that lost its memory cache finds every
    one of them on disk."""
    g = Graph()
    x = g.input("float32", 2)
    s = g.call("softmax", x, axis=0)  # a column reduction ...
    r = g.call("sum", g.call("exp", x), axis=-1)  # ... and a row one: several kernels
    g.output(s, g.call("tanh", r))
    f = g.compile()
    a = np.random.default_rng(0).standard_normal((33, 70), dtype=np.float32)
    before = compiles()
    got = f(a)
    n = len(f.kernels)
    assert n >= 2 and compiles() - before == n
    e = np.exp(a - a.max(axis=0))
    np.testing.assert_allclose(got[0], e / e.sum(axis=0), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(got[1], np.tanh(np.exp(a).sum(axis=-1)), rtol=2e-6)
    fastcompile.cache_clear(disk=False)
    hits = fastcompile.stats()["disk_hits"]
    f2 = g.compile()
    f2(a)
    assert compiles() - before == n and fastcompile.stats()["disk_hits"] - hits == n


def test_kernels_equal_but_for_their_place_in_the_graph_compile_once(cache_dir):
    """The same fused work at two places of a graph (a layer norm in every layer of a model):
    the kernel text numbers its locals in order of appearance, not by graph node, so the two
    kernels are one text, one name, one key and one compile, and both give the right results.
    Work that differs (the third reduction: a sum, not a softmax) still gets its own kernel."""
    g = Graph()
    x = g.input("float32", 2)
    a = g.call("softmax", x, axis=-1)
    b = g.extern(lambda v: v * 2.0 + 1.0, a)  # splits the graph: a kernel on each side
    c = g.call("softmax", g.call("mul", b, b), axis=-1)
    d = g.extern(lambda v: v - 0.25, c)
    g.output(c, g.call("sum", g.call("mul", d, d), axis=-1))
    f = g.compile()
    v = np.random.default_rng(3).standard_normal((9, 40), dtype=np.float32)
    before = compiles()
    got_c, got_s = f(v)
    assert len(f.kernels) == 3
    names = [k.name for k in f.kernels]
    assert names[0] != names[2] and names[1] != names[2]
    bodies = [k.source.split("*/", 1)[1] for k in f.kernels]
    assert bodies[0] != bodies[1], "mul(b, b) is fused into the second softmax"
    assert compiles() - before == 3
    # the first kernel alone, at another place of another graph: the same text, no compile
    g2 = Graph()
    y = g2.input("float32", 2)
    z = g2.extern(lambda v: v + 0.0, y)
    g2.output(g2.call("softmax", z, axis=-1))
    f2 = g2.compile()
    (got2,) = f2(v)
    assert f2.kernels[0].name == f.kernels[0].name
    assert f2.kernels[0].source.split("*/", 1)[1] == bodies[0]
    assert compiles() - before == 3
    e = np.exp(v - v.max(-1, keepdims=True))
    np.testing.assert_allclose(got2, e / e.sum(-1, keepdims=True), rtol=2e-6, atol=1e-7)
    b_ = (2 * got2 + 1) ** 2
    e = np.exp(b_ - b_.max(-1, keepdims=True))
    np.testing.assert_allclose(got_c, e / e.sum(-1, keepdims=True), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(got_s, ((got_c - 0.25) ** 2).sum(-1), rtol=2e-5)


def test_comment_end_in_the_callers_path_does_not_break_the_kernel(tmp_path):
    """The kernel header names the file that built the graph, inside a C comment: a path with
    "*/" in it must neither end the comment early (the kernel would not compile) nor be lost."""
    d = tmp_path / "odd*"
    d.mkdir()
    script = d / "make.py"
    script.write_text(
        textwrap.dedent("""\
        import numpy as np
        from fastcompile.graph import Graph
        g = Graph()
        x = g.input("float32", 1)
        g.output(g.call("gelu", x))
        f = g.compile()
        (y,) = f(np.array([1.0, -2.0], np.float32))
        print(repr(y.tolist()))
        print(f.kernels[0].source.splitlines()[1])
        """)
    )
    env = dict(
        os.environ, FASTCOMPILE_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(p for p in sys.path if p)
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    values, header = r.stdout.splitlines()
    assert np.allclose(eval(values), [0.8413447, -0.04550026], rtol=1e-6)
    assert "odd*\\/make.py" in header, header


def _segments_graph(n, k):
    """x -> add k -> extern -> add 2k -> extern ... : n segments, so n plans of one kernel each."""
    g = Graph()
    v = g.input("float32", 2)
    for i in range(n):
        v = g.call("add", v, k * (i + 1))
        if i < n - 1:
            v = g.extern(lambda a: a * 2, v)
    g.output(v)
    return g.compile()


@pytest.mark.parametrize("bundles", [True, False])
def test_batch_compile_bundles_kernels_per_compiler_run(cache_dir, bundles):
    """The compile_bundles knob, end to end: a batch (Compiled._load_pending) with more kernels
    than CPUs compiles them in one compiler run per CPU, or one run per kernel with the knob off;
    the results are the same either way."""
    workers = min(max(os.sysconf("SC_NPROCESSORS_ONLN"), 1), 16)
    n = workers + 2
    k = 1.0 + 2.0**-7 * (3 if bundles else 5)
    c = _segments_graph(n, k)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    old = fastcompile.config.get("compile_bundles")
    fastcompile.config.set(compile_bundles=bundles)
    try:
        c._prebuild((a,), [np.empty_like] * (n - 1))
        before = fastcompile.stats()
        assert fastcompile.graph.Compiled._load_pending([c]) == n
        after = fastcompile.stats()
    finally:
        fastcompile.config.set(compile_bundles=old)
    assert after["compiles"] - before["compiles"] == n
    assert after["compiler_runs"] - before["compiler_runs"] == (workers if bundles else n)
    want = a
    for i in range(n):
        want = want + np.float32(k * (i + 1))
        if i < n - 1:
            want = want * 2
    np.testing.assert_allclose(c(a)[0], want, rtol=1e-6)
