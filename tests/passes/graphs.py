"""Graphs the pass tests share: an MLP, a pre-norm transformer block with spelled-out
attention, random params/inputs, and a hypothesis strategy for random graphs that
exercise every cleanup pass and fusion (identities, duplicates, transpose/reshape
pairs, matmul + bias + activation, broadcasts, compares)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from hypothesis import strategies as st

from rlx.ir.mir import Graph, NodeId
from rlx.ops.elementwise import BinaryKind, UnaryKind


def random_params(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """N(0, 1/fan_in) matrices, vectors N(0, 0.1) (gammas around 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in g.param_nodes():
        dims = n.shape.concrete()
        a = rng.standard_normal(dims)
        if len(dims) >= 2:
            a /= math.sqrt(dims[-2])
        elif n.op.name.endswith("gamma"):  # type: ignore[attr-defined]
            a = 1.0 + 0.1 * a
        else:
            a *= 0.1
        out[n.op.name] = a.astype(np.float32)  # type: ignore[attr-defined]
    return out


def random_inputs(g: Graph, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        n.op.name: rng.standard_normal(n.shape.concrete()).astype(n.dtype.np)
        for n in g.input_nodes()
    }  # type: ignore[attr-defined]


def mlp(batch: int = 4, dims: tuple[int, ...] = (16, 32, 32, 8)) -> Graph:
    """``x -> [linear -> gelu] * (len(dims) - 2) -> linear``."""
    g = Graph("mlp")
    x = g.input("x", (batch, dims[0]))
    for k, (i, o) in enumerate(zip(dims[:-1], dims[1:])):
        x = g.linear(x, g.param(f"w{k}", (i, o)), g.param(f"b{k}", (o,)))
        if k < len(dims) - 2:
            x = g.gelu(x)
    g.set_outputs([x])
    return g


def attention_chain(
    g: Graph, q: NodeId, k: NodeId, v: NodeId, b: int, s: int, h: int, d: int, mask: NodeId | None
) -> NodeId:
    """Spelled-out 4-D multi-head attention on packed [B,S,H*D] q, k, v."""
    qh = g.transpose(g.reshape(q, (b, s, h, d)), (0, 2, 1, 3))
    kt = g.transpose(g.reshape(k, (b, s, h, d)), (0, 2, 3, 1))
    vh = g.transpose(g.reshape(v, (b, s, h, d)), (0, 2, 1, 3))
    scores = g.mul(g.matmul(qh, kt), 1.0 / math.sqrt(d))
    if mask is not None:
        scores = g.add(scores, mask)
    ctx = g.matmul(g.softmax(scores, -1), vh)
    return g.reshape(g.transpose(ctx, (0, 2, 1, 3)), (b, s, h * d))


def transformer_block(b: int = 2, s: int = 6, h: int = 2, d: int = 4, ffn: int = 16) -> Graph:
    """Pre-norm block: layer_norm -> q/k/v linears -> attention (additive padding mask
    input [B,1,1,S]) -> o proj -> residual -> rms_norm -> SwiGLU -> residual ->
    final layer_norm (its residual add has no other user, so it fuses)."""
    hid = h * d
    g = Graph("block")
    x = g.input("x", (b, s, hid))
    mask = g.input("mask", (b, 1, 1, s))
    hn = g.layer_norm(x, g.param("ln1.gamma", (hid,)), g.param("ln1.beta", (hid,)))
    q, k, v = (
        g.linear(hn, g.param(f"{n}.w", (hid, hid)), g.param(f"{n}.b", (hid,))) for n in "qkv"
    )
    a = attention_chain(g, q, k, v, b, s, h, d, mask)
    x = g.add(x, g.matmul(a, g.param("o.w", (hid, hid))))
    hn = g.rms_norm(x, g.param("ln2.gamma", (hid,)))
    gate = g.silu(g.matmul(hn, g.param("gate.w", (hid, ffn))))
    up = g.matmul(hn, g.param("up.w", (hid, ffn)))
    y = g.matmul(g.mul(gate, up), g.param("down.w", (ffn, hid)))
    out = g.layer_norm(g.add(x, y), g.param("ln3.gamma", (hid,)), g.param("ln3.beta", (hid,)))
    g.set_outputs([out])
    return g


def block_inputs(g: Graph, seed: int = 1) -> dict[str, np.ndarray]:
    """Inputs for :func:`transformer_block`: x ~ N(0,1), the last key of batch 0 masked."""
    ins = random_inputs(g, seed)
    m = np.zeros(ins["mask"].shape, np.float32)
    m[0, ..., -1] = -1e9
    ins["mask"] = m
    return ins


_SAFE_UNARY = (
    UnaryKind.RELU,
    UnaryKind.TANH,
    UnaryKind.SIGMOID,
    UnaryKind.NEG,
    UnaryKind.ABS,
    UnaryKind.SIN,
    UnaryKind.SILU,
)
_BIN = (BinaryKind.ADD, BinaryKind.SUB, BinaryKind.MUL, BinaryKind.MAX)


@st.composite
def random_graphs(draw: Callable, max_ops: int = 14) -> Graph:
    """A random DAG over inputs a[3,4], r[3,1], c[4] and params w[4,4], bias[4]. Main
    values are [3,4]; steps add identities, duplicates, transpose/reshape round trips,
    casts, matmul + bias (+ act) and compare/where, so every pass has work."""
    g = Graph("random")
    a = g.input("a", (3, 4))
    r = g.input("r", (3, 1))
    c = g.input("c", (4,))
    w = g.param("w", (4, 4))
    bias = g.param("bias", (4,))
    main = [a]
    side = [r, c]
    n_ops = draw(st.integers(2, max_ops))
    for _ in range(n_ops):
        x = draw(st.sampled_from(main[-3:]))  # mostly deep chains, some branching
        step = draw(st.integers(0, 10))
        if step == 0:
            y = g.unary(draw(st.sampled_from(_SAFE_UNARY)), x)
        elif step == 1:
            other = draw(st.sampled_from(main + side))
            y = g.binary(draw(st.sampled_from(_BIN)), x, other)
        elif step == 2:
            y = g.mul(x, 1.0) if draw(st.booleans()) else g.add(x, 0.0)
        elif step == 3:
            y = g.neg(g.neg(x))
        elif step == 4:
            y = g.transpose(g.transpose(x, (1, 0)), (1, 0))
        elif step == 5:
            y = g.reshape(g.reshape(x, (12,)), (3, 4))
        elif step == 6:
            y = (
                g.cast(g.cast(x, "f32"), "f32")
                if draw(st.booleans())
                else g.cast(g.cast(x, "f16"), "f32")
            )
        elif step == 7:  # a duplicate of an existing op: CSE food
            y = g.tanh(x)
            g.tanh(x)
        elif step == 8:
            y = g.linear(x, w, bias)
            if draw(st.booleans()):
                y = g.relu(y)
        elif step == 9:
            y = g.where(g.gt(x, 0.0), x, g.mul(x, 0.5))
        else:
            y = g.add(g.mul(x, g.sigmoid(x)), g.exp(g.constant(np.float32(0.5))))
        main.append(y)
    outs = [main[-1]]
    if len(main) > 2 and draw(st.booleans()):
        outs.append(draw(st.sampled_from(main[1:-1])))
    g.set_outputs(outs)
    return g


def random_graph_values(
    g: Graph, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    return random_inputs(g, seed), random_params(g, seed)
