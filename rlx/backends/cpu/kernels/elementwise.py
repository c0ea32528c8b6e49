"""CPU kernels for the elementwise ops (``rlx/ops/elementwise.py``): unary, binary, compare,
where, cast. Each is one ufunc call with ``out=`` into the arena; the composite
activations (gelu, erf, sigmoid, ...) are one generated C loop (the region codegen,
``engines.region``) with native kernels on, else a few calls through scratch buffers that
write ``out`` last, so they stay correct when the planner runs them in place. f16/bf16 go
through f32 (``lowp``). Casts between f32, bf16 and f16 run the native conversions of
``engines.lowp_lib``.

The dtype corners the float kernels decline have their own attempts, tried first:
complex unary functions, a ``where`` whose output took its condition's slot, integer
division (truncating toward zero) and integer powers. Complex ``floor`` / ``ceil`` /
``softplus`` have no definition (the reference's NumPy call raises TypeError when the
graph runs): the complex attempt makes that an UnsupportedOpError at compile time.
Complex gelu / gelu_tanh / silu / sigmoid / erf keep the reference kernel: their only
definition is the reference's NumPy expression applied to complex numbers (listed in
``tests/cpu/test_dispatch.py``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, lowp
from rlx.backends.cpu.engines.lowp_lib import (
    F32,
    LowpLib,
    cast_name,
    is_half_or_f32,
    lib_or_none,
)
from rlx.backends.cpu.engines.region import PARALLEL_MIN_WORK, bind, load_function, region_work
from rlx.dtype import DType, is_bf16
from rlx.errors import UnsupportedOpError
from rlx.ops.elementwise import (
    COMPARE_FNS,
    Binary,
    BinaryKind,
    Cast,
    Compare,
    Unary,
    UnaryKind,
    Where,
    f64_to_bf16,
    int_to_bf16,
)
from rlx.ops.unary_kinds import UNARY, Complex

if TYPE_CHECKING:
    from rlx.ir.mir import Node


@functools.cache
def _erf_loader() -> np.ufunc | None:
    """scipy's erf, a ufunc with an f32 loop and an out= argument (imported on first use:
    scipy.special costs ~0.2 s to import); None without scipy (the reference path)."""
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - scipy is a dependency
        return None
    return erf


__all__ = [
    "complex_unary_kernel",
    "unary_kernel",
    "int_div_kernel",
    "int_pow_kernel",
    "binary_kernel",
    "compare_kernel",
    "where_over_cond_kernel",
    "where_kernel",
    "cast_kernel",
]


# the kinds one NumPy ufunc computes (the ``ufunc`` of their rows)
_DIRECT_UNARY: dict[UnaryKind, np.ufunc] = {
    k: f.ufunc for k, f in UNARY.items() if f.ufunc is not None
}
_SQRT1_2 = np.float64(1.0 / np.sqrt(2.0))


def _sigmoid_into(x: np.ndarray, o: np.ndarray, ctx: KernelCtx, tag: int) -> Kernel:
    """Stable sigmoid as the reference computes it: e = exp(-|x|); x >= 0 ? 1/(1+e) : e/(1+e)."""
    e = ctx.scratch(x.shape, x.dtype, tag)
    d = ctx.scratch(x.shape, x.dtype, tag + 1)
    m = ctx.scratch(x.shape, np.bool_, tag + 2)
    one = x.dtype.type(1)

    def run() -> None:
        np.greater_equal(x, 0, out=m)
        np.absolute(x, out=e)
        np.negative(e, out=e)
        np.exp(e, out=e)
        np.add(e, one, out=d)
        np.divide(e, d, out=e)
        np.divide(one, d, out=d)
        np.copyto(o, e)
        np.copyto(o, d, where=m)

    return run


def _unary_composite(fn: UnaryKind, x: np.ndarray, o: np.ndarray, ctx: KernelCtx) -> Kernel | None:
    t = x.dtype.type
    if fn is UnaryKind.RSQRT:
        return lambda: (np.sqrt(x, out=o), np.divide(t(1), o, out=o))  # type: ignore[return-value]
    if fn is UnaryKind.RECIP:
        return lambda: np.divide(t(1), x, out=o)  # type: ignore[return-value]
    if fn is UnaryKind.SOFTPLUS:
        return lambda: np.logaddexp(t(0), x, out=o)  # type: ignore[return-value]
    if fn is UnaryKind.ERF:
        erf = _erf_loader()
        if erf is None:
            return None
        return lambda: erf(x, out=o)  # type: ignore[return-value]
    if fn is UnaryKind.SIGMOID:
        return _sigmoid_into(x, o, ctx, 10)
    if fn is UnaryKind.SILU:
        s = ctx.scratch(x.shape, x.dtype, 20)
        sig = _sigmoid_into(x, s, ctx, 10)
        return lambda: (sig(), np.multiply(x, s, out=o))  # type: ignore[return-value]
    if fn is UnaryKind.GELU:
        erf = _erf_loader()
        if erf is None:
            return None
        # 0.5 * x * (1 + erf(x / sqrt(2))), the erf argument in f64 as the reference has it
        w = ctx.scratch(x.shape, np.float64, 10)
        u = ctx.scratch(x.shape, x.dtype, 11)
        v = ctx.scratch(x.shape, x.dtype, 12)

        def gelu() -> None:
            np.multiply(x, _SQRT1_2, out=w)
            erf(w, out=w)
            np.copyto(u, w, casting="unsafe")
            np.add(u, t(1), out=u)
            np.multiply(x, t(0.5), out=v)
            np.multiply(v, u, out=o)

        return gelu
    if fn is UnaryKind.GELU_TANH:
        c = t(np.sqrt(2.0 / np.pi))
        k = t(0.044715)
        u = ctx.scratch(x.shape, x.dtype, 10)
        v = ctx.scratch(x.shape, x.dtype, 11)

        def gelu_tanh() -> None:
            np.multiply(x, k, out=u)
            np.multiply(u, x, out=u)
            np.multiply(u, x, out=u)
            np.add(x, u, out=u)
            np.multiply(u, c, out=u)
            np.tanh(u, out=u)
            np.add(u, t(1), out=u)
            np.multiply(x, t(0.5), out=v)
            np.multiply(v, u, out=o)

        return gelu_tanh
    return None


@lowp
def unary_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Unary ops as ufuncs with ``out=``; f32/f64 composites (gelu, gelu_tanh, erf,
    sigmoid, silu, softplus, ...) as one native C loop (``_native_unary``), else through
    scratch buffers (a composite without NumPy code here: the reference kernel)."""
    (x,) = ins
    fn: UnaryKind = node.op.fn  # type: ignore[attr-defined]
    if x.dtype.kind == "c":
        return None
    if fn is UnaryKind.RELU:
        zero = x.dtype.type(0)
        return lambda: np.maximum(x, zero, out=out)  # type: ignore[return-value]
    uf = _DIRECT_UNARY.get(fn)
    if uf is not None:
        return lambda: uf(x, out=out)  # type: ignore[return-value]
    if x.dtype.kind != "f":
        return None
    if fn in _NATIVE_UNARY and x.dtype in (np.float32, np.float64) and ctx.native:
        run = _native_unary(node, x, out, ctx)
        if run is not None:
            return run
    return _unary_composite(fn, x, out, ctx)


# Composite unaries (no single ufunc) run as one generated C loop (libmvec SIMD math,
# OpenMP on big tensors) instead of a chain of ufuncs through scratch buffers (gelu: 6
# passes, erf in f64 through SciPy), except relu, rsqrt and recip, which NumPy computes in
# one or two passes. exp/tanh/log stay one NumPy ufunc (already SIMD, one pass, and
# bit-equal to the reference interpreter).
_NUMPY_COMPOSITES = frozenset({UnaryKind.RELU, UnaryKind.RSQRT, UnaryKind.RECIP})
_NATIVE_UNARY = frozenset(k for k in UnaryKind if k not in _DIRECT_UNARY) - _NUMPY_COMPOSITES


def _native_unary(node: Node, x: np.ndarray, out: np.ndarray, ctx: KernelCtx) -> Kernel | None:
    """The unary op as a one-op elementwise region rendered to C (the region codegen) over
    ``x``'s dtype; None (NumPy kernel) when it cannot be rendered or built."""
    from rlx.backends.cpu.codegen.elementwise import CodegenUnsupported, render_region
    from rlx.errors import CompileError
    from rlx.ir.mir import Graph
    from rlx.ops.core import Input

    # f16 / bf16 / fp8 nodes arrive widened to f32 (``lowp``): the loop runs on those
    shape = node.shape.with_dtype(DType.from_numpy(x.dtype))
    body = Graph("unary")
    i = body.add_node(Input("in0", shape), [], shape)
    body.outputs = [body.add_node(node.op, [i], shape, node.loc)]
    try:
        fn, arrays = render_region(body, [x], out)
        cfn = load_function(fn)
    except (CodegenUnsupported, CompileError) as e:
        ctx.notes.append(f"NumPy unary kernel ({str(e).splitlines()[0]})")
        return None
    ctx.kind = KernelKind.NATIVE
    threads = ctx.num_threads if region_work(fn, out) >= PARALLEL_MIN_WORK else 1
    team = f", OpenMP x{threads}" if threads > 1 else ""
    ctx.notes.append(f"native: {node.op.fn.value} in one C loop{team}")  # type: ignore[attr-defined]
    return bind(cfn, arrays, threads)


_BINARY: dict[BinaryKind, np.ufunc] = {
    BinaryKind.ADD: np.add,
    BinaryKind.SUB: np.subtract,
    BinaryKind.MUL: np.multiply,
    BinaryKind.DIV: np.divide,
    BinaryKind.MAX: np.maximum,
    BinaryKind.MIN: np.minimum,
    BinaryKind.POW: np.power,
    BinaryKind.MOD: np.fmod,
    BinaryKind.AND: np.logical_and,
    BinaryKind.OR: np.logical_or,
}


@lowp
def binary_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Binary ops as one broadcasting ufunc call with ``out=``. Integer division (which
    truncates toward zero) and integer powers keep the reference kernel."""
    a, b = ins
    fn: BinaryKind = node.op.fn  # type: ignore[attr-defined]
    if a.dtype.kind in "iu" and fn in (BinaryKind.DIV, BinaryKind.POW):
        return None
    uf = _BINARY[fn]
    return lambda: uf(a, b, out=out)  # type: ignore[return-value]


@lowp
def compare_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Compares as one broadcasting ufunc call into the bool output."""
    a, b = ins
    uf = COMPARE_FNS[node.op.fn]  # type: ignore[attr-defined]
    return lambda: uf(a, b, out=out)  # type: ignore[call-arg, return-value]  # ufuncs take out=


def where_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``out = cond ? a : b`` as masked copies, ordered so an in-place output (sharing
    the bytes of ``a`` or ``b``) is never read after it was overwritten."""
    c, a, b = ins
    if np.may_share_memory(out, c):
        return None
    if np.may_share_memory(out, a):
        nc = ctx.scratch(c.shape, np.bool_, 1)

        def run_a() -> None:
            np.logical_not(c, out=nc)
            np.copyto(out, b, where=nc)

        return run_a
    if np.may_share_memory(out, b):
        return lambda: np.copyto(out, a, where=c)  # type: ignore[return-value]

    def run() -> None:
        np.copyto(out, b)
        np.copyto(out, a, where=c)

    return run


# ---- dtype corners: complex unaries, where over its condition, integer division / power


# what a complex input runs (the ``complex`` of each kind's row): the kind's ufunc, the
# code below (relu, rsqrt, recip), the reference (REFERENCE) or a compile error (UNDEFINED)
_COMPLEX_UNARY: dict[UnaryKind, np.ufunc] = {
    k: f.ufunc for k, f in UNARY.items() if f.complex is Complex.KERNEL and f.ufunc is not None
}
_UNDEFINED = frozenset(k for k, f in UNARY.items() if f.complex is Complex.UNDEFINED)


def complex_unary_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Complex inputs: one complex ufunc with ``out=`` (``rsqrt`` and ``recip`` as a
    divide, ``relu`` as ``maximum(x, 0)`` in NumPy's lexicographic complex order)."""
    (x,) = ins
    if x.dtype.kind != "c":
        return None
    fn: UnaryKind = node.op.fn  # type: ignore[attr-defined]
    if fn in _UNDEFINED:
        raise UnsupportedOpError(f"{fn.value} is not defined for the complex input {x.dtype}")
    one, zero = x.dtype.type(1), x.dtype.type(0)
    uf = _COMPLEX_UNARY.get(fn)
    if uf is not None:
        return lambda: uf(x, out=out)  # type: ignore[return-value]
    if fn is UnaryKind.RELU:
        return lambda: np.maximum(x, zero, out=out)  # type: ignore[return-value]
    if fn is UnaryKind.RECIP:
        return lambda: np.divide(one, x, out=out)  # type: ignore[return-value]
    if fn is UnaryKind.RSQRT:
        s = ctx.scratch(x.shape, x.dtype, 700)

        def rsqrt() -> None:
            np.sqrt(x, out=s)
            np.divide(one, s, out=out)

        return rsqrt
    return None  # Complex.REFERENCE (gelu, gelu_tanh, silu, sigmoid, erf): the reference


def where_over_cond_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``where`` whose output took its (1-byte) condition's slot: the masked copies go to
    a scratch that is copied into ``out`` last. Other nodes are ``where_kernel``'s."""
    c, a, b = ins
    if not np.may_share_memory(out, c):
        return None
    tmp = ctx.scratch(out.shape, out.dtype, 702)

    def run() -> None:
        np.copyto(tmp, b)
        np.copyto(tmp, a, where=c)
        np.copyto(out, tmp)

    return run


def int_div_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Integer division truncating toward zero (``x / 0 -> 0``), as the reference: floor
    division by a zero-free divisor, a step toward zero where the remainder is non-zero
    and the signs differ, zeros where the divisor is 0. All steps run in out-shaped
    scratch; ``out`` (which may be an input's slot) is written by the last call."""
    a, b = ins
    if node.op.fn is not BinaryKind.DIV or a.dtype.kind not in "iu":  # type: ignore[attr-defined]
        return None
    if b.dtype != a.dtype or out.dtype != a.dtype:
        return None
    dims, dt = out.shape, out.dtype
    zero = ctx.scratch(dims, np.bool_, 80)
    m1 = ctx.scratch(dims, np.bool_, 81)
    m2 = ctx.scratch(dims, np.bool_, 82)
    safe = ctx.scratch(dims, dt, 83)
    q = ctx.scratch(dims, dt, 84)
    r = ctx.scratch(dims, dt, 85)
    signed = dt.kind == "i"

    def run() -> None:
        with np.errstate(all="ignore"):
            np.equal(b, 0, out=zero)
            np.copyto(safe, b)
            np.copyto(safe, 1, where=zero)
            np.floor_divide(a, safe, out=q)
            if signed:
                np.multiply(q, safe, out=r)
                np.subtract(a, r, out=r)
                np.not_equal(r, 0, out=m1)
                np.less(a, 0, out=m2)
                np.not_equal(m2, np.less(safe, 0, out=zero), out=m2)
                np.logical_and(m1, m2, out=m1)
                np.add(q, m1, out=q, casting="unsafe")
                np.equal(b, 0, out=zero)
            np.copyto(q, 0, where=zero)
        np.copyto(out, q)

    return run


def int_pow_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Integer ``a ** b`` as the reference: ``np.power`` (wrapping, ``0 ** 0 == 1``) with
    negative exponents replaced by 0, then, where ``b < 0``, the truncated reciprocal: 1
    for ``a == 1``, ``-1 if b is odd else 1`` for ``a == -1``, 0 otherwise (also for
    ``a == 0``). Unsigned exponents are a plain ``np.power``. ``out`` (possibly an
    input's slot) is written by the last call."""
    a, b = ins
    if node.op.fn is not BinaryKind.POW or a.dtype.kind not in "iu":  # type: ignore[attr-defined]
        return None
    if b.dtype != a.dtype or out.dtype != a.dtype:
        return None
    dims, dt = out.shape, out.dtype
    q = ctx.scratch(dims, dt, 90)
    if dt.kind == "u":

        def run_unsigned() -> None:
            np.power(a, b, out=q)
            np.copyto(out, q)

        return run_unsigned
    neg = ctx.scratch(dims, np.bool_, 91)
    m = ctx.scratch(dims, np.bool_, 92)
    e = ctx.scratch(dims, dt, 93)
    r = ctx.scratch(dims, dt, 94)

    def run() -> None:
        with np.errstate(all="ignore"):
            np.less(b, 0, out=neg)
            if not neg.any():  # the common case: one power
                np.power(a, b, out=q)
                np.copyto(out, q)
                return
            np.copyto(e, b)
            np.copyto(e, 0, where=neg)
            np.power(a, e, out=q)
            r.fill(0)
            np.equal(a, 1, out=m)
            np.copyto(r, 1, where=m)
            np.equal(a, -1, out=m)
            np.copyto(r, 1, where=m)
            np.bitwise_and(b, 1, out=e)  # odd exponent (two's complement: -3 & 1 == 1)
            np.logical_and(m, e, out=m)
            np.copyto(r, -1, where=m)
            np.copyto(q, r, where=neg)
        np.copyto(out, q)

    return run


# ---- cast ----------------------------------------------------------------------------------


def _native_cast(x: np.ndarray, out: np.ndarray, ctx: KernelCtx, lib: LowpLib) -> Kernel | None:
    """A native conversion closure, or None when the pair has none."""
    pair = (x.dtype, out.dtype)
    if not (x.flags.c_contiguous and out.flags.c_contiguous) or x.size == 0:
        return None
    level, nt = int(lib.level()), ctx.num_threads
    n = x.size
    if cast_name(*pair) is not None and not (
        x.dtype.itemsize != out.dtype.itemsize and np.may_share_memory(x, out)
    ):
        fn = lib.cast_fn(*pair)
        ps, pd = x.ctypes.data, out.ctypes.data
        return lambda: fn(ps, pd, n, level, nt)  # type: ignore[misc]
    if is_half_or_f32(x.dtype) and is_half_or_f32(out.dtype):  # bf16 <-> f16, or aliased
        s = ctx.scratch(x.shape, F32, 310)
        up = lib.cast_fn(x.dtype, F32) if x.dtype != F32 else None
        down = lib.cast_fn(F32, out.dtype) if out.dtype != F32 else None
        ps, pm, pd = x.ctypes.data, s.ctypes.data, out.ctypes.data

        def run() -> None:
            if up is None:
                np.copyto(s, x)
            else:
                up(ps, pm, n, level, nt)
            if down is None:
                np.copyto(out, s)
            else:
                down(pm, pd, n, level, nt)

        return run
    return None


def cast_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """A converting copy: native between f32/bf16/f16; f64 and integers -> bf16 rounded
    once (``f64_to_bf16`` / ``int_to_bf16``, as the reference); otherwise NumPy, bf16/fp8
    sources or fp8 targets through f32 as the reference."""
    (x,) = ins
    if x.dtype.kind == "c" and out.dtype.kind != "c":
        x = x.real  # a view: complex -> real keeps the real part, without NumPy's warning
    if x.dtype != out.dtype and is_half_or_f32(x.dtype) and is_half_or_f32(out.dtype):
        lib = lib_or_none(ctx)
        if lib is not None:
            fn = _native_cast(x, out, ctx, lib)
            if fn is not None:
                ctx.kind = KernelKind.NATIVE
                return fn
    if x.dtype == np.float64 and is_bf16(out.dtype):  # rounded once (ml_dtypes: twice)
        return lambda: np.copyto(out, f64_to_bf16(x))  # type: ignore[return-value]
    if x.dtype.kind in "iu" and is_bf16(out.dtype):  # rounded once (ml_dtypes: twice)
        return lambda: np.copyto(out, int_to_bf16(x))  # type: ignore[return-value]
    via_f32 = x.dtype.name in (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
    ) or out.dtype.name.startswith("float8")
    if via_f32:
        wide = np.float64 if out.dtype == np.float64 else np.float32
        s = ctx.scratch(x.shape, wide, 1)

        def run() -> None:
            np.copyto(s, x, casting="unsafe")
            np.copyto(out, s, casting="unsafe")

        return run
    return lambda: np.copyto(out, x, casting="unsafe")  # type: ignore[return-value]


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Unary: (complex_unary_kernel, unary_kernel),
    Binary: (int_div_kernel, int_pow_kernel, binary_kernel),
    Compare: (compare_kernel,),
    Where: (where_over_cond_kernel, where_kernel),
    Cast: (cast_kernel,),
}
