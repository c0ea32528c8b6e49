"""The direct convolution over channel-blocked (NCHWc) activations (``csrc/conv_nchwc.c``),
called first by ``engines/conv.py``'s :func:`~rlx.backends.cpu.engines.conv.native_conv`
for the dense convolutions it suits: in, a conv node's geometry, its input / output views
and the kernel context; out, a bound native call, or None when the path does not apply.

Per call the input is reordered into CB-channel blocks (CB = 16 on AVX-512, 8 on AVX2, 4
on the aarch64 targets and portable: the library's ``rlx_nchwc_block``) inside a private
zero-bordered buffer, the weight is re-laid out once
(``rlx_nchwc_pack_w``: at bind for a constant, once per change for a parameter), and each
output row is computed a register tile of output positions x two blocks of output
channels at a time, with the bias, residual and activation in the epilogue that writes
the NCHW output. No im2col and no packed copy of the input per tap.

Taken for ``groups == 1`` windows larger than 1x1 (1x1 convs stay on the sgemm, which
reads the image as its own im2col matrix; measured no faster here) with at least CB output
channels. With fewer input channels than a block (a network's 3-channel stem) the input
stays NCHW and only the output channels are blocked: a block of 16 lanes would hold 3
channels (the stem ran at a fifth of the GEMM path's speed that way).

3x3 stride-1 undilated convs on planes of at least :data:`WINOGRAD_MIN_PLANE` outputs run
as Winograd F(2x2, 3x3) on the same blocks (``csrc/conv_winograd.c``: 16 multiplies per
2x2 tile instead of 36; the input / output transforms are vector adds over a channel
block): 3x3 64->64 @56 .. 256->256 @14 0.55-0.65x the direct kernel's time, measured.

:func:`pointwise`: 1x1 stride-1 convs straight on NCHW (``csrc/conv_pointwise.c``), no
packing and no layout change (a vector of positions is contiguous there already).

:func:`depthwise`: depthwise convs with 7x7 output planes on NCHWc blocks on
AVX-512 (``csrc/conv_dw_nchwc.c``: a vector of 16 channels per position, every lane
useful, where the NCHW kernel's vectors along a 7-wide row are mostly padding).

With ``blocked`` (:class:`Blocked`, the ``conv_nchwc`` nodes of the layout pass,
``rlx/passes/layout.py``) :func:`nchwc` (direct or Winograd) and :func:`depthwise` read
blocked input (or reorder an NCHW one) and write blocked output and residual ``[N,
ceil(O / CB), OH, OW, CB]``: no transpose in the epilogue, every size taken; :func:`reorder` is the pass's
``to_nchwc`` / ``from_nchwc``.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind
from rlx.backends.cpu.native import bindings
from rlx.backends.cpu.native.cpu import selected_target
from rlx.errors import CompileError

if TYPE_CHECKING:
    from rlx.backends.cpu.engines.conv import ConvAct, Geometry
    from rlx.ir.mir import Node

__all__ = [
    "nchwc",
    "pointwise",
    "nchwc_lib",
    "ENABLED",
    "WINOGRAD",
    "POINTWISE",
    "FILES",
    "WINOGRAD_MIN_PLANE",
    "POINTWISE_MIN_C",
    "STEM_MIN_TAPS",
    "STEM_WIDE_ONLY",
    "NARROW_MIN_PLANE",
    "depthwise",
    "DEPTHWISE",
    "DEPTHWISE_MAX_PLANE",
    "DEPTHWISE_WIDE_ONLY",
    "Blocked",
    "nchwc_block",
    "reorder",
]

#: switches for the paths (tests and benchmarks compare them against each other)
ENABLED = True
WINOGRAD = True
#: the library's C files, one translation unit (conv_winograd.c uses conv_nchwc.c's macros)
FILES = ("conv_nchwc.c", "conv_winograd.c", "conv_pointwise.c", "conv_dw_nchwc.c")
DEPTHWISE = True
#: output positions up to which a depthwise conv runs on NCHWc blocks (measured in
#: MobileNetV2, AVX-512, 1 thread, each kernel's best profiled time: 576 / 960 ch 3x3 with
#: 7x7 outputs 0.080-0.088 vs 0.101-0.112 ms on the NCHW kernel; 14x14 and 28x28 outputs
#: 1.1-1.7x its time there, although level or faster alone with the data in cache)
DEPTHWISE_MAX_PLANE = 64
#: AVX-512 only: with blocks of 8 (AVX2) it measured 1.15-1.7x the NCHW kernel's time
DEPTHWISE_WIDE_ONLY = True
POINTWISE = True
#: input channels from which a 1x1 conv takes the pointwise kernel (measured: 16 -> 96 @112
#: was 1.1x the packed sgemm's time, output-store bound either way; 24 and more 0.6-0.9x)
POINTWISE_MIN_C = 24
#: output positions from which Winograd is taken (measured: 512 -> 512 3x3 @7 was 0.9x the
#: direct kernel on AVX-512 and 1.1x on AVX2; 14x14 and larger planes 0.55-0.6x)
WINOGRAD_MIN_PLANE = 100
#: taps from which a conv with fewer input channels than a block (a stem, input left NCHW)
#: takes the direct kernel, AVX-512 only (measured, 1 thread: ResNet's 7x7 stem 0.95x the
#: sgemm path's time on AVX-512, 1.1x on AVX2; MobileNetV2's 3x3 stem 1.05-1.3x on both)
STEM_MIN_TAPS = 25
STEM_WIDE_ONLY = True
#: output positions below which the AVX2 / portable kernels (blocks of 8 / 4) leave a conv
#: to the sgemm (measured on AVX2: 7x7 planes 1.1x, 1x1 320->1280 @7 1.5x its time)
NARROW_MIN_PLANE = 100
_WIDE = 16  # the AVX-512 block
# aarch64 (neon / dotprod / i8mm, ``csrc/conv_neon.h``): blocks of 4 channels, one q
# register (a block of 8 would be two registers per vector, half the positions per
# register tile, and more zero lanes on channel counts that are not multiples of 8), a
# register tile of 8 positions x 2 blocks (16 of the 32 q registers accumulate). The
# size rules above treat it as the other narrow blocks (AVX2 / portable: small planes to
# the sgemm, stems and depthwise NCHWc off): they are AVX measurements, not yet repeated
# on ARM hardware.
_WINO_BLOCK_BYTES = 768 << 10  # a tile block's transformed input and products (about L2)
_WINO_MAX_TILES = 36  # tiles per block (3 register tiles of 12)
_PARALLEL_MIN_MACS = 1 << 21  # below this many multiply-adds the call runs on one thread


def nchwc_lib() -> ctypes.CDLL:
    """The NCHWc conv library for the selected native target. CompileError without gcc or
    when the build fails."""
    return bindings.csrc_library(FILES, selected_target(), "conv_nchwc")


def nchwc_block() -> int | None:
    """The NCHWc library's block (16 AVX-512, 8 AVX2, 4 aarch64 / portable) for the
    selected target, or None when the library cannot be built (no gcc)."""
    try:
        return int(nchwc_lib().rlx_nchwc_block())
    except (CompileError, OSError):
        return None


def _winograd_fits(geo: Geometry) -> bool:
    """A 3x3 stride-1 undilated conv on a plane of at least :data:`WINOGRAD_MIN_PLANE`
    outputs (the path groups == 1 and whole input blocks are the caller's)."""
    square = (geo.kh, geo.kw, geo.sh, geo.sw, geo.dh, geo.dw) == (3, 3, 1, 1, 1, 1)
    return square and geo.oh * geo.ow >= WINOGRAD_MIN_PLANE


@dataclass(frozen=True)
class Blocked:
    """Which of a conv's tensors are already NCHWc (``[N, ceil(C / CB), H, W, CB]``): the
    input ``x`` or not (NCHW, reordered by the kernel: a chain's first conv); its residual
    and output always are, for a ``conv_nchwc`` node."""

    x: bool = True

    @property
    def flags(self) -> int:
        """conv_nchwc.c's p[23]: RLX_IN_BLOCKED (1) | RLX_OUT_BLOCKED (2)."""
        return (1 if self.x else 0) | 2


def _blocked_note(blocked: Blocked | None) -> str:
    return "" if blocked is None else ", activations kept blocked"


def _unblocked_fits(geo: Geometry, cb: int, ci: int) -> bool:
    """The measured size rules of the NCHW-in / NCHW-out path."""
    if geo.o < cb:
        return False
    if ci == 1 and ((STEM_WIDE_ONLY and cb < _WIDE) or geo.kh * geo.kw < STEM_MIN_TAPS):
        return False  # measured slower than the sgemm path (3x3 stems; any stem on AVX2)
    # AVX2 / portable on small planes: measured slower than the sgemm path
    return not (cb < _WIDE and geo.oh * geo.ow < NARROW_MIN_PLANE and not _winograd_fits(geo))


def _fused(res: np.ndarray | None, act: ConvAct) -> str:
    """The kernel note's epilogue part: ', residual ...' / ', <act> in the epilogue'."""
    r = ", residual in the epilogue" if res is not None else ""
    return r + ("" if act.code == 0 else f", {act.value} in the epilogue")


def _packed_once_or_per_call(kind: str, call: Any, pack: Any, keep: tuple) -> Kernel:
    """``call`` alone when the weight is packed once (``kind`` const / stable), else a
    kernel packing it before every call; ``keep`` holds the buffers the pointers name."""
    if kind != "call":
        call.keep = keep
        return call  # type: ignore[no-any-return]

    def run() -> None:
        pack()
        call()

    run.keepalive = keep  # type: ignore[attr-defined]
    return run


def nchwc(
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
    blocked: Blocked | None = None,
) -> Kernel | None:
    """``act(conv(x, w) + bias + res)`` into ``out`` on NCHWc blocks (conv_nchwc.c's
    ``rlx_conv2d_nchwc_f32``), or None when the path does not apply or its library is
    unavailable. ``blocked``: x / out / res already NCHWc (a ``conv_nchwc`` node of the
    layout pass): every groups == 1 conv is taken, on the direct kernel."""
    from rlx.backends.cpu.engines.conv import f32_bits
    from rlx.backends.cpu.engines.conv_gemm import weight_kind

    if geo.groups != 1:
        return None
    if blocked is None and (not ENABLED or geo.kh * geo.kw == 1):
        return None
    lib = bindings.lib_or_note(ctx, "conv (NCHWc)", nchwc_lib)
    if lib is None:
        return None
    cb = int(lib.rlx_nchwc_block())
    ci = cb if geo.c >= cb or (blocked is not None and blocked.x) else 1  # a stem: NCHW
    if blocked is None and not _unblocked_fits(geo, cb, ci):
        return None
    n_cb, n_ob = -(-geo.c // ci), -(-geo.o // cb)
    macs = geo.n * geo.o * geo.oh * geo.ow * geo.c * geo.kh * geo.kw
    threads = ctx.num_threads if macs >= _PARALLEL_MIN_MACS else 1
    hp, wp = geo.bordered()
    wino = WINOGRAD and ci == cb and _winograd_fits(geo)
    flags = 0 if blocked is None else blocked.flags
    in_place = blocked is not None and blocked.x and not wino and (hp, wp) == (geo.h, geo.w)
    ntb = 0
    if wino:  # whole 4x4 input tiles inside the bordered input
        hp, wp = max(hp, 2 * (-(-geo.oh // 2)) + 2), max(wp, 2 * (-(-geo.ow // 2)) + 2)
        ntiles = -(-geo.oh // 2) * (-(-geo.ow // 2))
        ntb = max(1, min(_WINO_MAX_TILES, _WINO_BLOCK_BYTES // (64 * (n_cb + n_ob) * cb)))
        if geo.n * -(-ntiles // ntb) < threads:  # a block per thread at least
            ntb = -(-geo.n * ntiles // threads)
    p = np.array(
        [*geo.params(), act.code, f32_bits(lo), f32_bits(hi), hp, wp, ci, ntb, flags], np.int64
    )  # fmt: skip
    kind = weight_kind(ctx, node, 1)
    key = ("conv.nchwc.weight", node.inputs[1], geo.o, geo.c, geo.kh, geo.kw, cb, ci, wino)
    size = (16 if wino else geo.kh * geo.kw) * n_ob * n_cb * ci * cb

    def make() -> np.ndarray:
        return np.zeros(size, np.float32)

    wb = make() if kind == "call" else ctx.keep(key, make)
    packer = lib.rlx_wino_pack_w if wino else lib.rlx_nchwc_pack_w
    pack = functools.partial(packer, w.ctypes.data, wb.ctypes.data, p.ctypes.data)
    if kind == "const":
        ctx.keep((*key, "packed"), pack)
    elif kind == "stable":
        ctx.prologue_once(key, pack)  # type: ignore[arg-type]
    xb = np.zeros(1 if in_place else geo.n * n_cb * hp * wp * ci, np.float32)  # border: 0
    common = (x.ctypes.data, xb.ctypes.data, wb.ctypes.data,
              None if bias is None else bias.ctypes.data, out.ctypes.data,
              None if res is None else res.ctypes.data)  # fmt: skip
    ws = np.empty(threads * 16 * ntb * (n_cb + n_ob) * cb if wino else 0, np.float32)
    if wino:
        call = functools.partial(
            lib.rlx_conv2d_wino_f32, *common, ws.ctypes.data, p.ctypes.data, threads
        )
    else:
        call = functools.partial(lib.rlx_conv2d_nchwc_f32, *common, p.ctypes.data, threads)
    keep = (p, xb, wb, ws)
    ctx.kind = KernelKind.NATIVE
    how = "Winograd F(2x2, 3x3)" if wino else "direct conv"
    ctx.notes.append(
        f"native {how} on NCHWc blocks of {cb} channels"
        f"{' (NCHW input)' if ci == 1 else ''}{_blocked_note(blocked)} ({geo.kh}x{geo.kw}, "
        f"{geo.c}->{geo.o}{_fused(res, act)})"
    )
    return _packed_once_or_per_call(kind, call, pack, keep)


def pointwise(
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
    """A 1x1 stride-1 unpadded dense conv straight on NCHW (conv_pointwise.c's
    ``rlx_conv1x1_f32``: ``out [O, P] = W [O, C] @ x [C, P]`` per image, the input rows
    read in place, the output stored a vector of positions at a time, ``act(. + bias +
    res)`` on the vectors), or None when it does not apply."""
    from rlx.backends.cpu.engines.conv import f32_bits

    if not POINTWISE or geo.groups != 1 or (geo.kh, geo.kw, geo.sh, geo.sw) != (1, 1, 1, 1):
        return None
    if geo.ph or geo.pw or (geo.oh, geo.ow) != (geo.h, geo.w) or geo.c < POINTWISE_MIN_C:
        return None
    lib = bindings.lib_or_note(ctx, "conv (1x1)", nchwc_lib)
    if lib is None:
        return None
    plane = geo.h * geo.w
    if int(lib.rlx_nchwc_block()) < _WIDE and plane < NARROW_MIN_PLANE:
        return None  # AVX2 / portable on small planes: measured slower than the sgemm path
    threads = ctx.num_threads if geo.n * geo.o * geo.c * plane >= _PARALLEL_MIN_MACS else 1
    p = np.array(
        [geo.n, geo.c, plane, geo.o, act.code, f32_bits(lo), f32_bits(hi)], np.int64
    )  # fmt: skip
    tail = np.zeros(threads * geo.c * 4 * int(lib.rlx_nchwc_block()) + 16, np.float32)
    call = functools.partial(
        lib.rlx_conv1x1_f32,
        x.ctypes.data,
        w.ctypes.data,
        None if bias is None else bias.ctypes.data,
        out.ctypes.data,
        None if res is None else res.ctypes.data,
        tail.ctypes.data,
        p.ctypes.data,
        threads,
    )
    call.keep = (p, tail)  # type: ignore[attr-defined]
    ctx.kind = KernelKind.NATIVE
    ctx.notes.append(
        f"native pointwise (1x1) conv on NCHW, {geo.c}->{geo.o} over {plane} positions"
        f"{_fused(res, act)}"
    )
    return call


def depthwise(
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
    blocked: Blocked | None = None,
) -> Kernel | None:
    """A depthwise conv (groups == C == O) on a small plane (at most
    :data:`DEPTHWISE_MAX_PLANE` outputs) on NCHWc blocks (conv_dw_nchwc.c's
    ``rlx_dw_nchwc_f32``: a vector of CB channels per position, every lane useful), or
    None. ``blocked``: x / out / res already NCHWc (any plane, any block size)."""
    from rlx.backends.cpu.engines.conv import f32_bits
    from rlx.backends.cpu.engines.conv_gemm import weight_kind

    if geo.groups != geo.c or geo.o != geo.c:
        return None
    if blocked is None and (not DEPTHWISE or geo.c == 1 or geo.oh * geo.ow > DEPTHWISE_MAX_PLANE):
        return None
    lib = bindings.lib_or_note(ctx, "conv (depthwise NCHWc)", nchwc_lib)
    if lib is None:
        return None
    cb = int(lib.rlx_nchwc_block())
    if blocked is None and (geo.c < cb or (DEPTHWISE_WIDE_ONLY and cb < _WIDE)):
        return None
    flags = 0 if blocked is None else blocked.flags
    n_cb = -(-geo.c // cb)
    hp, wp = geo.bordered()
    p = np.array(
        [*geo.params(), act.code, f32_bits(lo), f32_bits(hi), hp, wp, cb, 0, flags], np.int64
    )  # fmt: skip
    kind = weight_kind(ctx, node, 1)
    key = ("conv.dw_nchwc.weight", node.inputs[1], geo.c, geo.kh, geo.kw, cb)

    def make() -> np.ndarray:
        return np.zeros(n_cb * geo.kh * geo.kw * cb, np.float32)

    wb = make() if kind == "call" else ctx.keep(key, make)
    pack = functools.partial(lib.rlx_dw_nchwc_pack_w, w.ctypes.data, wb.ctypes.data, p.ctypes.data)
    if kind == "const":
        ctx.keep((*key, "packed"), pack)
    elif kind == "stable":
        ctx.prologue_once(key, pack)  # type: ignore[arg-type]
    # private, its border stays zero (blocked input: read in place, taps outside skipped)
    in_place = blocked is not None and blocked.x
    xb = np.zeros(1 if in_place else geo.n * n_cb * hp * wp * cb, np.float32)
    macs = geo.n * geo.c * geo.oh * geo.ow * geo.kh * geo.kw
    threads = ctx.num_threads if macs >= _PARALLEL_MIN_MACS // 4 else 1
    call = functools.partial(
        lib.rlx_dw_nchwc_f32,
        x.ctypes.data,
        xb.ctypes.data,
        wb.ctypes.data,
        None if bias is None else bias.ctypes.data,
        out.ctypes.data,
        None if res is None else res.ctypes.data,
        p.ctypes.data,
        threads,
    )
    keep = (p, xb, wb)
    ctx.kind = KernelKind.NATIVE
    ctx.notes.append(
        f"native depthwise conv on NCHWc blocks of {cb} channels{_blocked_note(blocked)} "
        f"({geo.kh}x{geo.kw}, "
        f"{geo.c} channels{_fused(res, act)})"
    )
    return _packed_once_or_per_call(kind, call, pack, keep)


def reorder(
    x: np.ndarray, out: np.ndarray, nchw: tuple[int, int, int, int], to_blocked: bool,
    ctx: KernelCtx,
) -> Kernel | None:  # fmt: skip
    """NCHW ``[N, C, H, W]`` <-> NCHWc ``[N, ceil(C / CB), H, W, CB]`` (lanes past C zero)
    between ``x`` and ``out`` (conv_nchwc.c's ``rlx_nchwc_to_blocked`` /
    ``rlx_nchwc_from_blocked``), or None when the library is unavailable or its block is
    not the tensor's."""
    lib = bindings.lib_or_note(ctx, "NCHWc reorder", nchwc_lib)
    if lib is None:
        return None
    blocked = out if to_blocked else x
    if int(lib.rlx_nchwc_block()) != blocked.shape[-1]:
        return None
    n, c, h, w = nchw
    p = np.array([n, c, h, w], np.int64)
    threads = ctx.num_threads if x.size >= _PARALLEL_MIN_MACS // 16 else 1
    fn = lib.rlx_nchwc_to_blocked if to_blocked else lib.rlx_nchwc_from_blocked
    call = functools.partial(fn, x.ctypes.data, out.ctypes.data, p.ctypes.data, threads)
    call.keep = p  # type: ignore[attr-defined]
    ctx.kind = KernelKind.NATIVE
    ctx.notes.append(f"native reorder {'to' if to_blocked else 'from'} NCHWc blocks")
    return call
