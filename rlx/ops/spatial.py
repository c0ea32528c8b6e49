"""2-D spatial data movement of vision models: nearest 2x upsampling and axial rotary
embedding over a grid of tokens.

* :class:`ResizeNearest2x` ``x [..., H, W] -> [..., 2H, 2W]``, ``out[..., i, j] =
  x[..., i // 2, j // 2]`` (NCHW: the last two axes are height and width; as
  ``torch.nn.functional.interpolate(scale_factor=2, mode="nearest")``). Any dtype. Its
  vjp sums the cotangent over each 2x2 block (a reshape and a ``reduce``), its jvp is
  itself.
* :class:`AxialRope2d` ``x [..., S, n * head_dim] -> same``: 2-D axial rotary position
  embedding of ``S = grid_h * grid_w`` tokens in row-major order (token ``p`` at row
  ``p // grid_w``, column ``p % grid_w``), ``n`` heads of ``head_dim`` (a multiple of 4)
  packed on the last axis. Per head, the first half of the dims rotates by the row's
  angles and the second half by the column's: with ``q = head_dim / 4`` frequencies
  ``f_i = theta ** (-4 i / head_dim)``, pair ``i`` of the first half turns by ``row *
  f_i`` and pair ``i`` of the second half by ``col * f_i`` (SAM 2's and the axial RoPE
  of vision transformers, heights first). Pairs within a half are ``(i, i + q)``
  (NeoX, rotate-half, the default, as ``rope``) or ``(2i, 2i+1)`` (``interleaved``);
  ``(a, b)`` becomes ``(a cos - b sin, a sin + b cos)``. ``inverse`` turns by the
  negative angles: that is the op's vjp (a rotation's adjoint is its inverse); the jvp
  is the op itself.

The angle tables are computed in float64 from the attributes and rounded to the
computing dtype (f32, or f64 for f64 inputs): the reference and the CPU kernel use the
same tables (:func:`axial_tables`) and the same arithmetic (:func:`rotate_into`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import _wide
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["ResizeNearest2x", "AxialRope2d", "axial_tables", "rotate_into"]


def _batch_first(
    op: Op, g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
) -> tuple[NodeId, int | None]:
    """``Op.batch`` of a one-input op over any leading dims: the batch axis moved first."""
    from rlx.ops.rules import moveaxis

    (x,), (bd,) = ins, bdims
    if bd is None:
        return g.apply(op, [x]), None
    return g.apply(op, [moveaxis(g, x, bd, 0)]), 0


@register
class ResizeNearest2x(Op):
    """``x [..., H, W] -> [..., 2H, 2W]``: nearest-neighbour 2x upsampling of the last
    two axes (each element becomes a 2x2 block); any dtype."""

    mnemonic: ClassVar[str] = "resize_nearest_2x"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        expect(x.rank >= 2, self, f"needs an input [..., H, W] of rank >= 2, got {x}")
        *lead, h, w = x.dims
        return x.with_dims([*lead, h * 2, w * 2])

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.repeat(np.repeat(xs[0], 2, axis=-2), 2, axis=-1)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        *lead, h, w = g.shape(node.inputs[0]).dims
        r = len(lead)
        blocks = g.reshape(ct, [*lead, h, 2, w, 2])
        return (g.sum(blocks, [r + 1, r + 3]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        t = tangents[0]
        return None if t is None else g.apply(self, [t])

    batch = _batch_first


@register
class AxialRope2d(Op):
    """2-D axial rotary embedding of ``x [..., grid_h * grid_w, n * head_dim]``: per head,
    the first half of the dims rotated by the token's row angles, the second half by its
    column angles (module docstring: frequencies, pairs, ``inverse``)."""

    mnemonic: ClassVar[str] = "axial_rope_2d"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    grid_h: int
    grid_w: int
    head_dim: int
    theta: float = 10000.0
    interleaved: bool = False
    inverse: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        d, gh, gw = self.head_dim, self.grid_h, self.grid_w
        expect(
            isinstance(d, int) and d >= 4 and d % 4 == 0,
            self,
            f"head_dim must be a positive multiple of 4, got {d}",
        )
        expect(
            isinstance(gh, int) and isinstance(gw, int) and gh >= 1 and gw >= 1,
            self,
            f"grid_h and grid_w must be >= 1, got {gh} x {gw}",
        )
        expect(self.theta > 0, self, f"theta must be > 0, got {self.theta}")
        expect(x.dtype.is_float, self, f"needs a float input, got {x}")
        expect(x.rank >= 2, self, f"x must be [..., tokens, heads * {d}], got {x}")
        s, hd = x.dims[-2], x.dims[-1]
        expect(
            s == gh * gw,
            self,
            f"x has {s} tokens on axis -2; the {gh} x {gw} grid has {gh * gw}",
        )
        expect(
            isinstance(hd, int) and hd % d == 0,
            self,
            f"x's last dim must be a multiple of head_dim={d}, got {x}",
        )
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = _wide(xs[0])
        cos, sin = axial_tables(self, x.dtype)
        out = np.empty_like(x)
        rotate_into(self, x, cos, sin, out, np.empty(_half_shape(self, x.shape), x.dtype))
        return out

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (g.apply(dataclasses.replace(self, inverse=not self.inverse), [ct]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        t = tangents[0]
        return None if t is None else g.apply(self, [t])

    batch = _batch_first


def axial_tables(op: AxialRope2d, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin [2, S, head_dim / 4]`` of the angles (row angles first, then column
    angles) computed in float64, rounded to ``dtype``; ``sin`` negated for ``inverse``."""
    q = op.head_dim // 4
    freqs = op.theta ** (-4.0 * np.arange(q, dtype=np.float64) / op.head_dim)
    p = np.arange(op.grid_h * op.grid_w)
    ang = np.stack([np.outer(p // op.grid_w, freqs), np.outer(p % op.grid_w, freqs)])
    sin = -np.sin(ang) if op.inverse else np.sin(ang)
    return np.cos(ang).astype(dtype), sin.astype(dtype)


def _half_shape(op: AxialRope2d, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one rotated part: ``[..., S, heads, head_dim / 4]``."""
    return (*shape[:-1], shape[-1] // op.head_dim, op.head_dim // 4)


def rotate_into(
    op: AxialRope2d,
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    out: np.ndarray,
    tmp: np.ndarray,
) -> None:
    """``out = op(x)`` with the tables of :func:`axial_tables` and a scratch ``tmp`` of
    :func:`_half_shape`: ufuncs writing into ``out``'s parts (``out`` must not alias
    ``x``)."""
    d, q = op.head_dim, op.head_dim // 4
    heads = x.shape[-1] // d
    xv = x.reshape(*x.shape[:-1], heads, d)
    ov = out.reshape(xv.shape)
    for half in (0, 1):
        base = half * 2 * q
        if op.interleaved:
            lo, hi = slice(base, base + 2 * q, 2), slice(base + 1, base + 2 * q, 2)
        else:
            lo, hi = slice(base, base + q), slice(base + q, base + 2 * q)
        a, b, oa, ob = xv[..., lo], xv[..., hi], ov[..., lo], ov[..., hi]
        c, s = cos[half][:, None, :], sin[half][:, None, :]
        np.multiply(a, c, out=oa)  # a cos - b sin
        np.multiply(b, s, out=tmp)
        np.subtract(oa, tmp, out=oa)
        np.multiply(b, c, out=ob)  # b cos + a sin
        np.multiply(a, s, out=tmp)
        np.add(ob, tmp, out=ob)


@graph_method
def resize_nearest_2x(g: Graph, x: NodeId) -> NodeId:
    """Nearest-neighbour 2x upsampling of the last two axes of ``x [..., H, W]``."""
    return g.apply(ResizeNearest2x(), [x])


@graph_method
def axial_rope_2d(
    g: Graph,
    x: NodeId,
    grid_h: int,
    grid_w: int,
    head_dim: int,
    theta: float = 10000.0,
    interleaved: bool = False,
) -> NodeId:
    """2-D axial rotary embedding of ``x [..., grid_h * grid_w, heads * head_dim]``."""
    return g.apply(AxialRope2d(grid_h, grid_w, head_dim, float(theta), interleaved), [x])
