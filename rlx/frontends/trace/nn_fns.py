"""``rlx.nn``: neural-network functions over traced values (``jax.nn``-shaped).

In: traced values (or arrays, lifted to constants). Out: traced values built from the
IR's own ops: ``softmax``, ``log_softmax``, ``unary`` (relu, gelu, silu, sigmoid,
softplus), ``layer_norm``, ``rms_norm`` and ``attention`` (the fused op the CPU backend
runs as one flash-style kernel), plus ``reshape`` / ``where`` / ``cast`` around them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx import source
from rlx.errors import TraceError
from rlx.frontends.trace import numpy_math as m
from rlx.frontends.trace.numpy_shape import reshape
from rlx.frontends.trace.tracer import find_trace, lift
from rlx.frontends.trace.values import Traced, cast, promote_args, unary
from rlx.ops.elementwise import UnaryKind
from rlx.ops.nn import Attention, MaskKind
from rlx.ops.norm import LayerNorm, RmsNorm
from rlx.ops.reduce import LogSoftmax, Softmax

__all__ = [
    "relu", "gelu", "silu", "swish", "sigmoid", "softplus", "tanh", "leaky_relu", "elu",
    "softmax", "log_softmax", "logsumexp", "layer_norm", "rms_norm", "one_hot",
    "dot_product_attention",
]  # fmt: skip


def _float(x: Any) -> Traced:
    (v,), _ = promote_args(x, floating=True)
    return v


def relu(x: Any) -> Traced:
    """``max(x, 0)``."""
    return unary(UnaryKind.RELU, x)


def gelu(x: Any, approximate: bool = True) -> Traced:
    """GELU; ``approximate=True`` (as ``jax.nn.gelu``) is the tanh form, False the exact
    erf form (``torch``'s default)."""
    return unary(UnaryKind.GELU_TANH if approximate else UnaryKind.GELU, x, floating=True)


def silu(x: Any) -> Traced:
    """``x * sigmoid(x)``."""
    return unary(UnaryKind.SILU, x, floating=True)


swish = silu


def sigmoid(x: Any) -> Traced:
    """``1 / (1 + exp(-x))``."""
    return unary(UnaryKind.SIGMOID, x, floating=True)


def softplus(x: Any) -> Traced:
    """``log(1 + exp(x))``."""
    return unary(UnaryKind.SOFTPLUS, x, floating=True)


tanh = m.tanh
logsumexp = m.logsumexp


def leaky_relu(x: Any, negative_slope: float = 0.01) -> Traced:
    """``x if x >= 0 else negative_slope * x``."""
    v = _float(x)
    return m.where(v >= 0, v, v * negative_slope)


def elu(x: Any, alpha: float = 1.0) -> Traced:
    """``x if x > 0 else alpha * (exp(x) - 1)``."""
    v = _float(x)
    return m.where(v > 0, v, (m.exp(m.minimum(v, 0.0)) - 1.0) * alpha)


def softmax(x: Any, axis: int = -1) -> Traced:
    """``exp(x) / sum(exp(x))`` along ``axis`` (the ``softmax`` op, max subtracted)."""
    v = _float(x)
    t = v.trace
    return t.wrap(t.g.apply(Softmax(axis % v.ndim), [v.id]))


def log_softmax(x: Any, axis: int = -1) -> Traced:
    """``x - logsumexp(x)`` along ``axis`` (the ``log_softmax`` op)."""
    v = _float(x)
    t = v.trace
    return t.wrap(t.g.apply(LogSoftmax(axis % v.ndim), [v.id]))


def _norm(op: Any, x: Any, scale: Any, bias: Any) -> Traced:
    v = _float(x)
    t = v.trace
    ins = [v, cast(lift(t, scale), v.rlx_dtype)]
    if bias is not None:
        ins.append(cast(lift(t, bias), v.rlx_dtype))
    return t.wrap(t.g.apply(op, [i.id for i in ins]))


def layer_norm(x: Any, scale: Any, bias: Any = None, eps: float = 1e-5) -> Traced:
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the last axis."""
    return _norm(LayerNorm(float(eps), bias is not None), x, scale, bias)


def rms_norm(x: Any, scale: Any, bias: Any = None, eps: float = 1e-6) -> Traced:
    """``x / sqrt(mean(x**2) + eps) * scale (+ bias)`` over the last axis."""
    return _norm(RmsNorm(float(eps), bias is not None), x, scale, bias)


def one_hot(x: Any, num_classes: int, dtype: Any = np.float32) -> Traced:
    """``x[..., None] == arange(num_classes)`` as ``dtype``."""
    v = lift(find_trace(x), x)
    cls = np.arange(num_classes, dtype=v.dtype)
    return m.equal(v[..., None], cls).astype(dtype)


def dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    bias: Any = None,
    mask: Any = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
) -> Traced:
    """``softmax(q·kᵀ·scale + bias) · v`` on ``[B, T, N, H]`` query and ``[B, S, K, H]``
    key / value (or unbatched ``[T, N, H]``), as ``jax.nn.dot_product_attention``; ``K``
    may divide ``N`` (grouped-query). ``mask`` (bool, True = attend) and ``bias`` broadcast
    to ``[B, N, T, S]``; ``is_causal`` hides later keys (aligned to the end). One
    ``attention`` op on packed heads."""
    t = find_trace(query, key, value)
    q, k, v = (_float(lift(t, a)) for a in (query, key, value))
    (q, k, v), _ = promote_args(q, k, v)
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        raise TraceError(
            f"dot_product_attention: query, key and value must all be [B, T, N, H] or "
            f"[T, N, H], got {q.aval}, {k.aval} and {v.aval}",
            loc=source.capture(),
        )
    unbatched = q.ndim == 3
    if unbatched:
        q, k, v = (a[None] for a in (q, k, v))
    b, tq, n, h = q.shape
    nk = k.shape[2]
    packed = [reshape(a, (a.shape[0], a.shape[1], a.shape[2] * a.shape[3])) for a in (q, k, v)]
    extra = None
    if mask is not None:
        mv = lift(t, mask)
        ninf = np.asarray(-np.inf, q.dtype)
        extra = m.where(mv, np.asarray(0, q.dtype), ninf)
    if bias is not None:
        bv = cast(lift(t, bias), q.rlx_dtype)
        extra = bv if extra is None else m.add(extra, bv)
    if is_causal:
        mk = MaskKind.causal()
        if extra is not None:  # causal plus an explicit mask: build the causal part here
            s = k.shape[1]
            tri = np.tril(np.ones((tq, s), bool), k=s - tq)
            extra = m.where(tri, extra, np.asarray(-np.inf, q.dtype))
            mk = MaskKind.custom()
    else:
        mk = MaskKind.custom() if extra is not None else MaskKind()
    op = Attention(n, h, mk, None if nk == n else nk, None if scale is None else float(scale))
    ins = [p.id for p in packed] + ([] if extra is None else [extra.id])
    out = t.wrap(t.g.apply(op, ins))
    out = reshape(out, (b, tq, n, h))
    return out[0] if unbatched else out
