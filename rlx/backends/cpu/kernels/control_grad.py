"""CPU kernels of the scan's backward ops (:mod:`rlx.ops.control_grad`): the reverse step
``vjp_body`` compiled once as a sub-program (``kernels/control.py``'s
:class:`SubProgram`) and run per step in the reverse of the forward order. The float
carries' cotangents live in scratch made at build time; per step the sub-program reads
them, the saved carries' slices (a pass-through carry whole), the
xs' slices and the step's ``y`` cotangent; a ScanBackwardXs copies its x cotangent into
``out[t]``, a ScanBackward copies the final carry cotangent into ``out``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.backends.cpu.kernels.control import SubProgram, _note
from rlx.ops.control import _floats
from rlx.ops.control_grad import ScanBackward, ScanBackwardXs

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["scan_backward_kernel"]


def scan_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Both ops: the reverse loop over ``vjp_body``'s sub-program (see the module
    docstring)."""
    op: ScanBackward | ScanBackwardXs = node.op  # type: ignore[assignment]
    f = op.fwd
    nc, o = f.num_carry, f.output_index
    n = f.length if isinstance(f.length, int) else f.length.evaluate(ctx.bindings)
    body = SubProgram(op.vjp_body, ctx.bindings, ctx)
    _note(ctx, "vjp_body", body)
    carries, seq, ct = ins[:nc], ins[nc:-1], ins[-1]
    shapes = [ctx.graph.nodes[i].shape for i in node.inputs[:nc]]
    cshape = [s.with_dims(s.dims[1:]) if k else s for s, k in zip(shapes, op.saved, strict=True)]
    fc = _floats(cshape)
    xshape = [ctx.graph.nodes[i].shape for i in node.inputs[nc:-1]]
    fx = _floats([s.with_dims(s.dims[1:]) for s in xshape])
    nd = len(fc)
    dc = [
        ctx.scratch(c.shape[1:] if k else c.shape, c.dtype, 640 + a)
        for a, (c, k) in enumerate((carries[j], op.saved[j]) for j in fc)
    ]
    init = [ct if j == o else None for j in fc]
    steps = range(n) if f.reverse else range(n - 1, -1, -1)
    fixed = [(nd + j, c) for j, (c, k) in enumerate(zip(carries, op.saved, strict=True)) if not k]
    stepped = [(nd + j, c) for j, (c, k) in enumerate(zip(carries, op.saved, strict=True)) if k]
    stepped += [(nd + nc + i, x) for i, x in enumerate(seq)]
    if o >= nc:
        stepped.append((nd + nc + len(seq), ct))
    plan = [[(k, a[t, ...]) for k, a in stepped] for t in steps]
    xs_grad = isinstance(op, ScanBackwardXs)
    pick = nd + fx.index(op.wrt) if xs_grad else fc.index(op.wrt)
    y_view = body.outputs[pick]
    outs_t = [out[t, ...] for t in steps] if xs_grad else []

    def run() -> None:
        for d, c0 in zip(dc, init, strict=True):
            if c0 is None:
                d.fill(0)
            else:
                np.copyto(d, c0, casting="unsafe")
        for s, feeds in enumerate(plan):
            for a, d in enumerate(dc):
                body.feed(a, d)
            for k, c in fixed:  # every step: the sub-program's arena may reuse input slots
                body.feed(k, c)
            for k, v in feeds:
                body.feed(k, v)
            body.run()
            if xs_grad:
                np.copyto(outs_t[s], y_view, casting="unsafe")
            for d, y in zip(dc, body.outputs[:nd], strict=True):
                np.copyto(d, y, casting="unsafe")
        if not xs_grad:
            np.copyto(out, dc[pick], casting="unsafe")

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    ScanBackward: (scan_backward_kernel,),
    ScanBackwardXs: (scan_backward_kernel,),
}
