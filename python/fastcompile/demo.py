"""The main job: ``python -m fastcompile.demo``.

Compiles a GELU and a softmax with fastcompile's graph API, checks them
against NumPy, and prints eager vs compiled time and where the generated C
lives; then compiles an ordinary NumPy function with fastcompile.compile (the
frame hook and tracer) and prints what explain() found. Sizes are small
enough to run in a few seconds on 2 cores.
"""

import math
import sys
import time

import numpy as np

import fastcompile
from fastcompile.graph import Graph


def median_time(fn, *args, repeat=15):
    fn(*args)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def numpy_gelu(x):
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


def numpy_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def build_gelu():
    g = Graph()
    x = g.input("float32", 2)
    g.output(g.call("gelu", x))
    return g.compile()


def build_softmax():
    g = Graph()
    x = g.input("float32", 2)
    g.output(g.call("softmax", x, axis=-1))
    return g.compile()


def numpy_block(x, bias):
    """An ordinary NumPy function: bias, tanh-GELU, row normalization."""
    h = x + bias
    g = 0.5 * h * (1.0 + np.tanh(0.7978845608 * (h + 0.044715 * h**3)))
    mu = g.mean(axis=-1, keepdims=True)
    d = g - mu
    return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5)


def frontend_demo(x):
    """fastcompile.compile on numpy_block: result, timing, and explain()'s summary."""
    bias = np.linspace(-1, 1, x.shape[1], dtype=np.float32)
    compiled = fastcompile.compile(numpy_block)
    got = compiled(x, bias)  # first call: trace, compile, run
    ref = numpy_block(x, bias)
    err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
    eager_t, comp_t = median_time(numpy_block, x, bias), median_time(compiled, x, bias)
    report = fastcompile.explain(numpy_block)(x, bias)
    print(
        "\nfastcompile.compile(numpy_block): %d graph(s), %d break(s), %d ops -> %d kernel(s), "
        "max |err| %.2e"
        % (
            report.graph_count,
            report.graph_break_count,
            sum(len(o) for o in report.ops_per_graph),
            len(report.kernels),
            err,
        )
    )
    print("  %-28s %8.3f ms" % ("NumPy (the function itself)", eager_t * 1e3))
    print("  %-28s %8.3f ms   (%.1fx)" % ("fastcompile.compile", comp_t * 1e3, eager_t / comp_t))
    for _, name, path in report.kernels:
        print("  generated C: %s" % path)
    return err < 1e-4


def main(argv=None):
    rows, cols = 2048, 1024
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    print(
        "fastcompile %s demo: float32 (%d, %d), %d threads"
        % (fastcompile.__version__, rows, cols, fastcompile.config.resolved()["num_threads"])
    )
    ok = True
    for name, build, eager in [("gelu", build_gelu, None), ("softmax", build_softmax, numpy_softmax)]:
        t0 = time.perf_counter()
        fn = build()
        (out,) = fn(x)  # first call: fuse, generate C, compile or load
        first_ms = (time.perf_counter() - t0) * 1e3
        ref = numpy_gelu(x[:64]) if name == "gelu" else eager(x)
        got = out[:64] if name == "gelu" else out
        err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
        ok &= err < 1e-5
        if name == "gelu":  # NumPy has no erf; time its tanh-free closest: 3 ufunc passes
            eager_t = median_time(lambda a: 0.5 * a * (1.0 + np.tanh(a)), x)
            eager_name = "NumPy 0.5*x*(1+tanh(x))"
        else:
            eager_t = median_time(eager, x)
            eager_name = "NumPy"
        comp_t = median_time(fn, x)
        print(
            "\n%s: %d kernel(s), first call %.1f ms (compile or cache load), max |err| %.2e"
            % (name, len(fn.kernels), first_ms, err)
        )
        print("  %-28s %8.3f ms" % (eager_name, eager_t * 1e3))
        print("  %-28s %8.3f ms   (%.1fx)" % ("fastcompile", comp_t * 1e3, eager_t / comp_t))
        for k in fn.kernels:
            print("  generated C: %s" % k.path)
    ok &= frontend_demo(x)
    s = fastcompile.stats()
    print(
        "\ncompiler calls this run: %d, disk cache hits: %d (cache: %s)"
        % (s["compiles"], s["disk_hits"], s.get("cache_dir", "?"))
    )
    print("results match NumPy" if ok else "RESULTS DIFFER FROM NUMPY")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
