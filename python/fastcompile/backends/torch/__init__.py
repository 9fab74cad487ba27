"""torch.compile backend: FX graphs (aten ops, via aot_autograd) -> the fastcompile graph API.

In: a ``torch.fx.GraphModule`` and example inputs (Dynamo's backend contract). Out: a callable on
the graph's flat tensor inputs. ``backend`` routes through aot_autograd (core aten decompositions;
forward and backward graphs both lowered here); ``fx_to_graph`` lowers one FX graph.

Lowering. Every FX tensor value becomes a value of one ``fastcompile.graph.Graph``:
  - pointwise ops, reductions, softmax/log_softmax, where, clamp and casts become core ops
    (the core fuses them into a few kernels); layer_norm, rms_norm, batch_norm, var_mean, gelu's
    backward, ... reach us decomposed into those;
  - views and expands that only add or drop leading size-1 dims, or broadcast, cost nothing: a
    core value keeps its own shape (``cshape``), which broadcasts to the torch shape (``tshape``);
  - everything else (mm, addmm, bmm, conv, embedding, index ops, cat, random ops, other views,
    unknown ops) runs as torch on torch tensors inside an extern call. Consecutive such nodes form
    one extern "cluster" (one Python call for e.g. ``bmm -> view -> transpose``); an unknown op
    never fails compilation.
Data crosses the boundary without copies: CPU tensors go in as ``t.numpy()`` views, results come
back as ``torch.from_numpy``. bfloat16 (NumPy has none) is carried as float32 inside the core:
bf16 inputs are widened once on entry, externs narrow their bf16 arguments back (so an extern
sees exactly the bf16 tensors eager would) and bf16 outputs are rounded on exit. Like Inductor,
pointwise chains on bf16/fp16 round only where a value leaves the core, not after every op; an
explicit conversion into a half type (.to(torch.bfloat16)) rounds where it is, as eager's does.

Symbolic sizes (dynamic=True, mark_dynamic, Dynamo's automatic dynamic after a size change): the
graph is lowered once per set of concrete sizes, at the call that brings it (``_PerSize``); the
kernels take their sizes at launch, so a new size compiles none.

Whole-graph fallbacks (the graph runs as plain torch, with a logged reason): tensors on several
CUDA devices or on a device other than the CPU and CUDA, and a complex/quantized/float8 tensor
that would have to enter the core.

The package follows the stages of a compile: ``compile_fx`` (the backend: aot_autograd, per-size
and deferred compiles), ``decomposition`` (the table aot_autograd applies), ``lowering`` (the walk
over one FX graph) with its op handlers in ``registry``, ``pointwise``, ``views`` and
``reductions``, ``externs`` (the generated functions of extern clusters), ``channels_last``
(convolutions in that order, relayouts), ``values`` (dtypes, records, torch <-> core arrays,
layouts) and ``runner`` (the compiled callable of one graph, batch and async compile).
"""

import os

# Where torch ships its own renamed libgomp, our kernels load a second OpenMP runtime; with both
# spinning after their parallel regions (libgomp's default) each starves the other. Ours starts
# at the first kernel load, so this reaches it; an explicit OMP_WAIT_POLICY wins. Where torch's
# libgomp has the soname libgomp.so.1 (the CPU wheel), the kernels share torch's runtime, already
# started: no effect. Set before any submodule imports fastcompile._C.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .compile_fx import MODES as MODES, backend  # noqa: E402
from .decomposition import decompositions  # noqa: E402
from .runner import FxGraphRunner, fx_to_graph  # noqa: E402

__all__ = ["backend", "fx_to_graph", "decompositions", "FxGraphRunner"]
