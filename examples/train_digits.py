"""Train an MLP on scikit-learn's digits data set with rlx's compiled training step.

In: the 1,797 8x8 digit images that ship inside scikit-learn (``load_digits``; no
download), split 80/20 with a fixed seed. Out: the test accuracy of a 64-128-64-10 ReLU
MLP trained with AdamW (weight decay, a warmup + cosine schedule) through
``rlx.train.TrainStep``: one compiled graph per step doing forward, backward and the
update in place. Run: ``python examples/train_digits.py [--epochs N] [--no-progress]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import rlx
from rlx.train import AdamW, TrainStep, accuracy, cross_entropy, fit, warmup_cosine

LAYERS = (64, 128, 64, 10)


def load(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): pixels scaled to [0, 1], 80/20 split."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x = (x[order] / 16.0).astype(np.float32)
    y = y[order].astype(np.int64)
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def model() -> rlx.Graph:
    """x [batch, 64], y [batch] -> (mean cross-entropy, logits [batch, 10])."""
    g = rlx.Graph("digits_mlp")
    batch = g.sym("batch", 1, 4096)
    x, y = g.input("x", (batch, LAYERS[0])), g.input("y", (batch,), "i64")
    h = x
    for i, (n_in, n_out) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
        h = g.add(g.matmul(h, g.param(f"w{i}", (n_in, n_out))), g.param(f"b{i}", (n_out,)))
        if i < len(LAYERS) - 2:
            h = g.relu(h)
    g.set_outputs([cross_entropy(g, h, y), h])
    return g


def init(seed: int = 0) -> dict[str, np.ndarray]:
    """torch.nn.Linear's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    params = {}
    for i, (n_in, n_out) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
        bound = 1.0 / np.sqrt(n_in)
        params[f"w{i}"] = rng.uniform(-bound, bound, (n_in, n_out)).astype(np.float32)
        params[f"b{i}"] = rng.uniform(-bound, bound, (n_out,)).astype(np.float32)
    return params


def train(
    epochs: int = 30, batch: int = 64, seed: int = 0, show: bool = False
) -> tuple[float, list[float], TrainStep]:
    """Train; returns (test accuracy, every step's loss, the TrainStep)."""
    xtr, ytr, xte, yte = load(seed)
    steps_per_epoch = -(-len(xtr) // batch)
    schedule = warmup_cosine(1e-2, warmup=steps_per_epoch, total=epochs * steps_per_epoch)
    step = TrainStep(model(), AdamW(1e-2, weight_decay=1e-4), init(seed), schedule=schedule)

    def batches(epoch: int) -> list[dict[str, np.ndarray]]:
        order = np.random.default_rng(seed * 1000 + epoch).permutation(len(xtr))
        return [
            {"x": xtr[order[i : i + batch]], "y": ytr[order[i : i + batch]]}
            for i in range(0, len(xtr), batch)
        ]

    losses = fit(step, batches, epochs, show=show)
    evaluate = rlx.Session("cpu").compile(model(), params=step.params())
    _, logits = evaluate.run({"x": xte, "y": yte})
    return accuracy(logits, yte), losses, step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    acc, losses, step = train(args.epochs, args.batch, args.seed, show=not args.no_progress)
    dt = time.perf_counter() - t0
    plan = step.compiled.memory_plan
    print(f"{step.steps} steps in {dt:.2f} s; loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"planned working memory of the step: {plan.peak_bytes / 1024:.1f} KiB")
    print(f"test accuracy: {acc * 100:.2f} %")


if __name__ == "__main__":
    main()
