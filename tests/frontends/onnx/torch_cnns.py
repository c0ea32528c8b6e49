"""torchvision-style ResNet-18 and MobileNetV2 in plain ``torch.nn`` (torchvision is not a
dependency), with seeded random weights and non-trivial batchnorm statistics, and their
ONNX export (TorchScript exporter, dynamic batch axis). In: a model name ("resnet18",
"mobilenet_v2"). Out: the eval-mode module (:func:`build_cnn`), example inputs
(:func:`cnn_example`) and the written ``<name>-torchscript.onnx`` (:func:`export_cnn`).
Used by the conv tests (at a small resolution) and by ``benchmarks/onnx_models.py``."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np

CNN_NAMES = ("resnet18", "mobilenet_v2")
OPSET = 18


def _nn() -> Any:
    import torch

    return torch.nn


def _resnet18(num_classes: int = 1000) -> Any:
    import torch

    nn = torch.nn

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x: Any) -> Any:
            idt = x if self.down is None else self.down(x)
            y = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(y)) + idt)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1),
            )
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    return ResNet18()


def _mobilenet_v2(num_classes: int = 1000) -> Any:
    import torch

    nn = torch.nn

    def cbr(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> Any:
        return nn.Sequential(
            nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )

    class Inverted(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
            super().__init__()
            hid = cin * t
            layers = [] if t == 1 else [cbr(cin, hid, 1, 1)]
            layers += [
                cbr(hid, hid, 3, stride, groups=hid),
                nn.Conv2d(hid, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            ]
            self.body = nn.Sequential(*layers)
            self.res = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            y = self.body(x)
            return x + y if self.res else y

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            cfg = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2))
            cfg += ((6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
            layers, cin = [cbr(3, 32, 3, 2)], 32
            for t, c, n, s in cfg:
                for i in range(n):
                    layers.append(Inverted(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers.append(cbr(cin, 1280, 1, 1))
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(1280, num_classes)

        def forward(self, x: Any) -> Any:
            y = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.fc(torch.flatten(y, 1))

    return MobileNetV2()


def build_cnn(name: str) -> Any:
    """The eval-mode module ``name`` ("resnet18" or "mobilenet_v2"), seeded, with random
    batchnorm statistics so no batchnorm is an identity."""
    import torch

    makers = {"resnet18": _resnet18, "mobilenet_v2": _mobilenet_v2}
    if name not in makers:
        raise ValueError(f"unknown CNN {name!r}; known: {list(CNN_NAMES)}")
    torch.manual_seed(0)
    m = makers[name]()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.2)
                mod.bias.uniform_(-0.2, 0.2)
    return m.eval()


def cnn_example(batch: int = 1, size: int = 224, seed: int = 0) -> dict[str, np.ndarray]:
    """The input ``{"x": [batch, 3, size, size]}`` float32."""
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 3, size, size)).astype(np.float32)}


def export_cnn(name: str, out_dir: str | Path, model: Any = None, size: int = 224) -> Path:
    """Export ``name`` with the TorchScript exporter (opset 18, dynamic batch axis) to
    ``out_dir/<name>-torchscript.onnx`` and return the path."""
    import torch

    model = build_cnn(name) if model is None else model
    out = Path(out_dir) / f"{name}-torchscript.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    x = torch.from_numpy(cnn_example(2, size)["x"])
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            str(out),
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
            opset_version=OPSET,
        )
    return out
