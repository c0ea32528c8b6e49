"""Source locations: the line of user code that built a node, and which node it was.

A :class:`SourceLoc` also carries the node's *provenance*: its id and op in the user's
graph (``node``, ``op``; stamped by ``Graph.apply`` and, for graphs built another way, when
compilation starts) and, for a fused node, the locations of the user nodes it replaced
(``fused``). Passes copy a node's loc to the node(s) they rebuild it into, so every report
can name a node by the user's id and line (:meth:`SourceLoc.label`), whatever the
intermediate graphs numbered it. None of this takes part in equality or fingerprints.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from types import FrameType

__all__ = ["SourceLoc", "capture", "fuse", "stamp"]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))  # the rlx package


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """File, line and function of the user frame that created a node."""

    file: str
    line: int
    function: str
    node: int | None = field(default=None, compare=False)
    op: str | None = field(default=None, compare=False)
    fused: tuple[SourceLoc, ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        if not self.file:
            return "an unknown line"
        return f"{self.file}:{self.line} in {self.function}"

    @property
    def known(self) -> bool:
        """Whether the file and line are known (a stamp may carry only the node)."""
        return bool(self.file)

    def label(self) -> str:
        """``'%19 matmul (model.py:42)'``: the user's node id, op and line (parts that are
        unknown are left out)."""
        where = f"{os.path.basename(self.file)}:{self.line}" if self.file else ""
        if self.node is None:
            return where
        head = f"%{self.node} {self.op}"
        return f"{head} ({where})" if where else head


def stamp(loc: SourceLoc | None, node: int, op: str) -> SourceLoc:
    """``loc`` with the provenance ``node`` / ``op`` (a line-less loc when ``loc`` is None)."""
    if loc is None:
        return SourceLoc("", 0, "", node, op)
    return SourceLoc(loc.file, loc.line, loc.function, node, op, loc.fused)


def fuse(anchor: SourceLoc | None, members: list[SourceLoc | None]) -> SourceLoc | None:
    """The loc of a node that replaces ``members`` (anchor's loc, listing the members'
    stamped locs, flattened through earlier fusions, in order)."""
    flat: list[SourceLoc] = []
    for m in members:
        if m is None:
            continue
        flat.extend(m.fused if m.fused else ([m] if m.node is not None else []))
    if anchor is None:
        return None
    return replace(anchor, fused=tuple(flat))


_OUTSIDE: dict[str, bool] = {}  # code file name -> whether it is outside the rlx package


def capture(node: int | None = None, op: str | None = None) -> SourceLoc | None:
    """Return the first stack frame outside the rlx package (the user's line), or None.
    With ``node`` / ``op`` the loc carries that provenance (see :func:`stamp`), and a
    line-less loc is returned when no frame is outside rlx."""
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        outside = _OUTSIDE.get(fn)
        if outside is None:
            outside = _OUTSIDE[fn] = not os.path.abspath(fn).startswith(_PKG_DIR)
        if outside:
            return SourceLoc(fn, f.f_lineno, f.f_code.co_name, node, op)
        f = f.f_back
    return None if node is None else SourceLoc("", 0, "", node, op)
