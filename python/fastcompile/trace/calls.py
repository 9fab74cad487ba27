"""Trace stage, calls and inlining: a call of a traced value: Python functions and nn.Module
forwards inlined as new Frames, builtins and container methods folded or done on Vars, NumPy,
torch and array-method calls recorded. In: the callable and its traced arguments; out: a Var."""

import builtins as _builtins
import functools
import inspect
import operator
import types

import numpy as np

from fastcompile._common import hashable as _hashable

from . import helpers as H
from . import numpy_ops as NP
from . import sources as S
from .frame import Frame
from .helpers import FLOAT_RESULT, SCALARS, Lazy, any_array, describe, fn_name, kind_of, unlazy
from .variables import (
    NULL,
    ArrayMethodVar,
    ArrayVar,
    CellVar,
    DictVar,
    FuncVar,
    IterVar,
    ListVar,
    MethodVar,
    PyVar,
    ScalarVar,
    ShapeVar,
    TupleVar,
    Unsupported,
    AbsentAttribute,
)

torch = H.reads_torch(__name__)  # bound by helpers.sync_torch()

FOLDABLE_BUILTINS = {
    len,
    range,
    isinstance,
    issubclass,
    abs,
    min,
    max,
    int,
    float,
    bool,
    str,
    tuple,
    list,
    dict,
    enumerate,
    zip,
    reversed,
    sorted,
    getattr,
    hasattr,
    type,
    round,
    divmod,
    pow,
    sum,
    any,
    all,
    slice,
    iter,
    callable,
    hash,
    repr,
    format,
    id,
}
FOLDABLE_MODULES = ("math", "operator", "functools", "itertools")


def _cell_loader(tracer, cell, source):
    """Loads an inlined function's closure cell; source (S.CellSource): its contents are guarded
    and re-read at call time, and mutating them is a side effect."""

    def load():
        try:
            value = cell.cell_contents
        except ValueError:
            return None
        return tracer.wrap(value, source)

    return load


def _kind_name(v):
    if isinstance(v, types.BuiltinFunctionType):
        return "builtin"
    return "C extension function" if not isinstance(v, types.FunctionType) else "function"


def _is_torch_callable(v):
    mod = getattr(v, "__module__", None) or ""
    return (
        mod == "torch"
        or mod.startswith("torch.")
        or getattr(v, "__self__", None) is torch._C._VariableFunctions
        or type(v).__name__ == "builtin_function_or_method"
        and getattr(v, "__self__", None).__class__.__name__ == "module"
        and getattr(getattr(v, "__self__", None), "__name__", "").startswith("torch")
    )


_CONTAINER_METHODS = {
    list.append,
    list.extend,
    list.insert,
    list.pop,
    list.clear,
    list.reverse,
    list.index,
    list.count,
    tuple.index,
    tuple.count,
    dict.items,
    dict.keys,
    dict.values,
    dict.get,
    dict.update,
}


@functools.lru_cache(maxsize=None)
def _batch_norms():
    nn = torch.nn
    return frozenset((nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d))


@functools.lru_cache(maxsize=None)
def _inline_torch_modules():
    """torch.nn modules whose forward is inlined (its ops become core ops); other torch
    modules run whole as one extern call, which is safer for large forwards
    (attention, convolutions) the tracer would break inside."""
    nn = torch.nn
    return frozenset(
        getattr(nn, n)
        for n in (
            "GELU",
            "SiLU",
            "ReLU",
            "Sigmoid",
            "Tanh",
            "Softmax",
            "LogSoftmax",
            "LayerNorm",
            "Dropout",
            "Identity",
            "Softplus",
            "Mish",
            "Hardtanh",
        )
        if hasattr(nn, n)
    )


class CallHandlers:
    """Tracer methods: calls, inlining and nn.Module calls."""

    # ------------------------------------------------------------------ calls

    def op_CALL(self, f, ins):
        n = ins.arg
        args = self.pop(n)
        callable_, first = self.pop(), self.pop()
        if first is not NULL:  # [method, self, args] form
            callable_, args = first, [callable_] + args
        kwargs = {}
        if f.kw_names:
            k = len(f.kw_names)
            kwargs = dict(zip(f.kw_names, args[len(args) - k :]))
            args = args[: len(args) - k]
            f.kw_names = None
        self.push(self.call_var(callable_, args, kwargs))

    def op_CALL_FUNCTION_EX(self, f, ins):
        kw = unlazy(self.pop()) if ins.arg & 1 else DictVar({})
        args = self.unpack(self.pop())
        fn = self.pop()
        if f.stack and f.stack[-1] is NULL:
            self.pop()
        if not isinstance(kw, DictVar):
            self.unsupported("**kwargs from %s" % describe(kw))
        self.push(self.call_var(fn, args, dict(kw.items)))

    def op_MAKE_FUNCTION(self, f, ins):
        code = self.py(self.pop())
        closure = tuple(self.pop().items) if ins.arg & 0x08 else ()
        if ins.arg & 0x04:
            self.pop()
        kwdefaults = {}
        if ins.arg & 0x02:
            kwd = unlazy(self.pop())
            kwdefaults = dict(kwd.items) if isinstance(kwd, DictVar) else {k: PyVar(v) for k, v in self.py(kwd).items()}
        defaults = tuple(self.unpack(self.pop())) if ins.arg & 0x01 else ()  # (0,): a constant tuple
        self.push(FuncVar(code, f.f_globals, defaults, kwdefaults, closure, code.co_name))

    def call_var(self, fn, args, kwargs):
        fn = unlazy(fn)
        if isinstance(fn, MethodVar):
            return self.call_var(fn.fn, [fn.self_var] + list(args), kwargs)
        if isinstance(fn, FuncVar):
            return self.inline(fn.code, fn.f_globals, fn.closure, fn.defaults, fn.kwdefaults, args, kwargs)
        if isinstance(fn, ArrayMethodVar):
            return self.array_method(fn.array, fn.name, args, kwargs)
        if not isinstance(fn, PyVar):
            self.unsupported("call of %s" % describe(fn))
        v = fn.value
        if v in _CONTAINER_METHODS if _hashable(v) else False:
            return self.container_method(v, args, kwargs)
        if torch is not None and isinstance(v, torch.nn.Module):
            return self.module_call(fn, args, kwargs)
        if (
            isinstance(v, types.BuiltinFunctionType)
            and getattr(v, "__module__", None) == "builtins"
            or v
            in (range, enumerate, zip, reversed, int, float, bool, str, tuple, list, dict, type, slice, isinstance, len)
        ):
            return self.builtin_call(v, args, kwargs)
        if NP.is_numpy_callable(v):
            return self.numpy_call(v, args, kwargs)
        if torch is not None and _is_torch_callable(v):
            from . import torch_ops

            return torch_ops.call(self, v, args, kwargs)
        if isinstance(v, types.FunctionType):
            cells = tuple(
                CellVar(loader=_cell_loader(self, c, S.CellSource(c, "%s.<cell %s>" % (v.__qualname__, n))))
                for n, c in zip(v.__code__.co_freevars, v.__closure__ or ())
            )
            defaults = self.function_defaults(v, fn.source, "__defaults__")
            kwd = self.function_defaults(v, fn.source, "__kwdefaults__")
            return self.inline(v.__code__, v.__globals__, cells, defaults, kwd, args, kwargs)
        if isinstance(v, types.MethodType) and isinstance(v.__func__, types.FunctionType):
            # a bound method held somewhere (scale = obj.scale): its function and its object are
            # read through it, so rebinding it or changing the object is seen
            src = fn.source
            func = self.wrap(v.__func__, S.SlotAttrSource(src, "__func__") if src else None)
            obj = self.wrap(v.__self__, S.SlotAttrSource(src, "__self__") if src else None)
            return self.call_var(func, [obj] + list(args), kwargs)
        if _hashable(v) and v in FLOAT_RESULT and not kwargs and any(isinstance(unlazy(a), ScalarVar) for a in args):
            r = self.scalar_op(v, fn_name(v), [unlazy(a) for a in args])  # math.sqrt(lr)
            if r is not None:
                return r
        mod = (getattr(v, "__module__", None) or "").split(".")[0]
        if mod in FOLDABLE_MODULES and not any_array(args, kwargs):
            return self.fold(v, args, kwargs)
        if isinstance(v, type):
            self.unsupported("constructing an instance of %s is not supported" % v.__qualname__)
        if isinstance(v, (types.BuiltinMethodType, types.MethodWrapperType)):
            owner = getattr(v, "__self__", None)
            if type(owner) in SCALARS or type(owner) is tuple:
                return self.fold(v, args, kwargs)
        self.unsupported("call to %s %s is not supported" % (_kind_name(v), fn_name(v)))

    def function_defaults(self, fn, src, name):
        """fn.__defaults__ (a tuple) or fn.__kwdefaults__ (a dict) as lazy Vars: a default the
        call uses is read through fn (src) and guarded then, so assigning fn.__defaults__ later
        is seen; the defaults a call never uses are not guarded."""
        values = getattr(fn, name)
        empty = () if name == "__defaults__" else {}
        if not values:
            return empty
        if src is None:
            return (
                type(empty)((k, self.wrap(d, None)) for k, d in values.items())
                if isinstance(values, dict)
                else tuple(self.wrap(d, None) for d in values)
            )
        fsrc, shape = S.FuncAttrSource(src, name), []

        def loader(key):
            def load():
                if not shape:  # the first default used: the tuple or dict itself
                    shape.append(True)
                    self.guard(fsrc, "type", type(values))
                    self.guard(fsrc, "len", len(values))
                return self.wrap(values[key], S.ItemSource(fsrc, key))

            return load

        if isinstance(values, dict):
            return {k: Lazy(loader(k)) for k in values}
        return tuple(Lazy(loader(i)) for i in range(len(values)))

    def inline(self, code, f_globals, closure, defaults, kwdefaults, args, kwargs):
        if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):
            self.unsupported("generator/coroutine function %s is not supported" % code.co_name)
        depth, p = 0, self.frame
        while p is not None:
            depth, p = depth + 1, p.parent
        if depth > 40:
            self.unsupported("inlining deeper than 40 frames (recursion?)")
        dummy = types.FunctionType(
            code, {}, code.co_name, defaults or None, tuple(types.CellType() for _ in code.co_freevars)
        )
        dummy.__kwdefaults__ = dict(kwdefaults) or None
        try:
            bound = inspect.signature(dummy).bind(*args, **kwargs)
        except TypeError as e:
            self.unsupported("TypeError while tracing a call to %s: %s" % (code.co_name, e))
        bound.apply_defaults()
        builtins_ = f_globals.get("__builtins__", _builtins)
        frame = Frame(code, f_globals, builtins_ if isinstance(builtins_, dict) else vars(builtins_), self.frame)
        for name, value in bound.arguments.items():
            if name.startswith("implicit") and name not in code.co_varnames:
                name = "." + name[len("implicit") :]  # inspect renames comprehension args
            if (
                isinstance(value, tuple)
                and code.co_flags & 0x04
                and name == code.co_varnames[code.co_argcount + code.co_kwonlyargcount]
            ):
                value = TupleVar(value)
            elif isinstance(value, dict) and code.co_flags & 0x08:
                value = DictVar(value)
            frame.locals[name] = value
        for name, cell in zip(code.co_freevars, closure):
            frame.cells[name] = cell
        return self.run_frame(frame)

    def inline_forward(self, fwd, mod_var, args, kwargs):
        """A module's forward function, inlined with the module as its self."""
        defaults = tuple(self.wrap(d, None) for d in (fwd.__defaults__ or ()))
        return self.inline(fwd.__code__, fwd.__globals__, (), defaults, {}, [mod_var] + list(args), kwargs)

    def module_call(self, mod_var, args, kwargs):
        mod = mod_var.value
        m = torch.nn.modules.module
        if (
            mod._forward_hooks
            or mod._forward_pre_hooks
            or mod._backward_hooks
            or m._global_forward_hooks
            or m._global_forward_pre_hooks
            or m._global_backward_hooks
        ):
            self.unsupported("nn.Module hooks are not supported")
        if (
            isinstance(mod, torch.nn.modules.dropout._DropoutNd)
            and mod.training
            and mod.p > 0
            and type(mod) is not torch.nn.Dropout
        ):
            # Dropout1d/2d/3d, AlphaDropout, ...: as an extern call its eager example would draw
            # from the RNG while tracing (nn.Dropout is inlined: F.dropout, see torch_ops.call)
            self.unsupported("%s in training mode is random (hint: model.eval())" % type(mod).__name__)
        fwd = type(mod).forward
        if getattr(mod, "inplace", False) is True and (type(mod).__module__ or "").startswith("torch.nn"):
            # nn.ReLU/LeakyReLU/ELU/...(inplace=True): its forward, inlined, calls F.<act>(x, ...,
            # inplace=True), traced in place where x is no input (torch_ops._inplace_call). As a
            # module call, its eager example while tracing would update the input it is given, and
            # the call would then apply it a second time
            from .torch_ops import _INPLACE_ACTIVATIONS

            if type(mod).__name__.lower() not in {a.replace("_", "") for a in _INPLACE_ACTIVATIONS}:
                self.unsupported("%s(inplace=True) updates its input in place" % type(mod).__name__)
            return self.inline_forward(fwd, mod_var, args, kwargs)
        if type(mod) is torch.nn.Sequential and len(args) == 1 and not kwargs:
            # its children one after the other: each is inlined, traced or called on its own
            if mod_var.source is not None:
                self.guard(S.DictAttrSource(mod_var.source, "_modules"), "len", len(mod._modules))
            x = args[0]
            for name in mod._modules:
                x = self.call_var(self.module_child(mod_var, name), [x], {})
            return x
        if (
            self.fx is not None
            and type(mod) not in _inline_torch_modules()
            and (type(mod).__module__ or "").startswith("torch.")
        ):
            return self.fx_module_call(mod_var, args, kwargs)
        if (
            self.fx is None
            and type(mod) in _batch_norms()
            and not mod.training
            and mod_var.source is not None
            and mod.running_mean is not None
            and mod.running_var is not None
            and len(args) == 1
            and not kwargs
            and isinstance(unlazy(args[0]), ArrayVar)
            and unlazy(args[0]).kind == "torch"
            and unlazy(args[0]).ndim >= 2
            and unlazy(args[0]).example.dtype in (torch.float32, torch.float64)
            and all(
                t is None or t.dtype == unlazy(args[0]).example.dtype
                for t in (mod.running_mean, mod.running_var, mod.weight, mod.bias)
            )
        ):
            # eval mode (guarded), float32/float64 throughout (the dtypes are guarded): a
            # per-channel scale and shift, traced, so it fuses with the ops around it (torch's
            # CPU kernel computes half in float32). Training mode updates its statistics: one
            # extern call
            from .torch_ops import batch_norm_eval

            return self.inline(
                batch_norm_eval.__code__, batch_norm_eval.__globals__, (), (), {}, [mod_var] + list(args), {}
            )
        if type(mod) in _inline_torch_modules():
            # torch's own forward, inlined so its ops fuse (nn.GELU -> the core's gelu)
            return self.inline_forward(fwd, mod_var, args, kwargs)
        return self.call_var(PyVar(fwd), [mod_var] + list(args), kwargs)

    def container_method(self, fn, args, kwargs):
        self_var = unlazy(args[0])
        rest = args[1:]
        if fn in (list.append, list.extend, list.insert, list.pop, list.clear, list.reverse):
            lst = self.local_list(self_var)
            if fn is list.append:
                lst.items.append(rest[0])
            elif fn is list.extend:
                lst.items.extend(self.unpack(rest[0]))
            elif fn is list.insert:
                lst.items.insert(self.py(rest[0]), rest[1])
            elif fn is list.pop:
                return lst.items.pop(*[self.py(r) for r in rest])
            elif fn is list.clear:
                lst.items.clear()
            else:
                lst.items.reverse()
            return PyVar(None)
        if fn in (dict.items, dict.keys, dict.values, dict.get):
            if not isinstance(self_var, DictVar):
                self.unsupported("dict method on %s" % describe(self_var))
            if fn is dict.items:
                return ListVar([TupleVar([PyVar(k), v]) for k, v in self_var.items.items()])
            if fn is dict.keys:
                return ListVar([PyVar(k) for k in self_var.items])
            if fn is dict.values:
                return ListVar(list(self_var.items.values()))
            key = self.py(rest[0])
            return self_var.items.get(key, rest[1] if len(rest) > 1 else PyVar(None))
        if fn is dict.update:
            self.local_dict(self_var).items.update(unlazy(rest[0]).items)
            return PyVar(None)
        if fn in (list.index, list.count, tuple.index, tuple.count):
            return self.fold(fn, [self_var] + list(rest), kwargs)
        self.unsupported("container method %s" % fn_name(fn))

    def builtin_call(self, fn, args, kwargs):
        args = [unlazy(a) for a in args]
        if fn is print:
            self.unsupported("call to builtin print is not supported")
        if fn is len:
            a = args[0]
            if isinstance(a, ArrayVar):
                return PyVar(self.dim(a, 0))
            if isinstance(a, ShapeVar):
                return PyVar(a.array.ndim)
            if isinstance(a, DictVar):
                return PyVar(len(a.items))
            return PyVar(len(self.unpack(a)))
        if isinstance(args[0] if args else None, ScalarVar) and len(args) <= 2:
            a = args[0]  # a float or NumPy float, by its type guard; its value unread
            if fn is float and len(args) == 1 and type(a.value) is float:
                return a
            if fn in (float, abs) and len(args) == 1:
                r = self.scalar_op(fn, fn.__name__, args)  # float(np.float32(x)): a Python float
                if r is not None:
                    return r
            if fn is type and len(args) == 1:
                return PyVar(type(a.value))
            if fn is isinstance:
                return PyVar(isinstance(a.value, self.py(args[1])))
        if fn is isinstance:
            a = args[0]
            ex = a.example if isinstance(a, ArrayVar) else None
            if ex is not None:
                return PyVar(isinstance(ex, self.py(args[1])))
            if isinstance(a, (TupleVar, ListVar, DictVar)):
                return PyVar(isinstance({TupleVar: (), ListVar: [], DictVar: {}}[type(a)], self.py(args[1])))
        if fn is type and len(args) == 1:
            a = args[0]
            if isinstance(a, ArrayVar):
                return PyVar(type(a.example))
            if isinstance(a, (TupleVar, ListVar, DictVar)):
                return PyVar({TupleVar: tuple, ListVar: list, DictVar: dict}[type(a)])
        if fn in (tuple, list) and len(args) == 1:
            return (TupleVar if fn is tuple else ListVar)(self.unpack(args[0]))
        if fn in (tuple, list) and not args:
            return (TupleVar if fn is tuple else ListVar)([])
        if fn is dict and not args:
            return DictVar({k: v for k, v in kwargs.items()})
        if fn is enumerate:
            start = self.py(args[1]) if len(args) > 1 else self.py(kwargs.get("start", PyVar(0)))
            return ListVar([TupleVar([PyVar(i + start), v]) for i, v in enumerate(self.unpack(args[0]))])
        if fn is zip:
            cols = [self.unpack(a) for a in args]
            return ListVar([TupleVar(list(t)) for t in zip(*cols)])
        if fn is reversed:
            return ListVar(self.unpack(args[0])[::-1])
        if fn is iter and len(args) == 1:
            return IterVar(self.unpack(args[0]))
        if fn is next and isinstance(args[0], IterVar):
            it = args[0]
            if it.pos >= len(it.items):
                self.unsupported("StopIteration while tracing")
            it.pos += 1
            return it.items[it.pos - 1]
        if fn is getattr and len(args) in (2, 3):
            name = self.py(args[1])
            try:
                return self.getattr_var(args[0], name)
            except AbsentAttribute:
                if len(args) == 3:
                    return args[2]  # absent (guarded by getattr_var where it can be)
                raise
        if fn is hasattr:
            o = unlazy(args[0])
            if isinstance(o, ArrayVar):
                return PyVar(hasattr(o.example, self.py(args[1])))
            if isinstance(o, PyVar) and o.source is not None and len(args) == 2:
                name = self.py(args[1])
                try:
                    self.getattr_var(o, name)  # guards what it finds, or the absence
                    return PyVar(True)
                except AbsentAttribute:
                    return PyVar(False)
        if (
            fn in (sum, max, min, abs)
            and any_array(args, kwargs)
            or fn is sum
            and len(args) == 1
            and any(isinstance(unlazy(x), ArrayVar) for x in self.unpack(args[0]))
        ):
            return self.builtin_array(fn, args, kwargs)
        if fn in (float, int, bool, complex) and any_array(args, kwargs):
            self.unsupported("data-dependent %s() of an array value" % fn.__name__)
        if fn in FOLDABLE_BUILTINS:
            return self.fold(fn, args, kwargs)
        self.unsupported("call to builtin %s is not supported" % fn_name(fn))

    def builtin_array(self, fn, args, kwargs):
        if fn is abs and len(args) == 1:
            return self.array_op(operator.abs, "abs", args, "abs")
        if fn is sum and len(args) <= 2 and not kwargs:
            items = self.unpack(args[0])
            acc = args[1] if len(args) > 1 else PyVar(0)
            for x in items:
                acc = self.binary(acc, x, "+", False)
            return acc
        self.unsupported("builtin %s on arrays (data-dependent comparison)" % fn.__name__)

    def numpy_call(self, fn, args, kwargs):
        if NP.writes_into(fn, len(args), kwargs):
            self.unsupported("%s(out=...) writes into an array (side effect)" % fn_name(fn))
        if not NP.is_pure(fn):
            self.unsupported("call to %s is not supported (not a pure function)" % fn_name(fn))
        if not any_array(args, kwargs):
            if (
                isinstance(fn, type)
                and issubclass(fn, NP.FOLDABLE_CLASSES)
                or fn in (np.result_type, np.promote_types, np.can_cast, np.dtype)
            ):
                return self.fold(fn, args, kwargs)
            return self.fold(fn, args, kwargs)
        kind = kind_of(args, kwargs)
        if kind == "torch":
            self.unsupported("NumPy function %s on a torch tensor" % fn_name(fn))
        nargs = len(args)
        if fn in NP.UNARY and nargs == 1 and not kwargs:
            return self.array_call(fn, args, kwargs, NP.UNARY[fn])
        if fn in NP.BINARY and nargs == 2 and not kwargs:
            return self.array_call(fn, args, kwargs, NP.BINARY[fn])
        if fn is np.where and nargs == 3 and not kwargs:
            return self.array_call(fn, args, kwargs, "where")
        if fn is np.clip and nargs == 3 and not kwargs:
            lo, hi = unlazy(args[1]), unlazy(args[2])
            if not (isinstance(lo, PyVar) and lo.value is None) and not (isinstance(hi, PyVar) and hi.value is None):
                return self.array_call(fn, args, kwargs, "clamp")
        if fn in (np.round, np.around) and nargs == 1 and not kwargs:
            return self.array_call(fn, args, kwargs, "round")
        if fn in NP.REDUCTION_FNS:
            name = NP.REDUCTION_FNS[fn]
            try:
                b = inspect.signature(fn).bind(*args, **kwargs)
                params = {k: self.py(v) for k, v in b.arguments.items() if k != "a"}
            except (TypeError, ValueError, Unsupported):
                params = None
            if (
                params is not None
                and "a" in b.arguments
                and not any(v is not np._NoValue for k, v in params.items() if k in ("where", "initial"))
            ):
                params = {k: v for k, v in params.items() if v is not np._NoValue}
                attrs = NP.reduction_attrs(name, **params)
                if attrs is not None:
                    return self.array_call(fn, args, kwargs, NP.REDUCTIONS[name], attrs, core_args=[b.arguments["a"]])
        if fn is np.asarray and nargs == 1 and not kwargs and isinstance(unlazy(args[0]), ArrayVar):
            return unlazy(args[0])
        return self.array_call(fn, args, kwargs)

    def array_method(self, arr, name, args, kwargs):
        what = "Tensor" if arr.kind == "torch" else "ndarray"
        if name in NP.INPLACE_METHODS:
            if len(args) != 1 or kwargs:
                self.unsupported("%s.%s with %d arguments" % (what, name, len(args) + len(kwargs)))
            return self.binary(arr, args[0], NP.INPLACE_METHODS[name], True)
        if name in NP.MUTATING_DUNDERS or what == "ndarray" and name in NP.MUTATING_METHODS:
            self.unsupported("%s.%s mutates the array (side effect)" % (what, name))
        if arr.kind == "torch":
            from . import torch_ops

            return torch_ops.method(self, arr, name, args, kwargs)
        if name in NP.REDUCTIONS:
            return self.numpy_call(getattr(np, name), [arr] + list(args), kwargs)
        if name == "astype" and len(args) == 1 and not kwargs:
            dt = np.dtype(self.py(args[0]))
            return self.array_call(lambda x: x.astype(dt), [arr], {}, "cast", {"dtype": dt.name})
        if name in ("clip", "round") and hasattr(np, name):
            return self.numpy_call(getattr(np, name), [arr] + list(args), kwargs)
        if name in ("item", "tolist", "tobytes", "__bool__", "__int__", "__float__"):
            self.unsupported("data-dependent ndarray.%s()" % name)
        if not hasattr(np.ndarray, name):
            self.unsupported("ndarray has no attribute %r" % name)
        if hasattr(np, name) and NP.writes_into(getattr(np, name), 1 + len(args), kwargs):
            self.unsupported("ndarray.%s(out=...) writes into an array (side effect)" % name)  # a.clip(0, 1, o)
        return self.array_call(lambda x, *a, **k: getattr(x, name)(*a, **k), [arr] + list(args), kwargs)
