"""Normalisations: layer norm and RMS norm over the last axis, group norm over channel
groups.

All take float inputs whose scale (``gamma``) and shift (``beta``) share the input's
dtype. f16/bf16 inputs are normalised in f32 and rounded back, as the CPU kernels do.
Variances are biased (divided by the element count), as in PyTorch and JAX.

Derivatives: ``vjp`` builds ``LayerNormBackward`` and ``LayerNormBackwardGamma`` /
``RmsNormBackward`` nodes (``rlx/ops/nn_grad.py``: dx and dgamma, one node each) and
``sum(ct)`` for beta; the x-Jacobian of a normalisation is symmetric, so ``jvp`` reuses
the dx op with unit gamma.
Group norm is a layer norm of the ``[N, groups, C/groups * spatial]`` reshape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import _wide
from rlx.shape import Shape, Sym

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["LayerNorm", "RmsNorm", "GroupNorm"]


def _check_eps(op: Op, eps: float) -> None:
    expect(
        isinstance(eps, float) and eps >= 0.0,
        op,
        f"eps must be a float >= 0, got {eps!r}",
    )


def _check_affine(op: Op, x: Shape, params: Sequence[Shape], want: tuple, what: str) -> None:
    """``gamma`` (and ``beta``) must be float tensors of dims ``want`` and x's dtype."""
    expect(x.dtype.is_float, op, f"needs a float input, got {x}")
    for name, p in zip(("gamma", "beta"), params):
        expect(
            p.dims == want,
            op,
            f"{name} must have dims [{','.join(map(str, want))}] ({what} of input {x}), got {p}",
        )
        expect(
            p.dtype is x.dtype,
            op,
            f"{name} dtype {p.dtype} differs from the input's {x.dtype} (cast one first)",
        )


def _last_axis_infer(op: LayerNorm | RmsNorm, ins: tuple[Shape, ...]) -> Shape:
    x = ins[0]
    want = op.num_inputs()
    expect(
        len(ins) == want,
        op,
        f"expected {want} inputs (x, gamma{', beta' if op.has_beta else ''}), got {len(ins)}",
    )
    _check_eps(op, op.eps)
    expect(x.rank >= 1, op, f"needs an input of rank >= 1, got {x}")
    _check_affine(op, x, ins[1:], (x.dims[-1],), "the last dim")
    return x


@register
class LayerNorm(Op):
    """``(x - mean) / sqrt(var + eps) * gamma (+ beta)`` over the last axis. Inputs
    ``(x, gamma[, beta])``, gamma and beta of dims ``[x.dims[-1]]``."""

    mnemonic: ClassVar[str] = "layer_norm"
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    eps: float = 1e-5
    has_beta: bool = True

    def num_inputs(self) -> int:
        return 3 if self.has_beta else 2

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _last_axis_infer(self, ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = _wide(xs[0])
        mean = np.mean(x, axis=-1, keepdims=True)
        c = x - mean
        var = np.mean(c * c, axis=-1, keepdims=True)
        y = c / np.sqrt(var + np.asarray(self.eps, x.dtype)) * _wide(xs[1])
        return y + _wide(xs[2]) if self.has_beta else y

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return _last_axis_vjp(self, g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return _last_axis_jvp(self, g, node, tangents)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int | None]:
        return _last_axis_batch(self, g, node, ins, bdims)


@register
class RmsNorm(Op):
    """``x / sqrt(mean(x^2) + eps) * gamma (+ beta)`` over the last axis. Inputs
    ``(x, gamma[, beta])``, gamma and beta of dims ``[x.dims[-1]]``."""

    mnemonic: ClassVar[str] = "rms_norm"
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    eps: float = 1e-6
    has_beta: bool = False

    def num_inputs(self) -> int:
        return 3 if self.has_beta else 2

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _last_axis_infer(self, ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = _wide(xs[0])
        ms = np.mean(x * x, axis=-1, keepdims=True)
        y = x / np.sqrt(ms + np.asarray(self.eps, x.dtype)) * _wide(xs[1])
        return y + _wide(xs[2]) if self.has_beta else y

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return _last_axis_vjp(self, g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return _last_axis_jvp(self, g, node, tangents)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int | None]:
        return _last_axis_batch(self, g, node, ins, bdims)


@register
class GroupNorm(Op):
    """Inputs ``(x[N,C,*spatial], gamma[C], beta[C])``: the C channels are split into
    ``num_groups`` groups of C/num_groups; each (sample, group) is normalised over its
    channels and spatial positions, then scaled and shifted per channel."""

    mnemonic: ClassVar[str] = "group_norm"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    num_groups: int
    eps: float = 1e-5

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x = ins[0]
        _check_eps(self, self.eps)
        expect(x.rank >= 2, self, f"needs an input [N,C,...] of rank >= 2, got {x}")
        g = self.num_groups
        expect(isinstance(g, int) and g >= 1, self, f"num_groups must be >= 1, got {g!r}")
        c = x.dims[1]
        divisible = c % g == 0 if isinstance(c, int) else Sym.divide(c, g) is not None
        expect(
            divisible,
            self,
            f"the channel dim {c} of {x} is not a multiple of num_groups={g}",
        )
        _check_affine(self, x, ins[1:], (c,), "the channel dim")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = _wide(xs[0])
        n, c = x.shape[:2]
        per_group = (c // self.num_groups) * int(np.prod(x.shape[2:], dtype=np.int64))
        grouped = x.reshape(n, self.num_groups, per_group)
        mean = np.mean(grouped, axis=-1, keepdims=True)
        d = grouped - mean
        var = np.mean(d * d, axis=-1, keepdims=True)
        y = (d / np.sqrt(var + np.asarray(self.eps, x.dtype))).reshape(x.shape)
        bshape = (1, c) + (1,) * (x.ndim - 2)
        return y * _wide(xs[1]).reshape(bshape) + _wide(xs[2]).reshape(bshape)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return _group_vjp(self, g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return _group_jvp(self, g, node, tangents)


# ---- builder conveniences ---------------------------------------------------------


@graph_method
def layer_norm(
    g: Graph, x: NodeId, gamma: NodeId, beta: NodeId | None = None, eps: float = 1e-5
) -> NodeId:
    """Layer norm of ``x`` over its last axis; ``beta`` is optional."""
    ins = [x, gamma] if beta is None else [x, gamma, beta]
    return g.apply(LayerNorm(float(eps), beta is not None), ins)


@graph_method
def rms_norm(
    g: Graph, x: NodeId, gamma: NodeId, beta: NodeId | None = None, eps: float = 1e-6
) -> NodeId:
    """RMS norm of ``x`` over its last axis; ``beta`` is optional."""
    ins = [x, gamma] if beta is None else [x, gamma, beta]
    return g.apply(RmsNorm(float(eps), beta is not None), ins)


@graph_method
def group_norm(
    g: Graph, x: NodeId, gamma: NodeId, beta: NodeId, num_groups: int, eps: float = 1e-5
) -> NodeId:
    """Group norm of ``x[N,C,...]`` with ``num_groups`` channel groups."""
    return g.apply(GroupNorm(int(num_groups), float(eps)), [x, gamma, beta])


# ---- derivative and batching rules --------------------------------------------------


def _lead_sum(g: Graph, t: NodeId, keep: int) -> NodeId:
    """``t`` summed over every axis but its last ``keep`` ones."""
    lead = list(range(g.shape(t).rank - keep))
    return g.sum(t, lead) if lead else t


def _unit(g: Graph, dims: tuple, like: NodeId) -> NodeId:
    """Ones of ``dims`` in ``like``'s dtype (the gamma of a bare normalisation)."""
    from rlx.ops.rules import ones

    return ones(g, Shape(tuple(dims), g.shape(like).dtype))


def _full(g: Graph, t: NodeId | None, node: Node) -> NodeId | None:
    """``t`` broadcast to ``node``'s dims (a tangent that is only ``tbeta`` is [D])."""
    if t is None or g.shape(t).dims == node.shape.dims:
        return t
    return g.expand(t, list(node.shape.dims))


def _backward_op(op: Op) -> type[Op]:
    from rlx.ops.nn_grad import LayerNormBackward, RmsNormBackward

    return LayerNormBackward if isinstance(op, LayerNorm) else RmsNormBackward


def _last_axis_vjp(op: LayerNorm | RmsNorm, g: Graph, node: Node, ct: NodeId) -> tuple:
    back = _backward_op(op)
    x, gamma = node.inputs[:2]
    dx = g.apply(back(op.eps, "x"), [x, gamma, ct])
    if isinstance(op, LayerNorm):
        from rlx.ops.nn_grad import LayerNormBackwardGamma

        dgamma = g.apply(LayerNormBackwardGamma(op.eps), [x, ct])
    else:
        dgamma = g.apply(back(op.eps, "gamma"), [x, gamma, ct])
    return (dx, dgamma, _lead_sum(g, ct, 1)) if op.has_beta else (dx, dgamma)


def _last_axis_jvp(op: LayerNorm | RmsNorm, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
    """``gamma * J tx + xhat * tgamma + tbeta`` (J symmetric: the dx op with unit gamma)."""
    from rlx.ops.rules import add_any

    x, gamma = node.inputs[:2]
    tx, tg = tangents[:2]
    unit = _unit(g, g.shape(gamma).dims, gamma)
    terms = [None, None, tangents[2] if op.has_beta else None]
    if tx is not None:
        terms[0] = g.mul(g.apply(_backward_op(op)(op.eps, "x"), [x, unit, tx]), gamma)
    if tg is not None:
        terms[1] = g.mul(g.apply(type(op)(op.eps, False), [x, unit]), tg)
    return _full(g, add_any(g, terms), node)


def _last_axis_batch(
    op: LayerNorm | RmsNorm, g: Graph, node: Node, ins: tuple, bdims: tuple
) -> tuple[NodeId, int | None]:
    """vmap: an extra axis of x is one more row axis (moved off the last axis); a batched
    gamma / beta scales and shifts the unit-gamma norm per batch entry."""
    x, bx = ins[0], bdims[0]
    rank = g.shape(x).rank
    if bx is None:
        x, bx, rank = g.unsqueeze(x, 0), 0, rank + 1
    elif bx % rank == rank - 1:
        x, bx = g.transpose(x, [rank - 1, *range(rank - 1)]), 0
    bx %= rank
    if all(b is None for b in bdims[1:]):
        return g.apply(op, [x, *ins[1:]]), bx
    out = g.apply(type(op)(op.eps, False), [x, _unit(g, g.shape(x).dims[-1:], ins[1])])
    for k, (p, bp) in enumerate(zip(ins[1:], bdims[1:], strict=True)):
        if bp is not None:
            if bp % 2 == 1:
                p = g.transpose(p, [1, 0])
            dims = [1] * rank
            dims[bx], dims[-1] = g.shape(p).dims
            p = g.reshape(p, dims)
        out = g.mul(out, p) if k == 0 else g.add(out, p)
    return out, bx


def _group_rows(op: GroupNorm, g: Graph, x: NodeId) -> tuple[list, NodeId]:
    """(x's dims, x reshaped to ``[N, groups, C/groups * spatial]``)."""
    dims = list(g.shape(x).dims)
    m = dims[1] // op.num_groups
    for d in dims[2:]:
        m = m * d
    return dims, g.reshape(x, [dims[0], op.num_groups, m])


def _channel(g: Graph, p: NodeId, rank: int) -> NodeId:
    """A per-channel ``[C]`` tensor shaped ``[1, C, 1, ...]`` to broadcast on ``[N,C,...]``."""
    return g.reshape(p, [1, g.shape(p).dims[0]] + [1] * (rank - 2))


def _group_jx(op: GroupNorm, g: Graph, x: NodeId, t: NodeId) -> NodeId:
    """The normalisation's (symmetric) x-Jacobian applied to ``t`` (both ``[N,C,...]``)."""
    from rlx.ops.nn_grad import LayerNormBackward

    dims, xr = _group_rows(op, g, x)
    tr = g.reshape(t, list(g.shape(xr).dims))
    unit = _unit(g, g.shape(xr).dims[-1:], x)
    return g.reshape(g.apply(LayerNormBackward(op.eps, "x"), [xr, unit, tr]), dims)


def _group_xhat(op: GroupNorm, g: Graph, x: NodeId) -> NodeId:
    dims, xr = _group_rows(op, g, x)
    unit = _unit(g, g.shape(xr).dims[-1:], x)
    return g.reshape(g.apply(LayerNorm(op.eps, False), [xr, unit]), dims)


def _group_vjp(op: GroupNorm, g: Graph, node: Node, ct: NodeId) -> tuple:
    x, gamma, _ = node.inputs
    rank = node.shape.rank
    dx = _group_jx(op, g, x, g.mul(ct, _channel(g, gamma, rank)))
    axes = [0, *range(2, rank)]
    dgamma = g.sum(g.mul(ct, _group_xhat(op, g, x)), axes)
    return dx, dgamma, g.sum(ct, axes)


def _group_jvp(op: GroupNorm, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
    from rlx.ops.rules import add_any

    x, gamma, _ = node.inputs
    tx, tg, tb = tangents
    rank = node.shape.rank
    terms = [None, None, None if tb is None else _channel(g, tb, rank)]
    if tx is not None:
        terms[0] = g.mul(_group_jx(op, g, x, tx), _channel(g, gamma, rank))
    if tg is not None:
        terms[1] = g.mul(_group_xhat(op, g, x), _channel(g, tg, rank))
    return _full(g, add_any(g, terms), node)
