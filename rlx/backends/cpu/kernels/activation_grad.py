"""CPU kernels of the activations' backward ops (:mod:`rlx.ops.activation_grad`): each op's
lowering (``ct`` where ``y > 0``; ``ct * f'(v)``) as one generated C loop, the NumPy
region kernel where that cannot be built (``engines/lowered.py``)."""

from __future__ import annotations

from rlx.backends.cpu.engines.lowered import lowered_numpy_kernel, lowered_region_kernel
from rlx.ops.activation_grad import ActivationBackward, ReluBackward

__all__: list[str] = []

# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    ReluBackward: (lowered_region_kernel, lowered_numpy_kernel),
    ActivationBackward: (lowered_region_kernel, lowered_numpy_kernel),
}
