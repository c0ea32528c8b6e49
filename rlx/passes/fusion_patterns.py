"""Pattern fusions around matmuls and norms.

* :class:`MatMulBiasActFusion`: ``matmul(x, w) [+ bias] [-> act]`` -> ``fused_matmul_bias_act``
  when at least a bias or an activation follows; the bias must be a vector over the last
  axis (``[N]`` for an ``[..., N]`` product) and the activation a unary the fused op takes.
* :class:`ResidualNormFusion`: ``layer_norm(x + r)`` / ``rms_norm(x + r)`` with ``x`` and
  ``r`` of the same shape -> ``fused_residual_layer_norm`` / ``fused_residual_rms_norm``.
* :class:`SwiGLUFusion`: ``silu(x @ w_gate) * (x @ w_up)`` (either operand order) ->
  ``fused_swiglu`` when both matmuls read the same ``x``.

Every swallowed intermediate must have this one user and not be a graph output; near
misses are recorded in the fusion report with the reason.
"""

from __future__ import annotations

from rlx.ir.mir import Node, NodeId
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct, FusedResidualLN, FusedResidualRmsNorm, FusedSwiGLU
from rlx.ops.linalg import MatMul
from rlx.ops.norm import LayerNorm, RmsNorm
from rlx.passes.fusion import FusionView, Match, PatternFusion, dims_str
from rlx.passes.report import FusionPattern

__all__ = ["MatMulBiasActFusion", "ResidualNormFusion", "SwiGLUFusion"]


def _is(view: FusionView, nid: NodeId, fn: BinaryKind) -> bool:
    op = view.node(nid).op
    return isinstance(op, Binary) and op.fn is fn


class MatMulBiasActFusion(PatternFusion):
    """``matmul [+ bias] [-> activation]`` -> ``fused_matmul_bias_act``."""

    name = "fuse_matmul_bias_act"
    pattern = FusionPattern.MATMUL_BIAS_ACT

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        if isinstance(node.op, MatMul) and node.id not in claimed:
            return self._match(view, node.id)
        return None

    def _bias(self, view: FusionView, mm: NodeId) -> tuple[NodeId, NodeId] | None:
        """(add node, bias node) when the sole user of ``mm`` is a valid bias add."""
        users = view.consumers[mm]
        adds = [u for u in users if _is(view, u, BinaryKind.ADD)]
        if not adds:
            return None
        add = adds[0]
        desc = f"{view.desc(mm)} + {view.desc(add)}"
        why = view.why_not_inner(mm)
        if why:
            self.miss([mm, add], desc, why)
            return None
        a, b = view.node(add).inputs
        if a == b:
            self.miss([mm, add], desc, "the add reads the product twice")
            return None
        bias = b if a == mm else a
        out = view.node(mm).shape
        bshape = view.node(bias).shape
        if bshape.rank != 1 or not out.rank or bshape.dims[0] != out.dims[-1]:
            self.miss(
                [mm, add],
                desc,
                f"bias shape {dims_str(bshape.dims)} is not a vector over the last axis "
                f"of {dims_str(out.dims)}",
            )
            return None
        return add, bias

    def _act(self, view: FusionView, cur: NodeId) -> NodeId | None:
        users = view.consumers[cur]
        acts = [u for u in users if isinstance(view.node(u).op, Unary)]
        if not acts:
            return None
        act = acts[0]
        why = view.why_not_inner(cur)
        if why:
            self.miss([cur, act], f"{view.desc(cur)} -> {view.desc(act)}", why)
            return None
        return act

    def _match(self, view: FusionView, mm: NodeId) -> Match | None:
        x, w = view.node(mm).inputs
        nodes = [mm]
        inputs = [x, w]
        bias = self._bias(view, mm)
        tail = mm
        if bias is not None:
            add, b = bias
            nodes.append(add)
            inputs.append(b)
            tail = add
        act_node = self._act(view, tail)
        act = None
        if act_node is not None:
            act = view.node(act_node).op.fn  # type: ignore[attr-defined]
            op = FusedMatMulBiasAct(act, bias is not None)
            why = view.infer(op, inputs)
            if why is None:
                nodes.append(act_node)
                tail = act_node
            else:
                self.miss([*nodes, act_node], f"{view.desc(tail)} -> {view.desc(act_node)}", why)
                act = None
        if tail == mm:
            return None
        op = FusedMatMulBiasAct(act, bias is not None)
        why = view.infer(op, inputs)
        desc = " + ".join(view.desc(n) for n in nodes)
        if why is not None:
            self.miss(nodes, desc, why)
            return None
        return Match(tail, op, tuple(inputs), frozenset(nodes), desc)


class ResidualNormFusion(PatternFusion):
    """``layer_norm(x + r)`` / ``rms_norm(x + r)`` -> the fused residual norm."""

    name = "fuse_residual_norm"
    pattern = FusionPattern.RESIDUAL_NORM

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        op = node.op
        if not isinstance(op, (LayerNorm, RmsNorm)):
            return None
        s = node.inputs[0]
        if not _is(view, s, BinaryKind.ADD) or s in claimed:
            return None
        desc = f"{view.desc(s)} + {view.desc(node.id)}"
        why = view.why_not_inner(s)
        a, r = view.node(s).inputs
        sa, sr = view.node(a).shape, view.node(r).shape
        if why is None and sa.dims != sr.dims:
            why = f"residual add broadcasts {dims_str(sa.dims)} and {dims_str(sr.dims)}"
        cls = FusedResidualLN if isinstance(op, LayerNorm) else FusedResidualRmsNorm
        fused = cls(op.eps, op.has_beta)
        inputs = (a, r, *node.inputs[1:])
        if why is None:
            why = view.infer(fused, inputs)
        if why is not None:
            self.miss([s, node.id], desc, why)
            return None
        return Match(node.id, fused, inputs, frozenset((s, node.id)), desc)


class SwiGLUFusion(PatternFusion):
    """``silu(x @ w_gate) * (x @ w_up)`` -> ``fused_swiglu``."""

    name = "fuse_swiglu"
    pattern = FusionPattern.SWIGLU

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        return self._match(view, node.id) if _is(view, node.id, BinaryKind.MUL) else None

    def _match(self, view: FusionView, mul: NodeId) -> Match | None:
        p, q = view.node(mul).inputs
        for silu, up in ((p, q), (q, p)):
            sop = view.node(silu).op
            if not (isinstance(sop, Unary) and sop.fn is UnaryKind.SILU):
                continue
            gate = view.node(silu).inputs[0]
            if not isinstance(view.node(gate).op, MatMul) or not isinstance(
                view.node(up).op, MatMul
            ):
                continue
            nodes = [gate, silu, up, mul]
            desc = " * ".join((f"silu({view.desc(gate)})", view.desc(up))) + f" ({view.desc(mul)})"
            x, wg = view.node(gate).inputs
            x2, wu = view.node(up).inputs
            if x != x2:
                mismatch = (
                    f"gate and up matmuls read different inputs {view.ref(x)} and {view.ref(x2)}"
                )
                self.miss(nodes, desc, mismatch)
                return None
            for inner in (gate, silu, up):
                why = view.why_not_inner(inner)
                if why:
                    self.miss(nodes, desc, why)
                    return None
            op = FusedSwiGLU()
            why = view.infer(op, (x, wg, wu))
            if why is not None:
                self.miss(nodes, desc, why)
                return None
            return Match(mul, op, (x, wg, wu), frozenset(nodes), desc)
        return None
