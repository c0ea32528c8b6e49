"""ONNX If / Loop / Scan -> rlx If / While / Scan (rlx/ops/control.py).

An ONNX sub-graph reads values of the enclosing graph by name; an rlx sub-graph reads only
its Inputs ``in0..``. Converting a body therefore *captures*: each outer value the body
uses becomes one more operand, after the body's own formal inputs (for If, the two
branches share one operand list). A constant outer value is copied into the body instead.
rlx nodes have one result, so an ONNX node with n outputs becomes n rlx nodes that differ
in ``output_index``.

* If: one ``if`` per output.
* Scan (opset 9+): scan axes moved to the front and directions applied with a reversing
  slice; captured values ride along as carries the body passes through unchanged.
* Loop: a ``while`` over (iteration, condition, loop-carried values, captures); a Loop
  with scan outputs is named unsupported (its output length is known only at run time)."""

from __future__ import annotations

import numpy as np
from onnx import GraphProto

from rlx.dtype import DType
from rlx.frontends.onnx.context import ImportState, NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import axis_of, bin_, cast, cmp, scalar
from rlx.ir.mir import Graph
from rlx.ops.control import If, Scan, While
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import CompareKind as C
from rlx.ops.movement import Reshape, Slice, Transpose
from rlx.shape import Shape

__all__ = ["capture", "convert_body"]


def capture(st: ImportState, name: str) -> int:
    """Make outer value ``name`` an Input of the sub-graph ``st.g`` (see the docstring)."""
    assert st.outer is not None
    c = st.outer.const(name)
    if c is not None:
        st.ids[name] = st.g.constant(c)
        return st.ids[name]
    outer_id = st.outer.node_id(name)
    k = st.captured.setdefault(name, st.base + len(st.captured))
    st.ids[name] = st.g.input(f"in{k}", st.outer.g.shape(outer_id))
    return st.ids[name]


def convert_body(
    ctx: NodeCtx, body: GraphProto, formals: list[tuple[str, Shape]],
    captured: dict[str, int], name: str,
) -> tuple[Graph, list[int]]:  # fmt: skip
    """``body`` as an rlx Graph whose Inputs in0.. are ``formals`` then the captures
    (recorded in the shared ``captured``: outer name -> operand index). Returns the graph
    and its output node ids (also set as its outputs)."""
    from rlx.frontends.onnx.loader import convert_nodes

    g = Graph(name)
    st = ImportState(g, ctx.st.opsets, outer=ctx.st, captured=captured, base=len(formals))
    for k, (n, shape) in enumerate(formals):
        st.ids[n] = g.input(f"in{k}", shape)
        st.graph_inputs.add(n)
    for t in body.initializer:
        from rlx.frontends.onnx.tensors import to_array

        st.consts[t.name] = to_array(t)
    convert_nodes(st, body.node)
    outs = [st.node_id(o.name) for o in body.output]
    g.set_outputs(outs)
    return g, outs


def _operands(ctx: NodeCtx, captured: dict[str, int]) -> list[int]:
    return [ctx.st.node_id(n) for n in sorted(captured, key=captured.__getitem__)]


@converter("If", since=1)
def if_(ctx: NodeCtx) -> list[int]:
    g = ctx.g
    known = ctx.st.fold(ctx.node.input[0])
    if known is not None:  # a condition known at import: the taken branch, inlined
        from rlx.frontends.onnx.loader import convert_nodes

        branch = ctx.attr(
            "then_branch" if bool(np.asarray(known).reshape(-1)[0]) else "else_branch"
        )
        for t in branch.initializer:
            from rlx.frontends.onnx.tensors import to_array

            ctx.st.consts[t.name] = to_array(t)
        convert_nodes(ctx.st, branch.node)
        return [ctx.st.const(o.name) if ctx.st.const(o.name) is not None else ctx.st.node_id(o.name)
                for o in branch.output]  # fmt: skip
    pred = ctx.x(0)
    if ctx.shape(pred).dims != (1,) * ctx.shape(pred).rank:
        raise ctx.error(f"the condition must hold one element, got {ctx.shape(pred)}")
    captured: dict[str, int] = {}
    tb, _ = convert_body(ctx, ctx.attr("then_branch"), [], captured, "then")
    eb, _ = convert_body(ctx, ctx.attr("else_branch"), [], captured, "else")
    ops = _operands(ctx, captured)
    n = len(tb.outputs)
    return [g.apply(If(tb, eb, i), [pred, *ops]) for i in range(n)]


def _flip(g, x: int, ax: int) -> int:  # noqa: ANN001
    r = g.shape(x).rank
    none = (None,) * r
    return g.apply(Slice(none, none, tuple(-1 if i == ax else 1 for i in range(r))), [x])


def _to_front(g, x: int, ax: int) -> int:  # noqa: ANN001
    r = g.shape(x).rank
    if ax == 0:
        return x
    return g.apply(Transpose((ax, *[i for i in range(r) if i != ax])), [x])


@converter("Scan", since=9)
def scan(ctx: NodeCtx) -> list[int]:
    g = ctx.g
    body: GraphProto = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    ins = ctx.xs()
    n_state = len(ins) - m
    in_axes = ctx.attr("scan_input_axes") or [0] * m
    in_dirs = ctx.attr("scan_input_directions") or [0] * m
    xs = []
    for j, x in enumerate(ins[n_state:]):
        ax = axis_of(int(in_axes[j]), ctx.shape(x).rank)
        x = _to_front(g, x, ax)
        xs.append(_flip(g, x, 0) if in_dirs[j] else x)
    length = ctx.shape(xs[0]).dims[0]
    formals = [(i.name, ctx.shape(v)) for i, v in zip(body.input, ins[:n_state], strict=False)]
    formals += [
        (i.name, ctx.shape(v).with_dims(ctx.shape(v).dims[1:]))
        for i, v in zip(body.input[n_state:], xs, strict=True)
    ]
    captured: dict[str, int] = {}
    bg, outs = convert_body(ctx, body, formals, captured, "scan_body")
    n_cap = len(captured)
    if n_cap:  # captures become carries after the states, passed through unchanged
        cap_ids = [
            bg.node(i).id for i in range(len(bg.nodes))
            if getattr(bg.nodes[i].op, "name", "").startswith("in")
            and int(bg.nodes[i].op.name[2:]) >= len(formals)
        ]  # fmt: skip
        bg = _reorder_scan_body(bg, n_state, m, n_cap, cap_ids)
    ops = _operands(ctx, captured)
    carries = ins[:n_state] + ops
    nc = n_state + n_cap
    k = len(body.output) - n_state
    out_axes = ctx.attr("scan_output_axes") or [0] * k
    out_dirs = ctx.attr("scan_output_directions") or [0] * k
    res = [g.apply(Scan(bg, length, nc, i), [*carries, *xs]) for i in range(n_state)]
    for j in range(k):
        y = g.apply(Scan(bg, length, nc, nc + j), [*carries, *xs])
        if out_dirs[j]:
            y = _flip(g, y, 0)
        r = g.shape(y).rank
        ax = axis_of(int(out_axes[j]), r)
        if ax:
            perm = list(range(1, r))
            perm.insert(ax, 0)
            y = g.apply(Transpose(tuple(perm)), [y])
        res.append(y)
    return res


def _reorder_scan_body(bg: Graph, n_state: int, m: int, n_cap: int, cap_ids: list[int]) -> Graph:
    """Renumber the body's Inputs so captures follow the states (rlx Scan: carries, then
    xs) and return the captures as extra carries right after the states."""
    from rlx.ops.core import Input

    new = Graph(bg.name)
    remap: dict[int, int] = {}
    for n in bg.nodes:
        if isinstance(n.op, Input):
            k = int(n.op.name[2:])
            if k < n_state:
                kk = k
            elif k < n_state + m:
                kk = k + n_cap
            else:
                kk = k - m
            remap[n.id] = new.add_node(Input(f"in{kk}", n.shape), [], n.shape)
        else:
            remap[n.id] = new.add_node(n.op, [remap[i] for i in n.inputs], n.shape)
    outs = [remap[o] for o in bg.outputs]
    caps = sorted(cap_ids, key=lambda i: int(bg.nodes[i].op.name[2:]))
    new.set_outputs(outs[:n_state] + [remap[i] for i in caps] + outs[n_state:])
    return new


@converter("Loop", since=1)
def loop(ctx: NodeCtx) -> list[int]:
    g = ctx.g
    body: GraphProto = ctx.attr("body")
    n_v = len(ctx.node.input) - 2
    if len(body.output) - 1 > n_v:
        return _loop_as_scan(ctx, body, n_v)
    trip = ctx.x(0) if ctx.has(0) else g.constant(np.asarray(2**62, np.int64))
    cond = ctx.x(1) if ctx.has(1) else g.constant(np.asarray(True))
    trip = g.apply(Reshape(()), [cast(g, trip, DType.I64)])
    cond = g.apply(Reshape(()), [cond])
    vs = [ctx.x(i) for i in range(2, len(ctx.node.input))]
    it_name, cond_name = body.input[0].name, body.input[1].name
    formals = [(it_name, Shape((), DType.I64)), (cond_name, Shape((), DType.BOOL))]
    formals += [(i.name, ctx.shape(v)) for i, v in zip(body.input[2:], vs, strict=True)]
    captured: dict[str, int] = {}
    bg, outs = convert_body(ctx, body, formals, captured, "loop_body")
    ops = _operands(ctx, captured)
    # while carries: (i, trip, cond, vs..., captures...); body: i+1, trip, cond', vs', caps
    wb = Graph("loop_step")
    ids = [wb.input(f"in{k}", s) for k, s in enumerate(
        [Shape((), DType.I64), Shape((), DType.I64), Shape((), DType.BOOL)]
        + [ctx.shape(v) for v in vs] + [g.shape(o) for o in ops])]  # fmt: skip

    sub_outs = _inline(wb, bg, [ids[0], ids[2], *ids[3:]])
    nxt = bin_(wb, B.ADD, ids[0], scalar(wb, 1, ids[0]))
    c2 = wb.apply(Reshape(()), [sub_outs[0]])
    wb.set_outputs([nxt, ids[1], c2, *sub_outs[1:], *ids[3 + len(vs) :]])
    wc = Graph("loop_cond")
    cids = [wc.input(f"in{k}", wb.shape(i)) for k, i in enumerate(ids[:3])]
    wc.set_outputs(bin_(wc, B.AND, cmp(wc, C.LT, cids[0], cids[1]), cids[2]))
    init = [g.constant(np.asarray(0, np.int64)), trip, cond, *vs, *ops]
    return [g.apply(While(wc, wb, 3 + j), init) for j in range(len(vs))]


def _always_true(bg: Graph) -> bool:
    """The body's condition output is its condition input or a constant True."""
    from rlx.ops.core import Constant, Input

    n = bg.nodes[bg.outputs[0]]
    if isinstance(n.op, Input):
        return n.op.name == "in1"
    return isinstance(n.op, Constant) and bool(np.all(n.op.value.array()))


def _loop_as_scan(ctx: NodeCtx, body: GraphProto, n_v: int) -> list[int]:
    """A Loop with scan outputs runs as an rlx Scan when its trip count is known at import
    and its condition can only stay true (its output length is then the trip count)."""
    g = ctx.g
    if not ctx.has(0):
        raise ctx.unsupported("a Loop with scan outputs and no trip count")
    m = int(np.asarray(ctx.value(0, "trip count M")).reshape(-1)[0])
    if ctx.has(1) and not bool(np.asarray(ctx.value(1, "cond")).reshape(-1)[0]):
        raise ctx.unsupported("a Loop with scan outputs whose condition starts false")
    vs = [ctx.x(i) for i in range(2, len(ctx.node.input))]
    formals = [
        (body.input[0].name, Shape((), DType.I64)),
        (body.input[1].name, Shape((), DType.BOOL)),
    ]
    formals += [(i.name, ctx.shape(v)) for i, v in zip(body.input[2:], vs, strict=True)]
    captured: dict[str, int] = {}
    bg, _ = convert_body(ctx, body, formals, captured, "loop_body")
    if not _always_true(bg):
        raise ctx.unsupported("a Loop with scan outputs whose condition may turn false")
    ops = _operands(ctx, captured)
    # scan carries: (i, vs..., captures...); body: i+1, vs', captures, then the scan outputs
    sb = Graph("loop_scan")
    shapes = [Shape((), DType.I64)] + [ctx.shape(v) for v in vs] + [g.shape(o) for o in ops]
    ids = [sb.input(f"in{k}", s) for k, s in enumerate(shapes)]
    true = sb.constant(np.asarray(True))
    outs = _inline(sb, bg, [ids[0], true, *ids[1:]])
    nxt = bin_(sb, B.ADD, ids[0], scalar(sb, 1, ids[0]))
    sb.set_outputs([nxt, *outs[1 : 1 + n_v], *ids[1 + n_v :], *outs[1 + n_v :]])
    init = [g.constant(np.asarray(0, np.int64)), *vs, *ops]
    nc = len(init)
    n_scan = len(body.output) - 1 - n_v
    res = [g.apply(Scan(sb, m, nc, 1 + j), init) for j in range(n_v)]
    res += [g.apply(Scan(sb, m, nc, nc + j), init) for j in range(n_scan)]
    return res


def _inline(dst: Graph, src: Graph, args: list[int]) -> list[int]:
    """Copy ``src`` into ``dst`` with its Inputs in<k> replaced by ``args[k]``."""
    from rlx.ops.core import Input

    remap: dict[int, int] = {}
    for n in src.nodes:
        if isinstance(n.op, Input):
            remap[n.id] = args[int(n.op.name[2:])]
        else:
            remap[n.id] = dst.add_node(n.op, [remap[i] for i in n.inputs], n.shape)
    return [remap[o] for o in src.outputs]
