"""The float64 2-D convolution the conv tests compare against (independent of rlx):
``torch.nn.functional.conv2d`` in float64 where torch is installed, else NumPy's
(:func:`numpy_conv2d`: a tap at a time, an einsum over each group's channels). The
emulated aarch64 venv of ``scripts/test_arm.sh`` has no torch; the x86 suite checks that
the two agree (``test_conv_gemm.py``)."""

from __future__ import annotations

import numpy as np

try:
    import torch
except ImportError:  # the arm64 venv under qemu
    torch = None

Pads = tuple[tuple[int, int], tuple[int, int]]


def numpy_conv2d(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    stride: tuple[int, int],
    padding: Pads,
    dil: tuple[int, int] = (1, 1),
    groups: int = 1,
) -> np.ndarray:
    """``conv2d(x [N, C, H, W], w [O, C / groups, KH, KW]) + b`` in float64, NumPy only;
    ``padding``: ((top, bottom), (left, right))."""
    (pt, pb), (pl, pr) = padding
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    wf = np.asarray(w, np.float64)
    n, c, h, wd = xp.shape
    o, cg, kh, kw = wf.shape
    (sh, sw), (dh, dw) = stride, dil
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (wd - dw * (kw - 1) - 1) // sw + 1
    xg = xp.reshape(n, groups, cg, h, wd)
    wg = wf.reshape(groups, o // groups, cg, kh, kw)
    y = np.zeros((n, groups, o // groups, oh, ow))
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dh, j * dw
            patch = xg[:, :, :, r0 : r0 + sh * (oh - 1) + 1 : sh, c0 : c0 + sw * (ow - 1) + 1 : sw]
            y += np.einsum("ngchw,goc->ngohw", patch, wg[:, :, :, i, j])
    y = y.reshape(n, o, oh, ow)
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None]
    return y


def conv2d_f64(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    stride: tuple[int, int],
    padding: Pads,
    dil: tuple[int, int] = (1, 1),
    groups: int = 1,
) -> np.ndarray:
    """The float64 reference conv: torch's where installed, else :func:`numpy_conv2d`."""
    if torch is None:
        return numpy_conv2d(x, w, b, stride, padding, dil, groups)
    (pt, pb), (pl, pr) = padding
    xt = torch.nn.functional.pad(torch.from_numpy(np.asarray(x)).double(), (pl, pr, pt, pb))
    bt = None if b is None else torch.from_numpy(np.asarray(b)).double()
    y = torch.nn.functional.conv2d(
        xt, torch.from_numpy(np.asarray(w)).double(), bt, stride=stride, dilation=dil, groups=groups
    )
    return y.numpy()  # type: ignore[no-any-return]
