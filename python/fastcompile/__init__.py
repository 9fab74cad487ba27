"""fastcompile: a compile backend for Python numerical code.

The C core takes a graph of array ops (``fastcompile.graph``), fuses it into a
few kernels, writes C with OpenMP, compiles it once, caches it in memory and on
disk, and runs it at memory speed.
"""

__version__ = "0.1.0"

import logging as _logging

from . import config
from . import _C
from . import graph

_C._configure(dict(config.resolved(), version=__version__))

if config.get("debug") >= 1:
    _log = _logging.getLogger("fastcompile")
    _log.setLevel(_logging.DEBUG)
    if not _log.handlers:
        _h = _logging.StreamHandler()
        _h.setFormatter(_logging.Formatter("[fastcompile] %(message)s"))
        _log.addHandler(_h)


def cache_clear(disk: bool = True) -> None:
    """Forget every loaded kernel; with ``disk=True`` also empty the disk cache."""
    _C.cache_clear(disk=disk)


def stats() -> "dict[str, object]":
    """Counters: ``compiles`` (kernels compiled), ``compiler_runs`` (compiler processes; one run
    compiles several kernels when a batch has more than there are cores), ``compile_batches``
    (batches that compiled something: one batch's kernels compile side by side), ``disk_hits``,
    ``memory_hits``; the pool's ``pool_hits``, ``pool_misses``, ``pool_cached_bytes``,
    ``pool_cap_bytes``; ``views_made`` (view externs made in C) and ``views_by_function``
    (view externs whose argument came in another layout than traced: their function ran)."""
    return _C.stats()


def cuda_info() -> "dict[str, object]":
    """CUDA status without touching the CPU path: whether NVRTC and the driver
    (libcuda.so.1) were found, their paths and versions, NVRTC's archs, and
    the device count, or in ``why_no_device`` why there is none."""
    return _C.cuda_info()


def pending_compiles(wait: bool = False, timeout: "float | None" = None) -> int:
    """Async compile (``config.async_compile``): how many graphs do not run their kernels yet,
    because their lowering waits for a later call (``async_delay_calls``) or their kernels are
    building in a background thread. ``wait=True`` first waits (at most ``timeout`` s) for the
    builds already started."""
    from . import pending

    if wait:
        pending.wait(timeout)
    return len(pending.pending())


from .api import compile, reset  # noqa: E402  (after _configure: tracing compiles graphs)
from .explain import explain  # noqa: E402
from .profiler import profile  # noqa: E402

__all__ = [
    "compile",
    "explain",
    "reset",
    "graph",
    "config",
    "cache_clear",
    "stats",
    "cuda_info",
    "pending_compiles",
    "profile",
]
