"""The CUDA execution path without a GPU: tests/cuda_emu/run_emulated.py in a child process,
against a fake NVRTC and driver (tests/cuda_emu/emu_cuda.c, built here with gcc): g++ builds
each gen_cuda kernel for the CPU (fc_emu.h maps CUDA's builtins), and a launch runs every CUDA
thread of a block as a fiber, with real barriers for __syncthreads and warp shuffles.

It runs the runtime's own code end to end (devarray.c's tensor bridge, plan keys per device,
fc_cu_launch packing, 32-bit index choice, the launch's grid) and gen_cuda's kernels
(unrolled grid-stride loops, block reductions, the row cache), each result against NumPy.
tests/gpu/ does the same on a real device, with NVRTC and the driver."""

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the emulated CUDA tensors are torch tensors")
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_emu")


@pytest.mark.skipif(
    shutil.which("g++") is None or shutil.which("gcc") is None,
    reason="the emulation builds kernels with g++ (not installed)",
)
def test_cuda_path_emulated(tmp_path):
    lib = str(tmp_path / "emu_cuda.so")
    subprocess.run(
        ["gcc", "-O1", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", lib, os.path.join(HERE, "emu_cuda.c")],
        check=True,
    )
    work = tmp_path / "kernels"
    work.mkdir()
    env = dict(
        os.environ,
        FASTCOMPILE_LIBCUDA=lib,
        FASTCOMPILE_NVRTC=lib,
        FC_EMU_DIR=str(work),
        FC_EMU_SHIM=HERE,
        FASTCOMPILE_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
    )
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "run_emulated.py")], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0 and "EMULATED OK 19" in r.stdout, r.stdout[-3000:] + r.stderr[-6000:]
