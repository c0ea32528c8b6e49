"""ONNX Attention (opsets 23+) -> an rlx MIR chain: heads split from 3-D inputs, the KV
cache concatenated (present_key / present_value), grouped KV heads repeated, ``q·kᵀ``
with ``sqrt(scale)`` on each side (as the ONNX reference scales), softcap, an additive
bias made of the mask (bool or float, padded to the KV length), the causal frontier and
sliding window (offset by the cache or by ``nonpad_kv_seqlen``), softmax (in
``softmax_precision`` when given) with fully masked rows set to 0, then ``·v``.
qk_matmul_output_mode 0-3 pick which intermediate becomes output 3."""

from __future__ import annotations

import math

import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.dtypes import to_dtype
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import bin_, cast, cmp, scalar, un, where
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import CompareKind as C
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Concat, Expand, Pad, Reshape, Transpose
from rlx.ops.reduce import Reduce, ReduceKind, Softmax


def _heads(g, x: int, n: int) -> int:  # noqa: ANN001
    b, s, h = g.shape(x).dims
    y = g.apply(Reshape((b, s, n, int(h) // n)), [x])
    return g.apply(Transpose((0, 2, 1, 3)), [y])


def _allowed(g, q: int, kv: int, offset, left: int, right: int, causal: bool) -> int:  # noqa: ANN001
    """Bool [q, kv] (``offset`` a Python int) or [b, 1, q, kv] (``offset`` a 1-tuple
    holding the node id of per-batch offsets [b])."""
    i = np.arange(q, dtype=np.int64).reshape(q, 1)
    j = np.arange(kv, dtype=np.int64).reshape(1, kv)
    if isinstance(offset, int):
        d = i + offset - j
        ok = np.ones((q, kv), bool)
        if causal:
            ok &= d >= 0
        if left >= 0:
            ok &= d <= left
        if right >= 0:
            ok &= -d <= right
        return g.constant(ok)
    (offset,) = offset
    nb = g.shape(offset).dims[0]
    off = g.apply(Reshape((nb, 1, 1, 1)), [cast(g, offset, DType.I64)])
    d = bin_(g, B.SUB, bin_(g, B.ADD, g.constant(i), off), g.constant(j))  # [b,1,q,kv]
    zero = scalar(g, 0, d)
    ok = None
    for cond in (
        cmp(g, C.GE, d, zero) if causal else None,
        cmp(g, C.LE, d, scalar(g, left, d)) if left >= 0 else None,
        cmp(g, C.GE, d, scalar(g, -right, d)) if right >= 0 else None,
    ):
        if cond is not None:
            ok = cond if ok is None else bin_(g, B.AND, ok, cond)
    return ok if ok is not None else g.constant(np.ones((1, 1, q, kv), bool))


def _additive(g, ok: int, dt: DType) -> int:  # noqa: ANN001
    return where(g, ok, scalar(g, 0, dt), scalar(g, -np.inf, dt))


@converter("Attention", since=23)
def attention(ctx: NodeCtx) -> list[int | None]:
    g = ctx.g
    q, k, v = ctx.x(0), ctx.x(1), ctx.x(2)
    dt = ctx.dtype(q)
    rank3 = ctx.shape(q).rank == 3
    qh, kvh = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    if rank3:
        q, k, v = _heads(g, q, qh), _heads(g, k, kvh), _heads(g, v, kvh)
    past = ctx.has(4)
    if past:
        k = g.apply(Concat(2), [ctx.x(4), k])
        v = g.apply(Concat(2), [ctx.x(5), v])
    present_k, present_v = k, v
    nb, nq, sq, hd = g.shape(q).dims
    nkv, lkv = g.shape(k).dims[1], int(g.shape(k).dims[2])
    sq = int(sq)
    scale = ctx.attr("scale")
    scale = 1 / math.sqrt(int(hd)) if scale is None else float(scale)
    rt = scalar(g, math.sqrt(scale), q)
    if nq != nkv:  # grouped KV heads: each repeated nq / nkv times (np.repeat on axis 1)
        reps = int(nq) // int(nkv)
        for name in ("k", "v"):
            t = k if name == "k" else v
            _, _, L, d = g.shape(t).dims
            t = g.apply(Reshape((nb, nkv, 1, L, d)), [t])
            t = g.apply(Expand((nb, nkv, reps, L, d)), [t])
            t = g.apply(Reshape((nb, nq, L, d)), [t])
            k, v = (t, v) if name == "k" else (k, t)
    kt = g.apply(Transpose((0, 1, 3, 2)), [bin_(g, B.MUL, k, rt)])
    qk = g.apply(MatMul(), [bin_(g, B.MUL, q, rt), kt])
    softcap = float(ctx.attr("softcap", 0.0))
    if softcap > 0:
        cap = scalar(g, softcap, qk)
        qk = bin_(g, B.MUL, un(g, U.TANH, bin_(g, B.DIV, qk, cap)), cap)
    bias = None
    if ctx.has(3):
        m = ctx.x(3)
        ms = ctx.shape(m)
        pad = lkv - int(ms.dims[-1])
        if pad > 0:
            pv = 0.0 if ms.dtype.is_bool else -np.inf
            m = g.apply(Pad(((0, 0),) * (ms.rank - 1) + ((0, pad),), pv), [m])
        bias = _additive(g, m, dt) if ms.dtype.is_bool else m
    causal = bool(ctx.attr("is_causal", 0))
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    nonpad = ctx.x(6) if ctx.has(6) else None
    if causal or left >= 0 or right >= 0:
        if nonpad is not None and not past:
            offset = (bin_(g, B.SUB, nonpad, scalar(g, sq, nonpad)),)
        else:
            offset = int(ctx.shape(ctx.x(4)).dims[2]) if past else 0
        ok = _allowed(g, sq, lkv, offset, left, right, causal)
        add = _additive(g, ok, dt)
        bias = add if bias is None else bin_(g, B.ADD, bias, add)
    if nonpad is not None:
        j = g.constant(np.arange(lkv, dtype=np.int64).reshape(1, lkv))
        n64 = g.apply(Reshape((nb, 1)), [cast(g, nonpad, DType.I64)])
        ok = g.apply(Reshape((nb, 1, 1, lkv)), [cmp(g, C.LT, j, n64)])
        add = _additive(g, ok, dt)
        bias = add if bias is None else bin_(g, B.ADD, bias, add)
    mode = int(ctx.attr("qk_matmul_output_mode", 0))
    qk_out = qk
    s = qk if bias is None else bin_(g, B.ADD, qk, bias)
    if mode == 2:
        qk_out = s
    sp = ctx.attr("softmax_precision")
    if sp is not None:
        s = cast(g, s, to_dtype(sp, "softmax_precision"))
    p = g.apply(Softmax(-1), [s])
    if bias is not None:  # a row whose bias is all -inf gives 0, not NaN
        full = g.apply(Reduce(ReduceKind.MAX, (g.shape(bias).rank - 1,), True), [bias])
        dead = cmp(g, C.EQ, full, scalar(g, -np.inf, full))
        p = where(g, dead, scalar(g, 0, p), p)
    if mode == 3:
        qk_out = p
    p = cast(g, p, dt)
    y = g.apply(MatMul(), [p, v])
    if rank3:
        y = g.apply(Transpose((0, 2, 1, 3)), [y])
        b, s_, h, d = g.shape(y).dims
        y = g.apply(Reshape((b, s_, h * d)), [y])
    return [y, present_k, present_v, cast(g, qk_out, dt)]


def _apply_mod(ctx: NodeCtx, body, x: int) -> int:  # noqa: ANN001
    """Inline a one-input modifier sub-graph (FlexAttention's score_mod / prob_mod)."""
    from rlx.frontends.onnx.loader import convert_nodes
    from rlx.frontends.onnx.tensors import to_array

    ctx.st.ids[body.input[0].name] = x
    for t in body.initializer:
        ctx.st.consts[t.name] = to_array(t)
    convert_nodes(ctx.st, body.node)
    return ctx.st.node_id(body.output[0].name)


@converter("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(ctx: NodeCtx) -> int:
    """``softmax(mod(q·kᵀ·scale))·v`` with the score / prob modifier sub-graphs inlined; the
    softmax runs in softmax_precision (f32 for 16-bit inputs), grouped KV heads repeated."""
    g = ctx.g
    q, k, v = ctx.x(0), ctx.x(1), ctx.x(2)
    nb, hq, _, e = g.shape(q).dims
    hkv = g.shape(k).dims[1]
    dt = ctx.dtype(q)
    if hq != hkv:
        reps = int(hq) // int(hkv)
        rep = []
        for t in (k, v):
            _, _, L, d = g.shape(t).dims
            t = g.apply(Reshape((nb, hkv, 1, L, d)), [t])
            rep.append(
                g.apply(Reshape((nb, hq, L, d)), [g.apply(Expand((nb, hkv, reps, L, d)), [t])])
            )
        k, v = rep
    sc = ctx.attr("scale")
    scale = 1.0 / math.sqrt(int(e)) if sc is None else float(sc)
    rt = scalar(g, float(np.sqrt(np.float32(scale))), q)
    kt = g.apply(Transpose((0, 1, 3, 2)), [bin_(g, B.MUL, k, rt)])
    s = g.apply(MatMul(), [bin_(g, B.MUL, q, rt), kt])
    sp = ctx.attr("softmax_precision")
    ct = to_dtype(sp, "softmax_precision") if sp is not None else (
        DType.F64 if dt is DType.F64 else DType.F32)  # fmt: skip
    s = cast(g, s, ct)
    if ctx.has_attr("score_mod"):
        s = cast(g, _apply_mod(ctx, ctx.attr("score_mod"), s), ct)
    p = g.apply(Softmax(-1), [s])
    if ctx.has_attr("prob_mod"):
        p = cast(g, _apply_mod(ctx, ctx.attr("prob_mod"), p), ct)
    y = g.apply(MatMul(), [p, cast(g, v, ct)])
    return cast(g, y, ctx.dtype(ctx.x(2)))
