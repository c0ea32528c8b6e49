"""softmax_cross_entropy and softmax_cross_entropy_backward (rlx/ops/loss.py): shape rules,
the reference and the compiled CPU kernels against PyTorch (``F.cross_entropy`` with
``reduction="none"`` and its autograd), labels counted from the end and out of range,
non-finite rows, empty batches and the low-precision dtypes; the native row kernels and
the NumPy ones (``native=False``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import rlx
from rlx import DType
from rlx.errors import InputError, ShapeError
from rlx.ops.loss import OutOfRange, SoftmaxCrossEntropyBackward, SoftmaxCrossEntropyWithLogits
from rlx.options import CompileOptions

RAW = CompileOptions(use_cache=False, optimize=False, fuse=False)
NUMPY = RAW.replace(native=False)


def _kinds(cg) -> dict[str, str]:  # noqa: ANN001
    return {k.op: k.kind.name for k in cg.report().kernels}


def _graph(lead: tuple[int, ...], c: int, dt: DType = DType.F32) -> rlx.Graph:
    g = rlx.Graph("ce")
    x, lab = g.input("x", (*lead, c), dt), g.input("y", lead, DType.I64)
    ct = g.input("ct", lead, dt)
    g.set_outputs([g.softmax_cross_entropy(x, lab), g.softmax_cross_entropy_backward(ct, x, lab)])
    return g


def _torch(x: np.ndarray, y: np.ndarray, ct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Loss per row and d(sum(ct * loss))/dx by torch autograd, in float64."""
    c = x.shape[-1]
    tx = torch.tensor(x.astype(np.float64).reshape(-1, c), requires_grad=True)
    ty = torch.tensor(np.where((y < 0) & (y >= -c), y + c, y).reshape(-1))
    loss = F.cross_entropy(tx, ty, reduction="none", ignore_index=-100)
    (loss * torch.tensor(ct.astype(np.float64).reshape(-1))).sum().backward()
    return loss.detach().numpy().reshape(y.shape), tx.grad.numpy().reshape(x.shape)


@pytest.mark.parametrize(("lead", "c"), [((5,), 7), ((2, 3), 4), ((1,), 1), ((4,), 300)])
def test_matches_torch_reference_and_compiled(lead, c):
    rng = np.random.default_rng(c)
    x = (rng.standard_normal((*lead, c)) * 4).astype(np.float32)
    y = rng.integers(-c, c, lead)  # negative labels count from the end
    ct = rng.standard_normal(lead).astype(np.float32)
    want = _torch(x, y, ct)
    g = _graph(lead, c)
    feed = {"x": x, "y": y, "ct": ct}
    ref = g.evaluate(feed)
    native, numpy_ = (rlx.Session("cpu").compile(g, o) for o in (RAW, NUMPY))
    assert set(_kinds(numpy_).values()) == {"NUMPY"}
    got, exact = native.run(feed), numpy_.run(feed)
    for a, b, e, w in zip(ref, got, exact, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=2e-5, atol=2e-6)
        np.testing.assert_array_equal(a, e)  # the NumPy kernel: the reference's arithmetic
        np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-7)  # the native: libmvec's exp


def test_large_logits_do_not_overflow_and_non_finite_rows_are_nan():
    x = np.array(
        [[1e4, -1e4, 0.0], [np.inf, 0.0, 1.0], [np.nan, 0.0, 1.0], [-np.inf] * 3, [0, -np.inf, 1]],
        np.float32,
    )
    y = np.array([1, 0, 2, 0, 1])
    ct = np.ones(5, np.float32)
    g = _graph((5,), 3)
    runs = [g.evaluate({"x": x, "y": y, "ct": ct})]
    runs += [rlx.Session("cpu").compile(g, o).run({"x": x, "y": y, "ct": ct}) for o in (RAW, NUMPY)]
    for loss, dx in runs:
        with np.errstate(all="ignore"):
            want = -torch.log_softmax(torch.tensor(x, dtype=torch.float64), -1).numpy()
        want = want[np.arange(5), y]
        np.testing.assert_allclose(loss, want, rtol=1e-6)  # 2e4, NaN, NaN, NaN, +inf
        assert np.isnan(dx[1:4]).all() and np.isfinite(dx[[0, 4]]).all()


def test_out_of_range_labels_fail_when_the_graph_runs():
    g = _graph((3,), 4)
    feed = {
        "x": np.zeros((3, 4), np.float32),
        "y": np.array([0, 4, 1]),
        "ct": np.ones(3, np.float32),
    }
    with pytest.raises(InputError, match=r"softmax_cross_entropy: label 4 out of range for 4"):
        g.evaluate(feed)
    for o in (RAW, NUMPY):
        with pytest.raises(InputError, match=r"label 4 out of range"):
            rlx.Session("cpu").compile(g, o).run(feed)


def test_empty_batch_and_symbolic_rows():
    g = rlx.Graph("ce")
    n = g.sym("n", 0, 16)
    x, y = g.input("x", (n, 3)), g.input("y", (n,), DType.I64)
    g.set_outputs([g.softmax_cross_entropy(x, y)])
    rng = np.random.default_rng(0)
    for cg in (rlx.Session("cpu").compile(g, o) for o in (RAW, NUMPY)):
        for rows in (0, 1, 6):
            xs, ys = rng.standard_normal((rows, 3)).astype(np.float32), rng.integers(0, 3, rows)
            want = _torch(xs, ys, np.ones(rows, np.float32))[0] if rows else np.zeros(0)
            got = cg.run({"x": xs, "y": ys})[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dt", [DType.F64, DType.F16, DType.BF16])
def test_other_float_dtypes_match_the_reference_on_both_kernels(dt):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 5)).astype(dt.np)
    y = rng.integers(0, 5, 6)
    ct = rng.standard_normal(6).astype(dt.np)
    g = _graph((6,), 5, dt)
    feed = {"x": x, "y": y, "ct": ct}
    tol = 1e-12 if dt is DType.F64 else 1e-2
    for opts, kernel in ((RAW, "NATIVE"), (NUMPY, "NUMPY")):
        cg = rlx.Session("cpu").compile(g, opts)
        assert set(_kinds(cg).values()) == {kernel}
        for a, b in zip(g.evaluate(feed), cg.run(feed), strict=True):
            assert a.dtype == dt.np and b.dtype == dt.np
            np.testing.assert_allclose(
                a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol
            )


def test_shape_rules_name_the_op_and_what_they_expected():
    g = rlx.Graph("bad")
    x, y = g.input("x", (4, 3)), g.input("y", (4,), DType.I64)
    with pytest.raises(
        ShapeError, match=r"softmax_cross_entropy: labels .* must have the logits' dims"
    ):
        g.softmax_cross_entropy(x, g.input("y2", (3,), DType.I64))
    with pytest.raises(ShapeError, match=r"labels must be an integer tensor"):
        g.softmax_cross_entropy(x, g.input("yf", (4,)))
    with pytest.raises(ShapeError, match=r"logits must be a float tensor"):
        g.softmax_cross_entropy(g.input("xi", (4, 3), DType.I32), y)
    with pytest.raises(ShapeError, match=r"softmax_cross_entropy_backward: the cotangent"):
        g.softmax_cross_entropy_backward(g.input("c", (4,), DType.F64), x, y)
    assert SoftmaxCrossEntropyWithLogits.kind is SoftmaxCrossEntropyBackward.kind


def test_out_of_range_zero_is_torch_ignore_index_on_every_kernel():
    """``OutOfRange.ZERO``: a label outside [0, C) (negative ones included) gives a row of
    loss 0 and gradient 0, as torch's ignore_index."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = np.array([0, 5, -1, 2, -100, 4])
    ct = rng.standard_normal(6).astype(np.float32)
    g = rlx.Graph("ce0")
    xi, yi, ci = g.input("x", (6, 5)), g.input("y", (6,), DType.I64), g.input("ct", (6,))
    zero = OutOfRange.ZERO
    g.set_outputs(
        [g.softmax_cross_entropy(xi, yi, zero), g.softmax_cross_entropy_backward(ci, xi, yi, zero)]
    )
    want = _torch(x, np.where((y < 0) | (y >= 5), -100, y), ct)
    feed = {"x": x, "y": y, "ct": ct}
    runs = [g.evaluate(feed)] + [rlx.Session("cpu").compile(g, o).run(feed) for o in (RAW, NUMPY)]
    for got in runs:
        for a, w in zip(got, want, strict=True):
            np.testing.assert_allclose(a, w, rtol=2e-5, atol=2e-6)
        assert not got[0][[1, 2, 4]].any() and not got[1][[1, 2, 4]].any()
