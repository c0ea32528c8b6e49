"""Moved to :mod:`rlx.ops.compose.losses` (builders over existing ops). This module re-exports
it so that existing imports keep working; code inside rlx imports
``rlx.ops.compose.losses``."""

from rlx.ops.compose.losses import *  # noqa: F403
from rlx.ops.compose.losses import __all__  # noqa: F401
