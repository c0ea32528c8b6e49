"""Differential fuzzing of the blocked-layout ops (``rlx/ops/layout.py``): ``to_nchwc`` ->
``conv_nchwc`` (bias, residual, activation) -> ``from_nchwc``, against torch's
``F.conv2d`` in float64 (the blocks undone by explicit index arithmetic in NumPy), through
the reference interpreter and every compiled variant (precision policies, native targets;
the layout's block the native library's own or another one, which takes the NumPy
kernels)."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F  # noqa: N812
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.ops.base import OpKind
from rlx.ops.layout import ConvNchwc, FromNchwc, Nchwc, ToNchwc
from rlx.ops.nn import Conv, ConvAct

from . import torch_oracles as T
from .harness import SEEDS, Tol, check, examples

TOL = Tol(2e-5, 4e-3, 3e-2)


@st.composite
def _cases(draw: st.DrawFn) -> tuple:
    block = draw(st.sampled_from([4, 8, 16]))
    depthwise = draw(st.booleans())
    c = draw(st.integers(1, 20))
    o = c if depthwise else draw(st.integers(1, 20))
    k = draw(st.sampled_from([1, 3]))
    stride = draw(st.sampled_from([1, 2]))
    pad = draw(st.integers(0, k // 2))
    hw = (draw(st.integers(k, 13)), draw(st.integers(k, 13)))  # 100+ outputs: Winograd
    act = draw(st.sampled_from([ConvAct.NONE, ConvAct.RELU, ConvAct.CLIP]))
    return block, depthwise, c, o, k, stride, pad, hw, act, draw(st.booleans()), draw(st.booleans())


@examples(12)
@given(case=_cases(), n=st.integers(1, 2), seed=SEEDS)
def test_conv_nchwc_matches_torch(case, n, seed) -> None:
    block, depthwise, c, o, k, stride, pad, hw, act, residual, nchw_input = case
    groups = c if depthwise else 1
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    w = rng.standard_normal((o, c // groups, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    oh, ow = ((d + 2 * pad - k) // stride + 1 for d in hw)
    r = rng.standard_normal((n, o, oh, ow)).astype(np.float32)
    lay = Nchwc(block)
    clip = (-0.5, 1.5) if act is ConvAct.CLIP else (0.0, 0.0)
    conv = Conv(
        (stride, stride), ((pad, pad), (pad, pad)), (1, 1), groups, True, act, clip, residual
    )
    g = rlx.Graph("conv_nchwc")
    xi = g.input("x", x.shape)
    xb = xi if nchw_input else g.apply(ToNchwc(lay), [xi])  # the kernel reorders x itself
    ins = [xb, g.param("w", w.shape), g.param("b", (o,))]
    if residual:
        ins.append(g.apply(ToNchwc(lay), [g.input("r", r.shape)]))
    y = g.apply(FromNchwc(lay, o), [g.apply(ConvNchwc(conv, lay, c, nchw_input), ins)])
    g.set_outputs([y])
    feeds = {"x": x, "r": r} if residual else {"x": x}

    def run(rnd, f):
        t = F.conv2d(T.t64(f(rnd(x))), T.t64(f(rnd(w))), T.t64(f(rnd(b))), stride, pad, 1, groups)
        out = t.detach().numpy()
        out = out + f(rnd(r)) if residual else out
        if act is ConvAct.RELU:
            out = np.maximum(out, 0.0)
        elif act is ConvAct.CLIP:
            out = np.clip(out, *clip)
        return out

    def scale(rnd):
        return [1.0 + run(rnd, np.abs)]

    check(g, feeds, {"w": w, "b": b}, lambda rnd: [run(rnd, lambda a: a)], [OpKind.COMPUTE], TOL, scale)  # fmt: skip


@examples(10)
@given(
    shape=st.tuples(st.integers(1, 2), st.integers(1, 21), st.integers(1, 5), st.integers(1, 19)),
    block=st.sampled_from([4, 8, 16]),
    seed=SEEDS,
)
def test_nchwc_reorders_match_index_arithmetic(shape, block, seed) -> None:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    n, c, h, w = shape
    g = rlx.Graph("reorder")
    blocked = g.apply(ToNchwc(Nchwc(block)), [g.input("x", x.shape)])
    g.set_outputs([blocked, g.apply(FromNchwc(Nchwc(block), c), [blocked])])
    ni, ci, hi, wi = np.indices(shape)

    def oracle(rnd):  # the input as the policy holds it, moved exactly
        xr = rnd(x)
        want = np.zeros((n, -(-c // block), h, w, block))
        want[ni, ci // block, hi, wi, ci % block] = xr  # channel c at block c // b, lane c % b
        return [want, xr]

    check(g, {"x": x}, {}, oracle, [OpKind.DATA_MOVEMENT], Tol(0, 0, 0))
