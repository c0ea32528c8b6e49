"""OpenAI-style error objects. A handler raises :class:`ApiError` (built with one of its
constructors); the app turns it into ``{"error": {"message", "type", "param", "code"}}``
with the status and headers it carries. Messages name the field or limit, what was
expected and what was given."""

from __future__ import annotations

import enum
from typing import Any

from rlx.errors import ServeError

__all__ = ["ErrorType", "ApiError"]


class ErrorType(enum.Enum):
    """The ``type`` of an error object (the values OpenAI's API uses)."""

    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    NOT_FOUND = "not_found_error"
    RATE_LIMIT = "rate_limit_error"
    SERVER = "server_error"
    UNAVAILABLE = "service_unavailable_error"


class ApiError(ServeError):
    """An HTTP error answer: ``status``, ``message``, ``type``, the request field it is
    about (``param``), a machine-readable ``code`` and extra response ``headers``."""

    def __init__(
        self,
        status: int,
        message: str,
        type: ErrorType = ErrorType.INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON object of the response."""
        return {
            "error": {
                "message": self.message,
                "type": self.type.value,
                "param": self.param,
                "code": self.code,
            }
        }

    @classmethod
    def bad_request(
        cls, message: str, param: str | None = None, code: str | None = None
    ) -> ApiError:
        """400: a malformed body, a field of the wrong type or value, a limit passed."""
        return cls(400, message, ErrorType.INVALID_REQUEST, param, code)

    @classmethod
    def too_large(cls, message: str, param: str | None = None) -> ApiError:
        """413: the request body is longer than the server accepts."""
        return cls(413, message, ErrorType.INVALID_REQUEST, param, "request_too_large")

    @classmethod
    def unauthorized(cls, message: str) -> ApiError:
        """401: a missing or wrong API key."""
        return cls(
            401,
            message,
            ErrorType.AUTHENTICATION,
            None,
            "invalid_api_key",
            {"WWW-Authenticate": "Bearer"},
        )

    @classmethod
    def not_found(cls, message: str, param: str | None = None, code: str | None = None) -> ApiError:
        """404: an unknown model or path."""
        return cls(404, message, ErrorType.NOT_FOUND, param, code)

    @classmethod
    def too_many(cls, message: str, retry_after: int = 1) -> ApiError:
        """429: the queue is full; ``Retry-After`` says when to try again (seconds)."""
        return cls(
            429,
            message,
            ErrorType.RATE_LIMIT,
            None,
            "queue_full",
            {"Retry-After": str(int(retry_after))},
        )

    @classmethod
    def unavailable(cls, message: str, code: str | None = None) -> ApiError:
        """503: the server is draining (SIGTERM) or the model is still loading."""
        return cls(503, message, ErrorType.UNAVAILABLE, None, code)

    @classmethod
    def server_error(cls, message: str) -> ApiError:
        """500: a bug or a failure while running the model."""
        return cls(500, message, ErrorType.SERVER, None, "internal_error")
