"""Calling one op's derivative rule (``jvp`` or ``vjp``) for forward and reverse mode.

Both modes wrap the rule the same way: refuse a non-differentiable op, turn a missing
rule into an AutodiffError naming the node, check what the rule gave, and stamp the
nodes it added with the forward node's source location.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rlx.errors import AutodiffError
from rlx.ir.mir import Graph, Node
from rlx.ops.rules import stamp

__all__ = ["call_rule"]

T = TypeVar("T")

# mode -> (what flows through a non-differentiable op, what the missing rule is called)
_WORDS = {
    "jvp": ("a tangent flows through it; leave its inputs out of wrt", "forward-mode rule (jvp)"),
    "vjp": (
        "a gradient flows through it; stop the gradient before it or leave its inputs out of wrt",
        "derivative rule (vjp)",
    ),
}


def call_rule(
    g: Graph, node: Node, mode: str, rule: Callable[[], T], check: Callable[[T], str | None]
) -> T:
    """``rule()`` (the op's ``mode`` rule for ``node``, adding nodes to ``g``) with its
    errors turned into AutodiffErrors naming the node, its result passed to ``check``
    (a message: what is wrong with it, raised as ``<mode> rule of <op> <message>``), and
    the nodes it adds stamped with the forward node's location."""
    op = node.op
    flows, missing = _WORDS[mode]
    if op.nondiff:
        raise AutodiffError(
            f"{node.label}: not differentiable ({op.nondiff}), but {flows}",
            node=node.id,
            loc=node.loc,
        )
    start = len(g.nodes)
    try:
        out = rule()
    except NotImplementedError:
        raise AutodiffError(
            f"{node.label}: op {op.mnemonic!r} has no {missing}",
            node=node.id,
            loc=node.loc,
        ) from None
    problem = check(out)
    if problem is not None:
        raise AutodiffError(
            f"{node.label}: {mode} rule of {op.mnemonic!r} {problem}",
            node=node.id,
            loc=node.loc,
        )
    stamp(g, start, node)
    return out
