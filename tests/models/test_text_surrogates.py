"""A lone surrogate in a text (what Python makes of bytes that are not UTF-8 in a shell
argument or a file name, e.g. ``"abc\\udcff"``) is an InputError naming the text, its index
and the surrogate's position, from SentenceEncoder.encode / encode_batches and
HFModel.inputs, before the tokenizers library sees it (a raw TypeError there)."""

from __future__ import annotations

import pytest

import rlx.models.hf as hf
from rlx.errors import InputError
from rlx.models import SentenceEncoder
from rlx.models.hf.tokenizer import check_texts


@pytest.fixture(scope="module")
def encoder(tiny_dirs) -> SentenceEncoder:
    return SentenceEncoder(tiny_dirs["bert"])


def test_sentence_encoder_names_the_surrogate(encoder) -> None:
    match = r"texts\[1\] 'abc\\udcff' holds a lone surrogate U\+DCFF at position 3: not valid"
    with pytest.raises(InputError, match=match):
        encoder.encode(["fine", "abc\udcff"])
    with pytest.raises(InputError, match=match):
        next(encoder.encode_batches([["fine", "abc\udcff"]]))
    long = "a" * 60 + "\ud83d" + "b" * 60  # half of a surrogate pair: still lone
    with pytest.raises(InputError, match=r"texts\[0\] 'a{37}'\.\.\. \(near 'a{10}\\ud83d"
                       r"b{9}'\) holds a lone surrogate U\+D83D at position 60"):  # fmt: skip
        encoder.encode([long])
    assert encoder.encode(["fine", "abc\ufffd", "🙂"]).shape == (3, encoder.dim)


def test_hf_model_inputs_name_the_surrogate(tiny_dirs) -> None:
    m = hf.load(tiny_dirs["bert"])
    with pytest.raises(InputError, match=r"texts\[0\] .* U\+DC80 at position 0"):
        m.inputs(["\udc80x"])


def test_check_texts_keeps_valid_text() -> None:
    texts = ["plain", "é 日本 🙂", "", "\U0010ffff"]
    assert check_texts(texts) == texts
