"""torch models on CPU, side by side: eager, torch.compile(inductor), torch.compile(fastcompile),
fastcompile.compile (our own frontend; training through autograd mode and aot_autograd).

    python3 benchmarks/models.py            # full run
    python3 benchmarks/models.py --quick    # smoke run (small sizes, few iterations)

Models: a transformer block (LayerNorm, multi-head attention, GELU MLP) and an MLP; each for
inference (no_grad forward) and a training step (forward, MSE loss, backward, SGD step).

Columns:
  ms/iter     median wall time per iteration after warm-up
  speedup     eager median / this median
  cold s      first call (trace + compile) with empty compiler caches: a fresh
              TORCHINDUCTOR_CACHE_DIR / FASTCOMPILE_CACHE_DIR for this process
  warm s      first call again after torch._dynamo.reset(), on-disk caches warm
  peak MB     peak resident set growth: resource.getrusage(RUSAGE_SELF).ru_maxrss after the
              configuration ran, minus before (maxrss only grows, so configurations run in
              order eager, fastcompile, fc.compile, inductor and a later one's figure is 0 unless it goes
              above every earlier peak; read it as "new peak")
"""
import argparse
import copy
import functools
import os
import resource
import statistics
import sys
import tempfile
import time

# Several OpenMP runtimes share the cores here (torch's bundled libgomp; the system libgomp that
# Inductor's and fastcompile's kernels load). Spinning waits (the default) make each starve the
# others on small machines, by 10-300x; passive waits for all of them, set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_tmp = tempfile.mkdtemp(prefix="fc-bench-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_tmp, "inductor"))
os.environ.setdefault("FASTCOMPILE_CACHE_DIR", os.path.join(_tmp, "fastcompile"))

import torch                         # noqa: E402
import torch.nn as nn                # noqa: E402
import torch.nn.functional as F      # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fastcompile                                             # noqa: E402
from fastcompile.backends.torch import backend as fc_backend   # noqa: E402


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def mlp(d):
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.LayerNorm(4 * d), nn.Linear(4 * d, 4 * d),
                         nn.SiLU(), nn.Linear(4 * d, d))


def maxrss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_step(model, train):
    if not train:
        def infer(run, x):
            with torch.no_grad():
                return run(x)
        return infer
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(run, x):
        out = run(x)
        loss = F.mse_loss(out, torch.zeros_like(out))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def bench(name, make_model, x, train, iters, warmup):
    rows = []
    base = make_model()
    for cfg in ("eager", "fastcompile", "fc.compile", "inductor"):
        torch._dynamo.reset()
        fastcompile.reset()
        model = copy.deepcopy(base).train(train)
        step = make_step(model, train)
        rss0 = maxrss_mb()
        if cfg in ("fastcompile", "fc.compile"):
            fastcompile.cache_clear(disk=True)      # cold: no kernel from an earlier configuration
        if cfg == "eager":
            run, cold, warm = model, 0.0, 0.0
        else:
            if cfg == "fc.compile":
                make, reset = (lambda: fastcompile.compile(model)), fastcompile.reset
            else:
                be = fc_backend if cfg == "fastcompile" else "inductor"
                make, reset = (lambda: torch.compile(model, backend=be, dynamic=False)), torch._dynamo.reset
            run = make()
            t0 = time.perf_counter()
            step(run, x)
            cold = time.perf_counter() - t0
            reset()                                  # warm: compiled again, on-disk caches kept
            run = make()
            t0 = time.perf_counter()
            step(run, x)
            warm = time.perf_counter() - t0
        for _ in range(warmup):
            step(run, x)
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            step(run, x)
            ts.append(time.perf_counter() - t0)
        rows.append([name, "train" if train else "infer", cfg, statistics.median(ts) * 1e3, cold, warm,
                     maxrss_mb() - rss0])
    eager = rows[0][3]
    for r in rows:
        r.insert(4, eager / r[3])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few iterations (smoke run)")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.quick:
        iters, warmup = 5, 2
        cases = [("transformer", lambda: Block(64, 4), torch.randn(4, 32, 64)),
                 ("mlp", lambda: mlp(64), torch.randn(64, 64))]
    else:
        iters, warmup = 30, 5
        cases = [("transformer", lambda: Block(256, 8), torch.randn(8, 128, 256)),
                 ("mlp", lambda: mlp(512), torch.randn(512, 512))]
    print("torch %s, %d threads, %s" % (torch.__version__, torch.get_num_threads(),
                                         "quick" if args.quick else "full"))
    rows = []
    for name, make, x in cases:
        for train in (False, True):
            rows += bench(name, make, x, train, iters, warmup)
    hdr = ("model", "mode", "backend", "ms/iter", "speedup", "cold s", "warm s", "peak MB")
    print("%-12s %-6s %-12s %9s %8s %8s %8s %8s" % hdr)
    for r in rows:
        print("%-12s %-6s %-12s %9.3f %7.2fx %8.2f %8.2f %8.1f" % tuple(r))


if __name__ == "__main__":
    main()
