"""Backward ops of the normalisations and the neural-network ops: what their derivative
rules (``vjp`` / ``jvp`` beside each forward op) build.

Each op's output is one gradient; an op that yields several (attention: dq, dk, dv) is
one node per gradient, picked by ``wrt``, each recomputing what it needs from the
primal inputs (the softmax probabilities, the normalised rows).

* ``LayerNormBackward(eps, wrt)`` / ``RmsNormBackward(eps, wrt)``: inputs ``(x, gamma,
  ct)``; ``wrt="x"`` -> dx (x's shape), ``wrt="gamma"`` -> ``sum(ct * xhat)`` over every
  row ([D]; RMS norm only: layer norm's is ``LayerNormBackwardGamma``).
* ``LayerNormBackwardGamma(eps)``: inputs ``(x, ct)`` -> layer norm's dgamma, ``sum(ct *
  xhat)`` over every row ([D]; gamma is not read). The x-Jacobian of the normalisation is symmetric, so ``wrt="x"`` with
  ``gamma`` all ones is also its forward-mode (jvp) product.
* ``AttentionBackward(fwd, wrt)``: inputs ``(q, k, v[, mask], ct)`` of the forward
  :class:`~rlx.ops.nn.Attention` ``fwd``; ``wrt`` in q, k, v (their shapes) or mask
  (the score gradient ``[B,H,Sq,Skv]``, reduced to the mask's shape by the rule), or
  ``qkv``: dq, dk, dv stacked as ``[3, B, S, E]`` from one recomputation (self-attention
  shapes: q, k and v of one shape), split by the rule with narrow + reshape.
* ``AttentionJvp(fwd)``: inputs ``(q, k, v[, mask], tq, tk, tv[, tmask])`` -> the output
  tangent (``[B,Sq,H*D]``).
* ``RopeBackward(fwd, wrt)``: inputs ``(x, ct)`` -> the gradient of ``cos`` or ``sin``
  (``[S, n_rot/2]``); x's gradient is the inverse rotation (``rope`` with ``-sin``).
* ``ConvBackwardData(fwd)`` / ``ConvBackwardWeight(fwd)``: inputs ``(x, w, ct)`` of the
  forward :class:`~rlx.ops.nn.Conv` (without its bias) -> dx / dw (dx reads x only for
  its shape, dw reads w only for its shape).
* ``PoolBackward(fwd)``: inputs ``(x, ct)`` -> dx: a max pool routes each output's
  gradient to its window's first maximum, an average pool spreads it over the window's
  real (unpadded) elements. ``MaxPoolSelect(fwd)``: inputs ``(x, t)`` -> ``t`` at each
  window's first maximum (the max pool's jvp; the transpose of its PoolBackward).
  Both are linear in their second input, so their own rules are each other.
  ``MaxPool2dBackward(fwd)``: PoolBackward of a 2-D max pool (the seed's op; what the
  rules emit for one), with the same rules.

References compute in f64 for f64 and f32 otherwise, and round once to the node dtype.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import product
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.linalg import upcast
from rlx.ops.nn import Attention, Conv, Pool, PoolKind, Rope, _softmax_rows, split_heads
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = [
    "LayerNormBackward",
    "LayerNormBackwardGamma",
    "RmsNormBackward",
    "AttentionBackward",
    "AttentionJvp",
    "RopeBackward",
    "ConvBackwardData",
    "ConvBackwardWeight",
    "PoolBackward",
    "MaxPool2dBackward",
    "MaxPoolSelect",
    "pool_backward_op",
    "norm_rows",
    "attention_probs",
]

_SECOND = "second derivatives of {} are not implemented; differentiate once"


def _same(op: Op, a: Shape, b: Shape, what: str) -> None:
    expect(a == b, op, f"{what} must match {a}, got {b}")


# ---- layer norm and RMS norm ------------------------------------------------------


def norm_rows(x: np.ndarray, eps: float, center: bool) -> tuple[np.ndarray, np.ndarray]:
    """(xhat, rstd) of the rows of ``x`` (last axis), as the forward norms compute them."""
    c = x - np.mean(x, axis=-1, keepdims=True) if center else x
    rstd = 1.0 / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + np.asarray(eps, x.dtype))
    return c * rstd, rstd


class _NormBackward(Op):
    """Shared body of the two last-axis norm backward ops."""

    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    center: ClassVar[bool] = True
    nondiff: ClassVar[str] = _SECOND.format("the normalisations")
    eps: float  # (fields are redeclared by each registered subclass)
    wrt: str

    def _infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, gamma, ct = ins
        expect(self.wrt in ("x", "gamma"), self, f"wrt must be 'x' or 'gamma', got {self.wrt!r}")
        expect(x.dtype.is_float and x.rank >= 1, self, f"x must be a float tensor, got {x}")
        _same(self, Shape((x.dims[-1],), x.dtype), gamma, "gamma")
        _same(self, x, ct, "the cotangent")
        return x if self.wrt == "x" else gamma

    def _reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, gamma, ct = (upcast(a) for a in xs)
        xhat, rstd = norm_rows(x, self.eps, self.center)
        if self.wrt == "gamma":
            return np.sum((ct * xhat).reshape(-1, x.shape[-1]), axis=0).astype(ctx.out_dtype)
        gg = ct * gamma
        proj = xhat * np.mean(gg * xhat, axis=-1, keepdims=True)
        if self.center:
            proj = proj + np.mean(gg, axis=-1, keepdims=True)
        return (rstd * (gg - proj)).astype(ctx.out_dtype)


@register
class LayerNormBackward(_NormBackward):
    """Gradient of ``layer_norm(x, gamma)`` wrt ``x`` or ``gamma``; inputs ``(x, gamma,
    ct)``: ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = ct * gamma``,
    ``dgamma = sum over rows of ct * xhat``."""

    mnemonic: ClassVar[str] = "layer_norm_backward"
    eps: float
    wrt: str = "x"
    center: ClassVar[bool] = True

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        expect(
            self.wrt == "x",
            self,
            f"wrt must be 'x' (layer norm's dgamma is layer_norm_backward_gamma), got {self.wrt!r}",
        )
        return self._infer(ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return self._reference(xs, ctx)


@register
class LayerNormBackwardGamma(_NormBackward):
    """Gradient of ``layer_norm(x, gamma)`` wrt ``gamma``; inputs ``(x, ct)``: ``sum over
    rows of ct * xhat`` ([D]), ``xhat = (x - mean) * rstd`` (gamma is not read)."""

    mnemonic: ClassVar[str] = "layer_norm_backward_gamma"
    arity: ClassVar[int] = 2
    eps: float
    wrt: ClassVar[str] = "gamma"
    center: ClassVar[bool] = True

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, ct = ins
        return self._infer((x, Shape(x.dims[-1:], x.dtype), ct))

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, ct = xs
        return self._reference((x, x, ct), ctx)


@register
class RmsNormBackward(_NormBackward):
    """Gradient of ``rms_norm(x, gamma)`` wrt ``x`` or ``gamma``; inputs ``(x, gamma,
    ct)``: ``dx = rstd * (g - xhat * mean(g * xhat))`` with ``g = ct * gamma``."""

    mnemonic: ClassVar[str] = "rms_norm_backward"
    eps: float
    wrt: str = "x"
    center: ClassVar[bool] = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return self._infer(ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return self._reference(xs, ctx)


# ---- attention ----------------------------------------------------------------------


def attention_probs(op: Attention, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """``(qh, kh, vh, p)``: per-head q, k, v ``[B,H,S,D]`` (kv heads repeated) and the
    softmax probabilities ``[B,H,Sq,Skv]`` of the forward attention ``op`` on ``xs =
    (q, k, v[, mask])`` (wide dtype)."""
    q, k, v = (upcast(a) for a in xs[:3])
    qh, kh, vh = split_heads(q, k, v, op.num_heads, op.head_dim, op.kv_heads)
    s = np.matmul(qh, kh.swapaxes(-1, -2)) * np.asarray(op.effective_scale, q.dtype)
    if len(xs) == 4:
        s = s + upcast(xs[3]).astype(s.dtype)
    allowed = op.mask.allowed(q.shape[1], k.shape[1])
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        p = _softmax_rows(s)  # a query that sees no key: zeros, so its gradients are 0
    return qh, kh, vh, p


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    b, s, hd = x.shape
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


def _pack(xh: np.ndarray, groups: int = 1) -> np.ndarray:
    """[B,H,S,D] -> [B,S,(H/groups)*D], summing each group of ``groups`` heads."""
    b, h, s, d = xh.shape
    if groups > 1:
        xh = xh.reshape(b, h // groups, groups, s, d).sum(axis=2)
    return xh.transpose(0, 2, 1, 3).reshape(b, s, -1)


@register
class AttentionBackward(Op):
    """Gradient of the attention ``fwd`` wrt ``q``, ``k``, ``v`` or the additive ``mask``
    (as the full score gradient ``[B,H,Sq,Skv]``); inputs ``(q, k, v[, mask], ct)``.
    Probabilities are recomputed: ``dv = Pᵀ·dO``, ``dS = P ⊙ (dO·vᵀ - rowsum(dO ⊙ O))``,
    ``dq = dS·k·scale``, ``dk = dSᵀ·q·scale`` (grouped heads summed into their kv head).
    A query row that sees no key has ``P = 0`` (its output is 0), so its gradients are 0."""

    mnemonic: ClassVar[str] = "attention_backward"
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    nondiff: ClassVar[str] = _SECOND.format("attention")
    fwd: Attention
    wrt: str = "q"

    def num_inputs(self) -> int:
        return self.fwd.num_inputs() + 1

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        expect(
            self.wrt in ("q", "k", "v", "mask", "qkv"),
            self,
            f"wrt must be q, k, v, mask or qkv, got {self.wrt!r}",
        )
        expect(len(ins) == self.num_inputs(), self, f"expected {self.num_inputs()} inputs")
        expect(self.wrt != "mask" or len(ins) == 5, self, "wrt=mask needs a custom-mask attention")
        out = self.fwd.infer(ins[:-1])
        _same(self, out, ins[-1], "the cotangent")
        q, k = ins[0], ins[1]
        if self.wrt == "mask":
            return Shape((q.dims[0], self.fwd.num_heads, q.dims[1], k.dims[1]), q.dtype)
        if self.wrt == "qkv":
            expect(q == k == ins[2], self, f"wrt=qkv needs q, k, v of one shape, got {ins[:3]}")
            return Shape((3, *q.dims), q.dtype)
        return ins["qkv".index(self.wrt)]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        fwd = self.fwd
        qh, kh, vh, p = attention_probs(fwd, xs[:-1])
        do = _heads(upcast(xs[-1]), fwd.num_heads)
        groups = fwd.num_heads // fwd.kv_heads
        with np.errstate(invalid="ignore"):
            dv = _pack(np.matmul(p.swapaxes(-1, -2), do), groups)
            if self.wrt == "v":
                return dv.astype(ctx.out_dtype)
            dp = np.matmul(do, vh.swapaxes(-1, -2))
            ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
            sc = np.asarray(fwd.effective_scale, ds.dtype)
            if self.wrt == "mask":
                return ds.astype(ctx.out_dtype)
            dq = _pack(np.matmul(ds, kh) * sc)
            dk = _pack(np.matmul(ds.swapaxes(-1, -2), qh) * sc, groups)
        grads = {"q": dq, "k": dk, "v": dv}
        if self.wrt == "qkv":
            return np.stack([dq, dk, dv]).astype(ctx.out_dtype)
        return grads[self.wrt].astype(ctx.out_dtype)


@register
class AttentionJvp(Op):
    """Forward-mode derivative of the attention ``fwd``: inputs ``(q, k, v[, mask], tq,
    tk, tv[, tmask])`` -> ``dO = P'·v + P·v'`` with ``S' = scale·(q'·kᵀ + q·k'ᵀ) + mask'``
    and ``P' = P ⊙ (S' - rowsum(P ⊙ S'))``."""

    mnemonic: ClassVar[str] = "attention_jvp"
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    nondiff: ClassVar[str] = _SECOND.format("attention")
    fwd: Attention

    def num_inputs(self) -> int:
        return 2 * self.fwd.num_inputs()

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        n = self.fwd.num_inputs()
        expect(len(ins) == 2 * n, self, f"expected {2 * n} inputs (primals, tangents)")
        for i, (a, t) in enumerate(zip(ins[:n], ins[n:], strict=True)):
            _same(self, a, t, f"tangent {i}")
        return self.fwd.infer(ins[:n])

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        fwd = self.fwd
        n = fwd.num_inputs()
        qh, kh, vh, p = attention_probs(fwd, xs[:n])
        tq, tk, tv = (upcast(a) for a in xs[n : n + 3])
        tqh, tkh, tvh = split_heads(tq, tk, tv, fwd.num_heads, fwd.head_dim, fwd.kv_heads)
        ts = np.matmul(tqh, kh.swapaxes(-1, -2)) + np.matmul(qh, tkh.swapaxes(-1, -2))
        ts = ts * np.asarray(fwd.effective_scale, ts.dtype)
        if n == 4:
            ts = ts + upcast(xs[-1]).astype(ts.dtype)
        with np.errstate(invalid="ignore"):
            ts = np.where(p > 0, ts, 0.0)  # hidden keys: P = 0 and S' is irrelevant
            tp = p * (ts - np.sum(p * ts, axis=-1, keepdims=True))
            o = np.matmul(tp, vh) + np.matmul(p, tvh)
        return _pack(o).astype(ctx.out_dtype)


# ---- rotary embedding ------------------------------------------------------------------


def rope_pairs(op: Rope, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rotated pairs ``(a, b)`` of ``x[B,S,H*D]`` as ``[B,S,H,n_rot/2]`` views."""
    b, s, hd = x.shape
    xh = x.reshape(b, s, hd // op.head_dim, op.head_dim)
    r = op.n_rot
    if op.interleaved:
        return xh[..., 0:r:2], xh[..., 1:r:2]
    return xh[..., : r // 2], xh[..., r // 2 : r]


@register
class RopeBackward(Op):
    """Gradient of the rotary embedding ``fwd`` wrt its ``cos`` or ``sin`` table; inputs
    ``(x, ct)`` -> ``[S, n_rot/2]``: ``dcos = Σ(ct_a·a + ct_b·b)``, ``dsin = Σ(ct_b·a -
    ct_a·b)`` over batch and heads, for each rotated pair ``(a, b)``."""

    mnemonic: ClassVar[str] = "rope_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    nondiff: ClassVar[str] = _SECOND.format("rope's tables")
    fwd: Rope
    wrt: str = "cos"

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, ct = ins
        expect(self.wrt in ("cos", "sin"), self, f"wrt must be cos or sin, got {self.wrt!r}")
        table = Shape((x.dims[1], self.fwd.n_rot // 2), x.dtype)
        self.fwd.infer((x, table, table))
        _same(self, x, ct, "the cotangent")
        return table

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        a, b = rope_pairs(self.fwd, upcast(xs[0]))
        ca, cb = rope_pairs(self.fwd, upcast(xs[1]))
        t = ca * a + cb * b if self.wrt == "cos" else cb * a - ca * b
        return np.sum(t, axis=(0, 2)).astype(ctx.out_dtype)


# ---- convolution and pooling -----------------------------------------------------------


def window_taps(
    k: Sequence[int], stride: Sequence[int], dil: Sequence[int], out: Sequence[int]
) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """For each kernel offset ``t``: ``(t, slices)`` where ``xpad[..., *slices]`` are the
    padded-input elements that tap ``t`` of every output window reads (``[..., *out]``)."""
    for t in product(*(range(kk) for kk in k)):
        yield (
            t,
            tuple(
                slice(d * ti, d * ti + s * (o - 1) + 1, s)
                for ti, s, d, o in zip(t, stride, dil, out, strict=True)
            ),
        )


def _unpad(xp: np.ndarray, pads: Sequence[tuple[int, int]]) -> np.ndarray:
    return xp[(..., *(slice(lo, xp.shape[2 + i] - hi) for i, (lo, hi) in enumerate(pads)))]


class _ConvGrad(Op):
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    fwd: Conv  # (redeclared by each registered subclass)

    def _check(self, ins: tuple[Shape, ...]) -> None:
        expect(not self.fwd.has_bias, self, "fwd must be the conv without its bias")
        x, w, ct = ins
        _same(self, self.fwd.infer((x, w)), ct, "the cotangent")

    def _grouped(self, xs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        """x padded ``[N,G,C/G,*sp]``, w ``[G,O/G,C/G,*k]``, ct ``[N,G,O/G,*out]``."""
        x, w, ct = (upcast(a) for a in xs)
        g = self.fwd.groups
        xp = np.pad(x, ((0, 0), (0, 0), *self.fwd.padding))
        n, c = x.shape[:2]
        o = w.shape[0]
        return (
            xp.reshape(n, g, c // g, *xp.shape[2:]),
            w.reshape(g, o // g, *w.shape[1:]),
            ct.reshape(n, g, o // g, *ct.shape[2:]),
        )


@register
class ConvBackwardData(_ConvGrad):
    """Gradient of ``conv(x, w)`` (``fwd``, without bias) wrt ``x``; inputs ``(x, w, ct)``:
    every kernel tap scatters ``wᵀ·ct`` back onto the input positions it read."""

    mnemonic: ClassVar[str] = "conv_backward_data"
    fwd: Conv
    nondiff: ClassVar[str] = _SECOND.format("conv")

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        self._check(ins)
        return ins[0]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        xp, wg, ctg = self._grouped(xs)
        dxp = np.zeros_like(xp)
        f = self.fwd
        for t, sl in window_taps(wg.shape[3:], f.stride, f.dilation, ctg.shape[3:]):
            dxp[(..., *sl)] += np.einsum("ngo...,goc->ngc...", ctg, wg[(..., *t)])
        dxp = dxp.reshape(dxp.shape[0], -1, *dxp.shape[3:])
        return _unpad(dxp, f.padding).astype(ctx.out_dtype)


@register
class ConvBackwardWeight(_ConvGrad):
    """Gradient of ``conv(x, w)`` (``fwd``, without bias) wrt ``w``; inputs ``(x, w, ct)``:
    tap ``t`` of ``dw`` is ``Σ ct · x[tap t]`` over batch and output positions."""

    mnemonic: ClassVar[str] = "conv_backward_weight"
    fwd: Conv
    nondiff: ClassVar[str] = _SECOND.format("conv")

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        self._check(ins)
        return ins[1]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        xp, wg, ctg = self._grouped(xs)
        dw = np.zeros_like(wg)
        f = self.fwd
        for t, sl in window_taps(wg.shape[3:], f.stride, f.dilation, ctg.shape[3:]):
            xt = xp[(..., *sl)]
            dw[(..., *t)] = np.einsum(
                "ngol,ngcl->goc", ctg.reshape(*ctg.shape[:3], -1), xt.reshape(*xt.shape[:3], -1)
            )
        return dw.reshape(xs[1].shape).astype(ctx.out_dtype)


def _max_taps(f: Pool, x: np.ndarray, out: Sequence[int]) -> tuple[list, np.ndarray, tuple]:
    """(taps, index of each window's first maximum, padded shape) of a max pool."""
    pads = ((0, 0), (0, 0), *f.padding)
    xp = np.pad(x, pads, constant_values=-np.inf)
    taps = list(window_taps(f.window, f.stride, (1,) * len(f.window), out))
    first = np.argmax(np.stack([xp[(..., *sl)] for _, sl in taps], axis=-1), axis=-1)
    return taps, first, xp.shape


class _PoolLinear(Op):
    """Rules of PoolBackward and MaxPoolSelect: linear in input 1, x only selects (its
    derivative is zero almost everywhere), and each is the other's transpose."""

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        x = node.inputs[0]
        fwd: Pool = self.fwd  # type: ignore[attr-defined]
        if isinstance(self, MaxPoolSelect):
            return None, g.apply(pool_backward_op(fwd), [x, ct])
        if fwd.fn is PoolKind.AVG:
            return None, g.apply(fwd, [ct])
        return None, g.apply(MaxPoolSelect(fwd), [x, ct])

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        t = tangents[1]
        return None if t is None else g.apply(self, [node.inputs[0], t])


@register
class PoolBackward(_PoolLinear):
    """Gradient of the pooling ``fwd`` wrt its input; inputs ``(x, ct)``. Max: each
    window's gradient goes to its first maximal element (row-major window order, as
    PyTorch); average: ``ct / count`` to each real element of the window."""

    mnemonic: ClassVar[str] = "pool_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    fwd: Pool

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, ct = ins
        expect(x.dtype.is_float, self, f"x must be a float tensor, got {x}")
        _same(self, self.fwd.infer((x,)), ct, "the cotangent")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return _pool_backward(self.fwd, xs, ctx)


def _pool_backward(f: Pool, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
    """dx of the pool ``f`` (see :class:`PoolBackward`)."""
    x, ct = upcast(xs[0]), upcast(xs[1])
    if f.fn is PoolKind.MAX:
        taps, first, padded = _max_taps(f, x, ct.shape[2:])
        dxp = np.zeros(padded, x.dtype)
        for i, (_, sl) in enumerate(taps):
            dxp[(..., *sl)] += np.where(first == i, ct, 0.0)
    else:
        taps = list(window_taps(f.window, f.stride, (1,) * len(f.window), ct.shape[2:]))
        cnt = np.pad(np.ones(x.shape[2:], x.dtype), f.padding)
        share = ct / sum(cnt[sl] for _, sl in taps)
        dxp = np.zeros(np.pad(x, ((0, 0), (0, 0), *f.padding)).shape, x.dtype)
        for _, sl in taps:
            dxp[(..., *sl)] += share
    return _unpad(dxp, f.padding).astype(ctx.out_dtype)


@register
class MaxPoolSelect(_PoolLinear):
    """``t`` (shaped like ``x``) read at each window's first maximum of ``x`` under the
    max pool ``fwd``; inputs ``(x, t)`` -> ``[N,C,*out]``: the max pool's jvp."""

    mnemonic: ClassVar[str] = "max_pool_select"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    fwd: Pool

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, t = ins
        expect(self.fwd.fn is PoolKind.MAX, self, f"fwd must be a max pool, got {self.fwd}")
        expect(x.dtype.is_float, self, f"x must be a float tensor, got {x}")
        _same(self, x, t, "the tangent")
        return self.fwd.infer((x,))

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, t = upcast(xs[0]), upcast(xs[1])
        taps, first, _ = _max_taps(self.fwd, x, ctx.out_dims[2:])
        tp = np.pad(t, ((0, 0), (0, 0), *self.fwd.padding))
        stacked = np.stack([tp[(..., *sl)] for _, sl in taps], axis=-1)
        return np.take_along_axis(stacked, first[..., None], axis=-1)[..., 0].astype(ctx.out_dtype)


@register
class MaxPool2dBackward(_PoolLinear):
    """Gradient of the 2-D max pool ``fwd`` wrt its input; inputs ``(x[N,C,H,W], ct)``:
    each window's gradient goes to its first maximal element (row-major window order, as
    PyTorch's ``max_pool2d_with_indices_backward``). PoolBackward's value for a 2-D max
    pool: the rules emit this op for one."""

    mnemonic: ClassVar[str] = "max_pool2d_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT  # the seed's class
    fwd: Pool

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        f = self.fwd
        expect(
            f.fn is PoolKind.MAX and len(f.window) == 2,
            self,
            f"fwd must be a 2-D max pool, got {f}",
        )
        x, ct = ins
        expect(x.dtype.is_float, self, f"x must be a float tensor, got {x}")
        _same(self, f.infer((x,)), ct, "the cotangent")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return _pool_backward(self.fwd, xs, ctx)


def pool_backward_op(fwd: Pool) -> Op:
    """The backward op the rules emit for the pool ``fwd``: MaxPool2dBackward for a 2-D max
    pool, PoolBackward otherwise."""
    if fwd.fn is PoolKind.MAX and len(fwd.window) == 2:
        return MaxPool2dBackward(fwd)
    return PoolBackward(fwd)
