"""What a served model is to the app: a :class:`Service` with an ``id``, the endpoints it
answers, a readiness flag, and ``handle`` for one request whose JSON body the app has
already parsed and whose ``model`` it has resolved to this service."""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from rlx.serve.metrics import Metrics

__all__ = ["Endpoint", "ServiceKind", "Service", "disconnected", "unless_disconnected"]

T = TypeVar("T")


class Endpoint(enum.Enum):
    """An OpenAI endpoint that takes a ``model``; the value is its path under ``/v1``."""

    EMBEDDINGS = "embeddings"
    COMPLETIONS = "completions"
    CHAT = "chat/completions"

    @property
    def path(self) -> str:
        return f"/v1/{self.value}"

    @property
    def label(self) -> str:
        """The ``endpoint`` label of the metrics."""
        return self.name.lower()


class ServiceKind(enum.Enum):
    """What a service does with text."""

    EMBEDDING = "embedding"
    GENERATION = "generation"


@runtime_checkable
class Service(Protocol):
    """One served model. The app calls ``start`` once at startup, ``handle`` per request
    (only for endpoints in ``endpoints``, once ``ready()``), ``drain`` on SIGTERM once no
    new request is let in, and ``close`` last. A service that loads in the background
    may also have a ``load_error`` attribute: not None once loading failed (``/health``
    then says ``error`` and ``rlx serve`` exits 1)."""

    id: str
    kind: ServiceKind
    created: int
    endpoints: frozenset[Endpoint]

    def ready(self) -> bool:
        """Whether the model is loaded and answers requests."""
        ...

    async def start(self, metrics: Metrics) -> None:
        """Start worker threads / tasks (and loading, if it runs in the background)."""
        ...

    async def handle(self, endpoint: Endpoint, body: dict[str, Any], request: Request) -> Response:
        """The response to one request (raise :class:`rlx.serve.errors.ApiError` for an
        error answer)."""
        ...

    async def drain(self) -> None:
        """Return once every accepted request has been answered."""
        ...

    def close(self) -> None:
        """Stop the workers and free the model."""
        ...


async def disconnected(request: Request) -> None:
    """Return once the client of ``request`` (whose body has been read) has gone."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(future: asyncio.Future[T], request: Request) -> T:
    """The result of ``future``; when the client goes first, ``future`` is cancelled (its
    work can be dropped) and an ApiError 499 (client closed request) raised."""
    from rlx.serve.errors import ApiError

    watch = asyncio.ensure_future(disconnected(request))
    waiters: set[asyncio.Future[Any]] = {future, watch}
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not future.done():
        future.cancel()
        raise ApiError(499, "the client closed the connection", code="client_closed")
    return future.result()
