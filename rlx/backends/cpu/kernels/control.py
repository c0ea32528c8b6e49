"""CPU kernels for control flow: ``If``, ``While``, ``Scan``. In: the node and its arena
views. Out: a closure running the node's sub-graphs as compiled sub-programs.

Each sub-graph becomes a :class:`SubProgram` when the parent's schedule is built: its
own buffer plan (the parent's symbol bindings) and an :class:`Executor` with its own
arena, kernels chosen from the same table (so nested control flow nests sub-programs).
A run copies operands into the sub-program's input views, calls its kernel closures and
reads its output views: no planning, interpreting or allocating per run or per step.
Loop carries live in scratch made at build time (a body's output may alias its input,
so results are copied to the carries before the next step reads them); a scan writes
each step's ``y`` straight into its slice of the output view.

The sub-graphs run as the pipeline left them: it optimizes the parent graph, and of its
passes only the precision pass enters the bodies (they run at the policy's dtypes). A sub-graph's kernels are not listed in the parent's report; their kinds are in
the control-flow node's notes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.errors import InputError
from rlx.ir.mir import Graph
from rlx.ops.control import If, Scan, While
from rlx.ops.core import Input

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["SubProgram", "if_kernel", "while_kernel", "scan_kernel"]


class SubProgram:
    """A sub-graph planned and scheduled once: ``inputs[k]`` is the view operand ``k``
    is copied into (None when the sub-graph does not read it), ``outputs`` the views of
    its results, ``run()`` computes them."""

    def __init__(self, graph: Graph, bindings: Mapping[str, int], ctx: KernelCtx):
        from rlx.backends.cpu.executor import Executor
        from rlx.backends.cpu.planner import plan_memory

        names = set().union(*(n.shape.symbols for n in graph.nodes)) if graph.nodes else set()
        binds = {s: v for s, v in bindings.items() if s in names}
        plan = plan_memory(graph, binds)
        self.executor = Executor(
            graph,
            plan,
            {},
            {},
            num_threads=ctx.num_threads,
            native=ctx.native,
            batch_invariant=ctx.batch_invariant,
        )
        if self.executor.stale:
            self.executor.run_prologue()  # constant-only nodes: their values never change
        count = 1 + max(
            (int(n.op.name[2:]) for n in graph.nodes if isinstance(n.op, Input)), default=-1
        )
        self.inputs: list[np.ndarray | None] = [None] * count
        for n in graph.nodes:
            if isinstance(n.op, Input):
                self.inputs[int(n.op.name[2:])] = self.executor.views[n.id]
        self.outputs = self.executor.output_views
        self._kernels = self.executor.schedule

    def kinds(self) -> Counter[str]:
        """Kernel kinds of the sub-graph's schedule (for the parent's report notes)."""
        return Counter(e.kind.value for e in self.executor.kernel_entries)

    def feed(self, k: int, value: np.ndarray) -> None:
        view = self.inputs[k] if k < len(self.inputs) else None
        if view is not None:
            np.copyto(view, value, casting="unsafe")

    def run(self) -> None:
        for f in self._kernels:
            f()


def _note(ctx: KernelCtx, role: str, sp: SubProgram) -> None:
    """``then: compiled sub-program (3 native, 1 numpy; bf16 matmul, bf16 tanh)``: the
    kernel kinds, then the kernels a precision policy narrowed (f16 / bf16)."""
    kinds = ", ".join(f"{c} {k}" for k, c in sorted(sp.kinds().items())) or "no kernels"
    entries = sp.executor.kernel_entries
    low = sorted({f"{e.dtype} {e.op}" for e in entries if e.dtype in ("f16", "bf16")})
    ctx.notes.append(f"{role}: compiled sub-program ({kinds}{'; ' if low else ''}{', '.join(low)})")


def if_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Run the taken branch's sub-program and copy its result into ``out``."""
    op: If = node.op  # type: ignore[assignment]
    pred, operands = ins[0], ins[1:]
    branches = (
        SubProgram(op.then_branch, ctx.bindings, ctx),
        SubProgram(op.else_branch, ctx.bindings, ctx),
    )
    _note(ctx, "then", branches[0])
    _note(ctx, "else", branches[1])
    flag = pred.reshape(-1)
    j = op.output_index

    def run() -> None:
        sp = branches[0] if flag[0] else branches[1]
        for i, x in enumerate(operands):
            sp.feed(i, x)
        sp.run()
        np.copyto(out, sp.outputs[j], casting="unsafe")

    return run


def while_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Carries in scratch; per iteration: cond sub-program, body sub-program, carries
    updated from the body's outputs. ``max_iterations`` as the reference (InputError)."""
    op: While = node.op  # type: ignore[assignment]
    cond = SubProgram(op.cond, ctx.bindings, ctx)
    body = SubProgram(op.body, ctx.bindings, ctx)
    _note(ctx, "cond", cond)
    _note(ctx, "body", body)
    carries = [ctx.scratch(x.shape, x.dtype, 600 + i) for i, x in enumerate(ins)]
    flag = cond.outputs[0].reshape(-1)
    limit = op.max_iterations
    j = op.output_index

    def run() -> None:
        for c, x in zip(carries, ins, strict=True):
            np.copyto(c, x)
        steps = 0
        while True:
            for i, c in enumerate(carries):
                cond.feed(i, c)
            cond.run()
            if not flag[0]:
                break
            if limit is not None and steps >= limit:
                raise InputError(
                    f"while: the condition still holds after max_iterations={limit} iterations"
                )
            for i, c in enumerate(carries):
                body.feed(i, c)
            body.run()
            for c, y in zip(carries, body.outputs, strict=True):
                np.copyto(c, y, casting="unsafe")
            steps += 1
        np.copyto(out, carries[j])

    return run


def scan_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Carries in scratch; per step the body sub-program reads the carries and ``xs[t]``;
    a stacked ``y`` is copied into ``out[t]``, a carry result into ``out`` at the end."""
    op: Scan = node.op  # type: ignore[assignment]
    nc = op.num_carry
    length = op.length if isinstance(op.length, int) else op.length.evaluate(ctx.bindings)
    body = SubProgram(op.body, ctx.bindings, ctx)
    _note(ctx, "body", body)
    carries = [ctx.scratch(x.shape, x.dtype, 600 + i) for i, x in enumerate(ins[:nc])]
    xs = ins[nc:]
    j = op.output_index
    steps = range(length - 1, -1, -1) if op.reverse else range(length)
    ys = j >= nc
    y_view = body.outputs[j]
    # per step: the xs slices and the output slice, as views made once (``[t, ...]``: a
    # 0-d view, where ``[t]`` of a 1-D array would be a NumPy scalar copy)
    plan = [([x[t, ...] for x in xs], out[t, ...] if ys else None) for t in steps]

    def run() -> None:
        for c, x in zip(carries, ins[:nc], strict=True):
            np.copyto(c, x)
        for x_t, out_t in plan:
            for i, c in enumerate(carries):
                body.feed(i, c)
            for i, x in enumerate(x_t):
                body.feed(nc + i, x)
            body.run()
            if out_t is not None:
                np.copyto(out_t, y_view, casting="unsafe")
            for c, y in zip(carries, body.outputs[:nc], strict=True):
                np.copyto(c, y, casting="unsafe")
        if not ys:
            np.copyto(out, carries[j])

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    If: (if_kernel,),
    While: (while_kernel,),
    Scan: (scan_kernel,),
}
