"""CPU kernels of the reduction family's backward ops. In: SoftmaxBackward /
LogSoftmaxBackward nodes (inputs ``dy``, ``y``) with their arena views. Out: closures
writing ``dx`` into the output view.

* Native (last axis, C-contiguous, f32 / f64 / f16 / bf16): one generated C function
  per op and dtype walks each row twice: the row sum (``sum(dy * y)`` or ``sum(dy)``,
  accumulated in the register type over SIMD lanes), then the write
  (``y * (dy - s)`` / ``dy - exp(y) * s``, exp the prelude's ``rlx_expneg``, libmvec's
  SIMD exp). Built by ``native.build`` for the selected target (``RLX_ISA``:
  AVX-512 / AVX2 / portable: gcc vectorises the same text for each) and cached by
  content, like the row kernels of ``engines.rows``; rows are shared by an OpenMP team
  of ``KernelCtx.num_threads`` above ``engines.region.PARALLEL_MIN_WORK``.
* NumPy otherwise (another axis, native kernels off, no gcc, fp8): ufuncs writing into
  one scratch row vector and one scratch tensor, then ``out``; no allocation per run
  (16-bit and fp8 floats computed in f32 scratch and rounded once, ``lowp``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.backends.cpu.codegen.elementwise import (
    C_TYPES,
    NAME_PLACEHOLDER,
    CFunction,
    CodegenUnsupported,
    CType,
    content_symbol,
)
from rlx.backends.cpu.codegen.loop import team_loop
from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind, lowp
from rlx.backends.cpu.engines.region import CALL_WEIGHT, PARALLEL_MIN_WORK, bind, load_function
from rlx.backends.cpu.engines.rows import native_or_none
from rlx.backends.cpu.native.cpu import Target, selected_target
from rlx.dtype import DType
from rlx.ops.reduce_grad import LogSoftmaxBackward, SoftmaxBackward

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["render_backward_rows", "native_backward_kernel", "numpy_backward_kernel"]

_NATIVE_DTYPES = frozenset({DType.F32, DType.F64, DType.F16, DType.BF16})


def render_backward_rows(log: bool, t: CType) -> CFunction:
    """``void f(const long* m, const S* dy, const S* y, S* out, const double* c, long
    nthreads)`` over ``m = [rows, n]`` C-contiguous rows: softmax's (``log`` False) or
    log-softmax's backward. ``out`` may not alias ``dy`` / ``y`` (the op is not
    elementwise, so the planner never gives it an input's slot)."""
    v, s = t.value, t.storage
    ld = t.load.format
    sfx = "f" if v == "float" else ""
    if log:
        acc, write = ld("dyr[j]"), f"{ld('dyr[j]')} - rlx_expneg{sfx}({ld('yr[j]')}) * acc"
    else:
        acc, write = f"{ld('dyr[j]')} * {ld('yr[j]')}", f"{ld('yr[j]')} * ({ld('dyr[j]')} - acc)"
    name = NAME_PLACEHOLDER
    params = (
        f"const long* restrict m, const {s}* restrict dy, const {s}* restrict y, "
        f"{s}* restrict out, const double* restrict c"
    )
    lines = [
        f"static void {name}_rows(long r0, long r1, {params}) {{",
        "    const long n = m[1];",
        "    (void)c;",
        "    for (long r = r0; r < r1; ++r) {",
        f"        const {s}* dyr = dy + r * n;",
        f"        const {s}* yr = y + r * n;",
        f"        {s}* outr = out + r * n;",
        f"        {v} acc = 0;",
        "        #pragma omp simd reduction(+:acc) simdlen(64)",
        f"        for (long j = 0; j < n; ++j) acc += {acc};",
        "        #pragma omp simd",
        f"        for (long j = 0; j < n; ++j) outr[j] = {t.store.format(f'({write})')};",
        "    }",
        "}",
        "",
        f"void {name}({params}, long nthreads) {{",
        "    const long rows = m[0];",
        "#ifdef _OPENMP",
        *team_loop(f"{name}_rows", "m, dy, y, out, c"),
        "#endif",
        "    (void)nthreads;",
        f"    {name}_rows(0, rows, m, dy, y, out, c);",
        "}",
    ]
    text = "\n".join(lines) + "\n"
    prefix = f"rlx_rows_{'log_' if log else ''}softmax_backward_{s.strip('_').lower()}"
    symbol = content_symbol(prefix, text)
    return CFunction(symbol, text.replace(NAME_PLACEHOLDER, symbol), 5, 4, int(log))


@functools.cache
def _function(log: bool, dtype: DType, target: Target) -> tuple[Any, CFunction]:
    """The loaded function for ``target`` (the key: RLX_ISA may change in a process)."""
    fn = render_backward_rows(log, C_TYPES[dtype])
    return load_function(fn), fn


def _native(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """The native kernel; CodegenUnsupported when the layout or dtype has none."""
    dy, y = ins
    dt = DType.from_numpy(out.dtype)
    if dt not in _NATIVE_DTYPES:
        raise CodegenUnsupported(f"dtype {out.dtype} has no native row kernel")
    if out.ndim == 0 or out.size == 0 or node.op.axis % out.ndim != out.ndim - 1:  # type: ignore[attr-defined]
        raise CodegenUnsupported(f"axis {node.op.axis} of {out.shape} is not the last")  # type: ignore[attr-defined]
    for a in (dy, y, out):
        if a.dtype != out.dtype or not a.flags.c_contiguous:
            raise CodegenUnsupported(f"operand {a.dtype}{a.shape} is not C-contiguous")
    log = isinstance(node.op, LogSoftmaxBackward)
    cfn, fn = _function(log, dt, selected_target())
    n = out.shape[-1]
    meta = np.array([out.size // n, n], dtype=np.int64)
    work = out.size * (1 + CALL_WEIGHT * fn.calls)
    threads = ctx.num_threads if work >= PARALLEL_MIN_WORK and meta[0] > 1 else 1
    team = f", OpenMP x{threads}" if threads > 1 else ""
    ctx.notes.append(f"native: {node.op.mnemonic} over {meta[0]} rows of {n}{team}")
    return bind(cfn, [meta, dy, y, out, np.zeros(1)], threads)


@lowp
def numpy_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Ufuncs into scratch (a row vector and one full tensor), the last one into ``out``."""
    dy, y = ins
    if out.size == 0:
        return lambda: None
    ax = node.op.axis % out.ndim  # type: ignore[attr-defined]
    row = ctx.scratch(tuple(1 if i == ax else d for i, d in enumerate(out.shape)), out.dtype, 50)
    tmp = ctx.scratch(out.shape, out.dtype, 51)
    if isinstance(node.op, LogSoftmaxBackward):

        def log_softmax_backward() -> None:
            np.sum(dy, axis=ax, keepdims=True, out=row)
            np.exp(y, out=tmp)
            np.multiply(tmp, row, out=tmp)
            np.subtract(dy, tmp, out=out)

        return log_softmax_backward

    def softmax_backward() -> None:
        np.multiply(dy, y, out=tmp)
        np.sum(tmp, axis=ax, keepdims=True, out=row)
        np.subtract(dy, row, out=tmp)
        np.multiply(y, tmp, out=out)

    return softmax_backward


@kind(KernelKind.NATIVE)
def native_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The native row kernel, or None (noted) when native kernels are off or it declines."""
    return native_or_none(lambda: _native(node, ins, out, ctx), ctx)


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    SoftmaxBackward: (native_backward_kernel, numpy_backward_kernel),
    LogSoftmaxBackward: (native_backward_kernel, numpy_backward_kernel),
}
