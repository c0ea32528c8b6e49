"""Broadcast legalisation. In: a graph. Out: the same graph with an explicit ``expand``
inserted before each elementwise-op input whose broadcast the elementwise kernels do not
index directly.

The contract (shared with the CPU elementwise kernels and ElementwiseRegion codegen):
an elementwise kernel walks its output with one flat index ``i`` and reads each input at
``(i // inner) % size``, so an input is *legal* when its non-broadcast axes form one
contiguous run. Concretely, after left-padding the input's dims with 1s to the output
rank and ignoring axes where the output dim is 1, the axes where the input dim equals
the output dim (the others being 1) are consecutive. That covers equal shapes, scalars,
a bias over the last axes (``[N]`` vs ``[M, N]``), a row statistic
(``[B, S, 1]`` vs ``[B, S, D]``) and a ``[1, 1, S, S]`` mask. Anything else
(``[B, 1, D]`` vs ``[B, S, D]``, ``[B, 1, 1, S]`` vs ``[B, H, S, S]``) gets an
``expand`` to the output shape. Which ops are checked is derived from the ``elementwise``
flag (binary, compare, where; unary and cast have one input of the output's shape).
Other ops (matmul batch broadcast, attention masks) broadcast inside their own kernels.

Today's NumPy kernels broadcast any pattern themselves, so the expand costs one
materialised copy per such input and buys a uniform contract for flat-index (native)
elementwise code. The attention fusion looks through an expand in front of a mask.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlx.ir.mir import Graph, NodeId
from rlx.ops.movement import Expand
from rlx.passes.base import Rewriter
from rlx.shape import Dim

__all__ = ["BroadcastLegalization", "kernel_indexable"]


def kernel_indexable(in_dims: Sequence[Dim], out_dims: Sequence[Dim]) -> bool:
    """True when an input of ``in_dims`` broadcast to ``out_dims`` is one contiguous run
    of real axes (readable at ``(i // inner) % size`` from the flat output index)."""
    if len(in_dims) > len(out_dims):
        return False
    padded = (1,) * (len(out_dims) - len(in_dims)) + tuple(in_dims)
    run: list[bool] = []  # per non-unit output axis: does the input vary along it
    for d_in, d_out in zip(padded, out_dims, strict=True):
        if d_out == 1:
            continue
        if d_in == d_out:
            run.append(True)
        elif d_in == 1:
            run.append(False)
        else:
            return False
    if True not in run:
        return True
    first = run.index(True)
    last = len(run) - 1 - run[::-1].index(True)
    return all(run[first : last + 1])


class BroadcastLegalization:
    """Insert ``expand`` where an elementwise input's broadcast is not kernel-indexable."""

    name = "broadcast_legalization"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        rw = Rewriter(graph)
        cache: dict[tuple[NodeId, tuple[Dim, ...]], NodeId] = {}
        added: list[str] = []
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            if not node.op.elementwise or len(node.inputs) < 2:
                rw.copy(node)
                continue
            out = node.shape.dims
            ins = []
            for i in node.inputs:
                x = rw.map[i]
                dims = rw.new_shape(x).dims
                if dims == out or kernel_indexable(dims, out):
                    ins.append(x)
                    continue
                key = (x, out)
                if key not in cache:
                    cache[key] = rw.emit(Expand(out), [x], node.loc)
                    added.append(
                        f"%{nid} {node.op}: input %{i} [{','.join(map(str, dims))}] expanded "
                        f"to [{','.join(map(str, out))}]"
                    )
                ins.append(cache[key])
            rw.map[nid] = rw.dst.add_node(node.op, ins, node.shape, node.loc)
        if added:
            self.notes.append(f"inserted {len(added)} expands")
            self.notes.extend(added)
        return rw.finish()
