"""rlx outputs equal the PyTorch re-implementations of the peer-benchmark workloads
(benchmarks/_peers_models.py): same params, same input, float32 tolerance.

torch is in the optional ``peers`` extra, not installed in CI: this module is skipped
when torch cannot be imported (the one allowed skip)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.errors import InputError

torch = pytest.importorskip("torch")

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "_peers_models.py"
_spec = importlib.util.spec_from_file_location("_peers_models", _PATH)
assert _spec is not None and _spec.loader is not None
pm = importlib.util.module_from_spec(_spec)
sys.modules["_peers_models"] = pm
_spec.loader.exec_module(pm)

VARIANTS = {
    "default": rlx.CompileOptions(num_threads=1),
    "no_fuse": rlx.CompileOptions(num_threads=1, fuse=False),
    "no_optimize": rlx.CompileOptions(num_threads=1, optimize=False),
}


def _rlx(w: pm.Workload, options: rlx.CompileOptions) -> np.ndarray:
    c = rlx.Session("cpu").compile(w.graph, options, params=dict(w.params))
    return c.run({"x": w.x})[0]


def _torch(w: pm.Workload) -> np.ndarray:
    with torch.inference_mode():
        return pm.torch_forward(w)(torch.from_numpy(w.x.copy())).numpy()


def _check(w: pm.Workload, options: rlx.CompileOptions, tol: float = 2e-5) -> None:
    got, want = _rlx(w, options), _torch(w)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mlp_matches_torch(variant: str) -> None:
    w = pm.mlp_workload(pm.MlpConfig(batch=4, d_in=64, hidden=256, d_out=32), seed=3)
    _check(w, VARIANTS[variant])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_minilm_encoder_matches_torch(variant: str) -> None:
    """The benchmark's workload itself: MiniLM sizes (6 layers, hidden 384, seq 128)."""
    w = pm.encoder_workload()
    assert w.x.shape == (1, 128, 384)
    _check(w, VARIANTS[variant], tol=5e-5)


@settings(max_examples=8, deadline=None)
@given(
    layers=st.integers(1, 2),
    heads=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([4, 8]),
    seq=st.integers(1, 12),
    batch=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_small_encoders_match_torch(
    layers: int, heads: int, head_dim: int, seq: int, batch: int, seed: int
) -> None:
    hidden = heads * head_dim
    cfg = pm.EncoderConfig(
        layers=layers, hidden=hidden, heads=heads, ffn=2 * hidden, seq=seq, batch=batch
    )
    _check(pm.encoder_workload(cfg, seed=seed), VARIANTS["default"])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_chain_matches_torch(variant: str) -> None:
    w = pm.chain_workload()
    assert len(pm.CHAIN) == 100
    _check(w, VARIANTS[variant])


# exp only right after tanh keeps values bounded (exp(exp(x)) would amplify float32
# rounding past any fixed tolerance)
_BLOCKS = [
    (pm.ChainStep.ADD,),
    (pm.ChainStep.MUL,),
    (pm.ChainStep.TANH,),
    (pm.ChainStep.TANH, pm.ChainStep.EXP),
]


@settings(max_examples=10, deadline=None)
@given(blocks=st.lists(st.sampled_from(_BLOCKS), min_size=1, max_size=20), seed=st.integers(0, 99))
def test_any_chain_matches_torch(blocks: list[tuple[pm.ChainStep, ...]], seed: int) -> None:
    steps = tuple(s for b in blocks for s in b)
    _check(pm.chain_workload(steps, seed=seed), VARIANTS["default"])


def test_chain_constants_are_hand_checked() -> None:
    """add 0.5, mul 0.75, tanh, exp on x = 0: exp(tanh(0.375))."""
    w = pm.chain_workload(pm.CHAIN[:4])
    zero = pm.Workload(w.kind, w.title, w.graph, {}, np.zeros_like(w.x), w.config)
    np.testing.assert_allclose(_rlx(zero, VARIANTS["default"]), np.exp(np.tanh(0.375)), rtol=1e-6)
    np.testing.assert_allclose(_torch(zero), np.exp(np.tanh(0.375)), rtol=1e-6)


def test_missing_param_names_the_param() -> None:
    w = pm.mlp_workload(pm.MlpConfig(batch=2, d_in=8, hidden=16, d_out=4))
    params = {k: v for k, v in w.params.items() if k != "fc2.bias"}
    broken = pm.Workload(w.kind, w.title, w.graph, params, w.x, w.config)
    with pytest.raises(InputError, match=r"fc2\.bias"):
        pm.torch_forward(broken)
    enc = pm.encoder_workload(pm.EncoderConfig(layers=1, hidden=8, heads=2, ffn=16, seq=4))
    params = {k: v for k, v in enc.params.items() if k != "layer0.ln2.beta"}
    with pytest.raises(InputError, match=r"layer0\.ln2\.beta"):
        pm.torch_forward(pm.Workload(enc.kind, enc.title, enc.graph, params, enc.x, enc.config))
