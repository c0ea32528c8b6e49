"""Convolution epilogue fusion: ``conv [+ residual] [-> activation]`` -> one ``conv`` node
with ``has_residual`` / ``act`` set (:class:`~rlx.ops.nn.Conv`), so the CPU backend adds
the residual and applies the activation in the convolution's epilogue while the output
tile is in cache, instead of one more pass over the tensor per op.

* :class:`ConvActFusion` (``fuse_conv_act``), anchored at an unfused ``conv``:

  - residual: ``conv + r`` (either operand order), ``r`` of the conv output's shape and
    dtype (a ResNet block's skip, a MobileNetV2 inverted residual); when both operands
    are convs that could take it, the add's first operand absorbs the second;
  - activation, after the residual: ``relu``, or a clip spelled ``min(max(y, lo), hi)``,
    ``max(y, lo)`` or ``min(y, hi)`` with ``lo`` / ``hi`` scalar constants (what the ONNX
    importer writes for ``Clip``, ``relu6`` included) and ``lo <= hi``; ``max(y, 0)``
    alone is a relu.

Every swallowed intermediate must have this one user and not be a graph output; near
misses are recorded in the fusion report with the reason. Runs after the matmul fusions
and before elementwise regions (which would otherwise take the activations).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rlx.ir.mir import Node, NodeId
from rlx.ops.core import Constant
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.nn import Conv, ConvAct
from rlx.passes.fusion import FusionView, Match, PatternFusion
from rlx.passes.report import FusionPattern

__all__ = ["ConvActFusion"]


def _scalar(view: FusionView, nid: NodeId) -> float | None:
    """The value of a one-element float constant, else None."""
    op = view.node(nid).op
    if not isinstance(op, Constant):
        return None
    a = np.asarray(op.value.array())
    if a.size != 1 or a.dtype.kind != "f":
        return None
    return float(a.reshape(()))


def _bound(view: FusionView, nid: NodeId, tail: NodeId, fn: BinaryKind) -> float | None:
    """``c`` when ``nid`` is ``fn(tail, c)`` / ``fn(c, tail)`` with ``c`` a scalar constant."""
    op = view.node(nid).op
    if not (isinstance(op, Binary) and op.fn is fn):
        return None
    a, b = view.node(nid).inputs
    if a == b or tail not in (a, b):
        return None
    c = _scalar(view, b if a == tail else a)
    return None if c is None or math.isnan(c) else c


class ConvActFusion(PatternFusion):
    """``conv [+ residual] [-> relu / clip]`` -> ``conv[act=..., has_residual=...]``."""

    name = "fuse_conv_act"
    pattern = FusionPattern.CONV_ACT

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        op = node.op
        if not isinstance(op, Conv) or op.act is not ConvAct.NONE or op.has_residual:
            return None
        if node.id in claimed or not view.node(node.id).shape.dtype.is_float:
            return None
        inputs = list(node.inputs)
        nodes = [node.id]
        tail = node.id
        residual = self._residual(view, node, claimed)
        if residual is not None:
            add, r = residual
            nodes.append(add)
            inputs.append(r)
            tail = add
        act, clip, act_nodes = self._act(view, tail, claimed)
        nodes += act_nodes
        if act_nodes:
            tail = act_nodes[-1]
        if tail == node.id:
            return None
        fused = dataclasses.replace(op, act=act, clip=clip, has_residual=residual is not None)
        desc = " + ".join(view.desc(n) for n in nodes)
        why = view.infer(fused, inputs)
        if why is not None:
            self.miss(nodes, desc, why)
            return None
        return Match(tail, fused, tuple(inputs), frozenset(nodes), desc)

    def _residual(
        self, view: FusionView, node: Node, claimed: set[NodeId]
    ) -> tuple[NodeId, NodeId] | None:
        """(add node, residual node) when the conv's sole user adds a same-shape tensor."""
        adds = [
            u
            for u in view.consumers[node.id]
            if isinstance(view.node(u).op, Binary) and view.node(u).op.fn is BinaryKind.ADD  # type: ignore[attr-defined]
        ]
        if not adds or adds[0] in claimed:
            return None
        add = adds[0]
        desc = f"{view.desc(node.id)} + {view.desc(add)}"
        why = view.why_not_inner(node.id)
        a, b = view.node(add).inputs
        r = b if a == node.id else a
        if why is None and a == b:
            why = "the add reads the conv twice"
        if why is None and view.node(r).shape != node.shape:
            why = f"residual {view.node(r).shape} is not the conv output {node.shape}"
        if why is not None:
            if not self._other_takes(view, r, add):
                self.miss([node.id, add], desc, why)
            return None
        return add, r

    @staticmethod
    def _other_takes(view: FusionView, r: NodeId, add: NodeId) -> bool:
        """True when the add's other operand is an unfused conv read only by it (that
        conv takes the add: no near miss to report for this one)."""
        op = view.node(r).op
        plain = isinstance(op, Conv) and op.act is ConvAct.NONE and not op.has_residual
        return plain and view.sole_user(r) == add

    def _act(
        self, view: FusionView, tail: NodeId, claimed: set[NodeId]
    ) -> tuple[ConvAct, tuple[float, float], list[NodeId]]:
        """The activation reading ``tail`` (relu or a clip by scalar constants) and its
        nodes, or (NONE, (0, 0), [])."""
        none: tuple[ConvAct, tuple[float, float], list[NodeId]] = (ConvAct.NONE, (0.0, 0.0), [])
        if view.why_not_inner(tail) is not None or view.consumers[tail][0] in claimed:
            return none
        u = view.consumers[tail][0]
        uop = view.node(u).op
        if isinstance(uop, Unary) and uop.fn is UnaryKind.RELU:
            return ConvAct.RELU, (0.0, 0.0), [u]
        lo = _bound(view, u, tail, BinaryKind.MAX)
        if lo is not None:
            nxt = view.sole_user(u)
            hi = None if nxt is None else _bound(view, nxt, u, BinaryKind.MIN)
            if hi is not None and lo <= hi:
                return ConvAct.CLIP, (lo, hi), [u, nxt]  # type: ignore[list-item]
            if lo == 0.0:
                return ConvAct.RELU, (0.0, 0.0), [u]
            return ConvAct.CLIP, (lo, math.inf), [u]
        hi = _bound(view, u, tail, BinaryKind.MIN)
        if hi is not None:
            return ConvAct.CLIP, (-math.inf, hi), [u]
        return none
