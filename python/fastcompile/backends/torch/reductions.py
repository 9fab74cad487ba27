"""Lowering of aten reductions, var/std, var_mean and softmax/log_softmax to core reductions.

In: FX reduction nodes (through the handler table). Out: core values (``_Rec``), or
``_NotLowered``.
"""

import torch

from .registry import _register
from .values import _NotLowered, _meta

aten = torch.ops.aten


def _dims(L, node, x, dim):
    r = L.rec(x)
    nd = len(r.tshape)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        dims = list(range(nd))
    elif isinstance(dim, int):
        dims = [dim]
    else:
        dims = list(dim)
    dims = sorted({(d + nd) % nd if nd else 0 for d in dims}) if nd else []
    return dims


def _reduce(L, node, core, x, dim, keepdim, in_dtype=None, **attrs):
    dims = _dims(L, node, x, dim)
    r = L.rec(x)
    v, cshape = L.exact(x)
    if in_dtype is not None:
        v = L.cast(v, in_dtype)
    off = len(cshape) - len(r.tshape)
    axes = tuple(d + off for d in dims)
    if len(r.tshape) == 0:
        axes = None
        out_c = ()
    elif keepdim:
        out_c = tuple(1 if i in axes else s for i, s in enumerate(cshape))
    else:
        out_c = tuple(s for i, s in enumerate(cshape) if i not in axes)
    res = (
        L.g.call(core, v, axis=axes, keepdim=bool(keepdim), **attrs) if axes is not None else L.g.call(core, v, **attrs)
    )
    return L.out(node, res, out_c)


def _reduction(core, float_in=False):
    def handler(L, node):
        x = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if set(node.kwargs) - {"dim", "keepdim", "dtype"}:
            raise _NotLowered("kwargs")
        meta = _meta(node)
        in_dt = None
        if meta.dtype.is_floating_point or float_in:
            in_dt = meta.dtype
        if node.target in (aten.sum.default, aten.mean.default, aten.prod.default, aten.any.default, aten.all.default):
            dim, keepdim = None, False
        if (
            node.target in (aten.prod.dim_int, aten.any.dim, aten.all.dim, aten.argmax.default, aten.argmin.default)
            and dim is not None
            and not isinstance(dim, int)
        ):
            raise _NotLowered("dim")
        if core in ("argmax", "argmin"):
            in_dt = None
            r = L.rec(x)
            if dim is None and len(r.tshape):
                v, _ = L.exact(x)
                return L.out(node, L.g.call(core, v), ())
        return _reduce(L, node, core, x, dim, keepdim, in_dt)

    return handler


for _name, _core in [
    ("sum", "sum"),
    ("mean", "mean"),
    ("prod", "prod"),
    ("amax", "amax"),
    ("amin", "amin"),
    ("argmax", "argmax"),
    ("argmin", "argmin"),
    ("any", "any"),
    ("all", "all"),
    ("logsumexp", "logsumexp"),
]:
    _register(getattr(aten, _name))(_reduction(_core))


@_register(aten.var, aten.std)
def _var(L, node):
    if node.target not in (aten.var.correction, aten.std.correction):
        raise _NotLowered("overload")
    x = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    corr = node.kwargs.get("correction", 1)
    keepdim = node.kwargs.get("keepdim", False)
    if corr is None:
        corr = 1
    if float(corr) != int(corr):
        raise _NotLowered("fractional correction")
    core = "var" if node.target.overloadpacket is aten.var else "std"
    meta = _meta(node)
    return _reduce(
        L, node, core, x, dim, keepdim, meta.dtype if meta.dtype.is_floating_point else None, correction=int(corr)
    )


@_register(aten.var_mean)
def _var_mean(L, node):
    if node.target is not aten.var_mean.correction:
        raise _NotLowered("overload")
    x = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    corr = node.kwargs.get("correction", 1)
    corr = 1 if corr is None else corr
    keepdim = node.kwargs.get("keepdim", False)
    if float(corr) != int(corr) or not _meta(node)[0].dtype.is_floating_point:
        raise _NotLowered("var_mean correction/dtype")
    metas = _meta(node)

    class _One:  # _reduce reads the result's meta from node
        def __init__(self, m):
            self.meta = {"val": m}

    var = _reduce(L, _One(metas[0]), "var", x, dim, keepdim, metas[0].dtype, correction=int(corr))
    mean = _reduce(L, _One(metas[1]), "mean", x, dim, keepdim, metas[1].dtype)
    return (var, mean)


@_register(aten._softmax, aten._log_softmax)
def _softmax(L, node):
    x, dim = node.args[:2]
    meta = _meta(node)
    r = L.rec(x)
    v, cshape = L.exact(x)
    v = L.cast(v, meta.dtype)
    nd = len(r.tshape)
    if nd == 0:
        raise _NotLowered("0-d softmax")
    axis = (dim + nd) % nd + len(cshape) - nd
    core = "softmax" if node.target.overloadpacket is aten._softmax else "log_softmax"
    return L.out(node, L.g.call(core, v, axis=axis), cshape)
