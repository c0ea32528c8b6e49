"""Tiny random ``llama`` / ``qwen2`` / ``qwen3`` GGUF files (written with
``gguf.GGUFWriter``) and the same models in transformers (``LlamaForCausalLM``,
``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``): the oracles of rlx.models.llm's non-Gemma
architectures.

A llama GGUF holds q / k permuted as llama.cpp's converter writes them (``permute`` below,
from convert_hf_to_gguf.py), so rlx must apply its adjacent-pair rope to match
transformers' rotate-half rope on the original weights; Qwen files are not permuted
(rotate-half in both). Qwen2 adds q / k / v biases, Qwen3 per-head q / k RMS norms. Some
weights are Q8_0 (transformers gets their decoded values), the rest F32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

CFG = dict(vocab=96, d=64, ff=96, layers=2, heads=4, kv_heads=2, eps=1e-5, base=10000.0, ctx=128)
Q8_NAMES = ("attn_q", "ffn_down", "output")


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q / k row order: each head's two rotate-half halves interleaved."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_weights(
    seed: int = 0, arch: str = "llama", vocab: int | None = None
) -> dict[str, np.ndarray]:
    """Random weights of ``arch`` by transformers' names ([out, in]); ``vocab`` tokens
    (default ``CFG["vocab"]``)."""
    c = dict(CFG, vocab=vocab or CFG["vocab"])
    rng = np.random.default_rng(seed)
    hd = c["d"] // c["heads"]

    def w(*shape: int, s: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    out = {"model.embed_tokens.weight": w(c["vocab"], c["d"], s=1.0)}
    for i in range(c["layers"]):
        p = f"model.layers.{i}"
        out[f"{p}.self_attn.q_proj.weight"] = w(c["heads"] * hd, c["d"])
        out[f"{p}.self_attn.k_proj.weight"] = w(c["kv_heads"] * hd, c["d"])
        out[f"{p}.self_attn.v_proj.weight"] = w(c["kv_heads"] * hd, c["d"])
        out[f"{p}.self_attn.o_proj.weight"] = w(c["d"], c["heads"] * hd)
        out[f"{p}.mlp.gate_proj.weight"] = w(c["ff"], c["d"])
        out[f"{p}.mlp.up_proj.weight"] = w(c["ff"], c["d"])
        out[f"{p}.mlp.down_proj.weight"] = w(c["d"], c["ff"])
        if arch == "qwen2":
            out[f"{p}.self_attn.q_proj.bias"] = w(c["heads"] * hd)
            out[f"{p}.self_attn.k_proj.bias"] = w(c["kv_heads"] * hd)
            out[f"{p}.self_attn.v_proj.bias"] = w(c["kv_heads"] * hd)
        if arch == "qwen3":
            out[f"{p}.self_attn.q_norm.weight"] = 1.0 + w(hd, s=0.1)
            out[f"{p}.self_attn.k_norm.weight"] = 1.0 + w(hd, s=0.1)
        out[f"{p}.input_layernorm.weight"] = 1.0 + w(c["d"], s=0.1)
        out[f"{p}.post_attention_layernorm.weight"] = 1.0 + w(c["d"], s=0.1)
    out["model.norm.weight"] = 1.0 + w(c["d"], s=0.1)
    out["lm_head.weight"] = w(c["vocab"], c["d"])
    return out


def write_gguf(path: Path, weights: dict[str, np.ndarray], arch: str = "llama",
               skip: str | None = None, meta: dict[str, Any] | None = None,
               ) -> dict[str, np.ndarray]:  # fmt: skip
    """Write ``weights`` as a llama GGUF at ``path``; returns the weights transformers
    must use (Q8_0 ones replaced by their decoded values). ``meta``: metadata keys to
    write instead of / besides the sizes (``{arch}`` in a key is the architecture; a bool
    is a bool, an int u32 (i32 when negative), a float f32, a str a string, a list an
    array; None leaves the key out)."""
    import gguf

    c = CFG
    wr = gguf.GGUFWriter(str(path), arch)
    kv: dict[str, Any] = {
        "{arch}.block_count": c["layers"],
        "{arch}.context_length": c["ctx"],
        "{arch}.embedding_length": c["d"],
        "{arch}.feed_forward_length": c["ff"],
        "{arch}.attention.head_count": c["heads"],
        "{arch}.attention.head_count_kv": c["kv_heads"],
        "{arch}.attention.layer_norm_rms_epsilon": float(c["eps"]),
        "{arch}.rope.freq_base": float(c["base"]),
    }
    kv.update(meta or {})
    for key, val in kv.items():
        key = key.replace("{arch}", arch)
        if val is None:
            continue
        if isinstance(val, bool):
            wr.add_bool(key, val)
        elif isinstance(val, int):
            (wr.add_uint32 if val >= 0 else wr.add_int32)(key, val)
        elif isinstance(val, float):
            wr.add_float32(key, val)
        elif isinstance(val, str):
            wr.add_string(key, val)
        else:
            wr.add_array(key, list(val))
    names = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm", "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
    }  # fmt: skip
    used = {}
    for hf, arr in weights.items():
        if hf == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif hf == "model.norm.weight":
            name = "output_norm.weight"
        elif hf == "lm_head.weight":
            name = "output.weight"
        else:
            parts = hf.split(".")
            name = f"blk.{parts[2]}.{names['.'.join(parts[3:-1])]}.{parts[-1]}"
        data = arr
        if arch == "llama" and name.endswith("attn_q.weight"):
            data = permute(arr, c["heads"])
        elif arch == "llama" and name.endswith("attn_k.weight"):
            data = permute(arr, c["kv_heads"])
        base = name.split(".")[-2]
        if name == skip:
            continue
        if base in Q8_NAMES and name.endswith(".weight"):
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            wr.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            dec = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
            if base == "attn_q" and arch == "llama":  # back to transformers' order
                dec = permute_back(dec, c["heads"])
            used[hf] = dec.astype(np.float32)
        else:
            wr.add_tensor(name, np.ascontiguousarray(data))
            used[hf] = arr
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return used


def permute_back(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of :func:`permute`."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_model(weights: dict[str, np.ndarray], arch: str = "llama"):  # noqa: ANN201
    import torch
    import transformers as tr

    c = dict(CFG, vocab=weights["model.embed_tokens.weight"].shape[0])
    config, model = {
        "llama": (tr.LlamaConfig, tr.LlamaForCausalLM),
        "qwen2": (tr.Qwen2Config, tr.Qwen2ForCausalLM),
        "qwen3": (tr.Qwen3Config, tr.Qwen3ForCausalLM),
    }[arch]
    cfg = config(
        vocab_size=c["vocab"], hidden_size=c["d"], intermediate_size=c["ff"],
        num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"], rms_norm_eps=c["eps"],
        rope_parameters={"rope_type": "default", "rope_theta": c["base"]},
        max_position_embeddings=c["ctx"], tie_word_embeddings=False,
        attn_implementation="eager",
    )  # fmt: skip
    if arch == "qwen3":
        cfg.head_dim = c["d"] // c["heads"]
    m = model(cfg).eval()
    m.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()})
    return m


def bpe_meta() -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` keys of a byte-level BPE (Llama 3's split, ~700 tokens)
    trained by tests/frontends/gguf/test_bpe.py (needs ``tokenizers`` and ``regex``); no
    add_bos / add_eos flag (the file's default for "gpt2": no BOS, no EOS)."""
    import json

    from tests.frontends.gguf.test_bpe import SPECIALS, trained

    tk = trained("llama-bpe")
    vocab = tk.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(tk.to_str())["model"]["merges"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3 if t in SPECIALS else 1 for t in tokens],
        "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m) for m in merges],
        "tokenizer.ggml.bos_token_id": vocab["<|begin_of_text|>"],
        "tokenizer.ggml.eos_token_id": vocab["<|end_of_text|>"],
    }
