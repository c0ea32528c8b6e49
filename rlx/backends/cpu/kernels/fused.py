"""CPU kernels for the fused ops: matmul + bias + activation, SwiGLU, residual + norm,
and elementwise regions.

The matmul-based fused ops compute in f32 for f16/bf16 nodes (``staged``); their
references round each intermediate (the product, the biased product, the gate...) to the
node's dtype, so the kernels round the same intermediates through that dtype (only the
f32 summation order of the products may differ from the reference's). An elementwise
region compiles its body into a sub-schedule of elementwise kernels over scratch buffers
(allocated once) and writes its one output into the arena.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx.backends.cpu.kernels import (
    F32,
    KERNELS,
    Kernel,
    KernelCtx,
    KernelKind,
    is_lowp,
    kernel,
    reference_kernel,
)
from rlx.backends.cpu.kernels.linalg import matmul_into
from rlx.backends.cpu.kernels.tensor import norm_into
from rlx.ir.mir import Node
from rlx.ops.core import Constant, Input
from rlx.ops.elementwise import Unary, UnaryKind
from rlx.ops.fused import (
    ElementwiseRegion,
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    FusedSwiGLU,
)

__all__ = ["activation_in_place", "staged"]

Rounder = Callable[[np.ndarray], Kernel | None]
StagedFactory = Callable[[Node, list[np.ndarray], np.ndarray, KernelCtx, Rounder], Kernel | None]


def _no_rounding(t: np.ndarray) -> Kernel | None:
    return None


def staged(
    factory: StagedFactory,
) -> Callable[[Node, list[np.ndarray], np.ndarray, KernelCtx], Kernel | None]:
    """f32/f64 nodes run ``factory`` as is; f16/bf16 nodes (every input of the node's
    dtype) run it on f32 copies of the inputs into an f32 output rounded once into
    ``out``, and ``factory``'s ``rnd(t)`` returns a step rounding the f32 buffer ``t``
    through the node's dtype (None for f32/f64), for the intermediates the reference
    rounds."""

    def wrapped(
        node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
    ) -> Kernel | None:
        dt = out.dtype
        if dt in (np.float32, np.float64) and all(x.dtype == dt for x in ins):
            return factory(node, ins, out, ctx, _no_rounding)
        if not is_lowp(dt) or any(x.dtype != dt for x in ins):
            return None
        wide = [ctx.scratch(x.shape, F32, 100 + i) for i, x in enumerate(ins)]
        wide_out = ctx.scratch(out.shape, F32, 99)

        def rnd(t: np.ndarray) -> Kernel:
            narrow = ctx.scratch(t.shape, dt, 98)

            def round_trip() -> None:
                np.copyto(narrow, t, casting="unsafe")
                np.copyto(t, narrow)

            return round_trip

        inner = factory(node, wide, wide_out, ctx, rnd)
        if inner is None:
            return None
        pairs = list(zip(wide, ins, strict=True))

        def run() -> None:
            for w, x in pairs:
                np.copyto(w, x, casting="unsafe")
            inner()
            np.copyto(out, wide_out, casting="unsafe")

        return run

    wrapped.__name__ = factory.__name__
    wrapped.__doc__ = factory.__doc__
    return wrapped


def _steps(*fns: Kernel | None) -> list[Kernel]:
    return [f for f in fns if f is not None]


def activation_in_place(act: UnaryKind, y: np.ndarray, ctx: KernelCtx) -> Kernel:
    """``y = act(y)`` with the unary kernel (its composites are safe in place), or the
    reference through a scratch copy when it has no fast path."""
    fake = Node(-1, Unary(act), (), ctx.node.shape)
    fn = KERNELS[Unary](fake, [y], y, ctx)
    if fn is not None:
        return fn
    tmp = ctx.scratch(y.shape, y.dtype, 60)
    ref = Unary(act)
    rctx = ctx.ref_ctx(y)

    def via_reference() -> None:
        np.copyto(tmp, y)
        np.copyto(y, ref.reference([tmp], rctx), casting="unsafe")

    return via_reference


@kernel(FusedMatMulBiasAct, KernelKind.BLAS)
@staged
def fused_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx, rnd: Rounder
) -> Kernel | None:
    """``matmul(out=)``, bias added in place, activation in place."""
    x, w = ins[:2]
    bias = ins[2] if len(ins) == 3 else None
    act = node.op.act  # type: ignore[attr-defined]
    steps = [matmul_into(x, w, out)]
    if bias is not None:
        steps += _steps(rnd(out), lambda: np.add(out, bias, out=out))  # type: ignore[arg-type]
    if act is not None:
        steps += _steps(rnd(out), activation_in_place(act, out, ctx))

    def run() -> None:
        for f in steps:
            f()

    return run


@kernel(FusedSwiGLU, KernelKind.BLAS)
@staged
def fused_swiglu_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx, rnd: Rounder
) -> Kernel | None:
    """gate = silu(x @ w_gate) in scratch, out = x @ w_up, out *= gate."""
    x, wg, wu = ins
    gate = ctx.scratch(out.shape, out.dtype, 61)
    steps = _steps(
        matmul_into(x, wg, gate),
        rnd(gate),
        activation_in_place(UnaryKind.SILU, gate, ctx),
        rnd(gate),
        matmul_into(x, wu, out),
        rnd(out),
        lambda: np.multiply(gate, out, out=out),  # type: ignore[arg-type, return-value]
    )

    def run() -> None:
        for f in steps:
            f()

    return run


def _residual_norm(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx, rnd: Rounder, center: bool
) -> Kernel | None:
    x, res, gamma = ins[:3]
    beta = ins[3] if len(ins) == 4 else None
    h = ctx.scratch(out.shape, out.dtype, 62)
    steps = _steps(
        lambda: np.add(x, res, out=h),  # type: ignore[arg-type, return-value]
        rnd(h),
        norm_into(h, gamma, beta, out, node.op.eps, ctx, center=center),  # type: ignore[attr-defined]
    )

    def run() -> None:
        for f in steps:
            f()

    return run


@kernel(FusedResidualRmsNorm)
@staged
def fused_residual_rms_norm_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx, rnd: Rounder
) -> Kernel | None:
    """``h = x + residual`` into scratch, then the RMS norm kernel."""
    return _residual_norm(node, ins, out, ctx, rnd, center=False)


@kernel(FusedResidualLN)
@staged
def fused_residual_ln_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx, rnd: Rounder
) -> Kernel | None:
    """``h = x + residual`` into scratch, then the layer norm kernel."""
    return _residual_norm(node, ins, out, ctx, rnd, center=True)


@kernel(ElementwiseRegion)
def region_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The body's elementwise kernels in order over scratch buffers; the body output's
    kernel writes ``out`` directly."""
    body = node.op.body  # type: ignore[attr-defined]
    if len(body.outputs) != 1:
        return None
    result = body.outputs[0]
    vals: dict[int, np.ndarray] = {}
    steps: list[Kernel] = []
    for bn in body.nodes:
        if isinstance(bn.op, Input):
            vals[bn.id] = ins[int(bn.op.name[2:])]
            continue
        if isinstance(bn.op, Constant):
            vals[bn.id] = np.array(bn.op.value.array())
            continue
        dims = bn.shape.concrete(ctx.bindings)
        dst = out if bn.id == result else ctx.scratch(dims, bn.dtype.np, 1000 + bn.id)
        sub_ins = [vals[i] for i in bn.inputs]
        sub_ctx = KernelCtx(
            bn,
            body,
            ctx.bindings,
            ctx.params,
            ctx.inputs,
            ctx.pool,
            num_threads=ctx.num_threads,
            native=ctx.native,
        )
        factory = KERNELS.get(type(bn.op))
        fn = factory(bn, sub_ins, dst, sub_ctx) if factory is not None else None
        if fn is None:
            fn = reference_kernel(bn, sub_ins, dst, sub_ctx)
        vals[bn.id] = dst
        steps.append(fn)
    if result not in {bn.id for bn in body.nodes if not isinstance(bn.op, (Input, Constant))}:
        src = vals[result]
        return lambda: np.copyto(out, src, casting="unsafe")  # type: ignore[return-value]

    def run() -> None:
        for f in steps:
            f()

    return run
