"""Which threading runtime the native kernels run on, and the compiler flags for it.

In: ``RLX_OPENMP`` (``rlx.config.openmp()``) and what the compiler can do. Out: a
:class:`ThreadRuntime` and the flags that select it (:func:`build_flags`, used by the
run-time build and the install-time one alike).

- ``OPENMP``: the compiler's own runtime, ``-fopenmp`` (libgomp with gcc, libomp with a
  clang that has it). gcc always has libgomp.
- ``POOL``: rlx's own (``csrc/rlx_omp.c``), for a clang without libomp (Apple's clang,
  or clang-14 without libomp-dev): the kernels are compiled with ``-Xclang -fopenmp``
  (clang's OpenMP lowering, which calls the libomp ABI: ``__kmpc_fork_call`` & co.) and
  ``-Iomp_shim`` (rlx's ``omp.h``, copied into the build directory, so the flags and the
  cache key do not name the package's path), linking no runtime; ``librlx_omp`` serves
  those calls with a persistent pthread pool and is loaded with ``RTLD_GLOBAL`` before
  any kernel library (``native.load``). No ``#pragma omp`` of ``csrc/`` changes.
- ``NONE``: neither: every pragma is ignored and each kernel runs on its caller's thread.

This module imports only the standard library, ``rlx.config`` and ``native/cpu.py``
(``setup.py`` loads ``prebuilt.py``, which imports it, before NumPy is installed).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rlx.backends.cpu.native.cpu import Isa, TargetSpec, gcc_flags

__all__ = [
    "ThreadRuntime",
    "SHIM_HEADER",
    "SHIM_SOURCE",
    "POOL_LIBRARY",
    "shim_flags",
    "build_flags",
    "runtime_of_flags",
    "prepare_build_dir",
    "probe_shim",
]

_CSRC = Path(__file__).with_name("csrc")
#: rlx's omp.h (the directory the ``-I`` flag names is created beside each build)
SHIM_HEADER = _CSRC / "omp_shim" / "omp.h"
#: the pool's C source
SHIM_SOURCE = _CSRC / "rlx_omp.c"
#: the pool library's name for ``native.build``
POOL_LIBRARY = "rlx_omp"
_INCLUDE_DIR = "omp_shim"


class ThreadRuntime(enum.Enum):
    """The runtime the kernels' ``#pragma omp`` run on (its value is what ``rlx info``
    prints)."""

    OPENMP = "openmp"
    POOL = "rlx pool"
    NONE = "none"


@functools.cache
def _header_hash() -> str:
    return hashlib.sha256(SHIM_HEADER.read_bytes()).hexdigest()[:16]


def shim_flags() -> tuple[str, ...]:
    """The options that compile ``#pragma omp`` for rlx's pool: clang's OpenMP front end
    without its runtime, rlx's ``omp.h`` (a directory relative to the build's working
    directory: :func:`prepare_build_dir`; its hash is a ``-D`` so it is part of every
    cache key), ``-pthread``; on macOS the ``__kmpc_*``
    references are left to the loader (``-undefined dynamic_lookup``)."""
    out = ("-Xclang", "-fopenmp", f"-I{_INCLUDE_DIR}", f"-DRLX_OMP_H={_header_hash()}", "-pthread")
    if sys.platform == "darwin":
        out += ("-Wl,-undefined,dynamic_lookup",)
    return out


def build_flags(spec: TargetSpec, isa: Isa | None, runtime: ThreadRuntime) -> tuple[str, ...]:
    """Every option (no compiler, source or output) a native library is built with for
    target ``spec``, int8 GEMM path ``isa`` and threading ``runtime``: ``gcc_flags`` with
    ``-fopenmp`` for ``OPENMP``, plus :func:`shim_flags` for ``POOL``."""
    base = gcc_flags(spec, isa, runtime is ThreadRuntime.OPENMP)
    return base + shim_flags() if runtime is ThreadRuntime.POOL else base


def runtime_of_flags(flags: list[str] | tuple[str, ...]) -> ThreadRuntime:
    """The runtime a library built with ``flags`` calls (as :func:`build_flags` made them)."""
    if "-Xclang" in flags and "-fopenmp" in flags:
        return ThreadRuntime.POOL
    return ThreadRuntime.OPENMP if "-fopenmp" in flags else ThreadRuntime.NONE


def prepare_build_dir(directory: Path) -> None:
    """Put rlx's ``omp.h`` where :func:`shim_flags`' ``-I`` finds it when the compiler runs
    in ``directory``."""
    inc = Path(directory, _INCLUDE_DIR)
    inc.mkdir(exist_ok=True)
    shutil.copyfile(SHIM_HEADER, inc / "omp.h")


_PROBE = """#include <omp.h>
int rlx_probe(int n) {
    int s = 0;
#pragma omp parallel for num_threads(2) reduction(+ : s) schedule(dynamic, 1)
    for (int i = 0; i < n; i++) s += i + omp_get_thread_num() * 0;
    return s;
}
"""


def probe_shim(cc: str) -> bool:
    """Whether ``cc`` compiles OpenMP code for rlx's pool (clang's ``-Xclang -fopenmp``;
    gcc refuses ``-Xclang``). False also when no temporary directory is usable."""
    try:
        with tempfile.TemporaryDirectory() as d:
            prepare_build_dir(Path(d))
            Path(d, "t.c").write_text(_PROBE)
            r = subprocess.run(
                [cc, "-O1", "-fPIC", "-shared", *shim_flags(), "t.c", "-o", "t.so"],
                cwd=d,
                capture_output=True,
                check=False,
            )
            return r.returncode == 0
    except OSError:
        return False
