"""The ONNX MLP of the speed benchmark (``benchmarks/onnx_models.py --models mlp``: 32-64-64-10
with GELU (erf) and tanh, TorchScript export, dynamic batch) on the tiny-GEMM path (issue 31):
at 1 and 2 threads and batches 1 .. 64 it matches PyTorch (the oracle) and ONNX Runtime
(a second oracle, same file), and each of its three products runs as one native sgemm
call with bias and activation in the tile (no separate activation pass), all three in
one native schedule segment.

Tolerance (f32) as tests/frontends/onnx/test_torch_exported.py: rtol 1e-4, atol 1e-5."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import rlx  # noqa: E402
from rlx.backends.cpu.native.schedule import Segment  # noqa: E402

from . import torch_models as tm  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tm.export_model("mlp", "torchscript", tmp_path_factory.mktemp("mlp_tiny"))


@pytest.mark.parametrize("threads", [1, 2])
def test_onnx_mlp_on_tiny_gemms_matches_torch_and_onnxruntime(
    mlp_file: Path, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RLX_SGEMM", raising=False)
    m = rlx.onnx.load(mlp_file)
    compiled = m.compile(num_threads=threads)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(mlp_file), opts, providers=["CPUExecutionProvider"])
    model = tm.build("mlp")
    for batch in (64, 1, 3, 17, 63):
        feeds = tm.example("mlp", batch, seed=batch)
        (got,) = compiled.run(m.feeds(feeds))
        what = f"mlp batch={batch} threads={threads}"
        np.testing.assert_allclose(got, tm.run_torch(model, feeds), RTOL, ATOL, err_msg=what)
        np.testing.assert_allclose(got, sess.run(None, feeds)[0], RTOL, ATOL, err_msg=what)
        fused = [e for e in compiled.report().kernels if e.op == "fused_matmul_bias_act"]
        notes = [" ".join(e.notes) for e in fused]
        assert len(fused) == 3 and all(e.kind.value == "native" for e in fused), notes
        assert all("rlx sgemm" in n and "pass" not in n for n in notes), notes
        assert "bias + gelu in the tile" in notes[0] and "bias + tanh in the tile" in notes[1]
        ex = compiled._last
        assert ex is not None and [type(f) for f in ex.fast] == [Segment], ex.fast
