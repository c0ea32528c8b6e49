"""rlx: a machine-learning compiler and runtime for the CPU.

Build a graph (``rlx.Graph``) or a HIR module (``rlx.GraphModule.define``), evaluate it
with the reference interpreter, compile it with ``rlx.Session("cpu").compile``.
"""

from rlx import ops as _ops  # noqa: F401  (registers the built-in ops)
from rlx.dtype import DType, promote
from rlx.errors import RlxError
from rlx.ir.mir import Graph, Node
from rlx.shape import Shape, Sym, sym

__version__ = "0.1.0"

__all__ = ["DType", "Graph", "Node", "RlxError", "Shape", "Sym", "promote", "sym"]
