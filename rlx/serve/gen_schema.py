"""The bodies of ``/v1/completions`` and ``/v1/chat/completions``. In: a parsed JSON body.
Out: :class:`GenParams` (the sampling and output settings both endpoints share) and the
prompt (:func:`completion_prompt`: a string or token ids; :func:`chat_messages`: the
messages as a template renders them). Every field is checked: a wrong type, a value out
of range, or a feature rlx does not serve (``n`` > 1, penalties, ``logit_bias``, tools,
``echo``, ...) is a 400 naming the field, what it must be and what was given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlx.serve.errors import ApiError
from rlx.serve.schema import boolean, integer, number, type_name

__all__ = ["GenParams", "MAX_LOGPROBS", "MAX_STOPS", "chat_messages", "completion_prompt", "params"]

#: The most ``logprobs`` / ``top_logprobs`` alternatives a request may ask for.
MAX_LOGPROBS = 20
#: The most stop strings a request may give (OpenAI's limit).
MAX_STOPS = 4
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class GenParams:
    """``max_tokens`` (None: what the context leaves), ``temperature``, ``top_p``,
    ``seed``, ``stop`` strings, ``logprobs`` (None: none; k: the token's logprob and
    the k most likely), ``stream`` and ``include_usage`` (a last usage chunk)."""

    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    logprobs: int | None
    stream: bool
    include_usage: bool


def _bad(message: str, param: str, code: str = "invalid_value") -> ApiError:
    return ApiError.bad_request(message, param=param, code=code)


def _unsupported(body: dict[str, Any], name: str, allowed: tuple[Any, ...], why: str) -> None:
    """400 when ``name`` is given with a value other than ``allowed`` (or null)."""
    value = body.get(name)
    if value is None or any(value == a and type(value) is type(a) for a in allowed):
        return
    raise _bad(f"'{name}' is not supported: {why}; got {value!r:.60}", name, "unsupported")


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if not isinstance(value, list):
        raise _bad(
            f"'stop' must be a string or an array of strings, got {type_name(value)}",
            "stop",
            "invalid_type",
        )
    if len(value) > MAX_STOPS:
        raise _bad(f"'stop' may hold at most {MAX_STOPS} strings, got {len(value)}", "stop")
    for i, s in enumerate(value):
        if not isinstance(s, str):
            raise _bad(f"'stop[{i}]' must be a string, got {type_name(s)}", "stop", "invalid_type")
    return tuple(s for s in value if s)


def params(body: dict[str, Any], chat: bool, max_tokens_limit: int) -> GenParams:
    """The shared settings of a completions (``chat`` False) or chat body."""
    n = integer(body, "n", 1, low=1)
    if n != 1:
        raise _bad(
            f"'n' must be 1: rlx generates one choice per request (send {n} requests), got {n}",
            "n",
            "unsupported",
        )
    for name in ("frequency_penalty", "presence_penalty"):
        number(body, name, 0.0, low=-2.0, high=2.0)
        _unsupported(body, name, (0, 0.0), "rlx samples without penalties; leave it at 0")
    value = body.get("logit_bias")
    if value is not None and value != {}:
        raise _bad("'logit_bias' is not supported; leave it empty", "logit_bias", "unsupported")
    name = "max_tokens"
    if chat and body.get("max_completion_tokens") is not None:
        name = "max_completion_tokens"
    max_tokens = integer(body, name, 16 if not chat else None, low=1, high=max_tokens_limit,
                         limit="max_tokens_limit")  # fmt: skip
    temperature = number(body, "temperature", 1.0, low=0.0, high=2.0)
    top_p = number(body, "top_p", 1.0, low=0.0, high=1.0)
    if top_p <= 0.0:
        raise _bad(f"'top_p' must be > 0 and <= 1, got {top_p}", "top_p")
    seed = integer(body, "seed", None, low=0)
    stream = boolean(body, "stream", False)
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise _bad("'stream_options' is only allowed with 'stream': true", "stream_options")
        if not isinstance(options, dict):
            raise _bad(
                f"'stream_options' must be an object, got {type_name(options)}",
                "stream_options",
                "invalid_type",
            )
        include_usage = bool(boolean(options, "include_usage", False))
    if chat:
        logprobs: int | None = None
        want = boolean(body, "logprobs", False)
        top = integer(body, "top_logprobs", None, low=0, high=MAX_LOGPROBS)
        if top is not None and not want:
            raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        if want:
            logprobs = top or 0
    else:
        logprobs = integer(body, "logprobs", None, low=0, high=MAX_LOGPROBS)
        _unsupported(body, "echo", (False,), "the prompt is not echoed")
        _unsupported(body, "best_of", (1,), "one sequence is generated per request")
        _unsupported(body, "suffix", ("",), "rlx does not insert text")
    return GenParams(
        max_tokens, temperature, top_p, seed, _stop(body), logprobs, stream, include_usage
    )


def completion_prompt(body: dict[str, Any], vocab: int) -> str | list[int]:
    """``prompt``: a string or an array of token ids in ``[0, vocab)`` (an array holding
    one of them is that one; several prompts are refused)."""
    value = body.get("prompt")
    if value is None:
        raise _bad("'prompt' is required", "prompt", "missing_field")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    elif isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
        raise _bad(
            f"'prompt' holds {len(value)} prompts; rlx takes one per request",
            "prompt",
            "unsupported",
        )
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise _bad(
            f"'prompt' must be a string or a non-empty array of token ids, got {type_name(value)}",
            "prompt",
            "invalid_type",
        )
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise _bad(
                f"'prompt[{i}]' must be a token id in [0, {vocab}), got {t!r:.40}",
                "prompt",
                "invalid_value",
            )
    return list(value)


def _content(value: Any, where: str) -> str | list[dict[str, str]]:
    """A message's ``content``: a string or an array of text parts."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _bad(
            f"'{where}' must be a string or an array of text parts, got {type_name(value)}",
            "messages",
            "invalid_type",
        )
    parts = []
    for j, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type_name(part)
            raise _bad(
                f'\'{where}[{j}]\' must be a text part {{"type": "text", "text": ...}}; '
                f"got {kind!r:.40} (rlx serves text models only)",
                "messages",
                "unsupported",
            )
        if not isinstance(part.get("text"), str):
            raise _bad(
                f"'{where}[{j}].text' must be a string, got {type_name(part.get('text'))}",
                "messages",
                "invalid_type",
            )
        parts.append({"type": "text", "text": part["text"]})
    return parts


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``messages``: a non-empty array of ``{"role", "content"}`` objects (``name`` kept);
    tool calls are refused."""
    value = body.get("messages")
    if value is None:
        raise _bad("'messages' is required", "messages", "missing_field")
    if not isinstance(value, list) or not value:
        raise _bad(
            f"'messages' must be a non-empty array of messages, got {type_name(value)}"
            + (" (empty)" if value == [] else ""),
            "messages",
            "invalid_type" if not isinstance(value, list) else "invalid_value",
        )
    for name in ("tools", "functions"):
        if body.get(name):
            raise _bad(f"'{name}' is not supported: rlx does not call tools", name, "unsupported")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise _bad(
            f'\'response_format\' must be {{"type": "text"}} (rlx does not constrain the '
            f"output), got {fmt!r:.60}",
            "response_format",
            "unsupported",
        )
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(
                f"'{where}' must be an object, got {type_name(m)}", "messages", "invalid_type"
            )
        role = m.get("role")
        if role not in _ROLES:
            raise _bad(
                f"'{where}.role' must be one of {', '.join(_ROLES)}, got {role!r:.40}",
                "messages",
            )
        if m.get("tool_calls"):
            raise _bad(f"'{where}.tool_calls' is not supported", "messages", "unsupported")
        msg: dict[str, Any] = {
            "role": role,
            "content": _content(m.get("content"), f"{where}.content"),
        }
        speaker = m.get("name")
        if speaker is not None:
            if not isinstance(speaker, str):
                raise _bad(
                    f"'{where}.name' must be a string, got {type_name(speaker)}",
                    "messages",
                    "invalid_type",
                )
            msg["name"] = speaker
        out.append(msg)
    return out
