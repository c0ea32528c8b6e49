"""CPU kernels of the recurrent ops (``rlx/ops/recurrent.py``): ``GatedDeltaNet`` (the
gated delta rule) and ``SelectiveScan``. In: the node and its arena views. Out: a closure
running the recurrence into the output view.

Gated delta net: the state ``S [B, H, K, V]``, the widened inputs and the per-step temporaries live in
scratch made when the schedule is built (f32, f64 for f64 inputs, as the reference); each
step is a handful of NumPy calls with ``out=``: ``S *= exp(g_t)``, ``r = k_t S`` and
``o_t = q_t S`` as batched BLAS products, the rank-1 write ``S += k_t (beta_t (v_t -
r))^T``. ``exp(g)`` for every step is one call before the loop and the ``1/sqrt(K)``
scale one call after it. No array is allocated per run; NumPy's ufunc iterator may still
take a transient buffer of its own (up to ~32 KB, whatever the sizes) for the broadcast
multiplies on small states (the rank-1 write as a K=1 matmul avoids it but is 1.5x
slower).

Selective scan: the recurrence one time step at a time over the whole ``[B, H, N]`` state
in build-time scratch, in the reference's order (f16/bf16 through f32 with ``lowp``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind, lowp
from rlx.ops.recurrent import GatedDeltaNet, GdnResult, SelectiveScan

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["gated_delta_net_kernel", "selective_scan_kernel"]


@kind(KernelKind.BLAS)
def gated_delta_net_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The recurrence step by step in scratch (see the module docstring)."""
    op: GatedDeltaNet = node.op  # type: ignore[assignment]
    q0, k0, v0, g0, beta0 = ins[:5]
    wide = np.dtype(np.float64 if q0.dtype == np.float64 else np.float32)
    b, t, h, dk = k0.shape
    dv = v0.shape[-1]

    def widened(x: np.ndarray, tag: int) -> np.ndarray:
        return x if x.dtype == wide else ctx.scratch(x.shape, wide, tag)

    q, k, v, g, beta = (widened(x, 500 + i) for i, x in enumerate((q0, k0, v0, g0, beta0)))
    pairs = [(w, x) for w, x in zip((q, k, v, g, beta), (q0, k0, v0, g0, beta0)) if w is not x]
    state0 = ins[5] if op.carry else None
    s = ctx.scratch((b, h, dk, dv), wide, 510)
    eg = ctx.scratch((b, t, h), wide, 511)
    r = ctx.scratch((b, h, 1, dv), wide, 512)
    upd = ctx.scratch((b, h, dk, dv), wide, 513)
    final = op.returns is GdnResult.FINAL_STATE
    o = ctx.scratch((b, t, h, dv), wide, 514)
    scale = wide.type(1.0 / math.sqrt(dk))
    # per step views: [B, H, 1, K] rows for the products, [B, H, K, 1] column of k
    steps = [
        (
            eg[:, i, :, None, None],
            k[:, i, :, None, :],
            k[:, i, :, :, None],
            q[:, i, :, None, :],
            v[:, i, :, None, :],
            beta[:, i, :, None, None],
            o[:, i, :, None, :],
        )
        for i in range(t)
    ]

    def run() -> None:
        for w, x in pairs:
            np.copyto(w, x, casting="unsafe")
        if state0 is None:
            s.fill(0)
        else:
            np.copyto(s, state0, casting="unsafe")
        np.exp(g, out=eg)
        for a_t, k_row, k_col, q_row, v_row, beta_t, o_row in steps:
            np.multiply(s, a_t, out=s)
            np.matmul(k_row, s, out=r)  # S^T k_t
            np.subtract(v_row, r, out=r)
            np.multiply(r, beta_t, out=r)
            np.multiply(k_col, r, out=upd)  # k_t delta^T
            np.add(s, upd, out=s)
            if not final:
                np.matmul(q_row, s, out=o_row)
        if final:
            np.copyto(out, s, casting="unsafe")
        else:
            np.multiply(o, scale, out=o)
            np.copyto(out, o, casting="unsafe")

    return run


@lowp
def selective_scan_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The recurrence one time step at a time over the whole [B, H, N] state, in the
    reference's order (state, then ``c``-contraction, then ``d`` and the ``z`` gate)."""
    op: SelectiveScan = node.op  # type: ignore[assignment]
    x, delta, a, b, c = ins[:5]
    d, z, bias = op.optional_inputs(ins)
    if x.dtype not in (np.float32, np.float64):
        return None
    bs, s, h = x.shape
    n = a.shape[1]
    dt = x.dtype
    dts = ctx.scratch((bs, s, h), dt, 60)
    state = ctx.scratch((bs, h, n), dt, 61)
    decay = ctx.scratch((bs, h, n), dt, 62)
    inp = ctx.scratch((bs, h, n), dt, 63)
    yt = ctx.scratch((bs, h, 1), dt, 64)
    tmp = ctx.scratch((bs, s, h), dt, 65)
    zero = dt.type(0)

    def run() -> None:
        np.copyto(dts, delta)
        if bias is not None:
            np.add(dts, bias, out=dts)
        if op.delta_softplus:
            np.logaddexp(dts, zero, out=dts)
        state.fill(0)
        for t in range(s):
            dtt = dts[:, t, :, None]
            np.multiply(dtt, a, out=decay)
            np.exp(decay, out=decay)
            np.multiply(decay, state, out=state)
            np.multiply(dtt, b[:, t, None, :], out=inp)
            np.multiply(inp, x[:, t, :, None], out=inp)
            np.add(state, inp, out=state)
            np.matmul(state, c[:, t, :, None], out=yt)
            np.copyto(out[:, t], yt[:, :, 0])
        if d is not None:
            np.multiply(x, d, out=tmp)
            np.add(out, tmp, out=out)
        if z is not None:  # y * z * sigmoid(z), as z / (1 + exp(-z))
            np.negative(z, out=tmp)
            np.exp(tmp, out=tmp)
            np.add(tmp, 1, out=tmp)
            np.divide(z, tmp, out=tmp)
            np.multiply(out, tmp, out=out)

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    GatedDeltaNet: (gated_delta_net_kernel,),
    SelectiveScan: (selective_scan_kernel,),
}
