"""Products with 16-bit float weights kept packed. In: f32 activations ``x [..., K]`` and
a bf16 or f16 weight ``w [N, K]`` (rows = output channels, as a checkpoint stores it,
typically a read-only view of a memory-mapped file). Out: f32 ``x @ w.T``, the products
and sums in f32 of the exactly widened weights (what transformers computes at f32 on the
same weights).

rlx's own bf16 GEMM rounds the activations to bf16 and packs (copies) the weight once
per param; its weight-only ``dequant_matmul`` has no 16-bit float scheme. So the decoder
uses the custom op ``llm_half_linear`` defined here. It runs the native kernel of
:mod:`rlx.backends.cpu.native.half_linear` (``csrc/half_linear.c``: each weight row read
from where it lies, widened in registers, rows split over OpenMP threads) when that
library builds; else the weight is widened a panel of rows at a time (about
:data:`PANEL_BYTES` of f32, NumPy) and multiplied by BLAS. Either way no f32 copy of a
whole weight ever exists and the checkpoint's bytes are read where they lie.

Threads: the op has no thread count of its own (a custom op's kernel is its reference);
it uses :func:`half_threads` (set around a run with :func:`use_threads`, as
:class:`~rlx.models.llm.model.LlmModel` does with its ``num_threads``), by default
rlx's default thread count (``RLX_NUM_THREADS``, else the physical cores; resolved
once per process).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ops.base import RefCtx
from rlx.ops.custom import custom_op_names, register_custom_op
from rlx.shape import Shape

__all__ = [
    "HALF_LINEAR",
    "HALF_DTYPES",
    "PANEL_BYTES",
    "half_linear",
    "half_threads",
    "use_threads",
]

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


_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar("half_threads", default=None)


_DEFAULT_THREADS: list[int] = []  # resolved once: resolve_threads reads /proc/cpuinfo


def half_threads() -> int:
    """Threads the op's native kernel splits a weight's rows over (module docstring)."""
    n = _THREADS.get()
    if n is None:
        if not _DEFAULT_THREADS:
            from rlx.backends.cpu.threads import resolve_threads

            _DEFAULT_THREADS.append(resolve_threads(None))
        n = _DEFAULT_THREADS[0]
    return n


@contextlib.contextmanager
def use_threads(n: int | None) -> Iterator[None]:
    """Within the block, the op's kernel uses ``n`` threads (None: the default)."""
    token = _THREADS.set(n)
    try:
        yield
    finally:
        _THREADS.reset(token)


_LIBS: dict[Any, Any] = {}  # a target -> its library (None: not built); "widen"


def _native() -> Any:
    """The native library for the selected target (``RLX_ISA``), or None when it cannot
    be built (no gcc, a failed build)."""
    try:
        from rlx.backends.cpu import native

        target = native.selected_target()
    except Exception:  # a bad RLX_ISA: the panel path
        return None
    if target not in _LIBS:
        try:
            from rlx.backends.cpu.native.half_linear import half_linear_lib

            _LIBS[target] = half_linear_lib()
        except Exception:  # no gcc or a failed build: the panel path
            _LIBS[target] = None
    return _LIBS[target]


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


def half_linear(x: np.ndarray, w: np.ndarray, native: bool = True) -> np.ndarray:
    """f32 ``x @ w.T`` for bf16 / f16 ``w [N, K]`` (module docstring): the native kernel
    (when ``native`` and it builds), else panel by panel."""
    n, k = w.shape
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, k)
    if native:
        lib = _native()
        if lib is not None and (w.shape[1] <= 1 or w.strides[1] == w.itemsize):
            out = lib.linear(x2, w, threads=half_threads())
            return out.reshape(*x.shape[:-1], n)
    if "widen" not in _LIBS:
        _LIBS["widen"] = _widener()
    widen = _LIBS["widen"]
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
