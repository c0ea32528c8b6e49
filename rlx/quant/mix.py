"""Build one quantized variant of a graph from a per-layer choice. In: the (possibly
smoothed) float graph, its params, the layers, their static calibration entries and a
mode per layer name: ``"static"`` (Q/DQ on the activation with calibrated parameters, then
``qmatmul`` / ``qconv2d``), ``"dynamic"`` (``dynamic_qmatmul``: per-row activation scales
at run time) or ``"float"``. Out: the lowered MIR and the params it still reads.

The dynamic matmuls are lowered first (:class:`~rlx.quant.dynamic.DynamicLowering`,
which keeps the old -> new id map), then the static ones get their Q/DQ pairs
(:func:`fake_quant_graph`) and :class:`~rlx.quant.lower.QuantLowering` turns the bracketed
matmuls and convs into integer ops; weight params folded into i8 constants leave the graph.
:func:`meet_budget` searches the per-layer modes for the cheapest mix within an accuracy
budget; :func:`rewrite_layer_edges` is the rewrite loop Q/DQ insertion and QAT share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from rlx.ir.mir import Graph, NodeId
from rlx.ops.qmatmul import ActQuant
from rlx.ops.quant import Dequantize, Quantize
from rlx.passes.base import Rewriter
from rlx.quant.dynamic import DynamicLowering
from rlx.quant.layers import Layer
from rlx.quant.lower import QuantLowering, drop_params
from rlx.quant.products import QuantizeActivationProducts
from rlx.quant.record import CalibrationEntry
from rlx.quant.report import ErrorAccumulator

__all__ = [
    "fake_quant_graph",
    "rewrite_layer_edges",
    "VariantBuilder",
    "MODES",
    "meet_budget",
]

T = TypeVar("T")

#: Per-layer modes, cheapest first (what ``accuracy_budget`` tries in turn).
MODES = ("static", "dynamic", "float")


def fake_quant_graph(
    graph: Graph, entries: Mapping[NodeId, tuple[CalibrationEntry, CalibrationEntry]]
) -> Graph:
    """Q/DQ on the activation and weight edges of the matmuls / convs in ``entries``
    (node id -> (activation entry, weight entry)); other readers of those tensors are
    untouched, a conv's bias input is kept. Nodes with equal activation entries share one
    Q/DQ pair."""
    rw = Rewriter(graph)
    shared: dict[tuple[NodeId, CalibrationEntry], NodeId] = {}

    def qdq(old: NodeId, e: CalibrationEntry) -> NodeId:
        key = (old, e)
        if key not in shared:
            src, loc = rw.map[old], graph.nodes[old].loc  # reports: "quantize for %5 add"
            q = rw.emit(Quantize(e.axis, e.scales, e.zero_points, e.dtype), [src], loc)
            shared[key] = rw.emit(Dequantize(e.axis, e.scales, e.zero_points), [q], loc)
        return shared[key]

    return rewrite_layer_edges(
        graph, rw, entries, lambda a, pair: qdq(a, pair[0]), lambda w, pair: qdq(w, pair[1])
    )


def rewrite_layer_edges(
    graph: Graph,
    rw: Rewriter,
    layers: Mapping[NodeId, T],
    act: Callable[[NodeId, T], NodeId],
    weight: Callable[[NodeId, T], NodeId],
) -> Graph:
    """Copy ``graph`` through ``rw``, each node of ``layers`` (a matmul / conv: node id ->
    what the callbacks need) reading ``act(activation, item)`` and ``weight(weight,
    item)`` (old ids in, new ids out) in place of its first two inputs; its other inputs
    (a conv's bias) are kept. The loop QAT's fake quantizers and PTQ's Q/DQ pairs share."""
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        item = layers.get(nid)
        if item is None:
            rw.copy(node)
            continue
        a, w, *rest = node.inputs
        ins = [act(a, item), weight(w, item), *(rw.map[i] for i in rest)]
        rw.map[nid] = rw.dst.add_node(node.op, ins, node.shape, node.loc)
    return rw.finish()


@dataclass
class VariantBuilder:
    """Lowers ``graph`` for a per-layer mode choice (see the module docstring)."""

    graph: Graph
    params: Mapping[str, np.ndarray]
    layers: Mapping[str, Layer]
    entries: Mapping[str, tuple[CalibrationEntry, CalibrationEntry]]
    dynamic_mode: ActQuant = ActQuant.U8
    per_channel: bool = True
    reduce_range: bool = False
    #: what the last ``lower(..., products=True)`` made integer / left float (label -> how)
    products_done: dict[str, str] = field(default_factory=dict)

    def lower(
        self, modes: Mapping[str, str], products: bool = False
    ) -> tuple[Graph, dict[str, np.ndarray]]:
        """The lowered graph for ``modes`` (layer name -> "static" / "dynamic" / "float";
        layers not named stay float) and the params it reads. ``products``: attention and
        activation x activation products become ``dynamic_qbatch_matmul`` too
        (:mod:`rlx.quant.products`)."""
        dyn = {self.layers[n].node: self.dynamic_mode for n, m in modes.items() if m == "dynamic"}
        g, folded = self.graph, set()
        idmap: dict[NodeId, NodeId] = {n.id: n.id for n in g.nodes}
        if dyn:
            dl = DynamicLowering(self.params, dyn, self.per_channel, self.reduce_range)
            g, idmap, folded = dl.run(g), dl.map, dl.folded
        static = {
            idmap[self.layers[n].node]: self.entries[n] for n, m in modes.items() if m == "static"
        }
        if static:
            low = QuantLowering(self.params, self.per_channel, reduce_range=self.reduce_range)
            g = low.run(fake_quant_graph(g, static))
        if folded:
            g, _ = drop_params(g, folded)
        if products:
            pq = QuantizeActivationProducts()
            g = pq.run(g)
            self.products_done = pq.done
        names = set(g.param_names)
        return g, {k: np.asarray(v) for k, v in self.params.items() if k in names}


def meet_budget(
    modes: dict[str, str],
    order: list[str],
    activations: str,
    budget: float,
    kept_float: dict[str, str],
    builder: VariantBuilder,
    build: Any,
    acc: ErrorAccumulator,
    measure: Any,
    float_variant: tuple[Graph, Any, dict[str, np.ndarray]],
) -> tuple[Graph, Any, dict[str, np.ndarray], ErrorAccumulator] | None:
    """The cheapest mix meeting ``budget`` (relative error), found greedily over the
    layers in ``order`` (worst first), ``modes`` updated in place: (A) static -> dynamic
    one layer at a time (static activations only; convs stay static); (B) if still over,
    layers go float one at a time; (C) the dynamic layers, best first, go back to static
    when the budget still holds. None when the first variant met it already."""
    if acc.worst().relative <= budget:
        return None
    variant: tuple[Graph, Any, dict[str, np.ndarray]] | None = None

    def rebuild() -> tuple[tuple[Graph, Any, dict[str, np.ndarray]], ErrorAccumulator]:
        v = build(modes) if modes else float_variant
        return v, measure(v[1])

    if activations == "static":
        for name in order:
            if modes.get(name) != "static" or builder.layers[name].kind == "conv2d":
                continue
            modes[name] = "dynamic"
            variant, acc = rebuild()
            if acc.worst().relative <= budget:
                break
    for name in order:
        if acc.worst().relative <= budget:
            break
        if name not in modes:
            continue
        del modes[name]
        kept_float[name] = f"kept in float to meet the accuracy budget {budget:g}"
        variant, acc = rebuild()
    if activations == "static":
        for name in reversed(order):
            if modes.get(name) != "dynamic":
                continue
            modes[name] = "static"
            trial, trial_acc = rebuild()
            if trial_acc.worst().relative <= budget:
                variant, acc = trial, trial_acc
            else:
                modes[name] = "dynamic"
    assert variant is not None
    return (*variant, acc)
