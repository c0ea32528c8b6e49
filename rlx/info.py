"""The environment summary: what rlx runs on and which paths it will take.

In: nothing (the machine, the installed libraries and the ``RLX_*`` settings, read through
:mod:`rlx.config`). Out: :func:`info` returns an :class:`Info`: named sections of
``(key, value)`` lines; ``str(info())`` is what ``rlx info`` / ``python -m rlx info``
prints and :meth:`Info.as_dict` what ``rlx info --json`` prints.

Sections: rlx and Python; NumPy and the BLAS libraries it loaded (through threadpoolctl:
kernel, version, threads); the CPU (model, the flags native code cares about); native code
(the selected instruction-set target and why, gcc, OpenMP, the native cache directory and
its size, which fixed kernel libraries were prebuilt at install time and which are built at
run time into the cache, and where this process got the ones it loaded); the ``RLX_*`` settings in effect; threads (the default count, the CPUs, the
OpenMP wait policy). A part that cannot be determined
(no gcc, an invalid ``RLX_*`` value, an unusable cache directory) says why in its line
instead of failing the whole summary.
"""

from __future__ import annotations

import platform
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Info", "info", "cpu_model", "RELEVANT_FLAGS", "RELEVANT_FLAGS_ARM"]

#: /proc/cpuinfo flags that decide the native paths (AVX2 target, AVX-512 target, the
#: VNNI int8 GEMM and the BF16 dot products).
RELEVANT_FLAGS: tuple[str, ...] = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
)
#: the same on aarch64 (HWCAP names: the NEON, DOTPROD and I8MM targets)
RELEVANT_FLAGS_ARM: tuple[str, ...] = ("asimd", "asimddp", "i8mm", "bf16")


@dataclass(frozen=True)
class Info:
    """The environment summary: ``sections`` maps a section title to ``(key, value)``
    lines, in print order. ``section(title)`` gives one as a dict."""

    sections: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]

    def section(self, title: str) -> dict[str, str]:
        """The lines of section ``title`` as a dict (KeyError for an unknown title)."""
        for t, lines in self.sections:
            if t == title:
                return dict(lines)
        raise KeyError(f"no section {title!r}; sections: {[t for t, _ in self.sections]}")

    def as_dict(self) -> dict[str, dict[str, str]]:
        """Every section as ``{title: {key: value}}`` (JSON-ready)."""
        return {t: dict(lines) for t, lines in self.sections}

    def __str__(self) -> str:
        width = max((len(k) for _, lines in self.sections for k, _ in lines), default=0)
        out: list[str] = []
        for title, lines in self.sections:
            out.append(f"{title}:")
            out += [f"  {k:<{width}}  {v}" for k, v in lines]
        return "\n".join(out)


def _safe(fn: Callable[[], Any]) -> str:
    """``str(fn())``, or ``'unavailable: <why>'`` when it raises."""
    try:
        return str(fn())
    except Exception as e:  # a summary line must not take the summary down
        msg = getattr(e, "bare_message", None) or str(e) or type(e).__name__
        return f"unavailable: {msg.splitlines()[0]}"


def _rlx_python() -> tuple[tuple[str, str], ...]:
    import rlx

    return (
        ("rlx", rlx.__version__),
        ("python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("executable", sys.executable),
        ("platform", platform.platform()),
    )


def _numpy_blas() -> tuple[tuple[str, str], ...]:
    import numpy as np

    lines = [("numpy", np.__version__)]
    try:
        from threadpoolctl import threadpool_info

        libs = [d for d in threadpool_info() if d.get("user_api") == "blas"]
    except Exception as e:  # threadpoolctl missing or failing: say so
        return (*lines, ("blas", f"unavailable: {e}"))
    if not libs:
        lines.append(("blas", "none loaded"))
    for i, d in enumerate(libs):
        key = "blas" if len(libs) == 1 else f"blas[{i}]"
        arch = f", {d['architecture']}" if d.get("architecture") else ""
        layer = f", threading {d['threading_layer']}" if d.get("threading_layer") else ""
        lines.append(
            (
                key,
                f"{d.get('internal_api')} {d.get('version')}{arch}{layer}, "
                f"{d.get('num_threads')} threads ({d.get('filepath')})",
            )
        )
    return tuple(lines)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows of it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu() -> tuple[tuple[str, str], ...]:
    from rlx.backends.cpu import native

    flags = native.cpu_flags()
    arm = native.machine_arch() is native.Arch.AARCH64
    relevant = RELEVANT_FLAGS_ARM if arm else RELEVANT_FLAGS
    have = [f for f in relevant if f in flags]
    lack = [f for f in relevant if f not in flags]
    return (
        ("model", cpu_model()),
        ("machine", platform.machine()),
        ("flags", " ".join(have) or "none of the relevant ones"),
        ("missing", " ".join(lack) or "none"),
    )


def _native() -> tuple[tuple[str, str], ...]:
    from rlx.backends.cpu import native
    from rlx.backends.cpu.native import prebuilt

    def cache() -> str:
        ci = native.cache_info()
        return (
            f"{ci.dir}: {ci.libraries} libraries, {_mib(ci.bytes)} "
            f"(pruned above {_mib(ci.max_bytes)})"
        )

    return (
        ("target", _safe(lambda: native.selected_target().value)),
        ("why", _safe(native.target_description)),
        ("gcc", _safe(lambda: f"{native.gcc_version()} ({native.gcc_path()})")),
        ("openmp", _safe(lambda: "yes" if native.openmp_supported() else "no")),
        ("threads", _safe(native.thread_runtime_description)),
        ("cache", _safe(cache)),
        ("prebuilt", _safe(lambda: prebuilt.describe(native.selected_target()))),
        ("loaded from", _safe(prebuilt.describe_loaded)),
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _settings() -> tuple[tuple[str, str], ...]:
    from rlx import config

    return (
        ("RLX_VERBOSE", _safe(config.verbose)),
        ("RLX_CACHE_DIR", _safe(config.cache_dir)),
        ("RLX_NUM_THREADS", _safe(lambda: config.num_threads() or "unset (default)")),
        ("RLX_VERIFY", _safe(lambda: config.verify_mode() or "unset (default)")),
        ("RLX_ISA", _safe(config.isa)),
        ("RLX_CC", _safe(config.cc)),
        ("RLX_CACHE_MAX_MB", _safe(lambda: config.cache_max_bytes() // 2**20)),
    )


def _threads() -> tuple[tuple[str, str], ...]:
    from rlx import config
    from rlx.backends.cpu.threads import resolve_threads

    return (
        ("default", _safe(lambda: resolve_threads(None))),
        ("available cpus", _safe(config.available_cpus)),
        ("physical cores", _safe(config.physical_cores)),
        ("openmp wait", _safe(_omp_wait)),
    )


def _omp_wait() -> str:
    """The OpenMP wait policy (see rlx.backends.cpu.native.set_wait_policy)."""
    import os

    from rlx.backends.cpu import native

    rec = native.wait_policy()
    if not rec:
        user = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}
        if user:
            return f"the user's {user} (no native library loaded yet)"
        return f"GOMP_SPINCOUNT={native.SPIN_COUNT} when the first native library loads"
    how = "set by rlx" if rec["set_by_rlx"] else "the user's"
    vals = ", ".join(f"{k}={rec[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if rec[k])
    pre = ""
    if rec["libgomp_preloaded"]:
        pre = "; libgomp was loaded before rlx (its own settings apply)"
    return f"{vals} ({how}){pre}"


def info() -> Info:
    """The environment summary (see the module docstring); ``print(rlx.info())``."""
    parts: list[tuple[str, Callable[[], tuple[tuple[str, str], ...]]]] = [
        ("rlx", _rlx_python),
        ("numpy / BLAS", _numpy_blas),
        ("cpu", _cpu),
        ("native code", _native),
        ("settings (RLX_*, in effect)", _settings),
        ("threads", _threads),
    ]
    sections = []
    for title, fn in parts:
        try:
            lines = fn()
        except Exception as e:  # one broken section must not hide the others
            lines = (("error", f"unavailable: {e}"),)
        sections.append((title, lines))
    return Info(tuple(sections))


class _CallableModule(types.ModuleType):
    """Importing ``rlx.info`` (the CLI does) binds the *module* to ``rlx.info``, shadowing
    the function of the same name that ``rlx.info()`` means; calling the module therefore
    does what the function does."""

    def __call__(self) -> Info:
        return info()


sys.modules[__name__].__class__ = _CallableModule
