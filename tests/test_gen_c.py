"""The C renderer's output for representative graphs, held as golden text.

Each case builds a graph with the graph API, runs it once on a fixed input layout (the layout
picks the kernel form: flat, strided, row reduction, column block) and compares every kernel's
C source with tests/golden/c/<case>.c. A refactor of the core or the runtime then shows its
kernel text is byte-identical. FASTCOMPILE_UPDATE_GOLDEN=1 rewrites the goldens; a missing
golden fails, so a new case is written on purpose. The header's "from <file>:<line>" is not
part of a golden: it moves with this file.
"""

import os
import re

import numpy as np
import pytest

from fastcompile.graph import Graph

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden", "c")
UPDATE = os.environ.get("FASTCOMPILE_UPDATE_GOLDEN", "") not in ("", "0")


def _flat(g, x):
    return [g.call("gelu", g.call("mul", x, 2.0))]


def _softmax(g, x):
    return [g.call("softmax", x, axis=-1)]


def _layernorm(g, x):
    mean = g.call("mean", x, axis=-1, keepdim=True)
    d = g.call("sub", x, mean)
    var = g.call("mean", g.call("mul", d, d), axis=-1, keepdim=True)
    return [g.call("mul", d, g.call("rsqrt", g.call("add", var, 1e-5)))]


def _column_sum(g, x):
    return [g.call("sum", g.call("exp", x), axis=0)]


def _multi_output(g, x, y):
    s = g.call("add", x, y)  # an intermediate that is also an output
    return [s, g.call("tanh", s)]


def _c_order(shape):
    return np.linspace(-3.0, 3.0, int(np.prod(shape)), dtype=np.float32).reshape(shape)


# case name -> (graph builder, input ranks, inputs for the one call that builds the kernels,
#               for each kernel a text its source must hold: the form the case stands for)
CASES = {
    "pointwise_flat": (_flat, [2], lambda: [_c_order((64, 64))], [" * 2 ops, pointwise (flat) */"]),
    "pointwise_strided": (_flat, [2], lambda: [_c_order((64, 64)).T[::2]], [" * 2 ops, pointwise */"]),
    "softmax_rows": (_softmax, [2], lambda: [_c_order((32, 100))], [", reduction, 3 sweeps per row */"]),
    "layernorm_rows": (_layernorm, [2], lambda: [_c_order((32, 100))], [", reduction, 3 sweeps per row */"]),
    "column_block": (_column_sum, [2], lambda: [_c_order((300, 40))], ["_cols("]),
    "multi_output": (
        _multi_output,
        [2, 2],
        lambda: [_c_order((16, 8)), _c_order((16, 8)) + 1],
        ["float *restrict out1 = "],
    ),
}


def _kernels(case):
    build, ranks, inputs, _ = CASES[case]
    g = Graph()
    ins = [g.input("float32", nd) for nd in ranks]
    g.output(*build(g, *ins))
    c = g.compile()
    c(*inputs())
    return c.kernels


def check_golden(name, text):
    text = re.sub(r" \* graph (\w+) from .*\n", r" * graph \1\n", text)
    path = os.path.join(GOLDEN, name)
    if UPDATE:
        with open(path, "w") as f:
            f.write(text)
    if not os.path.exists(path):
        pytest.fail("no golden %s (FASTCOMPILE_UPDATE_GOLDEN=1 writes it)" % path)
    with open(path) as f:
        assert f.read() == text, "%s changed; FASTCOMPILE_UPDATE_GOLDEN=1 rewrites it" % path


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_kernel(case):
    kernels = _kernels(case)
    forms = CASES[case][3]
    assert len(kernels) == len(forms), [k.fused for k in kernels]
    for i, (k, form) in enumerate(zip(kernels, forms)):
        assert form in k.source, (case, form)
        check_golden("%s%s.c" % (case, "" if len(kernels) == 1 else "_%d" % i), k.source)


def test_every_golden_has_a_case():
    names = {f[:-2] for f in os.listdir(GOLDEN) if f.endswith(".c")}
    assert names, "no C goldens"
    assert names <= set(CASES), "stale goldens: %s" % sorted(names - set(CASES))
