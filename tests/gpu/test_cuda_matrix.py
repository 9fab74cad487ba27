"""The CPU suite's op x dtype x layout matrix, run again with every kernel on CUDA.

test_ops (every op of the table, every dtype, the hard values, the layout matrix: contiguous,
strided, transposed, broadcast, 0-d, empty), test_pointwise_layouts and test_reduce_layouts are
loaded here as fresh copies (their memoized batches are their own) with ``Graph`` and
``run_graph`` replaced by CUDA versions (cudahelp): the same graphs, the same NumPy references
and tolerances (conftest.TOLERANCES), the inputs as CUDA tensors with the same strides.

Left out, by rule rather than by name: tests that read a kernel's C source (``.source``: the
CPU renderer's text, tests/test_cuda_codegen.py has CUDA's), that run a child interpreter
(``run_isolated``: no torch there) or that time/tune CPU launches (``tuning``); and by name,
with the reason, the few whose subject is the CPU path's own behaviour (CPU_ONLY)."""

import importlib.util
import inspect
import os


import cudahelp

pytestmark = cudahelp.SKIP
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("test_ops", "test_pointwise_layouts", "test_reduce_layouts")
LEFT_OUT = ("source", "run_isolated(", "tuning", "autotune")
CPU_ONLY = {
    "test_pool_serves_only_blocks_it_keeps": "the CPU allocation pool (CUDA outputs come from torch's allocator)",
    "test_output_too_big_raises_numpys_error": "NumPy's allocation error (torch raises its own OutOfMemoryError)",
    "test_error_int_pow_negative_exponent": "CUDA kernels do not raise: an integer to a negative integer power "
    "gives what the kernel computes, as torch on CUDA (README, CUDA)",
}


def _load(name):
    spec = importlib.util.spec_from_file_location("cuda_copy_" + name, os.path.join(TESTS, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.Graph = cudahelp.CudaGraph
    mod.run_graph = cudahelp.run_graph
    return mod


def _is_fixture(obj):
    return (
        hasattr(obj, "_pytestfixturefunction")
        or hasattr(obj, "_fixture_function_marker")
        or "Fixture" in type(obj).__name__
    )


for _name in MODULES:
    _mod = _load(_name)
    for _k, _fn in list(vars(_mod).items()):
        if _is_fixture(_fn) and not _k.startswith("test_"):
            globals()[_k] = _fn  # the module's own fixtures (add_f32, ...)
            continue
        if not (_k.startswith("test_") and inspect.isfunction(_fn)):
            continue
        _src = inspect.getsource(_fn)
        if any(w in _src for w in LEFT_OUT) or _k in CPU_ONLY:
            continue
        globals()["test_%s__%s" % (_name[len("test_") :], _k[len("test_") :])] = _fn
