"""CPU kernel for ``Fft`` (fft, ifft, rfft, irfft along one axis). In: the node and its
arena views. Out: a closure computing the transform into the output view.

As the reference, the transform runs in double precision and is rounded once: each run
copies the input (cropped or zero-padded to the transform length, the transformed axis
moved last) into a c128/f64 scratch made at schedule-build time, calls NumPy's pocketfft
with ``out=`` into a second scratch, and copies the result (axis moved back) into the
arena view. ``np.fft.irfft`` copies its input internally (the complex-to-real pass
destroys it): that buffer is the one allocation per run left, noted in the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.ops.fft import Fft, FftKind

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["fft_kernel"]

_FNS = {
    FftKind.FFT: np.fft.fft,
    FftKind.IFFT: np.fft.ifft,
    FftKind.RFFT: np.fft.rfft,
    FftKind.IRFFT: np.fft.irfft,
}


def fft_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel | None:
    """Widen + pad into scratch, ``np.fft.<fn>(..., out=)``, round into ``out``."""
    (x,) = ins
    op: Fft = node.op  # type: ignore[assignment]
    ax = op.axis % x.ndim
    fn = op.fn
    have = x.shape[ax]
    n = out.shape[ax] if fn is not FftKind.RFFT else (op.n if op.n is not None else have)
    if fn is FftKind.IRFFT:
        take = n // 2 + 1  # bins the inverse reads
    else:
        take = n
    src = np.moveaxis(x, ax, -1)
    dst = np.moveaxis(out, ax, -1)
    lead = src.shape[:-1]
    in_dt = np.complex128 if fn.in_dtype.is_complex else np.float64
    out_dt = np.complex128 if fn.out_dtype.is_complex else np.float64
    s_in = ctx.scratch((*lead, take), in_dt, 200)
    s_out = ctx.scratch(dst.shape, out_dt, 201)
    copy = min(have, take)
    src_part, in_part = src[..., :copy], s_in[..., :copy]
    tail = s_in[..., copy:] if copy < take else None
    f = _FNS[fn]
    norm = op.norm.value
    if fn is FftKind.IRFFT:
        ctx.notes.append("np.fft.irfft copies its input internally (one buffer per run)")

    def run() -> None:
        np.copyto(in_part, src_part, casting="unsafe")
        if tail is not None:
            tail.fill(0)
        if fn is FftKind.IRFFT:
            f(s_in, n=n, axis=-1, norm=norm, out=s_out)
        else:
            f(s_in, axis=-1, norm=norm, out=s_out)
        np.copyto(dst, s_out, casting="unsafe")

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Fft: (fft_kernel,),
}
