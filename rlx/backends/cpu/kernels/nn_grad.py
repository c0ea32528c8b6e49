"""CPU kernels of the backward ops (``rlx/ops/nn_grad.py``) of the norms, attention, rope,
convolution and pooling. In: the node and NumPy views of its input and output arena slots. Out: a
closure writing the gradient into ``out`` with ``out=`` ufuncs and BLAS matmuls into
scratch allocated when the schedule is built (no allocation per run). f16/bf16 compute
in f32 (``lowp``); f64 stays f64.

* Norm backward: per row ``xhat`` and ``rstd`` are recomputed; dx is
  ``rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = ct * gamma``; dgamma sums
  ``ct * xhat`` over the rows. f32 (and f16/bf16 widened) runs ``csrc/norm_grad.c``
  (OpenMP over rows, one pass per row after its statistics) when native kernels are on;
  f64 and the fallback are ``out=`` ufunc passes.
* Attention backward, native (``csrc/attention_grad.c``, f32 and widened f16/bf16): per
  (batch, kv head) task the probabilities are recomputed row by row with lanes over the
  keys, and dq, dk, dv (or the score gradient) come out of one pass; OpenMP over tasks.
* Attention backward (f64, or native kernels off) / jvp: the forward BLAS kernel's grouped
  layout (q as ``[B, Hkv, G*Sq, D]``, G query heads per kv head), so ``Pᵀ·dO`` and
  ``dSᵀ·Q`` sum the grouped heads into their kv head inside the matmul; the probabilities
  are recomputed.
* Rope backward: two ``einsum`` reductions over batch and heads.
* Conv backward: im2col + BLAS. The output gradient as ``[G, O/G, N*L]`` against the
  columns ``[G, N*L, C/G*K]`` (one 2-D GEMM per group) gives dw; ``[G, N*L, O/G] @
  w[G, O/G, C/G*K]`` gives the column gradient, scattered back (col2im) tap by tap into a
  bordered buffer.
* MaxPool2dBackward, native (f32, ``csrc/maxpool2d_grad.c``): one pass over the windows per
  plane, OpenMP over planes. Pool backward (and MaxPool2dBackward otherwise) / max-pool select: each window's first maximum found tap by tap with
  strict ``>`` (the first wins ties), the gradient added tap by tap.
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind, lowp
from rlx.backends.cpu.engines.conv import ConvColumns, FirstMax, pool_geometry, window_view
from rlx.backends.cpu.native import bindings
from rlx.backends.cpu.native.attention import MASK_CODES
from rlx.backends.cpu.native.cpu import selected_target
from rlx.errors import CompileError
from rlx.ops.nn import PoolKind
from rlx.ops.nn_grad import (
    AttentionBackward,
    AttentionJvp,
    ConvBackwardData,
    ConvBackwardWeight,
    LayerNormBackward,
    LayerNormBackwardGamma,
    MaxPool2dBackward,
    MaxPoolSelect,
    PoolBackward,
    RmsNormBackward,
    RopeBackward,
    rope_pairs,
    window_taps,
)

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "norm_backward_kernel",
    "layer_norm_backward_gamma_kernel",
    "rms_norm_backward_kernel",
    "attention_backward_kernel",
    "attention_jvp_kernel",
    "rope_backward_kernel",
    "conv_backward_kernel",
    "conv_backward_data_kernel",
    "pool_backward_kernel",
    "native_max_pool2d_backward_kernel",
    "max_pool_select_kernel",
]

_T = 300  # scratch tags of this module: 300..


# ---- norms ------------------------------------------------------------------------------


#: below this many elements a native norm backward runs on one thread
_PARALLEL_MIN = 1 << 15


def _native_lib(
    ctx: KernelCtx, arrays: list[np.ndarray], what: str, files: tuple[str, ...], defines: str = ""
) -> ctypes.CDLL | None:
    """The library of ``csrc/<files>`` for the selected target when native kernels are on
    and every array is a non-empty C-contiguous f32 view; None (the NumPy / BLAS path)
    otherwise, with a note when the build failed."""
    if any(a.dtype != np.float32 or not a.flags.c_contiguous or not a.size for a in arrays):
        return None
    name = files[-1].removesuffix(".c")
    return bindings.lib_or_note(
        ctx, what, lambda: bindings.csrc_library(files, selected_target(), name, defines)
    )


def _native_norm_backward(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The ``csrc/norm_grad.c`` call for f32 contiguous views (None: the NumPy path)."""
    lib = _native_lib(ctx, [*ins, out], "norm backward", ("norm_grad.c",))
    if lib is None:
        return None
    op = node.op
    x, gamma, ct = ins
    d = x.shape[-1]
    rows = x.size // d if d else 0
    threads = ctx.num_threads if x.size >= _PARALLEL_MIN else 1
    eps, center = ctypes.c_float(op.eps), int(op.center)  # type: ignore[attr-defined]
    ctx.kind = KernelKind.NATIVE
    if op.wrt == "x":  # type: ignore[attr-defined]
        fn, args = lib.rlx_norm_grad_x_f32, (x, gamma, ct, out)
    else:
        ws = ctx.scratch((max(1, threads), d), np.float32, _T + 5)
        fn, args = lib.rlx_norm_grad_gamma_f32, (x, ct, out, ws)
    ptrs = [a.ctypes.data for a in args]
    return functools.partial(fn, *ptrs, rows, d, eps, center, threads)


def _norm_backward(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    fast = _native_norm_backward(node, ins, out, ctx)
    if fast is not None:
        return fast
    op = node.op
    x, gamma, ct = ins
    d = x.shape[-1]
    rows = x.size // d if d else 0
    x2, ct2 = x.reshape(rows, d), ct.reshape(rows, d)
    dt = x.dtype
    rstd = ctx.scratch((rows, 1), dt, _T)
    m = ctx.scratch((rows, 1), dt, _T + 1)
    xhat = ctx.scratch((rows, d), dt, _T + 2)
    gg = ctx.scratch((rows, d), dt, _T + 3)
    eps = dt.type(op.eps)  # type: ignore[attr-defined]
    center = op.center  # type: ignore[attr-defined]
    want_x = op.wrt == "x"  # type: ignore[attr-defined]
    out2 = out.reshape(rows, d) if want_x else out

    def run() -> None:
        if center:
            np.mean(x2, axis=1, keepdims=True, out=m)
            np.subtract(x2, m, out=xhat)
        else:
            np.copyto(xhat, x2)
        np.multiply(xhat, xhat, out=gg)
        np.mean(gg, axis=1, keepdims=True, out=rstd)
        np.add(rstd, eps, out=rstd)
        np.sqrt(rstd, out=rstd)
        np.divide(1.0, rstd, out=rstd)
        np.multiply(xhat, rstd, out=xhat)
        if not want_x:
            np.multiply(ct2, xhat, out=gg)
            np.sum(gg, axis=0, out=out2)
            return
        np.multiply(ct2, gamma, out=gg)
        if center:
            np.mean(gg, axis=1, keepdims=True, out=m)
            np.subtract(gg, m, out=gg)
        # gg - mean(gg) is orthogonal to xhat's mean direction: mean(gg*xhat) unchanged
        np.multiply(gg, xhat, out=out2)
        np.mean(out2, axis=1, keepdims=True, out=m)
        np.multiply(xhat, m, out=xhat)
        np.subtract(gg, xhat, out=gg)
        np.multiply(gg, rstd, out=out2)

    return run


@lowp
def norm_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """dx or dgamma of layer norm with ``out=`` calls (see the module docstring)."""
    return _norm_backward(node, ins, out, ctx)


@lowp
def layer_norm_backward_gamma_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Layer norm's dgamma (inputs ``(x, ct)``): the dgamma path of the norm backward
    kernel, which does not read gamma."""
    x, ct = ins
    return _norm_backward(node, [x, x, ct], out, ctx)


@lowp
def rms_norm_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """dx or dgamma of RMS norm with ``out=`` calls."""
    return _norm_backward(node, ins, out, ctx)


# ---- attention --------------------------------------------------------------------------


class _Grouped:
    """Scratch and views of one attention node in the grouped layout."""

    def __init__(self, op, q: np.ndarray, k: np.ndarray, ctx: KernelCtx) -> None:  # noqa: ANN001
        b, sq, _ = q.shape
        skv = k.shape[1]
        h, d, hkv = op.num_heads, op.head_dim, op.kv_heads
        self.dims = (b, sq, skv, h, d, hkv)
        g = h // hkv
        dt = q.dtype
        self.qs = ctx.scratch((b, hkv, g * sq, d), dt, _T + 10)
        self.kt = ctx.scratch((b, hkv, d, skv), dt, _T + 11)
        self.vt = ctx.scratch((b, hkv, d, skv), dt, _T + 12)
        self.p = ctx.scratch((b, hkv, g * sq, skv), dt, _T + 13)
        self.row = ctx.scratch((b, hkv, g * sq, 1), dt, _T + 14)
        self.scale = dt.type(op.effective_scale)
        allowed = op.mask.allowed(sq, skv)
        self.hidden = None if allowed is None else ~allowed
        self.ninf = dt.type(-np.inf)

    def heads_q(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Packed ``x[B,Sq,H*D]`` as ``[B,H,Sq,D]`` (a view)."""
        b, sq, _, h, d, _ = self.dims
        return x.reshape(b, sq, h, d).transpose(0, 2, 1, 3)

    def heads_kv(self, x: np.ndarray, transposed: bool) -> np.ndarray:
        """Packed ``x[B,Skv,Hkv*D]`` as ``[B,Hkv,Skv,D]`` (``[B,Hkv,D,Skv]`` transposed)."""
        b, _, skv, _, d, hkv = self.dims
        src = x.reshape(b, skv, hkv, d)
        return src.transpose(0, 2, 3, 1) if transposed else src.transpose(0, 2, 1, 3)

    def as_heads(self, buf: np.ndarray) -> np.ndarray:
        """A grouped ``[B,Hkv,G*Sq,*]`` buffer as ``[B,H,Sq,*]``."""
        b, sq, _, h, _, _ = self.dims
        return buf.reshape(b, h, sq, buf.shape[-1])

    def probs(self, q: np.ndarray, k: np.ndarray, mask: np.ndarray | None) -> None:
        """Fill ``qs``, ``kt`` and the probabilities ``p`` (the forward's softmax math)."""
        np.copyto(self.as_heads(self.qs), self.heads_q(q))
        np.copyto(self.kt, self.heads_kv(k, True))
        p = self.p
        np.matmul(self.qs, self.kt, out=p)
        np.multiply(p, self.scale, out=p)
        if mask is not None:
            np.add(self.as_heads(p), mask, out=self.as_heads(p))
        if self.hidden is not None:
            np.copyto(self.as_heads(p), self.ninf, where=self.hidden)
        with np.errstate(invalid="ignore"):  # a row that sees no key: p = 0 (forward's)
            np.max(p, axis=-1, keepdims=True, out=self.row)
            np.maximum(self.row, np.finfo(p.dtype).min, out=self.row)
            np.subtract(p, self.row, out=p)
            np.exp(p, out=p)
            np.sum(p, axis=-1, keepdims=True, out=self.row)
            np.maximum(self.row, 1, out=self.row)
            np.divide(p, self.row, out=p)


def _native_attention_backward(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The ``csrc/attention_grad.c`` call for f32 contiguous views (None: the BLAS path)."""
    files = ("attention_vec.c", "attention_grad.c")
    lib = _native_lib(ctx, ins, "attention backward", files, "#define RLX_ATT_DT 0\n")
    if lib is None:
        return None
    op, wrt = node.op.fwd, node.op.wrt  # type: ignore[attr-defined]
    q, k, v = ins[:3]
    b, sq, _ = q.shape
    skv = k.shape[1]
    h, hkv, d = op.num_heads, op.kv_heads, op.head_dim
    mask, strides = None, (0, 0, 0, 0)
    if len(ins) == 5:
        mask = ins[3]
        full = np.broadcast_to(mask, (b, h, sq, skv))
        strides = tuple(st // 4 for st in full.strides)  # type: ignore[assignment]
    outs = dict(zip("qkv", out, strict=True)) if wrt == "qkv" else {wrt: out}
    ptr = {name: outs[name].ctypes.data if name in outs else None for name in "qkv"}
    ds = outs["mask"].ctypes.data if "mask" in outs else None
    threads = ctx.num_threads if b * h * sq * skv * d >= _PARALLEL_MIN * 8 else 1
    per = int(lib.rlx_attention_grad_ws_floats(skv, d))
    ws = ctx.scratch((max(1, threads) * per,), np.float32, _T + 6)
    args = (
        q.ctypes.data, k.ctypes.data, v.ctypes.data, ins[-1].ctypes.data,
        ptr["q"], ptr["k"], ptr["v"], ds, b, sq, skv, h, hkv, d,
        op.effective_scale, MASK_CODES[op.mask.type], op.mask.window,
        None if mask is None else mask.ctypes.data, *strides, ws.ctypes.data, ws.size, threads,
    )  # fmt: skip
    fn = lib.rlx_attention_grad
    ctx.kind = KernelKind.NATIVE

    def run() -> None:
        if fn(*args) != 0:
            raise CompileError("attention backward: the workspace is smaller than it needs")

    return run


@kind(KernelKind.BLAS)
@lowp
def attention_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """dq, dk, dv (or all three stacked) or the score gradient of attention in the grouped
    layout (BLAS): five batched matmuls for all three."""
    fast = _native_attention_backward(node, ins, out, ctx)
    if fast is not None:
        return fast
    op = node.op.fwd  # type: ignore[attr-defined]
    wrt = node.op.wrt  # type: ignore[attr-defined]
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) == 5 else None
    ct = ins[-1]
    s = _Grouped(op, q, k, ctx)
    b, sq, skv, h, d, hkv = s.dims
    dt = q.dtype
    do = ctx.scratch((b, hkv, (h // hkv) * sq, d), dt, _T + 20)
    ds = ctx.scratch(s.p.shape, dt, _T + 21)
    dkv = ctx.scratch((b, hkv, skv, d), dt, _T + 22)
    dq = ctx.scratch(do.shape, dt, _T + 23)
    tmp = ctx.scratch(s.p.shape, dt, _T + 24)
    outs = dict(zip("qkv", out, strict=True)) if wrt == "qkv" else {wrt: out}

    def run() -> None:
        s.probs(q, k, mask)
        np.copyto(s.as_heads(do), s.heads_q(ct))
        if wrt in ("v", "qkv"):
            np.matmul(s.p.swapaxes(-1, -2), do, out=dkv)
            np.copyto(outs["v"].reshape(b, skv, hkv, d), dkv.transpose(0, 2, 1, 3))
            if wrt == "v":
                return
        np.copyto(s.vt, s.heads_kv(v, True))
        np.matmul(do, s.vt, out=ds)  # dP
        with np.errstate(invalid="ignore"):
            np.multiply(ds, s.p, out=tmp)
            np.sum(tmp, axis=-1, keepdims=True, out=s.row)  # rowsum(P ⊙ dP)
            np.subtract(ds, s.row, out=ds)
            np.multiply(ds, s.p, out=ds)
        if wrt == "mask":
            np.copyto(out, s.as_heads(ds))
            return
        np.multiply(ds, s.scale, out=ds)
        if wrt in ("q", "qkv"):
            np.matmul(ds, s.kt.swapaxes(-1, -2), out=dq)
            np.copyto(outs["q"].reshape(b, sq, h, d), s.as_heads(dq).transpose(0, 2, 1, 3))
        if wrt in ("k", "qkv"):
            np.matmul(ds.swapaxes(-1, -2), s.qs, out=dkv)
            np.copyto(outs["k"].reshape(b, skv, hkv, d), dkv.transpose(0, 2, 1, 3))

    return run


@kind(KernelKind.BLAS)
@lowp
def attention_jvp_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The attention output's tangent in the grouped layout (BLAS)."""
    op = node.op.fwd  # type: ignore[attr-defined]
    n = len(ins) // 2
    q, k, v = ins[:3]
    mask = ins[3] if n == 4 else None
    tq, tk, tv = ins[n : n + 3]
    tmask = ins[-1] if n == 4 else None
    s = _Grouped(op, q, k, ctx)
    b, sq, skv, h, d, hkv = s.dims
    dt = q.dtype
    tqs = ctx.scratch(s.qs.shape, dt, _T + 30)
    tkt = ctx.scratch(s.kt.shape, dt, _T + 31)
    ts = ctx.scratch(s.p.shape, dt, _T + 32)
    tmp = ctx.scratch(s.p.shape, dt, _T + 33)
    vs = ctx.scratch((b, hkv, skv, d), dt, _T + 34)
    o = ctx.scratch(s.qs.shape, dt, _T + 35)
    o2 = ctx.scratch(s.qs.shape, dt, _T + 36)

    def run() -> None:
        s.probs(q, k, mask)
        np.copyto(s.as_heads(tqs), s.heads_q(tq))
        np.copyto(tkt, s.heads_kv(tk, True))
        np.matmul(tqs, s.kt, out=ts)
        np.matmul(s.qs, tkt, out=tmp)
        np.add(ts, tmp, out=ts)
        np.multiply(ts, s.scale, out=ts)
        if tmask is not None:
            np.add(s.as_heads(ts), tmask, out=s.as_heads(ts))
        with np.errstate(invalid="ignore"):
            np.multiply(ts, s.p, out=ts)  # P ⊙ S'
            np.sum(ts, axis=-1, keepdims=True, out=s.row)
            np.multiply(s.p, s.row, out=tmp)
            np.subtract(ts, tmp, out=ts)  # P' = P ⊙ S' - P ⊙ rowsum(P ⊙ S')
        np.copyto(vs, s.heads_kv(v, False))
        np.matmul(ts, vs, out=o)
        np.copyto(vs, s.heads_kv(tv, False))
        np.matmul(s.p, vs, out=o2)
        np.add(o, o2, out=o)
        np.copyto(out.reshape(b, sq, h, d), s.as_heads(o).transpose(0, 2, 1, 3))

    return run


# ---- rope --------------------------------------------------------------------------------


@lowp
def rope_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """``dcos`` / ``dsin``: two einsum reductions over batch and heads."""
    op = node.op
    a, b = rope_pairs(op.fwd, ins[0])  # type: ignore[attr-defined]
    ca, cb = rope_pairs(op.fwd, ins[1])  # type: ignore[attr-defined]
    tmp = ctx.scratch(out.shape, out.dtype, _T + 40)
    first, second = ((ca, a), (cb, b)) if op.wrt == "cos" else ((cb, a), (ca, b))  # type: ignore[attr-defined]
    sub = op.wrt == "sin"  # type: ignore[attr-defined]

    def run() -> None:
        np.einsum("bshr,bshr->sr", *first, out=out)
        np.einsum("bshr,bshr->sr", *second, out=tmp)
        (np.subtract if sub else np.add)(out, tmp, out=out)

    return run


# ---- convolution and pooling backward --------------------------------------------------


_TC = 350  # scratch tags of the conv and pool backward kernels: 350..


@kind(KernelKind.BLAS)
@lowp
def conv_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """dw by im2col: ``[G, O/G, N*L] @ [G, N*L, C/G*K]``, one GEMM per group."""
    x = ins[0]
    m = ConvColumns(node, ins, ctx, _TC)
    n, c, o, g, kk, length = m.shape
    win = window_view(m.xp, m.k, m.f.stride, m.f.dilation)  # [N,C,*out,*k], a view
    nd = len(m.k)
    # [N,G,C/G,*out,*k] -> [G,N,*out,C/G,*k]; splitting C keeps it a view of xp
    perm = (1, 0, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
    cols_src = win.reshape(n, g, c // g, *win.shape[2:]).transpose(perm)
    cols_dst = m.cols.reshape(g, n, *m.out_sp, c // g, *m.k)
    assert np.may_share_memory(cols_src, m.xp)  # a view: read afresh on every run
    dw = out.reshape(g, o // g, (c // g) * kk)

    def run() -> None:
        np.copyto(m.inner, x)
        np.copyto(cols_dst, cols_src)
        m.gather_ct()
        for gi in range(g):
            np.matmul(m.ctg[gi], m.cols[gi], out=dw[gi])

    return run


@kind(KernelKind.BLAS)
@lowp
def conv_backward_data_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """dx: the column gradient ``[G, N*L, O/G] @ w[G, O/G, C/G*K]``, then col2im tap by tap
    into a zero-bordered buffer whose interior is dx."""
    w = ins[1]
    m = ConvColumns(node, ins, ctx, _TC)
    n, c, o, g, kk, length = m.shape
    wg = w.reshape(g, o // g, (c // g) * kk)
    # dcols [G, N*L, C/G*K] -> per tap t: [N, G, C/G, *out]
    dcols = m.cols.reshape(g, n, *m.out_sp, c // g, kk)
    nd = len(m.k)
    perm = (1, 0, nd + 2, *range(2, nd + 2))  # [G,N,*out,C/G] -> [N,G,C/G,*out]
    taps = [
        (dcols[..., ti].transpose(perm), sl)
        for ti, (_, sl) in enumerate(window_taps(m.k, m.f.stride, m.f.dilation, m.out_sp))
    ]
    dxp = m.xp.reshape(n, g, c // g, *m.xp.shape[2:])

    def run() -> None:
        m.gather_ct()
        for gi in range(g):
            np.matmul(m.ctg[gi].T, wg[gi], out=m.cols[gi])
        m.xp.fill(0)
        for src, sl in taps:
            view = dxp[(..., *sl)]
            np.add(view, src, out=view)
        np.copyto(out, m.inner)

    return run


@lowp
def pool_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Max: the gradient added at each window's first maximum, tap by tap; average: ``ct /
    count`` (count precomputed) added over each window."""
    f = node.op.fwd  # type: ignore[attr-defined]
    x, ct = ins
    out_sp = ct.shape[2:]
    dxp, inner, taps = pool_geometry(f, x, out_sp, 0.0)
    share = ctx.scratch(ct.shape, ct.dtype, _TC + 13)
    if f.fn is PoolKind.AVG:
        ones = np.pad(np.ones(x.shape[2:], x.dtype), f.padding)
        count = sum(ones[sl] for sl in taps)

        def avg() -> None:
            np.divide(ct, count, out=share)
            dxp.fill(0)
            for sl in taps:
                view = dxp[(..., *sl)]
                np.add(view, share, out=view)
            np.copyto(out, inner)

        return avg
    first = FirstMax(f, x, out_sp, ctx, _TC + 10)
    hit = ctx.scratch(ct.shape, np.bool_, _TC + 14)

    def mx() -> None:
        first.run()
        dxp.fill(0)
        for i, sl in enumerate(taps):
            np.equal(first.idx, i, out=hit)
            np.multiply(ct, hit, out=share)
            view = dxp[(..., *sl)]
            np.add(view, share, out=view)
        np.copyto(out, inner)

    return mx


@lowp
@kind(KernelKind.NATIVE)
def native_max_pool2d_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``csrc/maxpool2d_grad.c`` for f32 contiguous views (None: the NumPy tap loop)."""
    x, ct = ins
    lib = _native_lib(ctx, [x, ct, out], "max pool 2-D backward", ("maxpool2d_grad.c",))
    if lib is None:
        return None
    f = node.op.fwd  # type: ignore[attr-defined]
    n, c, h, w = x.shape
    dims = (n * c, h, w, *ct.shape[2:], *f.window, *f.stride, f.padding[0][0], f.padding[1][0])
    threads = ctx.num_threads if x.size >= _PARALLEL_MIN else 1
    ptrs = [a.ctypes.data for a in (x, ct, out)]
    return functools.partial(lib.rlx_maxpool2d_grad_f32, *ptrs, *dims, threads)


@lowp
def max_pool_select_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """``t`` read at each window's first maximum of ``x``."""
    f = node.op.fwd  # type: ignore[attr-defined]
    x, t = ins
    out_sp = out.shape[2:]
    first = FirstMax(f, x, out_sp, ctx, _TC + 10)
    tp, tin, taps = pool_geometry(f, t, out_sp, 0.0)
    hit = ctx.scratch(out.shape, np.bool_, _TC + 14)

    def run() -> None:
        first.run()
        np.copyto(tin, t)
        for i, sl in enumerate(taps):
            np.equal(first.idx, i, out=hit)
            np.copyto(out, tp[(..., *sl)], where=hit)

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    LayerNormBackward: (norm_backward_kernel,),
    LayerNormBackwardGamma: (layer_norm_backward_gamma_kernel,),
    RmsNormBackward: (rms_norm_backward_kernel,),
    AttentionBackward: (attention_backward_kernel,),
    AttentionJvp: (attention_jvp_kernel,),
    RopeBackward: (rope_backward_kernel,),
    ConvBackwardWeight: (conv_backward_kernel,),
    ConvBackwardData: (conv_backward_data_kernel,),
    PoolBackward: (pool_backward_kernel,),
    MaxPool2dBackward: (native_max_pool2d_backward_kernel, pool_backward_kernel),
    MaxPoolSelect: (max_pool_select_kernel,),
}
