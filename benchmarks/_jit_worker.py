"""One engine of benchmarks/jit.py in its own process (rlx.jit, jax.jit or torch.compile).

    python benchmarks/_jit_worker.py ENGINE THREADS first WORKLOAD OUT.json
    python benchmarks/_jit_worker.py ENGINE THREADS serve WORKLOAD[,WORKLOAD...]

``first``: build the workload, time the first call (trace + compile + run), write the
figure and the output (for the cross-check) to OUT.json, exit. ``serve``: build every
workload and warm it up, print ``ready``, then answer each stdin line ``WORKLOAD INNER``
with the seconds per call of INNER calls (one untimed call first); ``quit`` ends.

The functions are the same for every engine, written in its own NumPy-like API: an MLP
(``x @ w + b``, exact gelu, ..., last layer linear) and a pre-norm transformer block
(layer norm, q/k/v projections, causal dot-product attention on [B, T, N, H], output
projection and residual, silu MLP and residual). Weights are passed as a pytree argument:
``rlx.freeze``-d NumPy arrays for rlx (bound as params), ``jax.device_put`` arrays for
JAX, tensors for torch; the input ``x`` is a fresh host array each engine copies in.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

import numpy as np

WORKLOADS: dict[str, dict[str, Any]] = {
    "mlp_small": {"kind": "mlp", "batch": 1, "dims": (64, 128, 128, 16)},
    "mlp_moderate": {"kind": "mlp", "batch": 32, "dims": (256, 1024, 1024, 256)},
    "attn_small": {"kind": "attn", "batch": 1, "seq": 8, "d": 64, "heads": 4},
    "attn_moderate": {"kind": "attn", "batch": 2, "seq": 128, "d": 256, "heads": 8},
}


def make_inputs(name: str) -> tuple[Any, np.ndarray]:
    """NumPy params (a pytree) and input for workload ``name``, the same in every engine."""
    w = WORKLOADS[name]
    rng = np.random.default_rng(0)

    def mat(a: int, b: int) -> np.ndarray:
        return (rng.standard_normal((a, b)) / math.sqrt(a)).astype(np.float32)

    if w["kind"] == "mlp":
        dims = w["dims"]
        params = [
            (mat(a, b), (rng.standard_normal(b) * 0.1).astype(np.float32))
            for a, b in zip(dims[:-1], dims[1:])
        ]
        x = rng.standard_normal((w["batch"], dims[0])).astype(np.float32)
        return params, x
    d = w["d"]
    params = {
        "g": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
        "beta": (0.1 * rng.standard_normal(d)).astype(np.float32),
        "wq": mat(d, d),
        "wk": mat(d, d),
        "wv": mat(d, d),
        "wo": mat(d, d),
        "w1": mat(d, 4 * d),
        "w2": mat(4 * d, d),
    }
    x = rng.standard_normal((w["batch"], w["seq"], d)).astype(np.float32)
    return params, x


# ---- the functions, per engine ----------------------------------------------------------


def build_rlx(name: str, threads: int) -> tuple[Any, Any]:
    import rlx
    import rlx.nn as nn
    import rlx.numpy as rnp

    w = WORKLOADS[name]

    def mlp(params, x):  # noqa: ANN001, ANN202
        for i, (wt, b) in enumerate(params):
            x = x @ wt + b
            if i < len(params) - 1:
                x = nn.gelu(x, approximate=False)
        return x

    def block(p, x):  # noqa: ANN001, ANN202
        b, t, d = x.shape
        n = w["heads"]
        y = nn.layer_norm(x, p["g"], p["beta"], eps=1e-5)
        q, k, v = (rnp.reshape(y @ p[m], (b, t, n, d // n)) for m in ("wq", "wk", "wv"))
        a = nn.dot_product_attention(q, k, v, is_causal=True)
        h = x + rnp.reshape(a, (b, t, d)) @ p["wo"]
        return h + nn.silu(h @ p["w1"]) @ p["w2"]

    f = rlx.jit(mlp if w["kind"] == "mlp" else block, num_threads=threads)
    params, x = make_inputs(name)
    p = rlx.freeze(params)
    return (lambda: f(p, x)), (lambda r: r)


def build_jax(name: str, threads: int) -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp

    w = WORKLOADS[name]

    def mlp(params, x):  # noqa: ANN001, ANN202
        for i, (wt, b) in enumerate(params):
            x = x @ wt + b
            if i < len(params) - 1:
                x = jax.nn.gelu(x, approximate=False)
        return x

    def block(p, x):  # noqa: ANN001, ANN202
        b, t, d = x.shape
        n = w["heads"]
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        y = (x - mu) / jnp.sqrt(var + 1e-5) * p["g"] + p["beta"]
        q, k, v = (jnp.reshape(y @ p[m], (b, t, n, d // n)) for m in ("wq", "wk", "wv"))
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        h = x + jnp.reshape(a, (b, t, d)) @ p["wo"]
        return h + jax.nn.silu(h @ p["w1"]) @ p["w2"]

    f = jax.jit(mlp if w["kind"] == "mlp" else block)
    params, x = make_inputs(name)
    p = jax.device_put(params)
    return (lambda: f(p, x).block_until_ready()), (lambda r: np.asarray(r))


def build_torch(name: str, threads: int) -> tuple[Any, Any]:
    import torch
    import torch.nn.functional as F  # noqa: N812

    torch.set_num_threads(threads)
    w = WORKLOADS[name]

    def mlp(params, x):  # noqa: ANN001, ANN202
        for i, (wt, b) in enumerate(params):
            x = x @ wt + b
            if i < len(params) - 1:
                x = F.gelu(x)
        return x

    def block(p, x):  # noqa: ANN001, ANN202
        b, t, d = x.shape
        n = w["heads"]
        y = F.layer_norm(x, (d,), p["g"], p["beta"], eps=1e-5)
        q, k, v = ((y @ p[m]).reshape(b, t, n, d // n).transpose(1, 2) for m in ("wq", "wk", "wv"))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        h = x + a.reshape(b, t, d) @ p["wo"]
        return h + F.silu(h @ p["w1"]) @ p["w2"]

    f = torch.compile(mlp if w["kind"] == "mlp" else block)
    params, x = make_inputs(name)
    if isinstance(params, list):
        p: Any = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in params]
    else:
        p = {k: torch.from_numpy(v) for k, v in params.items()}

    def call():  # noqa: ANN202
        with torch.no_grad():
            return f(p, torch.from_numpy(x))

    return call, (lambda r: r.numpy())


BUILDERS = {"rlx": build_rlx, "jax": build_jax, "torch.compile": build_torch}


def main() -> None:
    engine, threads, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    build = BUILDERS[engine]
    if mode == "first":
        name, out = sys.argv[4], sys.argv[5]
        call, to_np = build(name, threads)
        t0 = time.perf_counter()
        r = call()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        call()
        second = time.perf_counter() - t0
        y = to_np(r)
        with open(out, "w") as fh:
            json.dump({"first_s": first, "second_s": second, "out": y.ravel()[:64].tolist(),
                       "out_shape": list(y.shape)}, fh)  # fmt: skip
        return
    calls = {}
    for name in sys.argv[4].split(","):
        call, _ = build(name, threads)
        for _ in range(5):
            call()
        calls[name] = call
    print("ready", flush=True)
    clock = time.perf_counter
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "quit":
            break
        call, inner = calls[parts[0]], int(parts[1])
        call()
        t0 = clock()
        for _ in range(inner):
            call()
        print((clock() - t0) / inner, flush=True)


if __name__ == "__main__":
    main()
