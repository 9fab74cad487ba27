"""Extern clusters: consecutive FX nodes the core does not lower, run by one generated Python
function of torch ops.

In: a cluster's FX nodes, its inputs' shapes, dtypes and layouts. Out: the extern function the
core calls (NumPy arrays in and out; CUDA tensors on CUDA).
"""

import operator

import torch
import torch.fx

from ... import pygen
from .channels_last import _CL_HANDOFF, _CL_WEIGHTS, _cl_conv, _cl_conv_bwd, _restride, _to_channels_last
from .values import _GraphFallback, _meta, _static_shape, _to_core, _to_numpy, _to_torch
from .views import _VIEW_PACKETS

aten = torch.ops.aten


# Deterministic ops a cluster without tensor inputs may hold and still be computed once, at
# lowering (_Lowering._fold): factories and views. Random ops and empty() are not among them.
_FOLDABLE = frozenset(
    (
        aten.arange,
        aten.zeros,
        aten.ones,
        aten.full,
        aten.eye,
        aten.linspace,
        aten.scalar_tensor,
        aten.view,
        aten._unsafe_view,
        aten.reshape,
        aten.unsqueeze,
        aten.squeeze,
        aten.expand,
        aten.permute,
        aten.t,
        aten.transpose,
        aten.select,
        aten.slice,
        aten.alias,
        aten.clone,
        aten._to_copy,
        aten.lift_fresh_copy,
    )
)


# Views an extern cluster runs as Tensor methods: the same result as the aten op, for less per
# call (no OpOverload dispatch through Python). aten overload -> method name.
_VIEW_METHODS = {
    aten.view.default: "reshape",
    aten._unsafe_view.default: "reshape",
    aten.reshape.default: "reshape",
    aten.permute.default: "permute",
    aten.unsqueeze.default: "unsqueeze",
    aten.squeeze.dim: "squeeze",
    aten.squeeze.dims: "squeeze",
    aten.squeeze.default: "squeeze",
    aten.select.int: "select",
    aten.t.default: "t",
    aten.transpose.int: "transpose",
    aten.expand.default: "expand",
}


# ops whose result shares its first argument's memory (with _VIEW_PACKETS), for _fresh_inputs
_ALIASING = frozenset(
    (
        aten.as_strided,
        aten.diagonal,
        aten.unfold,
        aten.narrow,
        aten.split,
        aten.split_with_sizes,
        aten.chunk,
        aten.unbind,
        aten.view_as_real,
        aten.view_as_complex,
        aten.real,
        aten.imag,
    )
)


# ops whose result depends on their argument's strides, not only its values: a cluster holding
# one gets its arguments in eager's layout even with channels_last convolutions
_STRIDED_READS = frozenset((aten.as_strided, aten.as_strided_scatter, aten._reshape_alias))


def _fresh_inputs(copied, members, outs, inputs):
    """Indexes of a cluster's inputs that must be copied at the call: a copy in the FX graph
    (x.clone(), .contiguous()) that the core lowered to its source's own value, and that an
    output of the cluster views. Else the output would share the source's memory (a graph input,
    say: x.clone().t() would return a view of x, and writing to it would write x)."""
    mset = set(members)
    roots = set()
    for o in outs:
        n = o
        while (
            n in mset
            and n.op == "call_function"
            and n.args
            and isinstance(n.args[0], torch.fx.Node)
            and (
                n.target is operator.getitem
                or getattr(n.target, "overloadpacket", None) in _VIEW_PACKETS
                or getattr(n.target, "overloadpacket", None) in _ALIASING
            )
        ):
            n = n.args[0]
        roots.add(n)
    return frozenset(j for j, a in enumerate(inputs) if a in copied and a in roots)


def _make_cluster_fn(
    gm, members, specs, consts, outs, cuda=False, fresh=frozenset(), channels_last=False, keep_cl=False
):
    """The extern function of one cluster: NumPy arrays in, torch on them, NumPy arrays out
    (cuda: CUDA tensors in and out, bfloat16 carried as float32 as on the CPU).

    It is generated Python (one straight-line function per cluster), so a call pays for the
    torch ops it runs and little else: no per-node interpretation, views as Tensor methods
    (aten.view runs as ``reshape``: the same values; a functional graph never writes through an
    alias), and the common conversions inline with the general ones as fallbacks."""
    views = _VIEW_METHODS
    glob = {
        "_to_torch": _to_torch,
        "_restride": _restride,
        "_to_numpy": _to_numpy,
        "_from_numpy": torch.from_numpy,
        "_to_core": _to_core,
    }
    names = {}

    def ref(v):
        if isinstance(v, torch.fx.Node):
            if v in names:
                return names[v]
            key = "c%d" % len(glob)
            glob[key] = consts[v]
            names[v] = key
            return key
        if isinstance(v, (list, tuple)):
            body = ", ".join(ref(x) for x in v)
            return "[%s]" % body if isinstance(v, list) else "(%s%s)" % (body, "," if len(v) == 1 else "")
        if (
            v is None
            or isinstance(v, (bool, str))
            or (type(v) is int)
            or (type(v) is float and v == v and abs(v) != float("inf"))
        ):
            return repr(v)
        key = "k%d" % len(glob)
        glob[key] = v
        return key

    lines = []
    params = ["a%d" % j for j in range(len(specs))]
    for j, (node, shape, dtype, layout) in enumerate(specs):
        var = "x%d" % j
        names[node] = var
        glob["s%d" % j], glob["d%d" % j], glob["l%d" % j] = shape, dtype, layout
        if layout == "tensor":  # a CPU graph's input passed through as the tensor it is
            lines.append("%s = a%d" % (var, j))
            continue
        if cuda:
            lines.append(
                "%s = a%d if a%d.shape == s%d and a%d.dtype is d%d else _to_torch(a%d, s%d, d%d)"
                % (var, j, j, j, j, j, j, j, j)
            )
        else:
            lines.append("t = _from_numpy(a%d) if a%d.flags.writeable else None" % (j, j))
            lines.append(
                "%s = t if t is not None and t.shape == s%d and t.dtype is d%d else _to_torch(a%d, s%d, d%d)"
                % (var, j, j, j, j, j)
            )
        if layout is not None:
            glob["w%d" % j] = layout[1]
            lines.append("if %s.stride() != w%d:\n        %s = _restride(%s, l%d)" % (var, j, var, var, j))
        if j in fresh:  # a copy in torch: an output views it (_fresh_inputs)
            lines.append("%s = %s.clone()" % (var, var))
    collapsed, need = _view_chains(members, outs, views)
    strides = {}  # root var -> the local holding its stride()
    for i, m in enumerate(members):
        if m not in need:
            continue  # a view only further views of this cluster read: folded into theirs
        var = "v%d" % i
        if m in collapsed:
            root, seq, (size, stride, delta, want) = collapsed[m]
            r = names[root]
            if r not in strides:
                strides[r] = "st_" + r
                lines.append("st_%s = %s.stride()" % (r, r))
            chain = r + "".join(".%s(%s)" % (views[v.target], ", ".join(ref(a) for a in v.args[1:])) for v in seq)
            expr = "%s.as_strided(%r, %r, %s.storage_offset() + %d) if %s == %r else %s" % (
                r,
                size,
                stride,
                r,
                delta,
                strides[r],
                want,
                chain,
            )
            lines.append("%s = %s" % (var, expr))
            names[m] = var
            continue
        args = [ref(a) for a in m.args]
        kwargs = ["%s=%s" % (k, ref(v)) for k, v in m.kwargs.items()]
        if m.op == "call_function" and m.target is operator.getitem and not kwargs:
            expr = "%s[%s]" % (args[0], args[1])
        elif m.target is aten.permute.default and not kwargs and list(m.args[1]) == [1, 0]:
            expr = "%s.t()" % args[0]  # a weight's transpose: half permute's cost per call
        elif m.op == "call_function" and m.target in views and args and not kwargs:
            expr = "%s.%s(%s)" % (args[0], views[m.target], ", ".join(args[1:]))
        elif m.op == "call_function":
            fn = getattr(m.target, "_op", m.target) if isinstance(m.target, torch._ops.OpOverload) else m.target
            glob["f%d" % i] = fn
            if channels_last and _cl_conv(m):
                # input and weight channels_last: oneDNN's fast path, and a channels_last result.
                # A training forward hands its converted input to the backward's convolution
                # (_ClHandoff): one conversion per step, not two
                glob["_cl"], glob["_clw"] = _CL_HANDOFF.keep if keep_cl else _to_channels_last, _CL_WEIGHTS
                args = ["_cl(%s)" % args[0], "_clw(%s)" % args[1]] + args[2:]
            elif channels_last and _cl_conv_bwd(m):
                # the backward's too: channels_last gradients of the input and the weight
                glob["_cl"], glob["_clin"], glob["_clw"] = _to_channels_last, _CL_HANDOFF.take, _CL_WEIGHTS
                args = ["_cl(%s)" % args[0], "_clin(%s)" % args[1], "_clw(%s)" % args[2]] + args[3:]
            expr = "f%d(%s)" % (i, ", ".join(args + kwargs))
        elif m.op == "call_method":
            expr = "%s.%s(%s)" % (args[0], m.target, ", ".join(args[1:] + kwargs))
        elif m.op == "call_module":
            glob["f%d" % i] = gm.get_submodule(m.target)
            expr = "f%d(%s)" % (i, ", ".join(args + kwargs))
        else:
            raise _GraphFallback("node %s" % m.format_node())
        lines.append("%s = %s" % (var, expr))
        names[m] = var
    rets = []
    for o in outs:
        var = names[o]
        if cuda:
            lines.append("r%s = _to_core(%s)" % (var, var))
            rets.append("r" + var)
            continue
        lines.append(
            "try:\n        r%s = %s.numpy()\n"
            "    except (TypeError, RuntimeError, AttributeError):\n        r%s = _to_numpy(%s)" % (var, var, var, var)
        )
        rets.append("r" + var)
    lines.append("return %s" % (rets[0] if len(outs) == 1 else "(%s,)" % ", ".join(rets)))
    name = "extern_" + "_".join(str(getattr(m.target, "__name__", m.target)).replace(".", "_") for m in members[:4])
    name = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return pygen.function(lines, name, ", ".join(params), "<fastcompile extern %s>" % name, glob)


def _view_chains(members, outs, views):
    """Chains of views inside one cluster, each done as one ``as_strided`` call instead of a
    Tensor method per view (a transformer's attention reshapes, permutes and selects a dozen
    times). Returns ``collapsed`` {last view: (root, views, (size, stride,
    offset delta, root strides))} for every chain of two or more views that leaves the cluster or
    feeds a non-view, where the FX metadata shows the result is a view of the root (run on meta
    tensors: a reshape that would copy is left alone), and ``need``: the members still emitted
    (a view only folded chains read is not). At run time the generated code checks the root's
    strides and runs the chain itself where they differ from the traced ones."""
    vmembers = {
        m
        for m in members
        if m.op == "call_function"
        and m.target in views
        and m.args
        and not m.kwargs
        and isinstance(m.args[0], torch.fx.Node)
    }
    mset = set(members)
    collapsed = {}
    for m in members:
        if m not in vmembers or (m not in outs and all(u in vmembers for u in m.users)):
            continue  # not the end of a chain
        seq, root = [], m
        while root in vmembers:
            seq.append(root)
            root = root.args[0]
        if len(seq) < 2 or (root not in mset and not isinstance(root, torch.fx.Node)):
            continue
        plan = _strided_chain(root, seq[::-1], views)
        if plan is not None:
            collapsed[m] = (root, seq[::-1], plan)
    need = set()
    for m in reversed(members):
        if (
            m not in vmembers
            or m in outs
            or any(u not in vmembers for u in m.users)
            or any(u in need and u not in collapsed for u in m.users)
        ):
            need.add(m)
    return collapsed, need


def _strided_chain(root, seq, views):
    """(size, stride, storage offset delta, root strides) of ``seq`` (view nodes) applied to a
    tensor laid out as ``root``'s FX metadata says, or None where the result is no view of it."""
    meta = _meta(root)
    if not isinstance(meta, torch.Tensor):
        return None
    try:
        base = torch.empty_strided(
            _static_shape(meta), tuple(int(s) for s in meta.stride()), dtype=meta.dtype, device="meta"
        )
        t = base
        for v in seq:
            if any(isinstance(a, torch.fx.Node) for a in v.args[1:]):
                return None
            t = getattr(t, views[v.target])(*v.args[1:])
        want = _meta(seq[-1])
        if t._base is not base or not isinstance(want, torch.Tensor) or tuple(t.shape) != _static_shape(want):
            return None
        return (tuple(t.shape), tuple(t.stride()), t.storage_offset() - base.storage_offset(), tuple(base.stride()))
    except Exception:  # symbolic sizes, an op meta tensors lack: the chain runs as it is
        return None
