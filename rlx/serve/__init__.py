"""``rlx serve``: an OpenAI-compatible HTTP server for rlx models (Starlette on uvicorn).

Needs the ``serve`` extra (``pip install 'rlx[serve]'``: starlette, uvicorn,
prometheus_client, jinja2); without it the rest of rlx works and these names raise a
:class:`rlx.errors.ServeError` saying what to install.

- :class:`ServeConfig` (``config.py``): host, port, API key, batching and limits.
- :func:`load_services` (``loading.py``): model arguments (an HF sentence-embedding
  directory, a GGUF file, a known name, optionally ``ID=MODEL``) -> services.
- :func:`create_app` (``app.py``): services + config -> the Starlette app: ``/v1/embeddings``,
  ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``, ``/metrics``.
- :func:`deployment` (``ray.py``): the same app on N Ray Serve replicas (past one
  machine; also needs ``pip install 'rlx[distributed]'``).

One module per job: ``errors.py`` (OpenAI error objects), ``service.py`` (the Service
protocol a model implements), ``metrics.py`` (Prometheus), ``embeddings.py`` (the
embedding service and its cross-request batcher). docs/serving.md is the user's guide.
"""

from __future__ import annotations

import importlib
from typing import Any

from rlx.errors import ServeError

__all__ = ["create_app", "ServeConfig", "load_services", "deployment", "require", "INSTALL"]

INSTALL = "pip install 'rlx[serve]'"

_LAZY = {
    "create_app": "rlx.serve.app",
    "ServeConfig": "rlx.serve.config",
    "load_services": "rlx.serve.loading",
    "deployment": "rlx.serve.ray",
}

#: The packages of the ``serve`` extra, imported by :func:`require`.
PACKAGES = ("starlette", "uvicorn", "prometheus_client", "jinja2")


def require(*modules: str, what: str = "rlx.serve") -> None:
    """Import ``modules`` (default: the whole ``serve`` extra) or raise ServeError naming
    the missing one and the extra to install."""
    for name in modules or PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ServeError(
                f"{what} needs the {name!r} package, which is not installed ({e}); "
                f"install the serve extra: {INSTALL}"
            ) from None


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if name != "ServeConfig":
            require(what=f"rlx.serve.{name}")
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlx.serve' has no attribute {name!r}")
