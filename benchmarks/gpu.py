"""GPU benchmark skeleton: memory-bound kernels against the device-to-device copy ceiling.

    python benchmarks/gpu.py [--dtypes float32,bfloat16] [--min-log2 20] [--max-log2 28]

Rows: copy (D2D, counts read + write bytes: the ceiling, ~3.0 TB/s on H100 and
~4.3 TB/s on H200), then for GELU, x*sigmoid(x)*y, softmax and layernorm
(last axis, rows of 4096) in float32 and bfloat16 over 2^20..2^28 elements:
torch eager, torch.jit.script (GELU only), inductor (torch.compile), and
fastcompile. Timing: CUDA events, warm-up, median of 50 runs, bytes = inputs
read once + outputs written once. Refuses to run without a GPU.
"""
import argparse
import statistics
import sys


def die(msg):
    print("benchmarks/gpu.py: " + msg, file=sys.stderr)
    sys.exit(2)


def timed(fn, reps=50, warmup=5):
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def cases(torch):
    F = torch.nn.functional

    def gelu(x, y):
        return F.gelu(x)

    def silu_mul(x, y):
        return x * torch.sigmoid(x) * y

    def softmax(x, y):
        return torch.softmax(x.view(-1, 4096), dim=-1)

    def layernorm(x, y):
        return F.layer_norm(x.view(-1, 4096), (4096,))
    # name -> (fn, inputs read, outputs written), in arrays of n elements
    return {"gelu": (gelu, 1, 1), "x*sigmoid(x)*y": (silu_mul, 2, 1), "softmax": (softmax, 1, 1),
            "layernorm": (layernorm, 1, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--min-log2", type=int, default=20)
    ap.add_argument("--max-log2", type=int, default=28)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        die("needs torch with CUDA")
    import fastcompile
    info = fastcompile.cuda_info()
    if not torch.cuda.is_available() or info["device_count"] == 0:
        die("needs a CUDA GPU and none is usable here (%s); nothing was measured"
            % (info["why_no_device"] or "torch.cuda.is_available() is False"))
    print("device: %s, NVRTC %s" % (torch.cuda.get_device_name(0), info["nvrtc_version"] or "missing"))
    for dname in args.dtypes.split(","):
        dt = getattr(torch, dname)
        for lg in range(args.min_log2, args.max_log2 + 1, 2):
            n = 1 << lg
            x = torch.randn(n, device="cuda", dtype=dt)
            y = torch.randn(n, device="cuda", dtype=dt)
            out = torch.empty_like(x)
            t = timed(lambda: out.copy_(x))
            print("%-16s %-9s 2^%-3d %8.1f GB/s" % ("copy (D2D)", dname, lg, 2 * n * x.element_size() / t / 1e9))
            for name, (fn, nin, nout) in cases(torch).items():
                nbytes = (nin + nout) * n * x.element_size()
                impls = {"eager": fn, "inductor": torch.compile(fn)}
                if name == "gelu":
                    impls["jit.script"] = torch.jit.script(fn)
                # fastcompile: plan execution on CUDA is not wired yet (see README, CUDA);
                # this row reports "n/a" until torch CUDA tensors run through the plan
                impls["fastcompile"] = None
                for impl, f in impls.items():
                    if f is None:
                        print("%-16s %-9s 2^%-3d %-11s n/a" % (name, dname, lg, impl))
                        continue
                    t = timed(lambda: f(x, y))
                    print("%-16s %-9s 2^%-3d %-11s %8.1f GB/s" % (name, dname, lg, impl, nbytes / t / 1e9))


if __name__ == "__main__":
    main()
