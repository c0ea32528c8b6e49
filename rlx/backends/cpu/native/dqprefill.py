"""The prefill GEMM on GGUF-packed weights (``csrc/dqgemm_prefill.c``). In: f32
activations ``[M, K]`` (a prompt, M > :data:`PREFILL_MIN_M` - 1 rows) and a weight packed
in a GGUF block scheme, plain or row-interleaved in groups of ``rows`` rows
(``csrc/dq_layout.h``). Out: ``y = x @ dequant(w).T`` f32 ``[M, N]``
(:meth:`DqPrefillLib.gemm`, :meth:`DqPrefillLib.bind`) and the decoded weight
(:meth:`DqPrefillLib.decode`).

The exact path (``act="f32"``) decodes tiles of the weight into f32 panels for a
register-blocked FMA micro-kernel of the packed SGEMM's design: every weight decoded once
per call, f32 products (the f32 accumulation bound). :func:`dqprefill_lib` builds the
library for the selected target (``RLX_ISA``: AVX-512, AVX2 + FMA, portable SSE2, or the
aarch64 targets' NEON FMLA tile and SDOT int8 kernel, ``csrc/dqgemm_neon.h``).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlx.backends.cpu.native import bindings, cpu
from rlx.errors import InputError
from rlx.formats import schemes as S
from rlx.formats.gguf import check_packed

__all__ = [
    "DqPrefillLib",
    "PrefillCall",
    "dqprefill_lib",
    "SOURCES",
    "PREFILL_SCHEMES",
    "PREFILL_MIN_M",
    "INTERLEAVES",
    "Q8_PREFILL_SCHEMES",
    "PREFILL_ACTS",
    "runs_prefill",
]

#: the C source files, concatenated in this order
SOURCES = ("dqgemm_prefill.c", "dqgemm_prefill_q8.c")

_CODES: dict[type, int] = {
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
#: the schemes the prefill kernel reads
PREFILL_SCHEMES: tuple[type, ...] = tuple(_CODES)
#: the schemes with an int8-activation prefill path (``act="q8"``)
Q8_PREFILL_SCHEMES: tuple[type, ...] = tuple(t for t in _CODES if t is not S.GgufQ8K)
#: activation modes of :meth:`DqPrefillLib.bind`: ``f32`` exact f32 products; ``q8`` X
#: quantized to int8 per 32 inputs, integer dot products (Q8_PREFILL_SCHEMES)
PREFILL_ACTS = ("f32", "q8")
#: the fewest activation rows that take the prefill kernel (fewer: native/dqgemm.py)
PREFILL_MIN_M = 17
#: the row interleaves (``csrc/dq_layout.h``) a packed weight may have
INTERLEAVES = (1, 4, 8)


def runs_prefill(scheme: S.QuantScheme, m: int) -> bool:
    """Whether a product of ``m`` activation rows with a ``scheme`` weight takes the
    prefill kernel (a GGUF block scheme and ``m >= PREFILL_MIN_M``)."""
    return type(scheme) in _CODES and m >= PREFILL_MIN_M


@dataclass(frozen=True)
class PrefillCall:
    """One bound product: the C function and its converted arguments."""

    fn: Callable[..., int]
    args: tuple


class DqPrefillLib:
    """Typed wrapper over ``csrc/dqgemm_prefill.c`` built for one target."""

    def __init__(self, lib: ctypes.CDLL, target: cpu.Target):
        self.lib = lib
        self.target = target
        #: the f32 tile's vectors: 2 AVX-512, 1 AVX2 + FMA, 0 portable SSE2, 3 NEON FMLA
        self.level = int(lib.rlx_dqp_level())
        self.openmp = bool(lib.rlx_dqp_openmp())
        #: the int8 path's instructions: 3 vpdpbusd (AVX-512 VNNI), 1 vpmaddubsw (AVX2), 0 C
        #: (on aarch64: the NEON kernel, SDOT with dotprod, SMULL + SADDLP without)
        self.q8_level = int(lib.rlx_dqp_q8_level())
        #: micro-tile: weight rows x tokens
        self.tile = (int(lib.rlx_dqp_mw()), int(lib.rlx_dqp_nt()))

    @staticmethod
    def _scheme_args(scheme: S.QuantScheme, rows: int) -> tuple[int, int, int, int]:
        t = type(scheme)
        if t not in _CODES:
            raise InputError(f"dqprefill: no prefill kernel for {scheme}")
        if rows not in INTERLEAVES:
            raise InputError(f"dqprefill: rows must be one of {INTERLEAVES}, given {rows}")
        return _CODES[t], int(scheme.block_size), int(t.block_bytes), int(rows)  # type: ignore[attr-defined, arg-type]

    def _check(
        self, scheme: S.QuantScheme, x: np.ndarray, w: np.ndarray, out: np.ndarray, name: str
    ) -> None:
        if x.ndim != 2 or x.dtype != np.float32 or not x.flags.c_contiguous:
            raise InputError(
                f"dqprefill: x must be C-contiguous f32 [M, K], given {x.dtype} {x.shape}"
            )
        m, k = x.shape
        if (
            out.ndim != 2
            or out.dtype != np.float32
            or out.shape[0] != m
            or not out.flags.c_contiguous
        ):
            raise InputError(
                f"dqprefill: out must be C-contiguous f32 [{m}, N], given {out.dtype} {out.shape}"
            )
        check_packed(scheme, w, out.shape[1], k, name)

    def bind(
        self,
        scheme: S.QuantScheme,
        x: np.ndarray,
        w: np.ndarray,
        out: np.ndarray,
        *,
        rows: int = 1,
        num_threads: int = 1,
        name: str = "w_q",
        act: str = "f32",
    ) -> Callable[[], None]:
        """A zero-argument call computing ``out = x @ dequant(w).T`` (arguments checked
        and converted once; the arrays must not move): ``x`` C-contiguous f32 [M, K],
        ``w`` the packed GGUF weight of ``scheme`` (``rows`` rows interleaved, ``dqgemm.repack``), ``out``
        C-contiguous f32 [M, N]. ``act``: ``f32`` (exact f32 products) or ``q8`` (X
        quantized to int8 per 32 inputs, integer dot products: ``csrc/dqgemm_prefill_q8.c``,
        error bound there)."""
        code, qk, bb, rr = self._scheme_args(scheme, rows)
        if act not in PREFILL_ACTS:
            raise InputError(f"dqprefill: act must be one of {PREFILL_ACTS}, given {act!r}")
        if act == "q8" and type(scheme) not in Q8_PREFILL_SCHEMES:
            raise InputError(f"dqprefill: no int8-activation prefill for {scheme}")
        self._check(scheme, x, w, out, name)
        m, k = x.shape
        n = out.shape[1]
        fn = self.lib.rlx_dqp_gemm_q8 if act == "q8" else self.lib.rlx_dqp_gemm
        args = (code, qk, bb, rr, m, n, k, x.ctypes.data, k, w.ctypes.data,
                out.ctypes.data, n, max(1, int(num_threads)))  # fmt: skip
        keep = (x, w, out)

        def call() -> None:
            rc = fn(*args)
            if rc == 1:
                raise MemoryError(f"dqprefill: could not allocate a scratch buffer ({len(keep)})")
            if rc != 0:
                raise InputError(f"dqprefill: rejected {scheme} with K={k} (code {rc})")

        call.native_call = (fn, args, True)  # type: ignore[attr-defined]
        return call

    def gemm(
        self,
        scheme: S.QuantScheme,
        x: np.ndarray,
        w: np.ndarray,
        out: np.ndarray,
        *,
        rows: int = 1,
        num_threads: int = 1,
        act: str = "f32",
    ) -> None:
        """``out = x @ dequant(w).T`` now (see :meth:`bind`)."""
        self.bind(scheme, x, w, out, rows=rows, num_threads=num_threads, act=act)()

    def decode(
        self, scheme: S.QuantScheme, w: np.ndarray, n: int, k: int, *, rows: int = 1
    ) -> np.ndarray:
        """The f32 ``[n, k]`` weight the packed ``w`` (``rows`` rows interleaved, ``dqgemm.repack``) stands for,
        decoded by the C code."""
        check_packed(scheme, w, n, k, "w")
        code, qk, bb, rr = self._scheme_args(scheme, rows)
        out = np.empty((n, k), np.float32)
        rc = self.lib.rlx_dqp_decode(code, qk, bb, rr, n, k, w.ctypes.data, 0, n, out.ctypes.data)
        if rc != 0:
            raise InputError(f"dqprefill: decode rejected {scheme} [{n}, {k}] (code {rc})")
        return out


def dqprefill_lib(target: cpu.Target | None = None) -> DqPrefillLib:
    """Build (cached on disk by content) and load the library for ``target`` (default: the
    selected one, ``RLX_ISA``). CompileError without gcc or when the build fails."""
    return _lib(cpu.selected_target() if target is None else target)


@functools.cache
def _lib(target: cpu.Target) -> DqPrefillLib:
    return DqPrefillLib(bindings.csrc_library(SOURCES, target, "dqprefill"), target)
