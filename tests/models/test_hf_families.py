"""The rope encoder families in ``SentenceEncoder``: ModernBERT and the Qwen2 / Qwen3
decoder embedders against ``SentenceTransformer.encode`` on tiny random checkpoints
written by transformers and sentence-transformers in the test; NomicBERT (remote code,
not in transformers) against a PyTorch reference written here from the published
modeling code. Padded batches of mixed lengths give each text's row as alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlx.errors import ModelError
from rlx.models import SentenceEncoder
from rlx.models.hf import Family, load
from tests.models import st_checkpoints as sc
from tests.models import tiny_checkpoints as tc

TEXTS = list(tc.SENTENCES) + ["unknownword", "cat", "the cat"]
ATOL = 1e-5


def _spread(model: object, seed: int) -> None:
    """Weights redrawn with a larger spread (norm weights near 1), so rows differ clearly."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # type: ignore[attr-defined]
            if p.ndim >= 2:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
            elif "norm" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.3)


def _vocab_size() -> int:
    return int(tc.config("bert")["vocab_size"])


def _save_st(
    hf_dir: Path,
    out: Path,
    pooling: str,
    normalize: bool = False,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> Path:
    """A SentenceTransformer (Transformer + Pooling [+ Normalize]) over ``hf_dir``, saved."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    first = Transformer(str(hf_dir), max_seq_length=tc.MAX_LEN)
    mods = [first, Pooling(first.get_embedding_dimension(), pooling)]
    if normalize:
        mods.append(Normalize())
    st = SentenceTransformer(
        modules=mods, device="cpu", prompts=prompts, default_prompt_name=default_prompt_name
    )
    st.save(str(out))
    return out


def _modernbert(tmp: Path, layers: int = 4, **extra: object) -> Path:
    import torch
    import transformers

    hf = tmp / "modernbert_hf"
    torch.manual_seed(0)
    cfg = transformers.ModernBertConfig(
        vocab_size=_vocab_size(), hidden_size=32, intermediate_size=48,
        num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=64,
        local_attention=6, pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2,
        sep_token_id=3, **extra,
    )  # fmt: skip
    model = transformers.ModernBertModel(cfg)
    _spread(model, 0)
    model.save_pretrained(str(hf))
    sc.tokenizer("bert", hf, token_types=False)
    return hf


def _qwen(tmp: Path, kind: str, **extra: object) -> Path:
    import torch
    import transformers

    hf = tmp / f"{kind}_hf"
    torch.manual_seed(1)
    cls = "Qwen2" if kind == "qwen2" else "Qwen3"
    cfg = getattr(transformers, f"{cls}Config")(
        vocab_size=_vocab_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        **({"head_dim": 16} if kind == "qwen3" else {}), **extra,
    )  # fmt: skip
    model = getattr(transformers, f"{cls}Model")(cfg)
    _spread(model, 1)
    model.save_pretrained(str(hf))
    sc.tokenizer("bert", hf, token_types=False)
    tcfg = hf / "tokenizer_config.json"  # as Qwen3-Embedding: padding on the left
    data = json.loads(tcfg.read_text())
    tcfg.write_text(json.dumps({**data, "padding_side": "left"}))
    return hf


def _st_encode(path: Path, texts: list[str], **kw: object) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(texts, batch_size=4, **kw)


def _alone_equals_batched(enc: SentenceEncoder, texts: list[str], **kw: object) -> None:
    batched = enc.encode(texts, batch_size=len(texts), **kw)
    for i, t in enumerate(texts):
        alone = enc.encode([t], **kw)[0]
        assert np.array_equal(alone, batched[i]), (i, np.abs(alone - batched[i]).max())


# ---- ModernBERT ---------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_modernbert_matches_sentence_transformers(tmp_path, pooling) -> None:
    hf = _modernbert(tmp_path)
    d = _save_st(hf, tmp_path / "st", pooling, normalize=pooling == "cls")
    enc = SentenceEncoder(d, num_threads=1)
    assert enc.model.config.family is Family.MODERNBERT
    assert enc.model.config.spec.sliding_layers == (False, True, True, False)
    want = _st_encode(d, TEXTS)
    got = enc.encode(TEXTS, batch_size=4)
    assert got.shape == want.shape and np.abs(got - want).max() <= ATOL
    _alone_equals_batched(enc, TEXTS)


def test_modernbert_hidden_states_match_transformers(tmp_path) -> None:
    """The last hidden state on the real tokens, layer 0's identity norm, the local window
    (6: |i - j| <= 3, shorter than the texts) and biases on norms and linears."""
    import torch
    import transformers

    hf = _modernbert(tmp_path, layers=3, norm_bias=True, attention_bias=True, mlp_bias=True,
                     global_attn_every_n_layers=2)  # fmt: skip
    model = load(hf, num_threads=1)
    assert model.config.spec.sliding_layers == (False, True, False)
    feed = model.inputs(TEXTS[:4])
    got = model.compile().run(feed)[0]
    ref = transformers.ModernBertModel.from_pretrained(str(hf), attn_implementation="eager")
    with torch.no_grad():
        want = ref(
            input_ids=torch.tensor(feed["input_ids"]),
            attention_mask=torch.tensor(feed["attention_mask"]),
        ).last_hidden_state.numpy()
    real = feed["attention_mask"].astype(bool)
    assert np.abs(got[real] - want[real]).max() <= ATOL


# ---- Qwen decoders ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_qwen_embedder_matches_sentence_transformers(tmp_path, kind) -> None:
    """Last-token pooling with the model's prompt (Qwen3-Embedding's layout); the tokenizer
    pads on the left for sentence-transformers, rlx pads on the right."""
    hf = _qwen(tmp_path, kind)
    prompts = {"query": "the cat ", "document": ""}
    d = _save_st(hf, tmp_path / "st", "lasttoken", True, prompts, default_prompt_name="query")
    enc = SentenceEncoder(d, num_threads=1)
    assert enc.model.config.family is Family(kind)
    assert not enc.model.tokenizer.pad_left
    for kw in ({}, {"prompt_name": "document"}):
        want = _st_encode(d, TEXTS, **kw)
        got = enc.encode(TEXTS, batch_size=4, **kw)
        assert got.shape == want.shape and np.abs(got - want).max() <= ATOL, kw
    _alone_equals_batched(enc, TEXTS)


def test_qwen_causal_lm_checkpoint_and_sliding_window(tmp_path) -> None:
    """A ``Qwen2ForCausalLM`` checkpoint (``model.`` names, an LM head) with a sliding window
    of 3 tokens on its second layer: the last hidden state equals transformers' on the
    real tokens of right-padded texts."""
    import torch
    import transformers

    torch.manual_seed(2)
    cfg = transformers.Qwen2Config(
        vocab_size=_vocab_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
        use_sliding_window=True, sliding_window=3, max_window_layers=1,
    )  # fmt: skip
    lm = transformers.Qwen2ForCausalLM(cfg)
    _spread(lm, 2)
    hf = tmp_path / "qwen2lm"
    lm.save_pretrained(str(hf))
    sc.tokenizer("bert", hf, token_types=False)
    model = load(hf, num_threads=1)
    assert model.config.spec.window(0) == 0 and model.config.spec.window(1) == 3
    feed = model.inputs(TEXTS[:4])
    got = model.compile().run(feed)[0]
    ref = transformers.Qwen2Model.from_pretrained(str(hf), attn_implementation="eager")
    real = feed["attention_mask"].astype(bool)
    with torch.no_grad():
        for i in range(len(feed["input_ids"])):  # each text alone: no padding in transformers
            ids = torch.tensor(feed["input_ids"][i][real[i]])[None]
            want = ref(input_ids=ids).last_hidden_state.numpy()[0]
            assert np.abs(got[i][real[i]] - want).max() <= ATOL, i


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("family", ["modernbert", "qwen3"])
def test_lower_precisions_stay_close_to_sentence_transformers(tmp_path, family, precision) -> None:
    """bf16 (AutoMixedBf16) and int8 (dynamic per-row activations) on the new graphs:
    every row's cosine to sentence-transformers' f32 embedding >= 0.995."""
    hf = _modernbert(tmp_path) if family == "modernbert" else _qwen(tmp_path, family)
    d = _save_st(hf, tmp_path / "st", "mean" if family == "modernbert" else "lasttoken")
    want = _st_encode(d, TEXTS)
    got = SentenceEncoder(d, precision, num_threads=1).encode(TEXTS)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.995, cos


def test_qwen3_bf16_checkpoint_matches_transformers(tmp_path) -> None:
    """A Qwen3 checkpoint stored in bf16 (as Qwen3-Embedding ships), with
    ``attention_bias`` (biases on q / k / v and o_proj): rlx widens the memory-mapped bf16
    weights to f32; transformers loads the same file as f32."""
    import torch
    import transformers

    torch.manual_seed(4)
    cfg = transformers.Qwen3Config(
        vocab_size=_vocab_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        tie_word_embeddings=True, rope_theta=1000000.0, attention_bias=True,
    )  # fmt: skip
    lm = transformers.Qwen3ForCausalLM(cfg)
    _spread(lm, 4)
    hf = tmp_path / "q3bf16"
    lm.to(torch.bfloat16).save_pretrained(str(hf))
    sc.tokenizer("bert", hf, token_types=False)
    model = load(hf, num_threads=1)
    assert model.config.spec.rope_base == 1000000.0 and model.config.head_dim == 8
    assert "layers.1.self_attn.o_proj.bias" in model.params
    feed = model.inputs(TEXTS[:4])
    got = model.compile().run(feed)[0]
    ref = transformers.Qwen3Model.from_pretrained(
        str(hf), dtype=torch.float32, attn_implementation="eager"
    )
    real = feed["attention_mask"].astype(bool)
    with torch.no_grad():
        for i in range(len(feed["input_ids"])):
            ids = torch.tensor(feed["input_ids"][i][real[i]])[None]
            want = ref(input_ids=ids).last_hidden_state.numpy()[0]
            assert np.abs(got[i][real[i]] - want).max() <= ATOL, i


# ---- NomicBERT ----------------------------------------------------------------------

NOMIC_CONFIG = {
    "architectures": ["NomicBertModel"],
    "model_type": "nomic_bert",
    "activation_function": "swiglu",
    "causal": False,
    "prenorm": False,
    "n_embd": 32,
    "n_head": 4,
    "n_layer": 2,
    "n_inner": 48,  # the gated MLP rounds it up to 256
    "n_positions": 64,
    "rotary_emb_base": 1000,
    "rotary_emb_fraction": 0.5,
    "rotary_emb_interleaved": False,
    "rotary_emb_scale_base": None,
    "rotary_scaling_factor": None,
    "qkv_proj_bias": False,
    "mlp_fc1_bias": False,
    "mlp_fc2_bias": False,
    "layer_norm_epsilon": 1e-12,
    "type_vocab_size": 2,
    "pad_vocab_size_multiple": 8,
    "use_rms_norm": False,
}


def _nomic_weights(cfg: dict, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, f = cfg["n_embd"], (cfg["n_inner"] + 255) // 256 * 256
    m = cfg["pad_vocab_size_multiple"]
    vocab = (_vocab_size() + m - 1) // m * m
    bias1, bias2, qkv_bias = cfg["mlp_fc1_bias"], cfg["mlp_fc2_bias"], cfg["qkv_proj_bias"]

    def mat(o: int, i: int) -> np.ndarray:
        return rng.normal(0, i**-0.5, (o, i)).astype(np.float32)

    def vec(n: int, mean: float = 0.0, sd: float = 0.3) -> np.ndarray:
        return rng.normal(mean, sd, n).astype(np.float32)

    w = {
        "embeddings.word_embeddings.weight": rng.normal(0, 1, (vocab, h)).astype(np.float32),
        "embeddings.token_type_embeddings.weight": rng.normal(0, 1, (2, h)).astype(np.float32),
        "emb_ln.weight": vec(h, 1.0, 0.1),
        "emb_ln.bias": vec(h),
    }
    for i in range(cfg["n_layer"]):
        p = f"encoder.layers.{i}"
        w[f"{p}.attn.Wqkv.weight"] = mat(3 * h, h)
        w[f"{p}.attn.out_proj.weight"] = mat(h, h)
        if qkv_bias:
            w[f"{p}.attn.Wqkv.bias"], w[f"{p}.attn.out_proj.bias"] = vec(3 * h), vec(h)
        for n in ("fc11", "fc12"):
            w[f"{p}.mlp.{n}.weight"] = mat(f, h)
            if bias1:
                w[f"{p}.mlp.{n}.bias"] = vec(f)
        w[f"{p}.mlp.fc2.weight"] = mat(h, f)
        if bias2:
            w[f"{p}.mlp.fc2.bias"] = vec(h)
        for n in ("norm1", "norm2"):
            w[f"{p}.{n}.weight"], w[f"{p}.{n}.bias"] = vec(h, 1.0, 0.1), vec(h)
    return w


def _nomic_reference(
    cfg: dict, w: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """NomicBertModel's last hidden state, in PyTorch, from the equations of contrastors'
    ``modeling_hf_nomic_bert.py`` (``NomicBertEmbeddings``, ``NomicBertAttention`` with
    ``NomicBertRotaryEmbedding`` / ``apply_rotary_emb`` (non-interleaved), ``NomciBertGatedMLP``
    (``y = fc11(x) * act(fc12(x))``) and ``NomicBertBlock`` with ``prenorm=False``; the mask
    as ``get_extended_attention_mask``: ``(1 - mask) * finfo.min``)."""
    import torch
    import torch.nn.functional as F

    t = {k: torch.from_numpy(v) for k, v in w.items()}
    h, heads = cfg["n_embd"], cfg["n_head"]
    d = h // heads
    rot = int(d * cfg["rotary_emb_fraction"])
    eps = cfg["layer_norm_epsilon"]
    act = {"swiglu": F.silu, "geglu": F.gelu, "glu": torch.sigmoid}[cfg["activation_function"]]
    ids_t = torch.from_numpy(ids)
    b, s = ids.shape
    x = t["embeddings.word_embeddings.weight"][ids_t]
    x = x + t["embeddings.token_type_embeddings.weight"][torch.zeros_like(ids_t)]
    x = F.layer_norm(x, (h,), t["emb_ln.weight"], t["emb_ln.bias"], eps)
    ext = (1.0 - torch.from_numpy(mask).float())[:, None, None, :] * torch.finfo(torch.float32).min
    inv = 1.0 / (cfg["rotary_emb_base"] ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freqs = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    cos = torch.cat([torch.cos(freqs)] * 2, -1)[None, :, None, :]  # "... d -> ... 1 (2 d)"
    sin = torch.cat([torch.sin(freqs)] * 2, -1)[None, :, None, :]

    def rotary(z: torch.Tensor) -> torch.Tensor:
        z1, z2 = z[..., :rot].chunk(2, dim=-1)
        half = torch.cat((-z2, z1), dim=-1)
        return torch.cat([z[..., :rot] * cos + half * sin, z[..., rot:]], dim=-1)

    def lin(z: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(z, t[f"{name}.weight"], t.get(f"{name}.bias"))

    for i in range(cfg["n_layer"]):
        p = f"encoder.layers.{i}"
        qkv = lin(x, f"{p}.attn.Wqkv").reshape(b, s, 3, heads, d)  # "(three h d)"
        q, k, v = rotary(qkv[:, :, 0]), rotary(qkv[:, :, 1]), qkv[:, :, 2]
        q, k, v = (z.permute(0, 2, 1, 3) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / torch.sqrt(torch.tensor(float(d))) + ext
        att = (torch.softmax(scores, -1) @ v).permute(0, 2, 1, 3).reshape(b, s, h)
        x = F.layer_norm(lin(att, f"{p}.attn.out_proj") + x, (h,), t[f"{p}.norm1.weight"],
                         t[f"{p}.norm1.bias"], eps)  # fmt: skip
        y = lin(x, f"{p}.mlp.fc11") * act(lin(x, f"{p}.mlp.fc12"))
        x = F.layer_norm(lin(y, f"{p}.mlp.fc2") + x, (h,), t[f"{p}.norm2.weight"],
                         t[f"{p}.norm2.bias"], eps)  # fmt: skip
    return x.numpy()


def _nomic_dir(tmp: Path, cfg: dict, pooling: str = "mean") -> tuple[Path, dict]:
    """A sentence-transformers directory over a NomicBERT checkpoint (config.json with the
    published keys, model.safetensors), modules.json and 1_Pooling written by hand (the
    remote modeling code is not installed); returns it and the weights."""
    from safetensors.numpy import save_file

    d = tmp / "nomic"
    d.mkdir()
    cfg = {"vocab_size": _vocab_size(), **cfg}
    (d / "config.json").write_text(json.dumps(cfg))
    w = _nomic_weights(cfg)
    save_file(w, str(d / "model.safetensors"))
    sc.tokenizer("bert", d, token_types=True)
    mods = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]  # fmt: skip
    (d / "modules.json").write_text(json.dumps(mods))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": cfg["n_embd"], "pooling_mode": pooling})
    )
    (d / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "search_query: ", "document": "search_document: "}})
    )
    return d, w


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_nomic_matches_pytorch_reference(tmp_path, activation) -> None:
    cfg = {**NOMIC_CONFIG, "activation_function": activation}
    if activation == "geglu":
        cfg |= {"qkv_proj_bias": True, "mlp_fc1_bias": True, "mlp_fc2_bias": True}
    d, w = _nomic_dir(tmp_path, cfg)
    enc = SentenceEncoder(d, num_threads=1)
    c = enc.model.config
    assert c.family is Family.NOMIC and c.intermediate_size == 256 and c.vocab_size % 8 == 0
    assert c.spec.rope_dims == 4
    feed = enc.model.inputs(TEXTS)
    hidden = _nomic_reference(cfg, w, feed["input_ids"], feed["attention_mask"])
    m = feed["attention_mask"][..., None].astype(np.float32)
    want = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)  # sentence-transformers' mean
    got = enc.encode(TEXTS, batch_size=4)
    assert np.abs(got - want).max() <= ATOL
    _alone_equals_batched(enc, TEXTS)


# ---- errors -------------------------------------------------------------------------


def test_unsupported_family_configs_name_the_field(tmp_path) -> None:
    d, _ = _nomic_dir(tmp_path, {**NOMIC_CONFIG, "prenorm": True})
    with pytest.raises(ModelError, match=r"prenorm=True is not supported; supported: False"):
        SentenceEncoder(d)
    cfg = {**json.loads((d / "config.json").read_text()), "prenorm": False}
    (d / "config.json").write_text(json.dumps({**cfg, "rotary_emb_fraction": 0.0}))
    with pytest.raises(ModelError, match=r"rotary_emb_fraction=0.0 gives 0 .*learned position"):
        SentenceEncoder(d)
    hf = _modernbert(tmp_path, layers=1)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["rope_parameters"]["full_attention"] = {"rope_type": "yarn", "factor": 2.0}
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=r"rope_type='yarn' is not supported; supported: 'def"):
        load(hf)
    cfg["architectures"] = ["GPTNeoXModel"]
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=r"GPTNeoXModel.*supported: .*ModernBertModel, Nomic"):
        load(hf)


# ---- rlx embed ----------------------------------------------------------------------


def test_rlx_embed_each_family(tmp_path) -> None:
    """``rlx embed DIR`` (with ``--prompt-name``) writes what SentenceEncoder gives, for a
    ModernBERT, a Qwen3 and a NomicBERT directory."""
    from tests.cli.conftest import run

    dirs = {
        "modernbert": _save_st(_modernbert(tmp_path, layers=2), tmp_path / "mb", "mean"),
        "qwen3": _save_st(
            _qwen(tmp_path, "qwen3"), tmp_path / "q3", "lasttoken", True, {"query": "the cat "}
        ),  # fmt: skip
        "nomic": _nomic_dir(tmp_path, NOMIC_CONFIG)[0],
    }
    for fam, d in dirs.items():
        out = tmp_path / f"{fam}.npy"
        args = ["embed", str(d), *TEXTS[:3], "-o", str(out), "--threads", "1"]
        if fam != "modernbert":
            args += ["--prompt-name", "query"]
        r = run(args)
        assert r.code == 0, (fam, r.err)
        kw = {} if fam == "modernbert" else {"prompt_name": "query"}
        want = SentenceEncoder(d, num_threads=1).encode(TEXTS[:3], **kw)
        assert np.array_equal(np.load(out), want), fam
