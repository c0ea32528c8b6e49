"""One engine of ``benchmarks/from_torch.py`` in its own process.

    python _torch_worker.py --engine rlx|eager|compile --threads N --work DIR

Answers JSON-line commands on stdin, one reply per line on the process's original stdout
(stdout itself points at stderr, so a library's print cannot corrupt the protocol):
``{"op": "build", "model": m, "shapes": [[b, s], ...]}`` builds the model (seeded, so
every engine holds the same weights), makes the engine's callable for each shape (rlx:
``rlx.from_torch`` with a dynamic batch + ``compile(num_threads=N)``; eager: the module
under ``torch.inference_mode``; compile: ``torch.compile(module)``), times the first call
of the first shape (rlx: import + compile + run; compile: torch.compile's tracing and code
generation + run), runs each shape once and saves its output to
``work/out_<engine>_<model>_<b>x<s>_<N>t.npy``; ``{"op": "time", "case": id, "inner": k}``
-> one untimed call, then ``k`` timed calls: ``{"ms": per-call ms}``; ``{"op": "stats"}``
-> versions and the BLAS / OpenMP pools (threadpoolctl); ``{"op": "quit"}``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_model(name: str) -> Any:
    import torch

    torch.manual_seed(0)
    if name == "mlp":
        from torch import nn

        return nn.Sequential(
            nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 16)
        ).eval()
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024, max_position_embeddings=512,
    )  # fmt: skip
    return BertModel(cfg).eval()


def example(name: str, b: int, s: int) -> tuple[Any, ...]:
    import torch

    g = torch.Generator().manual_seed(b * 1000 + s)
    if name == "mlp":
        return (torch.randn(b, 512, generator=g),)
    ids = torch.randint(0, 30522, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[b // 2 :, s * 3 // 4 :] = 0  # half the batch padded
    return ids, mask


def first(out: Any) -> Any:
    return out[0] if isinstance(out, tuple | list) else getattr(out, "last_hidden_state", out)


def make(engine: str, model: str, shapes: list[list[int]], threads: int) -> tuple[dict, float]:
    import torch

    m = build_model(model)
    calls: dict[str, Any] = {}
    t0 = time.perf_counter()
    if engine == "rlx":
        from torch.export import Dim

        import rlx

        ex = example(model, 2, shapes[0][1])  # torch.export specializes a batch of 1
        batch = Dim("batch", min=1, max=64)
        tm = rlx.from_torch(m, ex, tuple({0: batch} for _ in ex), num_threads=threads)
        cg = tm.compile()
        for b, s in shapes:
            feed = dict(zip(tm.inputs, [x.numpy() for x in example(model, b, s)], strict=True))
            calls[f"{model}_{b}x{s}"] = lambda cg=cg, feed=feed: cg.run(feed)[0]
    else:
        fn = torch.compile(m) if engine == "compile" else m
        for b, s in shapes:
            args = example(model, b, s)

            def call(fn: Any = fn, args: tuple = args) -> np.ndarray:
                with torch.inference_mode():
                    return first(fn(*args)).numpy()

            calls[f"{model}_{b}x{s}"] = call
    first_id = next(iter(calls))
    calls[first_id]()
    first_s = time.perf_counter() - t0
    return calls, first_s


def stats() -> dict[str, Any]:
    import torch
    from threadpoolctl import threadpool_info

    import rlx

    pools = [
        {
            k: i.get(k)
            for k in ("user_api", "internal_api", "num_threads", "architecture", "filepath")
        }
        for i in threadpool_info()
    ]
    return {
        "torch": torch.__version__,
        "rlx": rlx.__version__,
        "numpy": np.__version__,
        "pools": pools,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True, choices=["rlx", "eager", "compile"])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--work", type=Path, required=True)
    a = ap.parse_args()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import torch

    torch.set_num_threads(a.threads)
    calls: dict[str, Any] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "build":
                made, first_s = make(a.engine, cmd["model"], cmd["shapes"], a.threads)
                calls.update(made)
                for cid, fn in made.items():
                    np.save(a.work / f"out_{a.engine}_{cid}_{a.threads}t.npy", fn())
                reply: dict[str, Any] = {"ok": True, "first_s": first_s}
            elif cmd["op"] == "time":
                fn = calls[cmd["case"]]
                fn()
                t0 = time.perf_counter()
                for _ in range(cmd["inner"]):
                    fn()
                reply = {"ok": True, "ms": (time.perf_counter() - t0) * 1e3 / cmd["inner"]}
            elif cmd["op"] == "stats":
                reply = {"ok": True, **stats()}
            else:
                reply = {"ok": False, "error": f"unknown op {cmd['op']!r}"}
        except Exception as e:  # the driver reports it and carries on with the others
            reply = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
