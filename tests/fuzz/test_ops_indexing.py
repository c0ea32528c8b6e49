"""Differential fuzzing of the indexing and data-movement ops (harness.py: reference
interpreter and compiled graph, every precision policy and native target) against
``onnx.reference.ReferenceEvaluator`` (the ONNX operator definitions in Python, one-node
models at opset 18) and explicit loops:

* ``scatter_elements`` (every reduction) / ``gather_nd`` (batch dims) / ``scatter_nd``
  (every reduction) / ``gather``: ONNX ScatterElements, GatherND, ScatterND, Gather;
  negative indices included; a replace scatter gets distinct target positions (ONNX
  leaves repeats undefined); ``gather_elements``: ``torch.gather`` (ONNX's reference
  implementation wants indices as large as x off the axis; rlx and torch allow smaller);
* ``pad`` / ``slice`` / ``expand`` / ``concat`` / ``transpose`` / ``reshape`` /
  ``narrow`` / ``topk`` (values and indices, ties) / ``argmax`` /
  ``argmin`` / ``cumsum`` (reverse, exclusive): ONNX Pad, Slice, Expand, Concat,
  Transpose, Reshape, TopK, ArgMax, ArgMin, CumSum;
* ``scatter_add``: ``torch.Tensor.index_add``; ``cumprod``: a Python loop.

Float values are quarters on a small grid (harness.exact_values): moving, summing and
comparing them is exact in f16 and bf16, so every output must equal the oracle exactly
under every policy (``mul`` scatters use powers of two for the same reason).
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import rlx
from rlx.ops.base import OpKind
from rlx.ops.cumulative import CumProd
from rlx.ops.indexing import GatherElements, GatherNd, ScatterElements, ScatterNd, ScatterReduction
from rlx.ops.movement import (
    Concat,
    Expand,
    Gather,
    Narrow,
    Pad,
    Reshape,
    ScatterAdd,
    Slice,
    Transpose,
)
from rlx.ops.reduce import ArgMax, ArgMin, Cumsum, TopK

from .harness import EXACT, SEEDS, check, exact_values, examples

MOVE = [OpKind.DATA_MOVEMENT]
REDUCE = [OpKind.REDUCTION]
IDX = {np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}
_ONNX_TYPES = {np.dtype(np.float64): TensorProto.DOUBLE, np.dtype(np.float32): TensorProto.FLOAT,
               np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}  # fmt: skip


def onnx_run(op_type: str, inputs: list[np.ndarray], n_out: int = 1, **attrs) -> list[np.ndarray]:
    """One ``op_type`` node over ``inputs`` (f64 / int arrays) by the ONNX reference
    evaluator."""
    names = [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    vin = [
        helper.make_tensor_value_info(n, _ONNX_TYPES[a.dtype], a.shape)
        for n, a in zip(names, inputs, strict=True)
    ]
    vout = [helper.make_empty_tensor_value_info(n) for n in outs]
    model = helper.make_model(
        helper.make_graph([node], "g", vin, vout), opset_imports=[helper.make_opsetid("", 18)]
    )
    return list(ReferenceEvaluator(model).run(None, dict(zip(names, inputs, strict=True))))


def _values(rng: np.random.Generator, shape, red: ScatterReduction | None = None) -> np.ndarray:
    if red is ScatterReduction.MUL:  # powers of two: products stay exact at 8 bits
        return (2.0 ** rng.integers(-2, 3, shape) * rng.choice([-1, 1], shape)).astype(np.float32)
    return exact_values(rng, shape, lim=24)


def _f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


# ---- gather_elements / scatter_elements ----------------------------------------------------


@st.composite
def elements_cases(draw: st.DrawFn):
    shape = draw(st.sampled_from([(5,), (3, 4), (2, 3, 2), (4, 1, 3)]))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    # indices no larger than x on the other axes, any length along the axis
    idx_shape = tuple(
        draw(st.integers(1, 4)) if i == axis % len(shape) else draw(st.integers(1, d))
        for i, d in enumerate(shape)
    )
    red = draw(st.sampled_from(list(ScatterReduction)))
    return shape, axis, idx_shape, red, draw(st.sampled_from([np.int32, np.int64]))


def _distinct_along(rng, shape, idx_shape, ax) -> np.ndarray:
    """Indices whose positions along ``ax`` are distinct in every fiber (negative half the
    time)."""
    n, m = shape[ax], min(idx_shape[ax], shape[ax])
    keys = rng.random((*idx_shape[:ax], n, *idx_shape[ax + 1 :]))
    idx = np.take(np.argsort(keys, axis=ax), range(m), axis=ax)
    return np.where(rng.random(idx.shape) < 0.5, idx - n, idx)


@examples(14)
@given(case=elements_cases(), gather=st.booleans(), seed=SEEDS)
def test_gather_and_scatter_elements_match_onnx(case, gather, seed) -> None:
    shape, axis, idx_shape, red, idt = case
    ax = axis % len(shape)
    rng = np.random.default_rng(seed)
    x = _values(rng, shape, None if gather else red)
    g = rlx.Graph("elements")
    xi = g.input("x", shape)
    if gather:
        idx = rng.integers(-shape[ax], shape[ax], idx_shape).astype(idt)
        ii = g.input("idx", idx.shape, IDX[idx.dtype])
        g.set_outputs([g.apply(GatherElements(axis), [xi, ii])])
        feeds = {"x": x, "idx": idx}
        # torch.gather (ONNX's reference wants idx as large as x off the axis)
        pos = torch.as_tensor(np.where(idx < 0, idx + shape[ax], idx).astype(np.int64))
        want = [torch.gather(torch.as_tensor(_f64(x)), ax, pos).numpy()]
    else:
        if red is ScatterReduction.NONE:
            idx = _distinct_along(rng, shape, idx_shape, ax).astype(idt)
        else:
            idx = rng.integers(-shape[ax], shape[ax], idx_shape).astype(idt)
        upd = _values(rng, idx.shape, red)
        ii = g.input("idx", idx.shape, IDX[idx.dtype])
        g.set_outputs([g.apply(ScatterElements(axis, red), [xi, ii, g.input("u", upd.shape)])])
        feeds = {"x": x, "idx": idx, "u": upd}
        want = onnx_run(
            "ScatterElements", [_f64(x), idx.astype(np.int64), _f64(upd)], axis=axis,
            reduction=red.value,
        )  # fmt: skip
    check(g, feeds, {}, want, MOVE, EXACT)


# ---- gather_nd / scatter_nd ---------------------------------------------------------------


@st.composite
def nd_cases(draw: st.DrawFn):
    shape = draw(st.sampled_from([(4,), (3, 4), (2, 3, 2), (2, 2, 3, 2)]))
    b = draw(st.integers(0, len(shape) - 1))
    k = draw(st.integers(1, len(shape) - b))
    lead = tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2))))
    return shape, b, k, lead, draw(st.sampled_from(list(ScatterReduction)))


@examples(14)
@given(case=nd_cases(), gather=st.booleans(), seed=SEEDS)
def test_gather_and_scatter_nd_match_onnx(case, gather, seed) -> None:
    shape, b, k, lead, red = case
    rng = np.random.default_rng(seed)
    if not gather:
        b = 0  # scatter_nd has no batch dims
    idx_shape = (*shape[:b], *lead, k)
    g = rlx.Graph("nd")
    if gather:
        x = _values(rng, shape)
        dims = np.array(shape[b : b + k])
        idx = (rng.integers(-(2**30), 2**30, idx_shape) % (2 * dims)) - dims
        g.set_outputs([g.apply(GatherNd(b), [g.input("x", shape), g.input("idx", idx_shape, "i64")])])  # fmt: skip
        feeds = {"x": x, "idx": idx}
        want = onnx_run("GatherND", [_f64(x), idx], batch_dims=b)
    else:
        x = _values(rng, shape, red)
        dims = np.array(shape[:k])
        m = int(np.prod(lead)) if lead else 1
        if red is ScatterReduction.NONE:  # distinct index tuples
            m = min(m, int(np.prod(dims)))
            flat = rng.permutation(int(np.prod(dims)))[:m]
            lead = (m,)
            idx = np.stack(np.unravel_index(flat, tuple(dims)), -1)
        else:
            idx = rng.integers(0, dims, (m, k)).reshape(*lead, k) if lead else rng.integers(0, dims, (k,))  # fmt: skip
        idx = np.where(rng.random(idx.shape) < 0.4, idx - dims, idx).astype(np.int64)
        upd = _values(rng, (*idx.shape[:-1], *shape[k:]), red)
        ins = [g.input("x", shape), g.input("idx", idx.shape, "i64"), g.input("u", upd.shape)]
        g.set_outputs([g.apply(ScatterNd(red), ins)])
        feeds = {"x": x, "idx": idx, "u": upd}
        want = onnx_run("ScatterND", [_f64(x), idx, _f64(upd)], reduction=red.value)
    check(g, feeds, {}, want, MOVE, EXACT)


# ---- gather / scatter_add ------------------------------------------------------------------


@examples(10)
@given(
    shape=st.sampled_from([(5,), (3, 4), (2, 3, 2)]),
    idx_shape=st.sampled_from([(), (1,), (4,), (2, 3)]),
    data=st.data(),
    seed=SEEDS,
)
def test_gather_matches_onnx_and_scatter_add_matches_index_add(shape, idx_shape, data, seed):
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    rng = np.random.default_rng(seed)
    x = _values(rng, shape)
    idx = rng.integers(-n, n, idx_shape).astype(data.draw(st.sampled_from([np.int32, np.int64])))
    m = 4
    sidx = rng.integers(-n, n, m).astype(np.int64)
    upd = _values(rng, (*shape[:axis], m, *shape[axis + 1 :]))
    g = rlx.Graph("gather")
    xi = g.input("x", shape)
    gathered = g.apply(Gather(axis), [xi, g.input("idx", idx_shape, IDX[idx.dtype])])
    added = g.apply(ScatterAdd(axis), [xi, g.input("sidx", (m,), "i64"), g.input("u", upd.shape)])
    g.set_outputs([gathered, added])
    want = onnx_run("Gather", [_f64(x), idx.astype(np.int64)], axis=axis)
    pos = torch.as_tensor(np.where(sidx < 0, sidx + n, sidx))
    want.append(torch.as_tensor(_f64(x)).index_add(axis, pos, torch.as_tensor(_f64(upd))).numpy())
    check(g, {"x": x, "idx": idx, "sidx": sidx, "u": upd}, {}, want, MOVE, EXACT)


# ---- pad / slice / expand -----------------------------------------------------------------

SHAPES = st.sampled_from([(4,), (3, 4), (2, 3, 2), (1, 3, 1)])


@examples(10)
@given(shape=SHAPES, data=st.data(), seed=SEEDS)
def test_movement_ops_match_onnx(shape, data, seed) -> None:
    """pad, slice, expand, and concat / transpose / reshape / narrow (also drawn by the
    random graphs of test_differential.py, which force no native target)."""
    rng = np.random.default_rng(seed)
    r = len(shape)
    x = _values(rng, shape)
    pads = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape)
    value = data.draw(st.sampled_from([0.0, -1.5, 2.25, float("inf"), float("-inf"), float("nan")]))
    starts, stops, steps = [], [], []
    for _ in range(r):
        step = data.draw(st.sampled_from([1, 1, 2, -1, -2, 3]))
        starts.append(data.draw(st.sampled_from([None, 0, 1, -1, -3, 5])))
        stops.append(data.draw(st.sampled_from([None, 0, 2, -1, -5, 6])))
        steps.append(step)
    target = tuple(data.draw(st.sampled_from([d, 3])) if d == 1 else d for d in shape)
    target = (2,) * data.draw(st.integers(0, 1)) + target
    perm = tuple(data.draw(st.permutations(range(r))))
    axis = data.draw(st.integers(0, r - 1))
    y = _values(rng, tuple(data.draw(st.integers(1, 3)) if i == axis else d for i, d in enumerate(shape)))  # fmt: skip
    start = data.draw(st.integers(0, shape[axis] - 1))
    length = data.draw(st.integers(0, shape[axis] - start))
    n = int(np.prod(shape))
    dims = data.draw(st.sampled_from([(n,), (1, n), (n, 1)] + ([(shape[-1], n // shape[-1])])))
    g = rlx.Graph("movement")
    xi, yi = g.input("x", shape), g.input("y", y.shape)
    g.set_outputs([
        g.apply(Pad(pads, value), [xi]),
        g.apply(Slice(tuple(starts), tuple(stops), tuple(steps)), [xi]),
        g.apply(Expand(target), [xi]),
        g.apply(Transpose(perm), [xi]),
        g.apply(Concat(axis), [xi, yi, xi]),
        g.apply(Narrow(axis, start, length), [xi]),
        g.apply(Reshape(dims), [xi]),
    ])  # fmt: skip
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    st_ = [(0 if s > 0 else big) if a is None else a for a, s in zip(starts, steps, strict=True)]
    sp_ = [(big if s > 0 else small) if b is None else b for b, s in zip(stops, steps, strict=True)]
    onnx_pads = np.array([lo for lo, _ in pads] + [hi for _, hi in pads], np.int64)
    want = onnx_run("Pad", [_f64(x), onnx_pads, np.array(value, np.float64)], mode="constant")
    want += onnx_run("Slice", [_f64(x), *(np.array(v, np.int64) for v in (st_, sp_, range(r), steps))])  # fmt: skip
    want += onnx_run("Expand", [_f64(x), np.array(target, np.int64)])
    want += onnx_run("Transpose", [_f64(x)], perm=list(perm))
    want += onnx_run("Concat", [_f64(x), _f64(y), _f64(x)], axis=axis)
    ax = np.array([axis], np.int64)
    want += onnx_run("Slice", [_f64(x), np.array([start]), np.array([start + length]), ax])
    want += onnx_run("Reshape", [_f64(x), np.array(dims, np.int64)])
    check(g, {"x": x, "y": y}, {}, want, MOVE, EXACT)


# ---- topk / argmax / argmin / cumsum / cumprod ------------------------------------------------


@examples(12)
@given(shape=SHAPES, data=st.data(), seed=SEEDS)
def test_topk_argmax_argmin_match_onnx(shape, data, seed) -> None:
    rng = np.random.default_rng(seed)
    x = exact_values(rng, shape, lim=data.draw(st.sampled_from([3, 40])))  # ties when small
    axis = data.draw(st.integers(0, len(shape) - 1))
    k = data.draw(st.integers(0, shape[axis]))
    largest, keep = data.draw(st.booleans()), data.draw(st.booleans())
    g = rlx.Graph("topk")
    xi = g.input("x", shape)
    outs = [
        g.apply(TopK(k, axis, largest, False), [xi]),
        g.apply(TopK(k, axis, largest, True), [xi]),
    ]
    outs += [g.apply(ArgMax(axis, keep), [xi]), g.apply(ArgMin(axis, keep), [xi])]
    g.set_outputs(outs)
    want = onnx_run("TopK", [_f64(x), np.array([k], np.int64)], 2, axis=axis, largest=int(largest))
    want += onnx_run("ArgMax", [_f64(x)], axis=axis, keepdims=int(keep))
    want += onnx_run("ArgMin", [_f64(x)], axis=axis, keepdims=int(keep))
    check(g, {"x": x}, {}, want, MOVE + REDUCE, EXACT)


def _cumprod_loop(x: np.ndarray, axis: int, reverse: bool, exclusive: bool) -> np.ndarray:
    xm = np.moveaxis(x.astype(np.float64), axis, -1)
    out = np.empty_like(xm)
    n = xm.shape[-1]
    for pos in np.ndindex(xm.shape[:-1]):
        order = range(n - 1, -1, -1) if reverse else range(n)
        acc = 1.0
        for i in order:
            if exclusive:
                out[pos + (i,)] = acc
                acc *= xm[pos + (i,)]
            else:
                acc *= xm[pos + (i,)]
                out[pos + (i,)] = acc
    return np.moveaxis(out, -1, axis)


@examples(12)
@given(
    shape=SHAPES,
    reverse=st.booleans(),
    exclusive=st.booleans(),
    dtype=st.sampled_from(["f32", "i32", "i64"]),
    data=st.data(),
    seed=SEEDS,
)
def test_cumsum_matches_onnx_and_cumprod_a_loop(shape, reverse, exclusive, dtype, data, seed):
    axis = data.draw(st.integers(0, len(shape) - 1))
    rng = np.random.default_rng(seed)
    if dtype == "f32":  # quarters sum exactly; powers of two multiply exactly
        x = exact_values(rng, shape, lim=16)
        xp = (2.0 ** rng.integers(-1, 2, shape) * rng.choice([-1, 1], shape)).astype(np.float32)
    else:
        x = rng.integers(-50, 50, shape).astype(dtype.replace("i", "int"))
        xp = rng.integers(-3, 4, shape).astype(x.dtype)
    g = rlx.Graph("cumulative")
    g.set_outputs([
        g.apply(Cumsum(axis, reverse, exclusive), [g.input("x", shape, dtype)]),
        g.apply(CumProd(axis, reverse, exclusive), [g.input("xp", shape, dtype)]),
    ])  # fmt: skip
    src = _f64(x) if dtype == "f32" else x.astype(np.int64)
    want = onnx_run(
        "CumSum", [src, np.array(axis, np.int64)], exclusive=int(exclusive), reverse=int(reverse)
    )
    prod = _cumprod_loop(xp, axis, reverse, exclusive)
    want.append(prod if dtype == "f32" else prod.astype(np.int64))
    check(g, {"x": x, "xp": xp}, {}, want, REDUCE, EXACT)
