"""fastcompile.profile(): time per generated kernel, extern function and compiled graph
(csrc/runtime/profile.c, python/fastcompile/profiler.py). Counts, elements and bytes are
checked exactly; times only by their order (a sleeping extern takes at least its sleep, a call at
least its kernels and externs), as the machine is shared."""

import gc
import os
import sys
import time

import numpy as np
import pytest

import fastcompile
from fastcompile import _C
from fastcompile.graph import Graph


def _softmax():
    g = Graph()
    x = g.input("float32", 2)
    e = g.call("exp", x)
    g.output(g.call("div", e, g.call("sum", e, axis=1, keepdims=True)))
    return g.compile()


def _rows(prof):
    return {(r.kind, r.name): r for r in prof.rows}


def test_kernel_and_call_rows_count_every_call():
    f = _softmax()
    a = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
    f(a)  # compiled before the block: no compile row
    with fastcompile.profile() as prof:
        for _ in range(5):
            (y,) = f(a)
    e = np.exp(a)
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    rows = _rows(prof)
    call = rows[("call", f.origin)]
    assert call.calls == 5 and call.ns > 0 and call.origin == f.origin
    kernels = [r for r in prof.rows if r.kind == "kernel"]
    assert sorted(r.name for r in kernels) == sorted(k.name for k in f.kernels)
    for r in kernels:
        assert r.calls == 5 and r.ns > 0 and r.elements == 5 * a.size
        assert r.bytes == 5 * 2 * a.nbytes  # the input read, the output written: each once
        assert r.gbps == r.bytes / r.ns and r.mean_us == r.ns / 1e3 / 5
        assert os.path.exists(r.path) and r.name in open(r.path).read()
        assert r.origin == f.origin
    assert not any(r.kind == "compile" for r in prof.rows)
    t = prof.totals()
    assert t["call"] >= t["kernel"] > 0 and t["extern"] == 0
    assert t["other"] == pytest.approx(t["call"] - t["kernel"])
    assert prof.wall_ms >= t["call"] and prof.dropped == 0


def test_bytes_count_a_broadcast_operand_once():
    """A (1, n) row added to (m, n): the row's bytes once, not once per row it is read for."""
    g = Graph()
    x, b = g.input("float32", 2), g.input("float32", 2)
    g.output(g.call("add", x, b))
    f = g.compile()
    a = np.ones((64, 100), np.float32)
    row = np.ones((1, 100), np.float32)
    expanded = np.broadcast_to(row, (64, 100))  # stride 0: still 100 elements in memory
    for second in (row, expanded):
        f(a, second)
        with fastcompile.profile() as prof:
            f(a, second)
        (r,) = [r for r in prof.rows if r.kind == "kernel"]
        assert r.elements == a.size and r.bytes == 2 * a.nbytes + row.nbytes, r


def test_extern_rows_time_the_python_call():
    def slow_double(t):
        time.sleep(0.002)
        return t * 2

    g = Graph()
    x = g.input("float32", 1)
    g.output(g.call("exp", g.extern(slow_double, g.call("neg", x))))
    f = g.compile()
    a = np.arange(10, dtype=np.float32)
    f(a)
    with fastcompile.profile() as prof:
        for _ in range(3):
            (y,) = f(a)
    np.testing.assert_allclose(y, np.exp(-a * 2), rtol=1e-6)
    rows = _rows(prof)
    ext = rows[("extern", slow_double.__qualname__)]
    assert ext.calls == 3 and ext.ns >= 3 * 2e6 and ext.origin == f.origin
    assert rows[("call", f.origin)].ns >= ext.ns
    assert sum(r.calls for r in prof.rows if r.kind == "kernel") == 2 * 3  # neg, then exp
    assert prof.totals()["extern"] >= 6.0


def test_compiles_a_call_waits_for_are_their_own_row():
    f = _softmax()
    a = np.ones((8, 8), np.float32)
    with fastcompile.profile() as prof:
        f(a)
        f(a)
    rows = _rows(prof)
    comp = rows[("compile", f.origin)]
    assert comp.calls == 1 and comp.ms == pytest.approx(f.compile_ms, rel=1e-3, abs=1e-3)
    assert rows[("call", f.origin)].calls == 2


def test_nothing_recorded_outside_a_block_and_blocks_nest():
    f = _softmax()
    a = np.ones((16, 16), np.float32)
    f(a)
    with fastcompile.profile() as outer:
        f(a)
        with fastcompile.profile() as inner:
            f(a)
            f(a)
        f(a)
    f(a)  # after the blocks: not recorded anywhere
    assert _rows(inner)[("call", f.origin)].calls == 2
    assert _rows(outer)[("call", f.origin)].calls == 4
    assert _C._profile_read()[0] == _C._profile_read()[0]
    before = _C._profile_read()[0]
    f(a)
    assert _C._profile_read()[0] == before  # recording is off


def test_an_exception_in_the_block_switches_recording_off():
    f = _softmax()
    a = np.ones((4, 4), np.float32)
    with pytest.raises(ZeroDivisionError):
        with fastcompile.profile() as prof:
            f(a)
            1 / 0
    assert _rows(prof)[("call", f.origin)].calls == 1
    before = _C._profile_read()[0]
    f(a)
    assert _C._profile_read()[0] == before


def test_label_names_the_call_rows():
    f = _softmax()
    a = np.ones((4, 4), np.float32)
    assert f.label == f.origin
    f.label = "my softmax"
    with fastcompile.profile() as prof:
        f(a)
    assert ("call", "my softmax") in _rows(prof) and f.label == "my softmax"
    with pytest.raises(TypeError):
        f.label = 3
    f.label = None
    assert f.label == f.origin
    with fastcompile.profile() as prof:
        f(a)
    assert ("call", f.origin) in _rows(prof)


def test_the_table():
    f = _softmax()
    a = np.ones((32, 32), np.float32)
    f(a)
    with fastcompile.profile() as prof:
        f(a)
    text = str(prof)
    assert text.startswith("fastcompile profile:") and "1 call of compiled graphs" in text
    for k in f.kernels:
        assert k.name in text
    assert "kernels" in text and "externs" in text and "GB/s" in text
    few = prof.table(top=1)
    assert "1 more row" in few and "more row" not in text
    assert repr(prof).startswith("<fastcompile Profile: ")


def test_reading_the_table_leaks_nothing():
    f = _softmax()
    a = np.ones((4, 4), np.float32)
    f.label = "leak check"
    label = f.label
    f(a)
    with fastcompile.profile():
        for _ in range(3):
            f(a)
    gc.collect()
    ra, rl = sys.getrefcount(a), sys.getrefcount(label)
    for _ in range(200):
        with fastcompile.profile() as prof:
            f(a)
        assert prof.rows
    del prof
    gc.collect()
    assert (sys.getrefcount(a), sys.getrefcount(label)) == (ra, rl)


def test_traced_functions_are_labelled_by_their_code():
    def scaled_exp(x):
        return np.exp(x) * 2.0 + 1.0

    cf = fastcompile.compile(scaled_exp)
    a = np.ones(1000, np.float32)
    cf(a)
    with fastcompile.profile() as prof:
        np.testing.assert_allclose(cf(a), np.exp(a) * 2.0 + 1.0, rtol=1e-6)
    calls = [r.name for r in prof.rows if r.kind == "call"]
    assert calls == ["scaled_exp (test_profile.py:%d)" % scaled_exp.__code__.co_firstlineno], calls
    assert any(r.kind == "kernel" and r.calls == 1 for r in prof.rows)


def test_extern_rows_name_the_traced_function_and_skip_stand_ins():
    """fastcompile.compile's externs are named after the NumPy function they call; runs with
    stand-in externs (Compiled._warm, as a background compile does) add no extern row and no
    kernel row: only calls are profiled."""

    def matexp(a, b):
        return np.exp(a @ b) + 1.0

    cf = fastcompile.compile(matexp)
    a = np.full((8, 8), 0.1, np.float32)
    with fastcompile.profile() as prof:
        for _ in range(2):
            np.testing.assert_allclose(cf(a, a), np.exp(a @ a) + 1.0, rtol=1e-5)
    ext = [r for r in prof.rows if r.kind == "extern"]
    assert [(r.name, r.calls) for r in ext] == [("extern__operator_matmul", 2)], ext

    g = Graph()
    x = g.input("float32", 1)
    g.output(g.call("exp", g.extern(lambda t: t * 2, g.call("neg", x))))
    f = g.compile()
    v = np.arange(4, dtype=np.float32)
    f(v)
    with fastcompile.profile() as prof:
        f._warm((v,), [lambda t: t * 3])
    assert prof.rows == [], prof.rows
