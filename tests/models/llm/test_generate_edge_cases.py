"""Edge cases of ``LlmModel.generate`` / ``logits`` on a tiny random llama GGUF with a
byte-level BPE tokenizer (tests/models/llm/tiny_llama.py): a str ``stop`` is one stop
string; ``stop_ids``, ``seed`` and token ids are checked when ``generate`` is called (also
with ``stream=True``), never coerced; one model used from two threads, or by interleaved
and abandoned streams, gives the results of the calls one after the other; config values
that divide or take a power are refused at load naming the key; NaN / inf logits raise
naming the step; a lone surrogate in the text is an InputError naming its position."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("regex")

import rlx.models.llm as llm  # noqa: E402
from rlx.errors import InputError, ModelError  # noqa: E402
from tests.models.llm.tiny_llama import bpe_meta, hf_weights, write_gguf  # noqa: E402

PROMPT_A = "The capital of France is"
PROMPT_B = "def f(x):\n    return"
NO_EOS = dict(stop_at_eos=False)


@pytest.fixture(scope="module")
def meta() -> dict:
    return bpe_meta()


@pytest.fixture(scope="module")
def weights(meta) -> dict[str, np.ndarray]:
    return hf_weights(seed=5, vocab=len(meta["tokenizer.ggml.tokens"]))


@pytest.fixture(scope="module")
def path(tmp_path_factory, meta, weights):
    p = tmp_path_factory.mktemp("edge") / "tiny.gguf"
    write_gguf(p, weights, meta=meta)
    return p


@pytest.fixture(scope="module")
def model(path):
    return llm.load(path, max_context=96, num_threads=1)


# ---- 2. stop strings and stop ids ----------------------------------------------------------


def test_a_str_stop_is_one_stop_string(model) -> None:
    full = model.generate(PROMPT_A, max_tokens=24, **NO_EOS).text
    # a 3-character stop string one of whose characters occurs before it
    k = next(k for k in range(len(full) - 3, 0, -1) if set(full[k : k + 3]) & set(full[:k]))
    stop = full[k : k + 3]
    want = full[: full.find(stop)]
    r = model.generate(PROMPT_A, max_tokens=24, stop=stop, **NO_EOS)
    assert (r.text, r.finish_reason) == (want, "stop_string")
    assert model.generate(PROMPT_A, max_tokens=24, stop=[stop], **NO_EOS).text == want
    assert (
        "".join(model.generate(PROMPT_A, max_tokens=24, stop=stop, stream=True, **NO_EOS)) == want
    )
    assert model.generate(PROMPT_A, max_tokens=24, stop=None, **NO_EOS).text == full


@pytest.mark.parametrize(
    ("stop", "match"),
    [
        (5, r"stop must be a str or a list of str, given int"),
        ([b"x"], r"stop\[0\] is b'x' \(bytes\), expected a str"),
        (["ok", 7], r"stop\[1\] is 7 \(int\), expected a str"),
    ],
)
def test_bad_stop_is_refused_at_the_call(model, stop, match) -> None:
    for stream in (False, True):
        with pytest.raises(InputError, match=match):
            model.generate(PROMPT_A, max_tokens=4, stop=stop, stream=stream)


@pytest.mark.parametrize(
    ("stop_ids", "match"),
    [
        (["x"], r"stop_ids: token id \[0\] is 'x' \(str\), expected an int in \[0, \d+\)"),
        ([1.0], r"stop_ids: token id \[0\] is 1\.0 \(float\)"),
        ([True], r"stop_ids: token id \[0\] is True \(bool\)"),
        (-1, r"stop_ids: token id \[0\] = -1 is outside the vocabulary \[0, \d+\)"),
        ([3, 10**12], r"stop_ids: token id \[1\] = 1000000000000 is outside the vocabulary"),
        ("5", r"stop_ids: token ids must be a sequence of ints, given str"),
    ],
)
def test_bad_stop_ids_are_refused_at_the_call(model, stop_ids, match) -> None:
    for stream in (False, True):
        with pytest.raises(InputError, match=match):
            model.generate(PROMPT_A, max_tokens=4, stop_ids=stop_ids, stream=stream)


def test_one_stop_id_as_an_int(model) -> None:
    full = model.generate(PROMPT_A, max_tokens=12, **NO_EOS)
    tok = full.token_ids[3]
    first = full.token_ids.index(tok)
    for stop_ids in (tok, [tok], np.int64(tok)):
        r = model.generate(PROMPT_A, max_tokens=12, stop_ids=stop_ids, **NO_EOS)
        assert r.finish_reason == "stop_token" and r.token_ids == full.token_ids[:first]


# ---- 5. seed, sampling values and token ids --------------------------------------------------


@pytest.mark.parametrize("seed", [-1, "abc", 1.5, True])
def test_bad_seed_is_refused_at_the_call(model, seed) -> None:
    for stream in (False, True):
        with pytest.raises(InputError, match=r"seed must be None \(a fresh seed\) or an int >= 0"):
            model.generate(PROMPT_A, max_tokens=4, temperature=0.8, seed=seed, stream=stream)


def test_seed_numpy_int_and_big_int_are_fine(model) -> None:
    kw = dict(max_tokens=6, temperature=0.9, **NO_EOS)
    a = model.generate(PROMPT_A, seed=7, **kw)
    assert model.generate(PROMPT_A, seed=np.int64(7), **kw).token_ids == a.token_ids
    model.generate(PROMPT_A, seed=2**70, **kw)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(temperature="abc"), r"temperature must be a number, given 'abc' \(str\)"),
        (dict(top_p="0.5"), r"top_p must be a number, given '0.5' \(str\)"),
        (dict(on_text=5), r"on_text must be a callable or None, given 5"),
        (dict(add_bos="yes"), r"add_bos must be None \(as the file says\) or a bool"),
    ],
)
def test_bad_sampling_values_are_input_errors(model, kw, match) -> None:
    with pytest.raises(InputError, match=match):
        model.generate(PROMPT_A, max_tokens=4, stream=True, **kw)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([1, 3.7], r"token id \[1\] is 3\.7 \(float\), expected an int in \[0, \d+\)"),
        (["5"], r"token id \[0\] is '5' \(str\), expected an int"),
        ([2**63], r"token id \[0\] = 9223372036854775808 is outside the vocabulary \[0, \d+\)"),
        ([4, -2], r"token id \[1\] = -2 is outside the vocabulary"),
        ([True, 4], r"token id \[0\] is True \(bool\)"),
        (np.array([1.0, 2.0]), r"token ids must be integers, given an array of float64"),
        (np.array([2**64 - 1], np.uint64), r"token id \[0\] = 18446744073709551615 is outside"),
        (5, r"token ids must be a sequence of ints, given int"),
    ],
)
def test_bad_token_ids_are_refused_never_coerced(model, ids, match) -> None:
    with pytest.raises(InputError, match=match):
        model.logits(ids)
    with pytest.raises(InputError, match=match):
        model.prefill(ids)
    for stream in (False, True):
        with pytest.raises(InputError, match=match):
            model.generate(ids, max_tokens=3, stream=stream)


def test_step_refuses_a_non_int_token_and_keeps_the_context(model) -> None:
    model.prefill([5, 6, 7])
    for bad in ("5", 2.0, 2**63, -1):
        with pytest.raises(InputError, match=r"token id \[0\]"):
            model.step(bad)
    assert model.position == 3
    want = model.step(8)
    model.prefill([5, 6, 7])
    np.testing.assert_array_equal(model.step(np.int64(8)), want)


def test_integer_arrays_are_token_ids(model) -> None:
    want = model.logits([5, 6, 7])
    np.testing.assert_array_equal(model.logits(np.array([5, 6, 7], np.int32)), want)
    r = model.generate(np.array([5, 6, 7]), max_tokens=3, **NO_EOS)
    assert r.prompt_ids == [5, 6, 7]


# ---- 3. per-call state: threads, interleaved and abandoned streams ---------------------------


def _sequential(model, runs: dict[str, dict]) -> dict[str, tuple[list[int], str]]:
    out = {}
    for name, kw in runs.items():
        r = model.generate(max_tokens=20, **NO_EOS, **kw)
        out[name] = (r.token_ids, r.text)
    return out


RUNS = {
    "a": dict(prompt=PROMPT_A),
    "b": dict(prompt=PROMPT_B),
    "c": dict(prompt=PROMPT_B, temperature=0.9, top_k=20, seed=11),
}


def test_two_threads_give_the_sequential_results(path) -> None:
    m = llm.load(path, max_context=96, num_threads=1)
    want = _sequential(m, RUNS)
    got: dict[str, list] = {name: [] for name in RUNS}
    errors: list[BaseException] = []
    order: list[str] = []

    def piece(name: str) -> None:  # called between two steps: lets the other thread in
        order.append(name)
        time.sleep(0.001)

    def worker(names: list[str]) -> None:
        try:
            for name in names:
                r = m.generate(max_tokens=20, on_text=lambda _, n=name: piece(n),
                               **NO_EOS, **RUNS[name])  # fmt: skip
                got[name].append((r.token_ids, r.text))
                assert r.stats.prompt_tokens == len(r.prompt_ids)
                assert r.stats.generated_tokens == 20
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [
        threading.Thread(target=worker, args=(["a", "c", "a"],)),
        threading.Thread(target=worker, args=(["b", "b", "c"],)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for name, results in got.items():
        assert results and all(res == want[name] for res in results), name
    # the two threads did run their steps interleaved
    switches = sum(1 for x, y in zip(order, order[1:], strict=False) if x != y)
    assert switches > 4


@pytest.mark.parametrize("kv_dtype", ["f32", "bf16"])
def test_interleaved_and_abandoned_streams_are_independent(path, kv_dtype) -> None:
    model = llm.load(path, max_context=96, num_threads=1, kv_dtype=kv_dtype)
    want = _sequential(model, RUNS)
    s1 = model.generate(max_tokens=20, stream=True, **NO_EOS, **RUNS["a"])
    s2 = model.generate(max_tokens=20, stream=True, **NO_EOS, **RUNS["c"])
    i1, i2 = iter(s1), iter(s2)
    p1, p2 = [next(i1)], [next(i2)]
    # a whole generate() between the streams' steps, then they go on, one step each in turn
    assert _sequential(model, {"b": RUNS["b"]})["b"] == want["b"]
    done1 = done2 = False
    while not (done1 and done2):
        if not done1:
            try:
                p1.append(next(i1))
            except StopIteration:
                done1 = True
        if not done2:
            try:
                p2.append(next(i2))
            except StopIteration:
                done2 = True
    assert (s1.result.token_ids, "".join(p1)) == want["a"]
    assert (s2.result.token_ids, "".join(p2)) == want["c"]
    # a stream abandoned half-read is dropped: the next calls are unaffected
    s3 = model.generate(max_tokens=20, stream=True, **NO_EOS, **RUNS["b"])
    next(iter(s3))
    del s3
    assert _sequential(model, RUNS) == want


def test_generate_leaves_the_default_state_alone(model) -> None:
    ids = [5, 6, 7, 8]
    model.prefill(ids)
    want = [model.step(9), model.step(10)]
    model.prefill(ids)
    model.generate(PROMPT_B, max_tokens=10, **NO_EOS)
    model.logits([1, 2, 3])
    assert model.position == 4
    np.testing.assert_array_equal(model.step(9), want[0])  # its cache rows were put back
    model.generate(PROMPT_A, max_tokens=3, stream=True, **NO_EOS)  # never started: no step
    np.testing.assert_array_equal(model.step(10), want[1])
    assert model.position == 6


# ---- 4. config values and non-finite logits ----------------------------------------------------


@pytest.mark.parametrize(
    ("kv", "match"),
    [
        ({"{arch}.rope.freq_base": 0.0}, r"'llama\.rope\.freq_base' must be a finite number > 0 "
         r"\(rope frequencies are base\^\(-2i/dims\)\), got 0\.0"),
        ({"{arch}.rope.freq_base": float("nan")}, r"'llama\.rope\.freq_base' must be a finite"),
        ({"{arch}.rope.freq_base": -10000.0}, r"'llama\.rope\.freq_base' .* got -10000\.0"),
        ({"{arch}.attention.key_length": 0}, r"'llama\.attention\.key_length' must be an "
         r"integer > 0 \(the head size; attention scales by 1/sqrt of it\), got 0"),
        ({"{arch}.attention.head_count": 0}, r"'llama\.attention\.head_count' must be an "
         r"integer > 0 \(the number of query heads\), got 0"),
        ({"{arch}.attention.head_count_kv": 0}, r"'llama\.attention\.head_count_kv' must be"),
        ({"{arch}.attention.head_count_kv": 3}, r"head_count_kv = 3 must divide "
         r"llama\.attention\.head_count = 4"),
        ({"{arch}.embedding_length": 0}, r"'llama\.embedding_length' must be an integer > 0"),
        ({"{arch}.block_count": 0}, r"'llama\.block_count' must be an integer > 0"),
        ({"{arch}.feed_forward_length": 0}, r"'llama\.feed_forward_length' must be"),
        ({"{arch}.attention.layer_norm_rms_epsilon": 0.0},
         r"'llama\.attention\.layer_norm_rms_epsilon' must be a finite number > 0"),
        ({"{arch}.context_length": 0}, r"'llama\.context_length' must be an integer > 0"),
        ({"{arch}.rope.dimension_count": 7}, r"rope\.dimension_count = 7 must be even"),
        ({"{arch}.rope.dimension_count": 32}, r"at most the head size 16"),
        ({"{arch}.attention.sliding_window": -1}, r"sliding_window must be >= 0"),
        ({"{arch}.rope.scaling.type": "linear", "{arch}.rope.scaling.factor": 0.0},
         r"'llama\.rope\.scaling\.factor' must be a finite number > 0"),
        ({"{arch}.final_logit_softcapping": -30.0},
         r"'llama\.final_logit_softcapping' must be a finite number > 0"),
    ],
)  # fmt: skip
def test_bad_config_values_are_named_at_load(tmp_path, weights, kv, match) -> None:
    write_gguf(tmp_path / "bad.gguf", weights, meta=kv)
    with pytest.raises(ModelError, match=match):
        llm.load(tmp_path / "bad.gguf", max_context=32, num_threads=1)


def test_nan_logits_raise_naming_the_step(tmp_path, model, weights, meta) -> None:
    prompt = [5, 6, 7]
    clean = model.generate(prompt, max_tokens=4, **NO_EOS).token_ids
    first = clean[0]
    assert first not in prompt
    # a NaN in the embedding row of the first generated token: step 1 feeds it
    bad = dict(weights)
    emb = bad["model.embed_tokens.weight"].copy()
    emb[first, 3] = np.nan
    bad["model.embed_tokens.weight"] = emb
    write_gguf(tmp_path / "nan.gguf", bad, meta=meta)
    m = llm.load(tmp_path / "nan.gguf", max_context=32, num_threads=1)
    match = (
        r"the logits at step 1 \(after generated token 1, at position 3\) are not finite: "
        r"\d+ NaN and 0 inf of \d+ values"
    )
    with pytest.raises(ModelError, match=match):
        m.generate(prompt, max_tokens=4, **NO_EOS)
    stream = m.generate(prompt, max_tokens=4, stream=True, **NO_EOS)
    with pytest.raises(ModelError, match=r"at step 1"):
        list(stream)
    with pytest.raises(ModelError, match=r"after the prompt of 2 tokens \(step 0, the prefill\)"):
        m.generate([5, first], max_tokens=4, **NO_EOS)


# ---- 6. lone surrogates ------------------------------------------------------------------------


def test_lone_surrogate_in_the_prompt_names_its_position(model, path, capsys) -> None:
    match = r"text 'abc\\udcff' holds a lone surrogate U\+DCFF at position 3: not valid Unicode"
    with pytest.raises(InputError, match=match):
        model.tokenizer.encode("abc\udcff")
    with pytest.raises(InputError, match=match):
        model.encode("abc\udcff")
    for stream in (False, True):
        with pytest.raises(InputError, match=match):
            model.generate("abc\udcff", max_tokens=3, stream=stream)
    long = "x" * 50 + "\ud800" + "y" * 50
    with pytest.raises(InputError, match=r"text 'xxx.*'\.\.\. \(near 'x{10}\\ud800y{9}'\) holds "
                       r"a lone surrogate U\+D800 at position 50"):  # fmt: skip
        model.encode(long)
    with pytest.raises(InputError, match=r"text must be a str, given bytes"):
        model.tokenizer.encode(b"abc")
    # the command line: an argument that is not UTF-8 arrives with surrogates
    from rlx.cli import main

    capsys.readouterr()
    assert main(["generate", str(path), "abc\udcff", "--max-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "rlx: error: text 'abc\\udcff' holds a lone surrogate U+DCFF at position 3" in err
