"""The fixed native kernel libraries built at install time (rlx/backends/cpu/native/
prebuilt.py, setup.py): the manifest matches the sources, ``native.build`` takes a
prebuilt library without running gcc, an edited source or other flags fall back to the
run-time build into the cache, and a prebuilt GEMM gives the run-time-built one's bits
(NumPy as the oracle)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu, prebuilt, sgemm
from rlx.backends.cpu.native.cpu import selected_target
from rlx.backends.cpu.native.prebuilt import FixedLib
from rlx.errors import CompileError

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not on PATH")

#: the libraries the tests build for the selected target (small and fast to compile)
SMALL = ("sgemm", "conv")


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop what this process remembered about built, found and loaded libraries."""
    monkeypatch.setattr(native, "_BUILT", {})
    monkeypatch.setattr(prebuilt, "_manifests", {})
    monkeypatch.setattr(prebuilt, "_verified", {})
    monkeypatch.setattr(prebuilt, "_origins", {})
    sgemm.sgemm_lib.cache_clear()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prebuilt directory holding SMALL for the selected target (build_all, as setup.py
    runs it, restricted to those libraries)."""
    out = tmp_path_factory.mktemp("prebuilt")
    target = selected_target()
    st = prebuilt.build_all(
        out, native.gcc_path(), log=lambda _: None, targets=(target,), only=SMALL
    )
    assert st["built"] == [target.value], st
    return out


@pytest.fixture
def use_built(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``built`` as the prebuilt directory and an empty cache at tmp_path/cache."""
    monkeypatch.setattr(prebuilt, "PREBUILT_DIR", built)
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))
    _forget(monkeypatch)
    yield built
    sgemm.sgemm_lib.cache_clear()  # type: ignore[attr-defined]


def _no_gcc(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Make every gcc invocation of the run-time build fail the test; returns the calls."""
    calls: list[list[str]] = []

    def refuse(cmd: list[str], *a: object, **k: object) -> None:
        calls.append(list(cmd))
        raise AssertionError(f"gcc was run: {cmd}")

    monkeypatch.setattr(native.subprocess, "run", refuse)
    return calls


def _lib(name: str) -> FixedLib:
    return next(lib for lib in prebuilt.fixed_libraries(selected_target()) if lib.name == name)


def _check_manifest(tdir: Path) -> int:
    """Assert every entry of ``tdir/manifest.json`` has the current source's sha256 (from
    csrc/, hashed here with hashlib), the run-time build's flags and its file's sha256."""
    import hashlib

    man = json.loads((tdir / "manifest.json").read_text())
    target = native.Target(man["target"])
    want = {
        (lib.name, None if lib.isa is None else lib.isa.name): lib
        for lib in prebuilt.fixed_libraries(target)
    }
    for e in man["libraries"]:
        lib = want[(e["name"], e["isa"])]
        assert e["source_sha256"] == hashlib.sha256(lib.source.encode()).hexdigest(), e["file"]
        assert e["flags"][0] == "-O3" and all(
            f in e["flags"] for f in native.target_spec(target).flags
        )
        assert e["sha256"] == hashlib.sha256((tdir / e["file"]).read_bytes()).hexdigest()
    return len(man["libraries"])


def test_manifest_matches_sources(built: Path) -> None:
    assert _check_manifest(built / selected_target().value) == len(SMALL)


def test_installed_prebuilt_is_consistent() -> None:
    """After ``pip install`` (status.json written): every target it built has a manifest
    whose files match their recorded hashes; each library of the selected target is
    either used (its recorded source hash is the current source's) or, its csrc file
    edited since the install, not used (then built at run time)."""
    import hashlib

    st = prebuilt.install_status()
    if not st:
        assert not (prebuilt.PREBUILT_DIR / selected_target().value).exists()
        return  # a source checkout used without pip install: nothing was prebuilt
    assert st["built"], st
    target = selected_target()
    for t in st["built"]:
        tdir = prebuilt.PREBUILT_DIR / t
        man = json.loads((tdir / "manifest.json").read_text())
        for e in man["libraries"]:
            assert e["sha256"] == hashlib.sha256((tdir / e["file"]).read_bytes()).hexdigest()
    if target.value not in st["built"]:
        return
    man = json.loads((prebuilt.PREBUILT_DIR / target.value / "manifest.json").read_text())
    recorded = {(e["name"], e["isa"]): e["source_sha256"] for e in man["libraries"]}
    for lib in prebuilt.fixed_libraries(target):
        key = (lib.name, None if lib.isa is None else lib.isa.name)
        current = hashlib.sha256(lib.source.encode()).hexdigest()
        found = prebuilt.find(lib.source, lib.isa, target, lib.name)
        assert (found is not None) is (recorded.get(key) == current), key


def test_loaded_from_prebuilt_without_gcc(use_built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _no_gcc(monkeypatch)
    target = selected_target()
    lib = _lib("conv")
    path = native.build(lib.source, target, "conv")
    assert path == use_built / target.value / "libconv.so"
    native.load(path)
    got = sgemm.sgemm_lib()  # the loader's own source matches the manifest's
    assert got.lib._name == str(use_built / target.value / "libsgemm.so")
    assert calls == []
    assert prebuilt.loaded_sources() == {"conv": "prebuilt", "sgemm": "prebuilt"}
    assert not (Path(use_built.parent) / "cache" / "native").exists() or not list(
        (Path(use_built.parent) / "cache" / "native").glob("*.so")
    )


def test_edited_source_falls_back_to_cache(use_built: Path, tmp_path: Path) -> None:
    target = selected_target()
    edited = _lib("conv").source + "\n/* edited after install */\n"
    assert prebuilt.find(edited, None, target, "conv") is None
    path = native.build(edited, target, "conv")
    assert path.parent == tmp_path / "cache" / "native"
    assert prebuilt.loaded_sources() == {"conv": "cache"}
    lib = native.load(path)
    assert hasattr(lib, "rlx_conv2d_nchw") or lib is not None


def test_other_flags_fall_back(use_built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Options other than the install-time ones (an override of the flag table) are not
    served from the prebuilt directory."""
    target = selected_target()
    source = _lib("conv").source
    assert prebuilt.find(source, None, target, "conv") is not None
    real = prebuilt.gcc_flags
    monkeypatch.setattr(prebuilt, "gcc_flags", lambda *a: (*real(*a), "-DRLX_OVERRIDE=1"))
    assert prebuilt.find(source, None, target, "conv") is None


def test_tampered_prebuilt_is_refused(use_built: Path, tmp_path: Path) -> None:
    target = selected_target()
    copy = tmp_path / "pre"
    subprocess.run(["cp", "-r", str(use_built), str(copy)], check=True)
    lib = copy / target.value / "libconv.so"
    lib.write_bytes(lib.read_bytes() + b"\0")
    prebuilt.PREBUILT_DIR = copy  # restored by monkeypatch (use_built)
    path = native.build(_lib("conv").source, target, "conv")
    assert path == lib
    with pytest.raises(CompileError, match="does not match"):
        native.load(path)


def test_prebuilt_gemm_equals_runtime_built(
    use_built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prebuilt SGEMM and one built by gcc at run time give the same bits, close to
    NumPy's product."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 96), dtype=np.float32)
    b = rng.standard_normal((96, 53), dtype=np.float32)
    outs = []
    for use_prebuilt in (True, False):
        _forget(monkeypatch)
        if not use_prebuilt:
            monkeypatch.setattr(prebuilt, "PREBUILT_DIR", use_built / "none")
        lib = sgemm.sgemm_lib()
        where = Path(lib.lib._name).parent
        assert (where == use_built / selected_target().value) is use_prebuilt
        out = np.empty((37, 53), np.float32)
        lib.gemm(a, lib.pack_b(b), out)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-4)


def test_loaders_ask_for_the_listed_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fixed loader asks native.build for a (name, source, int8 path) that
    fixed_libraries lists, so its prebuilt library is found (no gcc is run here)."""
    from rlx.backends.cpu.engines import lowp_lib
    from rlx.backends.cpu.native import attention, bindings, dqgemm, peak, qgemm

    asked: list[tuple[str, str, native.Isa | None]] = []

    def record(
        source: str, isa: object = native.Isa.PLAIN, name: str = "kernel", *, target: object = None
    ) -> Path:
        asked.append((name, source, isa if isinstance(isa, native.Isa) else None))
        raise CompileError("recorded")

    monkeypatch.setattr(native, "build", record)
    target = selected_target()
    loaders = [
        sgemm.sgemm_lib,
        lambda: attention.attention_lib(dtype=np.float32),
        lambda: attention.attention_lib(dtype=np.float16),
        qgemm.qgemm_lib,
        dqgemm.dqgemm_lib,
        lowp_lib.lowp_lib,
        lambda: peak._lib(target),
        lambda: bindings.csrc_library(("conv.c", "conv_dw.c"), target, "conv"),
        lambda: bindings.csrc_library(("adam_update.c",), target, "adam_update"),
        lambda: bindings.csrc_library(("norm_grad.c",), target, "norm_grad"),
        lambda: bindings.csrc_library(("maxpool2d_grad.c",), target, "maxpool2d_grad"),
        lambda: bindings.csrc_library(
            ("attention_vec.c", "attention_grad.c"),
            target,
            "attention_grad",
            "#define RLX_ATT_DT 0\n",
        ),
    ]
    for fn in (
        sgemm.sgemm_lib,
        lowp_lib.lowp_lib,
        dqgemm._lib,
        qgemm._qgemm_lib,
        attention._attention_lib,
        peak._lib,
        bindings.csrc_library,  # conv / norm / Adam libraries loaded by earlier tests
    ):
        getattr(fn, "cache_clear", lambda: None)()
    declined = 0  # loaders whose kernel this target does not build (f16 attention on portable)
    for load in loaders:
        with pytest.raises(CompileError) as e:
            load()
        if "recorded" not in str(e.value):
            assert "not on the" in str(e.value), e.value
            declined += 1
    for fn in (
        sgemm.sgemm_lib,
        lowp_lib.lowp_lib,
        dqgemm._lib,
        qgemm._qgemm_lib,
        attention._attention_lib,
        peak._lib,
        bindings.csrc_library,  # conv / norm / Adam libraries loaded by earlier tests
    ):
        getattr(fn, "cache_clear", lambda: None)()
    listed = {
        (lib.name, prebuilt.source_hash(lib.source), lib.isa)
        for lib in prebuilt.fixed_libraries(target)
    }
    for name, source, isa in asked:
        assert (name, prebuilt.source_hash(source), isa) in listed, name
    assert len(asked) == len(loaders) - declined
    assert declined == (1 if target is cpu.Target.PORTABLE else 0)


def test_no_gcc_at_install_is_reported(tmp_path: Path) -> None:
    logged: list[str] = []
    st = prebuilt.build_all(tmp_path, None, log=logged.append)
    assert st["built"] == [] and st["reason"] == "gcc is not on PATH"
    assert json.loads((tmp_path / "status.json").read_text())["reason"] == "gcc is not on PATH"
    assert len(logged) == 1 and "NOT prebuilt" in logged[0] and "run time" in logged[0]


def test_target_gcc_cannot_build_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target whose flags gcc rejects is skipped; the others are built."""
    target = selected_target()
    real = prebuilt._gcc_builds

    def picky(gcc: str, flags: list[str], *code: str) -> tuple[bool, str]:
        if "-march=x86-64" in flags:
            return False, "error: bad value 'x86-64' for '-march=' switch"
        return real(gcc, flags, *code)

    monkeypatch.setattr(prebuilt, "_gcc_builds", picky)
    st = prebuilt.build_all(
        tmp_path,
        native.gcc_path(),
        log=lambda _: None,
        targets=(native.Target.PORTABLE, target),
        only=("conv",),
    )
    assert "portable" in st["skipped"]
    if target is not native.Target.PORTABLE:
        assert st["built"] == [target.value]


def test_gcc_facts_from_the_install_build(use_built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an empty cache, the gcc version and OpenMP support the install-time build
    probed for this gcc binary are used without running gcc."""
    real = subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=True)
    native._gcc_facts.cache_clear()
    try:
        calls = _no_gcc(monkeypatch)
        assert native.gcc_version() == real.stdout.splitlines()[0]
        assert isinstance(native.openmp_supported(), bool)
        assert calls == []
    finally:
        native._gcc_facts.cache_clear()


def test_failed_install_build_is_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the install-time build built nothing, the first run-time build warns once
    that libraries are built at run time, and builds."""
    prebuilt.build_all(tmp_path / "pre", None, log=lambda _: None)
    monkeypatch.setattr(prebuilt, "PREBUILT_DIR", tmp_path / "pre")
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))
    _forget(monkeypatch)
    monkeypatch.setattr(prebuilt, "_warned", [])
    source = _lib("conv").source
    with pytest.warns(RuntimeWarning, match="not built at install time .gcc is not on PATH"):
        path = native.build(source, selected_target(), "conv")
    assert path.parent == tmp_path / "cache" / "native"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        native.build(source + "\n", selected_target(), "conv")
