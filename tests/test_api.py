"""The frontend end to end: fastcompile.compile / explain / reset through the real
PEP 523 hook (csrc/hook), the tracer (python/fastcompile/trace) and the core.

Goldens: tests/golden/explain/<case>.txt holds str(explain(fn)(*args)) after
normalize() (addresses, timings, kernel names and cache paths, absolute paths,
resume offsets and the 3.11/3.12 names of conditional jumps become stable
tokens), one file per corpus entry, shared by Python 3.11 and 3.12.
FASTCOMPILE_UPDATE_GOLDEN=1 rewrites them.

Here: goldens, the hook (references, threads, recursion), exceptions, guards and recompiles,
fullgraph and reset, nn.Module, async compile. What a trace reads and writes of Python values:
test_api_values.py. Shared fixtures: api_helpers.py.
"""

import gc
import io
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
from api_helpers import clean, entries  # noqa: F401 (clean: an autouse fixture)
from test_trace import same

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden", "explain")
UPDATE = os.environ.get("FASTCOMPILE_UPDATE_GOLDEN", "") not in ("", "0")
THIS = os.path.basename(__file__)


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
    text = re.sub(r"(?:[^\s()'\"]*/)([\w.-]+\.py)\b", r"\1", text)  # paths -> basenames
    text = re.sub(r"__resume\w+", lambda m: re.sub(r"_at_\d+", "_at_<offset>", m.group(0)), text)
    text = re.sub(r"POP_JUMP_(?:FORWARD_|BACKWARD_)?IF_", "POP_JUMP_IF_", text)  # 3.11 vs 3.12 names
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
    raw = (
        "Frame f (/a/b/tests/x.py:3): 1 graph(s), 0 break(s), traced and compiled in 12.5 ms\n"
        "  graph 0: fc_0123456789abcdef  /root/.cache/fastcompile/4a/" + "4a" * 32 + ".c\n"
        "  Guards (2):\n"
        "    G['m'] is <MLP object at 0x7f29561a9670>\n"
        "    G['a'] is module numpy\n"
        "Frame __resume___resume_f_at_40_at_152 (tests/x.py:3)\n"
        "  data-dependent branch (POP_JUMP_FORWARD_IF_FALSE)"
    )
    assert normalize(raw) == (
        "Frame f (x.py:3): 1 graph(s), 0 break(s), traced and compiled in <t> ms\n"
        "  graph 0: fc_<hash>  <kernel cache>/<sha256>.c\n"
        "  Guards (2):\n"
        "    G['a'] is module numpy\n"
        "    G['m'] is <MLP object at 0x<addr>>\n"
        "Frame __resume___resume_f_at_<offset>_at_<offset> (x.py:3)\n"
        "  data-dependent branch (POP_JUMP_IF_FALSE)"
    )


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
    for _ in range(2):  # a trace, then a cache hit
        args = case.args()
        expected = case.fn(*args, **case.kwargs)
        printed = capsys.readouterr().out
        got = compiled(*args, **case.kwargs)
        assert capsys.readouterr().out == printed  # side effects once, in order
        check_result(got, expected)
    assert _C.code_state(case.fn.__code__) == "active"
    if case.fn is not C.br_side_effect:  # see test_outside_list_append_does_not_recompile
        assert len(entries(case.fn)) == 1, "recompiled on same-shaped arguments: %r" % entries(case.fn)
    C.LOG.clear()  # the golden holds guards on it (br_side_effect)
    if case.torch:
        C.torch.manual_seed(0)  # values reach guards after a break (.item())
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
    assert len(C.LOG) == n + 3  # the append ran at every call
    assert len(entries(C.br_side_effect)) == 1


_OUTSIDE_DICT = {}


def _dict_insert(x):
    y = x + 1
    _OUTSIDE_DICT[id(y)] = 1  # a store into an outside dict: a graph break
    return y * 2


def test_outside_dict_insert_does_not_recompile():
    """As for lists: an outside dict is guarded on its length only where its items are read."""
    f = fastcompile.compile(_dict_insert)
    x = C.a2(5, 6)
    n = len(_OUTSIDE_DICT)
    try:
        for _ in range(3):
            same(f(x), (x + 1) * 2)
        assert len(_OUTSIDE_DICT) >= n + 1  # the stores ran (ids may repeat)
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
        _SCALES["a"] = 5.0  # a float item changed: read at each call
        same(f(x), _read_outside_dict(x))
        assert len(entries(_read_outside_dict)) == 1
        _SCALES["k"] = 4  # an int item changed: traced again
        same(f(x), _read_outside_dict(x))
        _SCALES["b"] = 1.0  # the length changed: traced again
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
        _OUTSIDE.append(3.0)  # the length changed: traced again
        same(f(x), _sum_outside(x))
        _OUTSIDE[0] = 5.0  # a float item changed: read at each call
        same(f(x), _sum_outside(x))
        assert len(entries(_sum_outside)) == 2
        _OUTSIDE[0] = 5  # its type changed: traced again
        same(f(x), _sum_outside(x))
        assert len(entries(_sum_outside)) == 3
    finally:
        del _OUTSIDE[2:]
        _OUTSIDE[0] = 1.0


def test_every_golden_has_a_case():
    if not os.path.isdir(GOLDEN):
        pytest.skip("no goldens yet")
    names = {f[:-4] for f in os.listdir(GOLDEN) if f.endswith(".txt")}
    if C.torch is None:  # no torch cases without torch
        names = {n for n in names if not n.startswith("th_")}
    assert names <= set(CASE_IDS), "stale goldens: %s" % sorted(names - set(CASE_IDS))


def test_explain_fields_and_report():
    x = C.a2(5, 6)
    out = fastcompile.explain(C.br_data_branch)(x)
    assert out.graph_count == 2 and out.graph_break_count == 1
    assert out.ops_per_graph == [["mul", "sum", "gt"], ["sub"]] or out.ops_per_graph[0][:2] == ["mul", "sum"]
    (b,) = out.break_reasons
    assert "data-dependent branch" in b.reason and "hint:" in b.reason
    assert b.user_stack[-1][:3] == (
        C.br_data_branch.__code__.co_filename,
        line_of(C.br_data_branch, "if y.sum()"),
        "br_data_branch",
    )
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
    np.testing.assert_array_equal(f(x, y), fn(x, y))  # traced
    f(x, y)  # resume functions traced too
    gc.collect()
    before = (sys.getrefcount(fn.__code__), sys.getrefcount(fn), sys.getrefcount(x), sys.getrefcount(y), _frames())
    for _ in range(10000):
        f(x, y)
    gc.collect()
    after = (sys.getrefcount(fn.__code__), sys.getrefcount(fn), sys.getrefcount(x), sys.getrefcount(y), _frames())
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
        except BaseException as e:  # noqa: B902  reported below
            errors.append(e)

    ts = [
        threading.Thread(target=work, args=(fa, _t_double, np.float32, 0)),
        threading.Thread(target=work, args=(fb, _t_reduce, np.float64, 1000)),
    ]
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
        warnings.simplefilter("ignore", FastcompileWarning)  # n differs at every level: past 8 variants
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
    assert entries(_gen) == []  # the generator's own frames are never compiled
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
    assert os.path.basename(tb[0].filename) == THIS and tb[0].name == "_run"  # the caller
    assert os.path.basename(tb[-1].filename) == THIS and tb[-1].name == "_bcast"
    np.testing.assert_array_equal(f(x, y), _bcast(x, y))  # still compiled


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


@pytest.mark.parametrize(
    "variant,expect",
    [
        (lambda x: x.astype(np.float64), ["ndarray float32", "float64"]),  # dtype
        (lambda x: x[None], ["ndim=2", "ndim=3"]),  # rank
        (lambda x: x.T, ["contig=C", "contig=non-C"]),  # contiguity
        (lambda x: x[:1], ["size1_mask=0b0", "size1_mask=0b1"]),  # a size becomes 1
    ],
    ids=["dtype", "rank", "contiguity", "size1"],
)
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
    assert len(entries(_sq)) == 2  # both variants hit now


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
            assert rec.recompiles == (
                [where + "G['SCALE'] == 2.0; now 3.0", where + "G['OFFSET'] == np.float32(0.5); now np.float32(0.25)"]
                if specialize
                else []
            )
    finally:
        C.SCALE, C.OFFSET = old, old_off
    np.testing.assert_array_equal(f(x), C.np_global(x))
    assert len(entries(C.np_global)) == 1 + 2 * specialize


def _outer_two_dtypes(a, b):
    print("", end="", file=_SINK)  # a break: the inner calls are frames of their own
    return _inner_frame(a), _inner_frame(b)


def _inner_frame(v):
    print("", end="", file=_SINK)
    return v + 1


def test_explain_lists_recompiles():
    out = fastcompile.explain(_outer_two_dtypes)(C.a2(3), C.a2(3, dtype=np.float64))
    assert any("_inner_frame" in r and "float32" in r and "float64" in r for r in out.recompiles), out.recompiles
    assert "Recompiles:" in str(out)


def _k(x, k):
    return x * k


def test_ninth_variant_runs_uncompiled_with_a_warning():
    f = fastcompile.compile(_k)
    x = C.a2(3, 4)
    for k in range(8):
        np.testing.assert_array_equal(f(x, k), _k(x, k))
    assert len(entries(_k)) == 8
    with pytest.warns(
        FastcompileWarning,
        match=r"_k .*compiled for 8 different inputs.*"
        r"guard failed: L\['k'\] == 7; now 8",
    ):
        np.testing.assert_array_equal(f(x, 8), _k(x, 8))
    assert _C.code_state(_k.__code__) == "run_only"
    np.testing.assert_array_equal(f(x, 9), _k(x, 9))  # no more warnings, still right
    np.testing.assert_array_equal(f(x, 3), _k(x, 3))  # old entries still hit
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
    assert len(entries(_th)) == 5  # a new entry: autograd mode
    assert got.requires_grad and type(got.grad_fn).__name__ == "CompiledFunctionBackward"
    torch.testing.assert_close(got, _th(r))


# ----------------------------------------------------------------------------------------------
# fullgraph, reset
# ----------------------------------------------------------------------------------------------


def test_fullgraph_raises_at_the_first_break(capsys):
    f = fastcompile.compile(C.br_two, fullgraph=True)
    with pytest.raises(trace.Unsupported) as e:
        f(C.a2(5, 6))
    assert capsys.readouterr().out == ""  # nothing of the frame ran
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
    assert len(entries(_sq)) == 1 and entries(_sq)[0].hits == 0  # traced again
    assert rec.recompiles == []  # a fresh trace, no recompile


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
    src = "def brk(x):\n    y = x + 1\n    print('', end='', file=sink)\n    return y * 2\n"
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
    return z, z.sum()  # a NumPy scalar out: run(), no fast target


def _kept_break(x, y):
    z = np.exp(x) * y + 1
    print("", end="", file=_SINK)  # graph break: the slow path (no fast target)
    return z * 2, y


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fn", [_kept_pair, _kept_sum, _kept_break], ids=["fast", "scalar", "break"])
def test_a_compiled_function_keeps_neither_the_first_calls_inputs_nor_the_traces_arrays(fn, background):
    """A compiled target lives as long as the function: what the trace saw (the first call's
    arrays as examples, every traced value's array) must not live on in it, or a batch passed
    once would stay in memory for good."""
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
        fastcompile.pending_compiles(wait=True, timeout=120)  # async: the build holds them till done
        gc.collect()
        assert [r() is None for r in refs] == [True, True]
        assert _live_vars() == vars0
        x2 = C.a2(777, seed=2)  # and the target still runs, on new inputs
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
    assert cm.training is False and isinstance(cm(torch.zeros(1, 8)), torch.Tensor)  # grad on: a break
    fastcompile.reset()
    code = type(m).forward.__code__
    x = torch.randn(5, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(cm(x), m(x))
        y = torch.randn(9, 8)
        torch.testing.assert_close(cm(y), m(y))  # another batch size: the same entry
        (e,) = _C.code_entries(code)
        assert e.target is not code  # compiled: a graph, not the plain code
        out = fastcompile.explain(cm)(x)
        assert out.graph_count >= 1 and out.graph_break_count == 0, str(out)
        fastcompile.reset()
        cm(x)
        cm.train()  # reaches the module
        assert m.training
        torch.manual_seed(1)
        got = cm(x)
        torch.manual_seed(1)
        want = m(x)
        torch.testing.assert_close(got, want)  # dropout (MLP) runs as torch does
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
    assert len(res.breaks) == 1 and res.code is not None  # resumed after the print
    assert isinstance(res.graphs[0].graph, torch.fx.Graph)
    assert type(cm(x).grad_fn).__name__ == "CompiledFunctionBackward"  # the resume graph too
    with torch.no_grad():  # grad off: another entry
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
    unwind through __exit__ without crashing the interpreter."""
    x = np.array([-1.0, 2.0])
    f = fastcompile.compile(_with_body_raises)
    for _ in range(2):
        np.testing.assert_array_equal(f(x, {"a": 2.0}, "a"), _with_body_raises(x, {"a": 2.0}, "a"))
    for _ in range(2):
        exc, tb = _run(f, x, {"a": 2.0}, "b")
        assert type(exc) is KeyError and exc.args == ("b",)
        assert tb[-1].lineno == line_of(_with_body_raises, "z = np.log(y)")
        assert np.geterr()["invalid"] == "warn"  # __exit__ ran


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
        "print('ok')\n"
    )
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
        assert (got == 0).float().mean() > 0.1  # dropout really dropped
        got.square().mean().backward()
        want.square().mean().backward()
        for (n, p), q in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=n)
        torch.manual_seed(7)
        cm(x)
        after_ours = torch.rand(4)
        torch.manual_seed(7)
        ref(x)
        assert torch.equal(after_ours, torch.rand(4))  # the RNG advanced exactly as eager's
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
        return np.tanh(x @ w) * 1.25 + x.sum()  # a matmul extern between kernels

    cf = fastcompile.compile(f)
    x = np.random.rand(32, 16)
    np.testing.assert_array_equal(cf(x), f(x))  # NumPy's own values: no kernel ran
    (compiled,) = builds
    assert compiled.nplans == 0 and fastcompile.pending_compiles() == base + 1
    gate.set()
    y = np.random.rand(32, 16)
    np.testing.assert_allclose(cf(y), f(y), rtol=1e-6)  # waits for the build, runs the kernels
    assert fastcompile.pending_compiles() == base
    plans = compiled.nplans
    assert plans > 0 and len(compiled.kernels) > 0
    np.testing.assert_allclose(cf(x), f(x), rtol=1e-6)
    assert compiled.nplans == plans  # the build had the layouts of real calls


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
        log.append(float(y[0]))  # a break: the list is outside the frame
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
    base = fastcompile.pending_compiles()  # what other tests left (nothing building)
    salt = np.random.rand()  # kernels of this run's own: compiled now
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
    in one batch, side by side (one compiler per core), not each segment's when the call reaches
    it. The dry run that finds the later segments' layouts uses the trace's extern results."""
    salt = np.random.rand()  # kernels of this run's own: compiled now

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
    assert fastcompile.stats()["compiles"] == after["compiles"]  # the second call: none


def test_explain_turns_async_compile_off_for_its_own_thread_only():
    """explain() compiles its one call synchronously (its report lists the kernels) by turning
    async_compile off in its own thread, not the global knob: another thread's compiles during
    an explain() stay asynchronous, and a knob set meanwhile stays set."""
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
