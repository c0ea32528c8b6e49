"""The int8 GEMM library (``csrc/qgemm.c``). In: int8 activations and weights. Out: int32
or scaled f32 results, through :class:`QGemmLib` (pack a weight once, then run GEMMs).

:func:`qgemm_lib` builds the GEMM for an :class:`~rlx.backends.cpu.native.cpu.Isa` the
selected target holds (``RLX_ISA``): VNNI512 only on the AVX512 target of a CPU with
VNNI, AVX2 from the AVX2 target, PLAIN always.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.cpu import Isa
from rlx.errors import CompileError, InputError

__all__ = ["QGemmLib", "qgemm_lib"]

_P = ctypes.c_void_p
_L = ctypes.c_long


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


class QGemmLib:
    """Typed wrapper over ``csrc/qgemm.c``: pack a weight once, then run GEMMs."""

    def __init__(self, lib: ctypes.CDLL, isa: Isa):
        self.lib = lib
        self.isa = isa
        lib.rlx_qgemm_packed_size.restype = _L
        lib.rlx_qgemm_packed_size.argtypes = [_L, _L]
        lib.rlx_qgemm_pack_b.restype = None
        lib.rlx_qgemm_pack_b.argtypes = [_P, _L, _L, _L, _P, _P]
        lib.rlx_qgemm.restype = ctypes.c_int
        lib.rlx_qgemm.argtypes = [
            _L,
            _L,
            _L,
            _P,
            _L,
            ctypes.c_int32,
            _P,
            _P,
            _P,
            _P,
            _L,
            _P,
            _P,
            ctypes.c_int,
        ]
        lib.rlx_quantize_f32_q8.restype = None
        lib.rlx_quantize_f32_q8.argtypes = [
            _P,
            _L,
            ctypes.c_float,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
            _P,
        ]
        self.openmp = bool(lib.rlx_qgemm_openmp())

    def quantize(self, x: np.ndarray, scale: float, zero_point: int, out: np.ndarray) -> None:
        """Per-tensor ``clip(rint(x / scale) + zero_point)`` of C-contiguous f32 ``x`` into
        int8 or uint8 ``out`` (same shape), exactly as ``rlx.ops.quant.quantize_array``."""
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            raise InputError(f"quantize: x must be C-contiguous f32, given {x.dtype} {x.shape}")
        if (
            out.dtype not in (np.int8, np.uint8)
            or out.shape != x.shape
            or not out.flags.c_contiguous
        ):
            raise InputError(
                f"quantize: out must be C-contiguous i8/u8 {x.shape}, given {out.dtype} {out.shape}"
            )
        qmin, qmax = (-128, 127) if out.dtype == np.int8 else (0, 255)
        self.lib.rlx_quantize_f32_q8(
            _ptr(x), x.size, float(scale), int(zero_point), qmin, qmax, _ptr(out)
        )

    def pack(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pack an int8 weight [K, N]; returns (packed bytes, column sums int32 [N])."""
        w = np.ascontiguousarray(w, dtype=np.int8)
        k, n = w.shape
        packed = np.empty(int(self.lib.rlx_qgemm_packed_size(k, n)), np.uint8)
        colsum = np.empty(n, np.int32)
        self.lib.rlx_qgemm_pack_b(_ptr(w), n, k, n, _ptr(packed), _ptr(colsum))
        return packed, colsum

    def gemm(
        self,
        a: np.ndarray,
        packed: tuple[np.ndarray, np.ndarray],
        n: int,
        *,
        a_zero_point: int = 0,
        out_i32: np.ndarray | None = None,
        out_f32: np.ndarray | None = None,
        scale: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        num_threads: int = 1,
    ) -> None:
        """``(a - a_zero_point) @ w`` for int8 ``a`` [M, K] (C-contiguous) into ``out_i32``
        [M, N] and/or ``out_f32`` [M, N] (``f32(acc) * scale[n] + bias[n]``)."""
        m, k = a.shape
        bp, colsum = packed
        if a.dtype != np.int8 or not a.flags.c_contiguous:
            raise InputError(
                f"qgemm: activations must be C-contiguous int8, given {a.dtype} {a.shape}"
            )
        if colsum.shape != (n,) or bp.nbytes != self.lib.rlx_qgemm_packed_size(k, n):
            raise InputError(
                f"qgemm: the packed weight is not a [{k}, {n}] weight packed by this library"
            )
        for name, o, dt in (("out_i32", out_i32, np.int32), ("out_f32", out_f32, np.float32)):
            if o is not None and (o.dtype != dt or o.shape != (m, n) or not o.flags.c_contiguous):
                raise InputError(
                    f"qgemm: {name} must be C-contiguous {np.dtype(dt)} [{m}, {n}], given {o.dtype} {o.shape}"
                )
        if out_f32 is not None:
            if scale is None or scale.dtype != np.float32 or scale.shape != (n,):
                raise InputError(f"qgemm: out_f32 needs scale f32 [{n}]")
            if bias is not None and (bias.dtype != np.float32 or bias.shape != (n,)):
                raise InputError(f"qgemm: bias must be f32 [{n}], given {bias.dtype} {bias.shape}")
        rc = self.lib.rlx_qgemm(
            m, n, k, _ptr(a), k, int(a_zero_point), _ptr(bp), _ptr(colsum),
            _ptr(out_i32), _ptr(out_f32), n, _ptr(scale), _ptr(bias), int(num_threads),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError(f"qgemm: could not allocate the packed activations ({m}x{k})")


def qgemm_lib(isa: Isa | None = None) -> QGemmLib:
    """Build (cached) and load the int8 GEMM for ``isa`` (default: the best the selected
    target holds). CompileError without gcc, when the build fails or when the selected
    target (``RLX_ISA``) cannot hold ``isa``."""
    target = cpu.selected_target()
    usable = cpu.isas_for(target)
    isa = usable[-1] if isa is None else isa
    if isa not in usable:
        raise CompileError(
            f"the {isa.name} int8 GEMM is not available on the {target.name} target "
            f"(RLX_ISA); usable paths: {[i.name for i in usable]}"
        )
    return _qgemm_lib(isa, target)


@functools.cache
def _qgemm_lib(isa: Isa, target: cpu.Target) -> QGemmLib:
    from rlx.backends.cpu import native

    source = (native.CSRC / "qgemm.c").read_text()
    return QGemmLib(native.load(native.build(source, isa, "qgemm", target=target)), isa)
