"""Shared test helpers: NumPy reference comparison, graph runners, array layouts;
fixtures that turn the IR verifier on for every test and give the session a
private, initially empty kernel cache (unless FASTCOMPILE_CACHE_DIR is set).

``assert_close_np(actual, expected, dtype=None, kind="exact")`` is the one
comparison every op test uses. It checks, in this order:

1. ``actual`` is a NumPy array whose dtype is ``dtype`` (default: ``expected.dtype``,
   i.e. the result dtype NumPy gives for the same inputs);
2. the shapes are equal;
3. NaN, +inf and -inf sit at the same positions;
4. the remaining values agree within the tolerance for (dtype, kind) below,
   ``|actual - expected| <= atol + rtol * |expected|`` elementwise.

``expected`` may be a higher-precision reference (float64 or longdouble for a
float16/float32 result, the fp64-golden rule of Inductor's accuracy checks);
it is rounded to ``dtype`` first, so the tolerance is relative to the
correctly rounded answer.

Tolerance table (rtol, atol)::

    kind             bool/int   float16        float32          float64
    exact            exact      exact          exact            exact
    transcendental   exact      1e-3, 1e-7     1.3e-6, 1e-37    1e-14, 1e-300
    reduction        exact      2e-3, 1e-7     1e-5, 1e-37      1e-12, 1e-300
                     (+ a per-element slack the caller passes as ``atol``, e.g.
                      n * eps * sum|x| for a sum; the larger of the two applies)

* ``exact``: arithmetic, comparisons, rounding, min/max, bit ops, casts,
  sqrt, floordiv/remainder: IEEE results are deterministic, so the kernel
  must equal NumPy bit for bit (value-wise; -0.0 vs +0.0 is checked too
  unless ``signed_zeros=False``).
* ``transcendental``: exp/log/trig/erf/pow/atan2/hypot and the activations
  built on them. The kernels call glibc's libmvec (<= 4 ULP) in vectorized
  loops, NumPy calls its own SIMD or libm code (<= 1-4 ULP).
  - float16 computes in float32 and rounds once (both sides), so results
    differ by at most one half-precision ULP (2**-10 ~ 9.8e-4 relative);
    atol 1e-7 covers the subnormal range (ULP 6e-8); an atol of 1e-3 would
    let exp(-10) = 4.5e-5 come out as 0.
  - float32: 1.3e-6 is torch's default rtol (~11 ULP: 4 for libmvec + 4 for
    NumPy + slack; measured: <= 2 ULP). torch's atol 1e-5 assumes O(1) values;
    our inputs include 1e-30, so atol is just above the smallest normal instead
    (results in the subnormal range have only a few significant bits).
  - float64: measured, every libm/libmvec function is within 1 ULP of NumPy
    (2.2e-16); rtol 1e-14 (~45 ULP) leaves room for references computed by a
    different, mathematically equal formula, and catches a float64 op that is
    computed in float32 precision anywhere (~6e-8), which rtol 1e-7 would not.
  - Ops whose argument is rounded before a steep function (gelu's erfc(-x/sqrt2),
    the tanh form's sigmoid(2u)) lose precision in proportion to the condition
    number; tests widen rtol by eps * condition(x) for those, per element.
* ``reduction``: sums in a different order (the kernel accumulates float
  sums in float64, float32 ones over blocks of 16 values a lane (16 rows a
  column in column blocks) in float32 first; NumPy pairwise in the input dtype); callers pass
  ``atol = n * eps * sum(|x|)`` for the cancellation slack. References for
  float16/float32 reductions are computed in float64 (or float32 where NumPy's
  own float32 semantics, e.g. overflow of squares in var, are the contract).
* bool and integer results are always exact.
"""

import gc
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import numpy as np
import pytest

import fastcompile
from fastcompile.graph import Graph

# every dtype the core holds as NumPy does, in the op table's order
NP_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]

TOLERANCES = {
    # kind -> {dtype name -> (rtol, atol)}
    "exact": {},
    "transcendental": {
        "float16": (1e-3, 1e-7),
        "float32": (1.3e-6, 1e-37),
        "float64": (1e-14, 1e-300),
    },
    "reduction": {
        "float16": (2e-3, 1e-7),
        "float32": (1e-5, 1e-37),
        "float64": (1e-12, 1e-300),
    },
}


def _fmt_mismatch(actual, expected, bad, limit=8):
    idx = np.argwhere(bad)[:limit]
    lines = []
    for i in idx:
        i = tuple(int(k) for k in i)
        lines.append("  at %s: got %r, expected %r" % (i, actual[i], expected[i]))
    more = int(bad.sum()) - len(idx)
    if more > 0:
        lines.append("  ... and %d more" % more)
    return "\n".join(lines)


def assert_close_np(actual, expected, dtype=None, kind="exact", *, rtol=None, atol=None, signed_zeros=True, err_msg=""):
    """Compare a fastcompile result with a NumPy reference; see the module docstring."""
    where = (" [%s]" % err_msg) if err_msg else ""
    assert isinstance(actual, np.ndarray), "result is %s, not an ndarray%s" % (type(actual).__name__, where)
    expected = np.asarray(expected)
    want = np.dtype(dtype) if dtype is not None else expected.dtype
    assert actual.dtype == want, "dtype: got %s, expected %s%s" % (actual.dtype, want, where)
    assert actual.shape == expected.shape, "shape: got %s, expected %s%s" % (actual.shape, expected.shape, where)
    if expected.dtype != want:
        # a higher-precision float reference: round it once to the result dtype
        assert expected.dtype.kind == "f" and want.kind == "f" and expected.dtype.itemsize > want.itemsize, (
            "reference dtype %s cannot stand for %s%s" % (expected.dtype, want, where)
        )
        with np.errstate(all="ignore"):
            expected = expected.astype(want)
    if want.kind != "f":
        bad = actual != expected
        assert not bad.any(), "values differ (exact)%s:\n%s" % (where, _fmt_mismatch(actual, expected, bad))
        return
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    for name, fn in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = fn(a) != fn(e)
        assert not bad.any(), "%s positions differ%s:\n%s" % (name, where, _fmt_mismatch(actual, expected, bad))
    fin = np.isfinite(e)
    if kind == "exact" and rtol is None and atol is None:
        bad = fin & (a != e)
    else:
        r0, a0 = TOLERANCES[kind].get(want.name, (0.0, 0.0))
        r = r0 if rtol is None else rtol
        t = a0 if atol is None else np.maximum(atol, a0)
        with np.errstate(all="ignore"):
            bad = fin & (a != e) & ~(np.abs(a - e) <= t + r * np.abs(e))
    assert not bad.any(), "values differ (%s, %s)%s:\n%s" % (kind, want, where, _fmt_mismatch(actual, expected, bad))
    if signed_zeros:
        z = fin & (e == 0) & (a == 0)
        bad = z & (np.signbit(a) != np.signbit(e))
        assert not bad.any(), "sign of zero differs%s:\n%s" % (where, _fmt_mismatch(actual, expected, bad))


# ---------------------------------------------------------------------------
# running graphs
# ---------------------------------------------------------------------------


def run_graph(build, arrays):
    """build(g, *inputs) -> list of Values; returns the outputs of one call."""
    g = Graph()
    ins = [g.input(a.dtype.name, a.ndim) for a in arrays]
    g.output(*build(g, *ins))
    return g.compile()(*arrays)


def run_threads(work, n, switch=1e-5):
    """Runs work(i) for i in range(n), each in its own thread, all released together from a
    barrier, with CPython switching threads every `switch` seconds; returns the repr of each
    exception a thread raised (an empty list: every call went through)."""
    barrier, errors = threading.Barrier(n), []

    def target(i):
        try:
            barrier.wait()
            work(i)
        except Exception as e:  # pragma: no cover - the caller asserts on them
            errors.append(repr(e))

    old = sys.getswitchinterval()
    sys.setswitchinterval(switch)
    try:
        threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return errors


def traced_growth(step, warm, n):
    """Bytes of Python-traced memory that n calls of step() add after warm calls of it (the
    first traced calls fill caches and free lists, so they are not counted)."""
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(warm):
            step()
        gc.collect()
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(n):
            step()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - base


# Prepended to the code of child interpreters that only use the core (graphs, C runtime, disk
# cache): with torch marked absent the child runs as a NumPy-only install (a supported
# configuration: the tracer binds torch only once the process has imported it), which is all
# these children exercise, and nothing in it can pull torch in (2-3 s of CPU per child).
# Children that test the torch integration do not use it.
NO_TORCH = "import sys; sys.modules.setdefault('torch', None)  # see tests/conftest.py NO_TORCH\n"


def run_isolated(code):
    """Run `code` in a fresh interpreter (for graphs that may crash it); returns the
    CompletedProcess. The child uses this session's kernel cache and verifier setting, and does
    not import torch (NO_TORCH)."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        FASTCOMPILE_CACHE_DIR=str(fastcompile.config.get("cache_dir") or ""),
        FASTCOMPILE_VERIFY="1",
    )
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH + textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )


# ---------------------------------------------------------------------------
# layouts: the same logical values stored in different ways (2-D)
# ---------------------------------------------------------------------------


def lay_contig(a):
    return np.ascontiguousarray(a)


def lay_transposed(a):
    return np.ascontiguousarray(a.T).T


def lay_strided(a):
    p = np.zeros((a.shape[0] * 2, a.shape[1] * 3 + 1), a.dtype)
    p[::2, 1::3] = a
    v = p[::2, 1::3]
    assert not v.flags.c_contiguous
    return v


def lay_reversed(a):
    return np.ascontiguousarray(a[::-1, ::-1])[::-1, ::-1]


def lay_empty(a):
    return np.ascontiguousarray(a[:0])


def lay_large(a):
    """contiguous and big enough (90300 elements) to run on several threads"""
    return np.resize(a, (300, 301))


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _fastcompile_cache_dir(tmp_path_factory):
    """A private, initially empty kernel cache unless FASTCOMPILE_CACHE_DIR is set."""
    if os.environ.get("FASTCOMPILE_CACHE_DIR"):
        yield
        return
    old = fastcompile.config.get("cache_dir")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one folder for the run, shared by the xdist workers (as CI's FASTCOMPILE_CACHE_DIR is);
        # getbasetemp() is <run's basetemp>/<worker id>; the runtime creates the folder (0700)
        d = tmp_path_factory.getbasetemp().parent / "fastcompile-cache"
    else:
        d = tmp_path_factory.mktemp("fastcompile-cache")
    fastcompile.config.set(cache_dir=str(d))
    yield
    fastcompile.config.set(cache_dir=old)


@pytest.fixture(autouse=True)
def _fastcompile_verify():
    """Run the IR verifier after every pass in every test."""
    old = fastcompile.config.get("verify")
    if not old:
        fastcompile.config.set(verify=True)
    yield
    if not old:
        fastcompile.config.set(verify=False)


# ---------------------------------------------------------------------------
# pytest-xdist (-n 2 --dist loadgroup)
# ---------------------------------------------------------------------------

# Modules whose tests share nothing compiled (each builds, compiles and checks its own graphs,
# or uses a private cache folder): their tests are spread over the workers one by one.
XDIST_UNGROUPED = {
    "test_torch_backend.py",
    "test_torch_lowering.py",
    "test_torch_training.py",
    "test_cuda_codegen.py",
    "test_cpu_runtime.py",
    "test_random_graphs.py",
}


def pytest_collection_modifyitems(config, items):
    """Under xdist's loadgroup, tests that share compiled work run on one worker: test_ops'
    batched graphs are memoized per dtype (one group per dtype), other modules share module
    fixtures and in-memory kernels (one group per module). Without xdist this does nothing."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        mod = item.path.name
        if mod in XDIST_UNGROUPED:
            continue
        params = item.callspec.params if hasattr(item, "callspec") else {}
        dt = params.get("dtype", params.get("src"))
        group = "%s:%s" % (mod, dt) if mod == "test_ops.py" and isinstance(dt, str) else mod
        item.add_marker(pytest.mark.xdist_group(group))
