"""CPU kernels of ``cache_attention`` and ``dequant_gather`` (``rlx/ops/kvcache.py``).

Both attention ops pass their ``softcap`` (0: off) to the native kernel, which caps the
scaled scores before the mask; the NumPy fallback does the same with ``softcap_scores``.

``cache_attention``: each run reads ``positions`` (start ``p``, checked), copies the ``S``
new k / v rows into rows ``p..p+S-1`` of the cache params' private storage (the cache
update: ``S`` rows, never the whole cache), then runs the fused native attention kernel
(``native/csrc/attention.c``, the one ``attention`` uses) on ``q`` against the cache's
first ``p+S`` rows, with its end-aligned causal / sliding-window mask; the valid length is
a run-time argument, so one schedule serves every position. A bf16 / f16 cache: the new
rows are rounded into it, q is rounded into a scratch of that dtype and the kernel's
output (that dtype) is widened into the f32 output, as the op's reference models; the
kernel reads the low-precision cache directly. An int8 cache (with its ``k_scale`` /
``v_scale`` params): the new rows are quantized per row and head into it
(``quantize_heads``), then the valid prefix is dequantized into f32 scratch rows (one pair
of scratch caches per schedule, shared by the layers) and the f32 native kernel runs on
them. Without the native library
(or ``native=False``) the same attention is computed with NumPy. The cache params must not
be given by the caller (the runtime's zeroed storage is the cache): a given one is a
CompileError naming it.

``slot_cache_attention``: each run checks the tokens' slots and positions (``slot_runs``),
writes every token's k / v row into its slot's row, then runs the same native attention
once per run of tokens (one slot, consecutive positions: a decode token is a run of one,
a prompt chunk one run) over that slot's first ``p+S`` rows; low-precision caches and the
NumPy fallback as above.

``dequant_gather``: the ids' packed rows are decoded with ``rlx.formats.gguf`` into the
output view (only those rows: one row per token).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind
from rlx.errors import CompileError
from rlx.ir.mir import Node
from rlx.ops.core import Param
from rlx.ops.kvcache import (
    CacheAttention,
    DequantGather,
    SlotCacheAttention,
    cache_mask,
    cache_start,
    check_ids,
    dequantize_heads,
    quantize_heads,
    slot_runs,
    softcap_scores,
)
from rlx.ops.nn import split_heads

__all__ = ["cache_attention_kernel", "slot_cache_attention_kernel", "dequant_gather_kernel"]


def _cache_storage(node: Node, ctx: KernelCtx, i: int) -> np.ndarray:
    """The writable storage of cache input ``i`` (a param the runtime owns)."""
    src = ctx.graph.nodes[node.inputs[i]]
    what = {3: "k_cache", 4: "v_cache", 6: "k_scale", 7: "v_scale"}[i]
    if not isinstance(src.op, Param):
        raise CompileError(
            f"{node.op.mnemonic} %{node.id}: {what} must be a param (the cache the runtime "
            f"keeps), got %{src.id} {src.op.mnemonic}"
        )
    name = src.op.name
    own = ctx.store.private(name) if ctx.store is not None else None
    if own is None:
        raise CompileError(
            f"{node.op.mnemonic} %{node.id}: cache param {name!r} was given by the caller; "
            "leave it unset so that the runtime keeps the cache in its own storage"
        )
    return own


def _numpy_attention(op: CacheAttention | SlotCacheAttention, q, keys, vals, out) -> None:  # type: ignore[no-untyped-def]
    dt = keys.dtype
    if dt != np.float32:  # the roundings of the native path (rlx/ops/kvcache.py)
        q = q.astype(dt).astype(np.float32)
        keys, vals = keys.astype(np.float32), vals.astype(np.float32)
    s, skv = q.shape[1], keys.shape[1]
    qh, kh, vh = split_heads(q, keys, vals, op.num_heads, op.head_dim, op.num_kv_heads)
    sc = softcap_scores(
        np.matmul(qh, kh.swapaxes(-1, -2)) * np.float32(op.effective_scale), op.softcap
    )
    sc = np.where(cache_mask(op.window).allowed(s, skv), sc, -np.inf)
    sc -= sc.max(axis=-1, keepdims=True)
    np.exp(sc, out=sc)
    sc /= sc.sum(axis=-1, keepdims=True)
    o = np.matmul(sc, vh).transpose(0, 2, 1, 3).reshape(out.shape)
    out[...] = o if dt == np.float32 else o.astype(dt)


def _native_block(op: CacheAttention | SlotCacheAttention, q, kc, vc, out, ctx: KernelCtx):  # type: ignore[no-untyped-def]
    """``(block, qn, on)``: ``block(q_off, c_off, o_off, s, skv)`` runs the native attention
    of ``s`` query rows (``q_off`` bytes into ``qn``) over ``skv`` cache rows (``c_off``
    bytes into the caches) into ``on`` (``o_off`` bytes); ``qn`` / ``on`` are q / out or,
    with a low-precision cache, scratch of its dtype the caller fills / reads. None (with
    a note) when the native library is not available."""
    if not ctx.native:
        return None
    what = op.mnemonic
    try:
        from rlx.backends.cpu.native.attention import MASK_CODES, attention_lib

        lib = attention_lib(dtype=kc.dtype)
    except CompileError as e:
        ctx.notes.append(f"NumPy {what} (native build: {str(e).splitlines()[0]})")
        return None
    if not all(x.flags.c_contiguous for x in (q, kc, vc, out)):
        ctx.notes.append(f"NumPy {what} (a non-contiguous view)")
        return None
    h, d, hkv = op.num_heads, op.head_dim, op.num_kv_heads
    low = kc.dtype != np.float32
    # a low-precision cache: q and the output go through scratch rows of its dtype
    qn = ctx.scratch(q.shape, kc.dtype, 62) if low else q
    on = ctx.scratch(out.shape, kc.dtype, 63) if low else out
    threads = ctx.num_threads if lib.openmp else 1
    ws = ctx.scratch((lib.workspace_floats(d, threads),), np.float32, 61)
    code = MASK_CODES[cache_mask(op.window).type]
    fn = lib.lib.rlx_attention
    qp, kp, vp, op_ = qn.ctypes.data, kc.ctypes.data, vc.ctypes.data, on.ctypes.data
    scale, cap = ctypes.c_float(op.effective_scale), ctypes.c_float(op.softcap)
    tail = (h, hkv, d, scale, cap, code, op.window, None, 0, 0, 0, 0, ws.ctypes.data, ws.size)
    keep = (q, kc, vc, out, ws, qn, on)

    def block(q_off: int, c_off: int, o_off: int, s: int, skv: int) -> None:
        t = threads if s * skv * h * d >= 1 << 18 else 1
        rc = fn(qp + q_off, kp + c_off, vp + c_off, op_ + o_off, 1, s, skv, *tail, t)
        if rc:
            raise CompileError(f"{what}: the attention workspace is too small")

    block.keep = keep  # type: ignore[attr-defined]  # the arrays outlive the pointers
    ctx.notes.append(
        f"native {what} over {kc.shape[1]} {kc.dtype} rows ({lib.path}, {threads} threads)"
    )
    return block, qn, on


def _native_call(op: CacheAttention, q, kc, vc, out, ctx: KernelCtx):  # type: ignore[no-untyped-def]
    """``call(p_plus_s)`` running the native attention over the caches' first rows, or
    None (with a note) when the native library is not available."""
    got = _native_block(op, q, kc, vc, out, ctx)
    if got is None:
        return None
    block, qn, on = got
    b, s, _ = q.shape
    low = qn is not q
    row, qrow, orow = kc.strides[0], qn.strides[0], on.strides[0]

    def call(skv: int) -> None:
        # one batch row at a time: the first skv rows of a batch's cache are contiguous
        if low:
            qn[...] = q
        for i in range(b):
            block(i * qrow, i * row, i * orow, s, skv)
        if low:
            out[...] = on

    return call


@kind(KernelKind.NATIVE)
def cache_attention_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Write the new rows into the caches, then attend over their valid prefix."""
    op: CacheAttention = node.op  # type: ignore[assignment]
    q, k, v, _, _, positions = ins[:6]
    kc, vc = _cache_storage(node, ctx, 3), _cache_storage(node, ctx, 4)
    s, cap = q.shape[1], kc.shape[1]
    if kc.dtype == np.int8:
        return _int8_cache_kernel(node, op, ins, out, ctx, kc, vc)
    native: Callable[[int], None] | None = _native_call(op, q, kc, vc, out, ctx)
    if native is None:
        ctx.kind = KernelKind.NUMPY

    def run() -> None:
        p = cache_start(f"cache_attention %{node.id}", positions, s, cap)
        kc[:, p : p + s] = k
        vc[:, p : p + s] = v
        if native is not None:
            native(p + s)
        else:
            _numpy_attention(op, q, kc[:, : p + s], vc[:, : p + s], out)

    return run


def _int8_cache_kernel(  # type: ignore[no-untyped-def]
    node: Node, op: CacheAttention, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx,
    kc, vc,
) -> Kernel:  # fmt: skip
    """The int8 cache: quantize the new rows in, dequantize the valid prefix into f32
    scratch, attend over it (module docstring)."""
    q, k, v, _, _, positions = ins[:6]
    ks, vs = _cache_storage(node, ctx, 6), _cache_storage(node, ctx, 7)
    s, cap, groups = q.shape[1], kc.shape[1], ks.shape[-1]
    kf = ctx.scratch(kc.shape, np.float32, 64)
    vf = ctx.scratch(vc.shape, np.float32, 65)
    native = _native_call(op, q, kf, vf, out, ctx)
    if native is None:
        ctx.kind = KernelKind.NUMPY

    def run() -> None:
        p = cache_start(f"cache_attention %{node.id}", positions, s, cap)
        kc[:, p : p + s], ks[:, p : p + s] = quantize_heads(k, groups)
        vc[:, p : p + s], vs[:, p : p + s] = quantize_heads(v, groups)
        kf[:, : p + s] = dequantize_heads(kc[:, : p + s], ks[:, : p + s])
        vf[:, : p + s] = dequantize_heads(vc[:, : p + s], vs[:, : p + s])
        if native is not None:
            native(p + s)
        else:
            _numpy_attention(op, q, kf[:, : p + s], vf[:, : p + s], out)

    return run


@kind(KernelKind.NATIVE)
def slot_cache_attention_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Write every token's k / v row into its slot, then attend each run of tokens (one
    slot, consecutive positions) over its slot's valid prefix."""
    op: SlotCacheAttention = node.op  # type: ignore[assignment]
    q, k, v, _, _, positions, slots = ins
    kc, vc = _cache_storage(node, ctx, 3), _cache_storage(node, ctx, 4)
    nslots, cap = kc.shape[0], kc.shape[1]
    got = _native_block(op, q, kc, vc, out, ctx)
    if got is None:
        ctx.kind = KernelKind.NUMPY
    what = f"slot_cache_attention %{node.id}"

    def run() -> None:
        runs = slot_runs(what, positions, slots, nslots, cap)
        sl, ps = slots.astype(np.int64, copy=False), positions.astype(np.int64, copy=False)
        kc[sl, ps] = k[0]
        vc[sl, ps] = v[0]
        if got is None:
            for t0, t1, j, p0 in runs:
                end = p0 + t1 - t0
                _numpy_attention(op, q[:, t0:t1], kc[j : j + 1, :end], vc[j : j + 1, :end],
                                 out[:, t0:t1])  # fmt: skip
            return
        block, qn, on = got
        low = qn is not q
        if low:
            qn[...] = q
        qrow, crow, orow = qn.strides[1], kc.strides[0], on.strides[1]
        for t0, t1, j, p0 in runs:
            block(t0 * qrow, j * crow, t0 * orow, t1 - t0, p0 + t1 - t0)
        if low:
            out[...] = on

    return run


def dequant_gather_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Decode the packed rows the ids pick into the output view."""
    from rlx.formats.gguf import dequantize_rows

    op: DequantGather = node.op  # type: ignore[assignment]
    w, ids = ins
    k = out.shape[-1]
    flat_out = out.reshape(-1, k)
    what = f"dequant_gather %{node.id}"

    def run() -> None:
        rows = check_ids(what, ids, w.shape[0])
        flat_out[...] = dequantize_rows(op.scheme, w[rows])

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    CacheAttention: (cache_attention_kernel,),
    SlotCacheAttention: (slot_cache_attention_kernel,),
    DequantGather: (dequant_gather_kernel,),
}
