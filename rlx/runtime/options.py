"""Moved to :mod:`rlx.options` (the compile knobs, under every layer). This module re-exports
it so that existing imports keep working; code inside rlx imports ``rlx.options``."""

from rlx.options import *  # noqa: F403
from rlx.options import __all__  # noqa: F401
