"""Fused ops: one node standing for a chain of primitive ops, built by the fusion passes
or by HIR lowering with ``FusionPolicy.DIRECT``.

Each reference computes exactly what its unfused chain computes in the reference
interpreter: it runs the references of the chain's primitive ops (MatMul, Binary, Unary,
RmsNorm, LayerNorm) and rounds every intermediate to the node's dtype, as the interpreter
stores it; so a bf16 ``fused_matmul_bias_act`` equals bf16 ``matmul -> add -> gelu`` bit
for bit. Shape rules are the primitive ops' rules too.

* ``FusedMatMulBiasAct(act, has_bias)``: ``act(x @ w + bias)``, inputs ``(x, w[, bias])``,
  ``x @ w`` with ``np.matmul`` semantics, ``bias`` broadcast to the product.
* ``FusedSwiGLU``: ``silu(x @ w_gate) * (x @ w_up)``, inputs ``(x, w_gate, w_up)``.
* ``FusedResidualRmsNorm(eps, has_beta)``: ``rms_norm(x + residual)`` over the last axis,
  inputs ``(x, residual, gamma[, beta])``.
* ``FusedResidualLN(eps, has_beta)``: ``layer_norm(x + residual)``, same inputs.
* ``ElementwiseRegion(body)``: a DAG of elementwise ops as one node (see the class).

Derivatives compose the primitive ops' rules on the unfused chain (``_as``: the fused
node seen as its last link, so ``act'`` reads the fused output instead of recomputing
it): matmul products for x and the weights, ``unbroadcast`` for the bias, the norms'
backward ops for the residual norms. The pre-activation ``x @ w + bias`` is rebuilt only
when ``act'`` needs it. A region's rules differentiate its body in a sub-graph and inline
the result (its primitive ops fuse again when the derivative graph is compiled).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.errors import ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.control import build_subgraph, check_subgraph, run_subgraph, subgraph_output_shapes
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.linalg import MatMul
from rlx.ops.norm import LayerNorm, RmsNorm
from rlx.shape import Shape, broadcast_dims

__all__ = [
    "Activation",
    "FusedMatMulBiasAct",
    "FusedSwiGLU",
    "FusedResidualRmsNorm",
    "FusedResidualLN",
    "ElementwiseRegion",
]

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

Activation = UnaryKind
"""The activations a fused op may apply: any :class:`UnaryKind`."""


def _step(op: Op, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
    """One link of an unfused chain: ``op``'s reference, stored in the node's dtype as the
    interpreter stores every intermediate (each link here has the fused node's dims and
    dtype, so the fused node's ``ctx`` is also the link's)."""
    r = np.asarray(op.reference(xs, ctx))
    if r.dtype != ctx.out_dtype:
        with np.errstate(all="ignore"):
            r = r.astype(ctx.out_dtype)
    return r


def _act(act: UnaryKind | None, y: np.ndarray, ctx: RefCtx) -> np.ndarray:
    return y if act is None else _step(Unary(act), [y], ctx)


_ADD = Binary(BinaryKind.ADD)


@register
class FusedMatMulBiasAct(Op):
    """``act(x @ w + bias)``; inputs ``(x, w[, bias])``; ``act=None`` applies nothing."""

    mnemonic: ClassVar[str] = "fused_matmul_bias_act"
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    act: UnaryKind | None = None
    has_bias: bool = True

    def num_inputs(self) -> int:
        return 3 if self.has_bias else 2

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        y = MatMul().infer((ins[0], ins[1]))
        if self.has_bias:
            bias = ins[2]
            expect(bias.dtype is y.dtype, self, f"bias is {bias}, the product is {y}")
            try:
                fits = broadcast_dims(y.dims, bias.dims) == y.dims
            except ShapeError:
                fits = False
            expect(fits, self, f"bias {bias} does not broadcast to the product {y}")
        if self.act is not None:
            Unary(self.act).infer((y,))
        return y

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        y = _step(MatMul(), xs[:2], ctx)
        if self.has_bias:
            y = _step(_ADD, [y, xs[2]], ctx)
        return _act(self.act, y, ctx)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops.rules import unbroadcast

        x, w = node.inputs[:2]
        dz = ct if self.act is None else _act_times(g, self.act, node, _pre_act(g, node), ct)
        if dz is None:
            return (None,) * len(node.inputs)
        dx, dw = MatMul().vjp(g, _as(node, MatMul(), (x, w)), dz)
        return (dx, dw, unbroadcast(g, dz, node.inputs[2])) if self.has_bias else (dx, dw)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.rules import add_any

        x, w = node.inputs[:2]
        tz = MatMul().jvp(g, _as(node, MatMul(), (x, w)), tangents[:2])
        tz = _full(g, add_any(g, [tz, tangents[2] if self.has_bias else None]), node)
        if tz is None or self.act is None:
            return tz
        return _act_times(g, self.act, node, _pre_act(g, node), tz)

    def attrs_str(self) -> str:
        act = self.act.value if self.act is not None else "none"
        return f"act={act}, has_bias={self.has_bias}"


@register
class FusedSwiGLU(Op):
    """``silu(x @ w_gate) * (x @ w_up)``; inputs ``(x, w_gate, w_up)``."""

    mnemonic: ClassVar[str] = "fused_swiglu"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE  # the seed's class (rlx-compile precision.rs)

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, wg, wu = ins
        gate = MatMul().infer((x, wg))
        up = MatMul().infer((x, wu))
        expect(gate == up, self, f"x @ w_gate is {gate} but x @ w_up is {up}")
        Unary(UnaryKind.SILU).infer((gate,))
        return gate

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, wg, wu = xs
        gate = _act(UnaryKind.SILU, _step(MatMul(), [x, wg], ctx), ctx)
        up = _step(MatMul(), [x, wu], ctx)
        return _step(Binary(BinaryKind.MUL), [gate, up], ctx)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        x, wg, wu = node.inputs
        a, u = g.matmul(x, wg), g.matmul(x, wu)
        s = g.silu(a)
        da = _act_times(g, UnaryKind.SILU, g.node(s), a, g.mul(ct, u))
        assert da is not None  # silu has a derivative
        dx1, dwg = MatMul().vjp(g, _as(node, MatMul(), (x, wg)), da)
        dx2, dwu = MatMul().vjp(g, _as(node, MatMul(), (x, wu)), g.mul(ct, s))
        return g.add(dx1, dx2), dwg, dwu

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.rules import add_any

        x, wg, wu = node.inputs
        tx, twg, twu = tangents
        a, u = g.matmul(x, wg), g.matmul(x, wu)
        s = g.silu(a)
        ta = MatMul().jvp(g, _as(node, MatMul(), (x, wg)), (tx, twg))
        tu = MatMul().jvp(g, _as(node, MatMul(), (x, wu)), (tx, twu))
        tsil = None if ta is None else _act_times(g, UnaryKind.SILU, g.node(s), a, ta)
        return add_any(
            g, [None if tsil is None else g.mul(tsil, u), None if tu is None else g.mul(s, tu)]
        )


def _residual_shape(op: Op, norm: Op, ins: tuple[Shape, ...]) -> Shape:
    """The shape rule of ``norm(x + residual, gamma[, beta])``."""
    x, res = ins[:2]
    expect(res.dtype is x.dtype, op, f"residual is {res} but x is {x} (cast one first)")
    h = Shape(broadcast_dims(x.dims, res.dims), x.dtype)
    return norm.infer((h, *ins[2:]))


def _residual_reference(norm: Op, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
    h = _step(_ADD, xs[:2], ctx)
    return _step(norm, [h, *xs[2:]], ctx)


@register
class FusedResidualRmsNorm(Op):
    """``rms_norm(x + residual)``: ``h / sqrt(mean(h^2) + eps) * gamma (+ beta)`` over the
    last axis with ``h = x + residual``; inputs ``(x, residual, gamma[, beta])``."""

    mnemonic: ClassVar[str] = "fused_residual_rms_norm"
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    eps: float = 1e-6
    has_beta: bool = False

    def num_inputs(self) -> int:
        return 4 if self.has_beta else 3

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _residual_shape(self, RmsNorm(self.eps, self.has_beta), ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return _residual_reference(RmsNorm(self.eps, self.has_beta), xs, ctx)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return _residual_vjp(RmsNorm(self.eps, self.has_beta), g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return _residual_jvp(RmsNorm(self.eps, self.has_beta), g, node, tangents)


@register
class FusedResidualLN(Op):
    """``layer_norm(x + residual)``: ``(h - mean) / sqrt(var + eps) * gamma (+ beta)``
    over the last axis with ``h = x + residual``; inputs ``(x, residual, gamma[, beta])``."""

    mnemonic: ClassVar[str] = "fused_residual_layer_norm"
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    eps: float = 1e-5
    has_beta: bool = True

    def num_inputs(self) -> int:
        return 4 if self.has_beta else 3

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _residual_shape(self, LayerNorm(self.eps, self.has_beta), ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return _residual_reference(LayerNorm(self.eps, self.has_beta), xs, ctx)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return _residual_vjp(LayerNorm(self.eps, self.has_beta), g, node, ct)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return _residual_jvp(LayerNorm(self.eps, self.has_beta), g, node, tangents)


@register
class ElementwiseRegion(Op):
    """A DAG of elementwise ops run as one node. ``body`` is a Graph whose Inputs
    ``in0..inN`` are the region's inputs (same shapes and dtypes, in order), holding only
    Inputs, Constants and ops flagged ``elementwise``, with exactly one output.

    The region is an ELEMENTWISE-kind op but not itself ``elementwise``: fusion builds
    regions out of elementwise ops and never nests one region inside another; to grow a
    region, rebuild its body.
    """

    mnemonic: ClassVar[str] = "elementwise_region"
    arity: ClassVar[None] = None  # one input per body Input, checked by infer
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
    elementwise: ClassVar[bool] = False
    body: Graph

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        from rlx.ops.core import Constant, Input

        check_subgraph(self, self.body, "body", ins)
        names = set(self.body.input_names)
        missing = [f"in{k}" for k in range(len(ins)) if f"in{k}" not in names]
        expect(not missing, self, f"body lacks inputs {missing} for its {len(ins)} operands")
        for n in self.body.nodes:
            expect(
                n.op.elementwise or isinstance(n.op, (Input, Constant)),
                self,
                f"body node %{n.id} {n.op} is not elementwise",
            )
        outs = subgraph_output_shapes(self.body)
        expect(len(outs) == 1, self, f"body must have exactly one output, has {len(outs)}")
        return outs[0]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return run_subgraph(self.body, xs)[0]

    def subgraphs(self) -> tuple[Graph, ...]:
        return (self.body,)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        """The body's reverse pass, built in a sub-graph and inlined on the operands (the
        primitive ops it leaves fuse again when the graph is compiled)."""
        from rlx.autodiff.reverse import backward
        from rlx.ir.mir import Graph
        from rlx.ops.control import inline

        s = Graph(f"{self.body.name}.vjp")
        ins = [s.input(f"in{k}", g.shape(i)) for k, i in enumerate(node.inputs)]
        out = inline(s, self.body, {f"in{k}": i for k, i in enumerate(ins)})[0]
        grads = backward(s, {out: s.input("ct", s.shape(out))}, ins)
        have = [k for k, c in enumerate(grads) if c is not None]
        s.set_outputs([c for c in grads if c is not None])
        feeds = {f"in{k}": i for k, i in enumerate(node.inputs)} | {"ct": ct}
        got = dict(zip(have, inline(g, s, feeds), strict=True))
        return tuple(got.get(k) for k in range(len(node.inputs)))

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        """The body's forward-mode pass, built in a sub-graph and inlined."""
        from rlx.autodiff.forward import forward
        from rlx.ir.mir import Graph
        from rlx.ops.control import inline

        s = Graph(f"{self.body.name}.jvp")
        ins = [s.input(f"in{k}", g.shape(i)) for k, i in enumerate(node.inputs)]
        out = inline(s, self.body, {f"in{k}": i for k, i in enumerate(ins)})[0]
        given = {k: t for k, t in enumerate(tangents) if t is not None}
        seeds = {ins[k]: s.input(f"t{k}", g.shape(t)) for k, t in given.items()}
        tan = forward(s, seeds, [out])[out]
        if tan is None:
            return None
        s.set_outputs([tan])
        feeds = {f"in{k}": i for k, i in enumerate(node.inputs)}
        feeds |= {f"t{k}": t for k, t in given.items()}
        return inline(g, s, feeds)[0]

    def attrs_str(self) -> str:
        return f"body={self.body.name}, nodes={len(self.body.nodes)}"


# ---- derivative helpers -------------------------------------------------------------


def _as(node: Node, op: Op, inputs: tuple[NodeId, ...]) -> Node:
    """The fused ``node`` seen as one link of its chain: ``op`` applied to ``inputs`` with
    the fused output's id and shape (a rule reads ``node.id`` as that link's output)."""
    from rlx.ir.mir import Node

    return Node(node.id, op, inputs, node.shape, node.loc)


def _pre_act(g: Graph, node: Node) -> NodeId:
    """``x @ w (+ bias)`` of a FusedMatMulBiasAct, rebuilt (DCE drops it if unused)."""
    z = g.matmul(node.inputs[0], node.inputs[1])
    return g.add(z, node.inputs[2]) if len(node.inputs) == 3 else z


def _act_times(g: Graph, act: UnaryKind, out: Node, z: NodeId, t: NodeId) -> NodeId | None:
    """``t * act'(z)`` where ``out`` is the node holding ``act(z)``."""
    from rlx.ops.pointwise_grad import unary_times

    return unary_times(g, act, _as(out, Unary(act), (z,)), t)


def _full(g: Graph, t: NodeId | None, node: Node) -> NodeId | None:
    if t is None or g.shape(t).dims == node.shape.dims:
        return t
    return g.expand(t, list(node.shape.dims))


def _residual_vjp(norm: Op, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
    from rlx.ops.rules import unbroadcast

    x, r = node.inputs[:2]
    h = g.add(x, r)
    dh, *rest = norm.vjp(g, _as(node, norm, (h, *node.inputs[2:])), ct)
    assert dh is not None  # a norm's input always has a cotangent
    return (unbroadcast(g, dh, x), unbroadcast(g, dh, r), *rest)


def _residual_jvp(
    norm: Op, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]
) -> NodeId | None:
    from rlx.ops.rules import add_any

    x, r = node.inputs[:2]
    h = g.add(x, r)
    th = add_any(g, tangents[:2])
    if th is not None and g.shape(th).dims != g.shape(h).dims:
        th = g.expand(th, list(g.shape(h).dims))
    return norm.jvp(g, _as(node, norm, (h, *node.inputs[2:])), (th, *tangents[2:]))


# ---- builder conveniences ---------------------------------------------------------


@graph_method
def fused_matmul_bias_act(
    g: Graph,
    x: NodeId,
    w: NodeId,
    bias: NodeId | None = None,
    act: UnaryKind | None = None,
) -> NodeId:
    """``act(x @ w + bias)`` as one node (``bias`` and ``act`` optional)."""
    ins = [x, w] if bias is None else [x, w, bias]
    return g.apply(FusedMatMulBiasAct(act, bias is not None), ins)


@graph_method
def fused_swiglu(g: Graph, x: NodeId, w_gate: NodeId, w_up: NodeId) -> NodeId:
    """``silu(x @ w_gate) * (x @ w_up)`` as one node."""
    return g.apply(FusedSwiGLU(), [x, w_gate, w_up])


@graph_method
def fused_residual_rms_norm(
    g: Graph,
    x: NodeId,
    residual: NodeId,
    gamma: NodeId,
    beta: NodeId | None = None,
    eps: float = 1e-6,
) -> NodeId:
    """``rms_norm(x + residual, gamma[, beta])`` as one node."""
    ins = [x, residual, gamma] if beta is None else [x, residual, gamma, beta]
    return g.apply(FusedResidualRmsNorm(float(eps), beta is not None), ins)


@graph_method
def fused_residual_layer_norm(
    g: Graph,
    x: NodeId,
    residual: NodeId,
    gamma: NodeId,
    beta: NodeId | None = None,
    eps: float = 1e-5,
) -> NodeId:
    """``layer_norm(x + residual, gamma[, beta])`` as one node."""
    ins = [x, residual, gamma] if beta is None else [x, residual, gamma, beta]
    return g.apply(FusedResidualLN(float(eps), beta is not None), ins)


@graph_method
def elementwise_region(
    g: Graph, inputs: Sequence[NodeId], body: Graph | Callable[..., NodeId]
) -> NodeId:
    """One ElementwiseRegion over ``inputs``; ``body`` is a Graph or a function
    ``fn(sub, *input_ids) -> out_id`` that builds it on the inputs' shapes."""
    from rlx.ir.mir import Graph

    if not isinstance(body, Graph):
        body = build_subgraph(f"{g.name}.region", [g.shape(i) for i in inputs], body)
    return g.apply(ElementwiseRegion(body), list(inputs))
