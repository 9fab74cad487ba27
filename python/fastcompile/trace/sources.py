"""Trace stage, sources: where a Python-level value of the traced frame came from.
In: the frame's locals/globals/closure; out: small hashable records that guards
load from and that generated code re-reads at run time."""

import builtins as _builtins
import types

from .. import pygen


class Source:
    """Base: a path from the frame to a value. Subclasses are plain records, never changed once
    made: the hash is computed once (a key holds its base source, so hashing a path of n
    steps hashed all of them, at each lookup of a per-call memo)."""

    __slots__ = ("_hash",)

    def __eq__(self, other):
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self):
        try:
            return self._hash
        except AttributeError:
            h = self._hash = hash((type(self).__name__,) + self._key())
            return h


class LocalSource(Source):
    __slots__ = ("name", "slot")

    def __init__(self, name, slot):
        self.name, self.slot = name, slot

    def _key(self):
        return (self.slot,)

    def __repr__(self):
        return "L[%r]" % self.name


class GlobalSource(Source):
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def _key(self):
        return (self.name,)

    def __repr__(self):
        return "G[%r]" % self.name


class ClosureSource(Source):
    __slots__ = ("name", "index")

    def __init__(self, name, index):
        self.name, self.index = name, index

    def _key(self):
        return (self.index,)

    def __repr__(self):
        return "closure[%d](%s)" % (self.index, self.name)


class ConstSource(Source):
    """A fixed object the trace holds on to (e.g. the globals dict of a function
    inlined from another module); guards read items of it at call time."""

    __slots__ = ("obj", "label")

    def __init__(self, obj, label):
        self.obj, self.label = obj, label

    def _key(self):
        return (id(self.obj),)

    def __repr__(self):
        return self.label


class CallSource(Source):
    """fn() for a C function that reads global state, e.g. torch.is_grad_enabled."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def _key(self):
        return (id(self.fn),)

    def __repr__(self):
        return "%s.%s()" % (getattr(self.fn, "__module__", None) or "?", getattr(self.fn, "__name__", "?"))


class CellSource(CallSource):
    """The contents of a closure cell of a function the trace inlined (not the traced frame's own
    closure, ClosureSource): read at call time, so guards see a rebound cell (nonlocal) and the
    in-place updates of the object in it, and mutating that object is a side effect. Guards
    load it with call0 (fn: a callable that never raises; an empty cell reads as EMPTY_CELL)."""

    __slots__ = ("cell", "label")

    def __init__(self, cell, label):
        super().__init__(_CellContents(cell))
        self.cell, self.label = cell, label

    def _key(self):
        return (id(self.cell),)

    def __repr__(self):
        return self.label


EMPTY_CELL = object()


class _CellContents:
    __slots__ = ("cell",)

    def __init__(self, cell):
        self.cell = cell

    def __call__(self):
        try:
            return self.cell.cell_contents
        except ValueError:
            return EMPTY_CELL


class ItemSource(Source):
    __slots__ = ("base", "key")

    def __init__(self, base, key):
        self.base, self.key = base, key

    def _key(self):
        return (self.base, self.key)

    def __repr__(self):
        return "%r[%r]" % (self.base, self.key)


class _NamedSource(Source):
    """Base of the sources that read a name of what base holds (the subclass says how)."""

    __slots__ = ("base", "name")

    def __init__(self, base, name):
        self.base, self.name = base, name

    def _key(self):
        return (self.base, self.name)

    def __repr__(self):
        return "%r.%s" % (self.base, self.name)


class DictAttrSource(_NamedSource):
    """obj.__dict__[name] (instance dict only; modules included)."""

    __slots__ = ()


class TypeOfSource(Source):
    __slots__ = ("base",)

    def __init__(self, base):
        self.base = base

    def _key(self):
        return (self.base,)

    def __repr__(self):
        return "type(%r)" % (self.base,)


class TypeAttrSource(_NamedSource):
    """name as found in the MRO of the type base holds, unbound (a class attribute: the value a
    read through an instance falls back to where the instance dict has no such entry)."""

    __slots__ = ()


class SlotAttrSource(_NamedSource):
    """base.name for a __slots__ member, read through its member descriptor."""

    __slots__ = ()


class FuncAttrSource(_NamedSource):
    """base.__defaults__ or base.__kwdefaults__ of a Python function (None where unset)."""

    __slots__ = ()


# sources read from another source (their .base): a value's root is found through them
DERIVED = (ItemSource, _NamedSource, TypeOfSource)


class ScalarExprSource(Source):
    """fn(*args) computed at call time by Python itself: a float the graph reads as an input,
    computed from floats read at each call (lr * 0.5 - 0.01), so its value is Python's bit for
    bit, and what Python raises (a division by zero) is raised at the call. args: sources, or
    constants. Guards never load it (its root sources are guarded); one per trace use."""

    __slots__ = ("fn", "label", "args")

    def __init__(self, fn, label, args):
        self.fn, self.label, self.args = fn, label, tuple(args)

    def _key(self):
        return (id(self),)

    def roots(self):
        for a in self.args:
            if isinstance(a, ScalarExprSource):
                yield from a.roots()
            elif isinstance(a, Source):
                yield a

    def __repr__(self):
        parts = [repr(a) for a in self.args]
        if self.label in ("+", "-", "*", "/", "//", "%") and len(parts) == 2:
            return "(%s %s %s)" % (parts[0], self.label, parts[1])
        return "%s(%s)" % (self.label, ", ".join(parts))


class _Missing:
    pass


MISSING = _Missing()


def _instance_dict_get(obj, name):
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return MISSING
    return d.get(name, MISSING)


def type_lookup(t, name):
    """t's attribute name from its MRO, unbound, or MISSING (t not a type, or no such name)."""
    if not isinstance(t, type):
        return MISSING
    for klass in t.__mro__:
        d = klass.__dict__
        if name in d:
            return d[name]
    return MISSING


def func_attr(obj, name):
    """A Python function's __defaults__ or __kwdefaults__ (None where unset), or MISSING."""
    if not isinstance(obj, types.FunctionType):
        return MISSING
    return obj.__defaults__ if name == "__defaults__" else obj.__kwdefaults__


def slot_get(obj, name):
    """obj's __slots__ member name, or MISSING (no such member, or unset)."""
    d = type_lookup(type(obj), name)
    if type(d) is not types.MemberDescriptorType:
        return MISSING
    try:
        return d.__get__(obj, type(obj))
    except AttributeError:
        return MISSING


def _item_get(obj, key):
    try:
        return obj[key]
    except (KeyError, IndexError, TypeError):
        return MISSING


# how a derived source reads from its base's value: helper name, or None for type(base)
_READERS = {
    ItemSource: "_item_get",
    DictAttrSource: "_instance_dict_get",
    TypeOfSource: None,
    TypeAttrSource: "type_lookup",
    SlotAttrSource: "slot_get",
    FuncAttrSource: "func_attr",
}


def compile_reader(sources):
    """read(f_locals_by_slot, f_globals, f_builtins, closure) -> the list of what each of
    ``sources`` names, exactly as [evaluate(s, ...) for s in sources] (MISSING where evaluate
    gives MISSING), as one generated straight-line function: each distinct source (a path's
    shared steps, as self._modules of a module's parameters) read once, no recursion and no
    hashing per call."""
    glob = {
        "MISSING": MISSING,
        "_evaluate": evaluate,
        "_item_get": _item_get,
        "_instance_dict_get": _instance_dict_get,
        "type_lookup": type_lookup,
        "slot_get": slot_get,
        "func_attr": func_attr,
    }
    names = {}
    lines = []

    def name_of(src):
        n = names.get(src)
        if n is not None:
            return n
        helper = _READERS.get(type(src), False)
        if helper is not False:
            b = name_of(src.base)
            n = "v%d" % len(names)
            if helper is None:
                expr = "type(%s)" % b
            else:
                key = "k%d" % len(glob)
                glob[key] = src.key if isinstance(src, ItemSource) else src.name
                expr = "%s(%s, %s)" % (helper, b, key)
            lines.append("%s = MISSING if %s is MISSING else %s" % (n, b, expr))
        else:  # a root (or a kind read rarely): evaluate's own code
            n = "v%d" % len(names)
            key = "s%d" % len(glob)
            glob[key] = src
            lines.append("%s = _evaluate(%s, by_slot, f_globals, f_builtins, closure)" % (n, key))
        names[src] = n
        return n

    outs = [name_of(src) for src in sources]
    lines.append("return [%s]" % ", ".join(outs))
    return pygen.function(lines, "read", "by_slot, f_globals, f_builtins, closure", "<fastcompile sources>", glob)


def evaluate(source, f_locals_by_slot, f_globals, f_builtins, closure):
    """The value a source names in a frame, or MISSING. Used at run time by
    generated code and by the pure-Python guard evaluator."""
    if isinstance(source, LocalSource):
        v = (
            f_locals_by_slot.get(source.slot, MISSING)
            if isinstance(f_locals_by_slot, dict)
            else f_locals_by_slot[source.slot]
        )
        return v
    if isinstance(source, GlobalSource):
        if source.name in f_globals:
            return f_globals[source.name]
        b = f_builtins if isinstance(f_builtins, dict) else vars(f_builtins or _builtins)
        return b.get(source.name, MISSING)
    if isinstance(source, ClosureSource):
        try:
            return closure[source.index].cell_contents
        except (ValueError, IndexError, TypeError):
            return MISSING
    if isinstance(source, ConstSource):
        return source.obj
    if isinstance(source, CallSource):
        try:
            return source.fn()
        except Exception:
            return MISSING
    if isinstance(source, ScalarExprSource):  # raises what Python raises (ZeroDivisionError)
        args = [
            evaluate(a, f_locals_by_slot, f_globals, f_builtins, closure) if isinstance(a, Source) else a
            for a in source.args
        ]
        if any(a is MISSING for a in args):
            return MISSING
        return source.fn(*args)
    base = evaluate(source.base, f_locals_by_slot, f_globals, f_builtins, closure)
    if base is MISSING:
        return MISSING
    if isinstance(source, ItemSource):
        try:
            return base[source.key]
        except (KeyError, IndexError, TypeError):
            return MISSING
    if isinstance(source, DictAttrSource):
        return _instance_dict_get(base, source.name)
    if isinstance(source, TypeOfSource):
        return type(base)
    if isinstance(source, TypeAttrSource):
        return type_lookup(base, source.name)
    if isinstance(source, SlotAttrSource):
        return slot_get(base, source.name)
    if isinstance(source, FuncAttrSource):
        return func_attr(base, source.name)
    raise TypeError("unknown source %r" % (source,))
