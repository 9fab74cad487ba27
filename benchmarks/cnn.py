"""A small CNN on CPU, inference, side by side: eager, torch.compile(inductor),
torch.compile(fastcompile) and fastcompile.compile, on NCHW input and on a channels_last model
and input (torch's advice for CNNs on CPU), at 16 and 64 channels.

    python3 benchmarks/cnn.py            # full run
    python3 benchmarks/cnn.py --quick    # smoke run

The model: two ResNet basic blocks (3x3 convolution, BatchNorm in eval mode, ReLU, 3x3
convolution, BatchNorm, residual add, ReLU; in-place ReLUs and += as torchvision writes them),
global average pooling and a linear layer, on a batch of 8 images of 32 x 32.

Columns:
  ms/iter     median wall time per iteration; the configurations run interleaved (one call each
              per iteration, in a shuffled order), so the machine's drifts reach them alike
  vs eager    per-iteration ratio eager time / this time: the median and a 95% bootstrap
              interval (above 1.00: faster than eager)
  vs ind      the same against inductor
  layout      the output's layout matches eager's (strides), values within 1e-4
"""

import argparse
import copy
import os
import random
import statistics
import sys
import tempfile

_tmp = tempfile.mkdtemp(prefix="fc-bench-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_tmp, "inductor"))
os.environ.setdefault("FASTCOMPILE_CACHE_DIR", os.path.join(_tmp, "fastcompile"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fastcompile  # noqa: E402
from fastcompile.backends.torch import backend as fc_backend  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import paired  # noqa: E402  (the same bootstrap as models.py)

CONFIGS = ("eager", "fastcompile", "fc.compile", "inductor")


class BasicBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        y += x
        return self.relu(y)


def model(c):
    m = nn.Sequential(BasicBlock(c), BasicBlock(c), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return m.eval()


def make(cfg, m):
    if cfg == "eager":
        return m
    if cfg == "fc.compile":
        return fastcompile.compile(m)
    return torch.compile(m, backend=fc_backend if cfg == "fastcompile" else "inductor", dynamic=False)


def bench(c, channels_last, iters):
    import time

    torch.manual_seed(0)
    base = model(c)
    x = torch.randn(8, c, 32, 32)
    if channels_last:
        base = base.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    torch._dynamo.reset()
    fastcompile.reset()
    runs = {cfg: make(cfg, copy.deepcopy(base)) for cfg in CONFIGS}
    with torch.no_grad():
        ref = base(x)
        ok = {}
        for cfg, f in runs.items():
            for _ in range(3):
                out = f(x)
            ok[cfg] = torch.allclose(out, ref, rtol=1e-4, atol=1e-4) and out.stride() == ref.stride()
        ts = {cfg: [] for cfg in CONFIGS}
        rng = random.Random(1)
        for _ in range(iters):
            order = list(CONFIGS)
            rng.shuffle(order)
            for cfg in order:
                t0 = time.perf_counter()
                runs[cfg](x)
                ts[cfg].append(time.perf_counter() - t0)
    rows = []
    for cfg in CONFIGS:
        rows.append(
            (
                c,
                "channels_last" if channels_last else "NCHW",
                cfg,
                statistics.median(ts[cfg]) * 1e3,
                paired(ts["eager"], ts[cfg]),
                paired(ts["inductor"], ts[cfg]),
                ok[cfg],
            )
        )
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="few iterations (smoke run)")
    ap.add_argument("--iters", type=int, default=400, help="interleaved iterations per case (default 400)")
    args = ap.parse_args(argv)
    iters = 10 if args.quick else args.iters
    print("torch %s, %d threads" % (torch.__version__, torch.get_num_threads()))
    rows = []
    for c in (16, 64):
        for cl in (False, True):
            rows += bench(c, cl, iters)
    print(
        "%4s %-14s %-12s %9s  %-21s %-21s %s"
        % ("C", "layout", "backend", "ms/iter", "vs eager (95% CI)", "vs ind (95% CI)", "matches eager")
    )
    for c, lay, cfg, ms, ve, vi, ok in rows:
        print("%4d %-14s %-12s %9.3f  %.3f (%.3f-%.3f)   %.3f (%.3f-%.3f)   %s" % ((c, lay, cfg, ms) + ve + vi + (ok,)))


if __name__ == "__main__":
    main()
