"""Trace stage, opcode handlers: one Tracer method per bytecode instruction (op_<OPNAME>) and
what they share: loads and stores, containers, jumps, operators, subscripts and attributes.
In: the Frame and the instruction; out: the Frame's stack and locals, updated."""

import dis
import inspect
import operator
import sys
import threading
import types

import numpy as np

from . import guards as G
from . import helpers as H
from . import numpy_ops as NP
from . import sources as S
from .helpers import SCALARS, Lazy, describe, fn_name, is_array, kind_of, unlazy
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
    Var,
    AbsentAttribute,
)

torch = H.reads_torch(__name__)  # bound by helpers.sync_torch()


class _UnboundMarker(Var):
    pass


_UNBOUND = _UnboundMarker()


def _plain_class_attr(v):
    """A class attribute that reads back as it is stored: data, not a descriptor (a function,
    property, staticmethod or classmethod is bound or called on the way)."""
    return v is not S.MISSING and not hasattr(type(v), "__get__")


class OpcodeHandlers:
    """Tracer methods: the bytecode instructions but calls."""

    # ------------------------------------------------------------------ opcodes: loads and stores

    def op_RESUME(self, f, ins):
        pass

    def op_NOP(self, f, ins):
        pass

    def op_PRECALL(self, f, ins):
        pass

    def op_COPY_FREE_VARS(self, f, ins):
        pass

    def op_MAKE_CELL(self, f, ins):
        name = ins.argval
        if name not in f.cells:
            init = f.locals.pop(name, None)
            f.cells[name] = CellVar(unlazy(init) if init is not None else None)

    def op_LOAD_CONST(self, f, ins):
        self.push(PyVar(ins.argval))

    def op_RETURN_CONST(self, f, ins):
        return (PyVar(ins.argval),)

    def op_RETURN_VALUE(self, f, ins):
        return (self.pop(),)

    def op_LOAD_FAST(self, f, ins):
        name = ins.argval
        if name in f.cells:  # 3.12 comprehension cells
            return self.op_LOAD_DEREF(f, ins)
        if name not in f.locals:
            self.unsupported("local variable %r read before assignment" % name)
        v = f.locals[name]
        if isinstance(v, Lazy):
            v = f.locals[name] = v.get()
        self.push(v)

    op_LOAD_FAST_CHECK = op_LOAD_FAST

    def op_LOAD_FAST_AND_CLEAR(self, f, ins):
        v = f.locals.pop(ins.argval, None)
        self.push(unlazy(v) if v is not None else _UNBOUND)

    def op_STORE_FAST(self, f, ins):
        v = self.pop()
        if v is _UNBOUND:
            f.locals.pop(ins.argval, None)
        else:
            f.locals[ins.argval] = v

    def op_DELETE_FAST(self, f, ins):
        f.locals.pop(ins.argval, None)

    def op_LOAD_DEREF(self, f, ins):
        cell = f.cells.get(ins.argval)
        if cell is None or cell.contents is None:
            self.unsupported("free variable %r read before assignment" % ins.argval)
        self.push(cell.contents)

    def op_STORE_DEREF(self, f, ins):
        cell = f.cells.get(ins.argval)
        if cell is None:
            cell = f.cells[ins.argval] = CellVar()
        if cell.external:
            self.unsupported("store to a variable of an enclosing function (nonlocal %s) is not supported" % ins.argval)
        cell.contents = self.pop()

    def op_LOAD_CLOSURE(self, f, ins):
        name = ins.argval
        if name not in f.cells:
            f.cells[name] = CellVar()
        self.push(f.cells[name])

    def op_LOAD_GLOBAL(self, f, ins):
        name = ins.argval
        if (ins.arg & 1) and sys.version_info >= (3, 11):
            self.push(NULL)
        self.push(self.load_global(f, name))

    def load_global(self, f, name):
        top_globals = f.f_globals is self.f_globals
        if name in f.f_globals:
            value = f.f_globals[name]
        elif name in f.f_builtins:
            value = f.f_builtins[name]
        else:
            self.unsupported("name %r is not defined" % name)
        if top_globals:
            return self.wrap(value, S.GlobalSource(name))
        # a function inlined from another module: guard the name in that module's globals
        # (or its builtins), read through the dict itself, which the guard program holds
        d = f.f_globals if name in f.f_globals else f.f_builtins
        if not isinstance(d, dict):
            d = vars(d)
        label = "%s.G" % d.get("__name__", "?") if d is f.f_globals else "builtins"
        if type(value) is np.ndarray or (torch is not None and isinstance(value, torch.Tensor)):
            self.unsupported("array global of another module is not supported")
        return self.wrap(value, S.ItemSource(S.ConstSource(d, label), name))

    def op_STORE_GLOBAL(self, f, ins):
        self.unsupported("store to global %r is not supported (side effect)" % ins.argval)

    def op_PUSH_NULL(self, f, ins):
        self.push(NULL)

    def op_POP_TOP(self, f, ins):
        self.pop()

    def op_COPY(self, f, ins):
        self.push(f.stack[-ins.arg])

    def op_SWAP(self, f, ins):
        st = f.stack
        st[-1], st[-ins.arg] = st[-ins.arg], st[-1]

    def op_KW_NAMES(self, f, ins):
        f.kw_names = f.code.co_consts[ins.arg]

    # ------------------------------------------------------------------ building

    def op_BUILD_TUPLE(self, f, ins):
        self.push(TupleVar(self.pop(ins.arg)))

    def op_BUILD_LIST(self, f, ins):
        self.push(ListVar(self.pop(ins.arg)))

    def op_BUILD_MAP(self, f, ins):
        items = self.pop(2 * ins.arg)
        self.push(DictVar({self.py(items[i], "dict key"): items[i + 1] for i in range(0, len(items), 2)}))

    def op_BUILD_CONST_KEY_MAP(self, f, ins):
        keys = self.py(self.pop())
        vals = self.pop(ins.arg)
        self.push(DictVar(dict(zip(keys, vals))))

    def op_BUILD_SLICE(self, f, ins):
        parts = [self.py(v, "slice bound") for v in self.pop(ins.arg)]
        self.push(PyVar(slice(*parts)))

    def op_BUILD_STRING(self, f, ins):
        self.push(PyVar("".join(self.py(v) for v in self.pop(ins.arg))))

    def op_FORMAT_VALUE(self, f, ins):
        spec = self.py(self.pop()) if (ins.arg & 0x04) else ""
        v = self.py(self.pop(), "formatted value")
        conv = ins.arg & 0x03
        v = {0: v, 1: str(v), 2: repr(v), 3: ascii(v)}[conv] if conv else v
        self.push(PyVar(format(v, spec)))

    def op_LIST_APPEND(self, f, ins):
        v = self.pop()
        self.local_list(f.stack[-ins.arg]).items.append(v)

    def op_LIST_EXTEND(self, f, ins):
        v = self.pop()
        self.local_list(f.stack[-ins.arg]).items.extend(self.unpack(v))

    def op_SET_UPDATE(self, f, ins):
        self.unsupported("sets are not supported")

    op_BUILD_SET = op_SET_UPDATE

    def op_LIST_TO_TUPLE(self, f, ins):
        self.push(TupleVar(self.pop().items))

    def op_CALL_INTRINSIC_1(self, f, ins):
        name = dis._intrinsic1_descs[ins.arg] if hasattr(dis, "_intrinsic1_descs") else str(ins.argrepr)
        if name == "INTRINSIC_LIST_TO_TUPLE":
            self.push(TupleVar(self.pop().items))
        elif name == "INTRINSIC_UNARY_POSITIVE":
            v = self.pop()
            self.push(self.unary(v, operator.pos, None, "+"))
        else:
            self.unsupported("intrinsic %s is not supported" % name)

    def op_MAP_ADD(self, f, ins):
        v = self.pop()
        k = self.py(self.pop(), "dict key")
        self.local_dict(f.stack[-ins.arg]).items[k] = v

    def op_DICT_UPDATE(self, f, ins):
        v = unlazy(self.pop())
        if not isinstance(v, DictVar):
            self.unsupported("dict update from %s" % type(v).__name__)
        self.local_dict(f.stack[-ins.arg]).items.update(v.items)

    op_DICT_MERGE = op_DICT_UPDATE

    def local_list(self, v):
        v = unlazy(v)
        if not isinstance(v, ListVar):
            self.unsupported("list operation on %s" % type(v).__name__)
        if v.source is not None:
            self.unsupported("mutation of a list from outside the frame (side effect)")
        return v

    def local_dict(self, v):
        v = unlazy(v)
        if not isinstance(v, DictVar):
            self.unsupported("dict operation on %s" % type(v).__name__)
        if v.source is not None:
            self.unsupported("mutation of a dict from outside the frame (side effect)")
        return v

    def unpack(self, v):
        """Items of an iterable Var as a list of Vars."""
        v = unlazy(v)
        if isinstance(v, (TupleVar, ListVar)):
            return list(v.items)
        if isinstance(v, DictVar):
            return [PyVar(k) for k in v.items]
        if isinstance(v, IterVar):
            out = v.items[v.pos :]
            v.pos = len(v.items)
            return out
        if isinstance(v, ShapeVar):
            return [PyVar(x) for x in self.py(v)]
        if isinstance(v, PyVar):
            val = v.value
            if torch is not None and isinstance(val, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)):
                if v.source is not None:  # a module appended later must recompile
                    self.guard(S.DictAttrSource(v.source, "_modules"), "len", len(val._modules))
                if isinstance(val, torch.nn.ModuleDict):
                    return [PyVar(k) for k in val._modules]
                return [self.module_child(v, k) for k in val._modules]
            if isinstance(val, (range, str, bytes)) or type(val) is tuple:
                return [PyVar(x) for x in val]  # a tuple constant: for k in (1.0, 2.0)
        if isinstance(v, ArrayVar):
            self.unsupported("iteration over an array (data-dependent length)")
        self.unsupported("iteration over %s is not supported" % describe(v))

    def op_UNPACK_SEQUENCE(self, f, ins):
        items = self.unpack(self.pop())
        if len(items) != ins.arg:
            self.unsupported("unpacking %d values into %d names" % (len(items), ins.arg))
        for v in reversed(items):
            self.push(v)

    def op_UNPACK_EX(self, f, ins):
        items = self.unpack(self.pop())
        before, after = ins.arg & 0xFF, ins.arg >> 8
        if len(items) < before + after:
            self.unsupported("not enough values to unpack")
        mid = ListVar(items[before : len(items) - after])
        for v in reversed(items[len(items) - after :]):
            self.push(v)
        self.push(mid)
        for v in reversed(items[:before]):
            self.push(v)

    # ------------------------------------------------------------------ control flow

    def op_JUMP_FORWARD(self, f, ins):
        self.jump(f, ins.argval)

    op_JUMP_BACKWARD = op_JUMP_FORWARD
    op_JUMP_BACKWARD_NO_INTERRUPT = op_JUMP_FORWARD

    def _pop_jump(self, f, ins):
        name = ins.opname.replace("FORWARD_", "").replace("BACKWARD_", "")
        v = self.pop()
        if name.endswith("IF_NONE") or name.endswith("IF_NOT_NONE"):
            u = unlazy(v)
            is_none = isinstance(u, PyVar) and u.value is None
            take = is_none if name.endswith("IF_NONE") else not is_none
        else:
            t = self.truth(v, ins.opname)
            take = t if name.endswith("TRUE") else not t
        if take:
            self.jump(f, ins.argval)

    op_POP_JUMP_IF_FALSE = op_POP_JUMP_IF_TRUE = op_POP_JUMP_IF_NONE = op_POP_JUMP_IF_NOT_NONE = _pop_jump
    op_POP_JUMP_FORWARD_IF_FALSE = op_POP_JUMP_FORWARD_IF_TRUE = _pop_jump
    op_POP_JUMP_FORWARD_IF_NONE = op_POP_JUMP_FORWARD_IF_NOT_NONE = _pop_jump
    op_POP_JUMP_BACKWARD_IF_FALSE = op_POP_JUMP_BACKWARD_IF_TRUE = _pop_jump
    op_POP_JUMP_BACKWARD_IF_NONE = op_POP_JUMP_BACKWARD_IF_NOT_NONE = _pop_jump

    def _jump_or_pop(self, f, ins):
        t = self.truth(f.stack[-1], ins.opname)
        if t == ins.opname.startswith("JUMP_IF_TRUE"):
            self.jump(f, ins.argval)
        else:
            self.pop()

    op_JUMP_IF_TRUE_OR_POP = op_JUMP_IF_FALSE_OR_POP = _jump_or_pop

    def op_GET_ITER(self, f, ins):
        v = unlazy(self.pop())
        if isinstance(v, IterVar):
            self.push(v)
        else:
            self.push(IterVar(self.unpack(v)))

    def op_FOR_ITER(self, f, ins):
        it = f.stack[-1]
        if not isinstance(it, IterVar):
            self.unsupported("for loop over %s" % describe(it))
        if it.pos < len(it.items):
            self.push(it.items[it.pos])
            it.pos += 1
            return
        self.pop()
        self.jump(f, ins.argval)
        if f.instrs[f.pc].opname == "END_FOR":  # 3.12: skip END_FOR
            f.pc += 1

    def op_END_FOR(self, f, ins):
        self.pop(2)

    def op_GET_LEN(self, f, ins):
        self.push(PyVar(len(self.unpack(f.stack[-1]))))

    # ------------------------------------------------------------------ unsupported on purpose

    def op_BEFORE_WITH(self, f, ins):
        self.unsupported("with-blocks are not supported (BEFORE_WITH)")

    def op_RAISE_VARARGS(self, f, ins):
        self.unsupported("raise is not supported (RAISE_VARARGS)")

    def op_RETURN_GENERATOR(self, f, ins):
        self.unsupported("generators are not supported")

    def op_IMPORT_NAME(self, f, ins):
        self.unsupported("import inside the traced function is not supported")

    def op_LOAD_ASSERTION_ERROR(self, f, ins):
        self.push(PyVar(AssertionError))

    # ------------------------------------------------------------------ operators

    def op_BINARY_OP(self, f, ins):
        b, a = self.pop(), self.pop()
        sym = ins.argrepr
        inplace = sym.endswith("=")
        self.push(self.binary(a, b, sym[:-1] if inplace else sym, inplace))

    def op_COMPARE_OP(self, f, ins):
        b, a = self.pop(), self.pop()
        self.push(self.binary(a, b, ins.argval, False))

    def binary(self, a, b, sym, inplace):
        a, b = unlazy(a), unlazy(b)
        core_op, fn = NP.OPERATORS[sym]
        if not isinstance(a, ArrayVar) and not isinstance(b, ArrayVar):
            if isinstance(a, ScalarVar) or isinstance(b, ScalarVar):
                r = self.scalar_op(fn, sym, [a, b])
                if r is not None:
                    return r
            if sym == "+" and type(a) is type(b) and isinstance(a, (TupleVar, ListVar)):
                if inplace and isinstance(a, ListVar):
                    self.local_list(a).items.extend(b.items)
                    return a
                return type(a)(a.items + b.items)
            if sym == "*" and isinstance(a, (TupleVar, ListVar)):
                return type(a)(a.items * self.py(b))
            if inplace and isinstance(a, ListVar):
                self.local_list(a).items.extend(self.unpack(b))
                return a
            return self.fold(fn, [a, b], {})
        if inplace and isinstance(a, ArrayVar) and self.fx is not None:
            if a.source is not None or not a.fresh or a.escaped:
                self.unsupported(
                    "in-place %s= on a tensor that may be shared (an input or a view) is not supported" % sym
                )
            new = self.array_op(fn, core_op, [a, b], sym)  # a fresh tensor: rebind it
            a.example, a.fx = new.example, new.fx
            return a
        if inplace and isinstance(a, ArrayVar):
            if a.source is not None or not a.fresh or a.escaped:
                self.unsupported(
                    "in-place %s= on an array that may be shared (an input or a view) is not supported" % sym
                )
            ifn = getattr(operator, "i" + fn.__name__.strip("_"))
            new = self.array_op(
                lambda x, y: ifn(x.clone() if a.kind == "torch" else x.copy(), y), core_op, [a, b], sym + "="
            )
            a.value, a.example = new.value, new.example
            return a
        return self.array_op(fn, core_op, [a, b], sym)

    def array_op(self, fn, core_op, args, what):
        kind = kind_of(args, {})
        if kind == "torch":
            from . import torch_ops

            return torch_ops.pointwise(self, fn, core_op, args, {})
        return self.array_call(fn, args, {}, core_op)

    def fold(self, fn, args, kwargs):
        """Call fn at trace time on Python values (its result is a constant)."""
        pa = [self.py(a) for a in args]
        pk = {k: self.py(v) for k, v in kwargs.items()}
        try:
            value = fn(*pa, **pk)
        except Exception as e:
            self.unsupported("%s raised %s: %s while tracing" % (fn_name(fn), type(e).__name__, e))
        var = self.wrap_result(value)
        if isinstance(var, PyVar) and hasattr(type(value), "__enter__"):
            var.remake = (fn, pa, pk)  # a context manager is stateful: made afresh per call
        return var

    def wrap_result(self, v):
        if isinstance(v, np.generic) and v.dtype.kind in "biuf":
            return PyVar(v)  # np.float32(0.5): a strongly typed constant, as core ops take it
        if is_array(v):
            self.unsupported("an array computed from Python values only (constant arrays are not supported)")
        if type(v) is tuple:
            return TupleVar([self.wrap_result(x) for x in v])
        if type(v) is list:
            return ListVar([self.wrap_result(x) for x in v])
        return PyVar(v)

    def unary(self, v, fn, core_op, what):
        v = unlazy(v)
        if isinstance(v, ArrayVar):
            return self.array_op(fn, core_op, [v], what)
        if isinstance(v, ScalarVar):
            r = self.scalar_op(fn, what, [v])
            if r is not None:
                return r
        return self.fold(fn, [v], {})

    def op_UNARY_NEGATIVE(self, f, ins):
        self.push(self.unary(self.pop(), operator.neg, "neg", "-"))

    def op_UNARY_INVERT(self, f, ins):
        self.push(self.unary(self.pop(), operator.invert, "bitwise_not", "~"))

    def op_UNARY_NOT(self, f, ins):
        self.push(PyVar(not self.truth(self.pop(), "UNARY_NOT")))

    def op_IS_OP(self, f, ins):
        b, a = unlazy(self.pop()), unlazy(self.pop())
        if isinstance(a, ScalarVar) or isinstance(b, ScalarVar):
            # a float read at each call is a new object at each call (or not): only itself, or a
            # value of another type (its type is guarded), gives the same answer each time
            s, o = (a, b) if isinstance(a, ScalarVar) else (b, a)
            if s is o:
                r = True
            elif not isinstance(o, (PyVar, ScalarVar)) or type(o.value) is not type(s.value):
                r = False
            else:
                self.unsupported("identity (is) of floats read at each call")
        elif isinstance(a, PyVar) and isinstance(b, PyVar):
            va, vb = a.value, b.value
            if (
                a is not b
                and (a.source is not None or b.source is not None)
                and type(va) is type(vb)
                and type(va) in (int, float, complex, str, bytes)
                and va == vb
                and not (type(va) is int and -5 <= va <= 256)
            ):
                # equal numbers or strings, guarded by value: one object at this call, maybe
                # two at the next (only CPython's small ints are always one)
                self.unsupported("identity (is) of equal %s values read from the frame" % type(va).__name__)
            r = va is vb
        else:
            r = a is b
        self.push(PyVar(r != bool(ins.arg)))

    def op_CONTAINS_OP(self, f, ins):
        b, a = unlazy(self.pop()), self.py(self.pop())
        if isinstance(b, DictVar):
            r = a in b.items
        else:
            r = a in [self.py(x) for x in self.unpack(b)] if not isinstance(b, PyVar) else a in b.value
        self.push(PyVar(r != bool(ins.arg)))

    # ------------------------------------------------------------------ subscripts

    def op_BINARY_SUBSCR(self, f, ins):
        k, o = self.pop(), self.pop()
        self.push(self.getitem(o, k))

    def op_BINARY_SLICE(self, f, ins):
        stop, start, o = self.pop(), self.pop(), self.pop()
        self.push(self.getitem(o, PyVar(slice(self.py(start), self.py(stop)))))

    def getitem(self, o, k):
        o, k = unlazy(o), unlazy(k)
        if isinstance(o, ArrayVar):
            return self.array_call(operator.getitem, [o, k], {})
        if isinstance(o, ShapeVar):
            key = self.py(k)
            axes = range(o.array.ndim)[key]
            if isinstance(key, slice):
                return TupleVar([PyVar(self.dim(o.array, a)) for a in axes])
            return PyVar(self.dim(o.array, axes))
        key = self.py(k, "index")
        if isinstance(o, (TupleVar, ListVar)):
            r = o.items[key]
            return type(o)(r) if isinstance(key, slice) else r
        if isinstance(o, DictVar):
            if key not in o.items:
                self.unsupported("KeyError %r while tracing" % (key,))
            return o.items[key]
        if (
            isinstance(o, PyVar)
            and torch is not None
            and isinstance(o.value, (torch.nn.ModuleList, torch.nn.Sequential))
        ):
            names = list(o.value._modules)
            if isinstance(key, slice):
                self.unsupported("slicing an nn.ModuleList/Sequential")
            return self.module_child(o, names[key])
        if isinstance(o, PyVar) and torch is not None and isinstance(o.value, torch.nn.ModuleDict):
            return self.module_child(o, key)
        return self.fold(operator.getitem, [o, k], {})

    def op_STORE_SUBSCR(self, f, ins):
        k, o, v = self.pop(), unlazy(self.pop()), self.pop()
        if isinstance(o, ListVar):
            self.local_list(o).items[self.py(k)] = v
        elif isinstance(o, DictVar):
            self.local_dict(o).items[self.py(k, "dict key")] = v
        elif isinstance(o, ArrayVar):
            self.unsupported("item assignment into an array (in-place update) is not supported")
        else:
            self.unsupported("item assignment into %s (side effect)" % describe(o))

    def op_STORE_SLICE(self, f, ins):
        self.unsupported("slice assignment is not supported")

    def op_DELETE_SUBSCR(self, f, ins):
        self.unsupported("del of an item is not supported")

    def op_STORE_ATTR(self, f, ins):
        self.unsupported("attribute store .%s is not supported (side effect)" % ins.argval)

    # ------------------------------------------------------------------ attributes

    def op_LOAD_ATTR(self, f, ins):
        obj = unlazy(self.pop())
        method = sys.version_info >= (3, 12) and (ins.arg & 1)
        self.load_attr(obj, ins.argval, method)

    def op_LOAD_METHOD(self, f, ins):
        self.load_attr(unlazy(self.pop()), ins.argval, True)

    def load_attr(self, obj, name, method):
        v = self.getattr_var(obj, name)
        if method:
            if isinstance(v, MethodVar):
                self.push(v.fn)
                self.push(v.self_var)
            else:
                self.push(NULL)
                self.push(v)
        else:
            self.push(v)

    def getattr_var(self, obj, name):
        obj = unlazy(obj)
        if isinstance(obj, ArrayVar):
            return self.array_attr(obj, name)
        if isinstance(obj, (ListVar, DictVar, TupleVar)):
            base = {ListVar: list, DictVar: dict, TupleVar: tuple}[type(obj)]
            if not hasattr(base, name):
                raise AbsentAttribute("%s has no attribute %r" % (base.__name__, name), self.frame.user_stack())
            return MethodVar(PyVar(getattr(base, name)), obj)
        if isinstance(obj, FuncVar):
            self.unsupported("attribute of a function made in the trace")
        if isinstance(obj, ScalarVar):
            obj = PyVar(self.py(obj))  # lr.real, lr.is_integer(): of this value
        if not isinstance(obj, PyVar):
            self.unsupported("attribute %r of %s" % (name, describe(obj)))
        value, src = obj.value, obj.source
        if name == "__dict__" and src is not None:
            # a mapping whose items no guard reads (o.__dict__["lr"] = 0.25 later would go unseen)
            self.unsupported("%s.__dict__ is read by Python (hint: read the attribute itself)" % type(value).__name__)
        if isinstance(value, types.ModuleType):
            d = value.__dict__
            if name in d:
                return self.wrap(d[name], S.DictAttrSource(src, name) if src else None, constant=True)
            return self.wrap(getattr(value, name), None)
        if torch is not None and isinstance(value, torch.nn.Module):
            for dname in ("_parameters", "_buffers", "_modules"):
                d = value.__dict__.get(dname)
                if d is not None and name in d:
                    s = S.ItemSource(S.DictAttrSource(src, dname), name) if src else None
                    if d[name] is None:
                        return PyVar(None)
                    return self.wrap(d[name], s)
        if isinstance(value, type):
            raw = S.type_lookup(value, name)
            if src is not None and _plain_class_attr(raw):  # C.eps: guarded as it is read
                return self.wrap(raw, S.TypeAttrSource(src, name))
            if src is not None and raw is not S.MISSING:
                self.guard(S.TypeAttrSource(src, name), "id", raw)  # a method replaced on the class
                if isinstance(raw, classmethod) and isinstance(raw.__func__, types.FunctionType):
                    return MethodVar(PyVar(raw.__func__), obj)  # cls: the class, with its source
                if isinstance(raw, staticmethod):
                    return PyVar(raw.__func__)
            try:
                return PyVar(getattr(value, name))
            except AttributeError as e:
                if raw is S.MISSING and not hasattr(type(value), name):
                    self.guard(src, "notypeattr", name)
                raise AbsentAttribute("AttributeError while tracing: %s" % e, self.frame.user_stack())
        if isinstance(value, threading.local):
            self.unsupported("attribute %r of a threading.local (state per thread)" % name)
        inst = getattr(value, "__dict__", None)
        if isinstance(inst, dict) and name in inst:
            return self.wrap(inst[name], S.DictAttrSource(src, name) if src else None)
        cls_attr = S.type_lookup(type(value), name)
        if src is not None and type(cls_attr) is types.MemberDescriptorType:  # a __slots__ member
            v = S.slot_get(value, name)
            if v is S.MISSING:
                raise AbsentAttribute("%s.%s is unset" % (type(value).__name__, name), self.frame.user_stack())
            return self.wrap(v, S.SlotAttrSource(src, name))
        # the class, as a constant: the object's type is guarded before any attribute is read,
        # and one register serves every instance of it
        csrc = S.ConstSource(type(value), G._type_name(type(value))) if src is not None else None
        shadowable = (
            cls_attr is S.MISSING
            or _plain_class_attr(cls_attr)
            or isinstance(cls_attr, (types.FunctionType, staticmethod, classmethod))
        )
        if src is not None and isinstance(inst, dict) and shadowable:
            # an instance attribute set later would shadow the class's value or method (or the
            # absence getattr(obj, name, default) and hasattr read): guarded, as Python looks
            self.guard(src, "noattr", name)
        if cls_attr is S.MISSING:
            if src is not None:
                self.guard(csrc, "notypeattr", name)  # nor on the class
            cls_attr = None
        elif src is not None and _plain_class_attr(cls_attr):
            return self.wrap(cls_attr, S.TypeAttrSource(csrc, name))
        elif src is not None and isinstance(cls_attr, (types.FunctionType, property, staticmethod, classmethod)):
            self.guard(S.TypeAttrSource(csrc, name), "id", cls_attr)  # a method replaced on the class
        if isinstance(cls_attr, types.FunctionType):
            return MethodVar(PyVar(cls_attr), obj)
        if isinstance(cls_attr, property) and isinstance(cls_attr.fget, types.FunctionType):
            return self.call_var(PyVar(cls_attr.fget), [obj], {})
        if isinstance(cls_attr, staticmethod):
            return PyVar(cls_attr.__func__)
        if isinstance(cls_attr, classmethod):
            return MethodVar(PyVar(cls_attr.__func__), PyVar(type(value), csrc))
        custom = getattr(type(value), "__getattr__", None)
        if (
            cls_attr is None
            and src is not None
            and custom is not None
            and not (torch is not None and isinstance(value, torch.nn.Module))
        ):
            # computed by Python code on each read (a config object over a dict): no guard can
            # tell when it changes, so it is read by Python
            self.unsupported("%s.%s is served by %s.__getattr__" % (type(value).__name__, name, type(value).__name__))
        try:
            attr = getattr(value, name)
        except AttributeError as e:
            raise AbsentAttribute("AttributeError while tracing: %s" % e, self.frame.user_stack())
        if type(attr) in SCALARS or isinstance(attr, (types.BuiltinMethodType, types.MethodWrapperType)):
            return PyVar(attr)
        return self.wrap(attr, None)

    def array_attr(self, arr, name):
        if name == "shape":
            return ShapeVar(arr)
        if name == "ndim":
            return PyVar(arr.ndim)
        if name == "dtype":
            return PyVar(arr.example.dtype)
        if name == "size" and arr.kind == "numpy":
            n = 1
            for a in range(arr.ndim):
                n *= self.dim(arr, a)
            return PyVar(n)
        if name in ("T", "mT", "real"):
            return self.array_call(lambda x: getattr(x, name), [arr], {})
        if arr.kind == "torch" and name in ("device", "requires_grad", "is_cuda", "layout"):
            return PyVar(getattr(arr.example, name))
        if name == "itemsize":
            return PyVar(int(arr.example.itemsize))  # of the dtype, which is guarded
        if name == "nbytes":
            n = int(arr.example.itemsize)
            for a in range(arr.ndim):
                n *= self.dim(arr, a)
            return PyVar(n)
        raw = inspect.getattr_static(arr.example, name, None)
        if (
            isinstance(raw, (property, types.GetSetDescriptorType, types.MemberDescriptorType))
            or raw is not None
            and not callable(raw)
        ):
            # a data attribute (x.base, x.strides, x.flags, t.grad): its value, or whether it is
            # None, is not a method to call later: Python reads it
            self.unsupported("array attribute %r is read by Python" % name)
        return ArrayMethodVar(arr, name)

    def module_child(self, mod_var, name):
        mod = mod_var.value
        src = S.ItemSource(S.DictAttrSource(mod_var.source, "_modules"), name) if mod_var.source else None
        return self.wrap(mod._modules[name], src)
