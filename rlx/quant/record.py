"""Calibration records and Q/DQ insertion. In: a graph plus a record (tap node id ->
quantization parameters). Out: a graph where every tap is followed by a
``quantize -> dequantize`` pair and every consumer of the tap reads the dequantized value.

This is the IR-rewrite half of post-training quantization (the "fake-quant" canonical
form): the graph stays in f32, each tap loses one quantization step of precision, and
``rlx.quant.lower.QuantLowering`` later replaces Q/DQ-bracketed matmuls by integer ones.
Insert-only: filling the record (calibration) is the caller's job.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rlx.dtype import DType
from rlx.errors import QuantizationError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.elementwise import Cast
from rlx.ops.quant import QUANT_RANGES, Dequantize, Quantize

__all__ = ["CalibrationEntry", "CalibrationRecord", "insert_q_dq"]


@dataclass(frozen=True, slots=True)
class CalibrationEntry:
    """Quantization parameters of one tap. ``axis=None`` is per-tensor (one scale and
    zero point); ``axis=d`` is per-channel along dim ``d`` (one per index of that dim).
    ``dtype`` is the integer type of the quantized value (I8 or U8)."""

    axis: int | None
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    dtype: DType = DType.I8

    def __post_init__(self) -> None:
        object.__setattr__(self, "scales", tuple(float(s) for s in self.scales))
        object.__setattr__(self, "zero_points", tuple(int(z) for z in self.zero_points))
        if self.dtype not in (DType.I8, DType.U8):
            raise QuantizationError(f"calibration entry dtype must be i8 or u8, got {self.dtype}")
        if not self.scales:
            raise QuantizationError("calibration entry needs at least one scale")
        if len(self.scales) != len(self.zero_points):
            raise QuantizationError(
                f"calibration entry has {len(self.scales)} scales but "
                f"{len(self.zero_points)} zero points (need one of each per channel)"
            )
        bad = [s for s in self.scales if not (math.isfinite(s) and s > 0)]
        if bad:
            raise QuantizationError(f"calibration scales must be finite and > 0, got {bad[:4]}")
        lo, hi = QUANT_RANGES[self.dtype]
        badz = [z for z in self.zero_points if not lo <= z <= hi]
        if badz:
            raise QuantizationError(
                f"calibration zero points must lie in [{lo}, {hi}] for {self.dtype}, got {badz[:4]}"
            )
        if self.axis is None and len(self.scales) != 1:
            raise QuantizationError(
                f"a per-tensor calibration entry has one scale, got {len(self.scales)}"
            )
        if self.axis is not None and self.axis < 0:
            raise QuantizationError(f"per-channel axis must be >= 0, got {self.axis}")

    @staticmethod
    def per_tensor(scale: float, zero_point: int = 0, dtype: DType = DType.I8) -> CalibrationEntry:
        """One scale (symmetric when ``zero_point`` is 0) for the whole tensor."""
        return CalibrationEntry(None, (scale,), (zero_point,), dtype)

    @staticmethod
    def per_channel(
        axis: int, scales: Iterable[float], zero_points: Iterable[int] | None = None
    ) -> CalibrationEntry:
        """One scale per index of dim ``axis`` (zero points default to 0: symmetric)."""
        s = tuple(scales)
        z = tuple(zero_points) if zero_points is not None else (0,) * len(s)
        return CalibrationEntry(axis, s, z)

    @property
    def is_per_tensor(self) -> bool:
        return self.axis is None


#: Tap node id -> its quantization parameters.
CalibrationRecord = dict[NodeId, CalibrationEntry]


def _check_entry(graph: Graph, nid: NodeId, entry: CalibrationEntry) -> None:
    if not 0 <= nid < len(graph.nodes):
        raise QuantizationError(
            f"calibration record names node %{nid}, but graph {graph.name!r} has "
            f"{len(graph.nodes)} nodes"
        )
    node = graph.nodes[nid]
    if not node.dtype.is_float:
        raise QuantizationError(
            f"tap %{nid} {node.op} is {node.shape}: only float tensors can be quantized",
            node=nid,
            loc=node.loc,
        )
    if entry.axis is not None:
        if entry.axis >= node.shape.rank:
            raise QuantizationError(
                f"tap %{nid} {node.op}: per-channel axis {entry.axis} out of range for {node.shape}",
                node=nid,
                loc=node.loc,
            )
        d = node.shape.dims[entry.axis]
        if d != len(entry.scales):
            raise QuantizationError(
                f"tap %{nid} {node.op}: per-channel along axis {entry.axis} of {node.shape} "
                f"needs {d} scales, the record gives {len(entry.scales)}",
                node=nid,
                loc=node.loc,
            )


def insert_q_dq(graph: Graph, record: Mapping[NodeId, CalibrationEntry]) -> Graph:
    """Return a new graph with a ``quantize -> dequantize`` pair after every tap in
    ``record``; consumers of a tap read its dequantize, and a tap that is a graph output
    is replaced by its dequantize in the outputs. Untagged nodes are copied unchanged.
    A non-f32 tap gets a cast back to its dtype after the (f32) dequantize."""
    for nid, entry in record.items():
        _check_entry(graph, nid, entry)
    out = Graph(graph.name)
    out.sym_bounds = dict(graph.sym_bounds)
    id_map: dict[NodeId, NodeId] = {}
    tap_dq: dict[NodeId, NodeId] = {}
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        ins = [tap_dq.get(i, id_map.get(i)) for i in node.inputs]
        new_id = out.add_node(node.op, ins, node.shape, node.loc)  # type: ignore[arg-type]
        id_map[nid] = new_id
        entry = record.get(nid)
        if entry is not None:
            q_op = Quantize(entry.axis, entry.scales, entry.zero_points, entry.dtype)
            q = out.add_node(q_op, [new_id], node.shape.with_dtype(entry.dtype), node.loc)
            dq_op = Dequantize(entry.axis, entry.scales, entry.zero_points)
            dq = out.add_node(dq_op, [q], node.shape.with_dtype(DType.F32), node.loc)
            if node.dtype is not DType.F32:  # consumers keep seeing the tap's dtype
                dq = out.add_node(Cast(node.dtype), [dq], node.shape, node.loc)
            tap_dq[nid] = dq
    out.outputs = [tap_dq.get(o, id_map[o]) for o in graph.outputs]
    return out
