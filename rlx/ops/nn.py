"""Neural-network ops: attention (with :class:`MaskKind`), rotary embedding, conv, pool.

Float inputs only (attention, rope, conv, avg pool); f16/bf16/fp8 compute in f32 and round
once to the node dtype. Batch and sequence dims may be symbolic; head, channel and kernel
dims are static; conv/pool spatial dims may be symbolic when the output length is still a
symbolic dim (see ``_spatial_out``). The graph builders (``g.attention``, ``g.conv``...)
are in ``nn_builders.py``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rlx.errors import ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.linalg import upcast
from rlx.shape import Dim, Shape, Sym, broadcast_dims

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = [
    "MaskType",
    "MaskKind",
    "Attention",
    "Rope",
    "Conv",
    "ConvAct",
    "PoolKind",
    "Pool",
]


class MaskType(enum.Enum):
    """The kind of attention mask a :class:`MaskKind` describes (its ``type`` field)."""

    NONE = "none"
    CAUSAL = "causal"
    SLIDING_WINDOW = "sliding_window"
    CUSTOM = "custom"


@dataclass(frozen=True, slots=True)
class MaskKind:
    """Which keys each query of an attention may see.

    Causal masks are aligned to the end: with ``Sq`` queries and ``Skv`` keys, query ``i``
    sees keys ``j <= i + Skv - Sq`` (so a decode step with ``Sq = 1`` sees every key).
    A sliding window of ``n`` is causal and additionally needs ``j > i + Skv - Sq - n``
    (the ``n`` most recent keys). Custom masks are an additive float input instead.
    """

    type: MaskType = MaskType.NONE
    window: int = 0

    def __post_init__(self) -> None:
        if self.type is MaskType.SLIDING_WINDOW:
            if not isinstance(self.window, int) or self.window < 1:
                raise ShapeError(f"sliding window size must be an int >= 1, got {self.window!r}")
        elif self.window != 0:
            raise ShapeError(f"a {self.type.value} mask has no window, got window={self.window}")

    @staticmethod
    def none() -> MaskKind:
        """No mask: every query sees every key."""
        return MaskKind(MaskType.NONE)

    @staticmethod
    def causal() -> MaskKind:
        """Causal mask, aligned to the end (query ``i`` sees keys ``j <= i + Skv - Sq``)."""
        return MaskKind(MaskType.CAUSAL)

    @staticmethod
    def sliding_window(n: int) -> MaskKind:
        """Causal mask limited to the ``n`` most recent keys (``n >= 1``)."""
        return MaskKind(MaskType.SLIDING_WINDOW, n)

    @staticmethod
    def custom() -> MaskKind:
        """An additive float mask given as the attention op's 4th input."""
        return MaskKind(MaskType.CUSTOM)

    def allowed(self, sq: int, skv: int) -> np.ndarray | None:
        """Bool [sq, skv]: which (query, key) pairs are visible; None when all are."""
        if self.type in (MaskType.NONE, MaskType.CUSTOM):
            return None
        i = np.arange(sq)[:, None] + (skv - sq)
        j = np.arange(skv)[None, :]
        ok = j <= i
        if self.type is MaskType.SLIDING_WINDOW:
            ok &= j > i - self.window
        return ok

    def __str__(self) -> str:
        if self.type is MaskType.SLIDING_WINDOW:
            return f"sliding_window({self.window})"
        return self.type.value


def split_heads(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, num_heads: int, head_dim: int, kv_heads: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Packed ``q[B,Sq,H*D]``, ``k, v[B,Skv,Hkv*D]`` -> ``[B,H,S,D]`` per-head arrays, each kv
    head repeated for its group of query heads (head ``h`` reads kv head ``h // (H/Hkv)``)."""
    b, sq, _ = q.shape
    skv = k.shape[1]
    h, d, hkv = num_heads, head_dim, kv_heads
    qh = q.reshape(b, sq, h, d).transpose(0, 2, 1, 3)
    kh = np.repeat(k.reshape(b, skv, hkv, d).transpose(0, 2, 1, 3), h // hkv, axis=1)
    vh = np.repeat(v.reshape(b, skv, hkv, d).transpose(0, 2, 1, 3), h // hkv, axis=1)
    return qh, kh, vh


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    """Attention's softmax over the last axis: the ``softmax`` op's math (the row max is
    subtracted first, so a row of only ``finfo.min`` gives a uniform distribution), except
    that a row of only ``-inf`` (a query that sees no key) gives zeros, not NaN. NaN
    scores still give NaN."""
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isneginf(m), 0, m))
    t = np.sum(e, axis=-1, keepdims=True)  # >= 1 on a row that sees a key, else 0
    return e / np.where(t == 0, 1, t)


def attend(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``softmax(s) · v`` over the last axis of the scores ``s[..., Sq, Skv]`` with
    ``v[..., Skv, D]``; a query row whose every score is ``-inf`` gives exactly 0 (also
    when v holds non-finite values)."""
    o = np.matmul(_softmax_rows(s), v)
    return np.where(np.all(np.isneginf(s), axis=-1, keepdims=True), 0, o).astype(o.dtype)


def _float_input(op: Op, x: Shape, what: str) -> None:
    expect(x.dtype.is_float, op, f"{what} must be a float tensor, got {x}")


@register
class Attention(Op):
    """Multi-head scaled dot-product attention on packed heads.

    Inputs ``q[B,Sq,H*D]``, ``k[B,Skv,Hkv*D]``, ``v[B,Skv,Hkv*D]`` and, for
    ``MaskKind.custom()`` only, an additive mask (any float dtype; ``-inf`` hides a key)
    broadcastable to ``[B,H,Sq,Skv]``. Output ``[B,Sq,H*D]`` in q's dtype. With ``num_kv_heads < num_heads`` (grouped-query)
    query head ``h`` reads kv head ``h // (H // Hkv)``. ``scale`` defaults to
    ``1/sqrt(head_dim)``.

    The result is ``softmax(q·kᵀ·scale + mask) · v`` with the ``softmax`` op's math (max
    subtracted, f32 for f16/bf16 operands), with one rule for a query row that sees no
    key (every key hidden by ``-inf``: a custom mask, a causal / sliding-window mask with
    ``Sq > Skv``, a fully padded sequence): its output is exactly 0, not NaN, on every
    path (reference, native and BLAS kernels, every precision policy, HIR lowering) and
    its gradients are 0 too, as ONNX's Attention specifies and padded batches need (one
    NaN row would poison whatever reads it). The unfused chain's ``softmax`` op gives NaN
    there; fusing it into this op turns those rows into 0 and changes nothing else. A row
    hidden by ``finfo.min`` instead still sees its keys: it gives the mean of v (all
    scores equal after the max is subtracted). The mask keeps its dtype under a
    reduced-precision policy (an f32 ``finfo.min`` would overflow to ``-inf`` in
    f16/bf16) and is added in f32.
    """

    mnemonic: ClassVar[str] = "attention"
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    keep_dtype_inputs: ClassVar[tuple[int, ...]] = (3,)
    num_heads: int
    head_dim: int
    mask: MaskKind = MaskKind()
    num_kv_heads: int | None = None
    scale: float | None = None

    def num_inputs(self) -> int:
        return 4 if self.mask.type is MaskType.CUSTOM else 3

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def effective_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else float(self.scale)

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        h, d, hkv = self.num_heads, self.head_dim, self.kv_heads
        expect(h >= 1 and d >= 1, self, f"num_heads and head_dim must be >= 1, got {h} and {d}")
        expect(
            hkv >= 1 and h % hkv == 0,
            self,
            f"num_kv_heads must divide num_heads={h}, got {hkv}",
        )
        q, k, v = ins[:3]
        for name, t in (("q", q), ("k", k), ("v", v)):
            _float_input(self, t, name)
            expect(t.rank == 3, self, f"{name} must be [B,S,heads*head_dim], got {t}")
        expect(
            q.dtype is k.dtype is v.dtype,
            self,
            f"q, k, v need equal dtypes, got {q}, {k} and {v}",
        )
        expect(q.dims[2] == h * d, self, f"q must be [B,Sq,{h * d}] (H={h} x D={d}), got {q}")
        for name, t in (("k", k), ("v", v)):
            expect(
                t.dims[2] == hkv * d,
                self,
                f"{name} must be [B,Skv,{hkv * d}] (Hkv={hkv} x D={d}), got {t}",
            )
            expect(t.dims[0] == q.dims[0], self, f"batch of {name} {t} differs from q {q}")
        expect(k.dims[1] == v.dims[1], self, f"k {k} and v {v} have different lengths")
        if len(ins) == 4:
            m = ins[3]
            _float_input(self, m, "mask")
            target = (q.dims[0], h, q.dims[1], k.dims[1])
            ok = m.rank <= 4
            if ok:
                try:
                    ok = broadcast_dims(m.dims, target) == target
                except ShapeError:
                    ok = False
            tstr = ",".join(map(str, target))
            expect(ok, self, f"mask must broadcast to [B,H,Sq,Skv]=[{tstr}], got {m}")
        return q

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        q, k, v = (upcast(x) for x in xs[:3])
        b, sq, _ = q.shape
        skv = k.shape[1]
        h, d = self.num_heads, self.head_dim
        qh, kh, vh = split_heads(q, k, v, h, d, self.kv_heads)
        s = np.matmul(qh, kh.swapaxes(-1, -2)) * np.asarray(self.effective_scale, q.dtype)
        if len(xs) == 4:
            s = s + upcast(xs[3]).astype(s.dtype)
        allowed = self.mask.allowed(sq, skv)
        if allowed is not None:
            s = np.where(allowed, s, -np.inf)
        with np.errstate(invalid="ignore", over="ignore"):
            o = attend(s, vh)
        return o.transpose(0, 2, 1, 3).reshape(b, sq, h * d).astype(ctx.out_dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops import nn_rules

        return nn_rules.attention_vjp(self, g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops import nn_rules

        return nn_rules.attention_jvp(self, g, node, tangents)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int | None]:
        from rlx.ops import nn_rules

        return nn_rules.attention_batch(self, g, node, ins, bdims)


@register
class Rope(Op):
    """Rotary position embedding on packed heads: ``x[B,S,H*D]`` with ``cos, sin[S,n_rot/2]``.

    Per head, the first ``n_rot`` dims rotate and the rest pass through. NeoX layout
    (default) pairs dim ``i`` with ``i + n_rot/2`` (rotate-half); ``interleaved=True``
    (GPT-J) pairs ``2i`` with ``2i+1``. Each pair ``(a, b)`` at position ``s`` and
    frequency ``i`` becomes ``(a*cos - b*sin, b*cos + a*sin)``. All inputs share a dtype.
    """

    mnemonic: ClassVar[str] = "rope"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    head_dim: int
    n_rot: int
    interleaved: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, cos, sin = ins
        d, r = self.head_dim, self.n_rot
        expect(d >= 1, self, f"head_dim must be >= 1, got {d}")
        expect(
            r >= 2 and r % 2 == 0 and r <= d,
            self,
            f"n_rot must be even and in [2, head_dim={d}], got {r}",
        )
        _float_input(self, x, "x")
        expect(x.rank == 3, self, f"x must be [B,S,H*{d}], got {x}")
        hd = x.dims[2]
        expect(
            isinstance(hd, int) and hd % d == 0,
            self,
            f"x's last dim must be a multiple of head_dim={d}, got {x}",
        )
        for name, t in (("cos", cos), ("sin", sin)):
            expect(t.dtype is x.dtype, self, f"{name} {t} must have x's dtype {x.dtype}")
            expect(
                t.dims == (x.dims[1], r // 2),
                self,
                f"{name} must be [S,n_rot/2]=[{x.dims[1]},{r // 2}], got {t}",
            )
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, cos, sin = (upcast(a) for a in xs)
        b, s, hd = x.shape
        xh = x.reshape(b, s, hd // self.head_dim, self.head_dim)
        out = xh.copy()
        c, sn = cos[None, :, None, :], sin[None, :, None, :]
        r = self.n_rot
        if self.interleaved:
            lo, hi = slice(0, r, 2), slice(1, r, 2)
        else:
            lo, hi = slice(0, r // 2), slice(r // 2, r)
        a, bb = xh[..., lo], xh[..., hi]
        out[..., lo] = a * c - bb * sn
        out[..., hi] = bb * c + a * sn
        return out.reshape(b, s, hd).astype(ctx.out_dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops import nn_rules

        return nn_rules.rope_vjp(self, g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops import nn_rules

        return nn_rules.rope_jvp(self, g, node, tangents)


# ---- convolution and pooling --------------------------------------------------------


def _check_window_attrs(op: Op, what: str, sizes: Sequence[tuple[str, tuple[Any, ...]]]) -> int:
    """Check per-spatial-dim attributes share one length (1 or 2); return it."""
    lens = {name: len(v) for name, v in sizes}
    nd = len(sizes[0][1])
    expect(
        nd in (1, 2) and all(n == nd for n in lens.values()),
        op,
        f"{what} is 1-D or 2-D: attributes need one entry per spatial dim, got lengths {lens}",
    )
    return nd


def _spatial_out(
    op: Op,
    x: Shape,
    k: Sequence[int],
    stride: Sequence[int],
    pads: Sequence[tuple[int, int]],
    dil: Sequence[int],
) -> tuple[Dim, ...]:
    """Output spatial dims ``(n + lo + hi - span) // stride + 1``. A symbolic ``n`` gives
    a symbolic output when that is a monomial: ``n / stride`` with ``stride`` dividing
    ``n`` and ``-stride <= lo + hi - span < 0`` (e.g. "same" padding at stride 1, or
    non-overlapping windows with ``window == stride``); other symbolic cases are a
    ShapeError."""
    out: list[Dim] = []
    for ax, (n, kk, s, (pl, pr), dd) in enumerate(
        zip(x.dims[2:], k, stride, pads, dil, strict=True)
    ):
        span = dd * (kk - 1) + 1
        if isinstance(n, Sym):
            e = pl + pr - span
            q = n.divide(s) if s > 1 else n
            expect(
                q is not None and -s <= e < 0,
                op,
                f"spatial dim {ax} of {x} is symbolic ({n}): the output length "
                f"({n} + {pl} + {pr} - {span}) // {s} + 1 is not a symbolic dim; use "
                f"padding lo + hi = {span - 1} with stride 1, or a stride dividing {n} "
                "with lo + hi - window span in [-stride, 0)",
            )
            out.append(q)  # type: ignore[arg-type]
            continue
        expect(
            n + pl + pr >= span,
            op,
            f"spatial dim {ax} of {x} is {n} (+{pl}+{pr} padding), smaller than the "
            f"window span {span}",
        )
        out.append((n + pl + pr - span) // s + 1)
    return tuple(out)


def _window_view(
    xp: np.ndarray, k: Sequence[int], stride: Sequence[int], dil: Sequence[int]
) -> np.ndarray:
    """[N,C,*sp] padded -> [N,C,*out,*k]: every (strided, dilated) window position."""
    nd = len(k)
    spans = [d * (kk - 1) + 1 for kk, d in zip(k, dil, strict=True)]
    v = np.lib.stride_tricks.sliding_window_view(xp, spans, axis=tuple(range(2, 2 + nd)))
    return v[(slice(None), slice(None), *(slice(None, None, s) for s in (*stride, *dil)))]


class ConvAct(enum.Enum):
    """A :class:`Conv`'s last step (``fuse_conv_act``): none, relu, clip to ``Conv.clip``."""

    NONE = "none"
    RELU = "relu"
    CLIP = "clip"


@register
class Conv(Op):
    """1-D or 2-D cross-correlation (PyTorch ``conv1d``/``conv2d``).

    Inputs ``x[N,C,*sp]``, ``w[O,C/groups,*k]``, ``bias[O]`` (``has_bias``), ``residual``
    (``has_residual``, the output's shape); output ``act(conv + bias + residual)``
    ``[N,O,*out]``, ``out = (sp + pad_lo + pad_hi - dilation*(k-1) - 1) // stride + 1``."""

    mnemonic: ClassVar[str] = "conv"
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    groups: int = 1
    has_bias: bool = False
    act: ConvAct = ConvAct.NONE
    clip: tuple[float, float] = (0.0, 0.0)
    has_residual: bool = False

    def num_inputs(self) -> int:
        return 2 + int(self.has_bias) + int(self.has_residual)

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        nd = _check_window_attrs(
            self,
            "conv",
            [("stride", self.stride), ("padding", self.padding), ("dilation", self.dilation)],
        )
        expect(
            all(s >= 1 for s in self.stride) and all(d >= 1 for d in self.dilation),
            self,
            f"stride and dilation must be >= 1, got {self.stride} and {self.dilation}",
        )
        expect(
            all(len(p) == 2 and min(p) >= 0 for p in self.padding),
            self,
            f"padding must be (lo, hi) pairs >= 0, got {self.padding}",
        )
        x, w = ins[:2]
        _float_input(self, x, "x")
        expect(w.dtype is x.dtype, self, f"weight {w} must have x's dtype {x.dtype}")
        expect(
            x.rank == 2 + nd,
            self,
            f"{nd}-D conv needs x [N,C,{'H,W' if nd == 2 else 'L'}], got {x}",
        )
        expect(
            w.rank == 2 + nd, self, f"{nd}-D conv needs w [O,C/groups,*k] of rank {2 + nd}, got {w}"
        )
        expect(w.is_static, self, f"weight must have static dims, got {w}")
        c, o, g = x.dims[1], w.dims[0], self.groups
        expect(isinstance(c, int), self, f"channels of x {x} must be static")
        expect(
            g >= 1 and c % g == 0 and o % g == 0,
            self,
            f"groups={g} must divide in-channels {c} and out-channels {o}",
        )
        expect(
            w.dims[1] == c // g,
            self,
            f"weight must be [{o},{c // g},...] (C={c} / groups={g}), got {w}",
        )
        expect(all(k >= 1 for k in w.dims[2:]), self, f"kernel dims must be >= 1, got {w}")
        if self.has_bias:
            bias = ins[2]
            expect(
                bias.dims == (o,) and bias.dtype is x.dtype,
                self,
                f"bias must be {x.dtype}[{o}], got {bias}",
            )
        out = _spatial_out(self, x, w.dims[2:], self.stride, self.padding, self.dilation)
        y = Shape((x.dims[0], o, *out), x.dtype)
        expect(not self.has_residual or ins[-1] == y, self, f"residual must be {y}, got {ins[-1]}")
        return y

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, w = upcast(xs[0]), upcast(xs[1])
        n, c = x.shape[:2]
        o, g = w.shape[0], self.groups
        k = w.shape[2:]
        xp = np.pad(x, ((0, 0), (0, 0), *self.padding))
        win = _window_view(xp, k, self.stride, self.dilation)  # [N,C,*out,*k]
        out_sp = win.shape[2 : 2 + len(k)]
        kk = math.prod(k)
        length = math.prod(out_sp)
        # [N,G,C/G,*out,*k] -> [N,G,L,C/G*K] against w [G,O/G,C/G*K]
        cols = win.reshape(n, g, c // g, length, kk).transpose(0, 1, 3, 2, 4)
        cols = cols.reshape(n, g, length, (c // g) * kk)
        wg = w.reshape(g, o // g, (c // g) * kk)
        y = np.matmul(cols, wg.transpose(0, 2, 1)[None])  # [N,G,L,O/G]
        y = y.transpose(0, 1, 3, 2).reshape(n, o, *out_sp)
        if self.has_bias:
            y = y + upcast(xs[2]).reshape((o,) + (1,) * len(k))
        y = y + upcast(xs[-1]) if self.has_residual else y
        if self.act is not ConvAct.NONE:
            lo, hi = (0.0, np.inf) if self.act is ConvAct.RELU else self.clip
            y = np.minimum(np.maximum(y, lo), hi)
        return y.astype(ctx.out_dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops import nn_rules

        self._unfused()
        return nn_rules.conv_vjp(self, g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops import nn_rules

        self._unfused()
        return nn_rules.conv_jvp(self, g, node, tangents)

    def _unfused(self) -> None:
        expect(self.act is ConvAct.NONE and not self.has_residual, self, "fused: no derivative")


class PoolKind(enum.Enum):
    """What ``Pool`` computes over each window: its maximum or its average."""

    MAX = "max"
    AVG = "avg"


@register
class Pool(Op):
    """1-D or 2-D max/average pooling over ``x[N,C,*sp]`` -> ``[N,C,*out]``.

    ``padding`` is one ``(lo, hi)`` pair per spatial dim, each smaller than the window, so
    every window holds at least one real element. Padding never wins a max, and an
    average divides by the number of real (unpadded) elements in its window (PyTorch's
    ``count_include_pad=False``). Max pooling accepts integer inputs; average needs floats.
    """

    mnemonic: ClassVar[str] = "pool"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    fn: PoolKind
    window: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        nd = _check_window_attrs(
            self,
            "pool",
            [("window", self.window), ("stride", self.stride), ("padding", self.padding)],
        )
        expect(
            all(k >= 1 for k in self.window) and all(s >= 1 for s in self.stride),
            self,
            f"window and stride must be >= 1, got {self.window} and {self.stride}",
        )
        expect(
            all(
                len(p) == 2 and 0 <= min(p) and max(p) < k
                for p, k in zip(self.padding, self.window, strict=True)
            ),
            self,
            f"padding must be (lo, hi) pairs >= 0 and smaller than the window {self.window}, "
            f"got {self.padding}",
        )
        (x,) = ins
        if self.fn is PoolKind.AVG:
            _float_input(self, x, "x")
        else:
            expect(not x.dtype.is_bool and not x.dtype.is_complex, self, f"cannot max-pool {x}")
        expect(x.rank == 2 + nd, self, f"{nd}-D pool needs x of rank {2 + nd} [N,C,*sp], got {x}")
        out = _spatial_out(self, x, self.window, self.stride, self.padding, (1,) * nd)
        return Shape((*x.dims[:2], *out), x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = upcast(xs[0])
        nd = len(self.window)
        pads = ((0, 0), (0, 0), *self.padding)
        axes = tuple(range(-nd, 0))
        ones = (1,) * nd
        if self.fn is PoolKind.MAX:
            low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
            xp = np.pad(x, pads, constant_values=low)
            return _window_view(xp, self.window, self.stride, ones).max(axis=axes)
        total = _window_view(np.pad(x, pads), self.window, self.stride, ones).sum(axis=axes)
        count = np.pad(np.ones(x.shape[2:], x.dtype), self.padding)
        count = _window_view(count[None, None], self.window, self.stride, ones).sum(axis=axes)
        return (total / count).astype(ctx.out_dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops import nn_rules

        return nn_rules.pool_vjp(self, g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops import nn_rules

        return nn_rules.pool_jvp(self, g, node, tangents)


# the graph builders (g.attention, g.conv, g.max_pool...) register with their module
from rlx.ops import nn_builders as _builders  # noqa: E402,F401
