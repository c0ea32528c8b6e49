"""RotaryEmbedding (opset 23) -> slices, gathers and elementwise ops: the cos / sin caches
gathered by position_ids, the rotated part split in halves (or even / odd lanes when
``interleaved``), ``(x1 cos - x2 sin, x1 sin + x2 cos)``, the rest passed through; 3-D
inputs [batch, seq, heads*head] and 4-D [batch, heads, seq, head] as the ONNX reference."""

from __future__ import annotations

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import bin_
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.movement import Concat, Gather, Reshape, Slice, Transpose


def _last(g, x: int, start, stop, step: int = 1) -> int:  # noqa: ANN001
    r = g.shape(x).rank
    return g.apply(
        Slice((None,) * (r - 1) + (start,), (None,) * (r - 1) + (stop,), (1,) * (r - 1) + (step,)),
        [x],
    )


@converter("RotaryEmbedding", since=23)
def rotary_embedding(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    shape = ctx.shape(x)
    four = shape.rank == 4
    if four:
        x = g.apply(Transpose((0, 2, 1, 3)), [x])  # [b, s, h, d]
    else:
        b, s, hidden = shape.dims
        nh = int(ctx.attr("num_heads"))
        x = g.apply(Reshape((b, s, nh, int(hidden) // nh)), [x])
    b, s, nh, hd = (int(v) for v in g.shape(x).dims)
    rd = int(ctx.attr("rotary_embedding_dim", 0)) or hd
    cos, sin = ctx.x(1), ctx.x(2)
    if ctx.has(3):
        pos = ctx.x(3)
        cos, sin = g.apply(Gather(0), [cos, pos]), g.apply(Gather(0), [sin, pos])
    half = rd // 2
    cos = g.apply(Reshape((b, s, 1, half)), [cos])
    sin = g.apply(Reshape((b, s, 1, half)), [sin])
    rot = _last(g, x, 0, rd)
    if ctx.attr("interleaved", 0):
        x1, x2 = _last(g, rot, 0, None, 2), _last(g, rot, 1, None, 2)
    else:
        x1, x2 = _last(g, rot, 0, half), _last(g, rot, half, rd)
    real = bin_(g, B.SUB, bin_(g, B.MUL, cos, x1), bin_(g, B.MUL, sin, x2))
    imag = bin_(g, B.ADD, bin_(g, B.MUL, sin, x1), bin_(g, B.MUL, cos, x2))
    if ctx.attr("interleaved", 0):
        pair = g.apply(
            Concat(4), [g.apply(Reshape((b, s, nh, half, 1)), [v]) for v in (real, imag)]
        )
        rot = g.apply(Reshape((b, s, nh, rd)), [pair])
    else:
        rot = g.apply(Concat(3), [real, imag])
    y = rot if rd == hd else g.apply(Concat(3), [rot, _last(g, x, rd, None)])
    if four:
        return g.apply(Transpose((0, 2, 1, 3)), [y])
    return g.apply(Reshape(shape.dims), [y])
