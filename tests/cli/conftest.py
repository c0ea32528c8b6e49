"""Fixtures of the command-line tests: :func:`run` (the ``rlx`` command in-process under
click's CliRunner isolation: exit status, stdout, stderr) and a tiny random BERT
checkpoint (tests/models/tiny_checkpoints.py) whose transformers references are stored in
tests/data/hf/tiny_bert.npz."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rlx.cli import main
from tests.models import tiny_checkpoints as tc

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


def run(args: Sequence[str], input: str | None = None) -> Result:
    """``rlx <args>`` in-process with stdin ``input``; stdout and stderr apart."""
    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click 8.1
    except TypeError:
        runner = CliRunner()  # click >= 8.2 keeps them apart
    with runner.isolation(input=input) as streams:
        code = main(list(args))
    out, err = streams[0], streams[1]
    return Result(code, out.getvalue().decode(), err.getvalue().decode() if err else "")


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tc.build("bert", tmp_path_factory.mktemp("cli_tiny") / "bert")


@pytest.fixture(scope="session")
def tiny_bert_ref() -> dict[str, np.ndarray]:
    return dict(np.load(DATA / "tiny_bert.npz"))


def tiny_matmul_flops(batch: int, seq: int) -> int:
    """The tiny BERT's matrix-product FLOPs by hand: per layer q, k, v and the output
    projection (4 x 2*T*H*H), the feed-forward (2 x 2*T*H*F) and attention's two
    products (4*B*heads*S*S*D), T = batch*seq tokens."""
    h, f, heads, layers = tc.HIDDEN, tc.FFN, tc.HEADS, tc.LAYERS
    t = batch * seq
    per_layer = 4 * 2 * t * h * h + 2 * 2 * t * h * f + 4 * batch * heads * seq * seq * (h // heads)
    return layers * per_layer


def here() -> list[str]:
    """``--isa`` / ``--amx`` naming this process's own configuration, so ``rlx bench``
    runs in-process (tests/cli/test_bench_isa.py covers the child processes)."""
    from rlx.cli.bench import current_config

    c = current_config()
    return ["--isa", c.target.value, "--amx", "on" if c.amx else "off"]
