"""CPU kernels of the loss ops (``rlx/ops/loss.py``). In: a SoftmaxCrossEntropyWithLogits
node (``logits [..., C]``, ``labels [...]``) or a SoftmaxCrossEntropyBackward node
(``ct``, ``logits``, ``labels``) with their arena views. Out: a closure writing the
per-row loss, or the logits' cotangent, into the output view.

* Native (f32 / f64 / f16 / bf16, C-contiguous, rows of at least one class): one
  generated C function per op and dtype walks each row twice, the maximum, then the sum
  of ``exp(x - max)`` (the prelude's ``rlx_expneg``, libmvec's SIMD exp); the forward
  writes ``log(sum) - (x[label] - max)``, the backward ``(exp(x - max) / sum - onehot) *
  ct`` (a third pass). Accumulated in the register type (f32 for f16 / bf16, rounded
  once on store); rows are shared by an OpenMP team of ``KernelCtx.num_threads`` above
  ``engines.region.PARALLEL_MIN_WORK``. Built and cached by content for the selected
  target like the softmax backward rows (``kernels/reduce_grad.py``).
* NumPy otherwise (native kernels off, no gcc, fp8, no classes): the same passes with
  ufuncs over ``[rows, C]`` into scratch made at schedule-build time (one tensor and
  two row vectors); f16 / bf16 / fp8 computed in f32 scratch (``lowp``).

Both turn the labels into int64 row indices on each run (``rlx.ops.loss.label_rows``:
range-checked, an InputError naming the op, or -1 for a row that ``OutOfRange.ZERO``
makes 0).
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
from rlx.ops.loss import SoftmaxCrossEntropyBackward, SoftmaxCrossEntropyWithLogits, label_rows

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "render_cross_entropy_rows",
    "native_cross_entropy_kernel",
    "cross_entropy_kernel",
    "cross_entropy_backward_kernel",
]

_NATIVE_DTYPES = frozenset({DType.F32, DType.F64, DType.F16, DType.BF16})


def render_cross_entropy_rows(backward: bool, t: CType) -> CFunction:
    """``void f(const long* m, const S* x, const int64_t* lab, const S* ct, S* out, long
    nthreads)`` over ``m = [rows, n]`` C-contiguous rows of logits with in-range int64
    labels: the per-row loss (``ct`` unread), or with ``backward`` the logits' cotangent
    (``out`` never aliases an input: the op is not elementwise)."""
    v, s = t.value, t.storage
    ld, st = t.load.format, t.store.format
    sfx = "f" if v == "float" else ""
    e = f"rlx_expneg{sfx}({ld('xr[j]')} - mx)"
    zero = (
        f"for (long j = 0; j < n; ++j) out[r * n + j] = {st('0')};"
        if backward
        else f"out[r] = {st('0')};"
    )
    name = NAME_PLACEHOLDER
    params = (
        f"const long* restrict m, const {s}* restrict x, const int64_t* restrict lab, "
        f"const {s}* restrict ct, {s}* restrict out"
    )
    lines = [
        f"static void {name}_rows(long r0, long r1, {params}) {{",
        "    const long n = m[1];",
        "    for (long r = r0; r < r1; ++r) {",
        f"        const {s}* xr = x + r * n;",
        "        const long k = (long)lab[r];",
        f"        if (k < 0) {{ {zero} continue; }}",
        f"        {v} mx = -INFINITY;",
        "        #pragma omp simd reduction(max:mx) simdlen(64)",
        f"        for (long j = 0; j < n; ++j) {{ const {v} a = {ld('xr[j]')}; mx = a > mx ? a : mx; }}",
        f"        {v} sum = 0;",
        "        #pragma omp simd reduction(+:sum) simdlen(64)",
        f"        for (long j = 0; j < n; ++j) sum += {e};",
    ]  # fmt: skip
    if backward:
        lines += [
            f"        const {v} g = {ld('ct[r]')};",
            f"        {s}* outr = out + r * n;",
            "        #pragma omp simd",
            f"        for (long j = 0; j < n; ++j) outr[j] = {st(f'({e} / sum) * g')};",
            "        { const long j = k;",
            f"          outr[j] = {st(f'({e} / sum - 1) * g')}; }}",
        ]
    else:
        picked = ld("xr[k]")
        lines.append(f"        out[r] = {st(f'log{sfx}(sum) - ({picked} - mx)')};")
    lines += [
        "    }",
        "}",
        "",
        f"void {name}({params}, long nthreads) {{",
        "    const long rows = m[0];",
        "#ifdef _OPENMP",
        *team_loop(f"{name}_rows", "m, x, lab, ct, out"),
        "#endif",
        "    (void)nthreads;",
        f"    {name}_rows(0, rows, m, x, lab, ct, out);",
        "}",
    ]
    text = "\n".join(lines) + "\n"
    prefix = f"rlx_rows_cross_entropy{'_backward' if backward else ''}_{s.strip('_').lower()}"
    symbol = content_symbol(prefix, text)
    return CFunction(symbol, text.replace(NAME_PLACEHOLDER, symbol), 5, 4, 2)


@functools.cache
def _function(backward: bool, dtype: DType, target: Target) -> tuple[Any, CFunction]:
    """The loaded function for ``target`` (the key: RLX_ISA may change in a process)."""
    fn = render_cross_entropy_rows(backward, C_TYPES[dtype])
    return load_function(fn), fn


def _native(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """The native kernel; CodegenUnsupported when the layout or dtype has none."""
    backward = isinstance(node.op, SoftmaxCrossEntropyBackward)
    ct, x, labels = ins if backward else (None, *ins)
    dt = DType.from_numpy(x.dtype)
    c, n = x.shape[-1], labels.size
    if dt not in _NATIVE_DTYPES:
        raise CodegenUnsupported(f"dtype {x.dtype} has no native row kernel")
    if c == 0 or n == 0:
        raise CodegenUnsupported(f"logits {x.shape} have no rows or no classes")
    for a in (x, out) if ct is None else (x, ct, out):
        if not a.flags.c_contiguous:
            raise CodegenUnsupported(f"operand {a.dtype}{a.shape} is not C-contiguous")
    cfn, fn = _function(backward, dt, selected_target())
    meta = np.array([n, c], dtype=np.int64)
    idx = ctx.scratch((n,), np.int64, 64)
    work = x.size * (2 + backward) * (1 + CALL_WEIGHT * fn.calls)
    threads = ctx.num_threads if work >= PARALLEL_MIN_WORK and n > 1 else 1
    team = f", OpenMP x{threads}" if threads > 1 else ""
    ctx.notes.append(f"native: {node.op.mnemonic} over {n} rows of {c}{team}")
    call = bind(cfn, [meta, x, idx, x if ct is None else ct, out], threads)
    op = node.op

    def cross_entropy_rows() -> None:
        idx[...] = label_rows(op, labels, c)
        call()

    return cross_entropy_rows


@kind(KernelKind.NATIVE)
def native_cross_entropy_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The native row kernel, or None (noted) when native kernels are off or it declines."""
    return native_or_none(lambda: _native(node, ins, out, ctx), ctx)


@lowp
def cross_entropy_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """``log(sum(exp(x - max))) - (x - max)[label]`` per row, into ``out``."""
    x, labels = ins
    c = x.shape[-1]
    n = labels.size
    rows, flat = x.reshape(n, c), out.reshape(n)
    shifted = ctx.scratch((n, c), x.dtype, 60)
    top = ctx.scratch((n, 1), x.dtype, 61)
    total = ctx.scratch((n,), x.dtype, 62)
    at = np.arange(n)
    op = node.op

    def cross_entropy() -> None:
        idx = label_rows(op, labels, c)
        if n == 0:
            return
        with np.errstate(all="ignore"):
            np.max(rows, axis=1, keepdims=True, out=top)
            np.subtract(rows, top, out=shifted)
            picked = shifted[at, idx]
            np.exp(shifted, out=shifted)
            np.sum(shifted, axis=1, out=total)
            np.log(total, out=total)
            np.subtract(total, picked, out=flat)
            flat[idx < 0] = 0  # OutOfRange.ZERO rows

    return cross_entropy


@lowp
def cross_entropy_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """``(exp(x - max) / sum - onehot) * ct`` per row, into ``out``."""
    ct, x, labels = ins
    c = x.shape[-1]
    n = labels.size
    rows, dst = x.reshape(n, c), out.reshape(n, c)
    col = ct.reshape(n, 1)
    top = ctx.scratch((n, 1), x.dtype, 63)
    at = np.arange(n)
    op = node.op

    def cross_entropy_backward() -> None:
        idx = label_rows(op, labels, c)
        if n == 0 or c == 0:
            return
        with np.errstate(all="ignore"):
            np.max(rows, axis=1, keepdims=True, out=top)
            np.subtract(rows, top, out=dst)
            np.exp(dst, out=dst)
            np.sum(dst, axis=1, keepdims=True, out=top)
            np.divide(dst, top, out=dst)
            keep = idx >= 0
            dst[at[keep], idx[keep]] -= 1
            dst[~keep] = 0  # OutOfRange.ZERO rows
            np.multiply(dst, col, out=dst)

    return cross_entropy_backward


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    SoftmaxCrossEntropyWithLogits: (native_cross_entropy_kernel, cross_entropy_kernel),
    SoftmaxCrossEntropyBackward: (native_cross_entropy_kernel, cross_entropy_backward_kernel),
}
