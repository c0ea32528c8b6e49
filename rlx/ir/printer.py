"""Readable text for graphs: one line per node, like a jaxpr.

%3:f32[2,8] = matmul %0 %1            # model.py:12
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.ir.mir import Graph

__all__ = ["format_graph"]


def format_graph(graph: Graph, *, locs: bool = False, indent: str = "") -> str:
    """Render ``graph``; with ``locs`` each line ends with the user line that built it."""
    from rlx.ops.core import Constant, Input, Param

    lines = [f"{indent}graph {graph.name}("]
    ins = [n for n in graph.nodes if isinstance(n.op, Input)]
    lines[0] += ", ".join(f"{n.op.name}: {n.shape}" for n in ins) + ") {"  # type: ignore[attr-defined]
    if graph.sym_bounds:
        b = ", ".join(
            f"{k} in [{lo}, {hi if hi is not None else 'inf'}]"
            for k, (lo, hi) in graph.sym_bounds.items()
        )
        lines.append(f"{indent}  # dims: {b}")
    for n in graph.nodes:
        if isinstance(n.op, (Input, Param)):
            rhs = f"{n.op.mnemonic} {n.op.name!r}"
        elif isinstance(n.op, Constant):
            rhs = f"constant {n.op.value!r}"
        else:
            rhs = str(n.op) + "".join(f" %{i}" for i in n.inputs)
        line = f"{indent}  %{n.id}:{n.shape} = {rhs}"
        if locs and n.loc is not None and n.loc.file:
            line = f"{line:<60}  # {n.loc.file.rsplit('/', 1)[-1]}:{n.loc.line}"
        lines.append(line)
        for sg in n.op.subgraphs():
            lines.append(format_graph(sg, locs=locs, indent=indent + "    "))
    lines.append(f"{indent}  return " + ", ".join(f"%{o}" for o in graph.outputs))
    lines.append(f"{indent}}}")
    return "\n".join(lines)
