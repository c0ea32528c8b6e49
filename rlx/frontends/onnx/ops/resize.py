"""Resize / Upsample -> one linear map per resized axis. Resizing is separable: along each
axis, output position y reads a few input positions with weights that depend only on
the static sizes and the attributes (coordinate transform, nearest rounding, linear or
cubic taps, antialias, exclude_outside). The importer computes those weights (exactly as
ONNX defines them, in float64) and emits, per axis, a ``gather`` (nearest: one tap of
weight 1, exact for every dtype) or a ``matmul`` with the [in, out] weight matrix;
``tf_crop_and_resize`` positions outside the input take extrapolation_value (a ``where``)."""

from __future__ import annotations

import math

import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import cast, scalar, where
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Gather, Transpose


def _coeffs(mode: str, nearest: str, a: float, antialias: bool, ratio: float, scale: float):  # noqa: ANN202
    if mode == "nearest":
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
              "floor": False, "ceil": True}[nearest]  # fmt: skip
        return np.array([0.0, 1.0]) if up else np.array([1.0, 0.0])
    if mode == "linear":
        if not antialias:
            return np.array([1 - ratio, ratio])
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)
        args = (np.arange(start, start + 2 - 2 * start) - ratio) * s
        c = np.clip(1 - np.abs(args), 0, 1)
        return c / c.sum()
    if not antialias:
        r = ratio
        return np.array([
            ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a,
        ])  # fmt: skip
    s = min(scale, 1.0)

    def k(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x**3 - (a + 3) * x**2 + 1
        return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a if x < 2 else 0.0

    lo = int(np.floor(-2 / s) + 1)
    c = np.array([k(s * (i - ratio)) for i in range(lo, 2 - lo)])
    return c / c.sum()


def _x_ori(ct: str, n_in: int, n_out: int, scale: float, roi) -> tuple:  # noqa: ANN001
    y = np.arange(n_out, dtype=np.float64)
    out_w = scale * n_in
    extra = None
    if ct == "align_corners":
        x = np.zeros(n_out) if out_w == 1 else y * (n_in - 1) / (out_w - 1)
    elif ct == "asymmetric":
        x = y / scale
    elif ct == "tf_crop_and_resize":
        x = (
            np.full(n_out, (roi[1] - roi[0]) * (n_in - 1) / 2)
            if out_w == 1
            else y * (roi[1] - roi[0]) * (n_in - 1) / (out_w - 1)
        ) + roi[0] * (n_in - 1)
        extra = (x < 0) | (x > n_in - 1)
    elif ct == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ct == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ct == "half_pixel_symmetric":
        off = n_in / 2 * (1 - n_out / out_w)
        x = off + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(ct)
    return x, extra


def axis_weights(ctx: NodeCtx, n_in: int, n_out: int, scale: float, roi, cfg: dict) -> tuple:  # noqa: ANN001
    """(W[n_out, n_in] float64, extrapolated mask or None) for one axis."""
    x, extra = _x_ori(cfg["ct"], n_in, n_out, scale, roi)
    xi = np.floor(x).astype(np.int64)
    ratios = np.where(x == xi, 1.0, x - xi)
    coeffs = np.stack(
        [_coeffs(cfg["mode"], cfg["nearest"], cfg["a"], cfg["aa"], float(r), scale) for r in ratios]
    )
    n = coeffs.shape[1]
    pad = int(np.ceil(n / 2))
    xp = x + pad
    pp = np.floor(xp).astype(np.int64)
    frac = xp - pp
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        off = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (pp + off)[:, None] + np.arange(n)[None, :] - pad
    if cfg["exclude"]:
        coeffs = np.where((idx < 0) | (idx >= n_in), 0.0, coeffs)
        s = coeffs.sum(-1, keepdims=True)
        coeffs = coeffs / np.where(s == 0, 1.0, s)
    w = np.zeros((n_out, n_in))
    np.add.at(
        w,
        (np.repeat(np.arange(n_out), n), np.clip(idx, 0, n_in - 1).reshape(-1)),
        coeffs.reshape(-1),
    )
    return w, extra


def _apply_axis(ctx: NodeCtx, x: int, ax: int, w: np.ndarray, extra, value: float) -> int:  # noqa: ANN001
    g = ctx.g
    r = ctx.shape(x).rank
    one_hot = np.all((w == 0) | (w == 1)) and np.all(w.sum(1) == 1)
    if one_hot:
        y = g.apply(Gather(ax), [x, g.constant(np.argmax(w, axis=1).astype(np.int64))])
    else:
        dt = ctx.dtype(x)
        if not dt.is_float:
            raise ctx.unsupported(f"linear / cubic Resize of a {dt} tensor")
        perm = tuple(i for i in range(r) if i != ax) + (ax,)
        inv = tuple(int(i) for i in np.argsort(perm))
        xt = g.apply(Transpose(perm), [cast(g, x, DType.F32)])
        y = g.apply(MatMul(), [xt, g.constant(w.T.astype(np.float32))])
        y = cast(g, g.apply(Transpose(inv), [y]), dt)
    if extra is not None and extra.any():
        m = extra.reshape([-1 if i == ax else 1 for i in range(r)])
        y = where(g, g.constant(m), scalar(g, value, y), y)
    return y


def _resize(ctx: NodeCtx, scales, sizes, roi, axes, cfg: dict) -> int:  # noqa: ANN001
    x = ctx.x(0)
    s = ctx.shape(x)
    if not s.is_static:
        raise ctx.unsupported(f"Resize of the symbolic shape {s}")
    dims = [int(d) for d in s.dims]
    r = len(dims)
    axes = list(range(r)) if axes is None else [a % r for a in axes]
    full_roi = None
    if roi is not None and len(roi):
        full_roi = [0.0] * r + [1.0] * r
        for i, a in enumerate(axes):
            full_roi[a], full_roi[r + a] = roi[i], roi[len(axes) + i]
    sc = [1.0] * r
    out = list(dims)
    if sizes is not None:
        for i, a in enumerate(axes):
            out[a] = int(sizes[i])
            sc[a] = out[a] / dims[a]
        pol = cfg["policy"]
        if pol != "stretch":
            pick = min if pol == "not_larger" else max
            k = pick(sc[a] for a in axes)
            for a in axes:
                sc[a] = k
                out[a] = int(k * dims[a] + 0.5)
    else:
        for i, a in enumerate(axes):
            sc[a] = float(scales[i])
            out[a] = int(sc[a] * dims[a])
    for a in axes:
        roi_a = None if full_roi is None else [full_roi[a], full_roi[a + r]]
        if (
            math.isclose(sc[a], 1.0)
            and out[a] == dims[a]
            and (roi_a is None or (math.isclose(roi_a[0], 0.0) and math.isclose(roi_a[1], 1.0)))
        ):
            continue
        w, extra = axis_weights(ctx, dims[a], out[a], sc[a], roi_a, cfg)
        x = _apply_axis(ctx, x, a, w, extra, cfg["extrap"])
    return x


def _cfg(ctx: NodeCtx) -> dict:
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.unsupported(f"Resize mode {mode!r}")
    return {
        "mode": mode,
        "ct": ctx.attr("coordinate_transformation_mode", "half_pixel"),
        "nearest": ctx.attr("nearest_mode", "round_prefer_floor"),
        "a": float(ctx.attr("cubic_coeff_a", -0.75)),
        "aa": bool(ctx.attr("antialias", 0)),
        "exclude": bool(ctx.attr("exclude_outside", 0)),
        "extrap": float(ctx.attr("extrapolation_value", 0.0)),
        "policy": ctx.attr("keep_aspect_ratio_policy", "stretch"),
    }


def _nonempty(ctx: NodeCtx, i: int) -> list[float] | None:
    if not ctx.has(i):
        return None
    v = np.asarray(ctx.value(i)).reshape(-1)
    return None if v.size == 0 else v.tolist()


@converter("Resize", since=11)
def resize(ctx: NodeCtx) -> int:
    cfg = _cfg(ctx)
    return _resize(ctx, _nonempty(ctx, 2), _nonempty(ctx, 3), _nonempty(ctx, 1),
                   ctx.attr("axes"), cfg)  # fmt: skip


@converter("Resize", since=10, until=11)
def resize_10(ctx: NodeCtx) -> int:
    cfg = _cfg(ctx) | {"ct": "asymmetric", "nearest": "floor"}
    return _resize(ctx, _nonempty(ctx, 1), None, None, None, cfg)


@converter("Upsample", since=7, until=10)
def upsample(ctx: NodeCtx) -> int:
    cfg = _cfg(ctx) | {"ct": "asymmetric", "nearest": "floor"}
    scales = ctx.attr("scales") if ctx.opset < 9 else _nonempty(ctx, 1)
    return _resize(ctx, scales, None, None, None, cfg)
