"""The int8 GEMM library (``csrc/qgemm.c``, ``qgemm_kernels.c``, ``qgemm_epilogue.c``,
``qgemm_run.c``). In: int8 / uint8 activations (or f32 / bf16
rows it quantizes per row itself) and int8 weights. Out: int32 accumulators and / or f32
results through the fused epilogue (row x channel scale, bias, activation, residual), via
:class:`QGemmLib` (pack a weight once, then run GEMMs).

:func:`qgemm_lib` builds the GEMM for an :class:`~rlx.backends.cpu.native.cpu.Isa` the
selected target holds (``RLX_ISA``): VNNI512 only on the AVX512 target of a CPU with
VNNI (which also takes AMX-INT8 tiles when the CPU and kernel allow them and K is a
multiple of 64, :attr:`QGemmLib.has_amx`; ``RLX_AMX=0`` builds it without them), AVX2 from the AVX2 target, PLAIN always;
on aarch64 NEON (SMULL + SADALP) on every target, SDOT from the dotprod target and SMMLA
(weights packed 8 k deep, SMMLA's operand layout) on i8mm (``csrc/qgemm_neon.h``).
The AVX2 path has two exact micro-kernels and picks one per packed weight
(:meth:`QGemmLib.takes_7bit`): vpmaddubsw + vpmaddwd when every weight lies in
[-64, 64] (7-bit weights, as ONNX Runtime's ``reduce_range``), vpmaddwd on int16
otherwise (see ``csrc/qgemm.c``).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx.backends.cpu.native import bindings, cpu
from rlx.backends.cpu.native.cpu import Isa
from rlx.backends.cpu.native.prebuilt import QGEMM_SOURCES
from rlx.errors import CompileError, InputError

__all__ = ["QGemmLib", "qgemm_lib", "ACT_CODES", "A_KINDS"]


#: The C sources, joined in this order into one translation unit.
SOURCES = QGEMM_SOURCES
#: Epilogue activation -> the C ``act`` code (``UnaryKind`` values of EPILOGUE_ACTS).
ACT_CODES: dict[str | None, int] = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
#: Activation dtype -> the C ``a_kind`` code (int8 / uint8 static, f32 / bf16 dynamic).
A_KINDS: dict[str, int] = {"int8": 0, "uint8": 1, "float32": 2, "bfloat16": 3}


class _RunArgs(ctypes.Structure):
    """``qgemm_args_t`` of ``csrc/qgemm_run.c`` (the arguments of ``rlx_qgemm_run``)."""

    _fields_ = [
        ("M", ctypes.c_long), ("N", ctypes.c_long), ("K", ctypes.c_long),
        ("a_kind", ctypes.c_int), ("A", ctypes.c_void_p), ("lda", ctypes.c_long),
        ("a_zp", ctypes.c_int32), ("a_scale", ctypes.c_float), ("mode", ctypes.c_int),
        ("Bp", ctypes.c_void_p), ("colsum", ctypes.c_void_p), ("ws", ctypes.c_void_p),
        ("bias", ctypes.c_void_p), ("act", ctypes.c_int), ("res", ctypes.c_void_p),
        ("ldr", ctypes.c_long), ("Y", ctypes.c_void_p), ("ldy", ctypes.c_long),
        ("C", ctypes.c_void_p), ("ldc", ctypes.c_long), ("row_scale", ctypes.c_void_p),
        ("row_zp", ctypes.c_void_p), ("nthreads", ctypes.c_int), ("flags", ctypes.c_int),
    ]  # fmt: skip


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _aligned_bytes(nbytes: int, align: int = 64) -> np.ndarray:
    """``nbytes`` uint8 starting on an ``align``-byte boundary (packed panels are read with
    full-vector loads: a misaligned start makes every other one a cache-line split)."""
    raw = np.empty(nbytes + align, np.uint8)
    off = -raw.ctypes.data % align
    return raw[off : off + nbytes]


class QGemmLib:
    """Typed wrapper over the ``csrc/qgemm*.c`` library: pack a weight once, then run GEMMs."""

    def __init__(self, lib: ctypes.CDLL, isa: Isa):
        self.lib = lib
        self.isa = isa
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
        packed = _aligned_bytes(int(self.lib.rlx_qgemm_packed_size(k, n)))
        colsum = np.empty(n, np.int32)
        self.lib.rlx_qgemm_pack_b(_ptr(w), n, k, n, _ptr(packed), _ptr(colsum))
        return packed, colsum

    def pack_strided(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pack an int8 ``[K, N]`` view with any strides (e.g. a transposed activation)."""
        if w.dtype != np.int8 or w.ndim != 2:
            raise InputError(f"qgemm: the weight must be int8 [K, N], given {w.dtype} {w.shape}")
        k, n = w.shape
        sk, sn = (s // w.itemsize for s in w.strides)
        packed = _aligned_bytes(int(self.lib.rlx_qgemm_packed_size(k, n)))
        colsum = np.empty(n, np.int32)
        self.lib.rlx_qgemm_pack_b_strided(_ptr(w), sk, sn, k, n, _ptr(packed), _ptr(colsum))
        return packed, colsum

    def run(
        self,
        a: np.ndarray,
        packed: tuple[np.ndarray, np.ndarray],
        n: int,
        **kw: Any,
    ) -> None:
        """The fused op once (see :meth:`bind` for the arguments)."""
        self.bind(a, n, **kw)(packed)

    def bind(
        self,
        a: np.ndarray,
        n: int,
        *,
        a_zero_point: int = 0,
        a_scale: float = 1.0,
        mode: int = 0,
        w_scales: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        act: str | None = None,
        residual: np.ndarray | None = None,
        out_f32: np.ndarray | None = None,
        out_i32: np.ndarray | None = None,
        row_scale: np.ndarray | None = None,
        row_zp: np.ndarray | None = None,
        num_threads: int = 1,
        amx: bool = True,
    ) -> Callable[[tuple[np.ndarray, np.ndarray]], None]:
        """The fused op on ``a`` [M, K] (rows C-contiguous; int8 / uint8 with
        ``a_zero_point`` and ``a_scale``; f32 / bf16 quantized with them, ``mode`` 2: to
        int8, 3: to uint8; or f32 / bf16 quantized per row, ``mode`` 0: s8, 1: u8):
        ``out_f32 = act(f32(acc) * (row_scale[m] * w_scales[n]) + bias) + residual`` and /
        or ``out_i32 = acc``; ``amx=False`` keeps a VNNI512 build off its AMX tiles.
        Returns ``call(packed)`` running it on a packed ``[K, N]`` weight: every array is
        checked here once (dtype, shape, contiguity), since the C code trusts them, so a
        kernel binds its arena views at build time and pays only the C call per run."""
        rows_ok = a.ndim == 2 and (a.size == 0 or a.shape[1] == 1 or a.strides[1] == a.itemsize)
        if not rows_ok or a.dtype.name not in A_KINDS:
            raise InputError(
                f"qgemm: activations must be int8/uint8/f32/bf16 [M, K] with contiguous rows, "
                f"given {a.dtype} {a.shape}"
            )
        m, k = a.shape
        lda = a.strides[0] // a.itemsize if a.size else k
        if act not in ACT_CODES:
            raise InputError(f"qgemm: act must be one of {list(ACT_CODES)}, given {act!r}")
        checks = (
            ("out_f32", out_f32, np.float32, (m, n)),
            ("out_i32", out_i32, np.int32, (m, n)),
            ("w_scales", w_scales, np.float32, (n,)),
            ("bias", bias, np.float32, (n,)),
            ("residual", residual, np.float32, (m, n)),
            ("row_scale", row_scale, np.float32, (m,)),
            ("row_zp", row_zp, np.int32, (m,)),
        )
        for name, o, dt, shape in checks:
            if o is not None and (o.dtype != dt or o.shape != shape or not o.flags.c_contiguous):
                raise InputError(
                    f"qgemm: {name} must be C-contiguous {np.dtype(dt)} {list(shape)}, "
                    f"given {o.dtype} {o.shape}"
                )
        if out_f32 is not None and w_scales is None:
            raise InputError(f"qgemm: out_f32 needs w_scales f32 [{n}]")
        size = self.lib.rlx_qgemm_packed_size(k, n)
        args = _RunArgs(
            m, n, k, A_KINDS[a.dtype.name], _ptr(a), lda, int(a_zero_point), float(a_scale),
            int(mode), None, None, _ptr(w_scales), _ptr(bias), ACT_CODES[act], _ptr(residual),
            n, _ptr(out_f32), n, _ptr(out_i32), n, _ptr(row_scale), _ptr(row_zp),
            int(num_threads), 0 if amx else 1,
        )  # fmt: skip
        fn, pargs = self.lib.rlx_qgemm_run_args, ctypes.addressof(args)
        seen: list[Any] = [None]  # the packed weight last used
        # the arrays behind the pointers stay alive as long as the bound call
        keep = (a, w_scales, bias, residual, out_f32, out_i32, row_scale, row_zp, args)

        def use(packed: tuple[np.ndarray, np.ndarray]) -> None:
            if seen[0] is not packed:
                bp, colsum = packed
                if colsum.shape != (n,) or bp.nbytes != size:
                    raise InputError(
                        f"qgemm: the packed weight is not a [{k}, {n}] weight packed by this "
                        "library"
                    )
                seen[0] = packed
                args.Bp, args.colsum = _ptr(bp), _ptr(colsum)

        def call(packed: tuple[np.ndarray, np.ndarray], _keep: tuple = keep) -> None:
            use(packed)
            if fn(pargs) != 0:
                raise MemoryError(f"qgemm: could not allocate the packed activations ({m}x{k})")

        def fixed(packed: tuple[np.ndarray, np.ndarray]) -> tuple[Any, tuple[int], bool]:
            """Binds ``packed`` for good; returns the ``native_call`` of the run on it
            (``(function, args, checked)``, see ``native/schedule.py``): one C call, no
            Python. The caller keeps ``call`` (and so the arrays) alive."""
            use(packed)
            return fn, (pargs,), True

        call.fixed = fixed  # type: ignore[attr-defined]
        return call

    def quantize_rows(
        self, x: np.ndarray, mode: int = 0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows of f32 ``x`` [M, K] (contiguous rows) quantized as the dynamic GEMM does
        (``mode`` 0: s8, 1: u8): ``(q int8 / uint8 [M, K], scales f32 [M], zps int32 [M])``."""
        if x.dtype != np.float32 or x.ndim != 2 or x.strides[1] != 4:
            raise InputError(f"quantize_rows: x must be f32 [M, K] rows, given {x.dtype} {x.shape}")
        m, k = x.shape
        q = np.empty((m, k), np.int8 if mode == 0 else np.uint8)
        scales, zps = np.empty(m, np.float32), np.empty(m, np.int32)
        rc = self.lib.rlx_qgemm_quantize_rows(
            _ptr(x), m, k, x.strides[0] // 4, int(mode), _ptr(q), k, _ptr(scales), _ptr(zps)
        )
        if rc != 0:
            raise MemoryError("quantize_rows: out of memory")
        return q, scales, zps

    def batch_run(
        self,
        a: np.ndarray,
        bt: np.ndarray,
        out: np.ndarray,
        *,
        a_mode: int = 0,
        alpha: float = 1.0,
        num_threads: int = 1,
    ) -> None:
        """``out[b] = (a[b] @ bt[b]^T)`` with both operands quantized per row at run time
        (``a`` rows by ``a_mode``, ``bt`` rows s8), scaled by the row scales and ``alpha``:
        ``a`` f32 / bf16 [B, M, K], ``bt`` f32 [B, N, K], ``out`` f32 [B, M, N], each with
        contiguous rows and a uniform batch stride."""
        if a.ndim != 3 or bt.ndim != 3 or out.ndim != 3:
            raise InputError("batch_run: a, bt and out must be 3-D")
        nb, m, k = a.shape
        n = bt.shape[1]
        if bt.shape != (nb, n, k) or out.shape != (nb, m, n):
            raise InputError(
                f"batch_run: shapes a {a.shape}, bt {bt.shape}, out {out.shape} do not agree"
            )
        for name, arr, dts in (
            ("a", a, ("float32", "bfloat16")),
            ("bt", bt, ("float32",)),
            ("out", out, ("float32",)),
        ):
            if arr.dtype.name not in dts or arr.strides[2] != arr.itemsize:
                raise InputError(f"batch_run: {name} must be {dts} with contiguous rows")
        e = a.itemsize
        rc = self.lib.rlx_qbatch_run(
            nb, m, n, k, A_KINDS[a.dtype.name], _ptr(a), a.strides[0] // e, a.strides[1] // e,
            int(a_mode), _ptr(bt), bt.strides[0] // 4, bt.strides[1] // 4, float(alpha),
            _ptr(out), out.strides[0] // 4, out.strides[1] // 4, int(num_threads),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError("batch_run: out of memory")

    def takes_7bit(self, packed: tuple[np.ndarray, np.ndarray], k: int, n: int) -> bool:
        """Whether ``packed`` (a ``[k, n]`` weight packed by :meth:`pack`) runs on the AVX2
        vpmaddubsw kernel: AVX2 path and every weight in [-64, 64]. False elsewhere."""
        bp, colsum = packed
        if colsum.shape != (n,) or bp.nbytes != self.lib.rlx_qgemm_packed_size(k, n):
            raise InputError(
                f"qgemm: the packed weight is not a [{k}, {n}] weight packed by this library"
            )
        return bool(self.lib.rlx_qgemm_packed_narrow(_ptr(bp), k, n))

    @property
    def has_amx(self) -> bool:
        """Whether :meth:`run` takes AMX-INT8 tiles for K a multiple of 64 (VNNI512 build on
        a CPU with amx_int8 whose kernel grants the tile state)."""
        return bool(self.lib.rlx_qgemm_has_amx())

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
    target holds); under ``RLX_AMX=0`` built without its AMX path. CompileError without gcc, when the build fails or when the selected
    target (``RLX_ISA``) cannot hold ``isa``."""
    target = cpu.selected_target()
    usable = cpu.isas_for(target)
    isa = usable[-1] if isa is None else isa
    if isa not in usable:
        raise CompileError(
            f"the {isa.name} int8 GEMM is not available on the {target.name} target "
            f"(RLX_ISA); usable paths: {[i.name for i in usable]}"
        )
    return _qgemm_lib(isa, target, cpu.amx_prelude())


@functools.cache
def _qgemm_lib(isa: Isa, target: cpu.Target, prelude: str = "") -> QGemmLib:
    from rlx.backends.cpu import native

    source = prelude + native.csrc_source(*SOURCES)
    lib = native.load(native.build(source, isa, "qgemm", target=target))
    return QGemmLib(bindings.typed(lib, source), isa)
