"""Trace stage, symbolic values: what the interpreter keeps on its stack and in
its locals. In: frame values and graph Values; out: records the interpreter
reads. Arrays are graph values with an eager example (for dtype/shape), the
rest are Python-level values, possibly with the source they came from."""


class Unsupported(Exception):
    """Raised at a graph break; with fullgraph=True it reaches the caller.
    reason: str; user_stack: list of (filename, lineno, funcname, source_line)."""

    def __init__(self, reason, user_stack=(), whole_frame=False):
        self.reason = reason
        self.user_stack = list(user_stack)
        self.whole_frame = whole_frame  # it would recur in any resume function: do not resume
        where = ""
        if self.user_stack:
            fn, ln, name, _ = self.user_stack[-1]
            where = " (at %s:%d in %s)" % (fn, ln, name)
        super().__init__(reason + where)


class AbsentAttribute(Unsupported):
    """obj.name where obj has no such attribute (a graph break, AttributeError in Python), with
    the absence guarded where it can be: getattr(obj, name, default) and hasattr take it."""


class Var:
    source = None


class ArrayVar(Var):
    """A NumPy array or torch tensor in the graph. kind: "numpy" or "torch".
    example: the eagerly computed value (metadata only); fresh: made by a core
    op of this graph (so an in-place update may rebind it)."""

    def __init__(self, value, example, kind, source=None, fresh=False):
        self.value, self.example, self.kind, self.source = value, example, kind, source
        self.fresh = fresh
        self.escaped = False  # passed to an extern (may be viewed)
        self.fx = None  # autograd mode: its torch.fx node (value is None then)

    @property
    def ndim(self):
        return self.example.ndim

    def __repr__(self):
        return "ArrayVar(%s %s)" % (self.kind, tuple(self.example.shape))


class PyVar(Var):
    """A Python-level value known at trace time (constant, module, function,
    class, nn.Module, opaque object). source: where the frame got it, or None."""

    def __init__(self, value, source=None):
        self.value, self.source = value, source

    def __repr__(self):
        return "PyVar(%r)" % (self.value,)


class ScalarVar(Var):
    """A float the graph reads at each call instead of baking it in (a learning rate, a time
    step): a Python float is a weak 0-d float64 graph input (NEP 50: float32 array * it stays
    float32), a NumPy float scalar a 0-d input of its dtype (strongly typed). Not a
    PyVar, so no code reads its value by accident: Tracer.py(var) specializes it (its roots
    guarded by value, as a constant float is), Tracer.graph_arg(var) gives its graph input.
    value: this trace's value; source: where it is read at each call, a frame source (a root), or
    a ScalarExprSource for float arithmetic on ScalarVars, which Python computes again at each
    call; roots: the roots it comes from; gv: its graph input, made at its first array use."""

    def __init__(self, value, source, roots=None):
        self.value, self.source, self.gv = value, source, None
        self.roots = [self] if roots is None else roots
        self.specialized = False
        self.type_guard = None  # a root's type guard, dropped when an eq guard replaces it
        self.half = None  # float16(self), made by Tracer.half_scalar at its first use

    def __repr__(self):
        return "ScalarVar(%r)" % (self.value,)


class TupleVar(Var):
    def __init__(self, items, source=None):
        self.items, self.source = list(items), source


class _Items(Var):
    """A list or dict Var (kind: list or dict). loader: for one read from outside the frame,
    called on the first read of items; it guards the length and wraps the items then, so a frame
    that only adds to it (a store or append at a graph break) is not guarded on a length that
    every call changes."""

    kind = list

    def __init__(self, items, source=None, loader=None):
        self._items = self.kind(items) if loader is None else None
        self.source, self._loader = source, loader

    @property
    def items(self):
        if self._items is None:
            self._items = self.kind(self._loader())  # raises again at the next read if it raised
            self._loader = None
        return self._items

    @items.setter
    def items(self, items):
        self._items, self._loader = self.kind(items), None


class ListVar(_Items):
    """A list; source set when it came from outside the frame (then read-only)."""

    kind = list


class DictVar(_Items):
    """A dict with Python-constant keys; source set when it came from outside."""

    kind = dict


class ShapeVar(Var):
    """array.shape: indexing it guards only the dimensions read."""

    def __init__(self, array):
        self.array = array


class FuncVar(Var):
    """A function made by MAKE_FUNCTION inside the trace."""

    def __init__(self, code, f_globals, defaults, kwdefaults, closure, name):
        self.code, self.f_globals, self.name = code, f_globals, name
        self.defaults = defaults  # tuple of Vars
        self.kwdefaults = kwdefaults  # dict name -> Var
        self.closure = closure  # tuple of CellVar


class CellVar(Var):
    """A cell. external: a cell of the traced frame's closure (stores break)."""

    def __init__(self, contents=None, external=False, loader=None):
        self._contents, self.external, self.loader = contents, external, loader

    @property
    def contents(self):
        if self._contents is None and self.loader is not None:
            self._contents = self.loader()
        return self._contents

    @contents.setter
    def contents(self, v):
        self._contents = v


class MethodVar(Var):
    """fn bound to self (fn: a Var naming a Python function)."""

    def __init__(self, fn, self_var):
        self.fn, self.self_var = fn, self_var


class ArrayMethodVar(Var):
    """array.name, not yet called."""

    def __init__(self, array, name):
        self.array, self.name = array, name


class IterVar(Var):
    def __init__(self, items):
        self.items, self.pos = list(items), 0


class NullVar(Var):
    def __repr__(self):
        return "NULL"


NULL = NullVar()
