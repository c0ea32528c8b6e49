"""Chat templates. In: a Jinja chat template (a GGUF file's ``tokenizer.chat_template``, or
a Hugging Face ``tokenizer_config.json`` / ``chat_template.jinja``) and a list of chat
messages. Out: the prompt text the model was trained on.

Rendering follows transformers' ``apply_chat_template(..., tokenize=False)``: the same
Jinja environment (an ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``, ``strftime_now``,
a ``tojson`` that does not escape HTML, a ``namespace`` that refuses underscore names),
the same variables (``messages``, ``add_generation_prompt``, ``tools`` / ``documents``
None, and the special tokens ``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``,
... as strings), keys whose value is None dropped from each message. A template that
fails (a Jinja syntax error, ``raise_exception``, a sandbox violation) raises
:class:`TemplateError` naming the problem; the caller's messages are never changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from rlx.errors import InputError, ModelError

__all__ = ["ChatTemplate", "TemplateError", "SPECIAL_TOKEN_NAMES"]

#: The template variables transformers fills from the tokenizer's named special tokens.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
#: GGUF metadata key of each special token's id (the ones llama.cpp's converter writes).
_GGUF_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "sep_token": "tokenizer.ggml.seperator_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
    "cls_token": "tokenizer.ggml.cls_token_id",
    "mask_token": "tokenizer.ggml.mask_token_id",
}


class TemplateError(InputError):
    """A chat template that does not render the given messages (or does not parse)."""


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> Any:
    """The Jinja environment transformers renders chat templates in (module docstring)."""
    import jinja2
    import jinja2.ext
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (Jinja's own trick)
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: object) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes on a "
                    f"namespace, given {name!r}"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


@lru_cache(maxsize=16)
def _compiled(source: str) -> Any:
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise TemplateError(
            f"the chat template does not parse: {e.message} (line {e.lineno})"
        ) from None


def _token_text(v: object) -> str | None:
    """A tokenizer_config.json special token: a str or an AddedToken dict."""
    if isinstance(v, str):
        return v
    if isinstance(v, Mapping) and isinstance(v.get("content"), str):
        return str(v["content"])
    return None


def _plain(value: Any, where: str) -> Any:
    """``value`` rebuilt from JSON types only (what a template may see); TemplateError
    naming ``where`` for anything else."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TemplateError(f"{where}: keys must be strings, given {k!r:.40}")
            out[k] = _plain(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TemplateError(
        f"{where}: expected JSON data (str, number, bool, list, object), given "
        f"{type(value).__name__}"
    )


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template (``source``) and the special tokens it may name
    (``special_tokens``: pairs such as ``("bos_token", "<bos>")``)."""

    source: str
    special_tokens: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise InputError(
                f"ChatTemplate.source must be a non-empty str, given {self.source!r:.40}"
            )
        for pair in self.special_tokens:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or pair[0] not in SPECIAL_TOKEN_NAMES
                or not isinstance(pair[1], str)
            ):
                raise InputError(
                    f"ChatTemplate.special_tokens must hold (name, text) pairs with a name "
                    f"in {SPECIAL_TOKEN_NAMES}, given {pair!r:.60}"
                )

    # ---- sources ---------------------------------------------------------------------

    @classmethod
    def from_gguf(
        cls, metadata: Mapping[str, Any], source: str | None = None
    ) -> ChatTemplate | None:
        """The template of a GGUF file's metadata (``tokenizer.chat_template``), or
        ``source`` when given (for a file without one), with the special tokens of the
        file's vocabulary; None when there is no template."""
        if source is None:
            source = metadata.get("tokenizer.chat_template")
        if source is None:
            return None
        if not isinstance(source, str):
            raise ModelError(
                f"tokenizer.chat_template must be a string, the file holds {type(source).__name__}"
            )
        tokens = metadata.get("tokenizer.ggml.tokens")
        specials: list[tuple[str, str]] = []
        if isinstance(tokens, list):
            for name, key in _GGUF_IDS.items():
                tid = metadata.get(key)
                if isinstance(tid, int) and 0 <= tid < len(tokens):
                    specials.append((name, str(tokens[tid])))
        return cls(source, tuple(specials))

    @classmethod
    def from_tokenizer_config(cls, config: Mapping[str, Any] | str | Path) -> ChatTemplate | None:
        """The template of a Hugging Face tokenizer: a ``tokenizer_config.json`` dict, the
        path of that file, or the directory holding it (a ``chat_template.jinja`` beside
        it wins, as in transformers); a list of named templates gives the one named
        ``default``. None when there is no template."""
        source: object = None
        if not isinstance(config, Mapping):
            p = Path(config)
            folder = p if p.is_dir() else p.parent
            file = p / "tokenizer_config.json" if p.is_dir() else p
            try:
                config = json.loads(file.read_text(encoding="utf-8")) if file.exists() else {}
            except (OSError, ValueError) as e:
                raise ModelError(f"{file}: not a readable tokenizer_config.json: {e}") from None
            if not isinstance(config, Mapping):
                raise ModelError(f"{file}: expected a JSON object, found {type(config).__name__}")
            jinja_file = folder / "chat_template.jinja"
            if jinja_file.exists():
                source = jinja_file.read_text(encoding="utf-8")
        if source is None:
            source = config.get("chat_template")
        if isinstance(source, list):
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
            source = named.get("default")
        if source is None:
            return None
        if not isinstance(source, str):
            raise ModelError(
                f"chat_template must be a string or a list of named templates, given "
                f"{type(source).__name__}"
            )
        specials = []
        for name in SPECIAL_TOKEN_NAMES:
            text = _token_text(config.get(name))
            if text is not None:
                specials.append((name, text))
        return cls(source, tuple(specials))

    @classmethod
    def from_path(cls, path: str | Path, metadata: Mapping[str, Any] | None = None) -> ChatTemplate:
        """The template in a file: a ``.jinja`` / ``.j2`` file holds the template text;
        anything else is read as a ``tokenizer_config.json`` (or the directory holding
        one). With a GGUF file's ``metadata`` the special tokens are that vocabulary's.
        ModelError when the file is missing or holds no template."""
        p = Path(path)
        if p.suffix in (".jinja", ".j2"):
            try:
                source: str | None = p.read_text(encoding="utf-8")
            except OSError as e:
                raise ModelError(f"chat template {str(p)!r}: cannot read it: {e}") from None
            base = cls(source) if source else None
        else:
            if not p.exists():
                raise ModelError(f"chat template {str(p)!r}: no such file or directory")
            base = cls.from_tokenizer_config(p)
        if base is None:
            raise ModelError(f"chat template {str(p)!r}: the file holds no chat template")
        if metadata is None:
            return base
        from_file = cls.from_gguf(metadata, base.source)
        assert from_file is not None
        return from_file if from_file.special_tokens else base

    # ---- rendering -------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **variables: Any,
    ) -> str:
        """The prompt text of ``messages`` (dicts with ``role`` and ``content``), with the
        assistant's header after it when ``add_generation_prompt``; ``variables`` are
        more template variables (they win over the special tokens, as in transformers).
        TemplateError when the template fails or the messages are not JSON data."""
        import jinja2

        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise TemplateError(
                f"messages must be a list of message objects, given {type(messages).__name__}"
            )
        if not messages:
            raise TemplateError("messages is empty: a chat needs at least one message")
        chat = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise TemplateError(
                    f"messages[{i}] must be an object with 'role' and 'content', given "
                    f"{type(m).__name__}"
                )
            chat.append(_plain({k: v for k, v in m.items() if v is not None}, f"messages[{i}]"))
        if not isinstance(add_generation_prompt, bool):
            raise TemplateError(
                f"add_generation_prompt must be a bool, given {add_generation_prompt!r:.40}"
            )
        data = {
            **dict(self.special_tokens),
            **_plain(dict(variables), "variables"),
            "messages": chat,
            "tools": None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        template = _compiled(self.source)
        try:
            return str(template.render(**data))
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(
                f"the chat template did something the sandbox forbids: {e}"
            ) from None
        except jinja2.exceptions.TemplateError as e:
            raise TemplateError(f"the chat template failed: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise TemplateError(
                f"the chat template failed on these messages: {type(e).__name__}: {e}"
            ) from None
