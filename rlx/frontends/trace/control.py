"""``rlx.cond`` / ``rlx.while_loop`` / ``rlx.scan``: traced control flow (``jax.lax``-shaped).

In: Python functions over pytrees of traced values, and the operands / carries / xs.
Out: traced values of the enclosing trace, one ``if`` / ``while`` / ``scan`` node of the
IR per result leaf (a node of rlx has one result; see ``rlx/ops/control.py``).

Each function is traced once into a body graph (:class:`~rlx.frontends.trace.tracer.Trace`
with a parent). Values of the enclosing trace that a body uses are captured: they become
extra operands (``cond``) or extra carries passed through unchanged (``while_loop``,
``scan``), so the body graphs hold no params, as the ops require. With a Python bool as
``pred``, ``cond`` just calls the branch (nothing to trace).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from rlx import source
from rlx.errors import TraceError
from rlx.frontends.trace import pytree
from rlx.frontends.trace.tracer import Trace, find_trace, lift, result_type, tracing
from rlx.frontends.trace.values import Traced, cast, compare
from rlx.ir.mir import Graph
from rlx.ops.control import If, Scan, While
from rlx.ops.core import Input
from rlx.ops.elementwise import CompareKind
from rlx.shape import Shape

__all__ = ["cond", "while_loop", "scan"]


def _err(msg: str) -> TraceError:
    return TraceError(msg, loc=source.capture())


class _Body:
    """One traced body: its trace, its output leaves and their tree."""

    def __init__(self, parent: Trace, name: str, fn: Callable[..., Any],
                 avals: list[tuple[Shape, bool]], tree: Any,
                 wrap: Callable[[Any], tuple[Any, ...]]):  # fmt: skip
        self.trace = t = Trace(f"{parent.g.name}.{name}", parent)
        with tracing(t):
            self.args = [t.input(f"arg{k}", s, w) for k, (s, w) in enumerate(avals)]
            out = fn(*wrap(pytree.unflatten(tree, self.args)))
            leaves, self.tree = pytree.flatten(out)
            self.outs = [lift(t, o) for o in leaves]

    def finish(self, n_args: int, union: list[Traced], slots: dict[int, int],
               passthrough: bool) -> Graph:  # fmt: skip
        """The body graph with Inputs renamed to the op's operand order: argument ``k`` at
        ``slots[k]``, captured value ``j`` of ``union`` at ``n_args + j`` (inputs of the
        body first); ``passthrough`` adds every captured value to the outputs after the
        first ``n_args`` ones (loop carries)."""
        t = self.trace
        mine = {(id(c.trace), c.id): inner for c, inner in zip(t.captures, t.capture_inputs)}
        names: dict[int, str] = {a.id: f"in{slots[k]}" for k, a in enumerate(self.args)}
        cap_ids = []
        for j, c in enumerate(union):
            inner = mine.get((id(c.trace), c.id))
            if inner is None and passthrough:
                inner = t.input(f"pass{j}", c.aval)
            if inner is not None:
                names[inner.id] = f"in{n_args + j}"
                cap_ids.append(inner.id)
        g = Graph(t.g.name)
        g.sym_bounds = dict(t.g.sym_bounds)
        for n in t.g.nodes:
            if n.id in names:
                n = dataclasses.replace(n, op=Input(names[n.id], n.shape))
            g.nodes.append(n)
        outs = [o.id for o in self.outs]
        if passthrough:
            outs = outs[:n_args] + cap_ids + outs[n_args:]
        g.set_outputs(outs)
        return g


def _avals(vals: Sequence[Traced]) -> list[tuple[Shape, bool]]:
    return [(v.aval, v.weak) for v in vals]


def _union(*bodies: _Body) -> list[Traced]:
    seen: dict[tuple[int, int], Traced] = {}
    for b in bodies:
        for c in b.trace.captures:
            seen.setdefault((id(c.trace), c.id), c)
    return list(seen.values())


def _match(where: str, a: _Body, a_outs: list[Traced], want: list[Any], names: list[str]) -> None:
    """Cast weak outputs of ``a`` to the dtypes ``want`` lists ((Shape, weak) pairs) and
    raise a TraceError naming the first leaf whose shape still differs."""
    for k, (o, (shape, weak)) in enumerate(zip(a_outs, want)):
        if o.aval.dims != shape.dims:
            raise _err(f"{where}: {names[k]} is {o.aval} but must be {shape}")
        if o.aval.dtype is not shape.dtype:
            d, _ = result_type([(o.aval.dtype, o.weak), (shape.dtype, weak)])
            if d is not shape.dtype:
                raise _err(f"{where}: {names[k]} is {o.aval} but must be {shape} (cast it)")
            a.outs[k] = cast(o, d)  # a_outs is a prefix of a.outs


def _pred(t: Trace, p: Any) -> Traced:
    v = lift(t, p)
    if not v.aval.dtype.is_bool:
        v = compare(CompareKind.NE, v, 0)
    if any(d != 1 for d in v.shape):
        raise _err(f"the predicate must have one element, got {v.aval}")
    return v


def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any],
         *operands: Any) -> Any:  # fmt: skip
    """``true_fun(*operands)`` if ``pred`` else ``false_fun(*operands)``; both branches
    are traced and must return pytrees of equal shapes (an ``if`` node per leaf)."""
    if not isinstance(pred, Traced):
        return true_fun(*operands) if bool(pred) else false_fun(*operands)
    t = find_trace(pred)
    p = _pred(t, pred)
    leaves, tree = pytree.flatten(tuple(operands))
    args = [lift(t, v) for v in leaves]
    one = lambda x: x  # noqa: E731 - the operands tuple is the argument list
    tb = _Body(t, "then", true_fun, _avals(args), tree, one)
    fb = _Body(t, "else", false_fun, _avals(args), tree, one)
    if tb.tree != fb.tree:
        raise _err(
            f"cond: the branches return different structures: true_fun gives "
            f"{pytree.unflatten(tb.tree, [o.aval for o in tb.outs])}, false_fun gives "
            f"{pytree.unflatten(fb.tree, [o.aval for o in fb.outs])}"
        )
    names = pytree.paths(tb.tree, "output")
    want = [(o.aval, o.weak) for o in tb.outs]
    for k, (a, b) in enumerate(zip(tb.outs, fb.outs)):
        d, w = result_type([(a.aval.dtype, a.weak), (b.aval.dtype, b.weak)])
        want[k] = (a.aval.with_dtype(d), w)
    _match("cond true_fun", tb, list(tb.outs), want, names)
    _match("cond false_fun", fb, list(fb.outs), want, names)
    union = _union(tb, fb)
    slots = {k: k for k in range(len(args))}
    then_g = tb.finish(len(args), union, slots, False)
    else_g = fb.finish(len(args), union, slots, False)
    ins = [p.id, *(a.id for a in args), *(c.id for c in union)]
    outs = [t.wrap(t.g.apply(If(then_g, else_g, k), ins)) for k in range(len(tb.outs))]
    return pytree.unflatten(tb.tree, outs)


def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any],
               init_val: Any) -> Any:  # fmt: skip
    """``while cond_fun(val): val = body_fun(val)``; ``val`` is a pytree whose shapes and
    dtypes the body keeps (a ``while`` node per leaf)."""
    t = find_trace()
    leaves, tree = pytree.flatten(init_val)
    carries = [lift(t, v) for v in leaves]
    names = pytree.paths(tree, "carry")
    single = lambda x: (x,)  # noqa: E731 - the carry is the one argument
    cb = _Body(t, "cond", cond_fun, _avals(carries), tree, single)
    if len(cb.outs) != 1:
        raise _err(f"while_loop: cond_fun must return one bool scalar, got {len(cb.outs)} values")
    with tracing(cb.trace):
        cb.outs = [_pred(cb.trace, cb.outs[0])]
    bb = _Body(t, "body", body_fun, _avals(carries), tree, single)
    if bb.tree != tree:
        raise _err(
            f"while_loop: body_fun must return the carry's structure {_show(tree, carries)}, "
            f"returns {pytree.unflatten(bb.tree, [o.aval for o in bb.outs])}"
        )
    _match("while_loop body_fun", bb, list(bb.outs), [(c.aval, c.weak) for c in carries], names)
    union = _union(cb, bb)
    n = len(carries)
    slots = {k: k for k in range(n)}
    cond_g = cb.finish(n, union, slots, False)
    body_g = bb.finish(n, union, slots, True)
    ins = [*(c.id for c in carries), *(c.id for c in union)]
    outs = [t.wrap(t.g.apply(While(cond_g, body_g, k), ins)) for k in range(n)]
    return pytree.unflatten(tree, outs)


def _show(tree: Any, vals: Sequence[Traced]) -> Any:
    return pytree.unflatten(tree, [v.aval for v in vals])


def scan(f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any = None,
         length: int | None = None, reverse: bool = False) -> tuple[Any, Any]:  # fmt: skip
    """``lax.scan``: ``carry, y = f(carry, x)`` for each ``x`` along the leading axis of
    ``xs`` (a pytree; None with ``length``); returns ``(final carry, stacked ys)``."""
    t = find_trace()
    c_leaves, c_tree = pytree.flatten(init)
    x_leaves, x_tree = pytree.flatten(xs)
    carries = [lift(t, v) for v in c_leaves]
    seqs = [lift(t, v) for v in x_leaves]
    lengths = {s.shape[0] if s.ndim else None for s in seqs}
    if None in lengths or len(lengths) > 1:
        raise _err(f"scan: every xs leaf needs the same leading axis, got {_show(x_tree, seqs)}")
    n = lengths.pop() if lengths else length
    if n is None:
        raise _err("scan: give length when there are no xs to scan over")
    if length is not None and n != length:
        raise _err(f"scan: length={length} but the xs have leading axis {n}")
    steps = [(s.aval.with_dims(s.shape[1:]), s.weak) for s in seqs]  # one step of each
    nc = len(carries)

    def wrap(args: Any) -> tuple[Any, Any]:
        return args

    tree = ("tuple", (c_tree, x_tree))
    bb = _Body(t, "body", f, _avals(carries) + steps, tree, wrap)
    if bb.tree[0] != "tuple" or len(bb.tree[1]) != 2 or bb.tree[1][0] != c_tree:
        raise _err(
            f"scan: f must return (carry, y) with the carry's structure "
            f"{_show(c_tree, carries)}, returns "
            f"{pytree.unflatten(bb.tree, [o.aval for o in bb.outs])}"
        )
    names = pytree.paths(c_tree, "carry")
    _match("scan f", bb, bb.outs[:nc], [(c.aval, c.weak) for c in carries], names)
    union = _union(bb)
    nu = len(union)
    slots = {k: k for k in range(nc)} | {nc + j: nc + nu + j for j in range(len(seqs))}
    body_g = bb.finish(nc, union, slots, True)
    ins = [*(c.id for c in carries), *(c.id for c in union), *(s.id for s in seqs)]
    ny = len(bb.outs) - nc
    idx = list(range(nc)) + [nc + nu + j for j in range(ny)]
    outs = [t.wrap(t.g.apply(Scan(body_g, n, nc + nu, k, bool(reverse)), ins)) for k in idx]
    ys_tree = bb.tree[1][1]
    return pytree.unflatten(c_tree, outs[:nc]), pytree.unflatten(ys_tree, outs[nc:])
