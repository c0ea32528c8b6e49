"""CompilePipeline: the one path every ``Session.compile`` takes.

In: a Graph (MIR) or GraphModule (HIR is lowered first), CompileOptions and (for
``freeze_params``) parameter values. Out: a :class:`CompileResult` with the optimized MIR
graph, a :class:`PassRecord` per pass (time, node counts, notes), the fusion report and,
when ``auto_mixed_precision`` ran, its precision report (each node's dtype and why, the
decisions inside control-flow bodies under their parent node).

The default pass list (:func:`default_passes`), in order:

1. cleanup (``options.optimize``): ``dce``, ``cse``, ``constant_folding`` (with
   ``freeze_params``, params given at compile time become constants first), ``simplify``;
2. ``broadcast_legalization`` (always: it is what the elementwise kernels expect);
3. fusion (``options.fuse``): ``fuse_gelu``, ``fuse_layer_norm``, ``fuse_cross_entropy``
   (spelled-out forms -> the op), ``fuse_attention``, ``fuse_swiglu``, ``fuse_residual_norm``,
   ``fuse_quant_epilogue``, ``fuse_conv_act``, ``fuse_matmul_bias_act``, with
   ``options.fuse_blocks`` ``fuse_attention_block`` and ``fuse_transformer_layer``, then ``fuse_elementwise``
   (pattern fusions before regions);
4. precision (a non-f32 ``options.precision``): ``auto_mixed_precision`` then
   ``cast_elimination``;
5. ``nchwc_layout`` (``options.fuse`` and ``options.native``: chains of convs keep their
   activations channel-blocked, ``rlx/passes/layout.py``);
6. ``dce`` again.

With ``options.verify`` EACH_PASS the verifier runs after every pass (tests use it), with
END once at the end. A pass that raises an RlxError (or leaves an invalid graph) becomes
a CompileError naming the pass; passes build new graphs, so the caller's graph is never
touched and no half-compiled graph escapes. ``options.verbose`` (``RLX_VERBOSE=1``)
prints the pass records and the fusion report to stderr.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.errors import CompileError, RlxError, VerifyError
from rlx.ir.mir import Graph
from rlx.options import CompileOptions, VerifyMode
from rlx.passes.base import Pass, PassRecord
from rlx.passes.broadcast import BroadcastLegalization
from rlx.passes.cast_elim import CastElimination
from rlx.passes.cse import CommonSubexpressionElimination
from rlx.passes.dce import DeadCodeElimination
from rlx.passes.fold import ConstantFolding
from rlx.passes.fusion import fusion_passes
from rlx.passes.layout import NchwcLayout
from rlx.passes.precision import AutoMixedPrecision, resolve_policy
from rlx.passes.precision_report import PrecisionReport
from rlx.passes.report import FusionReport, with_provenance
from rlx.passes.simplify import AlgebraicSimplification

__all__ = ["CompilePipeline", "CompileResult", "default_passes", "PASS_NAMES"]

PASS_NAMES: tuple[str, ...] = (
    "dce",
    "cse",
    "constant_folding",
    "simplify",
    "broadcast_legalization",
    "fuse_gelu",
    "fuse_layer_norm",
    "fuse_cross_entropy",
    "fuse_attention",
    "fuse_swiglu",
    "fuse_residual_norm",
    "fuse_quant_epilogue",
    "fuse_conv_act",
    "fuse_matmul_bias_act",
    "fuse_attention_block",
    "fuse_transformer_layer",
    "fuse_elementwise",
    "auto_mixed_precision",
    "cast_elimination",
    "nchwc_layout",
)
"""Names of the built-in passes (what ``CompileOptions.disabled_passes`` may hold)."""


@dataclass
class CompileResult:
    """The optimized graph plus what each pass did. ``dispatch`` is left for the backend
    (which kernel each node got)."""

    graph: Graph
    records: list[PassRecord] = field(default_factory=list)
    fusion_report: FusionReport | None = None
    dispatch: Any = None
    precision_report: PrecisionReport | None = None

    def pass_report(self) -> str:
        """One line per pass: name, time, node counts, notes."""
        return "\n".join(str(r) for r in self.records)

    def report(self) -> str:
        """The pass records followed by the fusion report."""
        parts = ["passes:", self.pass_report()]
        if self.fusion_report is not None:
            parts += ["fusion report:", str(self.fusion_report)]
        if self.precision_report is not None:
            parts += ["precision report:", str(self.precision_report)]
        return "\n".join(parts)

    @property
    def seconds(self) -> float:
        """Total time spent in passes."""
        return sum(r.seconds for r in self.records)


def default_passes(
    options: CompileOptions, params: Mapping[str, np.ndarray] | None = None
) -> list[Pass]:
    """The standard pass list for ``options`` (see the module docstring for the order)."""
    frozen = params if options.freeze_params else None
    passes: list[Pass] = []
    if options.optimize:
        passes += [
            DeadCodeElimination(),
            CommonSubexpressionElimination(),
            ConstantFolding(frozen),
            AlgebraicSimplification(),
        ]
    elif frozen:
        passes.append(ConstantFolding(frozen))
    passes.append(BroadcastLegalization())
    if options.fuse:
        passes += fusion_passes(FusionReport(), options.fuse_blocks)
    policy = resolve_policy(options.precision)
    if not policy.is_f32:
        passes += [AutoMixedPrecision(policy), CastElimination()]
    if options.fuse and options.native:
        passes.append(NchwcLayout())
    passes.append(DeadCodeElimination())
    return passes


class CompilePipeline:
    """Run a list of passes, verifying as ``options.verify`` says and recording each."""

    def __init__(
        self,
        options: CompileOptions | None = None,
        passes: Sequence[Pass] | None = None,
        params: Mapping[str, np.ndarray] | None = None,
    ):
        if options is not None and not isinstance(options, CompileOptions):
            raise CompileError(f"options must be a CompileOptions, got {type(options).__name__}")
        self.options = options or CompileOptions()
        self.passes = list(passes) if passes is not None else default_passes(self.options, params)
        known = set(PASS_NAMES) | {p.name for p in self.passes}
        unknown = [n for n in self.options.disabled_passes if n not in known]
        if unknown:
            raise CompileError(
                f"disabled_passes names unknown passes {unknown}; known: {sorted(known)}"
            )
        reports = [
            p.report  # type: ignore[attr-defined]
            for p in self.passes
            if isinstance(getattr(p, "report", None), FusionReport)
        ]
        self.fusion_report = reports[0] if reports else FusionReport()

    def run(self, graph: Any) -> CompileResult:
        """Compile ``graph``; returns the result or raises CompileError naming the pass."""
        graph = to_mir(graph)
        graph.verify()
        for rep in {
            id(p.report): p.report  # type: ignore[attr-defined]
            for p in self.passes
            if isinstance(getattr(p, "report", None), FusionReport)
        }.values():
            rep.fused.clear()
            rep.missed.clear()
        records: list[PassRecord] = []
        each = self.options.verify is VerifyMode.EACH_PASS
        for p in self.passes:
            if p.name in self.options.disabled_passes:
                continue
            before = len(graph)
            t0 = time.perf_counter()
            try:
                out = p.run(graph)
                if each:
                    out.verify()
            except VerifyError as e:
                raise CompileError(
                    f"pass {p.name!r} produced an invalid graph: {e.bare_message}",
                    node=e.node,
                    loc=e.loc,
                ) from e
            except RlxError as e:
                raise CompileError(
                    f"pass {p.name!r} failed: {e.bare_message}", node=e.node, loc=e.loc
                ) from e
            except Exception as e:
                e.add_note(f"raised inside rlx compile pass {p.name!r}")
                raise
            dt = time.perf_counter() - t0
            graph = out
            records.append(
                PassRecord(p.name, dt, before, len(graph), list(getattr(p, "notes", [])))
            )
        if self.options.verify is VerifyMode.END:
            try:
                graph.verify()
            except VerifyError as e:
                raise CompileError(
                    f"the compiled graph is invalid: {e.bare_message}", node=e.node, loc=e.loc
                ) from e
        amp = [
            p
            for p in self.passes
            if isinstance(p, AutoMixedPrecision) and p.name not in self.options.disabled_passes
        ]
        precision = amp[-1].report if amp else None
        result = CompileResult(graph, records, self.fusion_report, precision_report=precision)
        if self.options.verbose:
            print(result.report(), file=sys.stderr)
        return result


def to_mir(obj: Any) -> Graph:
    """A Graph as is; a GraphModule lowered to its MIR graph. A graph without node
    provenance gets it (a stamped copy, see :func:`~rlx.passes.report.with_provenance`)."""
    if isinstance(obj, Graph):
        return with_provenance(obj)
    into = getattr(obj, "into_graph", None)
    if into is not None:
        return with_provenance(into())
    raise CompileError(f"cannot compile a {type(obj).__name__}; expected a Graph or GraphModule")
