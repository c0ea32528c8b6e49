"""SmoothQuant-style migration of activation outliers into the weights (Xiao et al. 2023,
"SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language Models").

In: a float graph, its layers (``rlx.quant.layers``), params, each layer input's
per-channel max ``|X_j|`` from calibration, and ``alpha``. Out: an equivalent float graph
(equal in exact arithmetic, to f32 rounding in practice) and new param values, where each
group of layers reading one activation ``X [..., K]`` computes ``(X / s) @ (s * W)`` with::

    s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)

(``max|W_j|`` over the group's weights' row ``j``; ``s_j = 1`` where either max is 0).
Where ``1/s`` goes:

* ``layer_norm`` (gamma / beta known now): folded into gamma and beta; readers of the norm
  that are not in the group (a residual) read ``norm * s`` so they see the old value;
* ``add(matmul(x, W0), b0)`` read only by the group (a linear, W0 / b0 params read by
  nothing else): folded into W0's output columns and b0;
* otherwise an inserted ``mul(X, 1/s)`` (per channel) in front of the group.

A group is smoothed only when it lowers the estimated int8 error of its layers (per-tensor
activation step ``max_j(max|X_j|/s_j)/127`` against per-channel weight steps, with
``max|X_j|`` standing in for the activation's magnitude); otherwise it stays as it was and
:attr:`SmoothResult.info` says so. Layers whose weight is a constant or is shared with a
matmul outside the group are not smoothed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rlx.dtype import DType
from rlx.errors import QuantizationError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Constant, ConstValue, Param
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.linalg import MatMul
from rlx.ops.norm import LayerNorm
from rlx.passes.base import Rewriter
from rlx.quant.layers import Layer, weight_value
from rlx.shape import Shape

__all__ = ["SmoothResult", "smooth_scales", "smooth_graph", "estimated_error"]

_S_RANGE = (1e-4, 1e4)


@dataclass
class SmoothResult:
    """The smoothed graph and the param values it reads (``params``: every given param,
    smoothed ones replaced); ``scales``: activation tap (old id) -> ``s``; ``info``: layer
    name -> what was done (``"smooth alpha=0.5, folded into layer_norm %20"``)."""

    graph: Graph
    params: dict[str, np.ndarray]
    scales: dict[NodeId, np.ndarray] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)


def smooth_scales(x_amax: np.ndarray, w_amax: np.ndarray, alpha: float) -> np.ndarray:
    """``s_j = x_amax_j ** alpha / w_amax_j ** (1 - alpha)`` (f32 ``[K]``), 1 where either
    max is 0, clipped to [1e-4, 1e4]."""
    x = np.asarray(x_amax, np.float64)
    w = np.asarray(w_amax, np.float64)
    ok = (x > 0) & (w > 0) & np.isfinite(x) & np.isfinite(w)
    with np.errstate(all="ignore"):
        s = np.where(ok, np.power(x, alpha) / np.power(w, 1.0 - alpha), 1.0)
    return np.clip(s, *_S_RANGE).astype(np.float32)


def estimated_error(x_amax: np.ndarray, weights: Sequence[np.ndarray], s: np.ndarray) -> float:
    """Estimated int8 error energy of ``(X / s) @ (s * W)`` summed over ``weights``:
    activation rounding (one per-tensor step) through ``s * W`` plus each output
    channel's weight rounding over the activation magnitudes (up to a common 1/12)."""
    xs = np.asarray(x_amax, np.float64) / s
    dx = xs.max() / 127.0
    total = 0.0
    for w in weights:
        ws = s[:, None].astype(np.float64) * w
        dw = np.abs(ws).max(axis=0) / 127.0
        total += dx * dx * float((ws * ws).sum()) + float((xs * xs).sum()) * float((dw * dw).sum())
    return total


def _value(g: Graph, nid: NodeId, params: Mapping[str, np.ndarray]) -> np.ndarray | None:
    op = g.nodes[nid].op
    if isinstance(op, Constant):
        return op.value.array().astype(np.float32)
    if isinstance(op, Param) and op.name in params:
        return np.asarray(params[op.name], np.float32)
    return None


def _fold_target(
    g: Graph,
    tap: NodeId,
    group: set[NodeId],
    readers: dict[NodeId, list[NodeId]],
    params: Mapping[str, np.ndarray],
) -> str:
    """'ln', 'linear' or 'mul' (see the module docstring)."""
    node = g.nodes[tap]
    k = node.shape.dims[-1]
    if isinstance(node.op, LayerNorm) and node.op.has_beta:
        if all(_value(g, i, params) is not None for i in node.inputs[1:]):
            return "ln"
    if isinstance(node.op, Binary) and node.op.fn is BinaryKind.ADD and set(readers[tap]) <= group:
        for mm, b in (node.inputs, node.inputs[::-1]):
            mn, bn = g.nodes[mm], g.nodes[b]
            if not isinstance(mn.op, MatMul) or readers[mm] != [tap] or bn.shape.dims != (k,):
                continue
            w0 = mn.inputs[1]
            if (
                isinstance(g.nodes[w0].op, Param)
                and isinstance(bn.op, Param)
                and readers[w0] == [mm]
                and readers[b] == [tap]
                and _value(g, w0, params) is not None
                and _value(g, b, params) is not None
                and g.nodes[w0].shape.rank == 2
            ):
                return "linear"
    return "mul"


def _const(rw: Rewriter, value: np.ndarray, loc: object) -> NodeId:
    cv = ConstValue.of(np.asarray(value, np.float32), DType.F32)
    return rw.emit(Constant(cv), [], loc, Shape(cv.dims, DType.F32))  # type: ignore[arg-type]


def smooth_graph(
    graph: Graph,
    layers: Sequence[Layer],
    params: Mapping[str, np.ndarray],
    channel_amax: Mapping[NodeId, np.ndarray | None],
    alpha: float,
) -> SmoothResult:
    """Smooth every group of ``layers`` sharing an input (see the module docstring)."""
    if not 0.0 <= alpha <= 1.0:
        raise QuantizationError(f"smooth_alpha must be in [0, 1], got {alpha}")
    sp = {k: np.asarray(v) for k, v in params.items()}
    readers = graph.consumers()
    groups: dict[NodeId, list[Layer]] = defaultdict(list)
    for ly in layers:
        groups[ly.act].append(ly)
    layer_of = {ly.node: ly for ly in layers}
    res = SmoothResult(graph, sp)
    plans: dict[NodeId, tuple[np.ndarray, str]] = {}
    col_scale: dict[str, np.ndarray] = {}
    for tap, group in groups.items():
        names = [ly.name for ly in group]
        amax = channel_amax.get(tap)
        nodes = {ly.node for ly in group}
        why = None
        if amax is None:
            why = "no per-channel statistics for its input"
        elif any(not isinstance(graph.nodes[ly.weight].op, Param) for ly in group):
            why = "its weight is a constant"
        elif any(
            r not in nodes and isinstance(graph.nodes[r].op, MatMul)
            for ly in group
            for r in readers[ly.weight]
        ):
            why = "its weight is shared with another matmul"
        if why is not None:
            for n in names:
                res.info[n] = f"not smoothed: {why}"
            continue
        assert amax is not None
        ws = [weight_value(graph, ly, params) for ly in group]
        w_amax = np.max([np.abs(w).max(axis=1) for w in ws], axis=0)
        s = smooth_scales(amax, w_amax, alpha)
        e0 = estimated_error(amax, ws, np.ones_like(s))
        e1 = estimated_error(amax, ws, s)
        if not e1 < e0:
            for n in names:
                res.info[n] = (
                    f"not smoothed: alpha={alpha:g} would raise the estimated int8 error "
                    f"x{e1 / e0:.2f}"
                )
            continue
        how = _fold_target(graph, tap, nodes, readers, params)
        plans[tap] = (s, how)
        res.scales[tap] = s
        where = {
            "ln": f"folded into {graph.nodes[tap].op.mnemonic} %{tap}",
            "linear": f"folded into the linear before it (%{tap})",
            "mul": "a per-channel scale inserted before it",
        }[how]
        for ly, w in zip(group, ws, strict=True):
            sp[graph.nodes[ly.weight].op.name] = (s[:, None] * w).astype(np.float32)  # type: ignore[attr-defined]
            res.info[ly.name] = f"smooth alpha={alpha:g} ({where}; estimated error x{e1 / e0:.2f})"
        if how == "linear":
            node = graph.nodes[tap]
            for i in node.inputs:
                if isinstance(graph.nodes[i].op, MatMul):
                    col_scale[graph.nodes[graph.nodes[i].inputs[1]].op.name] = s  # type: ignore[attr-defined]
                else:
                    b = graph.nodes[i].op.name  # type: ignore[attr-defined]
                    sp[b] = (np.asarray(sp[b], np.float32) / s).astype(np.float32)
    for name, s in col_scale.items():  # after the row scalings: they commute
        sp[name] = (np.asarray(sp[name], np.float32) / s[None, :]).astype(np.float32)
    if not plans:
        return res

    rw = Rewriter(graph)
    direct: dict[NodeId, NodeId] = {}  # tap -> what its group's matmuls read
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        ly = layer_of.get(nid)
        plan = plans.get(nid)
        if plan is not None and plan[1] == "ln":
            s, _ = plan
            gamma = _value(graph, node.inputs[1], params)
            beta = _value(graph, node.inputs[2], params)
            assert gamma is not None and beta is not None
            ins = [rw.map[node.inputs[0]], _const(rw, gamma / s, node.loc)]
            ins.append(_const(rw, beta / s, node.loc))
            t = rw.dst.add_node(node.op, ins, node.shape, node.loc)
            direct[nid] = t
            group = {x.node for x in groups[nid]}
            others = [r for r in readers[nid] if r not in group]
            if others or nid in graph.outputs:
                comp = _const(rw, s, node.loc)
                rw.map[nid] = rw.emit(Binary(BinaryKind.MUL), [t, comp], node.loc)
            else:
                rw.map[nid] = t
            continue
        if ly is not None and ly.act in direct:
            new = rw.dst.add_node(
                node.op, [direct[ly.act], rw.map[ly.weight]], node.shape, node.loc
            )
            rw.map[nid] = new
        else:
            new = rw.copy(node)
        if plan is None:
            continue
        if plan[1] == "linear":
            direct[nid] = new
        else:  # an inserted per-channel 1/s in front of the group
            inv = _const(rw, 1.0 / plan[0], node.loc)
            direct[nid] = rw.emit(Binary(BinaryKind.MUL), [new, inv], node.loc)
    res.graph = rw.finish()
    return res
