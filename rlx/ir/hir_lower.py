"""HIR -> MIR lowering. In: a HirModule and a FusionPolicy. Out: a new MIR Graph.

One lowering function per block kind, registered with ``@_lowers(Block)``; each gets the
block's MIR input ids and returns the MIR id of its result. What each block becomes:

=====================  ===============================  =================================
block                  DIRECT                           FUSABLE
=====================  ===============================  =================================
linear                 fused_matmul_bias_act            matmul (+ add) (+ unary)
linear_fused           fused_matmul_bias_act            fused_matmul_bias_act (explicit)
shared_linear_pair     fused_matmul_bias_act over       two matmuls
                       concat(w1, w2), then narrow
swiglu_ffn             fused_swiglu + matmul            matmul, silu, matmul, mul, matmul
residual_rms_norm      fused_residual_rms_norm          add + the rms_norm chain
rms_norm               rms_norm                         mul, mean, add, rsqrt, mul, mul
attention              attention                        reshape/transpose, matmul, scale,
                                                        mask (constant; for symbolic S
                                                        compare of position counters; or
                                                        the mask input), softmax,
                                                        matmul, transpose/reshape, then
                                                        0 on queries that see no key
rope                   rope                             narrow, mul, sub/add, concat
depthwise_conv1d       concat, transpose, conv          concat, K shifted narrows * w, add
                       (symbolic S, both policies: conv of the input with left padding
                       + conv of left_pad gathered onto the first K-1 rows)
dequant_matmul         dequant_matmul                   cast/reshape/sub/mul decode + matmul
                                                        (GGUF: dequant_matmul, no
                                                        primitive decode of K-quants)
gated_delta_net        gated_delta_net                  scan over the time axis with the
                                                        delta-rule step as its body
gated_delta_net_carry  two gated_delta_net nodes        two scans (output_index 1 for the
                       (output, final state)            outputs, 0 for the final state)
mir                    the op itself                    the op itself
=====================  ===============================  =================================

Weights keep their param names. Every MIR node built for a HIR node carries that HIR
node's source line; any failure becomes a LowerError naming the HIR node and that line.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import LowerError, RlxError
from rlx.ir.hir_blocks import (
    AttentionBlock,
    ConstantBlock,
    DepthwiseConv1dCausalBlock,
    DequantMatMulBlock,
    FusionPolicy,
    GatedDeltaNetBlock,
    HirBlock,
    HirNode,
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
from rlx.ir.mir import Graph, NodeId
from rlx.ops.base import Op
from rlx.ops.elementwise import UnaryKind

__all__ = ["lower", "LowerCtx", "dequant_op"]


@dataclasses.dataclass
class LowerCtx:
    """State of one lowering: the graph being built, the policy, and results shared by
    several HIR nodes (the two slots of a shared_linear_pair)."""

    graph: Graph
    policy: FusionPolicy
    shared: dict[tuple[Any, ...], NodeId] = dataclasses.field(default_factory=dict)

    @property
    def direct(self) -> bool:
        return self.policy is FusionPolicy.DIRECT


Lowering = Callable[[LowerCtx, HirNode, list[NodeId]], NodeId]
_LOWERINGS: dict[type[HirBlock], Lowering] = {}


def _lowers(cls: type[HirBlock]) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        _LOWERINGS[cls] = fn
        return fn

    return deco


def lower(hir: Any, policy: FusionPolicy) -> Graph:
    """Lower every node of ``hir`` (a HirModule) under ``policy``; returns the MIR graph
    with the module's outputs."""
    if not isinstance(policy, FusionPolicy):
        raise LowerError(f"fusion policy must be a FusionPolicy, got {policy!r}")
    if not hir.outputs:
        raise LowerError(f"HIR module {hir.name!r} has no outputs (call set_outputs)")
    ctx = LowerCtx(Graph(hir.name), policy)
    g = ctx.graph
    mapping: dict[int, NodeId] = {}
    for node in hir.nodes:
        before = len(g.nodes)
        try:
            out = _LOWERINGS[type(node.block)](ctx, node, [mapping[i] for i in node.inputs])
        except RlxError as e:
            raise LowerError(
                f"cannot lower {node.describe()} under {policy.name}: {e.bare_message}",
                node=node.id,
                loc=node.loc,
            ) from None
        got = g.nodes[out].shape
        if got != node.shape:
            raise LowerError(
                f"lowering {node.describe()} under {policy.name} produced {got}, the block's "
                f"shape is {node.shape}",
                node=node.id,
                loc=node.loc,
            )
        for k in range(before, len(g.nodes)):
            g.nodes[k] = dataclasses.replace(g.nodes[k], loc=node.loc)
        mapping[node.id] = out
    g.set_outputs([mapping[o] for o in hir.outputs])
    return g


# ---- leaves and the escape hatch -----------------------------------------------------


@_lowers(InputBlock)
def _input(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    return ctx.graph.input(node.block.name, node.shape)  # type: ignore[attr-defined]


@_lowers(ParamBlock)
def _param(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    return ctx.graph.param(node.block.name, node.shape)  # type: ignore[attr-defined]


@_lowers(ConstantBlock)
def _constant(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    from rlx.ops.core import Constant

    return ctx.graph.apply(Constant(node.block.value))  # type: ignore[attr-defined]


@_lowers(MirBlock)
def _mir(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    return ctx.graph.apply(node.block.op, ins)  # type: ignore[attr-defined]


# ---- linear layers ---------------------------------------------------------------------


def _matmul_chain(
    g: Graph, x: NodeId, w: NodeId, bias: NodeId | None, act: UnaryKind | None
) -> NodeId:
    y = g.matmul(x, w)
    if bias is not None:
        y = g.add(y, bias)
    if act is not None:
        y = g.unary(act, y)
    return y


def _fused_linear(
    g: Graph, x: NodeId, w: NodeId, bias: NodeId | None, act: UnaryKind | None
) -> NodeId:
    from rlx.ops.fused import FusedMatMulBiasAct

    ins = [x, w] + ([bias] if bias is not None else [])
    return g.apply(FusedMatMulBiasAct(act, bias is not None), ins)


@_lowers(LinearBlock)
def _linear(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    b: LinearBlock = node.block  # type: ignore[assignment]
    bias = ins[2] if b.has_bias else None
    build = _fused_linear if ctx.direct else _matmul_chain
    return build(ctx.graph, ins[0], ins[1], bias, b.activation)


@_lowers(LinearFusedBlock)
def _linear_fused(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    return _fused_linear(ctx.graph, ins[0], ins[1], ins[2], node.block.activation)  # type: ignore[attr-defined]


@_lowers(SharedLinearPairBlock)
def _pair(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    g = ctx.graph
    x, w1, w2 = ins
    slot = node.block.slot  # type: ignore[attr-defined]
    if not ctx.direct:
        return g.matmul(x, w1 if slot == 0 else w2)
    key = ("shared_linear_pair", x, w1, w2)
    if key not in ctx.shared:  # one matmul over [w1 | w2] serves both slots
        ctx.shared[key] = _fused_linear(g, x, g.concat([w1, w2], axis=1), None, None)
    both = ctx.shared[key]
    n1 = g.shape(w1).dims[1]
    n2 = g.shape(w2).dims[1]
    axis = g.shape(both).rank - 1
    return g.narrow(both, axis, 0, n1) if slot == 0 else g.narrow(both, axis, n1, n2)


@_lowers(SwiGluBlock)
def _swiglu(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    g = ctx.graph
    x, up_w, gate_w, down_w = ins
    if ctx.direct:
        from rlx.ops.fused import FusedSwiGLU

        h = g.apply(FusedSwiGLU(), [x, gate_w, up_w])
    else:
        h = g.mul(g.silu(g.matmul(x, gate_w)), g.matmul(x, up_w))
    return g.matmul(h, down_w)


# ---- norms -----------------------------------------------------------------------------


def _rms_chain(g: Graph, x: NodeId, gamma: NodeId, beta: NodeId | None, eps: float) -> NodeId:
    last = g.shape(x).rank - 1
    ms = g.mean(g.mul(x, x), axes=(last,), keepdims=True)
    y = g.mul(g.mul(x, g.rsqrt(g.add(ms, eps))), gamma)
    return g.add(y, beta) if beta is not None else y


@_lowers(RmsNormBlock)
def _rms_norm(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    b: RmsNormBlock = node.block  # type: ignore[assignment]
    beta = ins[2] if b.has_beta else None
    if ctx.direct:
        return ctx.graph.rms_norm(ins[0], ins[1], beta, eps=b.eps)
    return _rms_chain(ctx.graph, ins[0], ins[1], beta, b.eps)


@_lowers(ResidualRmsNormBlock)
def _residual_rms_norm(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    b: ResidualRmsNormBlock = node.block  # type: ignore[assignment]
    g = ctx.graph
    beta = ins[3] if b.has_beta else None
    if ctx.direct:
        from rlx.ops.fused import FusedResidualRmsNorm

        return g.apply(FusedResidualRmsNorm(b.eps, b.has_beta), ins)
    return _rms_chain(g, g.add(ins[0], ins[1]), ins[2], beta, b.eps)


# ---- attention and rope ----------------------------------------------------------------


@_lowers(AttentionBlock)
def _attention(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    from rlx.ops.nn import Attention

    b: AttentionBlock = node.block  # type: ignore[assignment]
    g = ctx.graph
    if ctx.direct:
        op = Attention(b.num_heads, b.head_dim, b.mask, b.num_kv_heads, b.scale)
        return g.apply(op, ins)
    q, k, v = ins[:3]
    bsz, sq, _ = g.shape(q).dims
    skv = g.shape(k).dims[1]
    h, d, hkv = b.num_heads, b.head_dim, b.num_kv_heads

    def heads(t: NodeId, n: int, s: Any) -> NodeId:  # [B,S,n*D] -> [B,n,S,D]
        return g.transpose(g.reshape(t, (bsz, s, n, d)), (0, 2, 1, 3))

    def repeat_kv(t: NodeId) -> NodeId:  # [B,Hkv,S,D] -> [B,H,S,D]: head h reads h // rep
        if hkv == h:
            return t
        t = g.reshape(t, (bsz, hkv, 1, skv, d))
        t = g.expand(t, (bsz, hkv, h // hkv, skv, d))
        return g.reshape(t, (bsz, h, skv, d))

    qh = heads(q, h, sq)
    kh = repeat_kv(heads(k, hkv, skv))
    vh = repeat_kv(heads(v, hkv, skv))
    scale = 1.0 / math.sqrt(d) if b.scale is None else b.scale
    s = g.mul(g.matmul(qh, g.transpose(kh, (0, 1, 3, 2))), float(scale))
    if len(ins) == 4:
        s = g.add(s, ins[3])
    else:
        s = _add_mask(g, s, b.mask, sq, skv)
    o = g.matmul(g.softmax(s, axis=-1), vh)  # [B,H,Sq,D]
    out = g.reshape(g.transpose(o, (0, 2, 1, 3)), (bsz, sq, h * d))
    # a query that sees no key gives 0 (the Attention op's rule), where softmax gives NaN:
    # selected after the chain, so fuse_attention still takes the chain (then it is a no-op)
    if len(ins) == 4:
        dead = _keyless_heads(g, ins[3], d)  # [mB,mSq,1 or H*D]
    else:
        dead = _keyless_rows(g, b.mask, sq, skv)  # [Sq,1] or None
    return out if dead is None else g.where(dead, 0.0, out)


def _keyless_heads(g: Graph, mask: NodeId, d: int) -> NodeId:
    """Bool ``[mB,mSq,1]``, or ``[mB,mSq,H*D]`` for a mask with a head axis (the custom
    mask's dims, broadcasting against the packed output ``[B,Sq,H*D]``): True where the
    mask hides every key of a query (and head) with ``-inf``. The comparison reads the mask
    as given (a precision policy never rounds a compared value)."""
    ms = g.shape(mask)
    m = g.reshape(mask, (1,) * (4 - ms.rank) + tuple(ms.dims))
    mb, mh, msq, _ = g.shape(m).dims
    hidden = g.cast(g.eq(m, float("-inf")), DType.I32)
    dead = g.eq(g.min(hidden, -1, keepdims=True), g.constant(np.ones((), np.int32)))
    if mh == 1:
        return g.reshape(dead, (mb, msq, 1))
    dead = g.expand(g.transpose(dead, (0, 2, 1, 3)), (mb, msq, mh, d))  # [mB,mSq,H,D]
    return g.reshape(dead, (mb, msq, mh * d))


def _keyless_rows(g: Graph, mask: Any, sq: Any, skv: Any) -> NodeId | None:
    """Bool ``[Sq,1]``: True for the queries a causal / sliding-window ``mask`` lets see no
    key (``Sq - 1 - i >= Skv``: more queries than keys); None when there cannot be any."""
    from rlx.ops.nn import MaskType

    if mask.type is MaskType.NONE or sq == skv:
        return None
    if isinstance(sq, int) and isinstance(skv, int):
        dead = ~mask.allowed(sq, skv).any(axis=1, keepdims=True)
        return g.constant(dead) if dead.any() else None
    q_back = g.reshape(_iota_from_end(g, sq), (sq, 1))
    return g.ge(q_back, g.sum(_ones(g, skv), 0, keepdims=True))


def _add_mask(g: Graph, scores: NodeId, mask: Any, sq: Any, skv: Any) -> NodeId:
    """Add the causal / sliding-window mask as ``[Sq, Skv]`` of 0 / -inf: a constant for
    static lengths, built from position counters (expand, cumsum, compare, where) for
    symbolic ones.
    A query row that sees no key (only possible when ``Skv < Sq``) gets NaN from the
    softmax; ``_attention`` selects 0 for it (:func:`_keyless_rows`)."""
    from rlx.ops.nn import MaskType

    if mask.type is MaskType.NONE:
        return scores
    dt = g.shape(scores).dtype.np
    if isinstance(sq, int) and isinstance(skv, int):
        allowed = mask.allowed(sq, skv)
        bias = np.where(allowed, np.zeros((), dt), np.asarray(-np.inf, dt)).astype(dt)
        return g.add(scores, g.constant(bias))
    # symbolic lengths: count positions from the end, where the mask is aligned. Query i
    # sees key j iff j <= i + Skv - Sq, i.e. (Skv-1-j) >= (Sq-1-i); a window of n also
    # needs (Skv-1-j) < (Sq-1-i) + n.
    q_back = g.reshape(_iota_from_end(g, sq), (sq, 1))
    k_back = g.reshape(_iota_from_end(g, skv), (1, skv))
    zero, hidden = g.constant(np.zeros((), dt)), g.constant(np.asarray(-np.inf, dt))
    bias = g.where(g.ge(k_back, q_back), zero, hidden)  # [Sq, Skv]
    if mask.type is MaskType.SLIDING_WINDOW:
        near = g.lt(k_back, g.add(q_back, g.constant(mask.window, "i32")))
        bias = g.where(near, bias, hidden)
    return g.add(scores, bias)


def _ones(g: Graph, n: Any) -> NodeId:
    """i32[n] of ones for a possibly symbolic length ``n``."""
    return g.expand(g.constant(np.ones((1,), np.int32)), (n,))


def _iota_from_end(g: Graph, n: Any) -> NodeId:
    """i32[n]: ``n-1, n-2, ..., 0`` for a possibly symbolic length ``n``."""
    return g.cumsum(_ones(g, n), axis=0, reverse=True, exclusive=True)


@_lowers(RopeBlock)
def _rope(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    b: RopeBlock = node.block  # type: ignore[assignment]
    g = ctx.graph
    x, cos, sin = ins
    if ctx.direct:
        return g.rope(x, cos, sin, b.head_dim, b.n_rot)
    bsz, s, hd = g.shape(x).dims
    d, r = b.head_dim, b.n_rot
    half = r // 2
    xh = g.reshape(x, (bsz, s, -1, d))  # [B,S,H,D]
    lo = g.narrow(xh, 3, 0, half)
    hi = g.narrow(xh, 3, half, half)
    c = g.reshape(cos, (s, 1, half))  # broadcasts over B and H
    sn = g.reshape(sin, (s, 1, half))
    parts = [
        g.sub(g.mul(lo, c), g.mul(hi, sn)),
        g.add(g.mul(hi, c), g.mul(lo, sn)),
    ]
    if r < d:
        parts.append(g.narrow(xh, 3, r, d - r))
    return g.reshape(g.concat(parts, axis=3), (bsz, s, hd))


# ---- convolution -----------------------------------------------------------------------


@_lowers(DepthwiseConv1dCausalBlock)
def _dwconv(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    g = ctx.graph
    x, w, pad = ins
    ksz = node.block.kernel_size  # type: ignore[attr-defined]
    bsz, s, c = g.shape(x).dims
    if ksz > 1 and not isinstance(s, int):
        return _dwconv_symbolic(g, x, w, pad, ksz, c)
    padded = g.concat([pad, x], axis=1) if ksz > 1 else x  # [B, S+K-1, C]
    if ctx.direct:
        xt = g.transpose(padded, (0, 2, 1))  # [B, C, S+K-1]
        y = g.conv(xt, g.reshape(w, (c, 1, ksz)), groups=c)  # [B, C, S]
        return g.transpose(y, (0, 2, 1))
    w2 = g.reshape(w, (c, ksz))
    acc: NodeId | None = None
    for j in range(ksz):
        wj = g.reshape(g.narrow(w2, 1, j, 1), (c,))
        rows = padded if ksz == 1 else g.narrow(padded, 1, j, s)  # s may be symbolic at K=1
        term = g.mul(rows, wj)
        acc = term if acc is None else g.add(acc, term)
    assert acc is not None
    return acc


def _dwconv_symbolic(g: Graph, x: NodeId, w: NodeId, pad: NodeId, ksz: int, c: int) -> NodeId:
    """The causal conv for a symbolic sequence length ``S``, where ``concat(left_pad, x)``
    (length ``S + K - 1``) is not a symbolic dim. Split the sum by where ``s + j`` falls:

    * rows of ``x``: a conv of ``x`` with ``K-1`` zeros of left padding (length ``S``);
    * rows of ``left_pad``: a conv of ``left_pad`` with ``K`` zeros of right padding
      (length ``K``: row ``s < K-1`` is the pad's share of output ``s``, row ``K-1`` is 0),
      spread over ``S`` rows by a gather at ``min(s, K-1)``.

    Both policies use this form (conv and gather are primitive MIR ops)."""
    wk = g.reshape(w, (c, 1, ksz))
    xt = g.transpose(x, (0, 2, 1))  # [B, C, S]
    body = g.conv(xt, wk, padding=((ksz - 1, 0),), groups=c)  # [B, C, S]
    pt = g.transpose(pad, (0, 2, 1))  # [B, C, K-1]
    head = g.conv(pt, wk, padding=((0, ksz),), groups=c)  # [B, C, K]
    ones = _ones(g, g.shape(x).dims[1])
    pos = g.sub(g.minimum(g.cumsum(ones, axis=0), g.constant(ksz, "i32")), g.constant(1, "i32"))
    y = g.add(body, g.gather(head, pos, axis=2))  # [B, C, S]
    return g.transpose(y, (0, 2, 1))


# ---- quantized matmul ------------------------------------------------------------------


def dequant_op(block: DequantMatMulBlock) -> Op:
    """The MIR DequantMatMul op of a dequant_matmul block."""
    from rlx.ops.quant import DequantMatMul

    return DequantMatMul(block.scheme)


@_lowers(DequantMatMulBlock)
def _dequant(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    from rlx.ops.quant import Fp8E4m3, Fp8E5m2, Int4Block

    b: DequantMatMulBlock = node.block  # type: ignore[assignment]
    g = ctx.graph
    if ctx.direct or b.scheme.is_gguf:
        return g.apply(dequant_op(b), ins)
    x, wq, scale, zp = ins
    n = g.shape(wq).dims[0]
    k = g.shape(x).dims[-1]
    if isinstance(b.scheme, Int4Block):  # two nibbles per byte: low = even k, high = odd k
        w32 = g.cast(wq, DType.I32)
        sixteen = g.constant(np.int32(16))
        lo = g.mod(w32, sixteen)
        hi = g.div(g.sub(w32, lo), sixteen)
        pair = g.concat([g.reshape(lo, (n, k // 2, 1)), g.reshape(hi, (n, k // 2, 1))], axis=2)
        q = g.reshape(pair, (n, k))
    else:
        q = g.cast(wq, DType.I32) if g.shape(wq).dtype.is_int else wq
    qf = g.cast(q, DType.F32)
    zf = g.cast(zp, DType.F32)
    sf = scale
    if isinstance(b.scheme, (Fp8E4m3, Fp8E5m2)):
        w = g.mul(g.sub(qf, zf), sf)  # per-tensor: [1] broadcasts
    else:
        bs = b.scheme.block_size
        nb = k // bs
        qb = g.reshape(qf, (n, nb, bs))
        w = g.mul(g.sub(qb, g.reshape(zf, (n, nb, 1))), g.reshape(sf, (n, nb, 1)))
        w = g.reshape(w, (n, k))
    xf = x if g.shape(x).dtype is DType.F32 else g.cast(x, DType.F32)
    return g.matmul(xf, g.transpose(w, (1, 0)))


# ---- gated delta net -------------------------------------------------------------------


@_lowers(GatedDeltaNetBlock)
def _gdn(ctx: LowerCtx, node: HirNode, ins: list[NodeId]) -> NodeId:
    from rlx.ops.recurrent import GatedDeltaNet, GdnResult

    b: GatedDeltaNetBlock = node.block  # type: ignore[assignment]
    returns = GdnResult.FINAL_STATE if b.slot == 1 else GdnResult.OUTPUT
    if ctx.direct:
        return ctx.graph.apply(GatedDeltaNet(b.state_size, b.carry, returns), ins)
    return _gdn_scan(ctx.graph, ins, b.carry, returns)


def _gdn_scan(g: Graph, ins: list[NodeId], carry: bool, returns: Any) -> NodeId:
    """The gated delta rule as a Scan over time: carry S [B,H,K,V], xs the time-major
    q, k, v, g, beta; the body is one step of the recurrence (see rlx.ops.recurrent)."""
    from rlx.ops.recurrent import GdnResult

    q, k, v, gate, beta = ins[:5]
    bsz, _, h, dk = g.shape(k).dims
    dv = g.shape(v).dims[3]
    dt = g.shape(q).dtype
    if carry:
        state = ins[5]
    else:
        state = g.expand(g.constant(np.zeros((1, 1, 1, 1), dt.np)), (bsz, h, dk, dv))
    xs = [g.transpose(t, (1, 0, 2, 3)) for t in (q, k, v)]
    xs += [g.transpose(t, (1, 0, 2)) for t in (gate, beta)]
    scale = 1.0 / math.sqrt(dk)

    def step(
        sg: Graph, s: NodeId, qt: NodeId, kt: NodeId, vt: NodeId, gt: NodeId, bt: NodeId
    ) -> list[NodeId]:
        s = sg.mul(s, sg.reshape(sg.exp(gt), (bsz, h, 1, 1)))
        recalled = sg.matmul(sg.reshape(kt, (bsz, h, 1, dk)), s)  # [B,H,1,V] = S^T k
        delta = sg.mul(
            sg.sub(sg.reshape(vt, (bsz, h, 1, dv)), recalled), sg.reshape(bt, (bsz, h, 1, 1))
        )
        s = sg.add(s, sg.matmul(sg.reshape(kt, (bsz, h, dk, 1)), delta))
        o = sg.matmul(sg.mul(sg.reshape(qt, (bsz, h, 1, dk)), scale), s)
        return [s, sg.reshape(o, (bsz, h, dv))]

    if returns is GdnResult.FINAL_STATE:
        return g.scan(step, [state], xs, output_index=0)
    ys = g.scan(step, [state], xs, output_index=1)  # [T,B,H,V]
    return g.transpose(ys, (1, 0, 2, 3))
