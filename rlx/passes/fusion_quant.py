"""Epilogue fusion for the integer matmuls.

In: a graph. Out: the graph where ``qmatmul`` / ``dynamic_qmatmul`` followed by a bias add,
an activation and a residual add is one node carrying them as its epilogue attributes
(``has_bias``, ``act``, ``has_residual``), so the native int8 GEMM applies them in
registers and no elementwise kernel is left after it:

    y = qmatmul(x, w)            [+ bias[N]]   [-> relu | gelu | gelu_tanh | silu]   [+ r]

A per-tensor 8-bit ``quantize`` feeding a ``qmatmul`` with the same scale and zero point
is folded in too (the qmatmul reads the f32 / bf16 activation and quantizes it in the
kernel, ``x_dtype``; the quantize node is dropped once nothing else reads it). The epilogue
steps are taken in order, from the integer matmul onwards, when the op does not have them
yet: the bias must be a float vector ``[N]`` over the last axis, the activation one
of :data:`~rlx.ops.qmatmul.EPILOGUE_ACTS`, the residual a float tensor with the product's
dims. Every swallowed intermediate must have this one user and not be a graph output; near
misses go to the fusion report with the reason (pattern ``quant_epilogue``).
"""

from __future__ import annotations

import dataclasses

from rlx.dtype import DType
from rlx.ir.mir import Node, NodeId
from rlx.ops.elementwise import Binary, BinaryKind, Unary
from rlx.ops.qmatmul import EPILOGUE_ACTS, DynamicQMatMul, IntEpilogueOp, QMatMul
from rlx.ops.quant import Quantize
from rlx.passes.fusion import FusionView, Match, PatternFusion, dims_str
from rlx.passes.report import FusionPattern

__all__ = ["QuantEpilogueFusion"]


class QuantEpilogueFusion(PatternFusion):
    """``(dynamic_)qmatmul [+ bias] [-> act] [+ residual]`` -> one integer matmul node."""

    name = "fuse_quant_epilogue"
    pattern = FusionPattern.QUANT_EPILOGUE

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        if isinstance(node.op, (QMatMul, DynamicQMatMul)) and node.id not in claimed:
            return self._match(view, node)
        return None

    def _next(self, view: FusionView, cur: NodeId, nodes: list[NodeId]) -> NodeId | None:
        """The sole user of ``cur`` (None when it has another user or is an output; a
        near miss is recorded when that user could have been fused)."""
        users = view.consumers[cur]
        if not users:
            return None
        why = view.why_not_inner(cur)
        if why is None:
            return users[0]
        fusable = [u for u in users if isinstance(view.node(u).op, (Unary, Binary))]
        if fusable and len(nodes) == 1:
            desc = f"{view.desc(cur)} -> {view.desc(fusable[0])}"
            self.miss([*nodes, fusable[0]], desc, why)
        return None

    @staticmethod
    def _add_operand(view: FusionView, add: NodeId, cur: NodeId) -> NodeId | None:
        """The other operand of ``add`` when it is an ADD reading ``cur`` once."""
        op = view.node(add).op
        if not (isinstance(op, Binary) and op.fn is BinaryKind.ADD):
            return None
        a, b = view.node(add).inputs
        if a == b:
            return None
        return b if a == cur else a

    @staticmethod
    def _quantize_input(view: FusionView, node: Node) -> NodeId | None:
        """The float input of the per-tensor 8-bit quantize feeding a qmatmul with the same
        scale and zero point (the qmatmul then quantizes inside its kernel; the quantize
        node goes when no other node reads it)."""
        op = node.op
        if not isinstance(op, QMatMul) or op.x_dtype is not None:
            return None
        q = view.node(node.inputs[0])
        qop = q.op
        if not (
            isinstance(qop, Quantize)
            and qop.axis is None
            and qop.dtype in (DType.I8, DType.U8)
            and qop.scales == (op.x_scale,)
            and qop.zero_points == (op.x_zero_point,)
        ):
            return None
        src = view.node(q.inputs[0]).shape
        return q.inputs[0] if src.dtype in (DType.F32, DType.BF16) else None

    def _match(self, view: FusionView, node: Node) -> Match | None:
        op: IntEpilogueOp = node.op  # type: ignore[assignment]
        x_float = self._quantize_input(view, node)
        if x_float is not None:
            xd = view.node(node.inputs[0]).op.dtype  # type: ignore[attr-defined]
            op = dataclasses.replace(op, x_dtype=xd)  # type: ignore[type-var]
        out = node.shape
        n = out.dims[-1] if out.rank else None
        nodes: list[NodeId] = [node.id]
        bias: NodeId | None = None
        act = op.epilogue_act
        residual: NodeId | None = None
        cur = node.id
        nxt = self._next(view, cur, nodes)
        # bias: a float vector [N]
        if nxt is not None and not op.has_bias and act is None and not op.residual_input:
            other = self._add_operand(view, nxt, cur)
            if other is not None:
                s = view.node(other).shape
                if s.rank == 1 and s.dims == (n,) and s.dtype.is_float:
                    bias, cur = other, nxt
                    nodes.append(nxt)
                    nxt = self._next(view, cur, nodes)
        # activation
        if nxt is not None and act is None and not op.residual_input:
            uop = view.node(nxt).op
            if isinstance(uop, Unary):
                if uop.fn in EPILOGUE_ACTS:
                    act, cur = uop.fn, nxt
                    nodes.append(nxt)
                    nxt = self._next(view, cur, nodes)
                else:
                    desc = f"{view.desc(cur)} -> {view.desc(nxt)}"
                    self.miss([*nodes, nxt], desc, f"{uop.fn.value} is not an epilogue act")
        # residual: a float tensor of the product's dims
        if nxt is not None and not op.residual_input:
            other = self._add_operand(view, nxt, cur)
            if other is not None:
                s = view.node(other).shape
                if s.dims == out.dims and s.dtype.is_float:
                    residual, cur = other, nxt
                    nodes.append(nxt)
                elif len(nodes) == 1:
                    desc = f"{view.desc(cur)} + {view.desc(nxt)}"
                    not_bias = f"addend {dims_str(s.dims)} is neither a bias [{n}] nor a residual"
                    self.miss([*nodes, nxt], desc, f"{not_bias} {dims_str(out.dims)}")
        if len(nodes) == 1 and x_float is None:
            return None
        fused = dataclasses.replace(
            op,  # type: ignore[type-var]
            has_bias=op.has_bias or bias is not None,
            act=act,
            has_residual=residual is not None,
        )
        inputs = list(node.inputs) + [i for i in (bias, residual) if i is not None]
        if x_float is not None:
            inputs[0] = x_float
        desc = " + ".join(view.desc(i) for i in nodes)
        why = view.infer(fused, inputs)
        if why is not None:
            self.miss(nodes, desc, why)
            return None
        return Match(cur, fused, tuple(inputs), frozenset(nodes), desc)
