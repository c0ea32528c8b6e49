"""vmap: a MIR graph mapped over a new batch axis of (some of) its inputs.

In: a graph, ``in_axes`` (which inputs / params gain a batch axis, and where), the batch
size (an int or a symbol name) and ``out_axes``. Out: a new graph whose batched inputs
have the batch axis and whose outputs are the stacked per-example outputs, as
``jax.vmap`` gives (``out[..., b, ...] = f(x[b])``, the batch at ``out_axes``).

Each node is batched by its op's ``batch`` rule when it has one; otherwise by a generic
rule: elementwise ops (``op.elementwise`` or Binary / Unary / Compare / Where / Cast) move
the batch axes to the front and broadcast; any other op, when the batch size is static,
runs once per example (slice, apply, concat). An op with neither under a symbolic batch
size raises AutodiffError naming the node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rlx.autodiff.forward import needed
from rlx.errors import AutodiffError, RlxError
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.core import Input, Param
from rlx.ops.rules import moveaxis, stamp
from rlx.shape import Shape, Sym

__all__ = ["vmap"]

Dim = int | Sym


def _axes_for(
    graph: Graph, in_axes: int | None | Mapping[str, int | None]
) -> dict[str, int | None]:
    named = {n.op.name: n for n in graph.nodes if isinstance(n.op, (Input, Param))}  # type: ignore[attr-defined]
    if in_axes is None or isinstance(in_axes, int):
        out = {n.op.name: in_axes for n in graph.input_nodes()}  # type: ignore[attr-defined]
    elif isinstance(in_axes, Mapping):
        unknown = sorted(set(in_axes) - set(named))
        if unknown:
            raise AutodiffError(
                f"vmap: in_axes names {unknown}, but graph {graph.name!r} has no such input "
                f"or param; inputs and params: {sorted(named)}"
            )
        out = dict(in_axes)
    else:
        raise AutodiffError(
            f"vmap: in_axes must be an int, None or a mapping name -> axis, given {in_axes!r}"
        )
    for name, a in out.items():
        if a is None:
            continue
        r = named[name].shape.rank + 1
        if isinstance(a, bool) or not isinstance(a, int) or not -r <= a < r:
            raise AutodiffError(
                f"vmap: in_axes[{name!r}] = {a!r} is not an axis of the batched rank-{r} "
                f"value (shape {named[name].shape} plus the batch axis)",
                node=named[name].id,
                loc=named[name].loc,
            )
        out[name] = a % r
    if not any(a is not None for a in out.values()):
        raise AutodiffError(f"vmap: in_axes {in_axes!r} batches no input of {graph.name!r}")
    return out


def _size(g: Graph, size: int | str | Sym) -> Dim:
    if isinstance(size, str):
        if size not in g.sym_bounds:
            g.sym(size)
        return Sym.named(size)
    if isinstance(size, Sym):
        return size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise AutodiffError(f"vmap: size must be a positive int or a symbol name, given {size!r}")
    return size


def _with_batch(shape: Shape, axis: int, b: Dim) -> Shape:
    dims = list(shape.dims)
    dims.insert(axis, b)
    return shape.with_dims(dims)


def vmap(
    graph: Graph,
    in_axes: int | None | Mapping[str, int | None] = 0,
    out_axes: int | None | Sequence[int | None] = 0,
    *,
    size: int | str | Sym = "batch",
) -> Graph:
    """``graph`` mapped over a batch axis of size ``size`` (an int, or a symbol name /
    Sym: a symbolic dim). ``in_axes``: an int (or None) for every input, or a mapping
    input / param name -> axis (None or absent: not batched). ``out_axes``: where each
    output's batch axis goes (one int for all, or one per output; None: the output must
    not depend on a batched input)."""
    axes = _axes_for(graph, in_axes)
    g = Graph(f"{graph.name}.vmap")
    g.sym_bounds = dict(graph.sym_bounds)
    b = _size(g, size)
    need = needed(graph, graph.outputs)
    env: dict[NodeId, tuple[NodeId, int | None]] = {}
    for nid in graph.topo_order():
        if nid not in need:
            continue
        node = graph.nodes[nid]
        op = node.op
        if isinstance(op, (Input, Param)) and (a := axes.get(op.name)) is not None:
            shape = _with_batch(node.shape, a, b)
            new = dataclasses.replace(op, shape=shape)  # type: ignore[type-var]
            env[nid] = (g.add_node(new, (), shape, node.loc), a)
            continue
        ins = tuple(env[i][0] for i in node.inputs)
        bdims = tuple(env[i][1] for i in node.inputs)
        if all(d is None for d in bdims):
            env[nid] = (g.add_node(op, ins, node.shape, node.loc), None)
            continue
        start = len(g.nodes)
        out, bd = _batch(g, node, ins, bdims, b)
        want = _with_batch(node.shape, bd, b) if bd is not None else node.shape
        if g.shape(out) != want:
            raise AutodiffError(
                f"{node.label}: the batching rule of {op.mnemonic!r} gave {g.shape(out)} "
                f"with batch axis {bd}, expected {want}",
                node=node.id,
                loc=node.loc,
            )
        stamp(g, start, node)
        env[nid] = (out, bd)
    g.set_outputs(_outputs(g, graph, env, out_axes, b))
    return g.verify()


def _batch(
    g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...], b: Dim
) -> tuple[NodeId, int | None]:
    """The batched node: the op's rule, else the generic elementwise rule, else the
    per-example loop (static size), else AutodiffError."""
    op = node.op
    try:
        return op.batch(g, node, ins, bdims)
    except NotImplementedError:
        pass
    if _elementwise(op):
        try:
            return _broadcast(g, node, ins, bdims, b), 0
        except RlxError:
            if not isinstance(b, int):
                raise
    if isinstance(b, int) and not op.effect:
        return _unrolled(g, node, ins, bdims, b), 0
    why = "it writes state" if op.effect else f"the batch size {b} is symbolic"
    raise AutodiffError(
        f"{node.label}: op {op.mnemonic!r} has no batching rule (batch) and cannot be run "
        f"once per example ({why}); give vmap a static size or the op a batch rule",
        node=node.id,
        loc=node.loc,
    )


def _elementwise(op: object) -> bool:
    """Whether the generic broadcasting rule applies (imported here: op modules may
    import the autodiff helpers while ``rlx.ops`` loads)."""
    from rlx.ops.elementwise import Binary, Cast, Compare, Unary, Where

    return bool(getattr(op, "elementwise", False)) or isinstance(
        op, (Binary, Unary, Compare, Where, Cast)
    )


def _broadcast(
    g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...], b: Dim
) -> NodeId:
    """Elementwise: every operand at rank R + 1 with the batch at axis 0 (unbatched ones
    with a leading 1), then the op itself broadcasts."""
    rank = node.shape.rank
    xs = []
    for x, bd in zip(ins, bdims, strict=True):
        dims = g.shape(x).dims
        if bd is None:
            xs.append(g.reshape(x, [1] * (rank + 1 - len(dims)) + list(dims)))
            continue
        x = moveaxis(g, x, bd, 0)
        rest = list(g.shape(x).dims[1:])
        if len(rest) < rank:
            x = g.reshape(x, [b] + [1] * (rank - len(rest)) + rest)
        xs.append(x)
    return g.apply(node.op, xs)


def _unrolled(
    g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...], b: int
) -> NodeId:
    """The op applied to example ``k`` of each batched input, for every k, stacked."""
    outs = []
    for k in range(b):
        xs = []
        for x, bd in zip(ins, bdims, strict=True):
            if bd is not None:
                x = g.squeeze(g.narrow(x, bd, k, 1), bd)
            xs.append(x)
        y = g.apply(node.op, xs)
        outs.append(g.unsqueeze(y, 0))
    return outs[0] if b == 1 else g.concat(outs, 0)


def _outputs(
    g: Graph,
    graph: Graph,
    env: Mapping[NodeId, tuple[NodeId, int | None]],
    out_axes: int | None | Sequence[int | None],
    b: Dim,
) -> list[NodeId]:
    n = len(graph.outputs)
    if out_axes is None or isinstance(out_axes, int):
        per = [out_axes] * n
    else:
        per = list(out_axes)
        if len(per) != n:
            raise AutodiffError(
                f"vmap: out_axes has {len(per)} entries for the {n} outputs of {graph.name!r}"
            )
    outs = []
    for k, (o, oa) in enumerate(zip(graph.outputs, per, strict=True)):
        nid, bd = env[o]
        node = graph.nodes[o]
        if oa is None:
            if bd is not None:
                raise AutodiffError(
                    f"vmap: output {k} ({node.label}) depends on a batched input, but its "
                    f"out_axes is None",
                    node=o,
                    loc=node.loc,
                )
            outs.append(nid)
            continue
        r = node.shape.rank + 1
        if isinstance(oa, bool) or not isinstance(oa, int) or not -r <= oa < r:
            raise AutodiffError(
                f"vmap: out_axes {oa!r} of output {k} is not an axis of its batched rank-{r} value"
            )
        if bd is None:
            nid = g.expand(g.unsqueeze(nid, 0), [b, *node.shape.dims])
            bd = 0
        outs.append(moveaxis(g, nid, bd, oa))
    return outs
