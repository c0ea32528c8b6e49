"""Reading fields of a parsed JSON request body. Each reader returns the field's value (or
its default when absent or null) and raises a 400 :class:`ApiError` naming the field,
what it must be and what was given otherwise."""

from __future__ import annotations

import json
from typing import Any

from rlx.serve.errors import ApiError

__all__ = ["parse_body", "type_name", "string", "integer", "number", "boolean", "choice"]

_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def type_name(value: Any) -> str:
    """The JSON name of ``value``'s type (``"a string"``, ``"an array"``, ...)."""
    return _NAMES.get(type(value), type(value).__name__)


def _given(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type_name(value)} ({text})"


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object in ``raw``; 400 when it is not UTF-8 JSON or not an object."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ApiError.bad_request(
            f"the request body is not UTF-8 ({e.reason} at byte {e.start})", code="invalid_json"
        ) from None
    except json.JSONDecodeError as e:
        raise ApiError.bad_request(
            f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise ApiError.bad_request(
            "the request body nests arrays or objects too deeply", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise ApiError.bad_request(
            f"the request body must be a JSON object, got {type_name(body)}", code="invalid_json"
        )
    return body


def string(
    body: dict[str, Any], name: str, default: str | None = None, *, required: bool = False
) -> Any:
    """A string field (``required``: 400 when absent or null)."""
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError.bad_request(f"'{name}' is required", param=name, code="missing_field")
        return default
    if not isinstance(value, str):
        raise ApiError.bad_request(
            f"'{name}' must be a string, got {_given(value)}", param=name, code="invalid_type"
        )
    return value


def integer(
    body: dict[str, Any],
    name: str,
    default: int | None = None,
    *,
    low: int | None = None,
    high: int | None = None,
    limit: str | None = None,
) -> Any:
    """An integer field in ``[low, high]``; past ``high`` the 400 names ``limit`` (the
    server option that sets it) when given."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError.bad_request(
            f"'{name}' must be an integer, got {_given(value)}", param=name, code="invalid_type"
        )
    if low is not None and value < low:
        raise ApiError.bad_request(
            f"'{name}' must be >= {low}, got {value}", param=name, code="invalid_value"
        )
    if high is not None and value > high:
        why = f" (the server's {limit})" if limit else ""
        raise ApiError.bad_request(
            f"'{name}' must be <= {high}{why}, got {value}", param=name, code="limit_exceeded"
        )
    return value


def number(
    body: dict[str, Any],
    name: str,
    default: float | None = None,
    *,
    low: float | None = None,
    high: float | None = None,
) -> Any:
    """A number field (an integer is accepted) in ``[low, high]``."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError.bad_request(
            f"'{name}' must be a number, got {_given(value)}", param=name, code="invalid_type"
        )
    if (low is not None and value < low) or (high is not None and value > high):
        raise ApiError.bad_request(
            f"'{name}' must be between {low} and {high}, got {value}",
            param=name,
            code="invalid_value",
        )
    return float(value)


def boolean(body: dict[str, Any], name: str, default: bool | None = None) -> Any:
    """A boolean field."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError.bad_request(
            f"'{name}' must be a boolean, got {_given(value)}", param=name, code="invalid_type"
        )
    return value


def choice(body: dict[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    """A string field that must be one of ``choices``."""
    value = string(body, name, default)
    if value not in choices:
        raise ApiError.bad_request(
            f"'{name}' must be one of {', '.join(repr(c) for c in choices)}, got {value!r}",
            param=name,
            code="invalid_value",
        )
    return str(value)
