"""Custom ops: user-defined ops registered by name at run time, without a new class.

``register_custom_op(name, infer, reference)`` records an entry; ``Custom(name, attributes)``
(built with ``g.custom(name, inputs, **attrs)``) is the one registered op class that looks
the entry up and delegates to it:

* ``infer(ins: tuple[Shape, ...], attrs: Mapping[str, Any]) -> Shape``
* ``reference(xs: Sequence[np.ndarray], attrs: Mapping[str, Any], ctx: RefCtx) -> ndarray``
* optionally ``vjp(g, node, ct) -> cotangents`` and ``jvp(g, node, tangents) -> tangent``
  (the op's derivative rules, built with graph builders; without them the op is not
  differentiable)

Attributes are hashable values (ints, floats, bools, strings, None, tuples, DTypes,
Shapes and rlx enums / frozen dataclasses: what files can hold). A name that is not
registered is an error when the node is built and when a saved graph is loaded: register
custom ops before loading graphs that use them.

:class:`CustomFn` is the seed's other extension point: a sub-graph (``fwd_body``) used as
one op, with optional user-given differentiation rules (``vjp_body``, ``jvp_body``, as
JAX's ``custom_vjp`` / ``custom_jvp``; without them autodiff differentiates ``fwd_body``).
It needs no registration: the bodies travel with the node (printed, verified,
fingerprinted and saved like control-flow bodies).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rlx.errors import AutodiffError, RlxError, ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.control import check_subgraph, inline, run_subgraph, subgraph_output_shapes
from rlx.ops.grad_util import zeros_or
from rlx.ops.rules import is_diff_dtype
from rlx.shape import Shape

__all__ = [
    "CustomOpDef",
    "Custom",
    "register_custom_op",
    "unregister_custom_op",
    "custom_op",
    "custom_op_names",
    "CustomFn",
]

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

    VjpFn = Callable[[Graph, Node, NodeId], Sequence[NodeId | None]]
    JvpFn = Callable[[Graph, Node, tuple[NodeId | None, ...]], NodeId | None]
    BodyFn = Callable[..., NodeId | Sequence[NodeId]]

InferFn = Callable[[tuple[Shape, ...], Mapping[str, Any]], Shape]
ReferenceFn = Callable[[Sequence[np.ndarray], Mapping[str, Any], RefCtx], np.ndarray]


@dataclass(frozen=True, slots=True)
class CustomOpDef:
    """A registry entry: the functions and facts a :class:`Custom` node delegates to."""

    name: str
    infer: InferFn
    reference: ReferenceFn
    arity: int | None
    kind: OpKind
    vjp: VjpFn | None = None
    jvp: JvpFn | None = None


_REGISTRY: dict[str, CustomOpDef] = {}


def register_custom_op(
    name: str,
    infer: InferFn,
    reference: ReferenceFn,
    arity: int | None = None,
    kind: OpKind = OpKind.COMPUTE,
    *,
    replace: bool = False,
    vjp: VjpFn | None = None,
    jvp: JvpFn | None = None,
) -> CustomOpDef:
    """Register custom op ``name`` and return its registry entry.

    ``infer(input_shapes, attrs) -> Shape`` is the shape/dtype rule (raise ShapeError to
    reject inputs); ``reference(arrays, attrs, ctx) -> np.ndarray`` computes the output
    with NumPy. ``attrs`` are the keyword arguments given to ``g.custom(name, inputs,
    **attrs)``. ``arity=None`` accepts any number of inputs; ``kind`` is the precision class
    for mixed precision. Registering a taken name raises ShapeError unless ``replace=True``.

    ``vjp(g, node, ct) -> one cotangent id (or None) per input`` and ``jvp(g, node,
    tangents) -> the output's tangent id (or None)`` are optional derivative rules, built
    with the graph builders as an op's own rules are (``node.op.attr_map`` holds the
    attributes); without them the op is not differentiable (AutodiffError naming it).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ShapeError(f"custom op name must be an identifier, got {name!r}")
    if name in _REGISTRY and not replace:
        raise ShapeError(
            f"custom op {name!r} is already registered (pass replace=True to redefine it)"
        )
    if not callable(infer) or not callable(reference):
        raise ShapeError(f"custom op {name!r}: infer and reference must be callables")
    if arity is not None and (not isinstance(arity, int) or isinstance(arity, bool) or arity < 0):
        raise ShapeError(f"custom op {name!r}: arity must be None or an int >= 0, got {arity!r}")
    if not isinstance(kind, OpKind):
        raise ShapeError(f"custom op {name!r}: kind must be an OpKind, got {kind!r}")
    if any(f is not None and not callable(f) for f in (vjp, jvp)):
        raise ShapeError(f"custom op {name!r}: vjp and jvp must be callables or None")
    entry = CustomOpDef(name, infer, reference, arity, kind, vjp, jvp)
    _REGISTRY[name] = entry
    return entry


def unregister_custom_op(name: str) -> None:
    """Remove ``name`` from the registry (ShapeError when it is not registered)."""
    custom_op(name)
    del _REGISTRY[name]


def custom_op_names() -> list[str]:
    """The registered custom op names, sorted."""
    return sorted(_REGISTRY)


def custom_op(name: str) -> CustomOpDef:
    """The registry entry of ``name``; ShapeError listing the registered names if none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ShapeError(
            f"custom op {name!r} is not registered (registered: {custom_op_names()}); "
            "call rlx.register_custom_op first"
        ) from None


class _EntryKind:
    """``Custom.kind``: the entry's OpKind on an instance, COMPUTE on the class."""

    def __get__(self, obj: Custom | None, owner: type) -> OpKind:
        if obj is None:
            return OpKind.COMPUTE
        return custom_op(obj.name).kind


@register
class Custom(Op):
    """A node of custom op ``name`` with ``attributes`` (``(key, value)`` pairs, sorted by
    the builder); shape rule, reference, arity and kind come from the registry entry."""

    mnemonic: ClassVar[str] = "custom"
    kind = _EntryKind()  # type: ignore[assignment]
    name: str
    # named ``attributes``, not ``attrs``: ``Op.attrs()`` is the method every op answers
    attributes: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        custom_op(self.name)
        keys = [k for k, _ in self.attributes]
        if any(not isinstance(k, str) or not k.isidentifier() for k in keys):
            raise ShapeError(
                f"custom op {self.name!r}: attribute names must be identifiers, got {keys}"
            )
        if len(set(keys)) != len(keys):
            raise ShapeError(f"custom op {self.name!r}: duplicate attribute names in {keys}")
        try:
            hash(self.attributes)
        except TypeError as e:
            raise ShapeError(
                f"custom op {self.name!r}: attribute values must be hashable ({e})"
            ) from None

    @property
    def attr_map(self) -> Mapping[str, Any]:
        """The attributes as a read-only mapping."""
        return MappingProxyType(dict(self.attributes))

    def num_inputs(self) -> int | None:
        return custom_op(self.name).arity

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        entry = custom_op(self.name)
        try:
            out = entry.infer(ins, self.attr_map)
        except RlxError:
            raise
        except Exception as e:
            raise ShapeError(
                f"custom op {self.name!r}: its infer raised {type(e).__name__}: {e}"
            ) from e
        if not isinstance(out, Shape):
            raise ShapeError(
                f"custom op {self.name!r}: infer must return a Shape, returned {out!r}"
            )
        return out

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        try:
            out = np.asarray(custom_op(self.name).reference(xs, self.attr_map, ctx))
        except RlxError:
            raise
        except Exception as e:
            raise RlxError(
                f"custom op {self.name!r}: its reference raised {type(e).__name__}: {e}"
            ) from e
        if tuple(out.shape) != ctx.out_dims:
            raise ShapeError(
                f"custom op {self.name!r}: reference returned shape {tuple(out.shape)} "
                f"but its infer gives {ctx.out_dims}"
            )
        return out

    def attrs_str(self) -> str:
        return ", ".join([f"name={self.name}", *(f"{k}={v!r}" for k, v in self.attributes)])

    def _rule(self, node: Node, which: str) -> Callable[..., Any]:
        fn = getattr(custom_op(self.name), which)
        if fn is None:
            raise AutodiffError(
                f"{node.label}: custom op {self.name!r} was registered without a {which} "
                f"rule (pass {which}= to rlx.register_custom_op), so it is not differentiable",
                node=node.id,
                loc=node.loc,
            )
        return fn

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return tuple(self._rule(node, "vjp")(g, node, ct))

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return self._rule(node, "jvp")(g, node, tangents)


@graph_method
def custom(g: Graph, name: str, inputs: Sequence[NodeId] = (), **attrs: Any) -> NodeId:
    """A node of registered custom op ``name`` over ``inputs`` with keyword attributes."""
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
    return g.apply(Custom(name, items), list(inputs))


# ---- custom_fn: a sub-graph as one op ----------------------------------------------------

PRIMAL_OUTPUT, D_OUTPUT = "primal_output", "d_output"
_IN_NAME = re.compile(r"in(0|[1-9][0-9]*)")


def _check_rule_body(
    op: Op,
    sub: Graph | None,
    role: str,
    operands: Sequence[Shape],
    special: Mapping[str, Shape],
    required: Sequence[str],
    outputs: Sequence[Shape],
) -> None:
    """Check a differentiation-rule body: it reads operand ``k`` as Input ``in<k>`` and
    the values in ``special`` by name (those in ``required`` must be read), holds no
    Params and returns ``outputs``. ShapeError naming ``op``, ``role`` and the culprit."""
    from rlx.ir.mir import Graph
    from rlx.ops.core import Input, Param

    if sub is None:
        return
    expect(isinstance(sub, Graph), op, f"{role} must be a Graph or None, got {type(sub).__name__}")
    seen = set()
    for n in sub.nodes:
        if isinstance(n.op, Param):
            raise ShapeError(f"{op.mnemonic}: {role} holds param {n.op.name!r} (%{n.id})")
        if not isinstance(n.op, Input):
            continue
        name = n.op.name
        seen.add(name)
        m = _IN_NAME.fullmatch(name)
        if m is not None and int(m.group(1)) < len(operands):
            want = operands[int(m.group(1))]
        else:
            expect(
                name in special,
                op,
                f"{role} input {name!r} (%{n.id}) is not one of in0..in{len(operands) - 1}"
                f" or {sorted(special)}",
            )
            want = special[name]
        expect(n.shape == want, op, f"{role} input {name!r} is {n.shape}, expected {want}")
    missing = [r for r in required if r not in seen]
    expect(not missing, op, f"{role} must read Inputs named {missing}")
    got = [sub.nodes[o].shape for o in sub.outputs if 0 <= o < len(sub.nodes)]
    expect(
        got == list(outputs) and len(got) == len(sub.outputs),
        op,
        f"{role} must return [{', '.join(map(str, outputs))}], returns "
        f"[{', '.join(map(str, got))}]",
    )


@register
class CustomFn(Op):
    """A user sub-graph used as one op, with optional custom differentiation rules (the
    seed's ``CustomFn``; JAX's ``custom_vjp`` / ``custom_jvp``). Inputs: ``n_inputs``
    operands; output: ``fwd_body``'s one output.

    * ``fwd_body`` reads operand ``k`` as Input ``in<k>`` (it may leave one unused), holds
      no Params and returns one output: the node's value.
    * ``vjp_body`` (optional) reads the operands as ``in<k>`` plus ``primal_output`` (the
      forward result) and ``d_output`` (its cotangent) and returns one gradient per
      operand, shaped like it.
    * ``jvp_body`` (optional) reads the operands as ``in<k>``, their tangents as
      ``tangent_<k>`` (every one) and optionally ``primal_output``, and returns the
      output's tangent.

    The rules are checked and carried (saved, printed); reverse and forward mode inline
    them (without them, they differentiate an inlined copy of ``fwd_body``). Running the
    node evaluates ``fwd_body`` only."""

    mnemonic: ClassVar[str] = "custom_fn"
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    n_inputs: int
    fwd_body: Graph
    vjp_body: Graph | None = None
    jvp_body: Graph | None = None

    def num_inputs(self) -> int:
        return self.n_inputs

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        n = self.n_inputs
        expect(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0,
            self,
            f"n_inputs must be an int >= 0, got {n!r}",
        )
        check_subgraph(self, self.fwd_body, "fwd_body", ins)
        outs = subgraph_output_shapes(self.fwd_body)
        expect(
            len(outs) == 1,
            self,
            f"fwd_body must return exactly one output, returns {len(outs)} "
            "(build one custom_fn per result)",
        )
        out = outs[0]
        _check_rule_body(
            self,
            self.vjp_body,
            "vjp_body",
            ins,
            {PRIMAL_OUTPUT: out, D_OUTPUT: out},
            (PRIMAL_OUTPUT, D_OUTPUT),
            ins,
        )
        tangents = {f"tangent_{k}": s for k, s in enumerate(ins)}
        _check_rule_body(
            self,
            self.jvp_body,
            "jvp_body",
            ins,
            {**tangents, PRIMAL_OUTPUT: out},
            tuple(tangents),
            (out,),
        )
        return out

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return run_subgraph(self.fwd_body, xs)[0]

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        """``vjp_body`` inlined when given, else reverse mode through an inlined copy of
        ``fwd_body`` (each operand behind its own view, so a repeated operand's partials
        stay apart)."""
        ops = list(node.inputs)
        if self.vjp_body is not None:
            feeds = {**_in_feeds(ops), PRIMAL_OUTPUT: node.id, D_OUTPUT: ct}
            return tuple(inline(g, self.vjp_body, feeds))
        from rlx.autodiff.reverse import backward

        ph = [g.reshape(o, list(g.shape(o).dims)) for o in ops]
        (out,) = inline(g, self.fwd_body, _in_feeds(ph))
        diff = [k for k, o in enumerate(ops) if is_diff_dtype(g.shape(o).dtype)]
        grads = dict(zip(diff, backward(g, {out: ct}, [ph[k] for k in diff]), strict=True))
        return tuple(grads.get(k) for k in range(len(ops)))

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        """``jvp_body`` inlined when given, else forward mode through ``fwd_body``."""
        ops = list(node.inputs)
        if self.jvp_body is not None:
            tans = {
                f"tangent_{k}": zeros_or(g, t, o) for k, (t, o) in enumerate(zip(tangents, ops))
            }
            feeds = {**_in_feeds(ops), **tans, PRIMAL_OUTPUT: node.id}
            return inline(g, self.jvp_body, feeds)[0]
        from rlx.autodiff.forward import forward

        ph = [g.reshape(o, list(g.shape(o).dims)) for o in ops]
        (out,) = inline(g, self.fwd_body, _in_feeds(ph))
        seeds = {p: t for p, t in zip(ph, tangents, strict=True) if t is not None}
        return forward(g, seeds, [out])[out]

    def subgraphs(self) -> tuple[Graph, ...]:
        return tuple(b for b in (self.fwd_body, self.vjp_body, self.jvp_body) if b is not None)

    def attrs_str(self) -> str:
        return (
            f"n_inputs={self.n_inputs}, vjp={self.vjp_body is not None}, "
            f"jvp={self.jvp_body is not None}"
        )


def _in_feeds(ids: Sequence[NodeId]) -> dict[str, NodeId]:
    return {f"in{k}": i for k, i in enumerate(ids)}


def _body(
    role: str, body: Graph | BodyFn | None, shapes: Sequence[Shape], names: Sequence[str]
) -> Graph | None:
    """A body given as a Graph, or built by ``body(g, *input_ids)`` over Inputs ``names``."""
    from rlx.ir.mir import Graph

    if body is None or isinstance(body, Graph):
        return body
    if not callable(body):
        raise ShapeError(f"custom_fn: {role} must be a Graph, a callable or None, got {body!r}")
    g = Graph(f"custom_fn.{role}")
    ids = [g.input(nm, s) for nm, s in zip(names, shapes, strict=True)]
    outs = body(g, *ids)
    g.set_outputs(outs if isinstance(outs, int) else list(outs))
    return g


@graph_method
def custom_fn(
    g: Graph,
    inputs: Sequence[NodeId],
    fwd: Graph | BodyFn,
    vjp: Graph | BodyFn | None = None,
    jvp: Graph | BodyFn | None = None,
) -> NodeId:
    """A :class:`CustomFn` node over ``inputs``. Each body is a Graph following the op's
    Input conventions, or a callable building it: ``fwd(g, *xs)``, ``vjp(g, *xs,
    primal_output, d_output) -> grads`` and ``jvp(g, *xs, *tangents, primal_output)``."""
    ins = [int(i) for i in inputs]
    shapes = [g.shape(i) for i in ins]
    n = len(ins)
    prim = [f"in{k}" for k in range(n)]
    fwd_g = _body("fwd", fwd, shapes, prim)
    if fwd_g is None:
        raise ShapeError("custom_fn: fwd must be a Graph or a callable, got None")
    outs = subgraph_output_shapes(fwd_g)
    if len(outs) != 1:  # the op's shape rule says what is wrong
        return g.apply(CustomFn(n, fwd_g), ins)
    out = outs[0]
    vjp_g = _body("vjp", vjp, [*shapes, out, out], [*prim, PRIMAL_OUTPUT, D_OUTPUT])
    tan = [f"tangent_{k}" for k in range(n)]
    jvp_g = _body("jvp", jvp, [*shapes, *shapes, out], [*prim, *tan, PRIMAL_OUTPUT])
    return g.apply(CustomFn(n, fwd_g, vjp_g, jvp_g), ins)
