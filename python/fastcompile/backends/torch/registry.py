"""The lowering's op-handler table: aten overload packet -> handler.

A handler takes (lowering, node) and returns a ``_Rec`` (or a tuple of them), or raises
``_NotLowered`` to leave the node to an extern cluster. pointwise.py, views.py and reductions.py
register theirs; lowering.py looks them up.
"""

_LOWER = {}


def _register(*packets):
    def deco(fn):
        for p in packets:
            _LOWER[p] = fn
        return fn

    return deco
