"""CPU kernels for the seed's ops: selective_scan, dense_solve, batched_dense_solve,
grouped_matmul, lora_matmul, qconv2d, sample and custom_fn. In: a node and NumPy views of
its arena slots. Out: a closure writing the output view through ``out=`` calls, with every
temporary in build-time scratch (f16/bf16 through f32 with ``lowp``).

What still allocates per run, and why: the solves' LAPACK pivot vector (N ints, made by
SciPy's ``gesv``), ``sample``'s uniforms when the node has an ``offset`` input (one f64
per row: the Philox words are computed with NumPy temporaries) and NumPy's internal sort
buffer for top-k / top-p. Each such node's report entry says so in its notes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelKind, kernel, lowp
from rlx.ops.custom import CustomFn
from rlx.ops.linalg import BatchedDenseSolve, DenseSolve, GroupedMatMul, LoraMatMul, singular_error
from rlx.ops.nn import _window_view
from rlx.ops.qconv import QConv2d
from rlx.ops.recurrent import SelectiveScan
from rlx.ops.sample import Sample, check_rows, philox_uniform

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "selective_scan_kernel",
    "dense_solve_kernel",
    "batched_dense_solve_kernel",
    "grouped_matmul_kernel",
    "lora_matmul_kernel",
    "qconv2d_kernel",
    "sample_kernel",
    "custom_fn_kernel",
]


# ---- selective scan ----------------------------------------------------------------------


@kernel(SelectiveScan)
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


# ---- dense solves ------------------------------------------------------------------------


def _solver(node: Node, a: np.ndarray, b: np.ndarray, ctx: KernelCtx, tag: int):
    """A function solving one [N, N] system from arena views into ``x`` (in place in
    Fortran-ordered scratch, so LAPACK's ``gesv`` copies nothing)."""
    n = a.shape[-1]
    k = 1 if b.ndim == a.ndim - 1 else b.shape[-1]
    af = ctx.scratch((n, n), a.dtype, tag).T  # Fortran order
    bf = ctx.scratch((k, n), a.dtype, tag + 1).T
    import scipy.linalg.lapack  # (on first use: ~0.05-1 s to import)

    gesv = scipy.linalg.lapack.get_lapack_funcs("gesv", dtype=a.dtype)
    ctx.notes.append("LAPACK gesv (allocates its N-int pivot vector)")

    def solve(ai: np.ndarray, bi: np.ndarray, xi: np.ndarray, where: str) -> None:
        np.copyto(af, ai)
        np.copyto(bf, bi.reshape(n, k))
        _, _, x, info = gesv(af, bf, overwrite_a=1, overwrite_b=1)
        if info > 0:
            raise singular_error(where)
        if info < 0:  # pragma: no cover - the shape rule rules this out
            raise AssertionError(f"gesv: argument {-info} is invalid")
        np.copyto(xi, x.reshape(xi.shape))

    return solve


@kernel(DenseSolve, KernelKind.BLAS)
@lowp
def dense_solve_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """LAPACK ``gesv`` on copies of ``A`` and ``b`` in scratch."""
    a, b = ins
    if a.dtype not in (np.float32, np.float64) or a.shape[0] == 0:
        return None
    solve = _solver(node, a, b, ctx, 66)
    return lambda: solve(a, b, out, "")


@kernel(BatchedDenseSolve, KernelKind.BLAS)
@lowp
def batched_dense_solve_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """One ``gesv`` per batch index, reusing the same scratch."""
    a, b = ins
    if a.dtype not in (np.float32, np.float64) or a.size == 0:
        return None
    batch = a.shape[:-2]
    solve = _solver(node, a[(0,) * len(batch)], b[(0,) * len(batch)], ctx, 66)
    idx = list(np.ndindex(*batch))
    names = ["[" + ", ".join(map(str, i)) + "]" for i in idx]

    def run() -> None:
        for i, where in zip(idx, names, strict=True):
            solve(a[i], b[i], out[i], where)

    return run


# ---- grouped / LoRA matmuls --------------------------------------------------------------


@kernel(GroupedMatMul, KernelKind.BLAS)
@lowp
def grouped_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Tokens packed by expert (a counting sort done with a one-hot [M, E] cumsum), one
    BLAS gemm per expert over its rows, then unpacked into ``out``."""
    op: GroupedMatMul = node.op  # type: ignore[assignment]
    x, w, idx = ins
    if x.dtype not in (np.float32, np.float64):
        return None
    m, e = x.shape[0], w.shape[0]
    if m == 0:
        return lambda: None
    ids = ctx.scratch((m,), np.int64, 70)
    onehot = ctx.scratch((m, e), np.bool_, 71)
    cum = ctx.scratch((m, e), np.int64, 72)
    offs = ctx.scratch((e + 1,), np.int64, 73)
    rank = ctx.scratch((m,), np.int64, 74)
    pos = ctx.scratch((m,), np.int64, 75)
    packed = ctx.scratch(x.shape, x.dtype, 76)
    pout = ctx.scratch(out.shape, out.dtype, 77)
    experts = np.arange(e, dtype=np.int64)
    rowbase = np.arange(m, dtype=np.int64) * e

    def run() -> None:
        np.copyto(ids, idx, casting="unsafe")
        if ids.min() < 0 or ids.max() >= e:
            op.check_ids(idx, e)
        np.equal(ids[:, None], experts, out=onehot)
        np.copyto(cum, onehot)
        np.cumsum(cum, axis=0, out=cum)  # in place: a bool input would need a temporary
        offs[0] = 0
        np.cumsum(cum[-1], out=offs[1:])
        np.add(rowbase, ids, out=rank)
        np.take(cum.reshape(-1), rank, out=rank)  # 1-based rank within the expert
        np.take(offs, ids, out=pos)
        np.add(pos, rank, out=pos)
        np.subtract(pos, 1, out=pos)
        packed[pos] = x
        bounds = offs.tolist()
        for k in range(e):
            lo, hi = bounds[k], bounds[k + 1]
            if hi > lo:
                np.matmul(packed[lo:hi], w[k], out=pout[lo:hi])
        np.take(pout, pos, axis=0, out=out)

    return run


@kernel(LoraMatMul, KernelKind.BLAS)
@lowp
def lora_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Three BLAS gemms into ``out`` and two scratch buffers, then one scaled add."""
    x, w, a, b = ins
    if x.dtype not in (np.float32, np.float64):
        return None
    r = a.shape[1]
    t = ctx.scratch((*x.shape[:-1], r), x.dtype, 78)
    u = ctx.scratch(out.shape, x.dtype, 79)
    scale = x.dtype.type(node.op.scale)  # type: ignore[attr-defined]

    def run() -> None:
        np.matmul(x, a, out=t)
        np.matmul(t, b, out=u)
        np.multiply(u, scale, out=u)
        np.matmul(x, w, out=out)
        np.add(out, u, out=out)

    return run


# ---- quantized conv ----------------------------------------------------------------------


@kernel(QConv2d, KernelKind.BLAS)
def qconv2d_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """im2col of ``x_q - x_zero_point`` into f64 scratch and one f64 BLAS gemm per group:
    integer products and sums are exact in f64 (below 2**53), so the accumulator equals
    the integer one; then the reference's f32 epilogue."""
    op: QConv2d = node.op  # type: ignore[assignment]
    x, w = ins[:2]
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = op.groups
    og = o // g
    (pt, pb), (pl, pr) = op.padding
    _, _, ho, wo = out.shape
    f64 = np.dtype(np.float64)
    xp = ctx.scratch((n, c, h + pt + pb, wd + pl + pr), f64, 80)
    inner = xp[:, :, pt : pt + h, pl : pl + wd]
    # the border is 0 (a padded x_q equals the zero point); rewritten every run, since
    # scratch is shared with other kernels of the schedule
    border = [xp[:, :, :pt], xp[:, :, pt + h :], xp[:, :, :, :pl], xp[:, :, :, pl + wd :]]
    border = [b for b in border if b.size]
    win = _window_view(xp, (kh, kw), op.stride, op.dilation)  # [N,C,Ho,Wo,kh,kw]
    src = win.reshape(n, g, cg, ho, wo, kh, kw)
    cols = ctx.scratch((n, g, ho * wo, cg * kh * kw), f64, 81)
    dst = cols.reshape(n, g, ho, wo, cg, kh, kw).transpose(0, 1, 4, 2, 3, 5, 6)
    wf = ctx.scratch((g, og, cg * kh * kw), f64, 82)
    acc = ctx.scratch((n, g, ho * wo, og), f64, 83)
    outv = out.reshape(n, g, og, ho * wo).transpose(0, 1, 3, 2)  # [N,G,L,Og] view of out
    scales = op.combined_scales(o).reshape(1, g, 1, og)
    bias = ctx.scratch((o,), np.float32, 84) if op.has_bias else None
    zp = f64.type(op.x_zero_point)

    def run() -> None:
        for b in border:
            b.fill(0)
        np.subtract(x, zp, out=inner)
        np.copyto(dst, src)
        np.copyto(wf, w.reshape(g, og, cg * kh * kw))
        np.matmul(cols, wf.transpose(0, 2, 1)[None], out=acc)
        np.copyto(outv, acc, casting="unsafe")  # f32(acc): exact ints rounded once
        np.multiply(outv, scales, out=outv)
        if bias is not None:
            np.copyto(bias, ins[2], casting="unsafe")
            np.add(outv, bias.reshape(1, g, 1, og), out=outv)

    return run


# ---- sampling ----------------------------------------------------------------------------


@kernel(Sample)
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


# ---- custom_fn ---------------------------------------------------------------------------


@kernel(CustomFn)
def custom_fn_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``fwd_body`` as a compiled sub-program (``kernels.control.SubProgram``: planned
    once on its own arena with the node's symbol bindings); a run copies the operands in,
    runs the body's kernels and copies its output into ``out``."""
    from rlx.backends.cpu.kernels.control import SubProgram

    sub = SubProgram(node.op.fwd_body, ctx.bindings, ctx)  # type: ignore[attr-defined]
    kinds = sub.kinds()
    ctx.notes.append(
        "fwd_body: " + (", ".join(f"{c} {k}" for k, c in sorted(kinds.items())) or "no kernels")
    )
    if kinds.get(KernelKind.REFERENCE.value):
        ctx.kind = KernelKind.REFERENCE
    result = sub.outputs[0]

    def run() -> None:
        for k, x in enumerate(ins):
            sub.feed(k, x)
        sub.run()
        np.copyto(out, result, casting="unsafe")

    return run
