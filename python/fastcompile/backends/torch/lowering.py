"""The walk over one FX graph: each node becomes core ops (through the handler table) or joins an
extern cluster.

In: an FX GraphModule and its example inputs. Out: a fastcompile Graph (``_RecordingGraph``) with
its inputs, and what the runner needs to call it (``_Lowering``).
"""

import logging
import operator

import numpy as np
import torch
import torch.fx

from ...graph import Graph
from . import pointwise, views, reductions  # noqa: F401  (registers their handlers, in this order)
from .channels_last import _cl_dense, _cl_strides, _conv_input
from .externs import _FOLDABLE, _STRIDED_READS, _fresh_inputs, _make_cluster_fn
from .registry import _LOWER
from .values import (
    _Cluster,
    _GraphFallback,
    _NotLowered,
    _Rec,
    _contiguous_strides,
    _core_dtype,
    _dense_other_order,
    _graph_device,
    _is_tensor_meta,
    _layout,
    _layout_of,
    _meta,
    _meta_strides,
    _static_shape,
    _to_core,
    _to_numpy,
)
from .views import _externs_only

log = logging.getLogger("fastcompile.backends.torch")
aten = torch.ops.aten


class _RecordingGraph:
    """The core Graph, remembering how each core value was made, so that a view of a pointwise
    value can be pushed to its leaves (``_push_view``). Same methods as ``Graph``."""

    def __init__(self):
        self.g = Graph()
        self.made = {}  # node -> ("call", op, args, attrs) | ("const",)
        self.leaf_shape = {}  # node -> array shape, for inputs and extern results
        self.leaf_strides = {}  # node -> element strides the leaf is expected to have, where known
        self.view_of = {}  # node of a view extern -> (base Value, numpy view functions)
        self.shape = {}  # node -> its core shape where the lowering knows it (reduction inputs:
        # the core knows an extern-made value's rank only at run time)
        self.replays = []  # per extern, in the graph's order: (fn, the FX nodes it returns or None)

    def input(self, dtype, ndim):
        return self.g.input(dtype, ndim)

    def constant(self, value):
        c = self.g.constant(value)
        self.made[c.node] = ("const",)
        return c

    def call(self, op, *args, **attrs):
        v = self.g.call(op, *args, **attrs)
        self.made[v.node] = ("call", op, args, attrs)
        return v

    def extern(self, fn, *args, replay=None, **kwargs):
        """replay: the FX nodes whose values fn returns (an extern cluster), so that an eager run's
        values can stand in for it (FxGraphRunner's async compile); None: fn itself stands in
        (a NumPy view, cheap and without side effects)."""
        self.replays.append((fn, replay))
        return self.g.extern(fn, *args, **kwargs)

    def output(self, *values):
        return self.g.output(*values)

    def compile(self):
        return self.g.compile()


class _Lowering:
    def __init__(self, gm, example_inputs, channels_last=False, cl_inputs=frozenset(), training_forward=False):
        self.gm = gm
        self.g = _RecordingGraph()
        self.env = {}  # FX node -> _Rec | tuple | python value | _Cluster (pending)
        self.inputs = []  # (kind, payload): ("arg", index) | ("const", ndarray)
        self.arg_layouts = {}  # "arg" index -> _layout_of its example (batch compile's stand-ins)
        self.carriers = {}  # tshape -> core bool input of that shape (stride 0)
        self.core_ops = 0
        self.extern_calls = 0
        self.extern_nodes = 0
        self.lowered = []  # FX nodes that became core ops
        self.input_values = set()
        self.input_nodes = []  # core node of each entry of self.inputs
        self.extern_values = set()
        self.example_inputs = example_inputs
        self.device = _graph_device(example_inputs)  # None: CPU (NumPy arrays); else CUDA tensors
        self.foreign = set()  # core nodes of inputs on another device than self.device: externs only
        self.passed = set()  # CPU: core nodes of inputs only externs read, passed as torch tensors
        self.view_strides = {}  # core node of a view extern made from a spec -> its element strides
        self.copied = set()  # FX copies (clone, contiguous, _to_copy) lowered to their source's value
        # channels_last convolutions (inference graphs on the CPU, _wants_channels_last): each
        # convolution's input and weight are made channels_last in its extern, so that its result
        # is, and the core keeps that order through the pointwise work after it; a rank-4 input
        # a convolution reads is made channels_last once on entry (cl_args), so that a residual
        # add reads it in the same order. Every value that reaches torch is checked against
        # eager's layout (outputs come back in it); extern arguments are not restrided (their
        # values do not depend on the layout) unless the cluster interprets strides.
        self.channels_last = channels_last and self.device is None
        self.training_forward = training_forward  # a backward graph will read what this one saves
        # whether a kernel's result may come in another memory order than C (channels_last
        # convolutions, or a channels_last tensor in the graph), so that its layout is checked
        # at each call (_layout)
        self.relayout = self.channels_last or (
            self.device is None and any(_dense_other_order(_meta(n)) for n in gm.graph.nodes)
        )
        self.cl_args = set()  # "arg" indexes made channels_last on entry
        self.cl_results = set()  # extern results expected channels_last (batch compile's stand-ins)
        # placeholders the forward graph hands over channels_last (FxGraphRunner.cl_outputs)
        self.cl_inputs = cl_inputs if self.channels_last else frozenset()

    def layout(self, meta, value, tshape):
        """_layout of core value ``value`` (at torch shape tshape), read as FX value ``meta``. With
        channels_last convolutions an extern's result (a convolution's: channels_last) and an
        input made channels_last on entry are checked too."""
        strides = self.strides_of(value, tshape)
        if strides is None and self.channels_last and value.node not in self.passed:
            strides = _contiguous_strides(tshape)
        return _layout(meta, strides, self.relayout)

    # -- inputs ------------------------------------------------------------------------------
    def _input(self, dtype, ndim, kind, payload, shape=None, strides=None):
        v = self.g.input(dtype, ndim)
        self.inputs.append((kind, payload))
        self.input_nodes.append(v.node)
        self.input_values.add(v.node)
        self.g.leaf_shape[v.node] = tuple(payload.shape) if kind == "const" else tuple(shape)
        if kind == "const" and isinstance(payload, torch.Tensor):
            strides = tuple(payload.stride())
        elif kind == "const":
            strides = tuple(s // payload.itemsize for s in payload.strides)
        if strides is not None:
            self.g.leaf_strides[v.node] = tuple(strides)
        return v

    def strides_of(self, value, tshape):
        """The element strides ``value`` (at torch shape ``tshape``) comes with, for _layout: None
        for an extern's or input's own tensor, a view extern's spec, else a kernel's C order."""
        n = value.node
        if n in self.extern_values or n in self.input_values:
            return None
        return self.view_strides.get(n) or _contiguous_strides(tshape)

    def carrier(self, tshape):
        c = self.carriers.get(tshape)
        if c is None:
            arr = np.broadcast_to(np.zeros((), np.bool_), tshape)
            c = self.carriers[tshape] = self._input("bool", len(tshape), "const", arr)
        return c

    # -- records -----------------------------------------------------------------------------
    def rec(self, arg):
        """The _Rec of an FX tensor argument (running its extern cluster if pending)."""
        v = self.env[arg]
        if isinstance(v, _Cluster):
            self.flush(v)
            v = self.env[arg]
        if not isinstance(v, _Rec):
            raise _NotLowered("%s is not a tensor" % arg)
        if v.value.node in self.foreign:
            raise _NotLowered("%s is not on %s" % (arg, self.device))
        return v

    def operand(self, arg, dtype=None, opmath=False):
        """A core value (cast to ``dtype``, a torch dtype) or a Python scalar. torch makes a
        scalar that meets a float16/bfloat16 op that dtype first (x < 0.1 compares with
        float16(0.1), x - 0.1 is 0 at float16(0.1)): so does this, the core computing such ops
        in float32. opmath: the op takes the scalar as it is, in float32, as torch's mul and
        div do (x * 100000 is 0 at 0, not 0 * inf)."""
        if isinstance(arg, torch.fx.Node):
            r = self.rec(arg)
            if (
                opmath
                and dtype in (torch.float16, torch.bfloat16)
                and r.tshape == ()
                and self.device is None
                and r.dtype.is_floating_point
                and r.dtype != dtype
            ):
                dtype = torch.float32  # a 0-d CPU tensor is a scalar to torch's CPU kernels too
            return self.cast(r.value, dtype) if dtype is not None else r.value
        if isinstance(arg, (bool, int, float)):
            if dtype in (torch.float16, torch.bfloat16) and type(arg) is not bool and not opmath:
                return torch.tensor(arg, dtype=dtype).item()
            return arg
        raise _NotLowered("operand %r" % (arg,))

    def cast(self, value, dtype):
        name = _core_dtype(dtype)
        if name is None:
            raise _NotLowered("dtype %s" % dtype)
        if value.dtype != name:
            shape = self.g.shape.get(value.node)
            value = self.g.call("cast", value, dtype=name)
            if shape is not None:
                self.g.shape[value.node] = shape
        return value

    def convert(self, node, value, src, dtype):
        """``node``, an explicit dtype conversion of ``value`` (torch dtype ``src``) to ``dtype``. A
        conversion into a half type rounds, as eager's does: the core's cast to float16 does, and
        bfloat16, carried as float32 in the core, goes through a core bfloat16 value (a cast
        between float32s would not round) where a core op reads the result. Where only externs
        do (autocast's casts of a matmul's operands) it does not: they narrow their bfloat16
        arguments anyway, and a rounding kernel would be a pass over each weight per call. An
        op's bfloat16 result is not rounded between ops (the package doc)."""
        if dtype == torch.bfloat16 and src != torch.bfloat16 and not _externs_only(node):
            shape = self.g.shape.get(value.node)
            value = self.g.call("cast", value, dtype="bfloat16")
            if shape is not None:
                self.g.shape[value.node] = shape
        return self.cast(value, dtype)

    def cshape_of(self, *args):
        shapes = [self.rec(a).cshape for a in args if isinstance(a, torch.fx.Node)]
        return tuple(torch.broadcast_shapes(*shapes)) if shapes else ()

    def out(self, node, value, cshape):
        meta = _meta(node)
        value = self.cast(value, meta.dtype)
        r = _Rec(value, cshape, _static_shape(meta), meta.dtype)
        if len(r.cshape) > len(r.tshape) and any(s != 1 for s in r.cshape[: len(r.cshape) - len(r.tshape)]):
            raise AssertionError("fastcompile: %s: core shape %s does not fit %s" % (node, r.cshape, r.tshape))
        return r

    def exact(self, arg):
        """The core value of ``arg`` materialized at its torch shape (for reductions)."""
        r = self.rec(arg)
        if r.exact:
            self.g.shape[r.value.node] = tuple(r.cshape)
            return r.value, r.cshape
        v = self.g.call("add", r.value, self.carrier(r.tshape))
        cshape = tuple(torch.broadcast_shapes(r.cshape, r.tshape))
        self.g.shape[v.node] = cshape
        return v, cshape

    # -- externs -----------------------------------------------------------------------------
    def pending(self, node):
        """Add ``node`` to an extern cluster (a new one or its producers', merged)."""
        cluster = None
        for a in node.all_input_nodes:
            v = self.env.get(a)
            if isinstance(v, _Cluster) and not v.closed:
                if cluster is None:
                    cluster = v
                elif v is not cluster:
                    self.merge(cluster, v)
        if cluster is None:
            cluster = _Cluster()
        for a in node.all_input_nodes:
            v = self.env.get(a)
            if a not in cluster.members and a not in cluster.inputs and not (isinstance(v, _Cluster) and v is cluster):
                if isinstance(v, _Cluster):
                    self.flush(v)
                cluster.inputs.append(a)
        cluster.members.append(node)
        self.env[node] = cluster
        self.extern_nodes += 1

    def merge(self, into, other):
        """Moves the members of open cluster ``other`` into open cluster ``into``: one extern call
        instead of two (a weight's transpose joins its matmul, the q, k and v selects their
        attention). Two open clusters never depend on each other, since a core op that reads a
        member closes its cluster first, so graph order within each is all the merged one needs."""
        into.members = sorted(into.members + other.members, key=self.order.__getitem__)
        inside = set(into.members)
        into.inputs = [a for a in dict.fromkeys(into.inputs + other.inputs) if a not in inside]
        for m in other.members:
            self.env[m] = into
        other.members, other.inputs, other.closed = [], [], True

    def flush(self, cluster):
        if cluster.closed:
            return
        cluster.closed = True
        members = cluster.members
        mset = set(members)
        outs = [m for m in members if any(u not in mset for u in m.users)]
        values, specs = [], []
        # channels_last convolutions: arguments keep the core's layout (a convolution's result
        # stays channels_last into the next one) unless an op of the cluster reads strides
        keep = self.channels_last and not any(
            getattr(m.target, "overloadpacket", None) in _STRIDED_READS for m in members
        )
        for a in cluster.inputs:
            v = self.env[a]
            if isinstance(v, _Rec):
                values.append(v.value)
                layout = (
                    "tensor"
                    if v.value.node in self.passed
                    else None
                    if keep
                    else self.layout(_meta(a), v.value, v.tshape)
                )
                specs.append((a, v.tshape, v.dtype, layout))
        consts = {a: self.env[a] for a in cluster.inputs if not isinstance(self.env[a], _Rec)}
        for m in outs:
            meta = _meta(m)
            if not _is_tensor_meta(meta):
                raise _GraphFallback("%s returns %s to the core" % (m.format_node(), type(meta).__name__))
            if _core_dtype(meta.dtype) is None:
                raise _GraphFallback("%s: dtype %s cannot enter the core" % (m, meta.dtype))
        fresh = _fresh_inputs(self.copied, members, outs, [sp[0] for sp in specs])
        fn = _make_cluster_fn(
            self.gm,
            members,
            specs,
            consts,
            outs,
            cuda=self.device is not None,
            fresh=fresh,
            channels_last=self.channels_last,
            keep_cl=self.training_forward,
        )
        if self._fold(fn, members, values, outs):
            return
        self.extern_calls += 1
        if self.channels_last and any(_cl_dense(_meta(a)) for a in cluster.inputs):
            # torch's ops give results in their rank-4 arguments' memory order, channels_last here
            self.cl_results.update(m for m in outs if _cl_dense(_meta(m)))
        if len(outs) == 1:
            res = [self.g.extern(fn, *values, replay=outs)]
        else:
            res = list(self.g.extern(fn, *values, nout=len(outs), replay=outs))
        for m, v in zip(outs, res):
            self.extern_values.add(v.node)
            meta = _meta(m)
            shape = _static_shape(meta)
            self.env[m] = _Rec(v, shape, shape, meta.dtype)
            self.g.leaf_shape[v.node] = shape
            self.g.leaf_strides[v.node] = _meta_strides(meta)
        for m in members:
            if m not in outs:
                self.env[m] = None  # used only inside the cluster

    def _fold(self, fn, members, values, outs):
        """A cluster that reads no tensor and runs only deterministic factories and views (the
        aranges of an unbind's or a select's backward) gives the same arrays at every call: run
        once now, its results become constants of the graph instead of an extern call per call."""
        if (
            values
            or self.device is not None
            or not all(
                m.op == "call_function"
                and (m.target is operator.getitem or getattr(m.target, "overloadpacket", None) in _FOLDABLE)
                for m in members
            )
        ):
            return False
        try:
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():  # real tensors: lowering runs under a fake mode
                res = fn()
        except Exception:  # left to run at call time, where it raises as eager would
            return False
        res = [res] if len(outs) == 1 else list(res)
        metas = [_meta(m) for m in outs]
        shapes = [_static_shape(meta) for meta in metas]
        if any(tuple(arr.shape) != shape for arr, shape in zip(res, shapes)):
            return False
        for m, meta, shape, arr in zip(outs, metas, shapes, res):
            arr.flags.writeable = False  # shared by every call: nothing may write it
            v = self._input(_core_dtype(meta.dtype), len(shape), "const", arr)
            self.env[m] = _Rec(v, shape, shape, meta.dtype)
        for m in members:
            if m not in outs:
                self.env[m] = None
        return True

    # -- the walk ----------------------------------------------------------------------------
    def run(self):
        nodes = list(self.gm.graph.nodes)
        self.order = {n: i for i, n in enumerate(nodes)}
        n_arg = 0
        for node in nodes:
            if node.op == "placeholder":
                idx = n_arg
                n_arg += 1
                meta = _meta(node)
                if meta is None and idx < len(self.example_inputs):
                    meta = self.example_inputs[idx]
                if not isinstance(meta, torch.Tensor):
                    raise _GraphFallback("input %s is a %s" % (node.name, type(meta).__name__))
                self.check_tensor(meta, node, placeholder=True)
                shape = _static_shape(meta)
                if not node.users:
                    self.env[node] = None
                    continue
                cl_in = node.name in self.cl_inputs and _cl_dense(meta)
                v = self._input(
                    _core_dtype(meta.dtype),
                    len(shape),
                    "arg",
                    idx,
                    shape,
                    _cl_strides(shape) if cl_in else _meta_strides(meta),
                )
                if self.device is not None and meta.device != self.device:
                    self.foreign.add(v.node)
                elif self.device is None and _externs_only(node):
                    # a weight of a matmul: the extern takes the tensor itself (no NumPy round
                    # trip per call); a core op that reads it after all runs in the extern too
                    self.foreign.add(v.node)
                    self.passed.add(v.node)
                self.arg_layouts[idx] = _layout_of(meta)
                if cl_in:
                    dt, shp, _ = self.arg_layouts[idx]
                    self.arg_layouts[idx] = (dt, shp, _cl_strides(shp))
                if self.channels_last and v.node not in self.passed and _conv_input(node, meta):
                    self.cl_args.add(idx)
                    dt, shp, _ = self.arg_layouts[idx]
                    self.arg_layouts[idx] = (dt, shp, _cl_strides(shp))
                self.env[node] = _Rec(v, shape, shape, meta.dtype)
            elif node.op == "get_attr":
                t = (
                    getattr(self.gm, node.target)
                    if "." not in node.target
                    else self.gm.get_submodule(node.target.rsplit(".", 1)[0]).__getattr__(node.target.rsplit(".", 1)[1])
                )
                if not isinstance(t, torch.Tensor):
                    self.env[node] = t
                    continue
                self.check_tensor(t, node)
                shape = tuple(t.shape)
                from torch.utils._python_dispatch import _disable_current_modes

                with _disable_current_modes():  # a real tensor (torch.tensor(...) in the code):
                    arr = _to_numpy(t) if self.device is None else _to_core(t)  # not under the fake mode
                v = self._input(_core_dtype(t.dtype), len(shape), "const", arr)
                self.env[node] = _Rec(v, shape, shape, t.dtype)
            elif node.op == "output":
                return node
            else:
                self.lower(node)
        raise _GraphFallback("graph without output")

    def check_tensor(self, t, node, placeholder=False):
        """placeholder: an input, which may sit on the CPU in a CUDA graph (rec keeps it from the
        core); a constant there is moved to the device once (FxGraphRunner._arrays)."""
        if self.device is None and t.device.type != "cpu":
            raise _GraphFallback("%s is on %s" % (node.name, t.device))
        if self.device is not None and t.device not in (self.device, torch.device("cpu")):
            raise _GraphFallback("%s is on %s, the graph on %s" % (node.name, t.device, self.device))
        if t.layout != torch.strided:
            raise _GraphFallback("%s has layout %s" % (node.name, t.layout))
        if _core_dtype(t.dtype) is None:
            raise _GraphFallback("%s has dtype %s" % (node.name, t.dtype))
        _static_shape(t)

    def lower(self, node):
        meta = _meta(node)
        if node.op == "call_function" and node.target is operator.getitem:
            src = self.env.get(node.args[0])
            if isinstance(src, tuple):
                self.env[node] = src[node.args[1]]
                return
            if isinstance(src, _Cluster) and not src.closed:
                self.pending(node)
                return
            if isinstance(src, (list, tuple)) or src is None:
                self.env[node] = src[node.args[1]] if src is not None else None
                return
        packet = getattr(node.target, "overloadpacket", None) if node.op == "call_function" else None
        handler = _LOWER.get(packet)
        if handler is not None and _bool_refused(node):
            log.debug("extern %s: torch's CPU kernel refuses bool", node.format_node())
            handler = None  # the extern raises at the call as eager does
        if handler is not None and (_is_tensor_meta(meta) or isinstance(meta, (tuple, list))):
            mark = self.g  # handlers raise _NotLowered before adding anything that matters
            try:
                r = handler(self, node)
            except _NotLowered as e:
                log.debug("extern %s: %s", node.format_node(), e)
                r = None
            except _GraphFallback:
                raise
            except Exception as e:  # a lowering bug must not fail compilation: run it in torch
                log.warning(
                    "fastcompile: lowering %s failed (%s: %s); it runs as torch",
                    node.format_node(),
                    type(e).__name__,
                    e,
                )
                r = None
            if r is not None:
                self.env[node] = r
                self.core_ops += 1
                self.lowered.append(node)
                return
            del mark
        self.pending(node)


# Ops whose CPU kernels refuse bool tensors (NotImplementedError, "not implemented for 'Bool'";
# argmax/argmin a RuntimeError) where the core computes them: with a bool tensor operand they
# run as torch's own op, which raises at the call as eager does. Packets, or single overloads
# where others of the packet take bool (clamp_min/clamp_max with a tensor bound do, and clamp with
# one tensor bound, which they decompose into; pow of a bool tensor by a Python scalar does).
_BOOL_REFUSED = frozenset(
    (
        aten.remainder,
        aten.fmod,
        aten.clamp.default,
        aten.ceil,
        aten.floor,
        aten.round,
        aten.trunc,
        aten.frac,
        aten.abs,
        aten.argmax,
        aten.argmin,
        aten.floor_divide,
        aten.clamp_min.default,
        aten.clamp_max.default,
        aten.pow.Tensor_Tensor,
        aten.pow.Scalar,
    )
)


def _bool_refused(node):
    """Whether torch's CPU kernel refuses ``node``'s op with bool operands (_BOOL_REFUSED)."""
    t = node.target
    if t is aten.clamp.Tensor:  # bool with one tensor bound: computed; with both: refused
        a = list(node.args) + [None, None, None]
        return (
            node.kwargs.get("min", a[1]) is not None and node.kwargs.get("max", a[2]) is not None and _reads_bool(node)
        )
    return (t in _BOOL_REFUSED or getattr(t, "overloadpacket", None) in _BOOL_REFUSED) and _reads_bool(node)


def _reads_bool(node):
    for a in node.all_input_nodes:
        m = _meta(a)
        if _is_tensor_meta(m) and m.dtype == torch.bool:
            return True
    m = _meta(node)
    return _is_tensor_meta(m) and m.dtype == torch.bool
