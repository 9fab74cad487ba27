"""Autotuning (csrc/runtime/tune.c): Compiled.autotune, fastcompile.config.autotune and what
Compiled.tuning reports. The times themselves are never asserted (shared machine); what is:
the candidates offered, that the fastest is the one recorded, that a launch shape is timed
once and then used, that results stay right (bitwise where the kernel does not depend on the
thread count), and that errors and small launches behave as without tuning."""

import numpy as np
import pytest

import fastcompile
from conftest import assert_close_np, lay_transposed, run_threads, traced_growth
from fastcompile.graph import Graph

NCORES = fastcompile.config.resolved()["num_threads"]


def thread_counts():
    out, n = [], 1
    while n < NCORES:
        out.append(n)
        n *= 2
    return out + [NCORES]


def mul_graph(autotune=True):
    g = Graph()
    x, y = g.input("float32", 2), g.input("float32", 2)
    g.output(g.call("mul", x, y))
    f = g.compile()
    f.autotune = autotune
    return f


def check_entry(e, kernel_names):
    assert e["kernel"] in kernel_names
    cands = e["candidates"]
    assert cands and all(us > 0 for _, _, us in cands)
    assert (e["threads"], e["block"], e["us"]) == min(cands, key=lambda c: c[2])
    assert {t for t, _, _ in cands} == set(thread_counts())


def test_off_by_default():
    f = mul_graph(autotune=None)
    assert f.autotune is None and not fastcompile.config.autotune
    a = np.ones((256, 256), np.float32)
    f(a, a)
    assert f.tuning == []


def test_autotune_attribute_takes_bools_and_none():
    f = mul_graph()
    assert f.autotune is True
    f.autotune = False
    assert f.autotune is False
    f.autotune = None
    assert f.autotune is None
    with pytest.raises(TypeError, match="True, False or None"):
        f.autotune = 1
    del f.autotune
    assert f.autotune is None


def test_strided_pointwise_tunes_threads_and_column_blocks():
    """x * y.T runs as column blocks (plan.c column_block): widths 16..512 narrower than the
    row, the runtime's own 64, and the launch whole are offered, each with every thread count."""
    f = mul_graph()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 1024)).astype(np.float32)
    b = lay_transposed(rng.standard_normal((512, 1024)).astype(np.float32))
    (out,) = f(a, b)
    assert_close_np(out, a * b)
    (e,) = f.tuning
    check_entry(e, {k.name for k in f.kernels})
    assert e["outer"] == (512, 1024) and e["uses"] == 0
    blocks = {bl for _, bl, _ in e["candidates"]}
    assert blocks == {0, 16, 32, 64, 128, 256, 512}
    assert len(e["candidates"]) == len(blocks) * len(thread_counts())
    for i in range(3):  # timed once, then used
        (out,) = f(a, b)
        assert_close_np(out, a * b)
    (e2,) = f.tuning
    assert e2["uses"] == 3 and e2["candidates"] == e["candidates"]


def test_contiguous_pointwise_offers_no_blocks():
    f = mul_graph()
    a = np.full((300, 100), 3.0, np.float32)
    f(a, a)
    (e,) = f.tuning
    assert {bl for _, bl, _ in e["candidates"]} == {0}


def test_each_launch_shape_is_tuned_once_and_the_table_is_capped():
    f = mul_graph()
    for rows in range(100, 111):  # 11 shapes, all past the size floor
        a = np.ones((rows, 64), np.float32)
        f(a, a)
        f(a, a)
    entries = f.tuning
    assert len(entries) == 8  # FC_TUNE_MAXENTRIES: the oldest go
    assert sorted(e["outer"] for e in entries) == [(r * 64,) for r in range(103, 111)]  # collapsed to 1-d
    assert all(e["uses"] == 1 for e in entries)


def test_small_launches_are_not_timed():
    f = mul_graph()
    a = np.ones((63, 64), np.float32)  # 4032 elements < FC_TUNE_MIN_ELEMS
    f(a, a)
    assert f.tuning == []


@pytest.mark.parametrize("rows,cols", [(512, 300), (3, 40000)])  # rows per thread; split rows
def test_reductions_stay_right(rows, cols):
    g = Graph()
    x = g.input("float64", 2)
    m = g.call("amax", x, axis=-1, keepdim=True)
    e = g.call("exp", g.call("sub", x, m))
    g.output(g.call("div", e, g.call("sum", e, axis=-1, keepdim=True)), g.call("sum", x, axis=-1))
    f = g.compile()
    f.autotune = True
    a = np.random.default_rng(1).standard_normal((rows, cols))
    for _ in range(2):
        sm, s = f(a)
        ref = np.exp(a - a.max(-1, keepdims=True))
        assert_close_np(sm, ref / ref.sum(-1, keepdims=True), kind="reduction", atol=1e-15)
        assert_close_np(s, a.sum(-1), kind="reduction", atol=cols * 2.2e-16 * np.abs(a).sum(-1).max())
    assert f.tuning and all(e["inner"] == (cols,) for e in f.tuning)


def test_pointwise_results_bitwise_equal_to_untuned():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((700, 900)).astype(np.float32)
    b = lay_transposed(rng.standard_normal((900, 700)).astype(np.float32).T.copy())
    outs = []
    for tune in (False, True):
        g = Graph()
        x, y = g.input("float32", 2), g.input("float32", 2)
        g.output(g.call("gelu", g.call("add", x, y)))
        f = g.compile()
        f.autotune = tune
        outs.append(f(a, b)[0])
    assert np.array_equal(outs[0], outs[1])


def test_kernel_error_raises_and_records_nothing():
    g = Graph()
    x, y = g.input("int64", 1), g.input("int64", 1)
    g.output(g.call("pow", x, y))
    f = g.compile()
    f.autotune = True
    a = np.arange(5000, dtype=np.int64)
    b = np.ones(5000, np.int64)
    b[4321] = -1
    with pytest.raises(ValueError, match="negative integer powers"):
        f(a, b)
    assert f.tuning == []
    b[4321] = 2
    (out,) = f(a, b)
    assert_close_np(out, a**b)
    assert len(f.tuning) == 1


def test_config_knob_and_per_graph_override():
    old = fastcompile.config.autotune
    try:
        fastcompile.config.set(autotune=True)
        follows, off = mul_graph(autotune=None), mul_graph(autotune=False)
        a = np.ones((128, 128), np.float32)
        follows(a, a)
        off(a, a)
        assert len(follows.tuning) == 1 and off.tuning == []
    finally:
        fastcompile.config.set(autotune=old)


def test_environment_turns_it_on(monkeypatch):
    """FASTCOMPILE_AUTOTUNE=1 is read at import: a fresh interpreter tunes graphs that do not say."""
    from conftest import run_isolated

    monkeypatch.setenv("FASTCOMPILE_AUTOTUNE", "1")
    r = run_isolated("""
        import numpy as np
        import fastcompile
        from fastcompile.graph import Graph
        assert fastcompile.config.autotune is True
        g = Graph(); x = g.input("float32", 1); g.output(g.call("exp", x)); f = g.compile()
        f(np.ones(10000, np.float32))
        print("entries", len(f.tuning))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["entries", "1"]


def test_tuning_report_and_tuned_calls_do_not_leak():
    """Compiled.tuning builds new dicts each time; tuned launches take the table's entry. Neither
    may keep references to the inputs or grow traced memory."""
    import sys

    f = mul_graph()
    a = np.ones((200, 100), np.float32)
    f(a, a)
    refs = sys.getrefcount(a)
    for _ in range(200):
        f(a, a)
        assert f.tuning[0]["uses"] > 0
    assert sys.getrefcount(a) == refs

    def step():
        f.tuning
        f(a, a)

    grew = traced_growth(step, 200, 2000)
    assert grew < 64 * 1024, "grew by %d bytes over 2,000 calls" % grew


def test_threads_tuning_one_shape_at_once_record_it_once():
    """Calls from several threads that meet an untuned launch shape together (tuning runs
    without the GIL) each time it, but the table keeps one entry for the shape, not one per
    thread (which filled slots of the 8-entry ring and evicted other shapes)."""
    f = mul_graph(autotune=False)
    a = np.ones((256, 512), np.float32)
    b = lay_transposed(np.full((256, 512), 2, np.float32))
    f(a[:8], b[:8])  # the plan (layouts, not sizes) exists: only tuning is left
    nk = len(f.kernels)
    f.autotune = True

    def work(i):
        np.testing.assert_array_equal(f(a, b)[0], a * b)

    assert run_threads(work, 3) == []
    assert len(f.kernels) == nk
    assert len(f.tuning) == 1, [(e["outer"], e["inner"], e["uses"]) for e in f.tuning]


def test_threads_offered_cover_every_count_and_block():
    """With 256 threads allowed, every thread count 1, 2, ... 256 is offered with every block
    width (the candidate table held 48, and the widest blocks at high counts were dropped)."""
    old = fastcompile.config.resolved()["num_threads"]
    fastcompile.config.set(num_threads=256)
    try:
        f = mul_graph()
        a = np.ones((64, 1024), np.float32)
        f(a, lay_transposed(a))
        (e,) = f.tuning
    finally:
        fastcompile.config.set(num_threads=old)
    threads = {t for t, _, _ in e["candidates"]}
    blocks = {b for _, b, _ in e["candidates"]}
    assert threads == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert len(blocks) >= 7 and len(e["candidates"]) == len(threads) * len(blocks)
