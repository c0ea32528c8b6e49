"""CPU kernels for the elementwise ops: unary, binary, compare, where (Cast lives in
``kernels.lowp_lib``, native). Each is one ufunc call with ``out=`` into the arena; the
composite activations (gelu, erf, sigmoid, ...) are one generated C loop (the region
codegen) with native kernels on, else a few calls through scratch buffers that
write ``out`` last, so they stay correct when the planner runs them in place. f16/bf16 go
through f32 (``lowp``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelKind, kernel, lowp
from rlx.ops.elementwise import (
    COMPARE_FNS,
    Binary,
    BinaryKind,
    Compare,
    Unary,
    UnaryKind,
    Where,
)

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


__all__ = ["unary_kernel", "binary_kernel", "compare_kernel", "where_kernel"]


_DIRECT_UNARY: dict[UnaryKind, np.ufunc] = {
    UnaryKind.TANH: np.tanh,
    UnaryKind.EXP: np.exp,
    UnaryKind.LOG: np.log,
    UnaryKind.SQRT: np.sqrt,
    UnaryKind.NEG: np.negative,
    UnaryKind.ABS: np.absolute,
    UnaryKind.SIN: np.sin,
    UnaryKind.COS: np.cos,
    UnaryKind.ROUND: np.rint,
    UnaryKind.FLOOR: np.floor,
    UnaryKind.CEIL: np.ceil,
    UnaryKind.SQUARE: np.square,
    UnaryKind.SIGN: np.sign,
    UnaryKind.NOT: np.logical_not,
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


@kernel(Unary)
@lowp
def unary_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Unary ops as ufuncs with ``out=``; f32/f64 gelu, gelu_tanh, erf, sigmoid, silu and
    softplus as one native C loop (``_native_unary``), else through scratch buffers."""
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


# Composite transcendental unaries: one generated C loop (libmvec SIMD math, OpenMP on big
# tensors) instead of a chain of ufuncs through scratch buffers (gelu: 6 passes, erf in
# f64 through SciPy). exp/tanh/log stay one NumPy ufunc (already SIMD, one pass, and
# bit-equal to the reference interpreter).
_NATIVE_UNARY = frozenset(
    {
        UnaryKind.GELU,
        UnaryKind.GELU_TANH,
        UnaryKind.ERF,
        UnaryKind.SIGMOID,
        UnaryKind.SILU,
        UnaryKind.SOFTPLUS,
    }
)


def _native_unary(node: Node, x: np.ndarray, out: np.ndarray, ctx: KernelCtx) -> Kernel | None:
    """The unary op as a one-op elementwise region rendered to C (the region codegen);
    None (NumPy kernel) when it cannot be rendered or built."""
    from rlx.backends.cpu.codegen.elementwise import CodegenUnsupported, render_region
    from rlx.backends.cpu.kernels.region import (
        PARALLEL_MIN_WORK,
        bind,
        load_function,
        region_work,
    )
    from rlx.errors import CompileError
    from rlx.ir.mir import Graph
    from rlx.ops.core import Input

    body = Graph("unary")
    i = body.add_node(Input("in0", node.shape), [], node.shape)
    body.outputs = [body.add_node(node.op, [i], node.shape, node.loc)]
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


@kernel(Binary)
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


@kernel(Compare)
@lowp
def compare_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Compares as one broadcasting ufunc call into the bool output."""
    a, b = ins
    uf = COMPARE_FNS[node.op.fn]  # type: ignore[attr-defined]
    return lambda: uf(a, b, out=out)  # type: ignore[call-arg, return-value]  # ufuncs take out=


@kernel(Where)
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
