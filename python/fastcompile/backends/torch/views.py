"""Lowering of aten views: free where the core value's elements do not move; else pushed to the
leaves of the pointwise ops that make the value (``_push_view``), or left to an extern.

In: FX view nodes (through the handler table). Out: core values (``_Rec``), NumPy view externs of
the leaves, or ``_NotLowered``.
"""

import math

import numpy as np
import torch
import torch.fx

from .registry import _LOWER, _register
from .values import _Cluster, _NotLowered, _Rec, _contiguous_strides, _core_dtype, _meta, _static_shape, _strip1

aten = torch.ops.aten
prims = torch.ops.prims


def _dtype_view(node):
    """x.view(dtype) (aten.view.dtype): a reinterpretation of the bits, not a reshape."""
    return len(node.args) > 1 and isinstance(node.args[1], torch.dtype)


@_register(
    aten.view,
    aten._unsafe_view,
    aten.reshape,
    aten.unsqueeze,
    aten.squeeze,
    aten.expand,
    prims.broadcast_in_dim,
    aten.permute,
)
def _view(L, node):
    """A view costs nothing when the core value's elements do not move: an expand (broadcast),
    or a change of leading size-1 dims; a permute that moves only size-1 dims. Else an extern.
    x.view(dtype) reinterprets the bits: torch's op, always an extern (a core cast converts)."""
    if _dtype_view(node):
        raise _NotLowered("view as another dtype: a bit reinterpretation")
    x = node.args[0]
    if isinstance(L.env.get(x), _Cluster) and not L.env[x].closed:
        raise _NotLowered("view of an extern result: joins its cluster")
    r = L.rec(x)
    meta = _meta(node)
    new = _static_shape(meta)
    packet = node.target.overloadpacket
    if packet in (aten.expand, prims.broadcast_in_dim):
        if packet is prims.broadcast_in_dim:
            dims = list(node.args[2])
            if dims != list(range(len(new) - len(r.tshape), len(new))):
                raise _NotLowered("broadcast_in_dim with inner dims")
        return _Rec(r.value, r.cshape, new, r.dtype)
    if _strip1(new) == _strip1(r.tshape) and packet is not aten.permute:
        if r.exact or _leading_only(r.tshape, new):
            return _Rec(r.value, r.cshape, new, r.dtype)
    if packet is aten.permute:
        perm = list(node.args[1])
        moved = [d for i, d in enumerate(perm) if d != i]
        if all(r.tshape[d] == 1 for d in moved) and r.exact and _strip1(new) == _strip1(r.tshape):
            return _Rec(r.value, r.cshape, new, r.dtype)
    return _push_view(L, node, r, new)


@_register(aten.select, aten.slice, aten.t, aten.transpose)
def _moving_view(L, node):
    """Views that move elements: pushed to the leaves of the value they view, or an extern."""
    x = node.args[0]
    if isinstance(L.env.get(x), _Cluster) and not L.env[x].closed:
        raise _NotLowered("view of an extern result: joins its cluster")
    return _push_view(L, node, L.rec(x), _static_shape(_meta(node)))


# Pointwise ops cheap enough to compute again in a view's index space, where the value they make
# is also needed unviewed (the same value is never recomputed when it holds a transcendental).
_CHEAP = frozenset(
    (
        "neg",
        "abs",
        "relu",
        "floor",
        "ceil",
        "round",
        "trunc",
        "sign",
        "isnan",
        "isinf",
        "isfinite",
        "logical_not",
        "bitwise_not",
        "add",
        "sub",
        "mul",
        "div",
        "square",
        "reciprocal",
        "sqrt",
        "rsqrt",
        "maximum",
        "minimum",
        "fmax",
        "fmin",
        "copysign",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_and",
        "logical_or",
        "logical_xor",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "where",
        "clamp",
        "cast",
    )
)
_PUSH_MAX_NODES = 64
# the ops _feeds_core looks through: those the two view handlers take, and alias
_VIEW_PACKETS = frozenset(p for p, h in _LOWER.items() if h in (_view, _moving_view)) | {aten.alias}


def _uses_end_in(node, through, ends, depth=0):
    """Every use of ``node``, looking through ops in ``through``, is an op in ``ends``."""
    if not node.users or depth > 8:
        return False
    for u in node.users:
        pk = getattr(u.target, "overloadpacket", None) if u.op == "call_function" else None
        if pk in through:
            if not _uses_end_in(u, through, ends, depth + 1):
                return False
        elif pk not in ends:
            return False
    return True


def _externs_only(node, depth=0):
    """No use of ``node``, looking through views, is an op the core lowers: only extern clusters
    (a matmul, an attention) read it."""
    if depth > 8:
        return False
    for u in node.users:
        if u.op == "output":
            continue
        pk = getattr(u.target, "overloadpacket", None) if u.op == "call_function" else None
        if pk in _VIEW_PACKETS:
            if not _externs_only(u, depth + 1):
                return False
        elif pk in _LOWER:
            return False
    return True


def _feeds_core(node):
    """Every use of ``node`` (through further views) is an op the core lowers: pushing the view
    to the leaves then saves a kernel pass. An extern use takes the view in its own cluster."""
    return _uses_end_in(node, _VIEW_PACKETS, _LOWER)


def _core_or_output_use(node, depth=0):
    """Some use of ``node``, looking through views, is a graph output or an op the core lowers."""
    if depth > 8:
        return False
    for u in node.users:
        if u.op == "output":
            return True
        pk = getattr(u.target, "overloadpacket", None) if u.op == "call_function" else None
        if pk in _VIEW_PACKETS:
            if _core_or_output_use(u, depth + 1):
                return True
        elif pk in _LOWER:
            return True
    return False


def _broadcast(x, shape):
    """np.broadcast_to(x, shape) (read-only), at a fraction of its cost where x is C-contiguous:
    an ndarray over x's buffer with the broadcast dimensions' strides 0."""
    if not x.flags.c_contiguous or x.ndim > len(shape):
        return np.broadcast_to(x, shape)
    pad = len(shape) - x.ndim
    strides = [0] * pad
    for d, (n, s) in enumerate(zip(x.shape, x.strides)):
        if n != shape[pad + d]:
            if n != 1:
                return np.broadcast_to(x, shape)  # raises NumPy's own error
            s = 0
        strides.append(s)
    r = np.ndarray(shape, x.dtype, x, 0, strides)
    r.flags.writeable = False
    return r


def _np_view(node, shape, new):
    """The view ``node`` does (on an input of torch ``shape``) as a NumPy function, or None."""
    pk = node.target.overloadpacket
    a = node.args
    nd = len(shape)
    if _dtype_view(node):
        return None  # a bit reinterpretation, not a reshape
    if pk in (aten.view, aten._unsafe_view, aten.reshape, aten.unsqueeze, aten.squeeze):
        return lambda x: x.reshape(new)  # element order kept: a view, or a copy
    if pk is aten.permute:
        dims = tuple(d % nd for d in a[1])
        return lambda x: x.transpose(dims)
    if pk is aten.expand:
        return lambda x: np.broadcast_to(x, new)
    if pk is aten.t:
        return lambda x: x.T
    if pk is aten.transpose:
        d0, d1 = a[1] % nd, a[2] % nd
        return lambda x: x.swapaxes(d0, d1)
    if pk is aten.select:
        idx = (slice(None),) * (a[1] % nd) + (a[2],)
        return lambda x: x[idx]
    if pk is aten.slice:
        if node.kwargs:
            return None
        d = a[1] if len(a) > 1 else 0
        start, end, step = (list(a[2:5]) + [None, None, 1])[:3]
        idx = (slice(None),) * (d % nd) + (slice(start, end, step),)
        return lambda x: x[idx]
    return None


_OFFSETS_MAX = 1 << 22  # leaves up to this many elements are checked element by element


def _leaf_view(shape, strides, chain):
    """How ``chain`` (NumPy view functions) acts on a leaf of ``shape`` and these element
    strides: ("view", chain, spec) where NumPy does it without copying; ("strided", chain, spec)
    where NumPy would copy (a reshape across a permuted leaf) but the result is still a strided
    view of the leaf, which the core makes from the spec; None where it is a real copy. Found by
    running the chain on the leaf's element offsets. spec: Graph.extern's view= (in_shape,
    in_strides, out_shape, out_strides, offset), so the core makes the view itself where the
    leaf comes as traced (elsewhere the chain runs); None where the strides are unknown or the
    leaf too large to check. Unknown strides: ("view", chain, None): the chain runs at each
    call."""
    if (
        strides is None
        or len(strides) != len(shape)
        or min(strides, default=0) < 0
        or 0 in shape
        or int(np.prod(shape)) > _OFFSETS_MAX
    ):
        return "view", chain, None
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    # first on bytes no one reads: where NumPy makes a view, its strides and start are the
    # answer, with no element touched (the offsets below touch every element of the leaf)
    raw = np.empty(span, np.uint8)
    try:
        got = np.asarray(chain(np.lib.stride_tricks.as_strided(raw, shape, strides, writeable=False)))
    except Exception:
        got = None
    if got is not None and got.size and np.may_share_memory(got, raw):
        start = got.__array_interface__["data"][0] - raw.__array_interface__["data"][0]
        est = tuple(st if n > 1 else 0 for n, st in zip(got.shape, got.strides))
        return "view", chain, (tuple(shape), tuple(strides), tuple(got.shape), est, start)
    flat = np.arange(span, dtype=np.int64)
    offs = np.lib.stride_tricks.as_strided(flat, shape, [s * 8 for s in strides], writeable=False)
    got = np.asarray(chain(offs))
    if got.size == 0:
        return "view", chain, None
    start = int(got.flat[0])
    est = [
        int(got[(0,) * a + (1,) + (0,) * (got.ndim - a - 1)]) - start if got.shape[a] > 1 else 0
        for a in range(got.ndim)
    ]
    grid = start + sum(
        np.arange(n).reshape((n,) + (1,) * (got.ndim - a - 1)) * s for a, (n, s) in enumerate(zip(got.shape, est))
    )
    if not np.array_equal(got, grid):
        return None if not np.may_share_memory(got, flat) else ("view", chain, None)
    spec = (tuple(shape), tuple(strides), tuple(got.shape), tuple(est), start)
    return ("view" if np.may_share_memory(got, flat) else "strided"), chain, spec


def _viewed_again(node):
    """Every use of ``node`` is another view, or a clone whose uses are views again."""
    return _uses_end_in(node, (aten.clone,), _VIEW_PACKETS)


def _compose(fns):
    def view(x):
        for f in fns:
            x = f(x)
        return x

    return view


def _push_view(L, node, r, new):
    """view(f(a, b, ...)) as f(view(a), view(b), ...): the pointwise ops that make ``r`` are
    emitted again over views of their leaves (graph inputs, extern results), each view a NumPy
    extern of its leaf (pure: skipped when nothing reads it). One kernel then writes the viewed
    value where an extern view and a copy kernel did. Raises _NotLowered where this cannot be done
    (a reduction or a transcendental inside, more than _PUSH_MAX_NODES ops, an extern user)."""
    G = L.g
    if L.device is not None:  # the leaf views are NumPy functions: on CUDA, torch does the view
        raise _NotLowered("view %s -> %s on %s" % (r.tshape, new, L.device))
    # a view that graph outputs or core ops read, but not only core ops, of a value the core
    # holds anyway (an extern's result, a kernel's output): a view extern of that value, made in
    # C, is the graph's output and what the core ops and externs read; a one-view torch cluster
    # would cost a from_numpy and a .numpy() per call (a weight's grad, transposed)
    base = G.view_of.get(r.value.node, (r.value,))[0].node
    leaf_only = not _feeds_core(node)
    if leaf_only and not (
        _core_or_output_use(node) and (base in L.extern_values or G.made.get(base, ("?",))[0] == "call")
    ):
        raise _NotLowered("view %s -> %s feeds an extern" % (r.tshape, new))
    vf = _np_view(node, r.tshape, new)
    if vf is None:
        raise _NotLowered("view %s -> %s" % (r.tshape, new))
    tshape, nd = r.tshape, len(r.tshape)

    def bcast(x):
        if x.ndim > nd:  # the core's extra leading dims are 1
            x = x.reshape(x.shape[x.ndim - nd :])
        return x if x.shape == tshape else _broadcast(x, tshape)

    perm = _perm_of(node, nd)
    saved = []  # (FX node, its _Rec): values pushed through that graph outputs read
    try:
        if leaf_only:  # viewed where it is, never computed again in the view's order
            raise _NotLowered("not only core ops read it")
        order, leaves = _push_walk(G, r, reductions=perm is not None)
        reduced = _reduced(G, order)
        if reduced and not _private(L, node, reduced):
            saved = _saved_by_outputs(L, node, reduced, r.tshape)
    except _NotLowered:
        if G.made.get(r.value.node, ("?",))[0] != "call" and not leaf_only:
            raise
        # a reduction or a transcendental inside: the value is stored by its segment and viewed
        # there, as a leaf (made by the core itself where it comes laid out as traced)
        order, leaves = [], [r.value]
        G.leaf_shape.setdefault(r.value.node, r.cshape)
        G.leaf_strides.setdefault(r.value.node, _contiguous_strides(r.cshape))
    new_of, spec = {}, None
    for v in leaves:
        base, fns = G.view_of.get(v.node, (v, ()))
        fns = fns + (bcast, vf)
        view = _compose(fns)
        try:  # on a stand-in of the leaf's shape: fails here, not at run time
            probe = view(np.broadcast_to(np.zeros((), np.int8), G.leaf_shape[base.node]))
        except Exception as e:
            raise _NotLowered("view %s -> %s: %s" % (r.tshape, new, e))
        if tuple(probe.shape) != new:
            raise _NotLowered("view %s -> %s gives %s" % (r.tshape, new, probe.shape))
        how = _leaf_view(G.leaf_shape[base.node], G.leaf_strides.get(base.node), view)
        # a real copy: NumPy would copy the leaf on one thread at every call, so the core
        # value is written by a kernel and viewed there instead; unless it is only viewed
        # further (after clones), where a later view may be a strided view of the leaf again
        # (flash attention's grads: (B, H, T, D) over (B, T, H, D) memory, reshaped to
        # (B*H, T, D), permuted and reshaped to (T, B, H*D))
        if how is None and (leaf_only or not _viewed_again(node)):
            raise _NotLowered("view %s -> %s copies its leaf" % (r.tshape, new))
        spec = how[2] if how is not None else None
        if leaf_only and (spec is None or any(st == 0 and n > 1 for n, st in zip(spec[2], spec[3]))):
            # of unknown layout, or broadcast (read-only: as a graph output torch would warn at
            # each call): left to a cluster
            raise _NotLowered("view %s -> %s: no strided view of its own, not only for core ops" % (r.tshape, new))
        w = G.extern(view, base, pure=True, view=spec)
        G.view_of[w.node] = (base, fns)
        G.leaf_shape[w.node] = new
        new_of[v.node] = w
    for v in order:
        _, op, args, attrs = G.made[v.node]
        if op in _PUSH_REDUCTIONS and attrs.get("axis") is not None:
            # the reduced axes, where the permute put them (the value is full rank once viewed)
            moved = tuple(sorted(perm.index(a) for a in _reduced_axes(G, G.made[v.node], nd)[0]))
            attrs = dict(attrs, axis=moved if isinstance(attrs["axis"], tuple) else moved[0])
        args = [new_of.get(a.node, a) if hasattr(a, "node") else a for a in args]
        new_of[v.node] = G.call(op, *args, **attrs)
    for f, r0 in saved:
        _rebind_saved(L, f, r0, new_of[r0.value.node], perm)
    out = new_of.get(r.value.node, r.value)
    meta = _meta(node)
    if not order and spec is not None and _core_dtype(meta.dtype) == _core_dtype(r.dtype):
        # the view itself, laid out as its spec says (_layout compares that with eager's), with
        # no cast: an extern's dtype is known to the core only at run time, and a cast node of
        # it would be a copy kernel wherever no other op reads the view
        L.view_strides[out.node] = spec[3]
        return _Rec(out, new, new, meta.dtype)
    if leaf_only:
        raise _NotLowered("view %s -> %s changes dtype, not only for core ops" % (r.tshape, new))
    return _Rec(L.cast(out, meta.dtype), new if leaves else (), new, meta.dtype)


# Reductions a permute is pushed through (_push_view): rank-keeping ones, their axes moved with
# the permute, and only where nothing else reads them (never computed twice).
_PUSH_REDUCTIONS = frozenset(
    ("sum", "mean", "var", "std", "amax", "amin", "prod", "logsumexp", "softmax", "log_softmax")
)


def _perm_of(node, nd):
    """The dims a permute or transpose of rank ``nd`` takes (output dim i is input dim perm[i]),
    or None for any other view."""
    pk = node.target.overloadpacket
    if pk is aten.permute:
        return [d % nd for d in node.args[1]]
    if pk is aten.transpose and nd:
        perm = list(range(nd))
        d0, d1 = node.args[1] % nd, node.args[2] % nd
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    return None


def _reduced(G, order):
    """The core nodes among ``order`` (the values a view is pushed through, readers after what
    they read) that are reductions or read one: those a push must not compute twice. The others
    are cheap pointwise values of the leaves, computed again in the view's order wherever
    something else reads them unviewed (a LayerNorm backward's normalized input, which its
    weight's grad reads too)."""
    out = set()
    for v in order:
        _, op, args, _ = G.made[v.node]
        if op in _PUSH_REDUCTIONS or any(hasattr(a, "node") and a.node in out for a in args):
            out.add(v.node)
    return out


def _private(L, view_node, nodes):
    """Every FX node whose lowered value is among ``nodes`` (the reductions a view is pushed
    through, and what reads them: _reduced) is read only by others of them, by values the push
    computes again, or by the view: pushing the view computes them again in the view's layout,
    and the originals are then dead rather than computed twice."""
    owners = _owners(L, nodes)
    inside = set(owners) | {view_node}
    return bool(owners) and all(u in inside for f in owners for u in f.users)


def _owners(L, nodes):
    """FX node -> its lowered value (a _Rec, or a tuple of them), for those whose value is among
    the core ``nodes``."""
    owners = {}
    for f, val in L.env.items():
        vals = val if isinstance(val, tuple) else (val,)
        if any(isinstance(x, _Rec) and x.value.node in nodes for x in vals):
            owners[f] = val
    return owners


def _saved_by_outputs(L, view_node, nodes, full):
    """Where a permute is pushed through reductions (``nodes``: _reduced) that other FX nodes
    read too (training: a LayerNorm's mean and rstd, saved for the backward), and those readers
    are graph outputs only: the FX nodes to give the pushed values, viewed back (_rebind_saved),
    as Inductor's LayerNorm kernel writes the transposed output and the statistics. Raises
    _NotLowered where another node reads them, or one is not a full-rank tensor value of its own
    with the viewed value's shape (``full``) but for the reduced axes, which the pushed value has."""
    nd = len(full)
    reduced_axes = set()
    for n in nodes:
        how = L.g.made[n]
        if how[1] in _PUSH_REDUCTIONS:
            reduced_axes.update(_reduced_axes(L.g, how, nd)[0])
    owners = _owners(L, nodes)
    inside = set(owners) | {view_node}
    saved = []
    for f, val in owners.items():
        outside = [u for u in f.users if u not in inside]
        if not outside:
            continue
        if any(u.op != "output" for u in outside):
            raise _NotLowered("view of a reduction other nodes read too")
        if (
            not isinstance(val, _Rec)
            or len(val.tshape) != nd
            or val.value.ndim != nd
            or tuple(val.cshape) != tuple(val.tshape)
        ):
            raise _NotLowered("view of a reduction a graph output reads as %s" % (val,))
        if any(n != m and not (n == 1 and i in reduced_axes) for i, (n, m) in enumerate(zip(val.tshape, full))):
            # broadcast along an axis no reduction took: the pushed value has another shape
            raise _NotLowered("view of a reduction a graph output reads at another shape")
        if math.prod(val.tshape) * 4 > math.prod(full):
            # a full-size value (a softmax saved for its backward): viewed back, eager's layout
            # would cost a copy of it, the one the pushed permute saves
            raise _NotLowered("view of a reduction a graph output reads at full size")
        saved.append((f, val))
    return saved


def _rebind_saved(L, f, r0, pushed, perm):
    """FX node ``f`` (a graph output; its value ``r0`` was pushed through a permute) becomes the
    pushed value viewed back by the inverse permute: a view extern made in C (restrided to
    eager's layout where the two differ, a copy of a statistic's few elements). The original
    value is then dead: computed once, in the view's order."""
    G = L.g
    inv = tuple(perm.index(d) for d in range(len(perm)))
    shape = tuple(r0.tshape[p] for p in perm)
    st = _contiguous_strides(shape)  # the pushed value, as its kernel stores it
    G.leaf_shape[pushed.node] = shape
    G.leaf_strides[pushed.node] = st

    def back(x):
        return x.transpose(inv)

    out_strides = tuple(st[inv[i]] if n > 1 else 0 for i, n in enumerate(r0.tshape))
    spec = (shape, st, tuple(r0.tshape), out_strides, 0)  # at any size (_leaf_view stops at 4M)
    w = G.extern(back, pushed, pure=True, view=spec)
    G.view_of[w.node] = (pushed, (back,))
    G.leaf_shape[w.node] = r0.tshape
    L.view_strides[w.node] = out_strides
    L.env[f] = _Rec(w, r0.tshape, r0.tshape, r0.dtype)


def _reduced_axes(G, how, nd):
    """The axes (of a rank-``nd`` view's unviewed value) that reduction ``how`` (a G.made entry)
    reduces, and its input's core shape; _NotLowered where that shape is unknown."""
    _, op, args, attrs = how
    shape = G.shape.get(args[0].node) if hasattr(args[0], "node") else None
    if shape is None:
        raise _NotLowered("view of %s of unknown shape" % op)
    k = len(shape)
    axis = attrs.get("axis")
    axes = range(k) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    return tuple(a % k + nd - k for a in axes), shape


def _check_reduced_extent(G, how, full):
    nd = len(full)
    axes, shape = _reduced_axes(G, how, nd)
    k = len(shape)
    for ra in axes:
        if ra < 0 or shape[ra - nd + k] != full[ra]:
            raise _NotLowered("view of %s over an axis its input broadcasts" % how[1])


def _push_walk(G, r, reductions=False):
    """The pointwise ops that make ``r`` (readers after what they read) and the leaves they
    start from, for _push_view; _NotLowered where one is not cheap to compute again, or too many.
    reductions: rank-keeping reductions may be among them too (a permute is pushed), where their
    input has ``r``'s full extent along the reduced axes: every leaf is broadcast to r's shape
    before it is viewed, so a reduction over a size-1 axis would sum the broadcast copies."""
    order, seen, leaves = [], set(), []
    stack = [(r.value, False)]
    while stack:
        v, done = stack.pop()
        if done:
            order.append(v)
            continue
        if v.node in seen:
            continue
        seen.add(v.node)
        how = G.made.get(v.node)
        if how is None:
            if v.node not in G.leaf_shape:
                raise _NotLowered("view of a value without a known shape")
            leaves.append(v)
        elif how[0] == "call":
            keeps = (
                how[1] in _PUSH_REDUCTIONS
                and "axis" in how[3]
                and (how[3].get("keepdim") or how[1] in ("softmax", "log_softmax"))
            )
            if how[1] not in _CHEAP:
                if not (reductions and keeps):
                    raise _NotLowered("view of %s" % how[1])
                _check_reduced_extent(G, how, r.tshape)
            if len(seen) > _PUSH_MAX_NODES:
                raise _NotLowered("view of a value made by more than %d ops" % _PUSH_MAX_NODES)
            stack.append((v, True))
            stack.extend((a, False) for a in how[2] if hasattr(a, "node"))
    return order, leaves


def _leading_only(old, new):
    """new differs from old only by leading size-1 dims"""
    return _strip1(old) == _strip1(new) and old[len(old) - len(_strip1(old)) :] == new[len(new) - len(_strip1(new)) :]
