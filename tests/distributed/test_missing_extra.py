"""Without the distributed extra (ray / pyarrow / torch made unimportable in a fresh
Python): the rest of rlx imports and works, and rlx.distributed's names and
``rlx embed --ray`` raise a DistributedError naming ``pip install 'rlx[distributed]'``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.frontends.missing import error_without

INSTALL = "pip install 'rlx[distributed]'"


@pytest.mark.parametrize(
    ("module", "expr"),
    [
        ("ray", "import rlx.distributed as d; d.embed"),
        ("pyarrow", "from rlx.distributed import read_embeddings"),
        ("torch", "import rlx.distributed as d; d.DataParallel"),
        ("ray", "import rlx.serve as s; s.deployment(['all-MiniLM-L6-v2'])"),
    ],
)
def test_names_need_the_extra(module: str, expr: str) -> None:
    out = error_without(module, expr)
    assert out.startswith("DistributedError ") and INSTALL in out and repr(module) in out


def test_rest_of_rlx_works_without_ray() -> None:
    code = (
        "import sys; sys.modules['ray'] = None; sys.modules['torch'] = None\n"
        "import numpy as np, rlx, rlx.distributed\n"
        "g = rlx.Graph('t'); x = g.input('x', (2,), 'f32'); g.set_outputs([g.add(x, x)])\n"
        "print(rlx.Session('cpu').compile(g).run({'x': np.ones(2, np.float32)})[0].tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2.0, 2.0]"


def test_cli_embed_ray_names_the_extra(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("one sentence\n")
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from rlx.cli import main\n"
        f"sys.exit(main(['embed', 'x', '--ray', '-i', {str(tmp_path / 'a.txt')!r}, "
        f"'--out', {str(tmp_path / 'out')!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert "rlx embed --ray needs the 'ray' package" in out.stderr and INSTALL in out.stderr
    assert not (tmp_path / "out").exists()


def test_cli_serve_ray_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from rlx.cli import main\n"
        "sys.exit(main(['serve', '--ray', '--replicas', '2', 'all-MiniLM-L6-v2']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert "rlx serve --ray needs the 'ray' package" in out.stderr and INSTALL in out.stderr
