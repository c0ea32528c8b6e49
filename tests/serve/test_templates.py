"""rlx.serve.templates against transformers' ``apply_chat_template``: the same template
string and messages give the same text (special tokens, add_generation_prompt,
trim_blocks / lstrip_blocks, tojson, namespace, loop controls), the same failures, and
the rendered text tokenised by rlx is what transformers feeds the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("jinja2")
pytest.importorskip("tokenizers")
pytest.importorskip("regex")
tr = pytest.importorskip("transformers")

import rlx.models.llm as llm  # noqa: E402
from rlx.serve.templates import ChatTemplate, TemplateError  # noqa: E402
from tests.serve.gen_helpers import CHATML, GEMMA3, LLAMA3, TOOLS, tiny_gguf  # noqa: E402

CHATS = [
    [{"role": "user", "content": "The capital of France is"}],
    [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "Hello <b>&amp;</b> café 日本語 🙂"},
        {"role": "assistant", "content": "Hi!\n\nHow can I help?"},
        {"role": "user", "content": "  two  spaces\tand a tab\n"},
    ],
    [
        {"role": "user", "content": "first", "name": None},
        {"role": "assistant", "content": "second"},
        {"role": "user", "content": "third"},
    ],
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, object, object]:
    """The tiny llama file with the Llama-3-style template, transformers' tokenizer of
    that file, and rlx's model of it."""
    d = tmp_path_factory.mktemp("tpl")
    path = tiny_gguf(d / "tiny.gguf", LLAMA3)
    tok = tr.AutoTokenizer.from_pretrained(d, gguf_file=path.name)
    return path, tok, llm.load(path, max_context=128, num_threads=1)


def _ours(path: Path, source: str | None = None) -> ChatTemplate:
    from rlx.frontends import gguf

    t = ChatTemplate.from_gguf(gguf.load(path).metadata, source)
    assert t is not None
    return t


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("name", ["llama3", "chatml", "gemma3", "tools"])
def test_render_equals_transformers(tiny, name, gen) -> None:
    path, tok, _ = tiny
    source = {"llama3": LLAMA3, "chatml": CHATML, "gemma3": GEMMA3, "tools": TOOLS}[name]
    ours = _ours(path, source)
    tok.chat_template = source
    for chat in CHATS:
        kw = {"date_string": "07 Dec 2026"} if name == "llama3" else {}
        want = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen, **kw)
        assert ours.render(chat, add_generation_prompt=gen, **kw) == want, (name, chat)


def test_the_template_and_special_tokens_come_from_the_file(tiny) -> None:
    path, tok, _ = tiny
    from rlx.frontends import gguf

    ours = ChatTemplate.from_gguf(gguf.load(path).metadata)
    assert ours is not None and ours.source == LLAMA3
    specials = dict(ours.special_tokens)
    assert specials["bos_token"] == tok.bos_token == "<|begin_of_text|>"
    assert specials["eos_token"] == tok.eos_token
    tok.chat_template = LLAMA3
    want = tok.apply_chat_template(CHATS[1], tokenize=False, add_generation_prompt=True,
                                   date_string="1 Jan 2026")  # fmt: skip
    assert ours.render(CHATS[1], date_string="1 Jan 2026") == want


def test_strftime_now_is_the_current_date(tiny) -> None:
    path, tok, _ = tiny
    source = "{{ strftime_now('%Y') }}|{{ messages[0].content }}"
    tok.chat_template = source
    want = tok.apply_chat_template(CHATS[0], tokenize=False)
    assert _ours(path, source).render(CHATS[0], add_generation_prompt=False) == want


def test_rendered_text_tokenises_as_transformers_feeds_the_model(tiny) -> None:
    path, tok, model = tiny
    ours = _ours(path)
    tok.chat_template = LLAMA3
    bos = tok.bos_token_id
    for chat in CHATS:
        text = ours.render(chat, date_string="07 Dec 2026")
        want = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True,
                                       date_string="07 Dec 2026")["input_ids"]  # fmt: skip
        got = model.encode(text)  # the file adds a BOS to text; the template renders one
        assert got == want and got.count(bos) == 1


@pytest.mark.parametrize(
    "source, chat, match",
    [
        (LLAMA3, [{"role": "tool", "content": "x"}], "Unknown role: tool"),
        (GEMMA3, [{"role": "assistant", "content": "x"}], "roles must alternate"),
        ("{{ messages.append(1) }}", CHATS[0], "sandbox"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", CHATS[0], "sandbox"),
        ("{% set ns = namespace(_x=1) %}", CHATS[0], "underscore"),
        ("{{ messages[0]['content'] + 1 }}", CHATS[0], "TypeError"),
        ("{% for m in messages %}", CHATS[0], "does not parse"),
    ],
)
def test_failures_raise_template_error_as_transformers_fails(tiny, source, chat, match) -> None:
    path, tok, _ = tiny
    tok.chat_template = source
    with pytest.raises(Exception):  # noqa: B017 (transformers' own exception types vary)
        tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    before = json.dumps(chat)
    with pytest.raises(TemplateError, match=match):
        _ours(path, source).render(chat)
    assert json.dumps(chat) == before  # the caller's messages are untouched


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "at least one message"),
        ("hello", "list of message objects"),
        (["hello"], r"messages\[0\] must be an object"),
        ([{"role": "user", "content": object()}], r"messages\[0\].content: expected JSON"),
    ],
)
def test_bad_messages_are_named(tiny, messages, match) -> None:
    with pytest.raises(TemplateError, match=match):
        _ours(tiny[0]).render(messages)


def test_tokenizer_config_sources(tmp_path) -> None:
    cfg = {"chat_template": CHATML, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    t = ChatTemplate.from_tokenizer_config(cfg)
    assert t is not None and dict(t.special_tokens) == {"bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert ChatTemplate.from_tokenizer_config(tmp_path) == t
    assert ChatTemplate.from_tokenizer_config(tmp_path / "tokenizer_config.json") == t
    (tmp_path / "chat_template.jinja").write_text(LLAMA3)  # the .jinja file wins
    assert ChatTemplate.from_tokenizer_config(tmp_path).source == LLAMA3  # type: ignore[union-attr]
    named = {"chat_template": [{"name": "tool_use", "template": TOOLS},
                               {"name": "default", "template": GEMMA3}]}  # fmt: skip
    assert ChatTemplate.from_tokenizer_config(named).source == GEMMA3  # type: ignore[union-attr]
    assert ChatTemplate.from_tokenizer_config({"bos_token": "<s>"}) is None


def test_a_file_without_a_template_has_none(tmp_path) -> None:
    from rlx.frontends import gguf

    path = tiny_gguf(tmp_path / "plain.gguf", template=None)
    assert ChatTemplate.from_gguf(gguf.load(path).metadata) is None


@pytest.mark.slow
def test_gemma3_template_and_tokens_equal_transformers() -> None:
    """Gemma-3-270M's own vocabulary: transformers' tokenizer of the GGUF file with
    Gemma 3's template renders and tokenises as rlx does (one <bos>)."""
    from rlx.frontends import gguf
    from tests.models.llm.conftest import gemma_path

    path = Path(gemma_path())
    tok = tr.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tok.chat_template = GEMMA3
    ours = ChatTemplate.from_gguf(gguf.load(path).metadata, GEMMA3)
    assert ours is not None
    model_tok = gguf.GgufTokenizer.from_file(path)
    for chat in CHATS:
        text = ours.render(chat)
        assert text == tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        want = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
        ids = model_tok.encode(text, add_bos=False, add_eos=False)
        assert ids == want["input_ids"] and ids.count(model_tok.bos_id) == 1


def test_from_path_reads_jinja_files_and_tokenizer_configs(tmp_path, tiny) -> None:
    from rlx.errors import ModelError
    from rlx.frontends import gguf

    md = gguf.load(tiny[0]).metadata
    (tmp_path / "t.jinja").write_text(CHATML)
    t = ChatTemplate.from_path(tmp_path / "t.jinja")
    assert t.source == CHATML and t.special_tokens == ()
    with_file = ChatTemplate.from_path(tmp_path / "t.jinja", md)
    assert with_file.source == CHATML
    assert dict(with_file.special_tokens)["bos_token"] == "<|begin_of_text|>"
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": GEMMA3, "bos_token": "<s>"}))
    assert ChatTemplate.from_path(cfg).special_tokens == (("bos_token", "<s>"),)
    assert ChatTemplate.from_path(tmp_path).source == GEMMA3
    with pytest.raises(ModelError, match="no such file"):
        ChatTemplate.from_path(tmp_path / "missing.json")
    with pytest.raises(ModelError, match="cannot read"):
        ChatTemplate.from_path(tmp_path / "missing.jinja")
    cfg.write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(ModelError, match="holds no chat template"):
        ChatTemplate.from_path(cfg)
