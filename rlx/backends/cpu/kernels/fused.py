"""CPU kernels for the fused ops (``rlx/ops/fused.py``): matmul + bias + activation,
SwiGLU, residual + norm, and elementwise regions. Each op tries its native kernel first
(``engines.rows``: the row kernels and matmul epilogues; ``engines.region``: one generated
C loop per region), then the NumPy one below.

The matmul-based fused ops compute in f32 for f16/bf16 nodes (``staged``); their
references round each intermediate (the product, the biased product, the gate...) to the
node's dtype, so the kernels round the same intermediates through that dtype (only the
f32 summation order of the products may differ from the reference's). An elementwise
region compiles its body into a sub-schedule of elementwise kernels over scratch buffers
(allocated once) and writes its one output into the arena.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlx.backends.cpu.codegen.elementwise import CodegenUnsupported, render_region
from rlx.backends.cpu.codegen.rows import RowKind, RowSpec
from rlx.backends.cpu.dispatch import (
    F32,
    KERNELS,
    Kernel,
    KernelCtx,
    KernelKind,
    is_lowp,
    kind,
    reference_kernel,
)
from rlx.backends.cpu.engines.blas import matmul_into
from rlx.backends.cpu.engines.lowp_gemm import lowp_fused_matmul
from rlx.backends.cpu.engines.lowp_lib import is_half
from rlx.backends.cpu.engines.region import PARALLEL_MIN_WORK, bind, load_function, region_work
from rlx.backends.cpu.engines.rows import (
    Decline,
    column,
    ctype_of,
    native_or_none,
    norm_factory,
    row_kernel,
)
from rlx.backends.cpu.engines.sgemm import EPILOGUE_ACTS, weight_matmul
from rlx.backends.cpu.kernels.elementwise import unary_kernel
from rlx.backends.cpu.kernels.norm import norm_into
from rlx.errors import CompileError
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
    """``y = act(y)`` (``y`` real) with the unary kernel (its composites are safe in
    place), or the reference through a scratch copy when it has no fast path."""
    fake = Node(-1, Unary(act), (), ctx.node.shape)
    kind = ctx.kind
    fn = unary_kernel(fake, [y], y, ctx)
    ctx.kind = kind  # the fused node's kind (its matmul's), not its activation's
    if fn is not None:
        return fn
    tmp = ctx.scratch(y.shape, y.dtype, 60)
    ref = Unary(act)
    rctx = ctx.ref_ctx(y)

    def via_reference() -> None:
        np.copyto(tmp, y)
        np.copyto(y, ref.reference([tmp], rctx), casting="unsafe")

    return via_reference


@kind(KernelKind.BLAS)
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


@kind(KernelKind.BLAS)
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


@staged
def fused_residual_rms_norm_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx, rnd: Rounder
) -> Kernel | None:
    """``h = x + residual`` into scratch, then the RMS norm kernel."""
    return _residual_norm(node, ins, out, ctx, rnd, center=False)


@staged
def fused_residual_ln_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx, rnd: Rounder
) -> Kernel | None:
    """``h = x + residual`` into scratch, then the layer norm kernel."""
    return _residual_norm(node, ins, out, ctx, rnd, center=True)


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
            batch_invariant=ctx.batch_invariant,
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


# ---- native attempts -----------------------------------------------------------------------


@kind(KernelKind.NATIVE)
def native_fused_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """f32: rlx's packed sgemm with the bias and activation applied in its output tiles
    (``engines.sgemm``; an activation the tile epilogue lacks runs as one native pass
    after it) when it beat BLAS on the shape class; else the BLAS matmul into ``out``,
    then one native pass ``out = act(out + bias)`` (f32/f64); bf16/f16 through
    ``engines.lowp_gemm.lowp_fused_matmul``; None (noted) otherwise."""
    x, w = ins[:2]
    bias = ins[2] if len(ins) == 3 else None
    act = node.op.act  # type: ignore[attr-defined]

    def build() -> Kernel:
        if is_half(out.dtype):
            fn = lowp_fused_matmul(node, ins, out, ctx)
            if fn is None:
                raise Decline(f"the {out.dtype} matmul has no native low-precision path here")
            ctx.notes.append("native low-precision GEMM and epilogue (engines.lowp_gemm)")
            return fn
        if out.dtype not in (np.float32, np.float64):
            raise Decline(f"dtype {out.dtype} has no native epilogue")
        t = ctype_of(out, ins)
        plain = bias is None and act is None
        if plain and not (ctx.batch_invariant and out.dtype == np.float32):
            raise Decline("no bias and no activation: the plain BLAS matmul")
        if out.size == 0 or not out.flags.c_contiguous:
            raise Decline(f"output {out.shape} is empty or not C-contiguous")
        n = out.shape[-1]
        cols = [] if bias is None else [column(bias, n, f"bias of %{node.id}")]
        fn = _sgemm_fused(node, x, w, cols, act, out, t, ctx)
        if fn is not None:
            return fn
        if plain:
            raise Decline("no bias and no activation: the plain BLAS matmul")
        mm = matmul_into(x, w, out)
        epi = row_kernel(
            RowSpec(RowKind.BIAS_ACT, t, beta=bias is not None, act=act), [out], cols, 0.0, ctx
        )
        ctx.notes.append("BLAS matmul, then the native bias/activation pass")

        def run() -> None:
            mm()
            epi()

        return run

    return native_or_none(build, ctx)


def _sgemm_fused(
    node: Node,
    x: np.ndarray,
    w: np.ndarray,
    cols: list[np.ndarray],
    act: UnaryKind | None,
    out: np.ndarray,
    t: Any,
    ctx: KernelCtx,
) -> Kernel | None:
    """The f32 product on rlx's sgemm with the bias (and the activation when the tile
    epilogue has it) fused, or None for the BLAS path."""
    if out.dtype != np.float32:
        return None
    bias = cols[0] if cols else None
    in_tile = act is None or act.value in EPILOGUE_ACTS
    fn = weight_matmul(node, x, w, out, ctx, bias=bias, act=act.value if in_tile and act else None)
    if fn is None or in_tile:
        return fn
    epi = row_kernel(RowSpec(RowKind.BIAS_ACT, t, beta=False, act=act), [out], [], 0.0, ctx)
    ctx.notes.append(f"then the native {act.value} pass")  # type: ignore[union-attr]

    def run() -> None:
        fn()
        epi()

    return run


@kind(KernelKind.NATIVE)
def native_swiglu_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """BLAS ``gate = x @ w_gate`` into scratch and ``out = x @ w_up``, then one native
    pass ``out = silu(gate) * out`` (f32/f64); None (noted) otherwise."""

    def build() -> Kernel:
        if out.dtype not in (np.float32, np.float64):
            raise Decline(f"dtype {out.dtype} has no native SwiGLU epilogue")
        t = ctype_of(out, ins)
        if out.size == 0 or not out.flags.c_contiguous:
            raise Decline(f"output {out.shape} is empty or not C-contiguous")
        x, wg, wu = ins
        gate = ctx.scratch(out.shape, out.dtype, 63)
        mm_gate, mm_up = matmul_into(x, wg, gate), matmul_into(x, wu, out)
        spec = RowSpec(RowKind.GATE_MUL, t, act=UnaryKind.SILU)
        epi = row_kernel(spec, [gate, out], [], 0.0, ctx)
        ctx.notes.append("BLAS matmuls, then the native silu(gate) * up pass")

        def run() -> None:
            mm_gate()
            mm_up()
            epi()

        return run

    return native_or_none(build, ctx)


native_residual_ln_kernel = kind(KernelKind.NATIVE)(norm_factory(RowKind.LAYER_NORM, True))


native_residual_rms_norm_kernel = kind(KernelKind.NATIVE)(norm_factory(RowKind.RMS_NORM, True))


@kind(KernelKind.NATIVE)
def native_region_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The whole region as one generated C loop; None (noted: the NumPy region kernel
    runs) when it cannot."""
    body = node.op.body  # type: ignore[attr-defined]
    if not ctx.native:
        return _declined(ctx, "native kernels disabled (CompileOptions.native)")
    try:
        fn, arrays = render_region(body, ins, out)
        cfn = load_function(fn)
    except CodegenUnsupported as e:
        return _declined(ctx, f"no C rendering: {e}")
    except CompileError as e:
        return _declined(ctx, f"native build failed: {e.bare_message}")
    ctx.kind = KernelKind.NATIVE
    threads = ctx.num_threads if region_work(fn, out) >= PARALLEL_MIN_WORK else 1
    team = f", OpenMP x{threads}" if threads > 1 else ""
    ctx.notes.append(f"native: {fn.ops} ops in one C loop{team}")
    return bind(cfn, arrays, threads)


def _declined(ctx: KernelCtx, why: str) -> None:
    ctx.notes.append(f"NumPy region kernel ({why.splitlines()[0]})")


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    FusedMatMulBiasAct: (native_fused_matmul_kernel, fused_matmul_kernel),
    FusedSwiGLU: (native_swiglu_kernel, fused_swiglu_kernel),
    FusedResidualLN: (native_residual_ln_kernel, fused_residual_ln_kernel),
    FusedResidualRmsNorm: (native_residual_rms_norm_kernel, fused_residual_rms_norm_kernel),
    ElementwiseRegion: (native_region_kernel, region_kernel),
}
