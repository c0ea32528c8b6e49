"""Thread counts. In: the thread count a CompiledGraph wants. Out: the process's BLAS
libraries (found by threadpoolctl) set to it; :func:`resolve_threads` turns
``CompileOptions.num_threads`` (None: the default) into a count, the one native kernels
get through ``KernelCtx.num_threads``.

The count is set once and re-set only when a graph wanting a different count runs: a
``threadpool_limits`` context around every run rescans the loaded libraries each time,
which costs far more than a tiny graph's run (see benchmarks/dispatch.py). The setting
stays in effect after the run (it is the process's BLAS setting); code that changes the
BLAS thread count itself between runs should call ``ensure_blas_threads`` again with
``force=True``.
"""

from __future__ import annotations

from typing import Any

from rlx import config
from rlx.errors import CompileError

__all__ = ["ensure_blas_threads", "blas_info", "resolve_threads"]

_controller: Any = None
_current: int | None = None


def _blas_libs() -> list[Any]:
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return [lc for lc in _controller.lib_controllers if lc.user_api == "blas"]


def resolve_threads(requested: int | None) -> int:
    """``requested`` (``CompileOptions.num_threads``), else RLX_NUM_THREADS, else the
    number of physical cores; never more than the CPUs this process may use (a larger
    request is clamped with a RuntimeWarning). CompileError when ``requested`` is not an
    int >= 1 (0 does not mean "the default": pass None for that); ConfigError for a bad
    RLX_NUM_THREADS."""
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise CompileError(
                f"CompileOptions.num_threads must be an int >= 1 or None (the default), "
                f"given {requested!r}"
            )
        return config.clamp_threads(requested, "CompileOptions.num_threads")
    return config.num_threads() or config.physical_cores()


def ensure_blas_threads(n: int, force: bool = False) -> None:
    """Make every BLAS library use ``n`` threads (no-op when this module already set
    ``n``, unless ``force``)."""
    global _current
    if n == _current and not force:
        return
    for lc in _blas_libs():
        lc.set_num_threads(n)
    _current = n


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's description of each BLAS library (kernel, version, threads)."""
    return [lc.info() for lc in _blas_libs()]
