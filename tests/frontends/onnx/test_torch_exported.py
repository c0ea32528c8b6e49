"""Real models exported from PyTorch with both exporters (TorchScript-based ``dynamo=False``
and ``dynamo=True``) import into rlx and match PyTorch (the oracle) and ONNX Runtime (a
second oracle, same file): an MLP, a small CNN (conv, batchnorm, relu, max / avg pooling,
flatten, linear), a BERT encoder with random weights and the real all-MiniLM-L6-v2. The
dynamic batch (and sequence) axes import as symbolic dims: one compile runs at two batch
sizes and two sequence lengths.

Tolerance (f32): rtol 1e-4, atol 1e-5 against both oracles. rlx, PyTorch and ONNX Runtime
sum in different orders (blocked GEMMs, fused vs unfused layer norm); the measured worst
differences are ~1e-7 (MLP, CNN), ~7e-7 (BERT) and ~3e-6 (MiniLM, |y| up to ~10).

Exports happen once per module (``tmp_path_factory``); dynamo exports and MiniLM are
``slow`` (several seconds each)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import rlx  # noqa: E402

from . import torch_models as tm  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
SHAPES = ((1, 5), (3, 11))  # (batch, seq); the MLP and CNN use the batch only


class Exports:
    """Exports on first use, shared by the module's tests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.models: dict[str, Any] = {}
        self.paths: dict[tuple[str, str], Path] = {}

    def model(self, name: str) -> Any:
        if name not in self.models:
            self.models[name] = tm.build(name)
        return self.models[name]

    def path(self, name: str, exporter: str) -> Path:
        key = (name, exporter)
        if key not in self.paths:
            self.paths[key] = tm.export_model(name, exporter, self.root, model=self.model(name))
        return self.paths[key]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Exports:
    return Exports(tmp_path_factory.mktemp("torch_onnx"))


def _cases() -> list[Any]:
    out = []
    for name in tm.NAMES:
        for exporter in tm.EXPORTERS:
            slow = name == "minilm" or exporter == "dynamo"
            marks = [pytest.mark.slow] if slow else []
            out.append(pytest.param(name, exporter, marks=marks, id=f"{name}-{exporter}"))
    return out


def _check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


@pytest.mark.parametrize(("name", "exporter"), _cases())
def test_exported_model_matches_torch_and_onnxruntime(
    exports: Exports, name: str, exporter: str
) -> None:
    if name == "minilm":
        try:
            tm.minilm_dir()
        except Exception as e:  # noqa: BLE001 - the checkpoint package is part of the test extra
            pytest.fail(f"all-MiniLM-L6-v2 is not installed: {e}")
    ort = pytest.importorskip("onnxruntime")
    path = exports.path(name, exporter)
    m = rlx.onnx.load(path)
    dyn = [d for s in m.inputs.values() for d in s.dims if not isinstance(d, int)]
    assert dyn, f"{path.name}: the dynamic axes did not import as symbolic dims ({m.inputs})"
    compiled = m.compile()  # one compile for every shape below
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, seq in SHAPES:
        feeds = tm.example(name, batch, seq, seed=batch)
        want = tm.run_torch(exports.model(name), feeds)
        (got,) = compiled.run(m.feeds(feeds))
        what = f"{path.name} batch={batch} seq={seq}"
        _check(got, want, f"{what}: rlx vs torch")
        _check(got, sess.run(None, feeds)[0], f"{what}: rlx vs onnxruntime")


def test_cnn_with_dynamic_spatial_dims_is_named_and_imports_once_they_are_fixed(
    exports: Exports, tmp_path: Path
) -> None:
    """rlx convolves static spatial sizes: dynamic H / W are an OnnxUnsupportedError naming
    the Conv node; ``input_dims`` fixes them and the batch stays symbolic."""
    model = exports.model("cnn")
    path = tmp_path / "cnn-hw.onnx"
    x = torch.from_numpy(tm.example("cnn", 2)["x"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notices
        torch.onnx.export(
            model,
            (x,),
            str(path),
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch", 2: "h", 3: "w"}},
        )
    with pytest.raises(rlx.onnx.OnnxUnsupportedError, match=r"\(Conv\).*symbolic spatial"):
        rlx.onnx.load(path)
    n = tm.CNN_SIZE
    m = rlx.onnx.load(path, input_dims={"x": ["batch", 3, n, n]})
    compiled = m.compile()
    for batch in (1, 3):
        feeds = tm.example("cnn", batch, seed=batch)
        _check(compiled.run(feeds)[0], tm.run_torch(model, feeds), f"cnn-hw batch={batch}")


def _exact(path: Path) -> Any:
    """``onnx.reference.ReferenceEvaluator`` on ``path``: exact integer arithmetic, with
    two of its ops replaced where it cannot run these files:
    - it has DequantizeLinear from opset 19 on only; opset 18's (which the exporter writes
      for the BERT's int8 weights) has the same semantics for the int8 / int32 types used
      here, so its newest implementation (block_size 0: per axis) serves;
    - its GatherElements fails on the BERT's position gather under NumPy 2 (it builds a
      ragged array), so NumPy's ``take_along_axis`` (the operator's definition) serves."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_25

    class DequantizeLinear(DequantizeLinear_25):
        op_domain = ""

    class GatherElements(OpRun):
        op_domain = ""

        def _run(self, data, indices, axis=None):  # type: ignore[no-untyped-def]
            axis = 0 if axis is None else int(axis)
            idx = np.where(indices < 0, indices + data.shape[axis], indices)
            return (np.take_along_axis(data, idx, axis=axis),)

    return ReferenceEvaluator(str(path), new_ops=[DequantizeLinear, GatherElements])


@pytest.mark.parametrize("name", ["mlp", "cnn", "bert"])
def test_dynamically_quantized_export_is_exact(exports: Exports, name: str, tmp_path: Path) -> None:
    """ONNX Runtime's ``quantize_dynamic`` (DynamicQuantizeLinear + MatMulInteger /
    ConvInteger, int8 weights) of the TorchScript export: rlx's integer kernels give the
    exact answer, that of ``onnx.reference.ReferenceEvaluator`` (integer products in
    int32 / int64 NumPy; rtol 1e-4, atol 1e-5: the f32 rescaling rounds in other orders),
    and stay near the float model (the int8 error).

    ONNX Runtime is not the oracle for this file: without AVX-512 VNNI its u8 x s8 kernels
    add pairs of products in saturating int16 (``vpmaddubsw``), so on an AVX2-only CPU its
    answer is up to ~0.1 away from the exact one. It is compared on the file quantized
    with ``reduce_range=True`` (7-bit weights), where no pair can saturate and it is
    exact on every x86 CPU: see the next test."""
    pytest.importorskip("onnxruntime")  # its quantize_dynamic writes the file
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = exports.path(name, "torchscript")
    dst = tmp_path / f"{name}-int8.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    m = rlx.onnx.load(dst)
    compiled = m.compile()
    exact = _exact(dst)
    for batch, seq in SHAPES:
        feeds = tm.example(name, batch, seq, seed=batch)
        (got,) = compiled.run(m.feeds(feeds))
        _check(got, exact.run(None, feeds)[0], f"{dst.name} batch={batch}: rlx vs exact")
        want = tm.run_torch(exports.model(name), feeds)
        assert np.abs(got - want).max() < 0.05 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("name", ["mlp", "cnn", "bert"])
def test_reduce_range_quantized_export_matches_onnxruntime(
    exports: Exports, name: str, tmp_path: Path
) -> None:
    """The same export quantized with ``reduce_range=True`` (7-bit weights: a pair of u8 x
    s7 products fits in int16, so ONNX Runtime's AVX2 kernels do not saturate and it is
    exact on every x86 CPU): rlx gives ONNX Runtime's answer and the exact reference's."""
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = exports.path(name, "torchscript")
    dst = tmp_path / f"{name}-int8-rr.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, reduce_range=True)
    m = rlx.onnx.load(dst)
    compiled = m.compile()
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    exact = _exact(dst)
    for batch, seq in SHAPES:
        feeds = tm.example(name, batch, seq, seed=batch)
        (got,) = compiled.run(m.feeds(feeds))
        _check(got, exact.run(None, feeds)[0], f"{dst.name} batch={batch}: rlx vs exact")
        _check(got, sess.run(None, feeds)[0], f"{dst.name} batch={batch}: rlx vs onnxruntime")
