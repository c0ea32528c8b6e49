"""The fixed kernel libraries, built once at install time per target. In: the C sources
in ``csrc/`` and the build targets of ``native/cpu.py``. Out: the list of fixed libraries
(:func:`fixed_libraries`), the install-time build into ``_prebuilt/<target>/``
(:func:`build_all`, run by ``setup.py``), and the run-time lookup :func:`find`, which
:func:`rlx.backends.cpu.native.build` asks before it runs gcc.

Fixed libraries are the ones whose source is a file set of ``csrc/`` (sgemm, attention
f32 / bf16 / f16, the int8 GEMM per int8 path, the dequant GEMMs, the bf16 / f16 casts
and GEMMs, conv, the norm / attention / max-pool backward kernels, Adam, the FMA peak
probe). Generated regions, row kernels and native schedules are built by gcc at run
time into the cache as before.

Layout. ``_prebuilt/<target>/lib<name>.so`` (``lib<name>-<int8 path>.so`` for the int8
GEMM) and ``_prebuilt/<target>/manifest.json``: for each library its name, int8 path,
file, the sha256 of its source text, the gcc options it was built with
(:func:`rlx.backends.cpu.native.cpu.gcc_flags`, the run-time build's) and the sha256 of
the built file; plus the compiler's version. ``_prebuilt/status.json`` says what the
install-time build did (``built`` targets, ``skipped`` ones and why, or why nothing was
built). The directory is build output (``.gitignore``\\ d).

Use. :func:`find` returns the prebuilt library when the manifest of the target has an
entry of that name and int8 path whose source hash equals the source being built and
whose options equal the ones the run-time build would use now (same target flags, so
the same VNNI / BF16 choice on this CPU). Anything else (an edited csrc file, other
flags, a target not built at install) returns None and the caller builds into the cache
as before. :func:`verify` re-hashes the file against the manifest before it is loaded.

This module imports only the standard library and ``native/cpu.py`` (with
``rlx.config`` / ``rlx.errors``) and the codegen prelude: ``setup.py`` loads it before
NumPy is installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rlx.backends.cpu.native.cpu import (
    Isa,
    Target,
    gcc_flags,
    isas_for,
    machine_arch,
    target_spec,
    targets_of,
)
from rlx.backends.cpu.native.omp_shim import (
    POOL_LIBRARY,
    SHIM_SOURCE,
    ThreadRuntime,
    prepare_build_dir,
    probe_shim,
    runtime_of_flags,
    shim_flags,
)

__all__ = [
    "CSRC",
    "PREBUILT_DIR",
    "QGEMM_SOURCES",
    "DQGEMM_SOURCES",
    "FixedLib",
    "LibStatus",
    "csrc_source",
    "sgemm_source",
    "attention_source",
    "fixed_libraries",
    "source_hash",
    "find",
    "verify",
    "is_prebuilt",
    "status",
    "install_status",
    "record_origin",
    "loaded_sources",
    "describe",
    "gcc_key",
    "gcc_facts",
    "probe_openmp",
    "describe_loaded",
    "build_all",
]

CSRC = Path(__file__).with_name("csrc")
#: where the install-time build puts its libraries (inside the package)
PREBUILT_DIR = Path(__file__).with_name("_prebuilt")
MANIFEST = "manifest.json"
STATUS = "status.json"
FORMAT = 1

#: the int8 GEMM's C files, concatenated in this order
QGEMM_SOURCES = ("qgemm.c", "qgemm_kernels.c", "qgemm_epilogue.c", "qgemm_run.c")
#: the dequant GEMM's C files, concatenated in this order (see ``csrc/dqgemm.c``)
DQGEMM_SOURCES = (
    "dqgemm_decode.c",
    "dqgemm_rows.c",
    "dqgemm_rows_gguf.c",
    "dqgemm.c",
    "dqgemm_small.c",
    "dqgemm_q8.c",
    "dqgemm_q8_group.c",
    "dqgemm_q8dig.c",
    "dqgemm_bf16dot.c",
)
#: libraries of plain csrc file sets: name -> (files, text put before them)
_CSRC_LIBS: dict[str, tuple[tuple[str, ...], str]] = {
    "dqgemm": (DQGEMM_SOURCES, ""),
    "dqprefill": (("dqgemm_prefill.c", "dqgemm_prefill_q8.c"), ""),
    "lowp": (("lowp_cast.c", "lowp_gemm.c"), ""),
    "conv": (("conv.c", "conv_dw.c"), ""),
    "conv_nchwc": (
        ("conv_nchwc.c", "conv_winograd.c", "conv_pointwise.c", "conv_dw_nchwc.c"),
        "",
    ),
    "adam_update": (("adam_update.c",), ""),
    "norm_grad": (("norm_grad.c",), ""),
    "attention_grad": (("attention_vec.c", "attention_grad.c"), "#define RLX_ATT_DT 0\n"),
    "maxpool2d_grad": (("maxpool2d_grad.c",), ""),
    "half_linear": (("half_linear.c",), ""),
}
#: attention element type code (``RLX_ATT_DT``) -> library name
_ATTENTION = {0: "attention", 1: "attention_bfloat16", 2: "attention_float16"}

_lock = threading.Lock()
_manifests: dict[Path, dict[tuple[str, str | None], dict[str, object]]] = {}
_verified: dict[Path, bool] = {}
_origins: dict[str, str] = {}
_warned: list[str] = []


def csrc_source(*files: str) -> str:
    """The C source text of ``csrc/<files>`` joined in order (one translation unit), each
    ``#include "<name>.h"`` line replaced by ``csrc/<name>.h`` (so a shared header is part
    of the text that is hashed)."""
    import re

    text = "\n".join((CSRC / f).read_text() for f in files)
    return re.sub(
        r'^#include "([A-Za-z0-9_]+\.h)"$',
        lambda m: (CSRC / m.group(1)).read_text(),
        text,
        flags=re.M,
    )


def sgemm_source(vector_math: bool) -> str:
    """The packed SGEMM's source: the codegen prelude (with the SIMD math declarations when
    glibc's libmvec is loaded, ``vector_math``) and ``csrc/sgemm.c``."""
    from rlx.backends.cpu.codegen.prelude import PRELUDE, vector_math_decls

    head = PRELUDE
    if vector_math:
        head = PRELUDE.replace("#include <math.h>\n", "#include <math.h>\n" + vector_math_decls())
    return head + csrc_source("sgemm.c")


def attention_source(code: int) -> str:
    """The attention library's source for element type ``code`` (0 f32, 1 bf16, 2 f16)."""
    return f"#define RLX_ATT_DT {code}\n" + csrc_source(
        "attention_vec.c", "attention.c", "cache_attention.c"
    )


@dataclass(frozen=True)
class FixedLib:
    """One fixed library: the ``name`` :func:`rlx.backends.cpu.native.build` is given, its
    C ``source`` and its int8 GEMM path ``isa`` (None: built for the target alone)."""

    name: str
    source: str
    isa: Isa | None = None

    @property
    def file(self) -> str:
        """The file name in ``_prebuilt/<target>/``."""
        suffix = "" if self.isa is None else f"-{self.isa.name.lower()}"
        return f"lib{self.name}{suffix}.so"


def _libmvec() -> bool:
    """Whether glibc's libmvec is usable here (``codegen.prelude.simd_math``, as
    ``engines.region.vector_math_available`` finds)."""
    from rlx.backends.cpu.codegen.prelude import simd_math

    return bool(simd_math())


def fixed_libraries(target: Target, vector_math: bool | None = None) -> tuple[FixedLib, ...]:
    """Every fixed library built for ``target`` (``vector_math``: whether the SGEMM
    source declares libmvec's SIMD math; default: whether libmvec loads here)."""
    vm = _libmvec() if vector_math is None else vector_math
    libs = [FixedLib("sgemm", sgemm_source(vm))]
    for code, name in _ATTENTION.items():
        if code == 2 and target is Target.PORTABLE:
            continue  # f16 attention needs F16C (x86-64) or aarch64's FCVT
        libs.append(FixedLib(name, attention_source(code)))
    qsrc = csrc_source(*QGEMM_SOURCES)
    libs += [FixedLib("qgemm", qsrc, isa) for isa in isas_for(target)]
    for name, (files, defines) in _CSRC_LIBS.items():
        libs.append(FixedLib(name, defines + csrc_source(*files)))
    libs.append(FixedLib("fma_peak", (CSRC / "fma_peak.c").read_text()))
    libs.append(FixedLib(POOL_LIBRARY, SHIM_SOURCE.read_text()))
    return tuple(libs)


def source_hash(source: str) -> str:
    """sha256 (hex) of a library's source text, as the manifest records it."""
    return hashlib.sha256(source.encode()).hexdigest()


def _file_hash(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _manifest(tdir: Path) -> dict[tuple[str, str | None], dict[str, object]]:
    """The entries of ``tdir/manifest.json`` by (name, int8 path name); empty when the file
    is missing or unreadable. Read once per process and directory."""
    with _lock:
        got = _manifests.get(tdir)
    if got is not None:
        return got
    out: dict[tuple[str, str | None], dict[str, object]] = {}
    try:
        data = json.loads((tdir / MANIFEST).read_text())
        if data.get("format") == FORMAT:
            for e in data["libraries"]:
                out[(str(e["name"]), e.get("isa"))] = e
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        out = {}
    with _lock:
        _manifests[tdir] = out
    return out


def _expected_flags(target: Target, isa: Isa | None, runtime: ThreadRuntime) -> list[str]:
    # as omp_shim.build_flags, through this module's gcc_flags (tests override it)
    pool = shim_flags() if runtime is ThreadRuntime.POOL else ()
    return [*gcc_flags(target_spec(target), isa, runtime is ThreadRuntime.OPENMP), *pool]


def find(
    source: str, isa: Isa | None, target: Target, name: str, runtime: ThreadRuntime | None = None
) -> Path | None:
    """The prebuilt library for this build request, or None (then it is built at run time):
    an entry of ``name`` and ``isa`` in ``target``'s manifest, built from exactly
    ``source`` with exactly the options the run-time build would use (for the threading
    ``runtime``; None: the one the entry was built for), whose file exists."""
    tdir = PREBUILT_DIR / target.value
    entry = _manifest(tdir).get((name, None if isa is None else isa.name))
    if entry is None or entry.get("source_sha256") != source_hash(source):
        return None
    flags = entry.get("flags")
    if not isinstance(flags, list):
        return None
    want = runtime_of_flags(flags) if runtime is None else runtime
    if flags != _expected_flags(target, isa, want):
        return None
    path = tdir / str(entry.get("file"))
    return path if path.is_file() else None


def is_prebuilt(path: Path) -> bool:
    """Whether ``path`` is a library of the prebuilt directory."""
    return Path(path).parent.parent == PREBUILT_DIR


def verify(path: Path) -> bool:
    """Whether the prebuilt ``path`` has the sha256 its manifest records (checked once
    per process)."""
    path = Path(path)
    with _lock:
        if path in _verified:
            return _verified[path]
    want = {str(e.get("file")): e.get("sha256") for e in _manifest(path.parent).values()}
    ok = want.get(path.name) is not None and _file_hash(path) == want[path.name]
    with _lock:
        _verified[path] = ok
    return ok


def record_origin(name: str, isa: Isa | None, origin: str) -> None:
    """Note where this process got library ``name`` from (``prebuilt`` or ``cache``)."""
    key = name if isa is None else f"{name}-{isa.name.lower()}"
    with _lock:
        _origins[key] = origin


def loaded_sources() -> dict[str, str]:
    """``{library: "prebuilt" | "cache"}`` for every native library this process built or
    found (generated regions, rows and schedules are ``cache``)."""
    with _lock:
        return dict(_origins)


def install_status() -> dict[str, object]:
    """What the install-time build recorded (``_prebuilt/status.json``); empty when it did
    not run (a source checkout used without ``pip install``)."""
    try:
        data = json.loads((PREBUILT_DIR / STATUS).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def warn_if_install_build_failed() -> None:
    """Once per process: a RuntimeWarning when the install-time build ran and built
    nothing (gcc missing, or every build failed), saying libraries are built at run time."""
    with _lock:
        if _warned:
            return
        _warned.append("checked")
    st = install_status()
    if not st or st.get("built"):
        return
    warnings.warn(
        f"rlx: the native kernel libraries were not built at install time "
        f"({st.get('reason', 'unknown reason')}); they are built by gcc at run time into "
        "the cache instead (slower first compile). Reinstall rlx with gcc on PATH to "
        "prebuild them.",
        RuntimeWarning,
        stacklevel=4,
    )


@dataclass(frozen=True)
class LibStatus:
    """Where a fixed library of a target comes from: ``prebuilt`` (its manifest entry
    matches the sources and options), ``stale`` (a prebuilt file exists but the source or
    options changed since install: built at run time) or ``missing`` (not prebuilt)."""

    name: str
    state: str
    file: Path | None


def status(target: Target, vector_math: bool | None = None) -> list[LibStatus]:
    """:class:`LibStatus` of every fixed library of ``target`` (nothing is built)."""
    out = []
    man = _manifest(PREBUILT_DIR / target.value)
    for lib in fixed_libraries(target, vector_math):
        label = lib.file.removeprefix("lib").removesuffix(".so")
        path = find(lib.source, lib.isa, target, lib.name)
        if path is not None:
            out.append(LibStatus(label, "prebuilt", path))
        elif (lib.name, None if lib.isa is None else lib.isa.name) in man:
            out.append(LibStatus(label, "stale", None))
        else:
            out.append(LibStatus(label, "missing", None))
    return out


def gcc_key(gcc: str) -> str:
    """Identity of a gcc binary: its real path, size, mtime and inode (a new gcc differs)."""
    st = os.stat(gcc)
    return f"{os.path.realpath(gcc)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"


def gcc_facts(gcc: str) -> dict[str, object] | None:
    """``{"version": str, "openmp": bool}`` (and ``"shim": bool`` when probed) the
    install-time build probed for this very gcc binary (:func:`gcc_key`), or None (another
    gcc, or no install-time build)."""
    rec = install_status().get("gcc")
    try:
        if isinstance(rec, dict) and rec.get("key") == gcc_key(gcc):
            if isinstance(rec.get("version"), str) and isinstance(rec.get("openmp"), bool):
                out = {"version": rec["version"], "openmp": rec["openmp"]}
                if isinstance(rec.get("shim"), bool):
                    out["shim"] = rec["shim"]
                return out
    except OSError:
        pass
    return None


def describe(target: Target) -> str:
    """One line for ``rlx info``: which fixed libraries of ``target`` are prebuilt (used
    without gcc) and which are built at run time into the cache, and why."""
    libs = status(target)
    pre = [s.name for s in libs if s.state == "prebuilt"]
    stale = [s.name for s in libs if s.state == "stale"]
    missing = [s.name for s in libs if s.state == "missing"]
    head = f"{len(pre)} of {len(libs)} {target.value} libraries prebuilt in {PREBUILT_DIR}"
    if not pre and not stale:
        st = install_status()
        why = st.get("reason") if st else None
        why = why or ("not built at install (run pip install)" if not st else "target not built")
        return f"none for {target.value} ({why}); every library is built at run time into the cache"
    parts = [head + (f" ({', '.join(pre)})" if pre else "")]
    if stale:
        parts.append(f"from the cache, source or flags changed since install: {', '.join(stale)}")
    if missing:
        parts.append(f"from the cache, not prebuilt: {', '.join(missing)}")
    return "; ".join(parts)


def describe_loaded() -> str:
    """One line for ``rlx info``: where this process got each native library from
    (``(none loaded yet)`` in a fresh process)."""
    got = loaded_sources()
    if not got:
        return "(none loaded yet)"
    return ", ".join(f"{k}: {v}" for k, v in sorted(got.items()))


# ---- the install-time build -------------------------------------------------------------


def _run(cmd: list[str], cwd: str | None = None) -> tuple[int, str]:
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    return r.returncode, r.stderr.strip()


def _gcc_builds(
    gcc: str, flags: list[str], code: str = "int rlx_probe(int x) { return x + 1; }\n"
) -> tuple[bool, str]:
    """Whether ``gcc`` builds ``code`` into a shared object with ``flags`` (and gcc's
    message)."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d, "t.c")
        src.write_text(code)
        rc, err = _run([gcc, *flags, str(src), "-o", str(Path(d, "t.so"))])
    return rc == 0, err


def probe_openmp(gcc: str) -> bool:
    """Whether ``gcc`` builds and links an ``-fopenmp`` shared object here (False also
    when no temporary directory is usable)."""
    code = "#include <omp.h>\nint f(void){return omp_get_max_threads();}\n"
    try:
        return _gcc_builds(gcc, ["-fopenmp", "-fPIC", "-shared"], code)[0]
    except OSError:
        return False


def build_all(
    out_dir: Path,
    gcc: str | None,
    log: Callable[[str], None] = print,
    jobs: int | None = None,
    targets: tuple[Target, ...] | None = None,
    only: tuple[str, ...] | None = None,
) -> dict[str, object]:
    """Build every fixed library (or those named in ``only``) for every target (or those
    in ``targets``) ``gcc`` can build on this machine into ``out_dir/<target>/`` with its
    manifest, in ``jobs`` parallel gcc runs (default: the CPU count), and write
    ``out_dir/status.json``. Never
    raises for a missing compiler or a failed build: a target gcc cannot build is
    skipped, a library that fails is left out of the manifest (it is built at run time),
    and the status says so. Returns the status."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    st: dict[str, object] = {"format": FORMAT, "built": [], "skipped": {}, "failed": {}}
    if gcc is None:
        st["reason"] = "gcc is not on PATH"
    else:
        try:
            _build_targets(out_dir, gcc, st, log, jobs or os.cpu_count() or 1, targets, only)
        except Exception as e:  # the install goes on: rlx then builds at run time
            st["reason"] = f"{type(e).__name__}: {e}"
        if not st["built"] and "reason" not in st:
            st["reason"] = "no target could be built: " + "; ".join(
                f"{k}: {v}"
                for k, v in {**st["skipped"], **st["failed"]}.items()  # type: ignore[dict-item]
            )
    (out_dir / STATUS).write_text(json.dumps(st, indent=1) + "\n")
    if not st["built"]:
        log(
            f"rlx: native kernel libraries NOT prebuilt ({st['reason']}); rlx will build "
            "them with gcc at run time instead (slower first compile)"
        )
    return st


def _build_targets(
    out_dir: Path,
    gcc: str,
    st: dict[str, object],
    log: Callable[[str], None],
    jobs: int,
    only_targets: tuple[Target, ...] | None,
    only: tuple[str, ...] | None,
) -> None:
    version = subprocess.run([gcc, "--version"], capture_output=True, text=True, check=False)
    compiler = version.stdout.splitlines()[0] if version.stdout else "gcc (unknown version)"
    targets = list(targets_of(machine_arch()))
    if only_targets is not None:
        targets = [t for t in targets if t in only_targets]
    openmp = probe_openmp(gcc)
    shim = not openmp and probe_shim(gcc)
    runtime = ThreadRuntime.OPENMP if openmp else ThreadRuntime.POOL if shim else ThreadRuntime.NONE
    st["gcc"] = {"key": gcc_key(gcc), "version": compiler, "openmp": openmp}
    if not openmp:
        st["gcc"]["shim"] = shim  # type: ignore[index]
    vm = _libmvec()
    work: list[tuple[Target, FixedLib, list[str]]] = []
    for t in targets:
        probe = _expected_flags(t, None, ThreadRuntime.NONE)
        ok, err = _gcc_builds(gcc, probe)
        if not ok:
            skipped = st["skipped"]
            assert isinstance(skipped, dict)
            skipped[t.value] = f"gcc cannot build {' '.join(probe)}: {err.splitlines()[-1:]}"
            log(f"rlx: skipping the {t.value} native target ({skipped[t.value]})")
            continue
        (out_dir / t.value).mkdir(exist_ok=True)
        for lib in fixed_libraries(t, vm):
            if only is not None and lib.name not in only:
                continue
            work.append((t, lib, _expected_flags(t, lib.isa, runtime)))

    def one(item: tuple[Target, FixedLib, list[str]]) -> tuple[Target, FixedLib, str | None]:
        t, lib, flags = item
        tdir = out_dir / t.value
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=tdir) as d:
            src = Path(d, f"{lib.name}.c")
            src.write_text(lib.source)
            tmp = Path(d, lib.file)
            if runtime is ThreadRuntime.POOL:
                prepare_build_dir(Path(d))
            rc, err = _run([gcc, *flags, str(src), "-o", str(tmp)], cwd=d)
            if rc != 0:
                return t, lib, f"exit {rc}: {err[-400:]}"
            os.replace(tmp, tdir / lib.file)
        seconds[(t, lib.file)] = time.perf_counter() - t0
        return t, lib, None

    seconds: dict[tuple[Target, str], float] = {}
    log(f"rlx: prebuilding {len(work)} native kernel libraries with {compiler} ({jobs} jobs)")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, work))
    flags_of = {(t, lib.file): flags for t, lib, flags in work}
    for t in targets:
        entries = []
        for rt, lib, err in results:
            if rt is not t:
                continue
            if err is not None:
                failed = st["failed"]
                assert isinstance(failed, dict)
                failed[f"{t.value}/{lib.file}"] = err
                log(f"rlx: prebuild of {t.value}/{lib.file} failed ({err.splitlines()[0]})")
                continue
            entries.append(
                {
                    "name": lib.name,
                    "isa": None if lib.isa is None else lib.isa.name,
                    "file": lib.file,
                    "source_sha256": source_hash(lib.source),
                    "flags": flags_of[(t, lib.file)],
                    "sha256": _file_hash(out_dir / t.value / lib.file),
                    "build_seconds": round(seconds[(t, lib.file)], 2),
                }
            )
        if entries:
            man = {"format": FORMAT, "target": t.value, "compiler": compiler, "libraries": entries}
            tmp_man = out_dir / t.value / f".{MANIFEST}.tmp"
            tmp_man.write_text(json.dumps(man, indent=1) + "\n")
            os.replace(tmp_man, out_dir / t.value / MANIFEST)
            built = st["built"]
            assert isinstance(built, list)
            built.append(t.value)
            log(f"rlx: prebuilt {len(entries)} native libraries for {t.value}")
    with contextlib.suppress(OSError):
        for t in targets:
            for p in (out_dir / t.value).glob("tmp*"):
                p.rmdir()
