"""The fused ops of the decoder language models (rlx.models.llm), one native kernel each in
a decode step.

``rope_norm``: the per-head q / k preparation. In: packed heads
``x [B, S, H*D]``, the rotary tables ``cos, sin [L, n_rot/2]`` of every position the
context can hold, the positions ``[S]`` (i64) of the ``S`` tokens, and optionally a per-head
RMS-norm weight ``[D]``. Out: ``x``'s shape and dtype, each head RMS-normed (when the
weight is given) then rotated by the table rows at its token's position.

It stands for ``rope(rms_norm(x per head, w, eps), gather(cos, positions),
gather(sin, positions))`` (:class:`rlx.ops.norm.RmsNorm`, :class:`rlx.ops.nn.Rope`) and
computes what they compute, operation for operation; one native kernel then replaces the
two table gathers, the norm and the rotation of a decode step (rlx.models.llm builds it
for q and for k of every layer). Positions outside ``[0, L)`` are an InputError.

``norm_add``: ``residual + rms_norm(x, weight)`` over the last axis (``x``, ``residual``
of one shape, ``weight [N]``): Gemma's post-attention / post-FFN norm and the residual add
after it, the ops :class:`rlx.ops.norm.RmsNorm` and an ``add`` compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.linalg import upcast
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["NormAdd", "RopeNorm", "norm_add_reference", "rope_norm_reference"]


def rope_norm_reference(
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    positions: np.ndarray,
    weight: np.ndarray | None,
    head_dim: int,
    n_rot: int,
    interleaved: bool,
    eps: float,
) -> np.ndarray:
    """NumPy ``rope_norm`` (module docstring) in ``x``'s (widened) dtype."""
    b, s, hd = x.shape
    pos = np.asarray(positions).reshape(-1)
    bad = (pos < 0) | (pos >= cos.shape[0])
    if bad.any():
        raise InputError(
            f"rope_norm: position {int(pos[bad][0])} is outside the rotary tables of "
            f"{cos.shape[0]} rows"
        )
    xh = x.reshape(b, s, hd // head_dim, head_dim)
    if weight is not None:
        ms = np.mean(xh * xh, axis=-1, keepdims=True)
        xh = xh / np.sqrt(ms + np.asarray(eps, x.dtype)) * weight
    out = xh.copy()
    c, sn = cos[pos][None, :, None, :], sin[pos][None, :, None, :]
    if interleaved:
        lo, hi = slice(0, n_rot, 2), slice(1, n_rot, 2)
    else:
        lo, hi = slice(0, n_rot // 2), slice(n_rot // 2, n_rot)
    a, bb = xh[..., lo], xh[..., hi]
    out[..., lo] = a * c - bb * sn
    out[..., hi] = bb * c + a * sn
    return out.reshape(b, s, hd)


@register
class RopeNorm(Op):
    """``rope(rms_norm(x per head) if weight else x, cos[positions], sin[positions])``
    (module docstring). Inputs ``x, cos, sin, positions[, weight]``; ``head_dim``,
    ``n_rot``, ``interleaved`` as :class:`rlx.ops.nn.Rope`, ``eps`` the norm's."""

    mnemonic: ClassVar[str] = "rope_norm"
    arity: ClassVar[int | None] = None
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    nondiff: ClassVar[str] = (
        "an inference fusion of the decoder (rlx.models.llm); differentiate the rms_norm "
        "and rope it stands for"
    )
    head_dim: int
    n_rot: int
    interleaved: bool = False
    eps: float = 1e-6

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        expect(len(ins) in (4, 5), self, f"takes x, cos, sin, positions[, weight], got {len(ins)}")
        x, cos, sin, pos = ins[:4]
        d, r = self.head_dim, self.n_rot
        expect(d >= 1, self, f"head_dim must be >= 1, got {d}")
        expect(r >= 2 and r % 2 == 0 and r <= d, self, f"n_rot must be even in [2, {d}], got {r}")
        expect(x.dtype.is_float, self, f"x must be a float tensor, got {x}")
        expect(x.rank == 3, self, f"x must be [B,S,H*{d}], got {x}")
        last = x.dims[2]
        expect(isinstance(last, int) and last % d == 0, self,
               f"x's last dim must be a multiple of head_dim={d}, got {x}")  # fmt: skip
        for name, t in (("cos", cos), ("sin", sin)):
            expect(t.dtype is x.dtype, self, f"{name} {t} must have x's dtype {x.dtype}")
            expect(t.rank == 2 and t.dims[1] == r // 2, self,
                   f"{name} must be [L, n_rot/2 = {r // 2}], got {t}")  # fmt: skip
        expect(cos.dims == sin.dims, self, f"cos {cos} and sin {sin} differ")
        expect(pos.dtype in (DType.I64, DType.I32) and pos.dims == (x.dims[1],), self,
               f"positions must be i64 / i32 [S = {x.dims[1]}], got {pos}")  # fmt: skip
        if len(ins) == 5:
            w = ins[4]
            expect(w.dtype is x.dtype and w.dims == (d,), self,
                   f"weight must be {x.dtype} [{d}], got {w}")  # fmt: skip
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, cos, sin = (upcast(a) for a in xs[:3])
        w = upcast(xs[4]) if len(xs) == 5 else None
        out = rope_norm_reference(
            x, cos, sin, xs[3], w, self.head_dim, self.n_rot, self.interleaved, self.eps
        )
        return out.astype(ctx.out_dtype)


@graph_method
def rope_norm(
    g: Graph,
    x: NodeId,
    cos: NodeId,
    sin: NodeId,
    positions: NodeId,
    weight: NodeId | None,
    head_dim: int,
    n_rot: int,
    interleaved: bool = False,
    eps: float = 1e-6,
) -> NodeId:
    """``x [B,S,H*D]`` per head RMS-normed by ``weight [D]`` (None: no norm) then rotated
    by the rows ``positions`` of the tables ``cos, sin [L, n_rot/2]``."""
    ins = [x, cos, sin, positions] + ([] if weight is None else [weight])
    return g.apply(RopeNorm(head_dim, n_rot, interleaved, float(eps)), ins)


def norm_add_reference(
    x: np.ndarray, weight: np.ndarray, residual: np.ndarray, eps: float
) -> np.ndarray:
    """NumPy ``norm_add``: ``residual + x / sqrt(mean(x^2) + eps) * weight``."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return residual + x / np.sqrt(ms + np.asarray(eps, x.dtype)) * weight


@register
class NormAdd(Op):
    """``residual + rms_norm(x, weight, eps)`` over the last axis (module docstring).
    Inputs ``x, weight, residual``."""

    mnemonic: ClassVar[str] = "norm_add"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    nondiff: ClassVar[str] = (
        "an inference fusion of the decoder (rlx.models.llm); differentiate the rms_norm "
        "and add it stands for"
    )
    eps: float = 1e-6

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, w, r = ins
        expect(x.dtype.is_float and x.rank >= 1, self, f"x must be a float tensor, got {x}")
        expect(w.dtype is x.dtype and w.dims == (x.dims[-1],), self,
               f"weight must be {x.dtype} [{x.dims[-1]}], got {w}")  # fmt: skip
        expect(r.dtype is x.dtype and r.dims == x.dims, self,
               f"residual must be x's {x}, got {r}")  # fmt: skip
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, w, r = (upcast(a) for a in xs)
        return norm_add_reference(x, w, r, self.eps).astype(ctx.out_dtype)


@graph_method
def norm_add(g: Graph, x: NodeId, weight: NodeId, residual: NodeId, eps: float = 1e-6) -> NodeId:
    """``residual + rms_norm(x, weight, eps)`` over the last axis."""
    return g.apply(NormAdd(float(eps)), [x, weight, residual])
