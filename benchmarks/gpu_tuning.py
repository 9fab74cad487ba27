"""GPU launch-configuration sweep: the kernels fastcompile generates, under other launch settings.

    python benchmarks/gpu_tuning.py [--log2 28] [--reps 20]

For GELU and x*sigmoid(x)*y (flat pointwise kernels) and softmax and layernorm over rows of 4096
(one block per row), in float32 and bfloat16: the kernel text gen_cuda writes, compiled again
with other values of the macros it leaves to fc_cuda_kernel.h (FC_CU_THREADS, FC_CU_VEC_UNROLL,
FC_CU_ROWCACHE, FC_CU_RED_BLOCKS) and launched with other grid sizes, through a small entry point
that fills the launch struct (CuPy compiles and launches it; fastcompile's own runtime always
uses the defaults). Each row: GB/s (inputs read once + outputs written once over the median of
CUDA-event times), the share of the device-to-device copy ceiling, the registers a thread uses,
and the largest difference from the default variant's output (a variant must compute the same
thing). The first row of each workload is the runtime's default. "blocks/SM" is the minimum that
__launch_bounds__ asks for (FC_CU_RED_BLOCKS; by default gen_cuda's choice, red_blocks), which caps
the registers. Needs a GPU and CuPy; refuses to run without them.
"""

import argparse
import os
import re
import statistics
import sys

import numpy as np

from gpu import BUILDS  # the four workloads of benchmarks/gpu.py (this folder)


def die(msg):
    print("benchmarks/gpu_tuning.py: " + msg, file=sys.stderr)
    sys.exit(2)


ENTRY = """
extern "C" __global__ void __launch_bounds__(FC_CU_THREADS%(bounds)s)
fc_tune(char *p0, char *p1, char *p2, long long n_outer, long long n_inner)
{
    %(name)s_launch L;
    char *ps[3] = {p0, p1, p2};
    L.n_outer = n_outer;
    L.n_inner = n_inner;
    L.nd_outer = 1;
    L.nd_inner = n_inner > 1 ? 1 : 0;
    L.err = 0;
    for (int q = 0; q < %(nops)d; q++) {
        L.ptr[q] = ps[q];
        for (int d = 0; d < %(nd)d; d++) {
            L.ostride[q][d] = n_inner > 1 ? n_inner : 1;
            L.istride[q][d] = 1;
        }
    }
    for (int d = 0; d < %(nd)d; d++) {
        L.oshape[d] = n_outer;
        L.ishape[d] = n_inner;
    }
    %(name)s_body<int32_t>(L);
}
"""


def kernel_of(build, dname, nd, nin):
    from fastcompile.graph import Graph

    g = Graph()
    ins = [g.input(dname, nd) for _ in range(nin)]
    g.output(*build(g, *ins))
    (k,) = g.compile()._cuda_render(*[(dname, nd)] * nin)
    return k


def float_accumulators(src):
    """the kernel text with its float64 accumulators (sums) made float32: what the double
    arithmetic and its conversions cost (the results differ in the last bits)"""
    src = re.sub(r"\bdouble (acc\d+)", r"float \1", src)
    src = re.sub(r"(acc\d+ \+= )\(double\)", r"\1", src)
    return re.sub(r"__shared__ double", "__shared__ float", src)


def variants(reduction, sms, n, V, rows, per_thread):
    """(label, macros, threads, grid[, transform of the kernel text]) to try, the runtime's
    default first (one trip a thread, a block a row: csrc/runtime/cuda.c grid_of); "8 blocks of
    256/SM" and "32/SM" are the grids it used before (one wave looping over the data); "what-if"
    rows change the kernel's arithmetic, to learn what a part of it costs"""
    if not reduction:
        out = [("default: 256 threads, 2 vectors, grid one trip", {}, 256, -(-n // (256 * per_thread)))]
        for t in (128, 256, 512):
            for u in (1, 2, 4):
                one_shot = -(-n // (t * u * V))
                for grid, gl in (
                    (min(-(-n // (t * 4)), sms * 8 * 256 // t), "8 blocks of 256/SM"),
                    (one_shot, "one trip"),
                ):
                    out.append(
                        (
                            "%d threads, %d vector%s, grid %s" % (t, u, "s" if u > 1 else "", gl),
                            {"FC_CU_THREADS": t, "FC_CU_VEC_UNROLL": u},
                            t,
                            grid,
                        )
                    )
        return out
    out = [
        ("default: 256 threads, 16 a thread, 4 blocks/SM, grid a block per row", {}, 256, rows),
        (
            "what-if, not the runtime's arithmetic: float accumulators (default launch)",
            {},
            256,
            rows,
            float_accumulators,
        ),
    ]
    for t, rc in ((128, 32), (256, 16), (512, 8), (1024, 4)):
        if rc % V:
            continue
        for blocks in sorted({max(1, 1024 // t), max(1, 2048 // t)}):
            for grid, gl in ((min(rows, sms * 32), "32/SM"), (rows, "a block per row")):
                out.append(
                    (
                        "%d threads, %d a thread, %d blocks/SM, grid %s" % (t, rc, blocks, gl),
                        {"FC_CU_THREADS": t, "FC_CU_ROWCACHE": rc, "FC_CU_RED_BLOCKS": blocks},
                        t,
                        grid,
                    )
                )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2", type=int, default=28)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    args = ap.parse_args()
    try:
        import cupy as cp
    except ImportError:
        die("needs CuPy")
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no device")
    except Exception as e:  # noqa: BLE001 (any CUDA error: no GPU to measure)
        die("needs a CUDA GPU (%s); nothing was measured" % e)
    import fastcompile

    inc = os.path.join(os.path.dirname(fastcompile.__file__), "include")
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    n = 1 << args.log2
    rows = n // 4096

    def timed(fn):
        for _ in range(3):
            fn()
        cp.cuda.Device().synchronize()
        ts = []
        for _ in range(args.reps):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
        return statistics.median(ts)

    print(
        "device: %s, %d SMs, CuPy %s, 2^%d elements"
        % (cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode(), sms, cp.__version__, args.log2)
    )
    for dname in args.dtypes.split(","):
        size = 4 if dname == "float32" else 2
        src_f = cp.random.standard_normal(n, dtype=cp.float32)
        y_f = cp.random.standard_normal(n, dtype=cp.float32)
        if dname == "float32":
            x, y = src_f, y_f
        else:  # bfloat16 bits (truncated float32)
            x = (src_f.view(cp.uint32) >> 16).astype(cp.uint16)
            y = (y_f.view(cp.uint32) >> 16).astype(cp.uint16)
        out = cp.empty_like(x)
        t_copy = timed(lambda: out.__setitem__(slice(None), x))
        copy_bw = 2 * n * size / t_copy / 1e9
        print("\n### %s: copy ceiling %.0f GB/s\n" % (dname, copy_bw))
        print("| workload | variant | regs (local bytes) | GB/s | % copy | max diff vs default |")
        print("|---|---|---|---|---|---|")
        for name, (build, nd, nin) in BUILDS.items():
            if args.only and name not in args.only.split(","):
                continue
            k = kernel_of(build, dname, nd, nin)
            V = 16 // size
            reduction = bool(k["reduction"])
            bounds = re.search(r"__launch_bounds__\(FC_CU_THREADS(, FC_CU_RED_BLOCKS_OR\(\d+\))?\)", k["source"])
            src = k["source"] + ENTRY % dict(
                name=k["name"], nops=k["nops"], nd=max(1, k["nd"]), bounds=bounds.group(1) or ""
            )
            nbytes = (nin + 1) * n * size
            ref = None
            for label, macros, threads, grid, *xform in variants(reduction, sms, n, V, rows, k["per_thread"]):
                opts = ["--std=c++17", "--fmad=false", "-I" + inc, "-DFC_CU_INDEX=32"] + [
                    "-D%s=%d" % kv for kv in macros.items()
                ]
                try:
                    code = xform[0](src) if xform else src
                    fn = cp.RawModule(code=code, options=tuple(opts)).get_function("fc_tune")
                except Exception as e:  # noqa: BLE001 (a variant that does not compile: say so, go on)
                    print("| %s | %s | | does not compile: %s | | |" % (name, label, str(e).splitlines()[0][:80]))
                    continue
                ptrs = [out, x] + ([y] if nin > 1 else [out])
                n_outer, n_inner = (rows, 4096) if reduction else (n, 1)

                def launch(fn=fn, grid=grid, threads=threads, ptrs=ptrs, n_outer=n_outer, n_inner=n_inner):
                    fn((grid,), (threads,), (ptrs[0], ptrs[1], ptrs[2], np.int64(n_outer), np.int64(n_inner)))

                launch()
                got = out.view(cp.float32) if dname == "float32" else (out.astype(cp.uint32) << 16).view(cp.float32)
                if ref is None:
                    ref = got.copy()
                    diff = 0.0
                else:
                    diff = float(cp.abs(got - ref).max())
                t = timed(launch)
                regs = "%s (%s)" % (getattr(fn, "num_regs", "?"), getattr(fn, "local_size_bytes", "?"))
                print(
                    "| %s | %s | %s | %.0f | %.0f%% | %.3g |"
                    % (name, label, regs, nbytes / t / 1e9, 100 * nbytes / t / 1e9 / copy_bw, diff),
                    flush=True,
                )
            del ref


if __name__ == "__main__":
    main()
