"""HIR: block-level model building. In: builder calls (``m.linear``, ``m.attention``,
``m.swiglu_ffn``, ...). Out: a :class:`HirModule`, lowered to a MIR graph by
:meth:`HirModule.lower_to_mir` under a :class:`FusionPolicy` (see ``hir_lower.py``).

Every builder infers the block's shape (or checks a given ``out_shape`` against it) and
records the user line; a bad shape raises ShapeError naming the block, the tensors and
that line. ``named("layer0", fn)`` runs ``fn`` inside a name scope: params created there
are called ``layer0.<name>`` (scopes nest: ``layer0.attn.wq``) and nodes remember the
scope. Inputs are the module's interface and keep their names.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from rlx import source
from rlx.dtype import DType
from rlx.errors import RlxError, ShapeError
from rlx.ir.hir_blocks import (
    AttentionBlock,
    ConstantBlock,
    DepthwiseConv1dCausalBlock,
    DequantMatMulBlock,
    FusionPolicy,
    GatedDeltaNetBlock,
    HirBlock,
    HirNode,
    HirNodeId,
    InputBlock,
    LinearBlock,
    LinearFusedBlock,
    MirBlock,
    ParamBlock,
    ResidualRmsNormBlock,
    RmsNormBlock,
    RopeBlock,
    SharedLinearPairBlock,
    SwiGluBlock,
)
from rlx.ir.hir_shapes import infer_block
from rlx.ops.base import Op
from rlx.ops.elementwise import UnaryKind
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph

__all__ = ["HirModule", "HirNode", "HirNodeId", "FusionPolicy", "format_hir"]

T = TypeVar("T")


class HirModule:
    """A HIR module: named nodes of blocks, outputs and a fusion policy (DIRECT unless
    set). Builders return node ids (ints, insertion order)."""

    def __init__(self, name: str = "module", fusion_policy: FusionPolicy = FusionPolicy.DIRECT):
        self.name = name
        self.nodes: list[HirNode] = []
        self.outputs: list[HirNodeId] = []
        self.fusion_policy = fusion_policy
        self._scope: list[str] = []

    # ---- core -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, nid: HirNodeId) -> HirNode:
        return self.nodes[nid]

    def shape(self, nid: HirNodeId) -> Shape:
        return self.nodes[nid].shape

    @property
    def scope(self) -> str | None:
        """The current dotted name scope, or None at top level."""
        return ".".join(self._scope) if self._scope else None

    def with_fusion_policy(self, policy: FusionPolicy) -> HirModule:
        """Set the policy used by :meth:`lower_to_mir`; returns self."""
        if not isinstance(policy, FusionPolicy):
            raise ShapeError(f"fusion policy must be a FusionPolicy, got {policy!r}")
        self.fusion_policy = policy
        return self

    def _push(
        self,
        block: HirBlock,
        inputs: Sequence[Any],
        out_shape: Shape | None,
    ) -> HirNodeId:
        loc = source.capture()
        nid = len(self.nodes)
        where = f"{block.mnemonic} block %{nid}" + (f" ({self.scope})" if self._scope else "")
        ins = []
        for i in inputs:
            if not _is_node_id(i, nid):
                raise ShapeError(
                    f"{where}: input {i!r} is not a node of HIR module {self.name!r} ({nid} nodes)",
                    node=nid,
                    loc=loc,
                )
            ins.append(operator.index(i))
        try:
            shape = infer_block(block, tuple(self.nodes[i].shape for i in ins))
        except RlxError as e:
            raise ShapeError(f"{where}: {e.bare_message}", node=nid, loc=loc) from None
        if out_shape is not None and _as_shape(out_shape, shape.dtype) != shape:
            raise ShapeError(
                f"{where}: given out_shape {_as_shape(out_shape, shape.dtype)} but the "
                f"block's inputs give {shape}",
                node=nid,
                loc=loc,
            )
        self.nodes.append(HirNode(nid, block, tuple(ins), shape, self.scope, loc))
        return nid

    def set_outputs(self, outputs: Iterable[HirNodeId] | HirNodeId) -> None:
        """Declare the module outputs (a node id, or a sequence / tuple of them)."""
        outs = [outputs] if isinstance(outputs, int) else [int(o) for o in outputs]
        for o in outs:
            if not 0 <= o < len(self.nodes):
                raise ShapeError(f"output id {o} is not a node of HIR module {self.name!r}")
        self.outputs = outs

    def named(self, name: str, build: Callable[[HirModule], T]) -> T:
        """Run ``build(self)`` inside the name scope ``name``; returns what it returns."""
        if not isinstance(name, str) or not name or "." in name:
            raise ShapeError(f"scope name must be a non-empty string without '.', got {name!r}")
        self._scope.append(name)
        try:
            return build(self)
        finally:
            self._scope.pop()

    # ---- leaves -----------------------------------------------------------------------

    def input(
        self, name: str, shape: Shape | Sequence[Any], dtype: DType | str | None = None
    ) -> HirNodeId:
        """A named module input (dims plus ``dtype``, default f32, or a Shape)."""
        self._check_name(name, InputBlock, "input")
        return self._push_leaf(InputBlock(name), _as_shape(shape, dtype))

    def param(
        self, name: str, shape: Shape | Sequence[Any], dtype: DType | str | None = None
    ) -> HirNodeId:
        """A named parameter; its full name carries the enclosing scopes as a prefix."""
        full = f"{self.scope}.{name}" if self._scope else name
        self._check_name(full, ParamBlock, "param")
        return self._push_leaf(ParamBlock(full), _as_shape(shape, dtype))

    def constant(self, value: Any, dtype: DType | str | None = None) -> HirNodeId:
        """A literal array or scalar (Python floats become f32)."""
        from rlx.ops.core import ConstValue

        cv = ConstValue.of(value, DType.parse(dtype) if dtype else None)
        return self._push_leaf(ConstantBlock(cv), Shape(cv.dims, cv.dtype))

    def _push_leaf(self, block: HirBlock, shape: Shape) -> HirNodeId:
        nid = len(self.nodes)
        self.nodes.append(HirNode(nid, block, (), shape, self.scope, source.capture()))
        return nid

    def _check_name(self, name: str, kind: type[HirBlock], what: str) -> None:
        if not isinstance(name, str) or not name:
            raise ShapeError(f"{what} name must be a non-empty string, got {name!r}")
        for n in self.nodes:
            if isinstance(n.block, kind) and n.block.name == name:  # type: ignore[attr-defined]
                raise ShapeError(f"{what} name {name!r} is already used by node %{n.id}")

    # ---- blocks -----------------------------------------------------------------------

    def linear(
        self,
        x: HirNodeId,
        w: HirNodeId,
        bias: HirNodeId | None = None,
        activation: UnaryKind | None = None,
        out_shape: Shape | None = None,
    ) -> HirNodeId:
        """``activation(x @ w + bias)``, ``w`` stored ``[in, out]``, ``bias [out]``."""
        ins = [x, w] + ([bias] if bias is not None else [])
        return self._push(LinearBlock(activation, bias is not None), ins, out_shape)

    def linear_fused(
        self,
        x: HirNodeId,
        w: HirNodeId,
        bias: HirNodeId,
        activation: UnaryKind | None = None,
        out_shape: Shape | None = None,
    ) -> HirNodeId:
        """Like :meth:`linear` with a bias, lowered to FusedMatMulBiasAct under either
        policy (an explicit request for the fused kernel)."""
        return self._push(LinearFusedBlock(activation), [x, w, bias], out_shape)

    def shared_linear_pair(
        self, x: HirNodeId, w_first: HirNodeId, w_second: HirNodeId, out_shape: Shape | None = None
    ) -> tuple[HirNodeId, HirNodeId]:
        """``(x @ w_first, x @ w_second)``: two projections of one input (gate+up, K+V)."""
        ins = [x, w_first, w_second]
        a = self._push(SharedLinearPairBlock(0), ins, out_shape)
        b = self._push(SharedLinearPairBlock(1), ins, out_shape)
        return a, b

    def swiglu_ffn(
        self,
        x: HirNodeId,
        up_w: HirNodeId,
        gate_w: HirNodeId,
        down_w: HirNodeId,
        out_shape: Shape | None = None,
    ) -> HirNodeId:
        """``(silu(x @ gate_w) * (x @ up_w)) @ down_w``."""
        return self._push(SwiGluBlock(), [x, up_w, gate_w, down_w], out_shape)

    def residual_rms_norm(
        self,
        x: HirNodeId,
        residual: HirNodeId,
        gamma: HirNodeId,
        beta: HirNodeId | None = None,
        eps: float = 1e-6,
        out_shape: Shape | None = None,
    ) -> HirNodeId:
        """``rms_norm(x + residual) * gamma (+ beta)`` over the last axis."""
        ins = [x, residual, gamma] + ([beta] if beta is not None else [])
        return self._push(ResidualRmsNormBlock(float(eps), beta is not None), ins, out_shape)

    def rms_norm(
        self,
        x: HirNodeId,
        gamma: HirNodeId,
        beta: HirNodeId | None = None,
        eps: float = 1e-6,
        out_shape: Shape | None = None,
    ) -> HirNodeId:
        """``x / sqrt(mean(x^2, -1) + eps) * gamma (+ beta)``."""
        ins = [x, gamma] + ([beta] if beta is not None else [])
        return self._push(RmsNormBlock(float(eps), beta is not None), ins, out_shape)

    def attention(
        self,
        q: HirNodeId,
        k: HirNodeId,
        v: HirNodeId,
        mask: HirNodeId | None = None,
        num_heads: int | None = None,
        head_dim: int | None = None,
        mask_kind: Any = None,
        out_shape: Shape | None = None,
        *,
        num_kv_heads: int | None = None,
        scale: float | None = None,
    ) -> HirNodeId:
        """Multi-head (grouped-query when ``num_kv_heads < num_heads``) attention.
        ``mask_kind`` is a MaskKind (default: none, or custom when ``mask`` is given);
        a custom ``mask`` is additive, broadcastable to ``[B, H, Sq, Skv]``. The seed's
        positional form ``attention(q, k, v, mask, num_heads, head_dim, mask_kind,
        out_shape)`` works as well as keywords; ``num_heads`` and ``head_dim`` are required."""
        from rlx.ops.nn import MaskKind

        if num_heads is None or head_dim is None:
            raise ShapeError(
                f"attention block %{len(self.nodes)} of HIR module {self.name!r}: num_heads and "
                f"head_dim are required, given num_heads={num_heads!r}, head_dim={head_dim!r}"
            )
        if mask_kind is None:
            mask_kind = MaskKind.custom() if mask is not None else MaskKind.none()
        block = AttentionBlock(
            int(num_heads),
            int(head_dim),
            mask_kind,
            int(num_kv_heads if num_kv_heads is not None else num_heads),
            None if scale is None else float(scale),
        )
        ins = [q, k, v] + ([mask] if mask is not None else [])
        return self._push(block, ins, out_shape)

    def depthwise_conv1d_causal(
        self,
        input: HirNodeId,
        weight: HirNodeId,
        left_pad: HirNodeId,
        kernel_size: int,
        out_shape: Shape | None = None,
    ) -> HirNodeId:
        """Causal depthwise conv over ``[B, S, C]`` with ``left_pad [B, K-1, C]`` holding
        the previous steps (see DepthwiseConv1dCausalBlock)."""
        block = DepthwiseConv1dCausalBlock(int(kernel_size))
        return self._push(block, [input, weight, left_pad], out_shape)

    def dequant_matmul(
        self,
        x: HirNodeId,
        w: HirNodeId,
        scale: HirNodeId | None = None,
        zp: HirNodeId | None = None,
        scheme: Any = None,
        out_shape: Shape | None = None,
    ) -> HirNodeId:
        """``x @ dequantize(w)`` for a QuantScheme: ``scale`` and ``zp`` for the Int8/Int4
        block schemes, none for GGUF (scales live in the packed bytes)."""
        from rlx.ops.quant import QuantScheme

        where = f"dequant_matmul block %{len(self.nodes)}"
        if not isinstance(scheme, QuantScheme):
            msg = f"{where}: scheme must be a QuantScheme, got {scheme!r}"
            raise ShapeError(msg, loc=source.capture())
        if scheme.num_inputs() == 2:
            if scale is not None or zp is not None:
                msg = (
                    f"{where}: {scheme} takes no scale / zp inputs (they live in the packed bytes)"
                )
                raise ShapeError(msg, loc=source.capture())
            ins = [x, w]
        else:
            if scale is None or zp is None:
                raise ShapeError(
                    f"{where}: {scheme} needs scale and zp inputs", loc=source.capture()
                )
            ins = [x, w, scale, zp]
        return self._push(DequantMatMulBlock(scheme), ins, out_shape)

    def gated_delta_net(
        self,
        q: HirNodeId,
        k: HirNodeId,
        v: HirNodeId,
        g: HirNodeId,
        beta: HirNodeId,
        state_size: int,
        out_shape: Shape | None = None,
    ) -> HirNodeId:
        """Gated DeltaNet from a zero state; returns the output ``[B, T, H, V]``."""
        return self._push(GatedDeltaNetBlock(int(state_size), False), [q, k, v, g, beta], out_shape)

    def gated_delta_net_carry(
        self,
        q: HirNodeId,
        k: HirNodeId,
        v: HirNodeId,
        g: HirNodeId,
        beta: HirNodeId,
        state: HirNodeId,
        state_size: int,
        out_shape: Shape | None = None,
    ) -> tuple[HirNodeId, HirNodeId]:
        """Gated DeltaNet from ``state [B, H, K, V]``; returns ``(output, final_state)``
        (``out_shape`` checks the output)."""
        ins = [q, k, v, g, beta, state]
        out = self._push(GatedDeltaNetBlock(int(state_size), True, 0), ins, out_shape)
        new_state = self._push(GatedDeltaNetBlock(int(state_size), True, 1), ins, None)
        return out, new_state

    def rope(
        self,
        x: HirNodeId,
        cos: HirNodeId,
        sin: HirNodeId,
        head_dim: int,
        n_rot: int | None = None,
        out_shape: Shape | None = None,
    ) -> HirNodeId:
        """Rotary embedding of the first ``n_rot`` (default all) dims of each head."""
        block = RopeBlock(int(head_dim), int(head_dim if n_rot is None else n_rot))
        return self._push(block, [x, cos, sin], out_shape)

    def mir(
        self, op: Op, inputs: Sequence[HirNodeId] = (), out_shape: Shape | None = None
    ) -> HirNodeId:
        """Escape hatch: any MIR op, shape from the op's own rule."""
        if not isinstance(op, Op):
            raise ShapeError(f"mir: expected an Op instance, got {op!r}")
        return self._push(MirBlock(op), inputs, out_shape)

    # ---- lowering and printing --------------------------------------------------------

    def lower_to_mir(self, policy: FusionPolicy | None = None) -> Graph:
        """A new MIR graph computing the module; LowerError naming the HIR node and the
        user line that built it on failure. ``policy`` defaults to the module's."""
        from rlx.ir.hir_lower import lower

        return lower(self, policy or self.fusion_policy)

    def inspect(self) -> str:
        """The HIR listing: one line per node, with its scope."""
        return format_hir(self)

    def __str__(self) -> str:
        return self.inspect()

    def __repr__(self) -> str:
        return (
            f"<HirModule {self.name!r}: {len(self.nodes)} nodes, "
            f"policy={self.fusion_policy.name}, outputs={self.outputs}>"
        )


def _is_node_id(i: object, n: int) -> bool:
    if isinstance(i, bool) or not hasattr(i, "__index__"):
        return False
    return 0 <= operator.index(i) < n  # type: ignore[arg-type]


def _as_shape(shape: Shape | Sequence[Any], dtype: DType | str | None = None) -> Shape:
    if isinstance(shape, Shape):
        return shape
    return Shape(shape, dtype or DType.F32)


def format_hir(m: HirModule) -> str:
    """``%2:f32[2,8] = linear[activation=none, has_bias=False] %0 %1   # layer0``."""
    ins = [n for n in m.nodes if isinstance(n.block, InputBlock)]
    head = ", ".join(f"{n.block.name}: {n.shape}" for n in ins)  # type: ignore[attr-defined]
    lines = [f"hir {m.name}({head}) policy={m.fusion_policy.name.lower()} {{"]
    for n in m.nodes:
        if isinstance(n.block, (InputBlock, ParamBlock)):
            rhs = f"{n.block.mnemonic} {n.block.name!r}"
        elif isinstance(n.block, ConstantBlock):
            rhs = f"constant {n.block.value!r}"
        else:
            rhs = str(n.block) + "".join(f" %{i}" for i in n.inputs)
        line = f"  %{n.id}:{n.shape} = {rhs}"
        if n.name:
            line = f"{line:<60}  # {n.name}"
        lines.append(line)
    lines.append("  return " + ", ".join(f"%{o}" for o in m.outputs))
    lines.append("}")
    return "\n".join(lines)
