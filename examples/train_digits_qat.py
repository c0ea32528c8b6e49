"""Quantization-aware training on scikit-learn's digits: float MLP -> INT8.

Run: ``python examples/train_digits_qat.py`` (needs the ``train`` extra: scikit-learn, tqdm).

1. Train a 64-64-10 MLP in float (rlx.train.TrainStep, Adam, the mean cross-entropy).
2. Post-training quantization with ``rlx.quantize`` (static INT8: u8/s8 activations per
   tensor, i8 weights per channel) -> test accuracy.
3. QAT: ``rlx.train.qat.prepare`` puts fake quantizers where ``rlx.quantize`` quantizes,
   a few epochs of fine-tuning, ``qat.convert`` lowers to the same ``qmatmul`` kernels.
4. Two settings where rounding loses accuracy and QAT wins it back: 2-bit (ternary)
   weights, and an MLP whose hidden layer has a few outlier units (the same function as
   the float model, reparametrized: 4 units x300, their outgoing weights /300), which
   makes the per-tensor INT8 activation scale coarse.

The data split and seed are the float example's: ``train_test_split(test_size=0.25,
random_state=0, stratify=y)`` of ``x / 16``.
"""

from __future__ import annotations

import argparse

import numpy as np

import rlx
from rlx.train import Adam, TrainStep, cross_entropy, fit, qat


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, x_test, y_train, y_test): digits scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    return train_test_split(
        (x / 16.0).astype(np.float32), y.astype(np.int64), test_size=0.25, random_state=0,
        stratify=y,
    )  # fmt: skip


def mlp(hidden: int = 64) -> rlx.Graph:
    """x [B, 64] -> logits [B, 10]: linear, relu, linear."""
    g = rlx.Graph("digits_mlp")
    x = g.input("x", ("B", 64))
    h = g.relu(g.add(g.matmul(x, g.param("w1", (64, hidden))), g.param("b1", (hidden,))))
    g.set_outputs([g.add(g.matmul(h, g.param("w2", (hidden, 10))), g.param("b2", (10,)))])
    return g


def init(hidden: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    return {
        "w1": (r.standard_normal((64, hidden)) * np.sqrt(2 / 64)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (r.standard_normal((hidden, 10)) * np.sqrt(1 / hidden)).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }


def with_loss(model: rlx.Graph) -> rlx.Graph:
    """The model with integer labels ``y`` and the mean cross-entropy as its output."""
    g = model.copy(f"{model.name}.loss")
    y = g.input("y", ("B",), "i64")
    g.set_outputs([cross_entropy(g, g.outputs[0], y)])
    return g


def train(model, params, x, y, epochs: int, lr: float, show: bool) -> dict[str, np.ndarray]:
    """Adam on the mean cross-entropy, batches of 64 reshuffled each epoch."""
    step = TrainStep(with_loss(model), Adam(lr), params)

    def batches(epoch: int):
        order = np.random.default_rng(epoch).permutation(len(x))
        return [{"x": x[j], "y": y[j]} for j in np.array_split(order, len(x) // 64)]

    fit(step, batches, epochs, show=show)
    return step.params()


def accuracy(run, x, y) -> float:
    return float((run({"x": x})[0].argmax(-1) == y).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=30, help="float epochs")
    ap.add_argument("--qat-epochs", type=int, default=3)
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args()
    show = not args.quiet
    xtr, xte, ytr, yte = load()
    sess = rlx.Session("cpu")
    g = mlp()
    fp = train(g, init(), xtr, ytr, args.epochs, 1e-2, show)
    float_acc = accuracy(sess.compile(g, params=fp).run, xte, yte)
    cal = [{"x": xtr[i : i + 128]} for i in range(0, 512, 128)]
    rows = [("float", float_acc)]

    ptq = rlx.quantize(g, cal, params=fp, rank_layers=False)
    rows.append(("INT8 PTQ (rlx.quantize)", accuracy(ptq.compiled.run, xte, yte)))
    qg, qp = qat.prepare(g, fp, cal)
    model = qat.convert(qg, train(qg, qp, xtr, ytr, args.qat_epochs, 1e-3, show))
    rows.append((f"INT8 after {args.qat_epochs} QAT epochs", accuracy(model.run, xte, yte)))
    kinds = [k.op for k in model.compiled.report().kernels]

    # a coarse scheme: ternary weights (2 bits, still run as i8 by qmatmul), learned scales
    qg2, qp2 = qat.prepare(g, fp, cal, weight_bits=2, learn_scales=True)
    rows.append(("W2A8 rounding (no training)", accuracy(qat.convert(qg2, qp2).run, xte, yte)))
    trained2 = train(qg2, qp2, xtr, ytr, 5, 3e-3, show)
    rows.append(("W2A8 after 5 QAT epochs", accuracy(qat.convert(qg2, trained2).run, xte, yte)))

    # outlier activations: 4 hidden units scaled x300 (outgoing weights / 300)
    op = {k: v.copy() for k, v in fp.items()}
    op["w1"][:, :4] *= 300.0
    op["b1"][:4] *= 300.0
    op["w2"][:4] /= 300.0
    rows.append(("outlier MLP, float", accuracy(sess.compile(g, params=op).run, xte, yte)))
    ptq3 = rlx.quantize(g, cal, params=op, rank_layers=False)
    rows.append(("outlier MLP, INT8 PTQ", accuracy(ptq3.compiled.run, xte, yte)))
    qg3, qp3 = qat.prepare(g, op, cal, learn_scales=True)
    trained3 = train(qg3, qp3, xtr, ytr, 5, 3e-3, show)
    rows.append(("outlier MLP, INT8 after 5 QAT epochs", accuracy(qat.convert(qg3, trained3).run, xte, yte)))  # fmt: skip

    print(f"\n{'model':40s} test accuracy")
    for name, a in rows:
        print(f"{name:40s} {100 * a:6.2f} %")
    print(f"converted INT8 kernels: {kinds}")


if __name__ == "__main__":
    main()
