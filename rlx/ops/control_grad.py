"""Reverse mode of ``Scan``: the seed's ``ScanBackward`` (the gradient of a carry: a
recurrent state, or a weight the body passes through) and ``ScanBackwardXs`` (the per-step
gradient of a scanned input), what ``Scan.vjp`` emits.

Both are ``(fwd, vjp_body, wrt, saved)`` over the inputs ``(*saved carries, *xs, ct)``:

* ``fwd`` the forward :class:`~rlx.ops.control.Scan`, ``ct`` the cotangent of its output
  ``fwd.output_index`` (a final carry, or a stacked ``y``);
* saved carry ``j``: the carries step ``t`` read, stacked ``[length, ...]`` (one forward
  scan makes them) when ``saved[j]``; the carry itself when the body passes it through
  unchanged (a weight: the same at every step, so never stacked);
* ``vjp_body`` (:func:`scan_vjp_body`): one step of reverse mode, ``(dc..., c..., x...,
  [dy]) -> (dc'..., dx...)``: the cotangents of the float carries entering the step from
  those leaving it (and the step's ``y`` cotangent), and of the step's float ``x``.

The op runs ``vjp_body`` once per step in the reverse of the forward order, carrying the
float carries' cotangents (starting from ``ct`` for the carry ``ct`` belongs to, zeros
otherwise). ``ScanBackward`` returns carry ``wrt``'s final cotangent (the initial carry's
gradient: for a weight, the sum over the steps), ``ScanBackwardXs`` the cotangents of
``xs[wrt]`` stacked over the steps (``[length, ...]``). A node has one output, so each
gradient is one node (each runs the loop).

``lower`` builds the same value as an ordinary reverse ``Scan`` over the saved carries (a
pass-through carry broadcast along the steps); the ops' own derivatives are the
lowering's (``rlx/ops/lowered.py``), so scans differentiate twice (Hessian-vector products
through a scan).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.control import (
    Scan,
    _add_ct,
    _feeds,
    _floats,
    _grads_or_zeros,
    _inputs,
    check_subgraph,
    inline,
    run_subgraph,
)
from rlx.ops.lowered import lowered_jvp, lowered_vjp
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["ScanBackward", "ScanBackwardXs", "scan_vjp_body", "passes_through", "scan_vjp"]


def passes_through(body: Graph, j: int) -> bool:
    """Whether ``body`` returns its carry ``j`` unchanged (output ``j`` is input ``in<j>``)."""
    from rlx.ops.core import Input

    n = body.nodes[body.outputs[j]]
    return isinstance(n.op, Input) and n.op.name == f"in{j}"


def scan_vjp_body(fwd: Scan, cshape: Sequence[Shape], xshape: Sequence[Shape]) -> Graph:
    """One reverse step of ``fwd``: inputs ``(dc for each float carry, every carry, every
    x slice[, dy])``, outputs the float carries' cotangents then the float xs'."""
    from rlx.ir.mir import Graph

    nc, o = fwd.num_carry, fwd.output_index
    fc, fx = _floats(cshape), _floats(xshape)
    s = Graph(f"{fwd.body.name}.vjp")
    dc = _inputs(s, [cshape[j] for j in fc])
    cin = _inputs(s, cshape, len(dc))
    xin = _inputs(s, xshape, len(dc) + nc)
    outs = inline(s, fwd.body, _feeds([*cin, *xin]))
    cts: dict[NodeId, NodeId] = {}
    for a, j in enumerate(fc):
        _add_ct(s, cts, outs[j], dc[a])
    if o >= nc:
        _add_ct(s, cts, outs[o], s.input(f"in{len(dc) + nc + len(xin)}", s.shape(outs[o])))
    s.set_outputs(_grads_or_zeros(s, cts, [*(cin[j] for j in fc), *(xin[i] for i in fx)]))
    return s


def scan_vjp(op: Scan, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
    """``Scan.vjp``: the carries each step read, stacked by one forward scan per carry the
    body changes, then one ScanBackward per float carry and one ScanBackwardXs per float
    x (those no gradient needs are dropped as dead code)."""
    from rlx.ir.mir import Graph

    nc = op.num_carry
    ins = list(node.inputs)
    cshape = [g.shape(i) for i in ins[:nc]]
    xshape = [g.shape(i).with_dims(g.shape(i).dims[1:]) for i in ins[nc:]]
    ny = len(op.body.outputs) - nc
    saved = tuple(not passes_through(op.body, j) for j in range(nc))
    stack = Graph(f"{op.body.name}.carries")  # the body, plus each step's input carries
    sin = _inputs(stack, [*cshape, *xshape])
    stack.set_outputs([*inline(stack, op.body, _feeds(sin)), *sin[:nc]])
    kept = [
        g.apply(Scan(stack, op.length, nc, nc + ny + j, op.reverse), ins) if saved[j] else ins[j]
        for j in range(nc)
    ]
    body = scan_vjp_body(op, cshape, xshape)
    bwd = [*kept, *ins[nc:], ct]
    grads: dict[int, NodeId] = {}
    for j in _floats(cshape):
        grads[j] = g.apply(ScanBackward(op, body, j, saved), bwd)
    for i in _floats(xshape):
        grads[nc + i] = g.apply(ScanBackwardXs(op, body, i, saved), bwd)
    return tuple(grads.get(k) for k in range(len(ins)))


class _ScanGrad(Op):
    """The shared body of ScanBackward and ScanBackwardXs (see the module docstring)."""

    kind: ClassVar[OpKind] = OpKind.COMPUTE  # the seed's class
    fwd: Scan  # (fields are redeclared by each registered subclass)
    vjp_body: Graph
    wrt: int
    saved: tuple[bool, ...]
    xs_grad: ClassVar[bool] = False

    def num_inputs(self) -> int | None:
        return None

    def _shapes(self, ins: tuple[Shape, ...]) -> tuple[list[Shape], list[Shape]]:
        """(carry shapes, x slice shapes), checked against the forward scan."""
        f = self.fwd
        nc = f.num_carry
        expect(
            isinstance(self.saved, tuple) and len(self.saved) == nc,
            self,
            f"saved must give one flag per carry ({nc}), got {self.saved!r}",
        )
        expect(len(ins) >= nc + 1, self, f"expected the {nc} carries, the xs and ct")
        cshape = []
        for j, (s, keep) in enumerate(zip(ins[:nc], self.saved, strict=True)):
            if keep:
                expect(
                    s.rank >= 1 and s.dims[0] == f.length,
                    self,
                    f"saved carry {j} is {s}, it must be stacked over the {f.length} steps",
                )
                s = s.with_dims(s.dims[1:])
            cshape.append(s)
        out = f.infer((*cshape, *ins[nc:-1]))
        expect(
            ins[-1] == out, self, f"the cotangent must match the scan's output {out}, got {ins[-1]}"
        )
        xshape = [x.with_dims(x.dims[1:]) for x in ins[nc:-1]]
        want = [*(cshape[j] for j in _floats(cshape)), *cshape, *xshape]
        if f.output_index >= nc:
            want.append(out.with_dims(out.dims[1:]))
        check_subgraph(self, self.vjp_body, "vjp_body", want)
        return cshape, xshape

    def _infer(self, ins: tuple[Shape, ...]) -> Shape:
        cshape, xshape = self._shapes(ins)
        fl = _floats(xshape if self.xs_grad else cshape)
        what = "xs" if self.xs_grad else "carries"
        expect(
            self.wrt in fl,
            self,
            f"wrt {self.wrt} is not one of the float {what} {fl} of the scan",
        )
        if self.xs_grad:
            return ins[self.fwd.num_carry + self.wrt]
        return cshape[self.wrt]

    def _reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        f = self.fwd
        nc, o = f.num_carry, f.output_index
        n = f.length if isinstance(f.length, int) else f.length.evaluate(ctx.bindings)
        carries, seq, ct = xs[:nc], xs[nc:-1], xs[-1]
        cshape = [c.shape[1:] if k else c.shape for c, k in zip(carries, self.saved, strict=True)]
        fc = [j for j, c in enumerate(carries) if c.dtype.kind in "fcV"]
        fx = [i for i, x in enumerate(seq) if x.dtype.kind in "fcV"]
        dc = [ct if j == o else np.zeros(cshape[j], carries[j].dtype) for j in fc]
        steps = range(n) if f.reverse else range(n - 1, -1, -1)
        dxs: list[np.ndarray | None] = [None] * n
        for t in steps:
            cin = [c[t] if k else c for c, k in zip(carries, self.saved, strict=True)]
            extra = [ct[t]] if o >= nc else []
            outs = run_subgraph(self.vjp_body, [*dc, *cin, *(x[t] for x in seq), *extra])
            dc = outs[: len(fc)]
            if self.xs_grad:
                dxs[t] = outs[len(fc) + fx.index(self.wrt)]
        if not self.xs_grad:
            return np.asarray(dc[fc.index(self.wrt)]).astype(ctx.out_dtype)
        if n == 0:
            return np.zeros(ctx.out_dims, ctx.out_dtype)
        return np.stack(dxs).astype(ctx.out_dtype)  # type: ignore[arg-type]

    def lower(self, g: Graph, ins: Sequence[NodeId]) -> NodeId:
        """The ordinary reverse Scan over the saved carries (pass-through carries broadcast
        along the steps)."""
        from rlx.ops.rules import zeros

        f = self.fwd
        nc, o = f.num_carry, f.output_index
        n = f.length
        ct = ins[-1]
        stacked = []
        for c, keep in zip(ins[:nc], self.saved, strict=True):
            if not keep:
                dims = list(g.shape(c).dims)
                c = g.expand(g.reshape(c, [1, *dims]), [n, *dims])
            stacked.append(c)
        cshape = [g.shape(c).with_dims(g.shape(c).dims[1:]) for c in stacked]
        xshape = [g.shape(x).with_dims(g.shape(x).dims[1:]) for x in ins[nc:-1]]
        fc = _floats(cshape)
        init = [ct if j == o else zeros(g, cshape[j]) for j in fc]
        bwd = [*init, *stacked, *ins[nc:-1], *([ct] if o >= nc else [])]
        k = len(fc) + _floats(xshape).index(self.wrt) if self.xs_grad else fc.index(self.wrt)
        return g.apply(Scan(self.vjp_body, n, len(fc), k, not f.reverse), bwd)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return lowered_vjp(g, node, ct, self.lower)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return lowered_jvp(g, node, tangents, self.lower)

    def subgraphs(self) -> tuple[Graph, ...]:
        return (self.vjp_body,)

    def attrs_str(self) -> str:
        return f"{self.fwd.attrs_str()}, wrt={self.wrt}, saved={self.saved}"


@register
class ScanBackward(_ScanGrad):
    """The gradient of the initial carry ``wrt`` of the scan ``fwd``: ``vjp_body`` run in
    reverse over the saved carries; inputs ``(*saved carries, *xs, ct)`` (see the module
    docstring)."""

    mnemonic: ClassVar[str] = "scan_backward"
    fwd: Scan
    vjp_body: Graph
    wrt: int
    saved: tuple[bool, ...]

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return self._infer(ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return self._reference(xs, ctx)


@register
class ScanBackwardXs(_ScanGrad):
    """The gradient of the scanned input ``xs[wrt]`` of the scan ``fwd``, stacked over the
    steps (``[length, ...]``): ``vjp_body`` run in reverse over the saved carries; inputs
    ``(*saved carries, *xs, ct)`` (see the module docstring)."""

    mnemonic: ClassVar[str] = "scan_backward_xs"
    xs_grad: ClassVar[bool] = True
    fwd: Scan
    vjp_body: Graph
    wrt: int
    saved: tuple[bool, ...]

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return self._infer(ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return self._reference(xs, ctx)
