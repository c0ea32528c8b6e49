"""Moved to :mod:`rlx.source` (source locations sit under every layer: ops record them
too). This module re-exports it so that existing imports keep working; code inside rlx
imports ``rlx.source``."""

from rlx.source import *  # noqa: F403
from rlx.source import __all__  # noqa: F401
