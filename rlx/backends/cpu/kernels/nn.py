"""CPU kernels of the ``rlx/ops/nn.py`` family: multi-head attention, rotary embedding,
convolution and pooling.

Attention, native (``native/attention.py``, ``csrc/attention.c``): one fused kernel per
node, flash style (per batch, head and block of query rows: scores against blocks of
keys, an online softmax in f32 and the value product, so no [B, H, Sq, Skv] score matrix
exists), OpenMP over the blocks with ``KernelCtx.num_threads``, the AVX-512 / AVX2 / plain
C path of the selected build target; every mask kind and grouped-query heads. f32, bf16
and f16 q, k, v (f16 not on the portable target) are read directly, the arithmetic is
f32 and the output is rounded once; a non-f32 custom mask is cast to f32 scratch before
each run (the reference adds it in f32). Reported as ``native attention (avx512|avx2|c)``.
It declines (noted; the BLAS kernel below runs) for f64 and fp8, without native kernels
or gcc, for non-contiguous views and for an empty sequence; there is no size threshold:
it was faster than the BLAS kernel at every shape measured, from MiniLM's 1 x 16 (1.6x)
to decode steps (Sq = 1: 10x for H=32, Hkv=8, D=128 against 2048 keys in
benchmarks/results/BENCHMARKS_attention.md; 1.7-6.5x on the other decode shapes tried).

Attention, BLAS: two batched BLAS matmuls per call into scratch allocated when the
schedule is built (no allocation per run).

Layout: q is copied to [B, Hkv, G*Sq, D] (G = H / Hkv query heads share one kv head, so
grouped-query attention is one matmul per kv head), k to [B, Hkv, D, Skv], v to
[B, Hkv, Skv, D]; scores [B, Hkv, G*Sq, Skv] are scaled, masked, soft-maxed in place
(max subtracted; a row of only ``-inf``, a query that sees no key, gives zeros, as the
reference), multiplied by v, and the heads are copied back into the packed
[B, Sq, H*D] output. f16/bf16 compute in f32 (an f32 mask is added in f32). With native
kernels on, the scale and the softmax are one native row pass (``engines.rows``; the
scale is applied by NumPy first when a mask is added); the NumPy passes otherwise.

Rotary embedding writes both halves of each rotated pair with ufuncs into strided views
of the output (two scratch products per half), and copies the pass-through dims.

Convolution and pooling (1-D and 2-D): f32 through the native direct loops of
``engines/conv.py`` when they apply (small convolutions, every pool), else by im2col +
BLAS. Each kernel owns a zero- (or -inf-) bordered copy of its input, allocated when the
schedule is built (private, not pooled, so its border survives between runs); a run
copies the input into its interior and reads every window through a strided view. Conv:
the windows are gathered into a ``[G, N*L, C/G*K]`` column buffer (L output positions, K
kernel taps) and multiplied by the ``[G, C/G*K, O/G]`` weights, one 2-D GEMM per group,
then scattered into ``[N, O, *out]`` (plus bias). Pool: max or sum over the window axes
with ``out=``; average divides by the precomputed count of real (unpadded) elements per
window, as the reference. f16/bf16 compute in f32.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.codegen.elementwise import C_TYPES, CodegenUnsupported
from rlx.backends.cpu.codegen.rows import RowKind, RowSpec
from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind, lowp
from rlx.backends.cpu.engines.conv import (
    bordered,
    conv_epilogue,
    conv_inputs,
    native_conv,
    native_pool,
    then,
    window_view,
)
from rlx.backends.cpu.engines.rows import row_kernel
from rlx.backends.cpu.native.attention import attention_lib, dtype_code
from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.ops.nn import Attention, Conv, Pool, PoolKind, Rope

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "native_attention",
    "blas_attention",
    "rope_kernel",
    "conv_kernel",
    "pool_kernel",
]

F32 = np.dtype(np.float32)
#: Below this many (score x head dim) products a native call runs on one thread, as the
#: regions' PARALLEL_MIN_WORK: at 1 << 18 one thread takes ~25 us (measured: H=12, D=32,
#: S=24, AVX-512), about what waking a PASSIVE OpenMP worker costs on a quiet machine, and
#: far less than the ~250 us it waited for its core at load average 5 on 2 cores. MiniLM's
#: 1 x 16 (98304) stays on one thread, 1 x 64 and up use the team.
_MIN_PARALLEL_WORK = 1 << 18


@kind(KernelKind.NATIVE)
def native_attention(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The fused native kernel for contiguous f32 / bf16 / f16 views (module docstring);
    None, with a note in ``ctx.notes``, when it does not apply (``blas_attention`` runs)."""
    op: Attention = node.op  # type: ignore[assignment]
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) == 4 else None
    why = _native_declines(q, k, v, out, ctx)
    if why is not None:
        if why:
            ctx.notes.append(f"BLAS attention ({why})")
        return None
    try:
        lib = attention_lib(dtype=q.dtype)
    except CompileError as e:
        ctx.notes.append(f"BLAS attention (native build: {str(e).splitlines()[0]})")
        return None
    b, sq, _ = q.shape
    skv = k.shape[1]
    h, d, hkv = op.num_heads, op.head_dim, op.kv_heads
    work = b * h * sq * skv * d
    threads = ctx.num_threads if lib.openmp and work >= _MIN_PARALLEL_WORK else 1
    ws = ctx.scratch((lib.workspace_floats(d, threads),), F32, 59)
    mtype = op.mask.type
    m32 = mask
    fill = None
    if mask is not None and (mask.dtype != F32 or any(s % 4 for s in mask.strides)):
        m32 = ctx.scratch(mask.shape, F32, 60)
        fill = (m32, mask)
    args = dict(num_heads=h, num_kv_heads=hkv, head_dim=d, scale=op.effective_scale)
    args |= dict(mask_type=mtype, window=op.mask.window, workspace=ws, num_threads=threads)
    call = lib.prepare(q, k, v, out, mask=m32, **args)
    ctx.kind = KernelKind.NATIVE
    ctx.notes.append(f"native attention ({lib.path})")
    if fill is None:
        return call

    def run() -> None:
        np.copyto(*fill, casting="unsafe")
        call()

    return run


def _native_declines(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, ctx: KernelCtx
) -> str | None:
    """Why the native kernel does not take these views ('' when silently: native
    kernels are off), or None when it does."""
    if not ctx.native:
        return ""
    if dtype_code(q.dtype) is None:
        return f"the native kernel takes f32, bf16 or f16, given {q.dtype}"
    if not all(x.flags.c_contiguous for x in (q, k, v, out)):
        return "a non-contiguous q, k, v or output view"
    if q.size == 0 or k.shape[1] == 0:
        return "an empty sequence"
    return None


@kind(KernelKind.BLAS)
@lowp
def blas_attention(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Scaled dot-product attention with BLAS batched matmuls (see module docstring)."""
    op: Attention = node.op  # type: ignore[assignment]
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) == 4 else None
    if q.dtype.kind != "f":
        return None
    b, sq, _ = q.shape
    skv = k.shape[1]
    h, d, hkv = op.num_heads, op.head_dim, op.kv_heads
    g = h // hkv
    dt = q.dtype
    qs = ctx.scratch((b, hkv, g * sq, d), dt, 50)
    kt = ctx.scratch((b, hkv, d, skv), dt, 51)
    vs = ctx.scratch((b, hkv, skv, d), dt, 52)
    s = ctx.scratch((b, hkv, g * sq, skv), dt, 53)
    row = ctx.scratch((b, hkv, g * sq, 1), dt, 54)
    o = ctx.scratch((b, hkv, g * sq, d), dt, 56)
    q_src = q.reshape(b, sq, h, d).transpose(0, 2, 1, 3)
    q_dst = qs.reshape(b, h, sq, d)
    k_src = k.reshape(b, skv, hkv, d).transpose(0, 2, 3, 1)
    v_src = v.reshape(b, skv, hkv, d).transpose(0, 2, 1, 3)
    s4 = s.reshape(b, h, sq, skv)
    out_dst = out.reshape(b, sq, h, d)
    o_src = o.reshape(b, h, sq, d).transpose(0, 2, 1, 3)
    scale = dt.type(op.effective_scale)
    allowed = op.mask.allowed(sq, skv)
    hidden = None if allowed is None else ~allowed
    ninf, lowest = dt.type(-np.inf), np.finfo(dt).min
    premask = mask is not None or hidden is not None
    fast = _native_softmax(s, scale, premask, ctx)

    def run() -> None:
        np.copyto(q_dst, q_src)
        np.copyto(kt, k_src)
        np.copyto(vs, v_src)
        np.matmul(qs, kt, out=s)
        if fast is not None:
            if premask:
                np.multiply(s, scale, out=s)
                if mask is not None:
                    np.add(s4, mask, out=s4)
                if hidden is not None:
                    np.copyto(s4, ninf, where=hidden)
            fast()
            np.matmul(s, vs, out=o)
            np.copyto(out_dst, o_src)
            return
        np.multiply(s, scale, out=s)
        if mask is not None:
            np.add(s4, mask, out=s4)
        if hidden is not None:
            np.copyto(s4, ninf, where=hidden)
        with np.errstate(invalid="ignore"):
            np.max(s, axis=-1, keepdims=True, out=row)
            np.maximum(row, lowest, out=row)  # a row of only -inf: exp against finfo.min, 0
            np.subtract(s, row, out=s)
            np.exp(s, out=s)
            np.sum(s, axis=-1, keepdims=True, out=row)
            np.maximum(row, 1, out=row)  # >= 1 when the row sees a key; else 0 -> 1
            np.divide(s, row, out=s)
        np.matmul(s, vs, out=o)
        np.copyto(out_dst, o_src)

    return run


def _native_softmax(s: np.ndarray, scale: float, premask: bool, ctx: KernelCtx) -> Kernel | None:
    """The native in-place softmax of the score rows (times ``scale`` unless a mask is
    added first, so NumPy scales), a row of -inf giving zeros; None (noted) without it."""
    if not ctx.native:
        return None
    try:
        ct = C_TYPES[DType.from_numpy(s.dtype)]
        spec = RowSpec(RowKind.SOFTMAX, ct, scaled=not premask, safe=True)
        return row_kernel(spec, [s, s], [], 0.0, ctx, scale=float(scale))
    except (CodegenUnsupported, CompileError, KeyError) as e:
        ctx.notes.append(f"NumPy softmax ({str(e).splitlines()[0]})")
        return None


@lowp
def rope_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``(a*cos - b*sin, b*cos + a*sin)`` per rotated pair, in the reference's order."""
    op: Rope = node.op  # type: ignore[assignment]
    x, cos, sin = ins
    if x.dtype.kind != "f":
        return None
    b, s, hd = x.shape
    d, r = op.head_dim, op.n_rot
    xh = x.reshape(b, s, hd // d, d)
    oh = out.reshape(b, s, hd // d, d)
    lo, hi = (
        (slice(0, r, 2), slice(1, r, 2)) if op.interleaved else (slice(0, r // 2), slice(r // 2, r))
    )
    a, bb = xh[..., lo], xh[..., hi]
    o_lo, o_hi = oh[..., lo], oh[..., hi]
    c, sn = cos[None, :, None, :], sin[None, :, None, :]
    t1 = ctx.scratch(a.shape, x.dtype, 57)
    t2 = ctx.scratch(a.shape, x.dtype, 58)
    rest = (oh[..., r:], xh[..., r:]) if r < d else None

    def run() -> None:
        if rest is not None:
            np.copyto(*rest)
        np.multiply(a, c, out=t1)
        np.multiply(bb, sn, out=t2)
        np.subtract(t1, t2, out=o_lo)
        np.multiply(bb, c, out=t1)
        np.multiply(a, sn, out=t2)
        np.add(t1, t2, out=o_hi)

    return run


# ---- convolution and pooling --------------------------------------------------------------


@kind(KernelKind.BLAS)
@lowp
def conv_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The native direct loop for small f32 convolutions (``engines/conv.py``),
    else im2col + one GEMM per group (see module docstring)."""
    direct = native_conv(node, ins, out, ctx)
    if direct is not None:
        return direct
    op: Conv = node.op  # type: ignore[assignment]
    x, w, bias, res = conv_inputs(op, ins)
    if x.dtype.kind != "f":
        return None
    n, c = x.shape[:2]
    o, g = w.shape[0], op.groups
    k = w.shape[2:]
    nd = len(k)
    cg, og, kk = c // g, o // g, math.prod(k)
    buf, inner = bordered(x, op.padding, 0.0)
    win = window_view(buf, k, op.stride, op.dilation)  # [N, C, *out, *k]
    out_sp = win.shape[2 : 2 + nd]
    length = math.prod(out_sp)
    cols = ctx.scratch((g, n, *out_sp, cg, *k), x.dtype, 72)
    src = win.reshape(n, g, cg, *out_sp, *k)
    if not np.may_share_memory(src, buf):  # splitting C is always a view; stay safe
        return None
    perm = (1, 0, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
    src_t = src.transpose(perm)
    cols2 = cols.reshape(g, n * length, cg * kk)
    wt = ctx.scratch((g, cg * kk, og), x.dtype, 70)
    w_src = w.reshape(g, og, cg * kk).transpose(0, 2, 1)
    ys = ctx.scratch((g, n * length, og), x.dtype, 71)
    y_src = ys.reshape(g, n, length, og).transpose(1, 0, 3, 2)
    o4 = out.reshape(n, g, og, length)
    b_view = None if bias is None else bias.reshape((o,) + (1,) * nd)

    def run() -> None:
        np.copyto(inner, x)
        np.copyto(cols.reshape(src_t.shape), src_t)
        np.copyto(wt, w_src)
        for gi in range(g):
            np.matmul(cols2[gi], wt[gi], out=ys[gi])
        np.copyto(o4, y_src)
        if b_view is not None:
            np.add(out, b_view, out=out)

    return then(run, conv_epilogue(op, out, res))


@lowp
def pool_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The native f32 pool (``engines/conv.py``), else max or average over a
    strided window view of a bordered private copy."""
    fast = native_pool(node, ins, out, ctx)
    if fast is not None:
        return fast
    op: Pool = node.op  # type: ignore[assignment]
    (x,) = ins
    if x.dtype.kind not in "fiu":
        return None
    nd = len(op.window)
    axes = tuple(range(-nd, 0))
    ones = (1,) * nd
    if op.fn is PoolKind.MAX:
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        buf, inner = bordered(x, op.padding, low)
        win = window_view(buf, op.window, op.stride, ones)

        def max_pool() -> None:
            np.copyto(inner, x)
            np.max(win, axis=axes, out=out)

        return max_pool
    buf, inner = bordered(x, op.padding, 0.0)
    win = window_view(buf, op.window, op.stride, ones)
    count_buf, count_inner = bordered(np.ones((1, 1, *x.shape[2:]), x.dtype), op.padding, 0.0)
    count_inner[...] = 1
    count = window_view(count_buf, op.window, op.stride, ones).sum(axis=axes)

    def avg_pool() -> None:
        np.copyto(inner, x)
        np.sum(win, axis=axes, out=out)
        np.divide(out, count, out=out)

    return avg_pool


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Attention: (native_attention, blas_attention),
    Rope: (rope_kernel,),
    Conv: (conv_kernel,),
    Pool: (pool_kernel,),
}
