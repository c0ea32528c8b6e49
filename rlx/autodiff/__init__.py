"""Transforms of MIR graphs: reverse mode (``grad``, ``value_and_grad``, ``vjp``).

Each op's rules (``vjp``, ``jvp``, ``batch``) live beside the op in ``rlx/ops``; the
drivers here walk a graph and call them. ``rules.py`` holds the helpers rules share.
"""

from rlx.autodiff.reverse import backward, grad, value_and_grad, vjp

__all__ = ["backward", "grad", "value_and_grad", "vjp"]
