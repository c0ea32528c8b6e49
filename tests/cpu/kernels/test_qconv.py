"""qconv2d on the native int8 GEMM (im2col, one GEMM per group), on every build target this
CPU runs, against an int64 NumPy oracle written here (explicit loop over the kernel taps,
zero-point padding): the f32 output equals ``f32(acc) * (x_scale * w_scale[o]) + bias[o]``
computed from the exact accumulator."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.options import CompileOptions

F = np.float32
TARGETS = [t.value for t in cpu.runnable_targets()] if native.available() else []


def oracle_acc(x, w, zp, stride, pad, dil, groups):
    """sum over (c, a, b) of (x - zp)[n, c, i*s + a*d, j*s + b*d] * w[o, c, a, b], int64."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // groups
    (pt, pb), (pl, pr) = pad
    xs = np.pad(x.astype(np.int64) - zp, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ho = (h + pt + pb - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + pl + pr - dil[1] * (kw - 1) - 1) // stride[1] + 1
    acc = np.zeros((n, o, ho, wo), np.int64)
    for gi in range(groups):
        xg = xs[:, gi * cg : (gi + 1) * cg]
        wg = w[gi * og : (gi + 1) * og].astype(np.int64)
        for a in range(kh):
            for b in range(kw):
                r0, c0 = a * dil[0], b * dil[1]
                patch = xg[
                    :, :, r0 : r0 + stride[0] * ho : stride[0], c0 : c0 + stride[1] * wo : stride[1]
                ]
                acc[:, gi * og : (gi + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, a, b])
    return acc


CASES = [
    # (x shape, w shape, stride, padding, dilation, groups, unsigned, zp)
    ((2, 3, 9, 8), (5, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, False, 3),
    ((1, 4, 11, 7), (6, 2, 3, 2), (2, 1), ((2, 0), (1, 2)), (1, 2), 2, True, 131),
    ((3, 8, 6, 6), (8, 8, 1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, True, 0),
    ((1, 16, 8, 8), (32, 16, 2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1), 1, False, -7),
]


@pytest.mark.skipif(not TARGETS, reason="gcc is not installed")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}g{c[5]}")
def test_qconv2d_native_matches_the_int64_oracle(monkeypatch, target, case):
    monkeypatch.setenv("RLX_ISA", target)
    xs, wsh, stride, pad, dil, groups, unsigned, zp = case
    rng = np.random.default_rng(sum(xs) + sum(wsh))
    x = (
        rng.integers(0, 256, xs, dtype=np.uint8)
        if unsigned
        else rng.integers(-128, 128, xs, dtype=np.int8)
    )
    w = rng.integers(-128, 128, wsh, dtype=np.int8)
    ws = rng.uniform(1e-3, 1e-2, wsh[0]).astype(F)
    bias = rng.standard_normal(wsh[0]).astype(F)
    g = rlx.Graph("qconv")
    xi = g.input("x", xs, "u8" if unsigned else "i8")
    y = g.qconv2d(
        xi, g.constant(w), 0.05, ws, x_zero_point=zp, bias=g.param("b", (wsh[0],)),
        stride=stride, padding=pad, dilation=dil, groups=groups,
    )  # fmt: skip
    g.set_outputs([y])
    c = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params={"b": bias})
    got = c.run({"x": x})[0]
    acc = oracle_acc(x, w, zp, stride, pad, dil, groups)
    want = acc.astype(F) * (F(0.05) * ws)[None, :, None, None] + bias[None, :, None, None]
    np.testing.assert_array_equal(got, want)
    (k,) = [k for k in c.report().kernels if k.op == "qconv2d"]
    assert k.kind.value == "native"
