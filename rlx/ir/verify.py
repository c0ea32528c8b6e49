"""The MIR verifier. In: a graph. Out: the graph unchanged, or a VerifyError naming the
first bad node and what is wrong (cycle, dangling edge, wrong arity, shape rule violation,
duplicate input name, bad output)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlx.errors import RlxError, VerifyError

if TYPE_CHECKING:
    from rlx.ir.mir import Graph

__all__ = ["verify", "topo_sort"]


def topo_sort(graph: Graph) -> list[int]:
    """Kahn's algorithm over node ids; VerifyError naming a node on a cycle."""
    n = len(graph.nodes)
    indeg = [0] * n
    users: list[list[int]] = [[] for _ in range(n)]
    for node in graph.nodes:
        for i in node.inputs:
            if not 0 <= i < n:
                raise VerifyError(
                    f"%{node.id} {node.op}: input %{i} does not exist ({n} nodes)",
                    node=node.id,
                    loc=node.loc,
                )
            indeg[node.id] += 1
            users[i].append(node.id)
    ready = [k for k in range(n) if indeg[k] == 0]
    order: list[int] = []
    while ready:
        k = ready.pop()
        order.append(k)
        for u in users[k]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    if len(order) != n:
        stuck = min(k for k in range(n) if indeg[k] > 0)
        node = graph.nodes[stuck]
        raise VerifyError(
            f"%{stuck} {node.op}: the graph has a cycle through this node", node=stuck, loc=node.loc
        )
    order.sort()  # deterministic: a valid order sorted by id when ids are topological
    pos = {k: j for j, k in enumerate(order)}
    if all(pos[i] < pos[nd.id] for nd in graph.nodes for i in nd.inputs):
        return order
    # ids are not topological: redo Kahn with a min-heap for a deterministic order
    import heapq

    indeg = [len(nd.inputs) for nd in graph.nodes]
    heap = [k for k in range(n) if indeg[k] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        k = heapq.heappop(heap)
        order.append(k)
        for u in users[k]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, u)
    return order


def verify(graph: Graph) -> None:
    """Check every structural and typing invariant of ``graph``; raise VerifyError."""
    from rlx.ops.core import Input, Param

    for k, node in enumerate(graph.nodes):
        if node.id != k:
            raise VerifyError(f"node at index {k} has id %{node.id}", node=k, loc=node.loc)
    topo_sort(graph)  # dangling edges and cycles
    names: dict[tuple[str, str], int] = {}
    for node in graph.nodes:
        if isinstance(node.op, (Input, Param)):
            key = (node.op.mnemonic, node.op.name)
            if key in names:
                raise VerifyError(
                    f"%{node.id}: duplicate {node.op.mnemonic} name {node.op.name!r} "
                    f"(also %{names[key]})",
                    node=node.id,
                    loc=node.loc,
                )
            names[key] = node.id
        want = node.op.num_inputs()
        if want is not None and len(node.inputs) != want:
            raise VerifyError(
                f"%{node.id} {node.op}: expected {want} inputs, has {len(node.inputs)}",
                node=node.id,
                loc=node.loc,
            )
        try:
            inferred = node.op.infer(tuple(graph.nodes[i].shape for i in node.inputs))
        except RlxError as e:
            raise VerifyError(
                f"%{node.id} {node.op}: shape rule rejects its inputs: {e.bare_message}",
                node=node.id,
                loc=node.loc,
            ) from None
        if inferred != node.shape:
            raise VerifyError(
                f"%{node.id} {node.op}: recorded shape {node.shape} but the shape rule "
                f"gives {inferred}",
                node=node.id,
                loc=node.loc,
            )
        for sg in node.op.subgraphs():
            try:
                verify(sg)
            except VerifyError as e:
                raise VerifyError(
                    f"%{node.id} {node.op.mnemonic}: sub-graph {sg.name!r}: {e.bare_message}",
                    node=node.id,
                    loc=node.loc,
                ) from None
    if not graph.outputs:
        raise VerifyError(f"graph {graph.name!r} has no outputs (call set_outputs)")
    for o in graph.outputs:
        if not 0 <= o < len(graph.nodes):
            raise VerifyError(f"output %{o} does not exist in graph {graph.name!r}")
