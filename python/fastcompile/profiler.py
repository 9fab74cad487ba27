"""profile(): where the time of compiled code goes, kernel by kernel.

In: the calls of compiled graphs (``fastcompile.compile``, ``torch.compile(backend="fastcompile")``,
``Graph.compile``) made while a ``with fastcompile.profile() as prof:`` block runs. Out: a
Profile with one row per generated kernel, per extern function (torch ops the core does not fuse:
matmul, convolution, ...) and per compiled graph, and ``str(prof)``: a table.

The C runtime times each launch around the kernel (its OpenMP team included), each extern call
around the Python call (the NumPy/torch conversions in it included) and each call of a compiled
graph from entry to return; a call's "other" time is what is neither (buffer allocation, input
checks, plan lookup). Compiles a call waits for are a separate row, not call time. CUDA kernels
are launched asynchronously: they are counted (calls, elements, bytes) but not timed; time them
with torch.profiler or Nsight Systems. Profiling costs two clock reads per launch and extern.
"""

import threading
import time

from . import _C
from .explain import _short

_lock = threading.Lock()
_depth = 0  # profile() blocks open: the outermost switches recording on and off

_KINDS = ("call", "compile", "kernel", "cuda", "extern")


class ProfileRow:
    """One kernel, extern function or compiled graph: ``kind`` ("kernel": a CPU kernel; "cuda":
    a CUDA kernel, not timed; "extern"; "call": a compiled graph's calls; "compile": the compiles
    its calls waited for), ``name`` (a kernel's ``fc_<hash>``, an extern's function name, a
    graph's label), ``calls``, ``ns`` (total), ``elements`` (kernels: elements computed),
    ``bytes`` (kernels: the bytes its arrays span, read and written, each once: what it moves at
    least), ``path`` (a kernel's generated source), ``origin`` (file:line of its graph)."""

    __slots__ = ("kind", "name", "calls", "ns", "elements", "bytes", "path", "origin")

    def __init__(self, kind, name, calls, ns, elements, nbytes, path, origin):
        self.kind, self.name, self.calls, self.ns = kind, name, calls, ns
        self.elements, self.bytes, self.path, self.origin = elements, nbytes, path, origin

    @property
    def ms(self):
        return self.ns / 1e6

    @property
    def mean_us(self):
        return self.ns / 1e3 / self.calls if self.calls else 0.0

    @property
    def gbps(self):
        """bytes / time: the bandwidth the kernel reached on its arrays (None if not timed)"""
        return self.bytes / self.ns if self.ns and self.bytes else None

    def __repr__(self):
        return "ProfileRow(%s %s: %d calls, %.3f ms)" % (self.kind, self.name, self.calls, self.ms)


def _snapshot():
    rows, dropped = _C._profile_read()
    return {(r[0], r[1]): r for r in rows}, dropped


class Profile:
    """What one ``profile()`` block saw. ``rows``: ProfileRow list, slowest first; ``wall_ms``:
    the block's wall time; ``dropped``: events lost to out of memory (0 normally);
    ``totals()``: time per kind; ``table()`` / ``str()``: the report."""

    def __init__(self):
        self.rows = []
        self.wall_ms = None
        self.dropped = 0
        self._start = None
        self._t0 = None

    def __enter__(self):
        global _depth
        with _lock:
            if _depth == 0:
                _C._profile(True, True)
            _depth += 1
            self._start = _snapshot()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        global _depth
        wall = time.perf_counter() - self._t0
        with _lock:
            end, dropped = _snapshot()
            _depth -= 1
            if _depth == 0:
                _C._profile(False, False)
        start, dropped0 = self._start
        rows = []
        for key, r in end.items():
            s = start.get(key)
            if s is not None:  # an enclosing block's events before this one began
                r = r[:2] + tuple(a - b for a, b in zip(r[2:6], s[2:6])) + r[6:]
            if r[2] > 0:
                rows.append(ProfileRow(*r))
        rows.sort(key=lambda r: (-r.ns, _KINDS.index(r.kind), r.name))
        self.rows = rows
        self.wall_ms = wall * 1e3
        self.dropped = dropped - dropped0
        return False

    def totals(self):
        """Milliseconds per kind ("call", "compile", "kernel", "extern"; CUDA kernels are not
        timed), ``other``: call time neither kernels nor externs took, and ``wall`` (the block)."""
        t = {k: 0.0 for k in _KINDS if k != "cuda"}
        for r in self.rows:
            if r.kind in t:
                t[r.kind] += r.ms
        t["other"] = max(0.0, t["call"] - t["kernel"] - t["extern"])
        t["wall"] = self.wall_ms or 0.0
        return t

    def table(self, top=25):
        """The report: totals, then the ``top`` rows by time (None: all)."""
        t = self.totals()
        calls = sum(r.calls for r in self.rows if r.kind == "call")
        out = [
            "fastcompile profile: %.3f ms wall; %d call%s of compiled graphs: %.3f ms"
            % (t["wall"], calls, "" if calls == 1 else "s", t["call"])
        ]

        def pct(ms):
            return " (%.0f%%)" % (100.0 * ms / t["call"]) if t["call"] > 0 else ""

        out.append(
            "  kernels %.3f ms%s, externs %.3f ms%s, other %.3f ms%s; compiles waited for %.3f ms"
            % (t["kernel"], pct(t["kernel"]), t["extern"], pct(t["extern"]), t["other"], pct(t["other"]), t["compile"])
        )
        ncuda = sum(r.calls for r in self.rows if r.kind == "cuda")
        if ncuda:
            out.append(
                "  %d CUDA kernel launch%s counted, not timed (asynchronous: use torch.profiler)"
                % (ncuda, "" if ncuda == 1 else "es")
            )
        if self.dropped:
            out.append("  %d event%s dropped (out of memory)" % (self.dropped, "" if self.dropped == 1 else "s"))
        shown = self.rows if top is None else self.rows[:top]
        out.append("  %-7s %10s %6s %7s %10s %7s  %s" % ("kind", "total ms", "%", "calls", "mean us", "GB/s", "name"))
        for r in shown:
            share = "%.1f" % (100.0 * r.ms / t["call"]) if t["call"] > 0 and r.kind not in ("call", "cuda") else ""
            bw = "%.1f" % r.gbps if r.gbps is not None and r.kind == "kernel" else ""
            where = []
            if r.kind in ("kernel", "cuda") and r.origin:
                where.append(r.origin)
            if r.path:
                where.append(_short(r.path))
            ms = "%.3f" % r.ms if r.kind != "cuda" else "-"
            mean = "%.1f" % r.mean_us if r.kind != "cuda" else "-"
            out.append(
                "  %-7s %10s %6s %7d %10s %7s  %s%s"
                % (r.kind, ms, share, r.calls, mean, bw, r.name, "  [%s]" % ", ".join(where) if where else "")
            )
        if len(shown) < len(self.rows):
            out.append(
                "  ... %d more row%s (table(top=None) shows all)"
                % (len(self.rows) - len(shown), "" if len(self.rows) - len(shown) == 1 else "s")
            )
        return "\n".join(out)

    def __str__(self):
        return self.table()

    def __repr__(self):
        return "<fastcompile Profile: %d rows, %.3f ms wall>" % (len(self.rows), self.wall_ms or 0.0)


def profile() -> Profile:
    """``with fastcompile.profile() as prof: ...`` then ``print(prof)``: time per generated
    kernel, extern function and compiled graph over the block (see the module's doc). Blocks
    nest; each reports its own events."""
    return Profile()
