"""The compiled callable of one FX graph (``FxGraphRunner``): its generated call, and batch and
async compile.

In: an FX GraphModule and its example inputs. Out: a callable on the graph's flat inputs that
returns the list of its outputs, running the core's kernels and extern calls.
"""

import functools
import logging
import os
import threading
import time
import weakref

import numpy as np
import torch
import torch.fx

from ... import config
from ... import pending
from ... import pygen
from .channels_last import _ALIAS_OPS, _cl_dense, _cl_strides, _restride, _to_channels_last, _wants_channels_last
from .lowering import _Lowering
from .values import (
    _Cluster,
    _GraphFallback,
    _Rec,
    _graph_device,
    _layout_of,
    _meta,
    _on_device,
    _to_core,
    _to_numpy,
    _to_torch,
)

log = logging.getLogger("fastcompile.backends.torch")


def _drop_dead_random(gm):
    """Removes random ops nothing reads (and what only they read) from gm, as the partitioner's
    dead-code pass means to: outside Dynamo (fastcompile.compile, a deferred async compile) a
    backward graph of aot_autograd's keeps a dead native_dropout of the forward's, which a plain
    run of gm (async compile, a fallback) would execute, moving the generator on."""
    g = gm.graph
    if any(
        n.op == "call_function" and not n.users and getattr(n.target, "_nondeterministic_seeded", False)
        for n in g.nodes
    ):
        g.eliminate_dead_code(is_impure_node=lambda n: n.is_impure(impure_random=False))
        gm.recompile()


def _convert_input(cache, mode, device, i, t):
    """Input i of a runner as the array the core reads (FxGraphRunner._convert; a function of the
    runner's cache, mode and device, so the generated call (_make_fast) does not hold the runner).
    Parameters (any input, in reduce-overhead mode) are converted once per tensor, storage and
    version: the cache holds the tensor, so its id cannot be reused while the entry stands, and an
    in-place update moves the version. Not a bfloat16 one: its array is a float32 copy, and an
    update through .data (an EMA's p.data.mul_) moves no version the tensor shows, so the copy is
    made at every call (a float32 tensor's array is a view: it sees such updates)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("fastcompile: input %d is a %s, the graph was compiled for a tensor" % (i, type(t)))
    cached = (type(t) is torch.nn.Parameter or mode == "reduce-overhead") and t.dtype != torch.bfloat16
    if cached:
        key = (id(t), t.data_ptr(), t._version)
        hit = cache.get(i)
        if hit is not None and hit[0] == key:
            return hit[1]
    d = t.detach() if t.requires_grad else t  # .numpy() refuses a tensor that requires grad
    if device is not None:  # CPU inputs of a CUDA graph stay as they are: externs read them
        a = d.float() if d.dtype == torch.bfloat16 and d.device == device else d
    else:
        a = d.float().numpy() if d.dtype == torch.bfloat16 else d.numpy()
    if cached:
        cache[i] = (key, a, t)
    return a


def _replayable_view(node):
    """``node``'s op returns a view of its first argument (its schema says so: detach, alias, view,
    permute, slice, expand, as_strided, ...) and no other argument is an FX value, so the op can
    be replayed in torch on whatever tensor the first argument is."""
    if (
        node.op != "call_function"
        or not isinstance(node.target, torch._ops.OpOverload)
        or not node.args
        or not isinstance(node.args[0], torch.fx.Node)
    ):
        return False
    rets = node.target._schema.returns
    if len(rets) != 1 or str(rets[0].type) != "Tensor" or rets[0].alias_info is None or rets[0].alias_info.is_write:
        return False
    found = []
    torch.fx.node.map_arg((node.args[1:], node.kwargs), found.append)
    return not found


def _output_views(outs, placeholders):
    """Graph outputs that are another output again, or views of one value (not a graph input)
    that another output also is or views. In eager they share that value's memory and version
    counter: an in-place update of one shows in the others, and autograd notices an update of a
    tensor saved for backward (aot_autograd's forward graphs return a value and, as saved for
    backward, its detach()). The core would give each its own array and each array its own
    tensor, so such outputs are made in torch instead, from the root's tensor by the same view
    ops. Returns ({position: (root position, ((op, args, kwargs), ...) from the root, the view as
    one as_strided or None)}, hidden): hidden are roots that are no output, computed after the
    outputs and not returned."""
    groups = {}  # root node -> [(position, chain)]
    for n, o in enumerate(outs):
        if not isinstance(o, torch.fx.Node) or o in placeholders:
            continue
        chain, r = [], o
        while _replayable_view(r) and len(chain) < 16:
            chain.append(r)
            r = r.args[0]
        if r not in placeholders:
            groups.setdefault(r, []).append((n, chain[::-1]))
    views, hidden = {}, []
    for r, members in groups.items():
        if len(members) < 2:
            continue
        root = next((n for n, chain in members if not chain), None)
        if root is None:
            root = len(outs) + len(hidden)
            hidden.append(r)
        for n, chain in members:
            if n != root:
                views[n] = (
                    root,
                    tuple((c.target, tuple(c.args[1:]), dict(c.kwargs)) for c in chain),
                    _as_strided_of(r, outs[n]),
                )
    return views, hidden


def _as_strided_of(root, node):
    """View ``node`` of ``root`` as one as_strided of the root's tensor: (size, stride, storage
    offset from the root's), read from the FX metadata; None where that would not be the same
    view (another dtype, symbolic sizes, an expanded root whose tensor may be laid out otherwise).
    One call instead of the chain's (a transformer block's saved q, k and v are four ops each)."""
    rm, vm = _meta(root), _meta(node)
    if not isinstance(rm, torch.Tensor) or not isinstance(vm, torch.Tensor) or rm.dtype != vm.dtype or rm.is_complex():
        return None
    ints = (*rm.shape, *rm.stride(), *vm.shape, *vm.stride(), rm.storage_offset(), vm.storage_offset())
    if any(type(v) is not int for v in ints) or any(st == 0 for n, st in zip(rm.shape, rm.stride()) if n > 1):
        return None
    return tuple(vm.shape), tuple(vm.stride()), vm.storage_offset() - rm.storage_offset()


class FxGraphRunner:
    """One lowered FX graph: call it with the graph's flat inputs, get the list of its outputs.

    ``compiled`` is the fastcompile ``Compiled`` (``compiled.kernels`` lists generated kernels);
    ``core_ops`` / ``extern_nodes`` / ``extern_calls`` count how the FX nodes were split;
    ``fallback`` is None, or the reason the graph runs as plain torch."""

    def __init__(
        self,
        gm,
        example_inputs,
        mode="default",
        inference=False,
        free_outputs=frozenset(),
        cl_inputs=frozenset(),
        training_forward=False,
    ):
        self.gm = gm
        self.mode = mode
        self.inference = inference
        self.training_forward = training_forward and not inference
        self.free_outputs = free_outputs  # output indexes only the backward reads (saved values)
        self.cl_inputs = cl_inputs  # placeholder names the forward hands over channels_last
        self.cl_outputs = frozenset()  # FX names of the outputs returned channels_last
        self.fallback = None
        self.compiled = None
        self.device = None  # the CUDA device the graph runs on; None: CPU
        self.core_ops = self.extern_nodes = self.extern_calls = 0
        self.lowered_targets = []
        self._warming = None  # async compile: the background build (_Warming), once started
        t0 = time.perf_counter()
        _drop_dead_random(gm)
        try:
            self._lower(gm, example_inputs)
        except _GraphFallback as e:
            self.fallback = str(e)
            log.info("fastcompile: graph runs as plain torch: %s", e)
        except Exception as e:  # never fail compilation
            self.fallback = "%s: %s" % (type(e).__name__, e)
            log.warning("fastcompile: graph runs as plain torch: %s", self.fallback, exc_info=True)
        self._fast = None  # the generated call (_make_fast), made by the first call that runs kernels
        self._pending = False  # batch compile: plans rendered, waiting for _load_pending()
        self._batch = None  # batch compile: the _Batch that took them, once one did
        # batch compile renders the plans of NumPy stand-ins: CPU graphs only (NVRTC compiles
        # a CUDA graph's kernels at its first call)
        if self.compiled is not None and self.fallback is None and config.get("batch_compile") and self.device is None:
            self._prebuild()
        self._async = self.compiled is not None and bool(config.get("async_compile"))
        if self._async:
            pending.add(self)
        self.lower_s = time.perf_counter() - t0

    def _prebuild(self):
        """Batch compile: a dry run of the compiled graph (Compiled._prebuild) on empty arrays laid
        out as the FX metadata says the inputs and every extern cluster's results will be, so
        every segment's kernels are rendered now (no kernel runs, none compiles). The first call
        of any runner then compiles the pending kernels of every runner in one batch, on every
        core (_load_pending): a graph's segments, and the forward and backward graphs, do not
        compile one after another. Where a layout was mispredicted, the real call builds that
        plan itself, as without the batch."""
        try:
            arrays = [p if k == "const" else _fake_array(self._arg_layouts[p]) for k, p in self.inputs]
            stand_ins = [fn if nodes is None else _fake_results(nodes, self._cl_results) for fn, nodes in self._replays]
            self.compiled._prebuild(tuple(arrays), stand_ins)
        except Exception as e:  # e.g. a layout the metadata did not tell: the call builds it
            log.debug("fastcompile: no batch compile for this graph: %s: %s", type(e).__name__, e)
        # after a failure too: the plans rendered before it still compile in the batch
        self._pending = True
        with _PENDING_LOCK:
            _PENDING.add(self)

    def _lower(self, gm, example_inputs):
        # a backward handed channels_last values runs channels_last whether or not it has a
        # convolution of its own: its externs then get those values in eager's layout where
        # they read strides (_STRIDED_READS), as in a graph with one
        L = _Lowering(
            gm,
            example_inputs,
            channels_last=_wants_channels_last(gm, example_inputs)
            or (bool(self.cl_inputs) and _graph_device(example_inputs) is None),
            cl_inputs=self.cl_inputs,
            training_forward=self.training_forward,
        )
        out_node = L.run()
        outs = out_node.args[0]
        single = not isinstance(outs, (tuple, list))
        outs = [outs] if single else list(outs)
        # per output: ("core", index, tshape, dtype, copy, layout) | ("arg", i) | ("py", v)
        # | ("view", root position, chain, strided) (_output_views)
        core_values = []
        placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}

        def entry(o, free=False):
            if isinstance(o, torch.fx.Node) and o in placeholders:
                return ("arg", placeholders[o])
            if not isinstance(o, torch.fx.Node):
                return ("py", o)
            v = L.env.get(o)
            if isinstance(v, _Cluster):
                L.flush(v)
                v = L.env[o]
            if not isinstance(v, _Rec):
                return ("py", v)
            copy = v.value.node in L.input_values or not v.exact
            core_values.append(v.value)
            shape = tuple(_meta(o).shape)
            return (
                "core",
                len(core_values) - 1,
                v.tshape,
                v.dtype,
                copy,
                (shape, _cl_strides(shape)) if free else L.layout(_meta(o), v.value, v.tshape),
            )

        views, hidden = _output_views(outs, placeholders)
        every = outs + hidden
        # channels_last convolutions: the rank-4 outputs only the backward reads (saved
        # activations) come back channels_last, as the core makes them after such a convolution,
        # and the backward expects them so (cl_outputs: their FX names); so do aliases of one
        # (made by their view ops, not as_strided with eager's strides). A root that other
        # outputs view otherwise keeps eager's layout.
        free = {n for n in self.free_outputs if L.channels_last and _cl_dense(_meta(every[n]))}
        for n, (root, chain, _) in views.items():
            if n not in free or any(c[0] not in _ALIAS_OPS for c in chain):
                free.discard(root)
        plan = [None if n in views else entry(o, n in free) for n, o in enumerate(every)]
        for n, (root, chain, strided) in sorted(views.items()):
            if plan[root][0] != "core":
                plan[n] = entry(every[n])
                free.discard(n)
            else:
                plan[n] = ("view", root, chain, None if root in free else strided)
                if root not in free:
                    free.discard(n)
        self.cl_outputs = frozenset(every[n].name for n in free if plan[n][0] in ("core", "view"))
        if core_values:
            L.g.output(*core_values)
            self.compiled = L.g.compile()
            if self.mode == "max-autotune":
                self.compiled.autotune = True  # per kernel and launch shape (Compiled.tuning)
        self.plan = plan
        self.n_outputs = len(outs)
        self.single = single
        self.inputs = L.inputs
        self.core_ops = L.core_ops
        self.extern_nodes = L.extern_nodes
        self.extern_calls = L.extern_calls
        self.lowered_targets = [n.target for n in L.lowered]
        self._arg_bf16 = (
            {
                i
                for k, i in L.inputs
                if k == "arg"
                and isinstance(example_inputs[i], torch.Tensor)
                and example_inputs[i].dtype == torch.bfloat16
            }
            if example_inputs
            else set()
        )
        self.device = L.device
        self._arrays = [
            (p if L.device is None else _on_device(p, L.device)) if k == "const" else None for k, p in L.inputs
        ]
        passed = {j for j, v in enumerate(L.input_nodes) if v in L.passed}
        self._arg_slots = [(j, i) for j, (k, i) in enumerate(L.inputs) if k == "arg" and j not in passed]
        self._passed_slots = [(j, i) for j, (k, i) in enumerate(L.inputs) if k == "arg" and j in passed]
        self._cache = {}
        self._replays = L.g.replays
        self._cl_results = frozenset(L.cl_results)
        self._arg_layouts = L.arg_layouts
        self._cl_args = L.cl_args
        self.channels_last = L.channels_last

    @property
    def kernels(self):
        return self.compiled.kernels if self.compiled is not None else []

    def _convert(self, i, t):
        return _convert_input(self._cache, self.mode, self.device, i, t)

    def _core_args(self, args):
        """The compiled graph's arguments for a call with ``args``: a new list per call, since
        threads may call one graph at once."""
        arrays = list(self._arrays)
        for j, i in self._arg_slots:
            arrays[j] = self._convert(i, _to_channels_last(args[i]) if i in self._cl_args else args[i])
        for j, i in self._passed_slots:
            arrays[j] = args[i]
        return arrays

    # -- async compile (config.async_compile) ------------------------------------------------------
    @property
    def ready(self):
        """Whether calls run the compiled kernels: always, except while an async compile runs."""
        w = self._warming
        return not self._async or (w is not None and w.done)

    @property
    def ready_s(self):
        """Async compile: seconds from the first call until the background build ended (None
        before, and without async compile)."""
        w = self._warming
        return w.ready_s if w is not None and w.done else None

    def wait(self, timeout=None):
        """Async compile: wait for the background build (at most `timeout` s); returns ready.
        Returns False at once while no call has started the build."""
        w = self._warming
        if w is not None and w.pid == os.getpid() and not w.done:
            w.thread.join(timeout)
        return self.ready

    def _call_async(self, args):
        """The graph's outputs computed as plain torch while the kernels build in a background
        thread; None once they are built (the caller runs them)."""
        w = self._warming
        if w is None or w.pid != os.getpid():  # the first call (or the first in a fork)
            return self._start_warming(args)
        if not w.done:
            return self._plain(args)
        self._async = False
        if w.error is not None:
            log.warning(
                "fastcompile: the background compile failed (%s: %s); compiling on this call",
                type(w.error).__name__,
                w.error,
            )
        return None

    def _plain(self, args):
        out = self.gm(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def _start_warming(self, args):
        """Runs the graph as plain torch, keeping what each extern cluster returned, and starts a
        thread that runs the compiled graph once with those values standing in for the clusters
        (Compiled._warm): every segment's plan is built for the layouts a real call will bring,
        and no torch op (a matmul, a random op drawing from the generator) runs a second time."""
        t0 = time.perf_counter()
        keep = {n for _, nodes in self._replays if nodes for n in nodes}
        rec = _Recorder(self.gm, keep)
        out = rec.run(*args)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        arrays = self._core_args(args)
        stand_ins = [fn if nodes is None else _replay(rec.values, nodes) for fn, nodes in self._replays]
        w = _Warming()

        def build(arrays=tuple(arrays), stand_ins=stand_ins):
            try:
                if self._pending:
                    _load_pending(self)
                self.compiled._warm(arrays, stand_ins)
            except BaseException as e:  # reported by the next call, which builds again
                w.error = e
            finally:
                w.ready_s = time.perf_counter() - t0
                w.done = True

        w.thread = threading.Thread(target=build, name="fastcompile-build")
        try:
            w.thread.start()
        except RuntimeError as e:  # no thread to be had: build on the next call
            log.warning("fastcompile: no background compile (%s)", e)
            w.error, w.done = e, True
        self._warming = w
        log.info("fastcompile: %d core ops compiling in the background; plain torch until then", self.core_ops)
        return out

    def _make_fast(self):
        """The graph's call once lowered and built, as one generated straight-line function (args
        -> outputs): the conversions of each input and output are decided once, here, not per item
        and call (per step of a small model's training, that would be most of the time the runner
        adds to the torch ops it calls). CPU tensors convert inline; parameters, bfloat16 inputs,
        reduce-overhead mode and CUDA graphs go through _convert_input (its cache). It holds what
        it calls, not the runner: a runner stays free of reference cycles."""
        glob = {
            "compiled": self.compiled,
            "from_numpy": torch.from_numpy,
            "BF16": torch.bfloat16,
            "convert": functools.partial(_convert_input, self._cache, self.mode, self.device),
            "_to_torch": _to_torch,
            "_restride": _restride,
            "Tensor": torch.Tensor,
            "_cl": _to_channels_last,
        }
        lines, arrays = [], []
        for j, k in enumerate(self._arrays):
            if k is not None:
                glob["k%d" % j] = k
            arrays.append("k%d" % j)
        slow = self.mode == "reduce-overhead" or self.device is not None
        for j, i in self._arg_slots:
            arg = "_cl(args[%d])" % i if i in self._cl_args else "args[%d]" % i  # channels_last on entry
            if slow or i in self._arg_bf16:
                lines.append("a%d = convert(%d, %s)" % (j, i, arg))
            else:  # a plain tensor inline; a Parameter (cached), bfloat16 or a wrong type: _convert
                lines.append("t = %s" % arg)
                lines.append(
                    "a%d = (t.detach() if t.requires_grad else t).numpy() "
                    "if type(t) is Tensor and t.dtype is not BF16 else convert(%d, t)" % (j, i)
                )
            arrays[j] = "a%d" % j
        for j, i in self._passed_slots:
            arrays[j] = "args[%d]" % i
        lines.append("res = compiled(%s)" % ", ".join(arrays) if self.compiled is not None else "res = ()")
        outs = {}  # output position -> its expression
        for n, p in enumerate(self.plan):
            if p[0] == "view":
                continue
            if p[0] == "core":
                _, k, tshape, dtype, copy, layout = p
                glob["s%d" % n], glob["d%d" % n], glob["l%d" % n] = tshape, dtype, layout
                lines.append("a = res[%d]" % k)
                same = "a" if self.device is not None else "from_numpy(a)"  # on CUDA: a tensor
                lines.append("o%d = %s if a.shape == s%d else _to_torch(a, s%d, d%d)" % (n, same, n, n, n))
                if layout is not None:
                    glob["w%d" % n] = layout[1]
                    if copy:
                        lines.append("o%d = _restride(o%d, l%d, d%d, True)" % (n, n, n, n))
                    else:
                        lines.append(
                            "if o%d.stride() != w%d or o%d.dtype != d%d:\n        o%d = _restride(o%d, l%d, d%d)"
                            % (n, n, n, n, n, n, n, n)
                        )
                else:
                    lines.append("if o%d.dtype != d%d:\n        o%d = o%d.to(d%d)" % (n, n, n, n, n))
                    if copy:
                        lines.append("else:\n        o%d = o%d.clone()" % (n, n))
                outs[n] = "o%d" % n
            elif p[0] == "arg":
                outs[n] = "args[%d]" % p[1]
            else:
                glob["c%d" % n] = p[1]
                outs[n] = "c%d" % n
        for n, p in enumerate(self.plan):  # after their roots: views of other outputs, in torch
            if p[0] == "view":
                _, root, chain, strided = p
                t = outs[root]
                if strided is not None:
                    glob["z%d" % n], glob["y%d" % n] = strided[:2]
                    lines.append(
                        "o%d = %s.as_strided(z%d, y%d, %s.storage_offset() + %d)" % (n, t, n, n, t, strided[2])
                    )
                    outs[n] = "o%d" % n
                    continue
                for k, (op, rest, kwargs) in enumerate(chain):
                    glob["v%d_%d" % (n, k)], glob["r%d_%d" % (n, k)], glob["w%d_%d" % (n, k)] = op, rest, kwargs
                    t = "v%d_%d(%s, *r%d_%d, **w%d_%d)" % (n, k, t, n, k, n, k)
                lines.append("o%d = %s" % (n, t))
                outs[n] = "o%d" % n
        lines.append("return [%s]" % ", ".join(outs[n] for n in range(self.n_outputs)))
        return pygen.function(lines, "run", "args", "<fastcompile runner>", glob)

    def __call__(self, *args):
        fast = self._fast
        if fast is not None:
            return fast(args)
        if self.fallback is not None:
            return self._plain(args)
        if self._pending and not self._async:
            _load_pending(self)
        if self._async:
            out = self._call_async(args)
            if out is not None:
                return out
        self._fast = self._make_fast()  # this call and every later one
        return self._fast(args)


class _Warming:
    """One runner's background build (async compile): its thread, and how and when it ended."""

    def __init__(self):
        self.pid = os.getpid()
        self.thread = None
        self.done = False
        self.error = None
        self.ready_s = None


class _Recorder(torch.fx.Interpreter):
    """Runs an FX graph as plain torch, keeping the values of the nodes in `keep`."""

    def __init__(self, gm, keep):
        super().__init__(gm)
        self.keep = keep
        self.values = {}

    def run_node(self, n):
        r = super().run_node(n)
        if n in self.keep:
            self.values[n] = r
        return r


# batch compile (FxGraphRunner._prebuild): runners whose rendered kernels wait for a batch
_PENDING = weakref.WeakSet()
_PENDING_LOCK = threading.Lock()  # guards _PENDING and each runner's _batch; held briefly


def _new_lock_in_child():
    global _PENDING_LOCK
    _PENDING_LOCK = threading.Lock()  # a fork may copy it held by a thread the child does not have


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


class _Batch:
    """One batch compile: the process that runs it, and when it is done."""

    def __init__(self):
        self.pid = os.getpid()
        self.done = threading.Event()


def _load_pending(runner):
    """Compiles the pending kernels of every runner in one batch (Compiled._load_pending), for
    `runner`'s call: the compiler runs on every core, for a graph's segments and for the forward
    and backward graphs alike. A runner another thread's batch took waits for that batch (outside
    the lock). A compile failure is left to the calls that need the kernel, which raise it as
    without the batch; in a forked child, a batch of the parent's is not waited for."""
    with _PENDING_LOCK:
        batch = runner._batch
        if batch is not None and batch.pid != os.getpid():
            runner._pending = False  # the parent's batch: this call loads its own plans
            return
        mine = batch is None
        if mine:  # runner is in _PENDING (from _prebuild until a batch takes it)
            batch = _Batch()
            runners = [r for r in list(_PENDING) if r._pending]
            for r in runners:
                r._batch = batch
                _PENDING.discard(r)
    if not mine:
        batch.done.wait()
        return
    try:
        type(runner.compiled)._load_pending([r.compiled for r in runners])
    except Exception as e:
        log.debug("fastcompile: batch compile failed (%s: %s); each call compiles its own", type(e).__name__, e)
    finally:
        for r in runners:
            r._pending = False
        batch.done.set()


def _fake_array(layout):
    """An uninitialised NumPy array of a _layout_of layout (None: the empty array _to_numpy gives
    for a slot nobody reads): the layout selects the plan."""
    if layout is None:
        return np.empty((0,), np.float32)
    dt, shape, strides = layout
    if any(n == 0 for n in shape):
        return np.empty(shape, dt)
    base = np.empty(1 + sum((n - 1) * st for n, st in zip(shape, strides)), dt)
    return np.lib.stride_tricks.as_strided(base, shape, tuple(st * base.itemsize for st in strides))


def _stand_in(res):
    """An extern stand-in returning the arrays `res` as an extern cluster of len(res) results
    would (one array, or a tuple)."""
    if len(res) == 1:
        return lambda *a: res[0]
    res = tuple(res)
    return lambda *a: res


def _fake_results(nodes, cl_results=frozenset()):
    """An extern stand-in for _prebuild: empty arrays laid out as the cluster's results will be
    (those in cl_results channels_last)."""
    res = []
    for n in nodes:
        layout = _layout_of(_meta(n))
        if n in cl_results and layout is not None:
            layout = (layout[0], layout[1], _cl_strides(layout[1]))
        res.append(_fake_array(layout))
    return _stand_in(res)


def _replay(values, nodes):
    """An extern stand-in returning, as an extern cluster would, the arrays of recorded values
    (CUDA tensors stay tensors)."""
    return _stand_in(
        [
            _to_core(values[n]) if isinstance(values[n], torch.Tensor) and values[n].is_cuda else _to_numpy(values[n])
            for n in nodes
        ]
    )


def fx_to_graph(
    gm,
    example_inputs,
    mode="default",
    inference=False,
    free_outputs=frozenset(),
    cl_inputs=frozenset(),
    training_forward=False,
):
    """Lower one FX graph (aten ops, or Dynamo's torch-level ops, which mostly become externs) to
    a fastcompile graph. Returns an ``FxGraphRunner``: ``runner(*tensors) -> list``. inference:
    aot_autograd's graph of a call without autograd (no backward will read what it saves): its
    2-d convolutions may run channels_last."""
    return FxGraphRunner(
        gm,
        example_inputs,
        mode=mode,
        inference=inference,
        free_outputs=free_outputs,
        cl_inputs=cl_inputs,
        training_forward=training_forward,
    )
