"""``rlx.onnx``: the ONNX importer, ``import rlx.onnx`` and ``from rlx.onnx import load``.

The same module object as ``rlx.frontends.onnx`` (which documents it); needs the ``onnx``
extra, and names it in a ModelError when it is missing."""

from __future__ import annotations

import sys

from rlx.frontends import onnx as _impl

sys.modules[__name__] = _impl
