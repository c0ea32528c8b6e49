"""CPU kernels of ``cache_attention`` and ``dequant_gather`` (``rlx/ops/kvcache.py``).

Both attention ops pass their ``softcap`` (0: off) to the native kernel, which caps the
scaled scores before the mask; the NumPy fallback does the same with ``softcap_scores``.

``cache_attention``: one native call per run (``native/csrc/cache_attention.c``, built
into the attention library of the cache's dtype; a ``native_call``, so the native schedule
runs a whole decode step, every layer, as one C call): it checks ``positions`` (start
``p``), writes the ``S`` new k / v rows into rows ``p..p+S-1`` of the cache params' private
storage (never the whole cache) and attends over the first ``p+S`` rows with the
end-aligned causal / sliding-window mask. Bad positions: the call returns 1 having written
nothing and the Python check (``cache_start``) raises the op's InputError. A bf16 / f16
cache: the new rows and q are rounded to its dtype and the output is rounded once, as the
op's reference models. An int8 cache (with its ``k_scale`` / ``v_scale`` params): the new
rows are quantized as ``quantize_heads``; a decode step reads the int8 rows block by block
inside the kernel, a prompt chunk dequantizes the valid prefix into f32 scratch rows (one
pair per schedule) in C. Decode (S = 1) runs a kernel vectorized over head_dim with the
keys split in fixed chunks over the threads (exact merge; the same bits at any thread
count); S > 1 runs the fused attention kernel (``csrc/attention.c``). Without the native
library (or ``native=False``, or a non-contiguous view) the same is computed with NumPy.
The cache params must not be given by the caller (the runtime's zeroed storage is the
cache): a given one is a CompileError naming it.

``slot_cache_attention``: the same as one native call for all tokens (int64 positions and
slots): checks every token's slot and position (1, nothing written, then ``slot_runs``
raises), writes every token's rows into its slot, then attends each run of tokens (one
slot, consecutive positions): the runs of one token (decode) all in one parallel call of
the decode kernel, longer runs (a prompt chunk) through the fused kernel.

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


def _native_lib(op: CacheAttention | SlotCacheAttention, arrays, kc, ctx: KernelCtx):  # type: ignore[no-untyped-def]
    """The attention library of the cache's dtype (f32 for an int8 cache), or None (with
    a note) when it is not available or an array is not C-contiguous."""
    if not ctx.native:
        return None
    what = op.mnemonic
    try:
        from rlx.backends.cpu.native.attention import attention_lib

        lib = attention_lib(dtype=np.float32 if kc.dtype == np.int8 else kc.dtype)
    except CompileError as e:
        ctx.notes.append(f"NumPy {what} (native build: {str(e).splitlines()[0]})")
        return None
    if not all(x.flags.c_contiguous for x in arrays):
        ctx.notes.append(f"NumPy {what} (a non-contiguous view)")
        return None
    return lib


def _fail(what: str, check: Callable[[], object]) -> Callable[[int], None]:
    """``on_error(rc)`` of a native cache call: rc 1 re-runs the Python ``check`` (which
    raises the op's InputError), -1 is the workspace."""

    def on_error(rc: int) -> None:
        if rc == 1:
            check()
        raise CompileError(f"{what}: the native cache attention failed (code {rc})")

    return on_error


def _native_cache(  # type: ignore[no-untyped-def]
    node: Node, op: CacheAttention, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx,
    kc, vc,
):  # fmt: skip
    """One native call (``csrc/cache_attention.c``) that checks the positions, writes the
    new rows and attends (an int8 cache: quantizes them and attends over the int8 rows),
    or None when it cannot run here."""
    from rlx.backends.cpu.native.attention import CacheCall

    q, k, v, _, _, positions = ins[:6]
    i8 = kc.dtype == np.int8
    scales = (_cache_storage(node, ctx, 6), _cache_storage(node, ctx, 7)) if i8 else ()
    arrays = (q, k, v, positions, kc, vc, out, *scales)
    lib = _native_lib(op, arrays, kc, ctx)
    if lib is None or positions.dtype not in (np.int32, np.int64):
        return None
    b, s, _ = q.shape
    cap = kc.shape[1]
    h, d, hkv = op.num_heads, op.head_dim, op.num_kv_heads
    threads = ctx.num_threads if lib.openmp else 1
    nws = int(lib.lib.rlx_cache_ws_floats(b, cap, h, hkv, d, threads))
    ws = ctx.scratch((nws,), np.float32, 61)
    head = (q.ctypes.data, k.ctypes.data, v.ctypes.data, positions.ctypes.data,
            int(positions.dtype == np.int64), kc.ctypes.data, vc.ctypes.data)  # fmt: skip
    dims = (b, s, cap, h, hkv, d, ctypes.c_float(op.effective_scale), ctypes.c_float(op.softcap))
    keep: tuple = (*arrays, ws)
    if i8:
        # S > 1 dequantizes the valid prefix into f32 scratch rows (shared by the layers)
        kf = ctx.scratch(kc.shape, np.float32, 64) if s > 1 else None
        vf = ctx.scratch(vc.shape, np.float32, 65) if s > 1 else None
        ks, vs = scales
        fn = lib.lib.rlx_cache_attention_i8
        args = (*head, ks.ctypes.data, vs.ctypes.data, ks.shape[-1], out.ctypes.data, *dims,
                op.window, None if kf is None else kf.ctypes.data,
                None if vf is None else vf.ctypes.data, ws.ctypes.data, ws.size, threads)  # fmt: skip
        keep += (kf, vf)
    else:
        low = kc.dtype != np.float32  # q / the output go through scratch of its dtype
        qn = ctx.scratch(q.shape, kc.dtype, 62) if low and s > 1 else None
        on = ctx.scratch(out.shape, kc.dtype, 63) if low and s > 1 else None
        fn = lib.lib.rlx_cache_attention
        args = (*head, out.ctypes.data, *dims, op.window,
                None if qn is None else qn.ctypes.data, None if on is None else on.ctypes.data,
                ws.ctypes.data, ws.size, threads)  # fmt: skip
        keep += (qn, on)
    what = f"cache_attention %{node.id}"
    ctx.notes.append(
        f"native {op.mnemonic} over {cap} {kc.dtype} rows ({lib.path}, {threads} threads)"
    )
    return CacheCall(fn, args, keep, _fail(what, lambda: cache_start(what, positions, s, cap)))


@kind(KernelKind.NATIVE)
def cache_attention_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Write the new rows into the caches, then attend over their valid prefix."""
    op: CacheAttention = node.op  # type: ignore[assignment]
    q, k, v, _, _, positions = ins[:6]
    kc, vc = _cache_storage(node, ctx, 3), _cache_storage(node, ctx, 4)
    s, cap = q.shape[1], kc.shape[1]
    native = _native_cache(node, op, ins, out, ctx, kc, vc)
    if native is not None:
        return native
    ctx.kind = KernelKind.NUMPY
    what = f"cache_attention %{node.id}"
    if kc.dtype == np.int8:
        ks, vs = _cache_storage(node, ctx, 6), _cache_storage(node, ctx, 7)
        groups = ks.shape[-1]

        def run_i8() -> None:
            p = cache_start(what, positions, s, cap)
            kc[:, p : p + s], ks[:, p : p + s] = quantize_heads(k, groups)
            vc[:, p : p + s], vs[:, p : p + s] = quantize_heads(v, groups)
            kf = dequantize_heads(kc[:, : p + s], ks[:, : p + s])
            vf = dequantize_heads(vc[:, : p + s], vs[:, : p + s])
            _numpy_attention(op, q, kf, vf, out)

        return run_i8

    def run() -> None:
        p = cache_start(what, positions, s, cap)
        kc[:, p : p + s] = k
        vc[:, p : p + s] = v
        _numpy_attention(op, q, kc[:, : p + s], vc[:, : p + s], out)

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
    what = f"slot_cache_attention %{node.id}"
    lib = _native_lib(op, (q, k, v, positions, slots, kc, vc, out), kc, ctx)
    if lib is not None and positions.dtype == np.int64 and slots.dtype == np.int64:
        from rlx.backends.cpu.native.attention import CacheCall

        t = q.shape[1]
        h, d, hkv = op.num_heads, op.head_dim, op.num_kv_heads
        threads = ctx.num_threads if lib.openmp else 1
        nws = int(lib.lib.rlx_cache_ws_floats(t, cap, h, hkv, d, threads))
        ws = ctx.scratch((nws,), np.float32, 61)
        low = kc.dtype != np.float32
        qn = ctx.scratch(q.shape, kc.dtype, 62) if low and t > 1 else None
        on = ctx.scratch(out.shape, kc.dtype, 63) if low and t > 1 else None
        args = (q.ctypes.data, k.ctypes.data, v.ctypes.data, positions.ctypes.data,
                slots.ctypes.data, kc.ctypes.data, vc.ctypes.data, out.ctypes.data, t, nslots,
                cap, h, hkv, d, ctypes.c_float(op.effective_scale), ctypes.c_float(op.softcap),
                op.window, None if qn is None else qn.ctypes.data,
                None if on is None else on.ctypes.data, ws.ctypes.data, ws.size, threads)  # fmt: skip
        keep = (q, k, v, positions, slots, kc, vc, out, ws, qn, on)
        ctx.notes.append(
            f"native {op.mnemonic} over {nslots}x{cap} {kc.dtype} rows ({lib.path}, "
            f"{threads} threads)"
        )
        check = _fail(what, lambda: slot_runs(what, positions, slots, nslots, cap))
        return CacheCall(lib.lib.rlx_slot_cache_attention, args, keep, check)
    ctx.kind = KernelKind.NUMPY

    def run() -> None:
        runs = slot_runs(what, positions, slots, nslots, cap)
        sl, ps = slots.astype(np.int64, copy=False), positions.astype(np.int64, copy=False)
        kc[sl, ps] = k[0]
        vc[sl, ps] = v[0]
        for t0, t1, j, p0 in runs:
            end = p0 + t1 - t0
            _numpy_attention(op, q[:, t0:t1], kc[j : j + 1, :end], vc[j : j + 1, :end],
                             out[:, t0:t1])  # fmt: skip

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
