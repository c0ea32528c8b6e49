"""LinearAttention and CausalConvWithState (opset 27 sequence-model ops) -> MIR chains.

LinearAttention keeps a [batch, kv_heads, d_k, d_v] state (f32) and, per time step
(unrolled over the static sequence), optionally decays it (``gated``: times exp(decay)),
optionally corrects the value by what the state already retrieves for the key
(``delta``: ``beta * (v - kᵀ·S)``), adds ``k ⊗ v``, and reads ``scale * q·S`` (kv heads
repeated for grouped queries), as the ONNX reference steps. CausalConvWithState is a
depthwise 1-D conv over the past state and the input concatenated, with optional SiLU;
the last k-1 steps become the present state."""

from __future__ import annotations

import math

import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import bin_, cast, scalar, un
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Concat, Expand, Reshape, Slice, Transpose
from rlx.ops.nn import Conv


def _heads(g, x: int, h: int) -> int:  # noqa: ANN001
    b, t, hd = (int(v) for v in g.shape(x).dims)
    y = g.apply(Reshape((b, t, h, hd // h)), [cast(g, x, DType.F32)])
    return g.apply(Transpose((0, 2, 1, 3)), [y])  # [b, h, t, d]


def _step(g, x: int, t: int) -> int:  # noqa: ANN001
    """x[:, :, t, :] -> [b, h, 1, d]."""
    return g.apply(Slice((None, None, t, None), (None, None, t + 1, None), (1, 1, 1, 1)), [x])


@converter("LinearAttention", since=27)
def linear_attention(ctx: NodeCtx) -> list[int]:
    g = ctx.g
    rule = ctx.attr("update_rule", "gated_delta")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    hq, hkv = int(ctx.attr("q_num_heads")), int(ctx.attr("kv_num_heads"))
    q, k, v = _heads(g, ctx.x(0), hq), _heads(g, ctx.x(1), hkv), _heads(g, ctx.x(2), hkv)
    b, _, t, dk = (int(s) for s in g.shape(q).dims)
    dv = int(g.shape(v).dims[3])
    out_dt = ctx.dtype(ctx.x(0))
    if ctx.has(3):
        state = cast(g, ctx.x(3), DType.F32)
        state_dt = ctx.dtype(ctx.x(3))
    else:
        state = g.constant(np.zeros((b, hkv, dk, dv), np.float32))
        state_dt = out_dt
    decay = beta = None
    if gating:
        dsrc = cast(g, ctx.x(4), DType.F32)
        last = int(ctx.shape(ctx.x(4)).dims[-1])
        per = 1 if last == hkv else dk
        decay = g.apply(Transpose((0, 2, 1, 3)), [g.apply(Reshape((b, t, hkv, per)), [dsrc])])
    if delta:
        bl = int(ctx.shape(ctx.x(5)).dims[-1])
        bsrc = g.apply(Reshape((b, t, bl, 1)), [cast(g, ctx.x(5), DType.F32)])
        beta = g.apply(Transpose((0, 2, 1, 3)), [bsrc])  # [b, bl, t, 1]
    sc = ctx.attr("scale")
    scale = 1.0 / math.sqrt(dk) if not sc else float(sc)
    grp = hq // hkv
    outs = []
    for i in range(t):
        kt, vt = _step(g, k, i), _step(g, v, i)  # [b, h, 1, d]
        if gating:
            gt = g.apply(Transpose((0, 1, 3, 2)), [_step(g, decay, i)])  # [b, h, per, 1]
            state = bin_(g, B.MUL, state, un(g, U.EXP, gt))
        if delta:
            got = g.apply(MatMul(), [kt, state])  # [b, h, 1, dv]
            vt = bin_(g, B.MUL, _step(g, beta, i), bin_(g, B.SUB, vt, got))
        state = bin_(
            g, B.ADD, state, g.apply(MatMul(), [g.apply(Transpose((0, 1, 3, 2)), [kt]), vt])
        )
        read = state
        if grp > 1:
            read = g.apply(Reshape((b, hkv, 1, dk, dv)), [state])
            read = g.apply(Expand((b, hkv, grp, dk, dv)), [read])
            read = g.apply(Reshape((b, hq, dk, dv)), [read])
        o = g.apply(MatMul(), [_step(g, q, i), read])  # [b, hq, 1, dv]
        outs.append(bin_(g, B.MUL, o, scalar(g, scale, o)))
    y = outs[0] if t == 1 else g.apply(Concat(2), outs)
    y = g.apply(Reshape((b, t, hq * dv)), [g.apply(Transpose((0, 2, 1, 3)), [y])])
    return [cast(g, y, out_dt), cast(g, state, state_dt)]


@converter("CausalConvWithState", since=27)
def causal_conv_with_state(ctx: NodeCtx) -> list[int]:
    g, x, w = ctx.g, ctx.x(0), ctx.x(1)
    b, c, _ = (int(v) for v in ctx.shape(x).dims)
    k = int(ctx.shape(w).dims[2])
    act = ctx.attr("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise ctx.unsupported(f"activation {act!r}")
    past = ctx.x(3) if ctx.has(3) else g.constant(np.zeros((b, c, k - 1), ctx.dtype(x).np))
    padded = g.apply(Concat(2), [past, x]) if k > 1 else x
    ins = [padded, w] + ([ctx.x(2)] if ctx.has(2) else [])
    y = g.apply(Conv((1,), ((0, 0),), (1,), c, ctx.has(2)), ins)
    if act != "none":
        yf = cast(g, y, DType.F32)
        y = cast(g, bin_(g, B.MUL, yf, un(g, U.SIGMOID, yf)), ctx.dtype(x))
    n = int(g.shape(padded).dims[2])
    present = g.apply(Slice((None, None, n - (k - 1)), (None, None, None), (1, 1, 1)), [padded])
    return [y, present]
