"""The fused attention library (``csrc/attention_vec.c``, the vector layer, then
``csrc/attention.c``, the kernel). In: q, k, v (packed heads; f32, bf16 or f16, one
library per dtype), a mask kind and an optional additive f32 mask. Out:
``softmax(cap(q kᵀ scale) + mask) v`` (f32 arithmetic; ``cap(s)`` is ``c * tanh(s / c)``
for a ``softcap`` ``c > 0``, ``s`` for 0) written into the output (q's dtype),
through :class:`AttentionLib`.

:func:`attention_lib` builds the library for a build target (default: the selected one,
``RLX_ISA``) and a dtype: the AVX-512 or AVX2 intrinsics path or plain C, as the
target's flags define, or NEON on the aarch64 targets (``csrc/attention_neon.h``);
:attr:`AttentionLib.path` names it (``avx512`` / ``avx2`` / ``neon`` / ``c``). f16 needs
F16C on x86-64 (AVX2, AVX512) or aarch64's FCVT, so the portable target has no f16
library (CompileError).

Each library also holds the KV-cache entries of ``csrc/cache_attention.c`` (appended to
the kernel): ``rlx_cache_attention``, ``rlx_cache_attention_i8`` (the f32 library) and
``rlx_slot_cache_attention``, bound by ``kernels/kvcache.py`` as :class:`CacheCall` objects.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable

import numpy as np

from rlx.backends.cpu.native import bindings, cpu
from rlx.backends.cpu.native.prebuilt import attention_source
from rlx.dtype import is_bf16
from rlx.errors import CompileError, InputError
from rlx.ops.nn import MaskType

__all__ = ["AttentionLib", "attention_lib", "MASK_CODES", "CacheCall"]


#: the C kernel's mask codes
MASK_CODES = {MaskType.NONE: 0, MaskType.CAUSAL: 1, MaskType.SLIDING_WINDOW: 2, MaskType.CUSTOM: 3}
_PATHS = {0: "c", 1: "avx2", 2: "avx512", 3: "neon"}
#: the targets that build f16 attention (F16C on x86-64, FCVT on aarch64)
F16_TARGETS = (
    cpu.Target.AVX2,
    cpu.Target.AVX512,
    cpu.Target.NEON,
    cpu.Target.DOTPROD,
    cpu.Target.I8MM,
)
_CODES = {np.dtype(np.float32): 0, np.dtype(np.float16): 2}


def dtype_code(dt: np.dtype) -> int | None:
    """The C ``RLX_ATT_DT`` code of element dtype ``dt`` (f32 0, bf16 1, f16 2; None for
    another dtype)."""
    return 1 if is_bf16(dt) else _CODES.get(dt)


class AttentionLib:
    """Typed wrapper over ``csrc/attention.c``."""

    def __init__(self, lib: ctypes.CDLL, dtype: np.dtype):
        self.lib = lib
        self.dtype = np.dtype(dtype)
        if lib.rlx_attention_dtype() != dtype_code(self.dtype):
            raise CompileError(f"attention library {lib} is not the {self.dtype} one")
        self.path: str = _PATHS[int(lib.rlx_attention_isa())]
        self.openmp = bool(lib.rlx_attention_openmp())
        self.block_rows = int(lib.rlx_attention_block_rows())

    def workspace_floats(self, head_dim: int, threads: int) -> int:
        """f32 elements of workspace ``threads`` threads need at ``head_dim``."""
        return int(self.lib.rlx_attention_ws_floats(head_dim)) * max(1, threads)

    def run(self, *args: np.ndarray, **kw: object) -> None:
        """:meth:`prepare` the call and run it once."""
        self.prepare(*args, **kw)()  # type: ignore[arg-type]

    def prepare(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        out: np.ndarray,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        softcap: float = 0.0,
        mask_type: MaskType = MaskType.NONE,
        window: int = 0,
        mask: np.ndarray | None = None,
        workspace: np.ndarray | None = None,
        num_threads: int = 1,
    ) -> Callable[[], None]:
        """A call computing ``out[B,Sq,H*D] = attention(q, k, v)`` from these arrays (their
        addresses are taken now: the call reads their contents when run). q, k, v, out
        C-contiguous of this library's dtype, ``mask`` f32 broadcastable to [B,H,Sq,Skv] (custom masks only);
        InputError otherwise. ``workspace``: f32 of :meth:`workspace_floats` elements
        (allocated here when None). ``softcap`` > 0: the scaled scores are soft-capped to
        ``softcap * tanh(s / softcap)`` before the mask (0: off, the same code path and
        bits as without it)."""
        b, sq, hd = q.shape
        skv = k.shape[1]
        h, hkv, d = num_heads, num_kv_heads, head_dim
        want = {"q": (q, (b, sq, h * d)), "k": (k, (b, skv, hkv * d))}
        want |= {"v": (v, (b, skv, hkv * d)), "out": (out, (b, sq, h * d))}
        for name, (x, dims) in want.items():
            if x.dtype != self.dtype or x.shape != dims or not x.flags.c_contiguous:
                raise InputError(
                    f"attention: {name} must be C-contiguous {self.dtype} {list(dims)}, "
                    f"given {x.dtype} {list(x.shape)}"
                )
        if h % hkv:
            raise InputError(f"attention: num_kv_heads={hkv} must divide num_heads={h}")
        if not (math.isfinite(softcap) and softcap >= 0):
            raise InputError(f"attention: softcap must be a finite number >= 0, given {softcap}")
        strides = (0, 0, 0, 0)
        if mask_type is MaskType.CUSTOM:
            if mask is None or mask.dtype != np.float32:
                raise InputError("attention: a custom mask must be an f32 array")
            try:
                full = np.broadcast_to(mask, (b, h, sq, skv))
            except ValueError as e:
                raise InputError(
                    f"attention: mask {list(mask.shape)} does not broadcast to "
                    f"[B,H,Sq,Skv]=[{b},{h},{sq},{skv}]"
                ) from e
            strides = tuple(s // 4 for s in full.strides)  # type: ignore[assignment]
        threads = max(1, int(num_threads))
        need = self.workspace_floats(d, threads)
        if workspace is None:
            workspace = np.empty(need, np.float32)
        elif workspace.dtype != np.float32 or workspace.size < need:
            raise InputError(f"attention: workspace must be f32 with >= {need} elements")
        args = (
            q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data, b, sq, skv, h, hkv,
            d, float(scale), float(softcap), MASK_CODES[mask_type], int(window),
            None if mask is None else mask.ctypes.data, *strides,
            workspace.ctypes.data, workspace.size, threads,
        )  # fmt: skip
        return _Prepared(self.lib.rlx_attention, args, (q, k, v, out, mask, workspace))


class _Prepared:
    """A bound ``rlx_attention`` call; holds the arrays whose addresses it passes."""

    __slots__ = ("fn", "args", "arrays")

    def __init__(self, fn: Callable[..., int], args: tuple, arrays: tuple) -> None:
        self.fn, self.args, self.arrays = fn, args, arrays

    def __call__(self) -> None:
        if self.fn(*self.args) != 0:
            raise InputError("attention: the workspace is smaller than the kernel needs")

    @property
    def native_call(self) -> tuple[Callable[..., int], tuple, bool]:
        """This call for the native schedule (``native/schedule.py``): non-zero fails."""
        return self.fn, self.args, True


def attention_lib(
    target: cpu.Target | None = None, dtype: np.dtype | type = np.float32
) -> AttentionLib:
    """Build (cached on disk by content) and load the attention library for ``target``
    (default: :func:`~rlx.backends.cpu.native.cpu.selected_target`) and element
    ``dtype`` (f32, bf16, f16). CompileError without gcc, when the build fails, for
    another dtype, or f16 on the portable target (no F16C)."""
    dt = np.dtype(dtype)
    if dtype_code(dt) is None:
        raise CompileError(f"native attention takes f32, bf16 or f16, not {dt}")
    return _attention_lib(cpu.selected_target() if target is None else target, dt)


@functools.cache
def _attention_lib(target: cpu.Target, dtype: np.dtype) -> AttentionLib:
    from rlx.backends.cpu import native

    code = dtype_code(dtype)
    if code == 2 and target not in F16_TARGETS:
        raise CompileError(f"native f16 attention needs F16C: not on the {target.value} target")
    source = attention_source(code)
    name = "attention" if code == 0 else f"attention_{dtype.name}"
    return AttentionLib(
        bindings.typed(native.load(native.build(source, target, name)), source), dtype
    )


class CacheCall:
    """A bound cache-attention entry of ``csrc/cache_attention.c`` (``rlx_cache_attention``,
    ``rlx_cache_attention_i8`` or ``rlx_slot_cache_attention``), a kernel of the native
    schedule. Calling it runs the C function; a non-zero return calls ``on_error(rc)``,
    which raises (1: bad positions / slots, nothing written; -1: the workspace)."""

    __slots__ = ("fn", "args", "keep", "on_error")

    def __init__(
        self, fn: Callable[..., int], args: tuple, keep: tuple, on_error: Callable[[int], None]
    ) -> None:
        self.fn, self.args, self.keep, self.on_error = fn, args, keep, on_error

    def __call__(self) -> None:
        rc = self.fn(*self.args)
        if rc:
            self.on_error(rc)

    @property
    def native_call(self) -> tuple[Callable[..., int], tuple, bool]:
        """This call for the native schedule (``native/schedule.py``): non-zero fails."""
        return self.fn, self.args, True
