"""Neural-network ATen ops -> rlx's fused ops: scaled_dot_product_attention -> Attention
(heads packed as ``[B, S, H*D]``; a bool mask becomes an additive 0 / -inf mask;
``is_causal`` -> the causal MaskKind; grouped-query through ``enable_gqa``), layer_norm /
rms_norm / group_norm -> the norm ops, batch_norm in eval mode -> a per-channel scale and
shift (param-only: computed once, in the compiled graph's prologue), conv1d / conv2d ->
Conv, max / avg / adaptive-avg pooling -> Pool (or a mean over the spatial axes)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.frontends.torch.aten import aten
from rlx.frontends.torch.context import NodeCtx
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind, Where
from rlx.ops.movement import Pad, Reshape, Transpose
from rlx.ops.nn import Attention, Conv, MaskKind, Pool, PoolKind
from rlx.ops.norm import GroupNorm, LayerNorm, RmsNorm
from rlx.ops.reduce import Reduce, ReduceKind
from rlx.shape import dims_product

__all__: list[str] = []


# ---- attention ------------------------------------------------------------------------


def _pack(ctx: NodeCtx, x: int, what: str) -> tuple[int, int, int]:
    """[B,H,S,D] -> ([B,S,H*D], H, D)."""
    s = ctx.shape(x)
    if s.rank != 4:
        raise ctx.unsupported(f"{what} must be [B, heads, seq, head_dim], got {s}")
    b, h, n, d = s.dims
    if not isinstance(h, int) or not isinstance(d, int):
        raise ctx.unsupported(f"{what} {s} needs static heads and head_dim")
    t = ctx.g.apply(Transpose((0, 2, 1, 3)), [x])
    return ctx.g.apply(Reshape((b, n, h * d)), [t]), h, d


@aten("scaled_dot_product_attention")
def sdpa(ctx: NodeCtx) -> int:
    q, k, v = ctx.t(0), ctx.t(1), ctx.t(2)
    mask = ctx.opt_t(3, "attn_mask")
    if ctx.arg(4, 0.0, name="dropout_p"):
        raise ctx.unsupported("attention dropout (dropout_p > 0); call module.eval()")
    causal = bool(ctx.arg(5, False, name="is_causal"))
    scale = ctx.arg(6, None, name="scale")
    gqa = bool(ctx.kw("enable_gqa", False))
    qs = ctx.shape(q)
    qp, h, d = _pack(ctx, q, "query")
    kp, hkv, _ = _pack(ctx, k, "key")
    vp, hv, dv = _pack(ctx, v, "value")
    if dv != d or hv != hkv:
        raise ctx.unsupported(f"value {ctx.shape(v)} must match key {ctx.shape(k)}")
    if hkv != h and not gqa:
        raise ctx.unsupported(f"query has {h} heads and key {hkv}: pass enable_gqa=True")
    kind = MaskKind.none()
    ins = [qp, kp, vp]
    if causal:
        if mask is not None:
            raise ctx.unsupported("both attn_mask and is_causal")
        if qs.dims[2] != ctx.shape(k).dims[2]:
            raise ctx.unsupported(
                "is_causal with different query and key lengths (torch aligns it to the top left)"
            )
        kind = MaskKind.causal()
    elif mask is not None:
        kind = MaskKind.custom()
        if ctx.dtype(mask) is DType.BOOL:
            dt = qs.dtype
            zero = ctx.const(0.0, dt)
            ninf = ctx.const(-np.inf, dt)
            mask = ctx.g.apply(Where(), [mask, zero, ninf])
        ins.append(mask)
    sc = None if scale is None else float(scale)
    if sc is not None and math.isclose(sc, 1.0 / math.sqrt(d), rel_tol=1e-12):
        sc = None
    o = ctx.g.apply(Attention(h, d, kind, hkv if hkv != h else None, sc), ins)
    b, n = qs.dims[0], qs.dims[2]
    o = ctx.g.apply(Reshape((b, n, h, d)), [o])
    return ctx.g.apply(Transpose((0, 2, 1, 3)), [o])


# ---- normalisation --------------------------------------------------------------------


def _affine(ctx: NodeCtx, i: int, name: str, n: Any) -> int | None:
    t = ctx.opt_t(i, name)
    if t is None:
        return None
    return ctx.g.apply(Reshape((n,)), [t]) if ctx.shape(t).rank != 1 else t


def _last_norm(ctx: NodeCtx, rms: bool) -> int:
    x = ctx.t(0)
    s = ctx.shape(x)
    norm = [int(d) for d in ctx.arg(1)]
    k = len(norm)
    n = dims_product(s.dims[s.rank - k :])
    if k > 1:
        x = ctx.g.apply(Reshape((*s.dims[: s.rank - k], n)), [x])
    w = _affine(ctx, 2, "weight", n)
    if w is None:
        w = ctx.g.constant(np.ones(int(n), dtype=s.dtype.np))
    if rms:
        eps = ctx.arg(3, None, name="eps")
        eps = float(np.finfo(s.dtype.np).eps) if eps is None else float(eps)
        y = ctx.g.apply(RmsNorm(eps, False), [x, w])
    else:
        b = _affine(ctx, 3, "bias", n)
        eps = float(ctx.arg(4, 1e-5, name="eps"))
        y = ctx.g.apply(LayerNorm(eps, b is not None), [x, w] if b is None else [x, w, b])
    return ctx.g.apply(Reshape(s.dims), [y]) if k > 1 else y


@aten("layer_norm")
def layer_norm(ctx: NodeCtx) -> int:
    return _last_norm(ctx, rms=False)


@aten("native_layer_norm")
def native_layer_norm(ctx: NodeCtx) -> tuple[int, None, None]:
    return _last_norm(ctx, rms=False), None, None


@aten("rms_norm")
def rms_norm(ctx: NodeCtx) -> int:
    return _last_norm(ctx, rms=True)


def _channel(ctx: NodeCtx, t: int, rank: int) -> int:
    c = ctx.shape(t).dims[0]
    return ctx.g.apply(Reshape((c,) + (1,) * (rank - 2)), [t])


def _batch_norm(ctx: NodeCtx, w: int | None, b: int | None, mean: int, var: int, eps: float) -> int:
    x = ctx.t(0)
    s = ctx.shape(x)
    dt = s.dtype
    scale = ctx.g.apply(
        Unary(UnaryKind.RSQRT), [ctx.g.apply(Binary(BinaryKind.ADD), [var, ctx.const(eps, dt)])]
    )
    if w is not None:
        scale = ctx.g.apply(Binary(BinaryKind.MUL), [scale, w])
    shift = ctx.g.apply(Unary(UnaryKind.NEG), [ctx.g.apply(Binary(BinaryKind.MUL), [mean, scale])])
    if b is not None:
        shift = ctx.g.apply(Binary(BinaryKind.ADD), [shift, b])
    y = ctx.g.apply(Binary(BinaryKind.MUL), [x, _channel(ctx, scale, s.rank)])
    return ctx.g.apply(Binary(BinaryKind.ADD), [y, _channel(ctx, shift, s.rank)])


@aten("batch_norm", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit",
      "native_batch_norm", "_batch_norm_impl_index", "cudnn_batch_norm")  # fmt: skip
def batch_norm(ctx: NodeCtx) -> Any:
    name = ctx.op.removeprefix("aten.").split(".")[0]
    if name == "_native_batch_norm_legit_no_training":
        w, b, mean, var = (ctx.opt_t(i) for i in (1, 2, 3, 4))
        y = _batch_norm(ctx, w, b, mean, var, float(ctx.arg(6)))  # type: ignore[arg-type]
        return y, None, None
    training = ctx.arg(5, False)
    mean, var = ctx.opt_t(3), ctx.opt_t(4)
    if training or mean is None or var is None:
        raise ctx.unsupported(
            "batch_norm in training mode (batch statistics); call module.eval() so it uses "
            "its running mean and variance"
        )
    y = _batch_norm(ctx, ctx.opt_t(1), ctx.opt_t(2), mean, var, float(ctx.arg(7)))
    return y if name == "batch_norm" else (y, None, None, None)[: len(ctx.meta())]


@aten("group_norm", "native_group_norm")
def group_norm(ctx: NodeCtx) -> Any:
    x = ctx.t(0)
    c = ctx.shape(x).dims[1]
    dt = ctx.dtype(x)
    native = ctx.op.startswith("aten.native")
    groups = int(ctx.arg(6 if native else 1))
    eps = float(ctx.arg(7 if native else 4, 1e-5))
    w = ctx.opt_t(1 if native else 2)
    b = ctx.opt_t(2 if native else 3)
    w = ctx.g.constant(np.ones(c, dt.np)) if w is None else w
    b = ctx.g.constant(np.zeros(c, dt.np)) if b is None else b
    y = ctx.g.apply(GroupNorm(groups, eps), [x, w, b])
    return (y, None, None) if native else y


# ---- convolution and pooling ----------------------------------------------------------


def _ints(v: Any, nd: int, default: int) -> tuple[int, ...]:
    if v is None or (isinstance(v, list | tuple) and len(v) == 0):
        return (default,) * nd
    if isinstance(v, int):
        return (v,) * nd
    t = tuple(int(a) for a in v)
    return t * nd if len(t) == 1 else t


@aten("conv1d", "conv2d", "convolution", "_convolution")
def conv(ctx: NodeCtx) -> int:
    x, w = ctx.t(0), ctx.t(1)
    b = ctx.opt_t(2, "bias")
    nd = ctx.shape(w).rank - 2
    if nd not in (1, 2):
        raise ctx.unsupported(f"a {nd}-D convolution (rlx has 1-D and 2-D)")
    generic = ctx.op.startswith("aten.convolution") or ctx.op.startswith("aten._convolution")
    if generic and ctx.arg(6):
        raise ctx.unsupported("transposed convolution")
    stride = _ints(ctx.arg(3, 1, name="stride"), nd, 1)
    pad = ctx.arg(4, 0, name="padding")
    dil = _ints(ctx.arg(5, 1, name="dilation"), nd, 1)
    groups = int(ctx.arg(8 if generic else 6, 1, name="groups"))
    ks = ctx.shape(w).dims[2:]
    if pad == "valid":
        pads = ((0, 0),) * nd
    elif pad == "same":
        tot = [d * (k - 1) for d, k in zip(dil, ks, strict=True)]
        pads = tuple((t // 2, t - t // 2) for t in tot)
    else:
        pads = tuple((p, p) for p in _ints(pad, nd, 0))
    dt = ctx.dtype(x)
    ins = [x, ctx.cast(w, dt)] + ([] if b is None else [ctx.cast(b, dt)])
    return ctx.g.apply(Conv(stride, pads, dil, groups, b is not None), ins)


def _pool_window(ctx: NodeCtx) -> tuple[int, int, tuple, tuple, tuple]:
    """A pooling call's (input, spatial rank, window, stride, padding per side); an empty
    stride means the window's."""
    x = ctx.t(0)
    nd = ctx.shape(x).rank - 2
    win = _ints(ctx.arg(1), nd, 1)
    stride = _ints(ctx.arg(2), nd, 0)
    stride = win if 0 in stride else stride
    return x, nd, win, stride, _ints(ctx.arg(3, 0), nd, 0)


@aten("max_pool1d", "max_pool2d", "max_pool2d_with_indices", "max_pool1d_with_indices")
def max_pool(ctx: NodeCtx) -> Any:
    x, nd, win, stride, pad = _pool_window(ctx)
    pads = tuple((p, p) for p in pad)
    if _ints(ctx.arg(4, 1), nd, 1) != (1,) * nd:
        raise ctx.unsupported("dilated max pooling")
    y = _pool(ctx, PoolKind.MAX, x, win, stride, pads, bool(ctx.arg(5, False)))
    return (y, None) if "with_indices" in ctx.op else y


def _pool(
    ctx: NodeCtx, kind: PoolKind, x: int, win: tuple, stride: tuple, pads: tuple, ceil: bool
) -> int:
    y = ctx.g.apply(Pool(kind, win, stride, pads), [x])
    want = ctx.out_shape(0 if isinstance(ctx.meta(), list | tuple) else None).dims
    if ceil and ctx.shape(y).dims != want:
        raise ctx.unsupported("ceil_mode=True pooling where it adds a partial window")
    return y


@aten("avg_pool1d", "avg_pool2d")
def avg_pool(ctx: NodeCtx) -> int:
    x, nd, win, stride, pad = _pool_window(ctx)
    ceil = bool(ctx.arg(4, False))
    include = bool(ctx.arg(5, True))
    if ctx.arg(6, None) is not None:
        raise ctx.unsupported("avg pooling with divisor_override")
    if any(pad) and include:  # zeros that count: pad explicitly, then pool without padding
        x = ctx.g.apply(Pad(((0, 0), (0, 0)) + tuple((p, p) for p in pad), 0.0), [x])
        pad = (0,) * nd
    return _pool(ctx, PoolKind.AVG, x, win, stride, tuple((p, p) for p in pad), ceil)


@aten("adaptive_avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d")
def adaptive_avg_pool(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    s = ctx.shape(x)
    nd = s.rank - 2
    out = _ints(ctx.arg(1), nd, 1)
    sp = s.dims[2:]
    if all(o == 1 for o in out):
        return ctx.g.apply(Reduce(ReduceKind.MEAN, tuple(range(2, s.rank)), True), [x])
    if not all(isinstance(n, int) and n % o == 0 for n, o in zip(sp, out, strict=True)):
        raise ctx.unsupported(
            f"adaptive pooling of {s} to {list(out)} (needs sizes divisible by the output)"
        )
    win = tuple(int(n) // o for n, o in zip(sp, out, strict=True))
    return ctx.g.apply(Pool(PoolKind.AVG, win, win, ((0, 0),) * nd), [x])
