"""What the HTML view draws. In: a MIR graph (optionally the compiled program's source
graph, kernel kinds and buffer plan). Out: a :class:`View`: the drawable nodes (Inputs and
compute nodes; params, constants and, for a compiled graph, the prologue's param-derived
nodes such as weight casts are folded into the nodes that read them), the edges
between them, the blocks they are grouped in, and each node's facts (op, name, shape,
dtype, precision, source line, fusion group, kernel, arena slot).

Blocks. A param's block is its name up to the first numeric component
(``encoder.layer.3.attention.self.query.weight`` -> ``encoder.layer.3``, ``layer7.mlp.up``
-> ``layer7``), else its first component (``embeddings``, ``final_norm``). A node that reads
a param joins that param's block; one that reads none joins the latest block among its
inputs, else the earliest among its readers; inputs sit in ``inputs``. A compiled node
takes the block its user node had in the source graph (by provenance, ``loc.node``).
A block of more than :data:`MAX_BLOCK` nodes is split into consecutive parts, so a graph
without named params still opens a screenful at a time.

Fusion groups: a node that replaced several user nodes (``loc.fused``) is a fused kernel;
its group is its op's name (``fused_matmul_bias_act``, ``elementwise_region``, ...).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rlx.ir.lir import BufferPlan
from rlx.ir.mir import Graph, Node, op_name
from rlx.ops.core import Constant, Input, Param

__all__ = ["ViewNode", "View", "build_view", "block_of_name", "MAX_BLOCK", "INPUTS"]

MAX_BLOCK = 48
INPUTS = "inputs"
_LOW_PRECISION = ("bf16", "f16")


@dataclass
class ViewNode:
    """One drawn node and the facts the page shows about it."""

    id: int
    op: str
    title: str  # '%19 matmul (model.py:42)' or the input's name
    name: str  # what a search matches: title, op, block, the params it reads
    shape: str
    dtype: str
    block: str
    precision: str | None = None  # bf16 / f16 when the node runs narrow
    source: str = ""
    group: str | None = None  # fusion group (fused op name) or None
    fused: tuple[str, ...] = ()
    kernel: str = ""
    slot: str = ""
    reads: tuple[str, ...] = ()  # params and constants folded into this node
    output: int | None = None  # index among the graph outputs


@dataclass
class View:
    """A graph ready to lay out (see the module docstring)."""

    name: str
    stage: str
    nodes: dict[int, ViewNode]
    edges: list[tuple[int, int]]
    blocks: list[str]
    plan: BufferPlan | None = None
    graph: Graph | None = None
    notes: list[str] = field(default_factory=list)
    fusion_text: str = ""
    param_bytes: dict[str, int] = field(default_factory=dict)

    def block_nodes(self, block: str) -> list[int]:
        return [n.id for n in self.nodes.values() if n.block == block]


_NUMERIC = re.compile(r"^\d+$")
_TRAILING_NUMBER = re.compile(r"^[A-Za-z_]+\d+$")


def block_of_name(name: str) -> str | None:
    """The block a param name belongs to (see the module docstring); None for a name
    without a dot (nothing to group by)."""
    parts = name.split(".")
    if len(parts) < 2:
        return None
    for i, p in enumerate(parts[:-1]):
        if _NUMERIC.match(p) or _TRAILING_NUMBER.match(p):
            return ".".join(parts[: i + 1])
    return parts[0]


def _is_leaf(node: Node) -> bool:
    return isinstance(node.op, (Param, Constant))


def _assign_blocks(graph: Graph, hint: Mapping[int, str] | None = None) -> dict[int, str]:
    """Node id -> block for every drawn (non-leaf) node of ``graph``."""
    order = graph.topo_order()
    rank: dict[str, int] = {}
    block: dict[int, str | None] = {}

    def note(b: str) -> str:
        rank.setdefault(b, len(rank))
        return b

    for nid in order:
        node = graph.nodes[nid]
        if isinstance(node.op, Param):
            b = block_of_name(node.op.name)
            block[nid] = b and note(b)
    readers = graph.consumers()
    for nid in order:
        node = graph.nodes[nid]
        if _is_leaf(node):
            continue
        if isinstance(node.op, Input):
            block[nid] = None
            continue
        b = hint.get(nid) if hint else None
        if b is None:
            params = [block[i] for i in node.inputs if isinstance(graph.nodes[i].op, Param)]
            params = [p for p in params if p]
            if params:
                b = min(params, key=lambda p: rank[p])
        if b is None:
            seen = [block[i] for i in node.inputs if not _is_leaf(graph.nodes[i]) and block[i]]
            if seen:
                b = max(seen, key=lambda p: rank[p])
        block[nid] = note(b) if b else None
    for nid in reversed(order):  # nodes before any param: their readers' block
        if block.get(nid) is None and not _is_leaf(graph.nodes[nid]):
            if isinstance(graph.nodes[nid].op, Input):
                continue
            later = [block[r] for r in readers[nid] if block.get(r)]
            if later:
                block[nid] = min(later, key=lambda p: rank[p])
    out: dict[int, str] = {}
    for nid in order:
        node = graph.nodes[nid]
        if _is_leaf(node):
            continue
        if isinstance(node.op, Input):
            out[nid] = INPUTS
        else:
            out[nid] = block.get(nid) or graph.name
    return out


def _split_large(blocks: dict[int, str], order: Sequence[int], limit: int) -> dict[int, str]:
    """Split every block of more than ``limit`` nodes into consecutive parts."""
    members: dict[str, list[int]] = {}
    for nid in order:
        if nid in blocks:
            members.setdefault(blocks[nid], []).append(nid)
    out = dict(blocks)
    for b, ids in members.items():
        if len(ids) <= limit:
            continue
        parts = -(-len(ids) // limit)
        size = -(-len(ids) // parts)
        for k in range(parts):
            for nid in ids[k * size : (k + 1) * size]:
                out[nid] = f"{b} [{k + 1}/{parts}]"
    return out


def _source_text(node: Node) -> str:
    loc = node.loc
    if loc is None or not loc.known:
        return ""
    return f"{os.path.basename(loc.file)}:{loc.line} in {loc.function}"


def _leaf_text(node: Node) -> str:
    if isinstance(node.op, Param):
        return f"param {node.op.name}: {node.shape}"
    if isinstance(node.op, Constant):
        return f"constant: {node.shape}"
    return f"{node.label}, once per param change: {node.shape}"


def _param_name(node: Node) -> str:
    return node.op.name if isinstance(node.op, Param) else ""


def build_view(
    graph: Graph,
    stage: str,
    *,
    plan: BufferPlan | None = None,
    source: Graph | None = None,
    kernels: Mapping[int, str] | None = None,
    folded: frozenset[int] = frozenset(),
    limit: int = MAX_BLOCK,
) -> View:
    """The :class:`View` of ``graph`` (``source``: the user's graph it was compiled from,
    whose blocks compiled nodes keep; ``kernels``: node id -> kernel kind; ``folded``:
    nodes drawn like params, inside their readers: the prologue's param-derived nodes)."""
    hint: dict[int, str] | None = None
    if source is not None:
        src_blocks = _assign_blocks(source)
        hint = {}
        for n in graph.nodes:
            loc = n.loc
            if loc is None:
                continue
            ids = [m.node for m in loc.fused] or [loc.node]
            found = [src_blocks.get(i) for i in ids if i is not None]
            found = [f for f in found if f is not None and f != INPUTS]
            if found:
                hint[n.id] = found[-1]
    order = graph.topo_order()
    blocks = _split_large(_assign_blocks(graph, hint), order, limit)
    outputs = {o: k for k, o in reversed(list(enumerate(graph.outputs)))}
    nodes: dict[int, ViewNode] = {}
    edges: list[tuple[int, int]] = []
    param_bytes: dict[str, int] = {}
    for nid in order:
        n = graph.nodes[nid]
        if nid not in blocks or nid in folded:
            continue
        b = blocks[nid]
        name = op_name(n.op)
        fused = tuple(m.label() for m in n.loc.fused) if n.loc is not None else ()
        dt = n.dtype.value
        title = n.op.name if isinstance(n.op, Input) else n.label
        reads = []
        ins = [graph.nodes[i] for i in n.inputs]
        for i in dict.fromkeys(n.inputs):
            src = graph.nodes[i]
            if _is_leaf(src) or i in folded:
                reads.append(_leaf_text(src))
                if isinstance(src.op, Param) and src.shape.is_static:
                    param_bytes[b] = param_bytes.get(b, 0) + src.shape.nbytes()
            elif i in blocks:
                edges.append((i, nid))
        slot = ""
        if plan is not None and nid in plan.slots:
            slot = plan.slots[nid].describe()
        nodes[nid] = ViewNode(
            id=nid,
            op=name,
            title=title,
            name=" ".join(filter(None, [title, name, b, *map(_param_name, ins)])),
            shape=str(n.shape),
            dtype=dt,
            block=b,
            precision=dt if dt in _LOW_PRECISION else None,
            source=_source_text(n),
            group=name if len(fused) > 1 else None,
            fused=fused if len(fused) > 1 else (),
            kernel=(kernels or {}).get(nid, ""),
            slot=slot,
            reads=tuple(reads),
            output=outputs.get(nid),
        )
    seen: list[str] = []
    for nid in order:
        if nid in nodes and nodes[nid].block not in seen:
            seen.append(nodes[nid].block)
    if INPUTS in seen:  # the inputs open the page
        seen.remove(INPUTS)
        seen.insert(0, INPUTS)
    return View(
        graph.name,
        stage,
        nodes,
        edges,
        seen,
        plan=plan,
        graph=graph,
        param_bytes=param_bytes,
    )
