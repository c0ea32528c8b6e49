"""Running rlx in a fresh Python where an optional package cannot be imported: the
frontends' "install the extra" errors. In: the package's module name and an expression
using rlx; out: the RlxError it raised, printed as ``"<ErrorType> <message>"``."""

from __future__ import annotations

import subprocess
import sys


def error_without(module: str, expr: str) -> str:
    """``expr`` evaluated after ``import rlx`` with ``module`` unimportable -> the printed
    ``"<ErrorType> <message>"`` of the RlxError it raised ("" when it raised none)."""
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "import rlx\n"
        f"try:\n    {expr}\nexcept rlx.RlxError as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout
