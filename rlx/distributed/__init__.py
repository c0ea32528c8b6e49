"""rlx on an existing distributed engine, never its own: Ray Data for corpus-scale embedding
and torch.distributed (gloo, CPU) for data-parallel training. Needs the ``distributed``
extra (``pip install 'rlx[distributed]'``: ray[data], pyarrow, torch); without it the rest
of rlx works and these names raise a :class:`rlx.errors.DistributedError` saying what to
install.

- :func:`embed` (``embedding.py``): text files or a ``ray.data.Dataset`` -> embedding shards
  (Parquet or .npy) plus ``manifest.json``, every input row exactly once.
- :func:`read_embeddings` (``io.py``): an output directory -> ids and the ``[n, dim]``
  matrix, sorted by (source, row).
- :class:`DataParallel` / :func:`run_data_parallel` (``ddp.py``): one compiled gradient
  graph per rank, gradients all-reduced and averaged, the same update on every rank.
"""

from __future__ import annotations

import importlib
from typing import Any

from rlx.errors import DistributedError

__all__ = ["embed", "read_embeddings", "DataParallel", "run_data_parallel", "require"]

INSTALL = "pip install 'rlx[distributed]'"

_LAZY = {
    "embed": "rlx.distributed.embedding",
    "read_embeddings": "rlx.distributed.io",
    "DataParallel": "rlx.distributed.ddp",
    "run_data_parallel": "rlx.distributed.ddp",
}


def require(*modules: str, what: str = "rlx.distributed") -> None:
    """Import ``modules`` or raise DistributedError naming the missing one and the extra."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise DistributedError(
                f"{what} needs the {name!r} package, which is not installed ({e}); "
                f"install the distributed extra: {INSTALL}"
            ) from None


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        what = f"rlx.distributed.{name}"
        if name in ("DataParallel", "run_data_parallel"):
            require("torch", "torch.distributed", what=what)
        elif name == "read_embeddings":
            require("pyarrow", what=what)
        else:
            require("ray", "pyarrow", "ray.data", what=what)
        module = importlib.import_module(_LAZY[name])
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlx.distributed' has no attribute {name!r}")
