"""The native library cache (rlx/backends/cpu/native/cache.py): trust of the directory,
damaged entries, unusable directories and pruning (issue 19 faults 1, 2, 6, 8).

Damage scenarios run in a subprocess (``RLX_CACHE_DIR`` at a tmp_path), so a crash
(SIGBUS, SIGILL) shows as a failed test, not a dead pytest. The oracle is NumPy (and
the constant a tiny C function returns)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cache
from rlx.errors import CompileError

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

ANSWER = "int rlx_answer(void) {{ return {}; }}\n"

# Builds and loads the "answer" library (42) and compiles a graph whose elementwise
# region is native; prints what it saw as JSON. Exits non-zero on any exception.
SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    import rlx
    from rlx.backends.cpu import native
    from rlx.options import CompileOptions
    SRC = @SRC@
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        answer = native.load(native.build(SRC, native.Isa.PLAIN, "answer")).rlx_answer()
        g = rlx.Graph("cache_probe")
        x = g.input("x", (4, 33))
        g.set_outputs([g.mul(g.tanh(g.add(x, g.constant(np.float32(0.25)))), x)])
        cg = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False))
        xv = np.linspace(-3, 3, 4 * 33, dtype=np.float32).reshape(4, 33)
        got = cg.run({"x": xv})[0]
    want = np.tanh(xv.astype(np.float64) + 0.25) * xv
    kinds = [e.kind.value for e in cg.report().kernels if e.op == "elementwise_region"]
    print(json.dumps({
        "answer": answer,
        "err": float(np.max(np.abs(got - want))),
        "kinds": kinds,
        "warnings": [str(w.message) for w in caught],
    }))
    """
).replace("@SRC@", repr(ANSWER.format(42)))


def run_probe(cache_dir: Path, **env: str) -> dict:
    """SCRIPT in a fresh interpreter with RLX_CACHE_DIR=cache_dir; fails the test on a
    crash or exception (with its stderr)."""
    full = {**os.environ, "RLX_CACHE_DIR": str(cache_dir), **env}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=full, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"probe died (exit {r.returncode}):\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def assert_good(res: dict) -> None:
    assert res["answer"] == 42
    assert res["err"] < 1e-5
    assert res["kinds"] == ["native"]


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache filled by one probe run (copied per test)."""
    d = tmp_path_factory.mktemp("populated")
    d.chmod(0o700)
    assert_good(run_probe(d))
    return d


def fresh_copy(populated: Path, tmp_path: Path) -> Path:
    d = tmp_path / "cache"
    shutil.copytree(populated, d, symlinks=True)
    return d


def libs(d: Path, name: str) -> list[Path]:
    return sorted((d / "native").glob(f"{name}-*.so"))


def replace_bytes(path: Path, data: bytes) -> None:
    """Damage by writing a new file over ``path`` (never in place: this process may map
    the original)."""
    tmp = path.with_name(path.name + ".dmg")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def code_offset(lib: Path, symbol: str) -> int:
    """File offset of ``symbol``'s code (text vaddr == file offset in gcc's layout)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        parts = line.split()
        if parts and parts[-1] == symbol:
            return int(parts[0], 16)
    raise AssertionError(f"{symbol} not in {lib}")


# ---- fault 2: damaged entries are verified, rebuilt, never loaded -----------------------


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """RLX_CACHE_DIR of this process (for helper builds) at a private tmp dir."""
    d = tmp_path / "scratch"
    monkeypatch.setenv("RLX_CACHE_DIR", str(d))
    return d


@pytest.mark.parametrize("damage", ["truncated", "code_overwritten", "empty", "swapped"])
def test_damaged_entry_is_rebuilt(
    populated: Path, tmp_path: Path, scratch: Path, damage: str
) -> None:
    d = fresh_copy(populated, tmp_path)
    (answer,) = libs(d, "answer")
    region = libs(d, "region")
    assert region, "the probe built no region library"
    data = answer.read_bytes()
    if damage == "truncated":
        replace_bytes(answer, data[: len(data) // 2])
        for r in region:
            replace_bytes(r, r.read_bytes()[: r.stat().st_size // 2])
    elif damage == "code_overwritten":
        off = code_offset(answer, "rlx_answer")
        replace_bytes(answer, data[:off] + b"\x0f\x0b" * 8 + data[off + 16 :])  # ud2
    elif damage == "empty":
        replace_bytes(answer, b"")
        for r in region:
            replace_bytes(r, b"")
    else:  # another kernel's library under this name
        other = native.build(ANSWER.format(7), native.Isa.PLAIN, "other_answer")
        replace_bytes(answer, other.read_bytes())
    res = run_probe(d)
    assert_good(res)
    assert cache.verify(answer)  # rebuilt and recorded again


def test_missing_digest_is_rebuilt_not_trusted(
    populated: Path, tmp_path: Path, scratch: Path
) -> None:
    d = fresh_copy(populated, tmp_path)
    (answer,) = libs(d, "answer")
    replace_bytes(answer, native.build(ANSWER.format(7), native.Isa.PLAIN, "x").read_bytes())
    Path(str(answer) + ".sha256").unlink(missing_ok=True)  # planted without a digest
    assert_good(run_probe(d))


def test_load_refuses_a_library_changed_after_build(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    lib = native.build(ANSWER.format(5), native.Isa.PLAIN, "changed")
    replace_bytes(lib, native.build(ANSWER.format(6), native.Isa.PLAIN, "x").read_bytes())
    with pytest.raises(CompileError, match="does not match the digest"):
        native.load(lib)


# ---- fault 1: an untrusted directory is never used ---------------------------------------


def plant(d: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache at ``d`` whose 'answer' library returns 666 (as another user would plant
    it: a valid-looking entry, digest included). Built, never loaded, here."""
    d.mkdir(mode=0o700)
    with monkeypatch.context() as m:
        m.setenv("RLX_CACHE_DIR", str(d))
        native.build(ANSWER.format(42), native.Isa.PLAIN, "answer")
    (lib,) = libs(d, "answer")
    evil = native.build(ANSWER.format(666), native.Isa.PLAIN, "evil")
    replace_bytes(lib, evil.read_bytes())
    digest = Path(str(lib) + ".sha256")
    if digest.exists():  # (the cache before digests had none)
        cache.record_digest(lib, digest.read_text().split()[1])
    return lib


@pytest.mark.parametrize("which", ["root", "native"])
def test_group_writable_cache_dir_is_refused(
    tmp_path: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    d = tmp_path / "shared"
    plant(d, monkeypatch)
    (d if which == "root" else d / "native").chmod(0o777)
    private = tmp_path / "tmp"
    private.mkdir()
    res = run_probe(d, TMPDIR=str(private))
    assert_good(res)  # 42, not the planted 666
    assert any("writable by group or others" in w and str(d) in w for w in res["warnings"])
    assert list((private / f"rlx-cache-{os.geteuid()}" / "native").glob("answer-*.so"))


def test_cache_dir_of_another_user_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "scratch"))
    d = tmp_path / "theirs"
    planted = plant(d, monkeypatch)
    monkeypatch.setattr(cache, "_roots", {})  # forget that plant() used d
    monkeypatch.setenv("RLX_CACHE_DIR", str(d))
    monkeypatch.setattr(tempfile_mod(), "tempdir", str(tmp_path))
    monkeypatch.setattr(cache, "_private", [])
    real_stat = os.stat

    def stat_as_other_owner(p, *a, **k):  # type: ignore[no-untyped-def]
        st = real_stat(p, *a, **k)
        if str(p).startswith(str(d)):
            vals = list(st)
            vals[4] = os.geteuid() + 1  # st_uid
            return os.stat_result(vals)
        return st

    monkeypatch.setattr(cache.os, "stat", stat_as_other_owner)
    with pytest.warns(RuntimeWarning, match="not by this user"):
        lib = native.build(ANSWER.format(42), native.Isa.PLAIN, "answer")
    assert lib.parent != planted.parent and d not in lib.parents
    assert native.load(lib).rlx_answer() == 42


def tempfile_mod():  # type: ignore[no-untyped-def]
    import tempfile

    return tempfile


def test_private_fallback_of_another_user_is_refused(tmp_path, monkeypatch) -> None:
    """A per-user fallback dir pre-created by someone else (mode 0777) is not used."""
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "afile" / "sub"))
    (tmp_path / "afile").write_text("not a dir")
    monkeypatch.setattr(tempfile_mod(), "tempdir", str(tmp_path))
    squat = tmp_path / f"rlx-cache-{os.geteuid()}"
    squat.mkdir(mode=0o777)
    squat.chmod(0o777)
    monkeypatch.setattr(cache, "_private", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = native.build(ANSWER.format(42), native.Isa.PLAIN, "answer")
    assert squat not in lib.parents
    assert cache.untrusted_reason(lib.parent) is None
    assert any(str(squat) in str(w.message) for w in caught)


def test_lock_symlink_does_not_truncate_its_target(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "c"))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "c" / "native").mkdir(parents=True, mode=0o700)
    (tmp_path / "c").chmod(0o700)
    (tmp_path / "c" / "native" / "victim.lock").symlink_to(victim)
    with pytest.raises(CompileError, match="symlink"):
        native.build(ANSWER.format(1), native.Isa.PLAIN, "victim")
    assert victim.read_text() == "precious"


def test_new_cache_dirs_are_private(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "new" / "rlx"))
    lib = native.build(ANSWER.format(3), native.Isa.PLAIN, "mode")
    for p in (tmp_path / "new" / "rlx", lib.parent):
        assert p.stat().st_mode & 0o077 == 0


# ---- fault 6: an unusable directory is a warning, not a crash ----------------------------


def test_cache_path_under_a_file_falls_back_to_private(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    private = tmp_path / "tmp"
    private.mkdir()
    res = run_probe(tmp_path / "afile" / "rlx", TMPDIR=str(private))
    assert_good(res)
    assert any("not using the native cache" in w for w in res["warnings"])


def test_no_usable_dir_at_all_gives_numpy_kernels(tmp_path: Path) -> None:
    """Cache dir and temp dir both under a regular file: one warning, NumPy kernels,
    correct results, no raw OSError."""
    (tmp_path / "afile").write_text("x")
    full = {**os.environ, "RLX_CACHE_DIR": str(tmp_path / "afile" / "rlx")}
    bad_tmp = f"import tempfile\ntempfile.tempdir = {str(tmp_path / 'afile' / 'tmp')!r}\n"
    code = bad_tmp + SCRIPT.replace(
        'answer = native.load(native.build(SRC, native.Isa.PLAIN, "answer")).rlx_answer()',
        "answer = 42",
    )
    r = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["err"] < 1e-5 and res["kinds"] == ["numpy"]
    msgs = [w for w in res["warnings"] if "no usable native cache" in w]
    assert len(msgs) == 1 and "NumPy kernels are used" in msgs[0]


def test_unusable_dir_raises_compile_error_not_oserror(tmp_path, monkeypatch) -> None:
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "afile" / "rlx"))
    monkeypatch.setattr(tempfile_mod(), "tempdir", str(tmp_path / "afile" / "tmp"))
    monkeypatch.setattr(cache, "_private", [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CompileError, match="no usable native cache"):
            native.build(ANSWER.format(1), native.Isa.PLAIN, "nowhere")
        with pytest.raises(CompileError):
            native.cache_info()


# ---- fault 8: pruning, info, clear -------------------------------------------------------


def _entry(root: Path, name: str, size: int, age_days: float) -> Path:
    lib = root / f"{name}-{'0' * 24}.so"
    lib.write_bytes(b"\0" * size)
    Path(str(lib) + ".sha256").write_text(f"{'0' * 64} {'0' * 64}\n")
    t = time.time() - age_days * 86400
    os.utime(lib, (t, t))
    return lib


def test_prune_by_age_and_size_oldest_first_keeping_loaded(tmp_path: Path) -> None:
    root = tmp_path
    old = _entry(root, "old", 100, 40)
    a = _entry(root, "a", 1000, 5)
    b = _entry(root, "b", 1000, 3)
    kept = _entry(root, "kept", 1000, 4)
    c = _entry(root, "c", 1000, 1)
    removed = cache.prune(root, {kept}, max_bytes=2300, max_age_days=30)
    # old: over age; then oldest-first (a, then b) until <= 2300; kept is never removed
    assert removed == [old, a, b]
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [kept.name, kept.name + ".sha256", c.name, c.name + ".sha256"]
    )


def test_touch_marks_use_without_changing_mtime(tmp_path: Path) -> None:
    lib = _entry(tmp_path, "t", 10, 40)
    mtime = lib.stat().st_mtime_ns
    cache.touch(lib)
    assert lib.stat().st_mtime_ns == mtime
    assert cache.prune(tmp_path, set(), 1 << 30, 30) == []  # used just now


def test_build_prunes_once_under_the_size_bound(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RLX_CACHE_MAX_MB", "1")
    monkeypatch.setattr(cache, "_pruned", set())
    root = tmp_path / "native"
    root.mkdir(parents=True, mode=0o700)
    tmp_path.chmod(0o700)
    stale = [_entry(root, f"big{i}", 400_000, 2 + i) for i in range(4)]
    lib = native.build(ANSWER.format(9), native.Isa.PLAIN, "pruned")
    left = {p for p in root.glob("*.so")}
    assert lib in left and sum(p.stat().st_size for p in left) <= 1 << 20
    assert stale[-1] not in left and stale[0] in left  # oldest went first


def test_cache_info_and_clear(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    native.build(ANSWER.format(11), native.Isa.PLAIN, "info_a")
    native.build(ANSWER.format(12), native.Isa.PLAIN, "info_b")
    info = native.native_cache_info()
    sizes = sum(p.stat().st_size for p in (tmp_path / "native").glob("*.so*"))
    assert (info.dir, info.libraries, info.bytes) == (tmp_path / "native", 2, sizes)
    assert info.target == native.selected_target().value and info.description
    assert native.clear_native_cache() == 2
    assert native.native_cache_info().libraries == 0
    assert not list((tmp_path / "native").glob("*.so*"))
    # cleared entries are rebuilt on demand
    lib = native.build(ANSWER.format(11), native.Isa.PLAIN, "info_a")
    assert native.load(lib).rlx_answer() == 11


def test_bad_library_name_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompileError, match="name"):
        native.build(ANSWER.format(1), native.Isa.PLAIN, "../escape")


def test_cache_dir_removed_while_running_is_recreated(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "c"))
    native.build(ANSWER.format(21), native.Isa.PLAIN, "gone")
    shutil.rmtree(tmp_path / "c")  # e.g. `rm -rf ~/.cache/rlx` while a process runs
    lib = native.build(ANSWER.format(22), native.Isa.PLAIN, "gone")
    assert lib.parent == tmp_path / "c" / "native"
    assert native.load(lib).rlx_answer() == 22


def test_cache_dir_that_is_a_file_warns_and_uses_a_private_dir(tmp_path, monkeypatch) -> None:
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "afile"))
    monkeypatch.setattr(tempfile_mod(), "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(cache, "_private", [])
    with pytest.warns(RuntimeWarning, match=r"afile is not a directory.*private"):
        lib = native.build(ANSWER.format(31), native.Isa.PLAIN, "afile")
    assert (tmp_path / "tmp") in lib.parents
    assert native.load(lib).rlx_answer() == 31
