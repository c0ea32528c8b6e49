"""Graph builders for the neural-network ops of ``nn.py``: ``g.attention`` (a custom
``mask_input`` implies ``MaskKind.custom()``), ``g.rope``, ``g.conv`` (1-D or 2-D, from the
weight's rank), ``g.max_pool`` and ``g.avg_pool``; ``_per_dim`` / ``_pads`` turn an int or
a per-dim sequence into the ops' tuples (``qconv.py`` reuses them).

In: node ids and Python arguments. Out: the id of the node built; a bad argument is a
ShapeError pointing at the user's line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlx import source
from rlx.errors import ShapeError
from rlx.ops.base import graph_method
from rlx.ops.nn import Attention, Conv, MaskKind, MaskType, Pool, PoolKind, Rope

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId


def _fail(what: str, msg: str) -> ShapeError:
    return ShapeError(f"{what}: {msg}", loc=source.capture())


def _per_dim(v: int | Sequence[int], nd: int, what: str, name: str) -> tuple[int, ...]:
    if isinstance(v, int):
        return (int(v),) * nd
    t = tuple(int(a) for a in v)
    if len(t) != nd:
        raise _fail(what, f"{name} needs {nd} entries (one per spatial dim), got {tuple(v)}")
    return t


def _pads(v: int | Sequence[Any], nd: int, what: str) -> tuple[tuple[int, int], ...]:
    """``p`` -> ((p,p),)*nd; ``(p0, p1)`` per dim -> symmetric; ``((lo,hi),...)`` as is."""
    if isinstance(v, int):
        return ((int(v), int(v)),) * nd
    t = tuple(v)
    if len(t) != nd:
        raise _fail(what, f"padding needs {nd} entries (one per spatial dim), got {t}")
    out = []
    for p in t:
        if isinstance(p, int):
            out.append((int(p), int(p)))
        elif len(p) == 2:
            out.append((int(p[0]), int(p[1])))
        else:
            raise _fail(what, f"padding entries must be an int or a (lo, hi) pair, got {p!r}")
    return tuple(out)


@graph_method
def attention(
    g: Graph,
    q: NodeId,
    k: NodeId,
    v: NodeId,
    num_heads: int,
    head_dim: int,
    mask: MaskKind = MaskKind(),
    mask_input: NodeId | None = None,
    num_kv_heads: int | None = None,
    scale: float | None = None,
) -> NodeId:
    """Scaled dot-product attention; ``mask_input`` (an additive float mask) goes with
    ``mask=MaskKind.custom()`` (implied when ``mask`` is left at none)."""
    if mask_input is not None and mask.type is MaskType.NONE:
        mask = MaskKind.custom()
    if (mask_input is not None) != (mask.type is MaskType.CUSTOM):
        raise _fail(
            "attention",
            f"mask={mask} {'needs' if mask_input is None else 'takes no'} mask_input, "
            f"got {mask_input!r}",
        )
    ins = [q, k, v] if mask_input is None else [q, k, v, mask_input]
    sc = None if scale is None else float(scale)
    return g.apply(Attention(num_heads, head_dim, mask, num_kv_heads, sc), ins)


@graph_method
def rope(
    g: Graph,
    x: NodeId,
    cos: NodeId,
    sin: NodeId,
    head_dim: int,
    n_rot: int | None = None,
    interleaved: bool = False,
) -> NodeId:
    """Rotary embedding of ``x[B,S,H*head_dim]``; ``n_rot`` defaults to ``head_dim``."""
    return g.apply(Rope(head_dim, head_dim if n_rot is None else n_rot, interleaved), [x, cos, sin])


@graph_method
def conv(
    g: Graph,
    x: NodeId,
    w: NodeId,
    bias: NodeId | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[Any] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> NodeId:
    """1-D or 2-D convolution (the spatial rank is ``w``'s rank - 2); ints apply to every
    spatial dim, ``padding`` may also give ``(lo, hi)`` pairs per dim."""
    nd = g.node(w).shape.rank - 2
    if nd not in (1, 2):
        raise _fail(
            "conv",
            f"weight %{w} must be [O,C/groups,*k] with 1 or 2 kernel dims, got {g.node(w).shape}",
        )
    op = Conv(
        _per_dim(stride, nd, "conv", "stride"),
        _pads(padding, nd, "conv"),
        _per_dim(dilation, nd, "conv", "dilation"),
        int(groups),
        bias is not None,
    )
    return g.apply(op, [x, w] if bias is None else [x, w, bias])


def _pool(
    g: Graph,
    fn: PoolKind,
    x: NodeId,
    window: int | Sequence[int],
    stride: int | Sequence[int] | None,
    padding: int | Sequence[Any],
) -> NodeId:
    what = f"{fn.value}_pool"
    nd = len(window) if not isinstance(window, int) else g.node(x).shape.rank - 2
    if nd not in (1, 2):
        raise _fail(what, f"x %{x} must be [N,C,L] or [N,C,H,W], got {g.node(x).shape}")
    win = _per_dim(window, nd, what, "window")
    st = win if stride is None else _per_dim(stride, nd, what, "stride")
    return g.apply(Pool(fn, win, st, _pads(padding, nd, what)), [x])


@graph_method
def max_pool(
    g: Graph,
    x: NodeId,
    window: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[Any] = 0,
) -> NodeId:
    """Max pooling; ``stride`` defaults to the window (non-overlapping)."""
    return _pool(g, PoolKind.MAX, x, window, stride, padding)


@graph_method
def avg_pool(
    g: Graph,
    x: NodeId,
    window: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[Any] = 0,
) -> NodeId:
    """Average pooling (padding excluded from the count); ``stride`` defaults to the window."""
    return _pool(g, PoolKind.AVG, x, window, stride, padding)
