"""The reference interpreter. In: a MIR graph plus NumPy inputs and params.
Out: one NumPy array per graph output, computed op by op with each op's ``reference``.

This is the oracle every backend, pass and fusion is tested against: it is slow and
simple on purpose. Inputs are checked (names, ranks, static dims, dtypes) and symbolic
dims are bound from the inputs' actual sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx.errors import InputError, RlxError
from rlx.ir.mir import Graph
from rlx.ops.base import RefCtx
from rlx.shape import Shape, Sym

__all__ = ["evaluate", "bind_symbols", "evaluate_all"]


def bind_symbols(
    graph: Graph, arrays: Mapping[str, np.ndarray], *, what: str = "input"
) -> dict[str, int]:
    """Infer each symbol's value from the given input arrays; InputError on conflicts or
    sizes outside the graph's declared bounds."""
    from rlx.ops.core import Input

    bindings: dict[str, int] = {}
    for n in graph.nodes:
        if not isinstance(n.op, Input) or n.op.name not in arrays:
            continue
        shape: Shape = n.shape
        a = arrays[n.op.name]
        if a.ndim != shape.rank:
            raise InputError(
                f"{what} {n.op.name!r}: expected rank {shape.rank} {shape}, "
                f"given shape {tuple(a.shape)}"
            )
        for ax, (d, got) in enumerate(zip(shape.dims, a.shape, strict=True)):
            if isinstance(d, int):
                if d != got:
                    raise InputError(
                        f"{what} {n.op.name!r}: expected {shape}, given shape "
                        f"{tuple(a.shape)} (dim {ax} is {got}, expected {d})"
                    )
            elif len(d.terms) == 1 and d.terms[0][1] == 1:
                name = d.terms[0][0]
                if got % d.coeff:
                    raise InputError(
                        f"{what} {n.op.name!r}: dim {ax}={got} is not a multiple of {d.coeff} ({d})"
                    )
                v = got // d.coeff
                if name in bindings and bindings[name] != v:
                    raise InputError(
                        f"{what} {n.op.name!r}: symbolic dim {name!r} is {v} here but "
                        f"{bindings[name]} in another input"
                    )
                bindings[name] = v
    for n in graph.nodes:  # check compound symbolic dims once everything is bound
        if isinstance(n.op, Input) and n.op.name in arrays:
            for ax, d in enumerate(n.shape.dims):
                if isinstance(d, Sym) and all(k in bindings for k in d.names):
                    got = arrays[n.op.name].shape[ax]
                    if d.evaluate(bindings) != got:
                        raise InputError(
                            f"{what} {n.op.name!r}: dim {ax} is {got}, expected {d} = "
                            f"{d.evaluate(bindings)}"
                        )
    for name, (lo, hi) in graph.sym_bounds.items():
        if name in bindings and not (lo <= bindings[name] and (hi is None or bindings[name] <= hi)):
            raise InputError(
                f"symbolic dim {name!r} = {bindings[name]} is outside its declared bounds "
                f"[{lo}, {hi if hi is not None else 'inf'}]"
            )
    return bindings


def _coerce(
    graph: Graph, given: Mapping[str, Any], names: list[str], shapes: dict[str, Shape], what: str
) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in given.items():
        if k not in shapes:
            raise InputError(f"unknown {what} {k!r}; {what}s of graph {graph.name!r}: {names}")
        want = shapes[k].dtype.np
        a = np.asarray(v)
        if a.dtype != want:
            if (
                np.can_cast(a.dtype, want, casting="same_kind")
                or a.dtype.kind in "iub"
                and want.kind == "f"
            ):
                a = a.astype(want)
            else:
                raise InputError(f"{what} {k!r}: expected dtype {shapes[k].dtype}, given {a.dtype}")
        out[k] = a
    return out


def evaluate_all(
    graph: Graph,
    inputs: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
) -> dict[int, np.ndarray]:
    """Evaluate every node; returns node id -> value (used by tests and calibration)."""
    from rlx.ops.core import Input, Param

    params = params or {}
    in_shapes = {n.op.name: n.shape for n in graph.nodes if isinstance(n.op, Input)}  # type: ignore[attr-defined]
    p_shapes = {n.op.name: n.shape for n in graph.nodes if isinstance(n.op, Param)}  # type: ignore[attr-defined]
    ins = _coerce(graph, inputs, list(in_shapes), in_shapes, "input")
    ps = _coerce(graph, params, list(p_shapes), p_shapes, "param")
    missing = [k for k in in_shapes if k not in ins]
    if missing:
        raise InputError(f"missing inputs {missing} for graph {graph.name!r}")
    bindings = bind_symbols(graph, ins)
    for name, shp in p_shapes.items():
        if name in ps and tuple(ps[name].shape) != shp.concrete(bindings):
            raise InputError(f"param {name!r}: expected {shp}, given shape {tuple(ps[name].shape)}")
    env: dict[int, np.ndarray] = {}
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        dims = node.shape.concrete(bindings)
        ctx = RefCtx(dims, node.shape.dtype.np, bindings, ps, ins)
        try:
            r = node.op.reference([env[i] for i in node.inputs], ctx)
        except RlxError as e:
            if e.loc is None and node.loc is not None:
                raise type(e)(
                    f"%{nid} {node.op}: {e.bare_message}", node=nid, loc=node.loc
                ) from None
            raise
        r = np.asarray(r)
        if r.dtype != ctx.out_dtype:
            with np.errstate(all="ignore"):
                r = r.astype(ctx.out_dtype)
        if tuple(r.shape) != dims:
            raise AssertionError(
                f"reference of %{nid} {node.op} gave shape {r.shape}, its shape rule says {dims}"
            )
        env[nid] = r
    return env


def evaluate(
    graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any] | None = None
) -> list[np.ndarray]:
    """Evaluate ``graph``; returns one array per output (copies, never views of inputs)."""
    env = evaluate_all(graph, inputs, params)
    return [np.array(env[o], copy=True) for o in graph.outputs]
