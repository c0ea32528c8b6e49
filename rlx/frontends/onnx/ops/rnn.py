"""RNN / GRU / LSTM -> an unrolled MIR chain over the (static) sequence length: the input
projection of every step is one matmul, then per step a matmul with the recurrence weights
and the gate arithmetic, exactly as the ONNX reference orders it (gates i, o, f, c for
LSTM with peepholes; z, r, h for GRU with linear_before_reset; forward, reverse or both
directions; layout 0 or 1; clip). Variable sequence lengths (sequence_lens below the
sequence length) are named unsupported."""

from __future__ import annotations

import numpy as np

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import bin_, scalar, un
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Concat, Gather, Reshape, Slice, Transpose

_ACT = {"tanh": U.TANH, "sigmoid": U.SIGMOID, "relu": U.RELU}


class _Cell:
    def __init__(self, ctx: NodeCtx, default_acts: list[str], n_dir: int):
        self.ctx, self.g = ctx, ctx.g
        acts = ctx.attr("activations") or default_acts * n_dir
        self.acts = [a.lower() for a in acts]
        for a in self.acts:
            if a not in _ACT:
                raise ctx.unsupported(f"activation {a!r}")
        self.alphas = ctx.attr("activation_alpha")
        self.clip = ctx.attr("clip")

    def act(self, k: int, x: int) -> int:
        g = self.g
        if self.clip is not None:
            c = float(self.clip)
            x = bin_(g, B.MIN, bin_(g, B.MAX, x, scalar(g, -c, x)), scalar(g, c, x))
        return un(g, _ACT[self.acts[k]], x)

    def mm(self, a: int, b: int) -> int:
        return self.g.apply(MatMul(), [a, b])

    def cols(self, x: int, i: int, n: int, h: int) -> int:
        """Gate block i of n along the last axis (each h wide)."""
        r = self.g.shape(x).rank
        st = (None,) * (r - 1) + (i * h,)
        en = (None,) * (r - 1) + ((i + 1) * h,)
        return self.g.apply(Slice(st, en, (1,) * r), [x])


def _pick(g, x: int, d: int) -> int:  # noqa: ANN001
    return g.apply(Gather(0), [x, g.constant(np.asarray(d, np.int64))])


def _common(ctx: NodeCtx, gates: int):  # noqa: ANN202
    g = ctx.g
    x, w, r = ctx.x(0), ctx.x(1), ctx.x(2)
    layout = int(ctx.attr("layout", 0))
    if layout:
        x = g.apply(Transpose((1, 0, 2)), [x])
    seq, batch, _ = (int(v) for v in ctx.shape(x).dims)
    if ctx.has(4):
        lens = np.asarray(ctx.value(4, "sequence_lens")).reshape(-1)
        if np.any(lens != seq):
            raise ctx.unsupported("sequence_lens shorter than the sequence (variable lengths)")
    n_dir = int(ctx.shape(w).dims[0])
    hid = int(ctx.shape(r).dims[-1])
    return x, w, r, layout, seq, batch, n_dir, hid


def _init(ctx: NodeCtx, i: int, d: int, layout: int, batch: int, hid: int, like: int) -> int:
    g = ctx.g
    if ctx.has(i):
        h0 = ctx.x(i)
        if layout:
            h0 = g.apply(Transpose((1, 0, 2)), [h0])
        return _pick(g, h0, d)
    return g.constant(np.zeros((batch, hid), ctx.dtype(like).np))


def _steps(g, xw: int, seq: int, reverse: bool) -> list[int]:  # noqa: ANN001
    order = range(seq - 1, -1, -1) if reverse else range(seq)
    return [_pick(g, xw, t) for t in order]


def _finish(
    ctx: NodeCtx,
    per_dir: list[list[int]],
    finals: list[list[int]],
    layout: int,
    reverse: list[bool],
):  # noqa: ANN202
    """Y [seq, dir, batch, hid] (or layout 1) and each final state [dir, batch, hid]."""
    g = ctx.g
    ys = []
    for hs, rev in zip(per_dir, reverse, strict=True):
        hs = hs[::-1] if rev else hs
        b, h = g.shape(hs[0]).dims
        ys.append(g.apply(Concat(0), [g.apply(Reshape((1, 1, b, h)), [v]) for v in hs]))
    y = ys[0] if len(ys) == 1 else g.apply(Concat(1), ys)
    outs = [y]
    for states in finals:
        b, h = g.shape(states[0]).dims
        parts = [g.apply(Reshape((1, b, h)), [v]) for v in states]
        outs.append(parts[0] if len(parts) == 1 else g.apply(Concat(0), parts))
    if layout:
        outs = [g.apply(Transpose((2, 0, 1, 3)), [outs[0]])] + [
            g.apply(Transpose((1, 0, 2)), [o]) for o in outs[1:]
        ]
    return outs


def _dirs(ctx: NodeCtx, n_dir: int) -> list[bool]:
    d = ctx.attr("direction", "forward")
    return [False, True] if d == "bidirectional" else [d == "reverse"] * n_dir


def _proj(cell: _Cell, x: int, w: int, b: int | None, seq: int, batch: int) -> int:
    g = cell.g
    xw = cell.mm(x, g.apply(Transpose((1, 0)), [w]))  # [seq, batch, G*H]
    return xw if b is None else bin_(g, B.ADD, xw, b)


def _bias(ctx: NodeCtx, d: int, n: int, hid: int) -> tuple[int | None, int | None]:
    if not ctx.has(3):
        return None, None
    g = ctx.g
    bd = _pick(g, ctx.x(3), d)
    wb = g.apply(Slice((0,), (n * hid,), (1,)), [bd])
    rb = g.apply(Slice((n * hid,), (2 * n * hid,), (1,)), [bd])
    return wb, rb


@converter("RNN", since=7)
def rnn(ctx: NodeCtx) -> list[int]:
    g = ctx.g
    x, w, r, layout, seq, batch, n_dir, hid = _common(ctx, 1)
    cell = _Cell(ctx, ["Tanh"], n_dir)
    rev = _dirs(ctx, n_dir)
    per_dir, finals = [], []
    for d in range(n_dir):
        wb, rb = _bias(ctx, d, 1, hid)
        b = None if wb is None else bin_(g, B.ADD, wb, rb)
        xw = _proj(cell, x, _pick(g, w, d), b, seq, batch)
        rt = g.apply(Transpose((1, 0)), [_pick(g, r, d)])
        h = _init(ctx, 5, d, layout, batch, hid, x)
        hs = []
        for xt in _steps(g, xw, seq, rev[d]):
            h = cell.act(d, bin_(g, B.ADD, xt, cell.mm(h, rt)))
            hs.append(h)
        per_dir.append(hs)
        finals.append(h)
    return _finish(ctx, per_dir, [finals], layout, rev)


@converter("GRU", since=7)
def gru(ctx: NodeCtx) -> list[int]:
    g = ctx.g
    x, w, r, layout, seq, batch, n_dir, hid = _common(ctx, 3)
    cell = _Cell(ctx, ["Sigmoid", "Tanh"], n_dir)
    lbr = bool(ctx.attr("linear_before_reset", 0))
    rev = _dirs(ctx, n_dir)
    per_dir, finals = [], []
    for d in range(n_dir):
        wb, rb = _bias(ctx, d, 3, hid)
        xw = _proj(cell, x, _pick(g, w, d), wb, seq, batch)
        rd = _pick(g, r, d)
        r_zr = g.apply(
            Transpose((1, 0)), [g.apply(Slice((0, None), (2 * hid, None), (1, 1)), [rd])]
        )
        r_h = g.apply(
            Transpose((1, 0)), [g.apply(Slice((2 * hid, None), (None, None), (1, 1)), [rd])]
        )
        rb_zr = None if rb is None else g.apply(Slice((0,), (2 * hid,), (1,)), [rb])
        rb_h = None if rb is None else g.apply(Slice((2 * hid,), (3 * hid,), (1,)), [rb])
        h = _init(ctx, 5, d, layout, batch, hid, x)
        one = scalar(g, 1.0, x)
        hs = []
        for xt in _steps(g, xw, seq, rev[d]):
            zr = bin_(g, B.ADD, cell.cols(xt, 0, 1, 2 * hid), cell.mm(h, r_zr))
            if rb_zr is not None:
                zr = bin_(g, B.ADD, zr, rb_zr)
            z = cell.act(2 * d, cell.cols(zr, 0, 2, hid))
            rr = cell.act(2 * d, cell.cols(zr, 1, 2, hid))
            xh = cell.cols(xt, 2, 3, hid)
            if lbr:
                hr = cell.mm(h, r_h)
                if rb_h is not None:
                    hr = bin_(g, B.ADD, hr, rb_h)
                hh = bin_(g, B.ADD, xh, bin_(g, B.MUL, rr, hr))
            else:
                hh = bin_(g, B.ADD, xh, cell.mm(bin_(g, B.MUL, rr, h), r_h))
                if rb_h is not None:
                    hh = bin_(g, B.ADD, hh, rb_h)
            hh = cell.act(2 * d + 1, hh)
            h = bin_(g, B.ADD, bin_(g, B.MUL, bin_(g, B.SUB, one, z), hh), bin_(g, B.MUL, z, h))
            hs.append(h)
        per_dir.append(hs)
        finals.append(h)
    return _finish(ctx, per_dir, [finals], layout, rev)


@converter("LSTM", since=7)
def lstm(ctx: NodeCtx) -> list[int]:
    g = ctx.g
    x, w, r, layout, seq, batch, n_dir, hid = _common(ctx, 4)
    if ctx.attr("input_forget", 0):
        raise ctx.unsupported("input_forget=1 (coupled input and forget gates)")
    cell = _Cell(ctx, ["Sigmoid", "Tanh", "Tanh"], n_dir)
    rev = _dirs(ctx, n_dir)
    per_dir, fin_h, fin_c = [], [], []
    for d in range(n_dir):
        wb, rb = _bias(ctx, d, 4, hid)
        b = None if wb is None else bin_(g, B.ADD, wb, rb)
        xw = _proj(cell, x, _pick(g, w, d), b, seq, batch)
        rt = g.apply(Transpose((1, 0)), [_pick(g, r, d)])
        h = _init(ctx, 5, d, layout, batch, hid, x)
        c = _init(ctx, 6, d, layout, batch, hid, x)
        peep = None
        if ctx.has(7):
            pd = _pick(g, ctx.x(7), d)
            peep = [g.apply(Slice((k * hid,), ((k + 1) * hid,), (1,)), [pd]) for k in range(3)]
        hs = []
        for xt in _steps(g, xw, seq, rev[d]):
            gates = bin_(g, B.ADD, xt, cell.mm(h, rt))
            i, o, f, cc = (cell.cols(gates, k, 4, hid) for k in range(4))
            if peep is not None:
                i = bin_(g, B.ADD, i, bin_(g, B.MUL, peep[0], c))
                f = bin_(g, B.ADD, f, bin_(g, B.MUL, peep[2], c))
            i, f = cell.act(3 * d, i), cell.act(3 * d, f)
            c = bin_(g, B.ADD, bin_(g, B.MUL, f, c), bin_(g, B.MUL, i, cell.act(3 * d + 1, cc)))
            if peep is not None:
                o = bin_(g, B.ADD, o, bin_(g, B.MUL, peep[1], c))
            o = cell.act(3 * d, o)
            h = bin_(g, B.MUL, o, cell.act(3 * d + 2, c))
            hs.append(h)
        per_dir.append(hs)
        fin_h.append(h)
        fin_c.append(c)
    return _finish(ctx, per_dir, [fin_h, fin_c], layout, rev)
