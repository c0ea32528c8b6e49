"""Reading spelled-out arithmetic for the pattern fusions that recognise ops an importer
wrote as chains (GELU through erf or tanh, layer norm through reductions).

In: a :class:`~rlx.passes.fusion.FusionView` and a node id. Out: the node seen as a
product ``c * f1 * f2 * ...`` (:func:`product`: the scalar constants multiplied into ``c``,
division by a scalar constant as its reciprocal, inner multiplications flattened) or as a
sum with a scalar constant (:func:`plus_const`), with the nodes that spelled it out, so
the matcher can check that none of them is read outside the pattern."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlx.ir.mir import NodeId
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.passes.base import const_array
from rlx.passes.fusion import FusionView

__all__ = ["Product", "close", "plus_const", "product", "scalar"]


def scalar(view: FusionView, nid: NodeId) -> float | None:
    """The value of a float constant with one element (any rank), else None."""
    arr = const_array(view.graph, nid)
    if arr is None or arr.size != 1 or arr.dtype.kind != "f":
        return None
    return float(arr.astype(np.float64).reshape(()))


def close(a: float | None, b: float, rel: float = 1e-4) -> bool:
    """``a`` equals ``b`` up to an f32 constant's rounding (and a 16-bit one's)."""
    return a is not None and math.isclose(a, b, rel_tol=rel)


def _binary(view: FusionView, nid: NodeId, *fns: BinaryKind) -> bool:
    op = view.node(nid).op
    return isinstance(op, Binary) and op.fn in fns


@dataclass(frozen=True, slots=True)
class Product:
    """``coef * prod(factors)``; ``nodes`` are the multiplications / divisions read."""

    coef: float
    factors: tuple[NodeId, ...]
    nodes: tuple[NodeId, ...]


def product(view: FusionView, nid: NodeId, depth: int = 8) -> Product:
    """``nid`` as a product: multiplications (and divisions by a scalar constant) are
    flattened while they are inner nodes of ``nid`` (read once); anything else is a factor."""
    if depth and _binary(view, nid, BinaryKind.MUL, BinaryKind.DIV):
        a, b = view.node(nid).inputs
        op = view.node(nid).op
        cb = scalar(view, b)
        if op.fn is BinaryKind.DIV:  # type: ignore[attr-defined]
            if cb is None or cb == 0.0:
                return Product(1.0, (nid,), ())
            pa = _inner(view, a, depth)
            return Product(pa.coef / cb, pa.factors, (nid, *pa.nodes))
        coef, nodes = 1.0, [nid]
        factors: list[NodeId] = []
        for s in (a, b):
            c = scalar(view, s)
            if c is not None:
                coef *= c
                continue
            p = _inner(view, s, depth)
            coef *= p.coef
            factors += p.factors
            nodes += p.nodes
        return Product(coef, tuple(factors), tuple(nodes))
    return Product(1.0, (nid,), ())


def _inner(view: FusionView, nid: NodeId, depth: int) -> Product:
    """Flatten ``nid`` only when it is read once (else it is a factor of its own)."""
    if view.why_not_inner(nid) is None:
        return product(view, nid, depth - 1)
    return Product(1.0, (nid,), ())


def plus_const(view: FusionView, nid: NodeId) -> tuple[NodeId, float] | None:
    """``x + c`` (either order) or ``x - c`` with a scalar constant ``c`` -> ``(x, c)``."""
    if not _binary(view, nid, BinaryKind.ADD, BinaryKind.SUB):
        return None
    a, b = view.node(nid).inputs
    sub = view.node(nid).op.fn is BinaryKind.SUB  # type: ignore[attr-defined]
    cb = scalar(view, b)
    if cb is not None:
        return a, (-cb if sub else cb)
    ca = scalar(view, a)
    if ca is not None and not sub:
        return b, ca
    return None
