"""Mixture-of-experts ops on GGUF-packed expert stacks: dequant_grouped_matmul (the seed's
``DequantGroupedMatMul``) and dequant_moe_weights (``DequantMoEWeights``).

An expert stack is the U8 tensor ``packed [E, N, K/qk * block_bytes]``: expert ``e``'s
weight ``[N, K]`` (rows = output channels) packed in a GGUF block scheme exactly as
:class:`~rlx.ops.quant.DequantMatMul` reads one weight (``packed[e]`` is such a
weight), the expert axis outermost as in a GGUF ``ffn_*_exps`` tensor. Scales live
inside the packed bytes.

* ``dequant_grouped_matmul(x [M, K], packed, expert_idx [M]) -> [M, N]``:
  ``out[i] = x[i] @ dequant(packed[expert_idx[i]]).T``. Only the experts some token
  picked are decoded (the CPU kernel streams just their bytes through the native
  dequant GEMM); the MoE block (:mod:`rlx.ops.compose.moe`) routes with it.
* ``dequant_moe_weights(packed) -> [E, K, N]``: the whole stack decoded to f32 in
  :class:`~rlx.ops.linalg.GroupedMatMul`'s layout (``w[e] = dequant(packed[e]).T``),
  for a ``grouped_matmul`` or a graph that needs the float experts.

Both are inference-only: packed bytes have no gradient (``nondiff``); train a float
copy of the experts (``grouped_matmul`` has every derivative rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.formats.schemes import QuantScheme, dequantize_weight
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["DequantGroupedMatMul", "DequantMoEWeights", "stack_k", "decode_experts"]

_NONDIFF = "packed GGUF expert bytes: inference only (train float experts with grouped_matmul)"


def _check_stack(op: Op, w: Shape) -> int:
    """The K of a packed expert stack ``w`` [E, N, K/qk * bb] (ShapeError otherwise)."""
    s: QuantScheme = op.scheme  # type: ignore[attr-defined]
    expect(s.is_gguf, op, f"needs a GGUF block scheme, got {s}")
    expect(
        w.dtype is DType.U8 and w.rank == 3 and w.is_static,
        op,
        f"packed experts must be a static u8 [E, N, K/{s.block_size} * "
        f"{type(s).block_bytes}] stack, got {w}",  # type: ignore[attr-defined]
    )
    return stack_k(s, int(w.dims[2]), op)  # type: ignore[arg-type]


def stack_k(scheme: QuantScheme, row_bytes: int, op: Op | str = "moe") -> int:
    """K of a packed row of ``row_bytes`` bytes in ``scheme``."""
    bb = type(scheme).block_bytes  # type: ignore[attr-defined]
    expect(
        row_bytes > 0 and row_bytes % bb == 0,
        op,
        f"{scheme} rows are whole {bb}-byte blocks, got {row_bytes} bytes per row",
    )
    return row_bytes // bb * scheme.block_size


def decode_experts(scheme: QuantScheme, packed: np.ndarray, experts: Sequence[int]) -> np.ndarray:
    """f32 ``[len(experts), N, K]``: the listed experts of ``packed`` decoded."""
    return np.stack([dequantize_weight(scheme, packed[e]) for e in experts]).astype(np.float32)


@register
class DequantGroupedMatMul(Op):
    """The MoE GEMM on a GGUF-packed expert stack: ``out[i] = x[i] @
    dequant(packed[expert_idx[i]]).T``. Inputs ``x [M, K]`` (float), ``packed [E, N,
    K/qk * block_bytes]`` (u8, ``scheme``) and ``expert_idx [M]`` (integer ids in ``[0,
    E)``; another id is an InputError at run time). Output f32 ``[M, N]``. Only the
    selected experts are decoded."""

    mnemonic: ClassVar[str] = "dequant_grouped_matmul"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    nondiff: ClassVar[str] = _NONDIFF
    scheme: QuantScheme

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, w, idx = ins
        expect(x.dtype.is_float and x.rank == 2, self, f"x must be a float [M, K], got {x}")
        k = _check_stack(self, w)
        expect(
            x.dims[1] == k,
            self,
            f"x {x} has K={x.dims[1]}, the packed experts {w} hold K={k} ({self.scheme})",
        )
        expect(
            idx.dtype.is_int and idx.rank == 1 and idx.dims[0] == x.dims[0],
            self,
            f"expert_idx must be an integer [M] = [{x.dims[0]}], got {idx}",
        )
        return Shape((x.dims[0], w.dims[1]), DType.F32)

    def check_ids(self, idx: np.ndarray, experts: int) -> None:
        """InputError unless every id lies in ``[0, experts)``."""
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= experts):
            bad = idx[(idx < 0) | (idx >= experts)]
            raise InputError(
                f"dequant_grouped_matmul: expert_idx holds {int(bad[0])}, outside "
                f"[0, {experts}) (the packed stack has {experts} experts)"
            )

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, w, idx = xs[0].astype(np.float32), xs[1], np.asarray(xs[2])
        self.check_ids(idx, w.shape[0])
        out = np.zeros((x.shape[0], w.shape[1]), np.float32)
        used = [int(e) for e in np.unique(idx)]
        for e, we in zip(used, decode_experts(self.scheme, w, used), strict=True):
            rows = idx == e
            out[rows] = x[rows] @ we.T
        return out


@register
class DequantMoEWeights(Op):
    """A GGUF-packed expert stack ``packed [E, N, K/qk * block_bytes]`` (u8, ``scheme``)
    decoded to f32 ``[E, K, N]``, :class:`~rlx.ops.linalg.GroupedMatMul`'s layout:
    ``out[e] = dequant(packed[e]).T``."""

    mnemonic: ClassVar[str] = "dequant_moe_weights"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    nondiff: ClassVar[str] = _NONDIFF
    scheme: QuantScheme

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (w,) = ins
        k = _check_stack(self, w)
        return Shape((w.dims[0], k, w.dims[1]), DType.F32)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        w = xs[0]
        dec = decode_experts(self.scheme, w, range(w.shape[0]))
        return np.ascontiguousarray(dec.transpose(0, 2, 1))


@graph_method
def dequant_grouped_matmul(
    g: Graph, x: NodeId, scheme: QuantScheme, packed: NodeId, expert_idx: NodeId
) -> NodeId:
    """``out[i] = x[i] @ dequant(packed[expert_idx[i]]).T`` (see :class:`DequantGroupedMatMul`)."""
    return g.apply(DequantGroupedMatMul(scheme), [x, packed, expert_idx])


@graph_method
def dequant_moe_weights(g: Graph, scheme: QuantScheme, packed: NodeId) -> NodeId:
    """The packed expert stack decoded to f32 ``[E, K, N]`` (see :class:`DequantMoEWeights`)."""
    return g.apply(DequantMoEWeights(scheme), [packed])
