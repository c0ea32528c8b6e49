"""What a CompiledGraph did, readable and exportable. In: the compiled program, the
executor of the most recent run and (after ``run(profile=True)``) each kernel's time.
Out: a :class:`Report`: the kernel schedule (node, op, dtype, arena offset and size,
kernel kind, and the user's node it computes), the memory plan figures, the compile pass
records, the precision report (under a mixed policy: each node's dtype and why, with the
decisions in control-flow bodies under their node), per-kernel times, the native
instruction-set target and GEMM paths; its ``str`` is a table, ``to_chrome_trace(path)`` writes Chrome-trace JSON that Perfetto and
chrome://tracing load (``traceEvents`` of complete events, ``ph: "X"``, ``ts``/``dur`` in
microseconds).

Two numberings appear, kept apart by their sigil: ``#7`` is a node of the compiled
(optimized) graph, which is what the schedule runs; ``%19 matmul (model.py:42)`` is the
user's node (:attr:`rlx.ir.mir.Node.label`), named as in the fusion and quantization reports.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx.backends.cpu.dispatch import KernelKind
from rlx.errors import RlxError
from rlx.ir.lir import BufferPlan, format_bytes
from rlx.passes.base import PassRecord
from rlx.passes.precision_report import PrecisionReport

if TYPE_CHECKING:
    from rlx.backends.cpu.executor import Executor
    from rlx.backends.cpu.program import CpuProgram

__all__ = ["Report", "KernelRecord", "native_summary"]

# what engines.lowp_lib notes about a bf16/f16 matmul:
# "<dtype> matmul: <path>[, f32 accumulation][ (<instructions>)], weight ..."
_LOWP_NOTE = re.compile(r"(b?float16|b?f16) matmul: ([^,]+)(?:, f32 accumulation)?( \([^)]*\))?")


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One node of the schedule. ``seconds`` is None until a profiled run; views have no
    kernel (their ``view_of`` is set) and no time; ``notes`` are what the kernel factory
    said about its choice (e.g. why it fell back); ``prologue``: a param-derived node,
    computed once per param change instead of once per run."""

    node: int
    op: str
    dtype: str
    dims: tuple[int, ...]
    offset: int
    nbytes: int
    kind: KernelKind
    view_of: int | None
    inplace_of: int | None
    seconds: float | None
    notes: tuple[str, ...] = ()
    prologue: bool = False
    label: str = ""
    fused: tuple[str, ...] = ()

    @property
    def alias(self) -> str:
        if self.view_of is not None:
            return f"view of #{self.view_of}"
        if self.inplace_of is not None:
            return f"in place of #{self.inplace_of}"
        return ""


@dataclass(frozen=True)
class Report:
    """See the module docstring. Build with :meth:`Report.build`."""

    graph_name: str
    backend: str
    kernels: tuple[KernelRecord, ...]
    plan: BufferPlan
    scratch_bytes: int
    passes: tuple[PassRecord, ...]
    compile_seconds: float
    fusion_report: Any = None
    native: tuple[str, ...] = ()
    precision_report: PrecisionReport | None = None

    @staticmethod
    def build(program: CpuProgram, ex: Executor, times: list[float] | None) -> Report:
        """Combine the program's records with ``ex``'s schedule and the profiled times
        (``times`` aligns with the executor's kernel closures)."""
        n_kernels = sum(1 for e in ex.entries if e.view_of is None)
        it = iter(times) if times is not None and len(times) == n_kernels else None
        recs = []
        nodes = ex.graph.nodes
        for e in ex.entries:
            secs = next(it) if it is not None and e.view_of is None else None
            node = nodes[e.node]
            fused = node.loc.fused if node.loc is not None else ()
            recs.append(
                KernelRecord(
                    e.node,
                    e.op,
                    e.dtype,
                    e.dims,
                    e.offset,
                    e.nbytes,
                    e.kind,
                    e.view_of,
                    e.inplace_of,
                    secs,
                    e.notes,
                    e.prologue,
                    node.label,
                    tuple(f.label() for f in fused),
                )
            )
        return Report(
            graph_name=program.source.name,
            backend=program.backend,
            kernels=tuple(recs),
            plan=ex.plan,
            scratch_bytes=ex.scratch_bytes,
            passes=tuple(program.result.records),
            compile_seconds=program.compile_seconds,
            fusion_report=program.result.fusion_report,
            native=native_summary(program.options.native, recs),
            precision_report=program.result.precision_report,
        )

    @property
    def profiled(self) -> bool:
        return any(k.seconds is not None for k in self.kernels)

    @property
    def total_seconds(self) -> float:
        """Sum of the kernel times of the profiled run (0.0 without one)."""
        return sum(k.seconds or 0.0 for k in self.kernels)

    def kind_counts(self) -> dict[KernelKind, int]:
        """Number of scheduled kernels of each kind (views excluded)."""
        c = Counter(k.kind for k in self.kernels if k.view_of is None)
        return {kind: c[kind] for kind in KernelKind if c[kind] and kind is not KernelKind.VIEW}

    def reference_nodes(self) -> list[KernelRecord]:
        """Nodes running the allocating default kernel (candidates for a fast kernel)."""
        return [k for k in self.kernels if k.kind is KernelKind.REFERENCE and k.view_of is None]

    def __str__(self) -> str:
        lines = [
            f"rlx report: graph {self.graph_name!r} on {self.backend}, compiled in {self.compile_seconds * 1e3:.1f} ms"
        ]
        if self.passes:
            lines.append("passes:")
            lines += [f"  {p}" for p in self.passes]
        lines += [f"native: {line}" for line in self.native]
        if self.fusion_report is not None and str(self.fusion_report).strip():
            lines.append("fusion:")
            lines += [f"  {line}" for line in str(self.fusion_report).split("\n")]
        if self.precision_report is not None:
            lines.append("precision:")
            lines += [f"  {line}" for line in str(self.precision_report).split("\n")]
        lines.append("memory:")
        lines += [f"  {line}" for line in self.plan.summary().split("\n")]
        lines.append(f"  kernel scratch {format_bytes(self.scratch_bytes)}")
        counts = ", ".join(f"{n} {k.value}" for k, n in self.kind_counts().items())
        lines.append(f"kernels ({counts}):")
        head = f"  {'#node':>6} {'op':<26} {'dtype':<6} {'dims':<18} {'offset':>9} {'bytes':>9} {'kind':<9}"
        if self.profiled:
            head += f" {'us':>9}"
        lines.append(head)
        for k in self.kernels:
            dims = "[" + ",".join(map(str, k.dims)) + "]"
            row = f"  {'#' + str(k.node):>6} {k.op[:26]:<26} {k.dtype:<6} {dims[:18]:<18} {k.offset:>9} {k.nbytes:>9} {k.kind.value:<9}"
            if self.profiled:
                row += f" {k.seconds * 1e6:>9.1f}" if k.seconds is not None else f" {'-':>9}"
            row += "  fuses " + ", ".join(k.fused) if k.fused else f"  {k.label}"
            if k.alias:
                row += f"  {k.alias}"
            if k.prologue:
                row += "  (prologue)"
            if k.notes:
                row += "  # " + "; ".join(k.notes)
            lines.append(row)
        if self.profiled:
            lines.append(f"total kernel time {self.total_seconds * 1e6:.1f} us")
        return "\n".join(lines)

    def chrome_trace(self) -> dict[str, Any]:
        """The Chrome-trace dict: pid 1 is the profiled run (one ``X`` event per kernel,
        back to back), pid 2 the compile passes. RlxError without a profiled run."""
        if not self.profiled:
            raise RlxError(
                f"report of graph {self.graph_name!r} has no kernel times: call run(..., profile=True) first"
            )
        events: list[dict[str, Any]] = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": 1,
                "tid": 0,
                "args": {"name": f"rlx run: {self.graph_name}"},
            },
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "kernels"}},
        ]
        ts = 0.0
        for k in self.kernels:
            if k.seconds is None:
                continue
            dur = k.seconds * 1e6
            args = {
                "node": k.node,
                "user_node": k.label,
                "dtype": k.dtype,
                "dims": list(k.dims),
                "offset": k.offset,
                "bytes": k.nbytes,
                "kind": k.kind.value,
            }
            if k.inplace_of is not None:
                args["inplace_of"] = k.inplace_of
            if k.prologue:
                args["prologue"] = True
            if k.notes:
                args["notes"] = list(k.notes)
            events.append(
                {
                    "name": f"#{k.node} {k.op}",
                    "cat": k.kind.value,
                    "ph": "X",
                    "pid": 1,
                    "tid": 1,
                    "ts": ts,
                    "dur": dur,
                    "args": args,
                }
            )
            ts += dur
        if self.passes:
            events.append(
                {
                    "name": "process_name",
                    "ph": "M",
                    "pid": 2,
                    "tid": 0,
                    "args": {"name": "rlx compile passes"},
                }
            )
            ts = 0.0
            for p in self.passes:
                dur = p.seconds * 1e6
                args = {
                    "nodes_before": p.nodes_before,
                    "nodes_after": p.nodes_after,
                    "notes": list(p.notes),
                }
                events.append(
                    {
                        "name": p.name,
                        "cat": "pass",
                        "ph": "X",
                        "pid": 2,
                        "tid": 1,
                        "ts": ts,
                        "dur": dur,
                        "args": args,
                    }
                )
                ts += dur
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write :meth:`chrome_trace` as JSON to ``path``; returns the path."""
        p = Path(path)
        p.write_text(json.dumps(self.chrome_trace(), indent=1))
        return p


def native_summary(
    enabled: bool, kernels: tuple[KernelRecord, ...] | list[KernelRecord]
) -> tuple[str, ...]:
    """Lines naming the instruction-set path native kernels took on this CPU: the build
    target (AVX-512 / AVX2 / portable C, from ``RLX_ISA`` and the CPU), and the int8 and
    bf16/f16 GEMM paths of the scheduled kernels. ``enabled``: ``CompileOptions.native``."""
    if not enabled:
        return ("off (CompileOptions(native=False)): NumPy and BLAS kernels only",)
    from rlx.backends.cpu import native

    try:
        lines = [native.target_description()]
    except RlxError as e:  # e.g. RLX_ISA forcing a target this CPU lacks
        return (f"target unavailable: {e.bare_message.splitlines()[0]}",)
    if native.gcc_path() is None:
        lines.append("gcc not found: every native kernel fell back to NumPy")
    q = [k for k in kernels if k.op == "qmatmul" and k.view_of is None]
    if q:
        nat = [k for k in q if k.kind is KernelKind.NATIVE]
        if nat:
            try:
                isa = native.qgemm_lib().isa.name
            except RlxError:
                isa = "?"
            lines.append(f"int8 GEMM: {isa} kernel for {len(nat)} of {len(q)} qmatmul")
        if len(nat) < len(q):
            lines.append(f"int8 GEMM: exact f64 BLAS for {len(q) - len(nat)} of {len(q)} qmatmul")
    paths = Counter(
        (m.group(1), (m.group(2) + (m.group(3) or "")).strip())
        for k in kernels
        for note in k.notes
        if (m := _LOWP_NOTE.match(note)) is not None
    )
    for (dtype, path), n in paths.items():
        lines.append(f"{dtype} GEMM: {path} ({n} kernels)")
    return tuple(lines)
