"""Compiled CPU kernels vs the reference interpreter, for every registered op.

Each case builds a small graph; it is compiled with the cleanup and fusion passes off (so
the op under test reaches the executor as written) and run on random inputs.

Tolerances (compiled vs reference, both computed from the same inputs):

* f64: rtol 1e-12, atol 1e-12
* f32: rtol 1e-5, atol 1e-6; products and reductions over many terms (BLAS order):
  rtol 1e-4, atol 1e-5
* f16: rtol 2e-3, atol 2e-3 (one f16 ulp: both sides round once from f32)
* bf16: rtol 1e-2, atol 1e-2 (one bf16 ulp)
* integers, bool, fp8: exact
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.kernels import KernelKind
from rlx.backends.cpu.threads import resolve_threads
from rlx.formats.schemes import GgufQ8_0
from rlx.ops import OPS
from rlx.ops.elementwise import BinaryKind, CompareKind, UnaryKind
from rlx.ops.nn import MaskKind
from rlx.ops.reduce import ReduceKind
from rlx.options import CompileOptions
from rlx.runtime.session import Session

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)
TOL = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1e-2, 1e-2),
    "complex64": (1e-5, 1e-5),
}
LOOSE_F32 = (1e-4, 1e-5)


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[rlx.Graph], object]
    loose: bool = False  # many-term sums (matmul, conv, fft): BLAS summation order


def feed_for(g: rlx.Graph, seed: int = 0, params: bool = False) -> dict[str, np.ndarray]:
    """Random values for every input (or param): floats ~ N(0,1), ints in [0, 4), bools
    50/50."""
    rng = np.random.default_rng(seed + params)
    out = {}
    for n in g.param_nodes() if params else g.input_nodes():
        dims = n.shape.concrete()
        dt = n.dtype.np
        if n.dtype.is_bool:
            out[n.op.name] = rng.random(dims) < 0.5
        elif n.dtype.is_int:
            out[n.op.name] = rng.integers(0, 4, dims).astype(dt)
        elif n.dtype.is_complex:
            out[n.op.name] = (rng.standard_normal(dims) + 1j * rng.standard_normal(dims)).astype(dt)
        else:
            out[n.op.name] = rng.standard_normal(dims).astype(np.float32).astype(dt)
    return out


def assert_close(got: np.ndarray, want: np.ndarray, loose: bool, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    )
    name = got.dtype.name
    if name not in TOL:
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=what)
        return
    rtol, atol = LOOSE_F32 if loose and name == "float32" else TOL[name]
    np.testing.assert_allclose(
        got.astype(np.complex128 if got.dtype.kind == "c" else np.float64),
        want.astype(np.complex128 if want.dtype.kind == "c" else np.float64),
        rtol=rtol,
        atol=atol,
        err_msg=what,
    )


def positive(g: rlx.Graph, x: int) -> int:
    return g.add(g.abs(x), 0.5)


# ---- the case table --------------------------------------------------------------------


def _unary(kind: UnaryKind, dtype: str = "f32") -> Case:
    def build(g: rlx.Graph) -> object:
        if kind is UnaryKind.NOT:
            return g.logical_not(g.input("x", (3, 5), "bool"))
        x = g.input("x", (3, 5), dtype)
        if kind in (UnaryKind.LOG, UnaryKind.SQRT, UnaryKind.RSQRT, UnaryKind.RECIP):
            x = positive(g, x)
        return g.unary(kind, x)

    return Case(f"unary_{kind.value}_{dtype}", build)


def _binary(kind: BinaryKind, dtype: str = "f32", bshape: tuple[int, ...] = (5,)) -> Case:
    def build(g: rlx.Graph) -> object:
        if kind in (BinaryKind.AND, BinaryKind.OR):
            return g.binary(kind, g.input("a", (3, 5), "bool"), g.input("b", bshape, "bool"))
        a = g.input("a", (3, 5), dtype)
        b = g.input("b", bshape, dtype)
        if kind in (BinaryKind.DIV, BinaryKind.MOD, BinaryKind.POW) and dtype.startswith("f"):
            b = positive(g, b)
        if kind is BinaryKind.POW:
            a = positive(g, a)
        if kind in (BinaryKind.DIV, BinaryKind.MOD) and dtype.startswith("i"):
            b = g.add(b, g.constant(np.ones((), rlx.DType.parse(dtype).np)))
        return g.binary(kind, a, b)

    return Case(f"binary_{kind.value}_{dtype}_{'x'.join(map(str, bshape))}", build)


def _compare(kind: CompareKind) -> Case:
    def build(g: rlx.Graph) -> object:
        a = g.input("a", (3, 5), "i32")
        return getattr(g, kind.value)(a, g.input("b", (5,), "i32"))

    return Case(f"compare_{kind.value}", build)


def _cast(src: str, dst: str) -> Case:
    return Case(
        f"cast_{src}_{dst}",
        lambda g: g.cast(
            g.mul(g.input("x", (4, 6), src), 3.0)
            if src.startswith("f")
            else g.input("x", (4, 6), src),
            dst,
        ),
    )


def _reduce(
    kind: ReduceKind, axes: tuple[int, ...] | None, keepdims: bool, dtype: str = "f32"
) -> Case:
    def build(g: rlx.Graph) -> object:
        x = g.input("x", (3, 4, 5), dtype)
        return g.reduce(kind, x, axes, keepdims)

    return Case(f"reduce_{kind.value}_{axes}_{keepdims}_{dtype}", build)


def _attention(
    mask: MaskKind, kv_heads: int | None = None, dtype: str = "f32", custom: bool = False
) -> Case:
    def build(g: rlx.Graph) -> object:
        h, d = 4, 8
        hkv = kv_heads or h
        q = g.input("q", (2, 3, h * d), dtype)
        k = g.input("k", (2, 5, hkv * d), dtype)
        v = g.input("v", (2, 5, hkv * d), dtype)
        m = g.input("m", (1, 1, 3, 5), dtype) if custom else None
        return g.attention(q, k, v, h, d, mask=mask, mask_input=m, num_kv_heads=kv_heads)

    return Case(f"attention_{mask}_{kv_heads}_{dtype}_{custom}", build, loose=True)


def _region(g: rlx.Graph) -> object:
    a = g.input("a", (3, 5))
    b = g.input("b", (3, 5))

    def body(s: rlx.Graph, x: int, y: int) -> int:
        t = s.mul(x, y)
        return s.add(s.gelu(t), s.tanh(s.sub(t, x)))

    return g.elementwise_region([a, b], body)


def _custom(g: rlx.Graph) -> object:
    from rlx.ops.custom import register_custom_op

    register_custom_op(
        "parity_scale",
        lambda ins, attrs: ins[0],
        lambda xs, attrs, ctx: xs[0] * attrs["k"],
        arity=1,
        replace=True,
    )
    return g.custom("parity_scale", [g.input("x", (3, 4))], k=2.5)


def _gdn(g: rlx.Graph) -> object:
    b, t, h, dk, dv = 1, 3, 2, 4, 5
    ids = [
        g.input(n, s) for n, s in (("q", (b, t, h, dk)), ("k", (b, t, h, dk)), ("v", (b, t, h, dv)))
    ]
    gate = g.neg(g.abs(g.input("g", (b, t, h))))
    beta = g.sigmoid(g.input("beta", (b, t, h)))
    return g.gated_delta_net(*ids, gate, beta, state_size=dk)


def _dequant_matmul(g: rlx.Graph) -> object:
    from rlx.ops.quant import Int8Block

    rng = np.random.default_rng(1)
    x = g.input("x", (2, 64))
    wq = g.constant(rng.integers(-127, 128, (5, 64)).astype(np.int8))
    scale = g.constant(rng.random((5, 2)).astype(np.float32) * 0.01)
    zp = g.constant(np.zeros((5, 2), np.int32))
    return g.dequant_matmul(x, Int8Block(32), wq, scale, zp)


def _qmatmul(g: rlx.Graph) -> object:
    xq = g.cast(g.input("x", (3, 16), "i32"), "i8")
    wq = g.constant(np.random.default_rng(2).integers(-127, 128, (16, 4)).astype(np.int8))
    return g.qmatmul(xq, wq, 0.05, 0.02)


def _dynamic_qmatmul(g: rlx.Graph, mode: str) -> object:
    x, b, r = g.input("x", (3, 16)), g.input("b", (4,)), g.input("r", (3, 4))
    wq = g.constant(np.random.default_rng(2).integers(-128, 128, (16, 4)).astype(np.int8))
    return g.dynamic_qmatmul(x, wq, 0.02, bias=b, act=UnaryKind.GELU, residual=r, mode=mode)


def _while(g: rlx.Graph) -> object:
    x = g.input("x", (3,))

    def cond(s: rlx.Graph, c: int, i: int) -> int:
        return s.lt(i, s.constant(np.int32(4)))

    def body(s: rlx.Graph, c: int, i: int) -> list[int]:
        return [s.add(s.mul(c, 0.5), 1.0), s.add(i, s.constant(np.int32(1)))]

    return g.while_loop(cond, body, [x, g.constant(np.int32(0))], max_iterations=10)


def _seed_cases() -> list[Case]:
    """The seed's ops of ``tests/ops/test_seed_ops.py`` (kernels in kernels/seed.py)."""

    def scan(g: rlx.Graph) -> object:
        x, dt, z = (g.input(n, (2, 4, 3)) for n in ("x", "dt", "z"))
        a = g.neg(g.abs(g.input("a", (3, 5))))
        b, c = g.input("b", (2, 4, 5)), g.input("c", (2, 4, 5))
        d, bias = g.input("d", (3,)), g.input("bias", (3,))
        return g.selective_scan(x, dt, a, b, c, d=d, z=z, delta_bias=bias, delta_softplus=True)

    def solve(g: rlx.Graph, batch: tuple[int, ...], rhs: tuple[int, ...]) -> object:
        a = g.add(g.input("a", (*batch, 4, 4)), g.constant(np.eye(4, dtype=np.float32) * 6))
        return g.dense_solve(a, g.input("b", (*batch, 4, *rhs)))

    def qconv(g: rlx.Graph) -> object:
        xq = g.cast(g.input("x", (2, 4, 5, 5), "i32"), "i8")
        wq = g.constant(np.random.default_rng(3).integers(-127, 128, (4, 2, 3, 3)).astype(np.int8))
        return g.qconv2d(
            xq,
            wq,
            0.05,
            (0.01, 0.02, 0.03, 0.04),
            1,
            g.input("b", (4,)),
            stride=2,
            padding=1,
            groups=2,
        )

    def conv_nchwc(g: rlx.Graph) -> object:
        from rlx.ops.layout import ConvNchwc, FromNchwc, Nchwc, ToNchwc
        from rlx.ops.nn import Conv, ConvAct

        lay = Nchwc(4)
        conv = Conv((2, 1), ((1, 1), (0, 1)), (1, 1), 1, True, ConvAct.RELU)
        xb = g.apply(ToNchwc(lay), [g.input("x", (2, 5, 6, 5))])
        w, b = g.input("w", (6, 5, 3, 3)), g.input("b", (6,))
        return g.apply(FromNchwc(lay, 6), [g.apply(ConvNchwc(conv, lay, 5), [xb, w, b])])

    def custom_fn(g: rlx.Graph) -> object:
        return g.custom_fn(
            [g.input("x", (3, 4)), g.input("y", (4,))], lambda s, a, b: s.mul(s.tanh(a), b)
        )

    return [
        Case("selective_scan", scan, loose=True),
        Case("dense_solve", lambda g: solve(g, (), (2,)), loose=True),
        Case("batched_dense_solve", lambda g: solve(g, (3,), ()), loose=True),
        Case(
            "grouped_matmul",
            lambda g: g.grouped_matmul(
                g.input("x", (6, 5)), g.input("w", (4, 5, 3)), g.input("i", (6,), "i32")
            ),
            loose=True,
        ),
        Case(
            "lora_matmul_bf16",
            lambda g: g.lora_matmul(
                *(
                    g.input(n, s, "bf16")
                    for n, s in (("x", (2, 3, 6)), ("w", (6, 5)), ("a", (6, 2)), ("b", (2, 5)))
                ),
                scale=0.5,
            ),
        ),
        Case("qconv2d", qconv),
        Case("conv_nchwc", conv_nchwc, loose=True),
        Case(
            "sample",
            lambda g: g.sample(g.input("x", (4, 9)), 0.8, 3, 0.9, 17, g.input("o", (), "i64")),
        ),
        Case("custom_fn", custom_fn),
    ]


SEED_CASES = _seed_cases()


def _import_op_cases() -> list[Case]:
    """Ops the ONNX importer added (rlx/ops/indexing.py, bitwise.py, trig.py, cumulative.py,
    bitcast.py; kernels in kernels/indexing.py and kernels/bitmath.py)."""
    from rlx.ops import indexing as ix
    from rlx.ops.bitcast import Bitcast
    from rlx.ops.bitwise import Bitwise, BitwiseKind, BitwiseNot
    from rlx.ops.cumulative import CumProd
    from rlx.ops.trig import Trig, TrigKind

    def c(v: list) -> object:
        return lambda g: g.constant(np.array(v, np.int64))

    return [
        Case(
            "gather_elements",
            lambda g: g.apply(
                ix.GatherElements(1),
                [g.input("x", (3, 5)), c([[0, 4, -1], [2, 2, 1], [1, 0, 3]])(g)],
            ),
        ),
        Case(
            "scatter_elements_add",
            lambda g: g.apply(
                ix.ScatterElements(1, ix.ScatterReduction.ADD),
                [g.input("x", (3, 5)), c([[0, 4], [1, 1], [3, 2]])(g), g.input("u", (3, 2))],
            ),
        ),
        Case(
            "gather_nd",
            lambda g: g.apply(ix.GatherNd(), [g.input("x", (3, 4, 2)), c([[0, 1], [2, 3]])(g)]),
        ),
        Case(
            "scatter_nd",
            lambda g: g.apply(
                ix.ScatterNd(), [g.input("x", (4, 3)), c([[1], [3]])(g), g.input("u", (2, 3))]
            ),
        ),
        Case(
            "bitwise_xor_shl",
            lambda g: g.apply(
                Bitwise(BitwiseKind.SHL),
                [
                    g.apply(
                        Bitwise(BitwiseKind.XOR),
                        [g.input("a", (3, 4), "i32"), g.input("b", (3, 4), "i32")],
                    ),
                    g.constant(np.array([0, 1, 2, 31], np.int32)),
                ],
            ),
        ),
        Case("bitwise_not", lambda g: g.apply(BitwiseNot(), [g.input("a", (3, 4), "i32")])),
        Case("trig_asinh", lambda g: g.apply(Trig(TrigKind.ASINH), [g.input("x", (3, 4))])),
        Case("cumprod", lambda g: g.apply(CumProd(1, True, True), [g.input("x", (3, 4))])),
        Case("bitcast", lambda g: g.apply(Bitcast(rlx.DType.I32), [g.input("x", (3, 4))])),
    ]


def _cache_attention(g: rlx.Graph) -> object:
    """Cache rows 0..1 from the cache params, rows 2..3 the new k / v (written each run)."""
    q, k, v = g.input("q", (1, 2, 16)), g.input("k", (1, 2, 8)), g.input("v", (1, 2, 8))
    kc, vc = g.param("kc", (1, 6, 8)), g.param("vc", (1, 6, 8))
    pos = g.constant(np.array([2, 3], np.int64))
    return g.cache_attention(q, k, v, kc, vc, pos, 2, 8, 1, window=2)


def _slot_cache_attention(g: rlx.Graph) -> object:
    """Three slots: a decode token in slot 2, a run of two in slot 0 (written each run)."""
    q, k, v = g.input("q", (1, 3, 16)), g.input("k", (1, 3, 8)), g.input("v", (1, 3, 8))
    kc, vc = g.param("kc", (3, 6, 8)), g.param("vc", (3, 6, 8))
    pos = g.constant(np.array([4, 1, 2], np.int64))
    slots = g.constant(np.array([2, 0, 0], np.int64))
    return g.slot_cache_attention(q, k, v, kc, vc, pos, slots, 2, 8, 1, window=2)


def _nn_grad_cases() -> list[Case]:
    """The backward ops of rlx/ops/nn_grad.py (norms, attention, rope, conv, pool)."""
    from rlx.ops import nn_grad as ng
    from rlx.ops.nn import Attention, Conv, Pool, PoolKind, Rope

    def ins(g: rlx.Graph, dt: str, **shapes: tuple[int, ...]) -> list[int]:
        return [g.input(k, s, dt) for k, s in shapes.items()]

    att = Attention(4, 3, MaskKind.causal(), 2)
    attm = Attention(2, 3, MaskKind.custom())
    conv = Conv((2, 1), ((1, 0), (1, 2)), (1, 2), 2)
    mx = Pool(PoolKind.MAX, (2, 3), (1, 2), ((1, 0), (1, 1)))
    qkv = {"q": (2, 3, 12), "k": (2, 4, 6), "v": (2, 4, 6), "ct": (2, 3, 12)}
    cases = [
        Case(
            f"{op.mnemonic}_{wrt}_{dt}",
            lambda g, op=op, wrt=wrt, dt=dt: g.apply(
                op(1e-5, wrt), ins(g, dt, x=(3, 7), gamma=(7,), ct=(3, 7))
            ),
        )
        for op, wrt in (
            (ng.LayerNormBackward, "x"),
            (ng.RmsNormBackward, "x"),
            (ng.RmsNormBackward, "gamma"),
        )
        for dt in ("f32", "f16")
    ]
    cases += [
        Case(
            f"layer_norm_backward_gamma_{dt}",
            lambda g, dt=dt: g.apply(
                ng.LayerNormBackwardGamma(1e-5), ins(g, dt, x=(3, 7), ct=(3, 7))
            ),
        )
        for dt in ("f32", "f16")
    ]
    cases += [
        Case(
            f"attention_backward_{w}",
            lambda g, w=w: g.apply(ng.AttentionBackward(att, w), ins(g, "f32", **qkv)),
            loose=True,
        )
        for w in ("q", "k", "v")
    ]
    cases.append(
        Case(
            "attention_backward_qkv",
            lambda g: g.apply(
                ng.AttentionBackward(Attention(2, 3), "qkv"),
                ins(g, "f32", q=(2, 4, 6), k=(2, 4, 6), v=(2, 4, 6), ct=(2, 4, 6)),
            ),
            loose=True,
        )
    )
    mqkv = {"q": (2, 3, 6), "k": (2, 4, 6), "v": (2, 4, 6), "m": (2, 1, 3, 4), "ct": (2, 3, 6)}
    cases += [
        Case(
            "attention_backward_mask",
            lambda g: g.apply(ng.AttentionBackward(attm, "mask"), ins(g, "f32", **mqkv)),
            loose=True,
        ),
        Case(
            "attention_jvp",
            lambda g: g.apply(
                ng.AttentionJvp(attm),
                ins(
                    g, "f32", **{k + t: s for t in ("", "_t") for k, s in mqkv.items() if k != "ct"}
                ),
            ),
            loose=True,
        ),
        Case(
            "rope_backward_sin",
            lambda g: g.apply(
                ng.RopeBackward(Rope(6, 4, True), "sin"), ins(g, "f32", x=(2, 3, 12), ct=(2, 3, 12))
            ),
        ),
        *(
            Case(
                op.mnemonic,
                lambda g, op=op: g.apply(
                    op(conv), ins(g, "f32", x=(2, 4, 7, 6), w=(6, 2, 2, 3), ct=(2, 6, 4, 5))
                ),
                loose=True,
            )
            for op in (ng.ConvBackwardData, ng.ConvBackwardWeight)
        ),
        Case(
            "pool_backward_max",
            lambda g: g.apply(ng.PoolBackward(mx), ins(g, "f32", x=(2, 3, 5, 6), ct=(2, 3, 5, 3))),
        ),
        Case(
            "pool_backward_avg_bf16",
            lambda g: g.apply(
                ng.PoolBackward(Pool(PoolKind.AVG, (3,), (2,), ((1, 1),))),
                ins(g, "bf16", x=(2, 3, 7), ct=(2, 3, 4)),
            ),
        ),
        Case(
            "max_pool_select",
            lambda g: g.apply(ng.MaxPoolSelect(mx), ins(g, "f32", x=(2, 3, 5, 6), t=(2, 3, 5, 6))),
        ),
        Case(
            "max_pool2d_backward_f16",
            lambda g: g.apply(
                ng.MaxPool2dBackward(mx), ins(g, "f16", x=(2, 3, 5, 6), ct=(2, 3, 5, 3))
            ),
        ),
    ]
    return cases


def _loss_complex_spatial_cases() -> list[Case]:
    """rlx/ops/loss.py, complex.py, spatial.py (labels in [0, 4): 4 or more classes)."""

    def ce(g: rlx.Graph, dt: str, backward: bool) -> object:
        x, y = g.input("x", (2, 3, 7), dt), g.input("y", (2, 3), "i64")
        if backward:
            return g.softmax_cross_entropy_backward(g.input("c", (2, 3), dt), x, y)
        return g.softmax_cross_entropy(x, y)

    cases = [
        Case(f"softmax_cross_entropy{'_backward' if b else ''}_{dt}", lambda g, dt=dt, b=b: ce(g, dt, b))
        for dt in ("f32", "f64", "bf16")
        for b in (False, True)
    ]  # fmt: skip
    return cases + [
        Case("conjugate", lambda g: g.conjugate(g.input("z", (3, 4), "c64"))),
        Case("complex_norm_sq", lambda g: g.complex_norm_sq(g.input("z", (3, 4), "c64"))),
        Case("complex_norm_sq_f16", lambda g: g.complex_norm_sq(g.input("x", (3, 4), "f16"))),
        Case(
            "complex_norm_sq_backward",
            lambda g: g.complex_norm_sq_backward(g.input("c", (3, 4)), g.input("z", (3, 4), "c64")),
        ),
        Case("resize_nearest_2x_i32", lambda g: g.resize_nearest_2x(g.input("x", (2, 3, 4, 5), "i32"))),
        Case("resize_nearest_2x_f16", lambda g: g.resize_nearest_2x(g.input("x", (3, 1, 2), "f16"))),
        Case("axial_rope_2d", lambda g: g.axial_rope_2d(g.input("x", (2, 6, 16)), 2, 3, 8)),
        Case(
            "axial_rope_2d_interleaved_bf16",
            lambda g: g.axial_rope_2d(g.input("x", (1, 2, 4, 8), "bf16"), 2, 2, 8, interleaved=True),
        ),
    ]  # fmt: skip


def _emitted_backward_cases() -> list[Case]:
    """The backward ops autodiff emits for activations, fake quantizers and scans."""
    from rlx.ops.activation_grad import ActivationBackward, ReluBackward
    from rlx.ops.control import Scan, build_subgraph
    from rlx.ops.control_grad import ScanBackward, ScanBackwardXs, scan_vjp_body
    from rlx.ops.fake_quant import (
        FakeQuantizeBackward,
        FakeQuantizeLSQ,
        FakeQuantizeLSQBackwardScale,
        FakeQuantizeLSQBackwardX,
    )
    from rlx.ops.quant import FakeQuantize

    def pair(op: object, dt: str = "f32") -> Callable[[rlx.Graph], object]:
        return lambda g: g.apply(op, [g.input("v", (3, 37), dt), g.input("ct", (3, 37), dt)])

    lsq = FakeQuantizeLSQ(0, (0, 1, -1), -8, 7, 0.5)

    def lsq_case(op: type) -> Callable[[rlx.Graph], object]:
        return lambda g: g.apply(
            op(lsq),
            [g.input("x", (3, 8)), g.constant(np.float32([0.3, 0.2, 0.5])), g.input("ct", (3, 8))],
        )

    cs, xs = [rlx.Shape((2, 3)), rlx.Shape((3, 3))], [rlx.Shape((2, 3))]
    body = build_subgraph(
        "step", [*cs, *xs], lambda s, h, w, x: [s.tanh(s.add(s.matmul(h, w), x)), w, s.mul(h, x)]
    )
    fwd = Scan(body, 4, 2, 2)
    vb = scan_vjp_body(fwd, cs, xs)

    def scan_case(op: object) -> Callable[[rlx.Graph], object]:
        names = (("saved", (4, 2, 3)), ("w", (3, 3)), ("xs", (4, 2, 3)), ("ct", (4, 2, 3)))
        return lambda g: g.apply(op, [g.input(n, d) for n, d in names])

    return [
        Case("relu_backward", pair(ReluBackward())),
        Case("relu_backward_bf16", pair(ReluBackward(), "bf16")),
        *(
            Case(f"activation_backward_{k.value}", pair(ActivationBackward(k)))
            for k in (
                UnaryKind.GELU,
                UnaryKind.GELU_TANH,
                UnaryKind.SILU,
                UnaryKind.TANH,
                UnaryKind.SIGMOID,
                UnaryKind.SOFTPLUS,
                UnaryKind.HARDSWISH,
            )
        ),  # fmt: skip
        Case("activation_backward_gelu_f16", pair(ActivationBackward(UnaryKind.GELU), "f16")),
        Case(
            "fake_quantize_backward",
            pair(FakeQuantizeBackward(FakeQuantize(1, (0.1,) * 37, (0,) * 37, -8, 7))),
        ),
        Case("fake_quantize_lsq_backward_x", lsq_case(FakeQuantizeLSQBackwardX)),
        Case("fake_quantize_lsq_backward_scale", lsq_case(FakeQuantizeLSQBackwardScale)),
        Case("scan_backward", scan_case(ScanBackward(fwd, vb, 1, (True, False)))),
        Case("scan_backward_xs", scan_case(ScanBackwardXs(fwd, vb, 0, (True, False)))),
    ]


def _moe_and_block_cases() -> list[Case]:
    """rlx/ops/moe.py (a Q8_0 expert stack from gguf-py) and rlx/ops/blocks.py."""
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 5, 64)).astype(np.float32) * np.float32(0.05)
    stack = np.stack([quants.quantize(w[i], GGMLQuantizationType.Q8_0) for i in range(3)])

    def grouped(g: rlx.Graph) -> object:
        ids = g.constant(np.array([2, 0, 2, 1], np.int64))
        return g.dequant_grouped_matmul(g.input("x", (4, 64)), GgufQ8_0(), g.constant(stack), ids)

    def weights(g: rlx.Graph) -> object:
        return g.dequant_moe_weights(GgufQ8_0(), g.constant(stack))

    def layer(g: rlx.Graph, pre_norm: bool) -> object:
        dims = [(8, 8)] * 4 + [(8, 16), (16, 8)]
        ws = [g.param(f"w{i}", s) for i, s in enumerate(dims)]
        ln = [g.param(f"l{i}", (8,)) for i in range(4)]
        bs = [g.param(f"b{i}", (n,)) for i, n in enumerate([8, 8, 8, 8, 16, 8])]
        return g.fused_transformer_layer(g.input("x", (2, 3, 8)), [*ws, *ln], bs, 2, 4,
                                         pre_norm=pre_norm)  # fmt: skip

    def block(g: rlx.Graph) -> object:
        ws = [g.param(f"w{i}", (8, 8)) for i in range(4)]
        return g.fused_attention_block(g.input("x", (2, 3, 8)), ws, None, 2, 4, MaskKind.causal())

    return [
        Case("dequant_grouped_matmul_q8_0", grouped),
        Case("dequant_moe_weights_q8_0", weights),
        Case("fused_transformer_layer_post_norm", lambda g: layer(g, False), loose=True),
        Case("fused_transformer_layer_pre_norm", lambda g: layer(g, True), loose=True),
        Case("fused_attention_block_causal", block, loose=True),
    ]


CASES: list[Case] = [
    *(_unary(k) for k in UnaryKind),
    *(_unary(k, "f16") for k in (UnaryKind.GELU, UnaryKind.EXP, UnaryKind.SILU)),
    *(_unary(k, "bf16") for k in (UnaryKind.GELU_TANH, UnaryKind.TANH, UnaryKind.SIGMOID)),
    *(_unary(k, "f64") for k in (UnaryKind.GELU, UnaryKind.ERF, UnaryKind.SOFTPLUS)),
    *(_unary(k, "i32") for k in (UnaryKind.RELU, UnaryKind.NEG, UnaryKind.ABS, UnaryKind.SQUARE)),
    *(_binary(k) for k in BinaryKind),
    *(
        _binary(k, "i32")
        for k in (BinaryKind.ADD, BinaryKind.MUL, BinaryKind.DIV, BinaryKind.MOD, BinaryKind.MAX)
    ),
    _binary(BinaryKind.ADD, "bf16", (3, 1)),
    _binary(BinaryKind.MUL, "f16", ()),
    *(_compare(k) for k in CompareKind),
    Case(
        "where",
        lambda g: g.where(
            g.gt(g.input("c", (3, 5)), 0.0), g.input("a", (3, 5)), g.input("b", (5,))
        ),
    ),
    Case(
        "where_inplace",
        lambda g: g.where(
            g.input("c", (3, 5), "bool"), g.exp(g.input("a", (3, 5))), g.neg(g.input("b", (3, 5)))
        ),
    ),
    *(
        _cast(s, d)
        for s, d in (
            ("f32", "i32"),
            ("f32", "bf16"),
            ("bf16", "f32"),
            ("i32", "f32"),
            ("f32", "f8e4m3"),
            ("f32", "bool"),
            ("f16", "f64"),
        )
    ),
    *(_reduce(k, (1,), False) for k in ReduceKind),
    *(_reduce(k, None, True) for k in (ReduceKind.SUM, ReduceKind.MAX)),
    _reduce(ReduceKind.SUM, (0, 2), False, "i32"),
    _reduce(ReduceKind.MEAN, (-1,), True, "bf16"),
    Case("softmax", lambda g: g.softmax(g.input("x", (3, 7)), axis=-1)),
    Case("softmax_axis0_f16", lambda g: g.softmax(g.input("x", (3, 7), "f16"), axis=0)),
    Case("log_softmax", lambda g: g.log_softmax(g.input("x", (3, 7)), axis=1)),
    Case("cumsum", lambda g: g.cumsum(g.input("x", (3, 7)), axis=1, reverse=True)),
    Case(
        "cumsum_exclusive_i32",
        lambda g: g.cumsum(g.input("x", (3, 7), "i32"), axis=0, exclusive=True),
    ),
    Case("cumsum_bf16", lambda g: g.cumsum(g.input("x", (3, 7), "bf16"), axis=-1)),
    Case("cumsum_i32", lambda g: g.cumsum(g.input("x", (3, 7), "i32"), axis=0)),
    Case("argmax_f16", lambda g: g.argmax(g.input("x", (3, 7), "f16"), axis=0, keepdims=True)),
    Case("topk_values", lambda g: g.topk(g.input("x", (3, 7)), 3)[0]),
    Case("topk_indices", lambda g: g.topk(g.input("x", (3, 7)), 2, axis=0)[1]),
    Case("argmax", lambda g: g.argmax(g.input("x", (3, 7)), axis=1)),
    Case("argmin", lambda g: g.argmin(g.input("x", (3, 7)), axis=0, keepdims=True)),
    Case(
        "layer_norm",
        lambda g: g.layer_norm(g.input("x", (2, 3, 8)), g.input("g", (8,)), g.input("b", (8,))),
    ),
    Case(
        "layer_norm_nobeta_bf16",
        lambda g: g.layer_norm(g.input("x", (4, 8), "bf16"), g.input("g", (8,), "bf16")),
    ),
    Case("rms_norm", lambda g: g.rms_norm(g.input("x", (2, 3, 8)), g.input("g", (8,)))),
    # the decoder's fused ops (rlx/ops/decoder.py): positions are ints in [0, 4), the
    # rotary tables have 4 rows
    Case(
        "rope_norm",
        lambda g: g.rope_norm(
            g.input("x", (1, 3, 16)),
            g.input("cos", (4, 2)),
            g.input("sin", (4, 2)),
            g.input("pos", (3,), "i64"),
            g.input("w", (8,)),
            8,
            4,
        ),  # fmt: skip
    ),
    Case(
        "norm_add",
        lambda g: g.norm_add(g.input("x", (2, 8)), g.input("w", (8,)), g.input("r", (2, 8))),
    ),
    Case(
        "rms_norm_beta",
        lambda g: g.rms_norm(g.input("x", (4, 8)), g.input("g", (8,)), g.input("b", (8,))),
    ),
    Case(
        "group_norm",
        lambda g: g.group_norm(g.input("x", (2, 4, 3)), g.input("g", (4,)), g.input("b", (4,)), 2),
    ),
    Case("reshape", lambda g: g.exp(g.reshape(g.input("x", (2, 6)), (3, 4)))),
    Case("transpose", lambda g: g.transpose(g.input("x", (2, 3, 4)), (2, 0, 1))),
    Case(
        "concat",
        lambda g: g.concat(
            [g.input("a", (2, 3)), g.input("b", (2, 1)), g.input("c", (2, 2))], axis=1
        ),
    ),
    Case("expand", lambda g: g.expand(g.input("x", (3, 1)), (2, 3, 4))),
    Case("narrow", lambda g: g.narrow(g.input("x", (4, 6)), 1, 2, 3)),
    Case("slice", lambda g: g.slice(g.input("x", (5, 6)), (1, None), (None, 1), (2, -2))),
    Case(
        "gather",
        lambda g: g.gather(
            g.input("x", (5, 3)), g.constant(np.array([[4, 0], [-1, 2]], np.int32)), axis=0
        ),
    ),
    Case(
        "scatter_add",
        lambda g: g.scatter_add(
            g.input("x", (5, 3)), g.constant(np.array([1, 3, 1], np.int32)), g.input("u", (3, 3))
        ),
    ),
    Case("pad", lambda g: g.pad(g.input("x", (2, 3)), [(1, 0), (2, 1)], 0.5)),
    Case("shape_of", lambda g: g.shape_of(g.input("x", (2, 3, 4)))),
    Case("cache_attention", _cache_attention),
    Case("slot_cache_attention", _slot_cache_attention),
    Case(
        "dequant_gather",
        lambda g: g.dequant_gather(
            g.param("w", (5, 34), "u8"), g.input("ids", (2, 3), "i64"), GgufQ8_0()
        ),
    ),
    Case(
        "squeeze_unsqueeze_flatten",
        lambda g: g.flatten(g.unsqueeze(g.squeeze(g.input("x", (2, 1, 3))), 0)),
    ),
    Case("matmul", lambda g: g.matmul(g.input("a", (3, 8)), g.input("b", (8, 5))), loose=True),
    Case(
        "matmul_batched_broadcast",
        lambda g: g.matmul(g.input("a", (2, 3, 8)), g.input("b", (8, 5))),
        loose=True,
    ),
    Case(
        "matmul_unit_batch_rhs",
        lambda g: g.matmul(g.input("a", (2, 3, 8)), g.input("b", (1, 8, 5))),
        loose=True,
    ),
    Case(
        "matmul_rank_grows",
        lambda g: g.matmul(g.input("a", (3, 8)), g.input("b", (1, 1, 8, 5))),
        loose=True,
    ),
    Case(
        "matmul_vector", lambda g: g.matmul(g.input("a", (8,)), g.input("b", (2, 8, 5))), loose=True
    ),
    Case(
        "matmul_f16", lambda g: g.matmul(g.input("a", (3, 8), "f16"), g.input("b", (8, 5), "f16"))
    ),
    Case(
        "matmul_i32", lambda g: g.matmul(g.input("a", (3, 8), "i32"), g.input("b", (8, 5), "i32"))
    ),
    Case(
        "dot_general",
        lambda g: g.dot_general(
            g.input("a", (2, 3, 4)),
            g.input("b", (2, 5, 4)),
            contract=((2,), (2,)),
            batch=((0,), (0,)),
        ),
        loose=True,
    ),
    Case(
        "dot_general_no_batch",
        lambda g: g.dot_general(g.input("a", (4, 3)), g.input("b", (5, 4)), contract=((0,), (1,))),
        loose=True,
    ),
    Case(
        "dot_general_permuted",
        lambda g: g.dot_general(
            g.input("a", (4, 2, 3)),
            g.input("b", (5, 4, 2)),
            contract=((0,), (1,)),
            batch=((1,), (2,)),
        ),
        loose=True,
    ),
    Case(
        "linear",
        lambda g: g.linear(g.input("x", (2, 3, 8)), g.input("w", (8, 4)), g.input("b", (4,))),
        loose=True,
    ),
    Case(
        "linear_params",
        lambda g: g.linear(g.input("x", (2, 3, 8)), g.param("w", (8, 4)), g.param("b", (4,))),
        loose=True,
    ),
    _attention(MaskKind.none()),
    _attention(MaskKind.causal(), kv_heads=2),
    _attention(MaskKind.sliding_window(2), kv_heads=1),
    _attention(MaskKind.custom(), custom=True),
    _attention(MaskKind.causal(), dtype="bf16"),
    Case(
        "rope",
        lambda g: g.rope(g.input("x", (1, 3, 16)), g.input("c", (3, 4)), g.input("s", (3, 4)), 8),
    ),
    Case(
        "rope_partial_interleaved",
        lambda g: g.rope(
            g.input("x", (2, 3, 16)),
            g.input("c", (3, 2)),
            g.input("s", (3, 2)),
            8,
            n_rot=4,
            interleaved=True,
        ),
    ),
    Case(
        "rope_bf16",
        lambda g: g.rope(
            g.input("x", (1, 3, 8), "bf16"),
            g.input("c", (3, 2), "bf16"),
            g.input("s", (3, 2), "bf16"),
            4,
        ),
    ),
    Case(
        "conv1d",
        lambda g: g.conv(
            g.input("x", (2, 3, 9)),
            g.input("w", (4, 3, 3)),
            g.input("b", (4,)),
            stride=2,
            padding=1,
        ),
        loose=True,
    ),
    Case(
        "conv2d_groups",
        lambda g: g.conv(
            g.input("x", (1, 4, 5, 5)), g.input("w", (4, 2, 3, 3)), groups=2, dilation=1
        ),
        loose=True,
    ),
    Case(
        "conv2d_stride_dilation_pad",
        lambda g: g.conv(
            g.input("x", (2, 2, 7, 6)),
            g.input("w", (3, 2, 2, 3)),
            g.input("b", (3,)),
            stride=(2, 1),
            padding=((1, 0), (2, 1)),
            dilation=(1, 2),
        ),
        loose=True,
    ),
    Case(
        "conv1d_f16",
        lambda g: g.conv(g.input("x", (1, 2, 8), "f16"), g.input("w", (2, 2, 3), "f16"), padding=1),
    ),
    Case(
        "max_pool_pad_i32",
        lambda g: g.max_pool(g.input("x", (1, 2, 5, 5), "i32"), 3, stride=2, padding=1),
    ),
    Case(
        "avg_pool_2d_pad",
        lambda g: g.avg_pool(
            g.input("x", (2, 3, 5, 6)), (2, 3), stride=(1, 2), padding=((1, 1), (1, 0))
        ),
    ),
    Case("pad_bool", lambda g: g.pad(g.input("x", (2, 3), "bool"), [(0, 1), (1, 1)], 1.0)),
    Case("max_pool", lambda g: g.max_pool(g.input("x", (1, 2, 6, 6)), 2)),
    Case("avg_pool", lambda g: g.avg_pool(g.input("x", (1, 2, 7)), 3, stride=2, padding=1)),
    Case("fft", lambda g: g.fft(g.input("x", (3, 8), "c64")), loose=True),
    Case("ifft", lambda g: g.ifft(g.input("x", (3, 8), "c64")), loose=True),
    Case("rfft", lambda g: g.rfft(g.input("x", (3, 8))), loose=True),
    Case("irfft", lambda g: g.irfft(g.input("x", (3, 5), "c64"), n=8), loose=True),
    Case("quantize", lambda g: g.quantize(g.input("x", (3, 8)), 0.02)),
    Case("dequantize", lambda g: g.dequantize(g.cast(g.input("x", (3, 8), "i32"), "i8"), 0.1, [2])),
    Case(
        "fake_quantize", lambda g: g.fake_quantize(g.input("x", (3, 8)), [0.1, 0.2, 0.05], axis=0)
    ),
    Case(
        "fake_quantize_lsq",
        lambda g: g.fake_quantize_lsq(
            g.input("x", (3, 8)), g.constant(np.array([0.1, 0.2, 0.05], np.float32)), axis=0
        ),
    ),
    Case("dequant_matmul", _dequant_matmul, loose=True),
    Case("qmatmul", _qmatmul, loose=True),
    *(
        Case(f"dynamic_qmatmul_{m}", lambda g, m=m: _dynamic_qmatmul(g, m), loose=True)
        for m in ("s8", "u8")
    ),
    Case(
        "dynamic_qbatch_matmul",
        lambda g: g.dynamic_qbatch_matmul(
            g.input("a", (2, 5, 16)), g.input("b", (2, 7, 16)), transpose_b=True, alpha=0.5
        ),
        loose=True,
    ),
    *(
        Case(
            f"fused_matmul_{a}",
            lambda g, a=a: g.fused_matmul_bias_act(
                g.input("x", (3, 8)), g.input("w", (8, 4)), g.input("b", (4,)), act=a
            ),
            loose=True,
        )
        for a in (None, UnaryKind.RELU, UnaryKind.GELU, UnaryKind.SILU)
    ),
    Case(
        "fused_matmul_nobias_f16",
        lambda g: g.fused_matmul_bias_act(
            g.input("x", (3, 8), "f16"), g.input("w", (8, 4), "f16"), act=UnaryKind.GELU_TANH
        ),
    ),
    Case(
        "fused_swiglu",
        lambda g: g.fused_swiglu(
            g.input("x", (2, 3, 8)), g.input("wg", (8, 6)), g.input("wu", (8, 6))
        ),
        loose=True,
    ),
    Case(
        "fused_residual_rms_norm",
        lambda g: g.fused_residual_rms_norm(
            g.input("x", (3, 8)), g.input("r", (3, 8)), g.input("g", (8,))
        ),
    ),
    Case(
        "fused_residual_layer_norm",
        lambda g: g.fused_residual_layer_norm(
            g.input("x", (3, 8)), g.input("r", (3, 8)), g.input("g", (8,)), g.input("b", (8,))
        ),
    ),
    Case(
        "fused_matmul_bias_silu_bf16",
        lambda g: g.fused_matmul_bias_act(
            g.input("x", (2, 3, 8), "bf16"),
            g.input("w", (8, 4), "bf16"),
            g.input("b", (4,), "bf16"),
            act=UnaryKind.SILU,
        ),
    ),
    Case(
        "fused_swiglu_f16",
        lambda g: g.fused_swiglu(
            g.input("x", (3, 8), "f16"), g.input("wg", (8, 6), "f16"), g.input("wu", (8, 6), "f16")
        ),
    ),
    Case(
        "fused_residual_rms_norm_bf16",
        lambda g: g.fused_residual_rms_norm(
            g.input("x", (3, 8), "bf16"), g.input("r", (3, 8), "bf16"), g.input("g", (8,), "bf16")
        ),
    ),
    Case(
        "fused_residual_layer_norm_f16",
        lambda g: g.fused_residual_layer_norm(
            g.input("x", (3, 8), "f16"),
            g.input("r", (1, 8), "f16"),
            g.input("g", (8,), "f16"),
            g.input("b", (8,), "f16"),
        ),
    ),
    Case("elementwise_region", _region),
    Case(
        "if",
        lambda g: g.cond(
            g.gt(g.reduce(ReduceKind.SUM, g.input("p", (3,)), None, True), 0.0),
            lambda s, a: s.exp(a),
            lambda s, a: s.neg(a),
            [g.input("x", (3,))],
        ),
    ),
    Case("while", _while),
    Case(
        "scan",
        lambda g: g.scan(
            lambda s, c, x: [s.add(c, x), s.mul(c, x)],
            [g.input("init", (3,))],
            [g.input("xs", (4, 3))],
            output_index=1,
        ),
    ),
    Case("gated_delta_net", _gdn, loose=True),
    Case("custom", _custom),
    Case("assign", lambda g: g.assign(p := g.param("p", (3,)), g.add(p, g.input("x", (3,))))),
    Case("barrier", lambda g: g.exp(g.barrier(g.input("x", (3, 2))))),
    Case(
        "adam_update",
        lambda g: g.adam_update(
            g.param("p", (3,)),
            g.input("g", (3,)),
            g.param("m", (3,)),
            g.param("v", (3,)),
            g.input("lr", (), "f64"),
            g.input("t", (), "f64"),
            weight_decay=0.01,
            decoupled=True,
        ),
    ),
    Case("stop_gradient", lambda g: g.exp(g.stop_gradient(g.input("x", (3, 2))))),
    Case(
        "gather_backward",
        lambda g: g.gather_backward(
            g.input("c", (3, 4, 2)), g.constant(np.array([0, 4, 4, -1])), 1, (3, 5, 2)
        ),
    ),
    Case(
        "softmax_backward",
        lambda g: g.softmax_backward(g.input("d", (3, 37)), g.input("y", (3, 37)), axis=-1),
    ),
    Case(
        "log_softmax_backward_axis0_f16",
        lambda g: g.log_softmax_backward(
            g.input("d", (5, 3), "f16"), g.input("y", (5, 3), "f16"), axis=0
        ),
    ),
    Case(
        "log_softmax_backward_f64",
        lambda g: g.log_softmax_backward(
            g.input("d", (2, 3, 9), "f64"), g.input("y", (2, 3, 9), "f64")
        ),
    ),
    *SEED_CASES,
    *_nn_grad_cases(),
    *_emitted_backward_cases(),
    *_import_op_cases(),
    *_loss_complex_spatial_cases(),
    *_moe_and_block_cases(),
]


def _compile_case(case: Case) -> tuple[rlx.Graph, object]:
    g = rlx.Graph(case.name)
    out = case.build(g)
    g.set_outputs(out)
    return g, Session("cpu").compile(g, RAW, params=feed_for(g, params=True))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_compiled_matches_reference(case: Case) -> None:
    g, cg = _compile_case(case)
    params = feed_for(g, params=True)
    # three runs on two feeds: kernels must read their inputs afresh on every run (no
    # view taken at build time may have silently become a copy) and reuse scratch safely
    for seed in (0, 1, 0):
        feed = feed_for(g, seed)
        (want,) = g.evaluate(feed, params)
        (got,) = cg.run(feed)
        assert_close(got, want, case.loose, f"{case.name} (feed {seed})")


def test_every_registered_op_has_a_parity_case() -> None:
    covered: set[str] = set()
    for case in CASES:
        g = rlx.Graph(case.name)
        g.set_outputs(case.build(g))
        covered |= {n.op.mnemonic for n in g.nodes}
    missing = sorted(set(OPS) - covered)
    assert not missing, f"ops without a CPU parity case: {missing}"


FAST = {
    # composite unaries as one generated C loop (kernels/elementwise.py _native_unary)
    "unary_gelu_f32": KernelKind.NATIVE if native.available() else KernelKind.NUMPY,
    # native row kernels (engines/rows.py) where gcc is installed
    "softmax": KernelKind.NATIVE if native.available() else KernelKind.NUMPY,
    "softmax_backward": KernelKind.NATIVE if native.available() else KernelKind.NUMPY,
    "log_softmax_backward_axis0_f16": KernelKind.NUMPY,
    "layer_norm": KernelKind.NATIVE if native.available() else KernelKind.NUMPY,
    # rlx's sgemm runs every f32 product at more than one thread (one pool); at one thread
    # the faster of it and BLAS, measured per shape class (None: either)
    "matmul": KernelKind.NATIVE if native.available() and resolve_threads(None) > 1 else None,
    "attention_causal_2_f32_False": KernelKind.NATIVE if native.available() else KernelKind.BLAS,
    "fused_swiglu": KernelKind.NATIVE if native.available() else KernelKind.BLAS,
    "gather": KernelKind.NUMPY,
    # one generated C loop (engines/region.py) where gcc is installed
    "elementwise_region": KernelKind.NATIVE if native.available() else KernelKind.NUMPY,
    "matmul_i32": KernelKind.BLAS,  # exact f64 products of 16-bit halves
    "cumsum": KernelKind.NUMPY,
    "cumsum_exclusive_i32": KernelKind.NUMPY,
    "argmin": KernelKind.NUMPY,
    # small f32 convolutions and every f32 pool: the native direct loops (conv_native.py)
    "conv1d": KernelKind.NATIVE if native.available() else KernelKind.BLAS,
    "conv2d_groups": KernelKind.NATIVE if native.available() else KernelKind.BLAS,
    "max_pool": KernelKind.NATIVE if native.available() else KernelKind.NUMPY,
    "avg_pool": KernelKind.NATIVE if native.available() else KernelKind.NUMPY,
    "pad": KernelKind.NUMPY,
    "rope_partial_interleaved": KernelKind.NUMPY,
    "fused_matmul_nobias_f16": KernelKind.NATIVE if native.available() else KernelKind.BLAS,
    "fused_swiglu_f16": KernelKind.BLAS,
    "fused_residual_rms_norm_bf16": KernelKind.NATIVE if native.available() else KernelKind.NUMPY,
}


@pytest.mark.parametrize("name,kind", sorted(FAST.items(), key=lambda kv: kv[0]))
def test_kernel_kinds_in_report(name: str, kind: KernelKind) -> None:
    case = next(c for c in CASES if c.name == name)
    g, cg = _compile_case(case)
    out_node = cg.graph.nodes[cg.graph.outputs[0]]
    rec = next(k for k in cg.report().kernels if k.node == out_node.id)
    assert rec.op == out_node.op.mnemonic
    assert (
        rec.kind is kind if kind is not None else rec.kind in (KernelKind.BLAS, KernelKind.NATIVE)
    )


# ---- random chains of ops, with the default (optimizing) pipeline -------------------

_CHAIN_UNARY = [
    UnaryKind.RELU,
    UnaryKind.TANH,
    UnaryKind.SIGMOID,
    UnaryKind.SILU,
    UnaryKind.GELU,
    UnaryKind.NEG,
    UnaryKind.ABS,
    UnaryKind.SQUARE,
]
_CHAIN_BINARY = [BinaryKind.ADD, BinaryKind.SUB, BinaryKind.MUL, BinaryKind.MAX, BinaryKind.MIN]


def _apply_step(g: rlx.Graph, vals: list[int], step: tuple[int, int, int]) -> int:
    which, a, b = step
    x, y = vals[a % len(vals)], vals[b % len(vals)]
    if which < 8:
        return g.unary(_CHAIN_UNARY[which], x)
    if which < 13:
        return g.binary(_CHAIN_BINARY[which - 8], x, y)
    if which == 13:
        return g.softmax(x, axis=-1)
    if which == 14:
        return g.transpose(g.transpose(x, (0, 2, 1)), (0, 2, 1))
    if which == 15:
        return g.rms_norm(x, g.constant(np.linspace(0.5, 1.5, 4).astype(g.nodes[x].dtype.np)))
    if which == 16:
        return g.add(x, g.mean(y, axes=(2,), keepdims=True))
    w = np.linspace(-1, 1, 16).reshape(4, 4).astype(g.nodes[x].dtype.np)
    return g.add(x, g.matmul(y, g.constant(w)))


@given(
    steps=st.lists(
        st.tuples(st.integers(0, 17), st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=10
    ),
    seed=st.integers(0, 2**16),
    fuse=st.booleans(),
    dtype=st.sampled_from(["f32", "bf16"]),
)
def test_random_chains_match_reference(
    steps: list[tuple[int, int, int]], seed: int, fuse: bool, dtype: str
) -> None:
    g = rlx.Graph("chain")
    vals = [g.input("x", (2, 3, 4), dtype), g.input("y", (2, 3, 4), dtype)]
    for s in steps:
        vals.append(_apply_step(g, vals, s))
    g.set_outputs([vals[-1], vals[len(vals) // 2]])
    feed = feed_for(g, seed)
    kept = {k: v.copy() for k, v in feed.items()}
    want = g.evaluate(feed)
    cg = Session("cpu").compile(g, CompileOptions(fuse=fuse, use_cache=False))
    for got, w in zip(cg.run(feed), want, strict=True):
        assert_close(got, w, True, "chain")
    for k, v in feed.items():  # in-place kernels work on the arena copy, never the caller's
        np.testing.assert_array_equal(v, kept[k])
