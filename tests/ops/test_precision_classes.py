"""Every op's precision class (``Op.kind``) is the seed's.

The table below is copied from ``op_kind`` in the seed's ``rlx-compile/src/precision.rs``
(/work/shared/seeds/rlx-compile.precision.rs.txt): seed variant -> rlx mnemonic -> kind.
A variant rlx does not have yet maps to None: its class check is skipped, and
``test_every_seed_op_is_registered`` fails naming it (all 77 must be registered ops, under
the seed's name in snake case or an alias listed in docs/adding_an_op.md, which
``test_the_alias_table_is_complete`` keeps in step with this table). Ops that rlx has and the seed's lists do not name are listed in
``RLX_ONLY`` with the class rlx gives them, so a new built-in op fails this test until
someone classifies it. Then the precision pass is checked to act on the changed classes
(GatedDeltaNet: a reduction, kept f32 by AutoMixedConservative; FusedSwiGLU: elementwise).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import rlx  # noqa: F401  (registers every built-in op)
from rlx.dtype import DType
from rlx.ir.mir import Graph
from rlx.ops import OPS, OpKind
from rlx.passes.precision import AutoMixedPrecision, Precision, PrecisionPolicy

C, R, E, D, B = (
    OpKind.COMPUTE,
    OpKind.REDUCTION,
    OpKind.ELEMENTWISE,
    OpKind.DATA_MOVEMENT,
    OpKind.BOUNDARY,
)

# seed Op variant: (rlx mnemonic or None, the seed's OpKind), in the seed's order
SEED: dict[str, tuple[str | None, OpKind]] = {
    "MatMul": ("matmul", C),
    "FusedMatMulBiasAct": ("fused_matmul_bias_act", C),
    "Conv": ("conv", C),
    "DotGeneral": ("dot_general", C),
    "DenseSolve": ("dense_solve", C),
    "BatchedDenseSolve": ("batched_dense_solve", C),
    "Attention": ("attention", C),
    "FusedTransformerLayer": ("fused_transformer_layer", C),
    "GroupedMatMul": ("grouped_matmul", C),
    "DequantGroupedMatMul": ("dequant_grouped_matmul", C),
    "DequantMoEWeights": ("dequant_moe_weights", C),
    "LoraMatMul": ("lora_matmul", C),
    "DequantMatMul": ("dequant_matmul", C),
    "QMatMul": ("qmatmul", C),
    "QConv2d": ("qconv2d", C),
    "Conv2dBackwardInput": ("conv_backward_data", C),
    "Conv2dBackwardWeight": ("conv_backward_weight", C),
    "AttentionBackward": ("attention_backward", C),
    "LayerNorm": ("layer_norm", R),
    "RmsNorm": ("rms_norm", R),
    "Softmax": ("softmax", R),
    "FusedResidualLN": ("fused_residual_layer_norm", R),
    "FusedResidualRmsNorm": ("fused_residual_rms_norm", R),
    "Reduce": ("reduce", R),
    "Cumsum": ("cumsum", R),
    "Sample": ("sample", R),
    "SelectiveScan": ("selective_scan", R),
    "GatedDeltaNet": ("gated_delta_net", R),
    "SoftmaxCrossEntropyWithLogits": ("softmax_cross_entropy", R),
    "SoftmaxCrossEntropyBackward": ("softmax_cross_entropy_backward", R),
    "LayerNormBackwardInput": ("layer_norm_backward", R),
    "LayerNormBackwardGamma": ("layer_norm_backward_gamma", R),
    "GroupNorm": ("group_norm", R),
    "Activation": ("unary", E),
    "Binary": ("binary", E),
    "FusedSwiGLU": ("fused_swiglu", E),
    "Compare": ("compare", E),
    "Where": ("where", E),
    "ElementwiseRegion": ("elementwise_region", E),
    "Quantize": ("quantize", E),
    "Dequantize": ("dequantize", E),
    "FakeQuantize": ("fake_quantize", E),
    "FakeQuantizeBackward": ("fake_quantize_backward", E),
    "FakeQuantizeLSQ": ("fake_quantize_lsq", E),
    "FakeQuantizeLSQBackwardX": ("fake_quantize_lsq_backward_x", E),
    "FakeQuantizeLSQBackwardScale": ("fake_quantize_lsq_backward_scale", E),
    "ReluBackward": ("relu_backward", E),
    "ActivationBackward": ("activation_backward", E),
    "ComplexNormSq": ("complex_norm_sq", E),
    "ComplexNormSqBackward": ("complex_norm_sq_backward", E),
    "Conjugate": ("conjugate", E),
    "Gather": ("gather", D),
    "Narrow": ("narrow", D),
    "Reshape": ("reshape", D),
    "Transpose": ("transpose", D),
    "Concat": ("concat", D),
    "Expand": ("expand", D),
    "Cast": ("cast", D),
    "Rope": ("rope", D),
    "Pool": ("pool", D),
    "FusedAttentionBlock": ("fused_attention_block", D),
    "TopK": ("topk", D),
    "ScatterAdd": ("scatter_add", D),
    "MaxPool2dBackward": ("max_pool2d_backward", D),
    "ResizeNearest2x": ("resize_nearest_2x", D),
    "AxialRope2d": ("axial_rope_2d", D),
    "Input": ("input", B),
    "Param": ("param", B),
    "Constant": ("constant", B),
    "If": ("if", D),
    "While": ("while", D),
    "Custom": ("custom", C),
    "Scan": ("scan", C),
    "ScanBackward": ("scan_backward", C),
    "ScanBackwardXs": ("scan_backward_xs", C),
    "CustomFn": ("custom_fn", C),
    "Fft": ("fft", C),
}

# rlx ops the seed's lists do not name (the seed would give them its `_ => Compute`
# default), with rlx's class and why. argmax/argmin produce integers, which the precision
# pass never retypes, so their class changes nothing.
RLX_ONLY: dict[str, tuple[OpKind, str]] = {
    "to_nchwc": (D, "a reorder of an image into channel blocks (the layout pass)"),
    "from_nchwc": (D, "the reorder back from channel blocks (the layout pass)"),
    "conv_nchwc": (C, "a conv (like Conv) on channel-blocked activations"),
    "rope_norm": (R, "an RMS norm (a reduction) per head, then the rotation of rope"),
    "norm_add": (R, "an RMS norm (a reduction) and the residual add after it"),
    "argmax": (R, "an index reduction; integer output, never retyped"),
    "argmin": (R, "an index reduction; integer output, never retyped"),
    "dynamic_qmatmul": (C, "an integer GEMM (activations quantized per row), like QMatMul"),
    "dynamic_qbatch_matmul": (C, "a batched integer GEMM of two activations, like QMatMul"),
    "log_softmax": (R, "softmax's log form: the seed's Softmax is a reduction"),
    "pad": (D, "copies values into a larger buffer, like Concat"),
    "slice": (D, "a strided Narrow"),
    "gather_elements": (D, "an element-wise Gather"),
    "scatter_elements": (D, "an element-wise ScatterAdd (or overwrite / mul / max / min)"),
    "gather_nd": (D, "a Gather by index tuples"),
    "scatter_nd": (D, "a ScatterAdd by index tuples"),
    "bitwise": (E, "integer bit operations, elementwise; never retyped (integers)"),
    "bitwise_not": (E, "elementwise integer complement"),
    "trig": (E, "elementwise transcendental functions, like the unary ones"),
    "cumprod": (R, "a running product: Cumsum's multiplicative twin"),
    "softmax_backward": (R, "softmax's vjp: a row reduction and an elementwise pass"),
    "log_softmax_backward": (R, "log-softmax's vjp: a row reduction and an elementwise pass"),
    "bitcast": (D, "a byte copy read as another dtype, like a Reshape of bytes"),
    "shape_of": (D, "reads the input's dims into an i64 vector (ONNX Shape); never retyped"),
    "cache_attention": (C, "attention through a KV cache (its own f32 caches), like Attention"),
    "slot_cache_attention": (C, "cache_attention over one cache slot per token"),
    "dequant_gather": (D, "rows of a packed table decoded to f32, like Gather; never retyped"),
    "stop_gradient": (D, "the identity with a zero derivative (a view), like Reshape"),
    "gather_backward": (D, "gather's adjoint: rows added into zeros, like ScatterAdd"),
    "rms_norm_backward": (R, "rms_norm's vjp (dx or dgamma): row sums, like LayerNormBackward"),
    "attention_jvp": (C, "attention's forward-mode derivative: matmuls, like Attention"),
    "rope_backward": (R, "rope's table gradients: sums over batch and heads"),
    "max_pool_select": (D, "reads the tangent at each window's maximum, like Pool"),
    "pool_backward": (D, "average and 1-D / 3-D max pools' vjp, like MaxPool2dBackward"),
    "assign": (B, "writes a param's storage (state), like the graph's params"),
    "adam_update": (B, "optimizer state update: writes three params' storage, like assign"),
    "barrier": (D, "the identity (a view) that keeps recomputed nodes apart, like Reshape"),
}

BUILTIN = {m: c for m, c in OPS.items() if c.__module__.startswith("rlx.ops.")}
PINNED = [(name, m, k) for name, (m, k) in SEED.items() if m is not None]


@pytest.mark.parametrize(("seed_name", "mnemonic", "kind"), PINNED, ids=[p[0] for p in PINNED])
def test_op_kind_is_the_seeds(seed_name, mnemonic, kind):
    assert mnemonic in OPS, f"the seed's {seed_name} has no rlx op {mnemonic!r}"
    assert OPS[mnemonic].kind is kind, (
        f"{seed_name} ({mnemonic!r}) is {OPS[mnemonic].kind.name} in rlx, "
        f"the seed's precision pass says {kind.name}"
    )


ALIAS_DOC = Path(__file__).resolve().parents[2] / "docs" / "adding_an_op.md"


def snake(name: str) -> str:
    """The seed's CamelCase variant name in snake case (``ReluBackward`` -> ``relu_backward``)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def documented_aliases() -> dict[str, str]:
    """seed variant -> rlx mnemonic, the rows of the alias table in docs/adding_an_op.md."""
    text = ALIAS_DOC.read_text(encoding="utf-8")
    section = text.split("## The seed's op names", 1)[1]
    rows = re.findall(r"^\| (\w+) \| (\w+) \|", section, re.M)
    return {seed: m for seed, m in rows if seed != "seed"}


def test_every_seed_op_is_registered():
    """All 77 op variants the seed's precision pass names are registered rlx ops, under
    the seed's name in snake case or the alias docs/adding_an_op.md documents."""
    assert len(SEED) == 77
    missing = sorted(name for name, (m, _) in SEED.items() if m is None or m not in OPS)
    assert not missing, (
        f"{len(missing)} of the seed's {len(SEED)} ops have no registered rlx op: {missing}"
    )


def test_the_alias_table_is_complete():
    """docs/adding_an_op.md lists exactly the variants whose mnemonic is not their
    snake-case name, each with SEED's mnemonic."""
    doc = documented_aliases()
    want = {name: m for name, (m, _) in SEED.items() if m is not None and m != snake(name)}
    undocumented = sorted(f"{n} -> {m}" for n, m in want.items() if doc.get(n) != m)
    stale = sorted(f"{n} -> {m}" for n, m in doc.items() if want.get(n) != m)
    assert not undocumented, f"aliases missing from {ALIAS_DOC.name}: {undocumented}"
    assert not stale, f"rows of {ALIAS_DOC.name} that SEED does not have: {stale}"


def test_every_builtin_op_is_classified():
    seeded = {m for m, _ in SEED.values() if m is not None}
    unknown = sorted(set(BUILTIN) - seeded - set(RLX_ONLY))
    assert not unknown, (
        f"built-in ops {unknown} are neither in the seed's table nor in RLX_ONLY: "
        "give each its precision class here"
    )
    assert not seeded & set(RLX_ONLY)
    wrong = {m: (OPS[m].kind, k) for m, (k, _) in RLX_ONLY.items() if OPS[m].kind is not k}
    assert not wrong, f"rlx-only ops whose class changed: {wrong}"


def _gdn_graph() -> Graph:
    g = Graph("gdn")
    q, k, v = (g.input(n, (1, 3, 2, 4)) for n in "qkv")
    gate, beta = g.input("g", (1, 3, 2)), g.input("beta", (1, 3, 2))
    g.set_outputs(g.gated_delta_net(q, k, v, gate, beta))
    return g


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        (PrecisionPolicy.AutoMixedConservative, DType.F32),  # reductions stay f32
        (PrecisionPolicy.AutoMixed, DType.F16),
        (PrecisionPolicy.AutoMixedBf16, DType.BF16),
    ],
)
def test_gated_delta_net_runs_at_the_reduction_precision(policy, want):
    out = AutoMixedPrecision(policy).run(_gdn_graph())
    (node,) = [n for n in out.nodes if n.op.mnemonic == "gated_delta_net"]
    assert node.dtype is want


def test_custom_policy_treats_swiglu_as_elementwise_and_gdn_as_reduction():
    g = Graph("g")
    x = g.input("x", (2, 4))
    y = g.fused_swiglu(x, g.param("wg", (4, 3)), g.param("wu", (4, 3)))
    g.set_outputs(g.matmul(y, g.param("w2", (3, 2))))
    pol = PrecisionPolicy.Custom({OpKind.ELEMENTWISE: Precision.BF16})
    out = AutoMixedPrecision(pol).run(g)
    dtypes = {n.op.mnemonic: n.dtype for n in out.nodes if n.op.mnemonic != "cast"}
    assert dtypes["fused_swiglu"] is DType.BF16 and dtypes["matmul"] is DType.F32

    pol = PrecisionPolicy.Custom({OpKind.REDUCTION: Precision.F16})
    out = AutoMixedPrecision(pol).run(_gdn_graph())
    (node,) = [n for n in out.nodes if n.op.mnemonic == "gated_delta_net"]
    assert node.dtype is DType.F16


def test_conservative_gated_delta_net_matches_f32_exactly():
    """Kept in f32 under AutoMixedConservative, the scan gives the f32 result bit for bit
    (in f16 it would not)."""
    g = _gdn_graph()
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal((1, 3, 2, 4)).astype(np.float32) for n in "qkv"}
    feed["g"] = -np.abs(rng.standard_normal((1, 3, 2))).astype(np.float32)
    feed["beta"] = rng.uniform(0, 1, (1, 3, 2)).astype(np.float32)
    want = g.evaluate(feed)[0]
    got = AutoMixedPrecision(PrecisionPolicy.AutoMixedConservative).run(g).evaluate(feed)[0]
    np.testing.assert_array_equal(got, want)
