"""Graph builders for the linear-algebra ops of ``linalg.py``: ``g.matmul``,
``g.dot_general`` (negative axes normalised), ``g.linear`` (``x @ w + b``, emitted as a
matmul and an add), ``g.dense_solve`` (batched when ``A`` has batch dims),
``g.grouped_matmul`` and ``g.lora_matmul``.

In: node ids and Python arguments. Out: the id of the node built; a bad argument is a
ShapeError pointing at the user's line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlx import source
from rlx.errors import ShapeError
from rlx.ops.base import Op, graph_method
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.linalg import (
    BatchedDenseSolve,
    DenseSolve,
    DotGeneral,
    GroupedMatMul,
    LoraMatMul,
    MatMul,
)

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId


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


@graph_method
def dense_solve(g: Graph, a: NodeId, b: NodeId) -> NodeId:
    """``x`` with ``A x = b``: :class:`DenseSolve` for ``A [N, N]``,
    :class:`BatchedDenseSolve` for ``A [*batch, N, N]``."""
    op: Op = DenseSolve() if g.shape(a).rank == 2 else BatchedDenseSolve()
    return g.apply(op, [a, b])


@graph_method
def grouped_matmul(g: Graph, x: NodeId, weight: NodeId, expert_idx: NodeId) -> NodeId:
    """``out[i] = x[i] @ weight[expert_idx[i]]`` (see :class:`GroupedMatMul`)."""
    return g.apply(GroupedMatMul(), [x, weight, expert_idx])


@graph_method
def lora_matmul(g: Graph, x: NodeId, w: NodeId, a: NodeId, b: NodeId, scale: float = 1.0) -> NodeId:
    """``x @ w + scale * (x @ a) @ b`` (see :class:`LoraMatMul`)."""
    return g.apply(LoraMatMul(float(scale)), [x, w, a, b])
