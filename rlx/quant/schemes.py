"""Moved to :mod:`rlx.formats.schemes` (what packed bytes mean). This module re-exports it so
that existing imports keep working; code inside rlx imports ``rlx.formats.schemes``."""

from rlx.formats.schemes import *  # noqa: F403
from rlx.formats.schemes import __all__  # noqa: F401
