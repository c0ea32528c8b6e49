"""The op registry. Importing this package registers every built-in op.

Each module holds a family of ops, one registered class per op (see ``base.py``)."""

from rlx.ops import core, elementwise  # noqa: F401  (registration side effects)
from rlx.ops.base import OPS, Op, OpKind, RefCtx, register

__all__ = ["OPS", "Op", "OpKind", "RefCtx", "register"]
