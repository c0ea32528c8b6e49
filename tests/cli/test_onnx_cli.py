"""``rlx run``, ``rlx inspect`` and ``rlx bench`` on an ONNX file built with onnx.helper:
run's outputs against a NumPy twin (and saved to .npy), inspect's listing and report,
bench's row, and bad --input values as one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tests.cli.conftest import here, run  # noqa: E402

W = np.random.default_rng(3).standard_normal((16, 5)).astype(np.float32)


@pytest.fixture()
def mlp(tmp_path):  # noqa: ANN001, ANN201
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(W, "w")],
    )
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_run_prints_and_saves_the_outputs(mlp, tmp_path) -> None:  # noqa: ANN001
    x = np.random.default_rng(4).standard_normal((3, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    r = run(["run", str(mlp), "--input", f"x={tmp_path / 'x.npy'}", "--save", str(out_dir)])
    assert r.code == 0, r.err
    assert "ONNX file mlp.onnx (opsets ai.onnx 17" in r.out and "y: float32[3, 5]" in r.out
    np.testing.assert_allclose(np.load(out_dir / "y.npy"), np.maximum(x @ W, 0), rtol=1e-5)


def test_run_names_missing_and_unknown_inputs(mlp, tmp_path) -> None:  # noqa: ANN001
    r = run(["run", str(mlp)])
    assert r.code == 1 and "missing --input for x: f32[batch,16]" in r.err
    np.save(tmp_path / "z.npy", np.zeros(2))
    r = run(["run", str(mlp), "--input", f"z={tmp_path / 'z.npy'}"])
    assert r.code == 1 and "['z'] are not inputs" in r.err
    r = run(["run", str(mlp), "--input", "x"])
    assert r.code == 2 and "NAME=FILE.npy" in r.err


def test_inspect_and_bench_take_an_onnx_file(mlp) -> None:  # noqa: ANN001
    r = run(["inspect", str(mlp), "--shape", "4", "--threads", "1"])
    assert r.code == 0, r.err
    assert "= input 'x'" in r.out and "== compile report (f32, 1 thread(s), batch=4) ==" in r.out
    args = ["bench", str(mlp), "--shapes", "4", *here(), "--json"]
    r = run([*args, "--repeat", "1", "--warmup", "0"])
    assert r.code == 0, r.err
    assert '"shape": "4"' in r.out
