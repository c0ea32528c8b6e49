"""Differential fuzzing over symbolic dims (harness.check_runs): one graph per case with a
symbolic batch / sequence / length dim, each compiled variant (every precision policy and
native target) run at several sizes one after the other (1, sizes around a SIMD vector),
against PyTorch / NumPy float64 oracles. The per-op tests elsewhere use static shapes;
these reach the kernels' run-time sizes, the schedules kept per binding of the dims, and
shape rules over symbolic dims (a concat doubling one, a reduction or a cumsum along one,
a conv keeping one with "same" padding).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.ops.base import OpKind
from rlx.ops.nn import MaskKind

from . import torch_oracles as T
from .harness import SEEDS, Tol, check_runs, examples

F32 = np.float32
TOL = Tol(2e-5, 4e-3, 3e-2)
MAX = 48  # the symbolic dims' bound


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _case(name: str, rng: np.random.Generator):
    """(graph, params, kinds, inputs-and-oracle for a size) of case ``name``."""
    g = rlx.Graph(name)
    n = g.sym("n", max=MAX)
    f = lambda *s: rng.standard_normal(s).astype(F32)  # noqa: E731
    if name == "elementwise":  # gelu(x) + x * w, w a param row broadcast over n
        w = f(37)
        x = g.input("x", (n, 37))
        g.set_outputs([g.add(g.gelu(x), g.mul(x, g.param("w", (37,))))])

        def make(size):
            xv = f(size, 37)
            return {"x": xv}, lambda r: [_np(F.gelu(T.t64(r(xv)))) + r(xv) * r(w)]

        return g, {"w": w}, [OpKind.ELEMENTWISE], make
    if name == "softmax":  # over the symbolic axis and over a static one
        x = g.input("x", (n, 70))
        g.set_outputs([g.softmax(x, 0), g.log_softmax(x, -1)])

        def make(size):
            xv = f(size, 70) * 3
            t = lambda r: T.t64(r(xv))  # noqa: E731
            return {"x": xv}, lambda r: [_np(torch.softmax(t(r), 0)), _np(torch.log_softmax(t(r), -1))]  # fmt: skip

        return g, {}, [OpKind.REDUCTION], make
    if name == "layer_norm_matmul":  # layer_norm then a linear layer with a bias and gelu
        gam, beta, w, b = f(64), f(64), f(64, 33) / 8, f(33)
        x = g.input("x", (n, 64))
        ln = g.layer_norm(x, g.param("gamma", (64,)), g.param("beta", (64,)))
        g.set_outputs([g.gelu(g.add(g.matmul(ln, g.param("w", (64, 33))), g.param("b", (33,))))])

        def make(size):
            xv = f(size, 64)

            def oracle(r):
                ln_ = F.layer_norm(T.t64(r(xv)), (64,), T.t64(r(gam)), T.t64(r(beta)))
                return [_np(F.gelu(ln_ @ T.t64(r(w)) + T.t64(r(b))))]

            return {"x": xv}, oracle

        params = {"gamma": gam, "beta": beta, "w": w, "b": b}
        return g, params, [OpKind.COMPUTE, OpKind.REDUCTION, OpKind.ELEMENTWISE], make
    if name == "attention_rope":  # rope then causal attention over a symbolic sequence
        h, d = 2, 16
        q, k, v = (g.input(nm, (1, n, h * d)) for nm in "qkv")
        cos, sin = g.input("cos", (n, d // 2)), g.input("sin", (n, d // 2))
        qr, kr = (g.rope(t, cos, sin, d) for t in (q, k))
        g.set_outputs([g.attention(qr, kr, v, h, d, MaskKind.causal())])

        def make(size):
            arrays = {nm: f(1, size, h * d) for nm in "qkv"}
            ang = rng.uniform(0, 6, (size, d // 2))
            arrays["cos"], arrays["sin"] = np.cos(ang).astype(F32), np.sin(ang).astype(F32)

            def oracle(r):
                t = {nm: T.t64(r(a)) for nm, a in arrays.items()}
                qq, kk = (T.rope(t[nm], t["cos"], t["sin"], d, d, False) for nm in "qk")
                vis = T.visible(size, size, "causal")
                return [_np(T.attention(qq, kk, t["v"], None, h, h, 1 / math.sqrt(d), vis))]

            return arrays, oracle

        return g, {}, [OpKind.COMPUTE, OpKind.DATA_MOVEMENT], make
    if name == "movement":  # gather rows, concat along n, cumsum and sum along n
        table = f(10, 16)
        idx = g.input("idx", (n,), "i64")
        rows = g.gather(g.param("table", (10, 16)), idx, 0)
        x = g.input("x", (n, 5))
        g.set_outputs([rows, g.concat([x, x], 0), g.cumsum(x, 0), g.sum(x, 0)])

        def make(size):
            iv, xv = rng.integers(-10, 10, size), (rng.integers(-8, 9, (size, 5)) / 4).astype(F32)
            return {"idx": iv, "x": xv}, [table[iv], np.concatenate([xv, xv]), np.cumsum(xv, 0, dtype=np.float64), xv.sum(0, dtype=np.float64)]  # fmt: skip

        return g, {"table": table}, [OpKind.DATA_MOVEMENT, OpKind.REDUCTION], make
    # conv1d over a symbolic length with "same" padding, then max pooling by 1
    w = f(6, 4, 3) / 4
    x = g.input("x", (2, 4, n))
    g.set_outputs([g.relu(g.conv(x, g.param("w", (6, 4, 3)), padding=1))])

    def make(size):
        xv = f(2, 4, size)
        return {"x": xv}, lambda r: [np.maximum(_np(T.conv(T.t64(r(xv)), T.t64(r(w)), (1,), ((1, 1),), (1,), 1)), 0)]  # fmt: skip

    return g, {"w": w}, [OpKind.COMPUTE, OpKind.ELEMENTWISE], make


CASES = ["elementwise", "softmax", "layer_norm_matmul", "attention_rope", "movement", "conv"]


@examples(12)
@given(
    name=st.sampled_from(CASES),
    sizes=st.lists(st.sampled_from([1, 2, 5, 16, 17, 33, MAX]), min_size=2, max_size=3),
    seed=SEEDS,
)
def test_symbolic_dims_one_graph_every_size(name, sizes, seed) -> None:
    rng = np.random.default_rng(seed)
    g, params, kinds, make = _case(name, rng)
    check_runs(g, [make(s) for s in sizes], params, kinds, TOL, "max")
