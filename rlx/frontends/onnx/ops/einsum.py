"""Einsum -> rlx dot_general / reduce / transpose. Per operand: ellipsis expanded to named
dims, repeated labels (a diagonal) taken with an identity mask and a sum, labels no one
else needs summed out; two operands then meet in one dot_general (shared labels kept in
the output are batch dims, the others contract); the result is transposed to the output
order. Three or more operands contract left to right."""

from __future__ import annotations

import numpy as np

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import bin_
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.linalg import DotGeneral
from rlx.ops.movement import Reshape, Transpose
from rlx.ops.reduce import Reduce, ReduceKind

_ELL = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse(eq: str, ranks: list[int]) -> tuple[list[str], str]:
    eq = eq.replace(" ", "")
    lhs, _, out = eq.partition("->")
    terms = lhs.split(",")
    n_ell = max(
        (r - len(t.replace("...", "")) for t, r in zip(terms, ranks, strict=True) if "..." in t),
        default=0,
    )
    ell = _ELL[:n_ell]
    full = []
    for t, r in zip(terms, ranks, strict=True):
        if "..." in t:
            k = r - len(t.replace("...", ""))
            t = t.replace("...", ell[n_ell - k :])
        full.append(t)
    if "->" not in eq:
        counts = {c: "".join(full).count(c) for c in "".join(full)}
        out = ell + "".join(sorted(c for c, v in counts.items() if v == 1 and c not in ell))
    else:
        out = out.replace("...", ell)
    return full, out


def _diagonal(g, x: int, labels: str) -> tuple[int, str]:  # noqa: ANN001
    while True:
        dup = next((c for c in labels if labels.count(c) > 1), None)
        if dup is None:
            return x, labels
        i = labels.index(dup)
        j = labels.index(dup, i + 1)
        n = int(g.shape(x).dims[i])
        r = len(labels)
        eye = np.eye(n, dtype=g.shape(x).dtype.np).reshape(
            [n if a in (i, j) else 1 for a in range(r)]
        )
        x = g.apply(Reduce(ReduceKind.SUM, (j,), False), [bin_(g, B.MUL, x, g.constant(eye))])
        labels = labels[:j] + labels[j + 1 :]


def _sum_out(g, x: int, labels: str, keep: set[str]) -> tuple[int, str]:  # noqa: ANN001
    drop = tuple(i for i, c in enumerate(labels) if c not in keep)
    if not drop:
        return x, labels
    x = g.apply(Reduce(ReduceKind.SUM, drop, False), [x])
    return x, "".join(c for i, c in enumerate(labels) if i not in drop)


@converter("Einsum", since=12)
def einsum(ctx: NodeCtx) -> int:
    g = ctx.g
    xs = ctx.xs()
    terms, out = _parse(ctx.attr("equation"), [ctx.shape(x).rank for x in xs])
    ops = [_diagonal(g, x, t) for x, t in zip(xs, terms, strict=True)]
    x, lab = ops[0]
    for k in range(1, len(ops)):
        y, lab_y = ops[k]
        later = set(out) | {c for _, t in ops[k + 1 :] for c in t}
        x, lab = _sum_out(g, x, lab, later | set(lab_y))
        y, lab_y = _sum_out(g, y, lab_y, later | set(lab))
        shared = [c for c in lab if c in lab_y]
        batch = [c for c in shared if c in later]
        contract = [c for c in shared if c not in later]
        op = DotGeneral(
            tuple(lab.index(c) for c in contract), tuple(lab_y.index(c) for c in contract),
            tuple(lab.index(c) for c in batch), tuple(lab_y.index(c) for c in batch),
        )  # fmt: skip
        x = g.apply(op, [x, y])
        lab = (
            "".join(batch)
            + "".join(c for c in lab if c not in shared)
            + "".join(c for c in lab_y if c not in shared)
        )
    x, lab = _sum_out(g, x, lab, set(out))
    if lab != out:
        x = g.apply(Transpose(tuple(lab.index(c) for c in out)), [x])
    if not out and g.shape(x).rank:
        x = g.apply(Reshape(()), [x])
    return x
