"""HIR vocabulary: the fusion policy, the block kinds and the HIR node.

A HIR node is ``id = block(inputs) : shape`` like a MIR node, but its op is a *block*
(a linear layer, an attention, a SwiGLU FFN, ...) that lowering expands into one fused
MIR op or a chain of primitive ones. Blocks are frozen dataclasses; their fields are the
block's attributes, as for MIR ops.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from rlx.ops.base import Op, format_attrs
from rlx.ops.elementwise import UnaryKind
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.source import SourceLoc

__all__ = [
    "FusionPolicy",
    "HirBlock",
    "HirNode",
    "HirNodeId",
    "InputBlock",
    "ParamBlock",
    "ConstantBlock",
    "LinearBlock",
    "LinearFusedBlock",
    "SharedLinearPairBlock",
    "SwiGluBlock",
    "ResidualRmsNormBlock",
    "RmsNormBlock",
    "AttentionBlock",
    "DepthwiseConv1dCausalBlock",
    "DequantMatMulBlock",
    "GatedDeltaNetBlock",
    "RopeBlock",
    "MirBlock",
]

HirNodeId = int


class FusionPolicy(enum.Enum):
    """How blocks lower to MIR.

    DIRECT: each block becomes the fused MIR op that computes it (FusedMatMulBiasAct,
    FusedSwiGLU, FusedResidualRmsNorm, Attention, Rope, RmsNorm, DequantMatMul, ...).
    FUSABLE: each block becomes a chain of primitive ops (matmul, add, unary, reduce,
    softmax, reshape, ...) that the compile pipeline's fusion passes may re-fuse.
    """

    DIRECT = "direct"
    FUSABLE = "fusable"


class HirBlock:
    """Base of the block kinds; subclasses are frozen slotted dataclasses."""

    __slots__ = ()
    mnemonic: ClassVar[str] = "block"

    def attrs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def __str__(self) -> str:
        a = format_attrs(self.attrs())
        return f"{self.mnemonic}[{a}]" if a else self.mnemonic


@dataclass(frozen=True, slots=True)
class InputBlock(HirBlock):
    """A named module input."""

    mnemonic: ClassVar[str] = "input"
    name: str


@dataclass(frozen=True, slots=True)
class ParamBlock(HirBlock):
    """A named parameter; the name keeps the enclosing ``named`` scopes as a prefix."""

    mnemonic: ClassVar[str] = "param"
    name: str


@dataclass(frozen=True, slots=True)
class ConstantBlock(HirBlock):
    """A literal array (``value`` is an ``rlx.ops.core.ConstValue``)."""

    mnemonic: ClassVar[str] = "constant"
    value: Any


@dataclass(frozen=True, slots=True)
class LinearBlock(HirBlock):
    """``act(x @ w + bias)``; inputs ``(x, w[, bias])``, ``w`` stored ``[in, out]``."""

    mnemonic: ClassVar[str] = "linear"
    activation: UnaryKind | None
    has_bias: bool


@dataclass(frozen=True, slots=True)
class LinearFusedBlock(HirBlock):
    """Like LinearBlock with a bias, but always the fused op, whatever the policy."""

    mnemonic: ClassVar[str] = "linear_fused"
    activation: UnaryKind | None


@dataclass(frozen=True, slots=True)
class SharedLinearPairBlock(HirBlock):
    """``x @ w_first`` (slot 0) or ``x @ w_second`` (slot 1); inputs ``(x, w1, w2)``.
    The two slots of one pair lower together (one matmul over both weights when DIRECT)."""

    mnemonic: ClassVar[str] = "shared_linear_pair"
    slot: int


@dataclass(frozen=True, slots=True)
class SwiGluBlock(HirBlock):
    """``(silu(x @ gate_w) * (x @ up_w)) @ down_w``; inputs ``(x, up_w, gate_w, down_w)``."""

    mnemonic: ClassVar[str] = "swiglu_ffn"


@dataclass(frozen=True, slots=True)
class ResidualRmsNormBlock(HirBlock):
    """``rms_norm(x + residual) * gamma (+ beta)``; inputs ``(x, residual, gamma[, beta])``."""

    mnemonic: ClassVar[str] = "residual_rms_norm"
    eps: float
    has_beta: bool


@dataclass(frozen=True, slots=True)
class RmsNormBlock(HirBlock):
    """``x / sqrt(mean(x^2) + eps) * gamma (+ beta)`` over the last axis."""

    mnemonic: ClassVar[str] = "rms_norm"
    eps: float
    has_beta: bool


@dataclass(frozen=True, slots=True)
class AttentionBlock(HirBlock):
    """Scaled dot-product attention, inputs ``(q, k, v[, mask])`` in the layouts of the
    MIR Attention op (``q [B,Sq,H*D]``, ``k, v [B,Skv,Hkv*D]``); ``mask`` is an
    ``rlx.ops.nn.MaskKind``; ``scale`` None means ``1/sqrt(head_dim)``."""

    mnemonic: ClassVar[str] = "attention"
    num_heads: int
    head_dim: int
    mask: Any
    num_kv_heads: int
    scale: float | None


@dataclass(frozen=True, slots=True)
class DepthwiseConv1dCausalBlock(HirBlock):
    """Causal depthwise conv over ``[B, S, C]``; inputs ``(input, weight, left_pad)`` with
    ``left_pad [B, K-1, C]`` (the previous K-1 steps, zeros at the start) and ``weight``
    ``[C, K]``, ``[C, 1, K]`` or ``[C, 1, 1, K]``: ``y[b,s,c] = sum_j w[c,j] p[b,s+j,c]``
    where ``p = concat(left_pad, input)`` along the sequence."""

    mnemonic: ClassVar[str] = "depthwise_conv1d_causal"
    kernel_size: int


@dataclass(frozen=True, slots=True)
class DequantMatMulBlock(HirBlock):
    """``x @ dequant(w)``; inputs ``(x, w_q, scale, zp)`` or ``(x, packed)`` for GGUF
    schemes, as the MIR DequantMatMul op (``scheme`` an ``rlx.ops.quant.QuantScheme``)."""

    mnemonic: ClassVar[str] = "dequant_matmul"
    scheme: Any


@dataclass(frozen=True, slots=True)
class GatedDeltaNetBlock(HirBlock):
    """The gated delta rule (see ``rlx.ops.recurrent``). Inputs ``(q, k, v, g, beta[,
    state])``; with ``carry`` two nodes share the inputs: slot 0 is the output, slot 1
    the final state."""

    mnemonic: ClassVar[str] = "gated_delta_net"
    state_size: int
    carry: bool
    slot: int = 0


@dataclass(frozen=True, slots=True)
class RopeBlock(HirBlock):
    """Rotary embedding of the first ``n_rot`` dims of each head (halves rotated, as the
    MIR Rope op with ``interleaved=False``); inputs ``(x [B,S,H*D], cos, sin [S,n_rot/2])``."""

    mnemonic: ClassVar[str] = "rope"
    head_dim: int
    n_rot: int


@dataclass(frozen=True, slots=True)
class MirBlock(HirBlock):
    """Escape hatch: one MIR op, copied verbatim into the lowered graph."""

    mnemonic: ClassVar[str] = "mir"
    op: Op

    def __str__(self) -> str:
        return f"mir {self.op}"


@dataclass(frozen=True, slots=True)
class HirNode:
    """``id = block(inputs) : shape``, built inside the ``named`` scope ``name`` (dotted
    path, None at top level), at user line ``loc``."""

    id: HirNodeId
    block: HirBlock
    inputs: tuple[HirNodeId, ...]
    shape: Shape
    name: str | None = None
    loc: SourceLoc | None = field(default=None, compare=False, hash=False)

    def describe(self) -> str:
        """``attention block %5 (layer0.attn)``: how errors name this node."""
        where = f" ({self.name})" if self.name else ""
        return f"{self.block.mnemonic} block %{self.id}{where}"
