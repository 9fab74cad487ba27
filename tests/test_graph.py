"""The graph API contract: Graph, Value, Compiled, ops(), constants, dtype
promotion, errors, graph copies and reference counts.

Most tests only build graphs (no kernels); the few that run use tiny pointwise
graphs, so this file compiles about fifteen small kernels.
"""

import gc
import os
import re
import sys
import time
import warnings
import weakref

import numpy as np
import pytest

import fastcompile
from fastcompile import graph as fcg
from conftest import NP_DTYPES, run_threads, traced_growth
from fastcompile.graph import Compiled, Graph, Value

OPS_DEF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csrc", "core", "ops.def")

ALL_DTYPES = NP_DTYPES[:9] + ["float16", "bfloat16", "float32", "float64"]


def one_op(op, *dtypes, ndim=1, **attrs):
    g = Graph()
    xs = [g.input(dt, ndim) for dt in dtypes]
    return g.call(op, *xs, **attrs)


def compile1(fn, *specs):
    g = Graph()
    ins = [g.input(dt, nd) for dt, nd in specs]
    outs = fn(g, *ins)
    g.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return g.compile()


# ---------------------------------------------------------------------------
# Graph / Value / Compiled basics
# ---------------------------------------------------------------------------


def test_public_names():
    assert fcg.Graph is Graph and fcg.Value is Value and fcg.Compiled is Compiled
    assert callable(fcg.ops)
    assert set(fcg.__all__) == {"Graph", "Value", "Compiled", "ops"}
    assert fastcompile.graph is fcg


def test_graph_takes_no_arguments():
    with pytest.raises(TypeError):
        Graph(1)
    with pytest.raises(TypeError):
        Graph(x=1)


def test_value_and_compiled_are_not_constructible():
    with pytest.raises(TypeError):
        Value()
    with pytest.raises(TypeError):
        Compiled()


@pytest.mark.parametrize("spec", ["float32", np.float32, np.dtype("float32"), "f4"])
def test_input_dtype_spellings(spec):
    g = Graph()
    assert g.input(spec, 2).dtype == "float32"


def test_input_value_attributes():
    g = Graph()
    x = g.input("float64", 3)
    y = g.input("int8", 0)
    b = g.input("bfloat16", 1)
    assert isinstance(x, Value)
    assert (x.dtype, x.ndim, x.node) == ("float64", 3, 0)
    assert (y.dtype, y.ndim, y.node) == ("int8", 0, 1)
    assert b.dtype == "bfloat16"
    assert repr(x) == "<fastcompile.graph.Value %0 = input: float64, ndim=3>"
    s = g.call("sum", g.call("exp", x), axis=1)
    assert (s.dtype, s.ndim) == ("float64", 2)
    assert s.node > x.node
    assert re.fullmatch(r"<fastcompile\.graph\.Value %\d+ = sum: float64, ndim=2>", repr(s))
    k = g.call("sum", x, axis=(0, 2), keepdim=True)
    assert k.ndim == 3
    assert g.call("amax", x).ndim == 0
    assert g.call("add", x, y).ndim == 3  # broadcasting: the larger rank


def test_extern_values_are_untyped_until_run():
    g = Graph()
    x = g.input("float64", 1)
    e = g.extern(np.atleast_2d, x)
    assert e.dtype is None and e.ndim is None
    assert repr(e).endswith("= extern: ?>")
    s = g.call("exp", e)
    assert s.dtype is None and s.ndim is None
    q, r = g.extern(np.divmod, x, x, nout=2)
    assert isinstance(q, Value) and isinstance(r, Value)
    assert (q.dtype, r.ndim) == (None, None)
    assert r.node == q.node + 1


@pytest.mark.parametrize("ndim", [0, 1, 16])
def test_input_ndim_range(ndim):
    assert Graph().input("float32", ndim).ndim == ndim


@pytest.mark.parametrize("ndim", [-1, 17])
def test_input_ndim_out_of_range(ndim):
    with pytest.raises(ValueError, match="ndim"):
        Graph().input("float32", ndim)


def test_input_bad_dtype_and_device():
    with pytest.raises(TypeError, match="unsupported dtype"):
        Graph().input("complex64", 1)
    with pytest.raises(TypeError, match="unsupported dtype"):
        Graph().input(object, 1)
    with pytest.raises(ValueError, match="device"):
        Graph().input("float32", 1, device="cuda")


def test_weak_input_is_typed_as_a_python_float():
    """input(..., weak=True): a Python float passed at each call. NEP 50: float32 * it is float32,
    int32 * it is float64, as NumPy with a Python float; a strong float64 input promotes."""
    for arr_dt, weak, want in [
        ("float32", True, "float32"),
        ("float32", False, "float64"),
        ("int32", True, "float64"),
        ("float16", True, "float16"),
    ]:
        g = Graph()
        x, s = g.input(arr_dt, 1), g.input("float64", 0, weak=weak)
        y = g.call("mul", x, s)
        assert y.dtype == want, (arr_dt, weak)
        g.output(y)
        c = g.compile()
        a = np.arange(-3, 4).astype(arr_dt)
        for v in (0.1, -2.5, 1e30):
            with np.errstate(over="ignore"):
                ref = a * v if weak else a * np.float64(v)
                if arr_dt == "float16":  # the core keeps a weak float in float32 (torch's rule)
                    ref = (a.astype(np.float32) * np.float32(v)).astype(np.float16)
                (got,) = c(a, v)
            assert got.dtype == ref.dtype
            np.testing.assert_array_equal(got, ref)


def test_weak_input_must_be_a_0d_float64():
    for dt, nd in [("float32", 0), ("float64", 1), ("int64", 0), ("bool", 0)]:
        with pytest.raises(ValueError, match="a weak input is a Python float"):
            Graph().input(dt, nd, weak=True)


def test_a_0d_input_takes_a_scalar_of_its_dtype():
    """A 0-d input takes a NumPy scalar of its dtype, or a Python float (float64), int (int64)
    or bool; any other dtype is refused, as an array of it is."""
    for dt, good, bad in [
        ("float64", [2.5, np.float64(2.5)], [np.float32(2.5), 2, True]),
        ("float32", [np.float32(2.5)], [2.5, np.float64(2.5)]),
        ("int64", [3, np.int64(3)], [3.0, np.int32(3)]),
        ("bool", [True, np.bool_(True)], [1]),
    ]:
        g = Graph()
        x, s = g.input("float64", 1), g.input(dt, 0)
        g.output(g.call("add", x, s))
        c = g.compile()
        a = np.ones(3)
        for v in good:
            np.testing.assert_array_equal(c(a, v)[0], a + np.asarray(v, dtype=dt))
        for v in bad:
            with pytest.raises(TypeError, match="argument 1 was declared %s but is a scalar of" % dt):
                c(a, v)
    g = Graph()
    x = g.input("float64", 1)
    g.output(g.call("neg", x))
    with pytest.raises(TypeError, match="must be a numpy.ndarray"):
        g.compile()(2.5)  # not 0-d: a scalar is refused


def test_weak_flag_of_an_input_is_part_of_the_kernel_key():
    """Flipping an input's weak flag is a cache miss where it changes the kernel (float32 * a
    weak float is float32, * a strong float64 is float64)."""
    keys = []
    for weak in (True, False):
        g = Graph()
        x, s = g.input("float32", 1), g.input("float64", 0, weak=weak)
        g.output(g.call("add", g.call("mul", x, s), 1.0))
        c = g.compile()
        c(np.ones(4, np.float32), 0.5)
        keys.append({k.key for k in c.kernels})
    assert keys[0] and keys[1] and not keys[0] & keys[1]


def test_compiled_basics():
    c = compile1(lambda g, x, y: g.call("add", x, y), ("float64", 1), ("float64", 1))
    assert isinstance(c, Compiled)
    assert c.nplans == 0 and c.kernels == [] and c.fused == []
    assert c.origin.startswith(__file__) or "test_graph.py:" in c.origin
    assert "add(" in c.graph and c.graph.rstrip().endswith("return (%2)")
    out = c(np.arange(3.0), np.ones(3))
    assert isinstance(out, tuple) and len(out) == 1
    np.testing.assert_array_equal(out[0], [1.0, 2.0, 3.0])
    assert c.nplans == 1
    assert c.compile_ms > 0
    (k,) = c.kernels
    assert k.name.startswith("fc_") and k.name in k.source
    assert k.fused == c.fused[0]
    # kernels is a copy: mutating it changes nothing
    c.kernels.clear()
    assert len(c.kernels) == 1


def test_output_may_be_an_input_or_a_constant():
    g = Graph()
    x = g.input("int32", 1)
    g.output(x, g.constant(7), 2.5)
    c = g.compile()
    a = np.arange(4, dtype=np.int32)
    xi, seven, half = c(a)
    np.testing.assert_array_equal(xi, a)
    assert seven.shape == () and seven == 7 and seven.dtype == np.int64
    assert half.shape == () and half == 2.5 and half.dtype == np.float64


def test_output_replaces_previous_outputs():
    g = Graph()
    x = g.input("float64", 1)
    g.output(g.call("neg", x))
    g.output(g.call("abs", x), x)
    c = g.compile()
    out = c(np.array([-1.0, 2.0]))
    assert len(out) == 2
    np.testing.assert_array_equal(out[0], [1.0, 2.0])


# ---------------------------------------------------------------------------
# ops(): the op table
# ---------------------------------------------------------------------------

KINDS = {
    "FC_KIND_PW": "pointwise",
    "FC_KIND_RED": "reduction",
    "FC_KIND_COMPOSITE": "composite",
    "FC_KIND_SPECIAL": "special",
}


def parse_ops_def():
    if not os.path.exists(OPS_DEF):
        pytest.skip("ops.def not found (tests run from an installed package)")
    text = open(OPS_DEF).read()
    rows = re.findall(
        r'^FC_OP\((\w+), "(\w+)", (-?\d+), (\w+), (\w+), (\w+), "((?:[^"\\]|\\.)*)", '
        r'"((?:[^"\\]|\\.)*)"\)',
        text,
        re.M,
    )
    assert len(rows) == text.count("\nFC_OP(")
    return {r[1]: {"arity": int(r[2]), "kind": KINDS[r[3]], "meaning": r[7]} for r in rows}


def test_ops_lists_every_callable_op_in_ops_def():
    table = parse_ops_def()
    callable_ops = {k: v for k, v in table.items() if v["kind"] != "special" or k == "cast"}
    listed = fcg.ops()
    assert set(listed) == set(callable_ops)
    for name, rec in callable_ops.items():
        assert listed[name] == rec, name
    # the graph-plumbing ops are not offered
    for name in ("input", "constant", "extern", "item", "rcount"):
        assert name not in listed


def test_ops_records():
    listed = fcg.ops()
    assert len(listed) > 60
    for name, rec in listed.items():
        assert set(rec) == {"arity", "kind", "meaning"}
        assert rec["kind"] in ("pointwise", "reduction", "composite", "special")
        assert isinstance(rec["meaning"], str) and rec["meaning"]
        assert rec["arity"] in (1, 2, 3)
    assert listed["add"]["arity"] == 2 and listed["add"]["kind"] == "pointwise"
    assert listed["where"]["arity"] == 3
    assert listed["sum"]["kind"] == "reduction"
    assert listed["softmax"]["kind"] == "composite"
    # a fresh dict each time
    listed["add"]["arity"] = 99
    assert fcg.ops()["add"]["arity"] == 2


def _operand_dtype(op):
    if op.startswith("bitwise") or op.startswith("logical"):
        return "int32"
    return "float64"


def test_every_listed_op_is_callable_with_its_arity():
    for name, rec in fcg.ops().items():
        g = Graph()
        dt = _operand_dtype(name)
        xs = [g.input(dt, 2) for _ in range(rec["arity"])]
        if name == "where":
            xs[0] = g.input("bool", 2)
        attrs = {"dtype": "float32"} if name == "cast" else {}
        v = g.call(name, *xs, **attrs)
        assert isinstance(v, Value)
        assert v.dtype in ALL_DTYPES, (name, v.dtype)
        assert v.ndim == (0 if rec["kind"] == "reduction" else 2) or rec["kind"] == "composite", name
        with pytest.raises(TypeError, match="takes %d argument" % rec["arity"]):
            g.call(name, *(xs + [xs[0]]))


def test_composites_are_decomposed():
    g = Graph()
    x = g.input("float32", 2)
    g.output(g.call("softmax", x), g.call("var", x, axis=0, correction=1), g.call("logsumexp", x, axis=1))
    text = g.dump()
    for name in ("softmax", "var(", "logsumexp"):
        assert name not in text
    assert "amax(" in text and "exp(" in text and "sum(" in text


# ---------------------------------------------------------------------------
# constants: Python scalars are weak, NumPy scalars are strong (NEP 50)
# ---------------------------------------------------------------------------

CONSTANT_CASES = [
    ("float32", 1.5, "float32"),
    ("float32", 2, "float32"),
    ("float16", 1e3, "float16"),
    ("int8", 1, "int8"),
    ("int8", 1.5, "float64"),
    ("uint16", 7, "uint16"),
    ("bool", 1, "int64"),
    ("bool", 1.5, "float64"),
    ("int32", True, "int32"),
    ("float32", np.float32(1.5), "float32"),
    ("int8", np.int64(1), "int64"),
    ("float16", np.float32(2.0), "float32"),
    ("int16", np.uint16(3), "int32"),
    ("float32", np.float64(1.5), "float64"),  # np.float64 is also a Python float: still strong
    ("float32", np.bool_(True), "float32"),
]


def _numpy_result(dtype, value):
    return (np.ones(2, dtype) + value).dtype.name


@pytest.mark.parametrize("dtype,value,want", CONSTANT_CASES)
def test_constant_promotion_in_graph(dtype, value, want):
    assert _numpy_result(dtype, value) == want  # the expectation is NumPy's
    g = Graph()
    x = g.input(dtype, 1)
    assert g.call("add", x, value).dtype == want
    assert g.call("add", value, x).dtype == want
    assert g.call("add", x, g.constant(value)).dtype == want


RUN_CASES = [
    ("float32", 1.5, "float32"),
    ("int8", 1, "int8"),
    ("int8", 1.5, "float64"),
    ("int8", np.int64(1), "int64"),
    ("float16", np.float32(2.0), "float32"),
    ("float32", np.float64(1.5), "float64"),
    ("int16", np.uint16(3), "int32"),
]


@pytest.mark.parametrize("dtype,value,want", RUN_CASES)
def test_constant_promotion_at_run_time(dtype, value, want):
    g = Graph()
    x = g.input(dtype, 1)
    v = g.call("add", x, value)
    g.output(v)
    (out,) = g.compile()(np.arange(3).astype(dtype))
    expect = np.arange(3).astype(dtype) + value
    assert out.dtype == expect.dtype == np.dtype(want)
    assert out.dtype.name == v.dtype  # the graph said so too
    np.testing.assert_array_equal(out, expect)


OUT_OF_RANGE = [("int8", 300), ("uint8", -1), ("int16", 2**20)]


@pytest.mark.parametrize("dtype,value", OUT_OF_RANGE)
def test_numpy_rejects_out_of_range_python_int(dtype, value):
    with pytest.raises(OverflowError):
        np.ones(2, dtype) + value


@pytest.mark.parametrize("dtype,value", OUT_OF_RANGE)
def test_out_of_range_python_int_raises(dtype, value):
    # known dtype: while building
    g = Graph()
    x = g.input(dtype, 1)
    with pytest.raises(OverflowError):
        g.call("add", x, value)
    # dtype known only at run time (an extern's result): when called
    g = Graph()
    x = g.input("float64", 1)
    g.output(g.call("add", g.extern(lambda a: a.astype(dtype), x), value))
    c = g.compile()
    with pytest.raises(OverflowError):
        c(np.ones(2))


def test_in_range_python_int_wraps_like_numpy():
    c = compile1(lambda g, x: (g.call("add", x, 127), g.call("mul", x, -128)), ("int8", 1))
    x = np.array([1, 2, -1], np.int8)
    a, b = c(x)
    np.testing.assert_array_equal(a, x + 127)
    np.testing.assert_array_equal(b, x * -128)
    assert a.dtype == b.dtype == np.int8


def test_constant_values():
    g = Graph()
    assert (g.constant(True).dtype, g.constant(1).dtype, g.constant(1.5).dtype) == ("bool", "int64", "float64")
    assert g.constant(np.float32(1)).dtype == "float32"
    assert g.constant(np.uint8(1)).dtype == "uint8"
    assert g.constant(1.5).ndim == 0
    assert repr(g.constant(2.5)).endswith("= constant: float64, ndim=0>")
    with pytest.raises(OverflowError):
        g.constant(2**70)
    for bad in ([1], None, "1", 1j, np.ones(2)):
        with pytest.raises(TypeError):
            g.constant(bad)


def test_constant_exact_values_at_run_time():
    # int64 extremes and a float with all 53 bits survive into the kernel
    def fn(g, x):
        return (
            g.call("add", x, -(2**63)),
            g.call("sub", x, 2**63 - 1),
            g.call("add", g.call("cast", x, dtype="float64"), 0.1 + 2**-50),
        )

    c = compile1(fn, ("int64", 1))
    x = np.array([0, 1], np.int64)
    a, b, f = c(x)
    np.testing.assert_array_equal(a, x + np.int64(-(2**63)))
    np.testing.assert_array_equal(b, x - np.int64(2**63 - 1))
    np.testing.assert_array_equal(f, x.astype(np.float64) + (0.1 + 2**-50))


# ---------------------------------------------------------------------------
# dtype promotion between inputs: NumPy's ufunc result dtypes
# ---------------------------------------------------------------------------

BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "floordiv": np.floor_divide,
    "remainder": np.remainder,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "fmax": np.fmax,
    "fmin": np.fmin,
    "eq": np.equal,
    "lt": np.less,
    "ge": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "atan2": np.arctan2,
    "hypot": np.hypot,
    "copysign": np.copysign,
}
UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "tanh": np.tanh,
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
    "sign": np.sign,
    "square": np.square,
    "reciprocal": np.reciprocal,
    "isnan": np.isnan,
    "isfinite": np.isfinite,
    "logical_not": np.logical_not,
    "bitwise_not": np.bitwise_not,
}
REDUCTIONS = {
    "sum": np.sum,
    "prod": np.prod,
    "amax": np.max,
    "amin": np.min,
    "argmax": np.argmax,
    "argmin": np.argmin,
    "any": np.any,
    "all": np.all,
    "mean": np.mean,
    "var": np.var,
    "std": np.std,
}


def numpy_dtype(f, *dtypes, **kw):
    """NumPy's result dtype name, or 'TypeError' where NumPy has no loop."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return f(*[np.ones((2, 2), d) for d in dtypes], **kw).dtype.name
    except TypeError:
        return "TypeError"


def fc_dtype(op, *dtypes, **kw):
    try:
        return one_op(op, *dtypes, ndim=2, **kw).dtype
    except TypeError:
        return "TypeError"


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_result_dtype_matches_numpy(op):
    # float-rule ops of two integers take NumPy's loop: int8 with uint8 is float16
    bad = [(a, b, fc_dtype(op, a, b), numpy_dtype(BINARY[op], a, b)) for a in NP_DTYPES for b in NP_DTYPES]
    bad = [row for row in bad if row[2] != row[3]]
    assert not bad, "(a, b, fastcompile, numpy): %s" % bad[:10]


def test_add_dtype_matches_result_type():
    for a in NP_DTYPES:
        for b in NP_DTYPES:
            assert fc_dtype("add", a, b) == np.result_type(a, b).name, (a, b)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_result_dtype_matches_numpy(op):
    bad = [(a, fc_dtype(op, a), numpy_dtype(UNARY[op], a)) for a in NP_DTYPES]
    bad = [row for row in bad if row[1] != row[2]]
    assert not bad, "(dtype, fastcompile, numpy): %s" % bad


@pytest.mark.parametrize("op", sorted(REDUCTIONS))
def test_reduction_result_dtype_matches_numpy(op):
    bad = [(a, fc_dtype(op, a, axis=0), numpy_dtype(REDUCTIONS[op], a, axis=0)) for a in NP_DTYPES]
    bad = [row for row in bad if row[1] != row[2]]
    assert not bad, "(dtype, fastcompile, numpy): %s" % bad


def test_where_and_clamp_dtypes_match_numpy():
    for a in NP_DTYPES:
        for b in NP_DTYPES:
            g = Graph()
            c, x, y = g.input("bool", 1), g.input(a, 1), g.input(b, 1)
            assert g.call("where", c, x, y).dtype == np.where(True, np.ones(1, a), np.ones(1, b)).dtype.name
            assert g.call("clamp", x, y, y).dtype == numpy_dtype(np.clip, a, b, b)


@pytest.mark.parametrize(
    "a,b", [("int8", "uint8"), ("float16", "int16"), ("bool", "float32"), ("uint32", "int32"), ("uint64", "int64")]
)
def test_promotion_at_run_time(a, b):
    c = compile1(lambda g, x, y: g.call("mul", x, y), (a, 1), (b, 1))
    x, y = np.arange(1, 4).astype(a), np.arange(2, 5).astype(b)
    (out,) = c(x, y)
    want = x * y
    assert out.dtype == want.dtype
    np.testing.assert_array_equal(out, want)


def _bf16_round(x32):
    """float32 -> the nearest bfloat16 (ties to even) as float32; NaN stays NaN."""
    u = np.ascontiguousarray(x32, np.float32).view(np.uint32).astype(np.uint64)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x32), np.float32("nan"), r)


def _f64_to_f32_odd(x):
    """float64 -> float32 rounded to odd (truncated, the last bit set where inexact): rounding
    that to a shorter type rounds x once."""
    t = x.astype(np.float32)
    with np.errstate(invalid="ignore"):
        over = np.isfinite(x) & (np.abs(t.astype(np.float64)) > np.abs(x))
    t = np.where(over, np.nextafter(t, np.float32(0)), t)
    inexact = np.isfinite(x) & (t.astype(np.float64) != x)
    return np.where(inexact, (t.view(np.uint32) | 1).view(np.float32), t)


@pytest.mark.parametrize(
    "src,half", [(s, h) for s in ("float32", "float64", "int32", "float16") for h in ("float16", "bfloat16") if s != h]
)
def test_cast_to_a_half_type_rounds_inside_a_kernel(src, half):
    """A cast to float16/bfloat16 whose value the same kernel reads again (cast back to float32)
    is the value rounded to the half type, once, as NumPy's astype and torch's .to give. It was
    the value unrounded: half-type values are float32 inside kernels, and only a store rounded."""
    g = Graph()
    x = g.input(src, 1)
    h = g.call("cast", x, dtype=half)
    g.output(g.call("cast", h, dtype="float32"), g.call("mul", g.call("cast", h, dtype="float32"), 2.0))
    c = g.compile()
    rng = np.random.default_rng(3)
    if src == "int32":
        x = np.concatenate(
            [
                rng.integers(-70000, 70000, 3000),
                [2049, 2051, 4097, -4099, 65504, 65519, 65520, 2**24 + 2**16 + 1, -(2**30) - 2**22],
            ]
        )
    else:
        x = np.concatenate(
            [
                rng.standard_normal(3000) * 10.0 ** rng.integers(-9, 6, 3000),
                [
                    1 + 2.0**-11,
                    1 + 3 * 2.0**-11,
                    1 + 2.0**-8,
                    1 + 3 * 2.0**-8,
                    65519.9,
                    65520.0,
                    6e-8,
                    3e-8,
                    1e-40,
                    -0.0,
                    np.inf,
                    -np.inf,
                    np.nan,
                    3.3e38,
                ],
            ]
        )
    with np.errstate(over="ignore", invalid="ignore"):
        x = x.astype(src)
        if half == "float16":
            want = x.astype(np.float16).astype(np.float32)
        elif src == "float64":
            want = _bf16_round(_f64_to_f32_odd(x))
        else:
            want = _bf16_round(x.astype(np.float32))  # integers through float32, as torch does
    got, twice = c(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(twice, want * 2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow_half_is_sqrt_for_a_constant_exponent_only(dtype):
    """x ** 0.5 with a constant exponent is sqrt(x), as NumPy's and torch's scalar-exponent path
    gives (sqrt(-0) = -0, sqrt(-inf) = nan); with an array exponent it is C's pow (+0, +inf).
    Every element gives the same, in the vector body and in the scalar tail: GCC turned the
    constant-exponent pow into sqrt in vectorized loops only."""
    for n in (18, 37, 100003):
        x = np.resize(np.array([-np.inf, -0.0, 0.0, 4.0, -2.0, np.nan, np.inf, 0.25], dtype), n)
        g = Graph()
        xi = g.input(dtype, 1)
        yi = g.input(dtype, 1)
        g.output(g.call("pow", xi, 0.5), g.call("pow", xi, yi))
        half, arr = g.compile()(x, np.full_like(x, 0.5))
        with np.errstate(invalid="ignore"):
            want_half, want_arr = np.power(x, 0.5), np.power(x, np.full_like(x, 0.5))
        for got, want in ((half, want_half), (arr, want_arr)):
            np.testing.assert_array_equal(got, want)
            assert np.array_equal(np.signbit(got), np.signbit(want)), n


@pytest.mark.parametrize("op", ["logical_and", "logical_or", "logical_xor"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "float16"])
def test_logical_ops_take_each_operands_own_truth(op, dtype):
    """logical_and/or/xor test each operand's own truth, as NumPy's bool loops do: a constant the
    array's type cannot hold (int8 and 256) was wrapped into it first (256 -> 0, false)."""
    x = np.array([-128, 0, 1, 3, 127, 2], dtype) if dtype != "uint8" else np.array([0, 1, 5, 255, 128, 2], dtype)
    for k in (256, 2**31, 65536, 0.5, -1, 0):
        g = Graph()
        xi = g.input(dtype, 1)
        g.output(g.call(op, xi, k), g.call(op, k, xi))
        got, got_r = g.compile()(x)
        want = getattr(np, op)(x, k)
        np.testing.assert_array_equal(got, want, err_msg="%s(%s, %r)" % (op, dtype, k))
        np.testing.assert_array_equal(got_r, want, err_msg="%s(%r, %s)" % (op, k, dtype))


def test_bfloat16_promotion_in_graph():
    assert fc_dtype("add", "bfloat16", "float16") == "float32"
    assert fc_dtype("add", "bfloat16", "int8") == "bfloat16"
    assert fc_dtype("add", "bfloat16", "float32") == "float32"
    assert fc_dtype("exp", "bfloat16") == "bfloat16"


# ---------------------------------------------------------------------------
# errors while building
# ---------------------------------------------------------------------------


def test_unknown_op():
    g = Graph()
    x = g.input("float32", 1)
    with pytest.raises(ValueError, match=r"unknown op 'nope'.* add .*softmax"):
        g.call("nope", x)


@pytest.mark.parametrize("op", ["input", "constant", "extern", "item", "rcount"])
def test_plumbing_ops_not_callable(op):
    g = Graph()
    x = g.input("float32", 1)
    with pytest.raises(ValueError, match="not callable through call"):
        g.call(op, x)


def test_call_op_name_must_be_a_str():
    g = Graph()
    x = g.input("float32", 1)
    with pytest.raises(TypeError, match="op_name"):
        g.call()
    with pytest.raises(TypeError, match="op_name"):
        g.call(x)


@pytest.mark.parametrize("op,n", [("add", 1), ("add", 3), ("exp", 2), ("where", 2), ("sum", 0), ("clamp", 4)])
def test_wrong_arity(op, n):
    g = Graph()
    xs = [g.input("float32", 1) for _ in range(n)]
    with pytest.raises(TypeError, match="op '%s' takes" % op):
        g.call(op, *xs)


def test_value_from_another_graph():
    g1, g2 = Graph(), Graph()
    x, y = g1.input("float32", 1), g2.input("float32", 1)
    with pytest.raises(ValueError, match="another Graph"):
        g1.call("add", x, y)
    with pytest.raises(ValueError, match="another Graph"):
        g1.output(y)
    with pytest.raises(ValueError, match="another Graph"):
        g1.extern(np.negative, y)


def test_numpy_array_passed_to_call():
    g = Graph()
    x = g.input("float32", 1)
    with pytest.raises(TypeError, match="NumPy array"):
        g.call("add", x, np.ones(3, np.float32))
    with pytest.raises(TypeError, match="NumPy array"):
        g.extern(np.negative, np.ones(3))
    with pytest.raises(TypeError, match="NumPy array"):
        g.output(np.ones(3))
    for bad in ("a", None, [1.0], 1j):
        with pytest.raises(TypeError, match="constant"):
            g.call("add", x, bad)


def test_no_outputs_at_compile():
    g = Graph()
    g.input("float32", 1)
    with pytest.raises(ValueError, match="no outputs"):
        g.compile()
    g.output()
    with pytest.raises(ValueError, match="no outputs"):
        g.compile()


@pytest.mark.parametrize("axis", [2, -3, (0, 2), (1, -3)])
def test_bad_axis_axis_error(axis):
    g = Graph()
    x = g.input("float32", 2)
    for op in ("sum", "amax", "mean", "var", "logsumexp"):
        with pytest.raises(np.exceptions.AxisError):
            g.call(op, x, axis=axis)
    if isinstance(axis, int):
        with pytest.raises(np.exceptions.AxisError):
            g.call("softmax", x, axis=axis)


def test_bad_axis_on_untyped_value_raises_at_run_time():
    g = Graph()
    x = g.input("float64", 1)
    g.output(g.call("sum", g.extern(np.atleast_2d, x), axis=2))
    c = g.compile()
    with pytest.raises(np.exceptions.AxisError):
        c(np.ones(3))


def test_other_axis_errors():
    g = Graph()
    x = g.input("float32", 3)
    with pytest.raises(ValueError, match="duplicate"):
        g.call("sum", x, axis=(0, 0))
    with pytest.raises(ValueError, match="duplicate"):
        g.call("sum", x, axis=(1, -2))
    with pytest.raises(TypeError, match="axis"):
        g.call("sum", x, axis=1.5)
    with pytest.raises(TypeError, match="axis"):
        g.call("sum", x, axis=(0, "a"))
    with pytest.raises(TypeError, match="one int axis"):
        g.call("softmax", x, axis=(0, 1))


def test_argmax_takes_one_axis():
    g = Graph()
    x = g.input("float64", 3)
    with pytest.raises(TypeError, match="one axis"):
        g.output(g.call("argmax", x, axis=(0, 1)))
        g.compile()(np.ones((2, 2, 2)))


@pytest.mark.parametrize(
    "op,kw",
    [
        ("add", {"axis": 0}),
        ("exp", {"out": None}),
        ("sum", {"dtype": "float32"}),
        ("sum", {"foo": 1}),
        ("cast", {"dtype": "float32", "copy": False}),
        ("var", {"unbiased": True}),
        ("softmax", {"keepdim": 3j, "bar": 1}),
    ],
)
def test_unexpected_kwarg(op, kw):
    g = Graph()
    xs = [g.input("float32", 2) for _ in range(fcg.ops()[op]["arity"])]
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        g.call(op, *xs, **kw)


def test_attribute_errors():
    g = Graph()
    x = g.input("float32", 2)
    with pytest.raises(TypeError, match="cast needs dtype"):
        g.call("cast", x)
    with pytest.raises(TypeError, match="unsupported dtype"):
        g.call("cast", x, dtype="complex128")
    with pytest.raises(ValueError, match="approximate"):
        g.call("gelu", x, approximate="fast")
    assert repr(g.call("gelu", x, approximate="tanh")).split("= ")[1].startswith("gelu_tanh")
    # reductions accept torch's spellings too
    assert g.call("sum", x, dim=0, keepdims=True).ndim == 2
    assert g.call("var", x, axis=1, ddof=1).ndim == 1


def test_dtype_errors_while_building():
    g = Graph()
    f, b = g.input("float32", 1), g.input("bool", 1)
    with pytest.raises(TypeError, match="bool"):
        g.call("neg", b)
    with pytest.raises(TypeError, match="bool"):
        g.call("sub", b, b)
    with pytest.raises(TypeError, match="integer"):
        g.call("bitwise_and", f, f)


def test_extern_argument_errors():
    g = Graph()
    x = g.input("float32", 1)
    with pytest.raises(TypeError, match="callable"):
        g.extern(3, x)
    with pytest.raises(TypeError, match="nout"):
        g.extern(np.negative, x, foo=1)
    with pytest.raises(ValueError, match="nout"):
        g.extern(np.divmod, x, x, nout=0)
    assert isinstance(g.extern(np.negative, x, nout=None), Value)


# ---------------------------------------------------------------------------
# errors at call time
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def add2():
    return compile1(lambda g, x, y: g.call("add", x, y), ("float64", 1), ("float64", 1))


def test_call_non_array_argument(add2):
    for bad in ([1.0, 2.0], 3.0, None, "x"):
        with pytest.raises(TypeError, match="must be a numpy.ndarray"):
            add2(bad, np.ones(2))


def test_inputs_only_externs_read_may_be_any_object():
    # an input no kernel reads goes to its extern as it is (the torch backend hands a matmul its
    # weight tensor this way); an input a kernel reads must still be an array of its dtype
    seen = []

    def ext(w, a):
        seen.append(w)
        return a * len(w)

    c = compile1(lambda g, w, x: g.call("exp", g.extern(ext, w, g.call("neg", x))), ("float64", 1), ("float64", 1))
    w, x = [1, 2, 3], np.arange(3.0)
    before = sys.getrefcount(w)
    for _ in range(200):
        (out,) = c(w, x)
    np.testing.assert_allclose(out, np.exp(-x * 3))
    assert seen[-1] is w
    seen.clear()
    assert sys.getrefcount(w) == before
    with pytest.raises(TypeError, match="argument 1 must be a numpy.ndarray"):
        c(np.ones(3), [1.0, 2.0, 3.0])
    # an input both an extern and a kernel read is checked as before
    c2 = compile1(lambda g, x: g.call("add", g.extern(np.negative, x), x), ("float64", 1))
    with pytest.raises(TypeError, match="argument 0 must be a numpy.ndarray"):
        c2([1.0, 2.0])


def test_view_externs_are_made_in_c_where_the_layout_is_as_traced():
    # Graph.extern(view=...): the view is made from the argument's memory without calling the
    # function while the argument has the shape and strides given; otherwise the function runs
    import fastcompile

    calls = []

    def fn(a):
        calls.append(a.strides)
        return a.T[1:]

    g = Graph()
    x = g.input("float32", 2)
    v = g.extern(fn, x, pure=True, view=((3, 4), (4, 1), (3, 3), (1, 4), 1))
    g.output(g.call("mul", v, 2.0), v)
    c = g.compile()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    s0 = fastcompile.stats()
    out, view = c(a)
    np.testing.assert_array_equal(out, a.T[1:] * 2)
    assert np.shares_memory(view, a) and view.flags.writeable and not calls
    assert fastcompile.stats()["views_made"] == s0["views_made"] + 1
    f = np.asfortranarray(a)  # another layout: the function makes it
    out, view = c(f)
    np.testing.assert_array_equal(out, a.T[1:] * 2)
    assert calls == [f.strides]
    assert fastcompile.stats()["views_by_function"] == s0["views_by_function"] + 1
    before = sys.getrefcount(a)
    for _ in range(500):
        c(a)
    assert sys.getrefcount(a) == before
    # strides that only match after an int64 wrap are no match: the function runs
    g = Graph()
    big = g.extern(lambda a: a[:1], g.input("float64", 1), pure=True, view=((2,), (2**61 + 1,), (1,), (0,), 0))
    g.output(big)
    s1 = fastcompile.stats()
    (bv,) = g.compile()(np.arange(2.0))
    np.testing.assert_array_equal(bv, [0.0])
    assert fastcompile.stats()["views_by_function"] == s1["views_by_function"] + 1
    # an empty view with any offset starts at the argument's data
    g = Graph()
    e = g.extern(lambda a: a[:0], g.input("float64", 1), pure=True, view=((4,), (1,), (0,), (1,), 3))
    g.output(e)
    (ev,) = g.compile()(np.arange(4.0))
    assert ev.shape == (0,)
    # a broadcast view is read-only, as np.broadcast_to's
    g = Graph()
    b = g.extern(np.broadcast_to, g.input("float64", 1), pure=True, view=((4,), (1,), (3, 4), (0, 1), 0))
    g.output(b)
    (bv,) = g.compile()(np.arange(4.0))
    assert bv.shape == (3, 4) and not bv.flags.writeable
    np.testing.assert_array_equal(bv, np.broadcast_to(np.arange(4.0), (3, 4)))


def test_view_extern_spec_errors():
    g = Graph()
    x = g.input("float32", 2)
    with pytest.raises(ValueError, match="outside"):
        g.extern(np.transpose, x, view=((3, 4), (4, 1), (4, 3), (1, 4), 1))
    with pytest.raises(ValueError, match="outside"):
        g.extern(np.transpose, x, view=((3, 4), (4, 1), (5,), (1,), 8))
    with pytest.raises(ValueError, match="one value"):
        g.extern(np.add, x, x, view=((3, 4), (4, 1), (4, 3), (1, 4), 0))
    with pytest.raises(ValueError, match="one value"):
        g.extern(np.transpose, x, nout=1, view=((3, 4), (4, 1), (4, 3), (1, 4), 0))
    with pytest.raises(TypeError):
        g.extern(np.transpose, x, view=((3, 4), (4, 1)))
    with pytest.raises(ValueError, match="differ in length"):
        g.extern(np.transpose, x, view=((3, 4), (4,), (4, 3), (1, 4), 0))
    with pytest.raises(ValueError, match="negative"):
        g.extern(np.transpose, x, view=((3, -4), (4, 1), (4, 3), (1, 4), 0))
    with pytest.raises(ValueError, match="at most"):
        g.extern(np.transpose, x, view=((1,) * 17, (1,) * 17, (1,), (1,), 0))
    # sums and products that overflow int64 must not slip past the bounds check
    g2 = Graph()
    y = g2.input("float64", 1)
    with pytest.raises(ValueError, match="too large|outside"):
        g2.extern(np.transpose, y, view=((4,), (1,), (3,), (2**62,), 0))
    with pytest.raises(ValueError, match="too large|outside"):
        g2.extern(np.transpose, y, view=((4,), (1,), (2,), (-1,), -(2**63)))
    with pytest.raises(ValueError, match="too large"):
        g2.extern(np.transpose, y, view=((4,), (1,), (2**40, 2**40), (0, 0), 0))
    # nothing was added by the failed calls: the next extern gets the next index
    v = g.extern(np.transpose, x, view=((3, 4), (4, 1), (4, 3), (1, 4), 0))
    g.output(v)
    a = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(g.compile()(a)[0], a.T)


def test_call_wrong_dtype(add2):
    with pytest.raises(TypeError, match="declared float64 but is an array of float32"):
        add2(np.ones(2), np.ones(2, np.float32))
    with pytest.raises(TypeError):
        add2(np.ones(2, np.complex128), np.ones(2))


def test_call_wrong_rank(add2):
    with pytest.raises(ValueError, match="ndim=1 but has ndim=2"):
        add2(np.ones((2, 1)), np.ones(2))
    with pytest.raises(ValueError, match="ndim"):
        add2(np.ones(()), np.ones(2))


def test_call_wrong_number_or_kind_of_arguments(add2):
    with pytest.raises(TypeError, match="takes 2 arrays, got 1"):
        add2(np.ones(2))
    with pytest.raises(TypeError, match="takes 2 arrays, got 3"):
        add2(np.ones(2), np.ones(2), np.ones(2))
    with pytest.raises(TypeError, match="positional"):
        add2(np.ones(2), y=np.ones(2))


@pytest.mark.parametrize("shapes", [((3,), (4,)), ((0,), (2,)), ((2,), (0,))])
def test_call_broadcast_mismatch(add2, shapes):
    with pytest.raises(ValueError, match="broadcast"):
        add2(np.ones(shapes[0]), np.ones(shapes[1]))


def test_call_broadcast_mismatch_inside_graph():
    # the mismatch is between two intermediate values, not two inputs
    c = compile1(lambda g, x, y: g.call("mul", g.call("sum", x, axis=0), y), ("float64", 2), ("float64", 1))
    (out,) = c(np.ones((2, 3)), np.ones(3))
    np.testing.assert_array_equal(out, [2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="broadcast"):
        c(np.ones((3, 2)), np.ones(3))


def test_errors_leave_the_compiled_usable(add2):
    with pytest.raises(ValueError):
        add2(np.ones(3), np.ones(4))
    (out,) = add2(np.ones(3), np.full(1, 2.0))
    np.testing.assert_array_equal(out, [3.0, 3.0, 3.0])


# ---------------------------------------------------------------------------
# the graph is copied at compile
# ---------------------------------------------------------------------------


def test_graph_copied_at_compile():
    g = Graph()
    x = g.input("float64", 1)
    y = g.call("mul", x, 2.0)
    g.output(y)
    c = g.compile()
    text = c.graph
    # change the graph after compile: more nodes, other outputs
    z = g.call("add", y, 100.0)
    g.output(z, y)
    assert c.graph == text
    (out,) = c(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(out, [2.0, 4.0])
    c2 = g.compile()
    a, b = c2(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(a, [102.0, 104.0])
    np.testing.assert_array_equal(b, [2.0, 4.0])
    # and the first one still does what it did
    assert len(c(np.array([1.0]))) == 1


def test_graph_outlives_compiled_and_values_keep_graph_alive():
    g = Graph()
    x = g.input("float64", 1)
    g.output(g.call("neg", x))
    c = g.compile()
    before = sys.getrefcount(g)
    v = g.call("abs", x)
    assert sys.getrefcount(g) == before + 1
    del v
    assert sys.getrefcount(g) == before
    del g
    # x still holds the graph; the compiled graph needs neither
    assert x.dtype == "float64"
    np.testing.assert_array_equal(c(np.array([1.0]))[0], [-1.0])


# ---------------------------------------------------------------------------
# reference counts and memory
# ---------------------------------------------------------------------------


def _refcounts(*objs):
    return [sys.getrefcount(o) for o in objs]


def test_refcounts_stable_over_many_calls():
    c = compile1(
        lambda g, x, y: (g.call("add", x, y), g.call("sum", g.call("mul", x, y), axis=0)),
        ("float32", 2),
        ("float32", 1),
    )
    x, y = np.ones((4, 3), np.float32), np.arange(3, dtype=np.float32)
    a, s = c(x, y)
    assert sys.getrefcount(a) == 2 and sys.getrefcount(s) == 2  # only `a`/`s` and the call's argument
    del a, s
    before = _refcounts(x, y, c)
    for _ in range(10_000):
        c(x, y)
    assert _refcounts(x, y, c) == before


def test_refcounts_stable_with_extern_and_errors():
    def ext(a):
        return a[::-1]

    c = compile1(lambda g, x: g.call("exp", g.extern(ext, g.call("neg", x))), ("float64", 1))
    x = np.arange(3.0)
    (out,) = c(x)
    np.testing.assert_allclose(out, np.exp(-x[::-1]))
    before = _refcounts(x, c, ext)
    bad = np.ones(3, np.float32)
    bad_before = sys.getrefcount(bad)
    for _ in range(2_000):
        c(x)
        with pytest.raises(TypeError):
            c(bad)
    assert _refcounts(x, c, ext) == before
    assert sys.getrefcount(bad) == bad_before


def test_values_are_released_after_their_last_reader():
    # a value's array goes back as soon as its last reader has run (not at the end of the call):
    # the pool can hand its buffer to a later kernel of the same call
    import weakref

    refs, alive_later = [], []

    def first(a):
        refs.append(weakref.ref(a))
        return a * 2

    def second(c):
        alive_later.append(refs[-1]() is not None)
        return c + 1

    def fn(g, x):
        a = g.call("neg", x)  # segment 0's output, read only by `first`
        c = g.call("exp", g.extern(first, a))
        return g.call("add", g.extern(second, c), 1.0)

    comp = compile1(fn, ("float64", 1))
    x = np.arange(4.0)
    for _ in range(3):
        (out,) = comp(x)
    np.testing.assert_allclose(out, np.exp(-x * 2) + 2)
    assert alive_later == [False] * 3
    # an output stays whole to the end, even where an extern read it early
    keep = compile1(lambda g, x: (g.call("neg", x), g.call("exp", g.extern(first, g.call("neg", x)))), ("float64", 1))
    a, b = keep(x)
    np.testing.assert_allclose(a, -x)
    np.testing.assert_allclose(b, np.exp(-x * 2))


def test_refcounts_when_extern_returns_its_arguments():
    # an extern that hands back its input arrays (identity, a tuple of them):
    # they become graph outputs without a copy, and nothing is leaked
    def fn(g, x, y):
        same = g.extern(lambda a: a, x)
        p, q = g.extern(lambda a, b: (b, a), x, y, nout=2)
        return same, p, q, g.call("add", p, q)

    c = compile1(fn, ("float64", 1), ("float64", 1))
    x, y = np.arange(3.0), np.ones(3)
    same, p, q, s = c(x, y)
    assert same is x and p is y and q is x
    np.testing.assert_array_equal(s, x + y)
    del same, p, q, s
    before = _refcounts(x, y, c)
    for _ in range(10_000):
        c(x, y)
    assert _refcounts(x, y, c) == before


def test_refcounts_when_extern_raises():
    class Boom(Exception):
        pass

    def ext(a):
        raise Boom()

    c = compile1(lambda g, x: g.call("neg", g.extern(ext, g.call("exp", x))), ("float64", 1))
    x = np.arange(3.0)
    before = _refcounts(x, c)
    for _ in range(1_000):
        with pytest.raises(Boom):
            c(x)
    assert _refcounts(x, c) == before


def test_no_memory_growth_over_many_calls():
    c = compile1(lambda g, x: (g.call("tanh", x), g.call("amax", x, axis=-1)), ("float64", 2))
    x = np.ones((8, 8))
    for _ in range(200):
        c(x)
    grew = traced_growth(lambda: c(x), 1_000, 10_000)
    assert grew < 64 * 1024, "grew by %d bytes over 10,000 calls" % grew


def test_deleting_compiled_frees_it():
    class Fn:
        """An extern callable: weakref-able, so we see when it is released."""

        def __call__(self, a):
            return a * 2

    fn = Fn()
    alive = weakref.ref(fn)
    g = Graph()
    x = g.input("float64", 1)
    g.output(g.call("neg", g.extern(fn, x)))
    c = g.compile()
    np.testing.assert_array_equal(c(np.ones(2))[0], [-2.0, -2.0])
    assert sys.getrefcount(c) == 2  # nothing else holds it
    cid = id(c)
    assert any(o is c for o in gc.get_objects())  # tracked by the cycle collector
    del fn, g, x, c
    # the graph and the compiled graph released the extern, without gc
    assert alive() is None
    gc.collect()
    assert not any(id(o) == cid and type(o) is Compiled for o in gc.get_objects())


def test_cycle_through_compiled_is_collected():
    class Fn:
        def __call__(self, a):
            return a

    fn = Fn()
    alive = weakref.ref(fn)
    g = Graph()
    x = g.input("float64", 1)
    g.output(g.extern(fn, x))
    c = g.compile()
    del g, x
    fn.compiled = c  # extern -> compiled -> extern
    del fn, c
    gc.collect()
    assert alive() is None


def test_cycle_through_graph_is_collected():
    # Graph and Value are GC types: a cycle through them is freed
    class Fn:
        def __call__(self, a):
            return a

    fn = Fn()
    alive = weakref.ref(fn)
    g = Graph()
    x = g.input("float64", 1)
    fn.value = g.extern(fn, x)  # extern -> Value -> Graph -> extern
    del fn, g, x
    gc.collect()
    assert alive() is None


def test_small_integer_powers_of_floats_are_multiplications():
    """x ** 2 and x ** 3 with a Python-scalar exponent on a float array become
    multiplications (libm pow is ~20x slower); a NumPy-scalar exponent or an int array
    keeps pow. Values match NumPy's power within 2 ULP, specials exactly."""
    x = np.array([0.0, -0.0, 1.5, -2.5, 1e13, -1e13, 1e-30, np.inf, -np.inf, np.nan, 3.0], np.float32)
    for e in (2, 3, 2.0, 3.0):
        g = Graph()
        a = g.input("float32", 1)
        g.output(g.call("pow", a, e))
        assert "pow" not in g.dump() and "mul" in g.dump()
        got = g.compile()(x)[0]
        with np.errstate(all="ignore"):
            want = np.power(x, np.float32(e))
        assert got.dtype == np.float32
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_allclose(got, want, rtol=2.4e-7, atol=0)
    for dtype, e in (("float32", np.float64(3.0)), ("int32", 3), ("float32", 4)):
        g = Graph()
        a = g.input(dtype, 1)
        g.output(g.call("pow", a, e))
        assert "pow" in g.dump()


def test_values_are_computed_in_the_segment_that_reads_them():
    """A core value read only after an extern is computed next to its reader and fuses with it
    (one kernel, no stored intermediate), not in the first segment; one that is also a graph
    output, or read before the extern too, is still computed early and stored."""

    def ext(a):
        return a[::-1] * 2.0

    g = Graph()
    x, y = g.input("float32", 1), g.input("float32", 1)
    mask = g.call("gt", x, 0.5)  # ready at the start, read only after ext
    g.output(g.call("where", mask, g.extern(ext, y), 0.0))
    f = g.compile()
    a = np.linspace(0, 1, 7, dtype=np.float32)
    b = np.arange(7, dtype=np.float32)
    (r,) = f(a, b)
    np.testing.assert_array_equal(r, np.where(a > 0.5, b[::-1] * 2.0, 0.0).astype(np.float32))
    assert len(f.kernels) == 1 and len(f.fused) == 1
    assert "gt(" in f.fused[0] and "where(" in f.fused[0]

    g = Graph()
    x, y = g.input("float32", 1), g.input("float32", 1)
    mask = g.call("gt", x, 0.5)
    g.output(g.call("where", mask, g.extern(ext, y), 0.0), mask)  # the mask is an output too
    f = g.compile()
    r, m = f(a, b)
    np.testing.assert_array_equal(r, np.where(a > 0.5, b[::-1] * 2.0, 0.0).astype(np.float32))
    np.testing.assert_array_equal(m, a > 0.5)
    assert len(f.kernels) == 2


def test_unused_values_are_not_computed_and_pure_externs_not_called():
    """Dead code: a value no output needs is not computed, a pure extern nobody reads is not
    called, and an extern not declared pure always is (it may act)."""
    calls = []

    def act(a):
        calls.append("act")
        return a * 2

    def view(a):
        calls.append("view")
        return a[::-1]

    g = Graph()
    x = g.input("float32", 1)
    g.call("exp", x)  # dead
    g.extern(act, x)  # dead, but not pure: called
    g.call("add", g.extern(view, x, pure=True), 1.0)  # dead pure extern and its consumer
    used = g.extern(view, x, pure=True)
    g.output(g.call("mul", x, 3.0), g.call("sub", used, 1.0))
    f = g.compile()
    a = np.arange(5, dtype=np.float32)
    y, z = f(a)
    np.testing.assert_array_equal(y, a * 3)
    np.testing.assert_array_equal(z, a[::-1] - 1)
    assert sorted(calls) == ["act", "view"]
    assert "exp" not in "".join(f.fused) and all("exp" not in k.source for k in f.kernels)
    with pytest.raises(TypeError, match="nout=, pure= and view="):
        g.extern(view, x, pur=True)


def _recording_extern():
    """(calls, an extern a -> a * 2 that appends "real" to calls)."""
    called = []

    def real(a):
        called.append("real")
        return a * 2

    return called, real


def test_warm_runs_stand_in_externs_and_survives_a_list_changed_mid_call():
    """Compiled._warm (the torch backend's async compile) calls the stand-ins, not the graph's
    externs, and builds the plans; a stand-in that empties the list it came in raises a
    RuntimeError for the next extern (the list was read past its end before) and no crash."""
    called, real = _recording_extern()
    g = Graph()
    x = g.input("float64", 1)
    y = g.extern(real, g.call("add", x, 1.0))
    z = g.extern(real, g.call("mul", y, 3.0))
    g.output(g.call("sub", z, 1.0))
    c = g.compile()
    a = np.arange(5.0)
    seen = []
    c._warm((a,), [lambda v: seen.append(1) or v + 0, lambda v: seen.append(2) or v + 0])
    assert seen == [1, 2] and called == [] and len(c.kernels) >= 1
    nk = len(c.kernels)
    np.testing.assert_array_equal(c(a)[0], ((a + 1) * 2 * 3) * 2 - 1)
    assert called == ["real", "real"] and len(c.kernels) == nk  # the plans were built by _warm

    stand = []

    def clearing(v):
        stand.clear()
        return v + 0

    stand.extend([clearing, lambda v: v + 0])
    with pytest.raises(RuntimeError, match="extern 1 is gone"):
        c._warm((a,), stand)
    with pytest.raises(ValueError, match="takes 2 extern stand-ins"):
        c._warm((a,), [clearing])


def test_call_with_returns_the_outputs_of_stand_in_externs():
    """Compiled._call_with (our tracer's first call, whose trace ran the externs already) runs
    the kernels with the stand-ins' results and returns the outputs, as a call; the graph's own
    externs are not called; refcounts of the arrays are unchanged after many calls."""
    import sys

    called, real = _recording_extern()
    g = Graph()
    x = g.input("float64", 1)
    y = g.extern(real, g.call("add", x, 1.5))
    g.output(g.call("sub", y, 1.0), g.call("exp", x))
    c = g.compile()
    a = np.arange(5.0)
    want = ((a + 1.5) * 7 - 1.0, np.exp(a))
    out = c._call_with((a,), [lambda v: v * 7])
    assert isinstance(out, tuple) and called == []
    for o, w in zip(out, want):
        np.testing.assert_allclose(o, w, rtol=1e-12)
    r0 = sys.getrefcount(a)
    for _ in range(200):
        c._call_with((a,), [lambda v: v * 7])
    assert sys.getrefcount(a) == r0
    np.testing.assert_allclose(c(a)[0], (a + 1.5) * 2 - 1.0, rtol=1e-12)
    assert called == ["real"]
    with pytest.raises(ValueError, match="_call_with takes 1 extern stand-ins"):
        c._call_with((a,), [])
    with pytest.raises(TypeError):
        c._call_with([a], [lambda v: v])


def _three_segment_graph(real, k):
    """x -> add k -> extern -> mul k -> extern -> sub k: three segments, so three plans. k makes
    every kernel's source unique to the test (no other test's kernel in the shared caches)."""
    g = Graph()
    x = g.input("float32", 2)
    y = g.extern(real, g.call("add", x, k))
    z = g.extern(real, g.call("mul", y, k))
    g.output(g.call("sub", z, k))
    return g.compile()


def test_prebuild_runs_nothing_and_load_pending_compiles_every_plan_in_one_batch():
    """Compiled._prebuild (the torch backend's batch compile) is a dry run: it calls the
    stand-ins, never the graph's externs, launches no kernel and compiles nothing, yet every
    segment gets its plan; Compiled._load_pending then compiles them all in one batch, and the
    call after builds and compiles nothing more."""
    called = []

    def real(a):
        called.append(1)
        return a * 2

    k = 1.0 + 2.0**-7 * 5  # a constant of this test's own
    c = _three_segment_graph(real, k)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    seen = []
    before = fastcompile.stats()["compiles"]
    refs = sys.getrefcount(a), sys.getrefcount(c)
    c._prebuild((a,), [lambda v: seen.append(v.shape) or np.empty_like(v)] * 2)
    assert seen == [(3, 4), (3, 4)] and called == []
    assert c.nplans == 3 and c.kernels == [] and fastcompile.stats()["compiles"] == before
    assert fastcompile.graph.Compiled._load_pending([c]) == 3
    assert (sys.getrefcount(a), sys.getrefcount(c)) == refs
    assert fastcompile.stats()["compiles"] - before == 3 and len(c.kernels) == 3
    assert fastcompile.graph.Compiled._load_pending([c, c]) == 0  # nothing left to load
    np.testing.assert_allclose(c(a)[0], ((a + k) * 2 * k) * 2 - k, rtol=1e-6)
    assert called == [1, 1] and c.nplans == 3 and len(c.kernels) == 3
    assert fastcompile.stats()["compiles"] - before == 3


def test_prebuild_plan_left_unloaded_is_loaded_by_the_call():
    k = 1.0 + 2.0**-7 * 6
    c = _three_segment_graph(lambda v: v * 2, k)
    a = np.ones((2, 5), np.float32)
    c._prebuild((a,), [np.empty_like] * 2)
    assert c.nplans == 3 and c.kernels == []
    np.testing.assert_allclose(c(a)[0], ((a + k) * 2 * k) * 2 - k, rtol=1e-6)
    assert c.nplans == 3 and len(c.kernels) == 3


def test_prebuild_with_a_mispredicted_layout_builds_that_plan_at_the_call():
    """A stand-in whose layout differs from what the real extern returns (Fortran order here)
    selects another plan: the call builds the right one itself and computes right."""
    c = _three_segment_graph(lambda v: v * 2, 1.0 + 2.0**-7 * 7)
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    c._prebuild((a,), [lambda v: np.asfortranarray(np.empty_like(v))] * 2)
    assert fastcompile.graph.Compiled._load_pending([c]) == 3
    k = 1.0 + 2.0**-7 * 7
    np.testing.assert_allclose(c(a)[0], ((a + k) * 2 * k) * 2 - k, rtol=1e-6)
    assert c.nplans == 5 and len(c.kernels) == 5  # segments 2 and 3 again, for C order


def test_prebuild_and_load_pending_argument_errors():
    c = _three_segment_graph(lambda v: v, 2.0)
    a = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="_prebuild takes 2 extern stand-ins"):
        c._prebuild((a,), [np.empty_like])
    with pytest.raises(TypeError, match="takes Compiled objects, got int"):
        fastcompile.graph.Compiled._load_pending([c, 3])
    with pytest.raises(TypeError, match="sequence of Compiled"):
        fastcompile.graph.Compiled._load_pending(5)
    with pytest.raises(RuntimeError, match="boom"):
        c._prebuild((a,), [np.empty_like, lambda v: (_ for _ in ()).throw(RuntimeError("boom"))])
    assert c.nplans == 2 and c.kernels == []  # the plans before the failing stand-in
    assert fastcompile.graph.Compiled._load_pending([c]) == 2
    np.testing.assert_allclose(c(a)[0], (a + 2.0) * 2.0 - 2.0)


def test_load_pending_compile_failure_leaves_the_plans_to_the_call():
    """A batch that fails to compile raises and loads nothing; the call then tries its own plan
    and raises the compiler's error as it would have without the batch."""
    k = 1.0 + 2.0**-7 * 9
    c = _three_segment_graph(lambda v: v, k)
    a = np.ones((2, 2), np.float32)
    old = fastcompile.config.get("cflags")
    fastcompile.config.set(cflags="-fno-such-flag-for-fastcompile")
    try:
        c._prebuild((a,), [np.empty_like] * 2)
        with pytest.raises(RuntimeError, match="no-such-flag"):
            fastcompile.graph.Compiled._load_pending([c])
        assert c.kernels == []
        with pytest.raises(RuntimeError, match="no-such-flag"):
            c(a)
    finally:
        fastcompile.config.set(cflags=old)
    np.testing.assert_allclose(c(a)[0], (a + k) * k - k, rtol=1e-6)
    assert len(c.kernels) == 3


def test_load_pending_one_failing_kernel_keeps_the_others(tmp_path):
    """A compiler that fails on one graph's kernels (a wrapper around cc that refuses sources
    holding a marker constant): the batch raises that failure, the other graph's plans are
    loaded and listed all the same, and only the failing graph's call compiles (and raises)."""
    import shutil

    cc = shutil.which(fastcompile.config.resolved()["cc"])
    wrapper = tmp_path / "cc-refusing-marker"
    wrapper.write_text(
        '#!/bin/sh\nfor a in "$@"; do case "$a" in *.c) if grep -q 1.4453125 "$a"; then '
        'echo "refused: marker" >&2; exit 1; fi;; esac; done\nexec %s "$@"\n' % cc
    )
    wrapper.chmod(0o755)
    bad = _three_segment_graph(lambda v: v, 1.4453125)  # the marker: 1 + 57/128
    good = _three_segment_graph(lambda v: v, 1.0 + 2.0**-7 * 11)
    a = np.ones((2, 3), np.float32)
    old = fastcompile.config.get("cc")
    fastcompile.config.set(cc=str(wrapper))
    try:
        bad._prebuild((a,), [np.empty_like] * 2)
        good._prebuild((a,), [np.empty_like] * 2)
        with pytest.raises(RuntimeError, match="refused: marker"):
            fastcompile.graph.Compiled._load_pending([bad, good])
        assert bad.kernels == [] and len(good.kernels) == 3
        before = fastcompile.stats()["compiles"]
        k = 1.0 + 2.0**-7 * 11
        np.testing.assert_allclose(good(a)[0], (a + k) * k - k, rtol=1e-6)
        assert fastcompile.stats()["compiles"] == before
        with pytest.raises(RuntimeError, match="refused: marker"):
            bad(a)
    finally:
        fastcompile.config.set(cc=old)


def test_load_pending_survives_its_list_dropping_the_graphs():
    """The graphs' list is the caller's: a thread that empties it while the compiler runs
    (without the GIL) must not free a plan the batch is compiling (_load_pending holds a tuple
    of its own)."""
    import gc
    import threading

    graphs, ws = [], []
    for i in range(4):

        def real(v):
            return v

        c = _three_segment_graph(real, 1.0 + 2.0**-7 * (20 + i))
        c._prebuild((np.ones((2, 2), np.float32),), [np.empty_like] * 2)
        graphs.append(c)
        ws.append(weakref.ref(real))  # the graph holds its extern: dies with it
    del c, real

    def drop():
        time.sleep(0.02)
        graphs.clear()
        gc.collect()

    t = threading.Thread(target=drop)
    t.start()
    try:
        assert fastcompile.graph.Compiled._load_pending(graphs) == 12
    finally:
        t.join()
    gc.collect()
    assert all(w() is None for w in ws)  # freed once the batch let go of them


def test_threads_first_calling_together_add_one_plan():
    """Threads that make a graph's first call at once all build its plan (the compiler runs
    without the GIL), but one plan is kept: Compiled.kernels lists each kernel once."""
    g = Graph()
    x = g.input("float64", 2)
    g.output(g.call("exp", g.call("mul", x, 2.0)))
    c = g.compile()
    a = np.random.default_rng(0).standard_normal((4, 5))

    def work(i):
        np.testing.assert_allclose(c(a)[0], np.exp(a * 2.0), rtol=1e-15)

    assert run_threads(work, 3) == []
    assert len(c.kernels) == 1, [k.name for k in c.kernels]
