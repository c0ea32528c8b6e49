"""Precision policies and the AutoMixedPrecision rewrite pass.

In: a graph whose float values are f32, and a :class:`PrecisionPolicy` mapping op kinds
(``op.kind``, an :class:`~rlx.ops.base.OpKind`) to a :class:`Precision`. Out: the same
computation with each float op's dtype set from the policy and ``cast`` nodes at the
precision boundaries. Backends read each node's dtype to pick a kernel; there is no
session-wide precision flag.

Rules (what the pass changes and what it keeps):

* Inputs, params and outputs stay as they are (f32): a cast follows an input or param
  read by a low-precision op, and a cast back precedes every output that became narrower.
  Casts are de-duplicated: one cast per (value, dtype), shared by all its readers.
* Only nodes whose output is **f32** are retyped. Integer, bool, index, f64, complex and
  already-narrow values keep their dtypes (``argmax``, ``compare``, ``quantize``, a
  gather's indices), and such nodes read their float inputs in the original f32, so an
  f32 -> int conversion or a comparison is never done on rounded values.
* A retyped node reads its f32-born inputs at its own precision; other inputs, and those
  its op lists in ``keep_dtype_inputs`` (attention's mask), as they are. ``cast(x, f32)``
  becomes ``cast(x, low)``. An op whose shape rule rejects the narrow inputs, or that
  fixes its output dtype (``dequantize``), keeps f32; the notes list such nodes.
* Scalar and array constants read at a lower precision are converted at compile time
  (no runtime cast).
* ``elementwise_region`` bodies are rewritten with the same policy (the region's inputs
  arrive at its precision, its output leaves at it), except that an input a body node
  reads at f32 (a comparison, a cast to an integer) arrives as its producer left it, so
  fusion does not make that node read a rounded value.
* Control flow (``if``, ``while``, ``scan``, and ``scan_backward`` / ``scan_backward_xs``,
  a scan's reverse mode) keeps its interface (operands, carries and
  results keep their dtypes: f32 stays f32) and the policy is applied inside each
  sub-graph (branches, cond, body, vjp_body; nested control flow too), each rewritten like a
  top-level graph: a cast follows a sub-graph input a narrow op reads and a cast back to
  f32 precedes each narrowed sub-graph output. So the parent's types do not change and
  loop carries stay f32 from one iteration to the next: a carry is rounded only by the
  body's own narrow ops (then widened exactly), never by an extra cast per iteration. A
  weight passed into a loop as an operand is cast inside the body, so once per iteration.
  The report lists each body's decisions under its node. ``custom_fn`` keeps its
  precision (its body is not rewritten).

Params stay f32, so each run casts the weights a narrow op reads (one cast per weight);
with ``freeze_params`` the weights are constants and are converted once at compile time.

Accuracy (tests/passes/test_precision.py, reference interpreter and compiled CPU path):
max |narrow - f32| / max |f32| over the output stays below 5e-3 for the f16 policies and
3e-2 for bf16 on an MLP and a pre-norm transformer block, and on ``if`` / ``while`` /
``scan`` bodies (an RNN cell, its gradient) in tests/passes/test_precision_control_flow.py.

Reductions under ``AutoMixed``/``AutoMixedBf16`` run in the narrow dtype; their kernels
(and the reference interpreter) accumulate in f32 internally. ``AutoMixedConservative``
keeps them in f32 at the price of a cast before and after each one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import CompileError, RlxError
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.base import Op, OpKind
from rlx.ops.control import If, Scan, While
from rlx.ops.control_grad import ScanBackward, ScanBackwardXs
from rlx.ops.core import Constant, ConstValue, Input
from rlx.ops.elementwise import Cast
from rlx.ops.fused import ElementwiseRegion
from rlx.passes.base import Rewriter
from rlx.passes.dce import DeadCodeElimination
from rlx.passes.precision_report import BodyPrecision, Decision, NodePrecision, PrecisionReport
from rlx.shape import Shape

__all__ = [
    "Precision",
    "CastConfig",
    "PolicyKind",
    "PrecisionPolicy",
    "AutoMixedPrecision",
    "resolve_policy",
]


class Precision(enum.Enum):
    """A numeric precision an op can be run at (the dtypes kernels dispatch on)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"

    @property
    def dtype(self) -> DType:
        return DType(self.value)


@dataclass(frozen=True, slots=True)
class CastConfig:
    """How a value is converted: destination dtype plus (for blocked quantized formats)
    the scaling-factor block and whether scales are rounded to powers of two. The
    precision pass records one per cast it inserts; only ``out_dtype`` is used today."""

    out_dtype: DType
    sf_block: tuple[int, int] | None = None
    round_sf: bool = False

    @staticmethod
    def plain(out_dtype: DType) -> CastConfig:
        """A plain dtype conversion, no scaling factors."""
        return CastConfig(out_dtype)

    def is_noop(self, in_dtype: DType) -> bool:
        """True when converting from ``in_dtype`` does nothing."""
        return self.out_dtype is in_dtype and self.sf_block is None


class PolicyKind(enum.Enum):
    ALWAYS_F32 = "always_f32"
    ALWAYS_F16 = "always_f16"
    AUTO_MIXED_CONSERVATIVE = "auto_mixed_conservative"
    AUTO_MIXED = "auto_mixed"
    AUTO_MIXED_BF16 = "auto_mixed_bf16"
    CUSTOM = "custom"


_P, _K = Precision, OpKind
_TABLES: dict[PolicyKind, dict[OpKind, Precision]] = {
    PolicyKind.ALWAYS_F32: {},
    # every op in f16 (boundaries stay f32)
    PolicyKind.ALWAYS_F16: {
        _K.COMPUTE: _P.F16,
        _K.REDUCTION: _P.F16,
        _K.ELEMENTWISE: _P.F16,
        _K.DATA_MOVEMENT: _P.F16,
    },
    # reductions (norms, softmax) stay f32: the most accurate mix, and the most casts
    PolicyKind.AUTO_MIXED_CONSERVATIVE: {
        _K.COMPUTE: _P.F16,
        _K.REDUCTION: _P.F32,
        _K.ELEMENTWISE: _P.F16,
        _K.DATA_MOVEMENT: _P.F16,
    },
    # reductions run in f16 with f32 accumulation inside the kernel
    PolicyKind.AUTO_MIXED: {
        _K.COMPUTE: _P.F16,
        _K.REDUCTION: _P.F16,
        _K.ELEMENTWISE: _P.F16,
        _K.DATA_MOVEMENT: _P.F16,
    },
    PolicyKind.AUTO_MIXED_BF16: {
        _K.COMPUTE: _P.BF16,
        _K.REDUCTION: _P.BF16,
        _K.ELEMENTWISE: _P.BF16,
        _K.DATA_MOVEMENT: _P.BF16,
    },
}


@dataclass(frozen=True, slots=True)
class PrecisionPolicy:
    """Which precision each op kind runs at. Use the named policies
    (``PrecisionPolicy.AutoMixedBf16``, ...) or ``PrecisionPolicy.Custom({OpKind.COMPUTE:
    Precision.BF16})`` (unlisted kinds stay f32). Boundaries are always f32."""

    kind: PolicyKind = PolicyKind.ALWAYS_F32
    mapping: tuple[tuple[OpKind, Precision], ...] = ()

    AlwaysF32: ClassVar[PrecisionPolicy]
    AlwaysF16: ClassVar[PrecisionPolicy]
    AutoMixedConservative: ClassVar[PrecisionPolicy]
    AutoMixed: ClassVar[PrecisionPolicy]
    AutoMixedBf16: ClassVar[PrecisionPolicy]

    @staticmethod
    def Custom(mapping: Mapping[OpKind, Precision]) -> PrecisionPolicy:  # noqa: N802 - named like the seed's variant
        """A policy from an explicit op-kind -> precision mapping."""
        for k, v in mapping.items():
            if not isinstance(k, OpKind):
                raise CompileError(
                    f"PrecisionPolicy.Custom: key {k!r} is not an OpKind; expected one of "
                    f"{[o.name for o in OpKind]}"
                )
            if not isinstance(v, Precision):
                raise CompileError(
                    f"PrecisionPolicy.Custom: value {v!r} for {k.name} is not a Precision; "
                    f"expected one of {[p.name for p in Precision]}"
                )
        order = list(OpKind)
        items = tuple(sorted(mapping.items(), key=lambda kv: order.index(kv[0])))
        return PrecisionPolicy(PolicyKind.CUSTOM, items)

    def precision_for(self, kind: OpKind) -> Precision:
        """The precision ops of ``kind`` run at (BOUNDARY is always F32)."""
        if kind is OpKind.BOUNDARY:
            return Precision.F32
        table = dict(self.mapping) if self.kind is PolicyKind.CUSTOM else _TABLES[self.kind]
        return table.get(kind, Precision.F32)

    @property
    def is_f32(self) -> bool:
        """True when every op kind stays f32 (the pass has nothing to do)."""
        return all(self.precision_for(k) is Precision.F32 for k in OpKind)

    def __str__(self) -> str:
        if self.kind is PolicyKind.CUSTOM:
            return "custom(" + ", ".join(f"{k.value}={v.value}" for k, v in self.mapping) + ")"
        return self.kind.value


PrecisionPolicy.AlwaysF32 = PrecisionPolicy(PolicyKind.ALWAYS_F32)
PrecisionPolicy.AlwaysF16 = PrecisionPolicy(PolicyKind.ALWAYS_F16)
PrecisionPolicy.AutoMixedConservative = PrecisionPolicy(PolicyKind.AUTO_MIXED_CONSERVATIVE)
PrecisionPolicy.AutoMixed = PrecisionPolicy(PolicyKind.AUTO_MIXED)
PrecisionPolicy.AutoMixedBf16 = PrecisionPolicy(PolicyKind.AUTO_MIXED_BF16)


def resolve_policy(value: object) -> PrecisionPolicy:
    """``CompileOptions.precision`` as a policy: None means AlwaysF32."""
    if value is None:
        return PrecisionPolicy.AlwaysF32
    if isinstance(value, PrecisionPolicy):
        return value
    names = [
        "AlwaysF32",
        "AlwaysF16",
        "AutoMixedConservative",
        "AutoMixed",
        "AutoMixedBf16",
        "Custom(...)",
    ]
    raise CompileError(
        f"options.precision must be a PrecisionPolicy (PrecisionPolicy.{', PrecisionPolicy.'.join(names)}) "
        f"or None, got {value!r}"
    )


# the sub-graph fields of the control-flow ops whose bodies the policy is applied to
_CONTROL: dict[type[Op], tuple[str, ...]] = {
    If: ("then_branch", "else_branch"),
    While: ("cond", "body"),
    Scan: ("body",),
    ScanBackward: ("vjp_body",),  # a scan's reverse mode: one step of the body's vjp
    ScanBackwardXs: ("vjp_body",),
}


class _Convert:
    """One graph's rewrite (the pass recurses into sub-graphs with one per sub-graph)."""

    def __init__(self, amp: AutoMixedPrecision, src: Graph, feeds: Mapping[str, DType]):
        self.amp = amp
        self.src = src
        self.feeds = feeds
        self.rw = Rewriter(src)
        self.cache: dict[tuple[NodeId, DType], NodeId] = {}
        # fed Inputs a node read at f32 although they were fed narrower (regions only)
        self.upcast: set[str] = set()
        self.decisions: list[NodePrecision] = []
        self.casts = 0  # runtime casts inserted in this graph
        self.region_body: BodyPrecision | None = None  # of the last region retargeted

    def fetch(self, old: NodeId, want: DType) -> NodeId:
        """The new id of ``old``'s value at dtype ``want`` (cast or converted constant)."""
        x = self.rw.map[old]
        shape = self.rw.new_shape(x)
        if shape.dtype is want:
            return x
        op = self.src.nodes[old].op
        if want is DType.F32 and isinstance(op, Input) and op.name in self.feeds:
            self.upcast.add(op.name)
        key = (x, want)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        src = self.rw.dst.nodes[x]
        if isinstance(src.op, Constant):
            with np.errstate(all="ignore"):
                arr = Cast(want).reference([src.op.value.array()], None)  # type: ignore[arg-type]
            new = self.rw.emit(
                Constant(ConstValue.of(arr, want)), [], src.loc, shape.with_dtype(want)
            )
            self.amp.constants_converted += 1
        else:
            new = self.rw.emit(Cast(want), [x], src.loc, shape.with_dtype(want))
            self.amp.cast_sites.append((new, CastConfig.plain(want)))
            self.casts += 1
        self.cache[key] = new
        return new

    def run(self, out_dtype: DType | None) -> Graph:
        for nid in self.src.topo_order():
            node = self.src.nodes[nid]
            if not node.inputs:
                self._boundary(node)
            else:
                self._node(node)
        outs = []
        for o in self.src.outputs:
            outs.append(self.fetch(o, out_dtype or self.src.nodes[o].dtype))
        self.rw.dst.outputs = outs
        return self.rw.dst

    def body(self, role: str) -> BodyPrecision:
        """This (sub-)graph's decisions, as the body ``role`` of its parent."""
        return BodyPrecision(role, self.src.name, tuple(self.decisions), self.casts)

    def _boundary(self, node: Node) -> None:
        op = node.op
        if (
            isinstance(op, Input)
            and op.name in self.feeds
            and self.feeds[op.name] is not node.dtype
        ):
            shape = node.shape.with_dtype(self.feeds[op.name])
            self.rw.map[node.id] = self.rw.emit(Input(op.name, shape), [], node.loc, shape)
        else:
            self.rw.copy(node)

    def _target(self, node: Node) -> DType | None:
        if node.dtype is not DType.F32:
            return None
        if node.op.subgraphs() and not isinstance(node.op, ElementwiseRegion):
            return None
        p = self.amp.policy.precision_for(node.op.kind)
        return None if p is Precision.F32 else p.dtype

    def _decide(
        self,
        node: Node,
        decision: Decision,
        reason: str = "",
        bodies: tuple[BodyPrecision, ...] = (),
    ) -> None:
        loc = node.loc
        uid = loc.node if loc is not None and loc.node is not None else node.id
        dtype = self.rw.new_shape(self.rw.map[node.id]).dtype
        self.decisions.append(
            NodePrecision(uid, node.label, node.op.kind, dtype, decision, reason, bodies)
        )

    def _node(self, node: Node) -> None:
        if type(node.op) in _CONTROL:
            self._control(node)
            return
        target = self._target(node)
        reason = ""
        if target is not None:
            rejected = self._narrow(node, target)
            if rejected is None:
                return
            reason = rejected
        orig = [self.src.nodes[i].dtype for i in node.inputs]
        ins = [self.fetch(i, d) for i, d in zip(node.inputs, orig, strict=True)]
        self.rw.map[node.id] = self._emit(node.op, ins, node, node.shape)
        if target is not None:
            self._decide(node, Decision.KEPT_F32, reason)
        elif node.dtype is not DType.F32:
            self._decide(node, Decision.NOT_F32)
        elif self.amp.policy.precision_for(node.op.kind) is Precision.F32:
            self._decide(node, Decision.POLICY_F32)
        else:  # a sub-graph op the pass does not enter (custom_fn)
            self._decide(node, Decision.KEPT_F32, "its sub-graph is not rewritten")

    def _narrow(self, node: Node, target: DType) -> str | None:
        """Emit ``node`` at ``target`` and return None, or return why its op rejects the
        narrow inputs (the caller then emits it unchanged)."""
        orig = [self.src.nodes[i].dtype for i in node.inputs]
        keep = node.op.keep_dtype_inputs
        wants = [target if d is DType.F32 and i not in keep else d for i, d in enumerate(orig)]
        if isinstance(node.op, ElementwiseRegion):
            wants = self._region_wants(node, target, wants)
        shapes = tuple(
            self.rw.new_shape(self.rw.map[i]).with_dtype(w)
            for i, w in zip(node.inputs, wants, strict=True)
        )
        self.region_body = None
        op = self._retarget(node.op, target, [s.dtype for s in shapes])
        try:
            shape = op.infer(shapes)
        except RlxError as e:
            self.amp.kept.append(f"{node.label}: {e.bare_message}")
            return e.bare_message
        why, decision = "", Decision.NARROWED
        if shape.dtype is not target:
            why, decision = f"produces {shape.dtype} for {target} inputs", Decision.KEPT_F32
            self.amp.kept.append(f"{node.label}: {why}")
        else:
            self.amp.retyped += 1
        ins = [self.fetch(i, w) for i, w in zip(node.inputs, wants, strict=True)]
        self.rw.map[node.id] = self._emit(op, ins, node, shape)
        body = self.region_body
        self._decide(node, decision, why, () if body is None else (body,))
        return None

    def _control(self, node: Node) -> None:
        """An ``if`` / ``while`` / ``scan``: each sub-graph rewritten with the policy, its
        inputs and outputs (the operands, carries and results) kept at their dtypes."""
        op = node.op
        subs: dict[str, Graph] = {}
        bodies = []
        for role in _CONTROL[type(op)]:
            conv = _Convert(self.amp, getattr(op, role), {})
            subs[role] = DeadCodeElimination().run(conv.run(None))  # converted constants
            bodies.append(conv.body(role))
        new = replace(op, **subs)  # type: ignore[type-var]
        ins = [self.fetch(i, self.src.nodes[i].dtype) for i in node.inputs]
        self.rw.map[node.id] = self.rw.emit(new, ins, node.loc, node.shape)
        self._decide(node, Decision.SUBGRAPHS, "interface kept", tuple(bodies))

    def _region_wants(self, node: Node, target: DType, wants: list[DType]) -> list[DType]:
        """The dtypes a region's inputs are fed at: ``wants``, except that an input a body
        node reads at f32 (a comparison, a cast to an integer, an op the policy keeps f32)
        arrives as its producer left it. The body then casts it for its narrow readers and
        the f32 reader sees the value it would see unfused, not one rounded to ``target``.
        Found by converting the body once with a scratch pass (its counts discarded)."""
        feeds = {f"in{k}": w for k, w in enumerate(wants)}
        trial = _Convert(AutoMixedPrecision(self.amp.policy), node.op.body, feeds)  # type: ignore[attr-defined]
        trial.run(target)
        out = list(wants)
        for k, i in enumerate(node.inputs):
            if f"in{k}" in trial.upcast:
                out[k] = self.rw.new_shape(self.rw.map[i]).dtype
        return out

    def _emit(self, op: Op, ins: list[NodeId], node: Node, shape: Shape) -> NodeId:
        """Emit ``op``; a user's cast shares the pass's cast cache (no duplicates, and a
        cast that became a no-op disappears)."""
        if not isinstance(op, Cast):
            return self.rw.emit(op, ins, node.loc, shape)
        if self.rw.new_shape(ins[0]).dtype is op.to:
            return ins[0]
        key = (ins[0], op.to)
        if key not in self.cache:
            self.cache[key] = self.rw.emit(op, ins, node.loc, shape)
        return self.cache[key]

    def _retarget(self, op: Op, target: DType, in_dtypes: list[DType]) -> Op:
        if isinstance(op, Cast) and op.to is DType.F32:
            return Cast(target)
        if isinstance(op, ElementwiseRegion):
            feeds = {f"in{k}": d for k, d in enumerate(in_dtypes)}
            conv = _Convert(self.amp, op.body, feeds)
            body = DeadCodeElimination().run(conv.run(target))
            self.region_body = conv.body("body")
            return replace(op, body=body)
        return op


class AutoMixedPrecision:
    """Rewrite node dtypes per a :class:`PrecisionPolicy` and insert boundary casts.

    After ``run``: ``casts_inserted`` (runtime casts added, sub-graphs included),
    ``cast_sites`` ((new cast id, CastConfig) per cast; ids in a sub-graph are ids of
    that sub-graph), ``constants_converted``, ``retyped`` (nodes now narrow), ``kept``
    (f32 nodes the policy wanted narrow, with the reason) and ``report`` (the
    :class:`~rlx.passes.precision_report.PrecisionReport`: each node's decision, those of
    control-flow bodies under their parent node)."""

    name = "auto_mixed_precision"

    def __init__(self, policy: PrecisionPolicy | None = None):
        self.policy = resolve_policy(policy)
        self.notes: list[str] = []
        self.cast_sites: list[tuple[NodeId, CastConfig]] = []
        self.constants_converted = 0
        self.retyped = 0
        self.kept: list[str] = []
        self.report = PrecisionReport(self.policy)

    @property
    def casts_inserted(self) -> int:
        return len(self.cast_sites)

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        self.cast_sites = []
        self.constants_converted = 0
        self.retyped = 0
        self.kept = []
        self.report = PrecisionReport(self.policy)
        if self.policy.is_f32:
            self.notes.append(f"policy {self.policy}: nothing to do")
            return graph
        conv = _Convert(self, graph, {})
        out = conv.run(None)
        self.report = PrecisionReport(self.policy, tuple(conv.decisions), conv.casts)
        self.notes.append(
            f"policy {self.policy}: {self.retyped} nodes narrowed, {self.casts_inserted} casts "
            f"inserted, {self.constants_converted} constants converted"
        )
        if self.kept:
            self.notes.append("kept f32: " + "; ".join(self.kept))
        return out
