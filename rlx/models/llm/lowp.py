"""Products with 16-bit float weights kept packed. In: f32 activations ``x [..., K]`` and
a bf16 or f16 weight ``w [N, K]`` (rows = output channels, as a checkpoint stores it,
typically a read-only view of a memory-mapped file). Out: f32 ``x @ w.T``, the products
and sums in f32 of the exactly widened weights (what transformers computes at f32 on the
same weights).

rlx's own bf16 GEMM rounds the activations to bf16 and packs (copies) the weight once
per param; its weight-only ``dequant_matmul`` has no 16-bit float scheme. So the decoder
uses the custom op ``llm_half_linear`` defined here: the weight is widened a panel of
rows at a time (about :data:`PANEL_BYTES` of f32, rlx's native vectorised cast when it
builds, else NumPy) and multiplied by BLAS, so no f32 copy of a whole weight ever exists
and the checkpoint's bytes are read where they lie.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ops.base import RefCtx
from rlx.ops.custom import custom_op_names, register_custom_op
from rlx.shape import Shape

__all__ = ["HALF_LINEAR", "HALF_DTYPES", "PANEL_BYTES", "half_linear"]

#: the custom op's name (``g.custom(HALF_LINEAR, [x, w])``)
HALF_LINEAR = "llm_half_linear"
#: weight dtypes the op takes
HALF_DTYPES = (DType.BF16, DType.F16)
#: f32 bytes of one widened panel of weight rows
PANEL_BYTES = 1 << 21


def _infer(ins: tuple[Shape, ...], attrs: Mapping[str, Any]) -> Shape:
    x, w = ins
    if x.dtype is not DType.F32 or w.dtype not in HALF_DTYPES or w.rank != 2 or x.rank < 1:
        raise ShapeError(
            f"{HALF_LINEAR}: needs f32 x [..., K] and a bf16 / f16 weight [N, K], given {x} and {w}"
        )
    if x.dims[-1] != w.dims[1]:
        raise ShapeError(f"{HALF_LINEAR}: x has K = {x.dims[-1]}, the weight {w.dims[1]}")
    return Shape((*x.dims[:-1], w.dims[0]), DType.F32)


def _widener() -> Any:
    """``widen(src, dst)``: 16-bit floats into f32 (native when rlx's library builds)."""
    try:
        from rlx.backends.cpu.engines.lowp_lib import lowp_lib

        lib = lowp_lib()
    except Exception:  # no gcc or a failed build: NumPy
        lib = None

    def widen(src: np.ndarray, dst: np.ndarray) -> None:
        if lib is not None and src.flags.c_contiguous:
            lib.cast(src, dst)
        else:
            np.copyto(dst, src, casting="unsafe")

    return widen


_WIDEN: list[Any] = []


def half_linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """f32 ``x @ w.T`` for bf16 / f16 ``w [N, K]`` (module docstring), panel by panel."""
    if not _WIDEN:
        _WIDEN.append(_widener())
    widen = _WIDEN[0]
    n, k = w.shape
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, k)
    out = np.empty((x2.shape[0], n), np.float32)
    rows = max(1, min(n, PANEL_BYTES // (4 * max(k, 1))))
    panel = np.empty((rows, k), np.float32)
    for s in range(0, n, rows):
        e = min(n, s + rows)
        p = panel[: e - s]
        widen(w[s:e], p)
        out[:, s:e] = x2 @ p.T
    return out.reshape(*x.shape[:-1], n)


def _reference(xs: Sequence[np.ndarray], attrs: Mapping[str, Any], ctx: RefCtx) -> np.ndarray:
    return half_linear(xs[0], xs[1])


if HALF_LINEAR not in custom_op_names():
    register_custom_op(HALF_LINEAR, _infer, _reference, arity=2)
