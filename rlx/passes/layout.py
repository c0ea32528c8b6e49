"""The NCHWc layout pass (``nchwc_layout``): chains of 2-D convolutions keep their
activations channel-blocked (``[N, ceil(C / b), H, W, b]``, :mod:`rlx.ops.layout`)
between one another, with one reorder where a chain starts and one where a tensor leaves
it, instead of every blocked conv kernel reordering its input and transposing its output.

In: an inference graph after the fusion passes (convs carry their bias, residual and
activation, ``fuse_conv_act``). Out: the graph with each chosen ``conv`` replaced by a
``conv_nchwc`` over blocked tensors, a ``to_nchwc`` on each NCHW tensor a chosen conv
reads as a residual or shares with other chosen convs (one per tensor; a chain's first
conv otherwise reads its NCHW input and reorders it itself) and a ``from_nchwc`` on
each chosen conv's output that something other than a chosen conv reads (or that is a
graph output).

A conv is a candidate (:class:`Candidate`) when it is f32, 2-D, static in its channels,
either dense (``groups == 1``) or depthwise (``groups == C == O``), with at least a block
of output channels and of input channels (or a dense stem of at most
:data:`STEM_MAX_C`); the kernels on blocks are the direct, Winograd F(2x2, 3x3) and
depthwise ones (``engines/conv_nchwc.py``).
A candidate is kept only when another kept candidate is its neighbour (produces its input
or residual, or reads its output as input or residual): a lone conv gains nothing from
two reorders around it. The block is the native conv library's (16 on AVX-512, 8 on
AVX2, 4 on aarch64 / portable); without that library the pass changes nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from rlx.dtype import DType
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.layout import ConvNchwc, FromNchwc, Nchwc, ToNchwc
from rlx.ops.nn import Conv
from rlx.passes.base import Rewriter

__all__ = ["NchwcLayout", "Layout", "Candidate", "candidate", "native_block"]

#: a dense conv with fewer input channels than a block (a network's RGB stem) joins a chain
#: only with at most this many (its input stays NCHW: ``conv_nchwc(nchw_input=True)``)
STEM_MAX_C = 4


class Layout(enum.Enum):
    """How a tensor of the rewritten graph holds an image."""

    NCHW = "nchw"
    NCHWC = "nchwc"


@dataclass(frozen=True)
class Candidate:
    """A conv the pass may block: its input channels C, output channels O and whether it
    reads a residual (the conv's last input)."""

    channels: int
    out_channels: int
    has_residual: bool


def native_block() -> int | None:
    """The native conv library's block for the selected target, None without it."""
    from rlx.backends.cpu.engines.conv_nchwc import nchwc_block  # backend: at run time

    return nchwc_block()


def candidate(graph: Graph, node: Node, block: int) -> Candidate | None:
    """The conv ``node`` as a :class:`Candidate` for blocks of ``block``, or None."""
    op = node.op
    if not isinstance(op, Conv) or len(op.stride) != 2 or node.dtype is not DType.F32:
        return None
    x, w = (graph.nodes[i].shape for i in node.inputs[:2])
    c, o = x.dims[1], w.dims[0]
    if not (isinstance(c, int) and isinstance(o, int)) or x.rank != 4:
        return None
    if not (op.groups == 1 or op.groups == c == o) or o < block:
        return None
    if c < block and (op.groups != 1 or c > STEM_MAX_C):
        return None
    return Candidate(c, o, op.has_residual)


def _chained(graph: Graph, cands: dict[NodeId, Candidate]) -> set[NodeId]:
    """The candidates with a candidate neighbour (through an input or a residual)."""
    linked: set[NodeId] = set()
    for nid, cand in cands.items():
        node = graph.nodes[nid]
        reads = [node.inputs[0]] + ([node.inputs[-1]] if cand.has_residual else [])
        for r in reads:
            if r in cands:
                linked |= {nid, r}
    return linked


class NchwcLayout:
    """See the module docstring. ``block``: the channels per block (None: the native conv
    library's, :func:`native_block`)."""

    name = "nchwc_layout"

    def __init__(self, block: int | None = None, block_of: Callable[[], int | None] = native_block):
        self.block = block
        self.block_of = block_of
        self.notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        block = self.block if self.block is not None else self.block_of()
        if block is None:
            self.notes.append("no native conv library: layout left NCHW")
            return graph
        cands = {
            n.id: c for n in graph.nodes if (c := candidate(graph, n, block)) is not None
        }  # fmt: skip
        chosen = _chained(graph, cands)
        if not chosen:
            return graph
        layout = Nchwc(block)
        # which chosen convs' outputs something reads as NCHW (or the graph returns)
        nchw_read: set[NodeId] = {o for o in graph.outputs if o in chosen}
        for n in graph.nodes:
            blocked_slots = {0, len(n.inputs) - 1} if n.id in chosen else set()
            if n.id in chosen and not cands[n.id].has_residual:
                blocked_slots = {0}
            for k, i in enumerate(n.inputs):
                if i in chosen and k not in blocked_slots:
                    nchw_read.add(i)
        readers: dict[NodeId, int] = {}  # tensor -> how many chosen convs read it blocked
        for nid in chosen:
            node = graph.nodes[nid]
            tensors = {node.inputs[0]} | ({node.inputs[-1]} if cands[nid].has_residual else set())
            for t in tensors:
                readers[t] = readers.get(t, 0) + 1
        rw = Rewriter(graph)
        blocked: dict[NodeId, NodeId] = {}  # old id -> its blocked tensor in the new graph
        layouts: dict[NodeId, Layout] = {}
        entries = exits = 0

        def as_blocked(old: NodeId) -> NodeId:
            nonlocal entries
            if old not in blocked:
                blocked[old] = rw.emit(ToNchwc(layout), [rw.map[old]], graph.nodes[old].loc)
                entries += 1
            return blocked[old]

        for nid in graph.topo_order():
            node = graph.nodes[nid]
            if nid not in chosen:
                rw.copy(node)
                continue
            op: Conv = node.op  # type: ignore[assignment]
            cand = cands[nid]
            x = node.inputs[0]
            # a chain's entry reorders its own input unless other blocked convs read it too
            nchw_input = x not in blocked and (cand.channels < block or readers[x] == 1)
            ins = [rw.map[x] if nchw_input else as_blocked(x)]
            ins += [rw.map[i] for i in node.inputs[1 : 2 + op.has_bias]]
            if cand.has_residual:
                ins.append(as_blocked(node.inputs[-1]))
            conv = ConvNchwc(op, layout, cand.channels, nchw_input)
            new = rw.emit(conv, ins, node.loc)
            blocked[nid] = new
            layouts[nid] = Layout.NCHWC
            if nid in nchw_read:
                rw.map[nid] = rw.emit(FromNchwc(layout, cand.out_channels), [new], node.loc)
                exits += 1
        self.notes.append(
            f"{len(layouts)} convs on NCHWc blocks of {block} ({entries} reorders in, "
            f"{exits} out; {len(cands) - len(chosen)} lone candidates left NCHW)"
        )
        return rw.finish()
