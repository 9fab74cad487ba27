"""Every fastcompile knob, in one place: environment name, type, default, one line.

Values are read from the environment at import. Change them at run time with
``fastcompile.config.set(name=value)``; the C core re-reads them then.
"""

import contextlib
import os
import shutil
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Knob:
    name: str  # attribute name: fastcompile.config.<name>
    env: str  # environment variable
    type: Callable  # parser for the environment string
    default: Any
    doc: str


def _bool(s):
    return str(s).strip().lower() not in ("", "0", "false", "no", "off")


def _default_cache_dir():
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "fastcompile")
    home = os.path.expanduser("~")
    if home and home != "~" and os.path.isdir(home):
        return os.path.join(home, ".cache", "fastcompile")
    return os.path.join("/tmp", "fastcompile-uid%d" % os.getuid())


KNOBS = [
    Knob(
        "cache_dir",
        "FASTCOMPILE_CACHE_DIR",
        str,
        None,
        "kernel cache folder; default $XDG_CACHE_HOME/fastcompile, else ~/.cache/fastcompile",
    ),
    Knob("cc", "FASTCOMPILE_CC", str, None, "C compiler for CPU kernels; default $CC, else cc"),
    Knob("cflags", "FASTCOMPILE_CFLAGS", str, "", "extra flags appended to the kernel compile line"),
    Knob("num_threads", "FASTCOMPILE_NUM_THREADS", int, 0, "OpenMP threads per kernel; 0 = all cores"),
    Knob(
        "serial_below",
        "FASTCOMPILE_SERIAL_BELOW",
        int,
        32768,
        "kernels over fewer elements than this run on one thread",
    ),
    Knob(
        "pool_mb",
        "FASTCOMPILE_POOL_MB",
        int,
        256,
        "freed large outputs kept mapped for reuse (MB); 0 turns the pool off",
    ),
    Knob(
        "debug",
        "FASTCOMPILE_DEBUG",
        int,
        0,
        "log ladder: 1 compiles and cache misses, 2 graphs after fusion, 3 generated source",
    ),
    Knob("dump_dir", "FASTCOMPILE_DUMP_DIR", str, None, "write every stage (graph, fused, .c) here"),
    Knob(
        "pch",
        "FASTCOMPILE_PCH",
        _bool,
        True,
        "with GCC, parse the kernel header once per compiler and flags (a precompiled header in the cache)",
    ),
    Knob(
        "compile_bundles",
        "FASTCOMPILE_COMPILE_BUNDLES",
        _bool,
        True,
        "a batch with more kernels to compile than cores compiles them several to a compiler run "
        "(one translation unit per core), saving each run's fixed cost; 0: one run per kernel",
    ),
    Knob("always_compile", "FASTCOMPILE_ALWAYS_COMPILE", _bool, False, "ignore the disk cache (still writes it)"),
    Knob("verify", "FASTCOMPILE_VERIFY", _bool, False, "run fc_graph_verify after every pass (tests turn it on)"),
    Knob(
        "async_compile",
        "FASTCOMPILE_ASYNC_COMPILE",
        _bool,
        False,
        "torch backend: a graph's first calls run as plain torch while its kernels compile in a "
        "background thread; the kernels take over once built. fastcompile.compile: a traced frame's "
        "first call returns the values its trace computed eagerly, the kernels compile in a background "
        "thread, the next call waits for them",
    ),
    Knob(
        "async_delay_calls",
        "FASTCOMPILE_ASYNC_DELAY_CALLS",
        int,
        1,
        "async compile: a graph's first N calls run Dynamo's graph as plain torch; call N + 1 lowers it "
        "(aot_autograd, then ours) and starts the background compile. The first step (a training "
        "step's forward and backward) then pays neither aot_autograd nor compilers sharing its cores; "
        "0: lowered when Dynamo hands it over, built from its first call",
    ),
    Knob(
        "batch_compile",
        "FASTCOMPILE_BATCH_COMPILE",
        _bool,
        True,
        "torch backend: when a graph is compiled, render every kernel its first call will need (from "
        "the FX metadata), and compile all pending kernels of all graphs (forward and backward) in one "
        "batch on every core at the first call; 0: each segment compiles when a call first reaches it",
    ),
    Knob(
        "cuda_fmad",
        "FASTCOMPILE_CUDA_FMAD",
        _bool,
        False,
        "CUDA kernels contract a * b + c into one fma (nvcc's default, as torch's kernels): faster "
        "transcendentals, arithmetic no longer NumPy's bit for bit; 0: exact, as the CPU kernels",
    ),
    Knob(
        "cuda_max_grid",
        "FASTCOMPILE_CUDA_MAX_GRID",
        int,
        0,
        "CUDA launches use at most this many blocks; 0 (the default): as many as the data needs, one "
        "trip of the grid-stride loop per thread (a block per row for reductions); a smaller grid "
        "makes each thread loop over the data (the tests' way to cover those loops)",
    ),
    Knob(
        "nvrtc",
        "FASTCOMPILE_NVRTC",
        str,
        None,
        "NVRTC library to load (a file or a folder), read at the first CUDA use; default: the "
        "nvidia-cuda-nvrtc wheel, $CUDA_HOME/lib64, /usr/local/cuda/lib64, the loader's path",
    ),
    Knob(
        "libcuda",
        "FASTCOMPILE_LIBCUDA",
        str,
        None,
        "CUDA driver library to load, read at the first CUDA use; default libcuda.so.1",
    ),
    Knob(
        "autotune",
        "FASTCOMPILE_AUTOTUNE",
        _bool,
        False,
        "time a few thread counts and column-block widths per kernel and launch shape on first use; "
        "keep the fastest (torch.compile mode='max-autotune' turns it on for its graphs)",
    ),
    Knob(
        "cache_size_limit",
        "FASTCOMPILE_CACHE_SIZE_LIMIT",
        int,
        8,
        "compiled variants kept per function (code object); past it the function runs uncompiled, with a warning",
    ),
    Knob(
        "specialize_float",
        "FASTCOMPILE_SPECIALIZE_FLOAT",
        _bool,
        False,
        "fastcompile.compile: a Python float the frame reads (an argument, global or attribute) is "
        "baked into the graph and guarded by value, so a new value recompiles; 0 (the default, as "
        "Dynamo's): the graph reads it at each call, and only a use of its value in Python (a "
        "branch, a shape) bakes it in",
    ),
    Knob(
        "suppress_errors",
        "FASTCOMPILE_SUPPRESS_ERRORS",
        _bool,
        True,
        "an internal tracer/compiler error runs the frame as plain Python with a warning (0: raise it)",
    ),
]

_values = {}


def _load():
    for k in KNOBS:
        raw = os.environ.get(k.env)
        _values[k.name] = k.type(raw) if raw not in (None, "") else k.default


_load()


_local = threading.local()  # .values: this thread's overrides (overriding())


def get(name: str) -> Any:
    over = getattr(_local, "values", None)
    if over and name in over:
        return over[name]
    return _values[name]


@contextlib.contextmanager
def overriding(**kwargs: Any) -> Iterator[None]:
    """Knobs read from Python (get()) take these values in this thread only, inside the block;
    knobs the C core reads cannot be overridden (set() changes them for every thread)."""
    names = {k.name for k in KNOBS}
    for key in kwargs:
        if key not in names:
            raise AttributeError("fastcompile.config has no knob %r" % key)
    saved = getattr(_local, "values", None)
    _local.values = dict(saved or {}, **kwargs)
    try:
        yield
    finally:
        _local.values = saved


def resolved() -> dict[str, Any]:
    """The values the C core uses, with defaults resolved (a plain dict)."""
    v = dict(_values)
    v["cache_dir"] = v["cache_dir"] or _default_cache_dir()
    for k in ("nvrtc", "libcuda"):  # os.PathLike, as cache_dir and cc take
        v[k] = os.fspath(v[k]) if v[k] is not None else None
    v["cc"] = shutil.which(v["cc"] or os.environ.get("CC") or "cc") or (v["cc"] or "cc")
    v["include_dir"] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")
    v["python"] = "%d.%d" % sys.version_info[:2]
    if not v["num_threads"]:
        omp = os.environ.get("OMP_NUM_THREADS", "")
        v["num_threads"] = int(omp) if omp.isdigit() and int(omp) > 0 else len(os.sched_getaffinity(0))
    return v


def set(**kwargs: Any) -> None:
    """Change knobs at run time, e.g. ``fastcompile.config.set(num_threads=1)``. All or nothing:
    a value the core refuses (TypeError, ValueError) leaves every knob as it was."""
    names = {k.name for k in KNOBS}
    for key in kwargs:
        if key not in names:
            raise AttributeError("fastcompile.config has no knob %r (knobs: %s)" % (key, ", ".join(sorted(names))))
    from . import _C, __version__

    old = dict(_values)
    _values.update(kwargs)
    try:
        _C._configure(dict(resolved(), version=__version__))
    except BaseException:
        _values.clear()
        _values.update(old)
        _C._configure(dict(resolved(), version=__version__))  # the core may have taken some values
        raise


def __getattr__(name):
    if name in _values:
        return _values[name]
    raise AttributeError(name)


def describe() -> str:
    """One line per knob: env name, current value, doc."""
    return "\n".join("%-28s %-12r %s" % (k.env, _values[k.name], k.doc) for k in KNOBS)
