"""The main demo: build a small model graph, verify, print and evaluate it.

Run with ``python -m rlx.demo``.
"""

from __future__ import annotations

import numpy as np

import rlx


def build() -> rlx.Graph:
    g = rlx.Graph("mlp")
    batch = g.sym("batch", max=128)
    x = g.input("x", (batch, 16))
    h = g.gelu(x)
    y = g.add(g.mul(h, 0.5), x)
    g.set_outputs([y])
    return g


def main() -> None:
    g = build().verify()
    print(g.inspect())
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    (y,) = g.evaluate({"x": x})
    print("reference output", y.shape, y.dtype, "mean", float(y.mean()))


if __name__ == "__main__":
    main()
