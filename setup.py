"""setuptools hook: prebuild rlx's fixed native kernel libraries at install time.

Everything else about the package is in pyproject.toml. ``build_py`` (run by ``pip
install .`` and, in editable mode, by ``pip install -e .``) compiles every fixed library
of ``rlx/backends/cpu/native/csrc`` for every target gcc can build here into
``rlx/backends/cpu/native/_prebuilt/<target>/`` (the build directory for a wheel, the
source tree for an editable install) with a manifest; see
``rlx/backends/cpu/native/prebuilt.py``. Without gcc, or when a build fails, the install
still succeeds and rlx builds those libraries at run time, as before.

Set ``RLX_NO_PREBUILD=1`` to skip the step.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "rlx" / "backends" / "cpu" / "native"


@contextlib.contextmanager
def _prebuilt_module() -> Iterator[types.ModuleType]:
    """``rlx.backends.cpu.native.prebuilt`` loaded from the source tree without running the
    package ``__init__`` files (they import NumPy, which the build environment lacks); the
    bare packages stay in ``sys.modules`` while the block runs (the module imports the
    codegen prelude lazily), then the previous modules are restored."""
    saved = {k: v for k, v in sys.modules.items() if k == "rlx" or k.startswith("rlx.")}
    for k in saved:
        del sys.modules[k]
    try:
        for pkg in ("rlx", "rlx.backends", "rlx.backends.cpu", "rlx.backends.cpu.codegen",
                    "rlx.backends.cpu.native"):  # fmt: skip
            mod = types.ModuleType(pkg)
            mod.__path__ = [str(ROOT.joinpath(*pkg.split(".")))]
            sys.modules[pkg] = mod
        spec = importlib.util.spec_from_file_location(
            "rlx.backends.cpu.native.prebuilt", NATIVE / "prebuilt.py"
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        yield mod
    finally:
        for k in [k for k in sys.modules if k == "rlx" or k.startswith("rlx.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prebuild(out_dir: Path) -> None:
    """Build the fixed libraries into ``out_dir``; never raises (the install goes on and
    rlx builds at run time)."""
    if os.environ.get("RLX_NO_PREBUILD", "") not in ("", "0"):
        _log("rlx: RLX_NO_PREBUILD is set: native kernel libraries are built at run time")
        return
    t0 = time.perf_counter()
    try:
        if out_dir.exists():
            shutil.rmtree(out_dir)
        with _prebuilt_module() as pre:
            st = pre.build_all(out_dir, shutil.which("gcc"), log=_log)
        _log(f"rlx: native prebuild took {time.perf_counter() - t0:.1f} s, built {st['built']}")
    except Exception as e:  # noqa: BLE001  (the install must succeed without prebuilt libraries)
        _log(
            f"rlx: native kernel libraries NOT prebuilt ({type(e).__name__}: {e}); rlx will "
            "build them with gcc at run time instead (slower first compile)"
        )


class BuildPyWithNative(build_py):
    """``build_py`` plus the native prebuild (into the source tree when editable)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            out = NATIVE / "_prebuilt"
        else:
            out = Path(self.build_lib) / "rlx" / "backends" / "cpu" / "native" / "_prebuilt"
        prebuild(out)


class BinaryDistribution(Distribution):
    """The package holds native libraries (``_prebuilt``): its wheel is tagged for this
    platform, not ``any``."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildPyWithNative}, distclass=BinaryDistribution)
