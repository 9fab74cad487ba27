"""Frontend entry points: compile(), reset(), and the callback the C hook calls on a cache miss.

In: a function or an nn.Module. Out: a callable that runs it with the PEP 523 hook on; each new
frame is traced (python/fastcompile/trace) into graphs and guards, and the C hook keeps the result
as a cache entry on the code object.
"""

import functools
import os
import sys
import sysconfig
import time
import typing
import warnings
from typing import Any, Callable, Optional, TypeVar

from . import _C, config
from . import trace as _trace


_F = TypeVar("_F", bound=Callable[..., Any])


class FastcompileWarning(UserWarning):
    """Something was not compiled and runs as plain Python (the result is still right)."""


# ----------------------------------------------------------------------------------------------
# which code the hook leaves alone: the standard library, NumPy, torch and ourselves
# ----------------------------------------------------------------------------------------------

_ROOT_MODULES = ("numpy", "torch", "pytest", "_pytest", "pluggy", "bytecode")


def _skip_roots():
    """The folders the hook skips; rebuilt only when one of _ROOT_MODULES gets imported."""
    return _skip_roots_for(tuple(getattr(sys.modules.get(m), "__file__", None) for m in _ROOT_MODULES))


@functools.lru_cache(maxsize=16)
def _skip_roots_for(files):
    roots = {os.path.dirname(os.path.abspath(__file__))}
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.abspath(path))
    for f in files:
        if f:
            roots.add(os.path.dirname(os.path.abspath(f)))
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in roots))


@functools.lru_cache(maxsize=4096)
def _skip_file(filename, roots):
    if not filename or filename.startswith("<"):  # <frozen ...>, <string> (exec'd by libraries)
        return True
    path = os.path.abspath(filename)
    return path.startswith(roots)


def skip_code(code):
    """True for code the frontend never traces on its own (it may still be inlined)."""
    return _skip_file(code.co_filename, _skip_roots())


# ----------------------------------------------------------------------------------------------
# the callback
# ----------------------------------------------------------------------------------------------


def _where(code, lineno=None):
    return "%s (%s:%d)" % (
        code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
        code.co_filename,
        lineno or code.co_firstlineno,
    )


class ConvertFrame:
    """What the C hook calls on a cache miss: callback(frame, cache_size) -> CacheEntry or a sentinel.

    One per compile() call (it carries fullgraph) or per explain() run (it carries a recorder).
    """

    def __init__(self, fullgraph=False, recorder=None, force=()):
        self.fullgraph = fullgraph
        self.recorder = recorder
        self.force = frozenset(force)  # code traced even where skip_code says no (a module's forward)

    def __call__(self, frame, cache_size):
        code = frame.f_code
        if skip_code(code) and code not in self.force:
            return _C.SKIP
        limit = config.get("cache_size_limit")
        reason = None
        if cache_size:
            reason = self._recompile_reason(frame, code)
            if self.recorder is not None:
                self.recorder.recompiles.append(reason)
            if cache_size >= limit:
                warnings.warn(
                    "fastcompile: %s was compiled for %d different inputs, the limit "
                    "(fastcompile.config cache_size_limit); it runs uncompiled from now on. "
                    "Last recompile: %s" % (_where(code), cache_size, reason),
                    FastcompileWarning,
                    stacklevel=2,
                )
                return _C.RUN_ONLY
        t0 = time.perf_counter()
        try:
            result = _trace.trace_frame(
                code, frame.f_globals, frame.f_builtins, frame.closure, frame.f_locals, fullgraph=self.fullgraph
            )
        except _trace.Unsupported:
            raise  # fullgraph=True: the user asked for it
        except Exception as exc:  # an internal error: plain Python, never a crash
            if not config.get("suppress_errors"):
                raise
            warnings.warn(
                "fastcompile: internal error while tracing %s; it runs uncompiled: %s: %s"
                % (_where(code), type(exc).__name__, exc),
                FastcompileWarning,
                stacklevel=2,
            )
            return _C.SKIP
        entry = self._entry(code, result)
        if self.recorder is not None:
            self.recorder.add_frame(code, result, time.perf_counter() - t0, entry)
        return entry

    @staticmethod
    def _recompile_reason(frame, code):
        """One line: which guard of the most recent entry failed, expected vs actual."""
        entries = _C.code_entries(code)
        if not entries:
            return "%s: recompiled" % _where(code)
        entry = entries[0]
        idx = entry.guards.first_failure(frame)
        info = entry.info
        what = info.describe_failure(idx, frame) if info is not None else "guard #%d" % idx
        return "%s: %s" % (_where(code), what)

    @staticmethod
    def _entry(code, result):
        info = _trace.EntryInfo(result)
        guards = _C.Guards(result.program)
        if result.target is not None:
            return _C.CacheEntry(guards, result.target, slots=tuple(result.slots), name=code.co_name, info=info)
        if result.code is not None:
            return _C.CacheEntry(guards, result.code, name=code.co_name, info=info)
        # nothing compiled (e.g. a break inside a loop): remember that under the same guards, so
        # the frame is not traced again on every call
        return _C.CacheEntry(guards, code, name=code.co_name, info=info)


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------


def _forward_code(module):
    fwd = getattr(getattr(module, "forward", None), "__func__", None)
    return getattr(fwd, "__code__", None)


class CompiledModule:
    """What compile(module) returns: calls go through the hook; everything else reaches the module.

    module(*args) runs as usual (hooks included) and its forward frame is traced, also when
    forward lives in torch (nn.Sequential), whose frames the hook otherwise skips."""

    def __init__(self, module, hooked):
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_hooked", hooked)

    def __call__(self, *args, **kwargs):
        code = _forward_code(self._orig_mod)
        if code is not None and _C.code_state(code) == "skip":
            _C.reset_code(code)  # another compiled function skipped this torch code
        return self._hooked(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._orig_mod, name)

    def __setattr__(self, name, value):
        setattr(self._orig_mod, name, value)

    def __repr__(self):
        return "fastcompile.compile(%r)" % (self._orig_mod,)


def _is_module(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


@typing.overload
def compile(fn: None = None, *, fullgraph: bool = False) -> Callable[[_F], _F]: ...
@typing.overload
def compile(fn: _F, *, fullgraph: bool = False) -> _F: ...


def compile(fn: Optional[Callable[..., Any]] = None, *, fullgraph: bool = False) -> Any:
    """Compile a function or an nn.Module; also usable as ``@compile`` or ``@compile(fullgraph=True)``.

    The result runs ``fn`` with fastcompile's frame hook: each frame is traced into graphs for the
    core and checked by guards on later calls. What cannot be traced runs as plain Python (a graph
    break), unless ``fullgraph=True``, which raises ``fastcompile.trace.Unsupported`` instead.
    """
    if fn is None:
        return functools.partial(compile, fullgraph=fullgraph)
    if isinstance(fn, (_C.Hooked, CompiledModule)):
        return fn
    if not callable(fn):
        raise TypeError("fastcompile.compile expects a function or an nn.Module, got %s" % type(fn).__name__)
    if _is_module(fn):
        code = _forward_code(fn)
        return CompiledModule(fn, _C.Hooked(fn, ConvertFrame(fullgraph=fullgraph, force=[code] if code else ())))
    code = getattr(fn, "__code__", None)
    hooked = _C.Hooked(fn, ConvertFrame(fullgraph=fullgraph, force=[code] if code is not None else ()))
    functools.update_wrapper(hooked, fn, updated=()) if hasattr(hooked, "__dict__") else None
    return hooked


def reset() -> None:
    """Drop every compiled entry of every function (the kernels stay in the kernel caches)."""
    _C.reset_all()
    _trace.reset()
