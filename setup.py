"""Build fastcompile._C (C11, NumPy C API). No CUDA toolkit needed.

Build switches (environment):
  FASTCOMPILE_DEBUG_BUILD=1  -O0 -g, asserts on
  FASTCOMPILE_SANITIZE=1     ASan + UBSan (run with LD_PRELOAD=$(gcc -print-file-name=libasan.so))
  FASTCOMPILE_WERROR=1       warnings are errors (CI)
"""

import glob
import os

import numpy
from setuptools import Extension, setup

WARN = [
    "-Wall",
    "-Wextra",
    "-Wshadow",
    "-Wmissing-prototypes",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
    "-Wno-cast-function-type",
    "-Wno-format-truncation",
]
# -fopenmp-simd: "omp simd" loops (runtime/relayout.c), no OpenMP runtime linked: libgomp
# would then load at import, before the torch backend sets OMP_WAIT_POLICY (relayout.c
# finds it at run time instead)
cflags = ["-std=c11", "-fvisibility=hidden", "-D_GNU_SOURCE", "-fopenmp-simd"] + WARN
ldflags = []
undef = []
if os.environ.get("FASTCOMPILE_DEBUG_BUILD") == "1":
    cflags += ["-O0", "-g3"]
    undef += ["NDEBUG"]
else:
    cflags += ["-O2"]
if os.environ.get("FASTCOMPILE_SANITIZE") == "1":
    san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
    cflags += san + ["-g"]
    ldflags += san
    undef += ["NDEBUG"]
if os.environ.get("FASTCOMPILE_WERROR") == "1":
    cflags += ["-Werror"]

sources = sorted(glob.glob("csrc/*.c") + glob.glob("csrc/*/*.c"))

ext = Extension(
    "fastcompile._C",
    sources=sources,
    include_dirs=[numpy.get_include(), "csrc"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_22_API_VERSION")],
    undef_macros=undef,
    extra_compile_args=cflags,
    extra_link_args=ldflags,
    libraries=["dl"],
    depends=sorted(
        glob.glob("csrc/**/*.h", recursive=True)
        + glob.glob("csrc/**/*.def", recursive=True)
        + glob.glob("python/fastcompile/include/*.h")
    ),
)

setup(ext_modules=[ext])
