"""torchvision-style ResNet-18 and MobileNetV2 (``torch_cnns.py``: plain torch.nn, random
weights, batchnorm with random statistics) exported to ONNX by the TorchScript exporter,
imported into rlx and run at 32 x 32 (a fast size; every conv kind of the 224 x 224 model:
the 7x7 stride-2 stem, 3x3 and 1x1 convs on the packed sgemm, stride-2 downsampling,
depthwise 3x3 at strides 1 and 2, relu6, residual adds, max / global average pooling),
against PyTorch (the oracle) and ONNX Runtime (a second oracle, same file), at batch 1
and 2, one and two threads.

Tolerance (f32): rtol 1e-4, atol 1e-4 relative to the output's scale; the engines sum in
different orders over up to 4608 taps per output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import rlx  # noqa: E402

from . import torch_cnns as tc  # noqa: E402

SIZE = 32


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, Path]]:
    root = tmp_path_factory.mktemp("torch_cnns")
    out = {}
    for name in tc.CNN_NAMES:
        model = tc.build_cnn(name)
        out[name] = (model, tc.export_cnn(name, root, model=model, size=SIZE))
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", tc.CNN_NAMES)
def test_cnn_matches_torch_and_ort(files, name, threads) -> None:
    model, path = files[name]
    m = rlx.onnx.load(str(path))
    c = m.compile(num_threads=threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    report = str(c.report())
    assert "depthwise" in report if name == "mobilenet_v2" else "sgemm" in report
    for batch in (1, 2):
        feeds = tc.cnn_example(batch, SIZE, seed=batch)
        (got,) = c.run(m.feeds(feeds))
        with torch.no_grad():
            want = model(torch.from_numpy(feeds["x"])).numpy()
        (want_ort,) = sess.run(None, feeds)
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
        np.testing.assert_allclose(got, want_ort, rtol=1e-4, atol=1e-4 * scale)


def test_cnn_convs_fuse_their_epilogues(files) -> None:
    """``fuse_conv_act`` takes every relu / relu6 after a conv and the residual adds:
    ResNet-18's block ends ``relu(conv + skip)`` and MobileNetV2's ``conv + x`` become
    conv nodes (no separate relu, clip or add kernel is left)."""
    for name in tc.CNN_NAMES:
        c = rlx.onnx.load(str(files[name][1])).compile(num_threads=1)
        ops = [k.op for k in c.report().kernels]
        assert "unary" not in ops and "add" not in ops and "elementwise_region" not in ops, ops
        convs = ("conv", "conv_nchwc")  # the layout pass keeps conv chains blocked
        fused = [k for k in c.report().kernels if k.op in convs and "add" in " ".join(k.fused)]
        assert len(fused) == (8 if name == "resnet18" else 10), [k.fused for k in fused]


@pytest.mark.slow
@pytest.mark.parametrize("name", tc.CNN_NAMES)
def test_cnn_on_every_native_target(monkeypatch, files, name) -> None:
    """The same check under each native target this CPU runs (RLX_ISA forced), batch 2."""
    from rlx.backends.cpu import native

    model, path = files[name]
    feeds = tc.cnn_example(2, SIZE, seed=5)
    with torch.no_grad():
        want = model(torch.from_numpy(feeds["x"])).numpy()
    scale = float(np.abs(want).max())
    for target in native.runnable_targets():
        monkeypatch.setenv("RLX_ISA", target.value)
        m = rlx.onnx.load(str(path))
        (got,) = m.compile(num_threads=1).run(m.feeds(feeds))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=target.value)
