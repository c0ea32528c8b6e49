"""Train a small byte-level transformer from scratch on the Python standard library's own
source files, with rlx's compiled training step (forward + backward + AdamW in one graph).

    .venv/bin/python examples/train_charlm.py [--steps 600] [--threads 2] [--target 2.0]

Prints a progress bar with the training loss (``rlx.train.fit``, one bar per
``--eval-every`` steps), the validation loss (nats per byte, on held-out stdlib files)
after each of them, whether it went below ``--target``,
and a sample of generated text. Model and data: :mod:`rlx.models.charlm`.
"""

from __future__ import annotations

import argparse
import time
from itertools import islice

import numpy as np

from rlx.models import charlm
from rlx.options import CompileOptions
from rlx.runtime.session import Session
from rlx.train import AdamW, TrainStep, fit, warmup_cosine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600, help="a multiple of --eval-every")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--target", type=float, default=2.0, help="validation loss to reach")
    ap.add_argument("--sample", type=int, default=300, help="bytes to generate at the end")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.steps < a.eval_every or a.steps % a.eval_every:
        ap.error(
            f"--steps ({a.steps}) must be a positive multiple of --eval-every ({a.eval_every})"
        )

    cfg = charlm.CharLMConfig(context=a.context, dim=a.dim, heads=a.heads, layers=a.layers)
    opts = CompileOptions(num_threads=a.threads)
    corpus = charlm.stdlib_corpus()
    print(f"stdlib text: {len(corpus[0]):,} training bytes, {len(corpus[1]):,} validation bytes")
    train = charlm.batches_from_stdlib(a.context, a.batch, "train", a.seed, corpus=corpus)
    val_iter = charlm.batches_from_stdlib(a.context, a.batch, "val", 1234, corpus=corpus)
    val = [next(val_iter) for _ in range(a.eval_batches)]

    graph = charlm.loss_graph(cfg, batch=a.batch, seq=a.context)
    params = charlm.init_params(cfg, a.seed)
    print(f"model: {cfg}, {sum(p.size for p in params.values()):,} params")
    schedule = warmup_cosine(a.lr, a.warmup, a.steps, min_lr=a.lr / 10)
    ts = TrainStep(
        graph, AdamW(lr=a.lr, weight_decay=0.1), params, schedule=schedule, clip_norm=1.0,
        options=opts,
    )  # fmt: skip
    evaluator = Session("cpu").compile(graph, opts, params=params)

    def val_loss() -> float:
        evaluator.set_params(ts.params())
        return float(np.mean([evaluator.run(b)[0][0] for b in val]))

    curve = [(0, val_loss())]

    def evaluate(epoch: int, train_loss: float) -> None:
        curve.append(((epoch + 1) * a.eval_every, val_loss()))
        print(
            f"step {curve[-1][0]:5d}  train {train_loss:.3f}  validation {curve[-1][1]:.3f} "
            "nats/byte",
            flush=True,
        )

    t0 = time.perf_counter()
    # one fit "epoch" = the next eval_every training batches, then a validation pass
    fit(ts, lambda _: list(islice(train, a.eval_every)), a.steps // a.eval_every, on_epoch=evaluate)
    took = time.perf_counter() - t0
    print("\nvalidation loss curve (nats/byte):")
    for step, v in curve:
        print(f"  {step:5d}  {v:.3f}  {'#' * int(round(v * 10))}")
    final = curve[-1][1]
    verdict = "reached" if final < a.target else "NOT reached"
    print(
        f"\n{a.steps} steps in {took:.0f} s ({took / a.steps * 1e3:.0f} ms/step): validation "
        f"loss {final:.3f} nats/byte; target < {a.target}: {verdict}"
    )

    gen = Session("cpu").compile(charlm.logits_graph(cfg, batch=1), opts, params=ts.params())
    text = charlm.generate(lambda t: gen.run({"tokens": t})[0], b"def ", a.sample, a.context)
    print("\nsample (temperature 0.8, prompt 'def '):\n" + text.decode("utf-8", "replace"))


if __name__ == "__main__":
    main()
