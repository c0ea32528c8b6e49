"""Issue 19 fault 19: every report names a node by the user's graph.

Before the fix the fusion report, the INT8 report and the kernel schedule numbered nodes in
three different graphs (each pass renumbers), so ``%19`` meant one node in the attention
fusion line, another in a residual-norm line and a third in a "kept float" line. The
oracle here is the user's graph itself: every ``%<id> <op>`` in any report must be that
node of the user's graph, with its op and the line of this file that built it.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import rlx
from rlx.ops.linalg import MatMul
from rlx.options import CompileOptions
from rlx.passes.report import FusionPattern
from rlx.quant.api import quantize

B, S, H, HEADS = 2, 8, 16, 2
HD = H // HEADS
_REF = re.compile(r"%(\d+) ([a-z_0-9]+)(?: \((\w+\.py):(\d+)\))?")


def _model() -> tuple[rlx.Graph, dict[str, int]]:
    """Attention + residual layer norm + an FFN; returns the graph and named node ids."""
    g = rlx.Graph("naming")
    x = g.input("x", (B, S, H))
    ids: dict[str, int] = {}

    def lin(v: int, name: str, n_in: int, n_out: int) -> int:
        w = g.param(f"{name}.w", (n_in, n_out))
        return g.add(g.matmul(v, w), g.param(f"{name}.b", (n_out,)))

    q, k, v = (lin(x, n, H, H) for n in "qkv")
    qh = g.transpose(g.reshape(q, (B, S, HEADS, HD)), (0, 2, 1, 3))
    kt = g.transpose(g.reshape(k, (B, S, HEADS, HD)), (0, 2, 3, 1))
    vh = g.transpose(g.reshape(v, (B, S, HEADS, HD)), (0, 2, 1, 3))
    ids["qk"] = g.matmul(qh, kt)
    scores = g.mul(ids["qk"], 1.0 / math.sqrt(HD))
    ids["softmax"] = g.softmax(scores, -1)
    ctx = g.matmul(ids["softmax"], vh)
    a = g.reshape(g.transpose(ctx, (0, 2, 1, 3)), (B, S, H))
    ids["residual"] = g.add(x, lin(a, "o", H, H))
    ids["norm"] = g.layer_norm(ids["residual"], g.param("ln.g", (H,)), g.param("ln.b", (H,)))
    h = g.gelu(lin(ids["norm"], "up", H, 2 * H))
    g.set_outputs([lin(h, "down", 2 * H, H)])
    return g, ids


def _params(g: rlx.Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        n.op.name: (rng.standard_normal(n.shape.concrete()) / 4).astype(np.float32)
        for n in g.param_nodes()
    }


def _batches(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield {"x": rng.standard_normal((B, S, H)).astype(np.float32)}


def op_name(op: object) -> str:
    """The op as a user reads it: ``add`` for Binary(ADD), ``softmax`` for softmax[axis=-1]."""
    return str(op).split("[", 1)[0]


def label(g: rlx.Graph, nid: int) -> str:
    """The expected name of user node ``nid``: ``%19 matmul (test_reports_naming.py:44)``."""
    return f"%{nid} {op_name(g.nodes[nid].op)} (test_reports_naming.py:{g.nodes[nid].loc.line})"


def _check_refs(g: rlx.Graph, text: str) -> int:
    """Every ``%id op (file:line)`` in ``text`` names node ``id`` of ``g`` with its op and
    source line; returns how many references were checked."""
    n = 0
    for m in _REF.finditer(text):
        nid, op, file, line = int(m[1]), m[2], m[3], m[4]
        node = g.nodes[nid]
        assert op == op_name(node.op), f"{m[0]!r}: node %{nid} of the user's graph is {node.op}"
        if file is not None:
            assert (file, int(line)) == ("test_reports_naming.py", node.loc.line), m[0]
        n += 1
    return n


@pytest.fixture(scope="module")
def quantized():
    g, ids = _model()
    params = _params(g)
    opts = CompileOptions(use_cache=False)
    return g, ids, quantize(g, _batches(3), params=params, options=opts, rank_layers=False)


def test_one_name_per_user_node_across_fusion_quant_and_schedule(quantized) -> None:
    g, ids, r = quantized
    rep = r.compiled.report()
    fusion, accuracy, schedule = str(rep.fusion_report), str(r.report), str(rep)
    # the attention's QK^T matmul: fused in the attention line, kept float (its rhs is
    # computed), and listed by the fused kernel of the schedule, under one name
    qk = label(g, ids["qk"])
    assert qk.startswith(f"%{ids['qk']} matmul (test_reports_naming.py:")
    (att,) = rep.fusion_report.fused_of(FusionPattern.ATTENTION)
    assert qk in str(att)
    kept = [ln for ln in accuracy.splitlines() if ln.lstrip().startswith("kept float:")]
    assert any(qk in ln and "is not a static 2-D weight" in ln for ln in kept), kept
    assert any(qk in k.fused for k in rep.kernels if k.op == "attention")
    assert qk in schedule
    # the residual add: named the same in the residual-norm fusion and the schedule
    res = label(g, ids["residual"])
    (rn,) = rep.fusion_report.fused_of(FusionPattern.RESIDUAL_NORM)
    assert res in str(rn)
    assert any(res in k.fused for k in rep.kernels)
    # and no %id in any report names another node than the user's node of that id
    assert _check_refs(g, fusion) >= 4
    assert _check_refs(g, accuracy) >= 3
    assert _check_refs(g, schedule) >= 20


def test_quantized_layers_are_labelled_by_the_user_graph(quantized) -> None:
    g, _, r = quantized
    mms = {n.id for n in g.find(MatMul)}
    for name, text in r.report.labels.items():
        nid = int(_REF.match(text)[1])
        assert nid in mms and text == label(g, nid), (name, text)
    assert sorted(r.report.labels) == sorted(["q.w", "k.w", "v.w", "o.w", "up.w", "down.w"])


def test_minmax_is_reported_as_minmax(quantized) -> None:
    _, _, r = quantized
    assert r.report.method == "minmax"
    assert str(r.report).startswith("rlx.quantize (minmax)")
    g, _ = _model()
    r2 = quantize(g, _batches(1), params=_params(g), method="max_abs", rank_layers=False)
    assert r2.report.method == "max_abs"


def test_compiled_report_names_the_instruction_set_path() -> None:
    from rlx.backends.cpu import native

    g, _ = _model()
    cg = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params=_params(g))
    text = str(cg.report())
    target = native.selected_target()
    line = next(ln for ln in text.splitlines() if ln.startswith("native: "))
    assert native.target_description() in line
    assert {"avx512": "AVX-512", "avx2": "AVX2", "portable": "portable"}[target.value] in line
    off = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False, native=False))
    assert "native: off (CompileOptions(native=False))" in str(off.report())


def test_int8_gemm_path_is_named(quantized) -> None:
    from rlx.backends.cpu import native

    _, _, r = quantized
    text = str(r.compiled.report())
    q = [k for k in r.compiled.report().kernels if k.op == "qmatmul"]
    assert q
    if any(k.kind.value == "native" for k in q):
        assert f"int8 GEMM: {native.qgemm_lib().isa.name} kernel" in text
    else:
        assert "int8 GEMM: exact f64 BLAS" in text


def test_loaded_graph_is_named_by_its_own_ids(tmp_path) -> None:
    from rlx.passes.report import with_provenance

    g, _ = _model()
    path = tmp_path / "m.rlx"
    rlx.save(g, path, locations=False)
    h, _ = rlx.load(path)
    assert all(n.loc is None for n in h.nodes)  # neither lines nor ids in the file
    stamped = with_provenance(h)
    assert stamped is not h and stamped == h and stamped.fingerprint() == h.fingerprint()
    assert [n.loc.node for n in stamped.nodes] == list(range(len(h)))
    assert with_provenance(stamped) is stamped
    cg = rlx.Session("cpu").compile(h, CompileOptions(use_cache=False), params=_params(g))
    assert _check_refs(g, str(cg.report())) >= 10  # same ids as the graph it was saved from


def test_provenance_does_not_change_equality_or_fingerprint() -> None:
    g1, _ = _model()
    g2, _ = _model()  # built by the same lines: same stamps; compare with a re-stamped copy
    g3 = g1.copy()
    g3.nodes = [
        type(n)(n.id, n.op, n.inputs, n.shape, None) for n in g1.nodes
    ]  # no provenance at all
    assert g1 == g2 == g3
    assert g1.fingerprint() == g3.fingerprint()
    assert all(a == b and hash(a) == hash(b) for a, b in zip(g1.nodes, g3.nodes, strict=True))


def test_mixed_precision_report_uses_the_same_names() -> None:
    g, ids = _model()
    opts = CompileOptions(use_cache=False, precision=rlx.PrecisionPolicy.AutoMixedBf16)
    cg = rlx.Session("cpu").compile(g, opts, params=_params(g))
    text = str(cg.report())
    assert _check_refs(g, text) >= 20  # casts read "cast for %5 add (...)", never a new %id
    assert label(g, ids["qk"]) in text and label(g, ids["residual"]) in text
