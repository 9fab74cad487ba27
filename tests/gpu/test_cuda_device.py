"""CUDA with a device (tinygrad's test/backend): skipped, with the reason, without one.

The device's arch is detected and the kernels compile for it (cubin, or PTX
when the GPU is newer than NVRTC); a torch CUDA tensor fed to a compiled graph
runs the plan on the GPU. test_cuda_matrix and test_cuda_torch cover the rest.
"""

import cudahelp
from fastcompile import _C
from fastcompile.graph import Graph

INFO = cudahelp.INFO
torch = cudahelp.torch
pytestmark = cudahelp.SKIP


def gelu_graph():
    g = Graph()
    x = g.input("float32", 1)
    g.output(g.call("gelu", x))
    return g.compile()


def test_device_arch_compiles():
    major, minor = torch.cuda.get_device_capability(0)
    assert INFO["device_arch"] == major * 10 + minor
    (k,) = gelu_graph()._cuda_render(("float32", 1))
    r = _C._cuda_compile(k["source"], None)  # None: the device's arch
    assert r["arch"].endswith(str(INFO["device_arch"])) or r["kind"] == "ptx"


def test_gelu_on_device_matches_torch():
    x = torch.randn(1 << 20, device="cuda")
    f = gelu_graph()
    (y,) = f(x)
    assert y.is_cuda and y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y, torch.nn.functional.gelu(x))
    (k,) = f.kernels
    assert k.so_path is None and len(k.key) == 64 and "__global__" in k.source
    assert open(k.path).read() == k.source
