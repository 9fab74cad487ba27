"""Helpers for tests/gpu: the skip conditions, and NumPy <-> CUDA tensor conversion that keeps
each array's layout (strides, broadcast dims), so the CPU suite's layout matrix runs on CUDA."""

import numpy as np
import pytest

import fastcompile
from fastcompile.graph import Graph

INFO = fastcompile.cuda_info()
torch = pytest.importorskip("torch")
SKIP = [
    pytest.mark.skipif(INFO["device_count"] == 0, reason="no CUDA device: %s" % INFO["why_no_device"]),
    pytest.mark.skipif(not INFO["nvrtc"], reason="NVRTC not found: %s" % INFO["nvrtc_error"]),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA"),
]


def to_cuda(a):
    """A NumPy array as a CUDA tensor with the same element strides (zero strides stay zero).
    torch has no negative strides: such arrays arrive C-contiguous (same values)."""
    if not isinstance(a, np.ndarray) or not a.dtype.isnative or a.dtype.kind not in "biuf":
        return a  # what torch cannot hold goes in as it is (the graph raises)
    if any(s < 0 or s % a.itemsize for s in a.strides):
        a = np.ascontiguousarray(a)
    strides = tuple(s // a.itemsize for s in a.strides)
    if a.size == 0:
        return torch.from_numpy(np.ascontiguousarray(a)).cuda()
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides))
    flat = np.lib.stride_tricks.as_strided(a, (span,), (a.itemsize,))  # the memory a spans
    base = torch.from_numpy(np.array(flat)).cuda()
    return torch.as_strided(base, a.shape, strides)


def to_numpy(t):
    if isinstance(t, torch.Tensor):
        assert t.is_cuda, "a CUDA graph returned a %s tensor" % t.device
        return t.cpu().numpy()
    return t


class OnCuda:
    """A compiled graph called with NumPy arrays, run on CUDA: arrays in and out as the CPU
    suite expects them, the kernels on the GPU."""

    def __init__(self, compiled):
        self.compiled = compiled

    def __call__(self, *arrays):
        outs = self.compiled(*[to_cuda(a) for a in arrays])
        return tuple(to_numpy(o) for o in outs)

    def __getattr__(self, name):
        return getattr(self.compiled, name)


class CudaGraph:
    """fastcompile.graph.Graph whose compile() gives an OnCuda."""

    def __init__(self):
        self._g = Graph()

    def __getattr__(self, name):
        return getattr(self._g, name)

    def compile(self):
        return OnCuda(self._g.compile())


def run_graph(build, arrays):
    """conftest.run_graph on CUDA."""
    g = CudaGraph()
    ins = [g.input(a.dtype.name, a.ndim) for a in arrays]
    g.output(*build(g, *ins))
    return g.compile()(*arrays)
