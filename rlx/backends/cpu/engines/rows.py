"""Native row-wise kernels, the first attempt of Softmax / LogSoftmax (last axis),
LayerNorm, RmsNorm (``kernels/reduce.py``, ``kernels/norm.py``), FusedResidualLN,
FusedResidualRmsNorm, FusedMatMulBiasAct and FusedSwiGLU (``kernels/fused.py``) and of
the attention kernel's softmax. In: row operands (arena views or scratch) and the kernel
context. Out: closures calling one generated C function each (``codegen.rows``), built and
loaded like the elementwise regions (``engines.region.load_function``: cached by content,
libmvec SIMD math) with their pointers bound at schedule-build time.

* softmax / log-softmax / norms: one C call walks each row two or three times (max,
  sum of exp, write; or sum, sum of squares, write) in f32 registers (f64 for f64),
  vectorised, rows split over an OpenMP team of ``KernelCtx.num_threads`` when the work
  estimate reaches ``engines.region.PARALLEL_MIN_WORK`` (same rule as the regions).
  f16/bf16 load into f32 and round once into the output, as their references do.
* FusedMatMulBiasAct: f32 on rlx's packed sgemm (``engines.sgemm``) with the bias and
  activation applied as each output tile is finished, when it beat BLAS on the shape
  class; otherwise the BLAS matmul into ``out``, then ONE native pass adding the bias
  and applying the activation in place (f32/f64). bf16/f16 nodes take
  the low-precision native GEMM of ``engines.lowp_gemm`` (``lowp_fused_matmul``), which rounds
  where the reference rounds.
* FusedSwiGLU: the two BLAS matmuls, then one native pass ``out = silu(gate) * up``
  (f32/f64; bf16/f16 keep the NumPy kernel, which rounds the gate as the reference).

Each native factory comes before the NumPy factory of its op in the op's attempts and
returns None, with a note saying why, when native kernels are off
(``CompileOptions.native=False``), gcc is missing or the build fails, or the layout is not
one it handles (softmax over another axis, non-contiguous views, broadcast residuals,
integer dtypes): the NumPy factory runs and the report's kind is its.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.backends.cpu.codegen.elementwise import C_TYPES, CodegenUnsupported
from rlx.backends.cpu.codegen.rows import RowKind, RowSpec, render_rows
from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelFactory, KernelKind
from rlx.backends.cpu.engines.region import (
    CALL_WEIGHT,
    PARALLEL_MIN_WORK,
    bind,
    load_function,
)
from rlx.dtype import DType, is_bf16
from rlx.errors import CompileError

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "row_function",
    "row_kernel",
    "Decline",
    "ctype_of",
    "rows_of",
    "column",
    "native_or_none",
    "softmax_factory",
    "norm_factory",
]

_ROW_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.float16))  # and bf16


class Decline(Exception):
    """This node's layout or dtype has no native row kernel (the message says why)."""


@functools.cache
def row_function(spec: RowSpec) -> Any:
    """Build (cached on disk by content) and load the C function of ``spec``; the ctypes
    function with its argtypes set. CompileError without gcc or when the build fails."""
    return load_function(render_rows(spec))


def row_kernel(
    spec: RowSpec,
    rows: list[np.ndarray],
    cols: list[np.ndarray],
    eps: float,
    ctx: KernelCtx,
    *,
    scale: float = 1.0,
) -> Kernel:
    """Bind ``spec``'s function: ``rows`` are the row operands (C-contiguous, all of the
    first one's dims, the output last), ``cols`` the per-column operands (gamma, beta,
    bias: ``n`` contiguous elements), in the function's operand order (row inputs,
    columns, output). ``eps``/``scale`` are the run-time constants ``c[0]``/``c[1]``.
    Chooses the thread count and notes it in ``ctx``."""
    n = rows[0].shape[-1] if rows[0].ndim else 1
    nrows = rows[0].size // n
    fn = row_function(spec)
    meta = np.array([nrows, n], dtype=np.int64)
    consts = np.array([eps, scale], dtype=np.float64)
    work = rows[0].size * (1 + CALL_WEIGHT * spec.calls_per_element)
    threads = ctx.num_threads if work >= PARALLEL_MIN_WORK and nrows > 1 else 1
    *row_ins, out = rows
    team = f", OpenMP x{threads}" if threads > 1 else ""
    ctx.notes.append(f"native: {spec.kind.value} over {nrows} rows of {n}{team}")
    if spec.kind is RowKind.BIAS_ACT:  # the output (in place) comes first
        return bind(fn, [meta, out, *cols, consts], threads)
    return bind(fn, [meta, *row_ins, *cols, out, consts], threads)


def ctype_of(out: np.ndarray, ins: list[np.ndarray]) -> Any:
    """The C type of ``out``'s dtype when every operand has it (Decline otherwise)."""
    dt = out.dtype
    if dt not in _ROW_DTYPES and not is_bf16(dt):
        raise Decline(f"dtype {dt} has no native row kernel")
    bad = [x.dtype for x in ins if x.dtype != dt]
    if bad:
        raise Decline(f"mixed dtypes {bad[0]} and {dt}")
    return C_TYPES[DType.from_numpy(dt)]


def rows_of(out: np.ndarray, xs: list[np.ndarray], what: str) -> None:
    """Decline unless ``xs`` and ``out`` are non-empty C-contiguous rows of one shape."""
    if out.ndim == 0 or out.size == 0:
        raise Decline(f"{what}: output dims {out.shape} (empty or scalar)")
    for x in [*xs, out]:
        if x.shape != out.shape or not x.flags.c_contiguous:
            raise Decline(f"{what}: operand {x.shape} is not C-contiguous of dims {out.shape}")


def column(a: np.ndarray, n: int, what: str) -> np.ndarray:
    """``a`` as ``n`` contiguous per-column values (Decline otherwise)."""
    if a.size != n or (a.ndim and a.shape[-1] != n) or not a.flags.c_contiguous:
        raise Decline(f"{what} has dims {a.shape}, not {n} contiguous elements")
    return a.reshape(n)


def native_or_none(build: Callable[[], Kernel], ctx: KernelCtx) -> Kernel | None:
    """``build()`` as the node's native kernel, or None with a note saying why (the op's
    next attempt, its NumPy kernel, then runs)."""
    why = "native kernels disabled (CompileOptions.native)"
    if ctx.native:
        try:
            fn = build()
        except Decline as e:
            why = str(e)
        except CodegenUnsupported as e:
            why = f"no C rendering: {e}"
        except CompileError as e:
            why = f"native build failed: {e.bare_message.splitlines()[0]}"
        else:
            ctx.kind = KernelKind.NATIVE
            return fn
    ctx.notes.append(f"NumPy kernel ({why})")
    return None


# ---- softmax -------------------------------------------------------------------------------


def softmax_factory(kind: RowKind) -> KernelFactory:
    """The native attempt of a softmax / log-softmax node over its last axis."""

    def factory(
        node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
    ) -> Kernel | None:
        def build() -> Kernel:
            x = ins[0]
            axis = node.op.axis  # type: ignore[attr-defined]
            if x.ndim == 0 or axis % x.ndim != x.ndim - 1:
                raise Decline(f"axis {axis} of a rank-{x.ndim} input is not the last")
            t = ctype_of(out, ins)
            rows_of(out, [x], kind.value)
            return row_kernel(RowSpec(kind, t), [x, out], [], 0.0, ctx)

        return native_or_none(build, ctx)

    factory.__name__ = factory.__qualname__ = f"native_{kind.value}_kernel"
    factory.__doc__ = f"Native {kind.value} over the last axis (None: the NumPy kernel runs)."
    return factory


# ---- norms ---------------------------------------------------------------------------------


def norm_factory(kind: RowKind, residual: bool) -> KernelFactory:
    """The native attempt of a layer / RMS norm node (``residual``: of its fused
    ``x + residual`` form) over the last axis."""

    def factory(
        node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
    ) -> Kernel | None:
        def build() -> Kernel:
            nrow = 2 if residual else 1
            xs, cols = ins[:nrow], ins[nrow:]
            t = ctype_of(out, ins)
            rows_of(out, xs, kind.value)
            n = out.shape[-1]
            names = ("gamma", "beta")
            cs = [column(c, n, f"{names[i]} of %{node.id}") for i, c in enumerate(cols)]
            spec = RowSpec(kind, t, residual=residual, beta=len(cols) == 2)
            return row_kernel(spec, [*xs, out], cs, node.op.eps, ctx)  # type: ignore[attr-defined]

        return native_or_none(build, ctx)

    label = ("residual_" if residual else "") + kind.value
    factory.__name__ = factory.__qualname__ = f"native_{label}_kernel"
    factory.__doc__ = f"Native {label} over the last axis (None: the NumPy kernel runs)."
    return factory
