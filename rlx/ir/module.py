"""GraphModule: one model object that knows which IR stage it holds.

In: a HIR build function (``GraphModule.define``), an empty HIR or MIR module, a MIR
Graph, a HirModule or an LirModule. Out: the same model at a later stage (``lower()``
gives MIR, ``into_graph()`` the MIR Graph). Stages::

    HIR  (HirModule: blocks)  --lower()-->  MIR (Graph)  --planner-->  LIR (LirModule)

HIR builder methods (``input``, ``param``, ``linear``, ``attention``, ...) are forwarded
to the HirModule at HIR stage; ``input`` and ``param`` also build MIR nodes at MIR stage.
At MIR stage every other ``Graph`` method is reachable from the module too, as the seed's
``Deref<Target = Graph>`` makes it (``mm = GraphModule.mir("m"); y = mm.matmul(x, w)``):
builders (``matmul``, ``add``, ``apply``, ...) at MIR stage only, queries (``nodes``,
``find``, ``shape``, ...) at MIR and LIR stage. The seed's other names map one to one:
``from_mir``, ``block``, ``set_hir_outputs``, ``finish_hir``, ``into_hir``, ``into_mir``,
``into_lir``, ``as_mir``. Calling a method at a stage that does not support it raises
StageError saying which stage is needed and how to get there (the Rust original panics).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from rlx.errors import StageError
from rlx.ir.hir import FusionPolicy, HirModule, HirNodeId
from rlx.ir.mir import Graph

T = TypeVar("T")

# Graph methods that add nodes or change outputs (besides the builders attached by the op
# modules with @graph_method, recognised by their module): refused at LIR stage.
_GRAPH_MUTATORS = frozenset({"apply", "add_node", "set_outputs", "sym", "input", "param"})
# Graph instance attributes (not on the class) reachable the same way.
_GRAPH_FIELDS = frozenset({"nodes", "outputs", "sym_bounds"})


def _is_graph_builder(name: str) -> bool:
    """Whether ``Graph.<name>`` adds nodes (a @graph_method builder or a mutator)."""
    attr = getattr(Graph, name, None)
    if name in _GRAPH_MUTATORS:
        return True
    return callable(attr) and getattr(attr, "__module__", "rlx.ir.mir") != "rlx.ir.mir"


__all__ = ["GraphModule", "GraphStage"]


class GraphStage(enum.Enum):
    """Which stage of HIR -> MIR -> LIR a GraphModule holds."""

    HIR = "hir"
    MIR = "mir"
    LIR = "lir"


# HirModule builders forwarded by GraphModule at HIR stage (input/param are handled
# separately because they also work at MIR stage; the escape hatch HirModule.mir is
# GraphModule.hir_mir, since GraphModule.mir is the MIR-stage constructor)
_HIR_BUILDERS = (
    "constant",
    "linear",
    "linear_fused",
    "shared_linear_pair",
    "swiglu_ffn",
    "residual_rms_norm",
    "rms_norm",
    "attention",
    "depthwise_conv1d_causal",
    "dequant_matmul",
    "gated_delta_net",
    "gated_delta_net_carry",
    "rope",
    "named",
)


def _is_lir(obj: Any) -> bool:
    """Duck typing for rlx.ir.lir.LirModule: a MIR graph plus a buffer plan."""
    return isinstance(getattr(obj, "graph", None), Graph) and hasattr(obj, "plan")


class GraphModule:
    """A model at the HIR, MIR or LIR stage. Build with :meth:`define`, :meth:`hir`,
    :meth:`mir`, :meth:`from_graph` / :meth:`from_mir`, :meth:`from_hir` or
    :meth:`from_lir`. At MIR stage the Graph's own methods are reachable from the module
    (``mm.matmul(x, w)``; see the module docstring)."""

    __slots__ = ("_value",)

    def __init__(self, value: HirModule | Graph | Any):
        if not isinstance(value, (HirModule, Graph)) and not _is_lir(value):
            raise StageError(
                f"GraphModule holds a HirModule, a Graph or an LirModule, "
                f"got {type(value).__name__}"
            )
        self._value = value

    # ---- constructors -----------------------------------------------------------------

    @classmethod
    def define(
        cls,
        name: str,
        build: Callable[[HirModule], HirNodeId | Iterable[HirNodeId]],
        policy: FusionPolicy = FusionPolicy.DIRECT,
    ) -> GraphModule:
        """A HIR-stage module built by ``build(hir)``, whose return value (a node id or
        several) becomes the outputs."""
        hir = HirModule(name, policy)
        out = build(hir)
        if out is None:
            raise StageError(
                f"GraphModule.define({name!r}): the build function returned None; "
                "return the output node id (or a tuple of them)"
            )
        hir.set_outputs(out)
        return cls(hir)

    @classmethod
    def hir(cls, name: str, policy: FusionPolicy = FusionPolicy.DIRECT) -> GraphModule:
        """An empty HIR-stage module."""
        return cls(HirModule(name, policy))

    @classmethod
    def mir(cls, name: str) -> GraphModule:
        """An empty MIR-stage module (build it with the Graph methods on ``as_graph()``)."""
        return cls(Graph(name))

    @classmethod
    def from_graph(cls, graph: Graph) -> GraphModule:
        """A MIR-stage module around ``graph``."""
        if not isinstance(graph, Graph):
            raise StageError(f"from_graph needs a Graph, got {type(graph).__name__}")
        return cls(graph)

    @classmethod
    def from_mir(cls, mir: Graph) -> GraphModule:
        """A MIR-stage module around ``mir`` (the seed's ``MirModule`` is rlx's Graph; the
        same as :meth:`from_graph`)."""
        if not isinstance(mir, Graph):
            raise StageError(f"from_mir needs a MIR Graph, got {type(mir).__name__}")
        return cls(mir)

    @staticmethod
    def block(hir: HirModule | GraphModule, name: str, build: Callable[[HirModule], T]) -> T:
        """Run ``build(hir)`` inside the name scope ``name`` (params built there are named
        ``<name>.<param>``) and return what it returns, as ``HirModule.named`` does.
        ``hir`` is a HirModule or a HIR-stage GraphModule."""
        if isinstance(hir, GraphModule):
            hir = hir._require(GraphStage.HIR, "block()")
        if not isinstance(hir, HirModule):
            raise StageError(
                f"GraphModule.block needs a HirModule or a HIR-stage GraphModule, "
                f"got {type(hir).__name__}"
            )
        return hir.named(name, build)

    @classmethod
    def from_hir(cls, hir: HirModule) -> GraphModule:
        """A HIR-stage module around ``hir``."""
        if not isinstance(hir, HirModule):
            raise StageError(f"from_hir needs a HirModule, got {type(hir).__name__}")
        return cls(hir)

    @classmethod
    def from_lir(cls, lir: Any) -> GraphModule:
        """An LIR-stage module around ``lir`` (a MIR graph plus its buffer plan)."""
        if not _is_lir(lir):
            raise StageError(
                f"from_lir needs an LirModule (with .graph and .plan), got {type(lir).__name__}"
            )
        return cls(lir)

    # ---- stage --------------------------------------------------------------------------

    @property
    def stage(self) -> GraphStage:
        if isinstance(self._value, HirModule):
            return GraphStage.HIR
        if isinstance(self._value, Graph):
            return GraphStage.MIR
        return GraphStage.LIR

    @property
    def name(self) -> str:
        v = self._value
        return v.name if isinstance(v, HirModule | Graph) else v.graph.name

    @property
    def fusion_policy(self) -> FusionPolicy | None:
        """The HIR lowering policy, None past HIR stage."""
        return self._value.fusion_policy if isinstance(self._value, HirModule) else None

    def with_fusion_policy(self, policy: FusionPolicy) -> GraphModule:
        """Set the policy :meth:`lower` uses; HIR stage only. Returns self."""
        self._require(GraphStage.HIR, "with_fusion_policy").with_fusion_policy(policy)
        return self

    def _require(self, stage: GraphStage, what: str) -> Any:
        if self.stage is not stage:
            how = {
                GraphStage.HIR: "build it with GraphModule.define() or GraphModule.hir()",
                GraphStage.MIR: "call lower() first",
                GraphStage.LIR: "plan it with the CPU backend first",
            }[stage]
            raise StageError(
                f"GraphModule {self.name!r}: {what} needs {stage.name} stage but the module "
                f"is at {self.stage.name} stage ({how})"
            )
        return self._value

    # ---- transitions ---------------------------------------------------------------------

    def lower(self, policy: FusionPolicy | None = None) -> GraphModule:
        """A new module at MIR stage (LowerError on failure); MIR and LIR modules are
        returned as they are."""
        if isinstance(self._value, HirModule):
            return GraphModule(self._value.lower_to_mir(policy))
        return self

    def into_hir(self) -> HirModule | None:
        """The HirModule at HIR stage, else None (the seed's ``into_hir``)."""
        return self.as_hir()

    def into_lir(self) -> Any | None:
        """The LirModule at LIR stage, else None (the seed's ``into_lir``)."""
        return self.as_lir()

    def as_mir(self) -> Graph | None:
        """The MIR graph at MIR stage, the planned graph at LIR stage, None at HIR stage
        (no lowering; the seed's ``as_mir``, the same as :meth:`as_graph`)."""
        return self.as_graph()

    def into_graph(self) -> Graph:
        """The MIR graph: lowered from HIR, as is at MIR, the planned graph at LIR."""
        if isinstance(self._value, HirModule):
            return self._value.lower_to_mir()
        if isinstance(self._value, Graph):
            return self._value
        return self._value.graph

    into_mir = into_graph

    def as_hir(self) -> HirModule | None:
        """The HirModule at HIR stage, else None."""
        return self._value if isinstance(self._value, HirModule) else None

    def as_graph(self) -> Graph | None:
        """The MIR graph at MIR or LIR stage, else None (no lowering)."""
        if isinstance(self._value, HirModule):
            return None
        return self._value if isinstance(self._value, Graph) else self._value.graph

    def as_lir(self) -> Any | None:
        """The LirModule at LIR stage, else None."""
        return self._value if self.stage is GraphStage.LIR else None

    # ---- building ------------------------------------------------------------------------

    def input(self, name: str, shape: Any, dtype: Any = None) -> int:
        """A named input: a HIR node at HIR stage, a MIR node at MIR stage."""
        return self._leaf("input", name, shape, dtype)

    def param(self, name: str, shape: Any, dtype: Any = None) -> int:
        """A named parameter: a HIR node at HIR stage, a MIR node at MIR stage."""
        return self._leaf("param", name, shape, dtype)

    def _leaf(self, what: str, name: str, shape: Any, dtype: Any) -> int:
        if self.stage is GraphStage.LIR:
            raise StageError(
                f"GraphModule {self.name!r}: {what} cannot add nodes at LIR stage (the "
                "buffer plan is fixed); build at HIR or MIR stage"
            )
        return getattr(self._value, what)(name, shape, dtype)

    def set_outputs(self, outputs: Iterable[int] | int) -> None:
        """Declare the outputs at the current stage (HIR ids at HIR, MIR ids at MIR)."""
        if self.stage is GraphStage.LIR:
            raise StageError(
                f"GraphModule {self.name!r}: set_outputs at LIR stage would invalidate the "
                "buffer plan; set outputs before planning"
            )
        self._value.set_outputs(outputs)

    def set_hir_outputs(self, outputs: Iterable[HirNodeId] | HirNodeId) -> None:
        """Declare the HIR outputs (node ids or one id); HIR stage only."""
        self._require(GraphStage.HIR, "set_hir_outputs").set_outputs(outputs)

    def finish_hir(self, output: Iterable[HirNodeId] | HirNodeId) -> GraphModule:
        """Set the HIR output(s) and return self, to end a builder chain; HIR stage only."""
        self.set_hir_outputs(output)
        return self

    def hir_mir(self, op: Any, inputs: Iterable[int] = (), out_shape: Any = None) -> int:
        """HIR escape hatch: one MIR op as a HIR node (``HirModule.mir``); HIR stage only."""
        hir = self._require(GraphStage.HIR, "the HIR builder hir_mir()")
        return hir.mir(op, list(inputs), out_shape)

    # ---- looking -------------------------------------------------------------------------

    def __len__(self) -> int:
        v = self._value
        return len(v) if isinstance(v, HirModule | Graph) else len(v.graph)

    def inspect(self) -> str:
        """HIR listing at HIR, the graph listing at MIR, the plan-annotated listing at LIR."""
        v = self._value
        if isinstance(v, HirModule | Graph):  # not LIR stage
            return v.inspect()
        own = getattr(v, "inspect", None)
        if callable(own):
            return own()
        return f"{v.graph.inspect()}\n# plan: {v.plan}"

    def __str__(self) -> str:
        return self.inspect()

    def to_html(self, path: str | None = None, **kw: Any) -> str:
        """The HTML page of the MIR graph (lowered from HIR first; at LIR with its own
        plan); see :meth:`rlx.ir.mir.Graph.to_html`."""
        from rlx.viz import graph_to_html

        return graph_to_html(self, path, **kw)

    # ---- the MIR graph's own methods (the seed's Deref<Target = Graph>) --------------

    if TYPE_CHECKING:
        # Graph builders and queries (mm.matmul, mm.add, mm.find, ...) resolve at run time.
        def __getattr__(self, name: str) -> Any: ...

    else:

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_") or not (hasattr(Graph, name) or name in _GRAPH_FIELDS):
                raise AttributeError(f"'GraphModule' object has no attribute {name!r}")
            stage = self.stage
            builder = _is_graph_builder(name)
            if stage is GraphStage.HIR:
                raise StageError(
                    f"GraphModule {self.name!r}: the Graph method {name}() needs MIR stage but "
                    "the module is at HIR stage (call lower() first, or use the HIR builders)"
                )
            if stage is GraphStage.LIR and builder:
                raise StageError(
                    f"GraphModule {self.name!r}: the Graph builder {name}() cannot add nodes "
                    "at LIR stage (the buffer plan is fixed); build at MIR stage"
                )
            return getattr(self.as_graph(), name)

    def __dir__(self) -> list[str]:
        names = set(super().__dir__())
        if self.stage is GraphStage.MIR:
            names |= {n for n in dir(Graph) if not n.startswith("_")} | _GRAPH_FIELDS
        elif self.stage is GraphStage.LIR:
            names |= _GRAPH_FIELDS | {
                n for n in dir(Graph) if not n.startswith("_") and not _is_graph_builder(n)
            }
        return sorted(names)

    def __repr__(self) -> str:
        return f"<GraphModule {self.name!r} stage={self.stage.name} nodes={len(self)}>"


def _forward(name: str) -> Callable[..., Any]:
    """A GraphModule method calling ``HirModule.<name>`` at HIR stage, StageError else."""
    target = getattr(HirModule, name)

    @functools.wraps(target)
    def method(self: GraphModule, *args: Any, **kwargs: Any) -> Any:
        hir = self._require(GraphStage.HIR, f"the HIR builder {name}()")
        return getattr(hir, name)(*args, **kwargs)

    return method


for _name in _HIR_BUILDERS:
    setattr(GraphModule, _name, _forward(_name))
