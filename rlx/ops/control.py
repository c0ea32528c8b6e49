"""Control flow: ``If``, ``While`` and ``Scan`` over nested sub-graphs (``jax.lax`` style).

A sub-graph is an ordinary :class:`Graph` whose :class:`Input` nodes are named
``in0``, ``in1``, ... after the operands they receive (a sub-graph may leave an operand
unused and so omit its Input). Sub-graphs hold no Params: pass weights in as operands.
``op.subgraphs()`` returns them, so the verifier and the printer recurse into them; the
references run them with the reference interpreter.

One output per node: a node of rlx has exactly one result. Control flow with several
results (the carries of a loop, the stacked outputs of a scan) returns the one chosen by
``output_index``; to read two results, build two nodes that differ only in
``output_index`` (each runs the whole loop: the reference favours simplicity over speed).

* ``If(then_branch, else_branch, output_index)``: inputs ``(pred, *operands)``; ``pred``
  is a single-element bool; both branches take the operands and return outputs of equal
  shapes (``lax.cond``).
* ``While(cond, body, output_index, max_iterations)``: inputs are the initial carries;
  ``cond(carries) -> bool`` scalar, ``body(carries) -> carries`` (``lax.while_loop``).
  ``max_iterations=None`` loops until ``cond`` is false; an integer bound turns a runaway
  loop into an InputError.
* ``Scan(body, length, num_carry, output_index, reverse)``: inputs are ``num_carry``
  carries then the ``xs``, each with leading axis ``length``; ``body(carries, x_t) ->
  (carries, y_t)``; the results are the final carries then each ``y`` stacked over the
  steps, a ``[length, ...]`` tensor (``lax.scan``).

Derivatives: ``If`` differentiates both branches (one ``If`` per operand gradient);
``Scan``'s vjp runs the body's vjp in reverse over the per-step input carries (stacked by
a forward scan): ``ScanBackward`` / ``ScanBackwardXs`` (``control_grad.py``), its jvp one scan carrying tangents; ``While`` has
none (its trip count is unknown to reverse mode: use ``Scan``). ``inline`` copies a
sub-graph into a graph, which these rules use to differentiate bodies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError, ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.shape import Dim, Shape, Sym

__all__ = [
    "If",
    "While",
    "Scan",
    "build_subgraph",
    "check_subgraph",
    "run_subgraph",
    "subgraph_output_shapes",
]

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

    SubgraphFn = Callable[..., NodeId | Sequence[NodeId]]

_IN_NAME = re.compile(r"in(0|[1-9][0-9]*)")


def build_subgraph(name: str, shapes: Sequence[Shape], fn: SubgraphFn) -> Graph:
    """A sub-graph with Inputs ``in0..inN`` of ``shapes``, built by ``fn(g, *input_ids)``,
    which returns the output node id (or a sequence of them)."""
    from rlx.ir.mir import Graph

    g = Graph(name)
    ids = [g.input(f"in{k}", s) for k, s in enumerate(shapes)]
    outs = fn(g, *ids)
    g.set_outputs(outs if isinstance(outs, int) else list(outs))
    return g


def check_subgraph(op: Op, sub: Graph, role: str, shapes: Sequence[Shape]) -> None:
    """Check that ``sub`` reads operands of ``shapes`` through Inputs named ``in<k>``, has no
    Params and declares outputs; ShapeError naming ``op`` and ``role`` otherwise."""
    from rlx.ir.mir import Graph
    from rlx.ops.core import Input, Param

    expect(isinstance(sub, Graph), op, f"{role} must be a Graph, got {type(sub).__name__}")
    for n in sub.nodes:
        if isinstance(n.op, Param):
            raise ShapeError(
                f"{op.mnemonic}: {role} holds param {n.op.name!r} (%{n.id}); sub-graphs take "
                "weights as operands, not params"
            )
        if not isinstance(n.op, Input):
            continue
        m = _IN_NAME.fullmatch(n.op.name)
        expect(
            m is not None and int(m.group(1)) < len(shapes),
            op,
            f"{role} input {n.op.name!r} (%{n.id}) is not one of in0..in{len(shapes) - 1}",
        )
        k = int(m.group(1))  # type: ignore[union-attr]
        expect(
            n.shape == shapes[k],
            op,
            f"{role} input {n.op.name!r} is {n.shape} but operand {k} is {shapes[k]}",
        )
    expect(bool(sub.outputs), op, f"{role} {sub.name!r} has no outputs (call set_outputs)")
    for o in sub.outputs:
        expect(0 <= o < len(sub.nodes), op, f"{role} output %{o} does not exist")


def subgraph_output_shapes(sub: Graph) -> list[Shape]:
    """The shapes of ``sub``'s outputs, in order."""
    return [sub.nodes[o].shape for o in sub.outputs]


def run_subgraph(sub: Graph, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Evaluate ``sub`` with the reference interpreter, feeding ``xs[k]`` to ``in<k>``."""
    from rlx.backends.reference import evaluate

    feed = {name: xs[int(name[2:])] for name in sub.input_names}
    return evaluate(sub, feed)


def inline(g: Graph, sub: Graph, feeds: Mapping[str, NodeId]) -> list[NodeId]:
    """Copy ``sub``'s nodes into ``g``, its Input named ``k`` replaced by ``feeds[k]``
    (same shape); returns the ids of ``sub``'s outputs in ``g``."""
    from rlx.ops.core import Input

    env: dict[NodeId, NodeId] = {}
    for nid in sub.topo_order():
        n = sub.nodes[nid]
        if isinstance(n.op, Input):
            env[nid] = feeds[n.op.name]
        else:
            env[nid] = g.add_node(n.op, [env[i] for i in n.inputs], n.shape, n.loc)
    return [env[o] for o in sub.outputs]


def _inputs(s: Graph, shapes: Sequence[Shape], first: int = 0) -> list[NodeId]:
    return [s.input(f"in{first + k}", sh) for k, sh in enumerate(shapes)]


def _feeds(ids: Sequence[NodeId]) -> dict[str, NodeId]:
    return {f"in{k}": i for k, i in enumerate(ids)}


def _grads_or_zeros(s: Graph, cts: Mapping[NodeId, NodeId], wrt: Sequence[NodeId]) -> list:
    """Reverse mode inside a derivative sub-graph: the cotangent of each ``wrt`` node
    (zeros where none reaches it) given ``cts`` (output node -> its cotangent)."""
    from rlx.autodiff.reverse import backward
    from rlx.ops.rules import zeros

    grads = backward(s, cts, wrt) if cts else [None] * len(wrt)
    return [gr if gr is not None else zeros(s, w) for gr, w in zip(grads, wrt, strict=True)]


def _tangents(s: Graph, seeds: Mapping[NodeId, NodeId], outs: Sequence[NodeId]) -> list:
    """Forward mode inside a derivative sub-graph: the tangent of each of ``outs`` (zeros
    where none reaches it) given ``seeds`` (node -> its tangent)."""
    from rlx.autodiff.forward import forward
    from rlx.ops.rules import zeros

    tans = forward(s, seeds, outs)
    return [tans[o] if tans[o] is not None else zeros(s, o) for o in outs]


def _floats(shapes: Sequence[Shape]) -> list[int]:
    return [k for k, sh in enumerate(shapes) if sh.dtype.is_float or sh.dtype.is_complex]


def _add_ct(s: Graph, cts: dict[NodeId, NodeId], out: NodeId, ct: NodeId) -> None:
    cts[out] = s.add(cts[out], ct) if out in cts else ct


def _is_scalar_bool(s: Shape) -> bool:
    return s.dtype is DType.BOOL and all(d == 1 for d in s.dims)


def _check_index(op: Op, index: int, n: int, what: str) -> None:
    expect(
        isinstance(index, int) and 0 <= index < n,
        op,
        f"output_index {index} out of range: {what} has {n} results",
    )


@register
class If(Op):
    """``then_branch(*operands)[output_index]`` when ``pred`` holds, else the same of
    ``else_branch``; inputs ``(pred, *operands)``."""

    mnemonic: ClassVar[str] = "if"
    # the seed's class; the precision pass keeps its f32 interface and rewrites its bodies
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    then_branch: Graph
    else_branch: Graph
    output_index: int = 0

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        expect(len(ins) >= 1, self, "needs a predicate input")
        pred, *operands = ins
        expect(_is_scalar_bool(pred), self, f"pred must be a single-element bool, got {pred}")
        check_subgraph(self, self.then_branch, "then_branch", operands)
        check_subgraph(self, self.else_branch, "else_branch", operands)
        t = subgraph_output_shapes(self.then_branch)
        e = subgraph_output_shapes(self.else_branch)
        expect(
            t == e,
            self,
            "branches must return the same shapes, then_branch gives "
            f"[{', '.join(map(str, t))}] and else_branch [{', '.join(map(str, e))}]",
        )
        _check_index(self, self.output_index, len(t), "each branch")
        return t[self.output_index]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        taken = bool(np.asarray(xs[0]).reshape(-1)[0])
        branch = self.then_branch if taken else self.else_branch
        return run_subgraph(branch, xs[1:])[self.output_index]

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        # one If per operand over (pred, *operands, ct), its branches each branch's vjp
        from rlx.ir.mir import Graph

        pred, *ops = node.inputs
        shapes = [g.shape(o) for o in ops]
        diff = _floats(shapes)
        subs = []
        for b in (self.then_branch, self.else_branch):
            s = Graph(f"{b.name}.vjp")
            ins = _inputs(s, shapes)
            out = inline(s, b, _feeds(ins))[self.output_index]
            c = s.input(f"in{len(ins)}", s.shape(out))
            s.set_outputs(_grads_or_zeros(s, {out: c}, [ins[k] for k in diff]))
            subs.append(s)
        grads = {k: g.apply(If(*subs, j), [pred, *ops, ct]) for j, k in enumerate(diff)}
        return (None, *(grads.get(k) for k in range(len(ops))))

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        from rlx.ir.mir import Graph

        pred, *ops = node.inputs
        shapes = [g.shape(o) for o in ops]
        have = [k for k, t in enumerate(tangents[1:]) if t is not None]
        subs = []
        for b in (self.then_branch, self.else_branch):
            s = Graph(f"{b.name}.jvp")
            ins = _inputs(s, shapes)
            tin = _inputs(s, [shapes[k] for k in have], len(ins))
            out = inline(s, b, _feeds(ins))[self.output_index]
            s.set_outputs(_tangents(s, {ins[k]: t for k, t in zip(have, tin)}, [out]))
            subs.append(s)
        return g.apply(If(*subs, 0), [pred, *ops, *(tangents[1 + k] for k in have)])

    def subgraphs(self) -> tuple[Graph, ...]:
        return (self.then_branch, self.else_branch)

    def attrs_str(self) -> str:
        return f"output_index={self.output_index}"


@register
class While(Op):
    """Run ``carries = body(carries)`` while ``cond(carries)``; return carry
    ``output_index``. Inputs: the initial carries."""

    mnemonic: ClassVar[str] = "while"
    # the seed's class; the precision pass keeps its f32 interface and rewrites its bodies
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    nondiff: ClassVar[str] = (
        "reverse mode through a while loop needs the trip count; use scan (g.scan with a "
        "static or symbolic length)"
    )
    cond: Graph
    body: Graph
    output_index: int = 0
    max_iterations: int | None = None

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        expect(len(ins) >= 1, self, "needs at least one carry")
        check_subgraph(self, self.cond, "cond", ins)
        check_subgraph(self, self.body, "body", ins)
        c = subgraph_output_shapes(self.cond)
        expect(
            len(c) == 1 and _is_scalar_bool(c[0]),
            self,
            f"cond must return one single-element bool, returns [{', '.join(map(str, c))}]",
        )
        b = subgraph_output_shapes(self.body)
        expect(
            b == list(ins),
            self,
            "body must return the carries' shapes "
            f"[{', '.join(map(str, ins))}], returns [{', '.join(map(str, b))}]",
        )
        m = self.max_iterations
        expect(
            m is None or (isinstance(m, int) and not isinstance(m, bool) and m >= 0),
            self,
            f"max_iterations must be None or an int >= 0, got {m!r}",
        )
        _check_index(self, self.output_index, len(ins), "the loop")
        return ins[self.output_index]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        carries = list(xs)
        steps = 0
        while bool(run_subgraph(self.cond, carries)[0].reshape(-1)[0]):
            if self.max_iterations is not None and steps >= self.max_iterations:
                raise InputError(
                    f"while: the condition still holds after max_iterations="
                    f"{self.max_iterations} iterations"
                )
            carries = run_subgraph(self.body, carries)
            steps += 1
        return carries[self.output_index]

    def subgraphs(self) -> tuple[Graph, ...]:
        return (self.cond, self.body)

    def attrs_str(self) -> str:
        return f"output_index={self.output_index}, max_iterations={self.max_iterations}"


@register
class Scan(Op):
    """``lax.scan``: inputs ``num_carry`` carries then xs (leading axis ``length``); result
    ``output_index`` of (final carries..., stacked ys...)."""

    mnemonic: ClassVar[str] = "scan"
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    body: Graph
    length: Dim
    num_carry: int
    output_index: int = 0
    reverse: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        nc = self.num_carry
        expect(
            isinstance(nc, int) and 0 <= nc <= len(ins),
            self,
            f"num_carry {nc} out of range for {len(ins)} inputs",
        )
        expect(
            isinstance(self.length, Sym) or (isinstance(self.length, int) and self.length >= 0),
            self,
            f"length must be an int >= 0 or a symbolic dim, got {self.length!r}",
        )
        slices = []
        for j, x in enumerate(ins[nc:]):
            expect(
                x.rank >= 1 and x.dims[0] == self.length,
                self,
                f"xs[{j}] is {x} but must have leading axis length {self.length}",
            )
            slices.append(x.with_dims(x.dims[1:]))
        check_subgraph(self, self.body, "body", [*ins[:nc], *slices])
        outs = subgraph_output_shapes(self.body)
        expect(
            len(outs) >= nc and outs[:nc] == list(ins[:nc]),
            self,
            "body must return the carries' shapes "
            f"[{', '.join(map(str, ins[:nc]))}] first, returns [{', '.join(map(str, outs))}]",
        )
        _check_index(self, self.output_index, len(outs), "the scan")
        y = outs[self.output_index]
        if self.output_index < nc:
            return y
        return Shape((self.length, *y.dims), y.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        nc = self.num_carry
        carries, seq = list(xs[:nc]), list(xs[nc:])
        n = self.length if isinstance(self.length, int) else self.length.evaluate(ctx.bindings)
        ys: list[list[np.ndarray] | None] = [None] * n
        steps = range(n - 1, -1, -1) if self.reverse else range(n)
        for t in steps:
            outs = run_subgraph(self.body, [*carries, *(s[t] for s in seq)])
            carries, ys[t] = outs[:nc], outs[nc:]
        if self.output_index < nc:
            return carries[self.output_index]
        k = self.output_index - nc
        if n == 0:
            return np.zeros(ctx.out_dims, ctx.out_dtype)
        return np.stack([step[k] for step in ys])  # type: ignore[index]

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        """One ScanBackward per float carry and one ScanBackwardXs per float x, over the
        per-step input carries (stacked by a forward scan; see ``control_grad.py``)."""
        from rlx.ops.control_grad import scan_vjp

        return scan_vjp(self, g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        """One scan whose carries and ys gain their tangents (the body's jvp)."""
        from rlx.ir.mir import Graph
        from rlx.ops.grad_util import zeros_or

        nc, o = self.num_carry, self.output_index
        ins = list(node.inputs)
        cshape = [g.shape(i) for i in ins[:nc]]
        xshape = [g.shape(i).with_dims(g.shape(i).dims[1:]) for i in ins[nc:]]
        fc, fx = _floats(cshape), _floats(xshape)
        s = Graph(f"{self.body.name}.jvp")
        cin, tc = _inputs(s, cshape), _inputs(s, [cshape[j] for j in fc], nc)
        xin = _inputs(s, xshape, nc + len(fc))
        tx = _inputs(s, [xshape[i] for i in fx], nc + len(fc) + len(xin))
        outs = inline(s, self.body, _feeds([*cin, *xin]))
        fy = _floats([s.shape(y) for y in outs[nc:]])
        seeds = {**{cin[j]: t for j, t in zip(fc, tc)}, **{xin[i]: t for i, t in zip(fx, tx)}}
        tans = _tangents(s, seeds, [*(outs[j] for j in fc), *(outs[nc + k] for k in fy)])
        s.set_outputs([*outs[:nc], *tans[: len(fc)], *outs[nc:], *tans[len(fc) :]])
        tz = [zeros_or(g, tangents[j], ins[j]) for j in fc]
        tz += [zeros_or(g, tangents[nc + i], ins[nc + i]) for i in fx]
        k = nc + fc.index(o) if o < nc else len(fc) + len(outs) + fy.index(o - nc)
        inputs = [*ins[:nc], *tz[: len(fc)], *ins[nc:], *tz[len(fc) :]]
        return g.apply(Scan(s, self.length, nc + len(fc), k, self.reverse), inputs)

    def subgraphs(self) -> tuple[Graph, ...]:
        return (self.body,)

    def attrs_str(self) -> str:
        return (
            f"length={self.length}, num_carry={self.num_carry}, "
            f"output_index={self.output_index}, reverse={self.reverse}"
        )


# ---- builder conveniences ---------------------------------------------------------


def _sub(g: Graph, role: str, branch: Graph | SubgraphFn, shapes: Sequence[Shape]) -> Graph:
    from rlx.ir.mir import Graph

    if isinstance(branch, Graph):
        return branch
    if not callable(branch):
        raise ShapeError(f"{role} must be a Graph or a function building one, got {branch!r}")
    return build_subgraph(f"{g.name}.{role}", shapes, branch)


@graph_method
def cond(
    g: Graph,
    pred: NodeId,
    then_branch: Graph | SubgraphFn,
    else_branch: Graph | SubgraphFn,
    operands: Sequence[NodeId] = (),
    output_index: int = 0,
) -> NodeId:
    """``If``: branches are Graphs or functions ``fn(sub, *operand_ids) -> out id(s)``."""
    shapes = [g.shape(o) for o in operands]
    t = _sub(g, "then", then_branch, shapes)
    e = _sub(g, "else", else_branch, shapes)
    return g.apply(If(t, e, output_index), [pred, *operands])


@graph_method
def while_loop(
    g: Graph,
    cond: Graph | SubgraphFn,
    body: Graph | SubgraphFn,
    init: Sequence[NodeId],
    output_index: int = 0,
    max_iterations: int | None = None,
) -> NodeId:
    """``While`` over carries ``init``; cond and body are Graphs or builder functions."""
    shapes = [g.shape(i) for i in init]
    c = _sub(g, "cond", cond, shapes)
    b = _sub(g, "body", body, shapes)
    return g.apply(While(c, b, output_index, max_iterations), list(init))


@graph_method
def scan(
    g: Graph,
    body: Graph | SubgraphFn,
    init: Sequence[NodeId],
    xs: Sequence[NodeId] = (),
    length: Dim | None = None,
    output_index: int = 0,
    reverse: bool = False,
) -> NodeId:
    """``Scan`` with carries ``init`` over ``xs`` (``length`` defaults to their leading
    dim); body is a Graph or ``fn(sub, *carry_ids, *x_ids) -> (carries..., ys...)``."""
    if length is None:
        if not xs:
            raise ShapeError("scan: give length when there are no xs to scan over")
        if g.shape(xs[0]).rank == 0:
            raise ShapeError(f"scan: xs[0] is {g.shape(xs[0])}, it needs a leading axis")
        length = g.shape(xs[0]).dims[0]
    shapes = [g.shape(i) for i in init]
    shapes += [g.shape(x).with_dims(g.shape(x).dims[1:]) for x in xs]
    b = _sub(g, "body", body, shapes)
    return g.apply(Scan(b, length, len(init), output_index, reverse), [*init, *xs])
