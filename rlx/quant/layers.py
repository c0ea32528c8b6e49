"""The quantizable layers of a graph. In: a MIR graph (fused matmuls expanded) and its
float params. Out: :class:`Layer` records (a ``matmul`` whose right operand is a static 2-D
f32 weight known now), the skipped matmuls with the reason, weight values, and the
tensor names errors and reports use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlx.dtype import DType
from rlx.errors import QuantizationError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Constant, Input, Param
from rlx.ops.linalg import MatMul
from rlx.ops.nn import Conv

__all__ = [
    "Layer",
    "find_layers",
    "find_conv_layers",
    "weight_value",
    "check_weights",
    "tensor_name",
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
