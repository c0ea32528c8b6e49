"""rlx.models.llm.load of Hugging Face decoder directories against transformers.

Each checkpoint is a tiny random model written by transformers itself (``save_pretrained``)
with a word-level tokenizer.json built by the ``tokenizers`` library; the oracle is the same
transformers model: next-token logits after a prompt and after decode steps (the KV cache
path), greedy continuations, a bf16 checkpoint, sharded files and the errors of broken ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

import rlx.models.llm as llm  # noqa: E402
from rlx.errors import InputError, ModelError  # noqa: E402

VOCAB = 128
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 5}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 16,
        },
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "head_dim": 16,
            "sliding_window": 4,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 5.0,  # more: test_gemma2_softcap.py
            "attn_implementation": "eager",  # transformers' sdpa path ignores that cap
            "final_logit_softcapping": 3.0,  # small enough to bend these logits
        },
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "sliding_window": 6}),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "qwen2moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "mlp_only_layers": [1],  # layer 1 a dense FFN
        },
    ),
    "qwen3moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "head_dim": 16,
        },
    ),
}
PROMPT = [1, 5, 9, 20, 33, 7, 64, 100, 3, 11]


def _tokenizer(folder: Path, bos: bool) -> None:
    """A word-level tokenizer.json (``w3`` is id 3; ids 0-2 are <unk>, <s>, </s>) and a
    tokenizer_config.json with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials)} | {f"w{i}": i for i in range(3, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": "{{ messages }}"}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


def _write(folder: Path, family: str, dtype: str = "f32", **save: object) -> object:
    """A tiny random ``family`` model saved to ``folder``; returns the torch model (f32)."""
    cfg_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(**SIZES, **extra, initializer_range=0.2)
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():  # norm weights away from their init (1 or 0)
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.3)
        if family.startswith("gemma"):  # its sqrt(d)-scaled tied embedding echoes the input
            model.get_input_embeddings().weight.mul_(0.1)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(folder, **save)
    _tokenizer(folder, bos=family != "qwen2")
    if dtype == "bf16":  # the saved weights in f32 (rope tables not rounded to bf16)
        cls = getattr(transformers, model_name)
        return cls.from_pretrained(folder, dtype=torch.float32).eval()
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    root = tmp_path_factory.mktemp("hf_llm")
    return {f: (root / f, _write(root / f, f)) for f in FAMILIES}


def _reference(model: object, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _check_logits(m: llm.LlmModel, ref: np.ndarray, tol: float) -> None:
    """Prefill of the first 6 prompt tokens, then the rest as decode steps."""
    got = [m.prefill(PROMPT[:6])] + [m.step(t) for t in PROMPT[6:]]
    for j, g in enumerate(got, start=5):
        assert _rel(g, ref[j]) < tol, (j, _rel(g, ref[j]))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers(family: str, checkpoints: dict) -> None:
    folder, model = checkpoints[family]
    m = llm.load(folder, max_context=64, num_threads=1)
    assert m.config.arch.name == {"mistral": "llama"}.get(family, family)
    if family == "gemma2":  # alternating windows, the first layer sliding
        assert [m.config.window(i) for i in range(2)] == [4, 0]
    _check_logits(m, _reference(model, PROMPT), 1e-5)


@pytest.mark.parametrize(
    "family", ["llama", "qwen3", "gemma3", "gemma2", "phi3", "mixtral", "qwen2moe", "qwen3moe"]
)
def test_greedy_matches_transformers(family: str, checkpoints: dict) -> None:
    folder, model = checkpoints[family]
    m = llm.load(folder, max_context=64, num_threads=1)
    # a prompt whose continuation varies on these random weights
    prompt = PROMPT[2:7] if family in ("mixtral", "qwen2moe", "qwen3moe") else PROMPT[:5]
    model.generation_config.eos_token_id = None  # EOS is a token like any other here
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, pad_token_id=0
        )
    want = out[0, len(prompt) :].tolist()
    got = m.generate(prompt, max_tokens=24, stop_at_eos=False)
    assert got.token_ids == want
    assert len(set(want)) > 3  # a continuation, not one token repeated


def test_bf16_checkpoint_stays_bf16_on_disk(tmp_path: Path) -> None:
    """A bf16 checkpoint: the tensors are bf16 views of the file; the logits equal
    transformers' on the same (bf16-rounded) weights computed in f32."""
    model = _write(tmp_path, "llama", dtype="bf16")
    m = llm.load(tmp_path, max_context=64, num_threads=1)
    t = m.file.tensors["blk.0.attn_q.weight"]
    assert t.type_name == "BF16" and t.data.dtype.name == "bfloat16"
    assert not t.data.flags.writeable  # a view of the memory-mapped file
    _check_logits(m, _reference(model, PROMPT), 1e-5)
    with torch.no_grad():  # the bf16 model as transformers runs it: within 1e-2
        bf16 = model.to(torch.bfloat16)(torch.tensor([PROMPT[:6]])).logits[0, -1].float().numpy()
    assert _rel(m.logits(PROMPT[:6]), bf16) < 1e-2 * 5


def test_sharded_checkpoint(tmp_path: Path, checkpoints: dict) -> None:
    folder, model = checkpoints["qwen2"]
    shard_dir = tmp_path / "sharded"
    _write(shard_dir, "qwen2", max_shard_size="40KB")
    shards = sorted(shard_dir.glob("model-*.safetensors"))
    assert len(shards) > 1 and (shard_dir / "model.safetensors.index.json").is_file()
    m = llm.load(shard_dir, max_context=64, num_threads=1)
    _check_logits(m, _reference(model, PROMPT), 1e-5)


def test_missing_shard_and_disagreeing_shard(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    _write(tmp_path, "llama", max_shard_size="40KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    victim = shards[-1]
    tensors = load_file(str(victim))
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    save_file(tensors, str(victim))
    with pytest.raises(ModelError, match=f"{victim.name}.*disagree.*{dropped}"):
        llm.load(tmp_path, max_context=64)
    victim.unlink()
    with pytest.raises(ModelError, match=f"shards that do not exist: {victim.name}"):
        llm.load(tmp_path, max_context=64)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    _write(tmp_path, "qwen3")
    file = tmp_path / "model.safetensors"
    tensors = load_file(str(file))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(file))
    with pytest.raises(ModelError, match="no tensor 'model.layers.1.mlp.up_proj.weight'"):
        llm.load(tmp_path, max_context=64)
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((96, 60), np.float32)
    save_file(tensors, str(file))
    with pytest.raises(ModelError, match=r"up_proj.weight' has shape \[96, 60\].*\[96, 64\]"):
        llm.load(tmp_path, max_context=64)


def test_unsupported_architecture_and_rope(tmp_path: Path) -> None:
    _write(tmp_path, "llama")
    cfg_file = tmp_path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg_file.write_text(json.dumps(cfg | {"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        llm.load(tmp_path)
    odd = {"rope_type": "mrope", "rope_theta": 10000.0, "factor": 4.0}
    cfg_file.write_text(json.dumps(cfg | {"rope_parameters": odd}))
    with pytest.raises(ModelError, match="rope type 'mrope'.*supported: default, linear, llama3"):
        llm.load(tmp_path)


def test_linear_rope_scaling(tmp_path: Path) -> None:
    """A legacy (transformers 4) config.json: rope_theta and linear rope_scaling."""
    model = _write(tmp_path, "llama")
    cfg_file = tmp_path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.pop("rope_parameters", None)
    cfg |= {"rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    cfg_file.write_text(json.dumps(cfg))
    scaled = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert scaled.config.rope_parameters["rope_type"] == "linear"
    m = llm.load(tmp_path, max_context=64, num_threads=1)
    assert (m.config.rope_base, m.config.rope_scale) == (500.0, 2.0)
    _check_logits(m, _reference(scaled.float(), PROMPT), 1e-5)
    del model


def test_llama3_rope_scaling(tmp_path: Path) -> None:
    """Llama 3.x's rope: a middle band of wavelengths interpolated (old context 16 puts
    the head's frequencies in all three bands)."""
    _write(tmp_path, "llama")
    cfg_file = tmp_path / "config.json"
    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    cfg_file.write_text(json.dumps(json.loads(cfg_file.read_text()) | {"rope_parameters": rope}))
    scaled = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    m = llm.load(tmp_path, max_context=64, num_threads=1)
    assert m.config.rope_inv_freq is not None
    _check_logits(m, _reference(scaled.float(), PROMPT), 1e-5)


def _with_rope(folder: Path, family: str, rope: dict, **top: object) -> object:
    """``folder``'s config.json with ``rope_parameters`` = ``rope`` (and ``top`` keys);
    the transformers model read back from it (f32)."""
    cfg_file = folder / "config.json"
    cfg = json.loads(cfg_file.read_text()) | {"rope_parameters": rope} | top
    cfg_file.write_text(json.dumps(cfg))
    cls = getattr(transformers, FAMILIES[family][1])
    return cls.from_pretrained(folder, dtype=torch.float32).eval()


def test_yarn_rope_scaling(tmp_path: Path) -> None:
    """YaRN: frequencies blended across the ramp (an old context of 16 puts the head's
    frequencies on both sides of it) and cos / sin scaled by the attention factor."""
    _write(tmp_path, "llama")
    rope = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    scaled = _with_rope(tmp_path, "llama", rope)
    m = llm.load(tmp_path, max_context=64, num_threads=1)
    assert m.config.rope_gain == pytest.approx(0.1 * np.log(4.0) + 1.0)
    _check_logits(m, _reference(scaled, PROMPT), 1e-5)


def test_dynamic_rope_caps_the_context(tmp_path: Path) -> None:
    """Dynamic NTK equals the default rope within the original context, where rlx caps
    the context (its tables are fixed)."""
    _write(tmp_path, "llama")
    rope = {
        "rope_type": "dynamic",
        "rope_theta": 10000.0,
        "factor": 2.0,
        "original_max_position_embeddings": 32,
    }
    scaled = _with_rope(tmp_path, "llama", rope)
    m = llm.load(tmp_path, max_context=32, num_threads=1)
    assert m.config.context_length == 32
    _check_logits(m, _reference(scaled, PROMPT), 1e-5)
    with pytest.raises(InputError, match="exceeds the model's context length 32"):
        llm.load(tmp_path, max_context=64)


def test_phi3_longrope(tmp_path: Path) -> None:
    """Phi-3's longrope within the original context: the short factors and the
    attention factor sqrt(1 + ln(256 / 64) / ln 64) on cos / sin."""
    _write(tmp_path, "phi3")
    rot = 16 // 2
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.25 * i for i in range(rot)],
        "long_factor": [2.0 + i for i in range(rot)],
        "original_max_position_embeddings": 64,
    }
    scaled = _with_rope(tmp_path, "phi3", rope, original_max_position_embeddings=64)
    m = llm.load(tmp_path, max_context=64, num_threads=1)
    assert m.config.rope_gain == pytest.approx(np.sqrt(1 + np.log(4) / np.log(64)))
    _check_logits(m, _reference(scaled, PROMPT), 1e-5)


def test_tokenizer_template_and_text_generation(checkpoints: dict) -> None:
    folder, _ = checkpoints["llama"]
    m = llm.load(folder, max_context=64, num_threads=1)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "w5 w9 w20 w33"
    assert m.encode(text) == hf_tok(text).input_ids == [1, 5, 9, 20, 33]
    assert m.tokenizer.stop_ids == frozenset({2})
    assert m.chat_template == "{{ messages }}"
    out = m.generate(text, max_tokens=6, stop_at_eos=False)
    assert out.prompt_ids == [1, 5, 9, 20, 33]
    assert out.text == hf_tok.decode(out.token_ids, skip_special_tokens=True)
    qwen = llm.load(checkpoints["qwen2"][0], max_context=64, num_threads=1)
    assert qwen.encode(text) == [5, 9, 20, 33]  # its tokenizer adds no BOS


def test_batched_decoder_on_hf_model(checkpoints: dict) -> None:
    folder, model = checkpoints["qwen3"]
    m = llm.load(folder, max_context=64, num_threads=1)
    ref_a, ref_b = _reference(model, PROMPT), _reference(model, PROMPT[::-1])
    dec = m.batched(2)
    a, b = dec.acquire(), dec.acquire()
    assert _rel(dec.prefill(a, PROMPT[:6]), ref_a[5]) < 1e-5
    assert _rel(dec.prefill(b, PROMPT[::-1][:6]), ref_b[5]) < 1e-5
    both = dec.step([a, b], [PROMPT[6], PROMPT[::-1][6]])
    assert _rel(both[0], ref_a[6]) < 1e-5 and _rel(both[1], ref_b[6]) < 1e-5


def test_cli_generate_on_a_directory(checkpoints: dict) -> None:
    from click.testing import CliRunner

    from rlx.cli.generate import command

    folder, _ = checkpoints["llama"]
    res = CliRunner().invoke(command, [str(folder), "w5 w9 w20", "--max-tokens", "4"])
    assert res.exit_code == 0, res.output


def test_serving_loads_a_directory(checkpoints: dict) -> None:
    """rlx serve's loader: the context from config.json, the chat template and its
    special tokens from tokenizer_config.json."""
    import asyncio

    pytest.importorskip("jinja2")
    from rlx.serve.config import ServeConfig
    from rlx.serve.generation import GenerationService, load_model
    from rlx.serve.loading import load_services
    from rlx.serve.metrics import Metrics

    folder, _ = checkpoints["llama"]
    cfg = ServeConfig(parallel=1, ctx=32)
    (svc,) = load_services([f"hf={folder}"], cfg)
    assert isinstance(svc, GenerationService) and svc.id == "hf"  # not an embedding model
    m, ctx = load_model(folder, cfg)
    assert ctx == 32 and isinstance(m, llm.LlmModel)
    svc = GenerationService(m, "hf", cfg)
    try:
        asyncio.run(svc.start(Metrics()))
        assert svc.load_error is None and svc.template is not None
        assert svc.template.source == "{{ messages }}"
        assert ("bos_token", "<s>") in svc.template.special_tokens
    finally:
        svc.close()
