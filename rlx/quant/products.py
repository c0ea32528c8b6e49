"""Integer activation x activation products. In: a float graph. Out: the graph where
attention and batched products of two activations run as ``dynamic_qbatch_matmul`` (both
operands quantized at run time: the left per row, the right per column, see
:class:`~rlx.ops.qmatmul.DynamicQBatchMatMul`):

* ``attention`` (f32, every query head with its own kv head, no mask or an additive custom
  mask) becomes ``q k^T`` (s8 rows x s8 columns, the softmax scale folded into the
  product), the mask add, ``softmax``, then ``probabilities x v`` (u8 rows: probabilities
  are >= 0, so zero point 0 and 255 levels over [0, max]). This replaces the fused float
  attention kernel with two integer GEMMs and a softmax;
* ``matmul(a, b)`` of two computed f32 tensors of rank >= 2 with equal leading dims, and
  ``dot_general`` with leading batch axes, ``a``'s last axis contracted with ``b``'s
  second-to-last (or last: the transposed product).

``notes`` names each rewritten node (label -> how) and each attention left float (why).
"""

from __future__ import annotations

from rlx.dtype import DType
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.core import Constant, Param
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.linalg import DotGeneral, MatMul
from rlx.ops.movement import Reshape, Transpose
from rlx.ops.nn import Attention, MaskType
from rlx.ops.qmatmul import ActQuant, DynamicQBatchMatMul
from rlx.ops.reduce import Softmax
from rlx.passes.base import Rewriter

__all__ = ["QuantizeActivationProducts"]

_WEIGHTS = (Param, Constant)


class QuantizeActivationProducts:
    """Pass: attention and activation x activation products -> ``dynamic_qbatch_matmul``
    (see the module docstring)."""

    name = "quantize_activation_products"

    def __init__(self) -> None:
        self.done: dict[str, str] = {}
        self.kept: dict[str, str] = {}

    def _attention_ok(self, g: Graph, node: Node) -> str | None:
        op: Attention = node.op  # type: ignore[assignment]
        if node.dtype is not DType.F32:
            return f"attention on {node.dtype}, not f32"
        if op.kv_heads != op.num_heads:
            return "grouped-query attention (kv heads shared by several query heads)"
        if op.mask.type not in (MaskType.NONE, MaskType.CUSTOM):
            return f"{op.mask.type.value} mask (only none / an additive mask are decomposed)"
        return None

    def _product(self, g: Graph, node: Node) -> bool | None:
        """``transpose_b`` when ``node`` is a product of two activations to rewrite."""
        a, b = (g.nodes[i] for i in node.inputs)
        if node.dtype is not DType.F32 or a.dtype is not DType.F32 or b.dtype is not DType.F32:
            return None
        if isinstance(a.op, _WEIGHTS) or isinstance(b.op, _WEIGHTS):
            return None
        ra, rb = a.shape.rank, b.shape.rank
        if ra < 2 or ra != rb or a.shape.dims[:-2] != b.shape.dims[:-2]:
            return None
        if isinstance(node.op, MatMul):
            return False
        op: DotGeneral = node.op  # type: ignore[assignment]
        nb = ra - 2
        batch = tuple(range(nb))
        lb = tuple(x % ra for x in op.lhs_batch)
        rbt = tuple(x % rb for x in op.rhs_batch)
        lc = tuple(x % ra for x in op.lhs_contract)
        rc = tuple(x % rb for x in op.rhs_contract)
        if lb != batch or rbt != batch or lc != (ra - 1,) or rc not in ((rb - 2,), (rb - 1,)):
            return None
        return rc == (rb - 1,)

    def _attention(self, rw: Rewriter, node: Node) -> NodeId:
        op: Attention = node.op  # type: ignore[assignment]
        q, k, v = (rw.map[i] for i in node.inputs[:3])
        h, d, loc = op.num_heads, op.head_dim, node.loc

        def heads(x: NodeId) -> NodeId:
            b, s, _ = rw.dst.nodes[x].shape.dims
            r = rw.emit(Reshape((b, s, h, d)), [x], loc)
            return rw.emit(Transpose((0, 2, 1, 3)), [r], loc)

        qh, kh, vh = heads(q), heads(k), heads(v)
        scores = rw.emit(DynamicQBatchMatMul(ActQuant.S8, True, op.effective_scale), [qh, kh], loc)
        if len(node.inputs) == 4:
            scores = rw.emit(Binary(BinaryKind.ADD), [scores, rw.map[node.inputs[3]]], loc)
        probs = rw.emit(Softmax(3), [scores], loc)
        out = rw.emit(DynamicQBatchMatMul(ActQuant.U8, False, 1.0), [probs, vh], loc)
        t = rw.emit(Transpose((0, 2, 1, 3)), [out], loc)
        return rw.emit(Reshape(node.shape.dims), [t], loc)

    def run(self, graph: Graph) -> Graph:
        self.done, self.kept = {}, {}
        plans: dict[NodeId, bool | str] = {}
        for node in graph.nodes:
            if isinstance(node.op, Attention):
                why = self._attention_ok(graph, node)
                if why is None:
                    plans[node.id] = "attention"
                else:
                    self.kept[node.label] = why
            elif isinstance(node.op, (MatMul, DotGeneral)):
                tb = self._product(graph, node)
                if tb is not None:
                    plans[node.id] = tb
        if not plans:
            return graph
        rw = Rewriter(graph)
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            plan = plans.get(nid)
            if plan is None:
                rw.copy(node)
            elif plan == "attention":
                rw.map[nid] = self._attention(rw, node)
                self.done[node.label] = (
                    "q k^T: s8 rows x s8 columns, probabilities x v: u8 rows x s8 columns "
                    "(dynamic_qbatch_matmul), softmax in f32"
                )
            else:
                a, b = (rw.map[i] for i in node.inputs)
                op = DynamicQBatchMatMul(ActQuant.S8, bool(plan), 1.0)
                rw.map[nid] = rw.emit(op, [a, b], node.loc)
                self.done[node.label] = "s8 rows x s8 columns (dynamic_qbatch_matmul)"
        return rw.finish()
