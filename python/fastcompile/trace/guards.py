"""Trace stage, guards: what a trace relied on, as records and as the flat
program the C guard engine runs. In: (source, check) pairs; out:
``compile_program(guards) -> list of tuples`` and ``check_program`` (pure Python).

Program format (one tuple per instruction; registers are small ints):

loads   ("local", reg, slot)            frame localsplus[slot] (cells unwrapped)
        ("global", reg, name)           f_globals[name], else builtins[name]
        ("closure", reg, index)         closure[index].cell_contents
        ("const", reg, obj)             obj itself (held by the program), e.g. another module's globals
        ("call0", reg, fn)              fn() (a C function reading global state: torch.is_grad_enabled)
        ("item", reg, src, key)         src[key] for exact dict/tuple/list
        ("dictattr", reg, src, name)    src.__dict__[name] (instance dict only)
        ("type_of", reg, src)           type(src)
        ("typeattr", reg, src, name)    name in the MRO of the type src, unbound (no descriptor runs)
        ("slotattr", reg, src, name)    src.name for a __slots__ member (its member descriptor)
        ("funcattr", reg, src, name)    a Python function's __defaults__ or __kwdefaults__ (None if unset)
checks  ("type", reg, type_obj)         type(v) is type_obj
        ("id", reg, obj)                v is obj
        ("eq", reg, value)              type(v) is type(value) and v == value (eq_ok values; floats
                                        and NumPy scalars bit for bit: -0.0 is not 0.0)
        ("len", reg, n)                 len(v) == n
        ("ndarray", reg, dtype, ndim, size1_mask, contig)
        ("tensor", reg, dtype, ndim, size1_mask, contig, device, requires_grad)
        ("dim", reg, axis, size)        v.shape[axis] == size (a size used as a Python value)
        ("noattr", reg, name)           v's instance dict (if any) has no entry name
        ("notypeattr", reg, name)       v is a type and no class in its MRO has name

size1_mask bit i is set iff shape[i] == 1; contig 0 any, 1 C-contiguous, 2 not.
A load that finds nothing fails at that load."""

import builtins as _builtins_mod
import os
import struct
import types

import numpy as np

from fastcompile._common import hashable as _hashable

from . import sources as S


class Guard:
    """One fact about one source: kind is a check name above, args its operands."""

    __slots__ = ("source", "kind", "args")

    def __init__(self, source, kind, *args):
        self.source, self.kind, self.args = source, kind, args

    def key(self):
        a = tuple(id(x) if self.kind == "id" else (x if _hashable(x) else repr(x)) for x in self.args)
        return (self.source, self.kind, a)

    def describe(self):
        src = repr(self.source)
        if self.kind == "type":
            return "type(%s) is %s" % (src, _type_name(self.args[0]))
        if self.kind == "id":
            return "%s is %s" % (src, describe_object(self.args[0]))
        if self.kind == "eq":
            return "%s == %r" % (src, self.args[0])
        if self.kind == "len":
            return "len(%s) == %d" % (src, self.args[0])
        if self.kind == "dim":
            return "%s.shape[%d] == %d" % (src, self.args[0], self.args[1])
        if self.kind == "noattr":
            return "%r not in vars(%s)" % (self.args[0], src)
        if self.kind == "notypeattr":
            return "%r not in the classes of %s" % (self.args[0], src)
        if self.kind in ("ndarray", "tensor"):
            dtype, ndim, mask, contig = self.args[:4]
            txt = "%s is %s %s ndim=%d size1_mask=0b%s contig=%s" % (
                src,
                self.kind,
                dtype,
                ndim,
                format(mask, "b"),
                ("any", "C", "non-C")[contig],
            )
            if self.kind == "tensor":
                txt += " device=%s requires_grad=%s" % self.args[4:6]
            return txt
        return "%s %s %r" % (src, self.kind, self.args)

    __repr__ = describe


def eq_ok(v):
    """Whether an "eq" guard may hold v (the C engine's eq_value_ok): None, bool, int, float,
    complex, str, bytes, range, NumPy's bool/integer/floating scalars of at most 8 bytes, and
    slices, frozensets and tuples (namedtuples too) of those."""
    t = type(v)
    if v is None or t in (bool, int, float, complex, str, bytes, range):
        return True
    if isinstance(v, np.generic):
        return v.dtype.kind in "biuf" and v.dtype.itemsize <= 8
    if t is slice:
        return eq_ok(v.start) and eq_ok(v.stop) and eq_ok(v.step)
    if t is frozenset:
        return all(eq_ok(x) for x in v)
    if isinstance(v, tuple) and (t is tuple or t.__eq__ is tuple.__eq__):
        return all(eq_ok(x) for x in v)
    return False


def same_value(a, b):
    """The "eq" comparison: same exact type and equal, floats and NumPy scalars bit for bit."""
    if a is b:
        return True
    t = type(a)
    if t is not type(b):
        return False
    if t is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if t is complex:
        return struct.pack("<dd", a.real, a.imag) == struct.pack("<dd", b.real, b.imag)
    if isinstance(a, np.generic):
        return eq_ok(a) and a.tobytes() == b.tobytes()
    if t is slice:
        return all(same_value(x, y) for x, y in ((a.start, b.start), (a.stop, b.stop), (a.step, b.step)))
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


def _type_name(t):
    name = getattr(t, "__qualname__", None)
    if name is None:
        return repr(t)
    mod = getattr(t, "__module__", None)
    return name if mod in (None, "builtins") else "%s.%s" % (mod, name)


def describe_object(obj):
    """A readable name for an object an identity guard holds: module numpy, class numpy.ndarray,
    function f (file.py:12), builtin print, ufunc numpy.exp; else <Type object at 0x...>."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    mod = getattr(obj, "__module__", None)
    if isinstance(obj, types.ModuleType):
        return "module %s" % obj.__name__
    if isinstance(obj, type):
        return "class %s" % (name if mod in (None, "builtins") else "%s.%s" % (mod, name))
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        return "function %s (%s:%d)" % (name, os.path.basename(code.co_filename), code.co_firstlineno)
    owner = getattr(obj, "__self__", None)  # identity only: an ndarray's == is elementwise
    if (
        isinstance(obj, types.BuiltinFunctionType)
        and (owner is None or owner is _builtins_mod)
        or type(obj).__name__ == "ufunc"
    ):
        kind = "ufunc" if type(obj).__name__ == "ufunc" else "builtin"
        return "%s %s" % (kind, name if mod in (None, "builtins") else "%s.%s" % (mod, name))
    return "<%s object at 0x%x>" % (type(obj).__qualname__, id(obj))


def size1_mask(shape):
    m = 0
    for i, n in enumerate(shape):
        if n == 1:
            m |= 1 << i
    return m


def array_guard(source, arr):
    """The compile-key guard of a NumPy array."""
    return Guard(source, "ndarray", arr.dtype, arr.ndim, size1_mask(arr.shape), 1 if arr.flags.c_contiguous else 2)


def tensor_guard(source, t):
    return Guard(
        source,
        "tensor",
        t.dtype,
        t.dim(),
        size1_mask(t.shape),
        1 if t.is_contiguous() else 2,
        t.device,
        bool(t.requires_grad),
    )


def dedupe(guards):
    seen, out = set(), []
    for g in guards:
        k = g.key()
        if k not in seen:
            seen.add(k)
            out.append(g)
    return out


def compile_program(guards, owners=None):
    """Guards -> flat program (see the module docstring). Each source is loaded
    once, before its first check; checks keep the order of the guards. With a
    list ``owners``, appends per instruction the index (into dedupe(guards)) of
    the guard it serves, for reports of which guard failed."""
    prog, regs = [], {}

    def load(src):
        if src in regs:
            return regs[src]
        if isinstance(src, S.LocalSource):
            ins = ("local", None, src.slot)
        elif isinstance(src, S.GlobalSource):
            ins = ("global", None, src.name)
        elif isinstance(src, S.ClosureSource):
            ins = ("closure", None, src.index)
        elif isinstance(src, S.ConstSource):
            ins = ("const", None, src.obj)
        elif isinstance(src, S.CallSource):
            ins = ("call0", None, src.fn)
        elif isinstance(src, S.ItemSource):
            ins = ("item", None, load(src.base), src.key)
        elif isinstance(src, S.DictAttrSource):
            ins = ("dictattr", None, load(src.base), src.name)
        elif isinstance(src, S.TypeOfSource):
            ins = ("type_of", None, load(src.base))
        elif isinstance(src, S.TypeAttrSource):
            ins = ("typeattr", None, load(src.base), src.name)
        elif isinstance(src, S.SlotAttrSource):
            ins = ("slotattr", None, load(src.base), src.name)
        elif isinstance(src, S.FuncAttrSource):
            ins = ("funcattr", None, load(src.base), src.name)
        else:
            raise TypeError("no load for source %r" % (src,))
        reg = len(regs)
        regs[src] = reg
        prog.append((ins[0], reg) + ins[2:])
        return reg

    for gi, g in enumerate(dedupe(guards)):
        reg = load(g.source)
        prog.append((g.kind, reg) + tuple(g.args))
        if owners is not None:
            owners.extend([gi] * (len(prog) - len(owners)))
    return prog


def describe_actual(guard, value):
    """What the guarded source holds now, in the terms of the guard's check."""
    if value is S.MISSING:
        return "missing"
    kind = guard.kind
    if kind == "type":
        return "type %s" % _type_name(type(value))
    if kind == "id":
        return describe_object(value)
    if kind == "eq":
        return repr(value)
    if kind in ("noattr", "notypeattr"):
        return "has %s" % guard.args[0]
    if kind == "len":
        try:
            return "len %d" % len(value)
        except TypeError:
            return "a %s (no len)" % type(value).__name__
    shape = getattr(value, "shape", None)
    if kind == "dim" and shape is not None:
        return "shape %s" % (tuple(shape),)
    if kind in ("ndarray", "tensor") and shape is not None:
        try:
            contig = value.flags.c_contiguous if kind == "ndarray" else value.is_contiguous()
        except AttributeError:
            return "a %s" % type(value).__name__
        return "%s %s ndim=%d size1_mask=0b%s contig=%s" % (
            type(value).__name__,
            value.dtype,
            len(shape),
            format(size1_mask(shape), "b"),
            "C" if contig else "non-C",
        )
    return "a %s" % type(value).__name__


def _check(ins, v):
    kind = ins[0]
    if kind == "type":
        return type(v) is ins[2]
    if kind == "id":
        return v is ins[2]
    if kind == "eq":
        return same_value(v, ins[2])
    if kind == "len":
        try:
            return len(v) == ins[2]
        except TypeError:
            return False
    if kind == "dim":
        shape = getattr(v, "shape", None)
        return shape is not None and len(shape) > ins[2] and shape[ins[2]] == ins[3]
    if kind == "noattr":
        return not isinstance(v, type) and S._instance_dict_get(v, ins[2]) is S.MISSING
    if kind == "notypeattr":
        return isinstance(v, type) and S.type_lookup(v, ins[2]) is S.MISSING
    if kind == "ndarray":
        import numpy as np

        if type(v) is not np.ndarray:
            return False
        _, _, dtype, ndim, mask, contig = ins
        return (
            v.dtype == dtype
            and v.ndim == ndim
            and size1_mask(v.shape) == mask
            and _contig_ok(v.flags.c_contiguous, contig)
        )
    if kind == "tensor":
        import torch

        if not isinstance(v, torch.Tensor):
            return False
        _, _, dtype, ndim, mask, contig, device, rg = ins
        return (
            v.dtype == dtype
            and v.dim() == ndim
            and size1_mask(v.shape) == mask
            and _contig_ok(v.is_contiguous(), contig)
            and v.device == device
            and bool(v.requires_grad) == rg
        )
    raise ValueError("unknown guard instruction %r" % (kind,))


def _contig_ok(is_c, contig):
    return contig == 0 or (contig == 1) == bool(is_c)


def check_program(program, f_locals_by_slot, f_globals, f_builtins, closure):
    """Run a guard program in Python: index of the first failing instruction, or -1.
    f_locals_by_slot: dict slot -> value, or a sequence indexed by slot."""
    regs = {}
    for i, ins in enumerate(program):
        kind = ins[0]
        if kind == "local":
            src = S.LocalSource("?", ins[2])
            v = S.evaluate(src, f_locals_by_slot, f_globals, f_builtins, closure)
        elif kind == "global":
            v = S.evaluate(S.GlobalSource(ins[2]), f_locals_by_slot, f_globals, f_builtins, closure)
        elif kind == "closure":
            v = S.evaluate(S.ClosureSource("?", ins[2]), f_locals_by_slot, f_globals, f_builtins, closure)
        elif kind == "const":
            v = ins[2]
        elif kind == "call0":
            v = S.evaluate(S.CallSource(ins[2]), f_locals_by_slot, f_globals, f_builtins, closure)
        elif kind == "item":
            base = regs[ins[2]]
            try:
                v = base[ins[3]] if type(base) in (dict, tuple, list) else S.MISSING
            except (KeyError, IndexError, TypeError):
                v = S.MISSING
        elif kind == "dictattr":
            v = S._instance_dict_get(regs[ins[2]], ins[3])
        elif kind == "type_of":
            v = type(regs[ins[2]])
        elif kind == "typeattr":
            v = S.type_lookup(regs[ins[2]], ins[3])
        elif kind == "slotattr":
            v = S.slot_get(regs[ins[2]], ins[3])
        elif kind == "funcattr":
            v = S.func_attr(regs[ins[2]], ins[3])
        else:
            if not _check(ins, regs[ins[1]]):
                return i
            continue
        if v is S.MISSING:
            return i
        regs[ins[1]] = v
    return -1
