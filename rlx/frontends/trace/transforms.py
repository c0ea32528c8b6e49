"""Function transforms over traced Python functions: ``rlx.grad(fn)``,
``rlx.value_and_grad(fn)``, ``rlx.jvp(fn, primals, tangents)``, ``rlx.vjp(fn, *primals)``
and ``rlx.vmap(fn)``, as JAX spells them.

In: a Python function of pytrees of arrays (written with ``rlx.numpy`` / operators, as for
``rlx.jit``). Out: a function (or the values) of the transformed computation. The function
is traced (:mod:`rlx.frontends.trace.tracer`) into a MIR graph for the arguments' shapes,
the graph transform of :mod:`rlx.autodiff` builds the derivative / batched graph, and
that graph is inlined into the caller's trace. Called outside any trace, the transformed
function is itself traced and compiled by ``rlx.jit`` (one compile per signature), so
``rlx.grad(loss)(params, x)`` takes NumPy arrays and returns NumPy arrays, and
``rlx.jit(rlx.grad(loss))``, ``rlx.grad(rlx.jit(loss))`` and ``rlx.grad(rlx.grad(f))``
compose.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from rlx import source
from rlx.errors import AutodiffError, TraceError
from rlx.frontends.trace import pytree
from rlx.frontends.trace.jit import Jitted
from rlx.frontends.trace.tracer import Trace, current, lift, tracing
from rlx.frontends.trace.values import Traced
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Input

__all__ = ["grad", "value_and_grad", "jvp", "vjp", "vmap"]


class _Sub:
    """``fn`` traced as a sub-graph of the current trace ``t``: ``graph`` (its Inputs named
    after the argument paths, then ``cap<k>`` for values of ``t`` it closes over),
    ``feeds`` (input name -> the value of ``t`` that feeds it), ``paths`` (one per
    argument leaf, in order), ``out_tree``."""

    def __init__(
        self, fn: Callable[..., Any], args: Sequence[Any], drop: dict[int, int] | None = None
    ):
        t = current()
        assert t is not None
        names = _arg_names(fn, len(args))
        trees: list[Any] = []
        leaves: list[Any] = []
        paths: list[str] = []
        owners: list[int] = []
        for k, (a, name) in enumerate(zip(args, names)):
            n0 = len(leaves)
            _, tree = pytree.flatten(a, leaves)
            trees.append(tree)
            paths.extend(pytree.paths(tree, name))
            owners.extend([k] * (len(leaves) - n0))
        outer = [lift(t, x) for x in leaves]
        sub = Trace(getattr(fn, "__name__", "fn"), parent=t)
        self.feeds: dict[str, Traced] = {}
        with tracing(sub):
            vals = []
            for k, (o, path) in enumerate(zip(outer, paths)):
                shape = t.g.shape(o.id)
                if drop and k in drop:  # vmap: the example's shape (batch axis removed)
                    dims = list(shape.dims)
                    del dims[drop[k]]
                    shape = shape.with_dims(dims)
                vals.append(sub.input(path, shape, o.weak))
                self.feeds[path] = o
            it = iter(vals)
            out = fn(*[pytree.unflatten(tree, it) for tree in trees])
            out_leaves, self.out_tree = pytree.flatten(out)
            self.out_weak = [isinstance(x, Traced) and x.weak for x in out_leaves]
            sub.g.set_outputs([lift(sub, x).id for x in out_leaves])
        for outer_v, inner in zip(sub.captures, sub.capture_inputs):
            self.feeds[sub.g.nodes[inner.id].op.name] = outer_v  # type: ignore[attr-defined]
        self.t, self.graph, self.paths, self.owners, self.leaves = t, sub.g, paths, owners, leaves

    def inline(self, g: Graph, extra: dict[str, Traced] | None = None) -> list[Traced]:
        """Copy ``g`` (a transform of ``self.graph``) into the caller's trace, its inputs
        fed by ``self.feeds`` and ``extra``; returns its outputs as values of the trace."""
        feeds = {**self.feeds, **(extra or {})}
        t = self.t
        for name, b in g.sym_bounds.items():
            t.g.sym_bounds.setdefault(name, b)
        env: dict[NodeId, NodeId] = {}
        for nid in g.topo_order():
            node = g.nodes[nid]
            if isinstance(node.op, Input):
                v = lift(t, feeds[node.op.name])
                if t.g.shape(v.id) != node.shape:
                    raise AutodiffError(
                        f"{node.op.name!r}: expected a value of shape {node.shape}, given "
                        f"{t.g.shape(v.id)}",
                        loc=source.capture(),
                    )
                env[nid] = v.id
                continue
            ins = [env[i] for i in node.inputs]
            env[nid] = t.g.add_node(node.op, ins, node.shape, node.loc)
        return [t.wrap(env[o]) for o in g.outputs]

    def wrt(self, argnums: Sequence[int]) -> list[str]:
        """The input names of the leaves of arguments ``argnums``."""
        return [p for p, k in zip(self.paths, self.owners) if k in argnums]


def _arg_names(fn: Callable[..., Any], n: int) -> list[str]:
    try:
        ps = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        ps = []
    return [ps[k] if k < len(ps) else f"arg{k}" for k in range(n)]


def _staged(inline: Callable[..., Any], like: Callable[..., Any]) -> Callable[..., Any]:
    """``inline`` when called inside a trace; outside, through one ``rlx.jit`` of it
    (traced and compiled once per signature)."""
    jitted: list[Jitted] = []

    @functools.wraps(like)
    def call(*args: Any) -> Any:
        if current() is not None:
            return inline(*args)
        if not jitted:
            jitted.append(Jitted(call))
        return jitted[0](*args)

    return call


def _argnums(argnums: int | Sequence[int], nargs: int) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for a in nums:
        if isinstance(a, bool) or not isinstance(a, int) or not -nargs <= a < nargs:
            raise AutodiffError(
                f"argnums {argnums!r}: the function was called with {nargs} positional arguments",
                loc=source.capture(),
            )
    return tuple(a % nargs for a in nums)


def value_and_grad(
    fn: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``fn`` -> a function returning ``(fn(*args), d fn / d args[argnums])`` (with
    ``has_aux``, ``fn`` returns ``(loss, aux)`` and the result is ``((loss, aux), grads)``);
    grads have the tree of ``args[argnums]`` (a tuple of trees for a tuple ``argnums``)."""
    from rlx.autodiff.reverse import value_and_grad as vg_graph

    def inline(*args: Any) -> Any:
        nums = _argnums(argnums, len(args))
        s = _Sub(fn, args)
        nout = len(s.graph.outputs)
        if has_aux and not _is_pair(s.out_tree):
            raise AutodiffError(
                "has_aux=True: the function must return a pair (loss, aux)",
                loc=source.capture(),
            )
        if not has_aux and nout != 1:
            raise AutodiffError(
                f"grad: the function returned {nout} arrays; it must return one scalar loss "
                f"(or a pair (loss, aux) with has_aux=True)",
                loc=source.capture(),
            )
        g = vg_graph(s.graph, s.wrt(nums))
        g.set_outputs(list(g.outputs) + s.graph.outputs[1:])
        res = s.inline(g)
        nw = len(s.wrt(nums))
        loss, grads, aux = res[0], res[1 : 1 + nw], res[1 + nw :]
        it = iter(grads)
        trees = [_arg_tree(args[k]) for k in nums]
        gtrees = [pytree.unflatten(tr, it) for tr in trees]
        gout = gtrees[0] if isinstance(argnums, int) else tuple(gtrees)
        if has_aux:
            aux_tree = s.out_tree[1][1]
            return (loss, pytree.unflatten(aux_tree, aux)), gout
        return loss, gout

    return _staged(inline, fn)


def _is_pair(tree: Any) -> bool:
    """Whether ``tree`` is a pair (tuple or list) whose first item is one leaf."""
    return (
        tree != pytree.LEAF
        and tree[0] in ("tuple", "list")
        and len(tree[1]) == 2
        and tree[1][0] == pytree.LEAF
    )


def _arg_tree(a: Any) -> Any:
    return pytree.flatten(a)[1]


def grad(
    fn: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``fn`` (returning one scalar) -> a function returning ``d fn / d args[argnums]``,
    with the tree of ``args[argnums]`` (``(grads, aux)`` with ``has_aux``)."""
    vg = value_and_grad(fn, argnums, has_aux)

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        out, gr = vg(*args)
        return (gr, out[1]) if has_aux else gr

    return call


def jvp(fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    """``(fn(*primals), J tangents)``: the forward-mode derivative of ``fn`` at ``primals``
    along ``tangents`` (a tuple of the same trees; integer leaves take no tangent)."""
    from rlx.autodiff.forward import jvp as jvp_graph

    primals, tangents = tuple(primals), tuple(tangents)
    if pytree.flatten(primals)[1] != pytree.flatten(tangents)[1]:
        raise AutodiffError(
            "jvp: tangents must have the tree structure of primals", loc=source.capture()
        )

    def inline(primals: Any, tangents: Any) -> Any:
        s = _Sub(fn, primals)
        tl = pytree.flatten(tangents)[0]
        wrt, feeds = [], {}
        for path, tan in zip(s.paths, tl):
            v = s.feeds[path]
            if v.aval.dtype.is_float or v.aval.dtype.is_complex:
                wrt.append(path)
                feeds[f"t_{path}"] = lift(s.t, tan, v.aval.dtype)
        g = jvp_graph(s.graph, wrt)
        names = [n for n in g.input_names if n not in s.graph.input_names]
        res = s.inline(g, dict(zip(names, [feeds[f"t_{w}"] for w in wrt])))
        n = len(s.graph.outputs)
        return pytree.unflatten(s.out_tree, res[:n]), pytree.unflatten(s.out_tree, res[n:])

    return _staged(inline, _named(fn, "jvp"))(primals, tangents)


def vjp(fn: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[[Any], tuple[Any, ...]]]:
    """``(fn(*primals), vjp_fn)``: ``vjp_fn(ct)`` (``ct`` of the output's tree) returns the
    cotangent of each primal, a tuple with one tree per primal."""
    from rlx.autodiff.reverse import vjp as vjp_graph

    def inline_out(primals: Any) -> Any:
        return fn(*primals)

    def inline(primals: Any, ct: Any) -> Any:
        s = _Sub(fn, primals)
        cl, ctree = pytree.flatten(ct)
        if ctree != s.out_tree:
            raise AutodiffError(
                "vjp: the cotangent must have the tree structure of the function's output",
                loc=source.capture(),
            )
        wrt = [p for p in s.paths if _is_diff(s.feeds[p])]
        g = vjp_graph(s.graph, wrt)
        names = [n for n in g.input_names if n not in s.graph.input_names]
        feeds = {
            n: lift(s.t, c, s.graph.shape(o).dtype) for n, c, o in zip(names, cl, s.graph.outputs)
        }
        res = s.inline(g, feeds)[len(s.graph.outputs) :]
        by_path = dict(zip(wrt, res))
        leaves = [by_path.get(p) for p in s.paths]
        trees = [_arg_tree(a) for a in primals]
        it2 = iter(leaves)
        out = [pytree.unflatten(tr, it2) for tr in trees]
        return tuple(out)

    out = _staged(inline_out, _named(fn, "vjp"))(primals)
    back = _staged(inline, _named(fn, "vjp_fn"))

    def vjp_fn(ct: Any) -> tuple[Any, ...]:
        return back(primals, ct)

    return out, vjp_fn


def _is_diff(v: Traced) -> bool:
    d = v.aval.dtype
    return d.is_float or d.is_complex


def _named(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    """A stand-in carrying ``fn``'s name for the traced graph (positional arguments)."""

    def f(*args: Any) -> Any:  # pragma: no cover - only its name and signature are read
        raise TraceError(f"{what} stand-in called")

    f.__name__ = f"{what}_{getattr(fn, '__name__', 'fn')}"
    return f


def vmap(
    fn: Callable[..., Any],
    in_axes: int | None | Sequence[int | None] = 0,
    out_axes: int | None = 0,
) -> Callable[..., Any]:
    """``fn`` mapped over an axis of its arguments: ``in_axes`` one int / None for every
    argument or one per positional argument (applied to all leaves of that argument);
    the outputs get the batch axis at ``out_axes``."""
    from rlx.autodiff.batching import vmap as vmap_graph

    def inline(*args: Any) -> Any:
        axes = (
            [in_axes] * len(args) if in_axes is None or isinstance(in_axes, int) else list(in_axes)
        )
        if len(axes) != len(args):
            raise AutodiffError(
                f"vmap: in_axes has {len(axes)} entries for {len(args)} arguments",
                loc=source.capture(),
            )
        t = current()
        assert t is not None
        drop: dict[int, int] = {}
        size: Any = None
        k = 0
        for a, ax in zip(args, axes):
            for leaf in pytree.flatten(a)[0]:
                if ax is not None:
                    v = lift(t, leaf)
                    r = v.aval.rank
                    if not -r <= ax < r:
                        raise AutodiffError(
                            f"vmap: in_axes {ax} is out of range for an argument of shape {v.aval}",
                            loc=source.capture(),
                        )
                    drop[k] = ax % r
                    d = v.aval.dims[ax % r]
                    if size is None:
                        size = d
                    elif d != size:
                        raise AutodiffError(
                            f"vmap: batched arguments disagree on the batch size: {size} and {d}",
                            loc=source.capture(),
                        )
                k += 1
        if size is None:
            raise AutodiffError("vmap: in_axes batches no argument", loc=source.capture())
        s = _Sub(fn, args, drop)
        axes_by_name = {p: drop.get(j) for j, p in enumerate(s.paths)}
        g = vmap_graph(s.graph, axes_by_name, out_axes, size=size)
        return pytree.unflatten(s.out_tree, s.inline(g))

    return _staged(inline, fn)
