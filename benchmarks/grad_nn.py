"""Forward + backward of layer norm, attention, conv2d and max pool: rlx's compiled vjp
graph (the ``*_backward`` ops of ``rlx/ops/nn_grad.py``) vs PyTorch eager autograd
(``torch.nn.functional``; attention as ``scaled_dot_product_attention``), f32.

Each case computes the output and the gradients of every float input for one given
cotangent. Each engine runs in its own process; rounds are interleaved (rlx, torch, then
again); a figure is the best round's milliseconds per call (best of 10 calls per round).
Ratios are taken within this one run. Records the CPU flags, the native target and the
BLAS kernel (threadpoolctl).

Usage: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/grad_nn.py
[--rounds 3] [--threads 2]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

ENGINES = ["rlx", "torch"]
B, S, H, D = 8, 128, 12, 32  # MiniLM-sized attention: hidden 384
CASES = {
    "layer_norm 1024x384": {"x": (B * S, H * D), "g": (H * D,), "b": (H * D,)},
    "attention 8x128x12x32 pad": {"q": (B, S, H * D), "k": (B, S, H * D), "v": (B, S, H * D)},
    "conv2d 8x32x32x32 k3": {"x": (8, 32, 32, 32), "w": (64, 32, 3, 3), "b": (64,)},
    "max_pool 8x64x32x32 w2": {"x": (8, 64, 32, 32)},
}


def _best(fn, number: int = 10) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def _values(case: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in CASES[case].items()}


def _mask() -> np.ndarray:
    keep = np.ones((B, S), bool)
    keep[:, S * 3 // 4 :] = False  # a padded quarter
    return np.where(keep, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]


def _rlx_fn(case: str, threads: int):
    import rlx
    from rlx.autodiff import vjp
    from rlx.options import CompileOptions

    vals = _values(case)
    g = rlx.Graph(case.split()[0])
    ids = {k: g.input(k, v.shape) for k, v in vals.items()}
    feed = dict(vals)
    if case.startswith("layer_norm"):
        out = g.layer_norm(ids["x"], ids["g"], ids["b"])
    elif case.startswith("attention"):
        feed["m"] = _mask()
        m = g.input("m", feed["m"].shape)
        out = g.attention(ids["q"], ids["k"], ids["v"], H, D, mask_input=m)
    elif case.startswith("conv2d"):
        out = g.conv(ids["x"], ids["w"], ids["b"], padding=1)
    else:
        out = g.max_pool(ids["x"], 2)
    g.set_outputs([out])
    back = vjp(g, list(vals))
    ct = next(n for n in back.input_nodes() if n.op.name not in feed)
    feed[ct.op.name] = np.random.default_rng(1).standard_normal(ct.shape.dims).astype(np.float32)
    cg = rlx.Session("cpu").compile(back, CompileOptions(num_threads=threads))
    return lambda: cg.run(feed)


def _torch_fn(case: str, threads: int):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    ts = {k: torch.tensor(v, requires_grad=True) for k, v in _values(case).items()}
    if case.startswith("layer_norm"):

        def fwd():
            return F.layer_norm(ts["x"], (H * D,), ts["g"], ts["b"])
    elif case.startswith("attention"):
        mask = torch.tensor(_mask())

        def fwd():
            def heads(t):
                return t.reshape(B, S, H, D).transpose(1, 2)

            o = F.scaled_dot_product_attention(
                heads(ts["q"]), heads(ts["k"]), heads(ts["v"]), attn_mask=mask
            )
            return o.transpose(1, 2).reshape(B, S, H * D)
    elif case.startswith("conv2d"):

        def fwd():
            return F.conv2d(ts["x"], ts["w"], ts["b"], padding=1)
    else:

        def fwd():
            return F.max_pool2d(ts["x"], 2)

    with torch.no_grad():
        shape = fwd().shape
    ct = torch.tensor(np.random.default_rng(1).standard_normal(shape).astype(np.float32))

    def run():
        for t in ts.values():
            t.grad = None
        fwd().backward(ct)

    return run


def worker(engine: str, threads: int) -> None:
    out = {}
    for case in CASES:
        fn = (_torch_fn if engine == "torch" else _rlx_fn)(case, threads)
        out[case] = _best(fn)
    print(json.dumps(out))


def _env() -> dict[str, object]:
    from threadpoolctl import threadpool_info

    import rlx
    from rlx.backends.cpu.native import cpu

    rlx.Graph("warm")
    flags = sorted(f for f in cpu.cpu_flags() if f.startswith(("avx", "fma", "amx")))
    blas = [(i.get("internal_api"), i.get("architecture")) for i in threadpool_info()]
    return {"cpu flags": flags, "target": cpu.target_description(), "blas": blas}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", choices=ENGINES)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.threads)
        return
    best: dict[str, dict[str, float]] = {e: {} for e in ENGINES}
    for _ in range(a.rounds):
        for e in ENGINES:
            cmd = [sys.executable, __file__, "--worker", e, "--threads", str(a.threads)]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
            for k, v in res.items():
                best[e][k] = min(best[e].get(k, float("inf")), v)
    print(json.dumps(_env()))
    print(f"threads {a.threads}, best of {a.rounds} interleaved rounds, ms per fwd+bwd")
    print(f"{'case':28s}" + "".join(f"{e:>10s}" for e in ENGINES) + "  rlx/torch")
    for k in CASES:
        row = "".join(f"{best[e][k] * 1e3:10.2f}" for e in ENGINES)
        print(f"{k:28s}{row}  {best['rlx'][k] / best['torch'][k]:8.2f}x")


if __name__ == "__main__":
    main()
