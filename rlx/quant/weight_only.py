"""Weight-only quantization (``rlx.quantize(..., weights_only=True, scheme=...)``).

In: a float graph (or GraphModule), its params and a :class:`~rlx.formats.schemes.QuantScheme`
(Int8Block, Int8BlockAsym, Int4Block, Fp8E4m3, Fp8E5m2 or a GGUF scheme with a packer, see
:mod:`rlx.quant.pack`). Out: a :class:`~rlx.quant.api.QuantizeResult` whose graph has
every eligible ``matmul(x, W)`` (``W`` a 2-D f32 param given in ``params`` or a constant,
K a multiple of the scheme's block) replaced by ``dequant_matmul(x, scheme, packed...)``
with the packed weight as constants (the f32 weight param leaves the graph); bias adds and
activations stay as the ops that followed the matmul (the compile pipeline fuses what it
can). Activations stay f32: no calibration. The CPU kernel (``kernels/quant.py``) reads
the packed bytes directly.

Accuracy is measured as ``rlx.quantize`` does (the report's per-layer ranking is skipped
unless ``rank_layers``): outputs of the compiled quantized graph vs the float graph on the
evaluation batches (``eval_data``, else the first ``eval_batches`` of ``data``; none: the
error is reported as unmeasured). Layers that cannot hold the scheme are kept in float
with the reason. See docs/weight_only.md for the error each scheme's bits explain.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rlx.errors import QuantizationError
from rlx.formats.schemes import QuantScheme
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Constant, ConstValue, Param
from rlx.ops.quant import DequantMatMul
from rlx.options import CompileOptions
from rlx.passes.base import Rewriter
from rlx.passes.pipeline import to_mir
from rlx.quant.layers import check_exclude, find_layers, weight_value
from rlx.quant.pack import can_pack, pack
from rlx.quant.report import measure
from rlx.quant.static import session as new_session
from rlx.shape import Shape

__all__ = ["quantize_weights_only", "weight_only_graph"]


def weight_only_graph(
    graph: Graph,
    params: Mapping[str, np.ndarray],
    scheme: QuantScheme,
    exclude: Iterable[str | int] = (),
) -> tuple[Graph, list[str], dict[str, str], dict[str, str]]:
    """Rewrite ``graph`` (MIR, fused matmuls expanded): returns (new graph, quantized
    layer names, kept-float layer -> reason, layer name -> matmul label)."""
    layers, kept = find_layers(graph, params)
    labels = {ly.name: graph.nodes[ly.node].label for ly in layers}
    excl = check_exclude(graph, layers, exclude)
    packed: dict[NodeId, tuple[np.ndarray, ...]] = {}
    by_weight: dict[NodeId, tuple[np.ndarray, ...]] = {}
    for ly in layers:
        if ly.name in excl or ly.node in excl:
            kept[ly.name] = "excluded by the caller"
            continue
        k = graph.nodes[ly.weight].shape.dims[0]
        why = can_pack(scheme, int(k))  # type: ignore[arg-type]
        if why is not None:
            kept[ly.name] = why
            continue
        if ly.weight not in by_weight:  # a weight shared by several matmuls is packed once
            w = weight_value(graph, ly, params)
            by_weight[ly.weight] = pack(scheme, w.T, ly.name)
        packed[ly.node] = by_weight[ly.weight]
    if not packed:
        return graph, [], kept, labels
    rw = Rewriter(graph)
    consts: dict[NodeId, list[NodeId]] = {}
    folded: set[str] = set()
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        arrays = packed.get(nid)
        if arrays is None:
            rw.copy(node)
            continue
        x, w_id = node.inputs
        if w_id not in consts:
            consts[w_id] = []
            for a in arrays:
                cv = ConstValue.of(a)
                consts[w_id].append(rw.emit(Constant(cv), [], node.loc, Shape(cv.dims, cv.dtype)))
        wop = graph.nodes[w_id].op
        if isinstance(wop, Param):
            folded.add(wop.name)
        rw.map[nid] = rw.emit(DequantMatMul(scheme), [rw.map[x], *consts[w_id]], node.loc)
    out = rw.finish()
    out = _drop_unread_params(out, folded)
    done = [ly.name for ly in layers if ly.node in packed]
    return out, done, kept, labels


def _drop_unread_params(graph: Graph, names: set[str]) -> Graph:
    """Remove the f32 weight params nothing reads any more (packed into constants)."""
    from rlx.passes.dce import DeadCodeElimination

    graph = DeadCodeElimination().run(graph)
    readers = graph.consumers()
    rw = Rewriter(graph)
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        op = node.op
        if isinstance(op, Param) and op.name in names and not readers[nid]:
            if nid not in graph.outputs:
                continue
        rw.copy(node)
    return rw.finish()


def quantize_weights_only(
    graph_or_module: Any,
    data: Iterable[Mapping[str, Any]] | None,
    *,
    params: Mapping[str, Any],
    scheme: QuantScheme | None,
    exclude: Iterable[str | int] = (),
    options: CompileOptions | None = None,
    eval_data: Iterable[Mapping[str, Any]] | None = None,
    eval_batches: int = 4,
    rank_layers: bool = False,
    accuracy_budget: float | None = None,
) -> Any:
    """Pack every eligible matmul weight in ``scheme`` and compile; returns a
    :class:`~rlx.quant.api.QuantizeResult` (``record`` empty: nothing is calibrated).
    ``data``: input dicts; the first ``eval_batches`` measure the error unless
    ``eval_data`` is given (may be None or empty: the error is then unmeasured).
    ``rank_layers``: also measure each layer quantized alone (one compile each).
    ``accuracy_budget`` is not supported here (QuantizationError): use ``exclude``."""
    from rlx.quant.api import QuantizeResult
    from rlx.quant.lower import ExpandFusedMatMuls
    from rlx.quant.report import AccuracyReport, LayerError

    if not isinstance(scheme, QuantScheme):
        raise QuantizationError(
            f"weights_only=True needs scheme= a QuantScheme (e.g. Int8Block(32), Int4Block(32), "
            f"Fp8E4m3(), GgufQ4K()), got {scheme!r}"
        )
    if accuracy_budget is not None:
        raise QuantizationError(
            "accuracy_budget is not supported with weights_only=True; keep layers in float "
            "with exclude= (the report's per-layer ranking, rank_layers=True, says which)"
        )
    graph = ExpandFusedMatMuls().run(to_mir(graph_or_module))
    graph.verify()
    np_params = {k: np.asarray(v) for k, v in params.items()}
    opts = (options or CompileOptions()).replace(use_cache=False)
    low, done, kept, labels = weight_only_graph(graph, np_params, scheme, exclude)
    if not done:
        raise QuantizationError(
            f"graph {graph.name!r} has no matmul that {scheme} can hold (need a 2-D f32 weight "
            f"given in params or as a constant, K a multiple of the block); skipped: "
            f"{kept or 'no matmul at all'}"
        )
    if eval_data is not None:
        evals = [dict(b) for b in eval_data]
    else:
        evals = [dict(b) for b in itertools.islice(data or (), eval_batches)]
    session = new_session()
    float_compiled = session.compile(graph, opts, params=np_params)
    float_outs = [float_compiled.run(b) for b in evals]
    n_out = len(graph.outputs)

    def build(g: Graph) -> Any:
        return session.compile(
            g, opts, params={k: v for k, v in np_params.items() if k in set(g.param_names)}
        )

    compiled = build(low)
    acc = measure(compiled, float_outs, evals, n_out)
    ranking: list[LayerError] = []
    if rank_layers:
        node_of = _layer_nodes(graph, np_params)
        for name in done:
            others = [n for n in done if n != name]
            one, *_ = weight_only_graph(graph, np_params, scheme, others)
            err = measure(build(one), float_outs, evals, n_out).worst()
            ranking.append(LayerError(name, node_of[name], err))
        ranking.sort(key=lambda le: le.error.relative if le.error.measured else -1.0, reverse=True)
    report = AccuracyReport(
        method=f"weights_only {scheme}",
        outputs=acc.stats(),
        output_names=[graph.nodes[o].label for o in graph.outputs],
        layers=ranking,
        quantized=done,
        kept_float=kept,
        eval_batches=len(evals),
        labels=labels,
    )
    return QuantizeResult(compiled, float_compiled, report, low)


def _layer_nodes(graph: Graph, params: Mapping[str, np.ndarray]) -> dict[str, int]:
    return {ly.name: int(ly.node) for ly in find_layers(graph, params)[0]}
