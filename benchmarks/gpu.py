"""GPU benchmark: memory-bound kernels against the device-to-device copy ceiling, side by side.

    python benchmarks/gpu.py [--dtypes float32,bfloat16] [--min-log2 20] [--max-log2 28] [--step 2]

Rows: for GELU, x*sigmoid(x)*y, softmax and layernorm (last axis, rows of 4096) in float32 and
bfloat16 over 2^min..2^max elements: the copy ceiling (D2D, read + write bytes; ~3.0 TB/s on
H100 and ~4.3 TB/s on H200), torch eager, torch.jit.script (GELU only), inductor
(torch.compile) and fastcompile (a core graph called with CUDA tensors), as built by default
(no a*b+c contraction: NumPy's arithmetic bit for bit) and with config.cuda_fmad (fmas, as
nvcc and torch). Each row gives the bandwidth (inputs read once + outputs written once over the
median time), its share of the copy ceiling, and fastcompile's speed-up over each other
implementation (their time / ours).
Timing: CUDA events, 5 warm-ups, median of 50 runs, all implementations of a row in the same
run. Then, per graph, the first call (NVRTC compile into an empty cache folder, load, run) and
NVRTC's own compile time (the kernel's source again as new text).
A result that differs from eager is printed as WRONG and timed all the same; the run then ends
with exit status 2. Refuses to run without a GPU.
"""

import argparse
import statistics
import sys
import tempfile
import time


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
    return {
        "gelu": (gelu, 1, 1),
        "x*sigmoid(x)*y": (silu_mul, 2, 1),
        "softmax": (softmax, 1, 1),
        "layernorm": (layernorm, 1, 1),
    }


def _layernorm(g, x):
    mu = g.call("mean", x, axis=-1, keepdims=True)
    d = g.call("sub", x, mu)
    var = g.call("mean", g.call("mul", d, d), axis=-1, keepdims=True)
    return [g.call("mul", d, g.call("rsqrt", g.call("add", var, 1e-5)))]


# the four workloads as core graphs: name -> (build(g, *inputs), rank, inputs)
BUILDS = {
    "gelu": (lambda g, x: [g.call("gelu", x)], 1, 1),
    "x*sigmoid(x)*y": (lambda g, x, y: [g.call("mul", g.call("mul", x, g.call("sigmoid", x)), y)], 1, 2),
    "softmax": (lambda g, x: [g.call("softmax", x, axis=-1)], 2, 1),
    "layernorm": (_layernorm, 2, 1),
}


def fc_graphs(dname):
    """The same four as fastcompile core graphs: name -> (compiled, how to call it)."""
    from fastcompile.graph import Graph

    def one(name):
        build, nd, nin = BUILDS[name]
        g = Graph()
        ins = [g.input(dname, nd) for _ in range(nin)]
        g.output(*build(g, *ins))
        return g.compile()

    gelu, silu, smax, ln = (one(k) for k in ("gelu", "x*sigmoid(x)*y", "softmax", "layernorm"))
    return {
        "gelu": (gelu, lambda x, y: gelu(x)[0]),
        "x*sigmoid(x)*y": (silu, lambda x, y: silu(x, y)[0]),
        "softmax": (smax, lambda x, y: smax(x.view(-1, 4096))[0]),
        "layernorm": (ln, lambda x, y: ln(x.view(-1, 4096))[0]),
    }


def nvrtc_ms(compiled):
    """NVRTC's own time for the graph's kernels (sum), each compiled as new text (a comment
    line in front: no in-memory cache hit), for the device's arch; median of 3"""
    from fastcompile import _C

    runs = []
    for rep in range(3):
        t = 0.0
        for k in compiled.kernels:
            src = "// nvrtc_ms %d %r\n" % (rep, time.perf_counter()) + k.source
            t0 = time.perf_counter()
            _C._cuda_compile(src, None, "-DFC_CU_INDEX=32")
            t += time.perf_counter() - t0
        runs.append(t * 1e3)
    return statistics.median(runs)


def overhead(torch):
    """Host time per call on a tiny tensor (1024 float32, GELU): the launch path's own cost,
    wall clock over 2000 calls queued back to back, median of 5 runs."""
    x = torch.randn(1024, device="cuda")
    f = fc_graphs("float32")["gelu"][1]
    F = torch.nn.functional

    def per_call(fn):
        runs = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(2000):
                fn(x, None)
            torch.cuda.synchronize()
            runs.append((time.perf_counter() - t0) / 2000 * 1e6)
        return statistics.median(runs)

    f(x, None)
    eager = per_call(lambda a, b: F.gelu(a))
    ours = per_call(f)
    print("per-call overhead, GELU on 1024 float32: torch eager %.1f us, fastcompile %.1f us" % (eager, ours))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--min-log2", type=int, default=20)
    ap.add_argument("--max-log2", type=int, default=28)
    ap.add_argument("--step", type=int, default=2)
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        die("needs torch with CUDA")
    import fastcompile

    info = fastcompile.cuda_info()
    if not torch.cuda.is_available() or info["device_count"] == 0:
        die(
            "needs a CUDA GPU and none is usable here (%s); nothing was measured"
            % (info["why_no_device"] or "torch.cuda.is_available() is False")
        )
    fastcompile.config.set(cache_dir=tempfile.mkdtemp(prefix="fc-gpu-bench-"))  # cold NVRTC compiles
    print(
        "device: %s, torch %s, NVRTC %s (%s), driver %s"
        % (
            torch.cuda.get_device_name(0),
            torch.__version__,
            info["nvrtc_version"] or "missing",
            info["nvrtc_path"],
            info["driver_version"],
        )
    )
    print()
    print(
        "| workload | dtype | n | copy GB/s | eager | jit.script | inductor | fastcompile | fc fmad "
        "| fc % copy | fmad % copy | x eager | x jit | x inductor | x inductor (fmad) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    compile_ms = []
    wrong = []  # rows whose result differs from eager: reported, and exit 1
    dyn = torch._dynamo.config
    for knob in ("recompile_limit", "cache_size_limit"):  # every (dtype, size) compiles anew
        if hasattr(dyn, knob):
            setattr(dyn, knob, 1 << 16)
    for dname in args.dtypes.split(","):
        dt = getattr(torch, dname)
        fcs = fc_graphs(dname)
        fmads = fc_graphs(dname)
        for lg in range(args.min_log2, args.max_log2 + 1, args.step):
            torch._dynamo.reset()
            n = 1 << lg
            x = torch.randn(n, device="cuda", dtype=dt)
            y = torch.randn(n, device="cuda", dtype=dt)
            out = torch.empty_like(x)
            t_copy = timed(lambda: out.copy_(x))  # noqa: F821 (deleted only at the loop's end)
            copy_bw = 2 * n * x.element_size() / t_copy / 1e9
            for name, (fn, nin, nout) in cases(torch).items():
                nbytes = (nin + nout) * n * x.element_size()
                want = fn(x, y)
                for label, fmad, (compiled, call) in (("", False, fcs[name]), (" fmad", True, fmads[name])):
                    fastcompile.config.set(cuda_fmad=fmad)  # read when the first call compiles
                    t0 = time.perf_counter()
                    got = call(x, y)
                    torch.cuda.synchronize()
                    first_ms = (time.perf_counter() - t0) * 1e3
                    fastcompile.config.set(cuda_fmad=False)
                    if lg == args.min_log2:
                        compile_ms.append((name + label, dname, first_ms, nvrtc_ms(compiled), len(compiled.kernels)))
                    err = (got.float() - want.float()).abs().max().item()
                    tol = 1e-3 if dname == "float32" else 5e-2
                    if not err <= tol * max(1.0, want.float().abs().max().item()):
                        wrong.append(
                            "%s%s %s 2^%d: fastcompile differs from eager by %g" % (name, label, dname, lg, err)
                        )
                        print("WRONG: " + wrong[-1], flush=True)
                impls = {"eager": fn}
                if name == "gelu":
                    impls["jit"] = torch.jit.script(fn)
                if not args.no_inductor:
                    impls["inductor"] = torch.compile(fn, dynamic=False)
                impls["fc"] = fcs[name][1]
                impls["fmad"] = fmads[name][1]
                t = {k: timed(lambda f=f: f(x, y)) for k, f in impls.items()}  # noqa: F821 (as above)
                gbs = {k: nbytes / v / 1e9 for k, v in t.items()}

                def cell(k):
                    return "%.0f" % gbs[k] if k in gbs else "-"

                def ratio(k, ours="fc"):
                    return "%.2f" % (t[k] / t[ours]) if k in t else "-"

                print(
                    "| %s | %s | 2^%d | %.0f | %s | %s | %s | %s | %s | %.0f%% | %.0f%% | %s | %s | %s | %s |"
                    % (
                        name,
                        dname,
                        lg,
                        copy_bw,
                        cell("eager"),
                        cell("jit"),
                        cell("inductor"),
                        cell("fc"),
                        cell("fmad"),
                        100 * gbs["fc"] / copy_bw,
                        100 * gbs["fmad"] / copy_bw,
                        ratio("eager"),
                        ratio("jit"),
                        ratio("inductor"),
                        ratio("inductor", "fmad"),
                    ),
                    flush=True,
                )
            del x, y, out
            torch.cuda.empty_cache()
    print()
    overhead(torch)
    print()
    print("per graph: the first call (NVRTC compile, cold cache, + load + run), and NVRTC alone")
    print("(the kernel's source compiled again as new text, median of 3):")
    for name, dname, ms, nv, nk in compile_ms:
        print(
            "  %-20s %-9s first call %7.1f ms, NVRTC %6.1f ms  (%d kernel%s)"
            % (name, dname, ms, nv, nk, "" if nk == 1 else "s")
        )
    st = fastcompile.stats() if hasattr(fastcompile, "stats") else {}
    if st:
        print("fastcompile.stats():", {k: v for k, v in st.items() if "cuda" in k or "compile" in k})
    if wrong:
        die(
            "%d result(s) differ from eager (the rows are timed all the same):\n  %s" % (len(wrong), "\n  ".join(wrong))
        )


if __name__ == "__main__":
    main()
