"""The 16-bit float weight product library (``csrc/half_linear.c``). In: f32 activations
``x [M, K]`` and a bf16 or f16 weight ``w [N, K]`` (rows = output channels, read where
they lie: a read-only file mapping is never copied). Out: f32 ``y = x @ w.T``, the
products and sums in f32 of the exactly widened weight (:meth:`HalfLinearLib.linear`).

:func:`half_linear_lib` builds the library (at run time, cached on disk by content) for
the selected native target (``RLX_ISA``): AVX-512 (16 lanes, ``vcvtph2ps`` for f16, a
16-bit shift for bf16), AVX2 + F16C (8 lanes), NEON on the aarch64 targets (4 lanes,
``fcvtl`` for f16, ``ushll`` for bf16; ``csrc/lowp_neon.h``) or portable C. The rows of ``w`` are split
over OpenMP threads. Every operand is checked before the C code reads it (an
InputError naming the operand, what was expected and what was given).
"""

from __future__ import annotations

import ctypes
import enum
import functools
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from rlx.backends.cpu import native
from rlx.backends.cpu.native import bindings
from rlx.errors import InputError

__all__ = ["HalfKind", "HalfLinearLib", "half_linear_lib", "SOURCES"]

#: the C files of the library
SOURCES = ("half_linear.c",)


class HalfKind(enum.IntEnum):
    """The weight's 16-bit float format (the C ``kind`` argument)."""

    BF16 = 0
    F16 = 1


_KINDS = {np.dtype(ml_dtypes.bfloat16): HalfKind.BF16, np.dtype(np.float16): HalfKind.F16}


def _rows(name: str, a: np.ndarray, dtype: np.dtype | None, writable: bool = False) -> None:
    """InputError unless ``a`` is 2-D with contiguous, aligned rows (of ``dtype``)."""
    if not isinstance(a, np.ndarray) or a.ndim != 2:
        got = f"{a.ndim}-D" if isinstance(a, np.ndarray) else type(a).__name__
        raise InputError(f"half_linear: {name} must be a 2-D array, given {got}")
    if dtype is not None and a.dtype != dtype:
        raise InputError(f"half_linear: {name} must be {dtype}, given {a.dtype}")
    item = a.itemsize
    if (
        (a.shape[1] > 1 and a.strides[1] != item)
        or a.strides[0] % item
        or a.strides[0] < 0
        or not a.flags.aligned
    ):
        raise InputError(
            f"half_linear: {name} must have contiguous rows, given shape {a.shape} strides "
            f"{a.strides}"
        )
    if writable and not a.flags.writeable:
        raise InputError(f"half_linear: {name} must be writable")


@dataclass(frozen=True)
class HalfLinearLib:
    """The loaded library: ``lib`` (typed from the C prototypes), ``max_level`` (the best
    SIMD level it was built for: 3 aarch64 NEON, 2 AVX-512, 1 AVX2, 0 portable C) and
    ``openmp``."""

    lib: ctypes.CDLL
    max_level: int
    openmp: bool

    @property
    def levels(self) -> tuple[int, ...]:
        """The SIMD levels this library runs: 0 and the x86 ones up to ``max_level``, or
        0 and 3 (NEON) on aarch64 (levels 1 and 2 run the portable code there)."""
        return (0, 3) if self.max_level == 3 else tuple(range(self.max_level + 1))

    def linear(
        self,
        x: np.ndarray,
        w: np.ndarray,
        out: np.ndarray | None = None,
        threads: int = 1,
        level: int | None = None,
    ) -> np.ndarray:
        """f32 ``x [M, K] @ w.T`` for bf16 / f16 ``w [N, K]``, written into ``out``
        (f32 ``[M, N]``, rows contiguous; None: a new array) and returned. ``threads``:
        OpenMP threads the rows of ``w`` are split over; ``level``: the SIMD level (None:
        ``max_level``; higher is clamped to it). InputError for a bad operand."""
        _rows("x", x, np.dtype(np.float32))
        _rows("w", w, None)
        kind = _KINDS.get(w.dtype)
        if kind is None:
            raise InputError(f"half_linear: w must be bfloat16 or float16, given {w.dtype}")
        m, k = x.shape
        n, kw = w.shape
        if kw != k:
            raise InputError(f"half_linear: x has K = {k}, w has {kw} columns ([N, K] expected)")
        if out is None:
            out = np.empty((m, n), np.float32)
        _rows("out", out, np.dtype(np.float32), writable=True)
        if out.shape != (m, n):
            raise InputError(f"half_linear: out must be [{m}, {n}], given {list(out.shape)}")
        lvl = self.max_level if level is None else min(int(level), self.max_level)
        self.lib.rlx_half_linear(
            x.ctypes.data,
            m,
            x.strides[0] // 4,
            w.ctypes.data,
            n,
            k,
            w.strides[0] // 2,
            int(kind),
            out.ctypes.data,
            n and out.strides[0] // 4,
            max(1, int(threads)),
            lvl,
        )
        return out


def half_linear_lib() -> HalfLinearLib:
    """Build (cached on disk by content) and load the library for the selected native
    target (``RLX_ISA``). CompileError without gcc or when the build fails."""
    return _half_linear_lib(native.selected_target())


@functools.cache
def _half_linear_lib(target: native.Target) -> HalfLinearLib:
    lib = bindings.csrc_library(SOURCES, target, "half_linear")
    return HalfLinearLib(lib, int(lib.rlx_hl_max_level()), bool(lib.rlx_hl_openmp()))


half_linear_lib.cache_clear = _half_linear_lib.cache_clear  # type: ignore[attr-defined]
