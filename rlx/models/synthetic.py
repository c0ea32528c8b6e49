"""Synthetic transformer graphs. In: sizes (ints, or Sym for batch/seq). Out: MIR graphs
with named params, built from primitives, for benchmarks and end-to-end tests.

* :func:`encoder`: a BERT/MiniLM-shaped post-norm encoder (linear q/k/v with bias,
  softmax attention, residual + layer_norm, gelu FFN). Input ``x`` f32[batch, seq, hidden],
  or ``input_ids`` i64[batch, seq] looked up in an embedding when ``vocab`` is given.
* :func:`decoder`: a Llama-shaped pre-norm decoder (rms_norm, optional rotary embedding,
  causal attention with optional grouped KV heads, SwiGLU MLP, final rms_norm, optional
  LM head).
* :func:`random_params` / :func:`random_inputs`: small random values for every param /
  input of a graph (deterministic in ``seed``); :func:`rope_tables`: the real rotary
  tables for the decoder's ``rope_cos`` / ``rope_sin`` inputs.

Attention comes in two forms: ``fused_attention=False`` spells it out (reshape,
transpose, matmul, scale, softmax, matmul), which materialises the
[batch, heads, seq, seq] scores; ``True`` uses the ``attention`` op.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.nn import MaskKind
from rlx.shape import Dim, Sym

__all__ = ["encoder", "decoder", "random_params", "random_inputs", "rope_tables"]


def _declare(g: Graph, *dims: Dim) -> None:
    """Declare the symbols of ``dims`` on ``g`` (bounds [1, inf)) unless already declared."""
    for d in dims:
        if isinstance(d, Sym):
            for name in d.names:
                if name not in g.sym_bounds:
                    g.sym(name)
        elif not isinstance(d, int) or d < 1:
            raise ShapeError(f"batch/seq must be an int >= 1 or a Sym, got {d!r}")


def _check_heads(what: str, hidden: int, heads: int, kv_heads: int | None = None) -> int:
    if heads < 1 or hidden % heads:
        raise ShapeError(f"{what}: hidden={hidden} is not divisible by heads={heads}")
    kv = heads if kv_heads is None else kv_heads
    if kv < 1 or heads % kv:
        raise ShapeError(f"{what}: heads={heads} is not a multiple of kv_heads={kv}")
    return hidden // heads


def _embed(g: Graph, batch: Dim, seq: Dim, hidden: int, vocab: int | None) -> NodeId:
    """``x`` [batch, seq, hidden], or an embedding lookup of ``input_ids``."""
    if vocab is None:
        return g.input("x", (batch, seq, hidden))
    ids = g.input("input_ids", (batch, seq), DType.I64)
    table = g.param("embed.weight", (vocab, hidden))
    return g.gather(table, ids, 0)


def _linear(g: Graph, x: NodeId, name: str, n_in: int, n_out: int) -> NodeId:
    """``x @ <name>.weight[n_in, n_out] + <name>.bias[n_out]`` with fresh params."""
    w = g.param(f"{name}.weight", (n_in, n_out))
    return g.linear(x, w, g.param(f"{name}.bias", (n_out,)))


def _explicit_attention(
    g: Graph,
    q: NodeId,
    k: NodeId,
    v: NodeId,
    batch: Dim,
    seq: Dim,
    heads: int,
    hd: int,
    kv_heads: int,
    mask: NodeId | None,
) -> NodeId:
    """softmax(q k^T / sqrt(hd) [+ mask]) v over grouped heads: q is viewed as
    [B, kv, heads/kv, S, hd] and k, v as [B, kv, 1, S, hd], so matmul broadcasting shares
    each KV head with its group (plain multi-head attention when kv == heads)."""
    rep = heads // kv_heads
    qh = g.transpose(g.reshape(q, (batch, seq, kv_heads, rep, hd)), (0, 2, 3, 1, 4))
    kt = g.transpose(g.reshape(k, (batch, seq, kv_heads, 1, hd)), (0, 2, 3, 4, 1))
    vh = g.transpose(g.reshape(v, (batch, seq, kv_heads, 1, hd)), (0, 2, 3, 1, 4))
    scores = g.mul(g.matmul(qh, kt), 1.0 / math.sqrt(hd))
    if mask is not None:
        scores = g.add(scores, mask)
    ctx = g.matmul(g.softmax(scores, -1), vh)  # [B, kv, rep, S, hd]
    return g.reshape(g.transpose(ctx, (0, 3, 1, 2, 4)), (batch, seq, heads * hd))


def encoder(
    layers: int = 6,
    hidden: int = 384,
    heads: int = 12,
    ffn: int = 1536,
    seq: Dim = 128,
    batch: Dim = 1,
    vocab: int | None = None,
    *,
    fused_attention: bool = False,
    eps: float = 1e-12,
) -> Graph:
    """A MiniLM/BERT-shaped encoder (defaults: all-MiniLM-L6-v2 sizes) returning the
    last hidden state [batch, seq, hidden]. With ``vocab`` the input is ``input_ids``
    (plus a learned position table when ``seq`` is static)."""
    hd = _check_heads("encoder", hidden, heads)
    g = Graph(f"encoder_l{layers}_h{hidden}")
    _declare(g, batch, seq)
    x = _embed(g, batch, seq, hidden, vocab)
    if vocab is not None:
        if isinstance(seq, int):
            x = g.add(x, g.param("embed.position", (seq, hidden)))
        x = g.layer_norm(
            x, g.param("embed.ln.gamma", (hidden,)), g.param("embed.ln.beta", (hidden,)), eps
        )
    for i in range(layers):
        p = f"layer{i}"
        q, k, v = (_linear(g, x, f"{p}.attn.{n}", hidden, hidden) for n in "qkv")
        if fused_attention:
            a = g.attention(q, k, v, heads, hd)
        else:
            a = _explicit_attention(g, q, k, v, batch, seq, heads, hd, heads, None)
        x = g.add(x, _linear(g, a, f"{p}.attn.o", hidden, hidden))
        x = g.layer_norm(
            x, g.param(f"{p}.ln1.gamma", (hidden,)), g.param(f"{p}.ln1.beta", (hidden,)), eps
        )
        h = g.gelu(_linear(g, x, f"{p}.ffn.up", hidden, ffn))
        x = g.add(x, _linear(g, h, f"{p}.ffn.down", ffn, hidden))
        x = g.layer_norm(
            x, g.param(f"{p}.ln2.gamma", (hidden,)), g.param(f"{p}.ln2.beta", (hidden,)), eps
        )
    g.set_outputs([x])
    return g


def decoder(
    layers: int = 24,
    hidden: int = 384,
    heads: int = 6,
    ffn: int = 1024,
    seq: Dim = 128,
    batch: Dim = 1,
    vocab: int | None = None,
    *,
    kv_heads: int | None = None,
    rope: bool = True,
    fused_attention: bool = False,
    eps: float = 1e-6,
) -> Graph:
    """A Llama-shaped decoder over a full sequence (prefill) returning the final hidden
    state [batch, seq, hidden], or logits [batch, seq, vocab] when ``vocab`` is given.

    With ``rope`` the graph takes inputs ``rope_cos`` and ``rope_sin`` f32[seq, hd/2].
    The causal mask is the ``attention`` op's when ``fused_attention``; spelled out it is
    a constant additive mask, which needs a static ``seq``.
    """
    hd = _check_heads("decoder", hidden, heads, kv_heads)
    kv = heads if kv_heads is None else kv_heads
    if not fused_attention and not isinstance(seq, int):
        raise ShapeError(
            f"decoder: spelled-out causal attention needs a static seq (its mask is a "
            f"constant), got seq={seq}; pass fused_attention=True for a symbolic seq"
        )
    if rope and hd % 2:
        raise ShapeError(f"decoder: rope needs an even head dim, got hidden/heads = {hd}")
    g = Graph(f"decoder_l{layers}_h{hidden}")
    _declare(g, batch, seq)
    x = _embed(g, batch, seq, hidden, vocab)
    cos = sin = None
    if rope:
        cos = g.input("rope_cos", (seq, hd // 2))
        sin = g.input("rope_sin", (seq, hd // 2))
    mask = None
    if not fused_attention:
        assert isinstance(seq, int)
        tri = np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), k=1)
        mask = g.constant(tri)
    for i in range(layers):
        p = f"layer{i}"
        h = g.rms_norm(x, g.param(f"{p}.attn_norm.gamma", (hidden,)), eps=eps)
        q = g.matmul(h, g.param(f"{p}.attn.q.weight", (hidden, heads * hd)))
        k = g.matmul(h, g.param(f"{p}.attn.k.weight", (hidden, kv * hd)))
        v = g.matmul(h, g.param(f"{p}.attn.v.weight", (hidden, kv * hd)))
        if cos is not None and sin is not None:
            q = g.rope(q, cos, sin, hd)
            k = g.rope(k, cos, sin, hd)
        if fused_attention:
            a = g.attention(q, k, v, heads, hd, mask=MaskKind.causal(), num_kv_heads=kv_heads)
        else:
            a = _explicit_attention(g, q, k, v, batch, seq, heads, hd, kv, mask)
        x = g.add(x, g.matmul(a, g.param(f"{p}.attn.o.weight", (heads * hd, hidden))))
        h = g.rms_norm(x, g.param(f"{p}.mlp_norm.gamma", (hidden,)), eps=eps)
        gate = g.silu(g.matmul(h, g.param(f"{p}.mlp.gate.weight", (hidden, ffn))))
        up = g.matmul(h, g.param(f"{p}.mlp.up.weight", (hidden, ffn)))
        x = g.add(x, g.matmul(g.mul(gate, up), g.param(f"{p}.mlp.down.weight", (ffn, hidden))))
    x = g.rms_norm(x, g.param("final_norm.gamma", (hidden,)), eps=eps)
    if vocab is not None:
        x = g.matmul(x, g.param("lm_head.weight", (hidden, vocab)))
    g.set_outputs([x])
    return g


def random_params(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Small random values for every param: matrices ~ N(0, 1/fan_in) (fan_in = dim -2),
    norm gains (names ending in ``.gamma``) 1 + N(0, 0.02), other vectors N(0, 0.02)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for n in graph.param_nodes():
        name: str = n.op.name  # type: ignore[attr-defined]
        dims = n.shape.concrete()
        if len(dims) >= 2:
            a = rng.standard_normal(dims) / math.sqrt(max(dims[-2], 1))
        elif name.endswith(".gamma"):
            a = 1.0 + 0.02 * rng.standard_normal(dims)
        else:
            a = 0.02 * rng.standard_normal(dims)
        out[name] = a.astype(n.shape.dtype.np)
    return out


def random_inputs(
    graph: Graph, bindings: Mapping[str, int] | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """A value for every input at the sizes given by ``bindings``: floats ~ N(0, 1),
    integers uniform in [0, 2) (valid token ids for any vocab)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for n in graph.input_nodes():
        dims = n.shape.concrete(bindings or {})
        if n.shape.dtype.is_float:
            a: np.ndarray = rng.standard_normal(dims)
        else:
            a = rng.integers(0, 2, size=dims)
        out[n.op.name] = a.astype(n.shape.dtype.np)  # type: ignore[attr-defined]
    return out


def rope_tables(seq: int, head_dim: int, base: float = 10000.0) -> dict[str, np.ndarray]:
    """``{"rope_cos", "rope_sin"}`` f32[seq, head_dim/2]: angle ``p * base^(-2i/head_dim)``
    for position ``p`` and frequency ``i`` (the Llama tables)."""
    if head_dim < 2 or head_dim % 2:
        raise ShapeError(f"rope_tables: head_dim must be even and >= 2, got {head_dim}")
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(seq, dtype=np.float64)[:, None] * inv[None, :]
    return {"rope_cos": np.cos(ang).astype(np.float32), "rope_sin": np.sin(ang).astype(np.float32)}
