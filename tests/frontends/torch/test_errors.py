"""from_torch's errors and boundaries: an ATen op without a mapping names the op, the module
path that called it and its source line; PyTorch stays optional (importing rlx never
imports torch, calling from_torch without it names the ``torch`` extra); training-mode
modules, export failures and wrong run() arguments are rlx errors; ops without a direct
mapping that decompose to mapped core ATen ops import through ``run_decompositions``."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import rlx
from rlx.frontends.torch import TorchImportError, TorchUnsupportedError, supported_aten_ops


class Inner(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cummax(x, dim=0).values  # CUMMAX_LINE


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.lin(x))


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) * 2


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, ln in enumerate(f, 1) if marker in ln and "_line(" not in ln)


def test_unmapped_op_names_op_module_path_and_line():
    with pytest.raises(TorchUnsupportedError) as ei:
        rlx.from_torch(Outer().eval(), (torch.randn(3, 4),))
    e = ei.value
    assert e.op == "aten.cummax.default"
    assert e.module_path == "block.inner"
    assert e.source == f"{__file__}:{_line('CUMMAX_LINE')}"
    msg = str(e)
    assert "aten.cummax.default" in msg and "'block.inner' (Inner)" in msg
    assert f"test_errors.py:{_line('CUMMAX_LINE')}" in msg
    assert (
        "aten.cummax.default" not in supported_aten_ops() and "cummax" not in supported_aten_ops()
    )


def _run_python(code: str) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120
    )


def test_import_rlx_does_not_import_torch():
    r = _run_python(
        "import sys, rlx; f = rlx.from_torch; import rlx.frontends.torch; "
        "print('torch' in sys.modules)"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_without_torch_the_error_names_the_extra():
    r = _run_python(
        "import sys; sys.modules['torch'] = None\n"
        "import rlx\n"
        "try:\n"
        "    rlx.from_torch(object(), ())\n"
        "except rlx.RlxError as e:\n"
        "    print(type(e).__name__, '|', e)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("TorchImportError |")
    assert "rlx[torch]" in r.stdout and "torch extra" in r.stdout


def test_training_mode_batchnorm_asks_for_eval():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    with pytest.raises(rlx.RlxError, match=r"module\.eval\(\)") as ei:
        rlx.from_torch(m, (torch.randn(2, 3, 8, 8),))
    assert "1.running_mean" in str(ei.value)  # the buffer it would update


def test_training_mode_dropout_asks_for_eval():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    with pytest.raises(TorchUnsupportedError, match=r"module\.eval\(\)"):
        rlx.from_torch(m, (torch.randn(2, 4),))


def test_not_a_module_and_failing_export():
    with pytest.raises(TorchImportError, match="takes a torch.nn.Module, given function"):
        rlx.from_torch(lambda x: x, (torch.randn(2),))

    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[x > 0]  # output size depends on the values

    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # control flow on a value
                return x
            return -x

    with pytest.raises(TorchImportError, match="torch.export.export failed for Branchy"):
        rlx.from_torch(Branchy(), (torch.randn(3),))


def test_unsupported_form_of_a_mapped_op_names_the_module():
    m = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(2, 2, 3))
    with pytest.raises(TorchUnsupportedError) as ei:
        rlx.from_torch(m.eval(), (torch.randn(1, 2, 5, 5),))
    assert ei.value.module_path == "0"


def test_run_checks_the_number_of_tensors():
    tm = rlx.from_torch(nn.Linear(3, 2).eval(), (torch.randn(2, 3),))
    with pytest.raises(TorchImportError, match=r"run\(\) takes 1 tensors \(input\), given 2"):
        tm.run(torch.randn(2, 3), torch.randn(2, 3))


def test_decomposition_fallback_maps_core_aten():
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.logsumexp(x, dim=1, keepdim=True) + nn.functional.hardshrink(x, 0.3)

    x = torch.randn(5, 6)
    tm = rlx.from_torch(M(), (x,))
    assert tm.decomposed
    np.testing.assert_allclose(tm.run(x)[0], M()(x).numpy(), rtol=1e-5, atol=1e-6)


def test_nodes_carry_the_model_source_line():
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x) * 3  # TANH_LINE

    tm = rlx.from_torch(M(), (torch.randn(2, 2),))
    tanh = next(n for n in tm.graph.nodes if str(n.op) == "tanh")
    assert tanh.loc is not None and tanh.loc.file == __file__
    assert tanh.loc.line == _line("TANH_LINE")


def test_shape_rule_errors_name_the_aten_op():
    class PadBatch(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.pad(x, (0, 0, 1, 0))  # pads the dynamic batch axis

    batch = torch.export.Dim("batch", max=16)
    with pytest.raises(TorchImportError, match=r"ATen op aten\.pad\.default .*symbolic"):
        rlx.from_torch(PadBatch(), (torch.randn(3, 4),), ({0: batch},))


def test_size_one_example_on_a_dynamic_axis_gets_a_hint():
    batch = torch.export.Dim("batch", max=16)
    with pytest.raises(TorchImportError, match="sizes >= 2 on their dynamic axes"):
        rlx.from_torch(nn.Linear(3, 2).eval(), (torch.randn(1, 3),), ({0: batch},))
