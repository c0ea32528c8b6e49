"""Low-precision matmul kernels. In: bf16/f16 MatMul / DotGeneral nodes (called by
``kernels/linalg.py``) and FusedMatMulBiasAct nodes (called by ``kernels/fused.py``) with their
arena views. Out: closures running the native bf16 GEMM (vdpbf16ps or AMX tiles), the
widen + sgemm path, and the fused bias + activation epilogue.

The paths, the weight-packing schedule and the epilogue's exactness are described in the
docstring of :mod:`rlx.backends.cpu.engines.lowp_lib`, which owns the native library
(:class:`~rlx.backends.cpu.engines.lowp_lib.LowpLib`), the path choice (``gemm_path``) and the
casts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind
from rlx.backends.cpu.engines.blas import matmul_into
from rlx.backends.cpu.native.sgemm import aligned_empty
from rlx.ops.base import RefCtx
from rlx.ops.core import Constant
from rlx.ops.elementwise import Unary, UnaryKind

if TYPE_CHECKING:
    from rlx.ir.mir import Node

from rlx.backends.cpu.engines.lowp_lib import (
    F32,
    GemmPath,
    LowpLib,
    _padded_table,
    gemm_path,
    is_half,
    lib_or_none,
)
from rlx.dtype import is_bf16

__all__ = ["lowp_matmul", "lowp_fused_matmul", "activation_table"]


# ---- matmul ----------------------------------------------------------------------------


def _is_constant(ctx: KernelCtx, node: Node, i: int) -> bool:
    return isinstance(ctx.graph.nodes[node.inputs[i]].op, Constant)


def _is_stable(ctx: KernelCtx, node: Node, i: int) -> bool:
    """Input ``i`` changes only when a param does (``KernelCtx.stable``)."""
    return node.inputs[i] in ctx.stable


def lowp_matmul(
    node: Node,
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    ctx: KernelCtx,
    *,
    b_constant: bool | None = None,
    preps: tuple[Kernel, ...] = (),
    b_prep: Kernel | None = None,
    epilogue: _Epilogue | None = None,
) -> Kernel | None:
    """``out = matmul(a, b)`` (NumPy semantics) for bf16/f16 ``a``, ``b``, ``out``, or None
    when the native library is unavailable (the caller keeps its NumPy path).

    ``preps`` run before every product (they fill ``a``); ``b_prep`` fills ``b`` (once at
    build time when ``b`` is constant, else before every product). ``b_constant``
    defaults to whether input 1 of ``node`` is a Constant. A ``b`` that changes only
    with the params (``KernelCtx.stable``, no ``b_prep``) is prepared (packed or
    widened, into private buffers) in a ``KernelCtx.prologue`` step: once per param
    change. ``epilogue`` (bf16 only) is applied by the vdpbf16ps/AMX GEMM as it writes
    ``out`` when that path is taken (then ``epilogue.fused`` is set)."""
    if a.dtype != b.dtype or a.dtype != out.dtype or not is_half(a.dtype):
        return None
    lib = lib_or_none(ctx)
    if lib is None:
        return None
    const = _is_constant(ctx, node, 1) if b_constant is None else b_constant
    if const and b_prep is not None:
        b_prep()
    per_call = tuple(preps) + ((b_prep,) if b_prep is not None and not const else ())
    defer: list[Kernel] | None = (
        [] if not const and b_prep is None and _is_stable(ctx, node, 1) else None
    )
    path = gemm_path(a.dtype, lib)
    fn = _dpbf16(a, b, out, ctx, lib, const, defer, epilogue) if path is GemmPath.DPBF16 else None
    panels = False
    if fn is None:
        fn = (
            _f32_panels(a, b, out, ctx, lib, const, defer) if (const or defer is not None) else None
        )
        panels = fn is not None
        if fn is None:
            fn = _convert(a, b, out, ctx, lib, const, defer)
        path = GemmPath.CONVERT
    ctx.kind = KernelKind.NATIVE
    if const:
        when = "at compile time"
    elif defer:
        when = "once per param change"
        ctx.prologue.extend(defer)
    else:
        when = "every run"
    how = path.value
    if panels:
        how += f" ({PANELS_NOTE})"
    if path is GemmPath.DPBF16 and lib is not None:
        k = a.shape[-1]
        if not lib.has_amx:
            how += " (vdpbf16ps)"
        elif k % 32 == 0:
            how += " (AMX tiles; vdpbf16ps for the last M % 16 rows)"
        else:
            how += f" (vdpbf16ps: K={k} is not a multiple of 32 for AMX)"
    ctx.notes.append(f"{a.dtype.name} matmul: {how}, weight prepared {when}")
    if not per_call:
        return fn

    def run() -> None:
        for p in per_call:
            p()
        fn()

    return run


#: The kernel note of :func:`_f32_panels` (tests and benchmarks look for it).
PANELS_NOTE = "f32 weight panels packed once: rlx sgemm micro-kernel, native rounding"


def _f32_panels(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    ctx: KernelCtx,
    lib: LowpLib,
    const: bool,
    defer: list[Kernel] | None,
) -> Kernel | None:
    """The CONVERT path for a weight that does not change between runs (a constant, or
    ``defer`` for a param-derived one): ``b`` widened and packed into f32 sgemm panels
    once (at build time, or by a step appended to ``defer``), then each run widens ``a``
    into f32 scratch, runs rlx's f32 sgemm into f32 scratch and rounds that into ``out``
    natively (once, as the reference rounds its f32 product). So a bf16 product costs the
    f32 one plus the widening of ``a`` and the rounding of the result, never the f32
    cost twice. None (the caller keeps ``_convert``) for a batched weight, rows that are
    not contiguous or without the native sgemm."""
    from rlx.backends.cpu.engines.sgemm import native_sgemm

    if a.ndim < 2 or b.ndim < 2 or out.ndim < 2 or 0 in a.shape or 0 in b.shape:
        return None
    if not all(d == 1 for d in b.shape[:-2]) or not (
        a.flags.c_contiguous and out.flags.c_contiguous
    ):
        return None
    lead = out.shape[:-2]
    if not (a.shape[:-2] == lead or (not a.shape[:-2] and all(d == 1 for d in lead))):
        return None
    sg = native_sgemm(ctx)
    if sg is None:
        return None
    k, n = b.shape[-2], b.shape[-1]
    m = a.size // k
    level, nt = int(lib.level()), ctx.num_threads
    up = lib.cast_fn(a.dtype, F32)
    packed = aligned_empty(sg.packed_size(k, n))  # private: kept from one run to the next
    b2 = b.reshape(k, n)

    def pack() -> None:
        sg.pack_b(b2.astype(F32), packed, nt)

    if const:
        pack()
    else:
        assert defer is not None
        defer.append(pack)
    a32 = ctx.scratch((m, k), F32, 303)
    # f32 output into scratch, then the native vectorised rounding: the sgemm's own bf16
    # output rounds element by element (callgrind, 16 x 384 x 384 at AVX2: 816k
    # instructions per product that way, 784k this way, the f32 product 765k)
    o32 = ctx.scratch((m, n), F32, 304)
    args = sg.gemm_args(a32, packed, o32)
    gemm = sg.lib.rlx_sgemm
    down = lib.cast_fn(F32, out.dtype)
    pa, pa32, na = a.ctypes.data, a32.ctypes.data, a.size
    po32, po, no = o32.ctypes.data, out.ctypes.data, out.size

    def run() -> None:
        up(pa, pa32, na, level, nt)
        if gemm(*args, nt) != 0:
            raise MemoryError(f"bf16 matmul: sgemm could not allocate its buffers ({m}x{k})")
        down(po32, po, no, level, nt)

    run.packed = packed  # type: ignore[attr-defined]
    return run


def _convert(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    ctx: KernelCtx,
    lib: LowpLib,
    const: bool,
    defer: list[Kernel] | None = None,
) -> Kernel:
    """Widen natively, f32 BLAS matmul into scratch, round natively into ``out``. With
    ``defer`` (a list), ``b`` is widened into a private buffer by a step appended there."""

    level, nt = int(lib.level()), ctx.num_threads
    up = lib.cast_fn(a.dtype, F32)
    down = lib.cast_fn(F32, out.dtype)
    if not (a.flags.c_contiguous and (const or b.flags.c_contiguous)):
        return _convert_strided(a, b, out, ctx, matmul_into)
    if defer is not None and not b.flags.c_contiguous:
        defer = None
    a32 = ctx.scratch(a.shape, F32, 300)
    o32 = ctx.scratch(out.shape, F32, 302)
    if const:
        b32 = np.empty(b.shape, F32)  # private: the pool's buffers are rewritten by others
        lib.cast(np.ascontiguousarray(b), b32, nt)
        b_steps: list[tuple[int, int, int]] = []
    elif defer is not None:
        b32 = np.empty(b.shape, F32)  # private: kept from one param change to the next
        b_steps = []
        pb, pb32, nb = b.ctypes.data, b32.ctypes.data, b.size
        defer.append(lambda: up(pb, pb32, nb, level, nt))  # type: ignore[arg-type, return-value]
    else:
        b32 = ctx.scratch(b.shape, F32, 301)
        b_steps = [(b.ctypes.data, b32.ctypes.data, b.size)]
    mm = matmul_into(a32, b32, o32)
    pa, pa32, na = a.ctypes.data, a32.ctypes.data, a.size
    po32, po, no = o32.ctypes.data, out.ctypes.data, out.size
    out_c = out.flags.c_contiguous

    def run() -> None:
        up(pa, pa32, na, level, nt)
        for s, d, n in b_steps:
            up(s, d, n, level, nt)
        mm()
        if out_c:
            down(po32, po, no, level, nt)
        else:
            np.copyto(out, o32, casting="unsafe")

    return run


def _convert_strided(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, ctx: KernelCtx, matmul_into: Callable
) -> Kernel:
    """The convert path for non-contiguous operands (NumPy widening and rounding)."""
    a32 = ctx.scratch(a.shape, F32, 300)
    b32 = ctx.scratch(b.shape, F32, 301)
    o32 = ctx.scratch(out.shape, F32, 302)
    mm = matmul_into(a32, b32, o32)

    def run() -> None:
        np.copyto(a32, a, casting="unsafe")
        np.copyto(b32, b, casting="unsafe")
        mm()
        np.copyto(out, o32, casting="unsafe")

    return run


def _dpbf16(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    ctx: KernelCtx,
    lib: LowpLib,
    const: bool,
    defer: list[Kernel] | None = None,
    epilogue: _Epilogue | None = None,
) -> Kernel | None:
    """vdpbf16ps/AMX GEMMs, one per batch of the broadcast, or None for shapes it does not
    take (1-D operands, empty dims, rows that are not contiguous). With ``defer`` (a
    list), ``b`` is packed into private buffers by a step appended there. ``epilogue``
    (bias and activation) is applied as the GEMM writes ``out``; it is marked fused."""
    if a.ndim < 2 or b.ndim < 2 or out.ndim < 2 or 0 in a.shape or 0 in b.shape:
        return None
    k, n = b.shape[-2], b.shape[-1]
    lead = out.shape[:-2]
    a_list: list[np.ndarray] = []
    b_list: list[np.ndarray] = []
    o_list: list[np.ndarray] = []
    one_b = all(d == 1 for d in b.shape[:-2])
    rows = a.shape[:-2] == lead or (not a.shape[:-2] and all(d == 1 for d in lead))
    if one_b and rows and a.flags.c_contiguous and out.flags.c_contiguous:
        # one GEMM over all rows of a (the weight is shared by every batch)
        a_list.append(a.reshape(-1, k))
        b_list.append(b.reshape(k, n))
        o_list.append(out.reshape(-1, n))
    else:
        ab = np.broadcast_to(a, lead + a.shape[-2:])
        bb = np.broadcast_to(b, lead + b.shape[-2:])
        for idx in np.ndindex(*lead):
            a_list.append(ab[idx])
            b_list.append(bb[idx])
            o_list.append(out[idx])
    for x in (*a_list, *b_list, *o_list):
        if x.strides[1] != x.itemsize or x.strides[0] % x.itemsize:
            return None
    size, nt = lib.packed_size(k, n), ctx.num_threads
    packs: dict[int, np.ndarray] = {}
    todo: list[tuple[np.ndarray, np.ndarray]] = []
    for i, bm in enumerate(b_list):
        key = bm.ctypes.data
        if key not in packs:
            if const:
                packs[key] = np.empty(size, np.uint16)
                lib.pack_b(bm, packs[key], nt)
            elif defer is not None:
                packs[key] = np.empty(size, np.uint16)  # private: kept between runs
                todo.append((bm, packs[key]))
            else:
                packs[key] = ctx.scratch((size,), np.uint16, 320 + i)
                todo.append((bm, packs[key]))
    calls = [
        (am, packs[bm.ctypes.data], om) for am, bm, om in zip(a_list, b_list, o_list, strict=True)
    ]
    raw = lib.lib.rlx_bf16_gemm_ep
    pack = lib.lib.rlx_bf16_pack_b
    ep = (None, None) if epilogue is None else (epilogue.bias_ptr, epilogue.lut_ptr)
    args = [
        (am.shape[0], n, k, am.ctypes.data, am.strides[0] // 2, pm.ctypes.data, om.ctypes.data,
         om.strides[0] // om.itemsize, 1)
        for am, pm, om in calls
    ]  # fmt: skip
    pargs = [(bm.ctypes.data, bm.strides[0] // 2, k, n, pm.ctypes.data) for bm, pm in todo]
    if defer is not None:
        deferred, pargs = pargs, []

        def pack_all() -> None:
            for p in deferred:
                pack(*p, nt)

        pack_all.packed = list(packs.values())  # type: ignore[attr-defined]  # args hold only pointers
        defer.append(pack_all)

    def run() -> None:
        for p in pargs:
            pack(*p, nt)
        for g in args:
            if raw(*g, nt, *ep) != 0:
                raise MemoryError(
                    f"bf16 gemm: could not allocate the packed activations ({g[0]}x{k})"
                )

    run.packed = list(packs.values())  # type: ignore[attr-defined]  # args hold only pointers
    if epilogue is not None:
        epilogue.fused = True
        run.epilogue = epilogue  # type: ignore[attr-defined]  # ep holds only pointers
    return run


# ---- matmul + bias + activation ------------------------------------------------------------


@functools.cache
def activation_table(act: UnaryKind, dtype: np.dtype) -> np.ndarray:
    """``act`` of every 16-bit ``dtype`` (bf16/f16) value, as the op's reference computes
    and rounds it: uint16 [65536] codes, so ``table[x.view(uint16)]`` is ``act(x)``
    bit for bit."""
    dt = np.dtype(dtype)
    vals = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dt)
    with np.errstate(all="ignore"):
        r = np.asarray(Unary(act).reference([vals], RefCtx((2**16,), dt, {}, {}, {})))
        table = r.astype(dt).view(np.uint16)
    table.flags.writeable = False
    return table


def lowp_fused_matmul(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``FusedMatMulBiasAct`` on bf16/f16 with the native GEMM, rounding where the op's
    reference rounds: the product, the biased product (bias added in f32), the
    activation (looked up in :func:`activation_table`: its input is a rounded 16-bit
    value). None when the node is not bf16/f16 throughout or the library is unavailable
    (the caller keeps its own path).

    ``kernels/fused.py`` calls this first from its FusedMatMulBiasAct factory."""
    x, w = ins[:2]
    bias = ins[2] if len(ins) == 3 else None
    dt = out.dtype
    if not is_half(dt) or any(t.dtype != dt for t in ins) or not out.flags.c_contiguous:
        return None
    if bias is not None and not bias.flags.c_contiguous:
        return None
    lib = lib_or_none(ctx)
    if lib is None:
        return None
    act = node.op.act  # type: ignore[attr-defined]
    level, nt = int(lib.level()), ctx.num_threads
    up, down = lib.cast_fn(dt, F32), lib.cast_fn(F32, dt)
    b32: np.ndarray | None = None
    preps: list[Kernel] = []
    if bias is not None:
        if _is_constant(ctx, node, 2):
            b32 = np.empty(bias.shape, F32)
            lib.cast(bias, b32)
        elif _is_stable(ctx, node, 2):  # widened once per param change, kept private
            b32 = np.empty(bias.shape, F32)
            pb, pb32, nb = bias.ctypes.data, b32.ctypes.data, bias.size
            ctx.prologue.append(lambda: up(pb, pb32, nb, level, 1))  # type: ignore[arg-type, return-value]
        else:
            b32 = ctx.scratch(bias.shape, F32, 331)
            pb, pb32, nb = bias.ctypes.data, b32.ctypes.data, bias.size
            preps.append(lambda: up(pb, pb32, nb, level, 1))  # type: ignore[arg-type, return-value]
    table = activation_table(act, dt) if act is not None else None
    ep: _Epilogue | None = None
    if (
        (bias is not None or act is not None)
        and is_bf16(dt)
        and (bias is None or bias.shape[-1:] == (out.shape[-1],) and bias.size == out.shape[-1])
    ):
        ep = _Epilogue(b32, None if table is None else _padded_table(table))
    mm = lowp_matmul(node, x, w, out, ctx, epilogue=ep)
    if mm is None:
        return None
    if ep is not None and ep.fused:  # bias and act applied as the GEMM writes out
        if not preps:
            return mm
        pre = preps[0]

        def run_fused() -> None:
            pre()
            mm()

        return run_fused
    if bias is None and act is None:
        return mm
    po, n = out.ctypes.data, out.size
    steps: list[Kernel] = [*preps, mm]
    if b32 is not None:
        y = ctx.scratch(out.shape, F32, 330)
        py = y.ctypes.data
        bb = b32
        steps.append(lambda: up(po, py, n, level, nt))  # type: ignore[arg-type, return-value]
        steps.append(lambda: np.add(y, bb, out=y))  # type: ignore[arg-type, return-value]
        steps.append(lambda: down(py, po, n, level, nt))  # type: ignore[arg-type, return-value]
    if table is not None:
        # the reference applies act to the rounded (biased) product: one of 2^16 values
        lut, pt = lib.lib.rlx_lut16, table.ctypes.data
        steps.append(lambda: lut(po, pt, po, n, nt))  # type: ignore[arg-type, return-value]

    def run() -> None:
        for f in steps:
            f()

    return run


@dataclass
class _Epilogue:
    """Bias (f32 [N], or None) and activation table (uint16 [65537] padded, or None) for
    the bf16 GEMM to apply as it writes its output; ``fused`` once a GEMM took them."""

    bias: np.ndarray | None
    table: np.ndarray | None
    fused: bool = False

    @property
    def bias_ptr(self) -> int | None:
        return None if self.bias is None else self.bias.ctypes.data

    @property
    def lut_ptr(self) -> int | None:
        return None if self.table is None else self.table.ctypes.data
