"""Differential fuzzing of the remaining ops (harness.py: reference interpreter and compiled
graph, every precision policy and native target): sampling, state, control flow, custom
ops, regions and constants, against oracles written here:

* ``sample``: its documented contract (temperature, top-k, top-p, greedy, offset) over a
  Philox4x32-10 written here in Python ints, itself checked against Random123's published
  known-answer vectors;
* ``assign`` and ``adam_update``: several runs of one compiled graph whose params change
  in place, against an explicit state machine and ``torch.optim.Adam`` / ``AdamW``
  (float64) with the same learning rates;
* ``if`` / ``while`` / ``scan``: bodies drawn from a small menu of functions, run as
  Python loops over the same functions in float64, each step's input and result rounded
  to the precision the policy runs the bodies' (elementwise) ops at;
* ``custom`` (a registered op whose reference is a NumPy function, with attributes) and
  ``custom_fn`` (a sub-graph as one op): the functions in float64;
* ``elementwise_region`` (a body of elementwise ops as one node), ``barrier``,
  ``stop_gradient``, ``constant`` (every dtype), ``input`` / ``param``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.dtype import DType
from rlx.ops.base import OpKind
from rlx.ops.core import StopGradient
from rlx.ops.custom import register_custom_op
from rlx.ops.fused import ElementwiseRegion
from rlx.ops.sample import Sample
from rlx.ops.state import AdamUpdate, Barrier
from rlx.options import CompileOptions
from rlx.runtime.session import Session
from rlx.shape import Shape

from .harness import EXACT, SEEDS, Tol, check, compiled, exact_values, examples

F32 = np.float32
M32 = 0xFFFFFFFF

# ---- sample --------------------------------------------------------------------------------


def philox4x32_10(ctr: tuple[int, ...], key: tuple[int, int]) -> tuple[int, ...]:
    """Random123's Philox4x32 with 10 rounds, in Python ints."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for i in range(10):
        if i:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


def test_philox_oracle_matches_random123_known_answers() -> None:
    kat = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]  # fmt: skip
    for ctr, key, want in kat:
        assert philox4x32_10(ctr, key) == want


def _sample_row(z: list[float], u: float, t: float, top_k: int, top_p: float) -> int:
    if t == 0:
        return max(range(len(z)), key=lambda i: (z[i], -i))  # first maximum
    z = [v / t for v in z]
    if 0 < top_k < len(z):
        kth = sorted(z, reverse=True)[top_k - 1]
        z = [v if v >= kth else -math.inf for v in z]
    m = max(z)
    e = [math.exp(v - m) for v in z]
    p = [v / sum(e) for v in e]
    if top_p < 1:
        order = sorted(range(len(p)), key=lambda i: (-p[i], i))
        keep, acc = set(), 0.0
        for i in order:
            keep.add(i)
            acc += p[i]
            if acc >= top_p:
                break
        p = [v if i in keep else 0.0 for i, v in enumerate(p)]
    total = sum(p)
    acc = 0.0
    for i, v in enumerate(p):
        acc += v
        if acc > u * total:
            return i
    return len(p) - 1  # pragma: no cover - u < 1


@examples(12)
@given(
    lead=st.sampled_from([(), (1,), (3,), (2, 2)]), vocab=st.integers(1, 12),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 2.5]), top_k=st.sampled_from([0, 1, 3, 20]),
    top_p=st.sampled_from([1.0, 0.9, 0.3]), seed=st.integers(0, 2**64 - 1),
    offset=st.sampled_from([None, 0, 7, 2**33 + 5]), data_seed=SEEDS,
)  # fmt: skip
def test_sample_matches_the_contract(
    lead, vocab, temperature, top_k, top_p, seed, offset, data_seed
):
    rng = np.random.default_rng(data_seed)
    logits = (rng.standard_normal((*lead, vocab)) * 2).astype(F32)
    hide = rng.random(logits.shape) < 0.2
    hide[..., 0] = False  # never a row of only -inf
    logits[hide] = -np.inf
    g = rlx.Graph("sample")
    ins = [g.input("logits", logits.shape)]
    feeds = {"logits": logits}
    if offset is not None:
        ins.append(g.input("offset", (1,), "i64"))
        feeds["offset"] = np.array([offset], np.int64)
    op = Sample(temperature, top_k, top_p, seed, offset is not None)
    g.set_outputs([g.apply(op, ins)])
    off = offset or 0
    rows = logits.reshape(-1, vocab).astype(np.float64)
    want = []
    for r, z in enumerate(rows):
        ctr = (r & M32, r >> 32, off & M32, (off >> 32) & M32)
        u = (philox4x32_10(ctr, (seed & M32, seed >> 32))[0] >> 8) * 2.0**-24
        want.append(_sample_row(list(z), u, temperature, top_k, top_p))
    check(g, feeds, {}, [np.array(want, np.int64).reshape(lead)], [OpKind.REDUCTION], EXACT)


# ---- state: assign, adam_update, barrier, stop_gradient, constant ------------------------------


@examples(8)
@given(shape=st.sampled_from([(3,), (2, 3)]), runs=st.integers(1, 4), seed=SEEDS)
def test_assign_barrier_stop_gradient_constant_over_runs(shape, runs, seed) -> None:
    rng = np.random.default_rng(seed)
    p0 = exact_values(rng, shape, lim=8)
    xs = [exact_values(rng, shape, lim=8) for _ in range(runs)]
    c = exact_values(rng, shape, lim=8)
    ci = rng.integers(-9, 9, shape).astype(np.int32)
    g = rlx.Graph("assign")
    p, x = g.param("p", shape), g.input("x", shape)
    token = g.assign(p, g.add(p, x))  # p <- p + x after every other node
    kept = g.apply(Barrier(), [g.mul(p, 2.0)])
    # p read by a cast to f64 (exact under every policy); the param itself as an output is
    # test_param_output_is_read_before_the_assign_in_the_same_run
    g.set_outputs([
        token, g.cast(p, "f64"), kept, g.apply(StopGradient(), [g.sub(x, p)]),
        g.add(g.constant(c), x), g.constant(ci),
    ])  # fmt: skip

    def wants():  # the params before each run, and its outputs
        state = p0.astype(np.float64)
        for xv in xs:
            yield [np.zeros((0,)), state.copy(), 2 * state, xv - state, c + xv, ci]
            state = state + xv

    all_want = list(wants())
    got = g.evaluate({"x": xs[0]}, {"p": p0})  # the reference changes nothing
    for i, (a, b) in enumerate(zip(got, all_want[0], strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"reference output {i}")
    for v in compiled(g, {"p": p0}, [OpKind.ELEMENTWISE, OpKind.DATA_MOVEMENT]):
        for step, (xv, want) in enumerate(zip(xs, all_want, strict=True)):
            for i, (a, b) in enumerate(zip(v.cg.run({"x": xv}), want, strict=True)):
                assert a.shape == b.shape, f"{v.label} run {step} output {i}"
                np.testing.assert_array_equal(a, b, err_msg=f"{v.label} run {step} output {i}")


@examples(8)
@given(
    shape=st.sampled_from([(4,), (2, 3)]), decoupled=st.booleans(),
    wd=st.sampled_from([0.0, 0.01, 0.3]), betas=st.sampled_from([(0.9, 0.999), (0.5, 0.9)]),
    eps=st.sampled_from([1e-8, 1e-3]), steps=st.integers(1, 4), seed=SEEDS,
)  # fmt: skip
def test_adam_update_matches_torch_optim(shape, decoupled, wd, betas, eps, steps, seed) -> None:
    rng = np.random.default_rng(seed)
    p0 = rng.standard_normal(shape).astype(F32)
    grads = [rng.standard_normal(shape).astype(F32) for _ in range(steps)]
    lrs = [float(v) for v in rng.uniform(1e-3, 0.1, steps)]
    zeros = np.zeros(shape, F32)
    g = rlx.Graph("adam")
    p, m, v = g.param("p", shape), g.param("m", shape), g.param("v", shape)
    gi, lr, st_ = g.input("g", shape), g.input("lr", (), "f64"), g.input("step", (), "f64")
    op = AdamUpdate(betas[0], betas[1], eps, wd, decoupled)
    # the state read by casts to f64: exact under every policy (the params themselves as
    # outputs: the next test)
    g.set_outputs([g.apply(op, [p, gi, m, v, lr, st_]), *(g.cast(t, "f64") for t in (p, m, v))])
    tp = torch.tensor(p0.astype(np.float64), requires_grad=True)
    opt = (torch.optim.AdamW if decoupled else torch.optim.Adam)(
        [tp], lr=lrs[0], betas=betas, eps=eps, weight_decay=wd
    )
    want = []
    for i in range(steps):
        state = opt.state[tp]
        mm = state["exp_avg"].numpy().copy() if state else np.zeros(shape)
        vv = state["exp_avg_sq"].numpy().copy() if state else np.zeros(shape)
        want.append([tp.detach().numpy().copy(), mm, vv])
        tp.grad = torch.tensor(grads[i].astype(np.float64))
        opt.param_groups[0]["lr"] = lrs[i]
        opt.step()
    params = {"p": p0, "m": zeros, "v": zeros}
    feeds = [{"g": grads[i], "lr": np.float64(lrs[i]), "step": np.float64(i + 1)} for i in range(steps)]  # fmt: skip
    for var in compiled(g, params, [OpKind.BOUNDARY]):
        for i in range(steps):
            out = var.cg.run(feeds[i])
            for j, (a, b) in enumerate(zip(out[1:], want[i], strict=True)):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{var.label} step {i} {'pmv'[j]}")  # fmt: skip


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("effect", ["assign", "adam_update"])
def test_param_output_is_read_before_the_assign_in_the_same_run(native, effect) -> None:
    g = rlx.Graph("assign_output")
    p = g.param("p", (2,))
    if effect == "assign":
        token = g.assign(p, g.add(p, 1.0))
    else:
        m, v = g.param("m", (2,)), g.param("v", (2,))
        lr, step = g.constant(np.array(0.1, np.float64)), g.constant(np.array(1.0, np.float64))
        token = g.apply(AdamUpdate(), [p, g.constant(np.ones(2, F32)), m, v, lr, step])
    g.set_outputs([token, p, g.reshape(p, (1, 2)), g.mul(p, 1.0)])
    zeros = np.zeros(2, F32)
    params = {"p": zeros} if effect == "assign" else {"p": zeros, "m": zeros, "v": zeros}
    want = [np.zeros(0), zeros, zeros[None], zeros]
    for i, (a, b) in enumerate(zip(g.evaluate({}, params), want, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"reference output {i}")
    cg = Session("cpu").compile(g, CompileOptions(use_cache=False, native=native), params=params)
    for i, (a, b) in enumerate(zip(cg.run({}), want, strict=True)):  # p before the update
        np.testing.assert_array_equal(a, b, err_msg=f"compiled output {i}")


# ---- control flow and sub-graph ops ---------------------------------------------------------

# (builder on a sub-graph, float64 function): the bodies drawn
MENU = {
    "tanh": (lambda s, x: s.tanh(x), np.tanh),
    "affine": (lambda s, x: s.add(s.mul(x, 0.5), 0.25), lambda x: 0.5 * x + 0.25),
    "sin": (lambda s, x: s.sin(x), np.sin),
    "square_minus": (lambda s, x: s.sub(s.mul(x, x), 1.0), lambda x: x * x - 1.0),
    "relu_neg": (lambda s, x: s.neg(s.relu(x)), lambda x: -np.maximum(x, 0.0)),
}
FNS = st.sampled_from(list(MENU))
# the bodies run at the policy's elementwise precision (their interface stays f32): the
# oracles round each step's input and result; the ops' own tolerance holds over <= 5 steps
CONTROL_TOL = Tol()


@examples(10)
@given(shape=st.sampled_from([(3,), (2, 2)]), fa=FNS, fb=FNS, n=st.integers(0, 5), seed=SEEDS)
def test_if_and_while_match_python_loops(shape, fa, fb, n, seed) -> None:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, shape).astype(F32)
    pred = np.array(bool(rng.random() < 0.5))
    g = rlx.Graph("control")
    xi, pi = g.input("x", shape), g.input("pred", (), "bool")
    (bt, ft), (be, fe) = MENU[fa], MENU[fb]
    y_if = g.cond(pi, lambda s, a: bt(s, a), lambda s, a: be(s, a), [xi])

    def cond(s, i, a):  # the bound is a constant of the condition's graph
        return s.lt(i, s.constant(np.array(n, np.int32)))

    def body(s, i, a):
        return [s.add(i, s.constant(np.array(1, np.int32))), bt(s, a)]

    zero = g.constant(np.array(0, np.int32))
    y_while = g.while_loop(cond, body, [zero, xi], output_index=1, max_iterations=10)
    count = g.while_loop(cond, body, [zero, xi], output_index=0, max_iterations=10)
    g.set_outputs([y_if, y_while, count])

    def want(rnd):
        loop = rnd(x)
        for _ in range(n):
            loop = rnd(ft(rnd(loop)))
        return [rnd((ft if pred else fe)(rnd(x))), loop, np.array(n, np.int64)]

    check(g, {"x": x, "pred": pred}, {}, want, [OpKind.ELEMENTWISE], CONTROL_TOL)


@examples(10)
@given(length=st.integers(1, 5), width=st.integers(1, 3), f=FNS, reverse=st.booleans(),
       out=st.integers(0, 1), seed=SEEDS)  # fmt: skip
def test_scan_matches_a_python_loop(length, width, f, reverse, out, seed) -> None:
    rng = np.random.default_rng(seed)
    c0 = rng.uniform(-1, 1, width).astype(F32)
    xs = rng.uniform(-1, 1, (length, width)).astype(F32)
    build, fn = MENU[f]
    g = rlx.Graph("scan")

    def body(s, c, x):  # carry c <- f(c) * 0.5 + x; y = c * x
        nc = s.add(s.mul(build(s, c), 0.5), x)
        return [nc, s.mul(nc, x)]

    y = g.scan(body, [g.input("c", (width,))], [g.input("xs", (length, width))],
               output_index=out, reverse=reverse)  # fmt: skip
    g.set_outputs([y])

    def want(rnd):
        c, ys = rnd(c0), np.zeros((length, width))
        for t in range(length - 1, -1, -1) if reverse else range(length):
            c = rnd(rnd(fn(rnd(c))) * 0.5 + rnd(xs[t]))
            ys[t] = rnd(c * rnd(xs[t]))
        return [c if out == 0 else ys]

    check(g, {"c": c0, "xs": xs}, {}, want, [OpKind.ELEMENTWISE], CONTROL_TOL)


@examples(10)
@given(shape=st.sampled_from([(3,), (2, 3)]), f=FNS, alpha=st.sampled_from([0.5, -2.0]),
       seed=SEEDS)  # fmt: skip
def test_custom_and_custom_fn_match_their_functions(shape, f, alpha, seed) -> None:
    rng = np.random.default_rng(seed)
    x, y = (rng.uniform(-1, 1, shape).astype(F32) for _ in range(2))
    build, fn = MENU[f]

    def infer(ins: tuple[Shape, ...], attrs) -> Shape:
        return ins[0]

    def reference(xs, attrs, ctx):  # the user's NumPy function
        return np.sin(xs[0]) * attrs["alpha"] + xs[1]

    register_custom_op(
        "fuzz_sin_axpy", infer, reference, arity=2, kind=OpKind.COMPUTE, replace=True
    )
    g = rlx.Graph("custom")
    xi, yi = g.input("x", shape), g.input("y", shape)
    g.set_outputs([
        g.custom("fuzz_sin_axpy", [xi, yi], alpha=alpha),
        g.custom_fn([xi, yi], lambda s, a, b: s.mul(build(s, a), b)),
    ])  # fmt: skip

    def oracle(rnd):  # custom runs at the policy's precision; custom_fn keeps f32
        sx = np.array([math.sin(v) for v in rnd(x).flat]).reshape(shape)
        return [sx * alpha + rnd(y), fn(x.astype(np.float64)) * y]

    check(g, {"x": x, "y": y}, {}, oracle, [OpKind.COMPUTE], Tol(1e-6, 1.5e-3, 1e-2))


@pytest.mark.slow  # about 1 s with a warm native cache, 20 s with a cold one (C per body)
@examples(10)
@given(shape=st.sampled_from([(4,), (2, 3)]), fa=FNS, fb=FNS, seed=SEEDS)
def test_elementwise_region_matches_its_body(shape, fa, fb, seed) -> None:
    rng = np.random.default_rng(seed)
    a, b = (rng.uniform(-1, 1, shape).astype(F32) for _ in range(2))
    body = rlx.Graph("body")
    i0, i1 = body.input("in0", shape), body.input("in1", shape)
    body.set_outputs([body.where(body.gt(i0, 0.0), MENU[fa][0](body, i0), body.mul(MENU[fb][0](body, i1), i0))])  # fmt: skip
    g = rlx.Graph("region")
    g.set_outputs([g.apply(ElementwiseRegion(body), [g.input("a", shape), g.input("b", shape)])])

    def oracle(rnd):  # the region runs at the policy's precision; the comparison reads f32
        ra, rb = rnd(a), rnd(b)
        return [np.where(a > 0, MENU[fa][1](ra), MENU[fb][1](rb) * ra)]

    check(g, {"a": a, "b": b}, {}, oracle, [OpKind.ELEMENTWISE], Tol(1e-6, 3e-3, 2.4e-2))


CONST_DTYPES = ["f32", "f64", "f16", "bf16", "i8", "i32", "i64", "u8", "bool"]


@examples(8)
@given(dt=st.sampled_from(CONST_DTYPES), shape=st.sampled_from([(), (3,), (2, 2)]), seed=SEEDS)
def test_constants_inputs_and_params_come_out_unchanged(dt, shape, seed) -> None:
    rng = np.random.default_rng(seed)
    np_dt = DType(dt).np
    v = exact_values(rng, shape, lim=40).astype(np_dt) if dt != "bool" else rng.random(shape) < 0.5
    g = rlx.Graph("const")
    g.set_outputs([g.constant(np.asarray(v, np_dt)), g.input("x", shape, dt), g.param("w", shape, dt)])  # fmt: skip
    floating = DType(dt).is_float
    want = [np.asarray(v).astype(np.float64) if floating else np.asarray(v)] * 3
    check(
        g, {"x": np.asarray(v, np_dt)}, {"w": np.asarray(v, np_dt)}, want, [OpKind.BOUNDARY], EXACT
    )
