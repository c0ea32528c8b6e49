"""Linear algebra ops: matmul (NumPy ``matmul`` semantics), dot_general (JAX order), the
seed's dense_solve / batched_dense_solve (LU solves), grouped_matmul (the MoE GEMM) and
lora_matmul (a linear layer with a LoRA adapter).

The operands of an op share one dtype (bool is rejected; the solves, grouped_matmul and
lora_matmul take floats only, grouped_matmul's expert ids are integers). Low-precision floats (f16, bf16, fp8)
are multiplied and accumulated in f32, then rounded once to the node's dtype; integer
inputs accumulate in i64 and wrap to the node's dtype, as NumPy's ``astype`` does.
Batch and row dims may be symbolic; contracted dims must match exactly (a symbol matches
only itself).

Derivatives: matmul's cotangents are dot_generals contracting the other operand's
transposed axes in place (no transposed copy; broadcast batch dims summed), the solves'
are solves with ``A^T`` (``dA = -db x^T``). The graph builders (``g.matmul``,
``g.linear``...) are in ``linalg_builders.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.errors import InputError, ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.grad_util import batch_size, front
from rlx.ops.rules import add_any, scalar, unbroadcast, zeros
from rlx.shape import Dim, Shape, broadcast_dims

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = [
    "MatMul",
    "DotGeneral",
    "DenseSolve",
    "BatchedDenseSolve",
    "GroupedMatMul",
    "LoraMatMul",
    "upcast",
    "accumulate",
]


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

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        a, b = node.inputs
        sa, sb = g.shape(a), g.shape(b)
        a2 = a if sa.rank >= 2 else g.reshape(a, [1, *sa.dims])
        b2 = b if sb.rank >= 2 else g.reshape(b, [*sb.dims, 1])
        nbat = node.shape.rank - (sa.rank >= 2) - (sb.rank >= 2)
        cdims = [*node.shape.dims[:nbat], g.shape(a2).dims[-2], g.shape(b2).dims[-1]]
        c2 = ct if list(node.shape.dims) == cdims else g.reshape(ct, cdims)
        da, db = _mm_lhs_grad(g, c2, b2, g.shape(a2)), _mm_rhs_grad(g, a2, c2, g.shape(b2))
        return (
            da if sa.rank >= 2 else g.reshape(da, list(sa.dims)),
            db if sb.rank >= 2 else g.reshape(db, list(sb.dims)),
        )

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        (a, b), (ta, tb) = node.inputs, tangents
        terms = [None if ta is None else g.matmul(ta, b), None if tb is None else g.matmul(a, tb)]
        return add_any(g, terms)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        n = batch_size(g, ins, bdims)
        ranks = [max(g.shape(x).rank - (d is not None), 2) for x, d in zip(ins, bdims)]
        obat = max(ranks) - 2
        xs = []
        for k, (x, d) in enumerate(zip(ins, bdims, strict=True)):
            if d is not None:  # [B, 1.., M, K]: the batch leads, unit dims align the rest
                x = front(g, x, d)
                dims = list(g.shape(x).dims[1:])
                dims = dims if len(dims) >= 2 else ([1, *dims] if k == 0 else [*dims, 1])
                x = g.reshape(x, [n, *(1,) * (obat + 2 - len(dims)), *dims])
            xs.append(x)
        out = g.matmul(xs[0], xs[1])
        return g.reshape(out, [n, *node.shape.dims]), 0


def _ones(dims: Sequence[Dim]) -> bool:
    return all(d == 1 for d in dims)


def _swap(g: Graph, x: NodeId) -> NodeId:
    """``x`` with its last two axes swapped."""
    r = g.shape(x).rank
    return g.transpose(x, [*range(r - 2), r - 1, r - 2])


def _mm_lhs_grad(g: Graph, ct: NodeId, b: NodeId, want: Shape) -> NodeId:
    """``ct @ b^T`` summed to ``want`` (the lhs of a >= 2-D matmul): a dot_general with
    the contraction on ``b``'s last axis, so no transposed copy of ``b`` is made."""
    nb = g.shape(ct).rank - 2
    ob, bb, ab = g.shape(ct).dims[:-2], g.shape(b).dims[:-2], want.dims[:-2]
    last = (nb + 1,)
    if _ones(bb):  # a weight rhs: [*ob, M, N] . [K, N] -> [*ob, M, K]
        bm = g.reshape(b, list(g.shape(b).dims[-2:])) if bb else b
        return unbroadcast(g, g.dot_general(ct, bm, (last, (1,))), want)
    batch = tuple(range(nb))
    if ab == bb == ob:
        return g.dot_general(ct, b, (last, last), (batch, batch))
    if _ones(ab) and bb == ob:  # a weight lhs: contract the batch too
        out = g.dot_general(ct, b, (batch + last, batch + last))
        return g.reshape(out, list(want.dims))
    return unbroadcast(g, g.matmul(ct, _swap(g, b)), want)


def _mm_rhs_grad(g: Graph, a: NodeId, ct: NodeId, want: Shape) -> NodeId:
    """``a^T @ ct`` summed to ``want`` (the rhs of a >= 2-D matmul), as a dot_general
    contracting ``a``'s row axis (and the batch axes when the rhs is one weight)."""
    nb = g.shape(ct).rank - 2
    ob, ab, bb = g.shape(ct).dims[:-2], g.shape(a).dims[:-2], want.dims[:-2]
    rows, batch = (nb,), tuple(range(nb))
    if ab == bb == ob:
        return g.dot_general(a, ct, (rows, rows), (batch, batch))
    if _ones(bb) and ab == ob:  # [*ob, M, K] . [*ob, M, N] -> [K, N]
        return g.reshape(g.dot_general(a, ct, (batch + rows, batch + rows)), list(want.dims))
    return unbroadcast(g, g.matmul(_swap(g, a), ct), want)


def _unpermute(g: Graph, x: NodeId, order: Sequence[int]) -> NodeId:
    """``x``, whose axis ``i`` is operand axis ``order[i]``, in the operand's axis order."""
    perm = [int(p) for p in np.argsort(order)]
    return x if perm == list(range(len(perm))) else g.transpose(x, perm)


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

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        a, b = node.inputs
        lc, rc, lb, rb, lf, rf = self._axes(g.shape(a).rank, g.shape(b).rank)
        cb = tuple(range(len(lb)))
        cl = tuple(range(len(lb), len(lb) + len(lf)))
        cr = tuple(range(len(lb) + len(lf), node.shape.rank))
        # [batch, lhs free, rhs contract (by rhs axis)] and [batch, lhs contract, rhs free]
        da = g.dot_general(ct, b, (cr, rf), (cb, rb))
        db = g.dot_general(a, ct, (lf, cl), (lb, cb))
        order_a = [*lb, *lf, *(lc[rc.index(j)] for j in sorted(rc))]
        order_b = [*rb, *(rc[lc.index(i)] for i in sorted(lc)), *rf]
        return (_unpermute(g, da, order_a), _unpermute(g, db, order_b))

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        (a, b), (ta, tb) = node.inputs, tangents
        terms = [None if ta is None else g.apply(self, [ta, b])]
        return add_any(g, [*terms, None if tb is None else g.apply(self, [a, tb])])

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        (a, b), (da, db) = ins, bdims
        ra, rb = g.shape(a).rank - (da is not None), g.shape(b).rank - (db is not None)
        lc, rc, lb, rb_, lf, _ = self._axes(ra, rb)
        a, b = front(g, a, da), front(g, b, db)
        up = lambda axes: tuple(x + 1 for x in axes)  # noqa: E731
        if da is not None and db is not None:  # the batch axes pair up as one more batch
            return g.apply(DotGeneral(up(lc), up(rc), (0, *up(lb)), (0, *up(rb_))), [a, b]), 0
        if da is not None:  # a free lhs axis, the first of them in the output
            return g.apply(DotGeneral(up(lc), rc, up(lb), rb_), [a, b]), len(lb)
        return g.apply(DotGeneral(lc, up(rc), lb, up(rb_)), [a, b]), len(lb) + len(lf)


def _float_pair(op: Op, a: Shape, b: Shape, an: str, bn: str) -> None:
    expect(a.dtype.is_float, op, f"{an} must be a float tensor, got {a}")
    expect(b.dtype is a.dtype, op, f"{bn} {b} must have {an}'s dtype {a.dtype}")


def _solve_wide(x: np.ndarray) -> np.ndarray:
    """f32 / f64 as is; f16, bf16, fp8 widened to f32 (LAPACK's types)."""
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def singular_error(where: str = "") -> InputError:
    """The error of a solve whose matrix is exactly singular (the node is named by the
    caller: the interpreter and the executor prefix ``%id op:``)."""
    return InputError(f"A{where} is singular (its LU factorization has a zero pivot): no solution")


def solve_one(a: np.ndarray, b: np.ndarray, where: str = "") -> np.ndarray:
    """``solve(a, b)`` for one [N, N] matrix and [N] or [N, K] right-hand side."""
    try:
        return np.linalg.solve(_solve_wide(a), _solve_wide(b))
    except np.linalg.LinAlgError:
        raise singular_error(where) from None


@register
class DenseSolve(Op):
    """``x = A^-1 b`` by LU factorization with partial pivoting (LAPACK ``gesv``).
    Inputs ``A [N, N]`` and ``b [N]`` or ``[N, K]`` (several right-hand sides), both of
    one float dtype; output ``x`` shaped like ``b``. f16/bf16 are solved in f32.

    An exactly singular ``A`` (a zero pivot) is an InputError at run time naming the node;
    a nearly singular one gives LAPACK's large or non-finite values, with no error."""

    mnemonic: ClassVar[str] = "dense_solve"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.COMPUTE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        a, b = ins
        _float_pair(self, a, b, "A", "b")
        expect(a.rank == 2 and a.dims[0] == a.dims[1], self, f"A must be square [N, N], got {a}")
        expect(
            b.rank in (1, 2) and b.dims[0] == a.dims[0],
            self,
            f"b must be [N] or [N, K] with N = {a.dims[0]} (A is {a}), got {b}",
        )
        return b

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return solve_one(xs[0], xs[1]).astype(ctx.out_dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return _solve_vjp(g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return _solve_jvp(g, node, tangents)


@register
class BatchedDenseSolve(Op):
    """One :class:`DenseSolve` per batch index: ``A [*batch, N, N]`` with ``b
    [*batch, N]`` (one right-hand side each) or ``[*batch, N, K]``; output shaped like
    ``b``. Batch dims (at least one) must be equal: no broadcasting. A singular ``A[i]``
    is an InputError naming the batch index ``i``."""

    mnemonic: ClassVar[str] = "batched_dense_solve"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.COMPUTE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        a, b = ins
        _float_pair(self, a, b, "A", "b")
        expect(
            a.rank >= 3 and a.dims[-1] == a.dims[-2],
            self,
            f"A must be [*batch, N, N] with at least one batch dim, got {a}",
        )
        batch, n = a.dims[:-2], a.dims[-1]
        vec = b.rank == a.rank - 1 and b.dims == (*batch, n)
        mat = b.rank == a.rank and b.dims[:-1] == (*batch, n)
        expect(
            vec or mat,
            self,
            f"b must be [*batch, N] or [*batch, N, K] with batch {list(batch)} and N = {n} "
            f"(A is {a}), got {b}",
        )
        return b

    def is_vector(self, a: np.ndarray, b: np.ndarray) -> bool:
        """True when ``b`` holds one right-hand side per batch index."""
        return b.ndim == a.ndim - 1

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        a, b = xs
        a2 = a.reshape(-1, *a.shape[-2:])
        b2 = b.reshape(a2.shape[0], a.shape[-1], -1)  # [batch, N, K]
        out = np.empty(b2.shape, ctx.out_dtype)
        for i in range(a2.shape[0]):
            where = "[" + ", ".join(str(int(j)) for j in np.unravel_index(i, a.shape[:-2])) + "]"
            out[i] = solve_one(a2[i], b2[i], where)
        return out.reshape(b.shape)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return _solve_vjp(g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return _solve_jvp(g, node, tangents)


@register
class GroupedMatMul(Op):
    """The MoE GEMM: ``out[i] = x[i] @ weight[expert_idx[i]]``. Inputs ``x [M, K]``,
    ``weight [E, K, N]`` (the stacked expert weights, x's float dtype) and ``expert_idx
    [M]`` (an integer expert id per token, in ``[0, E)``: another id is an InputError at
    run time). Output ``[M, N]``; f16/bf16 accumulate in f32."""

    mnemonic: ClassVar[str] = "grouped_matmul"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.COMPUTE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, w, idx = ins
        _float_pair(self, x, w, "x", "weight")
        expect(x.rank == 2, self, f"x must be [M, K], got {x}")
        expect(w.rank == 3, self, f"weight must be [E, K, N] (stacked experts), got {w}")
        expect(
            w.dims[1] == x.dims[1],
            self,
            f"contracted dims differ: x {x} has K={x.dims[1]}, weight {w} has K={w.dims[1]}",
        )
        expect(
            idx.dtype.is_int and idx.dims == (x.dims[0],),
            self,
            f"expert_idx must be an integer [M] = [{x.dims[0]}], got {idx}",
        )
        return Shape((x.dims[0], w.dims[2]), x.dtype)

    def check_ids(self, idx: np.ndarray, experts: int) -> None:
        """InputError unless every id lies in ``[0, experts)``."""
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= experts):
            bad = idx[(idx < 0) | (idx >= experts)]
            raise InputError(
                f"expert_idx holds {int(bad[0])}, outside [0, {experts}) "
                f"(weight has {experts} experts)"
            )

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, w, idx = upcast(xs[0]), upcast(xs[1]), xs[2]
        self.check_ids(idx, w.shape[0])
        out = np.zeros((x.shape[0], w.shape[2]), x.dtype)
        for e in np.unique(idx):
            rows = idx == e
            out[rows] = x[rows] @ w[e]
        return out.astype(ctx.out_dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        x, w, idx = node.inputs
        dx = g.apply(self, [ct, g.transpose(w, [0, 2, 1]), idx])
        (m, k), (e, n) = g.shape(x).dims, (g.shape(w).dims[0], node.shape.dims[1])
        if isinstance(e, int):  # dW[e] = (x masked to expert e)^T ct: one [E,M,K] x [M,N]
            ids = g.constant(np.arange(e, dtype=g.shape(idx).dtype.np).reshape(e, 1))
            mask = g.cast(g.eq(ids, g.reshape(idx, [1, m])), g.shape(x).dtype)
            xm = g.mul(g.reshape(mask, [e, m, 1]), x)
            return (dx, g.dot_general(xm, ct, ((1,), (0,))), None)
        outer = g.mul(g.reshape(x, [m, k, 1]), g.reshape(ct, [m, 1, n]))  # [M, K, N]
        return (dx, g.scatter_add(zeros(g, w), idx, outer, 0), None)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        (x, w, idx), (tx, tw, _) = node.inputs, tangents
        terms = [None if tx is None else g.apply(self, [tx, w, idx])]
        return add_any(g, [*terms, None if tw is None else g.apply(self, [x, tw, idx])])


@register
class LoraMatMul(Op):
    """``x @ w + scale * ((x @ a) @ b)``: a linear layer with a LoRA adapter of rank
    ``R``. Inputs ``x [..., K]``, ``w [K, N]``, ``a [K, R]``, ``b [R, N]``, one float
    dtype; output ``[..., N]``. ``scale`` is the adapter's ``alpha / R``; f16/bf16
    accumulate in f32."""

    mnemonic: ClassVar[str] = "lora_matmul"
    arity: ClassVar[int] = 4
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", float(self.scale))

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, w, a, b = ins
        for nm, s in (("w", w), ("a", a), ("b", b)):
            _float_pair(self, x, s, "x", nm)
            expect(s.rank == 2, self, f"{nm} must be 2-D, got {s}")
        expect(math.isfinite(self.scale), self, f"scale must be finite, got {self.scale}")
        expect(x.rank >= 1, self, f"x must be [..., K], got {x}")
        k = x.dims[-1]
        expect(w.dims[0] == k, self, f"w must be [K, N] with K = {k} (x is {x}), got {w}")
        expect(a.dims[0] == k, self, f"a must be [K, R] with K = {k} (x is {x}), got {a}")
        expect(
            b.dims == (a.dims[1], w.dims[1]),
            self,
            f"b must be [R, N] = [{a.dims[1]}, {w.dims[1]}] (a is {a}, w is {w}), got {b}",
        )
        return Shape((*x.dims[:-1], w.dims[1]), x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, w, a, b = (upcast(t) for t in xs)
        y = x @ w + x.dtype.type(self.scale) * ((x @ a) @ b)
        return y.astype(ctx.out_dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        x, w, a, b = node.inputs
        xd = g.shape(x).dims
        x2, c2 = g.reshape(x, [-1, xd[-1]]), g.reshape(ct, [-1, node.shape.dims[-1]])
        s = scalar(g, self.scale, x)
        u = g.mul(s, g.dot_general(c2, b, ((1,), (1,))))  # scale * ct @ b^T: [P, R]
        dx = g.add(g.dot_general(c2, w, ((1,), (1,))), g.dot_general(u, a, ((1,), (1,))))
        h = g.mul(s, g.matmul(x2, a))
        rows = ((0,), (0,))
        dw, da, db = (g.dot_general(p, q, rows) for p, q in ((x2, c2), (x2, u), (h, c2)))
        return (g.reshape(dx, list(xd)), dw, da, db)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        (x, w, a, b), (tx, tw, ta, tb) = node.inputs, tangents
        s = scalar(g, self.scale, x)
        terms = [None if tx is None else g.apply(self, [tx, w, a, b])]
        terms.append(None if tw is None else g.matmul(x, tw))
        terms.append(None if ta is None else g.mul(s, g.matmul(g.matmul(x, ta), b)))
        terms.append(None if tb is None else g.mul(s, g.matmul(g.matmul(x, a), tb)))
        return add_any(g, terms)


def _solve_vjp(g: Graph, node: Node, ct: NodeId) -> tuple[NodeId, NodeId]:
    """``A x = b``: ``db = solve(A^T, ct)``, ``dA = -db x^T`` (batched, one or K rhs)."""
    a, _ = node.inputs
    db = g.dense_solve(_swap(g, a), ct)
    x, r = node.id, g.shape(a).rank
    if node.shape.rank == r - 1:  # one right-hand side: an outer product
        outer = g.mul(g.unsqueeze(db, -1), g.unsqueeze(x, -2))
    else:
        outer = g.matmul(db, _swap(g, x))
    return (g.neg(outer), db)


def _solve_jvp(g: Graph, node: Node, tangents: tuple) -> NodeId | None:
    """``dx = solve(A, db - dA x)``."""
    (a, _), (ta, tb) = node.inputs, tangents
    x, r = node.id, None
    if ta is not None:
        if node.shape.rank == g.shape(a).rank:
            r = g.neg(g.matmul(ta, x))
        else:  # one right-hand side per matrix
            r = g.neg(g.squeeze(g.matmul(ta, g.unsqueeze(x, -1)), -1))
    rhs = add_any(g, [tb, r])
    return None if rhs is None else g.dense_solve(a, rhs)


# the graph builders (g.matmul, g.linear, g.dense_solve...) register with their module
from rlx.ops import linalg_builders as _builders  # noqa: E402,F401
