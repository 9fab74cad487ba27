"""Per-call overhead of a compiled function on tiny arrays, and tracing time per function.

    python3 benchmarks/overhead.py [--quick] [--json PATH]

Side by side in one run, on 1-element float32 inputs (so the arithmetic costs next to nothing):

  plain python           the function itself (NumPy; torch for the torch rows)
  fastcompile.compile    the PEP 523 hook: guards on 4 arrays, dispatch, the compiled graph
  graph Compiled         the same graph called directly through the graph API (the kernel and the
                         core's own dispatch); fastcompile.compile minus this is the frontend's
                         cache-hit cost (guards + dispatch), the figure the issue targets (<= 1 us)
  torch.compile eager    Dynamo's cache-hit path with backend="eager" (guards + the FX graph run
                         eagerly), on torch tensors
  torch.compile          Dynamo + inductor (default mode)

Tracing time: the first call of a fresh function with the kernels already in the disk cache
(fastcompile: explain().compile_times, which is tracing + graph building; Dynamo: the first call
with backend="eager", which is tracing + guard building and no code generation).
Figures are medians of repeated batches; this prints figures and never fails on them.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import fastcompile  # noqa: E402
import fastcompile.graph as fg  # noqa: E402


def f4(a, b, c, d):
    return a * b + c * d


def per_call_us(fn, args, quick):
    """Median over batches of the time per call, in microseconds."""
    n = 2000 if quick else 20000
    batches = 5 if quick else 21
    fn(*args)
    samples = []
    for _ in range(batches):
        t = time.perf_counter_ns()
        for _ in range(n):
            fn(*args)
        samples.append((time.perf_counter_ns() - t) / n / 1e3)
    return statistics.median(samples)


def graph_f4():
    g = fg.Graph()
    a, b, c, d = (g.input("float32", 1) for _ in range(4))
    g.output(g.call("add", g.call("mul", a, b), g.call("mul", c, d)))
    return g.compile()


def fresh_function(i):
    """A new function object with new code each time, so nothing is cached by code identity."""
    src = "def traced_%d(a, b, c, d):\n    return a * b + c * d * %d.0\n" % (i, i + 1)
    ns = {}
    exec(compile(src, "<overhead-bench-%d>" % i, "exec"), ns)
    return ns["traced_%d" % i]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    result = {"per_call_us": {}, "trace_ms": {}}
    xs = [np.full(1, 1.5, np.float32) for _ in range(4)]

    rows = result["per_call_us"]
    rows["plain python (numpy)"] = per_call_us(f4, xs, args.quick)
    rows["fastcompile.compile"] = per_call_us(fastcompile.compile(f4), xs, args.quick)
    rows["graph Compiled direct"] = per_call_us(graph_f4(), xs, args.quick)
    hit = rows["fastcompile.compile"] - rows["graph Compiled direct"]

    try:
        import torch
        import torch._dynamo
    except ImportError:
        torch = None
    if torch is not None:
        ts = [torch.full((1,), 1.5) for _ in range(4)]
        rows["plain python (torch)"] = per_call_us(f4, ts, args.quick)
        torch._dynamo.reset()
        rows["torch.compile backend=eager"] = per_call_us(torch.compile(f4, backend="eager"), ts, args.quick)
        torch._dynamo.reset()
        rows["torch.compile (inductor)"] = per_call_us(torch.compile(f4), ts, args.quick)
        dynamo_hit = rows["torch.compile backend=eager"] - rows["plain python (torch)"]
    else:
        dynamo_hit = None

    # tracing time per function: kernels warm in the disk cache, the function new
    fastcompile.compile(fresh_function(0))(*xs)
    ntrace = 3 if args.quick else 9
    fc_ms, dyn_ms = [], []
    for i in range(1, ntrace + 1):
        out = fastcompile.explain(fresh_function(i))(*xs)
        fc_ms.append(sum(s for _, s in out.compile_times) * 1e3)
        if torch is not None:
            torch._dynamo.reset()
            fn = torch.compile(fresh_function(100 + i), backend="eager")
            t = time.perf_counter()
            fn(*ts)
            dyn_ms.append((time.perf_counter() - t) * 1e3)
    result["trace_ms"]["fastcompile (trace + graph build)"] = statistics.median(fc_ms)
    if dyn_ms:
        result["trace_ms"]["dynamo (backend=eager, first call)"] = statistics.median(dyn_ms)

    print("fastcompile per-call overhead: f(a, b, c, d) = a*b + c*d on 1-element float32 arrays")
    print("(medians of batches; %s)" % ("quick" if args.quick else "full"))
    print("-" * 72)
    for name, us in rows.items():
        print("%-34s %8.3f us per call" % (name, us))
    print("-" * 72)
    print(
        "%-34s %8.3f us   target <= 1 us: %s"
        % ("fastcompile cache hit (guards+dispatch)", hit, "met" if hit <= 1.0 else "NOT MET")
    )
    if dynamo_hit is not None:
        print("%-34s %8.3f us   (torch.compile backend=eager minus torch eager)" % ("Dynamo cache hit", dynamo_hit))
        inductor_total = rows["torch.compile (inductor)"]
        ratio = inductor_total / rows["fastcompile.compile"]
        print(
            "%-34s %8.1fx  target >= 10x: %s"
            % ("torch.compile / fastcompile per call", ratio, "met" if ratio >= 10 else "NOT MET")
        )
        result["dynamo_hit_us"] = dynamo_hit
        result["ratio_vs_inductor"] = ratio
    result["fastcompile_hit_us"] = hit
    print("-" * 72)
    for name, ms in result["trace_ms"].items():
        print("%-34s %8.2f ms per function (median of %d)" % (name, ms, ntrace))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
