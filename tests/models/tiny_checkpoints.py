"""Tiny random-weight Hugging Face checkpoints for the architecture tests. In: a family name
("bert", "roberta", "distilbert") and a directory. Out: that directory holding config.json,
model.safetensors (seeded NumPy weights) and tokenizer.json (a word-level vocabulary built
with the ``tokenizers`` library), loadable by transformers and by rlx.

Only numpy, safetensors and tokenizers are needed, so CI builds the same files the
reference script (scripts/make_hf_references.py) fed to transformers. Every weight is a
value exactly representable in bf16 and in f16, so a checkpoint stored in either dtype
holds the same numbers as the f32 one (``dtype=`` of :func:`build`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["FAMILIES", "SENTENCES", "build", "write_weights", "weights", "config"]

FAMILIES = ("bert", "roberta", "distilbert")

#: The texts the references embed: mixed lengths, one longer than MAX_LEN tokens.
SENTENCES = (
    "the cat sat on the mat",
    "a dog runs",
    "hello",
    "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat "
    "and a bird sings in the tall green tree near the old red house by the river",
    "music is playing in the park",
)
MAX_LEN = 24  # tokenizer truncation (the long sentence above is cut)
HIDDEN, HEADS, LAYERS, FFN, MAX_POS = 32, 4, 2, 64, 40

_WORDS = sorted(set(" ".join(SENTENCES).split()) | {"unknownword"})
_SPECIAL = {
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
    "distilbert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
    "roberta": ["<s>", "<pad>", "</s>", "<unk>"],
}


def _vocab(family: str) -> dict[str, int]:
    toks = _SPECIAL[family] + _WORDS
    return {t: i for i, t in enumerate(toks)}


def config(family: str) -> dict:
    """config.json of the tiny ``family`` model."""
    vocab = len(_vocab(family)) + 3  # a few ids no text uses
    if family == "distilbert":
        return {
            "architectures": ["DistilBertModel"],
            "model_type": "distilbert",
            "activation": "gelu",
            "dim": HIDDEN,
            "n_heads": HEADS,
            "n_layers": LAYERS,
            "hidden_dim": FFN,
            "max_position_embeddings": MAX_POS,
            "vocab_size": vocab,
            "pad_token_id": 0,
            "sinusoidal_pos_embds": False,
            "dropout": 0.0,
            "attention_dropout": 0.0,
        }
    base = {
        "hidden_act": "gelu",
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "intermediate_size": FFN,
        "layer_norm_eps": 1e-12 if family == "bert" else 1e-5,
        "vocab_size": vocab,
        "position_embedding_type": "absolute",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    if family == "bert":
        return {
            **base,
            "architectures": ["BertModel"],
            "model_type": "bert",
            "max_position_embeddings": MAX_POS,
            "type_vocab_size": 2,
            "pad_token_id": 0,
        }
    return {
        **base,
        "architectures": ["RobertaModel"],
        "model_type": "roberta",
        "max_position_embeddings": MAX_POS + 2,  # positions start at pad_token_id + 1
        "type_vocab_size": 1,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
    }


def _exact(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bf16 (and thus exact in f16 too: tiny magnitudes become 0)."""
    import ml_dtypes

    a = a.astype(ml_dtypes.bfloat16).astype(np.float32)
    a[np.abs(a) < 1e-4] = 0.0
    return a


def weights(family: str, seed: int = 0) -> dict[str, np.ndarray]:
    """The checkpoint tensors (PyTorch layout: linear weights [out, in]), seeded."""
    cfg = config(family)
    rng = np.random.default_rng(seed + FAMILIES.index(family))
    h, f = HIDDEN, FFN
    out: dict[str, np.ndarray] = {}

    def rand(*shape: int, scale: float = 0.0) -> np.ndarray:
        s = scale or 1.0 / np.sqrt(shape[-1])
        return _exact(rng.standard_normal(shape) * s)

    def lin(name: str, n_in: int, n_out: int) -> None:
        out[f"{name}.weight"] = rand(n_out, n_in)
        out[f"{name}.bias"] = rand(n_out, scale=0.1)

    def ln(name: str) -> None:
        out[f"{name}.weight"] = _exact(1.0 + 0.1 * rng.standard_normal(h))
        out[f"{name}.bias"] = rand(h, scale=0.1)

    out["embeddings.word_embeddings.weight"] = rand(cfg["vocab_size"], h, scale=1.0)
    out["embeddings.position_embeddings.weight"] = rand(
        cfg["max_position_embeddings"], h, scale=0.5
    )
    if family != "distilbert":
        out["embeddings.token_type_embeddings.weight"] = rand(cfg["type_vocab_size"], h, scale=0.5)
    ln("embeddings.LayerNorm")
    for i in range(LAYERS):
        if family == "distilbert":
            p = f"transformer.layer.{i}"
            for n in ("q_lin", "k_lin", "v_lin", "out_lin"):
                lin(f"{p}.attention.{n}", h, h)
            ln(f"{p}.sa_layer_norm")
            lin(f"{p}.ffn.lin1", h, f)
            lin(f"{p}.ffn.lin2", f, h)
            ln(f"{p}.output_layer_norm")
        else:
            p = f"encoder.layer.{i}"
            for n in ("query", "key", "value"):
                lin(f"{p}.attention.self.{n}", h, h)
            lin(f"{p}.attention.output.dense", h, h)
            ln(f"{p}.attention.output.LayerNorm")
            lin(f"{p}.intermediate.dense", h, f)
            lin(f"{p}.output.dense", f, h)
            ln(f"{p}.output.LayerNorm")
    if family == "bert":
        lin("pooler.dense", h, h)  # present in real BERT checkpoints, unused by rlx
    return out


def _tokenizer(family: str, path: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = _vocab(family)
    bos, pad, eos, unk = (
        ("<s>", "<pad>", "</s>", "<unk>")
        if family == "roberta"
        else ("[CLS]", "[PAD]", "[SEP]", "[UNK]")
    )
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} $B:1 {eos}:1",
        special_tokens=[(bos, vocab[bos]), (eos, vocab[eos])],
    )
    tok.enable_truncation(MAX_LEN)
    tok.enable_padding(pad_id=vocab[pad], pad_token=pad)
    tok.save(str(path))


def write_weights(
    tensors: dict[str, np.ndarray], out_dir: Path, dtype: str = "f32", shards: int = 1
) -> None:
    """Save ``tensors`` as model.safetensors (or ``shards`` files plus the index) in
    ``dtype`` ("f32", "bf16" or "f16")."""
    import ml_dtypes
    from safetensors.numpy import save_file

    np_dt = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[dtype]
    conv = {k: np.ascontiguousarray(v.astype(np_dt)) for k, v in tensors.items()}
    if shards == 1:
        save_file(conv, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(conv)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: conv[k] for k in names[s::shards]}
        save_file(part, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    index = {
        "metadata": {"total_size": sum(v.nbytes for v in conv.values())},
        "weight_map": weight_map,
    }
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def build(family: str, out_dir: Path, dtype: str = "f32", shards: int = 1, seed: int = 0) -> Path:
    """Write the tiny ``family`` checkpoint into ``out_dir`` (created); returns it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config(family), indent=1))
    _tokenizer(family, out_dir / "tokenizer.json")
    write_weights(weights(family, seed), out_dir, dtype, shards)
    return out_dir
