"""Trace stage, recording array ops: a torch or NumPy call on traced arrays becomes a core op
of the graph, an extern call, or (autograd mode) an FX node, its eager example giving the
result's metadata. In: the function and its traced arguments; out: the result as a Var."""

import contextlib
import logging
import operator
import threading

import numpy as np

from fastcompile._common import TORCH_OPMATH_SCALAR

from . import helpers as H
from . import sources as S
from .helpers import (
    FLOAT_RESULT,
    NP_FLOATS,
    TORCH_TO_NP,
    NeedAutograd,
    NoCore,
    fn_name,
    host_of,
    is_array,
    kind_of,
    storage_ptr,
    unlazy,
)
from .variables import ArrayVar, DictVar, ListVar, PyVar, ScalarVar, ShapeVar, TupleVar

torch = H.reads_torch(__name__)  # bound by helpers.sync_torch()

log = logging.getLogger("fastcompile.trace")

_EXAMPLE = threading.local()  # depth: inside Tracer.eager (an example computation) on this thread


class _FunctionalModule:
    """A torch module called with its parameters and buffers passed in (autograd mode). In the
    tracer's example computation (Tracer.eager) buffers are cloned, so it cannot update running
    statistics; under aot_autograd (grad on, or off for a no_grad inference graph) the real
    buffers are inputs and their updates are kept."""

    def __init__(self, mod, names, nparams):
        self.mod, self.names, self.nparams = mod, names, nparams
        self.__name__ = "module_" + type(mod).__name__

    def __call__(self, tensors, *args, **kwargs):
        from torch.func import functional_call

        if getattr(_EXAMPLE, "depth", 0):  # the tracer's eager example
            tensors = tuple(t if i < self.nparams else t.clone() for i, t in enumerate(tensors))
        return functional_call(self.mod, dict(zip(self.names, tensors)), args, kwargs)

    def __repr__(self):
        return "functional %s" % type(self.mod).__name__


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


class _ListT(list):
    pass


class _DictT(dict):
    pass


def _fill(t, arrs):
    if isinstance(t, _Slot):
        return arrs[t.i]
    if isinstance(t, _ListT):
        return [_fill(x, arrs) for x in t]
    if type(t) is tuple:  # a template's own tuple; a torch.Size (ints only) stays as it is
        return tuple(_fill(x, arrs) for x in t)
    if isinstance(t, _DictT):
        return {k: _fill(x, arrs) for k, x in t.items()}
    return t


def _map_examples(tracer, v):
    v = unlazy(v)
    if isinstance(v, ArrayVar):
        return v.example
    if isinstance(v, ScalarVar):  # metadata only: an example's value is never read later
        return v.value
    if isinstance(v, TupleVar):
        return tuple(_map_examples(tracer, x) for x in v.items)
    if isinstance(v, ListVar):
        return [_map_examples(tracer, x) for x in v.items]
    if isinstance(v, DictVar):
        return {k: _map_examples(tracer, x) for k, x in v.items.items()}
    return tracer.py(v)


def _strong_dtype(args, kind):
    """The result type of an op's strongly typed operands: arrays, and in NumPy code NumPy
    scalars (torch takes them as Python scalars); None where there are none."""
    dts = []
    for a in args:
        a = unlazy(a)
        if isinstance(a, ArrayVar):
            dts.append(_np_dtype(a.example))
        elif kind == "numpy" and isinstance(a, (PyVar, ScalarVar)) and isinstance(a.value, np.generic):
            dts.append(a.value.dtype)
    return np.result_type(*dts) if dts else None


def _to_float16(v):
    """np.float16(v) of a Python int or float, inf past float16's range with no warning
    (torch gives none; NumPy's cast warning is not one the compiled call repeats)."""
    if -65520.0 < v < 65520.0:
        return np.float16(v)
    with np.errstate(over="ignore"):
        return np.float16(v)


def _np_dtype(example):
    if torch is not None and isinstance(example, torch.Tensor):
        return TORCH_TO_NP[example.dtype]
    return np.asarray(example).dtype


# functions whose number of results follows their arguments' sizes (Tracer.extern guards them)
_COUNT_BY_SIZE = ("unbind", "split", "chunk", "unstack", "hsplit", "vsplit", "dsplit")


class ArrayRecorder:
    """Tracer methods: array ops into the core graph, externs and the FX graph."""

    # ------------------------------------------------------------------ array ops

    def record_op(self):
        self.op_count += 1
        self.lines.append((self.frame.code.co_filename, self.frame.lineno))

    def example_of(self, var):
        var = unlazy(var)
        if isinstance(var, (ArrayVar, ScalarVar)):
            return var.example if isinstance(var, ArrayVar) else var.value
        return self.py(var)

    def scalar_value(self, var):
        """A ScalarVar's graph value: a weak 0-d input, made at its first use."""
        if var.gv is None:
            weak = type(var.value) is float  # a NumPy scalar is strongly typed (NEP 50)
            var.gv = self.graph.input("float64" if weak else var.value.dtype.name, 0, weak=weak)
            self.inputs.append((var.source, "scalar", var.value))
        return var.gv

    def half_scalar(self, var):
        """float16(var) of a Python float read at each call, computed by Python at each call
        (a strongly typed float16 input): what NumPy and torch make of it next to float16."""
        if var.half is None:
            var.half = ScalarVar(
                _to_float16(var.value), S.ScalarExprSource(_to_float16, "float16", [var.source]), var.roots
            )
        return var.half

    def scalar_op(self, fn, label, args):
        """fn(*args) on ScalarVars and Python numbers, with a float result: a ScalarVar that
        Python computes again at each call (a ScalarExprSource), or None when the trace cannot
        tell its result is always a float (a power may be complex) or it raises now: Python
        folds it then, specializing the ScalarVars."""
        if fn not in FLOAT_RESULT:
            return None
        for a in args:
            if not isinstance(a, ScalarVar) and not (isinstance(a, PyVar) and type(a.value) in (int, float, bool)):
                return None
        try:
            with np.errstate(all="ignore"):  # NumPy's overflow warning: the call's own, at each call
                value = fn(*[a.value for a in args])
        except Exception:
            return None
        # a NumPy scalar's result type follows from the types alone (NEP 50), which are guarded
        if type(value) is not float and type(value) not in NP_FLOATS:
            return None
        roots = []
        for a in args:
            if isinstance(a, ScalarVar):
                roots.extend(r for r in a.roots if all(r is not q for q in roots))
        src = S.ScalarExprSource(fn, label, [a.source if isinstance(a, ScalarVar) else a.value for a in args])
        var = ScalarVar(value, src, roots)
        self.scalar_exprs.append(var)  # computed at each call even if unused: what it raises is raised
        return var

    def graph_arg(self, var):
        var = unlazy(var)
        if isinstance(var, ArrayVar):
            return var.value
        if isinstance(var, ScalarVar):
            return self.scalar_value(var)
        v = self.py(var)
        if isinstance(v, (bool, int, float, np.generic)):
            return v
        raise NoCore()

    def eager(self, fn, args, kwargs):
        ex_args = [_map_examples(self, a) for a in args]
        ex_kwargs = {k: _map_examples(self, v) for k, v in kwargs.items()}
        key = getattr(fn, "__code__", fn)  # a lambda made anew per call: its code
        flat = ex_args + list(ex_kwargs.values())
        if self.replay is not None:
            entry = next(self.replay, None)
            if (
                entry is not None
                and entry[0] is key
                and len(entry[1]) == len(flat)
                and all(a is b for a, b in zip(entry[1], flat) if is_array(a) or is_array(b))
            ):
                return entry[2]
            self.replay = None  # out of step: run them from here on
        # autograd mode: the example gives metadata only, no autograd graph is built for it
        grad = torch.no_grad() if self.fx is not None else contextlib.nullcontext()
        _EXAMPLE.depth = getattr(_EXAMPLE, "depth", 0) + 1
        try:
            with grad:
                result = fn(*ex_args, **ex_kwargs)
        except Exception as e:  # the user's code raises
            self.unsupported("%s raised %s: %s while tracing" % (fn_name(fn), type(e).__name__, e))
        finally:
            _EXAMPLE.depth -= 1
        if self.fx is None:
            self.eager_log.append((key, flat, result))
        return result

    # ------------------------------------------------------------------ autograd mode (FX)

    def _fx_placeholder(self):
        name = "in%d" % len(self.fx_placeholders)
        first_op = next((n for n in self.fx.nodes if n.op != "placeholder"), None)
        if first_op is None:
            node = self.fx.placeholder(name)
        else:
            with self.fx.inserting_before(first_op):
                node = self.fx.placeholder(name)
        self.fx_placeholders.append(node)
        return node

    def fx_module_call(self, mod_var, args, kwargs):
        """Autograd mode, a torch.nn module (Linear, Conv2d, MultiheadAttention, ...): one FX node
        that calls it through torch.func.functional_call with its parameters and buffers as graph
        inputs, so aot_autograd sees its aten ops and gradients reach the parameters."""
        mod = mod_var.value
        if mod_var.source is None:
            self.unsupported("a module made in the trace")
        names, tensors = [], []
        for name, t in list(mod.named_parameters()) + list(mod.named_buffers()):
            *path, leaf = name.split(".")
            src = mod_var.source
            for part in path:
                src = S.ItemSource(S.DictAttrSource(src, "_modules"), part)
            sub = mod.get_submodule(".".join(path)) if path else mod
            where = "_parameters" if leaf in sub._parameters else "_buffers"
            names.append(name)
            tensors.append(self.wrap(t, S.ItemSource(S.DictAttrSource(src, where), leaf)))
        call = _FunctionalModule(mod, tuple(names), len(list(mod.named_parameters())))
        return self.fx_call(call, [TupleVar(tensors)] + list(args), kwargs)

    def fx_arg(self, v):
        """A traced argument as an FX argument: nodes for arrays, Python values otherwise."""
        v = unlazy(v)
        if isinstance(v, ArrayVar):
            return v.fx
        if isinstance(v, TupleVar):
            return tuple(self.fx_arg(x) for x in v.items)
        if isinstance(v, ListVar):
            return [self.fx_arg(x) for x in v.items]
        if isinstance(v, DictVar):
            return {k: self.fx_arg(x) for k, x in v.items.items()}
        return self.py(v)

    def fx_call(self, fn, args, kwargs, method=None, example=None):
        """Autograd mode: fn(*args, **kwargs) (or args[0].method(*args[1:], **kwargs)) as one FX
        node; its eager example (or the example given: a random op's, which must not draw from
        the RNG while tracing) gives the result's metadata."""
        if example is None:
            example = self.eager(fn, args, kwargs)
        fa = tuple(self.fx_arg(a) for a in args)
        fk = {k: self.fx_arg(v) for k, v in kwargs.items()}
        tensors = isinstance(example, torch.Tensor) or (  # or e.g. MultiheadAttention's (output, None)
            isinstance(example, (tuple, list))
            and example
            and all(isinstance(e, torch.Tensor) or e is None for e in example)
        )
        if not tensors:
            self.unsupported(
                "%s returns %s computed from tensors (data-dependent Python value)"
                % (fn_name(fn) if method is None else "Tensor." + method, type(example).__name__)
            )
        node = self.fx.call_method(method, fa, fk) if method else self.fx.call_function(fn, fa, fk)
        self.record_op()
        # a result that views an argument (y.t(), y[0], x.contiguous() returning x) is not fresh:
        # an in-place update of it must reach what it views, so it is a graph break, and so is
        # an in-place update of an argument it views (escaped), which must reach the view
        arrays = [a for a in (unlazy(v) for v in list(args) + list(kwargs.values())) if isinstance(a, ArrayVar)]
        stores = {storage_ptr(a.example) for a in arrays} - {None}

        def fresh(e):
            ptr = storage_ptr(e)
            if e._is_view() or ptr is None or ptr in stores:
                for a in arrays:
                    a.escaped = True
                return False
            return True

        if isinstance(example, torch.Tensor):
            var = ArrayVar(None, example, "torch", fresh=fresh(example))
            var.fx = node
            return var
        items = []
        for i, e in enumerate(example):
            if e is None:
                items.append(PyVar(None))
                continue
            var = ArrayVar(None, e, "torch", fresh=fresh(e))
            var.fx = self.fx.call_function(operator.getitem, (node, i))
            items.append(var)
        return TupleVar(items)

    def core(self, op, args, attrs, example, kind):
        """A core op; dtype checked against the eager example (cast when it differs)."""
        want = _np_dtype(example)
        # NumPy (NEP 50) makes a Python scalar that meets float16 operands a float16 first:
        # x < 0.1 compares with float16(0.1), x * 100000 is x * inf, x ** 0.1 is
        # x ** float16(0.1); torch too but for mul and div (TORCH_OPMATH_SCALAR). The strongly
        # typed operands (arrays, tensors cast to the op's dtype, NumPy scalars) decide it,
        # not the result (a comparison's is bool)
        half = _strong_dtype(args, kind) == np.float16 and not (kind == "torch" and op in TORCH_OPMATH_SCALAR)
        args = [
            self._core_scalar(unlazy(a), op == "pow" and i == 1, kind, half) if isinstance(unlazy(a), ScalarVar) else a
            for i, a in enumerate(args)
        ]
        vals = [self.graph_arg(a) for a in args]
        if kind == "torch":  # torch takes a NumPy scalar constant as a Python one (weak)
            vals = [v.item() if isinstance(v, np.generic) else v for v in vals]
        if half:  # the core keeps weak constants in float32, as torch does
            vals = [_to_float16(v) if type(v) in (int, float) else v for v in vals]
        try:
            if (
                kind == "torch"
                and op in ("floordiv", "remainder")
                and want.kind in "iu"
                and not isinstance(vals[1], (bool, int, float))
            ):
                # torch raises on an integer division by a tensor holding 0 (RuntimeError
                # "ZeroDivisionError"), NumPy gives 0: the divisor is checked in the kernel
                if vals[1].dtype == "bool":
                    vals[1] = self.graph.call("cast", vals[1], dtype=want.name)
                vals[1] = self.graph.call("check_divisor", vals[1])
            v = self.graph.call(op, *vals, **attrs)
            if v.dtype != want.name:  # None after an extern call: known at compile time
                v = self.graph.call("cast", v, dtype=want.name)  # TypeError: not a core dtype
        except (TypeError, ValueError, OverflowError, np.exceptions.AxisError) as e:
            log.debug("core %s refused, an extern runs it: %r", op, e)
            raise NoCore()
        if v.ndim is not None and v.ndim != np.ndim(example):
            raise NoCore()
        self.record_op()
        return ArrayVar(v, example, kind, fresh=True)

    def _core_scalar(self, var, exponent, kind, half):
        """A float read at each call as a core op's operand. Baked in (its value guarded): an
        exponent (NumPy and torch take x ** 0.5 as sqrt, -0.0 and -inf differ from pow, which
        the core does for a constant exponent only) and a NumPy scalar in torch code (torch
        takes it as a Python one, weak, which the core would promote). Next to float16
        (half): float16(lr), computed by Python at each call."""
        if exponent or kind == "torch" and type(var.value) is not float:
            return PyVar(self.py(var))
        if half and type(var.value) is float:
            return self.half_scalar(var)
        return var

    def extern(self, fn, args, kwargs, example, kind):
        """fn(*args, **kwargs) at run time through g.extern; arrays are the values."""
        arrays = []

        def template(v):
            v = unlazy(v)
            if isinstance(v, ArrayVar):
                arrays.append(v)
                v.escaped = True
                return _Slot(len(arrays) - 1)
            if isinstance(v, (TupleVar, ListVar)):
                items = [template(x) for x in v.items]
                return tuple(items) if isinstance(v, TupleVar) else _ListT(items)
            if isinstance(v, DictVar):
                return _DictT({k: template(x) for k, x in v.items.items()})
            if isinstance(v, ShapeVar):
                return self.py(v)
            return self.py(v)

        targs = [template(a) for a in args]
        tkw = {k: template(v) for k, v in kwargs.items()}
        if isinstance(example, (tuple, list)) and example and all(is_array(e) for e in example):
            nout = len(example)
        elif is_array(example):
            nout = None
        elif (
            kind == "torch"
            and isinstance(example, tuple)
            and any(is_array(e) for e in example)
            and all(is_array(e) or e is None for e in example)
            and self.fx is None
        ):
            raise NeedAutograd()  # (output, None) from MultiheadAttention: as torch ops
        else:
            self.unsupported(
                "%s returns %s computed from arrays (data-dependent Python value)"
                % (fn_name(fn), type(example).__name__)
            )
        if nout and any(w in fn_name(fn).rsplit(".", 1)[-1] for w in _COUNT_BY_SIZE):
            # how many arrays x.unbind(0) or np.split(x, 2) gives depends on sizes the graph does
            # not otherwise fix: guard them (a new size traces again, not a wrong count)
            for a in arrays:
                for axis in range(a.ndim):
                    self.dim(a, axis)
        to_torch = kind == "torch"
        examples = example if nout else [example]
        for e in examples:
            if (
                torch is not None
                and isinstance(e, torch.Tensor)
                and (e.dtype not in TORCH_TO_NP or e.layout != torch.strided)
            ):
                self.unsupported(
                    "%s returns a tensor of dtype %s, layout %s: the core takes NumPy's "
                    "dtypes, strided" % (fn_name(fn), e.dtype, e.layout)
                )
        if to_torch and any(getattr(e, "requires_grad", False) for e in examples):
            if torch.is_grad_enabled() and self.fx is None:
                raise NeedAutograd()  # parameters inside a torch module: trace for autograd
            self.unsupported(
                "%s returns a tensor that requires grad (a parameter or input requires grad): "
                "autograd is not traced (hint: torch.no_grad() or module.requires_grad_(False))" % fn_name(fn)
            )

        def run(*arrs):
            if to_torch:
                arrs = [torch.from_numpy(a) if isinstance(a, np.ndarray) else torch.as_tensor(a) for a in arrs]
            out = fn(*[_fill(t, arrs) for t in targs], **{k: _fill(t, arrs) for k, t in tkw.items()})
            if to_torch:
                if nout is None:
                    return out.numpy()
                return tuple(o.numpy() for o in out)
            return out if nout is None else tuple(out)

        run.__name__ = run.__qualname__ = "extern_" + fn_name(fn).replace(".", "_")  # (profile()'s row)
        v = self.graph.extern(run, *[a.value for a in arrays], nout=nout)
        self.extern_results.append((example, run, [a.example for a in arrays]))
        self.record_op()
        # a result sharing no memory with the arguments or the other results (F.linear's, a
        # conv's) is the extern's own: fresh, so an in-place update may rebind it
        hosts = [h for h in (host_of(a.example) for a in arrays) if h is not None]
        outs = [host_of(e) for e in examples]

        def fresh(i):
            h = outs[i]
            return h is not None and not any(
                np.may_share_memory(h, o) for o in hosts + outs[:i] + outs[i + 1 :] if o is not None
            )

        if nout is None:
            return ArrayVar(v, example, kind, fresh=fresh(0))
        return TupleVar([ArrayVar(x, e, kind, fresh=fresh(i)) for i, (x, e) in enumerate(zip(v, example))])

    def array_call(self, fn, args, kwargs, core_op=None, attrs=None, core_args=None, kind=None):
        """Call fn on traced arguments: a core op when possible, else an extern call."""
        if self.fx is not None:
            return self.fx_call(fn, args, kwargs)
        kind = kind or kind_of(args, kwargs)
        example = self.eager(fn, args, kwargs)
        if kind == "torch" and is_array(example) and not isinstance(example, torch.Tensor):
            kind = "numpy"
        if core_op is not None and is_array(example):
            try:
                return self.core(core_op, core_args if core_args is not None else args, attrs or {}, example, kind)
            except NoCore:
                pass
        return self.extern(fn, args, kwargs, example, kind)
