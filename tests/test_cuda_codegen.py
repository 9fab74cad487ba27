"""CUDA codegen without a GPU: gen_cuda renders, NVRTC compiles (tinygrad's test/null).

Every kernel of the op x dtype matrix of test_ops.py (unary, binary, casts,
reductions, softmax/layernorm-style multi-sweep rows) is rendered by
Compiled._cuda_render and compiled by NVRTC for sm_80 and sm_90, through the
disk cache. Golden texts in tests/golden/cuda/ guard the renderer's output
(FASTCOMPILE_UPDATE_GOLDEN=1 rewrites them). The tests skip, with the reason,
when NVRTC cannot be found (pip install nvidia-cuda-nvrtc-cu12, the `test`
extra pulls it); nothing here needs a device.
"""

import os
import re

import numpy as np
import pytest

import fastcompile
from fastcompile import _C
from fastcompile.graph import Graph
from test_ops import BINARY, DTYPES, UNARY, binary_value, call_op

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden", "cuda")
UPDATE = os.environ.get("FASTCOMPILE_UPDATE_GOLDEN", "") not in ("", "0")
ARCHS = ["sm_80", "sm_90"]
ALL_DTYPES = DTYPES + ["bfloat16"]

INFO = fastcompile.cuda_info()
needs_nvrtc = pytest.mark.skipif(not INFO["nvrtc"], reason="NVRTC not found: %s" % INFO["nvrtc_error"])


def render(build, metas, *args):
    g = Graph()
    ins = [g.input(dt, nd) for dt, nd in metas]
    g.output(*build(g, *ins))
    return g.compile()._cuda_render(*(args or [(dt, nd) for dt, nd in metas]))


def compile_all(kernels, arch):
    out = []
    for k in kernels:
        r = _C._cuda_compile(k["source"], arch)
        assert r["kind"] == "cubin" and r["arch"] == arch
        assert r["image"][:4] == b"\x7fELF", "a cubin is an ELF file"
        out.append(r)
    return out


# ---------------------------------------------------------------------------
# the renderer alone (no NVRTC needed)
# ---------------------------------------------------------------------------


def gelu_kernels():
    return render(lambda g, x: [g.call("gelu", x)], [("float32", 2)])


def softmax_kernels():
    return render(lambda g, x: [g.call("softmax", x, axis=-1)], [("float32", 2)])


def check_golden(name, text):
    # the header's "from <file>:<line>" moves with this file: not part of the golden
    text = re.sub(r" \* graph (\w+) from .*\n", r" * graph \1\n", text)
    path = os.path.join(GOLDEN, name)
    if UPDATE or not os.path.exists(path):
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert f.read() == text, "%s changed; FASTCOMPILE_UPDATE_GOLDEN=1 rewrites it" % path


def test_golden_gelu():
    (k,) = gelu_kernels()
    check_golden("gelu.cu", k["source"])


def test_golden_softmax():
    (k,) = softmax_kernels()
    assert k["reduction"]
    check_golden("softmax.cu", k["source"])


def test_pointwise_shape():
    """flat kernels index with i; strided ones unravel i; both entry points exist; a trip loads
    its 4 (8 for 2-byte operands) elements a thread before it computes and stores any"""
    (flat,) = gelu_kernels()
    src = flat["source"]
    assert "_i32(" in src and "_i64(" in src and "fc_gelu_f32(" in src
    assert "pf1[u] = in0[i];" in src and "float pf1[4];" in src and "fc_cu_offsets" not in src
    assert src.index("pf1[u] = in0[i];") < src.index("= pf1[u];") < src.index("out0[i] =")
    (strided,) = render(lambda g, x: [g.call("exp", x)], [("float32", 2)], np.zeros((5, 6), np.float32).T)
    assert "fc_cu_offsets<I, 2, 2>(i, (int)L.nd_outer, L.oshape, L.ostride, po[u]);" in strided["source"]
    assert "pf1[u] = in0[po[u][1]];" in strided["source"] and "out0[po[u][0]] =" in strided["source"]
    (half,) = render(lambda g, x: [g.call("exp", x)], [("float16", 1)])
    assert "uint16_t pf1[8];" in half["source"]


def test_half_types_compute_in_float32():
    for dt, fn in [("float16", "f16"), ("bfloat16", "bf16")]:
        (k,) = render(lambda g, x: [g.call("mul", g.call("sigmoid", x), x)], [(dt, 1)])
        src = k["source"]
        assert "fc_load_%s(" % fn in src and "fc_store_%s(" % fn in src
        assert "fc_sigmoid_f32(" in src and "uint16_t *__restrict__ out0" in src


def test_softmax_is_one_kernel_one_block_per_row():
    (k,) = softmax_kernels()
    src = k["source"]
    assert src.count("fc_cu_block_reduce(") == 3  # max (+ its NaN flag), sum
    assert "for (I o = blockIdx.x;" in src and "j += FC_CU_THREADS" in src


@pytest.mark.parametrize(
    "case, dtype, blocks",
    [
        ("softmax", "float32", 4),
        ("softmax", "bfloat16", 4),
        ("layernorm", "float32", 4),
        ("layernorm_affine", "float32", 2),
        ("layernorm_affine", "bfloat16", 2),
        ("softmax", "float64", 1),
        ("layernorm_affine", "float64", 1),
    ],
)
def test_reduction_register_budget_follows_the_row_cache(case, dtype, blocks):
    """__launch_bounds__'s blocks per SM: 4 (64 registers) when the row cache holds one input of
    up to 4 bytes, 2 for three (a layernorm's x, weight and bias), 1 with 8-byte operands; at 64
    registers the latter spilled 150-1000 bytes a thread. Each entry point asks the same."""

    def ln(g, x, *wb):
        mu = g.call("mean", x, axis=-1, keepdims=True)
        d = g.call("sub", x, mu)
        var = g.call("mean", g.call("mul", d, d), axis=-1, keepdims=True)
        y = g.call("mul", d, g.call("rsqrt", g.call("add", var, 1e-5)))
        return [g.call("add", g.call("mul", y, wb[0]), wb[1]) if wb else y]

    build, metas = {
        "softmax": (lambda g, x: [g.call("softmax", x, axis=-1)], [(dtype, 2)]),
        "layernorm": (ln, [(dtype, 2)]),
        "layernorm_affine": (ln, [(dtype, 2), (dtype, 1), (dtype, 1)]),
    }[case]
    (k,) = render(build, metas)
    asked = re.findall(r"__launch_bounds__\(FC_CU_THREADS, FC_CU_RED_BLOCKS_OR\((\d+)\)\)", k["source"])
    assert asked == [str(blocks)] * 2


def test_layernorm_is_one_kernel():
    def ln(g, x):
        mu = g.call("mean", x, axis=-1, keepdim=True)
        d = g.call("sub", x, mu)
        var = g.call("mean", g.call("mul", d, d), axis=-1, keepdim=True)
        return [g.call("mul", d, g.call("rsqrt", g.call("add", var, 1e-5)))]

    ks = render(ln, [("float32", 2)])
    assert len(ks) == 1 and ks[0]["reduction"]


def test_needs_nonempty_flag():
    (k,) = render(lambda g, x: [g.call("amax", x, axis=-1)], [("float32", 2)])
    assert k["needs_nonempty"]
    (k,) = render(lambda g, x: [g.call("sum", x, axis=-1)], [("float32", 2)])
    assert not k["needs_nonempty"]


def test_cuda_info_without_gpu():
    info = fastcompile.cuda_info()
    for key in (
        "nvrtc",
        "nvrtc_path",
        "nvrtc_version",
        "driver",
        "driver_version",
        "device_count",
        "why_no_device",
        "nvrtc_archs",
    ):
        assert key in info
    if info["device_count"] == 0:
        assert isinstance(info["why_no_device"], str) and info["why_no_device"]
    else:
        assert info["why_no_device"] is None


class FakeCudaArray:
    """speaks just enough DLPack to say it lives on CUDA device 0"""

    def __dlpack_device__(self):
        return (2, 0)


def test_cuda_array_clear_error():
    g = Graph()
    x = g.input("float32", 1)
    g.output(g.call("exp", x))
    c = g.compile()
    with pytest.raises(RuntimeError, match="CUDA device 0"):
        c(FakeCudaArray())
    # the CPU path is untouched
    np.testing.assert_allclose(c(np.zeros(3, np.float32))[0], np.ones(3, np.float32))


def test_cuda_tensor_clear_error_torch_meta():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a real CUDA device is present: tests/gpu/ covers it")
    g = Graph()
    x = g.input("float32", 1)
    g.output(g.call("exp", x))
    c = g.compile()
    with pytest.raises((RuntimeError, TypeError)):
        c(torch.empty(3, device="meta"))


# ---------------------------------------------------------------------------
# NVRTC
# ---------------------------------------------------------------------------


@needs_nvrtc
def test_compile_error_has_log_and_numbered_source():
    with pytest.raises(RuntimeError) as e:
        _C._cuda_compile(
            '#include "fc_cuda_kernel.h"\nextern "C" __global__ void k() { undefined_thing(); }\n', "sm_80"
        )
    msg = str(e.value)
    assert "NVRTC_ERROR_COMPILATION" in msg and "undefined_thing" in msg
    assert "--- NVRTC log ---" in msg and "   2  extern" in msg


@needs_nvrtc
def test_bad_arch():
    with pytest.raises(ValueError, match="sm_90"):
        _C._cuda_compile("", "compute90")


@needs_nvrtc
def test_ptx_fallback_for_unknown_arch():
    (k,) = gelu_kernels()
    r = _C._cuda_compile(k["source"], "sm_990")
    assert r["kind"] == "ptx" and r["arch"].startswith("compute_")
    assert b".entry" in r["image"]


@needs_nvrtc
def test_disk_cache_hit():
    (k,) = gelu_kernels()
    a = _C._cuda_compile(k["source"], "sm_80")
    b = _C._cuda_compile(k["source"], "sm_80")
    assert b["cached"] and a["key"] == b["key"] and a["image"] == b["image"]
    assert a["source_path"] == b["source_path"] and a["source_path"].endswith(a["key"] + ".cu")
    with open(a["source_path"]) as f:
        assert f.read() == k["source"]  # the source beside its cubin
    c = _C._cuda_compile(k["source"], "sm_90")
    assert c["key"] != a["key"]


@needs_nvrtc
def test_cubin_key_index_width_and_fmad():
    """Each NVRTC option is part of the key: the index width the runtime compiles (one entry
    point per cubin) and config.cuda_fmad (--fmad)."""
    (k,) = gelu_kernels()
    name = re.search(r"(fc_\w+)_i32\(", k["source"]).group(1)
    i32 = _C._cuda_compile(k["source"], "sm_80", "-DFC_CU_INDEX=32")
    i64 = _C._cuda_compile(k["source"], "sm_80", "-DFC_CU_INDEX=64")
    both = _C._cuda_compile(k["source"], "sm_80")
    assert len({i32["key"], i64["key"], both["key"]}) == 3
    assert (name + "_i32").encode() in i32["image"] and (name + "_i64").encode() not in i32["image"]
    assert (name + "_i64").encode() in i64["image"] and (name + "_i32").encode() not in i64["image"]
    with pytest.raises(ValueError):
        _C._cuda_compile(k["source"], "sm_80", "FC_CU_INDEX=32")
    try:
        fastcompile.config.set(cuda_fmad=True)
        fmad = _C._cuda_compile(k["source"], "sm_80", "-DFC_CU_INDEX=32")
    finally:
        fastcompile.config.set(cuda_fmad=False)
    assert fmad["key"] != i32["key"] and not fmad["cached"]
    again = _C._cuda_compile(k["source"], "sm_80", "-DFC_CU_INDEX=32")
    assert again["cached"] and again["key"] == i32["key"]


def _unary(dt):
    def build(g, x):
        a = g.call("cast", x, dtype=dt)
        return [call_op(g, op, a) for op in UNARY if UNARY[op][2](dt if dt != "bfloat16" else "float16")]

    return build


def _binary(dt):
    probe = dt if dt != "bfloat16" else "float16"

    def build(g, x, y):
        a, b = g.call("cast", x, dtype=dt), g.call("cast", y, dtype=dt)
        if dt == "bfloat16":  # binary_value builds NumPy scalars, which have no bfloat16
            return [call_op(g, op, a, b) for op in BINARY if BINARY[op][2](probe)]
        return [binary_value(g, op, a, b) for op in BINARY if BINARY[op][2](probe)]

    return build


def _casts(dt):
    def build(g, x):
        return [g.call("cast", x, dtype=d) for d in ALL_DTYPES if d != dt]

    return build


def _reductions(dt):
    def build(g, x):
        outs = []
        for op in ("sum", "prod", "amax", "amin", "argmax", "argmin", "any", "all"):
            outs.append(g.call(op, x, axis=-1))
        return outs

    return build


def _rows(dt):
    """softmax, log_softmax, var (multi-sweep rows), over the first axis (strided rows)"""

    def build(g, x):
        return [
            g.call("softmax", x, axis=0),
            g.call("log_softmax", x, axis=-1),
            g.call("var", x, axis=-1),
            g.call("logsumexp", x, axis=None),
        ]

    return build


FAMILIES = {
    "unary": (_unary, 1),
    "binary": (_binary, 2),
    "cast": (_casts, 1),
    "reduce": (_reductions, 1),
    "rows": (_rows, 1),
}


def family_cases():
    out = []
    for fam in FAMILIES:
        for dt in ALL_DTYPES:
            if fam == "rows" and dt not in ("float16", "bfloat16", "float32", "float64", "int32"):
                continue
            out.append(pytest.param(fam, dt, id="%s-%s" % (fam, dt)))
    return out


@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family,dtype", family_cases())
def test_matrix_compiles(family, dtype, arch):
    """every op of the family for this dtype, fused into one kernel per layout
    (contiguous, and strided/broadcast), rendered and NVRTC-compiled"""
    build, nin = FAMILIES[family]
    metas = [(dtype, 2)] * nin
    kernels = render(build(dtype), metas)
    # strided (not contiguous) and broadcast (size-1 dims) inputs: the unravel path
    kernels += render(build(dtype), metas, *[(dtype, 2, 1 << i, False) for i in range(nin)])
    assert kernels
    # Kernels that do not depend on the layout (the reduce and rows families: 28 of the 160
    # kernels per arch) come out of the strided render as the same text as from the contiguous
    # one but for the header's " * graph <id> from <file>:<line>" comment (another graph), which
    # the NVRTC disk cache keys on: each distinct kernel text is compiled once.
    seen, distinct = set(), []
    for k in kernels:
        text = re.sub(r" \* graph \w+ from .*\n", "", k["source"])
        if text not in seen:
            seen.add(text)
            distinct.append(k)
    compile_all(distinct, arch)
