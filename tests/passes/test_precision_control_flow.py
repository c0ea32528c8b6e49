"""Precision policies inside control flow: ``if``, ``while`` and ``scan`` bodies (nested
too) run at the policy's precision with casts at the sub-graph boundary, the control-flow
node and its carries stay f32, and the precision report lists the body's decisions under
the parent node.

In: small graphs (an ``if`` over matmul branches, a ``while`` iterating a matmul cell, an
RNN cell in a ``scan``, an ``if`` inside a ``scan``, a softmax in a scan body) compiled on
the CPU under each policy (the suite verifies after every pass: RLX_VERIFY=each). Out: the
compiled bodies' node dtypes, the report's entries and text, and the outputs: equal (to a
rounding of the narrow dtype) to the NumPy reference interpreter's result of the same
converted graph, and within the policy's tolerance (max |low - f32| / max |f32|: 5e-3
f16, 3e-2 bf16, as in test_precision.py) of a NumPy f32 oracle.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.reference import evaluate
from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.ir.mir import Graph, Node
from rlx.ops.base import OpKind
from rlx.ops.control import If, Scan, While
from rlx.ops.core import Input
from rlx.ops.elementwise import Cast
from rlx.ops.linalg import MatMul
from rlx.ops.reduce import Softmax
from rlx.options import CompileOptions
from rlx.passes.precision import AutoMixedPrecision, Precision, PrecisionPolicy
from rlx.passes.precision_report import Decision, PrecisionReport
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.session import Session
from rlx.shape import Shape

P = PrecisionPolicy
F32, BF16, F16 = DType.F32, DType.BF16, DType.F16
TOL = {F32: 1e-6, F16: 5e-3, BF16: 3e-2}
# policy -> (dtype its matmuls run at, dtype its reductions run at)
POLICIES: dict[str, tuple[PrecisionPolicy, DType, DType]] = {
    "AlwaysF32": (P.AlwaysF32, F32, F32),
    "AutoMixedBf16": (P.AutoMixedBf16, BF16, BF16),
    "AutoMixed": (P.AutoMixed, F16, F16),
    "AlwaysF16": (P.AlwaysF16, F16, F16),
    "AutoMixedConservative": (P.AutoMixedConservative, F16, F32),
    "CustomComputeBf16": (P.Custom({OpKind.COMPUTE: Precision.BF16}), BF16, F32),
}
EPS = {F32: 2.0**-23, F16: 2.0**-10, BF16: 2.0**-7}
B, D, H, T = 2, 4, 5, 4


def _f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    """Normal values seeded by the shape (each test's arrays differ in shape), so a test
    sees the same data whatever runs before it."""
    return (np.random.default_rng((7, *shape)).standard_normal(shape) * scale).astype(np.float32)


def compile_cpu(g: Graph, policy: PrecisionPolicy) -> CompiledGraph:
    return Session("cpu").compile(g, CompileOptions(precision=policy, use_cache=False))


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def only(g: Graph, op: type) -> Node:
    (n,) = [n for n in g.nodes if isinstance(n.op, op)]
    return n


def check_outputs(cg: CompiledGraph, feed: dict, want: np.ndarray, low: DType) -> None:
    """The compiled result equals the reference interpreter's result of the converted
    graph (to a few roundings of ``low``) and is within ``low``'s tolerance of ``want``."""
    (got,) = cg.run(feed)
    (ref,) = evaluate(cg.graph, feed)
    assert got.dtype == ref.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=0, atol=4 * EPS[low] * np.max(np.abs(ref)))
    err = rel_err(got, want)
    assert err < TOL[low], (err, low)
    if low is not F32:
        assert err > 0  # the narrow dtype did round something


def assert_interface_f32(sub: Graph) -> None:
    """A rewritten sub-graph reads and returns f32: the parent's types are unchanged."""
    assert all(n.dtype is F32 for n in sub.nodes if isinstance(n.op, Input))
    assert all(sub.nodes[o].dtype is F32 for o in sub.outputs)


# ---- graphs ------------------------------------------------------------------------------


def if_graph() -> tuple[Graph, int]:
    """``if p: x @ w else: tanh(x @ w) * 0.5``, then + 1 outside."""
    g = Graph("if_mm")
    p = g.input("p", Shape((1,), DType.BOOL))
    x, w = g.input("x", (B, D)), g.input("w", (D, H))
    y = g.cond(
        p,
        lambda s, a, b: s.matmul(a, b),
        lambda s, a, b: s.mul(s.tanh(s.matmul(a, b)), 0.5),
        [x, w],
    )
    g.set_outputs([g.add(y, 1.0)])
    return g, y


def if_oracle(p: bool, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    y = x @ w if p else np.tanh(x @ w) * np.float32(0.5)
    return y + np.float32(1)


def while_graph() -> tuple[Graph, int]:
    """Three steps of ``h = tanh(h @ w)``, counted by an i32 carry."""
    g = Graph("while_mm")
    i, h, w = g.input("i", Shape((), DType.I32)), g.input("h", (B, H)), g.input("w", (H, H))
    out = g.while_loop(
        lambda s, i, h, w: s.lt(i, s.constant(np.int32(3))),
        lambda s, i, h, w: [s.add(i, s.constant(np.int32(1))), s.tanh(s.matmul(h, w)), w],
        [i, h, w],
        output_index=1,
    )
    g.set_outputs([out])
    return g, out


def rnn_cell(s: Graph, h: int, wx: int, wh: int, x: int) -> list[int]:
    """An Elman cell: ``h' = tanh(x @ wx + h @ wh)``; carries (h, wx, wh), y = h'."""
    h2 = s.tanh(s.add(s.matmul(x, wx), s.matmul(h, wh)))
    return [h2, wx, wh, h2]


def rnn_graph(output_index: int) -> tuple[Graph, int]:
    g = Graph("rnn")
    h0, xs = g.input("h0", (B, H)), g.input("xs", (T, B, D))
    wx, wh = g.input("wx", (D, H)), g.input("wh", (H, H))
    out = g.scan(rnn_cell, [h0, wx, wh], [xs], output_index=output_index)
    g.set_outputs([out])
    return g, out


def rnn_feed() -> dict[str, np.ndarray]:
    return {
        "h0": _f32(B, H, scale=0.5),
        "xs": _f32(T, B, D),
        "wx": _f32(D, H, scale=D**-0.5),
        "wh": _f32(H, H, scale=H**-0.5),
    }


def rnn_oracle(f: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    h, ys = f["h0"], []
    for x in f["xs"]:
        h = np.tanh(x @ f["wx"] + h @ f["wh"])
        ys.append(h)
    return h, np.stack(ys)


def nested_graph() -> tuple[Graph, int]:
    """A scan whose body picks ``c @ w`` or ``c - x`` by the sign of ``sum(x)``."""
    g = Graph("nested")
    c, w, xs = g.input("c", (1, H)), g.input("w", (H, H)), g.input("xs", (T, 1, H))

    def body(s: Graph, c: int, w: int, x: int) -> list[int]:
        p = s.reshape(s.gt(s.sum(x), s.constant(np.float32(0))), [1])
        nxt = s.cond(
            p, lambda b, u, v, _: b.matmul(u, v), lambda b, u, _, z: b.sub(u, z), [c, w, x]
        )
        return [nxt, w]

    out = g.scan(body, [c, w], [xs])
    g.set_outputs([out])
    return g, out


def softmax_scan_graph() -> tuple[Graph, int]:
    """A scan whose body is ``softmax(x @ w + h)``: a reduction inside a body."""
    g = Graph("softmax_scan")
    h0, w, xs = g.input("h0", (B, H)), g.input("w", (D, H)), g.input("xs", (T, B, D))
    out = g.scan(lambda s, h, w, x: [s.softmax(s.add(s.matmul(x, w), h), -1), w], [h0, w], [xs])
    g.set_outputs([out])
    return g, out


def softmax_oracle(f: dict[str, np.ndarray]) -> np.ndarray:
    h = f["h0"]
    for x in f["xs"]:
        z = x @ f["w"] + h
        e = np.exp(z - z.max(-1, keepdims=True))
        h = e / e.sum(-1, keepdims=True)
    return h


# ---- the check: an if with a matmul body under AutoMixedBf16 ------------------------


def test_if_matmul_body_runs_in_bf16_and_the_report_says_so():
    g, if_id = if_graph()
    cg = compile_cpu(g, P.AutoMixedBf16)
    node = only(cg.graph, If)
    assert node.dtype is F32 and node.shape == g.nodes[if_id].shape
    op: If = node.op  # type: ignore[assignment]
    for branch in (op.then_branch, op.else_branch):
        assert only(branch, MatMul).dtype is BF16
        assert_interface_f32(branch)
        casts = [n for n in branch.nodes if isinstance(n.op, Cast)]
        assert {n.dtype for n in casts} == {BF16, F32}  # in at the inputs, out at the output

    rep = cg.report().precision_report
    assert isinstance(rep, PrecisionReport)
    parent = rep.node(if_id)
    assert parent.decision is Decision.SUBGRAPHS and parent.dtype is F32
    assert [b.role for b in parent.bodies] == ["then_branch", "else_branch"]
    for role in ("then_branch", "else_branch"):
        (mm,) = [n for n in rep.body(if_id, role).nodes if n.label.split()[1] == "matmul"]
        assert (mm.decision, mm.dtype, mm.kind) == (Decision.NARROWED, BF16, OpKind.COMPUTE)
    assert rep.body(if_id, "then_branch").casts == 3  # x, w in; the result out

    text = str(cg.report()).splitlines()
    row = next(k for k, line in enumerate(text) if line.strip().startswith(f"%{if_id} if"))
    assert "sub-graphs" in text[row] and "then_branch" in text[row + 1]
    assert "matmul" in text[row + 2] and "bf16" in text[row + 2] and "narrowed" in text[row + 2]
    assert len(text[row + 2]) - len(text[row + 2].lstrip()) > len(text[row]) - len(
        text[row].lstrip()
    )  # nested under the if

    x, w = _f32(B, D), _f32(D, H)
    for p in (True, False):
        check_outputs(cg, {"p": np.array([p]), "x": x, "w": w}, if_oracle(p, x, w), BF16)
    # the branches' sub-programs dispatched bf16 matmul kernels
    (k,) = [k for k in cg.report().kernels if k.op == "if"]
    notes = [n for n in k.notes if "sub-program" in n]
    assert [n.split(":")[0] for n in notes] == ["then", "else"]
    assert all("bf16 matmul" in n for n in notes)


def test_report_lookups_name_what_exists():
    g, if_id = if_graph()
    amp = AutoMixedPrecision(P.AutoMixedBf16)
    amp.run(g)
    with pytest.raises(CompileError, match="no sub-graph 'body'.*then_branch"):
        amp.report.body(if_id, "body")
    with pytest.raises(CompileError, match="no node %99"):
        amp.report.node(99)
    assert amp.report.total_casts == amp.casts_inserted
    walked = [(path, n.label) for path, n in amp.report.walk()]
    assert any(path and path[-1] == "else_branch" and "tanh" in lab for path, lab in walked)


# ---- while and scan -------------------------------------------------------------------------


def test_while_body_runs_narrow_and_its_carries_stay_f32():
    g, w_id = while_graph()
    cg = compile_cpu(g, P.AutoMixedBf16)
    op: While = only(cg.graph, While).op  # type: ignore[assignment]
    assert only(op.body, MatMul).dtype is BF16
    assert_interface_f32_or_int(op.body)
    assert all(n.dtype is not BF16 for n in op.cond.nodes)  # an i32 compare: nothing to narrow
    rep = cg.report().precision_report
    assert rep is not None and rep.node(w_id).decision is Decision.SUBGRAPHS
    cond = {n.label.split()[1]: n.decision for n in rep.body(w_id, "cond").nodes}
    assert cond["lt"] is Decision.NOT_F32

    feed = {"i": np.array(0, np.int32), "h": _f32(B, H), "w": _f32(H, H, scale=H**-0.5)}
    h = feed["h"]
    for _ in range(3):
        h = np.tanh(h @ feed["w"])
    check_outputs(cg, feed, h, BF16)


def assert_interface_f32_or_int(sub: Graph) -> None:
    """Float carries enter and leave f32; integer carries keep their dtype."""
    for n in sub.nodes:
        if isinstance(n.op, Input):
            assert n.dtype in (F32, DType.I32)
    assert all(sub.nodes[o].dtype in (F32, DType.I32) for o in sub.outputs)


@pytest.mark.parametrize("output_index", [0, 3])
def test_rnn_cell_in_scan_runs_in_bf16(output_index):
    g, s_id = rnn_graph(output_index)
    cg = compile_cpu(g, P.AutoMixedBf16)
    op: Scan = only(cg.graph, Scan).op  # type: ignore[assignment]
    assert [n.dtype for n in op.body.nodes if isinstance(n.op, MatMul)] == [BF16, BF16]
    assert_interface_f32(op.body)
    # the pass-through weight carries go out as they came in: no cast on them
    ins = {n.op.name: n.id for n in op.body.nodes if isinstance(n.op, Input)}  # type: ignore[attr-defined]
    assert op.body.outputs[1:3] == [ins["in1"], ins["in2"]]
    names = {n.label.split()[1]: n for n in cg.report().precision_report.body(s_id, "body").nodes}  # type: ignore[union-attr]
    assert {k: (v.decision, v.dtype) for k, v in names.items() if k != "matmul"} == {
        "add": (Decision.NARROWED, BF16),
        "tanh": (Decision.NARROWED, BF16),
    }
    feed = rnn_feed()
    h, ys = rnn_oracle(feed)
    check_outputs(cg, feed, h if output_index == 0 else ys, BF16)


def test_if_nested_in_scan():
    g, s_id = nested_graph()
    cg = compile_cpu(g, P.AutoMixedBf16)
    scan: Scan = only(cg.graph, Scan).op  # type: ignore[assignment]
    inner: If = only(scan.body, If).op  # type: ignore[assignment]
    assert only(scan.body, If).dtype is F32
    assert only(inner.then_branch, MatMul).dtype is BF16
    assert_interface_f32(inner.then_branch)
    assert_interface_f32(scan.body)

    rep = cg.report().precision_report
    assert rep is not None
    (iff,) = [n for n in rep.body(s_id, "body").nodes if n.decision is Decision.SUBGRAPHS]
    (mm,) = iff.bodies[0].nodes
    assert (iff.bodies[0].role, mm.decision, mm.dtype) == ("then_branch", Decision.NARROWED, BF16)
    gt = [n for n in rep.body(s_id, "body").nodes if n.label.split()[1] == "gt"]
    assert gt[0].decision is Decision.NOT_F32  # the compare reads the sum at f32
    text = str(rep)
    assert text.index("body 'nested.body'") < text.index("then_branch") < text.index("matmul")

    feed = {"c": _f32(1, H), "w": _f32(H, H, scale=H**-0.5), "xs": _f32(T, 1, H)}
    c = feed["c"]
    for x in feed["xs"]:
        c = c @ feed["w"] if x.sum() > 0 else c - x
    check_outputs(cg, feed, c, BF16)


# ---- every policy ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_each_policy_within_its_tolerance(name):
    policy, low, _ = POLICIES[name]
    g, if_id = if_graph()
    cg = compile_cpu(g, policy)
    then = only(cg.graph, If).op.then_branch  # type: ignore[attr-defined]
    assert only(then, MatMul).dtype is low
    x, w = _f32(B, D), _f32(D, H)
    check_outputs(cg, {"p": np.array([True]), "x": x, "w": w}, if_oracle(True, x, w), low)

    g, s_id = rnn_graph(3)
    cg = compile_cpu(g, policy)
    body = only(cg.graph, Scan).op.body  # type: ignore[attr-defined]
    assert {n.dtype for n in body.nodes if isinstance(n.op, MatMul)} == {low}
    feed = rnn_feed()
    check_outputs(cg, feed, rnn_oracle(feed)[1], low)
    rep = cg.report().precision_report
    if low is F32:
        assert rep is None  # the pipeline runs no precision pass for AlwaysF32
        assert not any(isinstance(n.op, Cast) for n in body.nodes)
    else:
        assert rep is not None and rep.node(s_id).bodies[0].role == "body"


def test_always_f32_pass_leaves_bodies_alone():
    g, _ = rnn_graph(0)
    amp = AutoMixedPrecision(P.AlwaysF32)
    assert amp.run(g) is g
    assert amp.report.nodes == () and "nothing to do" in str(amp.report)


@pytest.mark.parametrize("name", POLICIES)
def test_reductions_in_bodies_follow_the_policy(name):
    policy, low, red = POLICIES[name]
    g, s_id = softmax_scan_graph()
    cg = compile_cpu(g, policy)
    body = only(cg.graph, Scan).op.body  # type: ignore[attr-defined]
    assert only(body, Softmax).dtype is red and only(body, MatMul).dtype is low
    feed = rnn_feed()
    feed = {"h0": feed["h0"], "w": feed["wx"], "xs": feed["xs"]}
    check_outputs(cg, feed, softmax_oracle(feed), low)
    if name == "AutoMixedConservative":
        rep = cg.report().precision_report
        assert rep is not None
        (sm,) = [n for n in rep.body(s_id, "body").nodes if n.label.split()[1] == "softmax"]
        assert (sm.decision, sm.dtype) == (Decision.POLICY_F32, F32)


def test_region_bodies_are_listed_under_their_region_too():
    g = Graph("region")
    x, w = g.input("x", (B, D)), g.input("w", (D, H))
    m = g.matmul(x, w)
    y = g.mul(g.tanh(g.add(m, 1.0)), g.exp(m))
    g.set_outputs([y])
    cg = compile_cpu(g, P.AutoMixedBf16)
    rep = cg.report().precision_report
    assert rep is not None
    region = rep.node(y)  # the region carries the provenance of the user's last node
    assert region.label.startswith("elementwise_region for") and region.dtype is BF16
    body = {n.label.split()[1]: (n.decision, n.dtype) for n in rep.body(y, "body").nodes}
    assert body == {k: (Decision.NARROWED, BF16) for k in ("add", "tanh", "exp", "mul")}
    xv, wv = _f32(B, D), _f32(D, H)
    mv = xv @ wv
    check_outputs(cg, {"x": xv, "w": wv}, np.tanh(mv + 1) * np.exp(mv), BF16)


@pytest.mark.parametrize("name", ["AutoMixedBf16", "AutoMixedConservative"])
def test_scan_gradient_bodies_follow_the_policy(name):
    """The scan_backward ops of a scan's vjp (their bodies hold the body's vjp) are rewritten
    like any body: the gradients stay within the policy's tolerance of f32."""
    from rlx.autodiff.reverse import grad

    policy, low, _ = POLICIES[name]
    g, ys = rnn_graph(3)
    g.set_outputs([g.sum(ys)])
    gg = grad(g, ["wx", "wh", "h0"])
    feed = rnn_feed()
    cg = compile_cpu(gg, policy)
    from rlx.ops.control_grad import ScanBackward, ScanBackwardXs

    # the forward scan (stacking the carries) and the scan_backward(_xs) ops that run the
    # body's vjp step by step: each body holds matmuls, all at the policy's dtype
    loops = [n for n in cg.graph.nodes if isinstance(n.op, (Scan, ScanBackward, ScanBackwardXs))]
    bodies = [n.op.body if isinstance(n.op, Scan) else n.op.vjp_body for n in loops]  # type: ignore[attr-defined]
    assert any(isinstance(n.op, ScanBackward) for n in loops)
    assert len(loops) >= 2 and all(n.dtype is F32 for n in loops)
    assert all(any(m.dtype is low for m in b.nodes if isinstance(m.op, MatMul)) for b in bodies)
    got, ref = cg.run(feed), evaluate(cg.graph, feed)
    for a, r, want in zip(got, ref, gg.evaluate(feed), strict=True):
        np.testing.assert_allclose(a, r, rtol=0, atol=4 * EPS[low] * np.max(np.abs(r)))
        assert rel_err(a, want) < TOL[low]
