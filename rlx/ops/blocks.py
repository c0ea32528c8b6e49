"""Fused transformer blocks: fused_attention_block (the seed's ``FusedAttentionBlock``) and
fused_transformer_layer (``FusedTransformerLayer``).

Each is one node standing for a chain of existing ops, its *decomposition*
(:func:`expand`, built with the ordinary graph builders):

* ``fused_attention_block(x, wq, wk, wv, wo, [bq, bk, bv, bo], [mask])``: the QKV
  projections, multi-head attention and the output projection of one block,
  ``attention(x@wq+bq, x@wk+bk, x@wv+bv) @ wo + bo``. ``x [B, S, H]``; ``wq, wk, wv
  [H, nh*dh]``, ``wo [nh*dh, H]`` (``[in, out]``, as ``g.linear``); biases ``[out]``;
  the mask as :class:`~rlx.ops.nn.Attention`'s (an additive float input broadcastable
  to ``[B, nh, S, S]`` for ``MaskKind.custom()``, or causal / none with no input).
* ``fused_transformer_layer(x, wq, wk, wv, wo, w_up, w_down, ln1_g, ln1_b, ln2_g, ln2_b,
  [bq, bk, bv, bo, b_up, b_down], [mask])``: a whole encoder layer. Post-norm (BERT, the
  seed's layer; ``pre_norm=False``)::

      h = layer_norm(x + attention_block(x), ln1)
      y = layer_norm(h + act(h @ w_up + b_up) @ w_down + b_down, ln2)

  or pre-norm (``pre_norm=True``, GPT-2 / ``nn.TransformerEncoderLayer(norm_first=True)``)::

      h = x + attention_block(layer_norm(x, ln1))
      y = h + act(layer_norm(h, ln2) @ w_up + b_up) @ w_down + b_down

Where the seed packs q / k / v into one ``qkv_w`` (``[H, 3H]``), rlx keeps the three
projections as separate inputs: they are the checkpoint's tensors as loaded (no concat
node in front of the block) and the fusion passes (``rlx/passes/fusion_blocks.py``) find
them as they are. The seed's attention block also takes rope tables; rlx's does not (a
rope layer is a decoder's, and decoders run through ``cache_attention``).

The reference is the chain written in NumPy (f16 / bf16 operands computed in f32, rounded
once). The CPU kernel (``kernels/blocks.py``) runs the decomposition's own fused kernels
(sgemm with bias / activation epilogues, native attention, residual + layer norm) on
scratch buffers of its own; the derivatives are the decomposition's (reverse and forward
mode through an inlined copy), and vmap folds a batched ``x`` into the block's batch axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.errors import ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.linalg import upcast
from rlx.ops.nn import MaskKind, MaskType
from rlx.ops.unary_kinds import UNARY, UnaryKind
from rlx.shape import Shape, broadcast_dims

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["FusedAttentionBlock", "FusedTransformerLayer", "expand"]

_ATTN_W = ("wq", "wk", "wv", "wo")
_ATTN_B = ("bq", "bk", "bv", "bo")
_LAYER_W = (*_ATTN_W, "w_up", "w_down", "ln1_g", "ln1_b", "ln2_g", "ln2_b")
_LAYER_B = (*_ATTN_B, "b_up", "b_down")


def _names(op: FusedAttentionBlock | FusedTransformerLayer) -> tuple[str, ...]:
    """The op's input names, in order."""
    layer = isinstance(op, FusedTransformerLayer)
    names = ("x", *(_LAYER_W if layer else _ATTN_W))
    if op.has_bias:
        names += _LAYER_B if layer else _ATTN_B
    if op.mask.type is MaskType.CUSTOM:
        names += ("mask",)
    return names


def _check_attention(op: Op, d: dict[str, Shape], nh: int, dh: int) -> int:
    """Shape checks of the attention part; returns the hidden size H."""
    expect(nh >= 1 and dh >= 1, op, f"num_heads and head_dim must be >= 1, got {nh} and {dh}")
    x = d["x"]
    expect(x.dtype.is_float and x.rank == 3, op, f"x must be a float [B, S, H], got {x}")
    h, inner = x.dims[2], nh * dh
    expect(isinstance(h, int), op, f"the hidden size of x {x} must be static")
    for name, s in d.items():
        if name != "mask":
            expect(s.dtype is x.dtype, op, f"{name} {s} must have x's dtype {x.dtype.value}")
    want: dict[str, tuple[object, ...]] = {"wq": (h, inner), "wk": (h, inner), "wv": (h, inner)}
    want |= {"wo": (inner, h), "bq": (inner,), "bk": (inner,), "bv": (inner,), "bo": (h,)}
    for name, dims in want.items():
        if name in d:
            expect(
                d[name].dims == dims,
                op,
                f"{name} must be {list(dims)} (H={h}, heads {nh} x {dh}), got {d[name]}",
            )
    if "mask" in d:
        m, target = d["mask"], (x.dims[0], nh, x.dims[1], x.dims[1])
        expect(m.dtype.is_float and m.rank <= 4, op, f"mask must be a float tensor, got {m}")
        try:
            ok = broadcast_dims(m.dims, target) == target
        except ShapeError:
            ok = False
        expect(ok, op, f"mask must broadcast to [B, heads, S, S] = {list(target)}, got {m}")
    return int(h)  # type: ignore[arg-type]


class _Block(Op):
    """Shared facets of the two blocks (not registered)."""

    __slots__ = ()

    def num_inputs(self) -> int:
        return len(_names(self))  # type: ignore[arg-type]

    def named(self, items: Sequence) -> dict:  # type: ignore[type-arg]
        """``items`` (shapes, arrays or node ids, in input order) by input name."""
        return dict(zip(_names(self), items, strict=True))  # type: ignore[arg-type]

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        """The decomposition's reverse mode, on an inlined copy (each input behind its own
        view, so a repeated input's partials stay apart)."""
        from rlx.autodiff.reverse import backward

        ph = [g.reshape(i, list(g.shape(i).dims)) for i in node.inputs]
        out = expand(self, g, ph)  # type: ignore[arg-type]
        return tuple(backward(g, {out: ct}, ph))

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        """The decomposition's forward mode, on an inlined copy."""
        from rlx.autodiff.forward import forward

        ph = [g.reshape(i, list(g.shape(i).dims)) for i in node.inputs]
        out = expand(self, g, ph)  # type: ignore[arg-type]
        seeds = {p: t for p, t in zip(ph, tangents, strict=True) if t is not None}
        return forward(g, seeds, [out])[out] if seeds else None

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int | None]:
        """Only ``x`` batched: the vmap axis folded into the block's batch axis (one
        block over ``V*B`` sequences). Anything else batched: the generic rule."""
        if bdims[0] is None or any(b is not None for b in bdims[1:]):
            raise NotImplementedError
        from rlx.ops.rules import moveaxis

        x = moveaxis(g, ins[0], bdims[0], 0)
        v, *dims = g.shape(x).dims
        x = g.reshape(x, [-1, *dims[1:]])
        rest = list(ins[1:])
        if self.mask.type is MaskType.CUSTOM:  # type: ignore[attr-defined]
            md = g.shape(rest[-1]).dims
            if len(md) == 4 and md[0] != 1:  # one mask per sequence: one per (v, sequence)
                tiled = g.expand(g.unsqueeze(rest[-1], 0), [v, *md])
                rest[-1] = g.reshape(tiled, [-1, *md[1:]])
        y = g.apply(self, [x, *rest])
        return g.reshape(y, [v, *dims]), 0


def _act(kind: UnaryKind, x: np.ndarray) -> np.ndarray:
    return np.asarray(UNARY[kind].numpy(x)).astype(x.dtype)


def _ln(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return ((x - mu) / np.sqrt(var + x.dtype.type(eps)) * gamma + beta).astype(x.dtype)


def _attention_np(
    op: FusedAttentionBlock | FusedTransformerLayer, x: np.ndarray, a: dict
) -> np.ndarray:
    """The attention block in NumPy (``a``: the widened inputs by name)."""
    nh, dh = op.num_heads, op.head_dim
    b, s, _ = x.shape

    def proj(w: str, bias: str) -> np.ndarray:
        y = x @ a[w]
        return y + a[bias] if bias in a else y

    q, k, v = (proj(w, bn).reshape(b, s, nh, dh).transpose(0, 2, 1, 3) for w, bn in
               (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))  # fmt: skip
    scores = (q @ k.transpose(0, 1, 3, 2)) * x.dtype.type(1.0 / math.sqrt(dh))
    if "mask" in a:
        scores = scores + a["mask"].astype(scores.dtype)
    allowed = op.mask.allowed(s, s)
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    m = scores.max(-1, keepdims=True)
    e = np.exp(scores - np.where(np.isneginf(m), 0, m))
    tot = e.sum(-1, keepdims=True)
    p = e / np.where(tot == 0, 1, tot)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(b, s, nh * dh)
    return proj_out(o, a)


def proj_out(o: np.ndarray, a: dict) -> np.ndarray:
    y = o @ a["wo"]
    return y + a["bo"] if "bo" in a else y


@register
class FusedAttentionBlock(_Block):
    """QKV projections, multi-head attention and the output projection as one node:
    ``attention(x@wq+bq, x@wk+bk, x@wv+bv) @ wo + bo``. Inputs ``(x, wq, wk, wv, wo,
    [bq, bk, bv, bo], [mask])`` (see the module docstring); output ``[B, S, H]`` in x's
    dtype."""

    mnemonic: ClassVar[str] = "fused_attention_block"
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    num_heads: int
    head_dim: int
    has_bias: bool = True
    mask: MaskKind = MaskKind()

    @property
    def keep_dtype_inputs(self) -> tuple[int, ...]:  # type: ignore[override]
        return (len(_names(self)) - 1,) if self.mask.type is MaskType.CUSTOM else ()

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        expect(len(ins) == self.num_inputs(), self, f"takes {_names(self)}, got {len(ins)} inputs")
        _check_attention(self, self.named(ins), self.num_heads, self.head_dim)
        return ins[0]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        a = {k: upcast(v) for k, v in self.named(xs).items()}
        return _attention_np(self, a["x"], a).astype(ctx.out_dtype)


@register
class FusedTransformerLayer(_Block):
    """A whole transformer encoder layer as one node: the attention block, residual,
    layer norm and the feed-forward network (``act(h @ w_up + b_up) @ w_down + b_down``),
    post-norm (BERT, the seed's) or ``pre_norm``. Inputs ``(x, wq, wk, wv, wo, w_up,
    w_down, ln1_g, ln1_b, ln2_g, ln2_b, [bq, bk, bv, bo, b_up, b_down], [mask])`` (see
    the module docstring); output ``[B, S, H]`` in x's dtype."""

    mnemonic: ClassVar[str] = "fused_transformer_layer"
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    num_heads: int
    head_dim: int
    eps1: float = 1e-12
    eps2: float = 1e-12
    activation: UnaryKind = UnaryKind.GELU
    has_bias: bool = True
    mask: MaskKind = MaskKind()
    pre_norm: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "eps1", float(self.eps1))
        object.__setattr__(self, "eps2", float(self.eps2))

    @property
    def keep_dtype_inputs(self) -> tuple[int, ...]:  # type: ignore[override]
        return (len(_names(self)) - 1,) if self.mask.type is MaskType.CUSTOM else ()

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        expect(len(ins) == self.num_inputs(), self, f"takes {_names(self)}, got {len(ins)} inputs")
        d = self.named(ins)
        h = _check_attention(self, d, self.num_heads, self.head_dim)
        expect(
            self.eps1 > 0 and self.eps2 > 0, self, f"eps must be > 0, got {self.eps1}, {self.eps2}"
        )
        inter = d["w_up"].dims[1] if d["w_up"].rank == 2 else None
        want = {"w_up": (h, inter), "w_down": (inter, h), "b_up": (inter,), "b_down": (h,)}
        want |= {n: (h,) for n in ("ln1_g", "ln1_b", "ln2_g", "ln2_b")}
        for name, dims in want.items():
            if name in d:
                expect(
                    isinstance(inter, int) and d[name].dims == dims,
                    self,
                    f"{name} must be {list(dims)} (H={h}, FFN size {inter}), got {d[name]}",
                )
        return ins[0]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        a = {k: upcast(v) for k, v in self.named(xs).items()}
        x = a["x"]

        def ffn(h: np.ndarray) -> np.ndarray:
            u = h @ a["w_up"] + a["b_up"] if "b_up" in a else h @ a["w_up"]
            y = _act(self.activation, u) @ a["w_down"]
            return y + a["b_down"] if "b_down" in a else y

        if self.pre_norm:
            h = x + _attention_np(self, _ln(x, a["ln1_g"], a["ln1_b"], self.eps1), a)
            y = h + ffn(_ln(h, a["ln2_g"], a["ln2_b"], self.eps2))
        else:
            h = _ln(x + _attention_np(self, x, a), a["ln1_g"], a["ln1_b"], self.eps1)
            y = _ln(h + ffn(h), a["ln2_g"], a["ln2_b"], self.eps2)
        return y.astype(ctx.out_dtype)


def expand(
    op: FusedAttentionBlock | FusedTransformerLayer, g: Graph, ins: Sequence[NodeId]
) -> NodeId:
    """The op's decomposition into existing ops, built in ``g`` over the nodes ``ins``
    (its inputs, in order); returns the node of the result."""
    a = op.named(ins)

    def lin(x: NodeId, w: str, b: str) -> NodeId:
        return g.linear(x, a[w], a.get(b))

    def block(x: NodeId) -> NodeId:
        q, k, v = lin(x, "wq", "bq"), lin(x, "wk", "bk"), lin(x, "wv", "bv")
        o = g.attention(q, k, v, op.num_heads, op.head_dim, op.mask, a.get("mask"))
        return lin(o, "wo", "bo")

    if isinstance(op, FusedAttentionBlock):
        return block(a["x"])
    x = a["x"]

    def ffn(h: NodeId) -> NodeId:
        u = g.apply(_unary(op.activation), [lin(h, "w_up", "b_up")])
        return lin(u, "w_down", "b_down")

    if op.pre_norm:
        h = g.add(block(g.layer_norm(x, a["ln1_g"], a["ln1_b"], op.eps1)), x)
        return g.add(ffn(g.layer_norm(h, a["ln2_g"], a["ln2_b"], op.eps2)), h)
    h = g.layer_norm(g.add(block(x), x), a["ln1_g"], a["ln1_b"], op.eps1)
    return g.layer_norm(g.add(ffn(h), h), a["ln2_g"], a["ln2_b"], op.eps2)


def _unary(kind: UnaryKind) -> Op:
    from rlx.ops.elementwise import Unary

    return Unary(kind)


@graph_method
def fused_attention_block(
    g: Graph,
    x: NodeId,
    weights: Sequence[NodeId],
    biases: Sequence[NodeId] | None,
    num_heads: int,
    head_dim: int,
    mask: MaskKind = MaskKind(),
    mask_input: NodeId | None = None,
) -> NodeId:
    """:class:`FusedAttentionBlock` of ``x`` with ``weights = (wq, wk, wv, wo)`` and
    ``biases = (bq, bk, bv, bo)`` (or None); ``mask_input`` implies a custom mask."""
    if mask_input is not None and mask.type is MaskType.NONE:
        mask = MaskKind.custom()
    op = FusedAttentionBlock(num_heads, head_dim, biases is not None, mask)
    extra = [mask_input] if mask_input is not None else []
    return g.apply(op, [x, *weights, *(biases or ()), *extra])


@graph_method
def fused_transformer_layer(
    g: Graph,
    x: NodeId,
    weights: Sequence[NodeId],
    biases: Sequence[NodeId] | None,
    num_heads: int,
    head_dim: int,
    eps: tuple[float, float] = (1e-12, 1e-12),
    activation: UnaryKind = UnaryKind.GELU,
    mask: MaskKind = MaskKind(),
    mask_input: NodeId | None = None,
    pre_norm: bool = False,
) -> NodeId:
    """:class:`FusedTransformerLayer` of ``x`` with ``weights = (wq, wk, wv, wo, w_up,
    w_down, ln1_g, ln1_b, ln2_g, ln2_b)`` and ``biases = (bq, bk, bv, bo, b_up,
    b_down)`` (or None); ``mask_input`` implies a custom mask."""
    if mask_input is not None and mask.type is MaskType.NONE:
        mask = MaskKind.custom()
    op = FusedTransformerLayer(
        num_heads, head_dim, eps[0], eps[1], activation, biases is not None, mask, pre_norm
    )
    extra = [mask_input] if mask_input is not None else []
    return g.apply(op, [x, *weights, *(biases or ()), *extra])
