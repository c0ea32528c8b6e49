"""Normalisations: layer norm and RMS norm over the last axis, group norm over channel
groups.

All take float inputs whose scale (``gamma``) and shift (``beta``) share the input's
dtype. f16/bf16 inputs are normalised in f32 and rounded back, as the CPU kernels do.
Variances are biased (divided by the element count), as in PyTorch and JAX.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from rlx.ir.mir import Graph, NodeId
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import _wide
from rlx.shape import Shape, Sym

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
