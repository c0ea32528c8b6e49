"""Cast elimination. In: a graph (typically after auto mixed precision). Out: the same
values with redundant casts removed:

* ``cast(x, x.dtype)`` -> ``x``;
* ``cast(cast(x, a), b)`` -> ``cast(x, b)`` (or ``x`` when ``b`` is ``x``'s dtype) when the
  inner cast is exact, i.e. every value of ``x``'s dtype is representable in ``a``
  (:func:`exact`): then the inner cast changes no value and the outer one sees ``x``.
  ``f16 -> f32 -> f16`` goes; ``f32 -> bf16 -> f32`` stays (it rounds).

The bypassed inner cast stays while it has other readers (DCE removes it otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from rlx.dtype import DType
from rlx.ir.mir import Graph, NodeId
from rlx.ops.elementwise import Cast
from rlx.passes.base import Rewriter

__all__ = ["CastElimination", "exact"]


@dataclass(frozen=True, slots=True)
class _FloatFormat:
    mantissa: int  # significand bits, implicit bit included
    max_exp: int  # largest finite value < 2**(max_exp+1)
    min_sub_exp: int  # smallest positive value is 2**min_sub_exp


_FLOATS = {
    DType.F8E4M3: _FloatFormat(4, 8, -9),
    DType.F8E5M2: _FloatFormat(3, 15, -16),
    DType.F16: _FloatFormat(11, 15, -24),
    DType.BF16: _FloatFormat(8, 127, -133),
    DType.F32: _FloatFormat(24, 127, -149),
    DType.F64: _FloatFormat(53, 1023, -1074),
    DType.C64: _FloatFormat(24, 127, -149),  # each part is an f32
}
_INT_RANGE = {
    DType.I8: (-(2**7), 2**7 - 1),
    DType.I16: (-(2**15), 2**15 - 1),
    DType.I32: (-(2**31), 2**31 - 1),
    DType.I64: (-(2**63), 2**63 - 1),
    DType.U8: (0, 2**8 - 1),
    DType.U32: (0, 2**32 - 1),
    DType.BOOL: (0, 1),
}


@cache
def exact(src: DType, dst: DType) -> bool:
    """True when casting any ``src`` value to ``dst`` keeps it exactly (so a round trip
    ``src -> dst -> src`` is the identity)."""
    if src is dst:
        return True
    if dst is DType.BOOL or src is DType.C64 and dst is not DType.C64:
        return False
    if src in _INT_RANGE:
        lo, hi = _INT_RANGE[src]
        if dst in _INT_RANGE:
            dlo, dhi = _INT_RANGE[dst]
            return dlo <= lo and hi <= dhi
        f = _FLOATS[dst]
        return max(-lo, hi) <= 2**f.mantissa
    if dst in _INT_RANGE:
        return False  # a float has fractions
    s, d = _FLOATS[src], _FLOATS[dst]
    return d.mantissa >= s.mantissa and d.max_exp >= s.max_exp and d.min_sub_exp <= s.min_sub_exp


class CastElimination:
    """Remove no-op casts and exact round trips."""

    name = "cast_elimination"

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.removed = 0
        self.collapsed = 0

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        self.removed = self.collapsed = 0
        rw = Rewriter(graph)
        made: dict[tuple[NodeId, DType], NodeId] = {}
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            if not isinstance(node.op, Cast):
                rw.copy(node)
                continue
            x0 = rw.map[node.inputs[0]]
            x, to = x0, node.op.to
            inner = rw.dst.nodes[x0]
            if isinstance(inner.op, Cast) and exact(
                rw.new_shape(inner.inputs[0]).dtype, inner.op.to
            ):
                x = inner.inputs[0]  # the inner cast changed no value: read its input
            if rw.new_shape(x).dtype is to:
                rw.map[nid] = x
                self.removed += 1
                continue
            if x != x0:
                self.collapsed += 1
            key = (x, to)
            if key not in made:
                made[key] = rw.emit(node.op, [x], node.loc, node.shape)
            rw.map[nid] = made[key]
        if self.removed:
            self.notes.append(f"removed {self.removed} casts (no-ops or exact round trips)")
        if self.collapsed:
            self.notes.append(f"collapsed {self.collapsed} cast pairs into one cast")
        return rw.finish()
