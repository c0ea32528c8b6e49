"""f32 matmuls on rlx's packed sgemm (``native/sgemm.py``). In: f32 MatMul / DotGeneral /
FusedMatMulBiasAct nodes (called by ``kernels/linalg.py`` and ``kernels/fused.py``) with their
arena views. Out: closures running the native GEMM with its epilogue, or None when BLAS
should run the node (the caller keeps its BLAS path).

* **Weight products** (``weight_matmul``): a product whose right operand is one matrix
  packs it into NR-wide panels: at compile time when it is a Constant, once per param
  change (``KernelCtx.prologue_once``) when it changes only with the params
  (``KernelCtx.stable``: a param or a param-derived node of the prologue), every run
  otherwise; the packed copy of a constant or stable weight is made once per compiled
  graph (``KernelCtx.keep``) and shared by the schedules of every shape. Bias and
  activation (relu, gelu, gelu_tanh, silu) are applied as each output tile is finished
  (the C epilogue; it also has scale, residual and a bf16 output, for direct callers).
* **Build**: ``prebuild`` (called by the executor before it builds a schedule) starts
  gcc on the library in a background thread when the graph has an f32 product, so a
  cold native cache builds it while the other kernels are built.
* **Batched products** (``batched_matmul``): [B, M, K] x [B, K, N] with both operands
  activations (attention's q.k^T and p.v when they are not fused): each B packed per call
  from its strides (a transposed operand needs no copy), batches split over the threads.
* **Choice** (``choose``): BLAS stays the fallback. Per shape class (the kind of product,
  the row count rounded up to a power of two, N, K, the batch count, threads and the
  micro-kernel) both are timed once, a few interleaved reps on random operands of at
  most 256 rows, the first time the class is seen (native wins ties within 5 %: it
  fuses the epilogue BLAS needs a pass for); the winner is recorded in
  ``<native cache>/sgemm_choice.json`` (written atomically; a file that does not parse or
  validate is ignored and rewritten) and reused by later compiles and processes.
  ``RLX_SGEMM=native|blas`` forces one. A product of at most ``SMALL_WORK`` (2^18)
  multiply-adds is native unmeasured: alone it times as call overhead, in the graph it
  is one C call of the native schedule with the epilogue fused. ``CompileOptions(native=False)``, no gcc or a
  failed build: BLAS, as before.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx import config
from rlx.backends.cpu import native
from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind
from rlx.backends.cpu.native.sgemm import ACT_CODES, SgemmLib, aligned_empty, sgemm_lib
from rlx.dtype import DType
from rlx.errors import CompileError, RlxError
from rlx.ops.core import Constant
from rlx.ops.fused import FusedMatMulBiasAct
from rlx.ops.linalg import DotGeneral, MatMul

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node

__all__ = [
    "prebuild",
    "weight_matmul",
    "batched_matmul",
    "choose",
    "native_sgemm",
    "choice_path",
    "forget_choices",
    "EPILOGUE_ACTS",
    "SMALL_WORK",
]

F32 = np.dtype(np.float32)
EPILOGUE_ACTS = frozenset(k for k in ACT_CODES if k is not None)
_CHOICE_FILE = "sgemm_choice.json"
_VERSION = 4  # 2: the 2-/4-/8-row tail kernels; 3: B prefetch, 1-2 rows on 4 panels (issue 31);
# 4: small products read A in place, half-width last panels, f32 erf / tanh epilogues
_MEASURE_ROWS = 256
_TIE = 1.05  # native wins within 5 % of BLAS
#: products of at most this many multiply-adds run native without a measurement (choose)
SMALL_WORK = 1 << 18


_lock = threading.Lock()
_builds: dict[Any, threading.Thread] = {}
_GEMM_OPS = (MatMul, DotGeneral, FusedMatMulBiasAct)


def prebuild(graph: Graph, native_on: bool = True) -> None:
    """Start building the library for the selected target in a background thread when
    ``graph`` has an f32 product and it may be used: gcc then runs while the schedule's
    other kernels are built (a cold native cache), not in front of the first matmul.
    Cheap when the library is already loaded."""
    if not native_on or config.sgemm() == "blas" or not native.available():
        return
    try:
        target = native.selected_target()
    except RlxError:
        return
    with _lock:
        if target in _builds:
            return
        if not any(isinstance(n.op, _GEMM_OPS) and n.shape.dtype is DType.F32 for n in graph.nodes):
            return
        t = threading.Thread(target=_build_quietly, args=(target,), daemon=True)
        _builds[target] = t
    t.start()


def _build_quietly(target: Any) -> None:
    try:
        sgemm_lib(target)
    except CompileError:
        pass  # the kernel factory builds again and notes the error


def native_sgemm(ctx: KernelCtx) -> SgemmLib | None:
    """The library for the selected target, or None (noted in ``ctx``) when native
    kernels are off (``CompileOptions.native``), ``RLX_SGEMM=blas``, or it cannot be built."""
    if not ctx.native or config.sgemm() == "blas":
        return None
    try:
        pending = _builds.get(native.selected_target())
        if pending is not None and pending.is_alive():
            pending.join()
        return sgemm_lib()
    except CompileError as e:
        ctx.notes.append(f"rlx sgemm unavailable, BLAS ({e.bare_message.splitlines()[0]})")
        return None


# ---- the recorded choice -------------------------------------------------------------------

_choices: dict[str, dict[str, str]] = {}  # choice file path -> its choices


def choice_path() -> Any:
    """The JSON file of recorded choices (in the native cache directory)."""
    from rlx.backends.cpu.native import cache

    return cache.cache_root() / _CHOICE_FILE


def _read() -> dict[str, str]:
    try:
        data = json.loads(choice_path().read_text())
    except (OSError, ValueError, CompileError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return {}
    ent = data.get("choices")
    if not isinstance(ent, dict):
        return {}
    return {k: v for k, v in ent.items() if isinstance(k, str) and v in ("native", "blas")}


def _write(choices: dict[str, str]) -> None:
    from rlx.backends.cpu.native import cache

    try:
        merged = {**_read(), **choices}
        text = json.dumps({"version": _VERSION, "choices": merged}, indent=0, sort_keys=True)
        cache.write_atomic(choice_path(), text.encode())
    except (OSError, CompileError):
        pass  # an unwritable cache only costs a re-measurement in the next process


def forget_choices() -> None:
    """Drop the in-process copy of the recorded choices (the file is read again)."""
    with _lock:
        _choices.clear()


def _where() -> str:
    try:
        return str(choice_path())
    except CompileError:
        return ""


def _bucket(m: int) -> int:
    return 1 << max(0, (max(m, 1) - 1).bit_length())


def _best(fn: Callable[[], Any], reps: int) -> float:
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def choose(
    key: str,
    make: Callable[[], tuple[Callable[[], Any], Callable[[], Any]]],
    threads: int,
    invariant: bool = False,
    *,
    small: bool = False,
) -> tuple[bool, str]:
    """Whether the native GEMM runs the shape class ``key``: ``RLX_SGEMM`` when it forces
    one, else native when ``invariant`` (``CompileOptions.batch_invariant``: one kernel for
    every shape), ``small`` (a product of at most :data:`SMALL_WORK` multiply-adds) or
    ``threads > 1`` (one thread pool), else the recorded choice, else both made by
    ``make()`` (native, BLAS) timed now (interleaved, best of a few) and the winner
    recorded. Returns (native?, why)."""
    forced = config.sgemm()
    if forced != "auto":
        return forced == "native", f"RLX_SGEMM={forced}"
    if invariant:
        return True, "batch-invariant: native for every shape"
    if small:
        # timed alone, a few-us product is mostly call overhead (ctypes against NumPy's);
        # in the graph the native one is a C call inside the native schedule with the
        # epilogue in its tiles, BLAS a Python call plus a bias / activation pass (the ONNX
        # MLP, 64 x 32..64 layers: see benchmarks/results/BENCHMARKS_onnx.md)
        return True, f"small product (<= {SMALL_WORK} multiply-adds): native"
    if threads > 1:
        # one pool: a schedule mixing OpenBLAS's threads with the OpenMP team loses to
        # either alone (all-MiniLM-L6-v2 1x16 at 2 threads: mixed 7.9 ms, all native
        # 2.3 ms, all BLAS 5.2 ms; 8x128: 81 vs 80 ms), so BLAS stays out of the hot path
        return True, "one thread pool: native at num_threads > 1"
    where = _where()
    with _lock:
        if where not in _choices:
            _choices[where] = _read() if where else {}
        got = _choices[where].get(key)
    if got is not None:
        return got == "native", "recorded choice"
    from rlx.backends.cpu.threads import ensure_blas_threads

    ensure_blas_threads(threads)
    native, blas = make()
    native()
    blas()  # warm both (page faults, the packing buffers)
    tn = tb = math.inf
    budget = time.perf_counter() + 0.03
    for _ in range(4):
        tn = min(tn, _best(native, 1))
        tb = min(tb, _best(blas, 1))
        if time.perf_counter() > budget:
            break
    # the native GEMM also fuses the epilogue BLAS needs a pass for: it keeps a tie
    win = "native" if tn <= _TIE * tb else "blas"
    with _lock:
        _choices.setdefault(where, {})[key] = win
    if where:
        _write({key: win})
    return win == "native", f"measured {tn * 1e3:.3f} ms vs BLAS {tb * 1e3:.3f} ms"


def _bound(fn: Any, args: tuple) -> Callable[[], int]:
    """``fn`` with ``args`` converted to its ctypes argument types once (a call then
    skips the int conversions: about half the ctypes overhead)."""
    conv = [None if v is None else t(v) for t, v in zip(fn.argtypes, args, strict=True)]
    return functools.partial(fn, *conv)


def _rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


# ---- weight products -------------------------------------------------------------------


def _stable_or_const(ctx: KernelCtx, node: Node, i: int) -> str:
    nid = node.inputs[i]
    if isinstance(ctx.graph.nodes[nid].op, Constant):
        return "const"
    return "stable" if nid in ctx.stable else "call"


def weight_matmul(
    node: Node,
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    ctx: KernelCtx,
    *,
    bias: np.ndarray | None = None,
    act: str | None = None,
    bias_index: int = 2,
) -> Kernel | None:
    """``out = act(a @ b + bias)`` on the packed sgemm for f32 ``a`` [..., M, K] and a single
    matrix ``b`` (all leading dims 1), or None when the layout is not one it takes or
    BLAS is faster for the shape class (noted in ``ctx``). ``bias``: f32 [N]; ``act``: one
    of :data:`EPILOGUE_ACTS`."""
    if a.dtype != F32 or b.dtype != F32 or out.dtype != F32 or a.ndim < 2 or b.ndim < 2:
        return None
    if any(d != 1 for d in b.shape[:-2]) or out.ndim < 2 or not out.flags.c_contiguous:
        return None
    lead = out.shape[:-2]
    if not (a.shape[:-2] == lead or (not a.shape[:-2] and all(d == 1 for d in lead))):
        return None
    if bias is not None and (bias.dtype != F32 or bias.size != out.shape[-1]):
        return None
    if act is not None and act not in EPILOGUE_ACTS:
        return None
    k, n = b.shape[-2], b.shape[-1]
    if a.ndim == 2:
        a2 = a
    elif a.flags.c_contiguous:
        a2 = a.reshape(math.prod(a.shape[:-1]), k)
    else:
        return None
    m = a2.shape[0]
    if m == 0 or n == 0:
        return None
    lib = native_sgemm(ctx)
    if lib is None:
        return None
    o2 = out.reshape(m, n)
    b2 = b[(0,) * (b.ndim - 2)]
    nt = ctx.num_threads
    mm = min(m, _MEASURE_ROWS)
    key = f"mm|{lib.isa}|t{nt}|m{_bucket(m)}|n{n}|k{k}"

    def make() -> tuple[Callable[[], Any], Callable[[], Any]]:
        ta, tb, to = _rand((mm, k), 1), _rand((k, n), 2), np.empty((mm, n), F32)
        packed = lib.pack_b(tb)  # kept alive by the closure: targs holds its raw address
        targs = lib.gemm_args(ta, packed, to)
        return lambda: (packed, lib.lib.rlx_sgemm(*targs, nt)), lambda: np.matmul(ta, tb, out=to)

    small = m * n * k <= SMALL_WORK
    use, why = choose(key, make, nt, ctx.batch_invariant, small=small)
    if not use:
        ctx.notes.append(f"blas (not rlx sgemm ({lib.isa}): {why})")
        return None
    kind = _stable_or_const(ctx, node, 1)
    # a weight that does not change with the shape is packed once for the schedules of
    # every shape of the compiled graph (KernelCtx.keep / prologue_once)
    key = ("sgemm.pack_b", node.inputs[1], k, n, b2.strides, lib.isa)  # w and w.T pack apart
    size = lib.packed_size(k, n)
    packed = (
        aligned_empty(size)
        if kind == "call"
        else ctx.keep(key, lambda: aligned_empty(size, huge=True))  # 2 MB pages: TLB misses
    )
    pb_args = (b2.ctypes.data, b2.strides[0] // 4, b2.strides[1] // 4, k, n, packed.ctypes.data)
    pack = lib.lib.rlx_sgemm_pack_b
    steps: list[Kernel] = []
    if kind == "const":
        ctx.keep((*key, "packed"), lambda: pack(*pb_args, nt))
        when = "at compile time"
    elif kind == "stable":
        ctx.prologue_once(key, lambda: pack(*pb_args, nt))  # type: ignore[arg-type, return-value]
        when = "once per param change"
    else:
        steps.append(lambda: pack(*pb_args, nt))  # type: ignore[arg-type, return-value]
        when = "every run"
    bias1: np.ndarray | None = None
    if bias is not None:
        bias1 = bias.reshape(n)
        if not bias1.flags.c_contiguous:  # a strided bias: a private copy kept current
            src, bias1 = bias1, np.empty(n, F32)
            dst = bias1
            b_kind = _stable_or_const(ctx, node, bias_index)
            if b_kind == "const":
                np.copyto(dst, src)
            elif b_kind == "stable":
                ctx.prologue.append(lambda: np.copyto(dst, src))  # type: ignore[arg-type, return-value]
            else:
                steps.append(lambda: np.copyto(dst, src))  # type: ignore[arg-type, return-value]
    args = lib.gemm_args(a2, packed, o2, bias=bias1, act=act)
    gemm = _bound(lib.lib.rlx_sgemm, (*args, nt))
    ctx.kind = KernelKind.NATIVE
    epi = [s for s, on in (("bias", bias is not None), (act or "", act is not None)) if on]
    ep = f", epilogue {' + '.join(epi)} in the tile" if epi else ""
    ctx.notes.append(f"{lib.label} {m}x{n}x{k}: weight packed {when}{ep}; {why}")
    keep = (packed, bias1, a2, o2)

    def run() -> None:
        for s in steps:
            s()
        if gemm() != 0:
            raise MemoryError(f"rlx sgemm of %{node.id}: could not allocate packing buffers")

    run.keepalive = keep  # type: ignore[attr-defined]  # args hold only pointers
    if not steps:  # one C call: the native schedule may make it (native/schedule.py)
        run.native_call = (gemm.func, gemm.args, True)  # type: ignore[attr-defined]
    return run


# ---- batched products ------------------------------------------------------------------


def batched_matmul(
    node: Node,
    a3: np.ndarray,
    b3: np.ndarray,
    o3: np.ndarray,
    ctx: KernelCtx,
    *,
    scale: float = 1.0,
) -> Kernel | None:
    """``o3[i] = scale * a3[i] @ b3[i]`` for f32 [B, M, K] x [B, K, N] views (any strides;
    ``o3`` with contiguous rows) on the native GEMM, packing each ``b3[i]`` per call; None
    when BLAS is faster for the shape class or the library is unavailable."""
    if not (a3.dtype == b3.dtype == o3.dtype == F32) or o3.size == 0:
        return None
    if o3.shape[2] > 1 and o3.strides[2] != 4:
        return None
    lib = native_sgemm(ctx)
    if lib is None:
        return None
    nb, m, k = a3.shape
    n = b3.shape[2]
    nt = ctx.num_threads
    tb = min(nb, 4 * nt)
    bt = k > 1 and n > 1 and b3.strides[1] < b3.strides[2]  # k-contiguous (a transpose)
    key = f"bmm|{lib.isa}|t{nt}|b{_bucket(nb)}|m{_bucket(m)}|n{n}|k{k}|{'bt' if bt else 'b'}"

    def make() -> tuple[Callable[[], Any], Callable[[], Any]]:
        xa = _rand((tb, m, k), 3)
        xb = _rand((tb, n, k), 4).transpose(0, 2, 1) if bt else _rand((tb, k, n), 4)
        xo, xbc = np.empty((tb, m, n), F32), np.empty((tb, k, n), F32)
        targs = lib.batched_args(xa, xb, xo)

        def blas() -> None:
            if bt:
                np.copyto(xbc, xb)
            np.matmul(xa, xbc if bt else xb, out=xo)

        return lambda: lib.lib.rlx_sgemm_batched(*targs, nt), blas

    use, why = choose(key, make, nt, ctx.batch_invariant)
    if not use:
        ctx.notes.append(f"blas (not rlx sgemm ({lib.isa}): {why})")
        return None
    args = lib.batched_args(a3, b3, o3, scale=scale)
    fn = _bound(lib.lib.rlx_sgemm_batched, (*args, nt))
    ctx.kind = KernelKind.NATIVE
    ctx.notes.append(f"{lib.label} batched {nb}x({m}x{n}x{k}): operands packed per call; {why}")

    def run() -> None:
        if fn() != 0:
            raise MemoryError(f"rlx sgemm of %{node.id}: could not allocate packing buffers")

    run.keepalive = (a3, b3, o3)  # type: ignore[attr-defined]
    return run
