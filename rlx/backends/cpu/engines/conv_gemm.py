"""The convolutions of the Conv kernel that run on rlx's packed sgemm (called by
``engines/conv.py``'s :func:`~rlx.backends.cpu.engines.conv.native_conv`): in, a conv
node's geometry, its input / output views and the kernel context; out, a bound native
call, or None when the path does not apply.

* :func:`gemm`: per image and group ``out [O/G, L] = W [O/G, K] @ B [K, L]`` with B written
  straight into the sgemm's packed panels from the bordered input (conv.c's
  ``rlx_conv2d_gemm_f32``: no im2col matrix); bias as a ones row, residual and
  activation in the epilogue;
* :func:`gemm_t`: small output planes (at most :data:`_GEMM_T_MAX_PLANE` positions, no more
  than the output channels: a ResNet's 14x14 / 7x7 stages) as the transposed product
  ``[L, K] @ W^T [K, O]`` with the weight packed once as the sgemm's B
  (``rlx_conv2d_gemm_t_f32``);
* :func:`winograd`: 3x3 stride-1 convs as Winograd F(2x2, 3x3) (``conv_winograd.c``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind
from rlx.backends.cpu.engines.conv import DIRECT_MAX_MACS, ConvAct, Geometry, act_note, f32_bits
from rlx.dtype import DType
from rlx.ops.core import Constant

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["gemm", "gemm_t", "weight_kind"]

_GEMM_MIN_ROWS = 8  # output channels per group (and taps) from which the sgemm path runs
_GEMM_BLOCK_BYTES = 1 << 20  # packed input columns per block (about L2)
_GEMM_MIN_MACS = 1 << 20  # per image and group; below, the direct loop when it applies
_SLACK = 64  # CONV_SLACK of conv.c
_GEMM_MIN_BLOCK = 512  # columns per block at least (the weight is repacked per block)
_GEMM_T_MAX_PLANE = 256  # output positions up to which the transposed product may run


def weight_kind(ctx: KernelCtx, node: Node, i: int) -> str:
    """ "const", "stable" or "call" (a low-precision weight is widened into scratch on
    every call by ``dispatch.lowp``: "call")."""
    nid = node.inputs[i]
    if ctx.graph.nodes[nid].dtype is not DType.F32:
        return "call"
    if isinstance(ctx.graph.nodes[nid].op, Constant):
        return "const"
    return "stable" if nid in ctx.stable else "call"


def gemm(
    lib: ctypes.CDLL,
    node: Node,
    geo: Geometry,
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    out: np.ndarray,
    ctx: KernelCtx,
    act: ConvAct = ConvAct.NONE,
    lo: float = 0.0,
    hi: float = 0.0,
    res: np.ndarray | None = None,
) -> Kernel | None:
    """The convolution as one packed sgemm per image and group (conv.c's
    ``rlx_conv2d_gemm_f32``), ``act(conv + bias + res)`` in its epilogue, or None when the
    output channels per group are too few for the GEMM's row tiles or the native sgemm is
    unavailable."""
    og, cg = geo.o // geo.groups, geo.c // geo.groups
    kq = cg * geo.kh * geo.kw
    if og < _GEMM_MIN_ROWS or kq < _GEMM_MIN_ROWS or min(geo.ph, geo.pw) < 0:
        return None
    small = og * kq * geo.oh * geo.ow < _GEMM_MIN_MACS
    if small and kq * geo.oh * geo.ow <= DIRECT_MAX_MACS:
        return None  # the direct loop (measured faster on the small CNN's 16x16 planes)
    from rlx.backends.cpu.engines.sgemm import native_sgemm

    slib = native_sgemm(ctx)
    if slib is None or slib.nr != int(lib.rlx_conv_nr()):
        return None
    hp, wp = geo.bordered()
    has_bias = bias is not None
    kp = kq + int(has_bias)
    length = geo.oh * geo.ow
    # the weight with the bias as its last column, kept current like sgemm's packed weights
    kinds = {weight_kind(ctx, node, 1)}
    if has_bias:
        kinds.add(weight_kind(ctx, node, 2))
    kind = "call" if "call" in kinds else ("stable" if "stable" in kinds else "const")
    key = ("conv.gemm.weight", node.inputs[1], node.inputs[2] if has_bias else None, geo.o, kp)

    def make_wa() -> np.ndarray:
        return np.empty((geo.o, kp), np.float32)

    wa = make_wa() if kind == "call" else ctx.keep(key, make_wa)
    w2 = w.reshape(geo.o, kq)

    def fill() -> None:
        wa[:, :kq] = w2
        if bias is not None:
            wa[:, kq] = bias

    steps: list[Kernel] = []
    if kind == "const":
        ctx.keep((*key, "filled"), fill)
    elif kind == "stable":
        ctx.prologue_once(key, fill)  # type: ignore[arg-type]
    else:
        steps.append(fill)  # type: ignore[arg-type]
    direct = geo.ph == geo.pw == 0 and (hp, wp) == (geo.h, geo.w)
    # a private bordered input with readable slack around it (conv.c's CONV_SLACK)
    xbuf = None if direct else np.zeros(geo.n * geo.c * hp * wp + 2 * _SLACK, np.float32)
    xp = x if xbuf is None else xbuf[_SLACK:-_SLACK]
    threads = ctx.num_threads
    nr = slib.nr
    ncb = max(_GEMM_MIN_BLOCK, _GEMM_BLOCK_BYTES // (4 * kp)) // nr * nr
    if act in (ConvAct.RELU6, ConvAct.CLIP) or (res is not None and act is not ConvAct.NONE):
        # the clamp runs over the block's output after the sgemm: keep that in L2 too
        ncb = min(ncb, max(_GEMM_MIN_BLOCK, _GEMM_BLOCK_BYTES // 2 // (4 * og)) // nr * nr)
    ncb = min(ncb, -(-length // nr) * nr)
    bp = np.empty(threads * ncb * kp + 16, np.float32)
    p = np.array(
        [
            *geo.params(),
            slib.nr,
            int(has_bias),
            act.code,
            hp,
            wp,
            f32_bits(lo),
            f32_bits(hi),
            ncb,
        ],
        np.int64,
    )
    addr = ctypes.cast(slib.lib.rlx_sgemm, ctypes.c_void_p).value
    call = functools.partial(
        lib.rlx_conv2d_gemm_f32,
        x.ctypes.data,
        xp.ctypes.data,
        wa.ctypes.data,
        out.ctypes.data,
        None if res is None else res.ctypes.data,
        bp.ctypes.data,
        p.ctypes.data,
        addr,
        threads,
    )
    keep = (p, xbuf, bp, wa, slib)
    ctx.kind = KernelKind.NATIVE
    ctx.notes.append(
        f"native conv on {slib.label}: {og}x{length}x{kp} per image and group, B packed "
        f"from the input (no im2col){', bias as a ones row' if has_bias else ''}"
        f"{', residual in the epilogue' if res is not None else ''}{act_note(act)}"
    )
    if not steps:
        call.keep = keep  # type: ignore[attr-defined]
        return call

    def run() -> None:
        for s in steps:
            s()
        call()

    run.keepalive = keep  # type: ignore[attr-defined]
    return run


def gemm_t(
    lib: ctypes.CDLL,
    node: Node,
    geo: Geometry,
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    out: np.ndarray,
    ctx: KernelCtx,
    act: ConvAct,
    lo: float,
    hi: float,
    res: np.ndarray | None,
) -> Kernel | None:
    """A small output plane (at most :data:`_GEMM_T_MAX_PLANE` positions, fewer than the
    output channels): the product transposed, ``[L, K] @ W^T [K, O]`` with the weight
    packed once as the sgemm's B (conv.c's ``rlx_conv2d_gemm_t_f32``), or None."""
    length = geo.oh * geo.ow
    kq = geo.c * geo.kh * geo.kw
    if geo.groups != 1 or min(geo.ph, geo.pw) < 0 or kq < _GEMM_MIN_ROWS:
        return None
    if length > _GEMM_T_MAX_PLANE or length > geo.o or geo.o * kq * length < _GEMM_MIN_MACS:
        return None
    from rlx.backends.cpu.engines.sgemm import native_sgemm

    slib = native_sgemm(ctx)
    if slib is None:
        return None
    hp, wp = geo.bordered()
    kind = weight_kind(ctx, node, 1)
    size = slib.packed_size(kq, geo.o)
    key = ("conv.gemm_t.weight", node.inputs[1], geo.o, kq, slib.isa)

    def make() -> np.ndarray:
        return np.empty(size + 16, np.float32)

    packed = make() if kind == "call" else ctx.keep(key, make)
    w2 = w.reshape(geo.o, kq)  # W^T [K, O]: row stride 1, column stride K
    args = (w2.ctypes.data, 1, kq, kq, geo.o, packed.ctypes.data, 1)
    pack = slib.lib.rlx_sgemm_pack_b
    if kind == "const":
        ctx.keep((*key, "packed"), lambda: pack(*args))
    elif kind == "stable":
        ctx.prologue_once(key, lambda: pack(*args))  # type: ignore[arg-type, return-value]
    direct = geo.ph == geo.pw == 0 and (hp, wp) == (geo.h, geo.w)
    xp = x if direct else np.zeros(geo.n * geo.c * hp * wp, np.float32)
    cols = np.empty(kq * length + 16, np.float32)
    yt = np.empty(length * geo.o + 16, np.float32)
    p = np.array(
        [*geo.params(), slib.nr, int(bias is not None), act.code, hp, wp, f32_bits(lo),
         f32_bits(hi), 0],
        np.int64,
    )  # fmt: skip
    addr = ctypes.cast(slib.lib.rlx_sgemm, ctypes.c_void_p).value
    call = functools.partial(
        lib.rlx_conv2d_gemm_t_f32,
        x.ctypes.data,
        xp.ctypes.data,
        cols.ctypes.data,
        packed.ctypes.data,
        None if bias is None else bias.ctypes.data,
        out.ctypes.data,
        None if res is None else res.ctypes.data,
        yt.ctypes.data,
        p.ctypes.data,
        addr,
        ctx.num_threads,
    )
    keep = (p, xp, cols, yt, packed, slib)
    ctx.kind = KernelKind.NATIVE
    ctx.notes.append(
        f"native conv on {slib.label}, transposed: {length}x{geo.o}x{kq} per image, the "
        f"weight packed once as B, im2col of the small plane"
        f"{', residual in the epilogue' if res is not None else ''}{act_note(act)}"
    )
    if kind != "call":
        call.keep = keep  # type: ignore[attr-defined]
        return call

    def run() -> None:
        pack(*args)
        call()

    run.keepalive = keep  # type: ignore[attr-defined]
    return run
