"""``rlx inspect`` and ``rlx bench`` on the tiny BERT checkpoint and on a graph file: the
listing, the FLOPs (against the hand count in conftest), the compile report's sections,
the bench rows' arithmetic (no timings are asserted), and bad shapes as one-line errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import rlx
from tests.cli.conftest import here, run, tiny_matmul_flops


def test_inspect_model_dir(tiny_bert) -> None:
    r = run(["inspect", str(tiny_bert), "--shape", "2x8", "--threads", "1"])
    assert r.code == 0, r.err
    out = r.out
    assert out.startswith("== ") and "BertModel, 2 layers, hidden 32, 4 heads" in out
    assert "= input 'input_ids'" in out and "= attention[num_heads=4" in out  # the listing
    gflop = float(re.search(r"FLOPs at batch=2, seq=8 ==\n([0-9.]+) GFLOP", out).group(1))
    assert gflop == pytest.approx(tiny_matmul_flops(2, 8) / 1e9, abs=5e-4)
    assert "== compile report (f32, 1 thread(s), batch=2, seq=8) ==" in out
    for section in ("passes:", "fusion:", "memory:", "kernels ("):
        assert section in out, section
    assert "fused_matmul_bias_act" in out


def test_inspect_int8_adds_the_accuracy_report(tiny_bert) -> None:
    r = run(["inspect", str(tiny_bert), "--precision", "int8", "--no-graph", "--shape", "2x8"])
    assert r.code == 0, r.err
    assert "= input 'input_ids'" not in r.out
    assert "int8: calibrated on rlx's built-in sample sentences" in r.out
    assert "qmatmul" in r.out  # the quantized GEMMs are in the schedule
    acc = r.out.split("== int8 accuracy ==\n", 1)[1]
    assert acc.startswith("rlx.quantize (") and "cosine" in acc


def test_inspect_graph_file_and_no_graph(tmp_path) -> None:
    g = rlx.Graph("mlp")
    x = g.input("x", (g.sym("batch"), 16))
    w = g.param("w", (16, 8))
    g.set_outputs([g.tanh(g.matmul(x, w))])
    path = tmp_path / "mlp.rlx"
    rlx.save(g, path, {"w": np.ones((16, 8), np.float32)})
    r = run(["inspect", str(path), "--shape", "4"])
    assert r.code == 0, r.err
    assert "graph file mlp.rlx" in r.out and "= param 'w'" in r.out
    assert "0.000 GFLOP (matmul 0.000)" in r.out  # 2*4*16*8 = 1024 FLOPs
    assert "memory:" in r.out and "batch=4" in r.out
    r = run(["inspect", str(path), "--no-graph", "--precision", "bf16"])  # no shape: smallest
    assert r.code == 0, r.err
    assert "= param 'w'" not in r.out and "the smallest shape batch=1" in r.out


def test_inspect_and_bench_bad_shapes(tiny_bert) -> None:
    for args, code, needle in (
        (["inspect", str(tiny_bert), "--shape", "8by128"], 2, "'8by128' is not a shape"),
        (["inspect", str(tiny_bert), "--shape", "0x8"], 2, "must be >= 1"),
        (["inspect", str(tiny_bert), "--shape", "2x8x3"], 1, "has 2 symbolic dims"),
        (["inspect", str(tiny_bert), "--shape", "1x4096"], 1, "seq=4096 is outside"),
        (["bench", str(tiny_bert), "--shapes", "1x1"], 1, "seq=1: a model's inputs hold"),
        (["bench", str(tiny_bert), "--shapes", "1x8,oops"], 2, "'oops' is not a shape"),
        (["bench", str(tiny_bert), "--threads", "0"], 2, "--threads"),
        (["bench", str(tiny_bert), "--precision", "f32,fp4"], 2, "fp4"),
    ):
        r = run(args)
        assert r.code == code, (args, r.code, r.err)
        last = r.err.strip().splitlines()[-1]
        assert last.startswith("rlx: error: ") and needle in last, (args, last)
        assert "Traceback" not in r.err


def _runs(out: str) -> list[dict]:
    return [d for d in map(json.loads, out.splitlines()) if d["kind"] == "run"]


def test_bench_rows(tiny_bert) -> None:
    args = ["bench", str(tiny_bert), "--shapes", "1x8,2x16", "--threads", "1", *here()]
    r = run([*args, "--repeat", "2", "--warmup", "0", "--json"])
    assert r.code == 0, r.err
    rows = _runs(r.out)
    assert [(x["precision"], x["threads"], x["shape"]) for x in rows] == [
        ("f32", 1, "1x8"),
        ("f32", 1, "2x16"),
    ]
    for x, (b, s) in zip(rows, [(1, 8), (2, 16)]):
        assert x["gflop"] == pytest.approx(tiny_matmul_flops(b, s) / 1e9)
        assert 0 < x["min_ms"] <= x["median_ms"]
        assert x["per_second"] == pytest.approx(b / (x["median_ms"] / 1e3))
        assert x["gflops"] == pytest.approx(x["gflop"] / (x["median_ms"] / 1e3))
        assert x["peak_pct"] > 0
    r = run([*args[:4], *here(), "--repeat", "1", "--precision", "f32,bf16"])  # the table
    assert r.code == 0, r.err
    assert "f32 FMA" in r.out and "% peak" in r.out
    table = [
        ln.split()[2:] for ln in r.out.splitlines() if re.match(r"\S+ +o[nf]+ +(f32|bf16) +1 ", ln)
    ]
    assert [(t[0], t[2]) for t in table] == [
        ("f32", "1x8"),
        ("f32", "2x16"),
        ("bf16", "1x8"),
        ("bf16", "2x16"),
    ]


def test_bench_int8_compiles_once_per_thread_count(tiny_bert) -> None:
    r = run(
        [
            "bench",
            str(tiny_bert),
            "--shapes",
            "1x8",
            "--threads",
            "1,2",
            "--precision",
            "int8",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--json",
            *here(),
        ]
    )
    assert r.code == 0, r.err
    rows = _runs(r.out)
    assert {x["threads"] for x in rows} <= {1, 2} and all(x["precision"] == "int8" for x in rows)
    assert r.err.count("compiling int8") == len(rows)
