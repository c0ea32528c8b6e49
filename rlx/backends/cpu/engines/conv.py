"""Convolution and pooling helpers of the Conv / Pool kernels (``kernels/nn.py``) and their
backward (``kernels/nn_grad.py``): every strided, dilated window of a bordered input as a
view (``window_view``, ``bordered``), and the native direct convolution and pooling
(``native/csrc/conv.c``) for f32 NCHW 1-D / 2-D convolutions and pools, the path the Conv
and Pool kernels take first. In: the node, its input / output views and the kernel context. Out: a bound C call
(a ctypes partial, so it joins the native schedule), or None with a note when it does not
apply (another dtype, a non-contiguous view, native kernels off or no gcc), and the
caller keeps its im2col + BLAS / NumPy path.

The direct loop beats im2col + BLAS where the arithmetic is small next to the copies
(the small CNNs people export: a few channels, 3x3 windows); a convolution of more than
:data:`DIRECT_MAX_MACS` multiply-adds per image and output channel goes to BLAS.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind
from rlx.backends.cpu.native import bindings
from rlx.backends.cpu.native.cpu import selected_target
from rlx.ops.nn import Conv, Pool, PoolKind
from rlx.ops.nn import ConvAct as OpAct
from rlx.ops.nn_grad import window_taps

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "window_view",
    "bordered",
    "native_conv",
    "conv_inputs",
    "conv_epilogue",
    "then",
    "ConvAct",
    "native_pool",
    "conv_lib",
    "DIRECT_MAX_MACS",
    "ConvColumns",
    "pool_geometry",
    "FirstMax",
    "Geometry",
    "f32_bits",
    "act_note",
]

#: above this many multiply-adds per (image, output channel) the BLAS path is taken
DIRECT_MAX_MACS = 1 << 17
_PARALLEL_MIN_MACS = 1 << 21  # below this many multiply-adds (~30-60 us on one thread) no team
_PARALLEL_MIN_POOL = 1 << 16  # window reads below which a pool runs on one thread
_CHUNK = 16  # RLX_CONV_CHUNK of conv.c


class ConvAct(Enum):
    """An activation applied in a convolution's epilogue (conv.c's ``act`` codes)."""

    NONE = "none"
    RELU = "relu"
    RELU6 = "relu6"
    CLIP = "clip"

    @property
    def code(self) -> int:
        return {"none": 0, "relu": 1, "relu6": 5, "clip": 6}[self.value]

    @staticmethod
    def of(op: Conv) -> tuple[ConvAct, float, float]:
        """(epilogue, lo, hi) of a conv's fused activation (``op.act``, ``op.clip``)."""
        if op.act is OpAct.RELU:
            return ConvAct.RELU, 0.0, 0.0
        if op.act is OpAct.CLIP:
            lo, hi = op.clip
            return (ConvAct.RELU6, 0.0, 6.0) if (lo, hi) == (0.0, 6.0) else (ConvAct.CLIP, lo, hi)
        return ConvAct.NONE, 0.0, 0.0


def conv_inputs(
    op: Conv, ins: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(x, w, bias or None, residual or None) of a conv node's input arrays."""
    bias = ins[2] if op.has_bias else None
    return ins[0], ins[1], bias, ins[-1] if op.has_residual else None


def conv_epilogue(op: Conv, out: np.ndarray, res: np.ndarray | None) -> Kernel | None:
    """``out = act(out + res)`` in place, by NumPy: a fused conv's residual and activation
    on the paths whose kernel does not apply them; None when there is nothing to do."""
    if op.act is OpAct.NONE and res is None:
        return None
    lo, hi = (0.0, None) if op.act is OpAct.RELU else op.clip

    def run() -> None:
        if res is not None:
            np.add(out, res, out=out)
        if op.act is not OpAct.NONE:
            np.maximum(out, lo, out=out)
            if hi is not None:
                np.minimum(out, hi, out=out)

    return run


def then(first: Kernel, second: Kernel | None) -> Kernel:
    """``first`` then ``second`` (``first`` alone when ``second`` is None)."""
    if second is None:
        return first

    def run() -> None:
        first()
        second()

    run.keepalive = (first, second)  # type: ignore[attr-defined]
    return run


def window_view(
    xp: np.ndarray, k: Sequence[int], stride: Sequence[int], dil: Sequence[int]
) -> np.ndarray:
    """``[N,C,*sp]`` -> ``[N,C,*out,*k]``: every (strided, dilated) window, as a view."""
    nd = len(k)
    spans = [d * (kk - 1) + 1 for kk, d in zip(k, dil, strict=True)]
    v = np.lib.stride_tricks.sliding_window_view(xp, spans, axis=tuple(range(2, 2 + nd)))
    idx = (
        slice(None),
        slice(None),
        *(slice(None, None, s) for s in stride),
        *(slice(None, None, d) for d in dil),
    )
    return v[idx]


def bordered(
    x: np.ndarray, pads: Sequence[tuple[int, int]], fill: float
) -> tuple[np.ndarray, np.ndarray]:
    """A private buffer of ``x``'s shape plus ``pads`` on the spatial axes, filled with
    ``fill``, and the view of its interior where ``x`` goes."""
    shape = x.shape[:2] + tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[2:], pads, strict=True))
    buf = np.full(shape, fill, dtype=x.dtype)
    inner = buf[
        (
            slice(None),
            slice(None),
            *(slice(lo, lo + n) for n, (lo, _) in zip(x.shape[2:], pads, strict=True)),
        )
    ]
    return buf, inner


def conv_lib() -> ctypes.CDLL:
    """The conv library for the selected native target. CompileError without gcc or when
    the build fails."""
    return bindings.csrc_library(("conv.c", "conv_dw.c"), selected_target(), "conv")


def _lib(ctx: KernelCtx, what: str) -> ctypes.CDLL | None:
    return bindings.lib_or_note(ctx, what, conv_lib)


def _f32_contiguous(*xs: np.ndarray) -> bool:
    return all(x.dtype == np.float32 and x.flags.c_contiguous for x in xs)


def _as_2d(dims: tuple[int, ...]) -> tuple[int, int]:
    return (1, dims[0]) if len(dims) == 1 else (dims[0], dims[1])


def native_conv(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The direct f32 convolution, or None."""
    op: Conv = node.op  # type: ignore[assignment]
    x, w, bias, res = conv_inputs(op, ins)
    extra = tuple(a for a in (bias, res) if a is not None)
    if not _f32_contiguous(x, w, out, *extra):
        return None
    nd = x.ndim - 2
    if nd not in (1, 2) or x.size == 0 or out.size == 0:
        return None
    n, c = x.shape[:2]
    o = w.shape[0]
    taps = math.prod(w.shape[1:])
    plane = math.prod(out.shape[2:])
    lib = _lib(ctx, "conv")
    if lib is None:
        return None
    (hh, ww), (kh, kw), (oh, ow) = (_as_2d(s) for s in (x.shape[2:], w.shape[2:], out.shape[2:]))
    (sh, sw), (dh, dw) = _as_2d(op.stride), _as_2d(op.dilation)
    (ph, _), (pw, _) = ((0, 0), op.padding[0]) if nd == 1 else op.padding
    geo = Geometry(n, c, hh, ww, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, op.groups)
    from rlx.backends.cpu.engines import conv_gemm as cg
    from rlx.backends.cpu.engines.conv_nchwc import depthwise, nchwc, pointwise

    act, lo, hi = ConvAct.of(op)
    fast = nchwc(node, geo, x, w, bias, out, ctx, act, lo, hi, res)
    fast = fast or pointwise(geo, x, w, bias, out, ctx, act, lo, hi, res)
    fast = fast or depthwise(node, geo, x, w, bias, out, ctx, act, lo, hi, res)
    fast = fast or cg.gemm_t(lib, node, geo, x, w, bias, out, ctx, act, lo, hi, res)
    fast = fast or cg.gemm(lib, node, geo, x, w, bias, out, ctx, act, lo, hi, res)
    if fast is not None:
        return fast
    if res is None:
        fast = _depthwise(lib, geo, x, w, bias, out, ctx, act, lo, hi)
    else:  # the residual after the kernel, then the activation
        fast = _depthwise(lib, geo, x, w, bias, out, ctx)
        fast = None if fast is None else then(fast, conv_epilogue(op, out, res))
    if fast is not None:
        return fast
    if taps * plane > DIRECT_MAX_MACS:
        return None
    post = conv_epilogue(op, out, res)
    p = np.array(
        [n, c, hh, ww, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, op.groups], dtype=np.int64
    )
    threads = ctx.num_threads if n * o * taps * plane >= _PARALLEL_MIN_MACS else 1
    ctx.kind = KernelKind.NATIVE
    if sh == sw == 1:
        # private buffers: the bordered input (border zeroed once) and per-thread sums
        hp, wp = oh + (kh - 1) * dh, ow + (kw - 1) * dw
        chunk = _CHUNK  # the C loop reads whole chunks: slack after the last plane
        xp = np.zeros(n * c * hp * wp + chunk, np.float32)
        ws = np.empty(threads * 4 * (oh * wp + chunk), np.float32)
        call = functools.partial(
            lib.rlx_conv2d_wide_f32,
            x.ctypes.data,
            xp.ctypes.data,
            ws.ctypes.data,
            w.ctypes.data,
            None if bias is None else bias.ctypes.data,
            out.ctypes.data,
            p.ctypes.data,
            threads,
        )
        call.keep = (p, xp, ws)  # type: ignore[attr-defined]  # the C code reads them
        ctx.notes.append(f"native direct conv, stride 1 ({taps} taps x {plane} outputs)")
        return then(call, post)
    call = functools.partial(
        lib.rlx_conv2d_f32,
        x.ctypes.data,
        w.ctypes.data,
        None if bias is None else bias.ctypes.data,
        out.ctypes.data,
        p.ctypes.data,
        threads,
    )
    call.keep = p  # type: ignore[attr-defined]  # the C code reads it on every call
    ctx.notes.append(f"native direct conv ({taps} taps x {plane} outputs per channel)")
    return then(call, post)


@dataclass(frozen=True)
class Geometry:
    """A 2-D convolution's sizes (1-D as H = 1): the first 16 entries of conv.c's ``p``."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    oh: int
    ow: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    groups: int

    def bordered(self) -> tuple[int, int]:
        """(Hp, Wp): rows / columns of a zero-bordered input every tap reads inside."""
        hp = max(self.h + self.ph, (self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1)
        wp = max(self.w + self.pw, (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1)
        return hp, wp

    def params(self) -> list[int]:
        return list(astuple(self))


def f32_bits(v: float) -> int:
    return int(np.array(v, np.float32).view(np.int32))


def _depthwise(
    lib: ctypes.CDLL,
    geo: Geometry,
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    out: np.ndarray,
    ctx: KernelCtx,
    act: ConvAct = ConvAct.NONE,
    lo: float = 0.0,
    hi: float = 0.0,
) -> Kernel | None:
    """The depthwise kernel (groups == C, O a multiple of C), or None."""
    if geo.groups != geo.c or geo.o % geo.c or geo.groups == 1 or min(geo.ph, geo.pw) < 0:
        return None
    hp, wp = geo.bordered()
    vl = int(lib.rlx_conv_dw_l())  # whole vectors of outputs read inside each row
    span = -(-geo.ow // vl) * vl
    wq = 0
    if geo.sw == 1:
        wp = max(wp, span + (geo.kw - 1) * geo.dw)
    elif geo.sw == 2:  # each row split into its even and odd columns, wq floats each
        wq = max(span + (geo.kw - 1) * geo.dw // 2, -(-wp // 2))
        wp = 2 * wq
    p = np.array([*geo.params(), act.code, f32_bits(lo), f32_bits(hi), hp, wp, wq], np.int64)
    macs = geo.n * geo.o * geo.oh * geo.ow * geo.kh * geo.kw
    threads = ctx.num_threads if macs >= _PARALLEL_MIN_MACS // 4 else 1
    xp = np.zeros(threads * (hp * wp + hp * 2 * wq), np.float32)
    call = functools.partial(
        lib.rlx_conv2d_depthwise_f32,
        x.ctypes.data,
        w.ctypes.data,
        None if bias is None else bias.ctypes.data,
        out.ctypes.data,
        xp.ctypes.data,
        p.ctypes.data,
        threads,
    )
    call.keep = (p, xp)  # type: ignore[attr-defined]  # the C code reads them
    ctx.kind = KernelKind.NATIVE
    ctx.notes.append(f"native depthwise conv {geo.kh}x{geo.kw}{act_note(act)}")
    return call


def act_note(act: ConvAct) -> str:
    return "" if act is ConvAct.NONE else f", {act.value} in the epilogue"


def native_pool(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The f32 max / average pool over 1-D or 2-D windows, or None."""
    op: Pool = node.op  # type: ignore[assignment]
    (x,) = ins
    nd = x.ndim - 2
    if nd not in (1, 2) or not _f32_contiguous(x, out) or out.size == 0:
        return None
    if op.fn not in (PoolKind.MAX, PoolKind.AVG):
        return None
    lib = _lib(ctx, "pool")
    if lib is None:
        return None
    (hh, ww), (kh, kw), (oh, ow) = (_as_2d(s) for s in (x.shape[2:], op.window, out.shape[2:]))
    sh, sw = _as_2d(op.stride)
    (ph, _), (pw, _) = ((0, 0), op.padding[0]) if nd == 1 else op.padding
    kind = 0 if op.fn is PoolKind.MAX else 1
    nc = x.shape[0] * x.shape[1]
    p = np.array([nc, hh, ww, oh, ow, kh, kw, sh, sw, ph, pw, kind], dtype=np.int64)
    threads = ctx.num_threads if out.size * kh * kw >= _PARALLEL_MIN_POOL else 1
    call = functools.partial(
        lib.rlx_pool2d_f32, x.ctypes.data, out.ctypes.data, p.ctypes.data, threads
    )
    call.keep = p  # type: ignore[attr-defined]
    ctx.kind = KernelKind.NATIVE
    ctx.notes.append(f"native {op.fn.value} pool")
    return call


# ---- backward: im2col geometry and pooling windows ---------------------------------------


class ConvColumns:
    """im2col geometry of one conv backward node: x ``[N,C,*sp]``, w ``[O,C/G,*k]``,
    ct ``[N,O,*out]``; a zero-bordered private copy of x (dw) or of dx (dx); the columns
    and the gathered output gradient in scratch (tags ``tag``, ``tag + 1``)."""

    def __init__(self, node: Node, ins: list[np.ndarray], ctx: KernelCtx, tag: int) -> None:
        f = node.op.fwd  # type: ignore[attr-defined]
        x, w, ct = ins
        self.f = f
        n, c = x.shape[:2]
        o, g = w.shape[0], f.groups
        self.k = w.shape[2:]
        self.out_sp = ct.shape[2:]
        kk, length = math.prod(self.k), math.prod(self.out_sp)
        self.shape = (n, c, o, g, kk, length)
        dt = x.dtype
        self.xp, self.inner = bordered(x, f.padding, 0.0)  # private: its border stays zero
        # [G, N*L, C/G*K] columns and [G, O/G, N*L] output gradient
        self.cols = ctx.scratch((g, n * length, (c // g) * kk), dt, tag)
        self.ctg = ctx.scratch((g, o // g, n * length), dt, tag + 1)
        self.ct_src = ct.reshape(n, g, o // g, length).transpose(1, 2, 0, 3)

    def gather_ct(self) -> None:
        """Copy the output gradient into ``ctg``."""
        n, _, o, g, _, length = self.shape
        np.copyto(self.ctg.reshape(g, o // g, n, length), self.ct_src)


def pool_geometry(
    f, x: np.ndarray, out_sp: tuple, fill: float
) -> tuple[np.ndarray, np.ndarray, list]:  # noqa: ANN001
    """(private bordered buffer, its interior view, taps) of the pool ``f`` over ``x``."""
    buf, inner = bordered(x, f.padding, fill)
    taps = [sl for _, sl in window_taps(f.window, f.stride, (1,) * len(f.window), out_sp)]
    return buf, inner, taps


class FirstMax:
    """Index of each window's first maximum (strict ``>`` tap by tap: the first wins);
    scratch tags ``tag`` to ``tag + 2``."""

    def __init__(self, f, x: np.ndarray, out_sp: tuple, ctx: KernelCtx, tag: int) -> None:  # noqa: ANN001
        self.x = x
        self.xp, self.inner, self.taps = pool_geometry(f, x, out_sp, -np.inf)
        shape = (*x.shape[:2], *out_sp)
        self.best = ctx.scratch(shape, x.dtype, tag)
        self.idx = ctx.scratch(shape, np.int32, tag + 1)
        self.gt = ctx.scratch(shape, np.bool_, tag + 2)

    def run(self) -> None:
        """Fill ``idx`` from the current ``x``."""
        np.copyto(self.inner, self.x)
        np.copyto(self.best, self.xp[(..., *self.taps[0])])
        self.idx.fill(0)
        for i, sl in enumerate(self.taps[1:], 1):
            cand = self.xp[(..., *sl)]
            np.greater(cand, self.best, out=self.gt)
            np.copyto(self.best, cand, where=self.gt)
            np.copyto(self.idx, i, where=self.gt)
