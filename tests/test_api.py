"""The frontend end to end: fastcompile.compile / explain / reset through the real
PEP 523 hook (csrc/hook), the tracer (python/fastcompile/trace) and the core.

Goldens: tests/golden/explain/<case>.txt holds str(explain(fn)(*args)) after
normalize() (addresses, timings, kernel names and cache paths, absolute paths,
resume offsets and the 3.11/3.12 names of conditional jumps become stable
tokens), one file per corpus entry, shared by Python 3.11 and 3.12.
FASTCOMPILE_UPDATE_GOLDEN=1 rewrites them.
"""
import contextlib
import gc
import io
import math
import os
import re
import sys
import threading
import traceback
import types
import warnings
import weakref

import numpy as np
import pytest

import fastcompile
from fastcompile import _C, trace
from fastcompile.api import FastcompileWarning
from fastcompile.explain import _Recorder

import trace_corpus as C
from test_trace import same

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden", "explain")
UPDATE = os.environ.get("FASTCOMPILE_UPDATE_GOLDEN", "") not in ("", "0")
THIS = os.path.basename(__file__)


@pytest.fixture(autouse=True)
def _clean():
    fastcompile.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastcompileWarning)     # an internal error must fail the test
        yield
    assert _C.set_eval_frame(None) is None, "a test left this thread's hook mode on"
    fastcompile.reset()


def entries(fn):
    return _C.code_entries(fn.__code__)


def line_of(fn, text):
    """The line number of the first source line of fn containing text."""
    import inspect
    lines, start = inspect.getsourcelines(fn)
    for i, ln in enumerate(lines):
        if text in ln:
            return start + i
    raise AssertionError("%r not in %s" % (text, fn.__name__))


# ----------------------------------------------------------------------------------------------
# golden explain() texts
# ----------------------------------------------------------------------------------------------

def normalize(text):
    """explain() text -> the same text with machine-, run- and version-specific parts as tokens."""
    text = re.sub(r"(?:[^\s()'\"]*/)?[0-9a-f]{2}/[0-9a-f]{64}\.c\b", "<kernel cache>/<sha256>.c", text)
    text = re.sub(r"\bfc_[0-9a-f]{16}\b", "fc_<hash>", text)
    text = re.sub(r"0x[0-9a-fA-F]+", "0x<addr>", text)
    text = re.sub(r"in \d+(?:\.\d+)? ms", "in <t> ms", text)
    text = re.sub(r"(?:[^\s()'\"]*/)([\w.-]+\.py)\b", r"\1", text)           # paths -> basenames
    text = re.sub(r"__resume\w+", lambda m: re.sub(r"_at_\d+", "_at_<offset>", m.group(0)), text)
    text = re.sub(r"POP_JUMP_(?:FORWARD_|BACKWARD_)?IF_", "POP_JUMP_IF_", text)   # 3.11 vs 3.12 names
    # guards sorted within each frame: 3.12 inlines comprehensions, so loads (and guards) come
    # in another order than on 3.11
    out, block = [], None
    for line in text.split("\n"):
        if block is not None and line.startswith("    ") and not line.startswith("     "):
            block.append(line)
            continue
        if block is not None:
            out.extend(sorted(block))
            block = None
        out.append(line)
        if re.match(r"  Guards \(\d+\):$", line):
            block = []
    if block is not None:
        out.extend(sorted(block))
    return "\n".join(out)


def check_golden(name, text):
    path = os.path.join(GOLDEN, name + ".txt")
    text = normalize(text).rstrip("\n") + "\n"
    if UPDATE or not os.path.exists(path):
        if not UPDATE:
            pytest.fail("no golden %s (run with FASTCOMPILE_UPDATE_GOLDEN=1 to write it)" % path)
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return
    with open(path) as f:
        want = f.read()
    assert text == want, "explain() text differs from %s:\n%s" % (path, text)


def test_normalize():
    raw = ("Frame f (/a/b/tests/x.py:3): 1 graph(s), 0 break(s), traced and compiled in 12.5 ms\n"
           "  graph 0: fc_0123456789abcdef  /root/.cache/fastcompile/4a/" + "4a" * 32 + ".c\n"
           "  Guards (2):\n"
           "    G['m'] is <MLP object at 0x7f29561a9670>\n"
           "    G['a'] is module numpy\n"
           "Frame __resume___resume_f_at_40_at_152 (tests/x.py:3)\n"
           "  data-dependent branch (POP_JUMP_FORWARD_IF_FALSE)")
    assert normalize(raw) == (
        "Frame f (x.py:3): 1 graph(s), 0 break(s), traced and compiled in <t> ms\n"
        "  graph 0: fc_<hash>  <kernel cache>/<sha256>.c\n"
        "  Guards (2):\n"
        "    G['a'] is module numpy\n"
        "    G['m'] is <MLP object at 0x<addr>>\n"
        "Frame __resume___resume_f_at_<offset>_at_<offset> (x.py:3)\n"
        "  data-dependent branch (POP_JUMP_IF_FALSE)")


def _case_ids(cases):
    seen, ids = {}, []
    for c in cases:
        seen[c.name] = seen.get(c.name, 0) + 1
        ids.append(c.name if seen[c.name] == 1 else "%s_%d" % (c.name, seen[c.name]))
    return ids


CASE_IDS = _case_ids(C.CASES)


def check_result(got, expected):
    if C.torch is not None:
        torch = C.torch
        if isinstance(expected, torch.Tensor):
            torch.testing.assert_close(got, expected)
        elif isinstance(expected, (tuple, list)) and any(isinstance(e, torch.Tensor) for e in expected):
            assert type(got) is type(expected) and len(got) == len(expected)
            for g, e in zip(got, expected):
                check_result(g, e)
            return
    same(got, expected)


@pytest.mark.parametrize("case", C.CASES, ids=CASE_IDS)
def test_corpus_compiled_and_explained(case, capsys, request):
    if case.torch:
        pytest.importorskip("torch", reason="torch is not installed for this Python")
    name = request.node.callspec.id
    compiled = fastcompile.compile(case.fn)
    for _ in range(2):                              # a trace, then a cache hit
        args = case.args()
        expected = case.fn(*args, **case.kwargs)
        printed = capsys.readouterr().out
        got = compiled(*args, **case.kwargs)
        assert capsys.readouterr().out == printed   # side effects once, in order
        check_result(got, expected)
    assert _C.code_state(case.fn.__code__) == "active"
    if case.fn is not C.br_side_effect:         # see test_outside_list_append_does_not_recompile
        assert len(entries(case.fn)) == 1, "recompiled on same-shaped arguments: %r" % entries(case.fn)
    C.LOG.clear()                                   # the golden holds guards on it (br_side_effect)
    if case.torch:
        C.torch.manual_seed(0)                      # values reach guards after a break (.item())
    out = fastcompile.explain(case.fn)(*case.args(), **case.kwargs)
    capsys.readouterr()
    text = str(out)
    # the first frame is the traced function itself: its counts are the corpus's
    first = re.search(r"^Frame (\S+) .*?: (\d+) graph\(s\), (\d+) break\(s\)", text, re.M)
    assert first and first.group(1) == case.fn.__name__
    assert (int(first.group(2)), int(first.group(3))) == (case.graphs, case.breaks), text
    assert out.graph_count == len(out.graphs) == len(out.ops_per_graph)
    assert out.graph_break_count == len(out.break_reasons) >= case.breaks
    assert "Graph count: %d\nGraph break count: %d" % (out.graph_count, out.graph_break_count) in text
    for b in out.break_reasons:
        assert b.reason and b.user_stack
        fname, lineno = b.user_stack[-1][:2]
        assert "%s:%d" % (os.path.basename(fname), lineno) in normalize(text)
    for g in out.out_guards:
        assert g in text and not re.search(r"<(module|function|type|builtin_function_or_method) at", g), g
    check_golden(name, text)


def test_outside_list_append_does_not_recompile():
    """A list read from outside the frame is guarded on its length only where the trace reads
    its items or length: appending to it (a graph break) changed the length each call, and each
    call recompiled until the variant limit made the function run uncompiled."""
    f = fastcompile.compile(C.br_side_effect)
    x = C.a2(5, 6)
    n = len(C.LOG)
    for _ in range(3):
        same(f(x), x + 1)
    assert len(C.LOG) == n + 3                      # the append ran at every call
    assert len(entries(C.br_side_effect)) == 1


_OUTSIDE_DICT = {}


def _dict_insert(x):
    y = x + 1
    _OUTSIDE_DICT[id(y)] = 1                       # a store into an outside dict: a graph break
    return y * 2


def test_outside_dict_insert_does_not_recompile():
    """As for lists: an outside dict is guarded on its length only where its items are read."""
    f = fastcompile.compile(_dict_insert)
    x = C.a2(5, 6)
    n = len(_OUTSIDE_DICT)
    try:
        for _ in range(3):
            same(f(x), (x + 1) * 2)
        assert len(_OUTSIDE_DICT) >= n + 1          # the stores ran (ids may repeat)
        assert len(entries(_dict_insert)) == 1
    finally:
        _OUTSIDE_DICT.clear()


def _read_outside_dict(x):
    return x * _SCALES["a"] + len(_SCALES) + _SCALES["k"]


_SCALES = {"a": 2.0, "k": 3}


def test_an_outside_dict_whose_items_are_read_is_still_guarded():
    f = fastcompile.compile(_read_outside_dict)
    x = C.a2(5, 6)
    try:
        same(f(x), _read_outside_dict(x))
        _SCALES["a"] = 5.0                          # a float item changed: read at each call
        same(f(x), _read_outside_dict(x))
        assert len(entries(_read_outside_dict)) == 1
        _SCALES["k"] = 4                            # an int item changed: traced again
        same(f(x), _read_outside_dict(x))
        _SCALES["b"] = 1.0                          # the length changed: traced again
        same(f(x), _read_outside_dict(x))
        assert len(entries(_read_outside_dict)) == 3
    finally:
        _SCALES.clear()
        _SCALES.update(a=2.0, k=3)


def _sum_outside(x):
    return x * len(_OUTSIDE) + _OUTSIDE[0]


_OUTSIDE = [1.0, 2.0]


def test_an_outside_list_whose_items_are_read_is_still_guarded():
    f = fastcompile.compile(_sum_outside)
    x = C.a2(5, 6)
    try:
        same(f(x), _sum_outside(x))
        _OUTSIDE.append(3.0)                        # the length changed: traced again
        same(f(x), _sum_outside(x))
        _OUTSIDE[0] = 5.0                           # a float item changed: read at each call
        same(f(x), _sum_outside(x))
        assert len(entries(_sum_outside)) == 2
        _OUTSIDE[0] = 5                             # its type changed: traced again
        same(f(x), _sum_outside(x))
        assert len(entries(_sum_outside)) == 3
    finally:
        del _OUTSIDE[2:]
        _OUTSIDE[0] = 1.0


def test_every_golden_has_a_case():
    if not os.path.isdir(GOLDEN):
        pytest.skip("no goldens yet")
    names = {f[:-4] for f in os.listdir(GOLDEN) if f.endswith(".txt")}
    if C.torch is None:                         # no torch cases without torch
        names = {n for n in names if not n.startswith("th_")}
    assert names <= set(CASE_IDS), "stale goldens: %s" % sorted(names - set(CASE_IDS))


def test_explain_fields_and_report():
    x = C.a2(5, 6)
    out = fastcompile.explain(C.br_data_branch)(x)
    assert out.graph_count == 2 and out.graph_break_count == 1
    assert out.ops_per_graph == [["mul", "sum", "gt"], ["sub"]] or out.ops_per_graph[0][:2] == ["mul", "sum"]
    (b,) = out.break_reasons
    assert "data-dependent branch" in b.reason and "hint:" in b.reason
    assert b.user_stack[-1][:3] == (C.br_data_branch.__code__.co_filename,
                                    line_of(C.br_data_branch, "if y.sum()"), "br_data_branch")
    assert len(out.compile_times) == 2 and all(t >= 0 for _, t in out.compile_times)
    assert out.kernels and all(os.path.exists(path) and path.endswith(".c") for _, _, path in out.kernels)
    assert "L['x'] is ndarray float32 ndim=2" in "\n".join(out.out_guards)
    assert out.recompiles == []


# ----------------------------------------------------------------------------------------------
# the hook: references, threads, recursion, generators
# ----------------------------------------------------------------------------------------------

def _axpy(x, y):
    return x * 2.0 + y


_SINK = io.StringIO()


def _with_break(x, y):
    z = x + y
    print("", end="", file=_SINK)
    return z * 2.0


def _frames():
    return sum(1 for o in gc.get_objects() if isinstance(o, types.FrameType))


@pytest.mark.parametrize("fn", [_axpy, _with_break], ids=["callable_target", "code_target"])
def test_refcounts_unchanged_after_10000_calls(fn):
    x, y = C.a2(4, 5), C.a2(4, 5, seed=1)
    f = fastcompile.compile(fn)
    np.testing.assert_array_equal(f(x, y), fn(x, y))       # traced
    f(x, y)                                                  # resume functions traced too
    gc.collect()
    before = (sys.getrefcount(fn.__code__), sys.getrefcount(fn), sys.getrefcount(x), sys.getrefcount(y),
              _frames())
    for _ in range(10000):
        f(x, y)
    gc.collect()
    after = (sys.getrefcount(fn.__code__), sys.getrefcount(fn), sys.getrefcount(x), sys.getrefcount(y),
             _frames())
    assert after == before
    (e,) = entries(fn)
    assert e.hits >= 10000


def _t_double(x):
    return x * 2 + 1


def _t_reduce(x):
    return np.sum(x * x, axis=-1)


def test_two_threads():
    errors = []
    barrier = threading.Barrier(2)
    fa, fb = fastcompile.compile(_t_double), fastcompile.compile(_t_reduce)

    def work(f, ref, dtype, seed):
        try:
            barrier.wait()
            for i in range(200):
                x = C.a2(3 + i % 5, 7, dtype=dtype, seed=seed + i)
                got, want = f(x), ref(x)
                assert_close = np.testing.assert_allclose
                assert got.dtype == want.dtype
                assert_close(got, want, rtol=1e-5)
        except BaseException as e:          # noqa: B902  reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(fa, _t_double, np.float32, 0)),
          threading.Thread(target=work, args=(fb, _t_reduce, np.float64, 1000))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert len(entries(_t_double)) == 1 and len(entries(_t_reduce)) == 1


def _rec(x, n):
    if n == 0:
        return x
    return _rec(x * 2, n - 1) + 1


def _rec_break(x, n):
    if n == 0:
        return x
    print("", end="", file=_SINK)
    return _rec_break(x + 1, n - 1) * 2


def test_recursion():
    x = C.a2(3, 4)
    f = fastcompile.compile(_rec)
    for n in (0, 3, 5):
        np.testing.assert_allclose(f(x, n), _rec(x, n), rtol=1e-6)
    g = fastcompile.compile(_rec_break)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FastcompileWarning)     # n differs at every level: past 8 variants
        for n in (1, 4, 12):
            np.testing.assert_allclose(g(x, n), _rec_break(x, n), rtol=1e-6)
    assert sys.getrecursionlimit() > 100
    with pytest.raises(RecursionError):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FastcompileWarning)
            g(x, 100000)


def _gen(x, n):
    for i in range(n):
        yield x * i


def _uses_gen(x):
    y = x + 1
    return sum(_gen(y, 3))


def _gen_fn(x):
    y = x * 2
    yield y
    yield y + 1


def test_generators_untouched():
    x = C.a2(3, 4)
    f = fastcompile.compile(_uses_gen)
    for _ in range(2):
        np.testing.assert_allclose(f(x), _uses_gen(x), rtol=1e-6)
    assert entries(_gen) == []                  # the generator's own frames are never compiled
    g = fastcompile.compile(_gen_fn)
    it = g(x)
    assert isinstance(it, types.GeneratorType)
    got = list(it)
    want = list(_gen_fn(x))
    assert len(got) == 2 and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert entries(_gen_fn) == []


# ----------------------------------------------------------------------------------------------
# exceptions: type, message, traceback
# ----------------------------------------------------------------------------------------------

def _bcast(x, y):
    z = x * 2
    return z + y


def _raise_after_break(x):
    y = x + 1
    print("", end="", file=_SINK)
    if y.shape[0] > 100:
        return y
    raise ValueError("too small: %d" % y.shape[0])


def _zdiv_in_resume(x, n):
    y = x + 1
    print("", end="", file=_SINK)
    k = 1 / n
    return y * k


def _run(f, *args):
    with pytest.raises(Exception) as e:
        f(*args)
    return e.value, traceback.extract_tb(e.value.__traceback__)


def _eager_exc(f, *args):
    try:
        f(*args)
    except Exception as e:
        return e
    raise AssertionError("no exception")


def test_exception_from_user_code_after_a_break():
    x = C.a2(3, 4)
    f = fastcompile.compile(_raise_after_break)
    want = _eager_exc(_raise_after_break, x)
    for _ in range(2):
        exc, tb = _run(f, x)
        assert type(exc) is ValueError and str(exc) == str(want) == "too small: 3"
        assert os.path.basename(tb[-1].filename) == THIS
        assert tb[-1].lineno == line_of(_raise_after_break, "raise ValueError")
        # the frames between: the transformed function at the break line, then resume functions
        assert tb[1].name == "_raise_after_break" and tb[1].lineno == line_of(_raise_after_break, "print(")


def test_exception_in_python_code_of_a_resume_function():
    x = C.a2(3, 4)
    f = fastcompile.compile(_zdiv_in_resume)
    np.testing.assert_allclose(f(x, 2), _zdiv_in_resume(x, 2))
    want = _eager_exc(_zdiv_in_resume, x, 0)
    exc, tb = _run(f, x, 0)
    assert type(exc) is ZeroDivisionError and str(exc) == str(want)
    assert os.path.basename(tb[-1].filename) == THIS
    assert tb[-1].lineno == line_of(_zdiv_in_resume, "k = 1 / n")
    assert tb[-1].name.startswith("__resume__zdiv_in_resume_at_")


def test_exception_shapes_do_not_broadcast_while_tracing():
    """On the first call the eager example raises while tracing: a graph break there; the op
    runs as is in the transformed code, whose line table names the failing line."""
    x, bad = C.a2(3, 4), C.a2(5)
    want = _eager_exc(_bcast, x, bad)
    exc, tb = _run(fastcompile.compile(_bcast), x, bad)
    assert type(exc) is ValueError and str(exc) == str(want)
    assert os.path.basename(tb[-1].filename) == THIS and tb[-1].name == "_bcast"
    assert tb[-1].lineno == line_of(_bcast, "return z + y")


def test_exception_shapes_do_not_broadcast_in_a_fused_kernel():
    """When a cached graph raises (here the core's shape check before its fused kernel),
    the hook runs the frame as plain Python: type, message and traceback are NumPy's and
    the user's own, and the same entry stays (sizes are not guarded)."""
    x, y, bad = C.a2(3, 4), C.a2(4, seed=1), C.a2(5)
    f = fastcompile.compile(_bcast)
    np.testing.assert_array_equal(f(x, y), _bcast(x, y))
    want = _eager_exc(_bcast, x, bad)
    exc, tb = _run(f, x, bad)
    assert type(exc) is ValueError and str(exc) == str(want)
    assert len(entries(_bcast)) == 1
    assert os.path.basename(tb[0].filename) == THIS and tb[0].name == "_run"          # the caller
    assert os.path.basename(tb[-1].filename) == THIS and tb[-1].name == "_bcast"
    np.testing.assert_array_equal(f(x, y), _bcast(x, y))                              # still compiled


def test_exception_in_a_fused_kernel_names_the_user_line():
    x, y, bad = C.a2(3, 4), C.a2(4, seed=1), C.a2(5)
    f = fastcompile.compile(_bcast)
    f(x, y)
    exc, tb = _run(f, x, bad)
    assert any(os.path.basename(t.filename) == THIS and t.lineno == line_of(_bcast, "return z + y") for t in tb)


# ----------------------------------------------------------------------------------------------
# guards and recompiles
# ----------------------------------------------------------------------------------------------

def _record(compiled):
    """Recompile lines of a compiled function (its ConvertFrame's recorder)."""
    rec = _Recorder()
    compiled.callback.recorder = rec
    return rec


def _sq(x):
    return x * x + 1


def test_size_change_does_not_recompile():
    f = fastcompile.compile(_sq)
    for shape in [(4, 5), (7, 9), (100, 3), (2, 2)]:
        x = C.a2(*shape)
        np.testing.assert_array_equal(f(x), _sq(x))
    assert len(entries(_sq)) == 1 and entries(_sq)[0].hits == 3


@pytest.mark.parametrize("variant,expect", [
    (lambda x: x.astype(np.float64), ["ndarray float32", "float64"]),             # dtype
    (lambda x: x[None], ["ndim=2", "ndim=3"]),                                    # rank
    (lambda x: x.T, ["contig=C", "contig=non-C"]),                                # contiguity
    (lambda x: x[:1], ["size1_mask=0b0", "size1_mask=0b1"]),                      # a size becomes 1
], ids=["dtype", "rank", "contiguity", "size1"])
def test_array_meta_change_recompiles(variant, expect):
    f = fastcompile.compile(_sq)
    rec = _record(f)
    x = C.a2(4, 5)
    f(x)
    y = np.ascontiguousarray(variant(x)) if variant(x).flags.c_contiguous else variant(x)
    got = f(y)
    np.testing.assert_allclose(got, _sq(y), rtol=1e-12)
    assert got.dtype == _sq(y).dtype
    assert len(entries(_sq)) == 2
    (line,) = rec.recompiles
    assert "guard failed: L['x'] is ndarray" in line and "_sq" in line, line
    before, now = line.split("; now ")
    assert expect[0] in before and expect[1] in now, line
    f(x), f(y)
    assert len(entries(_sq)) == 2                # both variants hit now


def _glob(x):
    return x * C.SCALE


@pytest.mark.parametrize("specialize", [False, True])
def test_global_change_recompiles(specialize):
    """C.np_global reads SCALE (a float) and OFFSET (a NumPy float32): both are read at each call
    (no recompile), or baked in and guarded by value under specialize_float."""
    f = fastcompile.compile(C.np_global)
    rec = _record(f)
    x = C.a2(4, 5)
    old, old_off = C.SCALE, C.OFFSET
    where = "np_global (%s:%d): guard failed: " % (C.__file__, C.np_global.__code__.co_firstlineno)
    try:
        with fastcompile.config.overriding(specialize_float=specialize):
            np.testing.assert_array_equal(f(x), C.np_global(x))
            C.SCALE = 3.0
            np.testing.assert_array_equal(f(x), C.np_global(x))
            C.OFFSET = np.float32(0.25)
            np.testing.assert_array_equal(f(x), C.np_global(x))
            assert len(entries(C.np_global)) == 1 + 2 * specialize
            assert rec.recompiles == ([where + "G['SCALE'] == 2.0; now 3.0",
                                       where + "G['OFFSET'] == np.float32(0.5); now np.float32(0.25)"]
                                      if specialize else [])
    finally:
        C.SCALE, C.OFFSET = old, old_off
    np.testing.assert_array_equal(f(x), C.np_global(x))
    assert len(entries(C.np_global)) == 1 + 2 * specialize


def _outer_two_dtypes(a, b):
    print("", end="", file=_SINK)       # a break: the inner calls are frames of their own
    return _inner_frame(a), _inner_frame(b)


def _inner_frame(v):
    print("", end="", file=_SINK)
    return v + 1


def test_explain_lists_recompiles():
    out = fastcompile.explain(_outer_two_dtypes)(C.a2(3), C.a2(3, dtype=np.float64))
    assert any("_inner_frame" in r and "float32" in r and "float64" in r for r in out.recompiles), \
        out.recompiles
    assert "Recompiles:" in str(out)


def _k(x, k):
    return x * k


def test_ninth_variant_runs_uncompiled_with_a_warning():
    f = fastcompile.compile(_k)
    x = C.a2(3, 4)
    for k in range(8):
        np.testing.assert_array_equal(f(x, k), _k(x, k))
    assert len(entries(_k)) == 8
    with pytest.warns(FastcompileWarning, match=r"_k .*compiled for 8 different inputs.*"
                      r"guard failed: L\['k'\] == 7; now 8"):
        np.testing.assert_array_equal(f(x, 8), _k(x, 8))
    assert _C.code_state(_k.__code__) == "run_only"
    np.testing.assert_array_equal(f(x, 9), _k(x, 9))          # no more warnings, still right
    np.testing.assert_array_equal(f(x, 3), _k(x, 3))          # old entries still hit
    assert len(entries(_k)) == 8


def _th(x):
    return x * 2 + 1


def test_torch_device_change_recompiles():
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    f = fastcompile.compile(_th)
    rec = _record(f)
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x), _th(x))
    m = x.to("meta")
    got = f(m)
    assert got.device.type == "meta" and got.shape == (3, 4) and got.dtype == torch.float32
    assert len(entries(_th)) == 2
    (line,) = rec.recompiles
    assert "device=cpu" in line.split("; now ")[0], line
    torch.testing.assert_close(f(x), _th(x))


def test_torch_dtype_contiguity_requires_grad_recompile():
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    f = fastcompile.compile(_th)
    x = torch.randn(4, 5)
    for v in (x, x.double(), x.t(), x[None]):
        torch.testing.assert_close(f(v), _th(v))
    assert len(entries(_th)) == 4
    r = x.clone().requires_grad_(True)
    got = f(r)
    assert len(entries(_th)) == 5                                          # a new entry: autograd mode
    assert got.requires_grad and type(got.grad_fn).__name__ == "CompiledFunctionBackward"
    torch.testing.assert_close(got, _th(r))


# ----------------------------------------------------------------------------------------------
# fullgraph, reset
# ----------------------------------------------------------------------------------------------

def test_fullgraph_raises_at_the_first_break(capsys):
    f = fastcompile.compile(C.br_two, fullgraph=True)
    with pytest.raises(trace.Unsupported) as e:
        f(C.a2(5, 6))
    assert capsys.readouterr().out == ""          # nothing of the frame ran
    assert "call to builtin print" in e.value.reason
    where = "%s:%d" % (C.__file__, line_of(C.br_two, 'print("a")'))
    assert where in str(e.value), str(e.value)
    assert e.value.user_stack[-1][:2] == (C.__file__, line_of(C.br_two, 'print("a")'))
    # a function without breaks is fine with fullgraph=True
    x = C.a2(5, 6)
    np.testing.assert_array_equal(fastcompile.compile(C.np_add, fullgraph=True)(x, x), x + x)
    # decorator form
    g = fastcompile.compile(fullgraph=True)(C.br_data_branch)
    with pytest.raises(trace.Unsupported, match="data-dependent branch"):
        g(x)


def test_reset_drops_entries_and_retraces():
    f = fastcompile.compile(_sq)
    x = C.a2(3, 4)
    f(x)
    assert len(entries(_sq)) == 1
    fastcompile.reset()
    assert entries(_sq) == [] and _C.code_state(_sq.__code__) == "none"
    rec = _record(f)
    f(x)
    assert len(entries(_sq)) == 1 and entries(_sq)[0].hits == 0      # traced again
    assert rec.recompiles == []                                       # a fresh trace, no recompile


def _make_fn():
    k = np.float32(3)

    def scaled(x):
        return x * k + 1
    return scaled


def test_reset_and_del_do_not_leak_the_function():
    fn = _make_fn()
    f = fastcompile.compile(fn)
    x = C.a2(3, 4)
    np.testing.assert_array_equal(f(x), fn(x))
    ref = weakref.ref(fn)
    fastcompile.reset()
    del fn, f
    gc.collect()
    assert ref() is None


def test_reset_and_del_do_not_leak_a_function_with_breaks():
    src = ("def brk(x):\n    y = x + 1\n    print('', end='', file=sink)\n    return y * 2\n")
    ns = {"sink": _SINK, "np": np}
    exec(compile(src, os.path.join(HERE, "generated_brk.py"), "exec"), ns)
    fn = ns.pop("brk")
    f = fastcompile.compile(fn)
    x = C.a2(3, 4)
    np.testing.assert_array_equal(f(x), fn(x))
    np.testing.assert_array_equal(f(x), fn(x))
    ref = weakref.ref(fn)
    fastcompile.reset()
    del fn, f, ns
    gc.collect()
    assert ref() is None


def _live_vars():
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, trace.variables.ArrayVar))


def _kept_pair(x, y):
    z = np.exp(x) * y + 1
    return z, np.tanh(z) - 3


def _kept_sum(x, y):
    z = np.exp(x) * y + 1
    return z, z.sum()                   # a NumPy scalar out: run(), no fast target


def _kept_break(x, y):
    z = np.exp(x) * y + 1
    print("", end="", file=_SINK)       # graph break: the slow path (no fast target)
    return z * 2, y


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fn", [_kept_pair, _kept_sum, _kept_break], ids=["fast", "scalar", "break"])
def test_a_compiled_function_keeps_neither_the_first_calls_inputs_nor_the_traces_arrays(fn, background):
    """A compiled target lives as long as the function: what the trace saw (the first call's
    arrays as examples, every traced value's array) must not live on in it. Before, a batch
    passed once stayed in memory for good."""
    old = fastcompile.config.get("async_compile")
    fastcompile.config.set(async_compile=background)
    try:
        vars0 = _live_vars()
        f = fastcompile.compile(fn)
        x, y = C.a2(777), C.a2(777, seed=1)
        want = fn(x, y)
        got = f(x, y)
        same(got, want)
        refs = [weakref.ref(x), weakref.ref(y)]
        del x, y, got, want
        fastcompile.pending_compiles(wait=True, timeout=120)      # async: the build holds them till done
        gc.collect()
        assert [r() is None for r in refs] == [True, True]
        assert _live_vars() == vars0
        x2 = C.a2(777, seed=2)                 # and the target still runs, on new inputs
        same(f(x2, x2), fn(x2, x2))
    finally:
        fastcompile.config.set(async_compile=old)
        fastcompile.reset()


@pytest.mark.parametrize("train", [False, True], ids=["core", "autograd"])
def test_a_compiled_module_keeps_no_input_of_its_first_call(train):
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    f = fastcompile.compile(m)
    x = torch.randn(4, 8, requires_grad=train)
    with torch.set_grad_enabled(train):
        y = f(x)
        torch.testing.assert_close(y, m(x))
    if train:
        y.sum().backward()
    refs = [weakref.ref(x), weakref.ref(y)]
    del x, y
    gc.collect()
    assert [r() is None for r in refs] == [True, True]
    fastcompile.reset()


# ----------------------------------------------------------------------------------------------
# nn.Module
# ----------------------------------------------------------------------------------------------

def _modules():
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    nn = torch.nn
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.fc2(self.drop(torch.relu(self.fc1(x))))
    return torch, [seq, MLP()]


@pytest.mark.parametrize("which", [0, 1], ids=["Sequential", "MLP"])
def test_module_eval_matches_eager_and_training_recompiles(which):
    torch, mods = _modules()
    m = mods[which].eval()
    cm = fastcompile.compile(m)
    assert cm.training is False and isinstance(cm(torch.zeros(1, 8)), torch.Tensor)   # grad on: a break
    fastcompile.reset()
    code = type(m).forward.__code__
    x = torch.randn(5, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(cm(x), m(x))
        y = torch.randn(9, 8)
        torch.testing.assert_close(cm(y), m(y))        # another batch size: the same entry
        (e,) = _C.code_entries(code)
        assert e.target is not code                   # compiled: a graph, not the plain code
        out = fastcompile.explain(cm)(x)
        assert out.graph_count >= 1 and out.graph_break_count == 0, str(out)
        fastcompile.reset()
        cm(x)
        cm.train()                                    # reaches the module
        assert m.training
        torch.manual_seed(1)
        got = cm(x)
        torch.manual_seed(1)
        want = m(x)
        torch.testing.assert_close(got, want)         # dropout (MLP) runs as torch does
        assert len(_C.code_entries(code)) == 2
    m.eval()
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x))
        assert len(_C.code_entries(code)) == 2


def _train_two_steps(model, run, x, lr=0.1):
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(2):
        loss = (run(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.detach(), [p.detach().clone() for p in model.parameters()]


def test_training_step_through_a_graph_break(capsys):
    """Autograd mode across a graph break: the first graph's output keeps its grad_fn through the
    print and into the resume function's graph; two SGD steps match eager."""
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    import copy
    nn = torch.nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, x):
            h = torch.relu(self.l1(x))
            print("between")
            return self.l2(torch.tanh(h))

    torch.manual_seed(0)
    ref = M()
    mod = copy.deepcopy(ref)
    x = torch.randn(5, 8)
    want = _train_two_steps(ref, ref, x)
    cm = fastcompile.compile(mod)
    got = _train_two_steps(mod, cm, x)
    torch.testing.assert_close(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b)
    assert capsys.readouterr().out.count("between") == 4
    (e,) = _C.code_entries(M.forward.__code__)
    res = e.info.result
    assert len(res.breaks) == 1 and res.code is not None              # resumed after the print
    assert isinstance(res.graphs[0].graph, torch.fx.Graph)
    assert type(cm(x).grad_fn).__name__ == "CompiledFunctionBackward"  # the resume graph too
    with torch.no_grad():                                              # grad off: another entry
        torch.testing.assert_close(cm(x), mod(x))
    assert len(_C.code_entries(M.forward.__code__)) == 2


def test_module_list_and_sequential_growing_recompile():
    """Iterating a ModuleList, or calling an nn.Sequential, guards how many children it has."""
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    nn = torch.nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4)])
            self.seq = nn.Sequential(nn.Linear(4, 4), nn.GELU())

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.seq(x)

    m = M().eval()
    cm = fastcompile.compile(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x))
        m.layers.append(nn.Linear(4, 4))
        torch.testing.assert_close(cm(x), m(x))
        m.seq.append(nn.Tanh())
        torch.testing.assert_close(cm(x), m(x))
    assert len(_C.code_entries(M.forward.__code__)) == 3


def _with_body_raises(x, d, k):
    y = x * 2
    with np.errstate(all="ignore"):
        z = np.log(y) / d[k]
    return z + 1


def test_exception_inside_a_with_block_of_a_resume_function():
    """The resume function after BEFORE_WITH starts inside the with-body: an exception there must
    unwind through __exit__ (it used to segfault: exception stack depth 32768)."""
    x = np.array([-1.0, 2.0])
    f = fastcompile.compile(_with_body_raises)
    for _ in range(2):
        np.testing.assert_array_equal(f(x, {"a": 2.0}, "a"), _with_body_raises(x, {"a": 2.0}, "a"))
    for _ in range(2):
        exc, tb = _run(f, x, {"a": 2.0}, "b")
        assert type(exc) is KeyError and exc.args == ("b",)
        assert tb[-1].lineno == line_of(_with_body_raises, "z = np.log(y)")
        assert np.geterr()["invalid"] == "warn"               # __exit__ ran


def test_import_does_not_import_torch_and_torch_imported_later_is_traced(tmp_path):
    """`import fastcompile` leaves torch alone (NumPy users don't pay its import); a torch
    imported afterwards is still traced into one graph, with no break."""
    pytest.importorskip("torch")
    import subprocess
    code = (
        "import sys, fastcompile\n"
        "assert 'torch' not in sys.modules, 'import fastcompile imported torch'\n"
        "import torch\n"
        "def f(x):\n"
        "    return torch.relu(x) * 2 + 1\n"
        "x = torch.randn(64)\n"
        "e = fastcompile.explain(f)(x)\n"
        "assert e.graph_count == 1 and e.graph_break_count == 0, str(e)\n"
        "g = fastcompile.compile(f)\n"
        "assert torch.equal(g(x), torch.relu(x) * 2 + 1)\n"
        "print('ok')\n")
    env = dict(os.environ, FASTCOMPILE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_dropout_in_training_is_one_graph_and_draws_as_eager():
    """nn.Dropout / F.dropout in training mode trace in autograd mode as aten.native_dropout,
    called at run time: no graph break, tracing draws nothing from the RNG, and with the same
    seed the outputs, loss and gradients equal eager's."""
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    nn, F = torch.nn, torch.nn.functional
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)
            self.drop = nn.Dropout(0.3)

        def forward(self, x):
            h = self.drop(F.gelu(self.fc1(x)))
            return F.dropout(self.fc2(h), p=0.2, training=self.training)

    ref = Net().train()
    net = Net().train()
    net.load_state_dict(ref.state_dict())
    cm = fastcompile.compile(net)
    x = torch.randn(64, 16)
    out = fastcompile.explain(cm)(x)
    assert out.graph_count == 1 and out.graph_break_count == 0, str(out)
    for step in range(3):
        torch.manual_seed(100 + step)
        got = cm(x)
        torch.manual_seed(100 + step)
        want = ref(x)
        torch.testing.assert_close(got, want)
        assert (got == 0).float().mean() > 0.1           # dropout really dropped
        got.square().mean().backward()
        want.square().mean().backward()
        for (n, p), q in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=n)
        torch.manual_seed(7)
        cm(x)
        after_ours = torch.rand(4)
        torch.manual_seed(7)
        ref(x)
        assert torch.equal(after_ours, torch.rand(4))     # the RNG advanced exactly as eager's
    net.eval()
    with torch.no_grad():
        torch.testing.assert_close(cm(x), ref.eval()(x))
    ref.train()


# ----------------------------------------------------------------------------------------------
# async compile (config.async_compile) on our tracer's core route: the first call returns the
# values the trace computed, the kernels build in a background thread, the next call waits
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def async_on():
    old = fastcompile.config.get("async_compile")
    fastcompile.config.set(async_compile=True)
    yield
    fastcompile.config.set(async_compile=old)


@pytest.fixture
def held_build(monkeypatch):
    """The background builds wait for gate.set(); builds: the Compiled of each build queued."""
    from fastcompile.trace import graph_call
    gate, builds = threading.Event(), []
    submit, work = graph_call._submit, graph_call._work

    def queued(first, compiled, arrays, stand_ins):
        builds.append(compiled)
        submit(first, compiled, arrays, stand_ins)

    def held():
        assert gate.wait(60), "the test never let the build go"
        work()
    monkeypatch.setattr(graph_call, "_submit", queued)
    monkeypatch.setattr(graph_call, "_work", held)
    yield gate, builds
    gate.set()


def test_async_compile_first_call_returns_the_traced_values_then_the_kernels(async_on, held_build):
    gate, builds = held_build
    fastcompile.pending_compiles(wait=True)
    gc.collect()
    base = fastcompile.pending_compiles()
    w = np.random.rand(16, 8)

    def f(x):
        return np.tanh(x @ w) * 1.25 + x.sum()       # a matmul extern between kernels

    cf = fastcompile.compile(f)
    x = np.random.rand(32, 16)
    np.testing.assert_array_equal(cf(x), f(x))        # NumPy's own values: no kernel ran
    (compiled,) = builds
    assert compiled.nplans == 0 and fastcompile.pending_compiles() == base + 1
    gate.set()
    y = np.random.rand(32, 16)
    np.testing.assert_allclose(cf(y), f(y), rtol=1e-6)    # waits for the build, runs the kernels
    assert fastcompile.pending_compiles() == base
    plans = compiled.nplans
    assert plans > 0 and len(compiled.kernels) > 0
    np.testing.assert_allclose(cf(x), f(x), rtol=1e-6)
    assert compiled.nplans == plans                   # the build had the layouts of real calls


def test_async_compile_fast_target_runs_the_compiled_from_c_once_built(async_on, held_build):
    """Arrays in, an array out (a Pick target): the first call returns the trace's values
    through a Python wrapper; the call that first runs the kernels hands the Pick the Compiled
    itself, so later calls have no Python frame, as without async compile."""
    gate, builds = held_build

    def f(x):
        return np.tanh(x) * 1.25 + 1

    cf = fastcompile.compile(f)
    x = np.random.rand(64)
    np.testing.assert_array_equal(cf(x), f(x))
    (entry,) = entries(f)
    (compiled,) = builds
    assert isinstance(entry.target, _C.Pick) and entry.target.fn is not compiled
    gate.set()
    np.testing.assert_allclose(cf(x * 2), f(x * 2), rtol=1e-6)
    assert entry.target.fn is compiled
    np.testing.assert_allclose(cf(x), f(x), rtol=1e-6)


def test_pick_fn_is_replaceable_by_a_callable_only():
    p = _C.Pick(lambda a, b: (a, b), (1, 0))
    assert p(1, 2) == (2, 1)
    p.fn = lambda a, b: (b, a)
    assert p(1, 2) == (1, 2)
    with pytest.raises(TypeError, match="callable"):
        p.fn = 3
    with pytest.raises(TypeError, match="callable"):
        del p.fn
    assert p(1, 2) == (1, 2)


def test_pick_keeps_its_fn_alive_through_a_call_that_replaces_it():
    """fn may replace Pick.fn while it runs (the async first call's wrapper does): the call it
    is in holds it, and refcounts stay flat."""
    holder = []

    def first(a):
        holder[0].fn = lambda a: a + 1
        return a * 10

    holder.append(_C.Pick(first, (0,)))
    ref = weakref.ref(first)
    del first
    assert holder[0](2) == 20
    assert holder[0](2) == 3
    assert ref() is None
    fn = holder[0].fn
    before = sys.getrefcount(fn)
    for _ in range(100):
        holder[0](1)
    assert sys.getrefcount(fn) == before


def test_async_compile_traced_values_only_for_the_traced_inputs(async_on, held_build):
    """A target called first with other arrays than the trace's computes them."""
    gate, _ = held_build
    gate.set()

    def f(x):
        return np.exp(x) - 1.5
    x, y = np.random.rand(100), np.random.rand(100)
    result = trace.trace_function(f, x)
    out = result.target(*trace.slot_values(f, (y,), {}, result.slots))
    np.testing.assert_allclose(out, f(y), rtol=1e-6)
    out = result.target(*trace.slot_values(f, (x,), {}, result.slots))
    np.testing.assert_allclose(out, f(x), rtol=1e-6)


def test_async_compile_traced_values_of_a_partial_graph_and_a_break(async_on, held_build):
    """A graph break: the partial graph's first call (from the resume code) returns its traced
    values too, and the Python after the break sees them."""
    gate, _ = held_build
    gate.set()
    log = []

    def f(x):
        y = np.sqrt(x) * 3.0
        log.append(float(y[0]))                       # a break: the list is outside the frame
        return y + 1.0

    cf = fastcompile.compile(f)
    for _ in range(3):
        x = np.random.rand(50) + 0.5
        log.clear()
        np.testing.assert_allclose(cf(x), f(x), rtol=1e-6)
        assert len(log) == 2 and log[0] == pytest.approx(log[1])


def test_async_compile_first_calls_of_many_graphs_build_in_one_batch(async_on, held_build):
    """Many traced frames first-called at once (a model with graph breaks) queue their builds
    for one worker thread, which compiles them in one batch: not a thread and a compiler per
    core for each."""
    gate, builds = held_build
    gc.collect()
    base = fastcompile.pending_compiles()             # what other tests left (nothing building)
    salt = np.random.rand()                           # kernels of this run's own: compiled now
    fns = []
    for i in range(5):
        c = 1.0 + salt + i

        def f(x, c=c):
            return np.tanh(x) * c + c
        fns.append((f, fastcompile.compile(f)))
    x = np.random.rand(1000)
    before = fastcompile.stats()["compiler_runs"]
    # five graphs: c baked into each (the five f share one code object, and a float the graph
    # reads at each call would make the first graph serve them all)
    with fastcompile.config.overriding(specialize_float=True):
        for f, cf in fns:
            np.testing.assert_array_equal(cf(x), f(x))
    assert len(builds) == 5
    assert len([t for t in threading.enumerate() if t.name == "fastcompile-build"]) == 1
    gate.set()
    assert fastcompile.pending_compiles(wait=True, timeout=300) == base
    runs = fastcompile.stats()["compiler_runs"] - before
    assert 1 <= runs <= min(5, len(os.sched_getaffinity(0)))
    for f, cf in fns:
        np.testing.assert_allclose(cf(x), f(x), rtol=1e-6)
    assert all(len(c.kernels) == 1 for c in builds)


def test_first_call_compiles_every_segment_in_one_batch():
    """A graph with kernels on both sides of an extern (a matmul): its first call compiles them
    in one batch, side by side (one compiler per core). Before, each segment's kernels compiled
    when the call reached it, one segment after another; the MLP's first call took two compiler
    rounds. The dry run that finds the later segments' layouts uses the trace's extern results."""
    salt = np.random.rand()                   # kernels of this run's own: compiled now

    def f(x, w):
        y = np.tanh(x * (1.5 + salt) + 0.25)
        z = y @ w
        return np.exp(-z) * (3.0 + salt) - z
    x, w = np.random.rand(64, 32), np.random.rand(32, 48)
    with fastcompile.config.overriding(specialize_float=True):
        cf = fastcompile.compile(f)
        before = fastcompile.stats()
        np.testing.assert_allclose(cf(x, w), f(x, w), rtol=1e-12)
        after = fastcompile.stats()
        np.testing.assert_allclose(cf(x * 2, w), f(x * 2, w), rtol=1e-12)
    assert after["compiles"] - before["compiles"] == 2
    assert after["compile_batches"] - before["compile_batches"] == 1
    assert fastcompile.stats()["compiles"] == after["compiles"]     # the second call: none


def test_one_array_under_two_sources_at_trace_is_two_inputs():
    """A resume function traced while two of its values were one array (z = pick(x, y)
    returned y) read both from one source: once they differed, y's uses got z's values. Also
    a compiled function re-entered from its own graph-break callback (the same pattern)."""
    same = [True]
    log = []

    def pick(x, y):
        log.append(1)                                 # a break: mutation of an outside list
        return y if same[0] else x * 7.0

    def f(x):
        y = np.sqrt(x) * 3.0
        z = pick(x, y)
        return y + z.sum()

    cf = fastcompile.compile(f)
    x = np.array([1.0, 4.0, 9.0])
    for flag in (True, False, True, False):
        same[0] = flag
        np.testing.assert_allclose(cf(x), f(x), rtol=1e-12)

    depth = [0]

    def cb(x, y):
        if depth[0] < 2:
            depth[0] += 1
            r = cg(x)
            depth[0] -= 1
            return r
        return y

    def g(x):
        y = np.sqrt(x) * 3.0
        return y + cb(x, y).sum()

    cg = fastcompile.compile(g)
    for _ in range(3):
        x = np.random.rand(5) + 0.5
        want = g(x)
        depth[0] = 0
        np.testing.assert_allclose(cg(x), want, rtol=1e-12)


def _w_ufunc_pos_out(a, o): np.exp(a, o); return o + 1
def _w_ufunc_pos_out_self(a, o): np.negative(a, out=a); np.exp(a, a); return a          # noqa: E702
def _w_sum_pos_out(a, o): np.sum(a, 1, None, o[:, 0]); return o * 2
def _w_dot_pos_out(a, o): np.dot(a[:, :4], a[:4, :6], o); return o - 1
def _w_reduce_pos_out(a, o): np.add.reduce(a, 1, None, o[:, 1]); return o * 1
def _w_clip_method_out(a, o): a.clip(0, 1, o); return o + a
def _w_round_method_out(a, o): a.round(1, o); return o + 1
def _w_cumsum_method_out(a, o): a.cumsum(1, None, o); return o * 1
def _w_ufunc_at(a, o): np.add.at(a, [0, 1, 1], 1.0); return a * 2
def _w_iadd_dunder(a, o): a.__iadd__(1); return a * 2
def _w_imul_dunder(a, o): a.__imul__(o); return a + 1
def _w_setitem_dunder(a, o): a.__setitem__((0, 0), 5.0); return a * 2
def _w_fresh_iadd_dunder(a, o): b = a * 2; b.__iadd__(o); return b * 3
def _w_operator_iadd(a, o): __import__("operator").iadd(a, 1.5); return a * 2


WRITES_NUMPY = [_w_ufunc_pos_out, _w_ufunc_pos_out_self, _w_sum_pos_out, _w_dot_pos_out, _w_reduce_pos_out,
                _w_clip_method_out, _w_round_method_out, _w_cumsum_method_out, _w_ufunc_at]
WRITES_ANY = [_w_iadd_dunder, _w_imul_dunder, _w_setitem_dunder, _w_fresh_iadd_dunder, _w_operator_iadd]


@pytest.mark.parametrize("fn,kind", [(f, "numpy") for f in WRITES_NUMPY + WRITES_ANY] + [(f, "torch") for f in WRITES_ANY],
                         ids=lambda v: v.__name__[3:] if callable(v) else v)
def test_writes_into_arguments_happen_as_in_python(fn, kind):
    """A call that writes into an array it is given: NumPy's out by position (a ufunc's outputs
    after its inputs, np.sum's, np.dot's and ndarray methods' out parameter), ufunc.at, and the
    in-place operator methods called by name (a.__iadd__(b)). Each compiled call must write what
    Python writes and return the same: these were traced as pure calls, and a positional out or
    a.__iadd__ on an argument was lost from the second call on (np.exp(a, a) returned a
    unchanged)."""
    if kind == "torch":
        torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    rng = np.random.default_rng(0)
    x, o = rng.standard_normal((4, 6)).astype(np.float32), np.zeros((4, 6), np.float32)
    compiled = fastcompile.compile(fn)
    for k in range(3):                       # a trace, then cache hits
        a1, o1, a2, o2 = x + k, o.copy(), x + k, o.copy()
        if kind == "torch":
            a1, o1, a2, o2 = (torch.from_numpy(v) for v in (a1, o1, a2, o2))
        want, got = fn(a1, o1), compiled(a2, o2)
        if kind == "torch":
            want, got, a1, o1, a2, o2 = (v.numpy() for v in (want, got, a1, o1, a2, o2))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg="call %d: result" % k)
        np.testing.assert_allclose(a2, a1, rtol=1e-6, atol=1e-6, err_msg="call %d: a" % k)
        np.testing.assert_allclose(o2, o1, rtol=1e-6, atol=1e-6, err_msg="call %d: o" % k)


def test_astype_to_float16_rounds_as_numpy():
    """a.astype(np.float16) rounds to float16 even where the kernel reads it again as float32:
    quantizing through a half type is what the user asked for (it was a no-op in the kernel)."""
    def f(a):
        return a.astype(np.float16).astype(np.float32) * 2, (a * 3).astype(np.float16)
    x = np.random.default_rng(1).standard_normal((64, 33)).astype(np.float32) * 100
    compiled = fastcompile.compile(f)
    for _ in range(2):
        for g, w in zip(compiled(x), f(x)):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("case", ["longdouble_input", "astype_longdouble", "astype_complex", "asarray_longdouble"])
def test_dtypes_outside_the_core_run_as_numpy_without_an_internal_error(case):
    """Values of a dtype the core has no kernels for (long double, complex) are NumPy's: a
    long double argument is a graph break, a cast to one an extern call. Both were internal
    errors (a warning, and the whole function uncompiled): the input check let every 'f' kind
    through, and a core op's cast to the example's dtype raised outside the fallback to an
    extern."""
    fns = {
        "longdouble_input": (lambda a: a * 2 + 1, np.longdouble),
        "astype_longdouble": (lambda a: a.astype(np.longdouble) * 2, np.float32),
        "astype_complex": (lambda a: np.sin(a).astype(np.complex64) * 2, np.float32),
        "asarray_longdouble": (lambda a: np.asarray(a, dtype=np.longdouble) + 1, np.float32),
    }
    fn, dtype = fns[case]
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(dtype)
    compiled = fastcompile.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastcompileWarning)
        for _ in range(2):
            got, want = compiled(x), fn(x)
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-6)        # sin: libmvec's, not NumPy's


@pytest.mark.parametrize("case", ["to_complex", "bfloat16_method", "float8", "quantized", "sparse", "view_as_real"])
def test_tensor_dtypes_and_layouts_outside_the_core_run_as_torch_without_an_internal_error(case):
    """A tensor whose dtype has no NumPy dtype (complex, bfloat16, float8, quantized) or whose
    layout is not strided (sparse), made inside the traced code: the op that makes it runs as torch
    (a graph break or an extern), the rest compiles. Each was an internal error (a KeyError in the
    dtype map, or .numpy() raising), a warning and the whole function uncompiled."""
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    fns = {
        "to_complex": lambda a: a.to(torch.complex64) * 2,
        "bfloat16_method": lambda a: a.bfloat16() * 2,
        "float8": lambda a: a.to(torch.float8_e4m3fn).float() + 1,
        "quantized": lambda a: torch.quantize_per_tensor(a, 0.1, 0, torch.qint8).dequantize() * 2,
        "sparse": lambda a: (a.relu().to_sparse() * 2).to_dense() + 1,
        "view_as_real": lambda a: torch.view_as_real(a.to(torch.complex64) * 1j).sum(-1) + a,
    }
    fn = fns[case]
    x = torch.randn(4, 6)
    compiled = fastcompile.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastcompileWarning)
        for _ in range(2):
            got, want = compiled(x), fn(x)
            assert got.dtype == want.dtype and got.layout == want.layout
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_in_place_operators_on_a_fresh_tensor_stay_in_the_graph():
    """b = a * 2; b += 1 on torch tensors: one graph, no break. The in-place step ran the
    operator on a copy made with ndarray's .copy(), which a tensor lacks: an AttributeError
    while tracing and a graph break at every such statement. torch's own errors stay torch's
    (an int tensor += 1.5 raises RuntimeError, compiled or not)."""
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")

    def f(a):
        b = a * 2
        b += 1
        b *= a
        b.__isub__(a)
        return b

    def g(a):
        b = (a * 10).long()
        b += 1.5
        return b
    x = torch.randn(5, 3)
    out = fastcompile.explain(f)(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), str(out)
    compiled = fastcompile.compile(f)
    for k in range(2):
        torch.testing.assert_close(compiled(x + k), f(x + k), rtol=0, atol=0)
    with pytest.raises(RuntimeError) as eager:
        g(x)
    with pytest.raises(RuntimeError) as ours:
        fastcompile.compile(g)(x)
    assert str(ours.value) == str(eager.value)


def test_explain_turns_async_compile_off_for_its_own_thread_only():
    """explain() compiles its one call synchronously (its report lists the kernels) by turning
    async_compile off in its own thread; it used to set the global knob, so another thread's
    compiles during an explain() ran synchronously too, and a knob set meanwhile was undone."""
    seen = {}

    def other():
        seen["other"] = fastcompile.config.get("async_compile")

    def f(a):
        return a * 2 + 1

    def probe(a):
        seen["own"] = fastcompile.config.get("async_compile")
        t = threading.Thread(target=other)
        t.start()
        t.join()
        return f(a)

    old = fastcompile.config.get("async_compile")
    fastcompile.config.set(async_compile=True)
    try:
        out = fastcompile.explain(probe)(np.ones(4, np.float32))
        assert seen == {"own": False, "other": True}
        assert fastcompile.config.get("async_compile") is True
        assert out.graph_count >= 1 and "Kernels:" in str(out)
        with pytest.raises(AttributeError, match="no knob"):
            with fastcompile.config.overriding(nope=1):
                pass
    finally:
        fastcompile.config.set(async_compile=old)


class _Cfg:
    scale = 1.5                          # a class attribute: instances read it until they set their own
    table = np.ones(3, np.float32)


_CFG = _Cfg()
_TLS = threading.local()


def _reads_class_attrs(a):
    return a * _CFG.scale + _Cfg.table


def _reads_absent_attrs(a):
    return a * getattr(_CFG, "extra", 2.0) + (1.0 if hasattr(_CFG, "extra") else 0.0)


def _reads_thread_local(a):
    return a * getattr(_TLS, "k", 1.0)


def test_class_attributes_and_absent_attributes_are_guarded():
    """obj.name found on the class, getattr(obj, name, default) and hasattr(obj, name) on an
    absent name: a compiled call sees what Python sees after the class attribute changes, the
    instance sets its own (shadowing it) or deletes it, and the name appears or goes. The class's
    value was baked in with no guard, and an absent name's default likewise."""
    x = np.arange(3, dtype=np.float32)
    f, g = fastcompile.compile(_reads_class_attrs), fastcompile.compile(_reads_absent_attrs)
    changes = [lambda: None, lambda: setattr(_CFG, "scale", 3.0), lambda: setattr(_Cfg, "scale", 5.0),
               lambda: delattr(_CFG, "scale"), lambda: setattr(_Cfg, "table", np.zeros(3, np.float32)),
               lambda: setattr(_CFG, "extra", 7.0), lambda: setattr(_Cfg, "extra", 9.0),
               lambda: delattr(_CFG, "extra"), lambda: delattr(_Cfg, "extra")]
    try:
        for k, change in enumerate(changes):
            change()
            for _ in range(2):
                np.testing.assert_array_equal(f(x), _reads_class_attrs(x), err_msg="change %d" % k)
                np.testing.assert_array_equal(g(x), _reads_absent_attrs(x), err_msg="change %d" % k)
    finally:
        _Cfg.scale, _Cfg.table = 1.5, np.ones(3, np.float32)
        _CFG.__dict__.clear()
        if "extra" in _Cfg.__dict__:
            del _Cfg.extra


class _Ops:
    k = 2.0

    def __init__(self, s):
        self.s = s

    def scale(self, a):
        return a * self.s

    @property
    def prop(self):
        return self.s + 1

    @staticmethod
    def twice(a):
        return a * 2

    @classmethod
    def by_k(cls, a):
        return a * cls.k


_OPS = _Ops(2.0)
_BOUND = _OPS.scale


def _calls_methods(a):
    return _OPS.scale(a) + _OPS.prop + _Ops.twice(a) + _Ops.by_k(a) + _OPS.by_k(a) + _BOUND(a)


def test_methods_replaced_after_compile_are_seen():
    """A method, property, staticmethod or classmethod replaced on the class, a method shadowed on
    the instance, a class attribute a classmethod reads, and a bound method held in a global
    (rebound, or its object changed): each is guarded where the trace found it, and a compiled
    call sees the change (each kept running what it traced)."""
    x = np.arange(3, dtype=np.float32)
    f = fastcompile.compile(_calls_methods)
    saved = dict(_Ops.__dict__)
    other = _Ops(7.0)
    changes = [lambda: None,
               lambda: setattr(_Ops, "scale", lambda self, a: a * 3),
               lambda: setattr(_OPS, "scale", lambda a: a * 50),
               lambda: setattr(_Ops, "prop", property(lambda self: 42.0)),
               lambda: setattr(_Ops, "twice", staticmethod(lambda a: a * 5)),
               lambda: setattr(_Ops, "k", 9.0),
               lambda: setattr(_Ops, "by_k", classmethod(lambda cls, a: a - cls.k)),
               lambda: globals().__setitem__("_BOUND", other.scale),
               lambda: setattr(other, "s", 11.0)]
    try:
        for k, change in enumerate(changes):
            change()
            for _ in range(2):
                np.testing.assert_array_equal(f(x), _calls_methods(x), err_msg="change %d" % k)
    finally:
        for name in ("scale", "prop", "twice", "by_k", "k"):
            setattr(_Ops, name, saved[name])
        _OPS.__dict__.pop("scale", None)
        globals()["_BOUND"] = _OPS.scale


def test_torch_global_state_read_by_the_trace_is_guarded():
    """torch.is_grad_enabled(), torch.is_inference_mode_enabled() and the default dtype (read
    directly, or by torch.zeros without a dtype) as the trace read them: under torch.no_grad(),
    inference_mode() or after torch.set_default_dtype, a compiled call recompiles instead of
    keeping the traced branch or dtype."""
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")

    def f(x):
        y = x * 2 if torch.is_grad_enabled() else x * 3
        if torch.is_inference_mode_enabled():
            y = y + 100
        return y, torch.get_default_dtype(), torch.zeros(2).dtype

    x = torch.ones(3)
    compiled = fastcompile.compile(f)
    contexts = [contextlib.nullcontext, torch.no_grad, torch.inference_mode, contextlib.nullcontext]
    try:
        for k, ctx in enumerate(contexts):
            if k == 3:
                torch.set_default_dtype(torch.float64)
            for _ in range(2):
                with ctx():
                    got, want = compiled(x), f(x)
                torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
                assert got[1:] == want[1:], (k, got[1:], want[1:])
    finally:
        torch.set_default_dtype(torch.float32)


class _DictCfg:
    """Attributes served by __getattr__ from a dict (as config libraries do)."""

    def __init__(self):
        self.__dict__["d"] = {"scale": 1.0}

    def __getattr__(self, name):
        try:
            return self.d[name]
        except KeyError:
            raise AttributeError(name) from None


_DCFG = _DictCfg()


def _reads_dict_cfg(a):
    return a * _DCFG.scale + getattr(_DCFG, "shift", 0.0)


def test_attributes_served_by_getattr_are_read_by_python():
    """cfg.scale served by __getattr__ is computed by Python on each read: no guard can tell when
    it changes, so it is a graph break (it was read once, with no guard)."""
    x = np.ones(3, np.float32)
    f = fastcompile.compile(_reads_dict_cfg)
    try:
        for k, (scale, shift) in enumerate([(1.0, None), (4.0, None), (4.0, 2.5), (0.5, -1.0)]):
            _DCFG.d["scale"] = scale
            if shift is not None:
                _DCFG.d["shift"] = shift
            for _ in range(2):
                np.testing.assert_array_equal(f(x), _reads_dict_cfg(x), err_msg="change %d" % k)
    finally:
        _DCFG.d.clear()
        _DCFG.d["scale"] = 1.0


def test_thread_local_attributes_are_read_per_thread():
    """A threading.local's attributes differ per thread: reading one is a graph break, and each
    thread's compiled call sees its own value (a getattr default once stood in for it)."""
    x = np.ones(2, np.float32)
    f = fastcompile.compile(_reads_thread_local)
    got = {}

    def run(k):
        if k is not None:
            _TLS.k = k
        got[k] = [f(x).tolist() for _ in range(2)]
    for k in (None, 3.0, 5.0):
        t = threading.Thread(target=run, args=(k,))
        t.start()
        t.join()
    assert got == {None: [[1.0, 1.0]] * 2, 3.0: [[3.0, 3.0]] * 2, 5.0: [[5.0, 5.0]] * 2}


_Pair = __import__("collections").namedtuple("_Pair", "a b")


class _Color(__import__("enum").Enum):
    RED = 1
    BLUE = 2


class _Slotted:
    __slots__ = ("scale",)

    def __init__(self, scale):
        self.scale = scale


@__import__("dataclasses").dataclass(slots=True)
class _SlottedDC:
    scale: float


def _scaled_by(x, s):
    return x * s


def _max_then_branch(x):
    m = x.max()
    if m > 0:                   # a data-dependent branch: m reaches the resume function as a NumPy scalar
        return x / m
    return x


@pytest.mark.parametrize("case", ["np_float32", "np_float64", "np_int64_shape", "np_bool", "py_minus_zero",
                                  "complex", "slice", "range", "namedtuple", "enum", "fraction",
                                  "slots", "slots_dataclass"])
def test_values_of_arguments_are_guarded_by_value(case):
    """Arguments whose value the trace uses are guarded by value, so a later call with another
    value recompiles instead of reusing the first call's: NumPy scalars (they were guarded by type
    only and their first value baked in), -0.0 against 0.0 (== made them one entry), complex
    numbers, slices, ranges, namedtuples, enum members, fractions, and the members of __slots__
    objects (read with no guard at all)."""
    from fractions import Fraction
    x = np.arange(6, dtype=np.float32)
    cases = {
        "np_float32": (_scaled_by, [np.float32(1.5), np.float32(2.5), np.float32(-0.0)]),
        "np_float64": (_scaled_by, [np.float64(1.5), np.float64(7.0), np.float64("nan"), np.float64("nan")]),
        "np_int64_shape": (lambda x, n: x.reshape(n, -1) * 2, [np.int64(1), np.int64(2), np.int64(3)]),
        "np_bool": (lambda x, b: x * 2 if b else x, [np.bool_(True), np.bool_(False)]),
        "py_minus_zero": (lambda x, s: (np.copysign(x, s), x / s), [0.0, -0.0, 0.0]),
        "complex": (_scaled_by, [1 + 2j, 3 + 1j]),
        "slice": (lambda x, s: x[s] * 2, [slice(0, 2), slice(1, 4), slice(None, None, 2)]),
        "range": (lambda x, r: x * len(r), [range(2), range(5)]),
        "namedtuple": (lambda x, p: x * p.a + p.b, [_Pair(1, 2), _Pair(3, 4)]),
        "enum": (lambda x, c: x * c.value, [_Color.RED, _Color.BLUE]),
        "fraction": (lambda x, q: x * float(q), [Fraction(1, 2), Fraction(3, 2)]),
        "slots": (lambda x, c: x * c.scale, [_Slotted(2.0), _Slotted(5.0)]),
        "slots_dataclass": (lambda x, c: x * c.scale, [_SlottedDC(2.0), _SlottedDC(7.0)]),
    }
    fn, values = cases[case]
    compiled = fastcompile.compile(fn)
    with np.errstate(divide="ignore", invalid="ignore"):
        for v in values:
            for _ in range(2):
                got, want = compiled(x, v), fn(x, v)
                for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                    assert g.dtype == w.dtype and g.shape == w.shape, (v, g, w)
                    np.testing.assert_array_equal(g, w, err_msg=repr(v))
                    if g.dtype.kind == "f":
                        assert np.array_equal(np.signbit(g), np.signbit(w)), (v, g, w)
    if case == "slots":
        obj = _Slotted(2.0)
        compiled(x, obj)
        obj.scale = 3.0                      # the member changes in place
        np.testing.assert_array_equal(compiled(x, obj), x * 3.0)


def test_a_numpy_scalar_across_a_graph_break_is_read_at_each_call():
    """m = x.max(); if m > 0: return x / m: the branch is a graph break and m reaches the resume
    function as a NumPy scalar, guarded by value now: each call divides by its own maximum (it
    divided by the first call's)."""
    f = fastcompile.compile(_max_then_branch)
    for x in (np.array([1.0, 2.0, 4.0]), np.array([1.0, 3.0, 6.0]), np.array([-1.0, -2.0, 0.0])):
        np.testing.assert_array_equal(f(x), _max_then_branch(x))


def test_a_bound_method_of_an_array_as_an_argument():
    """op(x) with op = w1.dot, then w2.dot: results as Python's. Describing the identity guard
    that failed compared the method's __self__ (an ndarray) with ==, and raised ValueError."""
    def f(x, op):
        return op(x) + 1
    x = np.ones(3)
    compiled = fastcompile.compile(f)
    for k in (1.0, 2.0, 3.0):
        w = np.eye(3) * k
        np.testing.assert_array_equal(compiled(x, w.dot), f(x, w.dot))
    assert "Guards" in str(fastcompile.explain(f)(x, np.eye(3).dot))


@pytest.mark.parametrize("case", ["mul_int", "mul_float", "div", "rfloordiv", "rmod", "where", "fraction"])
def test_python_scalars_with_float16_arrays_are_float16(case):
    """A Python scalar that meets float16 arrays is a float16 first, as NumPy makes it (NEP 50):
    x * 100000 is x * inf (NaN at 0), x * 0.1 multiplies by float16's 0.1. The core kept the
    constant in float32 (torch's rule, which the torch route keeps)."""
    fns = {
        "mul_int": lambda a: a * 100000,
        "mul_float": lambda a: a * 100000.0,
        "div": lambda a: a / 2 ** 31,
        "rfloordiv": lambda a: 2 ** 31 // a,
        "rmod": lambda a: 2 ** 31 % a,
        "where": lambda a: np.where(a > 0, a, 1e5),
        "fraction": lambda a: a * 0.1 + 3,
    }
    fn = fns[case]
    x = np.array([0.0, -1.5, 3.0, 100.0, -0.0, 0.333], np.float16)
    compiled = fastcompile.compile(fn)
    with np.errstate(all="ignore"):
        for _ in range(2):
            got, want = compiled(x), fn(x)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_closure_cells_of_inlined_functions_are_guarded_and_their_mutation_is_a_side_effect():
    """An inlined function's closure cells were read once, as constants of the trace: a
    rebound cell (nonlocal) kept its old value, a list in one was read without a guard, and
    appending to it was dropped (a local list's append). They are now read at call time
    (CellSource): rebinding recompiles, and the append is a graph break that runs."""
    def make():
        c = 2.0
        log = []

        def scale(v):
            return v * c

        def note(v):
            log.append(1)
            return v

        def f(x):
            return note(scale(x)) + 1.0

        def set_c(v):
            nonlocal c
            c = v
        return f, set_c, log, note

    f, set_c, log, note = make()
    cf = fastcompile.compile(f)
    x = np.arange(4.0)
    np.testing.assert_allclose(cf(x), x * 2.0 + 1.0)
    set_c(3.0)
    np.testing.assert_allclose(cf(x), x * 3.0 + 1.0)
    assert len(log) == 2                              # both calls appended
    for _ in range(4):                                # appending changes no guard: no recompile
        np.testing.assert_allclose(cf(x), x * 3.0 + 1.0)
    assert len(log) == 6
    assert len(entries(note)) == 1                    # before, one more entry per call


def test_async_compile_general_path_next_call_waits_for_the_build(async_on, held_build):
    """A target off the fast path (a dict result): the first call returns the traced values, the
    next call waits for the background build before it runs the graph."""
    import time
    gate, builds = held_build

    def f(x):
        return {"a": np.tanh(x) * 1.75 + 0.5}

    cf = fastcompile.compile(f)
    x = np.random.rand(64)
    np.testing.assert_array_equal(cf(x)["a"], f(x)["a"])
    (compiled,) = builds
    assert compiled.nplans == 0
    opened = []

    def let_go():
        time.sleep(0.3)
        opened.append(time.monotonic())
        gate.set()
    t = threading.Thread(target=let_go)
    t.start()
    y = np.random.rand(64)
    np.testing.assert_allclose(cf(y)["a"], f(y)["a"], rtol=1e-6)
    done = time.monotonic()
    t.join()
    assert opened and done >= opened[0], "the second call ran before the build was let go"
    assert compiled.nplans > 0


# ---------------------------------------------------------------------------- floats read at each call

def _lr_step(x, lr):
    return x - lr * x * 2


_FLOAT_VALUES = [0.1, 0.2, 1e-3, -0.0, 0.0, float("inf"), float("-inf"), float("nan"), 1e300, 3.0]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint8"])
def test_a_changing_float_is_read_at_each_call(dtype):
    """A Python float argument is a weak graph input (NEP 50: float32 stays float32, an integer
    array gives float64): ten values, one trace, NumPy's results bit for bit (NaN positions and
    signed zeros included)."""
    f = fastcompile.compile(_lr_step)
    x = (np.arange(-6, 6) if dtype != "uint8" else np.arange(12)).astype(dtype)
    with np.errstate(all="ignore"):
        for lr in _FLOAT_VALUES:
            got, want = f(x, lr), _lr_step(x, lr)
            assert got.dtype == want.dtype, (lr, got.dtype, want.dtype)
            np.testing.assert_array_equal(got, want)
            assert np.array_equal(np.signbit(got), np.signbit(want)), lr
    assert len(entries(_lr_step)) == 1


def test_a_float_with_float16_arrays_is_a_float16_at_each_call():
    """NumPy rounds a Python float to float16 before multiplying a float16 array (x * 1e5 is
    x * inf): the graph reads float16(s), computed by Python at each call: one trace, right
    for every value."""
    def h(x, s):
        return x * s
    f = fastcompile.compile(h)
    x = np.linspace(-2, 2, 9).astype(np.float16)
    with np.errstate(all="ignore"):
        for s in (0.1, 1e5, 0.1, 3.0):
            got, want = f(x, s), h(x, s)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    assert len(entries(h)) == 1


def _f16_compares(x, t):
    return x < 0.1, x == t, x >= 100000, np.where(x > t, x, 0.1), x < np.float32(0.1)


def test_a_float_compared_with_float16_arrays_is_a_float16_first():
    """NumPy makes a Python float that meets float16 arrays a float16 before comparing
    (float16(0.1) < 0.1 is False there; 100000 is inf): a comparison's bool result does not
    hide that. A NumPy float32 scalar is strongly typed: compared in float32."""
    f = fastcompile.compile(_f16_compares)
    x = np.array([0.1, 0.2, 0.05, -0.0, 65504, np.inf, np.nan], np.float16)
    with np.errstate(all="ignore"):
        for t in (0.1, 0.2):
            for got, want in zip(f(x, t), _f16_compares(x, t)):
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want)


class _Opt:
    def __init__(self):
        self.lr = 0.5


_OPT = _Opt()
_G_LR = 0.25
_G_TABLE = {"mom": 0.9}
_G_LIST = [1.5]


def _many_float_sources(x, d=0.5, **kw):
    def inner(y):
        return y * d
    return inner(x) * _OPT.lr + _G_LR * x + _G_TABLE["mom"] + _G_LIST[0] + kw["k"]


def test_floats_from_every_source_are_read_at_each_call():
    """A float default, closure cell, attribute, global, dict item, list item and keyword
    argument: changing each one is seen with no new trace."""
    global _G_LR
    f = fastcompile.compile(_many_float_sources)
    x = C.a2(3, 4)
    old = _G_LR
    try:
        for step in range(4):
            _OPT.lr, _G_LR = 0.5 + step, 0.25 * step
            _G_TABLE["mom"], _G_LIST[0] = 0.9 - step, 1.5 * step
            np.testing.assert_array_equal(f(x, 0.1 * step, k=2.0 ** step),
                                          _many_float_sources(x, 0.1 * step, k=2.0 ** step))
        assert len(entries(_many_float_sources)) == 1
    finally:
        _OPT.lr, _G_LR, _G_TABLE["mom"], _G_LIST[0] = 0.5, old, 0.9, 1.5


def _float_arith(x, lr, t):
    a = lr * 0.5 - 0.01
    b = math.sqrt(t) / lr
    c = -lr + abs(t - 3.0) + t // 2.0 + t % 0.7
    return x * a + b * c, a, b, c


def test_float_arithmetic_is_computed_by_python_at_each_call():
    """Float arithmetic on floats read at each call is Python's own, again at each call: the
    floats it returns are Python floats equal to the plain function's, and what Python raises
    (ZeroDivisionError, a math domain error) is raised at that call."""
    f = fastcompile.compile(_float_arith)
    x = C.a2(3, 4)
    for lr, t in [(0.1, 2.0), (0.3, 5.5), (1e-3, 9.0), (-2.0, 0.25)]:
        got, want = f(x, lr, t), _float_arith(x, lr, t)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1:] == want[1:] and all(type(v) is float for v in got[1:])
    assert len(entries(_float_arith)) == 1
    with pytest.raises(ZeroDivisionError):
        f(x, 0.0, 1.0)
    with pytest.raises(ValueError, match="math domain error"):
        f(x, 0.1, -1.0)
    np.testing.assert_array_equal(f(x, 0.7, 4.0)[0], _float_arith(x, 0.7, 4.0)[0])
    assert len(entries(_float_arith)) == 1
    out = fastcompile.explain(_float_arith)(x, 0.2, 3.0)
    assert "Floats read at each call: ((L['lr'] * 0.5) - 0.01), ((math.sqrt(L['t']) / L['lr']) * " in str(out), str(out)


def _float_branch(x, lr):
    if lr > 0.15:
        return x * lr
    return x - lr


def _float_as_python_value(x, lr):
    return x[: int(lr * 10)] + np.full_like(x[: int(lr * 10)], lr)


@pytest.mark.parametrize("fn, values", [(_float_branch, [0.1, 0.2, 0.1, 0.3, 0.3]),
                                        (_float_as_python_value, [0.2, 0.3, 0.2, 0.5])])
def test_a_float_whose_value_the_trace_uses_is_guarded_by_value(fn, values):
    """A float the trace uses as a Python value (a branch, a slice bound, a NumPy call it does not
    compile) is baked in and guarded by value: one trace per value, each right."""
    f = fastcompile.compile(fn)
    x = C.a2(6)
    for v in values:
        np.testing.assert_array_equal(f(x, v), fn(x, v))
    assert len(entries(fn)) == len(set(values))


def _scalar_across_break(x):
    m = x.max()
    s = float(x.sum())
    print("", end="", file=_SINK)
    return x / m + s


def test_scalars_crossing_a_graph_break_are_read_at_each_call():
    """x.max() (a NumPy float32) and float(x.sum()) carried across a graph break: the resumed
    graph reads them at each call, with NumPy's types (the float32 scalar stays strongly typed)."""
    f = fastcompile.compile(_scalar_across_break)
    for k in range(5):
        x = C.a2(7) * (k + 1)
        got, want = f(x), _scalar_across_break(x)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert len(entries(_scalar_across_break)) == 1
    out = fastcompile.explain(_scalar_across_break)(C.a2(7))
    assert "Floats read at each call: L['m'], L['s']" in str(out), str(out)


@pytest.mark.parametrize("scalar, dtype", [(np.float64(0.1), "float32"), (np.float32(0.1), "float16"),
                                           (np.float16(0.1), "float32"), (np.float32(3.5), "int64")])
def test_numpy_float_scalars_are_read_at_each_call_strongly_typed(scalar, dtype):
    f = fastcompile.compile(_lr_step)
    x = np.arange(-4, 4).astype(dtype)
    for k in range(4):
        s = type(scalar)(scalar * (k + 1))
        got, want = f(x, s), _lr_step(x, s)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert len(entries(_lr_step)) == 1
    np.testing.assert_array_equal(f(x, 0.5), _lr_step(x, 0.5))   # a Python float: another trace
    assert len(entries(_lr_step)) == 2


def _pow_op(x, e):
    return x ** e + np.power(x, e)


def test_a_float_exponent_is_baked_in():
    """NumPy takes x ** 0.5 as sqrt(x) (sqrt(-0.0) is -0.0, sqrt(-inf) is nan, where pow gives
    +0.0 and +inf); the core does so for a constant exponent only, so a float exponent is baked
    in: one trace per value, each NumPy's."""
    f = fastcompile.compile(_pow_op)
    x = np.array([-0.0, -np.inf, np.inf, 4.0, 2.5], np.float32)
    with np.errstate(invalid="ignore"):
        for e in (0.5, 2.0, 0.5, 1.5):
            got, want = f(x, e), _pow_op(x, e)
            np.testing.assert_array_equal(got, want)
            keep = ~np.isnan(want)
            assert np.array_equal(np.signbit(got[keep]), np.signbit(want[keep])), e
    assert len(entries(_pow_op)) == 3


def _helper_with_defaults(x, k=2.0, n=3, w=np.arange(4.0), *, bias=1):
    return x * k + n + bias + w


def _calls_helper_with_defaults(x):
    return _helper_with_defaults(x) + _helper_with_defaults(x, 1.0, 2)


def test_defaults_of_an_inlined_function_are_read_through_it():
    """An inlined function's defaults are read through the function at each call: assigning its
    __defaults__ or __kwdefaults__ later is seen (an int default by a new trace, a float or array
    default as a graph input), and an array default is an input, not a graph break."""
    f = fastcompile.compile(_calls_helper_with_defaults)
    x = np.arange(4.0)
    saved = _helper_with_defaults.__defaults__, _helper_with_defaults.__kwdefaults__
    try:
        same(f(x), _calls_helper_with_defaults(x))
        _helper_with_defaults.__defaults__ = (5.0, 3, np.ones(4))     # a float and an array: read
        same(f(x), _calls_helper_with_defaults(x))
        assert len(entries(_calls_helper_with_defaults)) == 1
        _helper_with_defaults.__defaults__ = (5.0, 7, np.ones(4))     # an int: traced again
        same(f(x), _calls_helper_with_defaults(x))
        _helper_with_defaults.__kwdefaults__ = {"bias": 10}
        same(f(x), _calls_helper_with_defaults(x))
        assert len(entries(_calls_helper_with_defaults)) == 3
        _helper_with_defaults.__defaults__ = (5.0,)                   # too few: Python's TypeError
        with pytest.raises(TypeError, match="missing 2 required positional arguments"):
            f(x)
    finally:
        _helper_with_defaults.__defaults__, _helper_with_defaults.__kwdefaults__ = saved
    same(f(x), _calls_helper_with_defaults(x))
    out = str(fastcompile.explain(_calls_helper_with_defaults)(x))
    assert "Graph break count: 0" in out and "__defaults__[2] is ndarray float64" in out, out


def _np_scalar_builtins(x, lr):
    return x * float(lr), float(lr), type(lr), x * abs(lr)


@pytest.mark.parametrize("scalar", [np.float32(-0.1), np.float16(0.3), np.float64(-2.5), -0.7])
def test_builtins_on_a_float_read_at_each_call_are_pythons(scalar):
    """float(s) of a NumPy scalar is a Python float (weak: a float32 array stays float32),
    type(s) is its own type, abs(s) keeps its type: as plain Python, with no graph break, one
    trace for every value of a type."""
    f = fastcompile.compile(_np_scalar_builtins)
    x = np.linspace(-1, 1, 7).astype(np.float32)
    with np.errstate(all="ignore"):
        for k in (1, 2, 3):
            s = type(scalar)(scalar * k)
            got, want = f(x, s), _np_scalar_builtins(x, s)
            for g, w in zip(got, want):
                assert type(g) is type(w), (g, w)
                if isinstance(w, np.ndarray):
                    assert g.dtype == w.dtype
                    np.testing.assert_array_equal(g, w)
                else:
                    assert g == w
    assert len(entries(_np_scalar_builtins)) == 1
    out = str(fastcompile.explain(_np_scalar_builtins)(x, type(scalar)(scalar * 5)))
    assert "Graph break count: 0" in out, out


def _unused_float_arith(x, lr, t):
    inv = 1.0 / t                   # never used afterwards
    r = math.sqrt(lr)               # nor this
    return x * lr


def test_unused_float_arithmetic_still_raises_at_each_call():
    """Float arithmetic whose result the graph never reads is still Python's at each call, so
    what Python raises there is raised (a ZeroDivisionError, a math domain error)."""
    f = fastcompile.compile(_unused_float_arith)
    x = np.ones(3)
    same(f(x, 0.5, 2.0), _unused_float_arith(x, 0.5, 2.0))
    with pytest.raises(ZeroDivisionError):
        f(x, 0.5, 0.0)
    with pytest.raises(ValueError, match="math domain error"):
        f(x, -1.0, 1.0)
    same(f(x, 0.25, 4.0), _unused_float_arith(x, 0.25, 4.0))
    assert len(entries(_unused_float_arith)) == 1


def _float_identity(x, a, b):
    r = x * a if a is b else x
    return r * 2 if a is not None else r


def test_identity_of_floats_read_at_each_call_is_pythons():
    """a is b between two floats read at each call: whether they are one object is Python's
    answer at each call (a graph break), not the trace's; a is None stays compiled."""
    f = fastcompile.compile(_float_identity)
    x = np.ones(3)
    v = 0.5
    for a, b in [(v, v), (v, 0.25), (v, float("0.5")), (0.75, 0.75)]:
        same(f(x, a, b), _float_identity(x, a, b))


def _identity(x, a, b):
    return x * 2 if a is b else x


def test_identity_of_equal_ints_and_strings_is_pythons():
    """a is b between equal ints or strings the trace guards by value: one object at one call,
    two at another (10 ** 6 and int("1000000")): Python answers it (a graph break); small
    ints, None and unequal values stay compiled."""
    f = fastcompile.compile(_identity)
    x = np.ones(3)
    n = 10 ** 6
    for a, b in [(n, n), (n, int(str(n))), (5, 5), ("ab", "ab"), ("ab", "".join(["a", "b"])),
                 (None, None), (1, None), (n, n + 1)]:
        same(f(x, a, b), _identity(x, a, b))


def _torch_scalar_checks(x, lo, v):
    import torch
    return torch.clamp(x, -lo, lo), torch.where(x > 0, x, v)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_torch_scalars_that_overflow_raise_as_eager(dtype):
    """torch.clamp and torch.where check a Python scalar fits the tensor's dtype (1e308 for
    float32 raises RuntimeError): a float read at each call is baked in there, so the compiled
    call raises as eager does."""
    torch = pytest.importorskip("torch")
    f = fastcompile.compile(_torch_scalar_checks)
    x = torch.arange(-3, 4).to(getattr(torch, dtype))
    with torch.no_grad():
        for lo in (2.0, 1.5):
            for g, w in zip(f(x, lo, 0.5), _torch_scalar_checks(x, lo, 0.5)):
                assert g.dtype == w.dtype and torch.equal(g, w)
        with pytest.raises(RuntimeError, match="overflow"):
            _torch_scalar_checks(x, 1e308, 0.5)
        with pytest.raises(RuntimeError, match="overflow"):
            f(x, 1e308, 0.5)
        with pytest.raises(RuntimeError, match="overflow"):
            f(x, 2.0, 1e308)


class _Plain:
    pass


def _reads_instance_dict(x, o):
    return x * o.lr + o.__dict__["lr"]


def test_an_instance_dict_read_is_seen_when_it_changes():
    """o.__dict__["lr"]: no guard reads the items of an instance dict the trace was handed, so
    it is read by Python (a graph break), and a new value is seen."""
    f = fastcompile.compile(_reads_instance_dict)
    o, x = _Plain(), np.ones(2)
    for v in (0.1, 0.25, 4.0):
        o.lr = v
        same(f(x, o), _reads_instance_dict(x, o))
    out = str(fastcompile.explain(_reads_instance_dict)(x, o))
    assert "_Plain.__dict__ is read by Python" in out, out


def _nested_constant_defaults(x, lr):
    cfg = {"lr": lr}

    def inner(y, lr=0, *, k=2):
        return y * lr * k
    total = x
    for s in (1.0, 2.0, 3.0):
        total = total + inner(x, **cfg) * s
    a, b = (3, 4)
    return total + inner(x) + np.float32(0.5) * a + np.float64(2.0) * b


def test_constant_defaults_tuples_and_numpy_scalar_constants_trace():
    """A function made in the frame with constant defaults (called with **kwargs), a loop over
    a tuple constant, unpacking one, and NumPy scalar constants (np.float32(0.5), strongly
    typed): one graph, no break, NumPy's dtypes (float16 results stay float32 inside a graph,
    as the README says; NumPy rounds each: float16's tolerance)."""
    f = fastcompile.compile(_nested_constant_defaults)
    for dt, rtol in ((np.float32, 1e-6), (np.float16, 1e-3)):
        x = np.linspace(-1, 1, 6).astype(dt)
        got, want = f(x, 0.3), _nested_constant_defaults(x, 0.3)
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol)
    out = str(fastcompile.explain(_nested_constant_defaults)(x, 0.3))
    assert "Graph break count: 0" in out, out


_BASE = np.arange(10.0)


def _base_is_none(x):
    return x + (x.base is None)


def _base_is_global(x):
    return x * (x.base is _BASE)


def _copy_on_view(x):
    if x.base is not None:
        return x.copy() * 2
    return x * 3


def _base_or_self(x):
    b = x.base if x.base is not None else x
    return b * 2


def _attr_truth(x):
    return x.sum() + (1.0 if x.nbytes else 2.0) + (1 if x.strides else 2) + x.itemsize


@pytest.mark.parametrize("fn", [_base_is_none, _base_is_global, _copy_on_view, _base_or_self, _attr_truth])
def test_array_data_attributes_are_not_methods(fn):
    """x.base, x.strides (data attributes, not methods): `is` and truth tests on them are
    Python's (x.base is None was always False, a truth test always True); nbytes and itemsize
    are numbers of the guarded dtype and sizes."""
    f = fastcompile.compile(fn)
    for x in (np.arange(4.0), _BASE[:4], np.zeros(0), np.array(5.0), np.arange(6.0).reshape(2, 3)[:, 1]):
        same(f(x), fn(x))
