"""CPU kernel of ``sample`` (``rlx/ops/sample.py``: temperature / top-k / top-p token
sampling with Philox uniforms). In: the node and its arena views. Out: a closure writing
the sampled token ids into the output view.

Every row at once in f64 scratch made when the schedule is built. What still allocates
per run, and why: the uniforms when the node has an ``offset`` input (one f64 per row:
the Philox words are computed with NumPy temporaries) and NumPy's internal sort buffer
for top-k / top-p. Each such node's report entry says so in its notes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.ops.sample import Sample, check_rows, philox_uniform

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["sample_kernel"]


def sample_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """All rows at once in f64 scratch: temperature, top-k (threshold from an in-place
    partitioned copy), softmax, top-p (the kept set from the sorted probabilities, ties by
    index as the reference), then the first index whose running sum exceeds ``u``."""
    op: Sample = node.op  # type: ignore[assignment]
    logits = ins[0]
    v = logits.shape[-1]
    rows = out.size
    src = logits.reshape(rows, v)
    res = out.reshape(rows)
    f64 = np.float64
    k, p = op.top_k, op.top_p
    sorts = 0 < k < v or p < 1
    # [rows, V] scratch: 9 bytes per logit, +8 with top-k or top-p, +10 more with top-p
    z = ctx.scratch((rows, v), f64, 85)
    mask = ctx.scratch((rows, v), np.bool_, 86)
    srt = ctx.scratch((rows, v), f64, 87) if sorts else z
    cum = ctx.scratch((rows, v), f64, 88) if p < 1 else z
    ties = cum.view(np.int64)  # the running counts reuse cum once it has been read
    above = ctx.scratch((rows, v), np.bool_, 89) if p < 1 else mask
    keep = ctx.scratch((rows, v), np.bool_, 90) if p < 1 else mask
    col = ctx.scratch((rows, 1), f64, 91)
    thr = ctx.scratch((rows, 1), f64, 92)
    cnt = ctx.scratch((rows, 1), np.int64, 93)
    flat = ctx.scratch((rows, 1), np.int64, 94)
    ends = (np.arange(1, rows + 1, dtype=np.int64) * v).reshape(rows, 1)  # row r's end
    fixed_u = None if op.has_offset else philox_uniform(rows, op.seed).reshape(rows, 1)
    if op.has_offset:
        ctx.notes.append(f"draws {rows} Philox uniforms per run (NumPy temporaries)")
    if sorts:
        ctx.notes.append("top-k / top-p partition / sort a scratch copy in place")

    def top_p() -> None:
        """Keep the ``m`` most probable tokens (ties by index), ``m`` the shortest
        prefix of the descending probabilities whose sum reaches ``p``."""
        np.copyto(srt, z)
        srt.sort(axis=1)
        np.cumsum(srt[:, ::-1], axis=1, out=cum)
        np.less(cum, p, out=mask)
        np.sum(mask, axis=1, keepdims=True, out=cnt)
        np.add(cnt, 1, out=cnt)
        np.minimum(cnt, v, out=cnt)  # m: how many tokens stay
        np.subtract(ends, cnt, out=flat)
        np.take(srt.reshape(-1), flat, out=col)  # the m-th largest probability
        np.greater(z, col, out=above)
        np.sum(above, axis=1, keepdims=True, out=flat)
        np.subtract(cnt, flat, out=cnt)  # how many of the ties with it stay
        np.equal(z, col, out=mask)
        np.copyto(ties, mask)
        np.cumsum(ties, axis=1, out=ties)  # in place: a bool input would need a temporary
        np.less_equal(ties, cnt, out=keep)
        np.logical_and(mask, keep, out=mask)
        np.logical_or(mask, above, out=mask)
        np.logical_not(mask, out=mask)
        np.copyto(z, 0.0, where=mask)

    def run() -> None:
        np.copyto(z, src, casting="unsafe")
        if np.isnan(z, out=mask).any() or np.equal(z, np.inf, out=mask).any():
            check_rows(z)
        np.equal(z, -np.inf, out=mask)
        if np.logical_and.reduce(mask, axis=1).any():
            check_rows(z)
        if op.temperature == 0:
            np.argmax(z, axis=1, out=res)
            return
        np.divide(z, op.temperature, out=z)
        if 0 < k < v:
            np.copyto(srt, z)
            srt.partition(v - k, axis=1)  # in place: the k-th largest lands at v - k
            np.less(z, srt[:, v - k : v - k + 1], out=mask)
            np.copyto(z, -np.inf, where=mask)
        np.max(z, axis=1, keepdims=True, out=col)
        np.subtract(z, col, out=z)
        np.exp(z, out=z)
        np.sum(z, axis=1, keepdims=True, out=col)
        np.divide(z, col, out=z)
        if p < 1:
            top_p()
        u = fixed_u if fixed_u is not None else philox_uniform(rows, op.seed, op.offset_of(ins))
        np.cumsum(z, axis=1, out=z)
        np.multiply(z[:, v - 1 : v], u.reshape(rows, 1), out=thr)
        np.less_equal(z, thr, out=mask)
        np.sum(mask, axis=1, out=res)

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Sample: (sample_kernel,),
}
