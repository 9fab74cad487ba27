"""The torch backend's values: torch dtypes in the core, FX values, torch <-> core arrays, layouts.

In: FX node metadata and torch tensors. Out: core dtype names, ``_Rec`` records, the arrays the
core reads (NumPy arrays; tensors on CUDA), torch tensors of eager's shape, dtype and strides.
"""

import numpy as np
import torch
import torch._prims_common as _prims

from ..._common import torch_numpy_dtypes


_CORE_DTYPE = torch_numpy_dtypes(torch)
_CORE_DTYPE[torch.bfloat16] = "float32"  # carried as float32 inside the core (see the package doc)


def _core_dtype(dt):
    return _CORE_DTYPE.get(dt)


class _GraphFallback(Exception):
    """The whole graph runs as plain torch (the message says why)."""


class _NotLowered(Exception):
    """This node is not a core op after all: run it as an extern."""


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
        self.members = []  # FX nodes, in graph order
        self.inputs = []  # FX nodes from outside (already lowered to _Rec)
        self.closed = False


def _to_torch(arr, tshape, dtype):
    """A NumPy array (or, on CUDA, a tensor) from the core -> a torch tensor of the torch shape
    and dtype (views)."""
    if isinstance(arr, torch.Tensor):
        t = arr
    else:
        if arr.ndim != len(tshape):  # leading size-1 dims: reshaped here, in NumPy, cheaper
            arr = arr.reshape(
                arr.shape[arr.ndim - len(tshape) :]
                if arr.ndim > len(tshape)
                else (1,) * (len(tshape) - arr.ndim) + arr.shape
            )
        if not arr.flags.writeable:
            arr = arr.copy()
        t = torch.from_numpy(arr)
    if t.dim() != len(tshape):
        t = t.reshape(
            t.shape[t.dim() - len(tshape) :]
            if t.dim() > len(tshape)
            else (1,) * (len(tshape) - t.dim()) + tuple(t.shape)
        )
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
    of its inputs (channels_last: plan.c's perm), which the lowering cannot predict, so eager's
    layout is given even where it matches ``strides``. Either way the
    generated code compares strides at each call and copies only where they differ
    (``_restride``). An expanded tensor reads the same in any layout: None."""
    if strides is None or not isinstance(meta, torch.Tensor):
        return None
    shape, stride = tuple(meta.shape), tuple(meta.stride())
    if any(st == 0 for n, st in zip(shape, stride) if n > 1):
        return None  # an expanded tensor: any layout reads the same
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
    except Exception:  # symbolic sizes: not lowered anyway
        return False


def _same_strides(have, layout):
    """Whether strides ``have`` lay a tensor of layout[0]'s shape out as layout[1] does (the
    strides of size-1 dims do not matter)."""
    return all(a == b for n, a, b in zip(layout[0], have, layout[1]) if n != 1)


def _to_core(t):
    """On CUDA: a tensor as the core reads it (bfloat16 is carried as float32, as on the CPU)."""
    if not isinstance(t, torch.Tensor):
        return t  # a None or scalar slot nobody reads
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
        return np.empty((0,), np.float32)  # a None or scalar slot nobody reads
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t.numpy()


def _meta_strides(meta):
    """The element strides of an FX value's example tensor, or None where it has none."""
    try:
        return tuple(int(s) for s in meta.stride())
    except Exception:  # no strides (sparse, opaque): the stand-in broadcasts
        return None


def _contiguous_strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


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
