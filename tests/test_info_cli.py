"""``rlx.info()``, ``rlx info`` / ``python -m rlx info`` and ``rlx cache info|clear``
(issue 19 fault 19: nothing told the user which instruction-set path the native kernels
took). Oracles: the platform, NumPy and /proc/cpuinfo read here, and the cache directory
listed here."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.cli import main

FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")


def _proc_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "flags:")
    return set(line.split(":", 1)[1].split())


def _lines(text: str) -> dict[str, str]:
    """``key  value`` lines of the summary (first occurrence of each key)."""
    out: dict[str, str] = {}
    for ln in text.splitlines():
        if ln.startswith("  "):
            key, _, value = ln.strip().partition("  ")
            out.setdefault(key, value.strip())
    return out


def test_info_summary_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    from rlx.backends.cpu import native

    assert main(["info"]) == 0
    text = capsys.readouterr().out
    for title in ("rlx:", "numpy / BLAS:", "cpu:", "native code:", "settings", "threads:"):
        assert title in text, title
    kv = _lines(text)
    assert kv["rlx"] == rlx.__version__
    assert kv["python"].endswith(platform.python_version())
    assert kv["numpy"] == np.__version__
    assert any(k.startswith("blas") for k in kv)
    have = _proc_flags()
    shown = set(kv["flags"].split())
    for f in FLAGS:  # every relevant flag is reported as the CPU has it, no other way round
        assert (f in shown) == (f in have), f
    assert kv["target"] == native.selected_target().value
    assert kv["why"] == native.target_description() and "selected by RLX_ISA=" in kv["why"]
    assert kv["RLX_ISA"] == rlx.config.isa()
    assert kv["default"].isdigit() and int(kv["default"]) >= 1


def test_info_follows_rlx_isa(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_ISA", "portable")
    s = rlx.info()
    assert s.section("native code")["target"] == "portable"
    assert "portable C" in s.section("native code")["why"]
    assert s.section("settings (RLX_*, in effect)")["RLX_ISA"] == "portable"
    monkeypatch.setenv("RLX_ISA", "sse9")  # invalid: the summary says why, and goes on
    s = rlx.info()
    isa = s.section("settings (RLX_*, in effect)")["RLX_ISA"]
    assert isa.startswith("unavailable:") and "RLX_ISA" in isa and "sse9" in isa
    assert s.section("native code")["target"].startswith("unavailable:")
    assert s.section("numpy / BLAS")["numpy"] == np.__version__


def test_info_json_and_callable_module(capsys: pytest.CaptureFixture[str]) -> None:
    import rlx.info as info_module  # binding the module to rlx.info must not break rlx.info()

    assert main(["info", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rlx"]["rlx"] == rlx.__version__ and "target" in doc["native code"]
    assert isinstance(rlx.info(), info_module.Info)
    assert info_module().as_dict().keys() == doc.keys()


def test_cache_info_and_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from rlx.backends.cpu import native
    from rlx.options import CompileOptions

    if not native.available():
        pytest.skip("gcc is not installed: no native library to cache")
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("RLX_CACHE_DIR", str(root))
    g = rlx.Graph("one_region")
    x = g.input("x", (64,))
    g.set_outputs([g.tanh(g.mul(g.exp(x), x))])  # one elementwise region: one native build
    rlx.Session("cpu").compile(g, CompileOptions(use_cache=False)).run({"x": np.ones(64, "f4")})
    libs = [p for p in root.rglob("*.so")]
    assert libs, "the compile built no library"

    assert main(["cache", "info", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert Path(doc["dir"]).is_relative_to(root) and doc["libraries"] == len(libs)
    assert doc["bytes"] >= sum(p.stat().st_size for p in libs)
    assert main(["cache", "info"]) == 0
    assert f"{len(libs)} libraries" in capsys.readouterr().out

    assert main(["cache", "clear"]) == 0
    assert f"removed {len(libs)} libraries" in capsys.readouterr().out
    assert not list(root.rglob("*.so"))
    assert main(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["libraries"] == 0


def test_command_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2  # no command: the help on stderr, exit 2
    assert "Commands:" in capsys.readouterr().err
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlx: error:") and "no-such-command" in err
    assert main(["cache"]) == 2  # cache needs an action: its help, exit 2
    assert "info" in capsys.readouterr().err


def test_python_dash_m_rlx_info() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "rlx", "info"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    kv = _lines(r.stdout)
    assert kv["rlx"] == rlx.__version__ and kv["numpy"] == np.__version__
    assert kv["target"] in ("avx512", "avx2", "portable")
