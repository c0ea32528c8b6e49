"""The weight-only quantized matmul library (``csrc/dqgemm_decode.c``, ``dqgemm_rows.c``,
``dqgemm_rows_gguf.c``, ``dqgemm.c``, ``dqgemm_small.c``, ``dqgemm_q8.c``,
``dqgemm_q8_group.c``, ``dqgemm_bf16dot.c``). In: f32 activations ``[M, K]`` and a weight packed in a
:class:`~rlx.formats.schemes.QuantScheme` layout (``[N, ...]``, rows = output channels).
Out: ``y = x @ dequant(w).T`` f32 ``[M, N]`` computed from the packed bytes
(:meth:`DqGemmLib.gemm`, :meth:`DqGemmLib.bind`; a GEMV below 4 rows, the small-batch
path from 2 to :data:`SMALL_MAX_M` rows (:func:`small_batch`), a tiled GEMM above), the
decoded weight
(:meth:`DqGemmLib.decode`) and a streaming-read bandwidth probe
(:meth:`DqGemmLib.stream_read`).

:func:`dqgemm_lib` builds the library for the selected target (``RLX_ISA``): AVX-512 or
AVX2 FMA vectors, SSE2 mul + add on the portable target, or on the aarch64 targets NEON
FMLA with SDOT for the integer path (``csrc/dqgemm_neon.h``). ``act`` (``RLX_DQ_ACT`` in a
compiled graph) picks f32 activations or, for :data:`Q8_SCHEMES`, int8 activations with
integer dot products (:func:`uses_q8`; ``auto``: at batch < 4). Every packed tensor is checked
against its scheme before the C code reads it (:func:`check_weights`: a wrong dtype,
shape or byte count is a QuantizationError naming the tensor).

A GGUF weight may be stored with its rows interleaved by R = 4 or 8 (``csrc/dq_layout.h``:
:func:`repack`, :func:`unrepack`; R per target: :func:`repack_rows`); every entry point
takes ``rows=R`` (1: as stored in the file) and every kernel reads either layout.

On a CPU with avx512_bf16 (the AVX-512 target), the exact decode GEMV (one f32 activation
row) of Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K runs ``csrc/dqgemm_bf16dot.c``
(``vdpbf16ps`` on exact bf16 parts of the activations, within the same f32 accumulation
bound), and Q8_0 that file's f32 FMA kernel over whole row groups
(:meth:`DqGemmLib.uses_bf16`; RLX_DQ_BF16=0 turns both off). With avx512_vnni as well, Q8_0
on interleaved rows (R = 4 / 8) runs ``csrc/dqgemm_q8dig.c``: the activation as integer
digits with an exponent per 4 inputs (``vpdpbusd``), each 32-block whose digits would
leave the bound on the f32 kernel's arithmetic (RLX_DQ_Q8_DIGITS=0, read when a call is
bound: the f32 group kernel for every block, :func:`q8_digits`).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlx.backends.cpu.native import bindings, cpu
from rlx.backends.cpu.native.prebuilt import DQGEMM_SOURCES
from rlx.dtype import f8e4m3_np, f8e5m2_np
from rlx.errors import CompileError, InputError, QuantizationError
from rlx.formats import schemes as S
from rlx.formats.gguf import check_packed

__all__ = [
    "DqGemmLib",
    "DqLayout",
    "dqgemm_lib",
    "layout",
    "check_weights",
    "SUPPORTED",
    "Q8_SCHEMES",
    "ACTS",
    "uses_q8",
    "SMALL_MAX_M",
    "small_batch",
    "REPACK_ROWS",
    "repack_rows",
    "repack",
    "unrepack",
    "repack_enabled",
    "release_mapped",
    "file_mapped",
]


_GGUF_CODES: dict[type, int] = {
    S.GgufQ4_0: 10,
    S.GgufQ4_1: 11,
    S.GgufQ5_0: 12,
    S.GgufQ5_1: 13,
    S.GgufQ8_0: 14,
    S.GgufQ2K: 20,
    S.GgufQ3K: 21,
    S.GgufQ4K: 22,
    S.GgufQ5K: 23,
    S.GgufQ6K: 24,
    S.GgufQ8K: 25,
}
#: the schemes with an integer path (activations quantized to q8, ``act="q8"``)
Q8_SCHEMES: tuple[type, ...] = (
    S.GgufQ8_0,
    S.GgufQ5_0,
    S.GgufQ4_0,
    S.GgufQ4_1,
    S.GgufQ5_1,
    S.GgufQ2K,
    S.GgufQ3K,
    S.GgufQ4K,
    S.GgufQ5K,
    S.GgufQ6K,
)
#: activation modes: ``f32`` exact f32 products; ``q8`` int8 activations (Q8_SCHEMES only);
#: ``auto`` q8 below :data:`Q8_MAX_M` rows (decode), f32 above (the f32 tiled GEMM is the
#: faster prefill here)
ACTS = ("auto", "q8", "f32")
Q8_MAX_M = 4


def uses_q8(scheme: S.QuantScheme, m: int, act: str) -> bool:
    """Whether a product of ``m`` activation rows with a ``scheme`` weight runs the integer
    (q8 activation) path under activation mode ``act``."""
    if type(scheme) not in Q8_SCHEMES:
        return False
    return act == "q8" or (act == "auto" and m < Q8_MAX_M)


#: the most activation rows the small-batch path takes (``csrc/dqgemm_small.c``: each
#: weight row decoded once and applied to every row in a register tile of 3 weight rows x
#: 8 (AVX-512) / 4 (AVX2) activation rows; batched decode)
SMALL_MAX_M = 16


def small_batch(lib: DqGemmLib, scheme: S.QuantScheme, m: int) -> bool:
    """Whether ``m`` f32 activation rows against a ``scheme`` weight run the small-batch
    path of ``lib`` (2..:data:`SMALL_MAX_M` rows on AVX2 / AVX-512 and the aarch64 targets;
    the layouts with vector decoders, Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, Q4_K and Q6_K, from 2
    rows, the other layouts from 4)."""
    lay = layout(scheme, 32 * 256)
    return bool(lib.lib.rlx_dq_small(lay.code, lay.qk, m))


#: every scheme class the native kernel reads
SUPPORTED: tuple[type, ...] = (
    S.Int8Block,
    S.Int8BlockAsym,
    S.Int4Block,
    S.Fp8E4m3,
    S.Fp8E5m2,
    *_GGUF_CODES,
)


@dataclass(frozen=True)
class DqLayout:
    """How the C code walks a packed ``[N, K]`` weight: scheme ``code``, ``qk`` weights
    per block, ``bb`` bytes per block, ``row_bytes`` per output row."""

    code: int
    qk: int
    bb: int
    row_bytes: int


def layout(scheme: S.QuantScheme, k: int) -> DqLayout:
    """The packed layout of a weight with ``k`` inputs per row in ``scheme``."""
    t = type(scheme)
    if t in _GGUF_CODES:
        bb = t.block_bytes  # type: ignore[attr-defined]
        qk = scheme.block_size
        return DqLayout(_GGUF_CODES[t], qk, bb, k // qk * bb)  # type: ignore[operator]
    if t in (S.Int8Block, S.Int8BlockAsym):
        bs = scheme.block_size
        return DqLayout(0, bs, bs, k)  # type: ignore[arg-type]
    if t is S.Int4Block:
        bs = scheme.block_size
        return DqLayout(1, bs, bs // 2, k // 2)  # type: ignore[arg-type, operator]
    if t in (S.Fp8E4m3, S.Fp8E5m2):
        qk = next(q for q in (32, 16, 8, 4, 2, 1) if k % q == 0)
        return DqLayout(2, qk, qk, k)
    raise QuantizationError(f"{scheme}: no native dequant-matmul kernel for this scheme")


def check_weights(
    scheme: S.QuantScheme,
    ws: tuple[np.ndarray, ...],
    n: int,
    k: int,
    names: tuple[str, ...] = ("w_q", "scale", "zp"),
) -> None:
    """QuantizationError naming the tensor unless ``ws`` (``(packed,)`` for GGUF, else
    ``(w_q, scale, zp)``) is an ``[n, k]`` weight laid out as ``scheme`` says."""
    if scheme.is_gguf:
        check_packed(scheme, ws[0], n, k, names[0])
        return
    w, sc, zp = ws
    if isinstance(scheme, S.Fp8E4m3 | S.Fp8E5m2):
        dt = f8e4m3_np() if isinstance(scheme, S.Fp8E4m3) else f8e5m2_np()
    else:
        dt = np.dtype(np.uint8 if isinstance(scheme, S.Int4Block) else np.int8)
    lay = layout(scheme, k)
    cols = k // 2 if isinstance(scheme, S.Int4Block) else k
    if w.dtype != dt or w.shape != (n, cols):
        raise QuantizationError(
            f"tensor {names[0]!r}: {scheme} of a [{n}, {k}] weight needs {dt} [{n}, {cols}] "
            f"({n * lay.row_bytes} bytes), given {w.dtype} {list(w.shape)} ({w.nbytes} bytes)"
        )
    per = (1,) if scheme.block_size is None else (n, k // lay.qk)
    for nm, a, adt in ((names[1], sc, np.float32), (names[2], zp, np.int32)):
        if a.dtype != adt or a.shape != per:
            raise QuantizationError(
                f"tensor {nm!r}: {scheme} of a [{n}, {k}] weight needs {np.dtype(adt)} "
                f"{list(per)}, given {a.dtype} {list(a.shape)}"
            )


#: the rows a GGUF weight is interleaved by when it is repacked at load (``csrc/dq_layout.h``)
#: for each target: one group of R rows is one sequential stream for the GEMV, R rows
#: sharing each X load (AVX-512: 8; AVX2 and the portable target: 4; the aarch64 targets:
#: 4, one row per lane of the SDOT group kernel's sum vector, ``csrc/dqgemm_neon.h``)
REPACK_ROWS: dict[cpu.Target, int] = {
    cpu.Target.PORTABLE: 4,
    cpu.Target.AVX2: 4,
    cpu.Target.AVX512: 8,
    cpu.Target.NEON: 4,
    cpu.Target.DOTPROD: 4,
    cpu.Target.I8MM: 4,
}


def repack_rows(target: cpu.Target) -> int:
    """R (4 or 8) for GGUF weights repacked for ``target`` (:data:`REPACK_ROWS`: 8 on
    AVX-512, 4 on AVX2, the portable target and the aarch64 targets)."""
    return REPACK_ROWS[target]


def _interleaved_view(scheme: S.QuantScheme, n: int, k: int, rows: int) -> tuple[int, int, int]:
    lay = layout(scheme, k)
    if not scheme.is_gguf:
        raise QuantizationError(f"{scheme}: only GGUF block layouts are repacked")
    if rows not in (4, 8):
        raise InputError(f"repack: rows must be 4 or 8, given {rows}")
    return n - n % rows, k // lay.qk, lay.bb


def repack(
    scheme: S.QuantScheme,
    packed: np.ndarray,
    n: int,
    k: int,
    rows: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The u8 ``[n, row_bytes]`` GGUF weight ``packed`` (rows in order) with its first
    ``n - n % rows`` rows interleaved by ``rows`` at block granularity (``csrc/dq_layout.h``):
    in group g, block b of rows g R .. g R + R - 1 are consecutive. The block bytes and the
    tail rows are unchanged. ``out`` (same shape, may not alias ``packed``) receives it."""
    check_packed(scheme, packed, n, k, "packed")
    full, nb, bb = _interleaved_view(scheme, n, k, rows)
    res = np.empty_like(packed) if out is None else out
    src = packed[:full].reshape(full // rows, rows, nb, bb)
    res[:full].reshape(full // rows, nb, rows, bb)[...] = src.transpose(0, 2, 1, 3)
    res[full:] = packed[full:]
    return res


def repack_enabled() -> bool:
    """RLX_DQ_REPACK: ``1`` (default) repacks GGUF weights at load into the interleaved
    layout of the selected target (:func:`repack_rows`), ``0`` keeps them as stored."""
    from rlx import config

    return config.dq_repack()


def _mapping(arr: np.ndarray) -> mmap.mmap | None:
    """The read-only file mapping ``arr``'s memory belongs to, if any."""
    base: object = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        if isinstance(base, np.memmap) and isinstance(getattr(base, "_mmap", None), mmap.mmap):
            return base._mmap  # type: ignore[no-any-return]
        if isinstance(base, memoryview):
            base = base.obj
        else:
            base = getattr(base, "base", None)
    return None


def file_mapped(arr: np.ndarray) -> bool:
    """Whether ``arr`` is a read-only view of a read-only (shared) file mapping, whose
    pages :func:`release_mapped` can drop."""
    mm = _mapping(arr)
    if mm is None or arr.flags.writeable or not hasattr(mm, "madvise"):
        return False
    with memoryview(mm) as view:
        return bool(view.readonly)


def release_mapped(arr: np.ndarray) -> bool:
    """Drop the resident pages of ``arr`` when it is a view of a read-only file mapping
    (a GGUF file that was repacked: its bytes are read again from the file only if
    something else reads them). Returns whether it did; any other memory is left alone."""
    mm = _mapping(arr)
    if mm is None or not file_mapped(arr):  # a private mapping may hold changed pages
        return False
    try:
        start = np.frombuffer(mm, np.uint8).ctypes.data
    except (TypeError, ValueError):
        return False
    page = mmap.PAGESIZE
    lo = arr.ctypes.data - start
    hi = lo + arr.nbytes
    lo = -(-lo // page) * page
    hi = hi // page * page
    if lo < 0 or hi <= lo or hi > len(mm):
        return False
    mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return True


def unrepack(scheme: S.QuantScheme, packed: np.ndarray, n: int, k: int, rows: int) -> np.ndarray:
    """The inverse of :func:`repack`: the rows of an interleaved weight back in order."""
    check_packed(scheme, packed, n, k, "packed")
    full, nb, bb = _interleaved_view(scheme, n, k, rows)
    res = np.empty_like(packed)
    src = packed[:full].reshape(full // rows, nb, rows, bb)
    res[:full].reshape(full // rows, rows, nb, bb)[...] = src.transpose(0, 2, 1, 3)
    res[full:] = packed[full:]
    return res


def _fp8_lut(scheme: S.QuantScheme) -> np.ndarray:
    dt = f8e4m3_np() if isinstance(scheme, S.Fp8E4m3) else f8e5m2_np()
    return np.arange(256, dtype=np.uint8).view(dt).astype(np.float32)


def q8_digits() -> bool:
    """RLX_DQ_Q8_DIGITS as a bool (default on): Q8_0's exact decode GEMV on interleaved rows
    takes the VNNI digit kernel (``csrc/dqgemm_q8dig.c``) where the build has it; off: the
    f32 group kernel. Read with rlx.config's flag rules (values and errors as RLX_DQ_BF16)."""
    from rlx import config

    return config.dq_q8_digits()


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


class DqGemmLib:
    """Typed wrapper over ``csrc/dqgemm.c`` built for one target."""

    def __init__(self, lib: ctypes.CDLL, target: cpu.Target):
        self.lib = lib
        self.target = target
        self.openmp = bool(lib.rlx_dq_openmp())
        self.lanes = int(lib.rlx_dq_lanes())
        self._luts: dict[type, np.ndarray] = {}

    def bf16_dot(self, scheme: S.QuantScheme) -> bool:
        """Whether this build has the bf16 dot-product decode GEMV for ``scheme``
        (``csrc/dqgemm_bf16dot.c``: the AVX-512 target on a CPU with avx512_bf16;
        Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, and Q8_0 on its f32 group kernel)."""
        code = _GGUF_CODES.get(type(scheme))
        return code is not None and bool(self.lib.rlx_dq_bf16_ok(code))

    def uses_bf16(self, scheme: S.QuantScheme, m: int, act: str) -> bool:
        """Whether ``m`` f32 activation rows against a ``scheme`` weight under activation
        mode ``act`` run the bf16 dot-product GEMV: one row, not the int8 path, the kernel
        built here (:meth:`bf16_dot`) and RLX_DQ_BF16 on (:func:`rlx.config.dq_bf16`)."""
        from rlx import config

        return m == 1 and not uses_q8(scheme, m, act) and self.bf16_dot(scheme) and config.dq_bf16()

    def _aux(self, scheme: S.QuantScheme, ws: tuple[np.ndarray, ...]) -> tuple:
        if scheme.is_gguf:
            return ws[0], None, None, None
        w, sc, zp = ws
        lut = None
        if isinstance(scheme, (S.Fp8E4m3, S.Fp8E5m2)):
            lut = self._luts.setdefault(type(scheme), _fp8_lut(scheme))
        return w, sc, zp, lut

    def _call(
        self,
        scheme: S.QuantScheme,
        x: np.ndarray,
        ws: tuple[np.ndarray, ...],
        out: np.ndarray,
        num_threads: int,
        act: str,
        rows: int = 1,
    ) -> tuple[Callable[..., int], tuple]:
        """The C function (``rlx_dq_gemm``, or ``rlx_dq_gemm_q8`` when :func:`uses_q8`)
        and its argument tuple for checked ``x`` [M, K], ``ws`` and ``out`` [M, N]
        (``ws`` interleaved by ``rows``, :func:`repack`)."""
        m, k = x.shape
        n = out.shape[1]
        lay = layout(scheme, k)
        w, sc, zp, lut = self._aux(scheme, ws)
        if act not in ACTS:
            raise InputError(f"dqgemm: act must be one of {', '.join(ACTS)}, given {act!r}")
        if rows != 1 and (rows not in (4, 8) or not scheme.is_gguf):
            raise InputError(
                f"dqgemm: rows (interleaved) must be 1, or 4 / 8 for a GGUF scheme; given "
                f"{rows} for {scheme}"
            )
        if uses_q8(scheme, m, act):
            return self.lib.rlx_dq_gemm_q8, (
                lay.code, lay.qk, lay.bb, m, n, k, _ptr(x), k, _ptr(w), lay.row_bytes,
                _ptr(out), n, int(num_threads), int(rows),
            )  # fmt: skip
        if self.uses_bf16(scheme, m, act):
            return self.lib.rlx_dq_gemv_bf16, (
                lay.code, lay.qk, lay.bb, n, k, _ptr(x), _ptr(w), lay.row_bytes, _ptr(out),
                int(num_threads), int(rows), int(q8_digits()),
            )  # fmt: skip
        return self.lib.rlx_dq_gemm, (
            lay.code, lay.qk, lay.bb, m, n, k, _ptr(x), k, _ptr(w), lay.row_bytes,
            _ptr(sc), _ptr(zp), _ptr(lut), _ptr(out), n, int(num_threads), int(rows),
        )  # fmt: skip

    def gemm(
        self,
        scheme: S.QuantScheme,
        x: np.ndarray,
        ws: tuple[np.ndarray, ...],
        out: np.ndarray,
        *,
        num_threads: int = 1,
        check: bool = True,
        names: tuple[str, ...] = ("w_q", "scale", "zp"),
        act: str = "f32",
        rows: int = 1,
    ) -> None:
        """``out = x @ dequant(ws).T`` for C-contiguous f32 ``x`` [M, K] and ``out``
        [M, N]; ``ws`` as :func:`check_weights` (checked unless ``check=False``), its rows
        interleaved by ``rows`` (1: plain; 4 / 8: :func:`repack`, GGUF only).
        ``act``: where :func:`uses_q8` says so, ``x`` is quantized to int8 per 32 inputs
        and the products are integer (``csrc/dqgemm_q8.c``, error bound there)."""
        m, k = x.shape
        n = out.shape[1]
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            raise InputError(f"dqgemm: x must be C-contiguous f32, given {x.dtype} {x.shape}")
        if out.dtype != np.float32 or out.shape != (m, n) or not out.flags.c_contiguous:
            raise InputError(
                f"dqgemm: out must be C-contiguous f32 [{m}, {n}], given {out.dtype} {out.shape}"
            )
        if check:
            check_weights(scheme, ws, n, k, names)
        fn, args = self._call(scheme, x, ws, out, num_threads, act, rows)
        rc = fn(*args)
        if rc == 1:
            raise MemoryError("dqgemm: could not allocate a decode buffer")
        if rc != 0:
            raise InputError(f"dqgemm: rejected {scheme} with K={k} (code {rc})")

    def bind(
        self,
        scheme: S.QuantScheme,
        x: np.ndarray,
        ws: tuple[np.ndarray, ...],
        out: np.ndarray,
        *,
        num_threads: int = 1,
        names: tuple[str, ...] = ("w_q", "scale", "zp"),
        act: str = "f32",
        rows: int = 1,
    ) -> Callable[[], None]:
        """:meth:`gemm` with every argument checked and converted once: returns a
        zero-argument call (for a kernel whose arrays never move, e.g. arena views)."""
        self.gemm(scheme, x[:0], ws, out[:0], check=True, names=names, rows=rows)  # checks only
        fn, args = self._call(scheme, x, ws, out, num_threads, act, rows)
        keep = (x, ws, out, self)  # the arrays (and self's FP8 tables) must outlive the call

        def call() -> None:
            if fn(*args) != 0:
                raise MemoryError(f"dqgemm: could not allocate a decode buffer ({len(keep)})")

        # one C call: the native schedule makes it from its descriptor loop (a non-zero
        # result fails the run there as here), so a decode step has no Python per GEMV
        call.native_call = (fn, args, True)  # type: ignore[attr-defined]
        return call

    def decode(
        self, scheme: S.QuantScheme, ws: tuple[np.ndarray, ...], n: int, k: int, rows: int = 1
    ) -> np.ndarray:
        """The f32 ``[n, k]`` weight ``ws`` (rows interleaved by ``rows``) stands for,
        decoded by the C code (rows in order)."""
        check_weights(scheme, ws, n, k)
        lay = layout(scheme, k)
        w, sc, zp, lut = self._aux(scheme, ws)
        out = np.empty((n, k), np.float32)
        rc = self.lib.rlx_dq_decode(
            lay.code, lay.qk, lay.bb, k, _ptr(w), lay.row_bytes, _ptr(sc), _ptr(zp), _ptr(lut),
            0, n, _ptr(out), n, int(rows),
        )  # fmt: skip
        if rc != 0:
            raise InputError(f"dqgemm.decode: rejected {scheme} with K={k}, rows={rows}")
        return out

    def stream_read(self, a: np.ndarray, num_threads: int = 1) -> float:
        """Sum of C-contiguous f32 ``a``, read once with vector loads on ``num_threads``
        threads (time it for the streaming read bandwidth)."""
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            raise InputError("stream_read: a must be C-contiguous f32")
        return float(self.lib.rlx_dq_stream_read(_ptr(a), a.size, int(num_threads)))


#: the C source, concatenated in this order (see the overview atop ``csrc/dqgemm.c``)
SOURCES = DQGEMM_SOURCES


def dqgemm_source() -> str:
    """The library's C source: :data:`SOURCES` concatenated, the headers they include
    inlined (:func:`rlx.backends.cpu.native.csrc_source`)."""
    from rlx.backends.cpu import native

    return native.csrc_source(*SOURCES)


def dqgemm_lib(target: cpu.Target | None = None) -> DqGemmLib:
    """Build (cached) and load ``csrc/dqgemm.c`` for ``target`` (default: the selected
    one). CompileError without gcc or when the build fails."""
    return _lib(cpu.selected_target() if target is None else target)


@functools.cache
def _lib(target: cpu.Target) -> DqGemmLib:
    from rlx.backends.cpu import native

    if not native.available():
        raise CompileError("the dequant-matmul kernel needs gcc, which is not on PATH")
    source = dqgemm_source()
    return DqGemmLib(
        bindings.typed(native.load(native.build(source, target, "dqgemm")), source), target
    )
