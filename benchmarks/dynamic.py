"""Changing sizes on CPU: a training loop whose last batch is smaller, a transformer fed sequences
of several lengths. Eager, torch.compile(inductor), torch.compile(fastcompile) and
fastcompile.compile, each with its defaults (Dynamo's automatic dynamic shapes: the first size
change recompiles the frame with a symbolic size; Inductor then compiles size-generic kernels,
fastcompile lowers that graph once per set of sizes and reuses its size-generic kernels).

    python3 benchmarks/dynamic.py             # full run
    python3 benchmarks/dynamic.py --quick     # smoke run (small sizes, few cycles)

Each case cycles through a size schedule (the MLP: batches 512, 512, 512, 320; the transformer
block: sequence lengths 128, 128, 96, 128, 64). Per configuration, with Dynamo and fastcompile
reset and empty compiler caches:
  first s     the first cycle: every size's first step, compiles included
  graphs      Dynamo's graph compiles over the run (torch.compile rows): 2 where automatic dynamic
              recompiled the frame once with a symbolic size
  steady ms   median step time over the later cycles, all sizes together
  vs eager    eager step / this step, paired: every step of a configuration runs right after an
              eager step of the same size on the same data, and the median of the per-pair
              ratios is shown with a 95% bootstrap interval (above 1.00: faster than eager)
Configurations run one after another, each paired with eager, so compare them through their
"vs eager" columns; one absolute time on this shared machine means little.
"""

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as M  # noqa: E402  (sets the compiler cache dirs first)
import torch  # noqa: E402
import fastcompile  # noqa: E402

CONFIGS = ("fastcompile", "fc.compile", "inductor")


def run_case(name, make_model, make_x, sizes, train, cycles):
    base = make_model()
    rows = []
    xs = {n: make_x(n) for n in sorted(set(sizes))}
    for cfg in CONFIGS:
        torch._dynamo.reset()
        fastcompile.reset()
        fastcompile.cache_clear(disk=True)
        from torch._dynamo.utils import counters

        counters.clear()
        ref = copy.deepcopy(base).train(train)
        mod = copy.deepcopy(base).train(train)
        ref_step, step = M.make_step(ref, train), M.make_step(mod, train)
        make, _ = M.maker(cfg, mod)
        run = make()
        t0 = time.perf_counter()
        for n in sizes:
            step(run, xs[n])
        first = time.perf_counter() - t0
        eager, times = [], []
        for _ in range(cycles):
            for n in sizes:
                t0 = time.perf_counter()
                ref_step(ref, xs[n])
                eager.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                step(run, xs[n])
                times.append(time.perf_counter() - t0)
        graphs = counters["stats"]["unique_graphs"] if cfg != "fc.compile" else "-"
        rows.append(
            (name, "train" if train else "infer", cfg, first, graphs, statistics.median(times) * 1e3)
            + M.paired(eager, times)
        )
        torch._dynamo.reset()
        fastcompile.reset()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few cycles (smoke run)")
    ap.add_argument("--cycles", type=int, default=8, help="timed cycles per configuration (default 8)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    if args.quick:
        d, w, cycles = 64, 32, 2
        mlp_sizes, seqs = (64, 64, 40), (32, 24, 32, 16)
    else:
        d, w, cycles = 256, 512, args.cycles
        mlp_sizes, seqs = (512, 512, 512, 320), (128, 128, 96, 128, 64)
    cases = [
        ("mlp", lambda: M.mlp(w), lambda n: torch.randn(n, w), mlp_sizes),
        ("transformer", lambda: M.Block(d, 8 if d >= 256 else 4), lambda n: torch.randn(8, n, d), seqs),
    ]
    print("torch %s, %d threads, %s" % (torch.__version__, torch.get_num_threads(), "quick" if args.quick else "full"))
    M.prewarm()
    rows = []
    for name, make_model, make_x, sizes in cases:
        for train in (False, True):
            rows += run_case(name, make_model, make_x, sizes, train, cycles)
    print(
        "%-12s %-6s %-12s %8s %7s %10s  %s"
        % ("model", "mode", "backend", "first s", "graphs", "steady ms", "vs eager (95% CI)")
    )
    for name, mode, cfg, first, graphs, ms, med, lo, hi in rows:
        print("%-12s %-6s %-12s %8.2f %7s %10.3f  %.3f (%.3f-%.3f)" % (name, mode, cfg, first, graphs, ms, med, lo, hi))


if __name__ == "__main__":
    main()
