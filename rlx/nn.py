"""``rlx.nn``: neural-network functions over values traced by ``rlx.jit`` (``jax.nn``
shaped): activations, softmax, normalisations and dot-product attention. The functions
live in :mod:`rlx.frontends.trace.nn_fns`; this module is their public face."""

from __future__ import annotations

from rlx.frontends.trace.nn_fns import *  # noqa: F403
from rlx.frontends.trace.nn_fns import __all__ as __all__  # noqa: PLC0414
