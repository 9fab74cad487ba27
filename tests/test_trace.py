"""The tracer (python/fastcompile/trace): graph and break counts, results equal
to the uncompiled function (directly, through TraceResult.target or through the
transformed code object), guards and the flat guard program."""

import sys
import types

import numpy as np
import pytest

import fastcompile

from conftest import assert_close_np
from fastcompile import trace
from fastcompile.trace import guards as G
from fastcompile.trace import slot_values, trace_function
from fastcompile.trace.frame import localsplus_names

import trace_corpus as C

pytestmark = pytest.mark.skipif(
    sys.version_info[:2] not in trace.SUPPORTED_PYTHONS,
    reason="the tracer reads CPython 3.11/3.12 bytecode; on other versions frames run as plain Python "
    "(test_unsupported_python_runs_plain covers that)",
)

try:
    import torch
except ImportError:
    torch = None


def same(actual, expected, where="out"):
    if torch is not None and isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), "%s: got %s, expected a tensor" % (where, type(actual))
        assert actual.dtype == expected.dtype, "%s: dtype %s vs %s" % (where, actual.dtype, expected.dtype)
        actual, expected = actual.numpy(), expected.numpy()
    if isinstance(expected, (np.ndarray, np.generic)):
        assert type(actual) is type(expected), "%s: %s vs %s" % (where, type(actual), type(expected))
        kind = "exact" if np.asarray(expected).dtype.kind in "biu" else "reduction"
        assert_close_np(
            np.asarray(actual), np.asarray(expected), kind=kind, atol=None if kind == "exact" else 1e-5, err_msg=where
        )
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            same(a, e, "%s[%d]" % (where, i))
    elif isinstance(expected, dict):
        assert type(actual) is dict and actual.keys() == expected.keys(), where
        for k in expected:
            same(actual[k], expected[k], "%s[%r]" % (where, k))
    else:
        assert type(actual) is type(expected) and actual == expected, "%s: %r vs %r" % (where, actual, expected)


@pytest.mark.parametrize("case", C.CASES, ids=lambda c: c.name)
def test_corpus(case, capsys):
    if case.torch and torch is None:
        pytest.skip("torch is not installed")
    args, kwargs = case.args(), case.kwargs
    r = trace_function(case.fn, *args, **kwargs)
    assert (
        G.check_program(
            r.program, _slots(case.fn, args, kwargs), case.fn.__globals__, __builtins__, case.fn.__closure__
        )
        == -1
    )
    assert len(r.breaks) == case.breaks, r.breaks
    assert len(r.graphs) == case.graphs, r.graphs
    for b in r.breaks:
        assert b.reason and b.user_stack and b.user_stack[-1][0].endswith("trace_corpus.py")
    expected = case.fn(*args, **kwargs)
    printed = capsys.readouterr().out
    if r.target is not None:
        got = r.target(*slot_values(case.fn, args, kwargs, r.slots))
    elif r.code is not None:
        fn = case.fn
        new = types.FunctionType(r.code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        new.__kwdefaults__ = fn.__kwdefaults__
        got = new(*args, **kwargs)
    else:
        assert r.breaks, "no target, no code and no break"
        got = case.fn(*args, **kwargs)
    assert capsys.readouterr().out == printed  # side effects once, same order
    same(got, expected)


def _slots(fn, args, kwargs):
    f_locals = trace.bind_locals(fn, args, kwargs)
    return {i: f_locals[n] for i, n in enumerate(localsplus_names(fn.__code__)) if n in f_locals}


def test_corpus_size():
    assert len(C.NUMPY_CASES) >= 60


def test_fullgraph_raises():
    with pytest.raises(trace.Unsupported, match="print") as e:
        trace_function(C.br_print_mid, C.a2(2, 3), fullgraph=True)
    assert "trace_corpus.py" in str(e.value)


def test_break_reasons():
    r = trace_function(C.br_data_branch, C.a2(2, 3))
    assert "data-dependent branch" in r.breaks[0].reason
    r = trace_function(C.br_inlined, C.a2(2, 3))
    stack = r.breaks[0].user_stack
    assert [s[2] for s in stack] == ["br_inlined", "_inner_print"]
    assert "print" in stack[-1][3]
    r = trace_function(C.br_loop, C.a2(2, 3))
    assert r.code is None and r.target is None and "loop" in r.breaks[0].reason
    r = trace_function(C.br_side_effect, C.a2(2, 3))
    assert "side effect" in r.breaks[0].reason


def _check(fn, *args, program=None, **kwargs):
    return G.check_program(program, _slots(fn, args, kwargs), fn.__globals__, __builtins__, fn.__closure__)


def _first_fail(r, fn, *args):
    i = _check(fn, *args, program=r.program)
    return i, (r.program[i] if i >= 0 else None)


def test_guard_dtype_rank_contiguity():
    x, y = C.a2(4, 5), C.a2(4, 5, seed=1)
    r = trace_function(C.np_add, x, y)
    assert _first_fail(r, C.np_add, x, y)[0] == -1
    assert _first_fail(r, C.np_add, C.a2(7, 9), C.a2(7, 9))[0] == -1  # sizes are not guarded
    i, ins = _first_fail(r, C.np_add, x.astype(np.float64), y)
    assert ins[0] == "ndarray" and ins[2] == np.float32
    i, ins = _first_fail(r, C.np_add, x, C.a2(4, 5, 1))
    assert ins[0] == "ndarray" and ins[3] == 2
    i, ins = _first_fail(r, C.np_add, x.T, y.T)
    assert ins[0] == "ndarray" and ins[5] == 1
    i, ins = _first_fail(r, C.np_add, C.a2(1, 5), y)  # size-1 pattern
    assert ins[0] == "ndarray"


def test_guard_size_used_as_value():
    x = C.a2(4, 5)
    r = trace_function(C.np_shape_value, x)
    assert _first_fail(r, C.np_shape_value, C.a2(9, 5))[0] == -1
    i, ins = _first_fail(r, C.np_shape_value, C.a2(4, 6))
    assert ins == ("dim", ins[1], 1, 5)


def test_guard_global_change():
    x = C.a2(4, 5)
    with fastcompile.config.overriding(specialize_float=True):  # C.SCALE is a float
        r = trace_function(C.np_global, x)
    old = C.SCALE
    try:
        C.SCALE = 3.0
        i, ins = _first_fail(r, C.np_global, x)
        assert ins[0] == "eq" and ins[2] == 2.0
        assert r.program[i - 1] == ("global", ins[1], "SCALE")
    finally:
        C.SCALE = old
    assert _first_fail(r, C.np_global, x)[0] == -1


def test_guard_python_args_and_closure():
    x = C.a2(4, 5)
    r = trace_function(C.np_if_python, x, True)
    assert _first_fail(r, C.np_if_python, x, False)[1][0] == "eq"
    r = trace_function(C.np_defaults, x)
    assert _first_fail(r, C.np_defaults, x, 3)[1][0] == "eq"

    def outer(c):
        def f(x):
            return x + c

        return f

    f1, f2 = outer(1), outer(2)
    r = trace_function(f1, x)
    assert any(ins[0] == "closure" for ins in r.program)
    assert G.check_program(r.program, {0: x}, f1.__globals__, __builtins__, f1.__closure__) == -1
    assert G.check_program(r.program, {0: x}, f2.__globals__, __builtins__, f2.__closure__) >= 0
    f1, f2, f3 = outer(1.0), outer(2.0), outer(2)  # a float closure is read at each call
    r = trace_function(f1, x)
    assert G.check_program(r.program, {0: x}, f1.__globals__, __builtins__, f1.__closure__) == -1
    assert G.check_program(r.program, {0: x}, f2.__globals__, __builtins__, f2.__closure__) == -1
    assert G.check_program(r.program, {0: x}, f3.__globals__, __builtins__, f3.__closure__) >= 0


def test_guard_program_format():
    x = C.a2(4, 5)
    r = trace_function(C.np_global, x)
    loads = {"local", "global", "closure", "item", "dictattr", "type_of", "typeattr", "call0", "const"}
    checks = {"type", "id", "eq", "len", "ndarray", "tensor", "dim", "noattr", "notypeattr"}
    regs = set()
    for ins in r.program:
        assert ins[0] in loads | checks
        if ins[0] in loads:
            regs.add(ins[1])
        else:
            assert ins[1] in regs
    assert all(g.describe() for g in r.guards)


def test_slot_of_cell_argument():
    def f(x, y):
        g = lambda: y
        return x * g()

    names = localsplus_names(f.__code__)
    assert names.index("y") == 1
    x = C.a2(3)
    r = trace_function(f, x, 2.0)
    assert ("local", 1, 1) in r.program or any(i[0] == "local" and i[2] == 1 for i in r.program)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_module_guards():
    x = torch.randn(3, 8)
    r = trace_function(C.th_mlp, x)
    kinds = [i[0] for i in r.program]
    assert "tensor" in kinds and "dictattr" in kinds
    C.MLP_M.train()
    try:
        assert _first_fail(r, C.th_mlp, x)[1][0] == "eq"
    finally:
        C.MLP_M.eval()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_requires_grad_traces_for_autograd():
    """A tensor that requires grad switches the trace to autograd mode: torch ops as an FX graph,
    compiled through aot_autograd, so the result carries a grad_fn and gradients match eager."""
    x = torch.randn(3, 4, requires_grad=True)
    r = trace_function(C.th_add, x, x)
    assert not r.breaks and len(r.graphs) == 1
    assert isinstance(r.graphs[0].graph, torch.fx.Graph)
    kinds = [i[0] for i in r.program]
    assert "call0" in kinds  # grad mode is guarded
    got = r.target(*slot_values(C.th_add, (x, x), {}, r.slots))
    assert got.grad_fn is not None
    got.sum().backward()
    g = x.grad.clone()
    x.grad = None
    C.th_add(x, x).sum().backward()
    torch.testing.assert_close(g, x.grad)
    assert _first_fail(r, C.th_add, x, x)[0] == -1
    with torch.no_grad():  # the guard fails without grad
        assert _first_fail(r, C.th_add, x, x)[1][0] == "eq"


def test_global_of_a_function_from_another_module_is_guarded(tmp_path, monkeypatch):
    """A global read by a function inlined from another module is guarded through that
    module's globals dict: changing it makes the guard program fail."""
    (tmp_path / "fc_helpermod.py").write_text(
        "import numpy as np\nSCALE = 2\ndef helper(x):\n    return x * SCALE + np.sin(x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    mod = importlib.import_module("fc_helpermod")

    def f(x):
        return mod.helper(x) + 1

    x = np.ones(3, np.float32)
    r = trace_function(f, x)
    values = slot_values(f, (x,), {}, r.slots)
    assert_close_np(r.target(*values), f(x), np.float32, "transcendental")
    by_slot = dict(zip(r.slots, values))
    assert G.check_program(r.program, by_slot, f.__globals__, __builtins__, f.__closure__) == -1
    mod.SCALE = 3
    failed = G.check_program(r.program, by_slot, f.__globals__, __builtins__, f.__closure__)
    assert failed >= 0 and r.program[failed][0] == "eq" and r.program[failed][2] == 2


def test_grad_mode_is_guarded_for_tensors_that_require_grad():
    """A requires_grad tensor traced under no_grad is data only while grad stays off."""
    torch = pytest.importorskip("torch")

    def f(w):
        return w * 2 + 1

    w = torch.ones(3, requires_grad=True)
    r = trace_function(f, w, fullgraph=True)  # grad on: autograd mode, an FX graph
    assert isinstance(r.graphs[0].graph, torch.fx.Graph)
    with torch.no_grad():
        r = trace_function(f, w)
        assert r.target is not None
        by_slot = dict(zip(r.slots, slot_values(f, (w,), {}, r.slots)))
        assert G.check_program(r.program, by_slot, f.__globals__, __builtins__, None) == -1
    failed = G.check_program(r.program, by_slot, f.__globals__, __builtins__, None)
    assert failed >= 0 and r.program[failed - 1][0] == "call0"


def test_compiled_source_reader_matches_evaluate():
    """sources.compile_reader: the per-call input reader reads what evaluate reads, MISSING
    included (a missing key, attribute, slot, global; a function's unset defaults), and a step
    shared by several sources (a module's _modules dict) once per call."""
    from fastcompile.trace import sources as S

    class Slotted:
        __slots__ = ("a", "b")

    class Counting(dict):
        reads = 0

        def __getitem__(self, k):
            Counting.reads += 1
            return dict.__getitem__(self, k)

    class Obj:
        kind = "class attr"

    def fn(x, y=2):
        return x + y

    sl = Slotted()
    sl.a = 5
    mods = Counting(first=np.arange(3), second=[10, 20])
    o = Obj()
    o.mods, o.fn, o.sl = mods, fn, sl
    root = S.LocalSource("self", 0)
    mods_src = S.ItemSource(S.DictAttrSource(root, "mods"), "first")
    srcs = [
        mods_src,
        S.ItemSource(S.ItemSource(S.DictAttrSource(root, "mods"), "second"), 1),
        S.ItemSource(S.DictAttrSource(root, "mods"), "absent"),  # MISSING key
        S.ItemSource(S.ItemSource(S.DictAttrSource(root, "mods"), "second"), 7),  # index
        S.DictAttrSource(root, "nothing"),  # MISSING attribute
        S.DictAttrSource(S.DictAttrSource(root, "nothing"), "deeper"),  # below a MISSING
        S.TypeAttrSource(S.TypeOfSource(root), "kind"),
        S.TypeOfSource(root),
        S.SlotAttrSource(S.DictAttrSource(root, "sl"), "a"),
        S.SlotAttrSource(S.DictAttrSource(root, "sl"), "b"),  # unset slot
        S.FuncAttrSource(S.DictAttrSource(root, "fn"), "__defaults__"),
        S.FuncAttrSource(S.DictAttrSource(root, "fn"), "__kwdefaults__"),
        S.GlobalSource("g"),
        S.GlobalSource("len"),
        S.GlobalSource("no_such_name"),
        S.LocalSource("other", 1),
        S.LocalSource("unbound", 9),
        S.ClosureSource("c", 0),
        mods_src,  # twice: read once
    ]
    cell = types.CellType(3.5)
    args = ({0: o, 1: "local"}, {"g": 42}, __builtins__, (cell,))
    want = [S.evaluate(s, *args) for s in srcs]
    read = S.compile_reader(srcs)
    Counting.reads = 0
    got = read(*args)
    assert len(got) == len(want)
    for i, (g_, w) in enumerate(zip(got, want)):
        assert g_ is w, (i, srcs[i], g_, w)
    assert got[2] is S.MISSING and got[4] is S.MISSING and got[5] is S.MISSING
    assert got[9] is S.MISSING and got[14] is S.MISSING and got[16] is S.MISSING
    assert got[6] == "class attr" and got[10] == (2,) and got[11] is None and got[17] == 3.5
    # the four item reads of mods: first, second (twice over, shared), absent; once each
    assert Counting.reads == 3, Counting.reads
    # read again after a change: a reader holds no values, only paths
    mods["first"] = "new"
    cell.cell_contents = -1.0
    got2 = read(*args)
    assert got2[0] == "new" and got2[-1] == "new" and got2[17] == -1.0


def test_source_hash_is_computed_once():
    from fastcompile.trace import sources as S

    a = S.ItemSource(S.DictAttrSource(S.LocalSource("self", 0), "m"), "w")
    b = S.ItemSource(S.DictAttrSource(S.LocalSource("other_name", 0), "m"), "w")
    assert a == b and hash(a) == hash(b)  # equal paths: equal hashes, as before
    assert hash(a) == hash(a) and a._hash == hash(a)
    assert a != S.ItemSource(S.DictAttrSource(S.LocalSource("self", 1), "m"), "w")
    assert len({a, b, S.ItemSource(a.base, "v")}) == 2
