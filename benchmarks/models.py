"""torch models on CPU, side by side: eager, torch.compile(inductor), torch.compile(fastcompile),
fastcompile.compile (our own frontend; training through autograd mode and aot_autograd).

    python3 benchmarks/models.py            # full run
    python3 benchmarks/models.py --quick    # smoke run (small sizes, few iterations)
    python3 benchmarks/models.py --small    # host-bound sizes, timed in full: per-call costs

Models: a transformer block (LayerNorm, multi-head attention, GELU MLP), an MLP and a small NCHW
CNN (two conv + BatchNorm2d + ReLU blocks, average pool, linear head); each for inference (no_grad
forward) and a training step (forward, MSE loss, backward, SGD step). The CNN's BatchNorm runs in
training mode for both (its batch statistics), as a module left in train() does.

Columns:
  ms/iter     median wall time per iteration after warm-up; the four configurations are timed
              interleaved (one step each per iteration, in a shuffled order that never runs one
              twice in a row), so a drift of this shared machine's speed reaches them alike;
              iterations: as many as --seconds allows per case, at least 60
  speedup     eager median / this median
  vs ind      per-iteration ratio inductor time / this time (the configurations run one after
              another within an iteration, so a pair shares the machine's state of the moment):
              the median, and a 95% bootstrap interval of that median. Above 1.00: faster than
              inductor; an interval that holds 1.00: a tie this run cannot settle
  cold s      first call (trace + compile) with empty compiler caches: a fresh
              TORCHINDUCTOR_CACHE_DIR for this process, fastcompile.cache_clear(disk=True) before
              each fastcompile configuration. Each framework's one-time costs (lazy imports,
              Inductor's compile workers) are paid before, on a tiny function (prewarm()), so the
              first model's figures are comparable with the second's
  warm s      first call again after torch._dynamo.reset() / fastcompile.reset(), on-disk caches
              warm
  async s     async_compile on (FASTCOMPILE_ASYNC_COMPILE), default async_delay_calls (1), empty
              kernel caches: the first call. fastcompile runs Dynamo's graph as plain torch
              (aot_autograd and the lowering wait for the second call, which starts the
              background compile); fc.compile returns what its trace computed (inference) or,
              training, defers as fastcompile does
  ready s     the same, until a step has run every graph's compiled kernels (steps keep coming
              meanwhile, as in a training loop; they run as plain torch, or wait for the kernels)
  peak MB     peak resident set over the warm-up steps above the resident set before them
              (Linux: VmHWM after resetting it through /proc/self/clear_refs)

A second table puts the cold compiles beside the floor every backend behind aot_autograd pays:
the first call of torch.compile(backend="aot_eager") (Dynamo's trace, aot_autograd's forward and
backward graphs, one eager run). "ind / floor" is the most any such backend could gain on
Inductor's cold compile when its first call waits for aot_autograd; "ind / async" is Inductor's
cold compile over our async first call (which does not).
"""

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few iterations (smoke run)")
    ap.add_argument(
        "--small",
        action="store_true",
        help="host-bound sizes (a transformer block of width 64 on 2 x 16 tokens, an MLP of "
        "width 64 on 16 rows), timed as the full run: what each backend adds per call",
    )
    ap.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="timed interleaved iterations per model and mode take about this long (default 30)",
    )
    ap.add_argument(
        "--omp-wait-policy",
        choices=("active", "passive"),
        type=str.lower,
        help="set OMP_WAIT_POLICY for everyone before torch loads (default: leave it unset, as "
        "users run; the fastcompile backend's own default of PASSIVE comes too late to act)",
    )
    return ap.parse_args(argv)


# OMP_WAIT_POLICY is read when torch loads its libgomp, which the kernels of Inductor and
# fastcompile then share (same soname): --omp-wait-policy must act before `import torch`.
# By default it stays unset, as users run (benchmarks/pointwise.py does the same).
ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.omp_wait_policy:
    os.environ["OMP_WAIT_POLICY"] = ARGS.omp_wait_policy.upper()
OMP_POLICY_AT_LOAD = os.environ.get("OMP_WAIT_POLICY", "unset")  # what torch's libgomp reads
_tmp = tempfile.mkdtemp(prefix="fc-bench-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_tmp, "inductor"))
os.environ.setdefault("FASTCOMPILE_CACHE_DIR", os.path.join(_tmp, "fastcompile"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fastcompile  # noqa: E402
from fastcompile.backends.torch import backend as fc_backend  # noqa: E402


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


def cnn(c_in, c):
    """Two conv + BatchNorm2d + ReLU blocks, a global average pool and a linear head: an NCHW
    model, which Inductor and the fastcompile backend both run channels_last inside."""

    def blk(ci, co):
        return [nn.Conv2d(ci, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.ReLU()]

    return nn.Sequential(*blk(c_in, c), *blk(c, c), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))


def mlp(d):
    return nn.Sequential(
        nn.Linear(d, 4 * d), nn.GELU(), nn.LayerNorm(4 * d), nn.Linear(4 * d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d)
    )


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_name():
    """The CPU's model name, vendor, family and model (Linux: /proc/cpuinfo), so that figures from
    machines of different kinds are not compared by mistake; the platform's name elsewhere."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return platform.processor() or platform.machine()
    first = {}
    for line in text.splitlines():
        key, _, val = line.partition(":")
        first.setdefault(key.strip(), val.strip())
    return "%s (%s, family %s model %s)" % (
        first.get("model name", "?"),
        first.get("vendor_id", "?"),
        first.get("cpu family", "?"),
        first.get("model", "?"),
    )


def peak_reset():
    """Start a peak-memory window: reset the kernel's high-water mark of this process (Linux:
    writing 5 to /proc/self/clear_refs) and return the resident size now (MB)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_kb("VmRSS") / 1024.0


def peak_since(rss0):
    """Peak resident size since peak_reset() returned rss0, above rss0 (MB)."""
    return max(0.0, _status_kb("VmHWM") / 1024.0 - rss0)


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


CONFIGS = ("eager", "fastcompile", "fc.compile", "inductor")


def maker(cfg, model):
    """(make, reset) for a compiled configuration: make() returns the callable to run."""
    if cfg == "fc.compile":
        return (lambda: fastcompile.compile(model)), fastcompile.reset
    be = fc_backend if cfg == "fastcompile" else "inductor"
    return (lambda: torch.compile(model, backend=be, dynamic=False)), torch._dynamo.reset


def prewarm():
    """Pay each framework's one-time costs (Dynamo's and Inductor's lazy imports, Inductor's
    compile workers, our tracer's imports) on a tiny unrelated function, so that the first
    model's cold compile measures compiling that model, as the later models' do."""
    x = torch.randn(8, 8)
    lin = nn.Linear(8, 8)
    for cfg in CONFIGS[1:]:
        make, reset = maker(cfg, lin)
        with torch.no_grad():
            make()(x)
        reset()
    torch.compile(lin, backend="aot_eager")(x).sum().backward()  # floor_cold's backend
    torch._dynamo.reset()
    fastcompile.reset()


def interleaved(configs, iters, seed=0):
    """One order of the configurations per iteration: shuffled (fixed seed), and never starting
    with the configuration the previous one ended with. A fixed or mirrored order would run the
    end configurations twice in a row every other iteration, on caches their own previous step
    left warm, and always put the same one after each of the others."""
    import random

    rng = random.Random(seed)
    last = None
    for _ in range(iters):
        order = list(configs)
        rng.shuffle(order)
        while len(order) > 1 and order[0] == last:
            rng.shuffle(order)
        last = order[-1]
        yield order


def bench(name, make_model, x, train, iters, warmup, seconds=0.0):
    """Phase 1, one configuration at a time: cold compile (empty kernel caches), warm compile
    (reset, disk caches kept) and peak memory over the warm-up steps. Phase 2: every
    configuration compiled again (warm), then timed interleaved, in shuffled orders (interleaved()), so that
    the machine's drifts reach all of them alike."""
    base = make_model()
    models, steps, info = {}, {}, {}
    for cfg in CONFIGS:
        torch._dynamo.reset()
        fastcompile.reset()
        model = models[cfg] = copy.deepcopy(base).train(train)
        step = steps[cfg] = make_step(model, train)
        if cfg in ("fastcompile", "fc.compile"):
            fastcompile.cache_clear(disk=True)  # cold: no kernel from an earlier configuration
        if cfg == "eager":
            run, cold, warm = model, 0.0, 0.0
        else:
            make, reset = maker(cfg, model)
            run = make()
            t0 = time.perf_counter()
            step(run, x)
            cold = time.perf_counter() - t0
            reset()  # warm: compiled again, on-disk caches kept
            run = make()
            t0 = time.perf_counter()
            step(run, x)
            warm = time.perf_counter() - t0
        rss0 = peak_reset()
        for _ in range(warmup):
            step(run, x)
        info[cfg] = (cold, warm, peak_since(rss0)) + (
            async_first_call(base, train, x, cfg) if cfg in ("fastcompile", "fc.compile") else (None, None)
        )
    floor = floor_cold(base, train, x)
    torch._dynamo.reset()
    fastcompile.reset()
    runs = {}
    for cfg in CONFIGS:
        runs[cfg] = models[cfg] if cfg == "eager" else maker(cfg, models[cfg])[0]()
        for _ in range(warmup):
            steps[cfg](runs[cfg], x)
    ts = {cfg: [] for cfg in CONFIGS}
    if seconds:  # as many iterations as fit the time budget, at least `iters`
        t0 = time.perf_counter()
        for cfg in CONFIGS:
            steps[cfg](runs[cfg], x)
        iters = max(iters, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    for order in interleaved(CONFIGS, iters):
        for cfg in order:
            t0 = time.perf_counter()
            steps[cfg](runs[cfg], x)
            ts[cfg].append(time.perf_counter() - t0)
    rows = []
    eager = statistics.median(ts["eager"]) * 1e3
    for cfg in CONFIGS:
        med = statistics.median(ts[cfg]) * 1e3
        cold, warm, peak, first, ready = info[cfg]
        vs = paired(ts["inductor"], ts[cfg])
        rows.append([name, "train" if train else "infer", cfg, med, eager / med, vs, cold, warm, first, ready, peak])
    FLOORS.append(
        (
            name,
            "train" if train else "infer",
            floor,
            info["fastcompile"][0],
            info["fc.compile"][0],
            info["inductor"][0],
            info["fastcompile"][3],
            info["fc.compile"][3],
        )
    )
    return rows


FLOORS = []  # per model and mode: (name, mode, floor s, fastcompile cold, fc.compile cold, inductor cold,
#                async first call of fastcompile and of fc.compile)


def floor_cold(base, train, x):
    """The first call of torch.compile(backend="aot_eager"): Dynamo's trace, aot_autograd's
    (forward and backward graphs, decompositions) and one eager run of the result. Every
    backend behind aot_autograd pays this before its own compile, Inductor included."""
    torch._dynamo.reset()
    model = copy.deepcopy(base).train(train)
    step = make_step(model, train)
    run = torch.compile(model, backend="aot_eager", dynamic=False)
    t0 = time.perf_counter()
    step(run, x)
    t = time.perf_counter() - t0
    torch._dynamo.reset()
    return t


def paired(base, other, resamples=2000):
    """(median, low, high) of base[i] / other[i]: the median ratio of paired samples and a 95%
    percentile-bootstrap interval of it (fixed seed: the same samples give the same interval)."""
    import random

    ratios = [b / o for b, o in zip(base, other)]
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return statistics.median(ratios), meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def async_first_call(base, train, x, cfg):
    """(first call s, ready s) of configuration cfg (fastcompile or fc.compile) with
    async_compile on and empty kernel caches: steps keep coming until every graph runs its
    kernels (fastcompile.pending_compiles() is 0: none waits for its lowering, none builds)."""
    torch._dynamo.reset()
    fastcompile.reset()
    fastcompile.cache_clear(disk=True)
    model = copy.deepcopy(base).train(train)
    step = make_step(model, train)
    fastcompile.config.set(async_compile=True)
    try:
        run = maker(cfg, model)[0]()
        t0 = time.perf_counter()
        step(run, x)
        first = time.perf_counter() - t0
        while fastcompile.pending_compiles():
            step(run, x)
        step(run, x)  # the first step on the kernels (a traced graph's waits for them)
        ready = time.perf_counter() - t0
    finally:
        fastcompile.config.set(async_compile=False)
    torch._dynamo.reset()
    fastcompile.reset()
    return first, ready


def main(args):
    torch.manual_seed(0)
    if args.quick:
        iters, warmup = 5, 2
        cases = [
            ("transformer", lambda: Block(64, 4), torch.randn(4, 32, 64)),
            ("mlp", lambda: mlp(64), torch.randn(64, 64)),
            ("cnn", lambda: cnn(8, 8), torch.randn(2, 8, 16, 16)),
        ]
    elif args.small:
        iters, warmup = 60, 5
        cases = [
            ("transformer", lambda: Block(64, 4), torch.randn(2, 16, 64)),
            ("mlp", lambda: mlp(64), torch.randn(16, 64)),
            ("cnn", lambda: cnn(8, 8), torch.randn(2, 8, 8, 8)),
        ]
    else:
        iters, warmup = 60, 5
        cases = [
            ("transformer", lambda: Block(256, 8), torch.randn(8, 128, 256)),
            ("mlp", lambda: mlp(512), torch.randn(512, 512)),
            ("cnn", lambda: cnn(16, 32), torch.randn(16, 16, 32, 32)),
        ]
    print(
        "torch %s, %d threads, %s, OMP_WAIT_POLICY %s"
        % (
            torch.__version__,
            torch.get_num_threads(),
            "quick" if args.quick else "small" if args.small else "full",
            OMP_POLICY_AT_LOAD,
        )
    )
    print("cpu: %s" % cpu_name())
    prewarm()
    rows = []
    for name, make, x in cases:
        for train in (False, True):
            rows += bench(name, make, x, train, iters, warmup, 0.0 if args.quick else args.seconds)
    hdr = (
        "model",
        "mode",
        "backend",
        "ms/iter",
        "speedup",
        "vs ind (95% CI)",
        "cold s",
        "warm s",
        "async s",
        "ready s",
        "peak MB",
    )
    print("%-12s %-6s %-12s %9s %8s %-19s %8s %8s %8s %8s %8s" % hdr)
    for r in rows:
        vs = "%.3f (%.3f-%.3f)" % r[5]
        r = r[:5] + [vs] + r[6:8] + ["%8.2f" % v if v is not None else "%8s" % "-" for v in r[8:10]] + r[10:]
        print("%-12s %-6s %-12s %9.3f %7.2fx %-19s %8.2f %8.2f %s %s %8.1f" % tuple(r))
    print()
    print("cold compile against the floor (aot_eager: Dynamo + aot_autograd + one eager run) and inductor")
    print(
        "%-12s %-6s %8s %10s %10s %10s %12s %12s %12s %14s"
        % (
            "model",
            "mode",
            "floor s",
            "fc cold s",
            "fc.compile",
            "ind cold s",
            "ind / fc",
            "ind / floor",
            "ind / async",
            "ind / fcc async",
        )
    )
    for name, mode, floor, fc, fcc, ind, first, ffirst in FLOORS:
        print(
            "%-12s %-6s %8.2f %10.2f %10.2f %10.2f %11.1fx %11.1fx %11.1fx %13.1fx"
            % (name, mode, floor, fc, fcc, ind, ind / fc, ind / floor, ind / first, ind / ffirst)
        )


if __name__ == "__main__":
    main(ARGS)
