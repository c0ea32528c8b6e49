"""The quantizable layers of a graph. In: a MIR graph (fused matmuls expanded) and its
float params. Out: :class:`Layer` records (a ``matmul`` whose right operand is a static 2-D
f32 weight known now, or a 2-D ``conv`` with a known weight), the skipped ones with the
reason, weight values, the tensor names errors and reports use, and
:func:`canonical_weights`, which turns ``matmul(x, transpose(W))`` and weight-shaped
``dot_general`` into such matmuls first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlx.dtype import DType
from rlx.errors import QuantizationError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Constant, ConstValue, Input, Param
from rlx.ops.linalg import DotGeneral, MatMul
from rlx.ops.movement import Transpose
from rlx.ops.nn import Attention, Conv
from rlx.passes.base import Rewriter
from rlx.passes.dce import DeadCodeElimination
from rlx.shape import Shape

__all__ = [
    "Layer",
    "check_exclude",
    "find_layers",
    "find_conv_layers",
    "weight_value",
    "check_weights",
    "tensor_name",
    "canonical_weights",
    "float_products",
]


@dataclass(frozen=True, slots=True)
class Layer:
    """A quantizable matmul: ``node`` = matmul(``act``, ``weight``) (or, with ``kind``
    "conv2d", a 2-D conv reading ``act`` with the weight ``[O, C/g, kH, kW]``)."""

    name: str
    node: NodeId
    act: NodeId
    weight: NodeId
    kind: str = "matmul"


def find_layers(
    graph: Graph, params: Mapping[str, np.ndarray]
) -> tuple[list[Layer], dict[str, str]]:
    """The quantizable matmuls of ``graph``, and the skipped ones with the reason."""
    layers: list[Layer] = []
    skipped: dict[str, str] = {}
    for node in graph.find(MatMul):
        a, w = node.inputs
        wn = graph.nodes[w]
        # reports name the matmul by the user's graph: "%19 matmul (model.py:42)"
        mm = node.label
        ref = mm.split(" ", 1)[0] if mm.startswith("%") else f"#{node.id}"
        name = wn.op.name if isinstance(wn.op, Param) else ref  # type: ignore[attr-defined]
        if wn.shape.rank != 2 or not wn.shape.is_static:
            skipped[name] = f"{mm}: rhs {wn.shape} is not a static 2-D weight"
        elif node.dtype is not DType.F32 or graph.nodes[a].dtype is not DType.F32:
            skipped[name] = f"{mm}: not f32 ({graph.nodes[a].shape} @ {wn.shape})"
        elif isinstance(wn.op, Param) and wn.op.name not in params:
            skipped[name] = f"{mm}: weight param {wn.op.name!r} was not given in params"
        elif not isinstance(wn.op, (Param, Constant)):
            skipped[name] = f"{mm}: rhs is computed ({wn.op.mnemonic}), not a weight"
        else:
            layers.append(Layer(name, node.id, a, w))
    return layers, skipped


def find_conv_layers(
    graph: Graph, params: Mapping[str, np.ndarray]
) -> tuple[list[Layer], dict[str, str]]:
    """The 2-D f32 convs whose weight is known now (a param in ``params`` or a constant),
    and the skipped ones with the reason (``QConv2d`` candidates)."""
    layers: list[Layer] = []
    skipped: dict[str, str] = {}
    for node in graph.find(Conv):
        a, w = node.inputs[:2]
        wn = graph.nodes[w]
        name = wn.op.name if isinstance(wn.op, Param) else f"#{node.id}"  # type: ignore[attr-defined]
        if len(node.op.stride) != 2:  # type: ignore[attr-defined]
            skipped[name] = f"{node.label}: not a 2-D conv (qconv2d is 2-D)"
        elif node.dtype is not DType.F32 or not wn.shape.is_static:
            skipped[name] = f"{node.label}: not an f32 conv with a static weight"
        elif isinstance(wn.op, Param) and wn.op.name not in params:
            skipped[name] = f"{node.label}: weight param {wn.op.name!r} was not given in params"
        elif not isinstance(wn.op, (Param, Constant)):
            skipped[name] = f"{node.label}: weight is computed ({wn.op.mnemonic})"
        else:
            layers.append(Layer(name, node.id, a, w, "conv2d"))
    return layers, skipped


def weight_value(graph: Graph, layer: Layer, params: Mapping[str, np.ndarray]) -> np.ndarray:
    """The f32 value of ``layer``'s weight (a constant, or its param in ``params``)."""
    op = graph.nodes[layer.weight].op
    if isinstance(op, Constant):
        return op.value.array().astype(np.float32)
    return np.asarray(params[op.name], dtype=np.float32)  # type: ignore[attr-defined]


def tensor_name(graph: Graph, nid: NodeId) -> str:
    """How errors and the report name a tensor: input / param by name, else id and op."""
    node = graph.nodes[nid]
    op = node.op
    if isinstance(op, (Input, Param)):
        return f"{op.mnemonic} {op.name!r}"
    fn = getattr(getattr(op, "fn", None), "value", None)  # relu rather than unary
    where = f" built at {node.loc}" if node.loc is not None and node.loc.file else ""
    return f"%{nid} {fn if isinstance(fn, str) else op.mnemonic}{where}"


def check_exclude(
    graph: Graph, layers: Sequence[Layer], exclude: Iterable[str | int], who: str = ""
) -> list[str | int]:
    """``exclude`` (layer names or node ids) as a list; QuantizationError (its message
    prefixed with ``who``) when it names something that is not one of ``layers``."""
    excl = list(exclude)
    known = {ly.name for ly in layers} | {ly.node for ly in layers}
    unknown = [e for e in excl if e not in known]
    if unknown:
        raise QuantizationError(
            f"{who}exclude names unknown layers {unknown}; layers of graph {graph.name!r}: "
            f"{[ly.name for ly in layers]}"
        )
    return excl


def check_weights(graph: Graph, layers: Sequence[Layer], params: Mapping[str, np.ndarray]) -> None:
    """QuantizationError naming the first weight that holds NaN or +-inf: int8 has no
    code for them (a NaN weight would silently become a finite int8)."""
    for ly in layers:
        w = weight_value(graph, ly, params)
        bad = ~np.isfinite(w)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise QuantizationError(
                f"quantize: the weight of layer {ly.name!r} ({tensor_name(graph, ly.weight)}, "
                f"shape {w.shape}) holds {int(bad.sum())} NaN/Inf values (first at {first}: "
                f"{w[first]}); int8 cannot represent them. Fix the weight, or keep the layer "
                f"in float with exclude=[{ly.name!r}]"
            )


def canonical_weights(
    graph: Graph, params: Mapping[str, np.ndarray]
) -> tuple[Graph, dict[str, np.ndarray], dict[str, str]]:
    """Matmul-shaped products with a known 2-D weight in another spelling become plain
    ``matmul(x, W [K, N])`` layers: ``matmul(x, transpose(W))`` (ONNX ``Gemm`` with
    ``transB``) and ``dot_general(x, W)`` contracting x's last axis with one axis of W,
    without batch axes. A transposed weight is stored as a new param ``"<name>.T"`` (the
    transpose of a constant: a constant). Returns (graph, params with the new ones, new
    param name -> what it came from); the graph is returned as is when nothing matched."""
    out_params = dict(params)
    made: dict[str, str] = {}

    def known(nid: NodeId) -> np.ndarray | None:
        op = graph.nodes[nid].op
        if isinstance(op, Constant):
            return op.value.array()
        if isinstance(op, Param) and op.name in params:
            return np.asarray(params[op.name])
        return None

    plans: dict[NodeId, tuple[NodeId, NodeId, bool]] = {}  # node -> (x, W, transposed)
    for node in graph.nodes:
        op = node.op
        if isinstance(op, MatMul):
            x, w = node.inputs
            t = graph.nodes[w]
            if isinstance(t.op, Transpose) and t.shape.rank == 2 and t.dtype.is_float:
                if tuple(p % 2 for p in t.op.perm) == (1, 0) and known(t.inputs[0]) is not None:
                    plans[node.id] = (x, t.inputs[0], True)
        elif isinstance(op, DotGeneral) and not op.lhs_batch and not op.rhs_batch:
            x, w = node.inputs
            wn, xn = graph.nodes[w], graph.nodes[x]
            if wn.shape.rank != 2 or known(w) is None or not wn.dtype.is_float:
                continue
            lc = tuple(a % xn.shape.rank for a in op.lhs_contract)
            rc = tuple(a % 2 for a in op.rhs_contract)
            if lc == (xn.shape.rank - 1,) and rc in ((0,), (1,)):
                plans[node.id] = (x, w, rc == (1,))
    if not plans:
        return graph, out_params, made
    rw = Rewriter(graph)
    transposed: dict[NodeId, NodeId] = {}
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        plan = plans.get(nid)
        if plan is None:
            rw.copy(node)
            continue
        x, w, trans = plan
        w_new = rw.map[w]
        if trans:
            if w not in transposed:
                src = graph.nodes[w]
                value = np.ascontiguousarray(known(w).T)  # type: ignore[union-attr]
                shape = Shape(value.shape, src.dtype)
                if isinstance(src.op, Param):
                    name = f"{src.op.name}.T"
                    out_params[name] = value
                    made[name] = f"transpose of param {src.op.name!r}"
                    transposed[w] = rw.emit(Param(name, shape), [], src.loc, shape)
                else:
                    cv = ConstValue.of(value, src.dtype)
                    transposed[w] = rw.emit(Constant(cv), [], src.loc, shape)
            w_new = transposed[w]
        rw.map[nid] = rw.emit(MatMul(), [rw.map[x], w_new], node.loc)
    return DeadCodeElimination().run(rw.finish()), out_params, made


def float_products(graph: Graph, layers: Sequence[Layer]) -> dict[str, str]:
    """Products that are not layers and stay float, node label -> why: attention (its
    activation x activation products run in the fused float attention kernel) and
    matmul / dot_general whose operands are both computed."""
    done = {ly.node for ly in layers}
    out: dict[str, str] = {}
    for node in graph.nodes:
        if node.id in done:
            continue
        if isinstance(node.op, Attention):
            out[node.label] = (
                "activation x activation products (q k^T, probabilities x v): the fused "
                "float attention kernel; there is no integer attention kernel"
            )
        elif isinstance(node.op, DotGeneral):
            out[node.label] = "both operands are activations (no weight to quantize now)"
    return out
