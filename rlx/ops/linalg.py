"""Linear algebra ops: matmul (NumPy ``matmul`` semantics) and dot_general (JAX order).

Both inputs must share a dtype (bool is rejected). Low-precision floats (f16, bf16, fp8)
are multiplied and accumulated in f32, then rounded once to the node's dtype; integer
inputs accumulate in i64 and wrap to the node's dtype, as NumPy's ``astype`` does.
Batch and row dims may be symbolic; contracted dims must match exactly (a symbol matches
only itself).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from rlx.errors import ShapeError
from rlx.ir import source
from rlx.ir.mir import Graph, NodeId
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.shape import Dim, Shape, broadcast_dims

__all__ = ["MatMul", "DotGeneral", "upcast", "accumulate"]


def upcast(x: np.ndarray) -> np.ndarray:
    """``x`` with f16/bf16/fp8 widened to f32 (the compute type); other dtypes as is."""
    if x.dtype.kind == "f" and x.dtype.itemsize < 4:
        return x.astype(np.float32)
    if x.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return x.astype(np.float32)
    return x


def accumulate(x: np.ndarray) -> np.ndarray:
    """``x`` in its accumulation dtype: f32 for low-precision floats, i64 for integers."""
    if x.dtype.kind in "iu":
        return x.astype(np.int64)
    return upcast(x)


def _check_dtypes(op: Op, a: Shape, b: Shape) -> None:
    expect(
        a.dtype is b.dtype,
        op,
        f"needs equal dtypes, got lhs {a} and rhs {b} (cast one first)",
    )
    expect(not a.dtype.is_bool, op, f"needs numeric inputs, got bool lhs {a}")


@register
class MatMul(Op):
    """``a @ b`` as ``np.matmul``: the last two dims multiply ([..., M, K] @ [..., K, N]),
    leading dims broadcast; a 1-D lhs is a row vector and a 1-D rhs a column vector whose
    unit dim is dropped from the result."""

    mnemonic: ClassVar[str] = "matmul"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.COMPUTE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        a, b = ins
        _check_dtypes(self, a, b)
        expect(
            a.rank >= 1 and b.rank >= 1, self, f"needs rank >= 1 inputs, got lhs {a} and rhs {b}"
        )
        ad = a.dims if a.rank >= 2 else (1, *a.dims)
        bd = b.dims if b.rank >= 2 else (*b.dims, 1)
        expect(
            ad[-1] == bd[-2],
            self,
            f"contracted dims differ: lhs {a} has K={ad[-1]} (its last dim) but rhs {b} "
            f"has K={bd[-2]} (its {'only' if b.rank == 1 else 'second-to-last'} dim)",
        )
        try:
            batch = broadcast_dims(ad[:-2], bd[:-2])
        except ShapeError as e:  # name both operands, not just their batch dims
            raise ShapeError(
                f"matmul: batch dims of lhs {a} and rhs {b} do not broadcast ({e})"
            ) from None
        out: tuple[Dim, ...] = batch
        if a.rank >= 2:
            out = (*out, ad[-2])
        if b.rank >= 2:
            out = (*out, bd[-1])
        return Shape(out, a.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        a, b = (accumulate(x) for x in xs)
        return np.matmul(a, b).astype(ctx.out_dtype)


def _norm_axes(op: Op, axes: Sequence[int], rank: int, what: str) -> tuple[int, ...]:
    out = []
    for a in axes:
        expect(
            isinstance(a, int) and -rank <= a < rank,
            op,
            f"{what} axis {a} is out of range for a rank-{rank} operand",
        )
        out.append(a % rank)
    expect(len(set(out)) == len(out), op, f"{what} axes {tuple(axes)} repeat an axis")
    return tuple(out)


@register
class DotGeneral(Op):
    """``lax.dot_general``: contract ``lhs_contract`` with ``rhs_contract`` pairwise,
    treat ``lhs_batch``/``rhs_batch`` pairs as batch dims. Output dims, in JAX order:
    batch dims, then lhs free dims, then rhs free dims (each in their original order).
    Batch dims must be equal (no broadcasting), like JAX."""

    mnemonic: ClassVar[str] = "dot_general"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]
    lhs_batch: tuple[int, ...] = ()
    rhs_batch: tuple[int, ...] = ()

    def _axes(self, ra: int, rb_: int) -> tuple[tuple[int, ...], ...]:
        """Normalised (lhs contract, rhs contract, lhs batch, rhs batch, lhs free, rhs free)."""
        lc = _norm_axes(self, self.lhs_contract, ra, "lhs contracting")
        rc = _norm_axes(self, self.rhs_contract, rb_, "rhs contracting")
        lb = _norm_axes(self, self.lhs_batch, ra, "lhs batch")
        rb = _norm_axes(self, self.rhs_batch, rb_, "rhs batch")
        expect(
            len(lc) == len(rc),
            self,
            f"lhs has {len(lc)} contracting axes {lc} but rhs has {len(rc)} {rc}",
        )
        expect(
            len(lb) == len(rb),
            self,
            f"lhs has {len(lb)} batch axes {lb} but rhs has {len(rb)} {rb}",
        )
        expect(
            not set(lc) & set(lb),
            self,
            f"lhs axes {sorted(set(lc) & set(lb))} are both batch and contracting",
        )
        expect(
            not set(rc) & set(rb),
            self,
            f"rhs axes {sorted(set(rc) & set(rb))} are both batch and contracting",
        )
        lf = tuple(i for i in range(ra) if i not in lc and i not in lb)
        rf = tuple(i for i in range(rb_) if i not in rc and i not in rb)
        return lc, rc, lb, rb, lf, rf

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        a, b = ins
        _check_dtypes(self, a, b)
        lc, rc, lb, rb, lf, rf = self._axes(a.rank, b.rank)
        for i, j in zip(lc, rc, strict=True):
            expect(
                a.dims[i] == b.dims[j],
                self,
                f"contracting dims differ: lhs {a} axis {i} is {a.dims[i]}, rhs {b} axis {j} is {b.dims[j]}",
            )
        for i, j in zip(lb, rb, strict=True):
            expect(
                a.dims[i] == b.dims[j],
                self,
                f"batch dims differ: lhs {a} axis {i} is {a.dims[i]}, rhs {b} axis {j} is {b.dims[j]}",
            )
        dims = [a.dims[i] for i in lb] + [a.dims[i] for i in lf] + [b.dims[j] for j in rf]
        return Shape(dims, a.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        a, b = (accumulate(x) for x in xs)
        lc, rc, lb, rb, lf, rf = self._axes(a.ndim, b.ndim)
        # [batch, free, contract] @ [batch, contract, free] as one batched matmul
        nb = math.prod(a.shape[i] for i in lb)
        m = math.prod(a.shape[i] for i in lf)
        k = math.prod(a.shape[i] for i in lc)
        n = math.prod(b.shape[j] for j in rf)
        at = np.transpose(a, lb + lf + lc).reshape(nb, m, k)
        bt = np.transpose(b, rb + rc + rf).reshape(nb, k, n)
        return np.matmul(at, bt).reshape(ctx.out_dims).astype(ctx.out_dtype)


# ---- builder conveniences ---------------------------------------------------------


@graph_method
def matmul(g: Graph, a: NodeId, b: NodeId) -> NodeId:
    """``a @ b`` with ``np.matmul`` semantics (batched, broadcast); equal dtypes."""
    return g.apply(MatMul(), [a, b])


@graph_method
def dot_general(
    g: Graph,
    a: NodeId,
    b: NodeId,
    contract: tuple[Sequence[int], Sequence[int]],
    batch: tuple[Sequence[int], Sequence[int]] = ((), ()),
) -> NodeId:
    """``lax.dot_general(a, b, (contract, batch))``; negative axes are normalised."""
    ra, rb = g.node(a).shape.rank, g.node(b).shape.rank

    def norm(axes: Sequence[int], rank: int) -> tuple[int, ...]:
        return tuple(int(x) % rank if -rank <= int(x) < rank else int(x) for x in axes)

    op = DotGeneral(
        norm(contract[0], ra), norm(contract[1], rb), norm(batch[0], ra), norm(batch[1], rb)
    )
    return g.apply(op, [a, b])


@graph_method
def linear(g: Graph, x: NodeId, w: NodeId, b: NodeId | None = None) -> NodeId:
    """``x @ w (+ b)`` with ``w`` stored [in, out] and ``b`` [out]; x is [..., in]."""
    ws = g.node(w).shape
    if ws.rank != 2:
        raise ShapeError(f"linear: weight %{w} must be [in, out], got {ws}", loc=source.capture())
    if b is not None and g.node(b).shape.dims != (ws.dims[1],):
        raise ShapeError(
            f"linear: bias %{b} must be [{ws.dims[1]}] for weight {ws}, got {g.node(b).shape}",
            loc=source.capture(),
        )
    y = g.apply(MatMul(), [x, w])
    if b is None:
        return y
    return g.apply(Binary(BinaryKind.ADD), [y, b])
