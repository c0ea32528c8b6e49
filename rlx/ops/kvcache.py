"""Ops of decoder language models: attention through a KV cache, and the rows of a packed
(GGUF-quantized) embedding table.

``cache_attention`` (:class:`CacheAttention`) is attention whose keys and values are the
rows of a preallocated cache: in ``q[B,S,H*D]``, the new rows ``k, v[B,S,Hkv*D]``, the
caches ``k_cache, v_cache[B,C,Hkv*D]`` (``C`` = the max context) and ``positions i64[S]``
(the consecutive positions ``p..p+S-1`` of the new rows); out ``[B,S,H*D]``. Its value
is that of the cache with rows ``p..p+S-1`` replaced by ``k`` / ``v``, attended causally
(optionally within a sliding window) over its first ``p+S`` rows: query ``i`` sees keys
``j <= p+i`` (and ``j > p+i-window``). The reference computes exactly that and changes
nothing; the CPU kernel also stores the new rows into the cache params' storage (the
runtime's private, zeroed storage of a param that was never set), so the next run sees
them: that write is the cache update, ``S`` rows per run, no copy of the cache.

The caches may be f32, bf16 or f16 (both the same; half the memory): the new rows are
rounded to the cache dtype when written (round to nearest even, as NumPy / ml_dtypes
``astype``), and with a low-precision cache ``q`` is rounded to that dtype too and the
output is rounded to it before it is widened back to f32 (the native kernel takes q, k, v
and out in one dtype and computes in f32); the reference models exactly those roundings.

``dequant_gather`` (:class:`DequantGather`): ``dequant(packed)[ids]`` for a GGUF
``scheme`` (packed u8 ``[N, K/qk*block_bytes]``, ``ids`` integer of any shape, out f32
``[*ids.shape, K]``): the token embedding lookup that decodes only the rows it takes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.formats.schemes import QuantScheme
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.nn import MaskKind, attend, split_heads
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["CacheAttention", "DequantGather", "cache_start", "cache_mask", "CACHE_DTYPES"]

#: The dtypes a KV cache may have.
CACHE_DTYPES = (DType.F32, DType.BF16, DType.F16)


def cache_start(op: str, positions: np.ndarray, rows: int, capacity: int) -> int:
    """The first position ``p`` of ``positions`` (i64 [S]), after checking that they are
    ``p..p+S-1`` with ``p >= 0`` and ``p + S <= capacity``; InputError naming the lengths
    otherwise."""
    pos = np.asarray(positions).reshape(-1)
    if pos.size != rows:
        raise InputError(f"{op}: positions has {pos.size} entries for {rows} new rows")
    if rows == 0:
        return 0
    p = int(pos[0])
    if p < 0 or not np.array_equal(pos, np.arange(p, p + rows, dtype=pos.dtype)):
        raise InputError(
            f"{op}: positions must be consecutive from a start >= 0, given "
            f"{pos[:8].tolist()}{'...' if rows > 8 else ''}"
        )
    if p + rows > capacity:
        raise InputError(
            f"{op}: rows {p}..{p + rows - 1} do not fit the cache of {capacity} positions "
            f"(max context {capacity}, asked for {p + rows})"
        )
    return p


def cache_mask(window: int) -> MaskKind:
    """The end-aligned mask of a cache attention: causal, or a sliding ``window``."""
    return MaskKind.sliding_window(window) if window else MaskKind.causal()


@register
class CacheAttention(Op):
    """Attention over a KV cache with the new rows written at ``positions`` (module
    docstring). Inputs ``(q, k, v, k_cache, v_cache, positions)``; q, k, v f32, the caches
    f32, bf16 or f16 (the same for both).
    ``window`` 0 is causal, else a sliding window of that many keys; ``num_kv_heads``
    divides ``num_heads`` (query head ``h`` reads kv head ``h // (H // Hkv)``); ``scale``
    defaults to ``1/sqrt(head_dim)``. Not ``pure``: its CPU kernel updates the caches.
    Query ``i`` always sees key ``p+i`` (its own new row), so no row sees no key (one
    would give 0, as :class:`~rlx.ops.nn.Attention` defines)."""

    mnemonic: ClassVar[str] = "cache_attention"
    arity: ClassVar[int] = 6
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    nondiff: ClassVar[str] = (
        "inference only: it writes the KV cache; train with attention (g.attention)"
    )
    pure: ClassVar[bool] = False
    num_heads: int
    head_dim: int
    num_kv_heads: int
    window: int = 0
    scale: float | None = None

    @property
    def effective_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else float(self.scale)

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        h, d, hkv = self.num_heads, self.head_dim, self.num_kv_heads
        expect(h >= 1 and d >= 1, self, f"num_heads and head_dim must be >= 1, got {h}, {d}")
        expect(hkv >= 1 and h % hkv == 0, self, f"num_kv_heads must divide {h}, got {hkv}")
        expect(self.window >= 0, self, f"window must be >= 0, got {self.window}")
        q, k, v, kc, vc, pos = ins
        for name, t in (("q", q), ("k", k), ("v", v)):
            expect(
                t.dtype is DType.F32 and t.rank == 3, self, f"{name} must be f32 rank 3, got {t}"
            )
        for name, t in (("k_cache", kc), ("v_cache", vc)):
            expect(
                t.dtype in CACHE_DTYPES and t.dtype is kc.dtype and t.rank == 3,
                self,
                f"{name} must be f32, bf16 or f16 rank 3 (as k_cache {kc}), got {t}",
            )
        expect(q.dims[2] == h * d, self, f"q must be [B,S,{h * d}] (H={h} x D={d}), got {q}")
        for name, t in (("k", k), ("v", v)):
            expect(
                t.dims == (q.dims[0], q.dims[1], hkv * d),
                self,
                f"{name} must be [B,S,{hkv * d}] like q {q}, got {t}",
            )
        expect(kc.is_static, self, f"k_cache must have static dims, got {kc}")
        for name, t in (("k_cache", kc), ("v_cache", vc)):
            expect(
                t.dims == (q.dims[0], kc.dims[1], hkv * d),
                self,
                f"{name} must be [B,C,{hkv * d}] with q's batch and k_cache's C, got {t}",
            )
        expect(
            pos.dtype.is_int and pos.rank == 1 and pos.dims[0] == q.dims[1],
            self,
            f"positions must be an integer [S] with S = q's length {q.dims[1]}, got {pos}",
        )
        return q

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        q, k, v, kc, vc, pos = xs
        b, s, _ = q.shape
        p = cache_start(self.mnemonic, pos, s, kc.shape[1])
        keys, vals = kc[:, : p + s].copy(), vc[:, : p + s].copy()
        keys[:, p:], vals[:, p:] = k, v  # rounded to the cache dtype (nearest even)
        low = keys.dtype != np.float32
        keys, vals = keys.astype(np.float32), vals.astype(np.float32)
        if low:  # the kernel's q is in the cache dtype
            q = q.astype(kc.dtype).astype(np.float32)
        h, d = self.num_heads, self.head_dim
        qh, kh, vh = split_heads(q, keys, vals, h, d, self.num_kv_heads)
        sc = np.matmul(qh, kh.swapaxes(-1, -2)) * np.float32(self.effective_scale)
        allowed = cache_mask(self.window).allowed(s, p + s)
        sc = np.where(allowed, sc, -np.inf)
        o = attend(sc, vh).transpose(0, 2, 1, 3).reshape(b, s, h * d)
        if low:  # and so is its output
            o = o.astype(kc.dtype)
        return o.astype(ctx.out_dtype)


@register
class DequantGather(Op):
    """``dequant(packed)[ids]``: rows of a GGUF-packed ``[N, K]`` table, decoded (module
    docstring). Inputs ``(packed u8 [N, K/qk*block_bytes], ids int [...])``; out f32
    ``[..., K]``. An id outside ``[0, N)`` is an InputError naming it."""

    mnemonic: ClassVar[str] = "dequant_gather"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    nondiff: ClassVar[str] = "inference only: its table is packed quantized bytes"
    scheme: QuantScheme

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        w, ids = ins
        s = self.scheme
        expect(s.is_gguf, self, f"{s} is not a GGUF block scheme")
        expect(
            w.dtype is DType.U8 and w.rank == 2 and w.is_static,
            self,
            f"packed table must be static u8 [N, bytes], got {w}",
        )
        bb = type(s).block_bytes  # type: ignore[attr-defined]
        expect(w.dims[1] % bb == 0, self, f"{s} rows are whole {bb}-byte blocks, got {w}")
        expect(ids.dtype.is_int, self, f"ids must be integers, got {ids}")
        k = w.dims[1] // bb * s.block_size  # type: ignore[operator]
        return Shape((*ids.dims, k), DType.F32)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        from rlx.formats.gguf import dequantize_rows

        w, ids = xs
        flat = check_ids(self.mnemonic, ids, w.shape[0])
        return dequantize_rows(self.scheme, w[flat]).reshape(ctx.out_dims)


def check_ids(op: str, ids: np.ndarray, n: int) -> np.ndarray:
    """``ids`` flattened to int64, or InputError naming the first id outside [0, n)."""
    flat = np.asarray(ids).reshape(-1).astype(np.int64, copy=False)
    bad = (flat < 0) | (flat >= n)
    if bad.any():
        raise InputError(f"{op}: id {int(flat[bad][0])} is outside the table of {n} rows")
    return flat


@graph_method
def cache_attention(
    g: Graph,
    q: NodeId,
    k: NodeId,
    v: NodeId,
    k_cache: NodeId,
    v_cache: NodeId,
    positions: NodeId,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int | None = None,
    window: int = 0,
    scale: float | None = None,
) -> NodeId:
    """Attention of ``q`` over the caches with ``k, v`` written at ``positions``."""
    hkv = num_heads if num_kv_heads is None else int(num_kv_heads)
    sc = None if scale is None else float(scale)
    op = CacheAttention(int(num_heads), int(head_dim), hkv, int(window), sc)
    return g.apply(op, [q, k, v, k_cache, v_cache, positions])


@graph_method
def dequant_gather(g: Graph, packed: NodeId, ids: NodeId, scheme: QuantScheme) -> NodeId:
    """Decoded rows ``ids`` of the GGUF-packed table ``packed``."""
    return g.apply(DequantGather(scheme), [packed, ids])
