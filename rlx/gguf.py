"""``rlx.gguf``: GGUF files, ``import rlx.gguf`` and ``from rlx.gguf import load, save``.

The same module object as ``rlx.frontends.gguf`` (which documents it); needs the ``llm``
extra, and names it in a ModelError when it is missing."""

from __future__ import annotations

import sys

from rlx.frontends import gguf as _impl

sys.modules[__name__] = _impl
