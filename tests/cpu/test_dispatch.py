"""Every built-in op has a CPU kernel other than the default ``reference`` one (which
runs the op's NumPy reference and allocates its result on every run).

Two checks: the kernel table has a factory for every built-in op class (boundary ops
have no kernel at all, view ops are always planned as views, and the documented
allowlist below says why the rest are exempt); and a sweep over every (op, dtype) pair
the shape rules accept, compiled without fusion, finds no node whose report kind is
``reference`` outside the allowlisted corners.
"""

import warnings

import numpy as np
import pytest

import rlx
from rlx import DType, Shape
from rlx.backends.cpu.dispatch import KERNELS, KernelKind, kernel_kind, load_kernels
from rlx.errors import UnsupportedOpError
from rlx.ops import OPS
from rlx.ops.core import Constant, Input, Param, StopGradient
from rlx.ops.custom import Custom
from rlx.ops.elementwise import (
    Binary,
    BinaryKind,
    Cast,
    Compare,
    CompareKind,
    Unary,
    UnaryKind,
    Where,
)
from rlx.ops.fake_quant import FakeQuantizeLSQ
from rlx.ops.fft import Fft, FftKind
from rlx.ops.grad_util import GatherBackward
from rlx.ops.linalg import DotGeneral, MatMul
from rlx.ops.movement import (
    Concat,
    Expand,
    Gather,
    Narrow,
    Pad,
    Reshape,
    ScatterAdd,
    ShapeOf,
    Slice,
    Transpose,
)
from rlx.ops.nn import Conv, Pool, PoolKind
from rlx.ops.norm import GroupNorm, LayerNorm, RmsNorm
from rlx.ops.quant import Dequantize, FakeQuantize, Quantize
from rlx.ops.reduce import ArgMax, ArgMin, Cumsum, LogSoftmax, Reduce, ReduceKind, Softmax, TopK
from rlx.ops.reduce_grad import LogSoftmaxBackward, SoftmaxBackward
from rlx.ops.state import Barrier
from rlx.ops.unary_kinds import UNARY, Complex, Inputs
from rlx.options import CompileOptions
from tests.cpu.kernels.checks import rand

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)

#: Ops without any kernel: the executor never schedules them (their arena view is their value).
BOUNDARY = {Input, Param, Constant}

#: Op classes exempt from having a kernel, with the reason.
ALLOWLIST: dict[type, str] = {
    Custom: "runs the Python reference function the user registered "
    "(rlx.register_custom_op): there is no kernel to write for an op the backend cannot see",
}

#: (op, dtype) corners that keep the reference kernel, with the reason: the unary kinds
#: whose row (rlx/ops/unary_kinds.py) says a complex input is Complex.REFERENCE
CORNERS: dict[tuple[str, str], str] = {
    (f"unary.{k.value}", "c64"): "a complex activation is defined only by the reference's "
    "NumPy expression (the shape rule should reject it)"
    for k, facts in UNARY.items()
    if facts.complex is Complex.REFERENCE
}
#: unary kinds without a complex definition (Complex.UNDEFINED, bool-only ones aside)
NO_COMPLEX = sorted(
    f"unary.{k.value}"
    for k, facts in UNARY.items()
    if facts.complex is Complex.UNDEFINED and facts.inputs is not Inputs.BOOL
)


def _builtin_ops():
    return [c for c in OPS.values() if c.__module__.startswith("rlx.")]


def test_every_builtin_op_has_a_kernel_factory():
    load_kernels()
    missing = []
    for cls in _builtin_ops():
        if cls in BOUNDARY or cls in ALLOWLIST or cls.view:
            continue
        if cls not in KERNELS or kernel_kind(cls) is KernelKind.REFERENCE:
            missing.append(f"{cls.__name__} ({cls.__module__})")
    assert not missing, f"built-in ops whose CPU kernel is the reference default: {missing}"
    for cls in ALLOWLIST:
        assert cls in OPS.values() and cls not in KERNELS, f"{cls.__name__}: drop it from ALLOWLIST"


def test_view_ops_are_always_planned_as_views():
    """Why view ops need no kernel: the plan aliases them to their input."""
    assert {c for c in _builtin_ops() if c.view} == {Reshape, Barrier, StopGradient}
    g = rlx.Graph("v")
    x = g.input("x", Shape((2, 3, 4), DType.BF16))
    g.set_outputs([g.reshape(g.neg(g.reshape(x, [6, 4])), [24])])
    rep = rlx.Session("cpu").compile(g, RAW).report()
    kinds = {k.op: k.kind for k in rep.kernels}
    assert kinds["reshape"] is KernelKind.VIEW


def _templates(dt: DType):
    x, v = Shape((2, 3, 4), dt), Shape((4,), dt)
    idx, cond = Shape((2,), DType.I64), Shape((2, 3, 4), DType.BOOL)
    ncl = Shape((2, 3, 6), dt)
    out = [(f"unary.{u.value}", Unary(u), [x]) for u in UnaryKind]
    out += [(f"binary.{b.value}", Binary(b), [x, v]) for b in BinaryKind]
    out += [(f"compare.{c.value}", Compare(c), [x, v]) for c in CompareKind]
    out += [(f"cast.{t.value}", Cast(t), [x]) for t in DType]
    out += [(f"reduce.{r.value}", Reduce(r, (1,), False), [x]) for r in ReduceKind]
    out += [(f"fft.{f.value}", Fft(f), [x]) for f in FftKind]
    out += [
        ("where", Where(), [cond, x, x]),
        ("cumsum", Cumsum(1), [x]),
        ("cumsum.exclusive", Cumsum(1, exclusive=True, reverse=True), [x]),
        ("softmax", Softmax(-1), [x]),
        ("log_softmax", LogSoftmax(-1), [x]),
        ("softmax_backward", SoftmaxBackward(-1), [x, x]),
        ("log_softmax_backward", LogSoftmaxBackward(1), [x, x]),
        ("topk", TopK(2, 1), [x]),
        ("topk.indices", TopK(2, 1, False, True), [x]),
        ("argmax", ArgMax(1), [x]),
        ("argmin", ArgMin(1), [x]),
        ("transpose", Transpose((2, 0, 1)), [x]),
        ("concat", Concat(1), [x, x]),
        ("expand", Expand((3, 2, 3, 4)), [x]),
        ("narrow", Narrow(2, 1, 2), [x]),
        ("slice", Slice((0, 0, 3), (2, 3, None), (1, 2, -1)), [x]),
        ("gather", Gather(1), [x, idx]),
        ("gather_backward", GatherBackward(1, (2, 5, 4)), [Shape((2, 2, 4), dt), idx]),
        ("scatter_add", ScatterAdd(1), [x, idx, Shape((2, 2, 4), dt)]),
        ("pad", Pad(((1, 0), (0, 1), (2, 2)), 0.0), [x]),
        ("shape_of", ShapeOf(), [x]),
        ("matmul", MatMul(), [Shape((3, 4), dt), Shape((4, 5), dt)]),
        ("dot_general", DotGeneral((1,), (0,)), [Shape((3, 4), dt), Shape((4, 5), dt)]),
        ("layer_norm", LayerNorm(), [x, v, v]),
        ("rms_norm", RmsNorm(), [x, v]),
        ("group_norm", GroupNorm(1), [x, Shape((3,), dt), Shape((3,), dt)]),
        ("conv", Conv((1,), ((0, 0),), (1,), 1), [ncl, Shape((4, 3, 2), dt)]),
        ("pool.max", Pool(PoolKind.MAX, (2,), (1,), ((0, 0),)), [ncl]),
        ("pool.avg", Pool(PoolKind.AVG, (2,), (1,), ((0, 0),)), [ncl]),
        ("quantize", Quantize(None, (0.1,), (0,)), [x]),
        ("dequantize", Dequantize(None, (0.1,), (0,)), [x]),
        ("fake_quantize", FakeQuantize(None, (0.1,), (0,)), [x]),
        *_nn_grad_templates(dt, x, v, ncl),
        ("fake_quantize_lsq", FakeQuantizeLSQ(None, (0,)), [x, Shape((1,), dt)]),
        *_backward_templates(dt, x, ncl),
    ]
    return out


def _backward_templates(dt: DType, x: Shape, ncl: Shape) -> list:
    """The backward ops autodiff emits in place of primitive graphs (activations, fake
    quantizers, layer norm's dgamma, the 2-D max pool)."""
    from rlx.ops import fake_quant as fq
    from rlx.ops import nn_grad as ng
    from rlx.ops.activation_grad import ACTIVATIONS, ActivationBackward, ReluBackward

    lsq = FakeQuantizeLSQ(1, (0, 0, 0))
    img = Shape((2, 3, 4, 4), dt)
    mx2 = Pool(PoolKind.MAX, (2, 2), (2, 2), ((0, 0), (0, 0)))
    out = [(f"activation_backward.{k.value}", ActivationBackward(k), [x, x]) for k in ACTIVATIONS]
    return [
        *out,
        ("relu_backward", ReluBackward(), [x, x]),
        (
            "fake_quantize_backward",
            fq.FakeQuantizeBackward(FakeQuantize(None, (0.1,), (0,))),
            [x, x],
        ),
        ("fake_quantize_lsq_backward_x", fq.FakeQuantizeLSQBackwardX(lsq), [x, Shape((3,), dt), x]),
        (
            "fake_quantize_lsq_backward_scale",
            fq.FakeQuantizeLSQBackwardScale(lsq),
            [x, Shape((3,), dt), x],
        ),
        ("layer_norm_backward_gamma", ng.LayerNormBackwardGamma(1e-5), [x, x]),
        ("max_pool2d_backward", ng.MaxPool2dBackward(mx2), [img, Shape((2, 3, 2, 2), dt)]),
    ]


def _nn_grad_templates(dt: DType, x: Shape, v: Shape, ncl: Shape) -> list:
    """The backward ops of rlx/ops/nn_grad.py on the sweep's shapes."""
    from rlx.ops import nn_grad as ng
    from rlx.ops.nn import Attention, Rope

    att, conv = Attention(2, 2), Conv((1,), ((0, 0),), (1,), 1)
    mx = Pool(PoolKind.MAX, (2,), (1,), ((0, 0),))
    cout, pout = Shape((2, 4, 5), dt), Shape((2, 3, 5), dt)
    return [
        ("layer_norm_backward", ng.LayerNormBackward(1e-5), [x, v, x]),
        ("rms_norm_backward.gamma", ng.RmsNormBackward(1e-5, "gamma"), [x, v, x]),
        ("attention_backward", ng.AttentionBackward(att, "k"), [x, x, x, x]),
        ("attention_jvp", ng.AttentionJvp(att), [x] * 6),
        ("rope_backward", ng.RopeBackward(Rope(2, 2), "cos"), [x, x]),
        ("conv_backward_data", ng.ConvBackwardData(conv), [ncl, Shape((4, 3, 2), dt), cout]),
        ("conv_backward_weight", ng.ConvBackwardWeight(conv), [ncl, Shape((4, 3, 2), dt), cout]),
        ("pool_backward", ng.PoolBackward(mx), [ncl, pout]),
        ("max_pool_select", ng.MaxPoolSelect(mx), [ncl, ncl]),
    ]


@pytest.mark.parametrize("dt", list(DType), ids=lambda d: d.value)
def test_no_op_dtype_pair_compiles_to_a_reference_kernel(dt):
    found, unsupported, tried = [], [], 0
    for name, op, shapes in _templates(dt):
        g = rlx.Graph("sweep")
        ids = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
        try:
            y = g.apply(op, ids)
        except rlx.errors.ShapeError:
            continue  # the shape rule rejects this dtype
        g.set_outputs([y])
        tried += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rep = rlx.Session("cpu").compile(g, RAW).report()
        except UnsupportedOpError:
            unsupported.append(name)
            continue
        if any(k.kind is KernelKind.REFERENCE for k in rep.kernels):
            if (name, dt.value) not in CORNERS:
                found.append(name)
        else:
            assert (name, dt.value) not in CORNERS, f"{name} {dt.value}: drop it from CORNERS"
    assert tried > 0
    assert not found, f"{dt.value}: reference kernels for {found}"
    if dt is DType.C64:  # no definition: a compile-time error instead of a run-time TypeError
        assert sorted(unsupported) == NO_COMPLEX
    else:
        assert not unsupported


def test_complex_floor_fails_at_compile_time_naming_the_node():
    g = rlx.Graph("c")
    z = g.input("z", Shape((3,), DType.C64))
    g.set_outputs([g.floor(z)])
    with pytest.raises(UnsupportedOpError, match=r"floor.*not defined for the complex input"):
        rlx.Session("cpu").compile(g, RAW)


@pytest.mark.parametrize("dt", ["f64", "f16", "bf16", "f8e4m3"])
@pytest.mark.parametrize("axis", [None, 1])
def test_quantize_from_other_floats_matches_numpy(dt, axis):
    """Quantize from non-f32 floats (f64 computed in f64, the rest widened to f32)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 3, 4)) * 4).astype(np.float32)
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    xd = x.astype(DType.parse(dt).np)
    scales = (0.05,) if axis is None else (0.05, 0.1, 0.3)
    zps = (3,) if axis is None else (0, -2, 5)
    g = rlx.Graph("q")
    xi = g.input("x", Shape((2, 3, 4), DType.parse(dt)))
    g.set_outputs([g.apply(Quantize(axis, scales, zps), [xi])])
    cg = rlx.Session("cpu").compile(g, RAW)
    (got,) = cg.run({"x": xd})
    ct = np.float64 if dt == "f64" else np.float32
    s = np.asarray(scales, ct).reshape((1, -1, 1) if axis == 1 else ())
    z = np.asarray(zps).reshape((1, -1, 1) if axis == 1 else ())
    with np.errstate(all="ignore"):
        r = np.rint(xd.astype(ct) / s)
    r = np.where(np.isnan(r), 0, np.clip(r, -(2.0**40), 2.0**40))
    want = np.clip(r.astype(np.int64) + z, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(got, want)
    assert {k.kind for k in cg.report().kernels} == {KernelKind.NUMPY}


def test_complex_and_bool_corners_match_numpy():
    rng = np.random.default_rng(4)
    z = (rng.standard_normal((3, 5)) + 1j * rng.standard_normal((3, 5))).astype(np.complex64)
    b = rng.random((3, 5)) < 0.5
    b[0] = False
    g = rlx.Graph("c")
    zi, bi = g.input("z", Shape((3, 5), DType.C64)), g.input("b", Shape((3, 5), DType.BOOL))
    outs = [
        g.sum(zi, 1),
        g.prod(zi, 0),
        g.mean(zi, 1),
        g.cumsum(zi, 1),
        g.apply(Cumsum(1, exclusive=True, reverse=True), [zi]),
        g.rsqrt(zi),
        g.recip(zi),
        g.exp(zi),
        g.apply(Reduce(ReduceKind.MAX, (1,), False), [bi]),
        g.apply(Reduce(ReduceKind.MIN, (1,), False), [bi]),
        g.where(bi, g.logical_not(bi), bi),  # may run in place of its condition
    ]
    g.set_outputs(outs)
    cg = rlx.Session("cpu").compile(g, RAW)
    got = cg.run({"z": z, "b": b})
    rev_ex = np.flip(np.cumsum(np.flip(z, 1), 1), 1) - z
    want = [
        z.sum(1),
        z.prod(0),
        z.mean(1),
        np.cumsum(z, 1),
        rev_ex,
        1 / np.sqrt(z),
        1 / z,
        np.exp(z),
        b.any(1),
        b.all(1),
        np.where(b, ~b, b),
    ]
    for i, (c, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(c, w, rtol=2e-5, atol=2e-5, err_msg=f"output {i}")
    assert KernelKind.REFERENCE not in {k.kind for k in cg.report().kernels}


def test_float_and_inclusive_nodes_pass_the_corner_attempts() -> None:
    """The corner attempts (integer division, exclusive cumsum) pass float division and
    inclusive cumsums on to the next attempt in the op's order."""
    g = rlx.Graph("back")
    x = g.input("x", (3, 4))
    g.set_outputs([g.cumsum(g.div(x, g.input("y", (3, 4))), 1, reverse=True)])
    cg = rlx.Session("cpu").compile(g, RAW)
    rng = np.random.default_rng(1)
    feed = {"x": rand(rng, (3, 4), "float32"), "y": rand(rng, (3, 4), "float32") + 3}
    (want,) = g.evaluate(feed)
    (got,) = cg.run(feed)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert {k.op: k.kind for k in cg.report().kernels} == {
        "binary": KernelKind.NUMPY,
        "cumsum": KernelKind.NUMPY,
    }
