"""PyTorch models exported to ONNX with both exporters, for the importer's real-model tests and
the ONNX speed benchmark. In: a model name ("mlp", "cnn", "bert", "minilm"), an exporter
("torchscript": ``torch.onnx.export(..., dynamo=False)``; "dynamo": ``dynamo=True``) and an
output directory. Out: the path of the written ``<name>-<exporter>.onnx`` (weights inline),
with dynamic batch (and, for the encoders, sequence) axes.

``build(name)`` gives the eval-mode torch module (seeded random weights, except "minilm":
the real all-MiniLM-L6-v2 read offline from the installed package) and ``example(name, batch,
seq)`` its inputs as NumPy arrays keyed by ONNX input name, so tests run the same module as
the oracle. Needs torch (+ onnxscript for dynamo) and transformers: the ``oracles`` extra."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np

NAMES = ("mlp", "cnn", "bert", "minilm")
EXPORTERS = ("torchscript", "dynamo")
OPSET = 18
CNN_SIZE = 16  # the CNN's input is (batch, 3, 16, 16)
VOCAB = {"bert": 100}  # minilm's vocabulary comes from its config


def _torch() -> Any:
    import torch

    return torch


def _mlp() -> Any:
    nn = _torch().nn
    return nn.Sequential(
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10)
    )


def _cnn() -> Any:
    torch, nn = _torch(), _torch().nn

    class SmallCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1),
                nn.BatchNorm2d(8),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, padding=1, stride=1),
                nn.ReLU(),
                nn.BatchNorm2d(16),  # after the ReLU: exporters cannot fold it into the conv
                nn.AvgPool2d(2),
            )
            self.head = nn.Linear(16 * (CNN_SIZE // 4) ** 2, 10)

        def forward(self, x: Any) -> Any:
            return self.head(torch.flatten(self.features(x), 1))

    m = SmallCNN()
    with torch.no_grad():  # non-trivial running statistics so batchnorm is not an identity
        for bn in (m.features[1], m.features[6]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    return m


class _Encoder:
    """Wraps a transformers encoder so the export sees (input_ids, attention_mask) ->
    last_hidden_state only."""

    @staticmethod
    def wrap(model: Any) -> Any:
        nn = _torch().nn

        class Enc(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                return self.model(input_ids=input_ids, attention_mask=attention_mask)[0]

        return Enc()


def _bert() -> Any:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=VOCAB["bert"],
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return _Encoder.wrap(BertModel(cfg, add_pooling_layer=False))


def minilm_dir() -> Path:
    """The installed all-MiniLM-L6-v2 checkpoint directory (raises if it is not installed)."""
    from rlx.models.known import resolve

    return Path(resolve("all-MiniLM-L6-v2"))


def _minilm() -> Any:
    from transformers import AutoModel

    m = AutoModel.from_pretrained(
        str(minilm_dir()), local_files_only=True, attn_implementation="eager"
    )
    return _Encoder.wrap(m)


def build(name: str) -> Any:
    """The eval-mode torch module ``name`` (seeded: the same weights on every call)."""
    torch = _torch()
    makers = {"mlp": _mlp, "cnn": _cnn, "bert": _bert, "minilm": _minilm}
    if name not in makers:
        raise ValueError(f"unknown model {name!r}; known: {list(NAMES)}")
    torch.manual_seed(0)
    return makers[name]().eval()


def input_names(name: str) -> tuple[str, ...]:
    return ("input_ids", "attention_mask") if name in ("bert", "minilm") else ("x",)


def example(name: str, batch: int = 2, seq: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of model ``name`` (``seq`` is ignored by the MLP and CNN); the encoders' masks
    pad the tail of every row but the first."""
    rng = np.random.default_rng(seed)
    if name == "mlp":
        return {"x": rng.standard_normal((batch, 32)).astype(np.float32)}
    if name == "cnn":
        return {"x": rng.standard_normal((batch, 3, CNN_SIZE, CNN_SIZE)).astype(np.float32)}
    vocab = VOCAB.get(name, 30522)
    ids = rng.integers(1, vocab, size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    for b in range(1, batch):
        mask[b, max(1, seq - b) :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def run_torch(model: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """``model`` on ``feeds`` (the oracle) as a float32 array."""
    torch = _torch()
    with torch.no_grad():
        out = model(*(torch.from_numpy(v) for v in feeds.values()))
    return out.numpy()


def _dynamic(name: str) -> tuple[dict[str, dict[int, str]], dict[str, dict[int, str]]]:
    if name in ("bert", "minilm"):
        ax = {0: "batch", 1: "seq"}
        return {"input_ids": ax, "attention_mask": ax}, {"y": ax}
    return {"x": {0: "batch"}}, {"y": {0: "batch"}}


def _seq_dim(name: str) -> Any:
    limit = 512 if name == "minilm" else 64  # the position-embedding table's length
    return _torch().export.Dim("seq", max=limit)


def export_model(name: str, exporter: str, out_dir: str | Path, model: Any = None) -> Path:
    """Export model ``name`` with ``exporter`` to ``out_dir/<name>-<exporter>.onnx`` (weights
    inline, dynamic batch / sequence axes) and return the path. ``model`` reuses a module
    from :func:`build`."""
    torch = _torch()
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; known: {list(EXPORTERS)}")
    model = build(name) if model is None else model
    out = Path(out_dir) / f"{name}-{exporter}.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    args = tuple(torch.from_numpy(v) for v in example(name, batch=2, seq=8).values())
    axes, out_axes = _dynamic(name)
    names = list(input_names(name))
    # the dynamo exporter logs a warning per torchvision op it cannot register
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(
                model,
                args,
                str(out),
                dynamo=False,
                input_names=names,
                output_names=["y"],
                dynamic_axes={**axes, **out_axes},
                opset_version=OPSET,
            )
        else:
            dims = {"batch": torch.export.Dim("batch", max=4096), "seq": _seq_dim(name)}
            shapes = {n: {a: dims[d] for a, d in ax.items()} for n, ax in axes.items()}
            prog = torch.onnx.export(
                model,
                args,
                dynamo=True,
                input_names=names,
                output_names=["y"],
                dynamic_shapes=tuple(shapes[n] for n in names),
                opset_version=OPSET,
                external_data=False,
                verbose=False,
            )
            prog.save(str(out), external_data=False)
    return out


def export_all(out_dir: str | Path, names: tuple[str, ...] = NAMES) -> list[Path]:
    """Every model in ``names`` with both exporters, into ``out_dir``."""
    paths = []
    for name in names:
        model = build(name)
        for exporter in EXPORTERS:
            paths.append(export_model(name, exporter, out_dir, model=model))
    return paths
