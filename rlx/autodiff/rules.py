"""Moved to :mod:`rlx.ops.rules` (the helpers the ops' rules share). This module re-exports it
so that existing imports keep working; code inside rlx imports ``rlx.ops.rules``."""

from rlx.ops.rules import *  # noqa: F403
from rlx.ops.rules import __all__  # noqa: F401
