"""The server's settings: one frozen :class:`ServeConfig`, checked when built (a
ConfigError naming the field, what it must be and what was given)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

from rlx.errors import ConfigError

__all__ = ["Precision", "ServeConfig"]


class Precision(enum.Enum):
    """The precision models are compiled at (the SentenceEncoder's ``precision``)."""

    F32 = "f32"
    BF16 = "bf16"
    INT8 = "int8"


# field -> (smallest value, whether None is allowed)
_MINIMUM: dict[str, tuple[float, bool]] = {
    "port": (0, False),
    "max_batch": (1, False),
    "max_batch_tokens": (1, False),
    "max_wait_ms": (0.0, False),
    "parallel": (1, False),
    "ctx": (1, False),
    "max_body_bytes": (1, False),
    "max_queue": (1, False),
    "max_inputs": (1, False),
    "max_prompt_tokens": (1, True),
    "max_tokens_limit": (1, False),
    "num_threads": (1, True),
    "workers": (1, True),
    "drain_timeout_s": (0.0, False),
    "retry_after_s": (1, False),
}


@dataclass(frozen=True)
class ServeConfig:
    """Settings of ``rlx serve`` (docs/serving.md lists them with their flags).

    ``max_batch`` rows and ``max_batch_tokens`` padded tokens bound one embedding batch;
    a batch runs when full or when its oldest row has waited ``max_wait_ms``.
    ``workers`` batcher threads per embedding model (None: 2 when ``num_threads``,
    default rlx's, is 2 or more, else 1) share its ``num_threads`` threads, each with its
    own compiled encoder, so batches run at once (int8 models run one).
    ``max_queue`` requests may wait per model (more get 429 with ``Retry-After:
    retry_after_s``). ``parallel`` sequences generate at once (KV slots) in a
    ``ctx``-token context; a prompt may hold ``max_prompt_tokens`` tokens (None: ``ctx``)
    and ``max_tokens`` may ask for at most ``max_tokens_limit``. ``max_inputs`` texts per
    embedding request, ``max_body_bytes`` per request body. On SIGTERM running requests
    get ``drain_timeout_s`` seconds to finish. ``chat_template``: the path of a chat
    template for the GGUF models (a ``.jinja`` file, or a ``tokenizer_config.json`` or
    the directory holding one), used instead of the files' own.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_batch: int = 32
    max_batch_tokens: int = 8192
    max_wait_ms: float = 5.0
    parallel: int = 4
    ctx: int = 2048
    precision: Precision = Precision.F32
    max_body_bytes: int = 1 << 20
    max_queue: int = 256
    max_inputs: int = 2048
    max_prompt_tokens: int | None = None
    max_tokens_limit: int = 4096
    num_threads: int | None = None
    workers: int | None = None
    drain_timeout_s: float = 30.0
    retry_after_s: int = 1
    chat_template: str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _MINIMUM:
                low, nullable = _MINIMUM[f.name]
                if value is None and nullable:
                    continue
                kind = float if isinstance(low, float) else int
                ok = isinstance(value, int | float) if kind is float else isinstance(value, int)
                if isinstance(value, bool) or not ok or value < low:
                    what = "a number" if kind is float else "an int"
                    raise ConfigError(
                        f"ServeConfig.{f.name} must be {what} >= {low}"
                        f"{' or None' if nullable else ''}, got {value!r}"
                    )
        if not isinstance(self.precision, Precision):
            raise ConfigError(
                f"ServeConfig.precision must be a Precision ({', '.join(p.name for p in Precision)}),"
                f" got {self.precision!r}"
            )
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"ServeConfig.host must be a non-empty string, got {self.host!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ConfigError("ServeConfig.api_key must be a non-empty string or None")
        if self.chat_template is not None and (
            not isinstance(self.chat_template, str) or not self.chat_template
        ):
            raise ConfigError(
                f"ServeConfig.chat_template must be a path (a non-empty string) or None, "
                f"got {self.chat_template!r}"
            )
        if self.port > 65535:
            raise ConfigError(f"ServeConfig.port must be <= 65535, got {self.port}")

    @property
    def prompt_limit(self) -> int:
        """The most tokens a prompt may hold: ``max_prompt_tokens``, else ``ctx``."""
        return self.ctx if self.max_prompt_tokens is None else min(self.max_prompt_tokens, self.ctx)
