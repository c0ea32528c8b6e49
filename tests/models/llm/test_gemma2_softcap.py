"""Gemma 2's attention-logit soft-capping (``attn_logit_softcapping``: scaled scores ``s``
become ``c * tanh(s / c)`` before the mask) end to end: a tiny random Gemma2 checkpoint
written by transformers (eager attention, which applies the cap), loaded by
rlx.models.llm, against transformers' logits (prefill and decode) and greedy tokens with
an f32 and a bf16 KV cache, the batched decoder against single-stream decode, and bad
values of the key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

import rlx.models.llm as llm  # noqa: E402
from rlx.errors import ModelError  # noqa: E402
from tests.models.llm.test_hf_decoders import (  # noqa: E402
    PROMPT,
    SIZES,
    _check_logits,
    _reference,
    _rel,
    _tokenizer,
)

CAP = 5.0  # small enough that these random scores reach it (see test_the_cap_matters)
GEMMA2 = dict(
    head_dim=16,
    sliding_window=4,
    query_pre_attn_scalar=24,
    attn_logit_softcapping=CAP,
    final_logit_softcapping=30.0,
    attn_implementation="eager",  # transformers' sdpa path ignores the cap
)


def write_gemma2(folder: Path) -> object:
    """A tiny random Gemma2 saved to ``folder``; returns the transformers model (f32)."""
    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(**SIZES, **GEMMA2, initializer_range=0.2)
    model = transformers.Gemma2ForCausalLM(cfg).eval()
    with torch.no_grad():  # norm weights away from their init, a smaller tied embedding
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.3)
        model.get_input_embeddings().weight.mul_(0.1)
    model.save_pretrained(folder)
    _tokenizer(folder, bos=True)
    return model


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    folder = tmp_path_factory.mktemp("gemma2_softcap")
    return folder, write_gemma2(folder)


@contextmanager
def bf16_cache_attention() -> Iterator[None]:
    """transformers' Gemma2 eager attention with the roundings of rlx's bf16 KV cache
    (rlx/ops/kvcache.py): q, k and v rounded to bf16 (nearest even) before the scores,
    the attention output rounded to bf16 before o_proj; f32 arithmetic otherwise."""
    from transformers.models.gemma2 import modeling_gemma2 as mg

    plain = mg.eager_attention_forward

    def r(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(torch.float32)

    def rounded(module, query, key, value, mask, **kw):  # type: ignore[no-untyped-def]
        out, weights = plain(module, r(query), r(key), r(value), mask, **kw)
        return r(out), weights

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mg, "eager_attention_forward", rounded)
        yield


def _generate(model: object, prompt: list[int], n: int) -> list[int]:
    model.generation_config.eos_token_id = None  # type: ignore[attr-defined]
    with torch.no_grad():
        out = model.generate(  # type: ignore[attr-defined]
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def test_config_carries_the_cap(gemma2) -> None:
    folder, model = gemma2
    assert model.config._attn_implementation == "eager"
    assert json.loads((folder / "config.json").read_text())["attn_logit_softcapping"] == CAP
    m = llm.load(folder, max_context=64, num_threads=1)
    assert m.config.arch.name == "gemma2" and m.config.attn_softcap == CAP
    ops = [n.op for n in m.graph.nodes if n.op.mnemonic == "cache_attention"]
    assert ops and all(op.softcap == CAP for op in ops)


@pytest.mark.parametrize("kv_dtype", ["f32", "bf16"])
def test_logits_and_greedy_match_transformers(gemma2, kv_dtype: str) -> None:
    """Prefill of 6 prompt tokens then decode steps within 1e-5 relative of transformers
    (with a bf16 cache: of transformers rounding q / k / v / the attention output to bf16
    as the cache does; one position may differ by a bf16 rounding flip), and 32 greedy
    tokens identical."""
    folder, model = gemma2
    m = llm.load(folder, max_context=64, num_threads=1, kv_dtype=kv_dtype)
    prompt = PROMPT[:5]
    if kv_dtype == "bf16":
        with bf16_cache_attention():
            ref = _reference(model, PROMPT)
            want = _generate(model, prompt, 32)
        # and the rounding matters: plain f32 transformers is further away
        assert _rel(m.logits(PROMPT[:6]), _reference(model, PROMPT)[5]) > 1e-4
        m = llm.load(folder, max_context=64, num_threads=1, kv_dtype=kv_dtype)
    else:
        ref, want = _reference(model, PROMPT), _generate(model, prompt, 32)
    if kv_dtype == "f32":
        _check_logits(m, ref, 1e-5)
    else:
        # every position within 1e-5 but at most one: a value rounded to bf16 whose f32
        # inputs differ in the last bit (another summation order in decode than in
        # transformers' full pass) can round to the neighbouring bf16 value, which moves
        # that position's logits by ~1e-4 (measured: position 8 of this prompt)
        got_logits = [m.prefill(PROMPT[:6])] + [m.step(t) for t in PROMPT[6:]]
        errs = sorted(_rel(g, ref[j]) for j, g in enumerate(got_logits, start=5))
        assert errs[-2] < 1e-5 and errs[-1] < 1e-3, errs
        m.reset()
    got = m.generate(prompt, max_tokens=32, stop_at_eos=False)
    assert got.token_ids == want
    assert len(set(want)) > 3  # a continuation, not one token repeated


def test_the_cap_matters(gemma2, tmp_path: Path) -> None:
    """The same weights with the cap removed from config.json: rlx's logits move away from
    transformers' (capped) by far more than the 1e-5 the capped model meets."""
    folder, model = gemma2
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text()) | {"attn_logit_softcapping": None}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = llm.load(tmp_path, max_context=64, num_threads=1)
    assert m.config.attn_softcap is None
    assert _rel(m.logits(PROMPT), _reference(model, PROMPT)[-1]) > 1e-2


def test_batched_decoder_matches_single_stream(gemma2) -> None:
    """slot_cache_attention with the cap: sequences joining and leaving the batched decoder
    give single-stream logits and greedy tokens."""
    from tests.models.llm.test_batched_decode import run_schedule

    folder, _ = gemma2
    m = llm.load(folder, max_context=48, num_threads=1)
    bd = m.batched(3)
    assert all(
        n.op.softcap == CAP
        for n in bd.compiled.graph.nodes
        if n.op.mnemonic == "slot_cache_attention"
    )
    prompts = [[1, 5, 9, 13, 20], [7], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
    run_schedule(m, bd, prompts, joins=[0, 1, 1], leaves=[6, 6, 4], steps=6)


@pytest.mark.parametrize("bad", [-1.0, "50", float("inf")])
def test_bad_cap_is_named(gemma2, tmp_path: Path, bad: object) -> None:
    folder, _ = gemma2
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text()) | {"attn_logit_softcapping": bad}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="'attn_logit_softcapping' must be a finite number > 0"):
        llm.load(tmp_path, max_context=64)


# ---- conversion both ways ------------------------------------------------------------


def _gemma2_for_gguf(folder: Path, **over: object) -> object:
    """A tiny Gemma2 with a SentencePiece-style tokenizer and weights on the f16 grid, in
    the form a gemma2 GGUF expresses (queries scaled by the head size) -> the model."""
    from tests.frontends.test_convert import _spm_tokenizer, on_grid

    folder.mkdir()
    vocab = _spm_tokenizer(folder)
    kw = dict(GEMMA2, query_pre_attn_scalar=16) | over
    cfg = transformers.Gemma2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=2, eos_token_id=1, initializer_range=0.2, **kw,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.3)
            else:
                p.copy_(torch.from_numpy(on_grid(p.numpy())))
        model.get_input_embeddings().weight.mul_(0.125)  # (a power of two: still on grid)
    model.save_pretrained(folder)
    return model


def test_convert_both_ways_keeps_the_cap(tmp_path: Path) -> None:
    """HF -> GGUF writes ``gemma2.attn_logit_softcapping`` (and rlx on the GGUF equals
    transformers); GGUF -> HF writes ``attn_logit_softcapping`` back, and transformers on
    that directory generates what rlx does."""
    from rlx.frontends.convert import gguf_to_hf, hf_to_gguf
    from tests.frontends.test_convert import read_gguf

    model = _gemma2_for_gguf(tmp_path / "hf")
    path = tmp_path / "g2.gguf"
    hf_to_gguf(tmp_path / "hf", path, "f16", progress=False)
    md, _ = read_gguf(path)
    assert md["general.architecture"] == "gemma2"
    assert md["gemma2.attn_logit_softcapping"] == CAP
    assert md["gemma2.final_logit_softcapping"] == 30.0
    on_gguf = llm.load(path, max_context=64, num_threads=1)
    assert on_gguf.config.attn_softcap == CAP
    assert [on_gguf.config.window(i) for i in range(2)] == [4, 0]
    ids = [2, 17, 40, 99, 120, 33, 7, 64]
    ref = _reference(model, ids)
    assert _rel(on_gguf.prefill(ids[:5]), ref[4]) < 1e-5
    for j in range(5, len(ids)):
        assert _rel(on_gguf.step(ids[j]), ref[j]) < 1e-5, j
    want = _generate(model, ids, 32)
    assert on_gguf.generate(ids, max_tokens=32, stop_at_eos=False).token_ids == want

    back = tmp_path / "back"
    gguf_to_hf(path, back, progress=False)
    cfg = json.loads((back / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma2ForCausalLM"]
    assert (cfg["attn_logit_softcapping"], cfg["final_logit_softcapping"]) == (CAP, 30.0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        back, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert _generate(hf, ids, 32) == want
    assert llm.load(back, max_context=64, num_threads=1).config.attn_softcap == CAP


def test_gemma2_without_a_cap_has_no_gguf_form(tmp_path: Path) -> None:
    """llama.cpp always soft-caps Gemma 2's attention (50 when the key is absent): a
    checkpoint without the cap cannot be written as a gemma2 GGUF."""
    from rlx.frontends.convert import hf_to_gguf

    _gemma2_for_gguf(tmp_path / "hf", attn_logit_softcapping=None)
    with pytest.raises(ModelError, match="attention-logit soft-capping"):
        hf_to_gguf(tmp_path / "hf", tmp_path / "g.gguf", progress=False)
    assert not (tmp_path / "g.gguf").exists()
