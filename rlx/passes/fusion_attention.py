"""Attention fusion: the primitive multi-head attention chain -> one ``attention`` node.

Recognised (``B`` batch, ``H`` heads, ``D`` head dim; ``q, k, v`` packed ``[B, S, H*D]``)::

    qh = transpose(reshape(q, [B,Sq,H,D]), (0,2,1,3))
    kt = transpose(reshape(k, [B,Skv,H,D]), (0,2,3,1))
         or transpose(transpose(reshape(k, ...), (0,2,1,3)), (0,1,3,2))
    vh = transpose(reshape(v, [B,Skv,H,D]), (0,2,1,3))
    s  = matmul(qh, kt) [* c | / c] [+ mask]       c a scalar constant
    o  = reshape(transpose(matmul(softmax(s, -1), vh), (0,2,1,3)), [B,Sq,H*D])

and its grouped-query form with 5-D heads (``G`` kv heads, ``R = H / G``): q reshaped to
``[B,Sq,G,R,D]`` and transposed ``(0,2,3,1,4)``, k and v reshaped to ``[B,Skv,G,1,D]``
(kt transposed ``(0,2,3,4,1)``, vh ``(0,2,3,1,4)``), merged back with ``(0,3,1,2,4)``.

The chain becomes ``attention[num_heads=H, head_dim=D, num_kv_heads, scale](q, k, v[,
mask])``, the scale being ``c``, ``1/c`` or 1. A constant mask equal to the end-aligned
causal mask (0 where visible, ``-inf`` elsewhere, or the dtype's lowest value when every
query sees a key: a row that sees none gives 0 under ``-inf``, the mean of v under the
lowest value) becomes ``MaskKind.causal()`` with no mask input; any other mask is a
``custom`` mask input (an ``expand`` in front of it, from broadcast legalisation, is
looked through, also when other layers share it: attention broadcasts its mask itself).
The fused op computes what the chain does (see :class:`~rlx.ops.nn.Attention`) except on
a query row that sees no key (every score ``-inf``): the chain's softmax gives NaN
there, the fused op 0 (the one semantics of attention on every path). Every node of the
chain but the final reshape must have no user outside the chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlx.ir.mir import Node, NodeId
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Expand, Reshape, Transpose
from rlx.ops.nn import Attention, MaskKind
from rlx.ops.reduce import Softmax
from rlx.passes.base import const_array
from rlx.passes.fusion import FusionView, Match, PatternFusion
from rlx.passes.report import FusionPattern

__all__ = ["AttentionFusion"]


@dataclass(frozen=True, slots=True)
class _Layout:
    """Permutations of one head layout (4-D multi-head or 5-D grouped)."""

    q: tuple[int, ...]  # [B,S,heads...,D] -> heads-first
    kt: tuple[int, ...]  # [B,S,heads...,D] -> heads-first with D before S
    swap: tuple[int, ...]  # swaps the last two axes (kt from a heads-first k)
    merge: tuple[int, ...]  # heads-first context -> [B,S,heads...,D]


_LAYOUTS = {
    4: _Layout((0, 2, 1, 3), (0, 2, 3, 1), (0, 1, 3, 2), (0, 2, 1, 3)),
    5: _Layout((0, 2, 3, 1, 4), (0, 2, 3, 4, 1), (0, 1, 2, 4, 3), (0, 3, 1, 2, 4)),
}


@dataclass(frozen=True, slots=True)
class _Split:
    """A head split ``transpose(reshape(flat, [B,S,*heads,D]), perm)``."""

    flat: NodeId
    heads: tuple[int, ...]
    head_dim: int
    nodes: tuple[NodeId, ...]


def _perm(view: FusionView, nid: NodeId) -> tuple[int, ...] | None:
    op = view.node(nid).op
    if not isinstance(op, Transpose):
        return None
    r = len(op.perm)
    return tuple(p % r for p in op.perm)


def _split(view: FusionView, t: NodeId, perm: tuple[int, ...]) -> _Split | None:
    """Match ``transpose(reshape(flat, [B,S,*heads,D]), perm)`` with a 3-D ``flat``."""
    if _perm(view, t) != perm:
        return None
    r = view.node(t).inputs[0]
    rop = view.node(r).op
    if not isinstance(rop, Reshape) or len(rop.dims) != len(perm):
        return None
    flat = view.node(r).inputs[0]
    fs = view.node(flat).shape
    heads, d = rop.dims[2:-1], rop.dims[-1]
    if fs.rank != 3 or fs.dims[:2] != tuple(rop.dims[:2]):
        return None
    if not all(isinstance(h, int) for h in heads) or not isinstance(d, int):
        return None
    if fs.dims[2] != math.prod(heads) * d:  # type: ignore[arg-type]
        return None
    return _Split(flat, tuple(heads), d, (r, t))  # type: ignore[arg-type]


def _scalar(view: FusionView, nid: NodeId) -> float | None:
    arr = const_array(view.graph, nid)
    if arr is None or arr.size != 1 or not view.node(nid).dtype.is_float:
        return None
    return float(arr.astype(np.float64).reshape(()))


def _is_causal(arr: np.ndarray) -> bool:
    """True for an additive mask equal to the end-aligned causal mask."""
    while arr.ndim > 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 2:
        return False
    a = arr.astype(np.float64)
    allowed = MaskKind.causal().allowed(*a.shape)
    if allowed is None:  # a causal mask always restricts; kept for the type checker
        return False
    if not np.all(a[allowed] == 0.0):
        return False
    if np.all(np.isneginf(a[~allowed])):
        return True
    # the dtype's lowest value hides a key as -inf does, except in a row that sees no
    # key: there the chain gives the mean of v, the causal kernel (-inf) 0
    lowest = float(np.finfo(arr.dtype).min) if arr.dtype.kind == "f" else -np.inf
    blocked = np.isneginf(a) | (a <= lowest)
    return bool(np.all(blocked[~allowed]) and np.all(allowed.any(axis=1)))


class AttentionFusion(PatternFusion):
    """``softmax(Q Kᵀ · scale + mask) · V`` with head split/merge -> ``attention``."""

    name = "fuse_attention"
    pattern = FusionPattern.ATTENTION

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        op = node.op
        r = node.shape.rank
        if not isinstance(op, Softmax) or r not in _LAYOUTS or op.axis % r != r - 1:
            return None
        return self._match(view, node.id, _LAYOUTS[r])

    def _scores(self, view: FusionView, pre: NodeId) -> tuple[NodeId, float, list[NodeId]] | None:
        """``matmul [* c | / c]`` -> (matmul id, scale, nodes)."""
        op = view.node(pre).op
        if isinstance(op, MatMul):
            return pre, 1.0, [pre]
        if not isinstance(op, Binary) or op.fn not in (BinaryKind.MUL, BinaryKind.DIV):
            return None
        a, b = view.node(pre).inputs
        pairs = ((a, b), (b, a)) if op.fn is BinaryKind.MUL else ((a, b),)
        for mm, c in pairs:
            val = _scalar(view, c)
            if val is None or not isinstance(view.node(mm).op, MatMul):
                continue
            if op.fn is BinaryKind.DIV:
                if val == 0.0:
                    return None
                val = 1.0 / val
            return mm, val, [mm, pre]
        return None

    def _chain(
        self, view: FusionView, sm: NodeId
    ) -> tuple[NodeId, float, NodeId | None, list[NodeId]] | None:
        """softmax input -> (QK matmul, scale, mask or None, nodes)."""
        pre = view.node(sm).inputs[0]
        scores = self._scores(view, pre)
        if scores is not None:
            return (*scores[:2], None, scores[2])
        pop = view.node(pre).op
        if not (isinstance(pop, Binary) and pop.fn is BinaryKind.ADD):
            return None
        a, b = view.node(pre).inputs
        for c, m in ((a, b), (b, a)):
            scores = self._scores(view, c)
            if scores is not None:
                return scores[0], scores[1], m, [*scores[2], pre]
        return None

    def _match(self, view: FusionView, sm: NodeId, lay: _Layout) -> Match | None:
        chain = self._chain(view, sm)
        if chain is None:
            return None
        qk, scale, mask, nodes = chain
        nodes.append(sm)
        desc = f"softmax({view.desc(qk)}) chain at {view.desc(sm)}"
        users = view.consumers[sm]
        pv = users[0] if len(users) == 1 else None
        if pv is None or not isinstance(view.node(pv).op, MatMul) or view.node(pv).inputs[0] != sm:
            self.miss(nodes, desc, "softmax is not read by exactly one matmul with V")
            return None
        nodes.append(pv)
        merge = self._merge(view, pv, lay)
        if merge is None:
            self.miss(
                nodes,
                desc,
                f"the context is not merged back by transpose{lay.merge} + reshape to [B,S,H*D]",
            )
            return None
        nodes += merge
        q_t, k_t = view.node(qk).inputs
        v_t = view.node(pv).inputs[1]
        q = _split(view, q_t, lay.q)
        k = _split(view, k_t, lay.kt)
        if k is None and _perm(view, k_t) == lay.swap:
            inner = _split(view, view.node(k_t).inputs[0], lay.q)
            if inner is not None:
                k = _Split(inner.flat, inner.heads, inner.head_dim, (*inner.nodes, k_t))
        v = _split(view, v_t, lay.q)
        if q is None or k is None or v is None:
            which = ", ".join(n for n, s in (("q", q), ("k", k), ("v", v)) if s is None)
            self.miss(nodes, desc, f"no [B,S,H*D] head split found for {which}")
            return None
        heads, kv_heads = self._heads(q, k, v)
        if heads is None or q.head_dim != k.head_dim or q.head_dim != v.head_dim:
            self.miss(
                nodes, desc, f"q, k, v head layouts {q.heads}, {k.heads}, {v.heads} do not line up"
            )
            return None
        nodes += [*q.nodes, *k.nodes, *v.nodes]
        inputs: tuple[NodeId, ...] = (q.flat, k.flat, v.flat)
        kind = MaskKind.none()
        if mask is not None:
            if isinstance(view.node(mask).op, Expand):
                # read the mask before its broadcast; an expand shared with other layers
                # stays for them (and dies when they fuse too)
                if not view.why_escapes(mask, set(nodes)):
                    nodes.append(mask)
                mask = view.node(mask).inputs[0]
            arr = const_array(view.graph, mask)
            if arr is not None and _is_causal(arr):
                kind = MaskKind.causal()
            elif len(lay.q) == 5 and view.node(mask).shape.rank > 2:
                self.miss(
                    nodes, desc, f"a rank-{view.node(mask).shape.rank} mask over grouped heads"
                )
                return None
            else:
                kind = MaskKind.custom()
                inputs = (*inputs, mask)
        anchor = merge[-1]
        inside = frozenset(nodes)
        if self.escapes(view, inside, anchor, desc):
            return None
        op = Attention(heads, q.head_dim, kind, kv_heads, scale)
        why = view.infer(op, inputs)
        if why is None and view.node(anchor).shape != view.node(q.flat).shape:
            why = f"output {view.node(anchor).shape} differs from q {view.node(q.flat).shape}"
        if why is not None:
            self.miss(sorted(inside), desc, why)
            return None
        return Match(anchor, op, inputs, inside, f"{desc} ({len(inside)} nodes)")

    @staticmethod
    def _heads(q: _Split, k: _Split, v: _Split) -> tuple[int | None, int | None]:
        """(num_heads, num_kv_heads or None) when the three head layouts agree."""
        if k.heads != v.heads:
            return None, None
        if len(q.heads) == 1:
            return (q.heads[0], None) if k.heads == q.heads else (None, None)
        groups, rep = q.heads
        if k.heads != (groups, 1):
            return None, None
        return groups * rep, (groups if rep != 1 else None)

    def _merge(self, view: FusionView, pv: NodeId, lay: _Layout) -> list[NodeId] | None:
        users = view.consumers[pv]
        if len(users) != 1 or _perm(view, users[0]) != lay.merge:
            return None
        t = users[0]
        users = view.consumers[t]
        if len(users) != 1 or not isinstance(view.node(users[0]).op, Reshape):
            return None
        r = users[0]
        if view.node(r).shape.rank != 3:
            return None
        return [t, r]
