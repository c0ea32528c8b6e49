"""rlx's packed f32 GEMM (``csrc/sgemm.c``). In: f32 operands (any strides), a weight packed
once into NR-wide panels, an epilogue (scale, bias, activation, residual, bf16 output).
Out: the product written into an output array, through :class:`SgemmLib`.

:func:`sgemm_lib` builds the library for the selected build target (``RLX_ISA``): an
AVX-512 micro-kernel (14 x 32) on AVX512, AVX2 + FMA (6 x 16) on AVX2, plain C (6 x 8) on
portable, NEON FMLA-by-element (8 x 12, ``csrc/sgemm_neon.h``) on the aarch64 targets;
``SgemmLib.isa`` names it (:class:`SgemmKernel`: ``avx512`` / ``avx2`` / ``c`` / ``neon``).
Cache blocking (KC, the A block's bytes, NC: :func:`blocking`) comes from the CPU's cache
sizes in sysfs (:func:`cache_sizes`), with defaults when they cannot be read.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import mmap
import threading
from pathlib import Path

import numpy as np

from rlx import config
from rlx.backends.cpu.native import bindings, cpu
from rlx.errors import CompileError, InputError

__all__ = [
    "Act",
    "SgemmLib",
    "SgemmKernel",
    "sgemm_lib",
    "cache_sizes",
    "blocking",
    "aligned_empty",
    "HugeArena",
    "ACT_CODES",
]


# activation name -> the C epilogue's code
ACT_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4, "tanh": 5}
Act = str | None


class SgemmKernel(enum.Enum):
    """The micro-kernel a built library runs (its ``rlx_sgemm_level``); ``str()`` is the
    short name the report and the choice keys use (``c``, ``avx2``, ``avx512``, ``neon``)."""

    C = 0  # portable GCC vector extensions (6 x 8)
    AVX2 = 1  # AVX2 + FMA (6 x 16)
    AVX512 = 2  # AVX-512 (14 x 32)
    NEON = 3  # aarch64 NEON FMLA by element (8 x 12)

    def __str__(self) -> str:
        return self.name.lower()


_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")


@functools.cache
def cache_sizes(root: Path = _SYSFS) -> tuple[int, int, int]:
    """(L1d, L2, L3) bytes of cpu0 from sysfs; 32 KiB / 1 MiB / 8 MiB for what is missing."""
    sizes = {1: 32 << 10, 2: 1 << 20, 3: 8 << 20}
    try:
        for d in sorted(root.glob("index*")):
            kind = (d / "type").read_text().strip()
            if kind not in ("Data", "Unified"):
                continue
            level = int((d / "level").read_text())
            raw = (d / "size").read_text().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(raw[-1:], 1)
            value = int(raw.rstrip("KMG")) * mult
            if level in sizes and value > 0:
                sizes[level] = value
    except (OSError, ValueError):
        pass
    return sizes[1], sizes[2], sizes[3]


def blocking(
    mr: int, nr: int, sizes: tuple[int, int, int] | None = None, *, l1_panel: bool = False
) -> tuple[int, int, int]:
    """(KC, L2 bytes for the A block, NC) for an MR x NR micro-kernel: K is split into
    equal blocks of at most KC, so the B micro-panel (KC x NR) takes at most 1/16 of L2
    (it streams from L2 with the A micro-panel: measured faster on x86-64 than a KC sized
    for L1, which makes more passes over the output); the A block (MC x KC) half of L2;
    the B block (KC x NC) a quarter of L3 (at most 8192 columns). ``l1_panel`` (the
    aarch64 NEON kernel, not measured on ARM hardware yet): KC also keeps the B
    micro-panel in half of L1d, BLIS's rule for its armv8a 8 x 12 kernel (64 KB L1d of a
    Neoverse N1 / V1: KC = 680, BLIS uses 640)."""
    l1, l2, l3 = cache_sizes() if sizes is None else sizes
    kc = max(128, min(1024, (l2 // 16) // (nr * 4) // 8 * 8))
    if l1_panel:
        kc = max(128, min(kc, (l1 // 2) // (nr * 4) // 8 * 8))
    a_bytes = max(l2 // 2, mr * kc * 4)
    nc = max(nr, min(8192, (l3 // 4) // (kc * 4) // nr * nr))
    return kc, a_bytes, nc


class SgemmLib:
    """Typed wrapper over ``csrc/sgemm.c``: pack a weight, then run GEMMs with epilogues."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.isa = SgemmKernel(int(lib.rlx_sgemm_level()))
        self.mr = int(lib.rlx_sgemm_mr())
        self.nr = int(lib.rlx_sgemm_nr())
        self.openmp = bool(lib.rlx_sgemm_openmp())
        neon = self.isa is SgemmKernel.NEON
        self.kc, self.a_bytes, self.nc = blocking(self.mr, self.nr, l1_panel=neon)
        lib.rlx_sgemm_set_blocking(self.kc, self.a_bytes, self.nc)

    @property
    def label(self) -> str:
        """``rlx sgemm (avx512|avx2|c|neon)``: the name the report shows."""
        return f"rlx sgemm ({self.isa})"

    def packed_size(self, k: int, n: int) -> int:
        """f32 elements of a packed [k, n] matrix."""
        return int(self.lib.rlx_sgemm_packed_size(k, n))

    def pack_b(self, b: np.ndarray, out: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
        """Pack f32 ``b`` [K, N] (any strides) into ``out`` (f32, :meth:`packed_size`
        elements; when None, a new one, in 2 MB pages from 128 KB on); returns it."""
        if b.dtype != np.float32 or b.ndim != 2:
            raise InputError(f"sgemm pack_b: b must be a 2-D f32 matrix, given {b.dtype} {b.shape}")
        k, n = b.shape
        size = self.packed_size(k, n)
        if out is None:
            out = aligned_empty(size, huge=True)
        elif out.dtype != np.float32 or out.size < size or not out.flags.c_contiguous:
            raise InputError(
                f"sgemm pack_b: out must be C-contiguous f32 of {size} elements, "
                f"given {out.dtype} {out.shape}"
            )
        s0, s1 = (s // 4 for s in b.strides)
        self.lib.rlx_sgemm_pack_b(b.ctypes.data, s0, s1, k, n, out.ctypes.data, max(1, threads))
        return out

    def gemm(
        self,
        a: np.ndarray,
        packed: np.ndarray,
        out: np.ndarray,
        *,
        bias: np.ndarray | None = None,
        act: Act = None,
        residual: np.ndarray | None = None,
        scale: float = 1.0,
        threads: int = 1,
    ) -> None:
        """``out = act(scale * a @ b + bias) + residual`` for f32 ``a`` [M, K] (any
        strides) and ``b`` packed by :meth:`pack_b`; ``out`` [M, N] f32 or bf16 (rounded
        once) with unit column stride; ``bias`` f32 [N]; ``residual`` f32 [M, N] with unit
        column stride. ``act``: None, relu, gelu, gelu_tanh, silu, tanh."""
        args = self.gemm_args(a, packed, out, bias=bias, act=act, residual=residual, scale=scale)
        if self.lib.rlx_sgemm(*args, max(1, threads)) != 0:
            raise MemoryError(f"sgemm: could not allocate the packing buffers ({a.shape})")

    def gemm_args(
        self,
        a: np.ndarray,
        packed: np.ndarray,
        out: np.ndarray,
        *,
        bias: np.ndarray | None = None,
        act: Act = None,
        residual: np.ndarray | None = None,
        scale: float = 1.0,
    ) -> tuple:
        """The checked argument tuple of ``rlx_sgemm`` without the thread count (kernels
        bind it once at schedule-build time)."""
        if a.dtype != np.float32 or a.ndim != 2:
            raise InputError(f"sgemm: a must be a 2-D f32 matrix, given {a.dtype} {a.shape}")
        m, k = a.shape
        if out.ndim != 2 or out.shape[0] != m or out.dtype.name not in ("float32", "bfloat16"):
            raise InputError(f"sgemm: out must be f32/bf16 [{m}, N], given {out.dtype} {out.shape}")
        n = out.shape[1]
        if not _rows_ok(out):
            raise InputError(f"sgemm: out rows must be contiguous, given strides {out.strides}")
        if packed.dtype != np.float32 or packed.size < self.packed_size(k, n):
            raise InputError(f"sgemm: the packed weight is not a packed [{k}, {n}] f32 matrix")
        if bias is not None and (bias.dtype != np.float32 or bias.shape != (n,)):
            raise InputError(f"sgemm: bias must be f32 [{n}], given {bias.dtype} {bias.shape}")
        if residual is not None and (
            residual.dtype != np.float32 or residual.shape != (m, n) or not _rows_ok(residual)
        ):
            raise InputError(
                f"sgemm: residual must be f32 [{m}, {n}] with contiguous rows, "
                f"given {residual.dtype} {residual.shape}"
            )
        if act not in ACT_CODES:
            raise InputError(
                f"sgemm: act must be one of {sorted(map(str, ACT_CODES))}, given {act}"
            )
        bias = None if bias is None else np.ascontiguousarray(bias)
        return (
            m, n, k, a.ctypes.data, a.strides[0] // 4, a.strides[1] // 4, packed.ctypes.data,
            out.ctypes.data, _ld(out), int(out.dtype != np.float32),
            None if bias is None else bias.ctypes.data,
            None if residual is None else residual.ctypes.data,
            0 if residual is None else _ld(residual), float(scale), ACT_CODES[act],
        )  # fmt: skip

    def batched(
        self, a: np.ndarray, b: np.ndarray, out: np.ndarray, *, scale: float = 1.0, threads: int = 1
    ) -> None:
        """``out[i] = scale * a[i] @ b[i]`` for f32 ``a`` [B, M, K], ``b`` [B, K, N] (any
        strides; B packed per call) into f32 ``out`` [B, M, N] with contiguous rows."""
        args = self.batched_args(a, b, out, scale=scale)
        if self.lib.rlx_sgemm_batched(*args, max(1, threads)) != 0:
            raise MemoryError(f"sgemm: could not allocate the packing buffers ({b.shape})")

    def batched_args(
        self, a: np.ndarray, b: np.ndarray, out: np.ndarray, *, scale: float = 1.0
    ) -> tuple:
        """The checked argument tuple of ``rlx_sgemm_batched`` without the thread count."""
        ok = (
            a.ndim == b.ndim == out.ndim == 3
            and a.dtype == b.dtype == out.dtype == np.float32
            and a.shape[0] == b.shape[0] == out.shape[0]
            and a.shape[2] == b.shape[1]
            and out.shape[1:] == (a.shape[1], b.shape[2])
            and (out.shape[2] <= 1 or out.strides[2] == 4)
        )
        if not ok:
            raise InputError(
                f"sgemm batched: f32 [B,M,K] @ [B,K,N] -> [B,M,N] with contiguous output rows "
                f"needed, given {a.dtype} {a.shape} @ {b.dtype} {b.shape} -> {out.dtype} {out.shape}"
            )
        nb, m, k = a.shape
        n = b.shape[2]
        sa, sb, so = (tuple(s // 4 for s in x.strides) for x in (a, b, out))
        return (
            nb, m, n, k, a.ctypes.data, sa[0], sa[1], sa[2], b.ctypes.data, sb[0], sb[1], sb[2],
            out.ctypes.data, so[0], so[1], float(scale),
        )  # fmt: skip


def aligned_empty(n: int, huge: bool = False) -> np.ndarray:
    """An uninitialised f32 array of ``n`` (at least 1) elements starting on 64 bytes.
    ``huge`` (for a packed weight that lives as long as its compiled graph): from
    :data:`HUGE_MIN_BYTES` on, carved from memory advised to use 2 MB pages
    (:class:`HugeArena`) where the OS allows it; buffers made and dropped per shape should
    not (the arena does not reuse the space of dead arrays)."""
    if huge and n * 4 >= HUGE_MIN_BYTES:
        got = _ARENA.take(n)
        if got is not None:
            return got
    raw = np.empty(max(n, 1) + 16, np.float32)
    off = (-raw.ctypes.data % 64) // 4
    return raw[off : off + max(n, 1)]


# Packed weights from this size on take 2 MB pages: at 1x16 the 36 GEMMs of
# all-MiniLM-L6-v2 stream 42.5 MB of packed weights from DRAM per forward, and on 4 KB
# pages the TLB misses of that stream cost 0.4-1.2 ms of a 4.3-5.0 ms GEMM time (Zen 4,
# benchmarks/results/BENCHMARKS_shapes.md).
HUGE_MIN_BYTES = 128 << 10
_HUGE_PAGE = 2 << 20


class HugeArena:
    """Bump allocator over anonymous mappings advised ``MADV_HUGEPAGE`` (transparent huge
    pages in ``madvise`` mode), each ``chunk`` bytes from a 2 MB boundary. ``take(n)``: an
    uninitialised f32 array of ``n`` elements on 64 bytes, or None where mmap / madvise is
    missing (not Linux) or fails. A mapping the arena has moved past is unmapped once no
    array carved from it is left; memory is backed (in 2 MB steps) as it is written, so the
    unused tail of a mapping costs address space, not memory."""

    def __init__(self, chunk: int = 64 << 20):
        self.chunk = chunk
        self._lock = threading.Lock()
        self._map: mmap.mmap | None = None
        self._pos = 0
        self._ok = hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_ANONYMOUS")

    def take(self, n: int) -> np.ndarray | None:
        if not self._ok or n < 1:
            return None
        nbytes = (n * 4 + 63) // 64 * 64
        with self._lock:
            if self._map is None or self._pos + nbytes > len(self._map):
                size = max(self.chunk, nbytes + _HUGE_PAGE)
                size = (size + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
                try:
                    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                    m.madvise(mmap.MADV_HUGEPAGE)
                except (OSError, ValueError):
                    self._ok = False
                    return None
                addr = np.frombuffer(m, np.uint8, 1).ctypes.data
                self._map, self._pos = m, -addr % _HUGE_PAGE
            pos, self._pos = self._pos, self._pos + nbytes
            return np.frombuffer(self._map, np.float32, n, pos)


_ARENA = HugeArena()


def _rows_ok(x: np.ndarray) -> bool:
    """Unit column stride (where it matters) and a row stride of whole elements."""
    if x.size == 0:
        return True
    return (x.shape[1] <= 1 or x.strides[1] == x.itemsize) and x.strides[0] % x.itemsize == 0


def _ld(x: np.ndarray) -> int:
    """Row stride in elements (the row length for a single row)."""
    return x.strides[0] // x.itemsize if x.shape[0] > 1 else x.shape[1]


def sgemm_lib(target: cpu.Target | None = None) -> SgemmLib:
    """Build (cached on disk by content) and load the library for ``target`` (default: the
    selected one, ``RLX_ISA``). CompileError without gcc or when the build fails."""
    t = cpu.selected_target() if target is None else target
    if t not in cpu.runnable_targets():
        raise CompileError(f"this CPU cannot run the {t.name} sgemm")
    return _sgemm_lib(t)


@functools.cache
def _sgemm_lib(target: cpu.Target) -> SgemmLib:
    from rlx.backends.cpu import native
    from rlx.backends.cpu.engines.region import vector_math_available
    from rlx.backends.cpu.native.prebuilt import sgemm_source

    if not native.available():
        raise CompileError("the native sgemm needs gcc, which is not on PATH")
    source = sgemm_source(vector_math_available())
    try:
        return SgemmLib(bindings.typed(native.load(native.build(source, target, "sgemm")), source))
    except OSError as e:
        raise CompileError(f"native sgemm: {e} (cache dir {config.cache_dir()})") from e


sgemm_lib.cache_clear = _sgemm_lib.cache_clear  # type: ignore[attr-defined]
