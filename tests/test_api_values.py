"""The frontend end to end, on what a trace reads and writes of Python values: one array
under two sources, writes into arguments, dtypes and layouts outside the core, attributes of
classes, instances and modules (guarded as read, or read by Python), values guarded by value,
float16 next to Python scalars, closure cells, and floats read at each call instead of baked in.
Shared fixtures: api_helpers.py."""

import contextlib
import io
import math
import threading
import warnings

import numpy as np
import pytest

import fastcompile
from fastcompile.api import FastcompileWarning

import trace_corpus as C
from api_helpers import clean, entries  # noqa: F401 (clean: an autouse fixture)
from test_trace import same

_SINK = io.StringIO()  # print() target of the functions below: a side effect, not output


def test_one_array_under_two_sources_at_trace_is_two_inputs():
    """A resume function traced while two of its values are one array (z = pick(x, y)
    returns y) reads each from its own source: once they differ, y's uses get y's values. Also
    a compiled function re-entered from its own graph-break callback (the same pattern)."""
    same = [True]
    log = []

    def pick(x, y):
        log.append(1)  # a break: mutation of an outside list
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


def _w_ufunc_pos_out(a, o):
    np.exp(a, o)
    return o + 1


def _w_ufunc_pos_out_self(a, o):
    np.negative(a, out=a)
    np.exp(a, a)
    return a  # noqa: E702


def _w_sum_pos_out(a, o):
    np.sum(a, 1, None, o[:, 0])
    return o * 2


def _w_dot_pos_out(a, o):
    np.dot(a[:, :4], a[:4, :6], o)
    return o - 1


def _w_reduce_pos_out(a, o):
    np.add.reduce(a, 1, None, o[:, 1])
    return o * 1


def _w_clip_method_out(a, o):
    a.clip(0, 1, o)
    return o + a


def _w_round_method_out(a, o):
    a.round(1, o)
    return o + 1


def _w_cumsum_method_out(a, o):
    a.cumsum(1, None, o)
    return o * 1


def _w_ufunc_at(a, o):
    np.add.at(a, [0, 1, 1], 1.0)
    return a * 2


def _w_iadd_dunder(a, o):
    a.__iadd__(1)
    return a * 2


def _w_imul_dunder(a, o):
    a.__imul__(o)
    return a + 1


def _w_setitem_dunder(a, o):
    a.__setitem__((0, 0), 5.0)
    return a * 2


def _w_fresh_iadd_dunder(a, o):
    b = a * 2
    b.__iadd__(o)
    return b * 3


def _w_operator_iadd(a, o):
    __import__("operator").iadd(a, 1.5)
    return a * 2


WRITES_NUMPY = [
    _w_ufunc_pos_out,
    _w_ufunc_pos_out_self,
    _w_sum_pos_out,
    _w_dot_pos_out,
    _w_reduce_pos_out,
    _w_clip_method_out,
    _w_round_method_out,
    _w_cumsum_method_out,
    _w_ufunc_at,
]
WRITES_ANY = [_w_iadd_dunder, _w_imul_dunder, _w_setitem_dunder, _w_fresh_iadd_dunder, _w_operator_iadd]


@pytest.mark.parametrize(
    "fn,kind",
    [(f, "numpy") for f in WRITES_NUMPY + WRITES_ANY] + [(f, "torch") for f in WRITES_ANY],
    ids=lambda v: v.__name__[3:] if callable(v) else v,
)
def test_writes_into_arguments_happen_as_in_python(fn, kind):
    """A call that writes into an array it is given: NumPy's out by position (a ufunc's outputs
    after its inputs, np.sum's, np.dot's and ndarray methods' out parameter), ufunc.at, and the
    in-place operator methods called by name (a.__iadd__(b)). Each compiled call must write what
    Python writes and return the same: traced as pure calls, a positional out or a.__iadd__ on
    an argument would be lost from the second call on (np.exp(a, a) returning a unchanged)."""
    if kind == "torch":
        torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
    rng = np.random.default_rng(0)
    x, o = rng.standard_normal((4, 6)).astype(np.float32), np.zeros((4, 6), np.float32)
    compiled = fastcompile.compile(fn)
    for k in range(3):  # a trace, then cache hits
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
    quantizing through a half type is what the user asked for, not a no-op in the kernel."""

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
    long double argument is a graph break, a cast to one an extern call, never an internal
    error (a warning, and the whole function uncompiled)."""
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
            np.testing.assert_allclose(got, want, rtol=1e-6)  # sin: libmvec's, not NumPy's


@pytest.mark.parametrize("case", ["to_complex", "bfloat16_method", "float8", "quantized", "sparse", "view_as_real"])
def test_tensor_dtypes_and_layouts_outside_the_core_run_as_torch_without_an_internal_error(case):
    """A tensor whose dtype has no NumPy dtype (complex, bfloat16, float8, quantized) or whose
    layout is not strided (sparse), made inside the traced code: the op that makes it runs as torch
    (a graph break or an extern), the rest compiles, never an internal error (a warning and the
    whole function uncompiled)."""
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


def test_shapes_are_torch_sizes_and_read_as_sizes():
    """x.shape and x.size() of a tensor are torch.Size inside the trace, when an extern is called
    again and when returned, so x.new(y.size()) makes a tensor of that shape (not one holding the
    sizes as data); called three times over two input sets, results equal plain Python's, types
    included."""
    torch = pytest.importorskip("torch", reason="torch is not installed for this Python")

    def f(x, y):
        a = x.new(y.size())  # a torch.Size is a size; a plain tuple would be the new tensor's data
        b = x.new(y.shape)
        return a.shape, b.shape, y.shape, x.size(), torch.zeros_like(b) + b.new_zeros(y.size()) + x

    compiled = fastcompile.compile(f)
    for shape in [(5, 8), (3, 4), (5, 8)]:
        x, y = torch.randn(*shape), torch.randn(*shape)
        got, want = compiled(x, y), f(x, y)
        for g, w in zip(got, want):
            assert type(g) is type(w), (g, w)
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w, rtol=0, atol=0)
            else:
                assert g == w
    assert fastcompile.explain(f)(x, y).graph_break_count == 0


def test_jumps_to_instructions_with_extended_arg_are_traced():
    """A jump lands on the first EXTENDED_ARG prefix of its target (here a LOAD_CONST of the
    300th constant); the tracer follows it, before and after a graph break, instead of an
    internal error and the whole function uncompiled."""
    src = "def f(x, flag):\n"
    src += "".join("    a%d = %d.5\n" % (i, 1000 + i) for i in range(300))
    src += "    if flag:\n        y = x + 1\n    else:\n        y = x - 1\n    z = 777777.25\n"
    src += "    print('break')\n    if flag:\n        y = y * 2\n    else:\n        y = y * 3\n"
    src += "    w = 888888.25\n    return y * z + w + a299\n"
    ns = {}
    exec(compile(src, "extended_arg_case.py", "exec"), ns)
    f = ns["f"]
    assert any(i.opname == "EXTENDED_ARG" for i in __import__("dis").get_instructions(f))
    compiled = fastcompile.compile(f)
    x = np.arange(4, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastcompileWarning)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            for flag in (True, False, True, False):
                np.testing.assert_array_equal(compiled(x, flag), f(x, flag))
    assert out.getvalue() == "break\n" * 8
    ex = fastcompile.explain(f)(x, True)
    assert ex.graph_count == 2 and ex.graph_break_count == 1, ex


def test_in_place_operators_on_a_fresh_tensor_stay_in_the_graph():
    """b = a * 2; b += 1 on torch tensors: one graph, no break (the in-place step copies a
    tensor with .clone(), not ndarray's .copy()). torch's own errors stay torch's (an int
    tensor += 1.5 raises RuntimeError, compiled or not)."""
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


class _Cfg:
    scale = 1.5  # a class attribute: instances read it until they set their own
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
    instance sets its own (shadowing it) or deletes it, and the name appears or goes: neither
    the class's value nor an absent name's default is baked in without a guard."""
    x = np.arange(3, dtype=np.float32)
    f, g = fastcompile.compile(_reads_class_attrs), fastcompile.compile(_reads_absent_attrs)
    changes = [
        lambda: None,
        lambda: setattr(_CFG, "scale", 3.0),
        lambda: setattr(_Cfg, "scale", 5.0),
        lambda: delattr(_CFG, "scale"),
        lambda: setattr(_Cfg, "table", np.zeros(3, np.float32)),
        lambda: setattr(_CFG, "extra", 7.0),
        lambda: setattr(_Cfg, "extra", 9.0),
        lambda: delattr(_CFG, "extra"),
        lambda: delattr(_Cfg, "extra"),
    ]
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
    changes = [
        lambda: None,
        lambda: setattr(_Ops, "scale", lambda self, a: a * 3),
        lambda: setattr(_OPS, "scale", lambda a: a * 50),
        lambda: setattr(_Ops, "prop", property(lambda self: 42.0)),
        lambda: setattr(_Ops, "twice", staticmethod(lambda a: a * 5)),
        lambda: setattr(_Ops, "k", 9.0),
        lambda: setattr(_Ops, "by_k", classmethod(lambda cls, a: a - cls.k)),
        lambda: globals().__setitem__("_BOUND", other.scale),
        lambda: setattr(other, "s", 11.0),
    ]
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
    it changes, so it is a graph break, not a value read once with no guard."""
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
    if m > 0:  # a data-dependent branch: m reaches the resume function as a NumPy scalar
        return x / m
    return x


@pytest.mark.parametrize(
    "case",
    [
        "np_float32",
        "np_float64",
        "np_int64_shape",
        "np_bool",
        "py_minus_zero",
        "complex",
        "slice",
        "range",
        "namedtuple",
        "enum",
        "fraction",
        "slots",
        "slots_dataclass",
    ],
)
def test_values_of_arguments_are_guarded_by_value(case):
    """Arguments whose value the trace uses are guarded by value, so a later call with another
    value recompiles instead of reusing the first call's: NumPy scalars (not by type only, with
    the first value baked in), -0.0 against 0.0 (== makes them one entry), complex numbers,
    slices, ranges, namedtuples, enum members, fractions, and the members of __slots__
    objects."""
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
                for g, w in zip(
                    got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)
                ):
                    assert g.dtype == w.dtype and g.shape == w.shape, (v, g, w)
                    np.testing.assert_array_equal(g, w, err_msg=repr(v))
                    if g.dtype.kind == "f":
                        assert np.array_equal(np.signbit(g), np.signbit(w)), (v, g, w)
    if case == "slots":
        obj = _Slotted(2.0)
        compiled(x, obj)
        obj.scale = 3.0  # the member changes in place
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
        "div": lambda a: a / 2**31,
        "rfloordiv": lambda a: 2**31 // a,
        "rmod": lambda a: 2**31 % a,
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
    """An inlined function's closure cells are read at call time (CellSource), not once as
    constants of the trace: a rebound cell (nonlocal) recompiles, a list in one is guarded, and
    appending to it is a graph break that runs (not a local list's append, dropped)."""

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
    assert len(log) == 2  # both calls appended
    for _ in range(4):  # appending changes no guard: no recompile
        np.testing.assert_allclose(cf(x), x * 3.0 + 1.0)
    assert len(log) == 6
    assert len(entries(note)) == 1  # not one more entry per call


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
            np.testing.assert_array_equal(
                f(x, 0.1 * step, k=2.0**step), _many_float_sources(x, 0.1 * step, k=2.0**step)
            )
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


@pytest.mark.parametrize(
    "fn, values", [(_float_branch, [0.1, 0.2, 0.1, 0.3, 0.3]), (_float_as_python_value, [0.2, 0.3, 0.2, 0.5])]
)
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


@pytest.mark.parametrize(
    "scalar, dtype",
    [
        (np.float64(0.1), "float32"),
        (np.float32(0.1), "float16"),
        (np.float16(0.1), "float32"),
        (np.float32(3.5), "int64"),
    ],
)
def test_numpy_float_scalars_are_read_at_each_call_strongly_typed(scalar, dtype):
    f = fastcompile.compile(_lr_step)
    x = np.arange(-4, 4).astype(dtype)
    for k in range(4):
        s = type(scalar)(scalar * (k + 1))
        got, want = f(x, s), _lr_step(x, s)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert len(entries(_lr_step)) == 1
    np.testing.assert_array_equal(f(x, 0.5), _lr_step(x, 0.5))  # a Python float: another trace
    assert len(entries(_lr_step)) == 2


def _pow_op(x, e):
    return x**e + np.power(x, e)


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
        _helper_with_defaults.__defaults__ = (5.0, 3, np.ones(4))  # a float and an array: read
        same(f(x), _calls_helper_with_defaults(x))
        assert len(entries(_calls_helper_with_defaults)) == 1
        _helper_with_defaults.__defaults__ = (5.0, 7, np.ones(4))  # an int: traced again
        same(f(x), _calls_helper_with_defaults(x))
        _helper_with_defaults.__kwdefaults__ = {"bias": 10}
        same(f(x), _calls_helper_with_defaults(x))
        assert len(entries(_calls_helper_with_defaults)) == 3
        _helper_with_defaults.__defaults__ = (5.0,)  # too few: Python's TypeError
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
    inv = 1.0 / t  # noqa: F841 (never used afterwards)
    r = math.sqrt(lr)  # noqa: F841 (nor this)
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
    n = 10**6
    for a, b in [
        (n, n),
        (n, int(str(n))),
        (5, 5),
        ("ab", "ab"),
        ("ab", "".join(["a", "b"])),
        (None, None),
        (1, None),
        (n, n + 1),
    ]:
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
    Python's (x.base is None is not always False, a truth test not always True); nbytes and itemsize
    are numbers of the guarded dtype and sizes."""
    f = fastcompile.compile(fn)
    for x in (np.arange(4.0), _BASE[:4], np.zeros(0), np.array(5.0), np.arange(6.0).reshape(2, 3)[:, 1]):
        same(f(x), fn(x))
