"""Source locations: the line of user code that built a node."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from types import FrameType

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """File, line and function of the user frame that created a node."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


def capture() -> SourceLoc | None:
    """Return the first stack frame outside the rlx package (the user's line), or None."""
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not os.path.abspath(fn).startswith(_PKG_DIR):
            return SourceLoc(fn, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None
