"""The byte-level char LM (rlx.models.charlm) on the standard library's source: its
gradients against PyTorch autograd on a torch twin with the same weights
(tests/train/torch_twins.py), a short training run whose validation loss falls, and the
data split."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.dtype import DType
from rlx.errors import ModelError
from rlx.models import charlm
from rlx.runtime.session import Session
from rlx.train import AdamW, TrainStep, warmup_cosine
from tests.train.torch_twins import charlm_grads

TINY = charlm.CharLMConfig(context=16, dim=32, heads=4, layers=2)


@pytest.fixture(scope="module")
def corpus() -> tuple[np.ndarray, np.ndarray]:
    return charlm.stdlib_corpus(max_bytes=300_000)


def rel_errors(names: list[str], got: list[np.ndarray], want: dict) -> dict[str, float]:
    return {
        k: float(np.linalg.norm(g - want[k]) / np.linalg.norm(want[k]))
        for k, g in zip(names, got, strict=True)
    }


@pytest.mark.parametrize(
    "cfg",
    [TINY, charlm.CharLMConfig(context=16, dim=32, heads=2, layers=1, norm="layer", tied=False)],
    ids=["rms-tied", "layer-untied"],
)
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64], ids=["f32", "f64"])
def test_gradients_match_torch_autograd(cfg, dtype, corpus):
    params = charlm.init_params(cfg, seed=1, dtype=dtype.np)
    batch = next(charlm.batches_from_stdlib(cfg.context, 4, corpus=corpus))
    graph = charlm.loss_graph(cfg, dtype=dtype)
    loss, *grads = Session("cpu").compile(rlx.value_and_grad(graph), params=params).run(batch)
    want_loss, want = charlm_grads(cfg, params, batch)
    assert sorted(want) == sorted(graph.param_names)
    np.testing.assert_allclose(loss[0], want_loss, rtol=1e-6)
    err = rel_errors(graph.param_names, grads, want)
    worst = max(err, key=err.get)
    assert err[worst] <= (1e-5 if dtype is DType.F32 else 1e-12), (worst, err[worst])


def test_gradients_with_symbolic_batch_and_seq(corpus):
    """One graph with symbolic batch and seq serves two shapes, each matching torch."""
    params = charlm.init_params(TINY, seed=2)
    vg = Session("cpu").compile(rlx.value_and_grad(charlm.loss_graph(TINY)), params=params)
    names = charlm.loss_graph(TINY).param_names
    for b, s in ((3, 16), (2, 9)):
        batch = next(charlm.batches_from_stdlib(s, b, corpus=corpus, seed=b))
        _, *grads = vg.run(batch)
        err = rel_errors(names, grads, charlm_grads(TINY, params, batch)[1])
        assert max(err.values()) <= 1e-5, err


@pytest.mark.slow
def test_training_lowers_validation_loss(corpus):
    cfg = charlm.CharLMConfig(context=32, dim=32, heads=2, layers=1)
    graph = charlm.loss_graph(cfg, batch=16, seq=32)
    params = charlm.init_params(cfg)
    steps = 40
    ts = TrainStep(
        graph, AdamW(lr=1e-2, weight_decay=0.01), params,
        schedule=warmup_cosine(1e-2, 5, steps), clip_norm=1.0,
    )  # fmt: skip
    val_iter = charlm.batches_from_stdlib(32, 16, "val", seed=9, corpus=corpus)
    val = [next(val_iter) for _ in range(4)]
    ev = Session("cpu").compile(graph, params=params)

    def val_loss() -> float:
        ev.set_params(ts.params())
        return float(np.mean([ev.run(b)[0][0] for b in val]))

    before = val_loss()
    train = charlm.batches_from_stdlib(32, 16, corpus=corpus)
    losses = [ts.step(next(train)) for _ in range(steps)]
    after = val_loss()
    assert before > 5.0  # about ln(256) = 5.55 at initialization
    assert after < 3.4, (before, after, losses[-5:])
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.5


def test_stdlib_split_is_deterministic_and_disjoint(corpus):
    train, val = corpus
    again = charlm.stdlib_corpus(max_bytes=300_000)
    assert np.array_equal(train, again[0]) and np.array_equal(val, again[1])
    assert len(train) == len(val) == 300_000
    a = next(charlm.batches_from_stdlib(16, 3, "val", seed=5, corpus=corpus))
    b = next(charlm.batches_from_stdlib(16, 3, "val", seed=5, corpus=corpus))
    assert np.array_equal(a["tokens"], b["tokens"])
    assert a["tokens"].dtype == np.int64 and a["tokens"].shape == (3, 16)
    assert np.array_equal(a["tokens"][:, 1:], a["targets"][:, :-1])
    # every window is a substring of the validation text, byte for byte
    text = val.tobytes()
    for row, nxt in zip(a["tokens"], a["targets"][:, -1], strict=True):
        assert bytes(row.astype(np.uint8)) + bytes([nxt]) in text


def test_generate_is_seeded_and_greedy_is_argmax():
    params = charlm.init_params(TINY, seed=3)
    cg = Session("cpu").compile(charlm.logits_graph(TINY, batch=1), params=params)

    def run(t: np.ndarray) -> np.ndarray:
        return cg.run({"tokens": t})[0]

    assert charlm.generate(run, b"ab", 5, 16, seed=1) == charlm.generate(run, b"ab", 5, 16, seed=1)
    greedy = charlm.generate(run, b"x" * 20, 3, 16, temperature=0)
    want = list(b"x" * 20)
    for _ in range(3):  # numpy twin of the loop: the last 16 bytes in, argmax out
        logits = charlm.logits_graph(TINY, batch=1).evaluate(
            {"tokens": np.array([want[-16:]], dtype=np.int64)}, params
        )[0]
        want.append(int(np.argmax(logits[0, -1])))
    assert greedy == bytes(want)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"dim": 30, "heads": 4}, "not divisible"),
        ({"norm": "batch"}, "'rms' or 'layer'"),
        ({"layers": 0}, "layers must be an int >= 1"),
    ],
)
def test_bad_config_is_refused(kw, msg):
    with pytest.raises(ModelError, match=msg):
        charlm.CharLMConfig(**kw)


def test_bad_data_arguments_are_refused(corpus):
    with pytest.raises(ModelError, match="split must be"):
        next(charlm.batches_from_stdlib(16, 2, "test", corpus=corpus))
    with pytest.raises(ModelError, match="seq must be in 1..16"):
        charlm.loss_graph(TINY, seq=17)
    with pytest.raises(ModelError, match="not more than context"):
        charlm.windows(np.zeros(8, np.uint8), 16, 2, np.random.default_rng())


@pytest.mark.slow
def test_example_script_prints_curve_and_sample(monkeypatch, capsys):
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "train_charlm.py"
    argv = "--steps 4 --eval-every 2 --warmup 1 --batch 4 --context 16 --dim 32 --heads 2"
    argv += " --layers 1 --eval-batches 2 --sample 8 --threads 1"
    monkeypatch.setattr("sys.argv", [str(script), *argv.split()])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "validation loss curve (nats/byte):" in out
    assert "4 steps in" in out and "target < 2.0" in out
    assert "sample (temperature 0.8, prompt 'def '):\ndef " in out
