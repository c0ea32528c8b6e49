"""The real run: examples/train_digits.py trains a 64-128-64-10 MLP on scikit-learn's
digits data set (shipped inside scikit-learn) with AdamW through the compiled training
step, to >= 97 % test accuracy (fixed split and seeds: deterministic)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_digits_mlp_reaches_97_percent_test_accuracy():
    digits = _example()
    acc, losses, step = digits.train(epochs=15, seed=0)
    assert acc >= 0.97, f"test accuracy {acc:.4f}"
    assert step.steps == len(losses) == 15 * 23
    assert np.mean(losses[-23:]) < 0.1 * np.mean(losses[:23])
    # the params live in the step's compiled graph: one compile served every step
    assert {n.op.mnemonic for n in step.compiled.graph.nodes} >= {"assign"}


def test_fit_without_tqdm_names_the_extra(monkeypatch):
    import builtins

    from rlx.errors import ModelError
    from rlx.train import fit

    real = builtins.__import__

    def no_tqdm(name, *a, **kw):
        if name.startswith("tqdm"):
            raise ImportError("no tqdm")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    with pytest.raises(ModelError, match=r"pip install 'rlx\[train\]' \(the train extra\)"):
        fit(None, [{}], 1)  # type: ignore[arg-type]


def test_fit_runs_every_batch_each_epoch_and_reports_epoch_means():
    from rlx.errors import InputError
    from rlx.train import fit

    class Counting:
        def __init__(self):
            self.seen = []

        def step(self, batch):
            self.seen.append(batch["k"])
            return float(batch["k"])

    s, means = Counting(), []
    epochs = lambda e: [{"k": e}, {"k": e + 2}]  # noqa: E731
    losses = fit(s, epochs, 3, show=True, on_epoch=lambda e, m: means.append(m))  # type: ignore[arg-type]
    assert losses == [0, 2, 1, 3, 2, 4] and s.seen == losses and means == [1, 2, 3]
    with pytest.raises(InputError, match="one-shot iterator"):
        fit(s, iter([{"k": 1}]), 1, show=False)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="epochs must be an int >= 1, given 0"):
        fit(s, [{"k": 1}], 0)  # type: ignore[arg-type]
