"""Ops of decoder language models: attention through a KV cache, and the rows of a packed
(GGUF-quantized) embedding table.

``cache_attention`` (:class:`CacheAttention`) is attention whose keys and values are the
rows of a preallocated cache: in ``q[B,S,H*D]``, the new rows ``k, v[B,S,Hkv*D]``, the
caches ``k_cache, v_cache[B,C,Hkv*D]`` (``C`` = the max context) and ``positions i64[S]``
(the consecutive positions ``p..p+S-1`` of the new rows); out ``[B,S,H*D]``. Its value
is that of the cache with rows ``p..p+S-1`` replaced by ``k`` / ``v``, attended causally
(optionally within a sliding window) over its first ``p+S`` rows: query ``i`` sees keys
``j <= p+i`` (and ``j > p+i-window``); a ``softcap`` ``c > 0`` first maps the scaled
scores ``s`` to ``c * tanh(s / c)`` (Gemma 2). The reference computes exactly that and changes
nothing; the CPU kernel also stores the new rows into the cache params' storage (the
runtime's private, zeroed storage of a param that was never set), so the next run sees
them: that write is the cache update, ``S`` rows per run, no copy of the cache.

The caches may be f32, bf16 or f16 (both the same; half the memory): the new rows are
rounded to the cache dtype when written (round to nearest even, as NumPy / ml_dtypes
``astype``), and with a low-precision cache ``q`` is rounded to that dtype too and the
output is rounded to it before it is widened back to f32 (the native kernel takes q, k, v
and out in one dtype and computes in f32); the reference models exactly those roundings.

An int8 cache (``k_cache, v_cache`` i8, then two more inputs ``k_scale, v_scale``
f32 ``[B,C,Hkv]``) holds every row as int8 with one scale per row and kv head: a new
row's head ``x[D]`` is stored as ``rint(x / s)`` (half to even, within [-127, 127]) with
``s = max|x| / 127`` (0 for an all-zero head, stored as zeros), and read back as
``q * s`` (:func:`quantize_heads` / :func:`dequantize_heads`); ``q`` and the output stay
f32 (the CPU kernel dequantizes the valid rows into f32 scratch and runs the f32
attention). A quarter of an f32 cache's bytes plus ``4 / D`` of them for the scales.
Only ``cache_attention`` takes an int8 cache.

``slot_cache_attention`` (:class:`SlotCacheAttention`) is the same attention over a cache of
``SLOTS`` independent contexts, one token sequence per slot (batched decode): in
``q[1,T,H*D]``, ``k, v[1,T,Hkv*D]``, the caches ``[SLOTS,C,Hkv*D]`` and, per token,
``positions`` and ``slots`` (integer ``[T]``). Every token ``t`` first writes its k / v row
into row ``positions[t]`` of slot ``slots[t]``; then it attends over that slot's rows
``j <= positions[t]`` (and ``j > positions[t] - window``). A decode step of N sequences is
T = N tokens in N slots; a prefill is T tokens of one slot at consecutive positions
(consecutive tokens of one slot at consecutive positions form a run, which the kernel
attends as one causal block). A slot or position outside the cache, or two tokens writing
the same row, is an InputError naming the token. Cache dtypes and roundings as
``cache_attention``.

``dequant_gather`` (:class:`DequantGather`): ``dequant(packed)[ids]`` for a GGUF
``scheme`` (packed u8 ``[N, K/qk*block_bytes]``, ``ids`` integer of any shape, out f32
``[*ids.shape, K]``): the token embedding lookup that decodes only the rows it takes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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

__all__ = [
    "CacheAttention",
    "SlotCacheAttention",
    "DequantGather",
    "cache_start",
    "cache_mask",
    "softcap_scores",
    "slot_runs",
    "CACHE_DTYPES",
    "quantize_heads",
    "dequantize_heads",
]

#: The dtypes a KV cache may have (int8: ``cache_attention`` only, with scales).
CACHE_DTYPES = (DType.F32, DType.BF16, DType.F16, DType.I8)


def quantize_heads(x: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``x[..., Hkv*D]`` (f32) as int8 ``[..., Hkv*D]`` and f32 scales
    ``[..., groups]``, one per row and group of ``Hkv*D / groups`` consecutive values (a
    kv head when ``groups`` = Hkv; module docstring: symmetric, ``max|x| / 127``)."""
    heads = x.reshape(*x.shape[:-1], groups, -1).astype(np.float32, copy=False)
    scale = (np.abs(heads).max(axis=-1) / np.float32(127.0)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    q = np.clip(np.rint(heads / safe[..., None]), -127, 127).astype(np.int8)
    return q.reshape(x.shape), scale


def dequantize_heads(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """f32 rows of int8 ``q[..., Hkv*D]`` with scales ``[..., groups]``: ``q * scale``."""
    heads = q.reshape(*scale.shape, -1).astype(np.float32)
    return (heads * scale[..., None]).reshape(q.shape)


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


def softcap_scores(scores: np.ndarray, softcap: float) -> np.ndarray:
    """``c * tanh(scores / c)`` in f32 for ``softcap`` ``c > 0`` (Gemma 2's soft-capping
    of the scaled attention scores); ``scores`` unchanged for 0."""
    if not softcap:
        return scores
    c = np.float32(softcap)
    return (np.tanh(scores / c) * c).astype(np.float32, copy=False)


def cache_mask(window: int) -> MaskKind:
    """The end-aligned mask of a cache attention: causal, or a sliding ``window``."""
    return MaskKind.sliding_window(window) if window else MaskKind.causal()


@dataclass(frozen=True, slots=True)
class _CacheAttentionAttrs(Op):
    """The attributes :class:`CacheAttention` and :class:`SlotCacheAttention` share (not
    registered). ``window`` 0 is causal, else a sliding window of that many keys;
    ``num_kv_heads`` divides ``num_heads`` (query head ``h`` reads kv head
    ``h // (H // Hkv)``); ``scale`` defaults to ``1/sqrt(head_dim)``; ``softcap`` ``c > 0``
    soft-caps the scaled scores to ``c * tanh(s / c)`` before the mask and the softmax
    (Gemma 2's attention-logit soft-capping; 0: off). Both ops are inference only and not
    ``pure``: their CPU kernels write the caches."""

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
    softcap: float = 0.0

    @property
    def effective_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else float(self.scale)

    def check_attrs(self) -> None:
        """ShapeError unless the attributes are consistent (head counts, window, cap)."""
        h, d, hkv = self.num_heads, self.head_dim, self.num_kv_heads
        expect(h >= 1 and d >= 1, self, f"num_heads and head_dim must be >= 1, got {h}, {d}")
        expect(hkv >= 1 and h % hkv == 0, self, f"num_kv_heads must divide {h}, got {hkv}")
        expect(self.window >= 0, self, f"window must be >= 0, got {self.window}")
        expect(
            math.isfinite(self.softcap) and self.softcap >= 0,
            self,
            f"softcap must be a finite number >= 0 (0: off), got {self.softcap}",
        )


@register
class CacheAttention(_CacheAttentionAttrs):
    """Attention over a KV cache with the new rows written at ``positions`` (module
    docstring). Inputs ``(q, k, v, k_cache, v_cache, positions)``; q, k, v f32, the caches
    f32, bf16 or f16 (the same for both), or int8 with two more inputs ``(k_scale,
    v_scale)`` f32 ``[B,C,Hkv]``. Attributes: :class:`_CacheAttentionAttrs`.
    Query ``i`` always sees key ``p+i`` (its own new row), so no row sees no key (one
    would give 0, as :class:`~rlx.ops.nn.Attention` defines)."""

    mnemonic: ClassVar[str] = "cache_attention"
    arity: ClassVar[int | None] = None  # 6, or 8 with an int8 cache's scales

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        self.check_attrs()
        h, d, hkv = self.num_heads, self.head_dim, self.num_kv_heads
        expect(len(ins) in (6, 8), self, f"takes 6 inputs (8 with int8 caches), got {len(ins)}")
        q, k, v, kc, vc, pos = ins[:6]
        i8 = kc.dtype is DType.I8
        expect(
            len(ins) == (8 if i8 else 6),
            self,
            f"an {kc.dtype} cache takes {8 if i8 else 6} inputs (k_scale, v_scale with int8 "
            f"caches only), got {len(ins)}",
        )
        if i8:
            groups = ins[6].dims[-1] if ins[6].rank == 3 else 0
            ok = isinstance(groups, int) and groups > 0 and groups % hkv == 0
            expect(
                ok and (hkv * d) % groups == 0,
                self,
                f"k_scale must be [B,C,G] with G a multiple of Hkv={hkv} dividing "
                f"{hkv * d}, got {ins[6]}",
            )
            for name, t in (("k_scale", ins[6]), ("v_scale", ins[7])):
                want = (q.dims[0], kc.dims[1], groups)
                expect(
                    t.dtype is DType.F32 and t.dims == want,
                    self,
                    f"{name} must be f32 [B,C,G] = {list(want)} for an int8 cache, got {t}",
                )
        for name, t in (("q", q), ("k", k), ("v", v)):
            expect(
                t.dtype is DType.F32 and t.rank == 3, self, f"{name} must be f32 rank 3, got {t}"
            )
        for name, t in (("k_cache", kc), ("v_cache", vc)):
            expect(
                t.dtype in CACHE_DTYPES and t.dtype is kc.dtype and t.rank == 3,
                self,
                f"{name} must be f32, bf16, f16 or i8 rank 3 (as k_cache {kc}), got {t}",
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
        q, k, v, kc, vc, pos = xs[:6]
        s = q.shape[1]
        p = cache_start(self.mnemonic, pos, s, kc.shape[1])
        if kc.dtype == np.int8:
            hkv = xs[6].shape[-1]  # scale groups: Hkv (per head) or more
            keys = dequantize_heads(kc[:, : p + s], xs[6][:, : p + s])
            vals = dequantize_heads(vc[:, : p + s], xs[7][:, : p + s])
            keys[:, p:] = dequantize_heads(*quantize_heads(k, hkv))
            vals[:, p:] = dequantize_heads(*quantize_heads(v, hkv))
            return _block_attention(self, q, keys, vals).astype(ctx.out_dtype)
        keys, vals = kc[:, : p + s].copy(), vc[:, : p + s].copy()
        keys[:, p:], vals[:, p:] = k, v  # rounded to the cache dtype (nearest even)
        return _block_attention(self, q, keys, vals).astype(ctx.out_dtype)


def _block_attention(
    op: CacheAttention | SlotCacheAttention, q: np.ndarray, keys: np.ndarray, vals: np.ndarray
) -> np.ndarray:
    """The reference attention of ``q[B,S,H*D]`` over ``keys, vals[B,P+S,Hkv*D]`` (the
    cache dtype) with the end-aligned mask, rounded as the module docstring says."""
    b, s, _ = q.shape
    dt = keys.dtype
    low = dt != np.float32
    keys, vals = keys.astype(np.float32), vals.astype(np.float32)
    if low:  # the kernel's q is in the cache dtype
        q = q.astype(dt).astype(np.float32)
    h, d = op.num_heads, op.head_dim
    qh, kh, vh = split_heads(q, keys, vals, h, d, op.num_kv_heads)
    sc = softcap_scores(
        np.matmul(qh, kh.swapaxes(-1, -2)) * np.float32(op.effective_scale), op.softcap
    )
    sc = np.where(cache_mask(op.window).allowed(s, keys.shape[1]), sc, -np.inf)
    o = attend(sc, vh).transpose(0, 2, 1, 3).reshape(b, s, h * d)
    return o.astype(dt) if low else o  # and so is its output


def slot_runs(
    op: str, positions: np.ndarray, slots: np.ndarray, nslots: int, capacity: int
) -> list[tuple[int, int, int, int]]:
    """The runs ``(t0, t1, slot, p0)``: tokens ``t0..t1-1`` in one slot at consecutive
    positions from ``p0`` (``positions``, ``slots``: integer [T]), after checking that every
    slot is in ``[0, nslots)``, every position in ``[0, capacity)`` and that no two tokens
    write the same row; InputError naming the first bad token otherwise."""
    pos = np.asarray(positions).reshape(-1).astype(np.int64, copy=False)
    sl = np.asarray(slots).reshape(-1).astype(np.int64, copy=False)
    if pos.size != sl.size:
        raise InputError(f"{op}: {pos.size} positions for {sl.size} slots (one each per token)")
    if pos.size == 0:
        return []
    bad = np.flatnonzero((sl < 0) | (sl >= nslots))
    if len(bad):
        t = int(bad[0])
        raise InputError(f"{op}: token {t} has slot {sl[t]}, outside the cache's {nslots} slots")
    bad = np.flatnonzero((pos < 0) | (pos >= capacity))
    if len(bad):
        t = int(bad[0])
        raise InputError(
            f"{op}: token {t} has position {pos[t]}, outside the cache of {capacity} positions "
            f"(max context {capacity})"
        )
    rows = sl * capacity + pos
    if np.unique(rows).size != rows.size:
        order = np.argsort(rows, kind="stable")
        dup = int(order[1:][rows[order[1:]] == rows[order[:-1]]][0])
        raise InputError(
            f"{op}: token {dup} writes slot {sl[dup]} position {pos[dup]}, which another "
            "token of this call writes too"
        )
    cut = np.flatnonzero((sl[1:] != sl[:-1]) | (pos[1:] != pos[:-1] + 1)) + 1
    bounds = [0, *cut.tolist(), int(pos.size)]
    return [(a, b, int(sl[a]), int(pos[a])) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@register
class SlotCacheAttention(_CacheAttentionAttrs):
    """Attention of each token over its own slot of a multi-slot KV cache (module
    docstring). Inputs ``(q, k, v, k_cache, v_cache, positions, slots)``: q, k, v f32
    ``[1,T,...]``, the caches ``[SLOTS,C,Hkv*D]`` f32, bf16 or f16, positions and slots
    integer ``[T]``. Attributes: :class:`_CacheAttentionAttrs`."""

    mnemonic: ClassVar[str] = "slot_cache_attention"
    arity: ClassVar[int] = 7

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        q, k, v, kc, vc, pos, slots = ins
        h, d, hkv = self.num_heads, self.head_dim, self.num_kv_heads
        expect(q.rank == 3 and q.dims[0] == 1, self, f"q must be [1,T,{h * d}], got {q}")
        expect(
            kc.rank == 3 and kc.is_static and vc.dims == kc.dims,
            self,
            f"k_cache and v_cache must be static [SLOTS,C,{hkv * d}] alike, got {kc}, {vc}",
        )
        expect(
            kc.dtype is not DType.I8,
            self,
            "an int8 KV cache is for cache_attention only; slot caches are f32, bf16 or f16",
        )
        one = (Shape((1, *kc.dims[1:]), kc.dtype), Shape((1, *vc.dims[1:]), vc.dtype))
        pos1 = Shape((q.dims[1],), DType.I64)
        # one slot is a cache_attention: the same rules for q, k, v and the caches
        CacheAttention(h, d, hkv, self.window, self.scale, self.softcap).infer(
            (q, k, v, *one, pos1)
        )
        for name, t in (("positions", pos), ("slots", slots)):
            expect(
                t.dtype.is_int and t.rank == 1 and t.dims[0] == q.dims[1],
                self,
                f"{name} must be an integer [T] with T = q's length {q.dims[1]}, got {t}",
            )
        return q

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        q, k, v, kc, vc, pos, slots = xs
        runs = slot_runs(self.mnemonic, pos, slots, kc.shape[0], kc.shape[1])
        keys, vals = kc.copy(), vc.copy()
        sl = np.asarray(slots).reshape(-1).astype(np.int64)
        ps = np.asarray(pos).reshape(-1).astype(np.int64)
        keys[sl, ps], vals[sl, ps] = k[0], v[0]  # rounded to the cache dtype (nearest even)
        out = np.zeros(q.shape, ctx.out_dtype)
        for t0, t1, j, p0 in runs:
            end = p0 + t1 - t0
            o = _block_attention(self, q[:, t0:t1], keys[j : j + 1, :end], vals[j : j + 1, :end])
            out[:, t0:t1] = o
        return out


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
    k_scale: NodeId | None = None,
    v_scale: NodeId | None = None,
    softcap: float = 0.0,
) -> NodeId:
    """Attention of ``q`` over the caches with ``k, v`` written at ``positions``;
    ``k_scale`` / ``v_scale``: the scales of int8 caches; ``softcap`` > 0 soft-caps the
    scaled scores (0: off)."""
    hkv = num_heads if num_kv_heads is None else int(num_kv_heads)
    sc = None if scale is None else float(scale)
    op = CacheAttention(int(num_heads), int(head_dim), hkv, int(window), sc, float(softcap))
    extra = [] if k_scale is None or v_scale is None else [k_scale, v_scale]
    return g.apply(op, [q, k, v, k_cache, v_cache, positions, *extra])


@graph_method
def slot_cache_attention(
    g: Graph,
    q: NodeId,
    k: NodeId,
    v: NodeId,
    k_cache: NodeId,
    v_cache: NodeId,
    positions: NodeId,
    slots: NodeId,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int | None = None,
    window: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
) -> NodeId:
    """Attention of each token of ``q`` over its slot of the caches, with ``k, v`` written
    at (``slots``, ``positions``); ``softcap`` > 0 soft-caps the scaled scores (0: off)."""
    hkv = num_heads if num_kv_heads is None else int(num_kv_heads)
    sc = None if scale is None else float(scale)
    op = SlotCacheAttention(int(num_heads), int(head_dim), hkv, int(window), sc, float(softcap))
    return g.apply(op, [q, k, v, k_cache, v_cache, positions, slots])


@graph_method
def dequant_gather(g: Graph, packed: NodeId, ids: NodeId, scheme: QuantScheme) -> NodeId:
    """Decoded rows ``ids`` of the GGUF-packed table ``packed``."""
    return g.apply(DequantGather(scheme), [packed, ids])
