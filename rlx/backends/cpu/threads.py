"""Thread counts. In: the thread count a CompiledGraph wants and the kernels of the
schedule it runs. Out: the process's BLAS libraries (found by threadpoolctl) set to the
count that schedule needs; :func:`resolve_threads` turns ``CompileOptions.num_threads``
(None: the default) into a count, the one native kernels get through
``KernelCtx.num_threads``.

One pool. rlx's native kernels (GEMM, regions, rows, attention, int8, bf16) all run
their threads on libgomp's team (``#pragma omp parallel num_threads(n)``), whose idle
workers spin briefly and then sleep (``GOMP_SPINCOUNT``, set by
:func:`rlx.backends.cpu.native.set_wait_policy`; the figures are in
``rlx/backends/cpu/native/__init__.py``). OpenBLAS has a pool of its own (pthreads whose
idle workers keep spinning for a long time), which takes the cores libgomp's workers need
when both run in turn. So :func:`blas_threads_for` gives BLAS ``num_threads`` only when
the schedule calls BLAS (a kernel of kind ``blas``, or one whose notes say ``BLAS``,
e.g. a BLAS matmul with a native epilogue); a schedule that runs only rlx's own kernels
pins BLAS to one thread, so OpenBLAS's workers never run beside libgomp's. BLAS also gets
one thread when libgomp's workers spin long (:func:`openmp_spins_long`: torch loaded its
``libgomp.so.1`` before rlx, or the user asked for ``ACTIVE``): OpenBLAS's threads taking
turns with spinning libgomp workers made a GEMM + region pair 100x slower, and in
``benchmarks/coexist.py`` rlx's encoder ran ~2x slower after torch and ORT.

The count is set once and re-set only when a graph wanting a different count runs: a
``threadpool_limits`` context around every run rescans the loaded libraries each time,
which costs far more than a tiny graph's run (see benchmarks/dispatch.py). The setting
stays in effect after the run (it is the process's BLAS setting: NumPy matmuls in the
user's code use it too); code that changes the BLAS thread count itself between runs
should call ``ensure_blas_threads`` again with ``force=True``.
"""

from __future__ import annotations

import re
import sys
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from rlx import config
from rlx.errors import CompileError

__all__ = [
    "ensure_blas_threads",
    "blas_info",
    "resolve_threads",
    "calls_blas",
    "blas_threads_for",
    "openmp_spins_long",
    "pool_info",
]

_controller: Any = None
_scanned_at = -1  # len(sys.modules) at the last library scan
_current: int | None = None
_BLAS_NOTE = re.compile(r"\bblas\b", re.IGNORECASE)
_PER_SCHEDULE: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _blas_libs() -> list[Any]:
    """The BLAS libraries loaded in the process. The scan is redone when modules were
    imported since the last one (an import is what loads another BLAS, e.g. scipy's own
    OpenBLAS once scikit-learn or scipy.linalg is imported)."""
    global _controller, _scanned_at
    if _controller is None or len(sys.modules) != _scanned_at:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
        _scanned_at = len(sys.modules)
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


def calls_blas(entries: Iterable[Any]) -> bool:
    """Whether schedule entries (``kind`` and ``notes`` attributes, as
    ``Executor.kernel_entries``) hold a kernel that calls BLAS when it runs."""
    for e in entries:
        if getattr(e.kind, "value", e.kind) == "blas":
            return True
        if any(_BLAS_NOTE.search(n) for n in e.notes):
            return True
    return False


def openmp_spins_long(policy: Mapping[str, Any] | None = None) -> bool:
    """Whether libgomp's idle workers spin longer than rlx's short spin, from
    :func:`rlx.backends.cpu.native.wait_policy`'s record (``policy``): a libgomp another
    module loaded before rlx without the user's variables (so libgomp's default, 300000
    spins, applies), ``OMP_WAIT_POLICY=ACTIVE``, or a ``GOMP_SPINCOUNT`` above
    ``native.SPIN_COUNT``. False before any native library is loaded."""
    from rlx.backends.cpu import native

    rec = native.wait_policy() if policy is None else policy
    if not rec:
        return False
    if rec.get("libgomp_preloaded") and rec.get("set_by_rlx"):
        return True
    if str(rec.get("OMP_WAIT_POLICY") or "").strip().upper() == "ACTIVE":
        return True
    spin = str(rec.get("GOMP_SPINCOUNT") or "").strip().lower()
    if spin in ("infinite", "infinity"):
        return True
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(spin[-1:], 1.0)
    try:
        return spin != "" and float(spin.rstrip("kmgt")) * scale > native.SPIN_COUNT
    except ValueError:
        return False


def blas_threads_for(num_threads: int, executor: Any) -> int:
    """The BLAS thread count a run of ``executor`` (its ``kernel_entries`` and
    ``prologue_entries``) at ``num_threads`` wants: ``num_threads`` when it calls BLAS,
    else 1; also 1 when libgomp's workers spin long (:func:`openmp_spins_long`: then
    OpenBLAS's threads beside them are the slow case measured in
    ``native/__init__.py``). See the module docstring. Worked out once per executor."""
    uses = _PER_SCHEDULE.get(executor)
    if uses is None:
        entries = [*executor.kernel_entries, *getattr(executor, "prologue_entries", ())]
        uses = calls_blas(entries)
        try:
            _PER_SCHEDULE[executor] = uses
        except TypeError:  # not weak-referenceable: work it out each time
            pass
    return num_threads if uses and not openmp_spins_long() else 1


def ensure_blas_threads(n: int, force: bool = False) -> None:
    """Make every BLAS library use ``n`` threads (no-op when this module already set
    ``n``, unless ``force``)."""
    global _current
    if n == _current and not force and len(sys.modules) == _scanned_at:
        return
    for lc in _blas_libs():
        lc.set_num_threads(n)
    _current = n


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's description of each BLAS library (kernel, version, threads)."""
    return [lc.info() for lc in _blas_libs()]


def pool_info() -> dict[str, Any]:
    """The thread pools as this process has them: the OpenMP wait policy rlx found and
    set (:func:`rlx.backends.cpu.native.set_wait_policy`'s record, empty before the first
    native library loads), the OpenMP libraries threadpoolctl sees, and the BLAS ones
    with their thread counts."""
    from threadpoolctl import threadpool_info

    from rlx.backends.cpu import native

    libs = threadpool_info()  # a fresh scan: libraries loaded since the first one count
    return {
        "wait_policy": native.wait_policy(),
        "openmp": [i for i in libs if i.get("user_api") == "openmp"],
        "blas": [i for i in libs if i.get("user_api") == "blas"],
    }
