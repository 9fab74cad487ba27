"""Trace stage, graph call: turns the traced state into a callable that runs the
compiled graph once and rebuilds Python values around its outputs. In: a
Tracer and the Vars to rebuild; out: (run(*slot_values) -> list, slots)."""

import logging
import os
import sys
import threading

import numpy as np

from .. import _C, config, pending
from . import sources as S
from .guards import same_value
from .helpers import host_of, unlazy
from .variables import ArrayMethodVar, ArrayVar, DictVar, ListVar, PyVar, ScalarVar, ShapeVar, TupleVar, Unsupported


class GraphInfo:
    """graph: the fastcompile Graph; input_sources: where each input comes from;
    op_count: ops traced into it; span: (filename, first line, last line);
    compiled: its Compiled (kernels, sources) once it has run, else None."""

    def __init__(self, graph, input_sources, op_count, span, compiled=None):
        self.graph, self.input_sources, self.op_count, self.span = graph, input_sources, op_count, span
        self._compiled = compiled
        self.float_sources = []  # the floats it reads at each call (not baked in: no recompile)

    @property
    def compiled(self):
        return self._compiled() if callable(self._compiled) else self._compiled

    def __repr__(self):
        return "GraphInfo(ops=%d, inputs=%r, span=%s:%d-%d)" % ((self.op_count, self.input_sources) + self.span)


def graph_info(tracer, run):
    if run.graph is None or tracer.op_count == 0:
        return []
    fname = tracer.code.co_filename  # the span is in the traced function's own file
    lines = [ln for f, ln in tracer.lines if f == fname] or [ln for _, ln in tracer.lines]
    if not any(f == fname for f, _ in tracer.lines) and tracer.lines:
        fname = tracer.lines[0][0]
    info = GraphInfo(
        run.graph,
        [src for src, _, _ in tracer.inputs],
        tracer.op_count,
        (fname, min(lines), max(lines)),
        getattr(run, "compiled", None),
    )
    info.float_sources = [src for src, kind, _ in tracer.inputs if kind == "scalar"]
    return [info]


def _roots(src, out):
    if isinstance(src, S.ScalarExprSource):
        for r in src.roots():
            _roots(r, out)
        return
    while isinstance(src, S.DERIVED):
        src = src.base
    out.add(src)


def _view_bases(tracer, outputs):
    """Tensor outputs that view a tensor input (x[1:], x.t()) or another output (a, a.t()), as
    their examples' memory tells at the trace: {output index: (the input's source, whether to
    view its detach(): the output needs no grad where the input does), or the index of the
    output whose memory holds the others'}. At each call such an output is made a torch view of
    that tensor (_torch_view), so it shares its version counter and storage as eager's view
    does; torch.from_numpy would make a tensor of its own over the same memory."""

    def host(x):
        h = host_of(x)  # None for bfloat16: the core had a float32 copy
        return h if h is not None and h.size else None

    ins = [
        (src, host(arr), arr.requires_grad) for src, kind, arr in tracer.inputs if kind == "torch" and src is not None
    ]
    exs = {k: host(v.example) for k, v in enumerate(outputs) if v.kind == "torch"}
    exs = {k: a for k, a in exs.items() if a is not None}
    bases, left = {}, []
    for k, a in exs.items():
        hit = next(((s, g) for s, b, g in ins if b is not None and np.may_share_memory(a, b)), None)
        if hit is not None:  # x.detach() of an input requiring grad: a view of x.detach()
            bases[k] = (hit[0], hit[1] and not getattr(outputs[k].example, "requires_grad", False))
        else:
            left.append(k)
    while left:
        k = left.pop(0)
        group = [k] + [j for j in left if np.may_share_memory(exs[k], exs[j])]
        left = [j for j in left if j not in group]
        if len(group) < 2:
            continue
        spans = {j: _span(exs[j]) for j in group}
        root = next(
            (j for j in group if all(spans[j][0] <= lo and hi <= spans[j][1] for lo, hi in spans.values())), None
        )
        for j in group:
            if root is not None and j != root:
                bases[j] = root
    return bases


def _span(a):
    """The bytes [lo, hi) array a reaches."""
    lo = hi = a.__array_interface__["data"][0]
    for n, st in zip(a.shape, a.strides):
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi + a.itemsize


def _out_tensor(env, outs, k, bases):
    """Tensor output k of this call: one tensor per output per call (a, a returns one object
    twice), a view of the tensor it views where it views one (_view_bases)."""
    t = env.memo.get(k)  # int keys: never a Source
    if t is None:
        b = bases.get(k)
        r = outs[k]
        if b is None:
            t = _from_numpy(r)
        elif type(b) is int:
            t = _torch_view(_out_tensor(env, outs, b, bases), r)
        else:
            src, detach = b
            t = env.get(src)
            t = _torch_view(t.detach() if detach else t, r)
        env.memo[k] = t
    return t


def _torch_view(t, r):
    """Output array r, which views input tensor t's memory, as a view of t (as_strided): it shares
    t's version counter and has t as its _base, as eager's view does, so autograd sees an in-place
    update through it. torch.from_numpy(r) where r is no such view (another dtype, outside t)."""
    isz = r.itemsize
    storage = t.untyped_storage()
    base = storage.data_ptr()
    lo, hi = _span(r)
    if (
        r.size == 0
        or str(t.dtype)[6:] != r.dtype.name
        or (lo - base) % isz
        or any(st < 0 or st % isz for st in r.strides)
        or lo < base
        or hi > base + storage.nbytes()
    ):
        return _from_numpy(r)  # "torch.float32": float32
    return t.as_strided(r.shape, [st // isz for st in r.strides], (lo - base) // isz)


def _from_numpy(r):
    return sys.modules["torch"].from_numpy(r)


def build(tracer, vars_, user_stack=()):
    """A function of the frame's slot values returning the Python values of vars_."""
    outputs, out_index = [], {}
    roots = set()
    nlocalsplus = len(tracer.slots)
    nfree = len(tracer.code.co_freevars)

    def plan(v):
        v = unlazy(v)
        if isinstance(v, ScalarVar):  # read again from the frame, or computed again
            _roots(v.source, roots)
            src = v.source
            return lambda env, outs: env.get(src)
        if isinstance(v, ArrayVar):
            if v.source is not None:
                _roots(v.source, roots)
                src = v.source
                return lambda env, outs: env.get(src)
            if id(v) not in out_index:
                out_index[id(v)] = len(outputs)
                outputs.append(v)
            k = out_index[id(v)]
            as_torch = v.kind == "torch" and tracer.fx is None  # autograd mode returns tensors
            scalar = isinstance(v.example, np.generic)

            def get(env, outs, k=k):
                if as_torch:
                    return _out_tensor(env, outs, k, bases)
                r = outs[k]
                return r[()] if scalar else r

            return get
        if isinstance(v, PyVar):
            if v.source is not None:
                _roots(v.source, roots)
                src = v.source
                return lambda env, outs: env.get(src)
            remake = getattr(v, "remake", None)
            if remake is not None:  # e.g. np.errstate(...): one per call
                fn, a, k = remake
                return lambda env, outs: fn(*a, **k)
            c = v.value
            return lambda env, outs: c
        if isinstance(v, (TupleVar, ListVar)):
            if v.source is not None and isinstance(v, ListVar):  # its items unread: no guard on them
                _roots(v.source, roots)
                src = v.source
                return lambda env, outs: env.get(src)
            parts = [plan(x) for x in v.items]
            ctor = tuple if isinstance(v, TupleVar) else list
            return lambda env, outs: ctor(p(env, outs) for p in parts)
        if isinstance(v, DictVar):
            if v.source is not None:
                _roots(v.source, roots)
                src = v.source
                return lambda env, outs: env.get(src)
            parts = {k: plan(x) for k, x in v.items.items()}
            return lambda env, outs: {k: p(env, outs) for k, p in parts.items()}
        if isinstance(v, ArrayMethodVar):
            base, name = plan(v.array), v.name
            return lambda env, outs: getattr(base(env, outs), name)
        if isinstance(v, ShapeVar):
            shape = tracer.py(v)
            return lambda env, outs: shape
        raise Unsupported("cannot rebuild a %s after the graph" % type(v).__name__, user_stack)

    bases = {}  # tensor output index -> the input source or output index it views
    plans = [plan(v) for v in vars_]
    if tracer.fx is None:
        bases.update(_view_bases(tracer, outputs))
    # (source, kind) only: the examples (the first call's arrays) must not live on in run
    inputs = [(src, kind) for src, kind, _ in tracer.inputs]
    for src, _ in inputs:
        _roots(src, roots)
    # float arithmetic the trace did on floats read at each call: Python computes each again at
    # each call, used or not, so what it raises there (1.0 / t at t == 0) is raised. One whose
    # roots are all specialized is fixed by their guards
    checks = [v.source for v in tracer.scalar_exprs if not all(r.specialized for r in v.roots)]
    for src in checks:
        _roots(src, roots)
    slots = []
    for r in roots:
        if isinstance(r, S.LocalSource):
            slots.append(r.slot)
        elif isinstance(r, S.ClosureSource):
            slots.append(nlocalsplus - nfree + r.index)
    slots = tuple(sorted(set(slots)))
    f_globals, f_builtins = tracer.f_globals, tracer.f_builtins
    if tracer.fx is not None:
        return _build_fx(tracer, plans, outputs, inputs, slots, nlocalsplus, nfree)
    graph = tracer.graph
    op_count = tracer.op_count
    if outputs:
        graph.output(*[v.value for v in outputs])
    code = tracer.code
    state = {
        "compiled": None,
        "first": None,  # label: the graph's name in fastcompile.profile()
        "label": "%s (%s:%d)" % (code.co_name, os.path.basename(code.co_filename), code.co_firstlineno),
    }
    if outputs:
        background = bool(config.get("async_compile"))
        if background:
            state["compiled"] = _compile(graph, state)
        state["first"] = _FirstCall(tracer, outputs, state["compiled"], background)

    has_outputs = bool(outputs)  # run keeps no Var: their examples are the trace's arrays
    input_srcs = [src for src, _ in inputs]
    read_inputs = S.compile_reader(input_srcs)  # one generated function, not evaluate() each
    torch_inputs = [j for j, (_, kind) in enumerate(inputs) if kind == "torch"]

    def run(*values):
        env = _Env.of(slots, values, nlocalsplus - nfree, f_globals, f_builtins)
        for src in checks:
            env.get(src)
        outs = ()
        if has_outputs:
            first = state["first"]
            got = None
            if first is not None:  # the first call, or the next one (async: waits for the build)
                if first.inputs is not None:
                    got = first.take([env.get(src) for src, _ in inputs])
                    if got is not None and got[0] is not None:
                        return [p(env, got[0]) for p in plans]
                first.wait()
                state["first"] = None  # spent: later calls skip all this
            c = state["compiled"]
            if c is None:
                c = state["compiled"] = _compile(graph, state)
            values = read_inputs(*env.args)
            env.memo.update(zip(input_srcs, values))  # the plans below read these as before
            arrays = list(values)
            for j in torch_inputs:
                arrays[j] = arrays[j].detach().numpy()
            # the first call (sync): the trace ran every extern on these inputs already
            if got is not None:
                _load_all(c, tuple(arrays), got[1])
            try:
                outs = c(*arrays) if got is None else c._call_with(tuple(arrays), got[1])
            except ValueError as e:
                if not torch_inputs or e.__traceback__.tb_next is not None:
                    raise  # NumPy's semantics, or an extern's own error (a Python frame below)
                # the core's: shapes that do not broadcast (kernels are not specialized on sizes);
                # torch raises RuntimeError where NumPy (and so the core) raises ValueError
                raise RuntimeError(str(e)) from e
        return [p(env, outs) for p in plans]

    run.slots = slots
    run.compiled = lambda: state["compiled"]  # the Compiled, once the first call made it
    run.graph = graph if outputs else None
    run.op_count = op_count
    run.lines = list(tracer.lines)  # (filename, lineno) of each op of the graph
    run.fast_target = (
        _fast_target(vars_, outputs, inputs, slots, state, graph, state["first"]) if outputs and not checks else None
    )
    if run.fast_target is not None and state["first"] is not None and not state["first"].background:
        state["first"] = None  # sync: the fast target runs the graph, run() never will
    return run


log = logging.getLogger("fastcompile")


def _host(v):
    """A traced value as the core sees it: a tensor's NumPy view, anything else as it is."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        return v.detach().numpy()
    return v


class _FirstCall:
    """Our tracer's core route, the first call of a traced graph. The trace ran every op eagerly
    on that call's inputs, externs included, so:
    - sync (the default): the call runs the kernels with the trace's extern results standing in
      for the externs (Compiled._call_with): an extern runs once, not twice (BatchNorm in
      training mode under no_grad updated its running statistics twice), and its time is saved;
    - async compile (background): the call returns the trace's values, NumPy's or torch's own
      (a view of an input stays one, as the kernels' view externs give); no kernel waits for the
      compiler. The kernels build in the background meanwhile (_submit: one worker thread for
      all; Compiled._prebuild on the first call's inputs with the same stand-ins, then
      Compiled._load_pending); the next call waits for that (wait()).
    Either is used once, and only by a call whose inputs are the traced objects themselves."""

    def __init__(self, tracer, outputs, compiled, background):
        ins = [ex for _, _, ex in tracer.inputs]
        self.scalars = [kind == "scalar" for _, kind, _ in tracer.inputs]
        stand_ins = [_stand_in(r) for r in tracer.extern_results]
        self.inputs, self.stand_ins = ins, stand_ins
        self.outs = tuple(_host(v.example) for v in outputs) if background else None
        self.background = background
        self.pid = os.getpid()
        self.done = threading.Event()
        if not background:
            self.done.set()
            return
        pending.add(self)
        _submit(self, compiled, tuple(_host(a) for a in ins), stand_ins)

    @property
    def ready(self):
        return self.done.is_set() or self.pid != os.getpid()  # a fork's child builds at its calls

    def take(self, values):
        """(traced outputs or None (sync), extern stand-ins) for the first call (values: its
        input objects, in trace order), or None: taken already, or other inputs."""
        outs, stand_ins, ins = self.outs, self.stand_ins, self.inputs
        self.outs = self.stand_ins = self.inputs = None
        # the traced objects themselves; a float read at each call (a ScalarVar's input) by its
        # value, bit for bit: computed again at this call (lr * 0.5), it is a new object
        if (
            ins is None
            or len(values) != len(ins)
            or any(a is not b and not (s and same_value(a, b)) for a, b, s in zip(values, ins, self.scalars))
        ):
            return None
        return outs, stand_ins

    def wait(self, timeout=None):
        if self.pid == os.getpid():
            self.done.wait(timeout)
        return self.ready

    def wrap(self, compiled, picks):
        """Async compile: a callable for Pick, the traced outputs at the first call, then
        compiled's (after the build). picks: the Pick objects calling it (filled in by the
        caller); the first call that runs the kernels hands them compiled itself, so later
        calls run with no Python frame, as without async compile."""

        def call(*arrays):
            if self.inputs is not None:
                got = self.take(arrays)
                if got is not None:
                    return got[0]
            self.wait()
            for p in picks:
                p.fn = compiled
            picks.clear()
            return compiled(*arrays)

        return call


# the background builds of _FirstCall: one worker thread takes every build queued so far and
# compiles their kernels in one batch (Compiled._load_pending: one compiler per core), so a
# model whose graph breaks first-call many graphs at once does not start a build, and a
# compiler per core, for each
_QUEUE = []
_QUEUE_LOCK = threading.Lock()
_WORKER = [None]


def _submit(first, compiled, arrays, stand_ins):
    with _QUEUE_LOCK:
        _QUEUE.append((first, compiled, arrays, stand_ins))
        if _WORKER[0] is None:
            t = threading.Thread(target=_work, name="fastcompile-build")
            _WORKER[0] = t
            try:
                t.start()
            except RuntimeError:  # no thread to be had: the calls build
                _WORKER[0] = None
                for f, _, _, _ in _QUEUE:
                    f.done.set()
                _QUEUE.clear()


def _work():
    while True:
        with _QUEUE_LOCK:
            batch = list(_QUEUE)
            _QUEUE.clear()
            if not batch:
                _WORKER[0] = None
                return
        firsts = [item[0] for item in batch]
        try:
            _build(batch)
        finally:
            batch = None  # the first calls' arrays are let go before their calls go on
            for first in firsts:
                first.done.set()


def _load_all(compiled, arrays, stand_ins):
    """The sync first call: compiles the kernels of every segment of compiled in one batch,
    one compiler per core, before the call runs them. Without it each segment's kernels
    compile when the call reaches it (its input layouts are known only then), one segment
    after another: the MLP's two kernels (GELU+LayerNorm between two matmuls, then SiLU) take
    two compiler rounds. The trace's extern results stand in for the externs, so the dry
    run (Compiled._prebuild) knows every segment's layouts. A failure here is left to the
    call, which builds what it needs and raises as it would have."""
    try:
        compiled._prebuild(arrays, stand_ins)
        type(compiled)._load_pending((compiled,))
    except Exception as e:
        log.debug(
            "fastcompile: first-call batch compile failed (%s: %s); the call compiles its kernels", type(e).__name__, e
        )


def _build(batch):
    """One batch of _work: prebuild every item, then compile their kernels in one go. Empties
    the list: nothing of it (the first calls' input arrays) outlives the build."""
    built = []
    while batch:
        _, compiled, arrays, stand_ins = batch.pop(0)
        try:
            compiled._prebuild(arrays, stand_ins)
            built.append(compiled)
        except BaseException as e:  # the calls build what they need, and raise as without it
            log.debug("fastcompile: background build failed (%s: %s); calls build their kernels", type(e).__name__, e)
        del arrays, stand_ins
    try:
        if built:
            type(built[0])._load_pending(built)
    except BaseException as e:
        log.debug("fastcompile: background compile failed (%s: %s); calls compile their kernels", type(e).__name__, e)


def _reset_after_fork():
    global _QUEUE_LOCK
    _QUEUE_LOCK = threading.Lock()  # a fork may copy it held by the worker the child lacks
    _QUEUE.clear()
    _WORKER[0] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _stand_in(traced):
    """An extern stand-in for the first call: what the extern returned while tracing, as the
    extern's run function hands it to the core (tensors as NumPy views, tuples as tuples). An
    extern whose result is a view of an argument (y[0]) is its own run function: its result
    must view the arrays of this call (the kernels' fresh outputs), not the trace's, for an
    in-place update after a graph break to reach it."""
    result, run, args = traced
    r = tuple(_host(x) for x in result) if isinstance(result, (tuple, list)) else _host(result)
    hosts = [a for a in (_host(x) for x in args) if isinstance(a, np.ndarray)]
    if any(
        isinstance(x, np.ndarray) and np.may_share_memory(x, a)
        for x in (r if isinstance(r, tuple) else (r,))
        for a in hosts
    ):
        return run
    return lambda *a: r


class FxCompiled:
    """Autograd mode's stand-in for a Compiled in reports: the kernels of the forward and
    backward graphs aot_autograd handed to the core so far."""

    def __init__(self, runners):
        self.runners = runners

    @property
    def kernels(self):
        out = []
        for r in self.runners:
            c = getattr(r, "compiled", None)
            out.extend(c.kernels if c is not None else ())
        return out


def _build_fx(tracer, plans, outputs, inputs, slots, nlocalsplus, nfree):
    """Autograd mode: the recorded torch ops as an FX GraphModule, compiled on the first call
    by the torch backend (aot_autograd: forward and backward graphs through the core)."""
    fxg = tracer.fx
    if outputs:
        fxg.output(tuple(v.fx for v in outputs))
    f_globals, f_builtins = tracer.f_globals, tracer.f_builtins
    # aot_autograd's graphs are specialized on the input sizes, which the frame's guards leave
    # free (the core's kernels are not): one compiled graph per tuple of input sizes
    compiled = {}
    runners = []
    has_outputs = bool(outputs)  # run keeps no Var: their examples are the trace's tensors
    input_srcs = [src for src, _ in inputs]
    read_inputs = S.compile_reader(input_srcs)
    where = tracer.lines[0] if tracer.lines else ("?", 0)  # run keeps no tracer (its examples)

    def compile_for(key, tensors):
        import copy
        import torch
        from ..backends import torch as torch_backend

        gm = torch.fx.GraphModule(torch.nn.Module(), copy.deepcopy(fxg))
        limit = config.get("cache_size_limit")
        if len(compiled) >= limit:  # past it: the graph's torch ops, uncompiled
            if len(compiled) == limit:
                log.warning(
                    "fastcompile: a graph of %s:%d was compiled for %d sets of input sizes, "
                    "the limit (cache_size_limit); new sizes run its torch ops uncompiled",
                    where[0],
                    where[1],
                    limit,
                )
            compiled[key] = gm
            return gm
        c = compiled[key] = torch_backend.backend(gm, tensors, record=runners)
        return c

    def run(*values):
        env = _Env.of(slots, values, nlocalsplus - nfree, f_globals, f_builtins)
        outs = ()
        if has_outputs:
            tensors = read_inputs(*env.args)
            env.memo.update(zip(input_srcs, tensors))  # the plans below read these as before
            key = tuple(getattr(t, "shape", None) for t in tensors)
            c = compiled.get(key)
            if c is None:
                c = compile_for(key, tensors)
            outs = c(*tensors)
        return [p(env, outs) for p in plans]

    run.slots = slots
    run.compiled = lambda: FxCompiled(runners) if runners else None
    run.graph = fxg if outputs else None
    run.op_count = tracer.op_count
    run.lines = list(tracer.lines)
    run.fast_target = None
    return run


def _compile(graph, state):
    c = graph.compile()
    c.label = state["label"]
    return c


def _fast_target(vars_, outputs, inputs, slots, state, graph, first=None):
    """For the common frame (NumPy arrays straight from arguments in, one array or a
    tuple of arrays straight out of the graph), a target with no per-call
    bookkeeping: pick the arguments, call the Compiled, pick the outputs. None otherwise."""
    if len(vars_) != 1 or any(
        kind not in ("numpy", "scalar") or not isinstance(src, S.LocalSource) for src, kind in inputs
    ):
        return None
    ret = unlazy(vars_[0])
    items = ret.items if isinstance(ret, TupleVar) else [ret]
    ks = []
    for v in items:
        v = unlazy(v)
        if (
            not isinstance(v, ArrayVar)
            or v.source is not None
            or v.kind != "numpy"
            or isinstance(v.example, np.generic)
        ):
            return None
        ks.append(next(i for i, o in enumerate(outputs) if o is v))
    pos = tuple(slots.index(src.slot) for src, _ in inputs)
    compiled = state["compiled"] = state["compiled"] or _compile(graph, state)
    if first is not None and not first.background and first.inputs is not None:
        _load_all(compiled, tuple(first.inputs), first.stand_ins)  # the first call is next
    # Sync: the Compiled itself, so the first call runs the externs again (NumPy arrays in,
    # arrays out: pure NumPy calls). Async: a Python wrapper until the kernels first run
    picks = []
    fn = compiled if first is None or not first.background else first.wrap(compiled, picks)
    if not isinstance(ret, TupleVar):
        (k,) = ks
        picks.append(_C.Pick(fn, pos, k))  # C: no Python frame per call
        return picks[0]
    if ks == list(range(len(outputs))):
        picks.append(_C.Pick(fn, pos))
        return picks[0]
    return lambda *values: (lambda outs: tuple(outs[k] for k in ks))(fn(*[values[p] for p in pos]))


class _Closure:
    """closure[index].cell_contents read from the free-variable slots."""

    def __init__(self, by_slot, first_free):
        self.by_slot, self.first_free = by_slot, first_free

    def __getitem__(self, i):
        return _Cell(self.by_slot[self.first_free + i])


class _Cell:
    def __init__(self, v):
        self.cell_contents = v


class _Env:
    def __init__(self, by_slot, f_globals, f_builtins, closure):
        self.args = (by_slot, f_globals, f_builtins, closure)
        self.memo = {}

    @classmethod
    def of(cls, slots, values, first_free, f_globals, f_builtins):
        """The frame a compiled target was called with: its slot values."""
        by_slot = dict(zip(slots, values))
        return cls(by_slot, f_globals, f_builtins, _Closure(by_slot, first_free))

    def get(self, src):
        if src not in self.memo:
            self.memo[src] = S.evaluate(src, *self.args)
        return self.memo[src]
