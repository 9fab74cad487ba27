"""channels_last convolutions on the CPU, and copies between the two memory orders.

In: FX convolution nodes, rank-4/5 tensors. Out: whether a graph runs its convolutions
channels_last, weights and inputs converted (once where they can be), and relayouts by the core's
batched transpose (_C._relayout) where torch's copy_ is slower.
"""

import collections
import threading
import weakref

import numpy as np
import torch

from ... import _C
from .values import _contiguous_strides, _graph_device, _meta, _same_strides

aten = torch.ops.aten


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
    in memory: (N, *S, C)), or back; else None. torch's copy_ between the two orders is slower
    than the transpose."""
    if not _relayout_ok(t):
        return None
    shape = t.shape
    if _same_strides(strides, (shape, _cl_strides(shape))) and t.is_contiguous():
        return _relayout(t, True)
    if t.is_contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d) and _same_strides(
        strides, (shape, _contiguous_strides(shape))
    ):
        return _relayout(t, False)
    return None


# dtypes _C._relayout copies, as the NumPy type it fills (bits as they are: bfloat16 as uint16;
# not complex: a conjugate view's bits are not its values)
_RELAYOUT_TYPES = {
    dt: np.dtype(name).num
    for dt, name in (
        (torch.float32, "float32"),
        (torch.float64, "float64"),
        (torch.float16, "float16"),
        (torch.bfloat16, "uint16"),
        (torch.bool, "bool"),
        (torch.uint8, "uint8"),
        (torch.int8, "int8"),
        (torch.int16, "int16"),
        (torch.int32, "int32"),
        (torch.int64, "int64"),
    )
}
# fewer elements than this: torch's copy (its call costs less than ours)
_RELAYOUT_MIN = 16384


def _relayout_ok(t):
    """Whether _C._relayout may copy t: a plain dense CPU tensor of rank 4 or 5 (the
    channels_last ranks) of a dtype it copies, with more than one channel and more than one
    position, _RELAYOUT_MIN elements or more, and no autograd history to record."""
    return (
        (type(t) is torch.Tensor or type(t) is torch.nn.Parameter)
        and t.dtype in _RELAYOUT_TYPES
        and t.device.type == "cpu"
        and 4 <= t.dim() <= 5
        and t.layout is torch.strided
        and t.shape[1] > 1
        and t.numel() >= _RELAYOUT_MIN
        and t.numel() > t.shape[0] * t.shape[1]
        and not (t.requires_grad and torch.is_grad_enabled())
    )


def _relayout(t, to_cl):
    """t (_relayout_ok, dense: C order if to_cl, else C last) copied into the other order by
    _C._relayout, in memory from the core's pool (kept mapped: a fresh torch.empty would pay its
    page faults at every call); one torch call on the result, not four."""
    out = torch.from_numpy(_C._relayout(t.data_ptr(), t.shape, _RELAYOUT_TYPES[t.dtype], to_cl))
    return out if out.dtype is t.dtype else out.view(t.dtype)


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
    return (
        isinstance(meta, torch.Tensor)
        and meta.dim() == 4
        and meta.is_contiguous()
        and any((_cl_conv(u) and u.args[0] is node) or (_cl_conv_bwd(u) and node in u.args[:2]) for u in node.users)
    )


def _cl_dense(meta):
    """FX value ``meta`` is a rank-4 tensor, dense and not expanded: one a channels_last graph
    may hand to its backward channels_last (an activation, a mask, a max pool's indices)."""
    return (
        isinstance(meta, torch.Tensor)
        and meta.dim() == 4
        and meta.layout == torch.strided
        and meta.is_contiguous()
        and meta.numel() > 0
    )


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
    optimizer steps, not once in each. Entries go with their weight (a weak reference)."""

    def __init__(self):
        self.entries = {}  # id(w) -> (weakref to w, w._version, w.data_ptr(), converted)
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
        if c is not t:  # a copy (a channels_last input is passed as it is)
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
    choice for its convolutions: oneDNN's channels_last kernels are faster)."""
    if _graph_device(example_inputs) is not None:
        return False
    for n in gm.graph.nodes:
        if _cl_conv(n) and not _meta(n.args[0]).is_contiguous(memory_format=torch.channels_last):
            return True
        if _cl_conv_bwd(n) and not _meta(n.args[1]).is_contiguous(memory_format=torch.channels_last):
            return True
    return False
