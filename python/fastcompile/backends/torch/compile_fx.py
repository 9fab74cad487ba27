"""The torch.compile backend: Dynamo's graph through aot_autograd, each forward and backward
graph lowered to a runner; symbolic sizes compile per set of sizes, async compile may defer it.

In: ``backend(gm, example_inputs, mode=..., options=...)``, Dynamo's backend contract. Out: a
callable on the graph's flat inputs.
"""

import functools
import itertools
import logging
import os
import re
import threading

import torch
import torch.fx

from ... import config
from ... import pending
from .decomposition import decompositions
from .runner import fx_to_graph

log = logging.getLogger("fastcompile.backends.torch")


MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _parse_options(mode, options):
    mode = mode or "default"
    if mode not in MODES:
        raise ValueError("fastcompile backend: unknown mode %r (modes: %s)" % (mode, ", ".join(MODES)))
    knobs = {}
    names = {k.name for k in config.KNOBS}
    for key, val in (options or {}).items():
        key = key.replace("-", "_")
        if key == "mode":
            mode = val
        elif key in names:
            knobs[key] = val
        else:
            raise ValueError(
                "fastcompile backend: unknown option %r (options: mode, %s)" % (key, ", ".join(sorted(names)))
            )
    if mode == "max-autotune-no-cudagraphs":
        mode = "max-autotune"
    return mode, knobs


_graph_numbers = itertools.count()


def _graph_label(gm, what):
    """A graph's name in fastcompile.profile(): "forward graph 3 (model.py:12)", the file:line
    of the user's code its first node with a stack trace came from."""
    label = "%s graph %d" % (what, next(_graph_numbers))
    for n in gm.graph.nodes:
        found = re.findall(r'File "([^"]+)", line (\d+)', n.meta.get("stack_trace") or "")
        if found:
            return "%s (%s:%s)" % (label, os.path.basename(found[-1][0]), found[-1][1])
    return label


def backend(gm, example_inputs, mode=None, options=None, record=None):
    """``torch.compile(model, backend="fastcompile", mode=..., options={...})``.

    mode: "default"; "reduce-overhead" (inputs seen before are not re-wrapped, extern results
    reuse their buffers is left to the core's pool); "max-autotune" (each kernel times a few
    thread counts and column-block widths per launch shape on first use and keeps the fastest:
    ``Compiled.autotune``, see ``runner.compiled.tuning``). options: any ``fastcompile.config`` knob
    (``num_threads``, ``serial_below``, ``pool_mb``, ``cflags``, ...), set process-wide.
    record: a list that receives every ``FxGraphRunner`` built (forward and backward graphs);
    with async_compile and async_delay_calls > 0, when a later call lowers the graph."""
    mode, knobs = _parse_options(mode, options)
    if knobs:
        config.set(**knobs)
    delay = int(config.get("async_delay_calls")) if config.get("async_compile") else 0
    if delay > 0 and _deferrable(example_inputs):
        fake_mode, fakes = _fakes(example_inputs)
        later = functools.partial(_compile_later, gm, fake_mode, fakes, mode, record)
        return torch._dynamo.disable(
            _Deferred(gm, delay, later), reason="fastcompile: a graph whose compile waits for a later call"
        )
    varying = _varying_inputs(gm, example_inputs)
    if varying:
        return _PerSize(gm, varying, example_inputs, mode, record)  # Dynamo disables its frames
    try:
        if torch._guards.TracingContext.try_get() is None and _deferrable(example_inputs):
            # outside Dynamo (fastcompile.compile): a tracing context as Dynamo's, where
            # aot_autograd leaves its metadata (_saved_outputs reads which outputs it saves)
            return _compile_later(gm, *_fakes(example_inputs), mode, record)
        return _compile(gm, example_inputs, mode, record)
    except Exception as e:
        # aot_autograd refuses some graphs Dynamo hands over (x.data = y on an input: a set_ it
        # cannot keep); the graph then runs as plain torch, as the eager backend would run it
        if not config.get("suppress_errors"):
            raise
        log.warning("fastcompile: graph runs as plain torch: %s: %s", type(e).__name__, str(e).split("\n")[0][:300])
        return gm


def _symbolic(v):
    """Whether v is a SymInt/SymFloat/SymBool, or a tensor with a symbolic size or stride."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(v, torch.Tensor):
        try:
            return any(not isinstance(n, int) for n in (*v.shape, *v.stride()))
        except RuntimeError:  # a sparse tensor has no strides
            return any(not isinstance(n, int) for n in v.shape)
    return False


def _varying_inputs(gm, example_inputs):
    """The positions of the graph inputs whose sizes Dynamo left symbolic (dynamic=True,
    mark_dynamic, or automatic dynamic after a size changed), in its placeholders' example values
    or in the example inputs themselves (a SymInt input: a symbolic size passed on its own).
    Empty for a static graph."""
    metas = [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]
    if len(metas) != len(example_inputs):
        metas = [None] * len(example_inputs)
    return tuple(i for i, (m, e) in enumerate(zip(metas, example_inputs)) if _symbolic(m) or _symbolic(e))


class _PerSize:
    """A graph with symbolic sizes, compiled once per set of concrete sizes. Our kernels take
    their sizes at launch (a kernel compiled for one size serves every size), but the lowering
    reads static shapes: so each new set of sizes of the varying inputs (their sizes and strides,
    the values of the SymInt inputs) gets aot_autograd's static graphs and our lowering of them,
    built at the call that brings it (milliseconds to a few tenths of a second; no kernel
    compiles again). Past cache_size_limit sets, a new one runs Dynamo's graph as plain torch,
    with a warning once; an error building one is logged and that size runs as plain torch."""

    def __init__(self, gm, varying, example_inputs, mode, record):
        self.gm = gm
        self.mode = mode
        self.record = record
        self.compiled = {}  # key -> the compiled graph (or gm, for plain torch)
        self.lock = threading.Lock()
        # key(args): the set of sizes a call brings, each varying tensor's sizes and strides and
        # each other varying input's value (a size); generated, as it runs at every call.
        # Dynamo's guards keep each input's kind (and dtype, device) what the examples show.
        parts = []
        for i in varying:
            e = example_inputs[i]
            if isinstance(e, torch.Tensor):
                parts.append("a[%d].shape, a[%d].stride()" % (i, i) if e.layout == torch.strided else "a[%d].shape" % i)
            else:
                parts.append("a[%d]" % i)
        self.key = eval("lambda a: (%s,)" % ", ".join(parts))  # noqa: S307 (our own text)

    def __call__(self, *args):
        key = self.key(args)
        fn = self.compiled.get(key)
        if fn is None:
            with self.lock:
                fn = self.compiled.get(key)
                if fn is None:
                    fn = self.compiled[key] = self._build(args)
        return fn(*args)

    def _build(self, args):
        limit = config.get("cache_size_limit")
        n = len(self.compiled)
        if n >= limit:
            if n == limit:
                log.warning(
                    "fastcompile: a graph with symbolic sizes was compiled for %d sets of sizes, the "
                    "limit (cache_size_limit); new sizes run it as plain torch",
                    limit,
                )
            return self.gm
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        try:
            gm = _bind_inputs(self.gm, {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)})
            fn = _compile_later(
                gm,
                fake_mode,
                [fake_mode.from_tensor(args[i], static_shapes=True) for i in tensors],
                self.mode,
                self.record,
            )
            if len(tensors) == len(args):
                return fn
            pick = eval("lambda fn: lambda *a: fn(%s)" % "".join("a[%d], " % i for i in tensors))  # noqa: S307
            return pick(fn)
        except Exception as e:  # never fail a call: this size runs as plain torch
            if not config.get("suppress_errors"):
                raise
            log.warning(
                "fastcompile: a graph with symbolic sizes runs as plain torch for sizes %s: %s: %s",
                self.key(args),
                type(e).__name__,
                str(e).split("\n")[0][:300],
            )
            return self.gm


def _bind_inputs(gm, values):
    """A copy of gm whose inputs at the positions in values (position -> a Python int, float or
    bool: a symbolic size's value for one call) are those constants in the code; the copy takes
    the other inputs only. gm itself if values is empty."""
    if not values:
        return gm
    graph = torch.fx.Graph()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # graph_copy skips the nodes env maps already: the bound inputs' uses read the constants
    rv, out_node = graph.graph_copy(gm.graph, {placeholders[i]: v for i, v in values.items()}, return_output_node=True)
    graph.output(rv, type_expr=out_node.type)
    out = torch.fx.GraphModule(gm, graph)
    out.meta.update(getattr(gm, "meta", {}))
    return out


def _deferrable(example_inputs):
    """Whether a graph's lowering can wait for a later call: every input a tensor of static
    shape. A SymInt input (Dynamo passes the symbolic sizes of a dynamic graph as inputs of
    their own) means aot_autograd may add guards, which only Dynamo's compile of the frame can
    install."""
    return all(isinstance(t, torch.Tensor) and not _symbolic(t) for t in example_inputs)


def _fakes(example_inputs):
    """(fake mode, fake copies of the example inputs) for a deferred lowering: Dynamo hands the
    backend the caller's real tensors, which must be neither kept (memory: a graph after a
    break gets activations) nor read later (the caller may have resized or restrided them in
    place). The fake mode is Dynamo's, with its shape env (a .item() in the graph makes an
    unbacked size aot_autograd needs it for); outside Dynamo (fastcompile.compile), a new one."""
    from torch._guards import TracingContext
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    ctx = TracingContext.try_get()
    fake_mode = ctx.fake_mode if ctx is not None and ctx.fake_mode is not None else FakeTensorMode()
    return fake_mode, [t if is_fake(t) else fake_mode.from_tensor(t, static_shapes=True) for t in example_inputs]


def _compile_later(gm, fake_mode, fakes, mode, record):
    """_compile for a deferred graph, in a tracing context of its own around Dynamo's fake mode
    (aot_autograd takes the fake mode from the context, as under Dynamo)."""
    from torch._guards import TracingContext, tracing

    with tracing(TracingContext(fake_mode)):
        return _compile(gm, fakes, mode, record)


class _Deferred:
    """Async compile with async_delay_calls = N: Dynamo's graph runs as plain torch for its
    first N calls; call N + 1 hands it to aot_autograd and the lowering (_compile_later, with
    fake copies of the example inputs Dynamo gave), and the runners start their background
    build at once. The first calls pay neither aot_autograd's tracing nor the compiler
    processes sharing their cores. An error there is logged and the graph stays plain torch."""

    def __init__(self, gm, calls, compile_fn):
        self.gm = gm
        self.calls = calls  # plain calls left
        self.compile_fn = compile_fn
        self.fn = None  # the compiled graph, once call N + 1 made it
        self.lock = threading.Lock()
        pending.add(self)

    @property
    def ready(self):
        """Lowered (its runners, registered themselves, say when their kernels are built)."""
        return self.fn is not None

    def wait(self, timeout=None):
        return self.ready  # nothing to wait for: the lowering waits for a call

    def __call__(self, *args):
        fn = self.fn
        if fn is None:
            with self.lock:
                fn = self.fn
                if fn is None and self.calls > 0:
                    self.calls -= 1
                elif fn is None:
                    try:
                        fn = self.compile_fn()
                    except Exception as e:  # never fail a call: the graph stays plain torch
                        log.warning(
                            "fastcompile: graph runs as plain torch: %s: %s", type(e).__name__, e, exc_info=True
                        )
                        fn = self.gm
                    self.fn = fn
                    self.compile_fn = None  # and the fake inputs it held
        if fn is None:
            return self.gm(*args)
        return fn(*args)


def _saved_outputs(fx_gm, n_user):
    """Indexes of the outputs of aot_autograd's forward graph fx_gm that only its backward reads
    (saved activations), which may come back in any layout: channels_last convolutions' results
    stay so into the backward's. aot_autograd puts mutated inputs first (as many as its metadata
    says), then the n_user outputs of the user's graph, then the saved values (as Inductor reads
    them). Empty where no tracing context tells."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    start = getattr(meta, "num_mutated_inp_runtime_indices", None)
    if start is None:
        return frozenset()
    outs = torch.utils._pytree.arg_tree_leaves(*next(n for n in reversed(fx_gm.graph.nodes) if n.op == "output").args)
    return frozenset(range(start + n_user, len(outs)))


def _compile(gm, example_inputs, mode, record):
    """The backend's work: aot_autograd's forward and backward graphs, each lowered to a runner."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    n_user = len(
        torch.utils._pytree.arg_tree_leaves(*next(n for n in reversed(gm.graph.nodes) if n.op == "output").args)
    )

    handed = []  # FX names of the values the forward graph hands its backward channels_last

    def compile_graph(fx_gm, inputs, inference=False, what="forward"):
        free = _saved_outputs(fx_gm, n_user) if what == "forward" else frozenset()
        runner = fx_to_graph(
            fx_gm,
            inputs,
            mode=mode,
            inference=inference,
            free_outputs=free,
            cl_inputs=frozenset(handed) if what == "backward" else frozenset(),
            training_forward=what == "forward" and not inference,
        )
        if what == "forward":
            handed[:] = runner.cl_outputs
        if runner.compiled is not None:
            runner.compiled.label = _graph_label(fx_gm, what)
        if record is not None:
            record.append(runner)
        return make_boxed_func(runner)

    compile_fn = aot_autograd(
        fw_compiler=compile_graph,
        bw_compiler=functools.partial(compile_graph, what="backward"),
        inference_compiler=functools.partial(compile_graph, inference=True, what="inference"),
        decompositions=decompositions,
    )
    # The backward graph is lowered now, beside the forward, rather than at the first backward
    # call (aot_autograd's lazy default): with batch compile, the forward's first call then
    # compiles both graphs' kernels in one batch on every core. Lowering costs milliseconds; a
    # backward that never runs (a training-mode module called without no_grad) costs its
    # kernels' compile once, in that batch.
    from torch._functorch import config as functorch_config

    if config.get("batch_compile") and hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        n_record = len(record) if record is not None else 0
        try:
            with functorch_config.patch(force_non_lazy_backward_lowering=True):
                return compile_fn(gm, example_inputs)
        except Exception as e:  # with the flag, aot_autograd raises what its lazy path would defer
            log.warning(
                "fastcompile: compiling the backward graph ahead failed (%s: %s); it compiles at "
                "the first backward call instead",
                type(e).__name__,
                e,
            )
            if record is not None:
                del record[n_record:]  # the runners of the attempt that failed
    return compile_fn(gm, example_inputs)
