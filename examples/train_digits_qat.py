"""Quantization-aware training on scikit-learn's digits: the float MLP of
examples/train_digits.py -> INT8.

In: that example's data split, model (64-128-64-10 ReLU MLP, outputs ``[loss, logits]``),
initialisation and training (AdamW, warmup + cosine, ``rlx.train.TrainStep``). Out: the
test accuracy of

1. the float model;
2. post-training INT8 with ``rlx.quantize`` (static: u8/s8 activations per tensor, i8
   weights per channel);
3. QAT: ``rlx.train.qat.prepare`` puts fake quantizers where ``rlx.quantize`` quantizes,
   a few epochs of fine-tuning with Adam, ``qat.convert`` lowers to the same ``qmatmul``
   kernels;
4. two settings where rounding loses accuracy and QAT wins it back: 2-bit (ternary)
   weights, and outlier activations (a few units of the first hidden layer scaled x300
   and their outgoing weights /300: the same function, but the per-tensor INT8 scale of
   that layer's output becomes coarse).

Run: ``python examples/train_digits_qat.py [--epochs N] [--qat-epochs N] [--no-progress]``
(the ``train`` extra: scikit-learn, tqdm).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import rlx
from rlx.train import Adam, TrainStep, fit, qat

OUTLIER_UNITS, OUTLIER_GAIN = 4, 300.0


def digits_example() -> ModuleType:
    """examples/train_digits.py as a module (its split, model, init and training)."""
    path = Path(__file__).resolve().parent / "train_digits.py"
    spec = importlib.util.spec_from_file_location("train_digits", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def finetune(
    graph: rlx.Graph,
    params: dict[str, np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    epochs: int,
    lr: float,
    show: bool = False,
) -> dict[str, np.ndarray]:
    """Adam on the graph's loss output (batches of 64, reshuffled each epoch) -> params."""
    step = TrainStep(graph, Adam(lr), params)

    def batches(epoch: int) -> list[dict[str, np.ndarray]]:
        order = np.random.default_rng(epoch).permutation(len(x))
        return [{"x": x[order[i : i + 64]], "y": y[order[i : i + 64]]} for i in range(0, len(x), 64)]  # fmt: skip

    fit(step, batches, epochs, show=show)
    return step.params()


def with_outliers(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same function with the first OUTLIER_UNITS hidden units scaled by OUTLIER_GAIN
    (ReLU commutes with a positive scale; the next layer's rows are divided by it)."""
    p = {k: v.copy() for k, v in params.items()}
    u = slice(0, OUTLIER_UNITS)
    p["w0"][:, u] *= OUTLIER_GAIN
    p["b0"][u] *= OUTLIER_GAIN
    p["w1"][u, :] /= OUTLIER_GAIN
    return p


def run(epochs: int = 30, qat_epochs: int = 3, show: bool = False) -> dict[str, Any]:
    """Every figure of the module docstring: name -> test accuracy, plus ``kinds`` (the
    converted INT8 model's kernels)."""
    ex = digits_example()
    xtr, ytr, xte, yte = ex.load(0)
    _, _, step = ex.train(epochs=epochs, seed=0, show=show)
    fp = step.params()
    sess = rlx.Session("cpu")
    cal = [{"x": xtr[i : i + 128], "y": ytr[i : i + 128]} for i in range(0, 512, 128)]
    test = {"x": xte, "y": yte}

    def acc(runner: Any) -> float:
        return float((np.asarray(runner(test)[1]).argmax(-1) == yte).mean())

    def ptq(params: dict[str, np.ndarray]) -> float:
        return acc(rlx.quantize(ex.model(), cal, params=params, rank_layers=False).compiled.run)

    def qat_run(params: dict[str, np.ndarray], n: int, lr: float, **kw: Any) -> tuple:
        """(accuracy of the converted model before / after ``n`` epochs, that model)."""
        qg, qp = qat.prepare(ex.model(), params, cal, **kw)
        before = acc(qat.convert(qg, qp).run)
        model = qat.convert(qg, finetune(qg, qp, xtr, ytr, n, lr, show))
        return before, acc(model.run), model

    out: dict[str, Any] = {"float": acc(sess.compile(ex.model(), params=fp).run)}
    out["int8 ptq"] = ptq(fp)
    _, out["int8 qat"], model = qat_run(fp, qat_epochs, 1e-4)
    out["kinds"] = [k.op for k in model.compiled.report().kernels]
    out["w2 rounding"], out["w2 qat"], _ = qat_run(fp, 5, 1e-3, weight_bits=2, learn_scales=True)
    op = with_outliers(fp)
    out["outlier float"] = acc(sess.compile(ex.model(), params=op).run)
    out["outlier int8 ptq"] = ptq(op)
    out["outlier int8 qat"] = qat_run(op, 5, 1e-3, learn_scales=True)[1]
    return out


LABELS = {
    "float": "float (examples/train_digits.py)",
    "int8 ptq": "INT8 PTQ (rlx.quantize)",
    "int8 qat": "INT8 after QAT",
    "w2 rounding": "W2A8 (ternary weights), rounding only",
    "w2 qat": "W2A8 after 5 QAT epochs, learned scales",
    "outlier float": "outlier MLP, float",
    "outlier int8 ptq": "outlier MLP, INT8 PTQ",
    "outlier int8 qat": "outlier MLP, INT8 after 5 QAT epochs",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=30, help="float training epochs")
    ap.add_argument("--qat-epochs", type=int, default=3)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    res = run(args.epochs, args.qat_epochs, show=not args.no_progress)
    print(f"\n{'model':44s} test accuracy")
    for key, label in LABELS.items():
        print(f"{label:44s} {100 * res[key]:6.2f} %")
    print(f"converted INT8 kernels: {res['kinds']}  ({time.perf_counter() - t0:.1f} s in all)")


if __name__ == "__main__":
    main()
