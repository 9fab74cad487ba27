"""torch.compile backend: FX graphs (aten ops, via aot_autograd) -> the fastcompile graph API.

In: a ``torch.fx.GraphModule`` and example inputs (Dynamo's backend contract). Out: a callable on
the graph's flat tensor inputs. ``backend`` routes through aot_autograd (core aten decompositions;
forward and backward graphs both lowered here); ``fx_to_graph`` lowers one FX graph.

Lowering. Every FX tensor value becomes a value of one ``fastcompile.graph.Graph``:
  - pointwise ops, reductions, softmax/log_softmax, where, clamp and casts become core ops
    (the core fuses them into a few kernels); layer_norm, rms_norm, batch_norm, var_mean, gelu's
    backward, ... reach us decomposed into those;
  - views and expands that only add or drop leading size-1 dims, or broadcast, cost nothing: a
    core value keeps its own shape (``cshape``), which broadcasts to the torch shape (``tshape``);
  - everything else (mm, addmm, bmm, conv, embedding, index ops, cat, random ops, other views,
    unknown ops) runs as torch on torch tensors inside an extern call. Consecutive such nodes form
    one extern "cluster" (one Python call for e.g. ``bmm -> view -> transpose``); an unknown op
    never fails compilation.
Data crosses the boundary without copies: CPU tensors go in as ``t.numpy()`` views, results come
back as ``torch.from_numpy``. bfloat16 (NumPy has none) is carried as float32 inside the core:
bf16 inputs are widened once on entry, externs narrow their bf16 arguments back (so an extern
sees exactly the bf16 tensors eager would) and bf16 outputs are rounded on exit. Like Inductor,
pointwise chains on bf16/fp16 round only where a value leaves the core, not after every op; an
explicit conversion into a half type (.to(torch.bfloat16)) rounds where it is, as eager's does.

Symbolic sizes (dynamic=True, mark_dynamic, Dynamo's automatic dynamic after a size change): the
graph is lowered once per set of concrete sizes, at the call that brings it (``_PerSize``); the
kernels take their sizes at launch, so a new size compiles none.

Whole-graph fallbacks (the graph runs as plain torch, with a logged reason): tensors on several
CUDA devices or on a device other than the CPU and CUDA, and a complex/quantized/float8 tensor
that would have to enter the core.
"""
import functools
import itertools
import logging
import collections
import math
import operator
import os
import re
import threading
import time
import weakref

import numpy as np
import torch
import torch._prims_common as _prims
import torch.fx

# Where torch ships its own renamed libgomp, our kernels load a second OpenMP runtime; with both
# spinning after their parallel regions (libgomp's default) each starves the other (measured on
# 2 cores: a transformer training step 10 ms -> 200 ms). Ours starts at the first kernel load,
# so this reaches it; an explicit OMP_WAIT_POLICY wins. Where torch's libgomp has the soname
# libgomp.so.1 (the CPU wheel), the kernels share torch's runtime, already started: no effect.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .. import _C                  # noqa: E402
from .. import config              # noqa: E402
from .. import pending             # noqa: E402
from .. import pygen               # noqa: E402
from .._common import torch_numpy_dtypes  # noqa: E402
from ..graph import Graph          # noqa: E402
from ..trace.interp import _TORCH_OPMATH_SCALAR  # noqa: E402

log = logging.getLogger("fastcompile.backends.torch")
aten = torch.ops.aten
prims = torch.ops.prims

__all__ = ["backend", "fx_to_graph", "decompositions", "FxGraphRunner"]

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


# ----------------------------------------------------------------------------------------------
# dtypes
# ----------------------------------------------------------------------------------------------

_CORE_DTYPE = torch_numpy_dtypes(torch)
_CORE_DTYPE[torch.bfloat16] = "float32"      # carried as float32 inside the core (see the module doc)


def _core_dtype(dt):
    return _CORE_DTYPE.get(dt)


class _GraphFallback(Exception):
    """The whole graph runs as plain torch (the message says why)."""


class _NotLowered(Exception):
    """This node is not a core op after all: run it as an extern."""


# ----------------------------------------------------------------------------------------------
# decompositions
# ----------------------------------------------------------------------------------------------

# core ops, or lowered by hand (gelu_backward: the core's gelu_grad): do not decompose them
_KEEP = ("silu", "softplus", "logsumexp", "gelu_backward")


@functools.lru_cache(maxsize=None)
def decompositions():
    """The aot_autograd decomposition table: core aten, plus normalizations and a few activations
    decomposed into ops the core fuses, minus what is itself a core op. Built once per process
    (about 50 ms): every graph aot_autograd compiles asks for it."""
    from torch._decomp import core_aten_decompositions, get_decompositions
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([
        aten.native_layer_norm, aten.native_batch_norm, aten._native_batch_norm_legit,
        aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
        aten.native_group_norm, aten.hardtanh, aten.leaky_relu, aten.elu,
        aten.hardsigmoid, aten.hardswish, aten.mish, aten.rms_norm,
    ]))
    for name in _KEEP:
        packet = getattr(aten, name)
        for ov in packet.overloads():
            table.pop(getattr(packet, ov), None)
    # Its decomposition saves a logsumexp that the (not decomposed) fused backward misreads:
    # gradients through nn.MultiheadAttention come out wrong (torch 2.13, aot_autograd with
    # core_aten_decompositions, also with the aot_eager compiler). The fused op is an extern.
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    return table


# ----------------------------------------------------------------------------------------------
# values
# ----------------------------------------------------------------------------------------------

class _Rec:
    """A tensor value in the core graph: its core ``value``, the core's shape ``cshape`` (which
    broadcasts to ``tshape``, extra leading dims being 1), the torch shape and dtype."""
    __slots__ = ("value", "cshape", "tshape", "dtype")

    def __init__(self, value, cshape, tshape, dtype):
        self.value, self.cshape, self.tshape, self.dtype = value, tuple(cshape), tuple(tshape), dtype

    @property
    def exact(self):
        """the core value has exactly the torch shape, up to leading size-1 dims"""
        return _strip1(self.cshape) == _strip1(self.tshape) and len(self.cshape) >= len(self.tshape)


def _strip1(shape):
    shape = tuple(shape)
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return shape[i:]


def _meta(node):
    m = getattr(node, "meta", None)
    if not isinstance(m, dict):
        return None
    return m.get("val", m.get("example_value"))


def _is_tensor_meta(v):
    return isinstance(v, torch.Tensor)


def _static_shape(t):
    out = []
    for s in t.shape:
        if not isinstance(s, int):
            raise _GraphFallback("symbolic shape %s" % (tuple(t.shape),))
        out.append(s)
    return tuple(out)


class _Cluster:
    """Consecutive non-core nodes run by one extern call, as plain torch."""
    def __init__(self):
        self.members = []          # FX nodes, in graph order
        self.inputs = []           # FX nodes from outside (already lowered to _Rec)
        self.closed = False


def _to_torch(arr, tshape, dtype):
    """A NumPy array (or, on CUDA, a tensor) from the core -> a torch tensor of the torch shape
    and dtype (views)."""
    if isinstance(arr, torch.Tensor):
        t = arr
    else:
        if arr.ndim != len(tshape):         # leading size-1 dims: reshaped here, in NumPy, cheaper
            arr = arr.reshape(arr.shape[arr.ndim - len(tshape):] if arr.ndim > len(tshape) else
                              (1,) * (len(tshape) - arr.ndim) + arr.shape)
        if not arr.flags.writeable:
            arr = arr.copy()
        t = torch.from_numpy(arr)
    if t.dim() != len(tshape):
        t = t.reshape(t.shape[t.dim() - len(tshape):] if t.dim() > len(tshape) else
                      (1,) * (len(tshape) - t.dim()) + tuple(t.shape))
    if tuple(t.shape) != tshape:
        t = t.expand(tshape)
    if t.dtype != dtype:
        t = t.to(dtype)
    return t


def _layout(meta, strides, checked=False):
    """Eager's layout (shape, strides) for a value the core hands to torch, where it may come
    otherwise; None where it cannot differ in a way that matters. ``strides``: the element strides
    the lowering expects the core's array to have (C order for a kernel's result, a view extern's
    spec), or None for an extern's or input's own tensor, laid out by torch as in eager
    (``_Lowering.strides_of``). checked: the core may also allocate results in the memory order
    of its inputs (channels_last: plan.c's perm), which the lowering cannot predict, so eager's layout is given even where it matches ``strides``. Either way the
    generated code compares strides at each call and copies only where they differ
    (``_restride``). An expanded tensor reads the same in any layout: None."""
    if strides is None or not isinstance(meta, torch.Tensor):
        return None
    shape, stride = tuple(meta.shape), tuple(meta.stride())
    if any(st == 0 for n, st in zip(shape, stride) if n > 1):
        return None                         # an expanded tensor: any layout reads the same
    if not checked and len(strides) == len(shape) and _same_strides(strides, (shape, stride)):
        return None
    return (shape, stride)


def _dense_other_order(meta):
    """Whether FX value ``meta`` is a tensor the core would carry its memory order into its
    results from (plan.c's dense_perm): channels_last (rank 4) or channels_last_3d (rank 5), and
    not contiguous."""
    if not isinstance(meta, torch.Tensor) or meta.dim() not in (4, 5) or meta.layout != torch.strided:
        return False
    fmt = torch.channels_last if meta.dim() == 4 else torch.channels_last_3d
    try:
        return meta.numel() > 0 and not meta.is_contiguous() and meta.is_contiguous(memory_format=fmt)
    except Exception:           # symbolic sizes: not lowered anyway
        return False


def _same_strides(have, layout):
    """Whether strides ``have`` lay a tensor of layout[0]'s shape out as layout[1] does (the
    strides of size-1 dims do not matter)."""
    return all(a == b for n, a, b in zip(layout[0], have, layout[1]) if n != 1)


def _restride(t, layout, dtype=None, copy=False):
    """t laid out as ``layout`` (_layout), converted to dtype: t itself where it already is
    (copy: a new tensor all the same), else a copy."""
    if _same_strides(t.stride(), layout):
        if dtype is not None and t.dtype != dtype:
            return t.to(dtype)
        return t.clone() if copy else t
    if dtype is None or dtype == t.dtype:
        out = _cl_relayout(t, layout[1])
        if out is not None:
            return out
    out = torch.empty_strided(layout[0], layout[1], dtype=dtype or t.dtype, device=t.device)
    out.copy_(t)
    return out


def _cl_relayout(t, strides):
    """A copy of t with element strides ``strides`` by the core's batched transpose
    (_C._relayout, runtime/relayout.c), where that is one of the two conversions around
    channels_last convolutions: a dense C-order (N, C, *S) CPU tensor to channels_last (C last
    in memory: (N, *S, C)), or back; else None. torch's copy_ between the two orders takes
    about 1.5-2x the transpose's time ((16, 16, 32, 32) float32, 2 threads: 67 against 37 us
    for the copy alone, 48 for this whole function)."""
    if not _relayout_ok(t):
        return None
    shape = t.shape
    if _same_strides(strides, (shape, _cl_strides(shape))) and t.is_contiguous():
        return _relayout(t, True)
    if t.is_contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d) \
            and _same_strides(strides, (shape, _contiguous_strides(shape))):
        return _relayout(t, False)
    return None


# dtypes _C._relayout copies, as the NumPy type it fills (bits as they are: bfloat16 as uint16;
# not complex: a conjugate view's bits are not its values)
_RELAYOUT_TYPES = {dt: np.dtype(name).num for dt, name in (
    (torch.float32, "float32"), (torch.float64, "float64"), (torch.float16, "float16"),
    (torch.bfloat16, "uint16"), (torch.bool, "bool"), (torch.uint8, "uint8"), (torch.int8, "int8"),
    (torch.int16, "int16"), (torch.int32, "int32"), (torch.int64, "int64"))}
# fewer elements than this: torch's copy (its call costs less than ours: (32, 16, 3, 3) float32
# 4.9 us against 7.8; (16, 16, 32, 32) 67 against 48)
_RELAYOUT_MIN = 16384


def _relayout_ok(t):
    """Whether _C._relayout may copy t: a plain dense CPU tensor of rank 4 or 5 (the
    channels_last ranks) of a dtype it copies, with more than one channel and more than one
    position, _RELAYOUT_MIN elements or more, and no autograd history to record."""
    return (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and t.dtype in _RELAYOUT_TYPES \
        and t.device.type == "cpu" and 4 <= t.dim() <= 5 and t.layout is torch.strided and t.shape[1] > 1 \
        and t.numel() >= _RELAYOUT_MIN and t.numel() > t.shape[0] * t.shape[1] \
        and not (t.requires_grad and torch.is_grad_enabled())


def _relayout(t, to_cl):
    """t (_relayout_ok, dense: C order if to_cl, else C last) copied into the other order by
    _C._relayout, in memory from the core's pool (kept mapped: a fresh torch.empty of 1 MB paid
    its page faults at every call inside a model); one torch call on the result, not four
    (each costs 1-7 us inside a compiled model)."""
    out = torch.from_numpy(_C._relayout(t.data_ptr(), t.shape, _RELAYOUT_TYPES[t.dtype], to_cl))
    return out if out.dtype is t.dtype else out.view(t.dtype)


def _to_core(t):
    """On CUDA: a tensor as the core reads it (bfloat16 is carried as float32, as on the CPU)."""
    if not isinstance(t, torch.Tensor):
        return t                                # a None or scalar slot nobody reads
    t = t.detach()
    return t.float() if t.dtype == torch.bfloat16 else t


def _on_device(arr, device):
    """A constant of the lowering (a NumPy array, or on CUDA a tensor) as a tensor on ``device``;
    dims NumPy broadcasts with stride 0 stay broadcast."""
    if isinstance(arr, torch.Tensor):
        return _to_core(arr).to(device)
    idx = tuple(slice(0, 1) if n > 1 and st == 0 else slice(None) for n, st in zip(arr.shape, arr.strides))
    return torch.from_numpy(np.ascontiguousarray(arr[idx])).to(device).expand(arr.shape)


def _graph_device(example_inputs):
    """The CUDA device of a graph's tensor inputs, or None for CPU; raises _GraphFallback where
    they are on several CUDA devices (the core runs a graph on one). CPU tensors among CUDA
    inputs (the RNG state an attention backward takes) only feed externs (_Lowering.rec)."""
    cuda = {t.device for t in example_inputs or () if isinstance(t, torch.Tensor) and t.device.type == "cuda"}
    if len(cuda) > 1:
        raise _GraphFallback("inputs on several CUDA devices: %s" % ", ".join(sorted(map(str, cuda))))
    return cuda.pop() if cuda else None


def _to_numpy(t):
    if not isinstance(t, torch.Tensor):
        return np.empty((0,), np.float32)      # a None or scalar slot nobody reads
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t.numpy()


# ----------------------------------------------------------------------------------------------
# the lowering
# ----------------------------------------------------------------------------------------------

class _RecordingGraph:
    """The core Graph, remembering how each core value was made, so that a view of a pointwise
    value can be pushed to its leaves (``_push_view``). Same methods as ``Graph``."""

    def __init__(self):
        self.g = Graph()
        self.made = {}          # node -> ("call", op, args, attrs) | ("const",)
        self.leaf_shape = {}    # node -> array shape, for inputs and extern results
        self.leaf_strides = {}  # node -> element strides the leaf is expected to have, where known
        self.view_of = {}       # node of a view extern -> (base Value, numpy view functions)
        self.shape = {}         # node -> its core shape where the lowering knows it (reduction inputs:
                                # the core knows an extern-made value's rank only at run time)
        self.replays = []       # per extern, in the graph's order: (fn, the FX nodes it returns or None)

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
        self.env = {}              # FX node -> _Rec | tuple | python value | _Cluster (pending)
        self.inputs = []           # (kind, payload): ("arg", index) | ("const", ndarray)
        self.arg_layouts = {}      # "arg" index -> _layout_of its example (batch compile's stand-ins)
        self.carriers = {}         # tshape -> core bool input of that shape (stride 0)
        self.core_ops = 0
        self.extern_calls = 0
        self.extern_nodes = 0
        self.lowered = []          # FX nodes that became core ops
        self.input_values = set()
        self.input_nodes = []      # core node of each entry of self.inputs
        self.extern_values = set()
        self.example_inputs = example_inputs
        self.device = _graph_device(example_inputs)   # None: CPU (NumPy arrays); else CUDA tensors
        self.foreign = set()       # core nodes of inputs on another device than self.device: externs only
        self.passed = set()        # CPU: core nodes of inputs only externs read, passed as torch tensors
        self.view_strides = {}     # core node of a view extern made from a spec -> its element strides
        self.copied = set()        # FX copies (clone, contiguous, _to_copy) lowered to their source's value
        # channels_last convolutions (inference graphs on the CPU, _wants_channels_last): each
        # convolution's input and weight are made channels_last in its extern, so that its result
        # is, and the core keeps that order through the pointwise work after it; a rank-4 input
        # a convolution reads is made channels_last once on entry (cl_args), so that a residual
        # add reads it in the same order. Every value that reaches torch is checked against
        # eager's layout (outputs come back in it); extern arguments are not restrided (their
        # values do not depend on the layout) unless the cluster interprets strides.
        self.channels_last = channels_last and self.device is None
        self.training_forward = training_forward    # a backward graph will read what this one saves
        # whether a kernel's result may come in another memory order than C (channels_last
        # convolutions, or a channels_last tensor in the graph), so that its layout is checked
        # at each call (_layout)
        self.relayout = self.channels_last or (self.device is None and any(
            _dense_other_order(_meta(n)) for n in gm.graph.nodes))
        self.cl_args = set()       # "arg" indexes made channels_last on entry
        self.cl_results = set()    # extern results expected channels_last (batch compile's stand-ins)
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
            if opmath and dtype in (torch.float16, torch.bfloat16) and r.tshape == () and self.device is None \
                    and r.dtype.is_floating_point and r.dtype != dtype:
                dtype = torch.float32       # a 0-d CPU tensor is a scalar to torch's CPU kernels too
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
        op's bfloat16 result is not rounded between ops (the module doc)."""
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
        if len(r.cshape) > len(r.tshape) and any(s != 1 for s in r.cshape[:len(r.cshape) - len(r.tshape)]):
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
            getattr(m.target, "overloadpacket", None) in _STRIDED_READS for m in members)
        for a in cluster.inputs:
            v = self.env[a]
            if isinstance(v, _Rec):
                values.append(v.value)
                layout = "tensor" if v.value.node in self.passed else \
                    None if keep else self.layout(_meta(a), v.value, v.tshape)
                specs.append((a, v.tshape, v.dtype, layout))
        consts = {a: self.env[a] for a in cluster.inputs if not isinstance(self.env[a], _Rec)}
        for m in outs:
            meta = _meta(m)
            if not _is_tensor_meta(meta):
                raise _GraphFallback("%s returns %s to the core" % (m.format_node(), type(meta).__name__))
            if _core_dtype(meta.dtype) is None:
                raise _GraphFallback("%s: dtype %s cannot enter the core" % (m, meta.dtype))
        fresh = _fresh_inputs(self.copied, members, outs, [sp[0] for sp in specs])
        fn = _make_cluster_fn(self.gm, members, specs, consts, outs, cuda=self.device is not None, fresh=fresh,
                              channels_last=self.channels_last, keep_cl=self.training_forward)
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
                self.env[m] = None      # used only inside the cluster

    def _fold(self, fn, members, values, outs):
        """A cluster that reads no tensor and runs only deterministic factories and views (the
        aranges of an unbind's or a select's backward) gives the same arrays at every call: run
        once now, its results become constants of the graph instead of an extern call per call."""
        if values or self.device is not None or not all(
                m.op == "call_function" and (m.target is operator.getitem or
                                             getattr(m.target, "overloadpacket", None) in _FOLDABLE)
                for m in members):
            return False
        try:
            from torch.utils._python_dispatch import _disable_current_modes
            with _disable_current_modes():      # real tensors: lowering runs under a fake mode
                res = fn()
        except Exception:           # left to run at call time, where it raises as eager would
            return False
        res = [res] if len(outs) == 1 else list(res)
        metas = [_meta(m) for m in outs]
        shapes = [_static_shape(meta) for meta in metas]
        if any(tuple(arr.shape) != shape for arr, shape in zip(res, shapes)):
            return False
        for m, meta, shape, arr in zip(outs, metas, shapes, res):
            arr.flags.writeable = False             # shared by every call: nothing may write it
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
                v = self._input(_core_dtype(meta.dtype), len(shape), "arg", idx, shape,
                                _cl_strides(shape) if cl_in else _meta_strides(meta))
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
                t = getattr(self.gm, node.target) if "." not in node.target else self.gm.get_submodule(
                    node.target.rsplit(".", 1)[0]).__getattr__(node.target.rsplit(".", 1)[1])
                if not isinstance(t, torch.Tensor):
                    self.env[node] = t
                    continue
                self.check_tensor(t, node)
                shape = tuple(t.shape)
                from torch.utils._python_dispatch import _disable_current_modes
                with _disable_current_modes():      # a real tensor (torch.tensor(...) in the code):
                    arr = _to_numpy(t) if self.device is None else _to_core(t)   # not under the fake mode
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
            handler = None      # the extern raises at the call as eager does
        if handler is not None and (_is_tensor_meta(meta) or isinstance(meta, (tuple, list))):
            mark = self.g  # handlers raise _NotLowered before adding anything that matters
            try:
                r = handler(self, node)
            except _NotLowered as e:
                log.debug("extern %s: %s", node.format_node(), e)
                r = None
            except _GraphFallback:
                raise
            except Exception as e:      # a lowering bug must not fail compilation: run it in torch
                log.warning("fastcompile: lowering %s failed (%s: %s); it runs as torch",
                            node.format_node(), type(e).__name__, e)
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
_BOOL_REFUSED = frozenset((aten.remainder, aten.fmod, aten.clamp.default, aten.ceil, aten.floor, aten.round,
                           aten.trunc, aten.frac, aten.abs, aten.argmax, aten.argmin, aten.floor_divide,
                           aten.clamp_min.default, aten.clamp_max.default, aten.pow.Tensor_Tensor,
                           aten.pow.Scalar))


def _bool_refused(node):
    """Whether torch's CPU kernel refuses ``node``'s op with bool operands (_BOOL_REFUSED)."""
    t = node.target
    if t is aten.clamp.Tensor:          # bool with one tensor bound: computed; with both: refused
        a = list(node.args) + [None, None, None]
        return node.kwargs.get("min", a[1]) is not None and node.kwargs.get("max", a[2]) is not None \
            and _reads_bool(node)
    return (t in _BOOL_REFUSED or getattr(t, "overloadpacket", None) in _BOOL_REFUSED) and _reads_bool(node)


def _reads_bool(node):
    for a in node.all_input_nodes:
        m = _meta(a)
        if _is_tensor_meta(m) and m.dtype == torch.bool:
            return True
    m = _meta(node)
    return _is_tensor_meta(m) and m.dtype == torch.bool


# Deterministic ops a cluster without tensor inputs may hold and still be computed once, at
# lowering (_Lowering._fold): factories and views. Random ops and empty() are not among them.
_FOLDABLE = frozenset((aten.arange, aten.zeros, aten.ones, aten.full, aten.eye, aten.linspace,
                       aten.scalar_tensor, aten.view, aten._unsafe_view, aten.reshape, aten.unsqueeze,
                       aten.squeeze, aten.expand, aten.permute, aten.t, aten.transpose, aten.select,
                       aten.slice, aten.alias, aten.clone, aten._to_copy, aten.lift_fresh_copy))


# Views an extern cluster runs as Tensor methods: the same result as the aten op, about half its
# per-call cost (no OpOverload dispatch through Python). aten overload -> method name.
_VIEW_METHODS = {
    aten.view.default: "reshape", aten._unsafe_view.default: "reshape", aten.reshape.default: "reshape",
    aten.permute.default: "permute", aten.unsqueeze.default: "unsqueeze", aten.squeeze.dim: "squeeze",
    aten.squeeze.dims: "squeeze", aten.squeeze.default: "squeeze", aten.select.int: "select",
    aten.t.default: "t", aten.transpose.int: "transpose", aten.expand.default: "expand",
}


# ops whose result shares its first argument's memory (with _VIEW_PACKETS), for _fresh_inputs
_ALIASING = frozenset((aten.as_strided, aten.diagonal, aten.unfold, aten.narrow, aten.split,
                       aten.split_with_sizes, aten.chunk, aten.unbind, aten.view_as_real,
                       aten.view_as_complex, aten.real, aten.imag))


# ops whose result depends on their argument's strides, not only its values: a cluster holding
# one gets its arguments in eager's layout even with channels_last convolutions
_STRIDED_READS = frozenset((aten.as_strided, aten.as_strided_scatter, aten._reshape_alias))


def _cl_conv(node):
    """A 2-d convolution (aten.convolution on a rank-4 float input) to run channels_last."""
    if node.op != "call_function" or node.target is not aten.convolution.default or len(node.args) < 2:
        return False
    m = _meta(node.args[0])
    return isinstance(m, torch.Tensor) and m.dim() == 4 and m.dtype in (torch.float32, torch.bfloat16)


def _cl_conv_bwd(node):
    """A 2-d convolution's backward (aten.convolution_backward on a rank-4 float input) to run
    channels_last: its grad_output and input made so, its weight too (_ClWeights)."""
    if node.op != "call_function" or node.target is not aten.convolution_backward.default or len(node.args) < 3:
        return False
    m = _meta(node.args[1])
    return isinstance(m, torch.Tensor) and m.dim() == 4 and m.dtype in (torch.float32, torch.bfloat16)


def _conv_input(node, meta):
    """Graph input ``node`` is a rank-4 tensor a channels_last convolution (or its backward: as
    grad_output or input) reads."""
    return isinstance(meta, torch.Tensor) and meta.dim() == 4 and meta.is_contiguous() and any(
        (_cl_conv(u) and u.args[0] is node) or (_cl_conv_bwd(u) and node in u.args[:2]) for u in node.users)


def _cl_dense(meta):
    """FX value ``meta`` is a rank-4 tensor, dense and not expanded: one a channels_last graph
    may hand to its backward channels_last (an activation, a mask, a max pool's indices)."""
    return isinstance(meta, torch.Tensor) and meta.dim() == 4 and meta.layout == torch.strided and meta.is_contiguous() and meta.numel() > 0


# views that keep their argument's layout: replayed on a channels_last output, still one
_ALIAS_OPS = frozenset((aten.alias.default, aten.detach.default))


def _cl_strides(shape):
    """Element strides of a dense channels_last tensor of shape (N, C, H, W): C last in memory,
    (N, H, W, C); for any rank >= 3 the same order ((N, C, D, H, W): channels_last_3d)."""
    out, acc = [0] * len(shape), shape[1]
    out[1] = 1
    for d in range(len(shape) - 1, 1, -1):
        out[d] = acc
        acc *= shape[d]
    out[0] = acc
    return tuple(out)


def _to_channels_last(t):
    """t channels_last: itself where it is, else a copy (the core's transpose where it can:
    _cl_relayout)."""
    if t.dim() == 4 and t.is_contiguous() and _relayout_ok(t):
        return _relayout(t, True)
    return t.contiguous(memory_format=torch.channels_last)


class _ClWeights:
    """Convolutions' weights as channels_last, converted once per tensor and version (a
    parameter: the same tensor every call until the optimizer updates it in place). One table
    for the process, so a training step's forward and backward convert a weight once between
    optimizer steps (each graph's own table converted it in both). Entries go with their
    weight (a weak reference)."""

    def __init__(self):
        self.entries = {}       # id(w) -> (weakref to w, w._version, w.data_ptr(), converted)
        self.lock = threading.Lock()

    def __call__(self, w):
        e = self.entries.get(id(w))
        if e is not None and e[0]() is w and e[1] == w._version and e[2] == w.data_ptr():
            return e[3]
        value = _to_channels_last(w)
        key = id(w)

        def gone(ref, key=key):
            with self.lock:
                if key in self.entries and self.entries[key][0] is ref:
                    del self.entries[key]
        with self.lock:
            self.entries[key] = (weakref.ref(w, gone), w._version, w.data_ptr(), value)
        return value


_CL_WEIGHTS = _ClWeights()


class _ClHandoff:
    """A training forward's channels_last copies of its convolutions' NCHW inputs, for the
    backward's convolution_backward of the same step, which reads the same (saved) input: keep()
    converts and keeps the copy, take() hands it over once (or converts, if none is kept).
    Keyed by memory (data pointer, sizes, strides, dtype): the backward gets the saved input as
    another tensor object on the same memory. An entry holds its source, so that memory cannot
    be reused while it stands; autograd refuses a saved tensor changed in place, so the copy is
    never stale when taken. At most LIMIT entries (a forward whose backward never runs leaves
    its copies until they are pushed out); the next forward converts again: a copy is handed
    over once, never reused across steps."""

    LIMIT = 8

    def __init__(self):
        self.entries = collections.OrderedDict()
        self.lock = threading.Lock()

    @staticmethod
    def _key(t):
        return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)

    def keep(self, t):
        c = _to_channels_last(t)
        if c is not t:          # a copy (a channels_last input is passed as it is)
            key = self._key(t)
            with self.lock:
                self.entries.pop(key, None)
                self.entries[key] = (t, c)
                while len(self.entries) > self.LIMIT:
                    self.entries.popitem(last=False)
        return c

    def take(self, t):
        with self.lock:
            entry = self.entries.pop(self._key(t), None)
        return entry[1] if entry is not None else _to_channels_last(t)


_CL_HANDOFF = _ClHandoff()


def _wants_channels_last(gm, example_inputs):
    """Whether an inference graph runs its convolutions channels_last: on the CPU, with a 2-d
    convolution of a float32/bfloat16 input not already laid out so (Inductor makes the same
    choice for its convolutions: oneDNN's channels_last kernels are faster, 1.5x on a 3x3 of 64
    channels on 2 Zen 4 cores)."""
    if _graph_device(example_inputs) is not None:
        return False
    for n in gm.graph.nodes:
        if _cl_conv(n) and not _meta(n.args[0]).is_contiguous(memory_format=torch.channels_last):
            return True
        if _cl_conv_bwd(n) and not _meta(n.args[1]).is_contiguous(memory_format=torch.channels_last):
            return True
    return False


def _fresh_inputs(copied, members, outs, inputs):
    """Indexes of a cluster's inputs that must be copied at the call: a copy in the FX graph
    (x.clone(), .contiguous()) that the core lowered to its source's own value, and that an
    output of the cluster views. Else the output would share the source's memory (a graph input,
    say: x.clone().t() returned a view of x, and writing to it wrote x)."""
    mset = set(members)
    roots = set()
    for o in outs:
        n = o
        while n in mset and n.op == "call_function" and n.args and isinstance(n.args[0], torch.fx.Node) and (
                n.target is operator.getitem or getattr(n.target, "overloadpacket", None) in _VIEW_PACKETS
                or getattr(n.target, "overloadpacket", None) in _ALIASING):
            n = n.args[0]
        roots.add(n)
    return frozenset(j for j, a in enumerate(inputs) if a in copied and a in roots)


def _make_cluster_fn(gm, members, specs, consts, outs, cuda=False, fresh=frozenset(), channels_last=False,
                     keep_cl=False):
    """The extern function of one cluster: NumPy arrays in, torch on them, NumPy arrays out
    (cuda: CUDA tensors in and out, bfloat16 carried as float32 as on the CPU).

    It is generated Python (one straight-line function per cluster), so a call pays for the
    torch ops it runs and little else: no per-node interpretation, views as Tensor methods
    (aten.view runs as ``reshape``: the same values; a functional graph never writes through an
    alias), and the common conversions inline with the general ones as fallbacks."""
    views = _VIEW_METHODS
    glob = {"_to_torch": _to_torch, "_restride": _restride, "_to_numpy": _to_numpy,
            "_from_numpy": torch.from_numpy, "_to_core": _to_core}
    names = {}

    def ref(v):
        if isinstance(v, torch.fx.Node):
            if v in names:
                return names[v]
            key = "c%d" % len(glob)
            glob[key] = consts[v]
            names[v] = key
            return key
        if isinstance(v, (list, tuple)):
            body = ", ".join(ref(x) for x in v)
            return "[%s]" % body if isinstance(v, list) else "(%s%s)" % (body, "," if len(v) == 1 else "")
        if v is None or isinstance(v, (bool, str)) or (type(v) is int) or (
                type(v) is float and v == v and abs(v) != float("inf")):
            return repr(v)
        key = "k%d" % len(glob)
        glob[key] = v
        return key

    lines = []
    params = ["a%d" % j for j in range(len(specs))]
    for j, (node, shape, dtype, layout) in enumerate(specs):
        var = "x%d" % j
        names[node] = var
        glob["s%d" % j], glob["d%d" % j], glob["l%d" % j] = shape, dtype, layout
        if layout == "tensor":          # a CPU graph's input passed through as the tensor it is
            lines.append("%s = a%d" % (var, j))
            continue
        if cuda:
            lines.append("%s = a%d if a%d.shape == s%d and a%d.dtype is d%d else _to_torch(a%d, s%d, d%d)"
                         % (var, j, j, j, j, j, j, j, j))
        else:
            lines.append("t = _from_numpy(a%d) if a%d.flags.writeable else None" % (j, j))
            lines.append("%s = t if t is not None and t.shape == s%d and t.dtype is d%d else _to_torch(a%d, s%d, d%d)"
                         % (var, j, j, j, j, j))
        if layout is not None:
            glob["w%d" % j] = layout[1]
            lines.append("if %s.stride() != w%d:\n        %s = _restride(%s, l%d)" % (var, j, var, var, j))
        if j in fresh:      # a copy in torch: an output views it (_fresh_inputs)
            lines.append("%s = %s.clone()" % (var, var))
    collapsed, need = _view_chains(members, outs, views)
    strides = {}            # root var -> the local holding its stride()
    for i, m in enumerate(members):
        if m not in need:
            continue        # a view only further views of this cluster read: folded into theirs
        var = "v%d" % i
        if m in collapsed:
            root, seq, (size, stride, delta, want) = collapsed[m]
            r = names[root]
            if r not in strides:
                strides[r] = "st_" + r
                lines.append("st_%s = %s.stride()" % (r, r))
            chain = r + "".join(".%s(%s)" % (views[v.target], ", ".join(ref(a) for a in v.args[1:])) for v in seq)
            expr = "%s.as_strided(%r, %r, %s.storage_offset() + %d) if %s == %r else %s" % (
                r, size, stride, r, delta, strides[r], want, chain)
            lines.append("%s = %s" % (var, expr))
            names[m] = var
            continue
        args = [ref(a) for a in m.args]
        kwargs = ["%s=%s" % (k, ref(v)) for k, v in m.kwargs.items()]
        if m.op == "call_function" and m.target is operator.getitem and not kwargs:
            expr = "%s[%s]" % (args[0], args[1])
        elif m.target is aten.permute.default and not kwargs and list(m.args[1]) == [1, 0]:
            expr = "%s.t()" % args[0]       # a weight's transpose: half permute's cost per call
        elif m.op == "call_function" and m.target in views and args and not kwargs:
            expr = "%s.%s(%s)" % (args[0], views[m.target], ", ".join(args[1:]))
        elif m.op == "call_function":
            fn = getattr(m.target, "_op", m.target) if isinstance(m.target, torch._ops.OpOverload) else m.target
            glob["f%d" % i] = fn
            if channels_last and _cl_conv(m):
                # input and weight channels_last: oneDNN's fast path, and a channels_last result.
                # A training forward hands its converted input to the backward's convolution
                # (_ClHandoff): one conversion per step, not two
                glob["_cl"], glob["_clw"] = _CL_HANDOFF.keep if keep_cl else _to_channels_last, _CL_WEIGHTS
                args = ["_cl(%s)" % args[0], "_clw(%s)" % args[1]] + args[2:]
            elif channels_last and _cl_conv_bwd(m):
                # the backward's too: channels_last gradients of the input and the weight
                glob["_cl"], glob["_clin"], glob["_clw"] = _to_channels_last, _CL_HANDOFF.take, _CL_WEIGHTS
                args = ["_cl(%s)" % args[0], "_clin(%s)" % args[1], "_clw(%s)" % args[2]] + args[3:]
            expr = "f%d(%s)" % (i, ", ".join(args + kwargs))
        elif m.op == "call_method":
            expr = "%s.%s(%s)" % (args[0], m.target, ", ".join(args[1:] + kwargs))
        elif m.op == "call_module":
            glob["f%d" % i] = gm.get_submodule(m.target)
            expr = "f%d(%s)" % (i, ", ".join(args + kwargs))
        else:
            raise _GraphFallback("node %s" % m.format_node())
        lines.append("%s = %s" % (var, expr))
        names[m] = var
    rets = []
    for o in outs:
        var = names[o]
        if cuda:
            lines.append("r%s = _to_core(%s)" % (var, var))
            rets.append("r" + var)
            continue
        lines.append("try:\n        r%s = %s.numpy()\n    except (TypeError, RuntimeError, AttributeError):\n        r%s = _to_numpy(%s)"
                     % (var, var, var, var))
        rets.append("r" + var)
    lines.append("return %s" % (rets[0] if len(outs) == 1 else "(%s,)" % ", ".join(rets)))
    name = "extern_" + "_".join(
        str(getattr(m.target, "__name__", m.target)).replace(".", "_") for m in members[:4])
    name = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return pygen.function(lines, name, ", ".join(params), "<fastcompile extern %s>" % name, glob)


def _view_chains(members, outs, views):
    """Chains of views inside one cluster, each done as one ``as_strided`` call instead of a
    Tensor method per view (a call costs ~1 us; a transformer's attention reshapes, permutes and
    selects a dozen times). Returns ``collapsed`` {last view: (root, views, (size, stride,
    offset delta, root strides))} for every chain of two or more views that leaves the cluster or
    feeds a non-view, where the FX metadata shows the result is a view of the root (run on meta
    tensors: a reshape that would copy is left alone), and ``need``: the members still emitted
    (a view only folded chains read is not). At run time the generated code checks the root's
    strides and runs the chain itself where they differ from the traced ones."""
    vmembers = {m for m in members if m.op == "call_function" and m.target in views and m.args
                and not m.kwargs and isinstance(m.args[0], torch.fx.Node)}
    mset = set(members)
    collapsed = {}
    for m in members:
        if m not in vmembers or (m not in outs and all(u in vmembers for u in m.users)):
            continue        # not the end of a chain
        seq, root = [], m
        while root in vmembers:
            seq.append(root)
            root = root.args[0]
        if len(seq) < 2 or (root not in mset and not isinstance(root, torch.fx.Node)):
            continue
        plan = _strided_chain(root, seq[::-1], views)
        if plan is not None:
            collapsed[m] = (root, seq[::-1], plan)
    need = set()
    for m in reversed(members):
        if m not in vmembers or m in outs or any(u not in vmembers for u in m.users) or \
                any(u in need and u not in collapsed for u in m.users):
            need.add(m)
    return collapsed, need


def _strided_chain(root, seq, views):
    """(size, stride, storage offset delta, root strides) of ``seq`` (view nodes) applied to a
    tensor laid out as ``root``'s FX metadata says, or None where the result is no view of it."""
    meta = _meta(root)
    if not isinstance(meta, torch.Tensor):
        return None
    try:
        base = torch.empty_strided(_static_shape(meta), tuple(int(s) for s in meta.stride()),
                                   dtype=meta.dtype, device="meta")
        t = base
        for v in seq:
            if any(isinstance(a, torch.fx.Node) for a in v.args[1:]):
                return None
            t = getattr(t, views[v.target])(*v.args[1:])
        want = _meta(seq[-1])
        if t._base is not base or not isinstance(want, torch.Tensor) or \
                tuple(t.shape) != _static_shape(want):
            return None
        return (tuple(t.shape), tuple(t.stride()), t.storage_offset() - base.storage_offset(),
                tuple(base.stride()))
    except Exception:           # symbolic sizes, an op meta tensors lack: the chain runs as it is
        return None


# ----------------------------------------------------------------------------------------------
# op handlers: (lowering, node) -> _Rec, or raise _NotLowered
# ----------------------------------------------------------------------------------------------

_LOWER = {}


def _register(*packets):
    def deco(fn):
        for p in packets:
            _LOWER[p] = fn
        return fn
    return deco


def _dummy(L, a):
    """A stand-in for torch.result_type: an empty tensor (0-d stays 0-d) or the scalar."""
    if isinstance(a, torch.fx.Node):
        r = L.rec(a)
        return torch.empty(() if len(r.tshape) == 0 else (0,), dtype=r.dtype)
    return a


def _result_type(L, args):
    """torch's promoted dtype of the operands (0-d tensors and scalars weakly typed)."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
    _, dt = elementwise_dtypes(*[_dummy(L, a) for a in args],
                               type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return dt


def _pointwise(core, compute="out", nargs=None):
    """compute: "out": operands cast to the result dtype (arithmetic); "common": to their promoted
    dtype (comparisons); "none": as they are."""
    def handler(L, node):
        args = list(node.args[:nargs] if nargs else node.args)
        if node.kwargs:
            raise _NotLowered("kwargs %s" % node.kwargs)
        for a in args:
            if not isinstance(a, (torch.fx.Node, bool, int, float)):
                raise _NotLowered("argument %r" % (a,))
        meta = _meta(node)
        if compute == "out":
            dt = meta.dtype
        elif compute == "common":
            dt = _result_type(L, args)
        else:
            dt = None
        _check_int_divisor(core, dt, args[1:])
        ops = [L.operand(a, dt, opmath=core in _TORCH_OPMATH_SCALAR) for a in args]
        if compute == "common" and dt is not None and not dt.is_floating_point and dt != torch.bool:
            # torch compares an integer tensor with a Python int made its dtype first (it wraps:
            # int8 < 300 is int8 < 44; uint8 < -1 is uint8 < 255)
            ops = [torch.tensor(o).to(dt).item() if type(o) is int else o for o in ops]
        if core in ("floordiv", "remainder"):
            ops[1] = _checked_divisor(L, ops[1], dt)
        return L.out(node, L.g.call(core, *ops), L.cshape_of(*args))
    return handler


def _check_int_divisor(core, dt, divisors):
    """torch raises on an integer division by a zero Python scalar (the core gives 0): the op is
    left to torch then, which raises at the call as eager does."""
    if core in ("floordiv", "remainder", "div") and dt is not None and not dt.is_floating_point \
            and any(type(d) in (int, bool) and d == 0 for d in divisors):
        raise _NotLowered("integer %s by zero" % core)


def _checked_divisor(L, y, dt):
    """An integer division's tensor divisor, checked in the kernel: a 0 raises RuntimeError
    "ZeroDivisionError" at the call, as torch's CPU kernels do (the core alone gives 0, as NumPy).
    Python scalars are checked while lowering (_check_int_divisor)."""
    if dt is None or dt.is_floating_point or isinstance(y, (bool, int, float)):
        return y
    return L.g.call("check_divisor", y)



_UNARY = ["abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
          "reciprocal", "sin", "cos", "tan", "tanh", "asin", "acos", "atan", "sinh", "cosh", "asinh",
          "acosh", "atanh", "erf", "sigmoid", "relu", "floor", "ceil", "trunc", "silu",
          "bitwise_not"]
_BINARY = {"mul": "mul", "maximum": "maximum", "minimum": "minimum", "fmax": "fmax", "fmin": "fmin",
           "atan2": "atan2", "hypot": "hypot", "copysign": "copysign", "remainder": "remainder",
           "floor_divide": "floordiv", "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or",
           "bitwise_xor": "bitwise_xor"}
_COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]

for _name in _UNARY:
    _register(getattr(aten, _name))(_pointwise(_name, nargs=1))
for _name, _core in _BINARY.items():
    _register(getattr(aten, _name))(_pointwise(_core, nargs=2))
for _name in _COMPARE:
    _register(getattr(aten, _name))(_pointwise(_name, "common", nargs=2))
for _name in ("logical_and", "logical_or", "logical_xor"):
    _register(getattr(aten, _name))(_pointwise(_name, "none", nargs=2))
for _name in ("logical_not", "isnan", "isinf", "isfinite"):
    _register(getattr(aten, _name))(_pointwise(_name, "none", nargs=1))


@_register(aten.round)
def _round(L, node):
    d = node.kwargs.get("decimals", node.args[1] if len(node.args) > 1 else 0)
    x = node.args[0]
    dt = _meta(node).dtype
    v = L.operand(x, dt)
    if d == 0 or not dt.is_floating_point:
        r = L.g.call("round", v)
    elif d > 0:                  # torch: nearbyint(x * 10^d) / 10^d
        r = L.g.call("div", L.g.call("round", L.g.call("mul", v, 10.0 ** d)), 10.0 ** d)
    else:                        # torch: nearbyint(x / 10^-d) * 10^-d
        r = L.g.call("mul", L.g.call("round", L.g.call("div", v, 10.0 ** -d)), 10.0 ** -d)
    return L.out(node, r, L.cshape_of(x))


@_register(aten.sign)
def _sign(L, node):
    x = node.args[0]
    r = L.rec(x)
    if r.dtype == torch.bool:
        return _Rec(r.value, r.cshape, r.tshape, r.dtype)
    if not r.dtype.is_floating_point:
        return _pointwise("sign", nargs=1)(L, node)
    v = L.operand(x, _meta(node).dtype)        # torch: sign(nan) is 0 (NumPy's, the core's, is nan)
    return L.out(node, L.g.call("where", L.g.call("isnan", v), 0.0, L.g.call("sign", v)), L.cshape_of(x))


@_register(aten.pow)
def _pow(L, node):
    base, exp = node.args[:2]
    meta = _meta(node)
    if isinstance(base, torch.fx.Node) and isinstance(exp, (int, float)) and not isinstance(exp, bool):
        if exp == 2:
            x = L.operand(base, meta.dtype)
            return L.out(node, L.g.call("mul", x, x), L.cshape_of(base))
        if exp == 0.5 and meta.dtype.is_floating_point:
            return L.out(node, L.g.call("sqrt", L.operand(base, meta.dtype)), L.cshape_of(base))
    if meta.dtype != torch.bool and not meta.dtype.is_floating_point and not meta.dtype.is_complex \
            and isinstance(exp, torch.fx.Node) and not node.kwargs:
        return _int_pow_by_tensor(L, node, base, exp, meta.dtype)
    return _pointwise("pow", nargs=2)(L, node)


def _int_pow_by_tensor(L, node, base, exp, dtype):
    """Integer pow with a tensor exponent, which may be negative, or become negative in the
    result's dtype (int8 ** tensor(1000) is int8 ** -24, as torch casts it): torch gives 1 for a
    base of 1, +-1 for -1 (by the exponent's parity), 0 for any other base; the core's pow raises
    on a negative exponent, as NumPy's does. So: the core's pow at max(e, 0), and that rule where
    e < 0."""
    g = L.g
    x, e = L.operand(base, dtype), L.operand(exp, dtype)
    pos = g.call("pow", x, g.call("maximum", e, 0))
    minus_one = g.call("where", g.call("ne", g.call("remainder", e, 2), 0), -1, 1)
    if isinstance(base, torch.fx.Node):
        neg = g.call("where", g.call("eq", x, 1), 1, g.call("where", g.call("eq", x, -1), minus_one, 0))
    else:
        neg = 1 if x == 1 else minus_one if x == -1 else 0
    return L.out(node, g.call("where", g.call("lt", e, 0), neg, pos), L.cshape_of(base, exp))


@_register(aten.add, aten.sub)
def _add_sub(L, node):
    core = "add" if node.target.overloadpacket is aten.add else "sub"
    a, b = node.args[:2]
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
    if set(node.kwargs) - {"alpha"} or not isinstance(alpha, (bool, int, float)):
        raise _NotLowered("add kwargs")
    dt = _meta(node).dtype
    if core == "sub" and any(type(v) is bool or isinstance(v, torch.fx.Node) and L.rec(v).dtype == torch.bool
                             for v in (a, b)):
        raise _NotLowered("sub of a bool")     # torch raises: left to it, which raises at the call
    x, y = L.operand(a, dt), L.operand(b, dt)
    if alpha != 1:
        y = L.g.call("mul", y, alpha) if not isinstance(y, (int, float)) else y * alpha
    return L.out(node, L.g.call(core, x, y), L.cshape_of(a, b))


@_register(aten.div)
def _div(L, node):
    a, b = node.args[:2]
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    dt = _meta(node).dtype
    _check_int_divisor("floordiv" if mode is not None else "div", dt, [b])
    if mode is None:
        return L.out(node, L.g.call("div", L.operand(a, dt, opmath=True), L.operand(b, dt, opmath=True)),
                     L.cshape_of(a, b))
    if mode == "floor":
        return L.out(node, L.g.call("floordiv", L.operand(a, dt, opmath=True),
                                    _checked_divisor(L, L.operand(b, dt, opmath=True), dt)), L.cshape_of(a, b))
    if mode == "trunc" and dt.is_floating_point:
        q = L.g.call("div", L.operand(a, dt, opmath=True), L.operand(b, dt, opmath=True))
        return L.out(node, L.g.call("trunc", q), L.cshape_of(a, b))
    if mode == "trunc" and dt != torch.bool:
        # integers: floor quotient, plus one where the remainder is nonzero and the signs differ
        x, y = L.operand(a, dt), _checked_divisor(L, L.operand(b, dt), dt)
        q = L.g.call("floordiv", x, y)
        fix = L.g.call("logical_and", L.g.call("ne", L.g.call("remainder", x, y), 0),
                       L.g.call("logical_xor", L.g.call("lt", x, 0), L.g.call("lt", y, 0)))
        return L.out(node, L.g.call("where", fix, L.g.call("add", q, 1), q), L.cshape_of(a, b))
    raise _NotLowered("div rounding_mode=%r on %s" % (mode, dt))


@_register(aten.gelu)
def _gelu(L, node):
    approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    x = node.args[0]
    v = L.operand(x, _meta(node).dtype)
    return L.out(node, L.g.call("gelu", v, approximate=approx), L.cshape_of(x))


@_register(aten.gelu_backward)
def _gelu_backward(L, node):
    """grad * gelu'(x). The erf form is the core's gelu_grad: one exp and a rational per
    element, where torch's decomposition (which Inductor compiles) computes erf and exp apart;
    the tanh form is torch's decomposition, op for op."""
    grad, x = node.args[:2]
    approx = node.kwargs.get("approximate", node.args[2] if len(node.args) > 2 else "none")
    dt = _meta(node).dtype
    g, v = L.operand(grad, dt), L.operand(x, dt)
    call = L.g.call
    if approx == "none":
        d = call("gelu_grad", v)
    elif approx == "tanh":
        beta, kappa = 1.41421356237309504880 * 1.12837916709551257390 * 0.5, 0.044715
        x_sq = call("mul", v, v)
        inner = call("mul", call("add", v, call("mul", call("mul", x_sq, v), kappa)), beta)
        t = call("tanh", inner)
        left_d = call("mul", call("add", t, 1), 0.5)
        right_d = call("mul", call("mul", call("mul", v, 0.5), call("sub", 1, call("mul", t, t))),
                       call("mul", call("add", call("mul", x_sq, 3 * kappa), 1), beta))
        d = call("add", left_d, right_d)
    else:
        raise _NotLowered("gelu_backward approximate=%r" % (approx,))
    return L.out(node, call("mul", g, d), L.cshape_of(grad, x))


@_register(aten.softplus)
def _softplus(L, node):
    beta = node.args[1] if len(node.args) > 1 else node.kwargs.get("beta", 1)
    thr = node.args[2] if len(node.args) > 2 else node.kwargs.get("threshold", 20)
    x = node.args[0]
    v = L.operand(x, _meta(node).dtype)
    if beta == 1 and thr == 20:
        return L.out(node, L.g.call("softplus", v), L.cshape_of(x))
    # torch: x * beta > threshold ? x : log1p(exp(x * beta)) / beta
    t = L.g.call("mul", v, beta)
    soft = L.g.call("div", L.g.call("log1p", L.g.call("exp", t)), beta)
    return L.out(node, L.g.call("where", L.g.call("gt", t, thr), v, soft), L.cshape_of(x))


@_register(aten.where)
def _where(L, node):
    if len(node.args) != 3 or node.kwargs:
        raise _NotLowered("where(cond) without values")
    c, a, b = node.args
    dt = _meta(node).dtype
    cond = L.operand(c, torch.bool)
    return L.out(node, L.g.call("where", cond, L.operand(a, dt), L.operand(b, dt)), L.cshape_of(c, a, b))


@_register(aten.clamp, aten.clamp_min, aten.clamp_max)
def _clamp(L, node):
    packet = node.target.overloadpacket
    x = node.args[0]
    if packet is aten.clamp:
        lo = node.kwargs.get("min", node.args[1] if len(node.args) > 1 else None)
        hi = node.kwargs.get("max", node.args[2] if len(node.args) > 2 else None)
    elif packet is aten.clamp_min:
        lo, hi = node.args[1], None
    else:
        lo, hi = None, node.args[1]
    dt = _meta(node).dtype
    v = L.operand(x, dt)
    if lo is not None:
        v = L.g.call("maximum", v, L.operand(lo, dt))
    if hi is not None:
        v = L.g.call("minimum", v, L.operand(hi, dt))
    return L.out(node, v, L.cshape_of(*[a for a in (x, lo, hi) if a is not None]))


# -- casts, copies, constants ----------------------------------------------------------------

def _cpu_only(node, *names):
    for n in names:
        d = node.kwargs.get(n)
        if n == "device" and d is not None and torch.device(d).type != "cpu":
            raise _NotLowered("device %s" % d)
        if n == "layout" and d not in (None, torch.strided):
            raise _NotLowered("layout %s" % d)


@_register(aten._to_copy, aten.clone, aten.alias, aten.detach, aten.lift_fresh_copy,
           prims.convert_element_type, aten.contiguous)
def _identity_cast(L, node):
    _cpu_only(node, "device", "layout")
    if node.kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        pass    # values are the same; the core writes C order
    x = node.args[0]
    r = L.rec(x)
    meta = _meta(node)
    if node.target.overloadpacket in (aten.alias, aten.detach) and _core_dtype(meta.dtype) == _core_dtype(r.dtype):
        # a view of the same value: no cast node, whose dtype the core cannot know for an extern
        # result until run time, and which would make a copy kernel of it (then a graph output
        # carries the extern's tensor with its own layout, not a C-ordered copy restrided)
        return _Rec(r.value, r.cshape, _static_shape(meta), meta.dtype)
    v = L.convert(node, r.value, r.dtype, meta.dtype)
    if v is r.value and node.target.overloadpacket not in (aten.alias, aten.detach):
        L.copied.add(node)      # a copy in torch, the same value in the core (_fresh_inputs)
    return _Rec(v, r.cshape, _static_shape(meta), meta.dtype)


@_register(aten.copy)
def _copy(L, node):
    if len(node.args) > 2 or node.kwargs:
        raise _NotLowered("copy non_blocking")
    src = L.rec(node.args[1])
    meta = _meta(node)
    v = L.convert(node, src.value, src.dtype, meta.dtype)
    if v is src.value:
        L.copied.add(node)
    return _Rec(v, src.cshape, _static_shape(meta), meta.dtype)


def _constant(L, node, value):
    meta = _meta(node)
    if not isinstance(value, (bool, int, float)):
        raise _NotLowered("fill value %r" % (value,))
    name = _core_dtype(meta.dtype)
    if name is None:
        raise _NotLowered("dtype")
    if np.dtype(name).kind in "iu" and isinstance(value, float):
        raise _NotLowered("float fill of an integer tensor")
    c = L.g.constant(np.dtype(name).type(value))
    return _Rec(c, (), _static_shape(meta), meta.dtype)


@_register(aten.full, aten.scalar_tensor)
def _full(L, node):
    _cpu_only(node, "device", "layout")
    if node.target.overloadpacket is aten.scalar_tensor:
        return _constant(L, node, node.args[0])
    return _constant(L, node, node.args[1])


@_register(aten.full_like, aten.fill)
def _full_like(L, node):
    _cpu_only(node, "device", "layout")
    if node.target not in (aten.full_like.default, aten.fill.Scalar):
        raise _NotLowered("fill with a tensor")
    return _constant(L, node, node.args[1])


# -- views ---------------------------------------------------------------------------------------

def _dtype_view(node):
    """x.view(dtype) (aten.view.dtype): a reinterpretation of the bits, not a reshape."""
    return len(node.args) > 1 and isinstance(node.args[1], torch.dtype)


@_register(aten.view, aten._unsafe_view, aten.reshape, aten.unsqueeze, aten.squeeze, aten.expand,
           prims.broadcast_in_dim, aten.permute)
def _view(L, node):
    """A view costs nothing when the core value's elements do not move: an expand (broadcast),
    or a change of leading size-1 dims; a permute that moves only size-1 dims. Else an extern.
    x.view(dtype) reinterprets the bits: torch's op, always an extern (a core cast converts)."""
    if _dtype_view(node):
        raise _NotLowered("view as another dtype: a bit reinterpretation")
    x = node.args[0]
    if isinstance(L.env.get(x), _Cluster) and not L.env[x].closed:
        raise _NotLowered("view of an extern result: joins its cluster")
    r = L.rec(x)
    meta = _meta(node)
    new = _static_shape(meta)
    packet = node.target.overloadpacket
    if packet in (aten.expand, prims.broadcast_in_dim):
        if packet is prims.broadcast_in_dim:
            dims = list(node.args[2])
            if dims != list(range(len(new) - len(r.tshape), len(new))):
                raise _NotLowered("broadcast_in_dim with inner dims")
        return _Rec(r.value, r.cshape, new, r.dtype)
    if _strip1(new) == _strip1(r.tshape) and packet is not aten.permute:
        if r.exact or _leading_only(r.tshape, new):
            return _Rec(r.value, r.cshape, new, r.dtype)
    if packet is aten.permute:
        perm = list(node.args[1])
        moved = [d for i, d in enumerate(perm) if d != i]
        if all(r.tshape[d] == 1 for d in moved) and r.exact and _strip1(new) == _strip1(r.tshape):
            return _Rec(r.value, r.cshape, new, r.dtype)
    return _push_view(L, node, r, new)


@_register(aten.select, aten.slice, aten.t, aten.transpose)
def _moving_view(L, node):
    """Views that move elements: pushed to the leaves of the value they view, or an extern."""
    x = node.args[0]
    if isinstance(L.env.get(x), _Cluster) and not L.env[x].closed:
        raise _NotLowered("view of an extern result: joins its cluster")
    return _push_view(L, node, L.rec(x), _static_shape(_meta(node)))


# Pointwise ops cheap enough to compute again in a view's index space, where the value they make
# is also needed unviewed (the same value is never recomputed when it holds a transcendental).
_CHEAP = frozenset(("neg", "abs", "relu", "floor", "ceil", "round", "trunc", "sign", "isnan", "isinf",
                    "isfinite", "logical_not", "bitwise_not", "add", "sub", "mul", "div", "square",
                    "reciprocal", "sqrt", "rsqrt", "maximum", "minimum", "fmax", "fmin", "copysign",
                    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
                    "bitwise_and", "bitwise_or", "bitwise_xor", "where", "clamp", "cast"))
_PUSH_MAX_NODES = 64
# the ops _feeds_core looks through: those the two view handlers take, and alias
_VIEW_PACKETS = frozenset(p for p, h in _LOWER.items() if h in (_view, _moving_view)) | {aten.alias}


def _uses_end_in(node, through, ends, depth=0):
    """Every use of ``node``, looking through ops in ``through``, is an op in ``ends``."""
    if not node.users or depth > 8:
        return False
    for u in node.users:
        pk = getattr(u.target, "overloadpacket", None) if u.op == "call_function" else None
        if pk in through:
            if not _uses_end_in(u, through, ends, depth + 1):
                return False
        elif pk not in ends:
            return False
    return True


def _externs_only(node, depth=0):
    """No use of ``node``, looking through views, is an op the core lowers: only extern clusters
    (a matmul, an attention) read it."""
    if depth > 8:
        return False
    for u in node.users:
        if u.op == "output":
            continue
        pk = getattr(u.target, "overloadpacket", None) if u.op == "call_function" else None
        if pk in _VIEW_PACKETS:
            if not _externs_only(u, depth + 1):
                return False
        elif pk in _LOWER:
            return False
    return True


def _feeds_core(node):
    """Every use of ``node`` (through further views) is an op the core lowers: pushing the view
    to the leaves then saves a kernel pass. An extern use takes the view in its own cluster."""
    return _uses_end_in(node, _VIEW_PACKETS, _LOWER)


def _core_or_output_use(node, depth=0):
    """Some use of ``node``, looking through views, is a graph output or an op the core lowers."""
    if depth > 8:
        return False
    for u in node.users:
        if u.op == "output":
            return True
        pk = getattr(u.target, "overloadpacket", None) if u.op == "call_function" else None
        if pk in _VIEW_PACKETS:
            if _core_or_output_use(u, depth + 1):
                return True
        elif pk in _LOWER:
            return True
    return False


def _broadcast(x, shape):
    """np.broadcast_to(x, shape) (read-only), in about 1 us instead of 7 where x is C-contiguous:
    an ndarray over x's buffer with the broadcast dimensions' strides 0."""
    if not x.flags.c_contiguous or x.ndim > len(shape):
        return np.broadcast_to(x, shape)
    pad = len(shape) - x.ndim
    strides = [0] * pad
    for d, (n, s) in enumerate(zip(x.shape, x.strides)):
        if n != shape[pad + d]:
            if n != 1:
                return np.broadcast_to(x, shape)    # raises NumPy's own error
            s = 0
        strides.append(s)
    r = np.ndarray(shape, x.dtype, x, 0, strides)
    r.flags.writeable = False
    return r


def _np_view(node, shape, new):
    """The view ``node`` does (on an input of torch ``shape``) as a NumPy function, or None."""
    pk = node.target.overloadpacket
    a = node.args
    nd = len(shape)
    if _dtype_view(node):
        return None                               # a bit reinterpretation, not a reshape
    if pk in (aten.view, aten._unsafe_view, aten.reshape, aten.unsqueeze, aten.squeeze):
        return lambda x: x.reshape(new)           # element order kept: a view, or a copy
    if pk is aten.permute:
        dims = tuple(d % nd for d in a[1])
        return lambda x: x.transpose(dims)
    if pk is aten.expand:
        return lambda x: np.broadcast_to(x, new)
    if pk is aten.t:
        return lambda x: x.T
    if pk is aten.transpose:
        d0, d1 = a[1] % nd, a[2] % nd
        return lambda x: x.swapaxes(d0, d1)
    if pk is aten.select:
        idx = (slice(None),) * (a[1] % nd) + (a[2],)
        return lambda x: x[idx]
    if pk is aten.slice:
        if node.kwargs:
            return None
        d = a[1] if len(a) > 1 else 0
        start, end, step = (list(a[2:5]) + [None, None, 1])[:3]
        idx = (slice(None),) * (d % nd) + (slice(start, end, step),)
        return lambda x: x[idx]
    return None


def _meta_strides(meta):
    """The element strides of an FX value's example tensor, or None where it has none."""
    try:
        return tuple(int(s) for s in meta.stride())
    except Exception:           # no strides (sparse, opaque): the stand-in broadcasts
        return None


_OFFSETS_MAX = 1 << 22     # leaves up to this many elements are checked element by element


def _leaf_view(shape, strides, chain):
    """How ``chain`` (NumPy view functions) acts on a leaf of ``shape`` and these element
    strides: ("view", chain, spec) where NumPy does it without copying; ("strided", chain, spec)
    where NumPy would copy (a reshape across a permuted leaf) but the result is still a strided
    view of the leaf, which the core makes from the spec; None where it is a real copy. Found by
    running the chain on the leaf's element offsets. spec: Graph.extern's view= (in_shape,
    in_strides, out_shape, out_strides, offset), so the core makes the view itself where the
    leaf comes as traced (elsewhere the chain runs); None where the strides are unknown or the
    leaf too large to check. Unknown strides: ("view", chain, None), as before strides were
    known."""
    if strides is None or len(strides) != len(shape) or min(strides, default=0) < 0 or \
            0 in shape or int(np.prod(shape)) > _OFFSETS_MAX:
        return "view", chain, None
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    # first on bytes no one reads: where NumPy makes a view, its strides and start are the
    # answer, with no element touched (the offsets below cost ~1 ms for a 1M-element leaf)
    raw = np.empty(span, np.uint8)
    try:
        got = np.asarray(chain(np.lib.stride_tricks.as_strided(raw, shape, strides, writeable=False)))
    except Exception:
        got = None
    if got is not None and got.size and np.may_share_memory(got, raw):
        start = got.__array_interface__["data"][0] - raw.__array_interface__["data"][0]
        est = tuple(st if n > 1 else 0 for n, st in zip(got.shape, got.strides))
        return "view", chain, (tuple(shape), tuple(strides), tuple(got.shape), est, start)
    flat = np.arange(span, dtype=np.int64)
    offs = np.lib.stride_tricks.as_strided(flat, shape, [s * 8 for s in strides], writeable=False)
    got = np.asarray(chain(offs))
    if got.size == 0:
        return "view", chain, None
    start = int(got.flat[0])
    est = [int(got[(0,) * a + (1,) + (0,) * (got.ndim - a - 1)]) - start if got.shape[a] > 1 else 0
           for a in range(got.ndim)]
    grid = start + sum(np.arange(n).reshape((n,) + (1,) * (got.ndim - a - 1)) * s
                       for a, (n, s) in enumerate(zip(got.shape, est)))
    if not np.array_equal(got, grid):
        return None if not np.may_share_memory(got, flat) else ("view", chain, None)
    spec = (tuple(shape), tuple(strides), tuple(got.shape), tuple(est), start)
    return ("view" if np.may_share_memory(got, flat) else "strided"), chain, spec


def _viewed_again(node):
    """Every use of ``node`` is another view, or a clone whose uses are views again."""
    return _uses_end_in(node, (aten.clone,), _VIEW_PACKETS)


def _compose(fns):
    def view(x):
        for f in fns:
            x = f(x)
        return x
    return view


def _push_view(L, node, r, new):
    """view(f(a, b, ...)) as f(view(a), view(b), ...): the pointwise ops that make ``r`` are
    emitted again over views of their leaves (graph inputs, extern results), each view a NumPy
    extern of its leaf (pure: skipped when nothing reads it). One kernel then writes the viewed
    value where an extern view and a copy kernel did. Raises _NotLowered where this cannot be done
    (a reduction or a transcendental inside, more than _PUSH_MAX_NODES ops, an extern user)."""
    G = L.g
    if L.device is not None:        # the leaf views are NumPy functions: on CUDA, torch does the view
        raise _NotLowered("view %s -> %s on %s" % (r.tshape, new, L.device))
    # a view that graph outputs or core ops read, but not only core ops, of a value the core
    # holds anyway (an extern's result, a kernel's output): a view extern of that value, made in
    # C, is the graph's output and what the core ops and externs read; a one-view torch cluster
    # would cost a from_numpy and a .numpy() per call (a weight's grad, transposed)
    base = G.view_of.get(r.value.node, (r.value,))[0].node
    leaf_only = not _feeds_core(node)
    if leaf_only and not (_core_or_output_use(node) and
                          (base in L.extern_values or G.made.get(base, ("?",))[0] == "call")):
        raise _NotLowered("view %s -> %s feeds an extern" % (r.tshape, new))
    vf = _np_view(node, r.tshape, new)
    if vf is None:
        raise _NotLowered("view %s -> %s" % (r.tshape, new))
    tshape, nd = r.tshape, len(r.tshape)

    def bcast(x):
        if x.ndim > nd:             # the core's extra leading dims are 1
            x = x.reshape(x.shape[x.ndim - nd:])
        return x if x.shape == tshape else _broadcast(x, tshape)
    perm = _perm_of(node, nd)
    saved = []                      # (FX node, its _Rec): values pushed through that graph outputs read
    try:
        if leaf_only:               # viewed where it is, never computed again in the view's order
            raise _NotLowered("not only core ops read it")
        order, leaves = _push_walk(G, r, reductions=perm is not None)
        reduced = _reduced(G, order)
        if reduced and not _private(L, node, reduced):
            saved = _saved_by_outputs(L, node, reduced, r.tshape)
    except _NotLowered:
        if G.made.get(r.value.node, ("?",))[0] != "call" and not leaf_only:
            raise
        # a reduction or a transcendental inside: the value is stored by its segment and viewed
        # there, as a leaf (made by the core itself where it comes laid out as traced)
        order, leaves = [], [r.value]
        G.leaf_shape.setdefault(r.value.node, r.cshape)
        G.leaf_strides.setdefault(r.value.node, _contiguous_strides(r.cshape))
    new_of, spec = {}, None
    for v in leaves:
        base, fns = G.view_of.get(v.node, (v, ()))
        fns = fns + (bcast, vf)
        view = _compose(fns)
        try:                        # on a stand-in of the leaf's shape: fails here, not at run time
            probe = view(np.broadcast_to(np.zeros((), np.int8), G.leaf_shape[base.node]))
        except Exception as e:
            raise _NotLowered("view %s -> %s: %s" % (r.tshape, new, e))
        if tuple(probe.shape) != new:
            raise _NotLowered("view %s -> %s gives %s" % (r.tshape, new, probe.shape))
        how = _leaf_view(G.leaf_shape[base.node], G.leaf_strides.get(base.node), view)
        # a real copy: NumPy would copy the leaf on one thread at every call, so the core
        # value is written by a kernel and viewed there instead; unless it is only viewed
        # further (after clones), where a later view may be a strided view of the leaf again
        # (flash attention's grads: (B, H, T, D) over (B, T, H, D) memory, reshaped to
        # (B*H, T, D), permuted and reshaped to (T, B, H*D))
        if how is None and (leaf_only or not _viewed_again(node)):
            raise _NotLowered("view %s -> %s copies its leaf" % (r.tshape, new))
        spec = how[2] if how is not None else None
        if leaf_only and (spec is None or any(st == 0 and n > 1 for n, st in zip(spec[2], spec[3]))):
            # of unknown layout, or broadcast (read-only: as a graph output torch would warn at
            # each call): left to a cluster
            raise _NotLowered("view %s -> %s: no strided view of its own, not only for core ops" % (r.tshape, new))
        w = G.extern(view, base, pure=True, view=spec)
        G.view_of[w.node] = (base, fns)
        G.leaf_shape[w.node] = new
        new_of[v.node] = w
    for v in order:
        _, op, args, attrs = G.made[v.node]
        if op in _PUSH_REDUCTIONS and attrs.get("axis") is not None:
            # the reduced axes, where the permute put them (the value is full rank once viewed)
            moved = tuple(sorted(perm.index(a) for a in _reduced_axes(G, G.made[v.node], nd)[0]))
            attrs = dict(attrs, axis=moved if isinstance(attrs["axis"], tuple) else moved[0])
        args = [new_of.get(a.node, a) if hasattr(a, "node") else a for a in args]
        new_of[v.node] = G.call(op, *args, **attrs)
    for f, r0 in saved:
        _rebind_saved(L, f, r0, new_of[r0.value.node], perm)
    out = new_of.get(r.value.node, r.value)
    meta = _meta(node)
    if not order and spec is not None and _core_dtype(meta.dtype) == _core_dtype(r.dtype):
        # the view itself, laid out as its spec says (_layout compares that with eager's), with
        # no cast: an extern's dtype is known to the core only at run time, and a cast node of
        # it would be a copy kernel wherever no other op reads the view
        L.view_strides[out.node] = spec[3]
        return _Rec(out, new, new, meta.dtype)
    if leaf_only:
        raise _NotLowered("view %s -> %s changes dtype, not only for core ops" % (r.tshape, new))
    return _Rec(L.cast(out, meta.dtype), new if leaves else (), new, meta.dtype)


# Reductions a permute is pushed through (_push_view): rank-keeping ones, their axes moved with
# the permute, and only where nothing else reads them (never computed twice).
_PUSH_REDUCTIONS = frozenset(("sum", "mean", "var", "std", "amax", "amin", "prod", "logsumexp", "softmax",
                              "log_softmax"))


def _perm_of(node, nd):
    """The dims a permute or transpose of rank ``nd`` takes (output dim i is input dim perm[i]),
    or None for any other view."""
    pk = node.target.overloadpacket
    if pk is aten.permute:
        return [d % nd for d in node.args[1]]
    if pk is aten.transpose and nd:
        perm = list(range(nd))
        d0, d1 = node.args[1] % nd, node.args[2] % nd
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    return None


def _reduced(G, order):
    """The core nodes among ``order`` (the values a view is pushed through, readers after what
    they read) that are reductions or read one: those a push must not compute twice. The others
    are cheap pointwise values of the leaves, computed again in the view's order wherever
    something else reads them unviewed (a LayerNorm backward's normalized input, which its
    weight's grad reads too)."""
    out = set()
    for v in order:
        _, op, args, _ = G.made[v.node]
        if op in _PUSH_REDUCTIONS or any(hasattr(a, "node") and a.node in out for a in args):
            out.add(v.node)
    return out


def _private(L, view_node, nodes):
    """Every FX node whose lowered value is among ``nodes`` (the reductions a view is pushed
    through, and what reads them: _reduced) is read only by others of them, by values the push
    computes again, or by the view: pushing the view computes them again in the view's layout,
    and the originals are then dead rather than computed twice."""
    owners = _owners(L, nodes)
    inside = set(owners) | {view_node}
    return bool(owners) and all(u in inside for f in owners for u in f.users)


def _owners(L, nodes):
    """FX node -> its lowered value (a _Rec, or a tuple of them), for those whose value is among
    the core ``nodes``."""
    owners = {}
    for f, val in L.env.items():
        vals = val if isinstance(val, tuple) else (val,)
        if any(isinstance(x, _Rec) and x.value.node in nodes for x in vals):
            owners[f] = val
    return owners


def _saved_by_outputs(L, view_node, nodes, full):
    """Where a permute is pushed through reductions (``nodes``: _reduced) that other FX nodes
    read too (training: a LayerNorm's mean and rstd, saved for the backward), and those readers
    are graph outputs only: the FX nodes to give the pushed values, viewed back (_rebind_saved),
    as Inductor's LayerNorm kernel writes the transposed output and the statistics. Raises
    _NotLowered where another node reads them, or one is not a full-rank tensor value of its own
    with the viewed value's shape (``full``) but for the reduced axes, which the pushed value has."""
    nd = len(full)
    reduced_axes = set()
    for n in nodes:
        how = L.g.made[n]
        if how[1] in _PUSH_REDUCTIONS:
            reduced_axes.update(_reduced_axes(L.g, how, nd)[0])
    owners = _owners(L, nodes)
    inside = set(owners) | {view_node}
    saved = []
    for f, val in owners.items():
        outside = [u for u in f.users if u not in inside]
        if not outside:
            continue
        if any(u.op != "output" for u in outside):
            raise _NotLowered("view of a reduction other nodes read too")
        if not isinstance(val, _Rec) or len(val.tshape) != nd or val.value.ndim != nd or \
                tuple(val.cshape) != tuple(val.tshape):
            raise _NotLowered("view of a reduction a graph output reads as %s" % (val,))
        if any(n != m and not (n == 1 and i in reduced_axes) for i, (n, m) in enumerate(zip(val.tshape, full))):
            # broadcast along an axis no reduction took: the pushed value has another shape
            raise _NotLowered("view of a reduction a graph output reads at another shape")
        if math.prod(val.tshape) * 4 > math.prod(full):
            # a full-size value (a softmax saved for its backward): viewed back, eager's layout
            # would cost a copy of it, the one the pushed permute saves
            raise _NotLowered("view of a reduction a graph output reads at full size")
        saved.append((f, val))
    return saved


def _rebind_saved(L, f, r0, pushed, perm):
    """FX node ``f`` (a graph output; its value ``r0`` was pushed through a permute) becomes the
    pushed value viewed back by the inverse permute: a view extern made in C (restrided to
    eager's layout where the two differ, a copy of a statistic's few elements). The original
    value is then dead: computed once, in the view's order."""
    G = L.g
    inv = tuple(perm.index(d) for d in range(len(perm)))
    shape = tuple(r0.tshape[p] for p in perm)
    st = _contiguous_strides(shape)             # the pushed value, as its kernel stores it
    G.leaf_shape[pushed.node] = shape
    G.leaf_strides[pushed.node] = st

    def back(x):
        return x.transpose(inv)
    out_strides = tuple(st[inv[i]] if n > 1 else 0 for i, n in enumerate(r0.tshape))
    spec = (shape, st, tuple(r0.tshape), out_strides, 0)    # at any size (_leaf_view stops at 4M)
    w = G.extern(back, pushed, pure=True, view=spec)
    G.view_of[w.node] = (pushed, (back,))
    G.leaf_shape[w.node] = r0.tshape
    L.view_strides[w.node] = out_strides
    L.env[f] = _Rec(w, r0.tshape, r0.tshape, r0.dtype)


def _reduced_axes(G, how, nd):
    """The axes (of a rank-``nd`` view's unviewed value) that reduction ``how`` (a G.made entry)
    reduces, and its input's core shape; _NotLowered where that shape is unknown."""
    _, op, args, attrs = how
    shape = G.shape.get(args[0].node) if hasattr(args[0], "node") else None
    if shape is None:
        raise _NotLowered("view of %s of unknown shape" % op)
    k = len(shape)
    axis = attrs.get("axis")
    axes = range(k) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    return tuple(a % k + nd - k for a in axes), shape


def _check_reduced_extent(G, how, full):
    nd = len(full)
    axes, shape = _reduced_axes(G, how, nd)
    k = len(shape)
    for ra in axes:
        if ra < 0 or shape[ra - nd + k] != full[ra]:
            raise _NotLowered("view of %s over an axis its input broadcasts" % how[1])


def _push_walk(G, r, reductions=False):
    """The pointwise ops that make ``r`` (readers after what they read) and the leaves they
    start from, for _push_view; _NotLowered where one is not cheap to compute again, or too many.
    reductions: rank-keeping reductions may be among them too (a permute is pushed), where their
    input has ``r``'s full extent along the reduced axes: every leaf is broadcast to r's shape
    before it is viewed, so a reduction over a size-1 axis would sum the broadcast copies."""
    order, seen, leaves = [], set(), []
    stack = [(r.value, False)]
    while stack:
        v, done = stack.pop()
        if done:
            order.append(v)
            continue
        if v.node in seen:
            continue
        seen.add(v.node)
        how = G.made.get(v.node)
        if how is None:
            if v.node not in G.leaf_shape:
                raise _NotLowered("view of a value without a known shape")
            leaves.append(v)
        elif how[0] == "call":
            keeps = how[1] in _PUSH_REDUCTIONS and "axis" in how[3] and (
                how[3].get("keepdim") or how[1] in ("softmax", "log_softmax"))
            if how[1] not in _CHEAP:
                if not (reductions and keeps):
                    raise _NotLowered("view of %s" % how[1])
                _check_reduced_extent(G, how, r.tshape)
            if len(seen) > _PUSH_MAX_NODES:
                raise _NotLowered("view of a value made by more than %d ops" % _PUSH_MAX_NODES)
            stack.append((v, True))
            stack.extend((a, False) for a in how[2] if hasattr(a, "node"))
    return order, leaves


def _contiguous_strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _leading_only(old, new):
    """new differs from old only by leading size-1 dims"""
    return _strip1(old) == _strip1(new) and old[len(old) - len(_strip1(old)):] == new[len(new) - len(_strip1(new)):]


# -- reductions ----------------------------------------------------------------------------------

def _dims(L, node, x, dim):
    r = L.rec(x)
    nd = len(r.tshape)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        dims = list(range(nd))
    elif isinstance(dim, int):
        dims = [dim]
    else:
        dims = list(dim)
    dims = sorted({(d + nd) % nd if nd else 0 for d in dims}) if nd else []
    return dims


def _reduce(L, node, core, x, dim, keepdim, in_dtype=None, **attrs):
    dims = _dims(L, node, x, dim)
    r = L.rec(x)
    v, cshape = L.exact(x)
    if in_dtype is not None:
        v = L.cast(v, in_dtype)
    off = len(cshape) - len(r.tshape)
    axes = tuple(d + off for d in dims)
    if len(r.tshape) == 0:
        axes = None
        out_c = ()
    elif keepdim:
        out_c = tuple(1 if i in axes else s for i, s in enumerate(cshape))
    else:
        out_c = tuple(s for i, s in enumerate(cshape) if i not in axes)
    res = L.g.call(core, v, axis=axes, keepdim=bool(keepdim), **attrs) if axes is not None else \
        L.g.call(core, v, **attrs)
    return L.out(node, res, out_c)


def _reduction(core, float_in=False):
    def handler(L, node):
        x = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if set(node.kwargs) - {"dim", "keepdim", "dtype"}:
            raise _NotLowered("kwargs")
        meta = _meta(node)
        in_dt = None
        if meta.dtype.is_floating_point or float_in:
            in_dt = meta.dtype
        if node.target in (aten.sum.default, aten.mean.default, aten.prod.default,
                           aten.any.default, aten.all.default):
            dim, keepdim = None, False
        if node.target in (aten.prod.dim_int, aten.any.dim, aten.all.dim, aten.argmax.default,
                           aten.argmin.default) and dim is not None and not isinstance(dim, int):
            raise _NotLowered("dim")
        if core in ("argmax", "argmin"):
            in_dt = None
            r = L.rec(x)
            if dim is None and len(r.tshape):
                v, _ = L.exact(x)
                return L.out(node, L.g.call(core, v), ())
        return _reduce(L, node, core, x, dim, keepdim, in_dt)
    return handler


for _name, _core in [("sum", "sum"), ("mean", "mean"), ("prod", "prod"), ("amax", "amax"),
                     ("amin", "amin"), ("argmax", "argmax"), ("argmin", "argmin"), ("any", "any"),
                     ("all", "all"), ("logsumexp", "logsumexp")]:
    _register(getattr(aten, _name))(_reduction(_core))


@_register(aten.var, aten.std)
def _var(L, node):
    if node.target not in (aten.var.correction, aten.std.correction):
        raise _NotLowered("overload")
    x = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    corr = node.kwargs.get("correction", 1)
    keepdim = node.kwargs.get("keepdim", False)
    if corr is None:
        corr = 1
    if float(corr) != int(corr):
        raise _NotLowered("fractional correction")
    core = "var" if node.target.overloadpacket is aten.var else "std"
    meta = _meta(node)
    return _reduce(L, node, core, x, dim, keepdim, meta.dtype if meta.dtype.is_floating_point else None,
                   correction=int(corr))


@_register(aten.var_mean)
def _var_mean(L, node):
    if node.target is not aten.var_mean.correction:
        raise _NotLowered("overload")
    x = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    corr = node.kwargs.get("correction", 1)
    corr = 1 if corr is None else corr
    keepdim = node.kwargs.get("keepdim", False)
    if float(corr) != int(corr) or not _meta(node)[0].dtype.is_floating_point:
        raise _NotLowered("var_mean correction/dtype")
    metas = _meta(node)

    class _One:             # _reduce reads the result's meta from node
        def __init__(self, m):
            self.meta = {"val": m}
    var = _reduce(L, _One(metas[0]), "var", x, dim, keepdim, metas[0].dtype, correction=int(corr))
    mean = _reduce(L, _One(metas[1]), "mean", x, dim, keepdim, metas[1].dtype)
    return (var, mean)


@_register(aten._softmax, aten._log_softmax)
def _softmax(L, node):
    x, dim = node.args[:2]
    meta = _meta(node)
    r = L.rec(x)
    v, cshape = L.exact(x)
    v = L.cast(v, meta.dtype)
    nd = len(r.tshape)
    if nd == 0:
        raise _NotLowered("0-d softmax")
    axis = (dim + nd) % nd + len(cshape) - nd
    core = "softmax" if node.target.overloadpacket is aten._softmax else "log_softmax"
    return L.out(node, L.g.call(core, v, axis=axis), cshape)


# ----------------------------------------------------------------------------------------------
# the compiled callable
# ----------------------------------------------------------------------------------------------

def _drop_dead_random(gm):
    """Removes random ops nothing reads (and what only they read) from gm, as the partitioner's
    dead-code pass means to: outside Dynamo (fastcompile.compile, a deferred async compile) a
    backward graph of aot_autograd's kept a dead native_dropout of the forward's, which a plain
    run of gm (async compile, a fallback) executed, moving the generator on."""
    g = gm.graph
    if any(n.op == "call_function" and not n.users and getattr(n.target, "_nondeterministic_seeded", False)
           for n in g.nodes):
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
    d = t.detach() if t.requires_grad else t     # .numpy() refuses a tensor that requires grad
    if device is not None:            # CPU inputs of a CUDA graph stay as they are: externs read them
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
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
            or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    rets = node.target._schema.returns
    if len(rets) != 1 or str(rets[0].type) != "Tensor" or rets[0].alias_info is None \
            or rets[0].alias_info.is_write:
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
    groups = {}                 # root node -> [(position, chain)]
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
                views[n] = (root, tuple((c.target, tuple(c.args[1:]), dict(c.kwargs)) for c in chain),
                            _as_strided_of(r, outs[n]))
    return views, hidden


def _as_strided_of(root, node):
    """View ``node`` of ``root`` as one as_strided of the root's tensor: (size, stride, storage
    offset from the root's), read from the FX metadata; None where that would not be the same
    view (another dtype, symbolic sizes, an expanded root whose tensor may be laid out otherwise).
    One call instead of the chain's (about 1.3 us against 2.3 us per op: a transformer block's
    saved q, k and v are four ops each)."""
    rm, vm = _meta(root), _meta(node)
    if not isinstance(rm, torch.Tensor) or not isinstance(vm, torch.Tensor) or rm.dtype != vm.dtype \
            or rm.is_complex():
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

    def __init__(self, gm, example_inputs, mode="default", inference=False, free_outputs=frozenset(),
                 cl_inputs=frozenset(), training_forward=False):
        self.gm = gm
        self.mode = mode
        self.inference = inference
        self.training_forward = training_forward and not inference
        self.free_outputs = free_outputs    # output indexes only the backward reads (saved values)
        self.cl_inputs = cl_inputs          # placeholder names the forward hands over channels_last
        self.cl_outputs = frozenset()       # FX names of the outputs returned channels_last
        self.fallback = None
        self.compiled = None
        self.device = None        # the CUDA device the graph runs on; None: CPU
        self.core_ops = self.extern_nodes = self.extern_calls = 0
        self.lowered_targets = []
        self._warming = None      # async compile: the background build (_Warming), once started
        t0 = time.perf_counter()
        _drop_dead_random(gm)
        try:
            self._lower(gm, example_inputs)
        except _GraphFallback as e:
            self.fallback = str(e)
            log.info("fastcompile: graph runs as plain torch: %s", e)
        except Exception as e:          # never fail compilation
            self.fallback = "%s: %s" % (type(e).__name__, e)
            log.warning("fastcompile: graph runs as plain torch: %s", self.fallback, exc_info=True)
        self._fast = None         # the generated call (_make_fast), made by the first call that runs kernels
        self._pending = False     # batch compile: plans rendered, waiting for _load_pending()
        self._batch = None        # batch compile: the _Batch that took them, once one did
        # batch compile renders the plans of NumPy stand-ins: CPU graphs only (NVRTC compiles
        # a CUDA graph's kernels at its first call)
        if self.compiled is not None and self.fallback is None and config.get("batch_compile") \
                and self.device is None:
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
        core (_load_pending): a graph's segments, and the forward and backward graphs, no longer
        compile one after another. Where a layout was mispredicted, the real call builds that
        plan itself, as without the batch."""
        try:
            arrays = [p if k == "const" else _fake_array(self._arg_layouts[p]) for k, p in self.inputs]
            stand_ins = [fn if nodes is None else _fake_results(nodes, self._cl_results)
                         for fn, nodes in self._replays]
            self.compiled._prebuild(tuple(arrays), stand_ins)
        except Exception as e:          # e.g. a layout the metadata did not tell: the call builds it
            log.debug("fastcompile: no batch compile for this graph: %s: %s", type(e).__name__, e)
        # after a failure too: the plans rendered before it still compile in the batch
        self._pending = True
        with _PENDING_LOCK:
            _PENDING.add(self)

    def _lower(self, gm, example_inputs):
        # a backward handed channels_last values runs channels_last whether or not it has a
        # convolution of its own: its externs then get those values in eager's layout where
        # they read strides (_STRIDED_READS), as in a graph with one
        L = _Lowering(gm, example_inputs, channels_last=_wants_channels_last(gm, example_inputs) or (
            bool(self.cl_inputs) and _graph_device(example_inputs) is None), cl_inputs=self.cl_inputs,
            training_forward=self.training_forward)
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
            return ("core", len(core_values) - 1, v.tshape, v.dtype, copy,
                    (shape, _cl_strides(shape)) if free else L.layout(_meta(o), v.value, v.tshape))

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
                self.compiled.autotune = True     # per kernel and launch shape (Compiled.tuning)
        self.plan = plan
        self.n_outputs = len(outs)
        self.single = single
        self.inputs = L.inputs
        self.core_ops = L.core_ops
        self.extern_nodes = L.extern_nodes
        self.extern_calls = L.extern_calls
        self.lowered_targets = [n.target for n in L.lowered]
        self._arg_bf16 = {i for k, i in L.inputs if k == "arg" and isinstance(example_inputs[i], torch.Tensor)
                          and example_inputs[i].dtype == torch.bfloat16} if example_inputs else set()
        self.device = L.device
        self._arrays = [(p if L.device is None else _on_device(p, L.device)) if k == "const" else None
                        for k, p in L.inputs]
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
        if w is None or w.pid != os.getpid():          # the first call (or the first in a fork)
            return self._start_warming(args)
        if not w.done:
            return self._plain(args)
        self._async = False
        if w.error is not None:
            log.warning("fastcompile: the background compile failed (%s: %s); compiling on this call",
                        type(w.error).__name__, w.error)
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
            except BaseException as e:         # reported by the next call, which builds again
                w.error = e
            finally:
                w.ready_s = time.perf_counter() - t0
                w.done = True

        w.thread = threading.Thread(target=build, name="fastcompile-build")
        try:
            w.thread.start()
        except RuntimeError as e:               # no thread to be had: build on the next call
            log.warning("fastcompile: no background compile (%s)", e)
            w.error, w.done = e, True
        self._warming = w
        log.info("fastcompile: %d core ops compiling in the background; plain torch until then",
                 self.core_ops)
        return out

    def _make_fast(self):
        """The graph's call once lowered and built, as one generated straight-line function (args
        -> outputs): the conversions of each input and output are decided once, here, not per item
        and call (per step of a small model's training, that was most of the time the runner
        added to the torch ops it calls). CPU tensors convert inline; parameters, bfloat16 inputs,
        reduce-overhead mode and CUDA graphs go through _convert_input (its cache). It holds what
        it calls, not the runner: a runner stays free of reference cycles."""
        glob = {"compiled": self.compiled, "from_numpy": torch.from_numpy, "BF16": torch.bfloat16,
                "convert": functools.partial(_convert_input, self._cache, self.mode, self.device),
                "_to_torch": _to_torch, "_restride": _restride, "Tensor": torch.Tensor,
                "_cl": _to_channels_last}
        lines, arrays = [], []
        for j, k in enumerate(self._arrays):
            if k is not None:
                glob["k%d" % j] = k
            arrays.append("k%d" % j)
        slow = self.mode == "reduce-overhead" or self.device is not None
        for j, i in self._arg_slots:
            arg = "_cl(args[%d])" % i if i in self._cl_args else "args[%d]" % i     # channels_last on entry
            if slow or i in self._arg_bf16:
                lines.append("a%d = convert(%d, %s)" % (j, i, arg))
            else:           # a plain tensor inline; a Parameter (cached), bfloat16 or a wrong type: _convert
                lines.append("t = %s" % arg)
                lines.append("a%d = (t.detach() if t.requires_grad else t).numpy() "
                             "if type(t) is Tensor and t.dtype is not BF16 else convert(%d, t)" % (j, i))
            arrays[j] = "a%d" % j
        for j, i in self._passed_slots:
            arrays[j] = "args[%d]" % i
        lines.append("res = compiled(%s)" % ", ".join(arrays) if self.compiled is not None else "res = ()")
        outs = {}            # output position -> its expression
        for n, p in enumerate(self.plan):
            if p[0] == "view":
                continue
            if p[0] == "core":
                _, k, tshape, dtype, copy, layout = p
                glob["s%d" % n], glob["d%d" % n], glob["l%d" % n] = tshape, dtype, layout
                lines.append("a = res[%d]" % k)
                same = "a" if self.device is not None else "from_numpy(a)"     # on CUDA: a tensor
                lines.append("o%d = %s if a.shape == s%d else _to_torch(a, s%d, d%d)" % (n, same, n, n, n))
                if layout is not None:
                    glob["w%d" % n] = layout[1]
                    if copy:
                        lines.append("o%d = _restride(o%d, l%d, d%d, True)" % (n, n, n, n))
                    else:
                        lines.append("if o%d.stride() != w%d or o%d.dtype != d%d:\n        o%d = _restride(o%d, l%d, d%d)"
                                     % (n, n, n, n, n, n, n, n))
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
        for n, p in enumerate(self.plan):      # after their roots: views of other outputs, in torch
            if p[0] == "view":
                _, root, chain, strided = p
                t = outs[root]
                if strided is not None:
                    glob["z%d" % n], glob["y%d" % n] = strided[:2]
                    lines.append("o%d = %s.as_strided(z%d, y%d, %s.storage_offset() + %d)"
                                 % (n, t, n, n, t, strided[2]))
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
        self._fast = self._make_fast()         # this call and every later one
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
_PENDING_LOCK = threading.Lock()      # guards _PENDING and each runner's _batch; held briefly


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
            runner._pending = False           # the parent's batch: this call loads its own plans
            return
        mine = batch is None
        if mine:                              # runner is in _PENDING (from _prebuild until a batch takes it)
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


def _layout_of(meta):
    """(NumPy dtype, shape, element strides) of the array the core will be given for a tensor
    described by `meta` (a FakeTensor, or any tensor), or None for a value that is no tensor.
    bfloat16 is widened on entry by .float(), which keeps dense strides and makes others C
    order (preserve_format)."""
    if not isinstance(meta, torch.Tensor):
        return None
    name = _core_dtype(meta.dtype)
    if name is None:
        raise TypeError("no core dtype for %s" % meta.dtype)
    shape = tuple(int(n) for n in meta.shape)
    strides = meta.stride()
    if meta.dtype == torch.bfloat16 and not _prims.is_non_overlapping_and_dense_or_false(meta):
        strides = _prims.make_contiguous_strides_for(shape)
    return np.dtype(name), shape, tuple(int(st) for st in strides)


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
    return _stand_in([_to_core(values[n]) if isinstance(values[n], torch.Tensor) and values[n].is_cuda
                      else _to_numpy(values[n]) for n in nodes])


def fx_to_graph(gm, example_inputs, mode="default", inference=False, free_outputs=frozenset(),
                cl_inputs=frozenset(), training_forward=False):
    """Lower one FX graph (aten ops, or Dynamo's torch-level ops, which mostly become externs) to
    a fastcompile graph. Returns an ``FxGraphRunner``: ``runner(*tensors) -> list``. inference:
    aot_autograd's graph of a call without autograd (no backward will read what it saves): its
    2-d convolutions may run channels_last."""
    return FxGraphRunner(gm, example_inputs, mode=mode, inference=inference, free_outputs=free_outputs,
                         cl_inputs=cl_inputs, training_forward=training_forward)


# ----------------------------------------------------------------------------------------------
# the torch.compile backend
# ----------------------------------------------------------------------------------------------

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
            raise ValueError("fastcompile backend: unknown option %r (options: mode, %s)"
                             % (key, ", ".join(sorted(names))))
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
        return torch._dynamo.disable(_Deferred(gm, delay, later),
                                     reason="fastcompile: a graph whose compile waits for a later call")
    varying = _varying_inputs(gm, example_inputs)
    if varying:
        return _PerSize(gm, varying, example_inputs, mode, record)     # Dynamo disables its frames
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
        log.warning("fastcompile: graph runs as plain torch: %s: %s", type(e).__name__,
                    str(e).split("\n")[0][:300])
        return gm


def _symbolic(v):
    """Whether v is a SymInt/SymFloat/SymBool, or a tensor with a symbolic size or stride."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(v, torch.Tensor):
        try:
            return any(not isinstance(n, int) for n in (*v.shape, *v.stride()))
        except RuntimeError:            # a sparse tensor has no strides
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
        self.compiled = {}              # key -> the compiled graph (or gm, for plain torch)
        self.lock = threading.Lock()
        # key(args): the set of sizes a call brings, each varying tensor's sizes and strides and
        # each other varying input's value (a size); generated, as it runs at every call.
        # Dynamo's guards keep each input's kind (and dtype, device) what the examples show.
        parts = []
        for i in varying:
            e = example_inputs[i]
            if isinstance(e, torch.Tensor):
                parts.append("a[%d].shape, a[%d].stride()" % (i, i) if e.layout == torch.strided
                             else "a[%d].shape" % i)
            else:
                parts.append("a[%d]" % i)
        self.key = eval("lambda a: (%s,)" % ", ".join(parts))       # noqa: S307 (our own text)

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
                log.warning("fastcompile: a graph with symbolic sizes was compiled for %d sets of sizes, the "
                            "limit (cache_size_limit); new sizes run it as plain torch", limit)
            return self.gm
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        try:
            gm = _bind_inputs(self.gm, {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)})
            fn = _compile_later(gm, fake_mode, [fake_mode.from_tensor(args[i], static_shapes=True) for i in tensors],
                                self.mode, self.record)
            if len(tensors) == len(args):
                return fn
            pick = eval("lambda fn: lambda *a: fn(%s)" % "".join("a[%d], " % i for i in tensors))  # noqa: S307
            return pick(fn)
        except Exception as e:          # never fail a call: this size runs as plain torch
            if not config.get("suppress_errors"):
                raise
            log.warning("fastcompile: a graph with symbolic sizes runs as plain torch for sizes %s: %s: %s",
                        self.key(args), type(e).__name__, str(e).split("\n")[0][:300])
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
    rv, out_node = graph.graph_copy(gm.graph, {placeholders[i]: v for i, v in values.items()},
                                    return_output_node=True)
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
        self.calls = calls            # plain calls left
        self.compile_fn = compile_fn
        self.fn = None                # the compiled graph, once call N + 1 made it
        self.lock = threading.Lock()
        pending.add(self)

    @property
    def ready(self):
        """Lowered (its runners, registered themselves, say when their kernels are built)."""
        return self.fn is not None

    def wait(self, timeout=None):
        return self.ready               # nothing to wait for: the lowering waits for a call

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
                    except Exception as e:      # never fail a call: the graph stays plain torch
                        log.warning("fastcompile: graph runs as plain torch: %s: %s", type(e).__name__, e,
                                    exc_info=True)
                        fn = self.gm
                    self.fn = fn
                    self.compile_fn = None      # and the fake inputs it held
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

    n_user = len(torch.utils._pytree.arg_tree_leaves(*next(
        n for n in reversed(gm.graph.nodes) if n.op == "output").args))

    handed = []         # FX names of the values the forward graph hands its backward channels_last

    def compile_graph(fx_gm, inputs, inference=False, what="forward"):
        free = _saved_outputs(fx_gm, n_user) if what == "forward" else frozenset()
        runner = fx_to_graph(fx_gm, inputs, mode=mode, inference=inference, free_outputs=free,
                             cl_inputs=frozenset(handed) if what == "backward" else frozenset(),
                             training_forward=what == "forward" and not inference)
        if what == "forward":
            handed[:] = runner.cl_outputs
        if runner.compiled is not None:
            runner.compiled.label = _graph_label(fx_gm, what)
        if record is not None:
            record.append(runner)
        return make_boxed_func(runner)

    compile_fn = aot_autograd(fw_compiler=compile_graph,
                              bw_compiler=functools.partial(compile_graph, what="backward"),
                              inference_compiler=functools.partial(compile_graph, inference=True,
                                                                   what="inference"),
                              decompositions=decompositions)
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
        except Exception as e:      # with the flag, aot_autograd raises what its lazy path would defer
            log.warning("fastcompile: compiling the backward graph ahead failed (%s: %s); it compiles at "
                        "the first backward call instead", type(e).__name__, e)
            if record is not None:
                del record[n_record:]           # the runners of the attempt that failed
    return compile_fn(gm, example_inputs)
