"""The tracing front end: ``rlx.jit``, ``rlx.numpy``, ``rlx.nn`` and traced control flow.

In: Python functions written with NumPy-shaped calls. Out: MIR graphs (one per input
signature), compiled and cached by :func:`jit`.

* ``tracer.py``: the trace being built, lifting Python values into it, weak typing;
* ``values.py``: :class:`Traced` (operators, methods) and the elementwise builders;
* ``indexing.py``: ``x[...]`` as slice / gather / reshape;
* ``numpy_math.py``, ``numpy_shape.py``: the ``rlx.numpy`` functions; ``nn_fns.py``:
  ``rlx.nn``;
* ``control.py``: ``cond`` / ``while_loop`` / ``scan`` as If / While / Scan;
* ``pytree.py``: flattening nests of tuples, lists and dicts;
* ``jit.py``: the per-signature cache, ``lower`` / ``inspect``.
* ``transforms.py``: ``rlx.grad`` / ``value_and_grad`` / ``jvp`` / ``vjp`` / ``vmap`` of
  Python functions (the graph transforms of :mod:`rlx.autodiff`, inlined into the trace).

Every function maps to ops of the IR's registry; there is no second op vocabulary.
"""

from rlx.frontends.trace.control import cond, scan, while_loop
from rlx.frontends.trace.jit import Jitted, Lowered, freeze, jit
from rlx.frontends.trace.values import Traced

__all__ = ["jit", "Jitted", "Lowered", "Traced", "cond", "while_loop", "scan", "freeze"]
