"""Imported graphs reach rlx's fused kernels: an opset-13 block written the way exporters
write it (GELU through Erf, layer norm through ReduceMean / Pow / Sqrt, attention as
MatMul + Mul + Add(mask) + Softmax + MatMul with Reshapes / Transposes, Gemm with
transB) compiles to the SGEMM with a GELU epilogue, the residual layer norm and the
native attention, and matches a NumPy formula of the block."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import rlx
from rlx.ops.elementwise import UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct, FusedResidualLN
from rlx.ops.nn import Attention

B, S, H, D, F = 2, 8, 2, 8, 32
E = H * D
_erf = np.vectorize(math.erf)


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    w = {}
    for n in ("wq", "wk", "wv"):
        w[n] = (rng.standard_normal((E, E)) / 4).astype(np.float32)
    w["w1"] = (rng.standard_normal((E, F)) / 4).astype(np.float32)
    w["wht"] = (rng.standard_normal((F, E)) / 4).astype(np.float32)  # the head's Gemm, transB
    w["bh"] = rng.standard_normal(F).astype(np.float32) * 0.1
    w["b1"] = rng.standard_normal(F).astype(np.float32) * 0.1
    w["w2"] = (rng.standard_normal((F, E)) / 6).astype(np.float32)
    w["gamma"] = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)
    w["beta"] = (0.1 * rng.standard_normal(E)).astype(np.float32)
    return w


def _gelu(mk, x: str, y: str) -> list:  # noqa: ANN001
    """GELU as torch.onnx writes it before opset 20."""
    return [
        mk("Div", [x, "sqrt2"], [f"{x}_0"]),
        mk("Erf", [f"{x}_0"], [f"{x}_1"]),
        mk("Add", [f"{x}_1", "one"], [f"{x}_2"]),
        mk("Mul", [x, f"{x}_2"], [f"{x}_3"]),
        mk("Mul", [f"{x}_3", "half"], [y]),
    ]


def _model(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    c = {
        "sqrt2": np.float32(math.sqrt(2)),
        "one": np.float32(1),
        "half": np.float32(0.5),
        "two": np.float32(2),
        "eps": np.float32(1e-12),
        "scale": np.float32(1 / math.sqrt(D)),
        "heads": np.array([B, S, H, D], np.int64),
        "back": np.array([B, S, E], np.int64),
    }
    inits = [numpy_helper.from_array(v, k) for k, v in {**w, **c}.items()]
    mk = helper.make_node
    nodes = []
    for n in ("q", "k", "v"):
        nodes += [
            mk("MatMul", ["x", f"w{n}"], [f"{n}0"]),
            mk("Reshape", [f"{n}0", "heads"], [f"{n}1"]),
        ]
    nodes += [
        mk("Transpose", ["q1"], ["qh"], perm=[0, 2, 1, 3]),
        mk("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        mk("Transpose", ["v1"], ["vh"], perm=[0, 2, 1, 3]),
        mk("MatMul", ["qh", "kt"], ["s0"]),
        mk("Mul", ["s0", "scale"], ["s1"]),
        mk("Add", ["s1", "mask"], ["s2"]),
        mk("Softmax", ["s2"], ["p"], axis=-1),
        mk("MatMul", ["p", "vh"], ["o0"]),
        mk("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        mk("Reshape", ["o1", "back"], ["att"]),
        mk("MatMul", ["att", "w1"], ["h"]),
        mk("Add", ["h", "b1"], ["h0"]),
        *_gelu(mk, "h0", "g4"),
        mk("MatMul", ["g4", "w2"], ["f1"]),
        mk("Add", ["f1", "x"], ["r"]),
        mk("ReduceMean", ["r"], ["m"], axes=[-1]),
        mk("Sub", ["r", "m"], ["d"]),
        mk("Pow", ["d", "two"], ["d2"]),
        mk("ReduceMean", ["d2"], ["var"], axes=[-1]),
        mk("Add", ["var", "eps"], ["ve"]),
        mk("Sqrt", ["ve"], ["sd"]),
        mk("Div", ["d", "sd"], ["n"]),
        mk("Mul", ["n", "gamma"], ["n1"]),
        mk("Add", ["n1", "beta"], ["y"]),
        mk("ReduceMean", ["y"], ["pooled"], axes=[1], keepdims=0),
        mk("Gemm", ["pooled", "wht", "bh"], ["z0"], transB=1),
        *_gelu(mk, "z0", "z"),
    ]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "block",
        [
            helper.make_tensor_value_info("x", f32, [B, S, E]),
            helper.make_tensor_value_info("mask", f32, [B, 1, 1, S]),
        ],
        [
            helper.make_tensor_value_info("y", f32, [B, S, E]),
            helper.make_tensor_value_info("z", f32, [B, F]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _numpy_gelu(h: np.ndarray) -> np.ndarray:
    return 0.5 * h * (1 + _erf(h / math.sqrt(2)))


def _numpy_block(w: dict[str, np.ndarray], x: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    x = x.astype(np.float64)

    def heads(t: np.ndarray) -> np.ndarray:
        return t.reshape(B, S, H, D).transpose(0, 2, 1, 3)

    q, k, v = (heads(x @ w[n]) for n in ("wq", "wk", "wv"))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D) + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    att = (p @ v).transpose(0, 2, 1, 3).reshape(B, S, E)
    r = _numpy_gelu(att @ w["w1"] + w["b1"]) @ w["w2"] + x
    d = r - r.mean(-1, keepdims=True)
    y = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-12) * w["gamma"] + w["beta"]
    return [y, _numpy_gelu(y.mean(1) @ w["wht"].T + w["bh"])]


def test_opset13_block_reaches_fused_kernels():
    rng = np.random.default_rng(0)
    w = _weights(rng)
    m = rlx.onnx.load(_model(w))
    compiled = m.compile()
    ops = [n.op for n in compiled.graph.nodes]
    assert any(isinstance(o, Attention) for o in ops)
    gelu = [o for o in ops if isinstance(o, FusedMatMulBiasAct) and o.act is UnaryKind.GELU]
    assert len(gelu) == 2  # the block's MatMul + Add and the head's Gemm
    assert any(isinstance(o, FusedResidualLN) for o in ops)
    x = rng.standard_normal((B, S, E)).astype(np.float32)
    mask = np.zeros((B, 1, 1, S), np.float32)
    mask[1, ..., S - 3 :] = -1e4
    got = compiled.run({"x": x, "mask": mask})
    # the unfused import, run by the reference interpreter, agrees too
    refs = m.graph.evaluate({"x": x, "mask": mask}, dict(m.params))
    for y, want, ref in zip(got, _numpy_block(w, x, mask), refs, strict=True):
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
