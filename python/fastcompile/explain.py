"""explain(): run a function once under a recording frontend and report what it made of it.

In: a function or nn.Module and its arguments. Out: an ExplainOutput with TorchDynamo's fields
(graphs, graph_count, graph_break_count, break_reasons, ops_per_graph, out_guards,
compile_times) plus ours: kernels (generated source per kernel) and recompiles (one line each).
"""

import os
import re
from typing import Any, Callable

from . import _C
from . import api
from . import config


class _Recorder:
    """What the ConvertFrame of one explain() run saw, frame by frame."""

    def __init__(self):
        self.frames = []  # (code, TraceResult, seconds)
        self.recompiles = []

    def add_frame(self, code, result, seconds, entry):
        self.frames.append((code, result, seconds))


def _ops_of(graph):
    """Op names of a Graph, in order (inputs and constants left out), from its text dump. An
    autograd-mode frame's graph is a torch.fx.Graph of torch ops: their names."""
    if not hasattr(graph, "dump"):
        return [
            n.target if n.op == "call_method" else getattr(n.target, "__name__", str(n.target))
            for n in graph.nodes
            if n.op in ("call_function", "call_method")
        ]
    ops = []
    for line in graph.dump().splitlines():
        m = re.match(r"\s*%\d+ = (\w+)\(", line)
        if m and m.group(1) not in ("input", "constant"):
            ops.append(m.group(1))
    return ops


def _short(path):
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


class ExplainOutput:
    """The report. str() of it is meant to be read by a person; the fields are for code."""

    def __init__(self, recorder):
        self.graphs, self.ops_per_graph, self.kernels = [], [], []
        self.break_reasons, self.out_guards, self.compile_times = [], [], []
        self.recompiles = list(recorder.recompiles)
        self._frames = []
        for code, result, seconds in recorder.frames:
            where = "%s (%s:%d)" % (code.co_name, _short(code.co_filename), code.co_firstlineno)
            self.compile_times.append((where, seconds))
            self.break_reasons.extend(result.breaks)
            self.out_guards.extend(g.describe() for g in result.guards)
            first = len(self.graphs)
            for info in result.graphs:
                self.graphs.append(info.graph)
                self.ops_per_graph.append(_ops_of(info.graph))
                compiled = getattr(info, "compiled", None)
                for k in compiled.kernels if compiled is not None else ():
                    self.kernels.append((len(self.graphs) - 1, k.name, k.path))
            self._frames.append((where, result, seconds, range(first, len(self.graphs))))
        self.graph_count = len(self.graphs)
        self.graph_break_count = len(self.break_reasons)

    def __str__(self):
        out = [
            "Graph count: %d" % self.graph_count,
            "Graph break count: %d" % self.graph_break_count,
            "Op count: %d" % sum(len(o) for o in self.ops_per_graph),
        ]
        for where, result, seconds, graphs in self._frames:
            out.append("")
            out.append(
                "Frame %s: %d graph(s), %d break(s), traced and compiled in %.1f ms"
                % (where, len(graphs), len(result.breaks), seconds * 1e3)
            )
            for gi in graphs:
                info = result.graphs[gi - graphs.start]
                out.append(
                    "  Graph %d (%s:%d-%d): %d ops: %s"
                    % (
                        gi,
                        _short(info.span[0]),
                        info.span[1],
                        info.span[2],
                        len(self.ops_per_graph[gi]),
                        " ".join(self.ops_per_graph[gi]),
                    )
                )
                if info.float_sources:
                    out.append("    Floats read at each call: %s" % ", ".join(repr(s) for s in info.float_sources))
            for b in result.breaks:
                out.append("  Break: %s" % b.reason)
                for fname, lineno, func, line in b.user_stack:
                    out.append("    %s:%d in %s: %s" % (_short(fname), lineno, func, (line or "").strip()))
            if result.guards:
                out.append("  Guards (%d):" % len(result.guards))
                out.extend("    " + g.describe() for g in result.guards)
        if self.kernels:
            out.append("")
            out.append("Kernels:")
            out.extend("  graph %d: %s  %s" % k for k in self.kernels)
        if self.recompiles:
            out.append("")
            out.append("Recompiles:")
            out.extend("  " + r for r in self.recompiles)
        return "\n".join(out)

    __repr__ = __str__


def explain(fn: Callable[..., Any], *, fullgraph: bool = False) -> Callable[..., ExplainOutput]:
    """``explain(fn)(*args, **kwargs)`` runs fn once, compiled from scratch, and returns an
    ExplainOutput. It drops every compiled entry first (as fastcompile.reset())."""
    target = (
        fn._orig_mod
        if isinstance(fn, api.CompiledModule)
        else getattr(fn, "fn", fn)
        if isinstance(fn, _C.Hooked)
        else fn
    )

    def run(*args, **kwargs):
        api.reset()
        recorder = _Recorder()
        code = api._forward_code(target) if api._is_module(target) else getattr(target, "__code__", None)
        force = [code] if code is not None else ()
        hooked = _C.Hooked(target, api.ConvertFrame(fullgraph=fullgraph, recorder=recorder, force=force))
        try:
            with config.overriding(async_compile=False):  # the report lists the kernels: the
                hooked(*args, **kwargs)  # one call compiles them (this thread)
        finally:
            api.reset()
        return ExplainOutput(recorder)

    return run
