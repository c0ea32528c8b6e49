"""Graph pieces the encoder families share. In: a MIR graph under construction and its
input nodes. Out: nodes: the padding mask as an additive attention mask, the positions
``0..seq-1``, rope cos / sin rows for them, a linear layer with an optional bias, a split
of a fused projection, and the FFN activation of an :class:`Activation`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx.dtype import DType
from rlx.ir.mir import Graph, NodeId
from rlx.models.hf.config import Activation, EncoderConfig

__all__ = [
    "MASK_FILL",
    "Tensors",
    "activation",
    "additive_mask",
    "inputs",
    "linear",
    "positions",
    "rope_rows",
    "split",
]

#: What a padded key adds to the attention scores (exp() of it is exactly 0 in f32).
MASK_FILL = 1e30

#: Checkpoint name -> (shape as stored, whether it is a linear weight to transpose).
Tensors = dict[str, tuple[tuple[int, ...], bool]]


def additive_mask(g: Graph, mask: NodeId) -> NodeId:
    """f32 ``[batch, 1, 1, seq]``: 0 for a token, ``-MASK_FILL`` for padding, from the f32
    ``[batch, seq]`` attention mask."""
    b, s = g.node(mask).shape.dims
    return g.mul(g.sub(g.reshape(mask, (b, 1, 1, s)), 1.0), MASK_FILL)


def positions(g: Graph, ids: NodeId) -> NodeId:
    """i64 ``[seq]``: ``0..seq-1`` (every row's positions: padding is on the right)."""
    _, s = g.node(ids).shape.dims
    row = g.reshape(g.narrow(ids, 0, 0, 1), (s,))
    return g.sub(g.cumsum(g.add(g.mul(row, np.int64(0)), np.int64(1)), 0), np.int64(1))


def rope_rows(g: Graph, pos: NodeId, base: float, rot: int, length: int) -> tuple[NodeId, NodeId]:
    """f32 cos, sin ``[seq, rot/2]`` at ``pos`` (tables of ``length`` rows, angles in f32
    as transformers computes them: f32 inverse frequencies ``base^(-2i/rot)`` times f32
    positions)."""
    inv = (1.0 / (base ** (np.arange(0, rot, 2, dtype=np.int64).astype(np.float32) / rot))).astype(
        np.float32
    )
    ang = (np.arange(length, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float32)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    return g.gather(g.constant(cos), pos, 0), g.gather(g.constant(sin), pos, 0)


def linear(g: Graph, x: NodeId, name: str, n_in: int, n_out: int, bias: bool) -> NodeId:
    """``x @ W (+ b)`` with the params ``name.weight`` ``[n_in, n_out]`` (and ``name.bias``)."""
    w = g.param(f"{name}.weight", (n_in, n_out))
    return g.linear(x, w, g.param(f"{name}.bias", (n_out,)) if bias else None)


def split(g: Graph, x: NodeId, sizes: tuple[int, ...]) -> list[NodeId]:
    """``x`` cut along its last axis into pieces of ``sizes``."""
    out, start = [], 0
    for n in sizes:
        out.append(g.narrow(x, -1, start, n))
        start += n
    return out


def activation(g: Graph, act: Activation) -> Callable[[NodeId], NodeId]:
    """The graph builder of ``act``."""
    return {
        Activation.GELU: g.gelu,
        Activation.GELU_TANH: g.gelu_tanh,
        Activation.SILU: g.silu,
        Activation.SIGMOID: g.sigmoid,
    }[act]


def inputs(g: Graph, cfg: EncoderConfig) -> tuple[NodeId, NodeId, NodeId | None]:
    """The graph inputs (i64 ``[batch, seq]``): ``input_ids``, ``attention_mask`` and,
    when the model has token types, ``token_type_ids``; ``seq`` at most the position
    limit."""
    batch, seq = g.sym("batch"), g.sym("seq", max=cfg.max_positions)
    ids = g.input("input_ids", (batch, seq), DType.I64)
    mask = g.input("attention_mask", (batch, seq), DType.I64)
    types = g.input("token_type_ids", (batch, seq), DType.I64) if cfg.type_vocab_size else None
    return ids, mask, types
