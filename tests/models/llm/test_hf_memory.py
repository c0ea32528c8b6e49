"""Memory of Hugging Face checkpoints as rlx.models.llm loads them, measured by the kernel
(``/proc/self/statm`` resident pages, ``VmHWM`` of ``/proc/self/status``) in a fresh
subprocess: a bf16 checkpoint stays packed (resident growth within 1.1x the file size,
where widening to f32 would double it), and quantizing one at load (``precision=``) peaks
under 1.2x the quantized size (the issue's bound: no f32 or second packed copy of the
model, only one panel of rows at a time).

The checkpoints are random bf16 Llama weights written with ``safetensors.torch`` (sizes
big enough that interpreter noise is small against them). The child first loads and
runs a tiny checkpoint, so the imports and native libraries the runtime needs are not
counted against the big one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

ROOT = Path(__file__).resolve().parents[3]

_CHILD = r"""
import json, sys
import rlx.models.llm as llm

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

big, tiny, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
llm.load(tiny, max_context=32, num_threads=1, **kw).logits([1, 2, 3, 4, 5])
with open("/proc/self/clear_refs", "w") as fh:  # VmHWM from here on
    fh.write("5")
out = {"before": resident(), "peak_before": peak()}
m = llm.load(big, max_context=32, num_threads=1, **kw)
out["loaded"] = resident()
out["peak_loaded"] = peak()
m.logits([1, 2, 3, 4, 5])
out["run"] = resident()
out["peak"] = peak()
q = m.quantization
out["quantized"] = q.quantized_bytes if q is not None else 0
print(json.dumps(out))
"""


def write_llama(folder: Path, vocab: int, d: int, ffn: int, layers: int, heads: int) -> Path:
    """Random bf16 Llama weights (tied embeddings) and their config.json in ``folder``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    ones = torch.ones(d, dtype=torch.bfloat16)
    t = {"model.embed_tokens.weight": rand(vocab, d), "model.norm.weight": ones.clone()}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in "qkvo":
            t[f"{p}self_attn.{n}_proj.weight"] = rand(d, d)
        t[p + "mlp.gate_proj.weight"] = rand(ffn, d)
        t[p + "mlp.up_proj.weight"] = rand(ffn, d)
        t[p + "mlp.down_proj.weight"] = rand(d, ffn)
        t[p + "input_layernorm.weight"] = ones.clone()
        t[p + "post_attention_layernorm.weight"] = ones.clone()
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": d,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "model.safetensors"


def measure(big: Path, tiny: Path, **kw: object) -> dict[str, int]:
    """The child's resident bytes before / after loading ``big`` and after its first
    logits, and its peak (``VmHWM``) before and after."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(big.parent), str(tiny), json.dumps(kw)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("tiny"), 256, 256, 512, 1, 4).parent


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("big"), 8192, 768, 2048, 8, 12)


@pytest.mark.slow
def test_bf16_checkpoint_stays_within_its_file_size(big: Path, tiny: Path) -> None:
    size = big.stat().st_size
    m = measure(big, tiny)
    grown = m["run"] - m["before"]
    assert grown < 1.1 * size, (grown / size, m)
    assert m["loaded"] - m["before"] < 0.2 * size, m  # mapped, not read, until it runs


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["int8", "int4", "q8_0", "q4_k"])
def test_quantizing_at_load_peaks_under_1_2x_the_quantized_size(
    big: Path, tiny: Path, precision: str
) -> None:
    m = measure(big, tiny, precision=precision)
    quantized = m["quantized"]
    assert 0 < quantized < 0.7 * big.stat().st_size, m
    peak = m["peak"] - m["before"]  # the kernel's high-water mark, through load and a run
    assert peak < 1.2 * quantized, (precision, peak / quantized, m)
