"""Auto mixed precision and cast elimination: the seed's two tests, the policy table,
cast counts and placement per policy, int/bool ops untouched, bf16/f16 accuracy
against f32 (reference interpreter and the compiled CPU path).

Documented tolerance (max |low - f32| / max |f32| over the output): 5e-3 for the f16
policies and 3e-2 for bf16, on an MLP and a transformer block."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.ir.mir import Graph
from rlx.ops.base import OpKind
from rlx.ops.core import Constant, Input, Param
from rlx.ops.elementwise import Cast
from rlx.ops.fused import ElementwiseRegion
from rlx.ops.linalg import MatMul
from rlx.ops.norm import LayerNorm, RmsNorm
from rlx.ops.quant import Dequantize
from rlx.ops.reduce import Softmax
from rlx.passes.cast_elim import CastElimination, exact
from rlx.passes.dce import DeadCodeElimination
from rlx.passes.precision import (
    AutoMixedPrecision,
    CastConfig,
    Precision,
    PrecisionPolicy,
    resolve_policy,
)
from rlx.passes.report import FusionReport

from .graphs import (
    block_inputs,
    mlp,
    random_graph_values,
    random_graphs,
    random_inputs,
    random_params,
    transformer_block,
)

P = PrecisionPolicy
LOW_POLICIES = [P.AlwaysF16, P.AutoMixedConservative, P.AutoMixed, P.AutoMixedBf16]
TOL = {DType.F16: 5e-3, DType.BF16: 3e-2}


def low_dtype(policy: PrecisionPolicy) -> DType:
    return policy.precision_for(OpKind.COMPUTE).dtype


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def seed_graph() -> Graph:
    g = Graph("test")
    x = g.input("x", (2, 4))
    w = g.param("w", (4, 3))
    g.set_outputs([g.matmul(x, w)])
    return g


# ---- the seed's tests -------------------------------------------------------------


def test_always_f32_is_noop():
    out = AutoMixedPrecision(P.AlwaysF32).run(seed_graph())
    assert len(out) == 3  # input, param, matmul: no casts


def test_auto_mixed_inserts_casts_at_boundary():
    amp = AutoMixedPrecision(P.AutoMixed)
    out = amp.run(seed_graph())
    # input(f32), param(f32), cast x -> f16, cast w -> f16, matmul(f16), cast -> f32
    assert len(out) == 6 and amp.casts_inserted == 3
    final = out.nodes[out.outputs[0]]
    assert final.op == Cast(DType.F32)
    (mm,) = [n for n in out.nodes if isinstance(n.op, MatMul)]
    assert mm.dtype is DType.F16
    assert [c.out_dtype for _, c in amp.cast_sites] == [DType.F16, DType.F16, DType.F32]


# ---- policies -----------------------------------------------------------------------

_SEED_TABLE = {
    # policy: (compute, reduction, elementwise, data movement)
    "AlwaysF32": ("F32", "F32", "F32", "F32"),
    "AlwaysF16": ("F16", "F16", "F16", "F16"),
    "AutoMixedConservative": ("F16", "F32", "F16", "F16"),
    "AutoMixed": ("F16", "F16", "F16", "F16"),
    "AutoMixedBf16": ("BF16", "BF16", "BF16", "BF16"),
}


@pytest.mark.parametrize("name", list(_SEED_TABLE))
def test_policy_table_matches_the_seed(name):
    policy = getattr(PrecisionPolicy, name)
    kinds = (OpKind.COMPUTE, OpKind.REDUCTION, OpKind.ELEMENTWISE, OpKind.DATA_MOVEMENT)
    assert tuple(policy.precision_for(k).name for k in kinds) == _SEED_TABLE[name]
    assert policy.precision_for(OpKind.BOUNDARY) is Precision.F32
    assert policy.is_f32 is (name == "AlwaysF32")
    assert hash(policy) == hash(getattr(PrecisionPolicy, name))  # frozen, hashable


def test_custom_policy_and_bad_values():
    pol = P.Custom({OpKind.COMPUTE: Precision.BF16})
    assert pol.precision_for(OpKind.COMPUTE) is Precision.BF16
    assert pol.precision_for(OpKind.ELEMENTWISE) is Precision.F32
    assert pol == P.Custom({OpKind.COMPUTE: Precision.BF16}) and str(pol) == "custom(compute=bf16)"
    with pytest.raises(CompileError, match="key 'compute' is not an OpKind"):
        P.Custom({"compute": Precision.BF16})
    with pytest.raises(CompileError, match="is not a Precision"):
        P.Custom({OpKind.COMPUTE: "bf16"})
    with pytest.raises(CompileError, match="options.precision must be a PrecisionPolicy"):
        resolve_policy("bf16")
    assert resolve_policy(None) is P.AlwaysF32


def test_cast_config():
    c = CastConfig.plain(DType.BF16)
    assert c.is_noop(DType.BF16) and not c.is_noop(DType.F32)
    assert not CastConfig(DType.BF16, (1, 128)).is_noop(DType.BF16)


# ---- cast count and placement ---------------------------------------------------------


def check_placement(orig: Graph, out: Graph) -> None:
    """Boundaries and outputs keep their dtypes, no no-op or duplicate casts."""
    out.verify()
    was = {(type(n.op), n.op.name): n.dtype for n in orig.nodes if isinstance(n.op, (Input, Param))}
    for n in out.nodes:
        if isinstance(n.op, (Input, Param)):
            assert n.dtype is was[(type(n.op), n.op.name)]
    assert [out.nodes[o].dtype for o in out.outputs] == [orig.nodes[o].dtype for o in orig.outputs]
    seen = set()
    for n in out.nodes:
        if isinstance(n.op, Cast):
            assert out.nodes[n.inputs[0]].dtype is not n.dtype
            assert (n.inputs[0], n.dtype) not in seen
            seen.add((n.inputs[0], n.dtype))


@pytest.mark.parametrize("policy", LOW_POLICIES, ids=str)
def test_mlp_casts_per_policy(policy):
    g = mlp()
    amp = AutoMixedPrecision(policy)
    out = amp.run(g)
    check_placement(g, out)
    # x, 3 weights and 3 biases cast down once each; the output cast back up
    assert amp.casts_inserted == 8
    low = low_dtype(policy)
    for n in out.nodes:
        if not isinstance(n.op, (Input, Param, Cast)) and n.id not in out.outputs:
            assert n.dtype is low, n


@pytest.mark.parametrize(
    ("policy", "casts", "narrowed"),
    [
        (P.AlwaysF16, 18, 30),
        (P.AutoMixedConservative, 18, 26),
        (P.AutoMixed, 18, 30),
        (P.AutoMixedBf16, 18, 30),
        (P.Custom({OpKind.COMPUTE: Precision.BF16}), 24, 9),
    ],
    ids=str,
)
def test_block_casts_per_policy(policy, casts, narrowed):
    g = transformer_block()
    amp = AutoMixedPrecision(policy)
    out = amp.run(g)
    check_placement(g, out)
    assert (amp.casts_inserted, amp.retyped) == (casts, narrowed)
    norms = [n for n in out.nodes if isinstance(n.op, (LayerNorm, RmsNorm, Softmax))]
    mms = [n for n in out.nodes if isinstance(n.op, MatMul)]
    red = policy.precision_for(OpKind.REDUCTION).dtype
    assert len(norms) == 4 and all(n.dtype is red for n in norms)
    assert all(out.nodes[n.inputs[0]].dtype is red for n in norms)  # casts sit before them
    assert all(n.dtype is policy.precision_for(OpKind.COMPUTE).dtype for n in mms)


def test_int_and_bool_ops_keep_their_dtypes():
    g = Graph("ints")
    x = g.input("x", (3, 5))
    pos = g.gt(x, 0.0)
    y = g.where(pos, x, g.mul(x, 0.1))
    idx = g.argmax(y, -1)
    g.set_outputs([y, idx, pos])
    amp = AutoMixedPrecision(P.AutoMixedBf16)
    out = amp.run(g)
    check_placement(g, out)
    by = {type(n.op).__name__: n for n in out.nodes}
    assert by["Compare"].dtype is DType.BOOL and by["ArgMax"].dtype is DType.I64
    assert out.nodes[by["ArgMax"].inputs[0]].dtype is DType.F32  # argmax reads f32
    assert out.nodes[by["Compare"].inputs[0]].dtype is DType.F32  # the compare too
    assert by["Where"].dtype is DType.BF16
    assert amp.constants_converted == 1  # 0.1 converted at compile time; 0.0 read at f32
    ins = {"x": np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)}
    ref, got = g.evaluate(ins), out.evaluate(ins)
    np.testing.assert_array_equal(got[2], ref[2])
    assert rel_err(got[0], ref[0]) < TOL[DType.BF16]


def test_op_with_fixed_output_dtype_stays_f32():
    g = Graph("dq")
    q = g.input("q", (4,), DType.I8)
    d = g.apply(Dequantize(None, (0.5,), (0,)), [q])
    g.set_outputs([g.relu(d)])
    amp = AutoMixedPrecision(P.AutoMixed)
    out = amp.run(g)
    check_placement(g, out)
    assert any(k.startswith(f"%{d} dequantize (") and "produces f32" in k for k in amp.kept)
    assert "kept f32" in amp.notes[-1]
    ins = {"q": np.array([-3, 0, 2, 9], np.int8)}
    np.testing.assert_allclose(out.evaluate(ins)[0], g.evaluate(ins)[0])


@given(random_graphs())
def test_placement_on_random_graphs(g):
    ins, ps = random_graph_values(g)
    ref = g.evaluate(ins, ps)
    for policy in (P.AutoMixed, P.AutoMixedBf16):
        out = AutoMixedPrecision(policy).run(g)
        check_placement(g, out)
        for w, o in zip(ref, out.evaluate(ins, ps)):
            tol = TOL[low_dtype(policy)] * 4  # deeper random chains: a looser bound
            assert np.max(np.abs(o - w)) <= tol * max(1.0, float(np.max(np.abs(w))))


def test_elementwise_region_bodies_are_rewritten():
    from .test_fusion import fuse_all

    g = Graph("region")
    x = g.input("x", (4, 8))
    y = g.mul(g.tanh(g.add(x, 1.0)), 0.5)
    g.set_outputs([g.sum(y, -1)])
    fused, _ = fuse_all(g)
    amp = AutoMixedPrecision(P.AutoMixedBf16)
    out = amp.run(fused)
    check_placement(g, out)
    (r,) = [n for n in out.nodes if isinstance(n.op, ElementwiseRegion)]
    assert r.dtype is DType.BF16
    body = r.op.body
    assert all(n.dtype is DType.BF16 for n in body.nodes)  # inputs and constants too
    ins = {"x": np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)}
    assert rel_err(out.evaluate(ins)[0], g.evaluate(ins)[0]) < TOL[DType.BF16]


# ---- accuracy ------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", LOW_POLICIES, ids=str)
@pytest.mark.parametrize("model", ["mlp", "block"])
def test_low_precision_within_tolerance_of_f32(policy, model):
    g = mlp() if model == "mlp" else transformer_block()
    ins = random_inputs(g) if model == "mlp" else block_inputs(g)
    ps = random_params(g)
    out = DeadCodeElimination().run(CastElimination().run(AutoMixedPrecision(policy).run(g)))
    (ref,), (got,) = g.evaluate(ins, ps), out.evaluate(ins, ps)
    assert got.dtype == np.float32
    err = rel_err(got, ref)
    assert 0 < err < TOL[low_dtype(policy)]


def test_compiled_cpu_path_bf16_and_f16():
    from rlx.options import CompileOptions, VerifyMode
    from rlx.runtime.session import Session

    g = transformer_block()
    ins, ps = block_inputs(g), random_params(g)
    (ref,) = g.evaluate(ins, ps)
    for policy, freeze in ((P.AutoMixedBf16, False), (P.AutoMixed, False), (P.AutoMixedBf16, True)):
        opts = CompileOptions(
            precision=policy, verify=VerifyMode.EACH_PASS, use_cache=False, freeze_params=freeze
        )
        cg = Session("cpu").compile(g, opts, params=ps)
        (got,) = cg.run(ins)
        assert got.dtype == np.float32
        assert any(n.dtype is low_dtype(policy) for n in cg.graph.nodes)
        assert rel_err(got, ref) < TOL[low_dtype(policy)]


# ---- cast elimination ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dst", "ok"),
    [
        ("f16", "f32", True),
        ("bf16", "f32", True),
        ("f32", "bf16", False),
        ("f32", "f16", False),
        ("f16", "bf16", False),
        ("bf16", "f16", False),
        ("f32", "f64", True),
        ("f8e4m3", "f16", True),
        ("f8e5m2", "bf16", True),
        ("f8e4m3", "f8e5m2", False),
        ("i8", "bf16", True),
        ("u8", "bf16", True),
        ("i16", "bf16", False),
        ("i16", "f32", True),
        ("i32", "f32", False),
        ("i32", "f64", True),
        ("i8", "i32", True),
        ("u32", "i32", False),
        ("u32", "i64", True),
        ("bool", "f16", True),
        ("f32", "i32", False),
        ("f32", "c64", True),
        ("c64", "f32", False),
        ("i32", "bool", False),
    ],
)
def test_exact_casts(src, dst, ok):
    assert exact(DType(src), DType(dst)) is ok


def test_cast_elimination_pairs():
    g = Graph("casts")
    h = g.input("h", (4,), DType.F16)
    x = g.input("x", (4,))
    a = g.cast(g.cast(h, "f32"), "f16")  # exact round trip: h
    b = g.cast(g.cast(x, "bf16"), "f32")  # rounds: kept
    c = g.cast(g.cast(h, "f32"), "bf16")  # -> one cast f16 -> bf16
    d = g.cast(x, "f32")  # no-op
    g.set_outputs([a, b, c, d])
    p = CastElimination()
    out = DeadCodeElimination().run(p.run(g))
    assert out.outputs[0] == 0 and out.outputs[3] == 1
    b_node, c_node = out.nodes[out.outputs[1]], out.nodes[out.outputs[2]]
    assert b_node.op == Cast(DType.F32) and out.nodes[b_node.inputs[0]].op == Cast(DType.BF16)
    assert c_node.op == Cast(DType.BF16) and c_node.inputs == (0,)
    assert p.notes == [
        "removed 2 casts (no-ops or exact round trips)",
        "collapsed 1 cast pairs into one cast",
    ]
    ins = {
        "h": np.array([1.5, -2.25, 3e-3, 6e4], np.float16),
        "x": np.array([1.1, 2.2, 3.3, 1e-3], np.float32),
    }
    for w, o in zip(g.evaluate(ins), out.evaluate(ins)):
        np.testing.assert_array_equal(o, w)


def test_fusion_report_is_separate_from_precision():
    assert FusionReport().summary() == "fusions: none; near misses: 0"


def test_constants_keep_their_value_bits():
    g = Graph("c")
    x = g.input("x", (2,))
    g.set_outputs([g.add(x, g.constant(np.array([0.1, 3.0], np.float32)))])
    out = AutoMixedPrecision(P.AutoMixedBf16).run(g)
    (c,) = [n for n in out.nodes if isinstance(n.op, Constant) and n.dtype is DType.BF16]
    np.testing.assert_array_equal(
        c.op.value.array().astype(np.float32),
        np.array([0.1, 3.0], np.float32).astype(c.dtype.np).astype(np.float32),
    )


@given(random_graphs())
def test_cast_elimination_is_exact_after_amp(g):
    ins, ps = random_graph_values(g)
    amp = AutoMixedPrecision(P.AutoMixed).run(g)
    out = CastElimination().run(amp)
    out.verify()
    for w, o in zip(amp.evaluate(ins, ps), out.evaluate(ins, ps)):
        np.testing.assert_array_equal(o, w)
    for n in out.nodes:
        if isinstance(n.op, Cast):
            src = out.nodes[n.inputs[0]]
            assert src.dtype is not n.dtype
            if isinstance(src.op, Cast):  # a kept pair: its inner cast rounds
                assert not exact(out.nodes[src.inputs[0]].dtype, src.dtype)
